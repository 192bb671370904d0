/* Entry points added later: runtime _ptsz stream-ordered allocations, the _ptsz driver entry
 * point resolver, arrays (created through a resolver pointer and through the PLT), and the
 * legacy launches. */
#include <stdio.h>
#include "cuda_stub.h"
int cudaMallocAsync_ptsz(void **p, size_t size, void *s);
int cudaFreeAsync_ptsz(void *p, void *s);
int cudaMallocFromPoolAsync_ptsz(void **p, size_t size, void *pool, void *s);
int cudaGetDriverEntryPoint_ptsz(const char *sym, void **fn, unsigned long long flags, int *status);
typedef struct { size_t Width, Height; unsigned Format, NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct { size_t Width, Height, Depth; unsigned Format, NumChannels, Flags; } CUDA_ARRAY3D_DESCRIPTOR;
int cuArray3DCreate_v2(void **h, const CUDA_ARRAY3D_DESCRIPTOR *d);
int cuMipmappedArrayCreate(void **h, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels);
int cuArrayDestroy(void *h);
int cuMipmappedArrayDestroy(void *h);
int cuLaunch(void *f);
int cuLaunchGrid(void *f, int w, int h);
int cuLaunchGridAsync(void *f, int w, int h, void *s);

int main(void) {
    void *a, *b;
    CHECK(cudaMallocAsync_ptsz(&a, 1000, 0), 0);
    CHECK(cudaMallocFromPoolAsync_ptsz(&b, 3000, (void *)0x77, 0), 0);
    CHECK(cudaFreeAsync_ptsz(a, 0), 0);
    CHECK(cudaFreeAsync_ptsz(b, 0), 0);

    int (*create)(void **, const CUDA_ARRAY_DESCRIPTOR *) = 0;
    int st = -1;
    CHECK(cudaGetDriverEntryPoint_ptsz("cuArrayCreate", (void **)&create, 0, &st), 0);
    void *arr2d, *arr3d, *mip;
    CUDA_ARRAY_DESCRIPTOR d2 = {64, 32, 0x20 /* FLOAT */, 2};
    CHECK(create(&arr2d, &d2), 0); /* 64*32*2*4 = 16384 bytes */
    CUDA_ARRAY3D_DESCRIPTOR d3 = {16, 16, 4, 0x01 /* UINT8 */, 4, 0};
    CHECK(cuArray3DCreate_v2(&arr3d, &d3), 0); /* 16*16*4*4 = 4096 bytes */
    CUDA_ARRAY3D_DESCRIPTOR dm = {8, 4, 0, 0x10 /* HALF */, 1, 0};
    CHECK(cuMipmappedArrayCreate(&mip, &dm, 3), 0); /* (32 + 8 + 2) * 2 = 84 bytes */
    CHECK(cuArrayDestroy(arr2d), 0);
    CHECK(cuArrayDestroy(arr3d), 0);
    CHECK(cuMipmappedArrayDestroy(mip), 0);

    void *f;
    cuModuleGetFunction(&f, 0, "plain_kernel");
    CHECK(cuLaunch(f), 0);
    CHECK(cuLaunchGrid(f, 5, 6), 0);
    CHECK(cuLaunchGridAsync(f, 7, 8, (void *)0x99), 0);
    return 0;
}
