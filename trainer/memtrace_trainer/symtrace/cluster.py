"""`symtrace --batch ... --backend slurm`: the configs traced as a Slurm job array through submitit
(the launcher `launch --backend slurm` uses), for `memest compare --backend slurm`.

The configs are split into at most `parallelism` chunks, one array task each (a task imports
torch once and traces its chunk); the submitting process waits and prints one JSON line per
config, in the configs' order, exactly as the local backend does, so memest reads both alike.
Tracing needs no GPU: the tasks ask for one CPU each. `--submitit-cluster local` runs the same
array on this machine through submitit, `debug` in this process (what the tests use).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memtrace_trainer.errors import UserError


def trace_chunk(items: list[tuple[str, dict[str, Any], str]]) -> list[dict[str, Any]]:
    """Traces (name, config, out path) items in one process; errors are results, not raised."""
    from memtrace_trainer.cli.models import symtrace_each

    return list(symtrace_each(items))


def trace_on_cluster(
    items: list[tuple[str, dict[str, Any], str]],
    out_dir: Path,
    cluster: str,
    partition: str | None,
    timeout_min: int,
    parallelism: int,
) -> list[dict[str, Any]]:
    from memtrace_trainer.runs.launch import array_executor, require_submitit

    submitit = require_submitit(cluster)
    if parallelism < 1:
        raise UserError(f"--array-parallelism {parallelism}: expected at least 1")
    if not items:
        return []
    n = min(parallelism, len(items))
    chunks = [items[i::n] for i in range(n)]
    folder = out_dir / "submitit"
    folder.mkdir(parents=True, exist_ok=True)
    slurm = {"cpus_per_task": 1, "slurm_array_parallelism": n}
    executor = array_executor(submitit, folder, cluster, "memtrace-symtrace", timeout_min,
                              partition, slurm)  # fmt: skip
    jobs = executor.map_array(trace_chunk, chunks)
    by_name: dict[str, dict[str, Any]] = {}
    for chunk, job in zip(chunks, jobs, strict=True):
        try:
            for result in job.result():
                by_name[result["name"]] = result
        except Exception as e:  # a killed or timed-out task: its configs fail, the rest stand
            for name, _, _ in chunk:
                by_name[name] = {"name": name, "error": f"array task {job.job_id}: {e}"}
    return [by_name[name] for name, _, _ in items]
