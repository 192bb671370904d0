//! Model features as the trainer's `features --json` prints them (parameters, per-sample
//! activations, layers), and the model family decided from the layer types.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{EstimateError, Result};

/// Model family, decided from the layer types by [`Family::from_layer_types`]; the one family
/// type of the crate (reports, the safe number's margins, the ML estimators and their model files).
///
/// Serialized in lower case (`mlp`, `cnn`, `transformer`, as ML model files have always stored
/// it); `MLP`, `CNN` and `Transformer` are read too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Family {
    /// Only dense layers.
    #[serde(rename = "mlp", alias = "MLP")]
    Mlp,
    /// Any convolution (and no attention).
    #[serde(rename = "cnn", alias = "CNN")]
    Cnn,
    /// Any attention.
    #[serde(rename = "transformer", alias = "Transformer")]
    Transformer,
}

impl Family {
    /// Every family, in report order.
    pub const ALL: [Family; 3] = [Family::Mlp, Family::Cnn, Family::Transformer];

    /// Display name in reports and JSON outputs (`MLP`, `CNN`, `Transformer`).
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Mlp => "MLP",
            Family::Cnn => "CNN",
            Family::Transformer => "Transformer",
        }
    }

    /// Lower-case name used on the command line, in the profile's safety margins, in ML model
    /// files and by [`fmt::Display`].
    pub fn name(self) -> &'static str {
        match self {
            Family::Mlp => "mlp",
            Family::Cnn => "cnn",
            Family::Transformer => "transformer",
        }
    }

    /// Parses either name of a family (`mlp`, `MLP`, `cnn`, `transformer`, ...), ignoring case.
    pub fn parse(s: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name().eq_ignore_ascii_case(s.trim()))
    }

    /// The family of a model with these layer types. Attention wins over convolution: a ViT's
    /// patch embedding is a convolution, but its memory behaves like a Transformer's.
    pub fn from_layer_types<'a>(types: impl IntoIterator<Item = &'a str> + Clone) -> Family {
        if types.clone().into_iter().any(is_attention) {
            Family::Transformer
        } else if types.into_iter().any(is_convolution) {
            Family::Cnn
        } else {
            Family::Mlp
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a layer type is a convolution that runs on cuDNN. GPT-2's `Conv1D` is a GEMM in
/// disguise (transformers' `pytorch_utils.Conv1D`), so the match is case-sensitive on `d`.
pub fn is_convolution(t: &str) -> bool {
    let l = t.to_ascii_lowercase();
    if t == "Conv1D" {
        return false;
    }
    // torch: Conv1d/2d/3d, ConvTranspose1d..3d, LazyConv*; GPUMemNet's CSV: "conv2d".
    let core = l.strip_prefix("lazy").unwrap_or(&l);
    core.starts_with("conv") && (core.ends_with("1d") || core.ends_with("2d") || core.ends_with("3d"))
}

/// Whether a layer type is attention. `NonDynamicallyQuantizableLinear` is the output projection
/// only `nn.MultiheadAttention` has, so torchsummary rows that list it are attention models.
pub fn is_attention(t: &str) -> bool {
    let l = t.to_ascii_lowercase();
    l.contains("attention") || l.contains("nondynamicallyquantizablelinear")
}

/// Whether a layer type runs a GEMM through cuBLAS.
pub fn is_gemm(t: &str) -> bool {
    let l = t.to_ascii_lowercase();
    l == "linear"
        || l.ends_with("linear")
        || t == "Conv1D"
        || is_attention(t)
        || matches!(l.as_str(), "lstm" | "gru" | "rnn" | "bilinear")
}

/// One layer: type, per-sample output elements, parameters. The one layer type of the crate:
/// `features --json` layers and the entries of a dataset's `Activations-Params` cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layer {
    /// Module class name (`Linear`, `Conv2d`, ...; GPUMemNet's CSVs use torchsummary's lower-case
    /// names such as `linear`, `conv2d`, `batchnorm2d`).
    pub kind: String,
    /// Output elements per sample.
    pub activations: u64,
    /// Parameters owned by the layer.
    pub parameters: u64,
}

/// Features of one model configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Features {
    /// Total parameters P.
    pub total_parameters: u64,
    /// Total activations per sample A (sum of layer outputs, torchsummary-style).
    pub total_activations: u64,
    /// Batch size, when the features were taken for one.
    pub batch_size: Option<u64>,
    /// Layers in execution order.
    pub layers: Vec<Layer>,
}

impl Features {
    /// Parse `features --json` output; `path` names the input in errors.
    pub fn parse_json(text: &str, path: &Path) -> Result<Features> {
        let field = |field: &str, expected: &str| EstimateError::Field {
            path: path.to_path_buf(),
            field: field.to_string(),
            expected: expected.to_string(),
        };
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| field("<document>", &format!("expected a JSON object ({e})")))?;
        let count = |name: &str| -> Result<u64> {
            v.get(name).and_then(serde_json::Value::as_u64).ok_or_else(|| field(name, "expected a whole number >= 0"))
        };
        let total_parameters = count("total_parameters")?;
        let total_activations = count("total_activations")?;
        let batch_size = match v.get("batch_size") {
            None | Some(serde_json::Value::Null) => None,
            Some(b) => Some(b.as_u64().ok_or_else(|| field("batch_size", "expected a whole number >= 1"))?),
        };
        // Layers in execution order: the `sequence` list ([type, activations, parameters] per
        // layer) when present; else `layers`, an object keyed by execution index.
        let layers = if let Some(seq) = v.get("sequence").and_then(serde_json::Value::as_array) {
            let mut out = Vec::with_capacity(seq.len());
            for (i, item) in seq.iter().enumerate() {
                let f = format!("sequence[{i}]");
                let arr = item
                    .as_array()
                    .filter(|a| a.len() == 3)
                    .ok_or_else(|| field(&f, "expected [type, activations, parameters]"))?;
                let kind = arr[0].as_str().ok_or_else(|| field(&format!("{f}[0]"), "expected a layer type string"))?;
                let num = |j: usize| {
                    arr[j].as_u64().ok_or_else(|| field(&format!("{f}[{j}]"), "expected a whole number >= 0"))
                };
                out.push(Layer { kind: kind.to_string(), activations: num(1)?, parameters: num(2)? });
            }
            out
        } else {
            let layers_v = v.get("layers").and_then(serde_json::Value::as_object).ok_or_else(|| {
                field("layers", "expected `sequence` (a list of [type, activations, parameters]) or `layers` keyed by execution index")
            })?;
            // Keys are execution indices as strings; order numerically, not lexically.
            let mut keyed: Vec<(u64, Layer)> = Vec::with_capacity(layers_v.len());
            for (k, l) in layers_v {
                let at = |f: &str| format!("layers.{k}.{f}");
                let idx: u64 = k.parse().map_err(|_| {
                    field(
                        &format!("layers.{k}"),
                        "expected a numeric layer index (or give the ordered `sequence` list)",
                    )
                })?;
                let kind = l
                    .get("type")
                    .and_then(serde_json::Value::as_str)
                    .ok_or_else(|| field(&at("type"), "expected a string"))?
                    .to_string();
                let num = |f: &str| {
                    l.get(f)
                        .and_then(serde_json::Value::as_u64)
                        .ok_or_else(|| field(&at(f), "expected a whole number >= 0"))
                };
                keyed.push((idx, Layer { kind, activations: num("activations")?, parameters: num("parameters")? }));
            }
            keyed.sort_by_key(|(i, _)| *i);
            keyed.into_iter().map(|x| x.1).collect()
        };
        Ok(Features { total_parameters, total_activations, batch_size, layers })
    }

    /// Read and parse a features JSON file.
    pub fn load(path: &Path) -> Result<Features> {
        let text = std::fs::read_to_string(path).map_err(|source| EstimateError::Io {
            path: path.to_path_buf(),
            action: "cannot read features",
            source,
        })?;
        Features::parse_json(&text, path)
    }

    /// The model family.
    pub fn family(&self) -> Family {
        Family::from_layer_types(self.layers.iter().map(|l| l.kind.as_str()))
    }

    /// Whether any layer runs a convolution (loads cuDNN).
    pub fn uses_conv(&self) -> bool {
        self.layers.iter().any(|l| is_convolution(&l.kind))
    }

    /// Whether any layer runs a GEMM (loads cuBLAS).
    pub fn uses_gemm(&self) -> bool {
        self.layers.iter().any(|l| is_gemm(&l.kind))
    }

    /// Layer-type counts.
    pub fn layer_counts(&self) -> BTreeMap<&str, u64> {
        let mut m = BTreeMap::new();
        for l in &self.layers {
            *m.entry(l.kind.as_str()).or_default() += 1;
        }
        m
    }
}
