/*
 * etcd_store.c: the rendezvous store on etcd (spec/etcd.md ETCD-1..10), a
 * store that is not one of the job's workers: any worker, rank 0 included,
 * can die and come back as a new incarnation (REJOIN-1..7) while the job's
 * keys stay where they are.
 *
 * tp_store_ops over etcd's v3 HTTP/JSON gateway, with libcurl for HTTP,
 * jansson for JSON and OpenSSL's base64 (etcd's JSON carries keys and
 * values as base64):
 * - set is POST /v3/kv/put, get /v3/kv/range, del /v3/kv/deleterange, and
 *   scan a range over the prefix's keys, in pages (ETCD-4);
 * - compare_set and add read the key, decide here, and write with
 *   /v3/kv/txn only if the key's mod_revision is still the one read (0 for
 *   an absent key); a txn that lost to another writer gets the key's new
 *   state back from its failure branch and decides again (ETCD-5). The
 *   compare is on the revision, not on the value, so a request never
 *   carries two values (two 1 MiB values would pass etcd's request limit);
 * - every key written is attached to the job's one lease, which every handle
 *   keeps alive from its first write until close, from a thread of its own
 *   (ETCD-6): the keys live while any member lives and go one TTL after the
 *   last one.
 *
 * Keys: the job's store key K is the etcd key "<prefix>/kv/K"; the lease's
 * id is published under "<prefix>/lease" (ETCD-3).
 *
 * Threads: a handle may be used by several threads; each operation holds
 * the handle's mutex for its whole length (one curl handle, reused, so its
 * connections stay open). The keepalive thread has its own curl handle in a
 * multi handle, so close can wake it from any wait and join it at once. A
 * handle must not cross fork(): the child has no keepalive thread.
 */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/errors.h"
#include "common/log.h"
#include "real/tcp_thread.h"
#include "store/store_int.h"
#include "tensorplay/rpc_backend.h"

/* Endpoints of one store (ETCD-2): an etcd cluster has 3, 5 or 7 members. */
#define ETCD_ENDPOINTS_MAX 16
/* A host as written, brackets included, and "host:port". */
#define ETCD_HOST_LEN_MAX 253
#define ETCD_HOSTPORT_LEN_MAX (ETCD_HOST_LEN_MAX + 8)
/* The job's prefix (ETCD-3): short enough that prefix, "/kv/" and a whole
 * key (255 bytes) make an etcd key of well under 512 bytes. */
#define ETCD_PREFIX_LEN_MAX 128
/* A whole init_method "etcd://...". */
#define ETCD_URL_LEN_MAX 4096
/* Bytes of the init_method quoted in a message. */
#define ETCD_MSG_URL_MAX 200
/* Bytes of etcd's or curl's own text kept for a message. */
#define ETCD_WHY_MAX 160
/* Bytes of a bad value quoted in a message (as the SQLite store). */
#define ETCD_MSG_VALUE_MAX 32
/* The lease's TTL (ETCD-6): how long the keys outlive the last member. */
#define ETCD_TTL_DEFAULT_S 60
#define ETCD_TTL_MIN_S 2 /* etcd's own minimum with its default timing */
#define ETCD_TTL_MAX_S 86400
/* One HTTP request's deadline, connecting included (ETCD-7). */
#define ETCD_TIMEOUT_DEFAULT_MS 5000
#define ETCD_TIMEOUT_MIN_MS 100
#define ETCD_TIMEOUT_MAX_MS 120000
/* Connecting to one endpoint: a dead member is passed over quickly. */
#define ETCD_CONNECT_TIMEOUT_MAX_MS 1000
/* Keys per range request of a scan: bounds a reply to about 90 MiB even if
 * every value is the largest allowed. */
#define ETCD_SCAN_PAGE_KEYS 64
/* The largest reply body read (a scan page of the largest values). */
#define ETCD_REPLY_MAX                                                                             \
    ((size_t)ETCD_SCAN_PAGE_KEYS * (TP_STORE_VALUE_LEN_MAX / 3 * 4 + 4096) + 65536)
/* compare_set and add: rounds of read, decide, txn lost to another writer,
 * and the time they may take together (ETCD-5). Each lost round means some
 * other writer won, so N racers need at most N rounds. */
#define ETCD_RMW_ROUNDS_MAX 100000
#define ETCD_RMW_BUDGET_MS 30000
/* A write that finds the lease gone gets a new one and runs again, once. */
#define ETCD_LEASE_RETRIES 1
/* The keepalive thread retries a failed keepalive this often at most. */
#define ETCD_KEEPALIVE_RETRY_MAX_MS 1000

#define ETCD_KV_INFIX "/kv/"
#define ETCD_LEASE_SUFFIX "/lease"

_Static_assert(ETCD_PREFIX_LEN_MAX + sizeof ETCD_KV_INFIX + TP_STORE_KEY_LEN_MAX < 512,
               "an etcd key stays short");
/* A message: the store's name, the op, a whole key and one endpoint's failure
 * (more endpoints' failures are cut to fit). */
#define ETCD_MSG_NEED                                                                              \
    (ETCD_MSG_URL_MAX + TP_STORE_KEY_LEN_MAX + ETCD_HOSTPORT_LEN_MAX + ETCD_WHY_MAX + 64)
_Static_assert(ETCD_MSG_NEED <= TP_ERRMSG_LEN_MAX, "a message holds one endpoint's failure whole");
_Static_assert(ETCD_TTL_MIN_S * 1000 / 3 >= 500, "a keepalive interval is at least 0.5 s");
_Static_assert(ETCD_REPLY_MAX < SIZE_MAX / 2, "a reply's buffer can double");

/* ------------------------------------------------------------------------ */
/* Types. */

typedef struct etcd_endpoint {
    char desc[ETCD_HOSTPORT_LEN_MAX + 1];      /* "host:port" as written */
    char base[ETCD_HOSTPORT_LEN_MAX + 1 + 16]; /* "http://host:port" */
} etcd_endpoint;

/* One connection: a curl handle, its headers and the reply it reads. */
typedef struct etcd_http {
    CURL *curl;
    struct curl_slist *headers;
    char *reply;
    size_t reply_len, reply_cap;
    int reply_over; /* the reply passed ETCD_REPLY_MAX and was cut */
    char curl_err[CURL_ERROR_SIZE];
} etcd_http;

typedef struct etcd_store {
    tp_store base;      /* first: a tp_store * is an etcd_store * */
    pthread_mutex_t mu; /* one operation at a time: http, next_ep and errmsg */
    etcd_http http;
    uint32_t next_ep; /* the endpoint tried first: the last that answered */
    uint32_t n_ep;
    etcd_endpoint ep[ETCD_ENDPOINTS_MAX];
    uint32_t ttl_s;
    uint32_t timeout_ms;
    /* The job's lease this handle writes with and keeps alive; 0 when none
     * is known yet (the next write finds or makes one) or it was lost. */
    _Atomic int64_t lease;
    /* The keepalive thread (ETCD-6). */
    pthread_t ka_thread;
    int ka_started;
    CURLM *ka_multi;
    etcd_http ka_http;
    atomic_int ka_stop;
    char kv_prefix[ETCD_PREFIX_LEN_MAX + sizeof ETCD_KV_INFIX]; /* "<prefix>/kv/" */
    size_t kv_prefix_len;
    char lease_key[ETCD_PREFIX_LEN_MAX + sizeof ETCD_LEASE_SUFFIX]; /* "<prefix>/lease" */
    char url[]; /* as given to open: the store's name in messages */
} etcd_store;

/* A key's state as a range read returned it. */
typedef struct etcd_kv {
    int present;
    char *value; /* malloc'd, NUL-terminated past len; NULL when absent */
    size_t len;
    int64_t mod_rev; /* 0 when absent: what a txn compares against */
    int64_t lease;
} etcd_kv;

static void etcd_kv_clear(etcd_kv *kv) {
    free(kv->value);
    memset(kv, 0, sizeof *kv);
}

static uint64_t etcd_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* Messages (ETCD-8). */

/* Records "etcd store '<url>': <message>" in s->base.errmsg and for tp_errmsg(). */
static tp_status etcd_fail(etcd_store *s, tp_status status, const char *fmt, ...) TPI_PRINTF(3, 4);

static tp_status etcd_fail(etcd_store *s, tp_status status, const char *fmt, ...) {
    char *buf = s->base.errmsg;
    size_t n =
        tpi_format(buf, sizeof s->base.errmsg, "etcd store '%.*s': ", ETCD_MSG_URL_MAX, s->url);
    va_list ap;
    va_start(ap, fmt);
    tpi_vformat(buf + n, sizeof s->base.errmsg - n, fmt, ap);
    va_end(ap);
    return tpi_fail_msg(status, buf);
}

/* A value quoted for a message: its first bytes, anything unprintable as '?'. */
static void etcd_quote(char *out, size_t out_len, const void *value, size_t len) {
    const unsigned char *p = value;
    size_t n = len < out_len - 1 ? len : out_len - 1;
    for (size_t i = 0; i < n; i++)
        out[i] = (p[i] >= 0x20 && p[i] < 0x7f) ? (char)p[i] : '?';
    out[n] = '\0';
}

/* ------------------------------------------------------------------------ */
/* Arguments (STORE-4): checked, never asserted, except the pointers the
 * contract says are never NULL. The same messages as the SQLite store. */

static tp_status etcd_check_key(etcd_store *s, const char *op, const char *key, size_t *len) {
    TPI_ASSERT(key != NULL);
    *len = strnlen(key, (size_t)TP_STORE_KEY_LEN_MAX + 1);
    if (*len == 0)
        return etcd_fail(s, TP_EINVAL, "%s: empty key", op);
    if (*len > TP_STORE_KEY_LEN_MAX)
        return etcd_fail(s, TP_EINVAL, "%s '%.40s...': key longer than %d bytes", op, key,
                         TP_STORE_KEY_LEN_MAX);
    return TP_OK;
}

static tp_status etcd_check_value(etcd_store *s, const char *op, const char *key, const void *value,
                                  size_t len) {
    TPI_ASSERT(value != NULL || len == 0);
    if (len > TP_STORE_VALUE_LEN_MAX)
        return etcd_fail(s, TP_EINVAL, "%s '%s': value of %zu bytes is over the limit of %u", op,
                         key, len, (unsigned)TP_STORE_VALUE_LEN_MAX);
    return TP_OK;
}

/* ------------------------------------------------------------------------ */
/* base64 (OpenSSL's: the library links libcrypto for TCP-17 already). */

/* A JSON string holding len bytes at p in base64; NULL on exhaustion. */
static json_t *etcd_b64(const void *p, size_t len) {
    size_t out_len = 4 * ((len + 2) / 3);
    unsigned char *out = malloc(out_len + 1);
    if (!out)
        return NULL;
    int n = EVP_EncodeBlock(out, p, (int)len);
    TPI_ASSERT(n >= 0 && (size_t)n == out_len);
    json_t *j = json_stringn((const char *)out, out_len);
    free(out);
    return j;
}

/* Decodes base64 from etcd into a malloc'd buffer NUL-terminated past *len.
 * 0; -1 when it is not base64 or decodes to more than max bytes; -2 on
 * exhaustion. */
static int etcd_unb64(const char *in, size_t in_len, size_t max, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (in_len % 4 != 0 || in_len / 4 * 3 > max + 2)
        return -1;
    char *buf = malloc(in_len / 4 * 3 + 1);
    if (!buf)
        return -2;
    int n =
        in_len ? EVP_DecodeBlock((unsigned char *)buf, (const unsigned char *)in, (int)in_len) : 0;
    if (n < 0) {
        free(buf);
        return -1;
    }
    /* EVP_DecodeBlock counts the padding as zero bytes. */
    size_t pad =
        in_len >= 1 && in[in_len - 1] == '=' ? 1 + (in_len >= 2 && in[in_len - 2] == '=') : 0;
    size_t got = (size_t)n >= pad ? (size_t)n - pad : SIZE_MAX;
    if (got > max) {
        free(buf);
        return -1;
    }
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* JSON from etcd: input, never trusted. */

/* An int64 field: the gateway writes them as strings of digits; a number is
 * taken too, and an absent field is 0 (protobuf's default). 0, or -1. */
static int etcd_json_i64(const json_t *obj, const char *name, int64_t *out) {
    const json_t *v = json_object_get(obj, name);
    *out = 0;
    if (!v)
        return 0;
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 0;
    }
    if (!json_is_string(v))
        return -1;
    return tpi_store_parse_i64(json_string_value(v), json_string_length(v), out) ? 0 : -1;
}

/*
 * One kv object of a range reply for the etcd key want (want_len bytes; NULL:
 * any key, then *key gets the decoded key, malloc'd). 0, -1 when malformed,
 * -2 on exhaustion.
 */
static int etcd_json_kv(const json_t *o, const char *want, size_t want_len, etcd_kv *kv, char **key,
                        size_t *key_len) {
    memset(kv, 0, sizeof *kv);
    const json_t *k = json_object_get(o, "key");
    const json_t *v = json_object_get(o, "value");
    if (!json_is_object(o) || !json_is_string(k) || (v && !json_is_string(v)))
        return -1;
    if (etcd_json_i64(o, "mod_revision", &kv->mod_rev) != 0 || kv->mod_rev <= 0 ||
        etcd_json_i64(o, "lease", &kv->lease) != 0)
        return -1;
    char *kb = NULL;
    size_t kn = 0;
    int rc = etcd_unb64(json_string_value(k), json_string_length(k), 4096, &kb, &kn);
    if (rc != 0)
        return rc;
    if (want && (kn != want_len || memcmp(kb, want, kn) != 0)) {
        free(kb);
        return -1;
    }
    if (key) {
        *key = kb;
        *key_len = kn;
    } else {
        free(kb);
    }
    /* An absent "value" is protobuf's default: the empty value. */
    rc = v ? etcd_unb64(json_string_value(v), json_string_length(v), TP_STORE_VALUE_LEN_MAX,
                        &kv->value, &kv->len)
           : etcd_unb64("", 0, 0, &kv->value, &kv->len);
    if (rc != 0) {
        if (key) {
            free(*key);
            *key = NULL;
        }
        return rc;
    }
    kv->present = 1;
    return 0;
}

/* The one key a range for a single key returned (or none). 0, -1, -2. */
static int etcd_json_one(const json_t *range, const char *want, size_t want_len, etcd_kv *kv) {
    memset(kv, 0, sizeof *kv);
    const json_t *kvs = json_object_get(range, "kvs");
    if (!kvs)
        return 0; /* an empty repeated field is left out: absent */
    if (!json_is_array(kvs) || json_array_size(kvs) > 1)
        return -1;
    if (json_array_size(kvs) == 0)
        return 0;
    return etcd_json_kv(json_array_get(kvs, 0), want, want_len, kv, NULL, NULL);
}

/* ------------------------------------------------------------------------ */
/* HTTP (ETCD-7): one POST to one endpoint. */

static size_t etcd_http_write(char *data, size_t size, size_t nmemb, void *arg) {
    etcd_http *h = arg;
    size_t n = size * nmemb;
    if (h->reply_len + n > ETCD_REPLY_MAX) {
        h->reply_over = 1;
        return 0; /* curl fails the transfer with CURLE_WRITE_ERROR */
    }
    if (h->reply_len + n + 1 > h->reply_cap) {
        size_t cap = h->reply_cap ? h->reply_cap : 4096;
        while (cap < h->reply_len + n + 1)
            cap *= 2;
        char *p = realloc(h->reply, cap);
        if (!p)
            return 0;
        h->reply = p;
        h->reply_cap = cap;
    }
    memcpy(h->reply + h->reply_len, data, n);
    h->reply_len += n;
    h->reply[h->reply_len] = '\0';
    return n;
}

static int etcd_http_init(etcd_http *h) {
    memset(h, 0, sizeof *h);
    h->curl = curl_easy_init();
    /* No "Expect: 100-continue" on large bodies: etcd answers at once. */
    struct curl_slist *a = curl_slist_append(NULL, "Content-Type: application/json");
    h->headers = a ? curl_slist_append(a, "Expect:") : NULL;
    if (!h->headers)
        curl_slist_free_all(a);
    return h->curl && h->headers ? 0 : -1;
}

static void etcd_http_deinit(etcd_http *h) {
    if (h->curl)
        curl_easy_cleanup(h->curl);
    curl_slist_free_all(h->headers);
    free(h->reply);
    memset(h, 0, sizeof *h);
}

/* Sets h up for one POST of body (borrowed until the transfer ends) to
 * path at ep, within timeout_ms. */
static int etcd_http_setup(etcd_http *h, const etcd_endpoint *ep, const char *path,
                           const char *body, size_t body_len, uint32_t timeout_ms) {
    char url[sizeof ep->base + 32];
    tpi_format(url, sizeof url, "%s%s", ep->base, path);
    h->reply_len = 0;
    h->reply_over = 0;
    h->curl_err[0] = '\0';
    if (h->reply)
        h->reply[0] = '\0';
    long connect_ms =
        timeout_ms < ETCD_CONNECT_TIMEOUT_MAX_MS ? (long)timeout_ms : ETCD_CONNECT_TIMEOUT_MAX_MS;
    CURL *c = h->curl;
    int bad = 0;
    bad |= curl_easy_setopt(c, CURLOPT_URL, url) != CURLE_OK; /* curl copies it */
    bad |= curl_easy_setopt(c, CURLOPT_POST, 1L) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_POSTFIELDS, body) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_HTTPHEADER, h->headers) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, etcd_http_write) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_WRITEDATA, h) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_ERRORBUFFER, h->curl_err) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)timeout_ms) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, connect_ms) != CURLE_OK;
    /* Threads of a library: no signals (curl would use SIGALRM for DNS). */
    bad |= curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L) != CURLE_OK;
    /* etcd is reached directly, whatever http_proxy says. */
    bad |= curl_easy_setopt(c, CURLOPT_NOPROXY, "*") != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L) != CURLE_OK;
    return bad ? -1 : 0;
}

/*
 * What came of one transfer: 0 with the HTTP status in *code, or -1 with
 * the reason in why and *unsent set when the request cannot have reached
 * etcd (nothing was sent: refused, unresolvable, connect timed out).
 */
static int etcd_http_result(etcd_http *h, CURLcode rc, uint32_t timeout_ms, long *code, int *unsent,
                            char *why, size_t why_len) {
    *code = 0;
    *unsent = 0;
    if (rc == CURLE_OK) {
        curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, code);
        return 0;
    }
    long sent = 0, os_errno = 0;
    curl_easy_getinfo(h->curl, CURLINFO_REQUEST_SIZE, &sent);
    curl_easy_getinfo(h->curl, CURLINFO_OS_ERRNO, &os_errno);
    *unsent = sent == 0;
    if (h->reply_over)
        tpi_format(why, why_len, "a reply over %zu bytes", (size_t)ETCD_REPLY_MAX);
    else if (rc == CURLE_OPERATION_TIMEDOUT)
        tpi_format(why, why_len, "no answer within %u ms", (unsigned)timeout_ms);
    else if (os_errno != 0)
        tpi_format(why, why_len, "%s", strerror((int)os_errno));
    else
        tpi_format(why, why_len, "%.*s", ETCD_WHY_MAX,
                   h->curl_err[0] ? h->curl_err : curl_easy_strerror(rc));
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Calls (ETCD-7, ETCD-8). */

typedef enum etcd_retry {
    ETCD_RETRY_UNSENT, /* another endpoint only if this one never saw the request */
    ETCD_RETRY_ANY     /* repeating it is harmless: reads, put, delete */
} etcd_retry;

/* gRPC codes in the gateway's error replies. */
#define ETCD_GRPC_NOT_FOUND 5
#define ETCD_GRPC_UNAVAILABLE 14

/*
 * POSTs req to path at the endpoints in turn, starting with the one that
 * answered last, until one answers. TP_OK with *out the reply (the caller
 * json_decref()s it). TP_ESTORE otherwise, recorded, naming op and key, the
 * etcd call and each endpoint's failure. *lease_gone (may be NULL) is set
 * when etcd said the lease a write named does not exist. s->mu held.
 */
static tp_status etcd_call(etcd_store *s, const char *op, const char *key, const char *call,
                           const char *path, const json_t *req, etcd_retry retry, json_t **out,
                           int *lease_gone) {
    *out = NULL;
    if (lease_gone)
        *lease_gone = 0;
    char *body = json_dumps(req, JSON_COMPACT);
    if (!body)
        return etcd_fail(s, TP_ENOMEM, "%s '%s': out of memory for an etcd request", op, key);
    char detail[TP_ERRMSG_LEN_MAX] = "";
    size_t dn = 0;
    tp_status st = TP_ESTORE;
    uint32_t first = s->next_ep;
    for (uint32_t i = 0; i < s->n_ep; i++) {
        uint32_t e = (first + i) % s->n_ep;
        etcd_http *h = &s->http;
        char why[ETCD_WHY_MAX + 64];
        long code = 0;
        int unsent = 0, next = 0;
        if (etcd_http_setup(h, &s->ep[e], path, body, strlen(body), s->timeout_ms) != 0) {
            tpi_format(why, sizeof why, "curl refused the request's options");
        } else if (etcd_http_result(h, curl_easy_perform(h->curl), s->timeout_ms, &code, &unsent,
                                    why, sizeof why) != 0) {
            next = unsent || retry == ETCD_RETRY_ANY;
        } else {
            json_error_t jerr;
            json_t *j = json_loadb(h->reply ? h->reply : "", h->reply_len, 0, &jerr);
            if (code == 200 && json_is_object(j)) {
                s->next_ep = e;
                *out = j;
                st = TP_OK;
                break;
            }
            /* The gateway's error: {"error": "...", "code": <gRPC code>}. */
            const json_t *msg = json_object_get(j, "error");
            json_int_t grpc = json_integer_value(json_object_get(j, "code"));
            if (code == 200)
                tpi_format(why, sizeof why, "a reply that is not a JSON object");
            else if (json_is_string(msg))
                tpi_format(why, sizeof why, "etcd answered HTTP %ld: %.*s", code, ETCD_WHY_MAX,
                           json_string_value(msg));
            else
                tpi_format(why, sizeof why, "etcd answered HTTP %ld with no error text", code);
            if (lease_gone && grpc == ETCD_GRPC_NOT_FOUND && json_is_string(msg) &&
                strstr(json_string_value(msg), "lease not found"))
                *lease_gone = 1;
            /* No leader, or a member going down: another member may serve. */
            next = grpc == ETCD_GRPC_UNAVAILABLE && retry == ETCD_RETRY_ANY;
            json_decref(j);
        }
        dn += tpi_format(detail + dn, sizeof detail - dn, "%s%s at %s: %s", dn ? "; " : "", call,
                         s->ep[e].desc, why);
        if (!next)
            break;
        /* Later requests start with the next endpoint, until one fails too. */
        s->next_ep = (e + 1) % s->n_ep;
    }
    free(body);
    if (st != TP_OK)
        st = etcd_fail(s, TP_ESTORE, "%s '%s': %s", op, key, detail);
    return st;
}

/* An int64 for a request: as a string of digits, as the gateway writes them. */
static int etcd_set_i64(json_t *obj, const char *name, int64_t v) {
    char text[24];
    tpi_format(text, sizeof text, "%" PRId64, v);
    return json_object_set_new(obj, name, json_string(text));
}

/* Request builders: each returns a new object, or NULL on exhaustion. */

/* {"key": base64 of the ek_len bytes at ek}. */
static json_t *etcd_req_raw_key(const char *ek, size_t ek_len) {
    json_t *req = json_object();
    if (req && json_object_set_new(req, "key", etcd_b64(ek, ek_len)) != 0) {
        json_decref(req);
        return NULL;
    }
    return req;
}

/* A put: {"key", "value", "lease"} (lease 0: none). */
static json_t *etcd_req_put_raw(const char *ek, size_t ek_len, const void *value, size_t len,
                                int64_t lease) {
    json_t *req = etcd_req_raw_key(ek, ek_len);
    if (req && (json_object_set_new(req, "value", etcd_b64(value, len)) != 0 ||
                (lease && etcd_set_i64(req, "lease", lease) != 0))) {
        json_decref(req);
        return NULL;
    }
    return req;
}

/* A txn's compare: the key's target revision field equals v. */
static json_t *etcd_req_cmp(const char *ek, size_t ek_len, const char *target, const char *field,
                            int64_t v) {
    json_t *c = etcd_req_raw_key(ek, ek_len);
    if (c && (json_object_set_new(c, "target", json_string(target)) != 0 ||
              json_object_set_new(c, "result", json_string("EQUAL")) != 0 ||
              etcd_set_i64(c, field, v) != 0)) {
        json_decref(c);
        return NULL;
    }
    return c;
}

/* {"compare": [cmp], "success": [{"request_put": put}], "failure":
 * [{"request_range": get}]}: takes the three, NULL ones meaning exhaustion. */
static json_t *etcd_req_txn(json_t *cmp, json_t *put, json_t *get) {
    if (!cmp || !put || !get) {
        json_decref(cmp);
        json_decref(put);
        json_decref(get);
        return NULL;
    }
    /* "o" steals each reference, on failure too (jansson >= 2.11). */
    return json_pack("{s:[o], s:[{s:o}], s:[{s:o}]}", "compare", cmp, "success", "request_put", put,
                     "failure", "request_range", get);
}

/* The etcd key of store key key, in ek (sizeof s->kv_prefix + 255 bytes). */
static size_t etcd_key_of(const etcd_store *s, const char *key, size_t key_len, char *ek) {
    memcpy(ek, s->kv_prefix, s->kv_prefix_len);
    memcpy(ek + s->kv_prefix_len, key, key_len);
    return s->kv_prefix_len + key_len;
}

/* A malformed reply: etcd, or whatever answered, broke the gateway's format. */
static tp_status etcd_malformed(etcd_store *s, const char *op, const char *key, const char *call,
                                int rc) {
    if (rc == -2)
        return etcd_fail(s, TP_ENOMEM, "%s '%s': out of memory reading etcd's %s reply", op, key,
                         call);
    return etcd_fail(s, TP_ESTORE, "%s '%s': etcd's %s reply at %s is malformed", op, key, call,
                     s->ep[s->next_ep].desc);
}

/* Reads the etcd key ek into kv, by a range request named call in
 * messages. s->mu held. */
static tp_status etcd_range_one(etcd_store *s, const char *op, const char *key, const char *call,
                                const char *ek, size_t ek_len, etcd_kv *kv) {
    memset(kv, 0, sizeof *kv);
    json_t *req = etcd_req_raw_key(ek, ek_len), *rep = NULL;
    if (!req)
        return etcd_fail(s, TP_ENOMEM, "%s '%s': out of memory for an etcd request", op, key);
    tp_status st = etcd_call(s, op, key, call, "/v3/kv/range", req, ETCD_RETRY_ANY, &rep, NULL);
    json_decref(req);
    if (st != TP_OK)
        return st;
    int rc = etcd_json_one(rep, ek, ek_len, kv);
    json_decref(rep);
    if (rc != 0) {
        etcd_kv_clear(kv);
        return etcd_malformed(s, op, key, call, rc);
    }
    return TP_OK;
}

/* ------------------------------------------------------------------------ */
/* The job's lease (ETCD-6). */

/* Wakes the keepalive thread: a new lease is to be kept alive at once. */
static void etcd_keepalive_wake(etcd_store *s) {
    if (s->ka_multi)
        curl_multi_wakeup(s->ka_multi);
}

/* Forgets lease (the write that used it found it gone), unless another
 * thread already replaced it. */
static void etcd_lease_forget(etcd_store *s, int64_t lease) {
    int64_t expect = lease;
    atomic_compare_exchange_strong(&s->lease, &expect, 0);
}

/*
 * Grants a lease of ttl_s and publishes it under the lease key, unless a
 * member published one first: then that one is the job's and ours is
 * revoked. s->mu held.
 */
static tp_status etcd_lease_make(etcd_store *s, const char *op, const char *key, int64_t *out) {
    json_t *req = json_object(), *rep = NULL;
    if (!req || etcd_set_i64(req, "TTL", s->ttl_s) != 0) {
        json_decref(req);
        return etcd_fail(s, TP_ENOMEM, "%s '%s': out of memory for an etcd request", op, key);
    }
    tp_status st =
        etcd_call(s, op, key, "lease grant", "/v3/lease/grant", req, ETCD_RETRY_UNSENT, &rep, NULL);
    json_decref(req);
    if (st != TP_OK)
        return st;
    int64_t id = 0;
    int bad = etcd_json_i64(rep, "ID", &id) != 0 || id <= 0;
    json_decref(rep);
    if (bad)
        return etcd_malformed(s, op, key, "lease grant", -1);
    /* Publish it if no member did: txn on the lease key's absence. */
    size_t lk_len = strlen(s->lease_key);
    char idtext[24];
    size_t idlen = tpi_format(idtext, sizeof idtext, "%" PRId64, id);
    req = etcd_req_txn(etcd_req_cmp(s->lease_key, lk_len, "CREATE", "create_revision", 0),
                       etcd_req_put_raw(s->lease_key, lk_len, idtext, idlen, id),
                       etcd_req_raw_key(s->lease_key, lk_len));
    if (!req)
        return etcd_fail(s, TP_ENOMEM, "%s '%s': out of memory for an etcd request", op, key);
    st = etcd_call(s, op, key, "txn (lease)", "/v3/kv/txn", req, ETCD_RETRY_UNSENT, &rep, NULL);
    json_decref(req);
    if (st != TP_OK)
        return st; /* our lease expires by itself */
    if (json_is_true(json_object_get(rep, "succeeded"))) {
        json_decref(rep);
        *out = id;
        return TP_OK;
    }
    const json_t *r0 = json_array_get(json_object_get(rep, "responses"), 0);
    etcd_kv kv;
    int rc = etcd_json_one(json_object_get(r0, "response_range"), s->lease_key, lk_len, &kv);
    json_decref(rep);
    int64_t theirs = kv.lease;
    int present = kv.present;
    etcd_kv_clear(&kv);
    /* Revoke ours, best effort: unrevoked it expires after its TTL anyway. */
    req = json_object();
    if (req && etcd_set_i64(req, "ID", id) == 0 &&
        etcd_call(s, op, key, "lease revoke", "/v3/lease/revoke", req, ETCD_RETRY_UNSENT, &rep,
                  NULL) == TP_OK)
        json_decref(rep);
    json_decref(req);
    if (rc != 0)
        return etcd_malformed(s, op, key, "txn (lease)", rc);
    if (!present) /* it expired between the txn's compare and its read: try again */
        return etcd_fail(s, TP_ESTORE, "%s '%s': the job's lease under '%s' came and went", op, key,
                         s->lease_key);
    *out = theirs;
    return theirs > 0
               ? TP_OK
               : etcd_fail(s, TP_ESTORE, "%s '%s': '%s' holds no lease", op, key, s->lease_key);
}

/* The lease to write with: the one known, the job's published one, or a
 * new one. s->mu held. */
static tp_status etcd_lease_get(etcd_store *s, const char *op, const char *key, int64_t *out) {
    *out = atomic_load(&s->lease);
    if (*out != 0)
        return TP_OK;
    size_t lk_len = strlen(s->lease_key);
    etcd_kv kv;
    tp_status st = etcd_range_one(s, op, key, "range (lease)", s->lease_key, lk_len, &kv);
    if (st != TP_OK)
        return st;
    int64_t id = kv.lease;
    int present = kv.present;
    etcd_kv_clear(&kv);
    if (present && id <= 0)
        return etcd_fail(s, TP_ESTORE,
                         "%s '%s': '%s' holds no lease (did something else write it?)", op, key,
                         s->lease_key);
    if (!present && (st = etcd_lease_make(s, op, key, &id)) != TP_OK)
        return st;
    atomic_store(&s->lease, id);
    etcd_keepalive_wake(s);
    *out = id;
    return TP_OK;
}

/* A write: fn with the job's lease; when etcd says the lease is gone (every
 * member was away for its TTL), forget it and run again with a new one. */
typedef tp_status (*etcd_write_fn)(etcd_store *s, int64_t lease, void *arg, int *lease_gone);

static tp_status etcd_write(etcd_store *s, const char *op, const char *key, etcd_write_fn fn,
                            void *arg) {
    for (int attempt = 0;; attempt++) {
        int64_t lease = 0;
        int gone = 0;
        tp_status st = etcd_lease_get(s, op, key, &lease);
        if (st == TP_OK)
            st = fn(s, lease, arg, &gone);
        if (!gone || attempt >= ETCD_LEASE_RETRIES)
            return st;
        tpi_log(TP_LOG_WARN,
                "etcd store '%.*s': the job's lease %" PRId64 " is gone (expired, no member "
                "having kept it alive for its TTL, or revoked), and the keys with it; "
                "writing with a new one",
                ETCD_MSG_URL_MAX, s->url, lease);
        etcd_lease_forget(s, lease);
    }
}

/* ------------------------------------------------------------------------ */
/* set, get, del (STORE-1, STORE-2). */

typedef struct etcd_args {
    const char *key;
    size_t key_len;
    const void *value; /* set: the value; compare_set: desired */
    size_t len;
    const void *expected; /* compare_set: NULL means "absent" */
    size_t expected_len;
    int64_t delta;  /* add */
    int64_t result; /* add */
    int swapped;    /* compare_set */
} etcd_args;

static tp_status etcd_set_body(etcd_store *s, int64_t lease, void *arg, int *lease_gone) {
    etcd_args *a = arg;
    char ek[sizeof s->kv_prefix + TP_STORE_KEY_LEN_MAX];
    size_t ek_len = etcd_key_of(s, a->key, a->key_len, ek);
    json_t *req = etcd_req_put_raw(ek, ek_len, a->value, a->len, lease), *rep = NULL;
    if (!req)
        return etcd_fail(s, TP_ENOMEM, "set '%s': out of memory for an etcd request", a->key);
    tp_status st =
        etcd_call(s, "set", a->key, "put", "/v3/kv/put", req, ETCD_RETRY_ANY, &rep, lease_gone);
    json_decref(req);
    json_decref(rep);
    return st;
}

static tp_status etcd_set(tp_store *base, const char *key, const void *value, size_t len) {
    TPI_ASSERT(base != NULL);
    etcd_store *s = (etcd_store *)base;
    etcd_args a = {.key = key, .value = value, .len = len};
    pthread_mutex_lock(&s->mu);
    tp_status st = etcd_check_key(s, "set", key, &a.key_len);
    if (st == TP_OK)
        st = etcd_check_value(s, "set", key, value, len);
    if (st == TP_OK)
        st = etcd_write(s, "set", key, etcd_set_body, &a);
    pthread_mutex_unlock(&s->mu);
    return st;
}

static tp_status etcd_get(tp_store *base, const char *key, void **value, size_t *len) {
    TPI_ASSERT(base != NULL && value != NULL && len != NULL);
    etcd_store *s = (etcd_store *)base;
    *value = NULL;
    *len = 0;
    size_t key_len = 0;
    pthread_mutex_lock(&s->mu);
    tp_status st = etcd_check_key(s, "get", key, &key_len);
    etcd_kv kv = {0};
    char ek[sizeof s->kv_prefix + TP_STORE_KEY_LEN_MAX];
    if (st == TP_OK)
        st = etcd_range_one(s, "get", key, "range", ek, etcd_key_of(s, key, key_len, ek), &kv);
    if (st == TP_OK && !kv.present) {
        /* Absent is an answer, not a failure: polling callers see it all the
         * time, so it stays out of tp_errmsg() (ERR-2). */
        tpi_format(s->base.errmsg, sizeof s->base.errmsg,
                   "etcd store '%.*s': get '%s': no such key", ETCD_MSG_URL_MAX, s->url, key);
        st = TP_ENOENT;
    }
    if (st == TP_OK) {
        *value = kv.value; /* NUL-terminated past its bytes */
        *len = kv.len;
        kv.value = NULL;
    }
    etcd_kv_clear(&kv);
    pthread_mutex_unlock(&s->mu);
    return st;
}

static tp_status etcd_del(tp_store *base, const char *key) {
    TPI_ASSERT(base != NULL);
    etcd_store *s = (etcd_store *)base;
    size_t key_len = 0;
    pthread_mutex_lock(&s->mu);
    tp_status st = etcd_check_key(s, "del", key, &key_len);
    if (st == TP_OK) {
        char ek[sizeof s->kv_prefix + TP_STORE_KEY_LEN_MAX];
        json_t *req = etcd_req_raw_key(ek, etcd_key_of(s, key, key_len, ek)), *rep = NULL;
        if (!req)
            st = etcd_fail(s, TP_ENOMEM, "del '%s': out of memory for an etcd request", key);
        else
            st = etcd_call(s, "del", key, "deleterange", "/v3/kv/deleterange", req, ETCD_RETRY_ANY,
                           &rep, NULL);
        json_decref(req);
        json_decref(rep);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ------------------------------------------------------------------------ */
/* add, compare_set (STORE-3, ETCD-5): read, decide here, write by a txn
 * that holds only if nobody wrote the key since the read. */

/*
 * Puts value under key (etcd key ek) with lease if the key's mod_revision
 * is still cur->mod_rev (0: still absent). *won says whether it did; when
 * it did not, cur is replaced by the key's state now (the txn's failure
 * branch reads it), for the caller to decide again. s->mu held.
 */
static tp_status etcd_txn_put(etcd_store *s, const char *op, const char *key, const char *ek,
                              size_t ek_len, const void *value, size_t len, int64_t lease,
                              etcd_kv *cur, int *won, int *lease_gone) {
    *won = 0;
    json_t *rep = NULL;
    json_t *req =
        etcd_req_txn(etcd_req_cmp(ek, ek_len, "MOD", "mod_revision", cur->mod_rev),
                     etcd_req_put_raw(ek, ek_len, value, len, lease), etcd_req_raw_key(ek, ek_len));
    if (!req)
        return etcd_fail(s, TP_ENOMEM, "%s '%s': out of memory for an etcd request", op, key);
    /* It may have been applied when its reply is lost: not sent again. */
    tp_status st =
        etcd_call(s, op, key, "txn", "/v3/kv/txn", req, ETCD_RETRY_UNSENT, &rep, lease_gone);
    json_decref(req);
    if (st != TP_OK)
        return st;
    if (json_is_true(json_object_get(rep, "succeeded"))) {
        json_decref(rep);
        *won = 1;
        return TP_OK;
    }
    etcd_kv_clear(cur);
    const json_t *r0 = json_array_get(json_object_get(rep, "responses"), 0);
    int rc = etcd_json_one(json_object_get(r0, "response_range"), ek, ek_len, cur);
    json_decref(rep);
    if (rc != 0) {
        etcd_kv_clear(cur);
        return etcd_malformed(s, op, key, "txn", rc);
    }
    return TP_OK;
}

/* The rounds' bound (ETCD-5). */
static int etcd_rmw_over(int round, uint64_t start_ns) {
    return round >= ETCD_RMW_ROUNDS_MAX ||
           etcd_now_ns() - start_ns >= (uint64_t)ETCD_RMW_BUDGET_MS * 1000000u;
}

static tp_status etcd_rmw_gave_up(etcd_store *s, const char *op, const char *key, int round) {
    return etcd_fail(s, TP_ESTORE,
                     "%s '%s': gave up after %d rounds in %.1f s: other writers changed the key "
                     "between each read and write",
                     op, key, round, ETCD_RMW_BUDGET_MS / 1000.0);
}

static tp_status etcd_add_body(etcd_store *s, int64_t lease, void *arg, int *lease_gone) {
    etcd_args *a = arg;
    char ek[sizeof s->kv_prefix + TP_STORE_KEY_LEN_MAX];
    size_t ek_len = etcd_key_of(s, a->key, a->key_len, ek);
    etcd_kv cur;
    tp_status st = etcd_range_one(s, "add", a->key, "range", ek, ek_len, &cur);
    uint64_t start = etcd_now_ns();
    for (int round = 0; st == TP_OK; round++) {
        int64_t old = 0;
        if (cur.present && !tpi_store_parse_i64(cur.value, cur.len, &old)) {
            char q[ETCD_MSG_VALUE_MAX + 1];
            etcd_quote(q, sizeof q, cur.value, cur.len);
            st = etcd_fail(s, TP_EINVAL,
                           "add '%s': value '%s%s' (%zu bytes) is not a decimal integer", a->key, q,
                           cur.len > ETCD_MSG_VALUE_MAX ? "..." : "", cur.len);
            break;
        }
        if ((a->delta > 0 && old > INT64_MAX - a->delta) ||
            (a->delta < 0 && old < INT64_MIN - a->delta)) {
            st = etcd_fail(s, TP_ERANGE,
                           "add '%s': %" PRId64 " + %" PRId64 " overflows a 64-bit integer", a->key,
                           old, a->delta);
            break;
        }
        if (etcd_rmw_over(round, start)) {
            st = etcd_rmw_gave_up(s, "add", a->key, round);
            break;
        }
        char text[24];
        size_t text_len = tpi_format(text, sizeof text, "%" PRId64, old + a->delta);
        int won = 0;
        st = etcd_txn_put(s, "add", a->key, ek, ek_len, text, text_len, lease, &cur, &won,
                          lease_gone);
        if (st == TP_OK && won) {
            a->result = old + a->delta;
            break;
        }
    }
    etcd_kv_clear(&cur);
    return st;
}

static tp_status etcd_add(tp_store *base, const char *key, int64_t delta, int64_t *result) {
    TPI_ASSERT(base != NULL && result != NULL);
    etcd_store *s = (etcd_store *)base;
    etcd_args a = {.key = key, .delta = delta};
    pthread_mutex_lock(&s->mu);
    tp_status st = etcd_check_key(s, "add", key, &a.key_len);
    if (st == TP_OK)
        st = etcd_write(s, "add", key, etcd_add_body, &a);
    if (st == TP_OK)
        *result = a.result;
    pthread_mutex_unlock(&s->mu);
    return st;
}

static int etcd_matches(const etcd_kv *cur, const etcd_args *a) {
    if (!a->expected)
        return !cur->present;
    return cur->present && cur->len == a->expected_len &&
           (cur->len == 0 || memcmp(cur->value, a->expected, cur->len) == 0);
}

static tp_status etcd_cas_body(etcd_store *s, int64_t lease, void *arg, int *lease_gone) {
    etcd_args *a = arg;
    char ek[sizeof s->kv_prefix + TP_STORE_KEY_LEN_MAX];
    size_t ek_len = etcd_key_of(s, a->key, a->key_len, ek);
    etcd_kv cur = {0};
    tp_status st = TP_OK;
    a->swapped = 0;
    /* Create-if-absent needs no read: the txn's compare is the absence. */
    if (a->expected)
        st = etcd_range_one(s, "compare_set", a->key, "range", ek, ek_len, &cur);
    uint64_t start = etcd_now_ns();
    for (int round = 0; st == TP_OK && etcd_matches(&cur, a); round++) {
        if (etcd_rmw_over(round, start)) {
            st = etcd_rmw_gave_up(s, "compare_set", a->key, round);
            break;
        }
        int won = 0;
        st = etcd_txn_put(s, "compare_set", a->key, ek, ek_len, a->value, a->len, lease, &cur, &won,
                          lease_gone);
        if (st == TP_OK && won) {
            a->swapped = 1;
            break;
        }
        /* Lost: the key changed since the read; the loop decides again on
         * its state now (it may still match: another writer wrote the
         * expected value again). */
    }
    etcd_kv_clear(&cur);
    return st;
}

static tp_status etcd_compare_set(tp_store *base, const char *key, const void *expected,
                                  size_t expected_len, const void *desired, size_t desired_len,
                                  int *swapped) {
    TPI_ASSERT(base != NULL && swapped != NULL);
    TPI_ASSERT(expected != NULL || expected_len == 0);
    etcd_store *s = (etcd_store *)base;
    *swapped = 0;
    etcd_args a = {.key = key,
                   .value = desired,
                   .len = desired_len,
                   .expected = expected,
                   .expected_len = expected_len};
    pthread_mutex_lock(&s->mu);
    tp_status st = etcd_check_key(s, "compare_set", key, &a.key_len);
    if (st == TP_OK && expected)
        st = etcd_check_value(s, "compare_set (expected)", key, expected, expected_len);
    if (st == TP_OK)
        st = etcd_check_value(s, "compare_set", key, desired, desired_len);
    if (st == TP_OK)
        st = etcd_write(s, "compare_set", key, etcd_cas_body, &a);
    if (st == TP_OK)
        *swapped = a.swapped;
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ------------------------------------------------------------------------ */
/* scan (STORE-10, ETCD-4): ranges of at most ETCD_SCAN_PAGE_KEYS keys. */

typedef int (*etcd_scan_fn)(void *arg, const char *key, const void *value, size_t len);

/* Whether etcd key a (alen bytes) comes after b in byte order. */
static int etcd_key_after(const char *a, size_t alen, const char *b, size_t blen) {
    int c = memcmp(a, b, alen < blen ? alen : blen);
    return c > 0 || (c == 0 && alen > blen);
}

/*
 * Calls fn for each key of one page. Each must be a store key under the
 * scan's etcd prefix pfx, after the last one seen (*last, updated): a reply
 * that breaks the order could keep a scan going forever. 1 when fn
 * stopped, 0 to go on, or -1/-2 (malformed, exhaustion).
 */
static int etcd_scan_page(etcd_store *s, const json_t *kvs, const char *pfx, size_t pfx_len,
                          etcd_scan_fn fn, void *arg, char *last, size_t *last_len) {
    for (size_t i = 0; i < json_array_size(kvs); i++) {
        etcd_kv kv;
        char *k = NULL;
        size_t kn = 0;
        int rc = etcd_json_kv(json_array_get(kvs, i), NULL, 0, &kv, &k, &kn);
        if (rc != 0)
            return rc;
        int ok = kn >= pfx_len && kn - s->kv_prefix_len <= TP_STORE_KEY_LEN_MAX &&
                 memcmp(k, pfx, pfx_len) == 0 && memchr(k, '\0', kn) == NULL &&
                 (*last_len == 0 || etcd_key_after(k, kn, last, *last_len));
        int stop = 0;
        if (ok) {
            memcpy(last, k, kn);
            last[kn] = '\0';
            *last_len = kn;
            /* The store key, NUL-terminated in last; the value is already. */
            stop = fn(arg, last + s->kv_prefix_len, kv.value, kv.len) != 0;
        }
        free(k);
        etcd_kv_clear(&kv);
        if (!ok)
            return -1;
        if (stop)
            return 1;
    }
    return 0;
}

static tp_status etcd_scan(tp_store *base, const char *prefix, etcd_scan_fn fn, void *arg) {
    TPI_ASSERT(base != NULL && prefix != NULL && fn != NULL);
    etcd_store *s = (etcd_store *)base;
    size_t plen = 0;
    pthread_mutex_lock(&s->mu);
    tp_status st = etcd_check_key(s, "scan", prefix, &plen);
    /* [pfx, end): end is pfx with its last byte below 0xff raised by one. */
    char pfx[sizeof s->kv_prefix + TP_STORE_KEY_LEN_MAX], end[sizeof pfx];
    char last[sizeof pfx + 1];
    size_t pfx_len = st == TP_OK ? etcd_key_of(s, prefix, plen, pfx) : 0, end_len = pfx_len;
    size_t last_len = 0;
    memcpy(end, pfx, pfx_len);
    while (end_len > 0 && (unsigned char)end[end_len - 1] == 0xff)
        end_len--;
    TPI_ASSERT(st != TP_OK || end_len > 0); /* the kv prefix is printable text */
    if (end_len > 0)
        end[end_len - 1] = (char)((unsigned char)end[end_len - 1] + 1);
    for (int more = 1; st == TP_OK && more;) {
        /* From the prefix, then from just after the last key seen: the
         * last key with a NUL byte appended is the least key after it. */
        char from[sizeof last + 1];
        size_t from_len = last_len ? last_len + 1 : pfx_len;
        if (last_len) {
            memcpy(from, last, last_len);
            from[last_len] = '\0';
        } else {
            memcpy(from, pfx, pfx_len);
        }
        json_t *req = json_object(), *rep = NULL;
        if (!req || json_object_set_new(req, "key", etcd_b64(from, from_len)) != 0 ||
            json_object_set_new(req, "range_end", etcd_b64(end, end_len)) != 0 ||
            etcd_set_i64(req, "limit", ETCD_SCAN_PAGE_KEYS) != 0) {
            json_decref(req);
            st = etcd_fail(s, TP_ENOMEM, "scan '%s': out of memory for an etcd request", prefix);
            break;
        }
        st = etcd_call(s, "scan", prefix, "range", "/v3/kv/range", req, ETCD_RETRY_ANY, &rep, NULL);
        json_decref(req);
        if (st != TP_OK)
            break;
        const json_t *kvs = json_object_get(rep, "kvs");
        int rc = kvs && !json_is_array(kvs) ? -1 : 0;
        size_t n = json_array_size(kvs);
        more = json_is_true(json_object_get(rep, "more"));
        if (rc == 0 && (n > ETCD_SCAN_PAGE_KEYS || (more && n == 0)))
            rc = -1; /* "more" with nothing in it: no progress */
        if (rc == 0)
            rc = etcd_scan_page(s, kvs, pfx, pfx_len, fn, arg, last, &last_len);
        json_decref(rep);
        if (rc < 0)
            st = etcd_malformed(s, "scan", prefix, "range", rc);
        if (rc == 1)
            break;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ------------------------------------------------------------------------ */
/* The keepalive thread (ETCD-6). */

/*
 * One keepalive of lease through the multi handle, so close can cut it
 * short: 1 when the lease lives, 0 when etcd says it is gone, -1 when no
 * endpoint answered (*ep moves on to the next), -2 when stopped.
 */
static int etcd_keepalive_once(etcd_store *s, int64_t lease, uint32_t *ep) {
    char body[64];
    size_t len = tpi_format(body, sizeof body, "{\"ID\":\"%" PRId64 "\"}", lease);
    etcd_http *h = &s->ka_http;
    uint32_t timeout_ms =
        s->timeout_ms < s->ttl_s * 1000u / 3 ? s->timeout_ms : s->ttl_s * 1000u / 3;
    if (etcd_http_setup(h, &s->ep[*ep], "/v3/lease/keepalive", body, len, timeout_ms) != 0 ||
        curl_multi_add_handle(s->ka_multi, h->curl) != CURLM_OK)
        return -1;
    CURLcode rc = CURLE_OK;
    int done = 0, running = 1;
    while (!done && !atomic_load(&s->ka_stop)) {
        if (curl_multi_perform(s->ka_multi, &running) != CURLM_OK)
            break;
        CURLMsg *m;
        int left = 0;
        while ((m = curl_multi_info_read(s->ka_multi, &left)) != NULL) {
            if (m->msg == CURLMSG_DONE && m->easy_handle == h->curl) {
                rc = m->data.result;
                done = 1;
            }
        }
        if (!done && curl_multi_poll(s->ka_multi, NULL, 0, 100, NULL) != CURLM_OK)
            break;
    }
    curl_multi_remove_handle(s->ka_multi, h->curl);
    if (!done)
        return atomic_load(&s->ka_stop) ? -2 : -1;
    long code = 0;
    int unsent = 0;
    char why[ETCD_WHY_MAX + 64];
    if (etcd_http_result(h, rc, timeout_ms, &code, &unsent, why, sizeof why) != 0 || code != 200) {
        if (code != 0)
            tpi_format(why, sizeof why, "HTTP %ld", code);
        tpi_log(TP_LOG_INFO, "etcd store '%.*s': keepalive of lease %" PRId64 " at %s: %s",
                ETCD_MSG_URL_MAX, s->url, lease, s->ep[*ep].desc, why);
        *ep = (*ep + 1) % s->n_ep;
        return -1;
    }
    /* {"result": {"ID": "..", "TTL": ".."}}; no TTL (0) means gone. */
    json_error_t jerr;
    json_t *j = json_loadb(h->reply ? h->reply : "", h->reply_len, 0, &jerr);
    const json_t *res = json_object_get(j, "result");
    int64_t ttl = -1;
    if (json_is_object(res) && etcd_json_i64(res, "TTL", &ttl) != 0)
        ttl = -1;
    json_decref(j);
    if (ttl < 0) {
        tpi_log(TP_LOG_INFO,
                "etcd store '%.*s': keepalive of lease %" PRId64 " at %s: a malformed reply",
                ETCD_MSG_URL_MAX, s->url, lease, s->ep[*ep].desc);
        *ep = (*ep + 1) % s->n_ep;
        return -1;
    }
    return ttl > 0 ? 1 : 0;
}

static void *etcd_keepalive_main(void *arg) {
    etcd_store *s = arg;
    uint32_t ep = 0;
    int64_t kept = 0; /* the lease last kept alive */
    uint64_t due_ns = 0;
    uint64_t every_ns = (uint64_t)s->ttl_s * 1000000000u / 3;
    uint64_t retry_ns = every_ns / 4 < (uint64_t)ETCD_KEEPALIVE_RETRY_MAX_MS * 1000000u
                            ? every_ns / 4
                            : (uint64_t)ETCD_KEEPALIVE_RETRY_MAX_MS * 1000000u;
    while (!atomic_load(&s->ka_stop)) {
        int64_t lease = atomic_load(&s->lease);
        uint64_t now = etcd_now_ns();
        if (lease != 0 && (lease != kept || now >= due_ns)) {
            int r = etcd_keepalive_once(s, lease, &ep);
            if (r == -2)
                break;
            if (r == 0) {
                tpi_log(TP_LOG_WARN,
                        "etcd store '%.*s': the job's lease %" PRId64 " is gone (expired, no "
                        "member having kept it alive for its TTL, or revoked): the job's keys "
                        "are gone with it",
                        ETCD_MSG_URL_MAX, s->url, lease);
                etcd_lease_forget(s, lease);
                kept = 0;
                continue;
            }
            kept = lease;
            due_ns = etcd_now_ns() + (r == 1 ? every_ns : retry_ns);
            continue;
        }
        /* Sleep until due, or a new lease, or close (curl_multi_wakeup). */
        uint64_t wait_ns = lease != 0 && due_ns > now ? due_ns - now : every_ns;
        int wait_ms = (int)(wait_ns / 1000000u) + 1;
        curl_multi_poll(s->ka_multi, NULL, 0, wait_ms, NULL);
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Open and close. */

static void etcd_close(tp_store *base) {
    if (!base)
        return;
    etcd_store *s = (etcd_store *)base;
    if (s->ka_started) {
        atomic_store(&s->ka_stop, 1);
        curl_multi_wakeup(s->ka_multi);
        pthread_join(s->ka_thread, NULL);
    }
    /* The lease is the job's, not this handle's: never revoked here, it
     * outlives the last member by its TTL (ETCD-6). */
    etcd_http_deinit(&s->ka_http);
    if (s->ka_multi)
        curl_multi_cleanup(s->ka_multi);
    etcd_http_deinit(&s->http);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static const tp_store_ops etcd_ops = {
    .api_version = TP_BACKEND_API_VERSION,
    .set = etcd_set,
    .get = etcd_get,
    .add = etcd_add,
    .compare_set = etcd_compare_set,
    .del = etcd_del,
    .close = etcd_close,
    .scan = etcd_scan,
};

/* ---- Parsing "etcd://host:port[,host:port...]/prefix[?ttl=S&timeout_ms=MS]" (ETCD-2) ---- */

static int etcd_host_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_';
}

/* A decimal number in [lo, hi], the whole of p[0..len). */
static int etcd_parse_u32(const char *p, size_t len, uint32_t lo, uint32_t hi, uint32_t *out) {
    uint64_t v = 0;
    if (len == 0 || len > 10 || (p[0] == '0' && len > 1))
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (v < lo || v > hi)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* One "host:port" (an IPv6 host in brackets) of len bytes at p. */
static int etcd_parse_endpoint(const char *p, size_t len, etcd_endpoint *ep) {
    size_t host_len;
    if (len > 0 && p[0] == '[') {
        const char *close = memchr(p, ']', len);
        if (!close || close == p + 1)
            return -1;
        host_len = (size_t)(close - p) + 1;
        for (size_t i = 1; i + 1 < host_len; i++)
            if (!(etcd_host_char(p[i]) || p[i] == ':'))
                return -1;
    } else {
        const char *colon = memchr(p, ':', len);
        host_len = colon ? (size_t)(colon - p) : len;
        for (size_t i = 0; i < host_len; i++)
            if (!etcd_host_char(p[i]))
                return -1;
    }
    uint32_t port = 0;
    if (host_len == 0 || host_len > ETCD_HOST_LEN_MAX || host_len >= len || p[host_len] != ':' ||
        etcd_parse_u32(p + host_len + 1, len - host_len - 1, 1, 65535, &port) != 0)
        return -1;
    tpi_format(ep->desc, sizeof ep->desc, "%.*s:%u", (int)host_len, p, (unsigned)port);
    tpi_format(ep->base, sizeof ep->base, "http://%s", ep->desc);
    return 0;
}

/* The job's prefix: 1..ETCD_PREFIX_LEN_MAX bytes of [A-Za-z0-9._-/], no
 * '/' first, last or twice in a row. */
static int etcd_prefix_ok(const char *p, size_t len) {
    if (len == 0 || len > ETCD_PREFIX_LEN_MAX || p[0] == '/' || p[len - 1] == '/')
        return 0;
    for (size_t i = 0; i < len; i++) {
        if (!(etcd_host_char(p[i]) || p[i] == '/') || (p[i] == '/' && p[i - 1] == '/'))
            return 0;
    }
    return 1;
}

static tp_status etcd_parse_query(etcd_store *s, const char *q, char *why, size_t why_len) {
    while (*q) {
        const char *amp = strchr(q, '&');
        size_t len = amp ? (size_t)(amp - q) : strlen(q);
        const char *eq = memchr(q, '=', len);
        size_t nlen = eq ? (size_t)(eq - q) : len;
        const char *v = eq ? eq + 1 : q + len;
        size_t vlen = eq ? len - nlen - 1 : 0;
        if (nlen == 3 && memcmp(q, "ttl", 3) == 0) {
            if (etcd_parse_u32(v, vlen, ETCD_TTL_MIN_S, ETCD_TTL_MAX_S, &s->ttl_s) != 0) {
                tpi_format(why, why_len, "ttl '%.*s' is not a whole number of seconds in %d..%d",
                           (int)(vlen < 32 ? vlen : 32), v, ETCD_TTL_MIN_S, ETCD_TTL_MAX_S);
                return TP_EINVAL;
            }
        } else if (nlen == 10 && memcmp(q, "timeout_ms", 10) == 0) {
            if (etcd_parse_u32(v, vlen, ETCD_TIMEOUT_MIN_MS, ETCD_TIMEOUT_MAX_MS, &s->timeout_ms) !=
                0) {
                tpi_format(why, why_len, "timeout_ms '%.*s' is not a whole number in %d..%d",
                           (int)(vlen < 32 ? vlen : 32), v, ETCD_TIMEOUT_MIN_MS,
                           ETCD_TIMEOUT_MAX_MS);
                return TP_EINVAL;
            }
        } else {
            tpi_format(why, why_len, "unknown parameter '%.*s' (known: ttl, timeout_ms)",
                       (int)(nlen < 32 ? nlen : 32), q);
            return TP_EINVAL;
        }
        q += len + (amp ? 1 : 0);
    }
    return TP_OK;
}

static tp_status etcd_parse(etcd_store *s, char *why, size_t why_len) {
    const char *u = s->url;
    if (strncmp(u, "etcd://", 7) != 0) {
        tpi_format(why, why_len, "not an etcd:// URL");
        return TP_EINVAL;
    }
    const char *hosts = u + 7;
    const char *slash = strchr(hosts, '/');
    if (!slash) {
        tpi_format(why, why_len, "no /prefix after the endpoints (etcd://host:port/prefix)");
        return TP_EINVAL;
    }
    for (const char *p = hosts; p < slash;) {
        const char *comma = memchr(p, ',', (size_t)(slash - p));
        const char *stop = comma ? comma : slash;
        if (s->n_ep == ETCD_ENDPOINTS_MAX) {
            tpi_format(why, why_len, "more than %d endpoints", ETCD_ENDPOINTS_MAX);
            return TP_EINVAL;
        }
        if (etcd_parse_endpoint(p, (size_t)(stop - p), &s->ep[s->n_ep]) != 0) {
            tpi_format(why, why_len,
                       "endpoint '%.*s' is not host:port with a port in 1..65535 (an IPv6 host "
                       "in brackets)",
                       (int)((size_t)(stop - p) < 64 ? (size_t)(stop - p) : 64), p);
            return TP_EINVAL;
        }
        s->n_ep++;
        p = comma ? comma + 1 : slash;
        if (comma && p == slash) {
            tpi_format(why, why_len, "an empty endpoint after ','");
            return TP_EINVAL;
        }
    }
    if (s->n_ep == 0) {
        tpi_format(why, why_len, "no endpoint (etcd://host:port/prefix)");
        return TP_EINVAL;
    }
    const char *prefix = slash + 1;
    const char *query = strchr(prefix, '?');
    size_t plen = query ? (size_t)(query - prefix) : strlen(prefix);
    if (!etcd_prefix_ok(prefix, plen)) {
        tpi_format(why, why_len,
                   "the prefix '%.*s' is not 1 to %d characters of letters, digits, '.', '_', "
                   "'-' and '/' (no '/' first, last or twice in a row)",
                   (int)(plen < 64 ? plen : 64), prefix, ETCD_PREFIX_LEN_MAX);
        return TP_EINVAL;
    }
    s->kv_prefix_len =
        tpi_format(s->kv_prefix, sizeof s->kv_prefix, "%.*s%s", (int)plen, prefix, ETCD_KV_INFIX);
    tpi_format(s->lease_key, sizeof s->lease_key, "%.*s%s", (int)plen, prefix, ETCD_LEASE_SUFFIX);
    return query ? etcd_parse_query(s, query + 1, why, why_len) : TP_OK;
}

static pthread_once_t etcd_curl_once = PTHREAD_ONCE_INIT;
static CURLcode etcd_curl_init_rc;

/* libcurl's global state, once per process and never torn down: other
 * code in the process may use curl too (curl_global_init counts). */
static void etcd_curl_init(void) {
    etcd_curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* The handle's connections and its keepalive thread. */
static tp_status etcd_start(etcd_store *s) {
    pthread_once(&etcd_curl_once, etcd_curl_init);
    if (etcd_curl_init_rc != CURLE_OK)
        return etcd_fail(s, TP_ESTORE, "open: libcurl failed to initialise: %s",
                         curl_easy_strerror(etcd_curl_init_rc));
    if (etcd_http_init(&s->http) != 0 || etcd_http_init(&s->ka_http) != 0 ||
        !(s->ka_multi = curl_multi_init()))
        return etcd_fail(s, TP_ENOMEM, "open: out of memory for HTTP handles");
    /* It takes no asynchronous signal, as the TCP backend's threads (TCP-1). */
    int rc = tpi_tcp_thread_create(&s->ka_thread, etcd_keepalive_main, s);
    if (rc != 0)
        return etcd_fail(s, rc == EAGAIN ? TP_ENOMEM : TP_ESTORE,
                         "open: cannot start the lease keepalive thread: %s", strerror(rc));
    s->ka_started = 1;
    return TP_OK;
}

tp_status tp_etcd_store_open(const char *url, tp_store **out, char *errmsg, size_t errmsg_len) {
    TPI_ASSERT(out != NULL);
    *out = NULL;
    size_t url_len = url ? strnlen(url, ETCD_URL_LEN_MAX + 1) : 0;
    tp_status st = TP_OK;
    if (url_len == 0 || url_len > ETCD_URL_LEN_MAX)
        st = tpi_fail(TP_EINVAL, "etcd store: %s URL", url_len ? "too long a" : "empty");
    etcd_store *s = st == TP_OK ? calloc(1, sizeof *s + url_len + 1) : NULL;
    if (st == TP_OK && !s)
        st = tpi_fail(TP_ENOMEM, "etcd store '%.*s': out of memory", ETCD_MSG_URL_MAX, url);
    if (st != TP_OK) {
        if (errmsg && errmsg_len)
            tpi_format(errmsg, errmsg_len, "%s", tp_errmsg());
        return st;
    }
    s->base.ops = &etcd_ops;
    memcpy(s->url, url, url_len + 1);
    s->ttl_s = ETCD_TTL_DEFAULT_S;
    s->timeout_ms = ETCD_TIMEOUT_DEFAULT_MS;
    atomic_init(&s->lease, 0);
    atomic_init(&s->ka_stop, 0);
    pthread_mutex_init(&s->mu, NULL);
    char why[256];
    st = etcd_parse(s, why, sizeof why);
    if (st != TP_OK)
        etcd_fail(s, st, "%s", why);
    else
        st = etcd_start(s);
    if (st != TP_OK) {
        if (errmsg && errmsg_len)
            tpi_format(errmsg, errmsg_len, "%s", s->base.errmsg);
        etcd_close(&s->base);
        return st;
    }
    *out = &s->base;
    return TP_OK;
}
