"""torchsummary-style activations against the GPUMemNet CSVs, and the features command."""

from __future__ import annotations

import ast
import csv
import io
import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import FULL_CSV, cli, cli_process, csv_sample, gpumemnet_csv, gpumemnet_rows

from memtrace_trainer.features import extract
from memtrace_trainer.models.cnn import CNNConfig
from memtrace_trainer.models.gpumemnet import from_gpumemnet_filename
from memtrace_trainer.models.zoo import build_workload


def sequence(filename: str, batch: int = 2) -> list[tuple[str, int, int]]:
    cfg, _ = from_gpumemnet_filename(filename)
    w = build_workload(f"gpumemnet:{filename}", batch)
    with torch.device("meta"):
        return extract(w, cfg.family).gpumemnet_sequence


@pytest.mark.parametrize(
    "name", ["mlp_data_step1.csv", "mlp_data_step2.csv", "cnn_data_step1_early.csv"]
)
def test_activations_params_match_csv(name: str) -> None:
    all_rows = gpumemnet_rows(name)
    rows = csv_sample(all_rows, name)
    checked, wrong = 0, []
    for r in rows:
        if r["Activations-Params"] == "[]" or "arch:dense" in r["Filename"]:
            continue  # no summary recorded / dense layout not recoverable from the name
        expect = [tuple(x) for x in ast.literal_eval(r["Activations-Params"])]
        got = sequence(r["Filename"])
        checked += 1
        if "_output:1_" in r["Filename"] and "act:" in r["Filename"]:
            # Single-output rows end in Sigmoid (14 rows) or Identity (9): a draw the Filename
            # does not record. Neither has parameters; compare everything but the head's name.
            assert expect[-1][0] in ("Sigmoid", "Identity")
            expect[-1] = (got[-1][0], *expect[-1][1:])
        if got != expect or sum(a for _, a, _ in got) != int(r["Total Activations"]):
            wrong.append(r["Filename"])
    assert wrong == []
    comparable = [
        r for r in rows if r["Activations-Params"] != "[]" and "arch:dense" not in r["Filename"]
    ]
    assert checked == len(comparable) > 0
    if FULL_CSV:
        expect = {"mlp_data_step1.csv": 3000, "mlp_data_step2.csv": 3000,
                  "cnn_data_step1_early.csv": 1734}  # fmt: skip
        assert checked == expect[name] and len(rows) == len(all_rows)


def test_dense_rows_match_one_layout() -> None:
    dense = [
        r
        for r in gpumemnet_rows("cnn_data_step1_early.csv")
        if "arch:dense" in r["Filename"] and r["Activations-Params"] != "[]"
    ]
    assert len(dense) == 242
    rows = csv_sample(dense, "cnn_data_step1_early.csv (dense rows)", 60)
    for r in rows:
        cfg, _ = from_gpumemnet_filename(r["Filename"], dense_interval=1)
        assert isinstance(cfg, CNNConfig)
        expect = [tuple(x) for x in ast.literal_eval(r["Activations-Params"])]
        seqs = []
        for k in cfg.dense_interval_choices():
            w = build_workload(f"synthetic:{json.dumps({**cfg.to_dict(), 'dense_interval': k})}", 2)
            with torch.device("meta"):
                seqs.append(extract(w, "cnn").gpumemnet_sequence)
        assert expect in seqs, r["Filename"]


def test_features_cli_json_contract() -> None:
    out = json.loads(
        cli("features", "--model", "torchvision:resnet18", "--batch-size", "2", "--json").stdout
    )
    assert out["total_parameters"] == 11_689_512
    assert out["layers"]["conv1"] == {
        "type": "Conv2d",
        "activations": 64 * 112 * 112,
        "parameters": 9408,
    }
    assert out["total_activations"] > 0 and out["layer_counts"]["Conv2d"] == 20


TINY_TRANSFORMER = ('synthetic:{"family":"transformer","seq_len":64,"embed_dim":32,"layers":1,'
                    '"heads":2,"vocab_size":100,"num_classes":2}')  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "sizes"),
    [
        (["--model", "torchvision:resnet18"], {"input_shape": [3, 224, 224]}),
        (["--model", "torchvision:resnet18", "--input-shape", "3,64,64"],
         {"input_shape": [3, 64, 64]}),
        (["--model", "hf:gpt2", "--seq-len", "128"], {"seq_len": 128}),
        (["--model", "hf:gpt2"], {"seq_len": 1024}),
        (["--model", TINY_TRANSFORMER], {"seq_len": 64}),
        (["--model", TINY_TRANSFORMER, "--input-shape", "16"], {"seq_len": 16}),
        (["--model", "dlrm"], {}),
    ],
)  # fmt: skip
def test_features_json_names_the_input_size_they_are_of(
    flags: list[str], sizes: dict[str, object]
) -> None:
    """Features carried the batch but not the sequence length or image size they were computed
    for, so features of another length passed for a trace's without a word."""
    out = json.loads(cli("features", *flags, "--json").stdout)
    assert {k: out[k] for k in ("seq_len", "input_shape") if k in out} == sizes, out
    assert out["batch_size"] == 1 and out["total_parameters"] > 0


def test_an_entrys_features_name_the_sequence_length_it_was_built_for() -> None:
    """`estimate --entry` hands memest these features: the length given, else the function's
    own default; none for a function that takes no length."""
    from memtrace_trainer.estimate import ModelJob
    from memtrace_trainer.models.zoo import load_entry
    from memtrace_trainer.symtrace.step import StepConfig

    for seq, want in ((None, 4), (12, 12)):
        job = ModelJob(lambda s=seq: load_entry("entry_failures:sized", 2, seq_len=s), StepConfig())
        assert job.features()["seq_len"] == want
    assert "seq_len" not in load_entry("entry_example:batch_norm", 2).sizes


def test_features_cli_csv_of_a_zoo_model_says_what_json_says() -> None:
    """A zoo model's CSV row took GPUMemNet's MLP columns: ResNet-18 had Depth 1 and no batch
    norms beside `--json`'s 41 and 20, and batch 1 was chosen without a note."""
    done = cli("features", "--model", "torchvision:resnet18", "--csv")
    feats = json.loads(cli("features", "--model", "torchvision:resnet18").stdout)
    got = next(csv.DictReader(io.StringIO(done.stdout)))
    assert got["Depth"] == str(feats["depth"]) == "41"
    assert got["BatchNorm2d Count"] == str(feats["layer_counts"]["BatchNorm2d"]) == "20"
    assert got["Conv2d Count"] == "20" and got["Total Parameters"] == "11689512"
    assert got["Batch Size"] == "1" and "note: batch_size = 1" in done.stderr
    assert "note: batch_size" not in cli("features", "--model", "torchvision:resnet18",
                                         "--batch-size", "1").stderr  # fmt: skip


def test_features_cli_gpumemnet_row_csv() -> None:
    row = gpumemnet_rows("mlp_data_step2.csv")[0]
    out = cli("features", "--gpumemnet-row", row["Filename"], "--csv").stdout
    got = next(csv.DictReader(io.StringIO(out)))
    for col in (
        "Depth",
        "Activations-Params",
        "Activation Function",
        "Total Activations",
        "Total Parameters",
        "Batch Size",
        "Batch Normalization Layers",
        "Dropout Layers",
    ):
        assert got[col] == row[col], col


def test_features_cli_gpumemnet_cnn_row_csv() -> None:
    # GPUMemNet's CNN Depth counts Conv2d layers only (an MLP's counts Linear layers).
    row = gpumemnet_rows("cnn_data_step1_early.csv")[0]
    out = cli("features", "--gpumemnet-row", row["Filename"], "--csv").stdout
    got = next(csv.DictReader(io.StringIO(out)))
    for col in ("Depth", "Activation Function", "Total Activations", "Total Parameters",
                "Batch Size", "Conv2d Count", "BatchNorm2d Count", "Dropout Count",
                "Linear Count"):  # fmt: skip
        assert got[col] == row[col], col


def test_features_cli_errors_are_clean() -> None:
    # The real `python -m memtrace_trainer` once: exit status 2 and one line, no traceback.
    done = cli_process("features", "--model", "nope:x", check=False)
    assert (
        done.returncode == 2
        and "unknown model spec" in done.stderr
        and "Traceback" not in done.stderr
    )
    done = cli("features", "--model", "torchvision:resnet18", "--input-shape", "3,x", check=False)
    assert done.returncode == 2 and "--input-shape" in done.stderr


# `features --json` printed its own activation encoding (2πi/12 over its own order: ReLU (0, 1),
# and (0, 0) for an activation outside its list), no estimator's, and nothing `memest ml predict`
# could take. The document now goes to memest as it is, and memest computes GPUMemNet's features
# from it in one place (estimators/src/ml/job.rs): `ml predict` answers what the `ml` estimate of
# `memest estimate --features` answers.
def _memest(*args: str) -> subprocess.CompletedProcess[str]:
    from memtrace_trainer.binaries import run_tool

    return run_tool("memest", list(args))


MLP = {"family": "mlp", "input_size": 64, "output_size": 10, "depth": 3}
CNN = {"family": "cnn", "input_channels": 3, "num_classes": 10, "depth": 2,
       "architecture": "uniform", "base_filters": 8, "input_size": 16, "batchnorm": True,
       "dropout": 0.1}  # fmt: skip


@pytest.fixture(scope="module")
def ml(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny linear model per family (GPUMemNet's MLP data with several activations, and its
    CNN data), and a trace for `memest estimate` (any job: only its ML answer is read)."""
    d = tmp_path_factory.mktemp("ml")
    data = {"mlp": "mlp_data_step2.csv", "cnn": "cnn_data_step1_early.csv"}
    for family, name in data.items():
        done = _memest("ml", "train", "--dataset", str(gpumemnet_csv(name)), "--model",
                       "linear-reg", "--out", str(d / f"{family}.json"))  # fmt: skip
        assert done.returncode == 0, done.stderr
    cli("symtrace", "--model", "synthetic:" + json.dumps(MLP), "--batch-size", "2",
        "--out", str(d / "trace.jsonl"))  # fmt: skip
    return {**{f: d / f"{f}.json" for f in data}, "trace": d / "trace.jsonl", "dir": d}


@pytest.mark.parametrize("act", ["relu", "gelu", "tanh", "sigmoid"])
@pytest.mark.parametrize("family,base", [("mlp", MLP), ("cnn", CNN)], ids=["mlp", "cnn"])
def test_features_json_goes_to_memest_ml_predict_as_it_is(
    family: str, base: dict, act: str, ml: dict[str, Path]
) -> None:
    done = cli("features", "--model", "synthetic:" + json.dumps({**base, "activation": act}),
               "--batch-size", "64", "--json")  # fmt: skip
    doc = json.loads(done.stdout)
    assert "activation_encoding" not in doc  # the old encoding, no estimator's
    path = ml["dir"] / f"{family}-{act}.json"
    path.write_text(done.stdout)
    est = _memest("estimate", "--trace", str(ml["trace"]), "--features", str(path),
                  "--ml-model", str(ml[family]), "--json")  # fmt: skip
    assert est.returncode in (0, 1), est.stderr
    out = json.loads(est.stdout)
    answer = out["estimates"]["ml"]
    pred = _memest("ml", "predict", "--model", str(ml[family]), "--features", str(path), "--json")
    if answer is None:
        # An activation outside GPUMemNet's vocabulary (Sigmoid): no estimate either way, and
        # predict refuses it naming the activation, not a (0, 0) stand-in.
        name = doc["activation_function"] or "None"  # memest's word for none found
        assert name in out["unavailable"]["ml"], out["unavailable"]
        assert pred.returncode == 2 and f'"{name}"' in pred.stderr, pred.stderr
        return
    assert pred.returncode == 0, pred.stderr
    assert json.loads(pred.stdout)[0]["estimate"] == pytest.approx(answer["device_mib"], rel=1e-12)
