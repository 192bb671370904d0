/* Triton's launcher: dlopen("libcuda.so.1") + dlsym("cuLaunchKernelEx"). */
#include <dlfcn.h>
#include <stdio.h>
#include "cuda_stub.h"
int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    int (*launch)(const CUlaunchConfig *, void *, void **, void **) = (int (*)(const CUlaunchConfig *, void *, void **, void **))dlsym(lib, "cuLaunchKernelEx");
    int (*get)(void **, void *, const char *) = (int (*)(void **, void *, const char *))dlsym(lib, "cuModuleGetFunction");
    if (!launch || !get) return 1;
    void *f;
    CHECK(get(&f, 0, "triton_kernel"), 0);
    CUlaunchConfig c = {16, 1, 1, 64, 1, 1, 1024, 0, 0, 0};
    CHECK(launch(&c, f, 0, 0), 0);
    CHECK(launch(&c, f, 0, 0), 0);
    return 0;
}
