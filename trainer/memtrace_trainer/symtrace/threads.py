"""Threads the traced code starts. PyTorch's modes, the fake device among them, are per thread:
what another thread allocates on "cuda" is not traced. Without a GPU such an allocation fails in
its thread ("Found no NVIDIA driver"), which printed a traceback beside a FITS verdict that left
the memory out; here it fails the trace instead, naming the thread."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from memtrace_trainer import notes
from memtrace_trainer.errors import UserError

# What a CUDA call made outside the fake device says (torch's lazy init, the driver's absence).
_CUDA_WORDS = ("cuda", "nvidia driver", "torch not compiled with cuda")


@contextlib.contextmanager
def watched(label: str) -> Iterator[None]:
    """Within: an exception that ends a thread other than the tracing one is kept, not printed;
    after (those it started that still run named), one that came from CUDA fails the trace
    (UserError), another is warned of. Only a thread that fails is
    caught: on a machine with a GPU a thread's allocation succeeds, untraced."""
    raised: list[tuple[str, BaseException]] = []
    previous = threading.excepthook
    tracing = threading.current_thread()
    # Only threads the traced code starts, and those they start: a thread another caller starts
    # meanwhile (another estimate's, waiting its turn) is not the traced code's.
    started: dict[threading.Thread, None] = {}  # in the order they started
    start = threading.Thread.start

    def recording_start(thread: threading.Thread) -> None:
        if threading.current_thread() in started or threading.current_thread() is tracing:
            started[thread] = None
        start(thread)

    def hook(args: Any) -> None:
        if args.thread not in started:
            return previous(args)
        if args.exc_type is SystemExit or args.exc_value is None:
            return None
        raised.append((args.thread.name, args.exc_value))
        return None

    threading.excepthook = hook
    threading.Thread.start = recording_start  # type: ignore[method-assign]
    try:
        yield
    finally:
        threading.excepthook = previous
        threading.Thread.start = start  # type: ignore[method-assign]
    late = [t for t in started if t.is_alive()]
    if late:
        # Not waited for (the answer would wait on them): named now, and a failure of theirs
        # after the trace said in words, not as a raw traceback.
        names = ", ".join(repr(t.name) for t in late)
        notes.warn(f"{label}: thread(s) {names}, started by your code, still ran when the "
                   "trace ended: what they allocate on the GPU from then on is not in the "
                   "estimate")  # fmt: skip
        threading.excepthook = _after_the_trace(label, set(late), previous)
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


def _after_the_trace(label: str, late: set[threading.Thread], previous: Any) -> Any:
    """The excepthook once the trace has ended: a thread it named as still running that fails is
    said in one line; any other thread goes to the hook that was there before."""

    def hook(args: Any) -> None:
        if args.thread not in late:
            return previous(args)
        if args.exc_type is not SystemExit:
            notes.warn(f"{label}: thread {args.thread.name!r} raised {args.exc_type.__name__}: "
                       f"{args.exc_value} after the trace ended: what it did then is not in the "
                       "estimate")  # fmt: skip
        return None

    return hook
