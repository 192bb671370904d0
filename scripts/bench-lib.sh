# Sourced by the Python-side benchmarks (bench-api.sh, bench-llm.sh, bench-serve.sh,
# bench-trace.sh) after they `cd` to the repository root: the interpreter, where the binaries
# are, a check that names a missing one, and the median of a column of numbers.
# shellcheck shell=bash

PY=${PYTHON:-.venv/bin/python}
export MEMTRACE_BIN_DIR=${MEMTRACE_BIN_DIR:-$PWD/target/release}

# bench_runs NAME [N]: the script's own arguments; sets N, the number of runs (default 3), and
# exits 2 on anything but one positive whole number.
bench_runs() {
  local name=$1
  shift
  [ "$#" -le 1 ] || { echo "$name: expected at most one argument, the number of runs N; got $#: $*" >&2; exit 2; }
  N=${1:-3}
  [[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "$name: expected a positive whole number of runs N, got '$N'" >&2; exit 2; }
}

# bench_needs NAME TOOL...: exits 2 unless every TOOL is an executable in $MEMTRACE_BIN_DIR.
bench_needs() {
  local name=$1 tool
  shift
  for tool in "$@"; do
    [ -x "$MEMTRACE_BIN_DIR/$tool" ] || { echo "$name: no $tool in $MEMTRACE_BIN_DIR (cargo build --release)" >&2; exit 2; }
  done
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
