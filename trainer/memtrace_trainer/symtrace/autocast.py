"""CUDA autocast on the meta device, decided by PyTorch's own AutocastCUDA kernels.

Meta tensors carry no autocast dispatch key, and `torch.autocast("cuda")` switches itself off
without a GPU (tests/test_facts.py). So while tracing, the `AutocastCPU` slot of the dispatcher is
borrowed: it is added to every op's key set, the CPU autocast kernels are replaced by Python
kernels, and the flag `torch.is_autocast_enabled("cpu")` becomes "the emulated CUDA autocast is
on". That slot sits where autocast sits, above autograd and inside composite ops, so `einsum`'s
inner `bmm`, `linear`'s `addmm` and the casts' backward (`ToCopyBackward0`) come out as on a GPU.

Which inputs an op casts, to which dtype, is not listed here: for every op that has an
`AutocastCUDA` kernel (`torch._C._dispatch_has_kernel_for_dispatch_key`, 121 ops on torch 2.15),
its first call runs PyTorch's real CUDA autocast kernel on fake CUDA tensors of the call's shapes
(`FakeTensorMode` gives `is_cuda` tensors, and their forward runs without a GPU) with all-fp32,
all-low and mixed floating inputs, and reads the policy off the output dtypes (`probe`): lower
precision, fp32 (through the op's `dtype` argument when it has one), promote, or none. The
policy is cached per (op, autocast dtype) and applied to the meta tensors. Ops with only a CPU
autocast kernel get a fallthrough.

Like CUDA autocast, casts of fp32 leaf tensors that require grad (weights) to the lower precision
are cached until the outermost autocast region exits.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch._C import DispatchKey, DispatchKeySet
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

_SLOT = DispatchKey.AutocastCPU
_EXCLUDE = DispatchKeySet(_SLOT)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def cuda_autocast_ops() -> list[str]:
    """Every op with a CUDA autocast kernel in the installed torch (`aten::name.overload`)."""
    return sorted(
        n
        for n in torch._C._dispatch_get_all_op_names()
        if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCUDA")
    )


def _cpu_only_ops() -> list[str]:
    return sorted(
        n
        for n in torch._C._dispatch_get_all_op_names()
        if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCPU")
        and not torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCUDA")
    )


def _overload(qualname: str) -> Any:
    ns, rest = qualname.split("::", 1)
    name, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")


LOWER, FP32, SET_DTYPE, PROMOTE, NATIVE = "lower", "fp32", "set_dtype", "promote", "native"


def _probe_out(op: Any, leaves: list[Any], spec: Any, dtypes: list[Any], amp: torch.dtype) -> Any:
    """Output dtype of `op` under PyTorch's AutocastCUDA kernel, on fake CUDA tensors shaped like
    the call's, with floating inputs given `dtypes` in order."""
    with _disable_current_modes(), torch._C.DisableTorchFunction(), FakeTensorMode():
        it = iter(dtypes)
        mirror = [
            torch.empty_strided(
                v.shape, v.stride(), dtype=next(it) if _is_float(v) else v.dtype, device="cuda"
            )
            if isinstance(v, torch.Tensor)
            else v
            for v in leaves
        ]
        args, kwargs = tree_unflatten(mirror, spec)
        was, was_dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", amp)
        try:
            with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
                out = op(*args, **kwargs)
        finally:
            torch.set_autocast_enabled("cuda", was)
            torch.set_autocast_dtype("cuda", was_dtype)
    first = next((o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)), None)
    return first.dtype if first is not None else None


def _has_dtype_arg(op: Any) -> bool:
    return any(a.name == "dtype" for a in op._schema.arguments)


def _is_float(v: Any) -> bool:
    # autocast_mode.h is_eligible: floating point, and never double.
    return isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != torch.float64


def probe(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], amp: torch.dtype) -> str:
    """The cast policy of `op`'s AutocastCUDA kernel (autocast_mode.h's lower_precision_fp, fp32,
    fp32_set_opt_dtype, promote), observed on the call's own shapes: all-fp32 inputs coming out
    in `amp` mean lower precision; all-`amp` inputs coming out fp32 mean fp32 (by a `dtype`
    argument when the op has one); mixed inputs coming out fp32 mean promote."""
    leaves, spec = tree_flatten((args, kwargs))
    n = sum(_is_float(v) for v in leaves)
    if n == 0:
        return NATIVE
    if _probe_out(op, leaves, spec, [torch.float32] * n, amp) == amp:
        return LOWER
    if _probe_out(op, leaves, spec, [amp] * n, amp) == torch.float32:
        return SET_DTYPE if _has_dtype_arg(op) else FP32
    if n > 1 and _probe_out(op, leaves, spec, [amp] + [torch.float32] * (n - 1), amp) == (
        torch.float32
    ):
        return PROMOTE
    return NATIVE


class Engine:
    """The borrowed slot's kernels, and the autocast state (enabled, dtype, cast cache)."""

    def __init__(self) -> None:
        self.plans: dict[tuple[Any, ...], str] = {}
        self.cache: dict[int, torch.Tensor] = {}
        self.depth = 0
        self.failed: set[str] = set()
        self.used: set[str] = set()  # the dtypes of enabled regions: the trace's `amp`
        self._lib: torch.library.Library | None = None
        self._include: Any = None
        self._saved: tuple[Any, ...] | None = None

    # --- install / remove ---------------------------------------------------------------------
    def install(self) -> None:
        self._saved = (
            torch.is_autocast_enabled("cpu"),
            torch.get_autocast_dtype("cpu"),
            torch.is_autocast_enabled("cuda"),
            torch.get_autocast_dtype("cuda"),
        )
        torch.set_autocast_enabled("cpu", False)
        with warnings.catch_warnings():
            # "Overriding a previously registered kernel": the override is the point, and it is
            # undone when the library object goes away.
            warnings.simplefilter("ignore")
            lib = torch.library.Library("aten", "IMPL")
            for name in cuda_autocast_ops():
                if name.startswith("aten::"):
                    lib.impl(name.removeprefix("aten::"), self._kernel(name), "AutocastCPU")
            for name in _cpu_only_ops():
                # A fallthrough, as CUDA has no kernel here: the op runs below the slot and the
                # ops it calls still pass through it (a composite's inner convolution is cast).
                if name.startswith("aten::"):
                    through = torch.library.fallthrough_kernel
                    lib.impl(name.removeprefix("aten::"), through, "AutocastCPU")
        self._lib = lib
        self._include = torch._C._IncludeDispatchKeyGuard(_SLOT)
        self._include.__enter__()

    def remove(self) -> None:
        if self._include is not None:
            self._include.__exit__(None, None, None)
            self._include = None
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None
        if self._saved is not None:
            cpu_on, cpu_dtype, cuda_on, cuda_dtype = self._saved
            torch.set_autocast_enabled("cpu", cpu_on)
            torch.set_autocast_dtype("cpu", cpu_dtype)
            torch.set_autocast_enabled("cuda", cuda_on)
            torch.set_autocast_dtype("cuda", cuda_dtype)
        self.cache.clear()

    # --- state ----------------------------------------------------------------------------------
    def state(self) -> tuple[bool, torch.dtype]:
        return torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")

    def set_state(self, enabled: bool, dtype: torch.dtype) -> None:
        # Both flags say the same, so `torch.is_autocast_enabled("cuda")` in user code and the
        # checkpoint's captured CPU state (restored on recompute) both see the emulated region.
        torch.set_autocast_enabled("cpu", enabled)
        torch.set_autocast_dtype("cpu", dtype)
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", dtype)

    # --- kernels --------------------------------------------------------------------------------
    def _kernel(self, name: str) -> Callable[..., Any]:
        op = _overload(name)
        # Where the op's `dtype` argument sits, when it can be passed positionally.
        schema = op._schema.arguments
        dtype_at = next(
            (i for i, a in enumerate(schema) if a.name == "dtype" and not a.kwarg_only), None
        )

        def kernel(*args: Any, **kwargs: Any) -> Any:
            amp = torch.get_autocast_dtype("cpu")
            key = (name, amp)
            if key not in self.plans:
                try:
                    # An explicit dtype fixes the output whatever the policy: probe without it.
                    p_args, p_kwargs = args, {k: v for k, v in kwargs.items() if k != "dtype"}
                    if dtype_at is not None and dtype_at < len(args):
                        p_args = (*args[:dtype_at], None, *args[dtype_at + 1 :])
                    self.plans[key] = probe(op, p_args, p_kwargs, amp)
                except Exception as e:  # the meta call below reports the user's real errors
                    # ...except CUDA autocast's own refusal (binary_cross_entropy is "unsafe to
                    # autocast"), which a GPU run raises too.
                    self.plans[key] = f"raise:{e}" if "autocast" in str(e) else NATIVE
                    self.failed.add(name)
            policy = self.plans[key]
            if policy.startswith("raise:"):
                raise RuntimeError(policy.removeprefix("raise:"))
            with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
                if policy == SET_DTYPE:
                    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
                    at = dtype_at
                    given = args[at] if at is not None and at < len(args) else kwargs.get("dtype")
                    if given is None and _is_float(first):
                        if at is not None and at < len(args):
                            args = (*args[:at], torch.float32, *args[at + 1 :])
                        else:
                            kwargs = {**kwargs, "dtype": torch.float32}
                elif policy != NATIVE:
                    leaves, spec = tree_flatten((args, kwargs))
                    to = {LOWER: amp, FP32: torch.float32}.get(policy)
                    if policy == PROMOTE:
                        kinds = {v.dtype for v in leaves if _is_float(v)}
                        to = amp if kinds <= {amp} else torch.float32
                    leaves = [self._cast(v, to, amp) if _is_float(v) else v for v in leaves]
                    args, kwargs = tree_unflatten(leaves, spec)
                return op(*args, **kwargs)

        return kernel

    def _cast(self, t: torch.Tensor, to: torch.dtype, lower: torch.dtype) -> torch.Tensor:
        # autocast_mode.cpp cached_cast: only fp32 leaves that require grad, cast to the lower
        # precision, are cached (weights, cast once per region and saved for backward).
        cacheable = (
            to == lower
            and t.dtype == torch.float32
            and t.requires_grad
            and t.is_leaf
            and not t._is_view()
            and torch.is_autocast_cache_enabled()
        )
        if t.dtype == to:
            return t
        if cacheable and id(t) in self.cache:
            return self.cache[id(t)]
        cast = t.to(to)
        if cacheable:
            self.cache[id(t)] = cast
        return cast


ENGINE: Engine | None = None


class TracerAutocast:
    """`torch.autocast` while tracing: `"cuda"` (and `"meta"`, the tracer's device) regions run
    the emulated CUDA autocast. `"cpu"` regions are treated the same way: on the tracer's device
    the CPU flag is the emulation's own state, which `torch.utils.checkpoint` captures and
    restores on recompute."""

    def __init__(
        self,
        device_type: str = "cuda",
        dtype: torch.dtype | None = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        if not isinstance(device_type, str):
            raise ValueError(f"device_type must be a str, got {type(device_type).__name__}")
        self.device_type = device_type
        self.dtype = dtype
        self.enabled = enabled
        self.cache_enabled = cache_enabled
        self._prev: tuple[Any, ...] | None = None

    def __enter__(self) -> TracerAutocast:
        engine = ENGINE
        if engine is None:
            raise RuntimeError("memtrace: autocast emulation used outside a trace")
        default = torch.float16 if self.device_type in ("cuda", "meta") else torch.bfloat16
        dtype = self.dtype or default
        if dtype not in (torch.float16, torch.bfloat16):
            warnings.warn(
                f"torch.autocast(dtype={dtype}): CUDA autocast supports float16 and bfloat16; "
                "this region is traced without autocast",
                stacklevel=2,
            )
            dtype, enabled = torch.float16, False
        else:
            enabled = bool(self.enabled)
        self._prev = (*engine.state(), torch.is_autocast_cache_enabled())
        if self.cache_enabled is not None:
            torch.set_autocast_cache_enabled(self.cache_enabled)
        engine.set_state(enabled, dtype)
        if enabled:
            engine.used.add(
                str(dtype).removeprefix("torch.").replace("float", "fp").replace("bfp", "bf")
            )
        engine.depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        engine = ENGINE
        assert engine is not None and self._prev is not None
        engine.depth -= 1
        if engine.depth == 0:
            engine.cache.clear()
        enabled, dtype, cache = self._prev
        engine.set_state(enabled, dtype)
        torch.set_autocast_cache_enabled(cache)

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with TracerAutocast(self.device_type, self.dtype, self.enabled, self.cache_enabled):
                return func(*args, **kwargs)

        return wrapped


def _cuda_amp_autocast(
    enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True
) -> TracerAutocast:
    return TracerAutocast("cuda", dtype, enabled, cache_enabled)


_PATCHES = (
    (torch, "autocast"),
    (torch.amp, "autocast"),
    (torch.amp.autocast_mode, "autocast"),
)


class Autocast:
    """For the duration of a trace: the emulation's kernels and `torch.autocast` et al. replaced
    by `TracerAutocast`. Not reentrant."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []
        self.engine = Engine()

    def __enter__(self) -> Autocast:
        global ENGINE
        if ENGINE is not None:
            raise RuntimeError("memtrace: nested traces are not supported")
        ENGINE = self.engine
        self.engine.install()
        for mod, attr in _PATCHES:
            self._saved.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, TracerAutocast)
        self._saved.append((torch.cuda.amp, "autocast", torch.cuda.amp.autocast))
        torch.cuda.amp.autocast = _cuda_amp_autocast  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        global ENGINE
        for mod, attr, value in reversed(self._saved):
            setattr(mod, attr, value)
        self._saved.clear()
        self.engine.remove()
        ENGINE = None
