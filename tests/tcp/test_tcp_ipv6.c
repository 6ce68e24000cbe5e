/*
 * test_tcp_ipv6.c: the "TENSORPIPE" backend over IPv6 loopback (spec/tcp.md
 * TCP-2, TCP-9, TCP-12): tcp://[::1]:port and env:// with MASTER_ADDR=::1,
 * listen_addr "::1", the bracketed "[::1]:port" address each worker
 * publishes, and a bounded, named error when nothing serves the store at an
 * IPv6 address. Every test forks a job (tcp_harness.c); each rank checks its
 * own side with TT_CHECK and exits with its status, and the parent asserts
 * the exit codes (a sanitizer build checks each child for leaks at exit).
 * Exits with 77 (ctest SKIP_RETURN_CODE) when ::1 cannot be bound.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "real/free_port.h"
#include "real/tcp_internal.h"
#include "tensorplay/rpc_backend.h"
#include "tcp_harness.h"

#define SKIP_CODE 77

/* A listening-capable socket bound to [::1]:0; -1 when ::1 is unusable. */
static int v6_bind_loopback(uint16_t *port) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in6 sa;
    memset(&sa, 0, sizeof sa);
    sa.sin6_family = AF_INET6;
    sa.sin6_addr = in6addr_loopback;
    socklen_t len = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(sa.sin6_port);
    return fd;
}

/* A TCP port on ::1 nobody listens on right now (below the ephemeral
 * range, as tt_free_port's). */
static uint16_t v6_free_port(void) {
    char err[256];
    unsigned p = 0;
    if (tpi_free_port("::1", &p, err, sizeof err) != 0)
        fail_msg("v6_free_port: %s", err);
    return (uint16_t)p;
}

/* What the parent hands a job's ranks (through job->arg, set before fork). */
typedef struct v6_cfg {
    char init_method[64]; /* "" for env:// */
    uint16_t master_port; /* env:// only */
    uint16_t store_port;  /* the store's port on ::1, both methods */
    int bracketed;        /* MASTER_ADDR, listen_addr, advertise_addr as "[::1]" */
} v6_cfg;

static tp_status call_add(tp_dest d, int64_t a, int64_t b, int64_t *out) {
    return tt_call_add(d, a, b, TP_TIMEOUT_DEFAULT, out);
}

static void assert_all_ok(tt_job *job, double timeout_s) {
    assert_int_equal(tt_wait(job, timeout_s), 0);
}

/* Options for an IPv6 worker: tt_options' timeouts, listen_addr "::1", and
 * the job's init_method (env:// when the config has none). */
static tp_options *v6_options(tt_job *job, const v6_cfg *cfg) {
    tp_options *o = tt_options(job, 10, 10);
    if (!o)
        return NULL;
    tp_options_set_init_timeout(o, 15);
    if (cfg->init_method[0]) {
        tp_options_set_init_method(o, cfg->init_method);
    } else {
        char p[16];
        snprintf(p, sizeof p, "%u", (unsigned)cfg->master_port);
        /* A bare literal, as PyTorch users write it, or bracketed as in a URL. */
        setenv("MASTER_ADDR", cfg->bracketed ? "[::1]" : "::1", 1);
        setenv("MASTER_PORT", p, 1);
        tp_options_set_init_method(o, "env://");
    }
    const char *host = cfg->bracketed ? "[::1]" : "::1";
    if (tp_options_set(o, "listen_addr", host) != TP_OK ||
        (cfg->bracketed && tp_options_set(o, "advertise_addr", host) != TP_OK)) {
        tp_options_free(o);
        return NULL;
    }
    return o;
}

/* spec: TCP-2: what worker r published in the store is "[::1]:<port>",
 * read (as test_tcp.c does) by a separate, non-worker client of the store. */
static int check_published(const tt_job *job, const v6_cfg *cfg) {
    tp_store *store = NULL;
    char err[TP_ERRMSG_LEN_MAX];
    tpi_tcp_auth auth;
    tp_status st = tpi_tcp_auth_setup(NULL, &auth, err, sizeof err); /* the job's TP_SECRET */
    if (st == TP_OK)
        st = tpi_tcp_store_connect("::1", cfg->store_port, UINT32_MAX, &auth,
                                   tpi_tcp_now_ns() + 5000000000ull, "test", NULL, 0, NULL, &store,
                                   err, sizeof err);
    if (st != TP_OK) {
        fprintf(stderr, "store client on [::1]:%u: %s\n", (unsigned)cfg->store_port, err);
        return 1;
    }
    int bad = 0;
    for (int r = 0; r < job->world && !bad; r++) {
        char key[64], want_name[32];
        snprintf(key, sizeof key, "g0/init/rank/%d", r);
        snprintf(want_name, sizeof want_name, "worker%d", r);
        void *v = NULL;
        size_t len = 0;
        if (store->ops->get(store, key, &v, &len) != TP_OK) {
            fprintf(stderr, "get %s: %s\n", key, store->errmsg);
            bad = 1;
            break;
        }
        const char *s = v;
        /* "<name>\t<credit>\t<address>" (INIT-4, FLOW-6) */
        const char *tab = strchr(s, '\t'), *last = strrchr(s, '\t');
        unsigned port = 0;
        char tail = 0;
        if (!tab || last == tab || (size_t)(tab - s) != strlen(want_name) ||
            strncmp(s, want_name, strlen(want_name)) != 0 ||
            sscanf(last + 1, "[::1]:%u%c", &port, &tail) != 1 || port == 0 || port > 65535) {
            fprintf(stderr, "%s published '%s'; expected '%s\\t<credit>\\t[::1]:<port>'\n",
                    want_name, s, want_name);
            bad = 1;
        }
        /* The literal round-trips through the address parser peers use. */
        char host[64], port_s[16];
        if (!bad &&
            (tpi_tcp_split_hostport(last + 1, host, sizeof host, port_s, sizeof port_s) != 0 ||
             strcmp(host, "::1") != 0)) {
            fprintf(stderr, "%s's address '%s' does not split into ::1 and a port\n", want_name,
                    last + 1);
            bad = 1;
        }
        free(v);
    }
    store->ops->close(store);
    return bad;
}

/* spec: TCP-1, TCP-2, TCP-9, TCP-12 over ::1 */
static int body_v6(tt_job *job, int rank) {
    const v6_cfg *cfg = job->arg;
    tp_options *o = v6_options(job, cfg);
    TT_CHECK(o && tt_init(job, rank, o) == 0);
    tp_options_free(o);
    int peer = 1 - rank;
    /* A registered function, both ways (each rank calls the other). */
    int64_t v = 0;
    TT_CHECK(call_add(tp_to_rank(peer), 40 + rank, 2, &v) == TP_OK && v == 42 + rank);
    TT_CHECK(call_add(tp_to_name(peer ? "worker1" : "worker0"), rank, 100, &v) == TP_OK &&
             v == rank + 100);
    /* A tensor argument round-trips (float32, several segments). */
    int64_t shape[2] = {64, 129};
    tp_value *t = tp_value_tensor(TP_DTYPE_FLOAT32, 2, shape, NULL, NULL);
    TT_CHECK(t);
    float *td = tp_tensor_data(t);
    for (int k = 0; k < 64 * 129; k++)
        td[k] = (float)k * 0.5f + (float)rank;
    tp_value *targs = tp_value_list_of(1, t);
    tp_value *tres = NULL;
    TT_CHECK(tp_rpc_sync(tp_to_rank(peer), "echo", targs, NULL, TP_TIMEOUT_DEFAULT, &tres) ==
             TP_OK);
    TT_CHECK(tp_value_equal(tres, tp_list_get(targs, 0)));
    tp_value_free(targs);
    tp_value_free(tres);
    /* The public worker info carries names and ids (no addresses). */
    tp_worker_info wi;
    TT_CHECK(tp_get_worker_info(peer ? "worker1" : "worker0", &wi) == TP_OK &&
             wi.id == (uint32_t)peer);
    /* What each worker published, read through the store on ::1 (rank 1 only,
     * before the shutdown barrier, so rank 0's store is certainly up). */
    if (rank == 1)
        TT_CHECK(check_published(job, cfg) == 0);
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void run_v6_job(v6_cfg *cfg) {
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 2, body_v6, cfg), 0);
    assert_all_ok(&job, 60);
    tt_job_free(&job);
}

static void test_ipv6_tcp_init_method(void **state) {
    (void)state;
    v6_cfg cfg = {0};
    cfg.store_port = v6_free_port();
    snprintf(cfg.init_method, sizeof cfg.init_method, "tcp://[::1]:%u", (unsigned)cfg.store_port);
    run_v6_job(&cfg);
}

/* spec: TCP-9: env:// with MASTER_ADDR a bare IPv6 literal */
static void test_ipv6_env_init_method(void **state) {
    (void)state;
    v6_cfg cfg = {0};
    cfg.store_port = cfg.master_port = v6_free_port();
    run_v6_job(&cfg);
}

/* spec: TCP-9 TCP-12: "[::1]" names the same host as "::1" in MASTER_ADDR,
 * listen_addr and advertise_addr; what is published is bracketed once. */
static void test_ipv6_bracketed_hosts(void **state) {
    (void)state;
    v6_cfg cfg = {0};
    cfg.store_port = cfg.master_port = v6_free_port();
    cfg.bracketed = 1;
    run_v6_job(&cfg);
}

/* ---- Resolving ------------------------------------------------------------------------ */

/* tpi_tcp_resolve fills the address's own bytes and zeroes the rest of the
 * sockaddr_storage, whatever it held before (tcp_internal.h). */
static void test_resolve_zeroes_past_the_address(void **state) {
    (void)state;
    static const struct {
        const char *host;
        int family;
        socklen_t len;
    } cases[] = {{"127.0.0.1", AF_INET, sizeof(struct sockaddr_in)},
                 {"::1", AF_INET6, sizeof(struct sockaddr_in6)}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct sockaddr_storage sa;
        memset(&sa, 0xaa, sizeof sa);
        socklen_t len = 0;
        char err[TP_ERRMSG_LEN_MAX];
        assert_int_equal(tpi_tcp_resolve(cases[i].host, 4242, &sa, &len, err, sizeof err), TP_OK);
        assert_int_equal(sa.ss_family, cases[i].family);
        assert_int_equal(len, cases[i].len);
        const unsigned char *b = (const unsigned char *)&sa;
        for (size_t k = len; k < sizeof sa; k++)
            if (b[k] != 0)
                fail_msg("%s: byte %zu past the address is 0x%02x", cases[i].host, k, b[k]);
    }
}

/* ---- Init errors at IPv6 addresses --------------------------------------------------- */

static int holder_fd = -1;
static uint16_t holder_port;

static int expect_init_error(tp_options *o, int rank, int world, tp_status want, const char *needle,
                             double max_s) {
    uint64_t t0 = tt_now_ns();
    tp_status st = tp_init_rpc(rank ? "worker1" : "worker0", "TENSORPIPE", rank, world, o);
    double took = (double)(tt_now_ns() - t0) / 1e9;
    tp_options_free(o);
    if (st != want || !strstr(tp_errmsg(), needle) || took > max_s) {
        fprintf(stderr, "init gave %s '%s' in %.2f s; expected %s containing '%s' within %.1f s\n",
                tp_status_name(st), tp_errmsg(), took, tp_status_name(want), needle, max_s);
        if (st == TP_OK)
            tp_shutdown(0);
        return 1;
    }
    fprintf(stderr, "  %s in %.2f s: %s\n", tp_status_name(st), took, tp_errmsg());
    return 0;
}

static tp_options *v6_error_options(const char *method) {
    tp_options *o = NULL;
    if (tp_construct_rpc_backend_options("TENSORPIPE", &o) != TP_OK)
        return NULL;
    tp_options_set_init_method(o, method);
    tp_options_set(o, "listen_addr", "::1");
    tp_options_set_shutdown_timeout(o, 2);
    return o;
}

static int body_v6_errors(tt_job *job, int rank) {
    (void)rank;
    const v6_cfg *cfg = job->arg;
    char m[128], want[64];
    int bad = 0;
    /* spec: TCP-9: nobody serves the store at [::1]:port: a rank other than 0
     * retries until its short init deadline, then names the address. */
    tp_options *o = v6_error_options(cfg->init_method);
    TT_CHECK(o);
    tp_options_set_init_timeout(o, 0.3);
    snprintf(want, sizeof want, "[::1]:%u", (unsigned)cfg->store_port);
    bad |= expect_init_error(o, 1, 2, TP_ETIMEDOUT, want, 5);
    /* spec: TCP-9: rank 0 cannot bind the store's port on ::1. */
    snprintf(m, sizeof m, "tcp://[::1]:%u", (unsigned)holder_port);
    o = v6_error_options(m);
    TT_CHECK(o);
    tp_options_set_init_timeout(o, 2);
    snprintf(want, sizeof want, "[::1]:%u", (unsigned)holder_port);
    bad |= expect_init_error(o, 0, 2, TP_EADDRINUSE, want, 5);
    /* spec: TCP-12: the worker's own port on ::1 is taken. */
    snprintf(m, sizeof m, "tcp://[::1]:%u", (unsigned)v6_free_port());
    o = v6_error_options(m);
    TT_CHECK(o);
    tp_options_set_init_timeout(o, 5);
    snprintf(m, sizeof m, "%u", (unsigned)holder_port);
    tp_options_set(o, "listen_port", m);
    snprintf(want, sizeof want, "cannot listen on [::1]:%u", (unsigned)holder_port);
    bad |= expect_init_error(o, 0, 1, TP_EADDRINUSE, want, 10);
    /* spec: TCP-2: a host has no bracket, so "[[::1]" is not one (caught by
     * fuzz_options' address property: it split to the host "[::1", which
     * formats as an address that does not split, and failed later, resolving). */
    snprintf(m, sizeof m, "tcp://[[::1]:%u", (unsigned)v6_free_port());
    o = v6_error_options(m);
    TT_CHECK(o);
    bad |= expect_init_error(o, 0, 1, TP_EINVAL, "is not tcp://host:port", 5);
    return bad;
}

static void test_ipv6_init_errors(void **state) {
    (void)state;
    holder_fd = v6_bind_loopback(&holder_port);
    assert_true(holder_fd >= 0);
    assert_int_equal(listen(holder_fd, 4), 0);
    v6_cfg cfg = {0};
    cfg.store_port = v6_free_port();
    snprintf(cfg.init_method, sizeof cfg.init_method, "tcp://[::1]:%u", (unsigned)cfg.store_port);
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 1, body_v6_errors, &cfg), 0);
    assert_all_ok(&job, 60);
    tt_job_free(&job);
    close(holder_fd);
}

/* spec: TCP-2: an accepted connection is named by its peer's address as
 * "[v6]:port" (IPv4 "a.b.c.d:port"), the form every message about it uses
 * ("connection from [::1]:40000 closed ..."), and that splits back. */
static void test_ipv6_peer_address_named(void **state) {
    (void)state;
    struct sockaddr_in6 v6 = {.sin6_family = AF_INET6, .sin6_port = htons(40000)};
    assert_int_equal(inet_pton(AF_INET6, "fe80::1:2", &v6.sin6_addr), 1);
    char buf[64], host[48], port[8];
    tpi_tcp_format_sockaddr((const struct sockaddr *)&v6, buf, sizeof buf);
    assert_string_equal(buf, "[fe80::1:2]:40000");
    assert_int_equal(tpi_tcp_split_hostport(buf, host, sizeof host, port, sizeof port), 0);
    assert_string_equal(host, "fe80::1:2");
    assert_string_equal(port, "40000");
    v6.sin6_addr = in6addr_loopback;
    v6.sin6_port = htons(1);
    tpi_tcp_format_sockaddr((const struct sockaddr *)&v6, buf, sizeof buf);
    assert_string_equal(buf, "[::1]:1");
    struct sockaddr_in v4 = {.sin_family = AF_INET, .sin_port = htons(65535)};
    assert_int_equal(inet_pton(AF_INET, "10.1.2.3", &v4.sin_addr), 1);
    tpi_tcp_format_sockaddr((const struct sockaddr *)&v4, buf, sizeof buf);
    assert_string_equal(buf, "10.1.2.3:65535");
}

int main(void) {
    uint16_t p = 0;
    int fd = v6_bind_loopback(&p);
    if (fd < 0 || listen(fd, 1) < 0) {
        fprintf(stderr, "SKIP: cannot listen on [::1] (%s)\n", strerror(errno));
        if (fd >= 0)
            close(fd);
        return SKIP_CODE;
    }
    close(fd);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ipv6_tcp_init_method),
        cmocka_unit_test(test_ipv6_env_init_method),
        cmocka_unit_test(test_ipv6_bracketed_hosts),
        cmocka_unit_test(test_ipv6_init_errors),
        cmocka_unit_test(test_ipv6_peer_address_named),
        cmocka_unit_test(test_resolve_zeroes_past_the_address),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
