/*
 * shm_ring.c: a ring of records in memory shared by two processes
 * (spec/tcp.md TCP-26; the transport's use of it is TCP-28).
 *
 * Layout (native byte order: both ends run on one kernel):
 *   line 0 (written once by the writer's init):
 *      0 "TPSHMRNG"  8 u32 version  12 u32 header size (512)  16 u64 capacity
 *     24..127 zero
 *   line 1 (the writer's):  u64 tail, u32 data_seq (futex: the reader sleeps
 *     on it), u32 writer_sleeps, u32 writer_closed
 *   line 2 (the reader's):  u64 head, u32 space_seq (futex: the writer
 *     sleeps on it), u32 reader_sleeps, u32 reader_closed
 *   line 3: zero (reserved)
 *   512..: capacity bytes of records
 * head and tail count bytes since the start and only grow; a position's
 * place is its count modulo the capacity. A record is an 8-byte header
 * (u32 length, u32 kind DATA or PAD), its payload, zeros to a multiple of
 * 8: always whole, never split at the end of the data. A record that does
 * not fit in the bytes left before the end follows a PAD record that fills
 * them, so a reader hands records on where they lie (tpi_ring_read_cb), and
 * the price is at most half the ring idle while the pad waits to be read.
 *
 * Ordering: the writer copies a record in, then stores tail (release); the
 * reader loads tail (acquire), copies the record out, then stores head
 * (release), which the writer loads (acquire) before reusing the bytes.
 * A sleeper and a waker use the store-buffer pattern: the sleeper reads the
 * futex word, sets its "sleeps" flag, fences (seq_cst), looks once more and
 * only then sleeps while the word is unchanged; the waker publishes, fences,
 * and bumps the word and wakes only when the flag is set. Either the waker
 * sees the flag or the sleeper sees the new counter, so no wake-up is lost
 * and a running peer costs no system call.
 *
 * Trust: each end writes only its own line (and the writer the data), and
 * never reads back what it wrote: its position and the capacity live in
 * its tpi_ring. What it reads of the other's is checked before use, loaded
 * once (a relaxed atomic load into a local), and bounds every loop: a read
 * looks at one pad and one record at most; a wait ends at its deadline.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/errors.h"
#include "real/shm_ring.h"

typedef struct ring_shared {
    /* Line 0: the writer's init, read once by the reader's attach. */
    char magic[8];
    uint32_t version;
    uint32_t head_size;
    uint64_t cap;
    uint8_t reserved0[TPI_RING_LINE - 24];
    /* Line 1: written by the writer only (but data_seq, which a reader's
     * nudge bumps too: an atomic add, read back by nobody, TCP-30). */
    _Atomic uint64_t tail;
    _Atomic uint32_t data_seq;
    _Atomic uint32_t writer_sleeps;
    _Atomic uint32_t writer_closed;
    uint8_t pad1[TPI_RING_LINE - 20];
    /* Line 2: written by the reader only. */
    _Atomic uint64_t head;
    _Atomic uint32_t space_seq;
    _Atomic uint32_t reader_sleeps;
    _Atomic uint32_t reader_closed;
    uint8_t pad2[TPI_RING_LINE - 20];
    uint8_t reserved3[TPI_RING_LINE];
} ring_shared;

_Static_assert(sizeof(ring_shared) == TPI_RING_HEAD, "the header is four lines");
_Static_assert(offsetof(ring_shared, tail) == TPI_RING_LINE, "the writer's line");
_Static_assert(offsetof(ring_shared, head) == 2 * TPI_RING_LINE, "the reader's line");
/* Another process reads these words: they must be plain lock-free words of
 * their size, no lock beside them in this process's memory. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
               "lock-free 32- and 64-bit atomics");
_Static_assert(sizeof(_Atomic uint32_t) == 4 && sizeof(_Atomic uint64_t) == 8,
               "atomics are their plain size (the futex word is a u32)");
_Static_assert(TPI_RING_RECORD_MAX(TPI_RING_CAP_MAX) <= UINT32_MAX, "a length is a u32");
_Static_assert(TPI_RING_RECORD_MAX(TPI_RING_CAP_MIN) >= 256, "a useful smallest ring");

static ring_shared *SH(const tpi_ring *r) {
    return (ring_shared *)(void *)r->base;
}

static uint64_t round8(uint64_t n) {
    return (n + TPI_RING_ALIGN - 1) & ~(uint64_t)(TPI_RING_ALIGN - 1);
}

uint64_t tpi_ring_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *tpi_ring_status_name(tpi_ring_status st) {
    switch (st) {
    case TPI_RING_OK:
        return "ok";
    case TPI_RING_EMPTY:
        return "empty";
    case TPI_RING_FULL:
        return "full";
    case TPI_RING_TOOBIG:
        return "too big";
    case TPI_RING_CLOSED:
        return "closed";
    case TPI_RING_CORRUPT:
        return "corrupt";
    case TPI_RING_TIMEOUT:
        return "timed out";
    }
    return "?";
}

const char *tpi_ring_why(const tpi_ring *r) {
    return r->why;
}

static tpi_ring_status corrupt(tpi_ring *r, const char *fmt, ...) TPI_PRINTF(2, 3);
/* The ring broke a rule: it stays broken (no resynchronising on bytes the
 * peer may still be scribbling), and why is kept for the log. */
static tpi_ring_status corrupt(tpi_ring *r, const char *fmt, ...) {
    if (!r->corrupt) {
        r->corrupt = 1;
        va_list ap;
        va_start(ap, fmt);
        tpi_vformat(r->why, sizeof r->why, fmt, ap);
        va_end(ap);
    }
    return TPI_RING_CORRUPT;
}

/* ---- Futexes ---------------------------------------------------------------------- */

/* Shared (not FUTEX_PRIVATE_FLAG): the other end is another process. */
static void futex_wake(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)(void *)w, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* Sleeps while *w == seen, until deadline_ns (absolute CLOCK_MONOTONIC, as
 * FUTEX_WAIT_BITSET takes it: no drift from recomputing a relative time).
 * Any return (woken, changed, signal, deadline) sends the caller to look. */
static void futex_wait(_Atomic uint32_t *w, uint32_t seen, uint64_t deadline_ns) {
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000ull),
                          .tv_nsec = (long)(deadline_ns % 1000000000ull)};
    syscall(SYS_futex, (uint32_t *)(void *)w, FUTEX_WAIT_BITSET, seen, &ts, NULL,
            FUTEX_BITSET_MATCH_ANY);
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* The other end's futex word and "sleeps" flag: the reader sleeps on
 * data_seq, the writer on space_seq. */
static void peer_words(tpi_ring *r, _Atomic uint32_t **seq, _Atomic uint32_t **sleeps) {
    ring_shared *s = SH(r);
    *seq = r->writer ? &s->data_seq : &s->space_seq;
    *sleeps = r->writer ? &s->reader_sleeps : &s->writer_sleeps;
}

static void own_words(tpi_ring *r, _Atomic uint32_t **seq, _Atomic uint32_t **sleeps) {
    ring_shared *s = SH(r);
    *seq = r->writer ? &s->space_seq : &s->data_seq;
    *sleeps = r->writer ? &s->writer_sleeps : &s->reader_sleeps;
}

/* Rings an eventfd: its counter goes up by one. EAGAIN (the counter at its
 * maximum) leaves it readable, which is all a wake-up needs. */
static void bell_ring(int fd) {
    uint64_t one = 1;
    ssize_t k;
    do
        k = write(fd, &one, sizeof one);
    while (k < 0 && errno == EINTR);
}

/* After publishing (tail or head stored): wakes the other end if it sleeps,
 * or always when forced. The fence orders our counter before the flag's load
 * (the sleeper's fence orders its flag before its counter's load). */
static void wake_peer(tpi_ring *r, int force) {
    _Atomic uint32_t *seq, *sleeps;
    peer_words(r, &seq, &sleeps);
    atomic_thread_fence(memory_order_seq_cst);
    uint32_t how = atomic_load_explicit(sleeps, memory_order_relaxed);
    if (!force && !how)
        return;
    atomic_fetch_add_explicit(seq, 1, memory_order_release);
    /* 2: a thread of the other process sleeps on the futex though the end
     * has a bell (a caller reading its own reply, TCP-30). */
    if (r->bell >= 0 && how != TPI_RING_SLEEPS_FUTEX)
        bell_ring(r->bell);
    else
        futex_wake(seq);
}

void tpi_ring_wake(tpi_ring *r) {
    wake_peer(r, 1);
}

/* ---- Setting up --------------------------------------------------------------------- */

int tpi_ring_init(tpi_ring *r, void *base, size_t size, char *err, size_t err_len) {
    memset(r, 0, sizeof *r);
    r->bell = -1;
    if ((uintptr_t)base % TPI_RING_LINE != 0) {
        tpi_format(err, err_len, "shared memory ring at %p: not aligned to %d bytes", base,
                   TPI_RING_LINE);
        return -1;
    }
    if (size < TPI_RING_HEAD + TPI_RING_CAP_MIN) {
        tpi_format(err, err_len, "shared memory ring of %zu bytes: at least %llu needed", size,
                   (unsigned long long)(TPI_RING_HEAD + TPI_RING_CAP_MIN));
        return -1;
    }
    uint64_t cap = TPI_RING_CAP_MIN;
    while (cap < TPI_RING_CAP_MAX && TPI_RING_HEAD + cap * 2 <= size)
        cap *= 2;
    ring_shared *s = base;
    memset(s, 0, sizeof *s);
    memcpy(s->magic, TPI_RING_MAGIC, 8);
    s->version = TPI_RING_VERSION;
    s->head_size = TPI_RING_HEAD;
    s->cap = cap;
    /* The reader attaches after it hears of the ring on the stream, whose
     * own ordering publishes these bytes; the release is for a reader that
     * polls the same memory. */
    atomic_store_explicit(&s->tail, 0, memory_order_release);
    r->base = base;
    r->data = (uint8_t *)base + TPI_RING_HEAD;
    r->cap = cap;
    r->writer = 1;
    return 0;
}

static int all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

int tpi_ring_attach(tpi_ring *r, void *base, size_t size, char *err, size_t err_len) {
    memset(r, 0, sizeof *r);
    r->bell = -1;
    if ((uintptr_t)base % TPI_RING_LINE != 0 || size < TPI_RING_HEAD + TPI_RING_CAP_MIN) {
        tpi_format(err, err_len,
                   "shared memory ring refused: a mapping of %zu bytes at %p "
                   "(at least %llu, aligned to %d) (TCP-26)",
                   size, base, (unsigned long long)(TPI_RING_HEAD + TPI_RING_CAP_MIN),
                   TPI_RING_LINE);
        return -1;
    }
    /* Line 0 copied once, then only the copy is looked at. */
    ring_shared hd;
    memcpy(&hd, base, offsetof(ring_shared, tail));
    memcpy(hd.reserved3, ((const ring_shared *)base)->reserved3, sizeof hd.reserved3);
    const char *why = NULL;
    if (memcmp(hd.magic, TPI_RING_MAGIC, 8) != 0)
        why = "bad magic";
    else if (hd.version != TPI_RING_VERSION)
        why = "another version";
    else if (hd.head_size != TPI_RING_HEAD)
        why = "another header size";
    else if (hd.cap < TPI_RING_CAP_MIN || hd.cap > TPI_RING_CAP_MAX || (hd.cap & (hd.cap - 1)))
        why = "a capacity that is not a power of two in range";
    else if (hd.cap > size - TPI_RING_HEAD)
        why = "a capacity past the mapping's end";
    else if (!all_zero(hd.reserved0, sizeof hd.reserved0) ||
             !all_zero(hd.reserved3, sizeof hd.reserved3))
        why = "reserved bytes set";
    ring_shared *s = base;
    uint64_t head = atomic_load_explicit(&s->head, memory_order_relaxed);
    if (!why && head % TPI_RING_ALIGN != 0)
        why = "a head that is not a multiple of 8";
    if (why) {
        tpi_format(err, err_len,
                   "shared memory ring refused: %s (version %u, header %u "
                   "bytes, capacity %llu, mapping %zu bytes) (TCP-26)",
                   why, hd.version, hd.head_size, (unsigned long long)hd.cap, size);
        return -1;
    }
    r->base = base;
    r->data = (uint8_t *)base + TPI_RING_HEAD;
    r->cap = hd.cap;
    r->pos = head;
    r->writer = 0;
    return 0;
}

/* ---- The writer ------------------------------------------------------------------- */

static void put_rec_head(uint8_t *p, uint32_t len, uint32_t kind) {
    memcpy(p, &len, 4);
    memcpy(p + 4, &kind, 4);
}

/* The room check of a record of len payload bytes, the pad it needs before
 * it in *pad and its bytes in *total; OK, FULL, TOOBIG, CLOSED or CORRUPT. */
static tpi_ring_status room(tpi_ring *r, uint64_t len, uint64_t *pad, uint64_t *total) {
    TPI_ASSERT(r->writer);
    if (r->corrupt)
        return TPI_RING_CORRUPT;
    ring_shared *s = SH(r);
    if (atomic_load_explicit(&s->reader_closed, memory_order_acquire))
        return TPI_RING_CLOSED;
    if (len > TPI_RING_RECORD_MAX(r->cap))
        return TPI_RING_TOOBIG;
    *total = TPI_RING_REC_HEAD + round8(len);
    uint64_t head = atomic_load_explicit(&s->head, memory_order_acquire);
    uint64_t used = r->pos - head;
    if (used > r->cap || head % TPI_RING_ALIGN != 0)
        return corrupt(r, "the reader's head is impossible: %llu bytes behind our tail %llu",
                       (unsigned long long)used, (unsigned long long)r->pos);
    r->other = head;
    uint64_t off = r->pos & (r->cap - 1), end = r->cap - off;
    *pad = *total > end ? end : 0; /* never at 0: total <= cap / 2 */
    return *pad + *total > r->cap - used ? TPI_RING_FULL : TPI_RING_OK;
}

tpi_ring_status tpi_ring_room(tpi_ring *r, uint64_t len) {
    uint64_t pad, total;
    return room(r, len, &pad, &total);
}

tpi_ring_status tpi_ring_write(tpi_ring *r, const struct iovec *iov, int n) {
    TPI_ASSERT(r->writer && n >= 0);
    uint64_t max = TPI_RING_RECORD_MAX(r->cap), len = 0;
    for (int i = 0; i < n; i++) {
        if (iov[i].iov_len > max - len) {
            len = max + 1; /* TOOBIG, once room() checked what comes before it */
            break;
        }
        len += iov[i].iov_len;
    }
    uint64_t pad = 0, total = 0;
    tpi_ring_status st = room(r, len, &pad, &total);
    if (st != TPI_RING_OK)
        return st;
    uint64_t off = r->pos & (r->cap - 1);
    if (pad) {
        put_rec_head(r->data + off, (uint32_t)(pad - TPI_RING_REC_HEAD), TPI_RING_KIND_PAD);
        off = 0;
    }
    uint8_t *p = r->data + off;
    put_rec_head(p, (uint32_t)len, TPI_RING_KIND_DATA);
    p += TPI_RING_REC_HEAD;
    for (int i = 0; i < n; i++) {
        if (iov[i].iov_len)
            memcpy(p, iov[i].iov_base, iov[i].iov_len);
        p += iov[i].iov_len;
    }
    memset(p, 0, round8(len) - len);
    TPI_ASSERT(off + total <= r->cap);
    r->pos += pad + total;
    atomic_store_explicit(&SH(r)->tail, r->pos, memory_order_release);
    wake_peer(r, 0);
    return TPI_RING_OK;
}

/* ---- The reader ------------------------------------------------------------------- */

/* A record header's two words, each loaded once: whatever the writer
 * stores there later, the checks and the copy use these. */
static void get_rec_head(const uint8_t *p, uint32_t *len, uint32_t *kind) {
    *len = __atomic_load_n((const uint32_t *)(const void *)p, __ATOMIC_RELAXED);
    *kind = __atomic_load_n((const uint32_t *)(const void *)(p + 4), __ATOMIC_RELAXED);
}

/* Finds the next record without consuming it: its payload at data + *at,
 * *len bytes, and *skip bytes to consume with it (a pad before it, its
 * header, its padding). */
static tpi_ring_status next(tpi_ring *r, uint64_t *at, uint32_t *len, uint64_t *skip) {
    if (r->corrupt)
        return TPI_RING_CORRUPT;
    ring_shared *s = SH(r);
    /* closed before tail: the writer stores them in the other order. */
    uint32_t closed = atomic_load_explicit(&s->writer_closed, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&s->tail, memory_order_acquire);
    uint64_t avail = tail - r->pos;
    if (avail == 0)
        return closed ? TPI_RING_CLOSED : TPI_RING_EMPTY;
    if (avail > r->cap || avail % TPI_RING_ALIGN != 0)
        return corrupt(r, "the writer's tail is %llu bytes past our head %llu",
                       (unsigned long long)avail, (unsigned long long)r->pos);
    uint64_t off = r->pos & (r->cap - 1);
    uint32_t l, kind;
    get_rec_head(r->data + off, &l, &kind);
    *skip = 0;
    if (kind == TPI_RING_KIND_PAD) {
        uint64_t end = r->cap - off;
        /* A pad fills the rest of the data, and the writer publishes it with
         * the record it makes room for. */
        if (off == 0 || l != end - TPI_RING_REC_HEAD || avail <= end)
            return corrupt(r, "a pad record of %llu bytes at %llu", (unsigned long long)l,
                           (unsigned long long)off);
        *skip = end;
        avail -= end;
        off = 0;
        get_rec_head(r->data, &l, &kind);
    }
    if (kind != TPI_RING_KIND_DATA)
        return corrupt(r, "a record of unknown kind %#llx at %llu", (unsigned long long)kind,
                       (unsigned long long)off);
    uint64_t total = TPI_RING_REC_HEAD + round8(l);
    if (l > TPI_RING_RECORD_MAX(r->cap) || total > avail || off + total > r->cap)
        return corrupt(r, "a record of %llu bytes where %llu are published", (unsigned long long)l,
                       (unsigned long long)avail);
    *at = off + TPI_RING_REC_HEAD;
    *len = l;
    *skip += total;
    return TPI_RING_OK;
}

/* Frees the record's room: head moves on only after the bytes were used. */
static void consume(tpi_ring *r, uint64_t skip) {
    r->pos += skip;
    atomic_store_explicit(&SH(r)->head, r->pos, memory_order_release);
    wake_peer(r, 0);
}

tpi_ring_status tpi_ring_read(tpi_ring *r, void *buf, size_t buf_len, size_t *len) {
    TPI_ASSERT(!r->writer);
    uint64_t at = 0, skip = 0;
    uint32_t l = 0;
    tpi_ring_status st = next(r, &at, &l, &skip);
    if (st != TPI_RING_OK)
        return st;
    *len = l;
    if (l > buf_len)
        return TPI_RING_TOOBIG;
    if (l)
        memcpy(buf, r->data + at, l);
    consume(r, skip);
    return TPI_RING_OK;
}

tpi_ring_status tpi_ring_read_if(tpi_ring *r, tpi_ring_take_fn *fn, void *ctx, int *took) {
    TPI_ASSERT(!r->writer);
    uint64_t at = 0, skip = 0;
    uint32_t l = 0;
    *took = 0;
    tpi_ring_status st = next(r, &at, &l, &skip);
    if (st != TPI_RING_OK)
        return st;
    *took = fn(ctx, r->data + at, l) != 0;
    if (*took)
        consume(r, skip);
    return TPI_RING_OK;
}

/* tpi_ring_read_cb's taker: hands every record on, and takes it. */
typedef struct take_all_ctx {
    tpi_ring_read_fn *fn;
    void *ctx;
} take_all_ctx;

static int take_all(void *ctx, const uint8_t *p, size_t len) {
    take_all_ctx *t = ctx;
    t->fn(t->ctx, p, len);
    return 1;
}

tpi_ring_status tpi_ring_read_cb(tpi_ring *r, tpi_ring_read_fn *fn, void *ctx) {
    take_all_ctx t = {fn, ctx};
    int took = 0;
    return tpi_ring_read_if(r, take_all, &t, &took);
}

/* ---- Waiting and ending ------------------------------------------------------------- */

/* Something for this end to look at: the other end moved or closed. */
static int ready(tpi_ring *r) {
    ring_shared *s = SH(r);
    if (r->corrupt)
        return 1;
    if (r->writer)
        return atomic_load_explicit(&s->reader_closed, memory_order_acquire) ||
               atomic_load_explicit(&s->head, memory_order_acquire) != r->other;
    return atomic_load_explicit(&s->writer_closed, memory_order_acquire) ||
           atomic_load_explicit(&s->tail, memory_order_acquire) != r->pos;
}

int tpi_ring_ready(tpi_ring *r) {
    return ready(r);
}

void tpi_ring_set_bell(tpi_ring *r, int bell) {
    r->bell = bell;
}

int tpi_ring_arm(tpi_ring *r) {
    _Atomic uint32_t *seq, *sleeps;
    own_words(r, &seq, &sleeps);
    atomic_store_explicit(sleeps, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    return ready(r);
}

void tpi_ring_disarm(tpi_ring *r) {
    _Atomic uint32_t *seq, *sleeps;
    own_words(r, &seq, &sleeps);
    atomic_store_explicit(sleeps, 0, memory_order_relaxed);
}

tpi_ring_status tpi_ring_wait(tpi_ring *r, uint64_t spin_ns, uint64_t deadline_ns) {
    if (ready(r))
        return TPI_RING_OK;
    uint64_t now = tpi_ring_now_ns();
    if (spin_ns > TPI_RING_SPIN_NS_MAX)
        spin_ns = TPI_RING_SPIN_NS_MAX;
    if (spin_ns) {
        /* The clock is read every 64 turns: cheap (vDSO), yet not free. */
        uint64_t until = now + spin_ns < deadline_ns ? now + spin_ns : deadline_ns;
        for (unsigned i = 1; now < until; i++) {
            cpu_relax();
            if (ready(r))
                return TPI_RING_OK;
            if (i % 64 == 0)
                now = tpi_ring_now_ns();
        }
    }
    _Atomic uint32_t *seq, *sleeps;
    own_words(r, &seq, &sleeps);
    /* Each turn sleeps until the deadline; a wake-up, a signal or a peer
     * bumping the word for nothing ends a turn early, the deadline ends
     * them all. */
    while (now < deadline_ns) {
        uint32_t seen = atomic_load_explicit(seq, memory_order_acquire);
        atomic_store_explicit(sleeps, 1, memory_order_relaxed);
        atomic_thread_fence(memory_order_seq_cst);
        if (ready(r)) {
            atomic_store_explicit(sleeps, 0, memory_order_relaxed);
            return TPI_RING_OK;
        }
        futex_wait(seq, seen, deadline_ns);
        atomic_store_explicit(sleeps, 0, memory_order_relaxed);
        if (ready(r))
            return TPI_RING_OK;
        now = tpi_ring_now_ns();
    }
    return ready(r) ? TPI_RING_OK : TPI_RING_TIMEOUT;
}

tpi_ring_status tpi_ring_sleep(tpi_ring *r, int (*awake)(void *), void *ctx, uint64_t deadline_ns) {
    TPI_ASSERT(!r->writer);
    _Atomic uint32_t *seq, *sleeps;
    own_words(r, &seq, &sleeps);
    uint32_t seen = atomic_load_explicit(seq, memory_order_acquire);
    atomic_store_explicit(sleeps, TPI_RING_SLEEPS_FUTEX, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    if (!ready(r) && !awake(ctx))
        futex_wait(seq, seen, deadline_ns);
    atomic_store_explicit(sleeps, 0, memory_order_relaxed);
    if (ready(r))
        return TPI_RING_OK;
    return tpi_ring_now_ns() < deadline_ns ? TPI_RING_OK : TPI_RING_TIMEOUT;
}

void tpi_ring_nudge(tpi_ring *r) {
    TPI_ASSERT(!r->writer);
    _Atomic uint32_t *seq, *sleeps;
    own_words(r, &seq, &sleeps);
    atomic_fetch_add_explicit(seq, 1, memory_order_release);
    futex_wake(seq);
}

void tpi_ring_close(tpi_ring *r) {
    ring_shared *s = SH(r);
    atomic_store_explicit(r->writer ? &s->writer_closed : &s->reader_closed, 1,
                          memory_order_release);
    wake_peer(r, 1);
}

int tpi_ring_peer_gone(int pidfd) {
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    int n;
    do
        n = poll(&p, 1, 0);
    while (n < 0 && errno == EINTR);
    return n > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) ? 1 : 0;
}
