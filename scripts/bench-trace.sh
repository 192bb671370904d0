#!/usr/bin/env bash
# Tracing speed against the import time of torch, measured alongside (docs/benchmarks.md).
#
# Baseline: a fresh `python -c "import torch"` (and `import torch, torchvision`), the floor any
# estimate pays. Measured: (1) in one process after imports, one traced step of ResNet-50 at
# batch 32 and of GPT-2 small (batch 8, 512 tokens), each with its `memsim replay`; (2) the whole
# `python -m memtrace_trainer estimate` command, end to end, for both. Each figure is the median
# of N runs (default 3); the ratios to the import baseline are what docs/benchmarks.md records,
# since this machine's speed varies by 1.5x.
#
#   scripts/bench-trace.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_runs bench-trace "$@"
bench_needs bench-trace memsim

wall() {  # seconds of one command
  local t0 t1
  t0=$(date +%s.%N); "$@" >/dev/null 2>&1; t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}

imp=$(for _ in $(seq "$N"); do wall "$PY" -c "import torch"; done | median)
impv=$(for _ in $(seq "$N"); do wall "$PY" -c "import torch, torchvision"; done | median)
impt=$(for _ in $(seq "$N"); do wall "$PY" -c "import torch, transformers"; done | median)

in_process=$("$PY" - "$N" <<'EOF'
import statistics, subprocess, sys, tempfile, time
from pathlib import Path
import torch, torchvision, transformers  # noqa: F401  (imports are not timed here)
from memtrace_trainer.binaries import find_binary
from memtrace_trainer.models.zoo import build_workload
from memtrace_trainer.profile import load_profile
from memtrace_trainer.symtrace.step import StepConfig
from memtrace_trainer.symtrace.tracer import trace_to_file

n = int(sys.argv[1])
prof = load_profile("a100-40gb")
memsim = str(find_binary("memsim").path)
out = {}
for name, spec, batch, seq in (("resnet50_b32", "torchvision:resnet50", 32, None),
                               ("gpt2_b8_s512", "hf:gpt2", 8, 512)):
    times = []
    for i in range(n + 1):  # the first run warms caches (lazy imports, kernels' meta functions)
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            w = build_workload(spec, batch, None, seq, None)
            trace_to_file(w, StepConfig(iterations=1), prof, Path(d) / "t.jsonl")
            subprocess.run([memsim, "replay", str(Path(d) / "t.jsonl"), "--json"],
                           check=True, capture_output=True)
            if i:
                times.append(time.perf_counter() - t)
    out[name] = statistics.median(times)
print(" ".join(f"{k}={v:.3f}" for k, v in out.items()))
EOF
)
eval "$(echo "$in_process" | tr ' ' '\n' | sed 's/^/T_/')"

est_r50=$(for _ in $(seq "$N"); do wall "$PY" -m memtrace_trainer estimate --model torchvision:resnet50 --batch-size 32 --steps 1; done | median)
est_gpt=$(for _ in $(seq "$N"); do wall "$PY" -m memtrace_trainer estimate --model hf:gpt2 --batch-size 8 --seq-len 512 --steps 1; done | median)

printf '%-44s %8s %s\n' "measure" "seconds" "ratio"
printf '%-44s %8.2f %s\n' "import torch (baseline)" "$imp" "1.00"
printf '%-44s %8.2f %.2f\n' "import torch, torchvision" "$impv" "$(echo "$impv / $imp" | bc -l)"
printf '%-44s %8.2f %.2f\n' "import torch, transformers" "$impt" "$(echo "$impt / $imp" | bc -l)"
printf '%-44s %8.2f %.2f\n' "ResNet-50 b32: one traced step + replay" "$T_resnet50_b32" "$(echo "$T_resnet50_b32 / $imp" | bc -l)"
printf '%-44s %8.2f %.2f\n' "GPT-2 b8 s512: one traced step + replay" "$T_gpt2_b8_s512" "$(echo "$T_gpt2_b8_s512 / $imp" | bc -l)"
printf '%-44s %8.2f %.2f  (minus imports: %.2f s)\n' "estimate ResNet-50 b32, end to end" "$est_r50" "$(echo "$est_r50 / $imp" | bc -l)" "$(echo "$est_r50 - $impv" | bc -l)"
printf '%-44s %8.2f %.2f  (minus imports: %.2f s)\n' "estimate GPT-2 b8 s512, end to end" "$est_gpt" "$(echo "$est_gpt / $imp" | bc -l)" "$(echo "$est_gpt - $impv" | bc -l)"
