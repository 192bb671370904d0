"""MLP family, laid out exactly as GPUMemNet's generator lays it out."""

from __future__ import annotations

import dataclasses

from torch import nn

from memtrace_trainer.models.config import ACTIVATIONS, ModelConfig, activation, field

ARCHITECTURES = ("pyramid", "uniform", "bottleneck", "gradual")


@dataclasses.dataclass(frozen=True)
class MLPConfig(ModelConfig):
    """`depth` hidden layers shaped by `architecture`, then a Linear to `output_size`.

    `head` is what follows the last Linear: GPUMemNet's first sweep had none, its second a Softmax
    (Sigmoid for a single output).
    """

    family = "mlp"
    input_size: int = field(least=1)
    output_size: int = field(least=1)
    depth: int = field(least=1)
    architecture: str = field("pyramid", choices=ARCHITECTURES)
    activation: str = field("relu", choices=tuple(ACTIVATIONS))
    dropout: float = field(0.0, least=0, below=1)
    batchnorm: bool = False
    head: bool = True

    def constraints(self) -> list[str]:
        if self.architecture == "gradual" and self.input_size < self.output_size:
            return ["gradual needs input_size >= output_size (it narrows towards the output)"]
        return []

    def hidden_widths(self) -> list[int]:
        widths = []
        width = self.input_size
        if self.architecture in ("pyramid", "bottleneck"):
            for _ in range(self.depth):
                width = max(int(width * 0.5), self.output_size)
                widths.append(width)
            if self.architecture == "bottleneck":
                widths.append(max(int(width * 0.5), self.output_size))
        elif self.architecture == "uniform":
            widths = [width] * self.depth
        else:
            step = (self.input_size - self.output_size) // self.depth
            for _ in range(self.depth):
                width = max(width - step, self.output_size)
                widths.append(width)
        return widths

    def _build(self) -> nn.Module:
        layers: list[nn.Module] = []
        width = self.input_size
        for out in self.hidden_widths():
            layers.append(nn.Linear(width, out))
            if self.batchnorm:
                layers.append(nn.BatchNorm1d(out))
            layers.append(activation(self.activation))
            if self.dropout > 0:
                layers.append(nn.Dropout(self.dropout))
            width = out
        layers.append(nn.Linear(width, self.output_size))
        if self.head:
            layers.append(nn.Softmax(dim=1) if self.output_size > 1 else nn.Sigmoid())
        return nn.Sequential(*layers)

    def default_input_shape(self) -> tuple[int, ...]:
        return (self.input_size,)

    def classes(self) -> int:
        return self.output_size
