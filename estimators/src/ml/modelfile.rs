//! Model files: one trained pipeline plus what is needed to use it (family, target, bins,
//! feature names), as JSON. Written to a temporary file and renamed, so a failed write never
//! leaves a partial model behind.
//!
//! Models trained on the GPUMemNet CSVs (CC BY-NC 4.0) are non-commercial build outputs: they are
//! written under `target/` or wherever `--out` points, and never committed.

use std::path::Path;

use ndarray::Array2;
use serde::{Deserialize, Serialize};

use super::error::MlError;
use super::examples::{Examples, Target};
use super::models::{ModelKind, Pipeline, TrainConfig};
use crate::features::Family;

/// Version of the model-file layout this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// The licence notice stored in, and printed for, every model file trained on GPUMemNet data.
pub const LICENCE_NOTE: &str = "trained on GPUMemNet data (CC BY-NC 4.0): this model file is a \
non-commercial build output; do not commit or redistribute it for commercial use";

/// The notice for a model trained on the trainer's own `dataset` output (its `spec` column):
/// the runs are the user's, and so are their terms.
pub const OWN_DATA_NOTE: &str = "trained on memtrace_trainer dataset output (your own runs): the \
model file carries the terms of that data";

/// A trained model and its metadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelFile {
    /// [`FORMAT_VERSION`] at write time.
    pub format_version: u32,
    /// Licence of the training data.
    pub licence: String,
    /// Family the model was trained for.
    pub family: Family,
    /// Target and bins.
    pub target: Target,
    /// Feature names, in the order the model expects them.
    pub feature_names: Vec<String>,
    /// The CSV it was trained on.
    pub trained_on: String,
    /// Rows it was trained on.
    pub training_rows: usize,
    /// The content digests of those rows ([`crate::rows::digest`]), sorted: a row is known as a
    /// training row in a copy of the CSV, a subset or another order. Empty in files written
    /// before they were recorded, where the CSV's path is the only evidence.
    #[serde(default)]
    pub training_digests: Vec<String>,
    /// The range of each feature over the training rows, in [`ModelFile::feature_names`]
    /// order: a job outside it is one the model never saw, and is said to be. `None` in files
    /// written before the ranges were recorded (read, with [`ModelFile::range_unknown`] said).
    #[serde(default)]
    pub training_ranges: Option<Vec<FeatureRange>>,
    /// Training settings.
    pub config: TrainConfig,
    /// Scaler and model.
    pub pipeline: Pipeline,
}

/// Whether `dataset` is the CSV a model was trained on, for model files without training
/// digests. `ModelFile::train` fits on every usable row of its CSV, so every row of that file
/// is a training row.
fn same_file(trained_on: &str, dataset: &Path) -> bool {
    let t = Path::new(trained_on);
    match (t.canonicalize(), dataset.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        // The training path no longer resolves (trained elsewhere): the file name is the evidence.
        _ => t.file_name().is_some() && t.file_name() == dataset.file_name(),
    }
}

/// The smallest and largest value of one feature over a model's training rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureRange {
    /// The feature's name (as in [`ModelFile::feature_names`], at the same position).
    pub feature: String,
    /// The smallest training value.
    pub min: f64,
    /// The largest training value.
    pub max: f64,
}

/// The reason a negative prediction is no memory figure.
pub const NEGATIVE: &str = "the model's prediction is negative: the input is outside what it was trained on";
/// The reason a prediction that is no finite number is no memory figure.
pub const NOT_FINITE: &str =
    "the model's prediction is not a finite number: the input is outside what it was trained on";

/// One prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// Predicted bin (classifiers).
    pub class: Option<usize>,
    /// Name of the predicted bin (classifiers).
    pub bin: Option<String>,
    /// What the model answered: the bin's upper edge (classifiers) or the predicted value
    /// (regressors), which outside the training range may be negative. [`Prediction::mib`] is
    /// the memory figure.
    pub raw: f64,
}

impl Prediction {
    /// The estimate in MiB, or why the model's answer is none ([`NEGATIVE`], [`NOT_FINITE`]).
    pub fn mib(&self) -> Result<f64, &'static str> {
        match self.raw {
            v if !v.is_finite() => Err(NOT_FINITE),
            v if v < 0.0 => Err(NEGATIVE),
            v => Ok(v),
        }
    }
}

/// A feature's value as a message shows it: whole numbers whole, others to four places, and
/// an exponent where the digits would not fit on a line.
fn show(v: f64) -> String {
    if v.abs() >= 1e15 {
        format!("{v:e}")
    } else if v.fract() == 0.0 {
        format!("{v}")
    } else {
        format!("{:.4}", v).trim_end_matches('0').to_string()
    }
}

impl ModelFile {
    /// Whether a row of `dataset` with content `digest` is one this model was trained on: by
    /// digest where the file records them, else (older files) when `dataset` is the training CSV.
    pub fn trained_on_row(&self, digest: &str, dataset: &Path) -> bool {
        if self.training_digests.is_empty() {
            return same_file(&self.trained_on, dataset);
        }
        self.training_digests.binary_search_by(|d| d.as_str().cmp(digest)).is_ok()
    }

    /// Whether the file records its training rows' digests (files written before did not).
    pub fn knows_training_rows(&self) -> bool {
        !self.training_digests.is_empty()
    }

    /// Trains `kind` on every usable row of `ex` (regressors: every measured row).
    pub fn train(
        ex: &Examples,
        kind: ModelKind,
        cfg: &TrainConfig,
        trained_on: &str,
        licence: &str,
    ) -> Result<ModelFile, MlError> {
        let idx: Vec<usize> = (0..ex.len()).filter(|&i| !kind.is_regressor() || ex.measured[i]).collect();
        let train = ex.subset(&idx);
        let mut training_digests = train.digests.clone();
        training_digests.sort_unstable();
        training_digests.dedup();
        let pipeline =
            Pipeline::fit(kind, ex.family, &train.x, &train.class, &train.value, ex.target.binning.classes(), cfg)?;
        let training_ranges = (train.x.nrows() > 0).then(|| {
            ex.feature_names
                .iter()
                .zip(train.x.columns())
                .map(|(name, col)| FeatureRange {
                    feature: name.clone(),
                    min: col.fold(f64::INFINITY, |a, &b| a.min(b)),
                    max: col.fold(f64::NEG_INFINITY, |a, &b| a.max(b)),
                })
                .collect()
        });
        Ok(ModelFile {
            format_version: FORMAT_VERSION,
            licence: licence.to_string(),
            family: ex.family,
            target: ex.target.clone(),
            feature_names: ex.feature_names.clone(),
            trained_on: trained_on.to_string(),
            training_rows: idx.len(),
            training_digests,
            training_ranges,
            config: cfg.clone(),
            pipeline,
        })
    }

    /// Writes the file atomically (temporary file in the same directory, then rename).
    pub fn save(&self, path: &Path) -> Result<(), MlError> {
        let io = |source| MlError::Io { path: path.to_path_buf(), source };
        let text =
            serde_json::to_string(self).map_err(|source| MlError::ModelFile { path: path.to_path_buf(), source })?;
        trace::write_bytes_atomic(path, text.as_bytes()).map_err(io)
    }

    /// Reads a model file, checking its format version.
    pub fn load(path: &Path) -> Result<ModelFile, MlError> {
        // Forests and ensembles of these datasets are a few MiB of JSON.
        let text = trace::read_small_string(path, 1 << 30)
            .map_err(|source| MlError::Io { path: path.to_path_buf(), source })?;
        #[derive(Deserialize)]
        struct Header {
            format_version: u32,
        }
        let json_err = |source| MlError::ModelFile { path: path.to_path_buf(), source };
        let header: Header = serde_json::from_str(&text).map_err(json_err)?;
        if header.format_version != FORMAT_VERSION {
            return Err(MlError::ModelFileVersion {
                path: path.to_path_buf(),
                found: header.format_version,
                expected: FORMAT_VERSION,
            });
        }
        let file: ModelFile = serde_json::from_str(&text).map_err(json_err)?;
        file.check(path)?;
        Ok(file)
    }

    /// Whether the parts agree: a file whose names were edited predicted a CSV by position
    /// while `--features` refused the same names, and bins without names failed every row.
    fn check(&self, path: &Path) -> Result<(), MlError> {
        let bad = |field, expected: String| Err(MlError::ModelFileField { path: path.to_path_buf(), field, expected });
        let names = super::features::feature_names(self.family);
        if self.feature_names != names {
            return bad(
                "feature_names",
                format!(
                    "{} model's features are {}; the file lists {}",
                    self.family,
                    names.join(", "),
                    self.feature_names.join(", ")
                ),
            );
        }
        let scaler = &self.pipeline.scaler;
        if scaler.mean.len() != names.len() || scaler.std.len() != names.len() {
            return bad(
                "pipeline.scaler",
                format!(
                    "{} means and {} deviations for {} features: one per feature",
                    scaler.mean.len(),
                    scaler.std.len(),
                    names.len()
                ),
            );
        }
        if self.target.kind != super::examples::TargetKind::MemoryMib {
            return bad(
                "target.kind",
                format!("{}: memest ml trains memory models (memory_mib)", self.target.kind.name()),
            );
        }
        let b = &self.target.binning;
        if b.edges.len() < 2
            || b.edges.windows(2).any(|w| w[0].partial_cmp(&w[1]) != Some(std::cmp::Ordering::Less))
            || b.names.len() != b.classes()
        {
            return bad(
                "target.binning",
                format!(
                    "{} edges and {} bin names: edges rising, at least two, and one name per interval between them",
                    b.edges.len(),
                    b.names.len()
                ),
            );
        }
        let hex = |d: &String| d.len() == 16 && d.bytes().all(|c| c.is_ascii_hexdigit());
        if self.training_digests.len() > self.training_rows
            || !self.training_digests.iter().all(hex)
            || self.training_digests.windows(2).any(|w| w[0] >= w[1])
        {
            return bad(
                "training_digests",
                format!(
                    "{} digests for {} training rows: at most one per row, 16 hex digits each, sorted and distinct",
                    self.training_digests.len(),
                    self.training_rows
                ),
            );
        }
        if let Err((field, expected)) = self.pipeline.check_body(names.len(), b.classes()) {
            return bad(field, expected);
        }
        if let Some(ranges) = &self.training_ranges {
            let aligned = ranges.len() == names.len() && ranges.iter().zip(names).all(|(r, n)| r.feature == *n);
            if !aligned || ranges.iter().any(|r| !(r.min.is_finite() && r.max.is_finite() && r.min <= r.max)) {
                return bad(
                    "training_ranges",
                    format!(
                        "one {{feature, min, max}} per feature, in the order {}, with finite min <= max",
                        names.join(", ")
                    ),
                );
            }
        }
        Ok(())
    }

    /// Why a job outside the training range goes unnoticed with this file, when it does (a file
    /// written before the ranges were recorded); `path` names the file.
    pub fn range_unknown(&self, path: &Path) -> Option<String> {
        self.training_ranges.is_none().then(|| {
            format!(
                "{}: the model file records no training range of its features (written before model files did): a \
                 job outside what it was trained on is not detected; train it again to record them",
                path.display()
            )
        })
    }

    /// Each feature of `x` (one row, in [`ModelFile::feature_names`] order) outside the range
    /// the model was trained on, as `feature "NAME" is V, outside the training range MIN to MAX`.
    /// The activation encodings are compared within [`super::features::ENCODING_TOLERANCE`].
    pub fn outside_training(&self, x: &[f64]) -> Vec<String> {
        let Some(ranges) = &self.training_ranges else { return Vec::new() };
        ranges
            .iter()
            .zip(x)
            .filter(|(r, &v)| {
                let slack =
                    if r.feature.starts_with("activation_") { super::features::ENCODING_TOLERANCE } else { 0.0 };
                !(v >= r.min - slack && v <= r.max + slack)
            })
            .map(|(r, &v)| {
                format!(
                    "feature {:?} is {}, outside the training range {} to {}",
                    r.feature,
                    show(v),
                    show(r.min),
                    show(r.max)
                )
            })
            .collect()
    }

    /// [`ModelFile::outside_training`], each warning naming where the row came from:
    /// `AT: feature "NAME" is V, outside the training range MIN to MAX`.
    pub fn outside_training_at(&self, x: &[f64], at: &str) -> Vec<String> {
        self.outside_training(x).into_iter().map(|w| format!("{at}: {w}")).collect()
    }

    /// Predicts every row of raw features `x` (columns in [`ModelFile::feature_names`] order).
    pub fn predict(&self, x: &Array2<f64>) -> Result<Vec<Prediction>, MlError> {
        if self.pipeline.kind.is_regressor() {
            Ok(self
                .pipeline
                .predict_value(x)?
                .into_iter()
                .map(|v| Prediction { class: None, bin: None, raw: v })
                .collect())
        } else {
            let b = &self.target.binning;
            Ok(self
                .pipeline
                .predict_class(x)?
                .into_iter()
                .map(|c| Prediction { class: Some(c), bin: b.names.get(c).cloned(), raw: b.estimate(c) })
                .collect())
        }
    }

    /// Builds a feature matrix from JSON: one object, or an array of objects, whose keys are
    /// exactly [`ModelFile::feature_names`].
    pub fn features_from_json(&self, json: &serde_json::Value, source: &str) -> Result<Array2<f64>, MlError> {
        let objects: Vec<&serde_json::Value> = match json {
            serde_json::Value::Array(a) => a.iter().collect(),
            other => vec![other],
        };
        let names = &self.feature_names;
        let mut data = Vec::with_capacity(objects.len() * names.len());
        for (i, o) in objects.iter().enumerate() {
            let map = o.as_object().ok_or_else(|| {
                MlError::Invalid(format!("{source}: entry {i}: expected an object with keys {}", names.join(", ")))
            })?;
            if let Some(extra) = map.keys().find(|k| !names.contains(k)) {
                return Err(MlError::Invalid(format!(
                    "{source}: entry {i}: unknown feature {extra:?}; expected {}",
                    names.join(", ")
                )));
            }
            let values: Vec<Option<f64>> = names.iter().map(|n| map.get(n).and_then(|v| v.as_f64())).collect();
            // Every absent or non-numeric feature at once: one at a time took as many reruns.
            let missing: Vec<String> =
                names.iter().zip(&values).filter(|(_, v)| v.is_none()).map(|(n, _)| format!("{n:?}")).collect();
            if !missing.is_empty() {
                let (noun, verb) = if missing.len() == 1 { ("feature", "is") } else { ("features", "are") };
                return Err(MlError::Invalid(format!(
                    "{source}: entry {i}: {noun} {} {verb} missing or not a number",
                    missing.join(", ")
                )));
            }
            for (n, v) in names.iter().zip(values.into_iter().flatten()) {
                if let Some(expected) = super::features::out_of_domain(n, v) {
                    return Err(MlError::Invalid(format!(
                        "{source}: entry {i}: feature {n:?} is {v}: expected {expected}"
                    )));
                }
                data.push(v);
            }
            let at = |n: &str| names.iter().position(|x| x == n).map(|i| data[data.len() - names.len() + i]);
            if let (Some(sin), Some(cos)) = (at("activation_sin"), at("activation_cos")) {
                if let Some(expected) = super::features::activation_pair_issue(self.family, sin, cos) {
                    return Err(MlError::Invalid(format!(
                        "{source}: entry {i}: features \"activation_sin\" and \"activation_cos\" are ({sin}, {cos}): \
                         expected {expected}"
                    )));
                }
            }
        }
        Array2::from_shape_vec((objects.len(), names.len()), data)
            .map_err(|e| MlError::Invalid(format!("{source}: {e}")))
    }
}
