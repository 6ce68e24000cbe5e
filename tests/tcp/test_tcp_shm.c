/*
 * test_tcp_shm.c: shared memory between workers on one host (spec/tcp.md
 * TCP-22), checked from outside the transport: where a received tensor's
 * bytes lie (/proc/self/maps names the slab's memfd), that a tensor still
 * held is never written over by later frames, that shm=off keeps
 * everything on the stream, and that a peer killed mid-call is declared
 * down as over TCP, and that a tensor viewed in a slab lies on a
 * TPI_SHM_ALIGN boundary whatever precedes it in the frame. The conformance suite runs whole on
 * shared memory too (conformance_tcp_shm, conformance_tcp_shm_mixed).
 */
#define _GNU_SOURCE /* RTLD_NEXT, for the syscall stand-in */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "real/tcp_internal.h"
#include "tcp_harness.h"
#include "tcp_raw.h"

#define ELEMS (2u << 20) /* 8 MiB of float32: well above shm_min_bytes */
#define HELD_ROUNDS 20   /* calls made while the first answer is still held (more than a peer's slabs: each must come back) */

enum { C_ARG_IN_SHM = 0, C_ARG_SEEN = 1, C_ARG_ALIGNED = 2, C_NO_SHM_LOGGED = 3 };

/* This thread's sleeps on a ring's futex (TCP-26's futex_wait, made through
 * syscall(), counted by
 * the stand-in below: a caller waiting for its reply in the ring, TCP-30). */
static _Thread_local unsigned long thread_ring_sleeps;
static tt_shared *shared;

/* 1 when p lies in a mapping of one of our slabs' memfds. */
static int in_slab(const void *p) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return 0;
    char line[512];
    int found = 0;
    uintptr_t at = (uintptr_t)p;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo = 0, hi = 0;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && at >= lo && at < hi)
            found = strstr(line, "memfd:tensorplay-shm") != NULL;
    }
    fclose(f);
    return found;
}

/* 1 when p lies on the boundary a slab puts its frame's largest tensor on. */
static int shm_aligned(const void *p) {
    return (uintptr_t)p % TPI_SHM_ALIGN == 0;
}

/* where(pad, t): counts whether t's bytes arrived in a slab, and aligned
 * there (pad, bytes of varying length, moves t within the frame); answers
 * t + 1. */
static tp_status fn_where(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *user_data) {
    (void)kwargs;
    (void)user_data;
    tp_value *t = (tp_value *)tp_list_get(args, 1);
    if (tp_list_len(args) != 2 || !t || tp_value_kind(t) != TP_KIND_TENSOR) {
        tp_call_set_error(call, "where takes bytes and a tensor");
        return TP_EINVAL;
    }
    atomic_fetch_add(&shared->count[C_ARG_SEEN], 1);
    if (in_slab(tp_tensor_data(t))) {
        atomic_fetch_add(&shared->count[C_ARG_IN_SHM], 1);
        if (shm_aligned(tp_tensor_data(t)))
            atomic_fetch_add(&shared->count[C_ARG_ALIGNED], 1);
    }
    tp_value *out = tp_value_clone(t);
    if (!out)
        return TP_ENOMEM;
    float *d = tp_tensor_data(out);
    for (size_t k = 0; k < ELEMS; k++)
        d[k] += 1.0f;
    *result = out;
    return TP_OK;
}

static tp_value *filled(float base) {
    int64_t shape[1] = {ELEMS};
    tp_value *t = tp_value_tensor(TP_DTYPE_FLOAT32, 1, shape, NULL, NULL);
    if (!t)
        return NULL;
    float *d = tp_tensor_data(t);
    for (size_t k = 0; k < ELEMS; k++)
        d[k] = base + (float)(k % 1000);
    return t;
}

/* 1 when t holds filled(base) + 1. */
static int holds(tp_value *t, float base) {
    const float *d = tp_tensor_data(t);
    for (size_t k = 0; k < ELEMS; k++)
        if (d[k] != base + (float)(k % 1000) + 1.0f)
            return 0;
    return 1;
}

typedef struct shm_args {
    const char *rank1_shm;  /* NULL: defaults; "off": worker1 refuses shared memory */
    const char *rank1_min;  /* NULL: the default; else worker1's shm_min_bytes */
    const char *rank0_pool; /* NULL: the default; else worker0's shm_pool_bytes */
    const char *rank1_ring; /* NULL: the default; else worker1's shm_ring_bytes (TCP-28) */
    int expect_shm;         /* worker1's answers arrive in its slabs */
    int expect_arg_shm;     /* worker0's arguments arrive in its slabs */
} shm_args;

/* Counts the notices that a peer's frames come over TCP for want of shared
 * memory or of its ring (TCP-28): due only when an offer could not be taken
 * up, never when it was, nor when either worker chose none (shm=off,
 * shm_ring_bytes=0). */
static void count_no_shm(tp_log_level level, const char *msg, void *ud) {
    (void)level;
    tt_shared *sh = ud;
    if (strstr(msg, "no shared memory with worker") ||
        strstr(msg, "no shared memory ring with worker"))
        atomic_fetch_add(&sh->count[C_NO_SHM_LOGGED], 1);
}

static int shm_auth_off; /* set before the forks: both workers with auth=off */

/* Descriptors of this process whose link names memfd "what". */
static int open_memfds(const char *what);

/* Probes (TCP-22's OFFER memfds) and rings' memfds (TCP-28: the mapping
 * stays, the descriptor goes once the acceptor answered) this process has
 * open. */
static int open_probes(void) {
    return open_memfds("memfd:tensorplay-shm-probe") + open_memfds("memfd:tensorplay-ring");
}

static int open_memfds(const char *name) {
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char path[300], what[128] = "";
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(path, what, sizeof what - 1);
        if (k > 0) {
            what[k] = '\0';
            n += strstr(what, name) != NULL;
        }
    }
    closedir(d);
    return n;
}

static int body_tensors(tt_job *job, int rank) {
    const shm_args *sa = job->arg;
    shared = job->shared;
    tp_set_log_level(TP_LOG_INFO);
    tp_set_log_callback(count_no_shm, job->shared);
    tp_register_function("where", fn_where, NULL);
    tp_options *o = tt_options(job, 30, 10);
    TT_CHECK(o);
    if (shm_auth_off)
        TT_CHECK(tp_options_set(o, "auth", "off") == TP_OK);
    if (rank == 1 && sa->rank1_shm)
        TT_CHECK(tp_options_set(o, "shm", sa->rank1_shm) == TP_OK);
    if (rank == 0 && sa->rank0_pool)
        TT_CHECK(tp_options_set(o, "shm_pool_bytes", sa->rank0_pool) == TP_OK);
    if (rank == 1 && sa->rank1_min)
        TT_CHECK(tp_options_set(o, "shm_min_bytes", sa->rank1_min) == TP_OK);
    if (rank == 1 && sa->rank1_ring)
        TT_CHECK(tp_options_set(o, "shm_ring_bytes", sa->rank1_ring) == TP_OK);
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        tp_value *held = NULL;
        for (int i = 0; i <= HELD_ROUNDS; i++) {
            /* i bytes ahead of the tensor: its offset in the frame takes
             * every remainder modulo 4 (and most modulo 64) over the rounds. */
            static const char pad[HELD_ROUNDS + 1] = {0};
            tp_value *args =
                tp_value_list_of(2, tp_value_bytes(pad, (size_t)i), filled((float)(1000 * i)));
            tp_value *res = NULL;
            TT_CHECK(args && tp_rpc_sync(tp_to_rank(1), "where", args, NULL, 30, &res) == TP_OK);
            tp_value_free(args);
            TT_CHECK(holds(res, (float)(1000 * i)));
            TT_CHECK(in_slab(tp_tensor_data(res)) == sa->expect_shm);
            TT_CHECK(!sa->expect_shm || shm_aligned(tp_tensor_data(res)));
            if (i == 0)
                held = res; /* its slab stays busy: the next answers take others */
            else
                tp_value_free(res);
        }
        /* Twenty answers later the first is untouched. */
        TT_CHECK(holds(held, 0.0f));
        tp_value_free(held);
        atomic_store(&shared->flag[0], 1);
    } else {
        TT_CHECK(tt_await_flag(shared, 0, 1, 60) == 0);
    }
    /* Every OFFER was answered (yes or no): its probe and its ring's memfd
     * are closed, not kept for the connection's life. */
    uint64_t until = tt_now_ns() + 2000000000ull;
    while (open_probes() != 0 && tt_now_ns() < until)
        usleep(10000);
    TT_CHECK(open_probes() == 0);
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void run_tensors_ring(const char *rank1_shm, const char *rank1_min, const char *rank0_pool,
                             const char *rank1_ring, int expect_shm, int expect_arg_shm) {
    shm_args sa = {rank1_shm, rank1_min, rank0_pool, rank1_ring, expect_shm, expect_arg_shm};
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 2, body_tensors, &sa), 0);
    assert_int_equal(tt_wait(&job, 120), 0);
    int seen = atomic_load(&job.shared->count[C_ARG_SEEN]);
    int in_shm = atomic_load(&job.shared->count[C_ARG_IN_SHM]);
    int aligned = atomic_load(&job.shared->count[C_ARG_ALIGNED]);
    fprintf(stderr, "  shm=%s, worker0's pool %s: %d of %d arguments arrived in a slab\n",
            rank1_shm ? rank1_shm : "default", rank0_pool ? rank0_pool : "default", in_shm, seen);
    assert_int_equal(seen, HELD_ROUNDS + 1);
    assert_int_equal(in_shm, expect_arg_shm ? seen : 0);
    assert_int_equal(aligned, in_shm); /* WIRE-10: never moved into place */
    assert_int_equal(atomic_load(&job.shared->count[C_NO_SHM_LOGGED]), 0);
    tt_job_free(&job);
}

static void run_tensors(const char *rank1_shm, const char *rank0_pool, int expect_shm,
                        int expect_arg_shm) {
    run_tensors_ring(rank1_shm, NULL, rank0_pool, NULL, expect_shm, expect_arg_shm);
}

/* spec: TCP-22: large tensors arrive in the sender's slab, both ways, and
 * a held one is never written over. */
static void test_shm_tensors(void **state) {
    (void)state;
    if (!tt_can_take_fds()) {
        fprintf(stderr, "  pidfd_getfd is not permitted here: workers stay on TCP\n");
        skip();
    }
    run_tensors(NULL, NULL, 1, 1);
}

/* spec: TCP-17, TCP-22: without authentication (auth=off on both), a
 * worker's dial still offers shared memory once the other end accepted it,
 * and large frames take slabs both ways. */
static void test_shm_tensors_without_auth(void **state) {
    (void)state;
    if (!tt_can_take_fds()) {
        fprintf(stderr, "  pidfd_getfd is not permitted here: workers stay on TCP\n");
        skip();
    }
    shm_auth_off = 1;
    run_tensors(NULL, NULL, 1, 1);
    shm_auth_off = 0;
}

/* spec: TCP-12, TCP-22, TCP-28: shm_min_bytes is the least frame a slab
 * takes: with worker 1's set to the exact length of its answers (a RESPONSE
 * holding the tensor, as the codec encodes it), they come in its slabs; one
 * byte more and, without a ring (shm_ring_bytes 0), they take the stream.
 * With a ring they are above its largest record: slabs again. */
static void test_shm_min_bytes_is_inclusive(void **state) {
    (void)state;
    if (!tt_can_take_fds()) {
        fprintf(stderr, "  pidfd_getfd is not permitted here: workers stay on TCP\n");
        skip();
    }
    tpi_msg m;
    tpi_msg_reset(&m);
    m.type = TPI_MSG_RESPONSE;
    m.id = 1;
    m.value = filled(0.0f);
    tp_frame *f = NULL;
    char err[TP_ERRMSG_LEN_MAX];
    assert_int_equal(tpi_msg_encode(&m, NULL, UINT64_MAX, &f, err, sizeof err), TP_OK);
    char exact[32], over[32];
    snprintf(exact, sizeof exact, "%zu", f->len);
    snprintf(over, sizeof over, "%zu", f->len + 1);
    tp_frame_free(f);
    tp_value_free(m.value);
    run_tensors_ring(NULL, exact, NULL, NULL, 1, 1);
    run_tensors_ring(NULL, over, NULL, "0", 0, 1);
    run_tensors_ring(NULL, over, NULL, NULL, 1, 1);
}

/* spec: TCP-22: a frame larger than the sender's whole pool (shm_pool_bytes
 * at its least, 2 MiB, for 8 MiB tensors) takes the stream, each time, and
 * the record made for it goes (make test's sanitizer build sees one kept);
 * the answers, from worker1's default pool, still come through its slabs. */
static void test_shm_frame_over_the_pool_takes_the_stream(void **state) {
    (void)state;
    if (!tt_can_take_fds()) {
        fprintf(stderr, "  pidfd_getfd is not permitted here: workers stay on TCP\n");
        skip();
    }
    run_tensors(NULL, "2097152", 1, 0);
}

/* spec: TCP-22: a worker with shm=off declines, and every byte takes TCP. */
static void test_shm_off(void **state) {
    (void)state;
    run_tensors("off", NULL, 0, 0);
}

/* ---- Rings (TCP-28) ---------------------------------------------------------- */

#define ORDER_CALLS 300
#define ORDER_SMALL 100      /* fits the ring */
#define ORDER_MEDIUM 3000    /* above a 4 KiB ring's largest record: a slab */
#define ORDER_BIG (3u << 20) /* above a 2 MiB pool: the stream, behind a marker */
enum { C_ORDER_BAD = 4, C_ORDER_SEEN = 5, C_RING_LOGGED = 6 };
static int order_next; /* worker 1's I/O thread only: seq runs there (FUNC-6) */

static size_t order_size(int i) {
    return i % 7 == 2 ? ORDER_BIG : i % 3 == 1 ? ORDER_MEDIUM : ORDER_SMALL;
}

/* seq(i, bytes): runs on the I/O thread as the request is read, so in the
 * order the requests arrived; counts one out of order or with other bytes
 * than call i sent. Answers i. */
static tp_status fn_seq(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *user_data) {
    (void)call;
    (void)kwargs;
    (void)user_data;
    int64_t i = -1;
    const void *b = NULL;
    size_t n = 0;
    if (tp_value_get_int(tp_list_get(args, 0), &i) != TP_OK ||
        tp_value_get_bytes(tp_list_get(args, 1), &b, &n) != TP_OK)
        return TP_EINVAL;
    int bad = i != order_next || n != order_size((int)i);
    for (size_t k = 0; !bad && k < n; k++)
        bad = ((const uint8_t *)b)[k] != (uint8_t)(i * 7 + (int64_t)k);
    order_next = (int)i + 1;
    atomic_fetch_add(&shared->count[C_ORDER_SEEN], 1);
    if (bad)
        atomic_fetch_add(&shared->count[C_ORDER_BAD], 1);
    *result = tp_value_int(i);
    return *result ? TP_OK : TP_ENOMEM;
}

static void count_ring(tp_log_level level, const char *msg, void *ud) {
    (void)level;
    tt_shared *sh = ud;
    if (strstr(msg, "go through a shared memory ring"))
        atomic_fetch_add(&sh->count[C_RING_LOGGED], 1);
}

/* Runs body on world workers and waits up to timeout_s for them: a test of
 * shared memory (TCP-22, TCP-28), skipped where pidfd_getfd is not
 * permitted (the workers would stay on TCP). */
static void shm_job(tt_job *job, int world, tt_body body, void *arg, int timeout_s) {
    if (!tt_can_take_fds()) {
        fprintf(stderr, "  pidfd_getfd is not permitted here: workers stay on TCP\n");
        skip();
    }
    assert_int_equal(tt_spawn(job, world, body, arg), 0);
    assert_int_equal(tt_wait(job, timeout_s), 0);
}

/* Worker 0 sends ORDER_CALLS calls at once through a 4 KiB ring (full most
 * of the time) with a 2 MiB slab pool: small frames in the ring, medium
 * ones in a slab when one is free (else on the stream), big ones always on
 * the stream. */
static int body_order(tt_job *job, int rank) {
    shared = job->shared;
    tp_set_log_level(TP_LOG_DEBUG);
    tp_set_log_callback(count_ring, job->shared);
    TT_CHECK(tp_register_function_ex("seq", fn_seq, NULL, TP_FN_NONBLOCKING) == TP_OK);
    tp_options *o = tt_options(job, 60, 10);
    TT_CHECK(o);
    if (job->arg) /* TCP-29: both loops spin on their rings before they sleep */
        TT_CHECK(tp_options_set(o, "spin_us", job->arg) == TP_OK);
    if (rank == 0) {
        TT_CHECK(tp_options_set(o, "shm_ring_bytes", "4096") == TP_OK);
        TT_CHECK(tp_options_set(o, "shm_pool_bytes", "2097152") == TP_OK);
    }
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        static uint8_t data[ORDER_BIG];
        tp_future **f = calloc(ORDER_CALLS, sizeof *f);
        TT_CHECK(f);
        for (int i = 0; i < ORDER_CALLS; i++) {
            size_t n = order_size(i);
            for (size_t k = 0; k < n; k++)
                data[k] = (uint8_t)(i * 7 + (int)k);
            tp_value *args = tp_value_list_of(2, tp_value_int(i), tp_value_bytes(data, n));
            TT_CHECK(args && tp_rpc_async(tp_to_rank(1), "seq", args, NULL, 60, &f[i]) == TP_OK);
            tp_value_free(args);
        }
        for (int i = 0; i < ORDER_CALLS; i++) {
            int64_t v = -1;
            TT_CHECK(tp_future_wait(f[i], 60) == TP_OK);
            TT_CHECK(tp_value_get_int(tp_future_value(f[i]), &v) == TP_OK && v == i);
            tp_future_free(f[i]);
        }
        free(f);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* spec: TCP-28, AGENT-8: a ring keeps the order of a connection's frames
 * whatever road each takes (the ring, a slab whose record is in the ring,
 * the stream behind a marker in the ring) and while the ring is full; each
 * arrives whole. */
static void run_order(const char *spin_us) {
    tt_job job = {0};
    shm_job(&job, 2, body_order, (void *)spin_us, 120);
    int seen = atomic_load(&job.shared->count[C_ORDER_SEEN]);
    int bad = atomic_load(&job.shared->count[C_ORDER_BAD]);
    int rings = atomic_load(&job.shared->count[C_RING_LOGGED]);
    fprintf(stderr, "  %d calls seen, %d out of order or altered; rings started: %d\n", seen, bad,
            rings);
    assert_int_equal(seen, ORDER_CALLS);
    assert_int_equal(bad, 0);
    assert_true(rings >= 1);
    tt_job_free(&job);
}

static void test_ring_keeps_order_across_roads(void **state) {
    (void)state;
    run_order(NULL);
}

/* spec: TCP-29, TCP-28: the same with both workers' waits spinning: the
 * loops read their rings disarmed and arm them again before they sleep,
 * also while markers wait for stream frames; nothing is lost or late. */
static void test_ring_keeps_order_while_spinning(void **state) {
    (void)state;
    run_order("2000");
}

#define BURST_CALLS 4000

/* inc(i): i + 1, on the I/O thread (FUNC-6). */
static tp_status fn_inc(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *user_data) {
    (void)call;
    (void)kwargs;
    (void)user_data;
    int64_t i = 0;
    if (tp_value_get_int(tp_list_get(args, 0), &i) != TP_OK)
        return TP_EINVAL;
    *result = tp_value_int(i + 1);
    return *result ? TP_OK : TP_ENOMEM;
}

static int body_burst(tt_job *job, int rank) {
    shared = job->shared;
    tp_set_log_level(TP_LOG_DEBUG);
    tp_set_log_callback(count_ring, job->shared);
    TT_CHECK(tp_register_function_ex("inc", fn_inc, NULL, TP_FN_NONBLOCKING) == TP_OK);
    tp_options *o = tt_options(job, 30, 10);
    if (o && job->arg)
        TT_CHECK(tp_options_set(o, "spin_us", job->arg) == TP_OK);
    TT_CHECK(o && tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        tp_future **f = calloc(BURST_CALLS, sizeof *f);
        TT_CHECK(f);
        for (int i = 0; i < BURST_CALLS; i++) {
            tp_value *args = tp_value_list_of(1, tp_value_int(i));
            TT_CHECK(args && tp_rpc_async(tp_to_rank(1), "inc", args, NULL, 20, &f[i]) == TP_OK);
            tp_value_free(args);
        }
        for (int i = 0; i < BURST_CALLS; i++) {
            int64_t v = -1;
            TT_CHECK(tp_future_wait(f[i], 30) == TP_OK);
            TT_CHECK(tp_value_get_int(tp_future_value(f[i]), &v) == TP_OK && v == i + 1);
            tp_future_free(f[i]);
        }
        free(f);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* spec: TCP-28: a burst of calls, written into the default ring faster than
 * the reader hands them on: its loop reads at most TPI_SHM_RING_BATCH
 * records a turn, then comes back by its own bell (it is not asleep, so the
 * writer rings nothing); every call is answered. */
static void run_burst(const char *spin_us) {
    tt_job job = {0};
    shm_job(&job, 2, body_burst, (void *)spin_us, 120);
    assert_true(atomic_load(&job.shared->count[C_RING_LOGGED]) >= 1);
    tt_job_free(&job);
}

static void test_ring_reader_comes_back_after_a_batch(void **state) {
    (void)state;
    run_burst(NULL);
}

/* spec: TCP-29: the same with the loops spinning: a batch read from the
 * spin ends the spin like one read by the bell. */
static void test_ring_burst_while_spinning(void **state) {
    (void)state;
    run_burst("2000");
}

#define IDLE_CALLS 2000
enum { F_STALLING = 1, F_WARM = 2, C_REQUEUED = 7 };

/* stall(): holds worker 1's I/O thread for 1.5 s, past its idle_timeout of
 * 1 s: what a slow upcall does (FUNC-6 asks functions never to). */
static tp_status fn_stall(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *user_data) {
    (void)call;
    (void)args;
    (void)kwargs;
    (void)user_data;
    atomic_store(&shared->flag[F_STALLING], 1);
    uint64_t until = tt_now_ns() + 1500000000ull;
    while (tt_now_ns() < until) {
    }
    *result = tp_value_nil();
    return *result ? TP_OK : TP_ENOMEM;
}

static void count_requeued(tp_log_level level, const char *msg, void *ud) {
    count_ring(level, msg, ud);
    if (strstr(msg, "waiting for the ring's room go to worker 1 on its next connection"))
        atomic_fetch_add(&((tt_shared *)ud)->count[C_REQUEUED], 1);
}

static int body_idle_full(tt_job *job, int rank) {
    shared = job->shared;
    tp_set_log_level(TP_LOG_DEBUG);
    tp_set_log_callback(count_requeued, job->shared);
    TT_CHECK(tp_register_function_ex("inc", fn_inc, NULL, TP_FN_NONBLOCKING) == TP_OK);
    TT_CHECK(tp_register_function_ex("stall", fn_stall, NULL, TP_FN_NONBLOCKING) == TP_OK);
    tp_options *o = tt_options(job, 30, 10);
    TT_CHECK(o);
    if (rank == 1)
        TT_CHECK(tp_options_set(o, "idle_timeout", "1") == TP_OK);
    if (rank == 0)
        TT_CHECK(tp_options_set(o, "shm_ring_bytes", "4096") == TP_OK);
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    int64_t v = 0;
    if (rank == 0) {
        TT_CHECK(tt_call_add(tp_to_rank(1), 1, 2, 10, &v) == TP_OK && v == 3); /* the ring */
        atomic_store(&shared->flag[F_WARM], 1);
        TT_CHECK(tt_await_flag(shared, F_STALLING, 1, 30) == 0);
        tp_future **f = calloc(IDLE_CALLS, sizeof *f);
        TT_CHECK(f);
        for (int i = 0; i < IDLE_CALLS; i++) {
            tp_value *args = tp_value_list_of(1, tp_value_int(i));
            TT_CHECK(args && tp_rpc_async(tp_to_rank(1), "inc", args, NULL, 30, &f[i]) == TP_OK);
            tp_value_free(args);
        }
        for (int i = 0; i < IDLE_CALLS; i++) {
            TT_CHECK(tp_future_wait(f[i], 30) == TP_OK);
            TT_CHECK(tp_value_get_int(tp_future_value(f[i]), &v) == TP_OK && v == i + 1);
            tp_future_free(f[i]);
        }
        free(f);
    } else if (rank == 2) {
        TT_CHECK(tt_await_flag(shared, F_WARM, 1, 30) == 0); /* worker 0's ring is up */
        tp_value *none = tp_value_list_of(0);
        tp_value *res = NULL;
        TT_CHECK(none && tp_rpc_sync(tp_to_rank(1), "stall", none, NULL, 30, &res) == TP_OK);
        tp_value_free(res);
        tp_value_free(none);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* spec: TCP-28, TCP-19: worker 1's loop stalls past its idle_timeout while
 * worker 0 fills its 4 KiB ring and has most of 2000 calls waiting for
 * room; worker 1 asks for the idle connection's close before it reads the
 * ring. The frames still waiting go back to worker 0's queue and out on
 * the next connection (the ring's records first, read at the CLOSE):
 * every call is answered, none lost. */
static void test_ring_idle_close_keeps_waiting_frames(void **state) {
    (void)state;
    tt_job job = {0};
    shm_job(&job, 3, body_idle_full, NULL, 120);
    int requeued = atomic_load(&job.shared->count[C_REQUEUED]);
    fprintf(stderr, "  frames sent back to the queue at IDLE: %d time(s)\n", requeued);
    assert_true(requeued >= 1);
    tt_job_free(&job);
}

enum { C_RING_TO_1 = 8, C_RING_TO_0 = 9 };

static void count_ring_to_1(tp_log_level level, const char *msg, void *ud) {
    (void)level;
    if (strstr(msg, "worker 0: frames to worker 1 go through a shared memory ring"))
        atomic_fetch_add(&((tt_shared *)ud)->count[C_RING_TO_1], 1);
    if (strstr(msg, "worker 1: frames to worker 0 go through a shared memory ring"))
        atomic_fetch_add(&((tt_shared *)ud)->count[C_RING_TO_0], 1);
}

static int body_busy_not_idle(tt_job *job, int rank) {
    shared = job->shared;
    tp_set_log_level(TP_LOG_DEBUG);
    tp_set_log_callback(count_ring_to_1, job->shared);
    TT_CHECK(tp_register_function_ex("inc", fn_inc, NULL, TP_FN_NONBLOCKING) == TP_OK);
    tp_options *o = tt_options(job, 30, 10);
    TT_CHECK(o && tp_options_set(o, "idle_timeout", "1") == TP_OK);
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        uint64_t until = tt_now_ns() + 2500000000ull;
        for (int64_t i = 0; tt_now_ns() < until; i++) {
            tp_value *args = tp_value_list_of(1, tp_value_int(i)), *res = NULL;
            int64_t v = -1;
            TT_CHECK(args && tp_rpc_sync(tp_to_rank(1), "inc", args, NULL, 10, &res) == TP_OK);
            TT_CHECK(tp_value_get_int(res, &v) == TP_OK && v == i + 1);
            tp_value_free(args);
            tp_value_free(res);
            usleep(20000);
        }
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* spec: TCP-28, TCP-19, TCP-30: frames read from the ring are activity:
 * worker 1, with an idle_timeout of 1 s, does not ask worker 0 to close a
 * connection whose stream is silent while its ring carries a call every
 * 20 ms for 2.5 s; nor does worker 0 (idle_timeout 1 s too), whose caller
 * reads the answers from the ring itself. Were only the stream's reads
 * counted, IDLE would come after 1 s and worker 0 would dial again (a
 * second ring); were only the loop's, worker 1 would. */
static void test_ring_traffic_is_not_idleness(void **state) {
    (void)state;
    tt_job job = {0};
    shm_job(&job, 2, body_busy_not_idle, NULL, 60);
    int rings = atomic_load(&job.shared->count[C_RING_TO_1]);
    int back = atomic_load(&job.shared->count[C_RING_TO_0]);
    fprintf(stderr, "  worker 0's rings to worker 1: %d; worker 1's to worker 0: %d\n", rings,
            back);
    assert_int_equal(rings, 1);
    assert_int_equal(back, 1);
    tt_job_free(&job);
}

#define MAXED_BYTES 5000
enum { C_MAXED_OK = 9 };

/* echo_n(n): n bytes. */
static tp_status fn_echo_n(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data) {
    (void)call;
    (void)kwargs;
    (void)user_data;
    int64_t n = 0;
    if (tp_value_get_int(tp_list_get(args, 0), &n) != TP_OK || n < 0 || n > MAXED_BYTES + 1)
        return TP_EINVAL;
    static const uint8_t zeros[MAXED_BYTES + 1];
    *result = tp_value_bytes(zeros, (size_t)n);
    return *result ? TP_OK : TP_ENOMEM;
}

/* The bytes of the RESPONSE frame carrying n bytes, as the codec encodes it. */
static uint64_t response_len(size_t n) {
    static const uint8_t zeros[MAXED_BYTES + 1];
    tpi_msg m;
    tpi_msg_reset(&m);
    m.type = TPI_MSG_RESPONSE;
    m.id = 1;
    m.value = tp_value_bytes(zeros, n);
    tp_frame *f = NULL;
    char err[TP_ERRMSG_LEN_MAX];
    assert_int_equal(tpi_msg_encode(&m, NULL, UINT64_MAX, &f, err, sizeof err), TP_OK);
    uint64_t len = f->len;
    tp_frame_free(f);
    tp_value_free(m.value);
    return len;
}

static int body_maxed(tt_job *job, int rank) {
    shared = job->shared;
    const uint64_t *max = job->arg;
    TT_CHECK(tp_register_function("echo_n", fn_echo_n, NULL) == TP_OK);
    tp_options *o = tt_options(job, 10, 10);
    TT_CHECK(o);
    if (rank == 0)
        TT_CHECK(tp_options_set_max_message_size(o, *max) == TP_OK);
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        tp_value *args = tp_value_list_of(1, tp_value_int(MAXED_BYTES)), *res = NULL;
        const void *b = NULL;
        size_t n = 0;
        TT_CHECK(args && tp_rpc_sync(tp_to_rank(1), "echo_n", args, NULL, 10, &res) == TP_OK);
        TT_CHECK(tp_value_get_bytes(res, &b, &n) == TP_OK && n == MAXED_BYTES);
        atomic_fetch_add(&shared->count[C_MAXED_OK], 1);
        tp_value_free(args);
        tp_value_free(res);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* spec: TCP-28, TCP-4: a frame of exactly max_message_size comes through
 * the ring (worker 0's bound set to the length of the answer it gets),
 * as it would through the stream: the bound is inclusive. */
static void test_ring_frame_of_max_message_size(void **state) {
    (void)state;
    uint64_t max = response_len(MAXED_BYTES);
    assert_true(max >= 4096 && max < 128 * 1024); /* a bound allowed, a record of the ring */
    tt_job job = {0};
    shm_job(&job, 2, body_maxed, &max, 60);
    assert_int_equal(atomic_load(&job.shared->count[C_MAXED_OK]), 1);
    tt_job_free(&job);
}

/* ---- A caller that reads its own reply (TCP-30) ---------------------------------- */

#define LEND_CALLS 40
#define LEND_BYTES (1u << 20) /* an answer through a slab: its FRAME record in the ring */
#define LEND_THREADS 2
enum { C_LEND_SLEEPS = 7, C_LEND_TIMEOUT_MS = 8, C_LEND_SLOW = 9 };

static pthread_t lend_caller; /* worker 0's thread that makes the calls */

/* on_caller(): 1 when it runs on that thread. Registered non-blocking, it
 * runs where its request is handed on: the I/O thread, never a caller
 * that read the ring (only replies are a caller's to hand on, AGENT-20). */
static tp_status fn_on_caller(tp_call *call, const tp_value *args, const tp_value *kwargs,
                              tp_value **result, void *user_data) {
    (void)call;
    (void)args;
    (void)kwargs;
    (void)user_data;
    *result = tp_value_int(pthread_equal(pthread_self(), lend_caller) != 0);
    return *result ? TP_OK : TP_ENOMEM;
}

/* back(a): worker 1 asks worker 0's on_caller, while worker 0's caller
 * waits for this very answer in the ring: worker 1's request comes into
 * that ring before its answer. Answers a, or -1 when on_caller said 1. */
static tp_status fn_back(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)call;
    (void)kwargs;
    (void)user_data;
    int64_t a = 0, on = -1;
    if (tp_value_get_int(tp_list_get(args, 0), &a) != TP_OK)
        return TP_EINVAL;
    tp_value *res = NULL;
    tp_status st = tp_rpc_sync(tp_to_rank(0), "on_caller", NULL, NULL, 10, &res);
    if (st == TP_OK && tp_value_get_int(res, &on) != TP_OK)
        st = TP_EPROTO;
    tp_value_free(res);
    if (st != TP_OK)
        return st;
    *result = tp_value_int(on == 0 ? a : -1);
    return *result ? TP_OK : TP_ENOMEM;
}

static void *lend_thread(void *arg) {
    int *bad = arg;
    for (int i = 0; i < LEND_CALLS; i++) {
        int64_t v = 0;
        *bad += tt_call_add(tp_to_rank(1), i, 1000, 10, &v) != TP_OK || v != i + 1000;
    }
    return NULL;
}

static int body_lend(tt_job *job, int rank) {
    tp_register_function("back", fn_back, NULL);
    TT_CHECK(tp_register_function_ex("on_caller", fn_on_caller, NULL, TP_FN_NONBLOCKING) == TP_OK);
    lend_caller = pthread_self();
    tp_options *o = tt_options(job, 30, 10);
    /* Worker 0 asks worker 1 to close its connection after 1 s without a
     * frame: it revokes the ring from a caller asleep on it (below). */
    TT_CHECK(o && (rank == 1 || tp_options_set(o, "idle_timeout", "1") == TP_OK));
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        int64_t v = 0;
        for (int i = 0; i < 5; i++) /* the connections, their offers and rings */
            TT_CHECK(tt_call_add(tp_to_rank(1), i, 1, 10, &v) == TP_OK && v == i + 1);
        thread_ring_sleeps = 0;
        /* Replies alone: each read by this caller from the ring. */
        for (int i = 0; i < LEND_CALLS; i++)
            TT_CHECK(tt_call_add(tp_to_rank(1), i, 2, 10, &v) == TP_OK && v == i + 2);
        atomic_store(&job->shared->count[C_LEND_SLEEPS], (int)thread_ring_sleeps);
        /* A request before the reply: left in the ring for the loop. */
        for (int i = 0; i < 5; i++) {
            tp_value *args = tp_value_list_of(1, tp_value_int(i));
            tp_value *res = NULL;
            TT_CHECK(args && tp_rpc_sync(tp_to_rank(1), "back", args, NULL, 10, &res) == TP_OK);
            TT_CHECK(tp_value_get_int(res, &v) == TP_OK && v == i);
            tp_value_free(args);
            tp_value_free(res);
        }
        /* The deadline while the caller holds the ring (the loop's timer
         * fails the call and nudges it), then the late reply, dropped. */
        tp_value *sargs = tp_value_list_of(2, tp_value_int(C_LEND_SLOW), tp_value_float(0.5));
        tp_value *sres = NULL;
        uint64_t t0 = tt_now_ns();
        TT_CHECK(sargs &&
                 tp_rpc_sync(tp_to_rank(1), "slow", sargs, NULL, 0.2, &sres) == TP_ETIMEDOUT);
        atomic_store(&job->shared->count[C_LEND_TIMEOUT_MS], (int)((tt_now_ns() - t0) / 1000000));
        tp_value_free(sargs);
        usleep(500000);
        TT_CHECK(tt_call_add(tp_to_rank(1), 7, 7, 10, &v) == TP_OK && v == 14);
        /* A reply 2.5 s away: the connection it would come by goes idle
         * meanwhile, and worker 0's loop takes the ring back from this
         * caller, asleep on it, to close it (only its nudge wakes the
         * caller then). The answer comes by a new connection. */
        tp_value *largs = tp_value_list_of(2, tp_value_int(C_LEND_SLOW), tp_value_float(2.5));
        tp_value *lres = NULL;
        TT_CHECK(largs && tp_rpc_sync(tp_to_rank(1), "slow", largs, NULL, 20, &lres) == TP_OK);
        TT_CHECK(tp_value_get_int(lres, &v) == TP_OK && v == C_LEND_SLOW);
        tp_value_free(largs);
        tp_value_free(lres);
        /* A reply through a slab: its FRAME record is left for the loop. */
        static uint8_t big[LEND_BYTES];
        for (size_t k = 0; k < sizeof big; k++)
            big[k] = (uint8_t)(k * 13);
        for (int i = 0; i < 3; i++) {
            tp_value *args = tp_value_list_of(1, tp_value_bytes(big, sizeof big));
            tp_value *res = NULL;
            const void *b = NULL;
            size_t n = 0;
            TT_CHECK(args && tp_rpc_sync(tp_to_rank(1), "echo", args, NULL, 10, &res) == TP_OK);
            TT_CHECK(tp_value_get_bytes(res, &b, &n) == TP_OK && n == sizeof big &&
                     memcmp(b, big, n) == 0);
            tp_value_free(args);
            tp_value_free(res);
        }
        /* Replies to calls in flight, ahead of its own: the caller holding
         * the ring hands them on too (their futures have no waiter). */
        tp_future *f[8];
        for (int i = 0; i < 8; i++) {
            tp_value *args = tp_value_list_of(2, tp_value_int(i), tp_value_int(4));
            TT_CHECK(args && tp_rpc_async(tp_to_rank(1), "add", args, NULL, 10, &f[i]) == TP_OK);
            tp_value_free(args);
        }
        TT_CHECK(tt_call_add(tp_to_rank(1), 8, 4, 10, &v) == TP_OK && v == 12);
        for (int i = 7; i >= 0; i--) {
            TT_CHECK(tp_future_wait(f[i], 10) == TP_OK);
            TT_CHECK(tp_value_get_int(tp_future_value(f[i]), &v) == TP_OK && v == i + 4);
            tp_future_free(f[i]);
        }
        /* Callers on three threads: one holds the ring, the others' replies
         * are handed on by it (an unpark, a semaphore post) or the loop. */
        pthread_t th[LEND_THREADS];
        int bad[LEND_THREADS] = {0};
        for (int k = 0; k < LEND_THREADS; k++)
            TT_CHECK(pthread_create(&th[k], NULL, lend_thread, &bad[k]) == 0);
        int mine = 0;
        lend_thread(&mine);
        for (int k = 0; k < LEND_THREADS; k++) {
            pthread_join(th[k], NULL);
            TT_CHECK(bad[k] == 0);
        }
        TT_CHECK(mine == 0);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* spec: TCP-30, AGENT-20: a caller waiting for its reply from a worker on
 * its host sleeps on the ring's futex and reads the reply itself; whatever
 * else comes in that ring first (a request of the callee's, handed on by
 * the I/O thread; a slab's record), the ring taken back while it sleeps, a
 * deadline, replies to other callers and callers on several threads, every
 * call gets its own answer. */
static void test_ring_lent_to_callers(void **state) {
    (void)state;
    tt_job job = {0};
    shm_job(&job, 2, body_lend, NULL, 120);
    int sleeps = atomic_load(&job.shared->count[C_LEND_SLEEPS]);
    int ms = atomic_load(&job.shared->count[C_LEND_TIMEOUT_MS]);
    fprintf(stderr, "  %d rpc_syncs: %d sleeps on the ring; a 200 ms timeout ended after %d ms\n",
            LEND_CALLS, sleeps, ms);
    /* Sleeps: 40 of 40 idle, fewer under load (a reply there before its
     * caller took the ring); that the lend is taken at all is
     * test_tcp_direct's to pin. The timeout ends by the core's timer, whose
     * unpark nudges the ring: not by the reply 500 ms after the call. */
    assert_true(ms >= 200 && ms < 450);
    tt_job_free(&job);
}

/* ---- A peer killed while frames go through shared memory -------------------- */

#define KILL_CALLS 8
enum { C_SLOW = 2, F_DONE = 1 };

/* spec: TCP-22, TCP-6: every frame through slabs (shm_min_bytes 0); worker1
 * is killed with SIGKILL mid-call and worker0's calls fail within a second. */
static int body_kill(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    tp_options *o = tt_options(job, 30, 5);
    TT_CHECK(o && tp_options_set(o, "shm_min_bytes", "0") == TP_OK);
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 1) {
        for (;;)
            pause(); /* serves until the parent kills it */
    }
    tp_future *fs[KILL_CALLS];
    for (int i = 0; i < KILL_CALLS; i++) {
        tp_value *args = tp_value_list_of(2, tp_value_int(C_SLOW), tp_value_float(20.0));
        TT_CHECK(tp_rpc_async(tp_to_rank(1), "slow", args, NULL, TP_TIMEOUT_DEFAULT, &fs[i]) ==
                 TP_OK);
        tp_value_free(args);
    }
    for (int i = 0; i < KILL_CALLS; i++) {
        TT_CHECK(tp_future_wait(fs[i], 10) == TP_EPEERDOWN);
        tp_future_free(fs[i]);
    }
    uint64_t took = tt_now_ns() - atomic_load(&sh->ns[0]);
    fprintf(stderr, "  calls failed %.1f ms after the kill\n", took / 1e6);
    TT_CHECK(took < 1000000000ull);
    TT_CHECK(tp_shutdown(1) == TP_EPEERDOWN);
    return 0;
}

static void test_shm_kill9(void **state) {
    (void)state;
    tt_job job = {0};
    assert_int_equal(tt_spawn(&job, 2, body_kill, NULL), 0);
    uint64_t deadline = tt_now_ns() + 20000000000ull;
    while (atomic_load(&job.shared->count[C_SLOW]) < 4 && tt_now_ns() < deadline)
        usleep(1000);
    assert_true(atomic_load(&job.shared->count[C_SLOW]) >= 4);
    atomic_store(&job.shared->ns[0], tt_now_ns());
    kill(job.pid[1], SIGKILL);
    tt_wait(&job, 30);
    assert_int_equal(job.code[0], 0);
    assert_int_equal(job.code[1], 128 + SIGKILL);
    tt_job_free(&job);
}

/* ---- Slab picking, without a job (the dialer's side alone) ------------------ */

#define MIB ((size_t)1 << 20)

/* Packs a frame of len bytes for worker 1; the record's slot and the slab's
 * generation (a new slab, a new one), or -1. */
static int pack(tpi_tcp_agent *a, size_t len, uint32_t *gen) {
    tp_frame *f = tp_frame_alloc(len);
    assert_non_null(f);
    memset(tp_frame_bytes(f), 0x11, TP_FRAME_HEADER_SIZE);
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    int rc = tpi_shm_pack(a, 1, 1, f, rec);
    tp_frame_free(f);
    if (rc != 0)
        return -1;
    uint32_t v[3];
    assert_int_equal(tpi_tcp_shm_decode(rec, v), TPI_TCP_SHM_FRAME);
    assert_int_equal(v[2], len);
    *gen = v[1] >> 8;
    return (int)(v[1] & 0xff);
}

static size_t slab_maps(void);

/* Worker 0 of two, with an 8 MiB pool and no connection: enough to pack
 * frames for worker 1 and release them. */
static void pool_agent(tpi_tcp_agent *a, tpi_tcp_peer peers[2]) {
    memset(a, 0, sizeof *a);
    a->rank = 0;
    a->world_size = 2;
    a->shm_pool = 8 * MIB;
    memset(peers, 0, 2 * sizeof *peers);
    a->peers = peers;
}

/* spec: TCP-22: slabs are reused; a frame no room can be made for takes
 * TCP without dropping a free slab; room is made by dropping free ones;
 * a frame larger than the pool never takes a slab; busy slabs are never
 * reused. */
static void test_shm_slab_picking(void **state) {
    (void)state;
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    pool_agent(&a, peers);
    size_t maps0 = slab_maps();
    uint32_t gen0 = 0, gen = 0;
    int s0 = pack(&a, 1 * MIB, &gen0); /* a 2 MiB slab */
    assert_true(s0 >= 0);
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)s0), 0);
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)s0), -1); /* not busy now */
    assert_int_equal(pack(&a, 1 * MIB, &gen), s0);                 /* reused */
    assert_int_equal(gen, gen0);
    int s1 = pack(&a, 5 * MIB, &gen); /* 6 MiB more: the pool is full, both busy */
    assert_true(s1 >= 0 && s1 != s0);
    assert_int_equal(pack(&a, 1 * MIB, &gen), -1); /* every slab busy, no room */
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)s0), 0);
    /* 4 MiB more cannot be had while the 6 MiB slab is busy: the free 2 MiB
     * slab must stay, and be what the next small frame gets. */
    assert_int_equal(pack(&a, 3 * MIB, &gen), -1);
    assert_int_equal(pack(&a, 1 * MIB, &gen), s0);
    assert_int_equal(gen, gen0);
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)s0), 0);
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)s1), 0);
    /* Now room is made: the free slabs go for one of 8 MiB, the only one. */
    assert_true(pack(&a, 7 * MIB, &gen) >= 0);
    assert_int_equal(slab_maps(), maps0 + 1);
    assert_int_equal(pack(&a, 9 * MIB, &gen), -1); /* larger than the pool */
    /* A session's end gives up its busy slabs, not the free ones. */
    tpi_shm_session_end(&a, 1, 1);
    assert_true(pack(&a, 1 * MIB, &gen) >= 0);
    tpi_shm_tx_free(peers[1].shm_tx);
}

/* spec: TCP-22: room is made by dropping free slabs only, never a busy
 * one, though a busy one is the larger: its frame is still being read. */
static void test_shm_room_made_from_free_slabs_only(void **state) {
    (void)state;
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    pool_agent(&a, peers);
    a.shm_pool = 10 * MIB;
    uint32_t gen = 0;
    int sx = pack(&a, 1 * MIB, &gen); /* a 2 MiB slab */
    int sy = pack(&a, 3 * MIB, &gen); /* a 4 MiB slab, busy */
    assert_true(sx >= 0 && sy >= 0 && sx != sy);
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)sx), 0);
    /* 6 MiB more: the free 2 MiB slab goes, and its slot takes the new one. */
    assert_int_equal(pack(&a, 5 * MIB, &gen), sx);
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)sy), 0); /* still there, still busy */
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)sx), 0);
    tpi_shm_tx_free(peers[1].shm_tx);
}

/* spec: TCP-22: at most TPI_SHM_SLABS_MAX slabs a peer: with every one
 * busy, the next frame takes the stream (pack refuses), whatever room the
 * pool has left. */
static void test_shm_every_slab_busy_then_the_stream(void **state) {
    (void)state;
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    pool_agent(&a, peers);
    a.shm_pool = 64 * MIB;
    uint32_t gen = 0;
    for (int i = 0; i < TPI_SHM_SLABS_MAX; i++)
        assert_true(pack(&a, 1 * MIB, &gen) >= 0);
    assert_int_equal(pack(&a, 1 * MIB, &gen), -1);
    tpi_shm_tx_free(peers[1].shm_tx);
}

/* spec: TCP-22: a session's end gives up that session's busy slabs only:
 * a free slab stays (the next frame reuses it, same generation), and so
 * does a busy slab of another session (its release still works). */
static void test_shm_session_end_keeps_the_others(void **state) {
    (void)state;
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    pool_agent(&a, peers);
    uint32_t ga = 0, gb = 0, g = 0;
    int sa = pack(&a, 1 * MIB, &ga);
    int sb = pack(&a, 1 * MIB, &gb);
    assert_true(sa >= 0 && sb >= 0 && sa != sb);
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)sa), 0); /* A free */
    tp_frame *f = tp_frame_alloc(1 * MIB);
    assert_non_null(f);
    memset(tp_frame_bytes(f), 0x11, TP_FRAME_HEADER_SIZE);
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    assert_int_equal(tpi_shm_pack(&a, 1, 2, f, rec), 0); /* C, session 2 */
    tp_frame_free(f);
    uint32_t v[3];
    assert_int_equal(tpi_tcp_shm_decode(rec, v), TPI_TCP_SHM_FRAME);
    uint32_t sc = v[1] & 0xff;
    tpi_shm_session_end(&a, 1, 1);                      /* B goes */
    assert_int_equal(tpi_shm_release(&a, 1, 2, sc), 0); /* C stayed, busy */
    assert_int_equal(pack(&a, 1 * MIB, &g), sa);        /* A stayed, free */
    assert_int_equal(g, ga);
    tpi_shm_tx_free(peers[1].shm_tx);
}

/* spec: TCP-22, WIRE-10: the frame is placed so its largest segment (a
 * tensor's data), wherever it is in the frame, lands on a multiple of
 * TPI_SHM_ALIGN: here the middle one of three (40 bytes of header before
 * it, 8 bytes after). */
static void test_shm_largest_segment_lands_aligned(void **state) {
    (void)state;
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    pool_agent(&a, peers);
    static uint8_t hdr[40], big[100004], small[8];
    tp_frame f;
    memset(&f, 0, sizeof f);
    f.nseg = 3;
    f.seg[0] = (tp_frame_seg){hdr, sizeof hdr};
    f.seg[1] = (tp_frame_seg){big, sizeof big};
    f.seg[2] = (tp_frame_seg){small, sizeof small};
    f.len = sizeof hdr + sizeof big + sizeof small;
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    assert_int_equal(tpi_shm_pack(&a, 1, 1, &f, rec), 0);
    uint32_t v[3];
    assert_int_equal(tpi_tcp_shm_decode(rec, v), TPI_TCP_SHM_FRAME);
    size_t cap = (size_t)tpi_shm_slab_size(v[2]);
    uint8_t *m = mmap(NULL, cap, PROT_READ, MAP_SHARED, (int)v[0], 0);
    assert_true(m != MAP_FAILED);
    uint32_t at =
        (uint32_t)m[36] | (uint32_t)m[37] << 8 | (uint32_t)m[38] << 16 | (uint32_t)m[39] << 24;
    munmap(m, cap);
    tpi_shm_tx_free(peers[1].shm_tx);
    if ((at + sizeof hdr) % TPI_SHM_ALIGN != 0)
        fail_msg("the frame starts at %u: its largest segment at %zu", at, at + sizeof hdr);
}

/* spec: TCP-22, TCP-14: a release names a slot the peer chose; it frees a
 * busy slab of that session and nothing else, whatever the number. */
static void test_shm_release_checks_the_slot(void **state) {
    (void)state;
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    pool_agent(&a, peers);
    assert_int_equal(tpi_shm_release(&a, 1, 1, 0), -1); /* no slabs yet */
    uint32_t gen = 0;
    int s0 = pack(&a, 1 * MIB, &gen);
    assert_true(s0 >= 0);
    const uint32_t past[] = {TPI_SHM_SLABS_MAX, TPI_SHM_SLABS_MAX + 1, 1u << 16, UINT32_MAX};
    for (size_t i = 0; i < sizeof past / sizeof past[0]; i++)
        assert_int_equal(tpi_shm_release(&a, 1, 1, past[i]), -1);
    for (uint32_t slot = 0; slot < TPI_SHM_SLABS_MAX; slot++) /* empty slots, or another session */
        assert_int_equal(tpi_shm_release(&a, 1, slot == (uint32_t)s0 ? 2 : 1, slot), -1);
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)s0), 0); /* still busy until now */
    tpi_shm_tx_free(peers[1].shm_tx);
}

/* spec: TCP-22: of the free slabs a frame fits without wasting more than
 * half, it takes the smallest, wherever that one sits among the slots:
 * here both the 2 MiB slab (slot 0) and the 4 MiB one fit a frame that
 * needs exactly 2 MiB, and the larger stays free for a larger frame. */
static void test_shm_smallest_fitting_slab_taken(void **state) {
    (void)state;
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    pool_agent(&a, peers);
    uint32_t gen_small = 0, gen_large = 0, gen = 0;
    int small = pack(&a, 1 * MIB, &gen_small); /* a 2 MiB slab */
    int large = pack(&a, 3 * MIB, &gen_large); /* a 4 MiB one, the first still busy */
    assert_true(small >= 0 && large >= 0 && small != large);
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)small), 0);
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)large), 0);
    size_t exact = 2 * MIB - TPI_SHM_HEAD - TPI_SHM_ALIGN; /* fills the small one */
    assert_int_equal(pack(&a, exact, &gen), small);
    assert_int_equal(gen, gen_small);
    assert_int_equal(pack(&a, exact, &gen), large); /* the small one is busy now */
    assert_int_equal(gen, gen_large);
    tpi_shm_tx_free(peers[1].shm_tx);
}

/* spec: TCP-22: a slab is reused whatever its descriptor's number, 0 too (a
 * process that closed its stdin gets its first slab's memfd there). */
static void test_shm_slab_on_descriptor_0_reused(void **state) {
    (void)state;
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    pool_agent(&a, peers);
    int saved = dup(0);
    assert_true(saved > 0);
    assert_int_equal(close(0), 0);
    uint32_t gen0 = 0, gen = 0;
    int s0 = pack(&a, 1 * MIB, &gen0); /* its memfd takes descriptor 0 */
    int probe = dup(saved);            /* the lowest free one: so 0 is the slab's */
    assert_true(s0 >= 0 && probe > 0);
    close(probe);
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)s0), 0);
    assert_int_equal(pack(&a, 1 * MIB, &gen), s0); /* reused, not made again */
    assert_int_equal(gen, gen0);
    /* Busy on descriptor 0 is busy: the next frame takes another slab. */
    int s1 = pack(&a, 1 * MIB, &gen);
    assert_true(s1 >= 0 && s1 != s0);
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)s1), 0);
    /* The session ends with the slab on 0 busy: it is given up (closed). */
    tpi_shm_session_end(&a, 1, 1);
    assert_int_equal(fcntl(0, F_GETFD), -1);
    assert_int_equal(dup2(saved, 0), 0); /* stdin back for a moment */
    /* Free on descriptor 0, it makes room when a large frame needs it: a
     * 4 MiB slab made on 0 beside the 2 MiB one left (s1), both free, go
     * for one of 8 MiB, the whole pool. */
    assert_int_equal(close(0), 0);
    int s2 = pack(&a, 3 * MIB, &gen); /* s1 is too small: a new one, on 0 */
    assert_true(s2 >= 0 && s2 != s1);
    assert_true(fcntl(0, F_GETFD) >= 0);
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)s2), 0);
    assert_true(pack(&a, 7 * MIB, &gen) >= 0);
    tpi_shm_tx_free(peers[1].shm_tx);
    assert_int_equal(fcntl(0, F_GETFD), -1); /* freeing the pool closed the slab on 0 */
    assert_int_equal(dup2(saved, 0), 0);     /* stdin back */
    close(saved);
}

/* ---- The offer's probe, checked whatever descriptor it lands on --------------- */

/* pidfd_open and pidfd_getfd are raw system calls, made through syscall():
 * this stand-in passes every call on, and for a test can move pidfd_open's
 * descriptor up to move_pidfd_to or above (as another thread closing
 * descriptor 0 between the two calls would leave it: the taken descriptor
 * then gets 0) and note the number pidfd_getfd gave. */
static int move_pidfd_to;
/* Written by whichever thread makes the call (a worker's loop thread too). */
static atomic_int last_taken_fd = -1;
static atomic_int last_pidfd = -1;
/* The fake agents here have shm_ring 0 (TCP-28): no ring is offered or taken. */
static tpi_shm_link *no_link;
static const char *no_ring_why;
static atomic_int ntaken; /* pidfd_getfd calls */
static long (*real_syscall)(long, ...);

/* Resolved before main, so before any thread: no thread's first call
 * races another's lookup. */
__attribute__((constructor)) static void real_syscall_resolve(void) {
    real_syscall = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
}

long syscall(long n, ...) {
    long (*real)(long, ...) = real_syscall;
    if (!real) /* a call from another library's constructor, before ours */
        real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    va_list ap;
    va_start(ap, n);
    long x[6];
    for (int i = 0; i < 6; i++)
        x[i] = va_arg(ap, long);
    va_end(ap);
    if (n == SYS_futex && (x[1] & 127) == 9) /* FUTEX_WAIT_BITSET, private flag off */
        thread_ring_sleeps++;
    long r = real(n, x[0], x[1], x[2], x[3], x[4], x[5]);
    if (n == SYS_pidfd_open && r >= 0 && move_pidfd_to > 0) {
        int up = fcntl((int)r, F_DUPFD_CLOEXEC, move_pidfd_to);
        int e = errno;
        close((int)r);
        errno = e;
        r = up;
    }
    if (n == SYS_pidfd_getfd) {
        last_taken_fd = (int)r;
        ntaken++;
    }
    if (n == SYS_pidfd_open)
        last_pidfd = (int)r;
    return r;
}

/* Worker 1 of two accepts the OFFER v from worker 0 (this process); 1 when
 * its probe held, 0 when refused (the reason holds refusal, and the pidfd
 * it opened for the dialer is closed again), the side freed. */
static int accept_offer_refused_for(const uint32_t v[3], const char *refusal) {
    tpi_tcp_agent b;
    memset(&b, 0, sizeof b);
    b.rank = 1;
    b.world_size = 2;
    b.max_msg = MIB;
    const char *why = NULL;
    last_pidfd = -1;
    tpi_shm_rx *rx = tpi_shm_accept(&b, 0, NULL, v, &why, &no_link, &no_ring_why);
    if (!rx) {
        assert_non_null(why);
        if (!strstr(why, refusal))
            fail_msg("refused: %s (not: %s)", why, refusal);
        assert_true(last_pidfd >= 0);
        assert_int_equal(fcntl(last_pidfd, F_GETFD), -1);
        return 0;
    }
    tpi_shm_rx_unref(rx);
    return 1;
}

static int accept_offer(const uint32_t v[3]) {
    return accept_offer_refused_for(v, "not this connection's probe");
}

/* Worker 0 of two (this process) offers shared memory to worker 1: the
 * probe's descriptor, and the OFFER's values in v. */
static int offer_to_worker_1(uint32_t v[3]) {
    tpi_tcp_agent a;
    memset(&a, 0, sizeof a);
    a.rank = 0;
    a.world_size = 2;
    int probe = -1;
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    assert_int_equal(tpi_shm_offer(&a, 1, &probe, &no_link, rec), 0);
    assert_int_equal(tpi_tcp_shm_decode(rec, v), TPI_TCP_SHM_OFFER);
    return probe;
}

/* spec: TCP-22: an offer whose descriptor cannot be taken (no such
 * descriptor in the dialer) is refused for that reason, not as a wrong
 * probe, and the pidfd opened for it is closed. */
static void test_shm_offer_of_a_closed_descriptor_refused(void **state) {
    (void)state;
    uint32_t v[3];
    int probe = offer_to_worker_1(v);
    v[1] = 999999; /* past any descriptor this process has open (the lowest
                      free one would be the pidfd accept opens) */
    assert_int_equal(fcntl(999999, F_GETFD), -1);
    int taken = accept_offer_refused_for(v, "pidfd_getfd");
    close(probe);
    assert_int_equal(taken, 0);
}

/* spec: TCP-22: descriptor 0 is a descriptor like any other for the
 * acceptor's pidfd (stdin closed: the pidfd lands there, the offer is taken,
 * and the pidfd is closed with the side) and for the dialer's probe. */
static void test_shm_pidfd_and_probe_on_descriptor_0(void **state) {
    (void)state;
    if (!tt_can_take_fds()) {
        fprintf(stderr, "  pidfd_getfd is not permitted here\n");
        skip();
    }
    uint32_t v[3];
    int probe = offer_to_worker_1(v);
    int saved = dup(0);
    assert_true(saved > 0);
    assert_int_equal(close(0), 0);
    int taken = accept_offer(v);
    int pidfd = last_pidfd;
    int closed0 = fcntl(0, F_GETFD) == -1;
    tpi_tcp_agent a;
    memset(&a, 0, sizeof a);
    a.rank = 0;
    a.world_size = 2;
    int probe0 = -1;
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    int offered = tpi_shm_offer(&a, 1, &probe0, &no_link, rec);
    if (probe0 >= 0)
        close(probe0);
    assert_int_equal(dup2(saved, 0), 0); /* stdin back, before any check */
    close(saved);
    close(probe);
    assert_int_equal(taken, 1);
    assert_int_equal(pidfd, 0);
    assert_true(closed0);
    assert_int_equal(offered, 0);
    assert_int_equal(probe0, 0);
}

/* spec: TCP-22: an OFFER whose tag is not its probe's is refused, also when
 * the probe's descriptor, taken into this process, lands on 0 (stdin closed
 * by another thread while the acceptor works); the right one is accepted
 * there too, and the taken descriptor is closed either way. */
static void test_shm_probe_on_descriptor_0_checked(void **state) {
    (void)state;
    if (!tt_can_take_fds()) {
        fprintf(stderr, "  pidfd_getfd is not permitted here\n");
        skip();
    }
    uint32_t v[3], wrong[3];
    int probe = offer_to_worker_1(v);
    memcpy(wrong, v, sizeof v);
    wrong[2] ^= 1; /* another tag */
    assert_int_equal(accept_offer(v), 1);
    assert_int_equal(accept_offer(wrong), 0);
    int saved = dup(0);
    assert_true(saved > 0);
    assert_int_equal(close(0), 0);
    move_pidfd_to = 64;
    for (int right = 0; right <= 1; right++) {
        last_taken_fd = -1;
        assert_int_equal(accept_offer(right ? v : wrong), right);
        assert_int_equal(last_taken_fd, 0);      /* the case meant */
        assert_int_equal(fcntl(0, F_GETFD), -1); /* and closed again */
    }
    move_pidfd_to = 0;
    assert_int_equal(dup2(saved, 0), 0); /* stdin back */
    close(saved);
    close(probe);
}

/* spec: TCP-22: every field of the probe is checked, each on its own: its
 * magic, both ranks, the world's size, the dialer's pid and the tag; a byte
 * changed in any of them is refused, and the probe put back is accepted. A
 * probe cut short is refused too. */
static void test_shm_probe_every_field_checked(void **state) {
    (void)state;
    if (!tt_can_take_fds()) {
        fprintf(stderr, "  pidfd_getfd is not permitted here\n");
        skip();
    }
    uint32_t v[3];
    int probe = offer_to_worker_1(v);
    static const int fields[] = {0, 7, 8, 12, 16, 20, 24, 27}; /* magic, ranks, world, pid, tag */
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        uint8_t b;
        assert_int_equal(pread(probe, &b, 1, fields[i]), 1);
        uint8_t changed = (uint8_t)(b ^ 0x40);
        assert_int_equal(pwrite(probe, &changed, 1, fields[i]), 1);
        assert_int_equal(accept_offer(v), 0);
        assert_int_equal(pwrite(probe, &b, 1, fields[i]), 1);
        assert_int_equal(accept_offer(v), 1);
    }
    assert_int_equal(ftruncate(probe, TPI_SHM_PROBE_SIZE - 1), 0);
    assert_int_equal(accept_offer(v), 0);
    close(probe);
}

/* ---- A slab's header names its two ends (the acceptor's side alone) ---------- */

/* Reads the slab of record v as worker me whose peer is worker peer (the
 * slab is this process's own, taken back with pidfd_getfd as a worker takes
 * its dialer's): 1 when its frame was handed on, 0 when refused (err says
 * why), -1 when this system cannot take a descriptor at all. */
static int read_slab_as(const uint32_t v[3], uint32_t peer, uint32_t me, char *err, size_t len) {
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (pidfd < 0)
        return -1;
    tpi_shm_rx *rx = tpi_shm_rx_for_fuzz(pidfd, peer, me, (uint64_t)1 << 20);
    assert_non_null(rx);
    err[0] = '\0';
    tp_frame *f = tpi_shm_frame(rx, v, (uint64_t)1 << 20, err, len);
    if (!f && strstr(err, "pidfd_getfd")) {
        tpi_shm_rx_detach(rx); /* closes pidfd */
        return -1;
    }
    if (f)
        assert_int_equal(f->len, v[2]);
    tp_frame_free(f);
    tpi_shm_rx_detach(rx);
    return f != NULL;
}

/* A frame of body bytes (a valid header) packed for worker 1 by a, its
 * FRAME record's values in v. */
static void pack_body(tpi_tcp_agent *a, size_t body, uint32_t v[3]) {
    tp_frame *f = tp_frame_alloc(TP_FRAME_HEADER_SIZE + body);
    assert_non_null(f);
    memset(tp_frame_bytes(f), 0, f->len);
    tt_frame_header(tp_frame_bytes(f), TPI_WIRE_VERSION, TPI_MSG_REQUEST, (uint32_t)body);
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    assert_int_equal(tpi_shm_pack(a, 1, 1, f, rec), 0);
    tp_frame_free(f);
    assert_int_equal(tpi_tcp_shm_decode(rec, v), TPI_TCP_SHM_FRAME);
}

/* Worker 0 of world (a bare agent, 8 MiB pool) packs a REQUEST of body
 * bytes for worker 1 into a slab: the FRAME record's values in v. The
 * caller frees peers[1].shm_tx. */
static void pack_for_worker_1(tpi_tcp_agent *a, tpi_tcp_peer *peers, uint32_t world, size_t body,
                              uint32_t v[3]) {
    memset(a, 0, sizeof *a);
    a->rank = 0;
    a->world_size = world;
    a->shm_pool = 8 * MIB;
    memset(peers, 0, world * sizeof *peers);
    a->peers = peers;
    pack_body(a, body, v);
}

/* spec: TCP-22: a slab names who wrote it and for whom; a FRAME record whose
 * slab names another sender, or another receiver, is refused, so a slab
 * meant for someone else is never read as this connection's frame. */
static void test_shm_slab_header_names_both_ends(void **state) {
    (void)state;
    tpi_tcp_agent a;
    tpi_tcp_peer peers[3];
    uint32_t v[3];
    pack_for_worker_1(&a, peers, 3, 1000, v);
    char err[TP_ERRMSG_LEN_MAX];
    int got = read_slab_as(v, 0, 1, err, sizeof err); /* worker 1, from worker 0: its own */
    if (got < 0) {
        tpi_shm_tx_free(peers[1].shm_tx);
        fprintf(stderr, "  pidfd_getfd is not permitted here\n");
        skip();
    }
    assert_int_equal(got, 1);
    /* The right sender for another receiver, and another sender for the
     * right receiver: each refused, saying why. */
    const uint32_t ends[][2] = {{0, 2}, {2, 1}, {2, 0}};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        assert_int_equal(read_slab_as(v, ends[i][0], ends[i][1], err, sizeof err), 0);
        assert_non_null(strstr(err, "header does not match"));
    }
    /* A record naming a slot past the table, generation 0 or a frame shorter
     * than its header is refused before any slab is looked at. */
    uint32_t gen = v[1] >> 8;
    const uint32_t bad[][2] = {{TPI_SHM_SLABS_MAX | gen << 8, v[2]},
                               {0xff | gen << 8, v[2]},
                               {v[1] & 0xffu, v[2]},
                               {v[1], TP_FRAME_HEADER_SIZE - 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint32_t w[3] = {v[0], bad[i][0], bad[i][1]};
        char want[96];
        snprintf(want, sizeof want,
                 "shared memory record for slot %u (generation %u), frame of %u "
                 "bytes",
                 w[1] & 0xffu, w[1] >> 8, w[2]);
        assert_int_equal(read_slab_as(w, 0, 1, err, sizeof err), 0);
        if (!strstr(err, want))
            fail_msg("record %zu: '%s' lacks '%s'", i, err, want);
    }
    tpi_shm_tx_free(peers[1].shm_tx);
}

/* spec: TCP-22: a slab's descriptor, taken into the receiver, may land on 0
 * (stdin closed by another thread while it works): the frame is read all
 * the same, and the descriptor closed once mapped. */
static void test_shm_slab_taken_on_descriptor_0_read(void **state) {
    (void)state;
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    uint32_t v[3];
    pack_for_worker_1(&a, peers, 2, 5000, v);
    char err[TP_ERRMSG_LEN_MAX];
    int saved = dup(0);
    assert_true(saved > 0);
    assert_int_equal(close(0), 0);
    move_pidfd_to = 64;
    last_taken_fd = -1;
    int got = read_slab_as(v, 0, 1, err, sizeof err);
    move_pidfd_to = 0;
    int taken = last_taken_fd, open0 = fcntl(0, F_GETFD);
    assert_int_equal(dup2(saved, 0), 0); /* stdin back before any assert */
    close(saved);
    tpi_shm_tx_free(peers[1].shm_tx);
    if (got < 0) {
        fprintf(stderr, "  pidfd_getfd is not permitted here\n");
        skip();
    }
    if (got != 1)
        fail_msg("the slab on descriptor 0 was not read: %s", err);
    assert_int_equal(taken, 0);  /* the case meant */
    assert_int_equal(open0, -1); /* and closed again */
}

/* mmap and fallocate as the kernel's (made as raw system calls, so no
 * lookup can recurse), except that a test may fail a shared mapping of a
 * descriptor (ENOMEM) or an allocation of a file's pages (ENOSPC): a slab
 * that cannot be made on a full machine. */
static int fail_shared_mmap, fail_fallocate, fail_pwrite;

/* Not under ThreadSanitizer, whose runtime maps its shadow memory through
 * its own mmap interceptor, which these would replace. */
#if !defined(__SANITIZE_THREAD__)
#define SHM_FAIL_STANDINS 1
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    if (fail_shared_mmap && (flags & MAP_SHARED) && fd >= 0) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

int fallocate(int fd, int mode, off_t off, off_t len) {
    if (fail_fallocate) {
        errno = ENOSPC;
        return -1;
    }
    return (int)syscall(SYS_fallocate, fd, mode, off, len);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    if (fail_pwrite) {
        errno = ENOSPC;
        return -1;
    }
    return (ssize_t)syscall(SYS_pwrite64, fd, buf, n, off);
}
#endif

/* Descriptors open in this process. */
static size_t open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own */
}

/* spec: TCP-22: a slab that cannot be made (its pages not reserved, or not
 * mapped) leaves nothing behind: the frame takes the stream, and no
 * descriptor stays open; once memory is back, a slab is made. */
static void test_shm_slab_not_made_leaks_nothing(void **state) {
    (void)state;
#ifndef SHM_FAIL_STANDINS
    skip();
#endif
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    pool_agent(&a, peers);
    uint32_t gen = 0;
    for (int step = 0; step < 2; step++) {
        size_t before = open_fds();
        fail_fallocate = step == 0;
        fail_shared_mmap = step == 1;
        int slot = pack(&a, 1 * MIB, &gen);
        fail_fallocate = fail_shared_mmap = 0;
        assert_int_equal(slot, -1); /* the frame takes the stream */
        assert_int_equal(open_fds(), before);
    }
    assert_true(pack(&a, 1 * MIB, &gen) >= 0);
    tpi_shm_tx_free(peers[1].shm_tx);
}

/* The receiver's side reads the frame v names, frees it and gives the slot
 * back as its RELEASE would; the dialer takes the release. */
static void read_and_release(tpi_tcp_agent *a, tpi_shm_rx *rx, const uint32_t v[3]) {
    char err[TP_ERRMSG_LEN_MAX] = "";
    tp_frame *f = tpi_shm_frame(rx, v, 8 * MIB, err, sizeof err);
    if (!f)
        fail_msg("slot %u generation %u: %s", v[1] & 0xff, v[1] >> 8, err);
    assert_int_equal(f->len, v[2]);
    tp_frame_free(f);
    tpi_shm_rx *next = NULL;
    uint32_t released = 0;
    (void)tpi_shm_rx_take(rx, &next, &released);
    assert_int_equal(released, 1u << (v[1] & 0xff));
    assert_int_equal(tpi_shm_release(a, 1, 1, v[1] & 0xff), 0);
}

/* spec: TCP-22: the receiver takes a slab's descriptor and maps it once per
 * generation: later frames in that slab use the mapping; when the dialer
 * makes a new slab in the slot (a new generation), the old mapping goes
 * and the new slab is taken, and nothing stays mapped at the end. */
static void test_shm_slab_taken_once_per_generation(void **state) {
    (void)state;
    if (!tt_can_take_fds()) {
        fprintf(stderr, "  pidfd_getfd is not permitted here\n");
        skip();
    }
    size_t maps0 = slab_maps();
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    pool_agent(&a, peers);
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    assert_true(pidfd >= 0);
    tpi_shm_rx *rx = tpi_shm_rx_for_fuzz(pidfd, 0, 1, 8 * MIB);
    assert_non_null(rx);
    uint32_t v[3], w[3], x[3];
    pack_body(&a, 1 * MIB, v); /* a 2 MiB slab */
    int taken0 = ntaken;
    read_and_release(&a, rx, v);
    assert_int_equal(ntaken, taken0 + 1);
    pack_body(&a, 1 * MIB, w); /* the same slab again */
    assert_int_equal(w[1], v[1]);
    read_and_release(&a, rx, w);
    assert_int_equal(ntaken, taken0 + 1); /* its mapping reused */
    a.shm_pool = 4 * MIB;                 /* room for one 4 MiB slab: the 2 MiB one goes */
    pack_body(&a, 3 * MIB, x);
    assert_int_equal(x[1] & 0xff, v[1] & 0xff);
    assert_true(x[1] >> 8 > v[1] >> 8);
    read_and_release(&a, rx, x);
    assert_int_equal(ntaken, taken0 + 2);
    tpi_shm_rx_detach(rx);
    tpi_shm_tx_free(peers[1].shm_tx);
    assert_int_equal(slab_maps(), maps0);
}

static int wakes;

static void count_wake(uv_async_t *h) {
    (void)h;
    wakes++;
}

/* Worker 1's side of an offer from this process, for connection conn; its
 * pidfd in *pidfd. */
static tpi_shm_rx *accepted_side(tpi_tcp_agent *b, void *conn, int *pidfd) {
    uint32_t v[3];
    int probe = offer_to_worker_1(v);
    const char *why = NULL;
    last_pidfd = -1;
    tpi_shm_rx *rx = tpi_shm_accept(b, 0, conn, v, &why, &no_link, &no_ring_why);
    close(probe);
    if (!rx)
        fail_msg("%s", why);
    *pidfd = last_pidfd;
    return rx;
}

static tp_frame *frame_of(tpi_shm_rx *rx, const uint32_t v[3]) {
    char err[TP_ERRMSG_LEN_MAX] = "";
    tp_frame *f = tpi_shm_frame(rx, v, 8 * MIB, err, sizeof err);
    if (!f)
        fail_msg("%s", err);
    return f;
}

/* The loop's walk of the sides with releases to tell: each side's
 * connection (a tag) and released slots, into got[tag]; the number of
 * entries on the list. */
static int take_releases(tpi_tcp_agent *b, const int *tags, uint32_t got[3]) {
    int n = 0;
    memset(got, 0, 3 * sizeof *got);
    tpi_shm_rx *next = NULL;
    for (tpi_shm_rx *rx = tpi_shm_released_take(b); rx; rx = next) {
        uint32_t released = 0;
        const int *conn = tpi_shm_rx_take(rx, &next, &released);
        assert_true(conn >= tags && conn < tags + 3);
        assert_int_equal(got[conn - tags], 0); /* once on the list */
        got[conn - tags] = released;
        tpi_shm_rx_unref(rx); /* the list's reference */
        n++;
    }
    return n;
}

/* spec: TCP-22: frames freed on the receiving side put their side on the
 * loop's list of releases to tell, once however many of its frames end
 * first, and wake the loop; a side whose connection closes comes off the
 * list (its releases go nowhere, its pidfd is closed with it), the others
 * stay; a frame freed after its side was detached lists nothing. */
static void test_shm_releases_listed_once_per_side(void **state) {
    (void)state;
    if (!tt_can_take_fds()) {
        fprintf(stderr, "  pidfd_getfd is not permitted here\n");
        skip();
    }
    tpi_tcp_agent a, b;
    tpi_tcp_peer peers[2];
    pool_agent(&a, peers);
    a.shm_pool = 32 * MIB;
    memset(&b, 0, sizeof b);
    b.rank = 1;
    b.world_size = 2;
    b.max_msg = 8 * MIB;
    assert_int_equal(pthread_mutex_init(&b.qmu, NULL), 0);
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    assert_int_equal(uv_async_init(&loop, &b.wake, count_wake), 0);
    static const int tags[3] = {0, 1, 2}; /* A, B, R: their connections */
    int pidfd[3];
    tpi_shm_rx *rx[3];
    for (int i = 0; i < 3; i++)
        rx[i] = accepted_side(&b, (void *)&tags[i], &pidfd[i]);
    uint32_t v[4][3];
    for (int i = 0; i < 4; i++)
        pack_body(&a, 1 * MIB, v[i]);
    /* Slot 0 read by B, 1 by R, 2 by A, 3 by R; freed in that order. */
    static const int reader[4] = {1, 2, 0, 2};
    tp_frame *f[4];
    for (int i = 0; i < 4; i++)
        f[i] = frame_of(rx[reader[i]], v[i]);
    wakes = 0;
    for (int i = 0; i < 4; i++)
        tp_frame_free(f[i]);
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_true(wakes >= 1);
    uint32_t got[3];
    assert_int_equal(take_releases(&b, tags, got), 3);
    assert_int_equal(got[0], 1u << (v[2][1] & 0xff));
    assert_int_equal(got[1], 1u << (v[0][1] & 0xff));
    assert_int_equal(got[2], 1u << (v[1][1] & 0xff) | 1u << (v[3][1] & 0xff));
    for (int i = 0; i < 4; i++)
        assert_int_equal(tpi_shm_release(&a, 1, 1, v[i][1] & 0xff), 0);
    /* A's and B's frames end (the list: B, then A); A's connection closes. */
    for (int i = 0; i < 3; i++)
        pack_body(&a, 1 * MIB, v[i]);
    tp_frame *fa = frame_of(rx[0], v[0]), *fb = frame_of(rx[1], v[1]);
    tp_frame *kept = frame_of(rx[1], v[2]);
    tp_frame_free(fa);
    tp_frame_free(fb);
    tpi_shm_rx_detach(rx[0]);
    assert_int_equal(fcntl(pidfd[0], F_GETFD), -1); /* A's side is gone */
    assert_int_equal(take_releases(&b, tags, got), 1);
    assert_int_equal(got[1], 1u << (v[1][1] & 0xff));
    /* B's connection closes with a frame of it still held: freed later,
     * it tells nobody. */
    tpi_shm_rx_detach(rx[1]);
    tp_frame_free(kept);
    assert_null(tpi_shm_released_take(&b));
    assert_int_equal(fcntl(pidfd[1], F_GETFD), -1);
    tpi_shm_rx_detach(rx[2]);
    assert_int_equal(fcntl(pidfd[2], F_GETFD), -1);
    tpi_shm_tx_free(peers[1].shm_tx);
    uv_close((uv_handle_t *)&b.wake, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    pthread_mutex_destroy(&b.qmu);
}

/* spec: TCP-22: a probe that cannot be written (its memfd's page not
 * there: a memory cgroup at its limit) is no offer, and leaves no
 * descriptor open. */
static void test_shm_offer_without_its_probe_leaks_nothing(void **state) {
    (void)state;
#ifndef SHM_FAIL_STANDINS
    skip();
#endif
    tpi_tcp_agent a;
    memset(&a, 0, sizeof a);
    a.rank = 0;
    a.world_size = 2;
    int probe = -1;
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    size_t before = open_fds();
    fail_pwrite = 1;
    int rc = tpi_shm_offer(&a, 1, &probe, &no_link, rec);
    fail_pwrite = 0;
    assert_int_equal(rc, -1);
    assert_int_equal(probe, -1);
    assert_int_equal(open_fds(), before);
}

/* ---- An answer held past the connection it came on (TCP-19, TCP-22) -------------- */

enum { C_IDLE_ASKED = 4, F_HELD_DONE = 1 };

static void count_idle_asked(tp_log_level level, const char *msg, void *ud) {
    (void)level;
    tt_shared *sh = ud;
    if (strstr(msg, "worker 0 asks worker 1 to close its connection"))
        atomic_fetch_add(&sh->count[C_IDLE_ASKED], 1);
}

static int body_held_past_close(tt_job *job, int rank) {
    shared = job->shared;
    tp_register_function("where", fn_where, NULL);
    tp_options *o = tt_options(job, 30, 10);
    TT_CHECK(o && tp_options_set(o, "idle_timeout", TT_IDLE_TIMEOUT) == TP_OK);
    if (rank == 0) {
        tp_set_log_level(TP_LOG_DEBUG);
        tp_set_log_callback(count_idle_asked, job->shared);
    }
    TT_CHECK(tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        for (int round = 0; round < 2; round++) {
            /* A new connection's first frames may pass before its offer is
             * taken up (they wait for nothing): call until an answer comes
             * in a slab. */
            int asked = atomic_load(&shared->count[C_IDLE_ASKED]);
            tp_value *res = NULL;
            for (int tries = 0; tries < 5 && !res; tries++) {
                tp_value *args =
                    tp_value_list_of(2, tp_value_bytes("", 0), filled((float)(1000 * round)));
                TT_CHECK(args &&
                         tp_rpc_sync(tp_to_rank(1), "where", args, NULL, 30, &res) == TP_OK);
                tp_value_free(args);
                TT_CHECK(holds(res, (float)(1000 * round)));
                if (!in_slab(tp_tensor_data(res))) {
                    tp_value_free(res);
                    res = NULL;
                }
            }
            TT_CHECK(res != NULL);
            /* Held while worker 1's connection, which brought it, goes idle
             * and closes (idle_timeout, then at most as long again for the
             * close): its slab's release then has no connection left. */
            usleep(TT_SLOWDOWN * 1500000);
            TT_CHECK(atomic_load(&shared->count[C_IDLE_ASKED]) > asked);
            TT_CHECK(holds(res, (float)(1000 * round)));
            tp_value_free(res);
            usleep(TT_SLOWDOWN * 100000); /* the release, on the loop thread */
        }
        atomic_store(&shared->flag[F_HELD_DONE], 1);
    } else {
        TT_CHECK(tt_await_flag(shared, F_HELD_DONE, 1, 90) == 0);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* spec: TCP-19 TCP-22: worker 0 holds an answer that arrived in worker 1's
 * slab while the connection it came on closes as idle, then frees it. The
 * release finds no connection to tell (the dialer gave its slabs up when
 * the connection ended) and is dropped; the next call, on a new
 * connection, arrives in a slab again, and both workers shut down well. */
static void test_shm_answer_held_past_its_connection(void **state) {
    (void)state;
    tt_job job = {0};
    shm_job(&job, 2, body_held_past_close, NULL, 120);
    assert_true(atomic_load(&job.shared->count[C_IDLE_ASKED]) >= 2);
    tt_job_free(&job);
}

/* Mappings of slab memfds in this process (the frame cache and malloc
 * map and keep other memory as they like, so only these are counted). */
static size_t slab_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    size_t n = 0;
    char line[512];
    while (fgets(line, sizeof line, f))
        n += strstr(line, "memfd:tensorplay-shm") != NULL;
    fclose(f);
    return n;
}

/* spec: TCP-22: the receiver maps a slab once and unmaps it when nothing
 * holds it any more: here the frame is freed and the connection's side
 * detached, and this process has the mappings it had before (the dialer's
 * own mapping of the slab, made by the pack, stays until its side is freed). */
static void test_shm_receiver_unmaps_a_slab_when_done(void **state) {
    (void)state;
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    uint32_t v[3];
    pack_for_worker_1(&a, peers, 2, 5000, v);
    char err[TP_ERRMSG_LEN_MAX];
    size_t before = slab_maps();
    int got = read_slab_as(v, 0, 1, err, sizeof err);
    size_t after = slab_maps();
    tpi_shm_tx_free(peers[1].shm_tx);
    if (got < 0) {
        fprintf(stderr, "  pidfd_getfd is not permitted here\n");
        skip();
    }
    if (got != 1)
        fail_msg("the slab was not read: %s", err);
    assert_int_equal(after, before);
}

/* Reads the frame of record v as worker 1 from worker 0 with a max_message_size
 * of max: 1 read (err names nothing), 0 refused (err says why), -1 when
 * pidfd_getfd is not permitted. */
static int read_slab_max(const uint32_t v[3], uint64_t max, char *err, size_t len) {
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (pidfd < 0)
        return -1;
    tpi_shm_rx *rx = tpi_shm_rx_for_fuzz(pidfd, 0, 1, max);
    assert_non_null(rx);
    err[0] = '\0';
    tp_frame *f = tpi_shm_frame(rx, v, max, err, len);
    int got = f ? 1 : strstr(err, "pidfd_getfd") ? -1 : 0;
    tp_frame_free(f);
    tpi_shm_rx_detach(rx);
    return got;
}

/* spec: TCP-22: every field of a slab's header is checked against its
 * record, each alone: magic, slot, frame length, slab size, generation,
 * and where the frame starts (64..127); a frame whose own header gives
 * another length is refused too. The slab's size may be exactly what a
 * frame of max_message_size needs (2 MiB for 2 MiB - 128 bytes). Each
 * change is made in this process's own mapping and undone after. */
static void test_shm_slab_header_checked_field_by_field(void **state) {
    (void)state;
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    uint32_t v[3];
    pack_for_worker_1(&a, peers, 2, 1000, v);
    const uint64_t cap = TPI_SHM_SLAB_STEP;
    assert_int_equal(tpi_shm_slab_size(v[2]), cap);
    uint8_t *m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, (int)v[0], 0);
    assert_true(m != MAP_FAILED);
    char err[TP_ERRMSG_LEN_MAX];
    int got = read_slab_max(v, cap - TPI_SHM_HEAD - TPI_SHM_ALIGN, err, sizeof err);
    if (got < 0) {
        munmap(m, cap);
        tpi_shm_tx_free(peers[1].shm_tx);
        fprintf(stderr, "  pidfd_getfd is not permitted here\n");
        skip();
    }
    assert_int_equal(got, 1); /* whole, at max_message_size's own slab size */
    static const struct {
        size_t at;
        uint32_t value;
        const char *says;
    } fields[] = {
        {0, 0x58585858u, "header does not match"},                   /* magic */
        {16, 1, "header does not match"},                            /* slot */
        {20, 1001, "header does not match"},                         /* frame length */
        {24, 1, "header does not match"},                            /* slab size (low word) */
        {32, 7, "header does not match"},                            /* generation */
        {36, TPI_SHM_HEAD - 1, "header does not match"},             /* starts in the header */
        {36, TPI_SHM_HEAD + TPI_SHM_ALIGN, "header does not match"}, /* past the alignment */
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        uint8_t keep[4];
        memcpy(keep, m + fields[i].at, 4);
        tpi_tcp_put_u32(m + fields[i].at, fields[i].value);
        got = read_slab_max(v, 4 * MIB, err, sizeof err);
        memcpy(m + fields[i].at, keep, 4);
        if (got != 0 || !strstr(err, fields[i].says))
            fail_msg("field at %zu set to %u: %s", fields[i].at, fields[i].value,
                     got ? "read" : err);
    }
    /* The frame's own header: one byte more of body than the record says. */
    uint32_t at = tpi_tcp_get_u32(m + 36);
    uint8_t keep[TP_FRAME_HEADER_SIZE];
    memcpy(keep, m + at, sizeof keep);
    tt_frame_header(m + at, TPI_WIRE_VERSION, TPI_MSG_REQUEST, 1001);
    got = read_slab_max(v, 4 * MIB, err, sizeof err);
    memcpy(m + at, keep, sizeof keep);
    assert_int_equal(got, 0);
    assert_non_null(strstr(err, "its frame's length differs from the record"));
    assert_int_equal(read_slab_max(v, 4 * MIB, err, sizeof err), 1); /* all undone */
    munmap(m, cap);
    tpi_shm_tx_free(peers[1].shm_tx);
}

/* spec: TCP-22: a slab's frame lies within the slab: one that ends on its
 * last byte is read, one a byte longer is refused. (Our packer always
 * leaves room at the end; a peer's slab need not.) The frame is moved to
 * the slab's end by hand, in this process's own mapping of the memfd. */
static void test_shm_frame_may_end_at_the_slab_end(void **state) {
    (void)state;
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    uint32_t v[3];
    const uint64_t cap = TPI_SHM_SLAB_STEP;
    pack_for_worker_1(&a, peers, 2, cap - TPI_SHM_HEAD - TPI_SHM_ALIGN - TP_FRAME_HEADER_SIZE, v);
    assert_int_equal(tpi_shm_slab_size(v[2]), cap); /* one slab of the least size */
    uint8_t *m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, (int)v[0], 0);
    assert_true(m != MAP_FAILED);
    const uint32_t at = TPI_SHM_HEAD + TPI_SHM_ALIGN - 1; /* the furthest a frame may start */
    char err[TP_ERRMSG_LEN_MAX];
    for (uint32_t extra = 0; extra <= 1; extra++) {
        uint32_t len = (uint32_t)(cap - at) + extra;
        tt_frame_header(m + at, TPI_WIRE_VERSION, TPI_MSG_REQUEST, len - TP_FRAME_HEADER_SIZE);
        tpi_tcp_put_u32(m + 20, len);
        tpi_tcp_put_u32(m + 36, at);
        uint32_t w[3] = {v[0], v[1], len};
        int got = read_slab_max(w, 4 * MIB, err, sizeof err);
        if (got < 0) {
            munmap(m, cap);
            tpi_shm_tx_free(peers[1].shm_tx);
            fprintf(stderr, "  pidfd_getfd is not permitted here\n");
            skip();
        }
        if (got != !extra)
            fail_msg("a frame ending %u byte(s) past the slab's last: %s (%s)", extra,
                     got ? "read" : "refused", err);
        if (extra)
            assert_non_null(strstr(err, "header does not match"));
    }
    munmap(m, cap);
    tpi_shm_tx_free(peers[1].shm_tx);
}

/* spec: TCP-22: the dialer's slabs (a mapping and a memfd each) go when
 * its side is freed, busy or not: this process has the slab mappings and
 * the descriptors it had before. */
static void test_shm_dialer_unmaps_its_slabs_when_freed(void **state) {
    (void)state;
    size_t maps_before = slab_maps();
    size_t fds_before = open_fds();
    tpi_tcp_agent a;
    tpi_tcp_peer peers[2];
    pool_agent(&a, peers);
    uint32_t gen = 0;
    int first = pack(&a, 1 * MIB, &gen);
    assert_true(first >= 0);
    assert_true(pack(&a, 2 * MIB, &gen) >= 0); /* the first is busy: a second slab */
    assert_int_equal(tpi_shm_release(&a, 1, 1, (uint32_t)first), 0); /* one free, one busy */
    assert_int_equal(slab_maps(), maps_before + 2);
    assert_int_equal(open_fds(), fds_before + 2);
    tpi_shm_tx_free(peers[1].shm_tx);
    assert_int_equal(open_fds(), fds_before);
    assert_int_equal(slab_maps(), maps_before);
}

/* ---- A ring's offer, checked by the acceptor (TCP-28) ---------------------------- */

/* An offer with a 4 KiB ring, from worker 0 (this process): the probe's
 * descriptor (open, for the test to change), and the dialer's link. */
static int ring_offer(uint32_t v[3], tpi_shm_link **l) {
    tpi_tcp_agent a;
    memset(&a, 0, sizeof a);
    a.rank = 0;
    a.world_size = 2;
    a.shm_ring = 4096;
    int probe = -1;
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    assert_int_equal(tpi_shm_offer(&a, 1, &probe, l, rec), 0);
    assert_non_null(*l);
    assert_int_equal(tpi_tcp_shm_decode(rec, v), TPI_TCP_SHM_OFFER);
    return probe;
}

/* Worker 1, with shm_ring_bytes ring, takes offer v: the slabs' side always
 * (the probe holds), the ring's end or NULL with the reason in *why. */
static tpi_shm_link *ring_accept(const uint32_t v[3], uint64_t ring, const char **why) {
    tpi_tcp_agent b;
    memset(&b, 0, sizeof b);
    b.rank = 1;
    b.world_size = 2;
    b.max_msg = MIB;
    b.shm_ring = ring;
    const char *rx_why = NULL;
    tpi_shm_link *got = NULL;
    *why = NULL;
    tpi_shm_rx *rx = tpi_shm_accept(&b, 0, NULL, v, &rx_why, &got, why);
    assert_non_null(rx);
    tpi_shm_rx_unref(rx);
    assert_true(!got || !*why);
    return got;
}

static void probe_put32(int probe, off_t at, uint32_t x) {
    uint8_t b[4];
    tpi_tcp_put_u32(b, x);
    assert_int_equal(pwrite(probe, b, 4, at), 4);
}

/* Offers a 4 KiB ring with field at (probe bytes 40..55: ring, data bell,
 * room bell, size) set to x, or the ring's magic scribbled when at is 0:
 * worker 1 refuses the ring for why, and keeps nothing of it. */
static void ring_refused_for(off_t at, uint32_t x, const char *why) {
    uint32_t v[3];
    tpi_shm_link *l = NULL;
    int probe = ring_offer(v, &l);
    if (at)
        probe_put32(probe, at, x);
    else
        l->map[0] = 'X';
    const char *got_why = NULL;
    tpi_shm_link *got = ring_accept(v, 4096, &got_why);
    assert_null(got);
    assert_non_null(got_why);
    if (!strstr(got_why, why))
        fail_msg("ring refused: %s (not: %s)", got_why, why);
    tpi_shm_link_free(l);
    close(probe);
}

/* spec: TCP-28: the acceptor maps a ring only as offered (a memfd sealed
 * against shrinking, of exactly the size the probe names, within the
 * option's bounds, its header whole) and takes only eventfds for bells;
 * anything else leaves the pair on slabs and the stream, the reason named,
 * nothing of the offer kept open. The ring it takes is the dialer's: what
 * one end writes the other reads, and the writer's wake-up rings the
 * reader's bell. */
static void test_ring_offer_checked(void **state) {
    (void)state;
    if (!tt_can_take_fds()) {
        fprintf(stderr, "  pidfd_getfd is not permitted here\n");
        skip();
    }
    size_t before = open_fds();
    uint32_t v[3];
    tpi_shm_link *l = NULL;
    const char *why = NULL;
    int probe = ring_offer(v, &l);
    tpi_shm_link *got = ring_accept(v, 4096, &why);
    assert_non_null(got);
    assert_int_equal(got->ring.cap, 4096);
    assert_false(got->ring.writer);
    assert_int_equal(tpi_ring_arm(&got->ring), 0); /* asleep: the next record rings */
    struct iovec iov = {(void *)"hello", 5};
    assert_int_equal(tpi_ring_write(&l->ring, &iov, 1), TPI_RING_OK);
    struct pollfd pf = {.fd = got->wait_fd, .events = POLLIN};
    assert_int_equal(poll(&pf, 1, 1000), 1);
    char buf[8];
    size_t n = 0;
    assert_int_equal(tpi_ring_arm(&l->ring), 0); /* the writer waits for room */
    assert_int_equal(tpi_ring_read(&got->ring, buf, sizeof buf, &n), TPI_RING_OK);
    assert_true(n == 5 && memcmp(buf, "hello", 5) == 0);
    pf.fd = l->wait_fd; /* the room bell rang */
    assert_int_equal(poll(&pf, 1, 1000), 1);
    tpi_shm_link_free(got);
    tpi_shm_link_free(l);
    close(probe);
    /* A worker with shm_ring_bytes 0 takes none, and an offer without a
     * ring gives none: choices, no reasons to log. */
    probe = ring_offer(v, &l);
    assert_null(ring_accept(v, 0, &why));
    assert_null(why);
    tpi_shm_link_free(l);
    close(probe);
    probe = offer_to_worker_1(v);
    assert_null(ring_accept(v, 4096, &why));
    assert_null(why);
    close(probe);
    ring_refused_for(52, 4096 + 512 + 4096, "not a sealed memfd of the size offered");
    ring_refused_for(52, 4096 + 511, "a ring of a size outside the bounds");
    ring_refused_for(52, 512 + (256u << 20) + 1, "a ring of a size outside the bounds");
    int pp[2];
    assert_int_equal(pipe(pp), 0);
    ring_refused_for(44, (uint32_t)pp[0], "a bell that is not an eventfd");
    ring_refused_for(48, (uint32_t)pp[1], "a bell that is not an eventfd");
    close(pp[0]);
    close(pp[1]);
    int m = memfd_create("unsealed", MFD_CLOEXEC);
    assert_true(m >= 0 && ftruncate(m, 4096 + 512) == 0);
    ring_refused_for(40, (uint32_t)m, "not a sealed memfd of the size offered");
    close(m);
    ring_refused_for(0, 0, "the ring's header does not hold");
    assert_int_equal(open_fds(), before);
}

int main(int argc, char **argv) {
    tt_ensure_secret();
    if (argc > 1)
        cmocka_set_test_filter(argv[1]); /* a glob: one test by hand */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shm_tensors),
        cmocka_unit_test(test_shm_tensors_without_auth),
        cmocka_unit_test(test_shm_min_bytes_is_inclusive),
        cmocka_unit_test(test_shm_frame_over_the_pool_takes_the_stream),
        cmocka_unit_test(test_shm_off),
        cmocka_unit_test(test_ring_keeps_order_across_roads),
        cmocka_unit_test(test_ring_reader_comes_back_after_a_batch),
        cmocka_unit_test(test_ring_keeps_order_while_spinning),
        cmocka_unit_test(test_ring_burst_while_spinning),
        cmocka_unit_test(test_ring_idle_close_keeps_waiting_frames),
        cmocka_unit_test(test_ring_traffic_is_not_idleness),
        cmocka_unit_test(test_ring_frame_of_max_message_size),
        cmocka_unit_test(test_ring_lent_to_callers),
        cmocka_unit_test(test_shm_kill9),
        cmocka_unit_test(test_shm_every_slab_busy_then_the_stream),
        cmocka_unit_test(test_shm_session_end_keeps_the_others),
        cmocka_unit_test(test_shm_largest_segment_lands_aligned),
        cmocka_unit_test(test_shm_pidfd_and_probe_on_descriptor_0),
        cmocka_unit_test(test_shm_slab_picking),
        cmocka_unit_test(test_shm_release_checks_the_slot),
        cmocka_unit_test(test_shm_smallest_fitting_slab_taken),
        cmocka_unit_test(test_shm_slab_on_descriptor_0_reused),
        cmocka_unit_test(test_shm_probe_on_descriptor_0_checked),
        cmocka_unit_test(test_shm_probe_every_field_checked),
        cmocka_unit_test(test_shm_slab_header_names_both_ends),
        cmocka_unit_test(test_shm_slab_taken_on_descriptor_0_read),
        cmocka_unit_test(test_shm_receiver_unmaps_a_slab_when_done),
        cmocka_unit_test(test_shm_answer_held_past_its_connection),
        cmocka_unit_test(test_shm_dialer_unmaps_its_slabs_when_freed),
        cmocka_unit_test(test_shm_frame_may_end_at_the_slab_end),
        cmocka_unit_test(test_shm_slab_header_checked_field_by_field),
        cmocka_unit_test(test_shm_slab_not_made_leaks_nothing),
        cmocka_unit_test(test_shm_offer_without_its_probe_leaks_nothing),
        cmocka_unit_test(test_shm_offer_of_a_closed_descriptor_refused),
        cmocka_unit_test(test_ring_offer_checked),
        cmocka_unit_test(test_shm_room_made_from_free_slabs_only),
        cmocka_unit_test(test_shm_slab_taken_once_per_generation),
        cmocka_unit_test(test_shm_releases_listed_once_per_side),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
