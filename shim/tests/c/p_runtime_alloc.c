/* Runtime alloc and free: 2 device allocations, 2 frees, 1 pinned host pair. */
#include <stdio.h>
#include "cuda_stub.h"
int main(void) {
    void *a, *b, *h;
    CHECK(cudaMalloc(&a, 1 << 20), 0);
    CHECK(cudaMalloc(&b, 4096), 0);
    CHECK(cudaFree(a), 0);
    CHECK(cudaFree(b), 0);
    CHECK(cudaMallocHost(&h, 8192), 0);
    CHECK(cudaFreeHost(h), 0);
    CHECK(cudaFree(0), 0); /* context init idiom: not a free */
    return 0;
}
