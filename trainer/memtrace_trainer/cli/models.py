"""Command group of the models themselves: `features`, `symtrace`, `sample`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from memtrace_trainer import notes
from memtrace_trainer.batchfile import read_configs
from memtrace_trainer.cli.common import (
    check_script_args,
    finetune_args,
    model_args,
    model_source,
    print_defaults,
    resolve_steps,
    script_args,
    shape_args,
    step_args,
    step_config,
    steps_default,
    workloads,
)
from memtrace_trainer.errors import UserError


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
    s.add_argument(
        "--batch-size", type=int, help="samples per step (required with --model/--entry)"
    )
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
    s.add_argument("--out-dir", type=Path, help="output directory of --batch")
    s.add_argument("--json", action="store_true", help="print a JSON summary")
    s.add_argument(
        "--backend",
        choices=["local", "slurm"],
        default="local",
        help="with --batch: trace here (local) or as a Slurm job array through submitit",
    )
    s.add_argument(
        "--submitit-cluster",
        choices=["slurm", "local", "debug"],
        default="slurm",
        help="submitit executor of --backend slurm (local: the same array on this machine)",
    )
    s.add_argument("--partition", help="Slurm partition of --backend slurm")
    s.add_argument("--timeout-min", type=int, default=60, help="per array task (default 60)")
    s.add_argument(
        "--array-parallelism", type=int, default=8, help="array tasks of --backend slurm (8)"
    )
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
    from memtrace_trainer.models.gpumemnet import from_gpumemnet_filename
    from memtrace_trainer.models.zoo import build_workload

    if args.gpumemnet_row:
        config, batch = from_gpumemnet_filename(args.gpumemnet_row)
        spec = f"gpumemnet:{args.gpumemnet_row}"
        workload = build_workload(spec, batch, args.input_shape)
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
    from memtrace_trainer.symtrace.tracer import script_to_file, step_to_file, trace_to_file
    from memtrace_trainer.symtrace.userstep import step_batch, step_label

    check_script_args(args)
    steps = resolve_steps(args)
    if args.get("script"):
        profile = load_profile(args.get("profile"))
        emulate = not args.get("no_cuda_emulation", False)
        argv = list(args.get("script_args") or [])
        summary = script_to_file(Path(args["script"]), argv, steps, profile, out, emulate,
                                 args.get("world_size"))  # fmt: skip
        _allocated(summary, f"--script {args['script']}")
        return _symtrace_result(out, summary, {}, args, steps)
    if args.get("step"):
        profile = load_profile(args.get("profile"))
        emulate = not args.get("no_cuda_emulation", False)
        batch = step_batch(args["step"], args.get("batch_size"))
        summary = step_to_file(args["step"], steps, profile, out, emulate, batch,
                               world_size=args.get("world_size"))  # fmt: skip
        _allocated(summary, step_label(args["step"]))
        return _symtrace_result(out, summary, {}, args, steps)
    batch = args.get("batch_size")
    if not isinstance(batch, int):
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
    out: Path, summary: Any, defaults: dict[str, Any], args: dict[str, Any], steps: int
) -> dict[str, Any]:
    """What `symtrace --json` prints for one trace."""
    fields = summary.to_json()
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
    "profile",
    "no_cuda_emulation",
    "name",
}


def _symtrace(args: argparse.Namespace) -> None:
    if args.backend != "local" and args.batch is None:
        raise UserError(f"--backend {args.backend} traces a --batch of configs; give --batch FILE")
    if args.batch is None:
        if args.out is None:
            raise UserError("--out FILE is required")
        result = _symtrace_one(vars(args), args.out)
        result["warnings"] = notes.collected()
        if args.json:
            print(json.dumps(result))
        else:
            print_defaults(result["defaults"])
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
        return
    if args.out_dir is None:
        raise UserError("--batch needs --out-dir DIR")
    if not args.batch.is_file():
        raise UserError(f"--batch {args.batch}: no such file")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    defaults = {k: v for k, v in vars(args).items() if k in BATCH_KEYS and v is not None}
    defaults.pop("model", None)
    defaults.pop("entry", None)
    defaults.pop("step", None)
    configs = read_configs(args.batch, BATCH_KEYS)
    items = [(n, defaults | c, str(args.out_dir / f"{n}.jsonl")) for n, c in configs]
    results: Iterable[dict[str, Any]]
    if args.backend == "slurm":
        from memtrace_trainer.symtrace.cluster import trace_on_cluster

        results = trace_on_cluster(items, args.out_dir, args.submitit_cluster, args.partition,
                                   args.timeout_min, args.array_parallelism)  # fmt: skip
    else:
        results = symtrace_each(items)
    for result in results:
        print(json.dumps(result), flush=True)


def symtrace_each(items: Iterable[tuple[str, dict[str, Any], str]]) -> Iterator[dict[str, Any]]:
    """Traces (name, config, out path) items in turn, here or in an array task; a config's
    error is its result, so one bad config does not stop the rest."""
    for name, config, path in items:
        try:
            result = {**_symtrace_one(config, Path(path)), "name": name}
        except UserError as e:
            result = {"name": name, "error": str(e)}
        result["warnings"] = notes.collected()
        notes.reset()
        yield result


def _sample(args: argparse.Namespace) -> None:
    from memtrace_trainer.models.sampling import sample_file

    for config in sample_file(args.sweep, args.seed):
        print(json.dumps({"id": config.id, **config.to_dict()}, sort_keys=True))
