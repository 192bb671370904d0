/* quick_exit(5) after one allocation: atexit handlers do not run, at_quick_exit ones do (the
   program's own prints "own handler"). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "cuda_stub.h"
static void own(void) { write(2, "own handler\n", 12); }
int main(void) {
    at_quick_exit(own);
    void *p;
    CHECK(cudaMalloc(&p, 4096), 0);
    quick_exit(5);
}
