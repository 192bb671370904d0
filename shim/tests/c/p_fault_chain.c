/* A SIGSEGV handler installed before the first CUDA call, by argv[1]:
   recover: it jumps back (a JVM's null check): the program goes on, frees, exits 0;
   reset: it says "handler", restores the default action and returns (a plain C handler,
   Rust's for a fault not on a stack guard), so the fault comes back and kills;
   raise: as reset, raising the signal again before it returns (pending until then);
   overflow: as reset, on an alternate stack (SA_ONSTACK), after a stack overflow. */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cuda_stub.h"
static sigjmp_buf back;
static int again;
static void recover(int s) { (void)s; siglongjmp(back, 1); }
static void reset(int s) {
    write(2, "handler\n", 8);
    signal(s, SIG_DFL);
    if (again) raise(s);
}
static int deep(int n) {
    volatile char pad[1024];
    pad[0] = (char)n;
    return deep(n + 1) + pad[0];
}
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    again = !strcmp(argv[1], "raise");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = strcmp(argv[1], "recover") ? reset : recover;
    if (!strcmp(argv[1], "overflow")) {
        stack_t st = { .ss_sp = malloc(1 << 16), .ss_size = 1 << 16, .ss_flags = 0 };
        sigaltstack(&st, 0);
        sa.sa_flags = SA_ONSTACK;
    }
    sigaction(SIGSEGV, &sa, 0);
    void *p;
    CHECK(cudaMalloc(&p, 4096), 0);
    if (!strcmp(argv[1], "overflow")) return deep(0);
    if (sigsetjmp(back, 1) == 0) *(volatile int *)0 = 1;
    if (!strcmp(argv[1], "reset") || again) return 3;
    CHECK(cudaFree(p), 0);
    return 0;
}
