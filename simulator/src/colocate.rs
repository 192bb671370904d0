//! Collocation: several jobs sharing one GPU, each with its own caching allocator plus the memory
//! its process holds outside the allocator (context, libraries).
//!
//! With [`Align::Start`] the jobs' traces are put on one time axis from their starts and replayed
//! together: before each request of job *i*, its allocator may use what the others leave free
//! (`capacity − Σ others' reserved − Σ contexts`), so a job that hits the ceiling goes through
//! PyTorch's own retry chain (release cached blocks, retry) before it OOMs, as it would on a
//! shared GPU. [`Align::Worst`] assumes the peaks coincide: the combined peak is the sum of the
//! peaks.

use serde::Serialize;
use trace::{Event, Header, Record};

use crate::replay::{ReplayOptions, ReplaySetupError, Replayer};

/// One job to place.
pub struct Job {
    /// Display name (usually the trace path).
    pub name: String,
    /// Its trace header.
    pub header: Header,
    /// Its records, in trace order.
    pub records: Vec<Record>,
    /// Bytes its process holds outside the caching allocator.
    pub context: u64,
}

/// How the jobs' timelines are aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Align {
    /// One time axis from each trace's start.
    Start,
    /// Peaks coincide.
    Worst,
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
    /// A job uses several devices.
    #[error("{job}: uses devices {devices:?}; colocate places single-GPU jobs (split the trace per device)")]
    MultiDevice {
        /// Job name.
        job: String,
        /// Devices seen.
        devices: Vec<u32>,
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
    /// Its own peak reserved bytes (alone, unlimited capacity).
    pub peak_reserved_bytes: u64,
    /// Memory outside the allocator.
    pub context_bytes: u64,
    /// Whether it OOMs in the shared run at the given capacity.
    pub oom: bool,
    /// Record index of its first OOM in the shared run.
    pub oom_at_event: Option<u64>,
}

/// Result.
#[derive(Debug, Clone, Serialize)]
pub struct ColocateReport {
    /// Alignment used.
    pub align: Align,
    /// Capacity checked, bytes (None: unlimited).
    pub capacity: Option<u64>,
    /// Whether every job runs without OOM at the capacity.
    pub fits: bool,
    /// Peak of Σ (reserved + context) over the common time axis, bytes.
    pub combined_peak_bytes: u64,
    /// When the combined peak happens, µs from the common start (None for `worst`).
    pub combined_peak_at_us: Option<f64>,
    /// The smallest capacity, in bytes (2 MiB granularity), at which every job runs without OOM.
    pub smallest_fitting_capacity: u64,
    /// Per job.
    pub jobs: Vec<JobReport>,
    /// Whether the time axis came from trace timestamps (else record indices).
    pub timestamps: bool,
}

const GRANULE: u64 = 2 << 20;

struct Run {
    combined_peak: u64,
    peak_at_us: f64,
    ooms: Vec<Option<u64>>,
}

fn times(job: &Job) -> (Vec<f64>, bool) {
    let first = job.records.iter().find_map(|r| r.ts_ns);
    // A logical clock (the symbolic tracer's event sequence numbers) is not time.
    let logical = job.header.meta("clock") == Some("logical");
    let all = !logical && first.is_some() && job.records.iter().all(|r| r.ts_ns.is_some() || !is_request(r));
    if all {
        let t0 = first.unwrap_or(0);
        let mut last = 0.0;
        let v = job
            .records
            .iter()
            .map(|r| {
                if let Some(t) = r.ts_ns {
                    last = t.saturating_sub(t0) as f64 / 1000.0;
                }
                last
            })
            .collect();
        (v, true)
    } else {
        ((0..job.records.len()).map(|i| i as f64).collect(), false)
    }
}

fn is_request(r: &Record) -> bool {
    matches!(r.event, Event::Alloc(_) | Event::Free(_) | Event::Control(_))
}

fn replayer(job: &Job, opts: &ReplayOptions) -> Result<Replayer, ColocateError> {
    Replayer::new(&job.header, opts.clone()).map_err(|source| ColocateError::Replay { job: job.name.clone(), source })
}

/// Replay every job together on one axis at `capacity`.
fn shared_run(
    jobs: &[Job],
    axes: &[Vec<f64>],
    opts: &ReplayOptions,
    capacity: Option<u64>,
) -> Result<Run, ColocateError> {
    let mut reps = jobs.iter().map(|j| replayer(j, opts)).collect::<Result<Vec<_>, _>>()?;
    let contexts: u64 = jobs.iter().map(|j| j.context).sum();
    let mut next = vec![0usize; jobs.len()];
    let mut reserved = vec![0u64; jobs.len()];
    let (mut combined_peak, mut peak_at_us) = (contexts, 0.0);
    loop {
        // The job whose next record comes first; ties go to the lower job index (deterministic).
        let mut pick: Option<(usize, f64)> = None;
        for (i, axis) in axes.iter().enumerate() {
            if let Some(&t) = axis.get(next[i]) {
                if pick.is_none_or(|(_, pt)| t < pt) {
                    pick = Some((i, t));
                }
            }
        }
        let Some((i, t)) = pick else { break };
        let rec = &jobs[i].records[next[i]];
        next[i] += 1;
        if let Some(c) = capacity {
            let others: u64 = reserved.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, r)| *r).sum();
            reps[i].set_capacity(c.saturating_sub(others).saturating_sub(contexts));
        }
        reps[i].observe(rec);
        reserved[i] = reps[i].current(rec.device.unwrap_or(0)).0;
        let total = reserved.iter().sum::<u64>() + contexts;
        if total > combined_peak {
            combined_peak = total;
            peak_at_us = t;
        }
    }
    Ok(Run { combined_peak, peak_at_us, ooms: reps.iter().map(|r| r.oom_at()).collect() })
}

/// Place the jobs on one GPU of `capacity` bytes (None: only measure).
pub fn colocate(
    jobs: &[Job],
    opts: &ReplayOptions,
    capacity: Option<u64>,
    align: Align,
) -> Result<ColocateReport, ColocateError> {
    if jobs.is_empty() {
        return Err(ColocateError::NoJobs);
    }
    for j in jobs {
        let mut devices: Vec<u32> = j.records.iter().filter(|r| is_request(r)).filter_map(|r| r.device).collect();
        devices.sort_unstable();
        devices.dedup();
        if devices.len() > 1 {
            return Err(ColocateError::MultiDevice { job: j.name.clone(), devices });
        }
    }
    // Each job alone, unlimited: its own peak.
    let mut alone = Vec::with_capacity(jobs.len());
    for j in jobs {
        let mut r = replayer(j, &ReplayOptions { capacity: None, ..opts.clone() })?;
        j.records.iter().for_each(|rec| r.observe(rec));
        alone.push(r.finish().peak_reserved_bytes);
    }
    let worst: u64 = alone.iter().zip(jobs).map(|(p, j)| p + j.context).sum();
    let axes_and_ts: Vec<(Vec<f64>, bool)> = jobs.iter().map(times).collect();
    let timestamps = axes_and_ts.iter().all(|(_, t)| *t);
    let axes: Vec<Vec<f64>> = axes_and_ts.into_iter().map(|(a, _)| a).collect();

    let (combined_peak, peak_at, ooms, smallest) = match align {
        Align::Worst => {
            // No common time axis: a job "OOMs" when the coinciding peaks exceed the capacity.
            let fits = capacity.is_none_or(|c| worst <= c);
            (worst, None, vec![(!fits, None); jobs.len()], worst)
        }
        Align::Start => {
            let measured = shared_run(jobs, &axes, opts, None)?;
            let ooms = match capacity {
                Some(c) => shared_run(jobs, &axes, opts, Some(c))?.ooms.into_iter().map(|o| (o.is_some(), o)).collect(),
                None => vec![(false, None); jobs.len()],
            };
            // Binary search the smallest capacity with no OOM. At the sum of the solo peaks every
            // job always has its own peak available, so that bound fits.
            let lower = alone.iter().zip(jobs).map(|(p, j)| p + j.context).max().unwrap_or(0);
            let (mut lo, mut hi) = (lower.div_ceil(GRANULE), worst.div_ceil(GRANULE).max(lower.div_ceil(GRANULE)));
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                let run = shared_run(jobs, &axes, opts, Some(mid * GRANULE))?;
                if run.ooms.iter().all(Option::is_none) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            (measured.combined_peak, Some(measured.peak_at_us), ooms, hi * GRANULE)
        }
    };
    let fits = ooms.iter().all(|(oom, _)| !oom);
    Ok(ColocateReport {
        align,
        capacity,
        fits,
        combined_peak_bytes: combined_peak,
        combined_peak_at_us: peak_at,
        smallest_fitting_capacity: smallest,
        jobs: jobs
            .iter()
            .zip(&alone)
            .zip(&ooms)
            .map(|((j, p), o)| JobReport {
                name: j.name.clone(),
                peak_reserved_bytes: *p,
                context_bytes: j.context,
                oom: o.0,
                oom_at_event: o.1,
            })
            .collect(),
        timestamps,
    })
}
