#!/usr/bin/env bash
# Benchmarks for libmemtrace.so (issue 3): added cost per intercepted call (median of many runs,
# pinned to one core), callgrind instruction counts per call, sustained event throughput into the
# trace file, bytes per event of a launch-heavy trace, and what an idle traced program pays for
# the writer thread (CPU time and wake-ups over a sleep). Against the C stub runtime/driver.
# Usage: scripts/bench-shim.sh [iters=200000] [repeats=31] [throughput_events=10000000]
# A/B against an earlier build: AB_BASE=OLD.so [AB_ROUNDS=7] scripts/bench-shim.sh (per-call time only).
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS=${1:-200000}
REPEATS=${2:-31}
EVENTS=${3:-10000000}
# A base that is not there would be preloaded as nothing (the loader only warns): refused here.
if [ -n "${AB_BASE:-}" ] && [ ! -f "$AB_BASE" ]; then
  echo "AB_BASE=$AB_BASE: no such file (expected an earlier build's libmemtrace.so)" >&2; exit 2
fi
if [ -n "${AB_ROUNDS:-}" ] && { [ -z "${AB_BASE:-}" ] || ! [[ $AB_ROUNDS =~ ^[1-9][0-9]*$ ]]; }; then
  echo "AB_ROUNDS=$AB_ROUNDS: expected a whole number of rounds >= 1, with AB_BASE" >&2; exit 2
fi
C=shim/tests/c
B=target/shim-bench
mkdir -p "$B"
cargo build --release -p memtrace-shim >&2
SHIM=$PWD/target/release/libmemtrace.so

cc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic-functions $C/stub_cuda.c -o $B/libcuda.so.1
echo 'libcudart.so.13 { global: cuda*; __cuda*; local: *; };' > $B/cudart13.map
cc -shared -fPIC -O2 -Wl,-soname,libcudart.so.13 -Wl,-Bsymbolic-functions -Wl,--version-script=$B/cudart13.map \
   $C/stub_cudart.c -o $B/libcudart.so.13 -ldl -lpthread
ln -sf libcuda.so.1 $B/libcuda.so
ln -sf libcudart.so.13 $B/libcudart.so
for p in bench_calls bench_throughput bench_idle; do
  cc -O2 -rdynamic -I$C shim/benches/c/$p.c -o $B/$p -L$B -Wl,--no-as-needed -lcudart -lcuda -Wl,--as-needed \
     -lpthread -Wl,-rpath,'$ORIGIN'
done
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# STUB_CUDA_MEM_LOG=0: the stub driver keeps no allocation log for the stub libcupti here.
export LD_LIBRARY_PATH=$PWD/$B MEMTRACE_QUIET=1 MEMTRACE_OUT=$OUT/%p.mtrace STUB_CUDA_MEM_LOG=0

if [ -n "${AB_BASE:-}" ]; then
  # AB_BASE=OLD.so: the added per-call time of OLD.so and of this build, AB_ROUNDS rounds
  # interleaved (the machine's speed drifts), each round against a fresh no-shim baseline;
  # the medians over rounds, then the ratio. Only this section runs.
  for r in $(seq 1 "${AB_ROUNDS:-7}"); do
    base=$(taskset -c 0 $B/bench_calls "$ITERS" 11)
    for v in base now; do
      so=$SHIM; [ $v = base ] && so=$AB_BASE
      paste <(echo "$base") <(LD_PRELOAD=$so taskset -c 0 $B/bench_calls "$ITERS" 11) | awk -v v=$v '{print $1, v, $4-$2}'
      rm -f $OUT/*.mtrace
    done
  done | sort -k1,1 -k2,2 -k3,3n | awk '{k=$1" "$2; v[k,++n[k]]=$3} END{for (k in n) m[k]=v[k,int((n[k]+1)/2)]; for (k in m) {split(k,p," "); if (p[2]=="now") printf "%-24s added: base %6.1f  now %6.1f  ns (%.2fx), median of %d rounds\n", p[1], m[p[1]" base"], m[k], m[k]/m[p[1]" base"], n[k]}}'
  exit 0
fi

echo "== per-call time, median of $REPEATS runs x $ITERS calls, pinned to CPU 0 (ns)"
base=$(taskset -c 0 $B/bench_calls "$ITERS" "$REPEATS")
shim=$(LD_PRELOAD=$SHIM taskset -c 0 $B/bench_calls "$ITERS" "$REPEATS")
paste <(echo "$base") <(echo "$shim") | awk '{printf "%-24s without %7.1f  with %7.1f  added %7.1f\n", $1, $2, $4, $4-$2}'
rm -f $OUT/*.mtrace

echo "== per-call time, calling thread pinned to CPU 0, writer thread on another core (ns)"
base=$($B/bench_calls "$ITERS" "$REPEATS" split)
shim=$(LD_PRELOAD=$SHIM $B/bench_calls "$ITERS" "$REPEATS" split)
paste <(echo "$base") <(echo "$shim") | awk '{printf "%-24s without %7.1f  with %7.1f  added %7.1f\n", $1, $2, $4, $4-$2}'
rm -f $OUT/*.mtrace

if command -v valgrind >/dev/null; then
  echo "== instructions per call (callgrind, calling thread only, 20000 calls)"
  for fn in bench_loop_alloc:2 bench_loop_launch:1 bench_loop_cu_launch:1; do
    name=${fn%%:*}; per=${fn##*:}
    for mode in without with; do
      pre=""; [ $mode = with ] && pre="LD_PRELOAD=$SHIM"
      f=$OUT/cg.$name.$mode
      env $pre valgrind --tool=callgrind --callgrind-out-file=$f --toggle-collect=$name \
        $B/bench_calls 20000 1 >/dev/null 2>&1
      ir=$(grep -E '^(summary|totals):' $f | head -1 | awk '{print $2}')
      echo "$name $mode $(awk -v ir=$ir -v per=$per 'BEGIN{printf "%.1f", ir/20000/per}')"
    done
  done | awk '{k=$1; v[$1,$2]=$3; ks[k]=1} END{for (k in ks) printf "%-22s without %7.1f  with %7.1f  added %7.1f instr/call\n", k, v[k,"without"], v[k,"with"], v[k,"with"]-v[k,"without"]}'
  rm -f $OUT/*.mtrace
  echo "== writer-thread instructions per event (callgrind --separate-threads, 200000 cuLaunchKernel)"
  LD_PRELOAD=$SHIM valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file=$OUT/cgw \
    $B/bench_throughput 200000 1 >/dev/null 2>&1
  # Thread 1 is main, 2 the producer, 3 the writer (the only thread the shim starts).
  ir=$(grep -E '^(summary|totals):' $OUT/cgw-03 | head -1 | awk '{print $2}')
  awk -v ir=$ir 'BEGIN{printf "writer %.1f instr/event\n", ir/200000}'
  rm -f $OUT/cgw* $OUT/*.mtrace
else
  echo "valgrind not installed: no instruction counts" >&2
fi

echo "== throughput: $EVENTS cuLaunchKernel events, 1 and 2 producer threads (whole process, exit drain included)"
for t in 1 2; do
  per=$((EVENTS / t))
  s=$(date +%s.%N)
  MEMTRACE_QUIET=0 LD_PRELOAD=$SHIM $B/bench_throughput $per $t 2> $OUT/summary
  e=$(date +%s.%N)
  f=$(ls $OUT/*.mtrace)
  size=$(stat -c %s "$f")
  lost=$(sed -n 's/.*lost \([0-9]*\).*/\1/p' $OUT/summary)
  n=$((per * t))
  awk -v s=$s -v e=$e -v n=$n -v size=$size -v lost=$lost -v t=$t 'BEGIN{printf "threads %d: %.2f M events/s, lost %d, %.1f bytes/event (%d bytes)\n", t, n/(e-s)/1e6, lost, size/n, size}'
  rm -f $OUT/*.mtrace
done

echo "== idle: CPU time and thread wake-ups over a ${IDLE_SECONDS:=2} s sleep after one allocation"
for mode in without with; do
  pre=""; [ $mode = with ] && pre="LD_PRELOAD=$SHIM"
  echo "$mode $(env $pre $B/bench_idle "$IDLE_SECONDS")"
  rm -f $OUT/*.mtrace
done
