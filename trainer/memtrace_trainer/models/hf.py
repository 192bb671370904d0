"""Hugging Face models by config, never downloaded.

`hf:<repo id>` reads the published `config.json` values kept under `models/hf_configs/` (one
small JSON file per architecture, listing every repo id that shares it; README there);
`hf-config:PATH`
reads any local `config.json`. Either becomes a transformers config, and the model is built with
`AutoModelFor<Task>.from_config` on the tracer's device, so no weight is ever materialised.

The training batch is what a fine-tuning loop feeds: `input_ids` and `labels`, and the model
computes its own loss. That keeps transformers' own loss code in the trace (for causal LMs the
fp32 upcast of the logits, `transformers/loss/loss_utils.py`).
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memtrace_trainer.errors import UserError, json_object
from memtrace_trainer.notes import warn

REGISTRY = Path(__file__).with_name("hf_configs")
# A config.json is kilobytes; the cap keeps a mistaken path from reading gigabytes.
MAX_CONFIG_BYTES = 16 << 20
TASKS = ("causal-lm", "classification", "seq2seq")
ATTENTION = ("sdpa", "eager", "flash_attention_2")
DEFAULT_CLASSES = 2
# The AutoModel class per task (transformers' names).
_AUTO = {
    "causal-lm": "AutoModelForCausalLM",
    "classification": "AutoModelForSequenceClassification",
    "seq2seq": "AutoModelForSeq2SeqLM",
}


@dataclass(frozen=True)
class HFSpec:
    """One config: the id the user gave (or the file), the values, and where they come from."""

    name: str
    config: dict[str, Any]
    source: str


@functools.cache
def registry() -> dict[str, tuple[str, Path]]:
    """Every known repo id, lower-cased, to (its spelling, its file)."""
    found: dict[str, tuple[str, Path]] = {}
    for path in sorted(REGISTRY.glob("*.json")):
        data = json.loads(path.read_text())
        for repo_id in data["ids"]:
            found[repo_id.lower()] = (repo_id, path)
    return found


def known_ids() -> list[str]:
    return sorted(spelling for spelling, _ in registry().values())


def resolve(name: str) -> HFSpec:
    """`hf:<name>`: a repo id (any case) from the registry; an unknown one names the nearest."""
    hit = registry().get(name.lower())
    if hit is None:
        ids = known_ids()
        near = difflib.get_close_matches(name, ids, n=5, cutoff=0.5)
        if not near:  # a bare model name without its organisation: match on the name part
            tail = {i.rsplit("/", 1)[-1].lower(): i for i in ids}
            near = [tail[t] for t in difflib.get_close_matches(name.lower(), list(tail), n=5)]
        hint = f"nearest known: {', '.join(near)}" if near else f"{len(ids)} ids are known"
        raise UserError(
            f"unknown Hugging Face model {name!r} ({hint}; `python -m memtrace_trainer "
            "hf-models` lists them all; give --model hf-config:PATH for any other config.json)"
        )
    spelling, path = hit
    data = json.loads(path.read_text())
    return HFSpec(spelling, dict(data["config"]), data["source"])


# The sizes a config's model is built from (the names transformers' families use): each a
# count of at least 1 when given. A zero or negative one reached PyTorch as a negative dimension.
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
         "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "head_dim",
         "n_embd", "n_layer", "n_head", "n_positions", "n_inner", "d_model", "d_ff", "d_kv",
         "num_layers", "num_heads", "num_decoder_layers")  # fmt: skip


def read_config(path: Path) -> HFSpec:
    """`hf-config:PATH`: a local config.json (or a directory holding one)."""
    if path.is_dir():
        path = path / "config.json"
    where = f"--model hf-config:{path}"
    not_regular = f"{where}: not a regular file (a config.json is one)"
    limit = f"{where}: larger than {MAX_CONFIG_BYTES >> 20} MiB: not a config.json"
    try:
        # Checked before opening: opening a device can act (a tape rewinds, a terminal becomes
        # the controlling one), and a device or FIFO was read until memory ran out.
        before = os.stat(path)
        if not stat.S_ISREG(before.st_mode):
            raise UserError(not_regular)
        if before.st_size > MAX_CONFIG_BYTES:
            raise UserError(limit)
        # Non-blocking and no controlling terminal: the path may be replaced by a FIFO or a
        # device between the stat and the open, which the fstat below then refuses.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise UserError(f"{where}: cannot read the file ({e.strerror})") from None
    except ValueError as e:  # a NUL byte, or a lone surrogate no file name encodes
        raise UserError(f"{where}: not a file name ({e})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if (info.st_dev, info.st_ino) != (before.st_dev, before.st_ino):
            raise UserError(f"{where}: the file was replaced while it was being opened")
        try:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # the file may grow after the stat
        except OSError as e:
            raise UserError(f"{where}: cannot read the file ({e.strerror})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise UserError(limit)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
    data = json_object(text, str(path), "a JSON object (a transformers config.json)")
    return HFSpec(str(path), data, str(path))


def to_config(spec: HFSpec) -> Any:
    """The transformers config of `spec`; errors name the file and the field."""
    import transformers

    values = dict(spec.config)
    for field in SIZES:
        v = values.get(field)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise UserError(f"{spec.source}: field {field} is {v!r}: expected a positive integer")
    heads, kv = values.get("num_attention_heads"), values.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise UserError(
            f"{spec.source}: field num_key_value_heads is {kv}: expected a divisor of "
            f"num_attention_heads ({heads}), as grouped-query attention shares each key/value "
            "head among a whole number of query heads"
        )
    model_type = values.pop("model_type", None)
    if not isinstance(model_type, str):
        raise UserError(
            f"{spec.source}: field model_type is {model_type!r}: expected the model family "
            "transformers knows it by (llama, mistral, qwen2, gpt2, bert, t5, ...)"
        )
    try:
        return transformers.AutoConfig.for_model(model_type, **values)
    except _config_errors() as e:
        # Recent transformers validate configs as strict dataclasses (a field of the wrong type,
        # a hidden size its heads do not divide): the user's file, said as such.
        raise UserError(
            f"{spec.source}: transformers rejects the config ({_one_line(e)})"
        ) from None
    except ValueError as e:
        if "Unrecognized model" in str(e) or "model_type" in str(e):
            raise UserError(
                f"{spec.source}: field model_type {model_type!r} is not a model family "
                f"transformers {transformers.__version__} knows"
            ) from None
        raise UserError(f"{spec.source}: transformers rejects the config ({e})") from None
    except (TypeError, KeyError, AttributeError) as e:
        raise UserError(f"{spec.source}: transformers rejects the config ({e})") from None


def _config_errors() -> tuple[type[BaseException], ...]:
    """huggingface_hub's strict-dataclass validation errors, where this version has them."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def default_task(config: Any) -> str:
    """The task the published architecture is for: an encoder (BERT, RoBERTa) is fine-tuned as
    a classifier, an encoder-decoder as seq2seq, everything else as a causal LM."""
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq"
    if _decoder_architecture(getattr(config, "architectures", None) or []):
        return "causal-lm"
    if config.model_type in ("bert", "roberta", "distilbert", "albert", "electra", "deberta"):
        return "classification"
    return "causal-lm"


def task_reason(spec: HFSpec, config: Any) -> str:
    """Why `default_task` chose what it did, as the task's note says it."""
    archs = getattr(config, "architectures", None) or []
    if not getattr(config, "is_encoder_decoder", False) and _decoder_architecture(archs):
        return f"{spec.name}'s published architecture"
    # Else model_type decided (an encoder is a classifier): a file naming another family's
    # architecture, or none, must not read as having published the task.
    why = f"the default for model_type {config.model_type}"
    return f"{why}: {spec.name} publishes no architectures" if not archs else why


def _decoder_architecture(archs: list[str]) -> bool:
    joined = " ".join(a for a in archs if isinstance(a, str))
    return "CausalLM" in joined or "LMHead" in joined


@functools.cache
def _architecture_types() -> dict[str, frozenset[str]]:
    """Every model class transformers maps a model_type to (`LlamaForCausalLM`: llama)."""
    from transformers.models.auto import modeling_auto

    found: dict[str, set[str]] = {}
    tables = [getattr(modeling_auto, name) for name in dir(modeling_auto)
              if name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES")]  # fmt: skip
    for table in tables:
        if not isinstance(table, dict):
            continue
        for model_type, classes in table.items():
            for cls in classes if isinstance(classes, tuple | list) else (classes,):
                found.setdefault(cls, set()).add(model_type)
    return {cls: frozenset(types) for cls, types in found.items()}


def _say_foreign_architecture(spec: HFSpec, config: Any, model: nn.Module, task: str) -> None:
    """transformers builds by model_type alone: a file whose architectures are another family's
    (a Llama model_type with `BertForMaskedLM`) was built as a Llama without a word. A class
    transformers does not know (remote code, an old spelling) says nothing either way."""
    archs = [a for a in getattr(config, "architectures", None) or [] if isinstance(a, str)]
    known = _architecture_types()
    foreign = [a for a in archs if a in known and config.model_type not in known[a]]
    if foreign:
        theirs = ", ".join(sorted({t for a in foreign for t in known[a]}))
        warn(f"{spec.source}: its architectures {foreign} are {theirs} models, but its "
             f"model_type is {config.model_type!r}; transformers builds by model_type, so this "
             f"is {type(model).__name__} (--task {task}): correct whichever field is "
             "wrong")  # fmt: skip


@dataclass(frozen=True)
class HFOptions:
    """How the model is built: task, classes, attention implementation and parameter dtype."""

    task: str | None = None
    num_classes: int | None = None
    attn: str | None = None
    dtype: torch.dtype = torch.float32


def _pin_loss_type(model: nn.Module) -> None:
    """A class name transformers maps to no loss (GPT-2's `GPT2LMHeadModel`) gets the causal-LM
    loss in `loss_function`, with a log line calling it a config error the user did not make;
    the loss it falls back to is set here, so the step is the same and says nothing."""
    from transformers.loss.loss_utils import LOSS_MAPPING

    if hasattr(model, "loss_type") and model.loss_type not in LOSS_MAPPING:
        model.loss_type = "ForCausalLM"


def build(spec: HFSpec, opts: HFOptions, device: torch.device) -> tuple[nn.Module, Any, str]:
    """(model, config, task) on `device`."""
    import transformers

    config = to_config(spec)
    task = opts.task or default_task(config)
    if task not in TASKS:
        raise UserError(f"--task {task!r}: expected one of {', '.join(TASKS)}")
    if task == "seq2seq" and not getattr(config, "is_encoder_decoder", False):
        raise UserError(
            f"--task seq2seq: {spec.name} ({config.model_type}) is not an encoder-decoder "
            "model; expected causal-lm or classification"
        )
    if task == "classification":
        config.num_labels = opts.num_classes or DEFAULT_CLASSES
        # Decoder classifiers find each row's last token through pad_token_id and refuse
        # batches larger than one without it; fine-tuning recipes set it to eos.
        if getattr(config, "pad_token_id", None) is None:
            eos = getattr(config, "eos_token_id", None)
            config.pad_token_id = (eos[0] if isinstance(eos, list) else eos) or 0
    if opts.attn is not None and opts.attn not in ATTENTION:
        raise UserError(f"--attn {opts.attn!r}: expected one of {', '.join(ATTENTION)}")
    auto = getattr(transformers, _AUTO[task])
    # No --attn: transformers' own default (sdpa where the model supports it, else eager).
    # flash_attention_2 needs the flash-attn package and a GPU; its memory is SDPA's flash
    # kernel's (the tracer forces that backend), so the model is built with sdpa.
    kwargs: dict[str, Any] = {}
    if opts.attn is not None:
        kwargs["attn_implementation"] = "sdpa" if opts.attn == "flash_attention_2" else opts.attn
    try:
        with device:
            model = auto.from_config(config, dtype=opts.dtype, **kwargs)
    except ValueError as e:
        what = f"--attn {opts.attn}" if opts.attn else f"--task {task}"
        raise UserError(f"{spec.name}: transformers cannot build it with {what} ({e})") from e
    except (RuntimeError, ZeroDivisionError, TypeError) as e:
        # A config that passed transformers' checks and SIZES but still makes no model (a size
        # its layers cannot split): the user's file, not an internal fault.
        raise UserError(
            f"{spec.source}: the model cannot be built from this config "
            f"({type(e).__name__}: {_one_line(e)}); check its sizes"
        ) from e
    _pin_loss_type(model)
    _say_foreign_architecture(spec, config, model, task)
    # Built with sdpa, the class's own flag is what transformers checks for flash-attn: a
    # model that refuses it (T5's position bias) was estimated as a job that cannot start.
    if (
        opts.attn == "flash_attention_2"
        and getattr(type(model), "_supports_flash_attn", True) is False
    ):
        raise UserError(
            f"--attn flash_attention_2: transformers does not support it for "
            f"{type(model).__name__} ({spec.name}); give --attn sdpa or eager"
        )
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if isinstance(experts, int) and experts > 1:
        warn(
            f"{spec.name} is a mixture of {experts} experts: the tracer's device has no values "
            "to route tokens by, so every expert processes every routed token (an upper bound on "
            "the experts' activations, by up to the number of experts over top-k); parameters, "
            "gradients and optimizer state are exact"
        )
    return model, config, task


def attention_of(model: nn.Module) -> str:
    """The attention implementation transformers settled on."""
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "sdpa")


def batch_maker(config: Any, task: str, batch: int, seq: int, device: torch.device) -> Any:
    """(inputs, None) per step: token ids and labels; the model computes its own loss. No
    attention mask: an all-ones mask is dropped by transformers before SDPA, so none is the
    same program for unpadded (packed) batches."""
    vocab = config.vocab_size
    classes = getattr(config, "num_labels", DEFAULT_CLASSES)

    def make() -> tuple[dict[str, torch.Tensor], None]:
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        if task == "classification":
            return {
                "input_ids": ids,
                "labels": torch.randint(0, classes, (batch,), device=device),
            }, None
        return {
            "input_ids": ids,
            "labels": torch.randint(0, vocab, (batch, seq), device=device),
        }, None

    return make


def model_loss(out: Any, _target: Any) -> torch.Tensor:
    return out.loss  # type: ignore[no-any-return]


DEFAULT_SEQ = 2048


def max_positions(config: Any) -> tuple[int, str] | None:
    """The longest sequence the config allows, and the field that says so; `None` when it has
    no maximum (T5's relative positions)."""
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value, name
    return None


def position_table(model: Any, most: int) -> str | None:
    """The learned position embedding of a model allowing `most` positions, named with its rows
    (`transformer.wpe, 1024 rows`); `None` when its positions are computed (rotary, relative,
    sinusoidal). A table has `most` rows, or two more (OPT's and RoBERTa's offset)."""
    from torch import nn

    # The token embedding is no position table, even when the vocabulary has as many rows
    # (Mistral-7B-v0.3: 32768 of each).
    tokens = getattr(model, "get_input_embeddings", lambda: None)()
    for name, m in model.named_modules():
        if isinstance(m, nn.Embedding) and m is not tokens and most <= m.num_embeddings <= most + 2:
            return f"{name}, {m.num_embeddings} rows"
    return None


def default_seq_len(config: Any) -> tuple[int, str]:
    """The sequence length when the user gives none, and why: the model's maximum, capped at
    2048 (a long-context model's maximum, 128k tokens, is not what a fine-tune trains at)."""
    most = max_positions(config)
    if most is None:
        return 512, "T5's pre-training length (the config has no maximum)"
    value, name = most
    if value <= DEFAULT_SEQ:
        return value, f"{name}, the model's maximum"
    return DEFAULT_SEQ, f"a common fine-tuning length; the model allows {value}"
