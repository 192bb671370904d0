"""Where CUDA allocates differently from the meta path, allocate what CUDA would.

Each case is documented in docs/symbolic-tracing.md with its source in
../shared/reference/cuda-vs-meta-allocations.md. Dispatch-level cases (library workspaces) are
hooks on the recorder; function-level cases (SDPA backend, dropout masks) need autograd to see the
CUDA op, so they run in a TorchFunctionMode above autograd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from memtrace_trainer.errors import UserError
from memtrace_trainer.profile import Profile
from memtrace_trainer.symtrace.recorder import Recorder, is_collective

aten = torch.ops.aten
# The ops that run cuBLAS: the GEMMs and the matrix-vector and dot products (gemv, dot). Each
# takes the thread's handle through getCurrentCUDABlasHandle, which sets its workspace, so any of
# them loads cuBLAS and holds the workspace. `kernelstats` counts the same ops as GEMM kernels.
CUBLAS_OPS = {
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
    aten.addbmm.default, aten._addmm_activation.default, aten.mv.default, aten.addmv.default,
    aten.dot.default, aten.vdot.default,
}  # fmt: skip


class LibrariesUsed:
    """Which CUDA libraries the job loads, from the ops that ran: cuBLAS at its first GEMM (any of
    `CUBLAS_OPS`), cuDNN at its first convolution. Their memory outside the allocator (handles,
    kernel images) belongs to the job, not to how it was traced, so this hook runs with or without
    CUDA emulation, and the header's `uses_gemm`/`uses_conv` always say. NCCL creates its
    communicators lazily, at the first collective (`c10d` ops, and the functional ones); that one
    is noted as `collective`."""

    def __init__(self) -> None:
        self.gemm = False
        self.conv = False
        # cuDNN autotuning (torch.backends.cudnn.benchmark) at any convolution: its workspaces
        # are sized to the memory free at the time, which the header says for memsim to warn.
        self.cudnn_benchmark = False
        self.collective = False

    def __call__(
        self, rec: Recorder, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
    ) -> None:
        if is_collective(func):
            self.collective = True
        if out is None:
            return
        if func in CUBLAS_OPS:
            self.gemm = True
        elif func is aten.convolution.default:
            self.conv = True
            self.cudnn_benchmark |= bool(torch.backends.cudnn.benchmark)

    def metadata(self) -> dict[str, str]:
        meta = {"uses_gemm": str(self.gemm).lower(), "uses_conv": str(self.conv).lower()}
        if self.cudnn_benchmark:
            meta["cudnn_benchmark"] = "true"
        return meta


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


class Workspaces:
    """cuBLAS (persistent), cuBLASLt (per addmm with bias), cuDNN conv and fused-SDPA backward
    workspaces, as allocator requests around the op that takes them."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        # cuBLAS keeps one workspace per (handle, stream) (CUDABlas getCurrentCUDABlasHandle),
        # and handles are per thread: autograd runs a CUDA backward on its own device thread,
        # so a step that multiplies in both passes holds two.
        self.cublas_handles: set[tuple[str, int]] = set()

    def _transient(self, rec: Recorder, size: int) -> None:
        if size > 0:
            addr = rec.alloc(size, "workspace")
            rec.free(addr, size)

    def __call__(
        self, rec: Recorder, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
    ) -> None:
        if out is None:
            return
        if func in CUBLAS_OPS:
            thread = "backward" if torch._C._current_autograd_node() is not None else "main"
            key = (thread, rec.stream)
            if key not in self.cublas_handles:
                # The handle's workspace is taken at its first GEMM, after the output, for good.
                self.cublas_handles.add(key)
                if self.profile.cublas_workspace_bytes:
                    rec.alloc(self.profile.cublas_workspace_bytes, "workspace")
        if func is aten.addmm.default and args[0].dim() == 1 and args[1].dim() == 2:
            self._transient(rec, self.profile.cublaslt_workspace_bytes)
        elif func is aten._scaled_dot_product_flash_attention_backward.default:
            self._flash_backward(rec, args)
        elif func is aten.convolution.default:
            x, w = args[0], args[1]
            self._conv(rec, ConvCall("fwd", x, w, out, args[3], args[6], args[8]))
        elif func is aten.convolution_backward.default:
            grad_out, x, w = args[0], args[1], args[2]
            mask = args[-1]
            # One cuDNN call, with its own workspace, per requested direction.
            for direction, wanted in (("dgrad", mask[0]), ("wgrad", mask[1])):
                if wanted:
                    self._conv(rec, ConvCall(direction, x, w, grad_out, args[4], args[7], args[9]))

    def _conv(self, rec: Recorder, call: ConvCall) -> None:
        size = call.workspace_bytes(self.profile)
        # The marker names the call, so a trace says which convolution each workspace is for
        # (scripts/cudnn_workspace_fit.py refits the per-shape model from these).
        rec.marker(call.marker(size))
        self._transient(rec, size)

    def _flash_backward(self, rec: Recorder, args: tuple[Any, ...]) -> None:
        """flash_api.cpp `mha_bwd`, after it allocates dq/dk/dv: softmax_d (B,H,round128(L))
        and dq_accum (B,round128(L),H,round32(D)), both fp32, and with fewer K/V heads (GQA)
        dk/dv expanded to every query head before they are summed, all freed when the kernel
        returns."""
        q, k = args[1], args[2]
        b, h, seq, d = q.shape
        l128 = math.ceil(seq / 128) * 128
        d32 = math.ceil(d / 32) * 32
        size = 4 * b * h * l128 + 4 * b * l128 * h * d32
        if k.shape[1] != h:
            size += 2 * b * k.shape[2] * h * d * q.element_size()
        self._transient(rec, size)


class ConvCall:
    """One cuDNN convolution call: its direction (`fwd`, `dgrad` computing the input's gradient,
    `wgrad` the weight's) and shapes, whatever the direction (x: input, w: weight, y: output)."""

    def __init__(
        self, direction: str, x: Any, w: Any, y: Any, stride: Any, transposed: bool, groups: int
    ) -> None:
        self.direction = direction
        self.x, self.w, self.y = tuple(x.shape), tuple(w.shape), tuple(y.shape)
        self.x_bytes, self.y_bytes = _nbytes(x), _nbytes(y)
        self.stride = tuple(int(s) for s in stride)
        self.transposed = bool(transposed)
        self.groups = int(groups)
        self.dtype = str(x.dtype).removeprefix("torch.")

    def workspace_bytes(self, profile: Profile) -> int:
        return int(profile.cudnn_workspace_factor * max(self.x_bytes, self.y_bytes))

    def marker(self, workspace: int) -> str:
        dims = lambda t: "x".join(str(d) for d in t)  # noqa: E731
        return (
            f"cudnn:{self.direction} x={dims(self.x)} w={dims(self.w)} y={dims(self.y)} "
            f"stride={dims(self.stride)} groups={self.groups} transposed={int(self.transposed)} "
            f"dtype={self.dtype} workspace={workspace}"
        )


_HALF = (torch.float16, torch.bfloat16)


def sdpa_backend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, is_causal: bool, profile: Profile
) -> str:
    """The backend PyTorch picks on CUDA for dense inputs (`sdp_utils.cpp` `select_sdp_backend`,
    default order flash, memory-efficient, math), from the checks that depend on shapes, dtypes,
    the mask and the device's compute capability. Grouped-query attention (fewer K/V heads) is
    supported by flash and memory-efficient alike. cuDNN attention, which PyTorch prefers on
    sm90/sm100 with cuDNN newer than 9.15, is not modelled: its output and fp32 statistics are
    flash's.

    The program's own choice is PyTorch's too: the kernels it turned off (`sdpa_kernel(...)`,
    `torch.backends.cuda.enable_flash_sdp(False)`) are never picked, and the kernels on are
    tried in PyTorch's priority order (`sdpa_kernel(..., set_priority=True)` changes it)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return _only_math()
    cc = profile.compute_capability
    dq, dk, dv = q.shape[-1], k.shape[-1], v.shape[-1]
    heads_ok = k.shape[1] == v.shape[1] and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0
    grad = q.requires_grad or k.requires_grad or v.requires_grad
    half = q.dtype in _HALF
    flash = (
        mask is None
        and dq == dk == dv <= 256
        and (8, 0) <= cc <= (12, 1)
        and not (grad and dq > 192 and cc in ((8, 6), (8, 9), (12, 0)))
        and not (is_causal and q.shape[-2] != k.shape[-2])
        and half
        and heads_ok
    )
    # minimum_gemm_alignment: tensor cores from sm80 (sm70 for half) need 128-bit alignment.
    tensor_cores = cc >= (8, 0) or (cc >= (7, 0) and half)
    align = max(4 if cc >= (8, 0) else 1, (8 if half else 4) if tensor_cores else 1)
    dtypes = (torch.float16, torch.float32, torch.bfloat16) if cc >= (8, 0) else (
        torch.float16, torch.float32)  # fmt: skip
    efficient = (
        cc >= (5, 0)
        and dq == dk
        and dq % align == 0
        and dv % align == 0
        and q.dtype in dtypes
        and heads_ok
    )
    cuda = torch.backends.cuda
    can = {
        SDPBackend.FLASH_ATTENTION: flash and cuda.flash_sdp_enabled(),
        SDPBackend.EFFICIENT_ATTENTION: efficient and cuda.mem_efficient_sdp_enabled(),
        SDPBackend.MATH: cuda.math_sdp_enabled(),
        # Not modelled: taken as flash, whose output and statistics it has.
        SDPBackend.CUDNN_ATTENTION: flash and cuda.cudnn_sdp_enabled(),
    }
    for b in _priority():
        if can.get(b):
            return "math" if b == SDPBackend.MATH else "efficient" if b == (
                SDPBackend.EFFICIENT_ATTENTION) else "flash"  # fmt: skip
    raise RuntimeError(_NO_KERNEL)


# PyTorch's words when every kernel is off, or none that is on takes these inputs.
_NO_KERNEL = "No available kernel. Aborting execution. (scaled_dot_product_attention: every " \
    "backend the program left on refuses these inputs)"  # fmt: skip


def _priority() -> list[Any]:
    """The kernels in the order PyTorch tries them (flash, memory-efficient, math, cuDNN by
    default)."""
    order = getattr(torch._C, "_get_sdp_priority_order", None)
    if order is None:
        return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH,
                SDPBackend.CUDNN_ATTENTION]  # fmt: skip
    members = {int(b): b for b in SDPBackend.__members__.values()}
    return [members[i] for i in order() if i in members]


def _only_math() -> str:
    """Inputs only the math kernel takes (not 4-D, a mask beside is_causal)."""
    if not torch.backends.cuda.math_sdp_enabled():
        raise RuntimeError(_NO_KERNEL)
    return "math"


@torch.library.custom_op("memtrace::mish_backward", mutates_args=())
def mish_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """CUDA's fused `mish_backward` as one op a dispatch mode sees (kernel statistics count it),
    allocating what the kernel allocates: one `grad_input` like the input."""
    return torch.empty_like(x)


@mish_backward.register_fake
def _mish_backward_fake(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class FusedMish(torch.autograd.Function):
    """`mish` with CUDA's backward: one fused `mish_backward` kernel writing `grad_input`.

    `mish_backward` has CPU/CUDA kernels and a CompositeImplicitAutograd fallback
    (native_functions.yaml); meta has no kernel, so it decomposes into softplus, tanh, sigmoid
    and five more full-size temporaries that CUDA never allocates. Autograd saves only the input
    on both devices (MishBackward0 keeps `self`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.ops.aten.mish.default(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return mish_backward(grad, x)


@dataclass(frozen=True)
class Flash:
    """`--attn flash_attention_2`. `fp32_cast`: what transformers casts fp32 attention inputs to
    when autocast is off (a quantized model's `_pre_quantization_dtype`); `None`: nothing, and
    flash-attn refuses them."""

    fp32_cast: torch.dtype | None = None


class CudaFunctions:
    """Re-routes SDPA to the CUDA backend, dropout to the fused kernel with a bool mask and
    mish's backward to its fused CUDA kernel.

    The functions are swapped in `torch.nn.functional` for the duration of the trace rather than
    intercepted by a function mode, because composite functions such as
    `multi_head_attention_forward` run their bodies with function modes popped."""

    def __init__(self, profile: Profile, flash: Flash | None = None) -> None:
        self.profile = profile
        # `--attn flash_attention_2`: the flash-attn package's kernel, which is SDPA's flash
        # kernel (same output and fp32 log-sum-exp); it refuses fp32 inputs and masks.
        self.flash = flash
        self.backends: dict[str, int] = {}
        self._saved: tuple[Any, Any, Any] | None = None

    def __enter__(self) -> CudaFunctions:
        sdpa, dropout, mish = F.scaled_dot_product_attention, F.dropout, F.mish
        self._saved = (sdpa, dropout, mish)

        def fused_dropout(
            input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
        ) -> torch.Tensor:
            if training and 0 < p < 1 and not inplace:
                return torch.native_dropout(input, p, True)[0]
            return dropout(input, p, training, inplace)

        def fused_mish(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
            if inplace or not input.requires_grad:
                return mish(input, inplace)
            return FusedMish.apply(input)

        F.scaled_dot_product_attention = self._sdpa
        F.dropout = fused_dropout
        F.mish = fused_mish
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._saved is not None
        F.scaled_dot_product_attention, F.dropout, F.mish = self._saved

    def _sdpa(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if k.shape[1] != q.shape[1] and not enable_gqa and k.dim() == 4:
            backend = "math"  # PyTorch itself refuses this; let its own function say why
        elif is_causal and attn_mask is not None:
            backend = _only_math()
        else:
            backend = sdpa_backend(q, k, v, attn_mask, is_causal, self.profile)
        if self.flash is not None:
            if q.dtype not in _HALF:
                # transformers' flash-attention integration casts fp32 q, k and v to the
                # autocast dtype, else to the dtype a quantized model was loaded in, else
                # leaves them to flash-attn, which refuses fp32.
                cast = self.flash.fp32_cast
                if torch.is_autocast_enabled("cuda"):
                    cast = torch.get_autocast_dtype("cuda")
                if cast not in _HALF:
                    raise UserError(
                        f"--attn flash_attention_2 runs only in fp16/bf16, and attention here is "
                        f"{str(q.dtype).removeprefix('torch.')}: give --dtype bf16 or --amp bf16"
                    )
                q, k, v = q.to(cast), k.to(cast), v.to(cast)
            backend = "flash"
        self.backends[backend] = self.backends.get(backend, 0) + 1
        if backend == "flash":
            return aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, False, scale=scale
            )[0]
        if backend == "efficient":
            bias = attn_mask
            if bias is not None and bias.dtype == torch.bool:
                bias = torch.zeros(bias.shape, dtype=q.dtype, device=q.device).masked_fill(
                    ~bias, float("-inf")
                )
            if bias is not None:
                bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            need_lse = q.requires_grad or k.requires_grad or v.requires_grad
            return aten._scaled_dot_product_efficient_attention(
                q, k, v, bias, need_lse, dropout_p, is_causal, scale=scale
            )[0]
        assert self._saved is not None
        return self._saved[0](
            q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
