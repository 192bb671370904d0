/* SIGINT, SIGTERM, SIGHUP and SIGQUIT ignored before the first CUDA call (nohup, a shell's
   background job) must stay ignored: exit 0 when they are, 1 when the shim replaced any. */
#include <signal.h>
#include <stdio.h>
#include "cuda_stub.h"
int main(void) {
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    void *p;
    CHECK(cudaMalloc(&p, 100), 0);
    CHECK(cudaFree(p), 0);
    struct sigaction a, b, c, d;
    sigaction(SIGINT, 0, &a);
    sigaction(SIGTERM, 0, &b);
    sigaction(SIGHUP, 0, &c);
    sigaction(SIGQUIT, 0, &d);
    if (a.sa_handler != SIG_IGN || b.sa_handler != SIG_IGN || c.sa_handler != SIG_IGN || d.sa_handler != SIG_IGN) {
        fprintf(stderr, "an ignored signal is handled now\n");
        return 1;
    }
    return 0;
}
