"""Measure NCCL's device memory outside PyTorch's allocator (issue 16): the profile terms
`outside_allocator.nccl_communicator_mib` and `nccl_per_peer_mib`.

Each rank records the device's used memory (`cudaMemGetInfo`) minus `torch.cuda.memory_reserved()`
before `init_process_group("nccl")` and after it plus a first all-reduce (NCCL creates its
communicator lazily, at the first collective). With one GPU the job has one rank and no peers:
the difference is the communicator's own state. With two or more GPUs, two ranks run and each
has one peer: the difference minus the one-rank figure is the per-peer buffers.

    python3 scripts/gpu/nccl_measure.py [--out nccl.json]

Without CUDA it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

MIB = 1 << 20


def _outside() -> int:
    import torch

    free, total = torch.cuda.mem_get_info()
    return (total - free) - torch.cuda.memory_reserved()


def _rank(rank: int, world: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    torch.cuda.init()
    x = torch.ones(1 << 20, device="cuda")  # the CUDA context and the allocator are up
    torch.cuda.synchronize()
    before = _outside()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    after = _outside()
    dist.destroy_process_group()
    Path(f"{out}.{world}.{rank}").write_text(json.dumps({"before": before, "after": after}))


def run(world: int, out: str) -> float:
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(world, 29500 + world, out), nprocs=world, join=True)
    deltas = []
    for r in range(world):
        d = json.loads(Path(f"{out}.{world}.{r}").read_text())
        deltas.append(d["after"] - d["before"])
    return max(deltas) / MIB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("nccl.json"))
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("nccl_measure: needs a CUDA GPU (none here)", file=sys.stderr)
        return 2
    tmp = str(a.out) + ".rank"
    one = run(1, tmp)
    result = {"gpus": torch.cuda.device_count(), "nccl_communicator_mib": one,
              "nccl_per_peer_mib": None, "method": __doc__.split("\n\n")[1]}  # fmt: skip
    if torch.cuda.device_count() >= 2:
        result["nccl_per_peer_mib"] = run(2, tmp) - one
    a.out.write_text(json.dumps(result, indent=1))
    print(f"nccl_measure: communicator {one:.1f} MiB; per peer "
          + ("not measured (one GPU)" if result["nccl_per_peer_mib"] is None
             else f"{result['nccl_per_peer_mib']:.1f} MiB"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
