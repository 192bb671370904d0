/* main leaves by pthread_exit with the descriptors all but used up, while a worker still
   allocates: the writer must not take an unreadable thread for an ended one. The worker gives
   the descriptors back as it ends, as a program's last thread would, so the process can end. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include "cuda_stub.h"
static int first = -1, last = -1;
static void *work(void *arg) {
    (void)arg;
    for (int i = 0; i < 15; i++) {
        void *p;
        usleep(60000);
        if (cudaMalloc(&p, 4096) != 0) return 0;
    }
    for (int fd = first; fd >= 0 && fd <= last; fd++) close(fd);
    return 0;
}
int main(void) {
    void *p;
    CHECK(cudaMalloc(&p, 4096), 0);
    int fd;
    while ((fd = open("/dev/null", O_RDONLY)) >= 0) {
        if (first < 0) first = fd;
        last = fd;
    }
    if (last >= 0) close(last--); /* one left: the writer reads one file at a time */
    pthread_t t;
    pthread_create(&t, 0, work, 0);
    pthread_exit(0);
}
