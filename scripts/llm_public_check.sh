#!/usr/bin/env bash
# The published fine-tuning measurements memtrace is compared with (docs/validation.md, "LLM
# fine-tuning"): each row's config as its source ran it, our peak allocated beside the measured
# max_memory_allocated. Usage: scripts/llm_public_check.sh [OUT.jsonl]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/dev/stdout}
py=${PYTHON:-.venv/bin/python}
run() { # name measured_GB args...
  local name=$1 measured=$2 json rc=0; shift 2
  # Exit status 1 is "does not fit on the profile's GPU": still an answer.
  json=$("$py" -m memtrace_trainer estimate "$@" --json 2>/dev/null) || rc=$?
  if [ "$rc" -gt 1 ]; then echo "error: $name: estimate failed ($rc)" >&2; return 1; fi
  printf '%s' "$json" | "$py" -c '
import json, sys
r = json.load(sys.stdin); s = r["estimates"]["symbolic"]
name, measured = sys.argv[1], float(sys.argv[2])
ours = s["allocated_mib"] * 2**20 / 1e9
print(json.dumps({"row": name, "measured_gb": measured, "ours_allocated_gb": round(ours, 2),
                  "ours_reserved_gb": round(s["reserved_mib"] * 2**20 / 1e9, 2),
                  "error": round((ours - measured) / measured, 4),
                  "args": sys.argv[3:]}))' "$name" "$measured" "$@"
}
# litgpt tutorials/resource-tables.md (A100-40GB, bf16-true, LoRA r=8 alpha=16 dropout=0.05 on
# query and value, AdamW, no checkpointing, longest Alpaca sample 1304 tokens first;
# bitsandbytes 0.41.1, and litgpt keeps the non-quantized weights in bf16).
lora=(--dtype bf16 --lora 8:16 --lora-dropout 0.05 --lora-targets q_proj,v_proj --optimizer adamw
      --seq-len 1304 --profile a100-40gb)
{
run litgpt-llama2-7b-lora-b1 21.30 --model hf:meta-llama/Llama-2-7b-hf --batch-size 1 "${lora[@]}"
run litgpt-llama2-7b-lora-b2 29.07 --model hf:meta-llama/Llama-2-7b-hf --batch-size 2 "${lora[@]}"
run litgpt-llama2-13b-lora-b1 38.12 --model hf:meta-llama/Llama-2-13b-hf --batch-size 1 "${lora[@]}"
run litgpt-llama2-7b-qlora-nf4-b1 14.14 --model hf:meta-llama/Llama-2-7b-hf --batch-size 1 "${lora[@]}" --qlora --no-kbit-prepare --bnb-version 0.41
run litgpt-llama2-7b-qlora-nf4dq-b1 13.84 --model hf:meta-llama/Llama-2-7b-hf --batch-size 1 "${lora[@]}" --qlora --qlora-double-quant --no-kbit-prepare --bnb-version 0.41
run litgpt-llama2-13b-qlora-nf4-b1 23.14 --model hf:meta-llama/Llama-2-13b-hf --batch-size 1 "${lora[@]}" --qlora --no-kbit-prepare --bnb-version 0.41
} > "$out"
