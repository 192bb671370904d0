/* A fault after two allocations, by argv[1]: segv (a write through NULL), bus (a read of a
   mapped page past its file's end), fpe (an integer division by zero), ill (an invalid
   instruction). The process dies by that signal, with or without the shim. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "cuda_stub.h"
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    for (int i = 0; i < 2; i++) { void *p; CHECK(cudaMalloc(&p, 4096), 0); }
    if (!strcmp(argv[1], "segv")) {
        *(volatile int *)0 = 1;
    } else if (!strcmp(argv[1], "bus")) {
        char name[] = "/tmp/p_fault_XXXXXX";
        int fd = mkstemp(name);
        unlink(name);
        if (fd < 0 || ftruncate(fd, 4096) != 0) return 2;
        volatile char *m = mmap(0, 4096, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED || ftruncate(fd, 0) != 0) return 2;
        return m[0];
    } else if (!strcmp(argv[1], "fpe")) {
        volatile int n = 7, zero = 0;
        return n / zero;
    } else if (!strcmp(argv[1], "ill")) {
        __builtin_trap();
    }
    return 2;
}
