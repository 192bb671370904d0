//! The symbolic estimator: a meta-device trace replayed through memsim's allocator model gives the
//! reserved peak; the GPU profile adds what lives outside the allocator.

use serde::Serialize;
use simulator::alloc::TorchVersion;
use simulator::profile::Profile;
use simulator::replay::{ReplayOptions, ReplayReport, Replayer};

use crate::error::{EstimateError, Result};
use crate::tracefile::LoadedTrace;

/// What the symbolic estimator predicts, bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SymbolicEstimate {
    /// `max_memory_reserved()` the allocator model reaches: at the profile's capacity when the
    /// unlimited replay would not fit but the capped one survives (the OOM retry path).
    pub predicted_reserved_peak: u64,
    /// `max_memory_allocated()`.
    pub predicted_allocated_peak: u64,
    /// Reserved peak plus the profile's memory outside the allocator: nvidia-smi's view.
    pub predicted_device_peak: u64,
    /// The outside-allocator term added.
    pub outside_allocator: u64,
    /// Whether the job would OOM on the profile's GPU (replayed at its capacity).
    pub oom_on_profile_gpu: bool,
}

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
    let opts = ReplayOptions { alloc_conf: None, version, capacity };
    let mut rep =
        Replayer::new(&t.header, opts).map_err(|source| EstimateError::Replay { path: t.path.clone(), source })?;
    for r in &t.records {
        rep.observe(r);
    }
    Ok(rep.finish())
}

/// Estimate with the symbolic method. `uses_gemm`/`uses_conv` choose the cuBLAS and cuDNN terms.
pub fn symbolic(
    t: &LoadedTrace,
    profile: &Profile,
    version: TorchVersion,
    uses_gemm: bool,
    uses_conv: bool,
) -> Result<SymbolicEstimate> {
    let unlimited = replay(t, version, None)?;
    let outside = profile.outside_allocator_bytes(uses_gemm, uses_conv);
    let capacity = profile.gpu.total_memory.saturating_sub(outside);
    // Replaying at capacity only matters when the unlimited peak would not fit. Then the real
    // allocator's failed cudaMalloc releases cached free segments and retries, so a job that
    // survives reaches the capped replay's reserved peak, not the unlimited one. A job that
    // does not survive is reported with what it would have needed.
    let mut peak = unlimited;
    let mut oom = false;
    if peak.peak_reserved_bytes > capacity {
        let capped = replay(t, version, Some(capacity))?;
        oom = capped.oom;
        if !oom {
            peak = capped;
        }
    }
    Ok(SymbolicEstimate {
        predicted_reserved_peak: peak.peak_reserved_bytes,
        predicted_allocated_peak: peak.peak_allocated_bytes,
        predicted_device_peak: peak.peak_reserved_bytes + outside,
        outside_allocator: outside,
        oom_on_profile_gpu: oom,
    })
}

/// xMem's "second run with the estimate as the memory limit", simulated: replay the trace with
/// the allocator capped at `device_estimate − outside` and report whether it survives.
pub fn capped_rerun_ok(t: &LoadedTrace, version: TorchVersion, device_estimate: u64, outside: u64) -> Result<bool> {
    let cap = device_estimate.saturating_sub(outside);
    Ok(!replay(t, version, Some(cap))?.oom)
}
