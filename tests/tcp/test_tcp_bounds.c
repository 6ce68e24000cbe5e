/*
 * test_tcp_bounds.c: a TCP worker against peers that do not follow the
 * protocol, and against its own exhaustion (spec/tcp.md TCP-19, TCP-20;
 * issue 8): every bound crossed gives a clear verdict on that one
 * connection, and the worker keeps serving its well-behaved peers.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cmocka.h>

#include "real/tcp_internal.h"
#include "tcp_harness.h"
#include "tcp_raw.h"

enum { F_FULL = 0, F_FREED = 1, F_DONE = 2, F_GO = 3, C_READY = 0, C_REDIALS = 1, C_LOGGED = 2, C_CALLS = 3, C_PROBED = 4 };

/* ---- Helpers -------------------------------------------------------------------------- */

/* Waits until count i of the job reaches v; 0 when it did within timeout_s. */
static int await_count(tt_shared *sh, int i, int v, double timeout_s) {
    uint64_t end = tt_now_ns() + (uint64_t)(timeout_s * 1e9);
    while (atomic_load(&sh->count[i]) < v && tt_now_ns() < end)
        usleep(1000);
    return atomic_load(&sh->count[i]) >= v ? 0 : -1;
}

static double secs_since(uint64_t t0) {
    return (double)(tt_now_ns() - t0) / 1e9;
}

/* What a test's log callback counts: messages holding its needle. */
static const char *log_needle;

static void count_logged(tp_log_level level, const char *msg, void *user) {
    (void)level;
    tt_shared *sh = user;
    if (getenv("TT_LOG"))
        fprintf(stderr, "[%.3f] %s\n", (double)tt_now_ns() / 1e9, msg);
    if (log_needle && strstr(msg, log_needle))
        atomic_fetch_add(&sh->count[C_LOGGED], 1);
    if (strstr(msg, "still answers")) /* a probe's verdict (TCP-7) */
        atomic_fetch_add(&sh->count[C_PROBED], 1);
}

/* Every worker: init with the test's options on worker 1, then rank 0 calls
 * worker 1 every few ms until the parent is done attacking it (each call
 * must succeed: the attack costs the well-behaved peer nothing), then every
 * pair calls, and a graceful shutdown sees nobody down. */
typedef struct attacked_args {
    const char *opts[8]; /* key, value pairs for worker 1 */
    const char *needle;  /* worker 1's log messages to count */
} attacked_args;

static int body_attacked(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    const attacked_args *args = job->arg;
    tp_options *o = tt_options(job, 20, 10);
    TT_CHECK(o);
    if (rank == 1) {
        for (int i = 0; i < 8 && args->opts[i]; i += 2)
            TT_CHECK(tp_options_set(o, args->opts[i], args->opts[i + 1]) == TP_OK);
        log_needle = args->needle;
        tp_set_log_level(TP_LOG_DEBUG);
        tp_set_log_callback(count_logged, sh);
    }
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    atomic_fetch_add(&sh->count[C_READY], 1);
    if (rank == 0) {
        while (!atomic_load(&sh->flag[F_DONE])) {
            int64_t v = 0;
            TT_CHECK(tt_call_add(tp_to_rank(1), 1, 2, 10, &v) == TP_OK && v == 3);
            atomic_fetch_add(&sh->count[C_CALLS], 1);
            usleep(5000);
        }
    }
    TT_CHECK(tt_await_flag(sh, F_DONE, 1, 60) == 0);
    for (int r = 0; r < job->world; r++) {
        int64_t v = 0;
        TT_CHECK(tt_call_add(tp_to_rank(r), rank, r, 20, &v) == TP_OK && v == rank + r);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void attack_start(tt_job *job, attacked_args *args, char *addr1, size_t len) {
    assert_int_equal(tt_spawn(job, 3, body_attacked, args), 0);
    assert_int_equal(await_count(job->shared, C_READY, 3, 30), 0);
    tt_worker_addr(job->store_port, 1, addr1, len);
}

/* The attack is over: worker 0's calls ran through it, and the job ends well. */
static void attack_end(tt_job *job, int calls_before, int probes) {
    assert_true(atomic_load(&job->shared->count[C_CALLS]) > calls_before);
    /* An impostor's connection that ended without ABORT makes worker 1 probe
     * worker 2 (TCP-7), whose verdict, TP_EIO, fails the calls in flight to
     * worker 2 at that moment: it lands before the workers call each other. */
    assert_int_equal(await_count(job->shared, C_PROBED, probes, 20), 0);
    atomic_store(&job->shared->flag[F_DONE], 1);
    assert_int_equal(tt_wait(job, 60), 0);
    tt_job_free(job);
}

static void count_redials(tp_log_level level, const char *msg, void *user) {
    (void)level;
    tt_shared *sh = user;
    if (strstr(msg, "dial to worker 1") && strstr(msg, "failed"))
        atomic_fetch_add(&sh->count[C_REDIALS], 1);
}

/* Opens descriptors until the process has none left; returns how many. */
static int exhaust(int *fds, int cap) {
    int n = 0;
    while (n < cap) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            break;
        fds[n++] = fd;
    }
    return n;
}

#define FILL_MAX 4096

/* spec: TCP-20. Worker 1 runs out of descriptors; worker 3 then dials it for
 * the first time (init's warm-up ring of four dialed 0->1, 1->2, 2->3, 3->0
 * for the calls and the other way for the answers) and the dial is reset
 * by libuv, which accepts and closes what it cannot keep. That is no
 * evidence of death: worker 3 dials again until worker 1 has
 * descriptors again, its call succeeds, and nobody reports anyone down. */
static int body_exhausted(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    tp_set_log_level(TP_LOG_INFO);
    tp_set_log_callback(count_redials, sh);
    tp_options *o = tt_options(job, 20, 10);
    TT_CHECK(o && tt_init(job, rank, o) == 0);
    tp_options_free(o);
    atomic_fetch_add(&sh->count[C_READY], 1);
    if (rank == 1) {
        uint64_t t_ready = tt_now_ns();
        while (atomic_load(&sh->count[C_READY]) < job->world &&
               tt_now_ns() - t_ready < 30000000000ull)
            usleep(1000);
        static int fds[FILL_MAX];
        struct rlimit rl;
        TT_CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
        struct rlimit low = rl;
        low.rlim_cur = 256; /* so that filling it is quick */
        TT_CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
        int n = exhaust(fds, FILL_MAX);
        TT_CHECK(n > 0 && n < FILL_MAX);
        atomic_store(&sh->flag[F_FULL], 1);
        /* Full until worker 3's dial failed twice. */
        uint64_t t0 = tt_now_ns();
        while (atomic_load(&sh->count[C_REDIALS]) < 2 && tt_now_ns() - t0 < 10000000000ull)
            usleep(1000);
        for (int i = 0; i < n; i++)
            close(fds[i]);
        TT_CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
        atomic_store(&sh->flag[F_FREED], 1);
    }
    if (rank == 3) {
        TT_CHECK(tt_await_flag(sh, F_FULL, 1, 30) == 0);
        int64_t v = 0;
        TT_CHECK(tt_call_add(tp_to_rank(1), 40, 2, 20, &v) == TP_OK && v == 42);
        TT_CHECK(atomic_load(&sh->flag[F_FREED]) == 1);
        TT_CHECK(atomic_load(&sh->count[C_REDIALS]) >= 2);
    }
    TT_CHECK(tt_await_flag(sh, F_FREED, 1, 30) == 0);
    for (int r = 0; r < job->world; r++) {
        int64_t v = 0;
        TT_CHECK(tt_call_add(tp_to_rank(r), rank, r, 20, &v) == TP_OK && v == rank + r);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK); /* nobody was declared down */
    return 0;
}

static void test_tcp_descriptors_exhausted(void **state) {
    (void)state;
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 4, body_exhausted, NULL), 0);
    assert_int_equal(tt_wait(&job, 90), 0);
    tt_job_free(&job);
}

/* ---- Slow senders: the hello and frame deadlines, the read budget (TCP-19) ------------ */

/* spec: TCP-19. A stranger that says nothing is dropped at hello_timeout; a
 * worker whose frame stops halfway is aborted at its frame deadline; a
 * header past rx_budget is not read (nor its frame allocated) until the
 * frames being read end, while frames that fit pass it. Worker 0's calls
 * go on throughout. */
static void test_tcp_slow_senders(void **state) {
    (void)state;
    attacked_args args = {{"hello_timeout", "0.5", "frame_timeout", "1", "rx_budget", "100000"},
                          "bytes are being read"};
    tt_job job = {0};
    char addr[128];
    attack_start(&job, &args, addr, sizeof addr);
    int calls = atomic_load(&job.shared->count[C_CALLS]);

    /* Silence after connecting: dropped at the hello deadline. */
    int fd = tt_raw_connect(addr);
    uint64_t t0 = tt_now_ns();
    tt_expect_dropped(fd);
    assert_true(secs_since(t0) > 0.3);

    /* A frame of 90,000 bytes that stops after 100 of its body. */
    uint8_t h[24], body[100] = {0};
    int a = tt_hello_as_worker2(addr);
    tt_frame_header(h, TPI_WIRE_VERSION, 1, 90000);
    tt_raw_send(a, h, sizeof h);
    tt_raw_send(a, body, sizeof body);
    t0 = tt_now_ns();
    /* A second one while the first is read: 2 x 90,024 bytes pass the
     * budget of 100,000, so it waits, unread and unallocated. */
    int b = tt_hello_as_worker2(addr);
    tt_frame_header(h, TPI_WIRE_VERSION, 1, 90000);
    tt_raw_send(b, h, sizeof h);
    tt_raw_send(b, body, sizeof body);
    assert_int_equal(await_count(job.shared, C_LOGGED, 1, 5), 0);
    /* The first is aborted at its deadline (1 s + 90 ms for its size)... */
    tt_expect_abort_then_dropped(a);
    double first = secs_since(t0);
    assert_true(first > 0.9);
    /* ... then the second is read, and is as slow. */
    tt_expect_abort_then_dropped(b);
    assert_true(secs_since(t0) > first + 0.5);
    attack_end(&job, calls, 0); /* aborted, not ended: no probe */
}

/* spec: TCP-19. Connections in their handshake beyond max_handshakes are
 * closed at once (and logged); the held ones go at the hello deadline, and
 * then a worker's connection is heard again; one peer's identified
 * connections past TPI_TCP_CONNS_PER_PEER_MAX are closed. */
static void test_tcp_handshake_cap(void **state) {
    (void)state;
    attacked_args args = {{"max_handshakes", "4", "hello_timeout", "1.5"}, "max_handshakes"};
    tt_job job = {0};
    char addr[128];
    attack_start(&job, &args, addr, sizeof addr);
    int calls = atomic_load(&job.shared->count[C_CALLS]);
    int held[4];
    for (int i = 0; i < 4; i++)
        held[i] = tt_raw_connect(addr);
    usleep(200000); /* worker 1 accepted them */
    uint64_t t0 = tt_now_ns();
    int extra = tt_raw_connect(addr);
    tt_expect_dropped(extra);
    assert_true(secs_since(t0) < 1.0); /* at once, not at the hello deadline */
    assert_int_equal(await_count(job.shared, C_LOGGED, 1, 5), 0);
    for (int i = 0; i < 4; i++)
        tt_expect_dropped(held[i]);
    /* Room again: a worker's handshake completes and a ping is answered. */
    int w = tt_hello_as_worker2(addr);
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    tpi_tcp_ctl_encode(rec, TPI_TCP_CTL_PING, 2);
    tt_raw_send(w, rec, sizeof rec);
    assert_int_equal(tt_raw_recv(w, rec, sizeof rec), sizeof rec);
    assert_int_equal(tpi_tcp_ctl_kind_of(rec), TPI_TCP_CTL_PONG);
    /* TPI_TCP_CONNS_PER_PEER_MAX: worker 2's own connection, w and two more
     * are four open as worker 2; a fifth is closed once it proved itself. */
    int more[2];
    for (int i = 0; i < 2; i++)
        more[i] = tt_hello_as_worker2(addr);
    int fifth = tt_hello_as_worker2(addr);
    tt_expect_dropped(fifth);
    for (int i = 0; i < 2; i++)
        close(more[i]);
    close(w);
    attack_end(&job, calls, 1);
}

/* ---- Idle connections (TCP-19) ------------------------------------------------------- */

static int body_idle(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    tp_options *o = tt_options(job, 20, 10);
    TT_CHECK(o && tp_options_set(o, "idle_timeout", "0.2") == TP_OK);
    log_needle = "asks worker";
    tp_set_log_level(TP_LOG_DEBUG);
    tp_set_log_callback(count_logged, sh);
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    atomic_fetch_add(&sh->count[C_READY], 1);
    /* After the parent's test of a dialer that ignores IDLE: the abort of
     * its connection fails the calls in flight to the worker it proved to
     * be (TCP-7), which are none yet. */
    TT_CHECK(tt_await_flag(sh, F_GO, 1, 60) == 0);
    /* Rounds of calls around the idle deadline: some start as the peer asks
     * us to close, and must neither be lost nor fail. */
    TT_CHECK(tt_idle_rounds(rank, 12) == 0);
    atomic_fetch_add(&sh->count[C_CALLS], 1);
    TT_CHECK(tt_await_flag(sh, F_DONE, 1, 60) == 0);
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* spec: TCP-19. Connections idle past idle_timeout are closed by IDLE and
 * CLOSE between workers, under calls racing the close, losing nothing; a
 * dialer that ignores IDLE is aborted after its grace. */
static void test_tcp_idle(void **state) {
    (void)state;
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 3, body_idle, NULL), 0);
    assert_int_equal(await_count(job.shared, C_READY, 3, 30), 0);
    char addr[128];
    tt_worker_addr(job.store_port, 1, addr, sizeof addr);
    int fd = tt_hello_as_worker2(addr);
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    assert_int_equal(tt_raw_recv(fd, rec, sizeof rec), sizeof rec);
    assert_int_equal(tpi_tcp_ctl_kind_of(rec), TPI_TCP_CTL_IDLE);
    tt_expect_abort_then_dropped(fd); /* we did not close it */
    atomic_store(&job.shared->flag[F_GO], 1);
    assert_int_equal(await_count(job.shared, C_CALLS, 3, 60), 0);
    assert_true(atomic_load(&job.shared->count[C_LOGGED]) >= 3);
    atomic_store(&job.shared->flag[F_DONE], 1);
    assert_int_equal(tt_wait(&job, 60), 0);
    tt_job_free(&job);
}

/* ---- Options (TCP-19) ------------------------------------------------------------------- */

static void expect_bad_option(const char *key, const char *value) {
    tp_options *o = NULL;
    assert_int_equal(tp_construct_rpc_backend_options("TENSORPIPE", &o), TP_OK);
    char m[64];
    snprintf(m, sizeof m, "tcp://127.0.0.1:%u", (unsigned)tt_free_port());
    tp_options_set_init_method(o, m);
    assert_int_equal(tp_options_set(o, key, value), TP_OK);
    tp_status st = tp_init_rpc("w", "TENSORPIPE", 0, 1, o);
    tp_options_free(o);
    if (st == TP_OK)
        tp_shutdown(0);
    assert_int_equal(st, TP_EINVAL);
    assert_non_null(strstr(tp_errmsg(), key));
    assert_non_null(strstr(tp_errmsg(), "only lower"));
}

/* spec: TCP-19: options lower the bounds, never raise them. */
static void test_tcp_bound_options(void **state) {
    (void)state;
    expect_bad_option("hello_timeout", "11");
    expect_bad_option("frame_timeout", "0");
    expect_bad_option("idle_timeout", "soon");
    expect_bad_option("rx_budget", "100");
    expect_bad_option("rx_budget", "-5");
    expect_bad_option("max_handshakes", "0");
    expect_bad_option("max_handshakes", "65");
}

int main(void) {
    tt_ensure_secret();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_descriptors_exhausted),
        cmocka_unit_test(test_tcp_slow_senders),
        cmocka_unit_test(test_tcp_handshake_cap),
        cmocka_unit_test(test_tcp_idle),
        /* Last: its init attempts take generations that later jobs forked
         * from this process would inherit (INIT-1). */
        cmocka_unit_test(test_tcp_bound_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
