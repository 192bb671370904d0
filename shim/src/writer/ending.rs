//! The exit as the writer sees it: what the rings held when it began and until when to write
//! it, and, at an exit that began from a fatal signal, CUPTI's flush, which the signal handler
//! cannot make.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::flusher::{self, ABANDONED, DELIVERED, FAILED, FLUSHING};
use crate::clock::now_ns;
use crate::cupti;
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
        // Made once the exit began, so stamped.
        let at = state::FINISH_AT.load(Ordering::Acquire);
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
        if self.cupti.is_none() {
            return false;
        }
        let why = match flusher::result() {
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

/// CUPTI's flush at an exit that began from a fatal signal. The handler cannot flush (CUPTI is
/// not async-signal-safe), and the writer, an ordinary thread, must not flush either: the thread
/// the signal interrupted may hold a CUPTI or driver lock (stopped inside a CUDA call, or inside
/// a flush of its own), and it waits in the handler for the writer, so a flush on the writer
/// could block it until the handler gives up (`lifecycle::FINISH_WAIT`), and the trace would
/// lose its end (the exit record and the events still queued) for CUPTI's records. So the flush
/// runs on a thread of its own, made when CUPTI started and parked until now ([`flusher`]:
/// making it now could block on a lock the interrupted thread holds), while the writer drains
/// the rings; the writer waits for it until [`CUPTI_FLUSH_WAIT`] after the exit began, inside
/// its own [`ENDING_WAIT`]: a blocked flush costs the dying process at most that, then is
/// abandoned, not stopped (nothing can stop a thread blocked in CUPTI); the process ends by the
/// signal once the trace is complete, and that thread with it.
struct SignalFlush {
    /// CLOCK_MONOTONIC ns.
    deadline: u64,
}

impl SignalFlush {
    /// The flush, asked of the parked thread when the exit began from a signal and CUPTI runs;
    /// `at` is when. Without that thread (it could not be made, which was said then) the flush
    /// is settled as failed at once.
    fn start(at: u64) -> Option<Self> {
        if state::EXIT_SIGNAL.load(Ordering::Acquire) == 0 || !cupti::running() {
            return None;
        }
        let deadline = at + CUPTI_FLUSH_WAIT.as_nanos() as u64;
        if !flusher::request(deadline) {
            flusher::settle(FAILED);
        }
        Some(Self { deadline })
    }

    /// Whether the flush has settled at `now`: ended, or abandoned past its wait. Settled once:
    /// records a late flush delivers after this are not taken as delivered.
    fn settled(&self, now: u64) -> bool {
        match flusher::result() {
            FLUSHING if now < self.deadline => false,
            FLUSHING => {
                // Lost to the flush thread's own result when it just ended: settled either way.
                flusher::settle(ABANDONED);
                true
            }
            _ => true,
        }
    }
}
