"""The wheel's `memsim` and `memest` console scripts: the Rust commands, run in this process
by the native module (`memsim_cli::main`, `memest_cli::main`), with the same behaviour and exit
statuses as the binaries, and the wheel's own GPU profiles (`binaries.native`)."""

from __future__ import annotations

import sys


def _run(name: str) -> None:
    from memtrace_trainer.binaries import native

    mod = native()  # also points $MEMTRACE_PROFILES at the profiles shipped in the wheel
    if mod is None:
        sys.exit(f"{name}: error: the memtrace wheel's native module is missing; reinstall it")
    sys.exit(getattr(mod, f"{name}_main")(sys.argv))


def memsim() -> None:
    _run("memsim")


def memest() -> None:
    _run("memest")
