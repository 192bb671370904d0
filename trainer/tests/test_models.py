"""Synthetic configs, sweeps, the GPUMemNet rebuild (parameter counts) and the zoo."""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import FULL_CSV, cli, csv_sample, gpumemnet_rows
from torch import nn

from memtrace_trainer.errors import UserError
from memtrace_trainer.models.cnn import CNNConfig
from memtrace_trainer.models.config import InvalidConfig, from_dict
from memtrace_trainer.models.gpumemnet import from_gpumemnet_filename, parse_filename
from memtrace_trainer.models.mlp import MLPConfig
from memtrace_trainer.models.sampling import sample, sample_file
from memtrace_trainer.models.transformer import TransformerConfig
from memtrace_trainer.models.zoo import ZOO_EXAMPLES, build_workload


def params_as_gpumemnet_counts(model: nn.Module) -> int:
    """GPUMemNet's summary lists PReLU with 0 parameters; its totals exclude PReLU weights."""
    prelu = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.PReLU))
    return sum(p.numel() for p in model.parameters()) - prelu


def check_invalid(config: object, reason: str) -> None:
    with pytest.raises(InvalidConfig, match=reason):
        config.validate()  # type: ignore[attr-defined]


def test_infeasible_configs_are_rejected_with_reason() -> None:
    check_invalid(TransformerConfig(128, 100, 2, 3, 50000, 400), "not divisible by heads")
    check_invalid(MLPConfig(10, 2, 0), "field 'depth' is 0: expected an integer >= 1")
    check_invalid(MLPConfig(10, 20, 3, "gradual"), "gradual needs")
    check_invalid(MLPConfig(10, 2, 2, activation="nope"), "field 'activation' is \"nope\"")
    check_invalid(CNNConfig(3, 10, 4, "dense", 32, 64), "dense_interval")
    check_invalid(CNNConfig(3, 10, 4, "spiral", 32, 64), "field 'architecture' is \"spiral\"")


def test_config_json_roundtrip_and_stable_id() -> None:
    cfg = MLPConfig(100, 10, 3, "bottleneck", "gelu", 0.2, True)
    again = from_dict(cfg.to_dict())
    assert again == cfg
    assert again.id == cfg.id == "mlp-" + cfg.id.split("-")[1]
    assert MLPConfig(100, 10, 4).id != MLPConfig(100, 10, 3).id
    with pytest.raises(InvalidConfig, match="unknown fields"):
        from_dict({"family": "mlp", "input_size": 3, "output_size": 1, "depth": 1, "x": 1})


SWEEP = textwrap.dedent(
    """
    family: transformer
    count: 12
    seed: 7
    fields:
      seq_len: [128, 256]
      embed_dim: [128, 192, 256]
      layers: {min: 2, max: 4}
      heads: {min: 2, max: 16}
      vocab_size: {min: 50000, max: 60000}
      num_classes: {min: 400, max: 1000}
      dropout: {min: 0.0, max: 0.3}
    """
)


def test_sweep_sampling_is_seeded_and_valid(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)
    first = sample_file(path)
    assert [c.id for c in first] == [c.id for c in sample_file(path)]
    assert [c.id for c in first] != [c.id for c in sample_file(path, seed=8)]
    assert len(first) == 12
    for c in first:
        assert c.problems() == []
        assert c.embed_dim % c.heads == 0  # type: ignore[attr-defined]


def test_sweep_ratio_field_and_errors() -> None:
    sweep = {
        "family": "mlp",
        "count": 20,
        "seed": 1,
        "fields": {
            "input_size": {"min": 4, "max": 4096},
            "output_size": {"min": 1, "max_ratio": 0.25, "of": "input_size"},
            "depth": {"min": 1, "max": 12},
            "architecture": ["pyramid", "gradual"],
        },
    }
    for c in sample(sweep, "inline"):
        assert 1 <= c.output_size <= max(1, int(0.25 * c.input_size))  # type: ignore[attr-defined]
    with pytest.raises(UserError, match="missing field 'count'"):
        sample({"family": "mlp", "fields": {}}, "inline")
    bad = {"family": "mlp", "count": 1, "fields": {"input_size": 5, "output_size": 1, "depth": 0}}
    with pytest.raises(UserError, match=r"infeasible; last: .*field 'depth' is 0"):
        sample(bad, "inline")


def test_filename_parsing() -> None:
    pairs = parse_filename(
        "input_channels:3_num_classes:5_depth:2_arch:uniform_base_filters:8_batch:4_input_size:16"
        "_act:leaky_relu_dropout:0.25_dropout:True_batchnorm:False.out"
    )
    assert ("act", "leaky_relu") in pairs and ("dropout", "0.25") in pairs
    cfg, batch = from_gpumemnet_filename("input:20_output:3_depth:2_arch:pyramid_batch:64.out")
    assert batch == 64 and cfg == MLPConfig(20, 3, 2, "pyramid", head=False)
    with pytest.raises(InvalidConfig, match="field 'batch' is 'x'"):
        from_gpumemnet_filename("input:20_output:3_depth:2_arch:pyramid_batch:x.out")
    with pytest.raises(InvalidConfig, match="expected `key:value` pairs"):
        from_gpumemnet_filename("resnet50.out")


def rebuild_counts(filename: str) -> list[int]:
    """Parameter counts of the model(s) a Filename can stand for (two for dense CNNs)."""
    cfg, _ = from_gpumemnet_filename(filename, dense_interval=1)
    if isinstance(cfg, CNNConfig) and cfg.architecture == "dense":
        cands = [dataclasses.replace(cfg, dense_interval=k) for k in cfg.dense_interval_choices()]
    else:
        cfg, _ = from_gpumemnet_filename(filename)
        cands = [cfg]
    with torch.device("meta"):
        return [params_as_gpumemnet_counts(c.build()) for c in cands]


@pytest.mark.parametrize("name", ["mlp_data_step1.csv", "mlp_data_step2.csv"])
def test_every_mlp_row_parameter_count(name: str) -> None:
    rows = gpumemnet_rows(name)
    assert len(rows) == 3000
    rows = csv_sample(rows, name)
    wrong = [
        r["Filename"] for r in rows if rebuild_counts(r["Filename"]) != [int(r["Total Parameters"])]
    ]
    assert wrong == []


def test_cnn_rows_parameter_count() -> None:
    all_rows = gpumemnet_rows("cnn_data_step1_early.csv")
    # 85 rows recorded no summary (their run failed first): Total Parameters 0, nothing to match.
    no_summary = [r for r in all_rows if r["Activations-Params"] == "[]"]
    assert all(r["Total Parameters"] == "0" for r in no_summary) and len(no_summary) == 85
    rows = csv_sample(all_rows, "cnn_data_step1_early.csv")
    exact, dense_resolved, wrong = 0, 0, []
    for r in rows:
        if r["Activations-Params"] == "[]":
            continue
        counts = rebuild_counts(r["Filename"])
        if counts == [int(r["Total Parameters"])]:
            exact += 1
        elif len(counts) == 2 and int(r["Total Parameters"]) in counts:
            dense_resolved += 1  # one of the two dense layouts; the filename cannot say which
        else:
            wrong.append(r["Filename"])
    assert wrong == []
    dense = sum(
        1 for r in rows if "arch:dense" in r["Filename"] and r["Activations-Params"] != "[]"
    )
    summarised = sum(1 for r in rows if r["Activations-Params"] != "[]")
    assert (exact, dense_resolved) == (summarised - dense, dense) and exact > 0
    if FULL_CSV:
        assert (exact, dense_resolved) == (1734, 242)


@pytest.mark.parametrize("spec", ZOO_EXAMPLES)
def test_zoo_entry_builds_on_meta(spec: str) -> None:
    w = build_workload(spec, 2, seq_len=16)
    tensors = [*w.model.parameters(), *w.model.buffers()]
    assert tensors and all(t.device.type == "meta" for t in tensors)
    inputs, _ = w.make_batch()
    first = (
        inputs
        if isinstance(inputs, torch.Tensor)
        else next(iter(inputs.values() if isinstance(inputs, dict) else inputs))
    )
    assert first.device.type == "meta" and first.shape[0] == 2


def test_zoo_parameter_counts() -> None:
    def check(spec: str, expect: int) -> None:
        w = build_workload(spec, 1, seq_len=8)
        assert sum(p.numel() for p in w.model.parameters()) == expect, spec

    check("torchvision:resnet50", 25_557_032)
    check("hf:gpt2", 124_439_808)
    check("hf:bert-base-uncased", 109_483_778)
    check("timm:convnext_tiny", 28_589_128)


def test_unknown_specs_are_user_errors() -> None:
    for spec, msg in [
        ("torchvision:nope", "unknown torchvision"),
        ("hf:nope", "unknown Hugging"),
        ("what", "unknown model spec"),
        ("synthetic:{", "not JSON"),
        # As `sample` says it, not Python's `MLPConfig.__init__() missing 1 required ...`.
        (
            'synthetic:{"family":"mlp","input_size":8,"output_size":2}',
            re.escape("mlp config needs ['depth'] (no default)"),
        ),
    ]:
        with pytest.raises(UserError, match=msg):
            build_workload(spec, 1)


MLP = {"family": "mlp", "input_size": 64, "output_size": 10, "depth": 3}
CNN = {"family": "cnn", "input_channels": 3, "num_classes": 10, "depth": 4,
       "architecture": "uniform", "base_filters": 8, "input_size": 32}  # fmt: skip
TRANSFORMER = {"family": "transformer", "seq_len": 16, "embed_dim": 32, "layers": 1, "heads": 2,
               "vocab_size": 100, "num_classes": 2}  # fmt: skip


@pytest.mark.parametrize(
    ("base", "field", "value", "expected"),
    [
        (MLP, "depth", "3", "an integer >= 1"),
        (MLP, "depth", 2.5, "an integer >= 1"),
        (MLP, "input_size", True, "an integer >= 1"),
        (MLP, "output_size", 10.0, "an integer >= 1"),
        (MLP, "dropout", "x", "a number in [0, 1)"),
        (MLP, "dropout", False, "a number in [0, 1)"),
        (MLP, "batchnorm", "yes", "true or false"),
        (MLP, "head", 1, "true or false"),
        (MLP, "architecture", 3, "one of ['pyramid', 'uniform', 'bottleneck', 'gradual']"),
        (MLP, "activation", None, "one of ['relu', "),
        (CNN, "base_filters", "8", "an integer in [1, 2048]"),
        (CNN, "input_size", [32], "an integer >= 2"),
        (CNN, "num_classes", False, "an integer >= 1"),
        (CNN, "batchnorm", "false", "true or false"),
        (CNN, "dropout", [0.1], "a number in [0, 1)"),
        (CNN, "activation", {"name": "relu"}, "one of ['relu', "),
        ({**CNN, "architecture": "dense"}, "dense_interval", "2", "an integer >= 1 or null"),
        ({**CNN, "architecture": "dense"}, "dense_interval", 0, "an integer >= 1 or null"),
        (TRANSFORMER, "heads", "2", "an integer >= 1"),
        (TRANSFORMER, "layers", 1.5, "an integer >= 1"),
        (TRANSFORMER, "vocab_size", None, "an integer >= 1"),
        (TRANSFORMER, "ff_mult", True, "an integer >= 1"),
        (TRANSFORMER, "norm_first", "no", "true or false"),
        (TRANSFORMER, "dropout", "0.1", "a number in [0, 1)"),
        (TRANSFORMER, "activation", 1, "one of ['relu', 'gelu']"),
    ],
)  # fmt: skip
def test_a_synthetic_field_of_the_wrong_type_is_refused_naming_it(
    base: dict[str, object], field: str, value: object, expected: str
) -> None:
    """A field of the wrong type was compared (an internal TypeError), or taken as what Python
    makes of it (`"batchnorm": "yes"` was true, `"input_size": true` a width of 1)."""
    spec = "synthetic:" + json.dumps({**base, field: value})
    done = cli("features", "--model", spec, check=False)
    assert done.returncode == 2, done.stdout
    assert "internal error" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"field {field!r} is {json.dumps(value)}: expected {expected}" in done.stderr


@pytest.mark.parametrize(("name", "side"), [("inception_v3", 299), ("googlenet", 224)])
def test_a_torchvision_model_with_aux_heads_trains_at_its_published_size(
    name: str, side: int
) -> None:
    # Inception v3's default weights crop 299 (224 failed in its 5x5 conv), and in train mode
    # both return a namedtuple of logits whose every head adds a loss, as torchvision trains.
    w = build_workload(f"torchvision:{name}", 2)
    assert w.sizes["input_shape"] == [3, side, side]
    inputs, target = w.make_batch()
    w.model.train()
    w.loss(w.model(inputs), target).backward()
    aux = [p for n, p in w.model.named_parameters() if n.lower().startswith("aux")]
    assert aux and all(p.grad is not None for p in aux)


def test_a_torchvision_default_input_is_its_weights_crop_unless_built_for_one_size() -> None:
    assert build_workload("torchvision:efficientnet_b1", 1).sizes["input_shape"] == [3, 240, 240]
    # Built without weights for 224, though its default weights are 518's.
    assert build_workload("torchvision:vit_h_14", 1).sizes["input_shape"] == [3, 224, 224]
