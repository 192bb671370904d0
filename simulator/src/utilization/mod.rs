//! GPU utilization from kernel activity: busy fraction, SM activity (a DCGM SMACT proxy),
//! occupancy (a DCGM SMOCC proxy), launch rate, gaps and kernel-time shares, per run and per
//! training phase. Sans-IO: feed records to [`UtilizationBuilder::observe`].
//!
//! Definitions (DCGM's own are in `estimator-baselines.md` §11):
//! - **Device.** One device is analysed: the one with the most kernel records (launch records
//!   for launch-only traces); records on other devices are counted in `other_devices`.
//! - **Run window.** From the first kernel start to the last kernel end (CUPTI records). Time
//!   before the first kernel (process start-up, data loading before any launch) is not counted.
//!   For launch-only traces, from the first to the last launch timestamp.
//! - **Phases.** A `phase:<p>` marker starts phase `p`, which lasts until the next phase marker
//!   (`iter:` markers do not end phases). Time in the window before the first phase marker is
//!   `unphased`. A phase's wall time is the sum of its segments clipped to the run window, so
//!   the phases' wall times add up to the run's. Markers carry host timestamps while kernels run
//!   asynchronously, so unless the program synchronises at phase changes, GPU work queued in one
//!   phase may run (and be attributed) in the next.
//! - **Splitting.** Time-weighted metrics split kernels at phase boundaries (the part of a
//!   kernel after a boundary counts in the next phase); counts, kernel time, top kernels and
//!   time shares attribute a whole kernel to the phase its start falls in.
//! - **Busy fraction** = |union of kernel intervals| / wall time (nvidia-smi's utilization).
//! - **SM activity** = time-average of `min(1, Σ_running min(1, blocks / SMs))`. For kernels that
//!   do not overlap this is exactly `Σ duration × min(1, blocks / SMs) / wall`; overlapping
//!   kernels (several streams) cannot make more than every SM active.
//! - **Occupancy** = time-average of `min(1, Σ_running theoretical occupancy)`; the theoretical
//!   occupancy comes from [`occupancy::occupancy`] with the kernel's block size, registers and
//!   shared memory and the limits of the device's compute capability.
//! - **Mean gap** = mean over consecutive kernels (by start) of `max(0, start − latest end so
//!   far)`; for the run this is idle time / (kernels − 1).

pub mod builder;
pub mod classify;
pub mod occupancy;
pub mod report;

pub use builder::{UtilOptions, UtilizationBuilder, UNPHASED};
pub use classify::{classify, KernelClass};
pub use occupancy::{occupancy, BlockResources, Limiter, Occupancy, OccupancyError, SmLimits};
pub use report::{ScopeMetrics, Source, TimeShare, Timing, TopKernel, UtilizationReport};
