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
use trace::{
    BlockState, Category, ControlOp, Event, FreeStage, Header, MemoryKind, Origin, Record, SegmentState, StateAt,
};

use crate::alloc::{Allocator, AllocatorConfig, ConfigError, ExistingSegment, Outcome, Request, TorchVersion};
use crate::conversions;

mod report;
mod step;
pub use report::{DeviceReport, EventRef, Fragmentation, IterationPeak, ReplayReport};
pub use step::{Classifier, Step};

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
    /// The latest request's outcome, reused so that a request allocates nothing.
    outcome: Outcome,
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
    /// Sorted by device id; a linear search, as a trace names one device or a few.
    devices: Vec<(u32, DeviceState)>,
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
            devices: Vec::new(),
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
        Self::device_in(&mut self.devices, &self.cfg, &self.opts, d)
    }

    /// A device's state, made on first use; borrows only the device list, so the caller can
    /// still use the replay's other fields.
    #[inline(always)]
    fn device_in<'a>(
        devices: &'a mut Vec<(u32, DeviceState)>,
        cfg: &AllocatorConfig,
        opts: &ReplayOptions,
        d: u32,
    ) -> &'a mut DeviceState {
        let at = match devices.iter().position(|(id, _)| *id == d) {
            Some(at) => at,
            None => Self::add_device(devices, cfg, opts, d),
        };
        &mut devices[at].1
    }

    #[cold]
    fn add_device(devices: &mut Vec<(u32, DeviceState)>, cfg: &AllocatorConfig, opts: &ReplayOptions, d: u32) -> usize {
        let state = DeviceState {
            alloc: Allocator::new(cfg.clone(), opts.version, opts.capacity),
            at_peak: Fragmentation::default(),
            peak_reserved_seen: 0,
            live_by_category: [0; 7],
            live_blocks: HashMap::new(),
            categories_at_peak: [0; 7],
            peak_allocated_seen: 0,
            outcome: Outcome::default(),
        };
        let at = devices.partition_point(|(id, _)| *id < d);
        devices.insert(at, (d, state));
        at
    }

    fn device_state(&self, d: u32) -> Option<&DeviceState> {
        self.devices.iter().find(|(id, _)| *id == d).map(|(_, ds)| ds)
    }

    /// Whether an allocation-like event is one this replay should apply.
    #[inline(always)]
    fn wants(&mut self, origin: Origin, mem: MemoryKind, caller: Option<u32>, result: i32) -> bool {
        // The common case without a call.
        step::plain_request(self.device_level_requests, origin, mem, caller, result)
            || self.wants_rare(origin, mem, caller, result)
    }

    fn wants_rare(&mut self, origin: Origin, mem: MemoryKind, caller: Option<u32>, result: i32) -> bool {
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
                let req = self.alloc_request(a.addr, a.size, a.stream);
                self.apply(index, device, &req, Some((a.addr, a.category)), Some(rec));
                return;
            }
            Event::Free(f) => {
                if !self.wants(f.origin, f.mem, f.caller, f.result) {
                    return;
                }
                free_request(f.stage, f.addr)
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
            // The rest a replay only counts (`step::counted_only` says which, exhaustively).
            _ => {
                debug_assert!(step::counted_only(&rec.event));
                return;
            }
        };
        self.apply(index, device, &req, None, Some(rec));
    }

    /// The request for an allocation at a trace address: placed there when the addresses are
    /// real, wherever the model puts it when they are synthetic.
    #[inline(always)]
    fn alloc_request(&self, addr: u64, size: u64, stream: i64) -> Request {
        Request::Alloc { size, stream, recorded_addr: self.use_recorded_addrs.then_some(addr) }
    }

    fn start_iteration(&mut self, iter: u64) {
        let (mut reserved, mut allocated) = (0, 0);
        for (d, _) in &self.devices {
            let (r, a) = self.current(*d);
            reserved = reserved.max(r);
            allocated = allocated.max(a);
        }
        self.iterations.push(IterationPeak { iter, peak_allocated_bytes: allocated, peak_reserved_bytes: reserved });
    }

    /// Seed a segment that existed before the first event (an imported snapshot's rebuilt start).
    fn seed(&mut self, index: u64, device: u32, seg: &SegmentState) {
        let existing = ExistingSegment::from(seg);
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

    // Inlined into `observe_step`'s allocation and free arms, where the request's kind is known,
    // so that neither this function's `match` nor the allocator's is taken at run time.
    #[inline(always)]
    fn apply(
        &mut self,
        index: u64,
        device: u32,
        req: &Request,
        alloc: Option<(u64, Option<Category>)>,
        source: Option<&Record>,
    ) {
        self.report_requests += 1;
        let ds = Self::device_in(&mut self.devices, &self.cfg, &self.opts, device);
        // Translate the trace's address into the model's. A free that completes takes its block
        // out of `live_blocks` at once (one map operation), and puts it back if the model
        // refuses the request.
        let mut taken: Option<(u64, LiveBlock)> = None;
        let mut requested_at = None;
        let req = match *req {
            Request::Free { addr } | Request::FreeCompleted { addr } => {
                let b = ds.live_blocks.remove(&addr);
                let model = b.map_or(addr, |b| b.model_addr);
                if let Some(b) = b {
                    taken = Some((addr, b));
                }
                match *req {
                    Request::Free { .. } => Request::Free { addr: model },
                    _ => Request::FreeCompleted { addr: model },
                }
            }
            Request::FreeRequested { addr } => {
                requested_at = ds.live_blocks.get_mut(&addr);
                Request::FreeRequested { addr: requested_at.as_ref().map_or(addr, |b| b.model_addr) }
            }
            Request::RecordStream { addr, stream } => Request::RecordStream { addr: ds.model_addr(addr), stream },
            ref other => other.clone(),
        };
        let outcome = &mut ds.outcome;
        if let Err(e) = ds.alloc.apply_into(&req, outcome) {
            if let Some((addr, b)) = taken {
                ds.live_blocks.insert(addr, b);
            }
            self.rejected += 1;
            if self.rejected_examples.len() < 5 {
                self.rejected_examples.push(format!("record {index} (device {device}): {e}"));
            }
            return;
        }
        // Category accounting follows allocated bytes: they drop at free_requested.
        if let Some((_, b)) = &taken {
            if !b.requested {
                ds.live_by_category[cat_index(b.category)] -= b.size;
            }
        }
        if let Some(b) = requested_at {
            if !b.requested {
                b.requested = true;
                ds.live_by_category[cat_index(b.category)] -= b.size;
            }
        }
        let mut new_category = false;
        let mut failed = None;
        if let Some((trace_addr, category)) = alloc {
            if let Some(oom) = &outcome.oom {
                failed = Some(format!(
                    "device {device}: request of {} B (rounded {} B) with {} B reserved and {} B allocated",
                    oom.requested_size, oom.rounded_size, oom.reserved, oom.allocated
                ));
            } else if let Some(model_addr) = outcome.addr {
                // The trace's address identifies the block in later frees.
                ds.live_blocks
                    .insert(trace_addr, LiveBlock { model_addr, category, size: outcome.block_size, requested: false });
                ds.live_by_category[cat_index(category)] += outcome.block_size;
                new_category = category.is_some();
            }
        }
        let stats = ds.alloc.stats();
        let reserved = stats.reserved_bytes[0].current.max(0) as u64;
        let allocated = stats.allocated_bytes[0].current.max(0) as u64;
        if reserved > ds.peak_reserved_seen {
            // Constant time: a new peak is set at every segment growth of a rising run.
            ds.peak_reserved_seen = reserved;
            ds.at_peak = Fragmentation {
                reserved_minus_allocated: reserved.saturating_sub(allocated),
                largest_free_block: ds.alloc.largest_free_block(),
                segments: ds.alloc.mapped_ranges(),
            };
        }
        if allocated > ds.peak_allocated_seen {
            ds.peak_allocated_seen = allocated;
            ds.categories_at_peak = ds.live_by_category;
        }
        if let Some(out) = self.realized.as_mut() {
            conversions::realize(out, source, device, &req, outcome);
        }
        self.has_categories |= new_category;
        if failed.is_some() && self.oom_at.is_none() {
            self.oom_at = Some(index);
            self.oom_detail = failed;
        }
        if let Some(it) = self.iterations.last_mut() {
            it.peak_reserved_bytes = it.peak_reserved_bytes.max(reserved);
            it.peak_allocated_bytes = it.peak_allocated_bytes.max(allocated);
        }
    }

    /// Current (reserved, allocated) bytes of a device; zeros before its first request.
    pub fn current(&self, device: u32) -> (u64, u64) {
        self.device_state(device).map_or((0, 0), |d| {
            let s = d.alloc.stats();
            (s.reserved_bytes[0].current.max(0) as u64, s.allocated_bytes[0].current.max(0) as u64)
        })
    }

    /// Live block bytes of a device by category (`Category::ALL` order, then uncategorized).
    pub fn live_by_category(&self, device: u32) -> [u64; 7] {
        self.device_state(device).map_or([0; 7], |d| d.live_by_category)
    }

    /// A device's live blocks: (trace address, the model's address, block size, category).
    pub fn live_blocks(&self, device: u32) -> Vec<(u64, u64, u64, Option<Category>)> {
        self.device_state(device).map_or_else(Vec::new, |d| {
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
        self.device_state(device).map_or_else(Vec::new, |d| d.alloc.segments())
    }

    /// Whether the allocator behaves differently under a capacity it never reaches: garbage
    /// collection and a memory fraction are relative to the capacity.
    pub fn capacity_sensitive(&self) -> bool {
        self.cfg.garbage_collection_threshold > 0.0 || self.cfg.per_process_memory_fraction.is_some()
    }

    /// Change the capacity of every device's allocator (collocation: what other jobs leave free).
    pub fn set_capacity(&mut self, capacity: u64) {
        self.opts.capacity = Some(capacity);
        for (_, d) in &mut self.devices {
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
        for (device, ds) in &self.devices {
            let device = *device;
            out.extend(ds.alloc.segments().iter().map(|seg| conversions::segment_record(device, seg)));
        }
        out
    }

    /// Finish and report.
    pub fn finish(self) -> ReplayReport {
        let has_categories = self.has_categories;
        let devices: Vec<DeviceReport> = self
            .devices
            .iter()
            .map(|(device, ds)| {
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
                    device: *device,
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

/// The request for a free of this stage at a trace address.
#[inline(always)]
fn free_request(stage: FreeStage, addr: u64) -> Request {
    match stage {
        FreeStage::Immediate => Request::Free { addr },
        FreeStage::Requested => Request::FreeRequested { addr },
        FreeStage::Completed => Request::FreeCompleted { addr },
    }
}

/// Index into the per-category arrays; uncategorised allocations share the `other` slot.
fn cat_index(c: Option<Category>) -> usize {
    match c {
        Some(c) => Category::ALL.iter().position(|x| *x == c).unwrap_or(6),
        None => 6,
    }
}
