"""One rank of a sharded job, traced with PyTorch's own FSDP2 under a fake process group.

`fake_world(N)` starts PyTorch's `"fake"` backend
(`torch/testing/_internal/distributed/fake_pg.py`): collectives return at once with outputs of
the right shape, so one process runs rank 0's program as N ranks would, with no GPU and no
network. `shard(model, "fsdp2", mesh)` applies
`fully_shard` as FSDP2 recipes do (torchtitan, transformers' FSDP2 plugin): one unit per
repeated block (a Hugging Face model's `_no_split_modules`, else the tracer's blocks), then the
root. Everything else (the unit's all-gather buffers, the reduce-scatter, prefetching one unit
ahead, resharding after forward, sharded optimizer state) is FSDP2's own code.

Three things FSDP2 cannot do on the tracer's device as shipped are bridged here (each in
`_bridges`, restored on exit):
- it refuses meta parameters as not yet materialised (`_validate_no_meta_params`); on the
  tracer's device meta is the materialised device;
- it takes its device from the mesh, and a device mesh needs a real backend device type
  ("cpu" here); the param groups' device is set to meta after sharding, so the unsharded
  parameters and all-gather buffers are allocated where the trace records them;
- its stream handle comes from the device type; it is `torch.cuda`, which the tracer answers
  (`fakecuda.CudaShim`), so FSDP's all-gather and reduce-scatter streams are streams of the
  trace, and memsim keeps a pool per stream and honours `record_stream`.

Ranks: rank 0 is traced. FSDP2 shards dim 0 of each parameter in chunks of ceil(dim0 / N) rows
(`torch.chunk`), so rank 0 holds the largest shard of every parameter; its peak bounds every
rank's. The output says so.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from memtrace_trainer.errors import UserError

STRATEGIES = ("fsdp2",)
# Strategies of issue 16 not built yet, refused by name rather than run as something else.
PLANNED = ("ddp", "fsdp1", "fsdp1-grad-op", "fsdp1-no-shard", "zero1", "zero2", "zero3")
META = torch.device("meta")


def check(strategy: str | None, world_size: int | None) -> None:
    if strategy is None and world_size is None:
        return
    if strategy is None:
        raise UserError("--world-size needs --strategy (fsdp2)")
    if strategy in PLANNED:
        raise UserError(
            f"--strategy {strategy}: not built yet (only fsdp2 is traced; DDP, FSDP1 and ZeRO are "
            "open in issue 16)"
        )
    if strategy not in STRATEGIES:
        raise UserError(f"--strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    if world_size is None or world_size < 1:
        raise UserError(f"--world-size {world_size}: expected a positive number of ranks")


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[Any]:
    """A fake process group of `world_size` ranks (this process is `rank`) and its 1-D mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise UserError("a process group is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        with _bridges():
            yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _bridges() -> Iterator[None]:
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param_group

    saved: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, name: str, value: Any) -> None:
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    patch(_fsdp_param_group.FSDPParamGroup, "_validate_no_meta_params", lambda self: None)
    for mod in (_fsdp_param_group, _fsdp_collectives):
        patch(mod, "_get_device_handle", lambda device_type: torch.cuda)
    try:
        with warnings.catch_warnings():
            # FSDP2 reads `.grad` of its unsharded (non-leaf) views; PyTorch warns on each read.
            warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not")
            yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def units(model: nn.Module) -> list[nn.Module]:
    """The modules that become FSDP units: a transformers model's `_no_split_modules` (its
    decoder layers), else the tracer's repeated blocks."""
    from memtrace_trainer.symtrace.checkpointing import _blocks, _hf_model

    hf = _hf_model(model)
    names = set(getattr(hf, "_no_split_modules", None) or []) if hf is not None else set()
    found = [m for m in model.modules() if type(m).__name__ in names]
    return found or _blocks(model)


def shard(model: nn.Module, strategy: str, mesh: Any) -> dict[str, Any]:
    """`fully_shard` per unit and on the root; returns what the output reports."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard._fully_shard import FSDPModule

    world = mesh.size()
    for p in model.parameters():
        if p.dim() == 0 and world > 1:
            raise UserError(
                f"--world-size {world}: FSDP2 shards dim 0 of each parameter; this model has "
                "a 0-dim parameter it cannot shard"
            )
    blocks = units(model)
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            group = m._get_fsdp_state()._fsdp_param_group
            if group is not None:
                group.device = META
                group._all_gather_output = torch.empty(0, device=META)
                for fsdp_param in group.fsdp_params:
                    fsdp_param.device = META
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    return {
        "strategy": strategy,
        "world_size": world,
        "rank": 0,
        "units": len(blocks) + 1,
        "parameter_bytes": full,
        "local_parameter_bytes": local,
        "ranks": "rank 0 traced: FSDP2 gives rank 0 the largest dim-0 chunk of every parameter, "
        "so its peak bounds every rank's",
    }
