"""The traced job's own allocator configuration, for memsim to replay with.

A program chooses its caching allocator's settings in `PYTORCH_ALLOC_CONF` (or the older
`PYTORCH_CUDA_ALLOC_CONF`), set in its environment or by the program before its first CUDA use,
or with `torch.cuda.memory._set_allocator_settings`. They change the job's memory
(`expandable_segments:True` packs a GPT-2 step 400 MiB tighter), and the trace header's `env`
is where memsim reads a trace's settings (`Header::alloc_conf`). What the program sets is
recorded, not applied: the tracer's device has no allocator. A setting made after the first
allocation takes effect from there on a GPU; the replay applies it from the start.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from memtrace_trainer.symtrace.recorder import Recorder

# In the order PyTorch (and memsim's `Header::alloc_conf`) prefers them.
CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


@contextlib.contextmanager
def recorded(rec: Recorder) -> Iterator[None]:
    """Around a traced program: `rec.allocator_env` gets the settings as the program leaves
    them; the environment is the caller's again after (a script's `os.environ[...] = ...` does
    not reach the next trace in this process)."""
    saved = {k: os.environ.get(k) for k in CONF_VARS}
    original = torch._C._accelerator_setAllocatorSettings
    made: list[str] = []

    def record(settings: str) -> None:
        made.append(str(settings))

    torch._C._accelerator_setAllocatorSettings = record
    try:
        yield
    finally:
        torch._C._accelerator_setAllocatorSettings = original
        env = {k: os.environ[k] for k in CONF_VARS if os.environ.get(k)}
        if made:
            # Later settings override earlier keys, in memsim's parser as in PyTorch's.
            key = next((k for k in CONF_VARS if k in env), CONF_VARS[0])
            env[key] = ",".join([*filter(None, [env.get(key)]), *made])
        rec.allocator_env = env
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
