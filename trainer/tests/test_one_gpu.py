"""The one GPU a traced program sees: every device it names is read by PyTorch's own rule, device
0 (however written) is the tracer's device, and another is refused as a one-GPU machine refuses
it, by every call that takes a device, the same words on the CLI, the Python API and serve."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import memtrace
from memtrace_trainer.errors import UserError
from memtrace_trainer.profile import DEFAULT_PROFILE, load_profile
from memtrace_trainer.symtrace.tracer import trace_step

HERE = Path(__file__).name


def builder(before: Callable[[], Any]) -> Callable[[torch.device], Callable[[], Any]]:
    """A step builder that calls `before()` first, then trains a small model on `device`."""

    def make(device: torch.device) -> Callable[[], Any]:
        before()
        m = nn.Linear(32, 32).to(device)
        return lambda: m(torch.randn(8, 32, device=device)).sum().backward()

    return make


def trace(make: Callable[[torch.device], Any]) -> int:
    rec, _ = trace_step(make, 1, load_profile(DEFAULT_PROFILE))
    return int(rec.peak_bytes)


def _context(device: Any) -> None:
    with torch.cuda.device(device):
        pass


# Device 0, or PyTorch's no-op: set_device(device=0) was a TypeError (the fake took another
# name), set_device(-1) was refused, `device=0` and `torch.cuda.device(0)` asked for a driver.
DEVICE_0 = {
    "set_device(device=0)": lambda: torch.cuda.set_device(device=0),
    "set_device(-1)": lambda: torch.cuda.set_device(-1),
    "set_device('cuda:0')": lambda: torch.cuda.set_device("cuda:0"),
    "accelerator.set_device_index(-1)": lambda: torch.accelerator.set_device_index(-1),
    "accelerator.set_device_index(0)": lambda: torch.accelerator.set_device_index(0),
    "cuda.device(0)": lambda: _context(0),
    "cuda.device(-1)": lambda: _context(-1),
    "randn(device=0)": lambda: torch.randn(4, device=0),
    "to(device=0)": lambda: torch.randn(4).to(device=0),
    # NumPy integers are device indices to PyTorch too; they reached the driver.
    "to(np.int64(0))": lambda: torch.randn(4).to(np.int64(0)),
    "to(device=np.int32(0))": lambda: torch.randn(4).to(device=np.int32(0)),
    "randn(device=np.int64(0))": lambda: torch.randn(4, device=np.int64(0)),
    "get_device_properties('cuda')": lambda: torch.cuda.get_device_properties("cuda"),
    "mem_get_info(0)": lambda: torch.cuda.mem_get_info(0),
    "memory_allocated(device=0)": lambda: torch.cuda.memory_allocated(device=0),
    "Stream(device=0)": lambda: torch.cuda.Stream(device=0),
    # A tensor's own device (the tracer's, meta) names the one GPU, as cuda:0 does on a GPU.
    "memory_allocated(x.device)": lambda: torch.cuda.memory_allocated(torch.ones(1).cuda().device),
    "set_device(x.device)": lambda: torch.cuda.set_device(torch.ones(1).cuda().device),
}


@pytest.mark.parametrize("call", DEVICE_0.values(), ids=DEVICE_0.keys())
def test_device_0_in_pytorchs_own_forms_is_the_traced_gpu(call: Callable[[], Any]) -> None:
    assert trace(builder(call)) > 0


# Device 1 where device_count() is 1: set_device refused it, set_device_index took it in
# silence, and the queries answered as if it existed.
DEVICE_1 = {
    "set_device(1)": lambda: torch.cuda.set_device(1),
    "accelerator.set_device_index(1)": lambda: torch.accelerator.set_device_index(1),
    "get_device_properties(1)": lambda: torch.cuda.get_device_properties(1),
    "get_device_name('cuda:1')": lambda: torch.cuda.get_device_name("cuda:1"),
    "get_device_capability(1)": lambda: torch.cuda.get_device_capability(1),
    "mem_get_info(1)": lambda: torch.cuda.mem_get_info(1),
    "memory_allocated(1)": lambda: torch.cuda.memory_allocated(1),
    "max_memory_allocated(cuda:1)": lambda: torch.cuda.max_memory_allocated(
        torch.device("cuda", 1)
    ),
    "reset_peak_memory_stats(1)": lambda: torch.cuda.reset_peak_memory_stats(1),
    "memory_stats(1)": lambda: torch.cuda.memory_stats(1),
    "memory_summary(1)": lambda: torch.cuda.memory_summary(1),
    "memory_reserved(1)": lambda: torch.cuda.memory_reserved(1),
    "synchronize(1)": lambda: torch.cuda.synchronize(1),
    "current_stream(1)": lambda: torch.cuda.current_stream(1),
    "Stream(device=1)": lambda: torch.cuda.Stream(device=1),
    "cuda.device(1)": lambda: _context(1),
    "randn(device=1)": lambda: torch.randn(4, device=1),
    "to(np.int64(1))": lambda: torch.randn(4).to(np.int64(1)),
    "randn(device=np.int64(1))": lambda: torch.randn(4, device=np.int64(1)),
}


@pytest.mark.parametrize("call", DEVICE_1.values(), ids=DEVICE_1.keys())
def test_every_call_that_takes_a_device_refuses_a_second_gpu(call: Callable[[], Any]) -> None:
    with pytest.raises(UserError) as refused:
        trace(builder(call))
    said = str(refused.value)
    assert said.startswith("--step builder.<locals>.make: your code uses cuda:1 (at "), said
    assert f"{HERE}:" in said and "invalid device ordinal" in said


STEP = """\
import torch
from torch import nn


def second_gpu(device):
    m = nn.Linear(64, 64).to("cuda:1")
    return lambda: m(torch.randn(4, 64, device="cuda:1")).sum().backward()
"""


def test_serve_and_the_api_say_the_refusal_of_the_users_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hint's `--world-size N` made serve answer `"field": "world_size"` for the user's code,
    and the API said it as "world_size N)": the code is named first, the hint names no flag."""
    from memtrace_trainer import serve_worker

    (tmp_path / "gpu_steps.py").write_text(STEP)
    monkeypatch.syspath_prepend(str(tmp_path))
    status, text = serve_worker.answer(["--step", "gpu_steps:second_gpu", "--steps", "1"])
    body = json.loads(text)
    assert (status, body["field"]) == (400, "step"), body
    assert body["error"].startswith("--step gpu_steps:second_gpu: your code uses cuda:1 (at ")
    assert "given a world size of N)" in body["error"], body

    def second_gpu(device: torch.device) -> Callable[[], Any]:
        return lambda: torch.randn(4, device="cuda:1").sum()

    with warnings.catch_warnings(), pytest.raises(memtrace.EstimateError) as refused:
        warnings.simplefilter("ignore")
        memtrace.estimate(second_gpu, steps=1)
    said = str(refused.value)
    assert "second_gpu: your code uses cuda:1 (at " in said, said
    assert "given a world size of N)" in said and "world_size" not in said, said
