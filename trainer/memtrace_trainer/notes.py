"""Warnings for the person at the terminal: every input the tool can only partly use, every flag
without effect and every placeholder constant is said once, on stderr, and kept for `--json`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

_SEEN: list[str] = []
# Where warnings go instead of stderr (the Python API turns them into Python warnings).
_SINKS: list[Callable[[str], None]] = []


def warn(message: str) -> None:
    """Print `warning: MESSAGE` on stderr once per process run (or hand it to the active sink),
    and remember it."""
    if message in _SEEN:
        return
    _SEEN.append(message)
    if _SINKS:
        _SINKS[-1](message)
    else:
        print(f"warning: {message}", file=sys.stderr)


def counted(n: int, noun: str) -> str:
    """`1 run`, `2 runs`: a count with its noun, where `1 runs` read as a slip."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def progress(message: str) -> None:
    """A progress line of long work: on stderr for the person at the terminal; to the
    `memtrace` logger (level INFO) while warnings are captured (the Python API)."""
    if _SINKS:
        import logging

        logging.getLogger("memtrace").info(message)
    else:
        print(message, file=sys.stderr)


@contextlib.contextmanager
def captured(sink: Callable[[str], None]) -> Iterator[None]:
    """Within: a fresh list of warnings, each handed to `sink` instead of stderr."""
    saved = list(_SEEN)
    _SEEN.clear()
    _SINKS.append(sink)
    try:
        yield
    finally:
        _SINKS.remove(sink)
        _SEEN[:0] = [m for m in saved if m not in _SEEN]


def collected() -> list[str]:
    """Every warning said since the last `reset()`, in order."""
    return list(_SEEN)


def reset() -> None:
    """Start a new command (the CLI's entry calls it, so in-process tests see their own)."""
    _SEEN.clear()
