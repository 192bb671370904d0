"""`launch` interrupted, sweep settings checked up front or said to be overridden, `dataset`
saying what it leaves out and naming damaged fields, `run --trace` on a CPU fallback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import GPU_LABELS, cli

from memtrace_trainer.runs.rundir import write_json

MLP = 'synthetic:{"family":"mlp","input_size":8,"output_size":2,"depth":1}'

# An entry whose run takes long, and whose cleanup after a signal waits for the test to let it
# go on (`release`, bounded), so that what a stopped launch does while its workers clean up is
# seen without timing margins. Marks: `N` (run of batch size N started; holds its pid), `stop-N`
# (it got the signal), `end-N` (it was let go).
SLOW = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path

    def make(batch_size=2):
        marks = Path(os.environ["SLOW_MARKS"])
        (marks / str(batch_size)).write_text(str(os.getpid()))
        try:
            time.sleep(120)
        except KeyboardInterrupt:
            (marks / f"stop-{batch_size}").touch()
            deadline = time.monotonic() + 60
            while not (marks.parent / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            (marks / f"end-{batch_size}").touch()
            raise
    """
)


def _launch(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "memtrace_trainer", "launch", *args],
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        text=True,
        env=env,
        start_new_session=True,  # its own process group: a Ctrl-C of the test's own
    )


def _until(what: str, done: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _slow_launch(tmp_path: Path, workers: int) -> tuple[subprocess.Popen[str], Path, Path]:
    """A launch of four slow runs, once `workers` of them are in the entry's sleep: the launch,
    its OUT and the marks folder."""
    (tmp_path / "slow_entry.py").write_text(SLOW)
    sweep = tmp_path / "s.yaml"
    sweep.write_text("models: [{entry: 'slow_entry:make'}]\nbatch_sizes: [2, 3, 4, 5]\n"
                     "run: {iterations: 1, device: cpu}\n")  # fmt: skip
    out, marks = tmp_path / "out", tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{Path(__file__).parent}",
           "SLOW_MARKS": str(marks)}  # fmt: skip
    first = _launch([str(sweep), "--out", str(out), "--workers", str(workers)], env,
                    tmp_path / "1.err")  # fmt: skip
    try:
        _until("the runs to start", lambda: len(_started(marks)) == workers)
    except BaseException:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        raise
    return first, out, marks


def _started(marks: Path) -> list[Path]:
    return [p for p in marks.iterdir() if p.name.isdigit()]


def _gone(pid: int) -> bool:
    """The process ended (a zombie included: it ran its cleanup)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


@pytest.mark.parametrize(
    ("sig", "workers"),
    [(signal.SIGINT, 2), (signal.SIGINT, 1), (signal.SIGTERM, 2)],
    ids=["ctrl-c", "ctrl-c-one-worker", "sigterm"],
)
def test_a_stopped_launch_stops_its_workers_and_holds_out_until_they_end(
    tmp_path: Path, sig: int, workers: int
) -> None:
    """Ctrl-C (SIGINT to the process group) said "interrupted", released OUT's lock at once,
    and its threads went on taking runs beside a second launch that the released lock let in;
    with one worker (a Ctrl-C landing in `Thread.join` marked the thread ended) launch let go of
    OUT with its worker running on; SIGTERM killed launch and left its workers on."""
    import fcntl

    first, out, marks = _slow_launch(tmp_path, workers)
    try:
        os.killpg(first.pid, sig)
        _until("the workers to be told to stop",
               lambda: len(list(marks.glob("stop-*"))) == workers)  # fmt: skip
        _until("launch to say it stops them",
               lambda: "stopping" in (tmp_path / "1.err").read_text())  # fmt: skip
        # The workers wait for `release`: launch must still hold OUT's lock, and run.
        with (out / ".launch.lock").open("a") as f:
            with pytest.raises(BlockingIOError):
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert first.poll() is None, (tmp_path / "1.err").read_text()
        (tmp_path / "release").touch()
        first.wait(timeout=60)
        # Launch ended after its workers had: each had been let go and is gone.
        assert len(list(marks.glob("end-*"))) == workers
        assert all(_gone(int(p.read_text())) for p in _started(marks))
        err = (tmp_path / "1.err").read_text()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert first.returncode == 2, err
    assert "error: interrupted" in err and "Traceback" not in err, err
    assert len(list((out / "logs").glob("*.log"))) == workers, "no new run was started"
    assert not (out / "failed").exists(), "a stopped run is pending, not failed"
    assert not list((out / "runs").glob(".*")), "the workers removed their partial directories"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG)")
def test_the_workers_of_a_killed_launch_end_and_clean_up(tmp_path: Path) -> None:
    """SIGKILL of launch (nothing it can stop): its workers ran on, writing into an OUT whose
    lock was gone, and a second launch removed the `.partial-*` directories they wrote."""
    (tmp_path / "release").touch()  # the entries clean up at once
    first, out, marks = _slow_launch(tmp_path, 2)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    pids = [int(p.read_text()) for p in _started(marks)]
    _until("the workers to end", lambda: all(_gone(pid) for pid in pids))
    assert len(list(marks.glob("end-*"))) == 2, "each worker was stopped, not killed"
    assert not list((out / "runs").glob(".*")), "the workers removed their partial directories"


def test_a_partial_directory_a_live_worker_writes_is_not_removed(tmp_path: Path) -> None:
    from memtrace_trainer.runs.stop import own_partial, remove_leftovers

    owned = tmp_path / "runs" / ".r1.partial-abc"
    left = tmp_path / "runs" / ".r1.partial-def"
    owned.mkdir(parents=True)
    left.mkdir()
    fd = own_partial(owned)
    try:
        remove_leftovers(tmp_path, {"r1"})
    finally:
        os.close(fd)
    assert owned.is_dir() and not left.exists()


def test_a_resumed_launch_removes_what_a_killed_one_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"models: ['{MLP}']\nbatch_sizes: [2]\nrun: {{iterations: 1, device: cpu}}\n")
    out = tmp_path / "out"
    (run_id,) = [line.split()[1] for line in cli("launch", str(sweep), "--out", str(out),
                                                  "--dry-run").stdout.splitlines()]  # fmt: skip
    left = out / "runs" / f".{run_id}.partial-abc123"
    left.mkdir(parents=True)
    done = cli("launch", str(sweep), "--out", str(out), "--workers", "1")
    assert "removed 1 unfinished run directory" in done.stderr, done.stderr
    assert not left.exists() and (out / "runs" / run_id / "labels.json").is_file()


@pytest.mark.parametrize(
    ("run", "said"),
    [
        # Only the drawn values were checked: with one run, `bogus` was never drawn.
        ("{batch_size: 2, optimizer: [adam, bogus]}", "run.optimizer, choice 2: optimizer "
         "'bogus': expected one of"),
        ("{batch_size: 2, checkpointing: 'yes'}", "run.checkpointing: checkpointing 'yes': "
         "expected true, false or one of ['full', 'selective']"),
        ("{batch_size: 2, profile: nonexist}", "profile 'nonexist': profile \"nonexist\" not "
         "found"),
        ("{batch_size: 2, seq_len: abc}", "run.seq_len: seq_len 'abc': expected an integer"),
        ("{batch_size: 2, input_shape: 5}", "run.input_shape: input_shape 5: expected a shape "
         "C,H,W (a string)"),
        ("{batch_size: 2, iterations: {min: 0.5, max: 3.5}}", "run.iterations: min 0.5: "
         "expected an integer (iterations takes integers)"),
        ("{batch_size: 2, amp: {min: 1, max: 2}}", "run.amp: a range draws numbers, and amp is "
         "not a number setting"),
        ("{batch_size: 2, colour: red}", "run: unknown settings ['colour']"),
    ],
)  # fmt: skip
def test_every_value_a_run_setting_may_take_is_checked_up_front(
    tmp_path: Path, run: str, said: str
) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"models: [torchvision:resnet18]\nrun: {run}\n")
    done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--dry-run", check=False)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "internal error" not in done.stderr and "building it raised" not in done.stderr


@pytest.mark.parametrize(
    ("models", "said"),
    [
        ("[{model: 5, batch_size: 2}]", "models[1]: model 5: expected a model spec"),
        ("[{model: torchvision:resnet18, batch_size: two}]", "models[1]: batch_size 'two'"),
        ("[{model: torchvision:resnet18, entry: 'a:b', batch_size: 2}]",
         "models[1]: expected exactly one of model or entry"),
    ],
)  # fmt: skip
def test_bad_models_items_are_named(tmp_path: Path, models: str, said: str) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"models: {models}\n")
    done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--dry-run", check=False)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "internal error" not in done.stderr


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("models: [torchvision:resnet18]\nbatch_sizes: [2]\nrun: {batch_size: 4}\n",
         "run.batch_size has no effect on the `models` item without a batch_size of its own: "
         "batch_sizes gives their batch sizes"),
        ("models: [{model: torchvision:resnet18, batch_size: 2}]\nbatch_sizes: [4, 8]\n",
         "batch_sizes has no effect on models[1] (torchvision:resnet18), which gives its own "
         "batch_size 2"),
    ],
)  # fmt: skip
def test_an_overridden_batch_size_is_said(tmp_path: Path, text: str, said: str) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(text)
    done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--dry-run")
    assert said in done.stderr, done.stderr


def test_a_key_given_twice_in_a_sweep_file_is_refused(tmp_path: Path) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text("family: mlp\ncount: 2\nfields: {input_size: 8, output_size: 2, depth: 1}\n"
                     "count: 5\n")  # fmt: skip
    for command in (["sample", str(sweep)], ["launch", str(sweep), "--out", str(tmp_path / "o"),
                                            "--dry-run"]):  # fmt: skip
        done = cli(*command, check=False)
        assert done.returncode == 2 and not done.stdout, done.stderr
        assert "line 4: key 'count' is given twice (first on line 2)" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "text",
    [
        "base: &b {optimizer: adam, iterations: 5}\nrun:\n  <<: *b\n  iterations: 7\n",
        "a: &a {x: 1}\nb: &b {y: 2}\nrun:\n  <<: [*a, *b]\n  x: 3\n",
        "a: &a {x: 1}\nb: &b {y: 2}\nrun:\n  <<: *a\n  <<: *b\n",
    ],
    ids=["merge-override", "merge-list", "two-merges"],
)
def test_yaml_merge_keys_read_as_safe_load_reads_them(tmp_path: Path, text: str) -> None:
    """The duplicate-key check refused `<<: *anchor` ("could not determine a constructor for
    the tag ...merge"), and would have called a key overriding a merged one a duplicate."""
    import yaml

    from memtrace_trainer.models.sampling import read_sweep

    sweep = tmp_path / "s.yaml"
    sweep.write_text(text)
    assert read_sweep(sweep) == yaml.safe_load(text)


def test_a_key_given_twice_beside_a_merge_is_refused(tmp_path: Path) -> None:
    from memtrace_trainer.errors import UserError
    from memtrace_trainer.models.sampling import read_sweep

    sweep = tmp_path / "s.yaml"
    sweep.write_text("a: &a {x: 1}\nrun:\n  <<: *a\n  x: 2\n  x: 3\n")
    with pytest.raises(UserError, match="line 5: key 'x' is given twice"):
        read_sweep(sweep)


def test_a_negative_seed_is_refused(tmp_path: Path) -> None:
    """`random.Random` seeds with abs(): -7 drew what 7 draws."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text("family: mlp\ncount: 2\nfields: {input_size: 8, output_size: 2, depth: 1}\n")
    done = cli("sample", str(sweep), "--seed", "-7", check=False)
    assert done.returncode == 2 and "--seed -7: expected an integer >= 0" in done.stderr
    sweep.write_text(sweep.read_text() + "seed: -1\n")
    done = cli("sample", str(sweep), check=False)
    assert done.returncode == 2 and "field 'seed' is -1: expected an integer >= 0" in done.stderr


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run directory with GPU labels (made here: no GPU in CI)."""
    run = tmp_path_factory.mktemp("made") / "r1"
    cli("run", "--model", MLP, "--batch-size", "2", "--iterations", "1", "--out", str(run))
    write_json(run / "labels.json", GPU_LABELS)
    return run


def _copy(run: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(run, to)
    return to


def test_dataset_says_what_it_leaves_out(tmp_path: Path, one_run: Path) -> None:
    root = tmp_path / "runs"
    _copy(one_run, root / "good")
    for name, gone in [("no-features", ["features.json"]), ("no-config", ["config.json"]),
                       ("labels-only", ["features.json", "config.json"])]:  # fmt: skip
        _copy(one_run, root / name)
        for f in gone:
            (root / name / f).unlink()
    partial = _copy(one_run, root / ".r2.partial-x1y2")
    failed = root / "failed"
    failed.mkdir()
    write_json(failed / "r3.json", {"index": 2, "id": "r3", "error": "boom"})
    out = tmp_path / "d.csv"
    done = cli("dataset", str(root), "--out", str(out))
    assert "wrote" in done.stdout and ": 1 run" in done.stdout, done.stdout
    for name, missing in [("no-features", "no features.json"), ("no-config", "no config.json"),
                          ("labels-only", "no config.json, features.json")]:  # fmt: skip
        assert f"skipped {root / name}: not a complete run directory ({missing})" in done.stderr
    assert f"skipped {partial}: an unfinished run directory (being written by a running " \
        "launch, or left by a killed one" in done.stderr, done.stderr  # fmt: skip
    assert f"1 run of {root} failed ({failed}/)" in done.stderr, done.stderr
    (root / "good" / "labels.json").unlink()
    nothing = cli("dataset", str(root), "--out", str(tmp_path / "e.csv"), check=False)
    assert nothing.returncode == 2 and "(1 run failed" in nothing.stderr, nothing.stderr


def test_dataset_keeps_one_copy_of_a_run(tmp_path: Path, one_run: Path) -> None:
    root = tmp_path / "runs"
    _copy(one_run, root / "a" / "r1")
    _copy(one_run, root / "b" / "r1")
    out = tmp_path / "d.csv"
    done = cli("dataset", str(root), "--out", str(out))
    assert ": 1 run" in done.stdout and len(out.read_text().splitlines()) == 2, done.stdout
    assert f"kept the first, left out {root / 'b' / 'r1'}" in done.stderr, done.stderr


def test_dataset_keeps_the_same_run_measured_on_two_gpus(tmp_path: Path, one_run: Path) -> None:
    """The id hashes the config alone: the same sweep launched on two GPUs into two OUT folders
    gave the same ids, and the second GPU's measurements were left out as a copy."""
    root = tmp_path / "runs"
    _copy(one_run, root / "a100" / "r1")
    other = _copy(one_run, root / "h100" / "r1")
    write_json(other / "labels.json", GPU_LABELS | {"gpu": "NVIDIA H100 80GB HBM3"})
    out = tmp_path / "d.csv"
    done = cli("dataset", str(root), "--out", str(out))
    assert ": 2 runs" in done.stdout and len(out.read_text().splitlines()) == 3, done.stdout
    assert "measured more than once" in done.stderr and "kept both rows" in done.stderr


def test_dataset_keeps_a_profile_it_cannot_load(tmp_path: Path, one_run: Path) -> None:
    """A profile the cluster's $MEMTRACE_PROFILES knows (or a path relative to where the run
    ran) made `dataset` refuse the whole table where it runs."""
    run = _copy(one_run, tmp_path / "runs" / "r1")
    write_json(run / "config.json", json.loads((run / "config.json").read_text())
               | {"profile": "cluster-only-gpu"})  # fmt: skip
    out = tmp_path / "d.csv"
    done = cli("dataset", str(tmp_path / "runs"), "--out", str(out))
    assert f"{run / 'config.json'}: field 'profile' is 'cluster-only-gpu', which cannot be " \
        "loaded here" in done.stderr, done.stderr  # fmt: skip
    import csv

    (row,) = csv.DictReader(out.read_text().splitlines())
    assert row["profile"] == "cluster-only-gpu"


def test_a_models_item_with_a_null_entry_is_a_model_run(tmp_path: Path) -> None:
    """`{model: x, entry: null}`, the shape config.json writes, was refused as giving both."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"models: [{{model: '{MLP}', entry: null, batch_size: 2}}]\n")
    done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--dry-run")
    assert "1 config" in done.stderr, done.stderr
    sweep.write_text("models: [{model: null, entry: null, batch_size: 2}]\n")
    done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--dry-run", check=False)
    assert done.returncode == 2 and "expected exactly one of model or entry" in done.stderr


@pytest.mark.parametrize(
    ("file", "field", "value", "said"),
    [
        ("features.json", "total_activations", "lots", "expected an integer of at least 0"),
        ("features.json", "gpumemnet_row", [1], "expected a mapping of GPUMemNet column"),
        ("features.json", "gpumemnet_row", {"Total Activations": "lots"},
         "field 'gpumemnet_row.Total Activations' is 'lots': expected a count"),
        ("features.json", "gpumemnet_row", {"Colour": "1"}, "not a GPUMemNet column"),
        ("config.json", "id", None, "field 'id' is null: expected the run id"),
        ("config.json", "model", 5, "field 'model' is 5: expected a model spec"),
        ("config.json", "profile", 5, "field 'profile' is 5: expected a GPU profile name"),
        ("labels.json", "torch", None, "field 'torch' is None: expected the torch version"),
        ("labels.json", "gpu", 5, "field 'gpu' is 5: expected the GPU name"),
        ("labels.json", "cuda", {"a": 1}, "field 'cuda' is {'a': 1}: expected the CUDA version"),
    ],
)  # fmt: skip
def test_dataset_names_a_damaged_field(
    tmp_path: Path, one_run: Path, file: str, field: str, value: object, said: str
) -> None:
    run = _copy(one_run, tmp_path / "runs" / "r1")
    data = json.loads((run / file).read_text())
    write_json(run / file, data | {field: value})
    out = tmp_path / "d.csv"
    done = cli("dataset", str(tmp_path / "runs"), "--out", str(out), check=False)
    assert done.returncode == 2, done.stderr
    assert f"error: {run / file}: " in done.stderr and said in done.stderr, done.stderr
    assert "internal error" not in done.stderr and not out.exists()


def test_run_trace_on_a_cpu_fallback_says_the_trace_holds_nothing(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU machine does not fall back to the CPU")
    out = tmp_path / "trace"
    done = subprocess.run(
        [sys.executable, "-m", "memtrace_trainer", "run", "--model", MLP, "--batch-size", "2",
         "--iterations", "1", "--trace", "--out", str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--trace has no effect on a CPU fallback" in done.stderr, done.stderr
    assert ".partial-" not in done.stderr, done.stderr


def test_from_config_errors_are_named(tmp_path: Path) -> None:
    labels = str(tmp_path / "l.json")
    done = cli("run", "--from-config", str(tmp_path / "nope.json"), "--labels-out", labels,
               check=False)  # fmt: skip
    assert done.returncode == 2 and "cannot read it" in done.stderr, done.stderr
    (tmp_path / "c.json").write_text('{"model": 5}')
    done = cli("run", "--from-config", str(tmp_path / "c.json"), "--labels-out", labels,
               check=False)  # fmt: skip
    assert done.returncode == 2 and "model 5: expected a model spec" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["launch", "{sweep}", "--out", "{out}", "--backend", "slurm", "--dry-run"],
        ["symtrace", "--batch", "{batch}", "--out-dir", "{out}", "--backend", "slurm"],
    ],
    ids=["launch", "symtrace"],
)
@pytest.mark.parametrize("partition", ["gpu\ntouch PWNED #", "", "gpu a100"])
def test_a_partition_that_is_no_slurm_name_is_refused(
    tmp_path: Path, args: list[str], partition: str
) -> None:
    """sbatch reads `#SBATCH` lines up to the first other line: a newline in --partition put
    what followed into the job script as a command (and dropped the time limit after it); an
    empty one was left out in silence."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text("models: [torchvision:resnet18]\nbatch_sizes: [2]\n")
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"model": "torchvision:resnet18", "batch_size": 2}\n')
    line = [a.format(sweep=sweep, batch=batch, out=tmp_path / "o") for a in args]
    done = cli(*line, "--partition", partition, check=False)
    assert done.returncode == 2, done.stderr
    assert "--partition" in done.stderr and "expected a Slurm partition name" in done.stderr
    assert not (tmp_path / "o").exists()


def test_timeout_without_effect_under_the_debug_executor_is_said(tmp_path: Path) -> None:
    """submitit's debug executor runs each task in this process with no time limit: a
    --timeout-min given there was taken in silence (its local executor keeps one)."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text("models: [torchvision:resnet18]\nbatch_sizes: [2]\n")
    base = ["launch", str(sweep), "--out", str(tmp_path / "o"), "--backend", "slurm", "--dry-run"]
    said = "--timeout-min has no effect: --submitit-cluster debug runs each task in this process"
    done = cli(*base, "--submitit-cluster", "debug", "--timeout-min", "5")
    assert said in done.stderr, done.stderr
    for other in (["--submitit-cluster", "debug"], ["--submitit-cluster", "local",
                                                    "--timeout-min", "5"]):  # fmt: skip
        assert "--timeout-min has no effect" not in cli(*base, *other).stderr, other


@pytest.mark.parametrize("flag", ["--timeout-min", "--array-parallelism"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_symtrace_slurm_counts_below_one_are_refused(tmp_path: Path, flag: str, value: str) -> None:
    """`symtrace --backend slurm --timeout-min 0` was taken: every array task was killed at
    once, and each config failed naming submitit's result file."""
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"model": "torchvision:resnet18", "batch_size": 2}\n')
    done = cli("symtrace", "--batch", str(batch), "--out-dir", str(tmp_path / "o"), "--backend",
               "slurm", "--submitit-cluster", "local", flag, value, check=False)  # fmt: skip
    assert done.returncode == 2 and f"{flag}: {value}: expected at least 1" in done.stderr
    assert not (tmp_path / "o").exists()


def test_yaml_aliases_that_multiply_are_refused_at_once(tmp_path: Path) -> None:
    """Nine nested aliases of nine made a 500-byte sweep stand for 387 million values; the checks
    walked them until memory ran out ("internal error: MemoryError")."""
    nested = ["&x0 [a, a, a, a, a, a, a, a, a]"] + [
        f"&x{i} [" + ", ".join([f"*x{i - 1}"] * 9) + "]" for i in range(1, 9)
    ]
    sweep = tmp_path / "s.yaml"
    sweep.write_text("models: [torchvision:resnet18]\nbatch_sizes: [2]\n"
                     f"run: {{optimizer: [adam, [{', '.join(nested)}]]}}\n")  # fmt: skip
    for command in (["launch", str(sweep), "--out", str(tmp_path / "o"), "--dry-run"],
                    ["sample", str(sweep)]):  # fmt: skip
        done = cli(*command, check=False)
        assert done.returncode == 2, done.stderr
        assert "each alias (*name) taken as the value it stands for" in done.stderr, done.stderr


def test_a_model_builders_words_are_said_in_the_sweep_files_terms(tmp_path: Path) -> None:
    """The model builder names command-line flags; a sweep's run settings were warned about as
    `--seq-len 128 has no effect ... (give --input-shape C,H,W)`, with no file named."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text('models: [torchvision:resnet18]\nbatch_sizes: [2]\n'
                     'run: {input_shape: "3,32,32", seq_len: 128}\n')  # fmt: skip
    done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--dry-run")
    said = (f"{sweep}: run 0 (torchvision:resnet18): seq_len 128 has no effect: "
            "torchvision:resnet18 is an image model (give input_shape C,H,W)")  # fmt: skip
    assert said in done.stderr and "--seq-len" not in done.stderr, done.stderr
    sweep.write_text(
        'models: [torchvision:resnet18]\nbatch_sizes: [2]\nrun: {input_shape: "3,32"}\n'
    )
    done = cli("launch", str(sweep), "--out", str(tmp_path / "o"), "--dry-run", check=False)
    assert done.returncode == 2 and "): input_shape 3,32: " in done.stderr, done.stderr
