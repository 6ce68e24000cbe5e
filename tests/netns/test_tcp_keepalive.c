/*
 * test_tcp_keepalive.c: the keepalive and user timeout options of the TCP
 * backend (spec/tcp.md TCP-12, TCP-23) and peer_down_timeout (TCP-25):
 * malformed or out-of-range values fail init with TP_EINVAL naming the key
 * and its range, good keepalive values reach
 * every worker connection's socket. Runs on 127.0.0.1 as any user; the
 * network-namespace suite beside it (netns_test.sh) shows what the values
 * do when a host goes silent.
 */
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "tcp_harness.h"

/* Init of a world of one with pre_key=pre_value (when not NULL) and
 * key=value fails with TP_EINVAL, and the message names key and holds want. */
static void expect_bad_with(const char *pre_key, const char *pre_value, const char *key,
                            const char *value, const char *want) {
    tp_options *o = NULL;
    assert_int_equal(tp_construct_rpc_backend_options("TENSORPIPE", &o), TP_OK);
    char m[64];
    snprintf(m, sizeof m, "tcp://127.0.0.1:%u", (unsigned)tt_free_port());
    assert_int_equal(tp_options_set_init_method(o, m), TP_OK);
    if (pre_key)
        assert_int_equal(tp_options_set(o, pre_key, pre_value), TP_OK);
    assert_int_equal(tp_options_set(o, key, value), TP_OK);
    tp_status st = tp_init_rpc("w", "TENSORPIPE", 0, 1, o);
    tp_options_free(o);
    if (st == TP_OK)
        tp_shutdown(0);
    assert_int_equal(st, TP_EINVAL);
    if (!strstr(tp_errmsg(), key) || !strstr(tp_errmsg(), want))
        fail_msg("message '%s' lacks '%s' or '%s'", tp_errmsg(), key, want);
}

static void expect_bad(const char *key, const char *value, const char *want) {
    expect_bad_with(NULL, NULL, key, value, want);
}

/* spec: TCP-12, TCP-23, TCP-25: each option's range, and user_timeout's floor. */
static void test_tcp_keepalive_options_checked(void **state) {
    (void)state;
    expect_bad("keepalive_idle", "0", "[1, 7200]");
    expect_bad("keepalive_idle", "7201", "[1, 7200]");
    expect_bad("keepalive_idle", "1.5", "whole number");
    expect_bad("keepalive_idle", "-1", "whole number");
    expect_bad("keepalive_interval", "0", "[1, 600]");
    expect_bad("keepalive_interval", "soon", "[1, 600]");
    expect_bad("keepalive_count", "0", "[1, 127]");
    expect_bad("keepalive_count", "128", "[1, 127]");
    expect_bad("user_timeout", "0", "[1, 86400]");
    expect_bad("user_timeout", "86401", "[1, 86400]");
    /* Below the defaults' 30 + 5 * 3 = 45 s. */
    expect_bad("user_timeout", "44", "= 30 + 5 * 3 = 45 s");
    /* Below the lowered keepalive's 1 + 1 * 2 = 3 s. */
    expect_bad_with("keepalive_idle", "1", "user_timeout", "15", "1 + 5 * 3 = 16 s");
    /* TCP-25: 0 turns the verdict off; a day at most. */
    expect_bad("peer_down_timeout", "86401", "[0, 86400]");
    expect_bad("peer_down_timeout", "-1", "whole number");
    expect_bad("peer_down_timeout", "1m", "declared down");
    /* At the floor, and above the defaults: both fine. */
    tp_options *o = NULL;
    assert_int_equal(tp_construct_rpc_backend_options("TENSORPIPE", &o), TP_OK);
    char m[64];
    snprintf(m, sizeof m, "tcp://127.0.0.1:%u", (unsigned)tt_free_port());
    assert_int_equal(tp_options_set_init_method(o, m), TP_OK);
    assert_int_equal(tp_options_set(o, "keepalive_idle", "60"), TP_OK);
    assert_int_equal(tp_options_set(o, "keepalive_interval", "10"), TP_OK);
    assert_int_equal(tp_options_set(o, "keepalive_count", "6"), TP_OK);
    assert_int_equal(tp_options_set(o, "user_timeout", "120"), TP_OK);
    assert_int_equal(tp_options_set(o, "peer_down_timeout", "0"), TP_OK);
    assert_int_equal(tp_init_rpc("w", "TENSORPIPE", 0, 1, o), TP_OK);
    tp_options_free(o);
    assert_int_equal(tp_shutdown(1), TP_OK);
}

/* What rank 0 found on its sockets, for the parent. */
enum { C_WORKER_SOCKS = 0, C_WRONG = 1, C_STORE_SOCKS = 2 };

static int sock_int(int fd, int level, int name) {
    int v = -1;
    socklen_t len = sizeof v;
    return getsockopt(fd, level, name, &v, &len) == 0 ? v : -1;
}

static uint16_t sock_port(int fd, int peer) {
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    int rc = peer ? getpeername(fd, (struct sockaddr *)&sa, &len)
                  : getsockname(fd, (struct sockaddr *)&sa, &len);
    if (rc != 0 || sa.ss_family != AF_INET)
        return 0;
    return ntohs(((struct sockaddr_in *)&sa)->sin_port);
}

/* Every connected TCP socket of this process: a worker connection (neither
 * end the store's port) must carry the options 7 s, 3 s, 4 probes, 25 s,
 * and TCP_NODELAY (a small reply must not wait for the ack of the last);
 * a store connection keepalive at least. */
static void check_sockets(tt_shared *sh, uint16_t store_port) {
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd == dirfd(d) ||
            sock_int(fd, SOL_SOCKET, SO_TYPE) != SOCK_STREAM)
            continue;
        uint16_t lport = sock_port(fd, 0), pport = sock_port(fd, 1);
        if (lport == 0 || pport == 0)
            continue; /* not connected (a listener), or not IPv4 */
        if (lport == store_port || pport == store_port) {
            if (lport == store_port) /* the server's end of a store connection */
                atomic_fetch_add(&sh->count[C_STORE_SOCKS], 1);
            if (lport == store_port && sock_int(fd, SOL_SOCKET, SO_KEEPALIVE) != 1)
                atomic_fetch_add(&sh->count[C_WRONG], 1);
            continue;
        }
        atomic_fetch_add(&sh->count[C_WORKER_SOCKS], 1);
        if (sock_int(fd, SOL_SOCKET, SO_KEEPALIVE) != 1 ||
            sock_int(fd, IPPROTO_TCP, TCP_KEEPIDLE) != 7 ||
            sock_int(fd, IPPROTO_TCP, TCP_KEEPINTVL) != 3 ||
            sock_int(fd, IPPROTO_TCP, TCP_KEEPCNT) != 4 ||
            sock_int(fd, IPPROTO_TCP, TCP_USER_TIMEOUT) != 25000 ||
            sock_int(fd, IPPROTO_TCP, TCP_NODELAY) != 1) {
            fprintf(
                stderr,
                "fd %d (%u -> %u): keepalive %d idle %d intvl %d cnt %d user %d nodelay %d\n", fd,
                lport, pport, sock_int(fd, SOL_SOCKET, SO_KEEPALIVE),
                sock_int(fd, IPPROTO_TCP, TCP_KEEPIDLE), sock_int(fd, IPPROTO_TCP, TCP_KEEPINTVL),
                sock_int(fd, IPPROTO_TCP, TCP_KEEPCNT), sock_int(fd, IPPROTO_TCP, TCP_USER_TIMEOUT),
                sock_int(fd, IPPROTO_TCP, TCP_NODELAY));
            atomic_fetch_add(&sh->count[C_WRONG], 1);
        }
    }
    closedir(d);
}

enum { F_CHECKED = 0 };

static int body_applied(tt_job *job, int rank) {
    tp_options *o = tt_options(job, 20, 20);
    TT_CHECK(o && tp_options_set(o, "keepalive_idle", "7") == TP_OK &&
             tp_options_set(o, "keepalive_interval", "3") == TP_OK &&
             tp_options_set(o, "keepalive_count", "4") == TP_OK &&
             tp_options_set(o, "user_timeout", "25") == TP_OK);
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    /* Both directions: rank 0's outgoing connection and the one it accepted. */
    TT_CHECK(tt_all_answer(job, rank) == 0);
    if (rank == 0) {
        int64_t v = 0; /* rank 1 answered us on its own connection: both exist now */
        TT_CHECK(tt_call_add(tp_to_rank(1), 1, 1, 20, &v) == TP_OK);
        check_sockets(job->shared, job->store_port);
        atomic_store(&job->shared->flag[F_CHECKED], 1);
    }
    TT_CHECK(tt_await_flag(job->shared, F_CHECKED, 1, 30) == 0);
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* spec: TCP-23: the options reach the sockets of both ends of every worker
 * connection (set on the socket, not left to libuv's keepalive defaults),
 * with TCP_NODELAY. */
static void test_tcp_keepalive_options_applied(void **state) {
    (void)state;
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 2, body_applied, NULL), 0);
    assert_int_equal(tt_wait(&job, 60), 0);
    /* Rank 0's outgoing connection to rank 1 and the one rank 1 dialed. */
    assert_true(atomic_load(&job.shared->count[C_WORKER_SOCKS]) >= 2);
    assert_true(atomic_load(&job.shared->count[C_STORE_SOCKS]) >= 1);
    assert_int_equal(atomic_load(&job.shared->count[C_WRONG]), 0);
    tt_job_free(&job);
}

int main(void) {
    tt_ensure_secret();
    /* applied first: the inits of checked leave this process a store server
     * (TCP-11) whose sockets a forked rank would inherit and count. */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_keepalive_options_applied),
        cmocka_unit_test(test_tcp_keepalive_options_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
