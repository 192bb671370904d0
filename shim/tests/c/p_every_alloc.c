/* Every allocation and free entry point with the common shapes (an out-pointer and a size, or an
 * address), every pitched allocation, IPC open, pool trim and VMM call on an address range, once
 * each, with distinct sizes, streams and addresses: the test checks each record's API, memory
 * kind (or VMM operation), address, size, stream and caller, so that a hook recording the wrong
 * one shows. Runtime calls reach the driver inside the stub runtime and are recorded once, as the
 * runtime call. */
#include <stdio.h>
#include <string.h>
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
int cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height);
int cuMemAllocPitch_v2(unsigned long long *p, size_t *pitch, size_t width, size_t height, unsigned elem);
typedef struct { char reserved[64]; } ipc_handle;
int cudaIpcOpenMemHandle(void **p, ipc_handle h, unsigned flags);
int cuIpcOpenMemHandle_v2(unsigned long long *p, ipc_handle h, unsigned flags);
int cuMemPoolTrimTo(void *pool, size_t keep);
int cuMemAddressReserve(unsigned long long *p, size_t size, size_t align, unsigned long long addr, unsigned long long flags);
int cuMemAddressFree(unsigned long long p, size_t size);
int cuMemUnmap(unsigned long long p, size_t size);
int cuMemSetAccess(unsigned long long p, size_t size, const void *desc, size_t count);

/* Stream handles: opaque values the shim records as they are. */
#define S(n) ((void *)(0x5000ull + (n)))
/* An address no allocation returned: what an IPC open returns (the stubs return the handle's
 * first 8 bytes) and its close is given. */
#define IMPORTED 0x7e0000000000ull
/* Where the VMM calls work: a reservation the stub driver places at this hint. */
#define VA 0x7c0000000000ull

static ipc_handle handle_of(unsigned long long addr) {
    ipc_handle h;
    memset(&h, 0, sizeof h);
    memcpy(h.reserved, &addr, sizeof addr);
    return h;
}

int main(void) {
    void *r[10], *h[3];
    unsigned long long d[9], va = 0;
    size_t pitch[3] = {0, 0, 0};
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
    /* The stub's pitch is the width rounded up to 512: 512 × 3 bytes. */
    CHECK(cudaMallocPitch(&r[8], &pitch[0], 100, 3), 0);
    CHECK(cudaIpcOpenMemHandle(&r[9], handle_of(IMPORTED), 1), 0);
    CHECK(cudaMemPoolTrimTo(S(91), 1011), 0);
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
    /* 1024 × 5 bytes; then a height whose pitch × height overflows (the stub fails it). */
    CHECK(cuMemAllocPitch_v2(&d[6], &pitch[1], 1000, 5, 4), 0);
    CHECK(cuMemAllocPitch_v2(&d[7], &pitch[2], 1 << 20, 1ull << 50, 4), 2);
    CHECK(cuIpcOpenMemHandle_v2(&d[8], handle_of(IMPORTED + 4096), 1), 0);
    CHECK(cuMemPoolTrimTo(S(92), 2011), 0);
    CHECK(cuMemFree_v2(d[0]), 0);
    CHECK(cuMemFreeAsync(d[1], S(31)), 0);
    CHECK(cuMemFreeAsync_ptsz(d[2], S(32)), 0);
    CHECK(cuMemFreeHost(h[0]), 0);
    CHECK(cuMemHostUnregister(buf[1]), 0);
    CHECK(cuIpcCloseMemHandle(IMPORTED + 4096), 0);

    /* VMM calls on ranges of a reservation at a known address. */
    CHECK(cuMemAddressReserve(&va, 0x10000, 0, VA, 0), 0);
    CHECK(va == VA, 1);
    CHECK(cuMemSetAccess(VA + 0x1000, 0x3000, buf, 1), 0);
    CHECK(cuMemUnmap(VA + 0x2000, 0x2000), 0);
    CHECK(cuMemAddressFree(VA, 0x10000), 0);
    return 0;
}
