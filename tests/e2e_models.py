"""Tiny user entry points for the end-to-end tests (`--entry e2e_models:NAME`)."""

from __future__ import annotations

import torch
from torch import nn


def tiny_mlp(
    batch_size: int = 16,
) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor], object]:
    """A 3-layer MLP on 784 features, 10 classes: the shape of the Horus worked example."""
    model = nn.Sequential(
        nn.Linear(784, 300),
        nn.ReLU(),
        nn.Linear(300, 100),
        nn.ReLU(),
        nn.Linear(100, 10),
    )
    x = torch.randn(batch_size, 784)
    y = torch.randint(0, 10, (batch_size,))
    return model, (x, y), nn.functional.cross_entropy
