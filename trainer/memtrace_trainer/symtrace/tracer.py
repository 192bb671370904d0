"""One symbolic trace: build the workload, run the step under the recorder, summarise, write."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from memtrace_trainer.dtypes import name_of
from memtrace_trainer.errors import ModelFailedError, UserError
from memtrace_trainer.features import CONTAINERS
from memtrace_trainer.markers import iteration_of
from memtrace_trainer.profile import Profile
from memtrace_trainer.symtrace import jsonl, step, threads
from memtrace_trainer.symtrace.emulation import LibrariesUsed, Workspaces
from memtrace_trainer.symtrace.recorder import Recorder
from memtrace_trainer.workload import Workload


@dataclass
class Summary:
    events: int
    allocs: int
    frees: int
    peak_live_bytes: int
    end_live_bytes: int
    # Every allocation's bytes summed per category over the trace (not a breakdown at the peak).
    allocated_bytes_by_category: dict[str, int]
    # Live-byte peaks of the first traced step and of steps 2 and on (None with one step).
    # Memory held when a step starts counts in it, so the first includes the setup's.
    first_step_peak_live_bytes: int | None = None
    steady_peak_live_bytes: int | None = None
    steps: int = 0
    # How a sharded job was traced (`distributed.shard`'s account: the rank, the code that ran,
    # the equivalence stated), None when it is not sharded.
    distributed: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(events: list[dict[str, Any]]) -> Summary:
    live = peak = allocs = frees = 0
    by_cat: dict[str, int] = {}
    per_step: list[int] = []
    for e in events:
        if e["kind"] == "alloc":
            allocs += 1
            live += e["size"]
            peak = max(peak, live)
            by_cat[e["category"]] = by_cat.get(e["category"], 0) + e["size"]
            if per_step:
                per_step[-1] = max(per_step[-1], live)
        elif e["kind"] == "free":
            frees += 1
            live -= e["size"]
        elif e["kind"] == "marker" and iteration_of(e["text"]) is not None:
            per_step.append(live)
    return Summary(
        len(events),
        allocs,
        frees,
        peak,
        live,
        dict(sorted(by_cat.items())),
        per_step[0] if per_step else None,
        max(per_step[1:]) if len(per_step) > 1 else None,
        len(per_step),
    )


def trace(
    workload: Workload, cfg: step.StepConfig, profile: Profile
) -> tuple[Recorder, dict[str, Any]]:
    libraries, rec = _recorder(profile, cfg.cuda_emulation)
    # The regime as the job was given: a strategy may run it otherwise (ZeRO in bf16 as fp32
    # shards under a bf16 policy), and the margin and baselines are the job's own regime's.
    regime = {"amp": precision_regime(cfg.amp, [workload.model]),
              "param_dtype": param_dtype(workload.model)}  # fmt: skip
    with threads.watched(workload.spec), LayersRun() as layers:
        emulated = step.run(workload, cfg, profile, rec)
    emulated["regime"] = regime
    emulated["layer_types"] = layers.types([workload.model])
    emulated["libraries"] = libraries.metadata()
    return rec, emulated


class LayersRun:
    """The class names of the modules whose forward ran while tracing, roots and containers
    aside, as `features` lists layers. memsim derives the job's family from them
    (`simulator/src/family.rs`, the one family rule), so a module that is built but never called
    does not change the family, as it does not in the runs the safety margins were fitted on."""

    def __init__(self) -> None:
        # (id, class name) of every module that ran: a module freed during the trace may hand
        # its id to another, which then still counts under its own name. No reference is kept,
        # so the trace's memory is not held alive by this record.
        self._ran: set[tuple[int, str]] = set()
        self._names: dict[type, str] = {}
        self._handle: Any = None

    def __enter__(self) -> LayersRun:
        self._handle = torch.nn.modules.module.register_module_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()

    def _name(self, module: torch.nn.Module) -> str:
        cls = type(module)
        name = self._names.get(cls)
        if name is None:
            name = self._names[cls] = _layer_type(cls)
        return name

    def _hook(self, module: torch.nn.Module, _args: Any) -> None:
        if not isinstance(module, CONTAINERS):
            self._ran.add((id(module), self._name(module)))

    def types(self, roots: list[torch.nn.Module]) -> str:
        """The header's `layer_types`: sorted, each once, comma-separated. A root counts only
        when nothing under it ran (a model that is one layer); "" when no module ran at all (a
        functional step), which memsim reads as an unknown family."""
        root = {(id(r), self._name(r)) for r in roots}
        names = {n for _, n in self._ran - root}
        if not names:
            names = {n for _, n in self._ran & root}
        return ",".join(sorted(names))


def _layer_type(cls: type) -> str:
    """A module class's layer name; FSDP2's `fully_shard` swaps a module's class for a subclass
    `FSDP<name>` of (FSDPModule, the class), and the layer is still the original class's.
    Nothing can be sharded before torch.distributed.fsdp is imported, so it is not imported
    here."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    shard = getattr(fsdp, "FSDPModule", None)
    if shard is not None and shard in cls.__bases__:
        cls = next((b for b in cls.__bases__ if b is not shard), cls)
    return cls.__name__


def param_dtype(*models: torch.nn.Module) -> str:
    """The dtype holding most of the floating-point parameter bytes of the models (fp32, bf16,
    fp16)."""
    sizes: dict[torch.dtype, int] = {}
    for model in models:
        for p in model.parameters():
            if p.is_floating_point():
                sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
    if not sizes:
        return "none"
    return name_of(max(sizes, key=lambda d: sizes[d]))


def precision_regime(autocast: str | None, models: list[torch.nn.Module]) -> str:
    """The header's `amp`, the precision regime that names the safety margin, for every way a
    job is traced: autocast's dtype, else the parameters' when they are bf16 or fp16, else
    fp32."""
    dtype = param_dtype(*models)
    return autocast or (dtype if dtype in ("bf16", "fp16") else "fp32")


def _traced_on(profile: Profile) -> dict[str, str]:
    """The header's keys of the machine a trace was made for, every trace's alike."""
    return {
        "profile": profile.name,
        "compute_capability": "{}.{}".format(*profile.compute_capability),
        "torch": torch.__version__,
        # ts_ns is the event's sequence number, not wall-clock time: the trace is deterministic.
        "clock": "logical",
    }


def _sdpa_backends(backends: dict[str, int] | None) -> dict[str, str]:
    """The header's `sdpa_backends` (`backend:calls`, by name), absent when none ran."""
    if not backends:
        return {}
    return {"sdpa_backends": ",".join(f"{k}:{v}" for k, v in sorted(backends.items()))}


def metadata(
    workload: Workload, cfg: step.StepConfig, profile: Profile, extra: dict[str, Any]
) -> dict[str, str]:
    meta = {
        "model": workload.spec,
        "layer_types": extra["layer_types"],
        "batch_size": str(workload.batch_size),
        "optimizer": cfg.optimizer,
        "iterations": str(cfg.iterations),
        **extra["regime"],
        "checkpointing": cfg.checkpointing or "none",
        "grad_accum": str(cfg.grad_accum),
        "cuda_emulation": str(cfg.cuda_emulation).lower(),
        **_traced_on(profile),
    }
    for key in ("task", "parameters", "trainable_parameters"):
        if key in workload.details:
            meta[key] = str(workload.details[key])
    # The input size, as the features name it: memest warns when features of another size are
    # read beside this trace.
    for key, value in workload.sizes.items():
        meta[key] = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    meta.update(extra["libraries"])
    if extra.get("distributed"):
        d = extra["distributed"]
        for key in ("strategy", "runs_as", "world_size", "rank", "units", "local_parameter_bytes"):
            meta[key] = str(d[key])
        if d.get("mp_policy"):
            mp = d["mp_policy"]
            meta["fsdp_mp"] = f"{mp['param_dtype']}:{mp['reduce_dtype']}"
    if extra.get("paged_optimizer_bytes"):
        meta["paged_optimizer_bytes"] = str(extra["paged_optimizer_bytes"])
    meta.update(_sdpa_backends(extra.get("sdpa_backends")))
    return meta


def trace_step(
    spec: Any,
    steps: int,
    profile: Profile,
    cuda_emulation: bool = True,
    batch_size: int | None = None,
    world_size: int | None = None,
) -> tuple[Recorder, dict[str, str]]:
    """A user's step function (`--step MOD:FN`, symtrace/userstep.py) traced `steps` times;
    returns the recorder and the trace's metadata."""
    from memtrace_trainer.symtrace.userstep import load_step, run_steps, step_label, step_name

    fn = load_step(spec, with_batch=batch_size is not None)
    make = fn if batch_size is None else (lambda device: fn(device, batch_size))
    libraries, rec = _recorder(profile, cuda_emulation)
    try:
        with threads.watched(step_label(spec)), _world(world_size), LayersRun() as layers:
            run = run_steps(make, steps, profile, rec, cuda_emulation, step_label(spec))
    except ModelFailedError as failed:
        failed.batch_size = batch_size or 0  # the size a search probed
        raise
    meta = _user_metadata(f"step:{step_name(spec)}", steps, profile, cuda_emulation, rec, run,
                          libraries, layers)  # fmt: skip
    _world_metadata(meta, world_size, libraries, step_label(spec))
    if batch_size is not None:
        meta["batch_size"] = str(batch_size)
    return rec, meta


def trace_script(
    path: Path,
    argv: list[str],
    steps: int,
    profile: Profile,
    cuda_emulation: bool = True,
    world_size: int | None = None,
) -> tuple[Recorder, dict[str, str]]:
    """An unmodified training script (symtrace/script.py) traced for `steps` iterations."""
    from memtrace_trainer.symtrace.script import run_script

    libraries, rec = _recorder(profile, cuda_emulation)
    with threads.watched(f"--script {path}"), _world(world_size), LayersRun() as layers:
        run = run_script(path, argv, steps, profile, rec, cuda_emulation)
    spec = f"script:{path}" + "".join(f" {a}" for a in argv)
    meta = _user_metadata(spec, steps, profile, cuda_emulation, rec, run, libraries, layers)
    _world_metadata(meta, world_size, libraries, f"script {path}")
    return rec, meta


def _world(world_size: int | None) -> Any:
    """The fake process group a user's distributed program runs in (`--world-size`)."""
    if world_size is None:
        return _without_world()
    from memtrace_trainer.symtrace.distributed import fake_world

    return fake_world(world_size)


@contextlib.contextmanager
def _without_world() -> Iterator[None]:
    """A program that starts a process group, traced without `--world-size`: torchrun's
    rendezvous is not there, and PyTorch's error ("environment variable RANK expected") named
    no flag of ours; the failure now says which one answers it."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.init_process_group

    def start(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except Exception as e:
            raise UserError(
                f"init_process_group() failed ({type(e).__name__}: {str(e).splitlines()[0]}): "
                "a distributed program is traced as rank 0 under the tracer's fake process "
                "group: give --world-size N, the job's ranks"
            ) from e

    saved = [(m, m.init_process_group) for m in (dist, c10d)]
    for m, _ in saved:
        m.init_process_group = start
    try:
        yield
    finally:
        for m, value in saved:
            m.init_process_group = value


def _world_metadata(
    meta: dict[str, str], world_size: int | None, libraries: LibrariesUsed, spec: str
) -> None:
    """A user's program runs as rank 0 of `world_size`; its NCCL memory is charged only when it
    ran a collective, as NCCL builds its communicators at the first one."""
    if world_size is None:
        return
    if not libraries.collective:
        from memtrace_trainer.notes import warn

        warn(f"--world-size {world_size}: {spec} ran no collective (no DDP, FSDP or "
             "torch.distributed call reached the process group), so no NCCL memory is charged "
             "and each rank is this single-GPU trace; drop --world-size, or check that the "
             "program starts its process group as it does under torchrun")  # fmt: skip
        return
    meta["world_size"] = str(world_size)
    meta["rank"] = "0"


def _recorder(profile: Profile, cuda_emulation: bool) -> tuple[LibrariesUsed, Recorder]:
    """The recorder, with the hook that notes which CUDA libraries the job loads and, under CUDA
    emulation, the library workspaces."""
    libraries = LibrariesUsed()
    if not cuda_emulation:
        return libraries, Recorder([libraries])
    profile.warn_unmeasured()
    return libraries, Recorder([libraries, Workspaces(profile)])


def _user_metadata(
    spec: str,
    steps: int,
    profile: Profile,
    cuda_emulation: bool,
    rec: Recorder,
    run: Any,
    libraries: LibrariesUsed,
    layers: LayersRun,
) -> dict[str, str]:
    # Nothing allocated is said by whoever asked for the trace: `estimate` and `max-batch` refuse
    # it (naming the step as every message does), `symtrace` warns (cli/models.py).
    meta = {
        "model": spec,
        "optimizer": ",".join(sorted(run.optimizers)) or "none",
        "iterations": str(run.iterations or steps),
        # A program mixing fp16 and bf16 autocast regions is named by the first.
        "amp": precision_regime(min(run.autocast_dtypes, default=None), run.models),
        "param_dtype": param_dtype(*run.models),
        "layer_types": layers.types(run.models),
        "cuda_emulation": str(cuda_emulation).lower(),
        **_traced_on(profile),
    }
    meta.update(libraries.metadata())
    meta.update(_sdpa_backends(run.sdpa_backends))
    return meta


def trace_to_file(workload: Workload, cfg: step.StepConfig, profile: Profile, out: Path) -> Summary:
    rec, extra = trace(workload, cfg, profile)
    summary = write_trace(out, rec, metadata(workload, cfg, profile, extra))
    summary.distributed = extra.get("distributed")
    return summary


def write_trace(out: Path, rec: Recorder, meta: dict[str, str]) -> Summary:
    """A traced recorder written to `out` with its metadata, as `trace_step` and `trace_script`
    return them (`write_trace(out, *trace_step(...))`)."""
    summary = summarize(rec.events)
    jsonl.write(out, jsonl.lines(rec.events, meta, rec.allocator_env))
    return summary
