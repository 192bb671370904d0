"""Bad input files and settings across commands: each is refused with exit status 2 and one
line naming the file (or the flag, or the environment variable) and what was expected, never
an internal error, and leaves no output behind."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import cli

MLP = 'synthetic:{"family":"mlp","input_size":8,"output_size":2,"depth":1}'
ROW = "input:16_output:4_depth:2_arch:pyramid_batch:4.out"
NOT_UTF8 = b"family: mlp\ncount: 2\n\xfb\xff\xfe\n"


def _binary(tmp: Path) -> Path:
    path = tmp / "in.bin"
    path.write_bytes(NOT_UTF8)
    return path


def _csv_bad_row(tmp: Path) -> Path:
    path = tmp / "rows.csv"
    path.write_bytes(b"Filename,x\n\xff\xfe,1\n")
    return path


def _rows(tmp: Path) -> Path:
    path = tmp / "rows.csv"
    path.write_text(f'Filename\n"{ROW}"\n')
    return path


def _binary_out(tmp: Path) -> Path:
    (tmp / "k.csv").write_bytes(NOT_UTF8)
    return _rows(tmp)


def _runs(tmp: Path) -> Path:
    run = tmp / "runs" / "a"
    run.mkdir(parents=True)
    (run / "config.json").write_bytes(b"\xff\xfe{}")
    (run / "features.json").write_text("{}")
    (run / "labels.json").write_text("{}")
    return tmp / "runs"


def _folder(tmp: Path) -> Path:
    path = tmp / "adir.py"
    path.mkdir()
    return path


# (id, make the input under tmp -> its path, argv with {IN} and {TMP}, words the error says,
# paths under tmp that must not exist after).
CASES: list[tuple[str, Callable[[Path], Path], list[str], list[str], list[str]]] = [
    ("sample-not-utf8", _binary, ["sample", "{IN}"],
     ["sweep file {IN}: cannot read it: not UTF-8 text", "expected a YAML sweep file"], []),
    ("launch-not-utf8", _binary, ["launch", "{IN}", "--out", "{TMP}/l1", "--dry-run"],
     ["sweep file {IN}: cannot read it: not UTF-8 text", "expected a YAML sweep file"], []),
    ("kernel-stats-not-utf8", _binary, ["kernel-stats", "--gpumemnet", "{IN}", "--out",
                                        "{TMP}/k.csv"],
     ["--gpumemnet {IN}: cannot read it: not UTF-8 text", "expected a GPUMemNet dataset CSV"],
     ["k.csv"]),
    ("kernel-stats-not-utf8-row", _csv_bad_row, ["kernel-stats", "--gpumemnet", "{IN}", "--out",
                                                 "{TMP}/k.csv"],
     ["--gpumemnet {IN}: cannot read it: not UTF-8 text (invalid start byte at byte 11)"],
     ["k.csv"]),
    ("kernel-stats-not-utf8-out", _binary_out, ["kernel-stats", "--gpumemnet", "{IN}", "--out",
                                                "{TMP}/k.csv"],
     ["--out {TMP}/k.csv: cannot read it: not UTF-8 text", "expected a CSV that kernel-stats "
      "wrote"], []),
    ("kernel-stats-folder", _folder, ["kernel-stats", "--gpumemnet", "{IN}", "--out",
                                      "{TMP}/k.csv"],
     ["--gpumemnet {IN}: cannot read it: a directory; expected a GPUMemNet dataset CSV"],
     ["k.csv"]),
    ("kernel-stats-missing-out-folder", _rows, ["kernel-stats", "--gpumemnet", "{IN}", "--out",
                                                "{TMP}/nodir/k.csv"],
     ["--out {TMP}/nodir/k.csv: directory {TMP}/nodir does not exist"], ["nodir"]),
    ("dataset-not-utf8-config", _runs, ["dataset", "--out", "{TMP}/ds.csv", "{IN}"],
     ["{IN}/a/config.json: cannot read it: not UTF-8 text", "expected a run file of JSON"],
     ["ds.csv"]),
    ("run-from-config-not-utf8", _binary, ["run", "--from-config", "{IN}", "--labels-out",
                                           "{TMP}/l.json"],
     ["--from-config {IN}: cannot read it: not UTF-8 text", "expected a run's config.json"],
     ["l.json"]),
    ("symtrace-batch-not-utf8", _binary, ["symtrace", "--batch", "{IN}", "--out-dir",
                                          "{TMP}/od"],
     ["--batch {IN}: cannot read it: not UTF-8 text", "expected a file of JSON lines"], ["od"]),
    ("estimate-script-folder", _folder, ["estimate", "--script", "{IN}"],
     ["--script {IN}: cannot read it: a directory; expected a Python training script"], []),
]  # fmt: skip


@pytest.mark.parametrize(("make", "argv", "words", "absent"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_a_bad_input_is_named_with_what_was_expected(
    tmp_path: Path, make: Callable[[Path], Path], argv: list[str], words: list[str],
    absent: list[str],
) -> None:  # fmt: skip
    given = make(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    def put(s: str) -> str:
        return s.replace("{IN}", str(given)).replace("{TMP}", str(tmp_path))

    done = cli(*map(put, argv), check=False)
    assert done.returncode == 2, done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    for w in words:
        assert put(w) in done.stderr, (put(w), done.stderr)
    for name in absent:
        assert not (tmp_path / name).exists(), f"{name} was left behind"
    assert {p: p.read_bytes() for p in before} == before, "an input was changed"


def test_a_gpumemnet_model_spec_says_its_batch_is_not_used(tmp_path: Path) -> None:
    """`features --model gpumemnet:...batch:4.out` answered at batch 1 without a word, and
    `estimate` without --batch-size said the spec "has no batch of its own"."""
    done = cli("features", "--model", f"gpumemnet:{ROW}")
    assert '"batch_size": 1' in done.stdout, done.stdout
    assert f"--model gpumemnet:{ROW}: the batch:4 in its Filename is not used" in done.stderr
    assert "--gpumemnet-row" in done.stderr, done.stderr
    # The row form takes the batch (here overridden, as documented): nothing to say.
    row = cli("features", "--gpumemnet-row", ROW, "--batch-size", "2")
    assert "not used" not in row.stderr, row.stderr
    same = cli("features", "--model", f"gpumemnet:{ROW}", "--batch-size", "4")
    assert "not used" not in same.stderr, same.stderr
    est = cli("estimate", "--model", f"gpumemnet:{ROW}", check=False)
    assert est.returncode == 2, est.stderr
    assert "--batch-size is required with --model" in est.stderr, est.stderr
    assert "the batch:4 in its Filename is not used" in est.stderr, est.stderr
    assert "no batch of its own" not in est.stderr, est.stderr


def _memest_refusing_its_model(tmp_path: Path) -> Path:
    """A memest that refuses the file of its --ml-model, as the real one does a bad file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "memest"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "args = sys.argv[1:]\n"
        "path = args[args.index('--ml-model') + 1]\n"
        "sys.stderr.write(f'memest: error: --ml-model {path}: not an ML model file\\n')\n"
        "sys.exit(2)\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_the_ml_model_variable_is_named_not_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$MEMTRACE_ML_MODEL of a missing file (or of one memest refuses) was reported as
    `--ml-model PATH`, a flag the user never gave."""
    monkeypatch.setenv("MEMTRACE_ML_MODEL", str(tmp_path / "none.bin"))
    done = cli("estimate", "--model", MLP, "--batch-size", "2", check=False)
    assert done.returncode == 2, done.stderr
    assert f"$MEMTRACE_ML_MODEL={tmp_path / 'none.bin'}: no such file" in done.stderr
    assert "--ml-model" not in done.stderr, done.stderr
    bad = tmp_path / "bad.bin"
    bad.write_text("garbage")
    monkeypatch.setenv("MEMTRACE_ML_MODEL", str(bad))
    monkeypatch.setenv("MEMTRACE_BIN_DIR", str(_memest_refusing_its_model(tmp_path)))
    done = cli("estimate", "--model", MLP, "--batch-size", "2", check=False)
    assert done.returncode == 2, done.stderr
    assert f"$MEMTRACE_ML_MODEL={bad}: not an ML model file" in done.stderr, done.stderr
    assert "--ml-model" not in done.stderr, done.stderr
    # The flag given is named as the flag.
    done = cli("estimate", "--model", MLP, "--batch-size", "2", "--ml-model", str(bad),
               check=False)  # fmt: skip
    assert f"--ml-model {bad}: not an ML model file" in done.stderr, done.stderr


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_bin_dir_that_is_no_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """MEMTRACE_BIN_DIR=/nonexistent was passed over for PATH and target/release unsaid."""
    from memtrace_trainer.binaries import find_binary, find_shim, native
    from memtrace_trainer.errors import UserError

    value = tmp_path / "none"
    if kind == "file":
        value.write_text("")
    monkeypatch.setenv("MEMTRACE_BIN_DIR", str(value))
    said = f"$MEMTRACE_BIN_DIR={value}: " + ("no such directory" if kind == "missing"
                                             else "not a directory")  # fmt: skip
    for find in (lambda: find_binary("memsim"), find_shim):
        with pytest.raises(UserError, match=said.replace("$", r"\$")):
            find()
    if native() is None:  # the wheel's commands run in-process: no binary is looked for
        done = cli("symtrace", "--model", MLP, "--batch-size", "2", "--out",
                   str(tmp_path / "t.mtrace"), check=False)  # fmt: skip
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert not (tmp_path / "t.mtrace").exists()
    monkeypatch.setenv("MEMTRACE_BIN_DIR", "")  # empty: unset, as before
    assert find_binary("memsim").source != "$MEMTRACE_BIN_DIR"


@pytest.mark.parametrize("existed", [False, True])
def test_a_batch_that_traced_nothing_leaves_no_folder_of_its_own(
    tmp_path: Path, existed: bool
) -> None:
    """`symtrace --batch` where every config failed left the --out-dir it had made, empty."""
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"name": "a", "model": "torchvision:nope", "batch_size": 2}\n')
    out = tmp_path / "made" / "od"
    if existed:
        out.mkdir(parents=True)
    done = cli("symtrace", "--batch", str(batch), "--out-dir", str(out), check=False)
    assert done.returncode == 2, done.stderr
    assert "1 of 1 configs failed" in done.stderr, done.stderr
    assert out.is_dir() == existed, "a folder the user made is kept, one of this run's is not"
    assert (tmp_path / "made").is_dir() == existed


def test_a_batch_that_traced_some_keeps_its_folder(tmp_path: Path) -> None:
    batch = tmp_path / "b.jsonl"
    lines = [{"name": "a", "model": "torchvision:nope", "batch_size": 2},
             {"name": "b", "model": MLP, "batch_size": 2}]  # fmt: skip
    batch.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "od"
    done = cli("symtrace", "--batch", str(batch), "--out-dir", str(out), check=False)
    assert done.returncode == 1, done.stderr
    assert sorted(os.listdir(out)) == ["b.jsonl"]


def test_an_ml_model_that_is_no_regular_file_is_said_as_such(tmp_path: Path) -> None:
    """A FIFO (or a device) given as --ml-model was said to be "no such file"."""
    fifo = tmp_path / "model.fifo"
    os.mkfifo(fifo)
    done = cli("estimate", "--model", MLP, "--batch-size", "2", "--ml-model", str(fifo),
               check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"--ml-model {fifo}: not a regular file" in done.stderr, done.stderr


def test_a_huge_reduce_bucket_is_refused_in_a_line(tmp_path: Path) -> None:
    """`--reduce-bucket-size 1e300` is a whole number: refused, it was said in 301 digits."""
    done = cli("estimate", "--model", MLP, "--batch-size", "2", "--strategy", "zero2",
               "--world-size", "2", "--reduce-bucket-size", "1e300", check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--reduce-bucket-size 1.000e+300: expected at most" in done.stderr, done.stderr
    assert len(done.stderr) < 400, done.stderr
