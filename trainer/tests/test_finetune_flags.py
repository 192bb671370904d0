"""The fine-tuning flags' edges: what has no effect is said, the output head is found by what it
is, the searches refuse their own axis, and the Python API and `serve` take what the CLI takes."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cli
from torch import nn

import memtrace
from memtrace import EstimateError
from memtrace_trainer.models.finetune import Lora, Regime, head_modules
from memtrace_trainer.models.qlora import Linear4bit
from memtrace_trainer.models.zoo import Tune, build_workload
from memtrace_trainer.serve_schema import Policy, Schema, estimate_parser

CONFIGS = Path(__file__).parent / "hf_configs"
LLAMA = f"hf-config:{CONFIGS / 'tiny-llama.json'}"
SMALL = ["--batch-size", "1", "--seq-len", "8", "--steps", "1"]


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))  # fmt: skip


# --- 1. --qlora --dtype: undone by kbit preparation ---------------------------------------------


@pytest.mark.parametrize(("extra", "said"), [([], True), (["--no-kbit-prepare"], False)])
def test_qlora_dtype_undone_by_kbit_preparation_is_said(
    tmp_path: Path, extra: list[str], said: bool
) -> None:
    done = cli("symtrace", "--model", LLAMA, *SMALL, "--qlora", "--dtype", "bf16", *extra,
               "--out", str(tmp_path / "t.jsonl"))  # fmt: skip
    assert ("--dtype bf16 has no effect with --qlora" in done.stderr) is said, done.stderr


# --- 2. the output head, found by what it is ----------------------------------------------------


def test_qlora_keeps_a_non_hugging_face_models_head() -> None:
    """torchvision's resnet18 names its classifier `fc`, in no list of head names: it was
    quantized, against the docs; now it is the head, and nothing else is linear."""
    tune = Tune(regime=Regime(lora=Lora(8, targets=("fc",)), qlora=True))
    with pytest.raises(Exception, match=r"outside the output head \(fc\)"):
        build_workload("torchvision:resnet18", 2, tune=tune)


def test_qlora_heads_by_mechanism() -> None:
    mlp = _mlp()
    assert head_modules(mlp) == ("4",)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
            self.head = nn.Sequential(nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))
            self.inner = nn.Sequential(nn.Linear(3, 3))  # a short name "0" elsewhere

    net = Net()
    assert head_modules(net) == ("inner",)  # the last parameter's module, widened
    tied = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 10, bias=False))
    tied[2].weight = tied[0].weight
    # The tied pair, and the last parameter's module (the tied weight is listed once, first).
    assert set(head_modules(tied)) == {"0", "1", "2"}


def test_qlora_quantizes_outside_the_head_and_says_a_small_share() -> None:
    tune = Tune(regime=Regime(lora=Lora(8, targets=("0",)), qlora=True))
    from memtrace_trainer import notes

    said: list[str] = []
    with notes.captured(said.append):
        w = build_workload("torchvision:vgg11", 1, tune=tune)
    kept = w.model.get_base_model().classifier[6]
    assert type(kept) is nn.Linear or isinstance(getattr(kept, "base_layer", None), nn.Linear)
    assert not isinstance(getattr(kept, "base_layer", kept), Linear4bit)
    assert isinstance(w.model.get_base_model().classifier[0].base_layer, Linear4bit)
    assert not any("--qlora quantizes" in s for s in said)  # vgg's linear layers are most of it


def test_qlora_small_share_is_said() -> None:
    class Cnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 256, 7)
            self.proj = nn.Linear(256, 64)
            self.fc = nn.Linear(64, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.proj(self.conv(x).mean((2, 3))))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        memtrace.estimate(Cnn(), torch.randn(2, 3, 16, 16), target=torch.randint(0, 10, (2,)),
                          qlora=True, lora_targets="proj")  # fmt: skip
    said = [str(w.message) for w in caught]
    assert any("qlora quantizes 16,384 of the model's" in s and "(fc)" in s for s in said), said


# --- 3. grammar --------------------------------------------------------------------------------


def test_one_missing_target_matches_no_module() -> None:
    done = cli("estimate", "--model", "torchvision:resnet18", "--batch-size", "1", "--lora", "4",
               "--lora-targets", "nosuch", check=False)  # fmt: skip
    assert done.returncode == 2 and "nosuch matches no module" in done.stderr, done.stderr


# --- 4. the Python API's fine-tuning keywords ---------------------------------------------------


def test_the_api_takes_qlora() -> None:
    x, y = torch.randn(4, 64), torch.randint(0, 10, (4,))
    est = memtrace.estimate(_mlp(), x, target=y, qlora=True, lora_targets="0,2", amp="bf16",
                            qlora_double_quant=True, bnb_version="0.43", lora_dropout=0.1)  # fmt: skip
    tuning = est.raw["inputs"]["model_details"]["fine_tuning"]
    assert tuning["qlora"] and tuning["double_quant"] and tuning["bnb_version"] == "0.43"
    assert tuning["lora"]["r"] == 8 and tuning["lora"]["dropout"] == 0.1
    assert memtrace.max_batch(_mlp(), x, target=y, qlora=True, lora_targets="0,2",
                              capacity="2000MiB", limit=64) >= 1  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"qlora": "yes"}, "qlora='yes': expected True or False"),
        ({"lora_dropout": 0.1}, "lora_dropout= has no meaning without lora="),
        ({"lora": 4, "lora_targets": "0", "lora_dropout": 1.5}, "lora_dropout=1.5: expected a"),
        ({"qlora_double_quant": True}, "qlora_double_quant has no meaning without qlora"),
        ({"kbit_prepare": False}, "kbit_prepare=False has no meaning without qlora"),
        ({"bnb_version": "0.45"}, "bnb_version has no meaning without qlora"),
        ({"qlora": True, "lora_targets": "0", "bnb_version": 0.5}, "as a string, like '0.45'"),
        ({"qlora": True, "lora_targets": "0", "bnb_version": "0.40"}, "bnb_version=0.40:"),
        ({"task": "lm"}, "task='lm': expected one of causal-lm"),
        ({"attn": "flash"}, "attn='flash': expected one of sdpa"),
    ],
)
def test_the_api_checks_fine_tuning_keywords_as_the_cli(kwargs: dict[str, Any], said: str) -> None:
    with pytest.raises(EstimateError) as e:
        memtrace.estimate(_mlp(), torch.randn(4, 64), **kwargs)
    assert said in str(e.value), str(e.value)


def test_the_api_says_task_and_attn_of_a_plain_module() -> None:
    with pytest.warns(memtrace.MemtraceWarning, match="attn='eager' has no effect"):
        memtrace.estimate(_mlp(), torch.randn(4, 64), attn="eager")


# --- 5. serve's lora takes a rank ---------------------------------------------------------------


def test_serve_takes_an_integer_lora_rank() -> None:
    schema = Schema(estimate_parser())

    def argv(body: dict[str, Any]) -> list[str]:
        return schema.argv(json.dumps(body).encode(), Policy())

    assert "--lora=8" in argv({"model": "torchvision:resnet18", "batch_size": 2, "lora": 8})
    assert "--lora=16:32" in argv({"model": "dlrm", "batch_size": 2, "lora": "16:32"})
    assert schema.to_json()["lora"]["type"] == "string-or-integer"


# --- 6. the searches refuse their own axis ------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["max-batch", "--model", "torchvision:resnet18", "--batch-size", "4"],
         "max-batch searches the batch size: leave out --batch-size"),
        (["max-seq", "--model", LLAMA, "--seq-len", "128"],
         "max-seq searches the sequence length: leave out --seq-len"),
    ],
)  # fmt: skip
def test_searches_refuse_their_own_axis(args: list[str], said: str) -> None:
    done = cli(*args, check=False)
    assert done.returncode == 2 and said in done.stderr and "usage" not in done.stderr


# --- 7. the API shows no baseline, so says nothing of them --------------------------------------


def test_the_api_does_not_warn_of_baselines_it_never_shows() -> None:
    est = memtrace.estimate(_mlp(), torch.randn(4, 64), strategy="ddp", world_size=2)
    assert not any("baselines" in w for w in est.warnings), est.warnings
    assert any("baselines" in w for w in est.raw["warnings"])  # kept with them in to_json()


# --- 8. DLRM has no sequence --------------------------------------------------------------------


def test_dlrm_seq_len_is_said_and_max_seq_refused() -> None:
    done = cli("features", "--model", "dlrm", "--batch-size", "2", "--seq-len", "64",
               check=False)  # fmt: skip
    assert "--seq-len 64 has no effect: dlrm" in done.stderr, done.stderr
    done = cli("max-seq", "--model", "dlrm", check=False)
    assert done.returncode == 2 and "max-seq: dlrm takes no token sequence" in done.stderr
