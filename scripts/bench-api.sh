#!/usr/bin/env bash
# The Python API's latency against the cold CLI run alongside (docs/benchmarks.md): ResNet-50 at
# batch 32 on the A100 profile. Target (issue 17): memtrace.estimate <= 2 s after import.
#
# Measured in one Python process: the import of memtrace (torch included), then N calls of
# memtrace.estimate on the same model (each a full estimate: symbolic and plain traces,
# features, memest, the report's breakdown). Baseline: the whole
# `python -m memtrace_trainer estimate` command, N times.
#
#   scripts/bench-api.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_runs bench-api "$@"
bench_needs bench-api memest
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for _ in $(seq "$N"); do
  s=$(date +%s.%N)
  "$PY" -m memtrace_trainer estimate --model torchvision:resnet50 --batch-size 32 \
    --profile a100-40gb >/dev/null 2>&1
  echo "$(date +%s.%N) - $s" | bc -l
done > "$tmp/cli"
"$PY" - "$N" > "$tmp/api" <<'PY'
import sys, time
t = time.perf_counter()
import torch, torchvision, memtrace  # noqa: E401
print(f"import {time.perf_counter() - t:.3f}")
model = torchvision.models.resnet50()
x, y = torch.randn(32, 3, 224, 224), torch.randint(0, 1000, (32,))
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    memtrace.estimate(model, x, target=y, gpu="a100-40gb")
    print(f"call {time.perf_counter() - t:.3f}")
PY
c=$(median < "$tmp/cli"); a=$(grep '^call' "$tmp/api" | cut -d' ' -f2 | median)
i=$(grep '^import' "$tmp/api" | cut -d' ' -f2)
printf 'cold CLI estimate ResNet-50 b32: %.2f s (median of %d)\n' "$c" "$N"
printf 'import memtrace (torch, torchvision): %.2f s\n' "$i"
printf 'memtrace.estimate ResNet-50 b32 after import: %.2f s (median of %d), %.1fx faster than the cold CLI\n' \
  "$a" "$N" "$(echo "$c / $a" | bc -l)"
