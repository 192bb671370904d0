"""Nothing silent in the trainer's CLI: flags without effect, the defaults that shape an answer,
profile placeholders, and the user's own exceptions (one line plus their frames, exit 2)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import REPO, cli

from memtrace_trainer.binaries import find_binary
from memtrace_trainer.cli import parser
from memtrace_trainer.profile import load_profile

MLP = 'synthetic:{"family":"mlp","input_size":32,"output_size":4,"depth":2}'


def test_one_dispatcher_knows_every_command() -> None:
    _, handlers = parser()
    assert set(handlers) == {"features", "symtrace", "sample", "fake-tensor", "estimate",
                             "max-batch", "max-seq", "min-world-size", "hf-models", "kernel-stats",
                             "run", "launch", "dataset", "serve"}  # fmt: skip


def test_flags_are_never_abbreviated_and_the_optimizer_help_lists_every_optimizer() -> None:
    """`--step` given to a command without it was taken for `--steps` ("invalid int value")."""
    from memtrace_trainer.optim import OPTIMIZERS

    done = cli("max-seq", "--step", "x:y", "--model", MLP, "--batch-size", "1", check=False)
    assert done.returncode == 2 and "unrecognized arguments: --step x:y" in done.stderr
    p, _ = parser()
    sub = next(a for a in p._actions if a.dest == "command").choices["estimate"]  # type: ignore[union-attr]
    help_text = next(a.help for a in sub._actions if a.dest == "optimizer")
    assert help_text.split(" (")[0].split("|") == list(OPTIMIZERS)


def test_seq_len_reaches_an_entry_that_takes_it_and_is_warned_about_otherwise(
    tmp_path: Path,
) -> None:
    out = tmp_path / "t.jsonl"
    done = cli("symtrace", "--entry", "entry_failures:sized", "--batch-size", "2", "--seq-len",
               "16", "--out", str(out), "--json")  # fmt: skip
    assert "has no effect" not in done.stderr
    # Linear(8 * 16, 2): the weight 2 x 128 fp32 = 1024 bytes is the largest parameter.
    sizes = [json.loads(line).get("size", 0) for line in out.read_text().splitlines()[1:]]
    assert 2 * 8 * 16 * 4 in sizes
    done = cli("symtrace", "--entry", "entry_failures:oom", "--batch-size", "2", "--seq-len",
               "16", "--out", str(out), "--json")  # fmt: skip
    assert "--seq-len 16 has no effect: entry_failures:oom takes no `seq_len`" in done.stderr
    assert json.loads(done.stdout)["warnings"] == [
        "--seq-len 16 has no effect: entry_failures:oom takes no `seq_len` parameter"
    ]
    done = cli("symtrace", "--model", "torchvision:resnet18", "--batch-size", "1", "--seq-len",
               "16", "--out", str(out), "--json")  # fmt: skip
    assert "--seq-len 16 has no effect: torchvision:resnet18 is an image model" in done.stderr
    done = cli("features", "--model", MLP, "--num-classes", "7")
    assert "--num-classes 7 has no effect" in done.stderr


def test_defaults_that_shape_the_answer_are_printed_and_kept(tmp_path: Path) -> None:
    done = cli("features", "--model", "hf:gpt2", "--batch-size", "1")
    assert "note: seq_len = 1024 (max_position_embeddings, the model's maximum" in done.stderr
    out = tmp_path / "r.jsonl"
    done = cli("symtrace", "--model", "torchvision:resnet18", "--batch-size", "1",
               "--out", str(out), "--json")  # fmt: skip
    result = json.loads(done.stdout)
    assert result["defaults"]["input_shape"]["value"] == [3, 224, 224]
    assert result["defaults"]["num_classes"]["value"] == 1000
    assert result["iterations"] == 2


def test_profiles_come_from_the_rust_parser_with_their_placeholders(tmp_path: Path) -> None:
    memsim = find_binary("memsim").path
    raw = json.loads(subprocess.run([str(memsim), "profile", "a100-40gb", "--json"],
                                    capture_output=True, text=True, check=True).stdout)  # fmt: skip
    p = load_profile("a100-40gb")
    assert p.path == REPO / "profiles" / "a100-40gb.toml"
    assert p.compute_capability == tuple(raw["gpu"]["compute_capability"])
    assert p.total_memory == raw["gpu"]["total_memory"]
    assert p.cublas_workspace_bytes == raw["derived"]["cublas_workspace_bytes"] == 8_519_680
    assert p.cublaslt_workspace_bytes == 1 << 20  # cublaslt_per_call = true in this profile
    assert p.cudnn_workspace_factor == raw["workspace"]["cudnn_workspace_factor"]
    assert load_profile(None) == p
    h200 = load_profile("h200")
    assert h200.cublaslt_workspace_bytes == 0 and "gpu.total_memory" in h200.unmeasured
    done = cli("symtrace", "--model", MLP, "--batch-size", "2", "--profile", "h200",
               "--out", str(tmp_path / "h.jsonl"))  # fmt: skip
    assert "workspace.cublas_workspace_config is marked unmeasured" in done.stderr


def test_the_users_exception_is_one_line_and_their_frames(tmp_path: Path) -> None:
    out = str(tmp_path / "t.jsonl")
    done = cli("symtrace", "--entry", "entry_failures:bad_forward", "--batch-size", "2",
               "--out", out, check=False)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    first, *frames = done.stderr.strip().splitlines()
    said = "error: --entry 'entry_failures:bad_forward': the model failed at batch 2: RuntimeError:"
    assert first.startswith(said), done.stderr
    assert any("entry_failures.py" in f and "in forward" in f for f in frames), done.stderr
    assert not any("site-packages" in f or "memtrace_trainer" in f for f in frames), done.stderr
    done = cli("symtrace", "--entry", "entry_failures:broken", "--batch-size", "2",
               "--out", out, check=False)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "broken() raised RuntimeError: injected failure" in done.stderr
    assert "entry_failures.py" in done.stderr and "in broken" in done.stderr


def test_bytes_by_category_is_named_for_what_it_sums(tmp_path: Path) -> None:
    """`bytes_by_category` sat beside the peak fields while summing every allocation of the
    trace (workspace several times the peak): its name says so now."""
    out = tmp_path / "t.jsonl"
    result = json.loads(cli("symtrace", "--model", MLP, "--batch-size", "4", "--steps", "3",
                            "--out", str(out), "--json").stdout)  # fmt: skip
    summed: dict[str, int] = {}
    for line in out.read_text().splitlines()[1:]:
        event = json.loads(line)
        if event.get("kind") == "alloc":
            summed[event["category"]] = summed.get(event["category"], 0) + event["size"]
    assert result["allocated_bytes_by_category"] == summed
    # Three steps allocate each step's activations anew: more than was ever live at once.
    assert sum(summed.values()) > result["peak_live_bytes"]
    assert "bytes_by_category" not in result


def test_max_batch_of_a_model_batchnorm_refuses_at_batch_1_starts_at_2() -> None:
    """PyTorch's BatchNorm trains on no single sample: a torchvision ResNet's search failed at its
    first probe, batch 1, where batch 2 and up fit."""
    args = ["max-batch", "--model", "torchvision:resnet18", "--input-shape", "3,32,32",
            "--steps", "1"]  # fmt: skip
    data = json.loads(cli(*args, "--limit", "4", "--json").stdout)
    assert data["max_batch"] == 4 and [p["batch"] for p in data["probes"]] == [2, 4], data
    said = [w for w in data["warnings"] if "starts at batch 2" in w]
    assert said and "fails at batch 1 (ValueError: Expected more than 1 value per" in said[0], said
    none = cli(*args, "--capacity", "64MiB", check=False)
    assert none.returncode == 1, none.stderr
    assert "does not fit even at batch 2 on" in none.stdout, none.stdout
    assert "; 1 probe in " in none.stdout, none.stdout
    # Nothing past batch 1 to search: PyTorch's refusal is the answer.
    one = cli(*args, "--limit", "1", check=False)
    assert one.returncode == 2 and "PyTorch refused to train it at batch 1" in one.stderr


def test_ml_model_is_said_where_it_has_no_effect_and_checked_where_it_has(
    tmp_path: Path,
) -> None:
    """`--ml-model` with --step was dropped in silence (the ML estimate needs the features a step
    does not expose); with --model a missing file failed in memest after the trace, in words
    naming no flag."""
    done = cli("estimate", "--step", "step_examples:default_adamw", "--ml-model",
               str(tmp_path / "none.json"), "--no-fake-tensor", "--json")  # fmt: skip
    said = json.loads(done.stdout)["warnings"]
    assert any(w.startswith("--ml-model has no effect with --step") for w in said), said
    for path, found in ((tmp_path / "none.json", "no such file"), (tmp_path, "a folder")):
        done = cli("estimate", "--model", MLP, "--batch-size", "2", "--ml-model", str(path),
                   check=False)  # fmt: skip
        assert done.returncode == 2, done.stdout
        assert f"error: --ml-model {path}: {found}; expected a trained ML model" in done.stderr


def test_steps_and_its_alias_iterations_with_two_values_are_refused() -> None:
    """`--steps 2 --iterations 4` set one setting twice, and the last one was taken in silence."""
    args = ["estimate", "--model", MLP, "--batch-size", "2", "--json"]
    done = cli(*args, "--steps", "2", "--iterations", "4", check=False)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert "--steps 2 and --iterations 4 conflict: they are one setting (aliases)" in done.stderr
    # One value twice is no conflict, nor is one flag given twice (argparse's last one wins).
    for steps in (["--steps", "1", "--iterations", "1"], ["--steps", "3", "--steps", "1"]):
        assert json.loads(cli(*args, *steps).stdout)["inputs"]["iterations"] == 1


def test_a_flag_without_effect_is_named_as_typed() -> None:
    """`--no-kbit-prepare` beside --step was warned about as `--kbit-prepare`, a flag that does
    not exist."""
    done = cli("estimate", "--step", "step_examples:default_adamw", "--no-kbit-prepare",
               "--no-fake-tensor", "--json")  # fmt: skip
    said = json.loads(done.stdout)["warnings"]
    assert "--no-kbit-prepare has no effect with --step: your code decides" in said, said
