//! Batch comparison: every estimator on every run, then the metrics per estimator and family.
//! One run's failure is recorded in its row, never fatal.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use simulator::alloc::TorchVersion;
use simulator::profile::Profile;

use crate::analytic::{analytic, horus_bytes, Optimizer, Precision};
use crate::dataset::DatasetRow;
use crate::error::chain;
use crate::features::Family;
use crate::metrics::{self, Metrics};
use crate::symbolic::{capped_rerun_ok, symbolic};
use crate::tracefile::LoadedTrace;

/// Estimators in report order.
pub const ESTIMATORS: [&str; 6] = ["horus", "analytic", "fake_tensor", "live_peak", "symbolic", "ml"];

/// One estimator's answer for one run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// The estimate compared with device-level truth, bytes.
    pub device_bytes: Option<u64>,
    /// The allocator-level estimate, where the estimator has one.
    pub reserved_bytes: Option<u64>,
    /// Why there is no estimate.
    pub error: Option<String>,
    /// Estimation latency, seconds (trace generation included for trace-based estimators).
    pub seconds: Option<f64>,
    /// The memsim-simulated rerun capped at the estimate survived.
    pub capped_rerun_ok: Option<bool>,
}

impl Outcome {
    fn failed(why: impl Into<String>) -> Outcome {
        Outcome { error: Some(why.into()), ..Outcome::default() }
    }
}

/// One run with every estimator's answer; a line of `runs.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Row id.
    pub id: String,
    /// Generator configuration (`Filename`).
    pub filename: String,
    /// Family name.
    pub family: String,
    /// Batch size.
    pub batch: u64,
    /// Measured device-level peak, bytes.
    pub truth_bytes: Option<f64>,
    /// The run crashed with OOM.
    pub real_oom: bool,
    /// The model runs GEMMs (cuBLAS loaded).
    pub uses_gemm: bool,
    /// The model runs convolutions (cuDNN loaded).
    pub uses_conv: bool,
    /// By estimator name.
    pub estimates: BTreeMap<String, Outcome>,
}

/// What every run shares.
pub struct EvalContext<'a> {
    /// The GPU profile.
    pub profile: &'a Profile,
    /// Allocator version of the profile.
    pub version: TorchVersion,
    /// Optimizer of the runs (GPUMemNet: Adam).
    pub optimizer: Optimizer,
    /// Precision of the runs (GPUMemNet: fp32).
    pub precision: Precision,
}

/// A trace (or why there is none) and the seconds it took to make.
pub type TraceInput<'a> = Result<(&'a Path, f64), String>;

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed().as_secs_f64())
}

/// Evaluate every estimator (except ML, which the caller adds) on one row.
pub fn evaluate_row(row: &DatasetRow, trace: TraceInput, plain: TraceInput, ctx: &EvalContext) -> RunRecord {
    let f = &row.features;
    // Rows whose layer list is empty (torchsummary failed upstream) still ran their generator's convolutions.
    let uses_conv = f.uses_conv() || row.family == Family::Cnn;
    let loaded = trace.map(|(p, s)| (LoadedTrace::load(p).map_err(|e| chain(&e)), s));
    // The tracer's workspace allocation is direct evidence of a GEMM; layer types are the fallback.
    let uses_gemm = f.uses_gemm() || matches!(&loaded, Ok((Ok(t), _)) if t.has_workspace());
    let outside = ctx.profile.outside_allocator_bytes(uses_gemm, uses_conv);
    let mut est = BTreeMap::new();

    let (h, s) = timed(|| horus_bytes(f.total_activations, row.batch, f.total_parameters));
    est.insert(
        "horus".into(),
        Outcome { device_bytes: Some(h.min(u64::MAX as u128) as u64), seconds: Some(s), ..Outcome::default() },
    );
    let (a, s) = timed(|| analytic(f, row.batch, ctx.optimizer, ctx.precision, ctx.profile));
    est.insert(
        "analytic".into(),
        Outcome {
            device_bytes: Some(a.device),
            reserved_bytes: Some(a.reserved),
            seconds: Some(s),
            ..Outcome::default()
        },
    );

    match &loaded {
        Err(why) => {
            for k in ["live_peak", "symbolic"] {
                est.insert(k.into(), Outcome::failed(format!("no trace: {why}")));
            }
        }
        Ok((Err(why), _)) => {
            for k in ["live_peak", "symbolic"] {
                est.insert(k.into(), Outcome::failed(why.clone()));
            }
        }
        Ok((Ok(t), trace_s)) => {
            let (lp, s) = timed(|| t.live_peak());
            est.insert(
                "live_peak".into(),
                Outcome { device_bytes: Some(lp), seconds: Some(trace_s + s), ..Outcome::default() },
            );
            let (sym, s) = timed(|| symbolic(t, ctx.profile, ctx.version, uses_gemm, uses_conv));
            est.insert(
                "symbolic".into(),
                match sym {
                    Ok(e) => Outcome {
                        device_bytes: Some(e.predicted_device_peak),
                        reserved_bytes: Some(e.predicted_reserved_peak),
                        seconds: Some(trace_s + s),
                        ..Outcome::default()
                    },
                    Err(e) => Outcome::failed(chain(&e)),
                },
            );
        }
    }
    est.insert(
        "fake_tensor".into(),
        match plain {
            Err(why) => Outcome::failed(format!("no plain-meta trace: {why}")),
            Ok((p, trace_s)) => match LoadedTrace::load(p) {
                Err(e) => Outcome::failed(chain(&e)),
                Ok(pt) if !pt.is_plain_meta() => {
                    Outcome::failed(format!("{}: not a plain-meta trace (cuda_emulation is not false)", p.display()))
                }
                Ok(pt) => {
                    let (v, s) = timed(|| pt.forward_backward_peak());
                    Outcome { device_bytes: Some(v), seconds: Some(trace_s + s), ..Outcome::default() }
                }
            },
        },
    );
    // xMem's capped rerun, simulated on the symbolic trace for every estimator that answered.
    if let Ok((Ok(t), _)) = &loaded {
        for o in est.values_mut() {
            if let Some(d) = o.device_bytes {
                o.capped_rerun_ok = capped_rerun_ok(t, ctx.version, d, outside).ok();
            }
        }
    }
    RunRecord {
        id: row.id.clone(),
        filename: row.filename.clone(),
        family: row.family.as_str().to_string(),
        batch: row.batch,
        truth_bytes: row.truth,
        real_oom: row.real_oom,
        uses_gemm,
        uses_conv,
        estimates: est,
    }
}

/// Metrics of one estimator over one group, with PEF both simulated and as the labelled proxy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupMetrics {
    /// Estimator.
    pub estimator: String,
    /// Family name or `all`.
    pub group: String,
    /// Metrics with PEF from memsim-simulated capped reruns where traces exist.
    pub metrics: Metrics,
    /// PEF with "estimate below truth" as the capped rerun (a proxy; not comparable with xMem).
    pub pef_proxy: Option<f64>,
}

/// The metrics input of one estimator's outcome on one run.
pub fn metric_run(r: &RunRecord, estimator: &str) -> metrics::Run {
    let o = r.estimates.get(estimator);
    metrics::Run {
        truth: r.truth_bytes,
        real_oom: r.real_oom,
        estimate: match o {
            None => Err("estimator not run".to_string()),
            Some(o) => match (o.device_bytes, &o.error) {
                (Some(d), _) => Ok(d as f64),
                (None, Some(e)) => Err(reason_class(e)),
                (None, None) => Err("no estimate".to_string()),
            },
        },
        capped_rerun_ok: o.and_then(|o| o.capped_rerun_ok),
        seconds: o.and_then(|o| o.seconds),
    }
}

/// Group long error messages into a reason class for the count table (the first clause, without
/// run-specific paths and numbers).
pub fn reason_class(e: &str) -> String {
    // Drop embedded JSON objects (the trainer quotes the whole config) and digits.
    let mut depth = 0usize;
    let mut cleaned = String::new();
    for c in e.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            _ if depth > 0 => {}
            c if c.is_ascii_digit() => cleaned.push('#'),
            c => cleaned.push(c),
        }
    }
    cleaned.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(140).collect()
}

/// Metrics for every estimator present, per family and over all runs.
pub fn aggregate(records: &[RunRecord], total_gpu: f64) -> Vec<GroupMetrics> {
    let mut groups: Vec<String> = records.iter().map(|r| r.family.clone()).collect();
    groups.sort();
    groups.dedup();
    groups.insert(0, "all".into());
    let mut out = Vec::new();
    for est in ESTIMATORS {
        if !records.iter().any(|r| r.estimates.contains_key(est)) {
            continue;
        }
        for g in &groups {
            let runs: Vec<metrics::Run> =
                records.iter().filter(|r| g == "all" || &r.family == g).map(|r| metric_run(r, est)).collect();
            let proxy: Vec<metrics::Run> =
                runs.iter().cloned().map(|r| metrics::Run { capped_rerun_ok: None, ..r }).collect();
            out.push(GroupMetrics {
                estimator: est.to_string(),
                group: g.clone(),
                metrics: metrics::compute(&runs, total_gpu),
                pef_proxy: metrics::compute(&proxy, total_gpu).pef,
            });
        }
    }
    out
}
