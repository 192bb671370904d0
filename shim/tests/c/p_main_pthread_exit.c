/* main leaves by pthread_exit while four threads allocate and free: the process ends when
   its last thread does, and the shim's writer thread must not be that thread. */
#include <pthread.h>
#include <stdio.h>
#include "cuda_stub.h"
static void *work(void *arg) {
    (void)arg;
    for (int i = 0; i < 100; i++) {
        void *p;
        if (cudaMalloc(&p, 4096) != 0 || cudaFree(p) != 0) return 0;
    }
    return 0;
}
int main(void) {
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, work, 0);
    pthread_exit(0);
}
