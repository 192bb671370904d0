"""`launch`: many runs, resumable, one per GPU locally or as a Slurm job array.

Every backend calls the same `run_one(index, manifest)`: it runs one manifest line into
`OUT/runs/<id>/`, or records the failure in `OUT/failed/<id>.json`. A run directory exists only
once complete, so rerunning `launch` skips finished runs and retries failed ones.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from memtrace_trainer.errors import UserError
from memtrace_trainer.runs.rundir import execute, is_complete, write_json
from memtrace_trainer.runs.sweep import Item, read_manifest

MANIFEST = "manifest.jsonl"


def run_dir(out: Path, item: Item) -> Path:
    return out / "runs" / item.config.id


def failure_file(out: Path, item: Item) -> Path:
    return out / "failed" / f"{item.config.id}.json"


def run_one(index: int, manifest: str | Path) -> dict[str, Any]:
    """Runs manifest line `index` (0-based) into the manifest's directory. Never raises for a
    failing run: the failure is written to `failed/<id>.json` and returned."""
    manifest = Path(manifest)
    out = manifest.parent
    items = read_manifest(manifest)
    if not 0 <= index < len(items):
        raise UserError(f"run_one: index {index} out of range: {manifest} has {len(items)} runs")
    item = items[index]
    target = run_dir(out, item)
    base = {"index": index, "id": item.config.id}
    if is_complete(target):
        return base | {"status": "present"}
    target.parent.mkdir(parents=True, exist_ok=True)
    failed = failure_file(out, item)
    try:
        labels = execute(item.config, target, trace=item.trace)
    except Exception as e:  # recorded, and the sweep goes on
        error = f"{type(e).__name__}: {e}"
        failed.parent.mkdir(parents=True, exist_ok=True)
        write_json(failed, base | {"error": error, "traceback": traceback.format_exc()})
        return base | {"status": "failed", "error": error}
    failed.unlink(missing_ok=True)
    return base | {"status": "done", "oom": labels["oom"], "cpu_fallback": labels["cpu_fallback"]}


@dataclass
class Progress:
    """done / failed / remaining, redrawn in place on a terminal and one line per run in logs."""

    total: int
    present: int
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    done: int = 0
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def line(self) -> str:
        remaining = self.total - self.present - self.done - self.failed
        return (
            f"launch: {self.present + self.done}/{self.total} done "
            f"({self.present} present before), {self.failed} failed, {remaining} remaining"
        )

    def update(self, status: str, what: str) -> None:
        with self.lock:
            if status == "failed":
                self.failed += 1
            else:
                self.done += 1
            if self.stream.isatty():
                self.stream.write(f"\r\x1b[K{self.line()}")
                if self.done + self.failed + self.present == self.total:
                    self.stream.write("\n")
            else:
                self.stream.write(f"{self.line()}  [{status}: {what}]\n")
            self.stream.flush()


def status_of(out: Path, item: Item) -> str:
    if is_complete(run_dir(out, item)):
        return "present"
    return "failed-before" if failure_file(out, item).is_file() else "pending"


def _slots(workers: int | None) -> list[dict[str, str]]:
    """One environment per parallel worker: a GPU each, or CPU workers sharing the cores."""
    import torch

    gpus = torch.cuda.device_count()
    if gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        names = visible.split(",")[:gpus] if visible else [str(i) for i in range(gpus)]
        if workers is not None and workers < len(names):
            names = names[:workers]
        return [{"CUDA_VISIBLE_DEVICES": n} for n in names]
    n = workers or max(1, min(4, (os.cpu_count() or 1) // 2))
    threads = max(1, (os.cpu_count() or 1) // n)
    return [{"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(threads)} for _ in range(n)]


def _run_worker(
    out: Path, item: Item, env: dict[str, str], timeout_s: float | None
) -> tuple[str, str]:
    """One run in its own process (a crash or a poisoned CUDA context stays there)."""
    log = out / "logs" / f"{item.config.id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "memtrace_trainer.runs.worker",
        str(out / MANIFEST),
        str(item.index),
    ]
    with log.open("w") as f:
        try:
            rc = subprocess.run(
                cmd,
                env={**os.environ, **env},
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = None
    if rc == 0:
        return "done", item.config.id
    if rc == 1 and failure_file(out, item).is_file():
        return "failed", item.config.id
    tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-8:])
    why = f"timed out after {timeout_s} s" if rc is None else f"worker exited with {rc}"
    _record_failure(out, item, f"{why}; log tail:\n{tail}")
    return "failed", item.config.id


def _record_failure(out: Path, item: Item, error: str) -> None:
    """`failed/<id>.json` for a run whose worker could not record it (killed, timed out)."""
    failed = failure_file(out, item)
    failed.parent.mkdir(parents=True, exist_ok=True)
    write_json(failed, {"index": item.index, "id": item.config.id, "error": error})


def launch_local(
    out: Path, items: list[Item], workers: int | None, timeout_s: float | None
) -> Progress:
    pending = [it for it in items if not is_complete(run_dir(out, it))]
    progress = Progress(len(items), len(items) - len(pending))
    slots = _slots(workers)
    print(
        f"launch: {len(items)} runs, {progress.present} present (skipped), {len(pending)} to "
        f"run on {len(slots)} worker(s): " + ", ".join(_describe(s) for s in slots),
        file=sys.stderr,
    )
    work: queue.Queue[Item] = queue.Queue()
    for it in pending:
        work.put(it)

    def worker(env: dict[str, str]) -> None:
        while True:
            try:
                item = work.get_nowait()
            except queue.Empty:
                return
            try:
                status, what = _run_worker(out, item, env, timeout_s)
            except Exception as e:  # this worker goes on with the queue; the run is failed
                _record_failure(out, item, f"launching its worker failed: {type(e).__name__}: {e}")
                status, what = "failed", item.config.id
            progress.update(status, what)

    threads = [threading.Thread(target=worker, args=(env,)) for env in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return progress


def _describe(env: dict[str, str]) -> str:
    gpu = env.get("CUDA_VISIBLE_DEVICES")
    return f"GPU {gpu}" if gpu else f"CPU ({env.get('OMP_NUM_THREADS')} threads)"


def require_submitit(cluster: str) -> Any:
    """submitit, and sbatch when the cluster is Slurm; a clear error when either is missing."""
    try:
        import submitit
    except ImportError:
        raise UserError(
            "--backend slurm needs submitit: pip install -r trainer/requirements.txt "
            "(pins submitit)"
        ) from None
    if cluster == "slurm" and shutil.which("sbatch") is None:
        raise UserError(
            "--backend slurm: no sbatch on PATH (run on a Slurm login node, or pass "
            "--submitit-cluster local to run the same job array locally through submitit)"
        )
    return submitit


def array_executor(
    submitit: Any,
    folder: Path,
    cluster: str,
    name: str,
    timeout_min: int,
    partition: str | None,
    slurm: dict[str, Any],
) -> Any:
    """A submitit executor of one job array, its logs under `folder`; `slurm` holds the
    parameters given only when the cluster is Slurm."""
    executor = submitit.AutoExecutor(folder=folder / "%j", cluster=cluster)
    params: dict[str, Any] = {"timeout_min": timeout_min, "name": name}
    if cluster == "slurm":
        params |= slurm
        if partition:
            params["slurm_partition"] = partition
    executor.update_parameters(**params)
    return executor


def launch_slurm(
    out: Path,
    items: list[Item],
    cluster: str,
    partition: str | None,
    timeout_min: int,
    parallelism: int,
    wait: bool,
) -> Progress:
    """Submits the runs not yet present as one job array through submitit."""
    submitit = require_submitit(cluster)
    pending = [it for it in items if not is_complete(run_dir(out, it))]
    progress = Progress(len(items), len(items) - len(pending))
    if not pending:
        print(f"launch: all {len(items)} runs present; nothing to submit", file=sys.stderr)
        return progress
    slurm = {"gpus_per_node": 1, "slurm_array_parallelism": parallelism}
    executor = array_executor(submitit, out / "submitit", cluster, "memtrace-run", timeout_min,
                              partition, slurm)  # fmt: skip
    manifest = str(out / MANIFEST)
    (out / "submitit").mkdir(parents=True, exist_ok=True)
    jobs = executor.map_array(run_one, [it.index for it in pending], [manifest] * len(pending))
    write_json(
        out / "submitit" / "jobs.json",
        [
            {"index": it.index, "id": it.config.id, "job": j.job_id}
            for it, j in zip(pending, jobs, strict=True)
        ],
    )
    print(
        f"launch: submitted {len(jobs)} runs as job array {jobs[0].job_id.split('_')[0]} "
        f"({cluster}); rerun `launch` to resubmit what is missing",
        file=sys.stderr,
    )
    if wait:
        for it, job in zip(pending, jobs, strict=True):
            try:
                result = job.result()
                progress.update(result["status"], it.config.id)
            except Exception as e:  # a killed or timed-out array task
                write_json(
                    failure_file(out, it),
                    {"index": it.index, "id": it.config.id, "error": f"{type(e).__name__}: {e}"},
                )
                progress.update("failed", it.config.id)
    return progress
