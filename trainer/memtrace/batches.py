"""The example batch as the tracer takes it: each tensor a new meta tensor, at the example's
size or, for `max_batch`, at another batch; and the default loss of the model's output against
the target."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from memtrace.checks import listed
from memtrace.checks import tensors as _tensors
from memtrace.result import EstimateError
from memtrace_trainer import notes
from memtrace_trainer.workload import rebuilt

META = torch.device("meta")
# cross_entropy's default ignore_index: a target of it is a padded position, not a class.
IGNORED = -100


def named_tensors(value: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of `value` in `checks.tensors`' order, each with the expression that reaches
    it (`example_inputs[1]`, `target.x`), to name them as the caller wrote them."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from named_tensors(v, f"{path}[{k!r}]")
    elif isinstance(value, tuple | list):
        fields = getattr(type(value), "_fields", None) if isinstance(value, tuple) else None
        for i, v in enumerate(value):
            yield from named_tensors(v, f"{path}.{fields[i]}" if fields else f"{path}[{i}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from named_tensors(getattr(value, f.name, None), f"{path}.{f.name}")


def meta_like(value: Any, base: int, batch: int, memo: dict[int, Any]) -> Any:
    """`value`'s tensors as new meta tensors of the same dtypes and `requires_grad` (a step
    allocates an input's gradient); a first dimension of `base` (the example's batch) becomes
    `batch`, any other is kept (a causal mask beside the batch is the sequence's). `memo`, shared
    by inputs and target, keeps one tensor passed twice (an autoencoder's target=x) one tensor,
    as the step holds it."""
    if isinstance(value, torch.Tensor):
        if id(value) not in memo:
            shape = list(value.shape)
            if shape and shape[0] == base:
                shape[0] = batch
            memo[id(value)] = torch.empty(shape, dtype=value.dtype, device=META,
                                          requires_grad=value.requires_grad)  # fmt: skip
        return memo[id(value)]
    if isinstance(value, Mapping):
        # A plain dict, whatever mapping was given (a tokenizer's BatchEncoding is a UserDict):
        # the model is called with `model(**inputs)`, and the trace copies the batch per step.
        return {k: meta_like(v, base, batch, memo) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return rebuilt(value, [meta_like(v, base, batch, memo) for v in value])
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # Its tensors are the caller's, on the CPU: left inside, the model met them beside its
        # meta parameters and failed as if it were at fault.
        inits = [f.name for f in dataclasses.fields(value) if f.init]
        return dataclasses.replace(
            value, **{n: meta_like(getattr(value, n), base, batch, memo) for n in inits}
        )
    return value


def searched(example_inputs: Any, target: Any, base: int) -> None:
    """Say what `max_batch` resizes when not every tensor is batched: the tensors it keeps at
    their size, and where a tensor taken as batched may not be (its first dimension is the
    batch, and so is another of its dimensions: a 16x16 mask beside a batch of 16)."""
    named = [*named_tensors(example_inputs, "example_inputs"), *named_tensors(target, "target")]
    kept = [f"{p} {tuple(t.shape)}" for p, t in named if t.dim() and t.shape[0] != base]
    if kept:
        notes.warn(f"max_batch resizes the tensors whose first dimension is the example's batch "
                   f"({base}) and keeps the others at their size: {listed(kept)}")  # fmt: skip
    if base == 1:
        return  # size-1 dimensions are everywhere at batch 1: every tensor would be unsure
    # The tensor that gives the batch (the first of at least one dimension) is batched, and
    # vouches for a tensor laid out as it is.
    first = next(i for i, (_, t) in enumerate(named) if t.dim())
    sure = named[first][1].shape[1:]
    unsure = [f"{p} {tuple(t.shape)}" for p, t in named[first + 1:]
              if t.dim() > 1 and t.shape[0] == base and base in t.shape[1:]
              and not _vouched(t.shape[1:], sure, base)]  # fmt: skip
    if unsure:
        notes.warn(f"max_batch takes every tensor whose first dimension is {base} as batched, and "
                   f"{listed(unsure)} may not be (another of its dimensions is {base} too): "
                   f"give example_inputs at a batch size no other dimension has")  # fmt: skip


def _vouched(rest: torch.Size, sure: torch.Size, base: int) -> bool:
    """Whether every dimension of `rest` (a tensor's shape past its first) that equals `base`
    sits where `sure` (the batched tensor's) has `base` too, aligned from the last as broadcasting
    aligns them: a segmentation target (32, 32, 32) beside images (32, 3, 32, 32), labels
    (12, 12) beside token ids (12, 12). A causal mask (16, 16) beside x (16, 16, 64) is not: its
    16 sits where x has 64."""
    return all(
        len(rest) - j <= len(sure) and sure[j - len(rest)] == base
        for j, n in enumerate(rest)
        if n == base
    )


def _output_tensor(output: Any) -> torch.Tensor | None:
    """The model's own loss (a transformers output given labels), else its first floating
    output."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    return next((t for t in _tensors(output) if t.is_floating_point()), None)


def _paired(output: Any, out: torch.Tensor, shape: str = "") -> str:
    """How the default loss's errors name `out`, the tensor of `output` it paired with the
    target: by its place where the output holds other floating tensors (a tuple of an auxiliary
    head and the logits), which the caller may have meant instead."""
    floats = [(p, t) for p, t in named_tensors(output, "output") if t.is_floating_point()]
    if len(floats) < 2:
        return f"the model's output{shape}"
    path = next((p for p, t in floats if t is out), "output.loss")
    what = "its own loss" if out is getattr(output, "loss", None) else "the first floating tensor"
    return f"the model's {path}{shape}, {what} of its output,"


def _class_dim(out: torch.Tensor, target: torch.Tensor) -> int | None:
    """The dimension of `out` that holds the class scores for the integer `target`, as the
    default loss pairs them; None where it cannot."""
    shape, classes_last = tuple(target.shape), tuple(out.shape[:-1])
    if out.dim() == 2 and shape in (classes_last, (*classes_last, 1)):
        return -1
    if out.dim() > 2 and shape == (out.shape[0], *out.shape[2:]):
        # Classes in the second dimension (segmentation: N, C, H, W), as cross_entropy takes.
        return 1
    if out.dim() > 2 and shape == classes_last:
        return -1
    return None


def default_loss(output: Any, target: Any) -> torch.Tensor:
    """The loss when none is given: cross-entropy against an integer `target`, mean squared
    error against a floating one, else the model's own loss (a transformers output given
    labels) or the mean of its first floating output."""
    out = _output_tensor(output)
    if out is None:
        raise EstimateError("the model's output has no floating-point tensor to take a loss of: "
                            "pass loss_fn=")  # fmt: skip
    if target is None:
        return out if out.dim() == 0 else out.mean()
    if not target.is_floating_point():
        dim = _class_dim(out, target)
        if dim == 1:
            return nn.functional.cross_entropy(out, target)
        if dim == -1:
            return nn.functional.cross_entropy(out.flatten(0, -2), target.flatten())
        raise EstimateError(
            f"target: the default loss cannot pair {_paired(output, out, f' {tuple(out.shape)}')}"
            f" with the integer target {tuple(target.shape)} (class scores in the last or the "
            "second dimension): pass loss_fn="
        )
    if tuple(target.shape) != tuple(out.shape):
        paired = _paired(output, out).removeprefix("the model's output").rstrip(",")
        which = f" (output{paired})" if paired else ""
        raise EstimateError(
            f"target: the default loss (mean squared error) needs a floating target of the "
            f"output's shape {tuple(out.shape)}{which}, got {tuple(target.shape)}: pass loss_fn="
        )
    return nn.functional.mse_loss(out, target)


def classes_checked(target: Any) -> Callable[[Any, Any], torch.Tensor]:
    """The default loss, refusing class indices of `target` (the caller's tensor, whose values
    are read here: the trace's copy has none) outside the model's classes: on a GPU,
    cross-entropy stops at a device-side assert."""
    if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.is_meta:
        return default_loss
    classes = target[target != IGNORED]
    if classes.numel() == 0 or target.dtype == torch.bool:
        return default_loss
    low, high = int(classes.min()), int(classes.max())

    def loss(output: Any, tgt: Any) -> torch.Tensor:
        out = _output_tensor(output)
        dim = None if out is None or tgt is None else _class_dim(out, tgt)
        if dim is not None and (low < 0 or high >= out.shape[dim]):  # type: ignore[union-attr]
            n, paired = out.shape[dim], _paired(output, out)  # type: ignore[union-attr]
            mine = "" if paired == "the model's output" else ": pass loss_fn= to pair them yourself"
            raise EstimateError(
                f"target: class indices from {low} to {high}, where {paired} has {n} classes "
                f"(0 to {n - 1}; {IGNORED} is ignored): on a GPU, cross-entropy fails with a "
                f"device-side assert{mine}"
            )
        return default_loss(output, tgt)

    return loss
