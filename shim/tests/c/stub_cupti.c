/* Stub libcupti.so.13: the activity API calls the shim's CUPTI layer makes, no GPU.
 * At the first cuptiActivityFlushAll it delivers three synthetic CONCURRENT_KERNEL records
 * through the registered buffer callbacks; at every flush, one MEMORY2 record for each device or
 * pinned allocation and release the stub driver (stub_cuda.c) made since MEMORY2 was enabled and
 * not yet reported, as real CUPTI reports only what happens while it is enabled. Its clock is
 * CLOCK_MONOTONIC + STUB_CLOCK_OFFSET, so the shim's conversion to the trace clock is exercised.
 * STUB_CUPTI=busy: cuptiSubscribe fails with CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, as
 * under torch.profiler or nsys.
 * STUB_CUPTI=nomem: cuptiActivityEnable(MEMORY2) fails with CUPTI_ERROR_INVALID_KIND, as an old
 * CUPTI would.
 * STUB_CUPTI=hang: cuptiActivityFlushAll never returns, as when the thread a signal interrupted
 * holds a lock CUPTI's flush needs. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stub_mem_log.h"

/* CUpti_ActivityKernel10 (CUDA 13.0, cupti_activity.h); offsets pinned by the shim's
 * cupti::tests::kernel_record_layout_matches_the_stub against cudarc's bindings. */
typedef struct {
    uint32_t kind;
    uint8_t cacheConfig, sharedMemoryConfig;
    uint16_t registersPerThread;
    uint32_t partitionedGlobalCacheRequested, partitionedGlobalCacheExecuted;
    uint64_t start, end, completed;
    uint32_t deviceId, contextId, streamId;
    int32_t gridX, gridY, gridZ, blockX, blockY, blockZ;
    int32_t staticSharedMemory, dynamicSharedMemory;
    uint32_t localMemoryPerThread, localMemoryTotal, correlationId;
    int64_t gridId;
    const char *name;
    void *reserved0;
    uint64_t queued, submitted;
    uint8_t launchType, isSharedMemoryCarveoutRequested, sharedMemoryCarveoutRequested, padding;
    uint32_t sharedMemoryExecuted;
    uint64_t graphNodeId;
    uint32_t shmemLimitConfig, graphId;
    void *pAccessPolicyWindow;
    uint32_t channelID, channelType, clusterX, clusterY, clusterZ, clusterSchedulingPolicy;
    uint64_t localMemoryTotal_v2;
    uint32_t maxPotentialClusterSize, maxActiveClusters;
    uint8_t isDeviceLaunched, padding3[7];
} kernel10;
_Static_assert(offsetof(kernel10, registersPerThread) == 6, "layout");
_Static_assert(offsetof(kernel10, start) == 16, "layout");
_Static_assert(offsetof(kernel10, streamId) == 48, "layout");
_Static_assert(offsetof(kernel10, gridX) == 52, "layout");
_Static_assert(offsetof(kernel10, blockX) == 64, "layout");
_Static_assert(offsetof(kernel10, staticSharedMemory) == 76, "layout");
_Static_assert(offsetof(kernel10, correlationId) == 92, "layout");
_Static_assert(offsetof(kernel10, name) == 104, "layout");
_Static_assert(sizeof(kernel10) == 216, "layout");

/* CUpti_ActivityMemory4 (CUDA 12.6+); offsets pinned by the shim's
 * cupti::tests::memory_record_layout_matches_the_stub. */
typedef struct {
    uint32_t kind, memoryOperationType, memoryKind, correlationId;
    uint64_t address, bytes, timestamp, PC;
    uint32_t processId, deviceId, contextId, streamId;
    const char *name;
    uint32_t isAsync, pad1;
    uint32_t memoryPoolType, pad2;
    uint64_t poolAddress, releaseThreshold, poolSize, utilizedSize;
    const char *source;
} memory4;
_Static_assert(offsetof(memory4, memoryKind) == 8, "layout");
_Static_assert(offsetof(memory4, address) == 16, "layout");
_Static_assert(offsetof(memory4, PC) == 40, "layout");
_Static_assert(offsetof(memory4, deviceId) == 52, "layout");
_Static_assert(offsetof(memory4, streamId) == 60, "layout");
_Static_assert(offsetof(memory4, isAsync) == 72, "layout");
_Static_assert(offsetof(memory4, memoryPoolType) == 80, "layout");
_Static_assert(offsetof(memory4, poolAddress) == 88, "layout");
_Static_assert(sizeof(memory4) == 128, "layout");

/* The stub driver's log, looked up in the loaded libcuda.so.1 (as the real CUPTI reaches the
 * driver it runs with, even one a runtime loaded RTLD_LOCAL); absent with another libcuda. */
typedef unsigned (*mem_log_t)(const stub_mem_op **ops);
static mem_log_t mem_log(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return h ? (mem_log_t)dlsym(h, "stub_cuda_mem_log") : 0;
}

enum {
    OK = 0, MAX_LIMIT_REACHED = 12, INVALID_KIND = 21, MULTIPLE_SUBSCRIBERS = 39,
    KIND_CONCURRENT_KERNEL = 10, KIND_MEMORY2 = 49
};
#define STUB_CLOCK_OFFSET 7000000000ull

typedef void (*requested_t)(uint8_t **buf, size_t *size, size_t *max);
typedef void (*completed_t)(void *ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid);
static requested_t requested;
static completed_t completed;
static int kernels_on, delivered, memory_on;
static uint64_t enabled_at, memory_enabled_at;
static unsigned memory_reported; /* log entries looked at so far */

static uint64_t stub_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec + STUB_CLOCK_OFFSET;
}

int cuptiSubscribe(void **sub, void *cb, void *user) {
    (void)cb; (void)user;
    const char *m = getenv("STUB_CUPTI");
    if (m && strcmp(m, "busy") == 0) return MULTIPLE_SUBSCRIBERS;
    *sub = (void *)0x5;
    return OK;
}
int cuptiEnableCallback(uint32_t enable, void *sub, int domain, uint32_t cbid) {
    (void)enable; (void)sub; (void)domain; (void)cbid;
    return OK;
}
int cuptiActivityRegisterCallbacks(requested_t req, completed_t comp) {
    requested = req; completed = comp;
    return OK;
}
int cuptiGetTimestamp(uint64_t *t) { *t = stub_now(); return OK; }
int cuptiActivityEnable(uint32_t kind) {
    if (kind == KIND_CONCURRENT_KERNEL) { kernels_on = 1; enabled_at = stub_now(); }
    if (kind == KIND_MEMORY2) {
        const char *m = getenv("STUB_CUPTI");
        if (m && strcmp(m, "nomem") == 0) return INVALID_KIND;
        memory_on = 1; memory_enabled_at = stub_now();
    }
    return OK;
}
int cuptiActivityGetNumDroppedRecords(void *ctx, uint32_t stream, size_t *dropped) {
    (void)ctx; (void)stream; *dropped = 0;
    return OK;
}
static size_t record_size(const uint8_t *rec) {
    uint32_t kind;
    memcpy(&kind, rec, sizeof kind);
    return kind == KIND_MEMORY2 ? sizeof(memory4) : sizeof(kernel10);
}
int cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, void **rec) {
    uint8_t *next = *rec ? (uint8_t *)*rec + record_size(*rec) : buf;
    if (next + sizeof(uint32_t) > buf + valid || next + record_size(next) > buf + valid) return MAX_LIMIT_REACHED;
    *rec = next;
    return OK;
}
static const char *names[3] = {"cupti_kernel_a", "cupti_kernel_b", "cupti_kernel_a"};
/* The three kernel records; returns the bytes written. */
static size_t kernel_records(uint8_t *buf) {
    static const char *shared_a;
    for (int i = 0; i < 3; i++) {
        kernel10 k;
        memset(&k, 0, sizeof k);
        k.kind = KIND_CONCURRENT_KERNEL;
        k.registersPerThread = (uint16_t)(10 + i);
        k.start = enabled_at + 1000u * (uint64_t)i;
        k.end = k.start + 1000u * (uint64_t)(i + 1);
        k.streamId = 7;
        k.gridX = i + 1; k.gridY = 2; k.gridZ = 3;
        k.blockX = 32 * (i + 1); k.blockY = 1; k.blockZ = 1;
        k.staticSharedMemory = 100 + i;
        k.dynamicSharedMemory = 200 + i;
        k.correlationId = 1000u + (uint32_t)i;
        /* Records of the same kernel share one name pointer, as in CUPTI. */
        if (i == 0) shared_a = names[0];
        k.name = i == 2 ? shared_a : names[i];
        memcpy(buf + i * sizeof(kernel10), &k, sizeof k);
    }
    return 3 * sizeof(kernel10);
}
/* MEMORY2 records for the driver's operations since the last flush; returns the bytes written. */
static size_t memory_records(uint8_t *out, size_t room) {
    mem_log_t log = memory_on ? mem_log() : 0;
    if (!log) return 0;
    const stub_mem_op *ops;
    unsigned n = log(&ops);
    size_t used = 0;
    for (; memory_reported < n && used + sizeof(memory4) <= room; memory_reported++) {
        const stub_mem_op *o = &ops[memory_reported];
        uint64_t ts = o->ts + STUB_CLOCK_OFFSET;
        if (ts < memory_enabled_at) continue;
        memory4 m;
        memset(&m, 0, sizeof m);
        m.kind = KIND_MEMORY2;
        m.memoryOperationType = o->op;
        m.memoryKind = o->kind;
        m.correlationId = 2000u + memory_reported;
        m.address = o->addr;
        m.bytes = o->bytes;
        m.timestamp = ts;
        m.PC = 0x1000u + memory_reported;
        m.streamId = 0xffffffffu; /* CUPTI_INVALID_STREAM_ID: not stream-ordered */
        memcpy(out + used, &m, sizeof m);
        used += sizeof m;
    }
    return used;
}
int cuptiActivityFlushAll(uint32_t flag) {
    (void)flag;
    const char *m = getenv("STUB_CUPTI");
    if (m && strcmp(m, "hang") == 0)
        for (;;) sleep(1000);
    if (!requested || !completed) return OK;
    uint8_t *buf = 0; size_t size = 0, max = 0;
    requested(&buf, &size, &max);
    if (!buf || size < 3 * sizeof(kernel10)) return OK;
    size_t used = 0;
    if (kernels_on && !delivered) {
        delivered = 1;
        used = kernel_records(buf);
    }
    used += memory_records(buf + used, size - used);
    completed(0, 0, buf, size, used);
    return OK;
}
