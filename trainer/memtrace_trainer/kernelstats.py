"""Kernel statistics of one training step, estimated from the aten ops it dispatches on meta.

The symbolic tracer's step (same model, optimizer, batch and AMP settings) runs two iterations
under a recorder; the ops of the last one, the steady state after the optimizer's lazy state
init, become the kernels CUDA would launch. Each kernel gets a class, FLOPs, bytes moved and a
grid size; a roofline over a device description gives its duration and a per-launch floor the
time it occupies when the step is launch-bound. Everything is an estimate from shapes: no kernel
runs, so the numbers are features for utilisation models, not measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from memtrace_trainer.errors import UserError
from memtrace_trainer.markers import iteration_of
from memtrace_trainer.profile import DEFAULT_PROFILE, Profile, load_profile
from memtrace_trainer.symtrace import step
from memtrace_trainer.symtrace.emulation import CUBLAS_OPS
from memtrace_trainer.symtrace.recorder import Recorder
from memtrace_trainer.workload import Workload

aten = torch.ops.aten


@dataclass(frozen=True)
class Device:
    """One GPU as the roofline sees it: the GPU's name and SMs and the profile they come from
    (whose emulation the step is traced with; none for a hand-made device), and its datasheet
    peak rates, which a profile does not hold (`RATES`). `launch_floor_us` is the time one
    kernel occupies at least when the step is launch-bound (launch latency plus eager PyTorch's
    per-op host work)."""

    name: str
    sm_count: int
    fp32_flops: float
    tf32_flops: float
    half_flops: float
    dram_bytes_per_s: float
    launch_floor_us: float
    profile: Profile | None = None


# Datasheet rates by profile name. NVIDIA A100 Tensor Core GPU datasheet (SXM4 40 GB):
# 19.5 TFLOP/s FP32, 156 TFLOP/s TF32 tensor, 312 TFLOP/s FP16/BF16 tensor (dense), 1,555 GB/s HBM2.
RATES = {
    "a100-40gb": {"fp32_flops": 19.5e12, "tf32_flops": 156e12, "half_flops": 312e12,
                  "dram_bytes_per_s": 1555e9, "launch_floor_us": 4.0},
}  # fmt: skip


def profile_device(profile: str | None = None) -> Device:
    """The GPU of a profile (NAME or .toml path; `None`: the default), with its rates."""
    name = profile or DEFAULT_PROFILE
    try:
        p = load_profile(name)
    except UserError as e:
        raise UserError(f"--device {name}: {e}") from None
    if p.name not in RATES:
        raise UserError(f"--device {name}: no datasheet rates for profile "
                        f"{p.name!r} (rates are known for {sorted(RATES)}; add them to "
                        "kernelstats.RATES)")  # fmt: skip
    return Device(p.gpu, p.sm_count, **RATES[p.name], profile=p)


# PyTorch's vectorised elementwise kernel: 128 threads x 4 elements per thread per block.
ELEMENTWISE_PER_BLOCK = 512
# cuBLAS/cuDNN implicit-GEMM output tile.
TILE = 128
# When the contracted dimension dominates (weight gradients: K = batch x positions), cuBLAS and
# cuDNN split it over more blocks: one split per SPLIT_K_CHUNK of K, at most SPLIT_K_MAX.
SPLIT_K_CHUNK = 4096
SPLIT_K_MAX = 16
# Generic reductions: a block per 32 outputs, and long reductions split at least every 16 K inputs.
REDUCE_OUTPUTS_PER_BLOCK = 32
REDUCE_INPUTS_PER_BLOCK = 16384
# multi_tensor_apply (ATen/native/cuda/MultiTensorApply.cuh): chunk size, blocks per launch and
# tensors per launch by the number of tensor lists (depth 1..5).
FOREACH_CHUNK = 65536
FOREACH_MAX_BLOCKS = 320
FOREACH_MAX_TENSORS = (110, 64, 48, 36, 30)
# Cap of k_mean_blocks_per_sm: more resident blocks per SM than this no longer add parallelism.
BLOCKS_PER_SM_CAP = 8.0

KINDS = ("gemm", "conv", "elementwise", "reduction", "other")

# Ops that launch no kernel although they are not views by schema.
_NO_KERNEL = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view",
    "lift_fresh", "_local_scalar_dense", "set_", "resize_", "resize_as_", "_reshape_alias",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size",
}  # fmt: skip
# matmul and linear decompose into these before dispatch.
_GEMM = {op._overloadpacket.__name__ for op in CUBLAS_OPS}
_ATTENTION = {
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward",
}  # fmt: skip
# One block per row (softmax, layer norm): the row count comes from the last dim / the norm shape.
_ROW_KERNELS = {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"}
_REDUCTIONS = {
    "nll_loss_forward", "nll_loss2d_forward", "mse_loss", "l1_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "_foreach_norm", "linalg_vector_norm", "norm",
    "native_group_norm", "native_group_norm_backward", "cumsum", "logsumexp",
}  # fmt: skip
_ELEMENTWISE = {
    "copy_", "_to_copy", "clone", "fill_", "zero_", "zeros", "zeros_like", "ones", "ones_like",
    "full", "full_like", "scalar_tensor", "randn", "rand", "randint", "normal_", "uniform_",
    "random_", "bernoulli_", "native_dropout", "native_dropout_backward", "nll_loss_backward",
    "nll_loss2d_backward", "where", "masked_fill", "masked_fill_", "_prelu_kernel",
    "_prelu_kernel_backward", "mish_backward", "embedding", "index_select", "gather",
}  # fmt: skip


@dataclass(frozen=True)
class Kernel:
    """One estimated kernel launch."""

    op: str
    kind: str
    flops: float
    bytes: int
    blocks: int
    half: bool = False


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _nbytes(ts: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _cdiv(a: int, b: int) -> int:
    return max(1, -(-a // b))


def elementwise_blocks(numel: int) -> int:
    """Grid of PyTorch's vectorised elementwise kernel for `numel` outputs."""
    return _cdiv(numel, ELEMENTWISE_PER_BLOCK)


def reduction_blocks(outputs: int, inputs: int) -> int:
    return max(_cdiv(outputs, REDUCE_OUTPUTS_PER_BLOCK), _cdiv(inputs, REDUCE_INPUTS_PER_BLOCK))


def gemm_blocks(m: int, n: int, batch: int = 1, k: int = 0) -> int:
    """Output tiles of TILE x TILE over M x N (x batch), times the split-K factor when K is the
    largest dimension."""
    split = min(SPLIT_K_MAX, _cdiv(k, SPLIT_K_CHUNK)) if k > max(m, n) else 1
    return _cdiv(m, TILE) * _cdiv(n, TILE) * max(1, batch) * split


def foreach_launches(numels: list[int], depth: int) -> list[int]:
    """Blocks of each launch multi_tensor_apply makes for tensors of these sizes: a launch is
    flushed when it holds the most tensors or blocks its depth allows, or at the last chunk."""
    max_tensors = FOREACH_MAX_TENSORS[min(max(depth, 1), 5) - 1]
    sizes = [n for n in numels if n > 0]
    launches: list[int] = []
    tensors = blocks = 0
    for i, n in enumerate(sizes):
        tensors += 1
        chunks = _cdiv(n, FOREACH_CHUNK)
        done = 0
        while done < chunks:
            # Fill the current launch with as many of this tensor's chunks as fit.
            take = min(chunks - done, FOREACH_MAX_BLOCKS - blocks)
            blocks += take
            done += take
            tensor_done = done == chunks
            last = tensor_done and i == len(sizes) - 1
            if blocks == FOREACH_MAX_BLOCKS or (tensor_done and tensors == max_tensors) or last:
                launches.append(blocks)
                blocks = 0
                tensors = 0 if tensor_done else 1
    return launches


def _conv_geometry(inp: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, transposed: bool,
                   groups: int) -> tuple[int, int, int, int]:  # fmt: skip
    """(MACs, batch x output positions, output channels, input channels)."""
    k = math.prod(weight.shape[2:])
    n = inp.shape[0]
    if transposed:
        cin, cout = weight.shape[0], weight.shape[1] * groups
        macs = n * math.prod(inp.shape[2:]) * cin * (cout // groups) * k
    else:
        cout, cin = weight.shape[0], weight.shape[1] * groups
        macs = n * math.prod(out.shape[2:]) * cout * (cin // groups) * k
    return macs, n * math.prod(out.shape[2:]), cout, cin


def _conv_kernels(name: str, args: tuple[Any, ...], out: Any) -> list[Kernel]:
    if name == "convolution":
        inp, weight, bias = args[0], args[1], args[2]
        transposed, groups = bool(args[6]), int(args[8])
        macs, positions, cout, _ = _conv_geometry(inp, weight, out, transposed, groups)
        half = out.dtype in (torch.float16, torch.bfloat16)
        moved = _nbytes([inp, weight, out])
        ks = [Kernel(name, "conv", 2.0 * macs, moved, gemm_blocks(positions, cout), half)]
        if bias is not None:
            # The cuDNN path adds the bias in a separate kernel (at::_convolution's add_).
            ks.append(Kernel(name + ":bias", "elementwise", out.numel(), 2 * _nbytes([out]),
                             elementwise_blocks(out.numel()), half))  # fmt: skip
        return ks
    grad_out, inp, weight = args[0], args[1], args[2]
    transposed, groups, mask = bool(args[7]), int(args[9]), args[10]
    macs, positions, cout, cin = _conv_geometry(inp, weight, grad_out, transposed, groups)
    half = grad_out.dtype in (torch.float16, torch.bfloat16)
    ks = []
    if mask[0]:
        spatial = inp.shape[0] * math.prod(inp.shape[2:])
        ks.append(Kernel(name + ":data", "conv", 2.0 * macs, _nbytes([grad_out, weight, inp]),
                         gemm_blocks(spatial, cin), half))  # fmt: skip
    if mask[1]:
        wcols = (cin // groups) * math.prod(weight.shape[2:])
        ks.append(Kernel(name + ":weight", "conv", 2.0 * macs, _nbytes([grad_out, inp, weight]),
                         gemm_blocks(cout, wcols, k=positions), half))  # fmt: skip
    if len(mask) > 2 and mask[2]:
        ks.append(Kernel(name + ":bias", "reduction", grad_out.numel(), _nbytes([grad_out]),
                         reduction_blocks(cout, grad_out.numel()), half))  # fmt: skip
    return ks


def _gemm(name: str, ins: list[torch.Tensor], out: torch.Tensor) -> Kernel:
    """FLOPs from the output shape and the contracted size, for any mm/addmm/bmm-style op."""
    mats = [t for t in ins if t.dim() >= 2]
    if len(mats) < 2:  # mv, dot: one row of a GEMM
        k = ins[-1].shape[-1] if ins else 1
        return Kernel(name, "gemm", 2.0 * out.numel() * k, _nbytes([*ins, out]), 1)
    a = mats[-2]
    k = a.shape[-1]
    batch = math.prod(out.shape[:-2]) if out.dim() > 2 else 1
    m, n = (out.shape[-2], out.shape[-1]) if out.dim() >= 2 else (1, out.numel())
    flops = 2.0 * out.numel() * k
    if name in ("addmm", "baddbmm", "addbmm", "_addmm_activation", "addmv"):
        flops += out.numel()  # the bias (beta * input) epilogue
    half = out.dtype in (torch.float16, torch.bfloat16)
    return Kernel(name, "gemm", flops, _nbytes([*ins, out]), gemm_blocks(m, n, batch, k), half)


def _attention(name: str, args: tuple[Any, ...]) -> Kernel:
    # q (B, H, L, D), k (B, H, S, D): QK^T and PV forward; backward about 2.5x the forward.
    q, k = (args[1], args[2]) if name.endswith("_backward") else (args[0], args[1])
    b, h, seq, d = q.shape
    flops = 4.0 * b * h * seq * k.shape[2] * d * (2.5 if name.endswith("_backward") else 1.0)
    return Kernel(name, "gemm", flops, _nbytes(_tensors(args)), gemm_blocks(seq, 1, b * h),
                  q.dtype in (torch.float16, torch.bfloat16))  # fmt: skip


def _norm_kernels(name: str, args: tuple[Any, ...], ins: list[torch.Tensor],
                  outs: list[torch.Tensor]) -> list[Kernel]:  # fmt: skip
    """Batch norm: a per-channel statistics reduction, then an elementwise transform (forward)
    or input-gradient pass (backward). Layer norm: one block per normalised row."""
    x = args[1] if name.endswith("_backward") else args[0]
    moved = _nbytes([*ins, *outs])
    if "layer_norm" in name:
        norm = math.prod(args[2]) if name.endswith("_backward") else math.prod(args[1])
        rows = x.numel() // max(1, norm)
        return [Kernel(name, "reduction", 5.0 * x.numel(), moved, max(1, rows))]
    channels = x.shape[1] if x.dim() > 1 else 1
    ks = []
    # The first bool argument is `training` (forward) or `train` (backward) in every variant.
    training = "no_training" not in name and next((a for a in args if isinstance(a, bool)), True)
    if training or name.endswith("_backward"):
        ks.append(Kernel(name + ":stats", "reduction", 2.0 * x.numel(), _nbytes([x]),
                         reduction_blocks(channels, x.numel())))  # fmt: skip
    ks.append(Kernel(name, "elementwise", 2.0 * x.numel(), moved, elementwise_blocks(x.numel())))
    return ks


def _foreach_kernels(name: str, args: tuple[Any, ...], out: Any) -> list[Kernel]:
    lists = [a for a in args if isinstance(a, list | tuple) and a and
             isinstance(a[0], torch.Tensor)]  # fmt: skip
    if not lists:
        return []
    first = lists[0]
    outs = _tensors(out)
    depth = len(lists) + (1 if outs else 0)
    numels = [t.numel() for t in first]
    total_bytes = sum(_nbytes(list(lst)) for lst in lists) + _nbytes(outs)
    total_blocks = sum(_cdiv(n, FOREACH_CHUNK) for n in numels if n > 0)
    kind = "reduction" if name == "_foreach_norm" else "elementwise"
    ks = []
    for blocks in foreach_launches(numels, depth):
        share = blocks / total_blocks
        ks.append(Kernel(name, kind, share * sum(numels), int(share * total_bytes), blocks))
    return ks


def _on_gpu(ts: list[torch.Tensor]) -> bool:
    return any(t.device.type == "meta" for t in ts)


def kernels_of(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[Kernel]:
    """The kernels CUDA would launch for one dispatched op (none for views, metadata-only ops
    and host-side ops on CPU tensors)."""
    name = func._overloadpacket.__name__
    # memtrace:: holds the fused CUDA kernels the tracer's emulation stands in for.
    if func.namespace not in ("aten", "memtrace") or func.is_view or name in _NO_KERNEL:
        return []
    ins = _tensors((args, kwargs))
    outs = _tensors(out)
    if not _on_gpu(ins + outs):
        return []
    if name.startswith("_foreach_"):
        return _foreach_kernels(name, args, out)
    if name in ("convolution", "convolution_backward"):
        return _conv_kernels(name, args, out)
    if name in _GEMM and outs:
        return [_gemm(name, ins, outs[0])]
    if name in _ATTENTION:
        return [_attention(name, args)]
    if "batch_norm" in name or "layer_norm" in name:
        return _norm_kernels(name, args, ins, outs)
    # In-place ops return their input; count the written tensor once as an output.
    written = outs or ins[:1]
    numel = max((t.numel() for t in written), default=0)
    moved = _nbytes(ins) + _nbytes(outs)
    half = any(t.dtype in (torch.float16, torch.bfloat16) for t in written)
    if name in _ROW_KERNELS:
        # _softmax(x, dim, ...) and _softmax_backward_data(grad, out, dim, ...)
        dim = (args[2] if name.endswith("_data") else args[1]) % max(1, args[0].dim())
        rows = args[0].numel() // max(1, args[0].shape[dim]) if args[0].dim() else 1
        return [Kernel(name, "reduction", 5.0 * args[0].numel(), moved, max(1, rows), half)]
    in_numel = max((t.numel() for t in ins), default=0)
    if name in _REDUCTIONS or torch.Tag.reduction in func.tags:
        return [Kernel(name, "reduction", in_numel, moved, reduction_blocks(numel, in_numel), half)]
    if name in _ELEMENTWISE or torch.Tag.pointwise in func.tags:
        return [Kernel(name, "elementwise", numel, moved, elementwise_blocks(numel), half)]
    return [Kernel(name, "other", max(numel, in_numel), moved, elementwise_blocks(numel), half)]


class KernelRecorder(Recorder):
    """The symbolic tracer's recorder, also turning the ops of iteration `last` into kernels."""

    def __init__(self, last: int, hooks: list[Any] | None = None) -> None:
        super().__init__(hooks)
        self.last = last
        self.iteration = -1
        self.kernels: list[Kernel] = []

    def marker(self, text: str) -> None:
        n = iteration_of(text)
        if n is not None:
            self.iteration = n
        super().marker(text)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.iteration == self.last:
            self.kernels.extend(kernels_of(func, args, kwargs or {}, out))
        return out


def step_kernels(
    workload: Workload, cfg: step.StepConfig | None = None, gpu: Device | None = None
) -> list[Kernel]:
    """Kernels of the last of `cfg.iterations` (default two: the second is the steady state,
    without the optimizer's one-time state initialisation), traced with `gpu`'s profile (default:
    the default profile's)."""
    cfg = cfg or step.StepConfig(iterations=2)
    rec = KernelRecorder(cfg.iterations - 1)
    step.run(workload, cfg, gpu.profile if gpu and gpu.profile else load_profile(None), rec)
    return rec.kernels


def peak_flops(k: Kernel, device: Device) -> float:
    """Tensor cores for half-precision GEMM/conv; TF32 for fp32 convolutions (cuDNN's default,
    torch.backends.cudnn.allow_tf32=True); plain FP32 for fp32 GEMMs (torch's default
    torch.backends.cuda.matmul.allow_tf32=False) and everything else."""
    if k.kind in ("gemm", "conv") and k.half:
        return device.half_flops
    if k.kind == "conv":
        return device.tf32_flops
    return device.fp32_flops


def sm_fill(k: Kernel, device: Device) -> float:
    return min(1.0, k.blocks / device.sm_count)


def duration_us(k: Kernel, device: Device) -> float:
    """Roofline time of one kernel; a grid smaller than the GPU gets its share of the peaks."""
    fill = sm_fill(k, device)
    seconds = max(
        k.flops / (peak_flops(k, device) * fill), k.bytes / (device.dram_bytes_per_s * fill)
    )
    return seconds * 1e6


COLUMNS = (
    "k_kernels_per_step", "k_gemm_conv_kernels", "k_gflop_per_step", "k_gbytes_per_step",
    "k_gemm_conv_flop_share", "k_gemm_conv_time_share", "k_mean_blocks_per_sm",
    "k_est_gpu_time_us", "k_est_step_time_us", "k_est_launch_bound_ratio", "k_est_smact",
    "k_est_busy_fraction",
)  # fmt: skip


def summarize(kernels: list[Kernel], device: Device | None = None) -> dict[str, float]:
    """The `k_` columns of one step.

    - est_gpu_time_us: sum of roofline durations (the GPU never idles);
    - est_step_time_us: sum of max(duration, launch floor), the step when kernels run back to
      back, each taking at least a launch;
    - est_launch_bound_ratio: launch floor x kernels / est GPU time (> 1: launch-bound);
    - est_smact: sum of duration x min(1, blocks/SMs) over est_step_time (DCGM SMACT's proxy);
    - est_busy_fraction: est GPU time / est step time (nvidia-smi utilisation's proxy).

    `device` defaults to the default profile's GPU."""
    device = device or profile_device()
    floor = device.launch_floor_us
    durs = [duration_us(k, device) for k in kernels]
    gpu = sum(durs)
    wall = sum(max(d, floor) for d in durs)
    flops = sum(k.flops for k in kernels)
    heavy = [(k, d) for k, d in zip(kernels, durs, strict=True) if k.kind in ("gemm", "conv")]
    n = len(kernels)
    per_sm = [min(k.blocks / device.sm_count, BLOCKS_PER_SM_CAP) for k in kernels]
    return {
        "k_kernels_per_step": float(n),
        "k_gemm_conv_kernels": float(len(heavy)),
        "k_gflop_per_step": flops / 1e9,
        "k_gbytes_per_step": sum(k.bytes for k in kernels) / 1e9,
        "k_gemm_conv_flop_share": sum(k.flops for k, _ in heavy) / flops if flops else 0.0,
        "k_gemm_conv_time_share": sum(d for _, d in heavy) / gpu if gpu else 0.0,
        "k_mean_blocks_per_sm": sum(per_sm) / n if n else 0.0,
        "k_est_gpu_time_us": gpu,
        "k_est_step_time_us": wall,
        "k_est_launch_bound_ratio": floor * n / gpu if gpu else 0.0,
        "k_est_smact": sum(d * sm_fill(k, device) for k, d in zip(kernels, durs, strict=True))
        / wall
        if wall
        else 0.0,
        "k_est_busy_fraction": gpu / wall if wall else 0.0,
    }


def count_by_kind(kernels: list[Kernel]) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0)
    for k in kernels:
        counts[k.kind] += 1
    return counts
