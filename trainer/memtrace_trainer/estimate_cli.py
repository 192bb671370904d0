"""Command line of `fake-tensor`, `estimate` and `max-batch`."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrace_trainer.batchfile import read_configs
from memtrace_trainer.errors import UserError

Handler = Callable[[argparse.Namespace], None]
MIB = 1 << 20
FAKE_KEYS = {
    "model",
    "entry",
    "gpumemnet_row",
    "batch_size",
    "input_shape",
    "seq_len",
    "num_classes",
    "name",
}


def _model_source(p: argparse.ArgumentParser, gpumemnet: bool = False) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model spec")
    src.add_argument("--entry", metavar="MOD:FN", help="package.module:function (see README)")
    if gpumemnet:
        src.add_argument(
            "--gpumemnet-row",
            metavar="FILENAME",
            help="a GPUMemNet row's Filename (model and batch from it)",
        )
        src.add_argument(
            "--batch",
            metavar="CONFIGS.jsonl",
            type=Path,
            help="many configs in one process; one JSON line out per config",
        )
    p.add_argument("--input-shape", help="per-sample input shape C,H,W (default: the model's)")
    p.add_argument("--seq-len", type=int, help="sequence length of token models")
    p.add_argument("--num-classes", type=int, default=1000, help="classifier width")


def _step_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--optimizer", default="adam", help="adam|adamw|sgd|sgd-momentum|...")
    p.add_argument("--amp", choices=["bf16", "fp16"], help="autocast dtype")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
    p.add_argument("--iterations", type=int, default=2, help="traced iterations (default 2)")


def add_parsers(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    f = sub.add_parser(
        "fake-tensor",
        help="the FakeTensor baseline (GPUMemNet's method)",
        description="Forward and backward under FakeTensorMode with a dispatch mode tracking "
        "the peak of live storage bytes; no optimizer step, no allocator. JSON: "
        '{"peak_bytes", "after_forward_bytes", "after_backward_bytes", "seconds"}.',
    )
    _model_source(f, gpumemnet=True)
    f.add_argument("--batch-size", type=int, help="samples per step")
    f.add_argument("--json", action="store_true", help="print JSON")

    e = sub.add_parser(
        "estimate",
        help="every estimator's answer for one job (through memest)",
        description="Symbolic trace + features, then `memest estimate --trace T --features F "
        "--profile NAME --json`; prints each estimator's answer in MiB. memest is found via "
        "$MEMTRACE_BIN_DIR, then PATH, then target/release.",
    )
    _model_source(e)
    e.add_argument("--batch-size", type=int, required=True, help="samples per step")
    _step_args(e)
    e.add_argument("--profile", default="a100-40gb", help="GPU profile (default a100-40gb)")
    e.add_argument("--ml-model", type=Path, help="trained ML model (or $MEMTRACE_ML_MODEL)")
    e.add_argument("--json", action="store_true", help="print JSON")

    m = sub.add_parser(
        "max-batch",
        help="largest batch that fits a GPU profile",
        description="Binary search of the batch size with symbolic traces and `memsim replay "
        "--capacity` (default capacity: the profile's total memory minus its context).",
    )
    _model_source(m)
    _step_args(m)
    m.add_argument("--profile", required=True, help="GPU profile NAME or .toml path")
    m.add_argument("--capacity", type=float, metavar="GiB", help="override the capacity")
    m.add_argument("--limit", type=int, default=1 << 16, help="largest batch tried (65536)")
    m.add_argument("--json", action="store_true", help="print JSON")
    return {"fake-tensor": _fake_tensor, "estimate": _estimate, "max-batch": _max_batch}


def _fake_one(config: dict[str, Any]) -> dict[str, Any]:
    from memtrace_trainer.fake_tensor import measure, workload_builder

    build, what = workload_builder(config)
    with warnings.catch_warnings():
        # HF models read data pointers for weight tying; on fake tensors that only warns.
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        return measure(build, what).to_json()


def _fake_tensor(args: argparse.Namespace) -> None:
    if args.batch is None:
        result = _fake_one(vars(args))
        if args.json:
            print(json.dumps(result))
        else:
            print(
                f"fake-tensor: peak {result['peak_bytes'] / MIB:.1f} MiB live "
                f"(after forward {result['after_forward_bytes'] / MIB:.1f}, after backward "
                f"{result['after_backward_bytes'] / MIB:.1f}) in {result['seconds']:.2f} s"
            )
        return
    defaults = {
        k: v
        for k, v in vars(args).items()
        if k in ("batch_size", "input_shape", "seq_len", "num_classes") and v is not None
    }
    for name, config in read_configs(args.batch, FAKE_KEYS):
        try:
            result = {"name": name, **_fake_one(defaults | config)}
        except UserError as e:
            result = {"name": name, "error": str(e)}
        print(json.dumps(result), flush=True)


def _step(args: argparse.Namespace) -> Any:
    from memtrace_trainer.symtrace.step import StepConfig

    cfg = StepConfig(
        args.optimizer, args.iterations, args.amp, args.checkpointing, args.grad_accum, True
    )
    cfg.validate()
    return cfg


def _workloads(args: argparse.Namespace) -> Callable[[int], Any]:
    from memtrace_trainer.models.zoo import build_workload, load_entry

    if args.entry:
        return lambda b: load_entry(args.entry, b)
    return lambda b: build_workload(args.model, b, args.input_shape, args.seq_len, args.num_classes)


def _estimate(args: argparse.Namespace) -> None:
    from memtrace_trainer.estimate import estimate, render

    build = _workloads(args)
    result = estimate(
        lambda: build(args.batch_size),
        _step(args),
        args.profile,
        args.ml_model,
        None if args.json else lambda s: print(s, file=sys.stderr),
    )
    print(json.dumps(result) if args.json else render(result))


def _max_batch(args: argparse.Namespace) -> None:
    from memtrace_trainer.maxbatch import max_batch

    result = max_batch(_workloads(args), _step(args), args.profile, args.capacity, args.limit)
    result["model"] = args.model or args.entry
    if args.json:
        print(json.dumps(result))
        return
    cap = result["capacity_bytes"] / (1 << 30)
    if result["max_batch"] == 0:
        print(
            f"{result['model']}: does not fit even at batch 1 in {cap:.2f} GiB "
            f"(profile {args.profile})"
        )
        return
    more = " (the --limit; larger may fit)" if result["hit_limit"] else ""
    print(
        f"{result['model']}: largest batch that fits in {cap:.2f} GiB (profile "
        f"{args.profile}): {result['max_batch']}{more}; peak reserved "
        f"{result['peak_reserved_mib']:.1f} MiB; {len(result['probes'])} probes in "
        f"{result['seconds']:.1f} s"
    )
