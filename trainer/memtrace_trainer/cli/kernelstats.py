"""Command group `kernel-stats`: the `k_` columns of one model, or of every GPUMemNet row."""

from __future__ import annotations

import argparse
import csv
import io
import json
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from memtrace_trainer.atomic import check_output_file
from memtrace_trainer.dtypes import AMP
from memtrace_trainer.errors import UserError, read_text

Handler = Callable[[argparse.Namespace], None]
KEY = "Filename"
# The settings every row was computed with: a resumed file must have been written with the same.
SETTINGS = ("optimizer", "amp", "device")


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    k = sub.add_parser(
        "kernel-stats",
        help="kernel statistics of one training step, estimated on meta (no GPU)",
        description="Runs the symbolic tracer's training step (two iterations, the second "
        "counted) and turns every dispatched aten op into the kernels CUDA would launch: class, "
        "FLOPs, bytes, grid; a roofline with a per-launch floor gives est. SM activity and "
        "launch-boundness. With --gpumemnet, one CSV row per dataset row keyed by Filename "
        "(status ok|error, and the optimizer, amp and device it was computed with; resumable: "
        "rows already in --out are kept when they were computed with the same settings).",
    )
    src = k.add_mutually_exclusive_group(required=True)
    src.add_argument("--gpumemnet", type=Path, metavar="CSV", help="a GPUMemNet dataset CSV")
    src.add_argument("--model", help="one model spec (prints JSON)")
    k.add_argument("--batch-size", type=int, help="samples per step (with --model)")
    k.add_argument("--out", type=Path, help="output CSV (with --gpumemnet)")
    k.add_argument("--limit", type=int, help="only the first N dataset rows")
    k.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    k.add_argument("--optimizer", default="adam", help="optimizer (default adam, as GPUMemNet)")
    k.add_argument("--amp", choices=list(AMP), help="autocast dtype (GPUMemNet: fp32)")
    k.add_argument(
        "--device",
        metavar="PROFILE",
        help="the GPU profile whose SMs and emulation are used, with its datasheet rates "
        "(kernelstats.RATES; default: the default profile, a100-40gb)",
    )
    return {"kernel-stats": run}


# The model spec sources (`symtrace --model`) besides gpumemnet: a Filename starting with one is
# a spec that `dataset` wrote, never a GPUMemNet file name (those start with `input`).
SPEC_SOURCES = ("synthetic", "torchvision", "timm", "hf", "hf-config", "dlrm", "gpumemnet")

# Worker state: set once per process (fork inherits it), so each task carries only a Filename.
_SETTINGS: dict[str, Any] = {}


def _row(filename: str) -> dict[str, str]:
    from memtrace_trainer import kernelstats
    from memtrace_trainer.models.gpumemnet import from_gpumemnet_filename
    from memtrace_trainer.models.zoo import build_workload
    from memtrace_trainer.symtrace.step import StepConfig

    cfg = StepConfig(optimizer=_SETTINGS["optimizer"], amp=_SETTINGS["amp"], iterations=2)
    said = _said(_SETTINGS)
    if filename.partition(":")[0] in SPEC_SOURCES:
        # A `dataset` CSV of our runs names a model without a GPUMemNet name by its spec.
        error = (f"Filename {filename[:60]!r} is a model spec, not a GPUMemNet file name (a "
                 "`dataset` CSV of runs?); --gpumemnet reads GPUMemNet's CSVs")  # fmt: skip
        return {KEY: filename, "status": "error", "error": error, **said}
    try:
        _, batch = from_gpumemnet_filename(filename)
        workload = build_workload(f"gpumemnet:{filename}", batch)
        gpu = _SETTINGS["device"]
        stats = kernelstats.summarize(kernelstats.step_kernels(workload, cfg, gpu), gpu)
    except Exception as e:  # every failure becomes this row's error status, never a dropped row
        return {KEY: filename, "status": "error", "error": f"{type(e).__name__}: {e}", **said}
    return {KEY: filename, "status": "ok", "error": "", **said,
            **{k: repr(v) for k, v in stats.items()}}  # fmt: skip


def _said(settings: dict[str, Any]) -> dict[str, str]:
    """The settings as the file's cells say them (amp `fp32` when autocast is off)."""
    return {
        "optimizer": settings["optimizer"],
        "amp": settings["amp"] or "fp32",
        "device": settings["device"].name,
    }


def _init_worker(settings: dict[str, Any]) -> None:
    import torch

    torch.set_num_threads(1)
    _SETTINGS.update(settings)


def _dataset_keys(path: Path, limit: int | None) -> list[str]:
    if not path.exists():
        raise UserError(f"--gpumemnet {path}: no such file")
    text = read_text(path, f"--gpumemnet {path}", "a GPUMemNet dataset CSV (UTF-8 text)", "")
    with io.StringIO(text, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or KEY not in reader.fieldnames:
            raise UserError(f"{path}: no {KEY!r} column (expected a GPUMemNet dataset CSV)")
        keys = [row[KEY].strip() for row in reader]
    if not keys:
        # It wrote an --out of a header alone and exited 0, as if every row had been computed.
        raise UserError(f"--gpumemnet {path}: no rows under its header (expected a GPUMemNet "
                        "dataset CSV with rows); nothing was written")  # fmt: skip
    return keys[:limit] if limit is not None else keys


def _complete_part(out: Path, width: int) -> tuple[str, bool]:
    """The text of `out` up to its last complete row, and whether the row after it was cut by
    an interruption: no line end after it (rows appended to it made one row of two), or fewer
    than `width` cells (cut after a line end inside a quoted cell). A short row before the last
    is no interruption: `_done_keys` refuses it."""
    text = ""
    if out.exists():
        text = read_text(out, f"--out {out}", "a CSV that kernel-stats wrote, to resume "
                         "(UTF-8 text), or a new file name", "")  # fmt: skip
    if not text:
        return text, False
    # The end of the last complete record: csv pulls lines, and a quoted cell may hold some.
    pulled = [0]

    def feed() -> Iterator[str]:
        for line in io.StringIO(text, newline=""):
            pulled[0] += len(line)
            yield line

    kept, last = 0, None
    for row in csv.reader(feed()):
        if pulled[0] == len(text):
            last = row
            break
        kept = pulled[0]
    # A file of one record is its header, whatever its width: `_done_keys` checks it.
    if text.endswith("\n") and (kept == 0 or last is None or len(last) >= width):
        return text, False
    return text[:kept], True


def _done_keys(
    text: str, out: Path, header: list[str], said: dict[str, str]
) -> tuple[set[str], int, str]:
    """Keys already written by an earlier run of the same columns and settings (the resume
    point), from the complete rows `text` of `out`, how many of them have status error, and the
    first of those errors. Rows of other settings are refused: a file mixing them would train
    on both."""
    if not text:
        return set(), 0, ""
    with io.StringIO(text, newline="") as f:
        reader = csv.reader(f)
        found = next(reader, None)
        if found != header:
            raise UserError(
                f"--out {out}: exists with other columns ({found}); remove it or pick another path"
            )
        done, failed, first = set(), 0, ""
        for line, row in enumerate(reader, 2):
            if len(row) != len(header):
                # Not the last row (`_complete_part` removed a cut one): kept, it was a second
                # row of its Filename once computed again, which the file's readers refuse.
                raise UserError(
                    f"--out {out}: line {reader.line_num} has {len(row)} fields, expected "
                    f"{len(header)} (a damaged row: only a cut last row is repaired); remove "
                    "that line to compute it again, or pick another path"
                )
            cells = dict(zip(header, row, strict=True))
            for name, want in said.items():
                if cells[name] != want:
                    raise UserError(
                        f"--out {out}: line {line} was computed with {name} {cells[name]!r}, "
                        f"this run asks for {want!r}; resuming would mix the two in one file "
                        "(remove it, pick another path, or pass the same settings)"
                    )
            done.add(row[0])
            if cells["status"] != "ok":
                failed += 1
                first = first or f"{row[0]}: {cells['error']}"
        return done, failed, first


def _results(todo: list[str], jobs: int, settings: dict[str, Any]) -> Iterator[dict[str, str]]:
    if jobs <= 1:
        _init_worker(settings)
        yield from map(_row, todo)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(jobs, initializer=_init_worker, initargs=(settings,)) as pool:
        yield from pool.imap(_row, todo, chunksize=4)


def _gpumemnet(args: argparse.Namespace, settings: dict[str, Any]) -> None:
    from memtrace_trainer.kernelstats import COLUMNS

    if args.out is None:
        raise UserError("--gpumemnet needs --out OUT.csv")
    check_output_file(args.out, "--out", "a CSV file to write")
    if args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: expected at least 1")
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit {args.limit}: expected at least 1")
    header = [KEY, "status", "error", *SETTINGS, *COLUMNS]
    keys = _dataset_keys(args.gpumemnet, args.limit)
    complete, cut = _complete_part(args.out, len(header))
    done, failed_before, first_before = _done_keys(complete, args.out, header, _said(settings))
    unique = list(dict.fromkeys(keys))
    todo = [k for k in unique if k not in done]
    repeated = len(keys) - len(unique)
    from memtrace_trainer.notes import warn

    if failed_before:
        # A row's failure is a fact of its name and settings (an unparsable name, a model
        # too large): computing it again would fail again, so it is kept, and said.
        warn(f"--out {args.out}: {failed_before} of its rows have status error and are not "
             "computed again (remove those rows to retry them)")  # fmt: skip
    if repeated:
        warn(f"{args.gpumemnet}: {repeated} rows repeat a Filename of an earlier row: each "
             f"Filename is one row of {args.out}, computed once")  # fmt: skip
    print(
        f"kernel-stats: {len(keys)} rows in {args.gpumemnet}"
        + (f" ({len(unique)} distinct Filenames)" if repeated else "")
        + f", {len(unique) - len(todo)} already in {args.out}, {len(todo)} to do with "
        f"{args.jobs} job(s)",
        file=sys.stderr,
    )
    if cut:
        warn(f"--out {args.out}: its last row was cut short (an interrupted run): removed, and "
             "computed again")  # fmt: skip
        with args.out.open("r+", newline="", encoding="utf-8") as f:
            f.truncate(len(complete.encode("utf-8")))  # bytes: the file is UTF-8 throughout
    fresh = not args.out.exists() or args.out.stat().st_size == 0
    start = last = time.monotonic()
    errors, first_error = 0, ""
    with args.out.open("a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=header, lineterminator="\n")
        if fresh:
            writer.writeheader()
        for i, row in enumerate(_results(todo, args.jobs, settings), 1):
            writer.writerow(row)
            f.flush()  # every finished row survives an interruption: the next run resumes
            if row["status"] != "ok":
                errors += 1
                first_error = first_error or f"{row[KEY]}: {row['error']}"
            now = time.monotonic()
            if now - last >= 5 or i == len(todo):
                last = now
                rate = i / max(now - start, 1e-9)
                print(
                    f"kernel-stats: {i}/{len(todo)} rows, {rate:.1f} rows/s, {errors} errors",
                    file=sys.stderr,
                )
    elapsed = time.monotonic() - start
    print(
        f"wrote {args.out}: {len(todo)} new rows ({errors} with status error) in {elapsed:.1f} s",
        file=sys.stderr,
    )
    if errors == len(todo) and failed_before == len(done) and (todo or done):
        # Every row failing is a setting or an input the tool cannot use, not a dataset: a
        # file of error rows only is no result to exit 0 on, on a rerun over it too.
        raise UserError(f"every row of {args.out} failed ({errors} computed now, "
                        f"{failed_before} before; status error); the first: "
                        f"{first_before or first_error}")  # fmt: skip
    if errors:
        warn(f"{errors} of the {len(todo)} rows computed failed (status error in {args.out}); "
             f"the first: {first_error}")  # fmt: skip


def run(args: argparse.Namespace) -> None:
    from memtrace_trainer import kernelstats
    from memtrace_trainer.symtrace.step import StepConfig

    StepConfig(optimizer=args.optimizer, amp=args.amp).validate()
    settings = {
        "optimizer": args.optimizer,
        "amp": args.amp,
        "device": kernelstats.profile_device(args.device),
    }
    from memtrace_trainer.notes import warn

    # Each source has flags of its own; one given to the other source is said, not dropped.
    if args.gpumemnet is not None:
        if args.batch_size is not None:
            warn(f"--batch-size {args.batch_size} has no effect with --gpumemnet: each row "
                 "traces at its own batch size")  # fmt: skip
        _gpumemnet(args, settings)
        return
    for flag, given in (("--out", args.out), ("--limit", args.limit),
                        ("--jobs", None if args.jobs == 1 else args.jobs)):  # fmt: skip
        if given is not None:
            warn(f"{flag} {given} has no effect with --model: one model's stats are printed as "
                 "JSON")  # fmt: skip
    from memtrace_trainer.models.zoo import build_workload

    if args.batch_size is None:
        raise UserError("--model needs --batch-size N")
    workload = build_workload(args.model, args.batch_size)
    cfg = StepConfig(optimizer=args.optimizer, amp=args.amp, iterations=2)
    kernels = kernelstats.step_kernels(workload, cfg, settings["device"])
    print(
        json.dumps(
            {
                "model": workload.spec,
                "batch_size": args.batch_size,
                "device": settings["device"].name,
                "kernels_by_kind": kernelstats.count_by_kind(kernels),
                **kernelstats.summarize(kernels, settings["device"]),
            }
        )
    )
