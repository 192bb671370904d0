"""Optimizers by name, for the tracer's loop and real runs alike.

PyTorch's and transformers' optimizers run as they are: their state is allocated where their own
code allocates it (AdamW's `exp_avg`/`exp_avg_sq` in the parameter's dtype, so 2+2 bytes per
parameter in pure bf16; foreach/fused chosen by `_default_to_fused_or_foreach`). bitsandbytes'
8-bit and paged optimizers need its CUDA kernels, so their device memory is emulated
(`Emulated8bit`, bitsandbytes 0.4x/0.50 `optim/optimizer.py` `Optimizer2State.init_state`):

- a parameter of at least `min_8bit_size` (4096) elements gets two uint8 states like it, one
  fp32 absmax per block of 256 per state, and the two 256-entry fp32 quantization maps, shared;
- a smaller one gets two fp32 states like it;
- the update is one fused kernel per parameter: no temporaries;
- paged variants put every state of at least 1e5 elements in CUDA managed memory
  (`cudaMallocManaged`, outside PyTorch's allocator); the tracer does not allocate them and
  reports their bytes instead (`paged_bytes`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

OPTIMIZERS = (
    "adam",
    "adamw",
    "sgd",
    "sgd-momentum",
    "adagrad",
    "rmsprop",
    "adafactor",
    "adamw-8bit",
    "paged-adamw",
    "paged-adamw-8bit",
)
MIN_8BIT_SIZE = 4096
BLOCK = 256
PAGED_MIN = 100_000
# Only these run on a real GPU without bitsandbytes' kernels being emulated.
EMULATED = ("adamw-8bit", "paged-adamw", "paged-adamw-8bit")


def _local_numel(p: torch.Tensor) -> int:
    """The elements this rank holds: a sharded (DTensor) parameter's local shard. Under FSDP2 the
    emulation keeps each rank's state of its shard, and decides bitsandbytes' thresholds by its
    size, as a bitsandbytes that ran on DTensors would (a warning says none is known to)."""
    to_local = getattr(p, "to_local", None)
    return int(to_local().numel()) if callable(to_local) else p.numel()


class Emulated8bit(torch.optim.Optimizer):
    """bitsandbytes' AdamW8bit / PagedAdamW / PagedAdamW8bit as the allocator sees them."""

    def __init__(self, params: Any, lr: float, bits: int, paged: bool) -> None:
        super().__init__(params, {"lr": lr})
        self.bits, self.paged = bits, paged
        self.paged_bytes = 0
        self._qmaps: tuple[torch.Tensor, torch.Tensor] | None = None

    def _buffer(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        n = _local_numel(p)
        if self.paged and n >= PAGED_MIN:
            self.paged_bytes += n * torch.empty((), dtype=dtype).element_size()
            return None
        return torch.zeros_like(p, dtype=dtype)

    def _init(self, p: torch.Tensor) -> dict[str, Any]:
        n = _local_numel(p)
        eight = self.bits == 8 and n >= MIN_8BIT_SIZE
        dtype = torch.uint8 if eight else torch.float32
        state: dict[str, Any] = {
            "step": 0,
            "state1": self._buffer(p, dtype),
            "state2": self._buffer(p, dtype),
        }
        if eight:
            if self._qmaps is None:
                self._qmaps = (
                    torch.zeros(256, device=p.device),
                    torch.zeros(256, device=p.device),
                )
            state["qmap1"], state["qmap2"] = self._qmaps
            blocks = -(-n // BLOCK)
            state["absmax1"] = torch.zeros(blocks, device=p.device)
            state["absmax2"] = torch.zeros(blocks, device=p.device)
        return state

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not self.state[p]:
                    self.state[p] = self._init(p)
                self.state[p]["step"] += 1
                # The fused update writes the parameter in place and reads nothing new.
                p.add_(p.grad, alpha=-group["lr"])


def make_optimizer(name: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-2)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=1e-2)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=1e-2)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        # transformers' defaults: relative step, parameter scaling, no first moment.
        return Adafactor(params)  # type: ignore[no-any-return]
    if name == "adamw-8bit":
        return Emulated8bit(params, 1e-4, 8, paged=False)
    if name == "paged-adamw":
        return Emulated8bit(params, 1e-4, 32, paged=True)
    if name == "paged-adamw-8bit":
        return Emulated8bit(params, 1e-4, 8, paged=True)
    raise ValueError(f"unknown optimizer {name!r}")


def paged_bytes(optimizer: Any) -> int:
    return int(getattr(optimizer, "paged_bytes", 0))
