#!/usr/bin/env bash
# The published per-GPU measurements of sharded training memtrace is compared with
# (docs/distributed.md, "Measured per-GPU numbers"): torchtitan's Llama 3.1 8B FSDP step
# (scripts/public/torchtitan_llama3.py) traced as rank 0 of 8 and of 128 ranks, replayed by
# memsim, beside torchtitan's published peak reserved memory. Usage:
# scripts/sharded_public_check.sh [OUT.jsonl]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/dev/stdout}
py=${PYTHON:-.venv/bin/python}
memsim=${MEMSIM:-target/release/memsim}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() { # name measured_GiB world_size
  local name=$1 measured=$2 world=$3
  if ! PYTHONPATH=scripts/public "$py" -m memtrace_trainer symtrace --step torchtitan_llama3:step \
      --world-size "$world" --steps 2 --out "$tmp/$name.jsonl" >/dev/null 2>"$tmp/$name.err"; then
    echo "error: $name: the trace failed:" >&2; cat "$tmp/$name.err" >&2; return 1
  fi
  # The published table does not say how the runs were launched; torchtitan's launch script of
  # that time sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. Both replays are printed.
  "$memsim" replay "$tmp/$name.jsonl" --json > "$tmp/default.json"
  "$memsim" replay "$tmp/$name.jsonl" --alloc-conf expandable_segments:True --json \
    > "$tmp/expandable.json"
  "$py" -c '
import json, sys
name, measured, world, tmp = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
G = 2**30
row = {"row": name, "world_size": world, "measured_reserved_gib": measured}
for conf in ("default", "expandable"):
    r = json.load(open(f"{tmp}/{conf}.json"))
    ours = r["peak_reserved_bytes"] / G
    row[f"ours_reserved_gib_{conf}"] = round(ours, 2)
    row[f"error_{conf}"] = round((ours - measured) / measured, 4)
row["ours_allocated_gib"] = round(r["peak_allocated_bytes"] / G, 2)
print(json.dumps(row))' "$name" "$measured" "$world" "$tmp"
}
fit() { # name ran|oom model seq batch ac  (64 A100-80GB ranks)
  local name=$1 outcome=$2 model=$3 seq=$4 batch=$5 ac=$6
  if ! MEMTRACE_TT_MODEL=$model MEMTRACE_TT_SEQ=$seq MEMTRACE_TT_BATCH=$batch MEMTRACE_TT_AC=$ac \
      PYTHONPATH=scripts/public "$py" -m memtrace_trainer symtrace --step torchtitan_llama3:step \
      --world-size 64 --steps 2 --out "$tmp/$name.jsonl" >/dev/null 2>"$tmp/$name.err"; then
    echo "error: $name: the trace failed:" >&2; cat "$tmp/$name.err" >&2; return 1
  fi
  for conf in default expandable; do
    local extra=() rc=0
    [ "$conf" = expandable ] && extra=(--alloc-conf expandable_segments:True)
    # The A100 profile's memory outside the allocator (context, libraries, NCCL) is taken off
    # the 80 GB card's total; exit status 1 is "does not fit".
    "$memsim" replay "$tmp/$name.jsonl" --profile a100-40gb --capacity 81920MiB --point \
      "${extra[@]}" --json > "$tmp/$conf.json" 2>/dev/null || rc=$?
    [ "$rc" -gt 1 ] && { echo "error: $name: replay failed ($rc)" >&2; return 1; }
  done
  "$py" -c '
import json, sys
name, outcome, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
row = {"row": name, "published": outcome}
for conf in ("default", "expandable"):
    r = json.load(open(f"{tmp}/{conf}.json"))
    row[f"ours_reserved_gib_{conf}"] = round(r["peak_reserved_bytes"] / 2**30, 2)
    row[f"ours_fits_{conf}"] = bool(r["verdict"]["fits"])
    row[f"agrees_{conf}"] = row[f"ours_fits_{conf}"] == (outcome == "ran")
print(json.dumps(row))' "$name" "$outcome" "$tmp"
}
{
# torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3, row "FSDP".
run torchtitan-llama3.1-8b-fsdp-8gpu 82.4 8
run torchtitan-llama3.1-8b-fsdp-128gpu 67.0 128
# torchtitan docs/performance.md: FSDP2 on 64 A100-80GB; the rows that ran, and the footnote's
# out-of-memory (Llama 2 70B, local batch 2, selective op checkpointing).
fit perf-llama3-8b-b1-sac-op ran meta-llama/Meta-Llama-3-8B 8192 1 selective
fit perf-llama3-70b-b1-full ran meta-llama/Meta-Llama-3-70B 8192 1 full
fit perf-llama2-13b-b2-noac ran meta-llama/Llama-2-13b-hf 4096 2 none
fit perf-llama2-13b-b2-sac-op ran meta-llama/Llama-2-13b-hf 4096 2 selective
fit perf-llama2-70b-b1-sac-op ran meta-llama/Llama-2-70b-hf 4096 1 selective
fit perf-llama2-70b-b2-sac-op oom meta-llama/Llama-2-70b-hf 4096 2 selective
fit perf-llama2-70b-b2-full ran meta-llama/Llama-2-70b-hf 4096 2 full
} > "$out"
