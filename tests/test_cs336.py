"""The tracer on the user's own steps against real CUDA snapshots (docs/validation.md, "The
symbolic tracer against cs336 snapshots"): each expressible window of the cs336 snapshots,
rewritten as a step function in tests/cs336/steps.py, is traced, replayed and held to the targets
(peak allocated within 2%, peak reserved within 3% of the recorded window). The snapshots are
shared data: a missing one fails, it is never skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cs336.compare import ROWS, snapshot_window
from e2e_support import PYTHON, REPO, run

SNAPSHOTS = REPO.parent / "shared" / "data" / "snapshots"
# The eager windows (the compiled forwards are not expressible: torch.compile is traced eagerly).
EXPRESSIBLE = {
    "kk_fullstep_ctx128": "h200",
    "wl_medium128_inference": "a100-40gb",
    "wl_medium512_training": "a100-40gb",
    "magma27_small_fwd_bwd": "a100-40gb",
    "bcrafton_small_train": "a100-40gb",
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory, trainer_env: dict[str, str]) -> Path:
    d = tmp_path_factory.mktemp("cs336")
    for step, profile in EXPRESSIBLE.items():
        run([PYTHON, "-m", "memtrace_trainer", "symtrace", "--step", f"cs336.steps:{step}",
             "--steps", "1", "--profile", profile, "--out", str(d / f"{step}.jsonl")],
            env=trainer_env)  # fmt: skip
    return d


def replay(memsim: Path, *args: str) -> dict:
    return json.loads(run([str(memsim), "replay", *args, "--json"]).stdout)


@pytest.mark.parametrize("snap,step,rules", [r for r in ROWS if r[1] in EXPRESSIBLE])
def test_expressible_windows_meet_the_targets(
    snap: str, step: str, rules: str, traces: Path, memsim: Path
) -> None:
    pickle_path = SNAPSHOTS / f"{snap}.pickle"
    assert pickle_path.is_file(), f"{pickle_path}: shared snapshot missing"
    rec = replay(memsim, str(pickle_path))
    pred = replay(memsim, "--torch", rules, str(traces / f"{step}.jsonl"))["iterations"][0]
    _, reserved_after_empty_cache = snapshot_window(pickle_path)
    rec_reserved = reserved_after_empty_cache or rec["peak_reserved_bytes"]
    alloc_err = (pred["peak_allocated_bytes"] - rec["peak_allocated_bytes"]) / rec[
        "peak_allocated_bytes"
    ]
    reserved_err = (pred["peak_reserved_bytes"] - rec_reserved) / rec_reserved
    assert abs(alloc_err) <= 0.02, f"{snap}: peak allocated off by {alloc_err:+.2%}"
    assert abs(reserved_err) <= 0.03, f"{snap}: peak reserved off by {reserved_err:+.2%}"
