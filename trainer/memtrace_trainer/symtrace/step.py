"""The training loop the tracer runs on meta, written as a user's loop is written, so tensors
live exactly as long as they would on a GPU."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from memtrace_trainer.errors import UserError
from memtrace_trainer.profile import Profile
from memtrace_trainer.symtrace.recorder import Recorder
from memtrace_trainer.symtrace.userstep import run_steps
from memtrace_trainer.workload import Workload, call_model

OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum", "adagrad", "rmsprop")
AMP = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class StepConfig:
    optimizer: str = "adam"
    iterations: int = 2
    amp: str | None = None
    checkpointing: bool = False
    grad_accum: int = 1
    cuda_emulation: bool = True

    def validate(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"--optimizer {self.optimizer!r}: expected one of {OPTIMIZERS}")
        if self.iterations < 1:
            raise UserError(f"--iterations {self.iterations}: expected at least 1")
        if self.grad_accum < 1:
            raise UserError(f"--grad-accum {self.grad_accum}: expected at least 1")
        if self.amp is not None and self.amp not in AMP:
            raise UserError(f"--amp {self.amp!r}: expected one of {sorted(AMP)}")


def make_optimizer(name: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    fe: dict[str, Any] = {}
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3, **fe)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, **fe)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-2, **fe)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9, **fe)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=1e-2, **fe)
    return torch.optim.RMSprop(params, lr=1e-2, **fe)


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks to checkpoint: children of the outermost Sequential/ModuleList
    containers that hold composite modules; leaves of a flat Sequential otherwise."""
    found: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        for child in m.children():
            if isinstance(child, nn.Sequential | nn.ModuleList) and any(
                any(True for _ in c.children()) for c in child.children()
            ):
                found.extend(child.children())
            else:
                visit(child)

    visit(model)
    if not found and isinstance(model, nn.Sequential):
        found = [c for c in model.children() if any(True for _ in c.parameters())]
    return found


def _with_modes(f: Any, modes: list[Any]) -> Any:
    """Recomputation runs inside the autograd engine, where our function modes are not on the
    stack; re-enter the ones that were active in the forward pass, as autocast state is
    restored for a real recompute."""

    def run(*args: Any, **kwargs: Any) -> Any:
        stack = torch.overrides._get_current_function_mode_stack()
        missing = [m for m in modes if m not in stack]
        with contextlib.ExitStack() as es:
            for m in missing:
                es.enter_context(m)
            return f(*args, **kwargs)

    return run


def enable_checkpointing(model: nn.Module) -> int:
    blocks = _blocks(model)
    for block in blocks:
        forward = block.forward

        def wrapped(*args: Any, _f: Any = forward, **kwargs: Any) -> Any:
            stack = list(torch.overrides._get_current_function_mode_stack())
            return checkpoint(_with_modes(_f, stack), *args, use_reentrant=False,
                              preserve_rng_state=False, **kwargs)  # fmt: skip

        block.forward = wrapped  # type: ignore[method-assign]
    if not blocks:
        raise UserError("--checkpointing: found no blocks to checkpoint in this model")
    return len(blocks)


class GradScaler:
    """torch.amp.GradScaler's device allocations (it disables itself without a GPU)."""

    def __init__(self) -> None:
        self.scale_t = torch.full((), 65536.0, dtype=torch.float32, device="meta")
        self.growth = torch.zeros((), dtype=torch.int32, device="meta")

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_t

    def unscale_and_step(self, optimizer: torch.optim.Optimizer, grads: list[torch.Tensor]) -> None:
        inv_scale = self.scale_t.double().reciprocal().float()
        found_inf = torch.full((1,), 0.0, dtype=torch.float32, device="meta")
        for g in grads:
            g.mul_(inv_scale)
        optimizer.step()
        self.scale_t.mul_(1.0)
        del inv_scale, found_inf


def prepare(model: nn.Module, optimizer: str, checkpointing: bool) -> tuple[list[Any], Any]:
    """Train mode, checkpointing if asked, and the optimizer over the trainable parameters, with
    foreach/fused left to PyTorch's own default for the device: the traced loop's and a real
    run's (runs/train.py) setup alike."""
    model.train()
    if checkpointing:
        enable_checkpointing(model)
    params = [p for p in model.parameters() if p.requires_grad]
    return params, make_optimizer(optimizer, params)


def canned(workload: Workload, cfg: StepConfig, rec: Recorder) -> Any:
    """The tracer's own loop for a model spec or `--entry`, as a step function: the model is
    built already; the optimizer, scaler and batches are made inside the trace."""

    def make(device: torch.device) -> Any:
        model = workload.model
        params, optimizer = prepare(model, cfg.optimizer, cfg.checkpointing)
        scaler = GradScaler() if cfg.amp == "fp16" else None
        amp = AMP[cfg.amp] if cfg.amp else None
        # A loop's variables live until reassigned in the next iteration, after the new value
        # is computed: the previous logits and loss overlap the next forward, as on a GPU.
        held: dict[str, Any] = {}

        def step() -> None:
            for _ in range(cfg.grad_accum):
                rec.marker("phase:data")
                rec.category = "input"
                held["inputs"], held["target"] = workload.make_batch()
                rec.marker("phase:forward")
                rec.category = "activation"
                with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
                    held["out"] = call_model(model, held["inputs"])
                    loss = workload.loss(held["out"], held["target"])
                    if cfg.grad_accum > 1:
                        loss = loss / cfg.grad_accum
                held["loss"] = loss
                del loss
                (scaler.scale(held["loss"]) if scaler else held["loss"]).backward()
            if scaler:
                scaler.unscale_and_step(optimizer, [p.grad for p in params if p.grad is not None])
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step

    return make


def run(workload: Workload, cfg: StepConfig, profile: Profile, rec: Recorder) -> dict[str, Any]:
    """Runs `cfg.iterations` training iterations under `rec`; returns what was emulated."""
    cfg.validate()
    done = run_steps(
        canned(workload, cfg, rec),
        cfg.iterations,
        profile,
        rec,
        cfg.cuda_emulation,
        workload.spec,
        models=[workload.model],
    )
    return {"sdpa_backends": done.sdpa_backends}
