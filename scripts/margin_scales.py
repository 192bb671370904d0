"""Conformal safety margins for one family under other scales than the shipped reserved peak.

Reads a `memest compare --out DIR` run (its runs.jsonl, and its traces/ for the largest cuDNN
workspace each symbolic trace took) and prints, per scale, the held-out miss rate, the median
over-reservation and the share of runs that ran (truth under --capacity-mib) the safe number
refuses, averaged over --splits random 50/50 splits with the rule `memest safety` uses
(a = 0.02, the ceil((n+1)(1-a))-th smallest score, clamped at 0). Rows the outside-allocator
constants were fitted on are left out, as there.

    python3 scripts/margin_scales.py /tmp/full-cnn --capacity-mib 40536
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path

MIB = 1 << 20
Row = dict[str, float]


def rows(out: Path) -> list[Row]:
    found = []
    for line in (out / "runs.jsonl").read_text().splitlines():
        r = json.loads(line)
        s = r["estimates"]["symbolic"]
        if not r["truth_bytes"] or s["device_bytes"] is None or r["calibrated_on"]:
            continue
        trace = out / "traces" / f"{r['id']}.jsonl"
        workspaces = re.findall(r"workspace=(\d+)", trace.read_text()) if trace.is_file() else []
        found.append({"truth": r["truth_bytes"], "point": s["device_bytes"],
                      "reserved": s["reserved_bytes"],
                      "workspace": max(map(int, workspaces), default=0)})  # fmt: skip
    return found


SCALES: dict[str, Callable[[Row], float]] = {
    "reserved peak (shipped)": lambda x: x["reserved"],
    "point": lambda x: x["point"],
    "largest traced cuDNN workspace": lambda x: max(x["workspace"], 1),
    "reserved peak + 1 GiB": lambda x: x["reserved"] + 1024 * MIB,
    "reserved peak^0.75": lambda x: x["reserved"] ** 0.75,
    "reserved peak^0.5": lambda x: x["reserved"] ** 0.5,
}


def evaluate(
    data: list[Row], scale: Callable[[Row], float], splits: int, cap: float
) -> list[float]:
    sums = [0.0, 0.0, 0.0]
    for seed in range(1, splits + 1):
        order = list(range(len(data)))
        random.Random(seed).shuffle(order)
        cal = [data[i] for i in order[: len(order) // 2]]
        held = [data[i] for i in order[len(order) // 2 :]]
        scores = sorted((x["truth"] - x["point"]) / scale(x) for x in cal)
        k = min(len(scores), math.ceil((len(scores) + 1) * 0.98)) - 1
        margin = max(scores[k], 0.0)

        def safe(x: Row, m: float = margin) -> float:
            return x["point"] + m * scale(x)

        ran = [x for x in held if x["truth"] < cap]
        sums[0] += sum(x["truth"] > safe(x) for x in held) / len(held)
        sums[1] += sorted(safe(x) / x["truth"] - 1 for x in held)[len(held) // 2]
        sums[2] += sum(safe(x) > cap for x in ran) / len(ran)
    return [s / splits for s in sums]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="a `memest compare --out` directory")
    p.add_argument("--capacity-mib", type=float, default=40536.0)
    p.add_argument("--splits", type=int, default=5)
    a = p.parse_args()
    if not (a.out / "runs.jsonl").is_file():
        print(f"error: {a.out}: no runs.jsonl (expected a `memest compare --out` directory)",
              file=sys.stderr)  # fmt: skip
        return 2
    data = rows(a.out)
    if len(data) < 4 or a.splits < 1:
        print(f"error: {a.out}: {len(data)} measured rows; expected at least 4", file=sys.stderr)
        return 2
    print(f"{len(data)} measured rows, {a.splits} splits")
    print("| scale | miss | median over | refused |\n|---|---|---|---|")
    for name, scale in SCALES.items():
        miss, over, refused = evaluate(data, scale, a.splits, a.capacity_mib * MIB)
        print(f"| {name} | {miss:.1%} | {over:.1%} | {refused:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
