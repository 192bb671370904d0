//! `memest estimate`: every estimator's answer for one job, in the JSON contract the trainer's
//! `estimate` command reads (documented in estimators/README.md).

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;
use simulator::profile::Profile;

use crate::analytic::{analytic, horus_bytes, Optimizer, Precision};
use crate::error::{EstimateError, Result};
use crate::features::Features;
use crate::symbolic::{profile_version, symbolic};
use crate::tracefile::LoadedTrace;

const MIB: f64 = 1024.0 * 1024.0;

/// One estimator's answer in MiB.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer {
    /// What nvidia-smi would show (device level), or the estimator's own answer when it has no
    /// notion of device memory (see `level`).
    pub device_mib: f64,
    /// Allocator level (`max_memory_reserved`), where the estimator models it.
    pub reserved_mib: Option<f64>,
    /// What the number measures: `device`, `reserved` or `live` (live tensor bytes).
    pub level: &'static str,
}

/// The whole answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EstimateReport {
    /// By estimator; `null` where it could not run (see `unavailable`).
    pub estimates: BTreeMap<String, Option<Answer>>,
    /// Seconds each estimator took here (trace generation not included).
    pub seconds: BTreeMap<String, f64>,
    /// Why an estimator is null.
    pub unavailable: BTreeMap<String, String>,
    /// The profile used (its path).
    pub profile: String,
    /// The GPU's total memory, MiB.
    pub gpu_total_mib: f64,
    /// Model family from the features.
    pub family: &'static str,
    /// The symbolic estimator's verdict: the job would not fit on the profile's GPU.
    pub oom_predicted: Option<bool>,
}

/// Inputs of one estimate.
pub struct EstimateInput<'a> {
    /// The symbolic trace (with CUDA emulation).
    pub trace: &'a LoadedTrace,
    /// A plain-meta trace of the same job, for the FakeTensor baseline.
    pub plain: Option<&'a LoadedTrace>,
    /// Model features.
    pub features: &'a Features,
    /// The profile and its path.
    pub profile: (&'a Profile, &'a std::path::Path),
    /// Batch size override (else the features', else the trace's metadata).
    pub batch: Option<u64>,
    /// An ML answer computed by the caller (MiB) or why there is none.
    pub ml: std::result::Result<Answer, String>,
}

fn mib(b: u64) -> f64 {
    b as f64 / MIB
}

/// Run every estimator on one job.
pub fn estimate(input: &EstimateInput) -> Result<EstimateReport> {
    let (profile, ppath) = input.profile;
    let t = input.trace;
    let f = input.features;
    let field =
        |field: &str, expected: String| EstimateError::Field { path: t.path.clone(), field: field.into(), expected };
    let batch = match input.batch.or(f.batch_size) {
        Some(b) => b,
        None => t
            .meta("batch_size")
            .and_then(|b| b.parse().ok())
            .ok_or_else(|| field("metadata.batch_size", "a batch size (or pass --batch-size)".into()))?,
    };
    let optimizer: Optimizer =
        t.meta("optimizer").unwrap_or("adam").parse().map_err(|e| field("metadata.optimizer", e))?;
    let precision: Precision = t.meta("amp").unwrap_or("fp32").parse().map_err(|e| field("metadata.amp", e))?;
    let version = profile_version(profile, ppath)?;
    let uses_conv = f.uses_conv();
    let uses_gemm = f.uses_gemm() || t.has_workspace();
    let mut estimates = BTreeMap::new();
    let mut seconds = BTreeMap::new();
    let mut unavailable = BTreeMap::new();
    let mut time = |name: &str, s: Instant| {
        seconds.insert(name.to_string(), s.elapsed().as_secs_f64());
    };

    let s = Instant::now();
    let sym = symbolic(t, profile, version, uses_gemm, uses_conv)?;
    time("symbolic", s);
    estimates.insert(
        "symbolic".into(),
        Some(Answer {
            device_mib: mib(sym.predicted_device_peak),
            reserved_mib: Some(mib(sym.predicted_reserved_peak)),
            level: "device",
        }),
    );
    let s = Instant::now();
    let a = analytic(f, batch, optimizer, precision, profile);
    time("analytic", s);
    estimates.insert(
        "analytic".into(),
        Some(Answer { device_mib: mib(a.device), reserved_mib: Some(mib(a.reserved)), level: "device" }),
    );
    let s = Instant::now();
    let h = horus_bytes(f.total_activations, batch, f.total_parameters);
    time("horus", s);
    estimates.insert("horus".into(), Some(Answer { device_mib: h as f64 / MIB, reserved_mib: None, level: "device" }));
    let s = Instant::now();
    let lp = t.live_peak();
    time("live_peak", s);
    estimates.insert("live_peak".into(), Some(Answer { device_mib: mib(lp), reserved_mib: None, level: "live" }));
    match input.plain {
        Some(p) if p.is_plain_meta() => {
            let s = Instant::now();
            let v = p.forward_backward_peak();
            time("fake_tensor", s);
            estimates
                .insert("fake_tensor".into(), Some(Answer { device_mib: mib(v), reserved_mib: None, level: "live" }));
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
    Ok(EstimateReport {
        estimates,
        seconds,
        unavailable,
        profile: ppath.display().to_string(),
        gpu_total_mib: mib(profile.gpu.total_memory),
        family: f.family().as_str(),
        oom_predicted: Some(sym.oom_on_profile_gpu),
    })
}
