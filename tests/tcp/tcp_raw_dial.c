/*
 * tcp_raw_dial.c: the moves of tcp_raw.c without asserts, for programs that
 * count a refused, reset or dropped connection as an outcome instead of a
 * failure: the storm (tests/tcp/net_storm.c), the network fuzzer
 * (fuzz/net_fuzz.c) and the connection reader's harness
 * (fuzz/fuzz_tcp_conn.c), which is built without cmocka.
 */
#define _GNU_SOURCE /* memrchr */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tcp_raw.h"

/* The job's authentication, from TP_SECRET as the workers have it (TCP-17);
 * a program that cannot read it is misconfigured, so it stops here. */
static tpi_tcp_auth raw_job_auth(void) {
    tpi_tcp_auth auth;
    char err[TP_ERRMSG_LEN_MAX];
    if (tpi_tcp_auth_setup(NULL, &auth, err, sizeof err) != TP_OK) {
        fprintf(stderr, "tcp_raw_dial: %s\n", err);
        abort();
    }
    return auth;
}

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
    tpi_tcp_auth job = raw_job_auth();
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
    ok = ok && tpi_tcp_auth_check(&job, "tp/conn/accept v1", ctx, n, pa) == 1;
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
        tpi_tcp_auth job = raw_job_auth();
        ok = tpi_tcp_auth_check(&job, "tp/store/server v1", ctx, 36, back + 24) == 1;
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
    return tt_raw_worker_addr_in(store_port, 0, rank, addr, len);
}

int tt_raw_worker_addr_in(uint16_t store_port, unsigned gen, int rank, char *addr, size_t len) {
    tp_store *store = NULL;
    char err[TP_ERRMSG_LEN_MAX], key[32];
    tpi_tcp_auth auth = raw_job_auth();
    if (tpi_tcp_store_connect("127.0.0.1", store_port, UINT32_MAX, &auth,
                              (uint64_t)ms_now() * 1000000ull + 10000000000ull, "test", NULL, 0,
                              NULL, &store, err, sizeof err) != TP_OK) {
        fprintf(stderr, "tt_raw_worker_addr: %s\n", err);
        return -1;
    }
    void *v = NULL;
    size_t n = 0;
    snprintf(key, sizeof key, "g%u/init/rank/%d", gen, rank);
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
