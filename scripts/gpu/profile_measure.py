"""Measure a GPU profile's constants on the device (run by scripts/gpu-check.sh; needs CUDA).

Run in a fresh process: the CUDA context must not exist yet when the first reading is taken.
Memory outside the caching allocator is device used memory minus `max_memory_reserved`:

- context: NVML used after CUDA init minus NVML used before (mem_get_info's view is recorded too);
- cuBLAS: after the first GEMM (forward and backward of a matmul), minus context;
- cuDNN: after the first convolution (forward and backward), minus context and cuBLAS.

Also the cuBLAS workspace the allocator actually handed out (allocated bytes after the GEMM
minus the tensors the test created), total memory, SM count, compute capability and the
torch/CUDA/cuDNN versions. Writes one JSON object (scripts/gpu/profile_writer.py reads it).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import sys
from pathlib import Path

MiB = 1 << 20


class _NvmlMemory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


def nvml_used_reader():
    """A function returning NVML's device used bytes, or None when NVML is unavailable.
    ctypes instead of pynvml: the device machine may lack nvidia-ml-py."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if lib.nvmlInit_v2() != 0:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    index = int(visible) if visible.isdigit() else 0
    handle = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
        return None

    def used() -> int:
        mem = _NvmlMemory()
        if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) != 0:
            raise RuntimeError("nvmlDeviceGetMemoryInfo failed")
        return int(mem.used)

    return used


def measure() -> dict:
    nvml = nvml_used_reader()
    before = nvml() if nvml else None
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("profile_measure: CUDA is not available (this needs a GPU)")
    dev = torch.device("cuda")
    free, total = torch.cuda.mem_get_info()  # creates the context, allocates nothing
    torch.cuda.synchronize()
    after_init = nvml() if nvml else None

    def outside() -> int:
        torch.cuda.synchronize()
        f, t = torch.cuda.mem_get_info()
        return (t - f) - torch.cuda.max_memory_reserved()

    ctx_meminfo = total - free
    context = (after_init - before) if nvml else ctx_meminfo
    base_outside = outside()

    a = torch.randn(1024, 1024, device=dev, requires_grad=True)
    b = torch.randn(1024, 1024, device=dev)
    tensors = 2 * a.numel() * a.element_size()
    allocated_before = torch.cuda.memory_allocated()
    c = a @ b
    torch.cuda.synchronize()
    # The workspace is what the allocator holds beyond the inputs and the output.
    workspace = torch.cuda.memory_allocated() - allocated_before - c.numel() * c.element_size()
    c.sum().backward()
    gemm_outside = outside()

    conv = torch.nn.Conv2d(16, 32, 3, padding=1).to(dev)
    x = torch.randn(8, 16, 64, 64, device=dev)
    conv(x).sum().backward()
    conv_outside = outside()

    props = torch.cuda.get_device_properties(dev)
    return {
        "date": datetime.date.today().isoformat(),
        "gpu_name": torch.cuda.get_device_name(dev),
        "total_memory_bytes": int(props.total_memory),
        "sm_count": int(props.multi_processor_count),
        "compute_capability": [int(props.major), int(props.minor)],
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
        "cudnn": str(torch.backends.cudnn.version() or ""),
        "context_mib": context / MiB,
        "context_source": "nvml" if nvml else "mem_get_info",
        "context_mem_get_info_mib": ctx_meminfo / MiB,
        "outside_after_init_mib": base_outside / MiB,
        "cublas_mib": max(gemm_outside - base_outside, 0) / MiB,
        "cudnn_mib": max(conv_outside - gemm_outside, 0) / MiB,
        "cublas_workspace_bytes": int(workspace),
        "test_tensor_bytes": int(tensors),
        "max_memory_reserved_mib": torch.cuda.max_memory_reserved() / MiB,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = ap.parse_args()
    data = measure()
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(args.out)
    json.dump(data, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
