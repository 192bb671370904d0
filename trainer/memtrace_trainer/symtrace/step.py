"""The training loop the tracer runs on meta, written as a user's loop is written, so tensors
live exactly as long as they would on a GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memtrace_trainer import markers
from memtrace_trainer.dtypes import AMP
from memtrace_trainer.errors import UserError, model_failed, model_label, raised_by_memtrace
from memtrace_trainer.notes import warn
from memtrace_trainer.optim import OPTIMIZERS, make_optimizer, paged_bytes
from memtrace_trainer.profile import Profile
from memtrace_trainer.symtrace.checkpointing import CHECKPOINTING, enable_checkpointing
from memtrace_trainer.symtrace.deepspeed import (
    deepspeed_fp32_bytes,
    heaviest_rank,
    reduce_buffers,
    stage1_reduce,
    stage1_step_copies,
    zero_redundancy,
)
from memtrace_trainer.symtrace.distributed import check as check_distributed
from memtrace_trainer.symtrace.distributed import check_with_step, runs_as, wrap_ddp
from memtrace_trainer.symtrace.emulation import Flash
from memtrace_trainer.symtrace.recorder import Recorder
from memtrace_trainer.symtrace.userstep import MAX_STEPS, check_steps, run_steps
from memtrace_trainer.workload import Workload, call_model

# A baseline that needs the job's model and optimizer (PyTorch's FSDPMemTracker) is given them
# once the tracer's loop has made them, and answers with a maker of the context each step runs in.
StepContext = Callable[[], contextlib.AbstractContextManager[Any]]
_STEP_WATCHERS: list[Callable[[nn.Module, Any], StepContext]] = []


@contextlib.contextmanager
def watch_steps(fn: Callable[[nn.Module, Any], StepContext]) -> Iterator[None]:
    """While active, the tracer's own loop calls `fn(model, optimizer)` once both exist and
    runs every step inside a fresh context from what it returns."""
    _STEP_WATCHERS.append(fn)
    try:
        yield
    finally:
        _STEP_WATCHERS.remove(fn)


@dataclass(frozen=True)
class StepConfig:
    optimizer: str = "adam"
    iterations: int = 2
    amp: str | None = None
    # None, "full" (every block recomputed) or "selective" (torchtitan's op-level policy).
    checkpointing: str | None = None
    grad_accum: int = 1
    cuda_emulation: bool = True
    # Sharded training (symtrace/distributed.py): rank 0 of `world_size` ranks.
    world_size: int | None = None
    strategy: str | None = None
    # FSDP2's MixedPrecisionPolicy as "PARAM[:REDUCE]" dtypes (e.g. "bf16:fp32").
    fsdp_mp: str | None = None
    # DeepSpeed's reduce_bucket_size in elements (zero1-3; None: its default, 5e8).
    reduce_bucket_size: int | None = None
    # The search that chose `world_size` (`min-world-size`), when the user gave no --world-size:
    # warnings name its probe, not the flag.
    world_by: str | None = None

    def __post_init__(self) -> None:
        # A bool is the older spelling: True is "full".
        if isinstance(self.checkpointing, bool):
            object.__setattr__(self, "checkpointing", "full" if self.checkpointing else None)

    def validate(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise UserError(
                f"--optimizer {self.optimizer!r}: expected one of {', '.join(OPTIMIZERS)}"
            )
        if self.checkpointing is not None and self.checkpointing not in CHECKPOINTING:
            expected = ", ".join(CHECKPOINTING)
            raise UserError(f"--checkpointing {self.checkpointing!r}: expected one of {expected}")
        check_loop(self.iterations, self.grad_accum)
        check_distributed(
            self.strategy, self.world_size, self.fsdp_mp, self.reduce_bucket_size, self.world_by
        )
        if self.amp is not None and self.amp not in AMP:
            raise UserError(f"--amp {self.amp!r}: expected one of {sorted(AMP)}")
        check_with_step(self.strategy, self.optimizer, self.amp, self.fsdp_mp)


def check_loop(steps: int, grad_accum: int) -> None:
    """Refuse a loop the tracer cannot take: `check_steps`, and as many micro-batches in all,
    since each of them is traced op by op as a step is (a million ran for days)."""
    check_steps(steps)
    if grad_accum < 1:
        raise UserError(f"--grad-accum {grad_accum}: expected at least 1")
    if steps * grad_accum > MAX_STEPS:
        raise UserError(f"--grad-accum {grad_accum}: {steps} steps x {grad_accum} micro-batches "
                        f"= {steps * grad_accum}, expected at most {MAX_STEPS} micro-batches in "
                        "all (the peak shows within the first few steps; each micro-batch is "
                        "traced op by op)")  # fmt: skip


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


def prepare(
    model: nn.Module, optimizer: str, checkpointing: str | bool | None
) -> tuple[list[Any], Any]:
    """Train mode, checkpointing if asked (True is "full"), and the optimizer over the trainable
    parameters, with foreach/fused left to PyTorch's own default for the device: the traced
    loop's and a real run's (runs/train.py) setup alike."""
    model.train()
    if checkpointing:
        enable_checkpointing(model, "full" if checkpointing is True else checkpointing)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        # PyTorch's own words ("optimizer got an empty parameter list") read as a fault of the
        # model's code; it is the job's: there is nothing to train.
        raise UserError("the model has no parameter that requires grad: nothing to train "
                        "(unfreeze some with requires_grad_(True), or train adapters with "
                        "LoRA)")  # fmt: skip
    return params, make_optimizer(optimizer, params)


def check_loss(loss: Any, said: str = "the loss") -> None:
    """What backward() is called on must be one number: a loss function that returns nothing,
    a float or an unreduced tensor is refused in words that name it (`said`: the Python API's
    caller wrote a `loss_fn`, the CLI's did not), not in the AttributeError or "grad can be
    implicitly created only for scalar outputs" of the line that uses it."""
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return
    if isinstance(loss, torch.Tensor):
        got = f"a tensor of shape {tuple(loss.shape)}"
    else:
        got = "None" if loss is None else f"a {type(loss).__name__}"
    hint = ": reduce it (.mean(), .sum())" if isinstance(loss, torch.Tensor) else ""
    raise UserError(f"{said} returned {got}: expected a scalar tensor (one element) to call "
                    f"backward() on{hint}")  # fmt: skip


def canned(workload: Workload, cfg: StepConfig, rec: Recorder, made: dict[str, Any]) -> Any:
    """The tracer's own loop for a model spec or `--entry`, as a step function: the model is
    built already; the optimizer, scaler and batches are made inside the trace."""

    def make(device: torch.device) -> Any:
        model = workload.model
        params, optimizer = prepare(model, cfg.optimizer, cfg.checkpointing)
        if cfg.strategy is not None and runs_as(cfg.strategy)[0] == "ddp":
            model = wrap_ddp(model)
        if cfg.strategy == "zero1":
            optimizer = zero_redundancy(optimizer, params)
            extra = deepspeed_fp32_bytes(workload.model, optimizer, cfg.optimizer)
            if extra:
                # Held as long as the optimizer: DeepSpeed makes its fp32 partition at start.
                with rec.categorized("optimizer_state"):
                    made["deepspeed_fp32"] = torch.empty(extra, dtype=torch.uint8, device=device)
            # The heaviest rank's state beyond rank 0's, so the need is that rank's.
            _, more, made["zero1_ranks"] = heaviest_rank(workload.model, optimizer, cfg.optimizer)
            if more:
                with rec.categorized("optimizer_state"):
                    made["zero1_heavier"] = torch.empty(more, dtype=torch.uint8, device=device)
        bucket = made.get("reduce_bucket")
        if bucket is not None and bucket["held"] == "optimizer":
            # ZeRO-3's reduce buffer: made after the optimizer state, kept for the run.
            with rec.categorized("other"):
                made["reduce_buffers"] = reduce_buffers(bucket, device)
        # ZeRO-2's: made as each backward starts, dropped once its gradients are reduced.
        # ZeRO-1's: each backward replaces it, and it is dropped only at the accumulation
        # boundary, where stage 1 reduces: one, from the first backward to the reduction.
        in_backward = bucket if bucket is not None and bucket["held"] != "optimizer" else None
        stage1 = cfg.strategy == "zero1"
        # ZeRO-1: this rank's partition, whose gradients DeepSpeed keeps past the reduction.
        mine = {id(p) for g in optimizer._partition_parameters()[0] for p in g["params"]} \
            if stage1 else set()  # fmt: skip
        made["optimizer"] = optimizer

        def label(grad: torch.Tensor) -> None:
            # A gradient DeepSpeed drops before the step, where the tracer labels the rest.
            addr = rec.address(grad)
            if addr is not None:
                rec.recategorize(addr, "gradient")

        watchers = [fn(model, optimizer) for fn in _STEP_WATCHERS]
        scaler = GradScaler() if cfg.amp == "fp16" else None
        if scaler and any(p.dtype == torch.float16 for p in params):
            # torch.amp.GradScaler.unscale_ raises "Attempting to unscale FP16 gradients": the
            # job would fail at its first step, so there is no memory to estimate.
            raise UserError(
                "--amp fp16 over fp16 trainable parameters (--dtype fp16): PyTorch's GradScaler "
                "cannot unscale fp16 gradients and fails at the first step; train them in fp32 "
                "(--amp fp16 alone, or --lora, whose adapters stay fp32) or use bf16"
            )
        amp = AMP[cfg.amp] if cfg.amp else None
        # A loop's variables live until reassigned in the next iteration, after the new value
        # is computed: the previous logits and loss overlap the next forward, as on a GPU.
        held: dict[str, Any] = {}

        def step() -> None:
            with contextlib.ExitStack() as watched:
                for w in watchers:
                    watched.enter_context(w())
                try:
                    one_step()
                except UserError:
                    raise
                except Exception as e:
                    # The model failing in PyTorch is the job's fault at this batch, not an
                    # internal error of the tool's.
                    if raised_by_memtrace(e):
                        raise
                    raise model_failed(workload.spec, workload.family, workload.batch_size,
                                       "to train it", e) from e  # fmt: skip

        def one_step() -> None:
            buffers: list[torch.Tensor] = []
            for _ in range(cfg.grad_accum):
                rec.marker(markers.phase("data"))
                rec.category = "input"
                held["inputs"], held["target"] = workload.make_batch()
                rec.marker(markers.phase("forward"))
                rec.category = "activation"
                with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
                    held["out"] = call_model(model, held["inputs"])
                    loss = workload.loss(held["out"], held["target"])
                    check_loss(loss)
                    if cfg.grad_accum > 1:
                        loss = loss / cfg.grad_accum
                held["loss"] = loss
                del loss
                if not (stage1 and buffers):
                    with rec.categorized("other"):
                        buffers = reduce_buffers(in_backward, device)
                (scaler.scale(held["loss"]) if scaler else held["loss"]).backward()
                if not stage1:
                    buffers = []
            copies = None
            if stage1:
                with rec.categorized("gradient"):
                    stage1_reduce(params, mine, bucket["elements"] if bucket else 0, label)
                    buffers = []
                    copies = stage1_step_copies(params, mine)
            if scaler:
                scaler.unscale_and_step(optimizer, [p.grad for p in params if p.grad is not None])
            else:
                optimizer.step()
            del copies
            optimizer.zero_grad(set_to_none=True)

        return step

    return make


def flash_of(workload: Workload) -> Flash | None:
    """`--attn flash_attention_2`'s attention, with the dtype a quantized model casts fp32
    attention inputs to (`pre_quantization_dtype` in the model's details)."""
    from memtrace_trainer.dtypes import DTYPES

    if workload.details.get("attn") != "flash_attention_2":
        return None
    return Flash(DTYPES.get(workload.details.get("pre_quantization_dtype") or "fp32"))


def run(workload: Workload, cfg: StepConfig, profile: Profile, rec: Recorder) -> dict[str, Any]:
    """Runs `cfg.iterations` training iterations under `rec`; returns what was emulated."""
    cfg.validate()
    made: dict[str, Any] = {}
    with contextlib.ExitStack() as world:
        sharded = None
        if cfg.strategy is not None:
            from memtrace_trainer.symtrace.distributed import fake_world, shard

            mesh = world.enter_context(fake_world(cfg.world_size or 1))
            sharded = shard(workload.model, cfg.strategy, mesh, cfg.fsdp_mp, cfg.optimizer,
                            cfg.reduce_bucket_size)  # fmt: skip
            made["reduce_bucket"] = sharded.get("reduce_bucket")
        done = run_steps(
            canned(workload, cfg, rec, made),
            cfg.iterations,
            profile,
            rec,
            cfg.cuda_emulation,
            model_label(workload.spec, workload.family),
            models=[workload.model],
            flash=flash_of(workload),
        )
    emulated: dict[str, Any] = {"sdpa_backends": done.sdpa_backends}
    if sharded is not None:
        if made.get("zero1_ranks"):
            sharded["ranks"] = made["zero1_ranks"]
        emulated["distributed"] = sharded
    paged = paged_bytes(made.get("optimizer"))
    if paged:
        emulated["paged_optimizer_bytes"] = paged
        warn(
            f"--optimizer {cfg.optimizer}: {paged / 2**20:.1f} MiB of optimizer state lives in "
            "CUDA managed memory (bitsandbytes' paged buffers), outside PyTorch's allocator and "
            "outside this estimate; it is resident on the GPU until memory runs short, then "
            "paged to the host"
        )
    return emulated
