//! memtrace records → snapshot pickle that PyTorch's memory_viz opens.
//!
//! Written at protocol 3 (memory_viz's JavaScript unpickler rejects PROTO > 4) by
//! [`super::pickle_writer`], which shares frame lists through the memo as Python does, with no
//! bytes or sets, and with absent optional fields left out rather than written as None.
//! `frames` is written when the trace has a stack for the entry (an empty stack is written as
//! `[]`, as PyTorch writes it) and left out otherwise.

use std::collections::HashMap;
use std::path::Path;

use trace::{
    metadata, BlockState, Event, Frame, FreeStage, Header, MemoryKind, Origin, Record, SegmentPool, StackId, StateAt,
    VmmOp,
};

use super::model::UNKNOWN_LINE;
use super::pickle_writer::PickleWriter;
use super::SnapshotError;
use crate::alloc::{AllocatorConfig, TorchVersion};

struct OutSnapshot {
    segments: Vec<OutSegment>,
    device_traces: Vec<Vec<OutEntry>>,
    allocator_settings: Option<serde_json::Value>,
    external_annotations: Option<serde_json::Value>,
    memtrace_header: serde_json::Value,
}

struct OutSegment {
    device: u32,
    address: u64,
    total_size: u64,
    allocated_size: u64,
    active_size: u64,
    requested_size: u64,
    stream: i64,
    segment_type: &'static str,
    segment_pool_id: (i64, i64),
    is_expandable: bool,
    frames: Option<StackId>,
    blocks: Vec<OutBlock>,
}

struct OutBlock {
    address: u64,
    size: u64,
    requested_size: u64,
    state: &'static str,
    frames: Option<StackId>,
}

#[derive(Clone)]
struct OutFrame {
    name: String,
    filename: String,
    line: u64,
}

struct OutEntry {
    action: &'static str,
    addr: Option<u64>,
    device_free: Option<u64>,
    size: u64,
    stream: i64,
    time_us: Option<u64>,
    frames: Option<StackId>,
}

fn state_str(s: BlockState) -> &'static str {
    match s {
        BlockState::ActiveAllocated => "active_allocated",
        BlockState::ActivePendingFree => "active_pending_free",
        BlockState::Inactive => "inactive",
    }
}

struct Builder<'a> {
    header: &'a Header,
    stacks: HashMap<StackId, Vec<OutFrame>>,
    /// The key in `stacks` each trace stack id names now: a redefined id gets a fresh key, so
    /// the entries made under its earlier definition keep their frames. Fresh keys come down from
    /// `fresh`, which only falls, so a run of redefinitions costs linear time, not a search each.
    current: HashMap<StackId, StackId>,
    fresh: StackId,
    traces: Vec<Vec<OutEntry>>,
    segments: Vec<OutSegment>,
    /// Requested size of live blocks, for frees that do not carry a size.
    live: HashMap<(u32, u64), u64>,
}

impl Builder<'_> {
    /// The stack id, checked to be defined already.
    fn frames(&self, index: usize, stack: Option<StackId>) -> Result<Option<StackId>, SnapshotError> {
        match stack {
            None => Ok(None),
            Some(id) => self.current.get(&id).copied().map(Some).ok_or_else(|| SnapshotError::Export {
                index,
                message: format!("stack {id} is used before any stack record defines it"),
            }),
        }
    }

    fn push(&mut self, index: usize, device: u32, entry: OutEntry) -> Result<(), SnapshotError> {
        let d = device_slot(index, device)?;
        if self.traces.len() <= d {
            self.traces.resize_with(d + 1, Vec::new);
        }
        self.traces[d].push(entry);
        Ok(())
    }

    fn time_us(&self, ts_ns: Option<u64>) -> Option<u64> {
        Some((self.header.start_wall_ns? + ts_ns?) / 1000)
    }

    fn record(&mut self, index: usize, r: &Record) -> Result<(), SnapshotError> {
        let device = r.device.unwrap_or(0);
        let time_us = self.time_us(r.ts_ns);
        let entry = |action, addr, size, stream, frames| OutEntry {
            action,
            addr: Some(addr),
            device_free: None,
            size,
            stream,
            time_us,
            frames,
        };
        match &r.event {
            Event::Stack(s) => {
                let frames = s.frames.iter().map(out_frame).collect();
                let mut key = s.id;
                while self.stacks.contains_key(&key) {
                    (key, self.fresh) = (self.fresh, self.fresh.wrapping_sub(1));
                }
                self.current.insert(s.id, key);
                self.stacks.insert(key, frames);
            }
            Event::Alloc(a) if a.mem == MemoryKind::Device => {
                let frames = self.frames(index, a.stack)?;
                let action = match a.origin {
                    Origin::Request => {
                        self.live.insert((device, a.addr), a.size);
                        "alloc"
                    }
                    Origin::Outcome => "segment_alloc",
                };
                self.push(index, device, entry(action, a.addr, a.size, a.stream, frames))?;
            }
            Event::Free(f) if f.mem == MemoryKind::Device => {
                let frames = self.frames(index, f.stack)?;
                if f.origin == Origin::Outcome {
                    let size = f.size.ok_or_else(|| SnapshotError::Export {
                        index,
                        message: format!("segment free at 0x{:x} has no size", f.addr),
                    })?;
                    self.push(index, device, entry("segment_free", f.addr, size, f.stream, frames))?;
                    return Ok(());
                }
                // PyTorch writes a free with its block's requested size, the alloc's own: a
                // symbolic trace's free carries the rounded block size, and memory_viz then
                // rebuilt freed blocks at another size than they were allocated (a 49 MiB alloc
                // freed as 50 MiB). The record's size serves blocks allocated before the trace.
                let size = match self.live.get(&(device, f.addr)).copied().or(f.size) {
                    Some(s) => s,
                    None => {
                        return Err(SnapshotError::Export {
                            index,
                            message: format!("free of 0x{:x} has no size and frees no known block", f.addr),
                        })
                    }
                };
                if matches!(f.stage, FreeStage::Requested | FreeStage::Immediate) {
                    self.push(index, device, entry("free_requested", f.addr, size, f.stream, frames))?;
                }
                if matches!(f.stage, FreeStage::Completed | FreeStage::Immediate) {
                    self.live.remove(&(device, f.addr));
                    self.push(index, device, entry("free_completed", f.addr, size, f.stream, frames))?;
                }
            }
            Event::Vmm(v) if matches!(v.op, VmmOp::Map | VmmOp::Unmap) => {
                let action = if v.op == VmmOp::Map { "segment_map" } else { "segment_unmap" };
                self.push(index, device, entry(action, v.addr, v.size, v.stream, None))?;
            }
            Event::Oom(o) => self.push(
                index,
                device,
                OutEntry {
                    action: "oom",
                    addr: None,
                    device_free: o.device_free,
                    size: o.size,
                    stream: o.stream,
                    time_us,
                    frames: None,
                },
            )?,
            Event::SnapshotPoint(p) => self.push(index, device, entry("snapshot", 0, p.active_bytes, 0, None))?,
            Event::SegmentState(s) if s.at == StateAt::End => {
                let mut blocks = Vec::with_capacity(s.blocks.len());
                let (mut allocated, mut active, mut requested) = (0, 0, 0);
                for b in &s.blocks {
                    if b.state == BlockState::ActiveAllocated {
                        allocated += b.size;
                        requested += b.requested_size;
                    }
                    if b.state != BlockState::Inactive {
                        active += b.size;
                    }
                    blocks.push(OutBlock {
                        address: b.addr,
                        size: b.size,
                        requested_size: b.requested_size,
                        state: state_str(b.state),
                        frames: self.frames(index, b.stack)?,
                    });
                }
                self.segments.push(OutSegment {
                    device,
                    address: s.addr,
                    total_size: s.total_size,
                    allocated_size: allocated,
                    active_size: active,
                    requested_size: requested,
                    stream: s.stream,
                    segment_type: match s.pool {
                        SegmentPool::Small => "small",
                        SegmentPool::Large => "large",
                    },
                    segment_pool_id: s.pool_id,
                    is_expandable: s.is_expandable,
                    frames: self.frames(index, s.stack)?,
                    blocks,
                });
            }
            // Not part of a snapshot: host memory, kernels, markers, CUPTI memory records, the start
            // state (memory_viz rebuilds it itself from the final segments), control calls.
            Event::Alloc(_)
            | Event::Free(_)
            | Event::Vmm(_)
            | Event::SegmentState(_)
            | Event::KernelLaunch(_)
            | Event::KernelExec(_)
            | Event::MemInfo(_)
            | Event::Marker(_)
            | Event::Name(_)
            | Event::Control(_)
            | Event::PoolTrim(_)
            | Event::ProcessExit(_)
            | Event::MemActivity(_) => {}
        }
        Ok(())
    }
}

fn out_frame(f: &Frame) -> OutFrame {
    let line = if f.line == UNKNOWN_LINE { u64::MAX } else { f.line as u64 };
    OutFrame { name: f.name.clone(), filename: f.filename.clone(), line }
}

/// What a written snapshot's `device_traces` hold, over all devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exported {
    /// `alloc` entries: the allocator's requests, which `memsim validate` and `replay` replay.
    pub allocs: u64,
    /// `segment_alloc`, `segment_free`, `segment_map` and `segment_unmap` entries: what the
    /// allocator did, which they only compare.
    pub segment_events: u64,
    /// Entries of any action.
    pub entries: u64,
    /// Segments of the final state.
    pub segments: u64,
    /// The trace header's allocator configuration string when the snapshot could not carry it
    /// (see [`carried_settings`]).
    pub alloc_conf_not_carried: Option<String>,
}

impl Exported {
    fn of(traces: &[Vec<OutEntry>]) -> Exported {
        let mut e = Exported::default();
        for entry in traces.iter().flatten() {
            e.entries += 1;
            match entry.action {
                "alloc" => e.allocs += 1,
                a if a.starts_with("segment_") => e.segment_events += 1,
                _ => {}
            }
        }
        e
    }
}

/// PyTorch's device index is an `int8_t` (`c10::DeviceIndex`): no snapshot has a device past it.
const MAX_DEVICE: u32 = i8::MAX as u32;

/// The slot of `device` in the snapshot's per-device trace list, which holds one list for every
/// device from 0: a damaged ordinal would make billions of them.
fn device_slot(index: usize, device: u32) -> Result<usize, SnapshotError> {
    if device > MAX_DEVICE {
        return Err(SnapshotError::Export {
            index,
            message: format!(
                "device {device}: a snapshot lists one trace per device from 0, and PyTorch's device \
                 index stops at {MAX_DEVICE}"
            ),
        });
    }
    Ok(device as usize)
}

/// Refuses what no snapshot can hold, numbering the records as every other command does (from
/// 0, after the header): a device past PyTorch's, a stack used before a record defines it. A
/// replay's realised records ([`crate::replay::Replayer::take_realized`]) hold the same devices
/// and stacks in the same order, but numbered otherwise (the model's segment events are added),
/// so a caller exporting a replay checks the trace it replayed first.
pub fn check_exportable(records: &[Record]) -> Result<(), SnapshotError> {
    let mut stacks = std::collections::HashSet::new();
    for (index, r) in records.iter().enumerate() {
        let stack = match &r.event {
            Event::Stack(s) => {
                stacks.insert(s.id);
                continue;
            }
            Event::Alloc(a) if a.mem == MemoryKind::Device => a.stack,
            Event::Free(f) if f.mem == MemoryKind::Device => f.stack,
            Event::Vmm(v) if matches!(v.op, VmmOp::Map | VmmOp::Unmap) => None,
            Event::Oom(_) | Event::SnapshotPoint(_) => None,
            Event::SegmentState(s) if s.at == StateAt::End => s.stack,
            _ => continue,
        };
        device_slot(index, r.device.unwrap_or(0))?;
        if let Some(id) = stack.filter(|id| !stacks.contains(id)) {
            return Err(SnapshotError::Export {
                index,
                message: format!("stack {id} is used before any stack record defines it"),
            });
        }
    }
    Ok(())
}

/// Encodes an allocator-level trace as snapshot pickle bytes. The trace must carry its final
/// segment state (`SegmentState` at `End`, as [`super::import`] writes) whenever it has events;
/// a trace without one needs a replay to compute it.
pub fn export_snapshot(header: &Header, records: &[Record]) -> Result<Vec<u8>, SnapshotError> {
    export(header, records, false).map(|(bytes, _)| bytes)
}

/// `replayed`: the records are a replay's realised ones, whose final state is the segments they
/// end with, none when there are none (every segment released, or none ever reserved).
fn export(header: &Header, records: &[Record], replayed: bool) -> Result<(Vec<u8>, Exported), SnapshotError> {
    if !header.is_allocator_level() {
        return Err(SnapshotError::Export {
            index: 0,
            message: "a device-level trace cannot be written as a snapshot: its allocations are \
                      segments, not tensor blocks"
                .to_string(),
        });
    }
    let mut b = Builder {
        header,
        stacks: HashMap::new(),
        current: HashMap::new(),
        fresh: StackId::MAX,
        traces: Vec::new(),
        segments: Vec::new(),
        live: HashMap::new(),
    };
    let mut has_end = false;
    for (i, r) in records.iter().enumerate() {
        has_end |= matches!(&r.event, Event::SegmentState(s) if s.at == StateAt::End);
        b.record(i, r)?;
    }
    let mut devices = 0;
    for d in &header.devices {
        devices = devices.max(device_slot(0, d.index)? + 1);
    }
    if b.traces.len() < devices {
        b.traces.resize_with(devices, Vec::new);
    }
    let has_events = b.traces.iter().any(|t| !t.is_empty());
    if has_events && !has_end && !replayed {
        return Err(SnapshotError::Export {
            index: records.len(),
            message: "the trace has no final segment state (SegmentState at end); replay it to \
                      compute the segments before exporting"
                .to_string(),
        });
    }
    let parse_meta = |key: &metadata::Key| header.meta(key).and_then(|t| serde_json::from_str(t).ok());
    let (allocator_settings, alloc_conf_not_carried) = carried_settings(header);
    let mut w = Encoder { w: PickleWriter::new(), stacks: &b.stacks, memo: HashMap::new() };
    let exported = Exported { segments: b.segments.len() as u64, alloc_conf_not_carried, ..Exported::of(&b.traces) };
    if header.meta_flag(&metadata::SNAPSHOT_LIST_FORM) == Some(true) {
        w.segments(&b.segments);
        return Ok((w.w.finish(), Exported::default()));
    }
    let snap = OutSnapshot {
        segments: b.segments,
        device_traces: b.traces,
        allocator_settings,
        external_annotations: parse_meta(&metadata::SNAPSHOT_ANNOTATIONS),
        memtrace_header: kept_header(header, &b.stacks),
    };
    w.snapshot(&snap);
    Ok((w.w.finish(), exported))
}

/// The snapshot's `allocator_settings`: the header's own (a snapshot's, imported), or else the
/// allocator configuration string the trace's environment recorded, in the key PyTorch writes it
/// under. A reader of a snapshot with settings and no 2.9-only field follows 2.5's rules
/// ([`super::guess_version`]), which refuse keys of later releases: such a string is not written
/// (a snapshot it made unreadable helps nobody) but returned, for the caller to say.
fn carried_settings(header: &Header) -> (Option<serde_json::Value>, Option<String>) {
    if let Some(t) = header.allocator_settings.as_deref() {
        return (serde_json::from_str(t).ok(), None);
    }
    match header.alloc_conf() {
        None => (None, None),
        Some(conf) if AllocatorConfig::parse(conf, TorchVersion::V2_5).is_ok() => {
            (Some(serde_json::json!({ "PYTORCH_CUDA_ALLOC_CONF": conf })), None)
        }
        Some(conf) => (None, Some(conf.to_string())),
    }
}

/// What the snapshot keeps of the trace's header: the producer (always: it marks the file as
/// memsim's, so that `memsim validate` can say when it would compare the model with itself), its
/// metadata (less the keys the snapshot carries itself, the libraries too when its frames say the
/// same) and whether its addresses are synthetic. Without it a symbolic trace would come back as
/// a measurement of a real run: no safety margin, no CUDA libraries. PyTorch's readers
/// (memory_viz, `pickle.load`) ignore the extra key.
fn kept_header(header: &Header, stacks: &HashMap<StackId, Vec<OutFrame>>) -> serde_json::Value {
    let mut own = vec![metadata::SNAPSHOT_ANNOTATIONS.name, metadata::SNAPSHOT_LIST_FORM.name];
    let names = stacks.values().flatten().map(|f| f.name.as_str());
    if let Some((gemm, conv)) = super::libraries::from_frame_names(names) {
        let said = (header.meta_flag(&metadata::USES_GEMM), header.meta_flag(&metadata::USES_CONV));
        if said == (Some(gemm), Some(conv)) {
            own.extend([metadata::USES_GEMM.name, metadata::USES_CONV.name]);
        }
    }
    let meta: serde_json::Map<String, serde_json::Value> = header
        .metadata
        .iter()
        .filter(|(k, _)| !own.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
        .collect();
    serde_json::json!({
        "producer": header.producer.name,
        "metadata": meta,
        "synthetic_addresses": header.synthetic_addresses,
    })
}

/// Writes the output structures in PyTorch's key order, sharing each frame list.
struct Encoder<'a> {
    w: PickleWriter,
    stacks: &'a HashMap<StackId, Vec<OutFrame>>,
    /// Memo index of each frame list already written.
    memo: HashMap<StackId, u32>,
}

impl Encoder<'_> {
    fn snapshot(&mut self, s: &OutSnapshot) {
        self.w.dict_begin();
        self.w.str("segments");
        self.segments(&s.segments);
        self.w.str("device_traces");
        self.w.list_begin();
        for t in &s.device_traces {
            self.w.list_begin();
            for e in t {
                self.entry(e);
            }
            self.w.list_end();
        }
        self.w.list_end();
        if let Some(v) = &s.allocator_settings {
            self.w.str("allocator_settings");
            self.w.json(v);
        }
        if let Some(v) = &s.external_annotations {
            self.w.str("external_annotations");
            self.w.json(v);
        }
        self.w.str(super::model::MEMTRACE_HEADER);
        self.w.json(&s.memtrace_header);
        self.w.dict_end();
    }

    fn segments(&mut self, segs: &[OutSegment]) {
        self.w.list_begin();
        for s in segs {
            self.w.dict_begin();
            for (k, v) in [
                ("device", s.device as i128),
                ("address", s.address as i128),
                ("total_size", s.total_size as i128),
                ("allocated_size", s.allocated_size as i128),
                ("active_size", s.active_size as i128),
                ("requested_size", s.requested_size as i128),
                ("stream", s.stream as i128),
            ] {
                self.w.str(k);
                self.w.int(v);
            }
            self.w.str("segment_type");
            self.w.str(s.segment_type);
            self.w.str("segment_pool_id");
            self.w.int_pair(s.segment_pool_id.0, s.segment_pool_id.1);
            self.w.str("is_expandable");
            self.w.bool(s.is_expandable);
            self.frames(s.frames);
            self.w.str("blocks");
            self.w.list_begin();
            for b in &s.blocks {
                self.w.dict_begin();
                for (k, v) in [("address", b.address), ("size", b.size), ("requested_size", b.requested_size)] {
                    self.w.str(k);
                    self.w.int(v as i128);
                }
                self.w.str("state");
                self.w.str(b.state);
                self.frames(b.frames);
                self.w.dict_end();
            }
            self.w.list_end();
            self.w.dict_end();
        }
        self.w.list_end();
    }

    fn entry(&mut self, e: &OutEntry) {
        self.w.dict_begin();
        self.w.str("action");
        self.w.str(e.action);
        for (k, v) in [("addr", e.addr), ("device_free", e.device_free)] {
            if let Some(v) = v {
                self.w.str(k);
                self.w.int(v as i128);
            }
        }
        self.w.str("size");
        self.w.int(e.size as i128);
        self.w.str("stream");
        self.w.int(e.stream as i128);
        if let Some(t) = e.time_us {
            self.w.str("time_us");
            self.w.int(t as i128);
        }
        self.frames(e.frames);
        self.w.dict_end();
    }

    /// The `frames` key and its list, or nothing when there is no stack.
    fn frames(&mut self, stack: Option<StackId>) {
        let Some(id) = stack else { return };
        self.w.str("frames");
        if let Some(&idx) = self.memo.get(&id) {
            self.w.get(idx);
            return;
        }
        self.w.list_begin();
        for f in self.stacks.get(&id).map(Vec::as_slice).unwrap_or(&[]) {
            self.w.dict_begin();
            self.w.str("name");
            self.w.str(&f.name);
            self.w.str("filename");
            self.w.str(&f.filename);
            self.w.str("line");
            self.w.int(f.line as i128);
            self.w.dict_end();
        }
        self.w.list_end();
        let idx = self.w.put();
        self.memo.insert(id, idx);
    }
}

/// Writes [`export_snapshot`]'s bytes to `path` through a temporary file in the same directory,
/// so a failure never leaves a partial file. Returns what the snapshot's traces hold.
pub fn write_snapshot(path: &Path, header: &Header, records: &[Record]) -> Result<Exported, SnapshotError> {
    write(path, header, records, false)
}

/// [`write_snapshot`] of a replay's realised records
/// ([`crate::replay::Replayer::take_realized`]): their final state is the segments they end with,
/// so records ending with none (the cache emptied, or nothing reserved) are a snapshot with no
/// segment, not a trace missing its final state.
pub fn write_replayed_snapshot(path: &Path, header: &Header, records: &[Record]) -> Result<Exported, SnapshotError> {
    write(path, header, records, true)
}

fn write(path: &Path, header: &Header, records: &[Record], replayed: bool) -> Result<Exported, SnapshotError> {
    let (bytes, exported) = export(header, records, replayed)?;
    trace::write_bytes_atomic(path, &bytes)
        .map_err(|source| SnapshotError::Write { path: path.to_path_buf(), source })?;
    Ok(exported)
}
