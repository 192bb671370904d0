"""`launch` (local workers and the submitit array), resume, injected failures, `dataset`."""

from __future__ import annotations

import ast
import csv
import io
import json
import math
import shutil
import textwrap
from pathlib import Path

import pytest
from conftest import GPU_LABELS, REPO, cli

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
    # Each failure's cause in the summary, one line; a sweep all on the CPU says so.
    cause = failure["error"].splitlines()[0]
    assert f"launch: failed {ids[1]}: {cause}" in first.stderr.splitlines(), first.stderr
    # One run, said as one: "all 1 finished runs", "1 runs failed".
    assert "the one finished run in" in first.stderr and "CPU FALLBACK" in first.stderr
    assert "its CUDA labels are null, and `dataset` leaves it out" in first.stderr
    assert "warning: 1 run failed: see" in first.stderr, first.stderr
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

    # Dataset of the sweep: CPU runs are skipped unless asked for; a header alone is not
    # written (every reader refuses it), and a directory is no CSV.
    csv_path = tmp_path / "d.csv"
    done = cli("dataset", str(out), "--out", str(csv_path), check=False)
    assert done.returncode == 2 and "its one run is a CPU-fallback run" in done.stderr, done.stderr
    assert not csv_path.exists()
    done = cli("dataset", str(out), "--out", str(tmp_path), check=False)
    assert done.returncode == 2 and "is a directory; expected the CSV file" in done.stderr
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
    assert "submitted 1 run as job array" in again.stderr


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
        # A GPU named with its index is a GPU run, not a CPU fallback left out of the table.
        (GPU_LABELS | {"device": "cuda:0"},
         {"device": "cuda", "Status": "SUCCESSFUL", "device_peak_mib": "3572.0"}),
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
    """A label of the wrong type or value (hand-edited, damaged) names the file and the field;
    it was an internal error (`None.get`), an OOM (`bool("false")`), or a nan, inf or -0.0 cell
    that made `memest compare` refuse the whole table. A null step time is a label, not damage."""
    spec = 'synthetic:{"family":"mlp","input_size":16,"output_size":4,"depth":2}'
    row = dataset_row(tmp_path, spec, GPU_LABELS | {"step_time": None})
    assert row["step_time_s"] == ""
    labels = tmp_path / "runs" / "r1" / "labels.json"
    for field, value in [("step_time", "fast"), ("device_peak_bytes", "big"), ("oom", "false"),
                         ("oom", 0), ("device_peak_bytes", math.nan),
                         ("device_peak_bytes", math.inf), ("device_peak_bytes", -5),
                         ("device_peak_bytes", 0), ("max_memory_reserved_bytes", -1),
                         ("device", None)]:  # fmt: skip
        write_json(labels, GPU_LABELS | {field: value})
        done = cli("dataset", str(tmp_path / "runs"), "--out", str(tmp_path / "x.csv"), check=False)
        assert done.returncode == 2, done.stderr
        assert f"{labels}: field '{field}' is {value!r}: expected" in done.stderr, done.stderr
        assert not (tmp_path / "x.csv").exists()


def test_sample_says_what_it_does_not_read(tmp_path: Path) -> None:
    """`sample` of a launch sweep draws the generator configs only: the rest is said."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(SWEEP)
    done = cli("sample", str(sweep))
    assert "models, run have no effect on sample" in done.stderr, done.stderr
    sweep.write_text(SWEEP.split("models:")[0] + "run: {iterations: 2}\n")  # run alone
    done = cli("sample", str(sweep))
    assert ": run has no effect on sample" in done.stderr, done.stderr
    sweep.write_text(SWEEP + "modles: []\n")
    done = cli("sample", str(sweep), check=False)
    assert done.returncode == 2 and "unknown top-level fields ['modles']" in done.stderr


MLP_FIELDS = "  input_size: 16\n  output_size: 2\n  depth: 2\n"


def test_sample_output_round_trips_as_a_synthetic_spec(tmp_path: Path) -> None:
    """A line `sample` prints carries its config's id: `synthetic:LINE` is that config (it was
    refused, 'unknown fields ['id']'); a line whose fields were edited after says the id is not
    theirs."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"family: mlp\ncount: 2\nseed: 3\nfields:\n{MLP_FIELDS}")
    line = cli("sample", str(sweep)).stdout.splitlines()[0]
    config = json.loads(line)
    done = cli("kernel-stats", "--model", f"synthetic:{line}", "--batch-size", "2")
    assert json.loads(done.stdout)["k_kernels_per_step"] > 0 and "warning" not in done.stderr
    out = tmp_path / "r"
    cli("run", "--model", f"synthetic:{line}", "--batch-size", "2", "--iterations", "1",
        "--device", "cpu", "--out", str(out))  # fmt: skip
    feats = json.loads((out / "features.json").read_text())
    from memtrace_trainer.models.config import from_dict

    model = from_dict({k: v for k, v in config.items() if k != "id"}).build()
    assert feats["total_parameters"] == sum(p.numel() for p in model.parameters())
    edited = json.dumps(config | {"depth": 3})
    done = cli("kernel-stats", "--model", f"synthetic:{edited}", "--batch-size", "2")
    assert f"field 'id' is '{config['id']}', not this config's id" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (MLP_FIELDS + "  input_size: {max: 64}\n", "field 'input_size': {'max': 64} is not a range"),
        (MLP_FIELDS + "  output_size: {min: 1, max_ratio: 0.5, of: architecture}\n"
         "  architecture: uniform\n", "field 'output_size': 'of' is 'architecture': expected a "
         "numeric field listed before it"),
        (MLP_FIELDS + "  architecture: pyramid\n  output_size: {min: 1, max_ratio: 0.5, "
         "of: architecture}\n", "'of' is 'architecture': expected a numeric field"),
        (MLP_FIELDS + "  depth: two\n", "field 'depth': 'two' is not an integer"),
        (MLP_FIELDS + "  depth: 2.5\n", "field 'depth': 2.5 is not an integer"),
        (MLP_FIELDS + "  depth: {min: 1.5, max: 3}\n", "field 'depth': min 1.5: expected an "
         "integer"),
        (MLP_FIELDS + "  batchnorm: {min: 0, max: 1}\n", "field 'batchnorm': a range draws "
         "numbers; the field takes true or false"),
        (MLP_FIELDS + "  nosuch: 3\n", "fields ['nosuch'] are not mlp config fields"),
        (MLP_FIELDS + "  id: mlp-1234\n", "fields ['id'] are not mlp config fields"),
        (MLP_FIELDS + "  architecture: [pyramid, nosuch]\n", "field 'architecture', choice 2: "
         "'nosuch' is not one of ['pyramid', 'uniform', 'bottleneck', 'gradual']"),
        (MLP_FIELDS + "  activation: [relu, swsh]\n", "choice 2: 'swsh' is not one of"),
        (MLP_FIELDS + "  input_size: {min: 4, max: 64, stp: 8}\n", "unknown range keys ['stp']"),
        (MLP_FIELDS + "  input_size: {min: 4, max: 64, step: 0}\n", "step 0: expected a positive"),
        (MLP_FIELDS + "  input_size: []\n", "field 'input_size': empty choice list"),
    ],
)  # fmt: skip
def test_bad_sweep_fields_are_named_before_any_draw(tmp_path: Path, text: str, said: str) -> None:
    """Each was an internal error (TypeError), a run that failed later, a choice silently never
    drawn, or '100 draws in a row were infeasible'."""
    sweep = tmp_path / "s.yaml"
    # A field given again replaces MLP_FIELDS' own (a key given twice is refused).
    given = {line.split(":")[0] for line in text[len(MLP_FIELDS) :].splitlines()}
    base = "".join(f"{line}\n" for line in MLP_FIELDS.splitlines()
                   if line.split(":")[0] not in given)  # fmt: skip
    sweep.write_text(f"family: mlp\ncount: 2\nseed: 1\nfields:\n{base}{text[len(MLP_FIELDS) :]}")
    for args in (["sample", str(sweep)], ["launch", str(sweep), "--out", str(tmp_path / "o"),
                                          "--dry-run"]):  # fmt: skip
        done = cli(*args, check=False)
        assert done.returncode == 2 and said in done.stderr, (args[0], done.stderr)
        assert "internal error" not in done.stderr and "infeasible" not in done.stderr


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("family: mlpx\ncount: 1\nfields: {}\n", "field 'family' is 'mlpx': expected one of "
         "['cnn', 'mlp', 'transformer']"),
        ("family: cnn\ncount: 1\nfields: {}\n", "a cnn config needs ['input_channels', "
         "'num_classes', 'depth', 'architecture', 'base_filters', 'input_size']"),
        (f"family: mlp\ncount: 1\nseed: [1]\nfields:\n{MLP_FIELDS}", "field 'seed' is [1]: "
         "expected an integer"),
        (f"family: mlp\ncount: true\nfields:\n{MLP_FIELDS}", "field 'count' is True"),
    ],
)  # fmt: skip
def test_bad_sweep_tops_are_named(tmp_path: Path, text: str, said: str) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(text)
    done = cli("sample", str(sweep), check=False)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "infeasible" not in done.stderr


def test_a_range_step_is_honoured(tmp_path: Path) -> None:
    """`step` was ignored without a word: every integer of the range was drawn."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text("family: mlp\ncount: 40\nseed: 2\nfields:\n  input_size: {min: 4, max: "
                     "64, step: 8}\n  output_size: 2\n  depth: 1\n  dropout: {min: 0.0, max: "
                     "0.5, step: 0.25}\n")  # fmt: skip
    configs = [json.loads(x) for x in cli("sample", str(sweep)).stdout.splitlines()]
    sizes = {c["input_size"] for c in configs}
    assert sizes <= set(range(4, 65, 8)) and len(sizes) > 3, sizes
    assert {c["dropout"] for c in configs} <= {0.0, 0.25, 0.5}


def test_bad_run_settings_of_a_launch_sweep_are_named(tmp_path: Path) -> None:
    sweep = tmp_path / "s.yaml"
    for run, said in [("{batch_size: {max: 64}}", "run.batch_size: {'max': 64} is not a range"),
                      ("{batch_size: 2, optimizer: sgd, iterations: {min: 1, max_ratio: 2, "
                       "of: optimizer}}", "'of' names 'optimizer', whose value 'sgd' is not a "
                       "number")]:  # fmt: skip
        sweep.write_text(f"models: [torchvision:resnet18]\nrun: {run}\n")
        done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--dry-run", check=False)
        assert done.returncode == 2 and said in done.stderr, done.stderr
    sweep.write_text(f"count: 2\nfields:\n{MLP_FIELDS}models: [torchvision:resnet18]\n"
                     "batch_sizes: [2]\n")  # fmt: skip
    done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--dry-run", check=False)
    assert done.returncode == 2 and "give family" in done.stderr, done.stderr


def test_a_sweep_takes_an_entry_of_its_own_batch(tmp_path: Path) -> None:
    """An entry function without a `batch_size` parameter builds its own batch (as `run`,
    `estimate` and the others take it): a sweep refused it for want of a batch_size."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text("models: [{entry: 'entry_example:fixed_batch'}]\nrun: {iterations: 1}\n")
    done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--dry-run")
    assert "entry:entry_example:fixed_batch  batch (the entry's own)" in done.stdout, done.stdout


def test_a_sweeps_batch_sizes_do_not_multiply_an_entry_of_its_own_batch(tmp_path: Path) -> None:
    """batch_sizes was crossed with an entry that takes no `batch_size`: N identical runs at
    its own batch, each warned "--batch-size N has no effect". It runs once, and the sweep says
    once, naming the entry, that batch_sizes does not size it; --dry-run lists what runs."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text("models:\n  - {entry: 'entry_example:fixed_batch'}\n"
                     "  - {entry: 'entry_example:own_batch_seq'}\n  - torchvision:resnet18\n"
                     "batch_sizes: [2, 4, 8]\nrun: {iterations: 1}\n")  # fmt: skip
    done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--dry-run")
    runs = [line.split(" pending ", 1)[1].strip() for line in done.stdout.splitlines()]
    assert runs == ["entry:entry_example:fixed_batch  batch (the entry's own)",
                    "entry:entry_example:own_batch_seq  batch (the entry's own)",
                    "torchvision:resnet18  batch 2", "torchvision:resnet18  batch 4",
                    "torchvision:resnet18  batch 8"], done.stdout  # fmt: skip
    for n, entry in ((1, "fixed_batch"), (2, "own_batch_seq")):
        said = (
            f"batch_sizes has no effect on models[{n}] (entry_example:{entry}): the function "
            "takes no `batch_size` parameter and builds its own batch, so it runs once"
        )
        assert done.stderr.count(said) == 1, done.stderr
    assert "resnet18" not in done.stderr and "--batch-size" not in done.stderr, done.stderr
    assert "5 configs" in done.stderr
    # run.batch_size beside it: said with batch_sizes, and not counted as sized by batch_sizes.
    sweep.write_text("models: [{entry: 'entry_example:fixed_batch'}, torchvision:resnet18]\n"
                     "batch_sizes: [2, 4]\nrun: {iterations: 1, batch_size: 3}\n")  # fmt: skip
    done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--dry-run")
    assert "batch_sizes and run.batch_size have no effect on models[1] " in done.stderr
    assert (
        "run.batch_size has no effect on the `models` item without a batch_size of its "
        "own: batch_sizes"
    ) in done.stderr, done.stderr
    assert "3 configs" in done.stderr and "batch 3" not in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("sweep_text", "said"),
    [
        ("models: [torchvision:nosuch]\nbatch_sizes: [2]\n",
         "run 0 (torchvision:nosuch): unknown torchvision model 'nosuch' in spec"),
        ("models: [{entry: 'nosuch_module:make', batch_size: 2}]\n", "run 0 (nosuch_module:make): "
         "entry 'nosuch_module:make': cannot import 'nosuch_module'"),
        # An entry that takes `batch_size` as a model: it trained at batch 1, the dataclass
        # default, in silence.
        ("models: [{entry: 'entry_failures:sized'}]\nrun: {iterations: 1}\n",
         ": 1 run has no batch_size (run 0: entry_failures:sized)"),
        ("models: [{entry: 'nosuch_module:make'}]\n", "run 0 (nosuch_module:make): "
         "entry 'nosuch_module:make': cannot import 'nosuch_module'"),
        ("models: [{entry: 'entry_failures:sized', batch_size: 2}]\n"
         "run: {iterations: 1, seconds: .inf}\n", "seconds inf: expected a positive number"),
        ("models: [torchvision:resnet18, torchvision:resnet34]\nrun: {iterations: 1}\n",
         "2 runs have no batch_size (run 0: torchvision:resnet18)"),
        ("models: [torchvision:resnet18]\nrun: {iterations: 1}\n",
         ": 1 run has no batch_size (run 0: torchvision:resnet18)"),
        ("models: ['synthetic:{\"family\":\"mlp\",\"input_size\":8,\"output_size\":2,\"depth\":1}']"
         "\nbatch_sizes: [2]\nrun: {input_shape: '3,9,9'}\n", "input_shape 3,9,9: "),
    ],
)  # fmt: skip
def test_launch_refuses_what_every_run_would_fail_on_up_front(
    tmp_path: Path, sweep_text: str, said: str
) -> None:
    """A model spec that does not build, an entry that does not import, a model or an entry
    without a batch size (it ran at batch 1; `run` requires --batch-size): refused before any run, by --dry-run
    too, and nothing is written."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(sweep_text)
    out = tmp_path / "o"
    for extra in (["--dry-run"], ["--workers", "1"]):
        done = cli("launch", str(sweep), "--out", str(out), *extra, check=False)
        assert done.returncode == 2 and said in done.stderr, done.stderr
    assert not out.exists()


def test_device_cuda_without_cuda_is_refused_where_the_runs_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    # A machine without CUDA, on a GPU machine too: the check is what is tested, not the host.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    sweep = tmp_path / "s.yaml"
    sweep.write_text("models: [torchvision:resnet18]\nbatch_sizes: [2]\nrun: {device: cuda}\n")
    out = str(tmp_path / "o")
    for backend in (["--backend", "local"], ["--backend", "slurm", "--submitit-cluster", "local"]):
        done = cli("launch", str(sweep), "--out", out, "--dry-run", *backend, check=False)
        assert done.returncode == 2, done.stderr
        assert "1 run asks for device cuda" in done.stderr and "no CUDA device" in done.stderr
    # A Slurm array runs on the cluster's GPU nodes, not on this login node.
    done = cli("launch", str(sweep), "--out", out, "--dry-run", "--backend", "slurm")
    assert "pending" in done.stdout


def test_a_second_launch_of_the_same_out_is_refused(sweep: Path, tmp_path: Path) -> None:
    """Two launches of one --out ran every pending run twice, and the loser of each race
    recorded a finished run as failed ('0/4 done ... 3 failed')."""
    import os

    from memtrace_trainer.runs.launch import LOCK, out_lock

    out = tmp_path / "out"
    with out_lock(out):
        done = cli("launch", str(sweep), "--out", str(out), "--workers", "1", check=False)
        assert done.returncode == 2, done.stderr
        assert f"another launch (pid {os.getpid()}) is writing into it" in done.stderr
        assert sorted(p.name for p in out.iterdir()) == [LOCK], "nothing run, nothing written"
    with out_lock(out):  # released when the holder ends
        pass


def test_a_duplicate_worker_does_not_fail_a_finished_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker that loses the race to the run directory (its rename fails: ENOTEMPTY) finds
    the run finished: present, not failed. A run that really failed is still recorded."""
    import errno

    from memtrace_trainer.runs import launch
    from memtrace_trainer.runs.sweep import items_of, write_manifest

    spec = 'synthetic:{"family":"mlp","input_size":8,"output_size":2,"depth":1}'
    items = items_of({"models": [spec], "batch_sizes": [2]}, "inline")
    manifest = tmp_path / launch.MANIFEST
    write_manifest(manifest, items)
    target = launch.run_dir(tmp_path, items[0])

    def lost_the_race(cfg: object, out: Path, trace: bool = False) -> dict:
        out.mkdir(parents=True)
        for name in ("config.json", "features.json", "labels.json"):
            (out / name).write_text("{}")
        raise OSError(errno.ENOTEMPTY, "Directory not empty")

    def broken(cfg: object, out: Path, trace: bool = False) -> dict:
        raise OSError(errno.ENOTEMPTY, "Directory not empty")

    monkeypatch.setattr(launch, "execute", broken)
    assert launch.run_one(0, manifest)["status"] == "failed"
    assert launch.failure_file(tmp_path, items[0]).is_file()
    launch.failure_file(tmp_path, items[0]).unlink()

    # sys.exit in the run's own code (a model's forward) is a failure too: the worker exited 0
    # and the run counted as done with no run directory.
    def exits(cfg: object, out: Path, trace: bool = False) -> dict:
        raise SystemExit(0)

    monkeypatch.setattr(launch, "execute", exits)
    result = launch.run_one(0, manifest)
    assert result["status"] == "failed" and "SystemExit" in result["error"], result
    launch.failure_file(tmp_path, items[0]).unlink()
    monkeypatch.setattr(launch, "execute", lost_the_race)
    assert launch.run_one(0, manifest)["status"] == "present"
    assert (
        launch.is_complete(target)
        and not (tmp_path / "failed" / f"{items[0].config.id}.json").exists()
    )


def test_submitted_runs_are_not_submitted_again(sweep: Path, tmp_path: Path) -> None:
    """Runs of an array whose jobs have not finished are `submitted`, not pending, and a second
    launch leaves them to their jobs unless --resubmit (the debug cluster runs a job only when
    waited on, so these never finish)."""
    out = tmp_path / "out"
    args = ["launch", str(sweep), "--out", str(out), "--backend", "slurm",
            "--submitit-cluster", "debug"]  # fmt: skip
    assert "submitted 2 runs" in cli(*args).stderr
    assert [s for _, s in statuses(cli(*args, "--dry-run").stdout)] == ["submitted"] * 2
    again = cli(*args)
    assert "2 runs were submitted before and have not finished" in again.stderr, again.stderr
    assert "submitted 2 runs" not in again.stderr
    jobs = json.loads((out / "submitit" / "jobs.json").read_text())
    assert len(jobs) == 2 and all(j["submitted"] > 0 for j in jobs)
    # --resubmit where nothing is held by a job has nothing to do, and says so.
    fresh = cli("launch", str(sweep), "--out", str(tmp_path / "fresh"), "--resubmit", "--dry-run")
    assert "--resubmit has no effect: no run in" in fresh.stderr, fresh.stderr
    assert "--resubmit has no effect" not in cli(*args, "--resubmit", "--dry-run").stderr
    # Nor run here beside their jobs: two writers of one run directory.
    local = cli("launch", str(sweep), "--out", str(out))
    assert "2 runs were submitted before and have not finished" in local.stderr, local.stderr
    assert "2 left to their Slurm jobs, 0 to run" in local.stderr
    assert not (out / "runs").exists() or not any((out / "runs").iterdir())
    assert "submitted 2 runs" in cli(*args, "--resubmit").stderr
    # A run whose job recorded its failure since is submitted again without the flag.
    failed = out / "failed" / f"{jobs[1]['id']}.json"
    failed.parent.mkdir()
    write_json(failed, {"error": "x"})
    assert [s for _, s in statuses(cli(*args, "--dry-run").stdout)] == ["submitted",
                                                                       "failed-before"]  # fmt: skip
    assert "submitted 1 run as job array" in cli(*args).stderr


def test_another_sweeps_out_is_refused(sweep: Path, tmp_path: Path) -> None:
    """A launch into an --out of another sweep replaced its manifest and mixed the runs; a
    sweep that grew (every earlier run still in it) goes on."""
    from memtrace_trainer.runs.launch import MANIFEST
    from memtrace_trainer.runs.sweep import load_sweep, write_manifest

    out = tmp_path / "out"
    out.mkdir()
    other = tmp_path / "other.yaml"
    other.write_text(SWEEP.replace("seed: 5", "seed: 6"))
    write_manifest(out / MANIFEST, load_sweep(other))
    before = (out / MANIFEST).read_text()
    for extra in (["--dry-run"], ["--workers", "1"]):
        done = cli("launch", str(sweep), "--out", str(out), *extra, check=False)
        assert done.returncode == 2, done.stderr
        assert "holds manifest.jsonl of another sweep: 1 of its 2 runs" in done.stderr
    assert (out / MANIFEST).read_text() == before
    write_manifest(out / MANIFEST, load_sweep(sweep)[:1])
    grown = cli("launch", str(sweep), "--out", str(out), "--dry-run")
    assert len(statuses(grown.stdout)) == 2


def test_flags_the_submitit_local_cluster_does_not_read_are_said(
    sweep: Path, tmp_path: Path
) -> None:
    done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--backend", "slurm",
               "--submitit-cluster", "local", "--partition", "gpu", "--array-parallelism", "2",
               "--dry-run")  # fmt: skip
    for flag in ("--partition", "--array-parallelism"):
        assert f"{flag} has no effect: --submitit-cluster local runs the array on this machine" in (
            done.stderr
        ), done.stderr
    done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--backend", "slurm",
               "--partition", "gpu", "--dry-run")  # fmt: skip
    assert "has no effect" not in done.stderr, "Slurm reads --partition"
