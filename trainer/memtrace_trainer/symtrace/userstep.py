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
import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from memtrace_trainer.errors import UserCodeError, UserError
from memtrace_trainer.profile import Profile
from memtrace_trainer.symtrace.recorder import Recorder

META = torch.device("meta")
StepFn = Callable[[torch.device], Callable[[], Any]]


def load_step(spec: str, with_batch: bool = False) -> Any:
    """`package.module:function`, checked to take the device (and, `with_batch`, the batch size
    as a second argument: what `max-batch --step` searches over)."""
    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name:
        raise UserError(f"--step {spec!r}: expected package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(f"--step {spec!r}: cannot import {module_name!r} ({e})") from None
    except Exception as e:  # the user's module raised while importing
        raise UserCodeError(f"--step {spec!r}: importing {module_name} raised", e) from e
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UserError(f"--step {spec!r}: {module_name} has no function {func_name!r}")
    try:
        if with_batch:
            inspect.signature(func).bind(META, 1)
        else:
            inspect.signature(func).bind(META)
    except TypeError:
        takes = (
            "two arguments, the device and the batch size,"
            if with_batch
            else "one argument, the device,"
        )
        raise UserError(
            f"--step {spec!r}: {func_name} must take {takes} and return a zero-argument step()"
        ) from None
    except ValueError:
        pass  # builtins without a signature: let the call say
    return func  # type: ignore[no-any-return]


def _is_cuda(v: Any) -> bool:
    if isinstance(v, torch.device):
        return v.type == "cuda"
    return isinstance(v, str) and v.split(":", 1)[0] == "cuda"


class DeviceMap(TorchFunctionMode):
    """`"cuda"` in the user's code is the tracer's device."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0].to(META)
        if func is torch.Tensor.pin_memory:
            return args[0]

        if _is_cuda(kwargs.get("device")):
            kwargs = {**kwargs, "device": META}
        if func is torch.Tensor.to:
            # `x.to(0)` names CUDA device 0; any other int is a dtype-free positional elsewhere.
            args = tuple(
                META if _is_cuda(a) or (i == 1 and type(a) is int) else a
                for i, a in enumerate(args)
            )
        return func(*args, **kwargs)


class _Properties:
    """What `torch.cuda.get_device_properties` returns, for the profile's GPU."""

    def __init__(self, profile: Profile) -> None:
        self.name = profile.gpu
        self.major, self.minor = profile.compute_capability
        self.total_memory = profile.total_memory
        self.multi_processor_count = 0  # not in the profile; code that needs it gets 0

    def __repr__(self) -> str:
        return f"_CudaDeviceProperties(name={self.name!r}, total_memory={self.total_memory})"


class _Stream:
    """`torch.cuda.Stream` on the tracer's device: an id the trace's allocations carry (memsim
    keeps a pool per stream); waits and synchronisation do nothing."""

    _next_id = 1

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        _Stream._next_id += 1
        self.stream_id = _Stream._next_id
        self.device = META

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _Event:
        return event or _Event()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return self.stream_id


_DEFAULT_STREAM = _Stream()
_DEFAULT_STREAM.stream_id = 0


class _Event:
    """`torch.cuda.Event`: no timing on the tracer's device (elapsed time is 0)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Any) -> float:
        return 0.0


class CudaShim:
    """`torch.cuda` as the profile's GPU would answer, for the duration of a trace."""

    def __init__(self, profile: Profile, rec: Recorder) -> None:
        self.profile, self.rec = profile, rec
        self._saved: list[tuple[Any, str, Any]] = []
        self._current = _DEFAULT_STREAM

    def _record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        # Meta has no streams (the real method rejects the stand-in); memsim replays the record.
        addr = self.rec.address(tensor)
        if addr is not None:
            self.rec.control("record_stream", addr=addr, stream=stream.stream_id)

    @contextlib.contextmanager
    def _stream_context(self, stream: Any) -> Iterator[None]:
        before = self._current
        if stream is not None:
            self._current = stream
            self.rec.stream = stream.stream_id
        try:
            yield
        finally:
            self._current = before
            self.rec.stream = before.stream_id

    def _patch(self, mod: Any, name: str, value: Any) -> None:
        self._saved.append((mod, name, getattr(mod, name, None)))
        setattr(mod, name, value)

    def __enter__(self) -> CudaShim:
        p, rec, c = self.profile, self.rec, torch.cuda
        props = _Properties(p)
        answers: dict[str, Any] = {
            "is_available": lambda: True,
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "set_device": lambda device: None,
            "synchronize": lambda device=None: None,
            "get_device_name": lambda device=None: p.gpu,
            "get_device_capability": lambda device=None: p.compute_capability,
            "get_device_properties": lambda device=None: props,
            "is_bf16_supported": lambda including_emulation=True: p.compute_capability >= (8, 0),
            "mem_get_info": lambda device=None: (p.total_memory - rec.live_bytes, p.total_memory),
            "memory_allocated": lambda device=None: rec.live_bytes,
            "max_memory_allocated": lambda device=None: rec.peak_bytes,
            "empty_cache": lambda: rec.control("empty_cache"),
            "reset_peak_memory_stats": lambda device=None: rec.control("reset_peak_stats"),
            "manual_seed": lambda seed: None,
            "manual_seed_all": lambda seed: None,
            "Stream": _Stream,
            "Event": _Event,
            "stream": self._stream_context,
            "current_stream": lambda device=None: self._current,
            "default_stream": lambda device=None: _DEFAULT_STREAM,
        }
        for name, value in answers.items():
            self._patch(c, name, value)
        # memory_reserved needs the allocator in this process: memsim replays it afterwards.
        for name in ("memory_reserved", "max_memory_reserved"):
            self._patch(c, name, _reserved_unavailable(name))
        # Optimizers ask the accelerator whether a CUDA graph is being captured; none is.
        self._patch(
            torch.optim.Optimizer, "_accelerator_graph_capture_health_check", lambda self: None
        )
        self._patch(torch.Tensor, "record_stream", lambda t, stream: self._record_stream(t, stream))
        self._patch(torch, "compile", _eager_compile)
        self._patch(nn.Module, "compile", lambda module, *a, **k: _eager_compile(module))
        self._patch(c.memory, "_record_memory_history", lambda *a, **k: None)
        self._patch(c.memory, "_dump_snapshot", lambda *a, **k: None)
        return self

    def __exit__(self, *exc: object) -> None:
        for mod, name, value in reversed(self._saved):
            setattr(mod, name, value)
        self._saved.clear()


def _eager_compile(model: Any = None, **kwargs: Any) -> Any:
    """`torch.compile` while tracing: the region runs eagerly, and the user is told what that
    does to the estimate."""
    from memtrace_trainer.notes import warn

    warn(
        "torch.compile: compiled regions are traced eagerly; the estimate is eager PyTorch's "
        "(Inductor's fused kernels usually hold fewer intermediates, and CUDA graphs keep a "
        "private pool that is not modelled)"
    )
    if model is None:  # used as @torch.compile(...) with arguments
        return lambda fn: fn
    return model


def _reserved_unavailable(name: str) -> Callable[..., int]:
    def answer(device: Any = None) -> int:
        raise UserError(
            f"torch.cuda.{name}() while tracing: reserved memory comes from replaying the trace "
            "through memsim's allocator model after the step, not from inside it; use "
            "memory_allocated()/max_memory_allocated() in the step, or read the estimate's "
            "reserved peak"
        )

    return answer


class PhaseHooks:
    """Phase markers and categories from PyTorch's own entry points: backward and optimizer
    steps, wherever the user's code calls them."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.optimizer_steps = 0
        self.optimizers: set[str] = set()
        self._handles: list[Any] = []
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> PhaseHooks:
        import torch.optim.optimizer as opt

        rec = self.rec

        def pre(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            self.optimizers.add(type(optimizer).__name__.lower())
            rec.marker("phase:optimizer")
            rec.category = "other"
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        addr = rec.address(p.grad)
                        if addr is not None:
                            rec.recategorize(addr, "gradient")

        def post(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            self.optimizer_steps += 1
            for state in optimizer.state.values():
                for value in state.values():
                    addr = rec.address(value) if isinstance(value, torch.Tensor) else None
                    if addr is not None:
                        rec.recategorize(addr, "optimizer_state")

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
            rec.marker("phase:backward")
            before, rec.category = rec.category, "activation"
            try:
                return original(*args, **kwargs)
            finally:
                rec.category = before

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
def cuda_like_optimizer_defaults() -> Iterator[None]:
    """Optimizers built with foreach/fused left at None choose as they would for CUDA tensors:
    PyTorch's `_default_to_fused_or_foreach` runs unchanged, with meta among the devices that
    have foreach and fused kernels."""
    import torch.optim.optimizer as optimizer_mod
    import torch.utils._foreach_utils as fu

    names = ("_get_foreach_kernels_supported_devices", "_get_fused_kernels_supported_devices")
    saved = [(m, n, getattr(m, n)) for m in (fu, optimizer_mod) for n in names if hasattr(m, n)]
    for m, n, original in saved:
        setattr(m, n, lambda _o=original: [*_o(), "meta"])
    try:
        yield
    finally:
        for m, n, original in saved:
            setattr(m, n, original)


def _modules() -> dict[int, nn.Module]:
    # type(), not isinstance: isinstance reads `__class__`, which some module proxies warn on.
    return {id(o): o for o in gc.get_objects() if issubclass(type(o), nn.Module)}


def new_root_modules(before: set[int]) -> list[nn.Module]:
    """Modules created since `before` that are no other new module's child: the user's models."""
    new = [m for i, m in _modules().items() if i not in before]
    children = {id(c) for m in new for c in m.children()}
    return [m for m in new if id(m) not in children]


def label_model_state(rec: Recorder, models: list[nn.Module]) -> None:
    """Parameters (tracked now if they predate the trace), buffers and gradients."""
    for m in models:
        for p in m.parameters():
            addr = rec.track(p, "parameter")
            if addr is not None:
                rec.recategorize(addr, "parameter")
            if p.grad is not None and (g := rec.address(p.grad)) is not None:
                rec.recategorize(g, "gradient")
        for b in m.buffers():
            addr = rec.track(b, "other")
            if addr is not None:
                rec.recategorize(addr, "other")


class Run:
    """What a traced run saw besides its events."""

    def __init__(self) -> None:
        self.models: list[nn.Module] = []
        self.optimizer_steps = 0
        self.optimizers: set[str] = set()
        self.autocast_dtypes: set[str] = set()
        self.sdpa_backends: dict[str, int] = {}


def run_steps(
    make: StepFn,
    steps: int,
    profile: Profile,
    rec: Recorder,
    cuda_emulation: bool,
    what: str,
    models: list[nn.Module] | None = None,
) -> Run:
    """`make(meta)` under the recorder, then `step()` `steps` times after `iter:<n>` markers.
    `models`: the tracer's own loop passes the model it built (its step marks its own phases,
    and errors in the model are reported as the model's); a user's step makes its own."""
    user_step = models is None
    from memtrace_trainer.symtrace.autocast import Autocast
    from memtrace_trainer.symtrace.emulation import CudaFunctions

    if steps < 1:
        raise UserError(f"--steps {steps}: expected at least 1")
    run = Run()
    functions = CudaFunctions(profile) if cuda_emulation else contextlib.nullcontext()
    defaults = cuda_like_optimizer_defaults() if cuda_emulation else contextlib.nullcontext()
    hooks = PhaseHooks(rec)
    before = set(_modules()) if models is None else set()
    autocast = Autocast()
    with autocast, defaults, rec, functions, hooks, CudaShim(profile, rec), DeviceMap():
        rec.category = "other"
        if models is not None:
            label_model_state(rec, models)  # built before the trace: their storages come first
        try:
            step = make(META)
        except UserError:
            raise
        except Exception as e:
            if not user_step:
                raise
            raise UserCodeError(f"{what}: building the step raised", e) from e
        if not callable(step):
            got = type(step).__name__
            raise UserError(f"{what}: expected a zero-argument step() back, got {got}")
        if models is None:
            run.models = new_root_modules(before)
            label_model_state(rec, run.models)
        else:
            run.models = models
        for i in range(steps):
            rec.marker(f"iter:{i}")
            if user_step:
                rec.marker("phase:forward")
            rec.category = "activation"
            try:
                step()
            except UserError:
                raise
            except Exception as e:
                if not user_step:
                    raise
                raise UserCodeError(f"{what}: step() raised in step {i + 1}", e) from e
        label_model_state(rec, run.models)
        rec.finish()
    run.optimizer_steps = hooks.optimizer_steps
    run.optimizers = hooks.optimizers
    run.autocast_dtypes = autocast.engine.used
    if isinstance(functions, CudaFunctions):
        run.sdpa_backends = functions.backends
    return run
