/*
 * tcp_raw.c: a raw socket that plays a worker's peer by hand (spec/tcp.md
 * TCP-3..5, TCP-17), for the tests that send what no worker would; and,
 * without asserts, the same moves for the storm and the network fuzzer
 * (tests/tcp/net_storm.c, fuzz/net_fuzz.c), which count failures instead.
 */
#define _GNU_SOURCE /* memrchr */
#include "tcp_raw.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

int tt_raw_connect(const char *addr) {
    char host[64], port[16];
    uint16_t p = 0;
    assert_int_equal(tpi_tcp_split_hostport(addr, host, sizeof host, port, sizeof port), 0);
    assert_int_equal(tpi_tcp_parse_port(port, 0, &p), 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(p);
    assert_int_equal(inet_pton(AF_INET, host, &sa.sin_addr), 1);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    int one = 1; /* no Nagle delay: each send goes out in the order the test made it */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

void tt_raw_send(int fd, const void *p, size_t n) {
    assert_int_equal(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Reads n bytes within 5 s; returns how many came before EOF. */
size_t tt_raw_recv(int fd, void *p, size_t n) {
    size_t got = 0;
    while (got < n) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 5000) <= 0)
            break;
        ssize_t k = recv(fd, (uint8_t *)p + got, n - got, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    return got;
}

/* The worker drops us: EOF (or a reset) within 5 s, nothing else first. */
void tt_expect_dropped(int fd) {
    uint8_t b[64];
    struct pollfd pf = {fd, POLLIN, 0};
    assert_true(poll(&pf, 1, 5000) == 1);
    ssize_t k = recv(fd, b, sizeof b, 0);
    assert_true(k == 0 || (k < 0 && errno == ECONNRESET));
    close(fd);
}

void tt_expect_abort_then_dropped(int fd) {
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    assert_int_equal(tt_raw_recv(fd, rec, sizeof rec), sizeof rec);
    assert_int_equal(tpi_tcp_ctl_kind_of(rec), TPI_TCP_CTL_ABORT);
    tt_expect_dropped(fd);
}

/* The job's authentication, from TP_SECRET as the workers have it (TCP-17). */
tpi_tcp_auth tt_job_auth(void) {
    tpi_tcp_auth auth;
    char err[TP_ERRMSG_LEN_MAX];
    assert_int_equal(tpi_tcp_auth_setup(NULL, &auth, err, sizeof err), TP_OK);
    return auth;
}

/* What both connection proofs cover: dialer 2, acceptor 1, world 3, both nonces. */
static size_t conn_ctx(const uint8_t nd[16], const uint8_t na[16], uint8_t ctx[64]) {
    static const uint8_t ids[12] = {2, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0};
    memcpy(ctx, ids, 12);
    memcpy(ctx + 12, nd, 16);
    memcpy(ctx + 28, na, 16);
    return 44;
}

/* The dialer's half of the handshake as worker 2 to worker 1 of 3 (TCP-3,
 * TCP-17) with hello flags; with a wrong key the worker's proof does not
 * check and ours is refused. Returns the socket after our proof went out;
 * ctx (64 bytes, may be NULL) gets what both proofs cover. */
int tt_hello_as_worker2_flags(const char *addr, const tpi_tcp_auth *auth, unsigned flags,
                              uint8_t *ctx_out, size_t *ctx_len) {
    int fd = tt_raw_connect(addr);
    uint8_t rec[TPI_TCP_RECORD_SIZE], nd[16], na[16], pa[16], ctx[64];
    tpi_tcp_hello_encode(rec, TPI_TCP_HELLO_OPEN, 2, 1, 3, flags);
    tt_raw_send(fd, rec, sizeof rec);
    assert_int_equal(tpi_tcp_auth_nonce(nd), 0);
    tpi_tcp_auth_encode(rec, TPI_TCP_AUTH_NONCE, nd);
    tt_raw_send(fd, rec, sizeof rec);
    assert_int_equal(tt_raw_recv(fd, rec, sizeof rec), sizeof rec);
    uint32_t sender = 99;
    char err[256];
    assert_true(
        tpi_tcp_hello_check(rec, TPI_TCP_HELLO_ACCEPT, 2, 3, flags, &sender, err, sizeof err));
    assert_int_equal(sender, 1);
    assert_int_equal(tt_raw_recv(fd, rec, sizeof rec), sizeof rec);
    assert_true(tpi_tcp_auth_decode(rec, TPI_TCP_AUTH_NONCE, na));
    assert_int_equal(tt_raw_recv(fd, rec, sizeof rec), sizeof rec);
    assert_true(tpi_tcp_auth_decode(rec, TPI_TCP_AUTH_PROOF, pa));
    size_t n = conn_ctx(nd, na, ctx);
    tpi_tcp_auth job = tt_job_auth();
    assert_true(tpi_tcp_auth_check(&job, "tp/conn/accept v1", ctx, n, pa)); /* worker1 is real */
    tpi_tcp_auth_proof(auth, "tp/conn/dial v1", ctx, n, pa);
    tpi_tcp_auth_encode(rec, TPI_TCP_AUTH_PROOF, pa);
    tt_raw_send(fd, rec, sizeof rec);
    if (ctx_out) {
        memcpy(ctx_out, ctx, n);
        *ctx_len = n;
    }
    return fd;
}

int tt_hello_as_worker2_with(const char *addr, const tpi_tcp_auth *auth) {
    return tt_hello_as_worker2_flags(addr, auth, TPI_TCP_HELLO_AUTH, NULL, NULL);
}

int tt_hello_as_worker2(const char *addr) {
    tpi_tcp_auth auth = tt_job_auth();
    return tt_hello_as_worker2_with(addr, &auth);
}

void tt_frame_header(uint8_t h[24], uint8_t version, uint8_t type, uint32_t body_len) {
    memset(h, 0, 24);
    memcpy(h, "TPRC", 4);
    h[4] = version;
    h[5] = type;
    h[8] = (uint8_t)body_len;
    h[9] = (uint8_t)(body_len >> 8);
    h[10] = (uint8_t)(body_len >> 16);
    h[11] = (uint8_t)(body_len >> 24);
}


void tt_worker_addr(uint16_t store_port, int rank, char *addr, size_t len) {
    assert_int_equal(tt_raw_worker_addr(store_port, rank, addr, len), 0);
}
/* ---- Without asserts (net_storm, net_fuzz) ------------------------------------------- */

int tt_raw_dial(const char *addr) {
    char host[64], port[16];
    uint16_t p = 0;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    if (tpi_tcp_split_hostport(addr, host, sizeof host, port, sizeof port) != 0 ||
        tpi_tcp_parse_port(port, 0, &p) != 0 || inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        errno = EINVAL;
        return -1;
    }
    sa.sin_port = htons(p);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int tt_raw_send_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int64_t ms_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

size_t tt_raw_recv_within(int fd, void *p, size_t n, int timeout_ms) {
    size_t got = 0;
    int64_t end = ms_now() + timeout_ms;
    while (got < n) {
        int64_t left = end - ms_now();
        struct pollfd pf = {fd, POLLIN, 0};
        if (left <= 0 || poll(&pf, 1, (int)left) <= 0)
            break;
        ssize_t k = recv(fd, (uint8_t *)p + got, n - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    return got;
}

/* What both connection proofs cover (TCP-17): dialer, acceptor, world, both nonces. */
static size_t conn_ctx_of(uint32_t dialer, uint32_t acceptor, uint32_t world, const uint8_t nd[16],
                          const uint8_t na[16], uint8_t ctx[64]) {
    uint32_t v[3] = {dialer, acceptor, world};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            ctx[4 * i + k] = (uint8_t)(v[i] >> (8 * k));
    memcpy(ctx + 12, nd, 16);
    memcpy(ctx + 28, na, 16);
    return 44;
}

int tt_raw_hello_as(const char *addr, uint32_t me, uint32_t to, uint32_t world,
                    const tpi_tcp_auth *auth) {
    int fd = tt_raw_dial(addr);
    if (fd < 0)
        return -1;
    uint8_t rec[3 * TPI_TCP_RECORD_SIZE], nd[16], na[16], pa[16], ctx[64];
    char err[256];
    uint32_t sender = UINT32_MAX;
    tpi_tcp_auth job = tt_job_auth();
    tpi_tcp_hello_encode(rec, TPI_TCP_HELLO_OPEN, me, to, world, TPI_TCP_HELLO_AUTH);
    int ok = tpi_tcp_auth_nonce(nd) == 0;
    tpi_tcp_auth_encode(rec + TPI_TCP_RECORD_SIZE, TPI_TCP_AUTH_NONCE, nd);
    ok = ok && tt_raw_send_all(fd, rec, 2 * TPI_TCP_RECORD_SIZE) == 0;
    /* The worker's ACCEPT, nonce and proof. */
    ok = ok && tt_raw_recv_within(fd, rec, sizeof rec, 5000) == sizeof rec;
    ok = ok &&
         tpi_tcp_hello_check(rec, TPI_TCP_HELLO_ACCEPT, me, world, TPI_TCP_HELLO_AUTH, &sender, err,
                             sizeof err) &&
         sender == to;
    ok = ok && tpi_tcp_auth_decode(rec + TPI_TCP_RECORD_SIZE, TPI_TCP_AUTH_NONCE, na) &&
         tpi_tcp_auth_decode(rec + 2 * TPI_TCP_RECORD_SIZE, TPI_TCP_AUTH_PROOF, pa);
    size_t n = conn_ctx_of(me, to, world, nd, na, ctx);
    ok = ok && tpi_tcp_auth_check(&job, "tp/conn/accept v1", ctx, n, pa);
    if (ok) {
        tpi_tcp_auth_proof(auth, "tp/conn/dial v1", ctx, n, pa);
        tpi_tcp_auth_encode(rec, TPI_TCP_AUTH_PROOF, pa);
        ok = tt_raw_send_all(fd, rec, TPI_TCP_RECORD_SIZE) == 0;
    }
    if (!ok) {
        close(fd);
        errno = EPROTO;
        return -1;
    }
    return fd;
}

static void put_le32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

int tt_raw_store_hello(const char *addr, uint32_t rank, const tpi_tcp_auth *auth) {
    int fd = tt_raw_dial(addr);
    if (fd < 0)
        return -1;
    uint8_t hello[TPI_STORE_HANDSHAKE_LEN] = {
        'T', 'P', 'S', 'T', TPI_STORE_PROTO_VERSION, auth->on ? 1 : 0};
    uint8_t back[TPI_STORE_SERVER_HELLO_LEN], ctx[TPI_TCP_AUTH_CTX_MAX], proof[16], okrec[4];
    put_le32(hello + 8, rank);
    int ok = !auth->on || tpi_tcp_auth_nonce(hello + 12) == 0;
    ok = ok && tt_raw_send_all(fd, hello, sizeof hello) == 0;
    ok = ok && tt_raw_recv_within(fd, back, sizeof back, 5000) == sizeof back &&
         memcmp(back, TPI_STORE_PROTO_MAGIC, 4) == 0;
    if (ok && auth->on) {
        /* The context of both store proofs: the client's rank and both nonces. */
        put_le32(ctx, rank);
        memcpy(ctx + 4, hello + 12, 16);
        memcpy(ctx + 20, back + 8, 16);
        tpi_tcp_auth job = tt_job_auth();
        ok = tpi_tcp_auth_check(&job, "tp/store/server v1", ctx, 36, back + 24);
        tpi_tcp_auth_proof(auth, "tp/store/client v1", ctx, 36, proof);
        ok = ok && tt_raw_send_all(fd, proof, sizeof proof) == 0;
        ok = ok && tt_raw_recv_within(fd, okrec, 4, 5000) == 4 &&
             memcmp(okrec, TPI_STORE_AUTH_OK, 4) == 0;
    }
    if (!ok) {
        close(fd);
        errno = EPROTO;
        return -1;
    }
    return fd;
}

int tt_raw_worker_addr(uint16_t store_port, int rank, char *addr, size_t len) {
    tp_store *store = NULL;
    char err[TP_ERRMSG_LEN_MAX], key[32];
    tpi_tcp_auth auth = tt_job_auth();
    if (tpi_tcp_store_connect("127.0.0.1", store_port, UINT32_MAX, &auth,
                              (uint64_t)ms_now() * 1000000ull + 10000000000ull, "test", NULL, 0,
                              &store, err, sizeof err) != TP_OK) {
        fprintf(stderr, "tt_raw_worker_addr: %s\n", err);
        return -1;
    }
    void *v = NULL;
    size_t n = 0;
    snprintf(key, sizeof key, "g0/init/rank/%d", rank);
    int rc = -1;
    if (store->ops->get(store, key, &v, &n) == TP_OK) {
        char *tab = memrchr(v, '\t', n); /* "<name>\t<credit>\t<address>" */
        if (tab) {
            snprintf(addr, len, "%.*s", (int)(n - (size_t)(tab + 1 - (char *)v)), tab + 1);
            rc = 0;
        }
    }
    if (rc != 0)
        fprintf(stderr, "tt_raw_worker_addr: no address of rank %d in the store\n", rank);
    free(v);
    store->ops->close(store);
    return rc;
}
