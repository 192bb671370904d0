/* A SIGINT handler installed with SA_RESETHAND before the first CUDA call runs once: the second
   SIGINT has the default action and ends the program (which never prints "survived"). */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "cuda_stub.h"
static void on_int(int s) { (void)s; write(2, "handler\n", 8); }
int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_int;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigaction(SIGINT, &sa, 0);
    void *p;
    CHECK(cudaMalloc(&p, 4096), 0);
    raise(SIGINT);
    raise(SIGINT);
    fprintf(stderr, "survived\n");
    return 0;
}
