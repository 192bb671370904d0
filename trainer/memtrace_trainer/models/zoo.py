"""Models by spec string, and user entry points (`--entry package.module:function`)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from memtrace_trainer.dtypes import name_of
from memtrace_trainer.errors import (
    UserCodeError,
    UserError,
    check_batch_size,
    is_integer,
    json_object,
    require_batch_size,
)
from memtrace_trainer.models.config import ModelConfig, from_dict
from memtrace_trainer.models.dlrm import DLRM, DLRMConfig
from memtrace_trainer.models.finetune import Regime
from memtrace_trainer.models.gpumemnet import (
    ROW_BATCH_UNUSED,
    filename_batch,
    from_gpumemnet_filename,
)
from memtrace_trainer.notes import warn
from memtrace_trainer.workload import Batch, Workload, fresh_like, rebuilt, user_function
from memtrace_trainer.workload import entry_takes as takes

META = torch.device("meta")
DEFAULT_CLASSES = 1000

ZOO_EXAMPLES = (
    "torchvision:resnet50",
    "timm:convnext_tiny",
    "hf:gpt2",
    "hf:bert-base-uncased",
    "dlrm",
)


def _classification(
    spec: str,
    model: nn.Module,
    batch: int,
    shape: tuple[int, ...],
    classes: int,
    family: str = "",
    device: torch.device = META,
) -> Workload:
    def make() -> Batch:
        x = torch.randn(batch, *shape, device=device)
        return x, torch.randint(0, classes, (batch,), device=device)

    def one(out: torch.Tensor, target: Any) -> torch.Tensor:
        if classes == 1:
            return F.binary_cross_entropy(out.squeeze(1), target.float())
        return F.cross_entropy(out, target)

    def loss(out: Any, target: Any) -> torch.Tensor:
        # In train mode Inception v3 and GoogLeNet return their auxiliary classifiers' logits
        # too (a namedtuple); torchvision's reference training adds a loss for each, which is
        # what keeps the aux branches in backward on a GPU. A field left None is no output.
        if isinstance(out, tuple):
            heads = [o for o in out if isinstance(o, torch.Tensor)]
            if heads:
                total = one(heads[0], target)
                for head in heads[1:]:
                    total = total + one(head, target)
                return total
        return one(out, target)

    return Workload(spec, model, make, loss, batch, family, sizes={"input_shape": list(shape)})


def _parse_shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"--input-shape {text!r}: expected integers like 3,224,224") from None
    if not shape or any(v < 1 for v in shape):
        raise UserError(f"--input-shape {text!r}: expected positive integers like 3,224,224")
    return shape


def _check_shape(spec: str, config: ModelConfig, shape: tuple[int, ...] | None) -> None:
    """A generator model's input is fixed by its config (an MLP's input_size, a CNN's channels,
    a transformer's one sequence length): another shape failed deep inside torch's matmul."""
    if shape is None:
        return
    default = config.default_input_shape()
    given = ",".join(map(str, shape))
    want = ",".join(map(str, default))
    if config.family == "cnn":
        if len(shape) != 3 or shape[0] != default[0]:
            raise UserError(f"--input-shape {given}: {spec} takes C,H,W images with C = "
                            f"{default[0]} (its input_channels), e.g. {want}")  # fmt: skip
    elif config.family == "transformer":
        if len(shape) != 1:
            raise UserError(f"--input-shape {given}: {spec} takes one sequence length "
                            f"(e.g. {want}; or give --seq-len)")  # fmt: skip
    elif shape != default:
        raise UserError(f"--input-shape {given}: {spec} takes inputs of shape {want} (its "
                        "input_size); leave the flag out or give that")  # fmt: skip


def _synthetic(
    spec: str,
    config: ModelConfig,
    batch: int,
    shape: tuple[int, ...] | None,
    device: torch.device = META,
) -> Workload:
    _check_shape(spec, config, shape)
    with device:
        model = config.build()
    if config.family == "transformer":
        seq = shape[0] if shape else config.default_input_shape()[0]
        vocab = config.vocab_size  # type: ignore[attr-defined]

        def make() -> Batch:
            ids = torch.randint(0, vocab, (batch, seq), device=device)
            return ids, torch.randint(0, config.classes(), (batch,), device=device)

        return Workload(spec, model, make, lambda o, t: F.cross_entropy(o, t), batch, "transformer",
                        sizes={"seq_len": seq})  # fmt: skip
    shape = shape or config.default_input_shape()
    return _classification(spec, model, batch, shape, config.classes(), config.family, device)


def _hf(
    spec: str,
    source: str,
    name: str,
    batch: int,
    seq_len: int | None,
    device: torch.device,
    tune: Tune,
) -> Workload:
    from memtrace_trainer.models import finetune, hf

    hfspec = hf.resolve(name) if source == "hf" else hf.read_config(Path(name))
    opts = hf.HFOptions(tune.task, tune.num_classes, tune.attn, tune.regime.param_dtype)
    model, config, task = hf.build(hfspec, opts, device)
    defaults: dict[str, Any] = {}
    if tune.task is None:
        defaults["task"] = {"value": task, "why": hf.task_reason(hfspec, config)}
    if task != "classification":
        _ignored("--num-classes", tune.num_classes, f"--task {task} predicts tokens, not classes")
    elif tune.num_classes is None:
        defaults["num_classes"] = {"value": hf.DEFAULT_CLASSES, "why": "a binary classifier"}
    if seq_len is None:
        seq, why = hf.default_seq_len(config)
        defaults["seq_len"] = {"value": seq, "why": why}
    else:
        seq = seq_len
    if seq < 1:
        raise UserError(f"--seq-len {seq}: expected a positive integer")
    most = hf.max_positions(config)
    if most is not None and seq > most[0]:
        table = hf.position_table(model, most[0])
        if table is not None:
            raise UserError(
                f"--seq-len {seq}: beyond {hfspec.name}'s {most[1]} ({most[0]}), and the model "
                f"learns its positions ({table}): a real run fails at the position lookup; give "
                f"--seq-len {most[0]} or less"
            )
        warn(f"a sequence of {seq} tokens is beyond {hfspec.name}'s {most[1]} ({most[0]}): its "
             "positions are computed (rotary or relative), so a real run works, outside what "
             "the model was trained on; this estimates the memory alone")  # fmt: skip
    model = finetune.apply(model, tune.regime, task, config.model_type)
    w = Workload(spec, model, hf.batch_maker(config, task, batch, seq, device), hf.model_loss,
                 batch, config.model_type, defaults, sizes={"seq_len": seq})  # fmt: skip
    attn = tune.attn or hf.attention_of(model)
    if tune.attn is None:
        defaults["attn"] = {"value": attn, "why": "transformers' default for this model"}
    defaults.update(tune.regime.defaults)
    w.details = {"task": task, "attn": attn, "source": hfspec.source,
                 **finetune.summary(model), "fine_tuning": tune.regime.to_json()}  # fmt: skip
    if tune.regime.qlora:
        # What transformers records of a 4-bit load (config._pre_quantization_dtype): the
        # compute dtype the model was loaded in, which its flash attention casts fp32 inputs to.
        w.details["pre_quantization_dtype"] = name_of(tune.regime.compute_dtype)
    return w


def default_num_classes(spec: str) -> int:
    """What `RunConfig.id` hashes a left-out `num_classes` as: the classifier width the model is
    built with. transformers' binary classifier for a Hugging Face model whose published
    architecture is a classifier; ImageNet's 1000 for the rest, a model that reads no count (a
    language model, a generator config) included, so that ids written before stay as they were.
    An unknown spec is refused where the run is built, not here."""
    source, _, name = spec.partition(":")
    if source in ("hf", "hf-config"):
        from memtrace_trainer.models import hf

        try:
            hfspec = hf.resolve(name) if source == "hf" else hf.read_config(Path(name))
            if hf.default_task(hf.to_config(hfspec)) == "classification":
                return hf.DEFAULT_CLASSES
        except Exception:  # the build says what is wrong with the spec
            pass
    return DEFAULT_CLASSES


def _ignored(flag: str, value: Any, why: str) -> None:
    if value is not None:
        warn(f"{flag} {value} has no effect: {why}")


@dataclass(frozen=True)
class Tune:
    """The Hugging Face build options (`--task`, `--attn`) and the fine-tuning regime (`--dtype`,
    `--lora`, `--qlora`); `num_classes` is the classifier width of a classification task."""

    task: str | None = None
    attn: str | None = None
    num_classes: int | None = None
    regime: Regime = field(default_factory=Regime)


def build_workload(
    spec: str,
    batch_size: int,
    input_shape: str | None = None,
    seq_len: int | None = None,
    num_classes: int | None = None,
    device: torch.device = META,
    tune: Tune | None = None,
    row: bool = False,
) -> Workload:
    """The workload of a zoo spec: `torchvision:NAME`, `timm:NAME`, `hf:NAME`, `dlrm`,
    `gpumemnet:FILENAME` or `synthetic:{json config}`, built on `device` (meta unless a real
    run or the FakeTensor baseline asks for another). `row`: the spec is a `--gpumemnet-row`,
    whose batch the caller took; a `--model gpumemnet:` spec's other batch is said unused."""
    check_batch_size(batch_size)
    for classes in (num_classes, (tune or Tune()).num_classes):
        if classes is not None and classes < 1:
            raise UserError(f"--num-classes {classes}: expected a positive integer")
    shape = _parse_shape(input_shape)
    source, _, name = spec.partition(":")
    if source in ("torchvision", "timm"):
        _ignored("--seq-len", seq_len, f"{spec} is an image model (give --input-shape C,H,W)")
        if shape is not None and len(shape) != 3:
            raise UserError(f"--input-shape {input_shape}: {spec} is an image model: expected "
                            "C,H,W like 3,224,224")  # fmt: skip
    elif source in ("hf", "hf-config"):
        _ignored("--input-shape", input_shape, f"{spec} takes token ids (give --seq-len)")
    elif source == "dlrm":
        # Each sample is dense features and one id per embedding table: no sequence, no image.
        nothing = f"{spec} takes dense features and one id per embedding table per sample"
        _ignored("--input-shape", input_shape, nothing)
        _ignored("--seq-len", seq_len, f"{nothing}, no sequence")
        _ignored("--num-classes", num_classes, f"{spec} has its own output head")
    elif source in ("gpumemnet", "synthetic"):
        if not row and (own := filename_batch(spec)) not in (None, batch_size):
            warn(f"--model {spec}: the batch:{own} in its Filename is not used: "
                 f"{ROW_BATCH_UNUSED}")  # fmt: skip
        _ignored("--seq-len", seq_len, f"{spec}: the generator config sets its own sizes")
        _ignored("--num-classes", num_classes, f"{spec}: the generator config sets its own sizes")
    tune = tune or Tune()
    if source not in ("hf", "hf-config"):
        _ignored("--task", tune.task, f"{spec} is not a Hugging Face model")
        _ignored("--attn", tune.attn, f"{spec} is not a Hugging Face model")
    tune = Tune(tune.task, tune.attn, num_classes, tune.regime)
    try:
        workload = _build(spec, source, name, batch_size, shape, seq_len, num_classes, device, tune)
    except UserCodeError:
        raise
    except UserError as e:
        # A spec's own words (`unknown DLRM size 'bad'`, a config file's field) name no flag:
        # the spec is what the user gave, and `serve` names the request's field by it.
        if re.search(r"--[a-z]", str(e)) or repr(spec) in str(e):
            raise
        raise UserError(f"--model {spec!r}: {e}") from None
    if source not in ("hf", "hf-config") and tune.regime.active:
        workload = tuned(workload, tune.regime)
    if source in ("torchvision", "timm") and num_classes is None:
        workload.defaults["num_classes"] = {"value": DEFAULT_CLASSES, "why": "ImageNet's classes"}
    return workload


def _image(spec: str, model: nn.Module, batch: int, given: Any, shape: Any, classes: int,
           device: torch.device) -> Workload:  # fmt: skip
    w = _classification(spec, model, batch, shape, classes, "", device)
    if given is None:
        w.defaults["input_shape"] = {"value": list(shape), "why": "the model's default input size"}
    return w


def _torchvision_input(name: str, model: nn.Module) -> tuple[int, ...]:
    """The image size torchvision publishes for the model: the crop its default weights'
    transforms take (299 for Inception v3, 240 up to 600 for EfficientNet), as timm's
    pretrained_cfg gives its models'; 224 where it publishes none."""
    import torchvision

    # A model built for one size (a ViT's position table) takes that, whatever the default
    # weights were trained at: vit_h_14 without weights is built for 224, its weights for 518.
    size = getattr(model, "image_size", None)
    if is_integer(size):
        return (3, size, size)
    try:
        crop = getattr(torchvision.models.get_model_weights(name).DEFAULT.transforms(),
                       "crop_size", None)  # fmt: skip
    except (ValueError, AttributeError, TypeError):  # no published weights
        crop = None
    if isinstance(crop, list | tuple) and len(crop) in (1, 2) and all(map(is_integer, crop)):
        return (3, crop[0], crop[-1])
    return (3, 224, 224)


def _build(
    spec: str,
    source: str,
    name: str,
    batch_size: int,
    shape: tuple[int, ...] | None,
    seq_len: int | None,
    num_classes: int | None,
    device: torch.device,
    tune: Tune,
) -> Workload:
    # A Hugging Face model reads the count from `tune` (its default is the task's own).
    num_classes = DEFAULT_CLASSES if num_classes is None else num_classes
    if source == "torchvision":
        import torchvision

        if name not in torchvision.models.list_models():
            raise UserError(f"unknown torchvision model {name!r} in spec {spec!r}")
        with device:
            model = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
        full = shape or _torchvision_input(name, model)
        return _image(spec, model, batch_size, shape, full, num_classes, device)
    if source == "timm":
        import timm

        if not timm.is_model(name):
            raise UserError(f"unknown timm model {name!r} in spec {spec!r}")
        with device:
            model = timm.create_model(name, pretrained=False, num_classes=num_classes)
        full = shape or tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
        return _image(spec, model, batch_size, shape, full, num_classes, device)
    if source in ("hf", "hf-config"):
        return _hf(spec, source, name, batch_size, seq_len, device, tune)
    if source == "dlrm":
        return DLRM.workload(spec, DLRMConfig.from_spec(name), batch_size, device)
    if source in ("gpumemnet", "synthetic"):
        # The generator's words name its config's fields: `build_workload` names the spec.
        if source == "gpumemnet":
            config, _ = from_gpumemnet_filename(name)
        else:
            config = from_dict(json_object(name, "the config after `synthetic:`"))
        return _synthetic(spec, config, batch_size, shape, device)
    raise UserError(
        f"unknown model spec {spec!r}: expected torchvision:NAME, timm:NAME, hf:REPO_ID, "
        "hf-config:PATH, dlrm, "
        "gpumemnet:FILENAME or synthetic:{json}"
    )


def tuned(
    w: Workload, regime: Regime, task: str | None = None, attn: str | None = None
) -> Workload:
    """A zoo model in the regime: parameters in its dtype, float inputs cast to it, LoRA.
    `task` (peft's task type) and `attn` apply to a transformers model handed to the API."""
    from memtrace_trainer.models import finetune

    if regime.qlora and regime.lora is None:
        raise UserError("--qlora: give --lora R (the adapters the 4-bit base is tuned with)")
    # A transformers model (one built in Python and handed to the API) has peft's default
    # targets by its model_type, as an `hf:` spec has.
    model_type = getattr(getattr(w.model, "config", None), "model_type", None)
    if not isinstance(model_type, str):
        model_type = None
    if regime.lora is not None and regime.lora.targets is None and model_type is None:
        raise UserError(
            f"{regime.adapters_flag}: {w.spec} is not a Hugging Face model, so peft has no "
            "default targets for its adapters; "
            "give --lora-targets (lora_targets= in Python; module names, e.g. fc1,fc2)"
        )
    dtype = regime.param_dtype
    # Cast where a dtype was asked for and a floating parameter is of another (a bf16 model
    # asked for in fp32 too); without one, the model's own dtype stays (LoRA of a bf16 model).
    recast = regime.dtype is not None and any(
        p.is_floating_point() and p.dtype != dtype for p in w.model.parameters()
    )
    model = w.model.to(dtype) if recast else w.model
    if attn is not None:
        # Built with sdpa for flash_attention_2, as an `hf:` spec is (`hf.build`).
        if attn == "flash_attention_2" and getattr(model, "_supports_flash_attn", True) is False:
            raise UserError(f"--attn flash_attention_2: transformers does not support it for "
                            f"{type(model).__name__}; give --attn sdpa or eager")  # fmt: skip
        try:
            model.set_attn_implementation("sdpa" if attn == "flash_attention_2" else attn)
        except (ValueError, ImportError) as e:
            raise UserError(f"--attn {attn}: transformers refused it for "
                            f"{type(model).__name__} ({e})") from None  # fmt: skip
    model = finetune.apply(model, regime, task, model_type)
    make = w.make_batch
    # Float inputs follow the parameters, which kbit preparation casts back to fp32 under
    # --qlora: there --dtype leaves them as they are, as it leaves the rest (`_say_dtype_undone`).
    feed = torch.float32 if regime.qlora and regime.kbit_prepare else dtype
    if feed != torch.float32 or recast:
        make = lambda: _cast_floats(w.make_batch(), feed)  # noqa: E731
    out = Workload(w.spec, model, make, w.loss, w.batch_size, w.family,
                   {**w.defaults, **regime.defaults}, sizes=w.sizes)  # fmt: skip
    out.details = {**w.details, **finetune.summary(model), "fine_tuning": regime.to_json()}
    if attn is not None:
        out.details["attn"] = attn
    if task is not None:
        out.details["task"] = task
    if regime.qlora:
        out.details["pre_quantization_dtype"] = name_of(regime.compute_dtype)
    return out


def _cast_floats(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _cast_floats(v, dtype) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return rebuilt(value, [_cast_floats(v, dtype) for v in value])
    return value


def entry_takes(entry: str, name: str, what: str) -> None:
    """Refuse a search (`what`) over `name` of an entry function that takes no such parameter:
    every probe would be the same job, and the answer the search's own limit."""
    if not takes(entry, name):
        raise UserError(f"{what} --entry {entry}: the function takes no `{name}` parameter, so "
                        f"there is no {name} to search (give it a `{name}` parameter)")  # fmt: skip


def load_entry(
    entry: str, batch_size: int | None, device: torch.device = META, seq_len: int | None = None
) -> Workload:
    """A user's training step: `package.module:function` returning (model, (inputs, target),
    loss_fn). The function runs with `device` (meta unless a real run asks for another) as the
    default device and may take `batch_size` and `seq_len`; `batch_size` None: the function
    takes none, and its batch's size is the job's."""
    check_batch_size(batch_size, optional=True)  # before the user's code sees it
    require_batch_size(batch_size, entry)
    func = user_function(entry, "--entry")
    func_name = entry.partition(":")[2]
    params = inspect.signature(func).parameters
    kwargs: dict[str, Any] = {"batch_size": batch_size} if "batch_size" in params else {}
    if seq_len is not None:
        if "seq_len" in params:
            kwargs["seq_len"] = seq_len
        else:
            warn(f"--seq-len {seq_len} has no effect: {entry} takes no `seq_len` parameter")
    try:
        with device:
            result = func(**kwargs)
    except (Exception, SystemExit) as e:  # the user's code: say whose, what it raised, and where
        raise UserCodeError(f"--entry {entry!r}: {func_name}() raised", e) from e
    if not isinstance(result, tuple) or len(result) != 3:
        raise UserError(f"--entry {entry!r}: expected (model, (inputs, target), loss_fn)")
    model, batch, loss_fn = result
    if not isinstance(model, nn.Module) or not callable(loss_fn):
        raise UserError(f"--entry {entry!r}: expected an nn.Module and a callable loss_fn")
    if not isinstance(batch, tuple | list) or len(batch) != 2:
        raise UserError(f"--entry {entry!r}: the batch must be an (inputs, target) pair")
    if any(t.device != device for t in [*model.parameters(), *model.buffers()]):
        model = model.to(device)  # (fake tensors cannot be swapped for themselves)
    first = batch[0]
    size = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() else batch_size
    if size is None:
        raise UserError(f"--entry {entry!r}: its inputs are no tensor with a batch dimension to "
                        "read the batch size from: give --batch-size N")  # fmt: skip
    if "batch_size" not in params and batch_size is not None and size != batch_size:
        warn(f"--batch-size {batch_size} has no effect: {entry} takes no `batch_size` parameter, "
             f"and its batch has {size} samples")  # fmt: skip
    if device.type == "meta":
        example = _to_device(batch[0], device), _to_device(batch[1], device)
        make: Callable[[], Batch] = lambda: fresh_like(example)  # noqa: E731
    else:
        # Real devices: the batch waits on the host and each step copies it over, as a data
        # loader's batches arrive; uninitialised copies would give invalid class indices.
        host = _to_device(batch, torch.device("cpu"))
        make = lambda: _to_device(host, device, copy=True)  # noqa: E731
    # The length the function built its batch for: the one given, else its own default.
    seq = kwargs.get("seq_len", params["seq_len"].default if "seq_len" in params else None)
    sizes = {"seq_len": seq} if is_integer(seq) else {}
    return Workload(entry, model, make, loss_fn, int(size), "entry", sizes=sizes)


def _to_device(value: Any, device: torch.device, copy: bool = False) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, copy=copy)
    if isinstance(value, dict):
        return {k: _to_device(v, device, copy) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return rebuilt(value, [_to_device(v, device, copy) for v in value])
    return value
