//! Kernel classes by name, for the time-share split (tensor-core/matrix work vs memory-bound
//! work).
//!
//! The name is lower-cased and matched by substring, in this order (first match wins):
//! 1. normalisation and softmax ([`NORM_PATTERNS`]) are reductions, checked first because
//!    cuDNN names its batch-norm kernels `cudnn::bn_fw_...`, which would otherwise be conv;
//! 2. GEMM/conv ([`GEMM_CONV_PATTERNS`]): cuBLAS/cuBLASLt (`gemm`, `sgemm`, `cublas`, `nvjet`),
//!    CUTLASS (`cutlass`), xmma, cuDNN and convolution kernels (`conv`, `cudnn`,
//!    `implicit_gemm`, `winograd`, `dgrad`, `wgrad`, `fprop`), Triton templates (`triton_tem`);
//! 3. reductions ([`REDUCTION_PATTERNS`]): `reduce`, `reduction`, Triton `triton_red`/`triton_per`,
//!    `cub::`, loss kernels;
//! 4. elementwise ([`ELEMENTWISE_PATTERNS`]): PyTorch's `elementwise`/`vectorized` kernels,
//!    Triton `triton_poi`, fused optimizer `multi_tensor_apply`, copies, fills, index/cat;
//! 5. anything else, and unnamed kernels, is `other`.
//!
//! `convert` is removed before the GEMM/conv match so dtype-conversion kernels do not match `conv`.

use serde::Serialize;

/// Normalisation and softmax: reductions over a dimension.
pub const NORM_PATTERNS: &[&str] =
    &["batch_norm", "batchnorm", "bn_fw", "bn_bw", "layer_norm", "layernorm", "group_norm", "rmsnorm", "softmax"];
/// Matrix multiply and convolution.
pub const GEMM_CONV_PATTERNS: &[&str] = &[
    "gemm",
    "cublas",
    "nvjet",
    "cutlass",
    "xmma",
    "conv",
    "cudnn",
    "winograd",
    "dgrad",
    "wgrad",
    "fprop",
    "triton_tem",
    "flash_fwd",
    "flash_bwd",
    "fmha",
];
/// Reductions.
pub const REDUCTION_PATTERNS: &[&str] =
    &["reduce", "reduction", "triton_red", "triton_per", "cub::", "nll_loss", "cross_entropy", "argmax", "norm_kernel"];
/// Elementwise and data movement.
pub const ELEMENTWISE_PATTERNS: &[&str] = &[
    "elementwise",
    "vectorized",
    "pointwise",
    "triton_poi",
    "multi_tensor_apply",
    "copy",
    "fill",
    "catarray",
    "index",
    "scatter",
    "gather",
];

/// The class of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelClass {
    /// Matrix multiply or convolution.
    GemmConv,
    /// Elementwise or data movement.
    Elementwise,
    /// Reductions, normalisation, softmax.
    Reduction,
    /// Anything else.
    Other,
}

impl KernelClass {
    /// All classes.
    pub const ALL: [KernelClass; 4] =
        [KernelClass::GemmConv, KernelClass::Elementwise, KernelClass::Reduction, KernelClass::Other];

    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelClass::GemmConv => "gemm_conv",
            KernelClass::Elementwise => "elementwise",
            KernelClass::Reduction => "reduction",
            KernelClass::Other => "other",
        }
    }
}

/// Classify a kernel by name (see the module docs for the rules).
pub fn classify(name: &str) -> KernelClass {
    let n = name.to_ascii_lowercase();
    let any = |ps: &[&str]| ps.iter().any(|p| n.contains(p));
    let without_convert = n.replace("convert", "");
    if any(NORM_PATTERNS) {
        KernelClass::Reduction
    } else if GEMM_CONV_PATTERNS.iter().any(|p| without_convert.contains(p)) {
        KernelClass::GemmConv
    } else if any(REDUCTION_PATTERNS) {
        KernelClass::Reduction
    } else if any(ELEMENTWISE_PATTERNS) {
        KernelClass::Elementwise
    } else {
        KernelClass::Other
    }
}
