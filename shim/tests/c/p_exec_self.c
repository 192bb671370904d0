/* exec without fork, ARGV[1] more times: the same pid runs new images, each preloading the
   shim again; the last one allocates and frees, the others allocate ten blocks first. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "cuda_stub.h"
int main(int argc, char **argv) {
    void *p;
    int left = argc > 1 ? atoi(argv[1]) : 1;
    if (left == 0) {
        CHECK(cudaMalloc(&p, 7000), 0);
        CHECK(cudaFree(p), 0);
        return 0;
    }
    for (int i = 0; i < 10; i++) CHECK(cudaMalloc(&p, 1000), 0);
    usleep(300000); /* the writer flushes every 50 ms */
    char next[16];
    snprintf(next, sizeof next, "%d", left - 1);
    execl("/proc/self/exe", argv[0], next, (char *)0);
    return 1;
}
