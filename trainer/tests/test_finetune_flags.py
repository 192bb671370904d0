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
from memtrace_trainer.models import finetune
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


@pytest.mark.parametrize(
    ("extra", "said", "advised"),
    [([], True, True), (["--no-kbit-prepare"], False, False), (["--amp", "bf16"], True, False)],
)
def test_qlora_dtype_undone_by_kbit_preparation_is_said(
    tmp_path: Path, extra: list[str], said: bool, advised: bool
) -> None:
    done = cli("symtrace", "--model", LLAMA, *SMALL, "--qlora", "--dtype", "bf16", *extra,
               "--out", str(tmp_path / "t.jsonl"))  # fmt: skip
    assert ("--dtype bf16 has no effect with --qlora" in done.stderr) is said, done.stderr
    # `--dtype bf16 --amp bf16` is the usual recipe: no advice to give the --amp it has.
    assert ("give --amp bf16" in done.stderr) is advised, done.stderr


@pytest.mark.parametrize(
    ("flags", "alone"),
    [(["--dtype", "fp16", "--amp", "fp16"], "(fp16 without it, as --amp fp16 sets)"),
     (["--dtype", "fp16"], "(bf16 without --dtype or --amp)")],
)  # fmt: skip
def test_qlora_dtype_warning_names_the_compute_dtype_of_the_flags_given(
    tmp_path: Path, flags: list[str], alone: str
) -> None:
    """`--amp fp16` makes the compute dtype fp16 (docs/finetuning.md): the warning said bf16."""
    done = cli("symtrace", "--model", LLAMA, *SMALL, "--qlora", *flags,
               "--out", str(tmp_path / "t.jsonl"))  # fmt: skip
    assert f"dequantize to a 16-bit compute dtype either way {alone}" in done.stderr, done.stderr


class _Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 256, 7)
        self.proj = nn.Linear(256, 64)
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.proj(self.conv(x).mean((2, 3))))


def test_qlora_dtype_leaves_float_inputs_as_kbit_preparation_leaves_the_parameters() -> None:
    """The input was cast to bf16 while kbit preparation had cast the convolution back to fp32:
    "Input type (BFloat16) and bias type (float)". Now --dtype has no effect, as it says."""
    x, y = torch.randn(2, 3, 16, 16), torch.randint(0, 10, (2,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = memtrace.estimate(_Cnn(), x, target=y, qlora=True, lora_targets="proj")
        bf16 = memtrace.estimate(_Cnn(), x, target=y, qlora=True, lora_targets="proj",
                                 dtype="bf16")  # fmt: skip
    assert (bf16.allocated_mib, bf16.reserved_mib) == (plain.allocated_mib, plain.reserved_mib)


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
    assert head_modules(net) == ("inner.0",)  # the last parameter's module, and only it
    tied = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 10, bias=False))
    tied[2].weight = tied[0].weight
    # The tied pair, and the last parameter's module (the tied weight is listed once, first).
    assert set(head_modules(tied)) == {"0", "1", "2"}


def _qlora(model: nn.Module, targets: str, task: str | None = None) -> nn.Module:
    regime = Regime(lora=Lora(8, targets=tuple(targets.split(","))), qlora=True)
    return finetune.apply(model, regime, task, None).get_base_model()  # type: ignore[no-any-return]


def _quantized(model: nn.Module) -> set[str]:
    return {n.removesuffix(".base_layer") for n, m in model.named_modules()
            if isinstance(m, Linear4bit)}  # fmt: skip


class _TiedLm(nn.Module):
    """Two blocks in an `nn.Sequential` with the final norm, a vocabulary far larger than them:
    the old rule widened the norm to all of `blocks`, which then held every linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5000, 32)
        block = lambda: nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))  # noqa: E731
        self.blocks = nn.Sequential(block(), block(), nn.LayerNorm(32))
        self.head = nn.Linear(32, 5000, bias=False)
        self.head.weight = self.emb.weight


class _EncoderDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 16))
        self.decoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                                     nn.Linear(32, 256))  # fmt: skip


def _classified(features: nn.Module, classifier: nn.Sequential) -> nn.Module:
    net = nn.Module()
    net.features, net.classifier = features, classifier
    return net


def test_qlora_head_is_what_the_module_is_not_its_share() -> None:
    """A tied model's last norm stays alone; an MLP's decoder, DLRM's top MLP and a CNN's
    classifier keep only their last layer, whatever share of the parameters they hold."""
    tied = _qlora(_TiedLm(), "blocks.0.0")
    assert set(head_modules(_TiedLm())) == {"head", "emb", "blocks.2"}
    assert _quantized(tied) == {f"blocks.{i}.{j}" for i in (0, 1) for j in (0, 2)}
    assert head_modules(_EncoderDecoder()) == ("decoder.4",)
    assert "decoder.0" in _quantized(_qlora(_EncoderDecoder(), "encoder.0"))
    tune = Tune(regime=Regime(lora=Lora(8, targets=("bottom.0",)), qlora=True))
    dlrm = build_workload("dlrm:small", 2, tune=tune).model.get_base_model()
    assert isinstance(dlrm.top[0], Linear4bit) and type(dlrm.top[-1]) is nn.Linear
    # mobilenet_v3's classifier holds under half the parameters, vgg's over half: the same head.
    convs = nn.Sequential(nn.Conv2d(3, 64, 3), nn.Conv2d(64, 512, 3))
    small = _classified(convs, nn.Sequential(nn.Linear(512, 64), nn.Hardswish(), nn.Dropout(),
                                             nn.Linear(64, 10)))  # fmt: skip
    big = _classified(nn.Conv2d(3, 8, 3), nn.Sequential(nn.Linear(512, 256), nn.ReLU(),
                                                        nn.Linear(256, 256), nn.ReLU(),
                                                        nn.Linear(256, 10)))  # fmt: skip
    assert head_modules(small) == ("classifier.3",) and head_modules(big) == ("classifier.4",)
    assert _quantized(_qlora(small, "features.0")) == {"classifier.0"}
    assert _quantized(_qlora(big, "features")) == {"classifier.0", "classifier.2"}


def test_qlora_classification_keeps_the_head_peft_trains_whole() -> None:
    """Under a classification task peft keeps `classifier`/`score` whole (modules_to_save), so
    the head widens to it (RoBERTa's dense and out_proj); without one, only the last layer."""
    net = _classified(nn.Linear(8, 512), nn.Sequential(nn.Linear(512, 64), nn.Tanh(),
                                                       nn.Linear(64, 2)))  # fmt: skip
    assert head_modules(net, "classification") == ("classifier",)
    assert head_modules(net, "causal-lm") == head_modules(net) == ("classifier.2",)


def test_qlora_quantizes_outside_the_head_without_saying_a_small_share() -> None:
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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        memtrace.estimate(_Cnn(), torch.randn(2, 3, 16, 16), target=torch.randint(0, 10, (2,)),
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
    # A 4-bit base fits where the fp32 one trained in full does not.
    big = lambda: nn.Sequential(nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 2048),  # noqa: E731
                                nn.ReLU(), nn.Linear(2048, 10))  # fmt: skip
    fits = {q: memtrace.max_batch(big(), x, target=y, capacity="1520MiB", limit=64,
                                  **({"qlora": True, "lora_targets": "0,2"} if q else {}))
            for q in (False, True)}  # fmt: skip
    assert fits[False] == 0 and fits[True] >= 1, fits


def test_the_api_and_the_entry_cli_give_one_qlora_estimate() -> None:
    import entry_example

    flags = {"qlora": True, "lora_targets": "0", "dtype": "bf16", "amp": "bf16"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, (x, y), loss = entry_example.make(4)
        est = memtrace.estimate(model, x, target=y, loss_fn=loss, **flags)
    out = json.loads(cli("estimate", "--entry", "entry_example:make", "--batch-size", "4",
                         "--qlora", "--lora-targets", "0", "--dtype", "bf16", "--amp", "bf16",
                         "--json").stdout)  # fmt: skip
    sym = out["estimates"]["symbolic"]
    assert (est.allocated_mib, est.reserved_mib) == (sym["allocated_mib"], sym["reserved_mib"])
    assert est.raw["inputs"]["model_details"]["fine_tuning"]["qlora"]


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
        ({"qlora": True, "lora_targets": "0", "bnb_version": "0.40"}, "bnb_version='0.40':"),
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
