/*
 * cases_async.c: futures the program completes, done-callbacks, collect_all,
 * functions that answer later, local rrefs, rref proxies, and the
 * parameter server built from them.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

/* Done-callbacks' log: which callback ran, in order (one worker at a time). */
static _Atomic int done_log[8];
static atomic_int done_n;

static void log_done(tp_future *f, void *user_data) {
    int n = atomic_fetch_add(&done_n, 1);
    if (n < 8) /* the callback's tag, negated when f was not done */
        atomic_store(&done_log[n], tp_future_done(f) ? (int)(intptr_t)user_data
                                                     : -(int)(intptr_t)user_data);
}

/* Waits (backend time) until done_n reaches want or 5 s pass. */
static int wait_done_n(int want) {
    uint64_t t0 = conf_now_ns();
    while (atomic_load(&done_n) < want && conf_since_s(t0) < 5.0)
        if (tp_sleep(0.005) != TP_OK)
            break;
    return atomic_load(&done_n);
}

static tp_status plus_one(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                          void *user_data) {
    (void)user_data;
    int64_t x;
    if (tp_value_get_int(tp_future_value(f), &x) != TP_OK) {
        snprintf(errmsg, errmsg_len, "plus_one: the parent has no int");
        return TP_ETYPE;
    }
    *result = tp_value_int(x + 1);
    return TP_OK;
}

/* spec: FUTURE-9 FUTURE-10: a future the program completes, once; its waiters,
 * then-callbacks and done-callbacks see it; a call's future cannot be completed
 * by the user; one left pending fails at shutdown. */
static int futures_user_completed(int rank, int ws) {
    tp_future *early = NULL;
    CHECK_STATUS(tp_future_new(&early), TP_ENOTINIT);
    CHECK(early == NULL);
    CONF_INIT_OR_RETURN(rank, ws);
    atomic_store(&done_n, 0);
    tp_future *f = NULL, *chained = NULL, *failed = NULL, *left = NULL, *call = NULL;
    if (CHECK_OK(tp_future_new(&f))) {
        CHECK(!tp_future_done(f));
        CHECK_OK(tp_future_add_done_callback(f, log_done, (void *)1));
        CHECK_OK(tp_future_then(f, plus_one, NULL, &chained));
        CHECK_OK(tp_future_add_done_callback(f, log_done, (void *)2));
        CHECK_STATUS(tp_future_wait(f, 0.02), TP_ETIMEDOUT);
        CHECK_OK(tp_future_set_result(f, tp_value_int(41)));
        CHECK_OK(tp_future_wait(f, TP_TIMEOUT_INFINITE));
        CHECK_INT(conf_int_of(rank, tp_future_value(f), -1), 41);
        /* Once only: the second completion is refused, its value freed. */
        CHECK_STATUS(tp_future_set_result(f, tp_value_str("again")), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "already complete");
        CHECK_STATUS(tp_future_set_error(f, TP_EIO, "late"), TP_EINVAL);
        CHECK_INT(conf_int_of(rank, tp_future_value(f), -1), 41);
        CHECK_OK(tp_future_wait(chained, TP_TIMEOUT_INFINITE));
        CHECK_INT(conf_int_of(rank, tp_future_value(chained), -1), 42);
        CHECK_INT(wait_done_n(2), 2);
        /* Both ran, each once, with f done; queued in order, but a pool of
         * several threads may run them at once (FUTURE-10). */
        CHECK_INT(atomic_load(&done_log[0]) + atomic_load(&done_log[1]), 3);
        CHECK_INT(atomic_load(&done_log[0]) * atomic_load(&done_log[1]), 2);
        /* Added after completion: runs too. */
        CHECK_OK(tp_future_add_done_callback(f, log_done, (void *)3));
        CHECK_INT(wait_done_n(3), 3);
        CHECK_INT(atomic_load(&done_log[2]), 3); /* the first two finished before */
    }
    if (CHECK_OK(tp_future_new(&failed))) {
        CHECK_STATUS(tp_future_set_error(failed, TP_OK, "no"), TP_EINVAL);
        CHECK(!tp_future_done(failed));
        CHECK_OK(tp_future_set_error(failed, TP_ETYPE, "a deliberate user error"));
        CHECK_STATUS(tp_future_wait(failed, TP_TIMEOUT_INFINITE), TP_ETYPE);
        CHECK_CONTAINS(tp_future_error(failed), "a deliberate user error");
    }
    /* No message, or an empty one: the status's own text stands in. */
    for (int i = 0; i < 2; i++) {
        tp_future *bare = NULL;
        if (!CHECK_OK(tp_future_new(&bare)))
            break;
        CHECK_OK(tp_future_set_error(bare, TP_ELIMIT, i ? "" : NULL));
        CHECK_STATUS(tp_future_wait(bare, TP_TIMEOUT_INFINITE), TP_ELIMIT);
        CHECK(tp_future_error(bare) && strcmp(tp_future_error(bare), tp_strerror(TP_ELIMIT)) == 0);
        tp_future_free(bare);
    }
    /* A call's future belongs to the call. */
    if (CHECK_OK(conf_async(tp_to_rank(rank), "sleep_ms", CONF_INTS(50), &call))) {
        CHECK_STATUS(tp_future_set_result(call, tp_value_int(7)), TP_EINVAL);
        CHECK_CONTAINS(tp_errmsg(), "belongs to a call");
        CHECK_OK(tp_future_wait(call, TP_TIMEOUT_INFINITE));
        CHECK_INT(conf_int_of(rank, tp_future_value(call), -1), 50);
    }
    CHECK_OK(tp_future_new(&left));
    CHECK_OK(tp_shutdown(1));
    /* Nobody can complete it now: it failed with the worker. */
    CHECK(tp_future_done(left));
    CHECK_STATUS(tp_future_status(left), TP_ESHUTDOWN);
    CHECK(tp_future_set_result(left, tp_value_int(1)) != TP_OK);
    tp_future_free(f);
    tp_future_free(chained);
    tp_future_free(failed);
    tp_future_free(left);
    tp_future_free(call);
    return conf_finish(rank);
}

/* spec: FUTURE-11: collect_all completes only when every future did, failures
 * included, and reports each status in order. */
static int futures_collect_all(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future *fs[3] = {NULL, NULL, NULL}, *all = NULL, *none = NULL;
        CHECK_OK(conf_async(tp_to_rank(1), "boom", NULL, &fs[0]));
        CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(100), &fs[1]));
        CHECK_OK(tp_future_new(&fs[2]));
        if (CHECK_OK(tp_future_collect_all(fs, 3, &all))) {
            CHECK_STATUS(tp_future_wait(fs[0], TP_TIMEOUT_INFINITE), TP_EREMOTE);
            CHECK_OK(tp_future_wait(fs[1], TP_TIMEOUT_INFINITE));
            CHECK(!tp_future_done(all)); /* a failure does not cut it short */
            CHECK_STATUS(tp_future_wait(all, 0.05), TP_ETIMEDOUT);
            CHECK_OK(tp_future_set_result(fs[2], tp_value_str("last")));
            CHECK_OK(tp_future_wait(all, TP_TIMEOUT_INFINITE));
            const tp_value *st = tp_future_value(all);
            CHECK_INT(tp_list_len(st), 3);
            CHECK_INT(conf_int_of(rank, tp_list_get(st, 0), -1), TP_EREMOTE);
            CHECK_INT(conf_int_of(rank, tp_list_get(st, 1), -1), TP_OK);
            CHECK_INT(conf_int_of(rank, tp_list_get(st, 2), -1), TP_OK);
            /* The futures keep their own outcomes. */
            CHECK_CONTAINS(tp_future_error(fs[0]), "boom");
            CHECK_INT(conf_int_of(rank, tp_future_value(fs[1]), -1), 100);
        }
        if (CHECK_OK(tp_future_collect_all(NULL, 0, &none))) {
            CHECK(tp_future_done(none));
            CHECK_INT(tp_list_len(tp_future_value(none)), 0);
        }
        CHECK_STATUS(tp_future_collect_all(fs, 3, NULL), TP_EINVAL);
        for (int i = 0; i < 3; i++)
            tp_future_free(fs[i]);
        tp_future_free(all);
        tp_future_free(none);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUNC-7: a function that answers later frees its pool thread at once:
 * with one thread, three held calls leave room for a fourth; the release
 * answers all three, with a value or with an error. */
static int answer_later_frees_the_pool(int rank, int ws) {
    tp_options *opts = conf_options();
    tp_options_set_num_worker_threads(opts, 1);
    tp_status ist = conf_init_opts(rank, ws, opts);
    tp_options_free(opts);
    if (!CHECK_OK(ist))
        return conf_finish(rank);
    if (rank == 0) {
        for (int round = 0; round < 2; round++) {
            tp_future *held[3] = {NULL, NULL, NULL};
            for (int i = 0; i < 3; i++)
                CHECK_OK(conf_async(tp_to_rank(1), "later_hold", NULL, &held[i]));
            /* Served while the three wait: none holds the only thread. */
            tp_value *sum = NULL;
            tp_value *two = tp_value_list_of(2, tp_value_int(2), tp_value_int(3));
            CHECK_OK(tp_rpc_sync(tp_to_rank(1), "add", two, NULL, 5.0, &sum));
            tp_value_free(two);
            CHECK_INT(conf_int_of(rank, sum, -1), 5);
            tp_value_free(sum);
            for (int i = 0; i < 3; i++)
                CHECK(held[i] && !tp_future_done(held[i]));
            tp_value *rel = tp_value_list_of(2, tp_value_int(77), tp_value_int(round));
            CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "later_release", rel, -1), 3);
            for (int i = 0; i < 3; i++) {
                if (!held[i])
                    continue;
                if (round == 0) {
                    CHECK_OK(tp_future_wait(held[i], TP_TIMEOUT_INFINITE));
                    CHECK_INT(conf_int_of(rank, tp_future_value(held[i]), -1), 77);
                } else { /* the future's error is the function's failure */
                    CHECK_STATUS(tp_future_wait(held[i], TP_TIMEOUT_INFINITE), TP_EREMOTE);
                    CHECK_CONTAINS(tp_future_error(held[i]), "function 'later_hold' on");
                    CHECK_CONTAINS(tp_future_error(held[i]), "released with an error");
                }
                tp_future_free(held[i]);
            }
        }
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUNC-7 FUNC-6 RREF-2: answers forwarded from another call, also from
 * a non-blocking function and into a remote()'s rref; a call has one answer. */
static int answer_later_forwarded(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        /* w1 answers with add(20, 22) called back on w0. */
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "later_chain", CONF_INTS(0, 20, 22), -1), 42);
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "nb_later_chain", CONF_INTS(2, 1, 2), -1),
                  3);
        tp_rref *r = NULL, *h = NULL;
        tp_value *args = CONF_INTS(0, 5, 6);
        CHECK_OK(tp_remote(tp_to_rank(1), "later_chain", args, NULL, TP_TIMEOUT_DEFAULT, &r));
        tp_value_free(args);
        CHECK_OK(tp_remote(tp_to_rank(1), "later_hold", NULL, NULL, TP_TIMEOUT_DEFAULT, &h));
        tp_value *v = NULL;
        if (r && CHECK_OK(tp_rref_to_here(r, TP_TIMEOUT_INFINITE, &v)))
            CHECK_INT(conf_int_of(rank, v, -1), 11);
        tp_value_free(v);
        v = NULL;
        if (h) {
            CHECK_STATUS(tp_rref_to_here(h, 0.05, &v), TP_ETIMEDOUT); /* not answered yet */
            tp_value *rel = tp_value_list_of(2, tp_value_str("held"), tp_value_int(0));
            CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "later_release", rel, -1), 1);
            if (CHECK_OK(tp_rref_to_here(h, TP_TIMEOUT_INFINITE, &v)))
                CHECK(strcmp(conf_str_of(rank, v), "held") == 0);
            tp_value_free(v);
        }
        tp_rref_release(r);
        tp_rref_release(h);
        /* One answer per call. */
        tp_value *res = NULL;
        CHECK_STATUS(conf_sync(tp_to_rank(1), "later_both", NULL, &res), TP_EREMOTE);
        CHECK_CONTAINS(tp_errmsg(), "one answer");
        tp_value_free(res);
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "later_twice", NULL, -1), TP_EINVAL);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: RREF-17 RREF-3: an rref made from a local value: owned here, passed
 * to a user who reads it and calls its methods; freed once both let go. */
static int rref_from_local_value(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_rref *num = NULL, *obj = NULL;
        CHECK_STATUS(tp_rref_from_value(tp_value_int(1), NULL), TP_EINVAL);
        if (CHECK_OK(tp_rref_from_value(tp_value_int(41), &num))) {
            CHECK(tp_rref_is_owner(num));
            CHECK(tp_rref_confirmed_by_owner(num));
            /* tp_rref_ids: made here, an id of this worker's; an owner has no fork. */
            tp_rref_gid id = {99, 99}, fork = {99, 99};
            CHECK_STATUS(tp_rref_ids(NULL, &id, &fork), TP_EINVAL);
            CHECK_STATUS(tp_rref_ids(num, &id, NULL), TP_EINVAL); /* ERR-3 */
            CHECK_CONTAINS(tp_errmsg(), "rref_ids: an out pointer is NULL");
            CHECK_STATUS(tp_rref_ids(num, NULL, &fork), TP_EINVAL);
            CHECK_CONTAINS(tp_errmsg(), "rref_ids: an out pointer is NULL");
            if (CHECK_OK(tp_rref_ids(num, &id, &fork))) {
                CHECK_INT(id.worker, 0);
                CHECK(id.local >= 1);
                CHECK(fork.worker == 0 && fork.local == 0);
            }
            const tp_value *lv = NULL;
            CHECK_OK(tp_rref_local_value(num, &lv));
            CHECK_INT(conf_int_of(rank, lv, -1), 41);
            /* RREF-8: to_here on the owner is a copy of its value. */
            tp_value *here = NULL;
            if (CHECK_OK(tp_rref_to_here(num, TP_TIMEOUT_DEFAULT, &here)))
                CHECK_INT(conf_int_of(rank, here, -1), 41);
            tp_value_free(here);
            tp_value *args = tp_value_list_of(1, tp_value_rref(num));
            CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "rref_fetch", args, -1), 41);
            /* On w1 it is a user reference to w0's value, confirmed. */
            tp_value *info = NULL;
            args = tp_value_list_of(1, tp_value_rref(num));
            if (CHECK_OK(conf_sync(tp_to_rank(1), "rref_info", args, &info))) {
                int is_owner = -1, confirmed = -1;
                CHECK_OK(tp_value_get_bool(tp_list_get(info, 0), &is_owner));
                CHECK_OK(tp_value_get_bool(tp_list_get(info, 2), &confirmed));
                CHECK_INT(is_owner, 0);
                CHECK(strcmp(conf_str_of(rank, tp_list_get(info, 1)), conf_name(0)) == 0);
                CHECK_INT(confirmed, 1);
            }
            tp_value_free(info);
        }
        if (CHECK_OK(tp_rref_from_value(conf_counter_new(0, 10), &obj))) {
            CHECK_INT(conf_live_objects(0), 1);
            /* VALUE-8: on its owner too, an object cannot be copied out by
             * to_here: TP_ETYPE, naming why, and the object stays. */
            tp_value *here = NULL;
            CHECK_STATUS(tp_rref_to_here(obj, TP_TIMEOUT_DEFAULT, &here), TP_ETYPE);
            CHECK_CONTAINS(tp_errmsg(), "the rref holds an object, which stays on its owner");
            CHECK(here == NULL);
            tp_value_free(here);
            const tp_value *lv = NULL;
            if (CHECK_OK(tp_rref_local_value(obj, &lv)))
                CHECK(tp_value_kind(lv) == TP_KIND_OBJECT);
            CHECK_INT(conf_live_objects(0), 1);
            tp_value *args = tp_value_list_of(2, tp_value_rref(obj), tp_value_int(5));
            CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "rref_inc", args, -1), 15);
            tp_value *got = NULL;
            if (CHECK_OK(tp_rref_rpc_sync(obj, "get", NULL, NULL, TP_TIMEOUT_DEFAULT, &got)))
                CHECK_INT(conf_int_of(rank, got, -1), 15);
            tp_value_free(got);
        }
        tp_rref_release(num);
        tp_rref_release(obj);
        uint64_t t0 = conf_now_ns();
        while (conf_live_objects(0) != 0 && conf_since_s(t0) < 5.0)
            tp_sleep(0.01);
        CHECK_INT(conf_live_objects(0), 0);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: METHOD-4: rref.rpc_sync().m(), rref.rpc_async().m(), rref.remote().m(). */
static int rref_proxies(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_rref *r = NULL, *r2 = NULL;
        tp_value *start = CONF_INTS(3);
        CHECK_OK(tp_remote(tp_to_rank(1), "make_counter", start, NULL, TP_TIMEOUT_DEFAULT, &r));
        tp_value_free(start);
        tp_value *four = CONF_INTS(4), *got = NULL;
        if (CHECK_OK(tp_rref_rpc_sync(r, "increment", four, NULL, TP_TIMEOUT_DEFAULT, &got)))
            CHECK_INT(conf_int_of(rank, got, -1), 7);
        tp_value_free(four);
        tp_value_free(got);
        tp_future *f = NULL;
        if (CHECK_OK(tp_rref_rpc_async(r, "get", NULL, NULL, TP_TIMEOUT_DEFAULT, &f))) {
            CHECK_OK(tp_future_wait(f, TP_TIMEOUT_INFINITE));
            CHECK_INT(conf_int_of(rank, tp_future_value(f), -1), 7);
        }
        tp_future_free(f);
        tp_value *one = CONF_INTS(1), *v = NULL;
        if (CHECK_OK(tp_rref_remote(r, "increment", one, NULL, TP_TIMEOUT_DEFAULT, &r2)) &&
            CHECK_OK(tp_rref_to_here(r2, TP_TIMEOUT_INFINITE, &v)))
            CHECK_INT(conf_int_of(rank, v, -1), 8);
        tp_value_free(one);
        tp_value_free(v);
        got = NULL;
        CHECK_STATUS(tp_rref_rpc_sync(r, "no such", NULL, NULL, TP_TIMEOUT_DEFAULT, &got),
                     TP_EINVAL);
        CHECK_STATUS(tp_rref_rpc_sync(r, "nope", NULL, NULL, TP_TIMEOUT_DEFAULT, &got),
                     TP_EUNKNOWNFUNC);
        CHECK_CONTAINS(tp_errmsg(), "class 'Counter' has no method 'nope'");
        CHECK_STATUS(tp_rref_rpc_sync(NULL, "get", NULL, NULL, TP_TIMEOUT_DEFAULT, &got),
                     TP_EINVAL);
        CHECK(got == NULL);
        tp_rref_release(r);
        tp_rref_release(r2);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUNC-7 FUTURE-9: the batch-updating parameter server: each round, the
 * two trainers' gradients are answered together with the updated weights;
 * the server has one pool thread, so a call holding it would stall the round. */
static int param_server_batch(int rank, int ws) {
    tp_options *opts = conf_options();
    if (rank == 0)
        tp_options_set_num_worker_threads(opts, 1);
    tp_status ist = conf_init_opts(rank, ws, opts);
    tp_options_free(opts);
    if (!CHECK_OK(ist))
        return conf_finish(rank);
    if (rank > 0) {
        int trainers = ws - 1;
        int64_t want[CONF_PS_DIM];
        for (int i = 0; i < CONF_PS_DIM; i++)
            want[i] = 100 * (i + 1);
        for (int round = 1; round <= 3; round++) {
            for (int i = 0; i < CONF_PS_DIM; i++)
                for (int t = 1; t <= trainers; t++)
                    want[i] -= (int64_t)t * round * (i + 1);
            tp_value *grads = tp_value_list();
            for (int i = 0; i < CONF_PS_DIM; i++)
                tp_list_append(grads, tp_value_int((int64_t)rank * round * (i + 1)));
            tp_value *args = tp_value_list_of(2, tp_value_int(trainers), grads);
            tp_value *w = NULL;
            if (CHECK_OK(tp_rpc_sync(tp_to_rank(0), "ps_update", args, NULL, 10.0, &w))) {
                CHECK_INT(tp_list_len(w), CONF_PS_DIM);
                for (int i = 0; i < CONF_PS_DIM; i++)
                    CHECK_INT(conf_int_of(rank, tp_list_get(w, (size_t)i), -1), want[i]);
            }
            tp_value_free(args);
            tp_value_free(w);
        }
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

const tp_conformance_case conf_cases_async[] = {
    {"futures_user_completed", 1, futures_user_completed, "FUTURE-9 FUTURE-10"},
    {"futures_collect_all", 2, futures_collect_all, "FUTURE-11"},
    {"answer_later_frees_the_pool", 2, answer_later_frees_the_pool, "FUNC-7"},
    {"answer_later_forwarded", 3, answer_later_forwarded, "FUNC-7 FUNC-6 RREF-2"},
    {"rref_from_local_value", 2, rref_from_local_value, "RREF-17 RREF-3"},
    {"rref_proxies", 2, rref_proxies, "METHOD-4"},
    {"param_server_batch", 3, param_server_batch, "FUNC-7 FUTURE-9"},
};
const size_t conf_cases_async_count = sizeof conf_cases_async / sizeof conf_cases_async[0];
