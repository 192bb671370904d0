/* PyTorch expandable segments: cuMem* VMM calls through cudaGetDriverEntryPointByVersion. */
#include <stdio.h>
#include "cuda_stub.h"
#define GET(var, name) CHECK(cudaGetDriverEntryPointByVersion(name, (void **)&var, 12000, 0, &st), 0)
int main(void) {
    int st;
    int (*create)(unsigned long long *, size_t, const void *, unsigned long long);
    int (*reserve)(unsigned long long *, size_t, size_t, unsigned long long, unsigned long long);
    int (*map)(unsigned long long, size_t, size_t, unsigned long long, unsigned long long);
    int (*access)(unsigned long long, size_t, const void *, size_t);
    int (*unmap)(unsigned long long, size_t);
    int (*release)(unsigned long long);
    int (*afree)(unsigned long long, size_t);
    int (*gpa)(const char *, void **, int, unsigned long long, int *);
    int (*alloc)(unsigned long long *, size_t);
    GET(create, "cuMemCreate"); GET(reserve, "cuMemAddressReserve"); GET(map, "cuMemMap");
    GET(access, "cuMemSetAccess"); GET(unmap, "cuMemUnmap"); GET(release, "cuMemRelease");
    GET(afree, "cuMemAddressFree"); GET(gpa, "cuGetProcAddress");
    const size_t size = 2 << 20;
    unsigned long long va, h;
    CHECK(reserve(&va, 4 * size, 0, 0, 0), 0);
    CHECK(create(&h, size, 0, 0), 0);
    CHECK(map(va, size, 0, h, 0), 0);
    CHECK(access(va, size, 0, 1), 0);
    CHECK(unmap(va, size), 0);
    CHECK(release(h), 0);
    CHECK(afree(va, 4 * size), 0);
    /* A resolver handed out by a resolver stays hooked. */
    CHECK(gpa("cuMemAlloc", (void **)&alloc, 12000, 0, &st), 0);
    unsigned long long d;
    CHECK(alloc(&d, 4096), 0);
    return 0;
}
