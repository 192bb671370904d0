"""Across components: a user's training step, traced symbolically by the trainer, read by memsim.

The expectations come from the model itself (parameter shapes) and the allocator's rounding rule
(512-byte blocks), not from earlier outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from e2e_models import tiny_mlp
from e2e_support import PYTHON, REPO, run


def _round512(n: int) -> int:
    return max(512, (n + 511) // 512 * 512)


def _symtrace(tmp: Path, env: dict[str, str], out: str, *extra: str) -> Path:
    path = tmp / out
    run(
        [
            PYTHON,
            "-m",
            "memtrace_trainer",
            "symtrace",
            "--entry",
            "e2e_models:tiny_mlp",
            "--batch-size",
            "16",
            "--optimizer",
            "adam",
            "--iterations",
            "2",
            *extra,
            "--out",
            str(path),
        ],
        env,
    )
    return path


def _json(cmd: list[str]) -> dict:
    return json.loads(run(cmd).stdout)


def test_replay_sees_every_parameter_and_adam_state(
    tmp_path: Path, memsim: Path, trainer_env: dict[str, str]
) -> None:
    trace = _symtrace(tmp_path, trainer_env, "mlp.jsonl", "--no-cuda-emulation")
    report = _json([str(memsim), "replay", str(trace), "--json"])
    model, _, _ = tiny_mlp()
    param_blocks = sum(_round512(p.numel() * p.element_size()) for p in model.parameters())
    cats = report["devices"][0]["categories_at_peak"]
    assert cats["parameter"] == param_blocks
    # Adam keeps exp_avg and exp_avg_sq per parameter (plus 4-byte step counters): at least twice
    # the parameter blocks once the first step has run.
    assert report["memory_stats"]["allocated_bytes.all.peak"] >= 3 * param_blocks
    assert (
        report["peak_reserved_bytes"]
        >= report["peak_allocated_bytes"]
        >= report["peak_active_bytes"]
        > 0
    )
    assert report["peak_reserved_bytes"] % (2 << 20) == 0
    assert report["oom"] is False and report["rejected"] == 0


def _convert(memsim: Path, trace: Path, suffix: str) -> Path:
    """`memsim convert` of `trace` to the form of `suffix`, beside it."""
    out = trace.with_suffix(suffix)
    run([str(memsim), "convert", str(trace), str(out)])
    return out


def test_native_and_jsonl_traces_agree(
    tmp_path: Path, memsim: Path, trainer_env: dict[str, str]
) -> None:
    jsonl = _symtrace(tmp_path, trainer_env, "a.jsonl")
    native = _convert(memsim, jsonl, ".mtrace")
    a = _json([str(memsim), "stats", str(jsonl), "--json"])
    b = _json([str(memsim), "stats", str(native), "--json"])
    for key in ["events", "allocs", "frees", "peak_live_device_bytes", "calls"]:
        assert a[key] == b[key], key
    assert a["allocs"] > 0 and a["truncated"] is False
    # Live bytes never go negative, and every allocation is freed or still live at the end.
    assert a["unknown_frees"] == 0


def test_symtrace_writes_native_through_memsim(
    tmp_path: Path, memsim: Path, trainer_env: dict[str, str]
) -> None:
    native = _symtrace(tmp_path, trainer_env, "direct.mtrace")
    assert native.read_bytes()[:8] == b"MEMTRACE"
    stats = _json([str(memsim), "stats", str(native), "--json"])
    assert stats["allocs"] > 0


def test_capacity_below_the_peak_ooms(
    tmp_path: Path, memsim: Path, trainer_env: dict[str, str]
) -> None:
    trace = _symtrace(tmp_path, trainer_env, "oom.jsonl")
    peak = _json([str(memsim), "replay", str(trace), "--json"])["peak_reserved_bytes"]
    # Without a profile the capacity is the allocator's alone (memsim warns so); exit 1 is
    # "does not fit".
    cmd = [str(memsim), "replay", str(trace), "--json", "--capacity"]
    below = run([*cmd, str(peak - (2 << 20))], codes=(1,))
    assert "without --profile" in below.stderr
    below_v = json.loads(below.stdout)
    at = _json([*cmd, str(peak)])
    assert below_v["oom"] is True and isinstance(below_v["oom_at_event"], int)
    assert below_v["verdict"]["fits"] is False
    assert at["oom"] is False and at["verdict"]["fits"] is True


def test_memory_viz_opens_the_export(
    tmp_path: Path, memsim: Path, trainer_env: dict[str, str]
) -> None:
    trace = _symtrace(tmp_path, trainer_env, "viz.jsonl")
    pickle = _convert(memsim, trace, ".pickle")
    out = run([PYTHON, "-m", "torch.cuda._memory_viz", "stats", str(pickle)]).stdout
    reserved = _json([str(memsim), "replay", str(trace), "--json"])["memory_stats"][
        "reserved_bytes.all.current"
    ]
    mib = reserved / (1 << 20)
    assert f"total_reserved: {mib:.1f}MiB" in out, out


def test_schema_validates_symtrace_output(tmp_path: Path, trainer_env: dict[str, str]) -> None:
    schema_path = REPO / "trace" / "schema" / "trace.schema.json"
    assert schema_path.is_file(), f"{schema_path} is missing"
    schema = json.loads(schema_path.read_text())
    trace = _symtrace(tmp_path, trainer_env, "schema.jsonl")
    validator = jsonschema.Draft202012Validator(schema)
    for n, line in enumerate(trace.read_text().splitlines(), 1):
        errors = list(validator.iter_errors(json.loads(line)))
        assert not errors, f"line {n}: {errors[0].message}"
