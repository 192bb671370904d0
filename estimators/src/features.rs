//! Model features as the trainer's `features --json` prints them (parameters, per-sample
//! activations, layers), and the model family decided from the layer types. The file is read by
//! [`crate::features_file::FeaturesFile`], the one parser.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
