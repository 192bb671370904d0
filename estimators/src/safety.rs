//! The safe number: an upper bound on a job's device memory with a stated miss rate, fitted by
//! split conformal prediction on measured runs, per model family.
//!
//! For a run with point estimate p (reserved part r) and measured truth t, the score is
//! (t − p)/s, with the scale s either p itself or r: how far above the point the truth lies, per
//! unit of what is uncertain. On n calibration runs, the ⌈(n+1)(1−α)⌉-th smallest score q bounds
//! the score of a new exchangeable run with probability at least 1−α (Vovk et al.; Lei et al.
//! 2018, "Distribution-free predictive inference for regression"), so safe = p + q·s is under the
//! truth in at most α of runs of that family. Both scales keep the guarantee; the one with the
//! smaller median over-reservation *on the calibration split* is kept (MLP memory is mostly the
//! calibrated constant outside the allocator, so its error scales with the total; CNN errors come
//! from the allocator part, cuDNN workspaces, so they scale with the reserved peak). The margin is fitted on one split of the runs and
//! its miss rate measured on the other; runs the profile's outside-allocator constants were fitted
//! on are left out of both, so neither figure is in-sample.

use std::collections::BTreeMap;

use serde::Serialize;
use simulator::fit::{outside_mib, Libraries};
use simulator::profile::{FamilyMargin, OutsideAllocator, Profile, Safety};

use crate::calibrate::{split_by_id, without_tables};
use crate::compare::RunRecord;
use crate::error::{EstimateError, Result};
use crate::rows::RowSet;

const MIB: f64 = 1024.0 * 1024.0;

/// A run as the safety fit needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct SafetyRun {
    /// Row id.
    pub id: String,
    /// `mlp`, `cnn` or `transformer`.
    pub family: String,
    /// Measured device peak, bytes.
    pub truth: f64,
    /// Symbolic point estimate (device level), bytes.
    pub point: f64,
    /// Its reserved (allocator) part, bytes.
    pub reserved: f64,
}

/// Why a run record was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Skip {
    /// No truth (unlabelled), a zero label, or a real OOM crash.
    NoTruth,
    /// No symbolic estimate.
    NoEstimate,
    /// The profile's outside-allocator constants were fitted on it.
    CalibratedOn,
}

impl Skip {
    /// The reason as JSON writes it (`no_truth`, `no_estimate`, `calibrated_on`): the text says
    /// the same words, not the Rust name.
    pub fn name(self) -> &'static str {
        match self {
            Skip::NoTruth => "no_truth",
            Skip::NoEstimate => "no_estimate",
            Skip::CalibratedOn => "calibrated_on",
        }
    }
}

impl SafetyRun {
    /// From a comparison's run record, or why not; `calibrated` are the rows the profile's
    /// outside-allocator constants were fitted on ([`crate::calibrate::calibrated_rows`]).
    pub fn from_record(r: &RunRecord, calibrated: &RowSet) -> std::result::Result<SafetyRun, Skip> {
        if r.in_calibration(calibrated) {
            return Err(Skip::CalibratedOn);
        }
        let truth = r.truth_bytes.filter(|t| !r.real_oom && *t > 0.0).ok_or(Skip::NoTruth)?;
        let sym = r.estimates.get("symbolic").ok_or(Skip::NoEstimate)?;
        let (point, reserved) = sym.device_bytes.zip(sym.reserved_bytes).ok_or(Skip::NoEstimate)?;
        Ok(SafetyRun {
            id: r.id.clone(),
            family: r.family.to_ascii_lowercase(),
            truth,
            point: point as f64,
            reserved: reserved as f64,
        })
    }

    fn scale(&self, scale: &str) -> f64 {
        // A zero scale divides into an infinite margin; `read_runs` refuses a zero point, and
        // a run built otherwise gets the same one-byte floor as the reserved peak.
        if scale == "reserved" {
            self.reserved.max(1.0)
        } else {
            self.point.max(1.0)
        }
    }

    fn score(&self, scale: &str) -> f64 {
        (self.truth - self.point) / self.scale(scale)
    }

    fn safe(&self, scale: &str, margin: f64) -> f64 {
        self.point + margin * self.scale(scale)
    }
}

/// The scales a margin may multiply.
pub const SCALES: [&str; 2] = ["point", "reserved"];

/// The split-conformal quantile of `scores` for miss rate `alpha`: the ⌈(n+1)(1−α)⌉-th smallest.
/// With too few runs for that rank (n < 1/α − 1) the largest score is returned and `exact` is
/// false: the guarantee then does not hold.
pub fn conformal_quantile(scores: &[f64], alpha: f64) -> Option<(f64, bool)> {
    if scores.is_empty() {
        return None;
    }
    let mut v = scores.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let k = ((n as f64 + 1.0) * (1.0 - alpha)).ceil() as usize;
    Some(if k <= n { (v[k - 1], true) } else { (v[n - 1], false) })
}

/// One family's fit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FamilyFit {
    /// The margin and its held-out figures, as the profile stores them.
    pub margin: FamilyMargin,
    /// Whether the calibration split was large enough for the finite-sample guarantee.
    pub exact: bool,
    /// Median over-reservation on the calibration split, by scale: how the scale was chosen.
    pub calibration_median_over: BTreeMap<String, f64>,
}

/// The whole fit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SafetyFit {
    /// By family.
    pub families: BTreeMap<String, FamilyFit>,
    /// Records not used, by reason.
    pub skipped: BTreeMap<Skip, usize>,
    /// Families with runs too few to fit a margin on their calibration split.
    pub too_few: Vec<String>,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Fit a margin per family on `1 − held_out` of the runs and measure it on the rest, leaving out
/// the runs `calibrated` names (or that were marked `calibrated_on`).
pub fn fit(
    records: &[RunRecord],
    calibrated: &RowSet,
    alpha: f64,
    held_out: f64,
    seed: u64,
    regime: &str,
) -> Result<SafetyFit> {
    let mut skipped: BTreeMap<Skip, usize> = BTreeMap::new();
    let mut by_family: BTreeMap<String, Vec<SafetyRun>> = BTreeMap::new();
    for r in records {
        match SafetyRun::from_record(r, calibrated) {
            Ok(run) => by_family.entry(run.family.clone()).or_default().push(run),
            Err(why) => *skipped.entry(why).or_default() += 1,
        }
    }
    if by_family.is_empty() {
        return Err(EstimateError::Calibration(
            "no run has both a measured truth and a symbolic estimate (and was not calibrated on)".into(),
        ));
    }
    let mut families = BTreeMap::new();
    let mut too_few = Vec::new();
    for (family, runs) in by_family {
        let (cal, test) = split_by_id(&runs, |r| &r.id, held_out, seed);
        // Each scale's margin on the calibration split, and its median over-reservation there.
        let mut options = Vec::new();
        for scale in SCALES {
            let scores: Vec<f64> = cal.iter().map(|r| r.score(scale)).collect();
            let Some((q, exact)) = conformal_quantile(&scores, alpha) else { continue };
            let margin = q.max(0.0);
            let over = median(cal.iter().map(|r| (r.safe(scale, margin) - r.truth) / r.truth).collect());
            options.push((scale, margin, exact, over));
        }
        let Some(&(scale, margin, exact, _)) = options.iter().min_by(|a, b| a.3.total_cmp(&b.3)) else {
            too_few.push(family);
            continue;
        };
        let n = test.len().max(1) as f64;
        let misses = test.iter().filter(|r| r.safe(scale, margin) < r.truth).count();
        families.insert(
            family,
            FamilyFit {
                margin: FamilyMargin {
                    regime: regime.to_string(),
                    margin,
                    scale: scale.to_string(),
                    calibration_runs: cal.len() as u64,
                    held_out_runs: test.len() as u64,
                    held_out_miss_rate: misses as f64 / n,
                    held_out_median_over: median(
                        test.iter().map(|r| (r.safe(scale, margin) - r.truth) / r.truth).collect(),
                    ),
                    held_out_point_mre: median(test.iter().map(|r| (r.point - r.truth).abs() / r.truth).collect()),
                },
                exact,
                calibration_median_over: options.iter().map(|o| (o.0.to_string(), o.3)).collect(),
            },
        );
    }
    if families.is_empty() {
        return Err(EstimateError::Calibration(format!(
            "no family has enough calibration runs to fit a margin ({} left too few by the held-out share)",
            too_few.join(", ")
        )));
    }
    Ok(SafetyFit { families, skipped, too_few })
}

/// The regime a margin fitted on `records` is of (`"fp32 adam"`: precision, then optimizer), and
/// warnings: from `given` (`--regime`) when given, warned where the runs record another; else
/// from what the runs record, with the runs that record nothing (an older `runs.jsonl`) assumed
/// fp32 Adam, GPUMemNet's regime, and said to be.
pub fn regime(records: &[RunRecord], given: Option<&str>) -> (String, Vec<String>) {
    let mut seen = BTreeMap::<String, usize>::new();
    let mut unrecorded = 0usize;
    for r in records {
        match &r.optimizer {
            Some(o) => *seen.entry(format!("{} {o}", r.amp.as_deref().unwrap_or("fp32"))).or_default() += 1,
            None => unrecorded += 1,
        }
    }
    let n = records.len();
    let list =
        |seen: &BTreeMap<String, usize>| seen.iter().map(|(k, c)| format!("{c} {k}")).collect::<Vec<_>>().join(", ");
    let mut w = Vec::new();
    if let Some(g) = given {
        let other: usize = seen.iter().filter(|(k, _)| *k != g).map(|(_, c)| c).sum();
        if other > 0 {
            w.push(format!(
                "--regime {g:?}: {other} of {n} runs record another regime ({}): the margin is labelled {g:?} all the same",
                list(&seen)
            ));
        }
        return (g.to_string(), w);
    }
    if unrecorded > 0 {
        *seen.entry("fp32 adam".into()).or_default() += unrecorded;
        w.push(format!(
            "{unrecorded} of {n} runs do not record their optimizer and precision (runs.jsonl of an older memest): \
             their regime is assumed to be fp32 adam (GPUMemNet's); give --regime to say what it was"
        ));
    }
    let regime = seen.keys().cloned().collect::<Vec<_>>().join(" / ");
    if seen.len() > 1 {
        w.push(format!("the runs mix regimes ({}): one margin per family is fitted over them all", list(&seen)));
    }
    (if regime.is_empty() { "fp32 adam".into() } else { regime }, w)
}

/// The runs of `records` estimated with the profile of another GPU than `profile`'s (named
/// `name`), as one warning saying that `fitted` (what the caller fits: "a margin", "constants")
/// fitted on them is not `name`'s; the one check of `memest safety` and `memest calibrate`.
pub fn another_gpu(records: &[RunRecord], profile: &Profile, name: &str, fitted: &str) -> Option<String> {
    let mut gpus = BTreeMap::<String, usize>::new();
    for e in records.iter().filter_map(|r| r.estimated_with.as_ref()) {
        if !e.gpu.trim().eq_ignore_ascii_case(profile.gpu.name.trim()) {
            *gpus.entry(format!("{} ({})", e.profile, e.gpu.trim())).or_default() += 1;
        }
    }
    (!gpus.is_empty()).then(|| {
        let list: Vec<String> = gpus.iter().map(|(p, k)| format!("{k} with {p}")).collect();
        format!(
            "{} of {} runs were estimated with the profile of another GPU than {name}'s ({}) ({}): {fitted} \
             fitted on them is not {name}'s; compare the runs with --profile {name} first",
            gpus.values().sum::<usize>(),
            records.len(),
            profile.gpu.name.trim(),
            list.join(", ")
        )
    })
}

/// What a margin fitted on `records` for `profile` (named `name`) would not share with it, each
/// as a warning: runs estimated on another GPU's profile, or with other outside-allocator
/// constants than the profile has now (the margin would be of points it no longer gives). The
/// constants are compared by the terms each run's point adds (its own libraries and ranks), not
/// as a whole: a cuDNN or NCCL constant a run never loads does not change its point. A run of an
/// older `runs.jsonl`, which does not record its profile, is judged by the memory its symbolic
/// point holds outside the allocator, where that can tell.
pub fn estimated_otherwise(records: &[RunRecord], profile: &Profile, name: &str) -> Vec<String> {
    let mut out: Vec<String> = another_gpu(records, profile, name, "a margin").into_iter().collect();
    let (mut unknown, mut unknown_runs) = (BTreeMap::<String, usize>::new(), 0usize);
    let (mut constants, mut unranked, mut unrecorded, mut above, mut most_above) =
        (0usize, 0usize, 0usize, 0usize, 0.0f64);
    let now = &profile.outside_allocator;
    let nccl = |o: &OutsideAllocator| (o.nccl_communicator_mib, o.nccl_per_peer_mib);
    for r in records {
        let libs = Libraries::single(r.uses_gemm, r.uses_conv, "runs");
        match &r.estimated_with {
            // Said by `another_gpu`.
            Some(e) if !e.gpu.trim().eq_ignore_ascii_case(profile.gpu.name.trim()) => {}
            Some(e) => {
                let newer: Vec<&String> =
                    e.unknown_constants.iter().filter(|(_, v)| v.as_f64() != Some(0.0)).map(|(k, _)| k).collect();
                newer.iter().for_each(|k| *unknown.entry(k.to_string()).or_default() += 1);
                unknown_runs += usize::from(!newer.is_empty());
                let libs = Libraries { ranks: e.ranks.unwrap_or(1), ..libs };
                constants += usize::from(outside_mib(&e.outside_allocator, libs) != outside_mib(now, libs));
                // Without its ranks the run is judged as one process, whose point has no NCCL term.
                unranked += usize::from(e.ranks.is_none() && nccl(&e.outside_allocator) != nccl(now));
            }
            None => {
                unrecorded += 1;
                let sym = r.estimates.get("symbolic");
                if let Some((point, reserved)) = sym.and_then(|o| o.device_bytes.zip(o.reserved_bytes)) {
                    // The point holds at least the terms of its libraries for one rank; more where
                    // its trace held memory outside the allocator, set a memory fraction, or ran
                    // several ranks, which this record does not say. Less: smaller constants.
                    let over = point.saturating_sub(reserved) as f64 / MIB - outside_mib(now, libs);
                    constants += usize::from(over < -0.5);
                    if over > 0.5 {
                        above += 1;
                        most_above = most_above.max(over);
                    }
                }
            }
        }
    }
    let n = records.len();
    if constants > 0 {
        out.push(format!(
            "{constants} of {n} runs were estimated with other [outside_allocator] constants than {name} has now \
             for the libraries and ranks they load (context {:.1}, cuBLAS {:.1}, cuDNN {:.1}, NCCL {:.1} + {:.1} \
             per peer MiB): their points are not the ones {name} gives, so a margin fitted on them does not bound \
             its safe number; compare the runs again with --profile {name}",
            now.context_mib, now.cublas_mib, now.cudnn_mib, now.nccl_communicator_mib, now.nccl_per_peer_mib
        ));
    }
    if unranked > 0 {
        out.push(format!(
            "{unranked} of {n} runs do not record their ranks and were estimated with other NCCL constants than \
             {name} has now: they are judged as single processes, whose points hold no NCCL term; any of several \
             ranks among them has other points than {name} gives"
        ));
    }
    if !unknown.is_empty() {
        let list: Vec<String> = unknown.iter().map(|(k, c)| format!("{k} in {c}")).collect();
        out.push(format!(
            "{unknown_runs} of {n} runs record [outside_allocator] constants this memest does not know ({}; a \
             newer memest's): those are not compared with {name}'s, so a point they changed is not said",
            list.join(", ")
        ));
    }
    if above > 0 {
        out.push(format!(
            "{above} of {n} runs of an older memest hold more outside the allocator than {name}'s constants give \
             one process loading their libraries (up to {most_above:.1} MiB more): memory their trace held there, \
             a memory fraction, more ranks, or larger constants; their records cannot tell which, so their \
             constants are not checked against {name}'s"
        ));
    }
    if unrecorded > 0 {
        out.push(format!(
            "{unrecorded} of {n} runs do not record the profile they were estimated with (runs.jsonl of an older \
             memest): their GPU is not checked against {name}'s"
        ));
    }
    out
}

/// The profile's `[safety]` table for a fit.
pub fn table(fit: &SafetyFit, alpha: f64, runs: &str, method: &str, licence: &str) -> Safety {
    Safety {
        miss_rate: alpha,
        method: method.to_string(),
        fitted_by: "memest safety".into(),
        runs: runs.to_string(),
        data_licence: licence.to_string(),
        families: fit.families.iter().map(|(k, f)| (k.clone(), f.margin.clone())).collect(),
    }
}

/// Rewrite a profile's text with a new `[safety]` table (and its subtables), every other line kept.
pub fn rewrite_safety(text: &str, safety: &Safety) -> std::result::Result<String, String> {
    let mut out = without_tables(text, "safety");
    #[derive(Serialize)]
    struct Wrap<'a> {
        safety: &'a Safety,
    }
    let table = toml::to_string(&Wrap { safety }).map_err(|e| e.to_string())?;
    out.push('\n');
    out.push_str(
        "# Safety margins (memest safety): safe = point + margin x scale (the point or the reserved peak),\n\
         # fitted by split conformal prediction per family on runs the [outside_allocator]\n\
         # calibration did not use; held_out_* are measured on runs the margin was not fitted on.\n",
    );
    out.push_str(&table);
    Ok(out)
}
