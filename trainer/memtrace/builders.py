"""What a step builder does to the modules the caller holds.

A builder runs as written, so one that moves a module it reaches (`net = model.to(device)`)
moves the caller's own module to the tracer's device, where its values are gone. That cannot be
stopped without rewriting the builder, but it is said: the modules the builder can reach are
looked at before the trace and after it."""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import types
from collections.abc import Iterator
from typing import Any

from torch import nn

from memtrace.checks import listed
from memtrace_trainer import notes

_ONE_LEVEL = 1000
# How a partial's arguments are named: the user wrote `partial(make, net)`, not a name for it.
_PARTIAL = "partial argument"


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """`code` and the code of every function defined in it (the builder's `step()`)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _named(fn: Any) -> dict[str, Any]:
    """The values a builder names from outside itself: its nonlocals and the globals it (or a
    function defined in it) names, the arguments of a `functools.partial`, and `self` of a
    method or a callable object. A name that is not an expression of the caller's (a partial's
    argument) starts with `_PARTIAL`."""
    found: dict[str, Any] = {}
    if isinstance(fn, functools.partial):
        found.update({f"{_PARTIAL} {i}": a for i, a in enumerate(fn.args)})
        found.update({f"{_PARTIAL} {k}=": a for k, a in fn.keywords.items()})
        fn = fn.func
    if inspect.ismethod(fn):
        found["self"], fn = fn.__self__, fn.__func__
    elif not inspect.isfunction(fn) and callable(fn) and not isinstance(fn, type):
        found["self"], fn = fn, getattr(type(fn).__call__, "__func__", type(fn).__call__)
    if not inspect.isfunction(fn):
        return found
    try:
        seen = inspect.getclosurevars(fn)
    except (TypeError, ValueError):
        # ValueError: "Cell is empty", a nonlocal the builder names but that was never assigned.
        return found
    found.update(seen.nonlocals)
    found.update(seen.globals)
    # getclosurevars reads the builder's own code; a global named only in its step() is the
    # builder's too.
    names = {n for code in _codes(fn.__code__) for n in code.co_names}
    found.update({n: fn.__globals__[n] for n in names if n in fn.__globals__})
    return found


def _inside(name: str, value: Any) -> Iterator[tuple[str, Any]]:
    """`value` and what it holds one level down (a dict's values, a list's items, an object's
    attributes), each with the expression that names it."""
    yield name, value
    # A callable object (a builder class's instance, what a bound method's `self` is) keeps its
    # model in an attribute, so only what holds no such state stops here.
    if isinstance(value, nn.Module | types.ModuleType | type) or inspect.isroutine(value):
        return
    if isinstance(value, dict):
        items: Iterator[tuple[str, Any]] = ((f"{name}[{k!r}]", v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{name}[{i}]", v) for i, v in enumerate(value))
    else:
        items = ((f"{name}.{k}", v) for k, v in getattr(value, "__dict__", {}).items())
    # A global list of a million samples is not where a model is kept.
    yield from itertools.islice(items, _ONE_LEVEL)


def reachable(fn: Any) -> dict[str, nn.Module]:
    """The modules a step builder can reach, by the expression that names them, each once."""
    out: dict[str, nn.Module] = {}
    seen: set[int] = set()
    for name, value in _named(fn).items():
        for said, v in _inside(name, value):
            if isinstance(v, nn.Module) and id(v) not in seen:
                seen.add(id(v))
                out[said] = v
    return out


def _state(m: nn.Module) -> dict[str, Any]:
    """The module's parameters and buffers that hold values (not on meta), by name."""
    return {n: t for n, t in [*m.named_parameters(), *m.named_buffers()]
            if t.device.type != "meta"}  # fmt: skip


@contextlib.contextmanager
def watched(fn: Any) -> Iterator[None]:
    """Within: the step builder `fn` runs. Afterwards (a failure too), a warning for each module
    the caller holds that it moved to the tracer's device or whose parameters it replaced."""
    # The watch only warns: whatever it cannot look at (an odd object the builder names, a module
    # whose tensors cannot be listed) leaves the builder unwatched, never the estimate failed.
    try:
        before = {name: (m, _state(m)) for name, m in reachable(fn).items()}
    except Exception:
        before = {}
    try:
        yield
    finally:
        try:
            _said(before)
        except Exception:
            pass


def _said(before: dict[str, tuple[nn.Module, dict[str, Any]]]) -> None:
    for name, (m, held) in before.items():
        now = dict([*m.named_parameters(), *m.named_buffers()])
        moved = [n for n in held if n in now and now[n].device.type == "meta"]
        replaced = [n for n, t in held.items() if now.get(n) is not t]
        # A partial's argument is no expression the caller could copy.
        code = not name.startswith(_PARTIAL)
        what, copied = (
            (f"`{name}`", f"copy.deepcopy({name})") if code else (name, "copy.deepcopy(module)")
        )
        if moved:
            notes.warn(
                f"the step builder moved {what} ({type(m).__name__}), a module the caller "
                f"holds, to the tracer's device: its tensors ({listed(moved)}) are meta tensors "
                f"now, their values gone; build the model inside the builder, or move a copy "
                f"({copied}.to(device))"
            )
        elif replaced:
            notes.warn(
                f"the step builder replaced tensors of {what} ({type(m).__name__}), a module "
                f"the caller holds ({listed(replaced)}); build the model inside the builder, or "
                f"change a copy ({copied})"
            )
