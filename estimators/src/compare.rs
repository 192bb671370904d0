//! Batch comparison: every estimator on every run, then the metrics per estimator and family.
//! One run's failure is recorded in its row, never fatal.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use simulator::alloc::TorchVersion;
use simulator::fit::{outside, Capacity, CapacitySource};
use simulator::profile::{OutsideAllocator, Profile};
use trace::metadata;

use crate::analytic::{
    accelerate_bytes, analytic, deepspeed_zero2_bytes, dtype_bytes, horus_bytes, Optimizer, Precision,
};
use crate::dataset::DatasetRow;
use crate::error::{chain, EstimateError, Result};
use crate::features::Family;
use crate::metrics::{self, Metrics};
use crate::ml::features::extract;
use crate::ml::modelfile::ModelFile;
use crate::rows::RowSet;
use crate::symbolic::{capped_rerun_ok, symbolic};
use crate::tracefile::{job_libraries, library_warnings, LoadedTrace};

pub use crate::runs_file::read_runs;

/// Estimators in report order.
pub const ESTIMATORS: [&str; 8] =
    ["horus", "analytic", "accelerate", "deepspeed", "fake_tensor", "live_peak", "symbolic", "ml"];

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
    /// What `memest estimate` would warn of this answer for this run (an ML model asked about
    /// features outside its training range); absent when nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Outcome {
    /// No estimate, for this reason.
    pub fn failed(why: impl Into<String>) -> Outcome {
        Outcome { error: Some(why.into()), ..Outcome::default() }
    }
}

/// One run with every estimator's answer; a line of `runs.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Row id.
    pub id: String,
    /// The row's content digest ([`crate::rows::digest`]); empty in runs written before it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
    /// Generator configuration (`Filename`).
    pub filename: String,
    /// What the trainer rebuilt the run from (model spec or entry).
    #[serde(default)]
    pub spec: String,
    /// Family name.
    pub family: String,
    /// Batch size.
    pub batch: u64,
    /// The optimizer the run was traced and estimated with (`adam`, `sgd`, ...); absent in runs
    /// written before it was recorded (GPUMemNet's were Adam).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<String>,
    /// Its precision (`fp32`, `bf16`, `fp16`); absent where `optimizer` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amp: Option<String>,
    /// Measured device-level peak, bytes.
    pub truth_bytes: Option<f64>,
    /// The run crashed with OOM.
    pub real_oom: bool,
    /// Measured allocator-level peak (`max_memory_reserved`), bytes, where the dataset has it.
    #[serde(default)]
    pub reserved_truth_bytes: Option<f64>,
    /// The model runs GEMMs (cuBLAS loaded).
    pub uses_gemm: bool,
    /// The model runs convolutions (cuDNN loaded).
    pub uses_conv: bool,
    /// By estimator name.
    pub estimates: BTreeMap<String, Outcome>,
    /// The profile was calibrated on this row (`[calibration.rows]`): its errors are in-sample.
    #[serde(default)]
    pub calibrated_on: bool,
    /// The profile the run was estimated with; absent in runs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_with: Option<EstimatedWith>,
}

/// The GPU profile a run was estimated with, as `memest compare` records it: what a fit on the
/// run (`memest safety`) must share with the profile it writes.
///
/// Read tolerantly: a constant this memest does not know (a newer profile's) is kept in
/// `unknown_constants`, and written back, rather than refusing the runs; one the run does not
/// record is read as a profile reads it absent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RecordedWith", into = "RecordedWith")]
pub struct EstimatedWith {
    /// The profile's name (its file's stem).
    pub profile: String,
    /// Its `[gpu] name`.
    pub gpu: String,
    /// Its `[outside_allocator]` constants, which the symbolic point adds.
    pub outside_allocator: OutsideAllocator,
    /// `[outside_allocator]` constants the run records that this memest does not know, by name.
    pub unknown_constants: BTreeMap<String, serde_json::Value>,
    /// The job's ranks the NCCL terms were counted for; absent in runs written before it was
    /// recorded.
    pub ranks: Option<u32>,
}

/// [`EstimatedWith`] as a line of `runs.jsonl` holds it: the constants as an open object.
#[derive(Serialize, Deserialize)]
struct RecordedWith {
    profile: String,
    gpu: String,
    outside_allocator: serde_json::Map<String, serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ranks: Option<u32>,
}

impl TryFrom<RecordedWith> for EstimatedWith {
    type Error = String;

    fn try_from(r: RecordedWith) -> std::result::Result<EstimatedWith, String> {
        let known = match serde_json::to_value(OutsideAllocator::default()) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => return Err("cannot list the [outside_allocator] constants".into()),
        };
        let (mut ours, mut unknown) = (serde_json::Map::new(), BTreeMap::new());
        for (k, v) in r.outside_allocator {
            if known.contains_key(&k) {
                ours.insert(k, v);
            } else {
                unknown.insert(k, v);
            }
        }
        let outside_allocator = serde_json::from_value(serde_json::Value::Object(ours))
            .map_err(|e| format!("estimated_with.outside_allocator: {e}"))?;
        Ok(EstimatedWith {
            profile: r.profile,
            gpu: r.gpu,
            outside_allocator,
            unknown_constants: unknown,
            ranks: r.ranks,
        })
    }
}

impl From<EstimatedWith> for RecordedWith {
    fn from(e: EstimatedWith) -> RecordedWith {
        let mut outside_allocator = match serde_json::to_value(e.outside_allocator) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        outside_allocator.extend(e.unknown_constants);
        RecordedWith { profile: e.profile, gpu: e.gpu, outside_allocator, ranks: e.ranks }
    }
}

impl RunRecord {
    /// Whether a profile's constants were fitted on the run: it was marked `calibrated_on` when
    /// compared, or `calibrated` (a profile's `[calibration.rows]`, [`crate::calibrate::calibrated_rows`])
    /// names its row.
    pub fn in_calibration(&self, calibrated: &RowSet) -> bool {
        self.calibrated_on || calibrated.contains(&self.id, &self.digest)
    }
}

/// What every run shares.
pub struct EvalContext<'a> {
    /// The GPU profile.
    pub profile: &'a Profile,
    /// Its name (the file's stem), recorded in each run.
    pub profile_name: &'a str,
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

/// Evaluate every estimator on one row; `ml` is the caller's ML outcome ([`MlModels::outcome`], or
/// why there is none), so its capped rerun is simulated like every other estimator's.
pub fn evaluate_row(
    row: &DatasetRow,
    trace: TraceInput,
    plain: TraceInput,
    ctx: &EvalContext,
    ml: Outcome,
) -> RunRecord {
    let f = &row.features;
    let loaded = trace.map(|(p, s)| (LoadedTrace::load(p).map_err(|e| chain(&e)), s));
    let loaded_trace = match &loaded {
        Ok((Ok(t), _)) => Some(t),
        _ => None,
    };
    let libs = job_libraries(loaded_trace, Some(f), Some(row.family));
    let (uses_gemm, uses_conv) = (libs.gemm, libs.conv);
    let outside_terms = outside(ctx.profile, "profile", libs);
    let outside = outside_terms.total_bytes;
    let capacity = Capacity { bytes: ctx.profile.gpu.total_memory, source: CapacitySource::Profile };
    let mut est = BTreeMap::new();

    // A formula's answer past 2^64 B is no figure: null with the reason, as analytic's is.
    let formula = |bytes: u128, s: f64| Outcome {
        device_bytes: crate::analytic::bounded(bytes),
        error: crate::analytic::bounded(bytes)
            .is_none()
            .then(|| format!("no device holds the need: {}", crate::symbolic::Unbounded::Overflow.describe())),
        seconds: Some(s),
        ..Outcome::default()
    };
    let (h, s) = timed(|| horus_bytes(f.total_activations, row.batch, f.total_parameters));
    est.insert("horus".into(), formula(h, s));
    // The model-state formulas: a row's parameters are fp32 unless its trace says otherwise.
    let dtype = match &loaded {
        Ok((Ok(t), _)) => t.header.meta(&metadata::PARAM_DTYPE).map(str::to_string),
        _ => None,
    };
    let (acc, s) = timed(|| accelerate_bytes(f.total_parameters, dtype_bytes(dtype.as_deref())));
    let ds = deepspeed_zero2_bytes(f.total_parameters);
    for (name, bytes) in [("accelerate", acc), ("deepspeed", ds)] {
        est.insert(name.into(), formula(bytes, s));
    }
    // A trainer row records its own optimizer and AMP setting (validated when the CSV was read).
    let optimizer = row.optimizer.as_deref().and_then(|o| o.parse().ok()).unwrap_or(ctx.optimizer);
    let precision = row.amp.as_deref().and_then(|a| a.parse().ok()).unwrap_or(ctx.precision);
    let (a, s) = timed(|| analytic(f, row.batch, optimizer, precision, ctx.profile));
    est.insert(
        "analytic".into(),
        Outcome {
            device_bytes: a.unbounded().is_none().then_some(a.device),
            reserved_bytes: Some(a.reserved),
            seconds: Some(s),
            error: a.unbounded().map(|u| format!("no device holds the need: {}", u.describe())),
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
            // What the trace does not give whole (cut short, a snapshot's caveats), as `memest
            // estimate` warns of it, beside each answer read from it.
            let warnings = t.warnings();
            let (lp, s) = timed(|| t.live_peak());
            est.insert(
                "live_peak".into(),
                Outcome {
                    device_bytes: Some(lp),
                    seconds: Some(trace_s + s),
                    warnings: warnings.clone(),
                    ..Outcome::default()
                },
            );
            let (sym, s) = timed(|| symbolic(t, ctx.version, &outside_terms, capacity));
            // The symbolic answer also rests on the libraries a partly written header left to
            // the evidence.
            let warnings = [warnings, library_warnings(t, &libs)].concat();
            est.insert(
                "symbolic".into(),
                match sym {
                    // A saturated need is no estimate to score: null, with the reason.
                    Ok(e) if e.unbounded.is_some() => Outcome {
                        reserved_bytes: Some(e.predicted_reserved_peak),
                        seconds: Some(trace_s + s),
                        error: e.unbounded.map(|u| format!("no device holds the need: {}", u.describe())),
                        warnings,
                        ..Outcome::default()
                    },
                    Ok(e) => Outcome {
                        device_bytes: Some(e.predicted_device_peak),
                        reserved_bytes: Some(e.predicted_reserved_peak),
                        seconds: Some(trace_s + s),
                        warnings,
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
                    let warnings = pt.warnings();
                    Outcome { device_bytes: Some(v), seconds: Some(trace_s + s), warnings, ..Outcome::default() }
                }
            },
        },
    );
    est.insert("ml".into(), ml);
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
        digest: row.digest.clone(),
        filename: row.filename.clone(),
        spec: row.spec.as_str().to_string(),
        family: row.family.as_str().to_string(),
        batch: row.batch,
        optimizer: Some(optimizer.name().to_string()),
        // Lower case, as a profile's regime is matched (`bf16`, not the dataset's `BF16`).
        amp: Some(
            row.amp
                .as_deref()
                .map(str::to_ascii_lowercase)
                .filter(|a| !matches!(a.as_str(), "" | "none"))
                .unwrap_or_else(|| "fp32".into()),
        ),
        truth_bytes: row.truth,
        real_oom: row.real_oom,
        reserved_truth_bytes: row.reserved_truth,
        uses_gemm,
        uses_conv,
        estimates: est,
        calibrated_on: false,
        estimated_with: Some(EstimatedWith {
            profile: ctx.profile_name.to_string(),
            gpu: ctx.profile.gpu.name.clone(),
            outside_allocator: ctx.profile.outside_allocator.clone(),
            unknown_constants: BTreeMap::new(),
            ranks: Some(libs.ranks),
        }),
    }
}

/// Trained ML model files (`memest ml train`), at most one per family.
pub struct MlModels {
    models: Vec<(PathBuf, ModelFile)>,
}

impl MlModels {
    /// The models, checked to cover distinct families.
    pub fn new(models: Vec<(PathBuf, ModelFile)>) -> Result<MlModels> {
        for (i, (p, m)) in models.iter().enumerate() {
            if let Some((q, _)) = models[..i].iter().find(|(_, o)| o.family == m.family) {
                return Err(EstimateError::Field {
                    path: p.clone(),
                    field: "family".into(),
                    expected: format!("one model per family; {} is also a {} model", q.display(), m.family),
                });
            }
        }
        Ok(MlModels { models })
    }

    /// Each model file that records no training range, said once per file
    /// ([`ModelFile::range_unknown`]): no row's warnings can say it is outside.
    pub fn ranges_unknown(&self) -> Vec<String> {
        self.models.iter().filter_map(|(p, m)| m.range_unknown(p)).collect()
    }

    /// The model files and the datasets they were trained on.
    pub fn trained_on(&self) -> impl Iterator<Item = (&Path, &str, Family)> {
        self.models.iter().map(|(p, m)| (p.as_path(), m.trained_on.as_str(), m.family))
    }

    /// Whether every model file records its training rows' digests, so a training row is
    /// known in any file; older files know only their training CSV's path.
    pub fn know_training_rows(&self) -> bool {
        self.models.iter().all(|(_, m)| m.knows_training_rows())
    }

    /// The model of `row`'s family, when it was trained on that row of `dataset`.
    pub fn trained_on_row(&self, row: &DatasetRow, dataset: &Path) -> Option<&Path> {
        self.models
            .iter()
            .find(|(_, m)| m.family == row.family && m.trained_on_row(&row.digest, dataset))
            .map(|(p, _)| p.as_path())
    }

    /// The `ml` outcome of one row of `dataset`: the model of the row's family applied to the
    /// row's GPUMemNet features; null with the reason when no model fits, the features do not
    /// extract, or (unless `allow_training_rows`) the row is one the model was trained on.
    pub fn outcome(&self, row: &DatasetRow, dataset: &Path, allow_training_rows: bool) -> Outcome {
        let family = row.family;
        let Some((path, model)) = self.models.iter().find(|(_, m)| m.family == family) else {
            let given: Vec<String> =
                self.models.iter().map(|(p, m)| format!("{} ({})", p.display(), m.family)).collect();
            return Outcome::failed(format!("no ML model for family {family} (given: {})", given.join(", ")));
        };
        if !allow_training_rows && model.trained_on_row(&row.digest, dataset) {
            return Outcome::failed(format!(
                "training row of {} (trained on {}): not held out (--ml-include-training-rows evaluates it anyway)",
                path.display(),
                model.trained_on
            ));
        }
        let (p, s) = timed(|| -> std::result::Result<(f64, Vec<String>), String> {
            let x = extract(family, row).map_err(|e| e.to_string())?;
            // The one wording of a feature outside the training range (`memest estimate`'s).
            let warnings = model.outside_training_at(&x, &row_at(path, dataset, row));
            let n = x.len();
            let x = ndarray::Array2::from_shape_vec((1, n), x).map_err(|e| e.to_string())?;
            let mut p = model.predict(&x).map_err(|e| chain(&e))?;
            let p = p.pop().ok_or_else(|| "the model returned no prediction".to_string())?;
            // A negative or infinite answer is no memory figure: null, with the reason.
            Ok((p.mib().map_err(str::to_string)?, warnings))
        });
        match p {
            // The model answers in MiB, at device level (GPUMemNet's label).
            Ok((mib, warnings)) => Outcome {
                device_bytes: Some((mib * 1024.0 * 1024.0).round() as u64),
                seconds: Some(s),
                warnings,
                ..Outcome::default()
            },
            Err(e) => Outcome::failed(format!("{}: {e}", path.display())),
        }
    }
}

/// Where a row's ML warnings come from: `MODEL: DATASET row ID`, as `memest estimate` names its
/// model and features file.
fn row_at(model: &Path, dataset: &Path, row: &DatasetRow) -> String {
    format!("{}: {} row {}", model.display(), dataset.display(), row.id)
}

/// Metrics of one estimator over one group, with PEF both simulated and as the labelled proxy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupMetrics {
    /// Estimator.
    pub estimator: String,
    /// `device` (against the device-level truth) or `reserved` (the estimator's allocator-level
    /// answer against `max_memory_reserved`).
    pub level: String,
    /// Family name or `all`.
    pub group: String,
    /// Runs of the group left out because the dataset gives them no truth at this level (and no
    /// OOM): CPU-fallback runs of the trainer, or rows without `max_memory_reserved_mib`.
    pub unlabelled: usize,
    /// Metrics with PEF from memsim-simulated capped reruns where traces exist.
    pub metrics: Metrics,
    /// PEF with "estimate below truth" as the capped rerun (a proxy; not comparable with xMem).
    pub pef_proxy: Option<f64>,
}

/// The metrics input of one estimator's outcome on one run, at device level.
pub fn metric_run(r: &RunRecord, estimator: &str) -> metrics::Run {
    level_run(r, estimator, false)
}

/// The metrics input at device level, or at reserved level (the estimator's reserved answer
/// against the allocator's measured peak; no memsim capped rerun at that level).
fn level_run(r: &RunRecord, estimator: &str, reserved: bool) -> metrics::Run {
    let o = r.estimates.get(estimator);
    let answer = |o: &Outcome| if reserved { o.reserved_bytes } else { o.device_bytes };
    metrics::Run {
        truth: if reserved { r.reserved_truth_bytes } else { r.truth_bytes },
        real_oom: r.real_oom,
        estimate: match o {
            None => Err("estimator not run".to_string()),
            Some(o) => match (answer(o), &o.error) {
                (Some(d), _) => Ok(d as f64),
                (None, Some(e)) => Err(reason_class(e)),
                (None, None) => Err("no estimate".to_string()),
            },
        },
        capped_rerun_ok: if reserved { None } else { o.and_then(|o| o.capped_rerun_ok) },
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

/// Metrics for every estimator present, per family and over all runs: at device level, and at
/// reserved level for estimators with an allocator-level answer when some run has a measured
/// `max_memory_reserved`. Runs without a truth at a level (and no OOM) are counted, not scored.
pub fn aggregate(records: &[RunRecord], total_gpu: f64) -> Vec<GroupMetrics> {
    let mut groups: Vec<String> = records.iter().map(|r| r.family.clone()).collect();
    groups.sort();
    groups.dedup();
    groups.insert(0, "all".into());
    let any_reserved = records.iter().any(|r| r.reserved_truth_bytes.is_some());
    let mut out = Vec::new();
    for reserved in [false, true] {
        for est in ESTIMATORS {
            let has = |r: &RunRecord| r.estimates.get(est).is_some_and(|o| !reserved || o.reserved_bytes.is_some());
            if !records.iter().any(has) || (reserved && !any_reserved) {
                continue;
            }
            for g in &groups {
                let in_group: Vec<&RunRecord> = records.iter().filter(|r| g == "all" || &r.family == g).collect();
                let labelled = |r: &&&RunRecord| {
                    r.real_oom || if reserved { r.reserved_truth_bytes.is_some() } else { r.truth_bytes.is_some() }
                };
                let runs: Vec<metrics::Run> =
                    in_group.iter().filter(labelled).map(|r| level_run(r, est, reserved)).collect();
                let proxy: Vec<metrics::Run> =
                    runs.iter().cloned().map(|r| metrics::Run { capped_rerun_ok: None, ..r }).collect();
                out.push(GroupMetrics {
                    estimator: est.to_string(),
                    level: if reserved { "reserved" } else { "device" }.to_string(),
                    group: g.clone(),
                    unlabelled: in_group.len() - runs.len(),
                    metrics: metrics::compute(&runs, total_gpu),
                    pef_proxy: metrics::compute(&proxy, total_gpu).pef,
                });
            }
        }
    }
    out
}
