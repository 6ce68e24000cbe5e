/*
 * cases_errors.c: statuses and messages: remote failures carry the callee's
 * message and name, unknown functions are named, limits are enforced
 * without hurting the worker, and tp_errmsg() belongs to its own task.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

/* spec: CALL-6 FUNC-3 ERR-2: a remote error arrives with its message and the callee's name. */
static int errors_remote_message_and_callee(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *res = NULL;
        CHECK_STATUS(conf_sync(tp_to_rank(1), "boom", NULL, &res), TP_EREMOTE);
        CHECK_CONTAINS(tp_errmsg(),
                       "function 'boom' on worker 'w1' (id 1) failed: boom: deliberate failure");
        CHECK(res == NULL);
        tp_future *f = NULL;
        if (CHECK_OK(conf_async(tp_to_rank(1), "boom", NULL, &f))) {
            CHECK_STATUS(tp_future_wait(f, TP_TIMEOUT_INFINITE), TP_EREMOTE);
            CHECK_CONTAINS(tp_future_error(f), "boom: deliberate failure");
            CHECK_CONTAINS(tp_future_error(f), "w1");
        }
        tp_future_free(f);
        /* The same on a self call. */
        CHECK_STATUS(conf_sync(tp_to_rank(0), "boom", NULL, &res), TP_EREMOTE);
        CHECK_CONTAINS(tp_errmsg(), "boom: deliberate failure");
        /* spec: ERR-3: a NULL handle is an error, never a crash. */
        CHECK_STATUS(tp_rref_to_here(NULL, 1.0, &res), TP_EINVAL);
        CHECK(res == NULL);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUNC-3: a function failing without a message still names itself. */
static int errors_silent_failure_has_message(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *res = NULL;
        CHECK_STATUS(conf_sync(tp_to_rank(1), "silent_fail", NULL, &res), TP_EREMOTE);
        CHECK_CONTAINS(tp_errmsg(), "function 'silent_fail' on worker 'w1' (id 1) failed");
        CHECK_CONTAINS(tp_errmsg(), tp_strerror(TP_ERANGE)); /* the status, described */
        tp_value_free(res);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: CALL-5 METHOD-1: an unknown function is TP_EUNKNOWNFUNC, naming it. */
static int errors_unknown_function(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *res = NULL;
        CHECK_STATUS(conf_sync(tp_to_rank(1), "no_such_fn", NULL, &res), TP_EUNKNOWNFUNC);
        CHECK_CONTAINS(tp_errmsg(), "worker 'w1' (id 1) has no function 'no_such_fn'");
        CHECK_STATUS(conf_sync(tp_to_rank(0), "no_such_self_fn", NULL, &res), TP_EUNKNOWNFUNC);
        CHECK_CONTAINS(tp_errmsg(), "no_such_self_fn");
        tp_future *f = NULL;
        if (CHECK_OK(conf_async(tp_to_rank(1), "no_such_async_fn", NULL, &f))) {
            CHECK_STATUS(tp_future_wait(f, TP_TIMEOUT_INFINITE), TP_EUNKNOWNFUNC);
            CHECK_CONTAINS(tp_future_error(f), "no_such_async_fn");
        }
        tp_future_free(f);
        /* A method name is not a function name. */
        CHECK_STATUS(conf_sync(tp_to_rank(1), "increment", NULL, &res), TP_EUNKNOWNFUNC);
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(1, 2), -1), 3);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: CALL-6 FUNC-4: a failure two calls deep reaches the first caller with its message. */
static int errors_nested_remote_propagates(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *res = NULL;
        tp_value *args = tp_value_list_of(2, tp_value_int(2), tp_value_str("boom"));
        CHECK_STATUS(conf_sync(tp_to_rank(1), "nested", args, &res), TP_EREMOTE);
        CHECK_CONTAINS(tp_errmsg(), "boom: deliberate failure");
        CHECK_CONTAINS(tp_errmsg(), "nested call to rank 2");
        tp_value_free(res);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: ERR-1: every status has a distinct name and a description. */
static int errors_status_strings(int rank, int ws) {
    (void)ws;
    for (int i = 0; i < TP_STATUS_COUNT_; i++) {
        const char *name = tp_status_name((tp_status)i);
        const char *text = tp_strerror((tp_status)i);
        CHECK(name && strncmp(name, "TP_", 3) == 0);
        CHECK(text && text[0] != '\0');
        for (int j = 0; j < i; j++)
            CHECK(strcmp(name, tp_status_name((tp_status)j)) != 0);
    }
    CHECK(strcmp(tp_status_name(TP_ETIMEDOUT), "TP_ETIMEDOUT") == 0);
    CHECK(strcmp(tp_status_name(TP_OK), "TP_OK") == 0);
    CHECK(strcmp(tp_strerror(TP_ETIMEDOUT), "timed out") == 0);
    CHECK(tp_strerror((tp_status)9999) &&
          strcmp(tp_strerror((tp_status)9999), "unknown status") == 0);
    const char *odd = tp_status_name((tp_status)-1); /* spec: "TP_UNKNOWN"; any non-status name */
    CHECK(odd && strncmp(odd, "TP_", 3) == 0);
    for (int j = 0; odd && j < TP_STATUS_COUNT_; j++)
        CHECK(strcmp(odd, tp_status_name((tp_status)j)) != 0);
    return conf_finish(rank);
}

/* spec: ERR-2: tp_errmsg() is per task: concurrent failures do not mix their messages. */
static int errors_errmsg_per_task(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    char fn[32];
    snprintf(fn, sizeof fn, "missing_by_%d", rank);
    tp_value *res = NULL;
    CHECK_STATUS(conf_sync(tp_to_rank((rank + 1) % ws), fn, NULL, &res), TP_EUNKNOWNFUNC);
    CHECK_OK(tp_sleep(0.05)); /* the others fail their own calls meanwhile */
    CHECK_CONTAINS(tp_errmsg(), fn);
    /* A successful call does not clear it. */
    CHECK_INT(conf_sync_int(rank, tp_to_rank((rank + 1) % ws), "add", CONF_INTS(1, 1), -1), 2);
    CHECK_CONTAINS(tp_errmsg(), fn);
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: ERR-2: tp_errmsg() is "" until a call of this task fails; success leaves it. */
static int errors_errmsg_empty_until_failure(int rank, int ws) {
    CHECK(strcmp(tp_errmsg(), "") == 0);
    CONF_INIT_OR_RETURN(rank, ws);
    CHECK(strcmp(tp_errmsg(), "") == 0); /* init succeeded: nothing failed */
    CHECK_INT(conf_sync_int(rank, tp_to_rank(1 - rank), "add", CONF_INTS(1, 2), -1), 3);
    CHECK(strcmp(tp_errmsg(), "") == 0);
    CHECK_OK(tp_shutdown(1));
    CHECK(strcmp(tp_errmsg(), "") == 0);
    return conf_finish(rank);
}

#define SMALL_LIMIT (64 * 1024)
#define BIG_PAYLOAD (100 * 1024)

/* spec: OPT-5 CALL-4 CALL-7: a message over max_message_size is TP_EMSGSIZE; service goes on. */
static int errors_message_too_large(int rank, int ws) {
    tp_options *o = conf_options();
    CHECK_OK(tp_options_set_max_message_size(o, SMALL_LIMIT));
    tp_status ist = conf_init_opts(rank, ws, o);
    tp_options_free(o);
    if (!CHECK_OK(ist))
        return conf_finish(rank);
    if (rank == 0) {
        uint8_t *big = calloc(1, BIG_PAYLOAD);
        tp_value *args = tp_value_list_of(1, tp_value_bytes(big, BIG_PAYLOAD));
        free(big);
        tp_value *res = NULL;
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), "echo", args, NULL, TP_TIMEOUT_DEFAULT, &res),
                     TP_EMSGSIZE);
        CHECK(tp_errmsg()[0] != '\0');
        CHECK_CONTAINS(tp_errmsg(), "65536"); /* names the limit */
        CHECK_CONTAINS(tp_errmsg(), "'w1' (id 1)");
        tp_future *f = NULL;
        /* Encoding errors fail the call before sending: a status and no future. */
        CHECK_STATUS(tp_rpc_async(tp_to_rank(1), "echo", args, NULL, TP_TIMEOUT_DEFAULT, &f),
                     TP_EMSGSIZE);
        CHECK(f == NULL);
        tp_future_free(f);
        tp_rref *r = NULL;
        CHECK_STATUS(tp_remote(tp_to_rank(1), "echo", args, NULL, TP_TIMEOUT_DEFAULT, &r),
                     TP_EMSGSIZE);
        CHECK(r == NULL);
        tp_rref_release(r);
        tp_value_free(args);
        /* The worker keeps serving. */
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(2, 3), -1), 5);
        /* A reply over the limit fails the call, and w1 keeps serving. */
        CHECK_STATUS(conf_sync(tp_to_rank(1), "make_bytes", CONF_INTS(BIG_PAYLOAD), &res),
                     TP_EMSGSIZE);
        CHECK_CONTAINS(tp_errmsg(), "65536");
        CHECK_CONTAINS(tp_errmsg(), "make_bytes"); /* ERR-2: which function */
        tp_value_free(res);
        res = NULL;
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(4, 5), -1), 9);
        /* Just under the limit works. */
        if (CHECK_OK(conf_sync(tp_to_rank(1), "make_bytes", CONF_INTS(SMALL_LIMIT / 2), &res))) {
            const void *d = NULL;
            size_t len = 0;
            CHECK_OK(tp_value_get_bytes(res, &d, &len));
            CHECK_INT(len, SMALL_LIMIT / 2);
        }
        tp_value_free(res);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: VALUE-8 CALL-4 CALL-7: objects cannot travel, as arguments or results; service goes on. */
static int errors_object_not_sendable(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *res = NULL;
        CHECK_STATUS(conf_sync(tp_to_rank(1), "make_object", NULL, &res), TP_ETYPE);
        tp_value_free(res);
        res = NULL;
        /* The callee freed the unsendable result. */
        CHECK_INT(conf_poll_int(rank, tp_to_rank(1), "live_objects", 0, 5.0), 0);
        int *state = malloc(sizeof *state);
        tp_value *obj = tp_value_object("Local", state, free);
        tp_value *args = tp_value_list_of(1, obj);
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), "echo", args, NULL, TP_TIMEOUT_DEFAULT, &res),
                     TP_ETYPE);
        CHECK_CONTAINS(tp_errmsg(), "objects cannot be sent");
        tp_value_free(args);
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(1, 2), -1), 3);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: CALL-1 ERR-3: a NULL function name and non-list args are rejected, not crashed on. */
static int errors_bad_call_arguments(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *res = NULL;
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), NULL, NULL, NULL, TP_TIMEOUT_DEFAULT, &res),
                     TP_EINVAL);
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), "a b", NULL, NULL, TP_TIMEOUT_DEFAULT, &res),
                     TP_EINVAL);
        tp_value *notlist = tp_value_int(3);
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), "echo", notlist, NULL, TP_TIMEOUT_DEFAULT, &res),
                     TP_EINVAL);
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), "echo", NULL, notlist, TP_TIMEOUT_DEFAULT, &res),
                     TP_EINVAL);
        CHECK(res == NULL);
        /* remote and to_here check their arguments the same way (CALL-1, TIMEOUT-1). */
        tp_rref *rr = NULL;
        CHECK_STATUS(tp_remote(tp_to_rank(1), "echo", notlist, NULL, TP_TIMEOUT_DEFAULT, &rr),
                     TP_EINVAL);
        CHECK_STATUS(tp_remote(tp_to_rank(1), "echo", NULL, notlist, TP_TIMEOUT_DEFAULT, &rr),
                     TP_EINVAL);
        tp_value *ab = CONF_INTS(1, 2);
        CHECK_STATUS(tp_remote(tp_to_rank(1), "add", ab, NULL, -2.0, &rr), TP_EINVAL);
        CHECK(rr == NULL);
        if (CHECK_OK(tp_remote(tp_to_rank(1), "add", ab, NULL, TP_TIMEOUT_DEFAULT, &rr))) {
            tp_value *v = NULL;
            CHECK_STATUS(tp_rref_to_here(rr, -2.0, &v), TP_EINVAL);
            CHECK(v == NULL);
            if (CHECK_OK(tp_rref_to_here(rr, TP_TIMEOUT_DEFAULT, &v))) {
                int64_t got = 0;
                CHECK(tp_value_get_int(v, &got) == TP_OK && got == 3);
            }
            tp_value_free(v);
            tp_rref_release(rr);
        }
        tp_value_free(ab);
        tp_value_free(notlist);
        tp_value_free(res);
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(1, 2), -1), 3);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* Calls the built-in fn on w1 with each of bad[0..n) (taken): each must be
 * refused with want and a message containing msg, and return nothing. */
static void each_refused(int rank, const char *fn, tp_value **bad, size_t n, tp_status want,
                         const char *msg) {
    for (size_t i = 0; i < n; i++) {
        tp_value *res = NULL;
        CHECK_STATUS(conf_sync(tp_to_rank(1), fn, bad[i], &res), want);
        CHECK_CONTAINS(tp_errmsg(), msg);
        CHECK(res == NULL);
        tp_value_free(res);
    }
}

/*
 * spec: CANCEL-1 ERR-2: the built-in tp:cancel takes exactly [request id],
 * a nonzero int (ids start at 1). Anything else from a peer is refused with
 * TP_EPROTO naming the built-in and its sender, and breaks nothing: the
 * callee goes on serving, and a well-formed cancel that finds nothing still
 * answers nil. The sender here is a program calling the name directly, as a
 * buggy or hostile peer could.
 */
static int errors_malformed_cancel_refused(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *bad[] = {
            CONF_INTS(0),                             /* id 0: no call has it */
            tp_value_list_of(0),                      /* no id */
            CONF_INTS(7, 8),                          /* one too many */
            tp_value_list_of(1, tp_value_str("7")),   /* not an int */
            tp_value_list_of(1, tp_value_float(7.0)), /* not an int either */
        };
        each_refused(rank, "tp:cancel", bad, sizeof bad / sizeof bad[0], TP_EPROTO,
                     "tp:cancel from worker 'w0' (id 0) is malformed");
        /* A cancel of a request w1 never had is well formed: it does nothing. */
        tp_value *res = NULL;
        if (CHECK_OK(conf_sync(tp_to_rank(1), "tp:cancel", CONF_INTS(123456789), &res)))
            CHECK(res != NULL && tp_value_kind(res) == TP_KIND_NIL);
        tp_value_free(res);
        /* w1 serves on, and the graceful shutdown below drains as usual. */
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(2, 3), -1), 5);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* [k, addr]: a tp:join's arguments (REJOIN-3). */
static tp_value *join_args(tp_value *k, tp_value *addr) {
    return tp_value_list_of(2, k, addr);
}

/*
 * spec: REJOIN-3 ERR-2: the built-in tp:join takes [incarnation, address],
 * the incarnation 1..2^24-1 and the address 1..255 bytes without a NUL.
 * Anything else from a peer is refused with TP_EPROTO naming its sender,
 * and changes nothing: the sender is not taken for restarted, and calls
 * between the two go on. (A well-formed tp:join would restart the sender
 * in the callee's eyes, so none is sent here.)
 */
static int errors_malformed_join_refused(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        char long_addr[257]; /* 256 bytes: one past the longest address */
        memset(long_addr, 'a', sizeof long_addr - 1);
        long_addr[sizeof long_addr - 1] = '\0';
        tp_value *bad[] = {
            tp_value_list_of(0),
            CONF_INTS(1),
            tp_value_list_of(3, tp_value_int(1), tp_value_str("127.0.0.1:1"), tp_value_int(0)),
            join_args(tp_value_str("1"), tp_value_str("127.0.0.1:1")),
            join_args(tp_value_int(0), tp_value_str("127.0.0.1:1")),
            join_args(tp_value_int(-1), tp_value_str("127.0.0.1:1")),
            join_args(tp_value_int((int64_t)1 << 24), tp_value_str("127.0.0.1:1")),
            join_args(tp_value_int(1), tp_value_str("")),
            join_args(tp_value_int(1), tp_value_strn("127.0.0.1\0:1", 12)),
            join_args(tp_value_int(1), tp_value_str(long_addr)),
            join_args(tp_value_int(1), tp_value_int(5)),
        };
        each_refused(rank, "tp:join", bad, sizeof bad / sizeof bad[0], TP_EPROTO,
                     "tp:join from worker 'w0' (id 0) is malformed");
        /* w1 still knows w0 as it was: both ways serve on. */
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(2, 3), -1), 5);
        tp_value *res = NULL;
        tp_value *back = tp_value_list_of(4, tp_value_int(0), tp_value_str("add"), tp_value_int(4),
                                          tp_value_int(5));
        if (CHECK_OK(conf_sync(tp_to_rank(1), "nested", back, &res)))
            CHECK_INT(conf_int_of(rank, res, -1), 9);
        tp_value_free(res);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* [a, b, c, d] of ints: a tp:forks entry (RREF-19). */
static tp_value *forks_entry(int64_t a, int64_t b, int64_t c, int64_t d) {
    return tp_value_list_of(4, tp_value_int(a), tp_value_int(b), tp_value_int(c), tp_value_int(d));
}

/*
 * spec: RREF-19 ERR-2: the built-in tp:forks takes [[rref worker, rref n,
 * fork worker, fork n]...], at most TPI_FORKS_QUERY_MAX (4096) entries of
 * non-negative ints with worker ids that fit 32 bits. Anything else from a
 * peer is refused (TP_EPROTO naming the entry, TP_ELIMIT naming the limit)
 * and breaks nothing; a well-formed query about a fork this worker never
 * had is answered "not held" (0), the same entry with its answer appended.
 */
static int errors_malformed_forks_query_refused(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        struct {
            tp_value *args;
            tp_status want;
            const char *msg;
        } bad[] = {
            {tp_value_list_of(0), TP_EPROTO, "tp:forks: malformed query"},
            {CONF_INTS(5), TP_EPROTO, "tp:forks: malformed query"},
            {tp_value_list_of(2, tp_value_list_of(0), tp_value_list_of(0)), TP_EPROTO,
             "tp:forks: malformed query"},
            {tp_value_list_of(1, tp_value_list_of(1, CONF_INTS(1, 2, 3))), TP_EPROTO,
             "tp:forks: entry 0 is malformed"},
            {tp_value_list_of(
                 1, tp_value_list_of(2, forks_entry(0, 1, 0, 2), forks_entry(0, -1, 0, 2))),
             TP_EPROTO, "tp:forks: entry 1 is malformed"},
            {tp_value_list_of(1, tp_value_list_of(1, forks_entry((int64_t)1 << 32, 1, 0, 2))),
             TP_EPROTO, "tp:forks: entry 0 is malformed"},
            {tp_value_list_of(1, tp_value_list_of(1, forks_entry(0, 1, (int64_t)1 << 32, 2))),
             TP_EPROTO, "tp:forks: entry 0 is malformed"},
            {tp_value_list_of(
                 1, tp_value_list_of(1, tp_value_list_of(4, tp_value_int(0), tp_value_str("1"),
                                                         tp_value_int(0), tp_value_int(2)))),
             TP_EPROTO, "tp:forks: entry 0 is malformed"},
            {NULL, TP_ELIMIT, "tp:forks: 4097 forks in one query, over TPI_FORKS_QUERY_MAX (4096)"},
        };
        size_t nbad = sizeof bad / sizeof bad[0];
        tp_value *many = tp_value_list();
        for (int i = 0; many && i < 4097; i++)
            if (tp_list_append(many, forks_entry(0, 1, 0, (int64_t)i + 2)) != TP_OK)
                CHECK(0);
        bad[nbad - 1].args = tp_value_list_of(1, many);
        for (size_t i = 0; i < nbad; i++)
            each_refused(rank, "tp:forks", &bad[i].args, 1, bad[i].want, bad[i].msg);
        /* Well formed: fork 0:9 of rref 0:8 is not held on w1. */
        tp_value *res = NULL;
        if (CHECK_OK(conf_sync(tp_to_rank(1), "tp:forks",
                               tp_value_list_of(1, tp_value_list_of(1, forks_entry(0, 8, 0, 9))),
                               &res)) &&
            CHECK(tp_list_len(res) == 1)) {
            const tp_value *e = tp_list_get(res, 0);
            int64_t v[5] = {-1, -1, -1, -1, -1};
            CHECK_INT(tp_list_len(e), 5);
            for (size_t i = 0; i < 5 && i < tp_list_len(e); i++)
                CHECK_OK(tp_value_get_int(tp_list_get(e, i), &v[i]));
            CHECK(v[0] == 0 && v[1] == 8 && v[2] == 0 && v[3] == 9 && v[4] == 0);
        }
        tp_value_free(res);
        /* At the bounds, still well formed: TPI_FORKS_QUERY_MAX entries, the
         * first naming worker ids of UINT32_MAX; none is held. */
        tp_value *edge = tp_value_list();
        if (CHECK(edge && tp_list_append(edge, forks_entry(UINT32_MAX, 8, UINT32_MAX, 9)) == TP_OK))
            for (int i = 1; i < 4096; i++)
                if (tp_list_append(edge, forks_entry(0, 1, 0, (int64_t)i + 2)) != TP_OK)
                    CHECK(0);
        res = NULL;
        if (CHECK_OK(conf_sync(tp_to_rank(1), "tp:forks", tp_value_list_of(1, edge), &res)) &&
            CHECK_INT(tp_list_len(res), 4096)) {
            const tp_value *e = tp_list_get(res, 0);
            int64_t v[5] = {-1, -1, -1, -1, -1};
            for (size_t i = 0; i < 5 && i < tp_list_len(e); i++)
                CHECK_OK(tp_value_get_int(tp_list_get(e, i), &v[i]));
            CHECK(v[0] == UINT32_MAX && v[2] == UINT32_MAX && v[4] == 0);
        }
        tp_value_free(res);
        /* Misnamed calls of the rref API are refused before anything is sent. */
        tp_rref *r = NULL;
        CHECK_STATUS(tp_remote(tp_to_rank(1), "a b", NULL, NULL, TP_TIMEOUT_DEFAULT, &r),
                     TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "remote: function name 'a b' must match");
        CHECK(r == NULL);
        const tp_value *lv = NULL;
        CHECK_STATUS(tp_rref_local_value(NULL, &lv), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "local_value: rref is NULL");
        uint64_t in_flight = 0;
        CHECK_STATUS(tp_get_debug_calls_in_flight(0, NULL), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "debug info: out is NULL");
        CHECK_OK(tp_get_debug_calls_in_flight(0, &in_flight));
        /* w1 serves on. */
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(2, 3), -1), 5);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/*
 * spec: ERR-3: a NULL out pointer is TP_EINVAL naming the argument, not an
 * assertion. Last in the suite: with an in-process launcher a library that asserts here ends the
 * run.
 */
static int errors_null_out_pointers(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *args = CONF_INTS(1, 2);
        CHECK_STATUS(tp_rpc_sync(tp_to_rank(1), "add", args, NULL, TP_TIMEOUT_DEFAULT, NULL),
                     TP_EINVAL);
        CHECK_STATUS(tp_rpc_async(tp_to_rank(1), "add", args, NULL, TP_TIMEOUT_DEFAULT, NULL),
                     TP_EINVAL);
        CHECK_STATUS(tp_remote(tp_to_rank(1), "add", args, NULL, TP_TIMEOUT_DEFAULT, NULL),
                     TP_EINVAL);
        CHECK_STATUS(tp_get_worker_info(NULL, NULL), TP_EINVAL);
        tp_future *f = NULL, *chained = NULL;
        if (CHECK_OK(tp_rpc_async(tp_to_rank(1), "add", args, NULL, TP_TIMEOUT_DEFAULT, &f))) {
            tp_future *with_null[2] = {f, NULL}; /* FUTURE-6: a NULL entry */
            CHECK_STATUS(tp_future_wait_all(with_null, 2, TP_TIMEOUT_INFINITE, NULL), TP_EINVAL);
            CHECK_STATUS(tp_future_then(f, NULL, NULL, &chained), TP_EINVAL); /* FUTURE-5 */
            CHECK(chained == NULL);
            CHECK_STATUS(tp_future_then(f, NULL, NULL, NULL), TP_EINVAL);
        }
        tp_future_free(chained);
        tp_future_free(f);
        tp_value_free(args);
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(1, 2), -1), 3);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* A then-callback that passes the value on. */
static tp_status pass_on(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                         void *user_data) {
    (void)errmsg, (void)errmsg_len, (void)user_data;
    *result = tp_value_clone(tp_future_value(f));
    return *result ? TP_OK : TP_ENOMEM;
}

/*
 * spec: ERR-3 CANCEL-1 FUTURE-6 METHOD-2: misuse of the future, method and
 * worker-list calls is refused with a status and a message that names the
 * argument or the reason, and changes nothing: the worker serves on.
 */
static int errors_misuse_is_named(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        /* Futures: only an rpc_async's, still pending, can be canceled. */
        CHECK_STATUS(tp_future_new(NULL), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "future_new: out is NULL");
        tp_future *mine = NULL, *f = NULL, *chained = NULL;
        if (CHECK_OK(tp_future_new(&mine))) {
            CHECK_STATUS(tp_future_cancel(mine), TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "only the future of an rpc_async (or an async method "
                                        "call) can be canceled; this one is the program's own");
            CHECK(!tp_future_done(mine));
        }
        if (CHECK_OK(conf_async(tp_to_rank(1), "add", CONF_INTS(2, 3), &f))) {
            if (CHECK_OK(tp_future_then(f, pass_on, NULL, &chained))) {
                CHECK_STATUS(tp_future_cancel(chained), TP_EINVAL);
                CHECK_CONTAINS(tp_errmsg(), "this one is a then, done-callback or collect_all "
                                            "future");
            }
            CHECK_OK(tp_future_wait(f, TP_TIMEOUT_INFINITE));
            CHECK_STATUS(tp_future_cancel(f), TP_EALREADY);
            CHECK_CONTAINS(tp_errmsg(), "cancel: the call ended already (TP_OK)");
            CHECK_INT(conf_int_of(rank, tp_future_value(f), -1), 5); /* unchanged */
            if (chained && CHECK_OK(tp_future_wait(chained, TP_TIMEOUT_INFINITE)))
                CHECK_INT(conf_int_of(rank, tp_future_value(chained), -1), 5);
            /* collect_all and wait_all name the NULL they were given. */
            tp_future *all = NULL;
            tp_future *with_null[2] = {f, NULL};
            CHECK_STATUS(tp_future_collect_all(NULL, 2, &all), TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "collect_all: futures is NULL");
            CHECK_STATUS(tp_future_collect_all(with_null, 2, &all), TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "collect_all: future 1 is NULL");
            CHECK(all == NULL);
            CHECK_STATUS(tp_future_wait_all(NULL, 2, TP_TIMEOUT_INFINITE, NULL), TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "wait_all: futures is NULL");
            tp_future *null_first[2] = {NULL, f};
            CHECK_STATUS(tp_future_wait_all(null_first, 2, TP_TIMEOUT_INFINITE, NULL), TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "wait_all: future 0 is NULL");
        }
        tp_future_free(chained);
        tp_future_free(f);
        if (mine)
            CHECK_OK(tp_future_set_result(mine, NULL));
        tp_future_free(mine);

        /* Completing no future is refused; the value given is freed all the same. */
        CHECK_STATUS(tp_future_set_result(NULL, tp_value_int(1)), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "future set_result: future is NULL");
        CHECK_STATUS(tp_future_set_error(NULL, TP_EIO, "x"), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "future set_error: future is NULL");

        /* answer_later belongs in a function: outside one there is no call. */
        CHECK_STATUS(tp_call_answer_later(NULL, NULL), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "answer_later: call is NULL");
        tp_future *answer = NULL;
        if (CHECK_OK(tp_future_new(&answer))) { /* a future is not enough */
            CHECK_STATUS(tp_call_answer_later(NULL, answer), TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "answer_later: call is NULL");
        }
        tp_future_free(answer);

        /* Methods: the argument shapes are checked before anything is sent. */
        tp_method *inc = NULL;
        tp_rref *r = NULL;
        CHECK_STATUS(tp_method_factory("increment", NULL), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "method_factory: out is NULL");
        CHECK_OK(tp_method_factory("increment", &inc));
        tp_value *start = CONF_INTS(4);
        CHECK_OK(tp_remote(tp_to_rank(1), "make_counter", start, NULL, TP_TIMEOUT_DEFAULT, &r));
        tp_value_free(start);
        if (inc && r) {
            tp_value *res = NULL, *three = tp_value_int(3), *args = CONF_INTS(1);
            tp_future *mf = NULL;
            tp_rref *mr = NULL;
            CHECK_STATUS(tp_method_call_sync(inc, r, three, NULL, TP_TIMEOUT_DEFAULT, &res),
                         TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "method call: args must be a list, got int");
            CHECK_STATUS(tp_method_call_sync(inc, r, args, three, TP_TIMEOUT_DEFAULT, &res),
                         TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "method call: kwargs must be a map, got int");
            CHECK_STATUS(tp_method_call_sync(inc, r, args, NULL, TP_TIMEOUT_DEFAULT, NULL),
                         TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "method call: result is NULL");
            CHECK_STATUS(tp_method_call_async(inc, r, args, NULL, TP_TIMEOUT_DEFAULT, NULL),
                         TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "method call: out is NULL");
            CHECK_STATUS(tp_method_call_remote(inc, r, args, NULL, TP_TIMEOUT_DEFAULT, NULL),
                         TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "method call: out is NULL");
            CHECK_STATUS(tp_method_call_async(NULL, r, args, NULL, TP_TIMEOUT_DEFAULT, &mf),
                         TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "method call: method is NULL");
            CHECK_STATUS(tp_method_call_remote(inc, NULL, args, NULL, TP_TIMEOUT_DEFAULT, &mr),
                         TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "method call: rref is NULL");
            /* TIMEOUT-1: a method call's timeout is checked as any call's. */
            CHECK_STATUS(tp_method_call_sync(inc, r, args, NULL, -2.0, &res), TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "timeout -2 s is negative");
            CHECK_STATUS(tp_method_call_async(inc, r, args, NULL, NAN, &mf), TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "timeout is NaN");
            CHECK_STATUS(tp_method_call_remote(inc, r, args, NULL, 1e300, &mr), TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "exceeds the limit");
            CHECK(res == NULL && mf == NULL && mr == NULL);
            /* An object inside a map inside the arguments cannot travel either. */
            tp_value *inner = tp_value_map();
            tp_value *obj = tp_value_object("Local", malloc(sizeof(int)), free);
            if (CHECK(inner && obj) && CHECK_OK(tp_map_set(inner, "o", obj))) {
                obj = NULL; /* the map's now */
                tp_value *in_map = tp_value_list_of(1, inner);
                inner = NULL; /* the list's now */
                CHECK_STATUS(tp_method_call_sync(inc, r, in_map, NULL, TP_TIMEOUT_DEFAULT, &res),
                             TP_ETYPE);
                CHECK_CONTAINS(tp_errmsg(), "objects cannot be sent");
                tp_value_free(in_map);
            }
            tp_value_free(obj);
            tp_value_free(inner);
            /* Nothing of the above reached the Counter: it still counts from 4. */
            if (CHECK_OK(tp_method_call_sync(inc, r, args, NULL, TP_TIMEOUT_DEFAULT, &res)))
                CHECK_INT(conf_int_of(rank, res, -1), 5);
            tp_value_free(res);
            tp_value_free(args);
            tp_value_free(three);
        }
        tp_rref_release(r);
        tp_method_free(inc);

        /* A destination names a worker by name, rank or info, and nothing else. */
        tp_value *res = NULL;
        CHECK_STATUS(conf_sync(tp_to_name(NULL), "add", CONF_INTS(1, 2), &res), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "destination name is NULL");
        tp_dest odd = {7, "w1", 1};
        CHECK_STATUS(conf_sync(odd, "add", CONF_INTS(1, 2), &res), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "destination kind 7 is not name, rank or info");
        tp_dest wrong_info = {2, "w0", 1}; /* w1's id under w0's name */
        CHECK_STATUS(conf_sync(wrong_info, "add", CONF_INTS(1, 2), &res), TP_EUNKNOWNWORKER);
        CHECK_CONTAINS(tp_errmsg(), "worker info 'w0' (id 1) names no worker here");
        CHECK(res == NULL);

        /* The worker list and backend options name their NULL out pointer. */
        tp_worker_info *infos = NULL;
        size_t n = 7;
        CHECK_STATUS(tp_get_worker_infos(NULL, &n), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "get_worker_infos: out is NULL");
        CHECK_STATUS(tp_get_worker_infos(&infos, NULL), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "get_worker_infos: count is NULL");
        CHECK(infos == NULL);
        CHECK_STATUS(tp_construct_rpc_backend_options(conf_launcher->backend, NULL), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "construct_rpc_backend_options: out is NULL");
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(1, 2), -1), 3);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

const tp_conformance_case conf_cases_errors[] = {
    {"errors_remote_message_and_callee", 2, errors_remote_message_and_callee,
     "CALL-6 FUNC-3 ERR-2"},
    {"errors_silent_failure_has_message", 2, errors_silent_failure_has_message, "FUNC-3"},
    {"errors_unknown_function", 2, errors_unknown_function, "CALL-5 METHOD-1"},
    {"errors_nested_remote_propagates", 3, errors_nested_remote_propagates, "CALL-6 FUNC-4"},
    {"errors_status_strings", 1, errors_status_strings, "ERR-1"},
    {"errors_errmsg_per_task", 3, errors_errmsg_per_task, "ERR-2"},
    {"errors_errmsg_empty_until_failure", 2, errors_errmsg_empty_until_failure, "ERR-2"},
    {"errors_message_too_large", 2, errors_message_too_large, "OPT-5 CALL-4 CALL-7"},
    {"errors_object_not_sendable", 2, errors_object_not_sendable, "VALUE-8 CALL-4 CALL-7"},
    {"errors_bad_call_arguments", 2, errors_bad_call_arguments, "CALL-1 ERR-3"},
    {"errors_malformed_cancel_refused", 2, errors_malformed_cancel_refused, "CANCEL-1 ERR-2"},
    {"errors_malformed_join_refused", 2, errors_malformed_join_refused, "REJOIN-3 ERR-2"},
    {"errors_malformed_forks_query_refused", 2, errors_malformed_forks_query_refused,
     "RREF-19 ERR-2"},
    {"errors_misuse_is_named", 2, errors_misuse_is_named, "ERR-3 CANCEL-1 FUTURE-6 METHOD-2"},
    {"errors_null_out_pointers", 2, errors_null_out_pointers, "ERR-3 FUTURE-5 FUTURE-6"},
};
const size_t conf_cases_errors_count = sizeof conf_cases_errors / sizeof conf_cases_errors[0];
