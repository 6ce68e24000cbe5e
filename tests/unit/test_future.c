/*
 * test_future.c: futures (spec/calls.md FUTURE-1..6) through the public API
 * on the simulator. Each test runs one tp_sim with one or two hosts whose
 * programs init with "SIM"; rank 0 runs the scenario, rank 1 (when present)
 * serves. Virtual time makes every wait's length exact, so a wait that
 * should take 100 ms is checked to take 100 ms.
 *
 * Checks inside simulated tasks use CHECK (counted, reported after the run):
 * a cmocka assertion would longjmp off a fiber's stack.
 */
#define _GNU_SOURCE /* RTLD_NEXT, for alloc_fault.h */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tensorplay/rpc.h"
#include "tensorplay/sim.h"

#include "alloc_fault.h"
#include "common/idmap.h"
#include "sim_world.h"

/* ---- Functions the workers serve ---------------------------------------------------- */

/* echo(x): returns x (nil without arguments). */
static tp_status fn_echo(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)call, (void)kwargs, (void)user_data;
    *result = tp_list_len(args) ? tp_value_clone(tp_list_get(args, 0)) : NULL;
    return TP_OK;
}

/* sleep(seconds, x): sleeps in virtual time, then returns x. */
static tp_status fn_sleep(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    double s = 0;
    if (tp_value_get_float(tp_list_get(args, 0), &s) != TP_OK) {
        tp_call_set_error(call, "sleep takes seconds");
        return TP_EINVAL;
    }
    tp_status st = tp_sleep(s);
    if (st != TP_OK)
        return st;
    *result = tp_list_len(args) > 1 ? tp_value_clone(tp_list_get(args, 1)) : NULL;
    return TP_OK;
}

/* fail(seconds): sleeps, then fails with a message naming the sleep. */
static tp_status fn_fail(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)kwargs, (void)result, (void)user_data;
    double s = 0;
    if (tp_list_len(args))
        (void)tp_value_get_float(tp_list_get(args, 0), &s);
    if (s > 0)
        (void)tp_sleep(s);
    tp_call_set_error(call, "deliberate failure after %g s", s);
    return TP_EINVAL;
}

/* ---- Allocation failures ------------------------------------------------------------- */

/* calloc fails on demand: alloc_fault.h. */

/* ---- Worlds -------------------------------------------------------------------------- */

/* A future of the program's own that several tasks wait on (FUTURE-2). */
static tp_future *shared_future;

/* wait_shared(seconds): waits that long on shared_future; its wait's status. */
static tp_status fn_wait_shared(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *user_data) {
    (void)call, (void)kwargs, (void)user_data;
    double s = 0;
    if (!shared_future || tp_value_get_float(tp_list_get(args, 0), &s) != TP_OK)
        return TP_EINVAL;
    tp_status st = tp_future_wait(shared_future, s);
    *result = tp_value_int(st);
    return *result ? TP_OK : TP_ENOMEM;
}

/* later_nomem(): answers later with a future of its own, the next calloc on
 * this thread (the core's record of the answer to come) failing. */
static tp_future *later_nomem_f;

static tp_status fn_later_nomem(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *ud) {
    (void)args, (void)kwargs, (void)result, (void)ud;
    if (tp_future_new(&later_nomem_f) != TP_OK)
        return TP_ENOMEM;
    tp_status st = tp_call_answer_later(call, later_nomem_f);
#if ALLOC_FAULT_HOOK
    calloc_failed = 0;
    calloc_countdown = 1;
#endif
    return st;
}

static void world_register(void) {
    CHECK(tp_register_function("later_nomem", fn_later_nomem, NULL) == TP_OK);
    CHECK(tp_register_function("wait_shared", fn_wait_shared, NULL) == TP_OK);
    CHECK(tp_register_function("echo", fn_echo, NULL) == TP_OK);
    CHECK(tp_register_function("sleep", fn_sleep, NULL) == TP_OK);
    CHECK(tp_register_function("fail", fn_fail, NULL) == TP_OK);
}

/* ---- Call helpers (inside the scenario) ------------------------------------------------ */

static tp_future *call_async(const char *to, const char *fn, tp_value *args, double timeout_s) {
    tp_future *f = NULL;
    tp_status st = tp_rpc_async(tp_to_name(to), fn, args, NULL, timeout_s, &f);
    tp_value_free(args);
    CHECK(st == TP_OK);
    CHECK(f != NULL);
    if (st != TP_OK)
        print_error("rpc_async %s: %s\n", fn, tp_errmsg());
    return f;
}

static tp_future *async_sleep(const char *to, double s, int64_t ret, double timeout_s) {
    return call_async(to, "sleep", tp_value_list_of(2, tp_value_float(s), tp_value_int(ret)),
                      timeout_s);
}

static tp_future *async_echo(const char *to, int64_t x) {
    return call_async(to, "echo", tp_value_list_of(1, tp_value_int(x)), TP_TIMEOUT_DEFAULT);
}

static tp_future *async_fail(const char *to, double after_s) {
    return call_async(to, "fail", tp_value_list_of(1, tp_value_float(after_s)), TP_TIMEOUT_DEFAULT);
}

/* The int a completed future holds, or INT64_MIN. */
static int64_t int_of(const tp_future *f) {
    int64_t x = INT64_MIN;
    const tp_value *v = f ? tp_future_value(f) : NULL;
    if (!v || tp_value_get_int(v, &x) != TP_OK)
        return INT64_MIN;
    return x;
}

/* ---- FUTURE-2: a wait's own deadline ------------------------------------------------- */

static void sc_wait_deadline(world *w) {
    (void)w;
    uint64_t t0 = now_ns();
    tp_future *f = async_sleep("w1", 1.0, 42, TP_TIMEOUT_INFINITE);
    if (!f)
        return;
    /* The wait expires first: TP_ETIMEDOUT, and the future is untouched. */
    CHECK(tp_future_wait(f, 0.1) == TP_ETIMEDOUT);
    CHECK(within(now_ns() - t0, 100 * MS, 100 * MS + TOL_NS));
    CHECK(strstr(tp_errmsg(), "timed out") != NULL);
    CHECK(!tp_future_done(f));
    CHECK(tp_future_status(f) == TP_EINVAL); /* pending */
    CHECK(tp_future_value(f) == NULL);
    CHECK(tp_future_take_value(f) == NULL);
    CHECK(strcmp(tp_future_error(f), "") == 0);

    /* -1 is the worker's current default, read when the wait begins. */
    CHECK(tp_set_rpc_timeout(0.2) == TP_OK);
    uint64_t t1 = now_ns();
    CHECK(tp_future_wait(f, TP_TIMEOUT_DEFAULT) == TP_ETIMEDOUT);
    CHECK(within(now_ns() - t1, 200 * MS, 200 * MS + TOL_NS));
    CHECK(!tp_future_done(f));

    /* Still usable: a wait without deadline gets the value at ~1 s. */
    CHECK(tp_future_wait(f, TP_TIMEOUT_INFINITE) == TP_OK);
    CHECK(within(now_ns() - t0, 1 * SEC, 1 * SEC + 2 * HOP_NS));
    CHECK(tp_future_done(f));
    CHECK(tp_future_status(f) == TP_OK);
    CHECK(int_of(f) == 42);
    CHECK(strcmp(tp_future_error(f), "") == 0);

    /* Waiting on a completed future returns at once, whatever its timeout. */
    uint64_t t2 = now_ns();
    CHECK(tp_future_wait(f, 0.001) == TP_OK);
    CHECK(tp_future_wait(f, TP_TIMEOUT_DEFAULT) == TP_OK);
    CHECK(now_ns() == t2);

    /* FUTURE-3: take moves the value out once. */
    tp_value *v = tp_future_take_value(f);
    int64_t x = 0;
    CHECK(v && tp_value_get_int(v, &x) == TP_OK && x == 42);
    tp_value_free(v);
    CHECK(tp_future_take_value(f) == NULL);
    CHECK(tp_future_value(f) == NULL);
    CHECK(tp_future_status(f) == TP_OK);
    tp_future_free(f);
}

/* Issue 8: the handle queries take NULL without crashing: a NULL future is
 * one that never completes, a NULL rref has no owner. */
static void test_null_handle_queries(void **state) {
    (void)state;
    assert_int_equal(tp_future_done(NULL), 0);
    assert_int_equal(tp_future_status(NULL), TP_EINVAL);
    assert_null(tp_future_value(NULL));
    assert_null(tp_future_take_value(NULL));
    assert_string_equal(tp_future_error(NULL), "");
    assert_string_equal(tp_rref_owner_name(NULL), "");
    assert_int_equal(tp_rref_is_owner(NULL), 0);
    assert_int_equal(tp_rref_confirmed_by_owner(NULL), 0);
    tp_worker_info info;
    assert_int_equal(tp_rref_owner(NULL, &info), TP_EINVAL);
}

static void test_future_wait_deadline_leaves_pending(void **state) {
    (void)state;
    world w = {.scenario = sc_wait_deadline};
    run_world(2, 1, &w);
}

/* The call's own deadline ends the future even while a longer wait runs. */
static void sc_wait_longer_than_call(world *w) {
    (void)w;
    uint64_t t0 = now_ns();
    tp_future *f = async_sleep("w1", 1.0, 7, 0.3);
    if (!f)
        return;
    CHECK(tp_future_wait(f, 5.0) == TP_ETIMEDOUT);
    CHECK(within(now_ns() - t0, 300 * MS, 300 * MS + TOL_NS));
    CHECK(tp_future_done(f)); /* this time the call itself timed out */
    CHECK(tp_future_status(f) == TP_ETIMEDOUT);
    CHECK(strstr(tp_future_error(f), "timed out") != NULL);
    CHECK(tp_future_value(f) == NULL);
    tp_future_free(f);
}

static void test_future_wait_ends_at_call_deadline(void **state) {
    (void)state;
    world w = {.scenario = sc_wait_longer_than_call};
    run_world(2, 2, &w);
}

/*
 * FUTURE-2: several tasks wait on one future. Three of w0's pool tasks wait
 * on a future of the program's own, the middle one for 0.05 s only: it
 * leaves the waiters at its deadline, the others stay, and once the program
 * completes the future both wake with TP_OK, at that instant.
 */
static void sc_many_waiters(world *w) {
    (void)w;
    CHECK(tp_future_new(&shared_future) == TP_OK);
    const double waits[3] = {10.0, 0.05, 10.0};
    tp_future *f[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        tp_value *args = tp_value_list_of(1, tp_value_float(waits[i]));
        CHECK(tp_rpc_async(tp_to_name("w0"), "wait_shared", args, NULL, 20.0, &f[i]) == TP_OK);
        tp_value_free(args);
        CHECK(tp_sleep(0.001) == TP_OK); /* each is waiting before the next starts */
    }
    CHECK(tp_sleep(0.1) == TP_OK);
    CHECK(!tp_future_done(f[0]) && tp_future_done(f[1]) && !tp_future_done(f[2]));
    CHECK(int_of(f[1]) == TP_ETIMEDOUT);
    uint64_t t0 = now_ns();
    CHECK(tp_future_set_result(shared_future, tp_value_int(5)) == TP_OK);
    CHECK(tp_future_wait(f[0], 1.0) == TP_OK && tp_future_wait(f[2], 1.0) == TP_OK);
    CHECK(now_ns() - t0 < MS);
    CHECK(int_of(f[0]) == TP_OK && int_of(f[2]) == TP_OK);
    for (int i = 0; i < 3; i++)
        tp_future_free(f[i]);
    tp_future_free(shared_future);
    shared_future = NULL;
}

static void test_future_many_waiters(void **state) {
    (void)state;
    world w = {.scenario = sc_many_waiters};
    run_world(2, 3, &w);
}

/* ---- FUTURE-1: tp_future_done never blocks ----------------------------------------- */

static void sc_done_never_blocks(world *w) {
    (void)w;
    tp_future *f = async_sleep("w1", 0.5, 1, TP_TIMEOUT_INFINITE);
    if (!f)
        return;
    uint64_t t = now_ns();
    for (int i = 0; i < 1000; i++)
        CHECK(!tp_future_done(f));
    CHECK(now_ns() == t); /* no virtual time passed: nothing yielded */
    CHECK(tp_sleep(1.0) == TP_OK);
    t = now_ns();
    CHECK(tp_future_done(f));
    CHECK(tp_future_done(f));
    CHECK(now_ns() == t);
    CHECK(tp_future_status(f) == TP_OK);
    CHECK(int_of(f) == 1);
    /* And on a failed future. */
    tp_future *g = async_fail("w1", 0.0);
    CHECK(!tp_future_done(g));
    CHECK(tp_sleep(0.1) == TP_OK);
    CHECK(tp_future_done(g));
    CHECK(tp_future_status(g) == TP_EREMOTE);
    CHECK(strstr(tp_future_error(g), "deliberate failure") != NULL);
    tp_future_free(f);
    tp_future_free(g);
}

static void test_future_done_never_blocks(void **state) {
    (void)state;
    world w = {.scenario = sc_done_never_blocks};
    run_world(2, 3, &w);
}

/* ---- FUTURE-5: then-callbacks ----------------------------------------------------------- */

typedef struct then_probe {
    int calls;
    int returned;    /* set by the scenario right after tp_future_then returns */
    int ran_inline;  /* a callback ran before tp_future_then returned */
    int parent_done; /* the parent was complete in every callback */
    int wrong_host;
} then_probe;

/* Returns the parent's int + 1. */
static tp_status cb_add1(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                         void *user_data) {
    then_probe *p = user_data;
    p->calls++;
    if (!p->returned)
        p->ran_inline++;
    if (!tp_future_done(f))
        p->parent_done = 0;
    if (tp_sim_current_host() != 0)
        p->wrong_host++;
    if (tp_future_status(f) != TP_OK) {
        snprintf(errmsg, errmsg_len, "%s", tp_future_error(f));
        return tp_future_status(f);
    }
    *result = tp_value_int(int_of(f) + 1);
    return TP_OK;
}

static void sc_then_once_not_inline(world *w) {
    (void)w;
    then_probe p = {.parent_done = 1};
    /* Attached while the parent is pending. */
    tp_future *f = async_sleep("w1", 0.2, 5, TP_TIMEOUT_INFINITE);
    tp_future *ch = NULL;
    p.returned = 0;
    CHECK(tp_future_then(f, cb_add1, &p, &ch) == TP_OK);
    p.returned = 1;
    CHECK(ch != NULL);
    CHECK(p.calls == 0);
    CHECK(tp_future_wait(ch, TP_TIMEOUT_INFINITE) == TP_OK);
    CHECK(int_of(ch) == 6);
    CHECK(p.calls == 1);

    /* Attached after the parent completed: still queued, never inline. */
    tp_future *g = async_echo("w1", 10);
    CHECK(tp_future_wait(g, TP_TIMEOUT_INFINITE) == TP_OK);
    tp_future *ch2 = NULL;
    p.returned = 0;
    CHECK(tp_future_then(g, cb_add1, &p, &ch2) == TP_OK);
    p.returned = 1;
    CHECK(p.calls == 1); /* not run inside tp_future_then */
    CHECK(tp_future_wait(ch2, TP_TIMEOUT_INFINITE) == TP_OK);
    CHECK(int_of(ch2) == 11);
    CHECK(p.calls == 2);

    /* FUTURE-4: the user's reference to the parent may go first. */
    tp_future *h = async_sleep("w1", 0.2, 20, TP_TIMEOUT_INFINITE);
    tp_future *ch3 = NULL;
    p.returned = 0;
    CHECK(tp_future_then(h, cb_add1, &p, &ch3) == TP_OK);
    p.returned = 1;
    tp_future_free(h);
    CHECK(tp_future_wait(ch3, TP_TIMEOUT_INFINITE) == TP_OK);
    CHECK(int_of(ch3) == 21);
    CHECK(p.calls == 3);

    /* Exactly once: nothing runs again later. */
    CHECK(tp_sleep(2.0) == TP_OK);
    CHECK(p.calls == 3);
    CHECK(p.ran_inline == 0);
    CHECK(p.parent_done == 1);
    CHECK(p.wrong_host == 0);
    /* The parents are unchanged by their callbacks. */
    CHECK(int_of(f) == 5 && int_of(g) == 10);
    tp_future_free(f);
    tp_future_free(g);
    tp_future_free(ch);
    tp_future_free(ch2);
    tp_future_free(ch3);
}

static void test_future_then_runs_once_not_inline(void **state) {
    (void)state;
    world w = {.scenario = sc_then_once_not_inline};
    run_world(2, 4, &w);
}

/* Passes the parent's failure on (status and message). */
static tp_status cb_propagate(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                              void *user_data) {
    (void)result;
    int *calls = user_data;
    (*calls)++;
    tp_status st = tp_future_status(f);
    if (st != TP_OK)
        snprintf(errmsg, errmsg_len, "propagated: %s", tp_future_error(f));
    else
        *result = tp_value_str("fine");
    return st;
}

/* Fails on its own, after setting a result the library must free. */
static tp_status cb_refuse(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                           void *user_data) {
    int *calls = user_data;
    (*calls)++;
    *result = tp_value_str("dropped on failure");
    snprintf(errmsg, errmsg_len, "callback refused %lld", (long long)int_of(f));
    return TP_ERANGE;
}

/* Recovers from a failed parent. */
static tp_status cb_recover(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                            void *user_data) {
    (void)errmsg, (void)errmsg_len;
    int *calls = user_data;
    (*calls)++;
    *result = tp_value_int(tp_future_status(f) == TP_EREMOTE ? 99 : -1);
    return TP_OK;
}

static void sc_then_errors(world *w) {
    (void)w;
    int calls = 0;
    /* A failed parent reaches the callback, which passes the failure on. */
    tp_future *bad = async_fail("w1", 0.05);
    tp_future *c1 = NULL, *c2 = NULL, *c3 = NULL;
    CHECK(tp_future_then(bad, cb_propagate, &calls, &c1) == TP_OK);
    CHECK(tp_future_then(bad, cb_recover, &calls, &c2) == TP_OK);
    CHECK(tp_future_wait(c1, TP_TIMEOUT_INFINITE) == TP_EREMOTE);
    CHECK(strstr(tp_errmsg(), "deliberate failure") != NULL);
    CHECK(tp_future_status(c1) == TP_EREMOTE);
    CHECK(strstr(tp_future_error(c1), "propagated: ") == tp_future_error(c1));
    CHECK(strstr(tp_future_error(c1), "deliberate failure after 0.05 s") != NULL);
    CHECK(tp_future_value(c1) == NULL);
    /* A callback may turn a failure into a value. */
    CHECK(tp_future_wait(c2, TP_TIMEOUT_INFINITE) == TP_OK);
    CHECK(int_of(c2) == 99);
    CHECK(tp_future_status(bad) == TP_EREMOTE);

    /* A callback's own failure fails only the chained future, never the parent. */
    tp_future *good = async_echo("w1", 5);
    CHECK(tp_future_then(good, cb_refuse, &calls, &c3) == TP_OK);
    CHECK(tp_future_wait(c3, TP_TIMEOUT_INFINITE) == TP_ERANGE);
    CHECK(tp_future_status(c3) == TP_ERANGE);
    CHECK(strcmp(tp_future_error(c3), "callback refused 5") == 0);
    CHECK(strcmp(tp_errmsg(), "callback refused 5") == 0);
    CHECK(tp_future_value(c3) == NULL);
    CHECK(tp_future_wait(good, 0) == TP_OK);
    CHECK(tp_future_status(good) == TP_OK);
    CHECK(int_of(good) == 5);
    CHECK(strcmp(tp_future_error(good), "") == 0);
    CHECK(calls == 3);

    /* Bad arguments (FUTURE-5). */
    tp_future *x = (tp_future *)&calls; /* must be overwritten with NULL */
    CHECK(tp_future_then(good, NULL, NULL, &x) == TP_EINVAL);
    CHECK(x == NULL);
    CHECK(tp_future_then(good, cb_add1, NULL, NULL) == TP_EINVAL);
    CHECK(tp_future_then(NULL, cb_add1, NULL, &x) == TP_EINVAL);
    tp_future_free(bad);
    tp_future_free(good);
    tp_future_free(c1);
    tp_future_free(c2);
    tp_future_free(c3);
}

static void test_future_then_error_propagation(void **state) {
    (void)state;
    world w = {.scenario = sc_then_errors};
    run_world(2, 5, &w);
}

/* Fails without writing a message. */
static tp_status cb_silent_fail(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                                void *user_data) {
    (void)f, (void)result, (void)errmsg, (void)errmsg_len, (void)user_data;
    return TP_EINVAL;
}

static void sc_then_silent(world *w) {
    (void)w;
    tp_future *f = async_echo("w1", 1);
    tp_future *ch = NULL;
    CHECK(tp_future_then(f, cb_silent_fail, NULL, &ch) == TP_OK);
    CHECK(tp_future_wait(ch, TP_TIMEOUT_INFINITE) == TP_EINVAL);
    /* FUTURE-5: an empty message becomes "the status name and text". */
    const char *e = tp_future_error(ch);
    CHECK(strstr(e, "invalid argument") != NULL);
    if (!strstr(e, "TP_EINVAL")) {
        failures++;
        print_error("FUTURE-5: chained error '%s' lacks the status name TP_EINVAL\n", e);
    }
    tp_future_free(f);
    tp_future_free(ch);
}

/* FUTURE-5: a callback that fails without a message still names the status. */
static void test_future_then_error_without_message_names_status(void **state) {
    (void)state;
    world w = {.scenario = sc_then_silent};
    run_world(2, 6, &w);
}

/* A chain of 100 thens, intermediate handles dropped at once (FUTURE-4). */
static void build_chain(tp_future *head, int n, then_probe *p, tp_future **tail) {
    tp_future *cur = head;
    for (int i = 0; i < n; i++) {
        tp_future *next = NULL;
        p->returned = 0;
        CHECK(tp_future_then(cur, cb_add1, p, &next) == TP_OK);
        p->returned = 1;
        if (cur != head)
            tp_future_free(cur);
        cur = next;
        if (!cur)
            break;
    }
    *tail = cur;
}

/* Fails at link 50 of a chain: the rest propagate it. */
static tp_status cb_add1_or_fail(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                                 void *user_data) {
    then_probe *p = user_data;
    p->calls++;
    if (tp_future_status(f) != TP_OK) {
        snprintf(errmsg, errmsg_len, "%s", tp_future_error(f));
        return tp_future_status(f);
    }
    int64_t x = int_of(f);
    if (x == 50) {
        snprintf(errmsg, errmsg_len, "link at %lld broke", (long long)x);
        return TP_ECANCELED;
    }
    *result = tp_value_int(x + 1);
    return TP_OK;
}

static void sc_chain_100(world *w) {
    (void)w;
    /* Built while the head is pending. */
    then_probe p = {.parent_done = 1};
    tp_future *head = async_sleep("w1", 0.1, 0, TP_TIMEOUT_INFINITE);
    tp_future *tail = NULL;
    build_chain(head, 100, &p, &tail);
    CHECK(tail != NULL);
    CHECK(p.calls == 0);
    CHECK(tp_future_wait(tail, TP_TIMEOUT_INFINITE) == TP_OK);
    CHECK(int_of(tail) == 100);
    CHECK(p.calls == 100);
    tp_future_free(tail);

    /* Built on the same head after it completed. */
    build_chain(head, 100, &p, &tail);
    CHECK(tp_future_wait(tail, TP_TIMEOUT_INFINITE) == TP_OK);
    CHECK(int_of(tail) == 100);
    CHECK(p.calls == 200);
    CHECK(p.ran_inline == 0);
    CHECK(p.parent_done == 1);
    tp_future_free(tail);

    /* A failure in the middle travels to the end. */
    then_probe q = {0};
    tp_future *cur = head;
    for (int i = 0; i < 100; i++) {
        tp_future *next = NULL;
        CHECK(tp_future_then(cur, cb_add1_or_fail, &q, &next) == TP_OK);
        if (cur != head)
            tp_future_free(cur);
        cur = next;
    }
    CHECK(tp_future_wait(cur, TP_TIMEOUT_INFINITE) == TP_ECANCELED);
    CHECK(strcmp(tp_future_error(cur), "link at 50 broke") == 0);
    CHECK(q.calls == 100);
    tp_future_free(cur);
    tp_future_free(head);
    CHECK(tp_sleep(1.0) == TP_OK);
    CHECK(p.calls == 200 && q.calls == 100); /* each ran exactly once */
}

static void test_future_then_chain_100(void **state) {
    (void)state;
    world w = {.scenario = sc_chain_100};
    run_world(2, 7, &w);
}

/* Several callbacks on one future are queued in registration order. With one
 * pool task the queue order is the run order (AGENT-7: FIFO). */
typedef struct order_rec {
    int seq[8];
    int n;
} order_rec;

static order_rec g_order;

static tp_status cb_record_order(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                                 void *user_data) {
    (void)f, (void)result, (void)errmsg, (void)errmsg_len;
    if (g_order.n < 8)
        g_order.seq[g_order.n++] = (int)(intptr_t)user_data;
    return TP_OK;
}

static void sc_then_order(world *w) {
    (void)w;
    memset(&g_order, 0, sizeof g_order);
    tp_future *f = async_sleep("w1", 0.1, 1, TP_TIMEOUT_INFINITE);
    tp_future *ch[5] = {0};
    for (int i = 0; i < 5; i++)
        CHECK(tp_future_then(f, cb_record_order, (void *)(intptr_t)i, &ch[i]) == TP_OK);
    CHECK(tp_future_wait_all(ch, 5, TP_TIMEOUT_INFINITE, NULL) == TP_OK);
    CHECK(g_order.n == 5);
    int in_order = 1;
    for (int i = 0; i < g_order.n; i++)
        in_order &= g_order.seq[i] == i;
    if (!in_order) {
        failures++;
        print_error("FUTURE-5: callbacks ran in order %d %d %d %d %d, registered 0 1 2 3 4\n",
                    g_order.seq[0], g_order.seq[1], g_order.seq[2], g_order.seq[3], g_order.seq[4]);
    }
    for (int i = 0; i < 5; i++)
        tp_future_free(ch[i]);
    tp_future_free(f);
}

/* FUTURE-5: pending callbacks run in registration order (one pool task shows it). */
static void test_future_then_registration_order(void **state) {
    (void)state;
    world w = {.scenario = sc_then_order, .threads = 1};
    run_world(2, 8, &w);
}

/* ---- FUTURE-6: wait_all ------------------------------------------------------------- */

static void sc_wait_all_empty_and_ok(world *w) {
    (void)w;
    size_t idx = 77;
    uint64_t t = now_ns();
    CHECK(tp_future_wait_all(NULL, 0, TP_TIMEOUT_INFINITE, &idx) == TP_OK);
    CHECK(idx == 0);
    tp_future *none[1] = {NULL};
    idx = 77;
    CHECK(tp_future_wait_all(none, 0, 0.1, &idx) == TP_OK);
    CHECK(idx == 0);
    CHECK(now_ns() == t);

    enum { N = 8 };
    tp_future *fs[N];
    for (int i = 0; i < N; i++)
        fs[i] = i % 2 ? async_echo("w1", i) : async_sleep("w1", 0.05 * i, i, TP_TIMEOUT_DEFAULT);
    idx = 77;
    CHECK(tp_future_wait_all(fs, N, TP_TIMEOUT_INFINITE, &idx) == TP_OK);
    CHECK(idx == N);
    CHECK(within(now_ns() - t, 300 * MS, 300 * MS + 2 * HOP_NS + TOL_NS)); /* the slowest */
    for (int i = 0; i < N; i++) {
        CHECK(tp_future_done(fs[i]));
        CHECK(int_of(fs[i]) == i);
    }
    /* Again, all complete: at once, and failed_index may be NULL. */
    t = now_ns();
    CHECK(tp_future_wait_all(fs, N, 0.001, NULL) == TP_OK);
    CHECK(now_ns() == t);
    /* A NULL entry is TP_EINVAL. */
    tp_future *with_null[2] = {fs[0], NULL};
    CHECK(tp_future_wait_all(with_null, 2, TP_TIMEOUT_INFINITE, &idx) == TP_EINVAL);
    for (int i = 0; i < N; i++)
        tp_future_free(fs[i]);
}

static void test_future_wait_all_empty_and_all_ok(void **state) {
    (void)state;
    world w = {.scenario = sc_wait_all_empty_and_ok};
    run_world(2, 9, &w);
}

static void sc_wait_all_first_error(world *w) {
    (void)w;
    /* One failure among long calls: returned at once, the rest left pending. */
    uint64_t t0 = now_ns();
    tp_future *fs[4] = {
        async_sleep("w1", 5.0, 0, TP_TIMEOUT_INFINITE),
        async_sleep("w1", 5.0, 1, TP_TIMEOUT_INFINITE),
        async_fail("w1", 0.0),
        async_sleep("w1", 5.0, 3, TP_TIMEOUT_INFINITE),
    };
    size_t idx = 77;
    CHECK(tp_future_wait_all(fs, 4, TP_TIMEOUT_INFINITE, &idx) == TP_EREMOTE);
    CHECK(idx == 2);
    CHECK(now_ns() - t0 < 10 * MS);
    CHECK(strstr(tp_errmsg(), "deliberate failure") != NULL);
    CHECK(!tp_future_done(fs[0]) && !tp_future_done(fs[1]) && !tp_future_done(fs[3]));
    /* The others go on and succeed (wait_all changed nothing). */
    for (int i = 0; i < 4; i++)
        if (i != 2)
            CHECK(tp_future_wait(fs[i], TP_TIMEOUT_INFINITE) == TP_OK && int_of(fs[i]) == i);
    for (int i = 0; i < 4; i++)
        tp_future_free(fs[i]);

    /* The first to fail in time wins, not the lowest index. */
    t0 = now_ns();
    tp_future *gs[3] = {
        async_fail("w1", 0.5),
        async_fail("w1", 0.2),
        async_sleep("w1", 5.0, 2, TP_TIMEOUT_INFINITE),
    };
    idx = 77;
    CHECK(tp_future_wait_all(gs, 3, TP_TIMEOUT_INFINITE, &idx) == TP_EREMOTE);
    CHECK(idx == 1);
    CHECK(within(now_ns() - t0, 200 * MS, 200 * MS + 2 * HOP_NS + TOL_NS));
    CHECK(strstr(tp_errmsg(), "after 0.2 s") != NULL);
    CHECK(!tp_future_done(gs[0]));

    /* When several have failed already, the lowest index wins. */
    CHECK(tp_sleep(1.0) == TP_OK);
    CHECK(tp_future_done(gs[0]) && tp_future_done(gs[1]) && !tp_future_done(gs[2]));
    idx = 77;
    uint64_t t1 = now_ns();
    CHECK(tp_future_wait_all(gs, 3, TP_TIMEOUT_INFINITE, &idx) == TP_EREMOTE);
    CHECK(idx == 0);
    CHECK(now_ns() == t1);
    CHECK(strstr(tp_errmsg(), "after 0.5 s") != NULL);
    for (int i = 0; i < 3; i++)
        tp_future_free(gs[i]); /* gs[2] still pending: freeing it is safe (FUTURE-4) */
}

static void test_future_wait_all_first_error_wins(void **state) {
    (void)state;
    world w = {.scenario = sc_wait_all_first_error};
    run_world(2, 10, &w);
}

static void sc_wait_all_timeout(world *w) {
    (void)w;
    tp_future *fs[4] = {
        async_echo("w1", 0),
        async_sleep("w1", 3.0, 1, TP_TIMEOUT_INFINITE),
        async_echo("w1", 2),
        async_sleep("w1", 2.0, 3, TP_TIMEOUT_INFINITE),
    };
    CHECK(tp_future_wait(fs[0], TP_TIMEOUT_INFINITE) == TP_OK);
    CHECK(tp_future_wait(fs[2], TP_TIMEOUT_INFINITE) == TP_OK);
    uint64_t t0 = now_ns();
    size_t idx = 77;
    CHECK(tp_future_wait_all(fs, 4, 0.5, &idx) == TP_ETIMEDOUT);
    CHECK(strstr(tp_errmsg(), "wait_all: timed out with 2 of 4 futures pending") != NULL);
    CHECK(idx == 1); /* the lowest index still pending */
    CHECK(within(now_ns() - t0, 500 * MS, 500 * MS + TOL_NS));
    CHECK(!tp_future_done(fs[1]) && !tp_future_done(fs[3]));
    /* No index asked for: the same timeout, nothing written. */
    CHECK(tp_future_wait_all(fs, 4, 0.1, NULL) == TP_ETIMEDOUT);
    CHECK(tp_future_status(fs[1]) == TP_EINVAL); /* still pending, untouched */

    /* -1 reads the default when the wait begins. */
    CHECK(tp_set_rpc_timeout(0.25) == TP_OK);
    t0 = now_ns();
    idx = 77;
    CHECK(tp_future_wait_all(fs, 4, TP_TIMEOUT_DEFAULT, &idx) == TP_ETIMEDOUT);
    CHECK(within(now_ns() - t0, 250 * MS, 250 * MS + TOL_NS));
    CHECK(idx == 1);

    /* Past fs[3]'s end but not fs[1]'s: the lowest pending index is still 1. */
    CHECK(tp_sleep(1.5) == TP_OK);
    CHECK(tp_future_done(fs[3]) && !tp_future_done(fs[1]));
    idx = 77;
    CHECK(tp_future_wait_all(fs, 4, 0.1, &idx) == TP_ETIMEDOUT);
    CHECK(idx == 1);
    /* Then everything completes. */
    idx = 77;
    CHECK(tp_future_wait_all(fs, 4, TP_TIMEOUT_INFINITE, &idx) == TP_OK);
    CHECK(idx == 4);
    for (int i = 0; i < 4; i++) {
        CHECK(int_of(fs[i]) == i);
        tp_future_free(fs[i]);
    }
}

static void test_future_wait_all_timeout_lowest_pending(void **state) {
    (void)state;
    world w = {.scenario = sc_wait_all_timeout};
    run_world(2, 11, &w);
}

/* A one-host world: calls to itself go through the loopback (CALL-3). */
static void sc_single_host(world *w) {
    (void)w;
    then_probe p = {.parent_done = 1};
    tp_future *f = async_sleep("w0", 0.3, 41, TP_TIMEOUT_INFINITE);
    CHECK(tp_future_wait(f, 0.1) == TP_ETIMEDOUT);
    CHECK(!tp_future_done(f));
    tp_future *ch = NULL;
    p.returned = 0;
    CHECK(tp_future_then(f, cb_add1, &p, &ch) == TP_OK);
    p.returned = 1;
    CHECK(tp_future_wait(ch, TP_TIMEOUT_INFINITE) == TP_OK);
    CHECK(int_of(ch) == 42);
    CHECK(p.calls == 1 && p.ran_inline == 0);
    tp_future_free(f);
    tp_future_free(ch);
}

static void test_future_single_host_loopback(void **state) {
    (void)state;
    world w = {.scenario = sc_single_host};
    run_world(1, 12, &w);
}

/* FUTURE-2: only tasks of the future's worker may wait on it. */
static struct {
    tp_future *shared; /* w0's pending future, published for w1 */
    int foreign_done;
    tp_status wait_st, wait_all_st;
    uint64_t waited_ns;
} g_foreign;

static void sc_foreign_owner(world *w) {
    (void)w;
    tp_future *f = async_sleep("w1", 1.0, 5, TP_TIMEOUT_INFINITE);
    g_foreign.shared = f;
    CHECK(tp_future_wait(f, TP_TIMEOUT_INFINITE) == TP_OK);
    CHECK(int_of(f) == 5);
    while (!g_foreign.foreign_done)
        CHECK(tp_sleep(0.01) == TP_OK);
    g_foreign.shared = NULL;
    tp_future_free(f);
}

static void sc_foreign_waiter(world *w) {
    (void)w;
    while (!g_foreign.shared)
        CHECK(tp_sleep(0.001) == TP_OK);
    uint64_t t = now_ns();
    g_foreign.wait_st = tp_future_wait(g_foreign.shared, 0.5);
    size_t idx = 0;
    g_foreign.wait_all_st = tp_future_wait_all(&g_foreign.shared, 1, 0.5, &idx);
    g_foreign.waited_ns = now_ns() - t;
    g_foreign.foreign_done = 1;
}

/*
 * FUTURE-11 under memory exhaustion: collect_all of one completed future,
 * with its k-th calloc failing, for k = 1, 2, ... until none fails. Each
 * failure is reported (collect_all itself fails, or its future completes
 * with TP_ENOMEM naming the statuses), nothing is lost (LeakSanitizer
 * checks the partial list of statuses is freed when its status item cannot
 * be made), and with no failure the answer is the one status.
 */
static void sc_collect_all_out_of_memory(world *w) {
    (void)w;
#if ALLOC_FAULT_HOOK
    int nomem_calls = 0, nomem_futures = 0, whole = 0;
    for (unsigned k = 1; k <= 32 && !whole; k++) {
        tp_future *in = NULL, *all = NULL;
        if (tp_future_new(&in) != TP_OK) {
            CHECK(0);
            return;
        }
        CHECK(tp_future_set_result(in, tp_value_int(5)) == TP_OK);
        calloc_failed = 0;
        calloc_countdown = k;
        tp_status st = tp_future_collect_all(&in, 1, &all);
        calloc_countdown = 0;
        if (!calloc_failed) {
            whole = 1;
            CHECK(st == TP_OK && all != NULL);
            CHECK(tp_future_done(all) && tp_future_status(all) == TP_OK);
            const tp_value *v = tp_future_value(all);
            int64_t s0 = -1;
            CHECK(tp_list_len(v) == 1 && tp_value_get_int(tp_list_get(v, 0), &s0) == TP_OK &&
                  s0 == TP_OK);
        } else if (st != TP_OK) {
            nomem_calls++;
            CHECK(st == TP_ENOMEM && all == NULL);
            CHECK(strstr(tp_errmsg(), "collect_all: out of memory") != NULL);
        } else {
            nomem_futures++;
            CHECK(all != NULL && tp_future_done(all));
            CHECK(tp_future_status(all) == TP_ENOMEM);
            CHECK(tp_future_value(all) == NULL);
            CHECK(strcmp(tp_future_error(all), "collect_all: out of memory for the statuses") == 0);
        }
        int64_t x = 0;
        CHECK(tp_value_get_int(tp_future_value(in), &x) == TP_OK && x == 5); /* untouched */
        tp_future_free(all);
        tp_future_free(in);
    }
    CHECK(whole);
    CHECK(nomem_calls >= 1);   /* its own record */
    CHECK(nomem_futures >= 2); /* the list, then the status to put in it */
#endif
}

/* wait_all without memory for its waiters or its log of completions (the
 * first or the second calloc failing): TP_ENOMEM, saying so, nothing kept. */
static void sc_wait_all_out_of_memory(world *w) {
    (void)w;
#if ALLOC_FAULT_HOOK
    tp_future *fs[2] = {NULL, NULL};
    CHECK(tp_future_new(&fs[0]) == TP_OK && tp_future_new(&fs[1]) == TP_OK);
    for (unsigned k = 1; k <= 2; k++) {
        size_t idx = 77;
        calloc_failed = 0;
        calloc_countdown = k;
        tp_status st = tp_future_wait_all(fs, 2, 0.1, &idx);
        calloc_countdown = 0;
        CHECK(calloc_failed);
        CHECK(st == TP_ENOMEM);
        CHECK(strstr(tp_errmsg(), "wait_all: out of memory for 2 waiters") != NULL);
    }
    size_t idx = 77;
    CHECK(tp_future_wait_all(fs, 2, 0.1, &idx) == TP_ETIMEDOUT && idx == 0);
    tp_future_free(fs[0]);
    tp_future_free(fs[1]);
#endif
}

static void test_future_wait_all_out_of_memory(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) /* under valgrind, or not GCC */
        skip();
    world w = {.scenario = sc_wait_all_out_of_memory};
    run_world(1, 13, &w);
}

/* FUNC-7: a function that answers later when the callee has no memory to
 * record that: the caller gets TP_EREMOTE saying so, and the callee keeps
 * no reference to the function's future (the function's own is the last:
 * freeing it frees the future, and the core can go at shutdown). */
static void sc_answer_later_out_of_memory(world *w) {
    (void)w;
#if ALLOC_FAULT_HOOK
    tp_value *res = NULL;
    tp_status st = tp_rpc_sync(tp_to_name("w1"), "later_nomem", NULL, NULL, 5.0, &res);
    tp_value_free(res);
    CHECK(st == TP_EREMOTE);
    CHECK(strstr(tp_errmsg(), "out of memory to answer later") != NULL);
#endif
}

static void later_nomem_others(world *w) {
    (void)w;
    CHECK(tp_sleep(0.5) == TP_OK);
    CHECK(calloc_failed);
    tp_future_free(later_nomem_f); /* the last reference */
    later_nomem_f = NULL;
}

static void test_future_answer_later_out_of_memory(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) /* under valgrind, or not GCC */
        skip();
    world w = {.scenario = sc_answer_later_out_of_memory, .others = later_nomem_others};
    run_world(2, 17, &w);
    assert_int_equal(tp_core_live_count(), 0);
}

static void test_future_collect_all_out_of_memory(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) /* under valgrind, or not GCC */
        skip();
    world w = {.scenario = sc_collect_all_out_of_memory};
    run_world(1, 13, &w);
}

/*
 * CALL-1: a call that cannot be registered (its id map cannot grow: every
 * calloc of the next table size fails) fails TP_ENOMEM at once, saying so,
 * and goes nowhere; the calls before it, and one made once memory is back,
 * complete. A call that went out unregistered could never be answered and
 * would end only at its deadline.
 */
static void sc_call_registration_out_of_memory(world *w) {
    (void)w;
#if ALLOC_FAULT_HOOK
    enum { CALLS_MAX = 64 };
    tp_future *fs[CALLS_MAX] = {NULL};
    int n = 0, failed = 0;
    while (n < CALLS_MAX && !failed) {
        tp_value *args = tp_value_list_of(2, tp_value_float(0.5), tp_value_int(n));
        atomic_store(&calloc_pair_failed, 0);
        atomic_store(&calloc_fail_size, sizeof(tpi_idmap_slot));
        atomic_store(&calloc_fail_n, 32); /* the calls' map, growing from 16 slots */
        tp_status st = tp_rpc_async(tp_to_name("w1"), "sleep", args, NULL, 5.0, &fs[n]);
        atomic_store(&calloc_fail_n, 0);
        tp_value_free(args);
        if (st == TP_OK) {
            CHECK(atomic_load(&calloc_pair_failed) == 0);
            n++;
            continue;
        }
        failed = 1;
        CHECK(st == TP_ENOMEM && fs[n] == NULL);
        CHECK(atomic_load(&calloc_pair_failed) == 1);
        CHECK(strstr(tp_errmsg(), "out of memory registering the call") != NULL);
    }
    CHECK(failed);
    CHECK(n >= 8); /* the map grew only once it held most of 16 */
    tp_future *after = async_sleep("w1", 0.5, 99, 5.0);
    uint64_t t0 = now_ns();
    for (int i = 0; i < n; i++) {
        CHECK(tp_future_wait(fs[i], TP_TIMEOUT_INFINITE) == TP_OK);
        CHECK(int_of(fs[i]) == i);
        tp_future_free(fs[i]);
    }
    CHECK(after && tp_future_wait(after, TP_TIMEOUT_INFINITE) == TP_OK && int_of(after) == 99);
    CHECK(now_ns() - t0 < 1 * SEC); /* answered, not ended by the 5 s deadline */
    tp_future_free(after);
#endif
}

static void test_future_call_registration_out_of_memory(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) /* under valgrind, or not GCC */
        skip();
    world w = {.scenario = sc_call_registration_out_of_memory};
    run_world(2, 17, &w);
}

/*
 * then and add_done_callback under memory exhaustion: the k-th calloc of
 * each fails, for k = 1, 2, ... until none does. A failure is TP_ENOMEM
 * with a message, no chained future, and the callback never runs; with
 * none, the callback runs once when its future completes.
 */
static int oom_then_runs, oom_done_runs;

static tp_status oom_then_cb(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                             void *ud) {
    (void)f, (void)errmsg, (void)errmsg_len, (void)ud;
    oom_then_runs++;
    *result = tp_value_int(1);
    return TP_OK;
}

static void oom_done_cb(tp_future *f, void *ud) {
    (void)f, (void)ud;
    oom_done_runs++;
}

static void sc_then_out_of_memory(world *w) {
    (void)w;
#if ALLOC_FAULT_HOOK
    for (int done = 0; done <= 1; done++) {
        int nomem = 0, whole = 0;
        for (unsigned k = 1; k <= 16 && !whole; k++) {
            tp_future *in = NULL, *chained = NULL;
            if (tp_future_new(&in) != TP_OK) {
                CHECK(0);
                return;
            }
            oom_then_runs = oom_done_runs = 0;
            calloc_failed = 0;
            calloc_countdown = k;
            tp_status st = done ? tp_future_add_done_callback(in, oom_done_cb, NULL)
                                : tp_future_then(in, oom_then_cb, NULL, &chained);
            calloc_countdown = 0;
            whole = !calloc_failed;
            if (calloc_failed) {
                nomem++;
                CHECK(st == TP_ENOMEM && chained == NULL);
                CHECK(strstr(tp_errmsg(), done ? "add_done_callback: out of memory"
                                               : "future then: out of memory") != NULL);
            } else {
                CHECK(st == TP_OK && (done || chained != NULL));
            }
            CHECK(tp_future_set_result(in, tp_value_int(5)) == TP_OK);
            if (chained)
                CHECK(tp_future_wait(chained, 10.0) == TP_OK);
            CHECK(tp_sleep(0.01) == TP_OK); /* callbacks run on the pool */
            CHECK((done ? oom_done_runs : oom_then_runs) == (calloc_failed ? 0 : 1));
            tp_future_free(chained);
            tp_future_free(in);
        }
        CHECK(whole);
        CHECK(nomem >= 1); /* the continuation's own record */
    }
#endif
}

static void test_future_then_out_of_memory(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) /* under valgrind, or not GCC */
        skip();
    world w = {.scenario = sc_then_out_of_memory};
    run_world(1, 13, &w);
}

/* FUTURE-2: only the future's own worker may wait on it; another worker's
 * task gets TP_EINVAL at once (it must not park on an agent not its own). */
static void test_future_wait_from_other_worker_einval(void **state) {
    (void)state;
    memset(&g_foreign, 0, sizeof g_foreign);
    world w = {.scenario = sc_foreign_owner, .others = sc_foreign_waiter};
    run_world(2, 13, &w);
    if (g_foreign.wait_st != TP_EINVAL || g_foreign.wait_all_st != TP_EINVAL)
        fail_msg("foreign wait gave %s, wait_all %s after %llu ns; FUTURE-2 wants TP_EINVAL",
                 tp_status_name(g_foreign.wait_st), tp_status_name(g_foreign.wait_all_st),
                 (unsigned long long)g_foreign.waited_ns);
    assert_true(g_foreign.waited_ns == 0);
}

/* NULL arguments need no worker (ERR-3: TP_EINVAL, out pointers set to NULL). */
static void done_noop(tp_future *f, void *user_data) {
    (void)f, (void)user_data;
}

static void test_future_null_arguments(void **state) {
    (void)state;
    tp_future_free(NULL); /* a no-op (FUTURE-4) */
    assert_int_equal(tp_future_wait(NULL, TP_TIMEOUT_INFINITE), TP_EINVAL);
    int dummy = 0;
    tp_future *x = (tp_future *)&dummy;
    assert_int_equal(tp_future_then(NULL, cb_add1, NULL, &x), TP_EINVAL);
    assert_int_equal(tp_future_then(NULL, cb_add1, NULL, NULL), TP_EINVAL);
    tp_future *none[2] = {NULL, NULL};
    size_t idx = 77;
    assert_int_equal(tp_future_wait_all(none, 2, TP_TIMEOUT_INFINITE, &idx), TP_EINVAL);
    assert_int_equal(tp_future_wait_all(NULL, 2, TP_TIMEOUT_INFINITE, &idx), TP_EINVAL);
    assert_int_equal(tp_future_wait_all(NULL, 0, TP_TIMEOUT_INFINITE, &idx), TP_OK);
    assert_int_equal(idx, 0);
    /* ERR-3: a failed check sets every out pointer to NULL. */
    assert_null(x);
    assert_int_equal(tp_future_add_done_callback(NULL, done_noop, NULL), TP_EINVAL);
}

/* A done-callback needs a function too: NULL is refused, saying so, and
 * the future completes as if it had never been asked. */
static void sc_done_callback_null(world *w) {
    (void)w;
    tp_future *u = NULL;
    CHECK(tp_future_new(&u) == TP_OK);
    CHECK(tp_future_add_done_callback(u, NULL, NULL) == TP_EINVAL);
    CHECK(strstr(tp_errmsg(), "callback is NULL") != NULL);
    CHECK(tp_future_set_result(u, tp_value_int(1)) == TP_OK);
    CHECK(tp_future_wait(u, 1.0) == TP_OK);
    tp_future_free(u);
}

static void test_future_done_callback_needs_a_function(void **state) {
    (void)state;
    world w = {.scenario = sc_done_callback_null};
    run_world(1, 17, &w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_handle_queries),
        cmocka_unit_test_setup(test_future_wait_deadline_leaves_pending, reset_failures),
        cmocka_unit_test_setup(test_future_wait_ends_at_call_deadline, reset_failures),
        cmocka_unit_test_setup(test_future_many_waiters, reset_failures),
        cmocka_unit_test_setup(test_future_done_never_blocks, reset_failures),
        cmocka_unit_test_setup(test_future_then_runs_once_not_inline, reset_failures),
        cmocka_unit_test_setup(test_future_then_error_propagation, reset_failures),
        cmocka_unit_test_setup(test_future_then_error_without_message_names_status, reset_failures),
        cmocka_unit_test_setup(test_future_then_chain_100, reset_failures),
        cmocka_unit_test_setup(test_future_then_registration_order, reset_failures),
        cmocka_unit_test_setup(test_future_wait_all_empty_and_all_ok, reset_failures),
        cmocka_unit_test_setup(test_future_wait_all_first_error_wins, reset_failures),
        cmocka_unit_test_setup(test_future_wait_all_timeout_lowest_pending, reset_failures),
        cmocka_unit_test_setup(test_future_single_host_loopback, reset_failures),
        cmocka_unit_test_setup(test_future_wait_from_other_worker_einval, reset_failures),
        cmocka_unit_test_setup(test_future_collect_all_out_of_memory, reset_failures),
        cmocka_unit_test_setup(test_future_wait_all_out_of_memory, reset_failures),
        cmocka_unit_test_setup(test_future_answer_later_out_of_memory, reset_failures),
        cmocka_unit_test_setup(test_future_then_out_of_memory, reset_failures),
        cmocka_unit_test_setup(test_future_call_registration_out_of_memory, reset_failures),
        cmocka_unit_test(test_future_null_arguments),
        cmocka_unit_test_setup(test_future_done_callback_needs_a_function, reset_failures),
    };
    return cmocka_run_group_tests_name("future", tests, NULL, NULL);
}
