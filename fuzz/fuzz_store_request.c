/*
 * fuzz_store_request.c: any bytes as what a client sends the TCP store server
 * after its handshake (spec/tcp.md TCP-10, TCP-18): a stream of requests,
 * decoded one after another as the server does (tpi_store_request_decode).
 * Properties checked on every input:
 * - nothing crashes or reads out of bounds (under ASan; the bytes are copied
 *   to a block of exactly their size), and the decoder allocates nothing;
 * - a rejection says why and leaves an empty request; "more bytes" names a
 *   total beyond what is there, and within TPI_STORE_MSG_MAX;
 * - an accepted request lies within the bytes, every prefix of it asks for
 *   more (the early checks never refuse a valid request), decoding is
 *   deterministic, and the request re-encodes to exactly the same bytes.
 * A violated property aborts, which the fuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "real/tcp_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_store_request: property violated: %s\n", what);
    abort();
}

static int within(const uint8_t *p, size_t n, const uint8_t *q, size_t qn) {
    return qn == 0 || (q >= p && q <= p + n && qn <= (size_t)(p + n - q));
}

static int empty(const tpi_store_request *r) {
    static const tpi_store_request zero;
    return memcmp(r, &zero, sizeof zero) == 0;
}

/* One request at the front of p[0..n): the bytes it took, 0 when none. */
static size_t one(const uint8_t *p, size_t n) {
    tpi_store_request r, again;
    size_t need = 0, need2 = 0;
    const char *why = NULL, *why2 = NULL;
    long k = tpi_store_request_decode(p, n, &r, &need, &why);
    long k2 = tpi_store_request_decode(p, n, &again, &need2, &why2);
    check(k == k2 && need == need2 && why == why2 && memcmp(&r, &again, sizeof r) == 0,
          "decoding is deterministic");
    if (k < 0) {
        check(why != NULL && why[0] != '\0', "a rejection says why");
        check(empty(&r), "a rejection leaves an empty request");
        return 0;
    }
    if (k == 0) {
        check(need > n && need >= 4 && need <= 4 + (size_t)TPI_STORE_MSG_MAX,
              "more bytes: a bounded total beyond what is there");
        check(empty(&r), "an incomplete request leaves an empty request");
        return 0;
    }
    size_t taken = (size_t)k;
    check(taken == need && taken <= n && taken >= 8, "an accepted request lies within the bytes");
    check(r.op >= TPI_STORE_SET && r.op <= TPI_STORE_SCAN, "a known op");
    check(r.key_len >= 1 && r.key_len <= TP_STORE_KEY_LEN_MAX, "a key within its bounds");
    check(within(p, taken, r.key, r.key_len) && within(p, taken, r.a, r.a_len) &&
              within(p, taken, r.b, r.b_len),
          "the fields point into the request");
    check(r.a_len <= TP_STORE_VALUE_LEN_MAX && r.b_len <= TP_STORE_VALUE_LEN_MAX,
          "values within their bounds");
    check(r.op != TPI_STORE_CAS || (r.flags & 1u) || r.a_len == 0,
          "a create-if-absent carries no expected value");
    check(tpi_store_request_size(&r) == taken, "the encoded size is the decoded size");
    uint8_t *out = malloc(taken);
    check(out != NULL, "memory for the re-encoding");
    tpi_store_request_encode(&r, out);
    check(memcmp(out, p, taken) == 0, "the encoding is canonical");
    free(out);
    for (size_t j = 0; j < taken; j++) {
        tpi_store_request part;
        size_t pneed = 0;
        const char *pwhy = NULL;
        check(tpi_store_request_decode(p, j, &part, &pneed, &pwhy) == 0,
              "every prefix of a valid request asks for more");
    }
    return taken;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    size_t off = 0;
    for (int i = 0; i < 64 && off < size; i++) { /* a pipelined stream, as the server reads it */
        size_t k = one(copy + off, size - off);
        if (k == 0)
            break;
        off += k;
    }
    free(copy);
    return 0;
}
