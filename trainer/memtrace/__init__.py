"""memtrace: how much GPU memory a PyTorch training job needs, estimated without a GPU.

    >>> import memtrace
    >>> est = memtrace.estimate(model, torch.randn(32, 3, 224, 224), gpu="a100-40gb")
    >>> est.fits(), est.breakdown

`estimate` traces the job on PyTorch's meta device (your model is copied, never moved or
trained) and replays the trace through an exact model of PyTorch's CUDA caching allocator.
See docs/python-api.md.
"""

from memtrace.api import (
    MemtraceWarning,
    default_loss,
    estimate,
    max_batch,
    preload_path,
    profiles,
    replay,
)
from memtrace.result import Estimate, EstimateError

__version__ = "0.1.0"

__all__ = [
    "Estimate",
    "EstimateError",
    "MemtraceWarning",
    "__version__",
    "default_loss",
    "estimate",
    "max_batch",
    "preload_path",
    "profiles",
    "replay",
]
