"""Checks a gpu-check.sh run: traces (JSON Lines, converted from .mtrace) against the snapshots
and memory stats the same runs took. Prints a short table; exits 1 if any check fails.

Caching runs (default, expandable): every snapshot segment (segment_alloc / segment_map) must be
a traced cudaMalloc / cuMemMap at the same address and size; the peak of exactly those traced
allocations must equal reserved_bytes.all.peak; other traced device allocations are listed by
caller module. No-caching run: the trace is marked caching_disabled, and when memsim is given,
its replay must reproduce the default run's peak reserved bytes and its segments per pool
(count and bytes; memsim replay does not report their order).
"""

import argparse
import json
import os
import pickle
import subprocess
import sys

MiB = 1 << 20


def load_trace(path):
    header, recs, names = None, [], {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "header":
                header = r
            elif r["kind"] == "name":
                names[r["id"]] = r["text"]
            else:
                recs.append(r)
    return header, recs, names


def snapshot_segments(snap):
    out = []
    for dev in snap.get("device_traces", []):
        for e in dev:
            if e.get("action") in ("segment_alloc", "segment_map"):
                out.append((e["action"], e["addr"], e["size"]))
    return out


def check_caching(mode, d):
    header, recs, names = load_trace(os.path.join(d, "trace.jsonl"))
    with open(os.path.join(d, "snapshot.pickle"), "rb") as f:
        snap = pickle.load(f)
    with open(os.path.join(d, "stats.json")) as f:
        reserved_peak = json.load(f)["reserved_bytes.all.peak"]
    traced = {}
    for r in recs:
        if r.get("result", 0):
            continue
        if r["kind"] == "alloc" and r["api"] == "cudaMalloc":
            traced.setdefault((r["addr"], r["size"]), r)
        if r["kind"] == "vmm" and r["op"] == "map":
            traced.setdefault((r["addr"], r["size"]), r)
    segs = snapshot_segments(snap)
    missing = [(a, addr, size) for a, addr, size in segs if (addr, size) not in traced]
    seg_keys = {(addr, size) for _, addr, size in segs}
    # Peak over time of exactly the traced allocations that are snapshot segments.
    live, peak, maps = 0, 0, {}
    allocs = {}
    for r in recs:
        if r.get("result", 0):
            continue
        k = r["kind"]
        if k == "alloc" and r["api"] == "cudaMalloc" and (r["addr"], r["size"]) in seg_keys:
            allocs[r["addr"]] = r["size"]
            live += r["size"]
        elif k == "free" and r["api"] == "cudaFree" and r["addr"] in allocs:
            live -= allocs.pop(r["addr"])
        elif k == "vmm" and r["op"] == "map" and (r["addr"], r["size"]) in seg_keys:
            maps[r["addr"]] = r["size"]
            live += r["size"]
        elif k == "vmm" and r["op"] == "unmap" and r["addr"] in maps:
            live -= maps.pop(r["addr"])
        peak = max(peak, live)
    others = {}
    for r in recs:
        if (
            r["kind"] == "alloc"
            and not r.get("result", 0)
            and r["mem"] in ("device", "managed", "physical")
        ):
            if (r["addr"], r["size"]) in seg_keys or r["mem"] == "physical":
                continue
            mod = names.get(r.get("caller"), "?")
            c, b = others.get(mod, (0, 0))
            others[mod] = (c + 1, b + r["size"])
    ok = not missing and peak == reserved_peak and not header.get("caching_disabled", False)
    other = ", ".join(f"{m}: {c} allocs {b} B" for m, (c, b) in sorted(others.items())) or "none"
    detail = f"missing {missing[:3]}" if missing else ""
    # Kernel counts, interposition against CUPTI (the default run traces with MEMTRACE_CUPTI=1).
    # Reported, not judged: a graph launch is one launch but many executions, and CUPTI is
    # unavailable under another profiler.
    launches = sum(1 for r in recs if r["kind"] == "launch" and not r.get("result", 0))
    execs = sum(1 for r in recs if r["kind"] == "kernel_exec")
    if execs or launches:
        kernels = f"kernels: {launches} launches, {execs} CUPTI executions"
        detail = f"{detail}; {kernels}" if detail else kernels
    # CUPTI MEMORY2 device allocations against interposition: reported, not judged (whether CUPTI
    # reports VMM memory is what this shows).
    cupti = [
        (r["addr"], r["size"])
        for r in recs
        if r["kind"] == "mem_activity" and r["op"] == "allocation" and r["memory_kind"] == "device"
    ]
    if cupti:
        traced_dev = {
            (r["addr"], r["size"])
            for r in recs
            if r["kind"] == "alloc" and not r.get("result", 0) and r["mem"] in ("device", "managed")
        }
        maps = {(r["addr"], r["size"]) for r in recs if r["kind"] == "vmm" and r["op"] == "map"}
        matched = sum(1 for k in cupti if k in traced_dev)
        on_maps = sum(1 for k in cupti if k in maps)
        mem = (
            f"CUPTI memory: {len(cupti)} device allocations, {matched} at a traced alloc, "
            f"{on_maps} at a traced cuMemMap"
        )
        detail = f"{detail}; {mem}" if detail else mem
    return [
        mode,
        len(segs),
        len(segs) - len(missing),
        peak,
        reserved_peak,
        "OK" if ok else "FAIL",
        other,
        detail,
    ], ok


def check_nocache(d, default_dir, memsim):
    header, recs, _ = load_trace(os.path.join(d, "trace.jsonl"))
    ok = bool(header.get("caching_disabled"))
    allocs = sum(1 for r in recs if r["kind"] == "alloc" and not r.get("result", 0))
    with open(os.path.join(default_dir, "stats.json")) as f:
        want_peak = json.load(f)["reserved_bytes.all.peak"]
    if not memsim:
        return [
            "nocache",
            allocs,
            "-",
            "memsim missing",
            want_peak,
            "OK" if ok else "FAIL",
            "-",
            "replay not compared (no memsim)",
        ], ok
    rep = json.loads(
        subprocess.run(
            [memsim, "replay", os.path.join(d, "trace.mtrace"), "--json"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    got_peak = rep["peak_reserved_bytes"]
    # memsim replay reports segments per pool (count and bytes ever allocated), not their order:
    # compare those with the default run's segment_alloc list (2 MiB segments are the small
    # pool's kSmallBuffer; the large pool's are 20 MiB or at least 10 MiB).
    with open(os.path.join(default_dir, "snapshot.pickle"), "rb") as f:
        want_seq = [s for a, _, s in snapshot_segments(pickle.load(f)) if a == "segment_alloc"]
    small = [s for s in want_seq if s == 2 * MiB]
    large = [s for s in want_seq if s != 2 * MiB]
    want_pools = (len(small), sum(small), len(large), sum(large))
    m = rep["memory_stats"]
    got_pools = tuple(
        m.get(k, 0)
        for k in (
            "segment.small_pool.allocated",
            "reserved_bytes.small_pool.allocated",
            "segment.large_pool.allocated",
            "reserved_bytes.large_pool.allocated",
        )
    )
    seq_ok = got_pools == want_pools
    detail = "segments per pool " + (
        "equal" if seq_ok else f"differ: (small n, B, large n, B) {got_pools} vs {want_pools}"
    )
    # The dry run's no-caching job is the same workload as its default job (job.py
    # DRY_TENSORS/DRY_SEGMENTS), so it is judged like a real run.
    ok = ok and got_peak == want_peak and seq_ok
    skipped = rep.get("skipped_by_caller") or {}
    if skipped:
        detail += f"; replay left out {sum(skipped.values())} calls by other modules"
    return ["nocache", allocs, "-", got_peak, want_peak, "OK" if ok else "FAIL", "-", detail], ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--memsim", default="")
    a = ap.parse_args()
    rows, all_ok = [], True
    for mode in ("default", "expandable"):
        row, ok = check_caching(mode, os.path.join(a.out, mode))
        rows.append(row)
        all_ok &= ok
    row, ok = check_nocache(
        os.path.join(a.out, "nocache"), os.path.join(a.out, "default"), a.memsim
    )
    rows.append(row)
    all_ok &= ok
    head = [
        "run",
        "segments",
        "traced",
        "traced peak",
        "reserved peak",
        "check",
        "other modules",
        "detail",
    ]
    w = [max(len(str(r[i])) for r in [*rows, head]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(str(v).ljust(w[i]) for i, v in enumerate(r)).rstrip())
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
