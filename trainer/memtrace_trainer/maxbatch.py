"""`max-batch` and `max-seq`: the largest batch (or sequence length) that fits, by symbolic
traces replayed in memsim.

Doubling finds a batch that does not fit, then bisection the boundary; every probe is a fresh
meta-device trace in this process (torch is imported once) and one `memsim replay --profile P
[--capacity C]`: the fit check `memest estimate` makes too (`simulator::fit`): the device's total
memory, minus the profile's memory outside the allocator for the libraries the trace loads, is
the allocator's budget. So the answer fits by `estimate`, and the next batch does not.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrace_trainer.binaries import error_line, run_tool, tool_source
from memtrace_trainer.errors import ModelFailedError, UserError, nothing_on_the_gpu
from memtrace_trainer.notes import progress, warn
from memtrace_trainer.profile import Profile, load_profile
from memtrace_trainer.symtrace.step import StepConfig
from memtrace_trainer.symtrace.tracer import trace_step, trace_to_file, write_trace
from memtrace_trainer.symtrace.userstep import load_step
from memtrace_trainer.units import MIB
from memtrace_trainer.workload import Workload

# Writes one probe's trace at a batch size; returns the defaults that shaped it.
TraceAt = Callable[[int, Profile, Path], dict[str, Any]]


def _memsim_source() -> dict[str, str]:
    found = tool_source("memsim")
    return {"path": str(found.path), "source": found.source}


def _replay(trace: Path, profile: Path, capacity: str | None, point: bool) -> dict[str, Any]:
    cmd = ["replay", str(trace), "--json", "--profile", str(profile)]
    if capacity is not None:
        cmd.append(f"--capacity={capacity}")
    if point:
        cmd.append("--point")
    done = run_tool("memsim", cmd)
    # memsim exits 1 for "does not fit": an answer, not a failure.
    if done.returncode not in (0, 1):
        msg = error_line(done.stderr)
        raise UserError(f"memsim replay failed ({done.returncode}): {msg}")
    try:
        data = json.loads(done.stdout)
        verdict = data["verdict"]
        if verdict.get("need_unbounded") is not None:
            # No number to search on: memsim writes null beside the reason (a memory fraction
            # that lets the allocator reserve nothing), at every batch size alike.
            why = verdict["need_unbounded"]
            raise UserError(f"memsim replay: no device holds this job (need_unbounded: {why})")
        return {
            "fits": bool(verdict["fits"]),
            "need_bytes": int(verdict["need_bytes"]),
            "basis": str(verdict["basis"]),
            "point_bytes": int(data["peak_device_bytes"]),
            "capacity": int(verdict["capacity_bytes"]),
            "capacity_source": str(verdict["capacity_source"]),
            "oom": bool(data["oom"]),
            "peak_reserved_bytes": int(data["peak_reserved_bytes"]),
            "peak_allocated_bytes": int(data["peak_allocated_bytes"]),
            "need_floor_bytes": int(data["need_floor_bytes"]),
            "warnings": list(data.get("warnings", [])),
        }
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise UserError(f"memsim replay --json: unexpected output ({e!r})") from None


def _requests(trace: Path) -> str:
    """A digest of a trace's allocation requests as the job made them (each alloc and free, its
    requested size and stream, in order), before the allocator rounds them: two probes with the
    same digest asked for the same memory; memsim's peaks (rounded to its blocks) may be equal
    while the requests grew."""
    digest = hashlib.sha256()
    with trace.open() as lines:
        for line in lines:
            event = json.loads(line)
            if "size" in event and "addr" in event:
                said = (event["kind"], event["size"], event.get("stream", 0))
                digest.update(json.dumps(said).encode())
    return digest.hexdigest()


def _probe(
    prof: Profile,
    capacity: str | None,
    point: bool,
    trace_at: TraceAt,
    value: int,
    tmp: Path,
    label: str,
    digest: bool = False,
) -> dict[str, Any]:
    """One probe of a search: the trace at `value`, its `memsim replay` verdict (warnings
    passed on), with `digest` its requests' digest (`requests`), a progress line on stderr; the
    trace is removed after."""
    t = time.perf_counter()
    path = tmp / f"probe-{value}.jsonl"
    defaults = trace_at(value, prof, path)
    result = _replay(path, prof.path, capacity, point)
    if digest:
        result["requests"] = _requests(path)
    path.unlink()
    if result["peak_allocated_bytes"] == 0:
        raise nothing_on_the_gpu(label)  # as `estimate` refuses it: no search of nothing
    for w in result.pop("warnings"):
        warn(w)
    from memtrace_trainer.estimate import need_and_capacity_mib

    need, cap = need_and_capacity_mib(result["need_bytes"] / MIB, result["capacity"] / MIB)
    progress(f"{label}: needs {need} of {cap}: " + ("fits" if result["fits"] else "does not fit"))
    return {**result, "defaults": defaults, "seconds": time.perf_counter() - t}


def trace_model(workload_for: Callable[[int], Workload], step: StepConfig) -> TraceAt:
    """Probes of a model spec or `--entry` at a batch size, by the tracer's own loop."""

    def trace_at(batch: int, prof: Profile, path: Path) -> dict[str, Any]:
        workload = workload_for(batch)
        trace_to_file(workload, step, prof, path)
        return workload.defaults

    return trace_at


def trace_step_fn(spec: str, steps: int, world_size: int | None = None) -> TraceAt:
    """Probes of a step function `FN(device, batch_size)` at a batch size (as rank 0 of
    `world_size` ranks, under the fake process group, as `estimate --step` traces it)."""
    load_step(spec, with_batch=True)  # a clear error before the first probe

    def trace_at(batch: int, prof: Profile, path: Path) -> dict[str, Any]:
        write_trace(path, *trace_step(spec, steps, prof, batch_size=batch, world_size=world_size))
        return {}

    return trace_at


def trace_model_seq(
    workload_for: Callable[[int, int], Workload], step: StepConfig, batch: int
) -> TraceAt:
    """Probes of a token model at a sequence length, the batch size fixed."""

    def trace_at(seq: int, prof: Profile, path: Path) -> dict[str, Any]:
        workload = workload_for(batch, seq)
        trace_to_file(workload, step, prof, path)
        defaults = dict(workload.defaults)
        defaults.pop("seq_len", None)  # the searched axis, not a default
        return defaults

    return trace_at


def max_seq(
    trace_at: TraceAt,
    iterations: int,
    profile: str,
    capacity: str | None,
    limit: int,
    multiple: int,
    point: bool = False,
) -> dict[str, Any]:
    """The longest sequence, a multiple of `multiple`, that fits; the same search and fit check
    as `max_batch`, over `multiple`-token steps."""
    if multiple < 1:
        raise UserError(f"--multiple-of {multiple}: expected a positive number of tokens")
    if limit < multiple:
        raise UserError(f"--limit {limit}: expected at least --multiple-of ({multiple}) tokens")
    result = max_batch(
        lambda k, prof, path: trace_at(k * multiple, prof, path),
        iterations,
        profile,
        capacity,
        limit // multiple,
        point,
        unit=("sequence length", multiple),
    )
    best = result.pop("max_batch")
    result["max_seq_len"] = best * multiple
    result["multiple_of"] = multiple
    result["need_at_seq_len"] = result.pop("need_at_batch") * multiple
    for probe in result["probes"]:
        probe["seq_len"] = probe.pop("batch") * multiple
    return result


# Probes past the first batch that does not fit, at most (see `_beyond_the_boundary`).
SCAN_BEYOND = 8


def _beyond_the_boundary(
    probe: Callable[[int], bool], probes: dict[int, dict[str, Any]], bad: int, limit: int, best: int
) -> tuple[int, int | None]:
    """The largest batch that fits, when the need is not monotone: the allocator's packing
    (reserved minus allocated) moves with the shapes, so a batch above the first that does not
    fit may fit again. Batches above it are probed one by one while the last one's floor (its
    need with the allocated peak in place of the reserved) is within the capacity: the allocated
    peak grows with the batch, so past that no batch can fit. Returns the best batch and, when
    the probes ran out first, the first batch left unprobed."""
    b = bad
    for _ in range(SCAN_BEYOND):
        if b >= limit or probes[b]["need_floor_bytes"] > probes[b]["capacity"]:
            return best, None
        b += 1
        if probe(b):
            best = b
    done = b >= limit or probes[b]["need_floor_bytes"] > probes[b]["capacity"]
    return best, None if done else b + 1


def _first_size(
    probe: Callable[[int], bool], limit: int, command: str, axis: str, step: int
) -> int:
    """Where the search starts: 1, or 2 when the model fails at 1 alone, as PyTorch's BatchNorm
    refuses to train over one value per channel (a ResNet at batch 1) and trains at 2. Found by
    the model's own refusal, so no list of models to keep; one that fails at 2 as well fails
    with its words at 1."""
    try:
        probe(1)
    except ModelFailedError as refused:
        if limit < 2:
            raise
        try:
            probe(2)
        except ModelFailedError:
            raise refused from refused.__cause__
        why = refused.__cause__
        said = str(why).strip().splitlines() if why is not None else []
        reason = f"{type(why).__name__}: {said[0] if said else ''}" if why else str(refused)
        warn(
            f"{command}: the model fails at {axis} {step} ({reason}) and trains at {2 * step}, "
            f"so the search starts at {axis} {2 * step}"
        )
        return 2
    return 1


def _failed_after(
    e: UserError, probes: dict[int, dict[str, Any]], label: str, axis: str, step: int
) -> None:
    """A probe that failed once smaller ones fitted (a builder that refuses sizes past its own
    cap): raised again saying which size was probed and the largest that fitted, so the
    answer up to there is not lost in the error."""
    fitted = [b for b, p in probes.items() if p["fits"]]
    if fitted:
        raise UserError(f"{label} failed, after {axis} {max(fitted) * step} fitted (the largest "
                        f"so far): {e}") from e  # fmt: skip


def _same_need(
    probes: dict[int, dict[str, Any]], requests: dict[int, str], command: str, axis: str, step: int
) -> None:
    """The search ran to its limit with every probe's trace making the same allocation
    requests (`requests`: each probe's digest, `_requests`): the job does not depend on the
    searched size (a step builder that ignores its batch_size), so the answer is the limit's,
    not memory's. Compared before the allocator's rounding: a small model's growing tensors
    round to the same blocks and are no sign of it."""
    if len(probes) > 1 and len(set(requests.values())) == 1:
        low, high = min(probes) * step, max(probes) * step
        same = probes[min(probes)]["peak_allocated_bytes"] / MIB
        warn(f"{command}: every probe, {axis} {low} to {high}, makes the same allocations "
             f"({same:.1f} MiB allocated at the peak): the need never changed with the {axis}, "
             f"so the search found no dependence on it and answers its limit (does the job use "
             f"the {axis} it is given?)")  # fmt: skip


def max_batch(
    trace_at: TraceAt,
    iterations: int,
    profile: str,
    capacity: str | None,
    limit: int,
    point: bool = False,
    unit: tuple[str, int] = ("batch", 1),
) -> dict[str, Any]:
    """`capacity` is the device's total memory as the user typed it (`40GiB`); memsim parses it,
    and rejects a bad one naming it. `unit` names the searched axis and its step (progress
    lines say `sequence length 2048` for `max_seq`)."""
    prof = load_profile(profile, capacity)
    if limit < 1:
        raise UserError(f"--limit {limit}: expected a positive batch size")
    axis, step = unit
    command = "max-batch" if axis == "batch" else "max-seq"
    started = time.perf_counter()
    probes: dict[int, dict[str, Any]] = {}
    requests: dict[int, str] = {}  # each probe's allocation requests (`_requests`)
    defaults: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="memtrace-maxbatch-") as tmp:

        def probe(batch: int) -> bool:
            if batch in probes:
                return bool(probes[batch]["fits"])
            label = f"{command}: {axis} {batch * step}"
            try:
                result = _probe(prof, capacity, point, trace_at, batch, Path(tmp), label, True)
            except UserError as e:
                _failed_after(e, probes, label, axis, step)
                raise
            defaults.update(result.pop("defaults"))
            requests[batch] = result.pop("requests")
            probes[batch] = {"batch": batch, **result}
            return bool(result["fits"])

        best, hit_limit = 0, False
        first = _first_size(probe, limit, command, axis, step)
        if probe(first):
            best, bad = first, None
            while bad is None:
                nxt = min(best * 2, limit)
                if nxt <= best:
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
                best, unprobed = _beyond_the_boundary(probe, probes, bad, limit, best)
                if unprobed is not None:
                    what = "batch sizes" if axis == "batch" else f"{axis}s"
                    # Said of what was found, not assumed: the probes may all have been in order.
                    warn(
                        f"{command}: {what} past the first that does not fit may still fit (their "
                        "allocated peak is within the capacity, and the allocator's packing "
                        f"moves with the shapes); {SCAN_BEYOND} of them were probed, and those "
                        f"from {unprobed * step} up were not: a larger one may fit"
                    )
    if hit_limit:
        _same_need(probes, requests, command, axis, step)
    # When nothing fits, the need is the smallest probe's: how far the job is from fitting.
    shown = probes[best] if best else probes[min(probes)]
    return {
        "profile": profile,
        "capacity_bytes": shown["capacity"],
        "capacity_source": shown["capacity_source"],
        "max_batch": best,
        "hit_limit": hit_limit,
        "need_at_batch": shown["batch"],
        "need_bytes": shown["need_bytes"],
        "basis": shown["basis"],
        "point_bytes": shown["point_bytes"],
        "peak_reserved_bytes": shown["peak_reserved_bytes"],
        "peak_reserved_mib": shown["peak_reserved_bytes"] / MIB,
        "peak_allocated_bytes": shown["peak_allocated_bytes"],
        "probes": [probes[b] for b in sorted(probes)],
        "defaults": defaults,
        "iterations": iterations,
        "memsim": _memsim_source(),
        "seconds": time.perf_counter() - started,
    }


def ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def min_world_size(
    trace_at: Callable[[int, Profile, Path], dict[str, Any]],
    sizes: list[int],
    profile: str,
    capacity: str | None,
    point: bool = False,
) -> dict[str, Any]:
    """The smallest of `sizes` (ascending) at which rank 0's need fits: each probe traces the
    job at that world size and replays it with `memsim replay`, the fit check of `estimate`.
    Probing stops at the first fit; sizes where the strategy cannot run are reported, not
    skipped silently."""
    prof = load_profile(profile, capacity)
    started = time.perf_counter()
    probes: list[dict[str, Any]] = []
    defaults: dict[str, Any] = {}
    best = None
    with tempfile.TemporaryDirectory(prefix="memtrace-minworld-") as tmp:
        for world in sizes:
            label = f"min-world-size: {ranks(world)}, per GPU"
            result = _probe(prof, capacity, point, trace_at, world, Path(tmp), label)
            defaults.update(result.pop("defaults"))
            probes.append({"world_size": world, **result})
            if result["fits"]:
                best = world
                break
    last = probes[-1]
    return {
        "profile": profile,
        "capacity_bytes": last["capacity"],
        "capacity_source": last["capacity_source"],
        "min_world_size": best,
        # When none fits, the largest world size tried: the need nearest to fitting.
        "need_at_world_size": last["world_size"],
        "need_bytes": last["need_bytes"],
        "basis": last["basis"],
        "probes": probes,
        "defaults": defaults,
        "memsim": _memsim_source(),
        "seconds": time.perf_counter() - started,
    }
