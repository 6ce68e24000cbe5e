/*
 * cases_rref.c: remote references: creation, ownership, passing them in and
 * out of calls, timeouts, failures, release, and remote methods.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

/* tp_remote with args transferred (freed here). */
static tp_status remote_on(tp_dest dest, const char *fn, tp_value *args, double timeout_s,
                           tp_rref **out) {
    *out = NULL;
    tp_status st = tp_remote(dest, fn, args, NULL, timeout_s, out);
    tp_value_free(args);
    return st;
}

/* to_here expecting an int. */
static int64_t to_here_int(int rank, tp_rref *r, int64_t fallback) {
    tp_value *v = NULL;
    if (!CHECK_OK(tp_rref_to_here(r, TP_TIMEOUT_INFINITE, &v)))
        return fallback;
    int64_t x = conf_int_of(rank, v, fallback);
    tp_value_free(v);
    return x;
}

/* spec: RREF-2 RREF-8: remote() returns at once; to_here fetches the value, repeatably. */
static int rref_remote_to_here(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_rref *r = NULL;
        uint64_t t0 = conf_now_ns();
        tp_value *args = tp_value_list_of(2, tp_value_int(200), tp_value_int(5));
        if (CHECK_OK(remote_on(tp_to_rank(1), "slow_then_value", args, TP_TIMEOUT_DEFAULT, &r))) {
            CHECK(conf_since_s(t0) < 0.15); /* did not wait for the 200 ms function */
            CHECK_INT(to_here_int(rank, r, -1), 5);
            CHECK_INT(to_here_int(rank, r, -1), 5);
        }
        tp_rref_release(r);
        tp_rref_release(NULL);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: RREF-2 RREF-10 RREF-11: remote to self: the caller owns it; local_value works. */
static int rref_remote_self(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    tp_rref *r = NULL;
    if (CHECK_OK(remote_on(tp_to_rank(rank), "add", CONF_INTS(rank, 40), TP_TIMEOUT_DEFAULT, &r))) {
        CHECK_INT(to_here_int(rank, r, -1), rank + 40);
        CHECK(tp_rref_is_owner(r));
        CHECK(tp_rref_confirmed_by_owner(r));
        CHECK(tp_rref_owner_name(r) && strcmp(tp_rref_owner_name(r), conf_name(rank)) == 0);
        const tp_value *lv = NULL;
        if (CHECK_OK(tp_rref_local_value(r, &lv)))
            CHECK_INT(conf_int_of(rank, lv, -1), rank + 40);
    }
    tp_rref_release(r);
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: RREF-10 OPT-2: local_value on the owner of a value not ready yet
 * waits up to the default rpc timeout, then fails TP_ETIMEDOUT saying so;
 * with a longer default it waits for the value and returns it. */
static int rref_local_value_waits_for_its_value(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_rref *r = NULL;
        if (CHECK_OK(remote_on(tp_to_rank(0), "slow_then_value", CONF_INTS(1500, 7), 30.0, &r))) {
            CHECK_OK(tp_set_rpc_timeout(0.3));
            const tp_value *lv = NULL;
            uint64_t t0 = conf_now_ns();
            CHECK_STATUS(tp_rref_local_value(r, &lv), TP_ETIMEDOUT);
            double waited = conf_since_s(t0);
            CHECK_CONTAINS(tp_errmsg(), "local_value: the value is not ready after 0.3 s");
            CHECK(lv == NULL);
            CHECK(waited >= 0.29 && waited < 1.4);
            CHECK_OK(tp_set_rpc_timeout(30.0));
            if (CHECK_OK(tp_rref_local_value(r, &lv)))
                CHECK_INT(conf_int_of(rank, lv, -1), 7);
            CHECK(conf_since_s(t0) >= 1.49);
        }
        tp_rref_release(r);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: RREF-1 RREF-11: owner, owner_name, is_owner; a clone names the same owner. */
static int rref_owner_info(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_rref *r = NULL;
        if (CHECK_OK(remote_on(tp_to_rank(2), "echo", CONF_INTS(9), TP_TIMEOUT_DEFAULT, &r))) {
            CHECK(!tp_rref_is_owner(r));
            CHECK(tp_rref_owner_name(r) && strcmp(tp_rref_owner_name(r), "w2") == 0);
            tp_worker_info owner;
            if (CHECK_OK(tp_rref_owner(r, &owner))) {
                CHECK_INT(owner.id, 2);
                CHECK(strcmp(owner.name, "w2") == 0);
            }
            tp_rref *c = tp_rref_clone(r);
            if (CHECK(c != NULL)) {
                CHECK(tp_rref_owner_name(c) && strcmp(tp_rref_owner_name(c), "w2") == 0);
                CHECK(!tp_rref_is_owner(c));
                CHECK_INT(to_here_int(rank, c, -1), 9);
            }
            tp_rref_release(c);
        }
        tp_rref_release(r);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: RREF-2 RREF-11: a user's rref is confirmed by its owner eventually. */
static int rref_confirmed_by_owner(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_rref *r = NULL;
        if (CHECK_OK(remote_on(tp_to_rank(1), "echo", CONF_INTS(1), TP_TIMEOUT_DEFAULT, &r))) {
            uint64_t t0 = conf_now_ns();
            while (!tp_rref_confirmed_by_owner(r) && conf_since_s(t0) < 5.0)
                if (tp_sleep(0.01) != TP_OK)
                    break;
            CHECK(tp_rref_confirmed_by_owner(r));
        }
        tp_rref_release(r);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: RREF-10 ERR-2: local_value on a user fails with TP_ENOTOWNER naming both workers. */
static int rref_local_value_not_owner(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_rref *r = NULL;
        if (CHECK_OK(remote_on(tp_to_rank(1), "echo", CONF_INTS(3), TP_TIMEOUT_DEFAULT, &r))) {
            const tp_value *lv = NULL;
            CHECK_STATUS(tp_rref_local_value(r, &lv), TP_ENOTOWNER);
            CHECK_CONTAINS(tp_errmsg(), "w0");
            CHECK_CONTAINS(tp_errmsg(), "w1");
            /* On the owner, local_value works (through a call that passes the rref). */
            tp_value *res = NULL;
            if (CHECK_OK(conf_sync(tp_to_rank(1), "rref_local",
                                   tp_value_list_of(1, tp_value_rref(r)), &res)))
                CHECK_INT(conf_int_of(rank, res, -1), 3);
            tp_value_free(res);
        }
        tp_rref_release(r);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: RREF-6 RREF-7 VALUE-7: an rref passed as an argument reaches users and its owner. */
static int rref_as_argument(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_rref *r = NULL;
        tp_value *args = tp_value_list_of(1, tp_value_str("payload"));
        if (CHECK_OK(remote_on(tp_to_rank(1), "echo", args, TP_TIMEOUT_DEFAULT, &r))) {
            tp_value *res = NULL;
            /* A third worker fetches it. */
            if (CHECK_OK(conf_sync(tp_to_rank(2), "rref_fetch",
                                   tp_value_list_of(1, tp_value_rref(r)), &res)))
                CHECK(strcmp(conf_str_of(rank, res), "payload") == 0);
            tp_value_free(res);
            /* Ownership as seen by a user and by the owner. */
            if (CHECK_OK(conf_sync(tp_to_rank(2), "rref_info",
                                   tp_value_list_of(1, tp_value_rref(r)), &res))) {
                int is_owner = -1;
                CHECK_OK(tp_value_get_bool(tp_list_get(res, 0), &is_owner));
                CHECK_INT(is_owner, 0);
                CHECK(strcmp(conf_str_of(rank, tp_list_get(res, 1)), "w1") == 0);
            }
            tp_value_free(res);
            if (CHECK_OK(conf_sync(tp_to_rank(1), "rref_info",
                                   tp_value_list_of(1, tp_value_rref(r)), &res))) {
                int is_owner = -1;
                CHECK_OK(tp_value_get_bool(tp_list_get(res, 0), &is_owner));
                CHECK_INT(is_owner, 1);
            }
            tp_value_free(res);
            /* The owner gets its own rref back and reads it in place. */
            if (CHECK_OK(conf_sync(tp_to_rank(1), "rref_local",
                                   tp_value_list_of(1, tp_value_rref(r)), &res)))
                CHECK(strcmp(conf_str_of(rank, res), "payload") == 0);
            tp_value_free(res);
        }
        tp_rref_release(r);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* rref_info's confirmed_by_owner (1 expected) from a call to dst that passes r. */
static void check_confirmed_inside(int rank, tp_dest dst, const char *fn, tp_rref *r) {
    tp_value *res = NULL;
    if (CHECK_OK(conf_sync(dst, fn, tp_value_list_of(1, tp_value_rref(r)), &res))) {
        int confirmed = -1;
        CHECK_OK(tp_value_get_bool(tp_list_get(res, 2), &confirmed));
        CHECK_INT(confirmed, 1);
    }
    tp_value_free(res);
}

/* spec: RREF-13 RREF-6: a function that receives a user rref owned by a third
 * worker runs only once the owner confirmed it (PyTorch 1.13 does the same):
 * from a REQUEST served on the pool, from a non-blocking function (which
 * then runs on the pool) and from a REMOTE's arguments. */
static int rref_run_after_confirm(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_rref *r = NULL;
        if (CHECK_OK(remote_on(tp_to_rank(1), "echo", CONF_INTS(8), TP_TIMEOUT_DEFAULT, &r))) {
            check_confirmed_inside(rank, tp_to_rank(2), "rref_info", r);
            check_confirmed_inside(rank, tp_to_rank(2), "nb_rref_info", r);
            /* Through a REMOTE's arguments: the function runs on w2 once confirmed. */
            tp_rref *info = NULL;
            if (CHECK_OK(remote_on(tp_to_rank(2), "rref_info",
                                   tp_value_list_of(1, tp_value_rref(r)), TP_TIMEOUT_DEFAULT,
                                   &info))) {
                tp_value *v = NULL;
                if (CHECK_OK(tp_rref_to_here(info, TP_TIMEOUT_DEFAULT, &v))) {
                    int confirmed = -1;
                    CHECK_OK(tp_value_get_bool(tp_list_get(v, 2), &confirmed));
                    CHECK_INT(confirmed, 1);
                }
                tp_value_free(v);
            }
            tp_rref_release(info);
            /* The function sees the value too: confirmed means the owner has the fork. */
            tp_value *res = NULL;
            if (CHECK_OK(conf_sync(tp_to_rank(2), "rref_fetch",
                                   tp_value_list_of(1, tp_value_rref(r)), &res)))
                CHECK_INT(conf_int_of(rank, res, -1), 8);
            tp_value_free(res);
        }
        tp_rref_release(r);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: RREF-6 RREF-7: an rref returned by a function (created there, owned by a third worker). */
static int rref_as_result(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *res = NULL;
        if (CHECK_OK(conf_sync(tp_to_rank(1), "rref_make", CONF_INTS(2, 77), &res)) &&
            CHECK(tp_value_kind(res) == TP_KIND_RREF)) {
            tp_rref *borrowed = NULL;
            CHECK_OK(tp_value_get_rref(res, &borrowed));
            tp_rref *r = borrowed ? tp_rref_clone(borrowed) : NULL;
            tp_value_free(res); /* our clone keeps the value alive */
            res = NULL;
            if (CHECK(r != NULL)) {
                CHECK(tp_rref_owner_name(r) && strcmp(tp_rref_owner_name(r), "w2") == 0);
                CHECK(!tp_rref_is_owner(r));
                CHECK_INT(to_here_int(rank, r, -1), 77);
            }
            tp_rref_release(r);
        }
        tp_value_free(res);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: RREF-9 TIMEOUT-5: to_here times out, the rref stays usable, a later to_here succeeds. */
static int rref_to_here_timeout_then_success(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_rref *r = NULL;
        tp_value *args = tp_value_list_of(2, tp_value_int(300), tp_value_int(42));
        if (CHECK_OK(remote_on(tp_to_rank(1), "slow_then_value", args, TP_TIMEOUT_INFINITE, &r))) {
            tp_value *v = NULL;
            uint64_t t0 = conf_now_ns();
            CHECK_STATUS(tp_rref_to_here(r, 0.05, &v), TP_ETIMEDOUT);
            CHECK(conf_since_s(t0) < 0.25);
            CHECK(v == NULL);
            tp_value_free(v);
            v = NULL;
            if (CHECK_OK(tp_rref_to_here(r, 5.0, &v)))
                CHECK_INT(conf_int_of(rank, v, -1), 42);
            tp_value_free(v);
        }
        tp_rref_release(r);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: RREF-2 RREF-8 CALL-5: remote of a failing or unknown function: to_here returns the error.
 */
static int rref_remote_failure(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_rref *r = NULL;
        if (CHECK_OK(remote_on(tp_to_rank(1), "boom", NULL, TP_TIMEOUT_DEFAULT, &r))) {
            tp_value *v = NULL;
            CHECK_STATUS(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v), TP_EREMOTE);
            CHECK_CONTAINS(tp_errmsg(), "boom: deliberate failure");
            tp_value_free(v);
            v = NULL;
            CHECK_STATUS(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v), TP_EREMOTE); /* sticky */
            tp_value_free(v);
        }
        tp_rref_release(r);
        r = NULL;
        if (CHECK_OK(remote_on(tp_to_rank(1), "no_such_function", NULL, TP_TIMEOUT_DEFAULT, &r))) {
            tp_value *v = NULL;
            CHECK_STATUS(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v), TP_EUNKNOWNFUNC);
            CHECK_CONTAINS(tp_errmsg(), "no_such_function");
            tp_value_free(v);
        }
        tp_rref_release(r);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: RREF-14 RREF-2: a creation that failed is one fact everywhere: its
 * creator's to_here, passing it on, a third worker that holds a copy sent
 * before the timeout, and remote to self (PyTorch 1.13: "creation timed
 * out"), and a function that failed. */
static int rref_failed_creation_one_fact(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        /* Timed out on a user: w2 got a copy while it was being created. */
        tp_rref *r = NULL;
        tp_value *args = tp_value_list_of(2, tp_value_int(400), tp_value_int(5));
        if (CHECK_OK(remote_on(tp_to_rank(1), "slow_then_value", args, 0.15, &r))) {
            tp_future *early = NULL;
            tp_value *pass = tp_value_list_of(1, tp_value_rref(r));
            CHECK_OK(tp_rpc_async(tp_to_rank(2), "rref_fetch", pass, NULL, TP_TIMEOUT_DEFAULT,
                                  &early));
            tp_value_free(pass);
            tp_value *v = NULL;
            CHECK_STATUS(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v), TP_ETIMEDOUT);
            CHECK_CONTAINS(tp_errmsg(), "not created");
            /* w2's copy gets the same error, not the value built at 400 ms. */
            if (early) {
                CHECK_STATUS(tp_future_wait(early, TP_TIMEOUT_DEFAULT), TP_EREMOTE);
                CHECK_CONTAINS(tp_errmsg(), "not created");
            }
            tp_future_free(early);
            /* Passing it on fails at once with the creation error. */
            tp_value *res = NULL;
            CHECK_STATUS(conf_sync(tp_to_rank(2), "rref_fetch",
                                   tp_value_list_of(1, tp_value_rref(r)), &res),
                         TP_ETIMEDOUT);
            CHECK_CONTAINS(tp_errmsg(), "not created");
            tp_value_free(res);
            CHECK_OK(tp_sleep(0.4)); /* the function has finished on w1 by now */
            CHECK_STATUS(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v), TP_ETIMEDOUT);
            tp_value_free(v);
        }
        tp_rref_release(r);
        r = NULL;
        /* Remote to self: the creation timed out, whatever the function does later. */
        args = tp_value_list_of(2, tp_value_int(300), tp_value_int(6));
        if (CHECK_OK(remote_on(tp_to_rank(0), "slow_then_value", args, 0.1, &r))) {
            tp_value *v = NULL;
            CHECK_STATUS(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v), TP_ETIMEDOUT);
            CHECK_CONTAINS(tp_errmsg(), "not created");
            CHECK_OK(tp_sleep(0.4));
            CHECK_STATUS(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v), TP_ETIMEDOUT);
            const tp_value *lv = NULL;
            CHECK_STATUS(tp_rref_local_value(r, &lv), TP_ETIMEDOUT);
            tp_value_free(v);
            /* Its owner's own handle cannot be passed on either: the same fact, at once. */
            tp_value *res = NULL;
            CHECK_STATUS(
                conf_sync(tp_to_rank(2), "rref_fetch", tp_value_list_of(1, tp_value_rref(r)), &res),
                TP_ETIMEDOUT);
            CHECK_CONTAINS(tp_errmsg(), "cannot be sent");
            CHECK_CONTAINS(tp_errmsg(), "not created");
            CHECK(res == NULL);
            tp_value_free(res);
        }
        tp_rref_release(r);
        r = NULL;
        /* A function that failed: once the creator knows, passing it on fails at once. */
        if (CHECK_OK(remote_on(tp_to_rank(1), "boom", NULL, TP_TIMEOUT_DEFAULT, &r))) {
            tp_value *v = NULL;
            CHECK_STATUS(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v), TP_EREMOTE);
            uint64_t t0 = conf_now_ns();
            while (!tp_rref_confirmed_by_owner(r) && conf_since_s(t0) < 5.0)
                if (tp_sleep(0.01) != TP_OK)
                    break;
            tp_value *res = NULL;
            CHECK_STATUS(conf_sync(tp_to_rank(2), "rref_fetch",
                                   tp_value_list_of(1, tp_value_rref(r)), &res),
                         TP_EREMOTE);
            CHECK_CONTAINS(tp_errmsg(), "boom: deliberate failure");
            CHECK_CONTAINS(tp_errmsg(), "cannot be sent");
            tp_value_free(res);
            tp_value_free(v);
        }
        tp_rref_release(r);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* Worker rank's debug counters (debug_info's list), or all -1. */
static void debug_counters(int rank, int of, int64_t out[7]) {
    for (int i = 0; i < 7; i++)
        out[i] = -1;
    tp_value *res = NULL;
    tp_status st = of == rank ? TP_OK : conf_sync(tp_to_rank(of), "debug_info", NULL, &res);
    if (of == rank) {
        tp_debug_info d;
        if (CHECK_OK(tp_get_debug_info(&d))) {
            uint64_t v[7] = {d.owned_values,     d.owner_forks,      d.user_rrefs,
                             d.pending_users,    d.pending_children, d.pending_protocol,
                             d.calls_in_flight};
            for (int i = 0; i < 7; i++)
                out[i] = (int64_t)v[i];
        }
    } else if (CHECK_OK(st)) {
        for (int i = 0; i < 7; i++)
            (void)tp_value_get_int(tp_list_get(res, (size_t)i), &out[i]);
    }
    tp_value_free(res);
}

/* Waits until every rref counter of every worker is zero (5 s at most). */
static void counters_back_to_zero(int rank, int ws) {
    int64_t c[7];
    for (int w = 0; w < ws; w++) {
        uint64_t t0 = conf_now_ns();
        int zero = 0;
        while (!zero && conf_since_s(t0) < 5.0) {
            debug_counters(rank, w, c);
            zero = 1;
            for (int i = 0; i < 6; i++)
                zero = zero && c[i] == 0;
            if (!zero)
                (void)tp_sleep(0.01);
        }
        for (int i = 0; i < 6; i++)
            CHECK_INT(c[i], 0);
    }
}

/* spec: RREF-16: the debug counters count what is held and return to zero
 * on every worker once the rrefs are released. */
static int rref_debug_info_back_to_zero(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_debug_info d;
        CHECK_STATUS(tp_get_debug_info(NULL), TP_EINVAL);
        uint64_t n = 0;
        CHECK_STATUS(tp_get_debug_calls_in_flight(ws, &n), TP_EINVAL);
        CHECK_STATUS(tp_get_debug_calls_in_flight(-1, &n), TP_EINVAL);
        CHECK_OK(tp_get_debug_calls_in_flight(1, &n));
        CHECK_INT((int64_t)n, 0);
        /* A call awaiting its answer counts toward its callee only; rank 0
         * (this worker) is a rank like any other. */
        tp_future *f = NULL;
        tp_value *ms = CONF_INTS(300);
        if (CHECK_OK(tp_rpc_async(tp_to_rank(2), "sleep_ms", ms, NULL, TP_TIMEOUT_DEFAULT, &f))) {
            CHECK_OK(tp_get_debug_calls_in_flight(2, &n));
            CHECK_INT((int64_t)n, 1);
            CHECK_OK(tp_get_debug_calls_in_flight(0, &n));
            CHECK_INT((int64_t)n, 0);
            CHECK_OK(tp_future_wait(f, TP_TIMEOUT_DEFAULT));
            CHECK_OK(tp_get_debug_calls_in_flight(2, &n));
            CHECK_INT((int64_t)n, 0);
        }
        tp_value_free(ms);
        tp_future_free(f);
        tp_rref *r = NULL;
        int64_t c[7];
        if (CHECK_OK(remote_on(tp_to_rank(1), "echo", CONF_INTS(9), TP_TIMEOUT_DEFAULT, &r))) {
            CHECK_INT(to_here_int(rank, r, -1), 9);
            /* w2 keeps nothing: its copy goes with the call's arguments. */
            tp_value *res = NULL;
            CHECK_OK(conf_sync(tp_to_rank(2), "rref_fetch", tp_value_list_of(1, tp_value_rref(r)),
                               &res));
            tp_value_free(res);
            if (CHECK_OK(tp_get_debug_info(&d))) {
                CHECK_INT((int64_t)d.user_rrefs, 1);
                CHECK_INT((int64_t)d.owned_values, 0);
            }
            debug_counters(rank, 1, c);
            CHECK_INT(c[0], 1); /* w1 owns the value ... */
            CHECK(c[1] >= 1);   /* ... and records w0's fork */
        }
        tp_rref_release(r);
        counters_back_to_zero(rank, ws); /* on every worker */
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* rref_info(r) on dest: [is_owner, owner name, confirmed]; -1s when it fails. */
static void info_on(int rank, int dest, tp_rref *r, int *is_owner, int *confirmed) {
    tp_value *info = NULL;
    *is_owner = *confirmed = -1;
    if (CHECK_OK(conf_sync(tp_to_rank(dest), "rref_info", tp_value_list_of(1, tp_value_rref(r)),
                           &info))) {
        CHECK_OK(tp_value_get_bool(tp_list_get(info, 0), is_owner));
        CHECK_OK(tp_value_get_bool(tp_list_get(info, 2), confirmed));
        CHECK(strcmp(conf_str_of(rank, tp_list_get(info, 1)), tp_rref_owner_name(r)) == 0);
    }
    tp_value_free(info);
}

/* An rref that rank 0 gets as the result of fn(args) on dest. */
static tp_rref *rref_result(int rank, int dest, const char *fn, tp_value *args, tp_value **keep) {
    tp_rref *r = NULL;
    *keep = NULL;
    if (CHECK_OK(conf_sync(tp_to_rank(dest), fn, args, keep)))
        CHECK_OK(tp_value_get_rref(*keep, &r));
    return r;
}

/*
 * spec: RREF-5 RREF-6 RREF-7 RREF-3: every direction a reference travels in,
 * as an argument and as a result: user to owner, user to user, user to
 * itself, owner to user, and a user's result to another user. Each arrives
 * usable and confirmed; after release every counter everywhere is zero.
 */
static int rref_share_every_direction(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_rref *r = NULL;
        int owner = -1, confirmed = -1;
        if (CHECK_OK(remote_on(tp_to_rank(1), "echo", CONF_INTS(7), TP_TIMEOUT_DEFAULT, &r))) {
            for (int to = 0; to < 3; to++) { /* to itself, to its owner, to another user */
                CHECK_INT(conf_sync_int(rank, tp_to_rank(to), "rref_fetch",
                                        tp_value_list_of(1, tp_value_rref(r)), -1),
                          7);
                info_on(rank, to, r, &owner, &confirmed);
                CHECK_INT(owner, to == 1);
                CHECK_INT(confirmed, 1); /* a function runs once confirmed (RREF-13) */
            }
        }
        /* Owner to user: w1 makes the rref and returns it. */
        tp_value *kept1 = NULL, *kept2 = NULL;
        tp_rref *from_owner = rref_result(rank, 1, "rref_make", CONF_INTS(1, 9), &kept1);
        if (from_owner) {
            CHECK(!tp_rref_is_owner(from_owner));
            CHECK(tp_rref_confirmed_by_owner(from_owner)); /* the owner recorded it (RREF-7) */
            CHECK_INT(to_here_int(rank, from_owner, -1), 9);
        }
        /* A user's result to another user: w2 makes an rref owned by w1. */
        tp_rref *from_user = rref_result(rank, 2, "rref_make", CONF_INTS(1, 5), &kept2);
        if (from_user) {
            CHECK_INT(to_here_int(rank, from_user, -1), 5);
            CHECK(strcmp(tp_rref_owner_name(from_user), conf_name(1)) == 0);
        }
        tp_value_free(kept1);
        tp_value_free(kept2);
        tp_rref_release(r);
        counters_back_to_zero(rank, ws);
    }
    CHECK_OK(tp_shutdown(1));
    tp_rref_leak *leaks = NULL;
    size_t n = 9;
    CHECK_OK(tp_shutdown_leaks(&leaks, &n));
    CHECK_INT(n, 0);
    free(leaks);
    return conf_finish(rank);
}

/* spec: RREF-3 RREF-4 RREF-5: the owner frees the value once every reference anywhere is gone. */
static int rref_release_frees_on_owner(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_dest owner = tp_to_rank(1);
        tp_rref *r = NULL;
        tp_method *inc = NULL;
        CHECK_OK(tp_method_factory("increment", &inc));
        if (CHECK_OK(remote_on(owner, "make_counter", CONF_INTS(0), TP_TIMEOUT_DEFAULT, &r)) &&
            inc) {
            tp_value *res = NULL;
            if (CHECK_OK(tp_method_call_sync(inc, r, NULL, NULL, TP_TIMEOUT_DEFAULT, &res)))
                CHECK_INT(conf_int_of(rank, res, -1), 1);
            tp_value_free(res);
            CHECK_INT(conf_sync_int(rank, owner, "live_objects", NULL, -1), 1);
            /* A third worker uses the rref and drops its reference. */
            tp_value *args = tp_value_list_of(2, tp_value_rref(r), tp_value_int(5));
            CHECK_INT(conf_sync_int(rank, tp_to_rank(2), "rref_inc", args, -1), 6);
            CHECK_OK(tp_sleep(0.2));
            CHECK_INT(conf_sync_int(rank, owner, "live_objects", NULL, -1), 1);
            /* Releasing one of our two references keeps it alive. */
            tp_rref *r2 = tp_rref_clone(r);
            tp_rref_release(r);
            r = NULL;
            CHECK_OK(tp_sleep(0.2));
            CHECK_INT(conf_sync_int(rank, owner, "live_objects", NULL, -1), 1);
            res = NULL;
            if (CHECK(r2 != NULL) &&
                CHECK_OK(tp_method_call_sync(inc, r2, NULL, NULL, TP_TIMEOUT_DEFAULT, &res)))
                CHECK_INT(conf_int_of(rank, res, -1), 7);
            tp_value_free(res);
            tp_rref_release(r2);
            CHECK_INT(conf_poll_int(rank, owner, "live_objects", 0, 5.0), 0);
        }
        tp_rref_release(r);
        tp_method_free(inc);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: METHOD-1 METHOD-2 FUNC-2: method_factory on a remote Counter: sync, async and remote. */
static int rref_method_counter(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    tp_method *inc = NULL, *get = NULL;
    CHECK_OK(tp_method_factory("increment", &inc));
    CHECK_OK(tp_method_factory("get", &get));
    tp_rref *r = NULL;
    /* Rank 0 drives a Counter on w1; rank 1 one it owns itself. */
    if (inc && get &&
        CHECK_OK(remote_on(tp_to_rank(rank == 0 ? 1 : rank), "make_counter", CONF_INTS(10),
                           TP_TIMEOUT_DEFAULT, &r))) {
        tp_value *args = CONF_INTS(5);
        tp_value *res = NULL;
        if (CHECK_OK(tp_method_call_sync(inc, r, args, NULL, TP_TIMEOUT_DEFAULT, &res)))
            CHECK_INT(conf_int_of(rank, res, -1), 15);
        tp_value_free(res);
        tp_value_free(args);
        tp_future *f = NULL;
        args = CONF_INTS(1);
        if (CHECK_OK(tp_method_call_async(inc, r, args, NULL, TP_TIMEOUT_DEFAULT, &f)) &&
            CHECK_OK(tp_future_wait(f, TP_TIMEOUT_INFINITE)))
            CHECK_INT(conf_int_of(rank, tp_future_value(f), -1), 16);
        tp_future_free(f);
        tp_value_free(args);
        res = NULL;
        if (CHECK_OK(tp_method_call_sync(inc, r, NULL, NULL, TP_TIMEOUT_DEFAULT, &res)))
            CHECK_INT(conf_int_of(rank, res, -1), 17);
        tp_value_free(res);
        tp_method *name = NULL;
        res = NULL;
        if (CHECK_OK(tp_method_factory("fn_name", &name)) &&
            CHECK_OK(tp_method_call_sync(name, r, NULL, NULL, TP_TIMEOUT_DEFAULT, &res)))
            CHECK(strcmp(conf_str_of(rank, res), "Counter.fn_name") == 0);
        tp_value_free(res);
        tp_method_free(name);
        tp_rref *r2 = NULL;
        if (CHECK_OK(tp_method_call_remote(get, r, NULL, NULL, TP_TIMEOUT_DEFAULT, &r2))) {
            CHECK(tp_rref_owner_name(r2) && strcmp(tp_rref_owner_name(r2), "w1") == 0);
            CHECK_INT(to_here_int(rank, r2, -1), 17);
        }
        tp_rref_release(r2);
    }
    tp_rref_release(r);
    tp_method_free(inc);
    tp_method_free(get);
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: METHOD-3 RREF-8 VALUE-8: a failing method, an unknown method, a method on a non-object. */
static int rref_method_errors(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_method *fail = NULL, *nope = NULL, *get = NULL;
        CHECK_OK(tp_method_factory("fail", &fail));
        CHECK_OK(tp_method_factory("nope", &nope));
        CHECK_OK(tp_method_factory("get", &get));
        tp_rref *r = NULL, *plain = NULL;
        CHECK_OK(remote_on(tp_to_rank(1), "make_counter", NULL, TP_TIMEOUT_DEFAULT, &r));
        CHECK_OK(remote_on(tp_to_rank(1), "echo", CONF_INTS(3), TP_TIMEOUT_DEFAULT, &plain));
        tp_value *res = NULL;
        if (r && fail) {
            CHECK_STATUS(tp_method_call_sync(fail, r, NULL, NULL, TP_TIMEOUT_DEFAULT, &res),
                         TP_EREMOTE);
            CHECK_CONTAINS(tp_errmsg(), "Counter.fail: deliberate failure");
            CHECK_CONTAINS(tp_errmsg(), "'w1' (id 1)");
        }
        if (r && nope) {
            CHECK_STATUS(tp_method_call_sync(nope, r, NULL, NULL, TP_TIMEOUT_DEFAULT, &res),
                         TP_EUNKNOWNFUNC);
            CHECK_CONTAINS(tp_errmsg(), "class 'Counter' has no method 'nope'");
        }
        if (plain && get) {
            CHECK_STATUS(tp_method_call_sync(get, plain, NULL, NULL, TP_TIMEOUT_DEFAULT, &res),
                         TP_ETYPE);
            CHECK_CONTAINS(tp_errmsg(), "not an object");
            tp_value_free(res);
            res = NULL;
        }
        if (r) { /* an object cannot be copied out (RREF-8, VALUE-8) */
            CHECK_STATUS(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &res), TP_ETYPE);
            CHECK_CONTAINS(tp_errmsg(), "the result of 'to_here' cannot be sent back from");
            CHECK(res == NULL);
            tp_value_free(res);
            res = NULL;
        }
        if (r && get && CHECK_OK(tp_method_call_sync(get, r, NULL, NULL, TP_TIMEOUT_DEFAULT, &res)))
            CHECK_INT(conf_int_of(rank, res, -1), 0); /* the Counter survived */
        tp_value_free(res);
        tp_method *bad = NULL;
        CHECK_STATUS(tp_method_factory("", &bad), TP_EINVAL);
        tp_method_free(bad);
        tp_rref_release(r);
        tp_rref_release(plain);
        tp_method_free(fail);
        tp_method_free(nope);
        tp_method_free(get);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: METHOD-2 VALUE-8: a method call's argument list holding an object anywhere (here
 * after an int) fails with TP_ETYPE before anything is sent, sync and remote alike. */
static int rref_method_object_argument(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_method *inc = NULL;
        tp_rref *r = NULL;
        CHECK_OK(tp_method_factory("increment", &inc));
        CHECK_OK(remote_on(tp_to_rank(1), "make_counter", CONF_INTS(4), TP_TIMEOUT_DEFAULT, &r));
        int *state = malloc(sizeof *state);
        tp_value *args = tp_value_list_of(2, tp_value_int(1), tp_value_object("Local", state, free));
        tp_value *res = NULL;
        if (inc && r) {
            CHECK_STATUS(tp_method_call_sync(inc, r, args, NULL, TP_TIMEOUT_DEFAULT, &res),
                         TP_ETYPE);
            CHECK_CONTAINS(tp_errmsg(), "objects cannot be sent");
            CHECK(res == NULL);
            tp_rref *out = NULL;
            CHECK_STATUS(tp_method_call_remote(inc, r, args, NULL, TP_TIMEOUT_DEFAULT, &out),
                         TP_ETYPE);
            CHECK(out == NULL);
            tp_rref_release(out);
            /* Nothing reached the Counter. */
            if (CHECK_OK(tp_method_call_sync(inc, r, NULL, NULL, TP_TIMEOUT_DEFAULT, &res)))
                CHECK_INT(conf_int_of(rank, res, -1), 5);
        }
        tp_value_free(res);
        tp_value_free(args);
        tp_rref_release(r);
        tp_method_free(inc);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* What the callback below saw: to_here and a send of the rref once shutdown
 * released it (rank 0 only; one case at a time). */
static struct {
    int ran;
    tp_status to_here, send;
    char send_msg[256];
} closing_seen;

/* A then-callback on rank 0 that outlives the release of its user rrefs by
 * shutdown (SHUTDOWN-4: the drain waits for it, and calls still work): it
 * waits until to_here says the rref was released, then tries to send it. */
static tp_status send_closing_rref(tp_future *f, tp_value **result, char *errmsg,
                                   size_t errmsg_len, void *user_data) {
    (void)f, (void)result, (void)errmsg, (void)errmsg_len;
    tp_rref *r = user_data;
    uint64_t t0 = conf_now_ns();
    tp_status st;
    for (;;) { /* works while the worker runs; TP_ESHUTDOWN once released */
        tp_value *v = NULL;
        st = tp_rref_to_here(r, 5.0, &v);
        tp_value_free(v);
        if (st != TP_OK || conf_since_s(t0) > 20.0)
            break;
        if (tp_sleep(0.01) != TP_OK)
            break;
    }
    closing_seen.to_here = st;
    tp_value *args = tp_value_list_of(1, tp_value_rref(r));
    tp_value *res = NULL;
    closing_seen.send = tp_rpc_sync(tp_to_rank(1), "rref_fetch", args, NULL, 10.0, &res);
    snprintf(closing_seen.send_msg, sizeof closing_seen.send_msg, "%s", tp_errmsg());
    tp_value_free(args);
    tp_value_free(res);
    closing_seen.ran = 1;
    return TP_OK;
}

/* spec: RREF-11 SHUTDOWN-4: a user rref released by a graceful shutdown is
 * closed for good while the worker still calls (its drain): to_here fails
 * with TP_ESHUTDOWN, and a call that would send it fails with TP_ESHUTDOWN
 * naming the rref, sending nothing. */
static int rref_closed_by_shutdown_never_sent(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        memset(&closing_seen, 0, sizeof closing_seen);
        tp_rref *r = NULL;
        tp_future *f = NULL, *chained = NULL;
        if (CHECK_OK(remote_on(tp_to_rank(1), "add", CONF_INTS(2, 3), TP_TIMEOUT_DEFAULT, &r)))
            CHECK_INT(to_here_int(rank, r, -1), 5);
        if (r && CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(50), &f)))
            CHECK_OK(tp_future_then(f, send_closing_rref, r, &chained));
        tp_future_free(f);
        CHECK_OK(tp_shutdown(1));
        if (chained) {
            CHECK(tp_future_done(chained));
            CHECK_STATUS(tp_future_status(chained), TP_OK);
        }
        tp_future_free(chained);
        CHECK(closing_seen.ran);
        CHECK_STATUS(closing_seen.to_here, TP_ESHUTDOWN);
        CHECK_STATUS(closing_seen.send, TP_ESHUTDOWN);
        CHECK_CONTAINS(closing_seen.send_msg, "released by shutdown");
        tp_rref_release(r);
    } else {
        CHECK_OK(tp_shutdown(1));
    }
    return conf_finish(rank);
}

/* Worker 1's owned values (debug_info's first field), or -1. */
static int64_t owned_on(int rank, int dst) {
    tp_value *res = NULL;
    int64_t n = -1;
    if (tp_rpc_sync(tp_to_rank(dst), "debug_info", NULL, NULL, TP_TIMEOUT_DEFAULT, &res) == TP_OK)
        n = conf_int_of(rank, tp_list_get(res, 0), -1);
    tp_value_free(res);
    return n;
}

/*
 * spec: RREF-23 OPT-10: worker 1 keeps at most max_remote_values (2) values
 * for worker 0's undeleted remote() calls: a third is refused with
 * TP_ELIMIT naming the limit, and once one is released a new one is taken.
 * The limit is set as a string key (OPT-6), as the Python binding does.
 */
static int rref_remote_values_limit(int rank, int ws) {
    tp_options *o = conf_options();
    CHECK_OK(tp_options_set(o, "max_remote_values", "2"));
    CHECK_INT((int64_t)tp_options_max_remote_values(o), 2);
    CHECK_STATUS(tp_options_set(o, "max_remote_values", "2x"), TP_EINVAL);
    CHECK_STATUS(tp_options_set(o, "max_remote_values", "0"), TP_EINVAL);
    CHECK_OK(tp_options_set_max_inflight_bytes(o, 65536)); /* the credit each grants (FLOW-6) */
    tp_status st = conf_init_opts(rank, ws, o);
    tp_options_free(o);
    if (!CHECK_OK(st))
        return conf_finish(rank);
    if (rank == 0) {
        tp_rref *r[3] = {NULL, NULL, NULL};
        for (int i = 0; i < 3; i++) {
            tp_value *args = CONF_INTS(i, 10);
            CHECK_OK(tp_remote(tp_to_rank(1), "add", args, NULL, TP_TIMEOUT_DEFAULT, &r[i]));
            tp_value_free(args);
        }
        CHECK_INT(to_here_int(rank, r[0], -1), 10);
        CHECK_INT(to_here_int(rank, r[1], -1), 11);
        tp_value *v = NULL;
        CHECK_STATUS(tp_rref_to_here(r[2], TP_TIMEOUT_DEFAULT, &v), TP_ELIMIT);
        CHECK_CONTAINS(tp_errmsg(), "max_remote_values");
        CHECK_CONTAINS(tp_errmsg(), "'w1' (id 1)");
        tp_value_free(v);
        tp_rref_release(r[2]);
        tp_rref_release(r[0]); /* its delete frees a place on worker 1 */
        uint64_t t0 = conf_now_ns();
        while (owned_on(rank, 1) > 1 && conf_since_s(t0) < 10)
            (void)tp_sleep(0.01);
        tp_value *args = CONF_INTS(5, 10);
        CHECK_OK(tp_remote(tp_to_rank(1), "add", args, NULL, TP_TIMEOUT_DEFAULT, &r[0]));
        tp_value_free(args);
        CHECK_INT(to_here_int(rank, r[0], -1), 15);
        tp_rref_release(r[0]);
        tp_rref_release(r[1]);
        t0 = conf_now_ns();
        while (owned_on(rank, 1) != 0 && conf_since_s(t0) < 10)
            (void)tp_sleep(0.01);
        CHECK_INT(owned_on(rank, 1), 0); /* the refused one left nothing behind */
        /* Nor in worker 1's count of worker 0's request bytes (FLOW-8): with
         * none held, a lone call over the 64 KiB credit is taken. */
        uint8_t *big = calloc(1, 100000);
        tp_value *res = NULL;
        if (CHECK(big) &&
            CHECK_OK(conf_sync(tp_to_rank(1), "echo",
                               tp_value_list_of(1, tp_value_bytes(big, 100000)), &res)))
            CHECK(tp_value_kind(res) == TP_KIND_BYTES);
        tp_value_free(res);
        free(big);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

const tp_conformance_case conf_cases_rref[] = {
    {"rref_remote_to_here", 2, rref_remote_to_here, "RREF-2 RREF-8"},
    {"rref_remote_values_limit", 2, rref_remote_values_limit, "RREF-23 OPT-10"},
    {"rref_remote_self", 2, rref_remote_self, "RREF-2 RREF-10 RREF-11"},
    {"rref_local_value_waits_for_its_value", 2, rref_local_value_waits_for_its_value,
     "RREF-10 OPT-2"},
    {"rref_owner_info", 3, rref_owner_info, "RREF-1 RREF-11"},
    {"rref_confirmed_by_owner", 2, rref_confirmed_by_owner, "RREF-2 RREF-11"},
    {"rref_local_value_not_owner", 2, rref_local_value_not_owner, "RREF-10 ERR-2"},
    {"rref_as_argument", 3, rref_as_argument, "RREF-6 RREF-7 VALUE-7"},
    {"rref_as_result", 3, rref_as_result, "RREF-6 RREF-7"},
    {"rref_run_after_confirm", 3, rref_run_after_confirm, "RREF-13 RREF-6"},
    {"rref_to_here_timeout_then_success", 2, rref_to_here_timeout_then_success, "RREF-9 TIMEOUT-5"},
    {"rref_remote_failure", 2, rref_remote_failure, "RREF-2 RREF-8 CALL-5"},
    {"rref_failed_creation_one_fact", 3, rref_failed_creation_one_fact, "RREF-14 RREF-2"},
    {"rref_debug_info_back_to_zero", 3, rref_debug_info_back_to_zero, "RREF-16"},
    {"rref_release_frees_on_owner", 3, rref_release_frees_on_owner, "RREF-3 RREF-4 RREF-5"},
    {"rref_share_every_direction", 3, rref_share_every_direction,
     "RREF-5 RREF-6 RREF-7 RREF-3 RREF-18"},
    {"rref_method_counter", 2, rref_method_counter, "METHOD-1 METHOD-2 FUNC-2"},
    {"rref_method_errors", 2, rref_method_errors, "METHOD-3 RREF-8 VALUE-8"},
    {"rref_method_object_argument", 2, rref_method_object_argument, "METHOD-2 VALUE-8"},
    {"rref_closed_by_shutdown_never_sent", 2, rref_closed_by_shutdown_never_sent,
     "RREF-11 SHUTDOWN-4"},
};
const size_t conf_cases_rref_count = sizeof conf_cases_rref / sizeof conf_cases_rref[0];
