/* One thread allocates 1 MiB blocks and hands each through 64 slots to a second thread, which
 * frees it: every free is of a block allocated before it, and at most 65 MiB are live. */
#include <pthread.h>
#include <stdlib.h>
#include "cuda_stub.h"
#define SLOTS 64
static void *volatile slot[SLOTS];
static int n;
static void *produce(void *arg) {
    (void)arg;
    for (int i = 0; i < n; i++) {
        void *p;
        if (cudaMalloc(&p, 1 << 20) != 0) return (void *)1;
        while (__atomic_load_n(&slot[i % SLOTS], __ATOMIC_ACQUIRE)) {}
        __atomic_store_n(&slot[i % SLOTS], p, __ATOMIC_RELEASE);
    }
    return 0;
}
static void *consume(void *arg) {
    (void)arg;
    for (int i = 0; i < n; i++) {
        void *p;
        while (!(p = __atomic_load_n(&slot[i % SLOTS], __ATOMIC_ACQUIRE))) {}
        if (cudaFree(p) != 0) return (void *)1;
        __atomic_store_n(&slot[i % SLOTS], 0, __ATOMIC_RELEASE);
    }
    return 0;
}
int main(int argc, char **argv) {
    n = argc > 1 ? atoi(argv[1]) : 100000;
    pthread_t a, b;
    pthread_create(&a, 0, produce, 0);
    pthread_create(&b, 0, consume, 0);
    void *ra, *rb;
    pthread_join(a, &ra);
    pthread_join(b, &rb);
    return ra != 0 || rb != 0;
}
