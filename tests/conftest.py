"""Fixtures of the end-to-end tests. Missing binaries are a failure with instructions, never a
skip: these tests are the proof that the components work together."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from e2e_support import REPO, binary


@pytest.fixture(scope="session")
def memsim() -> Path:
    return binary("memsim")


@pytest.fixture(scope="session")
def trainer_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")])
    env.setdefault("MEMTRACE_BIN_DIR", str(binary("memsim").parent))
    return env
