//! Process lifecycle: lazy start on the first recorded call, completion on every exit path
//! (atexit, `_exit`, fatal signals), fork handling, and the load-time constructor. The flags it
//! drives live in [`crate::state`]; the configuration in [`crate::config`].

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::time::Duration;

use crate::clock;
use crate::config::{config, config_if_read};
use crate::event::RawEvent;
use crate::raw::{self, Depth};
use crate::state::{self, clock_origin, is_owner, owner_pid, DONE, NOT_STARTED, RECORDING, RUNNING, WRITER};
use crate::writer;

static SIGNALS_INSTALLED: AtomicBool = AtomicBool::new(false);

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
    install_signals();
    writer::ensure_started();
}

/// Complete the trace: ask the writer to drain and write `ProcessExit`, and wait (bounded).
/// Async-signal-safe: atomics and `nanosleep` only.
pub fn finish(status: Option<c_int>, signal: Option<c_int>) {
    if !is_owner() {
        return;
    }
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
        gave_up();
    }
    RECORDING.store(false, Ordering::Release);
}

/// The exit wait ran out (a pipe's reader that stopped reading, a hung file system): the trace
/// ends without its exit record, which readers report as truncated. Say so, naming the file.
/// The writer may be inside a write, so nothing more can be added to the file from here.
/// Async-signal-safe: `readlink` and the stack-buffer logger only.
#[cold]
fn gave_up() {
    let mut name = [0u8; 512];
    let n = trace_name(&mut name);
    let name = std::str::from_utf8(&name[..n]).unwrap_or("the trace");
    crate::log!(
        Warn,
        "the trace {name} is incomplete: it was not written within {} s of the exit (its reader stopped?); \
         it ends without the exit record",
        FINISH_WAIT.as_secs()
    );
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

const SIGNALS: [c_int; 2] = [libc::SIGINT, libc::SIGTERM];
/// The handlers ours replaced, per signal: two slots, each written at most once before it is
/// published through `current`, so the signal handler never reads a slot being written.
/// Slot 0 holds the action read before ours was installed, published before ours goes live;
/// slot 1 the action `sigaction` reports it replaced, when another thread changed it between.
struct Previous {
    slots: [[UnsafeCell<libc::sigaction>; 2]; 2],
    current: [AtomicU8; 2],
}

// Safety: a slot is written only by `install_signals` (once, guarded by SIGNALS_INSTALLED)
// before its index is stored in `current` with Release; readers load `current` with Acquire and
// read only the slot it names, which is never written again.
unsafe impl Sync for Previous {}

impl Previous {
    /// Signal `i`'s previous action, as published.
    fn get(&self, i: usize) -> libc::sigaction {
        let k = usize::from(self.current[i].load(Ordering::Acquire) & 1);
        // Safety: slot `k` was written before `current[i]` named it and is not written again.
        unsafe { *self.slots[i][k].get() }
    }

    /// Write signal `i`'s slot `k` and publish it.
    ///
    /// Safety: called only by `install_signals`, once per slot, before the slot is published.
    unsafe fn publish(&self, i: usize, k: usize, sa: libc::sigaction) {
        // Safety: per the contract, no reader reads this slot yet and no other writer exists.
        unsafe { *self.slots[i][k].get() = sa };
        self.current[i].store(k as u8, Ordering::Release);
    }
}

// Safety: sigaction is plain C data; all-zero is a valid value.
const NO_ACTION: libc::sigaction = unsafe { std::mem::zeroed() };
static PREVIOUS: Previous = Previous {
    slots: [
        [UnsafeCell::new(NO_ACTION), UnsafeCell::new(NO_ACTION)],
        [UnsafeCell::new(NO_ACTION), UnsafeCell::new(NO_ACTION)],
    ],
    current: [AtomicU8::new(0), AtomicU8::new(0)],
};
/// Set on the first delivery of a signal whose previous handler was installed with
/// `SA_RESETHAND`: from then on the signal has its default action, as the kernel would have it.
static RESET: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];

/// Our handler in place of `prev`, with the program's semantics: its flags (`SA_RESTART` or
/// not, `SA_NODEFER`, `SA_ONSTACK`) and mask. `SA_RESETHAND` is not passed on: the kernel would
/// reset the disposition to SIG_DFL before our handler ran, and the next signal would kill the
/// process without the trace being completed; [`on_signal`] resets it itself ([`RESET`]).
/// Over the default action (which ends the process) the handler restarts interrupted calls.
fn ours(prev: &libc::sigaction) -> libc::sigaction {
    // Safety: sigaction is plain C data; all-zero is a valid value.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_signal as *const () as usize;
    if prev.sa_sigaction == libc::SIG_DFL {
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        // Safety: initialising a local signal set.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
    } else {
        sa.sa_flags = (prev.sa_flags & !libc::SA_RESETHAND) | libc::SA_SIGINFO;
        sa.sa_mask = prev.sa_mask;
    }
    sa
}

/// Install our SIGINT/SIGTERM handler over the program's (at the writer's start, so after the
/// handlers a program installs before its first CUDA call; one it installs later replaces ours,
/// and its own semantics hold by themselves).
fn install_signals() {
    if SIGNALS_INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    for (i, sig) in SIGNALS.iter().enumerate() {
        // Safety: the sigaction structures are valid; PREVIOUS's slots for signal `i` are
        // written only here (once: SIGNALS_INSTALLED), each before it is published.
        unsafe {
            let mut cur: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(*sig, std::ptr::null(), &mut cur) != 0 {
                continue;
            }
            // An ignored signal stays ignored: a handler in its place would let it interrupt
            // blocking calls (EINTR), and an exec'd child would no longer inherit the SIG_IGN
            // (nohup, a shell's background job). It ends nothing, so there is no trace to finish.
            if cur.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            // The action ours replaces is in place before ours can run: glibc copies the old
            // action out only after the kernel installed the new one, and a signal in between
            // would find nothing (SIG_DFL) and kill a program that handles it.
            PREVIOUS.publish(i, 0, cur);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(*sig, &ours(&cur), &mut old) != 0 {
                continue;
            }
            // Another thread changed the disposition between the two calls: ours follows the
            // one it replaced.
            if old.sa_sigaction != cur.sa_sigaction || old.sa_flags != cur.sa_flags {
                PREVIOUS.publish(i, 1, old);
                if old.sa_sigaction == libc::SIG_IGN {
                    libc::sigaction(*sig, &old, std::ptr::null_mut());
                } else {
                    libc::sigaction(*sig, &ours(&old), std::ptr::null_mut());
                }
            }
        }
    }
}

/// Fatal signal: complete the trace, then die by the same signal. A signal the program handles
/// itself (Python's SIGINT → KeyboardInterrupt): flush and chain to its handler; the process
/// keeps running and completes the trace at exit. A handler installed with `SA_RESETHAND` runs
/// once; the signal's next delivery is fatal.
extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(i) = SIGNALS.iter().position(|s| *s == sig) else { return };
    let prev = PREVIOUS.get(i);
    let mut h = prev.sa_sigaction;
    if h == libc::SIG_IGN {
        return;
    }
    if h != libc::SIG_DFL && prev.sa_flags & libc::SA_RESETHAND != 0 && RESET[i].swap(true, Ordering::AcqRel) {
        h = libc::SIG_DFL;
    }
    if h == libc::SIG_DFL {
        finish(None, Some(sig));
        // Safety: restoring the default disposition and re-raising; the signal is blocked while
        // this handler runs, so it is delivered (and kills us) when we return.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
            libc::raise(sig);
        }
        return;
    }
    state::FLUSH.store(true, Ordering::Release);
    // Safety: calling the handler that was installed before ours, with the form it registered.
    unsafe {
        if prev.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(h);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(c_int) = std::mem::transmute(h);
            f(sig);
        }
    }
}

/// Fork child: the parent's writer thread does not exist here, and its queued events belong to
/// the parent's trace. Either start afresh (own `%p` file) or stop.
#[cfg_attr(test, allow(dead_code))]
extern "C" fn at_fork_child() {
    raw::reset_in_child();
    crate::cupti::disable_in_child();
    writer::forget_flush_thread();
    state::reset_in_child();
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
