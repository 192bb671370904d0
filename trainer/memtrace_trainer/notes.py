"""Warnings for the person at the terminal: every input the tool can only partly use, every flag
without effect and every placeholder constant is said once, on stderr, and kept for `--json`."""

from __future__ import annotations

import sys

_SEEN: list[str] = []


def warn(message: str) -> None:
    """Print `warning: MESSAGE` on stderr once per process run, and remember it."""
    if message in _SEEN:
        return
    _SEEN.append(message)
    print(f"warning: {message}", file=sys.stderr)


def collected() -> list[str]:
    """Every warning said since the last `reset()`, in order."""
    return list(_SEEN)


def reset() -> None:
    """Start a new command (the CLI's entry calls it, so in-process tests see their own)."""
    _SEEN.clear()
