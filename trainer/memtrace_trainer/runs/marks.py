"""Iteration and phase markers for the shim (`memtrace_mark`), through ctypes.

Without the shim preloaded the symbol does not resolve and marking is a no-op, so the same
training loop runs traced and untraced.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from memtrace_trainer import markers


class Marker:
    """`iter:<n>` and `phase:<name>` markers in the trace of the preloaded libmemtrace.so."""

    def __init__(self) -> None:
        fn = getattr(ctypes.CDLL(None), "memtrace_mark", None)
        self._mark: Callable[[bytes], None] | None = None
        if fn is not None:
            fn.argtypes = [ctypes.c_char_p]
            fn.restype = None
            self._mark = fn
        self.sent: list[str] = []

    @property
    def active(self) -> bool:
        """Whether the shim is loaded into this process."""
        return self._mark is not None

    def _send(self, text: str) -> None:
        if self._mark is not None:
            self._mark(text.encode())
            self.sent.append(text)

    def iteration(self, n: int) -> None:
        self._send(markers.iteration(n))

    def phase(self, name: str) -> None:
        self._send(markers.phase(name))
