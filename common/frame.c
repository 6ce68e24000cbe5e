/*
 * frame.c: frames as backends hold them, and the header check backends run
 * on the first 24 bytes of each frame before they read (or allocate for)
 * its body (spec/wire.md WIRE-1, WIRE-6). Also the frames the encoder
 * builds around shared tensor storage (WIRE-10): their own bytes, then
 * segments that borrow blocks they hold a reference to until destroyed.
 * Large received frames reuse the blocks of earlier ones (a bounded cache),
 * since a fresh large block costs a page fault per page.
 */
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "codec.h"
#include "errors.h"
#include "value.h"
#include "tensorplay/rpc_backend.h"

/* ---- Frames from tp_frame_alloc, and the cache of large blocks ------------------ */

/*
 * One allocation: this struct, then cap bytes at OWNED_HEAD (aligned for any
 * type), of which the frame uses the first f.len. A block is only ever
 * reused whole, struct included, by one frame at a time.
 */
typedef struct owned_frame {
    tp_frame f;
    size_t cap;
} owned_frame;

#define OWNED_HEAD                                                                                 \
    ((sizeof(owned_frame) + alignof(max_align_t) - 1) / alignof(max_align_t) * alignof(max_align_t))

/* A cacheable block is allocated in steps of this many bytes, so that a
 * frame slightly longer than the last still fits its block. The tail is
 * never written, so it costs address space, not memory (a large block is
 * mmapped and its pages come on first touch). */
#define CACHE_STEP ((size_t)64 * 1024)

/*
 * Large blocks that frames gave back (TPI_FRAME_CACHE_MIN and up), within
 * TPI_FRAME_CACHE_BLOCKS and TPI_FRAME_CACHE_BYTES, least recently returned
 * first (it goes first when a bound is reached). Process-wide: a frame is
 * allocated on one thread (the transport's loop, the simulator) and freed on
 * any (whoever drops the last tensor viewing it). The spin lock is held for
 * a scan of a few entries, never across malloc or free. Cached blocks stay
 * reachable from here, so leak checkers do not report them;
 * tpi_frame_cache_trim gives them back.
 */
typedef struct frame_cache {
    atomic_flag spin;
    int n;
    size_t bytes; /* sum of cap[0..n) */
    owned_frame *block[TPI_FRAME_CACHE_BLOCKS];
    size_t cap[TPI_FRAME_CACHE_BLOCKS]; /* block[i]->cap, read without touching the block */
} frame_cache;

static frame_cache cache = {.spin = ATOMIC_FLAG_INIT};

/* Under AddressSanitizer a cached block is poisoned: a read or write through
 * a stale pointer into a frame's bytes is still reported as the use after
 * free it is, until the block is reused. */
#if defined(__SANITIZE_ADDRESS__)
#define FRAME_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FRAME_ASAN 1
#endif
#endif
#ifdef FRAME_ASAN
#include <sanitizer/asan_interface.h>
#define BLOCK_POISON(of, cap) ASAN_POISON_MEMORY_REGION((of), OWNED_HEAD + (cap))
#define BLOCK_UNPOISON(of, cap) ASAN_UNPOISON_MEMORY_REGION((of), OWNED_HEAD + (cap))
#else
#define BLOCK_POISON(of, cap) ((void)(of), (void)(cap))
#define BLOCK_UNPOISON(of, cap) ((void)(of), (void)(cap))
#endif

static void cache_lock(void) {
    while (atomic_flag_test_and_set_explicit(&cache.spin, memory_order_acquire)) {
        /* Held only for a few instructions by whoever has it. */
    }
}

static void cache_unlock(void) {
    atomic_flag_clear_explicit(&cache.spin, memory_order_release);
}

/* Removes entry i (lock held): its block is the caller's. */
static owned_frame *cache_remove(int i, size_t *cap) {
    TPI_ASSERT(i >= 0 && i < cache.n);
    owned_frame *of = cache.block[i];
    *cap = cache.cap[i];
    cache.bytes -= cache.cap[i];
    for (int j = i; j + 1 < cache.n; j++) {
        cache.block[j] = cache.block[j + 1];
        cache.cap[j] = cache.cap[j + 1];
    }
    cache.n--;
    return of;
}

/* The smallest cached block that fits len bytes without wasting more than
 * it uses (len <= cap <= 2 * len), the most recent of equals; NULL if none. */
static owned_frame *cache_take(size_t len) {
    size_t cap = 0;
    owned_frame *of = NULL;
    cache_lock();
    int best = -1;
    for (int i = 0; i < cache.n; i++) {
        size_t c = cache.cap[i];
        if (c >= len && c - len <= len && (best < 0 || c <= cache.cap[best]))
            best = i;
    }
    if (best >= 0)
        of = cache_remove(best, &cap);
    cache_unlock();
    if (of) {
        BLOCK_UNPOISON(of, cap);
        TPI_ASSERT(of->cap == cap);
    }
    return of;
}

/* Keeps a block for reuse, evicting the least recently returned ones beyond
 * the bounds; a block larger than all the cache may hold is freed. */
static void cache_put(owned_frame *of) {
    size_t cap = of->cap;
    if (cap > TPI_FRAME_CACHE_BYTES) {
        free(of);
        return;
    }
    owned_frame *evicted[TPI_FRAME_CACHE_BLOCKS];
    size_t evicted_cap[TPI_FRAME_CACHE_BLOCKS];
    int nevicted = 0;
    BLOCK_POISON(of, cap); /* before another thread can take it */
    cache_lock();
    while (cache.n == TPI_FRAME_CACHE_BLOCKS || cache.bytes + cap > TPI_FRAME_CACHE_BYTES) {
        TPI_ASSERT(nevicted < TPI_FRAME_CACHE_BLOCKS);
        evicted[nevicted] = cache_remove(0, &evicted_cap[nevicted]);
        nevicted++;
    }
    cache.block[cache.n] = of;
    cache.cap[cache.n] = cap;
    cache.n++;
    cache.bytes += cap;
    cache_unlock();
    for (int i = 0; i < nevicted; i++) {
        BLOCK_UNPOISON(evicted[i], evicted_cap[i]);
        free(evicted[i]);
    }
}

void tpi_frame_cache_trim(void) {
    owned_frame *all[TPI_FRAME_CACHE_BLOCKS];
    size_t caps[TPI_FRAME_CACHE_BLOCKS];
    int n = 0;
    cache_lock();
    while (cache.n > 0) {
        all[n] = cache_remove(cache.n - 1, &caps[n]);
        n++;
    }
    TPI_ASSERT(cache.bytes == 0);
    cache_unlock();
    tpi_blocks_trim(); /* and the small blocks (blocks.h) */
    for (int i = 0; i < n; i++) {
        BLOCK_UNPOISON(all[i], caps[i]);
        free(all[i]);
    }
}

void tpi_frame_cache_stats(size_t *blocks, size_t *bytes) {
    cache_lock();
    size_t n = (size_t)cache.n, b = cache.bytes;
    cache_unlock();
    if (blocks)
        *blocks = n;
    if (bytes)
        *bytes = b;
}

static void frame_alloc_destroy(tp_frame *f) {
    owned_frame *of = (owned_frame *)f;
    if (of->cap >= TPI_FRAME_CACHE_MIN)
        cache_put(of);
    else
        tpi_block_free(of, OWNED_HEAD + of->cap); /* small: back to blocks.h, else free */
}

/* A reused block holds an earlier frame's bytes, not zeros: every caller
 * writes the whole frame (a transport reads it in, the codec and
 * tp_frame_flatten fill it). */
tp_frame *tp_frame_alloc(size_t len) {
    if (len > SIZE_MAX - OWNED_HEAD - CACHE_STEP)
        return NULL;
    owned_frame *of = len >= TPI_FRAME_CACHE_MIN ? cache_take(len) : NULL;
    if (!of) {
        size_t cap =
            len >= TPI_FRAME_CACHE_MIN ? (len + CACHE_STEP - 1) / CACHE_STEP * CACHE_STEP : len;
        /* A small frame's block comes from blocks.h: no malloc once warm. */
        if (len < TPI_FRAME_CACHE_MIN)
            cap = tpi_block_usable(OWNED_HEAD + cap) - OWNED_HEAD;
        of = tpi_block_alloc(OWNED_HEAD + cap);
        if (!of) { /* what the cache holds is better spent here */
            tpi_frame_cache_trim();
            of = tpi_block_alloc(OWNED_HEAD + cap);
            if (!of)
                return NULL;
        }
        of->cap = cap;
    }
    memset(&of->f, 0, sizeof of->f);
    of->f.len = len;
    of->f.nseg = 1;
    of->f.seg[0].base = (uint8_t *)of + OWNED_HEAD;
    of->f.seg[0].len = len;
    of->f.destroy = frame_alloc_destroy;
    return &of->f;
}

/* A frame over bytes its backend lends (tp_frame_lend). */
typedef struct lent_frame {
    tp_frame f;
    void (*release)(void *ctx);
    void *ctx;
} lent_frame;

static void lent_frame_destroy(tp_frame *f) {
    lent_frame *lf = (lent_frame *)f;
    lf->release(lf->ctx);
    free(lf);
}

tp_frame *tp_frame_lend(uint8_t *base, size_t len, void (*release)(void *ctx), void *ctx) {
    TPI_ASSERT(base != NULL && len >= TP_FRAME_HEADER_SIZE && release != NULL);
    lent_frame *lf = calloc(1, sizeof *lf);
    if (!lf)
        return NULL;
    lf->f.len = len;
    lf->f.nseg = 1;
    lf->f.seg[0].base = base;
    lf->f.seg[0].len = len;
    lf->f.destroy = lent_frame_destroy;
    lf->release = release;
    lf->ctx = ctx;
    return &lf->f;
}

uint8_t *tp_frame_bytes(tp_frame *f) {
    TPI_ASSERT(f != NULL &&
               (f->destroy == frame_alloc_destroy || f->destroy == lent_frame_destroy));
    if (f->destroy == lent_frame_destroy)
        return (uint8_t *)f->seg[0].base;
    return (uint8_t *)f + OWNED_HEAD;
}

int tpi_frame_owns_bytes(const tp_frame *f) {
    return f != NULL && (f->destroy == frame_alloc_destroy || f->destroy == lent_frame_destroy);
}

/* A frame with its own bytes after the struct and references to blocks. */
typedef struct shared_frame {
    tp_frame f;
    int nrefs;
    tpi_blob *refs[TP_FRAME_SEG_MAX];
    size_t own_len;
} shared_frame;

#define SHARED_HEAD                                                                                \
    ((sizeof(shared_frame) + alignof(max_align_t) - 1) / alignof(max_align_t) *                    \
     alignof(max_align_t))

static void shared_frame_destroy(tp_frame *f) {
    shared_frame *sf = (shared_frame *)f;
    for (int i = 0; i < sf->nrefs; i++)
        tpi_blob_unref(sf->refs[i]);
    tpi_block_free(sf, SHARED_HEAD + sf->own_len);
}

tp_frame *tpi_frame_shared_alloc(size_t own_len) {
    if (own_len > SIZE_MAX - SHARED_HEAD)
        return NULL;
    shared_frame *sf = tpi_block_alloc(SHARED_HEAD + own_len);
    if (!sf)
        return NULL;
    memset(sf, 0, sizeof *sf);
    sf->own_len = own_len;
    sf->f.destroy = shared_frame_destroy;
    return &sf->f;
}

uint8_t *tpi_frame_shared_bytes(tp_frame *f) {
    TPI_ASSERT(f != NULL && f->destroy == shared_frame_destroy);
    return (uint8_t *)f + SHARED_HEAD;
}

void tpi_frame_shared_hold(tp_frame *f, tpi_blob *b) {
    TPI_ASSERT(f != NULL && f->destroy == shared_frame_destroy && b != NULL);
    shared_frame *sf = (shared_frame *)f;
    TPI_ASSERT(sf->nrefs < TP_FRAME_SEG_MAX);
    tpi_blob_ref(b);
    sf->refs[sf->nrefs++] = b;
}

void tpi_frame_push_seg(tp_frame *f, const void *base, size_t len) {
    TPI_ASSERT(f != NULL && f->nseg < TP_FRAME_SEG_MAX && (base != NULL || len == 0));
    TPI_ASSERT(len <= SIZE_MAX - f->len);
    f->seg[f->nseg].base = base;
    f->seg[f->nseg].len = len;
    f->nseg++;
    f->len += len;
}

void tp_frame_free(tp_frame *f) {
    if (!f)
        return;
    TPI_ASSERT(f->destroy != NULL);
    f->destroy(f);
}

static uint32_t load_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static tp_status header_fail(tp_status st, char *errmsg, size_t errmsg_len, const char *fmt, ...)
    TPI_PRINTF(4, 5);
static tp_status header_fail(tp_status st, char *errmsg, size_t errmsg_len, const char *fmt, ...) {
    if (errmsg && errmsg_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        tpi_vformat(errmsg, errmsg_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

tp_status tp_frame_check_header(const uint8_t header[TP_FRAME_HEADER_SIZE],
                                uint64_t max_message_size, size_t *frame_len, char *errmsg,
                                size_t errmsg_len) {
    if (!header || !frame_len)
        return header_fail(TP_EINVAL, errmsg, errmsg_len, "frame header check: NULL argument");
    if (header[0] != TPI_WIRE_MAGIC0 || header[1] != TPI_WIRE_MAGIC1 ||
        header[2] != TPI_WIRE_MAGIC2 || header[3] != TPI_WIRE_MAGIC3)
        return header_fail(TP_EPROTO, errmsg, errmsg_len,
                           "bad magic %02x %02x %02x %02x at offset 0, expected \"TPRC\"",
                           header[0], header[1], header[2], header[3]);
    if (header[4] != TPI_WIRE_VERSION)
        return header_fail(TP_EPROTO, errmsg, errmsg_len, "wire version %u, expected %u", header[4],
                           TPI_WIRE_VERSION);
    if (header[5] < TPI_MSG_REQUEST || header[5] > TPI_MSG_TYPE_MAX_)
        return header_fail(TP_EPROTO, errmsg, errmsg_len, "unknown message type %u at offset 5",
                           header[5]);
    unsigned flags = (unsigned)header[6] | (unsigned)header[7] << 8;
    if (flags & ~TPI_FLAGS_KNOWN)
        return header_fail(TP_EPROTO, errmsg, errmsg_len, "unknown flags 0x%04x at offset 6",
                           flags & ~TPI_FLAGS_KNOWN);
    /* Offset 12: REQUEST and REMOTE carry the caller's window generation
     * (FLOW-9), any value; it is reserved, 0, on every other type. */
    uint32_t gen = load_u32(header + 12);
    if (gen != 0 && header[5] != TPI_MSG_REQUEST && header[5] != TPI_MSG_REMOTE)
        return header_fail(TP_EPROTO, errmsg, errmsg_len,
                           "reserved header field is 0x%08x at offset 12, expected 0",
                           (unsigned)gen);
    uint64_t total = TP_FRAME_HEADER_SIZE + (uint64_t)load_u32(header + 8);
    uint64_t limit =
        max_message_size < TPI_MESSAGE_SIZE_MAX ? max_message_size : TPI_MESSAGE_SIZE_MAX;
    if (total > limit)
        return header_fail(TP_EMSGSIZE, errmsg, errmsg_len,
                           "message of %llu bytes exceeds the limit of %llu bytes",
                           (unsigned long long)total, (unsigned long long)limit);
    *frame_len = (size_t)total;
    return TP_OK;
}

int tp_frame_is_reply(const uint8_t header[TP_FRAME_HEADER_SIZE]) {
    TPI_ASSERT(header);
    return header[5] == TPI_MSG_RESPONSE;
}

tp_frame *tp_frame_flatten(const tp_frame *f) {
    TPI_ASSERT(f && f->nseg >= 1 && f->nseg <= TP_FRAME_SEG_MAX);
    tp_frame *out = tp_frame_alloc(f->len);
    if (!out)
        return NULL;
    uint8_t *p = tp_frame_bytes(out);
    size_t total = 0;
    for (int i = 0; i < f->nseg; i++) {
        if (f->seg[i].len)
            memcpy(p + total, f->seg[i].base, f->seg[i].len);
        total += f->seg[i].len;
    }
    TPI_ASSERT(total == f->len);
    return out;
}
