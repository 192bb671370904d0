/* Hooks during thread teardown, and rings handed from finished threads to new ones: two waves
 * of 4 threads. Each thread allocates in its body, then frees from a pthread key destructor,
 * which glibc runs after the shim's own thread-local destructors (so the shim has given the
 * thread's ring back and must record through its shared queue). The second wave reuses the
 * first wave's rings. Prints each thread's id. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include "cuda_stub.h"
static pthread_key_t key;
static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;
static void at_teardown(void *p) {
    void *q;
    cudaMalloc(&q, 32);
    cudaFree(q);
    cudaFree(p);
}
static void *work(void *arg) {
    (void)arg;
    void *p;
    if (cudaMalloc(&p, 128) != 0) return (void *)1;
    pthread_setspecific(key, p);
    pthread_mutex_lock(&out);
    printf("%d\n", (int)gettid());
    pthread_mutex_unlock(&out);
    return 0;
}
int main(void) {
    pthread_key_create(&key, at_teardown);
    for (int wave = 0; wave < 2; wave++) {
        pthread_t t[4];
        for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, work, 0);
        for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
    }
    return 0;
}
