#!/usr/bin/env bash
# Run every test of the project: formatting and lints, the Rust workspace's tests, the Python
# package's tests and the end-to-end tests. Sets the machine up first (scripts/setup.sh).
# Prints which suites ran and how many tests passed, and exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
started=$(date +%s)
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT

bash scripts/setup.sh

passed=0; failed=0; skipped=0; status=0
# Each summary line ends with its step's wall time, so that a slow CI run says where it went.
summary=("setup (release build, .venv): $(( $(date +%s) - started )) s")
step() { printf '\n== %s\n' "$*"; step_t0=$(date +%s); }
took() { printf '(%d s)' "$(( $(date +%s) - step_t0 ))"; }

step "cargo fmt --check"
if cargo fmt --all --check; then summary+=("rustfmt: ok $(took)"); else summary+=("rustfmt: FAILED $(took)"); status=1; fi

step "cargo clippy --workspace --all-targets -- -D warnings"
if cargo clippy --workspace --all-targets --quiet -- -D warnings; then summary+=("clippy: ok $(took)"); else summary+=("clippy: FAILED $(took)"); status=1; fi

step "cargo test --workspace"
# The shim's tests preload the release libmemtrace.so built by setup.sh.
export MEMTRACE_SHIM="$root/target/release/libmemtrace.so"
set +e
cargo test --workspace --release 2>&1 | tee "$log_dir/cargo.log"
rc=${PIPESTATUS[0]}
set -e
read -r p f i < <(awk '/^test result:/ {for (k=1;k<=NF;k++) {if ($k ~ /^passed;?$/) p+=$(k-1); if ($k ~ /^failed;?$/) f+=$(k-1); if ($k ~ /^ignored;?$/) i+=$(k-1)}} END {print p+0, f+0, i+0}' "$log_dir/cargo.log")
passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + i))
summary+=("cargo test: $p passed, $f failed, $i ignored $(took)")
if [ "$rc" -ne 0 ]; then status=1; [ "$f" -eq 0 ] && failed=$((failed + 1)); fi
if [ "$i" -ne 0 ]; then grep -E '^test .* ignored' "$log_dir/cargo.log" | sed 's/^/  ignored: /' || true; fi

py="$root/.venv/bin/python"
step "ruff (Python: trainer, tests, scripts)"
if "$py" -m ruff format --check trainer tests scripts && "$py" -m ruff check trainer tests scripts; then summary+=("ruff: ok $(took)"); else summary+=("ruff: FAILED $(took)"); status=1; fi

# Counts a pytest run from its log: NAME LOG EXIT_STATUS.
tally() {
  local name=$1 log=$2 rc=$3 line p f e s
  line=$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$log" | tail -n 1 || true)
  p=$(echo "$line" | grep -oE '[0-9]+ passed' | cut -d' ' -f1 || true)
  f=$(echo "$line" | grep -oE '[0-9]+ failed' | cut -d' ' -f1 || true)
  e=$(echo "$line" | grep -oE '[0-9]+ errors?' | cut -d' ' -f1 || true)
  s=$(echo "$line" | grep -oE '[0-9]+ skipped' | cut -d' ' -f1 || true)
  p=${p:-0}; f=$(( ${f:-0} + ${e:-0} )); s=${s:-0}
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  summary+=("pytest $name: $p passed, $f failed, $s skipped $(took)")
  # pytest exits 5 when it collected nothing: that is a failure here, not a pass.
  if [ "$rc" -ne 0 ]; then status=1; [ "$f" -eq 0 ] && failed=$((failed + 1)); fi
  return 0
}

# Two runs: each test directory has its own conftest.py.
pytest_suite() {
  local name=$1; shift
  step "pytest ($name)"
  set +e
  # --durations: the slowest tests of each suite, for keeping CI inside its time budget.
  MEMTRACE_BIN_DIR="$root/target/release" "$py" -m pytest -q -rs --durations=10 "$@" 2>&1 | tee "$log_dir/pytest.log"
  local rc=${PIPESTATUS[0]}
  set -e
  tally "$name" "$log_dir/pytest.log" "$rc"
}
pytest_suite trainer trainer/tests
pytest_suite end-to-end tests

# The wheel: `pip install .` into a fresh virtual environment, its tests run from outside the
# source tree (scripts/wheel-check.sh).
step "pytest (wheel: pip install . in a fresh venv)"
set +e
bash scripts/wheel-check.sh 2>&1 | tee "$log_dir/wheel.log"
rc=${PIPESTATUS[0]}
set -e
tally wheel "$log_dir/wheel.log" "$rc"

printf '\n== summary\n'
printf '  %s\n' "${summary[@]}"
if [ "$skipped" -ne 0 ]; then printf '  skipped or ignored tests are listed above with their reasons\n'; fi
printf '  duration: %d s\n' "$(( $(date +%s) - started ))"
printf '%d passed, %d failed, %d skipped\n' "$passed" "$failed" "$skipped"
exit "$status"
