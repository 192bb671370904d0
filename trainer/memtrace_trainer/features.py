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
                layer.name: {
                    "type": layer.type,
                    "activations": layer.activations,
                    "parameters": layer.parameters,
                }
                for layer in self.layers
            },
            "sequence": [[la.type, la.activations, la.parameters] for la in self.layers],
            "gpumemnet_sequence": [list(s) for s in self.gpumemnet_sequence],
        }


def _numel(out: Any) -> int:
    if isinstance(out, torch.Tensor):
        return out.numel()
    if isinstance(out, tuple | list):
        return sum(_numel(o) for o in out)
    if isinstance(out, dict):
        return sum(_numel(o) for o in out.values())
    return 0


def gpumemnet_name(module: nn.Module, family: str) -> str | None:
    """GPUMemNet's spelling of a layer, or None for modules its datasets do not list."""
    kind = type(module)
    if kind is nn.Softmax:
        return "Softmax" if family == "mlp" else "softmax"
    if kind in (nn.Identity, nn.Sigmoid):
        # GPUMemNet's CNN summary lists neither the shortcut Identity nor a Sigmoid head.
        return kind.__name__ if family == "mlp" else None
    if kind in _GPUMEMNET_NAMES:
        return _GPUMEMNET_NAMES[kind]
    if module.__class__.__module__.startswith("torch.nn.modules.activation"):
        return kind.__name__
    return None


def extract(workload: Workload, family: str = "") -> Features:
    """Run one forward pass on meta with hooks; the workload must already live on meta."""
    model = workload.model
    batch = workload.batch_size
    records: list[tuple[nn.Module, Layer]] = []
    names = {m: n for n, m in model.named_modules()}

    def hook(module: nn.Module, _inputs: Any, output: Any) -> None:
        params = sum(parameter_count(p) for p in module.parameters(recurse=False))
        layer = Layer(names[module], type(module).__name__, _numel(output) // batch, params)
        records.append((module, layer))

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
    layers = [layer for _, layer in records]
    leaves = [(m, la) for m, la in records if not any(True for _ in m.children())]
    counts = collections.Counter(la.type for _, la in leaves)
    # An MLP built with act:identity has Identity modules as its activation (GPUMemNet lists them).
    acts = [
        la.type for m, la in leaves if gpumemnet_name(m, family) == la.type and la.type != "Softmax"
    ]
    sequence = []
    for m, la in leaves:
        name = gpumemnet_name(m, family)
        if name is not None:
            # GPUMemNet's summary gives PReLU no parameters; mirror it so our rows line up.
            sequence.append((name, la.activations, 0 if isinstance(m, nn.PReLU) else la.parameters))
    return Features(
        total_parameters=sum(parameter_count(p) for p in model.parameters()),
        total_activations=sum(la.activations for _, la in leaves),
        layers=layers,
        depth=sum(1 for _, la in leaves if la.parameters > 0),
        layer_counts=dict(sorted(counts.items())),
        activation_function=collections.Counter(acts).most_common(1)[0][0] if acts else None,
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
