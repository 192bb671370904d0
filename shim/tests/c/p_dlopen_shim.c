/* The shim dlopen()ed into a running process instead of preloaded (SHIM_PATH): its
 * initial-exec TLS block then comes from glibc's static TLS surplus. A hook reached through
 * dlsym on the shim's handle must work and be recorded; calls through the PLT go straight to
 * the runtime (the shim was loaded RTLD_LOCAL, after it). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuda_stub.h"

typedef int (*malloc_t)(void **, size_t);
typedef void (*mark_t)(const char *);

int main(void) {
    const char *path = getenv("SHIM_PATH");
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : 0;
    if (!h) { fprintf(stderr, "dlopen %s: %s\n", path ? path : "(SHIM_PATH unset)", dlerror()); return 1; }
    malloc_t hooked_malloc = (malloc_t)dlsym(h, "cudaMalloc");
    mark_t mark = (mark_t)dlsym(h, "memtrace_mark");
    if (!hooked_malloc || !mark) { fprintf(stderr, "dlsym: %s\n", dlerror()); return 1; }
    mark("dlopened");
    void *p;
    CHECK(hooked_malloc(&p, 4096), 0);
    CHECK(cudaFree(p), 0);
    return 0;
}
