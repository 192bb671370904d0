//! Replay: drives the allocator model from a trace's request events. Sans-IO: the caller reads
//! the trace and feeds records to [`Replayer::observe`].
//!
//! What is replayed:
//! - allocator-level traces (the symbolic tracer, imported snapshots): `request` events only;
//!   `outcome` events (segments) are what a real allocator did and are never replayed;
//! - device-level shim traces taken with `PYTORCH_NO_CUDA_MEMORY_CACHING=1`: each device
//!   `cudaMalloc`/`cudaFree` is one allocator request in effect.
//!
//! Requests from other caller modules (NCCL, cuBLAS, extensions calling `cudaMalloc` themselves)
//! bypass the caching allocator on a real run, so they are left out and reported.

use std::collections::BTreeMap;

use hashbrown::HashMap;
use serde::Serialize;
use trace::{
    Alloc, Api, BlockInfo, BlockState, Category, ControlOp, Event, Free, FreeStage, Header, MemoryKind, Oom, Origin,
    Record, SegmentPool, SegmentState, StateAt, Vmm, VmmOp,
};

use crate::alloc::{
    Allocator, AllocatorConfig, BlockViewState, ConfigError, DeviceEvent, ExistingBlock, ExistingSegment, Outcome,
    ReplayError, Request, TorchVersion,
};

/// Why a trace cannot be replayed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplaySetupError {
    /// A device-level trace with the cache on records segments, not requests.
    #[error(
        "this is a device-level trace taken with PyTorch's caching allocator on: its cudaMalloc \
         events are segments, not tensor requests, so replaying them would model a cache on top of \
         a cache. Record an allocator-level trace instead: rerun under the shim with \
         PYTORCH_NO_CUDA_MEMORY_CACHING=1, or use `python -m memtrace_trainer symtrace`; \
         `memsim stats` summarises this trace as it is"
    )]
    DeviceLevel,
    /// The allocator configuration is invalid.
    #[error("allocator configuration {source_name}: {error}")]
    Config {
        /// Where the configuration came from.
        source_name: String,
        /// The parse error (names the key).
        error: ConfigError,
    },
}

/// Replay options.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// `PYTORCH_CUDA_ALLOC_CONF`-syntax override; otherwise the trace's recorded settings.
    pub alloc_conf: Option<String>,
    /// Allocator behaviour version.
    pub version: TorchVersion,
    /// Device capacity in bytes for the OOM chain; `None` = unlimited.
    pub capacity: Option<u64>,
}

/// Where a replayed event came from, for error messages.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EventRef {
    /// Index of the record in the trace (0 = first record after the header).
    pub index: u64,
    /// Device.
    pub device: u32,
}

/// Fragmentation at the moment of peak reserved memory.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Fragmentation {
    /// Reserved minus allocated bytes.
    pub reserved_minus_allocated: u64,
    /// Largest free block.
    pub largest_free_block: u64,
    /// Segments (native) or mapped ranges held.
    pub segments: u64,
}

/// Per-device result.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceReport {
    /// Device ordinal.
    pub device: u32,
    /// `reserved_bytes.all.peak`.
    pub peak_reserved_bytes: u64,
    /// `allocated_bytes.all.peak`.
    pub peak_allocated_bytes: u64,
    /// `active_bytes.all.peak`.
    pub peak_active_bytes: u64,
    /// `requested_bytes.all.peak`.
    pub peak_requested_bytes: u64,
    /// At the first moment reserved memory reached its peak.
    pub at_peak: Fragmentation,
    /// Allocated bytes by category at the peak of allocated bytes (when the trace has categories).
    pub categories_at_peak: BTreeMap<String, u64>,
    /// `torch.cuda.memory_stats()` at the end of the trace.
    pub memory_stats: serde_json::Value,
}

/// Peaks within one training iteration: from its `iter:<n>` marker to the next one (or the end).
/// Memory held when the iteration starts counts, so iteration 0 includes the setup's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IterationPeak {
    /// The marker's iteration number.
    pub iter: u64,
    /// Max over devices and over the iteration of allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Max over devices and over the iteration of reserved bytes.
    pub peak_reserved_bytes: u64,
}

/// Replay result.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// Max over devices of `reserved_bytes.all.peak`.
    pub peak_reserved_bytes: u64,
    /// Max over devices of `allocated_bytes.all.peak`.
    pub peak_allocated_bytes: u64,
    /// Max over devices of `active_bytes.all.peak`.
    pub peak_active_bytes: u64,
    /// Max over devices of `requested_bytes.all.peak`.
    pub peak_requested_bytes: u64,
    /// Whether an allocation failed at the capacity.
    pub oom: bool,
    /// Index of the first record whose allocation failed.
    pub oom_at_event: Option<u64>,
    /// Details of the first OOM.
    pub oom_detail: Option<String>,
    /// Requests replayed.
    pub requests: u64,
    /// Records seen.
    pub events: u64,
    /// Request events left out because another module made them (by caller module).
    pub skipped_by_caller: BTreeMap<String, u64>,
    /// Failed calls in the trace that were not replayed.
    pub skipped_failed_calls: u64,
    /// Requests the model rejected (free of an unknown address, ...), with the first few messages.
    pub rejected: u64,
    /// The first rejected requests' messages.
    pub rejected_examples: Vec<String>,
    /// `memory_stats()` of device 0 (or the only device) at the end.
    pub memory_stats: serde_json::Value,
    /// Per device.
    pub devices: Vec<DeviceReport>,
    /// The capacity used, bytes.
    pub capacity: Option<u64>,
    /// Allocator configuration string in force (as given, or from the trace).
    pub alloc_conf: Option<String>,
    /// Peaks per `iter:<n>` marker, in trace order; empty when the trace has none.
    pub iterations: Vec<IterationPeak>,
}

impl ReplayReport {
    /// The first iteration's peaks, and the max over the later iterations (the steady state:
    /// caches warm, optimizer state allocated); `None` for a trace without `iter:` markers.
    pub fn step_peaks(&self) -> Option<(IterationPeak, Option<IterationPeak>)> {
        let (first, rest) = self.iterations.split_first()?;
        let steady = rest.iter().copied().reduce(|a, b| IterationPeak {
            iter: a.iter.max(b.iter),
            peak_allocated_bytes: a.peak_allocated_bytes.max(b.peak_allocated_bytes),
            peak_reserved_bytes: a.peak_reserved_bytes.max(b.peak_reserved_bytes),
        });
        Some((*first, steady))
    }
}

#[derive(Clone, Copy)]
struct LiveBlock {
    model_addr: u64,
    category: Option<Category>,
    size: u64,
    /// Its free was requested: allocated bytes already dropped.
    requested: bool,
}

struct DeviceState {
    alloc: Allocator,
    at_peak: Fragmentation,
    peak_reserved_seen: u64,
    live_by_category: [u64; 7],
    /// Live blocks by trace address: the model's address, category and block size. Frees in
    /// the trace name trace addresses; the model may have placed the block elsewhere (synthetic
    /// addresses, or a divergence from the recorded run).
    live_blocks: HashMap<u64, LiveBlock>,
    categories_at_peak: [u64; 7],
    peak_allocated_seen: u64,
}

impl DeviceState {
    fn model_addr(&self, trace_addr: u64) -> u64 {
        self.live_blocks.get(&trace_addr).map_or(trace_addr, |b| b.model_addr)
    }
}

/// Drives one allocator per device from trace records.
pub struct Replayer {
    cfg: AllocatorConfig,
    opts: ReplayOptions,
    alloc_conf: Option<String>,
    use_recorded_addrs: bool,
    device_level_requests: bool,
    devices: BTreeMap<u32, DeviceState>,
    names: HashMap<u32, String>,
    index: u64,
    report_requests: u64,
    skipped_by_caller: BTreeMap<String, u64>,
    skipped_failed: u64,
    rejected: u64,
    rejected_examples: Vec<String>,
    oom_at: Option<u64>,
    oom_detail: Option<String>,
    has_categories: bool,
    /// With [`Replayer::realize`]: the trace as this model would have recorded it.
    realized: Option<Vec<Record>>,
    iterations: Vec<IterationPeak>,
}

/// Whether a caller module is PyTorch's caching allocator (or unknown, which producers that only
/// see the allocator leave unset).
fn is_framework_allocator(module: &str) -> bool {
    let base = module.rsplit('/').next().unwrap_or(module);
    base.starts_with("libc10_cuda") || base.starts_with("libc10_hip") || base.starts_with("libtorch_cuda")
}

impl Replayer {
    /// Prepare a replay of a trace with this header.
    pub fn new(header: &Header, opts: ReplayOptions) -> Result<Replayer, ReplaySetupError> {
        if !header.is_allocator_level() {
            return Err(ReplaySetupError::DeviceLevel);
        }
        let (cfg, alloc_conf) = if let Some(s) = &opts.alloc_conf {
            let cfg = AllocatorConfig::parse(s, opts.version)
                .map_err(|error| ReplaySetupError::Config { source_name: "--alloc-conf".into(), error })?;
            (cfg, Some(s.clone()))
        } else if let Some(s) = header.alloc_conf() {
            let cfg = AllocatorConfig::parse(s, opts.version).map_err(|error| ReplaySetupError::Config {
                source_name: "recorded in the trace header's environment".into(),
                error,
            })?;
            (cfg, Some(s.to_string()))
        } else if let Some(settings) = header.allocator_settings.as_deref() {
            let v: serde_json::Value = serde_json::from_str(settings).unwrap_or(serde_json::Value::Null);
            let cfg = AllocatorConfig::from_snapshot_settings(&v, opts.version).map_err(|error| {
                ReplaySetupError::Config { source_name: "recorded as the snapshot's allocator_settings".into(), error }
            })?;
            let raw = v.get("PYTORCH_CUDA_ALLOC_CONF").and_then(|s| s.as_str()).map(str::to_string);
            (cfg, raw)
        } else {
            (AllocatorConfig::default(), None)
        };
        Ok(Replayer {
            cfg,
            opts,
            alloc_conf,
            use_recorded_addrs: !header.synthetic_addresses,
            device_level_requests: header.caching_disabled && header.level == trace::Level::Device,
            devices: BTreeMap::new(),
            names: HashMap::new(),
            index: 0,
            report_requests: 0,
            skipped_by_caller: BTreeMap::new(),
            skipped_failed: 0,
            rejected: 0,
            rejected_examples: Vec::new(),
            oom_at: None,
            oom_detail: None,
            has_categories: false,
            realized: None,
            iterations: Vec::new(),
        })
    }

    /// Also record the trace as the model realises it: requests at the model's addresses, with
    /// the segment events (`segment_alloc`, `segment_map`, ...) and OOMs it produced, in PyTorch's
    /// order. [`Replayer::take_realized`] returns them with the final segment state, which is what
    /// a memory_viz export of a symbolic trace needs.
    pub fn realize(mut self) -> Self {
        self.realized = Some(Vec::new());
        self
    }

    fn device(&mut self, d: u32) -> &mut DeviceState {
        let (cfg, version, capacity) = (&self.cfg, self.opts.version, self.opts.capacity);
        self.devices.entry(d).or_insert_with(|| DeviceState {
            alloc: Allocator::new(cfg.clone(), version, capacity),
            at_peak: Fragmentation::default(),
            peak_reserved_seen: 0,
            live_by_category: [0; 7],
            live_blocks: HashMap::new(),
            categories_at_peak: [0; 7],
            peak_allocated_seen: 0,
        })
    }

    /// Whether an allocation-like event is one this replay should apply.
    fn wants(&mut self, origin: Origin, mem: MemoryKind, caller: Option<u32>, result: i32) -> bool {
        let is_request = if self.device_level_requests { mem == MemoryKind::Device } else { origin == Origin::Request };
        if !is_request || mem != MemoryKind::Device {
            return false;
        }
        if let Some(id) = caller {
            let name = self.names.get(&id).cloned().unwrap_or_else(|| format!("<name {id}>"));
            if !is_framework_allocator(&name) {
                *self.skipped_by_caller.entry(name).or_default() += 1;
                return false;
            }
        }
        if result != 0 {
            self.skipped_failed += 1;
            return false;
        }
        true
    }

    /// Feed one record.
    pub fn observe(&mut self, rec: &Record) {
        let index = self.index;
        self.index += 1;
        let device = rec.device.unwrap_or(0);
        if let (Some(out), Event::Name(_) | Event::Stack(_)) = (self.realized.as_mut(), &rec.event) {
            out.push(rec.clone());
        }
        let req = match &rec.event {
            Event::Name(n) => {
                self.names.insert(n.id, n.text.clone());
                return;
            }
            Event::Alloc(a) => {
                if !self.wants(a.origin, a.mem, a.caller, a.result) {
                    return;
                }
                let recorded_addr = self.use_recorded_addrs.then_some(a.addr);
                let req = Request::Alloc { size: a.size, stream: a.stream, recorded_addr };
                self.apply(index, device, &req, Some((a.addr, a.category)), Some(rec));
                return;
            }
            Event::Free(f) => {
                if !self.wants(f.origin, f.mem, f.caller, f.result) {
                    return;
                }
                match f.stage {
                    FreeStage::Immediate => Request::Free { addr: f.addr },
                    FreeStage::Requested => Request::FreeRequested { addr: f.addr },
                    FreeStage::Completed => Request::FreeCompleted { addr: f.addr },
                }
            }
            Event::Control(c) => match &c.op {
                ControlOp::EmptyCache => Request::EmptyCache,
                ControlOp::SetMemoryFraction { fraction } => Request::SetMemoryFraction(*fraction),
                ControlOp::ResetPeakStats => Request::ResetPeakStats,
                ControlOp::RecordStream { addr, stream } => Request::RecordStream { addr: *addr, stream: *stream },
            },
            Event::SegmentState(seg) if seg.at == StateAt::Start => {
                self.seed(index, device, seg);
                return;
            }
            Event::Marker(m) => {
                if let trace::marker::MarkerKind::Iter(n) = trace::marker::parse(&m.text) {
                    self.start_iteration(n);
                }
                return;
            }
            Event::Vmm(_)
            | Event::KernelLaunch(_)
            | Event::KernelExec(_)
            | Event::MemInfo(_)
            | Event::Stack(_)
            | Event::Oom(_)
            | Event::PoolTrim(_)
            | Event::SegmentState(_)
            | Event::SnapshotPoint(_)
            | Event::ProcessExit(_)
            | Event::MemActivity(_) => return,
        };
        self.apply(index, device, &req, None, Some(rec));
    }

    fn start_iteration(&mut self, iter: u64) {
        let (mut reserved, mut allocated) = (0, 0);
        for d in self.devices.keys() {
            let (r, a) = self.current(*d);
            reserved = reserved.max(r);
            allocated = allocated.max(a);
        }
        self.iterations.push(IterationPeak { iter, peak_allocated_bytes: allocated, peak_reserved_bytes: reserved });
    }

    /// Seed a segment that existed before the first event (an imported snapshot's rebuilt start).
    fn seed(&mut self, index: u64, device: u32, seg: &SegmentState) {
        let existing = ExistingSegment {
            addr: seg.addr,
            size: seg.total_size,
            stream: seg.stream,
            is_small_pool: seg.pool == SegmentPool::Small,
            expandable: seg.is_expandable,
            blocks: seg
                .blocks
                .iter()
                .map(|b| ExistingBlock {
                    addr: b.addr,
                    size: b.size,
                    requested_size: b.requested_size,
                    allocated: b.state != BlockState::Inactive,
                })
                .collect(),
        };
        let ds = self.device(device);
        if let Err(e) = ds.alloc.add_existing_segment(&existing) {
            self.rejected += 1;
            if self.rejected_examples.len() < 5 {
                self.rejected_examples.push(format!("record {index} (device {device}): start state: {e}"));
            }
            return;
        }
        for b in seg.blocks.iter().filter(|b| b.state != BlockState::Inactive) {
            let live = LiveBlock { model_addr: b.addr, category: None, size: b.size, requested: false };
            ds.live_blocks.insert(b.addr, live);
            ds.live_by_category[cat_index(None)] += b.size;
        }
    }

    fn apply(
        &mut self,
        index: u64,
        device: u32,
        req: &Request,
        alloc: Option<(u64, Option<Category>)>,
        source: Option<&Record>,
    ) {
        self.report_requests += 1;
        let ds = self.device(device);
        // Translate the trace's address into the model's.
        let (req, trace_addr) = match *req {
            Request::Free { addr } => (Request::Free { addr: ds.model_addr(addr) }, Some(addr)),
            Request::FreeRequested { addr } => (Request::FreeRequested { addr: ds.model_addr(addr) }, Some(addr)),
            Request::FreeCompleted { addr } => (Request::FreeCompleted { addr: ds.model_addr(addr) }, Some(addr)),
            Request::RecordStream { addr, stream } => {
                (Request::RecordStream { addr: ds.model_addr(addr), stream }, None)
            }
            ref other => (other.clone(), None),
        };
        let result: Result<Outcome, ReplayError> = ds.alloc.apply(&req);
        if let (Some(out), Ok(o)) = (self.realized.as_mut(), &result) {
            realize(out, source, device, &req, o);
        }
        let outcome = match result {
            Ok(o) => o,
            Err(e) => {
                self.rejected += 1;
                if self.rejected_examples.len() < 5 {
                    self.rejected_examples.push(format!("record {index} (device {device}): {e}"));
                }
                return;
            }
        };
        let ds = self.devices.get_mut(&device).expect("device state exists");
        // Category accounting follows allocated bytes: they drop at free_requested.
        if let Some(addr) = trace_addr {
            let completes = !matches!(req, Request::FreeRequested { .. });
            if let Some(b) = ds.live_blocks.get_mut(&addr) {
                if !b.requested {
                    b.requested = true;
                    ds.live_by_category[cat_index(b.category)] -= b.size;
                }
                if completes {
                    ds.live_blocks.remove(&addr);
                }
            }
        }
        if let Some((trace_addr, category)) = alloc {
            if let Some(oom) = outcome.oom {
                if self.oom_at.is_none() {
                    self.oom_at = Some(index);
                    self.oom_detail = Some(format!(
                        "device {device}: request of {} B (rounded {} B) with {} B reserved and {} B allocated",
                        oom.requested_size, oom.rounded_size, oom.reserved, oom.allocated
                    ));
                }
            } else if outcome.addr.is_some() {
                // The trace's address identifies the block in later frees.
                let model_addr = outcome.addr.unwrap_or(trace_addr);
                ds.live_blocks
                    .insert(trace_addr, LiveBlock { model_addr, category, size: outcome.block_size, requested: false });
                ds.live_by_category[cat_index(category)] += outcome.block_size;
                if category.is_some() {
                    self.has_categories = true;
                }
            }
        }
        let stats = ds.alloc.stats();
        let reserved = stats.reserved_bytes[0].current.max(0) as u64;
        let allocated = stats.allocated_bytes[0].current.max(0) as u64;
        if reserved > ds.peak_reserved_seen {
            ds.peak_reserved_seen = reserved;
            ds.at_peak = Fragmentation {
                reserved_minus_allocated: reserved.saturating_sub(allocated),
                largest_free_block: ds.alloc.largest_free_block(),
                segments: ds.alloc.segments().len() as u64,
            };
        }
        if allocated > ds.peak_allocated_seen {
            ds.peak_allocated_seen = allocated;
            ds.categories_at_peak = ds.live_by_category;
        }
        if let Some(it) = self.iterations.last_mut() {
            it.peak_reserved_bytes = it.peak_reserved_bytes.max(reserved);
            it.peak_allocated_bytes = it.peak_allocated_bytes.max(allocated);
        }
    }

    /// Current (reserved, allocated) bytes of a device; zeros before its first request.
    pub fn current(&self, device: u32) -> (u64, u64) {
        self.devices.get(&device).map_or((0, 0), |d| {
            let s = d.alloc.stats();
            (s.reserved_bytes[0].current.max(0) as u64, s.allocated_bytes[0].current.max(0) as u64)
        })
    }

    /// Live block bytes of a device by category (`Category::ALL` order, then uncategorized).
    pub fn live_by_category(&self, device: u32) -> [u64; 7] {
        self.devices.get(&device).map_or([0; 7], |d| d.live_by_category)
    }

    /// A device's live blocks: (trace address, the model's address, block size, category).
    pub fn live_blocks(&self, device: u32) -> Vec<(u64, u64, u64, Option<Category>)> {
        self.devices.get(&device).map_or_else(Vec::new, |d| {
            d.live_blocks
                .iter()
                .filter(|(_, b)| !b.requested)
                .map(|(&a, b)| (a, b.model_addr, b.size, b.category))
                .collect()
        })
    }

    /// Whether any applied allocation carried a category.
    pub fn has_categories(&self) -> bool {
        self.has_categories
    }

    /// A device's segments as they are now.
    pub fn segments(&self, device: u32) -> Vec<crate::alloc::SegmentView> {
        self.devices.get(&device).map_or_else(Vec::new, |d| d.alloc.segments())
    }

    /// Whether the allocator behaves differently under a capacity it never reaches: garbage
    /// collection and a memory fraction are relative to the capacity.
    pub fn capacity_sensitive(&self) -> bool {
        self.cfg.garbage_collection_threshold > 0.0 || self.cfg.per_process_memory_fraction.is_some()
    }

    /// Change the capacity of every device's allocator (collocation: what other jobs leave free).
    pub fn set_capacity(&mut self, capacity: u64) {
        self.opts.capacity = Some(capacity);
        for d in self.devices.values_mut() {
            d.alloc.set_capacity(Some(capacity));
        }
    }

    /// Index of the next record.
    pub fn position(&self) -> u64 {
        self.index
    }

    /// Whether an allocation has failed so far.
    pub fn oom_at(&self) -> Option<u64> {
        self.oom_at
    }

    /// The realised records (see [`Replayer::realize`]) followed by each device's final segment
    /// state; empty unless realisation was requested.
    pub fn take_realized(&mut self) -> Vec<Record> {
        let mut out = self.realized.take().unwrap_or_default();
        for (&device, ds) in &self.devices {
            for seg in ds.alloc.segments() {
                out.push(Record {
                    ts_ns: None,
                    tid: None,
                    device: Some(device),
                    event: Event::SegmentState(SegmentState {
                        at: StateAt::End,
                        addr: seg.addr,
                        total_size: seg.size,
                        stream: seg.stream,
                        pool: if seg.is_small_pool { SegmentPool::Small } else { SegmentPool::Large },
                        is_expandable: seg.expandable,
                        pool_id: (0, 0),
                        stack: None,
                        blocks: seg
                            .blocks
                            .iter()
                            .map(|b| BlockInfo {
                                addr: b.addr,
                                size: b.size,
                                requested_size: b.requested_size,
                                state: match b.state {
                                    BlockViewState::Allocated => BlockState::ActiveAllocated,
                                    BlockViewState::PendingFree => BlockState::ActivePendingFree,
                                    BlockViewState::Inactive => BlockState::Inactive,
                                },
                                stack: None,
                            })
                            .collect(),
                    }),
                });
            }
        }
        out
    }

    /// Finish and report.
    pub fn finish(self) -> ReplayReport {
        let has_categories = self.has_categories;
        let devices: Vec<DeviceReport> = self
            .devices
            .iter()
            .map(|(&device, ds)| {
                let s = ds.alloc.stats();
                let peak = |a: &crate::alloc::StatArray| a[0].peak.max(0) as u64;
                let mut categories_at_peak = BTreeMap::new();
                if has_categories {
                    for (i, v) in ds.categories_at_peak.iter().enumerate() {
                        let name = Category::ALL.get(i).map(|c| c.as_str()).unwrap_or("uncategorized");
                        categories_at_peak.insert(name.to_string(), *v);
                    }
                }
                DeviceReport {
                    device,
                    peak_reserved_bytes: peak(&s.reserved_bytes),
                    peak_allocated_bytes: peak(&s.allocated_bytes),
                    peak_active_bytes: peak(&s.active_bytes),
                    peak_requested_bytes: peak(&s.requested_bytes),
                    at_peak: ds.at_peak,
                    categories_at_peak,
                    memory_stats: s.to_json(),
                }
            })
            .collect();
        let max = |f: fn(&DeviceReport) -> u64| devices.iter().map(f).max().unwrap_or(0);
        ReplayReport {
            peak_reserved_bytes: max(|d| d.peak_reserved_bytes),
            peak_allocated_bytes: max(|d| d.peak_allocated_bytes),
            peak_active_bytes: max(|d| d.peak_active_bytes),
            peak_requested_bytes: max(|d| d.peak_requested_bytes),
            oom: self.oom_at.is_some(),
            oom_at_event: self.oom_at,
            oom_detail: self.oom_detail,
            requests: self.report_requests,
            events: self.index,
            skipped_by_caller: self.skipped_by_caller,
            skipped_failed_calls: self.skipped_failed,
            rejected: self.rejected,
            rejected_examples: self.rejected_examples,
            memory_stats: devices
                .first()
                .map(|d| d.memory_stats.clone())
                .unwrap_or_else(|| crate::alloc::MemoryStats::default().to_json()),
            devices,
            capacity: self.opts.capacity,
            alloc_conf: self.alloc_conf,
            iterations: self.iterations,
        }
    }
}

/// Append what the model did for one request, in the order PyTorch records it: deferred frees
/// that completed, segment events, then the request itself at the model's address.
fn realize(out: &mut Vec<Record>, source: Option<&Record>, device: u32, req: &Request, o: &Outcome) {
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
        Event::Free(Free {
            addr,
            size,
            stream,
            mem: MemoryKind::Device,
            api,
            result: 0,
            origin,
            stage,
            caller: None,
            stack: None,
        })
    };
    for &addr in &o.completed_frees {
        out.push(meta(free(addr, None, FreeStage::Completed, Origin::Request, Api::Allocator)));
    }
    for ev in &o.device_events {
        let e = match *ev {
            DeviceEvent::SegmentAlloc { addr, size } => Event::Alloc(Alloc {
                addr,
                size,
                stream,
                mem: MemoryKind::Device,
                api: Api::CudaMalloc,
                result: 0,
                origin: Origin::Outcome,
                category: None,
                caller: None,
                stack: None,
            }),
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
    match (req, src) {
        (Request::Alloc { size, stream, .. }, Some(Event::Alloc(a))) => match (o.addr, o.oom) {
            (Some(addr), _) => {
                out.push(meta(Event::Alloc(Alloc { addr, size: *size, stream: *stream, ..a.clone() })));
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
                ..f.clone()
            })));
        }
        (_, Some(e @ Event::Control(_))) => out.push(meta(e.clone())),
        _ => {}
    }
}

/// Index into the per-category arrays; uncategorised allocations share the `other` slot.
fn cat_index(c: Option<Category>) -> usize {
    match c {
        Some(c) => Category::ALL.iter().position(|x| *x == c).unwrap_or(6),
        None => 6,
    }
}
