//! The thread that flushes CUPTI at an exit that began from a fatal signal ([`super::ending`]
//! says why the flush needs a thread of its own, and waits for it). It is created when CUPTI
//! starts, in an ordinary context, and parks. Created at the signal instead, it could never
//! start: the handler may have interrupted a thread holding glibc's loader or thread-stack locks
//! or a malloc arena lock, which creating a thread takes (and `thread::Builder::spawn`
//! allocates), so the writer blocked there until the handler gave up and the trace lost its end.
//! At the signal the writer only wakes it: an atomic store and a futex wake, which neither
//! allocate nor lock.
//!
//! It lives only as long as the writer ([`stop`]): a process whose main thread left by
//! `pthread_exit` ends when its last thread does, and that must be the writer, which completes
//! the trace then ([`super::alone`] counts this thread as the shim's, [`live`]). A fork child
//! does not have it ([`forget_in_child`]), and a process without `MEMTRACE_CUPTI` never makes
//! it.

use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use crate::clock::now_ns;
use crate::cupti::{self, Flushed};
use crate::{log, raw};

/// The flush at the signal is not settled yet: neither the flush thread nor the writer has.
pub(super) const FLUSHING: u8 = 0;
/// Every record CUPTI held was delivered.
pub(super) const DELIVERED: u8 = 1;
/// CUPTI's flush failed, or there was no thread to run it.
pub(super) const FAILED: u8 = 2;
/// The flush did not end in time (or never began: another thread's never ended).
pub(super) const ABANDONED: u8 = 3;

/// How the flush at the signal settled: [`FLUSHING`] until the flush thread or the writer
/// settles it, once.
static RESULT: AtomicU8 = AtomicU8::new(FLUSHING);

/// What the parked thread is asked: the futex word it sleeps on.
static ASK: AtomicU32 = AtomicU32::new(PARK);
/// Nothing yet: sleep.
const PARK: u32 = 0;
/// Flush CUPTI (at a fatal signal), then end.
const FLUSH: u32 = 1;
/// End: the writer ended. Never undone but in a fork child, so that a thread made after it
/// ends at once and none is made after it.
const QUIT: u32 = 2;

/// Until when the flush may wait for a flush running elsewhere (CLOCK_MONOTONIC ns): set before
/// [`FLUSH`] is asked, read after.
static DEADLINE: AtomicU64 = AtomicU64::new(0);

/// The parked thread's `pthread_t`, 0 when none: never made, not made yet, or joined. glibc's
/// `pthread_t` is the address of its thread block, never 0.
static THREAD: AtomicUsize = AtomicUsize::new(0);

/// Make the parked flush thread. Called as CUPTI starts (`cupti::start`), before the layer
/// counts as running, so that a signal that finds CUPTI running finds the thread made or known
/// missing. Once; none after the writer ended. A thread that cannot be made is said here, once,
/// and a fatal signal then marks the trace as missing what CUPTI held.
pub fn start() {
    if THREAD.load(Ordering::Acquire) != 0 || ASK.load(Ordering::Acquire) != PARK {
        return;
    }
    // CUPTI's flush normally runs on the program's threads, with glibc's 8 MiB stacks, not
    // Rust's 2 MiB.
    let b = std::thread::Builder::new().stack_size(8 << 20);
    match super::spawn_blocked(b, crate::state::FLUSH_THREAD, c"memtrace-flush", |_| parked()) {
        // Joinable by pthread_join: Rust neither joins nor detaches a handle it gave up.
        Ok(h) => THREAD.store(h.into_pthread_t() as usize, Ordering::Release),
        Err(e) => log!(
            Warn,
            "MEMTRACE_CUPTI=1: cannot start the thread that flushes CUPTI at a fatal signal ({e}); a SIGINT or \
             SIGTERM (or another fatal signal) will leave the trace marked as missing CUPTI's records"
        ),
    }
}

/// The shim's threads besides the writer: 1 from when the parked thread exists until it is
/// joined, else 0. Never counts a thread not made yet (stored once the thread exists); may still
/// count one that ended by itself, but only once the writer no longer asks ([`stop`], or a flush
/// at the exit).
pub(super) fn live() -> u32 {
    u32::from(THREAD.load(Ordering::Acquire) != 0)
}

/// Ask the parked thread to flush CUPTI, waiting no later than `deadline` for a flush running
/// elsewhere. Safe at a signal's exit: an atomic store and a futex wake, no allocation, no lock.
/// False when there is no thread to ask (it could not be made, or has ended).
pub(super) fn request(deadline: u64) -> bool {
    if THREAD.load(Ordering::Acquire) == 0 {
        return false;
    }
    DEADLINE.store(deadline, Ordering::Release);
    if ASK.compare_exchange(PARK, FLUSH, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return false;
    }
    futex_wake(&ASK);
    true
}

/// How the flush at the signal settled so far.
pub(super) fn result() -> u8 {
    RESULT.load(Ordering::Acquire)
}

/// Settle the flush at the signal as `how`, unless it is settled already: once, by whoever comes
/// first (the flush thread, or the writer past its wait).
pub(super) fn settle(how: u8) {
    let _ = RESULT.compare_exchange(FLUSHING, how, Ordering::AcqRel, Ordering::Acquire);
}

/// The writer has ended: the parked thread ends too, and is joined, so that the writer, which
/// ends the process when every other thread has (`pthread_exit` from main), is the last thread,
/// and so that a writer that stopped early leaves no thread to keep such a process alive. A
/// thread asked to flush is left alone: the process is ending by the signal, and the flush may
/// never return.
pub(super) fn stop() {
    if ASK.compare_exchange(PARK, QUIT, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return;
    }
    futex_wake(&ASK);
    let t = THREAD.swap(0, Ordering::AcqRel);
    if t != 0 {
        // Safety: `t` is the joinable thread `start` made (its handle given up by
        // `into_pthread_t`), joined only here, once (THREAD swapped to 0); it ends at once on
        // QUIT, which it cannot miss (it reads ASK before each futex wait, which returns when
        // ASK no longer holds PARK).
        unsafe { libc::pthread_join(t as libc::pthread_t, std::ptr::null_mut()) };
    }
}

/// A fork child: the thread is its parent's (fork copies only the calling thread), and CUPTI,
/// which the child does not inherit, makes none here. Async-signal-safe: atomics only.
pub fn forget_in_child() {
    THREAD.store(0, Ordering::Release);
    ASK.store(PARK, Ordering::Release);
    RESULT.store(FLUSHING, Ordering::Release);
}

/// The parked thread's life: asleep until asked, then one flush, or none, and it ends. Born with
/// the writer's signals blocked ([`super::spawn_blocked`]), so that no signal is ever delivered
/// to it.
fn parked() {
    raw::set_internal(true);
    loop {
        match ASK.load(Ordering::Acquire) {
            PARK => futex_wait(&ASK, PARK),
            FLUSH => {
                let deadline = DEADLINE.load(Ordering::Acquire);
                settle(std::panic::catch_unwind(|| flush_by(deadline)).unwrap_or(FAILED));
                return;
            }
            _ => return,
        }
    }
}

/// Flush CUPTI, waiting (until `deadline`) for a flush already running on another thread to
/// end: that one took what CUPTI held when it began, not now (and one the signal interrupted
/// never ends). How it settled: [`DELIVERED`], [`FAILED`], or [`ABANDONED`] (never flushed).
fn flush_by(deadline: u64) -> u8 {
    loop {
        match cupti::flush() {
            Flushed::Off | Flushed::Done => return DELIVERED,
            Flushed::Failed => return FAILED,
            Flushed::Busy if now_ns() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Flushed::Busy => return ABANDONED,
        }
    }
}

/// Sleep while `word` holds `expected`; may return early (a signal, a spurious wake): the
/// caller reads the word again.
fn futex_wait(word: &AtomicU32, expected: u32) {
    // Safety: FUTEX_WAIT reads the aligned u32 behind `word` (a static, valid for ever) and
    // sleeps while it holds `expected`; no timeout (null). Private: the word is this process's.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

/// Wake the thread sleeping on `word`, if any. A plain system call: no allocation, no lock.
fn futex_wake(word: &AtomicU32) {
    // Safety: FUTEX_WAKE only names the address of `word` (a static, valid for ever) and wakes
    // at most one waiter on it.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, 1) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole life, in one test (the state is the process's): made, parked, joined when the
    /// writer ends, none made after; in a fork child none is known; made again there, woken,
    /// flushed (CUPTI is off in a unit test: nothing held, so delivered), ended.
    #[test]
    fn the_flush_thread_parks_wakes_and_ends() {
        start();
        assert_eq!(live(), 1);
        stop();
        assert_eq!(live(), 0, "joined");
        start();
        assert_eq!(live(), 0, "none after the writer ended");
        assert!(!request(now_ns()), "nothing to ask");

        forget_in_child();
        assert_eq!((live(), result()), (0, FLUSHING));
        start();
        assert_eq!(live(), 1);
        assert!(request(now_ns() + 1_000_000_000));
        let t0 = std::time::Instant::now();
        while result() == FLUSHING {
            assert!(t0.elapsed() < Duration::from_secs(10), "the flush thread did not answer");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(result(), DELIVERED);
        // Asked to flush: left to end by itself, not joined, and asked nothing more.
        stop();
        assert!(!request(now_ns()));
        let t = THREAD.swap(0, Ordering::AcqRel);
        // Safety: the thread made above, joinable and not joined (stop left it); it has ended.
        assert_eq!(unsafe { libc::pthread_join(t as libc::pthread_t, std::ptr::null_mut()) }, 0);
    }
}
