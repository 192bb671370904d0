//! The counting behind `memsim stats FILE --json`, following issue 3's rules exactly:
//! - `calls`: every recorded call under its exact entry-point name. The shim records outermost
//!   calls only, so one runtime `cudaMalloc` that reaches `cuMemAlloc_v2` through a wrapped
//!   pointer is one call. Failed calls are counted here too.
//! - `allocs` / `frees`: successful device allocations/frees (device, managed, VMM physical);
//!   pinned host is counted apart (`pinned_host_allocs`).
//! - `kernel_launches`: successful launch calls (graph launches count once each).
//! - `peak_live_device_bytes`: max over time of live device bytes (physical handles included,
//!   pinned host excluded).
//! - `events`: records other than name/stack definitions.
//! - `truncated`: the file ends inside a frame, or has no `process_exit`.
//!
//! Pure over a record stream; the lead can move [`Stats::add`] and [`Stats::json`] into memsim.

use std::collections::BTreeMap;
use std::path::Path;

use hashbrown::HashMap;
use trace::{Api, Event, MemoryKind, ProcessExit, Record};

/// What a trace adds up to.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub events: u64,
    pub allocs: u64,
    pub frees: u64,
    pub kernel_launches: u64,
    pub pinned_host_allocs: u64,
    pub failed_calls: u64,
    pub peak_live_device_bytes: u64,
    pub lost_events: u64,
    pub truncated: bool,
    pub calls: BTreeMap<String, u64>,
    pub exit: Option<ProcessExit>,
    pub names: HashMap<u32, String>,
    pub records: Vec<Record>,
    live: HashMap<(bool, u64), u64>,
    live_bytes: u64,
}

fn is_entry_point(api: Api) -> bool {
    !matches!(api, Api::Allocator | Api::Cupti | Api::Nvtx | Api::User | Api::Unknown(_))
}

impl Stats {
    /// Fold one record in.
    pub fn add(&mut self, rec: &Record) {
        let (api, result) = match &rec.event {
            Event::Name(n) => {
                self.names.insert(n.id, n.text.clone());
                return;
            }
            Event::Stack(_) => return,
            Event::Alloc(a) => {
                if a.result == 0 && a.mem.is_device() {
                    self.allocs += 1;
                    if self.live.insert((a.mem == MemoryKind::Physical, a.addr), a.size).is_none() {
                        self.live_bytes += a.size;
                    }
                    self.peak_live_device_bytes = self.peak_live_device_bytes.max(self.live_bytes);
                }
                if a.result == 0 && a.mem == MemoryKind::PinnedHost {
                    self.pinned_host_allocs += 1;
                }
                (Some(a.api), a.result)
            }
            Event::Free(f) => {
                if f.result == 0 && f.mem.is_device() {
                    self.frees += 1;
                    if let Some(s) = self.live.remove(&(f.mem == MemoryKind::Physical, f.addr)) {
                        self.live_bytes -= s;
                    }
                }
                (Some(f.api), f.result)
            }
            Event::Vmm(v) => (Some(v.api), v.result),
            Event::KernelLaunch(k) => {
                if k.result == 0 {
                    self.kernel_launches += 1;
                }
                (Some(k.api), k.result)
            }
            Event::PoolTrim(t) => (Some(t.api), t.result),
            Event::ProcessExit(e) => {
                self.lost_events = e.lost_events;
                self.exit = Some(e.clone());
                (None, 0)
            }
            Event::KernelExec(_)
            | Event::MemInfo(_)
            | Event::Marker(_)
            | Event::Oom(_)
            | Event::Control(_)
            | Event::SegmentState(_)
            | Event::SnapshotPoint(_) => (None, 0),
        };
        self.events += 1;
        if let Some(api) = api.filter(|a| is_entry_point(*a)) {
            *self.calls.entry(api.name().to_string()).or_default() += 1;
            if result != 0 {
                self.failed_calls += 1;
            }
        }
        self.records.push(rec.clone());
    }

    /// Read a whole trace file.
    pub fn read(path: &Path) -> Result<Stats, trace::TraceError> {
        let mut r = trace::Reader::open(path)?;
        let mut s = Stats::default();
        while let Some(rec) = r.next_record() {
            s.add(&rec?);
        }
        s.truncated = r.summary().truncated || s.exit.is_none();
        Ok(s)
    }

    /// The `memsim stats --json` object.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "events": self.events,
            "allocs": self.allocs,
            "frees": self.frees,
            "kernel_launches": self.kernel_launches,
            "pinned_host_allocs": self.pinned_host_allocs,
            "failed_calls": self.failed_calls,
            "peak_live_device_bytes": self.peak_live_device_bytes,
            "lost_events": self.lost_events,
            "truncated": self.truncated,
            "calls": self.calls,
        })
    }

    /// `calls` as (name, count) pairs, for compact assertions.
    pub fn calls(&self) -> Vec<(&str, u64)> {
        self.calls.iter().map(|(k, v)| (k.as_str(), *v)).collect()
    }

    /// The interned name with this id.
    pub fn name(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|i| self.names.get(&i)).map(String::as_str)
    }
}

#[test]
fn count_rules() {
    use trace::{Alloc, Free, KernelLaunch, Origin};
    let alloc = |addr, size, mem, api, result| {
        Record::bare(Event::Alloc(Alloc {
            addr,
            size,
            stream: 0,
            mem,
            api,
            result,
            origin: Origin::Outcome,
            category: None,
            caller: None,
            stack: None,
        }))
    };
    let free = |addr, mem, api| {
        Record::bare(Event::Free(Free {
            addr,
            size: None,
            stream: 0,
            mem,
            api,
            result: 0,
            origin: Origin::Outcome,
            stage: trace::FreeStage::Immediate,
            caller: None,
            stack: None,
        }))
    };
    let mut s = Stats::default();
    for r in [
        alloc(0x1000, 100, MemoryKind::Device, Api::CudaMalloc, 0),
        alloc(0x7, 50, MemoryKind::Physical, Api::CuMemCreate, 0),
        alloc(0, 1 << 40, MemoryKind::Device, Api::CudaMalloc, 2),
        alloc(0x9000, 1000, MemoryKind::PinnedHost, Api::CudaHostAlloc, 0),
        free(0x1000, MemoryKind::Device, Api::CudaFree),
        alloc(0x2000, 30, MemoryKind::Device, Api::CuMemAlloc_v2, 0),
        Record::bare(Event::KernelLaunch(KernelLaunch {
            api: Api::__CudaLaunchKernel,
            name: None,
            grid: [1; 3],
            block: [1; 3],
            shared_mem: 0,
            stream: 0,
            result: 0,
        })),
    ] {
        s.add(&r);
    }
    assert_eq!(
        s.calls(),
        [
            ("__cudaLaunchKernel", 1),
            ("cuMemAlloc_v2", 1),
            ("cuMemCreate", 1),
            ("cudaFree", 1),
            ("cudaHostAlloc", 1),
            ("cudaMalloc", 2)
        ]
    );
    assert_eq!((s.allocs, s.frees, s.pinned_host_allocs, s.failed_calls, s.kernel_launches), (3, 1, 1, 1, 1));
    assert_eq!(s.peak_live_device_bytes, 150);
    assert_eq!(s.json()["calls"]["cudaMalloc"], 2);
}
