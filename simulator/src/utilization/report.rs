//! What the utilization analysis reports, per run and per phase. Serialized as the `utilization`
//! object of `memsim stats --json`.

use std::collections::BTreeMap;

use serde::Serialize;

use super::classify::KernelClass;

/// What timing the trace carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Timing {
    /// CUPTI kernel execution records: every metric is available.
    Cupti,
    /// Host launch records only: counts and launch rates, no busy time.
    LaunchesOnly,
    /// No kernel activity at all.
    None,
}

/// Where a device fact came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The trace header's device info.
    Header,
    /// A command-line option or GPU profile (the header lacked it).
    Fallback,
}

/// One kernel name's share of the time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopKernel {
    /// Kernel name (`<unnamed>` when the trace has none).
    pub name: String,
    /// Its class.
    pub class: KernelClass,
    /// Executions.
    pub count: u64,
    /// Summed duration, ns.
    pub total_ns: u64,
    /// Mean duration, ns.
    pub mean_ns: f64,
    /// Share of all kernel time in this scope (durations summed, overlap counted twice).
    pub share: f64,
}

/// Share of kernel time per class (fractions of summed kernel durations; they add to 1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TimeShare {
    /// GEMM and convolution.
    pub gemm_conv: f64,
    /// Elementwise and data movement.
    pub elementwise: f64,
    /// Reductions, normalisation, softmax.
    pub reduction: f64,
    /// Everything else.
    pub other: f64,
}

/// Metrics of one scope: the whole run, or one phase.
///
/// Time-weighted metrics (`busy_*`, `sm_activity`, `occupancy*`) split kernels at phase
/// boundaries; counts, kernel time, top kernels and time shares attribute each kernel to the
/// phase its start falls in, and each launch to the phase its host timestamp falls in.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct ScopeMetrics {
    /// Wall time of the scope, ns (see the module docs of `utilization` for the window).
    pub wall_ns: u64,
    /// Union of kernel intervals inside the scope, ns (CUPTI only).
    pub busy_ns: Option<u64>,
    /// `busy_ns / wall_ns`: what nvidia-smi calls utilization (CUPTI only).
    pub busy_fraction: Option<f64>,
    /// DCGM SMACT proxy: time-average of `min(1, Σ running kernels' min(1, blocks / SMs))`
    /// (CUPTI and an SM count).
    pub sm_activity: Option<f64>,
    /// DCGM SMOCC proxy: time-average of `min(1, Σ running kernels' theoretical occupancy)`
    /// (CUPTI and a known compute capability; absent when no kernel starting in the scope has a
    /// computable occupancy). Kernels without one count as 0 while they run.
    pub occupancy: Option<f64>,
    /// Like `occupancy`, with each kernel's occupancy scaled by the share of SMs its grid can
    /// fill, `min(1, blocks / (SMs × resident blocks per SM))`: small grids leave SMs empty.
    pub occupancy_grid_limited: Option<f64>,
    /// Kernels executed (CUPTI records) starting in the scope.
    pub kernels: u64,
    /// Summed kernel durations, ns.
    pub kernel_time_ns: u64,
    /// Kernel launches seen on the host in the scope.
    pub launches: u64,
    /// Launches per second of wall time (CUPTI executions when the trace has no launch records).
    pub launch_rate_per_s: Option<f64>,
    /// Mean idle gap before each kernel, ns: `max(0, start − latest end so far)` over consecutive
    /// kernels by start time. Large relative to kernel durations means launch-bound.
    pub mean_gap_ns: Option<f64>,
    /// Kernels that could not get an occupancy (cannot launch under the limits, or no block size).
    pub occupancy_unknown_kernels: u64,
    /// Top kernel names by summed duration.
    pub top_kernels: Vec<TopKernel>,
    /// Share of kernel time per class.
    pub time_share: Option<TimeShare>,
}

/// Utilization of one traced run on one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UtilizationReport {
    /// What timing the trace carries.
    pub timing: Timing,
    /// What is missing and how to get it, when something is.
    pub notes: Vec<String>,
    /// The device analysed (the one with the most kernel records).
    pub device: Option<u32>,
    /// SMs of that device.
    pub sm_count: Option<u32>,
    /// Where `sm_count` came from.
    pub sm_count_source: Option<Source>,
    /// Compute capability of that device.
    pub compute_capability: Option<(u32, u32)>,
    /// Where `compute_capability` came from.
    pub compute_capability_source: Option<Source>,
    /// Kernel records (or launches) on other devices, left out, per device.
    pub other_devices: BTreeMap<u32, u64>,
    /// Kernel records whose end precedes their start, left out.
    pub invalid_kernel_records: u64,
    /// Phase markers without a timestamp, which cannot delimit phases.
    pub markers_without_time: u64,
    /// The whole run.
    pub run: ScopeMetrics,
    /// Per phase (`forward`, `backward`, `optimizer`, `data`, `other`, and `unphased` for time
    /// before the first phase marker).
    pub phases: BTreeMap<String, ScopeMetrics>,
}
