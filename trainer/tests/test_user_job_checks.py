"""What the estimate of a user's own script says when the script's memory is not what a
steady GPU job's is: it never reaches the GPU, or it keeps memory from step to step."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from conftest import cli, cli_process, read_trace

LOOP = (
    "import torch\n"
    "m = torch.nn.Linear(256, 256){to}\n"
    "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
    "kept = []\n"
    "for _ in range(100):\n"
    "    out = m(torch.randn(2048, 256{on}))\n"
    "    out.sum().backward()\n"
    "    {keep}\n"
    "    opt.step()\n"
    "    opt.zero_grad()\n"
)


def script(tmp_path: Path, name: str, gpu: bool = True, keep: bool = False) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(LOOP.format(to=".cuda()" if gpu else "", on=", device='cuda'" if gpu else "",
                                keep="kept.append(out)" if keep else "pass"))  # fmt: skip
    return str(path)


def test_a_job_on_the_cpu_is_no_gpu_job(tmp_path: Path) -> None:
    """A CPU matmul was charged cuBLAS's workspace and library memory, and the estimate said
    "needs 1453 MiB: FITS" of a job that never touches the GPU; a trace with nothing on the
    GPU has no need to judge."""
    cpu = script(tmp_path, "cpu", gpu=False)
    out = tmp_path / "t.jsonl"
    cli("symtrace", "--script", cpu, "--out", str(out))
    header, *events = read_trace(out)
    assert header["metadata"]["uses_gemm"] == "false"
    assert not [e for e in events if e.get("kind") == "alloc"]
    done = cli("estimate", "--script", cpu, "--json", check=False)
    assert done.returncode == 2, done.stdout
    assert "nothing was allocated on the GPU in the traced steps" in done.stderr
    # The same loop on the GPU loads cuBLAS and is estimated.
    gpu = json.loads(cli("estimate", "--script", script(tmp_path, "gpu"), "--json").stdout)
    assert gpu["outside_allocator"]["cublas_mib"] > 0 and gpu["verdict"]["fits"]


def test_memory_kept_from_step_to_step_is_said(tmp_path: Path) -> None:
    """Each step's output appended to a list (2048 x 256 fp32, 2 MiB) makes the peak grow every
    step, and the estimate of the last traced step was given as the job's need in silence."""
    leak = json.loads(cli("estimate", "--script", script(tmp_path, "leak", keep=True), "--steps",
                          "4", "--json").stdout)  # fmt: skip
    said = [w for w in leak["warnings"] if "grows at every step after the first" in w]
    assert said and "(steps 2 to 4)" in said[0], leak["warnings"]
    steady = json.loads(cli("estimate", "--script", script(tmp_path, "steady"), "--steps", "4",
                            "--json").stdout)  # fmt: skip
    assert not any("grows" in w for w in steady["warnings"]), steady["warnings"]


def test_free_memory_leaves_out_what_the_process_holds_beside_its_tensors(tmp_path: Path) -> None:
    """`torch.cuda.mem_get_info()` said the device was free but for the job's tensors: a program
    sizing a buffer to a share of it was given the context and cuBLAS (1.4 GiB on the A100
    profile), which a real GPU has already taken."""
    path = tmp_path / "free.py"
    path.write_text(
        "import torch\n"
        "free0, total = torch.cuda.mem_get_info()\n"
        "m = torch.nn.Linear(64, 64).cuda()\n"
        "m(torch.randn(4, 64, device='cuda')).sum().backward()\n"
        "free1, _ = torch.cuda.mem_get_info()\n"
        "print('HELD', total - free0, total - free1, torch.cuda.memory_allocated())\n"
    )
    done = cli("symtrace", "--script", str(path), "--out", str(tmp_path / "t.jsonl"))
    line = next(x for x in (done.stdout + done.stderr).splitlines() if x.startswith("HELD"))
    before, after, tensors = (int(v) for v in line.split()[1:])
    from memtrace_trainer.profile import load_profile

    p = load_profile(None)
    assert before == p.context_bytes > 0  # the context, before any op
    assert after == p.context_bytes + p.cublas_bytes + tensors  # cuBLAS, from the first GEMM


def test_a_script_that_catches_every_stop_is_ended(tmp_path: Path) -> None:
    """`while True:` around a bare `except:` swallowed the stop at every step: the command ran
    for ever. It is ended with an error naming the cause."""
    path = Path(__file__).parent / "scripts" / "catches_every_stop.py"
    # In a child process: the command ends its own process (os._exit), as it must; its
    # temporary folders go with it (os._exit left them behind).
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = cli_process("estimate", "--script", str(path), check=False, env={"TMPDIR": str(tmp)})
    assert done.returncode == 2, done.stderr
    assert "caught the stop after 3 iterations 100 times" in done.stderr
    assert list(tmp.glob("memtrace-*")) == []  # (torch keeps its inductor cache there)


def test_a_search_of_a_job_on_the_cpu_is_refused_as_its_estimate_is(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """`estimate` refused a job with nothing on the GPU, while `max-batch` answered its --limit,
    every probe FITS at the context alone: two commands, two verdicts for one job."""
    (tmp_path / "cpu_steps.py").write_text(
        "import torch\n"
        "def sized(device, batch_size):\n"
        "    m = torch.nn.Linear(8, 8)\n"
        "    def step():\n"
        "        m(torch.randn(batch_size, 8)).sum().backward()\n"
        "    return step\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    done = cli("max-batch", "--step", "cpu_steps:sized", "--limit", "64", check=False)
    assert done.returncode == 2, done.stdout
    assert "nothing was allocated on the GPU in the traced steps" in done.stderr


STEPS = """\
import torch
from torch import nn


def batch_norm(device, batch_size):
    m = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32)).to(device)
    x = torch.randn(batch_size, 16, device=device)
    return lambda: m(x).sum().backward()


def fixed(device, batch_size):
    m = nn.Linear(64, 64).to(device)
    x = torch.randn(8, 64, device=device)  # the batch given is never used
    return lambda: m(x).sum().backward()


def tiny(device, batch_size):
    m = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(batch_size, 16, device=device)

    def step():
        opt.zero_grad()
        m(x).sum().backward()
        opt.step()

    return step


def capped(device, batch_size):
    if batch_size > 4:
        raise ValueError("my loader takes at most 4")
    m = nn.Linear(64, 64).to(device)
    x = torch.randn(batch_size, 64, device=device)
    return lambda: m(x).sum().backward()


def second_gpu(device):
    m = nn.Linear(64, 64).to("cuda:1")
    return lambda: m(torch.randn(4, 64, device="cuda:1")).sum().backward()


def second_gpu_by_index(device):
    m = nn.Linear(64, 64).cuda()
    return lambda: m(torch.randn(4, 64).to(1)).sum().backward()
"""


def _steps(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "job_steps.py").write_text(STEPS)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_step_pytorch_refuses_at_batch_1_is_searched_from_2_as_an_entry_is(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """BatchNorm refuses one value per channel: `max-batch --entry` started at 2, `--step`
    failed at its first probe (exit 2), its step's error not taken for the model's refusal."""
    _steps(tmp_path, monkeypatch)
    for source in (["--step", "job_steps:batch_norm"], ["--entry", "entry_example:batch_norm"]):
        done = cli("max-batch", *source, "--limit", "4", "--steps", "1", "--json")
        data = json.loads(done.stdout)
        assert data["max_batch"] == 4 and [p["batch"] for p in data["probes"]] == [2, 4], data
        said = [w for w in data["warnings"] if "starts at batch 2" in w]
        assert said and "(ValueError: Expected more than 1 value per" in said[0], data["warnings"]


def test_a_search_whose_need_never_changes_says_so(tmp_path: Path, monkeypatch: Any) -> None:
    """A builder that ignores its batch_size: every probe needed the same bytes, and the answer
    was the --limit, as if memory had allowed it."""
    _steps(tmp_path, monkeypatch)
    data = json.loads(cli("max-batch", "--step", "job_steps:fixed", "--limit", "8", "--steps",
                          "1", "--json").stdout)  # fmt: skip
    assert data["max_batch"] == 8 and data["hit_limit"], data
    said = [w for w in data["warnings"] if "the need never changed with the batch" in w]
    assert said and "every probe, batch 1 to 8, makes the same allocations" in said[0], said
    # One that grows with the batch is not said to.
    data = json.loads(cli("max-batch", "--step", "job_steps:capped", "--limit", "4", "--steps",
                          "1", "--json").stdout)  # fmt: skip
    assert not any("never changed" in w for w in data["warnings"]), data["warnings"]


def test_a_small_model_whose_tensors_grow_with_the_batch_is_not_said_to_ignore_it(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """memsim's peaks, rounded to its blocks, were the same at batch 1 to 8 for a 16-wide MLP, and
    the search said the job did not use its batch: the traces' own requests grow with it."""
    _steps(tmp_path, monkeypatch)
    data = json.loads(cli("max-batch", "--step", "job_steps:tiny", "--limit", "8", "--steps",
                          "1", "--json").stdout)  # fmt: skip
    peaks = {(p["peak_allocated_bytes"], p["peak_reserved_bytes"]) for p in data["probes"]}
    assert data["hit_limit"] and len(peaks) == 1, data  # the case: the rounded peaks are equal
    assert not any("never changed" in w for w in data["warnings"]), data["warnings"]
    # The Python API's search is the same one.
    from torch import nn

    import memtrace

    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert memtrace.max_batch(model, torch.randn(1, 16), optimizer="sgd", limit=8) == 8
    said = [str(w.message) for w in seen if issubclass(w.category, memtrace.MemtraceWarning)]
    assert not any("never changed" in w for w in said), said


def test_a_builder_failing_partway_through_a_search_says_where(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A step builder that refuses batches past its own cap failed the search with its error
    alone: which batch was probed, and what had fitted, was lost."""
    _steps(tmp_path, monkeypatch)
    done = cli("max-batch", "--step", "job_steps:capped", "--steps", "1", check=False)
    assert done.returncode == 2, done.stdout
    assert "max-batch: batch 8 failed, after batch 4 fitted (the largest so far): --step " in (
        done.stderr
    ), done.stderr
    assert "my loader takes at most 4" in done.stderr and "job_steps.py:" in done.stderr


def test_a_second_gpu_is_refused_as_a_one_gpu_machine_refuses_it(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """`cuda:1` where torch.cuda.device_count() answers 1 was folded onto the one GPU in
    silence: a model split over two GPUs was estimated as one GPU's job."""
    _steps(tmp_path, monkeypatch)
    for fn in ("second_gpu", "second_gpu_by_index"):
        done = cli("symtrace", "--step", f"job_steps:{fn}", "--out", str(tmp_path / "t.jsonl"),
                   check=False)  # fmt: skip
        assert done.returncode == 2, done.stdout
        # Led by whose code it is, as the user's other errors are.
        said = f"error: --step job_steps:{fn}: your code uses cuda:1 (at "
        assert said in done.stderr and "job_steps.py:" in done.stderr, done.stderr
        assert "invalid device ordinal" in done.stderr, done.stderr
        assert not (tmp_path / "t.jsonl").exists()
