#!/usr/bin/env bash
# An LLM fine-tune estimate end to end, against the import time of its libraries measured
# alongside (docs/benchmarks.md): Llama-3-8B, LoRA r=16 on q/v, pure bf16, sequence 2048, batch 1,
# AdamW, one A100 profile. Target (issue 15): <= 30 s and <= 4 GiB of host memory.
#
# Baseline: a fresh `python -c "import torch, transformers, peft"`, the floor such an estimate
# pays. Measured: the whole `python -m memtrace_trainer estimate` command (symbolic trace, plain
# trace, features, memest), its wall time and peak resident memory (GNU time). Medians of N runs
# (default 3).
#
#   scripts/bench-llm.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_runs bench-llm "$@"
bench_needs bench-llm memest
[ -x /usr/bin/time ] || { echo "bench-llm: needs GNU time (/usr/bin/time) for peak memory" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
measure() {  # prints "seconds kilobytes" of one command
  /usr/bin/time -f "%e %M" -o "$tmp/t" "$@" >/dev/null 2>"$tmp/err" || {
    rc=$?; [ "$rc" -le 1 ] || { cat "$tmp/err" >&2; exit 2; }; }
  cat "$tmp/t"
}
for _ in $(seq "$N"); do measure "$PY" -c "import torch, transformers, peft"; done > "$tmp/base"
for _ in $(seq "$N"); do
  measure "$PY" -m memtrace_trainer estimate --model hf:meta-llama/Meta-Llama-3-8B --batch-size 1 \
    --seq-len 2048 --dtype bf16 --lora 16 --optimizer adamw --profile a100-40gb
done > "$tmp/est"
b=$(cut -d' ' -f1 "$tmp/base" | median); e=$(cut -d' ' -f1 "$tmp/est" | median)
m=$(cut -d' ' -f2 "$tmp/est" | median)
printf 'import torch+transformers+peft: %.2f s (median of %d)\n' "$b" "$N"
printf 'estimate Llama-3-8B LoRA bf16 2048: %.2f s (%.1fx the import), peak RSS %.2f GiB\n' \
  "$e" "$(echo "$e / $b" | bc -l)" "$(echo "$m / 1048576" | bc -l)"
