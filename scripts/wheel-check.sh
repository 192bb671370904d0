#!/usr/bin/env bash
# The wheel, as a user gets it: `pip install .` at the repository root (maturin builds the native
# module and the shim) into a fresh virtual environment, then the API tests run from outside the
# source tree: tests/wheel/wheel_checks.py (the wheel's own checks: in-process commands, console scripts, the
# preload library) and trainer/tests/test_python_api.py (the API, docs/python-api.md's doctest).
# The fresh environment takes torch and the other large requirements from .venv (a .pth line),
# so that only memtrace itself is installed anew. Prints a pytest summary line; exits non-zero
# on any failure.
#
#   scripts/wheel-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
py=${PYTHON:-$root/.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv "$tmp/venv"
site=$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
deps=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$deps" > "$site/memtrace-check-deps.pth"
echo "[wheel-check] pip install . (maturin: the native module and libmemtrace.so)" >&2
"$tmp/venv/bin/python" -m pip install --quiet --no-deps "$root"
cd "$tmp"
# Outside the source tree, with no binaries to fall back on: every command must come from the wheel.
env -u MEMTRACE_BIN_DIR PATH="$tmp/venv/bin:/usr/bin:/bin" \
  "$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$tmp" \
  "$root/tests/wheel/wheel_checks.py" "$root/trainer/tests/test_python_api.py"
