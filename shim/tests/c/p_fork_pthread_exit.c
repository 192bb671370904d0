/* Under MEMTRACE_CUPTI=1 the parent's first call starts CUPTI and the thread that flushes it at a
 * fatal signal; a fork child has neither (fork copies only the calling thread). The child's main
 * leaves by pthread_exit after an allocation and a free: the child must end once its writer has
 * completed its trace, not wait for the parent's flush thread as one of the shim's own. The
 * parent waits for it (20 s at most), says how it ended, and frees. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "cuda_stub.h"
int main(void) {
    void *a, *b;
    CHECK(cudaMalloc(&a, 1000), 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        if (cudaMalloc(&b, 2000) != 0 || cudaFree(b) != 0) _exit(2);
        pthread_exit(0);
    }
    int status = 0;
    for (int i = 0; i < 2000; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            printf("child %s %d\n", WIFEXITED(status) ? "exited" : "killed by",
                   WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            CHECK(cudaFree(a), 0);
            return 0;
        }
        struct timespec step = {0, 10000000};
        nanosleep(&step, 0);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    printf("child hung\n");
    return 1;
}
