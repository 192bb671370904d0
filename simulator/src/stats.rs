//! Trace summary (`memsim stats`): counts per event kind and API, allocations, peak live bytes,
//! kernel launches and busy time. Sans-IO: feed it records with [`TraceStats::observe`].
//!
//! Count rules (the shim issue's contract; other tools read these fields):
//! - `calls` counts each entry point under its exact CUDA name, as the process called it. The shim
//!   records outermost calls only, so one runtime `cudaMalloc` that reaches `cuMemAlloc_v2` is one
//!   call. Failed calls are counted here, with their error codes kept apart in `failed_calls`.
//! - `allocs` counts successful device allocations, VMM physical handles (`cuMemCreate`) included;
//!   pinned and registered host memory is counted in `host_allocs` instead.
//! - `peak_live_device_bytes` is the maximum over time of bytes held by live device allocations
//!   (physical handles included, host memory excluded). In an allocator-level trace only requests
//!   count; in a device-level trace every device allocation does.

use std::collections::BTreeMap;

use hashbrown::HashMap;
use serde::Serialize;
use trace::{Event, FreeStage, Header, Level, MemoryKind, Origin, Record};

/// Summary of one trace.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TraceStats {
    /// Records read (known kinds).
    pub events: u64,
    /// Records per kind (`alloc`, `free`, `launch`, ...).
    pub kinds: BTreeMap<String, u64>,
    /// Calls per exact entry-point name.
    pub calls: BTreeMap<String, u64>,
    /// Failed calls per entry-point name (non-zero result code).
    pub failed_calls: BTreeMap<String, u64>,
    /// Successful device allocations (physical VMM handles included).
    pub allocs: u64,
    /// Successful device frees.
    pub frees: u64,
    /// Successful pinned/registered host allocations.
    pub host_allocs: u64,
    /// Host frees.
    pub host_frees: u64,
    /// Kernel launches (graph launches included, counted once each).
    pub kernel_launches: u64,
    /// Graph launches.
    pub graph_launches: u64,
    /// Peak of live device bytes.
    pub peak_live_device_bytes: u64,
    /// Live device bytes at the end.
    pub live_device_bytes: u64,
    /// Peak of live pinned host bytes.
    pub peak_live_host_bytes: u64,
    /// Frees of addresses that were never allocated in this trace (started mid-run, or a bug).
    pub unknown_frees: u64,
    /// Events the producer dropped (from its `process_exit`).
    pub lost_events: u64,
    /// The trace ended mid-event (process killed).
    pub truncated: bool,
    /// Whether a `process_exit` closed the trace.
    pub complete: bool,
    /// Events of kinds this version does not know, skipped.
    pub unknown_events_skipped: u64,
    /// Kernel execution records (CUPTI).
    pub kernel_exec_records: u64,
    /// Union of kernel execution intervals, ns (busy time), when CUPTI records exist.
    pub kernel_busy_ns: Option<u64>,
    /// First and last timestamps seen, ns.
    pub time_span_ns: Option<(u64, u64)>,
    #[serde(skip)]
    live: HashMap<(u32, MemoryKind, u64), u64>,
    #[serde(skip)]
    live_host: u64,
    #[serde(skip)]
    count_requests_only: bool,
    #[serde(skip)]
    intervals: Vec<(u64, u64)>,
}

impl TraceStats {
    /// A summary for a trace with this header.
    pub fn new(header: &Header) -> Self {
        TraceStats { count_requests_only: header.level == Level::Allocator, ..Default::default() }
    }

    fn counts_live(&self, origin: Origin) -> bool {
        !self.count_requests_only || origin == Origin::Request
    }

    /// Account one record.
    pub fn observe(&mut self, rec: &Record) {
        self.events += 1;
        *self.kinds.entry(rec.event.kind().to_string()).or_default() += 1;
        if let Some(ts) = rec.ts_ns {
            self.time_span_ns = Some(match self.time_span_ns {
                None => (ts, ts),
                Some((a, b)) => (a.min(ts), b.max(ts)),
            });
        }
        let device = rec.device.unwrap_or(0);
        match &rec.event {
            Event::Alloc(a) => {
                self.call(a.api.name(), a.result);
                if a.result != 0 || !self.counts_live(a.origin) {
                    return;
                }
                if a.mem.is_device() {
                    self.allocs += 1;
                    self.live.insert((device, space(a.mem), a.addr), a.size);
                    self.live_device_bytes += a.size;
                    self.peak_live_device_bytes = self.peak_live_device_bytes.max(self.live_device_bytes);
                } else {
                    self.host_allocs += 1;
                    self.live.insert((device, space(a.mem), a.addr), a.size);
                    self.live_host += a.size;
                    self.peak_live_host_bytes = self.peak_live_host_bytes.max(self.live_host);
                }
            }
            Event::Free(f) => {
                self.call(f.api.name(), f.result);
                // A free_requested leaves the block live until free_completed.
                if f.result != 0 || !self.counts_live(f.origin) || f.stage == FreeStage::Requested {
                    return;
                }
                match self.live.remove(&(device, space(f.mem), f.addr)) {
                    Some(size) if f.mem.is_device() => {
                        self.frees += 1;
                        self.live_device_bytes -= size;
                    }
                    Some(size) => {
                        self.host_frees += 1;
                        self.live_host -= size;
                    }
                    None => self.unknown_frees += 1,
                }
            }
            Event::Vmm(v) => self.call(v.api.name(), v.result),
            Event::PoolTrim(p) => self.call(p.api.name(), p.result),
            Event::KernelLaunch(k) => {
                self.call(k.api.name(), k.result);
                if k.result == 0 {
                    self.kernel_launches += 1;
                    if k.api.is_graph_launch() {
                        self.graph_launches += 1;
                    }
                }
            }
            Event::KernelExec(k) => {
                self.kernel_exec_records += 1;
                if k.end_ns >= k.start_ns {
                    self.intervals.push((k.start_ns, k.end_ns));
                }
            }
            Event::ProcessExit(p) => {
                self.complete = true;
                self.lost_events += p.lost_events;
            }
            Event::MemInfo(_)
            | Event::Marker(_)
            | Event::Name(_)
            | Event::Stack(_)
            | Event::Oom(_)
            | Event::Control(_)
            | Event::SegmentState(_)
            | Event::SnapshotPoint(_) => {}
        }
    }

    fn call(&mut self, name: &str, result: i32) {
        *self.calls.entry(name.to_string()).or_default() += 1;
        if result != 0 {
            *self.failed_calls.entry(name.to_string()).or_default() += 1;
        }
    }

    /// Close the summary with what the reader saw.
    pub fn finish(mut self, truncated: bool, unknown_skipped: u64) -> Self {
        self.truncated = truncated;
        self.unknown_events_skipped = unknown_skipped;
        if !self.intervals.is_empty() {
            self.kernel_busy_ns = Some(union_length(&mut self.intervals));
        }
        self
    }
}

/// The address space a block lives in, for matching a free to its allocation: managed memory
/// is freed with the device free calls (`cudaFree`, `cuMemFree_v2`), which record `device`.
fn space(mem: MemoryKind) -> MemoryKind {
    match mem {
        MemoryKind::Managed => MemoryKind::Device,
        m => m,
    }
}

/// Total length of the union of half-open intervals.
pub fn union_length(iv: &mut [(u64, u64)]) -> u64 {
    iv.sort_unstable();
    let mut total = 0;
    let mut cur: Option<(u64, u64)> = None;
    for &(s, e) in iv.iter() {
        match cur {
            Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace::{Alloc, Api, Free};

    fn alloc(addr: u64, size: u64, mem: MemoryKind, api: Api) -> Record {
        Record::bare(Event::Alloc(Alloc {
            addr,
            size,
            stream: 0,
            mem,
            api,
            result: 0,
            origin: Origin::Outcome,
            category: None,
            caller: None,
            stack: None,
        }))
    }

    fn free(addr: u64, mem: MemoryKind, api: Api) -> Record {
        Record::bare(Event::Free(Free {
            addr,
            size: None,
            stream: 0,
            mem,
            api,
            result: 0,
            origin: Origin::Outcome,
            stage: FreeStage::Immediate,
            caller: None,
            stack: None,
        }))
    }

    /// `cudaFree` of `cudaMallocManaged` memory (recorded as a device free) ends that block.
    #[test]
    fn managed_memory_freed_by_the_device_free() {
        let h = Header::new("test", "0", Level::Device);
        let mut s = TraceStats::new(&h);
        for r in [
            alloc(0x1000, 100, MemoryKind::Managed, Api::CudaMallocManaged),
            free(0x1000, MemoryKind::Device, Api::CudaFree),
            alloc(0x2000, 30, MemoryKind::Device, Api::CudaMalloc),
        ] {
            s.observe(&r);
        }
        let s = s.finish(false, 0);
        assert_eq!(
            (s.allocs, s.frees, s.unknown_frees, s.peak_live_device_bytes, s.live_device_bytes),
            (2, 1, 0, 100, 30)
        );
    }
}
