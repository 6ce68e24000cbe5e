/*
 * fuzz_tcp_conn.c: any byte stream into a live TCP worker's connection
 * reader (real/tcp_conn.c: hello, authentication, control records, frame
 * headers and bodies as they arrive in pieces; spec/tcp.md TCP-3..5,
 * TCP-17, TCP-19; issue 8 item 7).
 *
 * This process is worker 0 of a job of two, its I/O thread the code under
 * test; a forked child is worker 1, a plain peer. The job has a secret
 * (TP_SECRET, set here), so the harness can prove itself as a member. Input:
 *   byte 0, bit 0:    0 = the stream starts the connection (hello and
 *                     authentication are the input's own); 1 = the harness
 *                     first completes a proved handshake as worker 1, so
 *                     the stream's records and frames reach the reader's
 *                     later states and worker 0's core;
 *   byte 0, bits 1-3: how the stream is cut into writes (whole, or pieces
 *                     of 1, 2, 7, 23, 24, 25 or 1000 bytes), so records and
 *                     headers arrive split across reads;
 *   the rest:         the stream, after which the harness closes its end.
 * Properties, a violation aborts:
 * - nothing crashes, trips an assertion, or (under ASan) leaks or reads out
 *   of bounds;
 * - after our end of file, worker 0 closes the connection within
 *   CLOSE_WAIT_S (no connection held forever);
 * - a member's handshake is accepted after any stream;
 * - worker 0 then still calls worker 1: add(20, 22) is 42, or fails with a
 *   clear error, since a member is trusted and may have told worker 0 that
 *   worker 1 is gone (TCP-14). A failed call restarts the job for the
 *   next input, so one input cannot blind the rest.
 * The job shuts down at exit, gracefully, so LeakSanitizer sees a clean
 * process.
 */
#define _GNU_SOURCE /* prctl */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "real/tcp_internal.h"
#include "tcp_raw.h"
#include "tensorplay/rpc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define WORLD 2
#define CLOSE_WAIT_S 10  /* after our end of file, worker 0 closes by then */
#define CALL_TIMEOUT_S 10
#define INIT_TIMEOUT_S 30

static const size_t piece_len[8] = {0, 1, 2, 7, 23, 24, 25, 1000};

static int up;             /* the job is running */
static pid_t peer_pid;     /* worker 1 */
static int peer_pipe = -1; /* closing it tells worker 1 to shut down */
static char addr0[TPI_ADDR_LEN_MAX];
static tpi_tcp_auth job_auth;
static int exit_hooked;
static unsigned gen; /* this process's init attempts so far (INIT-1) */

static void check(int ok, const char *what) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_tcp_conn: property violated: %s\n", what);
    abort();
}

static tp_status fn_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *user_data) {
    (void)kwargs;
    (void)user_data;
    int64_t a = 0, b = 0;
    if (tp_list_len(args) != 2 || tp_value_get_int(tp_list_get(args, 0), &a) != TP_OK ||
        tp_value_get_int(tp_list_get(args, 1), &b) != TP_OK) {
        tp_call_set_error(call, "add takes two ints");
        return TP_EINVAL;
    }
    *result = tp_value_int((int64_t)((uint64_t)a + (uint64_t)b)); /* wraps: any ints may come */
    return TP_OK;
}

/* Only errors: every refused stream is a warning, millions of them. */
static void quiet_log(tp_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == TP_LOG_ERROR || getenv("FUZZ_TCP_CONN_LOG"))
        fprintf(stderr, "fuzz_tcp_conn: %s\n", msg);
}

static uint16_t free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa;
    socklen_t n = sizeof sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    check(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
              getsockname(fd, (struct sockaddr *)&sa, &n) == 0,
          "a free port for the store");
    close(fd);
    return ntohs(sa.sin_port);
}

static tp_status init_as(int rank, uint16_t store_port) {
    char method[64], name[16];
    tp_options *o = NULL;
    if (tp_construct_rpc_backend_options("TENSORPIPE", &o) != TP_OK)
        return TP_ENOMEM;
    snprintf(method, sizeof method, "tcp://127.0.0.1:%u", store_port);
    snprintf(name, sizeof name, "worker%d", rank);
    tp_options_set_init_method(o, method);
    tp_options_set_init_timeout(o, INIT_TIMEOUT_S);
    tp_options_set_shutdown_timeout(o, 10);
    tp_options_set_num_worker_threads(o, 2);
    tp_status st = tp_init_rpc(name, "TENSORPIPE", rank, WORLD, o);
    tp_options_free(o);
    return st;
}

/* Worker 1: serves until the harness closes the pipe (or dies), then leaves. */
static void peer_main(int rd, uint16_t store_port) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (init_as(1, store_port) != TP_OK) {
        fprintf(stderr, "fuzz_tcp_conn: worker 1 failed init: %s\n", tp_errmsg());
        _exit(1);
    }
    char c;
    while (read(rd, &c, 1) < 0 && errno == EINTR) {
    }
    tp_shutdown(1);
    _exit(0);
}

static void job_down(void) {
    if (!up)
        return;
    up = 0;
    close(peer_pipe);
    peer_pipe = -1;
    tp_shutdown(1); /* worker 1 leaves at the same time; any outcome is fine here */
    for (int i = 0; i < 3000; i++) { /* 30 s */
        if (waitpid(peer_pid, NULL, WNOHANG) == peer_pid)
            return;
        usleep(10000);
    }
    kill(peer_pid, SIGKILL);
    waitpid(peer_pid, NULL, 0);
}

static void job_up(void) {
    if (up)
        return;
    char hex[80], err[TP_ERRMSG_LEN_MAX];
    if (!getenv("TP_SECRET")) {
        check(tp_job_secret_new(hex, sizeof hex) == TP_OK, "a job secret");
        setenv("TP_SECRET", hex, 1);
    }
    check(tpi_tcp_auth_setup(NULL, &job_auth, err, sizeof err) == TP_OK, "the job's key");
    tp_set_log_callback(quiet_log, NULL);
    tp_register_function("add", fn_add, NULL);
    uint16_t port = free_port();
    int p[2];
    check(pipe(p) == 0, "a pipe to worker 1");
    peer_pid = fork(); /* before init: this process has no threads yet */
    check(peer_pid >= 0, "fork worker 1");
    if (peer_pid == 0) {
        close(p[1]);
        peer_main(p[0], port);
    }
    close(p[0]);
    peer_pipe = p[1];
    up = 1;
    tp_status st = init_as(0, port);
    gen++;
    if (st != TP_OK) {
        fprintf(stderr, "fuzz_tcp_conn: worker 0 failed init: %s\n", tp_errmsg());
        abort();
    }
    check(tt_raw_worker_addr_in(port, gen - 1, 0, addr0, sizeof addr0) == 0, "worker 0's address");
    if (!exit_hooked) {
        exit_hooked = 1;
        atexit(job_down);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads and drops until worker 0 closes; 0 when it did not within CLOSE_WAIT_S. */
static int closed_by_peer(int fd) {
    double end = now_s() + CLOSE_WAIT_S;
    uint8_t b[4096];
    for (;;) {
        double left = end - now_s();
        struct pollfd pf = {fd, POLLIN, 0};
        if (left <= 0)
            return 0;
        int r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return 0;
        ssize_t k = recv(fd, b, sizeof b, 0);
        if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN))
            return 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    job_up();
    int member = data[0] & 1;
    size_t piece = piece_len[(data[0] >> 1) & 7];
    const uint8_t *s = data + 1;
    size_t n = size - 1;

    int fd = member ? tt_raw_hello_as(addr0, 1, 0, WORLD, &job_auth) : tt_raw_dial(addr0);
    check(fd >= 0, "worker 0 takes a connection (with a member's handshake when asked)");
    while (n > 0) {
        size_t k = piece && piece < n ? piece : n;
        if (tt_raw_send_all(fd, s, k) != 0)
            break; /* worker 0 closed early: the reader refused something */
        s += k;
        n -= k;
    }
    shutdown(fd, SHUT_WR);
    check(closed_by_peer(fd), "worker 0 closes the connection after our end of file");
    close(fd);

    tp_value *args = tp_value_list_of(2, tp_value_int(20), tp_value_int(22));
    tp_value *res = NULL;
    int64_t v = 0;
    /* A member's connection that ended without BYE makes worker 0 probe
     * worker 1, and a live answer fails the calls then in flight with the
     * transient TP_EIO (TCP-7), ours among them: one more try. */
    tp_status st = tp_rpc_sync(tp_to_rank(1), "add", args, NULL, CALL_TIMEOUT_S, &res);
    if (st == TP_EIO)
        st = tp_rpc_sync(tp_to_rank(1), "add", args, NULL, CALL_TIMEOUT_S, &res);
    if (st == TP_OK)
        check(tp_value_get_int(res, &v) == TP_OK && v == 42, "add(20, 22) on worker 1 is 42");
    else
        check(tp_errmsg()[0] != '\0', "a failed call says why");
    tp_value_free(args);
    tp_value_free(res);
    if (st != TP_OK) {
        if (getenv("FUZZ_TCP_CONN_LOG"))
            fprintf(stderr, "fuzz_tcp_conn: the call failed (%s: %s); a fresh job\n",
                    tp_status_name(st), tp_errmsg());
        job_down(); /* the next input gets a fresh job */
    }
    return 0;
}
