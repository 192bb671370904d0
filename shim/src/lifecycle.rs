//! Process lifecycle: lazy start on the first recorded call, completion at the exit paths
//! (atexit, at_quick_exit, `_exit`, and nine fatal signals: [`signals`]; SIGKILL and the other
//! signals whose default ends the process leave the trace without its exit record), fork
//! handling, and the load-time constructor. The flags it drives live in [`crate::state`]; the
//! configuration in [`crate::config`].

mod signals;

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::time::Duration;

use crate::clock;
use crate::config::{config, config_if_read};
use crate::event::RawEvent;
use crate::raw::{self, Depth};
use crate::state::{self, clock_origin, is_owner, owner_pid, DONE, NOT_STARTED, RECORDING, RUNNING, WRITER};
use crate::writer;

/// How long an exit path waits for the writer to complete the trace. Bounded so that a wedged
/// writer never keeps a dying process alive.
const FINISH_WAIT: Duration = Duration::from_secs(5);

/// Stamp and queue one event recorded at hook level `d` (called inside the hook's
/// `catch_unwind`). Inlined into every hook: the common path (recording, the writer running,
/// this thread's ring has room) is a few loads and stores and builds the event straight into its
/// ring slot. Everything else (a thread's first event, starting the writer, a full ring, thread
/// teardown) goes out of line to [`record_slow`].
#[inline(always)]
pub fn record(d: &Depth, mut ev: RawEvent) {
    ev.ts = clock::stamp();
    // Two relaxed loads decide the common case: recording, and the writer running.
    if RECORDING.load(Ordering::Relaxed) && WRITER.load(Ordering::Relaxed) == RUNNING && d.try_push(&ev) {
        return;
    }
    record_slow(d, ev)
}

#[cold]
#[inline(never)]
fn record_slow(d: &Depth, ev: RawEvent) {
    if ready(&ev) {
        if let Err(ev) = d.push(ev) {
            writer::release(&ev);
        }
    }
}

/// As [`record`], outside a hook (markers).
pub fn record_any(mut ev: RawEvent) {
    ev.ts = clock::stamp();
    if ready(&ev) {
        if let Err(ev) = raw::push_any(ev) {
            writer::release(&ev);
        }
    }
}

/// Whether a stamped event should be queued (starting the writer on first use). An event that
/// should not is released here.
fn ready(ev: &RawEvent) -> bool {
    if RECORDING.load(Ordering::Relaxed) && WRITER.load(Ordering::Relaxed) == RUNNING {
        return true;
    }
    not_running(ev)
}

#[cold]
#[inline(never)]
fn not_running(ev: &RawEvent) -> bool {
    if RECORDING.load(Ordering::Relaxed) {
        if WRITER.load(Ordering::Acquire) == NOT_STARTED {
            start();
        }
        // Read again whoever started it: threads making the process's first calls together all
        // find the writer not started, and all but one then find it running, started by another
        // between their two reads. Their events are queued, not dropped.
        if WRITER.load(Ordering::Acquire) == RUNNING {
            return true;
        }
    }
    writer::release(ev);
    false
}

/// True until the process's first outermost recording calls have settled whether CUPTI starts
/// early ([`start_before_call`]). One relaxed load per hook.
pub static STARTING: AtomicBool = AtomicBool::new(true);
/// Outermost recording calls that found CUPTI wanted but no driver loaded yet.
static CUPTI_DEFERRED: AtomicU32 = AtomicU32::new(0);

/// With `MEMTRACE_CUPTI=1`, the process's first outermost recording call starts CUPTI (and the
/// writer that drains it) before the call is forwarded, so that CUPTI, enabled before the
/// driver's first allocation, reports it too. The real libcupti must not be subscribed before
/// libcuda is loaded, and a runtime loads its driver during its first call: then CUPTI waits
/// for the next call (once; after that it starts, or logs why it cannot). Without CUPTI nothing
/// starts early: the writer starts with the first recorded event, so a process that records
/// nothing (say, launches only, with `MEMTRACE_KERNELS=0`) writes no trace.
#[cold]
#[inline(never)]
pub fn start_before_call() {
    let _ = std::panic::catch_unwind(|| {
        // A vfork child shares our memory: it must not touch the flags.
        if !is_owner() {
            return;
        }
        if !RECORDING.load(Ordering::Relaxed) || !config().cupti {
            STARTING.store(false, Ordering::Relaxed);
            return;
        }
        if WRITER.load(Ordering::Acquire) == NOT_STARTED {
            start_writer();
        }
        if crate::real::loaded(c"libcuda.so.1").is_none() && CUPTI_DEFERRED.fetch_add(1, Ordering::Relaxed) == 0 {
            return;
        }
        crate::cupti::start(writer::start_flush_thread);
        STARTING.store(false, Ordering::Relaxed);
    });
}

#[cold]
fn start() {
    if !is_owner() {
        return;
    }
    start_writer();
    if config().cupti {
        crate::cupti::start(writer::start_flush_thread);
    }
}

fn start_writer() {
    clock_origin();
    signals::install();
    writer::ensure_started();
}

/// The thread inside [`finish`] (its kernel thread id), 0 when none: a fault there must not
/// finish again ([`finishing_here`]).
static FINISHING_ON: AtomicI32 = AtomicI32::new(0);

/// Whether the calling thread is inside [`finish`]. Async-signal-safe: an atomic and `gettid`.
fn finishing_here() -> bool {
    let t = FINISHING_ON.load(Ordering::Acquire);
    t != 0 && t == state::gettid()
}

/// Complete the trace: ask the writer to drain and write `ProcessExit`, and wait (bounded).
/// Async-signal-safe: atomics and `nanosleep` only.
pub fn finish(status: Option<c_int>, signal: Option<c_int>) {
    if !is_owner() {
        return;
    }
    // Only the first thread in is named: another that finishes meanwhile (a fault while the
    // main thread exits) waits as well, and is never taken for a re-entry.
    let me = state::gettid();
    let named = FINISHING_ON.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire).is_ok();
    finish_named(status, signal);
    if named {
        FINISHING_ON.store(0, Ordering::Release);
    }
}

fn finish_named(status: Option<c_int>, signal: Option<c_int>) {
    if let Some(s) = status {
        state::EXIT_STATUS.store(i64::from(s), Ordering::Release);
    }
    if let Some(s) = signal {
        state::EXIT_SIGNAL.store(s, Ordering::Release);
    }
    if WRITER.load(Ordering::Acquire) != RUNNING {
        return;
    }
    // Not from a signal handler: CUPTI's flush is not async-signal-safe. At a signal the writer
    // thread has it run off the signal's path, bounded by this wait (`writer::ending`).
    if signal.is_none() {
        let _ = crate::cupti::flush();
    }
    state::set_finish();
    let step = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
    let mut waited = Duration::ZERO;
    while WRITER.load(Ordering::Acquire) != DONE && waited < FINISH_WAIT {
        // Safety: nanosleep with a valid timespec; async-signal-safe.
        unsafe { libc::nanosleep(&step, std::ptr::null_mut()) };
        waited += Duration::from_millis(1);
    }
    if WRITER.load(Ordering::Acquire) != DONE {
        gave_up(signal);
    }
    RECORDING.store(false, Ordering::Release);
}

/// The exit wait ran out: the trace ends without its exit record, which readers report as
/// truncated. Say so, naming the file and the likely cause: at an exit, a pipe's reader that
/// stopped reading or a hung file system; at a signal, also a lock the interrupted thread holds
/// (a crash inside `malloc`) that the writer needs. The writer may be inside a write, so nothing
/// more can be added to the file from here. Async-signal-safe: `readlink` and the stack-buffer
/// logger only.
#[cold]
fn gave_up(signal: Option<c_int>) {
    let mut name = [0u8; 512];
    let n = trace_name(&mut name);
    let name = std::str::from_utf8(&name[..n]).unwrap_or("the trace");
    let wait = FINISH_WAIT.as_secs();
    match signal {
        None => crate::log!(
            Warn,
            "the trace {name} is incomplete: it was not written within {wait} s of the exit (its reader stopped?); \
             it ends without the exit record"
        ),
        Some(sig) => crate::log!(
            Warn,
            "the trace {name} is incomplete: it was not written within {wait} s of signal {sig} (the interrupted \
             thread may hold a lock the writer needs, or the trace's reader stopped); it ends without the exit record"
        ),
    }
}

/// The trace file's path (what `/proc/self/fd/N` links to) into `buf`; its length, 0 if unknown.
fn trace_name(buf: &mut [u8]) -> usize {
    let fd = state::TRACE_FD.load(Ordering::Acquire);
    if fd < 0 {
        return 0;
    }
    let mut link = crate::log::StackBuf::new();
    use std::fmt::Write;
    let _ = write!(link, "/proc/self/fd/{fd}\0");
    // Safety: `link` is NUL-terminated, `buf` is writable for its length; readlink writes at
    // most that many bytes and is async-signal-safe.
    let n = unsafe { libc::readlink(link.as_bytes().as_ptr().cast(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return 0;
    }
    (n as usize).min(buf.len())
}

#[cfg_attr(test, allow(dead_code))]
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| finish(None, None));
}

unsafe extern "C" {
    /// glibc's (libc_nonshared.a, over `__cxa_at_quick_exit`); not in the libc crate for Linux.
    fn at_quick_exit(f: extern "C" fn()) -> c_int;
}

/// Fork child: the parent's writer thread does not exist here, and its queued events belong to
/// the parent's trace. Either start afresh (own `%p` file) or stop.
#[cfg_attr(test, allow(dead_code))]
extern "C" fn at_fork_child() {
    raw::reset_in_child();
    crate::cupti::disable_in_child();
    writer::forget_flush_thread();
    state::reset_in_child();
    // fork copies only the calling thread: one finishing in the parent is not here, and this
    // child must be able to mark its own finish.
    FINISHING_ON.store(0, Ordering::Release);
    let follow = config_if_read().is_none_or(|c| c.follow_fork);
    CUPTI_DEFERRED.store(0, Ordering::Relaxed);
    if follow {
        // The child writes a trace file of its own: a limit the parent reached (its
        // MEMTRACE_MAX_BYTES, a queue it could not allocate) starts afresh here.
        state::resume_in_child();
        STARTING.store(true, Ordering::Relaxed);
        WRITER.store(NOT_STARTED, Ordering::Release);
    } else {
        WRITER.store(DONE, Ordering::Release);
        RECORDING.store(false, Ordering::Release);
    }
}

/// Runs when the library is loaded: read the configuration and register exit and fork
/// handlers. Touches no CUDA library (they may not be loaded yet).
#[cfg_attr(test, allow(dead_code))]
extern "C" fn on_load() {
    let _ = std::panic::catch_unwind(|| {
        clock::init();
        config();
        owner_pid();
        clock_origin();
        second_copy();
        // Safety: registering plain extern "C" callbacks with libc.
        unsafe {
            libc::atexit(at_exit);
            // quick_exit() runs these instead of the atexit handlers.
            at_quick_exit(at_exit);
            libc::pthread_atfork(None, None, Some(at_fork_child));
        }
    });
}

/// Exported by every copy of the shim and by nothing else (a program may define its own
/// `memtrace_mark` fallback): found in another object, it names another copy.
#[cfg_attr(not(test), unsafe(export_name = "memtrace_shim_copy"))]
#[used]
pub static SHIM_COPY: u8 = 1;

/// Another copy of the shim loaded before this one (`LD_PRELOAD` naming two): its hooks come
/// first and forward to this copy's, so both recorded every call, into two traces of one
/// process, the second saying another process held the file. This copy only forwards.
fn second_copy() {
    let first = crate::real::dlsym(libc::RTLD_DEFAULT, c"memtrace_shim_copy");
    if first != 0 && !crate::real::is_own(first) {
        RECORDING.store(false, Ordering::Release);
        crate::log!(Warn, "another copy of libmemtrace is loaded before this one (LD_PRELOAD names two?): it records; this one does not");
    }
}

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;

#[cfg(test)]
mod tests {
    use super::*;

    /// The race two full test runs lost a first `cudaMalloc` to: an event whose thread saw the
    /// writer not started, while another thread started it, is still queued.
    #[test]
    fn an_event_finding_the_writer_started_by_another_thread_is_queued() {
        let saved = (RECORDING.load(Ordering::Relaxed), WRITER.load(Ordering::Relaxed));
        RECORDING.store(true, Ordering::Relaxed);
        WRITER.store(RUNNING, Ordering::Relaxed);
        let queued = not_running(&RawEvent::default());
        RECORDING.store(saved.0, Ordering::Relaxed);
        WRITER.store(saved.1, Ordering::Relaxed);
        assert!(queued);
    }
}
