"""`run` without a GPU: the CPU fallback through the same code paths, OOM as a label, the
run directory, `--trace` under the real shim, the NVML sampler and the markers."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, cli

from memtrace_trainer.errors import UserError
from memtrace_trainer.runs.config import RunConfig
from memtrace_trainer.runs.marks import Marker
from memtrace_trainer.runs.nvml import Sampler

MLP = 'synthetic:{"family":"mlp","input_size":16,"output_size":4,"depth":2,"dropout":0.1,"batchnorm":true}'
PHASES = ["phase:data", "phase:forward", "phase:backward", "phase:optimizer"]


def run_dir(tmp_path: Path, *args: str) -> tuple[Path, dict[str, Any], str]:
    out = tmp_path / "run"
    done = cli("run", *args, "--out", str(out))
    return out, json.loads((out / "labels.json").read_text()), done.stderr


def test_cpu_fallback_writes_a_full_run_directory(tmp_path: Path) -> None:
    out, labels, stderr = run_dir(
        tmp_path, "--model", MLP, "--batch-size", "4", "--iterations", "3"
    )
    assert "CPU FALLBACK" in stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "features.json", "labels.json"]
    assert labels["cpu_fallback"] is True and labels["device"] == "cpu"
    assert "torch.cuda.is_available() is False" in labels["cpu_fallback_reason"]
    for key in ("max_memory_reserved_bytes", "max_memory_allocated_bytes", "memory_stats",
                "device_peak_bytes", "gpu"):  # fmt: skip
        assert labels[key] is None, key  # null, never a fake zero
    assert labels["oom"] is False and labels["iterations_done"] == 3
    assert len(labels["step_time"]["all_s"]) == 3 and labels["step_time"]["median_s"] > 0
    config = json.loads((out / "config.json").read_text())
    assert (
        config["id"]
        == RunConfig.from_dict(
            {k: v for k, v in config.items() if k not in ("id", "trainer")}, "test"
        ).id
    )
    feats = json.loads((out / "features.json").read_text())
    # 16 -> 10 -> 4 (pyramid, 2 Linear layers) with batch norm: parameters counted on meta.
    assert feats["family"] == "mlp" and feats["total_parameters"] > 0
    assert feats["gpumemnet_row"]["Batch Size"] == "4"


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_a_profile_on_the_cpu_is_said_not_measured(tmp_path: Path, device: str) -> None:
    """`run --profile h200` fell back to the CPU and recorded the profile without a word."""
    args = ["--model", MLP, "--batch-size", "2", "--iterations", "1", "--device", device]
    _, labels, stderr = run_dir(tmp_path, *args, "--profile", "h200")
    assert labels["cpu_fallback"] is True
    assert "warning: --profile h200 was not measured: the run trained on the CPU" in stderr
    _, _, stderr = run_dir(tmp_path / "plain", *args)
    assert "--profile" not in stderr, stderr


def test_seconds_budget_and_training_variants(tmp_path: Path) -> None:
    _, labels, _ = run_dir(
        tmp_path, "--model", MLP, "--batch-size", "4", "--seconds", "0.2", "--amp", "bf16",
        "--grad-accum", "2", "--optimizer", "sgd-momentum", "--device", "cpu",
    )  # fmt: skip
    assert (
        labels["iterations_done"] >= 2 and labels["cpu_fallback_reason"] == "--device cpu requested"
    )
    # --iterations beside --seconds is said to have no effect; a default never is.
    (tmp_path / "b").mkdir()
    _, _, stderr = run_dir(tmp_path / "b", "--model", MLP, "--batch-size", "2", "--seconds", "0.1",
                           "--iterations", "5", "--device", "cpu")  # fmt: skip
    assert "--iterations 5 has no effect: --seconds 0.1 decides" in stderr, stderr
    assert "--num-classes" not in stderr, "a default is not a flag given"


def test_an_out_under_missing_folders_creates_them(tmp_path: Path) -> None:
    """README's `run ... --out runs/r50` in a checkout without `runs/` was refused."""
    out = tmp_path / "runs" / "deeper" / "r"
    cli("run", "--model", MLP, "--batch-size", "2", "--iterations", "1", "--device", "cpu",
        "--out", str(out))  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "features.json", "labels.json"]
    assert list((tmp_path / "runs").iterdir()) == [out.parent]  # no partial folder left beside
    (tmp_path / "file").write_text("")
    done = cli("run", "--model", MLP, "--batch-size", "2", "--out", str(tmp_path / "file" / "r"),
               check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"--out {tmp_path / 'file' / 'r'}: {tmp_path / 'file'} is not a directory" in done.stderr


def test_oom_is_a_label_not_a_crash(tmp_path: Path) -> None:
    _, labels, stderr = run_dir(tmp_path, "--entry", "entry_failures:oom", "--batch-size", "2")
    assert labels["oom"] is True and labels["iterations_done"] == 0
    assert labels["oom_detail"]["phase"] == "forward"
    assert "CUDA out of memory" in labels["oom_detail"]["message"]
    assert "recorded as a label" in stderr


def test_errors_are_clean_and_leave_nothing(tmp_path: Path) -> None:
    def check(args: list[str], msg: str) -> None:
        done = cli("run", *args, check=False)
        assert done.returncode == 2 and msg in done.stderr, done.stderr

    out = tmp_path / "r"
    check(["--model", MLP, "--out", str(out)], "--batch-size is required")
    # An entry that takes `batch_size` too, as `estimate --entry` refuses it: it trained at
    # batch 1 in silence, and named the run "b1" whatever its real batch.
    check(["--entry", "entry_failures:sized", "--out", str(out)],
          "--batch-size is required with --entry entry_failures:sized")  # fmt: skip
    check(["--model", MLP, "--batch-size", "2", "--device", "cuda", "--out", str(out)],
          "--device cuda: no CUDA device")  # fmt: skip
    check(["--model", MLP, "--batch-size", "2", "--nvml-hz", "2", "--out", str(out)], "nvml_hz")
    check(["--entry", "entry_failures:broken", "--batch-size", "2", "--out", str(out)],
          "injected failure")  # fmt: skip
    # The folders made for a run that fails go with it.
    check(["--entry", "entry_failures:broken", "--batch-size", "2", "--out",
           str(tmp_path / "new" / "r")], "injected failure")  # fmt: skip
    # Accepted silently before: a batch of 0 trained at 1, an unknown profile was recorded, a
    # shape the generator's MLP cannot take failed inside torch.
    check(
        ["--model", MLP, "--batch-size", "0", "--out", str(out)],
        "--batch-size 0: expected a positive integer",
    )
    check(["--model", MLP, "--batch-size", "2", "--profile", "no-such-gpu", "--out", str(out)],
          "--profile no-such-gpu: profile \"no-such-gpu\" not found")  # fmt: skip
    check(["--model", MLP, "--batch-size", "2", "--input-shape", "3,9,9", "--out", str(out)],
          "--input-shape 3,9,9: " + MLP + " takes inputs of shape 16")  # fmt: skip
    assert list(tmp_path.iterdir()) == []  # no partial run directory left behind
    out.mkdir()
    (out / "x").write_text("")
    check(["--model", MLP, "--batch-size", "2", "--out", str(out)], "exists and is not empty")


def test_trace_wraps_itself_twice_under_the_shim(tmp_path: Path) -> None:
    memsim = REPO / "target" / "release" / "memsim"
    shim = REPO / "target" / "release" / "libmemtrace.so"
    for path in (memsim, shim):
        if not path.is_file():
            pytest.fail(f"{path} missing: run `cargo build --release` first")
    out, labels, stderr = run_dir(tmp_path, "--model", MLP, "--batch-size", "2", "--iterations",
                                  "2", "--trace", "--device", "cpu")  # fmt: skip
    assert "device-level run" in stderr and "allocator-level run" in stderr
    assert labels["shim_markers"] is True and labels["markers_sent"] == 10
    for level, caching in (("device", True), ("allocator", False)):
        lab = json.loads((out / "traces" / f"{level}.labels.json").read_text())
        assert lab["caching_allocator"] is caching
        jsonl = tmp_path / f"{level}.jsonl"
        subprocess.run([str(memsim), "convert", str(out / "traces" / f"{level}.mtrace"),
                        str(jsonl)], check=True, capture_output=True)  # fmt: skip
        records = [json.loads(x) for x in jsonl.read_text().splitlines()]
        header = records[0]
        assert header["kind"] == "header" and header["caching_disabled"] is (not caching)
        marks = [r["text"] for r in records if r["kind"] == "marker"]
        assert marks == ["iter:0", *PHASES, "iter:1", *PHASES]


def test_marker_is_inactive_without_the_shim() -> None:
    m = Marker()
    assert m.active is False
    m.iteration(0)
    m.phase("forward")
    assert m.sent == []
    with pytest.raises(ValueError, match="phase 'lunch'"):
        m.phase("lunch")


class ScriptedNvml:
    """Readings in order, then the last one forever; counts calls."""

    def __init__(self, readings: list[tuple[int | None, int]]) -> None:
        self.readings = readings
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self) -> tuple[int | None, int]:
        with self.lock:
            i = min(self.calls, len(self.readings) - 1)
            self.calls += 1
            if self.readings[i] == (-1, -1):
                raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
            return self.readings[i]


@pytest.mark.parametrize(
    ("readings", "peak", "source"),
    [
        ([(None, 500), (100, 700), (300, 900), (200, 800)], 300, "nvml-process"),
        ([(None, 500), (None, 1500), (None, 800)], 1500, "nvml-device"),
        ([(None, 500), (-1, -1), (None, 600)], 600, "nvml-device"),
    ],
)
def test_nvml_sampler_keeps_peaks(readings: list, peak: int, source: str) -> None:
    read = ScriptedNvml(readings)
    sampler = Sampler(read, interval=0.01)
    with sampler:
        while read.calls < len(readings) + 2:
            threading.Event().wait(0.01)
    got = sampler.peaks
    assert got.peak() == (peak, source)
    assert got.device_baseline == 500 and got.samples >= len(readings)
    assert got.hz > 10
    assert got.errors == (["RuntimeError: NVML_ERROR_GPU_IS_LOST"] if (-1, -1) in readings else [])


def test_sampler_refuses_less_than_10_hz() -> None:
    with pytest.raises(ValueError, match=r"at least 10\.0 Hz"):
        Sampler(lambda: (None, 0), interval=0.5)


def test_a_default_class_count_keeps_the_run_id_it_had() -> None:
    """`num_classes` defaults to the model's own now (it was 1000): a run that left it out keeps
    the id it was written under, so `launch` still finds it finished."""
    plain = RunConfig(model=MLP, batch_size=2)
    assert plain.num_classes is None
    assert plain.id == RunConfig(model=MLP, batch_size=2, num_classes=1000).id
    assert plain.id != RunConfig(model=MLP, batch_size=2, num_classes=10).id


@pytest.mark.parametrize(
    ("model", "built_with"),
    [
        ("hf:bert-base-uncased", lambda m: m.config.num_labels),
        ("torchvision:resnet18", lambda m: m.fc.out_features),
    ],
)
def test_a_left_out_class_count_is_hashed_as_the_one_the_model_is_built_with(
    model: str, built_with: Any
) -> None:
    """A Hugging Face classifier left without num_classes trains 2 classes, but its id was that
    of a run of 1000: `launch` skipped one of the two as the other's, and a sweep of both was
    refused as one run twice."""
    from memtrace_trainer.models.zoo import build_workload

    classes = built_with(
        build_workload(model, 2, seq_len=8 if model.startswith("hf:") else None).model
    )
    plain = RunConfig(model=model, batch_size=2)
    assert plain.id == RunConfig(model=model, batch_size=2, num_classes=classes).id
    for other in {2, 1000} - {classes}:
        assert plain.id != RunConfig(model=model, batch_size=2, num_classes=other).id


def test_a_model_config_without_a_batch_size_is_refused() -> None:
    """The config's batch size defaulted to 1: a `--from-config` of a model without one
    trained at batch 1 in silence. None is now an entry's own batch, and a model has none."""
    with pytest.raises(UserError, match="batch_size null: expected an integer of at least 1"):
        RunConfig.from_dict({"model": MLP}, "c.json")
    assert RunConfig(entry="entry_example:fixed_batch").problems() == []


@pytest.mark.parametrize(("field", "said"), [("seconds", "finite"), ("nvml_hz", "finite")])
def test_an_infinite_number_is_refused(field: str, said: str) -> None:
    """`run --seconds inf` trained forever (a sweep's run never finished), `--nvml-hz inf`
    sampled with no pause: both passed the check of a positive number."""
    problems = RunConfig(model=MLP, batch_size=2, **{field: float("inf")}).problems()
    assert problems == [f"{field} inf: " + problems[0].split(": ", 1)[1]] and said in problems[0]
    done = cli("run", "--model", MLP, "--batch-size", "2", f"--{field.replace('_', '-')}", "inf",
               "--out", "/nonexistent/r", check=False)  # fmt: skip
    assert done.returncode == 2 and f"{field} inf: expected" in done.stderr, done.stderr


def test_a_model_that_reads_no_class_count_keeps_its_id() -> None:
    """A language model reads no num_classes: its id is the one it had before classifier
    counts were resolved (a sweep's finished runs are found, not run again)."""
    assert RunConfig(model="hf:gpt2", batch_size=2).id == "hf-gpt2-b2-343af201398f"
    assert RunConfig(model="hf:gpt2", batch_size=2, num_classes=1000).id.endswith("343af201398f")


def test_run_entry_says_the_flags_it_does_not_read(tmp_path: Path) -> None:
    """As symtrace: --input-shape and --num-classes have no effect with --entry, and --seq-len
    reaches an entry that takes `seq_len` (it was dropped without a word)."""
    out, _, stderr = run_dir(tmp_path, "--entry", "entry_failures:sized", "--batch-size", "2",
                             "--seq-len", "6", "--input-shape", "3,4,4", "--num-classes", "5",
                             "--iterations", "1", "--device", "cpu")  # fmt: skip
    for flag in ("--input-shape 3,4,4", "--num-classes 5"):
        assert f"{flag} has no effect with --entry" in stderr, stderr
    assert "--seq-len" not in stderr
    # sized(seq_len=6) embeds 6 tokens of 8 into Linear(8 * 6, 2).
    feats = json.loads((out / "features.json").read_text())
    assert feats["total_parameters"] == 50 * 8 + 8 * 6 * 2 + 2
    (tmp_path / "b").mkdir()
    _, _, stderr = run_dir(tmp_path / "b", "--entry", "entry_failures:oom", "--batch-size", "2",
                           "--seq-len", "6")  # fmt: skip
    assert "--seq-len 6 has no effect: entry_failures:oom takes no `seq_len`" in stderr, stderr


def test_a_default_sequence_length_is_said_and_recorded(tmp_path: Path) -> None:
    """`run --model hf:...` without --seq-len trained at the model's default length and wrote
    only `seq_len: null`."""
    spec = f"hf-config:{Path(__file__).parent / 'hf_configs' / 'tiny-llama.json'}"
    out, _, stderr = run_dir(tmp_path, "--model", spec, "--batch-size", "1", "--iterations",
                             "1", "--device", "cpu")  # fmt: skip
    assert "note: seq_len = 256 (max_position_embeddings, the model's maximum" in stderr, stderr
    feats = json.loads((out / "features.json").read_text())
    assert feats["defaults"]["seq_len"]["value"] == 256
    assert json.loads((out / "config.json").read_text())["seq_len"] is None
    (tmp_path / "b").mkdir()
    out, _, stderr = run_dir(tmp_path / "b", "--model", spec, "--batch-size", "1", "--seq-len",
                             "8", "--iterations", "1", "--device", "cpu")  # fmt: skip
    assert "seq_len" not in json.loads((out / "features.json").read_text()).get("defaults", {})
    assert "note: seq_len" not in stderr


@pytest.mark.parametrize(
    ("times", "median", "mean", "note"),
    [
        ([0.5], None, None, True),
        ([], None, None, False),
        ([0.5, 0.1], 0.1, 0.1, False),
        ([0.5, 0.1, 0.3, 0.2], 0.2, 0.2, False),
    ],
)
def test_step_time_leaves_out_the_first_step(
    times: list[float], median: float | None, mean: float | None, note: bool
) -> None:
    """With one step there is no steady state: median and mean are null, with a note (they
    were the first step's own time)."""
    from memtrace_trainer.runs.train import _step_time

    got = _step_time(times)
    assert got["median_s"] == pytest.approx(median) and got["mean_s"] == pytest.approx(mean)
    assert got["first_s"] == (times[0] if times else None) and got["all_s"] == times
    assert ("note" in got) is note


def test_one_iteration_run_has_a_null_steady_step_time(tmp_path: Path) -> None:
    _, labels, stderr = run_dir(tmp_path, "--model", MLP, "--batch-size", "2", "--iterations",
                                "1", "--device", "cpu")  # fmt: skip
    step = labels["step_time"]
    assert step["median_s"] is None and step["mean_s"] is None and step["first_s"] > 0
    assert "one step only" in step["note"] and "note: step_time: one step only" in stderr


def test_an_out_that_is_a_file_is_named(tmp_path: Path) -> None:
    """It was 'the run failed: NotADirectoryError'."""
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    done = cli("run", "--model", MLP, "--batch-size", "2", "--out", str(afile), check=False)
    assert done.returncode == 2, done.stderr
    assert f"--out {afile}: exists and is not a directory" in done.stderr
    assert "NotADirectoryError" not in done.stderr and afile.read_text() == "keep me"


def test_an_nvml_rate_on_a_cpu_run_is_said_to_have_no_effect(tmp_path: Path) -> None:
    """NVML samples a GPU: --nvml-hz on a run that trained on the CPU was taken in silence."""
    _, _, stderr = run_dir(tmp_path, "--model", MLP, "--batch-size", "2", "--iterations", "2",
                           "--nvml-hz", "50")  # fmt: skip
    assert "--nvml-hz 50 has no effect: the run trained on the CPU" in stderr, stderr
    _, _, stderr = run_dir(tmp_path / "b", "--model", MLP, "--batch-size", "2", "--iterations", "2")
    assert "--nvml-hz" not in stderr, stderr
