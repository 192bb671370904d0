"""A user entry point for `--entry`: (model, (inputs, target), loss_fn)."""

import torch
import torch.nn.functional as F
from torch import nn


def make(batch_size: int = 4):
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    x = torch.randn(batch_size, 32)
    y = torch.randint(0, 10, (batch_size,))
    return model, (x, y), F.cross_entropy


def linear_sum(batch_size: int = 2):
    """Small enough to count by hand: Linear(8, 4, bias=False), loss = output.sum()."""
    model = nn.Linear(8, 4, bias=False)
    return model, (torch.randn(batch_size, 8), torch.zeros(batch_size)), lambda out, _y: out.sum()


def fixed_batch():
    """An entry of a fixed batch of 4: no `batch_size` (nor `seq_len`) parameter."""
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    return model, (torch.randn(4, 32), torch.randint(0, 10, (4,))), F.cross_entropy


def batch_norm(batch_size: int = 8):
    """BatchNorm1d in training: PyTorch refuses a batch of one sample."""
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
    return (
        model,
        (torch.randn(batch_size, 16), torch.randint(0, 10, (batch_size,))),
        F.cross_entropy,
    )


def own_batch_seq(seq_len: int = 16):
    """A token model of a fixed batch of 3 that takes `seq_len` but no `batch_size`."""
    model = nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.LazyLinear(2))
    ids = torch.randint(0, 50, (3, seq_len))
    return model, (ids, torch.randint(0, 2, (3,))), F.cross_entropy
