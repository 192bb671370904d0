"""The FakeTensor baseline, run the way the GPUMemNet study ran it.

Forward and backward of one step under `FakeTensorMode` (shapes, dtypes, no storage; on the
CPU, since fake CUDA tensors need a GPU), with a dispatch mode summing the bytes of the storages
alive after every op. No optimizer step, no allocator rounding, no CUDA context: this is the
published baseline, kept as it was so its errors can be compared, not a better estimator.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from memtrace_trainer.errors import UserError, check_batch_size, require_batch_size
from memtrace_trainer.workload import Workload, call_model


@dataclass
class FakeResult:
    """Live storage bytes: the peak over forward and backward, and after each of them; the
    defaults chosen for the user (`seq_len`, `input_shape`, ...) that shaped them."""

    peak_bytes: int
    after_forward_bytes: int
    after_backward_bytes: int
    seconds: float
    defaults: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class LiveStorageBytes(TorchDispatchMode):
    """Bytes of the storages alive now, and their peak. A storage counts once however many
    views share it, and stops counting when its last reference (a tensor or an autograd saved
    value) dies."""

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live: dict[int, int] = {}

    def add(self, value: Any) -> None:
        if not isinstance(value, torch.Tensor):
            return
        storage = value.untyped_storage()
        key = storage._cdata
        size = storage.nbytes()
        if key in self._live or size == 0:
            return
        self._live[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            self.add(value)
        return out


def _to_fake(mode: Any, model: torch.nn.Module, batch: Any) -> Any:
    """Moves a meta model and batch onto the fake CPU device, in place for the model. Tied
    weights stay tied: one fake tensor per meta tensor."""
    converter = mode.fake_tensor_converter
    cpu = torch.device("cpu")
    memo: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor, param: bool = False) -> torch.Tensor:
        if id(t) not in memo:
            f = converter.from_meta_and_device(mode, t, cpu)
            memo[id(t)] = torch.nn.Parameter(f, t.requires_grad) if param else f
        return memo[id(t)]

    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                module._parameters[name] = fake(p, param=True)  # type: ignore[assignment]
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = fake(b)
    return tree_map(lambda v: fake(v) if isinstance(v, torch.Tensor) else v, batch)


def measure(build: Callable[[torch.device], Workload], what: str) -> FakeResult:
    """One forward and backward of the workload on fake CPU tensors. The model is built on
    meta first and then faked: building under FakeTensorMode would fail on constructors that
    read values (timm computes drop-path rates with `.tolist()`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    started = time.perf_counter()
    workload = build(torch.device("meta"))
    meta_batch = workload.make_batch()
    try:
        mode = FakeTensorMode()
        model = workload.model
        model.train()
        inputs, target = _to_fake(mode, model, meta_batch)
        del meta_batch
        with mode:
            tracker = LiveStorageBytes()
            for t in [*model.parameters(), *model.buffers(), *tree_flatten((inputs, target))[0]]:
                tracker.add(t)
            with tracker:
                out = call_model(model, inputs)
                loss = workload.loss(out, target)
                after_forward = tracker.current
                loss.backward()
                after_backward = tracker.current
            del inputs, target, out, loss
    except UserError:
        raise
    except Exception as e:  # some models cannot run on fake tensors; the baseline says so
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise UserError(f"FakeTensor could not run {what}: {type(e).__name__}: {first}") from None
    return FakeResult(tracker.peak, after_forward, after_backward, time.perf_counter() - started,
                      dict(workload.defaults))  # fmt: skip


SOURCES = ("model", "entry", "gpumemnet_row")


def check_config(config: dict[str, Any]) -> int | None:
    """A job's batch size, its other sizes checked before anything is built: one model source,
    a positive batch size (a GPUMemNet row gives its own unless `batch_size` is set; 0 is not
    "not set"; None: an entry function of its own batch, `require_batch_size`), a row's
    filename and an input shape's syntax."""
    from memtrace_trainer.models.gpumemnet import from_gpumemnet_filename, row_batch

    # The --input-shape parser of every zoo command, so a line's shape reads as the flag's.
    from memtrace_trainer.models.zoo import _parse_shape

    sources = [k for k in SOURCES if config.get(k)]
    if len(sources) != 1:
        raise UserError("exactly one of --model, --entry or --gpumemnet-row is required")
    batch = config.get("batch_size")
    check_batch_size(batch, optional=True)
    if sources[0] == "gpumemnet_row":
        _, own = from_gpumemnet_filename(config["gpumemnet_row"])
        batch = row_batch(config["gpumemnet_row"], own, batch)
    else:
        require_batch_size(batch, config.get("entry"), config.get("model"))
    _parse_shape(config.get("input_shape"))
    return batch


def workload_builder(config: dict[str, Any]) -> tuple[Callable[[torch.device], Workload], str]:
    """The builder of a config with one of `model`, `entry` or `gpumemnet_row`, and its name.
    A GPUMemNet row gives its own batch size unless `batch_size` is set."""
    from memtrace_trainer.cli.common import entry_workload
    from memtrace_trainer.models.zoo import build_workload

    batch = check_config(config)
    shape, seq, classes = (
        config.get("input_shape"),
        config.get("seq_len"),
        config.get("num_classes"),
    )
    if config.get("entry"):
        entry = config["entry"]
        # Always built on meta (`measure` fakes it after): the sizes as every --entry takes them,
        # --seq-len passed on, the zoo-only ones warned about.
        return (lambda _device: entry_workload(entry, batch, seq, shape, classes)), entry
    assert batch is not None  # a model's or a row's: `check_config` refused none
    row = config.get("gpumemnet_row")
    spec = f"gpumemnet:{row}" if row else config["model"]

    def build(device: torch.device) -> Workload:
        workload = build_workload(spec, batch, shape, seq, classes, device, row=bool(row))
        if row and config.get("batch_size") is None:
            why = "the GPUMemNet row's Filename"
            workload.defaults["batch_size"] = {"value": batch, "why": why}
        return workload

    return build, spec
