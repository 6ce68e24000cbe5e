/*
 * test_tcp_direct.c: TCP-15's direct write, seen from outside. A thread
 * that sends a frame while its peer's connection is open and nothing is
 * queued for it writes the frame itself (one sendmsg on its own thread)
 * instead of waking the loop to write it. This program defines sendmsg,
 * which the library (linked statically) then calls instead of libc's, and
 * counts the calls each thread makes.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>

#include "tcp_harness.h"

#define WARM_CALLS 5
#define CALLS 20

static _Thread_local unsigned long thread_sendmsgs;

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags) {
    thread_sendmsgs++;
    return syscall(SYS_sendmsg, fd, msg, flags);
}

enum { C_DIRECT = 0 };

static int body_direct(tt_job *job, int rank) {
    tp_options *o = tt_options(job, 20, 10);
    TT_CHECK(o && tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        int64_t v = 0;
        /* The first calls dial the connections and settle TCP-22's offer:
         * no grant while it waits for its answer. */
        for (int i = 0; i < WARM_CALLS; i++)
            TT_CHECK(tt_call_add(tp_to_rank(1), i, 1, 10, &v) == TP_OK && v == i + 1);
        thread_sendmsgs = 0;
        for (int i = 0; i < CALLS; i++)
            TT_CHECK(tt_call_add(tp_to_rank(1), i, 2, 10, &v) == TP_OK && v == i + 2);
        atomic_store(&job->shared->count[C_DIRECT], (int)thread_sendmsgs);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* spec: TCP-15. Sequential rpc_syncs to an idle peer: the calling thread
 * writes its requests itself (each one sendmsg, or more when the socket
 * takes it in parts). Were no grant ever given, every request would go
 * through the loop thread and this thread would make none. A direct write
 * spends the grant; the writer puts its peer on the loop's regrant list,
 * and the loop restores the grant before it hands over the reply, so the
 * next request is direct too. Were the list to lose the peer, only every
 * other request would be (the loop grants again after writing one itself):
 * 10 of 20, where 18 to 20 are seen. */
static void test_tcp_direct_write_by_caller(void **state) {
    (void)state;
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 2, body_direct, NULL), 0);
    assert_int_equal(tt_wait(&job, 60), 0);
    int n = atomic_load(&job.shared->count[C_DIRECT]);
    fprintf(stderr, "  the caller's own sendmsg calls for %d rpc_syncs: %d\n", CALLS, n);
    assert_true(n >= CALLS * 3 / 4);
    tt_job_free(&job);
}

int main(void) {
    tt_ensure_secret();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_direct_write_by_caller),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
