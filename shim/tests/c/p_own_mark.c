/* A program with its own memtrace_mark fallback (exported: built with -rdynamic), as one that
   calls it whether or not the shim is preloaded might define. */
#include <stdio.h>
#include "cuda_stub.h"
__attribute__((weak)) void memtrace_mark(const char *text) { (void)text; }
int main(void) {
    void *p;
    CHECK(cudaMalloc(&p, 100), 0);
    CHECK(cudaFree(p), 0);
    return 0;
}
