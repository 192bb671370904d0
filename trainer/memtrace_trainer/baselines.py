"""PyTorch's MemTracker on the job memtrace estimates: the field's live-tensor baseline.

`torch.distributed._tools.mem_tracker.MemTracker` sorts live tensors into parameters, buffers,
gradients, activations, temporaries and optimizer state, and reports their peak; it has no model
of the allocator (storages rounded to 512 B). It runs here over the same job as the symbolic
trace, on the same device, without the CUDA-only allocations (the plain trace's setting), so the
two differ by what each models.

Two things it cannot do as shipped (torch 2.15) are bridged, and said in its `ignores`:
- it registers gradient hooks on every parameter, and PyTorch refuses hooks on a frozen one
  (LoRA's base), so hooks on tensors that need no gradient are skipped (they would never fire);
- it refuses to see a module's forward twice without `reset_mod_stats()`, which is called at
  each traced iteration's marker, as its own tests do between iterations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from memtrace_trainer.errors import UserError
from memtrace_trainer.markers import iteration_of
from memtrace_trainer.units import MIB

IGNORES = (
    "the caching allocator (rounding, caching, fragmentation), CUDA-only workspaces and the "
    "CUDA context and libraries (PyTorch's MemTracker: peak of live tensors, storages rounded "
    "to 512 B; gradient hooks skipped on frozen parameters)"
)


class _NoHandle:
    def remove(self) -> None:
        return None


@contextlib.contextmanager
def _hooks_on_frozen_skipped() -> Iterator[None]:
    names = ("register_hook", "register_post_accumulate_grad_hook")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def skipping(original: Callable[..., Any]) -> Callable[..., Any]:
        def register(self: torch.Tensor, hook: Any) -> Any:
            if not self.requires_grad:
                return _NoHandle()
            return original(self, hook)

        return register

    for n, original in saved.items():
        setattr(torch.Tensor, n, skipping(original))
    try:
        yield
    finally:
        for n, original in saved.items():
            setattr(torch.Tensor, n, original)


def memtracker(run: Callable[[], Any]) -> dict[str, Any]:
    """The answer of MemTracker over `run()` (which traces the job), as an `estimates` entry."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from memtrace_trainer.symtrace.recorder import listen_markers

    tracker = MemTracker()

    def on_marker(text: str) -> None:
        if iteration_of(text) is not None:
            tracker.reset_mod_stats()

    with _hooks_on_frozen_skipped(), listen_markers(on_marker), tracker:
        run()
    return _entry(_peak(tracker)[1], IGNORES)


def _peak(tracker: Any) -> tuple[dict[Any, dict[Any, int]], int]:
    """A MemTracker's peak snapshot (per module, per kind) and its total bytes."""
    peak = tracker.get_tracker_snapshot("peak")
    return peak, sum(int(stats.get("Total", 0)) for stats in peak.values())


def _entry(total_bytes: int, ignores: str, **extra: Any) -> dict[str, Any]:
    """A live-tensor baseline as an `estimates` entry: no allocator, so no reserved number."""
    return {
        "device_mib": total_bytes / MIB,
        "reserved_mib": None,
        "allocated_mib": None,
        "safe_mib": None,
        "level": "live",
        "steps": None,
        "role": "baseline",
        **extra,
        "ignores": ignores,
    }


FSDP_IGNORES = (
    "the caching allocator (rounding, caching, per-stream pools, fragmentation), CUDA-only "
    "workspaces, NCCL's buffers and the CUDA context (PyTorch's FSDPMemTracker: peak of live "
    "tensors of an FSDP2 model, storages rounded to 512 B, sorted by FSDP's own categories)"
)


def fsdp_memtracker(run: Callable[[], Any]) -> dict[str, Any]:
    """The answer of `FSDPMemTracker` (torch.distributed._tools.fsdp2_mem_tracker) over `run()`,
    which traces an FSDP2-sharded job with the tracer's own loop. The tracker needs the root
    FSDP module and the optimizer, so it is built when the loop has made them and entered
    around each step (mode stacks are last in, first out, so it cannot outlive a step); its
    per-step peaks are read after each step and the largest is the answer, with FSDP's own
    categories (sharded and unsharded parameters, all-gather and reduce-scatter buffers) at
    that peak."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import FSDPModule

    from memtrace_trainer.symtrace.step import watch_steps

    best: dict[str, Any] = {"total": -1, "by_kind": {}}

    def snapshot(tracker: Any) -> None:
        peak, total = _peak(tracker)
        if total > best["total"]:
            kinds: dict[str, int] = {}
            for stats in peak.values():
                for kind, n in stats.items():
                    if kind != "Total":
                        # FSDP's categories (`_FSDPRefType.SHARDED_PARAM`), by their names.
                        name = str(getattr(kind, "name", kind)).lower()
                        kinds[name] = kinds.get(name, 0) + int(n)
            best.update(total=total, by_kind=kinds)

    @contextlib.contextmanager
    def around(tracker: Any) -> Iterator[None]:
        tracker.reset_mod_stats()
        with _hooks_on_frozen_skipped(), tracker:
            yield
        snapshot(tracker)

    def made(model: Any, optimizer: Any) -> Any:
        if not isinstance(model, FSDPModule):
            raise UserError("FSDPMemTracker needs an FSDP2 root module; the job's model is not one")
        tracker = FSDPMemTracker(model, optimizer)
        return lambda: around(tracker)

    with watch_steps(made):
        run()
    if best["total"] < 0:
        raise UserError("FSDPMemTracker saw no step (the job made no model and optimizer)")
    by_kind = {k: v / MIB for k, v in sorted(best["by_kind"].items())}
    return _entry(best["total"], FSDP_IGNORES, by_kind_mib=by_kind)
