"""Command group of the fit questions: `estimate`, `max-batch`, and the `fake-tensor` baseline
(cli/faketensor.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrace_trainer import notes
from memtrace_trainer.cli import faketensor
from memtrace_trainer.cli.common import (
    answered_as_json,
    check_script_args,
    finetune_args,
    flag_of,
    model_source,
    print_defaults,
    resolve_steps,
    script_args,
    shape_args,
    step_args,
    step_config,
    steps_default,
    traced_batch_size,
    tune_from,
    workloads,
    workloads_by_seq,
)
from memtrace_trainer.errors import (
    UserError,
    check_batch_size,
    needs_batch_size,
    require_batch_size,
)
from memtrace_trainer.profile import DEFAULT_PROFILE, capacity_source_text
from memtrace_trainer.units import MIB

# `max-seq --limit`'s default.
SEQ_LIMIT = 131072
# The ML model `--ml-model` defaults to (`estimate.estimate_job` reads it).
ML_MODEL_VAR = "MEMTRACE_ML_MODEL"

Handler = Callable[[argparse.Namespace], int | None]


def _model_source(p: argparse.ArgumentParser, step: bool = True, script: bool = False) -> None:
    model_source(p, step=step, script=script)
    shape_args(p)


def _fit_args(p: argparse.ArgumentParser, profile: str = "GPU profile NAME or .toml path") -> None:
    """The job's loop and fine-tuning regime, then the GPU its fit is judged on: `--profile`,
    `--capacity` and `--point`."""
    step_args(p)
    finetune_args(p)
    p.add_argument(
        "--profile", default=DEFAULT_PROFILE, help=f"{profile} (default {DEFAULT_PROFILE})"
    )
    p.add_argument(
        "--capacity",
        metavar="SIZE",
        help="the GPU's total memory, e.g. 40GiB or 40960MiB (memory outside the allocator is "
        "subtracted inside; default: the profile's total memory)",
    )
    p.add_argument(
        "--point",
        action="store_true",
        help="judge the fit on the point estimate instead of the safe number (the point plus "
        "the profile's calibrated margin)",
    )


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    faketensor.add_parser(sub)
    e = sub.add_parser(
        "estimate",
        help="does the job fit, and how much device memory it needs",
        description="Symbolic trace + features, then `memest estimate --trace T --features F "
        "--profile NAME --json`. The first line is the verdict on the symbolic estimate, the "
        "number to act on; the baselines follow, each saying what it ignores. --json passes "
        "memest's schema-3 object through whole (estimators/README.md) and adds the job's "
        "inputs, defaults and warnings. Exit status 0 fits, 1 does not fit, 2 error. memest is "
        "found via $MEMTRACE_BIN_DIR, then PATH, then target/release.",
    )
    _model_source(e, script=True)
    script_args(e)
    traced_batch_size(e)
    _fit_args(e, "GPU profile")
    e.add_argument("--ml-model", type=Path, help="trained ML model (or $MEMTRACE_ML_MODEL)")
    e.add_argument(
        "--memtracker",
        action="store_true",
        help="also run PyTorch's MemTracker over the same steps as a baseline (slow: 10-25x "
        "the symbolic trace)",
    )
    e.add_argument(
        "--no-fake-tensor",
        action="store_true",
        help="leave out the FakeTensor baseline, which runs the job a second time on the plain "
        "meta device (a --step builder is called again, a --script is never rerun); the "
        "symbolic estimate and the verdict do not use it",
    )
    e.add_argument(
        "--report",
        type=Path,
        metavar="OUT.html",
        help="also write one self-contained HTML page (memsim report): memory over the step by "
        "category, what is alive at the peak, the segment map, the estimators side by side and "
        "the verdict",
    )
    e.add_argument("--json", action="store_true", help="print JSON")

    m = sub.add_parser(
        "max-batch",
        help="largest batch that fits a GPU profile",
        description="Binary search of the batch size with symbolic traces, each checked by "
        "`memsim replay --profile P --capacity C`: the same fit check as `estimate`, so the "
        "answer fits by `estimate` and the next batch does not. Exit status 0, or 1 when not "
        "even batch 1 fits.",
    )
    _model_source(m)
    _fit_args(m)
    m.add_argument("--limit", type=int, default=1 << 16, help="largest batch tried (65536)")
    # The searched axis: taken only to be refused in words (`_searched`), not as argparse's
    # "unrecognized arguments" under the top-level usage.
    m.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    m.add_argument("--json", action="store_true", help="print JSON")

    q = sub.add_parser(
        "max-seq",
        help="longest sequence that fits a GPU profile, at a fixed batch size",
        description="Binary search of the sequence length (in steps of --multiple-of tokens) "
        "with symbolic traces, each checked by `memsim replay --profile P --capacity C`, the "
        "fit check of `estimate`: the answer fits by `estimate` and the next step does not. "
        "For token models: --model hf:REPO_ID (or any zoo model that takes --seq-len) or an "
        "--entry function taking `seq_len`. Exit status 0, or 1 when not even one step fits.",
    )
    model_source(q, "package.module:function taking seq_len", step=False)
    q.add_argument(
        "--batch-size",
        type=int,
        help="samples per step (default 1; an --entry function without a `batch_size` parameter "
        "builds its own batch)",
    )
    q.add_argument("--num-classes", type=int, help="classifier width (classification tasks)")
    _fit_args(q)
    q.add_argument(
        "--multiple-of",
        type=int,
        default=64,
        help="sequence lengths tried are multiples of this (default 64)",
    )
    # None, not its value, so that a --limit given past the model's positions is told apart.
    q.add_argument(
        "--limit",
        type=int,
        help=f"longest sequence tried ({SEQ_LIMIT}; no longer than the model's positions)",
    )
    q.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)  # refused by `_searched`
    q.add_argument("--json", action="store_true", help="print JSON")
    n = sub.add_parser(
        "min-world-size",
        help="fewest GPUs a sharded job fits on, per-GPU need from rank 0's trace",
        description="Traces the job at each world size of --world-sizes (ascending) with "
        "--strategy, and checks rank 0 with `memsim replay --profile P --capacity C`, the fit "
        "check of `estimate`; stops at the first that fits. Exit status 0, or 1 when none fits.",
    )
    _model_source(n, step=False)
    traced_batch_size(n, per="step per GPU")
    _fit_args(n)
    n.add_argument(
        "--world-sizes",
        default="1,2,4,8,16,32,64,128,256,512",
        help="world sizes to try, ascending (default powers of two to 512)",
    )
    n.add_argument("--json", action="store_true", help="print JSON")
    return {
        "fake-tensor": faketensor.run,
        "estimate": _estimate,
        "max-batch": _max_batch,
        "max-seq": _max_seq,
        "min-world-size": _min_world_size,
    }


def _step(args: argparse.Namespace) -> Any:
    return step_config(vars(args), resolve_steps(vars(args)))


def _workloads(args: argparse.Namespace) -> Callable[[int], Any]:
    return workloads(vars(args))


def estimate_result(args: argparse.Namespace) -> dict[str, Any]:
    """The answer of `estimate` for parsed arguments: the object `--json` prints. `serve` calls
    it too, so a served estimate is this command's, number for number."""
    from memtrace_trainer.estimate import ModelJob, ScriptJob, StepJob, estimate_job

    check_script_args(vars(args))
    if args.report is not None:
        # Said before the trace, not after it (minutes, for a large model).
        folder = Path(args.report).resolve().parent
        if not folder.exists():
            raise UserError(f"--report {args.report}: the folder {folder} does not exist")
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise UserError(f"--report {args.report}: {folder} is not a folder this user can "
                            "write to")  # fmt: skip
        if Path(args.report).is_dir():
            raise UserError(f"--report {args.report}: a folder; expected a file name ending "
                            "in .html or .htm")  # fmt: skip
        if Path(args.report).suffix.lower() not in (".html", ".htm"):
            raise UserError(f"--report {args.report}: expected a file name ending in .html "
                            "or .htm (the page is HTML)")  # fmt: skip
    _ml_model(args)
    if args.script:
        if args.no_fake_tensor:
            notes.warn("--no-fake-tensor has no effect with --script: the FakeTensor baseline "
                       "never runs a script a second time")  # fmt: skip
        job: Any = ScriptJob(
            args.script, list(args.script_args), resolve_steps(vars(args)), args.world_size
        )
    elif args.step:
        from memtrace_trainer.symtrace.userstep import step_batch

        steps = resolve_steps(vars(args))
        job = StepJob(args.step, steps, args.world_size, step_batch(args.step, args.batch_size))
    else:
        require_batch_size(args.batch_size, args.entry, args.model)
        build = _workloads(args)
        shape = {k: getattr(args, k) for k in ("seq_len", "input_shape", "num_classes")}
        job = ModelJob(lambda: build(args.batch_size), _step(args), shape)
    job.steps_given = args.iterations is not None
    return estimate_job(
        job,
        args.profile,
        args.ml_model,
        None if args.json else lambda s: print(s, file=sys.stderr),
        capacity=args.capacity,
        point=args.point,
        with_memtracker=args.memtracker,
        report=args.report,
        with_fake_tensor=not args.no_fake_tensor,
    )


def _ml_model(args: argparse.Namespace) -> None:
    """`--ml-model`: read by memest with the model's features, which a step function or a
    script does not expose (said to have no effect there); otherwise a file that is there,
    checked before the trace (memest's "No such file" named no flag, after minutes)."""
    path, where = args.ml_model, f"--ml-model {args.ml_model}"
    if path is None and os.environ.get(ML_MODEL_VAR):
        # The variable stands for the flag: a message names the one the user set.
        path, where = Path(os.environ[ML_MODEL_VAR]), f"${ML_MODEL_VAR}={os.environ[ML_MODEL_VAR]}"
    if path is None:
        return
    if args.step or args.script:
        if args.ml_model is not None:  # an environment's default is not asked for each job
            what = "--step" if args.step else "--script"
            notes.warn(f"--ml-model has no effect with {what}: the ML estimate needs the "
                       "model's features, which your code does not expose")  # fmt: skip
    elif not path.is_file():
        found = ("a folder" if path.is_dir() else "not a regular file (a pipe or a device)"
                 if path.exists() else "no such file")  # fmt: skip
        raise UserError(f"{where}: {found}; expected a trained ML model file (memest ml "
                        "train)")  # fmt: skip


def _estimate(args: argparse.Namespace) -> int:
    from memtrace_trainer.estimate import render

    result = estimate_result(args)
    if args.json:
        print(json.dumps(result))
    else:
        print_defaults(result["inputs"]["defaults"])
        print(render(result))
        if result.get("report"):
            print(f"report: {result['report']}")
    return 0 if result["verdict"]["fits"] else 1


def _need_where(result: dict[str, Any], profile: str, per: str = "") -> tuple[str, str]:
    """The need a search answered with, and the capacity it answered for with where it came
    from: in bytes when the two would print alike ("needs 2149.0 MiB" beside "does not fit on
    2149.0 MiB")."""
    from memtrace_trainer.estimate import need_and_capacity_mib

    need, cap = need_and_capacity_mib(result["need_bytes"] / MIB, result["capacity_bytes"] / MIB)
    src = capacity_source_text(result["capacity_source"])
    return need, f"{cap}{per} ({src}, profile {profile})"


def _search_answer(
    args: argparse.Namespace,
    result: dict[str, Any],
    key: str,
    none: str,
    found: str,
    at: Callable[[int], str],
    unit: str = "",
) -> int:
    """Prints a search's answer (`max-batch`, `max-seq`): JSON, or a line saying `found` (the
    largest that fits, in `unit`), or `none` when nothing fits, with what the probe it stands on
    needs (`at` words the result's `need_at_*`). Exit 1 when nothing fits."""
    code = 0 if result[key] > 0 else 1
    if answered_as_json(result, args.json):
        return code
    who, (need, where) = result["model"], _need_where(result, args.profile)
    strategy, world = getattr(args, "strategy", None), getattr(args, "world_size", None)
    if strategy or world:
        from memtrace_trainer.maxbatch import ranks

        # A sharded job's answer is one rank's: the batch each GPU takes, on each GPU's memory.
        over = f"{strategy} over {ranks(world)}" if strategy else ranks(world)
        per = "the batch and the need are" if key == "max_batch" else "the need is"
        who = f"{who} ({over}; {per} per GPU)"
        need, where = _need_where(result, args.profile, " per GPU")
    need_at = next(v for k, v in result.items() if k.startswith("need_at_"))
    detail = (
        f"({result['basis']}; point {result['point_bytes'] / MIB:.1f} MiB = peak reserved "
        f"{result['peak_reserved_mib']:.1f} MiB + outside the allocator); "
        f"{notes.counted(len(result['probes']), 'probe')} in {result['seconds']:.1f} s"
    )
    if result[key] == 0:
        # The smallest probe's need: how far from fitting the job is, not only that it is not.
        print(f"{who}: does not fit even at {none} on {where}: needs {need} even at "
              f"{at(need_at)} {detail}")  # fmt: skip
        return code
    more = f" ({result['limit_why']})" if result["hit_limit"] and result.get("limit_why") else ""
    if result["hit_limit"] and not more:
        more = " (the --limit; larger may fit)"
    print(f"{who}: {found} on {where}: {result[key]}{unit}{more}; needs {need} there "
          f"{detail}")  # fmt: skip
    return code


def _max_batch(args: argparse.Namespace) -> int:
    from memtrace_trainer.maxbatch import max_batch, trace_model, trace_step_fn

    _searched(args, "max-batch", "batch_size", "the batch size", "--limit caps it")
    steps = resolve_steps(vars(args))
    if args.step:
        trace_at = trace_step_fn(args.step, steps, args.world_size)
    else:
        if args.entry:
            from memtrace_trainer.models.zoo import entry_takes

            entry_takes(args.entry, "batch_size", "max-batch")
        trace_at = trace_model(_workloads(args), _step(args))
    result = max_batch(trace_at, steps, args.profile, args.capacity, args.limit, args.point)
    result["defaults"] |= steps_default(vars(args), steps)
    result["model"] = f"step:{args.step}" if args.step else args.model or args.entry
    result["inputs"] = _search_inputs(args)
    # The smallest batch probed: 2 where the model refuses batch 1 (BatchNorm; said in a warning).
    none = f"batch {result['need_at_batch']}"
    return _search_answer(
        args, result, "max_batch", none, "largest batch that fits", lambda n: f"batch {n}"
    )


def _searched(args: argparse.Namespace, command: str, dest: str, what: str, cap: str) -> None:
    """The searched axis given as a flag, as `min-world-size` refuses --world-size."""
    if getattr(args, dest, None) is not None:
        raise UserError(f"{command} searches {what}: leave out {flag_of(dest)} ({cap})")


def _search_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The job a search searched, as `estimate --json` names it: the shape flags given, the
    step, and the fine-tuning regime (a QLoRA answer must not read as a full fine-tune's)."""
    if getattr(args, "step", None):  # max-seq takes no --step
        return {"step": args.step}
    from memtrace_trainer.estimate import step_inputs

    shape = {k: getattr(args, k, None) for k in ("seq_len", "input_shape", "num_classes")}
    return {
        **{k: v for k, v in shape.items() if v is not None},
        **step_inputs(_step(args)),
        "attn": getattr(args, "attn", None),
        "fine_tuning": tune_from(vars(args)).regime.to_json(),
    }


def _max_seq(args: argparse.Namespace) -> int:
    from memtrace_trainer.maxbatch import max_seq, trace_model_seq

    _searched(args, "max-seq", "seq_len", "the sequence length", "--limit caps it, "
              "--multiple-of sets its steps")  # fmt: skip
    check_batch_size(args.batch_size, optional=True)
    batch = args.batch_size
    # --model or --entry: entry is None for a model, which needs_batch_size counts as sized.
    if batch is None and needs_batch_size(args.entry):
        batch = 1  # the documented default; an entry without the parameter builds its own
    values = vars(args) | {"seq_len": None, "input_shape": None}
    steps = resolve_steps(values)
    if args.entry:
        from memtrace_trainer.models.zoo import entry_takes

        entry_takes(args.entry, "seq_len", "max-seq")
        # A hf: model's position table caps the answer; an entry's model is the user's own.
        notes.warn(f"max-seq --entry {args.entry}: the longest sequence its model accepts (a "
                   "learned position table, a fixed mask) is not known here, so the answer is "
                   "memory's limit alone: check it against the model's")  # fmt: skip
    given = args.limit
    limit, cap = _seq_limit(args.model, SEQ_LIMIT if given is None else given)
    multiple = args.multiple_of
    if cap is not None and given is not None and limit >= multiple:
        # As --multiple-of past the cap is refused: a --limit past it is not taken silently.
        notes.warn(f"--limit {given} is beyond {args.model}'s {cap} ({limit}): a real run takes "
                   f"no longer sequence, so the search stops at {limit}")  # fmt: skip
    if cap is not None and 0 < limit < multiple:
        # The cap is the model's, not a --limit the user gave: the error names its source.
        raise UserError(f"--multiple-of {multiple}: expected at most {limit} tokens, the "
                        f"model's {cap} (a real run takes no longer sequence)")  # fmt: skip
    built, traced = _batch_seen(workloads_by_seq(values))
    trace_at = trace_model_seq(built, _step(args), batch)
    result = max_seq(trace_at, steps, args.profile, args.capacity, limit, multiple, args.point)
    result["defaults"] |= steps_default(values, steps)
    # Why the search stopped where it did: only when it stopped at that limit.
    result["limit_why"] = _seq_limit_why(limit, cap, multiple) if result["hit_limit"] else None
    result["model"] = args.model or args.entry
    # The batch traced: the one given or defaulted, or an entry's own (it was printed as 1).
    batch = result["batch_size"] = traced.get("batch_size", batch)
    result["inputs"] = _search_inputs(args)
    none = f"{result['need_at_seq_len']} tokens at batch {batch}"
    found = f"longest sequence that fits at batch {batch}"
    return _search_answer(args, result, "max_seq_len", none, found, lambda n: f"{n} tokens",
                          " tokens")  # fmt: skip


def _batch_seen(build: Callable[..., Any]) -> tuple[Callable[..., Any], dict[str, int]]:
    """`build` (sizes -> a workload), and the batch size of the workloads it built: the one
    asked for, or an --entry function's own when it takes no `batch_size`."""
    seen: dict[str, int] = {}

    def built(*sizes: Any) -> Any:
        workload = build(*sizes)
        seen["batch_size"] = workload.batch_size
        return workload

    return built, seen


def _seq_limit(spec: str | None, limit: int) -> tuple[int, str | None]:
    """The longest sequence `max-seq` may answer, and the model's field that caps it when that
    is not `--limit`: no more than the model's positions (a real run fails past a learned
    position table). A model that takes no token sequence has nothing to search."""
    from memtrace_trainer.models import hf

    source, _, name = (spec or "").partition(":")
    if source in ("torchvision", "timm", "gpumemnet", "synthetic", "dlrm"):
        raise UserError(
            f"max-seq: {spec} takes no token sequence, so there is no length to search "
            "(max-seq is for hf:, hf-config: and --entry models)"
        )
    if source not in ("hf", "hf-config"):
        return limit, None
    hfspec = hf.resolve(name) if source == "hf" else hf.read_config(Path(name))
    most = hf.max_positions(hf.to_config(hfspec))
    if most is not None and most[0] < limit:
        return most[0], most[1]
    return limit, None


def _seq_limit_why(limit: int, cap: str | None, multiple: int) -> str:
    """Where the search's longest length came from, with its value: the answer is the largest
    multiple of `multiple` within it, which is the cap itself only when it divides evenly."""
    source = f"--limit {limit}" if cap is None else f"the model's {cap}, {limit}"
    after = "longer may fit" if cap is None else "a real run takes no longer sequence"
    if limit % multiple == 0:
        return f"{source}; {after}"
    return f"the largest multiple of --multiple-of {multiple} within {source}; {after}"


def _world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"--world-sizes {text!r}: expected integers like 1,2,4,8") from None
    if not sizes or any(v < 1 for v in sizes) or sizes != sorted(set(sizes)):
        raise UserError(f"--world-sizes {text!r}: expected positive integers, ascending")
    from memtrace_trainer.symtrace.distributed import MAX_WORLD

    if sizes[-1] > MAX_WORLD:
        # Said before the smaller sizes are traced, not when the search reaches this one.
        raise UserError(f"--world-sizes {text!r}: expected sizes of at most {MAX_WORLD} ranks")
    return sizes


def _min_world_size(args: argparse.Namespace) -> int:
    from memtrace_trainer.maxbatch import min_world_size
    from memtrace_trainer.symtrace.tracer import trace_to_file

    check_batch_size(args.batch_size, optional=True)
    if args.strategy is None:
        raise UserError("min-world-size needs --strategy (fsdp2, ddp, ...): how the job shards")
    require_batch_size(args.batch_size, args.entry, args.model)
    if args.world_size is not None:
        raise UserError("min-world-size searches the world size: give --world-sizes, not "
                        "--world-size")  # fmt: skip
    sizes = _world_sizes(args.world_sizes)
    from memtrace_trainer.maxbatch import ranks
    from memtrace_trainer.symtrace.distributed import replicates

    replicated = replicates(args.strategy)
    if replicated and len(sizes) > 1:
        # A replica's need never falls with more ranks (NCCL's buffers only grow), so the
        # smallest size answers for every other.
        notes.warn(f"--strategy {args.strategy} replicates the parameters, gradients and "
                   "optimizer state on every rank, so more ranks never lower a rank's need: "
                   f"probed only the smallest of --world-sizes, {ranks(sizes[0])}")  # fmt: skip
        sizes = sizes[:1]
    build, traced = _batch_seen(_workloads(args))
    values = vars(args)

    def trace_at(world: int, prof: Any, path: Path) -> dict[str, Any]:
        cfg = step_config(values | {"world_size": world}, resolve_steps(values),
                          world_by="min-world-size")  # fmt: skip
        workload = build(args.batch_size)
        trace_to_file(workload, cfg, prof, path)
        return workload.defaults

    result = min_world_size(trace_at, sizes, args.profile, args.capacity, args.point)
    result["model"] = args.model or args.entry
    result["strategy"] = args.strategy
    # The batch traced: the one given, or an entry's own.
    batch = result["batch_size"] = traced.get("batch_size", args.batch_size)
    result["defaults"] |= steps_default(values, resolve_steps(values))
    code = 0 if result["min_world_size"] else 1
    if answered_as_json(result, args.json):
        return code
    need, where = _need_where(result, args.profile, " per GPU")
    if not result["min_world_size"] and replicated:
        at = ranks(result["need_at_world_size"])
        print(f"{result['model']} ({args.strategy}): does not fit on {where} at any world "
              f"size: every rank holds the whole model, and rank 0 needs {need} at {at}, no "
              f"less at more ({result['basis']})")  # fmt: skip
        return code
    if not result["min_world_size"]:
        print(f"{result['model']} ({args.strategy}): does not fit on {where} at any of "
              f"{args.world_sizes} ranks; rank 0 needs {need} even "
              f"at {ranks(result['need_at_world_size'])} ({result['basis']})")  # fmt: skip
        return code
    gpus = "1 GPU" if result["min_world_size"] == 1 else f"{result['min_world_size']} GPUs"
    print(
        f"{result['model']} ({args.strategy}, batch {batch} per GPU): fits on "
        f"{gpus} of {where}; rank 0 needs "
        f"{result['need_bytes'] / MIB:.1f} MiB ({result['basis']}); "
        f"{notes.counted(len(result['probes']), 'probe')} in {result['seconds']:.1f} s"
    )
    return code
