//! The exit as the writer sees it: what the rings held when it began and until when to write
//! it, and, at an exit that began from a fatal signal, CUPTI's flush, which the signal handler
//! cannot make.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::now_ns;
use crate::cupti::{self, Flushed};
use crate::{log, ring, state};

/// How long the writer goes on writing the events queued before the exit: less than the exit
/// path waits for it (5 s, `lifecycle::FINISH_WAIT`), so that the trace still gets its end.
/// Both count from the moment the exit set `FINISH` ([`state::FINISH_AT`]), not from when the
/// writer noticed it.
const ENDING_WAIT: Duration = Duration::from_secs(4);

/// How long, from the same moment, the writer waits at a fatal signal for CUPTI's flush
/// ([`SignalFlush`]): half of [`ENDING_WAIT`], which leaves the other half to write what the
/// flush delivered and the trace's end.
const CUPTI_FLUSH_WAIT: Duration = Duration::from_secs(2);

/// The exit, as the writer sees it.
pub(super) struct Ending {
    mark: ring::Mark,
    /// CLOCK_MONOTONIC ns.
    deadline: u64,
    /// CUPTI's flush, at an exit that began from a signal with the layer running.
    cupti: Option<SignalFlush>,
}

impl Ending {
    pub(super) fn new() -> Self {
        let at = match state::FINISH_AT.load(Ordering::Acquire) {
            0 => now_ns(),
            t => t,
        };
        Self { mark: ring::mark(), deadline: at + ENDING_WAIT.as_nanos() as u64, cupti: SignalFlush::start(at) }
    }

    /// Whether this is the last round, after a sweep that took `n` events: CUPTI's flush settled
    /// and then nothing new or every event queued before the exit taken; or no time left. The
    /// caller writes what CUPTI delivered after this, so a flush that settled here has its
    /// records in the trace.
    pub(super) fn done(&self, n: usize) -> bool {
        let now = now_ns();
        // First, so that past its wait (always before ours) the flush is settled for good.
        let flushed = self.cupti.as_ref().is_none_or(|f| f.settled(now));
        (flushed && (n == 0 || ring::behind(&self.mark) == 0)) || now >= self.deadline
    }

    /// Events queued before the exit and not written (no time was left) are counted as lost,
    /// so the trace's `process_exit` says it is incomplete.
    pub(super) fn count_abandoned(&self) {
        let left = ring::behind(&self.mark);
        if left > 0 {
            ring::LOST.fetch_add(left, Ordering::Relaxed);
            log!(Warn, "{left} events queued before the exit could not be written in time; counted as lost");
        }
    }

    /// After the last round: whether CUPTI may still hold records the trace will not have (its
    /// flush at the signal failed or did not end in time), said on stderr; the trace says so too.
    pub(super) fn cupti_undelivered(&self) -> bool {
        let Some(f) = &self.cupti else { return false };
        let why = match f.state.load(Ordering::Acquire) {
            DELIVERED => return false,
            FAILED => "CUPTI's flush failed".to_string(),
            _ => format!("CUPTI's flush did not end within {} s", CUPTI_FLUSH_WAIT.as_secs()),
        };
        let sig = state::EXIT_SIGNAL.load(Ordering::Acquire);
        log!(
            Warn,
            "signal {sig}: {why}; the trace is marked incomplete: kernel_exec and mem_activity records CUPTI \
             still held may be missing"
        );
        true
    }
}

const FLUSHING: u8 = 0;
const DELIVERED: u8 = 1;
const FAILED: u8 = 2;
const ABANDONED: u8 = 3;

/// CUPTI's flush at an exit that began from a fatal signal. The handler cannot flush (CUPTI is
/// not async-signal-safe), and the writer, an ordinary thread, must not flush either: the thread
/// the signal interrupted may hold a CUPTI or driver lock (stopped inside a CUDA call, or inside
/// a flush of its own), and it waits in the handler for the writer, so a flush on the writer
/// could block it until the handler gives up (`lifecycle::FINISH_WAIT`), and the trace would
/// lose its end (the exit record and the events still queued) for CUPTI's records. So the flush
/// runs on a thread of its own, born with the writer's signals blocked, while the writer drains
/// the rings; the writer waits for it until [`CUPTI_FLUSH_WAIT`] after the exit began, inside
/// its own [`ENDING_WAIT`]: a blocked flush costs the dying process at most that, then is
/// abandoned, not stopped (nothing can stop a thread blocked in CUPTI); the process ends by the
/// signal once the trace is complete, and that thread with it.
struct SignalFlush {
    /// [`FLUSHING`] until the flush thread or the writer settles it, once.
    state: Arc<AtomicU8>,
    /// CLOCK_MONOTONIC ns.
    deadline: u64,
}

impl SignalFlush {
    /// The flush, started when the exit began from a signal and CUPTI runs; `at` is when.
    fn start(at: u64) -> Option<Self> {
        if state::EXIT_SIGNAL.load(Ordering::Acquire) == 0 || !cupti::running() {
            return None;
        }
        let deadline = at + CUPTI_FLUSH_WAIT.as_nanos() as u64;
        let st = Arc::new(AtomicU8::new(FLUSHING));
        let theirs = Arc::clone(&st);
        // CUPTI's flush normally runs on the program's threads, with glibc's 8 MiB stacks, not
        // Rust's 2 MiB.
        let spawned = std::thread::Builder::new().name("memtrace-flush".into()).stack_size(8 << 20).spawn(move || {
            let end = std::panic::catch_unwind(|| flush_by(deadline)).unwrap_or(FAILED);
            let _ = theirs.compare_exchange(FLUSHING, end, Ordering::AcqRel, Ordering::Acquire);
        });
        if let Err(e) = spawned {
            log!(Warn, "cannot start a thread for CUPTI's flush at the signal ({e})");
            st.store(FAILED, Ordering::Release);
        }
        Some(Self { state: st, deadline })
    }

    /// Whether the flush has settled at `now`: ended, or abandoned past its wait. Settled once:
    /// records a late flush delivers after this are not taken as delivered.
    fn settled(&self, now: u64) -> bool {
        match self.state.load(Ordering::Acquire) {
            FLUSHING if now < self.deadline => false,
            FLUSHING => {
                // Lost to the flush thread's own result when it just ended: settled either way.
                let _ = self.state.compare_exchange(FLUSHING, ABANDONED, Ordering::AcqRel, Ordering::Acquire);
                true
            }
            _ => true,
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
