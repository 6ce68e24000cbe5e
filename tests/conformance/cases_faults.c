/*
 * cases_faults.c: a worker dies abruptly (the launcher's crash_self: the
 * simulator's host kill, SIGKILL for processes). Calls in flight to it fail
 * promptly, well under their timeout; later calls fail at once; the
 * survivors shut down.
 *
 * The dying rank waits until a call from a peer is running on it (its own
 * sleep_ms "started" counter), so the call is truly in flight when it dies;
 * after crash_self it frees its memory and returns 0 without the API.
 */
#include <stdio.h>
#include <stdlib.h>

#include "conformance.h"

#define CALL_TIMEOUT_S 30.0 /* far above every bound checked below */
#define PROMPT_S 3.0        /* "promptly": a tenth of the timeout */

/* Init with a long call timeout and a short shutdown phase deadline. */
static tp_status init_for_faults(int rank, int ws) {
    tp_options *o = conf_options();
    tp_status st = tp_options_set_rpc_timeout(o, CALL_TIMEOUT_S);
    if (st == TP_OK)
        st = tp_options_set_shutdown_timeout(o, 3.0);
    if (st == TP_OK)
        st = conf_init_opts(rank, ws, o);
    tp_options_free(o);
    return st;
}

/* The dying rank: wait for a peer's call to run here, then die. */
static int die_when_called(int rank) {
    uint64_t t0 = conf_now_ns();
    while (conf_started(rank) < 1 && conf_since_s(t0) < 10.0)
        if (tp_sleep(0.01) != TP_OK)
            break;
    CHECK_INT(conf_started(rank), 1);
    int failures = conf_finish(rank);
    conf_crash_self();
    return failures; /* only on launchers whose crash_self returns */
}

/*
 * Survivors shut down gracefully; the dead worker counts as arrived and is
 * left out of the drain (SHUTDOWN-8), so the barrier does not wait for it. A
 * survivor that saw the death gets TP_EPEERDOWN naming it (SHUTDOWN-7); the
 * others may too (through the store's dead key) or get TP_OK.
 */
static void survivor_shutdown(int rank, const char *dead, int saw_death) {
    char label[64]; /* the worker label of api.md: 'w2' (id 2) */
    snprintf(label, sizeof label, "'%s' (id %c)", dead, dead[1]);
    uint64_t t0 = conf_now_ns();
    tp_status st = tp_shutdown(1);
    if (saw_death || st != TP_OK) {
        CHECK_STATUS(st, TP_EPEERDOWN);
        CHECK_CONTAINS(tp_errmsg(), label);
    }
    CHECK(conf_since_s(t0) < 2.5); /* no phase waited out its 3 s deadline */
    CHECK(!tp_is_initialized());
}

/* spec: FUTURE-7 SHUTDOWN-8: in-flight calls to a dying worker fail promptly, naming it. */
static int faults_crash_fails_inflight_promptly(int rank, int ws) {
    if (!CHECK_OK(init_for_faults(rank, ws)))
        return conf_finish(rank);
    if (rank == 2)
        return die_when_called(rank);
    if (rank == 0) {
        tp_future *f = NULL;
        uint64_t t0 = conf_now_ns();
        if (CHECK_OK(conf_async(tp_to_rank(2), "sleep_ms", CONF_INTS(20000), &f))) {
            tp_status st = tp_future_wait(f, TP_TIMEOUT_INFINITE);
            double took = conf_since_s(t0);
            CHECK_STATUS(st, TP_EPEERDOWN);
            if (!CHECK(took < PROMPT_S))
                conf_fail(rank, __FILE__, __LINE__, "failed after %.3f s", took);
            CHECK_CONTAINS(tp_future_error(f), "'w2' (id 2)");
            CHECK_CONTAINS(tp_future_error(f), "sleep_ms");
        }
        tp_future_free(f);
        /* Later calls to it fail at once. */
        tp_value *res = NULL;
        uint64_t t1 = conf_now_ns();
        CHECK_STATUS(conf_sync(tp_to_rank(2), "add", CONF_INTS(1, 1), &res), TP_EPEERDOWN);
        CHECK(conf_since_s(t1) < 0.5);
        CHECK_CONTAINS(tp_errmsg(), "w2");
        tp_value_free(res);
        /* The others are fine. */
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(1, 2), -1), 3);
    }
    survivor_shutdown(rank, "w2", rank == 0);
    return conf_finish(rank);
}

/* spec: FUTURE-7 CALL-9 SHUTDOWN-8: a synchronous call to a worker that dies fails promptly. */
static int faults_crash_during_sync_call(int rank, int ws) {
    if (!CHECK_OK(init_for_faults(rank, ws)))
        return conf_finish(rank);
    if (rank == 1)
        return die_when_called(rank);
    tp_value *res = NULL;
    uint64_t t0 = conf_now_ns();
    tp_status st = conf_sync(tp_to_rank(1), "sleep_ms", CONF_INTS(20000), &res);
    CHECK_STATUS(st, TP_EPEERDOWN);
    CHECK(conf_since_s(t0) < PROMPT_S);
    CHECK_CONTAINS(tp_errmsg(), "'w1' (id 1)");
    CHECK_CONTAINS(tp_errmsg(), "sleep_ms");
    tp_value_free(res);
    survivor_shutdown(rank, "w1", 1);
    return conf_finish(rank);
}

/* spec: RREF-12 FUTURE-7: to_here on an rref whose owner died fails promptly. */
static int faults_crash_rref_owner(int rank, int ws) {
    if (!CHECK_OK(init_for_faults(rank, ws)))
        return conf_finish(rank);
    if (rank == 1)
        return die_when_called(rank);
    tp_rref *r = NULL;
    tp_value *args = CONF_INTS(5);
    if (CHECK_OK(tp_remote(tp_to_rank(1), "echo", args, NULL, TP_TIMEOUT_DEFAULT, &r))) {
        tp_value *v = NULL;
        if (CHECK_OK(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v)))
            CHECK_INT(conf_int_of(rank, v, -1), 5);
        tp_value_free(v);
        v = NULL;
        tp_future *f = NULL;
        CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(20000), &f)); /* w1 dies now */
        if (f)
            CHECK(tp_future_wait(f, TP_TIMEOUT_INFINITE) != TP_OK);
        tp_future_free(f);
        uint64_t t0 = conf_now_ns();
        CHECK_STATUS(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v), TP_EPEERDOWN);
        CHECK(conf_since_s(t0) < 0.5); /* at once: the user rref is failed */
        CHECK_CONTAINS(tp_errmsg(), "w1");
        tp_value_free(v);
    }
    tp_value_free(args);
    tp_rref_release(r); /* sends nothing to the dead owner */
    survivor_shutdown(rank, "w1", 1);
    return conf_finish(rank);
}

/* spec: FUTURE-7 SHUTDOWN-8: a worker that never talked to the dead one also fails fast when it
 * tries. */
static int faults_crash_unconnected_peer_fails_fast(int rank, int ws) {
    if (!CHECK_OK(init_for_faults(rank, ws)))
        return conf_finish(rank);
    if (rank == 2)
        return die_when_called(rank);
    if (rank == 0) {
        tp_future *f = NULL;
        CHECK_OK(conf_async(tp_to_rank(2), "sleep_ms", CONF_INTS(20000), &f));
        if (f)
            CHECK(tp_future_wait(f, TP_TIMEOUT_INFINITE) != TP_OK);
        tp_future_free(f);
        /* Tell w1 (through its hop counter) that w2 is gone. */
        tp_value *res = NULL;
        CHECK_OK(conf_sync(tp_to_rank(1), "ff_hop", CONF_INTS(0, 0), &res));
        tp_value_free(res);
    } else {
        uint64_t t0 = conf_now_ns();
        while (conf_hops(rank) < 1 && conf_since_s(t0) < 10.0)
            if (tp_sleep(0.01) != TP_OK)
                break;
        CHECK_INT(conf_hops(rank), 1);
        tp_value *res = NULL;
        uint64_t t1 = conf_now_ns();
        tp_status st = conf_sync(tp_to_rank(2), "add", CONF_INTS(1, 1), &res);
        if (!CHECK(st == TP_EPEERDOWN || st == TP_EIO))
            conf_fail(rank, __FILE__, __LINE__, "call to the dead worker gave %s",
                      tp_status_name(st));
        CHECK(conf_since_s(t1) < PROMPT_S);
        CHECK_CONTAINS(tp_errmsg(), "w2");
        tp_value_free(res);
    }
    survivor_shutdown(rank, "w2", rank == 0);
    return conf_finish(rank);
}

/* spec: RREF-12 FUTURE-7: the owner forgets the fetch of a user that died
 * while it waited for a value not yet made, and answers the others: w0's
 * remote() on w1 runs 1 s; w2 asks for the value (rref_fetch) and dies
 * 0.3 s in; w0's own fetch then gets the value, w2's call fails naming it,
 * and w1 goes on serving. */
static int faults_crash_waiting_fetcher(int rank, int ws) {
    if (!CHECK_OK(init_for_faults(rank, ws)))
        return conf_finish(rank);
    if (rank == 2) {
        tp_sleep(0.3); /* w0's rref_fetch is running here, its fetch waiting at w1 */
        int failures = conf_finish(rank);
        conf_crash_self();
        return failures;
    }
    if (rank == 0) {
        tp_rref *r = NULL;
        tp_value *ms = CONF_INTS(1000);
        tp_future *f = NULL;
        if (CHECK_OK(tp_remote(tp_to_rank(1), "sleep_ms", ms, NULL, TP_TIMEOUT_DEFAULT, &r))) {
            CHECK_OK(
                conf_async(tp_to_rank(2), "rref_fetch", tp_value_list_of(1, tp_value_rref(r)), &f));
            tp_value *v = NULL;
            if (CHECK_OK(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v)))
                CHECK_INT(conf_int_of(rank, v, -1), 1000);
            tp_value_free(v);
            if (f) {
                CHECK_STATUS(tp_future_wait(f, TP_TIMEOUT_INFINITE), TP_EPEERDOWN);
                CHECK_CONTAINS(tp_future_error(f), "'w2' (id 2)");
            }
            tp_future_free(f);
            /* The owner is whole: another rref made and fetched there. */
            tp_rref *again = NULL;
            tp_value *v2 = NULL;
            tp_value *five = CONF_INTS(5);
            if (CHECK_OK(
                    tp_remote(tp_to_rank(1), "echo", five, NULL, TP_TIMEOUT_DEFAULT, &again)) &&
                CHECK_OK(tp_rref_to_here(again, TP_TIMEOUT_DEFAULT, &v2)))
                CHECK_INT(conf_int_of(rank, v2, -1), 5);
            tp_value_free(v2);
            tp_value_free(five);
            tp_rref_release(again);
        }
        tp_value_free(ms);
        tp_rref_release(r);
    }
    survivor_shutdown(rank, "w2", rank == 0);
    return conf_finish(rank);
}

const tp_conformance_case conf_cases_faults[] = {
    {"faults_crash_fails_inflight_promptly", 3, faults_crash_fails_inflight_promptly,
     "FUTURE-7 SHUTDOWN-8"},
    {"faults_crash_during_sync_call", 2, faults_crash_during_sync_call,
     "FUTURE-7 CALL-9 SHUTDOWN-8"},
    {"faults_crash_rref_owner", 2, faults_crash_rref_owner, "RREF-12 FUTURE-7"},
    {"faults_crash_unconnected_peer_fails_fast", 3, faults_crash_unconnected_peer_fails_fast,
     "FUTURE-7 SHUTDOWN-8"},
    {"faults_crash_waiting_fetcher", 3, faults_crash_waiting_fetcher, "RREF-12 FUTURE-7"},
};
const size_t conf_cases_faults_count = sizeof conf_cases_faults / sizeof conf_cases_faults[0];
