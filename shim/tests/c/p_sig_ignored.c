/* SIGINT and SIGTERM ignored before the first CUDA call (nohup, a shell's background job)
   must stay ignored: exit 0 when they are, 1 when the shim replaced either. */
#include <signal.h>
#include <stdio.h>
#include "cuda_stub.h"
int main(void) {
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    void *p;
    CHECK(cudaMalloc(&p, 100), 0);
    CHECK(cudaFree(p), 0);
    struct sigaction a, b;
    sigaction(SIGINT, 0, &a);
    sigaction(SIGTERM, 0, &b);
    if (a.sa_handler != SIG_IGN || b.sa_handler != SIG_IGN) {
        fprintf(stderr, "an ignored signal is handled now\n");
        return 1;
    }
    return 0;
}
