/* fail_malloc.so: an LD_PRELOAD allocator for out-of-memory tests of whole
 * programs (tprun), which cannot link tests/unit/alloc_fault.h.
 *
 *   TP_FAIL_MALLOC_MIN, TP_FAIL_MALLOC_MAX  a size range in bytes
 *   TP_FAIL_MALLOC_NTH                      which malloc in that range fails
 *                                           (1 = the first); the others succeed
 *
 * Only malloc is replaced, and every call it does not fail goes to the next
 * malloc (glibc's or a sanitizer's), so free stays matched. The constructor
 * takes LD_PRELOAD out of the environment: the program's children run
 * without the shim. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>

typedef void *(*malloc_fn)(size_t);

static malloc_fn next_malloc;
static size_t fail_min, fail_max;
static long fail_nth, seen;

static long env_long(const char *name) {
    const char *s = getenv(name);
    return s ? strtol(s, NULL, 10) : 0;
}

__attribute__((constructor)) static void fail_malloc_init(void) {
    next_malloc = (malloc_fn)dlsym(RTLD_NEXT, "malloc");
    fail_min = (size_t)env_long("TP_FAIL_MALLOC_MIN");
    fail_max = (size_t)env_long("TP_FAIL_MALLOC_MAX");
    fail_nth = env_long("TP_FAIL_MALLOC_NTH");
    unsetenv("LD_PRELOAD");
}

void *malloc(size_t n) {
    if (!next_malloc) {
        /* A malloc before the constructor ran (another library's
         * constructor): resolve now. dlsym does not allocate for a symbol it
         * finds. */
        next_malloc = (malloc_fn)dlsym(RTLD_NEXT, "malloc");
        if (!next_malloc)
            return NULL;
    }
    if (fail_nth > 0 && n >= fail_min && n <= fail_max && ++seen == fail_nth)
        return NULL;
    return next_malloc(n);
}
