//! The exit: `ProcessExit`, and the one-line summary on stderr.

use std::sync::atomic::Ordering;

use hashbrown::HashMap;
use trace::{Event, ProcessExit};

use super::Ctx;
use crate::clock::now_ns;
use crate::config::config;
use crate::state::{EXIT_SIGNAL, EXIT_STATUS};
use crate::{log, raw, ring};

/// Per-trace counters for the exit summary.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) events: u64,
    pub(super) allocs: u64,
    pub(super) frees: u64,
    pub(super) launches: u64,
    pub(super) execs: u64,
    pub(super) cupti_mem: u64,
    pub(super) pinned: u64,
    pub(super) failed: u64,
    pub(super) live: HashMap<(bool, u64), u64>,
    pub(super) live_bytes: u64,
    pub(super) peak: u64,
    pub(super) over_limit: u64,
}

impl Ctx {
    /// `cupti_undelivered`: CUPTI may still hold records of the run ([`super::ending`]).
    pub(super) fn finish(mut self, path: &str, cupti_undelivered: bool) {
        let status = EXIT_STATUS.load(Ordering::Acquire);
        let signal = EXIT_SIGNAL.load(Ordering::Acquire);
        let lost = ring::LOST.load(Ordering::Acquire);
        let exit = ProcessExit {
            status: (status != i64::MIN).then_some(status as i32),
            signal: (signal != 0).then_some(signal),
            lost_events: lost,
        };
        let mut res = Ok(());
        if crate::state::OUT_OF_MEMORY.load(Ordering::Acquire) {
            // Read by memsim as "recording stopped" (one owner: `trace::marker`).
            let text = trace::marker::QUEUE_UNALLOCATED.to_string();
            let r = self.rec(now_ns(), raw::tid(), Event::Marker(trace::Marker { text }));
            res = self.w.write(&r);
        }
        if cupti_undelivered {
            // Read by memsim as "records may be missing" (one owner: `trace::marker`).
            let text = trace::marker::CUPTI_UNDELIVERED.to_string();
            let r = self.rec(now_ns(), raw::tid(), Event::Marker(trace::Marker { text }));
            res = res.and_then(|_| self.w.write(&r));
        }
        let r = self.rec(now_ns(), raw::tid(), Event::ProcessExit(exit));
        let res = res.and_then(|_| self.w.write(&r)).and_then(|_| self.w.finish().map(|_| ()));
        if let Err(e) = res {
            log!(Warn, "finishing {path} failed: {e:#}");
        }
        if !config().quiet {
            let t = &self.tally;
            let over_limit = t.over_limit + ring::unrecorded();
            let mut b = log::StackBuf::new();
            use std::fmt::Write;
            let _ = writeln!(
                b,
                "memtrace: {} events ({} allocs, {} frees, {} kernel launches, {} pinned host allocs, {} failed calls{}), \
                 peak live device bytes {} ({:.1} MiB), lost {}{} -> {}",
                t.events,
                t.allocs,
                t.frees,
                t.launches,
                t.pinned,
                t.failed,
                match (crate::cupti::running(), t.cupti_mem) {
                    (false, _) => String::new(),
                    (true, 0) => format!(", {} kernel execs from CUPTI", t.execs),
                    (true, n) => format!(", {} kernel execs and {n} memory records from CUPTI", t.execs),
                },
                t.peak,
                t.peak as f64 / (1u64 << 20) as f64,
                lost,
                if over_limit > 0 { format!(", {over_limit} not recorded past MEMTRACE_MAX_BYTES") } else { String::new() },
                path
            );
            log::write_fd(2, b.as_bytes());
        }
    }
}
