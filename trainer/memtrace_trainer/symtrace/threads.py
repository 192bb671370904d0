"""Threads the traced code starts. PyTorch's modes, the fake device among them, are per thread:
what another thread allocates on "cuda" is not traced. Without a GPU such an allocation fails in
its thread ("Found no NVIDIA driver"), which printed a traceback beside a FITS verdict that left
the memory out; here it fails the trace instead, naming the thread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from memtrace_trainer import notes
from memtrace_trainer.errors import UserError

# How long the threads the traced code started, still running at its end, are waited for.
JOIN_SECONDS = 2.0
# What a CUDA call made outside the fake device says (torch's lazy init, the driver's absence).
_CUDA_WORDS = ("cuda", "nvidia driver", "torch not compiled with cuda")


@contextlib.contextmanager
def watched(label: str) -> Iterator[None]:
    """Within: an exception that ends a thread other than the tracing one is kept, not printed;
    after (the threads it started waited for a moment, those still running named), one that came
    from CUDA fails the trace (UserError), another is warned of. Only a thread that fails is
    caught: on a machine with a GPU a thread's allocation succeeds, untraced."""
    raised: list[tuple[str, BaseException]] = []
    previous = threading.excepthook
    before = set(threading.enumerate())

    def hook(args: Any) -> None:
        if args.exc_type is SystemExit or args.exc_value is None:
            return
        raised.append((args.thread.name if args.thread else "a thread", args.exc_value))

    threading.excepthook = hook
    try:
        yield
    finally:
        # A thread still running may fail (or allocate) after the trace: waited for a moment,
        # then named.
        deadline = time.monotonic() + JOIN_SECONDS
        late = [t for t in threading.enumerate() if t not in before]
        for t in late:
            t.join(max(0.0, deadline - time.monotonic()))
        threading.excepthook = previous
    running = [t.name for t in late if t.is_alive()]
    if running:
        notes.warn(f"{label}: thread(s) {', '.join(map(repr, running))}, started by your code, "
                   f"still ran {JOIN_SECONDS:g} s after the trace ended: what they allocate on the "
                   "GPU from then on is not in the estimate")  # fmt: skip
    for name, e in raised:
        what = f"{type(e).__name__}: {e}".strip()
        if any(word in str(e).lower() for word in _CUDA_WORDS):
            raise UserError(
                f"{label}: thread {name!r}, started by your code, raised {what}: the trace follows "
                "the thread that runs your code only (PyTorch's modes, its fake device among "
                "them, are per thread), so what other threads allocate on the GPU would be left "
                "out of the estimate; allocate on the device in the thread that runs your code"
            )
        notes.warn(f"{label}: thread {name!r}, started by your code, raised {what}; the trace "
                   "went on without it")  # fmt: skip
