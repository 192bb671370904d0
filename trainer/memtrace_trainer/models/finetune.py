"""The fine-tuning regime of a model: parameter dtype, LoRA through peft, QLoRA's 4-bit base.

Applied to the built model before the trace starts, in the order a fine-tuning script applies
them: build in the parameter dtype, quantize the base (QLoRA), `prepare_model_for_kbit_training`
(QLoRA), then `get_peft_model`. peft itself freezes the base and adds the adapters, so the
trainable parameters, and with them gradients and optimizer state, are peft's.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memtrace_trainer.dtypes import DTYPES
from memtrace_trainer.errors import UserError
from memtrace_trainer.workload import parameter_count

# What peft and transformers say about memtrace's own calls while the regime is applied:
# noise to the user, who wrote none of them (`quiet_libraries`).
LIBRARY_NOISE = (
    # peft reads `model.is_gradient_checkpointing`, which transformers 5 deprecates.
    (r".*is_gradient_checkpointing.*deprecated", FutureWarning),
    # peft's advice on LoraConfig(ensure_weight_tying=...), which memtrace builds.
    (r"Model has `tie_word_embeddings=True` and a tied layer is part of the adapter", UserWarning),
    # peft corrects LoraConfig's fan_in_fan_out to each target's layout (GPT-2's Conv1D).
    (r"fan_in_fan_out is set to", UserWarning),
)
# The newest bitsandbytes release whose 4-bit layers were read for the emulation (the default).
NEWEST_BNB = (0, 50)


@dataclass(frozen=True)
class Lora:
    """`--lora R[:ALPHA]`, `--lora-targets`, `--lora-dropout` (peft's LoraConfig)."""

    r: int
    alpha: int | None = None
    dropout: float = 0.0
    targets: tuple[str, ...] | None = None

    @staticmethod
    def parse(text: str, targets: str | None, dropout: float | None) -> Lora:
        r_text, _, alpha_text = text.partition(":")
        try:
            r = int(r_text)
            alpha = int(alpha_text) if alpha_text else None
        except ValueError:
            raise UserError(f"--lora {text!r}: expected R or R:ALPHA, e.g. 16 or 16:32") from None
        if r < 1 or (alpha is not None and alpha < 1):
            raise UserError(f"--lora {text!r}: the rank and alpha must be positive")
        if dropout is not None and not 0.0 <= dropout < 1.0:
            raise UserError(f"--lora-dropout {dropout}: expected a probability in [0, 1)")
        names = None
        if targets is not None:
            names = tuple(t.strip() for t in targets.split(","))
            if not names or not all(names):
                # An empty name (`q_proj,,`, a trailing comma) matches nothing peft can say.
                raise UserError(
                    f"--lora-targets {targets!r}: expected module names like q_proj,v_proj"
                )
            if "all-linear" in names and len(names) > 1:
                raise UserError(
                    f"--lora-targets {targets!r}: all-linear already names every linear layer "
                    "but the output head; give it alone, or the module names alone"
                )
        return Lora(r, alpha, 0.0 if dropout is None else dropout, names)


@dataclass(frozen=True)
class Regime:
    """What the model is trained as. `dtype` None is fp32 parameters; `amp` is autocast's dtype
    (kept here only to check the pair; the step owns autocast)."""

    dtype: str | None = None
    amp: str | None = None
    lora: Lora | None = None
    qlora: bool = False
    double_quant: bool = False
    defaults: dict[str, Any] = field(default_factory=dict)
    # peft's prepare_model_for_kbit_training after quantizing (HF/peft/trl recipes); litgpt,
    # torchtune and Unsloth keep the non-quantized weights in the compute dtype instead.
    kbit_prepare: bool = True
    # The bitsandbytes release emulated: 0.41-0.43 keep each 4-bit layer's input for the
    # backward, 0.44 and later do not.
    bnb_version: tuple[int, int] = NEWEST_BNB

    def to_json(self) -> dict[str, Any]:
        """What the answer's inputs say of the regime (`fine_tuning`): a QLoRA answer must not
        read as a full fine-tune's."""
        out: dict[str, Any] = {"dtype": self.dtype or "fp32", "lora": None, "qlora": self.qlora}
        if self.lora is not None:
            lo = self.lora
            out["lora"] = {"r": lo.r, "alpha": lo.r if lo.alpha is None else lo.alpha,
                           "dropout": lo.dropout,
                           "targets": list(lo.targets) if lo.targets else None}  # fmt: skip
        if self.qlora:
            out |= {"double_quant": self.double_quant, "kbit_prepare": self.kbit_prepare,
                    "bnb_version": ".".join(map(str, self.bnb_version))}  # fmt: skip
        return out

    @property
    def adapters_flag(self) -> str:
        """The flag that asked for the LoRA adapters: --qlora's come with it (default rank)."""
        return "--qlora" if self.qlora else "--lora"

    def validate(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise UserError(f"--dtype {self.dtype!r}: expected one of {', '.join(DTYPES)}")
        low = self.dtype in ("bf16", "fp16")
        if low and self.amp is not None and self.amp != self.dtype:
            raise UserError(
                f"--dtype {self.dtype} with --amp {self.amp} is contradictory: the parameters "
                f"are {self.dtype}, and autocast to {self.amp} would cast every matmul to "
                "another 16-bit type; give one precision (--dtype alone for pure low precision, "
                "--amp alone for mixed precision over fp32 parameters)"
            )
        if self.double_quant and not self.qlora:
            raise UserError("--qlora-double-quant has no meaning without --qlora")
        if not self.kbit_prepare and not self.qlora:
            raise UserError("--no-kbit-prepare has no meaning without --qlora")

    @staticmethod
    def parse_bnb(text: str) -> tuple[int, int]:
        try:
            major, minor = (int(v) for v in text.split(".")[:2])
        except ValueError:
            raise UserError(f"--bnb-version {text!r}: expected a release like 0.45") from None
        if (major, minor) < (0, 41):
            raise UserError(f"--bnb-version {text}: NF4 training starts with bitsandbytes 0.41")
        if (major, minor) > NEWEST_BNB:
            from memtrace_trainer.notes import warn

            warn(f"--bnb-version {text} is newer than any release memtrace knows "
                 f"({'.'.join(map(str, NEWEST_BNB))}); it is emulated as the releases from 0.44 "
                 "are (the 4-bit layers keep no input for the backward)")  # fmt: skip
        return major, minor

    @property
    def param_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype or "fp32"]

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype QLoRA dequantizes to: the low precision in use, bf16 when none is given."""
        if self.dtype in ("bf16", "fp16"):
            return DTYPES[self.dtype]
        return DTYPES[self.amp] if self.amp else torch.bfloat16

    @property
    def active(self) -> bool:
        return self.dtype not in (None, "fp32") or self.lora is not None or self.qlora


def task_type(task: str | None) -> str | None:
    return {"causal-lm": "CAUSAL_LM", "classification": "SEQ_CLS", "seq2seq": "SEQ_2_SEQ_LM"}.get(
        task or ""
    )


def _linear_names(model: nn.Module) -> list[str]:
    from memtrace_trainer.models.qlora import Linear4bit

    names = {
        name.rsplit(".", 1)[-1]
        for name, m in model.named_modules()
        # The model itself (named "") is no target peft can name.
        if name and (isinstance(m, nn.Linear | Linear4bit) or type(m).__name__ == "Conv1D")
    }
    return sorted(names)


def _said_names(model: nn.Module) -> str:
    """Its linear layers' names, as a message lists them."""
    names = _linear_names(model)
    if names:
        return f"its linear layers are named {', '.join(names)}"
    return "it has no linear submodule (LoRA adapts submodules; the model itself is not one)"


def _check_targets(model: nn.Module, targets: tuple[str, ...]) -> None:
    """Each target must match a module, as peft matches them (the full name or its suffix)."""
    if targets == ("all-linear",):
        return
    names = [n for n, _ in model.named_modules() if n]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise UserError(
            f"--lora-targets: {', '.join(missing)} "
            f"{'matches' if len(missing) == 1 else 'match'} no module of this model; "
            f"{_said_names(model)}"
        )


# `warnings.catch_warnings` saves and restores the process's filters: two threads interleaving
# it (the library estimates in threads) could leave the other's filters in place for good.
_QUIET = threading.RLock()


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Within: the `LIBRARY_NOISE` warnings ignored, and only those; memtrace's own warnings and
    everything else peft or transformers says still reach the user."""
    with _QUIET, warnings.catch_warnings():
        for message, category in LIBRARY_NOISE:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield


def apply(model: nn.Module, regime: Regime, task: str | None, model_type: str | None) -> nn.Module:
    """The model as the regime trains it (a peft model when LoRA is on)."""
    with quiet_libraries():
        return _apply(model, regime, task, model_type)


def _apply(model: nn.Module, regime: Regime, task: str | None, model_type: str | None) -> nn.Module:
    regime.validate()
    if regime.qlora:
        from peft import prepare_model_for_kbit_training

        from memtrace_trainer.models.qlora import quantize

        fp32 = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
        strict = tuple(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
        heads = head_modules(model, task)
        total = sum(p.numel() for p in model.parameters())
        # transformers (`_get_dtype_plan`) loads those modules in fp32 when the load dtype is
        # fp16, and the strict ones for bf16 too; the 4-bit model loads in its compute dtype.
        load = regime.compute_dtype
        upcast = (fp32 if load == torch.float16 else ()) + (strict if load != torch.float32 else ())
        for n, m in model.named_modules():
            if n.rsplit(".", 1)[-1] in upcast:
                m.float()
        saves_input = regime.bnb_version < (0, 44)
        head = f" ({', '.join(heads)})" if heads else ""
        with _hidden(model, heads):
            count = quantize(model, regime.compute_dtype, regime.double_quant, fp32 + strict,
                             saves_input)  # fmt: skip
        if not count:
            raise UserError(
                "--qlora: this model has no linear layers (nn.Linear or transformers' Conv1D) "
                f"outside the output head{head} for bitsandbytes to quantize"
            )
        _say_small_share(count, total, head)
        # What fine-tuning scripts (and trl's SFTTrainer) call on a 4-bit model: freezes the
        # base and casts every non-quantized fp16/bf16 parameter to fp32. Checkpointing stays
        # the step's choice (--checkpointing).
        if regime.kbit_prepare:
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
            _say_dtype_undone(regime)
        elif not any(p.dtype in (torch.float16, torch.bfloat16) for p in model.parameters()):
            # The one thing kbit preparation changes here is that cast, of 16-bit parameters.
            from memtrace_trainer.notes import warn

            warn("--no-kbit-prepare has no effect: no parameter outside the 4-bit layers is "
                 "fp16 or bf16 (the model loads in fp32 without --dtype), so "
                 "prepare_model_for_kbit_training would cast nothing to fp32; give --dtype bf16 "
                 "to keep them in 16 bits")  # fmt: skip
    if regime.lora is None:
        return model
    from peft import LoraConfig, get_peft_model

    lora = regime.lora
    if lora.targets is not None:
        _check_targets(model, lora.targets)
    targets: Any = list(lora.targets) if lora.targets else None
    if targets == ["all-linear"]:
        targets = "all-linear"
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha if lora.alpha is not None else lora.r,
        lora_dropout=lora.dropout,
        target_modules=targets,
        task_type=task_type(task),
    )
    try:
        tuned = get_peft_model(model, config)
    except ValueError as e:
        if lora.targets is None:
            raise UserError(
                f"{regime.adapters_flag}: peft has no default targets for "
                f"{model_type or type(model).__name__}; "
                f"give --lora-targets ({_said_names(model)})"
            ) from None
        raise UserError(f"{regime.adapters_flag}: peft refused the config ({e})") from None
    _say_full_rank(tuned, lora.r, regime.adapters_flag)
    if regime.qlora:
        from memtrace_trainer.models.qlora import clone_outputs_under_lora

        clone_outputs_under_lora(tuned)
    return tuned  # type: ignore[no-any-return]


# The heads `PeftModelForSequenceClassification` keeps trainable in full (`modules_to_save`, peft
# 0.21 `peft_model.py`), each a module whose full name ends with one of these (`_set_trainable`).
CLASSIFIER_NAMES = ("classifier", "score")


def head_modules(model: nn.Module, task: str | None = None) -> tuple[str, ...]:
    """The modules bitsandbytes leaves in full precision, found by what they are, after
    transformers' `get_keys_to_not_convert` (`quantizers/base.py`): the output embedding,
    modules whose weights are tied to another's, and the module of the model's last parameter
    (its output layer, whatever its name). Not exactly as transformers 5.x: it strips only
    `.weight` from that last parameter's name, so where the parameter is a bias (BERT's and
    RoBERTa's classifier) the name matches no module and the layer is quantized; memtrace keeps
    it, as transformers 4.x (which strips `.bias` too) keeps BERT's `classifier`. The module is
    the head alone (a tied model's last norm, a classifier's last layer), except under a
    classification task (peft's `SEQ_CLS`), where it widens to the outermost enclosing module
    peft trains in full (`CLASSIFIER_NAMES`: all of RoBERTa's `classifier`, `dense` too)."""
    names = {id(m): n for n, m in model.named_modules()}
    out = getattr(model, "get_output_embeddings", lambda: None)()
    keep = [names[id(out)]] if isinstance(out, nn.Module) and id(out) in names else []
    owners: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name.rpartition(".")[0])
    keep += [n for shared in owners.values() if len(shared) > 1 for n in shared]
    params = list(model.named_parameters())
    if params:
        last = params[-1][0].rpartition(".")[0]
        if task_type(task) == "SEQ_CLS":
            parts = last.split(".")
            above = (".".join(parts[:depth]) for depth in range(1, len(parts) + 1))
            last = next((n for n in above if n.endswith(CLASSIFIER_NAMES)), last)
        keep.append(last)
    return tuple(dict.fromkeys(n for n in keep if n))


@contextlib.contextmanager
def _hidden(model: nn.Module, names: tuple[str, ...]) -> Iterator[None]:
    """Within: each named module replaced by an `nn.Identity` in its parent, so that `quantize`
    leaves it whole (by its full name: a child elsewhere of the same short name is quantized)."""
    held = []
    for name in names:
        if any(name.startswith(f"{other}.") for other in names):
            continue  # inside another one, hidden with it
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        module = getattr(owner, child, None)
        if isinstance(module, nn.Module) and not isinstance(module, nn.Identity):
            held.append((owner, child, module))
            setattr(owner, child, nn.Identity())
    try:
        yield
    finally:
        for owner, child, module in reversed(held):
            setattr(owner, child, module)


def _say_small_share(count: int, total: int, head: str) -> None:
    """QLoRA of a model whose linear layers are a small share of it (a CNN): most of it stays
    in its own dtype, which the estimate should not hide."""
    if total and 2 * count < total:
        from memtrace_trainer.notes import warn

        warn(f"--qlora quantizes {count:,} of the model's {total:,} parameters "
             f"({100 * count / total:.1f}%) to 4 bits: only linear layers outside the output "
             f"head{head} are, and the rest (convolutions, embeddings, norms) keep their "
             "dtype")  # fmt: skip


def _say_dtype_undone(regime: Regime) -> None:
    """`--dtype bf16/fp16` under kbit preparation: the parameters it would make 16-bit are cast
    back to fp32, and the 4-bit layers dequantize to 16 bits either way (bf16 by default)."""
    if regime.dtype not in ("bf16", "fp16"):
        return
    from memtrace_trainer.notes import warn

    amp = "" if regime.amp else f"give --amp {regime.dtype} for mixed precision; "
    # What `compute_dtype` would be without --dtype: --amp's, which (a 16-bit --dtype and
    # another --amp being refused) is the --dtype's own; bf16 without either.
    alone = f"{regime.amp} without it, as --amp {regime.amp} sets" if regime.amp else \
        "bf16 without --dtype or --amp"  # fmt: skip
    warn(f"--dtype {regime.dtype} has no effect with --qlora: prepare_model_for_kbit_training "
         "casts every parameter outside the 4-bit layers back to fp32, and the 4-bit layers "
         f"dequantize to a 16-bit compute dtype either way ({alone}); "
         f"{amp}--no-kbit-prepare keeps those parameters in {regime.dtype}")  # fmt: skip


def _say_full_rank(model: nn.Module, r: int, flag: str) -> None:
    """A rank at or above a target layer's smaller side is no low-rank update: its adapters
    hold as many parameters as the layer, or more, and the estimate is a full fine-tune's or
    worse. Legal, so said, not refused."""
    from memtrace_trainer.notes import warn

    sides = [(n, m.in_features, m.out_features) for n, m in model.named_modules()
             if hasattr(m, "lora_A") and hasattr(m, "in_features")
             and hasattr(m, "out_features")]  # fmt: skip
    full = [(n, i, o) for n, i, o in sides if r >= min(i, o)]
    if full:
        name, i, o = full[0]
        given = "--lora" if flag == "--lora" else "--qlora's default --lora"
        warn(f"{given} {r}: the rank reaches the smaller side of {len(full)} of the "
             f"{len(sides)} adapted layers ({name.rsplit('.', 1)[-1]}: {i} x {o}), whose "
             "adapters then hold as many parameters as the layer or more; a rank below it is "
             "the low-rank update LoRA is for")  # fmt: skip


def summary(model: nn.Module) -> dict[str, int]:
    """Parameter counts and bytes: total, trainable, and the frozen base's storage."""
    total = trainable = total_bytes = trainable_bytes = 0
    for p in model.parameters():
        n, b = parameter_count(p), p.numel() * p.element_size()
        total += n
        total_bytes += b
        if p.requires_grad:
            trainable += n
            trainable_bytes += b
    return {
        "parameters": total,
        "trainable_parameters": trainable,
        "parameter_bytes": total_bytes,
        "trainable_parameter_bytes": trainable_bytes,
    }
