/*
 * test_rref_faults.c: the rref protocol through PyTorch's faulty agent
 * (issue 9 item 6; spec/rref.md RREF-15, spec/sim.md failsend/delaytype).
 *
 * A user -> user share: w0 creates an rref owned by w1 and hands it to w2,
 * then both let go. The first sends of the protocol's messages fail (each
 * failure breaks its connection: TP_EIO at both ends) or are slowed; the
 * share must still complete through retries: w2's fork is confirmed, w2 and
 * w0 drop their references, and w1 frees the value. Without retries the
 * fork stays unconfirmed, w0 keeps its kept child forever, and the value
 * leaks. Also METHOD-3: a method call that arrives before the remote()
 * making its value waits off the pool.
 */
#define _GNU_SOURCE /* RTLD_NEXT, for alloc_fault.h */
#include <errno.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/blocks.h"
#include "common/codec.h"
#include "common/context.h"
#include "common/core.h"
#include "common/limits.h"
#include "alloc_fault.h"
#include "sim_check.h"
#include "tensorplay/rpc.h"
#include "tensorplay/sim.h"

#define WORLD 3
#define SETTLE_S 5.0 /* virtual seconds for retries to finish: far past their backoff */

static int destroyed;      /* the owner freed the object */
static tp_rref *kept[WORLD]; /* the reference each worker keeps, by rank */

static void obj_destroy(void *state) {
    free(state);
    destroyed++;
}

static tp_status obj_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    *result = tp_value_object("Obj", malloc(1), obj_destroy);
    return *result ? TP_OK : TP_ENOMEM;
}

/* ---- Allocation failures ----------------------------------------------------------- */

/* malloc fails on demand: alloc_fault.h. */

static int rank_of_self(void) {
    tp_worker_info me;
    return tp_get_worker_info(NULL, &me) == TP_OK ? (int)me.id : 0;
}

/* keep(rref): this worker keeps a reference; runs once it is confirmed (RREF-13). */
static tp_status keep_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)call, (void)kwargs, (void)ud;
    tp_rref *r = NULL;
    if (tp_value_get_rref(tp_list_get(args, 0), &r) != TP_OK)
        return TP_ETYPE;
    int me = rank_of_self();
    tp_rref_release(kept[me]);
    kept[me] = tp_rref_clone(r);
    *result = tp_value_bool(tp_rref_confirmed_by_owner(r));
    return TP_OK;
}

/* kept_confirmed(): whether this worker keeps a confirmed reference. */
static tp_status kept_confirmed_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                   tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    tp_rref *r = kept[rank_of_self()];
    *result = tp_value_bool(r && tp_rref_confirmed_by_owner(r));
    return TP_OK;
}

/* drop(): this worker lets go of its reference. */
static tp_status drop_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    int me = rank_of_self();
    tp_rref_release(kept[me]);
    kept[me] = NULL;
    *result = tp_value_nil();
    return TP_OK;
}

/* The rrefs keep_all kept, by rank. */
#define KEEP_ALL_MAX 4
static tp_rref *kept_all[WORLD][KEEP_ALL_MAX];

/* keep_all(rref...): this worker keeps each (at most KEEP_ALL_MAX). */
static tp_status keep_all_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                             tp_value **result, void *ud) {
    (void)call, (void)kwargs, (void)ud;
    int me = rank_of_self();
    for (size_t i = 0; i < tp_list_len(args) && i < KEEP_ALL_MAX; i++) {
        tp_rref *r = NULL;
        if (tp_value_get_rref(tp_list_get(args, i), &r) != TP_OK)
            return TP_ETYPE;
        tp_rref_release(kept_all[me][i]);
        kept_all[me][i] = tp_rref_clone(r);
    }
    *result = tp_value_nil();
    return TP_OK;
}

/* Lets go of what keep_all kept here. */
static void drop_all(void) {
    int me = rank_of_self();
    for (int i = 0; i < KEEP_ALL_MAX; i++) {
        tp_rref_release(kept_all[me][i]);
        kept_all[me][i] = NULL;
    }
}

/* hold(): answers later (FUNC-7), when the program calls release_held();
 * its caller's window bytes stay taken meanwhile, yet nothing runs here. */
static tp_future *held_answer;

static tp_status hold_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)args, (void)kwargs, (void)result, (void)ud;
    if (held_answer || tp_future_new(&held_answer) != TP_OK)
        return TP_EINVAL;
    return tp_call_answer_later(call, held_answer);
}

static void release_held(void) {
    if (held_answer)
        CHECK(tp_future_set_result(held_answer, NULL) == TP_OK);
    tp_future_free(held_answer);
    held_answer = NULL;
}

/* nap(s): sleeps s seconds on the pool. */
static tp_status nap_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *ud) {
    (void)call, (void)kwargs, (void)ud, (void)result;
    double s = 0;
    (void)tp_value_get_float(tp_list_get(args, 0), &s);
    return tp_sleep(s);
}

/* A call that may meet a broken connection (user calls are never retried):
 * tried again until it succeeds, within SETTLE_S. */
static tp_status call_until_ok(int dst, const char *fn, const tp_value *args, tp_value **out) {
    uint64_t end = now_ns() + (uint64_t)(SETTLE_S * 1e9);
    tp_status st;
    do {
        *out = NULL;
        st = tp_rpc_sync(tp_to_rank(dst), fn, args, NULL, 1.0, out);
        if (st == TP_OK)
            return st;
        tp_value_free(*out);
        *out = NULL;
        (void)tp_sleep(0.05);
    } while (now_ns() < end);
    return st;
}

static double shutdown_timeout_s[WORLD] = {30.0, 30.0, 30.0};
static uint64_t max_inflight_bytes[WORLD]; /* 0: the default; for one world (run_plan_with) */

/* Registers the functions and joins the job as w<rank>. */
static tp_status join(int rank, int world_size) {
    CHECK(tp_register_function("obj", obj_fn, NULL) == TP_OK);
    CHECK(tp_register_function("keep", keep_fn, NULL) == TP_OK);
    CHECK(tp_register_function("kept_confirmed", kept_confirmed_fn, NULL) == TP_OK);
    CHECK(tp_register_function("drop", drop_fn, NULL) == TP_OK);
    CHECK(tp_register_function_ex("nb_keep", keep_fn, NULL, TP_FN_NONBLOCKING) == TP_OK);
    CHECK(tp_register_function("keep_all", keep_all_fn, NULL) == TP_OK);
    CHECK(tp_register_function("hold", hold_fn, NULL) == TP_OK);
    CHECK(tp_register_function("nap", nap_fn, NULL) == TP_OK);
    char name[4] = "w0";
    name[1] = (char)('0' + rank);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_shutdown_timeout(o, shutdown_timeout_s[rank]) == TP_OK);
    if (max_inflight_bytes[rank])
        CHECK(tp_options_set_max_inflight_bytes(o, max_inflight_bytes[rank]) == TP_OK);
    tp_status st = tp_init_rpc(name, "SIM", rank, world_size, o);
    tp_options_free(o);
    CHECK(st == TP_OK);
    return st;
}

/* w0's rref to an object on w1, once w1 confirmed it. */
static tp_rref *confirmed_object(void) {
    tp_rref *r = NULL;
    CHECK(tp_remote(tp_to_rank(1), "obj", NULL, NULL, TP_TIMEOUT_INFINITE, &r) == TP_OK);
    while (r && !tp_rref_confirmed_by_owner(r) && tp_sleep(0.01) == TP_OK) {
    }
    return r;
}

static int share_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_rref *r = confirmed_object();
        /* The share: w2 receives our user rref and forks it through w1. */
        tp_value *args = tp_value_list_of(1, tp_value_rref(r));
        tp_future *f = NULL;
        CHECK(tp_rpc_async(tp_to_rank(2), "keep", args, NULL, 2.0, &f) == TP_OK);
        tp_value_free(args);
        tp_rref_release(r); /* only the protocol keeps the value alive now */
        (void)tp_future_wait(f, TP_TIMEOUT_DEFAULT); /* may break with its connection */
        tp_future_free(f);
        tp_value *res = NULL;
        int confirmed = 0;
        uint64_t end = now_ns() + (uint64_t)(SETTLE_S * 1e9);
        while (!confirmed && now_ns() < end) {
            if (tp_rpc_sync(tp_to_rank(2), "kept_confirmed", NULL, NULL, 1.0, &res) == TP_OK)
                (void)tp_value_get_bool(res, &confirmed);
            tp_value_free(res);
            res = NULL;
            if (!confirmed)
                (void)tp_sleep(0.05);
        }
        CHECK(confirmed); /* w2's fork reached w1 through the failed sends */
        CHECK(destroyed == 0); /* w2 still holds it */
        CHECK(call_until_ok(2, "drop", NULL, &res) == TP_OK);
        tp_value_free(res);
        CHECK(tp_sleep(SETTLE_S) == TP_OK);
        CHECK(destroyed == 1); /* every reference gone: the owner freed it */
    }
    CHECK(tp_sleep(rank == 0 ? 0.0 : 2 * SETTLE_S + 2.0) == TP_OK);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/*
 * RREF-15's deferred delete: w2 gets the rref in a call whose deadline (10 ms)
 * passes while its fork waits for a retry (20 ms after the failed send), so
 * the function never runs (RREF-13) and w2 drops the rref with its fork still
 * unanswered. Its delete must wait for the fork's answer: sent at once, it
 * would reach w1 before the repeated fork, which would then record a fork
 * nobody deletes, and the value would never be freed.
 */
static int dropped_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_rref *r = confirmed_object();
        tp_value *args = tp_value_list_of(1, tp_value_rref(r));
        tp_value *res = NULL;
        CHECK(tp_rpc_sync(tp_to_rank(2), "keep", args, NULL, 0.01, &res) != TP_OK);
        tp_value_free(res);
        tp_value_free(args);
        tp_rref_release(r);
        CHECK(tp_sleep(SETTLE_S) == TP_OK);
        CHECK(kept[2] == NULL); /* keep never ran */
        CHECK(destroyed == 1);
    }
    CHECK(tp_sleep(rank == 0 ? 0.0 : SETTLE_S + 1.0) == TP_OK);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/*
 * RREF-18: every delete fails to send, so w0's release never reaches w1
 * (its owner). Each graceful shutdown waits for it until its own deadline,
 * then reports what it could not settle. The side whose deadline comes
 * first reports; the other then sees it gone (peer-down), and a reference
 * to or from a dead worker is settled, not leaked. So with w0's deadline
 * first, w0 reports the delete nobody acknowledged; with w1's first, w1
 * reports the fork nobody deleted; both name the same rref and fork.
 */
static void run_plan_with(const char *plan, tp_sim_program program);

/* Sleeps until virtual time s. */
static void sleep_until(double s) {
    uint64_t at = (uint64_t)(s * 1e9);
    if (now_ns() < at)
        CHECK(tp_sleep((double)(at - now_ns()) / 1e9) == TP_OK);
}

static tp_status shutdown_st[WORLD];
static tp_rref_leak leaks[WORLD][2];
static size_t nleaks[WORLD];
static int leak_objects = 1; /* w0's objects on w1, each leaked the same way (at most 2) */

/* A graceful shutdown: its status and leak report (the first two) noted. */
static void shutdown_noting_leaks(int rank) {
    shutdown_st[rank] = tp_shutdown(1);
    tp_rref_leak *v = NULL;
    size_t n = 0;
    CHECK(tp_shutdown_leaks(&v, &n) == TP_OK);
    nleaks[rank] = n;
    for (size_t i = 0; i < n && i < 2; i++)
        leaks[rank][i] = v[i];
    free(v);
}

static int leak_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_rref *r[2] = {NULL, NULL};
        for (int i = 0; i < leak_objects; i++)
            r[i] = confirmed_object();
        sleep_until(1.0); /* past LEAK_PLAN's start: from here every request fails */
        for (int i = 0; i < leak_objects; i++)
            tp_rref_release(r[i]);
    }
    shutdown_noting_leaks(rank);
    return 0;
}

/* Every delete fails, and so does every request after init: RREF-19's query
 * too, so the owner cannot learn of the release either. */
#define LEAK_PLAN "failsend rref_delete 1000000\nfailsend request 1000000 900\n"

/* Runs program under plan with rank first's shutdown deadline (2 s) before
 * the others' (4 s), the leak notes cleared first. */
static void leak_world_with(const char *plan, int first, tp_sim_program program) {
    memset(leaks, 0, sizeof leaks);
    memset(nleaks, 0, sizeof nleaks);
    for (int r = 0; r < WORLD; r++)
        shutdown_timeout_s[r] = r == first ? 2.0 : 4.0;
    run_plan_with(plan, program);
    for (int r = 0; r < WORLD; r++)
        shutdown_timeout_s[r] = 30.0;
}

static void leak_world(const char *plan, int first) {
    leak_world_with(plan, first, leak_program);
}

/* Runs leak_program with the given rank's deadline first; returns its one leak. */
static const tp_rref_leak *leak_run(int first) {
    leak_world(LEAK_PLAN, first);
    assert_int_equal(shutdown_st[first], TP_ETIMEDOUT); /* its drain waited for the delete */
    for (int r = 0; r < WORLD; r++)
        assert_int_equal(nleaks[r], r == first ? 1 : 0);
    const tp_rref_leak *l = &leaks[first][0];
    assert_int_equal(l->owner, 1);
    assert_int_equal(l->holder, 0);
    assert_int_equal(l->rref_worker, 0); /* w0 made the rref and its fork */
    assert_int_equal(l->fork_worker, 0);
    assert_true(l->rref_n != 0 && l->fork_n != 0 && l->rref_n != l->fork_n);
    return l;
}

/*
 * SHUTDOWN-10: a context's leak list is the last graceful shutdown's. w0's
 * first shutdown leaks one rref (its DELETE fails until 8 s); every worker
 * then joins the job again at 10 s and shuts down cleanly: the list is
 * empty, the first one freed (LeakSanitizer sees it otherwise).
 */
static size_t nleaks_again[WORLD];

static int leak_twice_program(int rank, int world_size, void *arg) {
    if (leak_program(rank, world_size, arg) != 0)
        return 1;
    CHECK(tp_sim_sleep(10.0 - (double)now_ns() / 1e9) == TP_OK); /* not a worker now */
    char name[4] = "w0";
    name[1] = (char)('0' + rank);
    CHECK(tp_init_rpc(name, "SIM", rank, world_size, NULL) == TP_OK);
    CHECK(tp_shutdown(1) == TP_OK);
    tp_rref_leak *v = NULL;
    nleaks_again[rank] = 99;
    CHECK(tp_shutdown_leaks(&v, &nleaks_again[rank]) == TP_OK);
    free(v);
    return 0;
}

static void test_rref_leak_list_replaced_at_the_next_shutdown(void **state) {
    (void)state;
    leak_world_with("failsend rref_delete 1000000 0 8000\nfailsend request 1000000 900 8000\n", 0,
                    leak_twice_program);
    assert_int_equal(nleaks[0], 1);
    for (int r = 0; r < WORLD; r++)
        assert_int_equal(nleaks_again[r], 0);
}

/*
 * RREF-15, RREF-18: a delete deferred behind its fork is owed as well. Every
 * fork w2 sends fails, so the rref w0 passes w2 (in a call w0 gives up on
 * after 0.3 s: keep never runs) is dropped by w2 with its fork unanswered:
 * its delete waits behind that fork for good. At w2's shutdown (deadline
 * first, 2 s) the report lists it as a delete the owner never acknowledged.
 */
static int deferred_delete_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_rref *r = confirmed_object();
        tp_value *args = tp_value_list_of(1, tp_value_rref(r));
        tp_value *res = NULL;
        CHECK(tp_rpc_sync(tp_to_rank(2), "keep", args, NULL, 0.3, &res) == TP_ETIMEDOUT);
        tp_value_free(res);
        tp_value_free(args);
        tp_rref_release(r);
    }
    sleep_until(1.0);
    shutdown_noting_leaks(rank);
    return 0;
}

static void test_rref_deferred_delete_reported_as_a_leak(void **state) {
    (void)state;
    leak_world_with("failsend rref_fork 1000000\n", 2, deferred_delete_program);
    for (int r = 0; r < WORLD; r++)
        print_message("w%d: %s, %zu leak(s), first kind %d owner %u holder %u\n", r,
                      tp_status_name(shutdown_st[r]), nleaks[r], (int)leaks[r][0].kind,
                      leaks[r][0].owner, leaks[r][0].holder);
    assert_int_equal(nleaks[2], 1);
    assert_int_equal(leaks[2][0].kind, TP_LEAK_DELETE);
    assert_int_equal(leaks[2][0].owner, 1);
    assert_int_equal(leaks[2][0].holder, 2);
}

/*
 * SHUTDOWN-4, RREF-5: a user rref shutdown releases while a fork of it is
 * still unaccepted (w0 shared it with w2; the owner's ACCEPT is held back
 * 3 s) is closed at once, its delete waiting for the child. A then-callback
 * that runs in w0's drain (its call, a 2 s nap on w1, ends then) finds it
 * released: to_here and sending it both fail TP_ESHUTDOWN saying so, not
 * a fetch or a send of an rref whose delete is under way.
 */
static tp_status closed_fetch_st = TP_EINVAL, closed_send_st = TP_EINVAL;
static char closed_fetch_msg[TP_ERRMSG_LEN_MAX], closed_send_msg[TP_ERRMSG_LEN_MAX];

static tp_status use_closed_rref(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                                 void *user_data) {
    (void)f, (void)result, (void)errmsg, (void)errmsg_len;
    tp_rref *r = user_data;
    tp_value *v = NULL;
    closed_fetch_st = tp_rref_to_here(r, 1.0, &v);
    snprintf(closed_fetch_msg, sizeof closed_fetch_msg, "%s", tp_errmsg());
    tp_value_free(v);
    tp_value *args = tp_value_list_of(1, tp_value_rref(r));
    tp_future *g = NULL;
    closed_send_st = tp_rpc_async(tp_to_rank(1), "kept_confirmed", args, NULL, 1.0, &g);
    snprintf(closed_send_msg, sizeof closed_send_msg, "%s", tp_errmsg());
    if (closed_send_st == TP_OK && g) /* issued: its outcome is the send's */
        closed_send_st = tp_future_wait(g, 2.0) == TP_OK ? TP_OK : tp_future_status(g);
    tp_future_free(g);
    tp_value_free(args);
    return TP_OK;
}

static int closed_child_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    tp_rref *r = NULL;
    tp_future *kept_f = NULL, *napped = NULL, *chained = NULL;
    if (rank == 0) {
        r = confirmed_object();
        tp_value *args = tp_value_list_of(1, tp_value_rref(r));
        CHECK(tp_rpc_async(tp_to_rank(2), "keep", args, NULL, 10.0, &kept_f) == TP_OK);
        tp_value_free(args);
        args = tp_value_list_of(1, tp_value_float(2.0));
        CHECK(tp_rpc_async(tp_to_rank(1), "nap", args, NULL, 10.0, &napped) == TP_OK);
        tp_value_free(args);
        CHECK(tp_future_then(napped, use_closed_rref, r, &chained) == TP_OK);
    }
    CHECK(tp_shutdown(1) == TP_OK);
    if (rank == 2)
        drop_all();
    tp_rref_release(kept[rank]);
    kept[rank] = NULL;
    tp_future_free(chained);
    tp_future_free(napped);
    tp_future_free(kept_f);
    tp_rref_release(r);
    return 0;
}

static void test_rref_released_with_a_pending_child_refuses_use(void **state) {
    (void)state;
    run_plan_with("delaytype rref_accept 3000\n", closed_child_program);
    print_message("to_here: %s: %s\nsend: %s: %s\n", tp_status_name(closed_fetch_st),
                  closed_fetch_msg, tp_status_name(closed_send_st), closed_send_msg);
    assert_int_equal(closed_fetch_st, TP_ESHUTDOWN);
    assert_non_null(strstr(closed_fetch_msg, "released by shutdown"));
    assert_int_equal(closed_send_st, TP_ESHUTDOWN);
    assert_non_null(strstr(closed_send_msg, "was released by shutdown and cannot be sent"));
}

/* Warnings that say the leak report is incomplete (out of memory). */
static atomic_int incomplete_warned;

static void count_incomplete(tp_log_level level, const char *msg, void *ud) {
    (void)ud;
    if (level == TP_LOG_WARN && strstr(msg, "the list is incomplete"))
        atomic_fetch_add(&incomplete_warned, 1);
}

static void test_rref_leaks_reported_at_shutdown(void **state) {
    (void)state;
    tp_rref_leak *v = NULL;
    size_t n = 9;
    assert_int_equal(tp_shutdown_leaks(&v, &n), TP_ENOTINIT); /* none ran on this thread */
    assert_null(v);
    assert_int_equal(n, 0);
    /* Either pointer NULL: refused by name, before either is written. */
    assert_int_equal(tp_shutdown_leaks(NULL, &n), TP_EINVAL);
    assert_non_null(strstr(tp_errmsg(), "out is NULL"));
    assert_int_equal(tp_shutdown_leaks(&v, NULL), TP_EINVAL);
    assert_non_null(strstr(tp_errmsg(), "n is NULL"));
    tp_rref_leak user = *leak_run(0);
    assert_int_equal(user.kind, TP_LEAK_DELETE);
    tp_rref_leak owner = *leak_run(1);
    assert_int_equal(owner.kind, TP_LEAK_FORK);
    /* The same world (seed, plan): the same rref and fork ids. */
    assert_int_equal(user.rref_n, owner.rref_n);
    assert_int_equal(user.fork_n, owner.fork_n);
    /* With the query getting through, each failed delete's broken connection
     * makes the owner ask w0 (RREF-19), learn of the release and free the
     * value: nothing is left to report anywhere. */
    destroyed = 0;
    atomic_store(&incomplete_warned, 0);
    tp_set_log_callback(count_incomplete, NULL);
    leak_world("failsend rref_delete 1000000\n", 1);
    tp_set_log_callback(NULL, NULL);
    for (int r = 0; r < WORLD; r++)
        assert_int_equal(nleaks[r], 0);
    assert_int_equal(destroyed, 1);
    /* Nobody owning anything is a complete (empty) report, not one cut
     * short for want of memory. */
    assert_int_equal(atomic_load(&incomplete_warned), 0);
}

/* RREF-18: the report lists every leak, one per owner record and per child:
 * two objects leaked the same way are two entries, on either side. */
static void test_rref_leaks_reported_for_every_rref(void **state) {
    (void)state;
    leak_objects = 2;
    for (int first = 0; first <= 1; first++) {
        leak_world(LEAK_PLAN, first);
        assert_int_equal(nleaks[first], 2);
        assert_int_equal(nleaks[1 - first], 0);
        assert_int_equal(leaks[first][0].kind, first == 0 ? TP_LEAK_DELETE : TP_LEAK_FORK);
        assert_int_equal(leaks[first][1].kind, leaks[first][0].kind);
        assert_true(leaks[first][0].rref_n != leaks[first][1].rref_n);
        for (int i = 0; i < 2; i++)
            assert_true(leaks[first][i].owner == 1 && leaks[first][i].holder == 0);
    }
    leak_objects = 1;
}

/*
 * RREF-19: the frame that carries an rref is lost with its connection while
 * every worker lives (the plan fails the first request sent after 1 s). The
 * sender's side of the share (w0's pending child; or, when the owner w1
 * sends its own value, w1's recorded fork for w2) would wait forever for an
 * accept or a delete nobody will send, and the value would never be freed.
 * After the break the sender asks w2 which forks it holds and settles the
 * one w2 never got.
 */

static void lost_share(int sender, tp_rref *r) {
    sleep_until(1.0); /* every earlier request is done: the next one is lost */
    tp_value *args = tp_value_list_of(1, tp_value_rref(r));
    tp_value *res = NULL;
    CHECK(tp_rpc_sync(tp_to_rank(2), "keep", args, NULL, 2.0, &res) == TP_EIO);
    tp_value_free(res);
    tp_value_free(args);
    tp_rref_release(r);
    (void)sender;
}

static int lost_user_share_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0)
        lost_share(0, confirmed_object()); /* a user's child: w1 owns the value */
    sleep_until(1.0 + SETTLE_S);
    if (rank == 1) {
        CHECK(kept[2] == NULL); /* the function never ran on w2 */
        CHECK(destroyed == 1);  /* the child was settled, so w0's delete went */
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static int lost_owner_share_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 1) { /* the owner sends its own value: it records w2's fork at once */
        tp_rref *r = NULL;
        CHECK(tp_rref_from_value(tp_value_object("Obj", malloc(1), obj_destroy), &r) == TP_OK);
        lost_share(1, r);
    }
    sleep_until(1.0 + SETTLE_S);
    if (rank == 1)
        CHECK(destroyed == 1); /* the fork w2 never got was settled */
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_rref_lost_carrying_frame_from_user(void **state) {
    (void)state;
    run_plan_with("failsend request 1 1000\n", lost_user_share_program);
}

static void test_rref_lost_carrying_frame_from_owner(void **state) {
    (void)state;
    run_plan_with("failsend request 1 1000\n", lost_owner_share_program);
}

/*
 * RREF-19: after a broken connection the owner w1 asks w0, which holds its
 * value, which forks it holds: one query, answered "held". That answer is
 * the last word until the next break (the query is sent again only when it
 * got no answer or "later", or when another break came while it was out):
 * while w0 keeps its reference, nothing more crosses the link, and the
 * value is freed once w0 lets go. Asking again after every answer would
 * ping-pong queries for as long as w0 holds the rref.
 */
#define QUERY_BREAK_S 1.0 /* QUERY_PLAN's break */
#define QUERY_PLAN "break 0 1 1000\n"

static uint64_t break_msgs;      /* delivered from just before the break until 0.2 s after */
static uint64_t quiet_msgs;      /* delivered from then until 1 s after the break */
static int destroyed_while_held; /* the owner freed the value w0 still held */

static int forks_query_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_rref *r = confirmed_object(); /* w1 records w0's fork */
        sleep_until(QUERY_BREAK_S - 0.1);
        uint64_t m0 = tp_sim_messages(tp_sim_current());
        sleep_until(QUERY_BREAK_S + 0.2); /* the query and its answer are done */
        uint64_t m1 = tp_sim_messages(tp_sim_current());
        sleep_until(QUERY_BREAK_S + 1.0);
        break_msgs = m1 - m0;
        quiet_msgs = tp_sim_messages(tp_sim_current()) - m1;
        destroyed_while_held = destroyed;
        tp_rref_release(r);
    }
    sleep_until(QUERY_BREAK_S + 1.0 + SETTLE_S);
    if (rank == 1)
        CHECK(destroyed == 1); /* w0's delete came: the fork answered "held" was not lost */
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/*
 * RREF-19 without memory: the k-th calloc after the break fails, for k in
 * turn. The first QUERY_OOM_CALLOCS callocs after the break build w1's
 * query about w0's fork (the entries list, the entry's values, then the
 * arguments' list, which takes the entries even when it fails: they were
 * freed a second time, "double free or corruption"). Each failure leaves
 * the query unsent, w1 says so (warn, naming the peer), and the run still
 * ends cleanly: w0's delete frees the value. (Later callocs are the
 * simulator's own, which asserts on exhaustion.)
 */
#define QUERY_OOM_CALLOCS 8
static unsigned query_oom_k;
static int query_oom_warned;

static void query_oom_log(tp_log_level level, const char *msg, void *ud) {
    (void)ud;
    if (level == TP_LOG_WARN && strstr(msg, "out of memory asking worker"))
        query_oom_warned++;
}

static int query_oom_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_rref *r = confirmed_object(); /* w1 records w0's fork */
        sleep_until(QUERY_BREAK_S - 0.01);
        calloc_countdown = query_oom_k; /* one thread runs every worker */
        sleep_until(QUERY_BREAK_S + 0.2);
        calloc_countdown = 0;
        tp_rref_release(r);
    }
    sleep_until(QUERY_BREAK_S + 1.0 + SETTLE_S);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_rref_forks_query_without_memory_says_so(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip();
    tp_set_log_callback(query_oom_log, NULL);
    for (query_oom_k = 1; query_oom_k <= QUERY_OOM_CALLOCS; query_oom_k++) {
        query_oom_warned = 0;
        run_plan_with(QUERY_PLAN, query_oom_program);
        print_message("calloc %u after the break fails: %d warning(s)\n", query_oom_k,
                      query_oom_warned);
        assert_int_equal(query_oom_warned, 1);
    }
    tp_set_log_callback(NULL, NULL);
}

/*
 * FLOW-7: a call that times out leaves its bytes counted as a debt until
 * its late answer; with no memory to remember the debt (the debt table's
 * first slots cannot be allocated) the bytes are given back at once, as
 * before FLOW-7, and the debt's record is freed, not leaked
 * (LeakSanitizer: the sanitizer build's run). The late answer is then
 * nobody's, and the next call to the same worker goes through.
 */
static unsigned debt_oom_failed;
static tp_status debt_oom_st = TP_OK;

static int debt_oom_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_value *zero = tp_value_list_of(1, tp_value_float(0.0)), *res = NULL;
        CHECK(tp_rpc_sync(tp_to_rank(1), "nap", zero, NULL, 5.0, &res) == TP_OK);
        tp_value_free(res);
        tp_value *longer = tp_value_list_of(1, tp_value_float(0.3));
        tp_future *f = NULL;
        CHECK(tp_rpc_async(tp_to_rank(1), "nap", longer, NULL, 0.1, &f) == TP_OK);
        atomic_store(&calloc_pair_failed, 0);
        atomic_store(&calloc_fail_size, sizeof(tpi_idmap_slot));
        atomic_store(&calloc_fail_n, 16);
        debt_oom_st = tp_future_wait(f, TP_TIMEOUT_INFINITE);
        atomic_store(&calloc_fail_n, 0);
        debt_oom_failed = atomic_load(&calloc_pair_failed);
        tp_future_free(f);
        sleep_until(1.0); /* the late answer came */
        res = NULL;
        CHECK(tp_rpc_sync(tp_to_rank(1), "nap", zero, NULL, 5.0, &res) == TP_OK);
        tp_value_free(res);
        tp_value_free(longer);
        tp_value_free(zero);
    }
    sleep_until(1.5);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_call_timed_out_without_memory_for_its_debt(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip();
    debt_oom_failed = 0;
    run_plan_with("", debt_oom_program);
    assert_int_equal(debt_oom_st, TP_ETIMEDOUT);
    assert_true(debt_oom_failed >= 1);
}

static void test_rref_forks_query_once_per_break(void **state) {
    (void)state;
    break_msgs = quiet_msgs = 0;
    destroyed_while_held = -1;
    run_plan_with(QUERY_PLAN, forks_query_program);
    assert_int_equal(destroyed_while_held, 0);
    assert_int_equal(break_msgs, 2); /* w1's query to w0, and w0's answer */
    assert_int_equal(quiet_msgs, 0);
}

/*
 * RREF-19: a fork whose frame is not handed to the agent yet is not in a
 * break's query. The owner w1 sends its own value to w0 in a call that waits
 * inside rpc_async for room in w1's window to w0 (FLOW-1: 4 KiB, most of it
 * taken by a call w0 answers later), with the fork recorded at the encode.
 * The link breaks meanwhile: the held call fails, the window opens, and w1
 * asks w0 which forks it holds before the waiting frame goes out behind the
 * query. Asked about, the fork would be answered "not held" (w0 has not seen
 * the frame) and settled: the value freed while the frame delivers it to w0,
 * whose to_here then finds nothing. Left out, the value lives until w0 lets
 * go of it.
 */
#define TRANSIT_BREAK_S 1.5
#define TRANSIT_PLAN "break 0 1 1500\n"
#define TRANSIT_PAD 3000 /* bytes: two calls carrying it do not fit in the window */

static tp_status transit_fetch_st = TP_EINVAL; /* w0's to_here of what it keeps */

static int transit_fork_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 1) {
        static const uint8_t pad[TRANSIT_PAD];
        tp_value *kwargs = tp_value_map();
        CHECK(kwargs && tp_map_set(kwargs, "pad", tp_value_bytes(pad, sizeof pad)) == TP_OK);
        tp_rref *r = NULL;
        CHECK(tp_rref_from_value(tp_value_object("Obj", malloc(1), obj_destroy), &r) == TP_OK);
        sleep_until(TRANSIT_BREAK_S - 0.5);
        tp_future *hold = NULL, *keep = NULL;
        CHECK(tp_rpc_async(tp_to_rank(0), "hold", NULL, kwargs, 10.0, &hold) == TP_OK);
        tp_value *args = tp_value_list_of(1, tp_value_rref(r));
        uint64_t t0 = now_ns();
        CHECK(tp_rpc_async(tp_to_rank(0), "keep", args, kwargs, 10.0, &keep) == TP_OK);
        CHECK(now_ns() - t0 >= 400 * MS); /* it waited for room until the break */
        tp_value_free(args);
        tp_value_free(kwargs);
        tp_rref_release(r); /* only w0's fork keeps the value now */
        CHECK(hold && tp_future_wait(hold, 10.0) == TP_EIO); /* lost with the connection */
        CHECK(keep && tp_future_wait(keep, 10.0) == TP_OK);
        tp_future_free(hold);
        tp_future_free(keep);
    }
    sleep_until(TRANSIT_BREAK_S + 1.0);
    if (rank == 0)
        release_held(); /* its answer finds the call gone (CALL-8) */
    sleep_until(TRANSIT_BREAK_S + SETTLE_S);
    if (rank == 0) {
        tp_value *v = NULL;
        transit_fetch_st = kept[0] ? tp_rref_to_here(kept[0], 1.0, &v) : TP_EINVAL;
        tp_value_free(v);
    }
    if (rank == 1)
        CHECK(destroyed == 0); /* w0 holds it */
    sleep_until(TRANSIT_BREAK_S + SETTLE_S + 1.5);
    if (rank == 0) {
        tp_rref_release(kept[0]);
        kept[0] = NULL;
    }
    sleep_until(TRANSIT_BREAK_S + 2 * SETTLE_S + 1.5);
    if (rank == 1)
        CHECK(destroyed == 1); /* its delete came */
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_rref_fork_in_transit_not_asked_about(void **state) {
    (void)state;
    max_inflight_bytes[1] = 4096;
    transit_fetch_st = TP_EINVAL;
    run_plan_with(TRANSIT_PLAN, transit_fork_program);
    /* An object cannot travel: the owner has it, so to_here says TP_ETYPE. */
    assert_int_equal(transit_fetch_st, TP_ETYPE);
}

/*
 * RREF-19: a second query waits afresh. The owner w1 sent its value A to w0,
 * and the link breaks (1 s): w1 asks w0 about A's fork, and w0 answers
 * "later" until 1 s after that query first came (the reordering bound,
 * AGENT-17), then "held" (2.26 s). That answer is held up 10.5 s, past w1's
 * attempt timeout (10 s, at 12.26 s), so w1 asks again after its backoff
 * (1.28 s, at 13.54 s), with no break between. By then w1 has sent w0 a
 * second value B (13.45 s) in a REMOTE held back (the chaos mode's
 * reordering, 500 ms more with its type's delay: it arrives at 13.96 s), so
 * the new query, which names B's fork, overtakes it. w0 must make that query
 * wait the bound again, as a first one: answered at once (the time of the
 * first query kept past its answer), B's fork would be "not held", and w1
 * would free B while the REMOTE delivers it to w0, whose to_here then finds
 * it freed.
 */
#define AGAIN_SEND_S 13.45 /* w1 sends B, 0.09 s before its second query */
#define AGAIN_CHECK_S 17.0 /* w0 answered the second query once the bound passed */
#define AGAIN_PLAN                                                                                 \
    "break 0 1 1000\n"                                                                             \
    "delay 0 1 2000 2500 10500\n"     /* w0's answer "held" (2.26 s) comes after w1's timeout */   \
    "chaos 0 0 1000000 13400 13500\n" /* B's REMOTE is held back; reordering on from the start */  \
    "delaytype remote 500\n"

static tp_status again_fetch_st = TP_EINVAL; /* w0's to_here of B */
static uint64_t again_overtaken_msgs; /* delivered from just before B's send until 0.3 s after */

static int query_again_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 1) {
        tp_rref *a = NULL;
        CHECK(tp_rref_from_value(tp_value_object("Obj", malloc(1), obj_destroy), &a) == TP_OK);
        tp_value *args = tp_value_list_of(1, tp_value_rref(a));
        tp_value *res = NULL;
        CHECK(tp_rpc_sync(tp_to_rank(0), "keep", args, NULL, 5.0, &res) == TP_OK);
        tp_value_free(res);
        tp_value_free(args);
        tp_rref_release(a); /* only w0's fork keeps A now */
        tp_rref *b = NULL;
        CHECK(tp_rref_from_value(tp_value_object("Obj", malloc(1), obj_destroy), &b) == TP_OK);
        sleep_until(AGAIN_SEND_S);
        args = tp_value_list_of(1, tp_value_rref(b));
        tp_rref *made = NULL;
        CHECK(tp_remote(tp_to_rank(0), "keep_all", args, NULL, 5.0, &made) == TP_OK);
        tp_value_free(args);
        tp_rref_release(b); /* only w0's fork keeps B now */
        tp_value *v = NULL;
        CHECK(made && tp_rref_to_here(made, 5.0, &v) == TP_OK);
        tp_value_free(v);
        tp_rref_release(made);
    }
    if (rank == 0) {
        sleep_until(AGAIN_SEND_S - 0.05);
        uint64_t m0 = tp_sim_messages(tp_sim_current());
        sleep_until(AGAIN_SEND_S + 0.3); /* the query came and was answered; B's REMOTE not yet */
        again_overtaken_msgs = tp_sim_messages(tp_sim_current()) - m0;
        CHECK(destroyed == 0); /* B lives while its REMOTE is on the way */
    }
    sleep_until(AGAIN_CHECK_S);
    if (rank == 0) {
        tp_value *v = NULL;
        again_fetch_st = kept_all[0][0] ? tp_rref_to_here(kept_all[0][0], 1.0, &v) : TP_EINVAL;
        tp_value_free(v);
    }
    if (rank == 1)
        CHECK(destroyed == 0); /* w0 holds both */
    sleep_until(AGAIN_CHECK_S + 1.5);
    if (rank == 0)
        drop_all();
    sleep_until(AGAIN_CHECK_S + 1.5 + SETTLE_S);
    if (rank == 1)
        CHECK(destroyed == 1); /* B's delete came */
    if (rank == 0) {
        tp_rref_release(kept[0]);
        kept[0] = NULL;
    }
    sleep_until(AGAIN_CHECK_S + 1.5 + 2 * SETTLE_S);
    if (rank == 1)
        CHECK(destroyed == 2); /* and A's */
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_rref_forks_query_again_waits_afresh(void **state) {
    (void)state;
    again_fetch_st = TP_EINVAL;
    again_overtaken_msgs = 0;
    run_plan_with(AGAIN_PLAN, query_again_program);
    /* The schedule is the one described: to_here's fetch (held back too, it
     * waits for B), the second query and its answer all came before B. */
    assert_int_equal(again_overtaken_msgs, 3);
    /* An object cannot travel: the owner has it, so to_here says TP_ETYPE. */
    assert_int_equal(again_fetch_st, TP_ETYPE);
}

/*
 * METHOD-3: w2's method call reaches w1 before the remote() that makes its
 * value (its REMOTE held back 200 ms), and w1 has one pool thread. The call
 * must not wait for the value on that thread: the remote() queued behind it
 * would never run, and neither call would end (a swarm world with a pool of
 * one and reordered frames hung so).
 */
static tp_status ping_method(tp_call *call, const tp_value *args, const tp_value *kwargs,
                             tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    *result = tp_value_int(7);
    return *result ? TP_OK : TP_ENOMEM;
}

/* call_ping(rref) -> rref.ping(), from here, with no deadline. */
static tp_status call_ping_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                              tp_value **result, void *ud) {
    (void)kwargs, (void)ud;
    tp_rref *r = NULL;
    if (tp_value_get_rref(tp_list_get(args, 0), &r) != TP_OK)
        return TP_ETYPE;
    tp_status st = tp_rref_rpc_sync(r, "ping", NULL, NULL, TP_TIMEOUT_INFINITE, result);
    if (st != TP_OK)
        tp_call_set_error(call, "call_ping: %s", tp_errmsg());
    return st;
}

/* On w0: makes an object on w1, calls fn(its rref) on w2 and returns the
 * int fn returned (-1 when the call failed). */
static int64_t call_w2_with_object(const char *fn, double timeout_s) {
    tp_rref *r = NULL;
    CHECK(tp_remote(tp_to_rank(1), "obj", NULL, NULL, TP_TIMEOUT_INFINITE, &r) == TP_OK);
    tp_value *args = tp_value_list_of(1, tp_value_rref(r));
    tp_value *res = NULL;
    tp_status st = tp_rpc_sync(tp_to_rank(2), fn, args, NULL, timeout_s, &res);
    CHECK(st == TP_OK);
    if (st != TP_OK)
        print_error("%s: %s\n", fn, tp_errmsg());
    int64_t v = -1;
    CHECK(st != TP_OK || tp_value_get_int(res, &v) == TP_OK);
    tp_value_free(res);
    tp_value_free(args);
    tp_rref_release(r);
    return v;
}

static int method_first_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("obj", obj_fn, NULL) == TP_OK);
    CHECK(tp_register_function("call_ping", call_ping_fn, NULL) == TP_OK);
    CHECK(tp_new_method("Obj", "ping", ping_method, NULL) == TP_OK);
    char name[4] = "w0";
    name[1] = (char)('0' + rank);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_shutdown_timeout(o, 30.0) == TP_OK);
    if (rank == 1)
        CHECK(tp_options_set_num_worker_threads(o, 1) == TP_OK);
    tp_status st = tp_init_rpc(name, "SIM", rank, world_size, o);
    tp_options_free(o);
    CHECK(st == TP_OK);
    if (st != TP_OK)
        return 1;
    if (rank == 0) {
        uint64_t t0 = now_ns();
        CHECK(call_w2_with_object("call_ping", 10.0) == 7);
        CHECK(now_ns() - t0 >= 200000000ull); /* it did wait for the held-back remote() */
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_method_waits_off_the_pool(void **state) {
    (void)state;
    run_plan_with("delaytype remote 200\n", method_first_program);
}

/*
 * METHOD-3's bound: at most TPI_METHOD_DEFERRED_MAX method calls wait aside
 * for a value still being made; the ones past it wait on the pool as before.
 * w2 makes that many and 4 more before w1's remote() arrives (held back
 * 200 ms): every call is answered, once the value exists, and the calls past
 * the bound lose nothing on the way (LeakSanitizer and valgrind check).
 */
#define PINGS_PAST_THE_BOUND 4
static int pings_ok;
static double pings_timeout_s = 10.0;

/* call_pings(rref): TPI_METHOD_DEFERRED_MAX + 4 rref.ping() at once, from here. */
static tp_status call_pings_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                               tp_value **result, void *ud) {
    (void)call, (void)kwargs, (void)ud;
    tp_rref *r = NULL;
    if (tp_value_get_rref(tp_list_get(args, 0), &r) != TP_OK)
        return TP_ETYPE;
    size_t n = TPI_METHOD_DEFERRED_MAX + PINGS_PAST_THE_BOUND;
    tp_future **fs = calloc(n, sizeof *fs);
    if (!fs)
        return TP_ENOMEM;
    size_t issued = 0;
    while (issued < n &&
           tp_rref_rpc_async(r, "ping", NULL, NULL, pings_timeout_s, &fs[issued]) == TP_OK)
        issued++;
    tp_status st = issued == n ? tp_future_wait_all(fs, n, 20.0, NULL) : TP_EIO;
    if (st == TP_ETIMEDOUT && pings_timeout_s < 20.0)
        st = TP_OK; /* each future ended by its own deadline: counted below */
    int ok = 0;
    for (size_t i = 0; i < issued; i++) {
        int64_t v = 0;
        ok += tp_future_status(fs[i]) == TP_OK &&
              tp_value_get_int(tp_future_value(fs[i]), &v) == TP_OK && v == 7;
        tp_future_free(fs[i]);
    }
    free(fs);
    *result = tp_value_int(ok);
    return *result ? st : TP_ENOMEM;
}

static int many_methods_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("call_pings", call_pings_fn, NULL) == TP_OK);
    CHECK(tp_new_method("Obj", "ping", ping_method, NULL) == TP_OK);
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0)
        pings_ok = (int)call_w2_with_object("call_pings", 30.0);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_methods_past_the_deferred_bound(void **state) {
    (void)state;
    pings_ok = 0;
    run_plan_with("delaytype remote 200\n", many_methods_program);
    assert_int_equal(pings_ok, TPI_METHOD_DEFERRED_MAX + PINGS_PAST_THE_BOUND);
}

/*
 * METHOD-3: the calls past the bound wait on the owner's pool only until
 * their callers' deadline. The value comes at 2 s (its remote() held back);
 * the pings time out at 1 s, and w1's four pool threads, held by the four
 * past the bound, are free again then: a call w2 makes at 1.5 s is served
 * at once (a pool slot that waited for the value itself would hold it
 * until 2 s, past that call's 0.3 s).
 */
static tp_status pool_free_st = TP_EINVAL;

static int methods_deadline_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("call_pings", call_pings_fn, NULL) == TP_OK);
    CHECK(tp_new_method("Obj", "ping", ping_method, NULL) == TP_OK);
    CHECK(tp_register_function("obj", obj_fn, NULL) == TP_OK);
    CHECK(tp_register_function("kept_confirmed", kept_confirmed_fn, NULL) == TP_OK);
    char name[4] = "w0";
    name[1] = (char)('0' + rank);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_shutdown_timeout(o, 30.0) == TP_OK);
    if (rank == 1)
        CHECK(tp_options_set_num_worker_threads(o, PINGS_PAST_THE_BOUND) == TP_OK);
    tp_status st = tp_init_rpc(name, "SIM", rank, world_size, o);
    tp_options_free(o);
    CHECK(st == TP_OK);
    if (st != TP_OK)
        return 1;
    if (rank == 0)
        pings_ok = (int)call_w2_with_object("call_pings", 30.0);
    if (rank == 2) { /* not w0: its link to w1 holds the remote() back, and all behind it */
        sleep_until(1.5);
        tp_value *res = NULL;
        pool_free_st = tp_rpc_sync(tp_to_rank(1), "kept_confirmed", NULL, NULL, 0.3, &res);
        tp_value_free(res);
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_methods_past_the_deferred_bound_keep_their_deadline(void **state) {
    (void)state;
    pings_ok = -1;
    pool_free_st = TP_EINVAL;
    pings_timeout_s = 1.0;
    run_plan_with("delaytype remote 2000\n", methods_deadline_program);
    pings_timeout_s = 10.0;
    assert_int_equal(pings_ok, 0); /* none answered: the value came after their deadline */
    assert_int_equal(pool_free_st, TP_OK);
}

/*
 * RREF-22's probe runs only while a worker holds rref state: on a network
 * that loses frames, workers without a single rref sit idle for 20 s with no
 * timer firing: 6 events, the sleeps' own (a probe timer armed regardless
 * fires every 2 s on each: 36).
 */
static uint64_t idle_events = UINT64_MAX;

static int idle_lossy_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    sleep_until(1.0);
    uint64_t e0 = tp_sim_events(tp_sim_current());
    sleep_until(21.0);
    if (rank == 0)
        idle_events = tp_sim_events(tp_sim_current()) - e0;
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_no_probe_timer_without_rrefs(void **state) {
    (void)state;
    idle_events = UINT64_MAX;
    run_plan_with("chaos 1 0 0\n", idle_lossy_program); /* loses frames: RREF-22 on */
    print_message("events while idle: %llu\n", (unsigned long long)idle_events);
    assert_true(idle_events <= 2 * WORLD); /* each sleep: its timeout and its wake-up */
}

/*
 * RREF-16's debug counters at each step of one rref's life, on w0 (no
 * virtual time passes between a call and the counters read after it):
 * right after remote(), one user rref, unconfirmed, and one call in flight
 * that is no protocol message; once confirmed, none pending; right after the
 * release, its DELETE in flight and counted as protocol. With the DELETE's
 * first send failing (debug_delete_plan), the DELETE waits 10 ms later as a
 * queued retry, counted as protocol with no call in flight.
 */
static tp_debug_info debug_steps[4];

static int debug_counters_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        memset(debug_steps, 0xff, sizeof debug_steps);
        tp_rref *r = NULL;
        CHECK(tp_remote(tp_to_rank(1), "obj", NULL, NULL, TP_TIMEOUT_INFINITE, &r) == TP_OK);
        CHECK(tp_get_debug_info(&debug_steps[0]) == TP_OK);
        while (r && !tp_rref_confirmed_by_owner(r) && tp_sleep(0.01) == TP_OK) {
        }
        CHECK(tp_get_debug_info(&debug_steps[1]) == TP_OK);
        tp_rref_release(r);
        CHECK(tp_get_debug_info(&debug_steps[2]) == TP_OK);
        CHECK(tp_sleep(0.01) == TP_OK);
        CHECK(tp_get_debug_info(&debug_steps[3]) == TP_OK);
    }
    CHECK(tp_sleep(rank == 0 ? 0.5 : 1.0) == TP_OK);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void debug_step_is(int step, uint64_t users, uint64_t pending_users, uint64_t protocol,
                          uint64_t calls) {
    const tp_debug_info *d = &debug_steps[step];
    print_message("step %d: user_rrefs %llu pending_users %llu pending_protocol %llu "
                  "calls_in_flight %llu\n",
                  step, (unsigned long long)d->user_rrefs, (unsigned long long)d->pending_users,
                  (unsigned long long)d->pending_protocol, (unsigned long long)d->calls_in_flight);
    assert_true(d->user_rrefs == users);
    assert_true(d->pending_users == pending_users);
    assert_true(d->pending_protocol == protocol);
    assert_true(d->calls_in_flight == calls);
}

static void test_rref_debug_counters_step_by_step(void **state) {
    (void)state;
    run_plan_with("", debug_counters_program);
    debug_step_is(0, 1, 1, 0, 1); /* the REMOTE: a call, not protocol */
    debug_step_is(1, 1, 0, 0, 0);
    debug_step_is(2, 0, 0, 1, 1); /* the DELETE, unanswered */
    debug_step_is(3, 0, 0, 0, 0); /* answered */
    run_plan_with("failsend rref_delete 1\n", debug_counters_program);
    debug_step_is(2, 0, 0, 1, 1);
    debug_step_is(3, 0, 0, 1, 0); /* its retry waits */
}

/*
 * RREF-18: a value no reference holds any more, whose remote() still runs
 * (answered later) when the graceful shutdown's deadline comes: w1 made it
 * on itself and let go of its rref at once. The owner record stays for the
 * running call, and the report names it as held by nobody (TP_LEAK_ORPHAN),
 * owner and holder w1.
 */
static tp_rref_leak orphan_leak;
static size_t orphan_nleaks = 99;

static int orphan_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 1) {
        tp_rref *r = NULL;
        CHECK(tp_remote(tp_to_rank(1), "hold", NULL, NULL, TP_TIMEOUT_INFINITE, &r) == TP_OK);
        CHECK(tp_sleep(0.1) == TP_OK); /* it runs, and waits for its answer */
        tp_rref_release(r);
    }
    tp_status st = tp_shutdown(1);
    (void)st;
    tp_rref_leak *v = NULL;
    size_t n = 0;
    CHECK(tp_shutdown_leaks(&v, &n) == TP_OK);
    if (rank == 1) {
        orphan_nleaks = n;
        if (n > 0)
            orphan_leak = v[0];
        tp_future_free(held_answer); /* never answered: the worker is gone */
        held_answer = NULL;
    }
    free(v);
    return 0;
}

static void test_rref_orphan_reported_at_shutdown(void **state) {
    (void)state;
    shutdown_timeout_s[1] = 0.5;
    run_plan_with("", orphan_program);
    shutdown_timeout_s[1] = 30.0;
    print_message("%zu leak(s); kind %d owner %u holder %u\n", orphan_nleaks, (int)orphan_leak.kind,
                  orphan_leak.owner, orphan_leak.holder);
    assert_int_equal(orphan_nleaks, 1);
    assert_int_equal(orphan_leak.kind, TP_LEAK_ORPHAN);
    assert_int_equal(orphan_leak.owner, 1);
    assert_int_equal(orphan_leak.holder, 1);
}

/*
 * RREF-6, RREF-14: w0 calls remote(w1, obj) and at once shares the rref
 * with w2, whose fork reaches the owner w1 before the REMOTE does (held up
 * 500 ms): w1 keeps a placeholder for it. w0 is killed before its REMOTE
 * arrives, so the value never comes: once w1 sees w0 down, the placeholder
 * fails, and w2's to_here gets TP_EPEERDOWN saying the creator died, at
 * once, not at its 5 s deadline.
 */
static tp_status dead_creator_st = TP_EINVAL;
static char dead_creator_msg[TP_ERRMSG_LEN_MAX];
static uint64_t dead_creator_took;

static int dead_creator_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_rref *r = NULL;
        CHECK(tp_remote(tp_to_rank(1), "obj", NULL, NULL, TP_TIMEOUT_INFINITE, &r) == TP_OK);
        tp_value *args = tp_value_list_of(1, tp_value_rref(r));
        tp_value *res = NULL;
        CHECK(tp_rpc_sync(tp_to_rank(2), "keep", args, NULL, 5.0, &res) == TP_OK);
        tp_value_free(res);
        tp_value_free(args);
        tp_rref_release(r); /* its delete waits behind the REMOTE: both die with w0 */
        (void)tp_sleep(60.0); /* killed in here */
        return 0;
    }
    sleep_until(1.0);
    if (rank == 2) {
        tp_value *v = NULL;
        uint64_t t0 = now_ns();
        dead_creator_st = kept[2] ? tp_rref_to_here(kept[2], 5.0, &v) : TP_EINVAL;
        dead_creator_took = now_ns() - t0;
        snprintf(dead_creator_msg, sizeof dead_creator_msg, "%s", tp_errmsg());
        tp_value_free(v);
        tp_rref_release(kept[2]);
        kept[2] = NULL;
    }
    sleep_until(2.0);
    (void)tp_shutdown(0);
    return 0;
}

static void test_rref_placeholder_fails_when_its_creator_dies(void **state) {
    (void)state;
    destroyed = 0;
    memset(kept, 0, sizeof kept);
    tp_sim_config cfg = {.hosts = WORLD, .seed = 7};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    char err[256];
    assert_int_equal(tp_sim_load_faults(sim, "delaytype remote 500\nkill 0 300\n", err, sizeof err),
                     TP_OK);
    assert_int_equal(tp_sim_run(sim, dead_creator_program, NULL, NULL), TP_OK);
    assert_int_equal(tp_sim_violations(sim), 0);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    print_message("w2's to_here: %s after %.3f s: %s\n", tp_status_name(dead_creator_st),
                  dead_creator_took / 1e9, dead_creator_msg);
    assert_int_equal(dead_creator_st, TP_EPEERDOWN);
    assert_non_null(strstr(dead_creator_msg, "died before its remote() reached the owner"));
    assert_true(dead_creator_took < SEC);
}

/*
 * A callee out of memory while it takes a call in: the call fails and says
 * it was memory (TP_ENOMEM, or TP_EIO when the frame itself could not be
 * held and the connection ended, as a TCP stream does), the credit the call
 * held comes back (FLOW-8: then a lone call over the credit is taken),
 * no request stays counted as undecoded (RREF-19: a forks query is
 * answered), and calls go on once there is memory. w0
 * issues the call, then empties the block cache and makes every malloc of
 * one size class fail while w1 takes the call in; each class up to 4 KiB
 * in turn. (Before: a token for the pool that could not be allocated was
 * answered "the callee is shutting down", and the simulator called a frame
 * it had no memory for "malformed".)
 */
static size_t job_oom_class;
static tp_status job_oom_st, job_oom_after, job_oom_big;
static int job_oom_forks_kind;
static int job_oom_remote; /* 1: the call is a remote() */
static char job_oom_msg[TP_ERRMSG_LEN_MAX];

static int job_oom_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        /* The frame in a class of its own: today the job's block is 256 B and
         * the pool token's 128 B, and a 600-byte argument makes a 1 KiB frame
         * (should sizes merge two, the test's three-paths check says so). */
        uint8_t pad[600] = {0};
        tp_value *args = tp_value_list_of(1, tp_value_bytes(pad, sizeof pad));
        tp_future *f = NULL;
        if (job_oom_remote) { /* the same for a remote(), whose to_here tells */
            tp_rref *r = NULL;
            CHECK(tp_remote(tp_to_rank(1), "kept_confirmed", args, NULL, 5.0, &r) == TP_OK);
            tpi_blocks_trim();
            atomic_store(&malloc_fail_size, job_oom_class);
            CHECK(tp_sleep(0.5) == TP_OK); /* w1 takes the call in meanwhile */
            atomic_store(&malloc_fail_size, 0);
            tp_value *v = NULL;
            job_oom_st = tp_rref_to_here(r, 5.0, &v);
            tpi_format(job_oom_msg, sizeof job_oom_msg, "%s", tp_errmsg());
            tp_value_free(v);
            tp_rref_release(r);
        } else {
            CHECK(tp_rpc_async(tp_to_rank(1), "kept_confirmed", args, NULL, 5.0, &f) == TP_OK);
        }
        tp_value_free(args);
        if (f) { /* else job_oom_st stays TP_EINVAL, which the test refuses */
            tpi_blocks_trim();
            atomic_store(&malloc_fail_size, job_oom_class);
            job_oom_st = tp_future_wait(f, 5.0); /* w1 takes the call in meanwhile */
            atomic_store(&malloc_fail_size, 0);
            tpi_format(job_oom_msg, sizeof job_oom_msg, "%s", tp_errmsg());
            tp_future_free(f);
        }
        tp_value *res = NULL;
        job_oom_after = TP_OK;
        for (int i = 0; i < 100 && job_oom_after == TP_OK; i++) { /* the credit came back */
            job_oom_after = tp_rpc_sync(tp_to_rank(1), "kept_confirmed", NULL, NULL, 5.0, &res);
            tp_value_free(res);
            res = NULL;
        }
        /* All of it: with nothing held for w0 on w1, a lone call over the
         * 64 KiB credit is taken (FLOW-8)... */
        uint8_t *big = calloc(1, 100000);
        args = big ? tp_value_list_of(1, tp_value_bytes(big, 100000)) : NULL;
        free(big);
        job_oom_big = tp_rpc_sync(tp_to_rank(1), "kept_confirmed", args, NULL, 5.0, &res);
        tp_value_free(args);
        tp_value_free(res);
        res = NULL;
        /* ... and none of w0's requests is left counted as undecoded there:
         * a forks query is answered, not told to ask again later (RREF-19). */
        args = tp_value_list_of(
            1, tp_value_list_of(1, tp_value_list_of(4, tp_value_int(0), tp_value_int(8),
                                                    tp_value_int(0), tp_value_int(9))));
        if (tp_rpc_sync(tp_to_rank(1), "tp:forks", args, NULL, 5.0, &res) == TP_OK)
            job_oom_forks_kind = tp_value_kind(res);
        tp_value_free(args);
        tp_value_free(res);
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* One world of job_oom_program with allocations of one size class failing:
 * the call after the failure, the lone call over the credit and the forks
 * query must all be answered. */
static void job_oom_run(size_t size, const char *what) {
    job_oom_class = size;
    job_oom_st = job_oom_after = job_oom_big = TP_EINVAL;
    job_oom_forks_kind = -1;
    job_oom_msg[0] = '\0';
    max_inflight_bytes[0] = max_inflight_bytes[1] = 65536;
    run_plan_with("", job_oom_program);
    print_message("%s, class %zu: %s: %s\n", what, size, tp_status_name(job_oom_st), job_oom_msg);
    assert_int_equal(job_oom_after, TP_OK);
    assert_int_equal(job_oom_big, TP_OK);
    assert_int_equal(job_oom_forks_kind, TP_KIND_LIST);
}

static void test_callee_without_memory_for_the_job(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip();
    int hit = 0;
    for (size_t size = 64; size <= 4096; size *= 2) {
        job_oom_run(size, "call");
        /* Out of memory, and says so: the job, the token for the pool, or
         * the frame (the connection ends, as a TCP stream would) */
        if (job_oom_st != TP_OK) {
            assert_true(job_oom_st == TP_ENOMEM || job_oom_st == TP_EIO);
            assert_non_null(strstr(job_oom_msg, "out of memory"));
        }
        hit |= job_oom_st == TP_ENOMEM && strstr(job_oom_msg, "taking the call in") ? 1 : 0;
        hit |=
            job_oom_st == TP_ENOMEM && strstr(job_oom_msg, "handing the call to its pool") ? 2 : 0;
        hit |= job_oom_st == TP_EIO && strstr(job_oom_msg, "out of memory for a frame") ? 4 : 0;
    }
    assert_int_equal(hit, 7); /* the job's class, the token's and the frame's */
    /* A remote() whose job finds no memory: its to_here says so, its credit
     * comes back, and nothing leaks (LeakSanitizer). */
    job_oom_remote = 1;
    int taken_in = 0;
    for (size_t size = 64; size <= 4096; size *= 2) {
        job_oom_run(size, "remote");
        taken_in += job_oom_st == TP_ENOMEM && strstr(job_oom_msg, "taking the call in");
    }
    job_oom_remote = 0;
    assert_true(taken_in >= 1); /* the REMOTE's job itself */
}

/*
 * RREF-15: a delete that cannot even be issued (no memory for its call
 * record, its frame, or the network's copy of it) is sent again later, as
 * one that got no answer is. One block class after another fails while w0
 * releases its confirmed rref to an object on w1: whichever allocation that
 * stops, the owner frees the value within SETTLE_S and every shutdown is
 * clean. (Dropped instead, the delete never reaches w1: the value leaks.)
 */
static size_t release_oom_class;
static unsigned release_oom_failed; /* allocations that failed in the release */
static int release_oom_destroyed;   /* the owner freed the object by SETTLE_S */

static int release_oom_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_rref *r = confirmed_object();
        tpi_blocks_trim(); /* every small block comes from malloc now */
        unsigned before = atomic_load(&malloc_failed);
        atomic_store(&malloc_fail_size, release_oom_class);
        tp_rref_release(r); /* sends the delete from here: no other worker runs */
        atomic_store(&malloc_fail_size, 0);
        release_oom_failed = atomic_load(&malloc_failed) - before;
        CHECK(tp_sleep(SETTLE_S) == TP_OK);
        release_oom_destroyed = destroyed;
    }
    CHECK(tp_sleep(rank == 0 ? 0.0 : SETTLE_S + 1.0) == TP_OK);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_rref_delete_without_memory_sent_again(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip();
    unsigned classes_hit = 0;
    for (size_t size = 64; size <= 4096; size *= 2) {
        release_oom_class = size;
        release_oom_failed = 0;
        release_oom_destroyed = -1;
        run_plan_with("", release_oom_program);
        print_message("class %zu: %u allocations failed, object freed: %d\n", size,
                      release_oom_failed, release_oom_destroyed);
        assert_int_equal(release_oom_destroyed, 1);
        classes_hit += release_oom_failed > 0;
    }
    assert_true(classes_hit >= 2); /* the call record's class and the frame's */
}

/*
 * RREF-22: the drain's look at unsettled forks (tpi_forks_at_risk) asks
 * about every fork at risk, however young: one sent at this very instant
 * (age 0) included. w1, the owner, sends its value to w0 (an owner's fork);
 * at 3 s w0 passes the rref it keeps on to w2 (a holder's fork, a child);
 * each, without yielding, looks at once: the fork counts at risk and the
 * query to its holder is out.
 */
static size_t fresh_at_risk[WORLD];
static int fresh_query[WORLD];

static void look_at_fresh_forks(int rank, uint32_t holder) {
    tp_core *c = tp_context_current()->core;
    tpi_lock(c);
    fresh_at_risk[rank] = tpi_forks_at_risk(c);
    fresh_query[rank] = tpi_peer_view(c, holder)->forks_query;
    tpi_unlock(c);
}

static int fresh_forks_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 1) {
        tp_rref *r = NULL;
        CHECK(tp_rref_from_value(tp_value_object("Obj", malloc(1), obj_destroy), &r) == TP_OK);
        sleep_until(1.0);
        tp_value *args = tp_value_list_of(1, tp_value_rref(r));
        tp_future *f = NULL;
        CHECK(tp_rpc_async(tp_to_rank(0), "keep_all", args, NULL, 2.0, &f) == TP_OK);
        look_at_fresh_forks(rank, 0);
        CHECK(tp_future_wait(f, TP_TIMEOUT_INFINITE) == TP_OK);
        tp_future_free(f);
        tp_value_free(args);
        tp_rref_release(r);
    } else if (rank == 0) {
        sleep_until(3.0);
        CHECK(kept_all[0][0] != NULL);
        tp_value *args = tp_value_list_of(1, tp_value_rref(kept_all[0][0]));
        tp_future *f = NULL;
        CHECK(tp_rpc_async(tp_to_rank(2), "keep_all", args, NULL, 2.0, &f) == TP_OK);
        look_at_fresh_forks(rank, 2);
        CHECK(tp_future_wait(f, TP_TIMEOUT_INFINITE) == TP_OK);
        tp_future_free(f);
        tp_value_free(args);
    }
    sleep_until(6.0);
    drop_all();
    sleep_until(6.0 + SETTLE_S);
    if (rank == 1)
        CHECK(destroyed == 1);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_rref_forks_asked_about_from_age_0(void **state) {
    (void)state;
    memset(fresh_at_risk, 0, sizeof fresh_at_risk);
    memset(fresh_query, 0, sizeof fresh_query);
    run_plan_with("chaos 1 0 0\n", fresh_forks_program); /* loses frames: RREF-22 on */
    for (int r = 0; r < 2; r++)
        print_message("w%d: %zu at risk, query %d\n", r, fresh_at_risk[r], fresh_query[r]);
    assert_true(fresh_at_risk[1] >= 1 && fresh_query[1] != 0); /* the owner's fork to w0 */
    assert_true(fresh_at_risk[0] >= 1 && fresh_query[0] != 0); /* w0's child fork to w2 */
}

/*
 * RREF-21: on a network that reorders, an owner remembers the ids of other
 * creators' values it freed (the last TPI_FREED_MAX), to refuse a fetch or
 * fork held back behind the delete. Its own values are not remembered
 * (nothing of theirs comes from another creator), so TPI_FREED_MAX of its
 * own values made and freed after w0's must not push w0's id out. The
 * verdict is the owner's own (tpi_rref_never_created): a held-back frame
 * cannot be ordered from here.
 */
static tpi_gid freed_id;
static tp_status freed_before, freed_after; /* the verdict on w0's id */
static char freed_why[TP_ERRMSG_LEN_MAX];

static tp_status freed_verdict(void) {
    tp_core *c = tp_context_current()->core;
    tpi_lock(c);
    tp_status st = tpi_rref_never_created(c, freed_id, freed_why, sizeof freed_why);
    tpi_unlock(c);
    return st;
}

static int freed_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_rref *r = NULL;
        CHECK(tp_remote(tp_to_rank(1), "obj", NULL, NULL, 5.0, &r) == TP_OK);
        if (r) /* else freed_id names rank 1's id 0, which the test refuses */
            freed_id = r->id;
        tp_rref_release(r); /* w1 frees it once the creation is confirmed */
    } else if (rank == 1) {
        for (int i = 0; i < 100 && destroyed == 0; i++)
            sleep_until(0.1 * (i + 1));
        CHECK(destroyed == 1);
        freed_before = freed_verdict();
        for (int i = 0; i < TPI_FREED_MAX; i++) {
            tp_rref *mine = NULL;
            CHECK(tp_rref_from_value(tp_value_int(i), &mine) == TP_OK);
            tp_rref_release(mine);
        }
        freed_after = freed_verdict();
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_rref_freed_ids_of_others_outlast_own_values(void **state) {
    (void)state;
    freed_id = (tpi_gid){1, 0};
    freed_before = freed_after = TP_OK;
    freed_why[0] = '\0';
    run_plan_with("chaos 0 0 1\n", freed_program); /* reorders (1 in 10^6): RREF-21 on */
    assert_int_equal(freed_id.worker, 0);
    assert_int_equal(freed_before, TP_EPROTO);
    assert_int_equal(freed_after, TP_EPROTO);
    assert_non_null(strstr(freed_why, "it was freed"));
}

/*
 * RREF-22: on a network that loses frames, the owner w1 sends its value to
 * w0 twice in one call, two forks for one holder. Its probe asks w0 about
 * them once they are old enough, and w0 answers "held" for each: each answer
 * marks its own fork safe, and neither is asked about again while w0 keeps
 * both (an answer that marked the wrong fork would leave the other at risk,
 * asked about every probe for as long as w0 holds it).
 */
#define HELD_SENT_S 1.0 /* when w1 sends the pair */

static uint64_t held_asked_msgs; /* delivered in the 5 s after the send */
static uint64_t held_quiet_msgs; /* then in the next 6 s */

static int held_pair_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 1) {
        tp_rref *r = NULL;
        CHECK(tp_rref_from_value(tp_value_object("Obj", malloc(1), obj_destroy), &r) == TP_OK);
        sleep_until(HELD_SENT_S);
        uint64_t m0 = tp_sim_messages(tp_sim_current());
        tp_value *args = tp_value_list_of(2, tp_value_rref(r), tp_value_rref(r));
        tp_value *res = NULL;
        CHECK(tp_rpc_sync(tp_to_rank(0), "keep_all", args, NULL, 2.0, &res) == TP_OK);
        tp_value_free(res);
        tp_value_free(args);
        tp_rref_release(r);             /* only w0's two forks keep it now */
        sleep_until(HELD_SENT_S + 5.0); /* a probe asked, and w0 answered */
        uint64_t m1 = tp_sim_messages(tp_sim_current());
        sleep_until(HELD_SENT_S + 11.0);
        held_asked_msgs = m1 - m0;
        held_quiet_msgs = tp_sim_messages(tp_sim_current()) - m1;
        CHECK(destroyed == 0);
    }
    sleep_until(HELD_SENT_S + 11.5);
    if (rank == 0)
        drop_all();
    sleep_until(HELD_SENT_S + 11.5 + SETTLE_S);
    if (rank == 1)
        CHECK(destroyed == 1); /* both deletes came */
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_rref_forks_answered_held_are_not_asked_again(void **state) {
    (void)state;
    held_asked_msgs = held_quiet_msgs = UINT64_MAX;
    run_plan_with("chaos 1 0 0\n", held_pair_program); /* loses frames: RREF-22 on */
    print_message("messages: %llu after the send, %llu then\n", (unsigned long long)held_asked_msgs,
                  (unsigned long long)held_quiet_msgs);
    assert_int_equal(held_asked_msgs, 4); /* the call and its answer, one query and its answer */
    assert_int_equal(held_quiet_msgs, 0);
}

/*
 * RREF-19: an answer about a fork the owner no longer has. w1 owns a value
 * and sent w0 four forks of it (its record's first four slots, all used).
 * The link breaks, so w1 asks w0 which it holds; w0 lets go of one while the
 * query is on the way (its delete comes first: "not held"), and w1 sends the
 * value to w2 before the answer (delayed) arrives, so its four slots are
 * full again. The answer finds nothing for the released fork and leaves the
 * record alone: the value lives on for w0's three forks, w1's own handle and
 * w2's fork, and is freed once all let go (make test's sanitizer build sees
 * a look past the record's slots).
 */
#define GONE_BREAK_S 3.0 /* the plan's break */
#define GONE_PLAN                                                                                  \
    "break 0 1 3000\nlatency 0 1 200 200 fixed\nlatency 1 0 200 200 fixed\n"                       \
    "delaytype response 400\n"

static int gone_fork_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    tp_rref *r = NULL;
    if (rank == 1) {
        CHECK(tp_rref_from_value(tp_value_object("Obj", malloc(1), obj_destroy), &r) == TP_OK);
        tp_value *args = tp_value_list_of(4, tp_value_rref(r), tp_value_rref(r), tp_value_rref(r),
                                          tp_value_rref(r));
        tp_value *res = NULL;
        CHECK(tp_rpc_sync(tp_to_rank(0), "keep_all", args, NULL, 5.0, &res) == TP_OK);
        tp_value_free(res);
        tp_value_free(args);
    }
    sleep_until(GONE_BREAK_S + 0.1); /* w1's query is on its way (200 ms) */
    if (rank == 0) {
        tp_rref_release(kept_all[0][3]);
        kept_all[0][3] = NULL;
    }
    sleep_until(GONE_BREAK_S + 0.5); /* the delete came (at +0.3), the answer comes at +0.8 */
    if (rank == 1) {
        tp_value *args = tp_value_list_of(1, tp_value_rref(r));
        tp_value *res = NULL;
        CHECK(tp_rpc_sync(tp_to_rank(2), "keep", args, NULL, 5.0, &res) == TP_OK);
        tp_value_free(res);
        tp_value_free(args);
    }
    sleep_until(GONE_BREAK_S + 2.0);
    CHECK(destroyed == 0);
    if (rank == 0)
        drop_all();
    if (rank == 1)
        tp_rref_release(r);
    if (rank == 2) {
        tp_rref_release(kept[2]);
        kept[2] = NULL;
    }
    sleep_until(GONE_BREAK_S + 2.0 + SETTLE_S);
    if (rank == 1)
        CHECK(destroyed == 1);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_rref_forks_answer_for_a_released_fork(void **state) {
    (void)state;
    run_plan_with(GONE_PLAN, gone_fork_program);
}

/*
 * RREF-13 with no memory for the hand-off: a non-blocking function whose
 * rref is not yet confirmed goes from the I/O context to the pool, in a
 * copy of its request. When that copy cannot be had, the function does not
 * run (the I/O context cannot wait) and the call fails clearly with
 * TP_ENOMEM; nothing the request held is lost: the rref's references are
 * settled (the owner frees the value) and the sanitizer and valgrind builds
 * check the blocks.
 */
static int nb_no_memory_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_rref *r = confirmed_object();
        tp_value *args = tp_value_list_of(1, tp_value_rref(r));
        tp_value *res = NULL;
        atomic_store(&malloc_failed, 0);
        atomic_store(&malloc_fail_size, sizeof(tpi_msg));
        tp_status st = tp_rpc_sync(tp_to_rank(2), "nb_keep", args, NULL, 10.0, &res);
        atomic_store(&malloc_fail_size, 0);
        print_message("nb_keep: %s: %s\n", tp_status_name(st), tp_errmsg());
        CHECK(atomic_load(&malloc_failed) == 1); /* the hand-off's copy, and nothing else */
        CHECK(st == TP_ENOMEM);
        CHECK(strstr(tp_errmsg(), "function 'nb_keep' on worker 'w2'") != NULL);
        CHECK(strstr(tp_errmsg(), "did not run: out of memory handing it to the pool") != NULL);
        tp_value_free(res);
        tp_value_free(args);
        tp_rref_release(r);
        CHECK(tp_sleep(SETTLE_S) == TP_OK);
        CHECK(kept[2] == NULL); /* it never ran */
        CHECK(destroyed == 1);  /* w2's fork and w0's reference were both settled */
        /* With memory again, the same call runs on the pool once confirmed. */
        r = confirmed_object();
        args = tp_value_list_of(1, tp_value_rref(r));
        res = NULL;
        int confirmed = 0;
        CHECK(tp_rpc_sync(tp_to_rank(2), "nb_keep", args, NULL, 10.0, &res) == TP_OK &&
              tp_value_get_bool(res, &confirmed) == TP_OK && confirmed);
        tp_value_free(res);
        tp_value_free(args);
        tp_rref_release(r);
        CHECK(call_until_ok(2, "drop", NULL, &res) == TP_OK);
        tp_value_free(res);
        CHECK(tp_sleep(SETTLE_S) == TP_OK);
        CHECK(destroyed == 2);
    }
    CHECK(tp_sleep(rank == 0 ? 0.0 : 2 * SETTLE_S + 2.0) == TP_OK);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_nonblocking_hand_off_without_memory(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) /* under valgrind, or not GCC */
        skip();
    run_plan_with("", nb_no_memory_program);
}

/*
 * Guarantee 2 with no memory for the kept child: w0 passes its user rref
 * (owner w1) to w2, and the record that keeps w0's reference until w2's
 * fork is confirmed cannot be had. The send fails at once with TP_ENOMEM,
 * nothing sent: sent without the record, w0's release could reach w1 before
 * w2's fork and free a value w2 holds. With memory the same share works.
 */
typedef struct { /* rref.c's tpi_child, for its size */
    tp_rref *rref;
    uint32_t to;
    int in_transit;
    uint64_t sent_ns;
} child_record;

static int child_no_memory_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_rref *r = confirmed_object();
        tp_value *args = tp_value_list_of(1, tp_value_rref(r));
        tp_future *f = NULL;
        atomic_store(&malloc_failed, 0);
        atomic_store(&malloc_fail_size, sizeof(child_record));
        tp_status st = tp_rpc_async(tp_to_rank(2), "keep", args, NULL, 10.0, &f);
        atomic_store(&malloc_fail_size, 0);
        print_message("keep: %s: %s\n", tp_status_name(st), tp_errmsg());
        CHECK(atomic_load(&malloc_failed) == 1); /* the kept child's record, and nothing else */
        CHECK(st == TP_ENOMEM && f == NULL);
        CHECK(strstr(tp_errmsg(), "function 'keep': sending an rref: out of memory") != NULL);
        tp_future_free(f);
        CHECK(tp_sleep(SETTLE_S) == TP_OK);
        CHECK(kept[2] == NULL); /* nothing reached w2 */
        CHECK(destroyed == 0);
        tp_value *res = NULL;
        int confirmed = 0;
        CHECK(tp_rpc_sync(tp_to_rank(2), "keep", args, NULL, 10.0, &res) == TP_OK &&
              tp_value_get_bool(res, &confirmed) == TP_OK && confirmed);
        tp_value_free(res);
        tp_value_free(args);
        tp_rref_release(r);
        CHECK(tp_sleep(SETTLE_S) == TP_OK);
        CHECK(destroyed == 0); /* w2 holds it */
        CHECK(call_until_ok(2, "drop", NULL, &res) == TP_OK);
        tp_value_free(res);
        CHECK(tp_sleep(SETTLE_S) == TP_OK);
        CHECK(destroyed == 1);
    }
    CHECK(tp_sleep(rank == 0 ? 0.0 : 3 * SETTLE_S + 2.0) == TP_OK);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_rref_share_without_memory_for_the_child(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) /* under valgrind, or not GCC */
        skip();
    run_plan_with("", child_no_memory_program);
}

static void run_plan_with(const char *plan, tp_sim_program program) {
    destroyed = 0;
    memset(kept, 0, sizeof kept);
    memset(kept_all, 0, sizeof kept_all);
    tp_sim_config cfg = {.hosts = WORLD, .seed = 7};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    char err[256];
    assert_int_equal(tp_sim_load_faults(sim, plan, err, sizeof err), TP_OK);
    int codes[WORLD] = {-9, -9, -9};
    assert_int_equal(tp_sim_run(sim, program, NULL, codes), TP_OK);
    memset(max_inflight_bytes, 0, sizeof max_inflight_bytes); /* one world's, even if it failed */
    if (tp_sim_violations(sim))
        print_message("oracle: %s\n", tp_sim_violation(sim));
    assert_int_equal(tp_sim_violations(sim), 0);
    tp_sim_free(sim);
    for (int i = 0; i < WORLD; i++)
        assert_int_equal(codes[i], 0);
    assert_int_equal(failures, 0);
}

static void run_plan(const char *plan) {
    run_plan_with(plan, share_program);
}

static void test_rref_delete_waits_for_a_retried_fork(void **state) {
    (void)state;
    run_plan_with("failsend rref_fork 1\n", dropped_program);
}

/* The first two forks, accepts and deletes fail to send. */
static void test_rref_share_survives_failed_sends(void **state) {
    (void)state;
    run_plan("failsend rref_fork 2\nfailsend rref_accept 2\nfailsend rref_delete 2\n");
}

/* Forks and accepts are slow as well as failing (PyTorch's delay list). */
static void test_rref_share_survives_failed_and_slow_sends(void **state) {
    (void)state;
    run_plan("failsend rref_fork 1\nfailsend rref_delete 1\n"
             "delaytype rref_fork 300\ndelaytype rref_accept 200\n");
}

/*
 * RREF-14's "no answer" is not a failed creation when a fetch was answered:
 * w0's REMOTE of hold() on w1 is answered at 1.5 s, in a chaos window that
 * loses every frame, so only its deadline (4 s) ends it. Meanwhile, at 2 s,
 * w0's to_here fetched the value: the owner had made it (and recorded our
 * fork). The REMOTE's timeout must not fail the rref then, nor abandon the
 * value on its owner: a later to_here still gets it.
 */
#define LOST_ANSWER_PLAN "chaos 1000000 0 0 1450 1550\n" /* hold()'s answer (1.5 s) is lost */

static tp_status lost_answer_st[2]; /* w0's to_here before and after the REMOTE's deadline */
static uint64_t lost_answer_drops;

static int lost_answer_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        sleep_until(1.0);
        tp_rref *r = NULL;
        CHECK(tp_remote(tp_to_rank(1), "hold", NULL, NULL, 3.0, &r) == TP_OK);
        sleep_until(2.0); /* past the lost answer: the value is made */
        tp_value *v = NULL;
        lost_answer_st[0] = r ? tp_rref_to_here(r, 1.0, &v) : TP_EINVAL;
        tp_value_free(v);
        v = NULL;
        sleep_until(4.5); /* the REMOTE's deadline (4 s) passed, unanswered */
        lost_answer_st[1] = r ? tp_rref_to_here(r, 1.0, &v) : TP_EINVAL;
        tp_value_free(v);
        tp_rref_release(r);
        lost_answer_drops = tp_sim_fault_count(tp_sim_current(), TP_SIM_FAULT_CHAOS_DROP);
    }
    if (rank == 1) {
        sleep_until(1.5);
        release_held();
    }
    sleep_until(4.5 + SETTLE_S);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_rref_fetched_value_outlives_its_lost_remote_answer(void **state) {
    (void)state;
    lost_answer_drops = 0;
    lost_answer_st[0] = lost_answer_st[1] = TP_EINVAL;
    run_plan_with(LOST_ANSWER_PLAN, lost_answer_program);
    assert_true(lost_answer_drops >= 1); /* the REMOTE's answer was lost */
    assert_int_equal(lost_answer_st[0], TP_OK);
    assert_int_equal(lost_answer_st[1], TP_OK); /* not failed, not abandoned */
}

/*
 * RREF-14: as above, hold()'s answer to w0's remote() is lost, but w0
 * never fetches: it shared the rref with w2 first (1.1 s), and at the
 * REMOTE's deadline (4 s) its call fails and it abandons the creation. The
 * value on w1 was made meanwhile; from the abandon on, the owner answers
 * every holder with the creation's error, so w2's to_here at 4.5 s fails
 * saying the rref was not created, instead of handing out a value its
 * creator gave up on.
 */
static tp_status abandoned_st = TP_EINVAL;
static char abandoned_msg[TP_ERRMSG_LEN_MAX];

static int abandoned_ready_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (join(rank, world_size) != TP_OK)
        return 1;
    if (rank == 0) {
        sleep_until(1.0);
        tp_rref *r = NULL;
        CHECK(tp_remote(tp_to_rank(1), "hold", NULL, NULL, 3.0, &r) == TP_OK);
        tp_value *args = tp_value_list_of(1, tp_value_rref(r));
        tp_value *res = NULL;
        CHECK(tp_rpc_sync(tp_to_rank(2), "keep", args, NULL, 0.3, &res) == TP_OK);
        tp_value_free(res);
        tp_value_free(args);
        sleep_until(4.5); /* the REMOTE's deadline (4 s) passed, unanswered */
        tp_rref_release(r);
    }
    if (rank == 1) {
        sleep_until(1.5);
        release_held();
    }
    if (rank == 2) {
        sleep_until(4.5);
        tp_value *v = NULL;
        abandoned_st = kept[2] ? tp_rref_to_here(kept[2], 1.0, &v) : TP_EINVAL;
        snprintf(abandoned_msg, sizeof abandoned_msg, "%s", tp_errmsg());
        tp_value_free(v);
        tp_rref_release(kept[2]);
        kept[2] = NULL;
    }
    sleep_until(4.5 + SETTLE_S);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_rref_abandoned_after_its_value_was_made(void **state) {
    (void)state;
    abandoned_st = TP_EINVAL;
    abandoned_msg[0] = '\0';
    run_plan_with(LOST_ANSWER_PLAN, abandoned_ready_program);
    print_message("w2's to_here: %s: %s\n", tp_status_name(abandoned_st), abandoned_msg);
    assert_int_equal(abandoned_st, TP_ETIMEDOUT);
    assert_non_null(strstr(abandoned_msg, "not created"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_rref_share_survives_failed_sends, reset_failures),
        cmocka_unit_test_setup(test_rref_share_survives_failed_and_slow_sends, reset_failures),
        cmocka_unit_test_setup(test_rref_delete_waits_for_a_retried_fork, reset_failures),
        cmocka_unit_test_setup(test_rref_leaks_reported_at_shutdown, reset_failures),
        cmocka_unit_test_setup(test_rref_leaks_reported_for_every_rref, reset_failures),
        cmocka_unit_test_setup(test_rref_lost_carrying_frame_from_user, reset_failures),
        cmocka_unit_test_setup(test_rref_lost_carrying_frame_from_owner, reset_failures),
        cmocka_unit_test_setup(test_rref_forks_query_once_per_break, reset_failures),
        cmocka_unit_test_setup(test_rref_forks_query_without_memory_says_so, reset_failures),
        cmocka_unit_test_setup(test_call_timed_out_without_memory_for_its_debt, reset_failures),
        cmocka_unit_test_setup(test_rref_fork_in_transit_not_asked_about, reset_failures),
        cmocka_unit_test_setup(test_rref_forks_query_again_waits_afresh, reset_failures),
        cmocka_unit_test_setup(test_method_waits_off_the_pool, reset_failures),
        cmocka_unit_test_setup(test_methods_past_the_deferred_bound, reset_failures),
        cmocka_unit_test_setup(test_methods_past_the_deferred_bound_keep_their_deadline,
                               reset_failures),
        cmocka_unit_test_setup(test_no_probe_timer_without_rrefs, reset_failures),
        cmocka_unit_test_setup(test_callee_without_memory_for_the_job, reset_failures),
        cmocka_unit_test_setup(test_rref_orphan_reported_at_shutdown, reset_failures),
        cmocka_unit_test_setup(test_rref_placeholder_fails_when_its_creator_dies, reset_failures),
        cmocka_unit_test_setup(test_rref_delete_without_memory_sent_again, reset_failures),
        cmocka_unit_test_setup(test_rref_freed_ids_of_others_outlast_own_values, reset_failures),
        cmocka_unit_test_setup(test_rref_forks_answered_held_are_not_asked_again, reset_failures),
        cmocka_unit_test_setup(test_rref_forks_asked_about_from_age_0, reset_failures),
        cmocka_unit_test_setup(test_rref_forks_answer_for_a_released_fork, reset_failures),
        cmocka_unit_test_setup(test_nonblocking_hand_off_without_memory, reset_failures),
        cmocka_unit_test_setup(test_rref_share_without_memory_for_the_child, reset_failures),
        cmocka_unit_test_setup(test_rref_fetched_value_outlives_its_lost_remote_answer,
                               reset_failures),
        cmocka_unit_test_setup(test_rref_abandoned_after_its_value_was_made, reset_failures),
        cmocka_unit_test_setup(test_rref_debug_counters_step_by_step, reset_failures),
        cmocka_unit_test_setup(test_rref_released_with_a_pending_child_refuses_use, reset_failures),
        cmocka_unit_test_setup(test_rref_deferred_delete_reported_as_a_leak, reset_failures),
        cmocka_unit_test_setup(test_rref_leak_list_replaced_at_the_next_shutdown, reset_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
