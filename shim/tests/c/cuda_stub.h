/* Declarations the test programs use (what cuda_runtime_api.h / cuda.h would give). */
#include <stddef.h>
typedef struct { unsigned x, y, z; } dim3;
typedef struct { dim3 gridDim; dim3 blockDim; size_t dynamicSmemBytes; void *stream; void *attrs; unsigned numAttrs; } cudaLaunchConfig_t;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream; void *attrs; unsigned numAttrs;
} CUlaunchConfig;
int cudaMalloc(void **p, size_t size);
int cudaFree(void *p);
int cudaMallocAsync(void **p, size_t size, void *s);
int cudaFreeAsync(void *p, void *s);
int cudaMallocManaged(void **p, size_t size, unsigned flags);
int cudaMallocHost(void **p, size_t size);
int cudaHostAlloc(void **p, size_t size, unsigned flags);
int cudaFreeHost(void *p);
int cudaMemPoolTrimTo(void *pool, size_t keep);
int cudaLaunchKernel(const void *func, dim3 g, dim3 b, void **args, size_t shared, void *s);
int __cudaLaunchKernel(const void *func, dim3 g, dim3 b, void **args, size_t shared, void *s);
int cudaLaunchKernelExC(const cudaLaunchConfig_t *c, const void *func, void **args);
int cudaGraphLaunch(void *g, void *s);
int cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned ver, unsigned long long flags, int *status);
int cuInit(unsigned flags);
int cuMemAlloc_v2(unsigned long long *p, size_t size);
int cuMemFree_v2(unsigned long long p);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *s, void **params, void **extra);
int cuModuleGetFunction(void **f, void *mod, const char *name);
#define CHECK(call, want) do { int r_ = (call); if (r_ != (want)) { fprintf(stderr, "%s:%d: %s = %d, expected %d\n", __FILE__, __LINE__, #call, r_, want); return 1; } } while (0)
