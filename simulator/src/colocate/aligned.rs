//! The aligned replay: every job on one wall-clock axis, each allocator given what the others
//! leave free before each of its requests ([`super::Mode::Timestamps`]).

use trace::{metadata, Event, Record};

use crate::replay::{ReplayOptions, Replayer};

use super::{saturating_sum, ColocateError, Job, Start};

pub(super) struct Run {
    pub(super) combined_peak: u64,
    pub(super) peak_at_us: f64,
    pub(super) ooms: Vec<Option<u64>>,
    /// The most device total a job's memory fraction asked for in this run.
    pub(super) fraction_need: u64,
    /// The most the set held when a job's allocation failed, counting the failed request (the
    /// peak never does, since it was never placed), and when: `memsim replay` counts it too.
    failed_need: (u64, f64),
}

impl Run {
    /// What the set needs in this run: what it held together (with a failed request, as it
    /// would have held it), or the device total a job's memory fraction asks for when that is
    /// more.
    pub(super) fn need(&self) -> u64 {
        self.combined_peak.max(self.failed_need.0).max(self.fraction_need)
    }

    /// When the set held what [`Run::need`] counts (µs on the common axis).
    pub(super) fn need_at_us(&self) -> f64 {
        if self.failed_need.0 > self.combined_peak {
            self.failed_need.1
        } else {
            self.peak_at_us
        }
    }
}

/// Whether the set fits at `capacity`: no job ran out of memory, and what the jobs held together
/// never passed the capacity. Both are needed: the segments a snapshot's start state rebuilds are
/// placed as they were, without the allocator's capacity check, so a shared replay can hold more
/// than the capacity with no OOM.
pub(super) fn fits_at(run: &Run, capacity: u64) -> bool {
    run.ooms.iter().all(Option::is_none) && run.combined_peak <= capacity
}

/// The jobs' time axes under one way of lining them up.
pub(super) struct Scenario {
    start: Start,
    axes: Vec<Vec<f64>>,
}

/// The starts the aligned replay tries: together, and (when that differs) with every job's own
/// peak at the latest of their peak times.
pub(super) fn scenarios(
    jobs: &[Job],
    axes: Vec<Vec<f64>>,
    opts: &ReplayOptions,
) -> Result<Vec<Scenario>, ColocateError> {
    let mut peaks = Vec::with_capacity(jobs.len());
    for (j, a) in jobs.iter().zip(&axes) {
        peaks.push(shared_run(std::slice::from_ref(j), std::slice::from_ref(a), opts, None)?.peak_at_us);
    }
    let latest = peaks.iter().copied().fold(0.0, f64::max);
    let shifted = peaks.iter().any(|p| *p != latest).then(|| Scenario {
        start: Start::PeaksAligned,
        axes: axes.iter().zip(&peaks).map(|(a, p)| a.iter().map(|t| t + (latest - p)).collect()).collect(),
    });
    Ok(std::iter::once(Scenario { start: Start::Together, axes }).chain(shifted).collect())
}

/// The aligned replay at `capacity` under every scenario, and the one that decides: the first
/// that does not fit, else the one of the highest need.
pub(super) fn worst(
    jobs: &[Job],
    scenarios: &[Scenario],
    opts: &ReplayOptions,
    capacity: Option<u64>,
) -> Result<(Run, Start), ColocateError> {
    let mut decided: Option<(Run, Start)> = None;
    for sc in scenarios {
        let run = shared_run(jobs, &sc.axes, opts, capacity)?;
        if capacity.is_some_and(|c| !fits_at(&run, c)) {
            return Ok((run, sc.start));
        }
        if decided.as_ref().is_none_or(|(d, _)| run.need() > d.need()) {
            decided = Some((run, sc.start));
        }
    }
    Ok(decided.expect("at least one scenario"))
}

pub(super) fn times(job: &Job) -> (Vec<f64>, bool) {
    let first = job.records.iter().find_map(|r| r.ts_ns);
    // A logical clock (the symbolic tracer's event sequence numbers) is not time.
    let logical = job.header.meta(&metadata::CLOCK).is_some();
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

pub(super) fn is_request(r: &Record) -> bool {
    matches!(r.event, Event::Alloc(_) | Event::Free(_) | Event::Control(_))
}

fn replayer(job: &Job, opts: &ReplayOptions) -> Result<Replayer, ColocateError> {
    Replayer::new(&job.header, opts.clone()).map_err(|source| ColocateError::Replay { job: job.name.clone(), source })
}

/// Replay every job together on one axis at `capacity`.
pub(super) fn shared_run(
    jobs: &[Job],
    axes: &[Vec<f64>],
    opts: &ReplayOptions,
    capacity: Option<u64>,
) -> Result<Run, ColocateError> {
    // A job's memory fraction is of the device's total, whichever job reserves first.
    let opts = &ReplayOptions { device_total: capacity, ..opts.clone() };
    let mut reps = jobs.iter().map(|j| replayer(j, opts)).collect::<Result<Vec<_>, _>>()?;
    let outside = saturating_sum(jobs.iter().map(|j| j.outside.total_bytes));
    let mut next = vec![0usize; jobs.len()];
    let mut reserved = vec![0u64; jobs.len()];
    let (mut combined_peak, mut peak_at_us) = (outside, 0.0);
    let mut failed_need = (0u64, 0.0);
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
        let device = rec.device.unwrap_or(0);
        let others = saturating_sum(reserved.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, r)| *r));
        if let Some(c) = capacity {
            // The replayer leaves its own trace's memory outside the allocator out of this.
            reps[i].set_capacity(c.saturating_sub(others).saturating_sub(outside));
        }
        let failed_before = reps[i].oom_at().is_some();
        reps[i].observe(rec);
        if let (false, Some(n)) = (failed_before, reps[i].oom_need_bytes()) {
            let held = saturating_sum([others, outside, n, reps[i].outside_now(device)]);
            if held > failed_need.0 {
                failed_need = (held, t);
            }
        }
        // What the job holds on the device: its segments, and what its trace holds beside them.
        reserved[i] = reps[i].current(device).0.saturating_add(reps[i].outside_now(device));
        let total = saturating_sum(reserved.iter().copied()).saturating_add(outside);
        if total > combined_peak {
            combined_peak = total;
            peak_at_us = t;
        }
    }
    let fraction_need = reps.iter().map(Replayer::fraction_need_bytes).max().unwrap_or(0);
    let ooms = reps.iter().map(|r| r.oom_at()).collect();
    Ok(Run { combined_peak, peak_at_us, ooms, fraction_need, failed_need })
}
