/*
 * test_frame.c: the cache of large frame buffers (common/frame.c): a large
 * frame's block goes back to the cache when the frame is destroyed and the
 * next frame that fits reuses it; small requests, small frames and blocks
 * past the bounds are not kept; trim empties it; concurrent use is safe; and
 * a tensor decoded as a view into a received frame keeps the block out of
 * the cache until the tensor is freed (spec/wire.md WIRE-10). Also the
 * header check (WIRE-1) for a caller that wants no message. When a large
 * frame's allocation fails, the cache is emptied and the allocation tried
 * once more.
 */
#define _GNU_SOURCE /* alloc_fault.h */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/blocks.h"
#include "common/codec.h"
#include "common/limits.h"
#include "common/value.h"
#include "tests/unit/alloc_fault.h"

#define MIB ((size_t)1 << 20)

static size_t cached_blocks(void) {
    size_t n = 0;
    tpi_frame_cache_stats(&n, NULL);
    return n;
}

static size_t cached_bytes(void) {
    size_t b = 0;
    tpi_frame_cache_stats(NULL, &b);
    return b;
}

static void assert_cache_empty(void) {
    assert_int_equal(cached_blocks(), 0);
    assert_int_equal(cached_bytes(), 0);
}

static int setup(void **state) {
    (void)state;
    tpi_frame_cache_trim();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tpi_frame_cache_trim();
    assert_cache_empty();
    return 0;
}

static tp_frame *alloc_ok(size_t len) {
    tp_frame *f = tp_frame_alloc(len);
    assert_non_null(f);
    assert_int_equal(f->len, len);
    assert_int_equal(f->nseg, 1);
    assert_int_equal(f->seg[0].len, len);
    assert_ptr_equal(f->seg[0].base, tp_frame_bytes(f));
    assert_true(tpi_frame_owns_bytes(f));
    assert_null(f->next); /* rpc_backend.h: new or reused, next is NULL */
    return f;
}

/* ---- Reuse ---------------------------------------------------------------------- */

static void test_frame_reuses_block_with_new_length(void **state) {
    (void)state;
    tp_frame *f = alloc_ok(2 * MIB - 100);
    uint8_t *bytes = tp_frame_bytes(f);
    memset(bytes, 0xab, f->len); /* every byte used: its pages are warm */
    f->next = f;                 /* a stale field the next user must not see */
    tp_frame_free(f);
    assert_int_equal(cached_blocks(), 1);
    assert_true(cached_bytes() >= 2 * MIB - 100);

    /* The same block, a little longer (blocks are allocated in steps), with
     * a fresh header: the new length, one segment, nothing left over. */
    tp_frame *g = alloc_ok(2 * MIB);
    assert_ptr_equal(g, f);
    assert_ptr_equal(tp_frame_bytes(g), bytes);
    assert_null(g->next);
    assert_cache_empty();
    /* Not zeroed: a reused block holds the last frame's bytes; every caller
     * writes the whole frame. */
    assert_int_equal(tp_frame_bytes(g)[0], 0xab);
    memset(tp_frame_bytes(g), 0x5c, g->len); /* writable to its new end */
    tp_frame_free(g);

    /* And again, shorter (within half): still the same block. */
    tp_frame *h = alloc_ok(MIB + MIB / 2);
    assert_ptr_equal(h, f);
    tp_frame_free(h);
    assert_int_equal(cached_blocks(), 1);
}

static void test_frame_smaller_request_skips_big_block(void **state) {
    (void)state;
    tp_frame *big = alloc_ok(4 * MIB);
    tp_frame_free(big);
    assert_int_equal(cached_blocks(), 1);

    /* Less than half the block: a fresh allocation, the block stays. */
    tp_frame *small = alloc_ok(2 * MIB - 1);
    assert_ptr_not_equal(small, big);
    assert_int_equal(cached_blocks(), 1);
    /* Larger than the block: fresh as well. */
    tp_frame *larger = alloc_ok(4 * MIB + 1);
    assert_ptr_not_equal(larger, big);
    assert_int_equal(cached_blocks(), 1);
    /* Exactly half fits. */
    tp_frame *half = alloc_ok(2 * MIB);
    assert_ptr_equal(half, big);
    assert_cache_empty();
    tp_frame_free(half);
    tp_frame_free(small);
    tp_frame_free(larger);
    assert_int_equal(cached_blocks(), 3);
}

static void test_frame_best_fit_among_cached(void **state) {
    (void)state;
    tp_frame *a = alloc_ok(3 * MIB);
    tp_frame *b = alloc_ok(2 * MIB);
    tp_frame *c = alloc_ok(4 * MIB);
    tp_frame_free(a);
    tp_frame_free(b);
    tp_frame_free(c);
    assert_int_equal(cached_blocks(), 3);
    /* 2 MiB fits all three; the smallest is taken. */
    assert_ptr_equal(alloc_ok(2 * MIB), b);
    assert_ptr_equal(alloc_ok(2 * MIB), a);
    assert_ptr_equal(alloc_ok(2 * MIB), c);
    assert_cache_empty();
    tp_frame_free(a);
    tp_frame_free(b);
    tp_frame_free(c);
}

/* Among blocks of one size the one returned last is taken: its pages are
 * the likeliest still in the caches, and the older ones age out first. */
static void test_frame_most_recent_of_equals(void **state) {
    (void)state;
    tp_frame *older = alloc_ok(2 * MIB);
    tp_frame *newer = alloc_ok(2 * MIB);
    tp_frame_free(older);
    tp_frame_free(newer);
    assert_int_equal(cached_blocks(), 2);
    assert_ptr_equal(alloc_ok(2 * MIB), newer);
    assert_ptr_equal(alloc_ok(2 * MIB), older);
    assert_cache_empty();
    /* Returned the other way round, taken the other way round. */
    tp_frame_free(newer);
    tp_frame_free(older);
    assert_ptr_equal(alloc_ok(2 * MIB), older);
    assert_ptr_equal(alloc_ok(2 * MIB), newer);
    tp_frame_free(older);
    tp_frame_free(newer);
}

/* Out of memory for a large frame: what the cache holds is given back
 * (trim) and the allocation tried once more, which then succeeds. */
static void test_frame_failed_allocation_trims_the_cache(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip(); /* valgrind's allocator: nothing can be made to fail */
    tp_frame *small = alloc_ok(4 * MIB);
    tp_frame_free(small);
    assert_int_equal(cached_blocks(), 1); /* too small for what comes next */
    atomic_store(&alloc_countdown, 1);    /* the next allocation fails */
    tp_frame *big = tp_frame_alloc(9 * MIB);
    assert_true(atomic_load(&alloc_countdown_fired));
    assert_non_null(big); /* the second try */
    assert_cache_empty(); /* the 4 MiB block went to make room */
    tp_frame_free(big);
    atomic_store(&alloc_countdown_fired, 0);
}

/* ---- What is never kept ------------------------------------------------------------ */

static void test_frame_below_minimum_never_cached(void **state) {
    (void)state;
    static const size_t lens[] = {0, 1, TP_FRAME_HEADER_SIZE, 64 * 1024, TPI_FRAME_CACHE_MIN - 1};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        tp_frame *f = alloc_ok(lens[i]);
        tp_frame_free(f);
        assert_cache_empty();
    }
    /* A cached block is not handed to a small frame either. */
    tp_frame *big = alloc_ok(TPI_FRAME_CACHE_MIN);
    tp_frame_free(big);
    assert_int_equal(cached_blocks(), 1);
    tp_frame *small = alloc_ok(TPI_FRAME_CACHE_MIN - 1);
    assert_ptr_not_equal(small, big);
    tp_frame_free(small);
    assert_int_equal(cached_blocks(), 1);
}

static void test_frame_shared_frames_never_cached(void **state) {
    (void)state;
    tp_frame *f = tpi_frame_shared_alloc(2 * MIB);
    assert_non_null(f);
    assert_false(tpi_frame_owns_bytes(f));
    tpi_frame_push_seg(f, tpi_frame_shared_bytes(f), 2 * MIB);
    memset(tpi_frame_shared_bytes(f), 1, 2 * MIB);
    /* Flattening copies into a fresh (cacheable) frame and leaves f alone. */
    tp_frame *flat = tp_frame_flatten(f);
    assert_non_null(flat);
    assert_true(tpi_frame_owns_bytes(flat));
    assert_int_equal(flat->len, 2 * MIB);
    assert_int_equal(tp_frame_bytes(flat)[2 * MIB - 1], 1);
    size_t small_before = 0, small_after = 0;
    tpi_blocks_stats(&small_before, NULL);
    tp_frame_free(f);
    assert_cache_empty();
    /* Its 2 MiB block went back to malloc, not into a small block's ring. */
    tpi_blocks_stats(&small_after, NULL);
    assert_int_equal(small_after, small_before);
    tp_frame_free(flat);
    assert_int_equal(cached_blocks(), 1);
    /* The next flatten of that size reuses the block, and copies every byte. */
    tp_frame *g = tpi_frame_shared_alloc(2 * MIB);
    assert_non_null(g);
    tpi_frame_push_seg(g, tpi_frame_shared_bytes(g), 2 * MIB);
    memset(tpi_frame_shared_bytes(g), 2, 2 * MIB);
    tp_frame *flat2 = tp_frame_flatten(g);
    assert_ptr_equal(flat2, flat);
    for (size_t i = 0; i < 2 * MIB; i += 4096)
        assert_int_equal(tp_frame_bytes(flat2)[i], 2);
    assert_int_equal(tp_frame_bytes(flat2)[2 * MIB - 1], 2);
    tp_frame_free(g);
    tp_frame_free(flat2);
    assert_int_equal(cached_blocks(), 1);
}

/* ---- Bounds and trim ------------------------------------------------------------- */

static int among(const tp_frame *f, tp_frame *const *set, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (set[i] == f)
            return 1;
    return 0;
}

static void test_frame_block_bound_evicts_oldest(void **state) {
    (void)state;
    enum { N = TPI_FRAME_CACHE_BLOCKS + 1 };
    tp_frame *f[N];
    for (int i = 0; i < N; i++)
        f[i] = alloc_ok(TPI_FRAME_CACHE_MIN);
    for (int i = 0; i < N; i++) {
        tp_frame_free(f[i]);
        assert_int_equal(cached_blocks(),
                         (size_t)(i + 1 < TPI_FRAME_CACHE_BLOCKS ? i + 1 : TPI_FRAME_CACHE_BLOCKS));
    }
    assert_int_equal(cached_bytes(), TPI_FRAME_CACHE_BLOCKS * TPI_FRAME_CACHE_MIN);
    /* The first returned went; the others are handed out again. */
    tp_frame *g[TPI_FRAME_CACHE_BLOCKS];
    for (int i = 0; i < TPI_FRAME_CACHE_BLOCKS; i++) {
        g[i] = alloc_ok(TPI_FRAME_CACHE_MIN);
        assert_true(among(g[i], f + 1, N - 1));
        assert_false(among(g[i], g, (size_t)i)); /* each once */
    }
    assert_cache_empty();
    for (int i = 0; i < TPI_FRAME_CACHE_BLOCKS; i++)
        tp_frame_free(g[i]);
}

static void test_frame_byte_bound_evicts(void **state) {
    (void)state;
    /* Blocks a third of the byte bound (never written: address space only). */
    size_t third = TPI_FRAME_CACHE_BYTES / 3 / (64 * 1024) * (64 * 1024);
    tp_frame *a = alloc_ok(third), *b = alloc_ok(third), *c = alloc_ok(third);
    tp_frame *d = alloc_ok(third);
    tp_frame_free(a);
    tp_frame_free(b);
    tp_frame_free(c);
    assert_int_equal(cached_blocks(), 3);
    tp_frame_free(d); /* a fourth would pass the byte bound: the oldest goes */
    assert_int_equal(cached_blocks(), 3);
    assert_int_equal(cached_bytes(), 3 * third);
    assert_true(cached_bytes() <= TPI_FRAME_CACHE_BYTES);
    tp_frame *keep[3] = {b, c, d};
    tp_frame *g[3];
    for (int i = 0; i < 3; i++) {
        g[i] = alloc_ok(third);
        assert_true(among(g[i], keep, 3));
        assert_false(among(g[i], g, (size_t)i));
    }
    assert_cache_empty();
    for (int i = 0; i < 3; i++)
        tp_frame_free(g[i]);

    /* A block past the whole bound is never kept, and evicts nothing. */
    tp_frame *huge = alloc_ok(TPI_FRAME_CACHE_BYTES + 1);
    tp_frame_free(huge);
    assert_int_equal(cached_blocks(), 3);
    assert_int_equal(cached_bytes(), 3 * third);
}

/* The bounds are inclusive: four blocks that fill TPI_FRAME_CACHE_BYTES
 * exactly are all kept, and so is one block of exactly that size (address
 * space only: never written). */
static void test_frame_byte_bound_holds_exactly(void **state) {
    (void)state;
    size_t quarter = TPI_FRAME_CACHE_BYTES / TPI_FRAME_CACHE_BLOCKS;
    assert_int_equal(quarter % (64 * 1024), 0);
    tp_frame *f[TPI_FRAME_CACHE_BLOCKS];
    for (int i = 0; i < TPI_FRAME_CACHE_BLOCKS; i++)
        f[i] = alloc_ok(quarter);
    for (int i = 0; i < TPI_FRAME_CACHE_BLOCKS; i++)
        tp_frame_free(f[i]);
    assert_int_equal(cached_blocks(), TPI_FRAME_CACHE_BLOCKS);
    assert_int_equal(cached_bytes(), TPI_FRAME_CACHE_BYTES);
    tpi_frame_cache_trim();
    tp_frame *whole = alloc_ok(TPI_FRAME_CACHE_BYTES);
    tp_frame_free(whole);
    assert_int_equal(cached_blocks(), 1);
    assert_int_equal(cached_bytes(), TPI_FRAME_CACHE_BYTES);
}

static void test_frame_trim_empties(void **state) {
    (void)state;
    tp_frame *f[3];
    for (int i = 0; i < 3; i++)
        f[i] = alloc_ok((size_t)(i + 1) * MIB);
    for (int i = 0; i < 3; i++)
        tp_frame_free(f[i]);
    assert_int_equal(cached_blocks(), 3);
    assert_int_equal(cached_bytes(), 6 * MIB);
    tpi_frame_cache_trim();
    assert_cache_empty();
    tpi_frame_cache_trim(); /* idempotent */
    assert_cache_empty();
    /* Frames in use are untouched by a trim; they come back afterwards. */
    tp_frame *live = alloc_ok(2 * MIB);
    memset(tp_frame_bytes(live), 7, live->len);
    tpi_frame_cache_trim();
    assert_int_equal(tp_frame_bytes(live)[live->len - 1], 7);
    tp_frame_free(live);
    assert_int_equal(cached_blocks(), 1);
    tpi_frame_cache_trim();
    assert_cache_empty();
}

/* ---- Threads ---------------------------------------------------------------------- */

#define NTHREADS 4
#define ROUNDS 400

/* Frames pass between threads through these slots: each thread frees frames
 * another one allocated, as a transport's loop allocates and any thread
 * drops the last view. */
static _Atomic(tp_frame *) slots[NTHREADS];
static atomic_int thread_errors;

typedef struct stamp {
    uint64_t tag; /* thread and round */
    size_t len;
} stamp;

static void stamp_frame(tp_frame *f, uint64_t tag) {
    stamp s = {tag, f->len};
    uint8_t *p = tp_frame_bytes(f);
    memcpy(p, &s, sizeof s);
    memcpy(p + f->len - sizeof s, &s, sizeof s);
    memset(p + f->len / 2, (int)(tag & 0xff), 4096);
}

static int stamp_intact(tp_frame *f) {
    stamp a, b;
    const uint8_t *p = tp_frame_bytes(f);
    memcpy(&a, p, sizeof a);
    memcpy(&b, p + f->len - sizeof b, sizeof b);
    if (a.tag != b.tag || a.len != f->len || b.len != f->len)
        return 0;
    for (size_t i = 0; i < 4096; i++)
        if (p[f->len / 2 + i] != (uint8_t)(a.tag & 0xff))
            return 0;
    return 1;
}

static void *churn(void *arg) {
    unsigned id = (unsigned)(uintptr_t)arg;
    for (unsigned r = 0; r < ROUNDS; r++) {
        /* 1, 1.5, 2 and 3 MiB: some fit each other's blocks, some do not. */
        static const size_t sizes[] = {MIB, MIB + MIB / 2, 2 * MIB, 3 * MIB};
        size_t len = sizes[(id + r) % 4] + r;
        tp_frame *f = tp_frame_alloc(len);
        if (!f || f->len != len) {
            atomic_fetch_add(&thread_errors, 1);
            continue;
        }
        stamp_frame(f, (uint64_t)id << 32 | r);
        tp_frame *old = atomic_exchange(&slots[(id + r) % NTHREADS], f);
        if (old && !stamp_intact(old))
            atomic_fetch_add(&thread_errors, 1);
        tp_frame_free(old);
        size_t blocks = 0, bytes = 0;
        tpi_frame_cache_stats(&blocks, &bytes);
        if (blocks > TPI_FRAME_CACHE_BLOCKS || bytes > TPI_FRAME_CACHE_BYTES)
            atomic_fetch_add(&thread_errors, 1);
    }
    return NULL;
}

static void test_frame_concurrent_alloc_free(void **state) {
    (void)state;
    atomic_store(&thread_errors, 0);
    for (int i = 0; i < NTHREADS; i++)
        atomic_store(&slots[i], NULL);
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)i), 0);
    for (int i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(atomic_load(&thread_errors), 0);
    for (int i = 0; i < NTHREADS; i++) {
        tp_frame *f = atomic_exchange(&slots[i], NULL);
        assert_non_null(f);
        assert_true(stamp_intact(f));
        tp_frame_free(f);
    }
    assert_true(cached_blocks() >= 1 && cached_blocks() <= TPI_FRAME_CACHE_BLOCKS);
    assert_true(cached_bytes() <= TPI_FRAME_CACHE_BYTES);
    tpi_frame_cache_trim();
    assert_cache_empty();
}

/* ---- Views into received frames (WIRE-10) ------------------------------------------ */

#define VIEW_ELEMS ((int64_t)(2 * MIB / 4)) /* a 2 MiB float32 tensor */

static tp_value *tensor_of(unsigned seed) {
    int64_t numel = VIEW_ELEMS;
    float *data = malloc((size_t)numel * sizeof *data);
    assert_non_null(data);
    for (int64_t i = 0; i < numel; i++)
        data[i] = (float)(i % 1000) + (float)seed;
    tp_value *t = tp_value_tensor(TP_DTYPE_FLOAT32, 1, &numel, NULL, data);
    free(data);
    assert_non_null(t);
    return t;
}

/* A REQUEST carrying t, encoded (the tensor shared, not copied) then
 * flattened as a transport receives it: a tp_frame_alloc frame. */
static tp_frame *received_request(const tp_value *t) {
    tpi_msg m = {0};
    m.type = TPI_MSG_REQUEST;
    m.id = 42;
    strcpy(m.text, "consume");
    m.args = tp_value_list_of(1, tp_value_clone(t));
    assert_non_null(m.args);
    tp_frame *sent = NULL;
    char err[TP_ERRMSG_LEN_MAX];
    assert_int_equal(tpi_msg_encode(&m, NULL, TPI_MESSAGE_SIZE_MAX, &sent, err, sizeof err), TP_OK);
    tp_value_free(m.args);
    assert_false(tpi_frame_owns_bytes(sent)); /* the tensor is a segment of its own */
    assert_true(sent->nseg > 1);
    tp_frame *f = tp_frame_flatten(sent);
    assert_non_null(f);
    tp_frame_free(sent);
    return f;
}

/* Decodes f (taken) and returns its args, the msg freed. */
static tp_value *decode_args(tp_frame *f) {
    tpi_msg d;
    char err[TP_ERRMSG_LEN_MAX];
    tp_status st = tpi_msg_decode_frame(f, NULL, &d, err, sizeof err);
    if (st != TP_OK)
        fail_msg("decode failed: %s", err);
    assert_int_equal(d.type, TPI_MSG_REQUEST);
    assert_string_equal(d.text, "consume");
    tp_value *args = d.args;
    d.args = NULL;
    tpi_msg_clear(&d); /* the tensor outlives the msg */
    return args;
}

static void test_frame_view_keeps_block_until_tensor_freed(void **state) {
    (void)state;
    tp_value *t = tensor_of(0);
    tp_frame *f = received_request(t);
    assert_cache_empty(); /* the encoder's shared frame is never cached */
    assert_true(f->len >= 2 * MIB);
    const uint8_t *lo = tp_frame_bytes(f), *hi = lo + f->len;
    tp_frame *probe = f;

    tp_value *args = decode_args(f);
    const tp_value *v = tp_list_get(args, 0);
    assert_non_null(v);
    const uint8_t *p = tp_tensor_cdata(v);
    assert_true(p >= lo && p + 2 * MIB <= hi); /* a view into the frame */
    assert_true(tp_value_equal(v, t));
    /* The msg is gone, the frame lives on in the view: not cached. */
    assert_cache_empty();
    tp_frame *other = alloc_ok(probe->len);
    assert_ptr_not_equal(other, probe);
    tp_frame_free(other);
    tpi_frame_cache_trim();

    /* The last view goes: the block is cached. */
    tp_value_free(args);
    assert_int_equal(cached_blocks(), 1);

    /* The next frame of that size reuses it, stale bytes and all, and decodes
     * to its own tensor. */
    tp_value *t2 = tensor_of(7);
    tp_frame *f2 = received_request(t2);
    assert_ptr_equal(f2, probe);
    assert_cache_empty();
    tp_value *args2 = decode_args(f2);
    assert_true(tp_value_equal(tp_list_get(args2, 0), t2));
    assert_false(tp_value_equal(tp_list_get(args2, 0), t));
    assert_cache_empty();
    tp_value_free(args2);
    assert_int_equal(cached_blocks(), 1);
    tp_value_free(t);
    tp_value_free(t2);
}

/* ---- The header check without a message buffer (WIRE-1) --------------------------- */

/* A valid header: a RESPONSE with a body of body_len bytes. */
static void good_header(uint8_t h[TP_FRAME_HEADER_SIZE], uint32_t body_len) {
    memset(h, 0, TP_FRAME_HEADER_SIZE);
    h[0] = TPI_WIRE_MAGIC0;
    h[1] = TPI_WIRE_MAGIC1;
    h[2] = TPI_WIRE_MAGIC2;
    h[3] = TPI_WIRE_MAGIC3;
    h[4] = TPI_WIRE_VERSION;
    h[5] = TPI_MSG_RESPONSE;
    for (int i = 0; i < 4; i++)
        h[8 + i] = (uint8_t)(body_len >> (8 * i));
}

/* tp_frame_lend: the frame is the lent bytes themselves, and freeing it
 * calls release once, with the backend's own ctx. */
static int lend_released;
static void *lend_ctx;

static void lend_release(void *ctx) {
    lend_released++;
    lend_ctx = ctx;
}

static void test_frame_lend_releases_with_its_context(void **state) {
    (void)state;
    static uint8_t slab[64];
    int marker = 0;
    lend_released = 0;
    lend_ctx = NULL;
    tp_frame *f = tp_frame_lend(slab, sizeof slab, lend_release, &marker);
    assert_non_null(f);
    assert_ptr_equal(tp_frame_bytes(f), slab);
    assert_int_equal(f->len, sizeof slab);
    assert_int_equal(f->nseg, 1); /* one segment, the lent bytes */
    assert_ptr_equal(f->seg[0].base, slab);
    assert_int_equal(f->seg[0].len, sizeof slab);
    assert_null(f->next);
    assert_int_equal(lend_released, 0);
    tp_frame_free(f);
    assert_int_equal(lend_released, 1);
    assert_ptr_equal(lend_ctx, &marker);
}

/* A bad header is told by its status alone when the caller wants no message:
 * errmsg NULL, whatever errmsg_len says, and a buffer of length 0 are never
 * written (nor is frame_len). */
static void test_frame_header_check_without_message(void **state) {
    (void)state;
    uint8_t h[TP_FRAME_HEADER_SIZE];
    size_t flen = 0;
    good_header(h, 100);
    assert_int_equal(tp_frame_check_header(h, 4096, &flen, NULL, 0), TP_OK);
    assert_int_equal(flen, TP_FRAME_HEADER_SIZE + 100);
    static const size_t lens[] = {0, 1, TP_ERRMSG_LEN_MAX};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        flen = 7;
        good_header(h, 100);
        h[0] = 'X';
        assert_int_equal(tp_frame_check_header(h, 4096, &flen, NULL, lens[i]), TP_EPROTO);
        good_header(h, 100);
        h[4] = TPI_WIRE_VERSION + 1;
        assert_int_equal(tp_frame_check_header(h, 4096, &flen, NULL, lens[i]), TP_EPROTO);
        good_header(h, 5000);
        assert_int_equal(tp_frame_check_header(h, 4096, &flen, NULL, lens[i]), TP_EMSGSIZE);
        assert_int_equal(tp_frame_check_header(NULL, 4096, &flen, NULL, lens[i]), TP_EINVAL);
        assert_int_equal(tp_frame_check_header(h, 4096, NULL, NULL, lens[i]), TP_EINVAL);
        assert_int_equal(flen, 7);
    }
    /* A buffer of length 0 is not written, not even its terminator. */
    char buf[8];
    memset(buf, '#', sizeof buf);
    good_header(h, 100);
    h[5] = 0;
    assert_int_equal(tp_frame_check_header(h, 4096, &flen, buf, 0), TP_EPROTO);
    for (size_t i = 0; i < sizeof buf; i++)
        assert_int_equal(buf[i], '#');
    /* And one of length 1 holds the empty string: the message cut to fit. */
    assert_int_equal(tp_frame_check_header(h, 4096, &flen, buf, 1), TP_EPROTO);
    assert_int_equal(buf[0], '\0');
    assert_int_equal(buf[1], '#');
    assert_int_equal(flen, 7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_frame_reuses_block_with_new_length, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frame_smaller_request_skips_big_block, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_frame_most_recent_of_equals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frame_failed_allocation_trims_the_cache, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_frame_best_fit_among_cached, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frame_below_minimum_never_cached, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frame_shared_frames_never_cached, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frame_block_bound_evicts_oldest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frame_byte_bound_evicts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frame_byte_bound_holds_exactly, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frame_trim_empties, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frame_concurrent_alloc_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frame_view_keeps_block_until_tensor_freed, setup,
                                        teardown),
        cmocka_unit_test(test_frame_header_check_without_message),
        cmocka_unit_test(test_frame_lend_releases_with_its_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
