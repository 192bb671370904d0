"""A cache of meta-kernel results, keyed by what the kernel can see: the op and its arguments'
metadata. The same policy as FakeTensor's dispatch cache (`FakeTensorMode._cache_key`), for
plain meta tensors.

On meta an op's outputs are a function of its inputs' metadata alone, and most meta kernels are
Python (`torch/_refs`, `torch/_decomp`), at hundreds of microseconds each: a batch norm
decomposes into some thirty of them. A training step runs the same ops on the same shapes again
and again (every step after the first, every repeated block, every parameter of one shape in
the optimizer), so the recorder asks here first and builds the outputs from the cached metadata.
The recorder sees exactly the tensors the kernel would have made: fresh storages of the same
size, or the same input returned by an in-place op (`tests/test_opcache.py` compares whole
traces with and without the cache).

What is not cached runs the kernel every time: views (they share a storage), data-dependent and
dynamic-shape ops, non-builtin ops (a custom op's meta kernel may do more than shape math), any
non-meta, subclass or symbolic argument, and any op whose first run changed an input's metadata
(`resize_`, `set_`) or returned something this module cannot rebuild exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch._library.utils import is_builtin

_MAX_ENTRIES = 200_000
_BYPASS = object()  # the entry of a key whose op runs every time
_FUNC_OK: dict[Any, bool] = {}
_CACHE: dict[tuple[Any, ...], Any] = {}
_SIMPLE = (int, float, bool, str, complex, type(None), torch.dtype, torch.device,
           torch.memory_format, torch.layout)  # fmt: skip
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_NO_KEY = object()

enabled = True
# Results given from the cache since the process started (tests check that hits happen).
hits = 0


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Every op runs its kernel (the reference the cache is tested against)."""
    global enabled
    was, enabled = enabled, False
    try:
        yield
    finally:
        enabled = was


def clear() -> None:
    _CACHE.clear()


def cacheable(func: Any) -> bool:
    """Whether `func`'s results may come from the cache (the op's own properties)."""
    ok = _FUNC_OK.get(func)
    if ok is None:
        tags = getattr(func, "tags", ())
        ok = _FUNC_OK[func] = (
            isinstance(func, torch._ops.OpOverload)
            and is_builtin(func)
            and not func.is_view
            and torch.Tag.data_dependent_output not in tags
            and torch.Tag.dynamic_output_shape not in tags
            and torch.Tag.inplace_view not in tags
        )
    return ok


def _add(parts: list[Any], value: Any) -> bool:
    """Appends `value`'s part of the key; False when it cannot be keyed."""
    kind = type(value)
    if kind in _TENSOR_TYPES:
        if value.device.type != "meta" or value.layout is not torch.strided:
            return False
        if value.is_conj() or value.is_neg():
            return False
        parts.append((kind, value.dtype, value.shape, value.stride(), value.storage_offset(),
                      value.untyped_storage().nbytes(), value.is_inference()))  # fmt: skip
        return True
    if kind is list or kind is tuple:
        parts.append((kind, len(value)))
        return all(_add(parts, v) for v in value)
    if kind in _SIMPLE or isinstance(value, torch.Size):
        parts.append((kind, value))
        return True
    return False  # a SymInt, a Generator, a subclass tensor, a callable: no key


def _key(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    parts: list[Any] = [
        func,
        torch.get_default_dtype(),
        torch._C._get_default_device(),
        torch.is_inference_mode_enabled(),
        torch._C._dispatch_tls_local_include_set().raw_repr(),
        torch._C._dispatch_tls_local_exclude_set().raw_repr(),
    ]
    if not all(_add(parts, a) for a in args):
        return None
    for name, value in kwargs.items():
        parts.append(name)
        if not _add(parts, value):
            return None
    return tuple(parts)


def _tensors(values: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    stack = [values]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, list | tuple):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return out


def _state(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.shape, t.stride(), t.storage_offset(), t.dtype, t.untyped_storage()._cdata,
            t.untyped_storage().nbytes())  # fmt: skip


def _fresh(t: torch.Tensor) -> tuple[Any, ...] | None:
    """How to make `t` again, when `empty_strided` makes exactly it."""
    if type(t) is not torch.Tensor or t.device.type != "meta" or t.layout is not torch.strided:
        return None
    if t.storage_offset() != 0 or t.requires_grad or t.is_conj() or t.is_neg():
        return None
    shape, stride = tuple(t.shape), t.stride()
    made = torch.empty_strided(shape, stride, dtype=t.dtype, device="meta")
    if made.untyped_storage().nbytes() != t.untyped_storage().nbytes():
        return None
    return (shape, stride, t.dtype)


def _entry(
    out: Any, args: tuple[Any, ...], kwargs: dict[str, Any], inputs: list[torch.Tensor]
) -> Any:
    """How to give `out` again without the kernel: None, ("arg", i) for an input returned as
    is, ("new", shape, stride, dtype) for a fresh tensor, or a tuple of those; `_BYPASS` for
    anything else."""
    input_ids = {id(t): i for i, t in enumerate(args) if isinstance(t, torch.Tensor)}
    storages = {t.untyped_storage()._cdata for t in inputs}
    seen: set[int] = set()

    def one(value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, torch.Tensor):
            return _BYPASS
        if id(value) in input_ids:
            return ("arg", input_ids[id(value)])
        if value.layout is not torch.strided:
            return _BYPASS  # a sparse tensor has no storage of its own to key
        cdata = value.untyped_storage()._cdata
        if cdata in storages or cdata in seen:
            return _BYPASS  # an alias of an input or of another output
        seen.add(cdata)
        made = _fresh(value)
        return _BYPASS if made is None else ("new", *made)

    if any(v is out for v in kwargs.values()):
        return _BYPASS
    if isinstance(out, tuple | list):
        parts = tuple(one(v) for v in out)
        if any(p is _BYPASS for p in parts):
            return _BYPASS
        return (type(out), parts)
    return one(out)


def _rebuild(entry: Any, args: tuple[Any, ...]) -> Any:
    if entry is None:
        return None
    head = entry[0]
    if head == "new":
        return torch.empty_strided(entry[1], entry[2], dtype=entry[3], device="meta")
    if head == "arg":
        return args[entry[1]]
    kind, parts = entry
    return kind(_rebuild(p, args) for p in parts)


def call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`func(*args, **kwargs)`, from the cache when the same op has run on the same metadata."""
    if not enabled or not cacheable(func):
        return func(*args, **kwargs)
    key = _key(func, args, kwargs)
    if key is None:
        return func(*args, **kwargs)
    entry = _CACHE.get(key, _NO_KEY)
    if entry is _BYPASS:
        return func(*args, **kwargs)
    if entry is not _NO_KEY:
        global hits
        hits += 1
        return _rebuild(entry, args)
    inputs = _tensors((args, kwargs))
    before = [_state(t) for t in inputs]
    out = func(*args, **kwargs)
    changed = any(_state(t) != b for t, b in zip(inputs, before, strict=True))
    if len(_CACHE) >= _MAX_ENTRIES:
        _CACHE.clear()
    _CACHE[key] = _BYPASS if changed else _entry(out, args, kwargs, inputs)
    return out
