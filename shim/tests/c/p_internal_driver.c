/* Runtime calls whose implementation reaches the driver through cuGetProcAddress pointers. */
#include <stdio.h>
#include "cuda_stub.h"
int main(void) {
    void *a, *m, *h;
    CHECK(cudaMallocAsync(&a, 1 << 16, (void *)0x10), 0);
    CHECK(cudaMallocManaged(&m, 1 << 12, 1), 0);
    CHECK(cudaHostAlloc(&h, 1 << 12, 0), 0);
    CHECK(cudaFreeAsync(a, (void *)0x10), 0);
    CHECK(cudaFree(m), 0);
    CHECK(cudaFreeHost(h), 0);
    CHECK(cudaMemPoolTrimTo((void *)0x20, 0), 0);
    CHECK(cudaGraphLaunch((void *)0x30, 0), 0);
    return 0;
}
