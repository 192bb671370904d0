/* Direct driver calls through the PLT (linked with -lcuda). */
#include <stdio.h>
#include "cuda_stub.h"
int main(void) {
    unsigned long long d;
    void *f;
    CHECK(cuInit(0), 0);
    CHECK(cuMemAlloc_v2(&d, 3 << 20), 0);
    CHECK(cuModuleGetFunction(&f, 0, "plain_kernel"), 0);
    CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0), 0);
    CHECK(cuMemFree_v2(d), 0);
    return 0;
}
