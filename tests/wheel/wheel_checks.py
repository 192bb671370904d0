"""The installed wheel (scripts/wheel-check.sh installs `pip install .` into a fresh virtual
environment and runs these from outside the source tree): `import memtrace` is the wheel's, its
native module runs memsim and memest in-process, the console scripts and the preload library are
there, and an estimate makes no subprocess call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import memtrace
from memtrace_trainer import binaries

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_memtrace_is_the_installed_wheel() -> None:
    for module in (memtrace, binaries):
        path = Path(module.__file__).resolve()
        assert REPO not in path.parents, f"{module.__name__} imported from the source tree: {path}"
    from memtrace import _native

    assert _native.__version__ == memtrace.__version__
    assert Path(_native.__file__).name.endswith(".abi3.so")
    assert memtrace.profiles() == ["a100-40gb", "h200"]
    shipped = Path(_native.__file__).parent / "profiles"
    assert Path(binaries.os.environ["MEMTRACE_PROFILES"]) == shipped


def test_an_estimate_makes_no_subprocess_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"subprocess started: {args}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
    est = memtrace.estimate(model, torch.randn(64, 256), target=torch.randint(0, 10, (64,)))
    assert est.fits() and est.fits("h200")
    assert sum(est.breakdown.values()) == pytest.approx(est.device_mib)
    assert est.raw["binary"]["source"] == "the memtrace wheel's native module, in-process"


def test_the_console_scripts_behave_as_the_binaries() -> None:
    for name in ("memsim", "memest"):
        done = subprocess.run([str(BIN / name), "--version"], capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout.startswith(f"{name} "), done
        bad = subprocess.run([str(BIN / name), "no-such-command"], capture_output=True, text=True)
        assert bad.returncode == 2 and "error" in bad.stderr, bad
    # The profiles are the wheel's own, whatever this process set and wherever it was built.
    env = {k: v for k, v in os.environ.items() if k != "MEMTRACE_PROFILES"}
    listed = subprocess.run([str(BIN / "memsim"), "profile", "--list", "--json"], env=env,
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert json.loads(listed.stdout) == ["a100-40gb", "h200"]
    shown = subprocess.run([str(BIN / "memsim"), "profile", "a100-40gb", "--json"], env=env,
                           capture_output=True, text=True, check=True)  # fmt: skip
    path = Path(json.loads(shown.stdout)["path"]).resolve()
    assert REPO not in path.parents and path.parent.name == "profiles", path


def test_the_preload_library_ships_in_the_wheel() -> None:
    path = memtrace.preload_path()
    assert path.name == "libmemtrace.so" and REPO not in path.resolve().parents
    done = subprocess.run([sys.executable, "-m", "memtrace", "preload"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert Path(done.stdout.strip()) == path
    # The shim loads into a process that uses no CUDA, and stays out of its way.
    env = {"LD_PRELOAD": str(path), "PATH": "/usr/bin:/bin"}
    ran = subprocess.run(["/bin/true"], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
