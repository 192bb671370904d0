//! A job described by `memtrace_trainer features --json` (read by the one parser,
//! [`FeaturesFile`]), seen as a GPUMemNet dataset row, so a model trained on the datasets can
//! estimate a job the trainer describes.

use super::error::MlError;
use super::features::extract;
use super::modelfile::{ModelFile, Prediction};
use crate::dataset::DatasetRow;
use crate::features::{Features, Layer};
use crate::features_file::FeaturesFile;

/// The row of a features file; `source` names it in errors.
pub fn row_from_features(file: &FeaturesFile, source: &str) -> Result<DatasetRow, MlError> {
    let bad = |field: &str, expected: &str| MlError::Invalid(format!("{source}: field {field:?}: expected {expected}"));
    let f = &file.features;
    // GPUMemNet's own layer names (lower-case torchsummary types) when the trainer gives them.
    let gpumemnet = !file.gpumemnet_layers.is_empty();
    let seq = if gpumemnet { &file.gpumemnet_layers } else { &f.layers };
    let layers: Vec<Layer> = seq.iter().map(|l| Layer { kind: l.kind.to_ascii_lowercase(), ..l.clone() }).collect();
    // GPUMemNet's `Depth` counts the Conv2d layers of a CNN and the Linear layers of an MLP
    // ([`DatasetRow::gpumemnet_depth`] without a `Depth`); the trainer's `depth` counts every
    // layer with parameters, so it is used only when there is no GPUMemNet-style sequence.
    let depth = match gpumemnet {
        true => None,
        false => Some(file.depth.ok_or_else(|| bad("depth", "a whole number (the model's depth)"))? as f64),
    };
    let batch =
        f.batch_size.ok_or_else(|| bad("batch_size", "a whole number >= 1 (the ML features need the batch)"))?;
    let features = Features { layers, ..f.clone() };
    Ok(DatasetRow::unmeasured(
        f.model.as_deref().unwrap_or(""),
        features,
        batch,
        depth,
        file.activation_function.as_deref().unwrap_or("None"),
    ))
}

/// The model's answer for a job, with what it cannot vouch for: each feature outside the range
/// it was trained on, or that the model file does not record the range.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPrediction {
    /// The answer ([`Prediction::mib`] is the memory figure, or why there is none).
    pub prediction: Prediction,
    /// Features outside the training range, or the range unknown (an older model file).
    pub warnings: Vec<String>,
}

/// The model's estimate for a job, or why it has none (another family, an unknown activation);
/// `model_path` and `source` (the features file) name them in messages.
pub fn predict_job(
    model: &ModelFile,
    model_path: &std::path::Path,
    file: &FeaturesFile,
    source: &str,
) -> Result<JobPrediction, MlError> {
    let row = row_from_features(file, source)?;
    let family = row.family;
    if family != model.family {
        return Err(MlError::Invalid(format!(
            "the model was trained on {} runs and this job is a {}: no trained model fits its family",
            model.family.as_str(),
            family.as_str()
        )));
    }
    let x = extract(family, &row).map_err(|e| MlError::Invalid(format!("{source}: {e}")))?;
    let mut warnings: Vec<String> = model.range_unknown(model_path).into_iter().collect();
    warnings.extend(model.outside_training_at(&x, &format!("{}: {source}", model_path.display())));
    let n = x.len();
    let x = ndarray::Array2::from_shape_vec((1, n), x).map_err(|e| MlError::Invalid(format!("{source}: {e}")))?;
    let mut p = model.predict(&x)?;
    let prediction = p.pop().ok_or_else(|| MlError::Invalid(format!("{source}: the model returned no prediction")))?;
    Ok(JobPrediction { prediction, warnings })
}
