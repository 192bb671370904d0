"""The GPUs the traced program sees: one, rank 0's (`torch.cuda.device_count()` is 1).

Every device the program names is read by PyTorch's own rule (`torch.cuda._utils.
_get_device_index`: an int is an index, a bare "cuda" or None the current device) and one past
the machine's is refused as a one-GPU machine refuses it ("invalid device ordinal"), rather than
folded onto device 0 (a model split over two GPUs counted as one GPU's): a tensor's device, a
device context, `set_device`, and every `torch.cuda` answer that takes a device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from numbers import Integral
from typing import Any

import torch
from torch.accelerator._utils import _get_device_index as _accelerator_index
from torch.cuda._utils import _get_device_index

from memtrace_trainer.errors import UserError

# The GPUs the traced program sees (`torch.cuda.device_count()`): one, rank 0's.
DEVICES = 1


class OtherGpuError(UserError):
    """The program used a CUDA device past the traced machine's one; `named` says whose code."""

    def __init__(self, index: int, at: str, what: str | None = None) -> None:
        self.index, self.at, self.what = index, at, what
        said = (
            f"your code uses cuda:{index}{at}, but the traced machine has one GPU "
            f'(torch.cuda.device_count() is {DEVICES}): a one-GPU run fails there with "CUDA '
            'error: invalid device ordinal"; memtrace traces one GPU: use "cuda" or the '
            "`device` argument (a job sharded over several GPUs is traced as its rank 0, given "
            "a world size of N)"
        )
        super().__init__(f"{what}: {said}" if what else said)

    def named(self, what: str) -> OtherGpuError:
        """The same refusal, led by the code it is about (`--step NAME`, `--script PATH`);
        one named already keeps its name."""
        return self if self.what else OtherGpuError(self.index, self.at, what)


@contextlib.contextmanager
def named_as(what: str) -> Iterator[None]:
    """A second GPU used in the traced code, refused led by whose code it is (`--step NAME`,
    `--script PATH`), as the user's other errors are."""
    try:
        yield
    except OtherGpuError as e:
        raise e.named(what) from e


def check(index: int) -> None:
    """Refuse a CUDA device index the traced machine does not have, naming the user's line."""
    if 0 <= index < DEVICES:
        return
    import traceback

    from memtrace_trainer.errors import is_user_file

    mine = [f for f in traceback.extract_stack() if is_user_file(f.filename)]
    raise OtherGpuError(index, f" (at {mine[-1].filename}:{mine[-1].lineno})" if mine else "")


def is_index(v: Any) -> bool:
    """An integer PyTorch's argument parser reads as a CUDA device index (`THPUtils_checkLong`):
    a Python int or a NumPy integer (`x.to(np.int64(0))`), never a bool."""
    return isinstance(v, Integral) and not isinstance(v, bool)


def cuda_index(device: Any) -> int | None:
    """The CUDA device index `device` names, by PyTorch's rule (an int is one, a "cuda" without
    an index is the current device); None where it names no CUDA device (a dtype, a tensor,
    "cpu", "meta")."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type != "cuda":
        return None
    if is_index(device):
        device = int(device)
    elif not isinstance(device, torch.device):
        return None
    return _get_device_index(device, optional=True)


def one_gpu(device: Any) -> None:
    """`device` (a tensor's device, a device context's, an index), refused past the one GPU."""
    index = cuda_index(device)
    if index is not None:
        check(index)


def _tracers(device: Any) -> bool:
    """The tracer's device, which the program's "cuda" tensors report (`x.device` is meta): the
    one GPU, as `cuda:0` is on a GPU (`torch.cuda.memory_allocated(x.device)`)."""
    return isinstance(device, str | torch.device) and torch.device(device).type == "meta"


def set_device(device: Any) -> None:
    """`torch.cuda.set_device`: PyTorch's signature and rule (a negative index is a no-op)."""
    if _tracers(device):
        return
    index = _get_device_index(device)
    if index >= 0:
        check(index)


def set_device_index(device: Any, /) -> None:
    """`torch.accelerator.set_device_index`: as PyTorch reads it (a negative index is a no-op)."""
    if _tracers(device):
        return
    index = _accelerator_index(device, optional=False)
    if index >= 0:
        check(index)


def exchange_device(device: int) -> int:
    """`torch.cuda._exchange_device` (`with torch.cuda.device(i)`): the device before, -1 for a
    negative index (no-op), as PyTorch's."""
    if device < 0:
        return -1
    check(device)
    return 0


def asked(device: Any = None) -> None:
    """A `torch.cuda` query of `device` (None: the current one), refused past the one GPU."""
    if not _tracers(device):
        check(_get_device_index(device, optional=True))


def on_device(answer: Any) -> Any:
    """`answer()` as a `torch.cuda` function of an optional device, checked first."""

    def of(device: Any = None) -> Any:
        asked(device)
        return answer()

    return of
