//! Replay: drives the allocator model from a trace's request events. Sans-IO: the caller reads
//! the trace and feeds records to [`Replayer::observe`].
//!
//! What is replayed:
//! - allocator-level traces (the symbolic tracer, imported snapshots): `request` events only;
//!   `outcome` events (segments) are what a real allocator did and are never replayed;
//! - device-level shim traces taken with `PYTORCH_NO_CUDA_MEMORY_CACHING=1`: each device
//!   `cudaMalloc`/`cudaFree` PyTorch's allocator makes is one allocator request in effect (a
//!   program without PyTorch makes its calls itself: they are left out, below).
//!
//! Requests from other caller modules (NCCL, cuBLAS, extensions calling `cudaMalloc` themselves)
//! bypass the caching allocator on a real run, so they are left out and reported.

use std::collections::BTreeMap;

use trace::{Category, ControlOp, Event, FreeStage, Header, Record};

use crate::alloc::{Allocator, AllocatorConfig, ChosenConfig, ConfigError, RecordedConfig, Request, TorchVersion};
use crate::conversions;

mod device;
mod live;
mod outside;
mod recorded;
mod report;
mod requests;
mod step;
use device::DeviceState;
use live::{LiveBlock, LiveBlocks};
pub use report::{DeviceReport, EventRef, FirstOom, Fragmentation, IterationPeak, Peaks, RecordedOom, ReplayReport};
pub use requests::Requests;
pub use step::{Classifier, Seed, Step, Steps};

/// Why a trace cannot be replayed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplaySetupError {
    /// A device-level trace with the cache on records segments, not requests.
    #[error(
        "this is a device-level trace recorded without PYTORCH_NO_CUDA_MEMORY_CACHING=1: under \
         PyTorch, whose caching allocator is on by default, its cudaMalloc events are segments, not \
         tensor requests, so replaying them would model a cache on top of a cache. For a PyTorch \
         program, record an allocator-level trace instead: rerun under the shim with \
         PYTORCH_NO_CUDA_MEMORY_CACHING=1 (PyTorch's allocator then makes one cudaMalloc per \
         request), or use `python -m memtrace_trainer symtrace`. A program without PyTorch has no \
         caching allocator to model: its cudaMalloc calls are its own device memory, which a replay \
         leaves out (under that variable too, as requests made by its own module); `memsim stats` \
         summarises this trace as it is, with its peak live device bytes"
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
    /// The device's total memory, the base of a program's memory fraction, when known (a
    /// replay at a budget for a fit at a capacity); else the capacity; without either, a
    /// fraction limits nothing (its need is still reported).
    pub device_total: Option<u64>,
}

/// Drives one allocator per device from trace records.
pub struct Replayer {
    /// The configuration followed, with what the report says of it.
    chosen: ChosenConfig,
    opts: ReplayOptions,
    use_recorded_addrs: bool,
    device_level_requests: bool,
    /// Sorted by device id; a linear search, as a trace names one device or a few.
    devices: Vec<(u32, DeviceState)>,
    /// Live blocks by the classifier's numbers for their trace addresses.
    live: LiveBlocks,
    /// Sorts the records fed whole to [`Replayer::observe`].
    own: Classifier,
    index: u64,
    report_requests: u64,
    skipped_by_caller: BTreeMap<String, u64>,
    skipped_failed: u64,
    rejected: u64,
    rejected_examples: Vec<String>,
    oom_at: Option<u64>,
    oom_detail: Option<String>,
    /// The first failure's floors: reserved then plus its size, and allocated then plus its size.
    oom_need: Option<(u64, u64)>,
    /// The device and budget the start state passed (its failure's detail follows the whole state).
    start_over: Option<(u32, u64)>,
    recorded_oom: Option<RecordedOom>,
    recorded_releases: u64,
    recorded_releases_kept: u64,
    peak_resets: u64,
    /// Allocations at a trace address still live, and the first of them.
    over_live: (u64, Option<String>),
    outside: outside::OutsideHeld,
    has_categories: bool,
    /// With [`Replayer::realize`]: the trace as this model would have recorded it.
    realized: Option<Vec<Record>>,
    iterations: Vec<IterationPeak>,
}

impl Replayer {
    /// Prepare a replay of a trace with this header.
    pub fn new(header: &Header, opts: ReplayOptions) -> Result<Replayer, ReplaySetupError> {
        if !header.is_allocator_level() {
            return Err(ReplaySetupError::DeviceLevel);
        }
        // Unparseable settings are an error naming them, not "no settings".
        let settings = match header.allocator_settings.as_deref() {
            Some(s) => Some(serde_json::from_str::<serde_json::Value>(s).map_err(|e| ReplaySetupError::Config {
                source_name: "recorded as the trace header's allocator_settings".into(),
                error: ConfigError::Settings {
                    field: format!("allocator_settings (not valid JSON: {e})"),
                    expected: "a JSON dict",
                },
            })?),
            None => None,
        };
        let recorded = RecordedConfig { env: header.alloc_conf(), settings: settings.as_ref() };
        let chosen = crate::alloc::choose(opts.alloc_conf.as_deref(), recorded, opts.version)
            .map_err(|e| ReplaySetupError::Config { source_name: e.source_name.into(), error: e.error })?;
        let device_level_requests = requests::device_level_requests(header);
        Ok(Replayer {
            chosen,
            opts,
            use_recorded_addrs: !header.synthetic_addresses,
            device_level_requests,
            devices: Vec::new(),
            live: LiveBlocks::default(),
            own: Classifier::new(device_level_requests),
            index: 0,
            report_requests: 0,
            skipped_by_caller: BTreeMap::new(),
            skipped_failed: 0,
            rejected: 0,
            rejected_examples: Vec::new(),
            oom_at: None,
            oom_detail: None,
            oom_need: None,
            start_over: None,
            recorded_oom: None,
            recorded_releases: 0,
            recorded_releases_kept: 0,
            peak_resets: 0,
            over_live: (0, None),
            outside: outside::OutsideHeld::default(),
            has_categories: false,
            realized: None,
            iterations: Vec::new(),
        })
    }

    /// Also record the trace as the model realises it: requests at the model's addresses, with
    /// the segment events (`segment_alloc`, `segment_map`, ...) and OOMs it produced or the trace
    /// recorded, in PyTorch's order. [`Replayer::take_realized`] returns them with the final
    /// segment state, which is what a memory_viz export of a symbolic trace needs.
    pub fn realize(mut self) -> Self {
        self.realized = Some(Vec::new());
        self
    }

    /// A device's state, made on first use; borrows only the device list, so the caller can
    /// still use the replay's other fields.
    #[inline(always)]
    fn device_in<'a>(
        devices: &'a mut Vec<(u32, DeviceState)>,
        cfg: &AllocatorConfig,
        opts: &ReplayOptions,
        outside: &outside::OutsideHeld,
        d: u32,
    ) -> &'a mut DeviceState {
        per_device(devices, d, || {
            let mut alloc = Allocator::new(cfg.clone(), opts.version, opts.capacity);
            match (opts.device_total, opts.capacity) {
                (Some(t), _) => alloc.set_total_memory(t),
                // No device: a fraction of it limits nothing; its need is still recorded.
                (None, None) => alloc.leave_fraction_unenforced(),
                (None, Some(_)) => {}
            }
            outside.limit(d, &mut alloc, opts.capacity);
            DeviceState::new(alloc)
        })
    }

    fn device_state(&self, d: u32) -> Option<&DeviceState> {
        self.devices.iter().find(|(id, _)| *id == d).map(|(_, ds)| ds)
    }

    /// Feed one record. A replay is fed either this way or by [`Replayer::observe_step`] with
    /// one classifier from the first record on, not both.
    pub fn observe(&mut self, rec: &Record) {
        // A recorded OOM as recorded: without it a realised trace reads back as a run that fitted.
        if let (Some(out), Event::Name(_) | Event::Stack(_) | Event::Oom(_)) = (self.realized.as_mut(), &rec.event) {
            out.push(rec.clone());
        }
        let step = self.own.classify(rec.clone());
        self.apply_step(&step, Some(rec));
    }

    /// The classifier for [`Replayer::observe_step`], before the first record; `None` when
    /// this replay realises the trace ([`Replayer::realize`]), which needs every record whole.
    pub fn classifier(&self) -> Option<Classifier> {
        debug_assert_eq!(self.index, 0, "a classifier must see the trace from its first record");
        self.realized.is_none().then(|| Classifier::new(self.device_level_requests))
    }

    /// Feed one record as its [`Step`], made by one classifier of this replay's (or of a replay
    /// of the same trace) that has seen every record before it.
    #[inline]
    pub fn observe_step(&mut self, step: &Step) {
        match step {
            Step::Record(rec) => self.observe(rec),
            s => self.apply_step(s, None),
        }
    }

    // Inlined into `observe_step`, so that the hot arms' requests are built and applied with
    // their kind known.
    #[inline(always)]
    fn apply_step(&mut self, step: &Step, source: Option<&Record>) {
        let index = self.index;
        self.index += 1;
        match *step {
            Step::Alloc { device, id, category, addr, size, stream } => {
                let req = self.alloc_request(addr, size, stream);
                self.apply(index, device, &req, Target { id: Some(id), addr, category }, source);
            }
            Step::Free { device, addr, id: None, .. } if self.outside.release_unknown(device, addr) => {}
            Step::Free { id: Some(id), stage, .. } if self.live.frees_failed(id, stage != FreeStage::Requested) => {}
            Step::Free { device, stage, addr, id } => {
                self.apply(index, device, &free_request(stage, addr), Target { id, addr, category: None }, source);
            }
            Step::Control { device, ref op, id } => {
                let (req, addr) = match *op {
                    ControlOp::EmptyCache => (Request::EmptyCache, 0),
                    ControlOp::SetMemoryFraction { fraction } => (Request::SetMemoryFraction(fraction), 0),
                    // The need is the whole run's peak, whatever the program measured.
                    ControlOp::ResetPeakStats => return self.peak_resets += 1,
                    ControlOp::RecordStream { addr, stream } => (Request::RecordStream { addr, stream }, addr),
                };
                self.apply(index, device, &req, Target { id, addr, category: None }, source);
            }
            Step::Seed(ref seed) => self.seed(index, seed),
            Step::Iteration(n) => self.start_iteration(n),
            Step::Outside { device, addr, size, free, physical, ref caller } => {
                self.outside_step(device, addr, size, free, physical, caller.as_deref())
            }
            Step::FailedCall => self.skipped_failed += 1,
            Step::RecordedOom { device, size, device_free } => self.recorded_oom(index, device, size, device_free),
            Step::RecordedRelease { device } => self.recorded_release(index, device),
            Step::Skip => {}
            // `observe_step` takes whole records before this, and a classifier makes none.
            Step::Record(_) => debug_assert!(false, "a whole record reached apply_step"),
        }
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
        self.iterations.push(IterationPeak {
            iter,
            peak_allocated_bytes: allocated,
            peak_reserved_bytes: reserved,
            start_allocated_bytes: allocated,
        });
    }

    #[cold]
    fn reject(&mut self, example: impl FnOnce() -> String) {
        self.rejected += 1;
        if self.rejected_examples.len() < 5 {
            self.rejected_examples.push(example());
        }
    }

    // Inlined into `observe_step`'s allocation and free arms, where the request's kind is known,
    // so that neither this function's `match` nor the allocator's is taken at run time.
    #[inline(always)]
    fn apply(&mut self, index: u64, device: u32, req: &Request, t: Target, source: Option<&Record>) {
        self.report_requests += 1;
        let ds = Self::device_in(&mut self.devices, &self.chosen.cfg, &self.opts, &self.outside, device);
        let live = &mut self.live;
        // Translate the trace's address into the model's. A free that completes takes its block
        // out at once, and puts it back if the model refuses the request.
        let mut taken: Option<LiveBlock> = None;
        let model = |b: Option<&LiveBlock>, addr: u64| b.map_or(addr, |b| b.model_addr);
        let req = match *req {
            Request::Free { addr } => {
                taken = live.take(device, t.id, addr);
                Request::Free { addr: model(taken.as_ref(), addr) }
            }
            Request::FreeCompleted { addr } => {
                taken = live.take(device, t.id, addr);
                Request::FreeCompleted { addr: model(taken.as_ref(), addr) }
            }
            Request::FreeRequested { addr } => {
                Request::FreeRequested { addr: model(live.get(device, t.id, addr), addr) }
            }
            Request::RecordStream { addr, stream } => {
                Request::RecordStream { addr: model(live.get(device, t.id, addr), addr), stream }
            }
            ref other => other.clone(),
        };
        let outcome = &mut ds.outcome;
        let placing = match (&req, t.id) {
            (Request::Alloc { .. }, Some(id)) => Some(id),
            _ => None,
        };
        if let Err(e) = ds.alloc.apply_into(&req, outcome) {
            if let Some(b) = taken {
                live.put_back(b);
            }
            if let Some(id) = placing {
                live.refused(device, id, t.addr);
            }
            // A rejected request is left out, so it is not counted among those replayed.
            self.report_requests -= 1;
            self.reject(|| format!("record {index} (device {device}): {e}"));
            return;
        }
        // Category accounting follows allocated bytes: they drop at free_requested.
        if let Some(b) = &taken {
            if !b.requested {
                ds.live_by_category[cat_index(b.category)] -= b.size;
            }
        }
        if let Request::FreeRequested { .. } = req {
            if let Some(b) = live.get_mut(device, t.id, t.addr) {
                if !b.requested {
                    b.requested = true;
                    ds.live_by_category[cat_index(b.category)] -= b.size;
                }
            }
        }
        let mut new_category = false;
        let mut over_live = false;
        let mut failed = None;
        let mut need = None;
        if let Some(id) = placing {
            if let Some(oom) = &outcome.oom {
                let held_then = |b: u64| b.saturating_add(oom.rounded_size);
                need = Some((held_then(oom.reserved), held_then(oom.allocated)));
                failed = Some(format!(
                    "device {device}: request of {} B (rounded {} B) with {} B reserved and {} B allocated",
                    oom.requested_size, oom.rounded_size, oom.reserved, oom.allocated
                ));
                live.refused(device, id, t.addr);
                live.failed(id);
            } else if let Some(model_addr) = outcome.addr {
                let category = t.category;
                let b = LiveBlock {
                    model_addr,
                    size: outcome.block_size,
                    trace_addr: t.addr,
                    device,
                    category,
                    requested: false,
                };
                over_live = live.placed(id, b);
                ds.live_by_category[cat_index(category)] += outcome.block_size;
                new_category = category.is_some();
            } else {
                // A zero-byte request: nothing placed.
                live.refused(device, id, t.addr);
            }
        }
        let (reserved, allocated) = ds.note_peaks();
        // A fraction limits a request only where the allocator reserves, or where it fails.
        ds.note_fraction_need(need.map_or(ds.outcome.fraction_checked, |n| n.0));
        self.outside.note_reserved(device, reserved);
        if let Some(out) = self.realized.as_mut() {
            conversions::realize(out, source, device, &req, &ds.outcome);
        }
        self.has_categories |= new_category;
        if over_live {
            self.over_live(index, device, t.addr);
        }
        if failed.is_some() && self.oom_at.is_none() {
            self.oom_at = Some(index);
            self.oom_detail = failed;
            self.oom_need = need;
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
        self.live
            .of_device(device)
            .filter(|b| !b.requested)
            .map(|b| (b.trace_addr, b.model_addr, b.size, b.category))
            .collect()
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
        self.chosen.cfg.garbage_collection_threshold > 0.0 || self.chosen.cfg.per_process_memory_fraction.is_some()
    }

    /// Index of the next record.
    pub fn position(&self) -> u64 {
        self.index
    }

    /// Whether an allocation has failed so far.
    pub fn oom_at(&self) -> Option<u64> {
        self.oom_at
    }

    /// The first failure's floor: the bytes reserved then plus the request that failed.
    pub fn oom_need_bytes(&self) -> Option<u64> {
        self.oom_need.map(|n| n.0)
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
        let (has_categories, fraction_need_bytes) = (self.has_categories, self.fraction_need_bytes());
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
                    peaks: Peaks {
                        peak_reserved_bytes: peak(&s.reserved_bytes),
                        peak_allocated_bytes: peak(&s.allocated_bytes),
                        peak_active_bytes: peak(&s.active_bytes),
                        peak_requested_bytes: peak(&s.requested_bytes),
                    },
                    at_peak: ds.at_peak,
                    categories_at_peak,
                    memory_stats: s.to_json(),
                }
            })
            .collect();
        let peaks = Peaks::max(devices.iter().map(|d| &d.peaks));
        ReplayReport {
            peaks,
            first_oom: FirstOom {
                oom: self.oom_at.is_some(),
                oom_at_event: self.oom_at,
                oom_detail: self.oom_detail,
                oom_need_bytes: self.oom_need.map(|n| n.0),
                oom_allocated_need_bytes: self.oom_need.map(|n| n.1),
            },
            recorded_oom: self.recorded_oom,
            recorded_releases: self.recorded_releases,
            recorded_releases_kept: self.recorded_releases_kept,
            peak_resets: self.peak_resets,
            recorded_outside_bytes: self.outside.peak(),
            outside_beside_peak_bytes: self.outside.beside_peak(peaks.peak_reserved_bytes),
            fraction_need_bytes,
            allocations_over_live: self.over_live.0,
            first_allocation_over_live: self.over_live.1,
            requests: self.report_requests,
            events: self.index,
            skipped_by_caller: self.skipped_by_caller,
            skipped_failed_calls: self.skipped_failed,
            rejected: self.rejected,
            rejected_examples: self.rejected_examples,
            failed_frees: self.live.failed_frees,
            // The device the reserved peak is of (the first of equals): the one the verdict
            // judges, so the stats beside the peaks are that device's.
            memory_stats: devices
                .iter()
                .rev()
                .max_by_key(|d| d.peaks.peak_reserved_bytes)
                .map(|d| d.memory_stats.clone())
                .unwrap_or_else(|| crate::alloc::MemoryStats::default().to_json()),
            devices,
            capacity: self.opts.capacity,
            config_warning: self.chosen.cfg.unmodelled(),
            alloc_conf: self.chosen.shown,
            alloc_conf_note: self.chosen.note,
            alloc_conf_source: self.chosen.source,
            config_warnings: self.chosen.warnings,
            iterations: self.iterations,
        }
    }
}

/// A device's entry in a list sorted by device, made by `make` on first use. A linear search,
/// as a trace names one device or a few; the insertion is kept off the inlined path.
#[inline(always)]
fn per_device<V>(list: &mut Vec<(u32, V)>, device: u32, make: impl FnOnce() -> V) -> &mut V {
    let at = match list.iter().position(|(d, _)| *d == device) {
        Some(at) => at,
        None => add_device(list, device, make),
    };
    &mut list[at].1
}

#[cold]
#[inline(never)]
fn add_device<V>(list: &mut Vec<(u32, V)>, device: u32, make: impl FnOnce() -> V) -> usize {
    let at = list.partition_point(|(d, _)| *d < device);
    list.insert(at, (device, make()));
    at
}

/// What a request is about, as the trace names it.
struct Target {
    /// The classifier's number for the trace address (always there for an allocation).
    id: Option<u32>,
    /// The trace address.
    addr: u64,
    /// An allocation's category.
    category: Option<Category>,
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
