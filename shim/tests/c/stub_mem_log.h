/* The stub driver's allocation log (stub_cuda.c), which the stub libcupti (stub_cupti.c) turns
 * into MEMORY2 records: one definition of the entry both libraries share. `op` and `kind` are
 * already CUPTI's values (CUpti_ActivityMemoryOperationType, CUpti_ActivityMemoryKind). */
#ifndef STUB_MEM_LOG_H
#define STUB_MEM_LOG_H
#include <stdint.h>

typedef struct { uint64_t ts, addr, bytes; uint32_t op, kind, ready, pad; } stub_mem_op;
enum { MEM_ALLOC = 1, MEM_RELEASE = 2, MEM_PINNED = 2, MEM_DEVICE = 3 };

/* The published prefix of the log (defined in stub_cuda.c). */
unsigned stub_cuda_mem_log(const stub_mem_op **ops);
#endif
