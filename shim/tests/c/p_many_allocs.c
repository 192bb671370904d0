/* argv[1] cudaMalloc calls (default 20000), none freed: a trace larger than a pipe's buffer. */
#include <stdio.h>
#include <stdlib.h>
#include "cuda_stub.h"
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    void *p;
    for (int i = 0; i < n; i++) CHECK(cudaMalloc(&p, 100), 0);
    return 0;
}
