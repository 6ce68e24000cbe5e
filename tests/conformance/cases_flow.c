/*
 * cases_flow.c: back-pressure (spec/calls.md FLOW-1..4). A worker keeps at
 * most max_inflight_bytes of requests in flight to one destination; a call
 * that would pass it waits inside the API, within its own timeout, and goes
 * out when earlier calls end. The window is set small here (64 KiB) and
 * filled with 40,000-byte sleep_ms calls (sleep_ms reads its first argument
 * and ignores the padding).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "tensorplay/rpc_backend.h"

#define WINDOW ((uint64_t)64 * 1024)
#define PAD 40000 /* one padded call fits the window, two do not */

static tp_status init_with_window(int rank, int ws, uint64_t window) {
    tp_options *o = conf_options();
    tp_status st = tp_options_set_max_inflight_bytes(o, window);
    if (st == TP_OK)
        st = tp_options_set_rpc_timeout(o, 30.0);
    if (st == TP_OK)
        st = tp_options_set_shutdown_timeout(o, 5.0);
    if (st == TP_OK)
        st = conf_init_opts(rank, ws, o);
    tp_options_free(o);
    return st;
}

#define INIT_WINDOW_OR_RETURN(rank, ws, w)                                                         \
    do {                                                                                           \
        if (!CHECK_OK(init_with_window((rank), (ws), (w))))                                        \
            return conf_finish(rank);                                                              \
    } while (0)

/* [ms, bytes[PAD]]: a sleep_ms call padded to PAD bytes. Caller owns. */
static tp_value *padded_sleep(int64_t ms) {
    uint8_t *pad = calloc(1, PAD);
    tp_value *args = pad ? tp_value_list_of(2, tp_value_int(ms), tp_value_bytes(pad, PAD)) : NULL;
    free(pad);
    return args;
}

/* spec: FLOW-1 FLOW-2 OPT-7: a call past the window waits, times out with a
 * message naming the limit, lets small calls by, and goes once room is made. */
static int flow_window_waits_then_times_out(int rank, int ws) {
    INIT_WINDOW_OR_RETURN(rank, ws, WINDOW);
    if (rank == 0) {
        CHECK_INT(tp_options_max_inflight_bytes(NULL), 256 << 20);
        tp_dest w1 = tp_to_rank(1);
        uint64_t t0 = conf_now_ns();
        tp_future *slow = NULL;
        tp_value *args = padded_sleep(1500);
        CHECK_OK(tp_rpc_async(w1, "sleep_ms", args, NULL, TP_TIMEOUT_DEFAULT, &slow));
        tp_value_free(args);
        CHECK(conf_since_s(t0) < 0.5); /* the window was empty: at once */

        /* A second padded call does not fit: rpc_async itself waits, then
         * times out before anything was sent. */
        tp_future *f = NULL;
        args = padded_sleep(1);
        uint64_t t1 = conf_now_ns();
        CHECK_STATUS(tp_rpc_async(w1, "sleep_ms", args, NULL, 0.3, &f), TP_ETIMEDOUT);
        double took = conf_since_s(t1);
        if (!CHECK(took >= 0.29 && took < 1.2))
            conf_fail(rank, __FILE__, __LINE__, "waited %.3f s, want ~0.3 s", took);
        CHECK(f == NULL);
        CHECK_CONTAINS(tp_errmsg(), "'w1' (id 1)");
        CHECK_CONTAINS(tp_errmsg(), "sleep_ms");
        CHECK_CONTAINS(tp_errmsg(), "max_inflight_bytes is 65536");
        CHECK_CONTAINS(tp_errmsg(), "timed out after 300 ms waiting to send");
        tp_value_free(args);

        /* A small call still fits beside the slow one. */
        t1 = conf_now_ns();
        CHECK_INT(conf_sync_int(rank, w1, "add", CONF_INTS(1, 2), -1), 3);
        CHECK(conf_since_s(t1) < 1.0);
        CHECK(!tp_future_done(slow));

        /* With the default timeout it waits for the slow call, then succeeds. */
        tp_value *res = NULL;
        args = padded_sleep(1);
        if (CHECK_OK(tp_rpc_sync(w1, "sleep_ms", args, NULL, TP_TIMEOUT_DEFAULT, &res)))
            CHECK_INT(conf_int_of(rank, res, -1), 1);
        tp_value_free(res);
        tp_value_free(args);
        CHECK(tp_future_done(slow)); /* it went out only after the slow call ended */
        CHECK(conf_since_s(t0) >= 1.4);
        CHECK_OK(tp_future_wait(slow, TP_TIMEOUT_INFINITE));
        tp_future_free(slow);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/*
 * spec: FLOW-2: callers waiting for room go in the order they came, and one
 * that leaves (its deadline) lets the next look at once: the main task
 * waits to send a padded call (0.3 s timeout) behind the slow one; 50 ms
 * later a function on the pool sends a small add (1 s timeout), which
 * would fit but queues behind it. When the padded call gives up, the add
 * goes at once, long before the slow call ends (1.5 s).
 */
static int flow_waiter_that_leaves_wakes_the_next(int rank, int ws) {
    INIT_WINDOW_OR_RETURN(rank, ws, WINDOW);
    if (rank == 0) {
        tp_future *slow = NULL, *later = NULL, *f = NULL;
        tp_value *args = padded_sleep(1500);
        CHECK_OK(tp_rpc_async(tp_to_rank(1), "sleep_ms", args, NULL, TP_TIMEOUT_DEFAULT, &slow));
        tp_value_free(args);
        CHECK_OK(conf_async(tp_to_rank(0), "later_add", CONF_INTS(1, 50, 1000), &later));
        args = padded_sleep(1);
        CHECK_STATUS(tp_rpc_async(tp_to_rank(1), "sleep_ms", args, NULL, 0.3, &f), TP_ETIMEDOUT);
        tp_value_free(args);
        if (later && CHECK_OK(tp_future_wait(later, 10.0))) {
            const tp_value *r = tp_future_value(later);
            int64_t st = conf_int_of(rank, tp_list_get(r, 0), -1);
            int64_t took = conf_int_of(rank, tp_list_get(r, 1), -1);
            if (!CHECK(st == TP_OK && took >= 0 && took < 600))
                conf_fail(rank, __FILE__, __LINE__, "the add behind the leaver: %s after %lld ms",
                          tp_status_name((tp_status)st), (long long)took);
        }
        CHECK(!tp_future_done(slow));
        CHECK_OK(tp_future_wait(slow, TP_TIMEOUT_INFINITE));
        tp_future_free(later);
        tp_future_free(slow);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/*
 * spec: FLOW-2 FUNC-6 SHUTDOWN-2: while the window to w1 is full, a
 * non-blocking function (on the I/O thread) that sends is refused at once
 * with TP_ELIMIT saying it cannot wait for room, and a function on the pool
 * that waits for room is released by a non-graceful shutdown with
 * TP_ESHUTDOWN saying so, instead of waiting out the slow call.
 */
static int flow_window_waits_end_in_a_function(int rank, int ws) {
    INIT_WINDOW_OR_RETURN(rank, ws, WINDOW);
    if (rank == 0) {
        tp_future *slow = NULL, *waiting = NULL;
        tp_value *args = padded_sleep(3000);
        CHECK_OK(tp_rpc_async(tp_to_rank(1), "sleep_ms", args, NULL, TP_TIMEOUT_DEFAULT, &slow));
        tp_value_free(args);
        tp_value *res = NULL;
        if (CHECK_OK(conf_sync(tp_to_rank(0), "nb_send_padded", CONF_INTS(1, PAD), &res)) &&
            CHECK_INT(tp_list_len(res), 2)) {
            CHECK_INT(conf_int_of(rank, tp_list_get(res, 0), -1), TP_ELIMIT);
            const char *msg = NULL;
            size_t len = 0;
            CHECK_OK(tp_value_get_str(tp_list_get(res, 1), &msg, &len));
            CHECK_CONTAINS(msg, "max_inflight_bytes 65536) and a non-blocking function cannot "
                                "wait for room");
        }
        tp_value_free(res);
        CHECK_OK(conf_async(tp_to_rank(0), "send_padded", CONF_INTS(1, PAD), &waiting));
        CHECK_OK(tp_sleep(0.2)); /* it waits for room on the pool */
        uint64_t t0 = conf_now_ns();
        CHECK_OK(tp_shutdown(0));
        CHECK(conf_since_s(t0) < 2.0); /* not after the slow call */
        char msg[TP_ERRMSG_LEN_MAX];
        CHECK_STATUS(conf_send_padded_status(msg, sizeof msg), TP_ESHUTDOWN);
        CHECK_CONTAINS(msg, "the worker shut down while the call waited to send");
        tp_future_free(waiting);
        tp_future_free(slow);
    } else {
        uint64_t t0 = conf_now_ns();
        while (conf_since_s(t0) < 3.5)
            if (tp_sleep(0.01) != TP_OK)
                break;
        tp_shutdown(0); /* w0 left without a goodbye: a non-graceful end here too */
    }
    return conf_finish(rank);
}

/* spec: FLOW-1: a call larger than the whole window goes when nothing else
 * is in flight; the setter's domain. */
static int flow_large_call_goes_alone(int rank, int ws) {
    tp_options *o = tp_options_new();
    CHECK_STATUS(tp_options_set_max_inflight_bytes(o, 4095), TP_EINVAL);
    CHECK_CONTAINS(tp_errmsg(), "max_inflight_bytes 4095 outside");
    CHECK_STATUS(tp_options_set_max_inflight_bytes(o, ((uint64_t)1 << 40) + 1), TP_EINVAL);
    CHECK_INT(tp_options_max_inflight_bytes(o), 256 << 20);
    CHECK_OK(tp_options_set_max_inflight_bytes(o, 4096));
    CHECK_INT(tp_options_max_inflight_bytes(o), 4096);
    tp_options *copy = tp_options_clone(o);
    CHECK_INT(tp_options_max_inflight_bytes(copy), 4096);
    tp_options_free(copy);
    tp_options_free(o);

    INIT_WINDOW_OR_RETURN(rank, ws, 4096);
    if (rank == 0) {
        tp_value *res = NULL;
        CHECK_OK(conf_sync(tp_to_rank(1), "make_bytes", CONF_INTS(100), &res));
        tp_value_free(res);
        res = NULL;
        uint8_t *big = calloc(1, 100000);
        tp_value *args = tp_value_list_of(1, tp_value_bytes(big, 100000));
        free(big);
        if (CHECK_OK(conf_sync(tp_to_rank(1), "echo", args, &res)))
            CHECK(tp_value_kind(res) == TP_KIND_BYTES);
        tp_value_free(res);
        /* Several at once: each goes when the one before it ended. */
        tp_future *fs[4] = {NULL};
        for (int i = 0; i < 4; i++) {
            tp_value *a = padded_sleep(20);
            CHECK_OK(tp_rpc_async(tp_to_rank(1), "sleep_ms", a, NULL, TP_TIMEOUT_DEFAULT, &fs[i]));
            tp_value_free(a);
            if (i > 0) /* sent only once the previous call was answered */
                CHECK(fs[i - 1] && tp_future_done(fs[i - 1]));
        }
        for (int i = 0; i < 4; i++) {
            if (fs[i])
                CHECK_OK(tp_future_wait(fs[i], TP_TIMEOUT_INFINITE));
            tp_future_free(fs[i]);
        }
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* sleep_ms(ms) padded with pad bytes. Caller owns. */
static tp_value *sleep_padded(int64_t ms, size_t pad) {
    uint8_t *p = calloc(1, pad ? pad : 1);
    tp_value *args = p ? tp_value_list_of(2, tp_value_int(ms), tp_value_bytes(p, pad)) : NULL;
    free(p);
    return args;
}

/* Reads "<in flight> request bytes already in flight to it, this call adds
 * <len>" from a FLOW-2 timeout message; 0 when it is not one. */
static int window_numbers(const char *msg, unsigned long long *inflight, unsigned long long *len) {
    const char *p = msg ? strstr(msg, "waiting to send: ") : NULL;
    return p && sscanf(p,
                       "waiting to send: %llu request bytes already in flight to it, "
                       "this call adds %llu",
                       inflight, len) == 2;
}

/*
 * spec: FLOW-1 FLOW-2: the bound is inclusive: a call that exactly fills the
 * window (in flight + its bytes == max_inflight_bytes) goes at once, it does
 * not wait. The frame sizes are measured, not assumed: a padded call too
 * large to fit times out, and its message gives the bytes in flight and its
 * own length; the pad is then cut so the next call's frame is exactly the
 * room left (a bytes value's length is a fixed-width u32, so a frame grows by
 * one byte per pad byte). A last small call then finds the window exactly full.
 */
#define EXACT_WINDOW 4096
static int flow_call_exactly_filling_window_goes(int rank, int ws) {
    INIT_WINDOW_OR_RETURN(rank, ws, EXACT_WINDOW);
    if (rank == 0) {
        tp_dest w1 = tp_to_rank(1);
        tp_future *slow = NULL, *exact = NULL;
        tp_value *args = CONF_INTS(1500);
        CHECK_OK(tp_rpc_async(w1, "sleep_ms", args, NULL, TP_TIMEOUT_DEFAULT, &slow));
        tp_value_free(args);

        /* Too large beside the slow call: it waits, times out, and says why. */
        size_t probe_pad = EXACT_WINDOW;
        unsigned long long inflight = 0, probe_len = 0;
        tp_future *f = NULL;
        args = sleep_padded(1, probe_pad);
        CHECK_STATUS(tp_rpc_async(w1, "sleep_ms", args, NULL, 0.2, &f), TP_ETIMEDOUT);
        tp_value_free(args);
        CHECK(f == NULL);
        tp_future_free(f);
        f = NULL;
        if (!CHECK(window_numbers(tp_errmsg(), &inflight, &probe_len)) ||
            !CHECK(inflight > 0 && inflight < EXACT_WINDOW / 2) ||
            !CHECK(probe_len > probe_pad && inflight + probe_len > EXACT_WINDOW) ||
            !CHECK(probe_len - probe_pad + inflight < EXACT_WINDOW))
            goto out;

        /* Exactly the room left: it goes at once, nothing else waits. */
        size_t exact_pad = probe_pad - (size_t)(inflight + probe_len - EXACT_WINDOW);
        args = sleep_padded(500, exact_pad);
        uint64_t t0 = conf_now_ns();
        if (!CHECK_OK(tp_rpc_async(w1, "sleep_ms", args, NULL, 1.0, &exact)))
            conf_fail(rank, __FILE__, __LINE__,
                      "a call of %llu bytes with %llu in flight did not go in a window of %d",
                      (unsigned long long)(EXACT_WINDOW - inflight), inflight, EXACT_WINDOW);
        tp_value_free(args);
        CHECK(conf_since_s(t0) < 0.1);

        /* The window is now exactly full: the smallest call waits, and the
         * numbers it reports add up to the window. */
        unsigned long long full = 0, small_len = 0;
        args = CONF_INTS(1);
        CHECK_STATUS(tp_rpc_async(w1, "sleep_ms", args, NULL, 0.2, &f), TP_ETIMEDOUT);
        tp_value_free(args);
        CHECK(f == NULL);
        tp_future_free(f);
        if (CHECK(window_numbers(tp_errmsg(), &full, &small_len)))
            CHECK_INT(full, EXACT_WINDOW);
        CHECK(!tp_future_done(slow));
        if (exact && CHECK_OK(tp_future_wait(exact, TP_TIMEOUT_INFINITE)))
            CHECK_INT(conf_int_of(rank, tp_future_value(exact), -1), 500);
    out:
        if (slow && CHECK_OK(tp_future_wait(slow, TP_TIMEOUT_INFINITE)))
            CHECK_INT(conf_int_of(rank, tp_future_value(slow), -1), 1500);
        tp_future_free(exact);
        tp_future_free(slow);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FLOW-3: a call waiting for the window of a worker that dies fails
 * promptly with the peer error, naming it. */
static int flow_waiter_sees_peer_death(int rank, int ws) {
    INIT_WINDOW_OR_RETURN(rank, ws, WINDOW);
    if (rank == 1) {
        uint64_t t0 = conf_now_ns();
        while (conf_started(rank) < 1 && conf_since_s(t0) < 10.0)
            if (tp_sleep(0.01) != TP_OK)
                break;
        CHECK_INT(conf_started(rank), 1);
        tp_sleep(0.3); /* rank 0 is waiting for the window by now */
        int failures = conf_finish(rank);
        conf_crash_self();
        return failures;
    }
    tp_future *slow = NULL;
    tp_value *args = padded_sleep(20000);
    CHECK_OK(tp_rpc_async(tp_to_rank(1), "sleep_ms", args, NULL, TP_TIMEOUT_DEFAULT, &slow));
    tp_value_free(args);
    args = padded_sleep(1);
    tp_future *f = NULL;
    uint64_t t0 = conf_now_ns();
    CHECK_STATUS(tp_rpc_async(tp_to_rank(1), "sleep_ms", args, NULL, TP_TIMEOUT_DEFAULT, &f),
                 TP_EPEERDOWN);
    double took = conf_since_s(t0);
    if (!CHECK(took >= 0.2 && took < 5.0))
        conf_fail(rank, __FILE__, __LINE__, "failed after %.3f s", took);
    CHECK_CONTAINS(tp_errmsg(), "'w1' (id 1)");
    CHECK_CONTAINS(tp_errmsg(), "went down while the call waited");
    tp_value_free(args);
    if (slow)
        CHECK_STATUS(tp_future_wait(slow, TP_TIMEOUT_INFINITE), TP_EPEERDOWN);
    tp_future_free(slow);
    CHECK_STATUS(tp_shutdown(1), TP_EPEERDOWN);
    return conf_finish(rank);
}

/* spec: FLOW-1 FLOW-2: remote and method calls wait for the window too. */
static int flow_remote_and_method_wait(int rank, int ws) {
    INIT_WINDOW_OR_RETURN(rank, ws, WINDOW);
    if (rank == 0) {
        tp_dest w1 = tp_to_rank(1);
        tp_rref *counter = NULL;
        tp_method *get = NULL;
        tp_value *start = CONF_INTS(5);
        CHECK_OK(tp_remote(w1, "make_counter", start, NULL, TP_TIMEOUT_DEFAULT, &counter));
        tp_value_free(start);
        CHECK_OK(tp_method_factory("get", &get));
        uint8_t *pad = calloc(1, PAD);
        tp_value *kwargs = tp_value_map();
        if (!CHECK(pad && kwargs && tp_map_set(kwargs, "pad", tp_value_bytes(pad, PAD)) == TP_OK))
            goto out;

        tp_future *slow = NULL;
        tp_value *args = padded_sleep(1000);
        CHECK_OK(tp_rpc_async(w1, "sleep_ms", args, NULL, TP_TIMEOUT_DEFAULT, &slow));
        tp_value_free(args);

        tp_rref *r = NULL;
        args = padded_sleep(1);
        CHECK_STATUS(tp_remote(w1, "sleep_ms", args, NULL, 0.3, &r), TP_ETIMEDOUT);
        CHECK_CONTAINS(tp_errmsg(), "max_inflight_bytes is 65536");
        CHECK(r == NULL);
        tp_value_free(args);
        tp_value *res = NULL;
        CHECK_STATUS(tp_method_call_sync(get, counter, NULL, kwargs, 0.3, &res), TP_ETIMEDOUT);
        CHECK_CONTAINS(tp_errmsg(), "waiting to send");
        tp_value_free(res);
        res = NULL;

        if (slow)
            CHECK_OK(tp_future_wait(slow, TP_TIMEOUT_INFINITE));
        tp_future_free(slow);
        if (CHECK_OK(tp_method_call_sync(get, counter, NULL, kwargs, TP_TIMEOUT_DEFAULT, &res)))
            CHECK_INT(conf_int_of(rank, res, -1), 5);
        tp_value_free(res);
    out:
        tp_value_free(kwargs);
        free(pad);
        tp_method_free(get);
        tp_rref_release(counter);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* ---- Credit (FLOW-6..8) --------------------------------------------------------- */

/* Worker 1 grants each caller 64 KiB (max_queued_bytes at its minimum, one
 * peer) and runs one request at a time; worker 0 keeps its 256 MiB window. */
static tp_status init_for_credit(int rank, int ws) {
    tp_options *o = conf_options();
    tp_status st = tp_options_set_rpc_timeout(o, 30.0);
    if (st == TP_OK)
        st = tp_options_set_shutdown_timeout(o, 5.0);
    if (st == TP_OK && rank == 1)
        st = tp_options_set_max_queued_bytes(o, 64 * 1024);
    if (st == TP_OK && rank == 1)
        st = tp_options_set_num_worker_threads(o, 1);
    if (st == TP_OK)
        st = conf_init_opts(rank, ws, o);
    tp_options_free(o);
    return st;
}

#define INIT_CREDIT_OR_RETURN(rank, ws)                                                            \
    do {                                                                                           \
        if (!CHECK_OK(init_for_credit((rank), (ws))))                                              \
            return conf_finish(rank);                                                              \
    } while (0)

/* Issues n padded sleep_ms(ms) calls to worker 1 at once; *refused counts
 * the TP_ELIMIT answers, every other answer must be the slept ms. */
static void padded_burst(int rank, int n, int64_t ms, int *refused, char *msg, size_t msg_len) {
    tp_future *fs[8] = {NULL};
    *refused = 0;
    for (int i = 0; i < n && i < 8; i++) {
        tp_value *a = padded_sleep(ms);
        CHECK_OK(tp_rpc_async(tp_to_rank(1), "sleep_ms", a, NULL, TP_TIMEOUT_DEFAULT, &fs[i]));
        tp_value_free(a);
    }
    for (int i = 0; i < n && i < 8; i++) {
        if (!fs[i])
            continue;
        tp_status st = tp_future_wait(fs[i], TP_TIMEOUT_INFINITE);
        if (st == TP_ELIMIT) {
            if (!*refused)
                snprintf(msg, msg_len, "%s", tp_future_error(fs[i]));
            (*refused)++;
        } else if (CHECK_OK(st)) {
            CHECK_INT(conf_int_of(rank, tp_future_value(fs[i]), -1), ms);
        }
        tp_future_free(fs[i]);
    }
}

/* spec: FLOW-8: a request alone is always taken, however large: 100,000
 * bytes to a callee whose max_queued_bytes is 64 KiB, with nothing else
 * queued there, is served (it goes alone, FLOW-6's large call). */
static int flow_credit_lone_large_request_taken(int rank, int ws) {
    INIT_CREDIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        uint8_t *big = calloc(1, 100000);
        tp_value *res = NULL;
        if (CHECK(big != NULL)) {
            tp_status st = conf_sync(tp_to_rank(1), "echo",
                                     tp_value_list_of(1, tp_value_bytes(big, 100000)), &res);
            if (CHECK_OK(st))
                CHECK(tp_value_kind(res) == TP_KIND_BYTES);
        }
        tp_value_free(res);
        free(big);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FLOW-3 FLOW-6 FLOW-7: a caller waiting for credit (smaller than
 * its window) when the callee dies is woken at once and told the worker
 * went down, even when all it waits behind is the debt of a call that
 * timed out (no live call to that peer is left to fail and wake it).
 * Rank 1's one thread runs its own 3 s sleep; rank 0's first padded call
 * (40,000 bytes) times out queued there, its bytes still owed; the second
 * waits for the 64 KiB credit until rank 1 crashes at 0.5 s. */
static int flow_credit_waiter_sees_peer_death(int rank, int ws) {
    INIT_CREDIT_OR_RETURN(rank, ws);
    if (rank == 1) {
        tp_future *own = NULL;
        CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(3000), &own));
        tp_sleep(0.5);
        int failures = conf_finish(rank);
        conf_crash_self();
        tp_future_free(own);
        return failures;
    }
    tp_sleep(0.1);
    tp_value *args = padded_sleep(1);
    tp_future *late = NULL, *f = NULL;
    CHECK_OK(tp_rpc_async(tp_to_rank(1), "sleep_ms", args, NULL, 0.1, &late));
    if (late)
        CHECK_STATUS(tp_future_wait(late, TP_TIMEOUT_INFINITE), TP_ETIMEDOUT);
    tp_future_free(late);
    uint64_t t0 = conf_now_ns();
    CHECK_STATUS(tp_rpc_async(tp_to_rank(1), "sleep_ms", args, NULL, 5.0, &f), TP_EPEERDOWN);
    double took = conf_since_s(t0);
    if (!CHECK(took < 1.5))
        conf_fail(rank, __FILE__, __LINE__, "failed after %.3f s", took);
    CHECK_CONTAINS(tp_errmsg(), "went down while the call waited");
    tp_future_free(f);
    tp_value_free(args);
    CHECK_STATUS(tp_shutdown(1), TP_EPEERDOWN);
    return conf_finish(rank);
}

/* spec: FLOW-6 OPT-9: a caller's window is the credit the callee granted:
 * a burst past it waits in rpc_async instead of being refused. */
static int flow_credit_caller_waits(int rank, int ws) {
    tp_options *o = tp_options_new();
    CHECK_INT(tp_options_max_queued_bytes(o), (uint64_t)4 << 30);
    CHECK_STATUS(tp_options_set_max_queued_bytes(o, 65535), TP_EINVAL);
    CHECK_CONTAINS(tp_errmsg(), "max_queued_bytes");
    tp_options_free(o);
    INIT_CREDIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        int refused = 0;
        char msg[TP_ERRMSG_LEN_MAX] = "";
        uint64_t t0 = conf_now_ns();
        padded_burst(rank, 4, 100, &refused, msg, sizeof msg);
        CHECK_INT(refused, 0);
        CHECK(conf_since_s(t0) >= 0.35); /* one at a time: 40,000 bytes each, 64 KiB granted */
        /* A wait for credit that times out names the credit, not only the window. */
        tp_future *slow = NULL, *f = NULL;
        tp_value *args = padded_sleep(500);
        CHECK_OK(tp_rpc_async(tp_to_rank(1), "sleep_ms", args, NULL, TP_TIMEOUT_DEFAULT, &slow));
        CHECK_STATUS(tp_rpc_async(tp_to_rank(1), "sleep_ms", args, NULL, 0.2, &f), TP_ETIMEDOUT);
        CHECK_CONTAINS(tp_errmsg(), "timed out after 200 ms waiting to send: 400");
        CHECK_CONTAINS(tp_errmsg(), "the credit it granted is 65536 (FLOW-6; max_inflight_bytes "
                                    "268435456)");
        CHECK(f == NULL);
        tp_value_free(args);
        if (slow)
            CHECK_OK(tp_future_wait(slow, TP_TIMEOUT_INFINITE));
        tp_future_free(slow);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FLOW-8: a caller that ignores its credit has its requests refused
 * past it, unrun, with a message that says so; the callee serves on. */
static int flow_credit_refuses_nonconforming(int rank, int ws) {
    INIT_CREDIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_test_flow_ignore_credit(1);
        int refused = 0;
        char msg[TP_ERRMSG_LEN_MAX] = "";
        padded_burst(rank, 5, 200, &refused, msg, sizeof msg);
        tp_test_flow_ignore_credit(0);
        CHECK(refused >= 1 && refused <= 4);
        CHECK_CONTAINS(msg, "refused the request");
        CHECK_CONTAINS(msg, "'w0' (id 0)");
        CHECK_CONTAINS(msg, "credit of 65536");
        CHECK_CONTAINS(msg, "FLOW-8");
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(1, 2), -1), 3);
        padded_burst(rank, 3, 1, &refused, msg, sizeof msg); /* conforming again */
        CHECK_INT(refused, 0);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/*
 * spec: FLOW-6 FLOW-8: every caller is granted at least 64 KiB, so with two
 * callers and max_queued_bytes at its 64 KiB minimum the grants add up past
 * the worker's total: a request that fits its caller's credit is still
 * refused when the bytes queued from everyone would pass max_queued_bytes,
 * unrun, with a message naming the total; once they drain it is taken.
 */
static int flow_total_refuses_past_max_queued(int rank, int ws) {
    INIT_CREDIT_OR_RETURN(rank, ws);
    if (rank == 0) { /* w1's one pool thread sleeps 300 ms for us; a padded call waits */
        tp_value *a = CONF_INTS(300), *b = padded_sleep(1);
        tp_future *f = NULL, *g = NULL;
        CHECK_OK(tp_rpc_async(tp_to_rank(1), "sleep_ms", a, NULL, TP_TIMEOUT_DEFAULT, &f));
        CHECK_OK(tp_rpc_async(tp_to_rank(1), "sleep_ms", b, NULL, TP_TIMEOUT_DEFAULT, &g));
        tp_value_free(a);
        tp_value_free(b);
        if (f && CHECK_OK(tp_future_wait(f, TP_TIMEOUT_INFINITE)))
            CHECK_INT(conf_int_of(rank, tp_future_value(f), -1), 300);
        if (g && CHECK_OK(tp_future_wait(g, TP_TIMEOUT_INFINITE)))
            CHECK_INT(conf_int_of(rank, tp_future_value(g), -1), 1);
        tp_future_free(f);
        tp_future_free(g);
    }
    if (rank == 2) {
        CHECK_OK(tp_sleep(0.1)); /* w0's padded request is queued on w1 by now */
        tp_value *a = padded_sleep(1), *res = NULL;
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), "sleep_ms", a, NULL, TP_TIMEOUT_DEFAULT, &res),
                     TP_ELIMIT);
        CHECK_CONTAINS(tp_errmsg(), "refused the request from worker 'w2' (id 2)");
        CHECK_CONTAINS(tp_errmsg(), "over max_queued_bytes of 65536 (FLOW-8)");
        CHECK(res == NULL);
        CHECK_OK(tp_sleep(0.5)); /* w0's calls ended: their bytes are released */
        if (CHECK_OK(tp_rpc_sync(tp_to_rank(1), "sleep_ms", a, NULL, TP_TIMEOUT_DEFAULT, &res)))
            CHECK_INT(conf_int_of(rank, res, -1), 1);
        tp_value_free(res);
        tp_value_free(a);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FLOW-7: a call that timed out keeps its bytes in the window until
 * its late answer, because the callee still holds its request: the next
 * call waits for it instead of being refused. */
static int flow_timed_out_call_keeps_credit(int rank, int ws) {
    INIT_CREDIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_dest w1 = tp_to_rank(1);
        /* Worker 1's one pool thread is busy for 600 ms... */
        tp_future *busy = NULL;
        tp_value *a = CONF_INTS(600);
        CHECK_OK(tp_rpc_async(w1, "sleep_ms", a, NULL, TP_TIMEOUT_DEFAULT, &busy));
        tp_value_free(a);
        /* ... so this one waits in its queue, 40,000 bytes, and times out here. */
        a = padded_sleep(1);
        tp_value *res = NULL;
        CHECK_STATUS(tp_rpc_sync(w1, "sleep_ms", a, NULL, 0.1, &res), TP_ETIMEDOUT);
        tp_value_free(a);
        /* Sent now it would be two padded requests queued at worker 1, past
         * the 64 KiB granted: it waits for the late answer instead. */
        uint64_t t0 = conf_now_ns();
        a = padded_sleep(2);
        if (CHECK_OK(tp_rpc_sync(w1, "sleep_ms", a, NULL, TP_TIMEOUT_DEFAULT, &res)))
            CHECK_INT(conf_int_of(rank, res, -1), 2);
        CHECK(conf_since_s(t0) >= 0.3);
        tp_value_free(res);
        tp_value_free(a);
        if (busy)
            CHECK_OK(tp_future_wait(busy, TP_TIMEOUT_INFINITE));
        tp_future_free(busy);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FLOW-7 FLOW-9 FLOW-10: on a transport that keeps frames, a request
 * that timed out at its caller still counts against the caller's credit at
 * the callee, which holds it: the caller's window generation stays, so a
 * caller that then ignores its credit is refused. (Only a lossy transport
 * gives the bytes back at the timeout, under a new generation.) */
static int flow_callee_still_counts_a_timed_out_request(int rank, int ws) {
    INIT_CREDIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_dest w1 = tp_to_rank(1);
        tp_future *busy = NULL; /* worker 1's one pool thread, for 600 ms */
        tp_value *a = CONF_INTS(600), *res = NULL;
        CHECK_OK(tp_rpc_async(w1, "sleep_ms", a, NULL, TP_TIMEOUT_DEFAULT, &busy));
        tp_value_free(a);
        a = padded_sleep(1); /* 40,000 bytes, queued behind it: times out here */
        CHECK_STATUS(tp_rpc_sync(w1, "sleep_ms", a, NULL, 0.1, &res), TP_ETIMEDOUT);
        tp_test_flow_ignore_credit(1);
        CHECK_STATUS(tp_rpc_sync(w1, "sleep_ms", a, NULL, TP_TIMEOUT_DEFAULT, &res), TP_ELIMIT);
        tp_test_flow_ignore_credit(0);
        CHECK_CONTAINS(tp_errmsg(), "over the credit of 65536 bytes granted to it (FLOW-8)");
        CHECK(res == NULL);
        tp_value_free(a);
        if (busy)
            CHECK_OK(tp_future_wait(busy, TP_TIMEOUT_INFINITE));
        tp_future_free(busy);
        CHECK_INT(conf_sync_int(rank, w1, "add", CONF_INTS(1, 2), -1), 3);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/*
 * spec: FAIR-1: callers are served round-robin. Worker 1 floods worker 0
 * (two pool threads) with 200 sleep_ms(20) calls, 2 s of work, then tells
 * worker 2, whose one call to worker 0 must be served before the flood is:
 * it answers how many flood calls had ended, far fewer than 200 (with one
 * FIFO queue it waited behind all of them).
 */
#define FLOOD_CALLS 200
static int fair_flood_does_not_delay_others(int rank, int ws) {
    tp_options *o = conf_options();
    CHECK_OK(tp_options_set_rpc_timeout(o, 60.0));
    CHECK_OK(tp_options_set_shutdown_timeout(o, 60.0));
    if (rank == 0)
        CHECK_OK(tp_options_set_num_worker_threads(o, 2));
    tp_status st = conf_init_opts(rank, ws, o);
    tp_options_free(o);
    if (!CHECK_OK(st))
        return conf_finish(rank);
    if (rank == 1) {
        tp_future **fl = calloc(FLOOD_CALLS, sizeof *fl);
        tp_value *a = CONF_INTS(20);
        for (int i = 0; fl && i < FLOOD_CALLS; i++)
            CHECK_OK(tp_rpc_async(tp_to_rank(0), "sleep_ms", a, NULL, TP_TIMEOUT_DEFAULT, &fl[i]));
        tp_value_free(a);
        a = CONF_INTS(0, 0); /* the flood is queued: worker 2 may call now */
        tp_value *res = NULL;
        CHECK_OK(tp_rpc_sync(tp_to_rank(2), "ff_hop", a, NULL, TP_TIMEOUT_DEFAULT, &res));
        tp_value_free(res);
        tp_value_free(a);
        for (int i = 0; fl && i < FLOOD_CALLS; i++) {
            CHECK_OK(tp_future_wait(fl[i], TP_TIMEOUT_INFINITE));
            tp_future_free(fl[i]);
        }
        free(fl);
    } else if (rank == 2) {
        uint64_t t0 = conf_now_ns();
        while (conf_sync_int(rank, tp_to_rank(2), "hops", NULL, -1) < 1 && conf_since_s(t0) < 60)
            (void)tp_sleep(0.005);
        int64_t ended = conf_sync_int(rank, tp_to_rank(0), "served", NULL, -1);
        if (!CHECK(ended >= 0 && ended < FLOOD_CALLS / 4))
            conf_fail(rank, __FILE__, __LINE__,
                      "served after %lld of the %d flood calls: it waited behind the flood",
                      (long long)ended, FLOOD_CALLS);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

const tp_conformance_case conf_cases_flow[] = {
    {"flow_credit_caller_waits", 2, flow_credit_caller_waits, "FLOW-6 OPT-9"},
    {"flow_credit_waiter_sees_peer_death", 2, flow_credit_waiter_sees_peer_death,
     "FLOW-3 FLOW-6 FLOW-7"},
    {"flow_credit_lone_large_request_taken", 2, flow_credit_lone_large_request_taken, "FLOW-8"},
    {"flow_credit_refuses_nonconforming", 2, flow_credit_refuses_nonconforming, "FLOW-8"},
    {"flow_total_refuses_past_max_queued", 3, flow_total_refuses_past_max_queued, "FLOW-6 FLOW-8"},
    {"flow_timed_out_call_keeps_credit", 2, flow_timed_out_call_keeps_credit, "FLOW-7"},
    {"flow_callee_still_counts_a_timed_out_request", 2,
     flow_callee_still_counts_a_timed_out_request, "FLOW-7 FLOW-9 FLOW-10"},
    {"flow_window_waits_then_times_out", 2, flow_window_waits_then_times_out,
     "FLOW-1 FLOW-2 OPT-7"},
    {"flow_window_waits_end_in_a_function", 2, flow_window_waits_end_in_a_function,
     "FLOW-2 FUNC-6 SHUTDOWN-2"},
    {"flow_large_call_goes_alone", 2, flow_large_call_goes_alone, "FLOW-1 OPT-7"},
    {"flow_call_exactly_filling_window_goes", 2, flow_call_exactly_filling_window_goes,
     "FLOW-1 FLOW-2"},
    {"flow_waiter_sees_peer_death", 2, flow_waiter_sees_peer_death, "FLOW-3"},
    {"flow_waiter_that_leaves_wakes_the_next", 2, flow_waiter_that_leaves_wakes_the_next, "FLOW-2"},
    {"flow_remote_and_method_wait", 2, flow_remote_and_method_wait, "FLOW-1 FLOW-2"},
    {"fair_flood_does_not_delay_others", 3, fair_flood_does_not_delay_others, "FAIR-1"},
};
const size_t conf_cases_flow_count = sizeof conf_cases_flow / sizeof conf_cases_flow[0];
