"""Sweep the tracer's cuDNN workspace factor without re-tracing (docs/results.md).

The symbolic tracer gives each convolution call a transient workspace of factor x max(in, out)
bytes: an allocator request immediately followed by its free, category `workspace`. This script
rescales those requests in the traces of a `memest compare` run (made at factor 1.0) to k x their
size, optionally capped, replays each with `memsim replay`, re-fits `cudnn_mib` for each k by the
calibration rule (weighted median of truth - reserved - context - cuBLAS, weights 1/truth), and
prints the median relative error per k. Run it on calibration rows only; judge the chosen k on
other rows.

    python scripts/cudnn_factor_sweep.py out/cal-cnn --factors 1,2,3,4,6,8,12 --base-mib 1431
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 1 << 20
LT_BYTES = 1 << 20  # the per-call cuBLASLt workspace of torch 2.4, also `workspace`: left alone


def rescale(src: Path, dst: Path, factor: float, cap: float) -> None:
    recs = [json.loads(line) for line in src.read_text().splitlines()]
    for i, r in enumerate(recs):
        nxt = recs[i + 1] if i + 1 < len(recs) else {}
        transient = (
            r.get("kind") == "alloc"
            and r.get("category") == "workspace"
            and r["size"] != LT_BYTES
            and nxt.get("kind") == "free"
            and nxt.get("addr") == r["addr"]
        )
        if transient:
            r["size"] = int(min(r["size"] * factor, max(r["size"], cap)))
            if "size" in nxt:
                nxt["size"] = r["size"]
    dst.write_text("".join(json.dumps(r) + "\n" for r in recs))


def reserved(memsim: str, trace: Path) -> int:
    out = subprocess.run([memsim, "replay", str(trace), "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"memsim replay {trace}: {out.stderr.strip()}")
    return int(json.loads(out.stdout)["peak_reserved_bytes"])


def weighted_median(pairs: list[tuple[float, float]]) -> float:
    pairs.sort()
    total, acc = sum(w for _, w in pairs), 0.0
    for value, w in pairs:
        acc += w
        if acc >= total / 2:
            return value
    return pairs[-1][0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "run", type=Path, help="a `memest compare` output directory (runs.jsonl, traces/)"
    )
    ap.add_argument("--factors", default="1,2,3,4,6,8,12", help="factors k to try")
    ap.add_argument("--cap-mib", type=float, default=0.0, help="cap per workspace (0: none)")
    ap.add_argument("--base-mib", type=float, default=1431.0, help="context + cuBLAS, MiB")
    ap.add_argument("--memsim", default="target/release/memsim")
    a = ap.parse_args()
    runs = [json.loads(line) for line in (a.run / "runs.jsonl").read_text().splitlines()]
    runs = [r for r in runs if not r["real_oom"] and r["truth_bytes"]]
    runs = [r for r in runs if (a.run / "traces" / f"{r['id']}.jsonl").is_file()]
    if not runs:
        print(f"{a.run}: no measured run with a trace", file=sys.stderr)
        return 2
    cap = a.cap_mib * MIB if a.cap_mib > 0 else float("inf")
    base = a.base_mib * MIB
    print(f"{len(runs)} runs; base {a.base_mib} MiB; cap {a.cap_mib or 'none'} MiB")
    with tempfile.TemporaryDirectory() as tmp:
        for k in (float(x) for x in a.factors.split(",")):

            def peak(r: dict, k: float = k) -> int:
                dst = Path(tmp) / f"{r['id']}-{k}.jsonl"
                rescale(a.run / "traces" / f"{r['id']}.jsonl", dst, k, cap)
                return reserved(a.memsim, dst)

            with cf.ThreadPoolExecutor(4) as pool:
                peaks = list(pool.map(peak, runs))
            truth = [r["truth_bytes"] for r in runs]
            cudnn = weighted_median(
                [(t - p - base, 1 / t) for t, p in zip(truth, peaks, strict=True)]
            )
            errs = sorted(abs(p + base + cudnn - t) / t for t, p in zip(truth, peaks, strict=True))
            print(
                f"k {k:5.1f}  cudnn_mib {cudnn / MIB:7.0f}  MRE {statistics.median(errs):6.2%}  "
                f"P90 {errs[int(0.9 * len(errs))]:6.1%}  max {errs[-1]:6.1%}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
