/*
 * fuzz_options.c: any bytes as options a user or a launcher gives
 * (spec/api.md OPT-1..8, spec/tcp.md TCP-2, TCP-9, TCP-12, TCP-17).
 *
 * The input, up to its first NUL, is lines of "key=value". The typed keys
 * (rpc_timeout, init_timeout, shutdown_timeout, num_worker_threads,
 * max_message_size, max_inflight_bytes, rejoin, init_method) go to their
 * setters, the value read as a number the way a binding would; every other
 * key is a backend option (tp_options_set). Every value, and every line
 * without '=', is also an address for the TCP backend's address parsers.
 * At the end the options set up authentication as the TCP backend does.
 * Properties:
 * - nothing crashes, leaks or reads out of bounds (under ASan);
 * - a setter accepts exactly the values its documented range allows; an
 *   accepted value reads back equal, a refused one says why and leaves the
 *   old value; backend options read back as a model of them says, at most
 *   64 keys; a clone reads back the same;
 * - addresses: a split "host:port" names a host and a port that fit their
 *   buffers, and the host with the port formatted again splits to the same
 *   two; an unbracketed host has no bracket and unbrackets to itself; a port
 *   parses only within 0..65535 (1.. unless zero is allowed), to the value
 *   that prints back;
 * - authentication is set up exactly when auth=off, or a secret of 16..128
 *   bytes of hex is given; the key does not depend on the hex digits' case;
 *   a proof checks under the key and fails with one bit flipped.
 * A violated property aborts, which the fuzzer reports as a crash.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "common/options.h"
#include "real/tcp_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define KV_MAX 64 /* the backend options tp_options keeps (options.c) */

static void check(int ok, const char *what, const char *detail) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_options: property violated: %s (%.200s)\n", what, detail);
    abort();
}

/* The backend options as the harness expects them: borrowed from the input. */
typedef struct model {
    size_t n;
    const char *keys[KV_MAX], *values[KV_MAX];
} model;

static void check_model(const tp_options *o, const model *m) {
    check(tpi_options_nkeys(o) == m->n, "as many backend options as set", "count");
    for (size_t i = 0; i < m->n; i++) {
        const char *v = tp_options_get(o, m->keys[i]);
        check(v && strcmp(v, m->values[i]) == 0, "a backend option reads back", m->keys[i]);
        check(strcmp(tpi_options_key_at(o, i), m->keys[i]) == 0, "keys keep their order",
              m->keys[i]);
    }
}

static void set_backend(tp_options *o, model *m, const char *key, const char *value) {
    size_t at = m->n;
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->keys[i], key) == 0)
            at = i;
    tp_status st = tp_options_set(o, key, value);
    if (!*key) {
        check(st == TP_EINVAL, "an empty key is refused", value);
    } else if (at == m->n && m->n == KV_MAX) {
        check(st == TP_ELIMIT, "a 65th backend option is refused", key);
    } else {
        check(st == TP_OK, "a backend option is taken", key);
        m->keys[at] = key;
        m->values[at] = value;
        m->n += at == m->n;
    }
    check(st == TP_OK || tp_errmsg()[0], "a refusal says why", key);
}

/* A number as a binding would read it; 0 when the text is not one. */
static int number(const char *s, double *d) {
    char *end = NULL;
    errno = 0;
    *d = strtod(s, &end);
    return end != s && !*end;
}

static void set_timeout(tp_options *o, const char *key, const char *value) {
    double s;
    if (!number(value, &s))
        return;
    tp_status (*set)(tp_options *, double) = key[0] == 'r'   ? tp_options_set_rpc_timeout
                                             : key[0] == 'i' ? tp_options_set_init_timeout
                                                             : tp_options_set_shutdown_timeout;
    double (*get)(const tp_options *) = key[0] == 'r'   ? tp_options_rpc_timeout
                                        : key[0] == 'i' ? tp_options_init_timeout
                                                        : tp_options_shutdown_timeout;
    double before = get(o);
    tp_status st = set(o, s);
    int valid = !isnan(s) && s >= 0 && s <= TPI_TIMEOUT_S_MAX;
    check((st == TP_OK) == valid, "a timeout is taken exactly when in [0, max]", value);
    if (st == TP_OK)
        check(get(o) == s, "a timeout reads back", value);
    else
        check(get(o) == before || (isnan(get(o)) && isnan(before)),
              "a refused timeout changes "
              "nothing",
              value);
}

static void set_integer(tp_options *o, const char *key, const char *value) {
    double d;
    if (!number(value, &d) || !(d >= 0 && d < 1.8e19))
        return;
    unsigned long long v = strtoull(value, NULL, 10);
    tp_status st;
    if (strcmp(key, "num_worker_threads") == 0) {
        if (v > INT32_MAX)
            return;
        int before = tp_options_num_worker_threads(o);
        st = tp_options_set_num_worker_threads(o, (int)v);
        check((st == TP_OK) == (v >= 1 && v <= TPI_WORKER_THREADS_MAX), "thread count range",
              value);
        check(tp_options_num_worker_threads(o) == (st == TP_OK ? (int)v : before),
              "the thread count reads back", value);
    } else if (strcmp(key, "rejoin") == 0) {
        if (v > INT32_MAX)
            return;
        int before = tp_options_rejoin(o);
        st = tp_options_set_rejoin(o, (int)v);
        check((st == TP_OK) == (v <= 1), "rejoin is 0 or 1", value);
        check(tp_options_rejoin(o) == (st == TP_OK ? (int)v : before), "rejoin reads back", value);
    } else {
        int msg = strcmp(key, "max_message_size") == 0;
        uint64_t before = msg ? tp_options_max_message_size(o) : tp_options_max_inflight_bytes(o);
        st = msg ? tp_options_set_max_message_size(o, v) : tp_options_set_max_inflight_bytes(o, v);
        uint64_t lo = msg ? TPI_MESSAGE_SIZE_MIN : TPI_INFLIGHT_BYTES_MIN;
        uint64_t hi = msg ? TPI_MESSAGE_SIZE_MAX : TPI_INFLIGHT_BYTES_MAX;
        check((st == TP_OK) == (v >= lo && v <= hi), "a byte limit within its range", value);
        uint64_t now = msg ? tp_options_max_message_size(o) : tp_options_max_inflight_bytes(o);
        check(now == (st == TP_OK ? v : before), "a byte limit reads back", value);
    }
    check(st == TP_OK || tp_errmsg()[0], "a refusal says why", key);
}

/* ---- Addresses (TCP-2) --------------------------------------------------------- */

static void check_port(const char *s) {
    uint16_t p = 0xbeef, p1 = 0xbeef;
    int ok0 = tpi_tcp_parse_port(s, 0, &p) == 0;
    int ok1 = tpi_tcp_parse_port(s, 1, &p1) == 0;
    check(!ok0 || (ok1 && p1 == p && p >= 1), "a port of 1..65535 is also one of 0..65535", s);
    check(ok0 || !ok1 || p1 == 0, "only zero needs allow_zero", s);
    if (!ok1)
        return;
    size_t n = strlen(s);
    check(n >= 1 && n <= 5 && strspn(s, "0123456789") == n, "a port is 1 to 5 digits", s);
    char again[8];
    snprintf(again, sizeof again, "%u", (unsigned)p1);
    uint16_t p2 = 0;
    check(tpi_tcp_parse_port(again, 1, &p2) == 0 && p2 == p1, "a port prints back", s);
}

static void check_unbracket(const char *s) {
    char out[TPI_ADDR_LEN_MAX], again[TPI_ADDR_LEN_MAX];
    if (tpi_tcp_unbracket(s, out, sizeof out) != 0)
        return;
    size_t n = strlen(out);
    check(n > 0 && n < sizeof out, "an unbracketed host fits", s);
    check(!strpbrk(out, "[]"), "an unbracketed host has no bracket", s);
    check(tpi_tcp_unbracket(out, again, sizeof again) == 0 && strcmp(out, again) == 0,
          "unbracketing is idempotent", s);
    check(s[0] == '[' || strcmp(out, s) == 0, "a host without brackets stays as it is", s);
}

static void check_hostport(const char *s) {
    char host[TPI_ADDR_LEN_MAX], port[16];
    if (tpi_tcp_split_hostport(s, host, sizeof host, port, sizeof port) != 0)
        return;
    check(host[0] && strlen(host) < sizeof host, "a split host fits", s);
    check(port[0] && strlen(port) < sizeof port, "a split port fits", s);
    uint16_t p;
    if (tpi_tcp_parse_port(port, 0, &p) != 0)
        return;
    char formatted[TPI_ADDR_LEN_MAX + 8], host2[TPI_ADDR_LEN_MAX], port2[16];
    tpi_tcp_format_hostport(host, p, formatted, sizeof formatted);
    uint16_t p2 = 0;
    check(tpi_tcp_split_hostport(formatted, host2, sizeof host2, port2, sizeof port2) == 0,
          "a formatted address splits", formatted);
    check(strcmp(host, host2) == 0, "a formatted address names the same host", formatted);
    check(tpi_tcp_parse_port(port2, 0, &p2) == 0 && p2 == p, "and the same port", formatted);
}

static void check_address(const char *s) {
    check_port(s);
    check_unbracket(s);
    check_hostport(s);
    if (strncmp(s, "tcp://", 6) == 0)
        check_hostport(s + 6); /* as init_method tcp:// reads it (TCP-9) */
}

/* ---- Authentication (TCP-17) -------------------------------------------------- */

static int is_secret(const char *hex) {
    size_t n = strlen(hex);
    if (n % 2 || n / 2 < TPI_TCP_SECRET_MIN || n / 2 > TPI_TCP_SECRET_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)hex[i]))
            return 0;
    return 1;
}

static void check_auth(const tp_options *o, const uint8_t *data, size_t size) {
    const char *mode = tp_options_get(o, "auth");
    const char *secret = tp_options_get(o, "secret");
    tpi_tcp_auth auth;
    char err[TP_ERRMSG_LEN_MAX] = "";
    tp_status st = tpi_tcp_auth_setup(o, &auth, err, sizeof err);
    int off = mode && strcmp(mode, "off") == 0;
    int on = !off && (!mode || strcmp(mode, "on") == 0) && secret && is_secret(secret);
    check((st == TP_OK) == (off || on), "auth is set up when off or given a good secret",
          err[0] ? err : "(no message)");
    check(st == TP_OK || err[0], "an auth refusal says why", "(no message)");
    if (st != TP_OK)
        return;
    check(auth.on == on, "auth is on unless asked off", mode ? mode : "(default)");
    if (on) {
        /* The same secret in the other case keys the same proofs. */
        char *flipped = strdup(secret);
        tp_options *o2 = tp_options_clone(o);
        check(flipped && o2, "out of memory", "clone");
        for (char *p = flipped; *p; p++)
            *p = (char)(isupper((unsigned char)*p) ? tolower((unsigned char)*p)
                                                   : toupper((unsigned char)*p));
        check(tp_options_set(o2, "secret", flipped) == TP_OK, "a secret is set", flipped);
        tpi_tcp_auth auth2;
        check(tpi_tcp_auth_setup(o2, &auth2, err, sizeof err) == TP_OK,
              "the case of hex does not "
              "matter",
              err);
        check(tpi_tcp_auth_same(&auth, &auth2), "the same secret, the same key", flipped);
        tpi_tcp_auth_clear(&auth2);
        tp_options_free(o2);
        free(flipped);

        uint8_t proof[TPI_TCP_PROOF_SIZE];
        size_t ctx_len = size < TPI_TCP_AUTH_CTX_MAX ? size : TPI_TCP_AUTH_CTX_MAX;
        tpi_tcp_auth_proof(&auth, "fuzz", data, ctx_len, proof);
        check(tpi_tcp_auth_check(&auth, "fuzz", data, ctx_len, proof) == 1, "a proof checks",
              "proof");
        proof[size % TPI_TCP_PROOF_SIZE] ^= (uint8_t)(1u << (size % 8));
        check(tpi_tcp_auth_check(&auth, "fuzz", data, ctx_len, proof) == 0,
              "a proof with a bit flipped fails", "proof");
    }
    tpi_tcp_auth_clear(&auth);
}

/* ---- The input ------------------------------------------------------------------- */

static int typed(const char *key) {
    static const char *const names[] = {
        "rpc_timeout",      "init_timeout",       "shutdown_timeout", "num_worker_threads",
        "max_message_size", "max_inflight_bytes", "rejoin",           "init_method"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(key, names[i]) == 0)
            return (int)i + 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsetenv("TP_SECRET"); /* auth reads it when no secret option is set */
    char *text = malloc(size + 1);
    tp_options *o = tp_options_new();
    if (!text || !o) {
        free(text);
        tp_options_free(o);
        return 0;
    }
    memcpy(text, data, size);
    text[size] = '\0';
    model m = {0};
    char *line = text;
    while (line) {
        char *next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *eq = strchr(line, '=');
        if (!eq) {
            check_address(line);
            line = next;
            continue;
        }
        *eq = '\0';
        const char *key = line, *value = eq + 1;
        check_address(value);
        switch (typed(key)) {
        case 0:
            set_backend(o, &m, key, value);
            break;
        case 1:
        case 2:
        case 3:
            set_timeout(o, key, value);
            break;
        case 8: {
            const char *before = tp_options_init_method(o);
            char *kept = before ? strdup(before) : NULL;
            tp_status st = tp_options_set_init_method(o, value);
            check((st == TP_OK) == (value[0] != '\0'), "an init_method is any non-empty text",
                  value);
            const char *now = tp_options_init_method(o);
            check(st == TP_OK ? now && strcmp(now, value) == 0
                              : (!now && !kept) || (now && kept && strcmp(now, kept) == 0),
                  "init_method reads back", value);
            free(kept);
            break;
        }
        default:
            set_integer(o, key, value);
        }
        check_model(o, &m);
        line = next;
    }
    tp_options *copy = tp_options_clone(o);
    if (copy) {
        check_model(copy, &m);
        check(tp_options_rpc_timeout(copy) == tp_options_rpc_timeout(o) &&
                  tp_options_init_timeout(copy) == tp_options_init_timeout(o) &&
                  tp_options_shutdown_timeout(copy) == tp_options_shutdown_timeout(o) &&
                  tp_options_num_worker_threads(copy) == tp_options_num_worker_threads(o) &&
                  tp_options_max_message_size(copy) == tp_options_max_message_size(o) &&
                  tp_options_max_inflight_bytes(copy) == tp_options_max_inflight_bytes(o) &&
                  tp_options_rejoin(copy) == tp_options_rejoin(o),
              "a clone reads back the same", "clone");
        const char *a = tp_options_init_method(o), *b = tp_options_init_method(copy);
        check((!a && !b) || (a && b && strcmp(a, b) == 0), "a clone has the same init_method",
              a ? a : "(none)");
        tp_options_free(copy);
    }
    check_auth(o, data, size);
    tp_options_free(o);
    free(text);
    return 0;
}
