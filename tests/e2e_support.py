"""Helpers of the end-to-end tests: the repository, the built binaries, running commands."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def binary(name: str) -> Path:
    """A built binary: $MEMTRACE_BIN_DIR, target/release, target/debug, then PATH."""
    for d in [
        os.environ.get("MEMTRACE_BIN_DIR"),
        REPO / "target" / "release",
        REPO / "target" / "debug",
    ]:
        if d and (Path(d) / name).is_file():
            return Path(d) / name
    found = shutil.which(name)
    if found:
        return Path(found)
    where = "$MEMTRACE_BIN_DIR, target/release or target/debug"
    pytest.fail(f"{name} not found in {where}: run scripts/setup.sh")


def run(
    cmd: list[str], env: dict[str, str] | None = None, codes: tuple[int, ...] = (0,)
) -> subprocess.CompletedProcess[str]:
    """Run a command; when it exits with a status not in `codes`, fail the test with its output."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    if p.returncode not in codes:
        shown = " ".join(map(str, cmd))
        pytest.fail(f"{shown} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p
