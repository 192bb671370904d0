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
//! - CUPTI `mem_activity` records never enter the counts above; they are summed apart in
//!   `cupti_memory` (present only when the trace has any), a second view of the same memory that
//!   is cross-checked against the interposed allocations.

use std::collections::BTreeMap;

use hashbrown::{HashMap, HashSet};
use serde::Serialize;
use trace::{
    Api, CuptiMemoryKind, Event, FreeStage, Header, Level, MemActivity, MemActivityOp, MemoryKind, Origin, Record,
};

use crate::units::{saturated, Unbounded};

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
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub peak_live_device_bytes: u64,
    /// Live device bytes at the end.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub live_device_bytes: u64,
    /// Peak of live pinned host bytes.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub peak_live_host_bytes: u64,
    /// Frees of addresses that were never allocated in this trace (started mid-run, or a bug); a
    /// free of address 0, which frees nothing, is none.
    pub unknown_frees: u64,
    /// Allocations at an address whose block the trace never freed (a missed free, or a bug):
    /// the earlier block stays counted live, as `memsim replay` keeps it allocated.
    pub allocs_over_live: u64,
    /// Bytes of blocks already allocated when the trace began, from its start-state records (a
    /// converted snapshot's rebuilt start). `peak_live_device_bytes` does not count them;
    /// `memsim replay`'s peak allocated does, which is why the two can differ.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub start_state_allocated_bytes: u64,
    /// Why a byte count of the summary (`cupti_memory`'s included) is no number, when one is
    /// not: `overflow`, a damaged trace's sizes adding up past 2^64 B. Those counts are then
    /// `null` in JSON (as 2^64 - 1 they would read as a size, past 2^53 where JSON readers round).
    pub bytes_unbounded: Option<Unbounded>,
    /// Events the producer dropped (from its `process_exit`).
    pub lost_events: u64,
    /// The trace ended mid-event (process killed).
    pub truncated: bool,
    /// Whether a `process_exit` closed the trace. The producer may still have left events out
    /// before it: `lost_events`, `byte_limit`.
    pub complete: bool,
    /// The byte limit at which the producer stopped recording (the shim's `MEMTRACE_MAX_BYTES`,
    /// as the reader found it: [`trace::Summary::byte_limit`]), when it did: the run went on,
    /// unrecorded, after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub byte_limit: Option<u64>,
    /// Events of kinds this version does not know, skipped.
    pub unknown_events_skipped: u64,
    /// Kernel execution records (CUPTI).
    pub kernel_exec_records: u64,
    /// Union of kernel execution intervals, ns (busy time), when CUPTI records exist.
    pub kernel_busy_ns: Option<u64>,
    /// First and last timestamps seen, ns.
    pub time_span_ns: Option<(u64, u64)>,
    /// CUPTI `MEMORY2` records (`mem_activity`); absent when the trace has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cupti_memory: Option<CuptiMemoryStats>,
    #[serde(skip)]
    cupti: CuptiTally,
    #[serde(skip)]
    live: HashMap<(u32, MemoryKind, u64), u64>,
    /// Live bytes, wider than any sum of u64 sizes: a damaged size near 2^64 must not wrap the
    /// running total (a wrong peak) nor, freed, take it below what is still live.
    #[serde(skip)]
    live_device: u128,
    #[serde(skip)]
    live_host: u128,
    #[serde(skip)]
    count_requests_only: bool,
    #[serde(skip)]
    intervals: Vec<(u64, u64)>,
    /// Records and calls counted by their static names while reading (no string per record);
    /// `kinds`, `calls` and `failed_calls` are filled from them by [`TraceStats::finish`].
    #[serde(skip)]
    kind_counts: [u64; Event::KINDS.len() + 1],
    /// Calls and failed calls by API code.
    #[serde(skip)]
    call_counts: Vec<(u64, u64)>,
}

/// What CUPTI's memory activity says, next to what interposition saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CuptiMemoryStats {
    /// Allocation records, every memory kind.
    pub allocations: u64,
    /// Release records, every memory kind.
    pub releases: u64,
    /// Allocation records per CUPTI memory kind (`device`, `pinned`, `managed`, ...).
    pub allocations_by_kind: BTreeMap<String, u64>,
    /// Bytes of device-resident allocations (device, array, managed, static), summed.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub device_bytes_allocated: u64,
    /// Peak of live device-resident bytes, by CUPTI's allocations and releases.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub peak_live_device_bytes: u64,
    /// Live device-resident bytes at the end.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub live_device_bytes: u64,
    /// Releases of addresses CUPTI reported no allocation for.
    pub unknown_releases: u64,
    /// Allocations of CUPTI kind `device`.
    pub device_allocations: u64,
    /// Of those, how many have a traced `alloc` of device or managed memory at the same address
    /// with the same size, anywhere in the trace (CUPTI records reach the file late). Matched in
    /// device-level traces only; 0 in allocator-level ones.
    pub device_allocations_matched: u64,
}

/// Working state for [`CuptiMemoryStats`].
#[derive(Debug, Clone, Default)]
struct CuptiTally {
    seen: bool,
    out: CuptiMemoryStats,
    /// (device, device-resident, address) -> size.
    live: HashMap<(u32, bool, u64), u64>,
    /// (address, size) of CUPTI device allocations.
    device_allocs: Vec<(u64, u64)>,
    /// (address, size) of every successful traced device or managed allocation.
    traced: HashSet<(u64, u64)>,
    /// Live device-resident bytes, wide as [`TraceStats`]'s.
    live_device: u128,
}

impl CuptiTally {
    fn observe(&mut self, device: u32, m: &MemActivity) {
        self.seen = true;
        let resident = m.memory_kind.is_device();
        let key = (device, resident, m.addr);
        let o = &mut self.out;
        match m.op {
            MemActivityOp::Allocation => {
                o.allocations += 1;
                *o.allocations_by_kind.entry(m.memory_kind.as_str().to_string()).or_default() += 1;
                if m.memory_kind == CuptiMemoryKind::Device {
                    o.device_allocations += 1;
                    self.device_allocs.push((m.addr, m.size));
                }
                if let Some(old) = self.live.insert(key, m.size) {
                    // An allocation over a live one: its release was lost; count the newer size.
                    if resident {
                        self.live_device -= u128::from(old);
                    }
                }
                if resident {
                    o.device_bytes_allocated = o.device_bytes_allocated.saturating_add(m.size);
                    self.live_device += u128::from(m.size);
                    o.peak_live_device_bytes = o.peak_live_device_bytes.max(saturated(self.live_device));
                }
            }
            MemActivityOp::Release => {
                o.releases += 1;
                match self.live.remove(&key) {
                    Some(size) if resident => self.live_device -= u128::from(size),
                    Some(_) => {}
                    None => o.unknown_releases += 1,
                }
            }
        }
    }

    fn finish(self) -> Option<CuptiMemoryStats> {
        let mut out = self.out;
        out.live_device_bytes = saturated(self.live_device);
        out.device_allocations_matched = self.device_allocs.iter().filter(|k| self.traced.contains(*k)).count() as u64;
        self.seen.then_some(out)
    }
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
        // Tags are 1..=KINDS.len(), pinned.
        self.kind_counts[usize::from(rec.event.tag())] += 1;
        if let Some(ts) = rec.ts_ns {
            self.time_span_ns = Some(match self.time_span_ns {
                None => (ts, ts),
                Some((a, b)) => (a.min(ts), b.max(ts)),
            });
        }
        let device = rec.device.unwrap_or(0);
        match &rec.event {
            Event::Alloc(a) => {
                self.call(a.api, a.result);
                // Only device-level traces (the shim's) can carry CUPTI records to match.
                if !self.count_requests_only
                    && a.result == 0
                    && matches!(a.mem, MemoryKind::Device | MemoryKind::Managed)
                {
                    self.cupti.traced.insert((a.addr, a.size));
                }
                if a.result != 0 || !self.counts_live(a.origin) {
                    return;
                }
                let over_live = self.live.insert((device, space(a.mem), a.addr), a.size).is_some();
                self.allocs_over_live += u64::from(over_live);
                if a.mem.is_device() {
                    self.allocs += 1;
                    self.live_device += u128::from(a.size);
                    self.peak_live_device_bytes = self.peak_live_device_bytes.max(saturated(self.live_device));
                } else {
                    self.host_allocs += 1;
                    self.live_host += u128::from(a.size);
                    self.peak_live_host_bytes = self.peak_live_host_bytes.max(saturated(self.live_host));
                }
            }
            Event::Free(f) => {
                self.call(f.api, f.result);
                // A free_requested leaves the block live until free_completed.
                if f.result != 0 || !self.counts_live(f.origin) || f.stage == FreeStage::Requested {
                    return;
                }
                match self.live.remove(&(device, space(f.mem), f.addr)) {
                    Some(size) if f.mem.is_device() => {
                        self.frees += 1;
                        self.live_device -= u128::from(size);
                    }
                    Some(size) => {
                        self.host_frees += 1;
                        self.live_host -= u128::from(size);
                    }
                    // A free of address 0 frees nothing (`cudaFree(NULL)` initialises the
                    // context; `cuMemFree(0)`, `cudaFreeHost(NULL)` are no-ops).
                    None if f.addr == 0 => {}
                    None => self.unknown_frees += 1,
                }
            }
            Event::Vmm(v) => self.call(v.api, v.result),
            Event::PoolTrim(p) => self.call(p.api, p.result),
            Event::KernelLaunch(k) => {
                self.call(k.api, k.result);
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
                self.lost_events = self.lost_events.saturating_add(p.lost_events);
            }
            Event::MemActivity(m) => self.cupti.observe(device, m),
            Event::MemInfo(_)
            | Event::Marker(_)
            | Event::Name(_)
            | Event::Stack(_)
            | Event::Oom(_)
            | Event::Control(_)
            | Event::SnapshotPoint(_) => {}
            Event::SegmentState(st) => {
                if st.at == trace::StateAt::Start {
                    self.start_state_allocated_bytes = st
                        .blocks
                        .iter()
                        .filter(|b| b.state != trace::BlockState::Inactive)
                        .fold(self.start_state_allocated_bytes, |n, b| n.saturating_add(b.size));
                }
            }
        }
    }

    fn call(&mut self, api: Api, result: i32) {
        let code = usize::from(api.code());
        if code >= self.call_counts.len() {
            self.call_counts.resize(code + 1, (0, 0));
        }
        let c = &mut self.call_counts[code];
        c.0 += 1;
        c.1 += u64::from(result != 0);
    }

    /// Close the summary with what the reader saw of the input as a whole (`None`: records not
    /// read from a file, whole).
    pub fn finish(mut self, read: Option<&trace::Summary>) -> Self {
        if let Some(r) = read {
            self.truncated = r.truncated;
            self.unknown_events_skipped = r.unknown_skipped;
            self.byte_limit = r.byte_limit;
        }
        for (kind, &n) in Event::KINDS.iter().zip(&self.kind_counts[1..]) {
            if n > 0 {
                *self.kinds.entry(kind.to_string()).or_default() += n;
            }
        }
        // Unknown API codes share one name ("unknown"): summed here.
        for (code, (n, failed)) in
            std::mem::take(&mut self.call_counts).into_iter().enumerate().filter(|(_, c)| c.0 > 0)
        {
            let api = Api::from_code(code as u16);
            *self.calls.entry(api.name().to_string()).or_default() += n;
            if failed > 0 {
                *self.failed_calls.entry(api.name().to_string()).or_default() += failed;
            }
        }
        if !self.intervals.is_empty() {
            self.kernel_busy_ns = Some(union_length(&mut self.intervals));
        }
        self.live_device_bytes = saturated(self.live_device);
        self.cupti_memory = std::mem::take(&mut self.cupti).finish();
        let cupti = self
            .cupti_memory
            .as_ref()
            .map_or([0; 3], |c| [c.device_bytes_allocated, c.peak_live_device_bytes, c.live_device_bytes]);
        let own = [self.peak_live_device_bytes, self.live_device_bytes, self.peak_live_host_bytes];
        let all = own.into_iter().chain(cupti).chain([self.start_state_allocated_bytes]);
        // No memory fraction bounds what a trace records: a saturated count is an overflow.
        self.bytes_unbounded = all.into_iter().find_map(|b| Unbounded::of(b, 0));
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
    use trace::{Alloc, Api, Free, MemPoolKind};

    fn alloc(addr: u64, size: u64, mem: MemoryKind, api: Api) -> Record {
        Record::bare(Event::Alloc(Alloc { mem, ..Alloc::device(addr, size, api, Origin::Outcome) }))
    }

    fn free(addr: u64, mem: MemoryKind, api: Api) -> Record {
        Record::bare(Event::Free(Free { mem, ..Free::device(addr, api, Origin::Outcome, FreeStage::Immediate) }))
    }

    /// The summary of a device-level trace of `records`.
    fn device_stats(records: &[Record]) -> TraceStats {
        let mut s = TraceStats::new(&Header::new("test", "0", Level::Device));
        records.iter().for_each(|r| s.observe(r));
        s.finish(None)
    }

    /// `cudaFree` of `cudaMallocManaged` memory (recorded as a device free) ends that block.
    #[test]
    fn managed_memory_freed_by_the_device_free() {
        let s = device_stats(&[
            alloc(0x1000, 100, MemoryKind::Managed, Api::CudaMallocManaged),
            free(0x1000, MemoryKind::Device, Api::CudaFree),
            alloc(0x2000, 30, MemoryKind::Device, Api::CudaMalloc),
        ]);
        assert_eq!(
            (s.allocs, s.frees, s.unknown_frees, s.peak_live_device_bytes, s.live_device_bytes),
            (2, 1, 0, 100, 30)
        );
    }

    fn cupti(op: MemActivityOp, memory_kind: CuptiMemoryKind, addr: u64, size: u64) -> Record {
        let m = MemActivity {
            pool: Some(MemPoolKind::Local),
            pool_addr: Some(1),
            ..MemActivity::new(op, memory_kind, addr, size)
        };
        Record { ts_ns: None, tid: None, device: Some(0), event: Event::MemActivity(m) }
    }

    /// CUPTI's records are summed apart, matched against traced allocations by address and size
    /// whatever their order, and leave the interposition counts alone.
    #[test]
    fn cupti_memory_apart_and_cross_checked() {
        use CuptiMemoryKind::{Device, Pinned};
        use MemActivityOp::{Allocation, Release};
        let s = device_stats(&[
            alloc(0x1000, 100, MemoryKind::Device, Api::CudaMalloc),
            cupti(Allocation, Device, 0x1000, 100),
            cupti(Allocation, Device, 0x2000, 60),
            cupti(Allocation, Pinned, 0x9000, 10),
            cupti(Release, Device, 0x1000, 100),
            cupti(Allocation, Device, 0x3000, 30),
            cupti(Release, Device, 0x5000, 1),
            // Traced after CUPTI's record of it: still a match. The size differs for 0x2000.
            alloc(0x3000, 30, MemoryKind::Device, Api::CudaMalloc),
            alloc(0x2000, 50, MemoryKind::Device, Api::CudaMalloc),
        ]);
        assert_eq!((s.allocs, s.peak_live_device_bytes, s.events), (3, 180, 9));
        let c = s.cupti_memory.expect("cupti_memory");
        let by_kind: Vec<(&str, u64)> = c.allocations_by_kind.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(by_kind, [("device", 3), ("pinned", 1)]);
        assert_eq!(
            (c.allocations, c.releases, c.device_bytes_allocated, c.peak_live_device_bytes, c.live_device_bytes),
            (4, 2, 190, 160, 90)
        );
        assert_eq!((c.unknown_releases, c.device_allocations, c.device_allocations_matched), (1, 3, 2));

        let plain = device_stats(&[alloc(0x1000, 100, MemoryKind::Device, Api::CudaMalloc)]);
        assert_eq!(plain.cupti_memory, None);
        assert!(serde_json::to_value(&plain).unwrap().get("cupti_memory").is_none());
    }
}
