#!/usr/bin/env bash
# GPU check for libmemtrace.so (issue 3). Runs a small seeded PyTorch training job under the shim
# three ways (default caching, expandable_segments:True, PYTORCH_NO_CUDA_MEMORY_CACHING=1), takes
# a torch.cuda.memory snapshot in the caching runs, and checks the traces against them
# (scripts/gpu/analyze.py). The default run also records CUPTI kernel executions
# (MEMTRACE_CUPTI=1) so that the table reports kernel counts both ways. Prints a short table;
# exit status 1 if a check fails.
#
# On a GPU it then measures the GPU profile's constants in a fresh process
# (scripts/gpu/profile_measure.py: CUDA context, cuBLAS and cuDNN memory outside the allocator,
# the cuBLAS workspace actually allocated, total memory, SMs, compute capability, versions) and
# writes them, with scripts/gpu/profile_writer.py, to h200-profile.json and h200.toml in $OUT
# (the device machine's output folder) when that is set, else in --out, and into
# profiles/h200.toml when the GPU is an H200. The dry run skips this step (it needs CUDA); the
# writer is tested on fake measurements in tests/test_gpu_profile_writer.py.
#
# On a GPU it also runs the step-function examples of trainer/tests/step_examples.py on the
# device and compares their peaks with the symbolic trace's replay (scripts/gpu/steps_check.py),
# and trains five small LLM fine-tunes (LoRA, pure bf16, checkpointing) beside their estimates
# (scripts/gpu/finetune_check.py; the GPU machine needs transformers, peft and accelerate).
#
# The dry run builds the shim tests' stub libcudart.so.13 / libcuda.so.1, a stub libcupti.so.13
# next to them, and a stand-in libc10_cuda.so through which the dry-run job allocates (so the
# trace names PyTorch's allocator module as the caller, as on a GPU, and memsim's replay of the
# no-caching run takes those allocations as requests). The dry-run job runs one fixed workload
# three ways (scripts/gpu/job.py), so every check, the replay comparison included, is judged.
#
# On the GPU machine (torch with CUDA, python3, no network), from the repository root:
#   scripts/gpu-check.sh --shim target/release/libmemtrace.so --memsim target/release/memsim
# Here, without a GPU, against the stub runtime/driver of the shim's tests:
#   scripts/gpu-check.sh --dry-run
set -euo pipefail
cd "$(dirname "$0")/.."

# $OUT from the environment (the device machine's output folder) before --out reuses the name.
ENV_OUT=${OUT:-}
DRY=0
SHIM=target/release/libmemtrace.so
MEMSIM=target/release/memsim
OUT=
PY=${PYTHON:-python3}
ITER=5
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --shim) SHIM=$2; shift ;;
    --memsim) MEMSIM=$2; shift ;;
    --out) OUT=$2; shift ;;
    --iterations) ITER=$2; shift ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -f "$SHIM" ] || { echo "gpu-check: shim $SHIM not found (cargo build --release -p memtrace-shim)" >&2; exit 2; }
# memsim converts each trace to JSON Lines for the analysis and replays the no-caching run.
[ -x "$MEMSIM" ] || { echo "gpu-check: memsim $MEMSIM not found (cargo build --release -p memsim)" >&2; exit 2; }
SHIM=$(readlink -f "$SHIM")
MEMSIM=$(readlink -f "$MEMSIM")
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
OUT=$(readlink -f "$OUT")

DRYARG=()
if [ $DRY = 1 ]; then
  # The stub libcudart.so.13 / libcuda.so.1 from the shim's C tests.
  STUB=$OUT/stubs
  mkdir -p "$STUB"
  C=shim/tests/c
  cc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic-functions $C/stub_cuda.c -o $STUB/libcuda.so.1
  echo 'libcudart.so.13 { global: cuda*; __cuda*; local: *; };' > $STUB/cudart.map
  cc -shared -fPIC -O1 -Wl,-soname,libcudart.so.13 -Wl,-Bsymbolic-functions -Wl,--version-script=$STUB/cudart.map \
     $C/stub_cudart.c -o $STUB/libcudart.so.13 -ldl -lpthread
  # The job's device allocations go through a stand-in libc10_cuda.so, so that the trace names
  # PyTorch's allocator module as their caller, as on a GPU (memsim replay takes only those).
  # A stub libcupti.so.13 next to the stub runtime, as cu13 wheels ship it (synthetic records;
  # its MEMORY2 records come from the loaded stub driver's allocation log).
  cc -shared -fPIC -O1 -Wl,-soname,libcupti.so.13 $C/stub_cupti.c -o $STUB/libcupti.so.13
  cc -shared -fPIC -O1 -Wl,-soname,libc10_cuda.so $C/stub_c10_cuda.c -o $STUB/libc10_cuda.so \
     -L$STUB -l:libcudart.so.13 -Wl,-rpath,'$ORIGIN'
  export LD_LIBRARY_PATH=$STUB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  DRYARG=(--dry-run)
fi

start=$(date +%s)
for mode in default expandable nocache; do
  envs=()
  case $mode in
    # The caching runs also record CUPTI activity: kernel executions, to compare kernel counts,
    # and MEMORY2 records, to cross-check traced allocations (and to see whether MEMORY2
    # reports the expandable run's cuMemCreate/cuMemMap memory at all).
    default) envs=(MEMTRACE_CUPTI=1) ;;
    expandable) envs=(MEMTRACE_CUPTI=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ;;
    nocache) envs=(PYTORCH_NO_CUDA_MEMORY_CACHING=1) ;;
  esac
  rm -rf "${OUT:?}/$mode"
  mkdir -p "$OUT/$mode"
  env "${envs[@]}" LD_PRELOAD="$SHIM" MEMTRACE_OUT="$OUT/$mode/%p.mtrace" MEMTRACE_QUIET=0 \
    timeout 150 "$PY" scripts/gpu/job.py --out "$OUT/$mode" --mode $mode --iterations "$ITER" "${DRYARG[@]}" \
    2> "$OUT/$mode/stderr" || { echo "gpu-check: $mode job failed:" >&2; cat "$OUT/$mode/stderr" >&2; exit 1; }
  pid=$(cat "$OUT/$mode/pid")
  [ -f "$OUT/$mode/$pid.mtrace" ] || { echo "gpu-check: $mode wrote no trace $OUT/$mode/$pid.mtrace" >&2; cat "$OUT/$mode/stderr" >&2; exit 1; }
  mv "$OUT/$mode/$pid.mtrace" "$OUT/$mode/trace.mtrace"
  "$MEMSIM" convert "$OUT/$mode/trace.mtrace" "$OUT/$mode/trace.jsonl" >/dev/null
  grep '^memtrace:' "$OUT/$mode/stderr" | sed "s/^/[$mode] /" || true
done
status=0
"$PY" scripts/gpu/analyze.py "$OUT" --memsim "$MEMSIM" || status=$?
if [ $DRY = 1 ]; then
  echo "gpu-check: profile constants not measured (dry run: no GPU)"
else
  PROF=${ENV_OUT:-$OUT}
  mkdir -p "$PROF"
  if timeout 180 "$PY" scripts/gpu/profile_measure.py --out "$PROF/h200-profile.json" > "$PROF/profile_measure.log" 2>&1 \
     && "$PY" scripts/gpu/profile_writer.py "$PROF/h200-profile.json" --profile "$PROF/h200.toml"; then
    "$PY" scripts/gpu/profile_writer.py "$PROF/h200-profile.json" --profile profiles/h200.toml --expect-gpu H200 \
      || echo "gpu-check: profiles/h200.toml left unchanged (not an H200); the measured profile is $PROF/h200.toml" >&2
  else
    echo "gpu-check: profile measurement failed:" >&2; cat "$PROF/profile_measure.log" >&2; status=1
  fi
  # Step functions (issue 14): each example measured on the GPU and traced symbolically.
  if [ -n "$MEMSIM" ]; then
    PYTHONPATH=trainer${PYTHONPATH:+:$PYTHONPATH} timeout 300 "$PY" scripts/gpu/steps_check.py \
      --memsim "$MEMSIM" --out "$PROF/steps" || { echo "gpu-check: step functions missed" >&2; status=1; }
  fi
  # LLM fine-tunes (issue 15): LoRA, pure bf16, full and selective checkpointing, measured on the
  # GPU with the estimate's own model code, beside `estimate --json`.
  PYTHONPATH=trainer${PYTHONPATH:+:$PYTHONPATH} timeout 420 "$PY" scripts/gpu/finetune_check.py \
    --out "$PROF/finetune" || { echo "gpu-check: fine-tune estimates missed" >&2; status=1; }
  # NCCL's memory outside the allocator (issue 16): the profile's nccl_* terms, unmeasured until
  # this runs (one GPU measures the communicator; per-peer buffers need two).
  timeout 120 "$PY" scripts/gpu/nccl_measure.py --out "$PROF/nccl.json" \
    || { echo "gpu-check: NCCL measurement failed" >&2; status=1; }
fi
echo "gpu-check: $(( $(date +%s) - start )) s, results in $OUT"
exit $status
