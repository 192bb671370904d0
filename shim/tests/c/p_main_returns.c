/* One allocation, then main returns 4: libc exits with it through no export the shim sees. */
#include <stdio.h>
#include "cuda_stub.h"
int main(void) {
    void *p;
    CHECK(cudaMalloc(&p, 4096), 0);
    return 4;
}
