"""Autocast for the meta device, which has no autocast dispatch key.

`torch.autocast("cuda")` disables itself without a GPU and meta tensors skip autocast entirely
(checked on this build by tests/test_facts.py), so the casts CUDA autocast would insert are made
here, above autograd, with the same cast cache for fp32 leaf weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

T = torch.Tensor
# autocast_mode.cpp, CUDA lower_precision_fp and fp32 lists (the ones training models reach).
LOWER = {
    F.linear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose2d, torch.matmul, torch.mm, torch.bmm,
    torch.addmm, torch.baddbmm, torch.addbmm, F.scaled_dot_product_attention, T.__matmul__,
    T.matmul, T.mm, T.bmm, F.multi_head_attention_forward, torch.conv2d, torch.conv1d,
}  # fmt: skip
FP32 = {
    F.softmax, F.log_softmax, F.cross_entropy, F.nll_loss, F.layer_norm, F.group_norm,
    F.binary_cross_entropy_with_logits, F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.kl_div,
    torch.exp, torch.log, torch.pow, torch.sum, torch.cumsum, torch.norm, T.softmax,
    T.log_softmax, torch.softmax, torch.log_softmax, torch.layer_norm, F.normalize,
}  # fmt: skip


class Autocast(TorchFunctionMode):
    """Casts inputs of lower-precision ops to `dtype` and of fp32 ops back to fp32."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.cache: dict[int, torch.Tensor] = {}

    def _lower(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
            return value
        cacheable = value.requires_grad and value.is_leaf and not value._is_view()
        if cacheable and id(value) in self.cache:
            return self.cache[id(value)]
        cast = value.to(self.dtype)
        if cacheable:
            self.cache[id(value)] = cast
        return cast

    def _widen(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16):
            return value.float()
        return value

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in LOWER:
            args, kwargs = tree_map(self._lower, (args, kwargs))
        elif func in FP32:
            args, kwargs = tree_map(self._widen, (args, kwargs))
        return func(*args, **kwargs)

    def __exit__(self, *exc: object) -> None:
        # autocast.__exit__ clears the cache; copies saved by autograd live on until backward.
        self.cache.clear()
        super().__exit__(*exc)
