#!/usr/bin/env bash
# Allocator replay throughput (memsim's model) and the speedup over a straightforward Python
# port of the same native rules, on the same generated request sequence.
# Usage: scripts/bench-replay.sh [EVENTS] [PYTHON_EVENTS]
set -euo pipefail
cd "$(dirname "$0")/.."
events=${1:-10000000}
py_events=${2:-1000000}
python=${PYTHON:-python3}
ops=$(mktemp)
trap 'rm -f "$ops"' EXIT

rust_out=$(cargo bench -q -p memtrace-simulator --bench replay -- --events "$events" --dump-ops "$ops" "$py_events")
echo "$rust_out"
py_out=$("$python" simulator/benches/replay_baseline.py "$ops")
echo "$py_out"

rust_sum=$(sed -n 's/^prefix:.*checksum \(0x[0-9a-f]*\)$/\1/p' <<<"$rust_out")
py_sum=$(sed -n 's/^python:.*checksum \(0x[0-9a-f]*\)$/\1/p' <<<"$py_out")
if [[ -z "$rust_sum" || "$rust_sum" != "$py_sum" ]]; then
    echo "error: the Python port placed blocks differently (checksums '$rust_sum' vs '$py_sum')" >&2
    exit 1
fi
rust_rate=$(sed -n 's/^replay:.* = \([0-9.]*\) M events\/s per CPU-second.*/\1/p' <<<"$rust_out")
py_rate=$(sed -n 's/^python:.* = \([0-9.]*\) M events\/s.*/\1/p' <<<"$py_out")
awk -v r="$rust_rate" -v p="$py_rate" 'BEGIN { printf "speedup: %.0fx per CPU-second (Rust %.1f M events/s on the full trace, Python %.3f M events/s on the prefix; identical placements on the prefix)\n", r / p, r, p }'
