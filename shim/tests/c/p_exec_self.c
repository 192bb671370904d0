/* exec without fork: the same pid runs a new image, which preloads the shim again. */
#include <stdio.h>
#include <unistd.h>
#include "cuda_stub.h"
int main(int argc, char **argv) {
    void *p;
    if (argc > 1) {
        CHECK(cudaMalloc(&p, 7000), 0);
        CHECK(cudaFree(p), 0);
        return 0;
    }
    for (int i = 0; i < 10; i++) CHECK(cudaMalloc(&p, 1000), 0);
    usleep(300000); /* the writer flushes every 50 ms */
    execl("/proc/self/exe", argv[0], "again", (char *)0);
    return 1;
}
