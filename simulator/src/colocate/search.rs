//! The searches for the smallest capacity that fits: a set of jobs together, or one job alone.

use crate::fit::{self, Capacity, Verdict};
use crate::replay::ReplayOptions;

use super::aligned::{fits_at, worst, Scenario};
use super::{ColocateError, Job};

/// The smallest capacity, in bytes, in `[lo, hi]` at which the aligned replay fits; `hi` must
/// fit.
pub(super) fn smallest(
    jobs: &[Job],
    sc: &[Scenario],
    opts: &ReplayOptions,
    lo: u64,
    hi: u64,
) -> Result<u64, ColocateError> {
    least_fitting(lo, hi, |c| Ok(fits_at(&worst(jobs, sc, opts, Some(c))?.0, c)))
}

/// Bisection, in bytes, for the least of `[lo, hi]` that `fits` (`hi` is taken to fit). Fitting
/// is not quite monotone in the capacity (the allocator's retry chain), so the answer is checked
/// against the verdict at the capacity asked about by the caller.
pub(super) fn least_fitting(
    mut lo: u64,
    mut hi: u64,
    mut fits: impl FnMut(u64) -> Result<bool, ColocateError>,
) -> Result<u64, ColocateError> {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(hi)
}

/// A job alone on a device of a given capacity.
#[derive(Debug, Clone, Copy)]
pub(super) struct Alone {
    /// Whether it fits.
    pub fits: bool,
    /// Its need there (its replay at the allocator budget the capacity leaves, judged on the
    /// point or the safe number).
    pub need: u64,
    /// What it holds at its peak there: reserved + outside the allocator (with its margin
    /// unless the point): its term of a sum of peaks at that capacity.
    pub held: u64,
    /// The device total its memory fraction asks for there (with its margin unless the
    /// point); 0 without one: a floor under a sum, never a term of it.
    pub fraction: u64,
}

/// A job alone on a device of `capacity`.
pub(super) fn alone_at(j: &Job, opts: &ReplayOptions, c: Capacity, point: bool) -> Result<Alone, ColocateError> {
    let opts = &ReplayOptions { device_total: Some(c.bytes), ..opts.clone() };
    let alone = fit::fit_records(&j.header, &j.records, opts, Some(j.outside.budget(c.bytes)))
        .map_err(|source| ColocateError::Replay { job: j.name.clone(), source })?;
    let need = if point { alone.device_peak(&j.outside) } else { alone.device_safe(&j.outside, &j.margin) };
    let reserved = alone.reserved_need();
    let with_margin = |b: u64| if point || b == 0 { b } else { j.margin.safe(b, reserved) };
    Ok(Alone {
        fits: !alone.first_oom.oom && Verdict::new("alone", need, c).fits,
        need,
        held: with_margin(reserved.saturating_add(alone.beside(&j.outside))),
        fraction: with_margin(alone.report.fraction_need_bytes),
    })
}

/// What a set of jobs needs on a device of a given capacity when their peaks may coincide: the
/// sum of what each holds at its peak replayed alone at that capacity, or the device total the
/// largest of their memory fractions asks for there when that is more. A job that meets the
/// device full frees its own cache and retries, as PyTorch's allocator does, so it never holds
/// more than it does alone at that capacity, and while the sum fits no job waits on another's
/// cache.
pub(super) fn sum_of(alone: &[Alone]) -> u64 {
    let held = super::saturating_sum(alone.iter().map(|a| a.held));
    alone.iter().map(|a| a.fraction).fold(held, u64::max)
}

/// Whether the set fits at `capacity` with their peaks coinciding: each job alone, and
/// [`sum_of`] them.
fn sum_fits_at(jobs: &[Job], opts: &ReplayOptions, capacity: u64, point: bool) -> Result<bool, ColocateError> {
    let c = Capacity { bytes: capacity, source: fit::CapacitySource::Flag };
    let alone = jobs.iter().map(|j| alone_at(j, opts, c, point)).collect::<Result<Vec<_>, _>>()?;
    Ok(alone.iter().all(|a| a.fits) && sum_of(&alone) <= capacity)
}

/// The smallest capacity, in bytes, in `[lo, hi]` at which the set fits with their peaks
/// coinciding ([`sum_of`]); `hi` must fit.
pub(super) fn smallest_sum(
    jobs: &[Job],
    opts: &ReplayOptions,
    point: bool,
    lo: u64,
    hi: u64,
) -> Result<u64, ColocateError> {
    least_fitting(lo, hi, |c| sum_fits_at(jobs, opts, c, point))
}

/// The smallest capacity, in bytes, at which a job fits alone, up to `upper` (its need with
/// unlimited memory, which fits unless a request no device holds fails: then `upper`, where the
/// verdict beside it says DOES NOT FIT).
pub(super) fn smallest_alone(j: &Job, opts: &ReplayOptions, point: bool, upper: u64) -> Result<u64, ColocateError> {
    let least = least_fitting(1, upper.max(1), |bytes| {
        Ok(alone_at(j, opts, Capacity { bytes, source: fit::CapacitySource::Flag }, point)?.fits)
    })?;
    Ok(least.min(upper))
}
