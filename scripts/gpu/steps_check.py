"""GPU check of step functions (issue 14): each example of trainer/tests/step_examples.py runs on
the GPU in a fresh process (peak allocated and reserved from torch.cuda after N steps, setup
included) and is traced symbolically and replayed by memsim (the same window). Prints a table and
exits 1 when a prediction misses by more than --tolerance.

    python3 scripts/gpu/steps_check.py --memsim target/release/memsim [--steps 3] [--out DIR]

Without CUDA it says so and exits 2: the check needs a GPU (scripts/gpu-check.sh runs it there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "trainer" / "tests"
EXAMPLES = (
    "default_adamw",
    "custom_optimizer",
    "zero_grad_after_forward",
    "grad_accumulation",
    "chunked_cross_entropy",
    "forward_only",
    "inference",
    "einsum_bf16",
    "cuda_literals",
)

ON_GPU = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import step_examples
step = getattr(step_examples, sys.argv[2])(torch.device("cuda"))
for _ in range(int(sys.argv[3])):
    step()
torch.cuda.synchronize()
print(json.dumps({"allocated": torch.cuda.max_memory_allocated(),
                  "reserved": torch.cuda.max_memory_reserved()}))
"""


def measured(name: str, steps: int) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", ON_GPU, str(TESTS), name, str(steps)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def predicted(name: str, steps: int, memsim: str, out: Path) -> dict[str, int]:
    trace = out / f"{name}.jsonl"
    env = {**os.environ, "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run(
        [sys.executable, "-m", "memtrace_trainer", "symtrace", "--step", f"step_examples:{name}",
         "--steps", str(steps), "--out", str(trace)],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    rep = subprocess.run([memsim, "replay", str(trace), "--json"], check=True,
                         capture_output=True, text=True)  # fmt: skip
    r = json.loads(rep.stdout)
    return {"allocated": r["peak_allocated_bytes"], "reserved": r["peak_reserved_bytes"]}


def judge(name: str, m: dict[str, int], p: dict[str, int], tolerance: float) -> dict[str, Any]:
    """One measured/predicted pair: its relative errors, printed as a table row, and whether
    both are within `tolerance` (the GPU checks share this: finetune_check.py too)."""
    err = {k: (p[k] - m[k]) / m[k] if m[k] else 0.0 for k in ("allocated", "reserved")}
    ok = all(abs(v) <= tolerance for v in err.values())
    print(
        f"{name:26} allocated {m['allocated']:>12} vs {p['allocated']:>12} "
        f"({err['allocated']:+.1%})  reserved {m['reserved']:>12} vs {p['reserved']:>12} "
        f"({err['reserved']:+.1%})  {'ok' if ok else 'MISS'}"
    )
    return {"example": name, "measured": m, "predicted": p, "error": err, "ok": ok}


def run_check(
    doc: str,
    name: str,
    steps: int,
    rows: Callable[[argparse.Namespace], list[dict[str, Any]]],
    flags: Callable[[argparse.ArgumentParser], None] = lambda ap: None,
) -> int:
    """The GPU checks' one driver: the flags (`flags` adds a check's own), a GPU or exit 2, the
    rows written to OUT/NAME.json, and exit 1 when one is outside the tolerance."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    flags(ap)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--tolerance", type=float, default=0.05, help="relative error allowed")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp"))
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(f"{name}: needs a CUDA GPU (none here)", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    table = rows(a)
    (a.out / f"{name}.json").write_text(json.dumps(table, indent=1))
    return 0 if all(r["ok"] for r in table) else 1


def main() -> int:
    def rows(a: argparse.Namespace) -> list[dict[str, Any]]:
        return [judge(name, measured(name, a.steps), predicted(name, a.steps, a.memsim, a.out),
                      a.tolerance) for name in EXAMPLES]  # fmt: skip

    def flags(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--memsim", default=str(ROOT / "target" / "release" / "memsim"))

    return run_check(__doc__, "steps_check", 3, rows, flags)


if __name__ == "__main__":
    sys.exit(main())
