/* fork: the child prints its pid, allocates twice; the parent allocates once before and frees
 * after the child exits. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cuda_stub.h"
int main(void) {
    void *a, *b, *c;
    CHECK(cudaMalloc(&a, 1000), 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        CHECK(cudaMalloc(&b, 2000), 0);
        CHECK(cudaMalloc(&c, 3000), 0);
        CHECK(cudaFree(b), 0);
        return 0;
    }
    printf("child %d\n", (int)pid);
    int status;
    waitpid(pid, &status, 0);
    CHECK(cudaFree(a), 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
