"""QLoRA's 4-bit base, emulated: bitsandbytes' NF4 storage and its dequantize-then-matmul.

bitsandbytes' NF4 kernels need a GPU, so the tracer cannot run `bnb.nn.Linear4bit`. What it
allocates is plain, and this module allocates the same (bitsandbytes 0.4x/0.50,
`bitsandbytes/functional.py` `quantize_4bit`/`dequantize_4bit`, `autograd/_functions.py`
`MatMul4Bit`):

- storage per weight of n elements: the packed weight, 2 values per byte, as `(ceil(n/2), 1)`
  uint8 (`quant_storage`); one fp32 absmax per block of 64 and the 16-entry fp32 NF4 code; with
  double quantization the absmax is uint8 instead, plus one fp32 absmax per 256 of those
  blocks, a 256-entry fp32 code (per layer in 0.50) and an fp32 offset. That is 0.5625 bytes
  per parameter, or 0.5159 double-quantized;
- forward: the weight dequantized to the compute dtype (a transient tensor the size of the full
  layer), cast to the input's dtype when they differ, then the matmul; nothing but the quantized
  weight is saved for backward, since the frozen weight needs no gradient (from bitsandbytes
  0.44; 0.41-0.43 kept the input too, `ctx.tensors = (A, B)`: `save_input`);
- backward: the weight dequantized again for the input's gradient;
- a LoRA adapter on a 4-bit layer (peft's `tuners/lora/bnb.py` `Linear4bit.forward`) clones the
  base layer's output before adding its update ("defensively clone", a comment there says);
  `clone_outputs_under_lora` adds that copy, since peft wraps this emulation with its plain
  layer.

The packed weight is the module's `weight` parameter (frozen), the statistics are buffers, so
the tracer counts them as model state from the start.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

BLOCK = 64  # bitsandbytes' default blocksize for 4-bit weights
NESTED_BLOCK = 256  # the second-level blocksize of double quantization


def nf4_bytes(numel: int, double_quant: bool) -> int:
    """Device bytes of one quantized weight: what `storage` below allocates."""
    blocks = -(-numel // BLOCK)
    packed = -(-numel // 2)
    if not double_quant:
        return packed + 4 * blocks + 4 * 16
    return packed + blocks + 4 * -(-blocks // NESTED_BLOCK) + 4 * 256 + 4


class Linear4bit(nn.Linear):
    """`bnb.nn.Linear4bit` as the allocator sees it. A subclass of `nn.Linear`, so peft wraps it
    with its plain LoRA layer, whose adapters sit beside it exactly as beside bitsandbytes'."""

    def __init__(self, linear: nn.Module, compute_dtype: torch.dtype, double_quant: bool,
                 save_input: bool = False) -> None:  # fmt: skip
        nn.Module.__init__(self)
        if is_conv1d(linear):
            # transformers quantizes GPT-2's Conv1D into the same bnb Linear4bit, reading its
            # (in, out) weight transposed (integrations/bitsandbytes.py, replace_with_bnb_linear).
            self.in_features, self.out_features = linear.weight.shape
        else:
            self.in_features, self.out_features = linear.in_features, linear.out_features
        self.compute_dtype, self.double_quant = compute_dtype, double_quant
        self.save_input = save_input
        device = linear.weight.device
        n = linear.weight.numel()
        blocks = -(-n // BLOCK)
        packed = torch.empty((-(-n // 2), 1), dtype=torch.uint8, device=device)
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.weight.quantized_numel = n  # type: ignore[attr-defined]  # workload.parameter_count
        if double_quant:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=device))
            nested = -(-blocks // NESTED_BLOCK)
            self.register_buffer("nested_absmax", torch.empty(nested, device=device))
            self.register_buffer("nested_code", torch.empty(256, device=device))
            self.register_buffer("offset", torch.empty((), device=device))
        else:
            self.register_buffer("absmax", torch.empty(blocks, device=device))
            # The 16 NF4 values, one copy per layer (QuantState.code).
            self.register_buffer("code", torch.empty(16, device=device))
        self.bias = linear.bias
        if self.bias is not None:
            self.bias.requires_grad_(False)

    def dequantize(self) -> torch.Tensor:
        # Double quantization first dequantizes the absmax (one fp32 value per block); it lives
        # until the weight is written.
        absmax = (
            torch.empty(self.absmax.shape, device=self.absmax.device) if self.double_quant else None
        )
        out = torch.empty(
            (self.out_features, self.in_features),
            dtype=self.compute_dtype,
            device=self.weight.device,
        )
        del absmax
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return _MatMul4Bit.apply(x, self, bias)  # type: ignore[no-any-return]

    def extra_repr(self) -> str:
        dq = ", double_quant" if self.double_quant else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, nf4{dq}"


def is_conv1d(module: nn.Module) -> bool:
    """transformers' `Conv1D` (GPT-2 and its kin): a linear layer with its weight stored as
    (in, out), which transformers quantizes as it does `nn.Linear`."""
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, Conv1D)


class _MatMul4Bit(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: Linear4bit, bias: Any) -> torch.Tensor:
        weight = layer.dequantize()
        if weight.dtype != x.dtype:
            weight = weight.to(x.dtype)
        out = F.linear(x, weight, bias)
        del weight
        ctx.layer, ctx.x_dtype = layer, x.dtype
        # bitsandbytes < 0.44 kept the input in a plain ctx attribute until the backward.
        ctx.kept_input = x if layer.save_input and x.requires_grad else None
        ctx.bias_grad = bias is not None and bias.requires_grad
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, Any]:
        grad_x = None
        if ctx.needs_input_grad[0]:
            weight = ctx.layer.dequantize()
            if weight.dtype != grad.dtype:
                weight = weight.to(grad.dtype)
            grad_x = torch.matmul(grad, weight).to(ctx.x_dtype)
            del weight
        grad_bias = grad.sum(tuple(range(grad.dim() - 1))) if ctx.bias_grad else None
        ctx.kept_input = None
        return grad_x, None, grad_bias


def quantize(model: nn.Module, compute_dtype: torch.dtype, double_quant: bool,
             skip: tuple[str, ...], save_input: bool = False) -> int:  # fmt: skip
    """Every `nn.Linear` (and transformers' `Conv1D`, which transformers converts too) outside
    `skip` replaced by its 4-bit form, as transformers does with
    `BitsAndBytesConfig(load_in_4bit=True)`: it keeps the output head in full precision (here
    the whole of it, a classifier's `dense` under `classifier` too, which peft trains as
    `modules_to_save`), and the modules a model keeps in fp32 (`_keep_in_fp32_modules`, T5's
    `wo`). A `skip` entry names a module by its own name
    or by its full name, and a full name keeps everything under it. Returns the number of
    weights quantized."""
    count = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            under = any(full.startswith(f"{s}.") for s in skip)
            if (
                (type(child) is nn.Linear or is_conv1d(child))
                and child_name not in skip
                and full not in skip
                and not under
            ):
                setattr(module, child_name,
                        Linear4bit(child, compute_dtype, double_quant, save_input))  # fmt: skip
                count += child.weight.numel()
    model.is_loaded_in_4bit = True  # type: ignore[assignment]
    return count


def store_for_fsdp(model: nn.Module) -> int:
    """Each packed 4-bit weight re-stored as `bnb_4bit_quant_storage=torch.bfloat16` keeps it,
    which FSDP-QLoRA needs so that FSDP shards it beside the model's bf16 parameters:
    `quantize_4bit` packs n values into `((n + 1) // 4, 1)` bf16 instead of `((n + 1) // 2, 1)`
    uint8, the same bytes. The statistics are not parameters and stay whole on every rank.
    Returns the number of layers re-stored."""
    count = 0
    for m in model.modules():
        if isinstance(m, Linear4bit) and m.weight.dtype != torch.bfloat16:
            n = m.weight.quantized_numel  # type: ignore[attr-defined]
            m.weight.data = torch.empty(((n + 1) // 4, 1), dtype=torch.bfloat16,
                                        device=m.weight.device)  # fmt: skip
            count += 1
    return count


def clone_outputs_under_lora(model: nn.Module) -> int:
    """The output copy peft's 4-bit LoRA layer makes, on every adapted 4-bit layer."""
    count = 0
    for m in model.modules():
        base = getattr(m, "base_layer", None)
        if isinstance(base, Linear4bit) and hasattr(m, "lora_A"):
            base.register_forward_hook(lambda _m, _i, out: out.clone())
            count += 1
    return count
