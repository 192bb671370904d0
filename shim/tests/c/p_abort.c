/* abort() after three allocations (a failed assert, an uncaught C++ exception): the process
   dies by SIGABRT, with or without the shim. */
#include <stdio.h>
#include <stdlib.h>
#include "cuda_stub.h"
int main(void) {
    for (int i = 0; i < 3; i++) { void *p; CHECK(cudaMalloc(&p, 4096), 0); }
    abort();
}
