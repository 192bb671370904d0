/* A second interposer (torch_memory_saver style): forwards cudaMalloc/cudaFree through
 * dlsym(RTLD_NEXT) and counts what passes through. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
static int mallocs, frees;
int cudaMalloc(void **p, size_t size) {
    static int (*next)(void **, size_t);
    if (!next) next = (int (*)(void **, size_t))dlsym(RTLD_NEXT, "cudaMalloc");
    if (!next) { fprintf(stderr, "second: no next cudaMalloc\n"); abort(); }
    mallocs++;
    return next(p, size);
}
int cudaFree(void *p) {
    static int (*next)(void *);
    if (!next) next = (int (*)(void *))dlsym(RTLD_NEXT, "cudaFree");
    if (!next) { fprintf(stderr, "second: no next cudaFree\n"); abort(); }
    frees++;
    return next(p);
}
__attribute__((destructor)) static void report(void) { fprintf(stderr, "second: cudaMalloc=%d cudaFree=%d\n", mallocs, frees); }
