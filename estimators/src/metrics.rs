//! The field's accuracy metrics, exactly as published (../shared/reference/estimator-baselines.md
//! §2 and §5): xMem's MRE, PEF and MCP, the FakeTensor table's error percentiles, GPUMemNet-style
//! bin accuracy and macro F1, estimation latency, and counts of runs that could not be estimated.

use std::collections::BTreeMap;

use serde::Serialize;

const MIB: f64 = 1024.0 * 1024.0;

/// One run as a metric sees it. Bytes are device-level or reserved-level, the same for truth and
/// estimate: compare only like with like.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Measured peak in bytes; `None` when the run crashed with OOM and no peak is meaningful.
    pub truth: Option<f64>,
    /// The run crashed with OOM on the real device.
    pub real_oom: bool,
    /// The estimate in bytes, or why there is none.
    pub estimate: Result<f64, String>,
    /// Whether the rerun capped at the estimate would have survived, simulated with memsim; `None`
    /// when no trace allows the simulation (then PEF falls back to the labelled proxy).
    pub capped_rerun_ok: Option<bool>,
    /// Seconds the estimator took for this run.
    pub seconds: Option<f64>,
}

/// How PEF's "second run capped at the estimate" was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PefKind {
    /// Every capped rerun was simulated with memsim on the run's trace.
    #[serde(rename = "simulated")]
    Simulated,
    /// At least one run had no trace: "estimate below truth" stood in for the capped rerun. Not
    /// comparable with xMem's published PEF.
    #[serde(rename = "proxy")]
    Proxy,
}

/// Percentiles of a distribution, as in the FakeTensor table.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 80th percentile.
    pub p80: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

/// Bin accuracy at one bin width.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BinScore {
    /// Bin width, GiB.
    pub width_gib: f64,
    /// Fraction of runs whose estimate falls in the truth's bin.
    pub accuracy: f64,
    /// Macro-averaged F1 over the bins present in truth or estimate.
    pub macro_f1: f64,
}

/// All metrics of one estimator over a set of runs. `None` where the metric is undefined (no
/// runs with a truth, ...).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metrics {
    /// Runs given.
    pub runs: usize,
    /// Runs with an estimate.
    pub estimated: usize,
    /// Runs without an estimate, by reason.
    pub not_estimated: BTreeMap<String, usize>,
    /// Estimated runs whose measured truth is 0 (a failed measurement): left out of every
    /// error, of PEF and of MCP.
    pub zero_truth: usize,
    /// Median relative error |M̂−M|/M (xMem's MRE), as a fraction.
    pub mre: Option<f64>,
    /// Median signed relative error (M̂−M)/M.
    pub median_signed: Option<f64>,
    /// Fraction of runs with a truth whose estimate is below it.
    pub under_fraction: Option<f64>,
    /// Percentiles of |relative error| (fractions).
    pub abs_rel: Option<Percentiles>,
    /// Percentiles of |M̂−M| in MiB.
    pub abs_mib: Option<Percentiles>,
    /// Probability of estimation failure, percent (xMem), over the estimated runs with a truth
    /// other than 0 (or a real OOM).
    pub pef: Option<f64>,
    /// How the capped reruns were decided.
    pub pef_kind: PefKind,
    /// Memory conservation potential, GB (10^9 bytes) per run (xMem).
    pub mcp_gb: Option<f64>,
    /// Bin accuracy and macro F1 at 1, 2 and 8 GiB.
    pub bins: Vec<BinScore>,
    /// Estimation latency percentiles, seconds: (P50, P99).
    pub latency_p50_s: Option<f64>,
    /// 99th percentile of latency, seconds.
    pub latency_p99_s: Option<f64>,
}

/// Bin widths the reports use, GiB.
pub const BIN_WIDTHS_GIB: [f64; 3] = [1.0, 2.0, 8.0];

/// The `q`-quantile (0..=1) of sorted values, linear interpolation between closest ranks (numpy's
/// default), so a median of an even count is the mean of the middle two.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64))
}

/// Percentiles of unsorted values.
pub fn percentiles(values: &[f64]) -> Option<Percentiles> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    let q = |p| quantile(&v, p);
    Some(Percentiles { p50: q(0.5)?, p80: q(0.8)?, p90: q(0.9)?, p95: q(0.95)?, p99: q(0.99)?, max: *v.last()? })
}

/// GPUMemNet's right-closed bin of a value in MiB: (0, w] is 0, (w, 2w] is 1, ...
pub fn bin_of(mib: f64, width_mib: f64) -> i64 {
    ((mib / width_mib).ceil() as i64 - 1).max(0)
}

/// Accuracy and macro F1 of predicted vs true classes; `None` for no pairs.
pub fn accuracy_f1(pairs: &[(i64, i64)]) -> Option<(f64, f64)> {
    if pairs.is_empty() {
        return None;
    }
    let correct = pairs.iter().filter(|(t, p)| t == p).count();
    let mut classes: Vec<i64> = pairs.iter().flat_map(|&(t, p)| [t, p]).collect();
    classes.sort_unstable();
    classes.dedup();
    let f1_sum: f64 = classes
        .iter()
        .map(|&c| {
            let tp = pairs.iter().filter(|&&(t, p)| t == c && p == c).count() as f64;
            let fp = pairs.iter().filter(|&&(t, p)| t != c && p == c).count() as f64;
            let fne = pairs.iter().filter(|&&(t, p)| t == c && p != c).count() as f64;
            if tp == 0.0 {
                0.0
            } else {
                2.0 * tp / (2.0 * tp + fp + fne)
            }
        })
        .sum();
    Some((correct as f64 / pairs.len() as f64, f1_sum / classes.len() as f64))
}

/// Compute every metric for one estimator. `total_gpu` is the device's memory in bytes: an
/// estimate above it predicts OOM, and MCP counts savings against it.
pub fn compute(runs: &[Run], total_gpu: f64) -> Metrics {
    let mut not_estimated: BTreeMap<String, usize> = BTreeMap::new();
    let mut rel = Vec::new();
    let mut signed = Vec::new();
    let mut abs_mib = Vec::new();
    let mut under = 0usize;
    let mut zero_truth = 0usize;
    let mut latency = Vec::new();
    let mut failures = 0usize;
    let mut saved = 0.0;
    let mut estimated = 0usize;
    let mut proxy = false;
    let mut bin_pairs: Vec<Vec<(i64, i64)>> = vec![Vec::new(); BIN_WIDTHS_GIB.len()];
    for r in runs {
        let est = match &r.estimate {
            Ok(e) => *e,
            Err(why) => {
                *not_estimated.entry(why.clone()).or_default() += 1;
                continue;
            }
        };
        estimated += 1;
        if let Some(s) = r.seconds {
            latency.push(s);
        }
        // A measured peak of 0 is a failed measurement (nvidia-smi never shows less than the
        // context), not a run that fitted in nothing: no error, PEF or MCP rests on it.
        if !r.real_oom && r.truth.is_some_and(|t| t <= 0.0) {
            zero_truth += 1;
            continue;
        }
        let predicted_oom = est > total_gpu;
        // xMem: accurate = (no real OOM, none predicted, capped rerun survives) or (real OOM predicted).
        let accurate = if r.real_oom {
            predicted_oom
        } else {
            let rerun_ok = match (r.capped_rerun_ok, r.truth) {
                (Some(ok), _) => ok,
                (None, Some(t)) => {
                    proxy = true;
                    est >= t
                }
                (None, None) => {
                    proxy = true;
                    false
                }
            };
            !predicted_oom && rerun_ok
        };
        if accurate {
            saved += if r.real_oom { total_gpu } else { total_gpu - est };
        } else {
            failures += 1;
            saved -= total_gpu;
        }
        let Some(t) = r.truth.filter(|_| !r.real_oom) else { continue };
        rel.push((est - t).abs() / t);
        signed.push((est - t) / t);
        abs_mib.push((est - t).abs() / MIB);
        if est < t {
            under += 1;
        }
        for (i, w) in BIN_WIDTHS_GIB.iter().enumerate() {
            let wm = w * 1024.0;
            bin_pairs[i].push((bin_of(t / MIB, wm), bin_of(est / MIB, wm)));
        }
    }
    let judged = estimated - zero_truth;
    let median = |v: &[f64]| percentiles(v).map(|p| p.p50);
    let lat = percentiles(&latency);
    Metrics {
        runs: runs.len(),
        estimated,
        not_estimated,
        zero_truth,
        mre: median(&rel),
        median_signed: median(&signed),
        under_fraction: (!rel.is_empty()).then(|| under as f64 / rel.len() as f64),
        abs_rel: percentiles(&rel),
        abs_mib: percentiles(&abs_mib),
        pef: (judged > 0).then(|| failures as f64 / judged as f64 * 100.0),
        pef_kind: if proxy { PefKind::Proxy } else { PefKind::Simulated },
        mcp_gb: (judged > 0).then(|| saved / judged as f64 / 1e9),
        bins: BIN_WIDTHS_GIB
            .iter()
            .zip(&bin_pairs)
            .filter_map(|(w, pairs)| {
                accuracy_f1(pairs).map(|(accuracy, macro_f1)| BinScore { width_gib: *w, accuracy, macro_f1 })
            })
            .collect(),
        latency_p50_s: lat.map(|p| p.p50),
        latency_p99_s: lat.map(|p| p.p99),
    }
}
