/* main leaves by pthread_exit with the descriptors all but used up, while a worker still
   allocates: the writer must not take an unreadable thread for an ended one. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include "cuda_stub.h"
static void *work(void *arg) {
    (void)arg;
    for (int i = 0; i < 15; i++) {
        void *p;
        usleep(60000);
        if (cudaMalloc(&p, 4096) != 0) return 0;
    }
    return 0;
}
int main(void) {
    void *p;
    CHECK(cudaMalloc(&p, 4096), 0);
    pthread_t t;
    pthread_create(&t, 0, work, 0);
    int last = -1, fd;
    while ((fd = open("/dev/null", O_RDONLY)) >= 0) last = fd;
    if (last >= 0) close(last); /* one left: the writer's listing takes it */
    pthread_exit(0);
}
