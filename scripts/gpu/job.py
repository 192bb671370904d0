"""The GPU check's training job (run under LD_PRELOAD=libmemtrace.so by scripts/gpu-check.sh).

Real mode: a small seeded MLP training loop on CUDA, with memory history recorded; writes
snapshot.pickle (caching runs) and stats.json (torch.cuda.memory_stats()) into --out.

Dry-run mode (--dry-run, no GPU): drives the stub libcudart.so.13/libcuda.so.1 from the shim's
test suite through ctypes the way the caching allocator would for one fixed workload
(DRY_TENSORS): segments by cudaMalloc, or VMM maps for expandable segments, or one cudaMalloc
per tensor with caching off. Device allocations go through a stub libc10_cuda.so
(shim/tests/c/stub_c10_cuda.c), so the trace names PyTorch's allocator module as their caller,
as it does on a GPU. It writes a snapshot/stats pair in torch's format describing exactly those
segments, so that the whole check pipeline runs, and is judged, end to end.
"""

import argparse
import ctypes
import json
import os
import pickle
import sys

MiB = 1 << 20


def mark(text):
    fn = getattr(ctypes.CDLL(None), "memtrace_mark", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_char_p]
        fn(text.encode())


def real_job(out, iterations, caching):
    import torch

    torch.manual_seed(0)
    if caching:
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 10),
    ).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for it in range(iterations):
        mark(f"iter:{it}")
        x = torch.randn(256, 1024, device=dev)
        y = torch.randint(0, 10, (256,), device=dev)
        mark("phase:forward")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        mark("phase:backward")
        loss.backward()
        mark("phase:optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    if caching:
        with open(os.path.join(out, "snapshot.pickle"), "wb") as f:
            pickle.dump(torch.cuda.memory._snapshot(), f)
    with open(os.path.join(out, "stats.json"), "w") as f:
        json.dump(torch.cuda.memory_stats(), f)


# The dry-run workload: tensors allocated in this order, all live together, then freed. PyTorch's
# caching allocator serves it with segments of 2 MiB (small pool: 1 MiB), 20 MiB (large pool:
# 4 MiB), the first small segment again (1 MiB), and a second 2 MiB small segment (1 MiB).
DRY_TENSORS = (1 * MiB, 4 * MiB, 1 * MiB, 1 * MiB)
DRY_SEGMENTS = (2 * MiB, 20 * MiB, 2 * MiB)


def dry_job(out, mode):
    rt = ctypes.CDLL("libcudart.so.13")
    c10 = ctypes.CDLL("libc10_cuda.so")
    vp = ctypes.c_void_p
    entries, peak, live = [], 0, 0
    if mode == "default":
        ptrs = []
        for size in DRY_SEGMENTS:
            p = vp()
            assert c10.c10_stub_malloc(ctypes.byref(p), ctypes.c_size_t(size)) == 0
            ptrs.append((p.value, size))
            entries.append({"action": "segment_alloc", "addr": p.value, "size": size, "stream": 0})
            live += size
            peak = max(peak, live)
        addr, size = ptrs[0]
        assert c10.c10_stub_free(vp(addr)) == 0
        entries.append({"action": "segment_free", "addr": addr, "size": size, "stream": 0})
        segments = [
            {"address": a, "total_size": s, "stream": 0, "segment_type": "large", "blocks": []}
            for a, s in ptrs[1:]
        ]
        # Another module's allocation (a cuBLAS workspace in a real run): not a segment.
        w = ctypes.c_uint64()
        drv = ctypes.CDLL("libcuda.so.1")
        assert drv.cuMemAlloc_v2(ctypes.byref(w), ctypes.c_size_t(MiB)) == 0
    elif mode == "expandable":
        get = rt.cudaGetDriverEntryPointByVersion
        fns = {}
        for name in ("cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess"):
            fp = vp()
            st = ctypes.c_int()
            assert (
                get(
                    name.encode(),
                    ctypes.byref(fp),
                    ctypes.c_uint(12000),
                    ctypes.c_ulonglong(0),
                    ctypes.byref(st),
                )
                == 0
            )
            fns[name] = fp.value
        u64, sz = ctypes.c_uint64, ctypes.c_size_t
        reserve = ctypes.CFUNCTYPE(
            ctypes.c_int, ctypes.POINTER(u64), sz, sz, u64, ctypes.c_ulonglong
        )(fns["cuMemAddressReserve"])
        create = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(u64), sz, vp, ctypes.c_ulonglong)(
            fns["cuMemCreate"]
        )
        mapf = ctypes.CFUNCTYPE(ctypes.c_int, u64, sz, sz, u64, ctypes.c_ulonglong)(fns["cuMemMap"])
        va = u64()
        assert reserve(ctypes.byref(va), 64 * MiB, 0, 0, 0) == 0
        for i in range(3):
            h = u64()
            assert create(ctypes.byref(h), 2 * MiB, None, 0) == 0
            assert mapf(va.value + i * 2 * MiB, 2 * MiB, 0, h.value, 0) == 0
            entries.append(
                {
                    "action": "segment_map",
                    "addr": va.value + i * 2 * MiB,
                    "size": 2 * MiB,
                    "stream": 0,
                }
            )
        peak = 6 * MiB
        segments = [
            {
                "address": va.value,
                "total_size": 6 * MiB,
                "stream": 0,
                "segment_type": "large",
                "blocks": [],
                "is_expandable": True,
            }
        ]
    else:
        ptrs = []
        for size in DRY_TENSORS:
            p = vp()
            assert c10.c10_stub_malloc(ctypes.byref(p), ctypes.c_size_t(size)) == 0
            ptrs.append(p)
        for p in ptrs:
            assert c10.c10_stub_free(p) == 0
        segments = None
    if segments is not None:
        snap = {"segments": segments, "device_traces": [entries], "allocator_settings": {}}
        with open(os.path.join(out, "snapshot.pickle"), "wb") as f:
            pickle.dump(snap, f)
    with open(os.path.join(out, "stats.json"), "w") as f:
        json.dump({"reserved_bytes.all.peak": peak}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=["default", "expandable", "nocache"], required=True)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "pid"), "w") as f:
        f.write(str(os.getpid()))
    if a.dry_run:
        dry_job(a.out, a.mode)
    else:
        real_job(a.out, a.iterations, a.mode != "nocache")
    return 0


if __name__ == "__main__":
    sys.exit(main())
