/*
 * cases_shutdown.c: graceful shutdown drains every worker's outstanding work
 * (dropped futures and fire-and-forget chains included) and releases rrefs;
 * non-graceful shutdown fails what is in flight at once.
 *
 * The drain checks read each worker's own counters after its tp_shutdown(1)
 * returned: a graceful shutdown ends only when all work everywhere is done,
 * so the counts must be complete by then on every worker.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

#define UNEVEN_CALLS 30
#define UNEVEN_MS 100

/* Worker 0 sends 30 slow calls to w1, then 30 to w2; kept or dropped futures. */
static int uneven_load(int rank, int ws, int keep) {
    CONF_INIT_OR_RETURN(rank, ws);
    tp_future *fs[2 * UNEVEN_CALLS] = {0};
    if (rank == 0) {
        for (int i = 0; i < 2 * UNEVEN_CALLS; i++) {
            CHECK_OK(conf_async(tp_to_rank(i < UNEVEN_CALLS ? 1 : 2), "sleep_ms",
                                CONF_INTS(UNEVEN_MS), &fs[i]));
            if (!keep) {
                tp_future_free(fs[i]);
                fs[i] = NULL;
            }
        }
    }
    uint64_t t0 = conf_now_ns();
    CHECK_OK(tp_shutdown(1));
    if (rank == 0) {
        /* Shutdown cannot end before the two batches on each worker ran. */
        CHECK(conf_since_s(t0) >= 0.09);
        if (keep) {
            int bad = 0;
            for (int i = 0; i < 2 * UNEVEN_CALLS; i++) {
                int64_t x = -1;
                if (!fs[i] || !tp_future_done(fs[i]) || tp_future_status(fs[i]) != TP_OK ||
                    tp_value_get_int(tp_future_value(fs[i]), &x) != TP_OK || x != UNEVEN_MS)
                    bad++;
            }
            CHECK_INT(bad, 0);
        }
        CHECK_INT(conf_served(0), 0);
    } else {
        CHECK_INT(conf_started(rank), UNEVEN_CALLS);
        CHECK_INT(conf_served(rank), UNEVEN_CALLS);
    }
    for (int i = 0; i < 2 * UNEVEN_CALLS; i++)
        tp_future_free(fs[i]);
    return conf_finish(rank);
}

/* spec: SHUTDOWN-3 SHUTDOWN-5 FUTURE-4: dropped futures' calls all run before shutdown ends. */
static int shutdown_graceful_uneven_load_dropped(int rank, int ws) {
    return uneven_load(rank, ws, 0);
}

/* spec: SHUTDOWN-3 SHUTDOWN-5: kept futures are all complete when shutdown returns. */
static int shutdown_graceful_uneven_load_kept(int rank, int ws) {
    return uneven_load(rank, ws, 1);
}

#define CHAIN_HOPS 20 /* hops after the first call: 21 calls in all */
#define CHAIN_DELAY_MS 20

/* spec: SHUTDOWN-5 FUNC-4: a fire-and-forget chain of nested async calls is drained. */
static int shutdown_graceful_drains_ff_chain(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future *f = NULL;
        CHECK_OK(conf_async(tp_to_rank(1), "ff_hop", CONF_INTS(CHAIN_HOPS, CHAIN_DELAY_MS), &f));
        tp_future_free(f);
    }
    CHECK_OK(tp_shutdown(1));
    /* Call k (0..CHAIN_HOPS) runs on worker (1 + k) % ws. */
    int64_t want = 0;
    for (int k = 0; k <= CHAIN_HOPS; k++)
        want += (1 + k) % ws == rank;
    CHECK_INT(conf_hops(rank), want);
    return conf_finish(rank);
}

/* spec: SHUTDOWN-3 INIT-1: workers in the shutdown barrier keep serving a late worker's calls. */
static int shutdown_barrier_keeps_serving(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == ws - 1) {
        CHECK_OK(tp_sleep(0.3)); /* the others are in tp_shutdown by now */
        for (int peer = 0; peer < ws - 1; peer++) {
            CHECK_INT(conf_sync_int(rank, tp_to_rank(peer), "add", CONF_INTS(peer, 1), -1),
                      peer + 1);
            /* Functions there may still use the API (whoami reads get_worker_info). */
            tp_value *res = NULL;
            if (CHECK_OK(conf_sync(tp_to_rank(peer), "whoami", NULL, &res)))
                CHECK(strcmp(conf_str_of(rank, res), conf_name(peer)) == 0);
            tp_value_free(res);
        }
        tp_rref *r = NULL;
        tp_value *args = CONF_INTS(5);
        if (CHECK_OK(tp_remote(tp_to_rank(0), "echo", args, NULL, TP_TIMEOUT_DEFAULT, &r))) {
            tp_value *v = NULL;
            if (CHECK_OK(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v)))
                CHECK_INT(conf_int_of(rank, v, -1), 5);
            tp_value_free(v);
        }
        tp_value_free(args);
        tp_rref_release(r);
    }
    uint64_t t0 = conf_now_ns();
    CHECK_OK(tp_shutdown(1));
    if (rank == 0)
        CHECK(conf_since_s(t0) >= 0.25); /* it waited for the late worker */
    return conf_finish(rank);
}

/* spec: SHUTDOWN-4 RREF-11: user rrefs still held at shutdown are released; the owner frees them.
 */
static int shutdown_graceful_releases_rrefs(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    tp_rref *r = NULL;
    if (rank == 0) {
        tp_method *get = NULL;
        CHECK_OK(tp_method_factory("get", &get));
        if (CHECK_OK(
                tp_remote(tp_to_rank(1), "make_counter", NULL, NULL, TP_TIMEOUT_DEFAULT, &r)) &&
            get) {
            tp_value *res = NULL;
            if (CHECK_OK(tp_method_call_sync(get, r, NULL, NULL, TP_TIMEOUT_DEFAULT, &res)))
                CHECK_INT(conf_int_of(rank, res, -1), 0);
            tp_value_free(res);
            CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "live_objects", NULL, -1), 1);
        }
        tp_method_free(get);
    }
    tp_rref *mine = NULL; /* an owner rref the user still holds at shutdown */
    CHECK_OK(tp_rref_from_value(tp_value_int(rank), &mine));
    CHECK_OK(tp_shutdown(1));
    if (rank == 1)
        CHECK_INT(conf_live_objects(1), 0);
    /* RREF-18: nothing left unsettled anywhere. */
    tp_rref_leak *leaks = NULL;
    size_t nleaks = 99;
    CHECK_OK(tp_shutdown_leaks(&leaks, &nleaks));
    CHECK_INT(nleaks, 0);
    CHECK(leaks == NULL);
    free(leaks);
    if (rank == 0 && r) {
        tp_value *v = NULL;
        CHECK_STATUS(tp_rref_to_here(r, 0.1, &v), TP_ESHUTDOWN); /* released by shutdown */
        CHECK(v == NULL);
        tp_value_free(v);
        CHECK(tp_rref_owner_name(r) && strcmp(tp_rref_owner_name(r), "w1") == 0);
        CHECK_STATUS(tp_rref_rpc_sync(r, "get", NULL, NULL, TP_TIMEOUT_DEFAULT, &v),
                     TP_ESHUTDOWN);
        CHECK(v == NULL);
        tp_value *args = tp_value_list_of(1, tp_value_rref(r));
        tp_status st = tp_rpc_sync(tp_to_rank(1), "rref_fetch", args, NULL, TP_TIMEOUT_DEFAULT, &v);
        CHECK(st == TP_ESHUTDOWN || st == TP_ENOTINIT);
        tp_value_free(args);
    }
    if (mine) { /* the owner's own handle outlives its worker, answering from memory */
        const tp_value *lv = NULL;
        CHECK_STATUS(tp_rref_local_value(mine, &lv), TP_ESHUTDOWN);
        CHECK(lv == NULL);
        CHECK(tp_rref_is_owner(mine));
    }
    tp_rref_release(mine);
    tp_rref_release(r); /* after shutdown: frees the handle only */
    return conf_finish(rank);
}

static tp_status then_noop(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                           void *user_data) {
    (void)f, (void)result, (void)errmsg, (void)errmsg_len, (void)user_data;
    return TP_OK;
}

/*
 * spec: SHUTDOWN-2 SHUTDOWN-6 FUTURE-5: a non-graceful shutdown while a queued
 * then-callback holds the last reference to a future whose value is a user
 * rref: teardown drops that rref without the protocol and without a crash or
 * a leak (the callback does not run user code any more).
 */
static int shutdown_nongraceful_drops_rref_held_by_callback(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future *f = NULL, *chained = NULL;
        if (CHECK_OK(conf_async(tp_to_rank(1), "rref_make", CONF_INTS(1, 5), &f)) &&
            CHECK_OK(tp_future_wait(f, TP_TIMEOUT_INFINITE))) {
            CHECK(tp_value_kind(tp_future_value(f)) == TP_KIND_RREF);
            CHECK_OK(tp_future_then(f, then_noop, NULL, &chained));
        }
        tp_future_free(f); /* the queued callback now holds the last reference */
        CHECK_OK(tp_shutdown(0));
        if (chained)
            CHECK(tp_future_done(chained));
        tp_future_free(chained);
    } else {
        uint64_t t0 = conf_now_ns();
        while (conf_since_s(t0) < 0.5)
            if (tp_sleep(0.01) != TP_OK)
                break;
        tp_shutdown(0); /* w0 left without a goodbye: a non-graceful end here too */
    }
    return conf_finish(rank);
}

/* spec: SHUTDOWN-2: non-graceful shutdown fails in-flight calls at once with TP_ESHUTDOWN. */
static int shutdown_nongraceful_fails_inflight(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future *f = NULL, *g = NULL;
        tp_rref *r = NULL;
        CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(3000), &f));
        tp_value *args = tp_value_list_of(2, tp_value_int(3000), tp_value_int(1));
        CHECK_OK(tp_remote(tp_to_rank(1), "slow_then_value", args, NULL, TP_TIMEOUT_DEFAULT, &r));
        tp_value_free(args);
        CHECK_OK(conf_async(tp_to_rank(0), "sleep_ms", CONF_INTS(3000), &g)); /* to self */
        CHECK_OK(tp_sleep(0.1)); /* the calls are running on w1 */
        uint64_t t0 = conf_now_ns();
        CHECK_OK(tp_shutdown(0));
        CHECK(conf_since_s(t0) < 1.0);
        if (f) {
            CHECK_STATUS(tp_future_wait(f, TP_TIMEOUT_INFINITE), TP_ESHUTDOWN);
            CHECK(conf_since_s(t0) < 1.0);
            CHECK_CONTAINS(tp_future_error(f), "sleep_ms");
            CHECK_CONTAINS(tp_future_error(f), "shut down");
        }
        if (g)
            CHECK_STATUS(tp_future_wait(g, TP_TIMEOUT_INFINITE), TP_ESHUTDOWN);
        if (r) {
            tp_value *v = NULL;
            CHECK(tp_rref_to_here(r, 1.0, &v) != TP_OK);
            tp_value_free(v);
        }
        tp_value *res = NULL;
        tp_status st = conf_sync(tp_to_rank(1), "add", CONF_INTS(1, 1), &res);
        CHECK(st == TP_ESHUTDOWN || st == TP_ENOTINIT);
        tp_value_free(res);
        tp_future_free(f);
        tp_future_free(g);
        tp_rref_release(r);
    } else {
        /* Wait until w0's sleep_ms runs here, then leave as abruptly. */
        uint64_t t0 = conf_now_ns();
        while (conf_started(rank) < 1 && conf_since_s(t0) < 10.0)
            if (tp_sleep(0.01) != TP_OK)
                break;
        CHECK_INT(conf_started(rank), 1);
        CHECK_OK(tp_sleep(0.3));
        CHECK_OK(tp_shutdown(0));
        CHECK(conf_since_s(t0) < 5.0); /* running functions did not hold shutdown for long */
    }
    return conf_finish(rank);
}

/* spec: SHUTDOWN-1: tp_shutdown from a served function is TP_EINVAL and changes nothing. */
static int shutdown_from_function_rejected(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "try_shutdown", CONF_INTS(1), -1), TP_EINVAL);
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "try_shutdown", CONF_INTS(0), -1), TP_EINVAL);
        CHECK_INT(conf_sync_int(rank, tp_to_rank(0), "try_shutdown", CONF_INTS(0), -1), TP_EINVAL);
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(1, 2), -1), 3);
        tp_value *res = NULL; /* tell w1 (its hop counter) that we are done */
        CHECK_OK(conf_sync(tp_to_rank(1), "ff_hop", CONF_INTS(0, 0), &res));
        tp_value_free(res);
    } else {
        /* Stay RUNNING (not in our own shutdown) until w0 has tried. */
        uint64_t t0 = conf_now_ns();
        while (conf_hops(rank) < 1 && conf_since_s(t0) < 10.0)
            if (tp_sleep(0.01) != TP_OK)
                break;
        CHECK_INT(conf_hops(rank), 1);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/*
 * A then-callback that first waits (nothing of its worker is in flight
 * meanwhile: only the queued-or-running callback itself counts for the
 * drain, FUTURE-5), then makes a call to w1 and returns its result. Its
 * outcome goes to the calling process's statics (rank 0's only).
 */
#define THEN_WAIT_S 0.3
#define THEN_CALL_MS 100
static _Atomic int then_call_status;
static _Atomic int64_t then_call_value;

static tp_status then_wait_then_call(tp_future *f, tp_value **result, char *errmsg,
                                     size_t errmsg_len, void *user_data) {
    (void)f, (void)user_data;
    tp_status st = tp_sleep(THEN_WAIT_S);
    tp_value *res = NULL;
    if (st == TP_OK) {
        tp_value *args = CONF_INTS(THEN_CALL_MS);
        st = tp_rpc_sync(tp_to_rank(1), "sleep_ms", args, NULL, TP_TIMEOUT_DEFAULT, &res);
        tp_value_free(args);
    }
    int64_t v = -1;
    if (st == TP_OK && tp_value_get_int(res, &v) == TP_OK)
        atomic_store(&then_call_value, v);
    atomic_store(&then_call_status, (int)st);
    if (st != TP_OK) {
        snprintf(errmsg, errmsg_len, "then-callback's call: %s", tp_errmsg());
        tp_value_free(res);
        return st;
    }
    *result = res;
    return TP_OK;
}

/*
 * spec: SHUTDOWN-5 FUTURE-5: a then-callback queued before shutdown counts
 * as an active client call until it returns, so the drain waits for the
 * call it makes (issued well after the drain began, while nothing else of
 * this worker is in flight); that call runs on w1 before w1's shutdown ends.
 */
static int shutdown_graceful_waits_for_then_callback_call(int rank, int ws) {
    if (rank == 0) {
        atomic_store(&then_call_status, -1);
        atomic_store(&then_call_value, -1);
    }
    CONF_INIT_OR_RETURN(rank, ws);
    tp_future *chained = NULL;
    uint64_t t0 = conf_now_ns();
    if (rank == 0) {
        tp_future *f = NULL;
        if (CHECK_OK(conf_async(tp_to_rank(1), "add", CONF_INTS(1, 2), &f)) &&
            CHECK_OK(tp_future_wait(f, TP_TIMEOUT_DEFAULT)))
            CHECK_OK(tp_future_then(f, then_wait_then_call, NULL, &chained)); /* queued now */
        tp_future_free(f);
    }
    CHECK_OK(tp_shutdown(1));
    if (rank == 0) {
        CHECK(conf_since_s(t0) >= THEN_WAIT_S); /* it waited for the callback */
        CHECK_STATUS((tp_status)atomic_load(&then_call_status), TP_OK);
        CHECK_INT(atomic_load(&then_call_value), THEN_CALL_MS);
        if (CHECK(chained != NULL) && CHECK(tp_future_done(chained))) {
            CHECK_OK(tp_future_status(chained));
            CHECK_INT(conf_int_of(rank, tp_future_value(chained), -1), THEN_CALL_MS);
        }
    } else {
        CHECK_INT(conf_served(rank), 1); /* served before this worker's drain ended */
    }
    tp_future_free(chained);
    return conf_finish(rank);
}

static _Atomic int queued_cb_ran;

static tp_status then_mark_ran(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                               void *user_data) {
    (void)f, (void)result, (void)errmsg, (void)errmsg_len, (void)user_data;
    atomic_store(&queued_cb_ran, 1);
    return TP_OK;
}

static void done_mark_ran(tp_future *f, void *user_data) {
    (void)f, (void)user_data;
    atomic_store(&queued_cb_ran, 1);
}

/*
 * spec: SHUTDOWN-2 FUTURE-5: at a non-graceful shutdown, a then-callback
 * (and a done-callback) queued behind the worker's only pool thread, busy
 * with a long call to itself, never runs; its chained future fails with
 * TP_ESHUTDOWN "then-callback not run".
 */
static int shutdown_nongraceful_skips_queued_callback(int rank, int ws) {
    atomic_store(&queued_cb_ran, 0);
    tp_options *o = conf_options();
    tp_status st = tp_options_set_num_worker_threads(o, 1);
    if (st == TP_OK)
        st = conf_init_opts(rank, ws, o);
    tp_options_free(o);
    if (!CHECK_OK(st))
        return conf_finish(rank);
    tp_future *busy = NULL, *p = NULL, *chained = NULL;
    /* The only pool thread runs sleep_ms for 20 s (teardown wakes it). */
    CHECK_OK(conf_async(tp_to_rank(0), "sleep_ms", CONF_INTS(20000), &busy));
    uint64_t t0 = conf_now_ns();
    while (conf_started(rank) < 1 && conf_since_s(t0) < 10.0)
        if (tp_sleep(0.005) != TP_OK)
            break;
    CHECK_INT(conf_started(rank), 1);
    if (CHECK_OK(tp_future_new(&p)) && CHECK_OK(tp_future_set_result(p, tp_value_int(7)))) {
        CHECK_OK(tp_future_then(p, then_mark_ran, NULL, &chained)); /* queued: the pool is busy */
        CHECK_OK(tp_future_add_done_callback(p, done_mark_ran, NULL));
    }
    CHECK(chained && !tp_future_done(chained));
    /* A user future still pending, with a then-callback: failed by the
     * shutdown before the pool stops, so its callback is not run for that
     * reason (FUTURE-5), not for a hand-off the stopped pool refused. */
    tp_future *u = NULL, *uch = NULL;
    if (CHECK_OK(tp_future_new(&u)))
        CHECK_OK(tp_future_then(u, then_mark_ran, NULL, &uch));
    t0 = conf_now_ns();
    CHECK_OK(tp_shutdown(0));
    CHECK(conf_since_s(t0) < 10.0); /* the busy call was woken, not waited out */
    CHECK_INT(atomic_load(&queued_cb_ran), 0);
    if (chained && CHECK(tp_future_done(chained))) {
        CHECK_STATUS(tp_future_status(chained), TP_ESHUTDOWN);
        CHECK_CONTAINS(tp_future_error(chained), "not run");
    }
    if (busy && CHECK(tp_future_done(busy)))
        CHECK_STATUS(tp_future_status(busy), TP_ESHUTDOWN);
    if (uch && CHECK(tp_future_done(uch))) {
        CHECK_STATUS(tp_future_status(uch), TP_ESHUTDOWN);
        CHECK_CONTAINS(tp_future_error(uch), "then-callback not run: the worker is shutting down");
    }
    tp_future_free(u);
    tp_future_free(uch);
    tp_future_free(busy);
    tp_future_free(p);
    tp_future_free(chained);
    return conf_finish(rank);
}

#define LEARN_SHUTDOWN_TIMEOUT_S 30.0

/*
 * spec: SHUTDOWN-3 SHUTDOWN-8: w3 leaves at once without a goodbye (a
 * non-graceful shutdown, so it never arrives at the barrier): only its ring
 * neighbours of init's warm-up, w0 and w2, were ever connected to it and see
 * it go (peer-down TP_EPEERDOWN); w1 never talks to it. (A crash would not
 * do: the simulator tells every worker of a killed host.) w1's barrier learns
 * of the death from the dead/3 key the others write at their shutdown and
 * ends promptly with TP_EPEERDOWN naming w3, not at its 30 s deadline.
 */
static int shutdown_barrier_learns_death_from_store(int rank, int ws) {
    tp_options *o = conf_options();
    tp_status st = tp_options_set_shutdown_timeout(o, LEARN_SHUTDOWN_TIMEOUT_S);
    if (st == TP_OK)
        st = conf_init_opts(rank, ws, o);
    tp_options_free(o);
    if (!CHECK_OK(st))
        return conf_finish(rank);
    if (rank == 3) {
        CHECK_OK(tp_shutdown(0));
        return conf_finish(rank);
    }
    if (rank != 1) {
        /* Until this worker knows w3 is dead (a call fails before sending). */
        uint64_t t0 = conf_now_ns();
        tp_status cst = TP_OK;
        while (conf_since_s(t0) < 10.0) {
            tp_value *args = CONF_INTS(1, 1), *res = NULL;
            cst = tp_rpc_sync(tp_to_rank(3), "add", args, NULL, 1.0, &res);
            tp_value_free(args);
            tp_value_free(res);
            if (cst == TP_EPEERDOWN && strstr(tp_errmsg(), "the worker is down"))
                break;
            if (tp_sleep(0.01) != TP_OK)
                break;
        }
        CHECK_STATUS(cst, TP_EPEERDOWN);
    }
    uint64_t t0 = conf_now_ns();
    st = tp_shutdown(1);
    double took = conf_since_s(t0);
    CHECK_STATUS(st, TP_EPEERDOWN);
    CHECK_CONTAINS(tp_errmsg(), "'w3' (id 3)");
    CHECK_CONTAINS(tp_errmsg(), "shutdown drain: "); /* rank 0's leave does not say it again */
    if (!CHECK(took < LEARN_SHUTDOWN_TIMEOUT_S / 3))
        conf_fail(rank, __FILE__, __LINE__, "shutdown took %.3f s of its %.0f s deadline", took,
                  LEARN_SHUTDOWN_TIMEOUT_S);
    return conf_finish(rank);
}

/*
 * spec: SHUTDOWN-9 SHUTDOWN-5: rank 0 ends its process right after its
 * graceful shutdown (crash_self: no exit handlers, as a forked child ends;
 * on TCP with the tcp:// store the store goes with it, TCP-11) while w1 is
 * still a round behind in the drain: w0's slow call made w1 wait long for
 * w0's first round, so w1 polls the later rounds with a long pause. w1 must
 * still finish its drain with TP_OK: w0 waits for w1's sd/left first.
 */
static int shutdown_rank0_exits_right_after(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future *f = NULL;
        CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(300), &f));
        tp_future_free(f); /* w0's drain waits for it before it publishes round 0 */
    }
    CHECK_OK(tp_shutdown(1));
    if (rank == 1)
        CHECK_INT(conf_served(rank), 1);
    int failures = conf_finish(rank);
    if (rank == 0 && failures == 0)
        conf_crash_self(); /* its report would be lost: only when it has none */
    return failures;
}

const tp_conformance_case conf_cases_shutdown[] = {
    {"shutdown_graceful_uneven_load_dropped", 3, shutdown_graceful_uneven_load_dropped,
     "SHUTDOWN-3 SHUTDOWN-5 FUTURE-4"},
    {"shutdown_graceful_uneven_load_kept", 3, shutdown_graceful_uneven_load_kept,
     "SHUTDOWN-3 SHUTDOWN-5"},
    {"shutdown_graceful_drains_ff_chain", 3, shutdown_graceful_drains_ff_chain,
     "SHUTDOWN-5 FUNC-4"},
    {"shutdown_barrier_keeps_serving", 3, shutdown_barrier_keeps_serving, "SHUTDOWN-3 INIT-1"},
    {"shutdown_graceful_releases_rrefs", 2, shutdown_graceful_releases_rrefs,
     "SHUTDOWN-4 RREF-11 RREF-18"},
    {"shutdown_nongraceful_drops_rref_held_by_callback", 2,
     shutdown_nongraceful_drops_rref_held_by_callback, "SHUTDOWN-2 SHUTDOWN-6 FUTURE-5"},
    {"shutdown_nongraceful_fails_inflight", 2, shutdown_nongraceful_fails_inflight, "SHUTDOWN-2"},
    {"shutdown_from_function_rejected", 2, shutdown_from_function_rejected, "SHUTDOWN-1"},
    {"shutdown_graceful_waits_for_then_callback_call", 2,
     shutdown_graceful_waits_for_then_callback_call, "SHUTDOWN-5 FUTURE-5"},
    {"shutdown_nongraceful_skips_queued_callback", 1, shutdown_nongraceful_skips_queued_callback,
     "SHUTDOWN-2 FUTURE-5"},
    {"shutdown_barrier_learns_death_from_store", 4, shutdown_barrier_learns_death_from_store,
     "SHUTDOWN-3 SHUTDOWN-8"},
    {"shutdown_rank0_exits_right_after", 2, shutdown_rank0_exits_right_after,
     "SHUTDOWN-9 SHUTDOWN-5"},
};
const size_t conf_cases_shutdown_count = sizeof conf_cases_shutdown / sizeof conf_cases_shutdown[0];
