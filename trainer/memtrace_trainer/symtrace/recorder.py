"""Records every storage a training step allocates on meta, and the moment each one dies.

A dispatch mode sees each op's outputs; a storage seen for the first time is an allocation, and a
weakref finalizer on its (preserved) Python object reports the free when the last tensor or
autograd-saved reference to it goes away. Views share their base's storage, so they never count
twice.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

from memtrace_trainer.errors import UserError
from memtrace_trainer.symtrace import opcache

Event = dict[str, Any]
# Called around each op: (recorder, op, args, kwargs, outputs or None before the op runs).
OpHook = Callable[["Recorder", Any, tuple[Any, ...], dict[str, Any], Any], None]


aten = torch.ops.aten
# Backward formulas (FunctionsManual.cpp: gather, max/min with indices, index, ...) fill a fresh
# zeros tensor in place (`new_zeros(...).scatter_add_(...)`), but take the out-of-place form
# when a tensor is "subclass-like", which every tensor is while a dispatch mode is active. The
# recorder is one, so it sees `scatter_add` and a second full-size block; on a GPU the result is
# the zeros block itself. Only the zeros-then-fill pattern inside a backward node is folded.
_COMPOSITE: dict[Any, bool] = {}
_ZEROS = {aten.new_zeros.default, aten.zeros_like.default, aten.zeros.default}
_INPLACE_ON_GPU = {
    aten.scatter_add.default, aten.scatter.src, aten.scatter.value, aten.index_put.default,
    aten.index_add.default, aten.masked_scatter.default,
}  # fmt: skip


# Called with each marker's text by every recorder (`listen_markers`): a baseline that runs
# beside a trace (PyTorch's MemTracker) follows the trace's iterations through them.
_MARKER_LISTENERS: list[Callable[[str], None]] = []


@contextlib.contextmanager
def listen_markers(fn: Callable[[str], None]) -> Iterator[None]:
    _MARKER_LISTENERS.append(fn)
    try:
        yield
    finally:
        _MARKER_LISTENERS.remove(fn)


class Recorder(TorchDispatchMode):
    """Collects allocator-level events. Categories can be corrected before writing (a gradient
    is only known to be one once autograd has stored it in `.grad`)."""

    def __init__(self, hooks: list[OpHook] | None = None) -> None:
        super().__init__()
        self.events: list[Event] = []
        self.hooks = hooks or []
        self.category = "other"
        # The job's allocator settings for the trace header's `env` (symtrace/allocconf.py).
        self.allocator_env: dict[str, str] = {}
        self.active = True
        # Above zero while the program works on PyTorch's own meta device (`with
        # torch.device("meta")`): storages made then hold no memory, now or later.
        self.memory_free = 0
        # Whether any storage was marked memory-free: until one is, no op needs the check.
        self._memory_free_seen = False
        self._next_id = 1
        self._alloc_index: dict[int, int] = {}
        self._holders: dict[int, int] = {}
        self._token = object()
        self._zeros: int | None = None  # address of the latest zero-filled temporary
        # What `torch.cuda.memory_allocated()` and `max_memory_allocated()` answer while tracing
        # (requested bytes; the allocator's rounding is memsim's).
        self.live_bytes = 0
        self.peak_bytes = 0
        # The stream the traced program allocates on (`torch.cuda.stream(s)`); 0 is the default.
        self.stream = 0

    # --- events -------------------------------------------------------------------------------
    def _emit(self, event: Event) -> None:
        event["ts_ns"] = len(self.events)
        event["device"] = 0
        self.events.append(event)

    def marker(self, text: str) -> None:
        for listener in _MARKER_LISTENERS:
            listener(text)
        self._emit({"kind": "marker", "text": text})

    def alloc(self, size: int, category: str) -> int:
        addr = self._next_id
        self._next_id += 1
        self._alloc_index[addr] = len(self.events)
        event = {"kind": "alloc", "addr": addr, "size": size, "category": category}
        if self.stream:
            event["stream"] = self.stream
        self._emit(event)
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return addr

    def free(self, addr: int, size: int) -> None:
        if self.active:
            event = {"kind": "free", "addr": addr, "size": size}
            stream = self.events[self._alloc_index[addr]].get("stream", 0)
            if stream:
                event["stream"] = stream
            self._emit(event)
            self.live_bytes -= size

    def control(self, op: str, **fields: Any) -> None:
        """An allocator control call of the traced program (`empty_cache`, `reset_peak_stats`,
        `record_stream` with `addr` and `stream`)."""
        if self.active:
            self._emit({"kind": "control", "op": op, **fields})
            if op == "reset_peak_stats":
                self.peak_bytes = self.live_bytes

    def recategorize(self, addr: int, category: str) -> None:
        self.events[self._alloc_index[addr]]["category"] = category

    # --- storages -----------------------------------------------------------------------------
    def track(self, tensor: torch.Tensor, category: str | None = None) -> int | None:
        """The synthetic address of a meta tensor's storage, recording its allocation when new.
        A wrapper subclass (a DTensor) owns no device memory of its own: its inner tensors (the
        local shard) are what is allocated, and they are tracked instead."""
        if is_traceable_wrapper_subclass(tensor):
            addrs = [self.track(inner, category) for inner in _inner(tensor)]
            return next((a for a in addrs if a is not None), None)
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "meta":
            return None
        storage = tensor.untyped_storage()
        known = getattr(storage, "_memtrace", None)
        if known is not None and known[0] is self._token:
            return known[1]
        size = storage.nbytes()
        if size == 0:
            return None
        if self.memory_free:
            storage._memtrace = (self._token, None, [False], 0)  # type: ignore[attr-defined]
            self._memory_free_seen = True
            return None
        addr = self.alloc(size, category or self.category)
        self._hold(storage, addr, size)
        return addr

    def _hold(self, storage: Any, addr: int, size: int) -> None:
        # A block is freed when the last storage standing for it dies (see `alias`), or when
        # the storage is resized away (`resized`); `held` says which came first.
        held = [True]
        storage._memtrace = (self._token, addr, held, size)  # type: ignore[attr-defined]
        self._holders[addr] = self._holders.get(addr, 0) + 1
        weakref.finalize(storage, self._release_held, held, addr, size)

    def _release_held(self, held: list[bool], addr: int, size: int) -> None:
        if held[0]:
            held[0] = False
            self._release(addr, size)

    def resized(self, storage: Any, new_size: int) -> None:
        """`UntypedStorage.resize_` on a meta storage (FSDP frees and refills its unsharded
        parameters this way, `resize_(0)` and `resize_(n)`): the old block is given back and a
        new one of `new_size` bytes taken, as the caching allocator sees a free and a malloc."""
        known = getattr(storage, "_memtrace", None)
        if known is not None and known[0] is self._token:
            _, addr, held, size = known
            if addr is None:  # a storage of the meta device proper stays without memory
                return
            storage._memtrace = None
            self._release_held(held, addr, size)
        if new_size > 0 and self.active:
            self._hold(storage, self.alloc(new_size, self.category), new_size)

    def _release(self, addr: int, size: int) -> None:
        self._holders[addr] -= 1
        if self._holders[addr] == 0:
            del self._holders[addr]
            self.free(addr, size)

    def alias(self, out: torch.Tensor, base: torch.Tensor) -> bool:
        """Record `out` as living in `base`'s block, as the in-place form of the op that made it
        would have left it (see `_INPLACE_ON_GPU`). False when either is not a fresh meta
        tensor of the same size."""
        addr = self.address(base)
        if addr is None or not isinstance(out, torch.Tensor) or out.device.type != "meta":
            return False
        storage = out.untyped_storage()
        if getattr(storage, "_memtrace", None) is not None:
            return False
        if storage.nbytes() != base.untyped_storage().nbytes():
            return False
        self._hold(storage, addr, storage.nbytes())
        return True

    def holds_no_memory(self, tensor: Any) -> bool:
        """Whether `tensor` lives on the meta device proper (made under `memory_free`)."""
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "meta":
            return False
        if is_traceable_wrapper_subclass(tensor):
            return False
        known = getattr(tensor.untyped_storage(), "_memtrace", None)
        return known is not None and known[0] is self._token and known[1] is None

    def address(self, tensor: torch.Tensor) -> int | None:
        """The address of an already tracked tensor, without recording anything."""
        if is_traceable_wrapper_subclass(tensor):
            return next((a for a in map(self.address, _inner(tensor)) if a is not None), None)
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "meta":
            return None
        known = getattr(tensor.untyped_storage(), "_memtrace", None)
        return known[1] if known is not None and known[0] is self._token else None

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        composite = _COMPOSITE.get(func)
        if composite is None:
            composite = _COMPOSITE[func] = decomposes_on_cuda(func.name())
        if composite:
            # Under inference_mode autograd's keys are skipped and composite ops (linear,
            # matmul, einsum) reach this mode whole; on a GPU they run as their parts, which
            # take the workspaces and intermediates. Run the parts here, under this mode.
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        # The hooks say what CUDA does beside an op (a library's workspace, loading it): an op
        # on the CPU's tensors takes none of it (a CPU matmul charged cuBLAS to a job that never
        # touched the GPU). A collective is noted whatever its tensors: object collectives
        # gather CPU tensors under the fake process group, and run on the GPU under NCCL.
        hooks = self.hooks if _on_device(args) or is_collective(func) else ()
        for hook in hooks:
            hook(self, func, args, kwargs, None)
        out = opcache.call(func, args, kwargs)
        folded = (
            func in _INPLACE_ON_GPU
            and torch._C._current_autograd_node() is not None
            and self._zeros is not None
            and self.address(args[0]) == self._zeros
            and self.alias(out, args[0])
        )
        if not folded:
            # An op on tensors of the meta device proper makes more of them (PyTorch keeps an
            # op's inputs and outputs on one device), unless it names its output's device
            # (`to_empty`'s `empty_like(..., device=)`).
            derived = (
                self._memory_free_seen
                and "device" not in kwargs
                and any(self.holds_no_memory(t) for t in tree_flatten(args)[0])
            )
            self.memory_free += derived
            try:
                for value in tree_flatten(out)[0]:
                    if isinstance(value, torch.Tensor):
                        _strided(func, value)
                        self.track(value)
            finally:
                self.memory_free -= derived
        self._zeros = self.address(out) if func in _ZEROS else None
        for hook in hooks:
            hook(self, func, args, kwargs, out)
        return out

    @contextlib.contextmanager
    def categorized(self, category: str) -> Iterator[None]:
        """Within: what is allocated is of `category`."""
        before, self.category = self.category, category
        try:
            yield
        finally:
            self.category = before

    def finish(self) -> None:
        """Stop recording: later frees belong to the tracer's teardown, not the step."""
        self.active = False


@contextlib.contextmanager
def storage_resizes(rec: Recorder) -> Iterator[None]:
    """`UntypedStorage.resize_` of meta storages reported to `rec` (it dispatches no op)."""
    original = torch.UntypedStorage.resize_

    def resize_(storage: Any, size: int) -> Any:
        out = original(storage, size)
        if storage.device.type == "meta":
            rec.resized(storage, int(size))
        return out

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]


# The op namespaces of collectives (c10d's, and the functional ones).
COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


def is_collective(func: Any) -> bool:
    """Whether an op is a collective (of c10d's namespaces)."""
    return getattr(func, "namespace", None) in COLLECTIVE_NAMESPACES


# Kernels that take a CUDA tensor's call before a CompositeImplicitAutograd one: the dispatcher
# uses the composite for a backend only when neither is registered (PyTorch's
# computeDispatchTableEntry).
_CUDA_KERNELS = ("CUDA", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


def decomposes_on_cuda(name: str) -> bool:
    """Whether op `name` runs on a CUDA tensor as its CompositeImplicitAutograd parts. An op
    with a kernel of its own for CUDA runs whole there: `silu_backward` has a composite for
    other backends, and running its parts recorded seven full-size temporaries where CUDA's
    fused kernel writes one gradient."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return has(name, "CompositeImplicitAutograd") and not any(has(name, k) for k in _CUDA_KERNELS)


def _on_device(args: tuple[Any, ...]) -> bool:
    """Whether an op's arguments hold a tensor of the tracer's device (meta). Aten ops take
    tensors as arguments or in a list of them (`cat`), never deeper: one level is looked at,
    cheaper than `tree_flatten` on every op."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.device.type == "meta":
                return True
        elif isinstance(a, list | tuple):
            if any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in a):
                return True
    return False


def _strided(func: Any, value: torch.Tensor) -> None:
    """Refuse a sparse tensor on the tracer's device, in words that name the op and where such
    tensors come from: its memory is in inner tensors that are not tracked, and PyTorch's
    NotImplementedError ("Cannot access storage of SparseTensorImpl") said neither."""
    if value.layout is torch.strided or value.device.type != "meta":
        return
    raise UserError(
        f"{func} made a {value.layout} tensor: sparse tensors are not supported by the tracer "
        "(nn.Embedding and nn.EmbeddingBag with sparse=True make sparse gradients); estimate "
        "it with sparse=False, which differs in the gradient: the whole table, where a sparse "
        "one holds a row per index looked up"
    )


def _inner(tensor: Any) -> list[torch.Tensor]:
    names, _ = tensor.__tensor_flatten__()
    return [getattr(tensor, n) for n in names]
