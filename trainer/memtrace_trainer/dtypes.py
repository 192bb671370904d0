"""The floating dtypes' short names (`fp32`, `bf16`, `fp16`), as flags, headers and answers
spell them: one map for every reader and writer."""

from __future__ import annotations

import torch

# The names flags take (`--dtype`, `--amp`, `--fsdp-mp`), in the order their help lists them.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_NAMES = {v: k for k, v in DTYPES.items()}
# Autocast's dtypes (`--amp`, a run config's `amp`).
AMP = {"bf16": torch.bfloat16, "fp16": torch.float16}


def name_of(dtype: torch.dtype) -> str:
    """`bf16` for torch.bfloat16; a dtype without a short name as torch spells it."""
    return _NAMES.get(dtype, str(dtype))


def dtype_of(name: str) -> torch.dtype:
    """The inverse of `name_of`, for every name it gives (`torch.float64` included)."""
    if name in DTYPES:
        return DTYPES[name]
    found = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"{name!r}: not a dtype name")
    return found
