"""Interleaved A/B timing of two (or more) memsim binaries on one trace (docs/benchmarks.md).

Each round runs every binary once, one after the other, as `BIN CMD TRACE --json` with the
output discarded, and takes the wall time (time.perf_counter) and the child's CPU time
(getrusage). Interleaving puts every binary through the same stretches of a machine whose
speed varies; the best, first quartile and median of each are printed.

    python3 scripts/bench-ab.py replay t.mtrace OLD_MEMSIM NEW_MEMSIM [ROUNDS]
"""

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    cmd, trace, *rest = argv[1:]
    rounds = 20
    if rest and rest[-1].isdigit():
        rounds = int(rest.pop())
    bins = rest
    if not bins or rounds < 1:
        print("bench-ab: expected CMD TRACE BIN... [ROUNDS >= 1]", file=sys.stderr)
        return 2
    if not os.path.isfile(trace):
        print(f"bench-ab: {trace}: no such trace file", file=sys.stderr)
        return 2
    missing = [b for b in bins if shutil.which(b) is None]
    if missing:
        print(f"bench-ab: not an executable: {', '.join(missing)}", file=sys.stderr)
        return 2
    wall: dict[str, list[float]] = {b: [] for b in bins}
    cpu: dict[str, list[float]] = {b: [] for b in bins}
    for _ in range(rounds):
        for b in bins:
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            run = subprocess.run([b, cmd, trace, "--json"], stdout=subprocess.DEVNULL)
            if run.returncode != 0:
                print(f"bench-ab: {b} {cmd} {trace} exited {run.returncode}", file=sys.stderr)
                return 2
            wall[b].append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[b].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    for b in bins:
        w, c = sorted(wall[b]), sorted(cpu[b])
        q = rounds // 4
        ms = [x * 1e3 for x in (w[0], w[q], statistics.median(w), c[0], c[q], statistics.median(c))]
        print(
            f"{cmd} {b}: wall best {ms[0]:.1f} q1 {ms[1]:.1f} med {ms[2]:.1f} ms; "
            f"cpu best {ms[3]:.1f} q1 {ms[4]:.1f} med {ms[5]:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
