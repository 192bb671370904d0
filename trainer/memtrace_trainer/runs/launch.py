"""`launch`: many runs, resumable, one per GPU locally or as a Slurm job array.

Every backend calls the same `run_one(index, manifest)`: it runs one manifest line into
`OUT/runs/<id>/`, or records the failure in `OUT/failed/<id>.json`. A run directory exists only
once complete, so rerunning `launch` skips finished runs and retries failed ones. One `launch`
at a time writes into an OUT (`OUT/.launch.lock`); the Slurm backend records what it submitted
(`OUT/submitit/jobs.json`) and does not submit a run again while its job may still run it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from memtrace_trainer import notes
from memtrace_trainer.errors import UserError
from memtrace_trainer.notes import counted, warn
from memtrace_trainer.runs.rundir import execute, is_complete, write_json
from memtrace_trainer.runs.stop import Interrupts, Workers, kill_group, remove_leftovers, wait_for
from memtrace_trainer.runs.sweep import SETTINGS, Item, read_manifest
from memtrace_trainer.runs.worker import INTERRUPTED

MANIFEST = "manifest.jsonl"
LOCK = ".launch.lock"
JOBS = Path("submitit") / "jobs.json"


def run_dir(out: Path, item: Item) -> Path:
    return out / "runs" / item.config.id


def failure_file(out: Path, item: Item) -> Path:
    return out / "failed" / f"{item.config.id}.json"


def run_one(index: int, manifest: str | Path, run_id: str | None = None) -> dict[str, Any]:
    """Runs manifest line `index` (0-based) into the manifest's directory. Never raises for a
    failing run: the failure is written to `failed/<id>.json` and returned. With `run_id` (what
    an array task was submitted for), the run of that id, wherever a later, grown manifest put
    it."""
    manifest = Path(manifest)
    out = manifest.parent
    items = read_manifest(manifest)
    by_id = [it for it in items if it.config.id == run_id]
    if by_id:
        index = by_id[0].index
    elif run_id is not None:
        raise UserError(f"run_one: run {run_id} is no longer in {manifest}")
    if not 0 <= index < len(items):
        raise UserError(
            f"run_one: index {index} out of range: {manifest} has {counted(len(items), 'run')}"
        )
    item = items[index]
    target = run_dir(out, item)
    base = {"index": index, "id": item.config.id}
    if is_complete(target):
        return base | {"status": "present"}
    target.parent.mkdir(parents=True, exist_ok=True)
    failed = failure_file(out, item)
    try:
        labels = execute(item.config, target, trace=item.trace)
    except (Exception, SystemExit) as e:  # recorded (sys.exit in the model too), the sweep goes on
        if is_complete(target):
            # Another worker (a second launch, a resubmitted task) finished the same run first;
            # ours lost the rename. The run is there: not a failure.
            return base | {"status": "present"}
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
    # The cause of each run that failed in this launch, by id (one line each).
    causes: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        remaining = self.total - self.present - self.done - self.failed
        return (
            f"launch: {self.present + self.done}/{self.total} done "
            f"({self.present} present before), {self.failed} failed, {remaining} remaining"
        )

    def update(self, status: str, what: str, cause: str = "") -> None:
        with self.lock:
            if status == "failed":
                self.failed += 1
                self.causes[what] = cause.strip().splitlines()[0] if cause.strip() else "?"
            else:
                self.done += 1
            if self.stream.isatty():
                self.stream.write(f"\r\x1b[K{self.line()}")
                if self.done + self.failed + self.present == self.total:
                    self.stream.write("\n")
            else:
                self.stream.write(f"{self.line()}  [{status}: {what}]\n")
            self.stream.flush()


def status_of(out: Path, item: Item, submitted: dict[str, str] | None = None) -> str:
    if is_complete(run_dir(out, item)):
        return "present"
    if submitted and item.config.id in submitted:
        return "submitted"
    return "failed-before" if failure_file(out, item).is_file() else "pending"


def failure_cause(out: Path, item: Item) -> str:
    """The recorded error of a failed run (its first line), for the summary."""
    try:
        error = json.loads(failure_file(out, item).read_text())["error"]
    except (OSError, ValueError, KeyError, TypeError):
        return "no readable failure record"
    return str(error).strip().splitlines()[0] if str(error).strip() else "?"


@contextlib.contextmanager
def out_lock(out: Path) -> Iterator[None]:
    """Holds `OUT/.launch.lock` while a launch writes into OUT: a second launch of the same OUT
    ran every pending run again beside the first, and the loser of each race recorded a finished
    run as failed."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out {out}: cannot create the directory ({e.strerror})") from None
    path = out / LOCK
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "?"
            raise UserError(
                f"--out {out}: another launch (pid {holder}) is writing into it ({path} is "
                "locked); wait for it to finish, or pick another --out"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def check_manifest(out: Path, items: list[Item], sweep: Path) -> None:
    """Refuses an OUT that holds another sweep's manifest: writing ours over it mixed the two
    sweeps' runs in one folder. A sweep that grew (every old run still in it) may go on."""
    path = out / MANIFEST
    if not path.is_file():
        return
    try:
        old = read_manifest(path)
    except UserError as e:
        raise UserError(f"--out {out}: holds a manifest this launch cannot read ({e}); pick "
                        "another --out") from None  # fmt: skip
    ids = {it.config.id for it in items}
    gone = [it.config.id for it in old if it.config.id not in ids]
    if gone:
        raise UserError(
            f"--out {out}: holds {path.name} of another sweep: {len(gone)} of its {len(old)} "
            f"runs (e.g. {gone[0]}) are not in {sweep}; launching would mix the two sweeps' "
            "runs in one folder. Pick another --out (or remove the manifest to keep the old "
            "runs beside the new ones)"
        )


def submitted_jobs(out: Path) -> dict[str, str]:
    """Run id -> job of the runs submitted to Slurm that have not finished: neither their run
    directory nor a failure recorded since their submission exists."""
    path = out / JOBS
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text())
        found = {str(e["id"]): (str(e["job"]), float(e.get("submitted", 0))) for e in entries}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path}: expected a list of {{index, id, job, submitted}} ({e}); "
                        "remove it to submit every unfinished run again") from None  # fmt: skip
    unfinished = {}
    for run_id, (job, when) in found.items():
        if is_complete(out / "runs" / run_id):
            continue
        failed = out / "failed" / f"{run_id}.json"
        if failed.is_file() and failed.stat().st_mtime >= when:
            continue
        unfinished[run_id] = job
    return unfinished


def preflight(items: list[Item], source: str, here: bool) -> None:
    """What would fail every run of a kind, said before any runs: a model spec that does not
    build (each distinct one built once on meta, as each run's features are), an entry that does
    not import, `device: cuda` on a machine without CUDA when the runs are to run here."""
    import torch

    from memtrace_trainer.runs.train import build
    from memtrace_trainer.workload import user_function

    cuda = [it for it in items if it.config.device == "cuda"]
    if here and cuda and not torch.cuda.is_available():
        raise UserError(
            f"{source}: {counted(len(cuda), 'run')} "
            + ("asks" if len(cuda) == 1 else "ask")
            + f" for device cuda (run {cuda[0].index}, "
            f"{cuda[0].config.id}), and this machine has no CUDA device "
            "(torch.cuda.is_available() is False): give device auto (a CPU fallback) or cpu"
        )
    seen: set[tuple[Any, ...]] = set()
    for it in items:
        c = it.config
        key = (c.entry,) if c.entry else (c.model, c.input_shape, c.seq_len, c.num_classes)
        if key in seen:
            continue
        seen.add(key)
        run = f"{source}: run {it.index} ({c.model or c.entry})"
        said: list[str] = []
        try:
            with notes.captured(said.append):
                if c.entry:
                    user_function(c.entry, "entry")  # its function runs in the run alone
                else:
                    build(c, torch.device("meta"))
        except UserError as e:
            raise UserError(f"{run}: {sweep_terms(str(e))}") from None
        except Exception as e:  # the model's own code on meta: named, not an internal error
            raise UserError(f"{run}: building it raised {type(e).__name__}: {e}") from None
        for message in said:
            warn(f"{run}: {sweep_terms(message)}")


def sweep_terms(message: str) -> str:
    """A message of the model builder, which names the command line's flags (`--seq-len`), in
    the sweep file's terms (`seq_len`): the user wrote a setting, not a flag."""

    def setting(m: re.Match[str]) -> str:
        name = m.group(1).replace("-", "_")
        return name if name in SETTINGS else m.group(0)

    return re.sub(r"--([a-z][a-z0-9-]*)", setting, message).replace("the flag", "the setting")


def cpu_fallbacks(out: Path, items: list[Item]) -> tuple[int, int]:
    """(CPU-fallback runs, finished runs) of the sweep, from their labels."""
    finished = fallback = 0
    for it in items:
        target = run_dir(out, it)
        if not is_complete(target):
            continue
        finished += 1
        try:
            fallback += bool(json.loads((target / "labels.json").read_text()).get("cpu_fallback"))
        except (OSError, ValueError, AttributeError):
            pass  # a damaged label is `dataset`'s to name
    return fallback, finished


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
    out: Path, item: Item, env: dict[str, str], timeout_s: float | None, workers: Workers
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
        proc = workers.start(cmd, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT)
        if proc is None:
            return "interrupted", item.config.id
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc, signal.SIGKILL)  # its traced runs too
            proc.wait()
            rc = None
        finally:
            workers.ended(proc)
    if rc == 0 and is_complete(run_dir(out, item)):
        return "done", item.config.id
    if rc == 1 and failure_file(out, item).is_file():
        return "failed", item.config.id
    # A worker signalled by someone else than its launch may end before launch is told to stop.
    if workers.stop.is_set() or (rc == INTERRUPTED and workers.stop.wait(2.0)):
        return "interrupted", item.config.id
    tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-8:])
    why = (f"timed out after {timeout_s} s" if rc is None
           else "worker exited 0 without a run directory" if rc == 0
           else f"worker exited with {rc}")  # fmt: skip
    _record_failure(out, item, f"{why}; log tail:\n{tail}")
    return "failed", item.config.id


def _record_failure(out: Path, item: Item, error: str) -> None:
    """`failed/<id>.json` for a run whose worker could not record it (killed, timed out)."""
    failed = failure_file(out, item)
    failed.parent.mkdir(parents=True, exist_ok=True)
    write_json(failed, {"index": item.index, "id": item.config.id, "error": error})


def launch_local(
    out: Path,
    items: list[Item],
    workers: int | None,
    timeout_s: float | None,
    resubmit: bool = False,
) -> Progress:
    """Runs the runs not yet present here; runs submitted to Slurm before whose jobs have not
    finished them are left to those jobs unless `resubmit` (two writers of one run directory
    would mix two runs' files)."""
    pending = [it for it in items if not is_complete(run_dir(out, it))]
    progress = Progress(len(items), len(items) - len(pending))
    pending, held = _leave_to_their_jobs(out, pending, resubmit)
    slots = _slots(workers)
    print(
        f"launch: {counted(len(items), 'run')}, {progress.present} present (skipped), "
        + (f"{held} left to their Slurm jobs, " if held else "")
        + f"{len(pending)} to run on {len(slots)} worker(s): "
        + ", ".join(_describe(s) for s in slots),
        file=sys.stderr,
    )
    remove_leftovers(out, {it.config.id for it in pending})
    work: queue.Queue[Item] = queue.Queue()
    for it in pending:
        work.put(it)
    running = Workers()

    def worker(env: dict[str, str]) -> None:
        while not running.stop.is_set():
            try:
                item = work.get_nowait()
            except queue.Empty:
                return
            try:
                status, what = _run_worker(out, item, env, timeout_s, running)
            except Exception as e:  # this worker goes on with the queue; the run is failed
                _record_failure(out, item, f"launching its worker failed: {type(e).__name__}: {e}")
                status, what = "failed", item.config.id
            if status == "interrupted":
                continue  # neither done nor failed: the next launch runs it
            cause = failure_cause(out, item) if status == "failed" else ""
            progress.update(status, what, cause)

    threads = [threading.Thread(target=worker, args=(env,), daemon=True) for env in slots]
    # Set before the first thread starts: a signal while they start stops those started.
    with Interrupts() as interrupts:
        started: list[threading.Thread] = []
        try:
            for t in threads:
                t.start()
                started.append(t)
        except BaseException:
            interrupts.count += 1  # what started is stopped, and waited for, before it raises
            wait_for(running, started, interrupts)
            raise
        interrupted = wait_for(running, started, interrupts)
    if interrupted:
        raise KeyboardInterrupt  # SIGTERM too: said as an interrupted launch
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


def _leave_to_their_jobs(out: Path, pending: list[Item], resubmit: bool) -> tuple[list[Item], int]:
    """`pending` without the runs submitted to Slurm before whose jobs have not finished them
    (said), and how many those are; all of `pending` with `resubmit`."""
    earlier = submitted_jobs(out)
    held = [it for it in pending if it.config.id in earlier]
    if not held or resubmit:
        return pending, 0
    jobs = sorted({earlier[it.config.id] for it in held})
    were, have = ("was", "has") if len(held) == 1 else ("were", "have")
    warn(f"{counted(len(held), 'run')} {were} submitted before and {have} not finished (jobs "
         f"{', '.join(jobs[:3])}{', ...' if len(jobs) > 3 else ''}; {out / JOBS}): left to "
         "those jobs; pass --resubmit if they are gone (squeue)")  # fmt: skip
    return [it for it in pending if it.config.id not in earlier], len(held)


def launch_slurm(
    out: Path,
    items: list[Item],
    cluster: str,
    partition: str | None,
    timeout_min: int,
    parallelism: int,
    wait: bool,
    resubmit: bool = False,
) -> Progress:
    """Submits the runs not yet present as one job array through submitit; runs submitted
    before whose jobs have not finished them are left to those jobs unless `resubmit`."""
    submitit = require_submitit(cluster)
    pending = [it for it in items if not is_complete(run_dir(out, it))]
    progress = Progress(len(items), len(items) - len(pending))
    pending, held = _leave_to_their_jobs(out, pending, resubmit)
    if not pending:
        print(f"launch: {progress.present}/{counted(len(items), 'run')} present, {held} submitted "
              "before; nothing to submit", file=sys.stderr)  # fmt: skip
        return progress
    slurm = {"gpus_per_node": 1, "slurm_array_parallelism": parallelism}
    executor = array_executor(submitit, out / "submitit", cluster, "memtrace-run", timeout_min,
                              partition, slurm)  # fmt: skip
    manifest = str(out / MANIFEST)
    (out / "submitit").mkdir(parents=True, exist_ok=True)
    # Taken before submitting: a task that fails at once records its failure after it.
    now = time.time()
    jobs = executor.map_array(run_one, [it.index for it in pending], [manifest] * len(pending),
                              [it.config.id for it in pending])  # fmt: skip
    sent = {it.config.id for it in pending}
    kept = []
    if (out / JOBS).is_file():
        kept = [e for e in json.loads((out / JOBS).read_text()) if e["id"] not in sent]
    write_json(out / JOBS, kept + [
        {"index": it.index, "id": it.config.id, "job": j.job_id, "submitted": now}
        for it, j in zip(pending, jobs, strict=True)
    ])  # fmt: skip
    array = jobs[0].job_id.split("_")[0]
    print(
        f"launch: submitted {counted(len(jobs), 'run')} as job array {array} "
        f"({cluster}); rerun `launch` once they end: it submits the failed runs again (and, "
        "with --resubmit, those of jobs killed without a word)",
        file=sys.stderr,
    )
    if wait:
        for it, job in zip(pending, jobs, strict=True):
            try:
                result = job.result()
                progress.update(result["status"], it.config.id, result.get("error", ""))
            except Exception as e:  # a killed or timed-out array task
                error = f"{type(e).__name__}: {e}"
                failure_file(out, it).parent.mkdir(parents=True, exist_ok=True)
                write_json(failure_file(out, it), {"index": it.index, "id": it.config.id,
                                                    "error": error})  # fmt: skip
                progress.update("failed", it.config.id, error)
    return progress
