//! memtrace records → snapshot pickle that PyTorch's memory_viz opens.
//!
//! Written with serde-pickle at protocol 3 (memory_viz's JavaScript unpickler rejects PROTO > 4),
//! with no bytes or sets, and with absent optional fields left out rather than written as None.
//! `frames` is written when the trace has a stack for the entry (an empty stack is written as
//! `[]`, as PyTorch writes it) and left out otherwise.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use serde::Serialize;
use trace::{
    BlockState, Event, Frame, FreeStage, Header, MemoryKind, Origin, Record, SegmentPool, StackId,
    StateAt, VmmOp,
};

use super::import::{META_ANNOTATIONS, META_LIST_FORM};
use super::model::UNKNOWN_LINE;
use super::SnapshotError;

#[derive(Serialize)]
struct OutSnapshot {
    segments: Vec<OutSegment>,
    device_traces: Vec<Vec<OutEntry>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allocator_settings: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    external_annotations: Option<serde_json::Value>,
}

#[derive(Serialize)]
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
    #[serde(skip_serializing_if = "Option::is_none")]
    frames: Option<Vec<OutFrame>>,
    blocks: Vec<OutBlock>,
}

#[derive(Serialize)]
struct OutBlock {
    address: u64,
    size: u64,
    requested_size: u64,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    frames: Option<Vec<OutFrame>>,
}

#[derive(Serialize, Clone)]
struct OutFrame {
    name: String,
    filename: String,
    line: u64,
}

#[derive(Serialize)]
struct OutEntry {
    action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    addr: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_free: Option<u64>,
    size: u64,
    stream: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    time_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frames: Option<Vec<OutFrame>>,
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
    traces: Vec<Vec<OutEntry>>,
    segments: Vec<OutSegment>,
    /// Requested size of live blocks, for frees that do not carry a size.
    live: HashMap<(u32, u64), u64>,
}

impl Builder<'_> {
    fn frames(&self, index: usize, stack: Option<StackId>) -> Result<Option<Vec<OutFrame>>, SnapshotError> {
        match stack {
            None => Ok(None),
            Some(id) => self.stacks.get(&id).cloned().map(Some).ok_or_else(|| SnapshotError::Export {
                index,
                message: format!("stack {id} is used before any stack record defines it"),
            }),
        }
    }

    fn push(&mut self, device: u32, entry: OutEntry) {
        let d = device as usize;
        if self.traces.len() <= d {
            self.traces.resize_with(d + 1, Vec::new);
        }
        self.traces[d].push(entry);
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
                self.stacks.insert(s.id, frames);
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
                self.push(device, entry(action, a.addr, a.size, a.stream, frames));
            }
            Event::Free(f) if f.mem == MemoryKind::Device => {
                let frames = self.frames(index, f.stack)?;
                if f.origin == Origin::Outcome {
                    let size = f.size.ok_or_else(|| SnapshotError::Export {
                        index,
                        message: format!("segment free at 0x{:x} has no size", f.addr),
                    })?;
                    self.push(device, entry("segment_free", f.addr, size, f.stream, frames));
                    return Ok(());
                }
                let size = match f.size.or_else(|| self.live.get(&(device, f.addr)).copied()) {
                    Some(s) => s,
                    None => {
                        return Err(SnapshotError::Export {
                            index,
                            message: format!("free of 0x{:x} has no size and frees no known block", f.addr),
                        })
                    }
                };
                if matches!(f.stage, FreeStage::Requested | FreeStage::Immediate) {
                    self.push(device, entry("free_requested", f.addr, size, f.stream, frames.clone()));
                }
                if matches!(f.stage, FreeStage::Completed | FreeStage::Immediate) {
                    self.live.remove(&(device, f.addr));
                    self.push(device, entry("free_completed", f.addr, size, f.stream, frames));
                }
            }
            Event::Vmm(v) if matches!(v.op, VmmOp::Map | VmmOp::Unmap) => {
                let action = if v.op == VmmOp::Map { "segment_map" } else { "segment_unmap" };
                self.push(device, entry(action, v.addr, v.size, v.stream, None));
            }
            Event::Oom(o) => self.push(
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
            ),
            Event::SnapshotPoint(p) => self.push(device, entry("snapshot", 0, p.active_bytes, 0, None)),
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
            // Not part of a snapshot: host memory, kernels, markers, the start state (memory_viz
            // rebuilds it itself from the final segments), control calls.
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
            | Event::ProcessExit(_) => {}
        }
        Ok(())
    }
}

fn out_frame(f: &Frame) -> OutFrame {
    let line = if f.line == UNKNOWN_LINE { u64::MAX } else { f.line as u64 };
    OutFrame { name: f.name.clone(), filename: f.filename.clone(), line }
}

/// Encodes an allocator-level trace as snapshot pickle bytes. The trace must carry its final
/// segment state (`SegmentState` at `End`, as [`super::import`] writes) whenever it has events;
/// a trace without one needs a replay to compute it.
pub fn export_snapshot(header: &Header, records: &[Record]) -> Result<Vec<u8>, SnapshotError> {
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
        traces: Vec::new(),
        segments: Vec::new(),
        live: HashMap::new(),
    };
    let mut has_end = false;
    for (i, r) in records.iter().enumerate() {
        has_end |= matches!(&r.event, Event::SegmentState(s) if s.at == StateAt::End);
        b.record(i, r)?;
    }
    let devices = header.devices.iter().map(|d| d.index as usize + 1).max().unwrap_or(0);
    if b.traces.len() < devices {
        b.traces.resize_with(devices, Vec::new);
    }
    let has_events = b.traces.iter().any(|t| !t.is_empty());
    if has_events && !has_end {
        return Err(SnapshotError::Export {
            index: records.len(),
            message: "the trace has no final segment state (SegmentState at end); replay it to \
                      compute the segments before exporting"
                .to_string(),
        });
    }
    let parse_meta = |key: &str| header.meta(key).and_then(|t| serde_json::from_str(t).ok());
    let allocator_settings = header.allocator_settings.as_deref().and_then(|t| serde_json::from_str(t).ok());
    let opts = serde_pickle::SerOptions::new();
    if header.meta(META_LIST_FORM) == Some("true") {
        return Ok(serde_pickle::to_vec(&b.segments, opts)?);
    }
    let snap = OutSnapshot {
        segments: b.segments,
        device_traces: b.traces,
        allocator_settings,
        external_annotations: parse_meta(META_ANNOTATIONS),
    };
    Ok(serde_pickle::to_vec(&snap, opts)?)
}

/// Writes [`export_snapshot`]'s bytes to `path` through a temporary file in the same directory,
/// so a failure never leaves a partial file.
pub fn write_snapshot(path: &Path, header: &Header, records: &[Record]) -> Result<(), SnapshotError> {
    let bytes = export_snapshot(header, records)?;
    let wr = |source| SnapshotError::Write { path: path.to_path_buf(), source };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(wr)?;
    tmp.write_all(&bytes).map_err(wr)?;
    tmp.persist(path).map_err(|e| wr(e.error))?;
    Ok(())
}
