"""The meta-kernel cache (symtrace/opcache.py): a trace made with it is the trace made without
it, event for event, over the regimes the tracer emulates; and what it gives back for one op
is what the kernel gives."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_finetune import workload
from test_symtrace import CNN, MLP, TRF

from memtrace_trainer.models.finetune import Lora
from memtrace_trainer.models.zoo import build_workload
from memtrace_trainer.profile import load_profile
from memtrace_trainer.symtrace import opcache
from memtrace_trainer.symtrace.step import StepConfig
from memtrace_trainer.symtrace.tracer import trace

aten = torch.ops.aten
CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "cnn-batchnorm-adam": (lambda: build_workload(CNN, 4), {"iterations": 3}),
    "mlp-dropout-sgd-plain": (lambda: build_workload(MLP, 4),
                              {"optimizer": "sgd", "cuda_emulation": False}),
    "transformer-amp-checkpointed": (lambda: build_workload(TRF, 4),
                                     {"amp": "bf16", "checkpointing": "full"}),
    "llama-lora-bf16-selective": (lambda: workload(dtype="bf16", lora=Lora(8)),
                                  {"optimizer": "adamw", "checkpointing": "selective"}),
    "llama-qlora": (lambda: workload(dtype="bf16", qlora=True, lora=Lora(8)),
                    {"optimizer": "adamw", "iterations": 1}),
    "llama-fsdp2-mp": (lambda: workload(dtype="bf16"),
                       {"optimizer": "adamw", "strategy": "fsdp2", "world_size": 2,
                        "fsdp_mp": "bf16:fp32"}),
    "llama-ddp": (lambda: workload(), {"optimizer": "adamw", "strategy": "ddp", "world_size": 2}),
    "llama-zero1": (lambda: workload(dtype="bf16"),
                    {"optimizer": "adamw", "strategy": "zero1", "world_size": 4}),
}  # fmt: skip


def _trace(make: Any, cfg: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rec, extra = trace(make(), StepConfig(**cfg), load_profile(None))
    return rec.events, extra


@pytest.mark.parametrize("case", CASES)
def test_a_trace_with_the_cache_is_the_trace_without_it(case: str) -> None:
    make, cfg = CASES[case]
    with opcache.disabled():
        reference = _trace(make, cfg)
    opcache.clear()
    cold = _trace(make, cfg)  # fills the cache, and hits it from the second step on
    hits = opcache.hits
    warm = _trace(make, cfg)  # every cacheable op a hit
    assert opcache.hits > hits, "the second trace made no cache hits: the test proves nothing"
    assert cold[0] == reference[0]
    assert warm[0] == reference[0]
    assert cold[1] == warm[1] == reference[1]


def _meta(*shape: int, **kw: Any) -> torch.Tensor:
    return torch.empty(*shape, device="meta", **kw)


def _same(a: Any, b: Any) -> None:
    if isinstance(a, tuple | list):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
        return
    if a is None:
        assert b is None
        return
    assert (a.shape, a.stride(), a.dtype, a.storage_offset()) == (
        b.shape, b.stride(), b.dtype, b.storage_offset())  # fmt: skip
    assert a.untyped_storage().nbytes() == b.untyped_storage().nbytes()


def check(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], expect: str) -> None:
    """Runs `func` twice through the cache: `expect` is "hit" (the second call built its result
    from the cache, equal to the kernel's) or "kernel" (it ran the kernel again)."""
    opcache.clear()
    first = opcache.call(func, args, kwargs)
    hits = opcache.hits
    second = opcache.call(func, args, kwargs)
    assert ("hit" if opcache.hits > hits else "kernel") == expect
    with opcache.disabled():
        _same(second, func(*args, **kwargs))
    _same(first, second)
    if expect != "hit":
        return
    # Outputs built from the cache never share a storage with an input.
    inputs = {t.untyped_storage()._cdata for t in args if isinstance(t, torch.Tensor)}
    for out in second if isinstance(second, tuple | list) else [second]:
        if isinstance(out, torch.Tensor) and not any(out is a for a in args):
            assert out.untyped_storage()._cdata not in inputs


CHANNELS_LAST = _meta(2, 3, 4, 5).to(memory_format=torch.channels_last)
W = _meta(3)


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "expect"),
    [
        (aten.add.Tensor, (_meta(4, 5), _meta(5)), {}, "hit"),
        (aten.add.Tensor, (_meta(4, 5), 1.5), {}, "hit"),
        (aten.add.Tensor, (_meta(4, 5, dtype=torch.int64), 1.5), {}, "hit"),  # promoted dtype
        (aten.relu.default, (CHANNELS_LAST,), {}, "hit"),  # strides kept
        (aten.native_batch_norm.default, (CHANNELS_LAST, W, W, W, W, True, 0.1, 1e-5), {},
         "hit"),  # a tuple of three fresh outputs
        (aten.view.default, (_meta(4, 5), [20]), {}, "kernel"),  # a view shares the storage
        (aten.add.Tensor, (_meta(4, 5), torch.ones(())), {}, "kernel"),  # a host value
        (aten.add_.Tensor, (_meta(4, 5), _meta(5)), {}, "hit"),  # in place: the input back
        (aten.resize_.default, (_meta(4), [40]), {}, "kernel"),  # the first run grew it
        (aten.empty.memory_format, ([3, 7],), {"dtype": torch.float16, "device": "meta"}, "hit"),
    ],
)  # fmt: skip
def test_one_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], expect: str) -> None:
    check(func, args, kwargs, expect)


def test_an_in_place_hit_returns_the_input_itself() -> None:
    x = _meta(4, 5)
    opcache.clear()
    opcache.call(aten.mul_.Tensor, (x, _meta(5)), {})
    assert opcache.call(aten.mul_.Tensor, (x, _meta(5)), {}) is x


def test_the_default_dtype_is_part_of_the_key() -> None:
    opcache.clear()
    args = ([2, 3],)
    kwargs = {"device": "meta"}
    assert opcache.call(aten.empty.memory_format, args, kwargs).dtype == torch.float32
    was = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert opcache.call(aten.empty.memory_format, args, kwargs).dtype == torch.float64
    finally:
        torch.set_default_dtype(was)


def test_data_dependent_and_view_ops_are_never_cached() -> None:
    assert not opcache.cacheable(aten.nonzero.default)
    assert not opcache.cacheable(aten.transpose.int)
    assert opcache.cacheable(aten.mm.default)
