/* N cudaMalloc / launch / cudaFree triples, far more than a small MEMTRACE_MAX_BYTES holds:
   every call past the limit is counted as not recorded. With T threads (argv[2]), each of them
   makes N triples and ends before main makes its own N: the calls of threads that have ended,
   and of main (whose first calls come past the limit), are counted too. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuda_stub.h"
int main(int argc, char **argv);
static int n;
static int triples(void) {
    for (int i = 0; i < n; i++) {
        void *p;
        dim3 g = {1, 1, 1}, b = {32, 1, 1};
        CHECK(cudaMalloc(&p, 4096), 0);
        CHECK(cudaLaunchKernel((void *)main, g, b, 0, 0, 0), 0);
        CHECK(cudaFree(p), 0);
    }
    return 0;
}
static void *thread(void *arg) {
    (void)arg;
    return (void *)(long)triples();
}
int main(int argc, char **argv) {
    n = argc > 1 ? atoi(argv[1]) : 10;
    int threads = argc > 2 ? atoi(argv[2]) : 0;
    if (threads > 64) threads = 64;
    void *f;
    cuModuleGetFunction(&f, 0, "plain");
    pthread_t t[64];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, thread, 0);
    int bad = 0;
    for (int i = 0; i < threads; i++) { void *r; pthread_join(t[i], &r); bad |= r != 0; }
    return bad | triples();
}
