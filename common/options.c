/* options.c: tp_options, the backend options (spec/api.md OPT-1..6). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "limits.h"
#include "options.h"

#define OPTS_KV_MAX 64 /* backend-specific keys: a bound, not a tuning knob */

struct tp_options {
    double rpc_timeout_s;
    double init_timeout_s;     /* < 0: follow rpc_timeout */
    double shutdown_timeout_s; /* < 0: follow rpc_timeout */
    int num_worker_threads;
    uint64_t max_message_size;
    uint64_t max_inflight_bytes;
    uint64_t max_queued_bytes;
    uint64_t max_remote_values;
    uint64_t max_unsent_bytes;
    char *init_method;
    int rejoin; /* REJOIN-1 */
    size_t nkv;
    char *keys[OPTS_KV_MAX];
    char *values[OPTS_KV_MAX];
};

tp_options *tp_options_new(void) {
    tp_options *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    o->rpc_timeout_s = TP_DEFAULT_RPC_TIMEOUT_S;
    o->init_timeout_s = -1;
    o->shutdown_timeout_s = -1;
    o->num_worker_threads = TP_DEFAULT_NUM_WORKER_THREADS;
    o->max_message_size = TPI_MESSAGE_SIZE_DEFAULT;
    o->max_inflight_bytes = TPI_INFLIGHT_BYTES_DEFAULT;
    o->max_queued_bytes = TPI_QUEUED_BYTES_DEFAULT;
    o->max_remote_values = TPI_REMOTE_VALUES_DEFAULT;
    o->max_unsent_bytes = TPI_UNSENT_BYTES_DEFAULT;
    return o;
}

void tp_options_free(tp_options *o) {
    if (!o)
        return;
    free(o->init_method);
    for (size_t i = 0; i < o->nkv; i++) {
        free(o->keys[i]);
        free(o->values[i]);
    }
    free(o);
}

tp_options *tp_options_clone(const tp_options *src) {
    if (!src)
        return NULL;
    tp_options *o = tp_options_new();
    if (!o)
        return NULL;
    *o = *src;
    o->init_method = NULL;
    o->nkv = 0;
    if (src->init_method && !(o->init_method = strdup(src->init_method)))
        goto oom;
    for (size_t i = 0; i < src->nkv; i++) {
        o->keys[i] = strdup(src->keys[i]);
        o->values[i] = strdup(src->values[i]);
        o->nkv = i + 1;
        if (!o->keys[i] || !o->values[i])
            goto oom;
    }
    return o;
oom:
    tp_options_free(o);
    return NULL;
}

tp_status tpi_check_timeout(double seconds, int allow_default) {
    if (isnan(seconds))
        return tpi_fail(TP_EINVAL, "timeout is NaN");
    if (allow_default && seconds == TP_TIMEOUT_DEFAULT)
        return TP_OK;
    if (seconds < 0)
        return tpi_fail(TP_EINVAL,
                        "timeout %g s is negative: use -1 for the default or 0 for no deadline",
                        seconds);
    if (seconds > TPI_TIMEOUT_S_MAX)
        return tpi_fail(TP_EINVAL, "timeout %g s exceeds the limit of %g s", seconds,
                        TPI_TIMEOUT_S_MAX);
    return TP_OK;
}

tp_status tp_options_set_rpc_timeout(tp_options *o, double s) {
    if (!o)
        return tpi_fail(TP_EINVAL, "options is NULL");
    tp_status st = tpi_check_timeout(s, 0);
    if (st == TP_OK)
        o->rpc_timeout_s = s;
    return st;
}

double tp_options_rpc_timeout(const tp_options *o) {
    return o ? o->rpc_timeout_s : TP_DEFAULT_RPC_TIMEOUT_S;
}

tp_status tp_options_set_init_method(tp_options *o, const char *m) {
    if (!o)
        return tpi_fail(TP_EINVAL, "options is NULL");
    if (!m || !*m)
        return tpi_fail(TP_EINVAL, "init_method is empty");
    char *copy = strdup(m);
    if (!copy)
        return tpi_fail(TP_ENOMEM, "out of memory copying init_method");
    free(o->init_method);
    o->init_method = copy;
    return TP_OK;
}

const char *tp_options_init_method(const tp_options *o) {
    return o ? o->init_method : NULL;
}

tp_status tp_options_set_num_worker_threads(tp_options *o, int n) {
    if (!o)
        return tpi_fail(TP_EINVAL, "options is NULL");
    if (n < 1 || n > TPI_WORKER_THREADS_MAX)
        return tpi_fail(TP_EINVAL, "num_worker_threads %d outside [1, %d]", n,
                        TPI_WORKER_THREADS_MAX);
    o->num_worker_threads = n;
    return TP_OK;
}

int tp_options_num_worker_threads(const tp_options *o) {
    return o ? o->num_worker_threads : TP_DEFAULT_NUM_WORKER_THREADS;
}

tp_status tp_options_set_init_timeout(tp_options *o, double s) {
    if (!o)
        return tpi_fail(TP_EINVAL, "options is NULL");
    tp_status st = tpi_check_timeout(s, 0);
    if (st == TP_OK)
        o->init_timeout_s = s;
    return st;
}

double tp_options_init_timeout(const tp_options *o) {
    if (!o)
        return TP_DEFAULT_RPC_TIMEOUT_S;
    return o->init_timeout_s < 0 ? o->rpc_timeout_s : o->init_timeout_s;
}

tp_status tp_options_set_shutdown_timeout(tp_options *o, double s) {
    if (!o)
        return tpi_fail(TP_EINVAL, "options is NULL");
    tp_status st = tpi_check_timeout(s, 0);
    if (st == TP_OK)
        o->shutdown_timeout_s = s;
    return st;
}

double tp_options_shutdown_timeout(const tp_options *o) {
    if (!o)
        return TP_DEFAULT_RPC_TIMEOUT_S;
    return o->shutdown_timeout_s < 0 ? o->rpc_timeout_s : o->shutdown_timeout_s;
}

tp_status tp_options_set_rejoin(tp_options *o, int rejoin) {
    if (!o)
        return tpi_fail(TP_EINVAL, "options is NULL");
    if (rejoin != 0 && rejoin != 1)
        return tpi_fail(TP_EINVAL, "rejoin must be 0 or 1, not %d", rejoin);
    o->rejoin = rejoin;
    return TP_OK;
}

int tp_options_rejoin(const tp_options *o) {
    return o ? o->rejoin : 0;
}

/* Sets *field to bytes within [min, max] (OPT-5, OPT-7), else TP_EINVAL naming it. */
static tp_status set_bytes(tp_options *o, uint64_t *field, const char *name, uint64_t bytes,
                           uint64_t min, uint64_t max) {
    if (!o)
        return tpi_fail(TP_EINVAL, "options is NULL");
    if (bytes < min || bytes > max)
        return tpi_fail(TP_EINVAL, "%s %llu outside [%llu, %llu]", name,
                        (unsigned long long)bytes, (unsigned long long)min,
                        (unsigned long long)max);
    *field = bytes;
    return TP_OK;
}

tp_status tp_options_set_max_message_size(tp_options *o, uint64_t bytes) {
    return set_bytes(o, o ? &o->max_message_size : NULL, "max_message_size", bytes,
                     TPI_MESSAGE_SIZE_MIN, TPI_MESSAGE_SIZE_MAX);
}

uint64_t tp_options_max_message_size(const tp_options *o) {
    return o ? o->max_message_size : TPI_MESSAGE_SIZE_DEFAULT;
}

tp_status tp_options_set_max_inflight_bytes(tp_options *o, uint64_t bytes) {
    return set_bytes(o, o ? &o->max_inflight_bytes : NULL, "max_inflight_bytes", bytes,
                     TPI_INFLIGHT_BYTES_MIN, TPI_INFLIGHT_BYTES_MAX);
}

uint64_t tp_options_max_inflight_bytes(const tp_options *o) {
    return o ? o->max_inflight_bytes : TPI_INFLIGHT_BYTES_DEFAULT;
}

tp_status tp_options_set_max_queued_bytes(tp_options *o, uint64_t bytes) {
    return set_bytes(o, o ? &o->max_queued_bytes : NULL, "max_queued_bytes", bytes,
                     TPI_QUEUED_BYTES_MIN, TPI_QUEUED_BYTES_MAX);
}

uint64_t tp_options_max_queued_bytes(const tp_options *o) {
    return o ? o->max_queued_bytes : TPI_QUEUED_BYTES_DEFAULT;
}

tp_status tp_options_set_max_remote_values(tp_options *o, uint64_t n) {
    return set_bytes(o, o ? &o->max_remote_values : NULL, "max_remote_values", n,
                     TPI_REMOTE_VALUES_MIN, TPI_REMOTE_VALUES_MAX);
}

uint64_t tp_options_max_remote_values(const tp_options *o) {
    return o ? o->max_remote_values : TPI_REMOTE_VALUES_DEFAULT;
}

tp_status tp_options_set_max_unsent_bytes(tp_options *o, uint64_t bytes) {
    return set_bytes(o, o ? &o->max_unsent_bytes : NULL, "max_unsent_bytes", bytes,
                     TPI_UNSENT_BYTES_MIN, TPI_UNSENT_BYTES_MAX);
}

uint64_t tp_options_max_unsent_bytes(const tp_options *o) {
    return o ? o->max_unsent_bytes : TPI_UNSENT_BYTES_DEFAULT;
}

/* OPT-6: the core's numeric limits by name, so a program that passes every
 * option as a string (the Python binding's backend_options) can set them. */
static const struct {
    const char *key;
    tp_status (*set)(tp_options *o, uint64_t v);
} core_keys[] = {
    {"max_message_size", tp_options_set_max_message_size},
    {"max_inflight_bytes", tp_options_set_max_inflight_bytes},
    {"max_queued_bytes", tp_options_set_max_queued_bytes},
    {"max_remote_values", tp_options_set_max_remote_values},
    {"max_unsent_bytes", tp_options_set_max_unsent_bytes},
};

/* A core key's value: decimal digits only, no sign, no overflow. */
static tp_status set_core_key(tp_options *o, size_t k, const char *value) {
    uint64_t v = 0;
    const char *p = value;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
            break;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (p == value || *p)
        return tpi_fail(TP_EINVAL, "option '%s': '%.32s' is not a decimal count",
                        core_keys[k].key, value);
    return core_keys[k].set(o, v);
}

tp_status tp_options_set(tp_options *o, const char *key, const char *value) {
    if (!o)
        return tpi_fail(TP_EINVAL, "options is NULL");
    if (!key || !*key || !value)
        return tpi_fail(TP_EINVAL, "option key and value must be non-empty strings");
    for (size_t k = 0; k < sizeof core_keys / sizeof core_keys[0]; k++)
        if (strcmp(key, core_keys[k].key) == 0)
            return set_core_key(o, k, value);
    for (size_t i = 0; i < o->nkv; i++) {
        if (strcmp(o->keys[i], key) == 0) {
            char *v = strdup(value);
            if (!v)
                return tpi_fail(TP_ENOMEM, "out of memory setting option '%s'", key);
            free(o->values[i]);
            o->values[i] = v;
            return TP_OK;
        }
    }
    if (o->nkv == OPTS_KV_MAX)
        return tpi_fail(TP_ELIMIT, "more than %d backend options", OPTS_KV_MAX);
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return tpi_fail(TP_ENOMEM, "out of memory setting option '%s'", key);
    }
    o->keys[o->nkv] = k;
    o->values[o->nkv] = v;
    o->nkv++;
    return TP_OK;
}

size_t tpi_options_nkeys(const tp_options *o) {
    return o->nkv;
}

const char *tpi_options_key_at(const tp_options *o, size_t i) {
    TPI_ASSERT(i < o->nkv);
    return o->keys[i];
}

const char *tp_options_get(const tp_options *o, const char *key) {
    if (!o || !key)
        return NULL;
    for (size_t i = 0; i < o->nkv; i++)
        if (strcmp(o->keys[i], key) == 0)
            return o->values[i];
    return NULL;
}
