/* Per-call cost: median ns per cudaMalloc+cudaFree pair and per __cudaLaunchKernel / cuLaunchKernel
 * over REPEATS runs of ITERS calls. Run once without and once with LD_PRELOAD=libmemtrace.so;
 * the difference is the shim's added cost. bench_loop_* are separate functions so that
 * callgrind --toggle-collect can count instructions inside them only.
 * A third argument "split" starts the shim's writer thread first (one recorded call) and only
 * then pins the calling thread to CPU 0, so that the writer runs on another core: the calling
 * thread's own cost, without the writer's encoding on its core. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>
#include "cuda_stub.h"

void kern(void) {}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

__attribute__((noinline)) void bench_loop_alloc(long n) {
    for (long i = 0; i < n; i++) {
        void *p;
        cudaMalloc(&p, 4096);
        cudaFree(p);
    }
}

__attribute__((noinline)) void bench_loop_launch(long n) {
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    for (long i = 0; i < n; i++) __cudaLaunchKernel((void *)kern, g, b, 0, 0, 0);
}

__attribute__((noinline)) void bench_loop_cu_launch(long n, void *f) {
    for (long i = 0; i < n; i++) cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 100000;
    int repeats = argc > 2 ? atoi(argv[2]) : 21;
    void *f;
    cuModuleGetFunction(&f, 0, "plain_kernel");
    if (argc > 3 && strcmp(argv[3], "split") == 0) {
        void *p;
        cudaMalloc(&p, 64);
        cudaFree(p);
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(0, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0) { perror("sched_setaffinity"); return 1; }
    }
    double a[201], l[201], c[201];
    if (repeats > 201) repeats = 201;
    for (int r = 0; r < repeats; r++) {
        double t0 = now(); bench_loop_alloc(iters);
        double t1 = now(); bench_loop_launch(iters);
        double t2 = now(); bench_loop_cu_launch(iters, f);
        double t3 = now();
        a[r] = (t1 - t0) / iters / 2; /* per call: one cudaMalloc or cudaFree */
        l[r] = (t2 - t1) / iters;
        c[r] = (t3 - t2) / iters;
    }
    qsort(a, repeats, sizeof a[0], cmp);
    qsort(l, repeats, sizeof l[0], cmp);
    qsort(c, repeats, sizeof c[0], cmp);
    printf("alloc_or_free_ns %.1f\n__cudaLaunchKernel_ns %.1f\ncuLaunchKernel_ns %.1f\n", a[repeats / 2], l[repeats / 2], c[repeats / 2]);
    return 0;
}
