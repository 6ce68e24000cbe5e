/*
 * fuzz_shm_ring.c: any bytes as a shared-memory ring (spec/tcp.md TCP-26,
 * real/shm_ring.c) that a hostile peer wrote, read by the reader's side.
 *
 * Byte 0 picks the mode. Even: the rest is the mapping itself (header and
 * data, zero-padded to the smallest ring): the reader attaches, and if it
 * accepts, reads from an exact copy until it stops. Odd: a script on an
 * honest ring of 1, 2, 4 or 8 KiB (bits 1..2) that this process writes and
 * reads, one op per byte: write a record (length from the next two bytes,
 * in one to three pieces), read one (by copy, into a buffer large or
 * small, or in place), scribble a byte or a word (a counter, a flag, the
 * record header at the reader's place, any data word) with any or an edge
 * value, wait without time, or close either end. Properties:
 * - nothing crashes, hangs or reads or writes out of bounds (the mapping
 *   is an exact allocation, so ASan sees one stray byte);
 * - a header the reader refuses says why;
 * - while nothing was scribbled the ring is a FIFO: every record comes out
 *   whole, in order, with its bytes; EMPTY only when none is pending,
 *   FULL only when some are, TOOBIG exactly past TPI_RING_RECORD_MAX, no
 *   CORRUPT;
 * - whatever was scribbled, a record handed on is at most
 *   TPI_RING_RECORD_MAX and fits what was offered, reading stops within
 *   capacity / 8 records, a CORRUPT end says why and stays CORRUPT, and a
 *   wait with a past deadline returns at once.
 * A violated property aborts, which the fuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "real/shm_ring.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define RAW_MAX ((size_t)1 << 16)
#define PENDING_MAX 2048 /* records outstanding: 8 KiB / 8 bytes at least, doubled */

static void check(int ok, const char *what) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_shm_ring: property violated: %s\n", what);
    abort();
}

/* Record seq's bytes: any length, made again to compare. */
static void fill(uint8_t *p, size_t len, uint32_t seq) {
    uint32_t x = seq * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

static uint8_t *exact(size_t size) {
    /* size is a multiple of TPI_RING_LINE: the allocation ends with it. */
    uint8_t *p = aligned_alloc(TPI_RING_LINE, size);
    check(p != NULL, "memory for the ring");
    return p;
}

typedef struct copy_ctx {
    uint8_t *buf;
    size_t len, cap;
} copy_ctx;

static void copy_cb(void *ctx, const uint8_t *p, size_t len) {
    copy_ctx *c = ctx;
    check(len <= c->cap, "a record handed in place fits the ring's largest");
    memcpy(c->buf, p, len);
    c->len = len;
}

/* tpi_ring_read_if's taker: declines when cap is 0 (noting the length),
 * else copies the record and takes it. */
static int take_cb(void *ctx, const uint8_t *p, size_t len) {
    copy_ctx *c = ctx;
    c->len = len;
    if (c->cap == 0)
        return 0;
    copy_cb(ctx, p, len);
    return 1;
}

/* Reads one record by the way op picks; the status, *len its length. */
static tpi_ring_status read_one(tpi_ring *r, unsigned op, uint8_t *buf, size_t max, size_t *len) {
    *len = 0;
    if (op & 4) { /* TCP-30: a look that leaves the record, then a read that takes it */
        copy_ctx look = {buf, 0, 0}, c = {buf, 0, max};
        int took = 1;
        tpi_ring_status first = tpi_ring_read_if(r, take_cb, &look, &took);
        check(!took, "a record declined is not consumed");
        tpi_ring_status st = tpi_ring_read_if(r, take_cb, &c, &took);
        check(st == first, "a look leaves the ring as it was");
        check(took == (st == TPI_RING_OK), "a record taken is consumed");
        check(st != TPI_RING_OK || c.len == look.len, "the record left is the one read next");
        *len = c.len;
        return st;
    }
    if (op & 1) {
        copy_ctx c = {buf, 0, max};
        tpi_ring_status st = tpi_ring_read_cb(r, copy_cb, &c);
        *len = c.len;
        return st;
    }
    size_t offered = op & 2 ? 16 : max;
    tpi_ring_status st = tpi_ring_read(r, buf, offered, len);
    if (st == TPI_RING_OK || st == TPI_RING_TOOBIG)
        check(*len <= max, "a record is at most the largest");
    if (st == TPI_RING_TOOBIG)
        check(*len > offered, "TOOBIG only for a record larger than the buffer");
    if (st == TPI_RING_OK)
        check(*len <= offered, "a record fits the buffer it was copied into");
    return st;
}

/* Reads until anything but OK; at most capacity / 8 records are there. */
static void drain(tpi_ring *r, uint8_t *buf) {
    size_t max = TPI_RING_RECORD_MAX(r->cap), len;
    tpi_ring_status st;
    uint64_t n = 0;
    while ((st = read_one(r, (unsigned)n, buf, max, &len)) == TPI_RING_OK)
        check(++n <= r->cap / 8, "reading stops within capacity / 8 records");
    if (st == TPI_RING_CORRUPT) {
        check(tpi_ring_why(r)[0] != '\0', "a corrupt ring says why");
        check(tpi_ring_read(r, buf, max, &len) == TPI_RING_CORRUPT, "corrupt stays corrupt");
    }
    st = tpi_ring_wait(r, 0, 0);
    check(st == TPI_RING_OK || st == TPI_RING_TIMEOUT, "a past deadline returns at once");
}

static void raw(const uint8_t *in, size_t n) {
    if (n > RAW_MAX)
        n = RAW_MAX;
    size_t size = n < TPI_RING_HEAD + TPI_RING_CAP_MIN ? TPI_RING_HEAD + TPI_RING_CAP_MIN : n;
    size = (size + TPI_RING_LINE - 1) / TPI_RING_LINE * TPI_RING_LINE;
    uint8_t *m = exact(size);
    memset(m, 0, size);
    memcpy(m, in, n);
    tpi_ring r;
    char err[256] = "";
    if (tpi_ring_attach(&r, m, size, err, sizeof err) != 0) {
        check(strstr(err, "refused") != NULL, "a refused ring says why");
        free(m);
        return;
    }
    check(r.cap >= TPI_RING_CAP_MIN && TPI_RING_HEAD + r.cap <= size, "an accepted capacity");
    /* Again on exactly the ring's bytes, so any read past them is seen. */
    uint8_t *e = exact(TPI_RING_HEAD + r.cap);
    memcpy(e, m, TPI_RING_HEAD + r.cap);
    free(m);
    check(tpi_ring_attach(&r, e, TPI_RING_HEAD + r.cap, err, sizeof err) == 0,
          "the same header is accepted again");
    uint8_t *buf = malloc(TPI_RING_RECORD_MAX(r.cap) + 1);
    check(buf != NULL, "a buffer");
    drain(&r, buf);
    free(buf);
    free(e);
}

/* Edge values: lengths about the largest records, the kinds, counters
 * about the capacities and the integer limits. */
static const uint64_t edges[] = {
    0,
    1,
    7,
    8,
    9,
    504,
    512,
    1016,
    1024,
    2048,
    4088,
    8192,
    0x41544144,
    0x20444150,
    UINT32_MAX,
    (uint64_t)UINT32_MAX + 1,
    UINT64_MAX - 7,
    UINT64_MAX,
};

static void script(const uint8_t *in, size_t n, unsigned mode) {
    uint64_t cap = TPI_RING_CAP_MIN << ((mode >> 1) & 3), max = TPI_RING_RECORD_MAX(cap);
    size_t size = TPI_RING_HEAD + cap;
    uint8_t *m = exact(size), *rec = malloc(max + 1), *buf = malloc(max + 1),
            *want = malloc(max + 1);
    check(rec && buf && want, "buffers");
    tpi_ring w, r;
    char err[256];
    check(tpi_ring_init(&w, m, size, err, sizeof err) == 0, "init");
    check(tpi_ring_attach(&r, m, size, err, sizeof err) == 0, "an honest ring is accepted");
    static uint32_t lens[PENDING_MAX];
    uint32_t seq = 0, first = 0; /* written, read: records first..seq-1 are pending */
    int tainted = 0, wclosed = 0, rclosed = 0;
    size_t i = 0;
    while (i < n) {
        unsigned op = in[i++];
        switch (op % 8) {
        case 0:
        case 1:
        case 2: { /* write */
            if (wclosed || i + 2 > n)
                break;
            uint64_t len = ((uint64_t)in[i] | (uint64_t)in[i + 1] << 8) % (max + 2);
            i += 2;
            fill(rec, len, seq);
            struct iovec v[3] = {{rec, len / 2},
                                 {rec + len / 2, len / 4},
                                 {rec + len / 2 + len / 4, len - len / 2 - len / 4}};
            struct iovec whole = {rec, len};
            int pieces = (op >> 3) % 3;
            tpi_ring_status st = pieces ? tpi_ring_write(&w, v, 3) : tpi_ring_write(&w, &whole, 1);
            if (tainted) {
                check(st != TPI_RING_OK || len <= max, "nothing too big is written");
                break;
            }
            if (rclosed) {
                check(st == TPI_RING_CLOSED, "a closed reader takes nothing");
                break;
            }
            if (len > max) {
                check(st == TPI_RING_TOOBIG, "TOOBIG exactly past the largest");
            } else if (st == TPI_RING_FULL) {
                check(seq != first, "an empty ring takes any record up to the largest");
            } else {
                check(st == TPI_RING_OK, "an honest write is written or full");
                check(seq - first < PENDING_MAX, "pending records bounded");
                lens[seq++ % PENDING_MAX] = (uint32_t)len;
            }
            break;
        }
        case 3:
        case 4: { /* read */
            size_t len;
            tpi_ring_status st = read_one(&r, op >> 3, buf, max, &len);
            if (tainted)
                break;
            if (seq == first) {
                check(st == (wclosed ? TPI_RING_CLOSED : TPI_RING_EMPTY),
                      "nothing pending: EMPTY, or CLOSED once the writer closed");
                break;
            }
            check(st == TPI_RING_OK || st == TPI_RING_TOOBIG, "a pending record is there");
            check(len == lens[first % PENDING_MAX], "a record's length as written");
            if (st == TPI_RING_OK) {
                fill(want, len, first);
                check(memcmp(buf, want, len) == 0, "a record's bytes as written, in order");
                first++;
            }
            break;
        }
        case 5: { /* a byte anywhere */
            if (i + 3 > n)
                break;
            size_t at = ((size_t)in[i] | (size_t)in[i + 1] << 8) % size;
            m[at] = in[i + 2];
            i += 3;
            tainted |= at >= TPI_RING_LINE && at < 3 * TPI_RING_LINE ? 1 : at >= TPI_RING_HEAD;
            break;
        }
        case 6: { /* a word: a counter, a flag, the reader's record header, any data word */
            if (i + 2 > n)
                break;
            unsigned target = in[i] % 8, pick = in[i + 1];
            i += 2;
            uint64_t v = edges[pick % (sizeof edges / sizeof edges[0])];
            if (pick >= 0x80 && i + 4 <= n) { /* a value of the input's */
                v = (uint64_t)in[i] | (uint64_t)in[i + 1] << 8 | (uint64_t)in[i + 2] << 16 |
                    (uint64_t)in[i + 3] << 24;
                i += 4;
            }
            uint32_t v32 = (uint32_t)v;
            size_t roff = (size_t)(r.pos & (cap - 1)), at;
            /* tail, head, the writer's closed flag, the reader's record's
             * length and kind, the word at 0, any data word */
            static const size_t targets[] = {TPI_RING_LINE, 2 * TPI_RING_LINE, TPI_RING_LINE + 16};
            if (target < 3)
                at = targets[target];
            else if (target < 5)
                at = TPI_RING_HEAD + roff + (target - 3) * 4;
            else if (target == 5)
                at = TPI_RING_HEAD;
            else
                at = TPI_RING_HEAD + (size_t)(v >> 3) % (cap / 4) * 4;
            if (target < 2)
                memcpy(m + at, &v, 8);
            else
                memcpy(m + at, &v32, 4);
            tainted = 1;
            break;
        }
        default: { /* wait without time, or close an end */
            unsigned what = (op >> 3) % 4;
            if (what == 0 || what == 1) {
                tpi_ring_status st = tpi_ring_wait(what ? &w : &r, 0, 0);
                check(st == TPI_RING_OK || st == TPI_RING_TIMEOUT,
                      "a past deadline returns at once");
            } else if (what == 2 && !wclosed) {
                tpi_ring_close(&w);
                wclosed = 1;
            } else if (what == 3 && !rclosed) {
                tpi_ring_close(&r);
                rclosed = 1;
            }
        }
        }
    }
    if (!tainted) {
        /* What is left comes out in order. */
        size_t len;
        while (first != seq) {
            check(tpi_ring_read(&r, buf, max, &len) == TPI_RING_OK, "the rest reads");
            fill(want, len, first);
            check(len == lens[first % PENDING_MAX] && memcmp(buf, want, len) == 0,
                  "the rest as written");
            first++;
        }
        check(tpi_ring_read(&r, buf, max, &len) == (wclosed ? TPI_RING_CLOSED : TPI_RING_EMPTY),
              "then nothing");
        check(tpi_ring_why(&r)[0] == '\0' && tpi_ring_why(&w)[0] == '\0',
              "an honest ring is never corrupt");
    }
    drain(&r, buf);
    free(rec);
    free(buf);
    free(want);
    free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    if (data[0] & 1)
        script(data + 1, size - 1, data[0]);
    else
        raw(data + 1, size - 1);
    return 0;
}
