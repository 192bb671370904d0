/* main leaves by pthread_exit with the descriptors all but used up, while a worker still
   allocates: the writer must not take an unreadable thread for an ended one. The worker gives
   back the descriptors main took, as a program's last thread would, so the process can end.
   Only those: the writer may have opened its trace while main took them, between two of its. */
#include <dirent.h>
#include <fcntl.h>
#include <string.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include "cuda_stub.h"
static int taken[4096], n = 0;
static void *work(void *arg) {
    (void)arg;
    for (int i = 0; i < 15; i++) {
        void *p;
        usleep(60000);
        if (cudaMalloc(&p, 4096) != 0) return 0;
    }
    for (int i = 0; i < n; i++) close(taken[i]);
    return 0;
}
/* The writer opens the trace on its own thread: wait for it, or main's descriptors could
   leave it none. */
static int trace_open(void) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char link[64], target[4096];
    int found = 0;
    while (d && (e = readdir(d)) != 0) {
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(link, target, sizeof target - 1);
        if (len > 7 && memcmp(target + len - 7, ".mtrace", 7) == 0) found = 1;
    }
    if (d) closedir(d);
    return found;
}
int main(void) {
    void *p;
    CHECK(cudaMalloc(&p, 4096), 0);
    for (int i = 0; i < 500 && !trace_open(); i++) usleep(10000);
    int fd;
    while (n < 4096 && (fd = open("/dev/null", O_RDONLY)) >= 0) taken[n++] = fd;
    if (n > 0) close(taken[--n]); /* one left: the writer reads one file at a time */
    pthread_t t;
    pthread_create(&t, 0, work, 0);
    pthread_exit(0);
}
