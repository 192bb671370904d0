//! Reads a trace back for assertions: the counts come from memsim's own
//! `simulator::stats::TraceStats` (the `memsim stats --json` object), so the count rules have one
//! implementation; this adds only what the assertions need besides them (the records, interned
//! names, the exit record).

use std::collections::HashMap;
use std::ops::Deref;
use std::path::Path;

use simulator::stats::TraceStats;
use trace::{Alloc, Event, KernelLaunch, ProcessExit, Record};

/// A trace's `memsim stats` summary, plus its records.
#[derive(Debug)]
pub struct Stats {
    /// The canonical summary.
    pub t: TraceStats,
    /// Every record, in file order.
    pub records: Vec<Record>,
    /// Interned names by id.
    pub names: HashMap<u32, String>,
    /// The `process_exit` record, if the trace has one.
    pub exit: Option<ProcessExit>,
}

impl Deref for Stats {
    type Target = TraceStats;
    fn deref(&self) -> &TraceStats {
        &self.t
    }
}

impl Stats {
    /// Read a whole trace file.
    pub fn read(path: &Path) -> Result<Stats, trace::TraceError> {
        let mut r = trace::Reader::open(path)?;
        let mut t = TraceStats::new(r.header());
        let (mut records, mut names, mut exit) = (Vec::new(), HashMap::new(), None);
        while let Some(rec) = r.next_record() {
            let rec = rec?;
            t.observe(&rec);
            match &rec.event {
                Event::Name(n) => {
                    names.insert(n.id, n.text.clone());
                }
                Event::ProcessExit(e) => exit = Some(e.clone()),
                _ => {}
            }
            records.push(rec);
        }
        let s = r.summary();
        Ok(Stats { t: t.finish(Some(&s)), records, names, exit })
    }

    /// Whether the trace is whole: not cut inside a frame, and closed by `process_exit`.
    pub fn whole(&self) -> bool {
        !self.t.truncated && self.t.complete
    }

    /// `calls` as (name, count) pairs, for compact assertions.
    pub fn calls(&self) -> Vec<(&str, u64)> {
        self.t.calls.iter().map(|(k, v)| (k.as_str(), *v)).collect()
    }

    /// All failed calls.
    pub fn failed(&self) -> u64 {
        self.t.failed_calls.values().sum()
    }

    /// What `pick` takes from each record's event, in trace order.
    pub fn events<'a, T>(&'a self, pick: impl FnMut(&'a Event) -> Option<T>) -> Vec<T> {
        self.records.iter().map(|r| &r.event).filter_map(pick).collect()
    }

    /// Every allocation record's event, in trace order.
    pub fn allocs(&self) -> Vec<&Alloc> {
        self.events(|e| match e {
            Event::Alloc(a) => Some(a),
            _ => None,
        })
    }

    /// Every kernel launch record's event, in trace order.
    pub fn launches(&self) -> Vec<&KernelLaunch> {
        self.events(|e| match e {
            Event::KernelLaunch(k) => Some(k),
            _ => None,
        })
    }

    /// The interned name with this id.
    pub fn name(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|i| self.names.get(&i)).map(String::as_str)
    }
}

/// The `memsim stats --json` object of a shim trace carries the field names.
#[test]
fn json_field_names() {
    let r = crate::harness::run_ok("p_internal_driver", &[("MEMTRACE_QUIET", "1")]);
    let s = r.stats();
    let v = serde_json::to_value(&s.t).unwrap();
    for key in ["events", "allocs", "frees", "kernel_launches", "peak_live_device_bytes", "lost_events", "truncated"] {
        assert!(v[key].is_u64() || v[key].is_boolean(), "{key}: {v}");
    }
    assert_eq!(v["calls"]["cudaMallocManaged"], 1);
    assert_eq!(v["truncated"], false);
    // A managed allocation freed with cudaFree is a device allocation freed (not an unknown free).
    assert_eq!((v["allocs"].as_u64(), v["frees"].as_u64(), v["unknown_frees"].as_u64()), (Some(2), Some(2), Some(0)));
}
