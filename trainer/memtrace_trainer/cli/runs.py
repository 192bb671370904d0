"""Command group of GPU runs: `run`, `launch` and `dataset`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from memtrace_trainer.cli.common import positive, slurm_partition, traced_batch_size
from memtrace_trainer.dtypes import AMP
from memtrace_trainer.errors import UserError, check_batch_size, read_text, require_batch_size
from memtrace_trainer.notes import counted, warn
from memtrace_trainer.runs.config import DEVICES, RunConfig
from memtrace_trainer.units import MIB

Handler = Callable[[argparse.Namespace], int | None]

# `launch --timeout-min`'s default, per run.
TIMEOUT_MIN = 60


def _run_parser(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "run",
        help="train a model on a GPU and record memory labels",
        description="Train on synthetic data for N iterations (or T seconds) and write a run "
        "directory: config.json, features.json, labels.json (max_memory_reserved/allocated, "
        "memory_stats, NVML device peak at >= 10 Hz, step time, OOM) and, with --trace, the "
        "shim's device- and allocator-level traces. Without CUDA it falls back to the CPU, "
        "says so, and leaves the CUDA labels null.",
    )
    src = r.add_mutually_exclusive_group()
    src.add_argument("--model", help="model spec (as symtrace)")
    src.add_argument("--entry", metavar="MOD:FN", help="package.module:function (as symtrace)")
    traced_batch_size(r)
    r.add_argument("--input-shape", help="per-sample input shape C,H,W (default: the model's)")
    r.add_argument("--seq-len", type=int, help="sequence length of token models")
    r.add_argument("--num-classes", type=int, help="classifier width (default: the model's)")
    r.add_argument("--optimizer", default="adam", help="adam|adamw|sgd|sgd-momentum|...")
    r.add_argument("--iterations", type=int, help="training iterations (default 10)")
    r.add_argument("--seconds", type=float, help="train for T seconds instead (>= 2 iterations)")
    r.add_argument("--amp", choices=list(AMP), help="autocast dtype (fp16: GradScaler)")
    r.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    # No argparse default where RunConfig has one: a flag not given is left out of the config,
    # which fills its own default (`_config_from_args`), and the help shows that one.
    r.add_argument(
        "--grad-accum",
        type=int,
        help=f"micro-batches per optimizer step (default {RunConfig.grad_accum})",
    )
    r.add_argument(
        "--device",
        default="auto",
        choices=DEVICES,
        help="auto: CUDA when available, else a loud CPU fallback",
    )
    r.add_argument("--profile", help="GPU profile NAME this machine matches (recorded)")
    r.add_argument(
        "--nvml-hz", type=float, help=f"NVML samples/s (>= 10; default {RunConfig.nvml_hz:g})"
    )
    r.add_argument(
        "--trace",
        action="store_true",
        help="run twice under LD_PRELOAD=libmemtrace.so: caching on (device-level "
        "trace) and PYTORCH_NO_CUDA_MEMORY_CACHING=1 (allocator-level trace)",
    )
    r.add_argument("--out", type=Path, help="run directory to create")
    r.add_argument("--json", action="store_true", help="print the labels as JSON")
    # The traced children of --trace: train one config, write only its labels.
    r.add_argument("--from-config", type=Path, help=argparse.SUPPRESS)
    r.add_argument("--labels-out", type=Path, help=argparse.SUPPRESS)

    la = sub.add_parser(
        "launch",
        help="run a sweep (local GPUs/CPU workers or a Slurm array)",
        description="Run every config of a sweep file into OUT/runs/<id>/. Resumable: finished "
        "runs are skipped, failed ones (OUT/failed/<id>.json) retried. local: one worker per "
        "visible GPU (CPU machines: --workers parallel CPU workers); slurm: one job array "
        "through submitit. Every backend calls run_one(index, OUT/manifest.jsonl).",
    )
    la.add_argument("sweep", type=Path, help="YAML sweep file (see runs/sweep.py)")
    la.add_argument("--out", type=Path, required=True, help="sweep output directory")
    la.add_argument("--backend", choices=["local", "slurm"], default="local")
    la.add_argument("--dry-run", action="store_true", help="list the configs and their status")
    la.add_argument("--workers", type=positive("--workers"),
                    help="local: parallel workers (default: one per GPU)")  # fmt: skip
    # No argparse default: a limit given is told from none, where it has no effect.
    la.add_argument("--timeout-min", type=positive("--timeout-min"),
                    help=f"per run, minutes (default {TIMEOUT_MIN})")  # fmt: skip
    la.add_argument("--partition", type=slurm_partition, help="Slurm partition (--backend slurm)")
    la.add_argument("--array-parallelism", type=positive("--array-parallelism"), default=None,
                    help="Slurm array %% limit (--backend slurm; default 64)")  # fmt: skip
    la.add_argument(
        "--submitit-cluster",
        choices=["slurm", "local", "debug"],
        help="submitit executor for --backend slurm (default slurm; local: same array, this "
        "machine)",
    )
    la.add_argument("--wait", action="store_true", help="slurm: wait for the array to finish")
    la.add_argument(
        "--resubmit",
        action="store_true",
        help="run or submit again the runs submitted to Slurm before whose jobs have not "
        "finished them (OUT/submitit/jobs.json; default: leave them to those jobs)",
    )

    d = sub.add_parser(
        "dataset",
        help="collect run directories into one CSV",
        description="GPUMemNet columns plus max_memory_reserved_mib, max_memory_allocated_mib, "
        "device_peak_mib (NVML), oom, gpu, torch, cuda, profile. `Max GPU Memory (MiB)` is "
        "the NVML peak (nvidia-smi-style truth); reserved is the allocator-fidelity truth.",
    )
    d.add_argument("dir", type=Path, help="directory holding run directories (searched deeply)")
    d.add_argument("--out", type=Path, required=True, help="CSV to write")
    d.add_argument(
        "--include-cpu",
        action="store_true",
        help="keep CPU-fallback runs (their GPU labels are empty)",
    )


def _config_from_args(args: argparse.Namespace) -> object:
    if not args.model and not args.entry:
        raise UserError("one of --model or --entry is required")
    # As `estimate` takes it: a model, or an entry that takes `batch_size`, needs one (left
    # without, it trained at batch 1 under a run id of "b1"); an entry of its own batch runs it.
    check_batch_size(args.batch_size, optional=True)
    require_batch_size(args.batch_size, args.entry, args.model)
    # Every field is a flag of `run`'s; one not given takes the config's default (10 iterations).
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunConfig)}
    cfg = RunConfig(**{name: value for name, value in given.items() if value is not None})
    cfg.validate("run")
    if args.profile is not None:
        from memtrace_trainer.profile import load_profile

        try:
            load_profile(args.profile)  # recorded, and read back by `dataset` and `compare`
        except UserError as e:
            raise UserError(f"--profile {args.profile}: {e}") from None
    if args.seconds is not None and args.iterations is not None:
        warn(f"--iterations {args.iterations} has no effect: --seconds {args.seconds} decides "
             "how long the run trains")  # fmt: skip
    return cfg


def _run(args: argparse.Namespace) -> None:
    from memtrace_trainer.runs.rundir import execute, write_json
    from memtrace_trainer.runs.train import train

    if args.from_config:
        if args.labels_out is None:
            raise UserError("--from-config needs --labels-out")
        where = f"--from-config {args.from_config}"
        text = read_text(args.from_config, where, "a run's config.json (UTF-8 JSON)")
        try:
            data = json.loads(text)
        except ValueError as e:
            raise UserError(f"{where}: cannot read it ({e})") from None
        if not isinstance(data, dict):
            raise UserError(f"--from-config {args.from_config}: expected a JSON object (a run's "
                            "config.json)")  # fmt: skip
        data = {k: v for k, v in data.items() if k not in ("id", "trainer")}
        write_json(args.labels_out, train(RunConfig.from_dict(data, str(args.from_config))))
        return
    if args.out is None:
        raise UserError("--out DIR is required")
    cfg = _config_from_args(args)
    assert isinstance(cfg, RunConfig)
    try:
        labels = execute(cfg, args.out, trace=args.trace)
    except UserError:
        raise
    except Exception as e:  # a crash of the training step itself (OOMs are labels)
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise UserError(
            f"the run failed: {type(e).__name__}: {e} (at {where.filename}:{where.lineno})"
        ) from e
    if labels.get("cpu_fallback") and args.profile is not None:
        # The profile names the GPU this run measures; on the CPU it measured none, and the
        # recorded profile would read as a GPU's run of that kind.
        warn(f"--profile {args.profile} was not measured: the run trained on the CPU "
             f"({labels.get('cpu_fallback_reason')}), so it has no GPU labels for that profile; "
             "the profile is recorded in config.json, and `dataset` leaves the run out unless "
             "--include-cpu")  # fmt: skip
    if labels.get("cpu_fallback") and args.nvml_hz is not None:
        warn(f"--nvml-hz {args.nvml_hz:g} has no effect: the run trained on the CPU "
             f"({labels.get('cpu_fallback_reason')}), and NVML samples a GPU")  # fmt: skip
    if args.json:
        print(json.dumps(labels))
        return

    def fmt(v: int | None) -> str:
        return "null" if v is None else f"{v / MIB:.1f} MiB"

    where = "CPU FALLBACK" if labels["cpu_fallback"] else labels["gpu"]
    print(
        f"wrote {args.out} ({where}): {labels['iterations_done']} iterations, "
        f"oom={str(labels['oom']).lower()}, max_memory_reserved "
        f"{fmt(labels['max_memory_reserved_bytes'])}, device_peak "
        f"{fmt(labels['device_peak_bytes'])}"
    )


def _launch_flags_without_effect(args: argparse.Namespace) -> list[str]:
    """The flags the chosen backend does not read."""
    if args.backend == "local":
        given = [
            ("--partition", args.partition),
            ("--array-parallelism", args.array_parallelism),
            ("--submitit-cluster", args.submitit_cluster),
            ("--wait", args.wait or None),
        ]
        why = "--backend local runs here, one worker per GPU"
    else:
        given = [("--workers", args.workers)]
        why = "--backend slurm runs one array task per run"
    said = [f"{flag} has no effect: {why}" for flag, v in given if v is not None]
    if args.backend == "slurm":
        from memtrace_trainer.cli.common import outside_slurm

        said += outside_slurm(args.submitit_cluster, [("--partition", args.partition),
                              ("--array-parallelism", args.array_parallelism)],
                              args.timeout_min)  # fmt: skip
    return said


def _launch(args: argparse.Namespace) -> int:
    from memtrace_trainer.runs.launch import (
        MANIFEST,
        check_manifest,
        launch_local,
        launch_slurm,
        out_lock,
        preflight,
        require_submitit,
        status_of,
        submitted_jobs,
    )
    from memtrace_trainer.runs.sweep import load_sweep, write_manifest

    items = load_sweep(args.sweep)
    for w in _launch_flags_without_effect(args):
        warn(w)
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out}: exists and is not a directory")
    if args.resubmit and not submitted_jobs(args.out):
        warn(f"--resubmit has no effect: no run in {args.out} was submitted to Slurm and left "
             "unfinished (submitit/jobs.json)")  # fmt: skip
    cluster = args.submitit_cluster or "slurm"
    timeout_min = args.timeout_min or TIMEOUT_MIN
    # Everything is checked before the first run (and by --dry-run); CUDA only where the runs
    # are to run: a Slurm login node without a GPU sends them to nodes with one.
    preflight(items, str(args.sweep), here=args.backend == "local" or cluster != "slurm")
    if args.dry_run:
        check_manifest(args.out, items, args.sweep)
        submitted = submitted_jobs(args.out)
        for it in items:
            c = it.config
            print(
                f"{it.index:5d}  {c.id}  {status_of(args.out, it, submitted):13s}  "
                f"{c.model or 'entry:' + str(c.entry)}  batch "
                + ("(the entry's own)" if c.batch_size is None else str(c.batch_size))
            )
        print(f"{len(items)} config{'s' * (len(items) != 1)} (dry run: nothing was run)",
              file=sys.stderr)  # fmt: skip
        return 0
    if args.backend == "slurm":
        require_submitit(cluster)  # before anything is written
    with out_lock(args.out):
        check_manifest(args.out, items, args.sweep)
        write_manifest(args.out / MANIFEST, items)
        if args.backend == "local":
            try:
                progress = launch_local(args.out, items, args.workers, timeout_min * 60.0,
                                        args.resubmit)  # fmt: skip
            except KeyboardInterrupt:
                # Raised once the workers have ended, and said once the lock is let go.
                raise UserError(
                    f"interrupted: no new run was started, and the runs in flight were stopped "
                    f"and left pending; rerun the same launch to go on ({args.out})"
                ) from None
        else:
            progress = launch_slurm(args.out, items, cluster, args.partition, timeout_min,
                                    args.array_parallelism or 64, args.wait,
                                    args.resubmit)  # fmt: skip
    print(progress.line(), file=sys.stderr)
    _say_cpu_fallbacks(args.out, items)
    if progress.failed:
        causes = list(progress.causes.items())
        for run_id, cause in causes[:SHOWN_FAILURES]:
            print(f"launch: failed {run_id}: {cause}", file=sys.stderr)
        if len(causes) > SHOWN_FAILURES:
            print(f"launch: ... and {len(causes) - SHOWN_FAILURES} more", file=sys.stderr)
        failed = counted(progress.failed, "run")
        warn(f"{failed} failed: see {args.out / 'failed'}/ (a rerun retries them)")
        return 1
    return 0


SHOWN_FAILURES = 20


def _say_cpu_fallbacks(out: Path, items: list) -> None:
    """A sweep that trained on the CPU has no GPU labels: said in its summary, not only in
    each run's log."""
    from memtrace_trainer.runs.launch import cpu_fallbacks

    fallback, finished = cpu_fallbacks(out, items)
    if not fallback:
        return
    if finished == 1:
        which, their, them = "the one finished run", "its", "it"
    else:
        which = f"all {finished}" if fallback == finished else f"{fallback} of {finished}"
        which, their, them = f"{which} finished runs", "their", "them"
    warn(f"{which} in {out} trained on the CPU (CPU FALLBACK): {their} CUDA labels are null, and "
         f"`dataset` leaves {them} out unless --include-cpu")  # fmt: skip


def _dataset(args: argparse.Namespace) -> None:
    from memtrace_trainer.atomic import check_output_file, write_text
    from memtrace_trainer.runs.dataset import collect

    check_output_file(args.out, "--out", "the CSV file to write")
    text, summary = collect(args.dir, args.include_cpu)
    skipped = summary["skipped_cpu_runs"]
    if summary["rows"] == 0:
        # A header alone is no dataset: every reader of it (compare, calibrate) refuses it.
        failed = summary["failed"]
        cpu = ("its one run is a CPU-fallback run" if len(skipped) == 1
               else f"all {len(skipped)} are CPU-fallback runs")  # fmt: skip
        why = (f"{cpu}, with no GPU labels (--include-cpu keeps them)" if skipped
               else "no finished run directory is under it"
               + (f" ({failed} run{'s' * (failed != 1)} failed: see the warnings above)"
                  if failed else ""))  # fmt: skip
        raise UserError(f"dataset {args.dir}: no run to write: {why}; {args.out} not written")
    write_text(args.out, text)
    rows = summary["rows"]
    print(
        f"wrote {args.out}: {rows} run{'s' * (rows != 1)}"
        + (
            f"; skipped {len(skipped)} CPU-fallback run{'s' * (len(skipped) != 1)} (no GPU "
            "labels; --include-cpu keeps them)"
            if skipped
            else ""
        )
    )


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    _run_parser(sub)
    return {"run": _run, "launch": _launch, "dataset": _dataset}
