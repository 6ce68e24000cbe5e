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
#include <unistd.h>

#include <cmocka.h>

#include "real/tcp_internal.h"
#include "tcp_harness.h"

enum { F_FULL = 0, F_FREED = 1, C_READY = 0, C_REDIALS = 1 };

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

int main(void) {
    tt_ensure_secret();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_descriptors_exhausted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
