/* __cudaLaunchKernel (nvcc's CUDA 13 stubs), cudaLaunchKernel and cudaLaunchKernelExC. */
#include <stdio.h>
#include "cuda_stub.h"
void my_kernel(void) {}
void other_kernel(void) {}
int main(void) {
    dim3 g = {4, 2, 1}, b = {128, 1, 1};
    for (int i = 0; i < 3; i++) CHECK(__cudaLaunchKernel((void *)my_kernel, g, b, 0, 256, 0), 0);
    CHECK(cudaLaunchKernel((void *)other_kernel, g, b, 0, 0, 0), 0);
    cudaLaunchConfig_t c = {{8, 1, 1}, {32, 1, 1}, 0, 0, 0, 0};
    CHECK(cudaLaunchKernelExC(&c, (void *)my_kernel, 0), 0);
    return 0;
}
