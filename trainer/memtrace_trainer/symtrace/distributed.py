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
  ("cpu" here, "cuda" in a user's own step); each param group's device is set to meta as the
  group is made, so the unsharded parameters and all-gather buffers are allocated where the
  trace records them;
- its stream handle comes from the device type; it is `torch.cuda`, which the tracer answers
  (`fakecuda.CudaShim`), so FSDP's all-gather and reduce-scatter streams are streams of the
  trace, and memsim keeps a pool per stream and honours `record_stream`.

Ranks: rank 0 is traced. FSDP2 shards dim 0 of each parameter in chunks of ceil(dim0 / N) rows
(`torch.chunk`), so rank 0 holds the largest shard of every parameter; its peak bounds every
rank's. The output says so.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from memtrace_trainer.dtypes import DTYPES, name_of
from memtrace_trainer.errors import UserError
from memtrace_trainer.notes import warn
from memtrace_trainer.symtrace.deepspeed import (
    STATE_SLOTS,
    bucket_said,
    check_reduce_bucket,
    deepspeed_low_precision,
    fp32_extra_per_parameter,
    reduce_bucket,
)

# What ZeRO-1 runs as: PyTorch's optimizer, over the model without DDP (`runs_as`).
ZERO1 = "ZeroRedundancyOptimizer"
STRATEGIES = (
    "fsdp2", "ddp", "fsdp1", "fsdp1-grad-op", "fsdp1-no-shard", "zero1", "zero2", "zero3",
)  # fmt: skip
# Strategies that run as another's PyTorch code, and what the output says of the difference.
EQUIVALENT = {
    "fsdp1": ("fsdp2", True, "FSDP1 FULL_SHARD emulated by FSDP2 with reshard_after_forward=True "
              "per block, the root's parameters kept gathered as FSDP1 keeps them "
              "(FSDP1 refuses a CPU mesh): per-parameter dim-0 shards instead of one padded "
              "FlatParameter per unit, the same gathered and resharded bytes per unit"),
    "fsdp1-grad-op": ("fsdp2", False, "FSDP1 SHARD_GRAD_OP emulated by FSDP2 with "
                      "reshard_after_forward=False: parameters stay gathered from forward to "
                      "backward"),
    "fsdp1-no-shard": ("ddp", None, "FSDP1 NO_SHARD emulated by DDP (replicated parameters, "
                       "all-reduced gradients)"),
    "zero1": (ZERO1, None, "DeepSpeed ZeRO-1 emulated by PyTorch's ZeroRedundancyOptimizer "
              "over the model itself (no DDP, whose buckets DeepSpeed does not have): optimizer "
              "state sharded by whole parameters, full gradients"),
    "zero2": ("fsdp2", False, "DeepSpeed ZeRO-2 emulated by FSDP2 with reshard_after_forward="
              "False: gradients and optimizer state sharded, parameters gathered through forward "
              "and backward; ZeRO-2 keeps them gathered in the optimizer step too"),
    "zero3": ("fsdp2", True, "DeepSpeed ZeRO-3 emulated by FSDP2 (parameters, gradients and "
              "optimizer state sharded, one unit per block); its prefetch buckets "
              "(stage3_prefetch_bucket_size 5e7 elements) are FSDP2's one-unit prefetch here"),
}  # fmt: skip
META = torch.device("meta")


def check(strategy: str | None, world_size: int | None, fsdp_mp: str | None = None,
          reduce_bucket_size: int | None = None, world_by: str | None = None) -> None:  # fmt: skip
    """The strategy flags, before tracing (the CLI, the Python API and `serve` alike): errors
    name the flag; a flag, or a world size, that changes nothing is warned about. `world_by`:
    the search that chose `world_size` (`min-world-size`'s probe), when the user gave no
    --world-size, so a warning names the probe, not a flag never given."""
    check_reduce_bucket(strategy, reduce_bucket_size)
    if fsdp_mp is not None:
        mp_policy(fsdp_mp)
        if strategy in ("zero2", "zero3"):
            # DeepSpeed's precision is its own config's: bf16/fp16 enabled keeps fp32 master
            # weights and state, which a policy over the emulating FSDP2 would drop.
            raise UserError(
                f"--fsdp-mp {fsdp_mp}: --strategy {strategy} is DeepSpeed's ZeRO, which has no "
                "FSDP2 MixedPrecisionPolicy; its bf16/fp16 mode (fp32 master weights and state) "
                "is --dtype bf16 or fp16"
            )
        if strategy is None or runs_as(strategy)[0] != "fsdp2":
            what = f"--strategy {strategy}" if strategy else "an unsharded job"
            raise UserError(
                f"--fsdp-mp {fsdp_mp}: {what} has no FSDP2 MixedPrecisionPolicy (it is for "
                "fsdp2, fsdp1 and fsdp1-grad-op); use --amp for autocast"
            )
    if strategy is None and world_size is None:
        return
    if strategy is None:
        raise UserError("--world-size needs --strategy (fsdp2)")
    if strategy not in STRATEGIES:
        raise UserError(f"--strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    check_world_size(world_size)
    if world_size == 1 and world_by is None:
        warn(f"--world-size 1: --strategy {strategy} at one rank shards and reduces nothing, "
             f"yet {_held_alone(strategy)} still held, so this estimate is above the same job's "
             "without --strategy; drop --strategy for one GPU")  # fmt: skip
    elif world_size == 1:
        warn(f"{world_by}, probing 1 rank: --strategy {strategy} at one rank shards and reduces "
             f"nothing, yet {_held_alone(strategy)} still held, so the need at 1 rank is above "
             "the same job's without --strategy (`estimate` without --strategy gives one "
             "GPU's)")  # fmt: skip


def _held_alone(strategy: str) -> str:
    """What a strategy holds at one rank that the unsharded job does not."""
    code = runs_as(strategy)[0]
    if code == "ddp":
        return "DDP's gradient buckets (as large as the parameters) are"
    if code == ZERO1:
        return "DeepSpeed's gradient reduce buffer is"
    if strategy in ("zero2", "zero3"):
        return ("FSDP2's all-gather and reduce-scatter buffers, and DeepSpeed's gradient reduce "
                "buffer, are")  # fmt: skip
    return "FSDP2's all-gather and reduce-scatter buffers are"


def check_with_step(strategy: str | None, optimizer: str, amp: str | None,
                    fsdp_mp: str | None) -> None:  # fmt: skip
    """What a strategy cannot run with, said before tracing and naming the flags: optimizers it
    refuses (each failed inside PyTorch before), and a 16-bit policy beside another 16-bit
    autocast (legal in PyTorch, refused as `--dtype` with another `--amp` is). bitsandbytes'
    optimizers under the FSDP2 family are warned about: not known to run on DTensors."""
    from memtrace_trainer.optim import EMULATED

    if strategy is None:
        return
    if strategy == "zero1" and optimizer in ("adafactor", *EMULATED):
        whose = "transformers'" if optimizer == "adafactor" else "bitsandbytes' (emulated)"
        raise UserError(
            f"--optimizer {optimizer} with --strategy zero1: ZeRO-1 runs as PyTorch's "
            f"ZeroRedundancyOptimizer, which wraps torch.optim optimizers only, and {optimizer} "
            f"is {whose}; use adam, adamw, sgd, adagrad or rmsprop"
        )
    if runs_as(strategy)[0] == "fsdp2" and optimizer == "adafactor":
        raise UserError(
            f"--optimizer adafactor with --strategy {strategy}: transformers' Adafactor keeps its "
            "factored state as plain tensors, and FSDP2's parameters are sharded DTensors, which "
            "its update cannot mix (PyTorch refuses it); use adamw, or --strategy ddp"
        )
    if runs_as(strategy)[0] == "fsdp2" and optimizer in EMULATED:
        from memtrace_trainer.notes import warn

        warn(f"--optimizer {optimizer} with --strategy {strategy}: bitsandbytes' optimizers are "
             "not known to run on FSDP2's sharded DTensor parameters; estimated as if each rank "
             "kept the state of its own shard")  # fmt: skip
    if fsdp_mp is not None and amp is not None:
        param, _ = mp_policy(fsdp_mp)
        if param != torch.float32 and param != DTYPES.get(amp):
            raise UserError(
                f"--fsdp-mp {fsdp_mp} with --amp {amp} is contradictory: FSDP2 casts the "
                f"parameters to {fsdp_mp.split(':')[0]} for compute, and autocast to {amp} would "
                "cast every matmul to another 16-bit type; give one precision"
            )


def mp_policy(text: str) -> tuple[torch.dtype, torch.dtype]:
    """ "PARAM[:REDUCE]" as (param_dtype, reduce_dtype); REDUCE defaults to PARAM, as FSDP2's
    reduce_dtype=None does."""
    parts = text.split(":")
    expected = ", ".join(DTYPES)
    if len(parts) > 2 or not all(p in DTYPES for p in parts):
        raise UserError(
            f"--fsdp-mp {text!r}: expected PARAM[:REDUCE] with dtypes among {expected} "
            "(e.g. bf16:fp32)"
        )
    param = DTYPES[parts[0]]
    return param, DTYPES[parts[-1]] if len(parts) == 2 else param


# The most ranks a job is traced for: the fake mesh and the sharded tensors grow with them
# (16384 ranks take about 30 s for a ResNet-18 on two cores; a million, half an hour).
MAX_WORLD = 1 << 16


def check_world_size(world_size: int | None) -> None:
    if world_size is None:
        raise UserError("--world-size is required with --strategy: the number of ranks")
    if world_size < 1:
        raise UserError(f"--world-size {world_size}: expected a positive number of ranks")
    if world_size > MAX_WORLD:
        raise UserError(f"--world-size {world_size}: expected at most {MAX_WORLD} ranks")


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[Any]:
    """A fake process group of `world_size` ranks (this process is `rank`) and its 1-D mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    check_world_size(world_size)
    if dist.is_initialized():
        raise UserError("a process group is already initialised in this process")
    # init_process_group installs its own excepthook (every later traceback prefixed
    # `[rank0]:`, once more per estimate); the caller's is put back.
    hook = sys.excepthook
    try:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    finally:
        sys.excepthook = hook
    destroy = dist.destroy_process_group
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
           "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29500"}  # fmt: skip
    saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with _bridges(world_size):
            yield init_device_mesh("cpu", (world_size,))
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        destroy()


@contextlib.contextmanager
def _bridges(world_size: int) -> Iterator[None]:
    import torch.distributed as dist
    import torch.nn.parallel.distributed as ddp_module
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param_group
    from torch.nn.parallel import DistributedDataParallel

    saved: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, name: str, value: Any) -> None:
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    group = _fsdp_param_group.FSDPParamGroup
    patch(group, "_validate_no_meta_params", lambda self: None)
    group_init = group.__init__

    def group_on_meta(self: Any, *args: Any, **kwargs: Any) -> None:
        # Whatever mesh the unit was sharded over ("cpu" here, "cuda" in a user's own step),
        # its unsharded parameters and all-gather buffers are allocated where the trace
        # records them.
        group_init(self, *args, **kwargs)
        self.device = META
        self._all_gather_output = torch.empty(0, device=META)
        for fsdp_param in self.fsdp_params:
            fsdp_param.device = META

    patch(group, "__init__", group_on_meta)
    # What an all-gather allocates (the unit's unsharded parameters, and the send buffer it
    # copies its shards into) holds parameters, whichever pass gathers them; the trace says so,
    # where it said "activation" in the forward (a breakdown then blamed the batch).
    for name in ("unshard", "wait_for_unshard"):
        patch(group, name, _as_parameters(getattr(group, name)))
    for mod in (_fsdp_param_group, _fsdp_collectives):
        patch(mod, "_get_device_handle", lambda device_type: torch.cuda)
    # DDP, wherever it is built (`wrap_ddp`, or the user's own step): see `wrap_ddp`.
    patch(ddp_module, "_verify_param_shape_across_processes", lambda *args, **kwargs: None)
    init = DistributedDataParallel.__init__

    def ddp_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        # With device_ids, DDP copies the inputs on a side stream of the accelerator (CUDA, as
        # the tracer answers it), not of the meta device; the copy runs on the current stream.
        self.use_side_stream_for_tensor_copies = False
        # No annotations on the hook: DDP checks that a `bucket` annotation is a GradBucket.
        self.register_comm_hook(None, lambda state, bucket: _done(bucket.buffer()))
        self.reducer = _NoRebuild(self.reducer)
        # DDP's C++ logger times iterations with a CUDA or CPU timer and warns on stderr for
        # any other device; it records statistics, not memory.
        self.logger = _Quiet()

    patch(DistributedDataParallel, "__init__", ddp_init)
    # A user's program starts its own process group ("nccl"): it gets this fake one, whose rank
    # and world size answer `get_rank()`/`get_world_size()`; its teardown is the tracer's.
    said: list[bool] = []

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if not said:
            said.append(True)
            warn(f"init_process_group() is answered by the tracer's fake process group: rank 0 "
                 f"of {world_size} (--world-size)")  # fmt: skip

    patch(dist, "init_process_group", init_process_group)
    patch(dist, "destroy_process_group", lambda *args, **kwargs: None)
    try:
        with warnings.catch_warnings():
            # FSDP2 reads `.grad` of its unsharded (non-leaf) views; PyTorch warns on each read.
            warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not")
            yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def _as_parameters(fn: Any) -> Any:
    """`fn` with the recorder's category "parameter" while it runs (no recorder: as it is)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from memtrace_trainer.symtrace.recorder import Recorder

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = next((m for m in _get_current_dispatch_mode_stack() if isinstance(m, Recorder)), None)
        if rec is None:
            return fn(self, *args, **kwargs)
        with rec.categorized("parameter"):
            return fn(self, *args, **kwargs)

    return run


def units(model: nn.Module) -> list[nn.Module]:
    """The modules that become FSDP units: a transformers model's `_no_split_modules` (its
    decoder layers), else the tracer's repeated blocks."""
    from memtrace_trainer.symtrace.checkpointing import _blocks, _hf_model

    hf = _hf_model(model)
    names = set(getattr(hf, "_no_split_modules", None) or []) if hf is not None else set()
    found = [m for m in model.modules() if type(m).__name__ in names]
    return found or _blocks(model)


def runs_as(strategy: str) -> tuple[str, bool | None, str | None]:
    """(the PyTorch code that runs, FSDP2's reshard_after_forward, the equivalence stated)."""
    if strategy in EQUIVALENT:
        return EQUIVALENT[strategy]
    return strategy, True if strategy == "fsdp2" else None, None


def replicates(strategy: str) -> bool:
    """Whether every rank holds the whole model state (DDP and what runs as it): more ranks
    never lower a rank's need."""
    return runs_as(strategy)[0] == "ddp"


def describe(strategy: str) -> dict[str, Any]:
    """What the output says of a strategy: the PyTorch code that runs, the equivalence stated,
    and why the traced rank 0 stands for every rank (or where it does not)."""
    code, _, note = runs_as(strategy)
    if strategy == "zero1":
        ranks = ("rank 0 traced; ZeroRedundancyOptimizer partitions whole parameters, so ranks "
                 "differ by up to one parameter's optimizer state (when another rank holds "
                 "more, its extra state is added and this line names it)")  # fmt: skip
    elif code == "ddp":
        ranks = "rank 0 traced; DDP ranks are replicas (the same parameters and buckets)"
    else:
        ranks = ("rank 0 traced; FSDP2 gives rank 0 the largest dim-0 chunk of every parameter, "
                 "so its peak bounds every rank's")  # fmt: skip
    return {"runs_as": code, "equivalence": note, "ranks": ranks}


def shard(
    model: nn.Module,
    strategy: str,
    mesh: Any,
    fsdp_mp: str | None = None,
    optimizer: str = "adam",
    reduce_bucket_size: int | None = None,
) -> dict[str, Any]:
    """Before the trace: `fully_shard` per unit and on the root for the FSDP2 family (DDP wraps
    inside the trace, `wrap_ddp`, so its buckets are recorded); returns what the output
    reports, with DeepSpeed's reduce buffer (`reduce_bucket`, allocated in the trace by the
    tracer's loop) for a ZeRO strategy."""
    from torch.distributed.fsdp import fully_shard

    world = mesh.size()
    code, reshard, _ = runs_as(strategy)
    info = {"strategy": strategy, "world_size": world, "rank": 0, **describe(strategy)}
    low = deepspeed_low_precision(model)
    bucket = reduce_bucket(strategy, model, reduce_bucket_size)  # before any fp32 master copy
    if bucket is not None:
        info["reduce_bucket"] = bucket
        info["equivalence"] = f"{info['equivalence']}; {bucket_said(bucket)}"
    if strategy == "zero1" and low is not None:
        name = name_of(low)
        slots = STATE_SLOTS.get(optimizer)
        if slots is None:
            warn(
                f"--strategy zero1 with {name} parameters: DeepSpeed's {name} mode keeps fp32 "
                f"master weights and fp32 optimizer state, and how many state tensors {optimizer} "
                "keeps per parameter is not known here: this rank's estimate leaves out the fp32 "
                "master weights and state beyond ZeroRedundancyOptimizer's 16-bit state"
            )
        else:
            info["equivalence"] = (
                f"{info['equivalence']}; DeepSpeed's {name} mode (fp32 master weights and fp32 "
                f"{optimizer} state) as ZeroRedundancyOptimizer's {name} state plus one buffer "
                f"of the rest, {fp32_extra_per_parameter(slots)} bytes per parameter of rank 0's "
                "partition, held from the optimizer's construction"
            )
    if code != "fsdp2":  # DDP, or ZeRO-1's optimizer: nothing sharded before the trace
        full = sum(p.numel() * p.element_size() for p in model.parameters())
        return {**info, "units": 1, "parameter_bytes": full, "local_parameter_bytes": full}
    for p in model.parameters():
        if p.dim() == 0 and world > 1:
            raise UserError(
                f"--world-size {world}: FSDP2 shards dim 0 of each parameter; this model has "
                "a 0-dim parameter it cannot shard"
            )
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp = MixedPrecisionPolicy()
    if strategy in ("zero2", "zero3") and low is not None:
        # DeepSpeed's bf16/fp16 mode keeps fp32 master weights and fp32 Adam moments beside
        # the 16-bit parameters and gradients: 2 + 2 + 12 bytes per parameter, partitioned.
        # FSDP2 over fp32 trainable parameters computing in 16 bits holds the same 16 (4 + 4 +
        # 8); left in 16 bits, the optimizer state was a third of DeepSpeed's.
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.float()
        name = name_of(low)
        mp = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=low)
        info["mp_policy"] = {"param_dtype": str(low), "reduce_dtype": str(low)}
        info["equivalence"] = (
            f"{info['equivalence']}; DeepSpeed's {name} mode (fp32 master weights and optimizer "
            f"state, {name} parameters and gradients) as fp32 trainable parameters under FSDP2's "
            f"MixedPrecisionPolicy({name}), the same bytes per parameter"
        )
    if fsdp_mp is not None:
        param_dtype, reduce_dtype = mp_policy(fsdp_mp)
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        trainable = {p.dtype for p in model.parameters() if p.requires_grad}
        if trainable == {param_dtype} and reduce_dtype == param_dtype:
            dtype = name_of(param_dtype)
            warn(
                f"--fsdp-mp {fsdp_mp}: the trainable parameters are {dtype} already, so the "
                "policy casts nothing and has no effect ("
                + (
                    "give a 16-bit PARAM, e.g. bf16:fp32, for mixed precision)"
                    if param_dtype == torch.float32
                    else "give fp32 parameters, the default --dtype, for mixed precision)"
                )
            )
        info["mp_policy"] = {"param_dtype": str(param_dtype), "reduce_dtype": str(reduce_dtype)}
    _qlora_storage(model, strategy, info)
    # DeepSpeed's ZeRO-1 and -2 partition the optimizer's parameters only: frozen ones (a LoRA
    # or QLoRA base) stay whole on every rank, as the module holds them. Sharded, each rank
    # held the gathered base and a 1/N shard of it beside (7.8 GiB more for Llama-3-8B at 2).
    # ZeRO-3 partitions every parameter.
    frozen = {p for p in model.parameters() if not p.requires_grad}
    ignored = frozen if strategy == "zero2" and frozen else None
    if ignored:
        info["equivalence"] = (
            f"{info['equivalence']}; the frozen parameters are not sharded (DeepSpeed partitions "
            "the optimizer's parameters only): every rank holds them whole"
        )
    blocks = units(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=bool(reshard), mp_policy=mp,
                    ignored_params=ignored)  # fmt: skip
    # The root's parameters stay gathered after forward in FSDP2 (its default, None) and in
    # FSDP1 FULL_SHARD (it never frees the root's in its post-forward): backward needs them
    # first. DeepSpeed's ZeRO-3 releases every partitioned parameter after use.
    root = None if strategy in ("fsdp2", "fsdp1") else bool(reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=root, mp_policy=mp, ignored_params=ignored)
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    # An ignored (frozen) parameter is a plain tensor, whole on this rank.
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size()
                for p in model.parameters())  # fmt: skip
    return {
        **info,
        "units": len(blocks) + 1,
        "parameter_bytes": full,
        "local_parameter_bytes": local,
    }


def _qlora_storage(model: nn.Module, strategy: str, info: dict[str, Any]) -> None:
    """QLoRA under a sharding strategy as FSDP-QLoRA runs it: FSDP shards a 4-bit weight only
    when bitsandbytes stores it in the model's 16-bit dtype (`bnb_4bit_quant_storage=bf16`),
    so the trace does so, and the output says it."""
    from memtrace_trainer.models.qlora import store_for_fsdp

    if not store_for_fsdp(model):
        return
    info["quant_storage"] = "bf16"
    said = (f"--qlora with --strategy {strategy}: the 4-bit weights stored as "
            "bnb_4bit_quant_storage=bf16, which FSDP needs to shard them (the same bytes as "
            "uint8), sharded with the rest; their quantization statistics stay whole on "
            "every rank")  # fmt: skip
    info["equivalence"] = f"{info['equivalence']}; {said}" if info.get("equivalence") else said


def wrap_ddp(model: nn.Module) -> nn.Module:
    """`DistributedDataParallel` with its defaults (bucket_cap_mb 25, a smaller first bucket,
    gradient_as_bucket_view=False: each gradient is copied into its flat bucket), built inside
    the trace so the buckets are recorded. Bridged, as the fake process group needs:
    - the shape check across ranks (`_verify_param_shape_across_processes`) reads values: the
      ranks are one program, so it is skipped;
    - the all-reduce is a comm hook returning the bucket itself, as NCCL's all-reduce works in
      place in it (the fake group's future carries no tensor);
    - the bucket rebuild after the first iteration reads the recorded gradient order back from
      the device; it is not run, so buckets keep their construction order (the same bytes; the
      rebuild's brief overlap of old and new buckets at the second step is not modelled)."""
    from torch.nn.parallel import DistributedDataParallel

    # The bridges are in `_bridges`, around any DDP built while the fake world exists.
    return DistributedDataParallel(model)


def _done(value: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(value)
    return future


class _Quiet:
    """DDP's logger, answering every call with nothing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class _NoRebuild:
    """DDP's reducer with `_rebuild_buckets` answering "nothing rebuilt"."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        return False
