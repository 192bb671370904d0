//! GPUMemNet's feature sets (`Ensemble/dataloaders/dataloaders4mlp.py`), one per family.

use crate::dataset::DatasetRow;
use crate::features::Family;

/// MLP-data features, in GPUMemNet's column order.
pub const MLP_FEATURES: [&str; 8] = [
    "layers",
    "batch_size",
    "parameters",
    "activations",
    "batch_norm_layers",
    "dropout_layers",
    "activation_sin",
    "activation_cos",
];

/// CNN-data features, in GPUMemNet's column order.
pub const CNN_FEATURES: [&str; 10] = [
    "depth",
    "total_activations",
    "activations_x_batch",
    "parameters",
    "batch_size",
    "conv2d_count",
    "batchnorm2d_count",
    "dropout_count",
    "activation_sin",
    "activation_cos",
];

/// Transformer-data features, in GPUMemNet's column order (no activation encoding there).
pub const TRANSFORMER_FEATURES: [&str; 9] = [
    "depth",
    "total_activations",
    "activations_x_batch",
    "parameters",
    "batch_size",
    "nondynamicallyquantizablelinear_count",
    "linear_count",
    "layernorm_count",
    "dropout_count",
];

/// GPUMemNet's activation vocabulary for MLP data; the index sets the (sin, cos) encoding.
pub const MLP_ACTIVATIONS: [&str; 11] =
    ["ELU", "GELU", "Identity", "LeakyReLU", "Mish", "PReLU", "ReLU", "SELU", "SiLU", "Softplus", "Tanh"];

/// GPUMemNet's activation vocabulary for CNN data (no `Identity`).
pub const CNN_ACTIVATIONS: [&str; 10] =
    ["ELU", "GELU", "LeakyReLU", "Mish", "PReLU", "ReLU", "SELU", "SiLU", "Softplus", "Tanh"];

/// Whether `name` is one of GPUMemNet's features that count something (layers, parameters,
/// activations, samples): every one but the activation's (sin, cos) encoding.
fn is_count(name: &str) -> bool {
    !name.starts_with("activation_")
        && [&MLP_FEATURES[..], &CNN_FEATURES[..], &TRANSFORMER_FEATURES[..]].iter().any(|f| f.contains(&name))
}

/// What a feature's value must be, when `v` is not that: the activation encodings lie in
/// [-1, 1], the batch is a whole number of at least 1, GPUMemNet's other features count
/// something (whole numbers, at least 0), and the kernel statistics are at least 0. `None` when
/// `v` is in its domain. The (sin, cos) pair is checked as one: [`activation_pair_issue`].
pub fn out_of_domain(name: &str, v: f64) -> Option<&'static str> {
    if !v.is_finite() {
        return Some("a finite number");
    }
    match name {
        "activation_sin" | "activation_cos" if !(-1.0..=1.0).contains(&v) => {
            Some("a value in [-1, 1] (the activation's sin/cos encoding)")
        }
        "activation_sin" | "activation_cos" => None,
        "batch_size" if v < 1.0 || v.fract() != 0.0 => Some("a batch of at least 1, a whole number"),
        _ if v < 0.0 => Some("a count of at least 0"),
        _ if v.fract() != 0.0 && is_count(name) => Some("a whole number (it counts something)"),
        _ => None,
    }
}

/// How far (Euclidean) a given (sin, cos) pair may lie from an activation's exact encoding and
/// still name it: GPUMemNet's encodings rounded to two places are within 0.01, and neighbouring
/// encodings are at least 0.28 apart.
pub const ENCODING_TOLERANCE: f64 = 0.02;

/// The family's activation vocabulary (its index sets the encoding); empty for Transformers,
/// whose feature set has no activation.
pub fn activations(family: Family) -> &'static [&'static str] {
    match family {
        Family::Mlp => &MLP_ACTIVATIONS,
        Family::Cnn => &CNN_ACTIVATIONS,
        Family::Transformer => &[],
    }
}

/// Why `(sin, cos)` is no activation's encoding for `family` ([`activation_encoding`], within
/// [`ENCODING_TOLERANCE`]), listing the encodings; `None` when it is one.
pub fn activation_pair_issue(family: Family, sin: f64, cos: f64) -> Option<String> {
    let vocab = activations(family);
    let encodings: Vec<(&str, (f64, f64))> =
        vocab.iter().filter_map(|a| activation_encoding(family, a).map(|e| (*a, e))).collect();
    if encodings.iter().any(|(_, (s, c))| (s - sin).hypot(c - cos) <= ENCODING_TOLERANCE) {
        return None;
    }
    let listed: Vec<String> = encodings.iter().map(|(a, (s, c))| format!("{a} ({s:.4}, {c:.4})")).collect();
    Some(format!(
        "the (sin, cos) encoding of one of the {family} activations (within {ENCODING_TOLERANCE}): {}",
        listed.join(", ")
    ))
}

/// Feature names for a family.
pub fn feature_names(family: Family) -> &'static [&'static str] {
    match family {
        Family::Mlp => &MLP_FEATURES,
        Family::Cnn => &CNN_FEATURES,
        Family::Transformer => &TRANSFORMER_FEATURES,
    }
}

/// GPUMemNet's "positional encoding" of the activation: index `i` of `n` maps to
/// `(sin(i·π/n), cos(i·π/n))`, so neighbours in the alphabetical list are close.
pub fn activation_encoding(family: Family, activation: &str) -> Option<(f64, f64)> {
    let vocab: &[&str] = match family {
        Family::Mlp => &MLP_ACTIVATIONS,
        Family::Cnn => &CNN_ACTIVATIONS,
        Family::Transformer => return Some((0.0, 1.0)),
    };
    let i = vocab.iter().position(|a| *a == activation)?;
    let angle = i as f64 * std::f64::consts::PI / vocab.len() as f64;
    Some((angle.sin(), angle.cos()))
}

/// Why a row cannot give a feature vector.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowIssue {
    /// The activation is not in the family's vocabulary; the message lists the vocabulary.
    #[error("{0}")]
    UnknownActivation(String),
}

/// The feature vector of one row for `family`, in [`feature_names`] order. A row without `Depth`
/// or `Activation Function` (the trainer's rows of non-GPUMemNet models) gets GPUMemNet's depth
/// rule and activation `None` ([`DatasetRow::gpumemnet_depth`], [`DatasetRow::activation_name`]).
pub fn extract(family: Family, row: &DatasetRow) -> Result<Vec<f64>, RowIssue> {
    let count = |pred: &dyn Fn(&str) -> bool| row.count_layers(pred) as f64;
    let depth = row.gpumemnet_depth();
    let (activations, parameters) = (row.features.total_activations as f64, row.features.total_parameters as f64);
    let batch = row.batch as f64;
    let act_x_batch = activations * batch;
    let activation = row.activation_name();
    let encoding = || {
        activation_encoding(family, activation).ok_or_else(|| {
            let vocab = self::activations(family).join(", ");
            RowIssue::UnknownActivation(format!("activation {activation:?} is not one of {vocab}"))
        })
    };
    Ok(match family {
        Family::Mlp => {
            let (s, c) = encoding()?;
            vec![
                depth,
                batch,
                parameters,
                activations,
                count(&|k| k.contains("batch_norm") || k.contains("batchnorm")),
                count(&|k| k.contains("dropout")),
                s,
                c,
            ]
        }
        Family::Cnn => {
            let (s, c) = encoding()?;
            vec![
                depth,
                activations,
                act_x_batch,
                parameters,
                batch,
                count(&|k| k == "conv2d"),
                count(&|k| k == "batchnorm2d" || k == "batch_normalization"),
                count(&|k| k.contains("dropout")),
                s,
                c,
            ]
        }
        Family::Transformer => vec![
            depth,
            activations,
            act_x_batch,
            parameters,
            batch,
            count(&|k| k == "nondynamicallyquantizablelinear"),
            count(&|k| k == "linear"),
            count(&|k| k == "layernorm"),
            count(&|k| k.contains("dropout")),
        ],
    })
}
