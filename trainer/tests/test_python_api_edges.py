"""The Python API on inputs of a shape or type found in real training code beyond the plain
tensor batch (NamedTuples, masks beside the batch, a tensor passed twice, NumPy scalars) and on
the caller's torch settings: each estimated as the real step runs it, or refused naming the
argument."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from conftest import REPO
from torch import nn

import memtrace
from memtrace import EstimateError, MemtraceWarning


class Batch(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


class _TakesBatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(64, 10)

    def forward(self, b: Batch) -> torch.Tensor:
        return self.l(b.x) + b.y


def test_a_namedtuple_batch_is_rebuilt_by_its_fields() -> None:
    from memtrace_trainer.models import zoo
    from memtrace_trainer.workload import fresh_like

    b = Batch(torch.randn(8, 64), torch.randn(8, 10))
    est = memtrace.estimate(_TakesBatch(), (b,))
    assert est.device_mib > 0
    est = memtrace.estimate(nn.Linear(64, 10), b.x, target=Batch(b.y, b.y),
                            loss_fn=lambda o, t: ((o - t.x) ** 2).mean())  # fmt: skip
    assert est.device_mib > 0
    # The CLI's entry functions' batches go through the same copies.
    for moved in (zoo._to_device(b, torch.device("meta")), fresh_like(b),
                  zoo._cast_floats(b, torch.bfloat16)):  # fmt: skip
        assert type(moved) is Batch and moved.x.shape == (8, 64)


def test_the_callers_anomaly_detection_is_set_aside() -> None:
    """Under `torch.autograd.set_detect_anomaly(True)` every estimate failed ("Tensor.item()
    cannot be called on meta tensors", blamed on the model)."""
    model, x = nn.Linear(64, 10), torch.randn(8, 64)
    plain = memtrace.estimate(model, x)
    with torch.autograd.set_detect_anomaly(True):
        assert memtrace.estimate(model, x).device_mib == plain.device_mib
        with pytest.warns(MemtraceWarning, match="limit=4 fits"):
            assert memtrace.max_batch(model, x, limit=4) == 4
        assert torch.is_anomaly_enabled()
    assert not torch.is_anomaly_enabled()


class _TurnsAnomalyOn(nn.Linear):
    """A forward during which another thread turns anomaly detection on, as a training loop
    beside a notebook's estimate would."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import threading

        other = threading.Thread(target=torch.autograd.set_detect_anomaly, args=(True,))
        other.start()
        other.join()
        return super().forward(x)


def test_anomaly_detection_turned_on_meanwhile_stays_and_is_said() -> None:
    """The flag is process-wide: another thread's `set_detect_anomaly(True)` during an estimate
    was undone when the estimate ended, and the estimate failed blamed on the model alone."""
    try:
        with pytest.raises(EstimateError, match="anomaly detection was turned on while this "
                           "estimate was traced, by another thread") as e:  # fmt: skip
            memtrace.estimate(_TurnsAnomalyOn(64, 10), torch.randn(8, 64))
        assert "the model failed at batch 8" in str(e.value)
        assert torch.is_anomaly_enabled()
    finally:
        torch.autograd.set_detect_anomaly(False)


class _Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x, src_mask=mask)).mean(1)


def _messages(seen: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in seen if issubclass(w.category, MemtraceWarning)]


def test_a_tensor_beside_the_batch_keeps_its_size() -> None:
    """A causal mask (S, S) beside x (B, S, E) was refused by `estimate` ("every tensor's first
    dimension is the batch"), and `max_batch` resized it with the batch."""
    mask = nn.Transformer.generate_square_subsequent_mask(16)
    est = memtrace.estimate(_Masked(), (torch.randn(8, 16, 64), mask))
    assert est.device_mib > 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        found = memtrace.max_batch(_Masked(), (torch.randn(8, 16, 64), mask), limit=32)
    assert found == 32
    said = _messages(seen)
    assert any("keeps the others at their size: example_inputs[1] (16, 16)" in m for m in said)
    # A batch of the mask's size: the mask is taken as batched, which is said.
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(EstimateError):
            memtrace.max_batch(_Masked(), (torch.randn(16, 16, 64), mask), limit=32)
    assert any("example_inputs[1] (16, 16) may not be" in m for m in _messages(seen))


def test_a_tensor_passed_twice_is_one_tensor() -> None:
    """An autoencoder's target=x was copied twice to the tracer's device and counted twice."""
    m = nn.Sequential(nn.Linear(4096, 16), nn.ReLU(), nn.Linear(16, 4096))
    x = torch.randn(2048, 4096)  # 32 MiB
    once, twice = memtrace.estimate(m, x, target=x), memtrace.estimate(m, x, target=x.clone())
    assert twice.allocated_mib - once.allocated_mib >= 32


def test_an_input_that_requires_grad_gets_its_gradient() -> None:
    """`requires_grad=True` on an input was dropped by the copy: a real step allocates x.grad."""
    m, x = nn.Linear(4096, 16), torch.randn(2048, 4096)  # 32 MiB
    plain = memtrace.estimate(m, x)
    grad = memtrace.estimate(m, x.clone().requires_grad_())
    assert grad.allocated_mib - plain.allocated_mib >= 32


@pytest.mark.parametrize("bad", [99, 10, -5])
def test_class_indices_beyond_the_models_classes_are_refused(bad: int) -> None:
    """On a GPU, cross-entropy against a class the output lacks is a device-side assert; the
    tracer's device has no values to check, so the estimate passed."""
    m, x = nn.Linear(64, 10), torch.randn(8, 64)
    target = torch.arange(8)
    target[3] = bad
    expect = rf"^target: class indices from {min(bad, 0)} to {max(bad, 7)}, where the model's "
    with pytest.raises(EstimateError, match=expect + r"output has 10 classes"):
        memtrace.estimate(m, x, target=target)
    target[3] = -100  # cross-entropy's ignore_index: a padded position
    assert memtrace.estimate(m, x, target=target).device_mib > 0


class _TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.aux, self.cls = nn.Linear(64, 32), nn.Linear(32, 2), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.aux(h), self.cls(h)


def test_the_default_loss_names_the_output_it_paired() -> None:
    """With a tuple (aux (N, 2), logits (N, 10)) the default loss pairs the target with the
    first: "the model's output has 2 classes" left the caller looking at the logits."""
    x = torch.randn(8, 64)
    with pytest.raises(EstimateError, match=r"^target: class indices from 2 to 9, where the "
                       r"model's output\[0\], the first floating tensor of its output, has 2 "
                       r"classes .*: pass loss_fn= to pair them yourself$"):  # fmt: skip
        memtrace.estimate(_TwoHeads(), x, target=torch.arange(8) + 2)
    with pytest.raises(EstimateError, match=r"cannot pair the model's output\[0\] \(8, 2\), "
                       r"the first floating tensor of its output, with the integer target"):  # fmt: skip
        memtrace.estimate(_TwoHeads(), x, target=torch.arange(3))
    with pytest.raises(EstimateError, match=r"of the output's shape \(8, 2\) \(output\[0\], the "
                       r"first floating tensor of its output\), got \(3,\): pass loss_fn="):  # fmt: skip
        memtrace.estimate(_TwoHeads(), x, target=torch.randn(3))


def test_a_profile_edited_at_the_same_path_is_read_again(tmp_path: Path) -> None:
    """Profiles were cached by path: an edited TOML gave the tracer the old constants beside
    memsim's fresh reading of the file."""
    from memtrace_trainer.profile import load_profile

    src = (REPO / "profiles" / "a100-40gb.toml").read_text()
    path = tmp_path / "mine.toml"
    path.write_text(src)
    before = load_profile(str(path))
    assert "context_mib = 400.0" in src
    path.write_text(src.replace("context_mib = 400.0", "context_mib = 1900.0"))
    after = load_profile(str(path))
    assert after.context_bytes - before.context_bytes == 1500 * 2**20
    assert load_profile(str(path)) == after


def test_a_profile_by_name_edited_during_its_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile given by name was stamped after memsim's read: an edit landing between was
    taken for the version read, and its old constants kept."""
    import memtrace_trainer.profile as profile

    src = (REPO / "profiles" / "a100-40gb.toml").read_text()
    path = tmp_path / "mine.toml"
    path.write_text(src)
    monkeypatch.setenv("MEMTRACE_PROFILES", str(tmp_path))
    read, reads = profile._memsim_profile, []

    def edited_during(name: str, capacity: str | None) -> dict:
        data = read(name, capacity)
        if not reads:
            time.sleep(0.01)  # a coarse mtime still moves
            path.write_text(src.replace("context_mib = 400.0", "context_mib = 1900.0"))
        reads.append(name)
        return data

    monkeypatch.setattr(profile, "_memsim_profile", edited_during)
    assert profile.load_profile("mine").context_bytes == 400 * 2**20
    assert profile.load_profile("mine").context_bytes == 1900 * 2**20
    assert profile.load_profile("mine").context_bytes == 1900 * 2**20
    assert len(reads) == 2  # kept once stamped before its read


def test_numpy_and_tensor_integers_count_as_ints() -> None:
    """np.int64(2), np.True_ and a 0-dim integer tensor were refused ("expected ... an int"):
    what an array's arithmetic or a mask's `.any()` gives."""
    np = pytest.importorskip("numpy")
    m, x = nn.Linear(64, 10), torch.randn(8, 64)
    plain = memtrace.estimate(m, x, steps=2, point=True)
    for steps, point in ((np.int64(2), np.True_), (torch.tensor(2), True)):
        est = memtrace.estimate(m, x, steps=steps, point=point)
        assert est.device_mib == plain.device_mib
        assert est.fits(point=np.False_) == plain.fits(point=False)
    with pytest.warns(MemtraceWarning, match="limit=4 fits"):
        assert memtrace.max_batch(m, x, limit=np.int32(4)) == 4
    # A bool is a yes/no, not a count, NumPy's or a tensor's too.
    for bad in (True, np.True_, torch.tensor(True), np.float64(2.0)):
        with pytest.raises(EstimateError, match=r"^steps=.*: expected a number of traced steps"):
            memtrace.estimate(m, x, steps=bad)
    with pytest.raises(EstimateError, match=r"^point=np.int64\(1\): expected True or False"):
        memtrace.estimate(m, x, point=np.int64(1))
    from memtrace import checks

    assert checks.lora(np.int64(8)) == 8 and checks.checkpointing(np.True_) == "full"
    # reduce_bucket_size, a count of elements, alike (it refused np.int64 while steps took it).
    for n in (np.int64(5), torch.tensor(5), 5.0):
        assert checks.elements("reduce_bucket_size", n) == 5
    for bad in (np.True_, "5e0", np.float64(0.5)):
        with pytest.raises(EstimateError, match=r"^reduce_bucket_size=.*: expected a whole number"):
            checks.elements("reduce_bucket_size", bad)


@pytest.mark.parametrize(
    ("kwargs", "expect"),
    [
        # Said as the caller wrote them: they were said as the text they became (amp='True').
        ({"amp": True}, r"^amp=True: expected one of bf16, fp16, torch.bfloat16, torch.float16"),
        ({"dtype": True}, r"^dtype=True: expected one of fp32, bf16, fp16, torch.float32"),
        ({"amp": torch.float32}, r"^amp=torch.float32: expected one of bf16, fp16"),
        ({"strategy": 3, "world_size": 2}, r"^strategy=3: expected one of fsdp2, ddp"),
        ({"optimizer": Path("adam")}, r"^optimizer=\w*Path\('adam'\): expected one of adam,"),
        ({"capacity": [1]}, r"^capacity=\[1\]: expected a size such as '40GiB'"),
    ],
)
def test_an_argument_of_another_type_is_said_as_written(kwargs: dict, expect: str) -> None:
    with pytest.raises(EstimateError, match=expect):
        memtrace.estimate(nn.Linear(64, 10), torch.randn(8, 64), **kwargs)


def test_a_size_or_a_torch_dtype_is_taken_wherever_a_size_or_dtype_is() -> None:
    """`replay(capacity=<int>)` said "expected a non-empty name"; `fits(capacity=[1])` failed
    inside memsim; torch.bfloat16 was refused where 'bf16' is taken."""
    m, x = nn.Linear(64, 10), torch.randn(8, 64)
    est = memtrace.estimate(m, x)
    assert memtrace.estimate(m, x, dtype=torch.bfloat16).allocated_mib == (
        memtrace.estimate(m, x, dtype="bf16").allocated_mib
    )
    assert memtrace.estimate(m, x, amp=torch.float16).allocated_mib == (
        memtrace.estimate(m, x, amp="fp16").allocated_mib
    )
    given = memtrace.replay(est.trace_path, capacity=2000 * 2**20)["verdict"]
    assert given == memtrace.replay(est.trace_path, capacity="2000MiB")["verdict"]
    for ask in (lambda: est.fits(capacity=[1]), lambda: memtrace.replay(est.trace_path,
                                                                        capacity=[1])):  # fmt: skip
        with pytest.raises(EstimateError, match=r"^capacity=\[1\]: expected a size"):
            ask()


def test_a_loss_cut_off_from_the_model_names_loss_fn() -> None:
    """A detached loss was blamed on the model ("the model failed ...: element 0 of tensors does
    not require grad")."""
    m, x = nn.Linear(64, 10), torch.randn(8, 64)
    for loss_fn in (lambda o, t: o.detach().sum(), lambda o, t: torch.tensor(1.0)):
        with pytest.raises(EstimateError, match=r"^loss_fn returned a tensor that does not "):
            memtrace.estimate(m, x, loss_fn=loss_fn)
        with pytest.raises(EstimateError, match=r"^loss_fn returned a tensor that does not "):
            memtrace.max_batch(m, x, loss_fn=loss_fn, limit=8)


class _NoGradForward(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return super().forward(x)


def test_an_output_cut_off_in_the_model_names_the_model() -> None:
    """A forward under `torch.no_grad()` with `loss_fn=F.mse_loss` was said as "loss_fn returned
    a tensor that does not require grad": loss_fn only passed on what the model cut off."""
    x, y = torch.randn(8, 64), torch.randn(8, 10)
    with pytest.raises(EstimateError, match=r"^the model's output does not require grad: "
                       r"its forward cut it off .*torch\.no_grad\(\)"):  # fmt: skip
        memtrace.estimate(_NoGradForward(64, 10), x, target=y, loss_fn=nn.functional.mse_loss)


def test_the_tensor_that_gives_the_batch_is_never_unsure() -> None:
    from memtrace.batches import searched
    from memtrace_trainer import notes

    said: list[str] = []
    x, mask = torch.randn(16, 16, 64), torch.zeros(16, 16)
    with notes.captured(said.append):
        searched((torch.tensor(0.5), x), None, 16)
        assert said == []
        searched((torch.tensor(0.5), x, mask), None, 16)
    assert len(said) == 1 and "example_inputs[2] (16, 16) may not be" in said[0]


@pytest.mark.parametrize(
    ("inputs", "target", "base"),
    [
        # Batch 1: a size-1 dimension is in nearly every tensor.
        (torch.randn(1, 1, 28, 28), torch.randn(1, 1, 28, 28), 1),
        # A segmentation target beside its images, at a batch of the image's side.
        (torch.randn(32, 3, 32, 32), torch.randint(0, 5, (32, 32, 32)), 32),
        (torch.randn(32, 3, 32, 32), torch.zeros(32, 1, 32, 32), 32),
        # A sequence model at a batch of the sequence's length.
        (torch.randint(0, 50, (12, 12)), torch.randint(0, 50, (12, 12)), 12),
        ((torch.randn(16, 16, 64), torch.randn(16, 16, 64)), None, 16),
    ],
)
def test_a_tensor_laid_out_as_the_batch_is_not_unsure(inputs: Any, target: Any, base: int) -> None:
    """These ordinary jobs were each warned that a tensor "may not be" batched: any other
    dimension of the batch's size was taken for a sign of a tensor beside the batch."""
    from memtrace.batches import searched
    from memtrace_trainer import notes

    said: list[str] = []
    with notes.captured(said.append):
        searched(inputs, target, base)
    assert not [m for m in said if "may not be" in m]


def test_numpy_bools_at_their_defaults_are_not_given() -> None:
    """`qlora=np.False_` with a step builder was warned "has no effect": the keywords were
    compared with their defaults by identity."""
    import numpy as np
    from step_examples import default_adamw

    from memtrace import checks

    at_defaults = {"qlora": np.False_, "qlora_double_quant": np.False_, "kbit_prepare": np.True_}
    assert checks.given({**checks.TUNING, **at_defaults}) == []
    given = checks.given({**checks.TUNING, "qlora": np.True_, "lora": np.int64(8)})
    assert given == ["lora", "qlora"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        memtrace.estimate(default_adamw, steps=1, **at_defaults)
    assert not [m for m in _messages(seen) if "has no effect" in m]


def test_a_count_is_a_0_dim_tensor_with_a_value() -> None:
    """`steps=torch.tensor(2, device="meta")` raised PyTorch's own RuntimeError (`.item()` on
    meta), and `torch.tensor([4])` or `[[4]]` were taken as counts, as `operator.index` takes any
    one-element tensor."""
    m, x = nn.Linear(64, 10), torch.randn(8, 64)
    for bad in (torch.tensor(2, device="meta"), torch.tensor([2]), torch.tensor([[2]])):
        with pytest.raises(EstimateError, match=r"^steps=.*: expected a number of traced steps"):
            memtrace.estimate(m, x, steps=bad)
    from memtrace import checks

    assert checks.integer(torch.tensor(4)) == 4
