"""What the Python API checks of a caller's arguments and model before tracing: every refusal an
`EstimateError` naming the argument and what was expected, every input used only in part a
warning (`notes.warn`, a `MemtraceWarning` to the caller)."""

from __future__ import annotations

import dataclasses
import functools
import operator
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from memtrace.result import EstimateError
from memtrace_trainer import notes
from memtrace_trainer.estimate import FEATURES_WORDS

# The checks behind the API are the CLI's, whose messages name its flags; a caller of the API
# wrote keyword arguments, so those are named instead.
KEYWORDS = {"iterations": "steps", "steps": "steps", "world-size": "world_size",
            "lora-targets": "lora_targets", "lora": "lora", "amp": "amp", "dtype": "dtype",
            "optimizer": "optimizer", "strategy": "strategy", "capacity": "capacity",
            "profile": "gpu", "checkpointing": "checkpointing", "point": "point",
            "alloc-conf": "alloc_conf", "step": "model", "report": "path",
            "lora-dropout": "lora_dropout", "qlora": "qlora", "task": "task", "attn": "attn",
            "qlora-double-quant": "qlora_double_quant", "bnb-version": "bnb_version",
            "no-kbit-prepare": "kbit_prepare=False",
            "reduce-bucket-size": "reduce_bucket_size"}  # fmt: skip
# The fine-tuning keywords (the CLI's fine-tuning flags) and their defaults.
TUNING = {"dtype": None, "lora": None, "lora_targets": None, "lora_dropout": None,
          "qlora": False, "qlora_double_quant": False, "bnb_version": None,
          "kbit_prepare": True, "task": None, "attn": None}  # fmt: skip
# A flag starts a word: `ResNet--step` (a title) and `/data/exp--lora/t.jsonl` (a path) hold none.
# Its value: quoted, the word before a colon (`--world-size 0:`), or a word that may be one
# (`--profile h200 to judge`, `_is_value`); `(--capacity)` says where a value came from.
# A word may go on to more of its kind (`--strategy zero1, zero2 and zero3`); not to a flag.
_WORD = r"(?!--)[\w/~+-]+(?:\.[\w/~+-]+)*"
_MORE = re.compile(rf"(,? (?:or|and) |, )({_WORD})")
# A size with its unit is one value (`--capacity 81920.00 MiB is more than`).
_SIZE = r"\d+(?:\.\d+)? (?:[KMGT]i?B|B)\b"
_FLAG = re.compile(r"(?P<open>\()?(?<![\w/.-])--(?P<flag>[a-z][a-z0-9-]*)(?: <[A-Z_]+>)?"
                   rf"(?: (?:(?P<value>'[^']*'|[^\s:'()]+(?=:))|(?P<size>{_SIZE})|(?P<word>{_WORD})"
                   rf"(?P<more>(?:,? (?:or|and) {_WORD}|, {_WORD})*)))?"
                   r"(?P<close>\))?")  # fmt: skip
# The keywords whose values are strings in the API (quoted when said), and those that take a
# string or a number (quoted unless a number); the rest are said as they are (`model=make`).
_STRINGS = {"gpu", "profile", "optimizer", "strategy", "amp", "dtype", "lora_targets", "task",
            "attn", "bnb_version", "alloc_conf", "path", "checkpointing"}  # fmt: skip
_STRING_OR_NUMBER = {"capacity", "lora"}
# Switches, whose flag alone means True.
_SWITCHES = {"point": "=True", "qlora": "=True", "qlora_double_quant": "=True"}
_NUMBER = re.compile(r"-?\d+(\.\d*)?([eE][+-]?\d+)?")
# What the CLI's words say to do, said as a caller of `estimate` does it (`fits(gpu)` says that a
# trace was emulated for another GPU): only where the profile is `gpu=`, not `replay`'s own.
_PHRASES = {"trace it again with": "estimate again with"}
# What memest says of the baselines beside its estimate (analytic, horus, accelerate, deepspeed),
# which the API's answer does not show: kept in `to_json()`, with them, not warned of.
# The layer features feed only the analytic and ML baselines.
BASELINES_ONLY = ("the analytic, horus, accelerate and deepspeed baselines", FEATURES_WORDS)
CHECKPOINTING = {False: None, None: None, True: "full", "full": "full", "selective": "selective"}


def as_keywords(message: str, keywords: dict[str, str] = KEYWORDS) -> str:
    """`message` with each CLI flag the API has a keyword for said as that keyword, its value as
    the caller writes it: `--world-size 0:` as `world_size=0:`, `--profile h200` as
    `gpu='h200'`; a flag without a value as the keyword's name, and one alone in parentheses,
    where a value came from (`capacity 2.0 MiB (--capacity)`), as `(given as capacity=)`."""

    def said(m: re.Match[str]) -> str:
        name = keywords.get(m["flag"])
        if name is None:
            return m[0]
        opened, closed, word, more = m["open"] or "", m["close"] or "", m["word"], m["more"]
        if m["value"] is not None:
            return f"{opened}{name}={_literal(name, m['value'])}{closed}"
        if m["size"] is not None:  # quoted as the caller writes a size (`capacity='80 GiB'`)
            said = f"={m['size']!r}" if name in _STRING_OR_NUMBER else f" {m['size']}"
            return f"{opened}{name}{said}{closed}"
        if word is not None and _is_value(name, word):
            return f"{opened}{name}={_literal(name, word)}{_others(name, more)}{closed}"
        if opened and closed and word is None:
            return f"(given as {name}{'' if '=' in name else _SWITCHES.get(name, '=')})"
        return f"{opened}{name}{'' if word is None else ' ' + word + more}{closed}"

    out = _FLAG.sub(said, message)
    if keywords.get("profile") == "gpu":
        for cli_words, api_words in _PHRASES.items():
            out = out.replace(cli_words, api_words)
    return out


def _others(name: str, more: str) -> str:
    """The values listed after a flag's first (`, zero2 and zero3`), each said as it is; the
    list ends at the first word that is none (the sentence going on): for a keyword of fixed
    choices, one that is not a choice (`--dtype bf16 and 4 ranks`)."""
    choices = _choices().get(name)
    out, at = "", 0
    for m in _MORE.finditer(more):
        further = m[2] in choices if choices is not None else _is_value(name, m[2])
        if m.start() != at or not further:
            break
        out, at = out + m[1] + _literal(name, m[2]), m.end()
    return out + more[at:]


def _is_value(name: str, word: str) -> bool:
    """Whether `word` after a flag is its value, not the sentence going on (`--capacity without
    --profile`): a number, a path, a word with a digit (`h200`, `bf16`, `zero1`), or one of the
    keyword's choices (`--strategy ddp`, `--attn sdpa`)."""
    if "=" in name:  # a switch said with its value (`kbit_prepare=False`)
        return False
    return any(c.isdigit() for c in word) or "/" in word or word in _choices().get(name, ())


def _literal(name: str, value: str) -> str:
    """`value` as the caller writes it: quoted where the keyword takes a string."""
    if value[0] == "'" or name not in _STRINGS | _STRING_OR_NUMBER:
        return value
    if name in _STRING_OR_NUMBER and _NUMBER.fullmatch(value):
        return value
    return repr(value)


@functools.lru_cache(maxsize=1)
def _choices() -> dict[str, frozenset[str]]:
    """The values of the keywords whose CLI flags take one of a fixed set."""
    from memtrace_trainer.cli import common

    return {name: frozenset(map(str, values)) for name, values in (
        ("amp", common.AMP), ("dtype", common.DTYPES), ("attn", common.ATTENTION),
        ("task", common.TASKS), ("optimizer", common.OPTIMIZERS),
        ("checkpointing", common.CHECKPOINTING), ("strategy", common.STRATEGIES))}  # fmt: skip


def _is_bool(value: Any) -> bool:
    """True/False, NumPy's too (a mask's `.any()`), without importing NumPy to ask."""
    np = sys.modules.get("numpy")
    return isinstance(value, bool) or (np is not None and isinstance(value, np.bool_))


def integer(value: Any) -> int | None:
    """`value` as an int where it is a whole number a caller counts with: an int, a NumPy integer
    (`np.int64` from an array's shape arithmetic) or a 0-dim integer tensor, as
    `operator.index` takes them; None for anything else, a bool too (a yes/no, not a count)."""
    if _is_bool(value):
        return None
    if isinstance(value, torch.Tensor) and (value.dtype == torch.bool or value.dim() != 0
                                            or value.is_meta):  # fmt: skip
        # `operator.index` takes any one-element tensor ([4], [[4]]: a list, not a count), and
        # on a meta tensor raises its own RuntimeError: it holds no value to count with.
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def count(name: str, value: Any, what: str) -> int | None:
    """An optional count of at least 1, as an int."""
    if value is None:
        return None
    n = integer(value)
    if n is None or n < 1:
        raise EstimateError(f"{name}={value!r}: expected {what} (an int of at least 1)")
    return n


def elements(name: str, value: Any) -> int | None:
    """A number of elements as DeepSpeed's config writes it: 0 or more, whole (5e8 taken)."""
    from memtrace_trainer.symtrace.deepspeed import whole_elements

    # A NumPy or 0-dim tensor integer is taken as the counts are (`integer`).
    whole = integer(value)
    n = whole_elements(whole if whole is not None else value)
    n = n if not isinstance(value, str) else None
    if value is not None and (n is None or n < 0):
        raise EstimateError(f"{name}={value!r}: expected a whole number of elements, 0 or more")
    return n


def steps(value: Any) -> int | None:
    """`steps=`: a count the tracer takes, bounded as the CLI's `--steps` is."""
    from memtrace_trainer.errors import UserError
    from memtrace_trainer.symtrace.userstep import check_steps

    n = count("steps", value, "a number of traced steps")
    if n is not None:
        try:
            check_steps(n)
        except UserError as e:
            raise EstimateError(as_keywords(str(e))) from None
    return n


def text(name: str, value: Any) -> str:
    """A name argument (`gpu`, `profile`, `optimizer`): a non-empty string or a path
    (`os.PathLike`, as `open` takes), as the string the commands take."""
    said = os.fspath(value) if isinstance(value, str | os.PathLike) else None
    if not isinstance(said, str) or not said.strip():
        raise EstimateError(f"{name}={value!r}: expected a non-empty name (a string) or a path")
    return said


def choice(name: str, value: Any) -> str | None:
    """`amp`, `dtype`, `strategy` or `optimizer`: a name of the CLI's, as a string (its value is
    checked by the CLI's own check, in its words), or for `amp` and `dtype` the torch dtype it
    names (torch.bfloat16). Any other type is refused as the caller wrote it: it was turned into
    text first, and `amp=True` was said as `amp='True'`."""
    from memtrace_trainer.cli import common

    if value is None or isinstance(value, str):
        return value
    names: Any = {"amp": common.AMP, "dtype": common.DTYPES, "strategy": common.STRATEGIES,
                  "optimizer": common.OPTIMIZERS}[name]  # fmt: skip
    if isinstance(names, Mapping):
        named = {dtype: n for n, dtype in names.items()}
        if isinstance(value, torch.dtype) and value in named:
            return str(named[value])
        names = [*names, *(f"torch.{str(d).removeprefix('torch.')}" for d in named)]
    raise EstimateError(f"{name}={value!r}: expected one of {', '.join(map(str, names))}")


def size(name: str, value: Any) -> str | None:
    """A memory size (`capacity`) as the text memsim's size parser reads: a string ('40GiB') or
    a number, which that parser says what it most likely means of (a bare 40960: MiB)."""
    if value is None or isinstance(value, str):
        return value
    if _is_bool(value) or (not isinstance(value, int | float) and integer(value) is None):
        # A list or dict reached the profile cache as a key (a raw TypeError: unhashable).
        raise EstimateError(f"{name}={value!r}: expected a size such as '40GiB'")
    return str(value if isinstance(value, int | float) else integer(value))


def flag(name: str, value: Any) -> bool:
    """A yes/no argument (`point`): True or False (NumPy's too), not a truthy string
    (`point="no"` was True)."""
    if not _is_bool(value):
        raise EstimateError(f"{name}={value!r}: expected True or False")
    return bool(value)


def checkpointing(value: Any) -> str | None:
    """`checkpointing=` as the tracer names it; the type first, as a list is not hashable and
    0 or 1 would pass for False or True."""
    value = bool(value) if _is_bool(value) else value
    if not (value is None or isinstance(value, bool | str)) or value not in CHECKPOINTING:
        raise EstimateError(f"checkpointing={value!r}: expected False, True, 'full' or "
                            "'selective'")  # fmt: skip
    return CHECKPOINTING[value]


def loop_arguments(target: Any, loss_fn: Any, lora_targets: Any) -> str | None:
    """Refuse values the tracer cannot take, naming the keyword; `lora_targets` as the CLI's
    comma-separated text (a list of module names is taken too)."""
    if loss_fn is not None:
        if not callable(loss_fn):
            raise EstimateError(f"loss_fn={loss_fn!r}: expected a callable loss_fn(output, "
                                "target) -> scalar tensor")  # fmt: skip
        import inspect

        try:
            inspect.signature(loss_fn).bind(None, None)
        except TypeError as e:
            raise EstimateError(f"loss_fn: it is called as loss_fn(output, target), and that "
                                f"call does not match its signature ({e})") from None  # fmt: skip
        except ValueError:
            pass  # a builtin without a signature: it is called as is
    elif target is not None and not isinstance(target, torch.Tensor):
        raise EstimateError(
            f"target: the default loss takes a tensor (class indices or values), got "
            f"{type(target).__name__}; convert it (torch.as_tensor) or pass loss_fn="
        )
    if lora_targets is None or isinstance(lora_targets, str):
        return lora_targets
    if isinstance(lora_targets, list | tuple) and all(isinstance(t, str) for t in lora_targets):
        return ",".join(lora_targets)
    raise EstimateError(f"lora_targets={lora_targets!r}: expected module names, as a list of "
                        "strings or one comma-separated string")  # fmt: skip


def loss(loss_fn: Callable[..., Any], batch: int) -> Callable[..., torch.Tensor]:
    """`loss_fn` as the tracer's loop calls it at `batch`: what it raises is said as its own
    failure, with the caller's frames (the loop said "the model failed" of it), and its result
    is checked in the caller's words (the loop says "the loss", the caller wrote a `loss_fn`).
    A `ModelFailedError`, so that `max_batch` tells a size it refuses from one it takes."""
    from memtrace_trainer.errors import (
        EntryFailedError,
        in_model,
        raised_by_memtrace,
        size_overflow,
    )
    from memtrace_trainer.symtrace.step import check_loss

    def checked(output: Any, target: Any) -> torch.Tensor:
        try:
            value = loss_fn(output, target)
        except Exception as e:
            if raised_by_memtrace(in_model(e)):  # memtrace's own (its default_loss inside): as is
                raise
            if (too_large := size_overflow(e)) is not None:  # a probe's size, as the model's
                raise too_large from e
            failed = EntryFailedError(f"loss_fn failed at batch {batch}:", e)
            failed.batch_size = batch
            raise failed from e
        check_loss(value, "loss_fn")
        if not value.requires_grad:
            # backward() on it fails on a GPU too; the loop said so as the model's failure.
            floats = [t for t in tensors(output) if t.is_floating_point()]
            if floats and not any(t.requires_grad for t in floats):
                # Cut off before loss_fn saw it: what loss_fn did to it is not the fault.
                raise EstimateError(
                    "the model's output does not require grad: its forward cut it off from "
                    "the trainable parameters (torch.no_grad(), .detach(), or only frozen "
                    "parameters used), so backward() has nothing to train"
                )
            raise EstimateError(
                "loss_fn returned a tensor that does not require grad: it is cut off from the "
                "model's output (.detach(), .item(), torch.no_grad() or a new tensor), so "
                "backward() has nothing to train"
            )
        return value  # type: ignore[no-any-return]

    return checked


def float_inputs(model: nn.Module, inputs: Any, dtype: str | None, amp: str | None) -> None:
    """Warn of floating inputs of another dtype than the model's parameters: the meta device
    checks no dtypes, so float64 inputs (numpy's default) to a float32 model trace fine where a
    GPU's first layer fails ("mat1 and mat2 must have the same dtype"). Integer inputs are
    `workload.integer_inputs`'s: right for an embedding, only the layer they reach says."""
    floats = {t.dtype for t in tensors(inputs) if t.is_floating_point()}
    params = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if dtype is None and amp is None and len(params) == 1 and floats - params:
        notes.warn(
            f"example_inputs are {', '.join(sorted(str(f) for f in floats - params))} and the "
            f"model's parameters {next(iter(params))}: on a GPU the first layer that mixes them "
            "fails unless the model casts its inputs; the estimate is of the job as given"
        )


def tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a tensor, tuple, list, mapping (a transformers ModelOutput is a dict, a
    tokenizer's BatchEncoding a UserDict) or dataclass, in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from tensors(v)
    elif isinstance(value, tuple | list):
        for v in value:
            yield from tensors(v)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from tensors(getattr(value, f.name, None))


def batch_of(inputs: Any) -> int:
    """The batch of `example_inputs`: the first dimension of its first tensor that has one (a
    0-dim tensor, a scalar argument, is not resized with the batch), at least 1 (an empty batch
    has no memory to estimate, and a search of a batch needs one sample's shape)."""
    first = next((t for t in tensors(inputs) if t.dim() > 0), None)
    if first is None:
        raise EstimateError("example_inputs: expected a tensor (or a tuple/dict of tensors) "
                            "whose first dimension is the batch")  # fmt: skip
    if first.shape[0] == 0:
        raise EstimateError(f"example_inputs: the batch is empty (shape {tuple(first.shape)}): "
                            "expected at least one sample in the first dimension")  # fmt: skip
    return int(first.shape[0])


def scripted(model: nn.Module) -> None:
    """Refuse TorchScript (`torch.jit.script`/`trace`): its graph runs as compiled code, which
    neither the tracer's module hooks nor its device can follow; PyTorch's words for the first
    hook ("register_forward_hook is not supported on ScriptModules") blamed the model."""
    for name, m in model.named_modules():
        if isinstance(m, torch.jit.ScriptModule):
            where = "model" if not name else f"model: its submodule {name!r}"
            raise EstimateError(
                f"{where} is a TorchScript module (torch.jit.script or torch.jit.trace), which "
                "cannot be traced on the tracer's device: pass the eager nn.Module it was made "
                "from"
            )


def _users(hook: Any) -> bool:
    """Whether a hook is the user's own code (not a library's: transformers registers hooks of
    its own, e.g. for gradient checkpointing), so a warning about it is news to them."""
    from memtrace_trainer.errors import is_user_file

    fn = getattr(hook, "func", hook)  # functools.partial
    fn = getattr(fn, "__func__", fn)  # a bound method
    code = getattr(fn, "__code__", None) or getattr(type(fn).__call__, "__code__", None)
    return code is not None and (code.co_filename.startswith("<") or
                                 is_user_file(code.co_filename))  # fmt: skip


def listed(items: list[str]) -> str:
    """The first three of `items` and how many more."""
    shown = ", ".join(items[:3])
    return shown + (f" and {len(items) - 3} more" if len(items) > 3 else "")


def hooks_said(model: nn.Module) -> None:
    """Warn of the caller's hooks on the model: module hooks are copied with it and run on the
    tracer's copy (what they keep holds meta tensors afterwards), and hooks on its tensors stay
    with the caller's tensors, so they are left out of the trace."""
    kinds = (("forward hook", "_forward_hooks"), ("forward pre-hook", "_forward_pre_hooks"),
             ("backward hook", "_backward_hooks"),
             ("backward pre-hook", "_backward_pre_hooks"))  # fmt: skip
    ran = [
        f"{kind} {getattr(h, '__qualname__', type(h).__name__)} on "
        + (f"{name!r}" if name else "the model")
        for name, m in model.named_modules()
        for kind, attr in kinds
        for h in (getattr(m, attr, None) or {}).values()
        if _users(h)
    ]
    if ran:
        notes.warn(
            f"hooks registered on the model ran on the tracer's copy of it ({listed(ran)}): "
            "whatever they keep (a dict of features, a list of outputs) now holds the trace's "
            "meta tensors, not values"
        )
    left = [
        name
        for name, t in [*model.named_parameters(), *model.named_buffers()]
        if any(
            _users(h)
            for attr in ("_backward_hooks", "_post_accumulate_grad_hooks")
            for h in (getattr(t, attr, None) or {}).values()
        )
    ]
    if left:
        notes.warn(
            f"gradient hooks on the model's tensors ({listed(left)}) were left out of the "
            "trace: the tracer's copy has tensors of its own, and a hook stays with the tensor "
            "it was registered on, so what the hooks allocate is not in the estimate; register "
            "them in a step builder (memtrace.estimate(make_step)) to have them traced"
        )


def _transformers_model(model: nn.Module) -> bool:
    """Whether `model` is a transformers PreTrainedModel (or peft's wrapper of one). Only when
    transformers is imported already: a model of it cannot exist otherwise."""
    tf = sys.modules.get("transformers")
    if tf is None:
        return False
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return isinstance(base, tf.PreTrainedModel)


def masks(model: nn.Module, inputs: Any) -> Any:
    """`example_inputs` for the trace of a transformers model. transformers reads a 2-D
    attention mask's values to choose its path (masking_utils: `_ignore_causal_mask_sdpa`,
    `_ignore_bidirectional_mask_sdpa` and `flash_attention_mask` take an all-ones mask as none),
    which the tracer's device cannot: there the read is a stand-in that says "padded", the path
    a padded batch takes (a 4-D mask). The example is the caller's real tensors, so the reading
    is done here: an all-ones mask is left out, as transformers leaves it out. Silently: a
    tokenizer returns one for every batch without padding, and transformers' own run treats it
    as no mask, so nothing of the job is lost. Only for transformers' own model: a caller's
    module (one wrapping a transformers model too) may read its mask as it likes."""
    if not isinstance(inputs, Mapping) or not _transformers_model(model):
        return inputs
    return {key: value for key, value in inputs.items()
            if not (key.endswith("attention_mask") and isinstance(value, torch.Tensor)
                    and value.dim() == 2 and value.device.type != "meta"
                    and bool(value.all()))}  # fmt: skip


def lora(value: Any) -> int | str | None:
    """`lora=`: a rank (an int of at least 1; 0 is no adapter, which is `lora=None`), or the
    CLI's text "R" or "R:ALPHA" (checked as `--lora` is, in its words). An int was said back as
    the text it was turned into (`lora='0'`), a float as one it never was."""
    if value is None or isinstance(value, str):
        return value  # type: ignore[no-any-return]
    rank = integer(value)
    if rank is None:
        raise EstimateError(f"lora={value!r}: expected a rank (an int of at least 1) or 'R:ALPHA' "
                            "(e.g. '16:32')")  # fmt: skip
    if rank < 1:
        raise EstimateError(f"lora={value!r}: expected a rank, an int of at least 1 (without "
                            "LoRA, leave lora= out)")  # fmt: skip
    return rank


def given(tuning: Mapping[str, Any]) -> list[str]:
    """The fine-tuning keywords set to other than their defaults, by value: NumPy's `False_`
    for `qlora` is its default as much as `False` is."""
    return [n for n, default in TUNING.items() if not _same(tuning.get(n, default), default)]


def _same(value: Any, default: Any) -> bool:
    if value is default:
        return True
    if default is None or isinstance(value, str):
        return False
    try:
        return bool(value == default)
    except Exception:  # an array of several values is no default
        return False


def tune(model: nn.Module, amp: str | None, tuning: Mapping[str, Any]) -> Any:
    """The fine-tuning keywords as the CLI's `tune_from` takes its flags, checked as it checks
    them (its words, the keywords named: `_errors` says them so), after the types a keyword can
    get wrong that argparse rules out on the command line. A `task` or `attn` that sets nothing
    (the model is not a transformers model, or `task` without adapters) is said."""
    from memtrace_trainer.cli.common import tune_from
    from memtrace_trainer.models.hf import ATTENTION, TASKS

    tuning = {**tuning, **{n: flag(n, tuning[n]) for n in ("qlora", "qlora_double_quant",
                                                          "kbit_prepare")}}  # fmt: skip
    dropout = tuning["lora_dropout"]
    if dropout is not None and (isinstance(dropout, bool) or not isinstance(dropout, int | float)):
        raise EstimateError(f"lora_dropout={dropout!r}: expected a probability in [0, 1)")
    tuning = {**tuning, "lora": lora(tuning["lora"])}
    bnb = tuning["bnb_version"]
    if bnb is not None and not isinstance(bnb, str):
        raise EstimateError(f"bnb_version={bnb!r}: expected a release as a string, like '0.45' "
                            "(a float loses the digits: 0.50 is 0.5)")  # fmt: skip
    for name, choices in (("task", TASKS), ("attn", ATTENTION)):
        if tuning[name] is not None and tuning[name] not in choices:
            raise EstimateError(f"{name}={tuning[name]!r}: expected one of {', '.join(choices)}")
    if tuning["lora"] is None and not tuning["qlora"]:
        for name in ("lora_targets", "lora_dropout"):
            if tuning[name] is not None:
                raise EstimateError(f"{name}= has no meaning without lora= (or qlora=True)")
    out = tune_from({**tuning, "amp": amp})
    if not _transformers_model(model):
        for name in ("task", "attn"):
            if tuning[name] is not None:
                notes.warn(f"{name}={tuning[name]!r} has no effect: the model is not a "
                           "transformers model (task is peft's task type for its adapters, "
                           "attn its attention implementation)")  # fmt: skip
        return dataclasses.replace(out, task=None, attn=None)
    if tuning["task"] is not None and out.regime.lora is None:
        notes.warn(f"task={tuning['task']!r} has no effect without lora= or qlora=True: it is "
                   "peft's task type for the adapters; the model's head is the one it was "
                   "built with")  # fmt: skip
    return out
