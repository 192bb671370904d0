"""The `fake-tensor` command: the FakeTensor baseline (GPUMemNet's method), one job or a `--batch`
file of them. Registered by the `estimate` group, whose baselines it belongs with."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

from memtrace_trainer import notes
from memtrace_trainer.batchfile import (
    Config,
    command_parser,
    failed_summary,
    in_field_terms,
    read_configs,
    warnings_of,
)
from memtrace_trainer.cli.common import (
    answered_as_json,
    model_source,
    shape_args,
    traced_batch_size,
)
from memtrace_trainer.errors import UserError, check_batch_size
from memtrace_trainer.units import MIB

SHAPE_KEYS = ("batch_size", "input_shape", "seq_len", "num_classes")
FAKE_KEYS = {"model", "entry", "gpumemnet_row", *SHAPE_KEYS, "name"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    f = sub.add_parser(
        "fake-tensor",
        help="the FakeTensor baseline (GPUMemNet's method)",
        description="Forward and backward under FakeTensorMode with a dispatch mode tracking "
        "the peak of live storage bytes; no optimizer step, no allocator. JSON: "
        '{"peak_bytes", "after_forward_bytes", "after_backward_bytes", "seconds", "defaults", '
        '"warnings"}. With --batch, one JSON line per config, each with its "name" (or '
        '"error"); exit 1 when some configs failed, 2 when all did.',
    )
    src = model_source(f, step=False)
    src.add_argument(
        "--gpumemnet-row",
        metavar="FILENAME",
        help="a GPUMemNet row's Filename (model and batch from it; --batch-size overrides the "
        "batch)",
    )
    src.add_argument(
        "--batch",
        metavar="CONFIGS.jsonl",
        type=Path,
        help="many configs in one process; one JSON line out per config (the file is checked "
        "whole before any runs; --batch-size, --input-shape, --seq-len and --num-classes are "
        "defaults of its lines)",
    )
    shape_args(f)
    traced_batch_size(f, also="; a --gpumemnet-row gives its own")
    f.add_argument("--json", action="store_true", help="print JSON (--batch always does)")


def _check(config: dict[str, Any]) -> None:
    """A line's checks before any line runs: one model source, a batch size where one is
    needed, a GPUMemNet row's filename and an input shape's syntax."""
    from memtrace_trainer.fake_tensor import check_config

    check_config(config)


def _fake_one(config: dict[str, Any]) -> dict[str, Any]:
    from memtrace_trainer.fake_tensor import measure, workload_builder

    build, what = workload_builder(config)
    with warnings.catch_warnings():
        # HF models read data pointers for weight tying; on fake tensors that only warns.
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        return measure(build, what).to_json()


def run(args: argparse.Namespace) -> int:
    # 0 is no "not given": a GPUMemNet row's own batch was taken for it.
    check_batch_size(args.batch_size, optional=True)
    if args.batch is None:
        result = _fake_one(vars(args))
        if answered_as_json(result, args.json):
            return 0
        print(
            f"fake-tensor: peak {result['peak_bytes'] / MIB:.1f} MiB live "
            f"(after forward {result['after_forward_bytes'] / MIB:.1f}, after backward "
            f"{result['after_backward_bytes'] / MIB:.1f}) in {result['seconds']:.2f} s"
        )
        return 0
    parser = command_parser("fake-tensor")
    try:
        configs = read_configs(args.batch, parser, FAKE_KEYS, lambda c: _check(_merged(args, c)),
                               set(_merged(args, {})))  # fmt: skip
    except UserError as e:
        raise UserError(f"{e}; nothing was run (the whole file is checked first)") from None
    if args.json:
        notes.warn("--json has no effect with --batch: every config's answer is a JSON line")
    results = []
    for i, config in enumerate(configs):
        try:
            result = _run_config(args, parser, config)
        except KeyboardInterrupt:
            raise UserError(f"interrupted at config {config.name!r} (line {config.line}, "
                            f"{i + 1} of {len(configs)}); the {i} before it were "
                            "printed") from None  # fmt: skip
        results.append(result)
        print(json.dumps(result), flush=True)
    return failed_summary(results)


def _merged(args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    """A line's fields over the command line's shape flags (its defaults)."""
    given = {k: getattr(args, k) for k in SHAPE_KEYS if getattr(args, k) is not None}
    return given | config


def _run_config(
    args: argparse.Namespace, parser: argparse.ArgumentParser, config: Config
) -> dict[str, Any]:
    """One line's answer, or its error; either with the warnings it drew (said on stderr under
    its name too)."""

    def terms(message: str) -> str:
        return in_field_terms(message, parser, config.own)

    with warnings_of(config.name, terms) as said:
        try:
            result = {"name": config.name, **_fake_one(_merged(args, config.values))}
        except UserError as e:
            result = {"name": config.name, "error": terms(str(e))}
    result["warnings"] = said
    return result
