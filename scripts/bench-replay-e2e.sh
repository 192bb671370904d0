#!/usr/bin/env bash
# `memsim replay` and `memsim stats` end to end (process start, reading the file, decoding,
# replaying, the report) against the Python reference run alongside on the same trace
# (docs/benchmarks.md). The trace is synthetic and shaped like a converted PyTorch snapshot:
# ALLOCS allocations, each freed as free_requested + free_completed, so 300,000 allocations make
# about 900,000 records (simulator/benches/make_trace.py). The Python reference
# (simulator/benches/replay_baseline.py --trace) reads the same trace's JSON Lines form and
# applies the same native rules; both must report the same peak reserved bytes.
#
#   scripts/bench-replay-e2e.sh [ALLOCS] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
allocs=${1:-300000}
runs=${2:-5}
python=${PYTHON:-python3}
for v in "$allocs" "$runs"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "bench-replay-e2e: expected positive integers ALLOCS RUNS, got '$v'" >&2; exit 2; }
done
cargo build -q --release -p memsim
memsim=$PWD/target/release/memsim
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$python" simulator/benches/make_trace.py "$allocs" "$dir/t.jsonl" >/dev/null
"$memsim" convert "$dir/t.jsonl" "$dir/t.mtrace" >/dev/null 2>&1
records=$("$memsim" stats "$dir/t.mtrace" --json | "$python" -c 'import json,sys; print(json.load(sys.stdin)["events"])')
bytes=$(stat -c %s "$dir/t.mtrace")

# Best and median of RUNS wall seconds of a command (a nanosecond clock around the command
# alone), and its peak resident set (KiB) from one more run under /usr/bin/time, whose own
# start-up (about 1.5 ms) and 10 ms steps would blur a 0.1 s figure. The best is what the code
# can do; the median says how dependable that is on a machine whose speed varies.
best() {
  local t0 t1 kb times=()
  for _ in $(seq "$runs"); do
    t0=$(date +%s%N)
    "$@" >/dev/null
    t1=$(date +%s%N)
    times+=("$(awk -v a="$t0" -v z="$t1" 'BEGIN { printf "%.4f", (z - a) / 1e9 }')")
  done
  kb=$( { /usr/bin/time -f "%M" "$@" >/dev/null; } 2>&1 | tail -1)
  printf '%s\n' "${times[@]}" | sort -g | awk -v kb="$kb" '{ t[NR] = $1 } END {
    m = (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
    printf "%.4f %.4f %s\n", t[1], m, kb }'
}

read -r py_s py_med _ < <(best "$python" simulator/benches/replay_baseline.py --trace "$dir/t.jsonl")
py_peak=$("$python" simulator/benches/replay_baseline.py --trace "$dir/t.jsonl" | sed -n 's/.*peak reserved bytes \([0-9]*\).*/\1/p')
read -r replay_s replay_med replay_kb < <(best "$memsim" replay "$dir/t.mtrace" --json)
read -r stats_s stats_med stats_kb < <(best "$memsim" stats "$dir/t.mtrace" --json)
rust_peak=$("$memsim" replay "$dir/t.mtrace" --json | "$python" -c 'import json,sys; print(json.load(sys.stdin)["peak_reserved_bytes"])')
if [[ "$py_peak" != "$rust_peak" ]]; then
  echo "error: the Python reference's peak reserved ($py_peak) differs from memsim's ($rust_peak)" >&2
  exit 1
fi
awk -v a="$allocs" -v r="$records" -v by="$bytes" -v py="$py_s" -v rs="$replay_s" -v rk="$replay_kb" \
    -v ss="$stats_s" -v sk="$stats_kb" -v peak="$rust_peak" -v pym="$py_med" -v rsm="$replay_med" \
    -v ssm="$stats_med" -v n="$runs" 'BEGIN {
  printf "trace: %d allocations, %d records, %.1f MB .mtrace; peak reserved %.0f B (memsim = Python)\n", a, r, by / 1e6, peak
  printf "python reference (JSON Lines + replay): %.2f s\n", py
  printf "memsim replay: %.4f s (max RSS %.1f MiB) = %.0fx the Python reference\n", rs, rk / 1024, py / rs
  printf "memsim stats:  %.4f s (max RSS %.1f MiB) = %.1f M records/s\n", ss, sk / 1024, r / ss / 1e6
  printf "medians of the %d runs: python %.2f s, replay %.4f s = %.0fx, stats %.4f s = %.1f M records/s\n", \
    n, pym, rsm, pym / rsm, ssm, r / ssm / 1e6
}'
