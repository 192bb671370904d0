/* A thread whose pthread key destructor (run after its Rust TLS is gone, so its events go
   through the shared queue) keeps calling cudaMalloc/cudaFree while main exits: the events
   queued after the exit began are not the exit's backlog, and nothing is counted lost. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "cuda_stub.h"
static pthread_key_t key;
static volatile int in_dtor;
static void dtor(void *v) {
    (void)v;
    in_dtor = 1;
    for (;;) {
        void *p;
        if (cudaMalloc(&p, 64) || cudaFree(p)) abort();
    }
}
static void *work(void *a) {
    (void)a;
    void *p;
    if (cudaMalloc(&p, 128)) abort();
    pthread_setspecific(key, (void *)1);
    return 0;
}
int main(void) {
    pthread_key_create(&key, dtor);
    void *p;
    CHECK(cudaMalloc(&p, 32), 0);
    pthread_t t;
    pthread_create(&t, 0, work, 0);
    while (!in_dtor) usleep(1000);
    usleep(200000);
    exit(0);
}
