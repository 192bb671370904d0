"""The FakeTensor baseline: a hand-counted step, bounds, and agreement with the plain-meta
symbolic trace that memest reads for the same baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import cli

from memtrace_trainer.fake_tensor import measure, workload_builder
from memtrace_trainer.models.zoo import build_workload
from memtrace_trainer.profile import load_profile
from memtrace_trainer.symtrace.step import StepConfig
from memtrace_trainer.symtrace.tracer import summarize, trace

MLP = 'synthetic:{"family":"mlp","input_size":64,"output_size":10,"depth":3,"dropout":0.2,"batchnorm":true}'
CNN = 'synthetic:{"family":"cnn","input_channels":3,"num_classes":10,"depth":3,"architecture":"residual","base_filters":8,"input_size":16,"batchnorm":true}'


def fake(config: dict[str, Any]) -> dict[str, Any]:
    args = [a for k, v in config.items() for a in ("--" + k.replace("_", "-"), str(v))]
    return json.loads(cli("fake-tensor", *args, "--json").stdout)


def test_hand_counted_step() -> None:
    """Linear(8, 4, bias=False) at batch 2, loss = out.sum(), fp32:
    W 128 + x 64 + y 8 (the batch's copy) + out 32 + loss 4 = 236 after forward; the grad seed
    (4) and dW (128, computed in W's layout, so AccumulateGrad keeps it) peak at 368; the seed
    dies with backward(): 364."""
    got = fake({"entry": "entry_example:linear_sum", "batch_size": 2})
    assert (got["peak_bytes"], got["after_forward_bytes"], got["after_backward_bytes"]) == (
        368, 236, 364)  # fmt: skip
    assert got["seconds"] > 0


def test_a_batch_line_of_an_entry_of_its_own_batch_runs(tmp_path: Path) -> None:
    """A `--batch` line of an entry without a `batch_size` parameter needs none (its batch is
    the job's); one of an entry that takes it is refused in the line's own terms."""
    lines = tmp_path / "b.jsonl"
    lines.write_text('{"entry": "entry_example:fixed_batch"}\n')
    done = cli("fake-tensor", "--batch", str(lines))
    assert json.loads(done.stdout)["peak_bytes"] > 0, done.stderr
    lines.write_text('{"entry": "entry_example:make"}\n')
    done = cli("fake-tensor", "--batch", str(lines), check=False)
    assert done.returncode == 2 and "field 'batch_size' is required with field 'entry'" in (
        done.stderr), done.stderr  # fmt: skip


def plain_events(spec: str, batch: int) -> list[dict[str, Any]]:
    cfg = StepConfig(cuda_emulation=False, iterations=1)
    rec, _ = trace(build_workload(spec, batch), cfg, load_profile(None))
    return rec.events


def forward_backward_peak(events: list[dict[str, Any]]) -> int:
    """memest's reading of a plain trace: live bytes until the first optimizer phase."""
    live = peak = 0
    for e in events:
        if e.get("text") == "phase:optimizer":
            break
        live += e["size"] if e["kind"] == "alloc" else -e["size"] if e["kind"] == "free" else 0
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("spec", [MLP, CNN, "torchvision:resnet18"])
def test_agrees_with_plain_symbolic_trace_and_bounds(spec: str) -> None:
    batch = 4
    build, what = workload_builder({"model": spec, "batch_size": batch})
    got = measure(build, what)
    events = plain_events(spec, batch)
    # Two mechanisms (FakeTensorMode on a fake CPU vs our recorder on meta), one answer.
    assert got.peak_bytes == forward_backward_peak(events)
    # No optimizer step: never above the whole step's live peak (Adam state included).
    assert got.peak_bytes <= summarize(events).peak_live_bytes
    w = build_workload(spec, batch)
    params = 4 * sum(p.numel() for p in w.model.parameters())
    inputs, target = w.make_batch()
    batch_bytes = inputs.nbytes + target.nbytes
    logits = 4 * batch * (10 if spec != "torchvision:resnet18" else 1000)
    assert got.after_forward_bytes >= params + batch_bytes + logits
    assert got.after_backward_bytes >= 2 * params + batch_bytes  # parameters and gradients
    assert got.peak_bytes >= max(got.after_forward_bytes, got.after_backward_bytes)


def test_gpumemnet_row_and_batch_mode(tmp_path: Path) -> None:
    row = "input:20_output:3_depth:2_arch:pyramid_batch:64.out"
    single = fake({"gpumemnet_row": row})
    configs = tmp_path / "c.jsonl"
    configs.write_text(
        json.dumps({"gpumemnet_row": row, "name": "a"}) + "\n"
        + json.dumps({"model": "nope:x", "batch_size": 2, "name": "b"}) + "\n"
        + json.dumps({"gpumemnet_row": row, "batch_size": 128}) + "\n"
    )  # fmt: skip
    done = cli("fake-tensor", "--batch", str(configs), check=False)
    # One of three failed: exit 1, said on stderr (2 only when every config failed).
    assert done.returncode == 1 and "1 of 3 configs failed (b)" in done.stderr
    lines = [json.loads(x) for x in done.stdout.splitlines()]
    assert lines[0]["name"] == "a" and lines[0]["peak_bytes"] == single["peak_bytes"]
    assert "unknown model spec" in lines[1]["error"]
    assert lines[2]["name"] == "config-00003" and lines[2]["peak_bytes"] > single["peak_bytes"]


def test_errors_are_clean(tmp_path: Path) -> None:
    def check(args: list[str], msg: str) -> None:
        done = cli("fake-tensor", *args, check=False)
        assert done.returncode == 2 and msg in done.stderr, done.stderr

    check(["--model", MLP], "--batch-size is required")
    check(["--entry", "entry_failures:broken", "--batch-size", "2"], "injected failure")
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"modle": "x"}\n')
    check(["--batch", str(bad)], "unknown fields ['modle']")
