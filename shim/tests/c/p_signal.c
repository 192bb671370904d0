/* Allocates, says "ready", then waits to be killed (SIGTERM or SIGKILL by the test). */
#include <stdio.h>
#include <unistd.h>
#include "cuda_stub.h"
int main(void) {
    for (int i = 0; i < 100; i++) { void *p; CHECK(cudaMalloc(&p, 4096), 0); }
    printf("ready\n");
    fflush(stdout);
    for (;;) pause();
}
