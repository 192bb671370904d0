"""Tracing an unmodified training script (`estimate --script train.py -- ARGS`).

The script runs as `__main__` with `sys.argv = [train.py, *ARGS]`, inside the same fake device as
a step function (symtrace/userstep.py `tracing`): `"cuda"` is meta, `torch.cuda` is the
profile's GPU, autocast and optimizer defaults are PyTorch's CUDA ones. An iteration ends once
every optimizer the script built has stepped (`_Optimizers`), or at
`memtrace_trainer.mark("iter")` when the script calls it; a script
that builds no `torch.optim.Optimizer` (a hand-written update) is counted at the first module
call after a backward and an update (the parameters changed in place, or their gradients
were reset), where its next iteration begins; micro-batches of an accumulation begin none.
After N the run is stopped cleanly
(a `BaseException`, so the script's `except Exception` does not swallow it; a bare `except:`
that does is said). Data-dependent reads on the tracer's device get stand-ins (fakecuda.py):
`.item()` is 0, `.cpu()`/`.tolist()`/`.numpy()` give zeros; ops whose output shape depends on values
(`nonzero`, `masked_select`, `unique`) fail with the op and the script's line.
"""

from __future__ import annotations

import contextlib
import runpy
import sys
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import memtrace_trainer
from memtrace_trainer import markers
from memtrace_trainer.errors import UserCodeError, UserError, check_input_file
from memtrace_trainer.notes import warn
from memtrace_trainer.profile import Profile
from memtrace_trainer.symtrace.gpus import named_as
from memtrace_trainer.symtrace.recorder import Recorder
from memtrace_trainer.symtrace.userstep import (
    Run,
    _modules,
    check_steps,
    label_model_state,
    new_root_modules,
    tracing,
)


class _Enough(BaseException):
    """N iterations traced: the script stops here."""


# Stops a script may swallow (a bare `except:` inside `while True:`) before it is ended by
# force: Python has no exception it cannot catch, and such a loop would run for ever.
MAX_SWALLOWED = 100


# Where `_unstoppable` sends its message before the process ends: None prints it to stderr (the
# CLI); serve's worker sends it as its request's answer, since a bare `except:` leaves no
# exception to carry it there.
unstoppable_reply: Callable[[str], None] | None = None


def _unstoppable(path: Path, steps: int) -> None:
    """Ends the process with an error: the script caught every stop, so neither the trace nor
    the command can finish. Only the CLI and serve's workers trace scripts; each is a process
    of its own, so nothing else is ended with it."""
    import os

    message = (f"--script {path}: the script caught the stop after {steps} iterations "
               f"{MAX_SWALLOWED} times (a bare `except:` or `except BaseException:` inside an "
               "endless loop) and would run for ever; let BaseException through, or end the "
               "loop after a number of steps")  # fmt: skip
    sys.stdout.flush()
    if unstoppable_reply is None:
        print(f"error: {message}", file=sys.stderr, flush=True)
    else:
        unstoppable_reply(message)
    # The command's temporary folders (`TemporaryDirectory`'s `weakref.finalize`), which
    # os._exit left behind. Only those: the other exit functions (multiprocessing joining a
    # child that never ends, the script's own) could keep this process from ending.
    import weakref

    with contextlib.suppress(BaseException):
        weakref.finalize._exitfunc()  # type: ignore[attr-defined]
    os._exit(2)


class _Optimizers:
    """The `torch.optim.Optimizer`s a script builds (third-party ones too: each calls the base
    `__init__`). An iteration ends once each live one has stepped: a GAN's two, Muon beside
    AdamW, a wrapper (`ZeroRedundancyOptimizer`) and the optimizer inside it."""

    # An optimizer that has not stepped while the others stepped this often is not in the loop
    # (unused, or a warm-up's left behind), and no longer waited for.
    IDLE = 64

    def __init__(self) -> None:
        self.built = 0
        self.steps = 0
        self.live: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        # The step count at each optimizer's last step (or at its construction).
        self.last: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = (
            weakref.WeakKeyDictionary()
        )
        self.this_iteration: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self.idle: list[str] = []

    @contextlib.contextmanager
    def counting(self) -> Iterator[_Optimizers]:
        base = torch.optim.Optimizer
        original = base.__init__

        def counted(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            self.built += 1
            self.live.add(opt)
            self.last[opt] = self.steps
            original(opt, *args, **kwargs)

        base.__init__ = counted  # type: ignore[method-assign]
        try:
            yield self
        finally:
            base.__init__ = original  # type: ignore[method-assign]

    def ends_iteration(self, opt: torch.optim.Optimizer) -> bool:
        """`opt` has stepped: whether every optimizer of the loop has now."""
        self.steps += 1
        self.live.add(opt)  # one built before the script's run, or without the base __init__
        self.last[opt] = self.steps
        self.this_iteration.add(opt)
        # Not stepped while the others stepped IDLE times: never used, or left behind (a
        # warm-up's optimizer).
        for o in [o for o in self.live if self.steps - self.last.get(o, 0) >= self.IDLE]:
            self.live.discard(o)
            self.idle.append(type(o).__name__)
        if any(o not in self.this_iteration for o in self.live):
            return False
        self.this_iteration = weakref.WeakSet()
        return True


def run_script(
    path: Path, argv: list[str], steps: int, profile: Profile, rec: Recorder, emulate: bool
) -> Run:
    check_steps(steps)
    if not path.exists():
        raise UserError(f"--script {path}: no such file")
    check_input_file(path, f"--script {path}", "a Python training script (TRAIN.py)")
    before = set(_modules())
    state: dict[str, Any] = {
        "done": 0,
        "explicit": False,
        "stopped": False,
        "updated_from": None,
        "swallowed": 0,
    }
    optimizers = _Optimizers()

    def advance() -> None:
        if state["stopped"]:
            state["swallowed"] += 1
            if state["swallowed"] >= MAX_SWALLOWED:
                _unstoppable(path, steps)
            raise _Enough  # the script caught the stop and went on: asked again
        label_model_state(rec, new_root_modules(before))
        state["done"] += 1
        if state["done"] >= steps:
            state["stopped"] = True
            raise _Enough
        rec.marker(markers.iteration(state["done"]))
        rec.marker(markers.phase("forward"))
        rec.category = "activation"

    def after_optimizer_step(opt: torch.optim.Optimizer) -> None:
        if not state["explicit"] and optimizers.ends_iteration(opt):
            advance()

    def mark(text: str) -> None:
        # `mark("iter")` is the documented call; an `iter:<n>` marker ends an iteration too.
        if text == "iter" or markers.iteration_of(text) is not None:
            state["explicit"] = True
            advance()
        else:
            rec.marker(text)

    saved_argv, saved_path = sys.argv, list(sys.path)
    with tracing(profile, rec, emulate) as run, optimizers.counting():
        assert run.hooks is not None
        hooks = run.hooks
        hooks.after_step = after_optimizer_step

        params: list[torch.Tensor] = []

        def versions() -> list[tuple[int, int, int]]:
            # An update in place bumps a parameter's version; one through `.data` does not, but
            # the gradients it consumed are then reset (None, or zeroed in place).
            return [
                (p._version, id(p.grad), -1 if p.grad is None else p.grad._version) for p in params
            ]

        def after_backward() -> None:
            if state["explicit"] or optimizers.built:
                return
            if not params:
                params.extend(p for m in new_root_modules(before) for p in m.parameters())
            state["updated_from"] = versions()

        def iteration_boundary(module: torch.nn.Module, args: Any) -> None:
            # Without an optimizer, an iteration ends where the parameters were updated in
            # place since the last backward (the script's own update): the next module call.
            # A micro-batch (no update yet) and a checkpoint's recompute (inside a backward)
            # begin none.
            seen = state["updated_from"]
            if state["explicit"] or optimizers.built or hooks.depth or seen is None:
                return
            # Only the first module call after a backward decides.
            state["updated_from"] = None
            if versions() != seen:
                advance()

        hooks.after_backward = after_backward
        forward_hook = torch.nn.modules.module.register_module_forward_pre_hook(iteration_boundary)
        memtrace_trainer._MARK = mark
        sys.argv = [str(path), *argv]
        sys.path.insert(0, str(path.resolve().parent))
        rec.marker(markers.iteration(0))
        rec.marker(markers.phase("forward"))
        try:
            # The script's prints go to stderr: stdout is the command's answer (--json).
            with contextlib.redirect_stdout(sys.stderr), named_as(f"--script {path}"):
                runpy.run_path(str(path), run_name="__main__")
        except _Enough:
            pass
        except SystemExit as e:
            state["exited"] = True
            if e.code not in (None, 0):
                # sys.exit("a message") exits 1 and prints the message; sys.exit(N) is a status.
                said = f"with status {e.code}" if isinstance(e.code, int) else f"saying: {e.code}"
                raise UserError(f"--script {path}: the script exited {said}") from None
        except UserError:
            raise
        except Exception as e:
            raise UserCodeError(f"--script {path}: the script raised", e) from e
        else:
            if state["stopped"]:
                warn(
                    f"--script {path}: the script caught the stop after {steps} iterations (a "
                    "bare `except:` or `except BaseException:`) and ran on to its end: what it "
                    "ran after is traced too"
                )
        finally:
            forward_hook.remove()
            memtrace_trainer._MARK = None
            sys.argv, sys.path[:] = saved_argv, saved_path
        run.models = new_root_modules(before)
        label_model_state(rec, run.models)
        # The last update, with no module call after it, finished an iteration too.
        seen = state["updated_from"]
        if seen is not None and not state["stopped"] and versions() != seen:
            state["done"] += 1
    if optimizers.idle:
        warn(
            f"--script {path}: optimizers that did not step while the others stepped "
            f"{_Optimizers.IDLE} times ({', '.join(optimizers.idle)}) are not counted in the "
            "loop's iterations from then on"
        )
    if state["done"] < steps:
        run.iterations = max(state["done"], 1)
        if state["done"] == 0:
            warn(
                f"--script {path}: the script finished without an optimizer.step(), a "
                'backward followed by another forward, or memtrace_trainer.mark("iter"): the '
                "whole run is traced as one iteration"
            )
        elif state.get("exited"):
            warn(
                f"--script {path}: the script called sys.exit after {state['done']} of {steps} "
                "iterations: the trace holds the iterations it ran"
            )
        else:
            warn(
                f"--script {path}: the script ended after {state['done']} of {steps} iterations "
                "(values read back while tracing are stand-ins: `.item()` and `bool()` of a tensor "
                "are 0/False, so a loop that stops on its loss, as early stopping does, may stop "
                "at once; the trace's last iteration is what ran after the last step)"
            )
    return run
