//! What a trace records beyond requests that the replay takes in: a snapshot's rebuilt start
//! state, a real run's releases of cached memory and out-of-memory errors, and the device memory
//! it held outside the allocator.

use super::live::LiveBlock;
use super::{cat_index, RecordedOom, Replayer, Seed};
use crate::alloc::{ExistingSegment, Request};

impl Replayer {
    /// Seed a segment that existed before the first event (an imported snapshot's rebuilt start).
    pub(super) fn seed(&mut self, index: u64, seed: &Seed) {
        let device = seed.device;
        let existing = ExistingSegment::from(&seed.segment);
        let ds = Self::device_in(&mut self.devices, &self.chosen.cfg, &self.opts, &self.outside, device);
        if let Err(e) = ds.alloc.add_existing_segment(&existing) {
            for (b, id) in seed.active_blocks() {
                self.live.refused(device, id, b.addr);
            }
            self.reject(|| format!("record {index} (device {device}): start state: {e}"));
            return;
        }
        for (b, id) in seed.active_blocks() {
            let live = LiveBlock {
                model_addr: b.addr,
                size: b.size,
                trace_addr: b.addr,
                device,
                category: None,
                requested: false,
            };
            // A start state lists each block once: nothing to replace.
            let _ = self.live.placed(id, live);
            ds.live_by_category[cat_index(None)] += b.size;
        }
        // A trace that is only its start state (a snapshot with no events) peaks here.
        let (reserved, _) = ds.note_peaks();
        // Segments reserved before the trace began, under the fraction its settings set.
        ds.note_fraction_need(reserved);
        let budget = self.opts.capacity.map(|c| c.saturating_sub(self.outside.now(device)));
        match self.start_over {
            // Start segments after the one that passed the budget: the failure names the whole state.
            Some((d, b)) if d == device => self.start_over_budget(device, reserved, b),
            None if self.oom_at.is_none() => {
                if let Some(b) = budget.filter(|b| reserved > *b) {
                    self.oom_at = Some(index);
                    self.start_over = Some((device, b));
                    self.start_over_budget(device, reserved, b);
                }
            }
            _ => {}
        }
    }

    /// The start state alone reserves more than the budget: no allocation failed, but the job
    /// could not have begun there. The first failure, at the record that passed it; its detail
    /// and need are the whole start state's (renewed at each start segment of that device, all of
    /// which precede the first event).
    #[cold]
    fn start_over_budget(&mut self, device: u32, reserved: u64, budget: u64) {
        self.oom_detail = Some(format!(
            "device {device}: the start state alone (the segments the trace held when recording began) reserves \
             {reserved} B, over the budget of {budget} B"
        ));
        // Of what it reserves, only its allocated blocks are held whatever the packing.
        self.oom_need = Some((reserved, self.current(device).1));
    }

    /// The run's allocator released cached memory here: replayed as `empty_cache`, as `memsim
    /// validate` replays such a burst, so that the replay holds no cache the run no longer held
    /// (its unlimited peak would otherwise pass the run's own by the released segments).
    ///
    /// With `max_split_size_mb` or `garbage_collection_threshold` the allocator also releases
    /// some segments and keeps others, which an `empty_cache` would not: those releases are kept
    /// out (counted), and the replay holds the cache, erring above the run, never below it.
    #[cold]
    pub(super) fn recorded_release(&mut self, index: u64, device: u32) {
        if self.chosen.cfg.max_split_size != u64::MAX || self.chosen.cfg.garbage_collection_threshold > 0.0 {
            self.recorded_releases_kept += 1;
            return;
        }
        self.recorded_releases += 1;
        let ds = Self::device_in(&mut self.devices, &self.chosen.cfg, &self.opts, &self.outside, device);
        if let Err(e) = ds.alloc.apply_into(&Request::EmptyCache, &mut ds.outcome) {
            self.reject(|| format!("record {index} (device {device}): recorded release: {e}"));
        }
    }

    /// The run's first recorded out-of-memory error: what was allocated then plus the failed
    /// request is a floor under the need (the cached blocks the allocator freed before it gave
    /// up are not; the replay's reserved bytes there may hold them).
    #[cold]
    pub(super) fn recorded_oom(&mut self, index: u64, device: u32, size: u64, device_free: Option<u64>) {
        if self.recorded_oom.is_none() {
            let (_, allocated) = self.current(device);
            let need_bytes = allocated.saturating_add(size);
            self.recorded_oom = Some(RecordedOom { at_event: index, device, size, device_free, need_bytes });
        }
    }

    /// Device memory held or released outside the caching allocator ([`super::Step::Outside`]);
    /// another module's requests are also counted by its name.
    #[cold]
    pub(super) fn outside_step(
        &mut self,
        device: u32,
        addr: u64,
        size: u64,
        free: bool,
        physical: bool,
        caller: Option<&str>,
    ) {
        if let Some(name) = caller {
            *self.skipped_by_caller.entry(name.to_string()).or_default() += 1;
        }
        if free {
            self.outside.free(device, physical, addr);
        } else if size > 0 {
            let (reserved, _) = self.current(device);
            self.outside.alloc(device, physical, addr, size, reserved);
        }
        // What is held beside the allocator is not the allocator's to use: at a capacity, its
        // segments get what the held memory leaves, as a real `cudaMalloc` would.
        if let Some((_, ds)) = self.devices.iter_mut().find(|(d, _)| *d == device) {
            self.outside.limit(device, &mut ds.alloc, self.opts.capacity);
        }
    }

    /// Change the capacity of every device (collocation: what other jobs leave free); each
    /// allocator gets what the trace's own memory outside it leaves of that.
    pub fn set_capacity(&mut self, capacity: u64) {
        self.opts.capacity = Some(capacity);
        for (dev, d) in &mut self.devices {
            self.outside.limit(*dev, &mut d.alloc, Some(capacity));
        }
    }

    /// Device memory held outside the allocator on `device` now.
    pub fn outside_now(&self, device: u32) -> u64 {
        self.outside.now(device)
    }

    /// An allocation at a trace address whose block the trace never freed: a free it missed, or
    /// a damaged trace. The earlier block stays allocated in the model (nothing can free it), so
    /// the replay errs high; counted and said.
    #[cold]
    pub(super) fn over_live(&mut self, index: u64, device: u32, addr: u64) {
        self.over_live.0 += 1;
        if self.over_live.1.is_none() {
            self.over_live.1 = Some(format!("record {index} (device {device}, address {addr:#x})"));
        }
    }
}
