//! The signals that end a process, handled so that the trace is completed first: those sent to
//! it (SIGINT, SIGTERM, SIGHUP, SIGQUIT), `abort()`'s SIGABRT, and the faults of a thread
//! (SIGSEGV, SIGBUS, SIGFPE, SIGILL). Our handler takes the place of the program's and keeps its
//! semantics: an ignored signal stays ignored, the program's handler runs with its own flags and
//! mask, and `SA_RESETHAND` is emulated. No other signal is handled: SIGKILL, SIGUSR1/2,
//! SIGALRM, SIGPIPE, SIGXCPU, SIGXFSZ, SIGSYS, SIGTRAP, SIGPROF, SIGVTALRM, the real-time signals
//! and the rest whose default ends the process leave the trace without its exit record.
//!
//! Why handling the faults is safe (the host must never be harmed by the shim):
//! - Over the default action, the handler completes the trace (atomics and `nanosleep` only,
//!   bounded by the exit's wait, `FINISH_WAIT`), restores the default action and raises the
//!   signal again, which is blocked while the handler runs: on return the kernel ends the
//!   process by that signal, with a core where the default dumps one, as it would have without
//!   us (a fault re-executes its instruction and faults again, under the default action too).
//! - It never waits for the trace on the shim's own threads (a fault on the writer or on the
//!   CUPTI flush thread: the thread that would write it), nor on a thread already inside
//!   [`finish`] (a fault in our own exit): there it only restores the default action and returns.
//! - A program's own handler (a JVM's, Rust's stack-overflow report, a C program's cleanup) is
//!   called first, exactly as for SIGINT, and nothing is completed before it: a JVM recovers from
//!   SIGSEGV all the time. One that returns having restored the default action has ours put back
//!   over it, acting as that default (`put_back`): the program may have fixed the cause and go
//!   on recording; if the fault comes back, or the signal was raised again, ours completes the
//!   trace and the process dies by the default action.
//! - `SA_ONSTACK`: over a program's handler our handler keeps its flags, so it runs where that
//!   handler would, on the alternate stack the program set for it, and completes the trace there
//!   when the signal's default action follows (a stack overflow whose handler restored the
//!   default), as does a SIGABRT raised inside such a handler (Rust's report aborts), running
//!   below it on that stack. Completing it needs little stack, but some KiB when the exit's
//!   wait runs out and the warning is formatted (`gave_up`): an alternate stack with less than
//!   that left overflows, and the process then dies by SIGSEGV instead of its signal (the trace as
//!   after SIGKILL). Over the default action we add no `SA_ONSTACK`: a stack overflow with no
//!   handler of the program's cannot run ours (no stack left), and the kernel ends the process
//!   by SIGSEGV as without us, the trace readable up to its last flush, as after SIGKILL.
//! - No lock and no allocation: the previous actions are read from slots written once before
//!   they are published.

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use super::{finish, finishing_here};
use crate::state;

/// How a signal reaches the process, and so what our handler does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// Sent to the process (a terminal, `kill`): blocked on the shim's threads.
    Sent,
    /// `abort()`: raised by the thread that aborts, whichever it is.
    Abort,
    /// A fault of the thread it is delivered to (or one sent as if it were).
    Fault,
}

/// The signals whose default action ends the process and that our handler completes the trace
/// for. The writer and the CUPTI flush thread block the [`Kind::Sent`] ones and SIGABRT
/// (`writer::WRITER_BLOCKS`).
const SIGNALS: [(c_int, Kind); 9] = [
    (libc::SIGINT, Kind::Sent),
    (libc::SIGTERM, Kind::Sent),
    (libc::SIGHUP, Kind::Sent),
    (libc::SIGQUIT, Kind::Sent),
    (libc::SIGABRT, Kind::Abort),
    (libc::SIGSEGV, Kind::Fault),
    (libc::SIGBUS, Kind::Fault),
    (libc::SIGFPE, Kind::Fault),
    (libc::SIGILL, Kind::Fault),
];
const N: usize = SIGNALS.len();

static SIGNALS_INSTALLED: AtomicBool = AtomicBool::new(false);

/// The handlers ours replaced, per signal: two slots, each written at most once before it is
/// published through `current`, so the signal handler never reads a slot being written.
/// Slot 0 holds the action read before ours was installed, published before ours goes live;
/// slot 1 the action `sigaction` reports it replaced, when another thread changed it between.
struct Previous {
    slots: [[UnsafeCell<libc::sigaction>; 2]; N],
    current: [AtomicU8; N],
}

// Safety: a slot is written only by `install` (once, guarded by SIGNALS_INSTALLED) before its
// index is stored in `current` with Release; readers load `current` with Acquire and read only
// the slot it names, which is never written again.
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
    /// Safety: called only by `install`, once per slot, before the slot is published.
    unsafe fn publish(&self, i: usize, k: usize, sa: libc::sigaction) {
        // Safety: per the contract, no reader reads this slot yet and no other writer exists.
        unsafe { *self.slots[i][k].get() = sa };
        self.current[i].store(k as u8, Ordering::Release);
    }
}

// Safety: sigaction is plain C data; all-zero is a valid value.
const NO_ACTION: libc::sigaction = unsafe { std::mem::zeroed() };
static PREVIOUS: Previous = Previous {
    slots: [const { [UnsafeCell::new(NO_ACTION), UnsafeCell::new(NO_ACTION)] }; N],
    current: [const { AtomicU8::new(0) }; N],
};
/// Set on the first delivery of a signal whose previous handler was installed with
/// `SA_RESETHAND`: from then on the signal has its default action, as the kernel would have it.
static RESET: [AtomicBool; N] = [const { AtomicBool::new(false) }; N];

/// Our handler in place of `prev`, with the program's semantics: its flags (`SA_RESTART` or
/// not, `SA_NODEFER`, `SA_ONSTACK`) and mask. `SA_RESETHAND` is not passed on: the kernel would
/// reset the disposition to SIG_DFL before our handler ran, and the next signal would kill the
/// process without the trace being completed; [`on_signal`] resets it itself ([`RESET`]).
/// Over the default action (which ends the process) the handler restarts interrupted calls, and
/// runs on the thread's own stack (no `SA_ONSTACK`: see the module's note).
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

/// Install our handler over the program's for every signal of [`SIGNALS`] (at the writer's
/// start, so after the handlers a program installs before its first CUDA call; one it installs
/// later replaces ours, and its own semantics hold by themselves).
pub(super) fn install() {
    if SIGNALS_INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    for (i, (sig, _)) in SIGNALS.iter().enumerate() {
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

/// Whether a signal of `kind` may wait here for the trace to be completed. A sent signal never
/// reaches the shim's threads (they block it). `abort()` and a fault may happen anywhere: not on
/// the writer or the CUPTI flush thread (the trace would wait for the thread it stopped, until
/// the exit's wait ran out), nor inside our own [`finish`] (it faulted once already).
fn may_finish(kind: Kind) -> bool {
    kind == Kind::Sent || !(state::on_shim_thread() || finishing_here())
}

/// A fatal signal: complete the trace (when [`may_finish`]), then die by the same signal with
/// its default action. A signal the program handles itself (Python's SIGINT → KeyboardInterrupt,
/// a JVM's SIGSEGV): chain to its handler; the process may keep running and completes the trace
/// at exit. A handler installed with `SA_RESETHAND` runs once; the signal's next delivery is
/// fatal.
extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(i) = SIGNALS.iter().position(|(s, _)| *s == sig) else { return };
    let kind = SIGNALS[i].1;
    let prev = PREVIOUS.get(i);
    let h = prev.sa_sigaction;
    if h == libc::SIG_IGN {
        return;
    }
    if h == libc::SIG_DFL || (prev.sa_flags & libc::SA_RESETHAND != 0 && RESET[i].swap(true, Ordering::AcqRel)) {
        die(sig, kind);
        return;
    }
    // A fault the program may recover from asks nothing of the writer (a JVM's null checks
    // would flush the trace for each).
    if kind != Kind::Fault {
        state::FLUSH.store(true, Ordering::Release);
    }
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
    put_back(sig, &prev);
}

/// Ours in place of a default action the program's handler restored ([`put_back`]): the
/// signal's default action, with the trace completed first.
extern "C" fn on_default(sig: c_int, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    if let Some(&(_, kind)) = SIGNALS.iter().find(|(s, _)| *s == sig) {
        die(sig, kind);
    }
}

/// The default action of `sig`, which ends the process: complete the trace (when
/// [`may_finish`]), restore the default action and raise the signal again.
fn die(sig: c_int, kind: Kind) {
    if may_finish(kind) {
        finish(None, Some(sig));
    }
    // Safety: restoring the default disposition and re-raising; the signal is blocked while
    // this handler runs, so it is delivered (and kills us) when we return. A fault comes
    // back at once too, as its instruction runs again. At abort(), glibc would do as much
    // (reset, raise again) had the handler returned with the signal still ours.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        libc::raise(sig);
    }
}

/// After the program's handler returned: if it restored the default action (Rust's, for a
/// fault off its stack guards; a handler that cleans up and raises the signal again; one that
/// lets a second Ctrl-C kill), put ours back in its place as [`on_default`], with the program's handler's flags
/// (its `SA_ONSTACK`: a stack overflow comes back on the alternate stack). Nothing is completed
/// here: the program may have fixed the cause (`mprotect` of the faulting page) and go on,
/// recording. If the fault comes back (its instruction runs again), or the signal was raised
/// again (pending, and delivered as this handler returns), `on_default` completes the trace and
/// the process dies by the default action, as it would have. The state is in the disposition,
/// not in a flag of ours: a program that later puts back an action it read before (ours, chaining
/// to its handler) has its handler again. Async-signal-safe: `sigaction` only.
fn put_back(sig: c_int, prev: &libc::sigaction) {
    let mut sa = ours(prev);
    sa.sa_sigaction = on_default as *const () as usize;
    // Safety: reading the current action into a local structure, and installing ours with the
    // program's handler's flags and mask; a signal arriving between the calls finds the
    // default action, as it would without us. An action another thread set between them is
    // put back.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut cur) != 0 || cur.sa_sigaction != libc::SIG_DFL {
            return;
        }
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, &sa, &mut old) == 0 && old.sa_sigaction != libc::SIG_DFL {
            libc::sigaction(sig, &old, std::ptr::null_mut());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_signal_is_listed_once() {
        let mut s: Vec<c_int> = SIGNALS.iter().map(|(s, _)| *s).collect();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), N);
    }

    #[test]
    fn a_fault_never_waits_on_the_shims_threads() {
        assert!(may_finish(Kind::Sent));
        assert!(may_finish(Kind::Fault));
        let me = state::gettid();
        state::SHIM_TIDS[state::WRITER_THREAD].store(me, Ordering::Release);
        let (fault, abort, sent) = (may_finish(Kind::Fault), may_finish(Kind::Abort), may_finish(Kind::Sent));
        state::SHIM_TIDS[state::WRITER_THREAD].store(0, Ordering::Release);
        assert_eq!((fault, abort, sent), (false, false, true));
    }
}
