/* 8 threads x 100k cudaMalloc/cudaFree pairs: nothing may be lost or duplicated. */
#include <pthread.h>
#include <stdio.h>
#include "cuda_stub.h"
#define THREADS 8
#define ITERS 100000
static void *work(void *arg) {
    (void)arg;
    for (int i = 0; i < ITERS; i++) {
        void *p;
        if (cudaMalloc(&p, 256) != 0 || cudaFree(p) != 0) return (void *)1;
    }
    return 0;
}
int main(void) {
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], 0, work, 0);
    int bad = 0;
    for (int i = 0; i < THREADS; i++) { void *r; pthread_join(t[i], &r); bad |= r != 0; }
    return bad;
}
