/*
 * fuzz_tcp_crypt.c: the sealed record layer of a worker connection
 * (spec/tcp.md TCP-21, real/tcp_crypt.c), read as the connection reads it.
 *
 * One direction of one connection, dialer to acceptor, keyed from fixed
 * inputs (a job key, both ids, the world size and both nonces), as
 * tcp_conn.c keys it. The reader is the connection's: sealed bytes are read
 * into a buffer of TPI_TCP_SEAL_BUF bytes, behind those not yet opened, as
 * much as the buffer takes or the split allows; each whole record is framed
 * with tpi_tcp_sealed_next and opened with tpi_tcp_open; the first refusal
 * ends the stream (TCP-7's protocol error). Every record is opened from an
 * exact copy into an exact buffer, and every head checked from an exact
 * 4-byte copy, so ASan sees any read past them.
 *
 * Input: byte 0 chooses the mode (bits 0-1) and the read sizes (bits 2-7:
 * 0 all the buffer takes; else sizes of 1, or 1 to 2, 3, 7, 24, 100, 4096
 * or 70000 bytes, from a generator seeded with them).
 * - mode 0: the rest is the received stream, as an attacker sends it.
 * - modes 1-3: bytes 1-4 say how to tamper (modes 2, 3); from byte 5 on,
 *   chunks of plaintext: u16 length (bit 15: the bytes come from a
 *   generator seeded with the next byte, else from the input), a byte that
 *   splits the chunk into up to three iovec pieces, then its bytes. The
 *   harness seals each chunk with tpi_tcp_seal (one call, records of at most
 *   TPI_TCP_SEAL_MAX bytes) and reads the sealed stream: as sealed (mode 1);
 *   with one byte changed (mode 2: byte offset u24 at 1, xor with byte 4);
 *   or with records tampered with (mode 3, byte 1: dropped, replayed later,
 *   two swapped, one sealed for the other direction, or the stream cut).
 * Properties (a violated one aborts, which the fuzzer reports as a crash):
 * - nothing crashes, leaks or reads out of bounds (under ASan);
 * - a head declaring a length outside 1..TPI_TCP_SEAL_MAX is refused from
 *   its 4 bytes alone, before anything more is read or allocated; a head in
 *   bounds waits for exactly its record's bytes;
 * - a record opens exactly when an independent AES-256-GCM opening (the
 *   harness's, with OpenSSL) under the direction's key and the nonce of its
 *   number in the stream (TCP-21: the counter, little-endian, then 4 zero
 *   bytes) opens it, to the same plaintext; so record numbers, the nonces,
 *   never repeat within a direction, and the sealer's count one per record;
 * - a stream the harness sealed opens back to exactly its chunks, in order,
 *   each cut at TPI_TCP_SEAL_MAX, however it is split into reads; the two
 *   directions have different keys;
 * - a tampered stream opens exactly the records that lie wholly before its
 *   first changed byte, each to its own plaintext, and nothing after them;
 * - a reader that refused nothing has always room in its buffer.
 */
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "real/tcp_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define HEAD TPI_TCP_SEAL_HEAD
#define TAG TPI_TCP_SEAL_TAG
#define OVER TPI_TCP_SEAL_OVERHEAD
#define REC_MAX (TPI_TCP_SEAL_MAX + OVER)
/* Bounds on what one input seals: enough for records of every size and a
 * few reads of a full buffer, small enough for thousands of runs a second. */
#define CHUNKS_MAX 64
#define PLAIN_MAX ((size_t)256 << 10)
#define RECORDS_MAX (CHUNKS_MAX * (PLAIN_MAX / TPI_TCP_SEAL_MAX + 1))

static void check(int ok, const char *what) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_tcp_crypt: property violated: %s\n", what);
    abort();
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t xorshift(uint32_t *s) {
    uint32_t x = *s ? *s : 0x9e3779b9u;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *s = x;
}

/* ---- Keys: fixed inputs, derived as a connection derives them ------------------------ */

typedef struct keys {
    uint8_t d2a[TPI_TCP_SEAL_KEY_SIZE], a2d[TPI_TCP_SEAL_KEY_SIZE];
} keys;

static void keys_derive(keys *k) {
    tpi_tcp_auth auth = {.on = 1};
    memcpy(auth.key, "fuzz_tcp_crypt: a fixed job key", sizeof auth.key);
    /* Dialer 2, acceptor 1, world 3, then the dialer's and the acceptor's nonce. */
    uint8_t ctx[12 + 2 * TPI_TCP_NONCE_SIZE] = {2, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0};
    memset(ctx + 12, 0x11, TPI_TCP_NONCE_SIZE);
    memset(ctx + 12 + TPI_TCP_NONCE_SIZE, 0x22, TPI_TCP_NONCE_SIZE);
    tpi_tcp_seal_keys(&auth, ctx, sizeof ctx, k->d2a, k->a2d);
    check(memcmp(k->d2a, k->a2d, sizeof k->d2a) != 0, "the two directions have different keys");
}

/* The model: record rec (whole, its length in bounds) opened under key with
 * the nonce of number seq, by OpenSSL directly. 0 with plain, or -1. */
static int model_open(const uint8_t key[TPI_TCP_SEAL_KEY_SIZE], uint64_t seq, const uint8_t *rec,
                      uint8_t *plain) {
    size_t n = get_u32(rec);
    uint8_t iv[12] = {0}, tag[TAG], none[16];
    for (int i = 0; i < 8; i++)
        iv[i] = (uint8_t)(seq >> (8 * i));
    memcpy(tag, rec + HEAD + n, TAG);
    EVP_CIPHER_CTX *evp = EVP_CIPHER_CTX_new();
    check(evp != NULL, "the model has a cipher context");
    int len = 0, ok = EVP_DecryptInit_ex(evp, EVP_aes_256_gcm(), NULL, key, iv) == 1 &&
                      EVP_DecryptUpdate(evp, NULL, &len, rec, HEAD) == 1 &&
                      EVP_DecryptUpdate(evp, plain, &len, rec + HEAD, (int)n) == 1 &&
                      EVP_CIPHER_CTX_ctrl(evp, EVP_CTRL_GCM_SET_TAG, TAG, tag) == 1 &&
                      EVP_DecryptFinal_ex(evp, none, &len) == 1;
    EVP_CIPHER_CTX_free(evp);
    return ok ? 0 : -1;
}

/* ---- The stream the harness seals ---------------------------------------------------- */

typedef struct record {
    size_t off, len;     /* in the sealed stream */
    size_t plain_off, n; /* its plaintext, in plain */
} record;

typedef struct sealed {
    uint8_t *bytes;
    size_t len, cap;
    uint8_t *plain; /* every chunk's plaintext, in order */
    size_t plain_len;
    record rec[RECORDS_MAX];
    size_t nrec;
} sealed;

static void append(sealed *s, const uint8_t *p, size_t n) {
    if (n == 0)
        return; /* s->bytes may still be NULL */
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n)
            cap *= 2;
        s->bytes = realloc(s->bytes, cap);
        check(s->bytes != NULL, "memory for the sealed stream");
        s->cap = cap;
    }
    memcpy(s->bytes + s->len, p, n);
    s->len += n;
}

/* Seals plain[0..n) as one call, from up to three iovec pieces (each an
 * exact copy, so a read past one is seen), into an exact buffer; checks
 * each record against the model (the nonce of its number, the d2a key). */
static void seal_chunk(sealed *s, tpi_tcp_cipher *tx, const keys *k, const uint8_t *plain, size_t n,
                       uint8_t split) {
    size_t cut[4] = {0, 0, 0, n};
    if (n > 0) {
        cut[1] = (size_t)(split & 0x0f) * n / 15; /* at the ends too: empty pieces */
        cut[2] = cut[1] + (size_t)(split >> 4) * (n - cut[1]) / 15;
    }
    struct iovec iov[3];
    for (int i = 0; i < 3; i++) {
        size_t len = cut[i + 1] - cut[i];
        iov[i].iov_base = malloc(len ? len : 1);
        check(iov[i].iov_base != NULL, "memory for a piece");
        memcpy(iov[i].iov_base, plain + cut[i], len);
        iov[i].iov_len = len;
    }
    size_t m = tpi_tcp_sealed_size(n);
    size_t nrec = (n + TPI_TCP_SEAL_MAX - 1) / TPI_TCP_SEAL_MAX;
    check(m == n + nrec * OVER, "sealed_size is the plaintext plus one overhead per record");
    uint8_t *out = malloc(m ? m : 1);
    check(out != NULL, "memory for the sealed chunk");
    uint64_t seq0 = tx->seq;
    check(tpi_tcp_seal(tx, iov, 3, n, out) == 0, "sealing succeeds");
    check(tx->seq == seq0 + nrec, "sealing numbers one record per TPI_TCP_SEAL_MAX bytes");
    size_t off = 0;
    for (size_t r = 0; r < nrec; r++) {
        size_t len = n - r * TPI_TCP_SEAL_MAX;
        if (len > TPI_TCP_SEAL_MAX)
            len = TPI_TCP_SEAL_MAX;
        check(tpi_tcp_sealed_next(out + off, m - off) == (long)(len + OVER),
              "a sealed record frames as itself");
        uint8_t *back = malloc(len);
        check(back != NULL, "memory for the model's plaintext");
        check(model_open(k->d2a, seq0 + r, out + off, back) == 0 &&
                  memcmp(back, plain + r * TPI_TCP_SEAL_MAX, len) == 0,
              "each sealed record opens under its direction's key and its number's nonce");
        free(back);
        check(s->nrec < RECORDS_MAX, "records within the harness's bound");
        s->rec[s->nrec++] =
            (record){s->len + off, len + OVER, s->plain_len + r * TPI_TCP_SEAL_MAX, len};
        off += len + OVER;
    }
    check(off == m, "the records fill the sealed size exactly");
    append(s, out, m);
    memcpy(s->plain + s->plain_len, plain, n);
    s->plain_len += n;
    free(out);
    for (int i = 0; i < 3; i++)
        free(iov[i].iov_base);
}

/* Reads the chunks from p[0..n) and seals them. */
static void seal_chunks(sealed *s, const keys *k, const uint8_t *p, size_t n) {
    tpi_tcp_cipher tx;
    check(tpi_tcp_seal_init(&tx, k->d2a, 1) == 0, "a sealing direction starts");
    s->plain = malloc(PLAIN_MAX);
    check(s->plain != NULL, "memory for the plaintext");
    uint8_t *chunk = malloc(PLAIN_MAX);
    check(chunk != NULL, "memory for a chunk");
    size_t i = 0;
    for (int c = 0; c < CHUNKS_MAX && i + 3 <= n; c++) {
        size_t len = (size_t)p[i] | (size_t)(p[i + 1] & 0x7f) << 8;
        int generated = p[i + 1] & 0x80;
        uint8_t split = p[i + 2];
        i += 3;
        if (len > PLAIN_MAX - s->plain_len)
            len = PLAIN_MAX - s->plain_len;
        if (generated) {
            uint32_t seed = i < n ? p[i++] : 0;
            for (size_t j = 0; j < len; j++)
                chunk[j] = (uint8_t)xorshift(&seed);
        } else {
            if (len > n - i)
                len = n - i;
            memcpy(chunk, p + i, len);
            i += len;
        }
        seal_chunk(s, &tx, k, chunk, len, split);
    }
    free(chunk);
    tpi_tcp_seal_clear(&tx);
}

/* ---- The reader ---------------------------------------------------------------------- */

typedef struct reader {
    tpi_tcp_cipher rx;
    const keys *k;
    uint8_t *buf; /* TPI_TCP_SEAL_BUF bytes, as a connection's */
    size_t len;
    int refused;
    uint64_t opened;    /* records opened */
    size_t opened_end;  /* stream bytes up to the end of the last record opened */
    size_t read_total;  /* stream bytes read into buf */
    const sealed *want; /* the harness's stream, when it sealed one */
    size_t clean_end;   /* bytes of the received stream equal to want's */
    size_t head_done;   /* 1 + the stream offset of the last head checked alone; 0: none */
} reader;

/* One record framed in r->buf at off, whole bytes; opens it as the
 * connection would and checks it against the model and the sealed stream. */
static void open_record(reader *r, size_t off, size_t whole) {
    size_t n = whole - OVER;
    uint8_t *rec = malloc(whole), *plain = malloc(n), *model = malloc(n);
    check(rec && plain && model, "memory for a record");
    memcpy(rec, r->buf + off, whole);
    uint64_t seq = r->rx.seq;
    int ok = tpi_tcp_open(&r->rx, rec, plain) == 0;
    check(r->rx.seq == seq + 1, "opening uses exactly one record number");
    int model_ok = model_open(r->k->d2a, seq, rec, model) == 0;
    check(ok == model_ok, "a record opens exactly when the model opens it with its number");
    check(!ok || memcmp(plain, model, n) == 0, "an opened record is the model's plaintext");
    size_t at = r->read_total - r->len + off; /* its offset in the stream */
    if (r->want) {
        int whole_clean = at + whole <= r->clean_end;
        check(!ok || whole_clean, "no record opens past a tampered byte");
        check(ok || !whole_clean, "an untouched record of the sealed stream opens");
        if (ok) {
            check(seq < r->want->nrec, "no more records open than were sealed");
            const record *w = &r->want->rec[seq];
            check(w->off == at && w->len == whole && w->n == n &&
                      memcmp(plain, r->want->plain + w->plain_off, n) == 0,
                  "the stream opens to its chunks, record by record, in order");
        }
    }
    if (ok) {
        r->opened++;
        r->opened_end = at + whole;
    } else {
        r->refused = 1;
    }
    free(rec);
    free(plain);
    free(model);
}

/* The connection's drain: every whole record, until a refusal. */
static void drain(reader *r) {
    size_t off = 0;
    while (!r->refused) {
        size_t have = r->len - off;
        const uint8_t *p = r->buf + off;
        long whole = tpi_tcp_sealed_next(p, have);
        if (have < HEAD) {
            check(whole == 0, "fewer than 4 bytes wait");
            break;
        }
        size_t declared = get_u32(p);
        int in_bounds = declared >= 1 && declared <= TPI_TCP_SEAL_MAX;
        size_t at = r->read_total - r->len + off;
        if (r->head_done != at + 1) { /* once a record: reads of a byte are many */
            r->head_done = at + 1;
            /* The head from an exact copy of its bytes: its verdict needs no more. */
            uint8_t *head = malloc(HEAD);
            check(head != NULL, "memory for a head");
            memcpy(head, p, HEAD);
            long head_only = tpi_tcp_sealed_next(head, HEAD);
            size_t n = tpi_tcp_seal_len(head);
            free(head);
            check(n == (in_bounds ? declared : 0),
                  "seal_len is the head's length, 0 out of bounds");
            check(head_only == (in_bounds ? 0 : -1),
                  "the head alone refuses a length out of bounds, and waits for one in bounds");
        }
        if (!in_bounds) {
            check(whole == -1, "a length out of bounds is refused");
            r->refused = 1;
            break;
        }
        if (whole == 0) {
            check(have < declared + OVER, "a record waits only until it is whole");
            break;
        }
        check(whole == (long)(declared + OVER), "a whole record is its head, plaintext and tag");
        open_record(r, off, (size_t)whole);
        if (r->refused)
            break;
        off += (size_t)whole;
    }
    /* The connection moves its buffer on every drain: glibc skips a move of
     * nothing, ASan checks it, and reads of a byte are many. */
    if (off > 0) {
        memmove(r->buf, r->buf + off, r->len - off);
        r->len -= off;
    }
    if (!r->refused)
        check(r->len < REC_MAX && r->len < TPI_TCP_SEAL_BUF,
              "after a drain less than a record waits: the buffer has room");
}

/* Feeds stream[0..n) to the reader in reads sized by scheme. */
static void read_stream(reader *r, const uint8_t *stream, size_t n, unsigned scheme) {
    static const uint32_t caps[8] = {1, 2, 3, 7, 24, 100, 4096, 70000};
    uint32_t seed = scheme * 2654435761u + (uint32_t)n;
    size_t i = 0;
    while (i < n && !r->refused) {
        size_t room = TPI_TCP_SEAL_BUF - r->len;
        check(room > 0, "a reader that refused nothing has room to read");
        size_t want = room;
        if (scheme != 0)
            want = (scheme & 7) == 0 ? 1 : 1 + xorshift(&seed) % caps[scheme & 7];
        size_t take = want < room ? want : room;
        if (take > n - i)
            take = n - i;
        memcpy(r->buf + r->len, stream + i, take);
        r->len += take;
        r->read_total += take;
        i += take;
        drain(r);
    }
}

/* ---- Tampering ----------------------------------------------------------------------- */

/* The sealed stream with its records tampered with (mode 3), into out. */
static void tamper_records(const sealed *s, const keys *k, const uint8_t op[4], sealed *out) {
    size_t nrec = s->nrec;
    if (nrec == 0) {
        append(out, s->bytes, s->len);
        return;
    }
    size_t a = ((size_t)op[1] | (size_t)op[2] << 8) % nrec;
    size_t b = a + 1 + op[3] % nrec; /* after a */
    switch (op[0] % 5) {
    case 0: /* dropped */
        for (size_t r = 0; r < nrec; r++)
            if (r != a)
                append(out, s->bytes + s->rec[r].off, s->rec[r].len);
        break;
    case 1: /* replayed after record b - 1 (at the end when past it) */
        for (size_t r = 0; r < nrec; r++) {
            append(out, s->bytes + s->rec[r].off, s->rec[r].len);
            if (r + 1 == b || (r + 1 == nrec && b >= nrec))
                append(out, s->bytes + s->rec[a].off, s->rec[a].len);
        }
        break;
    case 2: /* a and the next swapped */
        for (size_t r = 0; r < nrec; r++) {
            size_t from = r == a && a + 1 < nrec ? a + 1 : r == a + 1 ? a : r;
            append(out, s->bytes + s->rec[from].off, s->rec[from].len);
        }
        break;
    case 3: { /* record a as the other direction seals it: same number, same plaintext */
        tpi_tcp_cipher other;
        check(tpi_tcp_seal_init(&other, k->a2d, 1) == 0, "the other direction starts");
        other.seq = (uint64_t)a;
        const record *w = &s->rec[a];
        uint8_t *moved = malloc(w->len);
        check(moved != NULL, "memory for a moved record");
        struct iovec v = {s->plain + w->plain_off, w->n};
        check(tpi_tcp_seal(&other, &v, 1, w->n, moved) == 0, "the other direction seals");
        append(out, s->bytes, w->off);
        append(out, moved, w->len);
        append(out, s->bytes + w->off + w->len, s->len - w->off - w->len);
        free(moved);
        tpi_tcp_seal_clear(&other);
        break;
    }
    default: /* cut inside record a, or at its start */
        append(out, s->bytes, s->rec[a].off + op[3] % s->rec[a].len);
        break;
    }
}

/* The first offset where got differs from want (its length when a prefix). */
static size_t first_change(const sealed *want, const uint8_t *got, size_t got_len) {
    size_t n = want->len < got_len ? want->len : got_len;
    size_t i = 0;
    while (i < n && want->bytes[i] == got[i])
        i++;
    return i;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    static keys k;
    static int keyed;
    if (!keyed) {
        keys_derive(&k);
        keyed = 1;
    }
    unsigned mode = data[0] & 3, scheme = data[0] >> 2;
    reader r = {.k = &k};
    check(tpi_tcp_seal_init(&r.rx, k.d2a, 0) == 0, "an opening direction starts");
    r.buf = malloc(TPI_TCP_SEAL_BUF);
    check(r.buf != NULL, "memory for the reader's buffer");
    sealed *s = calloc(1, sizeof *s), *t = calloc(1, sizeof *t);
    check(s && t, "memory for the streams");

    if (mode == 0) {
        read_stream(&r, data + 1, size - 1, scheme);
        check(r.opened_end <= r.read_total, "nothing opens past what was read");
    } else {
        uint8_t op[4] = {0};
        memcpy(op, data + 1, size - 1 < 4 ? size - 1 : 4);
        if (size > 5)
            seal_chunks(s, &k, data + 5, size - 5);
        if (mode == 1) {
            append(t, s->bytes, s->len);
        } else if (mode == 2) {
            append(t, s->bytes, s->len);
            if (t->len > 0) {
                size_t at = ((size_t)op[0] | (size_t)op[1] << 8 | (size_t)op[2] << 16) % t->len;
                t->bytes[at] ^= op[3] ? op[3] : 1;
            }
        } else {
            tamper_records(s, &k, op, t);
        }
        r.want = s;
        r.clean_end = first_change(s, t->bytes, t->len);
        read_stream(&r, t->bytes, t->len, scheme);
        /* Exactly the records wholly before the first change open. */
        size_t before = 0;
        while (before < s->nrec && s->rec[before].off + s->rec[before].len <= r.clean_end)
            before++;
        check(r.opened == before, "every record before the first change opens, none after");
        if (mode == 1)
            check(!r.refused && r.len == 0 && r.opened == s->nrec,
                  "an untouched stream opens whole, nothing left over");
    }
    free(s->bytes);
    free(s->plain);
    free(t->bytes);
    free(t->plain);
    free(s);
    free(t);
    free(r.buf);
    tpi_tcp_seal_clear(&r.rx);
    return 0;
}
