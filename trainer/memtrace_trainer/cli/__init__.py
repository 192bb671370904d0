"""`python -m memtrace_trainer <command>`: one dispatcher over one module per command group.

Every module registers its subcommands with `register(sub) -> {name: handler}`; `main` builds the
parser, runs the handler and turns every failure into one line on stderr (plus the user's own
frames when their code raised) with exit status 2. A handler returns its exit status: 0, or 1
for "does not fit" (estimates) or "some runs failed" (`launch`)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from memtrace_trainer import notes
from memtrace_trainer.cli import estimate, kernelstats, models, runs, serve
from memtrace_trainer.errors import UserCodeError, UserError, size_overflow, user_frames

Handler = Callable[[argparse.Namespace], int | None]
GROUPS = (models, estimate, kernelstats, runs, serve)

DESCRIPTION = """\
Front end of memtrace where models live.

commands:
  features   parameter and torchsummary-style activation counts of a model (JSON or a
             GPUMemNet-style CSV row)
  symtrace   run K training iterations on the meta device (no GPU) and write the allocator-level
             trace (.jsonl, or .mtrace through `memsim convert`) that `memsim replay` accepts
  sample     draw synthetic model configs from a YAML sweep file (seeded, uniform)
  estimate   does the job fit, and how much device memory it needs (the symbolic estimate),
             with the baselines beside it (symbolic trace -> memest estimate)
  max-batch  the largest batch that fits a GPU (symbolic traces + memsim replay)
  max-seq    the longest sequence that fits a GPU at a fixed batch (token models)
  min-world-size  the fewest GPUs a sharded job (--strategy) fits on, per rank
  hf-models  the Hugging Face repo ids `--model hf:REPO_ID` knows (built from published configs)
  fake-tensor  the FakeTensor baseline: forward+backward live storage peak (GPUMemNet's method)
  kernel-stats  kernel statistics of one training step estimated on meta (FLOPs, grids,
             roofline est. SM activity); one k_ row per GPUMemNet row for `memest util cv`
  run        train on a GPU (or a loud CPU fallback) and write a run directory of labels
  launch     run a sweep file: local GPUs/CPU workers or a Slurm array; resumable
  dataset    collect run directories into one CSV with the GPUMemNet columns
  serve      answer estimate requests over local HTTP (Unix socket or 127.0.0.1), warm: torch
             and the model zoo stay imported (docs/serve.md)

model specs: torchvision:NAME, timm:NAME, hf:REPO_ID (e.g. hf:meta-llama/Meta-Llama-3-8B, hf:gpt2;
`hf-models` lists them), hf-config:PATH (any transformers config.json), dlrm[:small],
gpumemnet:FILENAME (a GPUMemNet row), synthetic:{json config}. Fine-tuning regimes (--dtype,
--lora, --qlora, --checkpointing full|selective): docs/finetuning.md

exit status: 0 success or fits; 1 does not fit (estimate; max-batch/max-seq when nothing fits),
or some configs of a `symtrace --batch` failed (the others' traces written); 2 bad input or
error. MEMTRACE_TRACEBACK=1 prints Python tracebacks of internal errors.
"""


class _Exact(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "allow_abbrev": False})


def parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    p = argparse.ArgumentParser(
        prog="python -m memtrace_trainer",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    # No abbreviated flags in any command: `--step` given to a command without it was taken for
    # `--steps` and refused as "invalid int value".
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Exact)
    handlers: dict[str, Handler] = {}
    for group in GROUPS:
        handlers.update(group.register(sub))
    return p, handlers


def _internal(e: BaseException) -> str:
    where = traceback.extract_tb(e.__traceback__)
    at = f" (at {where[-1].filename}:{where[-1].lineno})" if where else ""
    return (
        f"internal error: {type(e).__name__}: {e}{at}; set MEMTRACE_TRACEBACK=1 for the "
        "traceback, and please report it"
    )


def main(argv: list[str] | None = None) -> int:
    p, handlers = parser()
    args = p.parse_args(argv)
    notes.reset()
    try:
        rc = handlers[args.command](args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 2
    except SystemExit as e:
        # memtrace_trainer never exits by raising: this is the user's code (a model's forward, a
        # loss) calling sys.exit, which must not pass for the command's own status (0: "fits").
        print(f"error: {UserCodeError('your code called sys.exit:', e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `| head`: the reader is gone, which is not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # the user's model or an internal fault: never a raw traceback
        if os.environ.get("MEMTRACE_TRACEBACK") == "1":
            traceback.print_exc()
        if (too_large := size_overflow(e)) is not None:
            print(f"error: {too_large}", file=sys.stderr)
        elif user_frames(e):
            print(f"error: {UserCodeError('your code raised', e)}", file=sys.stderr)
        else:
            print(f"error: {_internal(e)}", file=sys.stderr)
        return 2
    return rc or 0
