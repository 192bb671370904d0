"""`max-batch`: the largest batch that fits, by symbolic traces replayed in memsim.

Doubling finds a batch that does not fit, then bisection the boundary; every probe is a fresh
meta-device trace in this process (torch is imported once) and one `memsim replay` at the
capacity: the profile's total memory minus its context, unless given.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrace_trainer.binaries import Found, find_binary
from memtrace_trainer.errors import UserError
from memtrace_trainer.profile import load_profile, profile_path
from memtrace_trainer.symtrace.step import StepConfig
from memtrace_trainer.symtrace.tracer import trace_to_file
from memtrace_trainer.workload import Workload

GIB = 1 << 30
MIB = 1 << 20


def _replay(memsim: Found, trace: Path, profile: Path, capacity: int | None) -> dict[str, Any]:
    cmd = [str(memsim.path), "replay", str(trace), "--json", "--profile", str(profile)]
    if capacity is not None:
        cmd += ["--capacity", str(capacity)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise UserError(f"memsim replay failed ({done.returncode}): {done.stderr.strip()}")
    try:
        data = json.loads(done.stdout)
        return {
            k: data[k] for k in ("oom", "peak_reserved_bytes", "peak_allocated_bytes", "capacity")
        }
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"memsim replay --json: unexpected output ({e})") from None


def max_batch(
    workload_for: Callable[[int], Workload],
    step: StepConfig,
    profile: str,
    capacity_gib: float | None,
    limit: int,
) -> dict[str, Any]:
    memsim = find_binary("memsim")
    prof = load_profile(profile)
    ppath = profile_path(profile)
    capacity = None if capacity_gib is None else int(capacity_gib * GIB)
    if capacity is not None and capacity <= 0:
        raise UserError(f"--capacity {capacity_gib}: expected a positive number of GiB")
    started = time.perf_counter()
    probes: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="memtrace-maxbatch-") as tmp:

        def probe(batch: int) -> bool:
            t = time.perf_counter()
            path = Path(tmp) / f"b{batch}.jsonl"
            trace_to_file(workload_for(batch), step, prof, path)
            result = _replay(memsim, path, ppath, capacity)
            path.unlink()
            probes[batch] = {
                "batch": batch,
                "fits": not result["oom"],
                **result,
                "seconds": time.perf_counter() - t,
            }
            return not result["oom"]

        best, hit_limit = 0, False
        if probe(1):
            best, bad = 1, None
            while bad is None:
                nxt = best * 2
                if nxt > limit:
                    hit_limit = True
                    break
                if probe(nxt):
                    best = nxt
                else:
                    bad = nxt
            if bad is not None:
                while bad - best > 1:
                    mid = (best + bad) // 2
                    if probe(mid):
                        best = mid
                    else:
                        bad = mid
    at_best = probes.get(best)
    any_probe = next(iter(probes.values()))
    return {
        "profile": profile,
        "capacity_bytes": any_probe["capacity"],
        "max_batch": best,
        "hit_limit": hit_limit,
        "peak_reserved_bytes": at_best["peak_reserved_bytes"] if at_best else None,
        "peak_reserved_mib": at_best["peak_reserved_bytes"] / MIB if at_best else None,
        "peak_allocated_bytes": at_best["peak_allocated_bytes"] if at_best else None,
        "probes": [probes[b] for b in sorted(probes)],
        "memsim": {"path": str(memsim.path), "source": memsim.source},
        "seconds": time.perf_counter() - started,
    }
