//! GPUUtilNet-style utilisation classes (issue 7): the ML machinery with DCGM SMACT or SMOCC as
//! the target, binned low / medium / high, evaluated with the stratified protocol.
//!
//! The paper's exact class thresholds are not in the reference material available to this
//! project, so the default bins are equal thirds of the metric's 0–1 range, `[0, 1/3)`,
//! `[1/3, 2/3)`, `[2/3, 1]`, and every entry point takes explicit edges instead. Results with
//! the default bins are therefore not directly comparable with the paper's numbers.

use serde::{Deserialize, Serialize};

use super::bins::{Binning, Closed};
use super::dataset::Dataset;
use super::error::MlError;
use super::examples::{Examples, Target, TargetKind};
use super::kernel_features::KernelFeatures;
use super::protocol::{self, ProtocolConfig, Report};

/// A DCGM utilisation metric the GPUMemNet CSVs carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UtilMetric {
    /// `Avg SMACT`: share of cycles with at least one warp on an SM.
    Smact,
    /// `Avg SMOCC`: resident warps over the theoretical maximum.
    Smocc,
}

impl UtilMetric {
    /// Parses `smact` or `smocc` (case-insensitive).
    pub fn parse(s: &str) -> Option<UtilMetric> {
        match s.to_ascii_lowercase().as_str() {
            "smact" => Some(UtilMetric::Smact),
            "smocc" => Some(UtilMetric::Smocc),
            _ => None,
        }
    }

    fn kind(self) -> TargetKind {
        match self {
            UtilMetric::Smact => TargetKind::Smact,
            UtilMetric::Smocc => TargetKind::Smocc,
        }
    }
}

/// Default low/medium/high thresholds: equal thirds of 0–1 (see the module note).
pub const DEFAULT_THRESHOLDS: [f64; 2] = [1.0 / 3.0, 2.0 / 3.0];

/// The metric's tertiles over the dataset's usable rows (the rows `cross_validate` keeps): the
/// thresholds that make low, medium and high equally large, per dataset and so per family.
/// A labelling rule, like fixed thresholds: it reads only the target column, before any split,
/// and no model sees it. `t1 = v[n/3]`, `t2 = v[2n/3]` of the sorted values, so that with
/// left-closed bins about a third of the rows fall below each.
pub fn tertiles(ds: &Dataset, metric: UtilMetric) -> Result<[f64; 2], MlError> {
    // Every non-negative value falls in some bin of the default target, so its examples are
    // exactly the usable rows.
    let ex = Examples::build(ds, &target(metric, DEFAULT_THRESHOLDS)?)?;
    let mut v = ex.value.clone();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n < 3 {
        return Err(MlError::Invalid(format!("tertiles need at least 3 usable rows, {} has {n}", ds.path.display())));
    }
    let t = [v[n / 3], v[2 * n / 3]];
    if !(0.0 < t[0] && t[0] < t[1]) {
        return Err(MlError::Invalid(format!(
            "{}: the {} tertiles {} and {} do not separate three classes (too many equal values)",
            ds.path.display(),
            metric.kind().name(),
            t[0],
            t[1]
        )));
    }
    Ok(t)
}

/// The low / medium / high target for `metric` with the two inner thresholds `t`.
pub fn target(metric: UtilMetric, t: [f64; 2]) -> Result<Target, MlError> {
    // The metrics are fractions of the GPU's time or warps: a threshold past 1 leaves "high" empty.
    if !(0.0 < t[0] && t[0] < t[1] && t[1] <= 1.0) {
        return Err(MlError::Invalid(format!(
            "utilisation thresholds must satisfy 0 < low/medium < medium/high <= 1 (the metrics are fractions), \
             got {} and {}",
            t[0], t[1]
        )));
    }
    // The top edge is open-ended: a ratio of exactly 1.0 is "high", as is any rounding above it.
    let mut binning = Binning::new(vec![0.0, t[0], t[1], f64::INFINITY], Closed::Left);
    binning.names = vec!["low".into(), "medium".into(), "high".into()];
    Ok(Target { kind: metric.kind(), binning })
}

/// One model family's headline utilisation scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UtilModel {
    /// Model family.
    pub model: String,
    /// Held-out test accuracy (classifiers).
    pub accuracy: Option<f64>,
    /// Held-out recall of the "high" class (classifiers).
    pub high_class_recall: Option<f64>,
    /// Held-out macro F1 (classifiers).
    pub f1: Option<f64>,
    /// Mean CV accuracy on the development rows, which picks the best model (classifiers).
    pub cv_accuracy: Option<f64>,
    /// Held-out mean absolute error of the ratio (regressors).
    pub mae: Option<f64>,
    /// Why the model could not be evaluated.
    pub error: Option<String>,
}

/// The `memest util cv --json` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UtilSummary {
    /// Metric predicted.
    pub metric: UtilMetric,
    /// Family of the dataset.
    pub family: String,
    /// Inner thresholds used (low/medium, medium/high).
    pub thresholds: [f64; 2],
    /// Best classifier by CV accuracy on the development rows.
    pub model: String,
    /// Its held-out accuracy.
    pub accuracy: f64,
    /// Its held-out recall on the "high" class (null when the test set has no high row).
    pub high_class_recall: Option<f64>,
    /// Its held-out macro F1.
    pub f1: f64,
    /// Every model family tried.
    pub models: Vec<UtilModel>,
    /// The feature vector's columns: the family's GPUMemNet features, then any `k_` columns.
    pub features: Vec<String>,
}

/// Runs the stratified CV for a utilisation metric; returns the summary and the full report.
/// `kernel` appends its `k_` columns to every row's features (see [`KernelFeatures`]).
pub fn cross_validate(
    ds: &Dataset,
    metric: UtilMetric,
    thresholds: [f64; 2],
    cfg: &ProtocolConfig,
    kernel: Option<&KernelFeatures>,
) -> Result<(UtilSummary, Report), MlError> {
    let ex = Examples::build_with(ds, &target(metric, thresholds)?, kernel)?;
    let mut report = protocol::cross_validate(&ex, &ds.path.display().to_string(), cfg)?;
    if let Some(k) = kernel {
        let with: Vec<String> = k.settings.iter().map(|(n, v)| format!("{n} {v}")).collect();
        let with = if with.is_empty() { String::new() } else { format!(" (a step with {})", with.join(", ")) };
        report.notes.push(format!("{} kernel-statistics features from {}{with}", k.columns.len(), k.path.display()));
    }
    if thresholds == DEFAULT_THRESHOLDS {
        report.notes.push("default low/medium/high thresholds (thirds of 0-1), not the paper's bins".into());
    }
    let models: Vec<UtilModel> = report
        .models
        .iter()
        .map(|m| UtilModel {
            model: m.model.clone(),
            accuracy: m.test.as_ref().map(|t| t.accuracy),
            high_class_recall: m.test.as_ref().and_then(|t| t.recall_per_class.last().copied().flatten()),
            f1: m.test.as_ref().map(|t| t.f1_macro),
            cv_accuracy: m.cv_accuracy.map(|c| c.mean),
            mae: m.test_value.as_ref().and_then(|t| t.mae),
            error: m.error.clone(),
        })
        .collect();
    let best = models
        .iter()
        .filter(|m| m.cv_accuracy.is_some() && m.accuracy.is_some())
        .fold(None::<&UtilModel>, |b, m| match b {
            Some(b) if b.cv_accuracy >= m.cv_accuracy => Some(b),
            _ => Some(m),
        })
        .ok_or_else(|| MlError::Invalid("no classifier could be evaluated".into()))?;
    let summary = UtilSummary {
        metric,
        family: ex.family.name().to_string(),
        thresholds,
        model: best.model.clone(),
        accuracy: best.accuracy.unwrap_or(0.0),
        high_class_recall: best.high_class_recall,
        f1: best.f1.unwrap_or(0.0),
        models,
        features: ex.feature_names.clone(),
    };
    Ok((summary, report))
}
