/* libcudart reachable only through an RTLD_LOCAL dlopen. */
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *lib = dlopen("libuser.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    int (*work)(void) = (int (*)(void))dlsym(lib, "do_work");
    return work ? work() : 1;
}
