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
  "$memsim" replay "$tmp/$name.jsonl" --json | "$py" -c '
import json, sys
r = json.load(sys.stdin); G = 2**30
name, measured, world = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
ours = r["peak_reserved_bytes"] / G
print(json.dumps({"row": name, "world_size": world, "measured_reserved_gib": measured,
                  "ours_reserved_gib": round(ours, 2),
                  "ours_allocated_gib": round(r["peak_allocated_bytes"] / G, 2),
                  "error": round((ours - measured) / measured, 4)}))' "$name" "$measured" "$world"
}
# torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3, row "FSDP".
{
run torchtitan-llama3.1-8b-fsdp-8gpu 82.4 8
run torchtitan-llama3.1-8b-fsdp-128gpu 67.0 128
} > "$out"
