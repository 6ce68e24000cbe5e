/*
 * cases_calls.c: calls and values: destinations, sync/async, nesting,
 * concurrency, and every value kind across the wire.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

/* whoami on dest must answer want. */
static void check_whoami(int rank, tp_dest dest, const char *want) {
    tp_value *res = NULL;
    if (CHECK_OK(conf_sync(dest, "whoami", NULL, &res)))
        CHECK(strcmp(conf_str_of(rank, res), want) == 0);
    tp_value_free(res);
}

/* spec: CALL-2 CALL-3: a worker calls itself by name, by rank and by info. */
static int calls_self_by_name_rank_info(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    tp_worker_info me;
    CHECK_OK(tp_get_worker_info(NULL, &me));
    CHECK_INT(conf_sync_int(rank, tp_to_name(conf_name(rank)), "add", CONF_INTS(1, 2), -1), 3);
    CHECK_INT(conf_sync_int(rank, tp_to_rank(rank), "add", CONF_INTS(3, 4), -1), 7);
    CHECK_INT(conf_sync_int(rank, tp_to_info(&me), "add", CONF_INTS(5, 6), -1), 11);
    check_whoami(rank, tp_to_name(conf_name(rank)), conf_name(rank));
    check_whoami(rank, tp_to_rank(rank), conf_name(rank));
    check_whoami(rank, tp_to_info(&me), conf_name(rank));
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: CALL-2: destinations by name, rank and worker info reach the same worker. */
static int calls_dest_by_name_rank_info(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    int peer = (rank + 1) % ws;
    tp_worker_info info;
    CHECK_OK(tp_get_worker_info(conf_name(peer), &info));
    CHECK_INT(info.id, peer);
    check_whoami(rank, tp_to_name(conf_name(peer)), conf_name(peer));
    check_whoami(rank, tp_to_rank(peer), conf_name(peer));
    check_whoami(rank, tp_to_info(&info), conf_name(peer));
    CHECK_INT(conf_sync_int(rank, tp_to_info(&info), "add", CONF_INTS(rank, 100), -1), rank + 100);
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: CALL-2 ERR-3: a bad worker name fails before sending, naming the worker. */
static int calls_unknown_worker_name(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *res = NULL;
        CHECK_STATUS(tp_rpc_sync(tp_to_name("nobody"), "add", NULL, NULL, TP_TIMEOUT_DEFAULT, &res),
                     TP_EUNKNOWNWORKER);
        CHECK_CONTAINS(tp_errmsg(), "nobody");
        CHECK(res == NULL);
        tp_value_free(res);
        tp_future *f = NULL;
        CHECK_STATUS(tp_rpc_async(tp_to_name("nobody2"), "add", NULL, NULL, TP_TIMEOUT_DEFAULT, &f),
                     TP_EUNKNOWNWORKER);
        CHECK_CONTAINS(tp_errmsg(), "nobody2");
        CHECK(f == NULL);
        tp_future_free(f);
        tp_rref *r = NULL;
        CHECK_STATUS(tp_remote(tp_to_name("nobody3"), "add", NULL, NULL, TP_TIMEOUT_DEFAULT, &r),
                     TP_EUNKNOWNWORKER);
        CHECK_CONTAINS(tp_errmsg(), "nobody3");
        CHECK(r == NULL);
        tp_rref_release(r);
        /* The worker goes on serving and calling. */
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(1, 1), -1), 2);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: CALL-2 ERR-3: ranks outside [0, world_size) and inconsistent infos are rejected. */
static int calls_rank_out_of_range(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *res = NULL;
        CHECK_STATUS(conf_sync(tp_to_rank(ws), "add", CONF_INTS(1, 1), &res), TP_EUNKNOWNWORKER);
        CHECK_CONTAINS(tp_errmsg(), "2");
        tp_value_free(res);
        CHECK_STATUS(conf_sync(tp_to_rank(-1), "add", CONF_INTS(1, 1), &res), TP_EUNKNOWNWORKER);
        tp_value_free(res);
        CHECK_STATUS(conf_sync(tp_to_rank(1000), "add", CONF_INTS(1, 1), &res), TP_EUNKNOWNWORKER);
        CHECK_CONTAINS(tp_errmsg(), "1000");
        tp_value_free(res);
        tp_future *f = NULL;
        CHECK_STATUS(conf_async(tp_to_rank(ws + 3), "add", NULL, &f), TP_EUNKNOWNWORKER);
        CHECK(f == NULL);
        tp_future_free(f);
        /* An info whose name and id disagree names no single worker. */
        tp_worker_info bad = {.id = 0};
        strcpy(bad.name, "w1");
        CHECK_STATUS(conf_sync(tp_to_info(&bad), "whoami", NULL, &res), TP_EUNKNOWNWORKER);
        CHECK(res == NULL); /* ERR-3: out pointers are NULL on failure */
        tp_value_free(res);
        /* Nor one whose id is just past the last rank (a forged or stale
         * info): refused before the table is looked at. */
        bad.id = (uint32_t)ws;
        CHECK_STATUS(conf_sync(tp_to_info(&bad), "whoami", NULL, &res), TP_EUNKNOWNWORKER);
        CHECK_CONTAINS(tp_errmsg(), "names no worker here");
        tp_value_free(res);
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(2, 2), -1), 4);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: CALL-4 CALL-9 FUTURE-1: rpc_async returns at once and completes later. */
static int calls_async_returns_at_once(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future *f = NULL;
        uint64_t t0 = conf_now_ns();
        /* conf_async frees the args as soon as rpc_async returns (CALL-4). */
        CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(300), &f));
        CHECK(conf_since_s(t0) < 0.2);
        CHECK(f && !tp_future_done(f));
        if (f && CHECK_OK(tp_future_wait(f, TP_TIMEOUT_INFINITE))) {
            CHECK(conf_since_s(t0) >= 0.29);
            CHECK_INT(conf_int_of(rank, tp_future_value(f), -1), 300);
        }
        tp_future_free(f);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUNC-4: a function may call other workers, including its caller's caller. */
static int calls_nested_three_workers(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *args = tp_value_list_of(4, tp_value_int(2), tp_value_str("add"), tp_value_int(3),
                                          tp_value_int(4));
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "nested", args, -1), 7);
        /* w0 -> w1 -> w2 -> w0 (w0 is blocked in this call and must still serve). */
        args = tp_value_list_of(6, tp_value_int(2), tp_value_str("nested"), tp_value_int(0),
                                tp_value_str("add"), tp_value_int(5), tp_value_int(6));
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "nested", args, -1), 11);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUNC-4 FUTURE-8: two workers each block in a call that calls back the other. */
static int calls_nested_back_to_caller(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    int peer = 1 - rank;
    tp_value *res = NULL;
    tp_value *args = tp_value_list_of(2, tp_value_int(rank), tp_value_str("whoami"));
    if (CHECK_OK(conf_sync(tp_to_rank(peer), "nested", args, &res)))
        CHECK(strcmp(conf_str_of(rank, res), conf_name(rank)) == 0);
    tp_value_free(res);
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

#define CONCURRENT_CALLS 1000

/* spec: CALL-9 FUTURE-6: 1000 async calls in flight at once all complete correctly. */
static int calls_1000_concurrent_async(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_future **fs = calloc(CONCURRENT_CALLS, sizeof *fs);
        size_t issued = 0;
        for (size_t i = 0; fs && i < CONCURRENT_CALLS; i++) {
            if (!CHECK_OK(conf_async(tp_to_rank(1), "add", CONF_INTS((int64_t)i, 1000), &fs[i])))
                break;
            issued++;
        }
        CHECK_INT(issued, CONCURRENT_CALLS);
        size_t failed = (size_t)-1;
        CHECK_OK(tp_future_wait_all(fs, issued, TP_TIMEOUT_INFINITE, &failed));
        int wrong = 0;
        for (size_t i = 0; i < issued; i++) {
            int64_t x = -1;
            if (tp_future_status(fs[i]) != TP_OK ||
                tp_value_get_int(tp_future_value(fs[i]), &x) != TP_OK || x != (int64_t)i + 1000)
                wrong++;
            tp_future_free(fs[i]);
        }
        CHECK_INT(wrong, 0);
        free(fs);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUNC-2: NULL args and kwargs arrive as an empty list and an empty map. */
static int calls_null_args_kwargs(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *res = NULL;
        if (CHECK_OK(
                tp_rpc_sync(tp_to_rank(1), "arg_counts", NULL, NULL, TP_TIMEOUT_DEFAULT, &res))) {
            CHECK_INT(tp_list_len(res), 2);
            CHECK_INT(conf_int_of(rank, tp_list_get(res, 0), -1), 0);
            CHECK_INT(conf_int_of(rank, tp_list_get(res, 1), -1), 0);
        }
        tp_value_free(res);
        tp_value *args = CONF_INTS(1, 2, 3);
        tp_value *kw = tp_value_map();
        CHECK_OK(tp_map_set(kw, "x", tp_value_int(1)));
        CHECK_OK(tp_map_set(kw, "y", tp_value_nil()));
        if (CHECK_OK(
                tp_rpc_sync(tp_to_rank(1), "arg_counts", args, kw, TP_TIMEOUT_DEFAULT, &res))) {
            CHECK_INT(conf_int_of(rank, tp_list_get(res, 0), -1), 3);
            CHECK_INT(conf_int_of(rank, tp_list_get(res, 1), -1), 2);
        }
        tp_value_free(res);
        tp_value_free(args);
        tp_value_free(kw);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: CALL-9 VALUE-4: kwargs travel by name and keep their insertion order. */
static int calls_kwargs_map(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *kw = tp_value_map();
        CHECK_OK(tp_map_set(kw, "b", tp_value_int(3)));
        CHECK_OK(tp_map_set(kw, "a", tp_value_int(10)));
        tp_value *res = NULL;
        if (CHECK_OK(tp_rpc_sync(tp_to_rank(1), "kw_sub", NULL, kw, TP_TIMEOUT_DEFAULT, &res)))
            CHECK_INT(conf_int_of(rank, res, -1), 7);
        tp_value_free(res);
        tp_value_free(kw);

        kw = tp_value_map();
        const char *keys[] = {"zeta", "alpha", "mid", "_", "k-2"};
        for (int i = 0; i < 5; i++)
            CHECK_OK(tp_map_set(kw, keys[i], tp_value_int(i * 11)));
        CHECK_OK(tp_map_set(kw, "alpha", tp_value_str("replaced"))); /* keeps its place */
        res = NULL;
        if (CHECK_OK(
                tp_rpc_sync(tp_to_rank(1), "echo_kwargs", NULL, kw, TP_TIMEOUT_DEFAULT, &res))) {
            CHECK(tp_value_equal(res, kw));
            CHECK_INT(tp_map_len(res), 5);
            for (size_t i = 0; i < 5 && i < tp_map_len(res); i++)
                CHECK(tp_map_key_at(res, i) && strcmp(tp_map_key_at(res, i), keys[i]) == 0);
            CHECK(strcmp(conf_str_of(rank, tp_map_get(res, "alpha")), "replaced") == 0);
        }
        tp_value_free(res);
        tp_value_free(kw);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* Sends v (transferred) through echo on dest and checks it comes back equal. */
static void check_echo(int rank, tp_dest dest, tp_value *v, const char *what) {
    tp_value *args = tp_value_list_of(1, tp_value_clone(v));
    tp_value *res = NULL;
    tp_status st = conf_sync(dest, "echo", args, &res);
    if (!CHECK_OK(st))
        conf_fail(rank, __FILE__, __LINE__, "echo of %s failed", what);
    else if (!tp_value_equal(res, v)) {
        char a[160], b[160];
        tp_value_format(v, a, sizeof a);
        tp_value_format(res, b, sizeof b);
        conf_fail(rank, __FILE__, __LINE__, "echo of %s: sent %s, got %s", what, a, b);
    }
    tp_value_free(res);
    tp_value_free(v);
}

/* spec: VALUE-2 VALUE-4 VALUE-9: scalars, strings and nested containers round-trip. */
static int calls_scalar_and_container_values(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_dest d = tp_to_rank(1);
        check_echo(rank, d, tp_value_nil(), "nil");
        check_echo(rank, d, tp_value_bool(1), "true");
        check_echo(rank, d, tp_value_bool(0), "false");
        check_echo(rank, d, tp_value_int(INT64_MIN), "INT64_MIN");
        check_echo(rank, d, tp_value_int(INT64_MAX), "INT64_MAX");
        check_echo(rank, d, tp_value_float(1.5), "1.5");
        check_echo(rank, d, tp_value_float(-1e300), "-1e300");
        check_echo(rank, d, tp_value_float(-0.0), "-0.0");
        check_echo(rank, d, tp_value_float(INFINITY), "inf");
        uint64_t nan_bits = 0x7ff8000000abcdefULL; /* a NaN with a payload */
        double nan_payload;
        memcpy(&nan_payload, &nan_bits, sizeof nan_payload);
        check_echo(rank, d, tp_value_float(nan_payload), "NaN with payload");
        check_echo(rank, d, tp_value_strn("a\0b", 3), "str with a NUL");
        check_echo(rank, d, tp_value_str(""), "empty str");
        check_echo(rank, d, tp_value_str("h\xc3\xa9llo \xe2\x9c\x93"), "utf-8 str");
        check_echo(rank, d, tp_value_list(), "empty list");
        check_echo(rank, d, tp_value_map(), "empty map");
        tp_value *deep = tp_value_int(42);
        for (int i = 0; i < 20; i++) {
            tp_value *outer = (i % 2) ? tp_value_list_of(2, deep, tp_value_int(i)) : tp_value_map();
            if (!(i % 2)) {
                tp_map_set(outer, "inner", deep);
                tp_map_set(outer, "i", tp_value_int(i));
            }
            deep = outer;
        }
        check_echo(rank, d, deep, "20-deep nesting");
        /* The float comes back as the same bits (not via text). */
        tp_value *res = NULL;
        double third = 1.0 / 3.0;
        if (CHECK_OK(conf_sync(d, "echo", tp_value_list_of(1, tp_value_float(third)), &res))) {
            double back = 0;
            CHECK_OK(tp_value_get_float(res, &back));
            CHECK(memcmp(&back, &third, sizeof back) == 0);
        }
        tp_value_free(res);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: VALUE-2: bytes with every byte value (NULs included) round-trip. */
static int calls_bytes_roundtrip(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        uint8_t all[512];
        for (int i = 0; i < 512; i++)
            all[i] = (uint8_t)(i * 7);
        check_echo(rank, tp_to_rank(1), tp_value_bytes(all, sizeof all), "512 bytes");
        check_echo(rank, tp_to_rank(1), tp_value_bytes(all, 0), "empty bytes");
        tp_value *res = NULL;
        if (CHECK_OK(conf_sync(tp_to_rank(1), "make_bytes", CONF_INTS(1000), &res))) {
            const void *data = NULL;
            size_t len = 0;
            if (CHECK_OK(tp_value_get_bytes(res, &data, &len)) && CHECK_INT(len, 1000)) {
                int wrong = 0;
                for (size_t i = 0; i < len; i++)
                    wrong += ((const uint8_t *)data)[i] != (uint8_t)i;
                CHECK_INT(wrong, 0);
            }
        }
        tp_value_free(res);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* A 2x3 tensor of dtype whose bytes are a small pattern (0/1 for bool). */
static tp_value *pattern_tensor(tp_dtype dt) {
    int64_t shape[2] = {2, 3};
    uint8_t data[6 * 16]; /* complex128 is the widest */
    size_t es = tp_dtype_size(dt);
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = dt == TP_DTYPE_BOOL ? (uint8_t)(i % 2) : (uint8_t)((i % es) == 0 ? i + 1 : 0);
    return tp_value_tensor(dt, 2, shape, NULL, data);
}

/* spec: VALUE-5 VALUE-9: tensors of every dtype round-trip with dtype, shape and elements. */
static int calls_tensor_dtypes(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        for (int dt = 0; dt < TP_DTYPE_COUNT_; dt++) {
            tp_value *t = pattern_tensor((tp_dtype)dt);
            if (!CHECK(t != NULL))
                continue;
            tp_value *res = NULL;
            if (CHECK_OK(conf_sync(tp_to_rank(1), "echo", tp_value_list_of(1, tp_value_clone(t)),
                                   &res))) {
                CHECK(tp_value_equal(res, t));
                CHECK_INT(tp_tensor_dtype(res), dt);
                CHECK_INT(tp_tensor_ndim(res), 2);
                CHECK(tp_tensor_shape(res) && tp_tensor_shape(res)[0] == 2 &&
                      tp_tensor_shape(res)[1] == 3);
                CHECK(memcmp(tp_tensor_cdata(res), tp_tensor_cdata(t),
                             6 * tp_dtype_size((tp_dtype)dt)) == 0);
            }
            tp_value_free(res);
            tp_value_free(t);
        }
        /* Tensors made on the callee: [0..4] as float32 and int64. */
        tp_value *res = NULL;
        if (CHECK_OK(
                conf_sync(tp_to_rank(1), "make_tensor", CONF_INTS(TP_DTYPE_FLOAT32, 5), &res))) {
            CHECK_INT(tp_tensor_dtype(res), TP_DTYPE_FLOAT32);
            CHECK_INT(tp_tensor_numel(res), 5);
            const float *fl = tp_tensor_cdata(res);
            CHECK(fl && fl[0] == 0.0f && fl[4] == 4.0f);
        }
        tp_value_free(res);
        if (CHECK_OK(conf_sync(tp_to_rank(1), "make_tensor", CONF_INTS(TP_DTYPE_INT64, 5), &res))) {
            CHECK_INT(tp_tensor_dtype(res), TP_DTYPE_INT64);
            const int64_t *il = tp_tensor_cdata(res);
            CHECK(il && il[1] == 1 && il[4] == 4);
        }
        tp_value_free(res);
        /* A 0-d tensor (one element) and an empty one. */
        float one = 2.5f;
        check_echo(rank, tp_to_rank(1), tp_value_tensor(TP_DTYPE_FLOAT32, 0, NULL, NULL, &one),
                   "0-d tensor");
        int64_t zero_shape[2] = {0, 4};
        check_echo(rank, tp_to_rank(1), tp_value_tensor(TP_DTYPE_INT64, 2, zero_shape, NULL, NULL),
                   "empty tensor");
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: VALUE-6: a strided tensor travels packed and arrives contiguous. */
static int calls_tensor_strided(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        float base[6] = {0, 1, 2, 3, 4, 5};               /* a 2x3 row-major matrix */
        int64_t tshape[2] = {3, 2}, tstrides[2] = {1, 3}; /* its transpose */
        tp_value *t = tp_value_tensor(TP_DTYPE_FLOAT32, 2, tshape, tstrides, base);
        CHECK(t && !tp_tensor_is_contiguous(t));
        tp_value *res = NULL;
        if (t && CHECK_OK(conf_sync(tp_to_rank(1), "echo", tp_value_list_of(1, tp_value_clone(t)),
                                    &res))) {
            CHECK(tp_value_equal(res, t));
            CHECK(tp_tensor_is_contiguous(res));
            const float *got = tp_tensor_cdata(res);
            const float want[6] = {0, 3, 1, 4, 2, 5};
            CHECK(got && memcmp(got, want, sizeof want) == 0);
        }
        tp_value_free(res);
        res = NULL;
        double sum = -1;
        if (t &&
            CHECK_OK(conf_sync(tp_to_rank(1), "tensor_sum", tp_value_list_of(1, tp_value_clone(t)),
                               &res)) &&
            CHECK_OK(tp_value_get_float(res, &sum)))
            CHECK(sum == 15.0);
        tp_value_free(res);
        tp_value_free(t);
        /* Every other int64 element: [0, 2, 4, 6]. */
        int64_t ibase[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        int64_t shape1 = 4, stride1 = 2;
        t = tp_value_tensor(TP_DTYPE_INT64, 1, &shape1, &stride1, ibase);
        res = NULL;
        if (t && CHECK_OK(conf_sync(tp_to_rank(1), "echo", tp_value_list_of(1, tp_value_clone(t)),
                                    &res))) {
            const int64_t *got = tp_tensor_cdata(res);
            CHECK(got && got[0] == 0 && got[1] == 2 && got[2] == 4 && got[3] == 6);
            CHECK(tp_tensor_strides(res) && tp_tensor_strides(res)[0] == 1);
        }
        tp_value_free(res);
        res = NULL;
        if (t &&
            CHECK_OK(conf_sync(tp_to_rank(1), "tensor_sum", tp_value_list_of(1, tp_value_clone(t)),
                               &res)) &&
            CHECK_OK(tp_value_get_float(res, &sum)))
            CHECK(sum == 12.0);
        tp_value_free(res);
        tp_value_free(t);
        /* A zero stride (broadcast) is expanded: [[1, 2, 3], [1, 2, 3]]. */
        int32_t row[3] = {1, 2, 3};
        int64_t bshape[2] = {2, 3}, bstrides[2] = {0, 1};
        t = tp_value_tensor(TP_DTYPE_INT32, 2, bshape, bstrides, row);
        res = NULL;
        if (CHECK(t != NULL) && CHECK_OK(conf_sync(tp_to_rank(1), "echo",
                                                   tp_value_list_of(1, tp_value_clone(t)), &res))) {
            const int32_t want[6] = {1, 2, 3, 1, 2, 3};
            CHECK(tp_tensor_is_contiguous(res));
            CHECK(tp_tensor_cdata(res) && memcmp(tp_tensor_cdata(res), want, sizeof want) == 0);
            CHECK(tp_value_equal(res, t));
        }
        tp_value_free(res);
        tp_value_free(t);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: VALUE-9 FUNC-2: worker infos as values; the callee knows its caller and name. */
static int calls_worker_info_values(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_worker_info w1;
        CHECK_OK(tp_get_worker_info("w1", &w1));
        check_echo(rank, tp_to_rank(1), tp_value_worker_info(&w1), "worker info");
        tp_value *res = NULL;
        tp_worker_info got;
        if (CHECK_OK(conf_sync(tp_to_rank(1), "worker_info", CONF_INTS(0), &res)) &&
            CHECK_OK(tp_value_get_worker_info(res, &got))) {
            CHECK(strcmp(got.name, "w0") == 0);
            CHECK_INT(got.id, 0);
        }
        tp_value_free(res);
        if (CHECK_OK(conf_sync(tp_to_rank(1), "caller", NULL, &res)) &&
            CHECK_OK(tp_value_get_worker_info(res, &got))) {
            CHECK(strcmp(got.name, "w0") == 0);
            CHECK_INT(got.id, 0);
        }
        tp_value_free(res);
        if (CHECK_OK(conf_sync(tp_to_rank(1), "fn_name", NULL, &res)))
            CHECK(strcmp(conf_str_of(rank, res), "fn_name") == 0);
        tp_value_free(res);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUNC-3: a function that leaves *result NULL returns nil. */
static int calls_result_nil_when_unset(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        tp_value *res = NULL;
        if (CHECK_OK(conf_sync(tp_to_rank(1), "ff_hop", CONF_INTS(0, 0), &res)))
            CHECK(res && tp_value_kind(res) == TP_KIND_NIL);
        tp_value_free(res);
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "hops", NULL, -1), 1);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: VALUE-2 VALUE-3: ints and floats take the types the function returns (add mixes them). */
static int calls_float_arguments(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 1) {
        tp_value *res = NULL;
        double x = 0;
        if (CHECK_OK(conf_sync(tp_to_rank(0), "add",
                               tp_value_list_of(2, tp_value_float(0.25), tp_value_int(2)), &res)) &&
            CHECK(tp_value_kind(res) == TP_KIND_FLOAT) && CHECK_OK(tp_value_get_float(res, &x)))
            CHECK(x == 2.25);
        tp_value_free(res);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUNC-6: a non-blocking function answers like any other; flags are
 * checked; inside it every wait fails at once with a message, rpc_async works. */
static int calls_nonblocking_function(int rank, int ws) {
    CHECK_STATUS(tp_register_function_ex("nb_bad_flags", NULL, NULL, 0x4), TP_EINVAL);
    CHECK_CONTAINS(tp_errmsg(), "unknown flags 0x4");
    CONF_INIT_OR_RETURN(rank, ws);
    if (rank == 0) {
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "nb_add", CONF_INTS(3, 4), -1), 7);
        CHECK_INT(conf_sync_int(rank, tp_to_rank(0), "nb_add", CONF_INTS(5, 6), -1), 11);
        tp_value *res = NULL;
        if (CHECK_OK(conf_sync(tp_to_rank(1), "nb_try_wait", NULL, &res)) &&
            CHECK_INT(tp_list_len(res), 8)) {
            CHECK_INT(conf_int_of(rank, tp_list_get(res, 0), -1), TP_EINVAL); /* rpc_sync */
            CHECK_INT(conf_int_of(rank, tp_list_get(res, 1), -1), TP_EINVAL); /* sleep */
            CHECK_INT(conf_int_of(rank, tp_list_get(res, 2), -1), TP_EINVAL); /* future wait */
            CHECK_INT(conf_int_of(rank, tp_list_get(res, 3), -1), TP_OK);     /* rpc_async */
            const char *msg = conf_str_of(rank, tp_list_get(res, 4));
            CHECK_CONTAINS(msg, "rpc_sync: non-blocking function 'nb_try_wait'");
            CHECK_CONTAINS(msg, "cannot wait");
            CHECK_INT(conf_int_of(rank, tp_list_get(res, 5), -1), TP_EINVAL); /* shutdown */
            CHECK_INT(conf_int_of(rank, tp_list_get(res, 6), -1), TP_EINVAL); /* local_value */
            CHECK_INT(conf_int_of(rank, tp_list_get(res, 7), -1), TP_EINVAL); /* method call */
        }
        tp_value_free(res);
        /* An error from a non-blocking function travels like any other. */
        CHECK_STATUS(conf_sync(tp_to_rank(1), "nb_add", CONF_INTS(1), &res), TP_EREMOTE);
        CHECK_CONTAINS(tp_errmsg(), "function 'nb_add' on worker 'w1' (id 1) failed");
        tp_value_free(res);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: FUNC-6 AGENT-7: a non-blocking function does not need a pool thread:
 * it answers while the callee's only pool thread is busy. */
static int calls_nonblocking_bypasses_pool(int rank, int ws) {
    tp_options *o = conf_options();
    CHECK_OK(tp_options_set_num_worker_threads(o, 1));
    tp_status st = conf_init_opts(rank, ws, o);
    tp_options_free(o);
    if (!CHECK_OK(st))
        return conf_finish(rank);
    if (rank == 0) {
        tp_future *slow = NULL;
        uint64_t t0 = conf_now_ns();
        CHECK_OK(conf_async(tp_to_rank(1), "sleep_ms", CONF_INTS(1000), &slow));
        CHECK_OK(tp_sleep(0.2)); /* the sleep holds w1's only pool thread by now */
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "nb_add", CONF_INTS(3, 4), -1), 7);
        if (!CHECK(conf_since_s(t0) < 0.8))
            conf_fail(rank, __FILE__, __LINE__, "nb_add answered after %.3f s", conf_since_s(t0));
        CHECK(slow && !tp_future_done(slow));
        /* A pool function waits for the thread. */
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1), "add", CONF_INTS(3, 4), -1), 7);
        CHECK(conf_since_s(t0) >= 0.95);
        if (slow)
            CHECK_OK(tp_future_wait(slow, TP_TIMEOUT_INFINITE));
        tp_future_free(slow);
    }
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

const tp_conformance_case conf_cases_calls[] = {
    {"calls_self_by_name_rank_info", 2, calls_self_by_name_rank_info, "CALL-2 CALL-3"},
    {"calls_dest_by_name_rank_info", 3, calls_dest_by_name_rank_info, "CALL-2"},
    {"calls_unknown_worker_name", 2, calls_unknown_worker_name, "CALL-2 ERR-3"},
    {"calls_rank_out_of_range", 2, calls_rank_out_of_range, "CALL-2 ERR-3"},
    {"calls_async_returns_at_once", 2, calls_async_returns_at_once, "CALL-4 CALL-9 FUTURE-1"},
    {"calls_nested_three_workers", 3, calls_nested_three_workers, "FUNC-4"},
    {"calls_nested_back_to_caller", 2, calls_nested_back_to_caller, "FUNC-4 FUTURE-8"},
    {"calls_1000_concurrent_async", 2, calls_1000_concurrent_async, "CALL-9 FUTURE-6"},
    {"calls_null_args_kwargs", 2, calls_null_args_kwargs, "FUNC-2"},
    {"calls_kwargs_map", 2, calls_kwargs_map, "CALL-9 VALUE-4"},
    {"calls_scalar_and_container_values", 2, calls_scalar_and_container_values,
     "VALUE-2 VALUE-4 VALUE-9"},
    {"calls_bytes_roundtrip", 2, calls_bytes_roundtrip, "VALUE-2"},
    {"calls_tensor_dtypes", 2, calls_tensor_dtypes, "VALUE-5 VALUE-9"},
    {"calls_tensor_strided", 2, calls_tensor_strided, "VALUE-6"},
    {"calls_worker_info_values", 2, calls_worker_info_values, "VALUE-9 FUNC-2"},
    {"calls_result_nil_when_unset", 2, calls_result_nil_when_unset, "FUNC-3"},
    {"calls_float_arguments", 2, calls_float_arguments, "VALUE-2 VALUE-3"},
    {"calls_nonblocking_function", 2, calls_nonblocking_function, "FUNC-6"},
    {"calls_nonblocking_bypasses_pool", 2, calls_nonblocking_bypasses_pool, "FUNC-6 AGENT-7"},
};
const size_t conf_cases_calls_count = sizeof conf_cases_calls / sizeof conf_cases_calls[0];
