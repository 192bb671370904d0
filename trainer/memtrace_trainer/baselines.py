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

MIB = 1 << 20
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
        if text.startswith("iter:"):
            tracker.reset_mod_stats()

    with _hooks_on_frozen_skipped(), listen_markers(on_marker), tracker:
        run()
    peak = tracker.get_tracker_snapshot("peak")
    total = sum(int(stats.get("Total", 0)) for stats in peak.values())
    return {
        "device_mib": total / MIB,
        "reserved_mib": None,
        "allocated_mib": None,
        "safe_mib": None,
        "level": "live",
        "steps": None,
        "role": "baseline",
        "ignores": IGNORES,
    }
