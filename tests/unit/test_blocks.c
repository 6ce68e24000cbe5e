/* test_blocks.c: the bounded lock-free block cache (common/blocks.h). */
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/blocks.h"

static void test_reuse_same_class(void **state) {
    (void)state;
    tpi_blocks_trim();
    void *a = tpi_block_alloc(100);
    assert_non_null(a);
    assert_int_equal(tpi_block_usable(100), 128);
    memset(a, 0xab, 128);
    tpi_block_free(a, 100);
    size_t n = 0, bytes = 0;
    tpi_blocks_stats(&n, &bytes);
    assert_int_equal(n, 1);
    assert_int_equal(bytes, 128);
    void *b = tpi_block_alloc(128); /* the same class: the block comes back */
    assert_ptr_equal(a, b);
    void *c = tpi_block_alloc(129); /* the next class: another block */
    assert_ptr_not_equal(b, c);
    assert_int_equal(tpi_block_usable(129), 256);
    tpi_block_free(b, 128);
    tpi_block_free(c, 129);
    tpi_blocks_trim();
    tpi_blocks_stats(&n, &bytes);
    assert_int_equal(n, 0);
    assert_int_equal(bytes, 0);
}

static void test_large_bypasses_cache(void **state) {
    (void)state;
    tpi_blocks_trim();
    size_t big = TPI_BLOCK_SIZE_MAX + 1;
    assert_int_equal(tpi_block_usable(big), big);
    void *p = tpi_block_alloc(big);
    assert_non_null(p);
    tpi_block_free(p, big);
    size_t n = 1;
    tpi_blocks_stats(&n, NULL);
    assert_int_equal(n, 0);
    tpi_block_free(NULL, 10); /* no-op */
}

/* A class keeps a bounded number of blocks: the rest are freed. */
static void test_bounded(void **state) {
    (void)state;
    tpi_blocks_trim();
    enum { N = 5000 };
    void **p = calloc(N, sizeof *p);
    assert_non_null(p);
    for (int i = 0; i < N; i++)
        assert_non_null(p[i] = tpi_block_alloc(64));
    for (int i = 0; i < N; i++)
        tpi_block_free(p[i], 64);
    size_t n = 0, bytes = 0;
    tpi_blocks_stats(&n, &bytes);
    assert_true(n > 0 && n <= 1024); /* one ring's cells */
    assert_true(bytes <= (size_t)512 * 1024);
    tpi_blocks_trim();
    free(p);
}

/*
 * Threads pass blocks to each other through a shared exchange (so blocks are
 * freed by threads other than their allocator) and stamp each block they
 * hold: a block handed out twice at once shows as a stamp changed under its
 * holder.
 */
#define THREADS 4
#define ROUNDS 1000000
#define SLOTS 64

static _Atomic(void *) exchange[SLOTS];

#define HELD 8 /* blocks a thread holds at once, stamped */

static void *stress_main(void *arg) {
    uintptr_t me = (uintptr_t)arg;
    unsigned seed = (unsigned)me * 2654435761u + 1;
    uintptr_t bad = 0;
    uint64_t *held[HELD] = {NULL};
    uint64_t stamps[HELD] = {0};
    for (int i = 0; i < ROUNDS && !bad; i++) {
        seed = seed * 1103515245u + 12345u;
        size_t size = 16 + (seed >> 8) % 600; /* 16..615: four classes */
        uint64_t *p = tpi_block_alloc(size);
        if (!p)
            return (void *)1;
        int k = i % HELD;
        uint64_t *prev = held[k];
        if (prev && prev[0] != stamps[k])
            bad = 1; /* someone else was handed the block this thread holds */
        held[k] = p;
        stamps[k] = ((uint64_t)me << 32) | (uint32_t)i;
        p[0] = stamps[k];
        p[1] = size;
        if (!prev)
            continue;
        /* Swap the older block into a random slot; free whatever was there
         * (another thread's block, most of the time). */
        void *old = atomic_exchange(&exchange[(seed >> 4) % SLOTS], prev);
        if (old) {
            uint64_t *q = old;
            size_t qsize = (size_t)q[1];
            if (qsize < 16 || qsize > 615)
                bad = 1;
            tpi_block_free(q, qsize);
        }
    }
    for (int k = 0; k < HELD; k++)
        if (held[k])
            tpi_block_free(held[k], (size_t)held[k][1]);
    return (void *)bad;
}

static void test_threads_exchange_blocks(void **state) {
    (void)state;
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, stress_main, (void *)i), 0);
    for (int i = 0; i < THREADS; i++) {
        void *bad = (void *)1;
        assert_int_equal(pthread_join(t[i], &bad), 0);
        assert_null(bad);
    }
    for (int i = 0; i < SLOTS; i++) {
        uint64_t *q = atomic_exchange(&exchange[i], NULL);
        if (q)
            tpi_block_free(q, (size_t)q[1]);
    }
    size_t n = 0, bytes = 0;
    tpi_blocks_stats(&n, &bytes);
    assert_true(bytes <= (size_t)4 * 512 * 1024);
    tpi_blocks_trim();
    tpi_blocks_stats(&n, &bytes);
    assert_int_equal(n, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse_same_class),
        cmocka_unit_test(test_large_bypasses_cache),
        cmocka_unit_test(test_bounded),
        cmocka_unit_test(test_threads_exchange_blocks),
    };
    return cmocka_run_group_tests_name("blocks", tests, NULL, NULL);
}
