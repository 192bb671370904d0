"""Threads the traced code starts (symtrace/threads.py): the fake device is per thread, so a
thread's CUDA allocation is not traced; it fails the trace instead of leaving the memory out."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from conftest import cli

# Each allocates 1 GiB on "cuda" in a thread of its own, then trains a small model.
CODE = """
import threading, time, torch
from torch import nn

def _in_a_thread(held):
    t = threading.Thread(target=lambda: held.append(torch.empty(256, 1024, 1024, device="cuda")),
                         name="loader")
    t.start()
    t.join()

def threaded(device):
    m = nn.Linear(256, 256).to(device)
    opt = torch.optim.AdamW(m.parameters())
    held = []
    def step():
        _in_a_thread(held)
        m(torch.randn(8, 256, device=device)).sum().backward()
        opt.step()
        opt.zero_grad()
    return step

def noisy(device):  # a thread that fails for another reason: said, the trace goes on
    m = nn.Linear(16, 16).to(device)
    def step():
        t = threading.Thread(target=lambda: 1 / 0, name="logger")
        t.start()
        t.join()
        m(torch.randn(2, 16, device=device)).sum().backward()
    return step

def late(device):  # a thread that fails after a while: waited for, so its failure is seen
    m = nn.Linear(16, 16).to(device)
    def step():
        threading.Thread(target=lambda: (time.sleep(0.5), torch.empty(4, device="cuda")),
                         name="late").start()
        m(torch.randn(2, 16, device=device)).sum().backward()
    return step

def lingering(device):  # one still running at the end: named
    m = nn.Linear(16, 16).to(device)
    def step():
        threading.Thread(target=time.sleep, args=(30,), name="sleeper", daemon=True).start()
        m(torch.randn(2, 16, device=device)).sum().backward()
    return step

if __name__ == "__main__":
    step = threaded("cuda")
    for _ in range(3):
        step()
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "threaded_steps.py").write_text(CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "threaded_steps.py"
    sys.modules.pop("threaded_steps", None)


@pytest.mark.parametrize("how", ["step", "script"])
def test_a_threads_cuda_allocation_fails_the_trace(module: Path, how: str) -> None:
    job = ["--step", "threaded_steps:threaded"] if how == "step" else ["--script", str(module)]
    done = cli("estimate", *job, "--steps", "2", check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "thread 'loader', started by your code, raised RuntimeError" in done.stderr
    assert "would be left out of the estimate" in done.stderr
    # Kept, not printed as a raw traceback by threading's own hook.
    assert "Traceback" not in done.stderr and "FITS" not in done.stdout, done.stderr


def test_a_thread_failing_otherwise_is_said(module: Path) -> None:
    import threading

    hook = threading.excepthook
    done = cli("estimate", "--step", "threaded_steps:noisy", "--steps", "2", check=False)
    assert threading.excepthook is hook, "the process's own hook is put back"
    assert done.returncode in (0, 1), done.stderr
    assert "thread 'logger', started by your code, raised ZeroDivisionError" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_thread_still_running_at_the_end_is_named_and_its_failure_said(
    module: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import threading

    done = cli("estimate", "--step", "threaded_steps:late", "--steps", "1", check=False)
    assert done.returncode in (0, 1), done.stderr
    assert "'late', started by your code, still ran when the trace ended" in done.stderr
    for t in threading.enumerate():
        if t.name == "late":
            t.join(10)
    # Said by the command if the thread failed before it answered (a loaded machine), else by
    # the hook left for after it: one line either way, never a traceback.
    err = done.stderr + capsys.readouterr().err
    assert "thread 'late' raised RuntimeError" in err and "after the trace ended" in err, err
    assert "Traceback" not in err, err
    done = cli("estimate", "--step", "threaded_steps:lingering", "--steps", "1", check=False)
    assert "'sleeper', started by your code, still ran when the trace ended" in done.stderr


def test_a_thread_another_caller_starts_during_the_trace_is_not_the_traced_codes() -> None:
    """Four estimates from four threads (the API serves one at a time): a thread the test
    started while another's trace ran was named "started by your code, still ran"; one of those
    that fails is the caller's, left to the process's own hook."""
    import threading
    import warnings

    import torch
    from torch import nn

    import memtrace

    tracing, go = threading.Event(), threading.Event()
    seen: list[str] = []
    hook = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.thread.name)

    def make(device: torch.device):
        model = nn.Linear(16, 16).to(device)

        def step() -> None:
            tracing.set()
            go.wait(10)
            model(torch.randn(2, 16, device=device)).sum().backward()

        return step

    got: list[object] = []
    estimate = threading.Thread(target=lambda: got.append(memtrace.estimate(make, steps=1)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            estimate.start()
            assert tracing.wait(60), "the step never ran"
            waiting = threading.Thread(target=lambda: (go.wait(10), time.sleep(1)), name="other")
            failing = threading.Thread(target=lambda: 1 / 0, name="failing")
            waiting.start()
            failing.start()
            failing.join()
            go.set()
            estimate.join(120)
    finally:
        threading.excepthook = hook
    assert len(got) == 1 and isinstance(got[0], memtrace.Estimate), got
    assert not [w for w in got[0].warnings if "thread" in w], got[0].warnings
    assert seen == ["failing"], "the caller's thread's failure went to the caller's hook"
    waiting.join()
