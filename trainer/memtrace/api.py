"""The Python API: `estimate`, `max_batch`, `replay`, `profiles`, `preload_path`.

The model a caller passes is never moved, trained or changed: each trace gets a copy whose
parameters and buffers are new tensors on the tracer's device (no values are read), and the
copy is what the tracer's loop trains. Defaults are the CLI's.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import UninitializedTensorMixin

from memtrace import checks
from memtrace.batches import META, classes_checked, default_loss, meta_like, searched
from memtrace.checks import KEYWORDS, as_keywords
from memtrace.checks import flag as _flag
from memtrace.checks import text as _text
from memtrace.result import (
    Estimate,
    EstimateError,
    Kept,
    breakdown,
    memsim,
    unavailable_in_api_words,
)
from memtrace_trainer import notes
from memtrace_trainer.errors import UserError, raised_by_memtrace, user_frames
from memtrace_trainer.profile import DEFAULT_PROFILE, load_profile
from memtrace_trainer.workload import integer_inputs


class MemtraceWarning(UserWarning):
    """Input memtrace could only partly use, or a constant it rests on that is unmeasured."""


# `replay` names the profile as memsim does.
REPLAY_KEYWORDS = {**KEYWORDS, "profile": "profile"}
# One estimate at a time per process: the tracer's device, the fake process group and the
# warnings captured are the process's own. Calls from several threads wait their turn.
_ONE_AT_A_TIME = threading.RLock()


def _meta_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` whose parameters and buffers are new tensors of the same shapes, dtypes
    and `requires_grad` on meta; the original's values are never read, nor its device touched."""
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) in memo:
            continue
        if isinstance(t, UninitializedTensorMixin):
            # A lazy module's parameter stays uninitialized (its first forward sizes it).
            memo[id(t)] = type(t)(requires_grad=t.requires_grad, device=META, dtype=t.dtype)
            continue
        fresh = torch.empty_like(t, device=META)
        memo[id(t)] = nn.Parameter(fresh, t.requires_grad) if isinstance(t, nn.Parameter) else fresh
    try:
        return copy.deepcopy(model, memo)
    except Exception as e:
        raise EstimateError(
            f"cannot copy the model to the tracer's device ({type(e).__name__}: {e}); pass a "
            "step function instead (memtrace.estimate(make_step), make_step(device) -> step)"
        ) from e


def _uncompiled(model: Any) -> Any:
    """A `torch.compile`d module's own module, traced eagerly, as the CLI traces a compiled
    step (dynamo could not copy the wrapper to the tracer's device)."""
    orig = getattr(model, "_orig_mod", None)
    if isinstance(model, nn.Module) and isinstance(orig, nn.Module):
        notes.warn(
            "the model is torch.compile'd: its eager module is traced (Inductor's fused "
            "kernels usually hold fewer intermediates, so the estimate errs high)"
        )
        return orig
    return model


def _checked(model: nn.Module, example_inputs: Any) -> Any:
    """The caller's module checked before its copy is traced, and `example_inputs` as the trace
    takes them (`checks.masks`)."""
    checks.scripted(model)
    checks.hooks_said(model)
    return checks.masks(model, example_inputs)


def _workloads(
    model: nn.Module,
    example_inputs: Any,
    target: Any,
    loss_fn: Callable[..., torch.Tensor] | None,
    amp: str | None,
    tuning: dict[str, Any],
) -> Callable[[int | None], Any]:
    """Batch size (None: the example's) -> a fresh meta workload of the caller's model, tuned
    by the fine-tuning keywords (`checks.TUNING`)."""
    from memtrace_trainer.models.zoo import tuned
    from memtrace_trainer.workload import Workload, fresh_like

    if example_inputs is None:
        raise EstimateError("example_inputs is required with a model: one batch as the model "
                            "takes it (a tensor, a tuple or a dict of tensors)")  # fmt: skip
    base = checks.batch_of(example_inputs)
    checks.float_inputs(model, example_inputs, tuning["dtype"], amp)
    lora_targets = checks.loop_arguments(target, loss_fn, tuning["lora_targets"])
    default = classes_checked(target) if loss_fn is None else default_loss
    tune = checks.tune(model, amp, {**tuning, "lora_targets": lora_targets})
    regime = tune.regime
    # A dtype asked for is the parameters' dtype, whatever the model's own (fp32 of a bf16
    # model too); without one, the model's own.
    recast = regime.dtype is not None and any(
        p.dtype.is_floating_point and p.dtype != regime.param_dtype for p in model.parameters()
    )

    def workload(batch: int | None = None) -> Any:
        b, memo = batch or base, dict[int, Any]()
        inputs, tgt = meta_like(example_inputs, base, b, memo), meta_like(target, base, b, memo)
        loss = default if loss_fn is None else checks.loss(loss_fn, b)
        w = Workload(f"python:{type(model).__name__}", _meta_copy(model),
                     lambda: fresh_like((inputs, tgt)), loss, b, "entry")  # fmt: skip
        if regime.active or recast or tune.attn or tune.task:
            w = tuned(w, regime, tune.task, tune.attn)
        integer_inputs(w.model, "example_inputs")
        return w

    return workload


def _step_config(
    optimizer: str, steps: int | None, amp: str | None, checkpointing: Any,
    world_size: int | None, strategy: str | None, reduce_bucket_size: int | None = None,
) -> Any:  # fmt: skip
    from memtrace_trainer.cli.common import MODEL_STEPS
    from memtrace_trainer.symtrace.step import StepConfig

    kind = checks.checkpointing(checkpointing)
    if world_size not in (None, 1) and strategy is None:
        raise EstimateError(f"world_size={world_size} needs strategy= (fsdp2, ddp, zero3, ...)")
    if strategy is not None and world_size is None:
        raise EstimateError(f"strategy={strategy!r} needs world_size= (the number of ranks)")
    reduce_bucket_size = checks.elements("reduce_bucket_size", reduce_bucket_size)
    cfg = StepConfig(optimizer, steps or MODEL_STEPS, amp, kind, 1, True,
                     world_size if strategy else None, strategy,
                     reduce_bucket_size=reduce_bucket_size)  # fmt: skip
    cfg.validate()
    return cfg


def _explain(e: BaseException) -> str:
    """What failed on the tracer's device: the exception (PyTorch's message names the op) and
    the innermost line of the caller's own code."""
    frames = user_frames(e)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].line})" if frames else ""
    return f"the model failed on the tracer's device: {type(e).__name__}: {e}{where}"


def _callers_level(frame: Any) -> int:
    """The `stacklevel` of the innermost frame of the caller's own code above `frame`: a warning
    points at the line of theirs that led to it (their `estimate` call, or their step's line),
    not at memtrace's or PyTorch's. Without one (memtrace called from an installed package), the
    frame that called memtrace: the one above its outermost frame of memtrace or PyTorch."""
    from memtrace_trainer.errors import is_user_file

    level, outermost = 1, 0
    while frame is not None:
        name = frame.f_code.co_filename
        if (name.startswith("<") and not name.startswith("<frozen")) or is_user_file(name):
            return level
        if _ours(name):
            outermost = level
        frame, level = frame.f_back, level + 1
    return outermost + 1


def _ours(filename: str) -> bool:
    """Whether `filename` is memtrace's, memtrace_trainer's or PyTorch's."""
    path = os.path.realpath(filename)
    return any(path.startswith(d + os.sep) for d in _own_dirs())


@functools.lru_cache(maxsize=1)
def _own_dirs() -> tuple[str, ...]:
    import memtrace_trainer

    files = (__file__, memtrace_trainer.__file__ or "", torch.__file__ or "")
    return tuple(os.path.dirname(os.path.realpath(f)) for f in files)


@contextlib.contextmanager
def _warnings_as_python() -> Iterator[list[str]]:
    said: list[str] = []

    def sink(message: str) -> None:
        if message.startswith(checks.BASELINES_ONLY):
            return
        message = as_keywords(message)
        said.append(message)
        warnings.warn(message, MemtraceWarning, stacklevel=_callers_level(sys._getframe()))

    with notes.captured(sink):
        yield said


@contextlib.contextmanager
def _tracing() -> Iterator[None]:
    """The caller's context set aside while a job is traced: one trace at a time, gradients on
    (a notebook cell under `torch.no_grad()` or `inference_mode()` trains nothing), and a
    default device other than CUDA (under `with torch.device("meta")` every op of the trace was
    taken for one on the meta device proper, which holds no memory, and the estimate lost its
    gradients, optimizer state and activations). A CUDA default stays: the tracer's device
    answers for it, as the job's GPU would. Anomaly detection off: it reads every gradient's
    values for NaNs, which the tracer's device has none of (every estimate failed, blamed on
    the model), and what it keeps (forward tracebacks) is host memory, not the GPU's."""
    with (
        _ONE_AT_A_TIME,
        torch.inference_mode(False),
        torch.enable_grad(),
        _no_anomaly_detection(),
        _no_device_default(),
    ):
        yield


@contextlib.contextmanager
def _no_anomaly_detection() -> Iterator[None]:
    """Anomaly detection off while a job is traced. Its flag is the process's, not the thread's:
    it is put back only where nobody changed it meanwhile (another thread's
    `set_detect_anomaly(True)` during the estimate stays), and an estimate that fails with it
    turned on meanwhile says so, as its NaN checks are what failed."""
    enabled, check_nan = torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()
    if enabled:
        torch.set_anomaly_enabled(False, check_nan)
    try:
        yield
    except EstimateError as e:
        if torch.is_anomaly_enabled():
            raise EstimateError(
                f"{e.args[0] if e.args else e} (anomaly detection was turned on while this "
                "estimate was traced, by another thread or the traced code: it is process-wide, "
                "and its NaN checks read gradients' values, which the tracer's device holds none "
                "of; estimate again while it is off)"
            ) from e
        raise
    finally:
        if enabled and (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()) == (
            False, check_nan,
        ):  # fmt: skip
            torch.set_anomaly_enabled(True, check_nan)


@contextlib.contextmanager
def _no_device_default() -> Iterator[None]:
    """A non-CUDA default device (`with torch.device(...)`, `torch.set_default_device`) set
    aside for a while: its mode off the torch-function stack (the rest kept in order), and
    PyTorch's record of it cleared, so that code traced meanwhile may set its own. The caller's
    stack and default come back afterwards, whatever the traced code left."""
    import torch.utils._device as device_mod
    from torch.utils._device import DeviceContext

    stack = torch._C._len_torch_function_stack
    holder = torch._GLOBAL_DEVICE_CONTEXT
    saved: list[Any] = []
    saved_global = (getattr(holder, "device_context", None), device_mod.CURRENT_DEVICE)
    try:
        saved = [torch._C._pop_torch_function_stack() for _ in range(stack())][::-1]
        aside = [m for m in saved if isinstance(m, DeviceContext)
                 and torch.device(m.device).type != "cuda"]  # fmt: skip
        for m in saved:
            if m not in aside:
                torch._C._push_on_torch_function_stack(m)
        if aside:
            holder.device_context, device_mod.CURRENT_DEVICE = None, None
        yield
    finally:
        for _ in range(stack()):
            torch._C._pop_torch_function_stack()
        for m in saved:
            torch._C._push_on_torch_function_stack(m)
        holder.device_context, device_mod.CURRENT_DEVICE = saved_global


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except EstimateError as e:
        said = as_keywords(e.args[0]) if e.args and isinstance(e.args[0], str) else None
        if e.__cause__ is None and said is not None and said != e.args[0]:
            raise EstimateError(said) from e
        raise  # already in the caller's words: one traceback, not the same message twice
    except UserError as e:
        raise EstimateError(as_keywords(str(e))) from e
    except Exception as e:
        if raised_by_memtrace(e):  # a fault of memtrace itself: its own traceback, not the model's
            raise
        raise EstimateError(_explain(e)) from e


def _profile(gpu: str, capacity: str | None = None) -> Any:
    """The profile of `gpu`, with `capacity` checked by memsim's parser before any tracing."""
    capacity = checks.size("capacity", capacity)
    try:
        return load_profile(gpu, capacity)
    except UserError as e:
        if capacity is not None and "capacity" in str(e):
            raise EstimateError(as_keywords(str(e))) from e
        raise EstimateError(f"gpu={gpu!r}: {e}") from e


def _arguments(
    steps: Any, world_size: Any, gpu: Any, optimizer: Any, point: Any, capacity: str | None,
    *counts: tuple[str, Any, str],
) -> tuple[Any, ...]:  # fmt: skip
    """The checks `estimate` and `max_batch` both make before any tracing, in this order
    (`counts`: more `checks.count`s, after world_size's); returns the gpu, its profile, and
    steps, world_size, point and `counts` as plain ints and bools (a NumPy integer, a 0-dim
    tensor taken as the int it holds)."""
    steps = checks.steps(steps)
    ints = [checks.count(name, value, what) for name, value, what in
            (("world_size", world_size, "a number of ranks"), *counts)]  # fmt: skip
    gpu = _text("gpu", gpu)
    _text("optimizer", optimizer)
    point = _flag("point", point)
    return gpu, _profile(gpu, capacity), steps, ints[0], point, *ints[1:]


def estimate(
    model: nn.Module | Callable[[torch.device], Callable[[], Any]],
    example_inputs: Any = None,
    *,
    target: Any = None,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    optimizer: str = "adam",
    amp: str | None = None,
    dtype: str | None = None,
    gpu: str | os.PathLike[str] = DEFAULT_PROFILE,
    world_size: int | None = None,
    strategy: str | None = None,
    reduce_bucket_size: int | None = None,
    lora: int | str | None = None,
    lora_targets: str | None = None,
    lora_dropout: float | None = None,
    qlora: bool = False,
    qlora_double_quant: bool = False,
    bnb_version: str | None = None,
    kbit_prepare: bool = True,
    task: str | None = None,
    attn: str | None = None,
    checkpointing: bool | str = False,
    steps: int | None = None,
    capacity: str | None = None,
    point: bool = False,
) -> Estimate:
    """The GPU memory a training job needs on `gpu`, estimated without a GPU.

    `model` is an `nn.Module` (on the CPU, or anywhere: it is copied, never moved or trained)
    trained by the tracer's loop on `example_inputs` (one batch: a tensor, tuple or dict) with
    `loss_fn(output, target)` (default: `default_loss`), `optimizer` (a name: adam, adamw, sgd,
    ...), autocast `amp` ("bf16"/"fp16"), parameter `dtype` ("bf16"/"fp16"), LoRA of rank
    `lora` ("R:ALPHA" for alpha; peft's default targets for a transformers model, else
    `lora_targets`, module names like "fc1,fc2") with `lora_dropout`, QLoRA (`qlora`,
    `qlora_double_quant`, `bnb_version`, `kbit_prepare`), a transformers model's `task` and
    `attn` (the CLI's fine-tuning flags, docs/finetuning.md), `checkpointing` (True/"full" or
    "selective"), sharded with `strategy` over `world_size` ranks (both or neither; DeepSpeed's
    `reduce_bucket_size` in elements for zero1-3, default 5e8). Or `model`
    is a step builder, `make(device) -> step`, run as written for `steps` steps (your loop, your
    optimizer).

    Raises `EstimateError` on bad arguments, an unknown `gpu` (the message lists the known
    profiles), or a model that fails on the tracer's device (naming the op and your line)."""
    from memtrace import builders
    from memtrace_trainer.estimate import ModelJob, StepJob, estimate_job

    amp, dtype, strategy = (checks.choice(n, v) for n, v in
                            (("amp", amp), ("dtype", dtype), ("strategy", strategy)))  # fmt: skip
    optimizer = checks.choice("optimizer", optimizer)
    tuning = {k: v for k, v in locals().items() if k in checks.TUNING}
    gpu, prof, steps, world_size, point = _arguments(steps, world_size, gpu, optimizer, point,
                                                     capacity)  # fmt: skip
    tmp = Kept()
    trace = Path(tmp.name) / "symbolic.jsonl"
    with _tracing(), _warnings_as_python() as said, _errors(), contextlib.ExitStack() as around:
        model = _uncompiled(model)
        if isinstance(model, nn.Module):
            inputs = _checked(model, example_inputs)
            workload = _workloads(model, inputs, target, loss_fn, amp, tuning)
            step = _step_config(optimizer, steps, amp, checkpointing, world_size, strategy,
                                reduce_bucket_size)  # fmt: skip
            job: Any = ModelJob(lambda: workload(None), step)
        elif callable(model):
            if example_inputs is not None:
                raise EstimateError("example_inputs has no effect with a step builder: your "
                                    "step makes its own batches")  # fmt: skip
            from memtrace_trainer.cli.common import STEP_FN_STEPS

            loop = {"target": target, "loss_fn": loss_fn, "amp": amp, "dtype": dtype,
                    "lora": lora, "lora_targets": lora_targets, "strategy": strategy,
                    "reduce_bucket_size": reduce_bucket_size,
                    "optimizer": optimizer if optimizer != "adam" else None,
                    "checkpointing": checkpointing or None}  # fmt: skip
            loop.update({n: tuning[n] for n in checks.given(tuning)})
            for name in (n for n, v in loop.items() if v is not None):
                notes.warn(f"{name}= has no effect with a step builder: your step decides")
            # Any world size given, 1 too: a step that starts a process group gets the fake one.
            job = StepJob(model, steps or STEP_FN_STEPS, world_size)
            around.enter_context(builders.watched(model))
        else:
            raise EstimateError(f"model: expected an nn.Module or a step builder "
                                f"make(device) -> step, got {type(model).__name__}")  # fmt: skip
        job.steps_given = steps is not None
        raw = estimate_job(job, gpu, None, capacity=capacity, point=point, keep=trace)
        unavailable_in_api_words(raw)
        report = json.loads(memsim("report", "--json", f"--profile={prof.path}", "--", str(trace)))
    sym = raw["estimates"]["symbolic"]
    inputs = raw.get("inputs", {})
    ranks = {"rank": 0, "device_mib": sym["device_mib"], "reserved_mib": sym["reserved_mib"],
             "allocated_mib": sym["allocated_mib"]}  # fmt: skip
    if inputs.get("distributed"):
        ranks["note"] = inputs["distributed"].get("ranks")
    return Estimate(
        device_mib=float(sym["device_mib"]),
        safe_mib=float(sym.get("safe_mib") or sym["device_mib"]),
        reserved_mib=float(sym["reserved_mib"]),
        allocated_mib=float(sym["allocated_mib"]),
        gpu=str(raw.get("gpu", gpu)),
        profile=str(prof.path),
        verdict=raw["verdict"],
        breakdown=breakdown(raw, report),
        per_rank=[ranks],
        warnings=said,
        raw=raw,
        _report=report,
        _dir=tmp,
        _capacity=capacity,
    )


def max_batch(
    model: nn.Module,
    example_inputs: Any = None,
    *,
    target: Any = None,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    optimizer: str = "adam",
    amp: str | None = None,
    dtype: str | None = None,
    gpu: str | os.PathLike[str] = DEFAULT_PROFILE,
    world_size: int | None = None,
    strategy: str | None = None,
    reduce_bucket_size: int | None = None,
    lora: int | str | None = None,
    lora_targets: str | None = None,
    lora_dropout: float | None = None,
    qlora: bool = False,
    qlora_double_quant: bool = False,
    bnb_version: str | None = None,
    kbit_prepare: bool = True,
    task: str | None = None,
    attn: str | None = None,
    checkpointing: bool | str = False,
    steps: int | None = None,
    capacity: str | None = None,
    point: bool = False,
    limit: int = 1 << 16,
) -> int:
    """The largest batch (the first dimension of `example_inputs` and `target`) that fits on
    `gpu`, by the same check as `estimate`; 0 when not even 1 fits. Arguments as `estimate`."""
    from memtrace_trainer.maxbatch import max_batch as search
    from memtrace_trainer.maxbatch import trace_model

    amp, dtype, strategy = (checks.choice(n, v) for n, v in
                            (("amp", amp), ("dtype", dtype), ("strategy", strategy)))  # fmt: skip
    optimizer = checks.choice("optimizer", optimizer)
    tuning = {k: v for k, v in locals().items() if k in checks.TUNING}
    if not isinstance(model, nn.Module):
        raise EstimateError(f"model: max_batch searches an nn.Module's batch, got "
                            f"{type(model).__name__} (for a step builder, use the CLI: "
                            "max-batch --step MOD:FN)")  # fmt: skip
    if example_inputs is None:
        # Checked here, not by Python's signature: a step builder passed alone got a raw
        # TypeError about this argument, not the message above.
        raise EstimateError("example_inputs: max_batch needs one batch of the model's inputs, "
                            "whose first dimension it searches")  # fmt: skip
    if limit is None:  # `count` lets an optional count's None through; this one is not
        raise EstimateError("limit=None: expected the largest batch to try (an int of at least 1)")
    gpu, prof, steps, world_size, point, limit = _arguments(
        steps, world_size, gpu, optimizer, point, capacity,
        ("limit", limit, "the largest batch to try"))  # fmt: skip
    with _tracing(), _warnings_as_python(), _errors():
        model = _uncompiled(model)
        inputs = _checked(model, example_inputs)
        workload = _workloads(model, inputs, target, loss_fn, amp, tuning)
        searched(inputs, target, checks.batch_of(inputs))
        step = _step_config(optimizer, steps, amp, checkpointing, world_size, strategy,
                            reduce_bucket_size)  # fmt: skip
        found = search(trace_model(workload, step), step.iterations, str(prof.path), capacity,
                       limit, point)  # fmt: skip
        if found.get("hit_limit"):
            notes.warn(f"limit={limit} fits: the search stopped there, and larger batches may "
                       "fit too; raise limit= to look further")  # fmt: skip
    return int(found["max_batch"])


def replay(trace: str | os.PathLike[str], profile: str | os.PathLike[str] | None = None, *,
           capacity: str | None = None, alloc_conf: str | None = None,
           point: bool = False) -> dict[str, Any]:  # fmt: skip
    """`memsim replay --json` of a trace (`.mtrace`, `.jsonl`, or a PyTorch snapshot pickle):
    peaks, fragmentation, memory statistics and, with a profile or capacity, the verdict."""
    args = ["replay", "--json"]
    point = _flag("point", point)
    for flag, value in (("--profile", profile), ("--capacity", checks.size("capacity", capacity)),
                        ("--alloc-conf", alloc_conf)):  # fmt: skip
        if value is not None:
            # `--flag=value` and `--` before the file: a name that begins with `-` is a name.
            args.append(f"{flag}={_text(flag[2:].replace('-', '_'), value)}")
    if point:
        args.append("--point")
    args += ["--", _text("trace", trace)]
    data = json.loads(memsim(*args, codes=(0, 1), keywords=REPLAY_KEYWORDS))
    # What memsim says of the trace (truncated, unknown records) reaches the caller as
    # `estimate`'s warnings do.
    for said in data.get("warnings", []):
        warnings.warn(as_keywords(said, REPLAY_KEYWORDS), MemtraceWarning, stacklevel=2)
    return data  # type: ignore[no-any-return]


def profiles() -> list[str]:
    """The names of the known GPU profiles (`gpu=` takes them)."""
    from memtrace_trainer.profile import known_profiles

    with _errors():
        return known_profiles()


def preload_path() -> Path:
    """`libmemtrace.so`, for `LD_PRELOAD=$(python -m memtrace preload) python train.py`."""
    from memtrace_trainer.binaries import find_shim

    with _errors():
        return find_shim().path
