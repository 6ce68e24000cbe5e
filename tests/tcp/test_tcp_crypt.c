/*
 * test_tcp_crypt.c: encryption of the stream (spec/tcp.md TCP-21): calls of
 * every size with encrypt=on, the option and a mismatch refused with a clear
 * message, records tampered with, replayed, reordered, truncated or forged by
 * an impostor that knows the job secret refused as protocol errors while the
 * worker keeps serving, and a capture of the stream by a relay between two
 * workers that holds a known plaintext with encrypt=off and not with it on;
 * and the control records of a sealed stream at work: idle connections
 * closed by IDLE and CLOSE under racing calls (TCP-19), a probe's PING and
 * PONG (TCP-7), and stop's BYE in a graceful shutdown (TCP-8).
 */
#define _GNU_SOURCE /* RTLD_NEXT */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <ctype.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "real/tcp_internal.h"
#include "tcp_harness.h"
#include "tcp_raw.h"

#define MARKER "SECRET-MARKER-7f3a9c-plaintext"

static tp_options *crypt_options(const tt_job *job, const char *encrypt) {
    tp_options *o = tt_options(job, 20, 10);
    if (o && encrypt && tp_options_set(o, "encrypt", encrypt) != TP_OK) {
        tp_options_free(o);
        return NULL;
    }
    return o;
}

/* rpc_sync echo(bytes) to d and back, equal; 0 on success. */
static int echo_bytes(tp_dest d, const uint8_t *data, size_t n) {
    tp_value *args = tp_value_list_of(1, tp_value_bytes(data, n));
    tp_value *res = NULL;
    tp_status st = tp_rpc_sync(d, "echo", args, NULL, TP_TIMEOUT_DEFAULT, &res);
    const void *back = NULL;
    size_t len = 0;
    int ok = st == TP_OK && tp_value_get_bytes(res, &back, &len) == TP_OK && len == n &&
             memcmp(back, data, n) == 0;
    if (!ok)
        fprintf(stderr, "echo of %zu bytes: %s %s\n", n, tp_status_name(st), tp_errmsg());
    tp_value_free(args);
    tp_value_free(res);
    return ok ? 0 : -1;
}

/* rpc_sync echo(float32 tensor of rows x cols) to d, equal; 0 on success. */
static int echo_tensor(tp_dest d, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols};
    tp_value *t = tp_value_tensor(TP_DTYPE_FLOAT32, 2, shape, NULL, NULL);
    if (!t)
        return -1;
    float *td = tp_tensor_data(t);
    for (int64_t k = 0; k < rows * cols; k++)
        td[k] = (float)k;
    tp_value *args = tp_value_list_of(1, t);
    tp_value *res = NULL;
    tp_status st = tp_rpc_sync(d, "echo", args, NULL, TP_TIMEOUT_DEFAULT, &res);
    int ok = st == TP_OK && tp_value_equal(res, tp_list_get(args, 0));
    tp_value_free(args);
    tp_value_free(res);
    return ok ? 0 : -1;
}

/* ---- Calls of every size (TCP-21) ---------------------------------------------------- */

static int body_calls(tt_job *job, int rank) {
    tp_options *o = crypt_options(job, "on");
    TT_CHECK(o && tt_init(job, rank, o) == 0);
    tp_options_free(o);
    for (int r = 0; r < job->world; r++) { /* every peer, and itself (loopback) */
        int64_t v = 0;
        TT_CHECK(tt_call_add(tp_to_rank(r), rank, 10 * r, TP_TIMEOUT_DEFAULT, &v) == TP_OK);
        TT_CHECK(v == rank + 10 * r);
    }
    tp_dest next = tp_to_rank((rank + 1) % job->world);
    /* Sizes around the record size, and 3 MiB: many records, opened
     * straight into the frame. */
    size_t sizes[] = {
        1, 64, TPI_TCP_SEAL_MAX - 40, TPI_TCP_SEAL_MAX, 3 * TPI_TCP_SEAL_MAX + 7, 3u << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *data = malloc(sizes[i]);
        TT_CHECK(data);
        for (size_t k = 0; k < sizes[i]; k++)
            data[k] = (uint8_t)(k * 31 + (size_t)rank);
        int bad = echo_bytes(next, data, sizes[i]);
        free(data);
        TT_CHECK(bad == 0);
    }
    TT_CHECK(echo_tensor(next, 256, 257) == 0);   /* a frame of several segments */
    TT_CHECK(echo_tensor(next, 1024, 1024) == 0); /* 4 MiB */
    /* A window of async calls: frames sealed in batches. */
    enum { N = 300 };
    tp_future *f[N];
    for (int i = 0; i < N; i++) {
        tp_value *args = tp_value_list_of(2, tp_value_int(i), tp_value_int(rank));
        TT_CHECK(tp_rpc_async(next, "add", args, NULL, TP_TIMEOUT_DEFAULT, &f[i]) == TP_OK);
        tp_value_free(args);
    }
    for (int i = 0; i < N; i++) {
        int64_t x = -1;
        TT_CHECK(tp_future_wait(f[i], 30) == TP_OK &&
                 tp_value_get_int(tp_future_value(f[i]), &x) == TP_OK && x == i + rank);
        tp_future_free(f[i]);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* spec: TCP-21: with encrypt=on on every worker, calls of every size work. */
static void test_tcp_crypt_calls(void **state) {
    (void)state;
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 3, body_calls, NULL), 0);
    assert_int_equal(tt_wait(&job, 120), 0);
    tt_job_free(&job);
}

/* spec: TCP-21, AGENT-18: a sealed connection counts its unsent bytes down
 * as its chunks go, as a plain one does: worker 1 keeps at most 64 KiB
 * unsent for a peer (max_unsent_bytes), and 40 echoes of 16 KiB in a row
 * from worker 0 are all answered (a count that only grew would pass the
 * bound after four and stall worker 0's calls for good). */
static int body_unsent_sealed(tt_job *job, int rank) {
    tp_options *o = crypt_options(job, "on");
    TT_CHECK(o && (rank == 0 || tp_options_set(o, "max_unsent_bytes", "65536") == TP_OK));
    TT_CHECK(o && tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        static uint8_t data[16384];
        for (int i = 0; i < 40; i++) {
            memset(data, i, sizeof data);
            TT_CHECK(echo_bytes(tp_to_rank(1), data, sizeof data) == 0);
        }
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_tcp_crypt_unsent_counted_down(void **state) {
    (void)state;
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 2, body_unsent_sealed, NULL), 0);
    assert_int_equal(tt_wait(&job, 120), 0);
    tt_job_free(&job);
}

/* ---- The option, and a mismatch ------------------------------------------------------- */

static int body_mismatch(tt_job *job, int rank) {
    tp_options *o = crypt_options(job, rank == 0 ? "on" : "off");
    TT_CHECK(o);
    tp_options_set_init_timeout(o, 10);
    tp_status st = tp_init_rpc(rank == 0 ? "worker0" : "worker1", "TENSORPIPE", rank, 2, o);
    tp_options_free(o);
    if (st == TP_OK)
        tp_shutdown(0);
    fprintf(stderr, "worker%d: init: %s: %s\n", rank, tp_status_name(st), tp_errmsg());
    TT_CHECK(st != TP_OK);
    TT_CHECK(strstr(tp_errmsg(), "encrypt=on") != NULL);
    TT_CHECK(strstr(tp_errmsg(), "encrypt=off") != NULL);
    TT_CHECK(strstr(tp_errmsg(), "must set the backend option 'encrypt' alike") != NULL);
    return 0;
}

/* spec: TCP-21, TCP-3: one worker encrypts, the other does not: init fails
 * on both within its deadline, saying so (not after 30 s of redials). */
static void test_tcp_crypt_mismatch(void **state) {
    (void)state;
    tt_job job = {0};
    uint64_t t0 = tt_now_ns();
    assert_int_equal(tt_spawn(&job, 2, body_mismatch, NULL), 0);
    assert_int_equal(tt_wait(&job, 60), 0);
    assert_true(tt_now_ns() - t0 <
                9000000000ull); /* before the init deadline: told, not timed out */
    tt_job_free(&job);
}

static int bad_option(const tt_job *job, const char *auth, const char *encrypt,
                      const char *needle) {
    tp_options *o = crypt_options(job, encrypt);
    if (auth)
        tp_options_set(o, "auth", auth);
    tp_status st = tp_init_rpc("worker0", "TENSORPIPE", 0, 1, o);
    tp_options_free(o);
    if (st == TP_OK)
        tp_shutdown(0);
    if (st == TP_EINVAL && strstr(tp_errmsg(), needle))
        return 0;
    fprintf(stderr, "encrypt=%s auth=%s: %s '%s', expected TP_EINVAL with '%s'\n", encrypt,
            auth ? auth : "(default)", tp_status_name(st), tp_errmsg(), needle);
    return 1;
}

static int body_options(tt_job *job, int rank) {
    (void)rank;
    TT_CHECK(bad_option(job, NULL, "maybe", "'on' or 'off'") == 0);
    TT_CHECK(bad_option(job, NULL, "ON", "'on' or 'off'") == 0);
    TT_CHECK(bad_option(job, "off", "on", "needs authentication") == 0);
    return 0;
}

/* spec: TCP-12, TCP-21: encrypt is on or off; on needs authentication. In
 * a child: init attempts take generations (INIT-1). */
static void test_tcp_crypt_options(void **state) {
    (void)state;
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 1, body_options, NULL), 0);
    assert_int_equal(tt_wait(&job, 60), 0);
    tt_job_free(&job);
}

/* ---- An impostor that knows the secret; records tampered with ---------------------- */

enum { F_ATTACKED = 1, C_READY = 1 };

static int body_attacked(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    tp_options *o = crypt_options(job, "on");
    TT_CHECK(o && tt_init(job, rank, o) == 0);
    tp_options_free(o);
    atomic_fetch_add(&sh->count[C_READY], 1);
    TT_CHECK(tt_await_flag(sh, F_ATTACKED, 1, 90) == 0);
    /* Every pair still works, worker1 included, both ways. */
    for (int r = 0; r < job->world; r++) {
        int64_t v = 0;
        TT_CHECK(tt_call_add(tp_to_rank(r), rank, r, TP_TIMEOUT_DEFAULT, &v) == TP_OK);
        TT_CHECK(v == rank + r);
    }
    uint8_t big[100000];
    memset(big, rank, sizeof big);
    TT_CHECK(echo_bytes(tp_to_rank(1), big, sizeof big) == 0);
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* The impostor: worker 2's side of a connection to worker 1, with the keys
 * of both directions, built by the library's own encoder. */
typedef struct impostor {
    int fd;
    tpi_tcp_cipher tx, rx;
} impostor;

static void impostor_open(impostor *im, const char *addr) {
    uint8_t ctx[64], d2a[32], a2d[32];
    size_t n = 0;
    tpi_tcp_auth auth = tt_job_auth();
    im->fd =
        tt_hello_as_worker2_flags(addr, &auth, TPI_TCP_HELLO_AUTH | TPI_TCP_HELLO_ENCRYPT, ctx, &n);
    tpi_tcp_seal_keys(&auth, ctx, n, d2a, a2d);
    assert_int_equal(tpi_tcp_seal_init(&im->tx, d2a, 1), 0);
    assert_int_equal(tpi_tcp_seal_init(&im->rx, a2d, 0), 0);
}

static void impostor_close(impostor *im) {
    if (im->fd >= 0)
        close(im->fd);
    tpi_tcp_seal_clear(&im->tx);
    tpi_tcp_seal_clear(&im->rx);
}

/* n bytes of plaintext sealed into *out (malloc'd); its size. */
static size_t seal(impostor *im, const void *p, size_t n, uint8_t **out) {
    size_t m = tpi_tcp_sealed_size(n);
    *out = malloc(m);
    assert_non_null(*out);
    struct iovec v = {(void *)p, n};
    assert_int_equal(tpi_tcp_seal(&im->tx, &v, 1, n, *out), 0);
    return m;
}

static void send_sealed(impostor *im, const void *p, size_t n) {
    uint8_t *s = NULL;
    size_t m = seal(im, p, n, &s);
    tt_raw_send(im->fd, s, m);
    free(s);
}

/* The next record from worker 1, opened: the 24-byte control record it holds. */
static void recv_sealed_record(impostor *im, uint8_t rec[TPI_TCP_RECORD_SIZE]) {
    uint8_t buf[TPI_TCP_RECORD_SIZE + TPI_TCP_SEAL_OVERHEAD];
    assert_int_equal(tt_raw_recv(im->fd, buf, sizeof buf), sizeof buf);
    assert_int_equal(tpi_tcp_seal_len(buf), TPI_TCP_RECORD_SIZE);
    assert_int_equal(tpi_tcp_open(&im->rx, buf, rec), 0);
}

/* A sealed ABORT (TCP-7's protocol error), then the end; the impostor is closed. */
static void expect_sealed_abort(impostor *im) {
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    recv_sealed_record(im, rec);
    assert_int_equal(tpi_tcp_ctl_kind_of(rec), TPI_TCP_CTL_ABORT);
    uint64_t t0 = tt_now_ns();
    tt_expect_dropped(im->fd);
    /* The ABORT is followed by the end of the stream at once (TCP-7), not
     * at the 2 s linger that bounds a peer that stops reading. */
    uint64_t took = tt_now_ns() - t0;
    if (took >= 1500000000ull)
        fail_msg("the end of the stream came %.2f s after the ABORT", (double)took / 1e9);
    im->fd = -1;
    impostor_close(im);
}

static void ping_pong(impostor *im) {
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    tpi_tcp_ctl_encode(rec, TPI_TCP_CTL_PING, 2);
    send_sealed(im, rec, sizeof rec);
    recv_sealed_record(im, rec);
    assert_int_equal(tpi_tcp_ctl_kind_of(rec), TPI_TCP_CTL_PONG);
}

/* spec: TCP-21, TCP-7, TCP-14: an impostor with the secret speaks the sealed
 * protocol (its PING is answered), but one flipped byte, a replayed,
 * reordered or oversized record, or plaintext where a record belongs, is
 * TCP-7's protocol error on its connection alone; worker 1 serves on. */
static void test_tcp_crypt_tampered(void **state) {
    (void)state;
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 3, body_attacked, NULL), 0);
    uint64_t deadline = tt_now_ns() + 30000000000ull;
    while (atomic_load(&job.shared->count[C_READY]) < 3 && tt_now_ns() < deadline)
        usleep(1000);
    assert_int_equal(atomic_load(&job.shared->count[C_READY]), 3);
    char addr[128];
    tt_worker_addr(job.store_port, 1, addr, sizeof addr);
    uint8_t rec[TPI_TCP_RECORD_SIZE], rec2[TPI_TCP_RECORD_SIZE];
    impostor im;

    /* A dialer without ENCRYPT is told by worker 1's ACCEPT, then dropped. */
    int fd = tt_raw_connect(addr);
    tpi_tcp_hello_encode(rec, TPI_TCP_HELLO_OPEN, 2, 1, 3, TPI_TCP_HELLO_AUTH);
    tt_raw_send(fd, rec, sizeof rec);
    assert_int_equal(tt_raw_recv(fd, rec, sizeof rec), sizeof rec);
    uint32_t sender = 0;
    char err[256];
    assert_true(tpi_tcp_hello_check(rec, TPI_TCP_HELLO_ACCEPT, 2, 3,
                                    TPI_TCP_HELLO_AUTH | TPI_TCP_HELLO_ENCRYPT, &sender, err,
                                    sizeof err));
    assert_false(tpi_tcp_hello_check(rec, TPI_TCP_HELLO_ACCEPT, 2, 3, TPI_TCP_HELLO_AUTH, &sender,
                                     err, sizeof err));
    assert_non_null(strstr(err, "encrypt=on"));
    tt_expect_dropped(fd);

    /* The control: well-sealed records are answered, twice in a row. */
    impostor_open(&im, addr);
    ping_pong(&im);
    ping_pong(&im);
    /* One byte flipped in the ciphertext. */
    tpi_tcp_ctl_encode(rec, TPI_TCP_CTL_PING, 2);
    uint8_t *s = NULL;
    size_t m = seal(&im, rec, sizeof rec, &s);
    s[TPI_TCP_SEAL_HEAD + 5] ^= 0x01;
    tt_raw_send(im.fd, s, m);
    free(s);
    expect_sealed_abort(&im);

    /* One byte flipped in the tag; in the length (its associated data). */
    for (int where = 0; where < 2; where++) {
        impostor_open(&im, addr);
        m = seal(&im, rec, sizeof rec, &s);
        if (where == 0)
            s[m - 1] ^= 0x80;
        else
            s[0] ^= 0x02; /* 24 -> 26: still in bounds, the tag covers it */
        tt_raw_send(im.fd, s, m);
        if (where == 1)
            tt_raw_send(im.fd, "xx", 2); /* the two bytes the length now claims */
        free(s);
        expect_sealed_abort(&im);
    }

    /* Replayed: the same record twice. */
    impostor_open(&im, addr);
    m = seal(&im, rec, sizeof rec, &s);
    tt_raw_send(im.fd, s, m);
    recv_sealed_record(&im, rec2);
    assert_int_equal(tpi_tcp_ctl_kind_of(rec2), TPI_TCP_CTL_PONG);
    tt_raw_send(im.fd, s, m);
    free(s);
    expect_sealed_abort(&im);

    /* Reordered: the second record before the first. */
    impostor_open(&im, addr);
    uint8_t *s1 = NULL, *s2 = NULL;
    size_t m1 = seal(&im, rec, sizeof rec, &s1);
    size_t m2 = seal(&im, rec, sizeof rec, &s2);
    tt_raw_send(im.fd, s2, m2);
    tt_raw_send(im.fd, s1, m1);
    free(s1);
    free(s2);
    expect_sealed_abort(&im);

    /* Moved from another connection: a record sealed for one, sent on another. */
    impostor other;
    impostor_open(&other, addr);
    impostor_open(&im, addr);
    m = seal(&other, rec, sizeof rec, &s);
    tt_raw_send(im.fd, s, m);
    free(s);
    expect_sealed_abort(&im);
    impostor_close(&other);

    /* A length over the record size, refused from its 4 bytes alone. */
    impostor_open(&im, addr);
    uint8_t head[4] = {(uint8_t)(TPI_TCP_SEAL_MAX + 1), (uint8_t)((TPI_TCP_SEAL_MAX + 1) >> 8), 0,
                       0};
    tt_raw_send(im.fd, head, sizeof head);
    expect_sealed_abort(&im);

    /* Plaintext where records belong: "TPCT" read as a length is too long. */
    impostor_open(&im, addr);
    tt_raw_send(im.fd, rec, sizeof rec);
    expect_sealed_abort(&im);

    /* A large frame whose second record is tampered with: opened straight
     * into the frame, refused, the frame freed. */
    impostor_open(&im, addr);
    size_t body = 3 * TPI_TCP_SEAL_MAX;
    uint8_t *frame = calloc(1, TP_FRAME_HEADER_SIZE + body);
    assert_non_null(frame);
    tt_frame_header(frame, 1, 1, (uint32_t)body);
    m = seal(&im, frame, TP_FRAME_HEADER_SIZE + body, &s);
    s[TPI_TCP_SEAL_MAX + TPI_TCP_SEAL_OVERHEAD + TPI_TCP_SEAL_HEAD + 100] ^= 0x40;
    tt_raw_send(im.fd, s, m);
    free(s);
    free(frame);
    expect_sealed_abort(&im);

    /* Truncated: half a record, then the end. Worker 1 frees what it held
     * and probes worker 2, which lives. */
    impostor_open(&im, addr);
    m = seal(&im, rec, sizeof rec, &s);
    tt_raw_send(im.fd, s, m / 2);
    free(s);
    impostor_close(&im);

    atomic_store(&job.shared->flag[F_ATTACKED], 1);
    assert_int_equal(tt_wait(&job, 90), 0);
    tt_job_free(&job);
}

/* ---- A capture of the stream ---------------------------------------------------------- */

/*
 * A relay between worker 0 and worker 1: worker 1 listens on 127.0.0.1:port
 * and advertises 127.0.0.2 (the same loopback), where the relay listens on
 * the same port and forwards each connection to 127.0.0.1:port, recording
 * every byte both ways. Worker 0 dials worker 1 through it; worker 1's own
 * connection to worker 0 does not pass it. The relay is a process of its
 * own, forked before the job (a thread would be in the job's forks), and
 * records into memory it shares with the test.
 */
typedef struct relay_shared {
    atomic_int stop;
    atomic_int conns;
    size_t seen_len; /* written by the relay, read once it exited */
    uint8_t seen[];  /* every byte forwarded, both directions, up to RELAY_SEEN_MAX */
} relay_shared;

#define RELAY_CONNS_MAX 16
#define RELAY_SEEN_MAX ((size_t)32 << 20)

typedef struct relay {
    pid_t pid;
    relay_shared *sh;
} relay;

static void relay_main(relay_shared *sh, int listen_fd, uint16_t port) {
    int fds[2 * RELAY_CONNS_MAX]; /* pairs: [2i] the dialer's side, [2i+1] worker 1's */
    int n = 0;
    static uint8_t buf[65536];
    while (!atomic_load(&sh->stop)) {
        struct pollfd pf[1 + 2 * RELAY_CONNS_MAX];
        pf[0] = (struct pollfd){listen_fd, POLLIN, 0};
        for (int i = 0; i < n; i++)
            pf[1 + i] = (struct pollfd){fds[i], fds[i] >= 0 ? POLLIN : 0, 0};
        if (poll(pf, (nfds_t)(1 + n), 50) <= 0)
            continue;
        if ((pf[0].revents & POLLIN) && n < 2 * RELAY_CONNS_MAX) {
            int in = accept(listen_fd, NULL, NULL);
            if (in >= 0) {
                struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
                inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
                int out = socket(AF_INET, SOCK_STREAM, 0);
                if (out >= 0 && connect(out, (struct sockaddr *)&sa, sizeof sa) == 0) {
                    fds[n++] = in;
                    fds[n++] = out;
                    atomic_fetch_add(&sh->conns, 1);
                } else {
                    close(in);
                    if (out >= 0)
                        close(out);
                }
            }
        }
        for (int i = 0; i < n; i++) {
            if (fds[i] < 0 || !(pf[1 + i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            int to = fds[i ^ 1];
            ssize_t k = recv(fds[i], buf, sizeof buf, 0);
            if (k > 0 && to >= 0 && send(to, buf, (size_t)k, MSG_NOSIGNAL) == k) {
                size_t keep = (size_t)k;
                if (keep > RELAY_SEEN_MAX - sh->seen_len)
                    keep = RELAY_SEEN_MAX - sh->seen_len;
                memcpy(sh->seen + sh->seen_len, buf, keep);
                sh->seen_len += keep;
                continue;
            }
            close(fds[i]); /* an end, or an error: both sides of the pair end */
            fds[i] = -1;
            if (to >= 0) {
                shutdown(to, SHUT_RDWR);
                close(to);
                fds[i ^ 1] = -1;
            }
        }
    }
}

/* 0 with the relay running; -1 when 127.0.0.2 cannot be bound (skip). */
static int relay_start(relay *r, uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.2", &sa.sin_addr);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0) {
        close(fd);
        return -1;
    }
    r->sh = mmap(NULL, sizeof *r->sh + RELAY_SEEN_MAX, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(r->sh != MAP_FAILED);
    fflush(NULL);
    r->pid = fork();
    assert_true(r->pid >= 0);
    if (r->pid == 0) {
        relay_main(r->sh, fd, port);
        _exit(0);
    }
    close(fd);
    return 0;
}

/* Stops the relay; its record stays readable until relay_free. */
static void relay_stop(relay *r) {
    atomic_store(&r->sh->stop, 1);
    int status = 0;
    assert_int_equal(waitpid(r->pid, &status, 0), r->pid);
}

static void relay_free(relay *r) {
    munmap(r->sh, sizeof *r->sh + RELAY_SEEN_MAX);
}

typedef struct capture_args {
    const char *encrypt;
    uint16_t port1; /* worker 1's listen port */
} capture_args;

static int body_capture(tt_job *job, int rank) {
    const capture_args *ca = job->arg;
    tp_options *o = crypt_options(job, ca->encrypt);
    TT_CHECK(o);
    /* Both workers share this host: without shm=off the large call would
     * bypass the stream (and the capture) through shared memory (TCP-22). */
    TT_CHECK(tp_options_set(o, "shm", "off") == TP_OK);
    if (rank == 1) {
        char port[16];
        snprintf(port, sizeof port, "%u", (unsigned)ca->port1);
        TT_CHECK(tp_options_set(o, "listen_port", port) == TP_OK);
        TT_CHECK(tp_options_set(o, "advertise_addr", "127.0.0.2") == TP_OK);
    }
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        /* The marker in a small call and inside a large one. */
        uint8_t small[64];
        memset(small, '.', sizeof small);
        memcpy(small, MARKER, sizeof MARKER - 1);
        TT_CHECK(echo_bytes(tp_to_rank(1), small, sizeof small) == 0);
        size_t n = 1u << 20;
        uint8_t *big = malloc(n);
        TT_CHECK(big);
        for (size_t k = 0; k < n; k++)
            big[k] = (uint8_t)k;
        memcpy(big + n / 2, MARKER, sizeof MARKER - 1);
        int bad = echo_bytes(tp_to_rank(1), big, n);
        free(big);
        TT_CHECK(bad == 0);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* Runs the capture job with encrypt; how many times the marker was seen. -1: skipped. */
static int capture(const char *encrypt, size_t *seen_len) {
    capture_args ca = {encrypt, tt_free_port()};
    relay r;
    if (relay_start(&r, ca.port1) != 0)
        return -1;
    tt_job job = {0};
    int spawned = tt_spawn(&job, 2, body_capture, &ca);
    int waited = spawned == 0 ? tt_wait(&job, 60) : -1;
    tt_job_free(&job);
    relay_stop(&r);
    int conns = atomic_load(&r.sh->conns);
    int hits = 0;
    for (size_t i = 0; i + sizeof MARKER - 1 <= r.sh->seen_len; i++)
        hits += memcmp(r.sh->seen + i, MARKER, sizeof MARKER - 1) == 0;
    *seen_len = r.sh->seen_len;
    relay_free(&r);
    assert_int_equal(waited, 0);
    assert_true(conns >= 1); /* worker 0 dialed worker 1 through it */
    return hits;
}

/* spec: TCP-21, TCP-14: a passive capture between two workers holds a known
 * plaintext with encrypt=off (so the check can fail) and not with it on. */
static void test_tcp_crypt_capture(void **state) {
    (void)state;
    size_t off_len = 0, on_len = 0;
    int off = capture("off", &off_len);
    if (off < 0)
        skip(); /* no 127.0.0.2 here */
    int on = capture("on", &on_len);
    fprintf(stderr, "capture: encrypt=off %zu bytes, marker %d times; encrypt=on %zu bytes, %d\n",
            off_len, off, on_len, on);
    assert_true(off >= 2); /* the call and its answer, at least the small one's */
    assert_true(on_len > (1u << 20));
    assert_int_equal(on, 0);
}

/* ---- Idle close, a probe and stop's BYE, sealed (TCP-19, TCP-7, TCP-8) ------------------ */

/* What a worker's log showed, counted in the job's shared memory (count[]
 * indices; C_READY is 1). Each is a control record's observable end: */
enum {
    C_IDLE_ASKED = 2,   /* an acceptor sent IDLE (TCP-19, debug) */
    C_TROUBLE = 3,      /* a peer-down of any kind, or a connection dropped, before shutdown */
    C_NO_OPEN = 4,      /* "a sealed record does not check", or a length refused: any time */
    C_ANSWERS = 5,      /* a probe answered: "the worker still answers" (TCP-7) */
    C_BYE = 6,          /* a peer-down after a BYE: "the worker shut down" (TCP-6, TCP-8) */
    C_BUDGET = 7,       /* a frame waited for the read budget (TCP-19, debug) */
    C_BUDGET_READY = 1, /* body_budget's senders at their start line */
    C_WARN0 = 8         /* + rank: messages at warn level or worse, any time */
};

static tt_shared *log_shared;
static int log_rank;
static atomic_int log_stopping; /* this worker called tp_shutdown: peers leaving is no news */

static void watch_log(tp_log_level level, const char *msg, void *user) {
    (void)user;
    tt_shared *sh = log_shared;
    int trouble = strstr(msg, "unreachable") || strstr(msg, " is down") || strstr(msg, "dropped");
    int no_open = strstr(msg, "sealed record") != NULL;
    if (strstr(msg, "asks worker"))
        atomic_fetch_add(&sh->count[C_IDLE_ASKED], 1);
    if (trouble && !atomic_load(&log_stopping))
        atomic_fetch_add(&sh->count[C_TROUBLE], 1);
    if (no_open)
        atomic_fetch_add(&sh->count[C_NO_OPEN], 1);
    if (strstr(msg, "still answers"))
        atomic_fetch_add(&sh->count[C_ANSWERS], 1);
    if (strstr(msg, "the worker shut down"))
        atomic_fetch_add(&sh->count[C_BYE], 1);
    if (strstr(msg, "bytes are being read"))
        atomic_fetch_add(&sh->count[C_BUDGET], 1);
    if (level <= TP_LOG_WARN)
        atomic_fetch_add(&sh->count[C_WARN0 + log_rank], 1);
    if (level <= TP_LOG_WARN || trouble || no_open || getenv("TT_LOG"))
        fprintf(stderr, "worker%d log: %s\n", log_rank, msg);
}

/* Every worker of these tests: encrypt=on, its log watched at debug level;
 * key (may be NULL) set to value. */
static int init_watched(tt_job *job, int rank, const char *key, const char *value) {
    log_shared = job->shared;
    log_rank = rank;
    tp_set_log_level(TP_LOG_DEBUG);
    tp_set_log_callback(watch_log, NULL);
    tp_options *o = crypt_options(job, "on");
    if (!o || (key && tp_options_set(o, key, value) != TP_OK)) {
        tp_options_free(o);
        return -1;
    }
    int rc = tt_init(job, rank, o);
    tp_options_free(o);
    return rc;
}

/* Every pair calls, both ways; 0 when each answer is right. */
static int call_all(const tt_job *job, int rank) {
    for (int r = 0; r < job->world; r++) {
        int64_t v = 0;
        if (tt_call_add(tp_to_rank(r), rank, 100 * r, TP_TIMEOUT_DEFAULT, &v) != TP_OK ||
            v != rank + 100 * r)
            return -1;
    }
    return 0;
}

static int shutdown_watched(void) {
    atomic_store(&log_stopping, 1);
    tp_status st = tp_shutdown(1);
    if (st != TP_OK)
        fprintf(stderr, "worker%d: shutdown: %s %s\n", log_rank, tp_status_name(st), tp_errmsg());
    return st == TP_OK ? 0 : -1;
}

static int body_idle(tt_job *job, int rank) {
    TT_CHECK(init_watched(job, rank, "idle_timeout", TT_IDLE_TIMEOUT) == 0);
    /* Rounds of calls around the idle deadline, as test_tcp_bounds.c's
     * test_tcp_idle, with pauses from half to twice it (some connections
     * surely idle, on a busy machine too): some calls start as the peer asks
     * us to close, and must neither be lost nor fail. */
    TT_CHECK(tt_idle_rounds(rank, 12) == 0);
    TT_CHECK(shutdown_watched() == 0);
    return 0;
}

/* The counts every sealed test checks: no record failed to open, no
 * warning anywhere. */
static void assert_sealed_clean(const tt_job *job) {
    assert_int_equal(atomic_load(&job->shared->count[C_NO_OPEN]), 0);
    for (int r = 0; r < job->world; r++)
        assert_int_equal(atomic_load(&job->shared->count[C_WARN0 + r]), 0);
}

/* spec: TCP-19, TCP-21: with encrypt=on and idle_timeout 0.2 s on every
 * worker, connections idle between rounds of calls are closed by a sealed
 * IDLE and a sealed CLOSE while calls race the close: every call succeeds,
 * IDLE was asked, and nobody saw a peer down or a connection dropped (an
 * IDLE that does not open fails the dialer's connection, TP_EIO; a CLOSE
 * that does not open is a protocol error at the acceptor). */
static void test_tcp_crypt_idle(void **state) {
    (void)state;
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 3, body_idle, NULL), 0);
    int waited = tt_wait(&job, 120);
    fprintf(stderr, "idle: IDLE asked %d times, trouble %d\n",
            atomic_load(&job.shared->count[C_IDLE_ASKED]),
            atomic_load(&job.shared->count[C_TROUBLE]));
    assert_int_equal(waited, 0);
    assert_true(atomic_load(&job.shared->count[C_IDLE_ASKED]) >= 3);
    assert_int_equal(atomic_load(&job.shared->count[C_TROUBLE]), 0);
    assert_sealed_clean(&job);
    tt_job_free(&job);
}

#define BUDGET_ROUNDS 20
#define BUDGET_ECHOES 4    /* in flight from each sender at once */
#define BUDGET_CALL 150000 /* one call's bytes, alone more than the read budget */

static int body_budget(tt_job *job, int rank) {
    TT_CHECK(init_watched(job, rank, "rx_budget", "100000") == 0);
    if (rank != 1) { /* workers 0 and 2 at once: one's frame waits while the other's is read */
        uint8_t *b = malloc(BUDGET_CALL);
        TT_CHECK(b);
        for (size_t i = 0; i < BUDGET_CALL; i++)
            b[i] = (uint8_t)(i * 13 + (size_t)rank);
        tp_value *big = tp_value_list_of(1, tp_value_bytes(b, BUDGET_CALL));
        /* Both senders start together (their inits end apart). */
        atomic_fetch_add(&job->shared->count[C_BUDGET_READY], 1);
        for (int i = 0; i < 10000 && atomic_load(&job->shared->count[C_BUDGET_READY]) < 2; i++)
            usleep(1000);
        /* Rounds until frames waited a few times (a wait needs two frames
         * in reading at once: most rounds, not all), at most 10 times more. */
        for (int r = 0; r < 10 * BUDGET_ROUNDS &&
                        (r < BUDGET_ROUNDS || atomic_load(&job->shared->count[C_BUDGET]) < 3);
             r++) {
            tp_future *echo[BUDGET_ECHOES] = {NULL}, *sum = NULL;
            for (int k = 0; k < BUDGET_ECHOES; k++)
                TT_CHECK(tp_rpc_async(tp_to_rank(1), "echo", big, NULL, 30, &echo[k]) == TP_OK);
            tp_value *args = tp_value_list_of(2, tp_value_int(r), tp_value_int(rank));
            TT_CHECK(tp_rpc_async(tp_to_rank(1), "add", args, NULL, 30, &sum) == TP_OK);
            tp_value_free(args);
            int64_t v = -1;
            for (int k = 0; k < BUDGET_ECHOES; k++) {
                TT_CHECK(tp_future_wait(echo[k], 30) == TP_OK &&
                         tp_value_equal(tp_future_value(echo[k]), tp_list_get(big, 0)));
                tp_future_free(echo[k]);
            }
            TT_CHECK(tp_future_wait(sum, 30) == TP_OK &&
                     tp_value_get_int(tp_future_value(sum), &v) == TP_OK && v == r + rank);
            tp_future_free(sum);
        }
        tp_value_free(big);
        free(b);
    }
    TT_CHECK(shutdown_watched() == 0);
    return 0;
}

/* spec: TCP-19, TCP-21: with encrypt=on and rx_budget 100000, workers 0 and
 * 2 each send worker 1 rounds of four echoes of 150,000 bytes and an add: a
 * frame whose header waits for the budget keeps the sealed records behind
 * it unopened (they are that frame's body and the add), and reads on from
 * there once admitted: every echo comes back whole, every add answers, no
 * record fails to open, and frames did wait. */
static void test_tcp_crypt_read_budget_waits(void **state) {
    (void)state;
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 3, body_budget, NULL), 0);
    int waited = tt_wait(&job, 120);
    int waits = atomic_load(&job.shared->count[C_BUDGET]);
    fprintf(stderr, "budget: frames waited %d times\n", waits);
    assert_int_equal(waited, 0);
    assert_true(waits >= 1);
    assert_sealed_clean(&job);
    tt_job_free(&job);
}

enum { F_PROBED = 2 };

static int body_probe(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    TT_CHECK(init_watched(job, rank, NULL, NULL) == 0);
    TT_CHECK(call_all(job, rank) == 0);
    if (rank == 1) { /* worker 1's own connection to worker 2 is open: the probe PINGs on it */
        int64_t v = 0;
        TT_CHECK(tt_call_add(tp_to_rank(2), 1, 2, TP_TIMEOUT_DEFAULT, &v) == TP_OK && v == 3);
    }
    atomic_fetch_add(&sh->count[C_READY], 1);
    TT_CHECK(tt_await_flag(sh, F_PROBED, 1, 60) == 0);
    TT_CHECK(call_all(job, rank) == 0);
    TT_CHECK(shutdown_watched() == 0);
    return 0;
}

/* Starts a job of three running body, waits until each worker counted
 * itself ready, then connects *im to worker 1 as "worker 2" and has its
 * sealed PING answered. */
static void start_with_impostor(tt_job *job, tt_body body, impostor *im) {
    assert_int_equal(tt_spawn(job, 3, body, NULL), 0);
    uint64_t deadline = tt_now_ns() + 30000000000ull;
    while (atomic_load(&job->shared->count[C_READY]) < 3 && tt_now_ns() < deadline)
        usleep(1000);
    assert_int_equal(atomic_load(&job->shared->count[C_READY]), 3);
    char addr[128];
    tt_worker_addr(job->store_port, 1, addr, sizeof addr);
    impostor_open(im, addr);
    ping_pong(im);
}

/* spec: TCP-7, TCP-21: worker 1's accepted connection from "worker 2" (an
 * impostor with the secret, its sealed PING answered first) ends without
 * ABORT, so worker 1 probes the real worker 2 with a sealed PING on its own
 * connection; worker 2's sealed PONG comes back ("still answers", peer-down
 * TP_EIO for the broken connection only) and the real peers still call
 * each other, no record failing to open, no warning. */
static void test_tcp_crypt_probe(void **state) {
    (void)state;
    tt_job job = {0};
    impostor im;
    start_with_impostor(&job, body_probe, &im);
    impostor_close(&im);                     /* end of file, no ABORT: TCP-7's probe */
    uint64_t deadline = tt_now_ns() + 10000000000ull; /* the probe's 5 s, and room */
    while (atomic_load(&job.shared->count[C_ANSWERS]) < 1 && tt_now_ns() < deadline)
        usleep(1000);
    int answers = atomic_load(&job.shared->count[C_ANSWERS]);
    atomic_store(&job.shared->flag[F_PROBED], 1);
    int waited = tt_wait(&job, 60);
    assert_true(answers >= 1);
    assert_int_equal(waited, 0);
    assert_sealed_clean(&job);
    tt_job_free(&job);
}

/* TCP-19, TCP-21: sealed records read behind a header that waits for the
 * read budget are opened once it is admitted, without waiting for more
 * bytes. Worker 1 has rx_budget 100000; impostor A (as worker 2) starts a
 * frame of 99,000 bytes (admitted, its body not all sent); impostor B sends,
 * in one write, a frame of 2,000 bytes (its header waits) and a PING behind
 * it, both read into B's buffer, unopened; A's rest comes, A's frame ends,
 * B's is admitted: B's PING is answered at once, nothing more sent on B. */
enum { F_SD_DONE = 6 };

static int body_sealed_behind(tt_job *job, int rank) {
    TT_CHECK(init_watched(job, rank, "rx_budget", "100000") == 0);
    atomic_fetch_add(&job->shared->count[C_READY], 1);
    TT_CHECK(tt_await_flag(job->shared, F_SD_DONE, 1, 60) == 0);
    TT_CHECK(call_all(job, rank) == 0);
    TT_CHECK(shutdown_watched() == 0);
    return 0;
}

/* A frame of total bytes (header included) as worker 2 would send it: a
 * RESPONSE to no call (id 0), which the core drops; its body zeros. */
static uint8_t *stray_response(size_t total) {
    uint8_t *f = calloc(1, total);
    assert_non_null(f);
    tt_frame_header(f, TPI_WIRE_VERSION, 2, (uint32_t)(total - 24));
    return f;
}

static void test_tcp_crypt_records_behind_a_waiting_header(void **state) {
    (void)state;
    tt_job job = {0};
    impostor a, b;
    start_with_impostor(&job, body_sealed_behind, &a);
    char addr[128];
    tt_worker_addr(job.store_port, 1, addr, sizeof addr);
    impostor_open(&b, addr);
    ping_pong(&b);
    enum { A_LEN = 99000, A_FIRST = 1024, B_LEN = 2000 };
    uint8_t *fa = stray_response(A_LEN), *fb = stray_response(B_LEN);
    send_sealed(&a, fa, A_FIRST); /* admitted: 99,000 of the 100,000 */
    usleep(100000);
    uint8_t ping[TPI_TCP_RECORD_SIZE];
    tpi_tcp_ctl_encode(ping, TPI_TCP_CTL_PING, 2);
    uint8_t *s1 = NULL, *s2 = NULL;
    size_t n1 = seal(&b, fb, B_LEN, &s1), n2 = seal(&b, ping, sizeof ping, &s2);
    uint8_t *both = malloc(n1 + n2);
    assert_non_null(both);
    memcpy(both, s1, n1);
    memcpy(both + n1, s2, n2);
    tt_raw_send(b.fd, both, n1 + n2); /* B's header waits; its PING is read behind it */
    free(both);
    free(s1);
    free(s2);
    usleep(200000);
    struct pollfd p = {b.fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 0), 0);            /* no PONG while B's frame waits */
    send_sealed(&a, fa + A_FIRST, A_LEN - A_FIRST); /* A's frame ends: B's is admitted */
    p.revents = 0;
    int ready = poll(&p, 1, 2000 * TT_SLOWDOWN);
    uint8_t rec[TPI_TCP_RECORD_SIZE] = {0};
    if (ready == 1)
        recv_sealed_record(&b, rec);
    free(fa);
    free(fb);
    ping_pong(&a); /* A's connection still serves */
    impostor_close(&a);
    impostor_close(&b);
    atomic_store(&job.shared->flag[F_SD_DONE], 1);
    int waited = tt_wait(&job, 60);
    tt_job_free(&job);
    assert_int_equal(ready, 1);
    assert_int_equal(tpi_tcp_ctl_kind_of(rec), TPI_TCP_CTL_PONG);
    assert_int_equal(waited, 0);
}

enum { F_BYE_GO = 3 };

static int body_bye(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    TT_CHECK(init_watched(job, rank, NULL, NULL) == 0);
    TT_CHECK(call_all(job, rank) == 0); /* a connection each way between every pair */
    atomic_fetch_add(&sh->count[C_READY], 1);
    TT_CHECK(tt_await_flag(sh, F_BYE_GO, 1, 60) == 0);
    TT_CHECK(shutdown_watched() == 0);
    return 0;
}

/* spec: TCP-8, TCP-21: a graceful shutdown of every worker with encrypt=on
 * returns TP_OK on each, no record fails to open and no worker warns of a
 * peer down (a BYE that does not open is a protocol error at an acceptor, a
 * warning). Which BYEs the workers read depends on who stops first, so an
 * observer makes it certain: a connection to worker 1 as "worker 2" (an
 * impostor with the secret, idle after its PING is answered) gets worker
 * 1's BYE as the next sealed record, before the end of file. */
static void test_tcp_crypt_bye(void **state) {
    (void)state;
    tt_job job = {0};
    impostor im;
    start_with_impostor(&job, body_bye, &im);
    atomic_store(&job.shared->flag[F_BYE_GO], 1);
    int waited = tt_wait(&job, 90);
    fprintf(stderr, "bye: %d peer-downs after a BYE between workers\n",
            atomic_load(&job.shared->count[C_BYE]));
    assert_int_equal(waited, 0);
    assert_sealed_clean(&job);
    /* Worker 1 is gone; what it wrote waits in our socket. */
    uint8_t rec[TPI_TCP_RECORD_SIZE], bye[TPI_TCP_RECORD_SIZE];
    recv_sealed_record(&im, rec);
    tpi_tcp_ctl_encode(bye, TPI_TCP_CTL_BYE, 1);
    assert_memory_equal(rec, bye, sizeof rec);
    tt_expect_dropped(im.fd);
    im.fd = -1;
    impostor_close(&im);
    tt_job_free(&job);
}

/* spec: TCP-17: tp_job_secret_new writes 64 hex digits and a NUL into a
 * buffer of at least 65 bytes, fresh each call; a buffer one byte short (or
 * none) is refused with the size it needs and not written. */
static void test_job_secret_new_buffer(void **state) {
    (void)state;
    char a[2 * TPI_TCP_JOB_SECRET_BYTES + 1], b[sizeof a];
    assert_int_equal(tp_job_secret_new(a, sizeof a), TP_OK);
    assert_int_equal(tp_job_secret_new(b, sizeof b), TP_OK);
    assert_int_equal(strlen(a), sizeof a - 1);
    assert_int_equal(strspn(a, "0123456789abcdef"), sizeof a - 1);
    assert_string_not_equal(a, b);
    char shorter[sizeof a - 1];
    memset(shorter, 'x', sizeof shorter);
    assert_int_equal(tp_job_secret_new(shorter, sizeof shorter), TP_EINVAL);
    assert_non_null(strstr(tp_errmsg(), "a buffer of 65 bytes is needed"));
    for (size_t i = 0; i < sizeof shorter; i++)
        assert_int_equal(shorter[i], 'x');
    assert_int_equal(tp_job_secret_new(NULL, sizeof a), TP_EINVAL);
}

/* tpi_tcp_auth_setup with the backend option secret=hex: its status, the
 * message in err. */
static tp_status setup_with_secret(const char *hex, tpi_tcp_auth *auth, char *err, size_t len) {
    tp_options *o = tp_options_new();
    assert_non_null(o);
    assert_int_equal(tp_options_set(o, "secret", hex), TP_OK);
    err[0] = '\0';
    tp_status st = tpi_tcp_auth_setup(o, auth, err, len);
    tp_options_free(o);
    return st;
}

/* TCP-11: a kept store server is reused only under the same key. Two keys
 * are the same only when every byte is: one that differs in any single byte,
 * the first or the last, is another job's (an HMAC-derived key never differs
 * in one byte alone, so only keys made here can say it). */
static void test_auth_same_compares_every_byte(void **state) {
    (void)state;
    tpi_tcp_auth a = {.on = 1}, b;
    for (size_t i = 0; i < sizeof a.key; i++)
        a.key[i] = (uint8_t)(i * 37 + 11);
    b = a;
    assert_true(tpi_tcp_auth_same(&a, &b));
    for (size_t i = 0; i < sizeof a.key; i++) {
        b = a;
        b.key[i] ^= 0x80;
        if (tpi_tcp_auth_same(&a, &b))
            fail_msg("keys that differ in byte %zu of %zu compare the same", i, sizeof a.key);
    }
    b = a;
    b.on = 0;
    assert_false(tpi_tcp_auth_same(&a, &b));
}

/* spec: TCP-17: the job secret is 16 to 128 bytes written as hex, either
 * case (upper and lower give the same key, and another secret another);
 * a character that is no hex digit is named by its position, first or
 * second of its byte; a length out of bounds or odd is refused with the
 * rule. */
static void test_job_secret_parsed(void **state) {
    (void)state;
    char lower[2 * TPI_TCP_SECRET_MAX + 3], upper[sizeof lower], err[TP_ERRMSG_LEN_MAX];
    for (size_t i = 0; i < sizeof lower - 1; i++)
        lower[i] = "0123456789abcdef"[(i * 7 + 3) % 16];
    lower[64] = '\0';
    for (size_t i = 0; i <= 64; i++)
        upper[i] = (char)toupper((unsigned char)lower[i]);
    tpi_tcp_auth a, b;
    assert_int_equal(setup_with_secret(lower, &a, err, sizeof err), TP_OK);
    assert_int_equal(setup_with_secret(upper, &b, err, sizeof err), TP_OK);
    assert_true(a.on && b.on);
    assert_true(tpi_tcp_auth_same(&a, &b));
    upper[0] = upper[0] == 'F' ? 'E' : 'F';
    assert_int_equal(setup_with_secret(upper, &b, err, sizeof err), TP_OK);
    assert_false(tpi_tcp_auth_same(&a, &b));
    static const size_t bad_at[] = {0, 1, 34, 63};
    for (size_t k = 0; k < sizeof bad_at / sizeof bad_at[0]; k++) {
        char hex[65], want[48];
        memcpy(hex, lower, sizeof hex);
        hex[bad_at[k]] = 'g';
        assert_int_equal(setup_with_secret(hex, &b, err, sizeof err), TP_EINVAL);
        snprintf(want, sizeof want, "character %zu is not a hex digit", bad_at[k]);
        if (!strstr(err, want))
            fail_msg("'%s' lacks '%s'", err, want);
        assert_non_null(strstr(err, "the backend option 'secret'"));
    }
    /* 32 and 256 digits are the bounds; 30, 31, 33 and 258 are not. */
    static const size_t digits[] = {30, 31, 32, 33, 256, 258};
    for (size_t k = 0; k < sizeof digits / sizeof digits[0]; k++) {
        char hex[sizeof lower];
        for (size_t i = 0; i < digits[k]; i++)
            hex[i] = "0123456789abcdef"[i % 16];
        hex[digits[k]] = '\0';
        tp_status st = setup_with_secret(hex, &b, err, sizeof err);
        int ok = digits[k] == 32 || digits[k] == 256;
        assert_int_equal(st, ok ? TP_OK : TP_EINVAL);
        if (!ok) {
            char want[64];
            snprintf(want, sizeof want, "16 to 128 bytes written as hex (%zu characters given)",
                     digits[k]);
            if (!strstr(err, want))
                fail_msg("'%s' lacks '%s'", err, want);
        }
    }
    tpi_tcp_auth_clear(&a);
    tpi_tcp_auth_clear(&b);
}

/* spec: TCP-17: the job key is HMAC-SHA-256(secret, "tensorplay-rpc key v1"),
 * all 32 bytes, and a proof is the first TPI_TCP_PROOF_SIZE bytes of
 * HMAC-SHA-256(key, label || context): computed here with OpenSSL alone,
 * so a derivation both ends share but the spec does not is caught. */
static void test_auth_known_answer(void **state) {
    (void)state;
    char err[TP_ERRMSG_LEN_MAX];
    uint8_t secret[16];
    char hex[2 * sizeof secret + 1];
    for (size_t i = 0; i < sizeof secret; i++) {
        secret[i] = (uint8_t)(0xf0 + i);
        snprintf(hex + 2 * i, 3, "%02x", secret[i]);
    }
    tpi_tcp_auth a;
    assert_int_equal(setup_with_secret(hex, &a, err, sizeof err), TP_OK);
    uint8_t want[32];
    unsigned int n = 0;
    static const char label[] = "tensorplay-rpc key v1";
    assert_non_null(HMAC(EVP_sha256(), secret, sizeof secret, (const unsigned char *)label,
                         sizeof label - 1, want, &n));
    assert_int_equal(n, 32);
    assert_int_equal(sizeof a.key, 32);
    assert_memory_equal(a.key, want, 32);
    static const char plabel[] = "tp/conn/dial v1";
    const uint8_t ctx[5] = {1, 2, 3, 4, 5};
    uint8_t msg[sizeof plabel - 1 + sizeof ctx], proof[TPI_TCP_PROOF_SIZE], mac[32];
    memcpy(msg, plabel, sizeof plabel - 1);
    memcpy(msg + sizeof plabel - 1, ctx, sizeof ctx);
    assert_non_null(HMAC(EVP_sha256(), want, 32, msg, sizeof msg, mac, &n));
    assert_int_equal(tpi_tcp_auth_proof(&a, plabel, ctx, sizeof ctx, proof), 0);
    assert_memory_equal(proof, mac, TPI_TCP_PROOF_SIZE);
    tpi_tcp_auth_clear(&a);
    /* Every byte of a nonce is drawn: the last is not always what was there. */
    int last_moved = 0;
    for (int i = 0; i < 32; i++) {
        uint8_t nonce[TPI_TCP_NONCE_SIZE] = {0};
        assert_int_equal(tpi_tcp_auth_nonce(nonce), 0);
        last_moved |= nonce[TPI_TCP_NONCE_SIZE - 1] != 0;
    }
    assert_true(last_moved);
}

/* spec: TCP-17: without the backend option 'secret' (unset or empty) the
 * secret comes from TP_SECRET, and an unusable one is named as that. */
static void test_job_secret_from_the_environment(void **state) {
    (void)state;
    const char *was = getenv("TP_SECRET");
    char *keep = was ? strdup(was) : NULL;
    char err[TP_ERRMSG_LEN_MAX];
    tpi_tcp_auth a, b;
    assert_int_equal(setenv("TP_SECRET", "abc", 1), 0);
    tp_options *o = tp_options_new();
    assert_non_null(o);
    err[0] = '\0';
    assert_int_equal(tpi_tcp_auth_setup(o, &a, err, sizeof err), TP_EINVAL);
    if (!strstr(err, "the job secret in TP_SECRET is not usable"))
        fail_msg("'%s'", err);
    tp_options_free(o);
    assert_int_equal(setup_with_secret("", &a, err, sizeof err), TP_EINVAL);
    assert_non_null(strstr(err, "in TP_SECRET is not usable"));
    static const char hex[] = "00112233445566778899aabbccddeeff";
    assert_int_equal(setenv("TP_SECRET", hex, 1), 0);
    assert_int_equal(setup_with_secret("", &a, err, sizeof err), TP_OK);
    assert_int_equal(setup_with_secret(hex, &b, err, sizeof err), TP_OK);
    assert_true(a.on && tpi_tcp_auth_same(&a, &b));
    if (keep)
        setenv("TP_SECRET", keep, 1);
    else
        unsetenv("TP_SECRET");
    free(keep);
    tpi_tcp_auth_clear(&a);
    tpi_tcp_auth_clear(&b);
}

/* OpenSSL's EVP_EncryptFinal_ex, except that the next fail_final calls
 * fail as a provider may (0, nothing written): the library's calls come
 * here first (the executable's definition wins). */
static atomic_int fail_final;

int EVP_EncryptFinal_ex(EVP_CIPHER_CTX *ctx, unsigned char *out, int *outl) {
    static int (*real)(EVP_CIPHER_CTX *, unsigned char *, int *);
    if (!real) {
        void *p = dlsym(RTLD_NEXT, "EVP_EncryptFinal_ex");
        memcpy(&real, &p, sizeof real);
    }
    if (atomic_load(&fail_final) > 0 && atomic_fetch_sub(&fail_final, 1) > 0) {
        *outl = 0;
        return 0;
    }
    return real(ctx, out, outl);
}

/* spec: TCP-21: a record whose sealing OpenSSL fails at any step is not
 * written: the seal fails (the connection then fails, TCP-7), here when
 * the final step fails though it wrote nothing, as GCM's never does. */
static void test_tcp_seal_fails_with_openssl(void **state) {
    (void)state;
    uint8_t key[TPI_TCP_SEAL_KEY_SIZE];
    memset(key, 7, sizeof key);
    tpi_tcp_cipher tx, rx;
    /* Whatever the structs held before (a reused one), init starts each
     * at sequence 0: the first record opens on a fresh receiver. */
    memset(&tx, 0xff, sizeof tx);
    memset(&rx, 0xff, sizeof rx);
    assert_int_equal(tpi_tcp_seal_init(&tx, key, 1), 0);
    assert_int_equal(tpi_tcp_seal_init(&rx, key, 0), 0);
    assert_true(tx.seq == 0 && rx.seq == 0);
    uint8_t plain[100], out[200], back[100];
    memset(plain, 1, sizeof plain);
    struct iovec v = {plain, sizeof plain};
    assert_true(tpi_tcp_sealed_size(sizeof plain) <= sizeof out);
    assert_int_equal(tpi_tcp_seal(&tx, &v, 1, sizeof plain, out), 0);
    assert_int_equal(tpi_tcp_seal_len(out), sizeof plain);
    assert_int_equal(tpi_tcp_open(&rx, out, back), 0);
    assert_memory_equal(back, plain, sizeof plain);
    tpi_tcp_seal_clear(&rx);
    fail_final = 1;
    int rc = tpi_tcp_seal(&tx, &v, 1, sizeof plain, out);
    fail_final = 0;
    assert_int_equal(rc, -1);
    tpi_tcp_seal_clear(&tx);
}

static int body_seal_fails(tt_job *job, int rank) {
    tp_options *o = crypt_options(job, "on");
    TT_CHECK(o && tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        int64_t v = 0;
        TT_CHECK(tt_call_add(tp_to_rank(1), 1, 2, 5, &v) == TP_OK && v == 3);
        atomic_store(&fail_final, 1); /* the next record sealed: this call's */
        uint64_t t0 = tt_now_ns();
        tp_status st = tt_call_add(tp_to_rank(1), 2, 3, 5, &v);
        uint64_t took = tt_now_ns() - t0;
        if (st == TP_OK || !strstr(tp_errmsg(), "cannot seal what it writes"))
            fprintf(stderr, "a call whose seal fails: %s: %s\n", tp_status_name(st), tp_errmsg());
        TT_CHECK(st == TP_EIO && strstr(tp_errmsg(), "cannot seal what it writes"));
        TT_CHECK(took < 2000000000ull); /* at once, not at its 5 s deadline */
        TT_CHECK(tt_call_add(tp_to_rank(1), 4, 5, 5, &v) == TP_OK && v == 9); /* a new connection */
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* spec: TCP-21, TCP-6: a record the loop cannot seal (OpenSSL fails) is
 * never written: the connection fails and the call on it ends TP_EIO at
 * once, saying why; the next call seals on a new connection. */
static void test_tcp_crypt_seal_failure_fails_the_connection(void **state) {
    (void)state;
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 2, body_seal_fails, NULL), 0);
    assert_int_equal(tt_wait(&job, 60), 0);
    tt_job_free(&job);
}

int main(int argc, char **argv) {
    if (argc > 1) /* one test by name (a cmocka pattern) */
        cmocka_set_test_filter(argv[1]);
    tt_ensure_secret();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_crypt_calls),
        cmocka_unit_test(test_tcp_crypt_unsent_counted_down),
        cmocka_unit_test(test_tcp_crypt_mismatch),
        cmocka_unit_test(test_tcp_crypt_tampered),
        cmocka_unit_test(test_tcp_crypt_capture),
        cmocka_unit_test(test_tcp_crypt_idle),
        cmocka_unit_test(test_tcp_crypt_read_budget_waits),
        cmocka_unit_test(test_tcp_crypt_records_behind_a_waiting_header),
        cmocka_unit_test(test_tcp_crypt_seal_failure_fails_the_connection),
        cmocka_unit_test(test_tcp_crypt_probe),
        cmocka_unit_test(test_tcp_crypt_bye),
        cmocka_unit_test(test_tcp_crypt_options),
        cmocka_unit_test(test_job_secret_new_buffer),
        cmocka_unit_test(test_job_secret_parsed),
        cmocka_unit_test(test_auth_known_answer),
        cmocka_unit_test(test_job_secret_from_the_environment),
        cmocka_unit_test(test_auth_same_compares_every_byte),
        cmocka_unit_test(test_tcp_seal_fails_with_openssl),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
