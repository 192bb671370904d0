//! Closed-form estimators: `horus` exactly as GPUMemNet implemented the Horus baseline, and
//! `analytic`, a closed form that also counts what Horus leaves out.

use std::str::FromStr;

use serde::Serialize;
use simulator::fit::{outside, Libraries};
use simulator::profile::Profile;

use crate::features::Features;

const MIB: u64 = 1024 * 1024;

/// Horus as GPUMemNet implements it (`Test_Pipeline/01-mlp4cnn.py`): `4·(A·B + P + B·P)` bytes,
/// with A activations per sample, B the batch size and P the parameters. The gradient term is
/// scaled by the batch size, as published; reproducing the baseline means keeping that.
pub fn horus_bytes(activations: u64, batch: u64, parameters: u64) -> u128 {
    let (a, b, p) = (activations as u128, batch as u128, parameters as u128);
    4 * (a * b + p + b * p)
}

/// accelerate's `accelerate estimate-memory` training figure (`accelerate/commands/estimate.py`,
/// accelerate 1.15): Adam needs about 4x the model's size in its dtype, for parameters,
/// gradients and the two moments; activations and frozen parameters are not considered.
pub fn accelerate_bytes(parameters: u64, bytes_per_parameter: u64) -> u128 {
    4 * parameters as u128 * bytes_per_parameter as u128
}

/// DeepSpeed's `estimate_zero2_model_states_mem_needs` (`deepspeed/runtime/zero/stage_1_and_2.py`,
/// DeepSpeed 0.19) for one node with one GPU and no offload: `4P + 16P/N` bytes with N = 1, fp16
/// parameters and gradients plus fp32 master weights and Adam moments. Model states only.
pub fn deepspeed_zero2_bytes(parameters: u64) -> u128 {
    20 * parameters as u128
}

/// Bytes per parameter of a trace's `param_dtype` metadata (fp32 when absent).
pub fn dtype_bytes(dtype: Option<&str>) -> u64 {
    match dtype {
        Some("bf16" | "fp16") => 2,
        _ => 4,
    }
}

/// Optimizer, for the number of fp32 state slots per parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Optimizer {
    /// Plain SGD: no state.
    Sgd,
    /// SGD with momentum: one buffer.
    SgdMomentum,
    /// Adam: exp_avg and exp_avg_sq.
    Adam,
    /// AdamW: as Adam.
    AdamW,
    /// Adagrad: one sum.
    Adagrad,
    /// RMSprop: square_avg.
    RmsProp,
}

impl Optimizer {
    /// State tensors the size of the parameters.
    pub fn state_slots(self) -> u64 {
        match self {
            Optimizer::Sgd => 0,
            Optimizer::SgdMomentum | Optimizer::Adagrad | Optimizer::RmsProp => 1,
            Optimizer::Adam | Optimizer::AdamW => 2,
        }
    }
}

impl Optimizer {
    /// Its name as `--optimizer` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::SgdMomentum => "sgd-momentum",
            Optimizer::Adam => "adam",
            Optimizer::AdamW => "adamw",
            Optimizer::Adagrad => "adagrad",
            Optimizer::RmsProp => "rmsprop",
        }
    }
}

impl FromStr for Optimizer {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "sgd" => Optimizer::Sgd,
            "sgd-momentum" | "sgd_momentum" | "momentum" => Optimizer::SgdMomentum,
            "adam" => Optimizer::Adam,
            "adamw" => Optimizer::AdamW,
            "adagrad" => Optimizer::Adagrad,
            "rmsprop" => Optimizer::RmsProp,
            other => {
                return Err(format!(
                    "unknown optimizer {other:?}: expected adam, adamw, sgd, sgd-momentum, adagrad or rmsprop"
                ))
            }
        })
    }
}

/// Numeric precision of the training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Precision {
    /// Everything fp32.
    Fp32,
    /// Autocast to bf16 or fp16: activations in half precision, fp32 master weights, and a half
    /// copy of each weight cached by autocast for the step.
    Amp,
}

impl FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "fp32" | "none" | "" => Ok(Precision::Fp32),
            "bf16" | "fp16" | "amp" => Ok(Precision::Amp),
            other => Err(format!("unknown precision {other:?}: expected fp32, bf16 or fp16")),
        }
    }
}

/// The analytic estimate and its terms, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AnalyticEstimate {
    /// Weights, fp32.
    pub weights: u64,
    /// Gradients, fp32.
    pub gradients: u64,
    /// Optimizer state.
    pub optimizer_state: u64,
    /// Activations saved for backward, at batch B.
    pub activations: u64,
    /// Half-precision weight copies under AMP.
    pub amp_weight_copies: u64,
    /// cuBLAS workspace through the allocator (when any GEMM runs).
    pub workspace: u64,
    /// The allocator level (what `max_memory_reserved` would show).
    pub reserved: u64,
    /// Reserved plus the profile's memory outside the allocator (what nvidia-smi would show).
    pub device: u64,
}

impl AnalyticEstimate {
    /// Why the closed form gives no size: its terms add up past 2^64 bytes (`None` when the
    /// device figure is a size).
    pub fn unbounded(&self) -> Option<simulator::units::Unbounded> {
        (self.device == u64::MAX).then_some(simulator::units::Unbounded::Overflow)
    }
}

/// A closed form's answer as a device figure: `None` past 2^64 bytes (or saturated at it),
/// which no device holds and no float should print as a number.
pub fn bounded(bytes: u128) -> Option<u64> {
    u64::try_from(bytes).ok().filter(|&b| b != u64::MAX)
}

/// Bytes a tensor of `bytes` holds in the caching allocator: 512-B rounding, and requests above
/// 1 MiB come from segments rounded to 2 MiB (c10's `kRoundLarge`), which stay reserved.
/// Saturates at `u64::MAX`, which [`AnalyticEstimate::unbounded`] reads as no size.
pub fn allocator_bytes(bytes: u64) -> u64 {
    let r = bytes.div_ceil(512).saturating_mul(512);
    if r > MIB {
        r.div_ceil(2 * MIB).saturating_mul(2 * MIB)
    } else {
        r
    }
}

/// The analytic closed form: per-layer parameter, gradient and optimizer tensors and per-layer
/// activations × batch, each rounded as the allocator would, plus the profile's workspace and
/// outside-allocator memory. Peak is taken at the second iteration's backward, when weights,
/// optimizer state, gradients and saved activations all coexist. Every sum saturates: a batch
/// near 2^61 must never wrap to less than batch 1 needs.
pub fn analytic(
    f: &Features,
    batch: u64,
    optimizer: Optimizer,
    precision: Precision,
    profile: &Profile,
) -> AnalyticEstimate {
    let act_bytes = match precision {
        Precision::Fp32 => 4,
        Precision::Amp => 2,
    };
    let mut weights = 0;
    let mut activations = 0;
    let mut amp = 0;
    if f.layers.is_empty() {
        weights = allocator_bytes(f.total_parameters.saturating_mul(4));
        activations = allocator_bytes(f.total_activations.saturating_mul(act_bytes).saturating_mul(batch));
        if precision == Precision::Amp {
            amp = allocator_bytes(f.total_parameters.saturating_mul(2));
        }
    }
    for l in &f.layers {
        if l.parameters > 0 {
            weights = weights.saturating_add(allocator_bytes(l.parameters.saturating_mul(4)));
            if precision == Precision::Amp {
                amp = amp.saturating_add(allocator_bytes(l.parameters.saturating_mul(2)));
            }
        }
        activations =
            activations.saturating_add(allocator_bytes(l.activations.saturating_mul(act_bytes).saturating_mul(batch)));
    }
    let gradients = weights;
    let optimizer_state = weights.saturating_mul(optimizer.state_slots());
    let uses_gemm = f.uses_gemm();
    let workspace = if uses_gemm { profile.cublas_workspace_bytes() } else { 0 };
    let reserved =
        [gradients, optimizer_state, activations, amp, workspace].into_iter().fold(weights, u64::saturating_add);
    let libs = Libraries::single(uses_gemm, f.uses_conv(), "features");
    let device = reserved.saturating_add(outside(profile, "profile", libs).total_bytes);
    AnalyticEstimate {
        weights,
        gradients,
        optimizer_state,
        activations,
        amp_weight_copies: amp,
        workspace,
        reserved,
        device,
    }
}
