"""Device-level peak memory from NVML, sampled in a thread while the job runs.

nvidia-smi and GPUMemNet's labels see what NVML sees: the CUDA context, libraries and the
allocator's reservations together. NVML is imported lazily so CPU-only paths never need it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# One reading: (this process's used bytes or None where NVML cannot say, device used bytes).
Reading = tuple[int | None, int]

MIN_HZ = 10.0


@dataclass
class NvmlPeaks:
    """What the sampler saw. `process_peak` is None when per-process accounting is missing
    (typical in containers, whose PIDs NVML does not know)."""

    samples: int = 0
    process_peak: int | None = None
    device_peak: int = 0
    device_baseline: int | None = None
    hz: float = 0.0
    errors: list[str] = field(default_factory=list)

    def peak(self) -> tuple[int | None, str | None]:
        """The label: per-process where NVML reports it, else device-level used memory."""
        if self.process_peak is not None:
            return self.process_peak, "nvml-process"
        if self.samples:
            return self.device_peak, "nvml-device"
        return None, None


class Sampler:
    """Calls `read` every `interval` seconds in a daemon thread and keeps the peaks."""

    def __init__(self, read: Callable[[], Reading], interval: float = 0.05) -> None:
        if interval <= 0 or 1.0 / interval < MIN_HZ:
            raise ValueError(f"NVML sampling interval {interval}s: expected at least {MIN_HZ} Hz")
        self.read = read
        self.interval = interval
        self.peaks = NvmlPeaks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._started = 0.0

    def _sample(self) -> None:
        try:
            proc, dev = self.read()
        except Exception as e:  # a failing read must not kill the run it measures
            if len(self.peaks.errors) < 5:
                self.peaks.errors.append(f"{type(e).__name__}: {e}")
            return
        p = self.peaks
        p.samples += 1
        p.device_peak = max(p.device_peak, dev)
        if proc is not None:
            p.process_peak = proc if p.process_peak is None else max(p.process_peak, proc)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> Sampler:
        self._started = time.monotonic()
        try:
            self.peaks.device_baseline = self.read()[1]
        except Exception as e:
            self.peaks.errors.append(f"{type(e).__name__}: {e}")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()  # the last state, in case the job ended between two ticks
        elapsed = time.monotonic() - self._started
        self.peaks.hz = self.peaks.samples / elapsed if elapsed > 0 else 0.0


def nvml_reader(torch_device_index: int) -> tuple[Callable[[], Reading], Callable[[], None]]:
    """A reader for the GPU torch calls `cuda:<index>` (matched by UUID, since NVML indices
    ignore CUDA_VISIBLE_DEVICES), and the shutdown function. Raises ImportError without
    nvidia-ml-py and pynvml.NVMLError without a driver."""
    import pynvml
    import torch

    pynvml.nvmlInit()
    props: Any = torch.cuda.get_device_properties(torch_device_index)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(
            text if text.startswith("GPU-") else f"GPU-{text}"
        )
    else:
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch_device_index)
    pid = os.getpid()

    def read() -> Reading:
        used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        mine: int | None = None
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                mine = int(proc.usedGpuMemory)
        return mine, used

    return read, pynvml.nvmlShutdown
