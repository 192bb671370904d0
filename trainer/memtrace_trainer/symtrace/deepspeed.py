"""What DeepSpeed's ZeRO holds beyond the PyTorch code its strategies run as (`distributed.py`,
`EQUIVALENT`). DeepSpeed is not installed: what it would allocate is allocated here, in the trace,
at the time and for the lifetime DeepSpeed's own code gives it (docs/distributed.md cites each
function).

- **bf16/fp16 mode.** fp32 master weights and fp32 optimizer state beside the 16-bit parameters
  (ZeRO-1: one buffer of what `ZeroRedundancyOptimizer`'s 16-bit state lacks, from the
  optimizer's construction).
- **The contiguous gradient reduce buffer** (`contiguous_gradients`, default True), of
  `reduce_bucket_size` elements (default 5e8) in the parameters' dtype:
  - stages 1 and 2 (`stage_1_and_2.py`, `DeepSpeedZeroOptimizer.backward`) allocate
    `ipg_buffer` at each backward, two with `overlap_comm` (default False for these stages),
    and drop it once the gradients are reduced (`independent_gradient_partition_epilogue`,
    `_release_ipg_buffers`): stage 2 in each backward, stage 1 at the accumulation boundary,
    where it also keeps its partition's gradients and drops the rest (`stage1_reduce`,
    `stage1_step_copies`);
  - stage 3 (`stage3.py`, `_setup_for_real_optimizer`) allocates `__ipg_bucket_flat_buffer`
    once, after the optimizer state, and keeps it.
- **ZeRO-1's ranks.** `ZeroRedundancyOptimizer` partitions whole parameters; when another rank's
  partition holds more optimizer state than rank 0's, the difference is added to rank 0's trace
  so the need is the heaviest rank's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from memtrace_trainer.dtypes import dtype_of, name_of
from memtrace_trainer.errors import UserError
from memtrace_trainer.notes import warn

ZERO = ("zero1", "zero2", "zero3")
# DeepSpeedZeroConfig.reduce_bucket_size: `Field(pp_int(5e8), ge=0)`, in elements.
REDUCE_BUCKET_SIZE = 500_000_000
# A bound on what is traced (2^40 bf16 elements are 2 TiB, more than any GPU holds).
MAX_REDUCE_BUCKET = 1 << 40


def whole_elements(value: Any) -> int | None:
    """A number of elements as DeepSpeed's config writes it: an int, or a float or numeric string
    with no fraction (`5e8`, which `pp_int` takes); None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            try:
                value = float(value)
            except ValueError:
                return None
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    return value if isinstance(value, int) else None


def bucket_size_arg(text: str) -> int:
    """argparse's type for `--reduce-bucket-size`: whole numbers of elements, `5e8` included
    (argparse names the flag when this raises)."""
    n = whole_elements(text)
    if n is None:
        raise argparse.ArgumentTypeError(f"invalid number of elements: {text!r}")
    return n


# The request schema (serve_schema._kind) takes a JSON number for it, as for a float flag.
bucket_size_arg.schema_kind = "number"  # type: ignore[attr-defined]


def check_reduce_bucket(strategy: str | None, elements: int | None) -> None:
    """`--reduce-bucket-size N`: a number of elements, 0 included (DeepSpeed's `ge=0`: every
    parameter then takes the extra-large path and no buffer is made); without a ZeRO strategy
    it has no effect, and says so."""
    if elements is None:
        return
    if isinstance(elements, bool) or not isinstance(elements, int) or elements < 0:
        raise UserError(
            f"--reduce-bucket-size {elements!r}: expected a whole number of elements, 0 or more "
            f"(DeepSpeed's zero_optimization.reduce_bucket_size, default {REDUCE_BUCKET_SIZE})"
        )
    if elements > MAX_REDUCE_BUCKET:
        # 1e300 is a whole number too: said in full it filled the terminal.
        shown = f"{elements:.3e}" if elements > 10**18 else str(elements)
        raise UserError(
            f"--reduce-bucket-size {shown}: expected at most {MAX_REDUCE_BUCKET} elements"
        )
    if strategy not in ZERO:
        what = f"--strategy {strategy}" if strategy else "an unsharded job"
        warn(
            f"--reduce-bucket-size {elements} has no effect with {what}: it is DeepSpeed's "
            "reduce_bucket_size, for --strategy zero1, zero2 and zero3"
        )


def reduce_bucket(strategy: str, model: nn.Module, elements: int | None) -> dict[str, Any] | None:
    """DeepSpeed's contiguous gradient reduce buffer for a ZeRO strategy, as the output states
    it: elements, dtype (the first trainable parameter's, DeepSpeed's `self.dtype`, read before
    a strategy makes the parameters fp32), how many, and when they are allocated. None for
    another strategy. Call before `shard` changes the parameters' dtype."""
    if strategy not in ZERO:
        return None
    n = REDUCE_BUCKET_SIZE if elements is None else elements
    dtype = next((p.dtype for p in model.parameters() if p.requires_grad), torch.float32)
    held = {"zero1": "accumulation", "zero2": "backward", "zero3": "optimizer"}[strategy]
    # 0: every parameter is larger than the bucket and is reduced in place (stage_1_and_2.py,
    # `extra_large_param_to_reduce`): no buffer worth a block.
    buffers = 1 if n else 0
    bucket = {"elements": n, "dtype": name_of(dtype), "buffers": buffers,
              "bytes": buffers * n * dtype.itemsize, "held": held}  # fmt: skip
    # fp32 adapters over a 16-bit frozen base (LoRA with --dtype bf16): DeepSpeed's fp32 mode
    # is what is modelled; its bf16 mode casts the whole module first (engine.py,
    # `_configure_distributed_model`), which would make the buffer 16-bit too.
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad} & {
        torch.bfloat16,
        torch.float16,
    }
    if dtype == torch.float32 and frozen:
        low = name_of(min(frozen, key=str))
        bucket["mode"] = (
            f"fp32, the trainable parameters' dtype (DeepSpeed's fp32 mode); in its {low} mode, "
            f"which casts the whole module to {low} (Hugging Face's --{low}), it is half that"
        )
    return bucket


def bucket_said(bucket: dict[str, Any]) -> str:
    """The reduce buffer as the equivalence line states it."""
    if not bucket["buffers"]:
        return (
            "DeepSpeed's contiguous gradient reduce buffer (contiguous_gradients): "
            "reduce_bucket_size 0, so every parameter is reduced in place as an extra-large "
            "one (stage_1_and_2.py, extra_large_param_to_reduce) and no buffer is held"
        )
    mib = bucket["bytes"] / 2**20
    where = {
        "optimizer": "allocated with the optimizer and kept (stage3.py, _setup_for_real_optimizer)",
        "backward": "allocated at each backward and freed once its gradients are reduced "
        "(stage_1_and_2.py, backward; one buffer, as overlap_comm defaults to False here)",
        "accumulation": "allocated at the first backward and freed once the gradients are "
        "reduced at the accumulation boundary (stage_1_and_2.py: each backward replaces it, "
        "and stage 1 reduces only at the boundary, reduce_gradients; one buffer, as "
        "overlap_comm defaults to False here)",
    }[bucket["held"]]
    mode = f"; its dtype is {bucket['mode']}" if "mode" in bucket else ""
    return (
        f"DeepSpeed's contiguous gradient reduce buffer (contiguous_gradients): reduce_bucket_size "
        f"{bucket['elements']} elements of {bucket['dtype']} ({mib:.1f} MiB), {where}{mode}"
    )


def reduce_buffers(bucket: dict[str, Any] | None, device: torch.device) -> list[torch.Tensor]:
    """The reduce buffers themselves, on the tracer's device (the caller records them)."""
    if bucket is None:
        return []
    dtype = dtype_of(bucket["dtype"])
    return [torch.empty(bucket["elements"], dtype=dtype, device=device)
            for _ in range(bucket["buffers"])]  # fmt: skip


# fp32 state tensors per parameter of each optimizer ZeRO-1 takes (DeepSpeed keeps them fp32).
STATE_SLOTS = {"adam": 2, "adamw": 2, "sgd": 0, "sgd-momentum": 1, "adagrad": 1, "rmsprop": 1}


def fp32_extra_per_parameter(slots: int) -> int:
    """What DeepSpeed's 16-bit mode holds per partitioned parameter beyond a 16-bit
    ZeroRedundancyOptimizer's state: a 4-byte master weight, and 4 - 2 more bytes per state
    tensor."""
    return 4 + 2 * slots


def deepspeed_low_precision(model: nn.Module) -> torch.dtype | None:
    """The 16-bit dtype of a job in pure low precision (`--dtype bf16/fp16`: every trainable
    parameter in it), which a ZeRO strategy runs in DeepSpeed's bf16/fp16 mode."""
    trainable = {p.dtype for p in model.parameters() if p.requires_grad}
    if len(trainable) == 1 and next(iter(trainable)) in (torch.bfloat16, torch.float16):
        return next(iter(trainable))
    return None


def deepspeed_fp32_bytes(model: nn.Module, zero: Any, optimizer: str) -> int:
    """ZeRO-1 in DeepSpeed's bf16/fp16 mode: the bytes of fp32 master weights and fp32 state
    rank 0 holds beyond what `zero` (PyTorch's ZeroRedundancyOptimizer, state in the
    parameters' 16 bits) holds; 0 when the job is not in pure 16 bits or the optimizer's state
    is unknown (said by `shard`)."""
    slots = STATE_SLOTS.get(optimizer)
    if deepspeed_low_precision(model) is None or slots is None:
        return 0
    numel = sum(p.numel() for group in zero._partition_parameters()[0] for p in group["params"])
    return fp32_extra_per_parameter(slots) * numel


def heaviest_rank(model: nn.Module, zero: Any, optimizer: str) -> tuple[int, int, str | None]:
    """ZeRO-1's ranks differ by whole parameters: (the rank whose optimizer state is the
    largest, the bytes of state it holds beyond rank 0's, what the output says of it). The
    bytes are added to rank 0's trace, so the need is that rank's; (0, 0, None) when rank 0 is
    the heaviest. With an optimizer whose state per parameter is not known here, a warning
    names the larger rank and nothing is added."""
    parts = zero._partition_parameters()
    sizes = [sum(p.numel() * p.element_size() for group in part for p in group["params"])
             for part in parts]  # fmt: skip
    slots = STATE_SLOTS.get(optimizer)
    if slots is None:
        if sizes and sizes[0] < max(sizes):
            warn(
                f"--strategy zero1: ZeroRedundancyOptimizer partitions whole parameters, and the "
                f"largest partition ({max(sizes):,} bytes of parameters) is rank "
                f"{sizes.index(max(sizes))}'s, not rank 0's ({sizes[0]:,} bytes): that rank "
                f"holds proportionally more optimizer state than the rank traced ({optimizer}'s "
                "state per parameter is not known here)"
            )
        return 0, 0, None
    fp32 = fp32_extra_per_parameter(slots) if deepspeed_low_precision(model) is not None else 0
    states = [sum(p.numel() * (slots * p.element_size() + fp32) for group in part
                  for p in group["params"]) for part in parts]  # fmt: skip
    if not states or states[0] >= max(states):
        return 0, 0, None
    rank = states.index(max(states))
    more = states[rank] - states[0]
    said = (
        f"rank 0 traced, with the {more:,} bytes of optimizer state rank {rank} holds beyond "
        f"it: ZeroRedundancyOptimizer partitions whole parameters and rank {rank}'s partition "
        f"({sizes[rank]:,} bytes of parameters, rank 0's {sizes[0]:,}) is the largest, so the "
        f"need is rank {rank}'s (DeepSpeed partitions the flattened parameters evenly, so its "
        "ranks differ by less)"
    )
    return rank, more, said


def zero_redundancy(optimizer: Any, params: list[Any]) -> Any:
    """ZeRO-1's optimizer: PyTorch's `ZeroRedundancyOptimizer` around the class and settings of
    `optimizer`, so each rank keeps the state of its partition of the parameters (partitions
    are whole parameters, balanced greedily: `heaviest_rank` says which rank holds the most)."""
    import inspect

    from torch.distributed.optim import ZeroRedundancyOptimizer

    cls = type(optimizer)
    if cls.__module__.split(".")[0] != "torch":
        raise UserError(
            f"--strategy zero1 runs PyTorch's ZeroRedundancyOptimizer, which wraps a "
            f"torch.optim optimizer; {cls.__name__} is not one"
        )
    accepted = inspect.signature(cls.__init__).parameters
    settings = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    return ZeroRedundancyOptimizer(params, optimizer_class=cls, **settings)


def stage1_reduce(
    params: list[nn.Parameter],
    mine: set[int],
    elements: int,
    label: Callable[[torch.Tensor], None] = lambda g: None,
) -> None:
    """ZeRO-1's reduction at the accumulation boundary (stage_1_and_2.py, `reduce_gradients`,
    with overlap_comm False): each gradient in turn is copied into the reduce buffer and its
    own storage dropped (one larger than the bucket stays where it is); when the bucket would
    overflow, and at the end (`independent_gradient_partition_epilogue`), the gradients of this
    rank's partition (`mine`, ids) are copied into `grads_in_partition`, one flat tensor of
    the partition's elements in the gradients' dtype made at the first such copy
    (`copy_grads_in_partition`), and the rest are dropped (`zero_grad`). The partition's
    gradients are left as views of that tensor, as DeepSpeed leaves them
    (`averaged_gradients`), for the optimizer's step. `label` is called on each full gradient
    before it is dropped (the tracer's category for it)."""
    grads = [p for p in params if p.grad is not None]
    for p in grads:
        label(p.grad)
    kept = [p for p in grads if id(p) in mine]
    if len({p.grad.dtype for p in kept}) > 1:  # not one flat tensor: each keeps its own
        kept = []
    moved = {id(p) for p in kept}
    flat: list[torch.Tensor] = []
    offset = 0
    bucket: list[nn.Parameter] = []
    filled = 0

    def flush() -> None:
        nonlocal offset
        for p in bucket:
            if id(p) in moved:
                if not flat:
                    total = sum(q.numel() for q in kept)
                    flat.append(torch.empty(total, dtype=p.dtype, device=p.device))
                p.grad = flat[0].narrow(0, offset, p.numel()).view_as(p)
                offset += p.numel()
        bucket.clear()

    for p in grads:
        if filled + p.numel() > elements:
            flush()
            filled = 0
        if p.numel() <= elements and (id(p) not in mine or id(p) in moved):
            p.grad = None  # its values now in the reduce buffer
        bucket.append(p)
        filled += p.numel()
    flush()
    for p in grads:
        if id(p) not in mine:
            p.grad = None


def stage1_step_copies(params: list[nn.Parameter], mine: set[int]) -> torch.Tensor | None:
    """What DeepSpeed's stage-1/2 `step` makes from the partition's gradients before the
    optimizer runs: `scaled_global_norm` takes each gradient `.double()` in turn (the largest
    transient of these is made and dropped); then `flatten(averaged_gradients)` (a flat copy in
    the gradients' dtype) `.to(float32)` (another, unless already fp32), the first dropped at
    once; `averaged_gradients` is then dropped. In the trace the partition's gradients stay for
    ZeroRedundancyOptimizer's step, so what is returned (uint8, to be dropped after the step)
    is the fp32 gradient's bytes beyond them: DeepSpeed's fp32 gradient, held through its
    optimizer step, is the trace's partition gradients plus it."""
    grads = [p.grad for p in params if id(p) in mine and p.grad is not None]
    if not grads:
        return None
    device = grads[0].device
    numel = sum(g.numel() for g in grads)
    torch.empty(max(g.numel() for g in grads), dtype=torch.float64, device=device)
    have = sum(g.numel() * g.element_size() for g in grads)
    flat = have
    fp32 = 4 * numel if any(g.dtype != torch.float32 for g in grads) else 0
    keep = max((fp32 or flat) - have, 0)
    held = torch.empty(keep, dtype=torch.uint8, device=device)
    torch.empty(flat + fp32 - keep, dtype=torch.uint8, device=device)
    return held
