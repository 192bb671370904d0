/* Every allocation and free entry point with the common shapes (an out-pointer and a size, or an
 * address), once each, with distinct sizes and streams: the test checks each record's API,
 * memory kind, size and stream, so that a hook recording the wrong one shows. Runtime calls
 * reach the driver inside the stub runtime and are recorded once, as the runtime call. */
#include <stdio.h>
#include "cuda_stub.h"
int cudaMallocAsync_ptsz(void **p, size_t size, void *s);
int cudaFreeAsync_ptsz(void *p, void *s);
int cudaMallocFromPoolAsync(void **p, size_t size, void *pool, void *s);
int cudaMallocFromPoolAsync_ptsz(void **p, size_t size, void *pool, void *s);
int cudaHostRegister(void *p, size_t size, unsigned flags);
int cudaHostUnregister(void *p);
int cudaIpcCloseMemHandle(void *p);
int cuMemAllocAsync(unsigned long long *p, size_t size, void *s);
int cuMemAllocAsync_ptsz(unsigned long long *p, size_t size, void *s);
int cuMemFreeAsync(unsigned long long p, void *s);
int cuMemFreeAsync_ptsz(unsigned long long p, void *s);
int cuMemAllocFromPoolAsync(unsigned long long *p, size_t size, void *pool, void *s);
int cuMemAllocFromPoolAsync_ptsz(unsigned long long *p, size_t size, void *pool, void *s);
int cuMemAllocManaged(unsigned long long *p, size_t size, unsigned flags);
int cuMemAllocHost_v2(void **p, size_t size);
int cuMemHostAlloc(void **p, size_t size, unsigned flags);
int cuMemFreeHost(void *p);
int cuMemHostRegister_v2(void *p, size_t size, unsigned flags);
int cuMemHostUnregister(void *p);
int cuIpcCloseMemHandle(unsigned long long p);

/* Stream handles: opaque values the shim records as they are. */
#define S(n) ((void *)(0x5000ull + (n)))
/* An address no allocation returned: what an IPC close is given. */
#define IMPORTED 0x7e0000000000ull

int main(void) {
    void *r[8], *h[3];
    unsigned long long d[6];
    static char buf[2][4096];
    CHECK(cudaMalloc(&r[0], 1001), 0);
    CHECK(cudaMallocAsync(&r[1], 1002, S(1)), 0);
    CHECK(cudaMallocAsync_ptsz(&r[2], 1003, S(2)), 0);
    CHECK(cudaMallocFromPoolAsync(&r[3], 1004, S(90), S(3)), 0);
    CHECK(cudaMallocFromPoolAsync_ptsz(&r[4], 1005, S(90), S(4)), 0);
    CHECK(cudaMallocManaged(&r[5], 1006, 1), 0);
    CHECK(cudaMallocHost(&r[6], 1007), 0);
    CHECK(cudaHostAlloc(&r[7], 1008, 0), 0);
    CHECK(cudaHostRegister(buf[0], 1009, 0), 0);
    CHECK(cudaFreeAsync(r[1], S(11)), 0);
    CHECK(cudaFreeAsync_ptsz(r[2], S(12)), 0);
    CHECK(cudaFreeHost(r[6]), 0);
    CHECK(cudaHostUnregister(buf[0]), 0);
    CHECK(cudaIpcCloseMemHandle((void *)IMPORTED), 0);

    CHECK(cuMemAlloc_v2(&d[0], 2001), 0);
    CHECK(cuMemAllocAsync(&d[1], 2002, S(21)), 0);
    CHECK(cuMemAllocAsync_ptsz(&d[2], 2003, S(22)), 0);
    CHECK(cuMemAllocFromPoolAsync(&d[3], 2004, S(90), S(23)), 0);
    CHECK(cuMemAllocFromPoolAsync_ptsz(&d[4], 2005, S(90), S(24)), 0);
    CHECK(cuMemAllocManaged(&d[5], 2006, 1), 0);
    CHECK(cuMemAllocHost_v2(&h[0], 2007), 0);
    CHECK(cuMemHostAlloc(&h[1], 2008, 0), 0);
    CHECK(cuMemHostRegister_v2(buf[1], 2009, 0), 0);
    CHECK(cuMemFree_v2(d[0]), 0);
    CHECK(cuMemFreeAsync(d[1], S(31)), 0);
    CHECK(cuMemFreeAsync_ptsz(d[2], S(32)), 0);
    CHECK(cuMemFreeHost(h[0]), 0);
    CHECK(cuMemHostUnregister(buf[1]), 0);
    CHECK(cuIpcCloseMemHandle(IMPORTED + 4096), 0);
    return 0;
}
