"""The Python API where a caller's objects are not the plain ones: step builders that are objects,
methods, partials or closures with empty cells; batches in dataclasses and tokenizer mappings;
masks of a caller's own module; warnings called from a library; and an estimate pickled into an
environment without its profile's file."""

from __future__ import annotations

import copy
import dataclasses
import functools
import pickle
import warnings
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from conftest import REPO, cli
from test_python_api_inputs import _estimate_said
from torch import nn

import memtrace
from memtrace import EstimateError, MemtraceWarning

X = torch.randn(4, 16)
MLP = 'synthetic:{"family":"mlp","input_size":256,"output_size":10,"depth":3}'


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def _use(module: nn.Module, device: torch.device) -> Any:
    x = torch.randn(8, 64, device=device)
    return lambda: module(x).sum().backward()


# --- step builders the watch looks into -----------------------------------------------------------


def test_a_builder_with_an_empty_cell_is_estimated() -> None:
    """`inspect.getclosurevars` raised "ValueError: Cell is empty" and the estimate failed: the
    watch, which only warns, failed the job."""

    def builder() -> Any:
        def make(device: torch.device) -> Any:
            if device is None:
                print(never)  # a nonlocal never assigned: an empty cell
            return _use(nn.Linear(64, 64, device=device), device)

        return make
        never = 1  # after the return: its cell stays empty

    est, _ = _estimate_said(builder(), steps=1)
    assert est.allocated_mib > 0


def test_a_watch_that_cannot_look_never_fails_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    from memtrace import builders

    def fails(fn: Any) -> Any:
        raise RuntimeError("cannot look")

    monkeypatch.setattr(builders, "reachable", fails)
    est, _ = _estimate_said(lambda device: _use(nn.Linear(64, 64, device=device), device), steps=1)
    assert est.allocated_mib > 0


class _Builder:
    def __init__(self) -> None:
        self.model = nn.Linear(64, 64)

    def __call__(self, device: torch.device) -> Any:
        return _use(self.model.to(device), device)

    def make(self, device: torch.device) -> Any:
        return _use(self.model.to(device), device)


def _moves(module: nn.Module, device: torch.device) -> Any:
    return _use(module.to(device), device)


@pytest.mark.parametrize(
    ("how", "name"),
    [("object", "`self.model`"), ("method", "`self.model`"), ("partial", "partial argument 0")],
)
def test_a_builder_object_method_or_partial_is_watched(how: str, name: str) -> None:
    """A callable object or a bound method holding `self.model` was never looked into; a
    partial's argument was named `<argument 0>`."""
    b = _Builder()
    net = b.model if how != "partial" else nn.Linear(64, 64)
    make = {"object": b, "method": b.make, "partial": functools.partial(_moves, net)}[how]
    _, said = _estimate_said(make, steps=1)
    assert net.weight.is_meta
    moved = [s for s in said if s.startswith(f"the step builder moved {name} (Linear)")]
    assert moved, said
    if how == "partial":
        assert "copy.deepcopy(module).to(device)" in moved[0] and "<argument" not in moved[0]


# --- batches as the caller holds them -------------------------------------------------------------


@dataclasses.dataclass
class _Batch:
    x: torch.Tensor
    note: str = "a batch"


class _TakesBatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, b: _Batch) -> torch.Tensor:
        return self.lin(b.x)


def test_a_dataclass_batch_and_target_are_traced() -> None:
    """The caller's CPU tensors stayed in the dataclass and met the copy's meta parameters:
    "the model failed on the tracer's device: ... Tensor on device meta is not on the expected
    device cpu"."""
    y = torch.randn(4, 4)
    got = memtrace.estimate(_TakesBatch(), _Batch(X), target=_Batch(y),
                            loss_fn=lambda o, t: nn.functional.mse_loss(o, t.x))  # fmt: skip
    plain = memtrace.estimate(_TakesBatch().lin, X, target=y)
    assert got.breakdown == plain.breakdown
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemtraceWarning)
        assert memtrace.max_batch(_TakesBatch(), _Batch(X), target=_Batch(y), limit=8,
                                  loss_fn=lambda o, t: nn.functional.mse_loss(o, t.x)) == 8  # fmt: skip


class _Masked(nn.Module):
    """A caller's own module that reads its mask: it keeps it."""

    seen: ClassVar[list[bool]] = []

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 16)

    def forward(self, input_ids: torch.Tensor, attention_mask: Any = None) -> torch.Tensor:
        _Masked.seen.append(attention_mask is not None)
        return self.emb(input_ids).mean()


def test_a_callers_own_module_keeps_its_attention_mask() -> None:
    ids = torch.randint(0, 100, (2, 8))
    _Masked.seen.clear()
    _, said = _estimate_said(_Masked(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    assert _Masked.seen and all(_Masked.seen)
    assert not [s for s in said if "attention_mask" in s], said


def test_a_tokenizers_batch_encoding_is_taken_as_a_dict() -> None:
    """A `BatchEncoding` (a UserDict, not a dict) was refused as having no tensor."""
    transformers = pytest.importorskip("transformers")
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=200)
    )
    ids = torch.randint(0, 200, (2, 16))
    plain, _ = _estimate_said(model, {"input_ids": ids, "labels": ids})
    enc = transformers.BatchEncoding({"input_ids": ids, "labels": ids,
                                      "attention_mask": torch.ones_like(ids)})  # fmt: skip
    got, said = _estimate_said(model, enc)
    assert got.breakdown == plain.breakdown
    assert not [s for s in said if "attention_mask" in s], said
    _Masked.seen.clear()
    memtrace.estimate(_Masked(), transformers.BatchEncoding({"input_ids": ids % 100,
                                                             "attention_mask": ids > 0}))  # fmt: skip
    assert _Masked.seen and all(_Masked.seen)  # called as model(**inputs)


# --- where a warning points, and what is said once ------------------------------------------------


def test_a_warning_called_from_a_library_points_at_the_call(tmp_path: Path) -> None:
    """With no frame of the caller's own code, the warning pointed into memtrace's api.py."""
    import threading

    lib = tmp_path / "site-packages" / "somelib.py"
    code = compile("def call():\n    memtrace.estimate(model, X.double())\n", str(lib), "exec")
    space = {"memtrace": memtrace, "model": _mlp(), "X": X}
    exec(code, space)
    # A thread of its own: no frame of this test's (the caller's own code) above the library's.
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        thread = threading.Thread(target=space["call"])
        thread.start()
        thread.join()
    said = [w for w in seen if issubclass(w.category, MemtraceWarning)]
    assert said and all(w.filename == str(lib) for w in said), [w.filename for w in said]


def test_library_dirs_are_computed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import sysconfig

    from memtrace_trainer import errors

    calls = []
    real = sysconfig.get_paths
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: calls.append(1) or real(*a, **k))
    errors._library_dirs.cache_clear()
    errors.is_user_file(__file__)
    first = len(calls)
    for _ in range(3):
        errors.is_user_file(__file__)
    assert first and len(calls) == first


def test_the_cli_says_the_loss_not_loss_fn() -> None:
    from memtrace_trainer.errors import UserError
    from memtrace_trainer.symtrace.step import check_loss

    with pytest.raises(UserError, match=r"^the loss returned None: expected a scalar"):
        check_loss(None)


# --- the first line -------------------------------------------------------------------------------


def test_the_clis_first_line_is_memests_headline_with_a_capacity() -> None:
    """`estimate --capacity` printed the capacity twice, and its first line was no longer the
    headline memsim's report and memest print."""
    import json

    args = ("estimate", "--model", MLP, "--batch-size", "2", "--capacity", "1000MiB")
    text = cli(*args, check=False).stdout.splitlines()  # 1: DOES NOT FIT
    raw = json.loads(cli(*args, "--json", check=False).stdout)
    assert text[0] == f"{raw['text']['headline']}: {raw['text']['verdict']}"
    assert sum("1000.0 MiB" in line for line in text) == 1, text
    est = memtrace.estimate(_mlp(), X, capacity="1000MiB")
    assert str(est) == f"{est.raw['text']['headline']}: {est.raw['text']['verdict']}" + (
        " (capacity 1000.0 MiB)"
    )


# --- pickled ----------------------------------------------------------------------------------------


def test_a_pickled_estimate_asks_again_without_its_profiles_file(tmp_path: Path) -> None:
    """The profile was kept as an absolute path: loaded where that file is not, `fits`, and
    `report` failed."""
    custom = tmp_path / "mygpu.toml"
    custom.write_text((REPO / "profiles" / "h200.toml").read_text())
    est, _ = _estimate_said(_mlp(), X, gpu=custom)  # its unmeasured constants said
    blob = pickle.dumps(est)
    custom.rename(tmp_path / "gone.toml")
    loaded = pickle.loads(blob)
    assert Path(loaded.profile).is_file() and Path(loaded.profile).name == "mygpu.toml"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemtraceWarning)
        assert loaded.fits(point=True) is True
        assert loaded.fits(capacity="1MiB") is False
    assert loaded.report(tmp_path / "r.html").is_file()
    assert copy.deepcopy(loaded).profile == loaded.profile


def test_a_trace_is_pickled_a_block_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole trace was read, then compressed: twice in memory."""
    from memtrace import result

    est = memtrace.estimate(_mlp(), X)
    want = est.trace_path.read_bytes()
    monkeypatch.setattr(result, "_BLOCK", 1000)  # many blocks
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("read whole"))
    loaded = pickle.loads(pickle.dumps(est))
    monkeypatch.undo()
    assert loaded.trace_path.read_bytes() == want
    with pytest.raises(EstimateError, match="this estimate was closed"):
        est.close()
        pickle.loads(pickle.dumps(est)).fits("h200")
