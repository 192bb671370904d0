#!/usr/bin/env bash
# Warm `serve` estimates against the cold CLI run alongside (docs/benchmarks.md): ResNet-50 at
# batch 32 on the A100 profile. Target (issue 19): a warm estimate <= 1/4 of the cold CLI's time
# and under 1.5 s.
#
# One server on a Unix socket (its start-up, the imports and one warm-up estimate, is reported
# apart); then N rounds, each one cold `python -m memtrace_trainer estimate ... --json` and one
# request to the server for the same job, timed by curl from send to last byte. Every warm answer
# is checked against the cold one (all but `seconds`).
#
#   scripts/bench-serve.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_runs bench-serve "$@"
bench_needs bench-serve memsim memest
command -v curl >/dev/null || { echo "bench-serve: curl not found" >&2; exit 2; }
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
sock="$tmp/serve.sock"
job='{"model": "torchvision:resnet50", "batch_size": 32, "profile": "a100-40gb"}'

s=$(date +%s.%N)
"$PY" -m memtrace_trainer serve --socket "$sock" 2> "$tmp/serve.log" &
pid=$!
until grep -q 'listening on' "$tmp/serve.log"; do
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/serve.log" >&2; echo "bench-serve: serve did not start" >&2; exit 2; }
  sleep 0.2
done
startup=$(echo "$(date +%s.%N) - $s" | bc -l)

for i in $(seq "$N"); do
  s=$(date +%s.%N)
  "$PY" -m memtrace_trainer estimate --model torchvision:resnet50 --batch-size 32 \
    --profile a100-40gb --json > "$tmp/cold-$i.json" 2>/dev/null || [ $? -eq 1 ]
  echo "$(date +%s.%N) - $s" | bc -l >> "$tmp/cold"
  code=$(curl -s --unix-socket "$sock" -o "$tmp/warm-$i.json" -w '%{http_code} %{time_total}' \
    -H 'Content-Type: application/json' -d "$job" http://localhost/v1/estimate)
  [ "${code%% *}" = 200 ] || { echo "bench-serve: HTTP $code: $(cat "$tmp/warm-$i.json")" >&2; exit 2; }
  echo "${code#* }" >> "$tmp/warm"
  "$PY" - "$tmp/cold-$i.json" "$tmp/warm-$i.json" <<'PY'
import json, sys
cold, warm = (json.load(open(p)) for p in sys.argv[1:])
diff = [k for k in cold.keys() | warm.keys() if k != "seconds" and cold.get(k) != warm.get(k)]
if diff:
    sys.exit(f"bench-serve: the warm answer differs from the cold CLI's in {sorted(diff)}")
PY
done

c=$(median < "$tmp/cold"); w=$(median < "$tmp/warm")
printf 'serve start-up (imports, warm-up estimate): %.2f s\n' "$startup"
printf 'cold CLI estimate ResNet-50 b32: %.2f s (median of %d)\n' "$c" "$N"
printf 'warm serve estimate ResNet-50 b32: %.2f s (median of %d; runs %s s), %.1fx faster than the cold CLI (%.2f of its time); same answers\n' \
  "$w" "$N" "$(paste -sd' ' "$tmp/warm" | xargs printf '%.2f ' | sed 's/ $//')" "$(echo "$c / $w" | bc -l)" "$(echo "$w / $c" | bc -l)"
