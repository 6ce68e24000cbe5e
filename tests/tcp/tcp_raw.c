/*
 * tcp_raw.c: a raw socket that plays a worker's peer by hand (spec/tcp.md
 * TCP-3..5, TCP-17), for the tests that send what no worker would. The
 * same moves without asserts are in tcp_raw_dial.c.
 */
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

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Whether fd's connection was reset: a send fails, or the socket holds an
 * error (the reset answering an earlier send). */
static int raw_reset(int fd) {
    uint8_t b = 0;
    int err = 0;
    socklen_t len = sizeof err;
    if (send(fd, &b, 1, MSG_NOSIGNAL) < 0)
        return 1;
    return getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0;
}

/* Whole multiples of the worker's staging buffer, which an aborting
 * connection reads into: a read that fills it is followed by one that finds
 * nothing (libuv's read callback with 0 bytes), which is no end of stream. */
#define DRAIN_JUNK (4 * TPI_TCP_STAGING_SIZE)

void tt_expect_abort_drained(int fd) {
    static uint8_t junk[DRAIN_JUNK];
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    assert_int_equal(tt_raw_recv(fd, rec, sizeof rec), sizeof rec);
    double t0 = mono_s();
    assert_int_equal(tpi_tcp_ctl_kind_of(rec), TPI_TCP_CTL_ABORT);
    /* A half-close (EOF), not a reset. */
    struct pollfd pf = {fd, POLLIN, 0};
    assert_int_equal(poll(&pf, 1, 5000), 1);
    assert_int_equal(recv(fd, rec, sizeof rec, 0), 0);
    /* What we still send is read and dropped: no reset for a second. */
    memset(junk, 0xa5, sizeof junk);
    while (mono_s() < t0 + 1.0) {
        assert_int_equal(tt_raw_send_all(fd, junk, sizeof junk), 0);
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    int err = -1;
    socklen_t len = sizeof err;
    assert_int_equal(getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len), 0);
    assert_int_equal(err, 0);
    /* We never close: the worker does when the linger runs out. */
    int reset = 0;
    while (!reset && mono_s() < t0 + TPI_TCP_ABORT_LINGER_MS / 1e3 + 5.0) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
        reset = raw_reset(fd);
    }
    double at = mono_s() - t0;
    if (!reset || at < TPI_TCP_ABORT_LINGER_MS / 1e3 - 0.2)
        fail_msg("the worker closed %.2f s after its ABORT; its linger is %d ms%s", at,
                 TPI_TCP_ABORT_LINGER_MS, reset ? "" : " (not closed at all)");
    close(fd);
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
static int hello_as_worker2(const char *addr, const tpi_tcp_auth *auth, unsigned flags,
                            uint8_t *ctx_out, size_t *ctx_len, int flip) {
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
    assert_int_equal(tpi_tcp_auth_check(&job, "tp/conn/accept v1", ctx, n, pa),
                     1); /* worker1 is real */
    tpi_tcp_auth_proof(auth, "tp/conn/dial v1", ctx, n, pa);
    if (flip >= 0)
        pa[flip] ^= 0x01;
    tpi_tcp_auth_encode(rec, TPI_TCP_AUTH_PROOF, pa);
    tt_raw_send(fd, rec, sizeof rec);
    if (ctx_out) {
        memcpy(ctx_out, ctx, n);
        *ctx_len = n;
    }
    return fd;
}

int tt_hello_as_worker2_flags(const char *addr, const tpi_tcp_auth *auth, unsigned flags,
                              uint8_t *ctx_out, size_t *ctx_len) {
    return hello_as_worker2(addr, auth, flags, ctx_out, ctx_len, -1);
}

int tt_hello_as_worker2_flipped(const char *addr, int byte) {
    assert_true(byte >= 0 && byte < TPI_TCP_PROOF_SIZE);
    tpi_tcp_auth auth = tt_job_auth();
    return hello_as_worker2(addr, &auth, TPI_TCP_HELLO_AUTH, NULL, NULL, byte);
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
