"""Arguments and output shared by the command groups."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from memtrace_trainer import notes
from memtrace_trainer.errors import UserError


def model_args(p: argparse.ArgumentParser, batch_required: bool) -> None:
    """--batch-size, --input-shape, --seq-len and --num-classes of a zoo model."""
    p.add_argument(
        "--batch-size",
        type=int,
        required=batch_required,
        default=None if batch_required else 1,
        help="samples per step" + ("" if batch_required else " (default 1)"),
    )
    shape_args(p)


def shape_args(p: argparse.ArgumentParser) -> None:
    """--input-shape, --seq-len and --num-classes: what a zoo model's sizes are."""
    p.add_argument("--input-shape", help="per-sample input shape C,H,W (default: the model's)")
    p.add_argument(
        "--seq-len",
        type=int,
        help="sequence length of token models (default: the model's maximum); passed to an "
        "--entry function that takes `seq_len`",
    )
    p.add_argument(
        "--num-classes", type=int, help="classifier width of zoo vision models (default 1000)"
    )


def defaults_lines(defaults: dict[str, Any], iterations: int | None) -> list[str]:
    """The values chosen for the user, one line each."""
    # `iterations` is set with --steps (its alias --iterations names the same thing).
    flag = {"iterations": "steps"}
    lines = [
        f"{k} = {v['value']} ({v['why']}; give --{flag.get(k, k).replace('_', '-')} to change it)"
        for k, v in defaults.items()
    ]
    if iterations is not None:
        lines.append(f"iterations = {iterations} traced (give --steps to change it)")
    return lines


def print_defaults(defaults: dict[str, Any], iterations: int | None) -> None:
    """Say on stderr which defaults shaped the answer."""
    for line in defaults_lines(defaults, iterations):
        print(f"note: {line}", file=sys.stderr)


def step_args(p: argparse.ArgumentParser) -> None:
    """The training step: optimizer, precision, checkpointing, accumulation, traced steps."""
    p.add_argument(
        "--optimizer",
        default="adam",
        help="adam|adamw|sgd|sgd-momentum|adagrad|rmsprop (default adam)",
    )
    p.add_argument("--amp", choices=["bf16", "fp16"], help="autocast dtype (fp16 adds GradScaler)")
    p.add_argument(
        "--checkpointing", action="store_true", help="activation checkpointing per block"
    )
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument(
        "--steps",
        "--iterations",
        dest="iterations",
        type=int,
        default=None,
        help=f"training steps traced (default {STEP_FN_STEPS} with --step, {MODEL_STEPS} "
        "otherwise, the setting the profiles are calibrated with)",
    )


SCRIPT_HELP = (
    "an unmodified training script, run as __main__ with the arguments after `--`; iterations "
    "are counted at optimizer.step() (or memtrace_trainer.mark('iter')) and the run stops "
    "after --steps"
)


def script_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "script_args", nargs="*", metavar="-- ARGS", help="arguments of --script, after `--`"
    )


def check_script_args(args: dict[str, Any]) -> None:
    if args.get("script_args") and not args.get("script"):
        raise UserError(
            f"unexpected arguments {' '.join(args['script_args'])!r}: only --script takes "
            "arguments (after `--`)"
        )


STEP_FN_STEPS = 3
MODEL_STEPS = 2
STEP_FN_HELP = (
    "package.module:function taking the device and returning a zero-argument step() that runs "
    "one iteration of your own loop (trainer/README.md)"
)
# What the tracer's own loop takes and a step function decides for itself.
LOOP_FLAGS = ("optimizer", "amp", "checkpointing", "grad_accum", "input_shape", "seq_len",
              "num_classes", "batch_size")  # fmt: skip


def resolve_steps(args: dict[str, Any]) -> int:
    """The steps to trace, and for `--step` a warning per loop flag it makes meaningless."""
    if args.get("step") or args.get("script"):
        what = "--step" if args.get("step") else "--script"
        defaults = {"optimizer": "adam", "grad_accum": 1, "checkpointing": False}
        for key in LOOP_FLAGS:
            value = args.get(key)
            if value is not None and value != defaults.get(key, None):
                flag = "--" + key.replace("_", "-")
                notes.warn(f"{flag} has no effect with {what}: your code decides")
    steps = args.get("iterations")
    if steps is None:
        return STEP_FN_STEPS if args.get("step") or args.get("script") else MODEL_STEPS
    return int(steps)


def entry_workload(
    entry: str, batch: int, seq_len: int | None, input_shape: Any, num_classes: int | None
) -> Any:
    """The `--entry` workload; the zoo-only sizes are warned about, `--seq-len` is passed on."""
    from memtrace_trainer.models.zoo import load_entry

    for flag, value in (("--input-shape", input_shape), ("--num-classes", num_classes)):
        if value is not None:
            notes.warn(f"{flag} has no effect with --entry")
    return load_entry(entry, batch, seq_len=seq_len)
