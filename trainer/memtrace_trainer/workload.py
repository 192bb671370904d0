"""A training workload: a model on meta, a batch maker and a loss."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memtrace_trainer import notes
from memtrace_trainer.errors import in_model

Batch = tuple[Any, Any]


def call_model(model: nn.Module, inputs: Any) -> Any:
    """`model(x)`, `model(*x)` or `model(**x)` for a tensor, a tuple or a dict of inputs; what
    it raises is marked as the model's (`errors.in_model`)."""
    try:
        if isinstance(inputs, Mapping):
            return model(**inputs)
        if isinstance(inputs, tuple | list):
            return model(*inputs)
        return model(inputs)
    except Exception as e:
        in_model(e)
        raise


def parameter_count(p: torch.Tensor) -> int:
    """The weights a parameter stands for: its elements, or for a 4-bit weight, packed two to
    a byte (`models/qlora.py`), the layer's weights, as peft counts them."""
    return int(getattr(p, "quantized_numel", p.numel()))


def rebuilt(value: tuple[Any, ...] | list[Any], items: Any) -> Any:
    """A tuple or list of `value`'s own type holding `items`: a NamedTuple's constructor takes
    its fields as positional arguments, where tuple and list take one iterable."""
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return type(value)(*items)
    return type(value)(items)


def fresh_like(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """New storage of the same shapes, as the next batch copied to the GPU would have: a tensor
    met twice (an autoencoder's target=x) is one new tensor, and one that requires grad still
    does (the step allocates its gradient)."""
    memo = {} if memo is None else memo
    if isinstance(value, torch.Tensor):
        if id(value) not in memo:
            memo[id(value)] = torch.empty_like(value, requires_grad=value.requires_grad)
        return memo[id(value)]
    if isinstance(value, Mapping):
        return {k: fresh_like(v, memo) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return rebuilt(value, [fresh_like(v, memo) for v in value])
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # A batch of the caller's own class (the Python API): its tensors are the batch too.
        inits = [f.name for f in dataclasses.fields(value) if f.init]
        return dataclasses.replace(value, **{n: fresh_like(getattr(value, n), memo) for n in inits})
    return value


@dataclass
class Workload:
    """`make_batch()` gives (inputs, target); `loss(output, target)` gives a scalar tensor."""

    spec: str
    model: nn.Module
    make_batch: Callable[[], Batch]
    loss: Callable[[Any, Any], torch.Tensor]
    batch_size: int
    family: str = ""
    # The values the builder chose because the user gave none (e.g. `seq_len` of an `hf:` model):
    # they shape the answer, so commands print them and put them in their JSON.
    defaults: dict[str, Any] = field(default_factory=dict)
    # What the builder knows of the model that a reader of the answer needs (parameter counts,
    # the task of a Hugging Face model); commands print it and put it in their JSON.
    details: dict[str, Any] = field(default_factory=dict)
    # The input size the job was built for, as its features name it (`seq_len` of a token
    # model, `input_shape` of one sample otherwise): features of one size read against a trace
    # of another would compare two jobs. Empty where the inputs take no size (DLRM).
    sizes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from torch.nn.parameter import UninitializedTensorMixin

        # A lazy module (nn.LazyLinear) sizes its parameters at its first forward; everything
        # that counts, casts, adapts or shards them needs them sized. One forward of a batch,
        # untraced and without gradients, runs first: PyTorch's own advice for lazy modules.
        state = [*self.model.parameters(), *self.model.buffers()]
        if any(isinstance(t, UninitializedTensorMixin) for t in state):
            inputs, _ = self.make_batch()
            with torch.no_grad():
                call_model(self.model, inputs)

    def forward(self) -> Any:
        inputs, _ = self.make_batch()
        return call_model(self.model, inputs)


def user_function(spec: str, flag: str) -> Callable[..., Any]:
    """`package.module:function` of a user's flag (`--entry`, `--step`), imported; errors name
    the flag, and an exception the user's module raises while importing is theirs."""
    from memtrace_trainer.errors import UserCodeError, UserError

    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name:
        raise UserError(f"{flag} {spec!r}: expected package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(f"{flag} {spec!r}: cannot import {module_name!r} ({e})") from None
    except (Exception, SystemExit) as e:  # a module that exits on import, too
        raise UserCodeError(f"{flag} {spec!r}: importing {module_name} raised", e) from e
    missing = object()
    func = getattr(module, func_name, missing)
    if func is missing:
        raise UserError(f"{flag} {spec!r}: {module_name} has no function {func_name!r}")
    if not callable(func):
        # The name is there: "no function" sent the user looking for a typo.
        raise UserError(f"{flag} {spec!r}: {module_name}.{func_name} is not callable (it is "
                        f"{_a(type(func).__name__)}): expected a function")  # fmt: skip
    return func  # type: ignore[no-any-return]


def _a(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def entry_takes(entry: str, name: str) -> bool:
    """Whether the `--entry` function (`module:function`) takes a parameter `name`."""
    import inspect

    return name in inspect.signature(user_function(entry, "--entry")).parameters


# Layers whose own forward multiplies their input by their floating weight, which PyTorch
# refuses of an integer input on a GPU ("mat1 and mat2 must have the same dtype", "Input type
# (long int) and bias type (float) should be the same"); the tracer's device checks no dtypes.
# By their forward, not their class: a subclass whose forward casts its input is not watched.
_FLOAT_INPUT_LAYERS = frozenset(c.forward for c in (
    nn.Linear, nn.Bilinear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d,
    nn.ConvTranspose2d, nn.ConvTranspose3d))  # fmt: skip


def integer_inputs(model: nn.Module, inputs: str) -> None:
    """Warn, as the tracer's `model` runs, of the first layer of `_FLOAT_INPUT_LAYERS` with
    floating parameters that is given an integer tensor (a long batch of features to a Linear
    or Conv): the job fails there on a GPU. Only where a layer is given one, so token ids to an
    embedding, the integer input a model takes, are never said. `inputs`: what the caller
    calls the batch (`example_inputs`, an `--entry`'s inputs)."""
    handles: list[Any] = []

    def hook(name: str, layer: nn.Module) -> Callable[..., None]:
        def watch(module: nn.Module, args: tuple[Any, ...]) -> None:
            ints = sorted({str(t.dtype) for t in args if isinstance(t, torch.Tensor)
                           and not (t.is_floating_point() or t.is_complex())})  # fmt: skip
            if not ints:
                return
            for h in handles:  # said once: the first layer is where a GPU stops
                h.remove()
            cls = type(layer).__name__
            what = f"the model's {cls} {name!r}" if name else f"the model (a {cls})"
            notes.warn(
                f"{what} is given {', '.join(ints)} input and its parameters are "
                f"{layer.weight.dtype}: on a GPU it fails there (PyTorch takes a layer's input "
                "and weights in one dtype), which the tracer's device does not check; the "
                f"estimate is of a job that does not run as given: cast integer {inputs} that "
                "are features (not indices) to a floating dtype, e.g. x.float()"
            )

        return watch

    for name, layer in model.named_modules():
        weight = getattr(layer, "weight", None)
        if (type(layer).forward in _FLOAT_INPUT_LAYERS and isinstance(weight, torch.Tensor)
                and weight.is_floating_point()):  # fmt: skip
            handles.append(layer.register_forward_pre_hook(hook(name, layer)))
    if handles:
        # One forward shows what the layers are given: no hook runs in the later ones.
        def done(*_: Any) -> None:
            for h in handles:
                h.remove()

        handles.append(model.register_forward_hook(done))
