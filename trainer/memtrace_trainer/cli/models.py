"""Command group of the models themselves: `features`, `symtrace`, `sample`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from memtrace_trainer import notes
from memtrace_trainer.batchfile import (
    command_parser,
    failed_summary,
    in_field_terms,
    output_file,
    read_configs,
    warnings_of,
)
from memtrace_trainer.cli.common import (
    answered_as_json,
    check_script_args,
    finetune_args,
    flag_of,
    model_args,
    model_source,
    outside_slurm,
    positive,
    print_defaults,
    resolve_steps,
    script_args,
    shape_args,
    slurm_partition,
    step_args,
    step_config,
    steps_default,
    traced_batch_size,
    tune_from,
    workloads,
)
from memtrace_trainer.errors import UserError, check_batch_size, require_batch_size


def register(sub: argparse._SubParsersAction) -> dict[str, Any]:
    h = sub.add_parser(
        "hf-models",
        help="Hugging Face repo ids known to --model hf:",
        description="Every repo id `--model hf:REPO_ID` builds from its published config.json "
        "values (trainer/memtrace_trainer/models/hf_configs/), with its model type and size.",
    )
    h.add_argument("--json", action="store_true", help="one JSON object per id")

    f = sub.add_parser(
        "features",
        help="model features (parameters, activations, layers)",
        description="Parameter count and activations per layer (per sample, "
        "torchsummary-style, forward hooks on meta).",
    )
    src = f.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model spec")
    src.add_argument(
        "--gpumemnet-row",
        metavar="FILENAME",
        help="a GPUMemNet dataset row's Filename (model, batch and input from it)",
    )
    model_args(f, batch_required=False)
    out = f.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON (the default)")
    out.add_argument("--csv", action="store_true", help="print a CSV row with GPUMemNet columns")

    s = sub.add_parser(
        "symtrace",
        help="symbolic trace of training steps on meta",
        description="Trace K training iterations on the meta device as a GPU would "
        "run them (forward, loss, backward, optimizer.step, zero_grad(set_to_none)), "
        "emulating CUDA-only allocations unless --no-cuda-emulation.",
    )
    entry = "package.module:function returning (model, (inputs, target), loss_fn)"
    src = model_source(s, entry, script=True)
    src.add_argument(
        "--batch",
        metavar="CONFIGS.jsonl",
        type=Path,
        help="trace many configs in one process (one JSON object per line)",
    )
    traced_batch_size(s)
    shape_args(s)
    step_args(s)
    finetune_args(s)
    s.add_argument("--profile", help="GPU profile NAME (profiles/NAME.toml) or a .toml path")
    s.add_argument(
        "--no-cuda-emulation",
        action="store_true",
        help="trace the plain meta path (FakeTensor-style baseline)",
    )
    s.add_argument("--out", type=Path, help="output trace (.jsonl or .mtrace)")
    s.add_argument(
        "--out-dir",
        type=Path,
        help="output directory of --batch: NAME.jsonl per config, of its `name` field (a name "
        "ending in .jsonl is the file's whole name; one ending in .mtrace is refused); a rerun "
        "traces every config again and replaces its file",
    )
    s.add_argument("--json", action="store_true", help="print a JSON summary (--batch always does)")
    s.add_argument(
        "--backend",
        choices=["local", "slurm"],
        default="local",
        help="with --batch: trace here (local) or as a Slurm job array through submitit",
    )
    # The --backend slurm flags default to None, not to their values, so that one given without
    # --backend slurm is told apart and warned about.
    s.add_argument(
        "--submitit-cluster",
        choices=["slurm", "local", "debug"],
        help="submitit executor of --backend slurm (default slurm; local: the same array on this "
        "machine)",
    )
    s.add_argument("--partition", type=slurm_partition, help="Slurm partition of --backend slurm")
    s.add_argument("--timeout-min", type=positive("--timeout-min"),
                   help="per array task of --backend slurm (default 60)")  # fmt: skip
    s.add_argument("--array-parallelism", type=positive("--array-parallelism"),
                   help="array tasks of --backend slurm (8)")  # fmt: skip
    script_args(s)

    sm = sub.add_parser(
        "sample",
        help="sample configs from a YAML sweep file",
        description="Uniform, seeded sampling of synthetic model configs; prints "
        "one JSON config per line (usable as synthetic:{json}).",
    )
    sm.add_argument("sweep", type=Path, help="YAML sweep file")
    sm.add_argument("--seed", type=int, help="override the file's seed")
    return {
        "features": _features,
        "symtrace": _symtrace,
        "sample": _sample,
        "hf-models": _hf_models,
    }


def _hf_models(args: argparse.Namespace) -> None:
    from memtrace_trainer.models import hf

    for repo_id in hf.known_ids():
        spec = hf.resolve(repo_id)
        c = spec.config
        width = c.get("hidden_size") or c.get("n_embd") or c.get("d_model")
        layers = c.get("num_hidden_layers") or c.get("n_layer") or c.get("num_layers")
        if args.json:
            row = {"id": repo_id, "model_type": c.get("model_type"), "hidden_size": width,
                   "layers": layers, "source": spec.source}  # fmt: skip
            print(json.dumps(row))
        else:
            print(f"{repo_id:<48} {c.get('model_type', '?'):<8} {layers} layers x {width}")


def _features(args: argparse.Namespace) -> None:
    import torch

    from memtrace_trainer.features import extract, gpumemnet_row, to_csv, zoo_cells
    from memtrace_trainer.models.gpumemnet import from_gpumemnet_filename, row_batch
    from memtrace_trainer.models.zoo import build_workload

    if args.gpumemnet_row:
        # The row's batch unless --batch-size is given, as `fake-tensor --gpumemnet-row` takes
        # it; --seq-len and --num-classes go to the build, which says they have no effect.
        config, batch = from_gpumemnet_filename(args.gpumemnet_row)
        batch = row_batch(args.gpumemnet_row, batch, args.batch_size)
        spec = f"gpumemnet:{args.gpumemnet_row}"
        workload = build_workload(spec, batch, args.input_shape, args.seq_len, args.num_classes,
                                  row=True)  # fmt: skip
        if args.batch_size is None:
            why = "the GPUMemNet row's Filename"
            workload.defaults["batch_size"] = {"value": batch, "why": why}
        family = config.family
    else:
        batch = 1 if args.batch_size is None else args.batch_size
        workload = build_workload(
            args.model, batch, args.input_shape, args.seq_len, args.num_classes
        )
        family = workload.family
    with torch.device("meta"):
        feats = extract(workload, family)
    print_defaults(workload.defaults)
    # The document is still printed: the analytic estimates read it all the same, and memest
    # names the activation again when its ML estimate refuses it.
    if issue := feats.activation_issue():
        notes.warn(issue)
    if args.batch_size is None and not args.gpumemnet_row:
        print("note: batch_size = 1 (features per sample; give --batch-size to change it)",
              file=sys.stderr)  # fmt: skip
    if args.csv:
        name = args.gpumemnet_row or args.model
        if family in ("mlp", "cnn"):
            row = gpumemnet_row(feats, name, family)
        else:
            row = {"Filename": name, **zoo_cells(feats.to_json())}
        sys.stdout.write(to_csv([row], family))
    else:
        print(json.dumps({"model": workload.spec, **feats.to_json()}))


def _symtrace_one(args: dict[str, Any], out: Path) -> dict[str, Any]:
    from memtrace_trainer.profile import load_profile
    from memtrace_trainer.symtrace.tracer import (
        trace_script,
        trace_step,
        trace_to_file,
        write_trace,
    )
    from memtrace_trainer.symtrace.userstep import step_batch, step_label

    check_script_args(args)
    steps = resolve_steps(args)
    if args.get("script"):
        profile = load_profile(args.get("profile"))
        emulate = not args.get("no_cuda_emulation", False)
        argv = list(args.get("script_args") or [])
        rec, meta = trace_script(Path(args["script"]), argv, steps, profile, emulate,
                                 args.get("world_size"))  # fmt: skip
        summary = write_trace(out, rec, meta)
        _allocated(summary, f"--script {args['script']}")
        ran = int(meta["iterations"])
        if ran < steps:  # the script's end decided the count, not --steps (warned)
            return _symtrace_result(out, summary, {}, args, ran, asked=steps)
        return _symtrace_result(out, summary, {}, args, steps)
    if args.get("step"):
        profile = load_profile(args.get("profile"))
        emulate = not args.get("no_cuda_emulation", False)
        batch = step_batch(args["step"], args.get("batch_size"))
        traced = trace_step(args["step"], steps, profile, emulate, batch, args.get("world_size"))
        summary = write_trace(out, *traced)
        _allocated(summary, step_label(args["step"]))
        return _symtrace_result(out, summary, {}, args, steps)
    batch = args.get("batch_size")
    if batch is None:
        require_batch_size(batch, args.get("entry"), args.get("model"))
    elif not isinstance(batch, int):
        raise UserError("--batch-size is required (a positive integer)")
    workload = workloads(args)(batch)
    cfg = step_config(args, steps, not args.get("no_cuda_emulation", False))
    summary = trace_to_file(workload, cfg, load_profile(args.get("profile")), out)
    return _symtrace_result(out, summary, workload.defaults, args, cfg.iterations)


def _allocated(summary: Any, label: str) -> None:
    """A trace of nothing is still written (`symtrace` only traces), but said."""
    if summary.allocs == 0:
        notes.warn(f"{label}: nothing was allocated on the tracer's device (is the model built "
                   "on the `device` argument, or moved to \"cuda\"?)")  # fmt: skip


def _symtrace_result(
    out: Path,
    summary: Any,
    defaults: dict[str, Any],
    args: dict[str, Any],
    steps: int,
    asked: int | None = None,
) -> dict[str, Any]:
    """What `symtrace --json` prints for one trace. `asked`: the count asked for where the
    traced code decided how many ran (a script's end): what ran is then no default."""
    fields = summary.to_json()
    if asked is not None:
        return {"out": str(out), **fields, "defaults": defaults, "iterations": steps,
                "iterations_asked": asked}  # fmt: skip
    return {"out": str(out), **fields, "defaults": defaults | steps_default(args, steps),
            "iterations": steps}  # fmt: skip


BATCH_KEYS = {
    "model",
    "entry",
    "step",
    "batch_size",
    "input_shape",
    "seq_len",
    "num_classes",
    "optimizer",
    "iterations",
    "amp",
    "checkpointing",
    "grad_accum",
    "dtype",
    "task",
    "attn",
    "lora",
    "lora_targets",
    "lora_dropout",
    "qlora",
    "qlora_double_quant",
    "kbit_prepare",
    "bnb_version",
    "world_size",
    "strategy",
    "fsdp_mp",
    "reduce_bucket_size",
    "profile",
    "no_cuda_emulation",
    "name",
}


SLURM_FLAGS = {"submitit_cluster": "slurm", "partition": None, "timeout_min": 60,
               "array_parallelism": 8}  # fmt: skip
# The reserved key a batch item's config carries its line's own fields under (cluster.py passes
# items through as they are): messages name those as fields, not as flags.
OWN = "_line_fields"


def _no_effect(args: argparse.Namespace, flags: list[str], why: str) -> None:
    for dest in flags:
        value = getattr(args, dest)
        if value is not None and value is not False:
            notes.warn(f"{flag_of(dest)} has no effect {why}")


def _symtrace(args: argparse.Namespace) -> int:
    if args.backend != "local" and args.batch is None:
        raise UserError(f"--backend {args.backend} traces a --batch of configs; give --batch FILE")
    # Before any line is read: the command line's batch is every line's default.
    check_batch_size(args.batch_size, optional=True)
    if args.batch is None:
        _symtrace_single(args)
        return 0
    if args.out_dir is None:
        raise UserError("--batch needs --out-dir DIR")
    parser = command_parser("symtrace")
    defaults = {k: v for k, v in vars(args).items() if k in BATCH_KEYS and v is not None}
    for source in ("model", "entry", "step"):
        defaults.pop(source, None)
    given = {k for k, v in defaults.items() if v != parser.get_default(k)}
    try:
        configs = read_configs(args.batch, parser, BATCH_KEYS,
                               lambda c: _check_line(defaults | c), given, ".jsonl")  # fmt: skip
        made = _out_dir(args.out_dir)
    except UserError as e:
        raise UserError(f"{e}; nothing was traced (the whole file is checked first)") from None
    _no_effect(args, ["out"], "with --batch: each config's trace is --out-dir/NAME.jsonl")
    _no_effect(args, ["json"], "with --batch: every config's result is a JSON line")
    if args.backend == "local":
        _no_effect(args, list(SLURM_FLAGS), "without --backend slurm")
    else:
        # launch's check; --array-parallelism stays: the configs are split into that many
        # tasks, which a local array runs at once.
        for said in outside_slurm(args.submitit_cluster, [("--partition", args.partition)],
                                  args.timeout_min):  # fmt: skip
            notes.warn(said)
    items = [(c.name, defaults | c.values | {OWN: sorted(c.own)},
              str(args.out_dir / output_file(c.name, ".jsonl"))) for c in configs]  # fmt: skip
    results: Iterable[dict[str, Any]]
    done = []
    try:
        if args.backend == "slurm":
            from memtrace_trainer.symtrace.cluster import trace_on_cluster

            slurm = {k: v if getattr(args, k) is None else getattr(args, k)
                     for k, v in SLURM_FLAGS.items()}  # fmt: skip
            results = trace_on_cluster(items, args.out_dir, slurm["submitit_cluster"],
                                       slurm["partition"], slurm["timeout_min"],
                                       slurm["array_parallelism"])  # fmt: skip
        else:
            results = symtrace_each(items)
        for result in results:
            done.append(result)
            print(json.dumps(result), flush=True)
    finally:
        _unmade(made)  # every config failed (or none ran): no empty --out-dir of this run's
    return failed_summary(done)


def _symtrace_single(args: argparse.Namespace) -> None:
    if args.out is None:
        if args.out_dir is not None:
            raise UserError(f"--out-dir {args.out_dir}: --out-dir is for --batch CONFIGS.jsonl "
                            "(a trace per config); one job's trace goes to --out FILE")  # fmt: skip
        raise UserError("--out FILE is required")
    _no_effect(args, ["out_dir"], "without --batch: the trace is --out")
    _no_effect(args, list(SLURM_FLAGS), "without --batch and --backend slurm")
    result = _symtrace_one(vars(args), args.out)
    if answered_as_json(result, args.json):
        return
    per_step = ""
    if result["first_step_peak_live_bytes"] is not None:
        steady = result["steady_peak_live_bytes"]
        per_step = f" (first step {result['first_step_peak_live_bytes']} B" + (
            f", steady {steady} B)" if steady is not None else ")"
        )
    print(
        f"wrote {result['out']}: {result['allocs']} allocations, "
        f"peak {result['peak_live_bytes']} B live{per_step}"
    )


def _check_line(config: dict[str, Any]) -> None:
    """A batch line's checks before any line is traced: those `symtrace` makes of its flags
    before it builds anything (one source, a batch size, the loop, the regime, the profile)."""
    from memtrace_trainer.models.zoo import _parse_shape
    from memtrace_trainer.profile import load_profile

    sources = [k for k in ("model", "entry", "step") if config.get(k)]
    if len(sources) != 1:
        raise UserError("expected exactly one of --model, --entry or --step")
    if sources[0] != "step":
        require_batch_size(config.get("batch_size"), config.get("entry"), config.get("model"))
        step_config(config, resolve_steps(config))
    tune_from(config)
    _parse_shape(config.get("input_shape"))
    load_profile(config.get("profile"))


def _out_dir(path: Path) -> list[Path]:
    """--out-dir made (with its parents) or refused: a file there, or a folder this user cannot
    create or write to, would fail every config alike. Returns the folders made, innermost
    first, for `_unmade` to remove when nothing was written into them."""
    if path.exists() and not path.is_dir():
        raise UserError(f"--out-dir {path}: a file; expected a folder")
    made = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _unmade(made)
        raise UserError(f"--out-dir {path}: cannot create it ({e.strerror or e})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        _unmade(made)
        raise UserError(f"--out-dir {path}: not a folder this user can write to")
    return made


def _unmade(made: list[Path]) -> None:
    """The folders this run made (innermost first) removed while empty: a batch that wrote
    nothing leaves no output behind. A folder something was put in stays, and those above it."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            return


def symtrace_each(items: Iterable[tuple[str, dict[str, Any], str]]) -> Iterator[dict[str, Any]]:
    """Traces (name, config, out path) items in turn, here or in an array task; a config's
    error is its result, so one bad config does not stop the rest. A config's warnings are said
    under its name and kept in its result."""
    items = list(items)
    parser = command_parser("symtrace")
    for i, (name, config, path) in enumerate(items):
        config = dict(config)
        own = set(config.pop(OWN, ()))

        def terms(message: str, own: set[str] = own) -> str:
            return in_field_terms(message, parser, own)

        with warnings_of(name, terms) as said:
            try:
                result = {**_symtrace_one(config, Path(path)), "name": name}
            except UserError as e:
                result = {"name": name, "error": terms(str(e))}
            except KeyboardInterrupt:
                # The trace in progress is not written (traces are written whole, at the end).
                raise UserError(f"interrupted while tracing {name!r} ({i + 1} of {len(items)}): "
                                f"its trace was not written, the {i} before it were; a rerun "
                                "traces every config again") from None  # fmt: skip
        result["warnings"] = said
        yield result


def _sample(args: argparse.Namespace) -> None:
    from memtrace_trainer.models.sampling import sample_file

    for config in sample_file(args.sweep, args.seed):
        print(json.dumps({"id": config.id, **config.to_dict()}, sort_keys=True))
