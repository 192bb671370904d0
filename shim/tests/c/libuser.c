/* A library linked against libcudart, loaded RTLD_LOCAL by p_rtld_local (like a framework
 * extension): its cudart is not in the global scope, so RTLD_NEXT cannot find it. */
#include <stdio.h>
#include "cuda_stub.h"
int do_work(void) {
    void *p;
    CHECK(cudaMalloc(&p, 12345), 0);
    CHECK(cudaFree(p), 0);
    return 0;
}
