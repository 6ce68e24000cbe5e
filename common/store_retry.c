/*
 * store_retry.c: the core's store calls, which outlast a store outage
 * (spec/store.md STORE-9).
 *
 * A store that fails for a while (a database locked past its busy timeout,
 * a network file system that hiccups, a store server restarting) must not
 * end a job whose deadline has not come: every store call of the core
 * retries TP_ESTORE with backoff, parking its own task like any wait, until
 * its deadline; only then does the error reach the user, saying how long
 * the store was failing and why. Every other status returns at once (they
 * describe the request, not the store's health).
 */
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define RETRY_FIRST_NS 1000000ull  /* 1 ms */
#define RETRY_MAX_NS 200000000ull  /* 200 ms: a recovered store is seen soon */

/*
 * Parks until now + *backoff (bounded by deadline), then doubles *backoff.
 * TP_OK when the time passed (or an unpark came); TP_ESHUTDOWN when the
 * worker is being torn down.
 */
tp_status tpi_store_nap(tp_core *c, uint64_t *backoff, uint64_t cap, uint64_t deadline) {
    tpi_lock(c);
    uint64_t now = tpi_now(c);
    uint64_t until = now + *backoff < deadline ? now + *backoff : deadline;
    tp_status st = TP_OK;
    while (st == TP_OK && tpi_now(c) < until)
        st = tpi_park(c, until);
    tpi_unlock(c);
    *backoff = *backoff * 2 < cap ? *backoff * 2 : cap;
    return st == TP_ETIMEDOUT ? TP_OK : st;
}

/* One operation of the store, to try again. */
typedef struct store_op {
    enum { OP_SET, OP_GET, OP_CAS, OP_SCAN } kind;
    const char *key;
    const void *value, *expected;
    size_t len, expected_len;
    void **out;
    size_t *out_len;
    int *swapped;
    int (*fn)(void *arg, const char *key, const void *value, size_t len); /* scan */
    void *fn_arg;
} store_op;

static tp_status attempt(tp_core *c, const store_op *op) {
    tp_store *s = c->store;
    switch (op->kind) {
    case OP_SET:
        return s->ops->set(s, op->key, op->value, op->len);
    case OP_GET:
        return s->ops->get(s, op->key, op->out, op->out_len);
    case OP_CAS:
        return s->ops->compare_set(s, op->key, op->expected, op->expected_len, op->value, op->len,
                                   op->swapped);
    case OP_SCAN:
        return s->ops->scan(s, op->key, op->fn, op->fn_arg);
    }
    TPI_ASSERT(0);
    return TP_EINVAL;
}

/*
 * A create-if-absent compare_set that failed may still have written (a store
 * server that applied it and lost the reply): when a retry finds the key
 * already holding exactly our value, the write was ours. The core's keys make
 * that sound: a rank's entry names the worker's own address, and a name or
 * outcome key is written only after the rank was won.
 */
static tp_status cas_was_ours(tp_core *c, const store_op *op, uint64_t deadline_ns);

static tp_status with_retry(tp_core *c, const store_op *op, uint64_t deadline_ns) {
    uint64_t first_failure = 0, backoff = RETRY_FIRST_NS;
    uint32_t failures = 0;
    for (;;) {
        tp_status st = attempt(c, op);
        if (st == TP_OK && failures && op->kind == OP_CAS && !op->expected && !*op->swapped)
            return cas_was_ours(c, op, deadline_ns);
        if (st != TP_ESTORE)
            return st; /* TP_OK, or what the store says about the request */
        uint64_t now = tpi_now(c);
        if (failures++ == 0)
            first_failure = now;
        if (now >= deadline_ns) {
            /* The store's own message names the operation, key and cause. */
            char why[TP_ERRMSG_LEN_MAX];
            tpi_format(why, sizeof why, "%s", c->store->errmsg[0] ? c->store->errmsg : "failed");
            tpi_format(c->store->errmsg, sizeof c->store->errmsg,
                       "failing for %.3f s (%u attempts) until the deadline; last: %s",
                       (double)(now - first_failure) / 1e9, failures, why);
            return TP_ESTORE;
        }
        tp_status w = tpi_store_nap(c, &backoff, RETRY_MAX_NS, deadline_ns);
        if (w != TP_OK) {
            tpi_format(c->store->errmsg, sizeof c->store->errmsg,
                       "failing, and the retry was interrupted: %s", tp_strerror(w));
            return TP_ESTORE;
        }
    }
}

static tp_status cas_was_ours(tp_core *c, const store_op *op, uint64_t deadline_ns) {
    void *v = NULL;
    size_t len = 0;
    store_op get = {.kind = OP_GET, .key = op->key, .out = &v, .out_len = &len};
    tp_status st = with_retry(c, &get, deadline_ns);
    if (st == TP_ENOENT)
        return TP_OK; /* deleted since: not ours to claim; *swapped stays 0 */
    if (st != TP_OK)
        return st;
    *op->swapped = len == op->len && memcmp(v, op->value, len) == 0;
    free(v);
    return TP_OK;
}

tp_status tpi_store_set(tp_core *c, const char *key, const void *value, size_t len,
                        uint64_t deadline_ns) {
    store_op op = {.kind = OP_SET, .key = key, .value = value, .len = len};
    return with_retry(c, &op, deadline_ns);
}

tp_status tpi_store_get(tp_core *c, const char *key, void **value, size_t *len,
                        uint64_t deadline_ns) {
    store_op op = {.kind = OP_GET, .key = key, .out = value, .out_len = len};
    return with_retry(c, &op, deadline_ns);
}

tp_status tpi_store_cas(tp_core *c, const char *key, const void *expected, size_t expected_len,
                        const void *desired, size_t desired_len, int *swapped,
                        uint64_t deadline_ns) {
    store_op op = {.kind = OP_CAS,
                   .key = key,
                   .expected = expected,
                   .expected_len = expected_len,
                   .value = desired,
                   .len = desired_len,
                   .swapped = swapped};
    return with_retry(c, &op, deadline_ns);
}

tp_status tpi_store_scan(tp_core *c, const char *prefix,
                         int (*fn)(void *arg, const char *key, const void *value, size_t len),
                         void *arg, uint64_t deadline_ns) {
    TPI_ASSERT(c->store->ops->scan);
    store_op op = {.kind = OP_SCAN, .key = prefix, .fn = fn, .fn_arg = arg};
    return with_retry(c, &op, deadline_ns);
}
