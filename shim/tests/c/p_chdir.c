/* The program changes its directory before its first CUDA call (as Hydra does). */
#include <stdio.h>
#include <unistd.h>
#include "cuda_stub.h"
int main(int argc, char **argv) {
    if (argc < 2 || chdir(argv[1]) != 0) return 2;
    void *p;
    CHECK(cudaMalloc(&p, 10), 0);
    return 0;
}
