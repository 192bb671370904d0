"""Model features: parameters, torchsummary-style activations per layer, layer counts.

Activations are counted the way torchsummary (and GPUMemNet's datasets) count them: the output
elements of every hooked module, per sample, gathered with forward hooks on the meta device.
"""

from __future__ import annotations

import collections
import csv
import io
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memtrace_trainer.errors import model_failed, raised_by_memtrace
from memtrace_trainer.symtrace.fakecuda import stand_ins
from memtrace_trainer.workload import Workload, parameter_count

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)

# GPUMemNet's layer names per family; modules mapped to None are not listed in its datasets.
_GPUMEMNET_NAMES: dict[type[nn.Module], str | None] = {
    nn.Linear: "linear",
    nn.Conv2d: "conv2d",
    nn.BatchNorm1d: "batch_normalization",
    nn.BatchNorm2d: "batchnorm2d",
    nn.Dropout: "dropout",
    nn.AdaptiveAvgPool2d: "adaptive_avg_pool2d",
    nn.AvgPool2d: None,
    nn.MaxPool2d: None,
}

# GPUMemNet's Transformer rows (its `data_cleaner_transformer_step1.py`) list these layers only,
# in torch's spelling, each attention block as its `NonDynamicallyQuantizableLinear` output
# projection; memest counts exactly these (`estimators/src/ml/features.rs`).
_GPUMEMNET_TRANSFORMER_NAMES: dict[type[nn.Module], str] = {
    nn.Embedding: "Embedding",
    nn.Linear: "Linear",
    nn.LayerNorm: "LayerNorm",
    nn.Dropout: "Dropout",
}
ATTENTION = "NonDynamicallyQuantizableLinear"

# The activations GPUMemNet encodes, for its MLP data (`MLP_ACTIVATIONS` in
# estimators/src/ml/features.rs); its CNN data has all but Identity. memest's ML estimate refuses
# a model whose activation is another, or none.
GPUMEMNET_ACTIVATIONS = ("ELU", "GELU", "Identity", "LeakyReLU", "Mish", "PReLU", "ReLU", "SELU",
                         "SiLU", "Softplus", "Tanh")  # fmt: skip
CNN_ACTIVATIONS = tuple(a for a in GPUMEMNET_ACTIVATIONS if a != "Identity")
# Modules of torch.nn.modules.activation that are not a layer's activation: attention, and the
# normalisations of a classifier's output.
_NOT_ACTIVATIONS = (nn.MultiheadAttention, nn.Softmax, nn.Softmin, nn.LogSoftmax, nn.Softmax2d)


def _call_keys(layers: list[Any]) -> list[str]:
    """One key per call, in order: a module's name, then `name#2`, `name#3` for the same module
    called again (ResNet's shared ReLU), so that `layers` lists every call `sequence` lists
    (keyed by name alone, a repeated call overwrote the first: two different layer lists)."""
    seen: dict[str, int] = {}
    keys = []
    for layer in layers:
        seen[layer.name] = seen.get(layer.name, 0) + 1
        keys.append(layer.name if seen[layer.name] == 1 else f"{layer.name}#{seen[layer.name]}")
    return keys


@dataclass
class Layer:
    """One hooked module, in execution order."""

    name: str
    type: str
    activations: int
    parameters: int


@dataclass
class Features:
    total_parameters: int
    total_activations: int
    layers: list[Layer]
    depth: int
    layer_counts: dict[str, int]
    activation_function: str | None
    batch_size: int
    # `Workload.sizes`: the sequence length or input shape these features are of.
    sizes: dict[str, Any] = field(default_factory=dict)
    gpumemnet_sequence: list[tuple[str, int, int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "total_parameters": self.total_parameters,
            "total_activations": self.total_activations,
            "batch_size": self.batch_size,
            **self.sizes,
            "depth": self.depth,
            "layer_counts": self.layer_counts,
            "activation_function": self.activation_function,
            "layers": {
                key: {
                    "type": layer.type,
                    "activations": layer.activations,
                    "parameters": layer.parameters,
                }
                for key, layer in zip(_call_keys(self.layers), self.layers, strict=True)
            },
            "sequence": [[la.type, la.activations, la.parameters] for la in self.layers],
            "gpumemnet_sequence": [list(s) for s in self.gpumemnet_sequence],
        }

    def activation_issue(self) -> str | None:
        """Why memest's ML estimate (GPUMemNet's encoding of the activation) refuses these
        features, naming the activation; None where it encodes it. memest reads a model with an
        attention block with GPUMemNet's Transformer features (no activation), one with a
        convolution with its CNN features, others with its MLP features."""
        kinds = {kind for kind, _, _ in self.gpumemnet_sequence}
        if ATTENTION in kinds:
            return None
        data, vocab = (
            ("CNN", CNN_ACTIVATIONS) if "conv2d" in kinds else ("MLP", GPUMEMNET_ACTIVATIONS)
        )
        act = self.activation_function
        if act in vocab:
            return None
        what = f"activation {act}" if act else "no activation module (a functional one is not seen)"
        known = ", ".join(vocab)
        return (f"the model has {what}, and GPUMemNet's {data} estimator encodes only {known}: "
                "`memest ml` gives no estimate from these features")  # fmt: skip


def _numel(out: Any) -> int:
    if isinstance(out, torch.Tensor):
        return out.numel()
    if isinstance(out, tuple | list):
        return sum(_numel(o) for o in out)
    if isinstance(out, dict):
        return sum(_numel(o) for o in out.values())
    return 0


def is_attention(module: nn.Module) -> bool:
    """An attention block: memest's rule on the layer types of `sequence` (`is_attention` in
    simulator/src/family.rs) applied to the module, so that `gpumemnet_sequence` names attention
    wherever `sequence` does and memest reads both as one family."""
    name = type(module).__name__.lower()
    return (
        isinstance(module, nn.MultiheadAttention)
        or "attention" in name
        or ATTENTION.lower() in name
    )


def is_activation(module: nn.Module) -> bool:
    """A layer's activation module of torch.nn (nn.Identity is none here: `_activation` takes it
    only where no activation module ran, as GPUMemNet's `act:identity` MLPs)."""
    kind = type(module)
    return kind.__module__.startswith("torch.nn.modules.activation") and not issubclass(
        kind, _NOT_ACTIVATIONS
    )


def gpumemnet_name(module: nn.Module, family: str, head: bool = False) -> str | None:
    """GPUMemNet's MLP/CNN spelling of a layer, or None for modules its datasets do not list;
    `head`: the module is the output's activation (after the last layer with weights)."""
    kind = type(module)
    if kind is nn.Softmax:
        return "Softmax" if family == "mlp" else "softmax"
    if kind is nn.Identity or (kind is nn.Sigmoid and head):
        # GPUMemNet's CNN summary lists neither the shortcut Identity nor a Sigmoid head.
        return kind.__name__ if family == "mlp" else None
    if kind in _GPUMEMNET_NAMES:
        return _GPUMEMNET_NAMES[kind]
    if is_activation(module):
        return kind.__name__
    return None


def _last_weighted(leaves: list[tuple[nn.Module, Layer]]) -> int:
    """The index of the last layer with weights (an activation's, PReLU's, are not a layer's);
    the activations after it are the output's head. `len(leaves)` when none has weights."""
    weighted = [i for i, (m, la) in enumerate(leaves) if la.parameters and not is_activation(m)]
    return weighted[-1] if weighted else len(leaves)


def _activation(leaves: list[tuple[nn.Module, Layer]]) -> str | None:
    """The model's activation, from the activation modules that ran: the most common (the first
    of a tie) before its last layer with weights, so a classifier's Sigmoid or Softmax head is
    not taken for it; an Identity only where no other ran (elsewhere it is a placeholder: a
    shortcut, a disabled drop-path); the head's where the model has no other."""
    last = _last_weighted(leaves)
    acts = [(i, la.type) for i, (m, la) in enumerate(leaves)
            if is_activation(m) or type(m) is nn.Identity]  # fmt: skip
    for chosen in (
        [t for i, t in acts if i < last and t != "Identity"],
        [t for i, t in acts if i < last],
        [t for i, t in acts if t != "Identity"],
    ):
        if chosen:
            return collections.Counter(chosen).most_common(1)[0][0]
    return None


def _transformer_sequence(
    records: list[tuple[nn.Module, Layer, int]], names: dict[nn.Module, str]
) -> list[tuple[str, int, int]]:
    """GPUMemNet's Transformer layers: each outermost attention block that ran as one
    `NonDynamicallyQuantizableLinear` (nn.MultiheadAttention never calls its out_proj module, so
    no hook sees it) with its first output and the parameters no listed layer inside it holds
    (GPUMemNet's own rows give it out_proj's alone: its summary parser skipped in_proj), and the
    Embedding, Linear, LayerNorm and Dropout modules that ran."""
    attention = [names[m] for m, _, _ in records if is_attention(m)]
    outer = {n for n in attention if not any(n.startswith(f"{o}.") for o in attention)}
    seq: list[tuple[str, int, int]] = []
    for m, la, first in records:
        name = names[m]
        if name in outer:
            listed = {
                id(p)
                for sub_name, sub in m.named_modules(prefix=name)
                if type(sub) in _GPUMEMNET_TRANSFORMER_NAMES and sub_name != name
                for p in sub.parameters(recurse=False)
            }
            params = sum(parameter_count(p) for p in m.parameters() if id(p) not in listed)
            seq.append((ATTENTION, first, params))
        elif type(m) in _GPUMEMNET_TRANSFORMER_NAMES and not any(True for _ in m.children()):
            seq.append((_GPUMEMNET_TRANSFORMER_NAMES[type(m)], la.activations, la.parameters))
    return seq


def extract(workload: Workload, family: str = "") -> Features:
    """Run one forward pass on meta with hooks; the workload must already live on meta."""
    model = workload.model
    batch = workload.batch_size
    # Each hooked call: the module, its layer, and its first output's elements per sample (an
    # attention block's output beside its optional attention weights).
    records: list[tuple[nn.Module, Layer, int]] = []
    names = {m: n for n, m in model.named_modules()}

    def hook(module: nn.Module, _inputs: Any, output: Any) -> None:
        params = sum(parameter_count(p) for p in module.parameters(recurse=False))
        layer = Layer(names[module], type(module).__name__, _numel(output) // batch, params)
        first = output[0] if isinstance(output, tuple | list) and output else output
        records.append((module, layer, _numel(first) // batch))

    handles = [
        m.register_forward_hook(hook)
        for m in model.modules()
        if m is not model and not isinstance(m, CONTAINERS)
    ]
    was_training = model.training
    model.eval()  # batch statistics of one sample would be rejected by BatchNorm in train mode
    try:
        # The trace's stand-ins for the values meta lacks (transformers reads an attention
        # mask's values to choose its path); its health-check answers are not given here.
        with torch.no_grad(), stand_ins():
            workload.forward()
    except Exception as e:
        # A model PyTorch refuses at this shape (a ViT given another image size) was called an
        # internal error here, and only after the trace had run under `estimate`.
        if raised_by_memtrace(e):
            raise
        raise model_failed(workload.spec, workload.family, batch, "its forward pass", e) from e
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    layers = [layer for _, layer, _ in records]
    leaves = [(m, la) for m, la, _ in records if not any(True for _ in m.children())]
    counts = collections.Counter(la.type for _, la in leaves)
    sequence = _transformer_sequence(records, names)
    if not any(kind == ATTENTION for kind, _, _ in sequence):
        last = _last_weighted(leaves)
        sequence = []
        for i, (m, la) in enumerate(leaves):
            name = gpumemnet_name(m, family, head=i > last)
            if name is not None:
                # GPUMemNet's summary gives PReLU no parameters; mirror it so our rows line up.
                params = 0 if isinstance(m, nn.PReLU) else la.parameters
                sequence.append((name, la.activations, params))
    return Features(
        total_parameters=sum(parameter_count(p) for p in model.parameters()),
        total_activations=sum(la.activations for _, la in leaves),
        layers=layers,
        depth=sum(1 for _, la in leaves if la.parameters > 0),
        layer_counts=dict(sorted(counts.items())),
        activation_function=_activation(leaves),
        batch_size=batch,
        sizes=dict(workload.sizes),
        gpumemnet_sequence=sequence,
    )


MLP_COLUMNS = (
    "Filename", "Depth", "Activations-Params", "Activation Function", "Total Activations",
    "Total Parameters", "Batch Size", "Batch Normalization Layers", "Dropout Layers",
)  # fmt: skip
CNN_COLUMNS = (
    "Filename", "Depth", "Activations-Params", "Activation Function", "Total Activations",
    "Total Parameters", "Batch Size", "Conv2d Count", "BatchNorm2d Count", "Dropout Count",
    "AdaptiveAvgPool2d Count", "Linear Count",
)  # fmt: skip


def gpumemnet_row(features: Features, filename: str, family: str) -> dict[str, str]:
    """One row in the GPUMemNet datasets' columns (labels excluded: they come from runs)."""
    seq = features.gpumemnet_sequence
    counts = collections.Counter(name for name, _, _ in seq)
    row = {
        "Filename": filename,
        # GPUMemNet's Depth: Conv2d layers of a CNN, Linear layers of an MLP.
        "Depth": str(counts["conv2d"] if family == "cnn" else counts["linear"]),
        "Activations-Params": repr(seq),
        "Activation Function": features.activation_function or "",
        "Total Activations": str(sum(a for _, a, _ in seq)),
        "Total Parameters": str(sum(p for _, _, p in seq)),
        "Batch Size": str(features.batch_size),
    }
    if family == "cnn":
        row |= {
            "Conv2d Count": str(counts["conv2d"]),
            "BatchNorm2d Count": str(counts["batchnorm2d"]),
            "Dropout Count": str(counts["dropout"]),
            "AdaptiveAvgPool2d Count": str(counts["adaptive_avg_pool2d"]),
            "Linear Count": str(counts["linear"]),
        }
    else:
        row |= {
            "Batch Normalization Layers": str(counts["batch_normalization"]),
            "Dropout Layers": str(counts["dropout"]),
        }
    return row


# A zoo or entry model's row: GPUMemNet's common columns, and its layers counted by module type.
ZOO_COLUMNS = (
    "Filename", "Depth", "Activations-Params", "Activation Function", "Total Activations",
    "Total Parameters", "Batch Size", "Conv2d Count", "BatchNorm2d Count", "Linear Count",
    "Dropout Count",
)  # fmt: skip


def zoo_cells(feats: dict[str, Any]) -> dict[str, str]:
    """A zoo or entry model's cells (`Features.to_json()`): its own layers, as GPUMemNet's
    Transformer rows list theirs. GPUMemNet's MLP/CNN columns would count only the layers its
    generators build (a ResNet read as an MLP had Depth 1 and no batch norms)."""
    seq = [tuple(s) for s in feats.get("sequence", [])]
    counts = feats.get("layer_counts", {})
    return {
        "Depth": str(feats.get("depth", "")),
        "Activations-Params": repr(seq),
        "Activation Function": feats.get("activation_function") or "",
        "Total Activations": str(feats["total_activations"]),
        "Total Parameters": str(feats["total_parameters"]),
        "Batch Size": str(feats["batch_size"]),
        "Conv2d Count": str(counts.get("Conv2d", 0)),
        "BatchNorm2d Count": str(counts.get("BatchNorm2d", 0)),
        "Linear Count": str(counts.get("Linear", 0)),
        "Dropout Count": str(counts.get("Dropout", 0)),
    }


def to_csv(rows: list[dict[str, str]], family: str) -> str:
    """GPUMemNet's columns of `family` (mlp, cnn), else a zoo model's (`ZOO_COLUMNS`)."""
    columns = {"cnn": CNN_COLUMNS, "mlp": MLP_COLUMNS}.get(family, ZOO_COLUMNS)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
