"""Interleaved timing of commands in rounds (docs/benchmarks.md): one owner for the benchmarks'
timing, so that every binary or command meets the same stretches of a machine whose speed varies.

Each round runs every command once, one after the other, with its output discarded (its stderr
is kept), and takes the wall time (time.perf_counter) and the child's CPU time over all its
threads (getrusage). A command that fails stops the timing (exit 2).

Two memsim binaries on one trace, as `BIN CMD TRACE --json` (best, first quartile and median):

    python3 scripts/bench-ab.py replay t.mtrace OLD_MEMSIM NEW_MEMSIM [ROUNDS]

Any commands, each one shell-quoted string, one line each of `BEST_WALL MEDIAN_WALL
MEDIAN_CPU` in seconds, in the order given (scripts/bench-replay-e2e.sh):

    python3 scripts/bench-ab.py --rounds N 'CMD ARGS...' 'CMD ARGS...' ...
"""

import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time

USAGE = [line.strip() for line in __doc__.strip().splitlines() if line.startswith("    python3")]


class Failed(Exception):
    """A command was missing or exited non-zero."""


def rounds(commands: list[list[str]], n: int) -> list[tuple[list[float], list[float]]]:
    """Wall and CPU seconds of every run of each command, over `n` interleaved rounds."""
    missing = [c[0] for c in commands if shutil.which(c[0]) is None]
    if missing:
        raise Failed(f"not an executable: {', '.join(missing)}")
    times: list[tuple[list[float], list[float]]] = [([], []) for _ in commands]
    for _ in range(n):
        for c, (wall, cpu) in zip(commands, times, strict=True):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            run = subprocess.run(c, stdout=subprocess.DEVNULL)
            if run.returncode != 0:
                raise Failed(f"{shlex.join(c)} exited {run.returncode}")
            wall.append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return times


def ab(argv: list[str]) -> None:
    cmd, trace, *rest = argv
    n = int(rest.pop()) if rest and rest[-1].isdigit() else 20
    if not rest or n < 1:
        raise ValueError("expected CMD TRACE BIN... [ROUNDS >= 1]")
    if not os.path.isfile(trace):
        raise ValueError(f"{trace}: no such trace file")
    times = rounds([[b, cmd, trace, "--json"] for b in rest], n)
    for b, (wall, cpu) in zip(rest, times, strict=True):
        w, c = sorted(wall), sorted(cpu)
        q = n // 4
        ms = [x * 1e3 for x in (w[0], w[q], statistics.median(w), c[0], c[q], statistics.median(c))]
        print(
            f"{cmd} {b}: wall best {ms[0]:.1f} q1 {ms[1]:.1f} med {ms[2]:.1f} ms; "
            f"cpu best {ms[3]:.1f} q1 {ms[4]:.1f} med {ms[5]:.1f} ms"
        )


def each(argv: list[str]) -> None:
    if len(argv) < 3 or not argv[1].isdigit() or int(argv[1]) < 1:
        raise ValueError("expected --rounds N (N >= 1) and at least one command")
    commands = [shlex.split(c) for c in argv[2:]]
    if not all(commands):
        raise ValueError("an empty command")
    for wall, cpu in rounds(commands, int(argv[1])):
        print(f"{min(wall):.4f} {statistics.median(wall):.4f} {statistics.median(cpu):.4f}")


def main(argv: list[str]) -> int:
    try:
        if argv[1:2] == ["--rounds"]:
            each(argv[1:])
        elif len(argv) >= 4:
            ab(argv[1:])
        else:
            print("usage:\n  " + "\n  ".join(USAGE), file=sys.stderr)
            return 2
    except (ValueError, Failed) as e:
        print(f"bench-ab: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
