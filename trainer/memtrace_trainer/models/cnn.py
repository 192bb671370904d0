"""CNN family, laid out exactly as GPUMemNet's generator lays it out (without optional pooling)."""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from memtrace_trainer.models.config import ACTIVATIONS, ModelConfig, activation, field

ARCHITECTURES = ("pyramid", "uniform", "bottleneck", "gradual", "hourglass", "residual", "dense")
MAX_FILTERS = 2048
DENSE_GROWTH = 32
DENSE_LAYERS = 4


def conv_block(
    cin: int, cout: int, cfg: CNNConfig, stride: int = 1, kernel: int = 3, act: str | None = None
) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2)]
    if cfg.batchnorm:
        layers.append(nn.BatchNorm2d(cout))
    layers.append(activation(act or cfg.activation))
    if cfg.dropout > 0 and act is None:
        layers.append(nn.Dropout(cfg.dropout))
    return nn.Sequential(*layers)


class Residual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, cfg: CNNConfig) -> None:
        super().__init__()
        self.conv1 = conv_block(cin, cout, cfg, stride)
        self.conv2 = conv_block(cout, cout, cfg)
        self.shortcut: nn.Module = nn.Identity()
        if cin != cout or stride != 1:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride),
                nn.BatchNorm2d(cout) if cfg.batchnorm else nn.Identity(),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = self.shortcut(x)
        return self.conv2(self.conv1(x)) + residual


class Dense(nn.Module):
    def __init__(self, cin: int, cfg: CNNConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            conv_block(cin + i * DENSE_GROWTH, DENSE_GROWTH, cfg) for i in range(DENSE_LAYERS)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        return torch.cat(features, 1)


class Transition(nn.Module):
    def __init__(self, cin: int, cfg: CNNConfig) -> None:
        super().__init__()
        # GPUMemNet's transition keeps the default ReLU and never drops out.
        self.conv = conv_block(cin, cin // 2, cfg, kernel=1, act="relu")
        self.pool = nn.AvgPool2d(2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return self.pool(x) if x.size(2) > 1 and x.size(3) > 1 else x


class CNN(nn.Module):
    def __init__(self, blocks: list[nn.Module], channels: int, classes: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(channels, classes)
        self.head: nn.Module = nn.Softmax(dim=1) if classes > 1 else nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(self.fc(torch.flatten(self.pool(x), 1)))


@dataclasses.dataclass(frozen=True)
class CNNConfig(ModelConfig):
    """GPUMemNet's CNN. `dense_interval` is the transition spacing of `dense` networks, a random
    draw in the original generator (`ceil(depth / poolings)` or 5), so it is explicit here."""

    family = "cnn"
    input_channels: int = field(least=1)
    num_classes: int = field(least=1)
    depth: int = field(least=1)
    architecture: str = field(choices=ARCHITECTURES)
    base_filters: int = field(least=1, most=MAX_FILTERS)
    input_size: int = field(least=2)
    activation: str = field("relu", choices=tuple(ACTIVATIONS))
    dropout: float = field(0.0, least=0, below=1)
    batchnorm: bool = False
    dense_interval: int | None = field(None, least=1)

    def constraints(self) -> list[str]:
        if self.architecture == "dense" and self.dense_interval is None:
            return ["dense needs dense_interval (the original generator drew it at random)"]
        return []

    def dense_interval_choices(self) -> tuple[int, int]:
        poolings = max(1, int(math.log2(self.input_size // 7))) if self.input_size >= 7 else 1
        return (max(1, math.ceil(self.depth / poolings)), 5)

    def _plain_channels(self) -> list[int]:
        base, depth, arch = self.base_filters, self.depth, self.architecture
        out = []
        contracting = depth // 2
        expanding = depth - contracting
        for i in range(depth):
            if arch == "pyramid":
                g = (MAX_FILTERS / base) ** (1 / depth)
                c = min(int(base * (g**i)), MAX_FILTERS)
            elif arch == "bottleneck":
                g = 2 if depth <= 2 else (MAX_FILTERS / base) ** (1 / (depth - 1))
                c = base * 2 if i == 0 else min(int(base * (g ** (i - 1))), MAX_FILTERS)
            elif arch == "gradual":
                g = (MAX_FILTERS / base) ** (1 / (2 * depth))
                c = min(int(base * (g**i)), MAX_FILTERS)
            elif arch == "hourglass":
                if i < contracting:
                    g = (MAX_FILTERS / base) ** (1 / contracting)
                    c = min(int(base * (g**i)), MAX_FILTERS)
                else:
                    s = (MAX_FILTERS / base) ** (1 / expanding)
                    c = max(int(base * (s ** (depth - i - 1))), base)
            else:
                c = base
            out.append(c)
        return out

    def _build(self) -> nn.Module:
        blocks: list[nn.Module] = []
        cin = self.input_channels
        size = self.input_size
        if self.architecture == "residual":
            g = (MAX_FILTERS / self.base_filters) ** (1 / self.depth)
            for i in range(self.depth // 2):
                cout = min(int(self.base_filters * (g**i)), MAX_FILTERS)
                stride = 2 if i % 2 == 1 and size > 7 else 1
                blocks.append(Residual(cin, cout, stride, self))
                cin = cout
                if stride == 2:
                    size //= 2
                if size <= 7:
                    break
        elif self.architecture == "dense":
            assert self.dense_interval is not None
            count = self.depth // 4
            for i in range(count):
                blocks.append(Dense(cin, self))
                cin += DENSE_GROWTH * DENSE_LAYERS
                if i % self.dense_interval == 0 and i != count - 1:
                    blocks.append(Transition(cin, self))
                    cin //= 2
        else:
            for cout in self._plain_channels():
                blocks.append(conv_block(cin, cout, self))
                cin = cout
        return CNN(blocks, cin, self.num_classes)

    def default_input_shape(self) -> tuple[int, ...]:
        return (self.input_channels, self.input_size, self.input_size)

    def classes(self) -> int:
        return self.num_classes
