/* A SIGINT handler installed without SA_RESTART before the first CUDA call: a blocking read
   interrupted by SIGINT fails with EINTR, as without the shim. Exit 0 when it does; a restarted
   read never returns and SIGALRM ends the program. The child signals once the parent sleeps. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "cuda_stub.h"
static volatile sig_atomic_t caught;
static void on_int(int s) { (void)s; caught = 1; }
int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_int;
    sigaction(SIGINT, &sa, 0);
    void *p;
    CHECK(cudaMalloc(&p, 4096), 0);
    int fds[2];
    if (pipe(fds)) return 2;
    alarm(5);
    pid_t parent = getpid();
    if (fork() == 0) {
        /* Signal once the parent sleeps in read() (its state in /proc is S), waiting at most 3 s. */
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)parent);
        for (int i = 0; i < 3000; i++) {
            char buf[512];
            FILE *f = fopen(path, "r");
            size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
            if (f) fclose(f);
            buf[n] = 0;
            char *e = strrchr(buf, ')');
            if (e && e[1] == ' ' && e[2] == 'S') break;
            usleep(1000);
        }
        usleep(10000);
        kill(parent, SIGINT);
        _exit(0);
    }
    char c;
    ssize_t r = read(fds[0], &c, 1);
    if (r != -1 || errno != EINTR || !caught) {
        fprintf(stderr, "read returned %zd (%s), caught %d\n", r, r < 0 ? strerror(errno) : "-", (int)caught);
        return 1;
    }
    CHECK(cudaFree(p), 0);
    return 0;
}
