/* What an idle traced program pays for the writer thread: one allocation (the shim is
 * running), then SECONDS of sleep, as a training step waiting on the GPU makes no CUDA calls.
 * Prints the process's CPU seconds (user + system) over the sleep and the context switches its
 * threads made over it (the writer's wake-ups), read from /proc. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include "cuda_stub.h"

static double cpu_seconds(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

/* Voluntary context switches, summed over the process's threads. */
static long switches(void) {
    long sum = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[300], line[256];
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "voluntary_ctxt_switches:", 24)) sum += atol(line + 24);
        fclose(f);
    }
    closedir(d);
    return sum;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    if (!(seconds > 0)) {
        fprintf(stderr, "bench_idle: SECONDS must be a positive number of seconds, got '%s'\n", argv[1]);
        return 2;
    }
    void *p = 0;
    cudaMalloc(&p, 1 << 20);
    usleep(100000); /* the writer has drained the allocation and gone idle */
    double c0 = cpu_seconds();
    long s0 = switches();
    usleep((useconds_t)(seconds * 1e6));
    double c1 = cpu_seconds();
    long s1 = switches();
    cudaFree(p);
    printf("cpu_ms_per_s %.3f wakeups_per_s %.0f\n", (c1 - c0) * 1e3 / seconds, (s1 - s0) / seconds);
    return 0;
}
