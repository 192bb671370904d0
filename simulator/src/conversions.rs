//! Conversions between the trace's records and the allocator model's values, in one place: a
//! segment as a starting state (from a trace's `SegmentState`, a rebuilt snapshot start, or the
//! model's own view), and what the model did as trace records (a realised replay, the final
//! segment state).

use trace::{
    Alloc, Api, BlockInfo, BlockState, Event, Free, FreeStage, Oom, Origin, Record, SegmentPool, SegmentState, StateAt,
    Vmm, VmmOp,
};

use crate::alloc::{BlockViewState, DeviceEvent, ExistingBlock, ExistingSegment, Outcome, Request, SegmentView};
use crate::snapshot::StartSegment;

/// A block as a starting state: allocated unless inactive (a pending free has not completed).
fn block(addr: u64, size: u64, requested_size: u64, allocated: bool) -> ExistingBlock {
    ExistingBlock { addr, size, requested_size, allocated }
}

/// Blocks of the trace's shape as a starting state: (address, size, requested size, state), the
/// shape [`unpooled`] writes back. A recorded `SegmentState` and a rebuilt snapshot start are
/// both read through it.
fn trace_blocks(blocks: impl Iterator<Item = (u64, u64, u64, BlockState)>) -> Vec<ExistingBlock> {
    blocks.map(|(a, s, r, st)| block(a, s, r, st != BlockState::Inactive)).collect()
}

impl From<&SegmentState> for ExistingSegment {
    /// A segment recorded before the first event (an imported snapshot's start).
    fn from(s: &SegmentState) -> Self {
        ExistingSegment {
            addr: s.addr,
            size: s.total_size,
            stream: s.stream,
            is_small_pool: s.pool == SegmentPool::Small,
            expandable: s.is_expandable,
            blocks: trace_blocks(s.blocks.iter().map(|b| (b.addr, b.size, b.requested_size, b.state))),
        }
    }
}

impl From<&StartSegment> for ExistingSegment {
    /// A segment of a snapshot's start, rebuilt by walking its trace backwards.
    fn from(s: &StartSegment) -> Self {
        ExistingSegment {
            addr: s.addr,
            size: s.size,
            stream: s.stream,
            is_small_pool: s.is_small_pool,
            expandable: s.expandable,
            blocks: trace_blocks(s.blocks.iter().map(|b| (b.addr, b.size, b.requested_size, b.state))),
        }
    }
}

impl From<&SegmentView> for ExistingSegment {
    /// The model's segment as a starting state: pending frees count as allocated (their free has
    /// not completed). Expandable ranges are seeded as native-shaped segments of their mapped
    /// size.
    fn from(s: &SegmentView) -> Self {
        ExistingSegment {
            addr: s.addr,
            size: s.size,
            stream: s.stream,
            is_small_pool: s.is_small_pool,
            expandable: s.expandable,
            blocks: s
                .blocks
                .iter()
                .map(|b| block(b.addr, b.size, b.requested_size, b.state != BlockViewState::Inactive))
                .collect(),
        }
    }
}

/// The model's segment as the trace's end-of-run `SegmentState` record.
pub fn segment_record(device: u32, seg: &SegmentView) -> Record {
    let blocks = seg.blocks.iter().map(|b| {
        let state = match b.state {
            BlockViewState::Allocated => BlockState::ActiveAllocated,
            BlockViewState::PendingFree => BlockState::ActivePendingFree,
            BlockViewState::Inactive => BlockState::Inactive,
        };
        (b.addr, b.size, b.requested_size, state)
    });
    let (small, expandable) = (seg.is_small_pool, seg.expandable);
    unpooled(None, device, StateAt::End, (seg.addr, seg.size, seg.stream, small, expandable), blocks)
}

/// A snapshot's rebuilt start segment as the trace's `SegmentState` record at `Start`.
pub fn start_segment_record(ts_ns: Option<u64>, s: &StartSegment) -> Record {
    let blocks = s.blocks.iter().map(|b| (b.addr, b.size, b.requested_size, b.state));
    unpooled(ts_ns, s.device, StateAt::Start, (s.addr, s.size, s.stream, s.is_small_pool, s.expandable), blocks)
}

/// A `SegmentState` record with no pool id or stacks (what neither the model nor a rebuilt start
/// knows): the segment as (address, size, stream, small pool, expandable), blocks as (address,
/// size, requested size, state).
fn unpooled(
    ts_ns: Option<u64>,
    device: u32,
    at: StateAt,
    (addr, total_size, stream, small, is_expandable): (u64, u64, i64, bool, bool),
    blocks: impl Iterator<Item = (u64, u64, u64, BlockState)>,
) -> Record {
    Record {
        ts_ns,
        tid: None,
        device: Some(device),
        event: Event::SegmentState(SegmentState {
            at,
            addr,
            total_size,
            stream,
            pool: if small { SegmentPool::Small } else { SegmentPool::Large },
            is_expandable,
            pool_id: (0, 0),
            stack: None,
            blocks: blocks
                .map(|(addr, size, requested_size, state)| BlockInfo { addr, size, requested_size, state, stack: None })
                .collect(),
        }),
    }
}

/// Append what the model did for one request, in the order PyTorch records it: deferred frees
/// that completed, segment events, then the request itself at the model's address.
pub fn realize(out: &mut Vec<Record>, source: Option<&Record>, device: u32, req: &Request, o: &Outcome) {
    let meta = |event| Record {
        ts_ns: source.and_then(|r| r.ts_ns),
        tid: source.and_then(|r| r.tid),
        device: Some(device),
        event,
    };
    let stream = match req {
        Request::Alloc { stream, .. } => *stream,
        _ => 0,
    };
    let free = |addr, size: Option<u64>, stage, origin, api| {
        Event::Free(Free { size, stream, ..Free::device(addr, api, origin, stage) })
    };
    for &addr in &o.completed_frees {
        out.push(meta(free(addr, None, FreeStage::Completed, Origin::Request, Api::Allocator)));
    }
    for ev in &o.device_events {
        let e = match *ev {
            DeviceEvent::SegmentAlloc { addr, size } => {
                Event::Alloc(Alloc { stream, ..Alloc::device(addr, size, Api::CudaMalloc, Origin::Outcome) })
            }
            DeviceEvent::SegmentFree { addr, size } => {
                free(addr, Some(size), FreeStage::Immediate, Origin::Outcome, Api::CudaFree)
            }
            DeviceEvent::SegmentMap { addr, size } | DeviceEvent::SegmentUnmap { addr, size } => Event::Vmm(Vmm {
                op: if matches!(ev, DeviceEvent::SegmentMap { .. }) { VmmOp::Map } else { VmmOp::Unmap },
                addr,
                size,
                handle: 0,
                offset: 0,
                api: if matches!(ev, DeviceEvent::SegmentMap { .. }) { Api::CuMemMap } else { Api::CuMemUnmap },
                result: 0,
                origin: Origin::Outcome,
                stream,
                caller: None,
            }),
        };
        out.push(meta(e));
    }
    let src = source.map(|r| &r.event);
    // The request itself is the allocator's, whatever recorded it: a device-level trace taken
    // with the cache off records each request as the cudaMalloc/cudaFree it became (an outcome),
    // which written as is would read as a segment event, leaving the realised trace (and a
    // snapshot made of it) with no request at all.
    let api = |recorded: Api, origin: Origin| if origin == Origin::Request { recorded } else { Api::Allocator };
    match (req, src) {
        (Request::Alloc { size, stream, .. }, Some(Event::Alloc(a))) => match (o.addr, o.oom) {
            (Some(addr), _) => {
                out.push(meta(Event::Alloc(Alloc {
                    addr,
                    size: *size,
                    stream: *stream,
                    api: api(a.api, a.origin),
                    origin: Origin::Request,
                    ..a.clone()
                })));
            }
            (None, Some(oom)) => out.push(meta(Event::Oom(Oom {
                size: oom.rounded_size,
                device_free: oom.device_free,
                stream: *stream,
            }))),
            (None, None) => {}
        },
        (
            Request::Free { addr } | Request::FreeRequested { addr } | Request::FreeCompleted { addr },
            Some(Event::Free(f)),
        ) => {
            out.push(meta(Event::Free(Free {
                addr: *addr,
                size: Some(o.block_size).filter(|s| *s > 0).or(f.size),
                api: api(f.api, f.origin),
                origin: Origin::Request,
                ..f.clone()
            })));
        }
        (_, Some(e @ Event::Control(_))) => out.push(meta(e.clone())),
        _ => {}
    }
}
