"""Finding the Rust binaries (memsim, memest) and the shim library the trainer drives."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from memtrace_trainer.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_HINT = "cargo build --release (in the repository root)"


@dataclass(frozen=True)
class Found:
    """A binary and where it came from, so commands can say which one they used."""

    path: Path
    source: str

    def describe(self) -> str:
        return f"{self.path} (from {self.source})"


def find_binary(name: str, debug_fallback: bool = False) -> Found:
    """`name` from $MEMTRACE_BIN_DIR, then PATH, then target/release (then target/debug when
    `debug_fallback`); a clear error naming every place looked in when none is there."""
    candidates: list[Found] = []
    if os.environ.get("MEMTRACE_BIN_DIR"):
        candidates.append(Found(Path(os.environ["MEMTRACE_BIN_DIR"]) / name, "$MEMTRACE_BIN_DIR"))
    on_path = shutil.which(name)
    if on_path:
        candidates.append(Found(Path(on_path), "PATH"))
    candidates.append(Found(REPO_ROOT / "target" / "release" / name, "target/release"))
    if debug_fallback:
        candidates.append(Found(REPO_ROOT / "target" / "debug" / name, "target/debug"))
    for c in candidates:
        if c.path.is_file() and os.access(c.path, os.X_OK):
            return c
    raise UserError(
        f"no {name} binary found: set MEMTRACE_BIN_DIR, put {name} on PATH or run "
        f"`{BUILD_HINT}` (looked in: " + ", ".join(str(c.path) for c in candidates) + ")"
    )


def find_shim() -> Found:
    """libmemtrace.so, found like the binaries: $MEMTRACE_BIN_DIR, then target/release|debug."""
    candidates: list[Found] = []
    if os.environ.get("MEMTRACE_BIN_DIR"):
        path = Path(os.environ["MEMTRACE_BIN_DIR"]) / "libmemtrace.so"
        candidates.append(Found(path, "$MEMTRACE_BIN_DIR"))
    for kind in ("release", "debug"):
        path = REPO_ROOT / "target" / kind / "libmemtrace.so"
        candidates.append(Found(path, f"target/{kind}"))
    for c in candidates:
        if c.path.is_file():
            return c
    raise UserError(
        "--trace needs the shim libmemtrace.so: set MEMTRACE_BIN_DIR or run "
        "`cargo build --release -p memtrace-shim` (looked in: "
        + ", ".join(str(c.path) for c in candidates)
        + ")"
    )


def error_line(stderr: str) -> str:
    """The one line of a Rust CLI's failure worth showing: its `error:` line without the program
    prefix (clap adds usage lines after it; warnings may come before it)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        for prefix in ("memsim: error: ", "memest: error: ", "error: "):
            if line.startswith(prefix):
                return line.removeprefix(prefix)
    return lines[-1] if lines else ""
