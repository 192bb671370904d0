"""Shared paths and helpers. Data under ../shared is required: a missing file fails the test."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memtrace_trainer.cli import main

REPO = Path(__file__).resolve().parents[2]
GPUMEMNET = REPO.parent / "shared" / "data" / "gpumemnet"
SCHEMA = REPO / "trace" / "schema" / "trace.schema.json"

# The full GPUMemNet CSV checks take minutes; by default each checks a seeded sample of rows,
# and MEMTRACE_FULL_CSV=1 checks every row. Which one ran is printed in the test summary.
FULL_CSV = os.environ.get("MEMTRACE_FULL_CSV") == "1"
CSV_SAMPLE = 300
# The labels of a run on a GPU, as `run` writes them (no GPU in CI: the tests write them).
GPU_LABELS = {
    "device": "cuda", "cpu_fallback": False, "oom": False, "torch": "2.4.1", "cuda": "12.2",
    "gpu": "NVIDIA A100-SXM4-40GB", "max_memory_reserved_bytes": 3 * 2**30,
    "max_memory_allocated_bytes": 2**31, "device_peak_bytes": 3 * 2**30 + 500 * 2**20,
    "device_peak_source": "nvml-process", "step_time": {"median_s": 0.25},
}  # fmt: skip
CSV_SEED = 20240601
_SAMPLED: list[str] = []


def csv_sample(rows: list[dict[str, str]], name: str, n: int = CSV_SAMPLE) -> list[dict[str, str]]:
    """All rows under MEMTRACE_FULL_CSV=1, else a seeded sample (in file order)."""
    if FULL_CSV or len(rows) <= n:
        _SAMPLED.append(f"{name}: all {len(rows)} rows")
        return rows
    picked = sorted(random.Random(f"{CSV_SEED}-{name}").sample(range(len(rows)), n))
    _SAMPLED.append(f"{name}: seeded sample of {n}/{len(rows)} rows")
    return [rows[i] for i in picked]


class HeaderCheck:
    """Every trace header the tracer writes in this test process is checked against the trace
    schema, whose `metadata` keys are generated from `trace::metadata::KEYS` (the one list the
    readers act on): a key memsim does not know, or a value outside its key's domain, would be
    ignored there, so it fails the test that wrote it."""

    def __init__(self) -> None:
        self.checked = 0
        self._validator: Any = None

    def __call__(self, header: dict[str, Any]) -> None:
        import jsonschema

        if self._validator is None:
            if not SCHEMA.is_file():
                pytest.fail(f"trace schema {SCHEMA} is missing: cannot check trace headers")
            schema = json.loads(SCHEMA.read_text())
            self._validator = jsonschema.Draft202012Validator(schema)
            self.keys = set(schema["$defs"]["header"]["properties"]["metadata"]["properties"])
        unknown = sorted(set(header.get("metadata", {})) - self.keys)
        assert not unknown, f"trace header metadata keys not in trace::metadata::KEYS: {unknown}"
        errors = [
            f"{e.message} at {list(e.absolute_path)}" for e in self._validator.iter_errors(header)
        ]
        assert not errors, "trace header refused by the schema: " + "; ".join(errors)
        self.checked += 1


HEADERS = HeaderCheck()


@pytest.fixture(autouse=True)
def _written_headers_follow_the_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    from memtrace_trainer.symtrace import jsonl

    real = jsonl.lines

    def checked(
        events: list[dict[str, Any]], metadata: dict[str, str], env: dict[str, str] | None = None
    ) -> list[str]:
        out = real(events, metadata, env)
        HEADERS(json.loads(out[0]))
        return out

    monkeypatch.setattr(jsonl, "lines", checked)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.section("trace headers")
    terminalreporter.write_line(
        f"{HEADERS.checked} headers written by the tracer were checked against the trace schema"
    )
    if not _SAMPLED:
        return
    mode = "full (MEMTRACE_FULL_CSV=1)" if FULL_CSV else "sampled (MEMTRACE_FULL_CSV=1 for all)"
    terminalreporter.section(f"GPUMemNet CSV checks: {mode}")
    for line in sorted(set(_SAMPLED)):
        terminalreporter.write_line(line)


def gpumemnet_csv(name: str) -> Path:
    """A shared GPUMemNet dataset's path; its absence fails the test."""
    path = GPUMEMNET / name
    if not path.is_file():
        pytest.fail(f"shared dataset {path} is missing (tests read ../shared/data/gpumemnet)")
    return path


def gpumemnet_rows(name: str) -> list[dict[str, str]]:
    with gpumemnet_csv(name).open() as f:
        return list(csv.DictReader(f))


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`python -m memtrace_trainer ARGS` in this process (no torch import per call): the same
    `main`, its exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as e:  # argparse usage errors
            rc = e.code if isinstance(e.code, int) else 2
    done = subprocess.CompletedProcess(list(args), rc, out.getvalue(), err.getvalue())
    if check and rc != 0:
        pytest.fail(f"command failed ({rc}): {args}\n{done.stderr}")
    return done


def cli_process(
    *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real `python -m memtrace_trainer` in a child process (`env` added to this one's)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), **(env or {})}
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
