//! `memest estimate`: every estimator's answer for one job, in the JSON contract the trainer's
//! `estimate` command reads (documented in estimators/README.md).

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use simulator::fit::{self, CapacitySource, Libraries, Margin};
use simulator::profile::Profile;
use trace::metadata;

use crate::analytic::{
    accelerate_bytes, analytic, deepspeed_zero2_bytes, dtype_bytes, horus_bytes, Optimizer, Precision,
};
use crate::error::{EstimateError, Result};
use crate::estimate_text::{EstimateText, EstimateView};
use crate::features::{Family, Features};
use crate::symbolic::{profile_version, symbolic, Unbounded};
use crate::tracefile::{job_libraries, library_warnings, LoadedTrace};

const MIB: f64 = 1024.0 * 1024.0;

/// The version of the `memest estimate --json` contract (estimators/README.md).
pub const SCHEMA: u32 = 3;

/// One estimator's answer in MiB.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer {
    /// What nvidia-smi would show (device level), or the estimator's own answer when it has no
    /// notion of device memory (see `level`); `null` for a need no device holds
    /// (`verdict.need_unbounded` says why), which as a number would read as a size.
    pub device_mib: Option<f64>,
    /// Allocator level (`max_memory_reserved`), where the estimator models it.
    pub reserved_mib: Option<f64>,
    /// `reserved_mib` is a failed allocation's floor (the bytes held then plus its size), not a
    /// peak the model reached: an allocation failed in the recorded run (a real run's trace), at
    /// the allocator budget above the unlimited peak, or at any capacity (one past the largest
    /// segment, 256 TiB). Written only when true.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reserved_oom_floor: bool,
    /// Peak allocated (`max_memory_allocated`), where the estimator models it.
    pub allocated_mib: Option<f64>,
    /// The point plus the profile's calibrated safety margin (the headline only; absent, like
    /// `device_mib`, for a need no device holds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub safe_mib: Option<f64>,
    /// What the number measures: `device`, `reserved` or `live` (live tensor bytes).
    pub level: &'static str,
    /// The headline's peaks of the first traced step and of the later ones (the steady state),
    /// device level like `device_mib`; absent without `iter:` markers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<StepPeaks>,
    /// `headline` (act on it) or `baseline` (for comparison only).
    pub role: &'static str,
    /// What the estimator leaves out, in a sentence.
    pub ignores: &'static str,
}

impl Answer {
    /// A baseline's answer.
    pub fn baseline(name: &str, device_mib: f64, reserved_mib: Option<f64>, level: &'static str) -> Answer {
        Answer {
            device_mib: Some(device_mib),
            reserved_mib,
            reserved_oom_floor: false,
            allocated_mib: None,
            safe_mib: None,
            level,
            steps: None,
            role: "baseline",
            ignores: ignores(name),
        }
    }
}

/// Peaks per traced step, MiB at the device level (reserved + outside the allocator).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepPeaks {
    /// Steps traced.
    pub count: usize,
    /// The first step (its caches cold; setup memory included).
    pub first_step_device_mib: f64,
    /// The first step's reserved peak.
    pub first_step_reserved_mib: f64,
    /// The max over steps 2 and on; `None` when one step was traced.
    pub steady_device_mib: Option<f64>,
    /// Their reserved peak.
    pub steady_reserved_mib: Option<f64>,
}

impl StepPeaks {
    fn of(iterations: &[simulator::replay::IterationPeak], outside: u64) -> Option<StepPeaks> {
        let (first, rest) = iterations.split_first()?;
        let steady = rest.iter().map(|i| i.peak_reserved_bytes).max();
        Some(StepPeaks {
            count: iterations.len(),
            first_step_device_mib: mib(first.peak_reserved_bytes + outside),
            first_step_reserved_mib: mib(first.peak_reserved_bytes),
            steady_device_mib: steady.map(|s| mib(s + outside)),
            steady_reserved_mib: steady.map(mib),
        })
    }
}

/// What each estimator leaves out.
pub fn ignores(name: &str) -> &'static str {
    match name {
        "symbolic" => {
            "memory that bypasses PyTorch's allocator beyond the profile's terms (custom extensions, NCCL \
             buffers) and effects of torch.compile"
        }
        "analytic" => {
            "the allocator's caching and fragmentation, when tensors are alive (it sums every layer's \
             tensors), frozen weights, activation checkpointing and transient buffers"
        }
        "horus" => {
            "optimizer state, the allocator, the CUDA context and libraries, frozen weights and checkpointing \
             (4*(A*B + P + B*P) bytes, as published)"
        }
        "accelerate" => {
            "activations, temporaries, frozen parameters (all trained with Adam), the allocator and the CUDA \
             context (accelerate estimate-memory: 4x the model's size in its dtype)"
        }
        "deepspeed" => {
            "activations, temporaries, frozen parameters and the dtype in use (DeepSpeed's ZeRO-2 model states \
             for one GPU: 20 bytes per parameter, fp16 weights and gradients with fp32 Adam), the allocator and \
             the CUDA context"
        }
        "fake_tensor" => {
            "the optimizer step, the caching allocator (rounding, caching, fragmentation), workspaces, and the \
             CUDA context and libraries (live tensor bytes of forward and backward)"
        }
        "live_peak" => {
            "the caching allocator (rounding, caching, fragmentation) and the CUDA context and libraries (live \
             requested bytes of the same trace)"
        }
        "ml" => {
            "the job's actual step: a model fitted on GPUMemNet's A100 fp32 sweeps predicts from layer counts, \
             and knows only the families it was trained on"
        }
        _ => "",
    }
}

/// The memory outside the allocator, in MiB, as the report shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutsideReport {
    /// CUDA context and runtime.
    pub context_mib: f64,
    /// cuBLAS/cuBLASLt.
    pub cublas_mib: f64,
    /// cuDNN.
    pub cudnn_mib: f64,
    /// NCCL's communicator and peer buffers (jobs of more than one rank).
    pub nccl_mib: f64,
    /// Device memory the trace itself held outside the allocator (another module's own
    /// requests, VMM handles, managed memory) on top of the reserved peak: what it adds at the
    /// device's busiest moment (the most of reserved + held at once).
    pub recorded_mib: f64,
    /// The sum.
    pub total_mib: f64,
    /// The libraries counted, and where that came from.
    pub libraries: Libraries,
    /// Unmeasured profile constants used.
    pub unmeasured: Vec<String>,
}

/// The verdict in MiB.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerdictReport {
    /// The number the verdict rests on: `estimates.symbolic.safe_mib`, or `.device_mib` with
    /// `--point`.
    pub basis: String,
    /// The point estimate beside it; `null` when no device holds it (`need_unbounded`).
    pub point_mib: Option<f64>,
    /// Device memory needed; `null` when no device holds it (`need_unbounded`).
    pub need_mib: Option<f64>,
    /// Why no device holds the need, when none does (`need_mib` and `point_mib` are then `null`
    /// and `fits` false): `memory_fraction` (the program's memory fraction lets its allocator
    /// reserve nothing of any device) or `overflow`; `null` otherwise.
    #[serde(default)]
    pub need_unbounded: Option<Unbounded>,
    /// Device capacity.
    pub capacity_mib: f64,
    /// `--capacity` or `profile`.
    pub capacity_source: CapacitySource,
    /// `need_mib <= capacity_mib`.
    pub fits: bool,
    /// The allocator budget the headline was replayed at: the capacity less the memory outside
    /// the allocator, MiB (absent in files written before it was reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator_budget_mib: Option<f64>,
    /// Whether the need is the replay within that budget, where a full budget makes the
    /// allocator free its cache and retry: the need is then this capacity's and can differ at
    /// another (false when the replay at the budget failed: the need is the unlimited replay's).
    #[serde(default)]
    pub need_at_capacity: bool,
}

/// The whole answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EstimateReport {
    /// [`SCHEMA`].
    pub schema: u32,
    /// The estimator to act on.
    pub headline: &'static str,
    /// Does the job fit, on the headline's device number.
    pub verdict: VerdictReport,
    /// By estimator; `null` where it could not run (see `unavailable`).
    pub estimates: BTreeMap<String, Option<Answer>>,
    /// Memory outside the allocator added to the symbolic estimate.
    pub outside_allocator: OutsideReport,
    /// The safety margin between the point and the safe number.
    pub margin: Margin,
    /// Seconds each estimator took here (trace generation not included).
    pub seconds: BTreeMap<String, f64>,
    /// Why an estimator is null.
    pub unavailable: BTreeMap<String, String>,
    /// The profile used (its path).
    pub profile: String,
    /// The profile's name.
    pub profile_name: String,
    /// The GPU's name.
    pub gpu: String,
    /// The GPU's total memory, MiB.
    pub gpu_total_mib: f64,
    /// The job's family: of the layers the trace ran, else the features', else what an older
    /// trace recorded (`unknown` when none says).
    pub family: &'static str,
    /// `!verdict.fits`, kept for schema-1 readers.
    pub oom_predicted: Option<bool>,
    /// What was partly used or rests on a placeholder.
    pub warnings: Vec<String>,
    /// The estimate in words, the one wording every view joins ([`EstimateText`]).
    pub text: EstimateText,
}

/// Inputs of one estimate.
pub struct EstimateInput<'a> {
    /// The symbolic trace (with CUDA emulation).
    pub trace: &'a LoadedTrace,
    /// A plain-meta trace of the same job, for the FakeTensor baseline.
    pub plain: Option<&'a LoadedTrace>,
    /// Model features; `None` for a step function, whose layers are not known (the
    /// feature-based baselines are then unavailable).
    pub features: Option<&'a Features>,
    /// The profile and its path.
    pub profile: (&'a Profile, &'a std::path::Path),
    /// The device's total memory, bytes (`--capacity`); default the profile's.
    pub capacity: Option<u64>,
    /// Batch size override (else the features', else the trace's metadata).
    pub batch: Option<u64>,
    /// Judge the fit on the point estimate instead of the safe number.
    pub point: bool,
    /// An ML answer computed by the caller (MiB) or why there is none.
    pub ml: std::result::Result<Answer, String>,
}

fn mib(b: u64) -> f64 {
    b as f64 / MIB
}

/// Warnings when the features (and the batch the baselines use) describe another job than the
/// trace the headline replays: the two answers would then be of different jobs, side by side.
fn other_job(t: &LoadedTrace, f: Option<&Features>, batch: Option<u64>) -> Vec<String> {
    let mut w = Vec::new();
    let Some(f) = f else { return w };
    if let (Some(fm), Some(tm)) = (f.model.as_deref(), t.meta(&metadata::MODEL)) {
        if fm != tm {
            w.push(format!(
                "the features are of {fm} and the trace ({}) of {tm}: the baselines describe another job than \
                 the symbolic headline",
                t.path.display()
            ));
        }
    }
    // The input size: features of 512 tokens beside a trace of 128 are two jobs as surely as
    // two models are.
    let sizes = [
        (&metadata::SEQ_LEN, f.seq_len.map(|n| n.to_string())),
        (
            &metadata::INPUT_SHAPE,
            f.input_shape.as_ref().map(|d| d.iter().map(u64::to_string).collect::<Vec<_>>().join(",")),
        ),
    ];
    for (key, fs) in sizes {
        if let (Some(fs), Some(ts)) = (fs, t.meta(key)) {
            if fs != ts {
                w.push(format!(
                    "the features are for {} {fs} and the trace ({}) for {} {ts}: the baselines describe another job \
                     than the symbolic headline",
                    key.name,
                    t.path.display(),
                    key.name
                ));
            }
        }
    }
    if let (Some(b), Some(tb)) = (batch, t.header.meta_count(&metadata::BATCH_SIZE)) {
        if b != tb {
            w.push(format!(
                "the baselines are for batch {b} and the trace ({}) was taken at batch {tb}: the symbolic \
                 headline is batch {tb}'s",
                t.path.display()
            ));
        }
    }
    w
}

/// Warnings when the plain-meta trace (the FakeTensor baseline's) is of another job than the
/// trace the headline replays: the model, the batch, the steps, the optimizer or the precision.
fn other_plain_job(t: &LoadedTrace, p: &LoadedTrace) -> Vec<String> {
    let keys = [&metadata::MODEL, &metadata::BATCH_SIZE, &metadata::GRAD_ACCUM, &metadata::OPTIMIZER, &metadata::AMP];
    let differ: Vec<String> = keys
        .into_iter()
        .filter_map(|k| match (t.meta(k), p.meta(k)) {
            (Some(a), Some(b)) if a != b => Some(format!("{} {b} there, {a} here", k.name)),
            _ => None,
        })
        .collect();
    if differ.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "--fake-trace {} is of another job than the trace {} ({}): the FakeTensor baseline describes that job",
        p.path.display(),
        t.path.display(),
        differ.join(", ")
    )]
}

/// Run every estimator on one job.
pub fn estimate(input: &EstimateInput) -> Result<EstimateReport> {
    let (profile, ppath) = input.profile;
    let t = input.trace;
    let f = input.features;
    let field =
        |field: &str, expected: String| EstimateError::Field { path: t.path.clone(), field: field.into(), expected };
    let batch = match input.batch.or(f.and_then(|f| f.batch_size)) {
        Some(b) => Some(b),
        None => match t.meta(&metadata::BATCH_SIZE) {
            None if f.is_none() => None,
            meta => Some(
                meta.and_then(|b| b.parse().ok())
                    .ok_or_else(|| field("metadata.batch_size", "a batch size (or pass --batch-size)".into()))?,
            ),
        },
    };
    let version = profile_version(profile, ppath)?;
    let mut warnings = t.warnings();
    if t.is_plain_meta() {
        // The headline replays what CUDA would allocate; a plain-meta trace has only the tensors
        // (no library workspaces nor the other emulated cases), so its need is too small.
        warnings.push(format!(
            "--trace {}: header metadata `cuda_emulation` is \"false\": a plain-meta trace (`symtrace \
             --no-cuda-emulation`) leaves out what CUDA allocates beside the tensors (library workspaces and the \
             other emulated cases), so the symbolic headline and its verdict may be below what the job needs; \
             trace the job with CUDA emulation (this trace is the --fake-trace baseline's input)",
            t.path.display()
        ));
    }
    if let Some(p) = input.plain {
        warnings.extend(p.warnings());
        warnings.extend(other_plain_job(t, p));
    }
    // The layers the trace ran, else the features', else what an older trace recorded: one
    // family for the report, the margin and the libraries.
    let family = Family::listed(&t.header).or_else(|| f.map(Features::family)).or_else(|| Family::recorded(&t.header));
    warnings.extend(fit::profile_mismatch(&t.header, profile, ppath));
    warnings.extend(fit::autotuning(&t.header));
    warnings.extend(other_job(t, f, batch));
    let libs = job_libraries(Some(t), f, family);
    warnings.extend(library_warnings(t, &libs));
    let outside_terms = fit::outside(profile, &ppath.display().to_string(), libs);
    warnings.extend(outside_terms.warnings());
    let (capacity, cap_warnings) = fit::capacity(input.capacity, Some(profile));
    warnings.extend(cap_warnings);
    let capacity = capacity.expect("a profile always gives a capacity");
    let margin = fit::margin(profile, &t.header, family);
    if !margin.coverage_measured {
        warnings.push(format!("safety margin: {}", margin.note));
    }
    let mut estimates = BTreeMap::new();
    let mut seconds = BTreeMap::new();
    let mut unavailable = BTreeMap::new();
    let mut time = |name: &str, s: Instant| {
        seconds.insert(name.to_string(), s.elapsed().as_secs_f64());
    };

    let s = Instant::now();
    let sym = symbolic(t, version, &outside_terms, capacity)?;
    time("symbolic", s);
    warnings.extend(sym.replay_warnings.clone());
    // A saturated need is no size: null, with the reason in the verdict (the margin on a need
    // near 2^64 B saturates too).
    let safe = margin.safe(sym.predicted_device_peak, sym.predicted_reserved_peak);
    let unbounded = sym.unbounded.or((safe == u64::MAX).then_some(Unbounded::Overflow));
    let bounded = |b: u64| unbounded.is_none().then(|| mib(b));
    estimates.insert(
        "symbolic".into(),
        Some(Answer {
            device_mib: bounded(sym.predicted_device_peak),
            reserved_mib: Some(mib(sym.predicted_reserved_peak)),
            reserved_oom_floor: sym.reserved_is_oom_floor,
            allocated_mib: Some(mib(sym.predicted_allocated_peak)),
            safe_mib: bounded(safe),
            level: "device",
            steps: StepPeaks::of(&sym.iterations, sym.outside_allocator),
            role: "headline",
            ignores: ignores("symbolic"),
        }),
    );
    match (f, batch) {
        (Some(f), Some(batch)) => {
            // Only the feature baselines read these; a step function's trace may name optimizers
            // the analytic model does not know.
            let precision: Precision =
                t.meta(&metadata::AMP).unwrap_or("fp32").parse().map_err(|e| field("metadata.amp", e))?;
            // An optimizer the closed form has no state count for (Adafactor, bitsandbytes' 8-bit
            // ones) leaves the analytic baseline out, with the reason, rather than guessing.
            match t.meta(&metadata::OPTIMIZER).unwrap_or("adam").parse::<Optimizer>() {
                Ok(optimizer) => {
                    let s = Instant::now();
                    let a = analytic(f, batch, optimizer, precision, profile);
                    time("analytic", s);
                    // As the headline says a saturated need: no number, the reason beside it.
                    if let Some(u) = a.unbounded() {
                        estimates.insert("analytic".into(), None);
                        unavailable.insert("analytic".into(), format!("no device holds the need: {}", u.describe()));
                    } else {
                        estimates.insert(
                            "analytic".into(),
                            Some(Answer::baseline("analytic", mib(a.device), Some(mib(a.reserved)), "device")),
                        );
                    }
                }
                Err(e) => {
                    estimates.insert("analytic".into(), None);
                    unavailable.insert("analytic".into(), format!("its closed form has no optimizer state count: {e}"));
                }
            }
            let s = Instant::now();
            let acc = accelerate_bytes(f.total_parameters, dtype_bytes(t.meta(&metadata::PARAM_DTYPE)));
            let ds = deepspeed_zero2_bytes(f.total_parameters);
            time("model_state_formulas", s);
            let s = Instant::now();
            let h = horus_bytes(f.total_activations, batch, f.total_parameters);
            time("horus", s);
            // Past 2^64 B a formula's figure is said as analytic's is: null, the reason beside it.
            for (name, bytes, level) in
                [("accelerate", acc, "model"), ("deepspeed", ds, "model"), ("horus", h, "device")]
            {
                let answer =
                    crate::analytic::bounded(bytes).map(|b| Answer::baseline(name, b as f64 / MIB, None, level));
                if answer.is_none() {
                    unavailable
                        .insert(name.into(), format!("no device holds the need: {}", Unbounded::Overflow.describe()));
                }
                estimates.insert(name.into(), answer);
            }
            // The formulas know one GPU: beside a rank's estimate they read as its numbers.
            if let Some(world) = t.meta(&metadata::WORLD_SIZE).and_then(|v| v.parse::<u64>().ok()).filter(|w| *w > 1) {
                warnings.push(format!(
                    "the analytic, horus, accelerate and deepspeed baselines are one unsharded GPU's; the job is \
                     sharded over {world} ranks and the estimate is one rank's"
                ));
            }
        }
        _ => {
            for name in ["analytic", "horus", "accelerate", "deepspeed"] {
                estimates.insert(name.into(), None);
                unavailable.insert(
                    name.into(),
                    "needs the model's features and batch size (--features), which a step function or script does not expose"
                        .into(),
                );
            }
        }
    }
    let s = Instant::now();
    let lp = t.live_peak();
    time("live_peak", s);
    estimates.insert("live_peak".into(), Some(Answer::baseline("live_peak", mib(lp), None, "live")));
    match input.plain {
        Some(p) if p.is_plain_meta() => {
            let s = Instant::now();
            let v = p.forward_backward_peak();
            time("fake_tensor", s);
            estimates.insert("fake_tensor".into(), Some(Answer::baseline("fake_tensor", mib(v), None, "live")));
        }
        Some(p) => {
            estimates.insert("fake_tensor".into(), None);
            unavailable.insert(
                "fake_tensor".into(),
                format!("{}: not a plain-meta trace (take it with `symtrace --no-cuda-emulation`)", p.path.display()),
            );
        }
        None => {
            estimates.insert("fake_tensor".into(), None);
            unavailable.insert("fake_tensor".into(), "no plain-meta trace given (--fake-trace)".into());
        }
    }
    match &input.ml {
        Ok(a) => {
            estimates.insert("ml".into(), Some(a.clone()));
        }
        Err(why) => {
            estimates.insert("ml".into(), None);
            unavailable.insert("ml".into(), why.clone());
        }
    }
    let point = sym.predicted_device_peak;
    let v = if input.point {
        fit::Verdict::new("estimates.symbolic.device_mib", point, capacity)
    } else {
        fit::Verdict::new("estimates.symbolic.safe_mib", margin.safe(point, sym.predicted_reserved_peak), capacity)
    };
    let o = &outside_terms;
    let mut report = EstimateReport {
        schema: SCHEMA,
        headline: "symbolic",
        verdict: VerdictReport {
            basis: v.basis.clone(),
            point_mib: bounded(point),
            need_mib: bounded(v.need_bytes),
            need_unbounded: unbounded,
            capacity_mib: mib(v.capacity_bytes),
            capacity_source: v.capacity_source,
            fits: v.fits,
            allocator_budget_mib: Some(mib(sym.budget)),
            need_at_capacity: sym.peaks_at_budget && unbounded.is_none(),
        },
        estimates,
        outside_allocator: OutsideReport {
            context_mib: mib(o.context_bytes),
            cublas_mib: mib(o.cublas_bytes),
            cudnn_mib: mib(o.cudnn_bytes),
            nccl_mib: mib(o.nccl_bytes),
            recorded_mib: mib(sym.recorded_outside),
            total_mib: mib(o.total_bytes.saturating_add(sym.recorded_outside)),
            libraries: o.libraries,
            unmeasured: o.unmeasured.clone(),
        },
        margin,
        seconds,
        unavailable,
        profile: ppath.display().to_string(),
        profile_name: Profile::name_of(ppath),
        gpu: profile.gpu.name.clone(),
        gpu_total_mib: mib(profile.gpu.total_memory),
        family: family.map_or("unknown", |f| f.as_str()),
        oom_predicted: Some(!v.fits),
        warnings,
        text: EstimateText::default(),
    };
    report.text = EstimateText::of(&EstimateView::from(&report));
    Ok(report)
}
