"""Shared paths and helpers. Data under ../shared is required: a missing file fails the test."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
GPUMEMNET = REPO.parent / "shared" / "data" / "gpumemnet"
SCHEMA = REPO / "trace" / "schema" / "trace.schema.json"


def gpumemnet_rows(name: str) -> list[dict[str, str]]:
    path = GPUMEMNET / name
    if not path.is_file():
        pytest.fail(f"shared dataset {path} is missing (tests read ../shared/data/gpumemnet)")
    with path.open() as f:
        return list(csv.DictReader(f))


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    done = subprocess.run(
        [sys.executable, "-m", "memtrace_trainer", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    if check and done.returncode != 0:
        pytest.fail(f"command failed ({done.returncode}): {args}\n{done.stderr}")
    return done


def read_trace(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]
