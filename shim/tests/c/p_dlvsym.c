/* dlvsym by an explicit handle hands out the shim's wrapper; by the default scope it is passed
 * through untouched (looked up as the caller, reference §4), so a versioned lookup there gets the
 * runtime's own definition. And a cooperative driver launch is recorded with its grid. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include "cuda_stub.h"
int cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                              unsigned shared, void *s, void **params);
typedef int (*malloc_t)(void **, size_t);
int main(void) {
    /* The stub runtime's symbols carry its soname as their version (tests/harness.rs). */
    malloc_t dflt = (malloc_t)dlvsym(RTLD_DEFAULT, "cudaMalloc", "libcudart.so.13");
    void *lib = dlopen("libcudart.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    malloc_t by_handle = (malloc_t)dlvsym(lib, "cudaMalloc", "libcudart.so.13");
    if (!dflt || !by_handle) { fprintf(stderr, "dlvsym: %p %p\n", (void *)dflt, (void *)by_handle); return 1; }
    void *a, *b, *f;
    CHECK(dflt(&a, 1000), 0);
    CHECK(by_handle(&b, 2000), 0);
    CHECK(cuInit(0), 0);
    CHECK(cuModuleGetFunction(&f, 0, "coop_kernel"), 0);
    CHECK(cuLaunchCooperativeKernel(f, 2, 3, 4, 64, 1, 1, 512, 0, 0), 0);
    return 0;
}
