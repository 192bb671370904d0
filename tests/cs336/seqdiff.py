"""Allocation sequence of a recorded window or of a trace's iter:0, one event a line, to diff.

    python tests/cs336/seqdiff.py SNAPSHOT.pickle [MIN_BYTES] > rec.seq
    python tests/cs336/seqdiff.py TRACE.jsonl [MIN_BYTES] > pred.seq
    diff <(cut -d' ' -f1,2 rec.seq) <(cut -d' ' -f1,2 pred.seq)

Lines: `A|F size id live`. `id` numbers the window's allocations in order; `S<n>` is a block
allocated before the window. `live` is the live requested bytes relative to the window's start.
The first line gives the window's peak growth and where it happens.
"""

from __future__ import annotations

import json
import pickle
import sys
from collections.abc import Iterator


def snapshot_events(path: str) -> Iterator[tuple[str, int, int]]:
    with open(path, "rb") as f:
        trace = pickle.load(f)["device_traces"][0]
    for e in trace:
        if e["action"] == "alloc":
            yield "A", e["addr"], e["size"]
        elif e["action"] == "free_completed":
            yield "F", e["addr"], e["size"]


def trace_events(path: str) -> Iterator[tuple[str, int, int]]:
    started = False
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            if e.get("kind") == "marker" and e.get("text") == "iter:0":
                started = True
            if not started:
                continue
            if e["kind"] == "alloc":
                yield "A", e["addr"], e["size"]
            elif e["kind"] == "free":
                yield "F", e["addr"], e["size"]


def main() -> None:
    path = sys.argv[1]
    min_bytes = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    events = snapshot_events(path) if path.endswith((".pickle", ".pkl")) else trace_events(path)
    ids: dict[int, int] = {}
    n = pre = live = peak = peak_at = 0
    lines: list[str] = []
    for kind, addr, size in events:
        if kind == "A":
            n += 1
            ids[addr] = n
            name = str(n)
            live += size
        else:
            if addr in ids:
                name = str(ids.pop(addr))
            else:
                pre += 1
                name = f"S{pre}"
            live -= size
        if size >= min_bytes:
            lines.append(f"{kind} {size} {name} {live}")
        if live > peak:
            peak, peak_at = live, len(lines)
    print(f"# window growth peak {peak} at line {peak_at}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
