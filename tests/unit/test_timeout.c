/*
 * test_timeout.c: call deadlines (spec/calls.md TIMEOUT-1..6, FUTURE-8,
 * api.md FUNC-4) through the public API on the simulator. Virtual time is
 * exact (SIM-1), so every deadline is checked to the microsecond:
 * a timed-out call's late reply is dropped, -1 reads the default at issue,
 * 0 never times out, bad values are refused before anything is sent, 1000
 * random deadlines in flight each fire at their own time, and a timeout
 * still fires when the worker's only pool task is blocked in a nested call
 * (the PyTorch 1.13 pool-starvation hang), and the agent's timer is armed
 * only for a deadline earlier than the one it holds.
 *
 * Checks inside simulated tasks use CHECK (counted, reported after the run):
 * a cmocka assertion would longjmp off a fiber's stack.
 */
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
#include "tensorplay/rpc_backend.h"
#include "tensorplay/sim.h"

#include "sim_world.h"
#include "sim_wrap.h"

/* ---- A wrapper backend, "SIM_ARMS": counts w0's timer_arm downcalls ------------------- */

static int w0_arms;

static void counting_timer_arm(tp_agent *a, uint64_t deadline_ns) {
    if (tp_sim_current_host() == 0)
        w0_arms++;
    sim_ops->timer_arm(a, deadline_ns);
}

static void wrap_ops_edit(const tp_init_params *p, tp_agent *agent, tp_agent_ops *ops) {
    (void)p, (void)agent;
    ops->timer_arm = counting_timer_arm;
}

/* What the served functions saw, shared by every host (one process). */
static struct {
    int count_calls;      /* "count" ran */
    int sleeps_done;      /* "sleep" returned */
    uint64_t sleep_start; /* virtual time "sleep" last started */
    tp_status nested_st;  /* the nested call's status in "nested" */
    uint64_t nested_ns;   /* how long the nested call took */
    uint64_t nested_end;  /* virtual time "nested" returned */
    char nested_msg[TP_ERRMSG_LEN_MAX];
} g;

static int reset(void **state) {
    (void)state;
    failures = 0;
    memset(&g, 0, sizeof g);
    return 0;
}

/* ---- Functions the workers serve ---------------------------------------------------- */

static tp_status fn_echo(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)call, (void)kwargs, (void)user_data;
    *result = tp_list_len(args) ? tp_value_clone(tp_list_get(args, 0)) : NULL;
    return TP_OK;
}

static tp_status fn_count(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)result, (void)user_data;
    g.count_calls++;
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
    g.sleep_start = now_ns();
    tp_status st = tp_sleep(s);
    if (st != TP_OK)
        return st;
    g.sleeps_done++;
    *result = tp_list_len(args) > 1 ? tp_value_clone(tp_list_get(args, 1)) : NULL;
    return TP_OK;
}

/* nested(target, seconds, timeout): rpc_sync(target, "sleep", [seconds]) with the
 * timeout, from a pool task; records what happened and returns the elapsed ns. */
static tp_status fn_nested(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    const char *target = NULL;
    size_t len = 0;
    double s = 0, timeout = 0;
    if (tp_value_get_str(tp_list_get(args, 0), &target, &len) != TP_OK ||
        tp_value_get_float(tp_list_get(args, 1), &s) != TP_OK ||
        tp_value_get_float(tp_list_get(args, 2), &timeout) != TP_OK) {
        tp_call_set_error(call, "nested takes (target, seconds, timeout)");
        return TP_EINVAL;
    }
    tp_value *a = tp_value_list_of(2, tp_value_float(s), tp_value_int(1));
    tp_value *r = NULL;
    uint64_t t0 = now_ns();
    g.nested_st = tp_rpc_sync(tp_to_name(target), "sleep", a, NULL, timeout, &r);
    g.nested_ns = now_ns() - t0;
    snprintf(g.nested_msg, sizeof g.nested_msg, "%s", tp_errmsg());
    tp_value_free(a);
    tp_value_free(r);
    g.nested_end = now_ns();
    *result = tp_value_int((int64_t)g.nested_ns);
    return TP_OK;
}

/* ---- Worlds -------------------------------------------------------------------------- */

static void world_register(void) {
    CHECK(tp_register_function("echo", fn_echo, NULL) == TP_OK);
    CHECK(tp_register_function("count", fn_count, NULL) == TP_OK);
    CHECK(tp_register_function("sleep", fn_sleep, NULL) == TP_OK);
    CHECK(tp_register_function("nested", fn_nested, NULL) == TP_OK);
}

/* ---- Call helpers (inside the scenario) ------------------------------------------------ */

static tp_value *sleep_args(double s, int64_t ret) {
    return tp_value_list_of(2, tp_value_float(s), tp_value_int(ret));
}

static tp_future *async_sleep(const char *to, double s, int64_t ret, double timeout_s) {
    tp_value *a = sleep_args(s, ret);
    tp_future *f = NULL;
    tp_status st = tp_rpc_async(tp_to_name(to), "sleep", a, NULL, timeout_s, &f);
    tp_value_free(a);
    CHECK(st == TP_OK && f != NULL);
    return f;
}

/* rpc_sync to "sleep"; *ret gets the int result (INT64_MIN on failure). */
static tp_status sync_sleep(const char *to, double s, int64_t x, double timeout_s, int64_t *ret) {
    tp_value *a = sleep_args(s, x);
    tp_value *r = NULL;
    tp_status st = tp_rpc_sync(tp_to_name(to), "sleep", a, NULL, timeout_s, &r);
    tp_value_free(a);
    *ret = INT64_MIN;
    if (st == TP_OK)
        CHECK(tp_value_get_int(r, ret) == TP_OK);
    else
        CHECK(r == NULL);
    tp_value_free(r);
    return st;
}

static int64_t int_of(const tp_future *f) {
    int64_t x = INT64_MIN;
    const tp_value *v = f ? tp_future_value(f) : NULL;
    if (!v || tp_value_get_int(v, &x) != TP_OK)
        return INT64_MIN;
    return x;
}

/* ---- TIMEOUT-5: the deadline fails the call; its late reply is dropped ------------------ */

static void sc_late_reply(world *w) {
    (void)w;
    int64_t x = 0;
    uint64_t t0 = now_ns();
    CHECK(sync_sleep("w1", 0.5, 111, 0.1, &x) == TP_ETIMEDOUT);
    CHECK(within(now_ns() - t0, 100 * MS, 100 * MS + TOL_NS));
    CHECK(strcmp(tp_errmsg(),
                 "rpc_sync to worker 'w1' (id 1), function 'sleep': timed out after 100 ms") == 0);
    /* A later call is in flight when the late reply (at ~0.5 s) comes in. */
    uint64_t t1 = now_ns();
    tp_future *f2 = async_sleep("w1", 1.0, 222, 5.0);
    CHECK(tp_future_wait(f2, TP_TIMEOUT_INFINITE) == TP_OK);
    CHECK(int_of(f2) == 222); /* its own value, not the late 111 */
    CHECK(within(now_ns() - t1, 1 * SEC, 1 * SEC + 2 * HOP_NS));
    CHECK(g.sleeps_done == 2); /* the callee ran the timed-out call to its end */

    /* An async call that times out stays failed when its reply arrives later. */
    tp_future *f3 = async_sleep("w1", 0.5, 333, 0.1);
    t1 = now_ns();
    CHECK(tp_future_wait(f3, TP_TIMEOUT_INFINITE) == TP_ETIMEDOUT);
    CHECK(within(now_ns() - t1, 100 * MS, 100 * MS + TOL_NS));
    CHECK(strcmp(tp_future_error(f3),
                 "rpc_async to worker 'w1' (id 1), function 'sleep': timed out after 100 ms") == 0);
    CHECK(tp_sleep(1.0) == TP_OK);
    CHECK(g.sleeps_done == 3);
    CHECK(tp_future_status(f3) == TP_ETIMEDOUT);
    CHECK(tp_future_value(f3) == NULL);
    /* And the worker still answers. */
    CHECK(sync_sleep("w1", 0.0, 444, TP_TIMEOUT_DEFAULT, &x) == TP_OK);
    CHECK(x == 444);
    tp_future_free(f2);
    tp_future_free(f3);
}

static void test_timeout_late_reply_dropped(void **state) {
    (void)state;
    world w = {.scenario = sc_late_reply};
    run_world(2, 21, &w);
}

/* TIMEOUT-5: the message gives the configured timeout in ms, printed with %g. */
static void sc_message_ms(world *w) {
    (void)w;
    int64_t x = 0;
    CHECK(sync_sleep("w1", 0.5, 1, 0.0015, &x) == TP_ETIMEDOUT);
    const char *want = "rpc_sync to worker 'w1' (id 1), function 'sleep': timed out after 1.5 ms";
    if (strcmp(tp_errmsg(), want) != 0) {
        failures++;
        print_error("TIMEOUT-5: message '%s', want '%s'\n", tp_errmsg(), want);
    }
}

/* TIMEOUT-5: the message gives the configured timeout ("1.5 ms"), not the
 * rounded-up value that travels on the wire ("2 ms"). */
static void test_timeout_message_gives_configured_ms(void **state) {
    (void)state;
    world w = {.scenario = sc_message_ms};
    run_world(2, 22, &w);
}

/* ---- TIMEOUT-2, TIMEOUT-4: -1 reads the default when the call is issued ------------------ */

static void sc_default_at_issue(world *w) {
    (void)w;
    CHECK(tp_get_rpc_timeout() == 0.25); /* init took it from the options */
    int64_t x = 0;
    uint64_t t0 = now_ns();
    CHECK(sync_sleep("w1", 1.0, 1, TP_TIMEOUT_DEFAULT, &x) == TP_ETIMEDOUT);
    CHECK(within(now_ns() - t0, 250 * MS, 250 * MS + TOL_NS));

    t0 = now_ns();
    CHECK(tp_set_rpc_timeout(0.2) == TP_OK);
    tp_future *f1 = async_sleep("w1", 2.0, 1, TP_TIMEOUT_DEFAULT);
    CHECK(tp_set_rpc_timeout(0.5) == TP_OK); /* f1 keeps its 0.2 s */
    tp_future *f2 = async_sleep("w1", 2.0, 2, TP_TIMEOUT_DEFAULT);
    CHECK(tp_set_rpc_timeout(5.0) == TP_OK);
    tp_future *f3 = async_sleep("w1", 1.0, 3, TP_TIMEOUT_DEFAULT);
    CHECK(tp_set_rpc_timeout(0.1) == TP_OK); /* does not cut f3 short */
    CHECK(tp_get_rpc_timeout() == 0.1);

    CHECK(tp_future_wait(f1, TP_TIMEOUT_INFINITE) == TP_ETIMEDOUT);
    CHECK(within(now_ns() - t0, 200 * MS, 200 * MS + TOL_NS));
    CHECK(strstr(tp_future_error(f1), "timed out after 200 ms") != NULL);
    CHECK(!tp_future_done(f2) && !tp_future_done(f3));
    CHECK(tp_future_wait(f2, TP_TIMEOUT_INFINITE) == TP_ETIMEDOUT);
    CHECK(within(now_ns() - t0, 500 * MS, 500 * MS + TOL_NS));
    CHECK(strstr(tp_future_error(f2), "timed out after 500 ms") != NULL);
    CHECK(!tp_future_done(f3));
    CHECK(tp_future_wait(f3, TP_TIMEOUT_INFINITE) == TP_OK);
    CHECK(int_of(f3) == 3);
    CHECK(within(now_ns() - t0, 1 * SEC, 1 * SEC + 2 * HOP_NS));

    /* Calls issued now use the latest default, 0.1 s. */
    t0 = now_ns();
    CHECK(sync_sleep("w1", 1.0, 4, TP_TIMEOUT_DEFAULT, &x) == TP_ETIMEDOUT);
    CHECK(within(now_ns() - t0, 100 * MS, 100 * MS + TOL_NS));
    tp_future_free(f1);
    tp_future_free(f2);
    tp_future_free(f3);
}

static void test_timeout_default_read_at_issue(void **state) {
    (void)state;
    world w = {.scenario = sc_default_at_issue, .set_rpc_timeout = 1, .rpc_timeout = 0.25};
    run_world(2, 23, &w);
}

/* ---- TIMEOUT-3: 0 means no deadline ------------------------------------------------ */

static void sc_zero_never(world *w) {
    (void)w;
    CHECK(tp_get_rpc_timeout() == 0.0); /* the options said 0 */
    int64_t x = 0;
    uint64_t t0 = now_ns();
    /* Default 0: a 10 s call completes. */
    CHECK(sync_sleep("w1", 10.0, 7, TP_TIMEOUT_DEFAULT, &x) == TP_OK);
    CHECK(x == 7);
    CHECK(within(now_ns() - t0, 10 * SEC, 10 * SEC + 2 * HOP_NS));
    /* Explicit 0 while the default is short. */
    CHECK(tp_set_rpc_timeout(0.5) == TP_OK);
    t0 = now_ns();
    CHECK(sync_sleep("w1", 10.0, 8, TP_TIMEOUT_INFINITE, &x) == TP_OK);
    CHECK(x == 8);
    CHECK(within(now_ns() - t0, 10 * SEC, 10 * SEC + 2 * HOP_NS));
    /* And the default set back to 0 through the API. */
    CHECK(tp_set_rpc_timeout(0.0) == TP_OK);
    CHECK(tp_get_rpc_timeout() == 0.0);
    tp_future *f = async_sleep("w1", 10.0, 9, TP_TIMEOUT_DEFAULT);
    CHECK(tp_future_wait(f, TP_TIMEOUT_INFINITE) == TP_OK);
    CHECK(int_of(f) == 9);
    tp_future_free(f);
}

static void test_timeout_zero_never_times_out(void **state) {
    (void)state;
    world w = {.scenario = sc_zero_never, .set_rpc_timeout = 1, .rpc_timeout = 0.0};
    run_world(2, 24, &w);
}

/* ---- TIMEOUT-1: bad values are refused before anything is sent ------------------------- */

static void sc_invalid(world *w) {
    (void)w;
    const double bad[] = {-2.0, -0.5, -1e-9, -INFINITY, INFINITY, NAN, 4e6 + 0.5, 1e300, -4e6};
    int sentinel = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tp_value *r = (tp_value *)&sentinel;
        CHECK(tp_rpc_sync(tp_to_name("w1"), "count", NULL, NULL, bad[i], &r) == TP_EINVAL);
        CHECK(r == NULL); /* ERR-3 */
        if (!isnan(bad[i])) {
            char num[64];
            snprintf(num, sizeof num, "%g", bad[i]);
            CHECK(strstr(tp_errmsg(), num) != NULL);
        }
        tp_future *f = (tp_future *)&sentinel;
        CHECK(tp_rpc_async(tp_to_name("w1"), "count", NULL, NULL, bad[i], &f) == TP_EINVAL);
        CHECK(f == NULL);
        /* Not a default either (TIMEOUT-4), nor a sleep (TIMEOUT-6). */
        CHECK(tp_set_rpc_timeout(bad[i]) == TP_EINVAL);
        CHECK(tp_sleep(bad[i]) == TP_EINVAL);
    }
    CHECK(tp_set_rpc_timeout(TP_TIMEOUT_DEFAULT) == TP_EINVAL);
    CHECK(tp_sleep(TP_TIMEOUT_DEFAULT) == TP_EINVAL);
    CHECK(tp_get_rpc_timeout() == TP_DEFAULT_RPC_TIMEOUT_S); /* unchanged throughout */

    /* Waits check their own timeout too. */
    tp_future *ok = NULL;
    CHECK(tp_rpc_async(tp_to_name("w1"), "count", NULL, NULL, 4e6, &ok) == TP_OK); /* edge */
    CHECK(tp_future_wait(ok, -2.0) == TP_EINVAL);
    CHECK(tp_future_wait(ok, NAN) == TP_EINVAL);
    size_t idx = 0;
    CHECK(tp_future_wait_all(&ok, 1, -0.5, &idx) == TP_EINVAL);
    CHECK(tp_future_wait(ok, TP_TIMEOUT_INFINITE) == TP_OK);
    /* Done now: an invalid timeout is still refused (FUTURE-2), so whether
     * an argument is valid never depends on timing. */
    CHECK(tp_future_wait(ok, -2.0) == TP_EINVAL);
    CHECK(strstr(tp_errmsg(), "-2") != NULL);
    CHECK(tp_future_wait_all(&ok, 1, NAN, &idx) == TP_EINVAL);
    CHECK(tp_future_wait_all(&ok, 0, -0.5, &idx) == TP_EINVAL);
    CHECK(tp_future_wait(ok, TP_TIMEOUT_DEFAULT) == TP_OK);
    tp_future_free(ok);
    /* 0 sleeps return at once. */
    uint64_t t = now_ns();
    CHECK(tp_sleep(0.0) == TP_OK);
    CHECK(now_ns() == t);
    /* Only the one valid call reached the callee. */
    CHECK(tp_sleep(1.0) == TP_OK);
    CHECK(g.count_calls == 1);
}

static void test_timeout_invalid_values_rejected(void **state) {
    (void)state;
    world w = {.scenario = sc_invalid};
    run_world(2, 25, &w);
}

/* ---- TIMEOUT-3, TIMEOUT-5: 1000 random deadlines in flight ------------------------------ */

enum { NCALLS = 1000 };

typedef struct inflight {
    tp_future *f;
    double timeout_s;
    uint64_t deadline_ns;
} inflight;

static inflight g_calls[NCALLS];
static int g_order[NCALLS];

static int by_deadline(const void *a, const void *b) {
    const inflight *x = &g_calls[*(const int *)a], *y = &g_calls[*(const int *)b];
    if (x->deadline_ns != y->deadline_ns)
        return x->deadline_ns < y->deadline_ns ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

static void sc_many_deadlines(world *w) {
    (void)w;
    /* Every reply from w1 is delayed by 30 s (a fault), so every call times out. */
    for (int i = 0; i < NCALLS; i++) {
        /* 1 us .. 10 s at 1 ns resolution, from the workload stream. */
        uint64_t ns = 1000 + tp_sim_random() % (10 * SEC - 1000);
        g_calls[i].timeout_s = (double)ns / 1e9;
        uint64_t issued = now_ns();
        tp_value *a = tp_value_list_of(1, tp_value_int(i));
        CHECK(tp_rpc_async(tp_to_name("w1"), "echo", a, NULL, g_calls[i].timeout_s,
                           &g_calls[i].f) == TP_OK);
        tp_value_free(a);
        /* TIMEOUT-3: deadline = now + ceil(t * 1e9), at issue. */
        g_calls[i].deadline_ns = issued + (uint64_t)ceil(g_calls[i].timeout_s * 1e9);
        g_order[i] = i;
    }
    qsort(g_order, NCALLS, sizeof g_order[0], by_deadline);
    int checked_sweeps = 0;
    for (int k = 0; k < NCALLS; k++) {
        inflight *c = &g_calls[g_order[k]];
        if (!c->f)
            continue;
        CHECK(tp_future_wait(c->f, TP_TIMEOUT_INFINITE) == TP_ETIMEDOUT);
        uint64_t t = now_ns();
        /* Each fails at its own deadline (or at once if that passed already). */
        CHECK(t >= c->deadline_ns);
        if (t > c->deadline_ns + TOL_NS) {
            failures++;
            print_error("call %d (timeout %.9f s) ended %llu ns after its deadline\n", g_order[k],
                        c->timeout_s, (unsigned long long)(t - c->deadline_ns));
        }
        CHECK(strstr(tp_future_error(c->f), "timed out after") != NULL);
        /* At this instant: none done before its deadline, none late beyond the slack. */
        if (k % 10 == 0 || k == NCALLS - 1) {
            checked_sweeps++;
            for (int j = 0; j < NCALLS; j++) {
                const inflight *o = &g_calls[j];
                if (!o->f)
                    continue;
                int done = tp_future_done(o->f);
                if (done && o->deadline_ns > t) {
                    failures++;
                    print_error("call %d done at %llu before its deadline %llu\n", j,
                                (unsigned long long)t, (unsigned long long)o->deadline_ns);
                }
                if (!done && o->deadline_ns + TOL_NS < t) {
                    failures++;
                    print_error("call %d pending at %llu past its deadline %llu\n", j,
                                (unsigned long long)t, (unsigned long long)o->deadline_ns);
                }
                if (done)
                    CHECK(tp_future_status(o->f) == TP_ETIMEDOUT);
            }
        }
    }
    CHECK(checked_sweeps == 101);
    /* The delayed replies arrive later and are dropped; the futures stay failed. */
    CHECK(tp_sleep(40.0) == TP_OK);
    for (int i = 0; i < NCALLS; i++) {
        CHECK(tp_future_status(g_calls[i].f) == TP_ETIMEDOUT);
        CHECK(tp_future_value(g_calls[i].f) == NULL);
        tp_future_free(g_calls[i].f);
        g_calls[i].f = NULL;
    }
}

static void test_timeout_many_deadlines_ordered(void **state) {
    (void)state;
    world w = {.scenario = sc_many_deadlines};
    run_world_delayed(2, 26, &w, 30.0);
}

/* ---- FUTURE-8, FUNC-4: timeouts need no pool slot --------------------------------------- */

/* w1 has one pool task; "nested" takes it and calls target's "sleep" (10 s)
 * with a 0.1 s timeout. When the target is w1 itself, the request queues behind
 * "nested" and cannot even start: only a timeout delivered outside the pool
 * ends the wait. */
static void nested_scenario(const char *target) {
    tp_value *a =
        tp_value_list_of(3, tp_value_str(target), tp_value_float(10.0), tp_value_float(0.1));
    tp_value *r = NULL;
    uint64_t t0 = now_ns();
    tp_status st = tp_rpc_sync(tp_to_name("w1"), "nested", a, NULL, 30.0, &r);
    tp_value_free(a);
    CHECK(st == TP_OK);
    if (st != TP_OK)
        print_error("nested via %s: %s\n", target, tp_errmsg());
    int64_t took = -1;
    CHECK(r && tp_value_get_int(r, &took) == TP_OK);
    tp_value_free(r);
    CHECK(g.nested_st == TP_ETIMEDOUT);
    CHECK(within(g.nested_ns, 100 * MS, 100 * MS + TOL_NS));
    CHECK(took == (int64_t)g.nested_ns);
    CHECK(strstr(g.nested_msg, "timed out after 100 ms") != NULL);
    /* The whole outer call took the nested timeout plus two hops. */
    CHECK(within(now_ns() - t0, 100 * MS, 100 * MS + 2 * HOP_NS + TOL_NS));
}

static void sc_pool_blocked_self(world *w) {
    (void)w;
    nested_scenario("w1");
    /* The nested "sleep" request really waited for the only pool task. */
    CHECK(tp_sleep(11.0) == TP_OK);
    CHECK(g.sleeps_done == 1);
    CHECK(g.sleep_start >= g.nested_end);
}

static void test_timeout_fires_while_pool_blocked(void **state) {
    (void)state;
    world w = {.scenario = sc_pool_blocked_self, .threads = 1};
    run_world(2, 27, &w);
}

static void sc_pool_blocked_remote(world *w) {
    (void)w;
    nested_scenario("w0"); /* w0's only pool task runs the 10 s sleep meanwhile */
    CHECK(g.sleep_start < g.nested_end);
    CHECK(tp_sleep(11.0) == TP_OK);
    CHECK(g.sleeps_done == 1);
}

static void test_timeout_fires_while_pools_blocked_remote(void **state) {
    (void)state;
    world w = {.scenario = sc_pool_blocked_remote, .threads = 1};
    run_world(2, 28, &w);
}

/* Single host: the nested call goes to itself through the loopback. */
static void sc_pool_blocked_single(world *w) {
    (void)w;
    tp_value *a =
        tp_value_list_of(3, tp_value_str("w0"), tp_value_float(10.0), tp_value_float(0.1));
    tp_value *r = NULL;
    uint64_t t0 = now_ns();
    CHECK(tp_rpc_sync(tp_to_name("w0"), "nested", a, NULL, 30.0, &r) == TP_OK);
    tp_value_free(a);
    tp_value_free(r);
    CHECK(g.nested_st == TP_ETIMEDOUT);
    CHECK(within(g.nested_ns, 100 * MS, 100 * MS + TOL_NS));
    CHECK(now_ns() - t0 < 101 * MS + 2 * HOP_NS);
    CHECK(tp_sleep(11.0) == TP_OK);
    CHECK(g.sleeps_done == 1 && g.sleep_start >= g.nested_end);
}

static void test_timeout_fires_while_pool_blocked_single_host(void **state) {
    (void)state;
    world w = {.scenario = sc_pool_blocked_single, .threads = 1};
    run_world(1, 29, &w);
}

/*
 * TIMEOUT-1 TIMEOUT-6 RREF-13: a 0.5 ms timeout is a timeout, not 0 (none),
 * on the wire too: the callee is told 1 ms (rounded up). w0 passes an rref
 * owned by w2 to "count" on w1 with a 0.5 ms timeout; w1 may run count only
 * once w2 confirmed w1's fork, and every frame from w2 to w1 takes 1 s more
 * (a simulator fault). The call times out at w0, and w1's wait for the
 * confirmation is bounded by the 1 ms it was told, so count never runs;
 * told 0 (no deadline) w1 would wait the second out and run it.
 */
static void subms_scenario(world *w) {
    (void)w;
    CHECK(tp_sleep(0.2) == TP_OK); /* after the delay began (0.1 s) */
    tp_rref *r = NULL;
    tp_value *a = tp_value_list_of(1, tp_value_int(5));
    CHECK(tp_remote(tp_to_rank(2), "echo", a, NULL, TP_TIMEOUT_INFINITE, &r) == TP_OK);
    tp_value_free(a);
    tp_value *v = NULL;
    CHECK(tp_rref_to_here(r, TP_TIMEOUT_INFINITE, &v) == TP_OK); /* built on w2 */
    tp_value_free(v);
    tp_value *args = tp_value_list_of(1, tp_value_rref(r));
    tp_future *f = NULL;
    uint64_t t0 = now_ns();
    CHECK(tp_rpc_async(tp_to_rank(1), "count", args, NULL, 0.0005, &f) == TP_OK);
    CHECK(tp_future_wait(f, TP_TIMEOUT_INFINITE) == TP_ETIMEDOUT);
    CHECK(now_ns() - t0 == 500 * US); /* at its deadline exactly */
    CHECK(strstr(tp_future_error(f), "timed out after 0.5 ms") != NULL);
    tp_future_free(f);
    tp_value_free(args);
    tp_rref_release(r);
    CHECK(tp_sleep(2.0) == TP_OK); /* w2's answer reached w1 a second late */
    CHECK(g.count_calls == 0);
}

static void test_timeout_submillisecond_told_to_callee(void **state) {
    (void)state;
    world w = {.scenario = subms_scenario};
    tp_sim_config cfg = {.hosts = 3, .seed = 14};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_fault_delay(sim, 2, 1, 100 * MS, 3600 * SEC, 1 * SEC), TP_OK);
    int codes[3] = {-9, -9, -9};
    assert_int_equal(tp_sim_run(sim, world_program, &w, codes), TP_OK);
    for (int i = 0; i < 3; i++)
        assert_int_equal(codes[i], 0);
    assert_int_equal(tp_sim_violations(sim), 0);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    assert_int_equal(g.count_calls, 0);
}

/* ---- The timer armed lazily (call.c's rearm) ---------------------------------------- */

/* 100 calls issued at one instant with one timeout share the first one's
 * deadline: the first arms the timer (unless it holds an earlier deadline),
 * the other 99 find it armed for that very deadline and leave it
 * (re-arming for each cost the TCP loop a wake-up per call). Their answers
 * end them without arming again. */
static int lazy_arms_issue, lazy_arms_end;

static void sc_lazy_rearm(world *w) {
    (void)w;
    enum { N = 100 };
    tp_future *f[N] = {NULL};
    int before = w0_arms;
    for (int i = 0; i < N; i++) {
        tp_value *a = tp_value_list_of(1, tp_value_int(i));
        CHECK(tp_rpc_async(tp_to_name("w1"), "echo", a, NULL, 10.0, &f[i]) == TP_OK);
        tp_value_free(a);
    }
    lazy_arms_issue = w0_arms - before;
    for (int i = 0; i < N; i++) {
        CHECK(f[i] && tp_future_wait(f[i], TP_TIMEOUT_INFINITE) == TP_OK);
        tp_future_free(f[i]);
    }
    lazy_arms_end = w0_arms - before;
}

static void test_timeout_timer_armed_once_for_one_deadline(void **state) {
    (void)state;
    lazy_arms_issue = lazy_arms_end = -1;
    world w = {.scenario = sc_lazy_rearm, .backend = "SIM_ARMS"};
    run_world(2, 31, &w);
    /* 1 here; 0 would be right too, were an earlier deadline from init still armed. */
    assert_in_range(lazy_arms_issue, 0, 1);
    assert_int_equal(lazy_arms_end, lazy_arms_issue);
}

int main(void) {
    if (sim_wrap_register("SIM_ARMS") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_timeout_late_reply_dropped, reset),
        cmocka_unit_test_setup(test_timeout_message_gives_configured_ms, reset),
        cmocka_unit_test_setup(test_timeout_default_read_at_issue, reset),
        cmocka_unit_test_setup(test_timeout_zero_never_times_out, reset),
        cmocka_unit_test_setup(test_timeout_invalid_values_rejected, reset),
        cmocka_unit_test_setup(test_timeout_many_deadlines_ordered, reset),
        cmocka_unit_test_setup(test_timeout_fires_while_pool_blocked, reset),
        cmocka_unit_test_setup(test_timeout_fires_while_pools_blocked_remote, reset),
        cmocka_unit_test_setup(test_timeout_fires_while_pool_blocked_single_host, reset),
        cmocka_unit_test_setup(test_timeout_submillisecond_told_to_callee, reset),
        cmocka_unit_test_setup(test_timeout_timer_armed_once_for_one_deadline, reset),
    };
    return cmocka_run_group_tests_name("timeout", tests, NULL, NULL);
}
