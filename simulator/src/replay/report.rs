//! What a replay reports: peaks per device and overall, fragmentation at the peak, per-iteration
//! peaks, and what was left out.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::units::bytes_text;

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

/// The four peak statistics of a replay: a device's (`<stat>.all.peak`), or the max over devices
/// of each ([`Peaks::max`]). A saturated one (a damaged trace's sizes summed past 2^64) is `null`
/// in JSON, beside the output's `need_unbounded`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Peaks {
    /// `reserved_bytes.all.peak`.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub peak_reserved_bytes: u64,
    /// `allocated_bytes.all.peak`.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub peak_allocated_bytes: u64,
    /// `active_bytes.all.peak`.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub peak_active_bytes: u64,
    /// `requested_bytes.all.peak`.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub peak_requested_bytes: u64,
}

impl Peaks {
    /// Each peak's max over `all` (zeros for none): no one device need hold all four.
    pub fn max<'a>(all: impl IntoIterator<Item = &'a Peaks>) -> Peaks {
        all.into_iter().fold(Peaks::default(), |a, b| Peaks {
            peak_reserved_bytes: a.peak_reserved_bytes.max(b.peak_reserved_bytes),
            peak_allocated_bytes: a.peak_allocated_bytes.max(b.peak_allocated_bytes),
            peak_active_bytes: a.peak_active_bytes.max(b.peak_active_bytes),
            peak_requested_bytes: a.peak_requested_bytes.max(b.peak_requested_bytes),
        })
    }
}

/// Per-device result.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceReport {
    /// Device ordinal.
    pub device: u32,
    /// The device's peaks.
    #[serde(flatten)]
    pub peaks: Peaks,
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
    /// Max over devices of the allocated bytes held when the iteration starts: what the job
    /// keeps from step to step.
    pub start_allocated_bytes: u64,
}

/// An out-of-memory error a run recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RecordedOom {
    /// Index of the record.
    pub at_event: u64,
    /// CUDA device ordinal.
    pub device: u32,
    /// Bytes the failed request asked for (`null` in JSON for a damaged trace's 2^64 - 1).
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub size: u64,
    /// Free device memory when it failed, when recorded.
    #[serde(serialize_with = "crate::units::opt_bytes_or_null")]
    pub device_free: Option<u64>,
    /// Bytes allocated when it failed plus the request: a floor under the reserved need (`null`
    /// in JSON when saturated, beside `need_unbounded`).
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub need_bytes: u64,
}

impl RecordedOom {
    /// The warning every command that judges the trace gives.
    pub fn warning(&self) -> String {
        let free = self.device_free.map_or(String::new(), |f| format!(", {f} B free on the device"));
        format!(
            "the run ran out of memory (record {}, device {}: a request of {} B{free}); the need counts that \
             request on top of what was allocated then, which comes to {}",
            self.at_event,
            self.device,
            self.size,
            bytes_text(self.need_bytes)
        )
    }
}

/// The first allocation of a replay that failed at the capacity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FirstOom {
    /// Whether an allocation failed at the capacity.
    pub oom: bool,
    /// Index of the first record whose allocation failed.
    pub oom_at_event: Option<u64>,
    /// Details of the first OOM.
    pub oom_detail: Option<String>,
    /// What the first failed allocation needed reserved: the bytes reserved when it failed plus
    /// its rounded size. A floor under the job's need that its peak cannot show: the failed
    /// request was never placed. `null` in JSON when saturated (a request of 2^64 - 1 B).
    #[serde(serialize_with = "crate::units::opt_bytes_or_null")]
    pub oom_need_bytes: Option<u64>,
    /// The bytes allocated when it failed plus its rounded size: live bytes the job held at
    /// once, which no packing avoids (`need_floor_bytes` of `memsim replay --json` rests on it).
    #[serde(skip)]
    pub oom_allocated_need_bytes: Option<u64>,
}

impl FirstOom {
    /// This failure, with the larger of its floors and `other`'s (the unlimited replay's beside
    /// the one at a budget: a request no device holds fails in both, and the larger floor is
    /// what the job needs).
    pub fn with_floors_of(self, other: &FirstOom) -> FirstOom {
        FirstOom {
            oom_need_bytes: self.oom_need_bytes.max(other.oom_need_bytes),
            oom_allocated_need_bytes: self.oom_allocated_need_bytes.max(other.oom_allocated_need_bytes),
            ..self
        }
    }

    /// Bytes allocated at once however an allocator packs them: `peak_allocated`, or more when an
    /// allocation failed (the bytes allocated then plus its size, in the replay, or `recorded` as
    /// the run itself recorded it), since the peak never counts the request that was not placed.
    pub fn allocated_need(&self, peak_allocated: u64, recorded: Option<RecordedOom>) -> u64 {
        let failed = self.oom_allocated_need_bytes.unwrap_or(0);
        peak_allocated.max(failed).max(recorded.map_or(0, |o| o.need_bytes))
    }
}

/// Replay result.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// Max over devices of each peak ([`Peaks::max`]).
    #[serde(flatten)]
    pub peaks: Peaks,
    /// The first failed allocation.
    #[serde(flatten)]
    pub first_oom: FirstOom,
    /// The first out-of-memory error the run itself recorded (a real run's snapshot `oom`).
    pub recorded_oom: Option<RecordedOom>,
    /// Releases of cached memory the run recorded (`segment_free`/`segment_unmap` outcomes),
    /// each replayed as `empty_cache`.
    pub recorded_releases: u64,
    /// Those left out: the allocator's settings release some segments and keep others
    /// (`max_split_size_mb`, `garbage_collection_threshold`), which `empty_cache` does not.
    pub recorded_releases_kept: u64,
    /// `reset_peak_memory_stats` calls in the trace, not replayed: the peaks are the whole run's.
    pub peak_resets: u64,
    /// The most device memory the trace held outside the caching allocator at once on one
    /// device (another module's own requests, VMM physical handles, managed memory): not placed
    /// by the model, and counted in the need on top of the reserved peak.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub recorded_outside_bytes: u64,
    /// What that memory adds to the reserved peak at the device's busiest moment: the most of
    /// (reserved + held) at once on one device, less `peak_reserved_bytes` (at most
    /// `recorded_outside_bytes`: the two peaks need not coincide).
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub outside_beside_peak_bytes: u64,
    /// The device's total memory the program's own memory fraction asks for
    /// (`set_per_process_memory_fraction`, or the configuration's): the most bytes a reservation
    /// took the reserved total to (what PyTorch checks against the fraction: `reserved +
    /// alloc_size`, only when it reserves), a failed allocation's need or a start state, over the
    /// fraction in force then, on any one device; 0 without a fraction. The need is at least this.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub fraction_need_bytes: u64,
    /// Allocations at a trace address whose block was still live (the trace has no free for
    /// it): the earlier block stays allocated in the model.
    pub allocations_over_live: u64,
    /// The first of them.
    pub first_allocation_over_live: Option<String>,
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
    /// Frees of allocations the model could not place (out of memory), left out, one per free
    /// (its completing record): not rejections of a damaged trace, but what a traced program
    /// frees after an allocation no device holds.
    pub failed_frees: u64,
    /// `memory_stats()` at the end of the device whose reserved peak is `peak_reserved_bytes`.
    pub memory_stats: serde_json::Value,
    /// Per device.
    pub devices: Vec<DeviceReport>,
    /// The capacity used, bytes.
    pub capacity: Option<u64>,
    /// What the allocator configuration asks for that the model does not follow
    /// ([`crate::alloc::AllocatorConfig::unmodelled`]), as a warning.
    pub config_warning: Option<String>,
    /// Allocator configuration string in force (as given, or from the trace; a snapshot's fields
    /// written into its recorded string where they decide).
    pub alloc_conf: Option<String>,
    /// Which parts of `alloc_conf` a snapshot's `allocator_settings` fields decided, where they did.
    pub alloc_conf_note: Option<String>,
    /// Where it came from: `override` (`--alloc-conf`), `recorded`, or `default` (nothing recorded).
    pub alloc_conf_source: crate::alloc::ConfigSource,
    /// Recorded settings that contradict each other, or that `--alloc-conf` drops (also in
    /// [`ReplayReport::warnings`]).
    pub config_warnings: Vec<String>,
    /// Peaks per `iter:<n>` marker, in trace order; empty when the trace has none.
    pub iterations: Vec<IterationPeak>,
}

impl ReplayReport {
    /// What the replay says of its input that the numbers do not: an allocator configuration the
    /// model does not follow, releases it could not replay, device memory held outside the
    /// allocator, an out-of-memory error the run recorded.
    pub fn warnings(&self) -> Vec<String> {
        let kept = (self.recorded_releases_kept > 0).then(|| {
            format!(
                "{} releases of cached memory the run recorded were not replayed: with max_split_size_mb or \
                 garbage_collection_threshold its allocator releases some segments and keeps others, which the \
                 model cannot tell apart, so the replay keeps them all (its peak may pass the run's)",
                self.recorded_releases_kept
            )
        });
        let resets = (self.peak_resets > 0).then(|| {
            format!(
                "the program resets the peak statistics {} times (reset_peak_memory_stats): not replayed, so the \
                 peaks here are the whole run's, which is what the job needs, and not what the program's own \
                 max_memory_reserved() would say",
                self.peak_resets
            )
        });
        let outside = (self.recorded_outside_bytes > 0).then(|| {
            format!(
                "the trace holds device memory outside the caching allocator (another module's own requests, VMM \
                 physical handles, managed memory), up to {}; it adds {} to the reserved peak at the \
                 device's busiest moment (the most of reserved + held at once), and the need counts that (all \
                 of it where the need is a failed allocation's floor)",
                bytes_text(self.recorded_outside_bytes),
                bytes_text(self.outside_beside_peak_bytes)
            )
        });
        let fraction = (self.fraction_need_bytes > 0).then(|| match self.fraction_need_bytes {
            u64::MAX => "the program's memory fraction (set_per_process_memory_fraction) lets its allocator reserve \
                         nothing of any device (a fraction of 0, or one too small for what it reserves): no device is \
                         large enough; the replay places its requests anyway, to show what they would take"
                .to_string(),
            _ => format!(
                "the program caps its allocator with a memory fraction (set_per_process_memory_fraction): what it \
                 reserves under that share needs a device of {} in all, and the need is at least that",
                crate::units::mib(self.fraction_need_bytes)
            ),
        });
        let over_live = self.first_allocation_over_live.as_ref().map(|first| {
            format!(
                "{} allocations at an address whose block the trace never freed (the first: {first}): a free the \
                 trace is missing, or a damaged trace; the earlier blocks stay allocated in the replay, which errs high",
                self.allocations_over_live
            )
        });
        // A trace of a run that never reached the GPU (a CPU fallback, CUDA calls the shim did
        // not see) is not a measurement of a job that needs nothing. An out-of-memory error the
        // run recorded is one: it sets the need, and says so itself.
        let nothing = self.requests == 0 && self.peaks.peak_reserved_bytes == 0 && self.recorded_outside_bytes == 0;
        let empty = (nothing && self.recorded_oom.is_none()).then(|| {
            "the trace holds no device allocation, so nothing was measured (a run that fell back to the CPU, or \
             a program whose CUDA calls did not reach the tracer): the need is only what the profile puts outside \
             the allocator"
                .to_string()
        });
        let rejected = (self.rejected > 0).then(|| {
            format!(
                "{} requests rejected by the model and left out of the replay (a damaged trace, or one the model \
                 does not follow), e.g.: {}",
                self.rejected,
                self.rejected_examples.join("; ")
            )
        });
        self.config_warning
            .iter()
            .cloned()
            .chain(self.config_warnings.iter().cloned())
            .chain(rejected)
            .chain(empty)
            .chain(self.growth())
            .chain(kept)
            .chain(over_live)
            .chain(resets)
            .chain(outside)
            .chain(fraction)
            .chain(self.recorded_oom.map(|o| o.warning()))
            .collect()
    }

    /// What a step holds when it starts that grows at every step after the first, by at least
    /// 1 MiB each time and by 1% or the same bytes each time (within an eighth), over two steps
    /// or more: memory kept across steps, which no steady state bounds (a run of 1000 steps needs about 1000 times the growth more). What a step
    /// starts with is its state and the loop's variables, not its activations, so shapes that
    /// change from step to step (dynamic padding) move it far less than its peak; and two
    /// steps in a row are asked for, not one.
    fn growth(&self) -> Option<String> {
        let steady = self.iterations.get(1..).filter(|s| s.len() >= 3)?;
        let steps: Vec<(u64, u64)> =
            steady.windows(2).map(|w| (w[0].start_allocated_bytes, w[1].start_allocated_bytes)).collect();
        if !steps.iter().all(|&(a, b)| b >= a.saturating_add(1 << 20)) {
            return None;
        }
        // Jitter moves by uneven amounts; a tensor kept each step adds the same bytes each step,
        // however small beside what the job holds.
        let large = steps.iter().all(|&(a, b)| b - a >= a / 100);
        let added = steps.iter().map(|&(a, b)| b - a);
        let (least, most) = (added.clone().min().unwrap_or(0), added.max().unwrap_or(0));
        if !large && most - least > most / 8 {
            return None;
        }
        let (first, last) = (steady[0], steady[steady.len() - 1]);
        let per_step = (last.start_allocated_bytes - first.start_allocated_bytes) / (steady.len() as u64 - 1);
        Some(format!(
            "what a step holds when it starts grows at every step after the first, by about {} a step (steps {} to \
             {}): memory kept across steps (a tensor appended to a list, a loss summed without .item(), a graph \
             kept with retain_graph) grows with the run's length, and a longer run needs more than this trace \
             shows; trace more steps to tell a leak from a one-time allocation",
            crate::units::mib(per_step),
            // By position, counted from 1, as the per-step lines count them.
            2,
            self.iterations.len()
        ))
    }

    /// The first iteration's peaks, and the max over the later iterations (the steady state:
    /// caches warm, optimizer state allocated); `None` for a trace without `iter:` markers.
    pub fn step_peaks(&self) -> Option<(IterationPeak, Option<IterationPeak>)> {
        let (first, rest) = self.iterations.split_first()?;
        let steady = rest.iter().copied().reduce(|a, b| IterationPeak {
            iter: a.iter.max(b.iter),
            peak_allocated_bytes: a.peak_allocated_bytes.max(b.peak_allocated_bytes),
            peak_reserved_bytes: a.peak_reserved_bytes.max(b.peak_reserved_bytes),
            start_allocated_bytes: a.start_allocated_bytes.max(b.start_allocated_bytes),
        });
        Some((*first, steady))
    }
}
