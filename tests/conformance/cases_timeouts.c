/*
 * cases_timeouts.c: TP_TIMEOUT_DEFAULT (-1), TP_TIMEOUT_INFINITE (0),
 * per-call overrides, changing the default, and rejected values.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "conformance.h"

/* Init with rpc_timeout set in the options. The init and shutdown phase
 * deadlines default to rpc_timeout (OPT-4): keep them long, so only calls
 * feel the short default. */
static tp_status init_with_timeout(int rank, int ws, double rpc_timeout_s) {
    tp_options *opts = conf_options();
    tp_status st = tp_options_set_rpc_timeout(opts, rpc_timeout_s);
    if (st == TP_OK)
        st = tp_options_set_init_timeout(opts, 30.0);
    if (st == TP_OK)
        st = tp_options_set_shutdown_timeout(opts, 30.0);
    if (st == TP_OK)
        st = conf_init_opts(rank, ws, opts);
    tp_options_free(opts);
    return st;
}

#define INIT_TIMEOUT_OR_RETURN(rank, ws, t)                                                        \
    do {                                                                                           \
        if (!CHECK_OK(init_with_timeout((rank), (ws), (t))))                                       \
            return conf_finish(rank);                                                              \
    } while (0)

/* spec: TIMEOUT-2 TIMEOUT-5 ERR-2: -1 means the default (the option); the error has context. */
static int timeout_default_applies(int rank, int ws) {
    INIT_TIMEOUT_OR_RETURN(rank, ws, 0.2);
    if (rank == 0) {
        CHECK(fabs(tp_get_rpc_timeout() - 0.2) < 1e-9);
        tp_value *res = NULL;
        uint64_t t0 = conf_now_ns();
        CHECK_STATUS(conf_sync(tp_to_rank(1), "sleep_ms", CONF_INTS(1000), &res), TP_ETIMEDOUT);
        double took = conf_since_s(t0);
        if (!CHECK(took >= 0.19 && took < 0.8))
            conf_fail(rank, __FILE__, __LINE__, "timed out after %.3f s, want ~0.2 s", took);
        CHECK_CONTAINS(tp_errmsg(), "w1");
        CHECK_CONTAINS(tp_errmsg(), "sleep_ms");
        CHECK_CONTAINS(tp_errmsg(), "timed out after 200 ms");
        CHECK(res == NULL);
        tp_value_free(res);
        tp_future *f = NULL;
        if (CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(1000), &f))) {
            CHECK_STATUS(tp_future_wait(f, TP_TIMEOUT_INFINITE), TP_ETIMEDOUT);
            CHECK_CONTAINS(tp_future_error(f), "sleep_ms");
        }
        tp_future_free(f);
        /* A quick call under the same default is fine. */
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(1, 2), -1), 3);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: TIMEOUT-3 TIMEOUT-4: 0 means no deadline, per call and as the default. */
static int timeout_zero_is_infinite(int rank, int ws) {
    INIT_TIMEOUT_OR_RETURN(rank, ws, 0.1);
    if (rank == 0) {
        tp_value *res = NULL;
        tp_value *args = CONF_INTS(300);
        if (CHECK_OK(tp_rpc_sync(tp_to_rank(1), "sleep_ms", args, NULL, TP_TIMEOUT_INFINITE, &res)))
            CHECK_INT(conf_int_of(rank, res, -1), 300);
        tp_value_free(res);
        tp_value_free(args);
        CHECK_OK(tp_set_rpc_timeout(TP_TIMEOUT_INFINITE));
        CHECK(tp_get_rpc_timeout() == 0.0);
        res = NULL;
        if (CHECK_OK(conf_sync(tp_to_rank(1), "sleep_ms", CONF_INTS(300), &res)))
            CHECK_INT(conf_int_of(rank, res, -1), 300);
        tp_value_free(res);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: TIMEOUT-3 TIMEOUT-5: a per-call timeout overrides the default both ways. */
static int timeout_per_call_override(int rank, int ws) {
    INIT_TIMEOUT_OR_RETURN(rank, ws, 0.1);
    if (rank == 0) {
        tp_value *args = CONF_INTS(300);
        tp_value *res = NULL;
        if (CHECK_OK(tp_rpc_sync(tp_to_rank(1), "sleep_ms", args, NULL, 5.0, &res)))
            CHECK_INT(conf_int_of(rank, res, -1), 300);
        tp_value_free(res);
        res = NULL;
        CHECK_OK(tp_set_rpc_timeout(60.0));
        uint64_t t0 = conf_now_ns();
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), "sleep_ms", args, NULL, 0.05, &res), TP_ETIMEDOUT);
        CHECK(conf_since_s(t0) < 0.25);
        tp_value_free(res);
        tp_future *f = NULL;
        t0 = conf_now_ns();
        if (CHECK_OK(tp_rpc_async(tp_to_rank(1), "sleep_ms", args, NULL, 0.05, &f))) {
            CHECK_STATUS(tp_future_wait(f, TP_TIMEOUT_INFINITE), TP_ETIMEDOUT);
            CHECK(conf_since_s(t0) < 0.25);
        }
        tp_future_free(f);
        tp_value_free(args);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: TIMEOUT-2 TIMEOUT-4: a changed default applies to later calls only. */
static int timeout_set_default_later_calls_only(int rank, int ws) {
    INIT_TIMEOUT_OR_RETURN(rank, ws, 10.0);
    if (rank == 0) {
        tp_future *a = NULL, *b = NULL;
        CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(300), &a));
        CHECK_OK(tp_set_rpc_timeout(0.1));
        CHECK(fabs(tp_get_rpc_timeout() - 0.1) < 1e-9);
        CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(300), &b));
        if (b)
            CHECK_STATUS(tp_future_wait(b, TP_TIMEOUT_INFINITE), TP_ETIMEDOUT);
        if (a) {
            CHECK_OK(tp_future_wait(a, TP_TIMEOUT_INFINITE));
            CHECK_INT(conf_int_of(rank, tp_future_value(a), -1), 300);
        }
        tp_future_free(a);
        tp_future_free(b);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: TIMEOUT-1 TIMEOUT-4 TIMEOUT-6 OPT-2: negative timeouts other than -1 (and NaN) are
 * TP_EINVAL. */
static int timeout_negative_rejected(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *args = CONF_INTS(1, 2);
        tp_value *res = NULL;
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), "add", args, NULL, -2.0, &res), TP_EINVAL);
        CHECK(tp_errmsg()[0] != '\0');
        CHECK(res == NULL);
        tp_future *f = NULL;
        CHECK_STATUS(tp_rpc_async(tp_to_rank(1), "add", args, NULL, -0.5, &f), TP_EINVAL);
        CHECK(f == NULL);
        tp_future_free(f);
        tp_rref *r = NULL;
        CHECK_STATUS(tp_remote(tp_to_rank(1), "add", args, NULL, -3.0, &r), TP_EINVAL);
        CHECK(r == NULL);
        tp_rref_release(r);
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), "add", args, NULL, NAN, &res), TP_EINVAL);
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), "add", args, NULL, INFINITY, &res), TP_EINVAL);
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), "add", args, NULL, 4000001.0, &res), TP_EINVAL);
        CHECK_STATUS(tp_sleep(-1.0), TP_EINVAL);
        double before = tp_get_rpc_timeout();
        CHECK_STATUS(tp_set_rpc_timeout(-1.0), TP_EINVAL);
        CHECK_STATUS(tp_set_rpc_timeout(-7.0), TP_EINVAL);
        CHECK(tp_get_rpc_timeout() == before);
        tp_options *o = tp_options_new();
        CHECK_STATUS(tp_options_set_rpc_timeout(o, -1.0), TP_EINVAL);
        CHECK_STATUS(tp_options_set_rpc_timeout(o, -0.001), TP_EINVAL);
        tp_options_free(o);
        /* The worker is fine afterwards. */
        if (CHECK_OK(tp_rpc_sync(tp_to_rank(1), "add", args, NULL, TP_TIMEOUT_DEFAULT, &res)))
            CHECK_INT(conf_int_of(rank, res, -1), 3);
        tp_value_free(res);
        tp_value_free(args);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: RREF-2 TIMEOUT-5: remote's timeout bounds the creation; the failure shows in to_here. */
static int timeout_remote_creation(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_rref *r = NULL;
        tp_value *args = CONF_INTS(1000);
        tp_status st = tp_remote(tp_to_rank(1), "sleep_ms", args, NULL, 0.1, &r);
        tp_value_free(args);
        if (CHECK_OK(st)) {
            tp_value *v = NULL;
            uint64_t t0 = conf_now_ns();
            CHECK_STATUS(tp_rref_to_here(r, TP_TIMEOUT_INFINITE, &v), TP_ETIMEDOUT);
            CHECK(conf_since_s(t0) < 0.5);
            tp_value_free(v);
        }
        tp_rref_release(r);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

#define ORDER_CALLS 12

typedef struct order_log {
    _Atomic int n;
    int order[ORDER_CALLS];
} order_log;
static order_log order_seen;
static int order_index[ORDER_CALLS];

static void record_order(tp_future *f, void *user_data) {
    (void)f;
    int i = atomic_fetch_add(&order_seen.n, 1);
    if (i < ORDER_CALLS)
        order_seen.order[i] = *(const int *)user_data;
}

/*
 * spec: TIMEOUT-5 AGENT-7: calls issued with the same timeout at one instant
 * have equal deadlines (the simulator's clock does not move between them;
 * elsewhere each deadline is later than the one before) and fail in issue
 * order. Each future's done-callback logs its index; with one pool thread
 * callbacks run in the order their futures completed. The callee runs the
 * calls side by side (a thread each): every one still sleeps when its
 * deadline passes, and the drain waits for one sleep, not twelve.
 */
static int timeout_equal_deadlines_fail_in_issue_order(int rank, int ws) {
    if (rank == 0) {
        atomic_store(&order_seen.n, 0);
        for (int i = 0; i < ORDER_CALLS; i++) {
            order_seen.order[i] = -1;
            order_index[i] = i;
        }
    }
    tp_options *o = conf_options();
    tp_status st = tp_options_set_num_worker_threads(o, rank == 0 ? 1 : ORDER_CALLS);
    if (st == TP_OK)
        st = tp_options_set_shutdown_timeout(o, 30.0);
    if (st == TP_OK)
        st = conf_init_opts(rank, ws, o);
    tp_options_free(o);
    if (!CHECK_OK(st))
        return conf_finish(rank);
    if (rank == 0) {
        tp_future *fs[ORDER_CALLS] = {0};
        tp_value *args = CONF_INTS(1000);
        for (int i = 0; i < ORDER_CALLS; i++)
            if (CHECK_OK(tp_rpc_async(tp_to_rank(1), "sleep_ms", args, NULL, 0.2, &fs[i])))
                CHECK_OK(tp_future_add_done_callback(fs[i], record_order, &order_index[i]));
        tp_value_free(args);
        for (int i = 0; i < ORDER_CALLS; i++)
            if (fs[i])
                CHECK_STATUS(tp_future_wait(fs[i], TP_TIMEOUT_INFINITE), TP_ETIMEDOUT);
        /* Every done-callback has run once the pool ran one more task. */
        uint64_t t0 = conf_now_ns();
        while (atomic_load(&order_seen.n) < ORDER_CALLS && conf_since_s(t0) < 10.0)
            if (tp_sleep(0.005) != TP_OK)
                break;
        CHECK_INT(atomic_load(&order_seen.n), ORDER_CALLS);
        int wrong = 0;
        for (int i = 0; i < ORDER_CALLS; i++)
            wrong += order_seen.order[i] != i;
        if (!CHECK_INT(wrong, 0)) {
            char got[128];
            size_t n = 0;
            for (int i = 0; i < ORDER_CALLS && n < sizeof got; i++)
                n += (size_t)snprintf(got + n, sizeof got - n, " %d", order_seen.order[i]);
            conf_fail(rank, __FILE__, __LINE__, "failed in the order%s", got);
        }
        for (int i = 0; i < ORDER_CALLS; i++)
            tp_future_free(fs[i]);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/*
 * spec: TIMEOUT-1 TIMEOUT-3 TIMEOUT-5: a 0.5 ms timeout is a timeout, not 0
 * (none): a call to a 1.5 s function with it fails with TP_ETIMEDOUT at once,
 * for rpc_sync and rpc_async. (That the callee is told 1 ms, not 0, needs a
 * simulator fault: test_timeout's test_timeout_submillisecond_told_to_callee.)
 */
static int timeout_submillisecond_is_not_zero(int rank, int ws) {
    INIT_TIMEOUT_OR_RETURN(rank, ws, 60.0);
    if (rank == 0) {
        tp_value *args = CONF_INTS(1500);
        tp_value *res = NULL;
        uint64_t t0 = conf_now_ns();
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), "sleep_ms", args, NULL, 0.0005, &res),
                     TP_ETIMEDOUT);
        CHECK_CONTAINS(tp_errmsg(), "timed out after 0.5 ms");
        CHECK(conf_since_s(t0) < 1.0);
        CHECK(res == NULL);
        tp_value_free(res);
        tp_future *f = NULL;
        t0 = conf_now_ns();
        if (CHECK_OK(tp_rpc_async(tp_to_rank(1), "sleep_ms", args, NULL, 0.0005, &f))) {
            CHECK_STATUS(tp_future_wait(f, 10.0), TP_ETIMEDOUT);
            CHECK_CONTAINS(tp_future_error(f), "timed out after 0.5 ms");
            CHECK(conf_since_s(t0) < 1.0);
        }
        tp_future_free(f);
        tp_value_free(args);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/*
 * spec: RREF-8 TIMEOUT-2: to_here(-1) on the owner waits for the value at
 * most the default rpc_timeout, then fails with TP_ETIMEDOUT "the value is
 * not ready after 0.2 s"; the value takes 2 s to build (the creation
 * itself has no deadline).
 */
static int timeout_owner_to_here_default(int rank, int ws) {
    INIT_TIMEOUT_OR_RETURN(rank, ws, 0.2);
    if (rank == 0) {
        tp_rref *r = NULL;
        tp_value *args = CONF_INTS(2000);
        CHECK_OK(tp_remote(tp_to_rank(0), "sleep_ms", args, NULL, TP_TIMEOUT_INFINITE, &r));
        tp_value_free(args);
        if (r) {
            CHECK(tp_rref_is_owner(r));
            tp_value *v = NULL;
            uint64_t t0 = conf_now_ns();
            CHECK_STATUS(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v), TP_ETIMEDOUT);
            double took = conf_since_s(t0);
            CHECK_CONTAINS(tp_errmsg(), "not ready after 0.2 s");
            if (!CHECK(took >= 0.19 && took < 1.5))
                conf_fail(rank, __FILE__, __LINE__, "to_here(-1) took %.3f s, want ~0.2 s",
                          took);
            CHECK(v == NULL);
            tp_value_free(v);
        }
        tp_rref_release(r);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/*
 * spec: TIMEOUT-3 TIMEOUT-5 AGENT-10: a fractional-millisecond timeout
 * (1.5 ms) with no other traffic fires: nothing else wakes the worker, so
 * only its timer, armed at a deadline that is not a whole millisecond, can
 * end the call. Twice, so the timer is armed again after it fired.
 */
static int timeout_fractional_ms_fires_alone(int rank, int ws) {
    INIT_TIMEOUT_OR_RETURN(rank, ws, 60.0);
    if (rank == 0) {
        tp_value *args = CONF_INTS(1500);
        for (int i = 0; i < 2; i++) {
            tp_future *f = NULL;
            uint64_t t0 = conf_now_ns();
            if (CHECK_OK(tp_rpc_async(tp_to_rank(1), "sleep_ms", args, NULL, 0.0015, &f))) {
                CHECK_STATUS(tp_future_wait(f, 10.0), TP_ETIMEDOUT);
                CHECK_CONTAINS(tp_future_error(f), "timed out after 1.5 ms");
                double took = conf_since_s(t0);
                if (!CHECK(took >= 0.0015 && took < 1.0))
                    conf_fail(rank, __FILE__, __LINE__, "call %d ended after %.4f s", i, took);
            }
            tp_future_free(f);
        }
        tp_value_free(args);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

const tp_conformance_case conf_cases_timeouts[] = {
    {"timeout_default_applies", 2, timeout_default_applies, "TIMEOUT-2 TIMEOUT-5 ERR-2"},
    {"timeout_zero_is_infinite", 2, timeout_zero_is_infinite, "TIMEOUT-3 TIMEOUT-4"},
    {"timeout_per_call_override", 2, timeout_per_call_override, "TIMEOUT-3 TIMEOUT-5"},
    {"timeout_set_default_later_calls_only", 2, timeout_set_default_later_calls_only,
     "TIMEOUT-2 TIMEOUT-4"},
    {"timeout_negative_rejected", 2, timeout_negative_rejected,
     "TIMEOUT-1 TIMEOUT-4 TIMEOUT-6 OPT-2"},
    {"timeout_remote_creation", 2, timeout_remote_creation, "RREF-2 TIMEOUT-5"},
    {"timeout_equal_deadlines_fail_in_issue_order", 2,
     timeout_equal_deadlines_fail_in_issue_order, "TIMEOUT-5 AGENT-7"},
    {"timeout_submillisecond_is_not_zero", 2, timeout_submillisecond_is_not_zero,
     "TIMEOUT-1 TIMEOUT-3 TIMEOUT-5"},
    {"timeout_owner_to_here_default", 2, timeout_owner_to_here_default, "RREF-8 TIMEOUT-2"},
    {"timeout_fractional_ms_fires_alone", 2, timeout_fractional_ms_fires_alone,
     "TIMEOUT-3 TIMEOUT-5 AGENT-10"},
};
const size_t conf_cases_timeouts_count = sizeof conf_cases_timeouts / sizeof conf_cases_timeouts[0];
