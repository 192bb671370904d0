//! Snapshot → memtrace trace (allocator level).
//!
//! Record order: the rebuilt start state (`SegmentState` at `Start`), then the trace entries of
//! all devices merged by time (each device's own order is kept exactly), then the final
//! `segments` (`SegmentState` at `End`). Interned `Stack` records precede their first use.

use trace::{
    metadata, Alloc, Api, BlockInfo, Event, Free, FreeStage, Header, Level, Oom, Origin, ProcessExit, Record,
    SegmentState, SnapshotPoint, StackDef, StackId, StateAt, Vmm, VmmOp,
};

use super::caveats::Caveats;
use super::model::{Action, Snapshot, StackRef, TraceEntry};
use super::rebuild::{rebuild, StartState};
use crate::alloc::AllocatorConfig;

/// Producer name written into imported headers.
pub const PRODUCER: &str = "memsim convert (snapshot)";

/// The result of [`import`].
#[derive(Debug, Clone)]
pub struct Imported {
    /// Allocator-level header.
    pub header: Header,
    /// All records, in the order described in the module documentation.
    pub records: Vec<Record>,
    /// The rebuilt start state (also present in `records`), with what could not be recovered.
    pub start: StartState,
}

/// Restores what a snapshot memsim exported kept of its trace's header ([`super::model::MEMTRACE_HEADER`]):
/// its producer, string metadata values and the synthetic-address flag; anything else there is not
/// memsim's and is left out.
fn keep_header(header: &mut Header, kept: &serde_json::Value) {
    // Where the records first came from, through any number of conversions.
    if let Some(p) = kept.get("producer").and_then(serde_json::Value::as_str) {
        header.producer.name = p.to_string();
    }
    if let Some(meta) = kept.get("metadata").and_then(serde_json::Value::as_object) {
        for (k, v) in meta {
            if let Some(v) = v.as_str() {
                header.metadata.insert(k.clone(), v.to_string());
            }
        }
    }
    if let Some(s) = kept.get("synthetic_addresses").and_then(serde_json::Value::as_bool) {
        header.synthetic_addresses = s;
    }
}

impl Imported {
    /// What a replay of this import cannot show (kept in its header: [`Caveats::of`]).
    pub fn warnings(&self) -> Vec<String> {
        Caveats::of(&self.header).lines
    }
}

/// Converts a snapshot into a trace. `cfg` is the allocator configuration whose rounding and
/// split rule infer the sizes of blocks allocated before the trace (see [`rebuild`]).
pub fn import(snap: &Snapshot, cfg: &AllocatorConfig) -> Imported {
    let start = rebuild(&snap.segments, &snap.device_traces, cfg);
    // Of the entries a replay reads: a left-out one's time (an unknown action's) is not the run's.
    let t0 = snap.device_traces.iter().flatten().filter(|e| !e.action.left_out()).filter_map(|e| e.time_us).min();

    let mut header = Header::new(PRODUCER, env!("CARGO_PKG_VERSION"), Level::Allocator);
    header.start_wall_ns = t0.map(|t| t.saturating_mul(1000));
    if let Some(settings) = &snap.allocator_settings {
        header.allocator_settings = Some(settings.to_string());
        if let Some(conf) = settings.get("PYTORCH_CUDA_ALLOC_CONF").and_then(|v| v.as_str()) {
            if !conf.is_empty() {
                header.env.insert("PYTORCH_CUDA_ALLOC_CONF".to_string(), conf.to_string());
            }
        }
    }
    if let Some(ann) = &snap.external_annotations {
        header.set_meta(&metadata::SNAPSHOT_ANNOTATIONS, ann.to_string());
    }
    // The number of device trace lists is part of the picture (memory_viz indexes them by device).
    for index in 0..snap.device_count() as u32 {
        header.devices.push(trace::DeviceInfo {
            index,
            name: None,
            total_memory: None,
            sm_count: None,
            compute_capability: None,
        });
    }
    if let Some(kept) = &snap.memtrace_header {
        keep_header(&mut header, kept);
    }
    // A trace memsim exported says for itself; a recorded run says by its C++ frames, if any.
    let says = |k: &metadata::Key| header.metadata.contains_key(k.name);
    if !says(&metadata::USES_GEMM) && !says(&metadata::USES_CONV) {
        let names = snap.stacks.iter().flatten().map(|f| f.name.as_str());
        if let Some((gemm, conv)) = super::libraries::from_frame_names(names) {
            header.set_meta(&metadata::USES_GEMM, gemm.to_string());
            header.set_meta(&metadata::USES_CONV, conv.to_string());
        }
    }
    if snap.list_form {
        header.set_meta(&metadata::SNAPSHOT_LIST_FORM, "true");
    }
    // Its end, so that a copy cut at a record is told from the whole (a snapshot may end with no
    // segment, so the end states cannot say it).
    header.set_meta(&metadata::ENDS_WITH_EXIT, "true");
    Caveats::found(snap, &start).add_to(&mut header);

    let mut out = Out { snap, records: Vec::new(), emitted: vec![false; snap.stacks.len()] };
    let start_ts = t0.map(|_| 0);
    out.records.extend(start.segments.iter().map(|s| crate::conversions::start_segment_record(start_ts, s)));

    let mut last_ts = start_ts;
    for (device, e) in merge_by_time(&snap.device_traces) {
        let ts = match (e.time_us, t0) {
            (Some(t), Some(t0)) => Some(t.saturating_sub(t0).saturating_mul(1000)),
            _ => None,
        };
        last_ts = ts.or(last_ts);
        let stack = out.stack(e.frames);
        if let Some(event) = entry_event(e, stack) {
            out.records.push(Record { ts_ns: ts, tid: None, device: Some(device), event });
        }
    }

    for s in &snap.segments {
        let blocks = s
            .blocks
            .iter()
            .map(|b| {
                let stack = out.stack(b.frames);
                BlockInfo { addr: b.address, size: b.size, requested_size: b.requested_size, state: b.state, stack }
            })
            .collect();
        let stack = out.stack(s.frames);
        out.records.push(Record {
            ts_ns: last_ts,
            tid: None,
            device: Some(s.device),
            event: Event::SegmentState(SegmentState {
                at: StateAt::End,
                addr: s.address,
                total_size: s.total_size,
                stream: s.stream,
                pool: s.pool,
                is_expandable: s.is_expandable,
                pool_id: s.pool_id,
                stack,
                blocks,
            }),
        });
    }
    out.records.push(Record {
        ts_ns: last_ts,
        tid: None,
        device: None,
        event: Event::ProcessExit(ProcessExit { status: None, signal: None, lost_events: 0 }),
    });
    Imported { header, records: out.records, start }
}

struct Out<'a> {
    snap: &'a Snapshot,
    records: Vec<Record>,
    emitted: Vec<bool>,
}

impl Out<'_> {
    /// The stack id for a frame list, emitting its `Stack` record on first use.
    fn stack(&mut self, r: Option<StackRef>) -> Option<StackId> {
        let r = r?;
        if !self.emitted[r as usize] {
            self.emitted[r as usize] = true;
            self.records
                .push(Record::bare(Event::Stack(StackDef { id: r, frames: self.snap.stacks[r as usize].clone() })));
        }
        Some(r)
    }
}

/// Merges the per-device lists by `time_us`, keeping each device's order, leaving out the
/// entries a replay leaves out (their times, an unknown action's, are not read). Entries
/// without a time keep their device's position: old files have no times at all, and then
/// devices follow one another.
fn merge_by_time(traces: &[Vec<TraceEntry>]) -> Vec<(u32, &TraceEntry)> {
    let mut idx = vec![0usize; traces.len()];
    let total = traces.iter().flatten().filter(|e| !e.action.left_out()).count();
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let mut best: Option<(usize, Option<u64>)> = None;
        for (d, t) in traces.iter().enumerate() {
            while t.get(idx[d]).is_some_and(|e| e.action.left_out()) {
                idx[d] += 1;
            }
            let Some(e) = t.get(idx[d]) else { continue };
            let better = match best {
                None => true,
                Some((_, bt)) => match (e.time_us, bt) {
                    (Some(a), Some(b)) => a < b,
                    _ => false,
                },
            };
            if better {
                best = Some((d, e.time_us));
            }
        }
        let Some((d, _)) = best else { break };
        out.push((d as u32, &traces[d][idx[d]]));
        idx[d] += 1;
    }
    out
}

/// The record of one trace entry; `None` for those a replay leaves out.
fn entry_event(e: &TraceEntry, stack: Option<StackId>) -> Option<Event> {
    let alloc =
        |origin, api| Event::Alloc(Alloc { stream: e.stream, stack, ..Alloc::device(e.addr, e.size, api, origin) });
    let free = |origin, api, stage| {
        Event::Free(Free { size: Some(e.size), stream: e.stream, stack, ..Free::device(e.addr, api, origin, stage) })
    };
    let vmm = |op, api| {
        Event::Vmm(Vmm {
            op,
            addr: e.addr,
            size: e.size,
            handle: 0,
            offset: 0,
            api,
            result: 0,
            origin: Origin::Outcome,
            stream: e.stream,
            caller: None,
        })
    };
    Some(match e.action {
        Action::Alloc => alloc(Origin::Request, Api::Allocator),
        Action::FreeRequested => free(Origin::Request, Api::Allocator, FreeStage::Requested),
        Action::FreeCompleted => free(Origin::Request, Api::Allocator, FreeStage::Completed),
        Action::SegmentAlloc => alloc(Origin::Outcome, Api::CudaMalloc),
        Action::SegmentFree => free(Origin::Outcome, Api::CudaFree, FreeStage::Immediate),
        Action::SegmentMap => vmm(VmmOp::Map, Api::CuMemMap),
        Action::SegmentUnmap => vmm(VmmOp::Unmap, Api::CuMemUnmap),
        Action::Oom => Event::Oom(Oom { size: e.size, device_free: e.device_free, stream: e.stream }),
        Action::Snapshot => Event::SnapshotPoint(SnapshotPoint { active_bytes: e.size }),
        // Said as caveats (`Caveats::found`); their frames are not read.
        Action::Annotate | Action::Unknown => return None,
    })
}
