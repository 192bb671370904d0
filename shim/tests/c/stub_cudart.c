/* Stub libcudart.so.13 / .so.12: reaches the driver the way the real runtime does, through
 * dlopen("libcuda.so.1") + dlsym("cuGetProcAddress_v2") + cuGetProcAddress for every call.
 * Built with a version script (versioned exports, like production) and -Bsymbolic-functions
 * (so __cudaLaunchKernel reaches cudaLaunchKernel directly, as the real 10-byte thunk does). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
typedef struct { unsigned x, y, z; } dim3;
typedef struct { dim3 gridDim; dim3 blockDim; size_t dynamicSmemBytes; void *stream; void *attrs; unsigned numAttrs; } cudaLaunchConfig_t;
typedef struct { char reserved[64]; } cudaIpcMemHandle_t;
typedef int (*gpa_t)(const char *, void **, int, unsigned long long, int *);

static gpa_t gpa;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "stub cudart: %s\n", dlerror()); abort(); }
    gpa = (gpa_t)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) { fprintf(stderr, "stub cudart: no cuGetProcAddress_v2\n"); abort(); }
}

static void *drv_flags(const char *name, unsigned long long flags) {
    pthread_once(&once, init);
    void *fn = 0;
    if (gpa(name, &fn, 12000, flags, 0) != 0 || !fn) { fprintf(stderr, "stub cudart: no %s\n", name); abort(); }
    return fn;
}
static void *drv(const char *name) { return drv_flags(name, 0); }

/* Each call resolves its driver entry once, like the real runtime's internal table. */
#define DRV_FLAGS(type, name, flags) static __typeof__(type) fn_; if (!fn_) fn_ = (type)drv_flags(name, flags)
#define DRV(type, name) DRV_FLAGS(type, name, 0)

cudaError_t cudaMalloc(void **p, size_t size) {
    DRV(int (*)(unsigned long long *, size_t), "cuMemAlloc");
    unsigned long long d = 0; int r = fn_(&d, size); *p = r ? 0 : (void *)d; return r;
}
cudaError_t cudaFree(void *p) {
    if (!p) return 0;
    DRV(int (*)(unsigned long long), "cuMemFree");
    return fn_((unsigned long long)p);
}
/* The stream-ordered entries, once for the legacy default stream and once for the per-thread
 * one (the _ptsz twins), which reach the driver's _ptsz entries
 * (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2), as the real runtime does. */
#define STREAM_ORDERED(suffix, flags) \
cudaError_t cudaMallocAsync##suffix(void **p, size_t size, void *s) { \
    DRV_FLAGS(int (*)(unsigned long long *, size_t, void *), "cuMemAllocAsync", flags); \
    unsigned long long d = 0; int r = fn_(&d, size, s); *p = (void *)d; return r; \
} \
cudaError_t cudaFreeAsync##suffix(void *p, void *s) { \
    DRV_FLAGS(int (*)(unsigned long long, void *), "cuMemFreeAsync", flags); \
    return fn_((unsigned long long)p, s); \
} \
cudaError_t cudaMallocFromPoolAsync##suffix(void **p, size_t size, void *pool, void *s) { \
    DRV_FLAGS(int (*)(unsigned long long *, size_t, void *, void *), "cuMemAllocFromPoolAsync", flags); \
    unsigned long long d = 0; int r = fn_(&d, size, pool, s); *p = (void *)d; return r; \
}
STREAM_ORDERED(, 0)
STREAM_ORDERED(_ptsz, 2)
cudaError_t cudaMallocManaged(void **p, size_t size, unsigned flags) {
    DRV(int (*)(unsigned long long *, size_t, unsigned), "cuMemAllocManaged");
    unsigned long long d = 0; int r = fn_(&d, size, flags); *p = (void *)d; return r;
}
cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t w, size_t h) {
    DRV(int (*)(unsigned long long *, size_t *, size_t, size_t, unsigned), "cuMemAllocPitch");
    unsigned long long d = 0; int r = fn_(&d, pitch, w, h, 4); *p = (void *)d; return r;
}
cudaError_t cudaMallocHost(void **p, size_t size) {
    DRV(int (*)(void **, size_t), "cuMemAllocHost");
    return fn_(p, size);
}
cudaError_t cudaHostAlloc(void **p, size_t size, unsigned flags) {
    DRV(int (*)(void **, size_t, unsigned), "cuMemHostAlloc");
    return fn_(p, size, flags);
}
cudaError_t cudaFreeHost(void *p) {
    DRV(int (*)(void *), "cuMemFreeHost");
    return fn_(p);
}
cudaError_t cudaHostRegister(void *p, size_t size, unsigned flags) {
    DRV(int (*)(void *, size_t, unsigned), "cuMemHostRegister");
    return fn_(p, size, flags);
}
cudaError_t cudaHostUnregister(void *p) {
    DRV(int (*)(void *), "cuMemHostUnregister");
    return fn_(p);
}
cudaError_t cudaMemPoolTrimTo(void *pool, size_t keep) {
    DRV(int (*)(void *, size_t), "cuMemPoolTrimTo");
    return fn_(pool, keep);
}
/* The imported address is the handle's first 8 bytes, so that a test chooses it. */
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags) {
    (void)flags; memcpy(p, h.reserved, sizeof *p); return 0;
}
cudaError_t cudaIpcCloseMemHandle(void *p) { (void)p; return 0; }

/* What cudaLaunchKernel does with a host stub: look up its CUfunction (here: one fake handle). */
cudaError_t cudaLaunchKernel(const void *func, dim3 g, dim3 b, void **args, size_t shared, void *s) {
    DRV(int (*)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **), "cuLaunchKernel");
    static void *handle;
    if (!handle) { int (*get)(void **, void *, const char *) = (int (*)(void **, void *, const char *))drv("cuModuleGetFunction"); get(&handle, 0, "runtime_kernel"); }
    if (!func) return 98; /* cudaErrorInvalidDeviceFunction */
    return fn_(handle, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)shared, s, args, 0);
}
cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 g, dim3 b, void **args, size_t shared, void *s) {
    return cudaLaunchKernel(func, g, b, args, shared, s);
}
/* The real __cudaLaunchKernel is a thunk that jumps straight to cudaLaunchKernel. */
cudaError_t __cudaLaunchKernel(const void *func, dim3 g, dim3 b, void **args, size_t shared, void *s) {
    return cudaLaunchKernel(func, g, b, args, shared, s);
}
cudaError_t __cudaLaunchKernel_ptsz(const void *func, dim3 g, dim3 b, void **args, size_t shared, void *s) {
    return cudaLaunchKernel(func, g, b, args, shared, s);
}
cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 g, dim3 b, void **args, size_t shared, void *s) {
    return cudaLaunchKernel(func, g, b, args, shared, s);
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *c, const void *func, void **args) {
    return cudaLaunchKernel(func, c->gridDim, c->blockDim, args, c->dynamicSmemBytes, c->stream);
}
cudaError_t cudaGraphLaunch(void *g, void *s) {
    DRV(int (*)(void *, void *), "cuGraphLaunch");
    return fn_(g, s);
}
cudaError_t cudaGetDriverEntryPoint(const char *sym, void **fn, unsigned long long flags, int *status) {
    pthread_once(&once, init);
    return gpa(sym, fn, 12000, flags, status);
}
cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned ver, unsigned long long flags, int *status) {
    pthread_once(&once, init);
    return gpa(sym, fn, (int)ver, flags, status);
}
cudaError_t cudaGetDriverEntryPoint_ptsz(const char *sym, void **fn, unsigned long long flags, int *status) {
    pthread_once(&once, init);
    return gpa(sym, fn, 12000, flags | 2, status);
}
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *sym, void **fn, unsigned ver, unsigned long long flags, int *status) {
    pthread_once(&once, init);
    return gpa(sym, fn, (int)ver, flags | 2, status);
}
