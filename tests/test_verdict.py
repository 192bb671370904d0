"""One verdict: `memsim replay`, `memsim colocate`, `estimate` and `max-batch` apply the same
accounting of memory outside the allocator (`simulator::fit`) to the same trace and profile, so
they agree to the byte, and `max-batch`'s answer fits by `estimate` while the next batch does not.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from e2e_support import PYTHON, run

MLP = 'synthetic:{"family":"mlp","input_size":512,"output_size":10,"depth":4}'
MIB = 1 << 20


def _trainer(env: dict[str, str], *args: str, codes: tuple[int, ...] = (0,)) -> dict:
    done = run([PYTHON, "-m", "memtrace_trainer", *args, "--json"], env, codes=codes)
    return json.loads(done.stdout)


def _estimate(env: dict[str, str], batch: int, *extra: str) -> tuple[int, dict]:
    cmd = [PYTHON, "-m", "memtrace_trainer", "estimate", "--model", MLP, "--batch-size"]
    done = run([*cmd, str(batch), "--profile", "a100-40gb", *extra, "--json"], env, codes=(0, 1))
    return done.returncode, json.loads(done.stdout)


def test_four_commands_agree_on_one_trace(
    tmp_path: Path, memsim: Path, trainer_env: dict[str, str]
) -> None:
    trace = tmp_path / "mlp.jsonl"
    _trainer(trainer_env, "symtrace", "--model", MLP, "--batch-size", "64", "--out", str(trace))
    replay = json.loads(run([str(memsim), "replay", str(trace), "--profile", "a100-40gb",
                             "--json"]).stdout)  # fmt: skip
    device = replay["peak_device_bytes"]
    safe = replay["peak_device_safe_bytes"]
    outside = replay["outside_allocator"]
    assert outside["libraries"] == {"gemm": True, "conv": False, "source": "trace", "ranks": 1}
    assert outside["nccl_bytes"] == 0  # one rank: no communicator
    assert device == replay["peak_reserved_bytes"] + outside["total_bytes"]
    # The verdict rests on the safe number: the point plus the profile's MLP margin, a fraction
    # of the point or of the reserved peak (the margin's scale).
    margin = replay["margin"]
    assert margin["regime"] == "mlp fp32 adam"
    base = replay["peak_reserved_bytes"] if margin["scale"] == "reserved" else device
    assert safe == device + math.ceil(base * margin["fraction"])
    assert replay["verdict"]["need_bytes"] == safe and replay["verdict"]["fits"] is True
    assert replay["verdict"]["basis"] == "safe"
    assert replay["capacity"]["source"] == "profile"

    colo = json.loads(run([str(memsim), "colocate", str(trace), "--profile", "a100-40gb",
                           "--json"]).stdout)  # fmt: skip
    assert colo["combined_need_bytes"] == safe
    assert colo["jobs"][0]["device_peak_bytes"] == device
    assert colo["jobs"][0]["device_safe_bytes"] == safe
    assert colo["jobs"][0]["outside_allocator"] == outside

    code, est = _estimate(trainer_env, 64)
    assert code == 0 and est["schema"] == 3
    assert est["verdict"]["need_mib"] * MIB == safe
    assert est["verdict"]["point_mib"] * MIB == device
    assert est["estimates"]["symbolic"]["device_mib"] * MIB == device
    assert est["estimates"]["symbolic"]["safe_mib"] * MIB == safe
    assert est["outside_allocator"]["total_mib"] * MIB == outside["total_bytes"]
    assert est["verdict"]["capacity_mib"] * MIB == replay["capacity"]["bytes"]

    # max-batch at a capacity of exactly this job's safe need: batch 64 fits, the answer fits by
    # `estimate`, and the next batch does not.
    cap = str(safe)
    mb = _trainer(trainer_env, "max-batch", "--model", MLP, "--profile", "a100-40gb",
                  "--capacity", cap)  # fmt: skip
    best = mb["max_batch"]
    assert best >= 64 and mb["capacity_bytes"] == safe and mb["need_bytes"] <= safe
    code, at = _estimate(trainer_env, best, "--capacity", cap)
    assert code == 0 and at["verdict"]["fits"] is True
    assert at["verdict"]["need_mib"] * MIB == mb["need_bytes"]
    code, over = _estimate(trainer_env, best + 1, "--capacity", cap)
    assert code == 1 and over["verdict"]["fits"] is False
    assert over["verdict"]["need_mib"] > over["verdict"]["capacity_mib"]
    # --point judges on the point estimate: the same job fits a capacity between point and safe.
    assert safe > device, "the A100 profile has a calibrated MLP margin"
    code, pt = _estimate(trainer_env, 64, "--capacity", str(device), "--point")
    assert code == 0 and pt["verdict"]["basis"] == "estimates.symbolic.device_mib"
    code, sf = _estimate(trainer_env, 64, "--capacity", str(device))
    assert code == 1 and sf["verdict"]["fits"] is False


CNN = (
    'synthetic:{"family":"cnn","input_channels":3,"num_classes":10,"depth":3,'
    '"architecture":"residual","base_filters":8,"input_size":16}'
)


def test_memsim_and_memest_agree_on_a_plain_meta_trace(
    tmp_path: Path, memsim: Path, trainer_env: dict[str, str]
) -> None:
    # The plain meta path (--no-cuda-emulation) emulates no workspaces, but its header still says
    # which libraries the job loads: both commands count the same memory outside the allocator
    # (before, memsim counted the context alone and memest guessed from the family).
    trace = tmp_path / "plain.jsonl"
    _trainer(trainer_env, "symtrace", "--model", CNN, "--batch-size", "8",
             "--no-cuda-emulation", "--out", str(trace))  # fmt: skip
    replay = json.loads(run([str(memsim), "replay", str(trace), "--profile", "a100-40gb",
                             "--json"]).stdout)  # fmt: skip
    outside = replay["outside_allocator"]
    assert outside["libraries"] == {"gemm": True, "conv": True, "source": "trace", "ranks": 1}
    memest = memsim.parent / "memest"
    est = json.loads(run([str(memest), "estimate", "--trace", str(trace), "--profile", "a100-40gb",
                          "--json"]).stdout)  # fmt: skip
    assert est["outside_allocator"]["total_mib"] * MIB == outside["total_bytes"]
    assert est["outside_allocator"]["libraries"] == outside["libraries"]
    assert est["verdict"]["need_mib"] * MIB == replay["verdict"]["need_bytes"]
    assert est["verdict"]["fits"] == replay["verdict"]["fits"]
