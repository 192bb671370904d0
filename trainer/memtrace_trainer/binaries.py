"""Running the Rust commands (memsim, memest) and finding the shim library the trainer drives.

`run_tool` is the one way to run a command: in this process through the wheel's native module
(`memtrace._native`, the same `main` as the binaries) when it is installed, else the binary
found by `find_binary` as a subprocess."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

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


def bin_dir() -> Path | None:
    """$MEMTRACE_BIN_DIR, the first place the binaries and the shim are looked for; None when
    unset or empty. Set to a path that is no directory, it is refused: the search went on to
    PATH and target/release as if it were unset, and ran binaries other than the ones named."""
    value = os.environ.get("MEMTRACE_BIN_DIR")
    if not value:
        return None
    path = Path(value)
    if not path.is_dir():
        found = "not a directory" if path.exists() else "no such directory"
        raise UserError(f"$MEMTRACE_BIN_DIR={value}: {found}; expected the folder of the built "
                        "memsim, memest and libmemtrace.so (target/release), or unset it to "
                        "search PATH and target/release")  # fmt: skip
    return path


def find_binary(name: str, debug_fallback: bool = False) -> Found:
    """`name` from $MEMTRACE_BIN_DIR, then PATH, then target/release (then target/debug when
    `debug_fallback`); a clear error naming every place looked in when none is there."""
    candidates: list[Found] = []
    if (given := bin_dir()) is not None:
        candidates.append(Found(given / name, "$MEMTRACE_BIN_DIR"))
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


def native() -> ModuleType | None:
    """The wheel's native module, or None outside the wheel (the development setup). With it,
    the GPU profiles are the ones shipped in the wheel (memtrace/profiles), never a path of the
    machine that built it, unless $MEMTRACE_PROFILES says otherwise."""
    try:
        from memtrace import _native  # type: ignore[attr-defined]
    except ImportError:
        return None
    shipped = Path(_native.__file__).resolve().parent / "profiles"
    if shipped.is_dir():
        os.environ.setdefault("MEMTRACE_PROFILES", str(shipped))
    return _native  # type: ignore[no-any-return]


def tool_source(name: str) -> Found:
    """Where `run_tool(name, ...)` runs the command from."""
    mod = native()
    if mod is not None:
        return Found(Path(str(mod.__file__)), "the memtrace wheel's native module, in-process")
    return find_binary(name)


# The in-process commands write to the process's file descriptors 1 and 2, which are redirected
# for the call: one call at a time.
_FDS = threading.Lock()


def run_tool(name: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    """`NAME ARGS` (memsim or memest) with its exit status, stdout and stderr: in-process through
    the native module when the wheel is installed, else as a subprocess of the binary."""
    mod = native()
    if mod is None:
        found = find_binary(name)
        return subprocess.run([str(found.path), *args], capture_output=True, text=True,
                              check=False)  # fmt: skip
    main = getattr(mod, f"{name}_main")
    with _FDS, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = (os.dup(1), os.dup(2))
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            code = main([name, *args])
        finally:
            for fd, original in zip((1, 2), saved, strict=True):
                os.dup2(original, fd)
                with contextlib.suppress(OSError):
                    os.close(original)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([name, *args], int(code),
                                           out.read().decode(), err.read().decode())  # fmt: skip


def find_shim() -> Found:
    """libmemtrace.so: $MEMTRACE_BIN_DIR, then the wheel's copy (memtrace/_lib), then
    target/release|debug."""
    candidates: list[Found] = []
    if (given := bin_dir()) is not None:
        candidates.append(Found(given / "libmemtrace.so", "$MEMTRACE_BIN_DIR"))
    packaged = Path(__file__).resolve().parents[1] / "memtrace" / "_lib" / "libmemtrace.so"
    candidates.append(Found(packaged, "the memtrace package"))
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
    """A Rust CLI's failure as one line: its `error:` line without the program prefix, and the
    lines the error goes on with (a TOML error's reason under its source excerpt), joined by
    "; ". Warnings may come before it; clap's usage advice and source excerpts (`21 | ...`) are
    left out."""
    lines = [line.strip() for line in stderr.splitlines()]
    for i, line in enumerate(lines):
        for prefix in ("memsim: error: ", "memest: error: ", "error: "):
            if line.startswith(prefix):
                said = [line.removeprefix(prefix)]
                for more in lines[i + 1 :]:
                    if not more or more.startswith(("Usage:", "For more information")):
                        break
                    if not re.match(r"^(\d+ *)?\|", more):
                        said.append(more)
                return "; ".join(said)
    # Rust's allocation failure aborts with its own line, then one about the backtrace it skips.
    rest = [line for line in lines if line and not line.startswith("skipping backtrace")]
    return rest[-1] if rest else ""
