//! What each record means to a replay, decided before the replay sees it: the [`Classifier`],
//! which also holds the trace's half of the address translation.
//!
//! Why: a replay is fed by a decoding thread. Deciding what a record means to the replay (an
//! allocator request to apply, one it leaves out and why, a record it only counts) depends only
//! on the record, the trace's header and the records before it, so that thread can do it. So can
//! the trace's half of the address translation: which allocation a free's trace address names is
//! fixed by the trace alone. The classifier numbers each live trace address (an id); the replay
//! keeps its live blocks in a vector by id (`live.rs`), so its own thread hashes nothing.
//!
//! [`Replayer::observe`](super::Replayer::observe) sorts each record with a classifier of its
//! own, so a record fed whole and its step fed from another thread take one code path.

use super::requests::{Decision, Requests};
use crate::alloc::addr_map::AddrMap;
use trace::marker::{self, MarkerKind};
use trace::{
    Alloc, Api, BlockState, Category, ControlOp, Event, Free, FreeStage, MapRecord, MemoryKind, Record, SegmentState,
    StateAt, VmmOp,
};

/// A record as the replay will use it.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// An allocator request to allocate.
    Alloc {
        /// CUDA device ordinal.
        device: u32,
        /// The number the classifier gave the trace's address while the block lives.
        id: u32,
        /// What the tensor is, when the trace says.
        category: Option<Category>,
        /// The trace's address of the block.
        addr: u64,
        /// Requested bytes.
        size: u64,
        /// The stream it was allocated on.
        stream: i64,
    },
    /// An allocator request to free.
    Free {
        /// CUDA device ordinal.
        device: u32,
        /// Which stage of a free.
        stage: FreeStage,
        /// The trace's address of the block.
        addr: u64,
        /// The address's number, when an allocation there is live in the trace.
        id: Option<u32>,
    },
    /// A control operation (`empty_cache`, a memory fraction, a peak reset, `record_stream`).
    Control {
        /// CUDA device ordinal.
        device: u32,
        /// The operation.
        op: ControlOp,
        /// For `record_stream`: its address's number, when an allocation there is live.
        id: Option<u32>,
    },
    /// A segment that existed before the first event, with the numbers of its active blocks.
    Seed(Box<Seed>),
    /// An `iter:N` marker: a new iteration starts.
    Iteration(u64),
    /// Device memory held outside the caching allocator, or its release: a request from
    /// another caller module (NCCL, cuBLAS, ...), which bypasses the caching allocator on a real
    /// run, a VMM physical handle (`cuMemCreate`) or managed memory. Not placed: its bytes are
    /// held beside the replay's and counted in the need. Another module's requests are also
    /// counted by the module's name.
    Outside {
        /// CUDA device ordinal.
        device: u32,
        /// The trace's address (a physical allocation's handle).
        addr: u64,
        /// Bytes an allocation holds: 0 for a free, and for a call that failed or holds no
        /// device memory (which only counts for its module).
        size: u64,
        /// A release of the memory at `addr`.
        free: bool,
        /// A VMM physical handle, whose numbers are not addresses.
        physical: bool,
        /// The module that made the request, when not the caching allocator's.
        caller: Option<Box<str>>,
    },
    /// A request whose call failed: left out and counted.
    FailedCall,
    /// Cached memory the run's allocator released (a recorded `segment_free` or `segment_unmap`
    /// outcome: `empty_cache()`, or its retry at a capacity the trace does not record).
    RecordedRelease {
        /// CUDA device ordinal.
        device: u32,
    },
    /// An out-of-memory error the run recorded (a snapshot's `oom` entry): the request it
    /// failed is in no allocation record.
    RecordedOom {
        /// CUDA device ordinal.
        device: u32,
        /// Bytes the failed request asked the device for.
        size: u64,
        /// Free device memory when it failed, when recorded.
        device_free: Option<u64>,
    },
    /// A record the replay counts and otherwise ignores (launches, kernel times, memory
    /// queries, stacks, names, outcome events, ...).
    Skip,
    /// A record passed whole, for a replay that realises the trace: it sorts the record with
    /// its own classifier, as [`Replayer::observe`](super::Replayer::observe) does.
    Record(Box<Record>),
}

/// A start-state segment and the numbers of its active blocks, in block order.
#[derive(Debug, Clone, PartialEq)]
pub struct Seed {
    /// CUDA device ordinal.
    pub device: u32,
    /// The segment as recorded.
    pub segment: SegmentState,
    /// One number per block that is not inactive.
    pub ids: Vec<u32>,
}

impl Seed {
    /// The blocks that were live at the start, with their numbers.
    pub fn active_blocks(&self) -> impl Iterator<Item = (&trace::BlockInfo, u32)> {
        self.segment.blocks.iter().filter(|b| b.state != BlockState::Inactive).zip(self.ids.iter().copied())
    }
}

/// Sorts records into [`Step`]s; made by [`Replayer::classifier`](super::Replayer::classifier)
/// and `Send`, so that a decoding thread can own it. It keeps state: the names of caller
/// modules, and the number of each live trace address. So one classifier sees every record of
/// a trace, in order, from the first.
#[derive(Debug, Clone)]
pub struct Classifier {
    /// Which allocations and frees are requests, with the caller modules' names.
    requests: Requests,
    ids: Ids,
}

/// The number of each live trace address, per device. A number is given at an allocation (the
/// address's own, if it already has one: an allocation over a live one replaces it), and given
/// back at the free that ends the block, for reuse, so numbers stay as few as live blocks.
#[derive(Debug, Clone, Default)]
struct Ids {
    /// Sorted by device id; a linear search, as a trace names one device or a few.
    by_device: Vec<(u32, AddrMap)>,
    vacant: Vec<u32>,
    next: u32,
}

impl Ids {
    #[inline(always)]
    fn of(&mut self, device: u32) -> &mut AddrMap {
        super::per_device(&mut self.by_device, device, AddrMap::default)
    }

    #[inline(always)]
    fn assign(&mut self, device: u32, addr: u64) -> u32 {
        let map = super::per_device(&mut self.by_device, device, AddrMap::default);
        let (vacant, next) = (&mut self.vacant, &mut self.next);
        map.get_or_insert_with(addr, || {
            vacant.pop().unwrap_or_else(|| {
                *next += 1;
                *next - 1
            })
        })
    }

    #[inline(always)]
    fn release(&mut self, device: u32, addr: u64) -> Option<u32> {
        let id = self.of(device).remove(addr)?;
        self.vacant.push(id);
        Some(id)
    }

    #[inline(always)]
    fn find(&mut self, device: u32, addr: u64) -> Option<u32> {
        self.of(device).get(addr)
    }
}

impl Classifier {
    /// A classifier for a trace with this shape, before its first record.
    pub(super) fn new(device_level_requests: bool) -> Classifier {
        Classifier { requests: Requests::with(device_level_requests), ids: Ids::default() }
    }

    /// What this record is to the replay.
    #[inline(always)]
    pub fn classify(&mut self, rec: Record) -> Step {
        // The record is taken apart by value, so that the hot arms drop nothing.
        let Record { device: dev, event, .. } = rec;
        let device = dev.unwrap_or(0);
        match event {
            Event::Alloc(a) => self.classify_alloc(device, a),
            Event::Free(f) => self.classify_free(device, f),
            e => self.classify_rare(device, e),
        }
    }

    /// What an allocation on `device` is to the replay ([`classify`](Self::classify)'s arm).
    #[inline(always)]
    fn classify_alloc(&mut self, device: u32, a: Alloc) -> Step {
        match self.requests.decide(a.origin, a.mem, a.caller, a.result) {
            Decision::Apply => Step::Alloc {
                device,
                id: self.ids.assign(device, a.addr),
                category: a.category,
                addr: a.addr,
                size: a.size,
                stream: a.stream,
            },
            d => {
                let held = self.requests.holds_device_memory(a.origin, a.mem, a.result);
                d.left_out(device, a.addr, if held { a.size } else { 0 }, false, a.mem)
            }
        }
    }

    /// What a free on `device` is to the replay ([`classify`](Self::classify)'s arm).
    #[inline(always)]
    fn classify_free(&mut self, device: u32, f: Free) -> Step {
        match self.requests.decide(f.origin, f.mem, f.caller, f.result) {
            Decision::Apply => {
                // A requested free leaves the block live until its completion.
                let id = match f.stage {
                    FreeStage::Requested => self.ids.find(device, f.addr),
                    FreeStage::Immediate | FreeStage::Completed => self.ids.release(device, f.addr),
                };
                // A free of null frees nothing (`cudaFree(NULL)` initialises the context).
                if id.is_none() && f.addr == 0 {
                    return Step::Skip;
                }
                Step::Free { device, stage: f.stage, addr: f.addr, id }
            }
            Decision::NotRequest if self.requests.released(f.origin, f.api == Api::CudaFree) => {
                Step::RecordedRelease { device }
            }
            d => {
                let released = self.requests.holds_device_memory(f.origin, f.mem, f.result);
                d.left_out(device, f.addr, 0, released, f.mem)
            }
        }
    }

    #[inline(never)]
    fn classify_rare(&mut self, device: u32, event: Event) -> Step {
        match event {
            Event::Name(n) => {
                self.requests.name(n.id, n.text);
                Step::Skip
            }
            Event::Control(c) => {
                let id = match c.op {
                    ControlOp::RecordStream { addr, .. } => self.ids.find(device, addr),
                    ControlOp::EmptyCache | ControlOp::SetMemoryFraction { .. } | ControlOp::ResetPeakStats => None,
                };
                Step::Control { device, op: c.op, id }
            }
            Event::SegmentState(segment) if segment.at == StateAt::Start => {
                let ids = segment
                    .blocks
                    .iter()
                    .filter(|b| b.state != BlockState::Inactive)
                    .map(|b| self.ids.assign(device, b.addr))
                    .collect();
                Step::Seed(Box::new(Seed { device, segment, ids }))
            }
            Event::Marker(m) => match marker::parse(&m.text) {
                MarkerKind::Iter(n) => Step::Iteration(n),
                MarkerKind::Phase(_) | MarkerKind::User(_) => Step::Skip,
            },
            Event::Oom(o) => Step::RecordedOom { device, size: o.size, device_free: o.device_free },
            Event::Vmm(v) if v.op == VmmOp::Unmap && self.requests.released(v.origin, true) => {
                Step::RecordedRelease { device }
            }
            e => {
                debug_assert!(counted_only(&e), "{e:?} reached the counted-only arm");
                Step::Skip
            }
        }
    }
}

/// A replay's [`MapRecord`] for a decoding thread: each record as its [`Step`], by the replay's
/// classifier (allocations and frees straight from their fields), or passed whole when the
/// replay has none (it realises the trace).
#[derive(Debug)]
pub struct Steps(pub Option<Classifier>);

impl MapRecord<Step> for Steps {
    #[inline(always)]
    fn record(&mut self, r: Record) -> Step {
        match &mut self.0 {
            Some(c) => c.classify(r),
            None => Step::Record(Box::new(r)),
        }
    }

    #[inline(always)]
    fn alloc(&mut self, ts_ns: Option<u64>, tid: Option<u32>, device: Option<u32>, a: Alloc) -> Step {
        match &mut self.0 {
            Some(c) => c.classify_alloc(device.unwrap_or(0), a),
            None => Step::Record(Box::new(Record { ts_ns, tid, device, event: Event::Alloc(a) })),
        }
    }

    #[inline(always)]
    fn free(&mut self, ts_ns: Option<u64>, tid: Option<u32>, device: Option<u32>, f: Free) -> Step {
        match &mut self.0 {
            Some(c) => c.classify_free(device.unwrap_or(0), f),
            None => Step::Record(Box::new(Record { ts_ns, tid, device, event: Event::Free(f) })),
        }
    }
}

impl Decision {
    /// The step of a request the replay does not apply: `size` is what an allocation holds on
    /// the device (0 when nothing), `free` a release of device memory at `addr`.
    fn left_out(self, device: u32, addr: u64, size: u64, free: bool, mem: MemoryKind) -> Step {
        let physical = mem == MemoryKind::Physical;
        match self {
            Decision::OtherCaller(name) => {
                Step::Outside { device, addr, size, free, physical, caller: Some(name.into_boxed_str()) }
            }
            Decision::NotRequest if size > 0 || free => {
                Step::Outside { device, addr, size, free, physical, caller: None }
            }
            Decision::Failed => Step::FailedCall,
            Decision::NotRequest | Decision::Apply => Step::Skip,
        }
    }
}

/// Whether a replay only counts this event: every kind but requests, names, control operations,
/// markers and a start state. Exhaustive, so that a new event kind needs a decision here.
fn counted_only(e: &Event) -> bool {
    match e {
        Event::SegmentState(s) => s.at != StateAt::Start,
        Event::Vmm(_)
        | Event::KernelLaunch(_)
        | Event::KernelExec(_)
        | Event::MemInfo(_)
        | Event::Stack(_)
        | Event::PoolTrim(_)
        | Event::SnapshotPoint(_)
        | Event::ProcessExit(_)
        | Event::MemActivity(_) => true,
        Event::Alloc(_) | Event::Free(_) | Event::Name(_) | Event::Control(_) | Event::Marker(_) | Event::Oom(_) => {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_small() {
        // The point of a step is to carry less than a record (112 bytes) across threads.
        assert!(std::mem::size_of::<Step>() <= 40, "Step is {} bytes", std::mem::size_of::<Step>());
    }

    #[test]
    fn numbers_follow_live_addresses() {
        let mut ids = Ids::default();
        let a = ids.assign(0, 0x1000);
        // An allocation over a live address keeps its number; another device's is its own.
        assert_eq!(ids.assign(0, 0x1000), a);
        let b = ids.assign(1, 0x1000);
        assert_ne!(a, b);
        assert_eq!(ids.find(0, 0x1000), Some(a));
        assert_eq!(ids.release(0, 0x1000), Some(a));
        assert_eq!(ids.find(0, 0x1000), None);
        assert_eq!(ids.release(0, 0x1000), None);
        // A number given back is reused, so numbers stay as few as live blocks.
        assert_eq!(ids.assign(0, 0x2000), a);
        assert_eq!(ids.next, 2);
    }
}
