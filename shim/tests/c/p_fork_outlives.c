/* fork after the parent's trace is open; the parent exits while the child lives on (a daemon,
 * a data-loader worker), waiting on stdin, with no CUDA call of its own. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cuda_stub.h"
int main(void) {
    void *a;
    CHECK(cudaMalloc(&a, 1000), 0);
    /* The writer opens the trace on its own thread: fork once its header is there. */
    const char *out = getenv("MEMTRACE_OUT");
    struct stat st;
    for (int i = 0; i < 3000 && !(out && stat(out, &st) == 0 && st.st_size > 0); i++) usleep(10000);
    fflush(stdout);
    if (fork() == 0) {
        /* Fork handlers have run: the inherited trace descriptor is closed. Until the child is
           first scheduled it still holds it (Linux has no close-on-fork), so the test waits for
           this byte. */
        char c = 'r';
        if (write(1, &c, 1) != 1) return 1;
        while (read(0, &c, 1) > 0) {}
        return 0;
    }
    CHECK(cudaFree(a), 0);
    return 0;
}
