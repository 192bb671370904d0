//! Evaluation protocols.
//!
//! * [`reproduce`]: GPUMemNet's own protocol: a 70/20/10 split with seed 42 (train / validation /
//!   test) and a 3-fold shuffled `KFold` with seed 42 over all usable rows. Python's RNG is not
//!   reproduced bit-for-bit (see [`super::split`]), so the members of each split differ from
//!   GPUMemNet's while the sizes and procedure match.
//! * [`cross_validate`]: a stratified, seeded hold-out test set, then a stratified, seeded k-fold
//!   CV on the remaining (development) rows; each model is finally refitted on all development
//!   rows and scored once on the hold-out set.
//!
//! Every fit sees only its training rows: [`evaluate_split`] copies them out before fitting, and
//! the feature scaler is part of the fitted [`Pipeline`].

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::error::MlError;
use super::examples::Examples;
use super::models::{ModelKind, Pipeline, TrainConfig};
use super::score;
use super::split::{self, Split};

/// Protocol settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProtocolConfig {
    /// Seed for every split.
    pub seed: u64,
    /// Number of CV folds.
    pub folds: usize,
    /// Fraction of rows held out as the final test set (stratified protocol).
    pub test_frac: f64,
    /// Model families to evaluate.
    pub models: Vec<ModelKind>,
    /// Per-model training settings.
    pub train: TrainConfig,
    /// Rows timed one at a time for the inference-latency percentiles.
    pub latency_rows: usize,
}

impl Default for ProtocolConfig {
    fn default() -> Self {
        ProtocolConfig {
            seed: 42,
            folds: 3,
            test_frac: 0.2,
            models: ModelKind::CLASSIFIERS.into_iter().chain(ModelKind::REGRESSORS).collect(),
            train: TrainConfig::default(),
            latency_rows: 200,
        }
    }
}

/// Mean and population standard deviation over folds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MeanStd {
    /// Mean over folds.
    pub mean: f64,
    /// Standard deviation over folds.
    pub std: f64,
}

impl MeanStd {
    fn of(v: &[f64]) -> MeanStd {
        let (mean, std) = score::mean_std(v);
        MeanStd { mean, std }
    }
}

/// Scores of a classifier on one evaluation set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassScores {
    /// Rows scored.
    pub rows: usize,
    /// Accuracy.
    pub accuracy: f64,
    /// Macro F1 over classes present in truth or prediction.
    pub f1_macro: f64,
    /// Support-weighted F1 (GPUMemNet's reported F1).
    pub f1_weighted: f64,
    /// Fraction predicted in a lower bin than the truth.
    pub below_diagonal: f64,
    /// Recall of the highest bin that has rows in the truth (the "high" class of utilisation
    /// targets); null for no rows.
    pub high_class_recall: Option<f64>,
    /// Recall of each bin, in class order; null for bins without rows in the truth.
    pub recall_per_class: Vec<Option<f64>>,
}

impl ClassScores {
    fn of(truth: &[usize], pred: &[usize], n_classes: usize) -> ClassScores {
        ClassScores {
            rows: truth.len(),
            accuracy: score::accuracy(truth, pred),
            f1_macro: score::f1_macro(truth, pred),
            f1_weighted: score::f1_weighted(truth, pred),
            below_diagonal: score::below_diagonal(truth, pred),
            high_class_recall: (0..n_classes).rev().find_map(|c| score::recall_of(truth, pred, c)),
            recall_per_class: (0..n_classes).map(|c| score::recall_of(truth, pred, c)).collect(),
        }
    }
}

/// Scores of a regressor on one evaluation set (measured rows only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValueScores {
    /// Rows scored.
    pub rows: usize,
    /// Mean relative error.
    pub mre: Option<f64>,
    /// Mean absolute error, in the target's unit.
    pub mae: Option<f64>,
    /// Fraction of estimates below the truth.
    pub under_rate: Option<f64>,
}

/// Inference latency of one row, features already extracted, scaling included.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Median, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
}

/// One model family's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResult {
    /// Model family name.
    pub model: String,
    /// Classifier scores per CV fold (empty for regressors).
    pub fold_scores: Vec<ClassScores>,
    /// Regressor scores per CV fold (empty for classifiers).
    pub fold_value_scores: Vec<ValueScores>,
    /// CV accuracy over folds (classifiers).
    pub cv_accuracy: Option<MeanStd>,
    /// CV macro F1 over folds (classifiers).
    pub cv_f1_macro: Option<MeanStd>,
    /// CV weighted F1 over folds (classifiers).
    pub cv_f1_weighted: Option<MeanStd>,
    /// CV MRE over folds (regressors).
    pub cv_mre: Option<MeanStd>,
    /// CV MAE over folds (regressors).
    pub cv_mae: Option<MeanStd>,
    /// Validation-set scores (GPUMemNet protocol only).
    pub validation: Option<ClassScores>,
    /// Held-out test scores of the final fit (classifiers).
    pub test: Option<ClassScores>,
    /// Held-out test scores of the final fit (regressors).
    pub test_value: Option<ValueScores>,
    /// Seconds to fit the final model.
    pub fit_seconds: f64,
    /// Per-row inference latency of the final model.
    pub latency: Latency,
    /// Why this model could not be evaluated (the other models still are).
    pub error: Option<String>,
}

/// A protocol's full report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// `stratified-cv` or `gpumemnet`.
    pub protocol: String,
    /// The CSV evaluated.
    pub dataset: String,
    /// Model family of its rows.
    pub family: String,
    /// Target column.
    pub target: String,
    /// Bin names, in class order.
    pub bins: Vec<String>,
    /// Usable rows.
    pub rows: usize,
    /// Rows excluded, per reason.
    pub excluded: Vec<(String, usize)>,
    /// Usable rows per class.
    pub class_counts: Vec<usize>,
    /// Split seed.
    pub seed: u64,
    /// Number of CV folds.
    pub folds: usize,
    /// Rows in the final test set.
    pub test_rows: usize,
    /// Results per model family.
    pub models: Vec<ModelResult>,
    /// Caveats a reader must know.
    pub notes: Vec<String>,
}

/// The splits of the stratified protocol, as positions into the examples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Development rows (train) vs. the held-out test set (test).
    pub holdout: Split,
    /// CV folds over the development rows, as positions into the *examples* (not into `dev`).
    pub folds: Vec<Split>,
}

/// Builds the stratified plan: hold-out first, folds over the remaining rows only.
pub fn plan(ex: &Examples, cfg: &ProtocolConfig) -> Result<Plan, MlError> {
    let holdout = split::stratified_holdout(&ex.class, cfg.test_frac, cfg.seed);
    let dev_labels: Vec<usize> = holdout.train.iter().map(|&i| ex.class[i]).collect();
    if cfg.folds > dev_labels.len() {
        return Err(MlError::Invalid(format!(
            "folds = {}: more than the {} development rows the folds share (the {} usable rows less the {} held out \
             for the test set, test fraction {}): use fewer folds or a smaller test fraction",
            cfg.folds,
            dev_labels.len(),
            ex.len(),
            holdout.test.len(),
            cfg.test_frac
        )));
    }
    let folds = split::stratified_kfold(&dev_labels, cfg.folds, cfg.seed)?
        .into_iter()
        .map(|f| Split {
            train: f.train.iter().map(|&i| holdout.train[i]).collect(),
            test: f.test.iter().map(|&i| holdout.train[i]).collect(),
        })
        .collect();
    Ok(Plan { holdout, folds })
}

/// What one fit produced on one split.
#[derive(Debug, Clone)]
pub struct SplitOutcome {
    /// The fitted pipeline (trained on `split.train` only).
    pub pipeline: Pipeline,
    /// Predicted classes of `split.test` (classifiers).
    pub classes: Vec<usize>,
    /// Predicted values of `split.test` (regressors).
    pub values: Vec<f64>,
    /// Seconds spent fitting.
    pub fit_seconds: f64,
}

/// Fits `kind` on the rows at `split.train` (regressors: their measured rows only) and predicts
/// the rows at `split.test`. Nothing of the test rows reaches the fit.
pub fn evaluate_split(
    ex: &Examples,
    kind: ModelKind,
    split: &Split,
    cfg: &TrainConfig,
) -> Result<SplitOutcome, MlError> {
    let mut train_idx = split.train.clone();
    if kind.is_regressor() {
        train_idx.retain(|&i| ex.measured[i]);
    }
    let train = ex.subset(&train_idx);
    let test = ex.subset(&split.test);
    let started = Instant::now();
    let pipeline =
        Pipeline::fit(kind, ex.family, &train.x, &train.class, &train.value, ex.target.binning.classes(), cfg)?;
    let fit_seconds = started.elapsed().as_secs_f64();
    let (classes, values) = if kind.is_regressor() {
        (Vec::new(), pipeline.predict_value(&test.x)?)
    } else {
        (pipeline.predict_class(&test.x)?, Vec::new())
    };
    Ok(SplitOutcome { pipeline, classes, values, fit_seconds })
}

fn value_scores(ex: &Examples, test: &[usize], est: &[f64]) -> ValueScores {
    let (truth, est): (Vec<f64>, Vec<f64>) =
        test.iter().zip(est).filter(|(&i, _)| ex.measured[i]).map(|(&i, &e)| (ex.value[i], e)).unzip();
    ValueScores {
        rows: truth.len(),
        mre: score::mre(&truth, &est),
        mae: score::mae(&truth, &est),
        under_rate: score::under_rate(&truth, &est),
    }
}

fn latency(pipeline: &Pipeline, ex: &Examples, rows: &[usize], n: usize) -> Result<Latency, MlError> {
    let mut times = Vec::with_capacity(n);
    for &i in rows.iter().cycle().take(n.max(1)) {
        let x = ex.x.select(ndarray::Axis(0), &[i]);
        let t = Instant::now();
        if pipeline.kind.is_regressor() {
            std::hint::black_box(pipeline.predict_value(&x)?);
        } else {
            std::hint::black_box(pipeline.predict_class(&x)?);
        }
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(Latency {
        p50_us: score::percentile(&times, 50.0).unwrap_or(0.0),
        p99_us: score::percentile(&times, 99.0).unwrap_or(0.0),
    })
}

fn empty_result(kind: ModelKind) -> ModelResult {
    ModelResult {
        model: kind.name().to_string(),
        fold_scores: Vec::new(),
        fold_value_scores: Vec::new(),
        cv_accuracy: None,
        cv_f1_macro: None,
        cv_f1_weighted: None,
        cv_mre: None,
        cv_mae: None,
        validation: None,
        test: None,
        test_value: None,
        fit_seconds: 0.0,
        latency: Latency { p50_us: 0.0, p99_us: 0.0 },
        error: None,
    }
}

/// Runs `kind` over CV `folds` and a final `fin` split; fills the CV and test fields.
fn run_model(
    ex: &Examples,
    kind: ModelKind,
    folds: &[Split],
    fin: &Split,
    cfg: &ProtocolConfig,
) -> Result<(ModelResult, Pipeline), MlError> {
    let n_classes = ex.target.binning.classes();
    let mut r = empty_result(kind);
    for f in folds {
        let out = evaluate_split(ex, kind, f, &cfg.train)?;
        if kind.is_regressor() {
            r.fold_value_scores.push(value_scores(ex, &f.test, &out.values));
        } else {
            let truth: Vec<usize> = f.test.iter().map(|&i| ex.class[i]).collect();
            r.fold_scores.push(ClassScores::of(&truth, &out.classes, n_classes));
        }
    }
    let out = evaluate_split(ex, kind, fin, &cfg.train)?;
    r.fit_seconds = out.fit_seconds;
    if kind.is_regressor() {
        let get = |f: fn(&ValueScores) -> Option<f64>| {
            let v: Vec<f64> = r.fold_value_scores.iter().filter_map(f).collect();
            MeanStd::of(&v)
        };
        r.cv_mre = Some(get(|s| s.mre));
        r.cv_mae = Some(get(|s| s.mae));
        r.test_value = Some(value_scores(ex, &fin.test, &out.values));
    } else {
        let get = |f: fn(&ClassScores) -> f64| MeanStd::of(&r.fold_scores.iter().map(f).collect::<Vec<_>>());
        r.cv_accuracy = Some(get(|s| s.accuracy));
        r.cv_f1_macro = Some(get(|s| s.f1_macro));
        r.cv_f1_weighted = Some(get(|s| s.f1_weighted));
        let truth: Vec<usize> = fin.test.iter().map(|&i| ex.class[i]).collect();
        r.test = Some(ClassScores::of(&truth, &out.classes, n_classes));
    }
    r.latency = latency(&out.pipeline, ex, &fin.test, cfg.latency_rows)?;
    Ok((r, out.pipeline))
}

/// A model that could not be evaluated is reported with its error, not fatal to the others.
fn failed(kind: ModelKind, e: &MlError) -> ModelResult {
    ModelResult { error: Some(e.to_string()), ..empty_result(kind) }
}

fn base_report(ex: &Examples, dataset: &str, protocol: &str, cfg: &ProtocolConfig) -> Report {
    Report {
        protocol: protocol.to_string(),
        dataset: dataset.to_string(),
        family: ex.family.name().to_string(),
        target: ex.target.kind.name().to_string(),
        bins: ex.target.binning.names.clone(),
        rows: ex.len(),
        excluded: ex.excluded.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        class_counts: ex.class_counts(),
        seed: cfg.seed,
        folds: cfg.folds,
        test_rows: 0,
        models: Vec::new(),
        notes: vec!["splits use rand 0.8 StdRng seeded with the given seed; Python's RNG is not \
             reproduced bit-for-bit, so split members differ from sklearn's"
            .to_string()],
    }
}

/// Rows all in one class give a classifier nothing to learn, and an accuracy of 1.0 that was
/// reported as the best model's.
fn two_classes(ex: &Examples, cfg: &ProtocolConfig) -> Result<(), MlError> {
    let counts = ex.class_counts();
    if cfg.models.iter().all(|k| k.is_regressor()) || counts.iter().filter(|&&n| n > 0).count() >= 2 {
        return Ok(());
    }
    let bins: Vec<String> = ex.target.binning.names.iter().zip(&counts).map(|(n, c)| format!("{n}: {c}")).collect();
    Err(MlError::Invalid(format!(
        "every row falls in one class ({}): a classifier has nothing to learn and its accuracy says nothing; \
         choose bins or thresholds that split the rows",
        bins.join(", ")
    )))
}

/// The stratified protocol: stratified hold-out test set, stratified k-fold CV on the rest,
/// final refit on all development rows scored on the hold-out set.
pub fn cross_validate(ex: &Examples, dataset: &str, cfg: &ProtocolConfig) -> Result<Report, MlError> {
    two_classes(ex, cfg)?;
    let p = plan(ex, cfg)?;
    let mut report = base_report(ex, dataset, "stratified-cv", cfg);
    report.test_rows = p.holdout.test.len();
    report.notes.push("regressors train and score on measured rows only (no OOM rows, no 0-MiB rows)".into());
    for &kind in &cfg.models {
        report.models.push(match run_model(ex, kind, &p.folds, &p.holdout, cfg) {
            Ok((r, _)) => r,
            Err(e) => failed(kind, &e),
        });
    }
    Ok(report)
}

/// GPUMemNet's protocol: train on its 70% split, score its 20% validation and 10% test splits,
/// and a shuffled 3-fold KFold over all rows. Classifiers only (GPUMemNet has no regressor).
pub fn reproduce(ex: &Examples, dataset: &str, cfg: &ProtocolConfig) -> Result<Report, MlError> {
    if cfg.models.iter().all(|k| k.is_regressor()) {
        return Err(MlError::Invalid(
            "GPUMemNet's protocol scores classifiers only, and no classifier is among the models".into(),
        ));
    }
    two_classes(ex, cfg)?;
    let (train, val, test) = split::gpumemnet_split(ex.len(), cfg.seed);
    let folds = split::kfold(ex.len(), cfg.folds, cfg.seed)?;
    let mut report = base_report(ex, dataset, "gpumemnet", cfg);
    report.test_rows = test.len();
    report.notes.push(format!(
        "70/20/10 split: {} train, {} validation, {} test rows; KFold over all {} rows \
         (GPUMemNet's published k-fold JSON shows 700-row folds, i.e. it folded 2100 rows)",
        train.len(),
        val.len(),
        test.len(),
        ex.len()
    ));
    let n_classes = ex.target.binning.classes();
    for &kind in cfg.models.iter().filter(|k| !k.is_regressor()) {
        let fin = Split { train: train.clone(), test: test.clone() };
        let scored = run_model(ex, kind, &folds, &fin, cfg).and_then(|(mut r, pipeline)| {
            let predicted = pipeline.predict_class(&ex.subset(&val).x)?;
            let truth: Vec<usize> = val.iter().map(|&i| ex.class[i]).collect();
            r.validation = Some(ClassScores::of(&truth, &predicted, n_classes));
            Ok(r)
        });
        report.models.push(scored.unwrap_or_else(|e| failed(kind, &e)));
    }
    Ok(report)
}
