"""The CUDA device as the traced program sees it, on the tracer's device (meta).

`DeviceMap` makes `"cuda"` mean meta; `CudaShim` makes `torch.cuda` answer for the profile's GPU,
with streams and events that only carry ids, memory queries answered from the recorder, allocator
control calls recorded for memsim, and `torch.compile` traced eagerly (with a warning). Values
meta does not have, when the program reads them back, are stand-ins: 0/False from `.item()` and
`bool()` (numerics checks answered as for a healthy run), zeros for host copies.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from memtrace_trainer.errors import UserError
from memtrace_trainer.profile import Profile
from memtrace_trainer.symtrace import gpus
from memtrace_trainer.symtrace.gpus import on_device, one_gpu
from memtrace_trainer.symtrace.recorder import Recorder

META = torch.device("meta")


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
            one_gpu(args[1] if len(args) > 1 else kwargs.get("device"))
            return args[0].to(META)
        if func is torch.Tensor.to and _to_host(args, kwargs):
            return _zeros_on_host(args[0])

        if func in _HEALTH:
            out = func(*args, **kwargs)
            _tag(out, _HEALTH[func])
            return out
        if func in _PROPAGATE and hasattr(args[0], "_memtrace_value"):
            out = func(*args, **kwargs)
            value = args[0]._memtrace_value
            _tag(out, (not value) if func in _NEGATE else value)
            return out
        index = gpus.cuda_index(kwargs.get("device"))  # "cuda", "cuda:0", `device=0`
        if index is not None:
            gpus.check(index)
            kwargs = {**kwargs, "device": META}
        if func is torch.Tensor.to:
            one_gpu(args[1] if len(args) > 1 else None)  # `x.to(1)`, `x.to("cuda:1")`
            # `x.to(0)` (or a NumPy 0) names CUDA device 0; any other int is a dtype-free
            # positional elsewhere.
            args = tuple(
                META if _is_cuda(a) or (i == 1 and gpus.is_index(a)) else a
                for i, a in enumerate(args)
            )
        return func(*args, **kwargs)


T_ = torch.Tensor
# Checks of a run's numerics, answered as for a healthy run (stand-ins for values meta lacks).
_HEALTH = {
    torch.isfinite: True, T_.isfinite: True,
    torch.isnan: False, T_.isnan: False, torch.isinf: False, T_.isinf: False,
    torch.isneginf: False, torch.isposinf: False,
}  # fmt: skip
_PROPAGATE = {T_.all, T_.any, torch.all, torch.any, T_.logical_not, torch.logical_not,
              T_.__invert__, T_.detach, T_.clone}  # fmt: skip
_NEGATE = {T_.logical_not, torch.logical_not, T_.__invert__}


def _tag(out: Any, value: bool) -> None:
    if isinstance(out, torch.Tensor):
        out._memtrace_value = value  # type: ignore[attr-defined]


def _is_meta(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


def _to_host(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """`meta_tensor.to("cpu")`: a copy of values the tracer's device does not have."""
    if not _is_meta(args[0]):
        return False
    targets = [*args[1:], kwargs.get("device")]
    return any(
        (isinstance(a, str) and a.split(":")[0] == "cpu")
        or (isinstance(a, torch.device) and a.type == "cpu")
        for a in targets
    )


def _zeros_on_host(t: torch.Tensor) -> torch.Tensor:
    # Stand-in for values read back from the GPU (logging a loss): zeros, host memory only.
    return torch.zeros(t.shape, dtype=t.dtype, device="cpu")


def _item(original: Callable[..., Any]) -> Callable[..., Any]:
    def item(t: torch.Tensor) -> Any:
        if not _is_meta(t):
            return original(t)
        if t.numel() != 1:
            raise RuntimeError(f"a Tensor with {t.numel()} elements cannot be converted to Scalar")
        if t.dtype == torch.bool:
            return bool(getattr(t, "_memtrace_value", False))
        return 0.0 if t.is_floating_point() or t.is_complex() else 0

    return item


def _truth(original: Callable[..., Any]) -> Callable[..., Any]:
    def truth(t: torch.Tensor) -> bool:
        if not _is_meta(t):
            return bool(original(t))
        return bool(_item(lambda x: x)(t))

    return truth


def _host(original: Callable[..., Any], then: str | None = None) -> Callable[..., Any]:
    def read(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not _is_meta(t):
            return original(t, *args, **kwargs)
        host = _zeros_on_host(t)
        return getattr(host, then)() if then else host

    return read


def _value_stand_ins() -> list[tuple[Any, str, Any]]:
    """The patches that answer reads of values meta lacks with stand-ins."""
    T = torch.Tensor
    return [(T, "item", _item(T.item)), (T, "__bool__", _truth(T.__bool__)),
            (T, "cpu", _host(T.cpu)), (T, "tolist", _host(T.tolist, "tolist")),
            (T, "numpy", _host(T.numpy, "numpy"))]  # fmt: skip


@contextlib.contextmanager
def stand_ins() -> Iterator[None]:
    """Within: reads of values meta lacks (`item`, `bool`, `cpu`, `tolist`, `numpy`) get the
    trace's stand-ins, for a pass on meta outside the trace that must not fail where the trace
    does not (the features' forward: transformers reads an attention mask's values to choose its
    path, which failed there and nowhere else). Only those reads: the trace's answers to a run's
    health checks (`isfinite`, `isnan` and what is taken of them, `DeviceMap`) are not given
    here, so a branch on those may differ from the trace's."""
    patches = _value_stand_ins()
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    for mod, name, value in patches:
        setattr(mod, name, value)
    try:
        yield
    finally:
        for mod, name, value in reversed(saved):
            setattr(mod, name, value)


# `memory_summary()`'s table needs the allocator's statistics, which memsim computes after the
# trace; a program that prints it (for its log) gets this line instead of a failure.
_SUMMARY = (
    "memtrace: memory_summary() is not available while tracing (the caching allocator is "
    "replayed after the trace); memory_allocated() and max_memory_allocated() are"
)


def _memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    gpus.asked(device)
    return _SUMMARY


def _memory_stats(rec: Recorder) -> dict[str, int]:
    """`torch.cuda.memory_stats()` as far as the trace knows it: the allocated and active bytes
    (current and peak), which are the recorder's live bytes. Reserved bytes need the allocator,
    which memsim replays afterwards: they are absent, as for a device that has allocated nothing
    yet (and `memory_reserved()` says why)."""
    out: dict[str, int] = {}
    for kind in ("allocated_bytes", "active_bytes", "requested_bytes"):
        out[f"{kind}.all.current"] = rec.live_bytes
        out[f"{kind}.all.peak"] = rec.peak_bytes
    return dict(sorted(out.items()))


def _is_file(f: Any) -> bool:
    """Whether `f` is an open file of the file system (an `io.BytesIO` is not)."""
    try:
        f.fileno()
    except Exception:  # io.UnsupportedOperation, or no such method
        return False
    return True


def _save_skipped(original: Callable[..., Any]) -> Callable[..., Any]:
    """`torch.save` to a file skipped (said): a checkpoint of the trace's tensors holds no
    values, and written, it replaced the user's real file at that path. In-memory buffers are
    the program's own business and are written."""

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        from memtrace_trainer.notes import warn

        named = isinstance(f, str | bytes) or hasattr(f, "__fspath__")
        if not named and not _is_file(f):
            return original(obj, f, *args, **kwargs)
        where = f if named else getattr(f, "name", type(f).__name__)
        warn(f"torch.save to {where} skipped while tracing: the trace's tensors hold no values, "
             "and a real checkpoint there would have been overwritten")  # fmt: skip
        return None

    return save


def _on_cuda(location: Any) -> bool:
    if isinstance(location, dict):
        return any(_on_cuda(v) for v in location.values())
    if isinstance(location, str | torch.device):
        return torch.device(location).type == "cuda"
    return False


def _to_cuda(value: Any) -> Any:
    """Every tensor in a loaded checkpoint moved to "cuda", which the tracer's device answers:
    the checkpoint's device memory, held while the program keeps it."""
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.to("cuda"), value)


def _load_onto_the_device(original: Callable[..., Any]) -> Callable[..., Any]:
    """`torch.load(..., map_location="cuda")` (or of a checkpoint saved on a GPU, without a
    map_location) read through the host: PyTorch's CUDA deserializer needs a driver."""

    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if map_location is None:
            try:
                return original(f, None, *args, **kwargs)
            except RuntimeError as e:
                if "NVIDIA driver" not in str(e) and "CUDA" not in str(e):
                    raise
                if hasattr(f, "seek"):
                    f.seek(0)
                return _to_cuda(original(f, "cpu", *args, **kwargs))
        if _on_cuda(map_location):
            return _to_cuda(original(f, "cpu", *args, **kwargs))
        return original(f, map_location, *args, **kwargs)

    return load


class _Properties:
    """What `torch.cuda.get_device_properties` returns, for the profile's GPU."""

    def __init__(self, profile: Profile) -> None:
        self.name = profile.gpu
        self.major, self.minor = profile.compute_capability
        self.total_memory = profile.total_memory
        # nn.DataParallel divides by it (a 0 was a ZeroDivisionError in the user's line).
        self.multi_processor_count = profile.sm_count

    def __repr__(self) -> str:
        return f"_CudaDeviceProperties(name={self.name!r}, total_memory={self.total_memory})"


class _Stream:
    """`torch.cuda.Stream` on the tracer's device: an id the trace's allocations carry (memsim
    keeps a pool per stream); waits and synchronisation do nothing."""

    _next_id = 1

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        if device is not None:  # `torch.cuda.Stream(device=1)`
            gpus.asked(device)
        _Stream._next_id += 1
        self.stream_id = _Stream._next_id
        self.device = META
        # What torch.Stream carries, for code that passes them on (FSDP's stream records).
        self.device_index = 0
        self.device_type = 1  # c10::DeviceType::CUDA

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

    def _free(self) -> int:
        """What `mem_get_info` says is free: the device less what the job holds, its tensors
        and what its process holds outside the allocator (the context, and the libraries it
        has loaded so far), as on a GPU. A program sizing a buffer to a share of it was given
        the context's and cuBLAS's 1.4 GiB too. The allocator's cache is not known until the
        replay, so this errs high by it."""
        from memtrace_trainer.symtrace.emulation import LibrariesUsed

        p = self.profile
        held = p.context_bytes
        for libs in (h for h in self.rec.hooks if isinstance(h, LibrariesUsed)):
            held += p.cublas_bytes * libs.gemm + p.cudnn_bytes * libs.conv
        return max(p.total_memory - held - self.rec.live_bytes, 0)

    def _patch(self, mod: Any, name: str, value: Any) -> None:
        self._saved.append((mod, name, getattr(mod, name, None)))
        setattr(mod, name, value)

    def __enter__(self) -> CudaShim:
        p, rec, c = self.profile, self.rec, torch.cuda
        props = _Properties(p)
        # Stream ids count from the trace's start: the same program traces to the same events,
        # however many traces this process made before.
        _Stream._next_id = 1
        answers: dict[str, Any] = {
            "is_available": lambda: True,
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "set_device": gpus.set_device,
            "_exchange_device": gpus.exchange_device,  # `with torch.cuda.device(i)`
            "_maybe_exchange_device": gpus.exchange_device,
            "is_bf16_supported": lambda including_emulation=True: p.compute_capability >= (8, 0),
            "empty_cache": lambda: rec.control("empty_cache"),
            "manual_seed": lambda seed: None,
            "manual_seed_all": lambda seed: None,
            "Stream": _Stream,
            "Event": _Event,
            "stream": self._stream_context,
        }
        # What takes a device answers for the one GPU, and refuses another as PyTorch would.
        answers |= {name: on_device(value) for name, value in {
            "synchronize": lambda: None,
            "get_device_name": lambda: p.gpu,
            "get_device_capability": lambda: p.compute_capability,
            "get_device_properties": lambda: props,
            "mem_get_info": lambda: (self._free(), p.total_memory),
            "memory_allocated": lambda: rec.live_bytes,
            "max_memory_allocated": lambda: rec.peak_bytes,
            "reset_peak_memory_stats": lambda: rec.control("reset_peak_stats"),
            "current_stream": lambda: self._current,
            "default_stream": lambda: _DEFAULT_STREAM,
            "memory_stats": lambda: _memory_stats(rec),
        }.items()}  # fmt: skip
        answers["memory_summary"] = _memory_summary
        for name, value in answers.items():
            self._patch(c, name, value)
        # DataLoader's pinning thread asks the accelerator which device it is on.
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None:
            for name, value in (("current_device_index", lambda: 0),
                                ("set_device_index", gpus.set_device_index),
                                ("is_available", lambda: True),
                                ("device_count", lambda: 1)):  # fmt: skip
                if hasattr(accelerator, name):
                    self._patch(accelerator, name, value)
        # memory_reserved needs the allocator in this process: memsim replays it afterwards.
        for name in ("memory_reserved", "max_memory_reserved"):
            self._patch(c, name, _reserved_unavailable(name))
        # Optimizers ask the accelerator whether a CUDA graph is being captured; none is.
        self._patch(
            torch.optim.Optimizer, "_accelerator_graph_capture_health_check", lambda self: None
        )
        self._patch(torch.Tensor, "record_stream", lambda t, stream: self._record_stream(t, stream))
        # Pinned host memory needs a driver; DataLoader(pin_memory=True) pins in its own thread,
        # out of reach of the function mode, so the method itself is the identity.
        self._patch(torch.Tensor, "pin_memory", lambda t, *a, **k: t)
        self._patch(torch.Tensor, "is_pinned", lambda t, *a, **k: False)
        # One device: DataParallel's replicas are the module itself (its device check compared
        # the tracer's device with cuda:0 and refused).
        self._patch(nn.DataParallel, "forward", lambda dp, *a, **k: dp.module(*a, **k))
        # A checkpoint of the trace's tensors holds no values: written, it replaced the user's
        # real file at that path with an empty one.
        self._patch(torch, "save", _save_skipped(torch.save))
        self._patch(torch, "load", _load_onto_the_device(torch.load))
        # Values the tracer's device does not have, read back by the program (docs: stand-ins).
        for mod, name, value in _value_stand_ins():
            self._patch(mod, name, value)
        self._patch(torch, "compile", _eager_compile)
        self._patch(nn.Module, "compile", lambda module, *a, **k: _eager_compile(module))
        self._patch(c.memory, "_record_memory_history", lambda *a, **k: None)
        self._patch(c.memory, "_dump_snapshot", lambda *a, **k: None)
        # transformers decides whether a batch is packed (several sequences per row) by reading
        # position_ids' values when no attention mask and no cache are given (gradient
        # checkpointing turns the cache off); meta has no values, and the bool stand-in would
        # call every batch packed and build a 4-D mask. A traced batch is taken as unpacked,
        # which is what position_ids=None (arange per row) means.
        # `with torch.device(...)`: "cuda" is the tracer's device; "meta" is PyTorch's meta
        # device proper, whose tensors hold no memory (a model built there and materialised
        # later with `to_empty`, as FSDP2 recipes initialise before sharding).
        from torch.utils._device import DeviceContext

        self._patch(DeviceContext, "__torch_function__", _device_context(rec))
        # A user's step may import transformers only once traced: the patch then follows the
        # import.
        self._hook = _AfterImport("transformers.masking_utils", self._unpacked)
        if "transformers.masking_utils" in sys.modules:
            self._unpacked(sys.modules["transformers.masking_utils"])
        else:
            sys.meta_path.insert(0, self._hook)
        return self

    def _unpacked(self, masking: Any) -> None:
        if hasattr(masking, "find_packed_sequence_indices"):
            self._patch(masking, "find_packed_sequence_indices", lambda position_ids: None)

    def __exit__(self, *exc: object) -> None:
        if self._hook in sys.meta_path:
            sys.meta_path.remove(self._hook)
        for mod, name, value in reversed(self._saved):
            setattr(mod, name, value)
        self._saved.clear()


def _device_context(rec: Recorder) -> Callable[..., Any]:
    from torch.utils._device import _device_constructors

    def torch_function(
        self: Any, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        one_gpu(self.device)
        if func in _device_constructors() and kwargs.get("device") is None:
            kwargs["device"] = META if self.device.type == "cuda" else self.device
        if self.device.type != "meta":
            return func(*args, **kwargs)
        rec.memory_free += 1
        try:
            return func(*args, **kwargs)
        finally:
            rec.memory_free -= 1

    return torch_function


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` once the module `name` is imported (by the finders after this one)."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        others = [f for f in sys.meta_path if f is not self and hasattr(f, "find_spec")]
        for finder in others:
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Then(spec.loader, self.then)
                return spec
        return None


class _Then(importlib.abc.Loader):
    def __init__(self, loader: Any, then: Callable[[Any], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.then(module)


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
        gpus.asked(device)  # another GPU is refused first, as by every query
        import traceback

        from memtrace_trainer.errors import _library_dirs

        # The caller's line, as every error in the user's code names it.
        libs = _library_dirs()
        frames = [f for f in traceback.extract_stack()[:-1]
                  if not any(f.filename.startswith(d) for d in libs)]  # fmt: skip
        at = f" (at {frames[-1].filename}:{frames[-1].lineno}: {frames[-1].line})" if frames else ""
        raise UserError(
            f"torch.cuda.{name}() while tracing{at}: reserved memory comes from replaying the "
            "trace through memsim's allocator model after the step, not from inside it; use "
            "memory_allocated()/max_memory_allocated() in the step, or read the estimate's "
            "reserved peak"
        )

    return answer
