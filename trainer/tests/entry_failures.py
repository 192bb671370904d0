"""Entry points whose training step fails, for `run` and `launch` tests."""

import os

import torch
import torch.nn.functional as F
from torch import nn


class OutOfMemoryOnForward(nn.Module):
    """Raises what the CUDA caching allocator raises when a block cannot be found."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "meta":  # features are taken on meta, where nothing is allocated
            return self.lin(x)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def oom(batch_size: int = 2):
    return (
        OutOfMemoryOnForward(),
        (torch.randn(batch_size, 8), torch.zeros(batch_size).long()),
        F.cross_entropy,
    )


def broken(batch_size: int = 2):
    raise RuntimeError("injected failure: this entry point is broken on purpose")


class RaisesInForward(nn.Module):
    """A user's model with a bug in its forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).view(3, -1, 7)  # the user's bug: a shape that cannot hold the data


def bad_forward(batch_size: int = 2):
    return (
        RaisesInForward(),
        (torch.randn(batch_size, 8), torch.zeros(batch_size).long()),
        F.cross_entropy,
    )


def sized(batch_size: int = 2, seq_len: int = 4):
    """Takes seq_len: --seq-len reaches it."""
    model = nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(8 * seq_len, 2))
    ids = torch.randint(0, 50, (batch_size, seq_len))
    return model, (ids, torch.zeros(batch_size).long()), F.cross_entropy


def crash(batch_size: int = 2):
    """Kills its process as an OOM kill or a segfault would: no Python error, no failure file."""
    os._exit(137)


def long_features(batch_size: int = 2):
    """Integer features to a Linear: a GPU refuses them there, the meta device does not."""
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    return (
        model,
        (torch.ones(batch_size, 8).long(), torch.zeros(batch_size).long()),
        F.cross_entropy,
    )
