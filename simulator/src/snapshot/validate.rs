//! Validation of the allocator model against a recorded snapshot (`memsim validate`).
//!
//! The snapshot's block-level events (alloc, free_requested, free_completed) are replayed from
//! the rebuilt start state; every predicted block address and segment event is compared with the
//! recorded one.
//! - A request that needs a new segment passes the recorded address, because cudaMalloc chose
//!   the base on the GPU.
//! - After a misplaced block the model is resynchronised: rebuilt with the block at its recorded
//!   address ([`super::resync`]), and counting goes on. Where that is impossible (expandable
//!   segments, or the recorded address is not free in the model) later frees of the block are
//!   translated to where the model put it instead (`translated`).
//! - `segment_free`/`segment_unmap` bursts come from `empty_cache()` or the OOM retry path at a
//!   capacity the snapshot does not record. Without a capacity a burst is replayed as an
//!   `empty_cache` where it starts (counted in `empty_cache_bursts`); with one, the model must
//!   predict it inside the next allocation, and agreement is counted.

use std::collections::HashMap;

use serde::Serialize;
use trace::BlockState;

use crate::alloc::{Allocator, AllocatorConfig, DeviceEvent, ExistingSegment, Request, TorchVersion};

use super::caveats::entry_caveats;
use super::model::{Action, Snapshot, TraceEntry};
use super::rebuild::{rebuild, StartState, Unrecoverable};
use super::resync::resync;
pub use super::settings::{guess_version, snapshot_choice, snapshot_config};
use super::SnapshotError;

/// How to validate.
#[derive(Debug, Clone, Default)]
pub struct ValidateOptions {
    /// Device capacity in bytes; None replays free bursts as `empty_cache`.
    pub capacity: Option<u64>,
    /// Rules of this release instead of the one guessed from the settings' keys.
    pub version: Option<TorchVersion>,
    /// A `PYTORCH_CUDA_ALLOC_CONF` string that overrides the snapshot's settings.
    pub alloc_conf: Option<String>,
}

/// Overall judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every address and segment event matches.
    Exact,
    /// Mismatches, but the start state had unrecoverable parts that can explain them: every
    /// misplaced allocation was recorded or predicted in a start segment holding one. Never
    /// when no allocation was replayed ([`ValidationReport::nothing_compared`]): then the model
    /// predicted nothing, and no start state explains the segment events it did not predict.
    ExplainedByStartState,
    /// Mismatches with a fully recovered start state: the model (or the replay) is wrong.
    Mismatch,
}

/// One disagreement, for diagnosis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// Index of the entry in its device's trace.
    pub entry: usize,
    /// What was compared (`alloc`, `segment_alloc`, ...).
    pub action: String,
    /// Requested size (alloc) or segment size.
    pub size: u64,
    /// Stream.
    pub stream: i64,
    /// Recorded address.
    pub recorded_addr: u64,
    /// Predicted address (None: not predicted at all).
    pub predicted_addr: Option<u64>,
}

/// Counts over a stretch of the trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Recorded `alloc` entries replayed.
    pub allocs: u64,
    /// Of those, placed at the recorded address.
    pub alloc_addr_matches: u64,
    /// Recorded segment events (alloc, free, map, unmap).
    pub segment_events: u64,
    /// Of those, predicted with the same kind, address and size at the same point.
    pub segment_event_matches: u64,
    /// Segment events the model predicted that the trace does not have.
    pub extra_predicted_segment_events: u64,
}

impl Counts {
    /// The counts of several stretches (or devices) together.
    pub fn sum<'a>(all: impl IntoIterator<Item = &'a Counts>) -> Counts {
        all.into_iter().fold(Counts::default(), |a, b| Counts {
            allocs: a.allocs + b.allocs,
            alloc_addr_matches: a.alloc_addr_matches + b.alloc_addr_matches,
            segment_events: a.segment_events + b.segment_events,
            segment_event_matches: a.segment_event_matches + b.segment_event_matches,
            extra_predicted_segment_events: a.extra_predicted_segment_events + b.extra_predicted_segment_events,
        })
    }
}

/// Per-device results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceReport {
    /// Device.
    pub device: u32,
    /// Counts over the whole trace.
    #[serde(flatten)]
    pub counts: Counts,
    /// Counts up to the first `segment_unmap` (where an expandable trace's OOM path begins);
    /// None when the trace has none.
    pub before_first_unmap: Option<Counts>,
    /// Segments in the rebuilt start state.
    pub start_segments: usize,
    /// Reserved bytes at the start.
    pub start_reserved_bytes: u64,
    /// Peak reserved bytes of the recorded segment events.
    pub recorded_peak_reserved_bytes: u64,
    /// Peak reserved bytes of the predicted segment events.
    pub predicted_peak_reserved_bytes: u64,
    /// Free bursts replayed as `empty_cache`.
    pub empty_cache_bursts: u64,
    /// Recorded `oom` entries.
    pub recorded_ooms: u64,
    /// Mismatches after which the model was rebuilt with the block at its recorded address.
    pub resyncs: u64,
    /// Mismatches that could not be resynchronised: later frees of the block are translated to
    /// the predicted address instead.
    pub translated: u64,
    /// Requests the model refused (unknown address, ...), with the entry index.
    pub replay_errors: Vec<String>,
    /// The first few mismatches.
    pub first_mismatches: Vec<Mismatch>,
    /// Allocations placed elsewhere than recorded where neither address is in a start segment
    /// holding an unrecoverable block: no ambiguity of the start state can have moved them.
    pub unexplained_mismatches: u64,
}

/// The result of [`validate`]. The flat counts sum over devices; the peaks are the largest
/// device's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValidationReport {
    /// The counts over the whole trace, summed over devices.
    #[serde(flatten)]
    pub counts: Counts,
    /// Peak reserved bytes recorded: the largest device's, as `replay` reports a peak (no one
    /// GPU holds the sum of several devices' peaks).
    pub recorded_peak_reserved_bytes: u64,
    /// Peak reserved bytes predicted: the largest device's.
    pub predicted_peak_reserved_bytes: u64,
    /// What the start-state rebuild could not recover.
    pub unrecoverable: Vec<Unrecoverable>,
    /// Free bursts replayed as `empty_cache` (no capacity given).
    pub empty_cache_bursts: u64,
    /// Capacity used, if any.
    pub capacity: Option<u64>,
    /// Release whose rules were used.
    pub torch_version: String,
    /// The allocator configuration compared, in `PYTORCH_CUDA_ALLOC_CONF` syntax (none: nothing
    /// recorded, or only settings fields).
    pub alloc_conf: Option<String>,
    /// Where it came from: `override` (`--alloc-conf`), `recorded`, or `default`.
    pub alloc_conf_source: crate::alloc::ConfigSource,
    /// What the numbers do not say: recorded settings in conflict, ones `--alloc-conf` drops, a
    /// snapshot memsim wrote itself (the comparison is then circular).
    pub warnings: Vec<String>,
    /// The judgement.
    pub verdict: Verdict,
    /// No allocation was replayed (the snapshot records no `alloc` entry), so the model
    /// predicted nothing from the run: an `Exact` verdict is vacuous, and any recorded segment
    /// event is one the model did not predict.
    pub nothing_compared: bool,
    /// Per-device detail.
    pub devices: Vec<DeviceReport>,
}

impl ValidationReport {
    /// False when the mismatches go beyond what the unrecoverable start state explains.
    pub fn passed(&self) -> bool {
        self.verdict != Verdict::Mismatch
    }
}

/// The start state of a snapshot rebuilt with the rounding of `cfg`.
pub fn rebuild_with(snap: &Snapshot, cfg: &AllocatorConfig) -> StartState {
    rebuild(&snap.segments, &snap.device_traces, cfg)
}

/// Replays a snapshot through the model and compares (see the module documentation).
pub fn validate(snap: &Snapshot, opts: &ValidateOptions) -> Result<ValidationReport, SnapshotError> {
    let (cfg, _) = snapshot_config(snap, opts.version, opts.alloc_conf.as_deref())?;
    validate_from(snap, &rebuild_with(snap, &cfg), opts)
}

/// [`validate`] from a given start state instead of the rebuilt one: for trying other
/// resolutions of what the rebuild reported as unrecoverable.
pub fn validate_from(
    snap: &Snapshot,
    start: &StartState,
    opts: &ValidateOptions,
) -> Result<ValidationReport, SnapshotError> {
    let (chosen, version) = snapshot_choice(snap, opts.version, opts.alloc_conf.as_deref())?;
    let cfg = chosen.cfg;
    let mut devices = Vec::new();
    // A device may hold segments and have no trace (the old list-of-segments form has none).
    let count = start.segments.iter().map(|s| s.device as usize + 1).max().unwrap_or(0).max(snap.device_traces.len());
    for d in 0..count {
        let entries = snap.device_traces.get(d).map_or(&[][..], Vec::as_slice);
        let d = d as u32;
        if entries.is_empty() && start.device_segments(d).next().is_none() {
            continue;
        }
        let mut alloc = Allocator::new(cfg.clone(), version, opts.capacity);
        seed(&mut alloc, start, d)?;
        devices.push(Replay::new(alloc, d, start.reserved(d), opts.capacity).run(entries, start));
    }
    let sum = |f: &dyn Fn(&DeviceReport) -> u64| devices.iter().map(f).sum::<u64>();
    let max = |f: &dyn Fn(&DeviceReport) -> u64| devices.iter().map(f).max().unwrap_or(0);
    let mut report = ValidationReport {
        counts: Counts::sum(devices.iter().map(|d| &d.counts)),
        recorded_peak_reserved_bytes: max(&|r| r.recorded_peak_reserved_bytes),
        predicted_peak_reserved_bytes: max(&|r| r.predicted_peak_reserved_bytes),
        unrecoverable: start.unrecoverable.clone(),
        empty_cache_bursts: sum(&|r| r.empty_cache_bursts),
        capacity: opts.capacity,
        torch_version: version.to_string(),
        alloc_conf: chosen.shown,
        alloc_conf_source: chosen.source,
        warnings: chosen
            .warnings
            .into_iter()
            .chain(super::settings::circular(snap))
            .chain(entry_caveats(snap))
            .collect(),
        verdict: Verdict::Exact,
        nothing_compared: false,
        devices,
    };
    report.nothing_compared = report.counts.allocs == 0;
    let unexplained: u64 = report.devices.iter().map(|d| d.unexplained_mismatches).sum();
    let c = report.counts;
    let clean = c.alloc_addr_matches == c.allocs
        && c.segment_event_matches == c.segment_events
        && c.extra_predicted_segment_events == 0
        && report.devices.iter().all(|d| d.replay_errors.is_empty());
    report.verdict = if clean {
        Verdict::Exact
    } else if !report.nothing_compared
        && !report.unrecoverable.is_empty()
        && !report.unrecoverable.iter().any(|u| u.inconsistent)
        && unexplained == 0
    {
        Verdict::ExplainedByStartState
    } else {
        Verdict::Mismatch
    };
    Ok(report)
}

fn seed(alloc: &mut Allocator, start: &StartState, device: u32) -> Result<(), SnapshotError> {
    for s in start.device_segments(device) {
        let seg = ExistingSegment::from(s);
        alloc.add_existing_segment(&seg).map_err(|e| SnapshotError::Config {
            message: format!("device {device}: rebuilt start state rejected by the model: {e}"),
        })?;
        // A block whose free was requested before the trace is pending: only its completion is
        // recorded.
        for b in s.blocks.iter().filter(|b| b.state == BlockState::ActivePendingFree) {
            alloc.apply(&Request::FreeRequested { addr: b.addr }).map_err(|e| SnapshotError::Config {
                message: format!("device {device}: pending block at 0x{:x}: {e}", b.addr),
            })?;
        }
    }
    Ok(())
}

const MAX_LISTED: usize = 10;

/// Recorded segment event, in comparable form.
fn recorded_event(e: &TraceEntry) -> Option<DeviceEvent> {
    let (addr, size) = (e.addr, e.size);
    match e.action {
        Action::SegmentAlloc => Some(DeviceEvent::SegmentAlloc { addr, size }),
        Action::SegmentFree => Some(DeviceEvent::SegmentFree { addr, size }),
        Action::SegmentMap => Some(DeviceEvent::SegmentMap { addr, size }),
        Action::SegmentUnmap => Some(DeviceEvent::SegmentUnmap { addr, size }),
        _ => None,
    }
}

fn event_parts(e: &DeviceEvent) -> (&'static str, u64, u64, i64) {
    match *e {
        DeviceEvent::SegmentAlloc { addr, size } => ("segment_alloc", addr, size, 1),
        DeviceEvent::SegmentFree { addr, size } => ("segment_free", addr, size, -1),
        DeviceEvent::SegmentMap { addr, size } => ("segment_map", addr, size, 1),
        DeviceEvent::SegmentUnmap { addr, size } => ("segment_unmap", addr, size, -1),
    }
}

struct Reserved {
    current: u64,
    peak: u64,
}

impl Reserved {
    fn apply(&mut self, e: &DeviceEvent) {
        let (_, _, size, sign) = event_parts(e);
        if sign > 0 {
            self.current = self.current.saturating_add(size);
            self.peak = self.peak.max(self.current);
        } else {
            self.current = self.current.saturating_sub(size);
        }
    }
}

struct Replay {
    alloc: Allocator,
    report: DeviceReport,
    with_capacity: bool,
    capacity: Option<u64>,
    recorded: Reserved,
    predicted: Reserved,
    /// Recorded segment events not yet compared, with their entry index.
    pending: Vec<(usize, DeviceEvent)>,
    /// Recorded address → model address, for blocks the model placed elsewhere.
    moved: HashMap<u64, u64>,
    /// Recorded blocks the model could not allocate at all (OOM at the capacity).
    lost: std::collections::HashSet<u64>,
    /// Start segments of this device holding an unrecoverable block: `(base, end)`. An
    /// ambiguous block's size moves placements within its segment, and only there.
    ambiguous: Vec<(u64, u64)>,
}

impl Replay {
    fn new(alloc: Allocator, device: u32, start_reserved: u64, capacity: Option<u64>) -> Self {
        let with_capacity = capacity.is_some();
        Replay {
            alloc,
            report: DeviceReport {
                device,
                counts: Counts::default(),
                before_first_unmap: None,
                start_segments: 0,
                start_reserved_bytes: start_reserved,
                recorded_peak_reserved_bytes: start_reserved,
                predicted_peak_reserved_bytes: start_reserved,
                empty_cache_bursts: 0,
                recorded_ooms: 0,
                resyncs: 0,
                translated: 0,
                replay_errors: Vec::new(),
                first_mismatches: Vec::new(),
                unexplained_mismatches: 0,
            },
            with_capacity,
            capacity,
            recorded: Reserved { current: start_reserved, peak: start_reserved },
            predicted: Reserved { current: start_reserved, peak: start_reserved },
            pending: Vec::new(),
            moved: HashMap::new(),
            lost: std::collections::HashSet::new(),
            ambiguous: Vec::new(),
        }
    }

    fn mismatch(&mut self, m: Mismatch) {
        if self.report.first_mismatches.len() < MAX_LISTED {
            self.report.first_mismatches.push(m);
        }
    }

    fn error(&mut self, index: usize, text: String) {
        if self.report.replay_errors.len() < MAX_LISTED {
            self.report.replay_errors.push(format!("entry {index}: {text}"));
        }
    }

    /// Compares predicted segment events with the pending recorded ones, in order.
    fn compare_segment_events(&mut self, predicted: &[DeviceEvent], stream: i64) {
        for p in predicted {
            self.predicted.apply(p);
        }
        let mut unmatched: Vec<DeviceEvent> = predicted.to_vec();
        let pending = std::mem::take(&mut self.pending);
        for (index, r) in pending {
            self.report.counts.segment_events += 1;
            if let Some(k) = unmatched.iter().position(|p| *p == r) {
                unmatched.remove(k);
                self.report.counts.segment_event_matches += 1;
            } else {
                let (action, addr, size, _) = event_parts(&r);
                let predicted_addr = unmatched.iter().find(|p| event_parts(p).0 == action).map(|p| event_parts(p).1);
                self.mismatch(Mismatch {
                    entry: index,
                    action: action.to_string(),
                    size,
                    stream,
                    recorded_addr: addr,
                    predicted_addr,
                });
            }
        }
        self.report.counts.extra_predicted_segment_events += unmatched.len() as u64;
    }

    fn target(&self, recorded: u64) -> u64 {
        self.moved.get(&recorded).copied().unwrap_or(recorded)
    }

    fn run(mut self, entries: &[TraceEntry], start: &StartState) -> DeviceReport {
        let device = self.report.device;
        self.report.start_segments = start.device_segments(device).count();
        let segments: Vec<(u64, u64)> = start.device_segments(device).map(|s| (s.addr, s.addr + s.size)).collect();
        let within = |a: u64| segments.iter().any(|&(base, end)| (base..end).contains(&a));
        let unsure: Vec<Option<u64>> =
            start.unrecoverable.iter().filter(|u| u.device == device).map(|u| u.addr).collect();
        // What the rebuild could not place at all (no address, or in no start segment: an
        // expandable reservation, a dropped block) may move any placement on the device.
        self.ambiguous = if unsure.iter().any(|a| a.is_none_or(|a| !within(a))) {
            vec![(0, u64::MAX)]
        } else {
            let held = |&(base, end): &(u64, u64)| unsure.iter().flatten().any(|&a| (base..end).contains(&a));
            segments.iter().copied().filter(held).collect()
        };
        let mut i = 0;
        while i < entries.len() {
            let e = &entries[i];
            let is_release = matches!(e.action, Action::SegmentFree | Action::SegmentUnmap);
            if is_release && !self.with_capacity {
                // An entry a replay leaves out (an annotation) inside a burst does not end it.
                let end = i + entries[i..]
                    .iter()
                    .take_while(|e| {
                        matches!(e.action, Action::SegmentFree | Action::SegmentUnmap) || e.action.left_out()
                    })
                    .count();
                self.burst(i, &entries[i..end]);
                i = end;
                continue;
            }
            if e.action == Action::SegmentUnmap && self.report.before_first_unmap.is_none() {
                self.report.before_first_unmap = Some(self.report.counts);
            }
            match e.action {
                Action::SegmentAlloc | Action::SegmentMap | Action::SegmentFree | Action::SegmentUnmap => {
                    if let Some(ev) = recorded_event(e) {
                        self.recorded.apply(&ev);
                        self.pending.push((i, ev));
                    }
                }
                Action::Alloc => self.alloc(i, e),
                Action::FreeRequested | Action::FreeCompleted => {
                    self.flush_pending(e.stream);
                    self.free(i, e);
                }
                Action::Oom => self.report.recorded_ooms += 1,
                Action::Snapshot | Action::Annotate | Action::Unknown => {}
            }
            i += 1;
        }
        let stream = entries.iter().rev().find(|e| !e.action.left_out()).map_or(0, |e| e.stream);
        self.flush_pending(stream);
        self.report.recorded_peak_reserved_bytes = self.recorded.peak;
        self.report.predicted_peak_reserved_bytes = self.predicted.peak;
        self.report
    }

    /// Recorded segment events that no allocation explains are mismatches. Recorded releases the
    /// model did not predict (with a capacity) are then applied as an `empty_cache`, so the
    /// model holds the same segments as the GPU again.
    fn flush_pending(&mut self, stream: i64) {
        let Some(&(index, _)) = self.pending.last() else { return };
        let releases = self
            .pending
            .iter()
            .any(|(_, e)| matches!(e, DeviceEvent::SegmentFree { .. } | DeviceEvent::SegmentUnmap { .. }));
        self.compare_segment_events(&[], stream);
        if releases {
            self.resync_releases(index);
        }
    }

    fn resync_releases(&mut self, index: usize) {
        match self.alloc.apply(&Request::EmptyCache) {
            Ok(out) => {
                for p in &out.device_events {
                    self.predicted.apply(p);
                }
            }
            Err(e) => self.error(index, format!("empty_cache (resync): {e}")),
        }
    }

    /// A recorded free burst without a capacity: replayed as `empty_cache` where it starts.
    fn burst(&mut self, index: usize, burst: &[TraceEntry]) {
        if self.report.before_first_unmap.is_none() && burst.iter().any(|e| e.action == Action::SegmentUnmap) {
            self.report.before_first_unmap = Some(self.report.counts);
        }
        let stream = burst[0].stream;
        self.flush_pending(stream);
        self.report.empty_cache_bursts += 1;
        for (k, e) in burst.iter().enumerate() {
            if let Some(ev) = recorded_event(e) {
                self.recorded.apply(&ev);
                self.pending.push((index + k, ev));
            }
        }
        match self.alloc.apply(&Request::EmptyCache) {
            Ok(out) => self.compare_segment_events(&out.device_events, stream),
            Err(e) => {
                self.compare_segment_events(&[], stream);
                self.error(index, format!("empty_cache: {e}"));
            }
        }
    }

    fn alloc(&mut self, index: usize, e: &TraceEntry) {
        let req = Request::Alloc { size: e.size, stream: e.stream, recorded_addr: Some(e.addr) };
        let out = match self.alloc.apply(&req) {
            Ok(out) => out,
            Err(err) => {
                self.compare_segment_events(&[], e.stream);
                self.error(index, format!("alloc of {} B: {err}", e.size));
                self.lost.insert(e.addr);
                return;
            }
        };
        let unpredicted_release = self.pending.iter().any(|(_, r)| {
            matches!(r, DeviceEvent::SegmentFree { .. } | DeviceEvent::SegmentUnmap { .. })
                && !out.device_events.contains(r)
        });
        self.compare_segment_events(&out.device_events, e.stream);
        self.report.counts.allocs += 1;
        match out.addr {
            Some(a) if a == e.addr => self.report.counts.alloc_addr_matches += 1,
            predicted => {
                let in_ambiguous = |a: u64| self.ambiguous.iter().any(|&(base, end)| (base..end).contains(&a));
                // Placed nowhere (out of memory at a --capacity) is the capacity's doing, not a
                // placement the model chose.
                if predicted.is_some_and(|p| !in_ambiguous(p)) && !in_ambiguous(e.addr) {
                    self.report.unexplained_mismatches += 1;
                }
                self.mismatch(Mismatch {
                    entry: index,
                    action: "alloc".to_string(),
                    size: e.size,
                    stream: e.stream,
                    recorded_addr: e.addr,
                    predicted_addr: predicted,
                });
                match predicted {
                    Some(a) => match resync(&self.alloc, self.capacity, a, e.addr, e.size) {
                        Some(fresh) => {
                            self.alloc = fresh;
                            self.report.resyncs += 1;
                        }
                        None => {
                            self.moved.insert(e.addr, a);
                            self.report.translated += 1;
                        }
                    },
                    None => {
                        self.lost.insert(e.addr);
                    }
                }
            }
        }
        if unpredicted_release {
            self.resync_releases(index);
        }
    }

    fn free(&mut self, index: usize, e: &TraceEntry) {
        if self.lost.contains(&e.addr) {
            if e.action == Action::FreeCompleted {
                self.lost.remove(&e.addr);
            }
            return;
        }
        let addr = self.target(e.addr);
        let req = if e.action == Action::FreeRequested {
            Request::FreeRequested { addr }
        } else {
            Request::FreeCompleted { addr }
        };
        match self.alloc.apply(&req) {
            Ok(out) => {
                if !out.device_events.is_empty() {
                    self.compare_segment_events(&out.device_events, e.stream);
                }
            }
            Err(err) => self.error(index, format!("{}: {err}", e.action.as_str())),
        }
        if e.action == Action::FreeCompleted {
            self.moved.remove(&e.addr);
        }
    }
}
