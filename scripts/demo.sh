#!/usr/bin/env bash
# The main job, on a machine with no GPU: estimate real models' training memory with every
# estimator for an A100 40 GB profile; symbolically trace their training steps on the meta device
# and replay them through the caching-allocator model (peak, fragmentation, categories); check
# whether they fit on one GPU together; write a memory_viz pickle and a Perfetto trace.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
bash scripts/setup.sh

out=${MEMTRACE_DEMO_OUT:-$root/out/demo}
mkdir -p "$out"
py="$root/.venv/bin/python"
memsim="$root/target/release/memsim"
export MEMTRACE_BIN_DIR="$root/target/release"
profile=a100-40gb

echo "== every estimator, for an A100 40 GB ($profile)"
"$py" -m memtrace_trainer estimate --model torchvision:resnet50 --batch-size 32 --optimizer adam \
  --profile "$profile"
echo
"$py" -m memtrace_trainer estimate --model hf:gpt2 --batch-size 8 --seq-len 512 --optimizer adamw \
  --profile "$profile"

echo
echo "== symbolic traces (meta device, no GPU)"
"$py" -m memtrace_trainer symtrace --model torchvision:resnet50 --batch-size 32 --optimizer adam \
  --profile "$profile" --out "$out/resnet50-b32.jsonl"
"$py" -m memtrace_trainer symtrace --model hf:gpt2 --batch-size 8 --seq-len 512 --optimizer adamw \
  --profile "$profile" --out "$out/gpt2-b8-s512.jsonl"

for t in resnet50-b32 gpt2-b8-s512; do
  echo
  echo "== memsim replay $t ($profile)"
  "$memsim" replay "$out/$t.jsonl" --profile "$profile"
done

echo
echo "== can they share one A100 40 GB? (exit status 1 means they do not fit)"
"$memsim" colocate "$out/resnet50-b32.jsonl" "$out/gpt2-b8-s512.jsonl" --profile "$profile" \
  || [ $? -eq 1 ]

echo
echo "== views of resnet50-b32"
"$memsim" convert "$out/resnet50-b32.jsonl" "$out/resnet50-b32.pickle"
"$memsim" convert "$out/resnet50-b32.jsonl" "$out/resnet50-b32.perfetto.json"
cat <<MSG

Outputs in $out:
  resnet50-b32.pickle         drag onto https://pytorch.org/memory_viz (Active Memory Timeline)
  resnet50-b32.perfetto.json  open at https://ui.perfetto.dev (memory counters per device)
MSG
