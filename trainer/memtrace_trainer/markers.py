"""The marker grammar of `trace/src/marker.rs`, for Python's producers and readers of markers,
so that what Python writes and reads as an iteration or a phase is what memsim does:

- `iter:<n>`, `n` a whole number in ASCII digits (an optional `+`) below 2^64, starts
  iteration `n`;
- `phase:<forward|backward|optimizer|data|other>` starts a phase;
- anything else (`iter:x`, `phase:warmup`, `iter: 3`) is the user's text.

`trainer/tests/test_markers.py` checks both sides read the same texts alike."""

from __future__ import annotations

import re

PHASES = ("forward", "backward", "optimizer", "data", "other")
_ITER = re.compile(r"iter:\+?([0-9]+)")
_U64_MAX = (1 << 64) - 1


def iteration_of(text: str) -> int | None:
    """`n` of an `iter:<n>` marker; None for any other text."""
    m = _ITER.fullmatch(text)
    if m is None:
        return None
    n = int(m.group(1))
    return n if n <= _U64_MAX else None


def phase_of(text: str) -> str | None:
    """The phase a `phase:<p>` marker starts; None for any other text."""
    if not text.startswith("phase:"):
        return None
    p = text.removeprefix("phase:")
    return p if p in PHASES else None


def iteration(n: int) -> str:
    """The marker that starts iteration `n`."""
    if not 0 <= n <= _U64_MAX:
        raise ValueError(f"iteration {n}: expected a whole number from 0 to 2^64 - 1")
    return f"iter:{n}"


def phase(name: str) -> str:
    """The marker that starts phase `name`."""
    if name not in PHASES:
        raise ValueError(f"phase {name!r}: expected one of {PHASES}")
    return f"phase:{name}"
