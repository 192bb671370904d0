"""Arguments and output shared by the command groups."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrace_trainer import notes
from memtrace_trainer.dtypes import AMP, DTYPES
from memtrace_trainer.errors import UserError, check_batch_size
from memtrace_trainer.models.hf import ATTENTION, TASKS
from memtrace_trainer.optim import EMULATED, OPTIMIZERS
from memtrace_trainer.symtrace.checkpointing import CHECKPOINTING
from memtrace_trainer.symtrace.deepspeed import bucket_size_arg
from memtrace_trainer.symtrace.distributed import STRATEGIES


def model_args(p: argparse.ArgumentParser, batch_required: bool) -> None:
    """--batch-size, --input-shape, --seq-len and --num-classes of a zoo model."""
    p.add_argument(
        "--batch-size",
        type=int,
        required=batch_required,
        default=None,
        help="samples per step" + ("" if batch_required else " (default 1)"),
    )
    shape_args(p)


def traced_batch_size(p: argparse.ArgumentParser, per: str = "step", also: str = "") -> None:
    """--batch-size of a command whose job is a --model or an --entry (`estimate`, `symtrace`,
    `run`, `fake-tensor`, `min-world-size`): whether it is required depends on the source
    (`errors.require_batch_size`), which argparse cannot say, so the help says the rule."""
    p.add_argument(
        "--batch-size",
        type=int,
        help=f"samples per {per} (required with --model, and with an --entry function that takes "
        f"`batch_size`{also})",
    )


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


def defaults_lines(defaults: dict[str, Any]) -> list[str]:
    """The values chosen for the user, one line each."""
    # `iterations` is set with --steps (its alias --iterations names the same thing).
    flag = {"iterations": "steps"}
    return [
        f"{k} = {v['value']} ({v['why']}; give --{flag.get(k, k).replace('_', '-')} to change it)"
        for k, v in defaults.items()
    ]


def print_defaults(defaults: dict[str, Any]) -> None:
    """Say on stderr which defaults shaped the answer."""
    for line in defaults_lines(defaults):
        print(f"note: {line}", file=sys.stderr)


def answered_as_json(result: dict[str, Any], as_json: bool) -> bool:
    """The head of a command's answer: the warnings it drew go into `result`, which `--json`
    prints whole (True: nothing is left to say); otherwise the defaults are said first."""
    result["warnings"] = notes.collected()
    if as_json:
        print(json.dumps(result))
        return True
    print_defaults(result["defaults"])
    return False


STEPS_WHY = "traced training iterations"


def steps_default(args: dict[str, Any], steps: int) -> dict[str, Any]:
    """`iterations` as an answer's `defaults` list it: there only when --steps was left out
    (a count the user gave is theirs, not a default)."""
    if args.get("iterations") is not None:
        return {}
    return {"iterations": {"value": steps, "why": STEPS_WHY}}


class _OneOfAliases(argparse._StoreAction):
    """A flag with aliases (`--steps`/`--iterations`): both given with different values is
    refused (argparse kept the last one silently); the same flag given again is argparse's own
    last-one-wins."""

    # The alias that set the value last, by the namespace it was set in (one parse at a time).
    _last: tuple[int, str | None] = (0, None)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        before = getattr(namespace, self.dest, None)
        last, flag = self._last
        if before is not None and last == id(namespace) and flag != option_string:
            if before != values:
                raise argparse.ArgumentError(self, f"{flag} {before} and {option_string} "
                                             f"{values} conflict: they are one setting (aliases); "
                                             "give one")  # fmt: skip
        self._last = (id(namespace), option_string)
        setattr(namespace, self.dest, values)


def step_args(p: argparse.ArgumentParser) -> None:
    """The training step: optimizer, precision, checkpointing, accumulation, traced steps."""
    p.add_argument(
        "--optimizer",
        # None, not "adam": an explicit `--optimizer adam` beside --step is told apart (it has
        # no effect there); step_config fills the default.
        # The names are optim's own (torch is imported with the parser already: dtypes.AMP).
        help=f"{'|'.join(OPTIMIZERS)} (default adam; {', '.join(EMULATED)} emulate bitsandbytes)",
    )
    p.add_argument(
        "--amp",
        choices=list(AMP),
        help="mixed precision: autocast to this dtype over fp32 parameters (fp16 adds GradScaler)",
    )
    p.add_argument(
        "--checkpointing",
        nargs="?",
        const="full",
        choices=CHECKPOINTING,
        help="activation checkpointing: full (the default when given bare: every block, or "
        "every decoder layer of a Hugging Face model, recomputed) or selective (torchtitan's "
        "op-level policy: matmul and attention outputs kept, every second matmul recomputed)",
    )
    p.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step (default 1)")
    p.add_argument(
        "--steps",
        "--iterations",
        dest="iterations",
        type=int,
        default=None,
        action=_OneOfAliases,
        help=f"training steps traced (default {STEP_FN_STEPS} with --step or --script, "
        f"{MODEL_STEPS} otherwise, the setting the profiles are calibrated with)",
    )
    p.add_argument(
        "--strategy",
        choices=STRATEGIES,
        help="sharded training, traced as rank 0 of --world-size ranks under a fake process "
        "group: fsdp2 (fully_shard per block) and ddp run PyTorch's own code; fsdp1*, zero1-3 "
        "run as their PyTorch equivalents, stated in the output (docs/distributed.md)",
    )  # fmt: skip
    p.add_argument(
        "--world-size",
        type=int,
        help="ranks of the sharded job (with --strategy); with --step/--script, the fake "
        "process group the program's own init_process_group() gets",
    )
    p.add_argument(
        "--fsdp-mp",
        metavar="PARAM[:REDUCE]",
        help="FSDP2's MixedPrecisionPolicy for the fsdp2, fsdp1 and fsdp1-grad-op strategies: "
        "the dtype parameters are all-gathered and computed in, and the dtype gradients are "
        "reduced in (default: PARAM), e.g. bf16:fp32 over fp32 parameters as torchtitan "
        "trains; dtypes fp32, bf16, fp16 (DeepSpeed's zero1-3 take --dtype bf16/fp16 instead)",
    )
    p.add_argument(
        "--reduce-bucket-size",
        type=bucket_size_arg,
        metavar="N",
        help="DeepSpeed's zero_optimization.reduce_bucket_size in elements, for zero1-3: the "
        "contiguous gradient buffer it allocates (default 5e8, DeepSpeed's; 0: none; Hugging "
        'Face\'s "auto" DeepSpeed config sets hidden_size * hidden_size)',
    )


def finetune_args(p: argparse.ArgumentParser) -> None:
    """The regime of a fine-tune: parameter dtype, LoRA/QLoRA, and a Hugging Face model's task
    and attention (docs/finetuning.md)."""
    g = p.add_argument_group("fine-tuning (Hugging Face models: --model hf:REPO_ID)")
    g.add_argument(
        "--dtype",
        choices=list(DTYPES),
        help="parameter dtype: bf16/fp16 is pure low-precision training (optimizer state in "
        "the same dtype); combine with --amp only of the same dtype (default fp32)",
    )
    g.add_argument(
        "--task",
        choices=TASKS,
        help="the head and loss (default: the architecture's, e.g. causal-lm for Llama, "
        "classification for BERT); classification uses --num-classes (default 2)",
    )
    g.add_argument(
        "--attn",
        choices=ATTENTION,
        help="attention implementation (default: transformers' for the model, sdpa where it "
        "has one; SDPA's CUDA kernel is chosen as PyTorch chooses it)",
    )
    g.add_argument(
        "--lora",
        metavar="R[:ALPHA]",
        help="LoRA adapters of rank R through peft (alpha defaults to R); the base is frozen",
    )
    g.add_argument(
        "--lora-targets",
        metavar="NAMES",
        help="comma-separated module names to adapt, or all-linear (default: peft's for the "
        "model type, e.g. q_proj,v_proj for Llama)",
    )
    g.add_argument(
        "--lora-dropout", type=float, help="LoRA dropout (default 0, peft's); > 0 adds a copy"
    )
    g.add_argument(
        "--qlora",
        action="store_true",
        help="QLoRA: the frozen base in 4-bit NF4 (bitsandbytes' layout, emulated), "
        "prepare_model_for_kbit_training (without the gradient checkpointing peft's default "
        "turns on: add --checkpointing for scripts that call it with defaults), then --lora "
        "(default rank 8, peft's)",
    )
    g.add_argument(
        "--qlora-double-quant",
        action="store_true",
        help="double quantization of the NF4 block constants (bnb_4bit_use_double_quant)",
    )
    g.add_argument(
        "--bnb-version",
        metavar="X.Y",
        help="the bitsandbytes release whose 4-bit layers --qlora emulates (default 0.50; "
        "before 0.44 each layer also kept its input for the backward)",
    )
    g.add_argument(
        "--no-kbit-prepare",
        dest="kbit_prepare",
        action="store_false",
        help="skip peft's prepare_model_for_kbit_training, which casts the non-quantized weights "
        "(embeddings, norms, head) to fp32; litgpt, torchtune and Unsloth keep them in the "
        "compute dtype",
    )


def outside_slurm(
    cluster: str | None, given: list[tuple[str, Any]], timeout_min: int | None = None
) -> list[str]:
    """The warnings of the Slurm-only flags `given` (flag, value) under a `--submitit-cluster`
    that runs the array on this machine (`launch` and `symtrace --backend slurm` alike):
    submitit hands them to sbatch alone. `timeout_min`, where given: submitit's debug executor
    runs each task in this process and enforces no time limit (its local one does)."""
    said = []
    if cluster in ("local", "debug"):
        said = [f"{flag} has no effect: --submitit-cluster {cluster} runs the array on this "
                "machine, outside Slurm" for flag, value in given if value is not None]  # fmt: skip
    if cluster == "debug" and timeout_min is not None:
        said.append("--timeout-min has no effect: --submitit-cluster debug runs each task in "
                    "this process, with no time limit")  # fmt: skip
    return said


def positive(flag: str) -> Callable[[str], int]:
    """An argparse type: an integer of at least 1, or an error naming the flag."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{v}: expected at least 1")
        return v

    parse.__name__ = flag  # argparse names the type in its message
    return parse


def slurm_partition(text: str) -> str:
    """`--partition`: a Slurm partition, or a comma-separated list of them. sbatch reads its
    `#SBATCH` lines up to the first that is not one, so a newline in the name would end them
    (the time limit after it dropped) and put what follows in the job script as a command."""
    if not text or any(c.isspace() or not c.isprintable() for c in text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a Slurm partition name (or a comma-separated list of them), "
            "not empty, without spaces or control characters"
        )
    return text


slurm_partition.__name__ = "--partition"


# The flags whose destination is not their name (store_false), as a message names them: as typed.
FLAG_OF = {"kbit_prepare": "--no-kbit-prepare"}


def flag_of(dest: str) -> str:
    """The flag the user typed to set `dest`."""
    return FLAG_OF.get(dest, "--" + dest.replace("_", "-"))


def tune_from(args: dict[str, Any]) -> Any:
    """The `Tune` (task, attention, regime) of the parsed flags; the regime is checked here so
    a contradiction is reported before anything is built."""
    from memtrace_trainer.models.finetune import NEWEST_BNB, Lora, Regime
    from memtrace_trainer.models.zoo import Tune

    lora_text = args.get("lora")
    defaults: dict[str, Any] = {}
    if lora_text is None and args.get("qlora"):
        lora_text = "8"
        defaults["lora"] = {"value": 8, "why": "peft's default rank, for the --qlora adapters"}
    lora = None
    if lora_text is not None:
        lora = Lora.parse(str(lora_text), args.get("lora_targets"), args.get("lora_dropout"))
    else:
        for flag in ("lora_targets", "lora_dropout"):
            if args.get(flag) is not None:
                raise UserError(f"{flag_of(flag)} needs --lora R")
    bnb = args.get("bnb_version")
    if bnb is not None and not args.get("qlora"):
        raise UserError("--bnb-version has no meaning without --qlora")
    regime = Regime(args.get("dtype"), args.get("amp"), lora, bool(args.get("qlora")),
                    bool(args.get("qlora_double_quant")), defaults,
                    args.get("kbit_prepare", True) is not False,
                    Regime.parse_bnb(bnb) if bnb else NEWEST_BNB)  # fmt: skip
    regime.validate()
    return Tune(args.get("task"), args.get("attn"), args.get("num_classes"), regime)


SCRIPT_HELP = (
    "an unmodified training script, run as __main__ with the arguments after `--`; an "
    "iteration ends once each optimizer it built has stepped (a hand-written update: at the "
    "next forward; or at memtrace_trainer.mark('iter')) and the run stops after --steps"
)


def model_source(
    p: argparse.ArgumentParser,
    entry: str = "package.module:function (see README)",
    step: bool = True,
    script: bool = False,
) -> argparse._MutuallyExclusiveGroup:
    """The required choice of what to trace: --model, --entry (`entry` says what the function
    returns or takes), and --step and --script where the command traces the user's own step.
    Returns the group, for a command's other sources."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model spec")
    src.add_argument("--entry", metavar="MOD:FN", help=entry)
    if step:
        src.add_argument("--step", metavar="MOD:FN", help=STEP_FN_HELP)
    if script:
        src.add_argument("--script", metavar="TRAIN.py", type=Path, help=SCRIPT_HELP)
    return src


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
              "num_classes", "batch_size", "dtype", "task", "attn", "lora", "lora_targets",
              "lora_dropout", "qlora", "qlora_double_quant", "kbit_prepare",
              "bnb_version", "strategy", "fsdp_mp", "reduce_bucket_size")  # fmt: skip


def resolve_steps(args: dict[str, Any]) -> int:
    """The steps to trace, and for `--step` a warning per loop flag it makes meaningless."""
    if args.get("step") or args.get("script"):
        what = "--step" if args.get("step") else "--script"
        defaults = {"qlora": False, "qlora_double_quant": False, "kbit_prepare": True}
        taken = set()
        if args.get("step") and args.get("batch_size") is not None:
            from memtrace_trainer.symtrace.userstep import step_batch

            # FN(device, batch_size) takes --batch-size.
            if step_batch(args["step"], args["batch_size"]) is not None:
                taken.add("batch_size")
        for key in LOOP_FLAGS:
            value = args.get(key)
            if key not in taken and value is not None and value != defaults.get(key, None):
                notes.warn(f"{flag_of(key)} has no effect with {what}: your code decides")
    steps = args.get("iterations")
    own_loop = bool(args.get("step") or args.get("script"))
    if steps is None:
        steps = STEP_FN_STEPS if own_loop else MODEL_STEPS
    from memtrace_trainer.symtrace.step import check_loop
    from memtrace_trainer.symtrace.userstep import check_steps

    # Before any model is built or imported: a count past the limit would run for hours. A
    # step function's --grad-accum has no effect (warned above), so only the tracer's counts.
    accum = args.get("grad_accum")
    if own_loop or accum is None:
        check_steps(int(steps))
    else:
        check_loop(int(steps), int(accum))
    return int(steps)


def entry_workload(
    entry: str,
    batch: int,
    seq_len: int | None,
    input_shape: Any,
    num_classes: int | None,
    tune: Any = None,
) -> Any:
    """The `--entry` workload; the zoo-only sizes are warned about, `--seq-len` is passed on,
    the regime (`--dtype`, `--lora`) applies to the model it returns."""
    from memtrace_trainer.models.zoo import load_entry, tuned
    from memtrace_trainer.workload import integer_inputs

    for flag, value in (("--input-shape", input_shape), ("--num-classes", num_classes)):
        if value is not None:
            notes.warn(f"{flag} has no effect with --entry")
    if tune is not None:
        for flag, value in (("--task", tune.task), ("--attn", tune.attn)):
            if value is not None:
                notes.warn(f"{flag} has no effect with --entry: it sets how a Hugging Face "
                           "model spec is built")  # fmt: skip
    workload = load_entry(entry, batch, seq_len=seq_len)
    if tune is not None and tune.regime.active:
        workload = tuned(workload, tune.regime)
    integer_inputs(workload.model, f"inputs of --entry {entry}")
    return workload


def workloads(args: dict[str, Any]) -> Callable[[int], Any]:
    """Batch size -> a fresh workload of `--model` or `--entry` with the parsed sizes and
    regime (each trace consumes one)."""
    from memtrace_trainer.models.zoo import build_workload

    check_batch_size(args.get("batch_size"), optional=True)  # before anything is built
    tune = tune_from(args)
    seq, shape, classes = args.get("seq_len"), args.get("input_shape"), args.get("num_classes")
    if args.get("entry"):
        return lambda b: entry_workload(args["entry"], b, seq, shape, classes, tune)
    if not args.get("model"):
        raise UserError("one of --model, --entry or --step is required")
    return lambda b: build_workload(args["model"], b, shape, seq, classes, tune=tune)


def workloads_by_seq(args: dict[str, Any]) -> Callable[[int, int], Any]:
    """(batch size, sequence length) -> a fresh workload of `--model` or `--entry`."""
    from memtrace_trainer.models.zoo import build_workload

    check_batch_size(args.get("batch_size"), optional=True)  # before anything is built
    tune = tune_from(args)
    classes = args.get("num_classes")
    if args.get("entry"):
        return lambda b, s: entry_workload(args["entry"], b, s, None, classes, tune)
    return lambda b, s: build_workload(args["model"], b, None, s, classes, tune=tune)


def step_config(
    args: dict[str, Any], steps: int, emulate: bool = True, world_by: str | None = None
) -> Any:
    """The tracer's loop of the parsed flags, checked. `world_by`: the search whose probe set
    `world_size` (the user gave none)."""
    from memtrace_trainer.symtrace.step import StepConfig

    cfg = StepConfig(
        "adam" if args.get("optimizer") is None else args["optimizer"],
        steps,
        args.get("amp"),
        args.get("checkpointing") or None,
        1 if args.get("grad_accum") is None else args["grad_accum"],
        emulate,
        args.get("world_size"),
        args.get("strategy"),
        args.get("fsdp_mp"),
        args.get("reduce_bucket_size"),
        world_by,
    )
    cfg.validate()
    return cfg
