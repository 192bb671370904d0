/* A failed allocation (STUB_OOM_LIMIT set by the test): recorded with its code, not counted. */
#include <stdio.h>
#include "cuda_stub.h"
int main(void) {
    void *a, *b;
    CHECK(cudaMalloc(&a, 1 << 20), 0);
    CHECK(cudaMalloc(&b, (size_t)1 << 34), 2);
    CHECK(cudaFree(a), 0);
    return 0;
}
