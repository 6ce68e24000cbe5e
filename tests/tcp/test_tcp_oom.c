/*
 * test_tcp_oom.c: out of memory anywhere in a TCP worker's life. A job of
 * two workers inits, calls the other once and shuts down gracefully; in
 * one rank the k-th malloc or calloc after the start (on any thread: the
 * caller's, the I/O loop's, the pool's) fails. For k over the whole run,
 * sampled, every step either works or fails with a status and a message,
 * both processes exit within a deadline, neither crashes, and (in the
 * sanitizer build) neither leaks. The other rank sees the same: its calls
 * end, by answer or error, and it exits.
 */
#define _GNU_SOURCE
#include <execinfo.h>
#include <limits.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "real/tcp_internal.h"
#include "tcp_harness.h"
#include "tcp_raw.h"
#include "tests/unit/alloc_fault.h"

#define STEPS 3 /* init, the call, shutdown */
/* Deadlines in s: short, as a rank whose peer failed waits them out; a
 * sanitizer build's no-fault run needs longer. */
#define SLACK (TT_SLOWDOWN == 1 ? 1.0 : 2.0)
/* Slots in the job's shared memory, per rank r. */
#define STEP_SLOT(r, s) ((r)*STEPS + (s)) /* flag: the step's status + 1; 0 never reached */
#define FIRED_SLOT(r) (r)                 /* count: the countdown ended in r */
#define USED_SLOT(r) (r)                  /* ns: allocations r counted */

/* OpenSSL's own tables drop blocks when one of its allocations fails
 * (a cache entry made before the failure, in the parent, is lost in the
 * child): not ours to free. LeakSanitizer reads this at exit. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
    return "leak:libcrypto.so\n";
}

static int faulty_rank; /* set by the parent before the fork */
static long countdown;

static void record(tt_shared *sh, int rank, int step, tp_status st) {
    atomic_store(&sh->flag[STEP_SLOT(rank, step)], (int)st + 1);
}

/* The stack of a child's crash, on stderr; then the crash itself. */
static void on_crash(int sig) {
    void *frames[64];
    int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

static int body(tt_job *job, int rank) {
    /* A crash here is the child's, reported by its exit status: not
     * caught by cmocka's handlers, inherited from the parent. */
    int sigs[] = {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
        signal(sigs[i], on_crash);
    tt_shared *sh = job->shared;
    tp_options *o = tt_options(job, SLACK, SLACK);
    TT_CHECK(o != NULL);
    TT_CHECK(tp_options_set_init_timeout(o, 1.5 * SLACK) == TP_OK);
    tt_register_functions();
    char name[16];
    snprintf(name, sizeof name, "worker%d", rank);
    if (rank == faulty_rank)
        atomic_store(&alloc_countdown, countdown);
    tp_status st = tp_init_rpc(name, "TENSORPIPE", rank, job->world, o);
    record(sh, rank, 0, st);
    TT_CHECK(st == TP_OK || tp_errmsg()[0] != '\0');
    if (st == TP_OK) {
        int64_t sum = -1;
        st = tt_call_add(tp_to_rank((uint32_t)(1 - rank)), rank, 10, SLACK, &sum);
        record(sh, rank, 1, st);
        TT_CHECK(st == TP_OK ? sum == rank + 10 : tp_errmsg()[0] != '\0');
        st = tp_shutdown(1);
        record(sh, rank, 2, st);
        TT_CHECK(st == TP_OK || tp_errmsg()[0] != '\0');
    }
    long left = atomic_exchange(&alloc_countdown, 0);
    if (rank == faulty_rank) {
        atomic_store(&sh->count[FIRED_SLOT(rank)], atomic_load(&alloc_countdown_fired));
        atomic_store(&sh->ns[USED_SLOT(rank)], (uint64_t)(countdown - (left > 0 ? left : 0)));
    }
    tp_options_free(o);
    return 0;
}

/* SIGUSR1 in a child: Ctrl-C, as a launcher would pass it on. */
static void on_usr1(int sig) {
    (void)sig;
    (void)tp_interrupt();
}

/* Waits for rank f, then interrupts the other's blocking init or graceful
 * shutdown (INTERRUPT-1) until it exits too: a rank whose peer failed
 * early would otherwise wait out its init timeout, each time. Then
 * tt_wait's verdict. */
static int wait_job(tt_job *job, int f) {
    uint64_t deadline = tt_now_ns() + 60 * 1000000000ull;
    for (int pass = 0; pass < 2; pass++) {
        int r = pass == 0 ? f : 1 - f, status;
        pid_t got;
        while ((got = waitpid(job->pid[r], &status, WNOHANG)) == 0 && tt_now_ns() < deadline) {
            if (pass == 1)
                kill(job->pid[r], SIGUSR1);
            usleep(pass == 0 ? 2000 : 20000);
        }
        if (got == job->pid[r])
            job->code[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return tt_wait(job, 10.0); /* the verdict; kills what is still running */
}

/* One job with the k-th allocation failing in rank f: whether it failed,
 * and how many allocations f counted (k - 1 when it did). */
static int run_case(int f, long k, uint64_t *used) {
    faulty_rank = f;
    countdown = k;
    uint64_t t0 = tt_now_ns();
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 2, body, NULL), 0);
    int rc = wait_job(&job, f);
    if (rc != 0) {
        for (int r = 0; r < 2; r++)
            fprintf(stderr, "k=%ld faulty=%d: rank %d exit %d, steps %d %d %d\n", k, f, r,
                    job.code[r], atomic_load(&job.shared->flag[STEP_SLOT(r, 0)]) - 1,
                    atomic_load(&job.shared->flag[STEP_SLOT(r, 1)]) - 1,
                    atomic_load(&job.shared->flag[STEP_SLOT(r, 2)]) - 1);
    }
    int fired = atomic_load(&job.shared->count[FIRED_SLOT(f)]);
    if (getenv("TP_OOM_VERBOSE"))
        fprintf(stderr, "k=%ld faulty=%d: %.2f s, steps %d %d %d / %d %d %d\n", k, f,
                (double)(tt_now_ns() - t0) / 1e9,
                atomic_load(&job.shared->flag[STEP_SLOT(0, 0)]) - 1,
                atomic_load(&job.shared->flag[STEP_SLOT(0, 1)]) - 1,
                atomic_load(&job.shared->flag[STEP_SLOT(0, 2)]) - 1,
                atomic_load(&job.shared->flag[STEP_SLOT(1, 0)]) - 1,
                atomic_load(&job.shared->flag[STEP_SLOT(1, 1)]) - 1,
                atomic_load(&job.shared->flag[STEP_SLOT(1, 2)]) - 1);
    *used = atomic_load(&job.shared->ns[USED_SLOT(f)]);
    /* The job went all the way when nothing failed. */
    if (!fired)
        for (int r = 0; r < 2; r++)
            for (int s = 0; s < STEPS; s++)
                assert_int_equal(atomic_load(&job.shared->flag[STEP_SLOT(r, s)]), TP_OK + 1);
    tt_job_free(&job);
    assert_int_equal(rc, 0);
    return fired;
}

static void sweep(int f) {
    if (!alloc_fault_in_use())
        skip();
    uint64_t total = 0;
    assert_int_equal(run_case(f, LONG_MAX, &total), 0);
    fprintf(stderr, "rank %d: %llu allocations in a run\n", f, (unsigned long long)total);
    const char *every = getenv("TP_OOM_EVERY"); /* 1: every k (slow); default: a sample */
    long k = 1;
    int cases = 0;
    for (;;) {
        uint64_t used = 0;
        int fired = run_case(f, k, &used);
        cases++;
        if (!fired)
            break; /* past the run's last allocation */
        /* Each of the first 48 (start-up: options, loop, listener, store),
         * then a quarter further each time: about 65 jobs over a run of
         * 1,600 allocations. `make oom` tries every k. */
        k += every && atoi(every) > 0 ? atoi(every) : k < 48 ? 1 : k / 4;
    }
    fprintf(stderr, "rank %d: %d cases, k up to %ld\n", f, cases, k);
    assert_true(cases > 20);
}

static void test_tcp_oom_in_the_store_serving_rank(void **state) {
    (void)state;
    sweep(0);
}

static void test_tcp_oom_in_the_other_rank(void **state) {
    (void)state;
    sweep(1);
}

/*
 * A thread's first call, out of memory on that thread: its k-th calloc
 * fails, for k from 1 to THREAD_CALLOCS, each time on a new thread (a
 * thread's park token is made at its first wait, one of those callocs).
 * Every call answers or fails with a message; the worker serves on.
 */
#define THREAD_CALLOCS 12

typedef struct first_call {
    unsigned countdown;
    tp_value *args; /* borrowed: built on the main thread */
    tp_status st;
    int failed; /* the countdown ended */
    char msg[TP_ERRMSG_LEN_MAX];
    int64_t sum;
} first_call;

static void *first_call_thread(void *arg) {
    first_call *fc = arg;
    tp_value *res = NULL;
    calloc_countdown = fc->countdown;
    fc->st = tp_rpc_sync(tp_to_rank(1), "add", fc->args, NULL, 10.0, &res);
    fc->failed = calloc_failed;
    calloc_countdown = 0;
    snprintf(fc->msg, sizeof fc->msg, "%s", fc->st == TP_OK ? "" : tp_errmsg());
    if (fc->st == TP_OK && tp_value_get_int(res, &fc->sum) != TP_OK)
        fc->st = TP_ETYPE;
    tp_value_free(res);
    return NULL;
}

static int threads_body(tt_job *job, int rank) {
    tp_options *o = tt_options(job, 10.0, 10.0);
    TT_CHECK(o != NULL);
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        tp_value *args = tp_value_list_of(2, tp_value_int(2), tp_value_int(3));
        int fired = 0;
        for (unsigned k = 1; k <= THREAD_CALLOCS; k++) {
            first_call fc = {.countdown = k, .args = args};
            pthread_t t;
            TT_CHECK(pthread_create(&t, NULL, first_call_thread, &fc) == 0);
            TT_CHECK(pthread_join(t, NULL) == 0);
            fired += fc.failed;
            if (fc.st != TP_OK)
                fprintf(stderr, "k=%u: %s: %s\n", k, tp_status_name(fc.st), fc.msg);
            TT_CHECK(fc.st == TP_OK ? fc.sum == 5 : fc.msg[0] != '\0');
        }
        tp_value_free(args);
        TT_CHECK(fired > 0);
        int64_t sum = 0; /* and the worker serves on */
        TT_CHECK(tt_call_add(tp_to_rank(1), 4, 5, 10.0, &sum) == TP_OK && sum == 9);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_tcp_oom_on_a_threads_first_call(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip();
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 2, threads_body, NULL), 0);
    int rc = tt_wait(&job, 120.0);
    tt_job_free(&job);
    assert_int_equal(rc, 0);
}

/*
 * A thread that cannot start (pthread_create fails, as when the process is
 * out of threads or memory): init's event loop thread fails that init with
 * TP_ENOMEM saying so, and the next init works; the pool's first thread
 * fails the call it was to run ("out of memory handing the call to its
 * pool"), and the next call starts one and is answered; shutdown is clean.
 * A sqlite:// store, so init starts no store server thread first.
 */
static int no_thread_init(const char *db, tp_status *st) {
    tp_options *o = NULL;
    TT_CHECK(tp_construct_rpc_backend_options("TENSORPIPE", &o) == TP_OK);
    char m[128];
    snprintf(m, sizeof m, "sqlite://%s", db);
    TT_CHECK(tp_options_set_init_method(o, m) == TP_OK);
    unlink(db);
    *st = tp_init_rpc("w0", "TENSORPIPE", 0, 1, o);
    tp_options_free(o);
    return 0;
}

static int no_thread_body(tt_job *job, int rank) {
    (void)job, (void)rank;
    tt_register_functions();
    char db[64];
    snprintf(db, sizeof db, "/tmp/tp-no-thread-%d.db", (int)getpid());
    tp_status st = TP_OK;
    atomic_store(&create_fail_in, 1);
    TT_CHECK(no_thread_init(db, &st) == 0);
    TT_CHECK(atomic_load(&create_fail_in) == 0); /* it was init's */
    if (st != TP_ENOMEM || !strstr(tp_errmsg(), "cannot start the event loop thread"))
        fprintf(stderr, "init without its loop thread: %s: %s\n", tp_status_name(st), tp_errmsg());
    TT_CHECK(st == TP_ENOMEM);
    TT_CHECK(no_thread_init(db, &st) == 0);
    TT_CHECK(st == TP_OK);
    atomic_store(&create_fail_in, 1);
    int64_t sum = 0;
    st = tt_call_add(tp_to_rank(0), 1, 2, 10.0, &sum);
    TT_CHECK(atomic_load(&create_fail_in) == 0);
    if (st == TP_OK || !strstr(tp_errmsg(), "out of memory handing the call to its pool"))
        fprintf(stderr, "call without a pool thread: %s: %s\n", tp_status_name(st), tp_errmsg());
    TT_CHECK(st != TP_OK);
    TT_CHECK(tt_call_add(tp_to_rank(0), 4, 5, 10.0, &sum) == TP_OK && sum == 9);
    TT_CHECK(tp_shutdown(1) == TP_OK);
    /* The refused call the last thing before shutdown: its pool is empty. */
    TT_CHECK(no_thread_init(db, &st) == 0);
    TT_CHECK(st == TP_OK);
    atomic_store(&create_fail_in, 1);
    TT_CHECK(tt_call_add(tp_to_rank(0), 1, 2, 10.0, &sum) != TP_OK);
    TT_CHECK(tp_shutdown(1) == TP_OK);
    unlink(db);
    return 0;
}

static void test_tcp_threads_that_cannot_start(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip();
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 1, no_thread_body, NULL), 0);
    int rc = tt_wait(&job, 60.0);
    tt_job_free(&job);
    assert_int_equal(rc, 0);
}

/*
 * A thread's park token made without memory comes from the static reserve:
 * two threads at once take two different spares, and a spare goes back at
 * its thread's end, so more threads than the reserve holds, one after
 * another, each get one.
 */
typedef struct spare_taker {
    pthread_barrier_t *hold; /* NULL: end at once */
    tp_task *token;
    int failed;
    atomic_int ready; /* token and failed are set */
} spare_taker;

static void *take_spare(void *arg) {
    spare_taker *st = arg;
    calloc_countdown = 1; /* this thread's first calloc: its token */
    st->token = tpi_tcp_task_self(NULL);
    st->failed = calloc_failed;
    calloc_countdown = 0;
    atomic_store(&st->ready, 1);
    if (st->hold)
        pthread_barrier_wait(st->hold);
    return NULL;
}

static int spares_body(tt_job *job, int rank) {
    (void)job;
    (void)rank;
    pthread_barrier_t hold;
    TT_CHECK(pthread_barrier_init(&hold, NULL, 3) == 0);
    spare_taker a = {.hold = &hold}, b = {.hold = &hold};
    pthread_t ta, tb;
    TT_CHECK(pthread_create(&ta, NULL, take_spare, &a) == 0);
    while (!atomic_load(&a.ready))
        usleep(1000);
    TT_CHECK(pthread_create(&tb, NULL, take_spare, &b) == 0);
    while (!atomic_load(&b.ready))
        usleep(1000);
    TT_CHECK(a.failed && b.failed);
    /* The reserve's first two, in order. */
    TT_CHECK((char *)b.token - (char *)a.token == (ptrdiff_t)sizeof(tpi_tcp_task));
    pthread_barrier_wait(&hold);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_barrier_destroy(&hold);
    for (int i = 0; i < TPI_TCP_TASK_SPARES + 2; i++) {
        spare_taker c = {.hold = NULL};
        pthread_t t;
        TT_CHECK(pthread_create(&t, NULL, take_spare, &c) == 0);
        pthread_join(t, NULL);
        TT_CHECK(c.failed && c.token == a.token); /* the first spare, back each time */
    }
    return 0;
}

static void test_tcp_park_tokens_from_the_reserve(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip();
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 1, spares_body, NULL), 0);
    int rc = tt_wait(&job, 60.0);
    tt_job_free(&job);
    assert_int_equal(rc, 0);
}

/*
 * A dial without memory for its connection: the calls queued for that peer
 * fail at once with a message that says so (not at their deadline), their
 * frames are dropped (the callee never runs a call its caller saw fail),
 * and the next call, with memory again, dials and is answered.
 */
enum { DIAL_DONE = 0 };
enum { DIAL_RAN = 0 }; /* count: the calls worker 1 ran */

static tp_status fn_tally(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *user_data) {
    (void)call;
    (void)args;
    (void)kwargs;
    tt_shared *sh = user_data;
    *result = tp_value_int(atomic_fetch_add(&sh->count[DIAL_RAN], 1) + 1);
    return TP_OK;
}

static int dial_oom_body(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    tp_options *o = tt_options(job, 10.0, 10.0);
    /* The connections init made close when idle: the call must dial. */
    TT_CHECK(o && tp_options_set(o, "idle_timeout", TT_IDLE_TIMEOUT) == TP_OK);
    TT_CHECK(tp_register_function("tally", fn_tally, sh) == TP_OK);
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 1) {
        TT_CHECK(tt_await_flag(sh, DIAL_DONE, 1, 120) == 0);
        TT_CHECK(tp_shutdown(1) == TP_OK);
        return 0;
    }
    usleep(TT_SLOWDOWN * 1500000); /* past idle_timeout and the close's grace (TCP-19) */
    atomic_store(&calloc_fail_size, tpi_tcp_conn_size());
    atomic_store(&calloc_fail_n, 1);
    tp_value *res = NULL;
    uint64_t t0 = tt_now_ns();
    tp_status st = tp_rpc_sync(tp_to_rank(1), "tally", NULL, NULL, 20.0, &res);
    double took = (double)(tt_now_ns() - t0) / 1e9;
    atomic_store(&calloc_fail_n, 0);
    char msg[TP_ERRMSG_LEN_MAX];
    snprintf(msg, sizeof msg, "%s", st == TP_OK ? "" : tp_errmsg());
    tp_value_free(res);
    res = NULL;
    int64_t ran = -1;
    tp_status st2 = tp_rpc_sync(tp_to_rank(1), "tally", NULL, NULL, 20.0, &res);
    if (st2 == TP_OK)
        st2 = tp_value_get_int(res, &ran);
    tp_value_free(res);
    atomic_store(&sh->flag[DIAL_DONE], 1);
    fprintf(stderr, "dial without memory: %s after %.2f s: %s (%u failed); then %s\n",
            tp_status_name(st), took, msg, atomic_load(&calloc_pair_failed), tp_status_name(st2));
    TT_CHECK(atomic_load(&calloc_pair_failed) > 0);
    TT_CHECK(st == TP_EIO && strstr(msg, "out of memory for a connection"));
    TT_CHECK(took < 10.0);
    TT_CHECK(st2 == TP_OK && ran == 1); /* the failed call's frame did not go out */
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_tcp_dial_without_memory_fails_its_calls_at_once(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip();
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 2, dial_oom_body, NULL), 0);
    int rc = tt_wait(&job, 120.0);
    int ran = atomic_load(&job.shared->count[DIAL_RAN]); /* after worker 1's graceful shutdown */
    tt_job_free(&job);
    assert_int_equal(rc, 0);
    assert_int_equal(ran, 1);
}

/*
 * TCP-21: a dialer without memory for its sealed-write buffer cannot start
 * its encryption: the connection fails, and the call waiting for it ends
 * TP_EIO saying so (never a write through a buffer it does not have); with
 * memory back, the next call dials, seals and is answered.
 */
enum { SEAL_DONE = 1 };

static int seal_oom_body(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    tp_options *o = tt_options(job, 10.0, 10.0);
    TT_CHECK(o && tp_options_set(o, "encrypt", "on") == TP_OK);
    /* The connections init made close when idle: the call must dial. */
    TT_CHECK(tp_options_set(o, "idle_timeout", TT_IDLE_TIMEOUT) == TP_OK);
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 1) {
        TT_CHECK(tt_await_flag(sh, SEAL_DONE, 1, 120) == 0);
        TT_CHECK(tp_shutdown(1) == TP_OK);
        return 0;
    }
    usleep(TT_SLOWDOWN * 1500000); /* past idle_timeout and the close's grace (TCP-19) */
    atomic_store(&malloc_failed, 0);
    atomic_store(&malloc_fail_size, TPI_TCP_SEAL_BUF);
    int64_t sum = -1;
    uint64_t t0 = tt_now_ns();
    tp_status st = tt_call_add(tp_to_rank(1), 1, 2, 10.0, &sum);
    double took = (double)(tt_now_ns() - t0) / 1e9;
    atomic_store(&malloc_fail_size, 0);
    char msg[TP_ERRMSG_LEN_MAX];
    snprintf(msg, sizeof msg, "%s", st == TP_OK ? "" : tp_errmsg());
    tp_status st2 = tt_call_add(tp_to_rank(1), 3, 4, 10.0, &sum);
    atomic_store(&sh->flag[SEAL_DONE], 1);
    fprintf(stderr, "sealing without memory: %s after %.2f s: %s (%u failed); then %s\n",
            tp_status_name(st), took, msg, atomic_load(&malloc_failed), tp_status_name(st2));
    TT_CHECK(atomic_load(&malloc_failed) > 0);
    TT_CHECK(st == TP_EIO && strstr(msg, "cannot start encryption"));
    TT_CHECK(took < 5.0);
    TT_CHECK(st2 == TP_OK && sum == 7);
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_tcp_seal_buffer_without_memory_fails_the_dial(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip();
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 2, seal_oom_body, NULL), 0);
    int rc = tt_wait(&job, 120.0);
    tt_job_free(&job);
    assert_int_equal(rc, 0);
}

/*
 * spec: TCP-7: a probe this worker cannot answer (no memory for the PONG's
 * write) ends that connection at once, so its dialer learns of it from the
 * connection and dials again, instead of waiting out its probe deadline for
 * an answer that never comes. The test proves itself as worker 2 to worker
 * 1 of 3 and sends a PING while worker 1's writes of one record find no
 * memory.
 */
enum { PONG_READY = 0, PONG_ARM = 1, PONG_ARMED = 2, PONG_DONE = 3 };

static int unanswered_probe_body(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    tp_options *o = tt_options(job, 10.0, 10.0);
    TT_CHECK(o != NULL);
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    atomic_fetch_add(&sh->count[PONG_READY], 1);
    if (rank == 1) {
        TT_CHECK(tt_await_flag(sh, PONG_ARM, 1, 60) == 0);
        atomic_store(&malloc_fail_size, tpi_tcp_conn_write_size(1));
        atomic_store(&sh->flag[PONG_ARMED], 1);
        TT_CHECK(tt_await_flag(sh, PONG_DONE, 1, 60) == 0);
        atomic_store(&malloc_fail_size, 0);
    } else {
        TT_CHECK(tt_await_flag(sh, PONG_DONE, 1, 60) == 0);
    }
    (void)tp_shutdown(0); /* worker 1 may count worker 2 gone: no barrier */
    return 0;
}

static void test_tcp_probe_that_cannot_be_answered_ends_the_connection(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip();
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 3, unanswered_probe_body, NULL), 0);
    tt_shared *sh = job.shared;
    for (int i = 0; i < 30000 && atomic_load(&sh->count[PONG_READY]) < 3; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&sh->count[PONG_READY]), 3);
    char addr[128];
    tt_worker_addr(job.store_port, 1, addr, sizeof addr);
    int fd = tt_hello_as_worker2(addr);
    atomic_store(&sh->flag[PONG_ARM], 1);
    for (int i = 0; i < 30000 && !atomic_load(&sh->flag[PONG_ARMED]); i++)
        usleep(1000);
    assert_int_equal(atomic_load(&sh->flag[PONG_ARMED]), 1);
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    tpi_tcp_ctl_encode(rec, TPI_TCP_CTL_PING, 2);
    tt_raw_send(fd, rec, sizeof rec);
    /* The end comes at once: the connection closes (an ABORT before it, if
     * one could be written); no PONG, and no silence until a deadline. */
    uint64_t t0 = tt_now_ns();
    int ended = 0;
    while (!ended && tt_now_ns() - t0 < 5000000000ull) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 100) != 1)
            continue;
        uint8_t b[TPI_TCP_RECORD_SIZE];
        ssize_t k = recv(fd, b, sizeof b, 0);
        if (k == (ssize_t)sizeof b && tpi_tcp_ctl_kind_of(b) == TPI_TCP_CTL_PONG)
            break; /* answered after all: not what was asked */
        ended = k == 0 || (k < 0 && errno == ECONNRESET);
    }
    close(fd);
    atomic_store(&sh->flag[PONG_DONE], 1);
    int rc = tt_wait(&job, 60.0);
    tt_job_free(&job);
    assert_int_equal(rc, 0);
    assert_true(ended);
}

/*
 * No memory for a proof's HMAC (OpenSSL 3's allocates its context), at
 * each of the handshake's four HMACs (TCP-17): the failing end says it was
 * out of memory, never that the peer's proof was wrong, and once memory is
 * back the next connection works. HMAC is interposed: while
 * hmac_fail_label is set in a process, its HMACs over a message that
 * starts with that label fail.
 */
static const char *hmac_fail_label; /* per process: set in one child */
static tt_shared *hmac_shared;

#define HMAC_LOGGED 0 /* flag: rank 2 logged the case's words */
#define HMAC_BAD 1    /* flag: someone blamed the peer's proof */
#define HMAC_DONE 2   /* flag: rank 1's failing call is over */
#define HMAC_IDLE 3   /* flag: rank 2 asked rank 1 to close its connection */
#define HMAC_BACK 4   /* flag: the faulty rank's memory is back */
#define HMAC_FAILED 0 /* count: HMACs failed */

unsigned char *HMAC(const EVP_MD *md, const void *key, int key_len, const unsigned char *d,
                    size_t n, unsigned char *out, unsigned int *out_len) {
    static unsigned char *(*next)(const EVP_MD *, const void *, int, const unsigned char *, size_t,
                                  unsigned char *, unsigned int *);
    if (!next) {
        void *f = dlsym(RTLD_NEXT, "HMAC");
        memcpy(&next, &f, sizeof next);
    }
    const char *l = hmac_fail_label;
    if (l && n >= strlen(l) && memcmp(d, l, strlen(l)) == 0) {
        atomic_fetch_add(&hmac_shared->count[HMAC_FAILED], 1);
        return NULL;
    }
    return next(md, key, key_len, d, n, out, out_len);
}

#define PROOF_ACCEPT "tp/conn/accept v1" /* real/tcp_conn.c's labels */
#define PROOF_DIAL "tp/conn/dial v1"

#define SEAL_KEYS "tp/conn/seal " /* real/tcp_crypt.c's two key labels start so */

typedef struct hmac_case {
    int rank;          /* the one out of memory: 1 dials 2, 2 accepts */
    const char *label; /* its HMAC that fails */
    const char *says;  /* in rank 1's error (rank 1) or rank 2's log (rank 2) */
    int encrypt;       /* the job's encrypt option (TCP-21) */
} hmac_case;

static const hmac_case hmac_cases[] = {
    {1, PROOF_ACCEPT, "no memory to check its proof", 0},
    {1, PROOF_DIAL, "no memory to prove ourselves", 0},
    {2, PROOF_ACCEPT, "no memory to prove itself", 0},
    {2, PROOF_DIAL, "no memory to check its proof", 0},
    {2, SEAL_KEYS, "cannot start its encryption", 1},
    {1, SEAL_KEYS, "cannot start encryption", 1},
};

/* TCP-21: the two directions' keys are derived apart; either failing alone
 * fails the pair (no direction is sealed under a key never derived). */
static void test_tcp_seal_keys_either_derivation_fails_the_pair(void **state) {
    (void)state;
    static tt_shared sh;
    hmac_shared = &sh;
    tpi_tcp_auth auth = tt_job_auth();
    uint8_t ctx[36] = {1, 2, 3};
    uint8_t d2a[TPI_TCP_SEAL_KEY_SIZE], a2d[TPI_TCP_SEAL_KEY_SIZE];
    assert_int_equal(tpi_tcp_seal_keys(&auth, ctx, sizeof ctx, d2a, a2d), 0);
    assert_memory_not_equal(d2a, a2d, sizeof d2a);
    static const char *const labels[] = {"tp/conn/seal dialer-to-acceptor v1",
                                         "tp/conn/seal acceptor-to-dialer v1"};
    for (int i = 0; i < 2; i++) {
        hmac_fail_label = labels[i];
        int rc = tpi_tcp_seal_keys(&auth, ctx, sizeof ctx, d2a, a2d);
        hmac_fail_label = NULL;
        if (rc != -1)
            fail_msg("%s failing alone: seal_keys gave %d", labels[i], rc);
    }
    tpi_tcp_auth_clear(&auth);
    hmac_shared = NULL;
}

static void hmac_log(tp_log_level level, const char *msg, void *user_data) {
    tt_job *job = user_data;
    const hmac_case *hc = job->arg;
    if (level <= TP_LOG_WARN && strstr(msg, hc->says))
        atomic_store(&job->shared->flag[HMAC_LOGGED], 1);
    if (strstr(msg, "proof is wrong"))
        atomic_store(&job->shared->flag[HMAC_BAD], 1);
    if (strstr(msg, "asks worker 1 to close its connection"))
        atomic_store(&job->shared->flag[HMAC_IDLE], 1);
}

static int hmac_body(tt_job *job, int rank) {
    const hmac_case *hc = job->arg;
    tt_shared *sh = job->shared;
    hmac_shared = sh;
    tp_set_log_level(TP_LOG_DEBUG);
    tp_set_log_callback(hmac_log, job);
    tp_options *o = tt_options(job, 5.0, 5.0);
    TT_CHECK(o && tp_options_set(o, "idle_timeout", TT_IDLE_TIMEOUT) == TP_OK);
    TT_CHECK(!hc->encrypt || tp_options_set(o, "encrypt", "on") == TP_OK);
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == hc->rank)
        hmac_fail_label = hc->label;
    if (rank == 1) {
        /* Init connected every pair; the call needs a new connection, so
         * it waits for the idle close (TCP-19). A call that raced the
         * close and went on the old connection does it again. */
        tp_status st = TP_OK;
        for (int tries = 0; tries < 10 && st == TP_OK; tries++) {
            atomic_store(&sh->flag[HMAC_IDLE], 0);
            TT_CHECK(tt_await_flag(sh, HMAC_IDLE, 1, 20) == 0);
            usleep(100000);
            int64_t sum = 0;
            st = tt_call_add(tp_to_rank(2), 1, 2, 5.0, &sum);
            TT_CHECK(st != TP_OK || atomic_load(&sh->count[HMAC_FAILED]) == 0);
        }
        fprintf(stderr, "out of memory for %s in rank %d: rank 1's call: %s: %s\n", hc->label,
                hc->rank, tp_status_name(st), st == TP_OK ? "" : tp_errmsg());
        TT_CHECK(st != TP_OK);
        TT_CHECK(strstr(tp_errmsg(), "proof is wrong") == NULL);
        if (hc->rank == 1)
            TT_CHECK(strstr(tp_errmsg(), hc->says) != NULL);
        atomic_store(&sh->flag[HMAC_DONE], 1);
    } else {
        TT_CHECK(tt_await_flag(sh, HMAC_DONE, 1, 60) == 0);
    }
    if (rank == hc->rank) {
        hmac_fail_label = NULL;
        atomic_store(&sh->flag[HMAC_BACK], 1);
    }
    if (rank == 1) { /* memory is back: the next connection works */
        TT_CHECK(tt_await_flag(sh, HMAC_BACK, 1, 60) == 0);
        int64_t sum = 0;
        TT_CHECK(tt_call_add(tp_to_rank(2), 4, 5, 5.0, &sum) == TP_OK && sum == 9);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    tp_set_log_callback(NULL, NULL);
    return 0;
}

static void test_tcp_oom_in_a_handshakes_hmac(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof hmac_cases / sizeof *hmac_cases; i++) {
        tt_job job = {0};
        assert_int_equal(tt_spawn(&job, 3, hmac_body, (void *)&hmac_cases[i]), 0);
        int rc = tt_wait(&job, 120.0);
        int logged = atomic_load(&job.shared->flag[HMAC_LOGGED]);
        int bad = atomic_load(&job.shared->flag[HMAC_BAD]);
        int failed = atomic_load(&job.shared->count[HMAC_FAILED]);
        tt_job_free(&job);
        assert_int_equal(rc, 0);
        assert_true(failed > 0);
        assert_int_equal(bad, 0);
        if (hmac_cases[i].rank == 2)
            assert_int_equal(logged, 1);
    }
}

/*
 * No memory for the queued write of a sealed chunk (TCP-21): worker 0 sends
 * a call of LARGE_CALL bytes, encrypted, to worker 1, stopped (SIGSTOP: it
 * reads nothing), while every malloc of exactly a one-buffer write's size
 * fails. The socket takes the first chunks at once; the chunk it cannot
 * take, already sealed and off the queue, needs that write: its failure
 * fails the connection (the stream would have a hole), and the call with
 * it, at once, with TP_EIO and the reason, while worker 1 is still stopped.
 * Resumed, with memory back, worker 1 answers calls again, the large one
 * too, byte for byte, on a new connection; both shut down gracefully.
 */
#define LARGE_CALL (16u << 20) /* far more than the kernel buffers hold */
#define TX_WARM 0              /* flag: worker 0's first call is over */
#define TX_STOPPED 1           /* flag: the parent stopped worker 1 */
#define TX_CALLED 2            /* flag: worker 0's large call ended, or waited out */
#define TX_RESUMED 3           /* flag: the parent resumed worker 1 */
#define TX_DONE 4              /* flag: worker 0 checked all; worker 1 may shut down */
#define TX_FAILED 0            /* count: mallocs failed in worker 0 */

static int echo_large(const uint8_t *data, double wait_s, tp_status *st, char *msg, size_t len) {
    tp_value *args = tp_value_list_of(1, tp_value_bytes(data, LARGE_CALL));
    if (!args)
        return -1;
    tp_future *f = NULL;
    atomic_store(&malloc_failed, 0);
    atomic_store(&malloc_fail_size, wait_s > 0 ? tpi_tcp_conn_write_size(1) : 0);
    *st = tp_rpc_async(tp_to_rank(1), "echo", args, NULL, 60.0, &f);
    if (*st == TP_OK)
        *st = tp_future_wait(f, wait_s > 0 ? wait_s : 60.0);
    atomic_store(&malloc_fail_size, 0);
    snprintf(msg, len, "%s", !f ? tp_errmsg() : tp_future_error(f));
    int same = 0;
    if (*st == TP_OK) {
        const void *back = NULL;
        size_t n = 0;
        same = tp_value_get_bytes(tp_future_value(f), &back, &n) == TP_OK && n == LARGE_CALL &&
               memcmp(back, data, n) == 0;
    }
    tp_future_free(f); /* a pending one is dropped: its call goes on to its deadline */
    tp_value_free(args);
    return same;
}

static int tx_checks(tt_job *job, const uint8_t *data) {
    tt_shared *sh = job->shared;
    int64_t sum = 0;
    TT_CHECK(tt_call_add(tp_to_rank(1), 1, 2, 20.0, &sum) == TP_OK && sum == 3);
    atomic_store(&sh->flag[TX_WARM], 1);
    TT_CHECK(tt_await_flag(sh, TX_STOPPED, 1, 60) == 0);
    /* Worker 1 is stopped: the call ends by the failed write, not by an
     * answer or its deadline. */
    tp_status st;
    char msg[TP_ERRMSG_LEN_MAX];
    uint64_t t0 = tt_now_ns();
    int same = echo_large(data, 5.0 * TT_SLOWDOWN, &st, msg, sizeof msg);
    atomic_store(&sh->count[TX_FAILED], (int)atomic_load(&malloc_failed));
    atomic_store(&sh->flag[TX_CALLED], 1);
    fprintf(stderr,
            "large call to a stopped worker, its chunk's write out of memory: %s after %.2f s: %s "
            "(%u mallocs failed)\n",
            tp_status_name(st), (double)(tt_now_ns() - t0) / 1e9, msg, atomic_load(&malloc_failed));
    TT_CHECK(same == 0);
    TT_CHECK(atomic_load(&malloc_failed) > 0);
    TT_CHECK(st == TP_EIO || st == TP_EPEERDOWN);
    TT_CHECK(strstr(msg, uv_strerror(UV_ENOMEM)) != NULL);
    /* Resumed, memory back: a new connection carries calls again. */
    TT_CHECK(tt_await_flag(sh, TX_RESUMED, 1, 60) == 0);
    TT_CHECK(tt_call_add(tp_to_rank(1), 4, 5, 20.0, &sum) == TP_OK && sum == 9);
    TT_CHECK(echo_large(data, 0, &st, msg, sizeof msg) == 1);
    return 0;
}

static int tx_body(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    tp_options *o = tt_options(job, 20.0, 20.0);
    TT_CHECK(o && tp_options_set(o, "encrypt", "on") == TP_OK);
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        uint8_t *data = malloc(LARGE_CALL);
        TT_CHECK(data);
        for (size_t k = 0; k < LARGE_CALL; k++)
            data[k] = (uint8_t)(k * 131 + (k >> 16));
        int rc = tx_checks(job, data);
        free(data);
        atomic_store(&sh->flag[TX_CALLED], 1); /* whatever failed: the parent resumes worker 1 */
        atomic_store(&sh->flag[TX_DONE], 1);
        if (rc != 0)
            return rc;
    } else {
        TT_CHECK(tt_await_flag(sh, TX_DONE, 1, 120) == 0);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_tcp_oom_in_a_sealed_chunks_write(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip();
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 2, tx_body, NULL), 0);
    tt_shared *sh = job.shared;
    int warm = tt_await_flag(sh, TX_WARM, 1, 60) == 0;
    if (warm) {
        assert_int_equal(kill(job.pid[1], SIGSTOP), 0);
        atomic_store(&sh->flag[TX_STOPPED], 1);
        (void)tt_await_flag(sh, TX_CALLED, 1, 60);
        assert_int_equal(kill(job.pid[1], SIGCONT), 0);
        atomic_store(&sh->flag[TX_RESUMED], 1);
    }
    int rc = tt_wait(&job, 120.0);
    int failed = atomic_load(&sh->count[TX_FAILED]);
    tt_job_free(&job);
    assert_true(warm);
    assert_int_equal(rc, 0);
    assert_true(failed > 0);
}

int main(int argc, char **argv) {
    tt_ensure_secret();
    if (argc > 1)
        cmocka_set_test_filter(argv[1]); /* a glob: one test by hand */
    /* OpenSSL loads its providers at the first HMAC, in hundreds of
     * allocations of its own: done here, before the forks, the countdown
     * spends itself on ours. */
    tpi_tcp_auth auth = tt_job_auth();
    uint8_t ctx[8] = {0}, proof[TPI_TCP_PROOF_SIZE];
    if (tpi_tcp_auth_proof(&auth, "warm-up", ctx, sizeof ctx, proof) != 0)
        return 1;
    tpi_tcp_auth_clear(&auth);
    /* Set before the forks: a child may get one before its body runs. */
    struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    /* TP_OOM_RANK=0 or 1: that rank's sweep only (make test runs the two
     * side by side); TP_OOM_K too: that one job, for a look by hand. */
    const char *only = getenv("TP_OOM_RANK");
    if (only && getenv("TP_OOM_K")) {
        uint64_t used = 0;
        return run_case(atoi(only), atol(getenv("TP_OOM_K")), &used) ? 0 : 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_oom_in_the_store_serving_rank),
        cmocka_unit_test(test_tcp_oom_in_the_other_rank),
        cmocka_unit_test(test_tcp_oom_on_a_threads_first_call),
        cmocka_unit_test(test_tcp_oom_in_a_handshakes_hmac),
        cmocka_unit_test(test_tcp_oom_in_a_sealed_chunks_write),
        cmocka_unit_test(test_tcp_threads_that_cannot_start),
        cmocka_unit_test(test_tcp_dial_without_memory_fails_its_calls_at_once),
        cmocka_unit_test(test_tcp_park_tokens_from_the_reserve),
        cmocka_unit_test(test_tcp_seal_buffer_without_memory_fails_the_dial),
        cmocka_unit_test(test_tcp_probe_that_cannot_be_answered_ends_the_connection),
        cmocka_unit_test(test_tcp_seal_keys_either_derivation_fails_the_pair),
    };
    if (only) { /* rank 1's sweep is the longer: rank 0's run takes the others */
        const struct CMUnitTest rank0[] = {tests[0], tests[2], tests[3], tests[4], tests[5],
                                           tests[6], tests[7], tests[8], tests[9]};
        return atoi(only) == 0 ? cmocka_run_group_tests(rank0, NULL, NULL)
                               : _cmocka_run_group_tests("test_tcp_oom", &tests[1], 1, NULL, NULL);
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
