"""Python's marker grammar (`memtrace_trainer.markers`) against memsim's (`trace::marker`): a
trace of markers, each before an allocation, is read by both, and they must agree on which
texts are iterations (and their numbers) and which are phases."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

from memtrace_trainer import markers
from memtrace_trainer.symtrace import jsonl

TEXTS = [
    "iter:0", "iter:7", "iter:+2", "iter:", "iter:x", "iter: 3", "iter:3 ", "iter:1_0",
    "iter:-1", "iter:\u0663", "iter:18446744073709551615", "iter:18446744073709551616",
    "iter", "iterator ready", "phase:forward", "phase:backward", "phase:optimizer",
    "phase:data", "phase:other", "phase:warmup", "phase:", "phase:Forward", "user text",
]  # fmt: skip


def test_python_reads_markers_as_memsim_does(tmp_path: Path) -> None:
    memsim = REPO / "target" / "release" / "memsim"
    if not memsim.is_file():
        pytest.fail(f"{memsim} missing: run `cargo build --release` first")
    events = []
    for i, text in enumerate(TEXTS):
        events.append({"kind": "marker", "text": text, "ts_ns": 2 * i, "device": 0})
        events.append({"kind": "alloc", "addr": 4096 * (i + 1), "size": 512,
                       "category": "activation", "ts_ns": 2 * i + 1, "device": 0})  # fmt: skip
    trace = tmp_path / "markers.jsonl"
    trace.write_text("\n".join(jsonl.lines(events, {})) + "\n")

    def memsim_json(*args: str) -> dict:
        done = subprocess.run([str(memsim), *args, str(trace), "--json"], capture_output=True,
                              text=True, check=True)  # fmt: skip
        return json.loads(done.stdout)

    iterations = [it["iter"] for it in memsim_json("replay")["iterations"]]
    structural = [m["text"] for m in memsim_json("report")["marks"]]
    py_iters = [n for t in TEXTS if (n := markers.iteration_of(t)) is not None]
    assert py_iters == iterations, (py_iters, iterations)
    py_marks = [t for t in TEXTS if markers.iteration_of(t) is not None or markers.phase_of(t)]
    assert py_marks == structural, (py_marks, structural)
    # And what Python writes reads back as it meant it.
    assert markers.iteration_of(markers.iteration(12)) == 12
    assert all(markers.phase_of(markers.phase(p)) == p for p in markers.PHASES)
    with pytest.raises(ValueError, match="expected one of"):
        markers.phase("warmup")
