/*
 * tcp_store_wire.c: the TCP store protocol's messages as bytes (spec/tcp.md
 * TCP-10), with no socket in sight: the server's request decoder, the
 * client's request encoder, and the client's reply parsers. Pure functions,
 * so the fuzz harnesses (fuzz/fuzz_store_request.c, fuzz/fuzz_store_reply.c)
 * drive exactly what the server and client run. Every byte they read is
 * hostile: a length is checked before the memory it covers is touched.
 */
#include <stdlib.h>
#include <string.h>

#include "tcp_internal.h"

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A blob: u32 length then bytes, within what is left of the body. */
static int take_blob(const uint8_t **p, size_t *left, const uint8_t **blob, uint32_t *n) {
    if (*left < 4)
        return 0;
    uint32_t len = get_u32(*p);
    if (len > TP_STORE_VALUE_LEN_MAX || len > *left - 4)
        return 0;
    *blob = *p + 4;
    *n = len;
    *p += 4 + len;
    *left -= 4 + (size_t)len;
    return 1;
}

/* The checks the first 8 bytes allow: length, op, flags, key length. */
static const char *check_head(const uint8_t *p, size_t n) {
    uint32_t body = get_u32(p);
    if (body < 4 || body > TPI_STORE_MSG_MAX)
        return "a request length out of bounds";
    if (n < 8)
        return NULL;
    uint8_t op = p[4], flags = p[5];
    uint32_t key_len = (uint32_t)p[6] | (uint32_t)p[7] << 8;
    if (op < TPI_STORE_SET || op > TPI_STORE_SCAN)
        return "an unknown request op";
    if (flags & ~(op == TPI_STORE_CAS ? 1u : 0u))
        return "request flags this op does not have";
    if (key_len == 0 || key_len > TP_STORE_KEY_LEN_MAX || key_len > body - 4)
        return "a key length out of bounds";
    return NULL;
}

/* The body after the key, by op; 0 when it does not fit the op exactly. */
static int take_rest(tpi_store_request *r, const uint8_t *p, size_t left) {
    switch (r->op) {
    case TPI_STORE_SET:
        r->has_a = 1;
        return take_blob(&p, &left, &r->a, &r->a_len) && left == 0;
    case TPI_STORE_GET:
    case TPI_STORE_DEL:
        return left == 0;
    case TPI_STORE_ADD:
        if (left != 8)
            return 0;
        r->delta = (int64_t)((uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32);
        return 1;
    case TPI_STORE_CAS:
        r->has_a = 1;
        if (!take_blob(&p, &left, &r->a, &r->a_len) || !take_blob(&p, &left, &r->b, &r->b_len) ||
            left != 0)
            return 0;
        /* "key absent" with an expected value: malformed, never an assertion */
        return (r->flags & 1u) || r->a_len == 0;
    case TPI_STORE_SCAN:
        if (left == 0)
            return 1;
        r->has_a = 1;
        return take_blob(&p, &left, &r->a, &r->a_len) && left == 0 &&
               r->a_len <= TP_STORE_KEY_LEN_MAX;
    default:
        return 0; /* check_head let no other op through */
    }
}

long tpi_store_request_decode(const uint8_t *p, size_t n, tpi_store_request *r, size_t *need,
                              const char **why) {
    TPI_ASSERT(r && need && why && (p || n == 0));
    memset(r, 0, sizeof *r);
    *why = NULL;
    *need = 4;
    if (n < 4)
        return 0;
    if ((*why = check_head(p, n)) != NULL)
        return -1;
    *need = 4 + (size_t)get_u32(p);
    if (n < *need)
        return 0;
    r->op = p[4];
    r->flags = p[5];
    r->key_len = (uint16_t)(p[6] | p[7] << 8);
    r->key = p + 8;
    size_t left = *need - 8 - r->key_len;
    if (!take_rest(r, p + 8 + r->key_len, left)) {
        memset(r, 0, sizeof *r);
        *why = "a malformed request body";
        return -1;
    }
    return (long)*need;
}

size_t tpi_store_request_size(const tpi_store_request *r) {
    size_t n = 8 + (size_t)r->key_len;
    switch (r->op) {
    case TPI_STORE_SET:
        return n + 4 + r->a_len;
    case TPI_STORE_ADD:
        return n + 8;
    case TPI_STORE_CAS:
        return n + 8 + (size_t)r->a_len + r->b_len;
    case TPI_STORE_SCAN:
        return r->has_a ? n + 4 + r->a_len : n;
    default:
        return n;
    }
}

static uint8_t *put_blob(uint8_t *p, const uint8_t *v, uint32_t n) {
    put_u32(p, n);
    if (n)
        memcpy(p + 4, v, n);
    return p + 4 + n;
}

void tpi_store_request_encode(const tpi_store_request *r, uint8_t *out) {
    TPI_ASSERT(r->key_len >= 1 && r->key_len <= TP_STORE_KEY_LEN_MAX);
    /* A request reads as the decoder makes it: SET and COMPARE_SET always
     * carry a (possibly empty), SCAN only with has_a. */
    TPI_ASSERT(r->has_a || (r->op != TPI_STORE_SET && r->op != TPI_STORE_CAS));
    size_t total = tpi_store_request_size(r);
    TPI_ASSERT(total - 4 <= TPI_STORE_MSG_MAX);
    put_u32(out, (uint32_t)(total - 4));
    out[4] = r->op;
    out[5] = r->flags;
    out[6] = (uint8_t)r->key_len;
    out[7] = (uint8_t)(r->key_len >> 8);
    memcpy(out + 8, r->key, r->key_len);
    uint8_t *p = out + 8 + r->key_len;
    switch (r->op) {
    case TPI_STORE_SET:
        put_blob(p, r->a, r->a_len);
        break;
    case TPI_STORE_ADD:
        put_u32(p, (uint32_t)(uint64_t)r->delta);
        put_u32(p + 4, (uint32_t)((uint64_t)r->delta >> 32));
        break;
    case TPI_STORE_CAS:
        put_blob(put_blob(p, r->a, r->a_len), r->b, r->b_len);
        break;
    case TPI_STORE_SCAN:
        if (r->has_a)
            put_blob(p, r->a, r->a_len);
        break;
    default:
        break;
    }
}

void tpi_store_reply_head_encode(uint8_t head[TPI_STORE_REPLY_HEAD_LEN], tp_status status,
                                 uint8_t aux, uint32_t payload_len) {
    TPI_ASSERT(payload_len <= TPI_STORE_MSG_MAX);
    put_u32(head, 8 + payload_len);
    head[4] = (uint8_t)status;
    head[5] = aux;
    head[6] = head[7] = 0;
    put_u32(head + 8, payload_len);
}

int tpi_store_reply_head_decode(const uint8_t head[TPI_STORE_REPLY_HEAD_LEN], tp_status *status,
                                uint8_t *aux, uint32_t *payload_len) {
    uint32_t total = get_u32(head), plen = get_u32(head + 8);
    if (total != 8 + (uint64_t)plen || plen > TPI_STORE_MSG_MAX || head[4] >= TP_STATUS_COUNT_ ||
        head[6] || head[7])
        return -1;
    *status = (tp_status)head[4];
    *aux = head[5];
    *payload_len = plen;
    return 0;
}

int tpi_store_scan_entries(const uint8_t *p, size_t len, const char *prefix, size_t prefix_len,
                           int (*fn)(void *arg, const char *key, const void *value, size_t len),
                           void *arg, char *last, size_t *n) {
    const uint8_t *end = p + len;
    char key[TP_STORE_KEY_LEN_MAX + 1];
    while (p < end) {
        if (end - p < 2)
            return -1;
        size_t kl = (size_t)p[0] | (size_t)p[1] << 8;
        if (kl == 0 || kl > TP_STORE_KEY_LEN_MAX || (size_t)(end - p) < 2 + kl + 4)
            return -1;
        memcpy(key, p + 2, kl);
        key[kl] = '\0';
        uint32_t vl = get_u32(p + 2 + kl);
        if (strlen(key) != kl || kl < prefix_len || memcmp(key, prefix, prefix_len) != 0 ||
            (last[0] && strcmp(key, last) <= 0) || vl > TP_STORE_VALUE_LEN_MAX ||
            (size_t)(end - p) - 2 - kl - 4 < vl)
            return -1;
        const uint8_t *v = p + 6 + kl;
        char small[256];
        char *copy = vl < sizeof small ? small : malloc((size_t)vl + 1);
        if (!copy)
            return -2;
        if (vl)
            memcpy(copy, v, vl);
        copy[vl] = '\0';
        int stop = fn(arg, key, copy, vl);
        if (copy != small)
            free(copy);
        memcpy(last, key, kl + 1);
        (*n)++;
        if (stop)
            return 1;
        p = v + vl;
    }
    return 0;
}
