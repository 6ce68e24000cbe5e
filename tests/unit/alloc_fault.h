/*
 * alloc_fault.h: malloc and calloc that fail on demand, for the tests of
 * out-of-memory paths. Both are interposed: the executable's definitions
 * come first, so the library's calls come here and go on to the next
 * definition (libc's, or a sanitizer runtime's, which still sees every
 * block), except when a test asked for a failure:
 *
 *   malloc_fail_size       while nonzero, every malloc of exactly that size
 *                          fails (malloc_failed counts them);
 *   malloc_fail_next_size  nonzero: the next malloc of exactly that size on
 *                          the thread that set it fails, once (thread-local;
 *                          0 again once it did, malloc_failed counts it);
 *   calloc_countdown       the k-th calloc on the thread that set it fails
 *                          (thread-local; calloc_failed says it did);
 *   calloc_fail_n, _size   while calloc_fail_n is nonzero, every calloc of
 *                          exactly (n, size) fails (calloc_pair_failed
 *                          counts them);
 *   alloc_countdown        the k-th malloc or calloc from now, on any thread,
 *                          fails (process-wide; alloc_countdown_fired says
 *                          it did). realloc is not counted, nor are the
 *                          allocations a new thread's runtime makes before
 *                          its start routine runs (a sanitizer's thread
 *                          set-up, pthread_getattr_np: not the code under
 *                          test, and ASan aborts when they fail), so
 *                          pthread_create is interposed too;
 *   realloc_fail_min       while nonzero, every realloc to at least that
 *                          many bytes fails (realloc_failed counts them);
 *   create_fail_in         n > 0: the n-th pthread_create from now, on any
 *                          thread, fails with EAGAIN (0 once it did).
 *
 * GCC only (ALLOC_FAULT_HOOK 1): clang links a sanitizer's runtime into the
 * executable, whose allocator these would bypass. Under valgrind, which
 * replaces the allocator, nothing fails: alloc_fault_in_use() says whether
 * they are the allocator in use, and tests that need a failure skip
 * without. Include once per executable (it defines malloc and calloc);
 * define _GNU_SOURCE before any include.
 */
#ifndef TP_TESTS_ALLOC_FAULT_H
#define TP_TESTS_ALLOC_FAULT_H

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static _Atomic size_t malloc_fail_size; /* 0: none fails */
static _Thread_local size_t malloc_fail_next_size; /* 0: none fails */
static _Atomic unsigned malloc_failed;
static _Thread_local unsigned calloc_countdown; /* 0: none fails */
static _Thread_local int calloc_failed;
static _Atomic size_t calloc_fail_n, calloc_fail_size; /* n 0: none fails */
static _Atomic unsigned calloc_pair_failed;
static _Atomic long alloc_countdown; /* 0: none fails */
static _Atomic int alloc_countdown_fired;
static _Atomic size_t realloc_fail_min; /* 0: none fails */
static _Atomic unsigned realloc_failed;

#if defined(__GNUC__) && !defined(__clang__)
#define ALLOC_FAULT_HOOK 1
static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static int (*next_create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
/* The main thread, and any thread once its start routine runs. */
static _Thread_local int alloc_fault_thread_running;

/* dlsym may itself allocate: a call made while resolving fails instead of
 * recursing (before main, one thread). */
static void alloc_fault_resolve(void) {
    static _Thread_local int resolving;
    if (resolving)
        return;
    resolving = 1;
    void *m = dlsym(RTLD_NEXT, "malloc");
    void *c = dlsym(RTLD_NEXT, "calloc");
    void *r = dlsym(RTLD_NEXT, "realloc");
    void *t = dlsym(RTLD_NEXT, "pthread_create");
    memcpy(&next_malloc, &m, sizeof next_malloc);
    memcpy(&next_calloc, &c, sizeof next_calloc);
    memcpy(&next_realloc, &r, sizeof next_realloc);
    memcpy(&next_create, &t, sizeof next_create);
    resolving = 0;
}

__attribute__((constructor)) static void alloc_fault_init(void) {
    alloc_fault_thread_running = 1;
    if (!next_malloc || !next_calloc || !next_realloc || !next_create)
        alloc_fault_resolve();
}

typedef struct alloc_fault_start {
    void *(*fn)(void *);
    void *arg;
} alloc_fault_start;

static void *alloc_fault_trampoline(void *p) {
    alloc_fault_start st = *(alloc_fault_start *)p;
    free(p);
    alloc_fault_thread_running = 1;
    return st.fn(st.arg);
}

static _Atomic int create_fail_in; /* n > 0: the n-th pthread_create from now fails, EAGAIN */

/* The next pthread_create (a sanitizer's interceptor, or libc's), with the
 * start routine behind a trampoline that marks the thread as running. It was
 * resolved by the constructor, before main: no thread reads it half-written.
 * The create that create_fail_in counts down to fails before any of that. */
int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
    if (!next_create || !next_malloc)
        return EAGAIN;
    int n = atomic_load(&create_fail_in);
    while (n > 0 && !atomic_compare_exchange_weak(&create_fail_in, &n, n - 1))
        ;
    if (n == 1)
        return EAGAIN; /* as when the process is out of threads or memory */
    alloc_fault_start *st = next_malloc(sizeof *st); /* never made to fail */
    if (!st)
        return EAGAIN;
    *st = (alloc_fault_start){fn, arg};
    int rc = next_create(t, attr, alloc_fault_trampoline, st);
    if (rc != 0)
        free(st);
    return rc;
}

/* One thread only sees the count reach its end. */
static inline int alloc_countdown_ends(void) {
    if (!alloc_fault_thread_running ||
        atomic_load_explicit(&alloc_countdown, memory_order_relaxed) <= 0 ||
        atomic_fetch_sub(&alloc_countdown, 1) != 1)
        return 0;
    atomic_store(&alloc_countdown_fired, 1);
    errno = ENOMEM;
    return 1;
}

void *malloc(size_t n) {
    if (alloc_countdown_ends())
        return NULL;
    size_t fail = atomic_load_explicit(&malloc_fail_size, memory_order_relaxed);
    if (malloc_fail_next_size && n == malloc_fail_next_size) {
        malloc_fail_next_size = 0;
        fail = n;
    }
    if (fail && n == fail) {
        atomic_fetch_add(&malloc_failed, 1);
        errno = ENOMEM;
        return NULL;
    }
    if (!next_malloc)
        alloc_fault_resolve(); /* a call before the constructor ran */
    if (!next_malloc) {
        errno = ENOMEM;
        return NULL;
    }
    return next_malloc(n);
}

void *calloc(size_t n, size_t size) {
    if (alloc_countdown_ends())
        return NULL;
    if (calloc_countdown && --calloc_countdown == 0) {
        calloc_failed = 1;
        errno = ENOMEM;
        return NULL;
    }
    size_t fn = atomic_load_explicit(&calloc_fail_n, memory_order_relaxed);
    if (fn && n == fn && size == atomic_load_explicit(&calloc_fail_size, memory_order_relaxed)) {
        atomic_fetch_add(&calloc_pair_failed, 1);
        errno = ENOMEM;
        return NULL;
    }
    if (!next_calloc)
        alloc_fault_resolve(); /* a call before the constructor ran (dlsym's own: fails) */
    if (!next_calloc) {
        errno = ENOMEM;
        return NULL;
    }
    return next_calloc(n, size);
}

void *realloc(void *p, size_t n) {
    size_t min = atomic_load_explicit(&realloc_fail_min, memory_order_relaxed);
    if (min && n >= min) {
        atomic_fetch_add(&realloc_failed, 1);
        errno = ENOMEM;
        return NULL;
    }
    if (!next_realloc)
        alloc_fault_resolve(); /* a call before the constructor ran */
    if (!next_realloc) {
        errno = ENOMEM;
        return NULL;
    }
    return next_realloc(p, n);
}
#else
#define ALLOC_FAULT_HOOK 0
#endif

/* Whether these hooks are the allocator in use: a malloc of an odd size
 * set to fail does. */
static inline int alloc_fault_in_use(void) {
    if (!ALLOC_FAULT_HOOK)
        return 0;
    atomic_store(&malloc_fail_size, 4099);
    void *probe = malloc(4099);
    atomic_store(&malloc_fail_size, 0);
    free(probe);
    return probe == NULL;
}

#endif
