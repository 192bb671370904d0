"""Facts of this PyTorch build that the emulation relies on (reference marks them CPU-checked)."""

import warnings

import torch


def test_autocast_is_a_noop_on_meta() -> None:
    lin = torch.nn.Linear(4, 4, device="meta")
    x = torch.randn(2, 4, device="meta")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cuda", dtype=torch.float16):
            assert lin(x).dtype == torch.float32
    assert not torch.cuda.is_available()
    assert any("Disabling autocast" in str(w.message) for w in caught)
    torch.set_autocast_enabled("cuda", True)
    try:
        assert lin(x).dtype == torch.float32
    finally:
        torch.set_autocast_enabled("cuda", False)


def test_sdpa_choice_on_meta_is_math_and_dropout_mask_is_bool() -> None:
    q = torch.randn(1, 2, 8, 16, device="meta")
    assert torch._fused_sdp_choice(q, q, q) == 0
    assert torch.native_dropout(q, 0.5, True)[1].dtype == torch.bool


def test_fake_cuda_runs_forward_and_autocast_but_not_backward() -> None:
    """Why the tracer's device is meta (docs/symbolic-tracing.md, "The fake device")."""
    import pytest
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        lin = torch.nn.Linear(4, 4, device="cuda")
        x = torch.empty(2, 4, device="cuda")
        assert x.is_cuda
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", torch.bfloat16)
        try:
            y = lin(x)
        finally:
            torch.set_autocast_enabled("cuda", False)
        assert y.dtype == torch.bfloat16
        with pytest.raises(RuntimeError, match=r"device index|CUDA|cuda"):
            y.float().sum().backward()
