/* exit() from a non-main thread while the main thread waits. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "cuda_stub.h"
static void *quit(void *arg) { (void)arg; void *p; cudaMalloc(&p, 64); exit(3); }
int main(void) {
    pthread_t t;
    pthread_create(&t, 0, quit, 0);
    for (;;) pause();
}
