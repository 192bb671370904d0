"""Entry points whose training step fails, for `run` and `launch` tests."""

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
