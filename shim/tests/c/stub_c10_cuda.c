/* Stand-in for PyTorch's libc10_cuda.so in the GPU check's dry run (scripts/gpu-check.sh
 * --dry-run): the dry-run job's device allocations go through here, so that the trace records
 * this module as their caller, as it records the real libc10_cuda.so on a GPU. memsim's replay
 * takes only allocations made by PyTorch's allocator modules as requests. */
#include <stddef.h>
int cudaMalloc(void **p, size_t size);
int cudaFree(void *p);
int c10_stub_malloc(void **p, size_t size) { return cudaMalloc(p, size); }
int c10_stub_free(void *p) { return cudaFree(p); }
