/* SIGTERM blocked in every thread (as a program that takes it with sigwait does) and sent while
   pending; main leaves by pthread_exit, so the shim's writer is the last thread and runs the
   exit: the process still exits 0, the signal never delivered, as without the shim. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
#include "cuda_stub.h"
int main(void) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &s, 0);
    void *p;
    CHECK(cudaMalloc(&p, 4096), 0);
    kill(getpid(), SIGTERM);
    pthread_exit(0);
}
