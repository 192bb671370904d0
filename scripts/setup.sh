#!/usr/bin/env bash
# Set up a fresh machine for memtrace: build the Rust workspace (crates from crates.io) and create
# the Python virtual environment at .venv with the trainer and its pinned requirements (torch from
# PyPI, which runs on CPU-only machines). Idempotent, and quick when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

say() { printf '[setup] %s\n' "$*" >&2; }

command -v cargo >/dev/null || { say "cargo not found: install a Rust toolchain (https://rustup.rs) first"; exit 1; }
command -v cc >/dev/null || { say "cc not found: install gcc (apt-get install -y gcc)"; exit 1; }
py=${PYTHON:-python3}
command -v "$py" >/dev/null || { say "$py not found: install Python >= 3.11"; exit 1; }

t0=$(date +%s)
say "building the Rust workspace (release): libmemtrace.so, memsim, memest"
cargo build --release --workspace --quiet
t_build=$(( $(date +%s) - t0 ))

venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
  say "creating $venv"
  "$py" -m venv "$venv"
fi
req="$root/trainer/requirements.txt"
stamp="$venv/.memtrace-requirements.sha256"
want=$(cat "$req" "$root/trainer/pyproject.toml" 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  say "installing Python requirements into .venv (torch from PyPI is about 3 GB the first time)"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r "$req"
  "$venv/bin/python" -m pip install --quiet --no-deps -e "$root/trainer"
  echo "$want" > "$stamp"
else
  say "Python requirements already installed"
fi
# The HTML report's test renders it in a real browser: Debian's Chromium.
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing Debian's chromium (the report's browser test)"
    if ! apt-get install -y -q chromium >/dev/null 2>&1; then
      apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1 \
        || say "could not install chromium: the browser test of the report will fail"
    fi
  else
    say "chromium not found and not root: install it (apt-get install chromium) for the report's browser test"
  fi
fi
# The phases' wall times: on a fresh machine setup is most of CI's time.
say "done: binaries in target/release, Python in .venv (Rust build ${t_build} s, Python and browser $(( $(date +%s) - t0 - t_build )) s)"
