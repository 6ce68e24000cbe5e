/*
 * fuzz_store_reply.c: any bytes as what the TCP store client reads back
 * (spec/tcp.md TCP-10): a reply head (tpi_store_reply_head_decode), and a
 * payload walked as a scan's entries (tpi_store_scan_entries, STORE-10).
 * Input: u8 prefix length (mod 8), the prefix, u8 "stop after" count, the
 * 12-byte head, the payload. Properties checked on every input:
 * - nothing crashes, leaks or reads out of bounds (under ASan; the payload
 *   is copied to a block of exactly its size);
 * - an accepted head re-encodes to the same 12 bytes, within the bounds;
 * - every entry handed on is under the prefix, after the one before it, and
 *   NUL-terminated at its length; a malformed payload is refused, not walked
 *   past; walking is deterministic.
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
    fprintf(stderr, "fuzz_store_reply: property violated: %s\n", what);
    abort();
}

typedef struct walk {
    const char *prefix;
    size_t prefix_len, seen, stop_after;
    char prev[TP_STORE_KEY_LEN_MAX + 1];
    unsigned long sum; /* of the values' bytes: two walks must agree */
} walk;

static int on_entry(void *arg, const char *key, const void *value, size_t len) {
    walk *w = arg;
    size_t kl = strlen(key);
    check(kl >= 1 && kl <= TP_STORE_KEY_LEN_MAX, "a key within its bounds");
    check(kl >= w->prefix_len && memcmp(key, w->prefix, w->prefix_len) == 0,
          "every key is under the prefix");
    check(w->prev[0] == '\0' || strcmp(w->prev, key) < 0, "keys come in order, once");
    check(len <= TP_STORE_VALUE_LEN_MAX && ((const char *)value)[len] == '\0',
          "a value within bounds, NUL-terminated past its length");
    memcpy(w->prev, key, kl + 1);
    for (size_t i = 0; i < len; i++)
        w->sum += ((const uint8_t *)value)[i];
    return ++w->seen == w->stop_after;
}

static int run(const uint8_t *p, size_t n, walk *w, char *last, size_t *count) {
    last[0] = '\0';
    *count = 0;
    return tpi_store_scan_entries(p, n, w->prefix, w->prefix_len, on_entry, w, last, count);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    size_t pl = data[0] % 8;
    if (size < 1 + pl + 1 + TPI_STORE_REPLY_HEAD_LEN)
        return 0;
    char prefix[8] = {0};
    memcpy(prefix, data + 1, pl);
    pl = strnlen(prefix, pl); /* a C string, as the caller's prefix is */
    size_t stop_after = data[1 + (data[0] % 8)];
    const uint8_t *head = data + 2 + (data[0] % 8);
    const uint8_t *rest = head + TPI_STORE_REPLY_HEAD_LEN;
    size_t n = size - (size_t)(rest - data);

    tp_status st;
    uint8_t aux;
    uint32_t plen;
    if (tpi_store_reply_head_decode(head, &st, &aux, &plen) == 0) {
        uint8_t again[TPI_STORE_REPLY_HEAD_LEN];
        check(st < TP_STATUS_COUNT_ && plen <= TPI_STORE_MSG_MAX, "a head within its bounds");
        tpi_store_reply_head_encode(again, st, aux, plen);
        check(memcmp(again, head, sizeof again) == 0, "an accepted head re-encodes");
    }

    uint8_t *payload = malloc(n ? n : 1);
    if (!payload)
        return 0;
    memcpy(payload, rest, n);
    walk w1 = {.prefix = prefix, .prefix_len = pl, .stop_after = stop_after};
    walk w2 = w1;
    char last1[TP_STORE_KEY_LEN_MAX + 1], last2[TP_STORE_KEY_LEN_MAX + 1];
    size_t c1 = 0, c2 = 0;
    int rc1 = run(payload, n, &w1, last1, &c1);
    int rc2 = run(payload, n, &w2, last2, &c2);
    check(rc1 >= -2 && rc1 <= 1, "a known outcome");
    check(rc1 == rc2 && c1 == c2 && w1.sum == w2.sum && strcmp(last1, last2) == 0,
          "walking is deterministic");
    check(c1 == w1.seen && (c1 == 0 || strcmp(last1, w1.prev) == 0),
          "the count and the last key are the entries handed on");
    check(rc1 != 1 || (stop_after && c1 == stop_after), "it stops only when told to");
    free(payload);
    return 0;
}
