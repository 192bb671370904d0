/* Against the real libcudart.so.13 with no driver: every call fails (35, insufficient driver). */
#include <stdio.h>
#include "cuda_stub.h"
void k(void) {}
int main(void) {
    void *p;
    dim3 g = {1, 1, 1}, b = {1, 1, 1};
    int r1 = cudaMalloc(&p, 1 << 20);
    int r2 = cudaMallocHost(&p, 4096);
    int r3 = cudaLaunchKernel((void *)k, g, b, 0, 0, 0);
    printf("%d %d %d\n", r1, r2, r3);
    return 0;
}
