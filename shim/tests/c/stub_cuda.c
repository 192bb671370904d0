/* Stub libcuda.so.1: enough of the driver API for the shim tests, no GPU.
 * Device addresses are fake (never dereferenced); VMM reservations are real mmap ranges.
 * Failpoint: STUB_OOM_LIMIT (bytes): allocations larger than it fail with
 * CUDA_ERROR_OUT_OF_MEMORY (2). Built with -Bsymbolic-functions so that taking the address of a
 * function here never yields the shim's export of the same name. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "stub_mem_log.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { const char *name; } stub_func;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream; void *attrs; unsigned numAttrs;
} CUlaunchConfig;

static CUdeviceptr next_addr = 0x7f0000000000ull;
static CUmemGenericAllocationHandle next_handle = 0x1000;

static size_t oom_limit(void) {
    const char *v = getenv("STUB_OOM_LIMIT");
    return v ? strtoull(v, 0, 10) : (size_t)1 << 40;
}

static CUdeviceptr fake_alloc(size_t size) {
    return __atomic_fetch_add(&next_addr, (size + 0xfff) & ~0xfffull, __ATOMIC_RELAXED);
}

/* What the driver allocated and freed, for the stub libcupti's MEMORY2 records (stub_cupti.c
 * reads it through a weak reference): device and pinned host memory, in call order, stamped with
 * CLOCK_MONOTONIC. The first MEM_LOG_MAX operations only; an entry is published by `ready`. */
enum { MEM_LOG_MAX = 256 };
static stub_mem_op mem_log[MEM_LOG_MAX];
static unsigned mem_log_len;
/* STUB_CUDA_MEM_LOG=0 turns the log off, so that scripts/bench-shim.sh's allocation loops time a
 * bare driver call (a full log makes every release scan it). */
static int mem_log_on = 1;

__attribute__((constructor)) static void mem_log_config(void) {
    const char *v = getenv("STUB_CUDA_MEM_LOG");
    if (v && strcmp(v, "0") == 0) mem_log_on = 0;
}

static void mem_log_add(uint32_t op, uint32_t kind, uint64_t addr, uint64_t bytes) {
    if (!mem_log_on) return;
    unsigned i = __atomic_fetch_add(&mem_log_len, 1, __ATOMIC_ACQ_REL);
    if (i >= MEM_LOG_MAX) return;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    stub_mem_op *e = &mem_log[i];
    e->ts = (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
    e->addr = addr; e->bytes = bytes; e->op = op; e->kind = kind;
    __atomic_store_n(&e->ready, 1, __ATOMIC_RELEASE);
}

/* The size of the latest logged allocation at `addr` (a release reports it, as CUPTI does). */
static uint64_t mem_log_size(uint32_t kind, uint64_t addr) {
    if (!mem_log_on) return 0;
    unsigned n = __atomic_load_n(&mem_log_len, __ATOMIC_ACQUIRE);
    for (unsigned i = n < MEM_LOG_MAX ? n : MEM_LOG_MAX; i-- > 0;) {
        const stub_mem_op *e = &mem_log[i];
        if (__atomic_load_n(&e->ready, __ATOMIC_ACQUIRE) && e->op == MEM_ALLOC && e->kind == kind && e->addr == addr)
            return e->bytes;
    }
    return 0;
}

/* The published prefix of the log. */
unsigned stub_cuda_mem_log(const stub_mem_op **ops) {
    unsigned n = __atomic_load_n(&mem_log_len, __ATOMIC_ACQUIRE), i = 0;
    if (n > MEM_LOG_MAX) n = MEM_LOG_MAX;
    while (i < n && __atomic_load_n(&mem_log[i].ready, __ATOMIC_ACQUIRE)) i++;
    *ops = mem_log;
    return i;
}

CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    if (size > oom_limit()) return 2;
    *p = fake_alloc(size);
    mem_log_add(MEM_ALLOC, MEM_DEVICE, *p, size);
    return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    if (!p) return 1;
    mem_log_add(MEM_RELEASE, MEM_DEVICE, p, mem_log_size(MEM_DEVICE, p));
    return 0;
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, void *s) { (void)s; return cuMemAlloc_v2(p, size); }
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, void *s) { (void)s; return cuMemAlloc_v2(p, size); }
CUresult cuMemFreeAsync(CUdeviceptr p, void *s) { (void)s; return cuMemFree_v2(p); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, void *s) { (void)s; return cuMemFree_v2(p); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, void *pool, void *s) { (void)pool; (void)s; return cuMemAlloc_v2(p, size); }
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned flags) { (void)flags; return cuMemAlloc_v2(p, size); }
/* Pitched blocks come from a range of their own, 0x7d0000000000 up (each rounded to 4 KiB), so
 * that a test knows their addresses; the pitch is the width rounded up to 512. A pitch × height
 * that does not fit a size_t fails with CUDA_ERROR_OUT_OF_MEMORY (2), writing nothing. */
static CUdeviceptr next_pitched = 0x7d0000000000ull;
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
    (void)e;
    size_t pv = (w + 511) & ~(size_t)511;
    if (h && pv > SIZE_MAX / h) return 2;
    size_t size = pv * h;
    if (size > oom_limit()) return 2;
    *pitch = pv;
    *p = __atomic_fetch_add(&next_pitched, (size + 0xfff) & ~0xfffull, __ATOMIC_RELAXED);
    mem_log_add(MEM_ALLOC, MEM_DEVICE, *p, size);
    return 0;
}
CUresult cuMemAllocHost_v2(void **p, size_t size) {
    *p = malloc(size);
    if (!*p) return 2;
    mem_log_add(MEM_ALLOC, MEM_PINNED, (uint64_t)*p, size);
    return 0;
}
CUresult cuMemHostAlloc(void **p, size_t size, unsigned flags) { (void)flags; return cuMemAllocHost_v2(p, size); }
CUresult cuMemFreeHost(void *p) {
    mem_log_add(MEM_RELEASE, MEM_PINNED, (uint64_t)p, mem_log_size(MEM_PINNED, (uint64_t)p));
    free(p);
    return 0;
}
CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags) { (void)p; (void)size; (void)flags; return 0; }
CUresult cuMemHostUnregister(void *p) { (void)p; return 0; }
/* The imported address is the handle's first 8 bytes, so that a test chooses it. */
typedef struct { char reserved[64]; } CUipcMemHandle;
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned flags) {
    (void)flags; memcpy(p, h.reserved, sizeof *p); return 0;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) { (void)p; return 0; }
CUresult cuMemPoolTrimTo(void *pool, size_t keep) { (void)pool; (void)keep; return 0; }

CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
    (void)align; (void)flags;
    /* `addr` is a hint, as in the real driver (the kernel takes it when the range is free). */
    void *m = mmap((void *)addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return 2;
    *p = (CUdeviceptr)m;
    return 0;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { return munmap((void *)p, size) ? 1 : 0; }
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const void *prop, unsigned long long flags) {
    (void)prop; (void)flags;
    if (size > oom_limit()) return 2;
    *h = __atomic_fetch_add(&next_handle, 1, __ATOMIC_RELAXED);
    return 0;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { (void)h; return 0; }
CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h, unsigned long long f) {
    (void)off; (void)h; (void)f;
    return mprotect((void *)p, size, PROT_READ | PROT_WRITE) ? 1 : 0;
}
CUresult cuMemUnmap(CUdeviceptr p, size_t size) { return mprotect((void *)p, size, PROT_NONE) ? 1 : 0; }
CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const void *desc, size_t count) { (void)p; (void)size; (void)desc; (void)count; return 0; }

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *s, void **params, void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)s; (void)params; (void)extra;
    return f ? 0 : 400;
}
CUresult cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                             unsigned shared, void *s, void **params, void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
}
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, void *f, void **params, void **extra) {
    (void)params; (void)extra; return c && f ? 0 : 1;
}
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, void *f, void **params, void **extra) {
    return cuLaunchKernelEx(c, f, params, extra);
}
CUresult cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                   unsigned shared, void *s, void **params) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, 0);
}
CUresult cuGraphLaunch(void *g, void *s) { (void)s; return g ? 0 : 1; }
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, void *pool, void *s) { (void)pool; (void)s; return cuMemAlloc_v2(p, size); }
/* Legacy launches (block shape from cuFuncSetBlockShape). */
CUresult cuLaunch(void *f) { return f ? 0 : 400; }
CUresult cuLaunchGrid(void *f, int w, int h) { (void)w; (void)h; return f ? 0 : 400; }
CUresult cuLaunchGridAsync(void *f, int w, int h, void *s) { (void)w; (void)h; (void)s; return f ? 0 : 400; }
/* Arrays: opaque host handles (malloc), as the real driver's are host-side objects. */
typedef struct { size_t Width, Height; unsigned Format, NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct { size_t Width, Height, Depth; unsigned Format, NumChannels, Flags; } CUDA_ARRAY3D_DESCRIPTOR;
CUresult cuArrayCreate_v2(void **h, const CUDA_ARRAY_DESCRIPTOR *d) { if (!d || !d->Width) return 1; *h = malloc(16); return 0; }
CUresult cuArray3DCreate_v2(void **h, const CUDA_ARRAY3D_DESCRIPTOR *d) { if (!d || !d->Width) return 1; *h = malloc(16); return 0; }
CUresult cuMipmappedArrayCreate(void **h, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    if (!d || !levels) return 1; *h = malloc(16); return 0;
}
CUresult cuArrayDestroy(void *h) { free(h); return 0; }
CUresult cuMipmappedArrayDestroy(void *h) { free(h); return 0; }
CUresult cuFuncGetName(const char **name, void *f) {
    if (!f) return 1;
    *name = ((stub_func *)f)->name;
    return 0;
}
/* A kernel handle programs can use: what cuModuleGetFunction would return. */
stub_func stub_kernel_triton = { "triton_kernel" };
stub_func stub_kernel_plain = { "plain_kernel" };
CUresult cuModuleGetFunction(void **f, void *mod, const char *name) {
    (void)mod;
    *f = strcmp(name, "triton_kernel") == 0 ? (void *)&stub_kernel_triton : (void *)&stub_kernel_plain;
    return 0;
}

struct entry { const char *base; unsigned long long flags; void *fn; };
/* (base name, flags) -> concrete entry, as the real driver maps them: versioned suffixes and
 * _ptsz for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2). */
static const struct entry table[] = {
    {"cuInit", 0, (void *)cuInit},
    {"cuDriverGetVersion", 0, (void *)cuDriverGetVersion},
    {"cuMemAlloc", 0, (void *)cuMemAlloc_v2},
    {"cuMemFree", 0, (void *)cuMemFree_v2},
    {"cuMemAllocAsync", 0, (void *)cuMemAllocAsync},
    {"cuMemAllocAsync", 2, (void *)cuMemAllocAsync_ptsz},
    {"cuMemFreeAsync", 0, (void *)cuMemFreeAsync},
    {"cuMemFreeAsync", 2, (void *)cuMemFreeAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 0, (void *)cuMemAllocFromPoolAsync},
    {"cuMemAllocFromPoolAsync", 2, (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuArrayCreate", 0, (void *)cuArrayCreate_v2},
    {"cuArray3DCreate", 0, (void *)cuArray3DCreate_v2},
    {"cuMipmappedArrayCreate", 0, (void *)cuMipmappedArrayCreate},
    {"cuArrayDestroy", 0, (void *)cuArrayDestroy},
    {"cuMipmappedArrayDestroy", 0, (void *)cuMipmappedArrayDestroy},
    {"cuLaunch", 0, (void *)cuLaunch},
    {"cuLaunchGrid", 0, (void *)cuLaunchGrid},
    {"cuLaunchGridAsync", 0, (void *)cuLaunchGridAsync},
    {"cuMemAllocManaged", 0, (void *)cuMemAllocManaged},
    {"cuMemAllocPitch", 0, (void *)cuMemAllocPitch_v2},
    {"cuMemAllocHost", 0, (void *)cuMemAllocHost_v2},
    {"cuMemHostAlloc", 0, (void *)cuMemHostAlloc},
    {"cuMemFreeHost", 0, (void *)cuMemFreeHost},
    {"cuMemHostRegister", 0, (void *)cuMemHostRegister_v2},
    {"cuMemHostUnregister", 0, (void *)cuMemHostUnregister},
    {"cuMemPoolTrimTo", 0, (void *)cuMemPoolTrimTo},
    {"cuMemAddressReserve", 0, (void *)cuMemAddressReserve},
    {"cuMemAddressFree", 0, (void *)cuMemAddressFree},
    {"cuMemCreate", 0, (void *)cuMemCreate},
    {"cuMemRelease", 0, (void *)cuMemRelease},
    {"cuMemMap", 0, (void *)cuMemMap},
    {"cuMemUnmap", 0, (void *)cuMemUnmap},
    {"cuMemSetAccess", 0, (void *)cuMemSetAccess},
    {"cuLaunchKernel", 0, (void *)cuLaunchKernel},
    {"cuLaunchKernel", 2, (void *)cuLaunchKernel_ptsz},
    {"cuLaunchKernelEx", 0, (void *)cuLaunchKernelEx},
    {"cuLaunchKernelEx", 2, (void *)cuLaunchKernelEx_ptsz},
    {"cuLaunchCooperativeKernel", 0, (void *)cuLaunchCooperativeKernel},
    {"cuGraphLaunch", 0, (void *)cuGraphLaunch},
    {"cuFuncGetName", 0, (void *)cuFuncGetName},
    {"cuModuleGetFunction", 0, (void *)cuModuleGetFunction},
};

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);

CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags) {
    return cuGetProcAddress_v2(sym, pfn, ver, flags, 0);
}

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
    (void)ver;
    if (strcmp(sym, "cuGetProcAddress") == 0) {
        *pfn = (void *)cuGetProcAddress_v2;
        if (status) *status = 0;
        return 0;
    }
    unsigned long long want = flags & 2;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].base, sym) == 0 && table[i].flags == want) {
            *pfn = table[i].fn;
            if (status) *status = 0;
            return 0;
        }
    }
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].base, sym) == 0 && table[i].flags == 0) {
            *pfn = table[i].fn;
            if (status) *status = 0;
            return 0;
        }
    }
    *pfn = 0;
    if (status) *status = 1;
    return 500; /* CUDA_ERROR_NOT_FOUND */
}
