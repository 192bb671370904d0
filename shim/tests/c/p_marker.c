/* Markers: memtrace_mark (found at run time, as ctypes does) and NVTX range push/pop. */
#include <dlfcn.h>
#include <stdio.h>
#include "cuda_stub.h"
int main(void) {
    void (*mark)(const char *) = (void (*)(const char *))dlsym(RTLD_DEFAULT, "memtrace_mark");
    int (*push)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "nvtxRangePushA");
    int (*pop)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "nvtxRangePop");
    if (!mark || !push || !pop) return 1;
    void *p;
    mark("iter:0");
    push("phase:forward");
    CHECK(cudaMalloc(&p, 100), 0);
    pop();
    mark("iter:1");
    return 0;
}
