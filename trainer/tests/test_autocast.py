"""The meta-device CUDA autocast against PyTorch's own AutocastCUDA kernels (symtrace/autocast.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from memtrace_trainer.symtrace.autocast import Autocast, cuda_autocast_ops

aten = torch.ops.aten
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _real_cuda(fn: Callable[..., Any], specs: list[tuple[tuple[int, ...], torch.dtype]], dt: Any):
    """Output dtypes of `fn` under PyTorch's real CUDA autocast, on fake CUDA tensors."""
    with FakeTensorMode():
        xs = [torch.empty(s, dtype=d, device="cuda") for s, d in specs]
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", dt)
        try:
            out = fn(*xs)
        finally:
            torch.set_autocast_enabled("cuda", False)
    return _dtypes(out)


def _emulated(fn: Callable[..., Any], specs: list[tuple[tuple[int, ...], torch.dtype]], dt: Any):
    with Autocast():
        xs = [torch.empty(s, dtype=d, device="meta") for s, d in specs]
        with torch.autocast("cuda", dtype=dt):
            out = fn(*xs)
    return _dtypes(out)


def _dtypes(out: Any) -> list[torch.dtype]:
    outs = out if isinstance(out, tuple | list) else [out]
    return [o.dtype for o in outs if isinstance(o, torch.Tensor)]


M = (8, 16)
CASES: dict[str, tuple[Callable[..., Any], list[tuple[tuple[int, ...], torch.dtype]]]] = {
    # lower_precision_fp
    "mm": (aten.mm.default, [(8, 16), (16, 4)]),
    "linear": (aten.linear.default, [(8, 16), (4, 16), (4,)]),
    "einsum": (lambda a, b: torch.einsum("ij,jk->ik", a, b), [(8, 16), (16, 4)]),
    "matmul": (torch.matmul, [(2, 8, 16), (16, 4)]),
    "bmm": (torch.bmm, [(2, 8, 16), (2, 16, 4)]),
    "baddbmm": (torch.baddbmm, [(2, 8, 4), (2, 8, 16), (2, 16, 4)]),
    "conv2d": (torch.nn.functional.conv2d, [(2, 3, 8, 8), (4, 3, 3, 3)]),
    "sdpa": (torch.nn.functional.scaled_dot_product_attention, [(2, 2, 8, 16)] * 3),
    # fp32
    "softmax": (lambda x: torch.softmax(x, -1), [M]),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), [M]),
    "layer_norm": (lambda x: torch.nn.functional.layer_norm(x, (16,)), [M]),
    "exp": (torch.exp, [M]),
    "mse_loss": (torch.nn.functional.mse_loss, [M, M]),
    # fp32_set_opt_dtype
    "sum": (torch.sum, [M]),
    "cumsum": (lambda x: torch.cumsum(x, 0), [M]),
    # promote
    "addcmul": (torch.addcmul, [M, M, M]),
    # no autocast kernel at all
    "relu": (torch.relu, [M]),
    "add": (torch.add, [M, M]),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("input_dtypes", ["f32", "low", "mixed"])
@pytest.mark.parametrize("amp", [BF16, F16])
def test_emulation_matches_pytorch_cuda_autocast(name: str, input_dtypes: str, amp: Any) -> None:
    fn, shapes = CASES[name]
    pick = {"f32": lambda i: F32, "low": lambda i: amp, "mixed": lambda i: amp if i else F32}
    specs = [(s, pick[input_dtypes](i)) for i, s in enumerate(shapes)]
    assert _emulated(fn, specs, amp) == _real_cuda(fn, specs, amp)


def test_every_cuda_autocast_op_gets_a_kernel_and_removal_restores_cpu() -> None:
    ops = cuda_autocast_ops()
    assert len(ops) > 100, ops  # torch 2.15 has 121; a broken enumeration would find few
    before = torch._C._dispatch_dump("aten::mm")
    with Autocast():
        for name in ops:
            if name.startswith("aten::"):
                dump = torch._C._dispatch_dump(name)
                line = next(x for x in dump.splitlines() if x.startswith("AutocastCPU"))
                assert "autocast_mode.cpp" not in line and "AutocastRNN" not in line, (name, line)
    assert torch._C._dispatch_dump("aten::mm") == before
    lin = torch.nn.Linear(4, 4, device="meta")
    assert lin(torch.randn(2, 4, device="meta")).dtype == F32


def test_regions_nest_cache_weights_and_report_state() -> None:
    lin = torch.nn.Linear(16, 16, device="meta")
    with Autocast() as ac:
        x = torch.randn(4, 16, device="meta")
        with torch.autocast("cuda", dtype=BF16):
            assert torch.is_autocast_enabled("cuda")
            assert torch.get_autocast_dtype("cuda") == BF16
            y = lin(x)
            assert y.dtype == BF16
            lin(x)
            assert len(ac.engine.cache) == 2  # weight and bias, each cast once per region
            with torch.autocast("cuda", enabled=False):
                assert lin(x).dtype == F32
            assert lin(x).dtype == BF16
        assert not torch.is_autocast_enabled("cuda")
        assert not ac.engine.cache
        assert lin(x).dtype == F32


def test_checkpoint_recompute_keeps_the_region() -> None:
    from torch.utils.checkpoint import checkpoint

    lin = torch.nn.Linear(16, 16, device="meta")
    seen: list[torch.dtype] = []

    def block(x: torch.Tensor) -> torch.Tensor:
        y = lin(x)
        seen.append(y.dtype)
        return torch.relu(y)  # saves its output: backward needs the recompute

    with Autocast():
        x = torch.randn(4, 16, device="meta", requires_grad=True)
        with torch.autocast("cuda", dtype=BF16):
            out = checkpoint(block, x, use_reentrant=False)
        out.float().sum().backward()
    assert seen == [BF16, BF16]


def _aten_autocast_names() -> set[str]:
    """aten's ops with an AutocastCUDA kernel, which the engine emulates. Other namespaces
    (torchvision's, once imported) register their own."""
    return {n.removeprefix("aten::").split(".")[0] for n in cuda_autocast_ops()
            if n.startswith("aten::")}  # fmt: skip


def _opinfo_samples() -> dict[str, Any]:
    """The first OpInfo (PyTorch's own test database) for each op with an AutocastCUDA kernel."""
    from torch.testing._internal.common_methods_invocations import op_db

    names = _aten_autocast_names()
    found: dict[str, Any] = {info.name: info for info in op_db if info.name in names}
    for info in op_db:  # then `nn.functional.mse_loss` for mse_loss, and aten names
        if info.name.startswith(("sparse.", "_refs.", "masked.")):
            continue
        for alias in {info.name.split(".")[-1], (info.aten_name or "").split(".")[0]}:
            if alias in names:
                found.setdefault(alias, info)
    return found


OPINFO = _opinfo_samples()
# Ops with an AutocastCUDA kernel that PyTorch's op_db has no sample for (internal cuDNN/RNN
# entry points, sm80+ attention kernels, upsample overloads reached through `interpolate`). The
# same policy code covers them (it is read off each op's own kernel); this list only pins what
# this test cannot call, so a torch upgrade that changes it is noticed.
NO_OPINFO = {
    "_convolution", "_cudnn_rnn", "_scaled_dot_product_flash_attention", "_thnn_fused_gru_cell",
    "_thnn_fused_lstm_cell", "_upsample_bicubic2d_aa", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "chain_matmul", "conv_tbc",
    "convolution", "cudnn_convolution", "cudnn_convolution_transpose", "frobenius_norm",
    "grid_sampler", "gru_cell", "lstm_cell", "nll_loss2d", "nuclear_norm", "rnn_relu_cell",
    "rnn_tanh_cell", "upsample_bicubic2d", "upsample_bilinear2d", "upsample_linear1d",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_trilinear3d",
}  # fmt: skip


def test_every_autocast_op_is_checked_or_named() -> None:
    names = _aten_autocast_names()
    assert names - set(OPINFO) == NO_OPINFO & names
    assert len(OPINFO) >= 60


def _to(value: Any, device: str) -> Any:
    from torch.utils._pytree import tree_map

    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device)
        return v

    return tree_map(one, value)


@pytest.mark.parametrize("name", sorted(OPINFO))
def test_pytorch_opinfo_samples_cast_as_on_cuda(name: str) -> None:
    info = OPINFO[name]
    checked = 0
    for sample in info.sample_inputs("cpu", torch.float32, requires_grad=False):
        args = (sample.input, *sample.args)
        if any(t.layout != torch.strided for t in _tensors((args, sample.kwargs))):
            continue  # sparse samples: no strides to copy onto fake or meta tensors
        with FakeTensorMode():
            fake_args, fake_kwargs = _to((args, sample.kwargs), "cuda")
            torch.set_autocast_enabled("cuda", True)
            torch.set_autocast_dtype("cuda", BF16)
            try:
                expected: Any = _dtypes(info.op(*fake_args, **fake_kwargs))
            except Exception as e:
                if "autocast" not in str(e):
                    continue  # samples fake CUDA tensors cannot run (data-dependent)
                expected = f"raises: {e}"  # CUDA autocast refuses the op
            finally:
                torch.set_autocast_enabled("cuda", False)
        with Autocast():
            meta_args, meta_kwargs = _to((args, sample.kwargs), "meta")
            with torch.autocast("cuda", dtype=BF16):
                try:
                    got: Any = _dtypes(info.op(*meta_args, **meta_kwargs))
                except RuntimeError as e:
                    got = f"raises: {e}"
        assert got == expected, (name, sample)
        checked += 1
        if checked == 3:
            break
    assert checked, f"{name}: no OpInfo sample could run on fake CUDA"


def _tensors(v: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_flatten

    return [x for x in tree_flatten(v)[0] if isinstance(x, torch.Tensor)]


def test_explicit_and_positional_dtypes_do_not_fool_the_policy() -> None:
    # cross_entropy's composite calls log_softmax(x, dim, x.dtype): bf16 stays bf16 there (CUDA
    # keeps a given dtype), and the policy learnt from that call is still "fp32 when None".
    x = torch.empty(4, 10, dtype=BF16, device="meta")
    y = torch.zeros(4, dtype=torch.long, device="meta")
    with Autocast():
        with torch.autocast("cuda", dtype=BF16):
            assert torch.nn.functional.cross_entropy(x, y).dtype == F32
            assert torch.log_softmax(x, -1).dtype == F32
            assert torch.ops.aten.log_softmax.int(x, -1, None).dtype == F32
            assert (
                torch.nn.functional.cross_entropy(
                    x, torch.zeros(4, dtype=torch.long, device="meta")
                ).dtype
                == F32
            )
