/*
 * cases_futures.c: future accessors, waits with their own timeout, then()
 * continuations and wait_all.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

/* spec: FUTURE-1 FUTURE-2 FUTURE-3: accessors before and after completion; take moves. */
static int futures_accessors(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future *f = NULL;
        tp_value *args = tp_value_list_of(2, tp_value_int(100), tp_value_int(7));
        if (CHECK_OK(conf_async(tp_to_rank(1), "slow_then_value", args, &f))) {
            CHECK(!tp_future_done(f));
            CHECK_STATUS(tp_future_status(f), TP_EINVAL);
            CHECK(tp_future_value(f) == NULL);
            CHECK_OK(tp_future_wait(f, TP_TIMEOUT_INFINITE));
            CHECK(tp_future_done(f));
            CHECK_OK(tp_future_status(f));
            CHECK_INT(conf_int_of(rank, tp_future_value(f), -1), 7);
            CHECK(tp_future_error(f) && tp_future_error(f)[0] == '\0');
            tp_value *v = tp_future_take_value(f);
            CHECK_INT(conf_int_of(rank, v, -1), 7);
            tp_value_free(v);
            CHECK(tp_future_take_value(f) == NULL);
            CHECK(tp_future_value(f) == NULL);
            CHECK_OK(tp_future_status(f));     /* taking the value leaves the status */
            CHECK_OK(tp_future_wait(f, 0.01)); /* waiting again on a done future */
        }
        tp_future_free(f);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUTURE-2 FUTURE-3 CALL-6: a failed future keeps its status and message, no value. */
static int futures_failed_accessors(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future *f = NULL;
        if (CHECK_OK(conf_async(tp_to_rank(1), "boom", NULL, &f))) {
            CHECK_STATUS(tp_future_wait(f, TP_TIMEOUT_INFINITE), TP_EREMOTE);
            CHECK(tp_future_done(f));
            CHECK_STATUS(tp_future_status(f), TP_EREMOTE);
            CHECK(tp_future_value(f) == NULL);
            CHECK(tp_future_take_value(f) == NULL);
            CHECK_CONTAINS(tp_future_error(f), "boom: deliberate failure");
            CHECK_STATUS(tp_future_wait(f, 0.01), TP_EREMOTE);
        }
        tp_future_free(f);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUTURE-2: a wait's own timeout leaves the future pending and usable. */
static int futures_wait_timeout_leaves_pending(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future *f = NULL;
        if (CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(500), &f))) {
            uint64_t t0 = conf_now_ns();
            CHECK_STATUS(tp_future_wait(f, 0.05), TP_ETIMEDOUT);
            CHECK_CONTAINS(tp_errmsg(), "timed out");
            double waited = conf_since_s(t0);
            CHECK(waited >= 0.04 && waited < 0.4);
            CHECK(!tp_future_done(f));
            CHECK_OK(tp_future_wait(f, TP_TIMEOUT_INFINITE));
            CHECK_INT(conf_int_of(rank, tp_future_value(f), -1), 500);
        }
        tp_future_free(f);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

typedef struct then_state {
    atomic_int calls;
    atomic_int seen_status;
} then_state;

/* Multiplies an int value by ten. */
static tp_status cb_times_ten(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                              void *user_data) {
    then_state *s = user_data;
    atomic_fetch_add(&s->calls, 1);
    atomic_store(&s->seen_status, (int)tp_future_status(f));
    int64_t x;
    if (tp_value_get_int(tp_future_value(f), &x) != TP_OK) {
        snprintf(errmsg, errmsg_len, "cb_times_ten: no int value (%s)", tp_future_error(f));
        return TP_ETYPE;
    }
    *result = tp_value_int(x * 10);
    return TP_OK;
}

/* Passes the antecedent's error on, prefixed. */
static tp_status cb_propagate(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                              void *user_data) {
    then_state *s = user_data;
    atomic_fetch_add(&s->calls, 1);
    atomic_store(&s->seen_status, (int)tp_future_status(f));
    if (tp_future_status(f) == TP_OK) {
        *result = tp_value_clone(tp_future_value(f));
        return TP_OK;
    }
    snprintf(errmsg, errmsg_len, "propagated: %s", tp_future_error(f));
    return tp_future_status(f);
}

/* Fails on its own, whatever the antecedent did. */
static tp_status cb_refuse(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                           void *user_data) {
    (void)f, (void)result;
    then_state *s = user_data;
    atomic_fetch_add(&s->calls, 1);
    snprintf(errmsg, errmsg_len, "callback says no");
    return TP_ERANGE;
}

/* spec: FUTURE-5: then() runs once with the value and completes the chained future. */
static int futures_then_value(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        then_state s1 = {0}, s2 = {0};
        tp_future *f = NULL, *chained = NULL, *chained2 = NULL;
        if (CHECK_OK(conf_async(tp_to_rank(1), "add", CONF_INTS(2, 3), &f)) &&
            CHECK_OK(tp_future_then(f, cb_times_ten, &s1, &chained))) {
            CHECK_OK(tp_future_wait(chained, TP_TIMEOUT_INFINITE));
            CHECK_INT(conf_int_of(rank, tp_future_value(chained), -1), 50);
            CHECK_INT(atomic_load(&s1.calls), 1);
            CHECK_STATUS((tp_status)atomic_load(&s1.seen_status), TP_OK);
            /* The antecedent keeps its own value. */
            CHECK_INT(conf_int_of(rank, tp_future_value(f), -1), 5);
            /* then() on a completed future still runs the callback, and chains. */
            if (CHECK_OK(tp_future_then(chained, cb_times_ten, &s2, &chained2))) {
                CHECK_OK(tp_future_wait(chained2, TP_TIMEOUT_INFINITE));
                CHECK_INT(conf_int_of(rank, tp_future_value(chained2), -1), 500);
                CHECK_INT(atomic_load(&s2.calls), 1);
            }
        }
        tp_future_free(chained2);
        tp_future_free(chained);
        tp_future_free(f);
        CHECK_INT(atomic_load(&s1.calls), 1);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUTURE-5: an error reaches the callback, which can pass it on. */
static int futures_then_error_propagates(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        then_state s = {0};
        tp_future *f = NULL, *chained = NULL;
        if (CHECK_OK(conf_async(tp_to_rank(1), "boom", NULL, &f)) &&
            CHECK_OK(tp_future_then(f, cb_propagate, &s, &chained))) {
            CHECK_STATUS(tp_future_wait(chained, TP_TIMEOUT_INFINITE), TP_EREMOTE);
            CHECK_CONTAINS(tp_future_error(chained), "propagated: ");
            CHECK_CONTAINS(tp_future_error(chained), "boom: deliberate failure");
            CHECK(tp_future_value(chained) == NULL);
            CHECK_INT(atomic_load(&s.calls), 1);
            CHECK_STATUS((tp_status)atomic_load(&s.seen_status), TP_EREMOTE);
        }
        tp_future_free(chained);
        tp_future_free(f);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUTURE-5: a callback's own failure completes the chained future with it. */
static int futures_then_callback_error(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        then_state s = {0}, s2 = {0};
        tp_future *f = NULL, *chained = NULL, *chained2 = NULL;
        if (CHECK_OK(conf_async(tp_to_rank(1), "add", CONF_INTS(1, 1), &f)) &&
            CHECK_OK(tp_future_then(f, cb_refuse, &s, &chained))) {
            CHECK_STATUS(tp_future_wait(chained, TP_TIMEOUT_INFINITE), TP_ERANGE);
            CHECK_CONTAINS(tp_future_error(chained), "callback says no");
            CHECK_OK(tp_future_status(f)); /* the antecedent is unaffected */
            CHECK_INT(atomic_load(&s.calls), 1);
            /* A second link sees the first callback's failure. */
            if (CHECK_OK(tp_future_then(chained, cb_propagate, &s2, &chained2))) {
                CHECK_STATUS(tp_future_wait(chained2, TP_TIMEOUT_INFINITE), TP_ERANGE);
                CHECK_CONTAINS(tp_future_error(chained2), "callback says no");
                CHECK_STATUS((tp_status)atomic_load(&s2.seen_status), TP_ERANGE);
            }
        }
        tp_future_free(chained2);
        tp_future_free(chained);
        tp_future_free(f);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUTURE-5 FUTURE-6: wait_all succeeds when every future does. */
static int futures_wait_all_ok(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future *fs[10] = {0};
        size_t n = 0;
        for (int i = 0; i < 10; i++)
            if (CHECK_OK(conf_async(tp_to_rank(1 + i % 2), "slow_then_value",
                                    CONF_INTS(10 * (10 - i), i), &fs[n])))
                n++;
        size_t failed = 12345;
        CHECK_OK(tp_future_wait_all(fs, n, TP_TIMEOUT_INFINITE, &failed));
        CHECK_INT(failed, n); /* on TP_OK, *failed_index is n */
        for (size_t i = 0; i < n; i++) {
            CHECK(tp_future_done(fs[i]));
            CHECK_INT(conf_int_of(rank, tp_future_value(fs[i]), -1), (int64_t)i);
            tp_future_free(fs[i]);
        }
        CHECK_OK(tp_future_wait_all(NULL, 0, 0.01, NULL)); /* nothing to wait for */
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUTURE-6 SHUTDOWN-5: the first failure wins at once, without waiting for the slow rest. */
static int futures_wait_all_first_error_wins(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future *fs[4] = {0};
        CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(1000), &fs[0]));
        CHECK_OK(conf_async(tp_to_rank(2), "sleep_ms", CONF_INTS(1000), &fs[1]));
        CHECK_OK(conf_async(tp_to_rank(2), "boom", NULL, &fs[2]));
        CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(1000), &fs[3]));
        if (fs[0] && fs[1] && fs[2] && fs[3]) {
            size_t failed = 99;
            uint64_t t0 = conf_now_ns();
            CHECK_STATUS(tp_future_wait_all(fs, 4, TP_TIMEOUT_INFINITE, &failed), TP_EREMOTE);
            double took = conf_since_s(t0);
            if (!CHECK(took < 0.5))
                conf_fail(rank, __FILE__, __LINE__, "wait_all took %.3f s", took);
            CHECK_INT(failed, 2);
            CHECK(!tp_future_done(fs[0]) && !tp_future_done(fs[3]));
        }
        for (int i = 0; i < 4; i++)
            tp_future_free(fs[i]); /* the slow calls go on; shutdown drains them */
    }
    CHECK_OK(tp_shutdown(1));
    if (rank == 1)
        CHECK_INT(conf_served(rank), 2);
    return conf_finish(rank);
}

/* spec: FUTURE-2 FUTURE-6: wait_all's own timeout fires while calls are pending. */
static int futures_wait_all_timeout(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future *fs[2] = {0};
        CHECK_OK(conf_async(tp_to_rank(1), "add", CONF_INTS(1, 2), &fs[0]));
        CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(800), &fs[1]));
        if (fs[0] && fs[1]) {
            uint64_t t0 = conf_now_ns();
            size_t pending = 99;
            CHECK_OK(tp_future_wait(fs[0], TP_TIMEOUT_INFINITE));
            CHECK_STATUS(tp_future_wait_all(fs, 2, 0.1, &pending), TP_ETIMEDOUT);
            CHECK_INT(pending, 1); /* the lowest index still pending */
            CHECK(conf_since_s(t0) < 0.6);
            CHECK(!tp_future_done(fs[1]));
            CHECK_OK(tp_future_wait_all(fs, 2, TP_TIMEOUT_INFINITE, NULL));
            CHECK_INT(conf_int_of(rank, tp_future_value(fs[1]), -1), 800);
        }
        tp_future_free(fs[0]);
        tp_future_free(fs[1]);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUTURE-4: freeing a pending future drops only the reference; the call goes on. */
static int futures_free_pending_call_goes_on(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future *f = NULL;
        CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(100), &f));
        tp_future_free(f);
        tp_future_free(NULL);
        CHECK_INT(conf_poll_int(rank, tp_to_rank(1), "served", 1, 5.0), 1);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

const tp_conformance_case conf_cases_futures[] = {
    {"futures_accessors", 2, futures_accessors, "FUTURE-1 FUTURE-2 FUTURE-3"},
    {"futures_failed_accessors", 2, futures_failed_accessors, "FUTURE-2 FUTURE-3 CALL-6"},
    {"futures_wait_timeout_leaves_pending", 2, futures_wait_timeout_leaves_pending, "FUTURE-2"},
    {"futures_then_value", 2, futures_then_value, "FUTURE-5"},
    {"futures_then_error_propagates", 2, futures_then_error_propagates, "FUTURE-5"},
    {"futures_then_callback_error", 2, futures_then_callback_error, "FUTURE-5"},
    {"futures_wait_all_ok", 3, futures_wait_all_ok, "FUTURE-5 FUTURE-6"},
    {"futures_wait_all_first_error_wins", 3, futures_wait_all_first_error_wins,
     "FUTURE-6 SHUTDOWN-5"},
    {"futures_wait_all_timeout", 2, futures_wait_all_timeout, "FUTURE-2 FUTURE-6"},
    {"futures_free_pending_call_goes_on", 2, futures_free_pending_call_goes_on, "FUTURE-4"},
};
const size_t conf_cases_futures_count = sizeof conf_cases_futures / sizeof conf_cases_futures[0];
