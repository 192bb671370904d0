"""The wheel's `memsim` and `memest` console scripts: the Rust commands, run in this process
by the native module (`memsim_cli::main`, `memest_cli::main`), with the same behaviour and exit
statuses as the binaries."""

from __future__ import annotations

import sys


def memsim() -> None:
    from memtrace import _native

    sys.exit(_native.memsim_main(sys.argv))


def memest() -> None:
    from memtrace import _native

    sys.exit(_native.memest_main(sys.argv))
