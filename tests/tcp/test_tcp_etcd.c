/*
 * test_tcp_etcd.c: TCP jobs whose rendezvous store is etcd (init_method
 * etcd://..., spec/etcd.md ETCD-9), on a private etcd the test starts
 * (tests/unit/etcd_fixture.h; skipped without an etcd binary unless
 * TP_REQUIRE_ETCD=1). No worker serves the store, so rank 0 is a worker
 * like any other: killed mid-job, it comes back as a new incarnation
 * (REJOIN-1..7) and the job goes on and shuts down cleanly.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tcp_harness.h"
#include "tests/unit/etcd_fixture.h"

static tpe_etcd server;
static int server_state; /* 0: not tried; 1: up; 2: no binary; -1: failed */

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

/* The harness's options with the job's etcd URL (job->arg) as init_method. */
static tp_options *etcd_options(const tt_job *job) {
    tp_options *o = tt_options(job, 10, 10);
    if (o && tp_options_set_init_method(o, (const char *)job->arg) != TP_OK) {
        tp_options_free(o);
        return NULL;
    }
    return o;
}

/* ---- A job through etcd, initialised twice ----------------------------------------------- */

/* spec: ETCD-9. Every worker reaches every other and shuts down with
 * TP_OK, twice in the same processes (the second init's keys are g1/...). */
static int body_job(tt_job *job, int rank) {
    for (int round = 0; round < 2; round++) {
        tp_options *o = etcd_options(job);
        TT_CHECK(o && tt_init(job, rank, o) == 0);
        tp_options_free(o);
        TT_CHECK(tt_all_answer(job, rank) == 0);
        TT_CHECK(tp_shutdown(1) == TP_OK);
    }
    return 0;
}

static void test_tcp_etcd_job(void **state) {
    (void)state;
    const tpe_etcd *e = need_etcd();
    char url[160];
    snprintf(url, sizeof url, "etcd://%s/tp-tcp-%d-job", e->endpoint, (int)getpid());
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 3, body_job, url), 0);
    assert_int_equal(tt_wait(&job, 60), 0);
    tt_job_free(&job);
}

/* ---- Rank 0 killed and restarted ---------------------------------------------------------- */

enum { F_UP = 0, F_SAW_DEAD = 1, F_NEW_UP = 2, F_CALLED_NEW = 3, NS_REJOINED = 1 };

/* The lease's TTL in this job: shorter than the time rank 0 stays dead, so
 * a store whose keys lived only as long as their writer would lose rank
 * 0's keys (its init/rank/0, which the rejoin reads) before it is back. */
#define JOB_TTL_S 2
#define DEAD_FOR_MS 3000

/* spec: ETCD-9, REJOIN-1..7. Rank 0 is killed after rank 1 made an rref it
 * owns; rank 1 sees the death, then the restart; calls both ways work again,
 * the old rref fails clearly, and every graceful shutdown says TP_OK. */
static int body_rank0_rejoin(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    tp_options *o = etcd_options(job);
    TT_CHECK(o && tt_init(job, rank, o) == 0);
    tp_options_free(o);
    atomic_fetch_add(&sh->flag[F_UP], 1);
    if (rank == 0) {
        for (;;)
            pause(); /* the first incarnation serves until the parent kills it */
    }
    int64_t v = 0;
    tp_status st = TP_OK;
    if (rank == 1) {
        tp_rref *rref = NULL;
        tp_value *args = tp_value_list_of(2, tp_value_int(1), tp_value_int(1));
        st = tp_remote(tp_to_rank(0), "add", args, NULL, 10, &rref);
        tp_value_free(args);
        TT_CHECK(st == TP_OK);
        tp_value *got = NULL;
        TT_CHECK(tp_rref_to_here(rref, 10, &got) == TP_OK);
        tp_value_free(got);
        atomic_fetch_add(&sh->flag[F_UP], 1); /* the rref exists: kill now */
        for (int i = 0; i < 2000 && st != TP_EPEERDOWN; i++) {
            st = tt_call_add(tp_to_rank(0), 1, 2, 1.0, &v);
            if (st != TP_EPEERDOWN)
                usleep(5000);
        }
        TT_CHECK(st == TP_EPEERDOWN);
        atomic_store(&sh->flag[F_SAW_DEAD], 1);
        TT_CHECK(tt_await_flag(sh, F_NEW_UP, 1, 30) == 0);
        TT_CHECK(tt_call_add(tp_to_rank(0), 20, 3, 10, &v) == TP_OK && v == 23);
        got = NULL;
        st = tp_rref_to_here(rref, 10, &got);
        TT_CHECK(st == TP_EPEERDOWN && strstr(tp_errmsg(), "restarted") != NULL);
        fprintf(stderr, "  worker1's rref of the first worker0: %s\n", tp_errmsg());
        tp_rref_release(rref);
        atomic_store(&sh->flag[F_CALLED_NEW], 1);
    } else {
        TT_CHECK(tt_await_flag(sh, F_CALLED_NEW, 1, 60) == 0);
        TT_CHECK(tt_call_add(tp_to_rank(0), 5, 6, 10, &v) == TP_OK && v == 11);
    }
    st = tp_shutdown(1);
    TT_CHECK(st == TP_OK);
    return 0;
}

/* The restarted worker0: a new process on a new port, rejoining by
 * TP_REJOIN=1 as a launcher that restarts it says (REJOIN-1). */
static int body_rank0_new(tt_job *job) {
    tt_shared *sh = job->shared;
    tp_options *o = etcd_options(job);
    TT_CHECK(o && setenv("TP_REJOIN", "1", 1) == 0);
    uint64_t t0 = tt_now_ns();
    TT_CHECK(tt_init(job, 0, o) == 0);
    tp_options_free(o);
    atomic_store(&sh->ns[NS_REJOINED], tt_now_ns() - t0);
    int64_t v = 0;
    TT_CHECK(tt_call_add(tp_to_rank(1), 2, 2, 10, &v) == TP_OK && v == 4);
    TT_CHECK(tt_call_add(tp_to_rank(2), 3, 3, 10, &v) == TP_OK && v == 6);
    atomic_store(&sh->flag[F_NEW_UP], 1);
    TT_CHECK(tt_await_flag(sh, F_CALLED_NEW, 1, 60) == 0);
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_tcp_etcd_rank0_rejoins(void **state) {
    (void)state;
    const tpe_etcd *e = need_etcd();
    char url[160];
    snprintf(url, sizeof url, "etcd://%s/tp-tcp-%d-rejoin?ttl=%d", e->endpoint, (int)getpid(),
             JOB_TTL_S);
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 3, body_rank0_rejoin, url), 0);
    assert_int_equal(tt_await_flag(job.shared, F_UP, 4, 30), 0);
    assert_int_equal(tt_kill_rank(&job, 0), 0);
    assert_int_equal(tt_await_flag(job.shared, F_SAW_DEAD, 1, 30), 0);
    /* Dead for longer than the lease's TTL: the survivors keep it alive. */
    tpe_sleep_ms(DEAD_FOR_MS);
    assert_int_equal(tt_restart_rank(&job, 0, body_rank0_new), 0); /* tt_wait waits for it */
    tt_wait(&job, 60);
    fprintf(stderr, "  the rejoin of rank 0 took %.1f ms\n",
            atomic_load(&job.shared->ns[NS_REJOINED]) / 1e6);
    assert_int_equal(job.code[0], 0);
    assert_int_equal(job.code[1], 0);
    assert_int_equal(job.code[2], 0);
    tt_job_free(&job);
}

/* ---- No etcd there ------------------------------------------------------------------------ */

/* spec: ETCD-2, ETCD-8, STORE-9. A malformed URL fails init at once with
 * TP_EINVAL; an unreachable etcd is retried until init's deadline, then
 * init fails with TP_ESTORE and etcd's endpoint and failure in the message. */
static int body_unreachable(tt_job *job, int rank) {
    tp_options *o = etcd_options(job);
    TT_CHECK(o && tp_options_set_init_timeout(o, 1) == TP_OK);
    TT_CHECK(tp_options_set_init_method(o, "etcd://127.0.0.1:2379/") == TP_OK);
    tp_status st = tp_init_rpc("worker0", "TENSORPIPE", (uint32_t)rank, 1, o);
    fprintf(stderr, "  %s: %s\n", tp_status_name(st), tp_errmsg());
    TT_CHECK(st == TP_EINVAL && strstr(tp_errmsg(), "the prefix ''") != NULL);
    TT_CHECK(tp_options_set_init_method(o, (const char *)job->arg) == TP_OK);
    uint64_t t0 = tt_now_ns();
    st = tp_init_rpc("worker0", "TENSORPIPE", (uint32_t)rank, 1, o);
    double took = (tt_now_ns() - t0) / 1e9;
    tp_options_free(o);
    fprintf(stderr, "  after %.1f s: %s: %s\n", took, tp_status_name(st), tp_errmsg());
    TT_CHECK(st == TP_ESTORE);
    TT_CHECK(strstr(tp_errmsg(), "Connection refused") != NULL);
    TT_CHECK(strstr(tp_errmsg(), (const char *)job->arg + 7) != NULL); /* the endpoint */
    TT_CHECK(took < 5);
    return 0;
}

static void test_tcp_etcd_unreachable(void **state) {
    (void)state;
    /* A port held by a socket bound but not listening: a connection to it
     * is refused, and no other test can take it meanwhile (a port that was
     * only free once was, and a worker's "bad hello" answered etcd). */
    int hold = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    assert_true(hold >= 0 && bind(hold, (struct sockaddr *)&sa, sizeof sa) == 0 &&
                getsockname(hold, (struct sockaddr *)&sa, &len) == 0);
    char url[128];
    snprintf(url, sizeof url, "etcd://127.0.0.1:%u/tp-tcp-none", (unsigned)ntohs(sa.sin_port));
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 1, body_unreachable, url), 0);
    assert_int_equal(tt_wait(&job, 30), 0);
    tt_job_free(&job);
    close(hold);
}

static int teardown_group(void **state) {
    (void)state;
    tpe_etcd_stop(&server);
    return 0;
}

int main(void) {
    tt_ensure_secret();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_etcd_unreachable),
        cmocka_unit_test(test_tcp_etcd_job),
        cmocka_unit_test(test_tcp_etcd_rank0_rejoins),
    };
    return cmocka_run_group_tests_name("tcp_etcd", tests, NULL, teardown_group);
}
