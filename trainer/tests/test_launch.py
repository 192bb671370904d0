"""`launch` (local workers and the submitit array), resume, injected failures, `dataset`."""

from __future__ import annotations

import ast
import csv
import io
import json
import shutil
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, cli

from memtrace_trainer.runs.rundir import write_json

SWEEP = textwrap.dedent(
    """
    family: mlp
    count: 1
    seed: 5
    fields:
      input_size: {min: 8, max: 32}
      output_size: {min: 1, max_ratio: 0.25, of: input_size}
      depth: {min: 1, max: 3}
      architecture: [uniform, pyramid]
    models:
      - {entry: "entry_failures:broken", batch_size: 2}
    run:
      batch_size: {min: 2, max: 8}
      iterations: 2
      device: cpu
    """
)


@pytest.fixture
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Workers are child processes: they find the test entry points through PYTHONPATH.
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)
    return path


def statuses(out: str) -> list[tuple[str, str]]:
    return [(line.split()[1], line.split()[2]) for line in out.splitlines()]


def test_local_launch_resume_and_failure(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    dry = cli("launch", str(sweep), "--out", str(out), "--dry-run")
    listed = statuses(dry.stdout)
    assert [s for _, s in listed] == ["pending"] * 2 and not out.exists()
    ids = [i for i, _ in listed]
    assert ids[1].startswith("entry-failures-broken-b2-")

    first = cli("launch", str(sweep), "--out", str(out), "--workers", "2", check=False)
    assert first.returncode == 1, "a failed run makes the status 1"
    assert "1/2 done (0 present before), 1 failed, 0 remaining" in first.stderr
    failure = json.loads((out / "failed" / f"{ids[1]}.json").read_text())
    assert "injected failure" in failure["error"]
    for run_id in ids[:1]:
        labels = json.loads((out / "runs" / run_id / "labels.json").read_text())
        assert labels["iterations_done"] == 2 and labels["cpu_fallback"] is True
    stamps = {i: (out / "runs" / i / "labels.json").stat().st_mtime_ns for i in ids[:1]}

    assert [s for _, s in statuses(cli("launch", str(sweep), "--out", str(out),
                                       "--dry-run").stdout)] == [
        "present", "failed-before"]  # fmt: skip
    again = cli("launch", str(sweep), "--out", str(out), "--workers", "2", check=False)
    assert "1 present (skipped), 1 to run" in again.stderr
    assert "1/2 done (1 present before), 1 failed, 0 remaining" in again.stderr
    assert stamps == {i: (out / "runs" / i / "labels.json").stat().st_mtime_ns for i in ids[:1]}
    assert (out / "logs" / f"{ids[1]}.log").is_file()

    # Dataset of the sweep: CPU runs are skipped unless asked for, and say so.
    csv_path = tmp_path / "d.csv"
    done = cli("dataset", str(out), "--out", str(csv_path))
    assert "0 runs; skipped 1 CPU-fallback runs" in done.stdout
    cli("dataset", str(out), "--out", str(csv_path), "--include-cpu")
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    assert [r["run_id"] for r in rows] == ids[:1]
    for r in rows:
        feats = json.loads((out / "runs" / r["run_id"] / "features.json").read_text())
        assert ast.literal_eval(r["Activations-Params"]) == [
            tuple(x) for x in feats["gpumemnet_sequence"]
        ]
        assert r["Total Parameters"] == str(feats["total_parameters"])
        assert (r["device"], r["Max GPU Memory (MiB)"], r["Status"]) == ("cpu", "", "SUCCESSFUL")


def test_a_worker_killed_mid_run_is_a_failed_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed without a word (an OOM kill, a segfault) on a fresh output folder: its
    failure is recorded and the queue goes on. The thread that met it died on a missing
    `failed/`, the rest of its queue never ran, and launch exited 0."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    sweep = tmp_path / "crash.yaml"
    spec = 'synthetic:{"family":"mlp","input_size":8,"output_size":2,"depth":1}'
    sweep.write_text(f"models:\n  - {{entry: 'entry_failures:crash', batch_size: 2}}\n"
                     f"  - '{spec}'\nbatch_sizes: [2]\n"
                     "run: {iterations: 1, device: cpu}\n")  # fmt: skip
    out = tmp_path / "out"
    done = cli("launch", str(sweep), "--out", str(out), "--workers", "1", check=False)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "1/2 done (0 present before), 1 failed, 0 remaining" in done.stderr, done.stderr
    (failed,) = (out / "failed").iterdir()
    assert "worker exited with 137" in json.loads(failed.read_text())["error"]


def test_submitit_array_runs_the_same_run_one(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = cli("launch", str(sweep), "--out", str(out), "--backend", "slurm",
               "--submitit-cluster", "debug", "--wait", check=False)  # fmt: skip
    assert done.returncode == 1, "a failed run makes the status 1"
    assert "submitted 2 runs as job array" in done.stderr
    assert "1/2 done (0 present before), 1 failed, 0 remaining" in done.stderr
    jobs = json.loads((out / "submitit" / "jobs.json").read_text())
    assert [j["index"] for j in jobs] == [0, 1]
    assert len(list((out / "runs").iterdir())) == 1 and len(list((out / "failed").iterdir())) == 1
    # Resubmitting sends only what is missing.
    again = cli("launch", str(sweep), "--out", str(out), "--backend", "slurm",
                "--submitit-cluster", "debug", "--wait", check=False)  # fmt: skip
    assert "submitted 1 runs" in again.stderr


def test_launch_errors_are_clean(sweep: Path, tmp_path: Path) -> None:
    def check(args: list[str], msg: str) -> None:
        done = cli("launch", *args, check=False)
        assert done.returncode == 2 and msg in done.stderr, done.stderr

    out = str(tmp_path / "o")
    if shutil.which("sbatch") is None:
        check([str(sweep), "--out", out, "--backend", "slurm"], "no sbatch on PATH")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [torchvision:resnet18]\nrun: {optimizer: lion}\n")
    check([str(bad), "--out", out], "optimizer 'lion'")
    bad.write_text("modles: []\n")
    check([str(bad), "--out", out], "unknown top-level fields ['modles']")
    check([str(tmp_path / "none.yaml"), "--out", out], "No such file")
    for flag, value in [("--workers", "0"), ("--workers", "-1"), ("--timeout-min", "0")]:
        check(
            [str(sweep), "--out", out, f"{flag}={value}"], f"{flag}: {value}: expected at least 1"
        )
    for field, value in [("nvml_hz", "fast"), ("seconds", "abc")]:
        bad.write_text(
            f"models: [torchvision:resnet18]\nbatch_sizes: [2]\nrun: {{{field}: {value}}}\n"
        )
        check([str(bad), "--out", out], f"{field} '{value}': expected")
    assert not Path(out).exists(), "nothing written by a refused launch"
    # Flags the backend does not read are said; --dry-run writes nothing.
    done = cli("launch", str(sweep), "--out", out, "--dry-run", "--partition", "gpu", "--wait")
    for flag in ("--partition", "--wait"):
        assert f"{flag} has no effect: --backend local" in done.stderr, done.stderr


GPU_LABELS = {
    "device": "cuda", "cpu_fallback": False, "oom": False, "torch": "2.4.1", "cuda": "12.2",
    "gpu": "NVIDIA A100-SXM4-40GB", "max_memory_reserved_bytes": 3 * 2**30,
    "max_memory_allocated_bytes": 2**31, "device_peak_bytes": 3 * 2**30 + 500 * 2**20,
    "device_peak_source": "nvml-process", "step_time": {"median_s": 0.25},
}  # fmt: skip


def dataset_row(tmp_path: Path, spec: str, labels: dict, *extra: str) -> dict[str, str]:
    """The `dataset` row of one run directory as a GPU run writes it (labels.json made here:
    no GPU in CI)."""
    out = tmp_path / "runs" / "r1"
    out.parent.mkdir()
    cli("run", "--model", spec, "--batch-size", "2", "--iterations", "1", "--out", str(out),
        *extra)  # fmt: skip
    write_json(out / "labels.json", labels)
    csv_path = tmp_path / "d.csv"
    cli("dataset", str(tmp_path / "runs"), "--out", str(csv_path))
    (row,) = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    return row


@pytest.mark.parametrize(
    ("labels", "expect"),
    [
        (GPU_LABELS, {"Max GPU Memory (MiB)": "3572.0", "Status": "SUCCESSFUL",
                      "max_memory_reserved_mib": "3072.0", "max_memory_allocated_mib": "2048.0",
                      "device_peak_mib": "3572.0", "oom": "false", "profile": "a100-40gb",
                      "gpu": "NVIDIA A100-SXM4-40GB", "step_time_s": "0.250000"}),
        (GPU_LABELS | {"oom": True, "gpu": "NVIDIA H100"},
         {"Max GPU Memory (MiB)": "", "Status": "OOM_CRASH", "oom": "true", "profile": ""}),
    ],
)  # fmt: skip
def test_dataset_row_of_a_gpu_run(tmp_path: Path, labels: dict, expect: dict) -> None:
    spec = 'synthetic:{"family":"cnn","input_channels":3,"num_classes":10,"depth":2,"architecture":"uniform","base_filters":8,"input_size":16}'
    row = dataset_row(tmp_path, spec, labels)
    assert {k: row[k] for k in expect} == expect
    assert row["Conv2d Count"] == "2" and row["Batch Size"] == "2" and row["family"] == "cnn"


def test_dataset_finds_profiles_where_memsim_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row's profile is looked up among memsim's profiles ($MEMTRACE_PROFILES here), not a
    directory of its own."""
    mine = tmp_path / "profiles"
    mine.mkdir()
    (mine / "lab-a100.toml").write_text((REPO / "profiles" / "a100-40gb.toml").read_text())
    monkeypatch.setenv("MEMTRACE_PROFILES", str(mine))
    spec = 'synthetic:{"family":"mlp","input_size":16,"output_size":4,"depth":2}'
    row = dataset_row(tmp_path, spec, GPU_LABELS)
    assert row["profile"] == "lab-a100", row["profile"]


def test_dataset_rows_carry_the_runs_other_settings(tmp_path: Path) -> None:
    """The `job` column holds what else shaped the run (sequence, input shape, checkpointing,
    accumulation), so `memest compare` traces the job that was measured, not the spec's
    defaults; a folder whose path says `partial-` is still read (only `.NAME.partial-*` run
    directories are unfinished)."""
    from memtrace_trainer.runs.dataset import job_cell

    assert job_cell({"seq_len": 32, "checkpointing": True, "grad_accum": 1}) == (
        '{"checkpointing": "full", "seq_len": 32}'
    )
    assert job_cell({"seq_len": None, "checkpointing": False, "grad_accum": 1}) == ""
    root = tmp_path / "partial-data"
    root.mkdir()
    spec = 'synthetic:{"family":"mlp","input_size":16,"output_size":4,"depth":2}'
    row = dataset_row(root, spec, GPU_LABELS, "--grad-accum", "2")
    assert json.loads(row["job"]) == {"grad_accum": 2}


def test_dataset_names_a_damaged_label(tmp_path: Path) -> None:
    """A label of the wrong type (hand-edited, damaged) names the file and the field; it was an
    internal error (`None.get`). A null step time is a label, not damage."""
    spec = 'synthetic:{"family":"mlp","input_size":16,"output_size":4,"depth":2}'
    row = dataset_row(tmp_path, spec, GPU_LABELS | {"step_time": None})
    assert row["step_time_s"] == ""
    labels = tmp_path / "runs" / "r1" / "labels.json"
    for field, value in [("step_time", "fast"), ("device_peak_bytes", "big")]:
        write_json(labels, GPU_LABELS | {field: value})
        done = cli("dataset", str(tmp_path / "runs"), "--out", str(tmp_path / "x.csv"), check=False)
        assert done.returncode == 2, done.stderr
        assert f"{labels}: field '{field}' is '{value}': expected" in done.stderr, done.stderr


def test_sample_says_what_it_does_not_read(tmp_path: Path) -> None:
    """`sample` of a launch sweep draws the generator configs only: the rest is said."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(SWEEP)
    done = cli("sample", str(sweep))
    assert "models, run have no effect on sample" in done.stderr, done.stderr
    sweep.write_text(SWEEP + "modles: []\n")
    done = cli("sample", str(sweep), check=False)
    assert done.returncode == 2 and "unknown top-level fields ['modles']" in done.stderr
