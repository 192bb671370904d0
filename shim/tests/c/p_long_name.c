/* A kernel whose name (cuFuncGetName) is 2 MiB and 3 bytes long: 'k's and a closing 'é'. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_stub.h"
typedef struct { const char *name; } stub_func; /* the stub driver's function handle */
/* Static: the writer asks the handle's name after the launch, up to the exit. */
static stub_func f;
int main(void) {
    size_t n = (2u << 20) + 1;
    char *name = malloc(n + 3);
    memset(name, 'k', n);
    memcpy(name + n, "\xc3\xa9", 3);
    f.name = name;
    CHECK(cuLaunchKernel(&f, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0), 0);
    return 0;
}
