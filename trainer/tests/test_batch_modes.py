"""`symtrace --batch` and `fake-tensor --batch`: the file checked whole before anything runs (types,
names, the output folder), the exit status of failed configs, and flags without effect."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import cli

from memtrace_trainer.cli import models

MLP = 'synthetic:{"family":"mlp","input_size":8,"depth":2,"output_size":2}'
ROW = "input:20_output:3_depth:2_arch:pyramid_batch:64.out"


def write(path: Path, *lines: dict[str, Any] | str) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def refused(done: Any, *words: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stdout == "", done.stdout
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    for w in words:
        assert w in done.stderr, (w, done.stderr)


def symtrace(tmp_path: Path, batch: Path, *more: str) -> Any:
    return cli("symtrace", "--batch", str(batch), "--out-dir", str(tmp_path / "d"), *more,
               check=False)  # fmt: skip


GOOD = {"model": MLP, "batch_size": 2, "name": "good"}
WRONG_TYPES = [
    ({"model": MLP, "batch_size": 2, "input_shape": [8]}, "input_shape", 'a string like "8", as on the command line'),
    ({"model": MLP, "batch_size": True}, "batch_size", "a positive integer"),
    ({"model": MLP, "batch_size": "8"}, "batch_size", "a positive integer"),
    ({"model": MLP, "batch_size": 0}, "batch_size", "a positive integer"),
    ({"model": "hf:gpt2", "batch_size": 1, "seq_len": "abc"}, "seq_len", "a positive integer"),
    ({"model": MLP, "batch_size": 2, "input_shape": "8,x"}, "input_shape", "expected integers"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "field", "expected"), WRONG_TYPES)
def test_types_are_checked_before_anything_runs(
    tmp_path: Path, line: dict[str, Any], field: str, expected: str
) -> None:
    batch = write(tmp_path / "b.jsonl", GOOD, line)
    done = symtrace(tmp_path, batch)
    refused(done, f"{batch}:2:", repr(field), expected, "nothing was traced")
    assert not (tmp_path / "d").exists()  # not even line 1, nor the folder
    ft = write(tmp_path / "f.jsonl", {"model": MLP, "batch_size": 2}, line)
    refused(cli("fake-tensor", "--batch", str(ft), check=False), f"{ft}:2:", repr(field),
            expected, "nothing was run")  # fmt: skip


def test_a_string_is_no_boolean(tmp_path: Path) -> None:
    line = {"model": MLP, "batch_size": 2, "no_cuda_emulation": "false"}
    batch = write(tmp_path / "b.jsonl", line)
    refused(symtrace(tmp_path, batch), f"{batch}:1:", "'no_cuda_emulation'", "true or false")
    line = {"model": MLP, "batch_size": 2, "checkpointing": True, "kbit_prepare": True}
    done = symtrace(tmp_path, write(tmp_path / "c.jsonl", line))
    assert done.returncode == 0, done.stderr


def test_a_later_bad_line_leaves_no_partial_output(tmp_path: Path) -> None:
    ft = write(tmp_path / "f.jsonl", {"model": MLP, "batch_size": 2}, "not json")
    refused(cli("fake-tensor", "--batch", str(ft), check=False), f"{ft}:2: not JSON",
            "nothing was run")  # fmt: skip


def test_semantic_errors_name_the_line_and_field(tmp_path: Path) -> None:
    batch = write(tmp_path / "b.jsonl", GOOD, {"model": MLP})
    done = symtrace(tmp_path, batch)
    refused(done, f"{batch}:2:", "field 'batch_size' is required")
    assert "--batch-size" not in done.stderr
    batch = write(tmp_path / "b.jsonl", {"model": MLP, "batch_size": 2, "optimizer": "lion"})
    refused(symtrace(tmp_path, batch), f"{batch}:1:", "field 'optimizer' 'lion'")
    batch = write(tmp_path / "b.jsonl", {"model": MLP, "entry": "x:y", "batch_size": 2})
    refused(symtrace(tmp_path, batch), f"{batch}:1:", "exactly one of field 'model'")


@pytest.mark.parametrize(
    "name", ["../escape", "/tmp/absolute", "sub/dir", "..", "", {"k": 1}, 3, " x"]
)
def test_names_are_plain_file_names(tmp_path: Path, name: Any) -> None:
    line = {**GOOD, "name": name}
    batch = write(tmp_path / "b.jsonl", GOOD | {"name": "first"}, line)
    done = symtrace(tmp_path, batch)
    refused(done, f"{batch}:2:")
    assert not (tmp_path / "d").exists() and not (tmp_path / "escape.jsonl").exists()


def test_names_are_unique(tmp_path: Path) -> None:
    batch = write(tmp_path / "b.jsonl", GOOD | {"name": "a"}, GOOD, GOOD | {"name": "a"})
    refused(symtrace(tmp_path, batch), f"{batch}:3:", "'a' is the name of line 1")
    # An explicit name that an unnamed line is given automatically.
    unnamed = {"model": MLP, "batch_size": 2}
    batch = write(tmp_path / "b.jsonl", GOOD | {"name": "config-00002"}, unnamed)
    refused(symtrace(tmp_path, batch), f"{batch}:1:", "automatic name of the unnamed line 2")
    batch = write(tmp_path / "b.jsonl", GOOD, unnamed, GOOD | {"name": "config-00002"})
    refused(symtrace(tmp_path, batch), f"{batch}:3:", "automatic name of the unnamed line 2")
    ft = write(tmp_path / "f.jsonl", GOOD | {"name": "a"}, GOOD | {"name": "a"})
    refused(cli("fake-tensor", "--batch", str(ft), check=False), f"{ft}:2:", "unique")


def test_a_name_with_the_traces_extension_is_not_given_it_twice(tmp_path: Path) -> None:
    """`"name": "x.jsonl"` wrote `x.jsonl.jsonl`."""
    batch = write(tmp_path / "b.jsonl", GOOD | {"name": "x.jsonl"}, GOOD | {"name": "y"})
    done = symtrace(tmp_path, batch)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["x.jsonl", "y.jsonl"]
    outs = {r["name"]: r["out"] for r in map(json.loads, done.stdout.splitlines())}
    assert outs == {
        "x.jsonl": str(tmp_path / "d" / "x.jsonl"),
        "y": str(tmp_path / "d" / "y.jsonl"),
    }
    # `x` and `x.jsonl` are one file; a name of the other format and the bare extension are no
    # names of a JSON-lines trace.
    both = write(tmp_path / "b.jsonl", GOOD | {"name": "x"}, GOOD | {"name": "x.jsonl"})
    refused(symtrace(tmp_path, both), f"{both}:2: field 'name': 'x.jsonl' writes x.jsonl, as 'x'")
    for name, said in (("t.mtrace", "expected a name without .mtrace"),
                       (".jsonl", "expected a name before .jsonl")):  # fmt: skip
        bad = write(tmp_path / "b.jsonl", GOOD | {"name": name})
        refused(symtrace(tmp_path, bad), f"{bad}:1: field 'name': {name!r}", said)
    # fake-tensor writes no file per config: its names are labels alone.
    ft = write(tmp_path / "f.jsonl", GOOD | {"name": "a"}, GOOD | {"name": "a.jsonl"})
    assert cli("fake-tensor", "--batch", str(ft), check=False).returncode == 0


def test_out_dir_that_is_a_file_or_cannot_be_made(tmp_path: Path) -> None:
    batch = write(tmp_path / "b.jsonl", GOOD)
    afile = tmp_path / "afile"
    afile.write_text("x")
    done = cli("symtrace", "--batch", str(batch), "--out-dir", str(afile), check=False)
    refused(done, f"--out-dir {afile}: a file; expected a folder", "nothing was traced")
    done = cli("symtrace", "--batch", str(batch), "--out-dir", str(afile / "sub"), check=False)
    refused(done, f"--out-dir {afile / 'sub'}", "cannot create it")
    assert afile.read_text() == "x"


def test_batch_that_is_a_folder_or_empty(tmp_path: Path) -> None:
    refused(symtrace(tmp_path, tmp_path), "a folder; expected a file")
    refused(cli("fake-tensor", "--batch", str(tmp_path), check=False), "a folder")
    empty = write(tmp_path / "e.jsonl", "", "  ")
    refused(symtrace(tmp_path, empty), "no configs")
    refused(cli("fake-tensor", "--batch", str(empty), check=False), "no configs")


def test_exit_status_of_failed_configs(tmp_path: Path) -> None:
    bad = {"model": "nosuch:x", "batch_size": 2, "name": "bad"}
    done = symtrace(tmp_path, write(tmp_path / "all.jsonl", bad))
    assert done.returncode == 2 and "1 of 1 configs failed (bad)" in done.stderr
    assert json.loads(done.stdout)["name"] == "bad"
    done = symtrace(tmp_path, write(tmp_path / "some.jsonl", GOOD, bad))
    assert done.returncode == 1 and "1 of 2 configs failed (bad)" in done.stderr
    assert [json.loads(x)["name"] for x in done.stdout.splitlines()] == ["good", "bad"]
    assert (tmp_path / "d" / "good.jsonl").is_file()
    ft = write(tmp_path / "f.jsonl", GOOD, bad)
    done = cli("fake-tensor", "--batch", str(ft), check=False)
    assert done.returncode == 1 and "1 of 2 configs failed (bad)" in done.stderr
    done = cli("fake-tensor", "--batch", str(write(tmp_path / "g.jsonl", bad)), check=False)
    assert done.returncode == 2 and "1 of 1 configs failed" in done.stderr


# Every command that takes --batch-size with --entry (or --step): 0 divided by zero in the
# features ("internal error"), -3 reached the user's code, and max-seq and min-world-size answered
# "at batch 0". `estimate --model` and `symtrace` refused it already: one check for all.
BATCHED = [
    ["estimate", "--entry", "entry_failures:sized"],
    ["estimate", "--model", MLP],
    ["estimate", "--step", "step_examples:sized"],
    ["estimate", "--step", "step_examples:default_adamw"],  # takes none: refused, not "no effect"
    ["max-seq", "--entry", "entry_failures:sized"],
    ["min-world-size", "--entry", "entry_failures:sized", "--strategy", "ddp"],
    ["symtrace", "--entry", "entry_failures:sized", "--out", "{tmp}/t.jsonl"],
    ["run", "--entry", "entry_failures:sized", "--device", "cpu", "--out", "{tmp}/r"],
    ["fake-tensor", "--entry", "entry_failures:sized"],
]


@pytest.mark.parametrize("bad", ["0", "-3"])
@pytest.mark.parametrize("args", BATCHED, ids=lambda a: " ".join(a[:3]))
def test_a_batch_below_one_is_refused_by_every_command(
    tmp_path: Path, args: list[str], bad: str
) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = cli(*args, f"--batch-size={bad}", check=False)
    refused(done, f"error: --batch-size {bad}: expected a positive integer")
    assert "warning" not in done.stderr, done.stderr  # refused before anything else is said
    assert list(tmp_path.iterdir()) == []


def test_batch_size_zero_is_refused_not_taken_for_unset(tmp_path: Path) -> None:
    done = cli("fake-tensor", "--gpumemnet-row", ROW, "--batch-size", "0", check=False)
    refused(done, "--batch-size 0: expected a positive integer")
    ft = write(tmp_path / "f.jsonl", {"gpumemnet_row": ROW, "batch_size": 0})
    refused(cli("fake-tensor", "--batch", str(ft), check=False), f"{ft}:1:", "'batch_size'")


def test_a_row_of_batch_zero_is_refused_as_the_rows_field() -> None:
    """It was said as `--batch-size 0`, a flag the user never gave."""
    row = ROW.replace("batch:64", "batch:0")
    for command in ("features", "fake-tensor"):
        done = cli(command, "--gpumemnet-row", row, check=False)
        refused(done, f"--gpumemnet-row {row}: its batch field is 0, expected a positive integer")
        assert "--batch-size 0" not in done.stderr
    # A --batch-size given replaces the row's, as it does for any row.
    assert cli("features", "--gpumemnet-row", row, "--batch-size", "2").returncode == 0


def test_flags_without_effect_are_warned(tmp_path: Path) -> None:
    done = cli("features", "--gpumemnet-row", ROW, "--batch-size", "9", "--seq-len", "5",
               "--num-classes", "3", "--csv")  # fmt: skip
    assert "9" in done.stdout.splitlines()[1].split(",")  # the Batch Size cell is --batch-size's
    assert "--seq-len 5 has no effect" in done.stderr
    assert "--num-classes 3 has no effect" in done.stderr
    done = cli("features", "--gpumemnet-row", ROW, "--json")
    assert json.loads(done.stdout)["batch_size"] == 64 and "batch_size = 64" in done.stderr
    batch = write(tmp_path / "b.jsonl", GOOD)
    done = symtrace(tmp_path, batch, "--out", str(tmp_path / "ignored.jsonl"), "--json",
                    "--partition", "foo", "--timeout-min", "5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    for flag in ("--out", "--json", "--partition", "--timeout-min"):
        assert f"warning: {flag} has no effect" in done.stderr, (flag, done.stderr)
    assert not (tmp_path / "ignored.jsonl").exists()
    done = cli("symtrace", "--model", MLP, "--batch-size", "2", "--out", str(tmp_path / "s.jsonl"),
               "--out-dir", str(tmp_path / "nodir"), "--array-parallelism", "3")  # fmt: skip
    assert "--out-dir has no effect" in done.stderr and "--array-parallelism" in done.stderr
    assert not (tmp_path / "nodir").exists()
    # A Slurm array run on this machine takes no partition, as `launch` says of its own (it was
    # taken in silence); the array's task count is still --array-parallelism's.
    done = symtrace(tmp_path, batch, "--backend", "slurm", "--submitit-cluster", "debug",
                    "--partition", "gpu", "--array-parallelism", "2")  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = "--partition has no effect: --submitit-cluster debug runs the array on this machine"
    assert said in done.stderr and "--array-parallelism has" not in done.stderr, done.stderr


def test_fake_tensor_says_its_defaults(tmp_path: Path) -> None:
    args = ["fake-tensor", "--model", "torchvision:resnet18", "--batch-size", "2"]
    done = cli(*args, "--input-shape", "3,32,32")
    assert "note: num_classes = 1000" in done.stderr
    got = json.loads(cli(*args, "--input-shape", "3,32,32", "--json").stdout)
    assert got["defaults"]["num_classes"]["value"] == 1000 and got["warnings"] == []
    done = cli("fake-tensor", "--gpumemnet-row", ROW)
    assert "note: batch_size = 64" in done.stderr
    ft = write(tmp_path / "f.jsonl", {"model": MLP, "batch_size": 2, "seq_len": 64, "name": "s"})
    done = cli("fake-tensor", "--batch", str(ft))
    line = json.loads(done.stdout)
    assert line["warnings"] and "seq_len" in line["warnings"][0], line
    assert "warning: s: field 'seq_len' 64 has no effect" in done.stderr, done.stderr
    # A value the command line gives every line is named as its flag.
    ft = write(tmp_path / "f.jsonl", {"model": MLP, "batch_size": 2, "name": "s"})
    done = cli("fake-tensor", "--batch", str(ft), "--seq-len", "64")
    assert "warning: s: --seq-len 64 has no effect" in done.stderr, done.stderr


def test_symtrace_batch_warnings_carry_the_name(tmp_path: Path) -> None:
    batch = write(tmp_path / "b.jsonl", GOOD | {"seq_len": 64})
    done = symtrace(tmp_path, batch)
    assert "warning: good: field 'seq_len' 64 has no effect" in done.stderr, done.stderr
    assert json.loads(done.stdout)["warnings"] == [
        x.removeprefix("warning: good: ") for x in done.stderr.splitlines() if "good:" in x
    ]


def test_an_interrupt_names_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = models._symtrace_one

    def one(config: dict[str, Any], out: Path) -> dict[str, Any]:
        if out.name == "second.jsonl":
            raise KeyboardInterrupt
        return real(config, out)

    monkeypatch.setattr(models, "_symtrace_one", one)
    batch = write(tmp_path / "b.jsonl", GOOD, GOOD | {"name": "second"}, GOOD | {"name": "c"})
    done = symtrace(tmp_path, batch)
    assert done.returncode == 2
    assert "interrupted while tracing 'second' (2 of 3)" in done.stderr, done.stderr
    assert [json.loads(x)["name"] for x in done.stdout.splitlines()] == ["good"]
