/* A SIGSEGV handler installed before the first CUDA call that restores the default action,
   makes the faulting page writable and returns: the write runs again, succeeds, and the program
   goes on (two more allocations, two frees) and exits 0 by exit(). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "cuda_stub.h"
static char *page;
static void fix(int s) {
    signal(s, SIG_DFL);
    mprotect(page, 4096, PROT_READ | PROT_WRITE);
}
int main(void) {
    page = mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fix;
    sigaction(SIGSEGV, &sa, 0);
    void *p[3];
    CHECK(cudaMalloc(&p[0], 4096), 0);
    *(volatile char *)page = 1;
    if (page[0] != 1) return 3;
    CHECK(cudaMalloc(&p[1], 4096), 0);
    CHECK(cudaMalloc(&p[2], 4096), 0);
    CHECK(cudaFree(p[1]), 0);
    CHECK(cudaFree(p[2]), 0);
    exit(0);
}
