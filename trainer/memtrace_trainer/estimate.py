"""`estimate`: every estimator's answer for one job, through `memest estimate`.

The trainer makes what the Rust side cannot (the symbolic trace, a plain-meta trace for the
FakeTensor baseline, the features) and memest turns them into answers; see estimators/README.md
for its contract.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from memtrace_trainer.binaries import find_binary
from memtrace_trainer.errors import UserError
from memtrace_trainer.features import extract
from memtrace_trainer.profile import load_profile, profile_path
from memtrace_trainer.symtrace.step import StepConfig
from memtrace_trainer.symtrace.tracer import trace_to_file
from memtrace_trainer.workload import Workload

ESTIMATORS = ("symbolic", "fake_tensor", "horus", "analytic", "ml")


def _answer(name: str, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("device_mib"), int | float):
        raise UserError(
            f"memest estimate: field estimates.{name}.device_mib missing or not a number "
            "(expected the contract in estimators/README.md)"
        )
    return {
        "device_mib": float(value["device_mib"]),
        "reserved_mib": value.get("reserved_mib"),
        "level": value.get("level"),
    }


def parse_memest(text: str) -> dict[str, Any]:
    """Checks memest's JSON against the contract and keeps what the trainer reports."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"memest estimate: output is not JSON ({e})") from None
    estimates = data.get("estimates") if isinstance(data, dict) else None
    if not isinstance(estimates, dict):
        raise UserError("memest estimate: output has no `estimates` object")
    for name in ("symbolic", "horus", "analytic"):
        if estimates.get(name) is None:
            why = data.get("unavailable", {}).get(name, "no reason given")
            raise UserError(f"memest estimate: estimates.{name} is missing ({why})")
    answers = {name: _answer(name, estimates.get(name)) for name in ESTIMATORS}
    for name, value in estimates.items():
        if name not in answers:
            answers[name] = _answer(name, value)
    return {
        "estimates": answers,
        "seconds": dict(data.get("seconds", {})),
        "unavailable": dict(data.get("unavailable", {})),
        "oom_predicted": data.get("oom_predicted"),
        "gpu_total_mib": data.get("gpu_total_mib"),
        "family": data.get("family"),
    }


def estimate(
    workload_for: Any,
    step: StepConfig,
    profile: str,
    ml_model: Path | None,
    log: Any = None,
) -> dict[str, Any]:
    """`workload_for()` builds a fresh meta workload (each trace consumes one)."""
    memest = find_binary("memest")
    if log:
        log(f"memest: {memest.describe()}")
    prof = load_profile(profile)
    seconds: dict[str, float] = {}
    ml_model = ml_model or (
        Path(os.environ["MEMTRACE_ML_MODEL"]) if os.environ.get("MEMTRACE_ML_MODEL") else None
    )
    with tempfile.TemporaryDirectory(prefix="memtrace-estimate-") as tmp:
        d = Path(tmp)
        t = time.perf_counter()
        workload: Workload = workload_for()
        with torch.device("meta"):
            feats = extract(workload, workload.family)
        # memest reads the layers in execution order from `sequence`.
        data = {"model": workload.spec, **feats.to_json()}
        (d / "features.json").write_text(json.dumps(data))
        seconds["features"] = time.perf_counter() - t
        t = time.perf_counter()
        trace_to_file(workload_for(), step, prof, d / "symbolic.jsonl")
        seconds["trace_symbolic"] = time.perf_counter() - t
        t = time.perf_counter()
        plain = StepConfig(step.optimizer, 1, step.amp, step.checkpointing, step.grad_accum, False)
        trace_to_file(workload_for(), plain, prof, d / "plain.jsonl")
        seconds["trace_fake_tensor"] = time.perf_counter() - t
        cmd = [
            str(memest.path),
            "estimate",
            "--trace",
            str(d / "symbolic.jsonl"),
            "--features",
            str(d / "features.json"),
            "--fake-trace",
            str(d / "plain.jsonl"),
            "--profile",
            str(profile_path(profile)),
            "--json",
        ]
        if ml_model is not None:
            cmd += ["--ml-model", str(ml_model)]
        t = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        seconds["memest"] = time.perf_counter() - t
    if done.returncode != 0:
        raise UserError(f"memest estimate failed ({done.returncode}): {done.stderr.strip()}")
    result = parse_memest(done.stdout)
    result["seconds"] = {**seconds, **{f"memest.{k}": v for k, v in result["seconds"].items()}}
    result["binary"] = {"memest": str(memest.path), "source": memest.source}
    result["profile"] = profile
    result["model"] = workload.spec
    result["batch_size"] = workload.batch_size
    return result


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{result['model']} at batch {result['batch_size']} on profile {result['profile']} "
        f"(memest: {result['binary']['memest']}, from {result['binary']['source']})",
        f"{'estimator':<12} {'MiB':>12} {'reserved MiB':>13}  level",
    ]
    for name, ans in result["estimates"].items():
        if ans is None:
            why = result["unavailable"].get(name, "not available")
            lines.append(f"{name:<12} {'-':>12} {'-':>13}  ({why})")
        else:
            res = ans["reserved_mib"]
            lines.append(
                f"{name:<12} {ans['device_mib']:>12.1f} "
                f"{'-' if res is None else f'{res:.1f}':>13}  {ans['level'] or ''}"
            )
    if result.get("oom_predicted"):
        lines.append("symbolic: this job would run out of memory on the profile's GPU")
    return "\n".join(lines)
