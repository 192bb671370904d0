//! The model family, decided from the layer types that ran: the one rule behind the safety
//! margin of a symbolic trace (`fit::margin`), the families its calibration groups runs by, and
//! memest's reports and ML estimators. The symbolic tracer writes the layer types it saw into the
//! trace header (`layer_types`); the family is derived here, never in Python.

use std::fmt;

use serde::{Deserialize, Serialize};
use trace::{metadata, Header};

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

impl Family {
    /// The family of the layer types a trace's header lists (`layer_types`). `None` when it
    /// lists none: no module ran (a functional step), or the trace predates the list.
    pub fn listed(header: &Header) -> Option<Family> {
        let types = header.meta(&metadata::LAYER_TYPES)?.split(',').map(str::trim).filter(|t| !t.is_empty());
        types.clone().next()?;
        Some(Family::from_layer_types(types))
    }

    /// The family a trace written before the tracer listed layer types recorded (`family`), as
    /// it recorded it.
    pub fn recorded(header: &Header) -> Option<Family> {
        header.meta(&metadata::FAMILY).and_then(Family::parse)
    }

    /// The family of a trace's job, from its header alone: [`Family::listed`], else
    /// [`Family::recorded`]. `None`: the header says neither (a real run's trace, a functional
    /// step); the margin is then the widest calibrated one, flagged unmeasured.
    pub fn of_header(header: &Header) -> Option<Family> {
        Family::listed(header).or_else(|| Family::recorded(header))
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
