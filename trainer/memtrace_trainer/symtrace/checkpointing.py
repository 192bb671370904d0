"""Activation checkpointing: "full" recomputes each block in the backward; "selective" keeps
the outputs of the expensive ops and recomputes the rest.

- Hugging Face models checkpoint through their own switch (`activation_checkpointing_enable`,
  once `gradient_checkpointing_enable`), per decoder layer, non-reentrant; a peft model reaches
  its base model's.
- Other models wrap the repeated blocks (`_blocks`) in `torch.utils.checkpoint.checkpoint`.
- "selective" is torchtitan's op-level policy (`torchtitan/distributed/activation_checkpoint.py`,
  `_apply_op_sac`): save the outputs of matmuls, attention kernels and reduce-scatters (and
  `max`, for low-precision recipes), except every second matmul, and recompute everything else;
  it runs through PyTorch's `create_selective_checkpoint_contexts`, as torchtitan's does.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from memtrace_trainer.errors import UserError

CHECKPOINTING = ("full", "selective")
aten = torch.ops.aten


def _save_list() -> set[Any]:
    ops = {
        aten.mm.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten.max.default,
    }
    with contextlib.suppress(AttributeError):
        ops.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    return ops


def selective_context() -> Any:
    """One checkpointed call's contexts under torchtitan's op policy; the matmul count is per
    call, as torchtitan keeps it per call (a fresh `meta` dict each time)."""
    save = _save_list()
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == aten.mm.default:
            counts[mode] += 1
        keep = func in save and not (func == aten.mm.default and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _hf_model(model: nn.Module) -> Any:
    """The transformers model inside `model` (itself, or a peft model's base), if any."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return None
    for m in (model, getattr(getattr(model, "base_model", None), "model", None)):
        if isinstance(m, PreTrainedModel):
            return m
    return None


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks to checkpoint: children of the outermost Sequential/ModuleList
    containers that hold composite modules; leaves of a flat Sequential otherwise."""
    found: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        for child in m.children():
            if isinstance(child, nn.Sequential | nn.ModuleList) and any(
                any(True for _ in c.children()) for c in child.children()
            ):
                found.extend(child.children())
            else:
                visit(child)

    visit(model)
    if not found and isinstance(model, nn.Sequential):
        found = [c for c in model.children() if any(True for _ in c.parameters())]
    return found


def _with_modes(f: Any, modes: list[Any]) -> Any:
    """`f`, run with the function modes `modes` re-entered where they are missing."""

    def run(*args: Any, **kwargs: Any) -> Any:
        stack = torch.overrides._get_current_function_mode_stack()
        missing = [m for m in modes if m not in stack]
        with contextlib.ExitStack() as es:
            for m in missing:
                es.enter_context(m)
            return f(*args, **kwargs)

    return run


@contextlib.contextmanager
def recompute_under_modes() -> Any:
    """While tracing, every `torch.utils.checkpoint` call (the tracer's, transformers', a user's
    own, FSDP's checkpoint wrapper) recomputes under the function modes of its forward.
    Recomputation runs inside the autograd engine, where the tracer's function modes (the CUDA
    function swaps, the device map) are not on the stack; a real recompute runs the same
    kernels as its forward, and a selective policy matches recomputed ops to saved ones, so
    the modes are re-entered, as autocast state is restored for a real recompute."""
    import torch.utils.checkpoint as ckpt

    original = ckpt._checkpoint_impl

    def impl(function: Any, *args: Any, **kwargs: Any) -> Any:
        stack = list(torch.overrides._get_current_function_mode_stack())
        return original(_with_modes(function, stack), *args, **kwargs)

    ckpt._checkpoint_impl = impl
    try:
        yield
    finally:
        ckpt._checkpoint_impl = original


def enable_checkpointing(model: nn.Module, mode: str = "full") -> int:
    """Checkpointing of `mode` on `model`; returns the number of checkpointed blocks."""
    if mode not in CHECKPOINTING:
        raise UserError(f"--checkpointing {mode!r}: expected one of {', '.join(CHECKPOINTING)}")
    extra: dict[str, Any] = {"context_fn": selective_context} if mode == "selective" else {}
    hf = _hf_model(model)
    if hf is not None and getattr(hf, "supports_gradient_checkpointing", False):
        enable = getattr(hf, "activation_checkpointing_enable", None)
        kwargs = {"use_reentrant": False, **extra}
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        # What transformers does itself at the first training forward, with a message about
        # this call of ours ("`use_cache=True` is incompatible with gradient checkpointing"):
        # no key/value cache is kept in training with checkpointing either way.
        config = getattr(hf, "config", None)
        if getattr(config, "use_cache", False) is True:
            config.use_cache = False
        layers = [m for m in hf.modules() if getattr(m, "gradient_checkpointing", False) is True]
        return len(layers)
    blocks = _blocks(model)
    if blocks and not any(any(True for _ in b.children()) for b in blocks):
        # A flat model's blocks are its single layers. Each is checkpointed as asked (a
        # dropout's mask, say, is then recomputed, not kept), but a layer checkpointed alone
        # keeps its input, most of what its own backward keeps: the flag saves little.
        from memtrace_trainer.notes import warn

        warn(f"--checkpointing {mode} saves little on this model: it has no blocks of several "
             "layers to recompute, so each layer is checkpointed alone, and a layer "
             "checkpointed alone keeps its input, most of what its backward keeps")  # fmt: skip
    for block in blocks:
        forward = block.forward

        def wrapped(*args: Any, _f: Any = forward, **kwargs: Any) -> Any:
            return checkpoint(_f, *args, use_reentrant=False, preserve_rng_state=False,
                              **extra, **kwargs)  # fmt: skip

        block.forward = wrapped  # type: ignore[method-assign]
    if not blocks:
        raise UserError("--checkpointing: found no blocks to checkpoint in this model")
    return len(blocks)
