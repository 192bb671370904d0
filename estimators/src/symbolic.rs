//! The symbolic estimator: a meta-device trace replayed through memsim's allocator model gives the
//! reserved peak; the GPU profile adds what lives outside the allocator.

use serde::Serialize;
use simulator::alloc::TorchVersion;
use simulator::fit::{fit_records, held_beside_terms, Capacity, Outside, Verdict};
use simulator::profile::Profile;
use simulator::replay::{ReplayOptions, ReplayReport, Replayer};

use crate::error::{EstimateError, Result};
use crate::tracefile::LoadedTrace;

/// What the symbolic estimator predicts, bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SymbolicEstimate {
    /// `max_memory_reserved()` the allocator model reaches: at the capacity's allocator budget
    /// when the unlimited replay would not fit but the capped one survives (the OOM retry path).
    pub predicted_reserved_peak: u64,
    /// Whether `predicted_reserved_peak` is no peak the model reached but a failed allocation's
    /// floor: the bytes held when it failed plus its size ([`simulator::fit::FitOutcome::need_is_oom_floor`]).
    pub reserved_is_oom_floor: bool,
    /// `max_memory_allocated()`.
    pub predicted_allocated_peak: u64,
    /// Reserved peak plus the memory outside the allocator: nvidia-smi's view.
    pub predicted_device_peak: u64,
    /// The outside-allocator term added: the profile's terms plus `recorded_outside`.
    pub outside_allocator: u64,
    /// Device memory the trace itself held outside the allocator, on top of the reserved need
    /// ([`simulator::fit::FitOutcome::held_beside`]).
    pub recorded_outside: u64,
    /// Whether the job would OOM at the capacity.
    pub oom_on_profile_gpu: bool,
    /// The fit verdict at the capacity, on the device peak.
    pub verdict: Verdict,
    /// Per `iter:` marker: reserved and allocated peaks (empty without markers).
    pub iterations: Vec<simulator::replay::IterationPeak>,
    /// What the replay says of the trace ([`simulator::replay::ReplayReport::warnings`]).
    pub replay_warnings: Vec<String>,
    /// The allocator budget replayed at: the capacity less `outside`.
    pub budget: u64,
    /// Whether the peaks are of the replay within `budget` ([`simulator::fit::FitOutcome::peaks_at_budget`]):
    /// a full budget frees the cache and retries, so they can differ at another capacity.
    pub peaks_at_budget: bool,
    /// Why no device holds the job, when none does: `predicted_device_peak` is then `u64::MAX`,
    /// a saturated count and no size ([`simulator::units::UNBOUNDED`]).
    pub unbounded: Option<Unbounded>,
}

/// Why a need is no number of bytes: what an estimate's JSON says in place of one (memsim's
/// owner, so both commands say it alike).
pub use simulator::units::Unbounded;

/// The allocator version a profile implies.
pub fn profile_version(profile: &Profile, path: &std::path::Path) -> Result<TorchVersion> {
    profile
        .software
        .allocator
        .parse()
        .map_err(|source| EstimateError::AllocatorVersion { path: path.to_path_buf(), source })
}

/// Replay a trace at an optional capacity (bytes available to the allocator).
pub fn replay(t: &LoadedTrace, version: TorchVersion, capacity: Option<u64>) -> Result<ReplayReport> {
    let opts = ReplayOptions { alloc_conf: None, version, capacity, ..ReplayOptions::default() };
    let mut rep =
        Replayer::new(&t.header, opts).map_err(|source| EstimateError::Replay { path: t.path.clone(), source })?;
    for r in &t.records {
        rep.observe(r);
    }
    Ok(rep.finish())
}

/// Estimate with the symbolic method: the trace replayed at the allocator budget that
/// `capacity` leaves after `outside` ([`simulator::fit`], the same check `memsim replay` makes).
pub fn symbolic(
    t: &LoadedTrace,
    version: TorchVersion,
    outside: &Outside,
    capacity: Capacity,
) -> Result<SymbolicEstimate> {
    // The device's total is the base of a memory fraction the program sets.
    let opts = ReplayOptions { alloc_conf: None, version, capacity: None, device_total: Some(capacity.bytes) };
    let fit = fit_records(&t.header, &t.records, &opts, Some(outside.budget(capacity.bytes)))
        .map_err(|source| EstimateError::Replay { path: t.path.clone(), source })?;
    let device = fit.device_peak(outside);
    Ok(SymbolicEstimate {
        predicted_reserved_peak: fit.reserved_need(),
        reserved_is_oom_floor: fit.need_is_oom_floor(),
        predicted_allocated_peak: fit.report.peaks.peak_allocated_bytes,
        predicted_device_peak: device,
        outside_allocator: fit.beside(outside),
        recorded_outside: fit.held_beside(),
        oom_on_profile_gpu: fit.first_oom.oom,
        verdict: Verdict::new("symbolic.device", device, capacity).under_fraction(fit.report.fraction_need_bytes),
        iterations: fit.report.iterations.clone(),
        replay_warnings: fit.report.warnings().into_iter().chain(held_beside_terms(&fit.report, outside)).collect(),
        unbounded: Unbounded::of(device, fit.report.fraction_need_bytes),
        budget: outside.budget(capacity.bytes),
        peaks_at_budget: fit.peaks_at_budget,
    })
}

/// xMem's "second run with the estimate as the memory limit", simulated: replay the trace with
/// the allocator capped at `device_estimate − outside` and report whether it survives.
pub fn capped_rerun_ok(t: &LoadedTrace, version: TorchVersion, device_estimate: u64, outside: u64) -> Result<bool> {
    let cap = device_estimate.saturating_sub(outside);
    Ok(!replay(t, version, Some(cap))?.first_oom.oom)
}
