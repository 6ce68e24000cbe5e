/*
 * test_etcd_store.c: what the etcd store does beyond the store contract
 * (spec/etcd.md ETCD-2..8; the contract itself runs in test_store.c): its
 * URL, its messages when etcd cannot be reached, the deadline on every
 * request, endpoints tried in turn, prefixes, scans over many pages, and
 * the job's lease: kept while any member lives, gone a TTL after the last,
 * replaced when it was lost. The cases that need a server share one
 * private etcd (etcd_fixture.h); without an etcd binary they skip, unless
 * TP_REQUIRE_ETCD=1.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "tensorplay/rpc_backend.h"
#include "tests/unit/etcd_fixture.h"

static tpe_etcd server;
static int server_state; /* 0: not tried; 1: up; 2: no binary; -1: failed */
static int prefixes;

/* The shared server, started on first use; skips the case without etcd. */
static const tpe_etcd *need_etcd(void) {
    if (server_state == 0) {
        int up = tpe_etcd_start(&server);
        server_state = up == 1 ? 1 : up == 0 ? 2 : -1;
    }
    if (server_state == 2 && !tpe_required()) {
        fprintf(stderr, "skipped: %s\n", server.why);
        skip();
    }
    if (server_state != 1)
        fail_msg("etcd: %s%s", server.why, server_state == 2 ? " (TP_REQUIRE_ETCD=1)" : "");
    return &server;
}

/* A URL on the shared server with a prefix no other case uses, then query. */
static void fresh_url(char *url, size_t len, const char *query) {
    const tpe_etcd *e = need_etcd();
    snprintf(url, len, "etcd://%s/tp-etcd-%d-%d%s", e->endpoint, (int)getpid(), ++prefixes, query);
}

static tp_store *open_ok(const char *url) {
    tp_store *s = NULL;
    char err[TP_ERRMSG_LEN_MAX] = "";
    tp_status st = tp_etcd_store_open(url, &s, err, sizeof err);
    if (st != TP_OK)
        fail_msg("open %s: %s", url, err);
    return s;
}

static void put_str(tp_store *s, const char *key, const char *value) {
    assert_int_equal(s->ops->set(s, key, value, strlen(value)), TP_OK);
}

static void check_str(tp_store *s, const char *key, const char *want) {
    void *v = NULL;
    size_t n = 0;
    tp_status st = s->ops->get(s, key, &v, &n);
    if (st != TP_OK)
        fail_msg("get '%s': %s: %s", key, tp_status_name(st), s->errmsg);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(v, want, n);
    free(v);
}

static tp_status get_status(tp_store *s, const char *key) {
    void *v = NULL;
    size_t n = 0;
    tp_status st = s->ops->get(s, key, &v, &n);
    free(v);
    return st;
}

static void assert_has(const char *msg, const char *want) {
    if (!strstr(msg, want))
        fail_msg("'%s' is not in the message: %s", want, msg);
}

/* ------------------------------------------------------------------------ */
/* ETCD-2: the URL. Open does no I/O, so these need no server. */

static void test_etcd_store_url_refused(void **state) {
    (void)state;
    static const struct {
        const char *url, *why;
    } bad[] = {
        {"", "empty URL"},
        {"http://127.0.0.1:2379/job", "not an etcd:// URL"},
        {"etcd://", "no /prefix"},
        {"etcd://127.0.0.1:2379", "no /prefix"},
        {"etcd:///job", "no endpoint"},
        {"etcd://127.0.0.1/job", "is not host:port"},
        {"etcd://127.0.0.1:0/job", "is not host:port"},
        {"etcd://127.0.0.1:65536/job", "is not host:port"},
        {"etcd://127.0.0.1:23x9/job", "is not host:port"},
        {"etcd://::1:2379/job", "is not host:port"},
        {"etcd://a b:2379/job", "is not host:port"},
        {"etcd://127.0.0.1:2379,/job", "an empty endpoint"},
        {"etcd://127.0.0.1:2379/", "the prefix ''"},
        {"etcd://127.0.0.1:2379//job", "the prefix '/job'"},
        {"etcd://127.0.0.1:2379/job/", "the prefix 'job/'"},
        {"etcd://127.0.0.1:2379/a//b", "the prefix 'a//b'"},
        {"etcd://127.0.0.1:2379/a b", "the prefix 'a b'"},
        {"etcd://127.0.0.1:2379/job?ttl=1", "ttl '1'"},
        {"etcd://127.0.0.1:2379/job?ttl=60s", "ttl '60s'"},
        {"etcd://127.0.0.1:2379/job?timeout_ms=5", "timeout_ms '5'"},
        {"etcd://127.0.0.1:2379/job?ttl", "ttl ''"},
        {"etcd://127.0.0.1:2379/job?user=root", "unknown parameter 'user'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[TP_ERRMSG_LEN_MAX] = "";
        tp_store *s = (tp_store *)1;
        tp_status st = tp_etcd_store_open(bad[i].url, &s, err, sizeof err);
        if (st != TP_EINVAL || s != NULL || !strstr(err, bad[i].why))
            fail_msg("'%s': %s, '%s' (wanted TP_EINVAL, '%s')", bad[i].url, tp_status_name(st), err,
                     bad[i].why);
        assert_string_equal(tp_errmsg(), err);
    }
    /* Seventeen endpoints are one too many. */
    char many[512] = "etcd://";
    for (int i = 0; i < 17; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%sh%d:1", i ? "," : "", i);
    strcat(many, "/job");
    tp_store *s = NULL;
    char err[TP_ERRMSG_LEN_MAX] = "";
    assert_int_equal(tp_etcd_store_open(many, &s, err, sizeof err), TP_EINVAL);
    assert_has(err, "more than 16 endpoints");
    /* errmsg may be omitted. */
    assert_int_equal(tp_etcd_store_open("etcd://x", &s, NULL, 0), TP_EINVAL);
}

static void test_etcd_store_url_accepted(void **state) {
    (void)state;
    static const char *const good[] = {
        "etcd://127.0.0.1:2379/job",
        "etcd://[::1]:2379/job",
        "etcd://etcd-0.etcd.svc:2379,etcd-1.etcd.svc:2379,10.0.0.3:2379/jobs/42/try_1",
        "etcd://127.0.0.1:2379/job?ttl=2",
        "etcd://127.0.0.1:2379/job?ttl=86400&timeout_ms=120000",
        "etcd://127.0.0.1:2379/j?timeout_ms=100&ttl=30",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        tp_store *s = NULL;
        char err[TP_ERRMSG_LEN_MAX] = "";
        if (tp_etcd_store_open(good[i], &s, err, sizeof err) != TP_OK)
            fail_msg("'%s': %s", good[i], err);
        assert_int_equal(s->ops->api_version, TP_BACKEND_API_VERSION);
        assert_non_null(s->ops->scan);
        s->ops->close(s); /* joins its keepalive thread at once */
    }
}

/* ------------------------------------------------------------------------ */
/* ETCD-7, ETCD-8: no etcd there. */

/* A port with a listener that never accepts: connections complete in the
 * kernel's backlog and requests go unanswered. */
static int silent_listener(unsigned *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 16), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    *port = ntohs(sa.sin_port);
    return fd;
}

static int never_called(void *arg, const char *key, const void *value, size_t len) {
    (void)arg, (void)value, (void)len;
    fail_msg("scan called fn for '%s' with no etcd there", key);
    return 1;
}

/* spec: ETCD-8. Every endpoint's failure is named, with the operation, the
 * key and the etcd call, and every operation fails alike. */
static void test_etcd_store_unreachable_is_estore(void **state) {
    (void)state;
    unsigned a = tpe_free_port(), b = tpe_free_port();
    char url[128];
    snprintf(url, sizeof url, "etcd://127.0.0.1:%u,127.0.0.1:%u/job", a, b);
    tp_store *s = open_ok(url);
    char ea[32], eb[32];
    snprintf(ea, sizeof ea, "127.0.0.1:%u", a);
    snprintf(eb, sizeof eb, "127.0.0.1:%u", b);
    uint64_t t0 = tpe_now_ns();
    assert_int_equal(get_status(s, "g0/init/rank/3"), TP_ESTORE);
    fprintf(stderr, "  %s\n", s->errmsg);
    assert_has(s->errmsg, url);
    assert_has(s->errmsg, "get 'g0/init/rank/3': range at ");
    assert_has(s->errmsg, ea);
    assert_has(s->errmsg, eb);
    assert_has(s->errmsg, "Connection refused");
    assert_string_equal(tp_errmsg(), s->errmsg);
    /* A write names the call that failed: here the lease's lookup. */
    assert_int_equal(s->ops->set(s, "k", "v", 1), TP_ESTORE);
    assert_has(s->errmsg, "set 'k': range (lease) at ");
    int64_t r = 0;
    int swapped = 0;
    assert_int_equal(s->ops->add(s, "n", 1, &r), TP_ESTORE);
    assert_int_equal(s->ops->compare_set(s, "c", NULL, 0, "x", 1, &swapped), TP_ESTORE);
    assert_int_equal(swapped, 0);
    assert_int_equal(s->ops->del(s, "k"), TP_ESTORE);
    assert_has(s->errmsg, "del 'k': deleterange at ");
    assert_int_equal(s->ops->scan(s, "g0/", never_called, NULL), TP_ESTORE);
    assert_has(s->errmsg, "scan 'g0/': range at ");
    /* A refused connection is passed over at once: no waiting. */
    assert_true(tpe_now_ns() - t0 < 2000000000ull);
    s->ops->close(s);
}

/* spec: ETCD-7. A request that gets no answer fails at its deadline, and a
 * read goes on to the next endpoint, which answers. */
static void test_etcd_store_deadline(void **state) {
    (void)state;
    unsigned port = 0;
    int fd = silent_listener(&port);
    char url[128];
    snprintf(url, sizeof url, "etcd://127.0.0.1:%u/job?timeout_ms=300", port);
    tp_store *s = open_ok(url);
    uint64_t t0 = tpe_now_ns();
    assert_int_equal(get_status(s, "k"), TP_ESTORE);
    uint64_t took = tpe_now_ns() - t0;
    fprintf(stderr, "  after %.0f ms: %s\n", took / 1e6, s->errmsg);
    assert_has(s->errmsg, "no answer within 300 ms");
    assert_true(took >= 250000000ull && took < 2000000000ull);
    s->ops->close(s);
    close(fd);
}

/* ------------------------------------------------------------------------ */
/* A fake etcd that answers every request with one canned reply: what the
 * store makes of replies that are not etcd's (ETCD-8: TP_ESTORE, never a
 * crash or an assertion). */

typedef struct fake {
    int fd;
    const char *body; /* the reply's body, with HTTP status 200 */
    pthread_t th;
} fake;

static void *fake_main(void *arg) {
    fake *f = arg;
    for (;;) {
        int c = accept(f->fd, NULL, NULL);
        if (c < 0)
            return NULL;
        char buf[65536];
        size_t n = 0;
        /* The headers, then Content-Length bytes of body. */
        for (;;) {
            ssize_t r = read(c, buf + n, sizeof buf - 1 - n);
            if (r <= 0)
                break;
            n += (size_t)r;
            buf[n] = '\0';
            char *end = strstr(buf, "\r\n\r\n");
            char *cl = strstr(buf, "Content-Length: ");
            if (end && (!cl || (size_t)(end + 4 - buf) + strtoul(cl + 16, NULL, 10) <= n))
                break;
        }
        char reply[1024];
        int len = snprintf(reply, sizeof reply,
                           "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                           "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                           strlen(f->body), f->body);
        if (write(c, reply, (size_t)len) != len) {
            /* the client gave up: nothing to do */
        }
        close(c);
    }
}

static void test_etcd_store_malformed_replies(void **state) {
    (void)state;
    static const char *const bodies[] = {
        "not json at all",
        "[1, 2]",
        "{\"kvs\": 7}",
        "{\"kvs\": [{\"key\": \"!!!!\", \"mod_revision\": \"1\"}]}",
        /* another key than the one asked for ("b2s=" is "ok") */
        "{\"kvs\": [{\"key\": \"b2s=\", \"mod_revision\": \"1\", \"value\": \"eA==\"}]}",
        "{\"kvs\": [{\"key\": \"b2s=\", \"mod_revision\": \"x\"}]}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        unsigned port = 0;
        fake f = {.fd = silent_listener(&port), .body = bodies[i]};
        assert_int_equal(pthread_create(&f.th, NULL, fake_main, &f), 0);
        char url[128];
        snprintf(url, sizeof url, "etcd://127.0.0.1:%u/job?timeout_ms=2000", port);
        tp_store *s = open_ok(url);
        void *v = NULL;
        size_t n = 0;
        tp_status st = s->ops->get(s, "k", &v, &n);
        fprintf(stderr, "  %s -> %s: %s\n", bodies[i], tp_status_name(st), s->errmsg);
        assert_int_equal(st, TP_ESTORE);
        assert_null(v);
        assert_true(strstr(s->errmsg, "malformed") || strstr(s->errmsg, "not a JSON object"));
        s->ops->close(s);
        shutdown(f.fd, SHUT_RDWR); /* accept fails: the thread ends */
        pthread_join(f.th, NULL);
        close(f.fd);
    }
}

/* ------------------------------------------------------------------------ */
/* With a server. */

/* spec: ETCD-7. A dead first endpoint is passed over, and later requests
 * start with the one that answered. */
static void test_etcd_store_endpoints_in_turn(void **state) {
    (void)state;
    const tpe_etcd *e = need_etcd();
    char url[160];
    snprintf(url, sizeof url, "etcd://127.0.0.1:%u,%s/tp-etcd-%d-turn", tpe_free_port(),
             e->endpoint, (int)getpid());
    tp_store *s = open_ok(url);
    put_str(s, "k", "v");
    check_str(s, "k", "v");
    int64_t r = 0;
    assert_int_equal(s->ops->add(s, "n", 2, &r), TP_OK);
    assert_int_equal(r, 2);
    assert_int_equal(s->ops->del(s, "k"), TP_OK);
    assert_int_equal(get_status(s, "k"), TP_ENOENT);
    s->ops->close(s);
}

/* spec: ETCD-3. Prefixes keep jobs apart, for every operation. */
static void test_etcd_store_prefixes_isolate(void **state) {
    (void)state;
    char ua[160], ub[160];
    fresh_url(ua, sizeof ua, "");
    fresh_url(ub, sizeof ub, "");
    tp_store *a = open_ok(ua), *b = open_ok(ub);
    put_str(a, "g0/init/rank/0", "a's");
    assert_int_equal(get_status(b, "g0/init/rank/0"), TP_ENOENT);
    int swapped = 0;
    assert_int_equal(b->ops->compare_set(b, "g0/init/rank/0", NULL, 0, "b's", 3, &swapped), TP_OK);
    assert_int_equal(swapped, 1);
    check_str(a, "g0/init/rank/0", "a's");
    check_str(b, "g0/init/rank/0", "b's");
    a->ops->close(a);
    b->ops->close(b);
}

typedef struct scan_count {
    int n, stop_after;
    char last[64];
    int out_of_order;
} scan_count;

static int count_key(void *arg, const char *key, const void *value, size_t len) {
    scan_count *c = arg;
    if (c->n && strcmp(key, c->last) <= 0)
        c->out_of_order = 1;
    snprintf(c->last, sizeof c->last, "%s", key);
    if (strlen(key) != strlen("g0/k/000") + 0 || len != 3 || memcmp(value, key + 5, 3) != 0)
        c->out_of_order = 1; /* the value each key was given */
    c->n++;
    return c->stop_after && c->n == c->stop_after;
}

/* spec: ETCD-4. A scan over more keys than a page holds sees each once, in
 * order, and fn still stops it. */
static void test_etcd_store_scan_pages(void **state) {
    (void)state;
    char url[160];
    fresh_url(url, sizeof url, "");
    tp_store *s = open_ok(url);
    enum { KEYS = 150 }; /* more than two pages of 64 */
    for (int i = 0; i < KEYS; i++) {
        char key[32], val[8];
        snprintf(key, sizeof key, "g0/k/%03d", i);
        snprintf(val, sizeof val, "%03d", i);
        put_str(s, key, val);
    }
    put_str(s, "g0/l", "after the prefix");
    put_str(s, "g0/j", "before it");
    scan_count all = {0};
    assert_int_equal(s->ops->scan(s, "g0/k/", count_key, &all), TP_OK);
    assert_int_equal(all.n, KEYS);
    assert_int_equal(all.out_of_order, 0);
    assert_string_equal(all.last, "g0/k/149");
    scan_count some = {.stop_after = 70}; /* into the second page */
    assert_int_equal(s->ops->scan(s, "g0/k/", count_key, &some), TP_OK);
    assert_int_equal(some.n, 70);
    assert_string_equal(some.last, "g0/k/069");
    s->ops->close(s);
}

/* Polls key through a handle that never writes (so it keeps no lease
 * alive) until it is absent; the seconds it took, or -1 at timeout_s. */
static double wait_absent(const char *url, const char *key, double timeout_s) {
    tp_store *r = open_ok(url);
    uint64_t t0 = tpe_now_ns();
    double took = -1;
    while (tpe_now_ns() - t0 < (uint64_t)(timeout_s * 1e9)) {
        if (get_status(r, key) == TP_ENOENT) {
            took = (tpe_now_ns() - t0) / 1e9;
            break;
        }
        tpe_sleep_ms(100);
    }
    r->ops->close(r);
    return took;
}

/* spec: ETCD-6. The job's keys live while any member that wrote lives,
 * though the one that wrote them is gone for longer than the TTL (rank 0
 * killed, say), and go within about a TTL once the last member is gone. */
static void test_etcd_store_lease_kept_by_any_member(void **state) {
    (void)state;
    char url[160];
    fresh_url(url, sizeof url, "?ttl=2");
    tp_store *first = open_ok(url), *other = open_ok(url);
    put_str(first, "g0/init/rank/0", "w0");
    put_str(other, "g0/init/rank/1", "w1"); /* a member from its first write */
    first->ops->close(first);
    tpe_sleep_ms(3500); /* past the TTL with only the other member */
    check_str(other, "g0/init/rank/0", "w0");
    check_str(other, "g0/init/rank/1", "w1");
    other->ops->close(other);
    double took = wait_absent(url, "g0/init/rank/0", 10);
    fprintf(stderr, "  the keys were gone %.1f s after the last member closed\n", took);
    assert_true(took >= 0 && took < 6);
    assert_int_equal(wait_absent(url, "g0/init/rank/1", 1) >= 0, 1);
}

/* The lease id a job's members write with, read from "<prefix>/lease"
 * straight from etcd's gateway; 0 when there is none. */
static int64_t job_lease(const char *endpoint, const char *prefix) {
    char key[256];
    unsigned char enc[400];
    int klen = snprintf(key, sizeof key, "%s/lease", prefix);
    EVP_EncodeBlock(enc, (const unsigned char *)key, klen);
    char body[512], url[128], *reply = NULL;
    size_t reply_len = 0;
    snprintf(body, sizeof body, "{\"key\":\"%s\"}", (const char *)enc);
    snprintf(url, sizeof url, "http://%s/v3/kv/range", endpoint);
    FILE *mem = open_memstream(&reply, &reply_len);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, mem);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    fclose(mem);
    assert_int_equal(rc, CURLE_OK);
    json_t *j = json_loads(reply, 0, NULL);
    free(reply);
    json_t *kv = json_array_get(json_object_get(j, "kvs"), 0);
    const char *lease = json_string_value(json_object_get(kv, "lease"));
    int64_t id = lease ? strtoll(lease, NULL, 10) : 0;
    json_decref(j);
    return id;
}

static void revoke_lease(const char *endpoint, int64_t id) {
    char body[64], url[128];
    snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", (long long)id);
    snprintf(url, sizeof url, "http://%s/v3/lease/revoke", endpoint);
    CURL *c = curl_easy_init();
    FILE *devnull = fopen("/dev/null", "w");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, devnull);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    assert_int_equal(curl_easy_perform(c), CURLE_OK);
    curl_easy_cleanup(c);
    fclose(devnull);
}

/* spec: ETCD-6. One lease per job, found by every member; when it is lost
 * (revoked here, as if every member had been away for its TTL) its keys go
 * with it, and the next write makes a new one instead of failing on. */
static void test_etcd_store_lease_lost_and_replaced(void **state) {
    (void)state;
    const tpe_etcd *e = need_etcd();
    char url[160], prefix[64];
    snprintf(prefix, sizeof prefix, "tp-etcd-%d-lost", (int)getpid());
    snprintf(url, sizeof url, "etcd://%s/%s?ttl=30", e->endpoint, prefix);
    tp_store *a = open_ok(url), *b = open_ok(url);
    assert_int_equal(job_lease(e->endpoint, prefix), 0); /* none before the first write */
    put_str(a, "k", "1");
    int64_t l1 = job_lease(e->endpoint, prefix);
    assert_true(l1 > 0);
    int swapped = 0;
    assert_int_equal(b->ops->compare_set(b, "c", NULL, 0, "x", 1, &swapped), TP_OK);
    assert_int_equal(swapped, 1);
    assert_int_equal(job_lease(e->endpoint, prefix), l1); /* b took a's */
    revoke_lease(e->endpoint, l1);
    assert_int_equal(get_status(a, "k"), TP_ENOENT);
    assert_int_equal(get_status(a, "c"), TP_ENOENT);
    put_str(a, "k", "2"); /* finds its lease gone, gets a new one */
    int64_t l2 = job_lease(e->endpoint, prefix);
    assert_true(l2 > 0 && l2 != l1);
    int64_t r = 0;
    assert_int_equal(b->ops->add(b, "n", 5, &r), TP_OK); /* b too, and adopts l2 */
    assert_int_equal(r, 5);
    assert_int_equal(job_lease(e->endpoint, prefix), l2);
    check_str(b, "k", "2");
    a->ops->close(a);
    b->ops->close(b);
}

/* spec: ETCD-6. Close stops the keepalive thread at once, even while a
 * keepalive waits on an endpoint that never answers. */
static void test_etcd_store_close_is_prompt(void **state) {
    (void)state;
    const tpe_etcd *e = need_etcd();
    unsigned port = 0;
    int fd = silent_listener(&port);
    char url[200];
    /* The keepalive thread starts with the silent endpoint (its first). */
    snprintf(url, sizeof url, "etcd://127.0.0.1:%u,%s/tp-etcd-%d-close?ttl=3&timeout_ms=400", port,
             e->endpoint, (int)getpid());
    tp_store *s = open_ok(url);
    put_str(s, "k", "v"); /* the read of the lease key passes the silent one over */
    tpe_sleep_ms(50);     /* the thread is in its keepalive now, for up to 400 ms */
    uint64_t t0 = tpe_now_ns();
    s->ops->close(s);
    uint64_t took = tpe_now_ns() - t0;
    fprintf(stderr, "  close took %.1f ms\n", took / 1e6);
    assert_true(took < 150000000ull);
    close(fd);
}

static int teardown_group(void **state) {
    (void)state;
    tpe_etcd_stop(&server);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_etcd_store_url_refused),
        cmocka_unit_test(test_etcd_store_url_accepted),
        cmocka_unit_test(test_etcd_store_unreachable_is_estore),
        cmocka_unit_test(test_etcd_store_deadline),
        cmocka_unit_test(test_etcd_store_malformed_replies),
        cmocka_unit_test(test_etcd_store_endpoints_in_turn),
        cmocka_unit_test(test_etcd_store_prefixes_isolate),
        cmocka_unit_test(test_etcd_store_scan_pages),
        cmocka_unit_test(test_etcd_store_lease_kept_by_any_member),
        cmocka_unit_test(test_etcd_store_lease_lost_and_replaced),
        cmocka_unit_test(test_etcd_store_close_is_prompt),
    };
    return cmocka_run_group_tests_name("etcd_store", tests, NULL, teardown_group);
}
