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

/// What a feature's value must be, when `v` is not that: the activation encodings lie in
/// [-1, 1], the batch is at least 1, and every other feature (GPUMemNet's and the kernel
/// statistics alike) counts something, so is at least 0. `None` when `v` is in its domain.
pub fn out_of_domain(name: &str, v: f64) -> Option<&'static str> {
    if !v.is_finite() {
        return Some("a finite number");
    }
    match name {
        "activation_sin" | "activation_cos" if !(-1.0..=1.0).contains(&v) => {
            Some("a value in [-1, 1] (the activation's sin/cos encoding)")
        }
        "activation_sin" | "activation_cos" => None,
        "batch_size" if v < 1.0 => Some("a batch of at least 1"),
        _ if v < 0.0 => Some("a count of at least 0"),
        _ => None,
    }
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowIssue {
    /// The activation is not in the family's vocabulary; the message lists the vocabulary.
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
            let vocab: &[&str] = if family == Family::Mlp { &MLP_ACTIVATIONS } else { &CNN_ACTIVATIONS };
            RowIssue::UnknownActivation(format!("activation {activation:?} is not one of {}", vocab.join(", ")))
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
