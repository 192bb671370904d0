/* A daemon-style program: allocates, then frees its descriptors as `daemon`/close_fds do and
   opens its own output file, allocates more and writes the file. argv[2] says how:
   "bulk"  closes 3..1023 (the trace's descriptor number is then free for the program's file);
   "steal" finds the trace's descriptor whatever its number, closes it and puts its own file
           under that very number (dup2), as a program closing every descriptor up to its limit
           and reopening may. Either way the output file must hold the program's bytes only. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cuda_stub.h"
/* The trace's descriptor, -1 until the writer has opened it. */
static int trace_fd(void) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char link[64], target[4096];
    int found = -1;
    while (d && (e = readdir(d)) != 0) {
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(link, target, sizeof target - 1);
        if (len > 7 && memcmp(target + len - 7, ".mtrace", 7) == 0) found = atoi(e->d_name);
    }
    if (d) closedir(d);
    return found;
}
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    void *p;
    for (int i = 0; i < 100; i++) CHECK(cudaMalloc(&p, 4096), 0);
    int t = -1;
    /* Until the trace is open where it stays: the shim opens it low, then moves it. */
    for (int i = 0; i < 500 && (t = trace_fd()) < 64; i++) usleep(10000);
    int out;
    if (strcmp(argv[2], "steal") == 0) {
        if (t < 0) return 3;
        /* After the writer's first batch: one taken between its check and its write would go to
           this file (no call checks and writes at once), and a steal just as the file opens
           would meet the first batch's write. */
        struct stat st;
        for (int i = 0; i < 500 && fstat(t, &st) == 0 && st.st_size == 0; i++) usleep(10000);
        close(t);
        int f = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (f < 0 || dup2(f, t) != t) return 4;
        close(f);
        out = t;
    } else {
        for (int fd = 3; fd < 1024; fd++) close(fd);
        out = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    for (int i = 0; i < 1000; i++) CHECK(cudaMalloc(&p, 4096), 0);
    usleep(200000); /* the writer flushes every 50 ms */
    const char msg[] = "PROGRAM OUTPUT\n";
    if (write(out, msg, sizeof msg - 1) != sizeof msg - 1) return 5;
    close(out);
    return 0;
}
