/* The parent records until its trace file DIR/<pid>.mtrace (argv[1]) reaches LIMIT bytes
   (argv[2], MEMTRACE_MAX_BYTES), then forks; the child makes 5 allocations and exits, the
   parent waits for it. Prints "child <pid>". */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cuda_stub.h"
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    char path[4096];
    snprintf(path, sizeof path, "%s/%d.mtrace", argv[1], (int)getpid());
    long limit = atol(argv[2]);
    void *p;
    struct stat st;
    for (int i = 0; i < 2000; i++) {
        CHECK(cudaMalloc(&p, 100), 0);
        if (stat(path, &st) == 0 && st.st_size >= limit) break;
    }
    for (int i = 0; i < 500 && (stat(path, &st) != 0 || st.st_size < limit); i++) usleep(10000);
    if (stat(path, &st) != 0 || st.st_size < limit) { fprintf(stderr, "limit not reached\n"); return 1; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        for (int i = 0; i < 5; i++) CHECK(cudaMalloc(&p, 200), 0);
        return 0;
    }
    printf("child %d\n", (int)pid);
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
