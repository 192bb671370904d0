"""The Python API on inputs of a shape or type found in real training code beyond the plain
tensor batch (NamedTuples, masks beside the batch, a tensor passed twice, NumPy scalars) and on
the caller's torch settings: each estimated as the real step runs it, or refused naming the
argument."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from torch import nn

import memtrace
from memtrace import MemtraceWarning


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
