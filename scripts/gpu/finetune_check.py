"""GPU check of LLM fine-tune estimates (issue 15): each case runs on the GPU in a fresh process,
the model built by the same code as the estimate (`build_workload` on "cuda", random weights from
the published config, peft for LoRA) and trained by the tracer's own loop (`step.canned`); peak
allocated and reserved come from torch.cuda after N steps, setup included. Beside it, `estimate
--json` for the same flags gives the symbolic peaks. Prints a table and exits 1 when a prediction
misses by more than --tolerance.

    python3 scripts/gpu/finetune_check.py [--steps 2] [--out DIR]

QLoRA and the bitsandbytes optimizers are emulated for estimates only and are not run here.
Without CUDA it says so and exits 2: the check needs a GPU (scripts/gpu-check.sh runs it there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from steps_check import judge, run_check  # noqa: E402  (the GPU checks' shared row and driver)

COMMON = ["--optimizer", "adamw", "--profile", os.environ.get("MEMTRACE_PROFILE", "a100-40gb")]
CASES: dict[str, list[str]] = {
    "qwen2-0.5b-lora-bf16": ["--model", "hf:Qwen/Qwen2-0.5B", "--batch-size", "4",
                             "--seq-len", "1024", "--dtype", "bf16", "--lora", "16"],
    "tinyllama-lora-full-ckpt": ["--model", "hf:TinyLlama/TinyLlama-1.1B-Chat-v1.0",
                                 "--batch-size", "4", "--seq-len", "2048", "--dtype", "bf16",
                                 "--lora", "8", "--checkpointing", "full"],
    "tinyllama-full-bf16": ["--model", "hf:TinyLlama/TinyLlama-1.1B-Chat-v1.0", "--batch-size",
                            "2", "--seq-len", "1024", "--dtype", "bf16"],
    "qwen2-0.5b-selective": ["--model", "hf:Qwen/Qwen2-0.5B", "--batch-size", "4", "--seq-len",
                             "1024", "--dtype", "bf16", "--checkpointing", "selective"],
    "gpt2-amp-bf16": ["--model", "hf:gpt2", "--batch-size", "8", "--seq-len", "1024",
                      "--amp", "bf16"],
}  # fmt: skip

ON_GPU = """
import json, sys, torch
from memtrace_trainer.cli.common import step_config, workloads
from memtrace_trainer.cli.estimate import register
from memtrace_trainer.symtrace.step import canned
import argparse
p = argparse.ArgumentParser(); sub = p.add_subparsers(dest="command"); register(sub)
args = vars(p.parse_args(["estimate", *sys.argv[2:]]))
steps = int(sys.argv[1])
cfg = step_config(args, steps)
from memtrace_trainer.models import zoo
build = zoo.build_workload
zoo.build_workload = lambda *a, **k: build(*a, **{**k, "device": torch.device("cuda")})
w = workloads(args)(args["batch_size"])

class Quiet:
    category = ""
    def marker(self, text): pass

step = canned(w, cfg, Quiet(), {})(torch.device("cuda"))
for _ in range(steps):
    step()
torch.cuda.synchronize()
print(json.dumps({"allocated": torch.cuda.max_memory_allocated(),
                  "reserved": torch.cuda.max_memory_reserved()}))
"""


def measured(args: list[str], steps: int) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "trainer")}
    out = subprocess.run([sys.executable, "-c", ON_GPU, str(steps), *args],
                         capture_output=True, text=True, check=True, env=env)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def predicted(args: list[str], steps: int) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "trainer")}
    out = subprocess.run(
        [sys.executable, "-m", "memtrace_trainer", "estimate", *args, "--steps", str(steps),
         "--json"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if out.returncode not in (0, 1):
        raise SystemExit(f"finetune_check: estimate failed: {out.stderr.strip()}")
    sym = json.loads(out.stdout)["estimates"]["symbolic"]
    mib = 1 << 20
    return {k: int(sym[f"{k}_mib"] * mib) for k in ("allocated", "reserved")}


def main() -> int:
    def rows(a: argparse.Namespace) -> list[dict[str, Any]]:
        out = []
        for name, flags in CASES.items():
            args = [*flags, *COMMON]
            row = judge(name, measured(args, a.steps), predicted(args, a.steps), a.tolerance)
            out.append({**row, "args": args})
        return out

    return run_check(__doc__, "finetune_check", 2, rows)


if __name__ == "__main__":
    sys.exit(main())
