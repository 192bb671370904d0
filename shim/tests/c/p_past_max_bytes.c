/* N cudaMalloc / launch / cudaFree triples, far more than a small MEMTRACE_MAX_BYTES holds:
   every call past the limit is counted as not recorded. */
#include <stdio.h>
#include <stdlib.h>
#include "cuda_stub.h"
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 10;
    void *f;
    cuModuleGetFunction(&f, 0, "plain");
    for (int i = 0; i < n; i++) {
        void *p;
        dim3 g = {1, 1, 1}, b = {32, 1, 1};
        CHECK(cudaMalloc(&p, 4096), 0);
        CHECK(cudaLaunchKernel((void *)main, g, b, 0, 0, 0), 0);
        CHECK(cudaFree(p), 0);
    }
    return 0;
}
