"""A user entry point for `--entry`: (model, (inputs, target), loss_fn)."""

import torch
import torch.nn.functional as F
from torch import nn


def make(batch_size: int = 4):
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    x = torch.randn(batch_size, 32)
    y = torch.randint(0, 10, (batch_size,))
    return model, (x, y), F.cross_entropy
