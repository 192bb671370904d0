//! A small script language for allocator tests: ops refer to earlier allocations by index.

use simulator::alloc::{
    Allocator, AllocatorConfig, BlockViewState, DeviceEvent, MemoryStats, Outcome, Request, SegmentView, TorchVersion,
};

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
/// First synthetic segment base (see `native.rs`).
pub const BASE: u64 = 0x1000_0000_0000;

/// One scripted call. Indices name the n-th `A`/`S` op of the script.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// Allocate on stream 0.
    A(u64),
    /// Allocate on a stream.
    S(u64, i64),
    /// Allocate on stream 0 at a recorded address.
    At(u64, u64),
    /// Free (model-decided completion).
    F(usize),
    /// free_requested.
    Fr(usize),
    /// free_completed.
    Fc(usize),
    /// record_stream.
    Rs(usize, i64),
    /// empty_cache.
    Empty,
    /// set_per_process_memory_fraction.
    Frac(f64),
    /// reset_peak_memory_stats.
    Reset,
}

pub struct Run {
    pub alloc: Allocator,
    /// Outcome of every op, in order.
    pub outcomes: Vec<Outcome>,
    /// Address of each allocation op (None on OOM).
    pub addrs: Vec<Option<u64>>,
}

pub fn allocator(conf: &str, version: TorchVersion, capacity: Option<u64>) -> Allocator {
    let cfg = AllocatorConfig::parse(conf, version).unwrap_or_else(|e| panic!("config {conf:?}: {e}"));
    Allocator::new(cfg, version, capacity)
}

/// Run a script from a fresh allocator; every request must be accepted.
pub fn run(conf: &str, version: TorchVersion, capacity: Option<u64>, ops: &[Op]) -> Run {
    let mut r = Run { alloc: allocator(conf, version, capacity), outcomes: Vec::new(), addrs: Vec::new() };
    for op in ops {
        r.step(*op);
    }
    r
}

impl Run {
    pub fn step(&mut self, op: Op) -> &Outcome {
        let addr =
            |i: usize, addrs: &[Option<u64>]| addrs[i].unwrap_or_else(|| panic!("op refers to failed alloc {i}"));
        let req = match op {
            Op::A(size) => Request::Alloc { size, stream: 0, recorded_addr: None },
            Op::S(size, stream) => Request::Alloc { size, stream, recorded_addr: None },
            Op::At(size, at) => Request::Alloc { size, stream: 0, recorded_addr: Some(at) },
            Op::F(i) => Request::Free { addr: addr(i, &self.addrs) },
            Op::Fr(i) => Request::FreeRequested { addr: addr(i, &self.addrs) },
            Op::Fc(i) => Request::FreeCompleted { addr: addr(i, &self.addrs) },
            Op::Rs(i, s) => Request::RecordStream { addr: addr(i, &self.addrs), stream: s },
            Op::Empty => Request::EmptyCache,
            Op::Frac(f) => Request::SetMemoryFraction(f),
            Op::Reset => Request::ResetPeakStats,
        };
        let out = self.alloc.apply(&req).unwrap_or_else(|e| panic!("{op:?}: {e}"));
        if matches!(req, Request::Alloc { .. }) {
            self.addrs.push(out.addr);
        }
        self.outcomes.push(out);
        self.outcomes.last().expect("just pushed")
    }

    pub fn addr(&self, i: usize) -> u64 {
        self.addrs[i].expect("allocation succeeded")
    }

    /// All device events of the run, in order.
    pub fn device_events(&self) -> Vec<DeviceEvent> {
        self.outcomes.iter().flat_map(|o| o.device_events.iter().copied()).collect()
    }

    pub fn stat(&self, key: &str) -> i64 {
        stat(self.alloc.stats(), key)
    }
}

pub fn stat(s: &MemoryStats, key: &str) -> i64 {
    s.to_json().get(key).and_then(|v| v.as_i64()).unwrap_or_else(|| panic!("no stat {key}"))
}

/// Recompute the current statistics from the segment views and compare; also checks the
/// structural invariants: blocks tile their segment, no two segments overlap,
/// reserved >= active >= allocated.
pub fn check_consistent(a: &Allocator) {
    let segs: Vec<SegmentView> = a.segments();
    assert_eq!(a.mapped_ranges(), segs.len() as u64, "the incremental count of mapped ranges");
    let s = a.stats();
    let mut reserved = [0i64; 3];
    let mut allocated = [0i64; 3];
    let mut active = [0i64; 3];
    let mut native_segments = [0i64; 3];
    let mut inactive_split = [0i64; 3];
    let mut inactive_split_bytes = [0i64; 3];
    let mut requested = [0i64; 3];
    let mut last_end = 0u64;
    for seg in &segs {
        assert!(seg.addr >= last_end, "segments overlap at {:#x}", seg.addr);
        last_end = seg.addr + seg.size;
        let mut at = seg.addr;
        let mut free_sum = 0;
        let mut used_sum = 0;
        for b in &seg.blocks {
            assert_eq!(b.addr, at, "blocks of segment {:#x} do not tile it", seg.addr);
            at += b.size;
            assert!(b.size > 0);
            if b.state == BlockViewState::Inactive {
                free_sum += b.size;
            } else {
                used_sum += b.size;
            }
        }
        assert_eq!(at, seg.addr + seg.size, "blocks do not cover segment {:#x}", seg.addr);
        assert_eq!(free_sum + used_sum, seg.size, "free bytes of segment {:#x} do not add up", seg.addr);
        for w in seg.blocks.windows(2) {
            assert!(
                !(w[0].state == BlockViewState::Inactive && w[1].state == BlockViewState::Inactive),
                "adjacent free blocks not merged at {:#x}",
                w[1].addr
            );
        }
        let k = if seg.is_small_pool { 1 } else { 2 };
        for idx in [0, k] {
            reserved[idx] += seg.size as i64;
            if !seg.expandable {
                native_segments[idx] += 1;
            }
            for b in &seg.blocks {
                match b.state {
                    BlockViewState::Allocated => {
                        allocated[idx] += b.size as i64;
                        active[idx] += b.size as i64;
                        requested[idx] += b.requested_size as i64;
                    }
                    BlockViewState::PendingFree => {
                        active[idx] += b.size as i64;
                        requested[idx] += b.requested_size as i64;
                    }
                    BlockViewState::Inactive => {
                        if seg.blocks.len() > 1 && !seg.expandable {
                            inactive_split[idx] += 1;
                            inactive_split_bytes[idx] += b.size as i64;
                        }
                    }
                }
            }
        }
    }
    for idx in 0..3 {
        assert_eq!(s.reserved_bytes[idx].current, reserved[idx], "reserved_bytes[{idx}]");
        assert_eq!(s.allocated_bytes[idx].current, allocated[idx], "allocated_bytes[{idx}]");
        assert_eq!(s.active_bytes[idx].current, active[idx], "active_bytes[{idx}]");
        assert_eq!(s.requested_bytes[idx].current, requested[idx], "requested_bytes[{idx}]");
        assert_eq!(s.segment[idx].current, native_segments[idx], "segment[{idx}]");
        assert_eq!(s.inactive_split[idx].current, inactive_split[idx], "inactive_split[{idx}]");
        assert_eq!(s.inactive_split_bytes[idx].current, inactive_split_bytes[idx], "inactive_split_bytes[{idx}]");
        assert!(reserved[idx] >= active[idx] && active[idx] >= allocated[idx]);
        for st in [&s.reserved_bytes[idx], &s.allocated_bytes[idx], &s.active_bytes[idx]] {
            assert!(st.peak >= st.current && st.allocated - st.freed == st.current);
        }
    }
}
