/* SIGHUP and SIGQUIT handlers installed before the first CUDA call (one plain, one SA_SIGINFO)
   still run, once each, and the program goes on: exit 0 when both ran, 1 when not. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include "cuda_stub.h"
static volatile sig_atomic_t hup, quit;
static void on_hup(int s) { (void)s; hup++; }
static void on_quit(int s, siginfo_t *i, void *c) { (void)s; (void)i; (void)c; quit++; }
int main(void) {
    signal(SIGHUP, on_hup);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_quit;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGQUIT, &sa, 0);
    void *p;
    CHECK(cudaMalloc(&p, 4096), 0);
    raise(SIGHUP);
    raise(SIGQUIT);
    CHECK(cudaFree(p), 0);
    if (hup != 1 || quit != 1) {
        fprintf(stderr, "handlers ran %d and %d times\n", (int)hup, (int)quit);
        return 1;
    }
    return 0;
}
