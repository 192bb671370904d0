//! The process-wide flags every layer reads: whether we record, the writer's lifecycle, the exit
//! request, the owning pid and the clock origin. Plain atomics with no behaviour, so that the
//! writer and the lifecycle code ([`crate::lifecycle`]) share them without depending on each
//! other.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicU8, Ordering};

use crate::clock;

/// Writer lifecycle, one value per process (reset in a fork child).
pub static WRITER: AtomicU8 = AtomicU8::new(NOT_STARTED);
/// No writer thread yet.
pub const NOT_STARTED: u8 = 0;
/// The writer thread runs.
pub const RUNNING: u8 = 1;
/// The trace is complete (or could not be written); nothing more is recorded.
pub const DONE: u8 = 2;

/// Set by the exit paths (write `ProcessExit` and stop): when the exit began (CLOCK_MONOTONIC
/// ns, at least 1; 0 = not yet). The writer's deadline for the exit counts from it, as the exit
/// path's wait does.
pub static FINISH_AT: AtomicU64 = AtomicU64::new(0);

/// Whether an exit path has asked the writer to finish.
pub fn finishing() -> bool {
    FINISH_AT.load(Ordering::Acquire) != 0
}

/// Ask the writer to finish, stamping [`FINISH_AT`] the first time. Async-signal-safe (an
/// atomic and the vDSO clock).
pub fn set_finish() {
    let _ = FINISH_AT.compare_exchange(0, crate::clock::now_ns().max(1), Ordering::AcqRel, Ordering::Acquire);
}
/// Set by a chained signal handler: flush now, the process may keep running.
pub static FLUSH: AtomicBool = AtomicBool::new(false);
/// Exit status for `ProcessExit`, `i64::MIN` = unknown.
pub static EXIT_STATUS: AtomicI64 = AtomicI64::new(i64::MIN);
/// Signal for `ProcessExit`, 0 = none.
pub static EXIT_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// The shim's own threads by kernel thread id, 0 = none: the writer ([`WRITER_THREAD`]) and
/// the parked CUPTI flush thread ([`FLUSH_THREAD`]). `abort()` or a fault on one of them must
/// not wait for the trace: that thread is the one that would write it.
pub static SHIM_TIDS: [AtomicI32; 2] = [AtomicI32::new(0), AtomicI32::new(0)];
/// [`SHIM_TIDS`]'s slot for the writer thread.
pub const WRITER_THREAD: usize = 0;
/// [`SHIM_TIDS`]'s slot for the CUPTI flush thread.
pub const FLUSH_THREAD: usize = 1;

/// The calling thread's kernel thread id: the one way the shim asks, for the hooks' per-thread
/// cache ([`crate::raw::tid`]) and the signal and exit paths alike. Async-signal-safe and
/// allocation-free: the raw system call, not a libc wrapper that might do more.
#[inline]
pub fn gettid() -> i32 {
    // Safety: gettid has no preconditions and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Whether the calling thread is one of the shim's own ([`SHIM_TIDS`]).
pub fn on_shim_thread() -> bool {
    let me = gettid();
    SHIM_TIDS.iter().any(|t| t.load(Ordering::Acquire) == me)
}

/// Whether events are recorded at all (false past `MEMTRACE_MAX_BYTES`, after the exit paths,
/// and in a fork child that does not follow forks).
pub static RECORDING: AtomicBool = AtomicBool::new(true);

static OWNER_PID: AtomicU32 = AtomicU32::new(0);
static ORIGIN: AtomicU64 = AtomicU64::new(0);

/// The pid whose trace this process state belongs to.
pub fn owner_pid() -> u32 {
    let p = OWNER_PID.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    // Safety: getpid has no preconditions.
    let p = unsafe { libc::getpid() } as u32;
    OWNER_PID.store(p, Ordering::Release);
    p
}

/// Whether the calling process owns the trace state (false in a `vfork` child, which shares our
/// memory and must not touch it).
pub fn is_owner() -> bool {
    // Safety: getpid has no preconditions.
    owner_pid() == unsafe { libc::getpid() } as u32
}

/// The monotonic time event timestamps are relative to.
pub fn clock_origin() -> u64 {
    let o = ORIGIN.load(Ordering::Acquire);
    if o != 0 {
        return o;
    }
    let now = clock::now_ns();
    match ORIGIN.compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => now,
        Err(o) => o,
    }
}

/// A queue's memory could not be allocated, and recording stopped: the trace says so at its end.
pub static OUT_OF_MEMORY: AtomicBool = AtomicBool::new(false);

/// Recording stopped at `MEMTRACE_MAX_BYTES` (a limit of this process's trace file only).
static LIMIT_REACHED: AtomicBool = AtomicBool::new(false);

/// Whether recording stopped at `MEMTRACE_MAX_BYTES`: events the hooks drop from then on are
/// counted as not recorded.
pub fn limit_reached() -> bool {
    LIMIT_REACHED.load(Ordering::Relaxed)
}

/// Stop recording for good (size limit reached).
pub fn stop_recording() {
    LIMIT_REACHED.store(true, Ordering::Release);
    RECORDING.store(false, Ordering::Release);
}

/// A fork child that traces into a file of its own: recording stopped by the parent's size
/// limit or by a queue the parent could not allocate starts again (its own limit, fresh
/// queues). Recording stopped for other reasons (another copy of the shim) stays stopped.
pub fn resume_in_child() {
    let limit = LIMIT_REACHED.swap(false, Ordering::AcqRel);
    let oom = OUT_OF_MEMORY.swap(false, Ordering::AcqRel);
    if limit || oom {
        RECORDING.store(true, Ordering::Release);
    }
}

/// The descriptor of this process's open trace file, -1 when none: a fork child closes its
/// inherited copy, or it would hold the parent's lock (and file) for as long as it lives, and a
/// later run given the same path would write beside it after the parent had finished.
pub static TRACE_FD: AtomicI32 = AtomicI32::new(-1);

/// Set in a fork child: the output path without `%p` is its parent's.
pub static FORK_CHILD: AtomicBool = AtomicBool::new(false);

/// A fork child: the process is now this pid, with no exit requested yet.
pub fn reset_in_child() {
    FORK_CHILD.store(true, Ordering::Release);
    let fd = TRACE_FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // Safety: the descriptor is the parent's trace file, inherited by fork; nothing in this
        // process uses it (the writer thread that owned it does not exist here, and its `File`
        // is never dropped here), so closing it cannot close a descriptor in use.
        unsafe { libc::close(fd) };
    }
    // Safety: getpid has no preconditions.
    OWNER_PID.store(unsafe { libc::getpid() } as u32, Ordering::Release);
    FINISH_AT.store(0, Ordering::Release);
    FLUSH.store(false, Ordering::Release);
    EXIT_STATUS.store(i64::MIN, Ordering::Release);
    EXIT_SIGNAL.store(0, Ordering::Release);
    // fork copies only the calling thread: the shim's threads are the parent's.
    for t in &SHIM_TIDS {
        t.store(0, Ordering::Release);
    }
}
