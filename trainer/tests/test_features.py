"""torchsummary-style activations against the GPUMemNet CSVs, and the features command."""

from __future__ import annotations

import ast
import collections
import csv
import io
import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import FULL_CSV, REPO, cli, cli_process, csv_sample, gpumemnet_csv, gpumemnet_rows

from memtrace_trainer.features import (
    CNN_ACTIVATIONS,
    GPUMEMNET_ACTIVATIONS,
    Features,
    extract,
)
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
    # Every call is in `layers` as in `sequence` (a block's shared ReLU is called twice: keyed by
    # name alone, the second call overwrote the first and memest warned on every ResNet).
    assert len(out["layers"]) == len(out["sequence"]) and "layer1.0.relu#2" in out["layers"]
    calls = [[la["type"], la["activations"], la["parameters"]] for la in out["layers"].values()]
    assert calls == out["sequence"]


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


# The generator's transformer was no transformer to memest: `gpumemnet_sequence` (what the ML
# estimate reads) listed its Linear and Dropout layers only, never the attention (the hooks saw
# nn.MultiheadAttention, which is no leaf, and never its out_proj, whose forward it does not
# call), nor its LayerNorm and Embedding layers. memest read it as an MLP and refused its
# activation "None". Each attention block is now GPUMemNet's NonDynamicallyQuantizableLinear.
def _transformer(layers: int, norm_first: bool) -> str:
    return "synthetic:" + json.dumps({
        "family": "transformer", "seq_len": 16, "embed_dim": 32, "layers": layers, "heads": 2,
        "vocab_size": 100, "num_classes": 3, "norm_first": norm_first,
    })  # fmt: skip


@pytest.mark.parametrize(
    ("model", "blocks", "want"),
    [
        # Per encoder layer: one attention, two Linear, two LayerNorm, three Dropout (as
        # GPUMemNet's Transformer rows), then the final LayerNorm and classifier.
        (_transformer(1, True), 1, {"Embedding": 2, "Linear": 3, "LayerNorm": 3, "Dropout": 3}),
        (_transformer(3, False), 3, {"Embedding": 2, "Linear": 7, "LayerNorm": 7, "Dropout": 9}),
        # torchvision's ViT (nn.MultiheadAttention) and GPT-2 (its own GPT2Attention).
        ("torchvision:vit_b_16", 12, {"Linear": 25, "LayerNorm": 25, "Dropout": 37}),
        ("hf:gpt2", 12, {"Embedding": 2, "Linear": 1, "LayerNorm": 25, "Dropout": 25}),
    ],
)
def test_attention_models_list_their_attention_in_gpumemnet_spelling(
    model: str, blocks: int, want: dict[str, int]
) -> None:
    doc = json.loads(cli("features", "--model", model, "--seq-len", "16").stdout)
    kinds = [kind for kind, _, _ in doc["gpumemnet_sequence"]]
    assert kinds.count("NonDynamicallyQuantizableLinear") == blocks, kinds
    assert {k: n for k, n in collections.Counter(kinds).items()
            if k != "NonDynamicallyQuantizableLinear"} == want  # fmt: skip
    # Every listed layer holds its own parameters, and the attention entries hold the rest.
    if model.startswith("synthetic:"):
        assert sum(p for _, _, p in doc["gpumemnet_sequence"]) == doc["total_parameters"]


def _gpumemnet_transformer_rows(n: int) -> list[dict[str, object]]:
    """Rows in the shape of GPUMemNet's Transformer data (`transformer_data.csv`): an
    Embedding, per encoder layer its attention output projection, two Linear, two LayerNorm and
    three Dropout, a classifier; made-up labels that grow with parameters and activations."""
    rows = []
    for i in range(n):
        layers, e, ff, batch = 1 + i % 6, (32, 64, 128)[i % 3], 64 * (2 + i % 3), 2 << (i % 4)
        seq = [("Embedding", 64 * e, 1000 * e)]
        for _ in range(layers):
            seq += [("NonDynamicallyQuantizableLinear", e, e * e + e), ("Linear", ff, e * ff + ff),
                    ("Dropout", ff, 0), ("Linear", e, ff * e + e), ("LayerNorm", e, 0),
                    ("LayerNorm", e, 0), ("Dropout", e, 0), ("Dropout", e, 0)]  # fmt: skip
        seq.append(("Linear", 10, 10 * e + 10))
        acts, params = sum(a for _, a, _ in seq), sum(p for _, _, p in seq)
        rows.append({
            "Filename": f"transformer-{i}", "Depth": len(seq), "Activations-Params": repr(seq),
            "Activation Function": "None", "Total Activations": acts, "Total Parameters": params,
            "Batch Size": batch, "Status": "SUCCESSFUL",
            "Max GPU Memory (MiB)": 1500 + (16 * params + 4 * acts * batch) // 2**20,
        })  # fmt: skip
    return rows


def test_generator_transformer_features_go_to_a_transformer_ml_model(tmp_path: Path) -> None:
    """A model trained on Transformer rows answers for the generator's transformer (it said
    "this job is a MLP"), and `memest estimate --features` gives the same answer."""
    data = tmp_path / "transformer.csv"
    rows = _gpumemnet_transformer_rows(24)
    with data.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    model = tmp_path / "transformer.json"
    done = _memest("ml", "train", "--dataset", str(data), "--model", "forest-reg", "--trees", "5",
                   "--family", "transformer", "--out", str(model))  # fmt: skip
    assert done.returncode == 0, done.stderr
    feats = tmp_path / "features.json"
    feats.write_text(cli("features", "--model", _transformer(2, True), "--batch-size", "4").stdout)
    pred = _memest("ml", "predict", "--model", str(model), "--features", str(feats), "--json")
    assert pred.returncode == 0, pred.stderr
    estimate = json.loads(pred.stdout)[0]["estimate"]
    trace = tmp_path / "trace.jsonl"
    cli("symtrace", "--model", _transformer(2, True), "--batch-size", "4", "--out", str(trace))
    est = _memest("estimate", "--trace", str(trace), "--features", str(feats), "--ml-model",
                  str(model), "--json")  # fmt: skip
    assert est.returncode in (0, 1), est.stderr
    assert json.loads(est.stdout)["estimates"]["ml"]["device_mib"] == pytest.approx(estimate)


# A CNN with Sigmoid activations reported none (its Sigmoid modules were read as a head, which
# GPUMemNet's CNN summaries do not list), so memest named "None" where the model has Sigmoid. The
# activation is now the most common activation module before the last weighted layer.
ACTIVATION_MODULES = {
    "relu": "ReLU", "leaky_relu": "LeakyReLU", "prelu": "PReLU", "elu": "ELU", "selu": "SELU",
    "gelu": "GELU", "tanh": "Tanh", "swish": "SiLU", "softplus": "Softplus", "mish": "Mish",
    "identity": "Identity", "sigmoid": "Sigmoid",
}  # fmt: skip
# What GPUMemNet encodes (estimators/src/ml/features.rs): its CNN data has no Identity.
ENCODED = {"mlp": set(ACTIVATION_MODULES.values()) - {"Sigmoid"},
           "cnn": set(ACTIVATION_MODULES.values()) - {"Sigmoid", "Identity"}}  # fmt: skip


@pytest.mark.parametrize("act", sorted(ACTIVATION_MODULES))
@pytest.mark.parametrize(
    "family,base",
    [("mlp", MLP), ("cnn", CNN), ("cnn", {**CNN, "architecture": "residual", "num_classes": 1}),
     ("mlp", {**MLP, "output_size": 1})],
    ids=["mlp", "cnn", "cnn-residual-sigmoid-head", "mlp-sigmoid-head"],
)  # fmt: skip
def test_the_activation_is_the_modules_and_an_unencoded_one_is_said(
    family: str, base: dict, act: str
) -> None:
    done = cli("features", "--model", "synthetic:" + json.dumps({**base, "activation": act}))
    name = ACTIVATION_MODULES[act]
    assert json.loads(done.stdout)["activation_function"] == name
    said = [line for line in done.stderr.splitlines() if "`memest ml` gives no estimate" in line]
    if name in ENCODED[family]:
        assert said == [], done.stderr
    else:
        assert len(said) == 1 and f"the model has activation {name}," in said[0], done.stderr
        assert f"GPUMemNet's {family.upper()} estimator encodes only ELU, GELU" in said[0]


@pytest.mark.parametrize(
    ("kinds", "activation", "said"),
    [
        (["linear", "ReLU", "linear"], "ReLU", None),
        (["linear", "Identity", "linear"], "Identity", None),
        (["conv2d", "Identity", "linear"], "Identity", "activation Identity, and GPUMemNet's CNN"),
        (["conv2d", "Hardswish", "linear"], "Hardswish", "activation Hardswish, and GPUMemNet's CNN"),
        (["linear", "linear"], None, "no activation module (a functional one is not seen), and "
                                     "GPUMemNet's MLP"),
        # GPUMemNet's Transformer features have no activation: memest needs none.
        (["Embedding", "NonDynamicallyQuantizableLinear", "Linear"], None, None),
    ],
)  # fmt: skip
def test_activation_issue_follows_what_memest_refuses(
    kinds: list[str], activation: str | None, said: str | None
) -> None:
    feats = Features(total_parameters=1, total_activations=1, layers=[], depth=1, layer_counts={},
                     activation_function=activation, batch_size=1,
                     gpumemnet_sequence=[(k, 1, 0) for k in kinds])  # fmt: skip
    issue = feats.activation_issue()
    assert issue == said if said is None else said in (issue or ""), issue


def test_the_activation_vocabulary_is_memests() -> None:
    """The trainer's warning names what memest encodes (estimators/src/ml/features.rs): a copy
    that drifted would warn of an activation memest takes, or stay silent on one it refuses."""
    source = (REPO / "estimators" / "src" / "ml" / "features.rs").read_text()
    for name, ours in (
        ("MLP_ACTIVATIONS", GPUMEMNET_ACTIVATIONS),
        ("CNN_ACTIVATIONS", CNN_ACTIVATIONS),
    ):
        listed = re.search(rf"pub const {name}: \[&str; \d+\] =\s*\[([^\]]*)\]", source)
        assert listed, name
        assert tuple(re.findall(r'"([^"]+)"', listed.group(1))) == ours, name


def test_features_warns_of_an_input_shape_a_language_model_ignores() -> None:
    """As `estimate` warns it, in the same words (the zoo's one check)."""
    for command in ("features", "estimate"):
        args = ["--model", "hf:gpt2", "--input-shape", "3,224,224", "--seq-len", "8"]
        if command == "estimate":
            args += ["--batch-size", "1", "--steps", "1"]
        done = cli(command, *args)
        assert "--input-shape 3,224,224 has no effect: hf:gpt2 takes token ids" in done.stderr
