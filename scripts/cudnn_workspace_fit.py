"""Fit and cross-validate models of the per-call cuDNN convolution workspace (docs/results.md).

The symbolic tracer writes a `cudnn:<fwd|dgrad|wgrad> x=.. w=.. y=.. stride=.. groups=..
workspace=BYTES` marker before every convolution workspace (a `workspace` alloc immediately
followed by its free). This script reads the traces of a `memest compare` run, sets every
workspace to model(call shape; theta), replays each trace with `memsim replay`, re-fits the
profile's `cudnn_mib` by the calibration rule (weighted median of truth - reserved - context -
cuBLAS, weights 1/truth) and scores the mean relative error. Theta is found by coordinate search
on a grid. Each model is reported fitted on all rows and by k-fold cross-validation (fit on k-1
folds, errors on the held-out fold), so a model with more parameters has to earn them on rows it
did not see. Run it on calibration rows only.

    python scripts/cudnn_workspace_fit.py out/cal-cnn3 --models max,dir_sum,channels
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

MIB = 1 << 20
DIRECTIONS = {"fwd": 0, "dgrad": 1, "wgrad": 2}


def parse_marker(text: str) -> dict:
    head, *fields = text.split()
    kv = dict(f.split("=", 1) for f in fields)
    dims = lambda s: tuple(int(d) for d in s.split("x"))  # noqa: E731
    call = {"dir": head.split(":", 1)[1], "x": dims(kv["x"]), "w": dims(kv["w"])}
    call |= {"y": dims(kv["y"]), "groups": int(kv["groups"]), "workspace": int(kv["workspace"])}
    # The tracer's traces are fp32 here; the marker's dtype names it.
    size = {"float32": 4, "float16": 2, "bfloat16": 2}.get(kv.get("dtype", "float32"), 4)
    call["xb"], call["yb"] = size * math.prod(call["x"]), size * math.prod(call["y"])
    call["wb"] = size * math.prod(call["w"])
    call["channels"] = max(call["w"][0], call["w"][1] * call["groups"])
    return call


class Run:
    """One measured run: its trace records and, per convolution call, the indices of the
    workspace alloc and free (None when the traced workspace was empty)."""

    def __init__(self, rid: str, truth: float, trace: Path) -> None:
        self.id, self.truth = rid, truth
        self.records = [json.loads(line) for line in trace.read_text().splitlines()]
        self.calls: list[tuple[int | None, dict]] = []
        for i, r in enumerate(self.records):
            if r.get("kind") != "marker" or not r["text"].startswith("cudnn:"):
                continue
            call = parse_marker(r["text"])
            nxt = self.records[i + 1 : i + 3]
            paired = (
                len(nxt) == 2
                and nxt[0].get("kind") == "alloc"
                and nxt[0].get("category") == "workspace"
                and nxt[1].get("kind") == "free"
                and nxt[1].get("addr") == nxt[0].get("addr")
            )
            if call["workspace"] > 0 and not paired:
                raise SystemExit(f"{trace}: record {i}: marker not followed by its workspace pair")
            self.calls.append((i + 1 if call["workspace"] > 0 else None, call))

    def reserved(self, sizes: list[int], memsim: str, tmp: str) -> int:
        recs = list(self.records)
        drop: set[int] = set()
        for (at, _), size in zip(self.calls, sizes, strict=True):
            if at is None:
                continue
            if size <= 0:
                drop |= {at, at + 1}
            else:
                recs[at] = recs[at] | {"size": size}
                recs[at + 1] = recs[at + 1] | {"size": size}
        fd, path = tempfile.mkstemp(dir=tmp, suffix=".jsonl")
        with os.fdopen(fd, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for j, r in enumerate(recs) if j not in drop))
        try:
            out = subprocess.run([memsim, "replay", path, "--json"], capture_output=True, text=True)
        finally:
            os.unlink(path)
        if out.returncode != 0:
            raise SystemExit(f"memsim replay ({self.id}): {out.stderr.strip()}")
        return int(json.loads(out.stdout)["peak_reserved_bytes"])


Model = Callable[[dict, list[float]], float]
COEF = [0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _bucket(c: dict) -> int:
    return sum(c["channels"] >= b for b in (128, 512, 1024))


# name: (workspace bytes of a call, initial theta, grid per parameter, what it stands for)
MODELS: dict[str, tuple[Model, list[float], list[list[float]], str]] = {
    "max": (
        lambda c, t: t[0] * max(c["xb"], c["yb"]),
        [2.0],
        [COEF],
        "k x max(in, out) (the shipped form)",
    ),
    "dir_max": (
        lambda c, t: t[DIRECTIONS[c["dir"]]] * max(c["xb"], c["yb"]),
        [2.0] * 3,
        [COEF] * 3,
        "k per direction x max(in, out)",
    ),
    "dir_sum": (
        lambda c, t: t[DIRECTIONS[c["dir"]]] * (c["xb"] + c["yb"]),
        [1.0] * 3,
        [COEF] * 3,
        "k per direction x (in + out) (Winograd/FFT transforms of both)",
    ),
    "dir_sum_weight": (
        lambda c, t: t[DIRECTIONS[c["dir"]]] * (c["xb"] + c["yb"]) + t[3] * c["wb"],
        [1.0] * 3 + [0.0],
        [COEF] * 3 + [[0.0, 10.0, 30.0, 100.0, 300.0]],
        "k per direction x (in + out) + b x weight (FFT-transformed filters)",
    ),
    "channels": (
        lambda c, t: t[_bucket(c)] * (c["xb"] + c["yb"]),
        [1.0] * 4,
        [COEF] * 4,
        "k per widest-channel bucket (<128, <512, <1024, more) x (in + out)",
    ),
}


class Fitter:
    def __init__(self, runs: list[Run], base: float, memsim: str, tmp: str, jobs: int) -> None:
        self.runs, self.base, self.memsim, self.tmp = runs, base, memsim, tmp
        self.pool = cf.ThreadPoolExecutor(jobs)

    def peaks(self, model: Model, theta: list[float], runs: list[Run]) -> list[int]:
        def one(r: Run) -> int:
            sizes = [int(model(c, theta)) for _, c in r.calls]
            return r.reserved(sizes, self.memsim, self.tmp)

        return list(self.pool.map(one, runs))

    def constant(self, runs: list[Run], peaks: list[int]) -> float:
        pairs = sorted(
            (r.truth - p - self.base, 1 / r.truth) for r, p in zip(runs, peaks, strict=True)
        )
        total, acc = sum(w for _, w in pairs), 0.0
        for value, w in pairs:
            acc += w
            if acc >= total / 2:
                return max(0.0, value)
        return max(0.0, pairs[-1][0])

    def errors(self, runs: list[Run], peaks: list[int], const: float) -> list[float]:
        pairs = zip(runs, peaks, strict=True)
        return [(p + self.base + const - r.truth) / r.truth for r, p in pairs]

    def fit(self, name: str, runs: list[Run], rounds: int = 2) -> tuple[list[float], float]:
        model, theta, grid, _ = MODELS[name]
        theta = list(theta)
        for _ in range(rounds):
            for i, values in enumerate(grid):
                scored = []
                for v in values:
                    t = [*theta[:i], v, *theta[i + 1 :]]
                    peaks = self.peaks(model, t, runs)
                    e = self.errors(runs, peaks, self.constant(runs, peaks))
                    scored.append((statistics.mean(abs(x) for x in e), v))
                theta[i] = min(scored)[1]
        peaks = self.peaks(model, theta, runs)
        return theta, self.constant(runs, peaks)


def summary(e: list[float]) -> str:
    a = sorted(abs(v) for v in e)
    p90 = a[int(0.9 * (len(a) - 1))]
    under = sum(v < 0 for v in e) / len(e)
    return (
        f"MRE {statistics.median(a):6.2%}  mean {statistics.mean(a):6.2%}  P90 {p90:6.1%}  "
        f"max {a[-1]:6.1%}  under {under:4.0%}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a `memest compare` output directory")
    ap.add_argument("--models", default=",".join(MODELS), help=f"any of {', '.join(MODELS)}")
    ap.add_argument("--folds", type=int, default=3, help="cross-validation folds (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="fold assignment seed")
    ap.add_argument("--base-mib", type=float, default=1431.0, help="context + cuBLAS, MiB")
    ap.add_argument("--memsim", default="target/release/memsim")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    names = a.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        known = ", ".join(MODELS)
        print(f"--models: unknown {', '.join(unknown)} (known: {known})", file=sys.stderr)
        return 2
    listing = a.run / "runs.jsonl"
    if not listing.is_file():
        print(f"{listing}: not found (expected a `memest compare --out` folder)", file=sys.stderr)
        return 2
    runs = []
    for line in listing.read_text().splitlines():
        r = json.loads(line)
        trace = a.run / "traces" / f"{r['id']}.jsonl"
        if not r["real_oom"] and r["truth_bytes"] and trace.is_file():
            runs.append(Run(r["id"], r["truth_bytes"], trace))
    if not any(r.calls for r in runs):
        print(f"{a.run}: no trace has cudnn: markers (re-trace with this tracer)", file=sys.stderr)
        return 2
    order = list(range(len(runs)))
    random.Random(a.seed).shuffle(order)
    folds = [order[i :: a.folds] for i in range(a.folds)]
    print(f"{len(runs)} measured runs with traces; {a.folds}-fold CV, seed {a.seed}")
    with tempfile.TemporaryDirectory() as tmp:
        fitter = Fitter(runs, a.base_mib * MIB, a.memsim, tmp, a.jobs)
        for name in names:
            theta, const = fitter.fit(name, runs)
            peaks = fitter.peaks(MODELS[name][0], theta, runs)
            print(f"{name:15} {MODELS[name][3]}")
            print(f"  all rows  theta {theta} cudnn_mib {const / MIB:.0f}")
            print(f"            {summary(fitter.errors(runs, peaks, const))}")
            held_out: list[float] = []
            for fold in folds:
                test = [runs[i] for i in fold]
                train = [runs[i] for i in order if i not in set(fold)]
                theta, const = fitter.fit(name, train)
                peaks = fitter.peaks(MODELS[name][0], theta, test)
                held_out += fitter.errors(test, peaks, const)
            print(f"  CV        {summary(held_out)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
