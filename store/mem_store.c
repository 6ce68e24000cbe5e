/*
 * mem_store.c: the simulator's rendezvous store, in memory (spec/store.md
 * STORE-11).
 *
 * The same contract as a ":memory:" SQLite store (STORE-1..5, STORE-10),
 * with the same messages, but a world's rendezvous reads are no longer
 * SQLite statements: a 1,000-worker world makes some twenty thousand scans
 * over ten million keys, and each row through SQLite (a step, three column
 * reads, the connection's mutex per call, a copy to NUL-terminate the value)
 * cost several times the work the caller does with it.
 *
 * Keys are kept in byte order (strcmp, which is SQLite's BINARY order for
 * keys without NULs) in a two-level sorted array: a directory of chunks of
 * at most MEMS_CHUNK_MAX entries each. A lookup is two binary searches; an
 * insert moves at most a chunk's entries (a full chunk splits in two and
 * the directory moves its pointers); a scan walks entries in place and hands
 * fn the stored bytes, which are kept NUL-terminated, without a copy. Each
 * entry is one allocation: the key, a NUL, the value, a NUL.
 *
 * Nothing here depends on addresses or on any order but the keys': a run of
 * the simulator sees the same answers in the same order on every machine.
 * A handle may be shared between threads: every operation holds its mutex.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "store/store_int.h"
#include "store/mem_store.h"

/* Entries per chunk: a split moves half of them, an insert at most all. */
#define MEMS_CHUNK_MAX 64
/* The name in messages: the same as the SQLite store's private database, so
 * a message reads alike whichever one a simulated world uses. */
#define MEMS_NAME ":memory:"
/* Bytes of a bad value quoted in a message (as the SQLite store). */
#define MEMS_MSG_VALUE_MAX 32

_Static_assert(TP_STORE_VALUE_LEN_MAX <= UINT32_MAX - 2, "a value's length fits 32 bits");
_Static_assert(MEMS_CHUNK_MAX >= 4 && MEMS_CHUNK_MAX % 2 == 0, "a split leaves two halves");

typedef struct mems_entry {
    char *key; /* key, NUL, value, NUL: one allocation */
    uint32_t key_len;
    uint32_t len; /* the value's */
} mems_entry;

typedef struct mems_chunk {
    uint32_t n;
    mems_entry e[MEMS_CHUNK_MAX];
} mems_chunk;

typedef struct mems_store {
    tp_store base; /* first: a tp_store * is a mems_store * */
    pthread_mutex_t mu;
    int scanning; /* fn of a scan is running (it must not call the store) */
    mems_chunk **chunks;
    uint32_t nchunks, chunks_cap;
    uint64_t instance; /* STORE-13: set at open, never changed */
} mems_store;

/* STORE-13: the instances handed out in this process (the last one). */
static atomic_uint_fast64_t mems_instances;

/* Where a key is, or would go: chunk c, entry i. */
typedef struct mems_pos {
    uint32_t c, i;
} mems_pos;

static const char *mems_value(const mems_entry *e) {
    return e->key + e->key_len + 1;
}

/* ------------------------------------------------------------------------ */
/* Messages: as the SQLite store's (STORE-5), so tests and the core read the
 * same text. */

static tp_status mems_fail(mems_store *s, tp_status status, const char *fmt, ...) TPI_PRINTF(3, 4);

static tp_status mems_fail(mems_store *s, tp_status status, const char *fmt, ...) {
    char *buf = s->base.errmsg;
    size_t n = tpi_format(buf, sizeof s->base.errmsg, "store '%s': ", MEMS_NAME);
    va_list ap;
    va_start(ap, fmt);
    tpi_vformat(buf + n, sizeof s->base.errmsg - n, fmt, ap);
    va_end(ap);
    return tpi_fail_msg(status, buf);
}

static tp_status mems_check_key(mems_store *s, const char *op, const char *key, size_t *len) {
    TPI_ASSERT(key != NULL);
    *len = strnlen(key, (size_t)TP_STORE_KEY_LEN_MAX + 1);
    if (*len == 0)
        return mems_fail(s, TP_EINVAL, "%s: empty key", op);
    if (*len > TP_STORE_KEY_LEN_MAX)
        return mems_fail(s, TP_EINVAL, "%s '%.40s...': key longer than %d bytes", op, key,
                         TP_STORE_KEY_LEN_MAX);
    return TP_OK;
}

static tp_status mems_check_value(mems_store *s, const char *op, const char *key,
                                  const void *value, size_t len) {
    TPI_ASSERT(value != NULL || len == 0);
    if (len > TP_STORE_VALUE_LEN_MAX)
        return mems_fail(s, TP_EINVAL, "%s '%s': value of %zu bytes is over the limit of %u", op,
                         key, len, (unsigned)TP_STORE_VALUE_LEN_MAX);
    return TP_OK;
}

/* A value quoted for a message: its first bytes, anything unprintable as '?'. */
static void mems_quote(char *out, size_t out_len, const void *value, size_t len) {
    const unsigned char *p = value;
    size_t n = len < out_len - 1 ? len : out_len - 1;
    for (size_t i = 0; i < n; i++)
        out[i] = (p[i] >= 0x20 && p[i] < 0x7f) ? (char)p[i] : '?';
    out[n] = '\0';
}

/* Each operation holds the mutex from its argument checks (which write
 * errmsg) to its end; a call from inside a scan's fn is a programmer error. */
static void mems_lock(mems_store *s) {
    int rc = pthread_mutex_lock(&s->mu);
    TPI_ASSERT(rc == 0);
    TPI_ASSERT(!s->scanning); /* STORE-10: fn must not call the store */
}

static void mems_unlock(mems_store *s) {
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------------ */
/* The sorted chunks. */

/*
 * The position of key: *found says whether it is there; else the position
 * it would take (which may be one past a chunk's last entry, or chunk
 * nchunks when the store is empty).
 */
static mems_pos mems_find(const mems_store *s, const char *key, int *found) {
    *found = 0;
    if (s->nchunks == 0)
        return (mems_pos){0, 0};
    /* The last chunk whose first key is <= key (chunk 0 when none is). */
    uint32_t lo = 1, hi = s->nchunks;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (strcmp(s->chunks[mid]->e[0].key, key) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    mems_pos p = {lo - 1, 0};
    const mems_chunk *ch = s->chunks[p.c];
    uint32_t a = 0, b = ch->n;
    while (a < b) {
        uint32_t mid = a + (b - a) / 2;
        int cmp = strcmp(ch->e[mid].key, key);
        if (cmp == 0) {
            *found = 1;
            p.i = mid;
            return p;
        }
        if (cmp < 0)
            a = mid + 1;
        else
            b = mid;
    }
    p.i = a;
    return p;
}

static mems_entry *mems_lookup(mems_store *s, const char *key) {
    int found;
    mems_pos p = mems_find(s, key, &found);
    return found ? &s->chunks[p.c]->e[p.i] : NULL;
}

/* A new entry's bytes: key, NUL, value, NUL. NULL when out of memory. */
static char *mems_bytes(const char *key, size_t key_len, const void *value, size_t len) {
    char *b = malloc(key_len + len + 2);
    if (!b)
        return NULL;
    memcpy(b, key, key_len);
    b[key_len] = '\0';
    if (len)
        memcpy(b + key_len + 1, value, len);
    b[key_len + 1 + len] = '\0';
    return b;
}

/* Room for one more chunk pointer in the directory; 0 when out of memory. */
static int mems_dir_reserve(mems_store *s) {
    if (s->nchunks < s->chunks_cap)
        return 1;
    uint32_t cap = s->chunks_cap ? s->chunks_cap * 2 : 8;
    mems_chunk **c = realloc(s->chunks, cap * sizeof *c);
    if (!c)
        return 0;
    s->chunks = c;
    s->chunks_cap = cap;
    return 1;
}

/* Inserts e at p (from mems_find, not found). TP_ENOMEM changes nothing. */
static tp_status mems_insert(mems_store *s, mems_pos p, mems_entry e) {
    if (s->nchunks == 0) {
        mems_chunk *ch = malloc(sizeof *ch);
        if (!ch || !mems_dir_reserve(s)) {
            free(ch);
            return TP_ENOMEM;
        }
        ch->n = 0;
        s->chunks[s->nchunks++] = ch;
        p = (mems_pos){0, 0};
    }
    mems_chunk *ch = s->chunks[p.c];
    if (ch->n == MEMS_CHUNK_MAX) {
        /* Split: the upper half moves to a new chunk after this one. */
        mems_chunk *next = malloc(sizeof *next);
        if (!next || !mems_dir_reserve(s)) {
            free(next);
            return TP_ENOMEM;
        }
        uint32_t half = MEMS_CHUNK_MAX / 2;
        next->n = MEMS_CHUNK_MAX - half;
        memcpy(next->e, ch->e + half, next->n * sizeof ch->e[0]);
        ch->n = half;
        memmove(s->chunks + p.c + 2, s->chunks + p.c + 1,
                (s->nchunks - p.c - 1) * sizeof s->chunks[0]);
        s->chunks[p.c + 1] = next;
        s->nchunks++;
        if (p.i > half) {
            p.c++;
            p.i -= half;
            ch = next;
        }
    }
    TPI_ASSERT(p.i <= ch->n && ch->n < MEMS_CHUNK_MAX);
    memmove(ch->e + p.i + 1, ch->e + p.i, (ch->n - p.i) * sizeof ch->e[0]);
    ch->e[p.i] = e;
    ch->n++;
    return TP_OK;
}

static void mems_remove(mems_store *s, mems_pos p) {
    mems_chunk *ch = s->chunks[p.c];
    free(ch->e[p.i].key);
    ch->n--;
    memmove(ch->e + p.i, ch->e + p.i + 1, (ch->n - p.i) * sizeof ch->e[0]);
    if (ch->n > 0)
        return;
    /* An empty chunk leaves: a chunk's first key is always valid. */
    free(ch);
    memmove(s->chunks + p.c, s->chunks + p.c + 1, (s->nchunks - p.c - 1) * sizeof s->chunks[0]);
    s->nchunks--;
}

/* Sets key to value, in place or as a new entry. */
static tp_status mems_put(mems_store *s, const char *op, const char *key, size_t key_len,
                          const void *value, size_t len) {
    char *b = mems_bytes(key, key_len, value, len);
    if (!b)
        return mems_fail(s, TP_ENOMEM, "%s '%s': out of memory for %zu bytes", op, key, len);
    int found;
    mems_pos p = mems_find(s, key, &found);
    mems_entry e = {.key = b, .key_len = (uint32_t)key_len, .len = (uint32_t)len};
    if (found) {
        mems_entry *old = &s->chunks[p.c]->e[p.i];
        free(old->key);
        *old = e;
        return TP_OK;
    }
    if (mems_insert(s, p, e) != TP_OK) {
        free(b);
        return mems_fail(s, TP_ENOMEM, "%s '%s': out of memory for %zu bytes", op, key, len);
    }
    return TP_OK;
}

/* ------------------------------------------------------------------------ */
/* The operations (STORE-1..3, STORE-10). */

static tp_status mems_set(tp_store *base, const char *key, const void *value, size_t len) {
    TPI_ASSERT(base != NULL);
    mems_store *s = (mems_store *)base;
    size_t key_len = 0;
    mems_lock(s);
    tp_status st = mems_check_key(s, "set", key, &key_len);
    if (st == TP_OK)
        st = mems_check_value(s, "set", key, value, len);
    if (st == TP_OK)
        st = mems_put(s, "set", key, key_len, value, len);
    mems_unlock(s);
    return st;
}

static tp_status mems_get(tp_store *base, const char *key, void **value, size_t *len) {
    TPI_ASSERT(base != NULL && value != NULL && len != NULL);
    mems_store *s = (mems_store *)base;
    *value = NULL;
    *len = 0;
    size_t key_len = 0;
    mems_lock(s);
    tp_status st = mems_check_key(s, "get", key, &key_len);
    const mems_entry *e = st == TP_OK ? mems_lookup(s, key) : NULL;
    if (st == TP_OK && !e) {
        /* Absent is an answer, not a failure: polling callers see it all the
         * time, so it stays out of tp_errmsg() (ERR-2). */
        tpi_format(s->base.errmsg, sizeof s->base.errmsg, "store '%s': get '%s': no such key",
                   MEMS_NAME, key);
        st = TP_ENOENT;
    } else if (st == TP_OK) {
        char *copy = malloc((size_t)e->len + 1);
        if (!copy) {
            st = mems_fail(s, TP_ENOMEM, "get '%s': out of memory for %u bytes", key, e->len);
        } else {
            memcpy(copy, mems_value(e), (size_t)e->len + 1); /* with its NUL */
            *value = copy;
            *len = e->len;
        }
    }
    mems_unlock(s);
    return st;
}

static tp_status mems_del(tp_store *base, const char *key) {
    TPI_ASSERT(base != NULL);
    mems_store *s = (mems_store *)base;
    size_t key_len = 0;
    mems_lock(s);
    tp_status st = mems_check_key(s, "del", key, &key_len);
    if (st == TP_OK) {
        int found;
        mems_pos p = mems_find(s, key, &found);
        if (found)
            mems_remove(s, p);
    }
    mems_unlock(s);
    return st;
}

static tp_status mems_add(tp_store *base, const char *key, int64_t delta, int64_t *result) {
    TPI_ASSERT(base != NULL && result != NULL);
    mems_store *s = (mems_store *)base;
    size_t key_len = 0;
    int64_t old = 0;
    mems_lock(s);
    tp_status st = mems_check_key(s, "add", key, &key_len);
    const mems_entry *e = st == TP_OK ? mems_lookup(s, key) : NULL;
    if (e && !tpi_store_parse_i64(mems_value(e), e->len, &old)) {
        char q[MEMS_MSG_VALUE_MAX + 1];
        mems_quote(q, sizeof q, mems_value(e), e->len);
        st = mems_fail(s, TP_EINVAL, "add '%s': value '%s%s' (%u bytes) is not a decimal integer",
                       key, q, e->len > MEMS_MSG_VALUE_MAX ? "..." : "", e->len);
    }
    if (st == TP_OK && ((delta > 0 && old > INT64_MAX - delta) ||
                        (delta < 0 && old < INT64_MIN - delta)))
        st = mems_fail(s, TP_ERANGE, "add '%s': %" PRId64 " + %" PRId64 " overflows a 64-bit integer",
                       key, old, delta);
    if (st == TP_OK) {
        char text[24];
        size_t n = tpi_format(text, sizeof text, "%" PRId64, old + delta);
        st = mems_put(s, "add", key, key_len, text, n);
    }
    if (st == TP_OK)
        *result = old + delta;
    mems_unlock(s);
    return st;
}

static tp_status mems_compare_set(tp_store *base, const char *key, const void *expected,
                                  size_t expected_len, const void *desired, size_t desired_len,
                                  int *swapped) {
    TPI_ASSERT(base != NULL && swapped != NULL);
    TPI_ASSERT(expected != NULL || expected_len == 0);
    mems_store *s = (mems_store *)base;
    *swapped = 0;
    size_t key_len = 0;
    mems_lock(s);
    tp_status st = mems_check_key(s, "compare_set", key, &key_len);
    if (st == TP_OK && expected)
        st = mems_check_value(s, "compare_set (expected)", key, expected, expected_len);
    if (st == TP_OK)
        st = mems_check_value(s, "compare_set", key, desired, desired_len);
    if (st == TP_OK) {
        const mems_entry *e = mems_lookup(s, key);
        int match = e ? expected != NULL && e->len == expected_len &&
                            (expected_len == 0 || memcmp(mems_value(e), expected, expected_len) == 0)
                      : expected == NULL;
        if (match)
            st = mems_put(s, "compare_set", key, key_len, desired, desired_len);
        *swapped = match && st == TP_OK;
    }
    mems_unlock(s);
    return st;
}

/*
 * The first position past every key that starts with prefix (of length n):
 * the position of the smallest string above them all, the prefix with its
 * last byte below 0xff raised by one and what follows it cut.
 */
static mems_pos mems_prefix_end(const mems_store *s, const char *prefix, size_t n) {
    char above[TP_STORE_KEY_LEN_MAX + 1];
    while (n > 0 && (unsigned char)prefix[n - 1] == 0xff)
        n--;
    if (n == 0) /* every key starts with it */
        return (mems_pos){s->nchunks, 0};
    memcpy(above, prefix, n);
    above[n - 1] = (char)((unsigned char)above[n - 1] + 1);
    above[n] = '\0';
    int found;
    return mems_find(s, above, &found);
}

static tp_status mems_scan(tp_store *base, const char *prefix,
                           int (*fn)(void *arg, const char *key, const void *value, size_t len),
                           void *arg) {
    TPI_ASSERT(base != NULL && prefix != NULL && fn != NULL);
    mems_store *s = (mems_store *)base;
    size_t n = 0;
    mems_lock(s);
    tp_status st = mems_check_key(s, "scan", prefix, &n);
    if (st != TP_OK || s->nchunks == 0) {
        mems_unlock(s);
        return st;
    }
    /* The keys under the prefix are the run [from, to) in key order: the
     * prefix itself sorts before every key that extends it. No key is
     * compared on the way. */
    int found;
    mems_pos p = mems_find(s, prefix, &found);
    mems_pos to = mems_prefix_end(s, prefix, n);
    s->scanning = 1;
    for (; p.c < to.c || (p.c == to.c && p.i < to.i); p.c++, p.i = 0) {
        const mems_chunk *ch = s->chunks[p.c];
        uint32_t end = p.c == to.c ? to.i : ch->n;
        for (; p.i < end; p.i++) {
            const mems_entry *e = &ch->e[p.i];
            if (fn(arg, e->key, mems_value(e), e->len))
                goto done;
        }
    }
done:
    s->scanning = 0;
    mems_unlock(s);
    return st;
}

static void mems_close(tp_store *base) {
    if (!base)
        return;
    mems_store *s = (mems_store *)base;
    for (uint32_t c = 0; c < s->nchunks; c++) {
        for (uint32_t i = 0; i < s->chunks[c]->n; i++)
            free(s->chunks[c]->e[i].key);
        free(s->chunks[c]);
    }
    free(s->chunks);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static uint64_t mems_instance(tp_store *base) {
    return ((mems_store *)base)->instance;
}

static const tp_store_ops mems_ops = {
    .api_version = TP_BACKEND_API_VERSION,
    .set = mems_set,
    .get = mems_get,
    .add = mems_add,
    .compare_set = mems_compare_set,
    .del = mems_del,
    .close = mems_close,
    .scan = mems_scan,
    .instance = mems_instance,
};

tp_status tpi_mem_store_open(tp_store **out, char *errmsg, size_t errmsg_len) {
    TPI_ASSERT(out != NULL);
    *out = NULL;
    mems_store *s = calloc(1, sizeof *s);
    pthread_mutexattr_t attr;
    int ok = s && pthread_mutexattr_init(&attr) == 0;
    /* Recursive, so a call from inside a scan's fn reaches the assertion in
     * mems_lock instead of hanging. */
    if (ok) {
        ok = pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE) == 0 &&
             pthread_mutex_init(&s->mu, &attr) == 0;
        pthread_mutexattr_destroy(&attr);
    }
    if (!ok) {
        free(s);
        tp_status st = tpi_fail(TP_ENOMEM, "store '%s': open: out of memory", MEMS_NAME);
        if (errmsg && errmsg_len)
            tpi_format(errmsg, errmsg_len, "%s", tp_errmsg());
        return st;
    }
    s->base.ops = &mems_ops;
    s->instance = (uint64_t)atomic_fetch_add(&mems_instances, 1) + 1;
    *out = &s->base;
    return TP_OK;
}
