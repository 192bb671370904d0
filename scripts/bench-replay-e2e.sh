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

# The three commands run RUNS times in rounds (the reference, replay, stats, then again), so
# that a slow stretch of the machine meets all three alike; scripts/bench-ab.py times them: for
# each, the best and the median wall time (the best is what the code can do; the median says how
# dependable that is on a machine whose speed varies) and the median CPU time over all threads.
# CPU over wall says how many cores a command got: memsim decodes on a second thread, so on a
# machine that lends it one core for a while its wall time is its CPU time, and the ratio to the
# single-threaded reference drops. The peak resident set (KiB) comes from one more run under
# /usr/bin/time, whose own start-up (about 1.5 ms) and 10 ms steps would blur a 0.1 s figure.
rss() { { /usr/bin/time -f "%M" "$@" >/dev/null; } 2>&1 | tail -1; }

# The machine's steal time (CPU time the hypervisor gave to others) over the timed runs, as a
# share of all CPU time: a high share marks a slow stretch.
steal() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print $9, t }' /proc/stat; }

py_cmd=("$python" simulator/benches/replay_baseline.py --trace "$dir/t.jsonl")
replay_cmd=("$memsim" replay "$dir/t.mtrace" --json)
stats_cmd=("$memsim" stats "$dir/t.mtrace" --json)
read -r steal0 total0 < <(steal)
"$python" scripts/bench-ab.py --rounds "$runs" "${py_cmd[*]@Q}" "${replay_cmd[*]@Q}" "${stats_cmd[*]@Q}" >"$dir/times"
read -r steal1 total1 < <(steal)
{ read -r py_s py_med py_cpu; read -r replay_s replay_med replay_cpu; read -r stats_s stats_med stats_cpu; } <"$dir/times"
replay_kb=$(rss "${replay_cmd[@]}")
stats_kb=$(rss "${stats_cmd[@]}")
py_peak=$("${py_cmd[@]}" | sed -n 's/.*peak reserved bytes \([0-9]*\).*/\1/p')
rust_peak=$("$memsim" replay "$dir/t.mtrace" --json | "$python" -c 'import json,sys; print(json.load(sys.stdin)["peak_reserved_bytes"])')
if [[ "$py_peak" != "$rust_peak" ]]; then
  echo "error: the Python reference's peak reserved ($py_peak) differs from memsim's ($rust_peak)" >&2
  exit 1
fi
awk -v a="$allocs" -v r="$records" -v by="$bytes" -v py="$py_s" -v rs="$replay_s" -v rk="$replay_kb" \
    -v ss="$stats_s" -v sk="$stats_kb" -v peak="$rust_peak" -v pym="$py_med" -v rsm="$replay_med" \
    -v ssm="$stats_med" -v n="$runs" -v pyc="$py_cpu" -v rc="$replay_cpu" -v sc="$stats_cpu" \
    -v st="$((steal1 - steal0))" -v tot="$((total1 - total0))" 'BEGIN {
  printf "trace: %d allocations, %d records, %.1f MB .mtrace; peak reserved %.0f B (memsim = Python)\n", a, r, by / 1e6, peak
  printf "python reference (JSON Lines + replay): %.2f s\n", py
  printf "memsim replay: %.4f s (max RSS %.1f MiB) = %.0fx the Python reference\n", rs, rk / 1024, py / rs
  printf "memsim stats:  %.4f s (max RSS %.1f MiB) = %.1f M records/s\n", ss, sk / 1024, r / ss / 1e6
  printf "medians of the %d runs: python %.2f s, replay %.4f s = %.0fx, stats %.4f s = %.1f M records/s\n", \
    n, pym, rsm, pym / rsm, ssm, r / ssm / 1e6
  printf "median CPU seconds (all threads): python %.2f s, replay %.4f s (%.2f cores), stats %.4f s (%.2f cores)\n", \
    pyc, rc, rc / rsm, sc, sc / ssm
  printf "by CPU seconds (the work done, on any number of cores): replay %.0fx the Python reference, stats %.1f M records per CPU second\n", \
    pyc / rc, r / sc / 1e6
  printf "steal time during the runs: %.1f%% of the machine'"'"'s CPU time\n", tot ? 100 * st / tot : 0
}'
