/* T threads make N cudaMalloc/cudaFree pairs each, as fast as they can, then main exits at once
   (the threads still parked): with a large MEMTRACE_QUEUE the rings hold far more than the
   writer took by then, and all of it belongs in the trace, or is counted lost. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "cuda_stub.h"
static int N;
static int done;
static void *work(void *arg) {
    (void)arg;
    for (int i = 0; i < N; i++) {
        void *p;
        if (cudaMalloc(&p, 256) || cudaFree(p)) abort();
    }
    __atomic_add_fetch(&done, 1, __ATOMIC_SEQ_CST);
    for (;;) pause();
}
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int t = atoi(argv[1]);
    N = atoi(argv[2]);
    pthread_t th;
    for (int i = 0; i < t; i++) pthread_create(&th, 0, work, 0);
    while (__atomic_load_n(&done, __ATOMIC_SEQ_CST) < t) usleep(1000);
    exit(0);
}
