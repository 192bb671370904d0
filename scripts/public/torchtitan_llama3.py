"""torchtitan's Llama 3 training step (torchtitan 9dec370, December 2024), written as a user's own
`--step` for memtrace, to compare with the per-GPU memory torchtitan published for it
(`benchmarks/llama3_h100_202412_torchtitan.md`, Tables 1 and 3: Llama 3.1 8B, FSDP, local
batch 2, sequence 8192, selective op activation checkpointing, no torch.compile, no Float8).

What it takes from torchtitan, as that commit's `train.py` and `parallelize_llama.py` run it:
- fp32 parameters built on the meta device, then FSDP2 `fully_shard` per transformer block
  and on the root, with `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`; every
  block but the last reshards after forward; `to_empty` materialises the shards;
- selective op checkpointing per block, applied before FSDP: the outputs of mm (all but every
  second one), SDPA and max are saved, the rest recomputed;
- `loss = cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))`, then `del pred`
  before `loss.backward()`;
- `clip_grad_norm_(max_norm=1.0, foreach=True)`, AdamW (foreach), `zero_grad()` at the start
  of the step.

What differs: the model is transformers' `LlamaForCausalLM` with SDPA attention (the same
shapes and the same Llama 3.1 8B config; torchtitan's own module computes RoPE with complex
numbers), and the tokens are random ids.

Settings, from the environment (the step takes only the device):
MEMTRACE_TT_CONFIG (a config.json) or MEMTRACE_TT_MODEL (an id of memtrace's registry; default
meta-llama/Llama-3.1-8B),
MEMTRACE_TT_BATCH (default 2), MEMTRACE_TT_SEQ (default 8192), MEMTRACE_TT_AC (selective, the
default: op-level; full: every block recomputed, torchtitan's `mode = "full"`; none).

    python -m memtrace_trainer symtrace --step torchtitan_llama3:step --world-size 8 \
        --steps 2 --out tt.jsonl       # with scripts/public on PYTHONPATH
"""

from __future__ import annotations

import os
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

SAVE = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.max.default,
}


def _policy_context() -> Any:
    meta: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            meta[f"{mode}_mm_count"] += 1
        second_mm = func == torch.ops.aten.mm.default and meta[f"{mode}_mm_count"] % 2 == 0
        save = func in SAVE and not second_mm
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


AC_MODES = ("selective", "full", "none")


def _ac_mode() -> str:
    mode = os.environ.get("MEMTRACE_TT_AC", "selective")
    if mode not in AC_MODES:
        raise ValueError(f"MEMTRACE_TT_AC={mode!r}: expected one of {', '.join(AC_MODES)}")
    return mode


class _Checkpointed(torch.nn.Module):
    """A block run under non-reentrant selective checkpointing (torchtitan's
    `ptd_checkpoint_wrapper(..., context_fn=..., preserve_rng_state=False)`), or full
    checkpointing with MEMTRACE_TT_AC=full."""

    def __init__(self, block: torch.nn.Module, full: bool) -> None:
        super().__init__()
        self.block, self.full = block, full

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        run = partial(self.block, **kwargs)
        if self.full:
            return checkpoint(run, *args, use_reentrant=False, preserve_rng_state=False)
        return checkpoint(run, *args, use_reentrant=False, context_fn=_policy_context,
                          preserve_rng_state=False)  # fmt: skip


def _config() -> Any:
    """The transformers config: MEMTRACE_TT_CONFIG (a config.json), else MEMTRACE_TT_MODEL's
    (an id of memtrace's registry, default Llama 3.1 8B)."""
    from memtrace_trainer.models.hf import read_config, resolve, to_config

    given = os.environ.get("MEMTRACE_TT_CONFIG")
    spec = (
        read_config(Path(given))
        if given
        else resolve(os.environ.get("MEMTRACE_TT_MODEL", "meta-llama/Llama-3.1-8B"))
    )
    return to_config(spec)


def step(device: torch.device) -> Any:
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    batch = int(os.environ.get("MEMTRACE_TT_BATCH", "2"))
    seq = int(os.environ.get("MEMTRACE_TT_SEQ", "8192"))
    ac = _ac_mode()
    config = _config()
    config._attn_implementation = "sdpa"

    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    # torchtitan builds on the meta device, shards, then materialises the shards on the GPU.
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    layers = model.model.layers
    if ac != "none":
        for i, block in enumerate(layers):
            layers[i] = _Checkpointed(block, full=ac == "full")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for i, block in enumerate(layers):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(layers) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    model.to_empty(device=device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, weight_decay=0.1, foreach=True)

    def train_step() -> None:
        opt.zero_grad()
        ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        labels = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        pred = model(input_ids=ids, use_cache=False).logits  # no KV cache, as torchtitan's model
        loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        del pred
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0, foreach=True)
        opt.step()

    return train_step
