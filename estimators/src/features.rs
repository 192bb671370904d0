//! Model features as the trainer's `features --json` prints them (parameters, per-sample
//! activations, layers), and the model family decided from the layer types.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{EstimateError, Result};
pub use simulator::family::{is_attention, is_convolution, is_gemm, Family};

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
    /// The model the features were taken of (`model`, e.g. `torchvision:resnet18`), when named.
    pub model: Option<String>,
    /// Tokens per sample they were taken for (`seq_len`, a sequence model), when named.
    pub seq_len: Option<u64>,
    /// One sample's dimensions they were taken for (`input_shape`), when named.
    pub input_shape: Option<Vec<u64>>,
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
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            // `features --csv` writes a GPUMemNet row, which is easy to hand over by mistake.
            let csv = text.trim_start().starts_with("Filename,");
            let hint = if csv { "; this is a CSV row (features --csv): give `features --json`" } else { "" };
            field("<document>", &format!("expected a JSON object ({e}){hint}"))
        })?;
        let count = |name: &str| -> Result<u64> {
            v.get(name).and_then(serde_json::Value::as_u64).ok_or_else(|| field(name, "expected a whole number >= 0"))
        };
        let total_parameters = count("total_parameters")?;
        let total_activations = count("total_activations")?;
        // An optional count above zero: absent or null is none.
        let positive = |name: &str| -> Result<Option<u64>> {
            v.get(name)
                .filter(|x| !x.is_null())
                .map(|x| x.as_u64().filter(|&n| n > 0).ok_or_else(|| field(name, "expected a whole number >= 1")))
                .transpose()
        };
        let batch_size = positive("batch_size")?;
        let model = match v.get("model") {
            None | Some(serde_json::Value::Null) => None,
            Some(m) => {
                Some(m.as_str().ok_or_else(|| field("model", "expected the model's name, a string"))?.to_string())
            }
        };
        let seq_len = positive("seq_len")?;
        let input_shape = match v.get("input_shape") {
            None | Some(serde_json::Value::Null) => None,
            Some(d) => Some(
                d.as_array()
                    .filter(|a| !a.is_empty())
                    .and_then(|a| a.iter().map(|x| x.as_u64().filter(|&n| n > 0)).collect::<Option<Vec<u64>>>())
                    .ok_or_else(|| {
                        field("input_shape", "expected a list of whole numbers >= 1 (one sample's dimensions)")
                    })?,
            ),
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
        Ok(Features { total_parameters, total_activations, batch_size, model, seq_len, input_shape, layers })
    }

    /// Read and parse a features JSON file.
    pub fn load(path: &Path) -> Result<Features> {
        let text = trace::read_small_string(path, 256 << 20).map_err(|source| EstimateError::Io {
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
