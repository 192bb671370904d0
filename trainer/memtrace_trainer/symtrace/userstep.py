"""Running a training step as its author wrote it, on the tracer's device.

A step function `FN(device)` builds the user's model, optimizer and data on `device` and returns a
zero-argument `step()` that runs one iteration of their loop. The tracer calls `FN(meta)` under
the recorder, then `step()` N times, each after an `iter:<n>` marker. Nothing in the step is
rewritten: its optimizer, `zero_grad` placement, `no_grad`/`inference_mode`, autocast regions and
accumulation run as written. While it runs:

- `"cuda"` means the tracer's device (`DeviceMap`): factory `device=` arguments, `Tensor.to`,
  `Tensor.cuda`, `Module.to`/`.cuda`; `pin_memory()` is the identity;
- `torch.cuda` answers for the profile's GPU (`CudaShim`): availability, name, capability,
  properties, `mem_get_info`, and `memory_allocated`/`max_memory_allocated` from the recorder's
  live bytes; `empty_cache` and `reset_peak_memory_stats` go into the trace as control records;
  `synchronize` and memory-history recording do nothing;
- phases and categories come from where PyTorch runs: `torch.autograd.backward`/`grad` mark the
  backward pass, global optimizer-step hooks mark the optimizer step and label gradients and
  optimizer state;
- the foreach/fused choice of optimizers built with the defaults is PyTorch's own
  `_default_to_fused_or_foreach`, evaluated with meta counted as a CUDA-like device.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from memtrace_trainer import markers
from memtrace_trainer.errors import EntryFailedError, UserCodeError, UserError, check_batch_size
from memtrace_trainer.profile import Profile
from memtrace_trainer.symtrace.emulation import Flash
from memtrace_trainer.symtrace.fakecuda import META, CudaShim, DeviceMap
from memtrace_trainer.symtrace.gpus import named_as
from memtrace_trainer.symtrace.recorder import Recorder, storage_resizes
from memtrace_trainer.workload import user_function

StepFn = Callable[[torch.device], Callable[[], Any]]

# The peak of a training job shows within its first few steps (the profiles are calibrated at
# 2); every traced step runs each op of the step again, on one core, and adds as much again to
# the trace. A count past this is a run's length, not a trace's, and would run for hours.
MAX_STEPS = 1000


def check_steps(steps: int) -> None:
    """Refuse a step count the tracer cannot take: below 1, or above `MAX_STEPS`."""
    if steps < 1:
        raise UserError(f"--steps {steps}: expected at least 1")
    if steps > MAX_STEPS:
        raise UserError(f"--steps {steps}: expected at most {MAX_STEPS} (the peak shows "
                        "within the first few steps; each is traced op by op)")  # fmt: skip


def step_name(spec: Any) -> str:
    """How messages name a step function: `package.module:function` as given, or the function's
    own name (the Python API passes the function itself)."""
    if isinstance(spec, str):
        return spec
    name = getattr(spec, "__qualname__", None) or getattr(getattr(spec, "func", None),
                                                           "__qualname__", None)  # fmt: skip
    return str(name or type(spec).__qualname__)


def step_label(spec: Any) -> str:
    """The step function as every message names it: `--step NAME` (the Python API says it as
    `model=NAME`)."""
    return f"--step {step_name(spec)}"


def load_step(spec: Any, with_batch: bool = False) -> Any:
    """`package.module:function` (or the function itself, from the Python API), checked to take
    the device (and, `with_batch`, the batch size as a second argument: what `max-batch --step`
    searches over)."""
    func, func_name = _resolve(spec)
    try:
        sig = inspect.signature(func)
    except ValueError:
        return func  # builtins without a signature: let the call say
    if not _binds(sig, META, *((1,) if with_batch else ())):
        takes = (
            "two arguments, the device and the batch size,"
            if with_batch
            else "one argument, the device,"
        )
        raise UserError(
            f"{step_label(spec)}: {func_name} must take {takes} and return a zero-argument step()"
        )
    return func


def step_batch(spec: Any, batch_size: int | None) -> int | None:
    """The batch size a step function is called with: `FN(device, batch_size)` takes
    `--batch-size` (the argument `max-batch --step` searches); a function of the device alone
    takes none (`--batch-size` is then said to have no effect). A function that needs the batch
    size and was given none is refused."""
    check_batch_size(batch_size, optional=True)  # refused as every command refuses it, taken or not
    func, name = _resolve(spec)
    try:
        sig = inspect.signature(func)
    except ValueError:
        return None  # a builtin without a signature: called with the device
    alone, with_batch = _binds(sig, META), _binds(sig, META, 1)
    if with_batch and not alone and batch_size is None:
        raise UserError(f"{step_label(spec)}: {name} takes the batch size as its second "
                        "argument: give --batch-size N")  # fmt: skip
    if not alone and not with_batch:
        load_step(spec)  # its words for a function that takes neither
    return batch_size if with_batch else None


def _binds(sig: inspect.Signature, *args: Any) -> bool:
    try:
        sig.bind(*args)
    except TypeError:
        return False
    return True


@contextlib.contextmanager
def parameters_kept() -> Iterator[None]:
    """`Module.to("cuda")`/`.cuda()` keeps each parameter object, as it does on a GPU. PyTorch
    takes a move to the tracer's device (meta) for an incompatible one and makes new
    `Parameter`s: an optimizer built before the move then held the old ones (no gradients, so no
    optimizer state in the estimate), and tied weights came apart (counted twice). Swapping the
    tensors in place (PyTorch's own `swap_module_params_on_conversion`) keeps them."""
    from torch.nn.parameter import UninitializedParameter

    original = nn.Module._apply

    def _apply(self: nn.Module, fn: Any, recurse: bool = True) -> Any:
        lazy = [k for k, p in self._parameters.items() if isinstance(p, UninitializedParameter)]
        out = original(self, fn, recurse)
        # The swap makes a lazy module's UninitializedParameter a plain Parameter of no
        # elements, which its first forward then refuses; on a GPU it stays uninitialized.
        for key in lazy:
            p = self._parameters[key]
            if p is not None and not isinstance(p, UninitializedParameter):
                kept = UninitializedParameter(p.requires_grad, p.device, p.dtype)
                torch.utils.swap_tensors(p, kept)
        return out

    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    nn.Module._apply = _apply  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module._apply = original  # type: ignore[method-assign]
        torch.__future__.set_swap_module_params_on_conversion(before)


@contextlib.contextmanager
def cudnn_benchmark_kept() -> Iterator[None]:
    """A program's `torch.backends.cudnn.benchmark = True` is its own: the next trace in this
    process (serve, the Python API) starts from the caller's setting."""
    before = torch.backends.cudnn.benchmark
    try:
        yield
    finally:
        # Only when changed: once a test harness calls `disable_global_flags`, any assignment
        # raises, and a program that could change it could change it back.
        if torch.backends.cudnn.benchmark != before:
            torch.backends.cudnn.benchmark = before


def _resolve(spec: Any) -> tuple[Any, str]:
    """The step function of `package.module:function` (or the function), and its name."""
    if callable(spec):
        return spec, step_name(spec)
    return user_function(spec, "--step"), spec.partition(":")[2]


class PhaseHooks:
    """Phase markers and categories from PyTorch's own entry points: backward and optimizer
    steps, wherever the user's code calls them."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.optimizer_steps = 0
        # Outermost backward passes (and `autograd.grad` calls) that returned, and how deep the
        # program is in one now: a reentrant checkpoint's recompute runs its own inside. A
        # script's loop without an optimizer counts by them.
        self.backwards = 0
        self.depth = 0
        # Called after each outermost backward.
        self.after_backward: Callable[[], None] | None = None
        self.optimizers: set[str] = set()
        # Called with the optimizer after each of its steps (a script counts its iterations).
        self.after_step: Callable[[torch.optim.Optimizer], None] | None = None
        self._handles: list[Any] = []
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> PhaseHooks:
        import torch.optim.optimizer as opt

        rec = self.rec

        def pre(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            self.optimizers.add(type(optimizer).__name__.lower())
            rec.marker(markers.phase("optimizer"))
            rec.category = "other"
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        addr = rec.address(_local(p.grad))
                        if addr is not None:
                            rec.recategorize(addr, "gradient")

        def post(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            self.optimizer_steps += 1
            for state in optimizer.state.values():
                for value in state.values():
                    value = _local(value)
                    addr = rec.address(value) if isinstance(value, torch.Tensor) else None
                    if addr is not None:
                        rec.recategorize(addr, "optimizer_state")
            if self.after_step is not None:
                self.after_step(optimizer)

        self._handles += [
            opt.register_optimizer_step_pre_hook(pre),
            opt.register_optimizer_step_post_hook(post),
        ]
        for name in ("backward", "grad"):
            self._wrap_backward(name)
        return self

    def _wrap_backward(self, name: str) -> None:
        original = getattr(torch.autograd, name)
        rec = self.rec

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            # What follows a backward (clipping, the next micro-batch) stays in this phase until
            # the code marks another: the optimizer hook, or the next step's forward.
            rec.marker(markers.phase("backward"))
            before, rec.category = rec.category, "activation"
            self.depth += 1
            try:
                out = original(*args, **kwargs)
            finally:
                rec.category = before
                self.depth -= 1
            if self.depth == 0:
                self.backwards += 1
                if self.after_backward is not None:
                    self.after_backward()
            return out

        self._saved.append((torch.autograd, name, original))
        setattr(torch.autograd, name, wrapped)

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for mod, name, value in reversed(self._saved):
            setattr(mod, name, value)
        self._saved.clear()


@contextlib.contextmanager
def cuda_like_optimizer_defaults(defaults: bool = True) -> Iterator[None]:
    """Meta among the devices that have foreach and fused kernels: an explicit `foreach=True`
    (`clip_grad_norm_`, an optimizer) runs as on CUDA. With `defaults`, optimizers built with
    foreach/fused left at None also choose as they would for CUDA tensors (PyTorch's
    `_default_to_fused_or_foreach` runs unchanged); the plain trace keeps PyTorch's choice for
    the device it runs on."""
    import torch.optim.optimizer as optimizer_mod
    import torch.utils._foreach_utils as fu

    names = ("_get_foreach_kernels_supported_devices", "_get_fused_kernels_supported_devices")
    modules = (fu, optimizer_mod) if defaults else (fu,)
    saved = [(m, n, getattr(m, n)) for m in modules for n in names if hasattr(m, n)]
    for m, n, original in saved:
        setattr(m, n, lambda _o=original: [*_o(), "meta"])
    try:
        with fused_meta_kernels() if defaults else contextlib.nullcontext():
            yield
    finally:
        for m, n, original in saved:
            setattr(m, n, original)


@contextlib.contextmanager
def fused_meta_kernels() -> Iterator[None]:
    """Meta kernels, while tracing, for CUDA's fused optimizer updates that have none
    (`_fused_sgd_`, `_fused_adagrad_`, the `tensor_lr` overloads): each updates its tensors in
    place and allocates nothing, so on the tracer's device it does nothing. Without them an
    optimizer built with `fused=True` failed at its first step. Removed afterwards: the caller's
    own meta or FakeTensor code keeps PyTorch's refusal."""
    with torch.library._scoped_library("aten", "IMPL") as lib:
        for op in ("_fused_sgd_", "_fused_adagrad_", "_fused_adam_", "_fused_adamw_"):
            packet = getattr(torch.ops.aten, op, None)
            for overload in packet.overloads() if packet is not None else ():
                name = op if overload == "default" else f"{op}.{overload}"
                if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
                    lib.impl(name, _updates_in_place, "Meta")
        yield


def _updates_in_place(*args: Any, **kwargs: Any) -> None:
    return None


def _modules() -> dict[int, nn.Module]:
    # type(), not isinstance: isinstance reads `__class__`, which some module proxies warn on.
    return {id(o): o for o in gc.get_objects() if issubclass(type(o), nn.Module)}


def new_root_modules(before: set[int]) -> list[nn.Module]:
    """Modules created since `before` that are no other new module's child: the user's models."""
    new = [m for i, m in _modules().items() if i not in before]
    children = {id(c) for m in new for c in m.children()}
    return [m for m in new if id(m) not in children]


def _local(t: Any) -> Any:
    """A sharded (DTensor) parameter or gradient's local shard: what this rank stores."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def label_model_state(rec: Recorder, models: list[nn.Module]) -> None:
    """Parameters (tracked now if they predate the trace), buffers and gradients."""
    for m in models:
        for param in m.parameters():
            p = _local(param)
            addr = rec.track(p, "parameter")
            if addr is not None:
                rec.recategorize(addr, "parameter")
            grad = param.grad if param.grad is not None else p.grad
            if grad is not None and (g := rec.address(_local(grad))) is not None:
                rec.recategorize(g, "gradient")
        for b in m.buffers():
            addr = rec.track(b, "other")
            if addr is not None:
                rec.recategorize(addr, "other")


class Run:
    """What a traced run saw besides its events."""

    def __init__(self) -> None:
        self.models: list[nn.Module] = []
        self.hooks: PhaseHooks | None = None
        self.optimizer_steps = 0
        self.optimizers: set[str] = set()
        self.autocast_dtypes: set[str] = set()
        self.sdpa_backends: dict[str, int] = {}
        # Iterations the trace holds, where fewer than asked ran (a script that ended early).
        self.iterations: int | None = None


@contextlib.contextmanager
def tracing(
    profile: Profile, rec: Recorder, cuda_emulation: bool, flash: Flash | None = None
) -> Iterator[Run]:
    """The fake device around a traced program: autocast, optimizer defaults, the recorder,
    CUDA function swaps, phase hooks, `torch.cuda` and `"cuda"`."""
    from memtrace_trainer.symtrace import allocconf
    from memtrace_trainer.symtrace.autocast import Autocast
    from memtrace_trainer.symtrace.checkpointing import recompute_under_modes
    from memtrace_trainer.symtrace.emulation import CudaFunctions

    run = Run()
    functions = CudaFunctions(profile, flash) if cuda_emulation else contextlib.nullcontext()
    defaults = cuda_like_optimizer_defaults(defaults=cuda_emulation)
    run.hooks = PhaseHooks(rec)
    autocast = Autocast()
    resizes = storage_resizes(rec)
    with (
        cudnn_benchmark_kept(),
        allocconf.recorded(rec),
        parameters_kept(),
        autocast,
        defaults,
        rec,
        resizes,
        functions,
        run.hooks,
        CudaShim(profile, rec),
        DeviceMap(),
        recompute_under_modes(),
    ):
        rec.category = "other"
        yield run
        rec.finish()
    run.optimizer_steps = run.hooks.optimizer_steps
    run.optimizers = run.hooks.optimizers
    run.autocast_dtypes = autocast.engine.used
    if isinstance(functions, CudaFunctions):
        run.sdpa_backends = functions.backends


def _call(
    fn: Any, args: tuple[Any, ...], message: str, user_code: bool, kind: type = UserCodeError
) -> Any:
    """`fn(*args)`; an exception in the user's code is reported with their frames as `kind` (the
    tracer's own loop lets its model's errors through as they are)."""
    try:
        return fn(*args)
    except UserError:
        raise
    except (Exception, SystemExit) as e:  # sys.exit() in a step is the user's code ending early
        if not user_code:
            raise
        raise kind(message, e) from e


def run_steps(
    make: StepFn,
    steps: int,
    profile: Profile,
    rec: Recorder,
    cuda_emulation: bool,
    what: str,
    models: list[nn.Module] | None = None,
    flash: Flash | None = None,
) -> Run:
    """`make(meta)` under the recorder, then `step()` `steps` times after `iter:<n>` markers.
    `models`: the tracer's own loop passes the model it built (its step marks its own phases,
    and errors in the model are reported as the model's); a user's step makes its own."""
    user_step = models is None
    check_steps(steps)
    before = set(_modules()) if models is None else set()
    with named_as(what), tracing(profile, rec, cuda_emulation, flash) as run:
        if models is not None:
            label_model_state(rec, models)  # built before the trace: their storages come first
        # A user's step gets "cuda", as on a GPU: the tracer's device answers to it, and the
        # meta device stays PyTorch's own (no memory; see fakecuda.CudaShim).
        device = torch.device("cuda") if user_step else META
        step = _call(make, (device,), f"{what}: building the step raised", user_step)
        if not callable(step):
            got = type(step).__name__
            raise UserError(f"{what}: expected a zero-argument step() back, got {got}")
        run.models = new_root_modules(before) if models is None else models
        label_model_state(rec, run.models)
        for i in range(steps):
            rec.marker(markers.iteration(i))
            if user_step:
                rec.marker(markers.phase("forward"))
            rec.category = "activation"
            # The model failing as it trains, as an --entry's does: a search tells it from a
            # builder's error (BatchNorm refuses a batch of 1 here, and trains at 2).
            _call(step, (), f"{what}: step() raised in step {i + 1}", user_step,
                  EntryFailedError)  # fmt: skip
        label_model_state(rec, run.models)
    return run
