//! Collocation: several jobs sharing one GPU. Jobs are separate processes, each with its own
//! caching allocator plus the memory its process holds outside the allocator ([`fit::outside`]).
//!
//! Two ways to combine them, and the report says which was used:
//! - [`Mode::SumOfPeaks`]: with no wall-clock time on every trace, nothing says when each job
//!   peaks, so the set must survive the peaks coinciding: the combined need is the sum of what
//!   each job holds at its peak (reserved + outside the allocator), replayed alone at the
//!   capacity judged (below its unlimited peak a job's allocator frees its own cache and retries,
//!   and it never holds more than alone there, so while the sum fits no job waits on another's
//!   cache); the smallest capacity is the least whose sum fits there. This holds for any
//!   interleaving. A job's own memory fraction asks for a device
//!   total, not for memory it holds: it is no term of the sum, but a floor under it (the largest
//!   job's [`JobReport::fraction_need_bytes`]), see [`sum_of_peaks`].
//! - [`Mode::Timestamps`]: every trace carries wall-clock timestamps, so the jobs are put on one
//!   time axis and replayed together: before each request of job *i*, its allocator may use what
//!   the others leave free (`capacity − Σ others' reserved − Σ outside`), so a job that hits the
//!   ceiling goes through PyTorch's own retry chain (freeing its own cache) before it OOMs. Two
//!   recordings say nothing of when the jobs start relative to each other, so the set is
//!   replayed at two starts ([`Start`]): all at once, and each shifted so that its own peak falls
//!   at one instant. The worse of the two decides.
//!
//! The verdict is a [`Verdict`]: FITS only when the combined need printed beside it is within the
//! capacity.

use serde::Serialize;
use trace::{Header, Record};

use crate::fit::{self, Capacity, Margin, Outside, Verdict};
use crate::replay::{ReplayOptions, ReplaySetupError};
use crate::units::Unbounded;

mod aligned;
mod search;
use aligned::{fits_at, is_request, scenarios, times, worst};
use search::{alone_at, smallest, smallest_alone, smallest_sum, sum_of};

/// One job to place.
pub struct Job {
    /// Display name (usually the trace path).
    pub name: String,
    /// Its trace header.
    pub header: Header,
    /// Its records, in trace order.
    pub records: Vec<Record>,
    /// What its process holds outside the caching allocator.
    pub outside: Outside,
    /// Its safety margin ([`fit::margin`]; none for traces of real runs).
    pub margin: Margin,
}

/// Which combination the caller asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Timestamps when every trace has them, else the sum of peaks.
    Auto,
    /// The aligned replay; an error when a trace has no wall-clock timestamps.
    Timestamps,
    /// The sum of peaks, whatever the traces carry.
    SumOfPeaks,
}

/// Which combination was used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The jobs replayed together on one wall-clock axis.
    Timestamps,
    /// The sum of each job's device peak (peaks assumed to coincide).
    SumOfPeaks,
}

/// How the jobs' time axes are lined up in the aligned replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Start {
    /// Every job from its own first record, at once.
    Together,
    /// Each job shifted so that its own reserved peak (alone, unlimited) falls at the instant the
    /// latest of them does: peaks coincide, while each allocator still frees its cache when the
    /// device is full.
    PeaksAligned,
}

/// Errors setting up a collocation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ColocateError {
    /// A job's trace cannot be replayed.
    #[error("{job}: {source}")]
    Replay {
        /// Job name.
        job: String,
        /// Why.
        source: ReplaySetupError,
    },
    /// A job beside others uses several devices.
    #[error(
        "{job}: uses devices {devices:?}; colocate places single-GPU jobs together (split the trace per device; \
         alone, a job on several devices is judged as its replay)"
    )]
    MultiDevice {
        /// Job name.
        job: String,
        /// Devices seen.
        devices: Vec<u32>,
    },
    /// The aligned replay was asked for, but a trace has no wall-clock time.
    #[error(
        "{job}: has no wall-clock timestamps on its requests (symbolic traces count events, not time), so it \
         cannot be aligned with the others; use the sum of peaks (the default for such traces)"
    )]
    NoTimestamps {
        /// Job name.
        job: String,
    },
    /// Fewer than one job.
    #[error("colocate needs at least one trace")]
    NoJobs,
}

/// Per-job result.
#[derive(Debug, Clone, Serialize)]
pub struct JobReport {
    /// Job name.
    pub name: String,
    /// Its own peak reserved bytes (alone, unlimited capacity), or the floor a failed allocation
    /// sets under them: `null` in JSON when saturated (a damaged trace), beside `need_unbounded`.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub peak_reserved_bytes: u64,
    /// Memory outside the allocator, by term.
    pub outside_allocator: Outside,
    /// Device memory the trace itself held outside the allocator, on top of its reserved need
    /// ([`fit::FitOutcome::held_beside`]); `null` in JSON when saturated.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub held_outside_bytes: u64,
    /// Its device peak alone: reserved + outside the allocator (the point estimate), or the
    /// device total its memory fraction asks for when that is more.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub device_peak_bytes: u64,
    /// The device total its own memory fraction asks for (0 without one): the smallest device
    /// whose share holds what it reserves, not memory it holds
    /// ([`crate::replay::ReplayReport::fraction_need_bytes`]).
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub fraction_need_bytes: u64,
    /// The point plus its safety margin.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub device_safe_bytes: u64,
    /// Why no device holds the job (its safe number), when none does: its byte counts saturated
    /// by it are then `null` in JSON.
    pub need_unbounded: Option<Unbounded>,
    /// The margin.
    pub margin: Margin,
    /// Whether it fits the capacity on its own (`None` without a capacity).
    pub fits_alone: Option<bool>,
    /// What it needs on its own at the capacity (`None` without one): below its unlimited peak
    /// its allocator frees its cache and retries, so this can be less than `device_safe_bytes`.
    #[serde(serialize_with = "crate::units::opt_bytes_or_null")]
    pub need_alone_bytes: Option<u64>,
    /// Whether its trace has wall-clock timestamps.
    pub timestamps: bool,
    /// Whether it OOMs in the aligned replay at the capacity (`None` for the sum of peaks).
    pub oom_in_shared_run: Option<bool>,
    /// Record index of its first OOM in the aligned replay.
    pub oom_at_event: Option<u64>,
    /// What its replay says of its trace ([`crate::replay::ReplayReport::warnings`]).
    #[serde(skip)]
    pub replay_warnings: Vec<String>,
}

impl JobReport {
    /// What the job holds on the device at its peak: reserved + outside the allocator (the
    /// point), or that with its margin (the safe number).
    pub fn held_bytes(&self, point: bool) -> u64 {
        let held =
            saturating_sum([self.peak_reserved_bytes, self.outside_allocator.total_bytes, self.held_outside_bytes]);
        if point {
            held
        } else {
            self.margin.safe(held, self.peak_reserved_bytes)
        }
    }

    /// The device total its memory fraction asks for (the point), or that with its margin (the
    /// safe number); 0 without a fraction.
    pub fn fraction_bytes(&self, point: bool) -> u64 {
        match self.fraction_need_bytes {
            0 => 0,
            n if point => n,
            n => self.margin.safe(n, self.peak_reserved_bytes),
        }
    }

    /// Whether its memory fraction, not what it holds, sets its device peak.
    pub fn fraction_sets_peak(&self) -> bool {
        self.fraction_need_bytes > self.held_bytes(true)
    }
}

/// What a set of jobs needs when their peaks may coincide: the sum of what each holds at its
/// peak, or the device total the largest of their memory fractions asks for when that is more
/// (a fraction is a share of the device's total, so each job's asks for the whole device, and
/// summing them is meaningless). `point`: the points, else the safe numbers.
pub fn sum_of_peaks(jobs: &[JobReport], point: bool) -> u64 {
    let held = saturating_sum(jobs.iter().map(|j| j.held_bytes(point)));
    jobs.iter().map(|j| j.fraction_bytes(point)).fold(held, u64::max)
}

/// Result.
#[derive(Debug, Clone, Serialize)]
pub struct ColocateReport {
    /// How the jobs were combined.
    pub mode: Mode,
    /// Why that mode.
    pub mode_reason: String,
    /// Device capacity checked (None: only measure).
    pub capacity: Option<Capacity>,
    /// The verdict for the set (None without a capacity).
    pub verdict: Option<Verdict>,
    /// Whether the set fits (`verdict.fits`; true without a capacity).
    pub fits: bool,
    /// What the set needs: [`sum_of_peaks`] (at a capacity, of each job replayed alone there),
    /// or the peak of Σ (reserved + outside) in the aligned replay (at the capacity when it fits
    /// there); at least the device total a job's memory fraction asks for.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub combined_need_bytes: u64,
    /// Why no device holds the set, when none does: its byte counts are then `null` in JSON.
    pub need_unbounded: Option<Unbounded>,
    /// When the combined peak happens in the aligned replay, µs from the first job's start.
    pub combined_peak_at_us: Option<f64>,
    /// How the jobs were lined up in the aligned replay the need comes from.
    pub start: Option<Start>,
    /// The smallest capacity, in bytes, at which the set fits.
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub smallest_fitting_capacity: u64,
    /// Per job.
    pub jobs: Vec<JobReport>,
}

/// A sum of byte counts that stops at `u64::MAX`: a job whose need saturated (a damaged size, a
/// memory fraction of 0) must not wrap the total into one that fits.
pub fn saturating_sum(bytes: impl IntoIterator<Item = u64>) -> u64 {
    bytes.into_iter().fold(0, u64::saturating_add)
}

/// Place the jobs on one GPU of `capacity` (None: only measure).
pub fn colocate(
    jobs: &[Job],
    opts: &ReplayOptions,
    capacity: Option<Capacity>,
    align: Align,
    point: bool,
) -> Result<ColocateReport, ColocateError> {
    if jobs.is_empty() {
        return Err(ColocateError::NoJobs);
    }
    // A job on several devices cannot share one GPU with another; alone, it is its replay, as
    // `memsim replay` and `memest` judge it (the largest device's need).
    let mut several_devices = None;
    for j in jobs {
        let mut devices: Vec<u32> = j.records.iter().filter(|r| is_request(r)).filter_map(|r| r.device).collect();
        devices.sort_unstable();
        devices.dedup();
        if devices.len() > 1 && jobs.len() > 1 {
            return Err(ColocateError::MultiDevice { job: j.name.clone(), devices });
        }
        if devices.len() > 1 {
            several_devices = Some(devices);
        }
    }
    let axes_and_ts: Vec<(Vec<f64>, bool)> = jobs.iter().map(times).collect();
    let all_timestamps = axes_and_ts.iter().all(|(_, t)| *t);
    let (mode, mode_reason) = match align {
        _ if several_devices.is_some() => (
            Mode::SumOfPeaks,
            format!(
                "one job on devices {:?}: judged as its replay is, by its largest device's need",
                several_devices.unwrap_or_default()
            ),
        ),
        // One job shares with no one: it is its own replay, as `memsim replay` judges it, with
        // or without timestamps.
        _ if jobs.len() == 1 => (Mode::SumOfPeaks, "one job: no other job's peak can coincide with its own".into()),
        Align::SumOfPeaks => (Mode::SumOfPeaks, "asked for (--align sum): peaks assumed to coincide".to_string()),
        Align::Timestamps if !all_timestamps => {
            let (j, _) = jobs.iter().zip(&axes_and_ts).find(|(_, (_, t))| !*t).expect("one job lacks timestamps");
            return Err(ColocateError::NoTimestamps { job: j.name.clone() });
        }
        _ if all_timestamps => (
            Mode::Timestamps,
            "every trace has wall-clock timestamps: replayed together on one time axis, started together and \
             shifted so that each job's own peak falls at one instant (the worse decides; each allocator frees its \
             cache when the device is full, as PyTorch's does)"
                .into(),
        ),
        _ => (Mode::SumOfPeaks, "not every trace has wall-clock timestamps, so the jobs' peaks may coincide".into()),
    };
    // Each job alone: its own peak, unlimited, and whether it fits the capacity by itself.
    let mut job_reports = Vec::with_capacity(jobs.len());
    // Each job alone at the capacity; one job's is its verdict too.
    let mut alone = Vec::with_capacity(jobs.len());
    // What a job whose run recorded an out-of-memory error needed at least, on its own: the
    // aligned replay cannot show it (the failed request is in no record).
    let mut recorded_floor = 0u64;
    // What each job needs at least however its allocator packs: its allocated peak and the
    // memory outside its allocator. Below its reserved peak an allocator frees its cache and
    // retries, so that peak is no lower bound on a capacity.
    let mut floors = Vec::with_capacity(jobs.len());
    for (j, (_, ts)) in jobs.iter().zip(&axes_and_ts) {
        let unlimited = fit::fit_records(&j.header, &j.records, opts, None)
            .map_err(|source| ColocateError::Replay { job: j.name.clone(), source })?;
        if let Some(o) = unlimited.report.recorded_oom {
            recorded_floor = recorded_floor.max(o.need_bytes.saturating_add(unlimited.beside(&j.outside)));
        }
        floors.push(unlimited.report.peaks.peak_allocated_bytes.saturating_add(j.outside.total_bytes));
        let at = capacity.map(|c| alone_at(j, opts, c, point)).transpose()?;
        alone.push(at);
        let fits_alone = at.map(|a| a.fits);
        let need_alone_bytes = at.map(|a| a.need);
        let (device, safe) = (unlimited.device_peak(&j.outside), unlimited.device_safe(&j.outside, &j.margin));
        job_reports.push(JobReport {
            name: j.name.clone(),
            peak_reserved_bytes: unlimited.reserved_need(),
            outside_allocator: j.outside.clone(),
            held_outside_bytes: unlimited.held_beside(),
            device_peak_bytes: device,
            fraction_need_bytes: unlimited.report.fraction_need_bytes,
            device_safe_bytes: safe,
            need_unbounded: Unbounded::of(safe, unlimited.report.fraction_need_bytes),
            margin: j.margin.clone(),
            fits_alone,
            need_alone_bytes,
            timestamps: *ts,
            oom_in_shared_run: None,
            oom_at_event: None,
            replay_warnings: unlimited
                .report
                .warnings()
                .into_iter()
                .chain(fit::held_beside_terms(&unlimited.report, &j.outside))
                .collect(),
        });
    }
    // Symbolic traces carry no wall-clock time, so margins meet the sum of peaks only.
    let sum = sum_of_peaks(&job_reports, point);
    let axes: Vec<Vec<f64>> = axes_and_ts.into_iter().map(|(a, _)| a).collect();

    let mut start = None;
    let (need, peak_at, smallest_cap, failed) = match mode {
        // One job has no one to share with: it needs what it needs alone, and at a capacity
        // below its unlimited peak the allocator's retry chain (freeing its own cache) may still
        // fit it, as `memsim replay --capacity` finds.
        Mode::SumOfPeaks if jobs.len() == 1 => {
            // The same search with or without a capacity asked about, so the answer is one.
            let least = smallest_alone(&jobs[0], opts, point, sum)?;
            match (capacity, alone[0]) {
                // Its need is its replay's at the capacity, fitting or not, as `memsim replay
                // --capacity` prints it; what it takes to fit is the smallest capacity.
                (Some(c), Some(a)) => {
                    let least = if a.fits { least.min(c.bytes) } else { least.max(c.bytes + 1) };
                    (a.need, None, least, !a.fits)
                }
                _ => (sum, None, least, false),
            }
        }
        // Below its unlimited peak each allocator frees its own cache and retries, so at a
        // capacity each job's term is its replay there: summing the unlimited peaks called sets
        // that fit at the capacity DOES NOT FIT, and a smallest capacity no replay had found.
        Mode::SumOfPeaks => {
            // At the sum of the unlimited peaks each job holds what it does unlimited: it fits.
            let lower = saturating_sum(floors.iter().copied()).min(sum);
            let mut least = smallest_sum(jobs, opts, point, lower, sum)?;
            match capacity {
                Some(c) => {
                    let at: Vec<_> = alone.iter().flatten().copied().collect();
                    let need = sum_of(&at);
                    let failed = at.iter().any(|a| !a.fits);
                    // Kept consistent with the verdict at the capacity asked about, as below.
                    if !failed && need <= c.bytes {
                        least = least.min(c.bytes);
                    } else if least <= c.bytes {
                        least = smallest_sum(jobs, opts, point, c.bytes + 1, sum.max(c.bytes + 1))?;
                    }
                    (need, None, least, failed)
                }
                None => (sum, None, least, false),
            }
        }
        Mode::Timestamps => {
            let sc = scenarios(jobs, axes, opts)?;
            let (unlimited, at_unlimited) = worst(jobs, &sc, opts, None)?;
            let (need, at, failed) = match capacity {
                Some(c) => {
                    let (run, at_c) = worst(jobs, &sc, opts, Some(c.bytes))?;
                    for (jr, o) in job_reports.iter_mut().zip(&run.ooms) {
                        jr.oom_in_shared_run = Some(o.is_some());
                        jr.oom_at_event = *o;
                    }
                    if fits_at(&run, c.bytes) {
                        // The set survives at the capacity: its peak there is what it needs.
                        start = Some(at_c);
                        (run.need(), run.need_at_us(), false)
                    } else if run.need() > unlimited.need() {
                        // Its failed request counted: what the set needs is above the capacity,
                        // as the verdict says, even where the unlimited replay holds less.
                        start = Some(at_c);
                        (run.need(), run.need_at_us(), true)
                    } else {
                        start = Some(at_unlimited);
                        (unlimited.need(), unlimited.need_at_us(), true)
                    }
                }
                None => {
                    start = Some(at_unlimited);
                    (unlimited.need(), unlimited.need_at_us(), false)
                }
            };
            let failed = failed || capacity.is_some_and(|c| recorded_floor > c.bytes);
            let need = need.max(recorded_floor);
            // At the sum of the device peaks every job always has its own peak available, so
            // that bound fits; the largest single job's floor is a lower bound.
            let lower = floors.iter().copied().max().unwrap_or(0);
            let upper = sum.max(lower);
            let mut least = smallest(jobs, &sc, opts, lower, upper)?;
            // The allocator's retry chain makes fitting not quite monotone in the capacity; keep
            // the smallest capacity consistent with the verdict at the capacity asked about.
            if let Some(c) = capacity {
                if !failed {
                    least = least.min(c.bytes);
                } else if least <= c.bytes {
                    least = smallest(jobs, &sc, opts, c.bytes + 1, upper.max(c.bytes + 1))?;
                }
            }
            (need, Some(at), least.max(recorded_floor), failed)
        }
    };
    let fraction_need = job_reports.iter().map(|j| j.fraction_need_bytes).max().unwrap_or(0);
    let verdict = capacity.map(|c| {
        let basis = match (mode, point) {
            (Mode::SumOfPeaks, true) if jobs.len() == 1 => "the job alone at the capacity (point)",
            (Mode::SumOfPeaks, false) if jobs.len() == 1 => "the job alone at the capacity (safe)",
            (Mode::SumOfPeaks, true) => "sum of device peaks (point)",
            (Mode::SumOfPeaks, false) => "sum of safe device peaks",
            (Mode::Timestamps, _) => "aligned replay",
        };
        let mut v = Verdict::new(basis, need, c).under_fraction(fraction_need);
        v.fits &= !failed;
        v
    });
    Ok(ColocateReport {
        mode,
        mode_reason,
        capacity,
        fits: verdict.as_ref().is_none_or(|v| v.fits),
        verdict,
        combined_need_bytes: need,
        need_unbounded: Unbounded::of(need, fraction_need),
        combined_peak_at_us: peak_at,
        start,
        smallest_fitting_capacity: smallest_cap,
        jobs: job_reports,
    })
}
