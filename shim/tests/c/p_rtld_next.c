/* The program itself asks dlsym(RTLD_NEXT, "cudaMalloc"): it must get the next definition after
 * itself (the shim's), exactly as without the dlsym hook. */
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    int (*next)(void **, size_t) = (int (*)(void **, size_t))dlsym(RTLD_NEXT, "cudaMalloc");
    int (*dflt)(void **, size_t) = (int (*)(void **, size_t))dlsym(RTLD_DEFAULT, "cudaMalloc");
    if (!next || next != dflt) { fprintf(stderr, "RTLD_NEXT %p != RTLD_DEFAULT %p\n", (void *)next, (void *)dflt); return 1; }
    void *p;
    return next(&p, 777);
}
