/* Sustained event rate: THREADS threads issue N launches each as fast as they can; the shim
 * must write them all (the exit summary reports lost events). Prints the wall time from the
 * first call to the end of main; the script adds the exit drain by timing the whole process. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuda_stub.h"

static long n;
static void *f;
static void *work(void *arg) {
    (void)arg;
    for (long i = 0; i < n; i++) cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0);
    return 0;
}

int main(int argc, char **argv) {
    n = argc > 1 ? atol(argv[1]) : 10000000;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    cuModuleGetFunction(&f, 0, "plain_kernel");
    pthread_t t[64];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, work, 0);
    for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
    return 0;
}
