"""What the estimate of a user's own script says when the script's memory is not what a
steady GPU job's is: it never reaches the GPU, or it keeps memory from step to step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
