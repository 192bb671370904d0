"""A real training run on synthetic data, and its labels.

The loop is the symbolic tracer's loop run on a device: the same workload builders, optimizer
choices, AMP, checkpointing and gradient accumulation, so a label and a symbolic trace describe
the same job. Without CUDA it runs on the CPU and says so: every CUDA label is then null.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from memtrace_trainer.dtypes import AMP
from memtrace_trainer.errors import UserError
from memtrace_trainer.models.zoo import build_workload, load_entry
from memtrace_trainer.notes import warn
from memtrace_trainer.runs.config import RunConfig
from memtrace_trainer.runs.marks import Marker
from memtrace_trainer.runs.nvml import NvmlPeaks, Sampler, nvml_reader
from memtrace_trainer.symtrace.step import prepare
from memtrace_trainer.workload import Workload, call_model

Log = Callable[[str], None]

CPU_FALLBACK_BANNER = (
    "WARNING: CPU FALLBACK ({reason}): training on the CPU; the CUDA labels "
    "(max_memory_reserved/allocated, memory_stats, device_peak) are null, not measured"
)


def stderr_log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def resolve_device(requested: str) -> tuple[torch.device, str | None]:
    """The device to train on and, for the CPU, why (the fallback reason)."""
    available = torch.cuda.is_available()
    if requested == "cuda" and not available:
        raise UserError(
            "--device cuda: no CUDA device (torch.cuda.is_available() is False; "
            f"torch {torch.__version__}, CUDA build {torch.version.cuda})"
        )
    if requested == "cpu":
        return torch.device("cpu"), "--device cpu requested"
    if not available:
        return torch.device("cpu"), (
            f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda})"
        )
    return torch.device("cuda", torch.cuda.current_device()), None


def build(cfg: RunConfig, device: torch.device) -> Workload:
    if cfg.entry:
        # As symtrace: the entry decides its own sizes; --seq-len reaches it when it takes one.
        for flag, value in (("--input-shape", cfg.input_shape), ("--num-classes", cfg.num_classes)):
            if value is not None:
                warn(f"{flag} {value} has no effect with --entry: the entry function builds its "
                     "own model and batch")  # fmt: skip
        return load_entry(cfg.entry, cfg.batch_size, device, seq_len=cfg.seq_len)
    assert cfg.model is not None
    return build_workload(
        cfg.model, cfg.batch_size, cfg.input_shape, cfg.seq_len, cfg.num_classes, device
    )


def is_oom(e: BaseException) -> bool:
    if isinstance(e, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in text or "not enough memory" in text)


class _Loop:
    """State of the loop that an OOM label reports: where it stopped."""

    def __init__(self) -> None:
        self.iteration = 0
        self.phase = "setup"
        self.step_times: list[float] = []


def _train(cfg: RunConfig, device: torch.device, marker: Marker, loop: _Loop) -> None:
    torch.manual_seed(0)
    workload = build(cfg, device)
    model = workload.model
    _, optimizer = prepare(model, cfg.optimizer, cfg.checkpointing)
    scaler = torch.amp.GradScaler(device.type) if cfg.amp == "fp16" else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.monotonic()
    while True:
        if cfg.seconds is None and loop.iteration >= cfg.iterations:
            break
        if cfg.seconds is not None and loop.iteration >= 2:
            if time.monotonic() - started >= cfg.seconds:
                break
        t0 = time.perf_counter()
        marker.iteration(loop.iteration)
        for _ in range(cfg.grad_accum):
            loop.phase = "data"
            marker.phase("data")
            inputs, target = workload.make_batch()
            loop.phase = "forward"
            marker.phase("forward")
            cast = (
                torch.autocast(device.type, dtype=AMP[cfg.amp])
                if cfg.amp
                else contextlib.nullcontext()
            )
            with cast:
                out = call_model(model, inputs)
                loss = workload.loss(out, target)
                if cfg.grad_accum > 1:
                    loss = loss / cfg.grad_accum
            loop.phase = "backward"
            marker.phase("backward")
            (scaler.scale(loss) if scaler else loss).backward()
        loop.phase = "optimizer"
        marker.phase("optimizer")
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        loop.step_times.append(time.perf_counter() - t0)
        loop.iteration += 1
    loop.phase = "done"


ONE_STEP_NOTE = (
    "one step only: median and mean leave out the first step (lazy initialisation), so they "
    "are null; run 2 or more iterations for a steady-state step time"
)


def _step_time(times: list[float]) -> dict[str, Any]:
    # The first step pays for lazy initialisation (cuBLAS handles, autotuning); leave it out,
    # and say null rather than pass the first step off as the steady state.
    steady = times[1:]
    out = {
        "median_s": statistics.median(steady) if steady else None,
        "mean_s": statistics.fmean(steady) if steady else None,
        "first_s": times[0] if times else None,
        "all_s": times,
    }
    if len(times) == 1:
        out["note"] = ONE_STEP_NOTE
    return out


def _nvml_labels(peaks: NvmlPeaks | None, error: str | None) -> dict[str, Any]:
    if peaks is None:
        return {
            "device_peak_bytes": None,
            "device_peak_source": None,
            "nvml": None if error is None else {"error": error},
        }
    value, source = peaks.peak()
    return {
        "device_peak_bytes": value,
        "device_peak_source": source,
        "nvml": {
            "samples": peaks.samples,
            "hz": round(peaks.hz, 2),
            "process_peak_bytes": peaks.process_peak,
            "device_used_peak_bytes": peaks.device_peak if peaks.samples else None,
            "device_used_before_bytes": peaks.device_baseline,
            "errors": peaks.errors,
        },
    }


def train(cfg: RunConfig, log: Log = stderr_log) -> dict[str, Any]:
    """Trains `cfg` and returns its labels; an OOM is a label (`oom: true`), not an error."""
    cfg.validate()
    device, fallback = resolve_device(cfg.device)
    if fallback:
        log(CPU_FALLBACK_BANNER.format(reason=fallback))
    marker = Marker()
    loop = _Loop()
    sampler: Sampler | contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    nvml_error: str | None = None
    shutdown: Callable[[], None] | None = None
    if device.type == "cuda":
        try:
            read, shutdown = nvml_reader(device.index or 0)
            sampler = Sampler(read, 1.0 / cfg.nvml_hz)
        except ImportError:
            nvml_error = "nvidia-ml-py is not installed (pip install -r trainer/requirements.txt)"
        except Exception as e:  # no driver access from this container, etc.
            nvml_error = f"NVML unavailable: {type(e).__name__}: {e}"
        if nvml_error:
            log(f"warning: {nvml_error}; device_peak will be null")
    oom: dict[str, Any] | None = None
    started = time.monotonic()
    try:
        with sampler:
            _train(cfg, device, marker, loop)
    except Exception as e:
        if not is_oom(e):
            raise
        oom = {
            "message": str(e).splitlines()[0][:500],
            "iteration": loop.iteration,
            "phase": loop.phase,
        }
        log(f"OOM at iteration {loop.iteration}, phase {loop.phase} (recorded as a label)")
    finally:
        if shutdown is not None:
            shutdown()
    wall = time.monotonic() - started
    if len(loop.step_times) == 1:
        log(f"note: step_time: {ONE_STEP_NOTE}")
    cuda = device.type == "cuda"
    peaks = sampler.peaks if isinstance(sampler, Sampler) else None
    return {
        "device": device.type,
        "cpu_fallback": fallback is not None,
        "cpu_fallback_reason": fallback,
        "oom": oom is not None,
        "oom_detail": oom,
        "iterations_done": loop.iteration,
        "step_time": _step_time(loop.step_times),
        "wall_s": wall,
        "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(device) if cuda else None,
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "memory_stats": dict(torch.cuda.memory_stats(device)) if cuda else None,
        **_nvml_labels(peaks, nvml_error),
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "caching_allocator": not _caching_disabled(),
        "shim_markers": marker.active,
        "markers_sent": len(marker.sent),
    }


def _caching_disabled() -> bool:
    return os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "") not in ("", "0")
