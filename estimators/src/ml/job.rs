//! A job described by `memtrace_trainer features --json`, seen as a GPUMemNet dataset row, so a
//! model trained on the datasets can estimate a job the trainer describes.

use super::error::MlError;
use super::features::extract;
use super::modelfile::{ModelFile, Prediction};
use crate::dataset::DatasetRow;
use crate::features::{Features, Layer};

/// The row of a features JSON document; `source` names it in errors.
pub fn row_from_features(v: &serde_json::Value, source: &str) -> Result<DatasetRow, MlError> {
    let bad = |field: &str, expected: &str| MlError::Invalid(format!("{source}: field {field:?}: expected {expected}"));
    let count =
        |field: &str| v.get(field).and_then(serde_json::Value::as_u64).ok_or_else(|| bad(field, "a whole number"));
    // GPUMemNet's own layer names (lower-case torchsummary types) when the trainer gives them.
    let gpumemnet = v.get("gpumemnet_sequence").and_then(serde_json::Value::as_array).filter(|a| !a.is_empty());
    let seq = gpumemnet
        .or_else(|| v.get("sequence").and_then(serde_json::Value::as_array))
        .ok_or_else(|| bad("sequence", "a list of [type, activations, parameters]"))?;
    let mut layers = Vec::with_capacity(seq.len());
    for (i, l) in seq.iter().enumerate() {
        let a = l
            .as_array()
            .filter(|a| a.len() == 3)
            .ok_or_else(|| bad(&format!("sequence[{i}]"), "[type, activations, parameters]"))?;
        let kind = a[0].as_str().ok_or_else(|| bad(&format!("sequence[{i}][0]"), "a layer type"))?;
        layers.push(Layer {
            kind: kind.to_ascii_lowercase(),
            activations: a[1].as_u64().ok_or_else(|| bad(&format!("sequence[{i}][1]"), "a whole number"))?,
            parameters: a[2].as_u64().ok_or_else(|| bad(&format!("sequence[{i}][2]"), "a whole number"))?,
        });
    }
    // GPUMemNet's `Depth` counts the Conv2d layers of a CNN and the Linear layers of an MLP
    // ([`DatasetRow::gpumemnet_depth`] without a `Depth`); the trainer's `depth` counts every
    // layer with parameters, so it is used only when there is no GPUMemNet-style sequence.
    let depth = match gpumemnet {
        Some(_) => None,
        None => Some(v.get("depth").and_then(serde_json::Value::as_f64).ok_or_else(|| bad("depth", "a number"))?),
    };
    let features = Features {
        total_parameters: count("total_parameters")?,
        total_activations: count("total_activations")?,
        batch_size: None,
        model: None,
        seq_len: None,
        input_shape: None,
        layers,
    };
    Ok(DatasetRow::unmeasured(
        v.get("model").and_then(serde_json::Value::as_str).unwrap_or(""),
        features,
        count("batch_size")?,
        depth,
        v.get("activation_function").and_then(serde_json::Value::as_str).unwrap_or("None"),
    ))
}

/// The model's estimate for a job, or why it has none (another family, an unknown activation).
pub fn predict_job(model: &ModelFile, features: &serde_json::Value, source: &str) -> Result<Prediction, MlError> {
    let row = row_from_features(features, source)?;
    let family = row.family;
    if family != model.family {
        return Err(MlError::Invalid(format!(
            "the model was trained on {:?} runs and this job is a {:?}: no trained model fits its family",
            model.family, family
        )));
    }
    let x = extract(family, &row).map_err(|e| MlError::Invalid(format!("{source}: {e:?}")))?;
    let n = x.len();
    let x = ndarray::Array2::from_shape_vec((1, n), x).map_err(|e| MlError::Invalid(format!("{source}: {e}")))?;
    let mut p = model.predict(&x)?;
    p.pop().ok_or_else(|| MlError::Invalid(format!("{source}: the model returned no prediction")))
}
