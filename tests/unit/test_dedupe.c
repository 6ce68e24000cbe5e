/*
 * test_dedupe.c: CALL-10's window at its two edges. On a transport that
 * reports TP_NET_DUPLICATES the core drops a frame whose (sender, id) it
 * took within TPI_DEDUPE_WINDOW_NS, and AGENT-17 promises a copy arrives
 * within that 1 s of its original: a copy exactly 1 s behind is still a
 * copy. A wrapper backend, "SIM_DUP", reports duplicates and sends the next
 * REQUEST twice, the copy slowed by a simulator delay fault set for that
 * one send, so that it arrives `gap` ns after the original. The latency
 * has no jitter here, so both arrival times are exact.
 */
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

#include "common/codec.h"
#include "common/limits.h"

/* ---- The wrapper backend --------------------------------------------------------- */

static uint64_t copy_gap_ns; /* 0: none; else the next REQUEST's copy arrives this much later */
static int copies_sent;

static uint32_t dup_net_faults(tp_agent *a) {
    (void)a;
    return TP_NET_DUPLICATES;
}

static tp_status dup_send(tp_agent *a, uint32_t dst, tp_frame *f) {
    if (!copy_gap_ns || tpi_frame_type(f) != TPI_MSG_REQUEST)
        return sim_ops->send(a, dst, f);
    uint64_t gap = copy_gap_ns;
    copy_gap_ns = 0;
    tp_frame *copy = tp_frame_flatten(f);
    CHECK(copy != NULL);
    tp_status st = sim_ops->send(a, dst, f); /* takes f on success */
    if (st != TP_OK || !copy) {
        tp_frame_free(copy);
        return st;
    }
    /* Hosts are ranks here. Only what is sent at this very ns is slowed. */
    tp_sim *sim = tp_sim_current();
    uint64_t now = tp_sim_now_ns(sim);
    uint32_t self = (uint32_t)tp_sim_current_host();
    CHECK(tp_sim_fault_delay(sim, self, dst, now, now + 1, gap) == TP_OK);
    if (sim_ops->send(a, dst, copy) == TP_OK)
        copies_sent++;
    else
        tp_frame_free(copy);
    return TP_OK;
}

static void wrap_ops_edit(const tp_init_params *p, tp_agent *agent, tp_agent_ops *ops) {
    (void)p, (void)agent;
    ops->net_faults = dup_net_faults;
    ops->send = dup_send;
}

/* ---- The world --------------------------------------------------------------------- */

static int64_t runs; /* on w1: how often bump ran */

static tp_status fn_bump(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)user_data;
    *result = tp_value_int(++runs);
    return *result ? TP_OK : TP_ENOMEM;
}

static tp_status fn_runs(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)user_data;
    *result = tp_value_int(runs);
    return *result ? TP_OK : TP_ENOMEM;
}

static void world_register(void) {
    CHECK(tp_register_function("bump", fn_bump, NULL) == TP_OK);
    CHECK(tp_register_function("runs", fn_runs, NULL) == TP_OK);
}

static int64_t call_int(const char *fn) {
    tp_value *res = NULL;
    int64_t v = -1;
    tp_status st = tp_rpc_sync(tp_to_rank(1), fn, NULL, NULL, 10.0, &res);
    CHECK(st == TP_OK);
    if (st == TP_OK)
        CHECK(tp_value_get_int(res, &v) == TP_OK);
    tp_value_free(res);
    return v;
}

static uint64_t gap_ns;
static int64_t bump_answer, runs_after;
static size_t fill_calls;     /* requests sent to w1 before the bump */
static uint64_t fill_bump_ns; /* from the first of them to the bump's answer */

/* fill_calls calls of runs, 4,096 in flight at a time: as many entries in
 * w1's window of ids, all within 1 s of simulated time. */
static void fill(void) {
    enum { BATCH = 4096 };
    tp_future **fs = calloc(BATCH, sizeof *fs);
    CHECK(fs != NULL);
    for (size_t sent = 0; fs && sent < fill_calls;) {
        size_t n = 0;
        for (; n < BATCH && sent < fill_calls; n++, sent++)
            CHECK(tp_rpc_async(tp_to_rank(1), "runs", NULL, NULL, 10.0, &fs[n]) == TP_OK);
        CHECK(tp_future_wait_all(fs, n, 0, NULL) == TP_OK);
        for (size_t i = 0; i < n; i++)
            tp_future_free(fs[i]);
    }
    free(fs);
}

/* One bump whose request arrives twice, gap_ns apart; then, once the copy
 * surely arrived, how often bump ran. */
static void scenario(world *w) {
    (void)w;
    uint64_t t0 = tp_sim_now_ns(tp_sim_current());
    fill();
    copy_gap_ns = gap_ns;
    bump_answer = call_int("bump");
    fill_bump_ns = tp_sim_now_ns(tp_sim_current()) - t0;
    CHECK(copy_gap_ns == 0); /* the bump was the request copied */
    CHECK(tp_sleep((double)(gap_ns + 500 * MS) / 1e9) == TP_OK);
    runs_after = call_int("runs");
}

/* The oracle reports a second run as a violation (SIM-9): want_twice says
 * the copy must run. */
static void run_gap(uint64_t gap, int want_twice) {
    gap_ns = gap;
    runs = 0;
    copies_sent = 0;
    bump_answer = runs_after = -1;
    world w = {.scenario = scenario, .backend = "SIM_DUP"};
    /* A jitter below 1 ns draws 0: every frame takes exactly the latency. */
    tp_sim_config cfg = {.hosts = 2, .seed = 11, .latency_jitter_ns = 1};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    int codes[2] = {-9, -9};
    assert_int_equal(tp_sim_run(sim, world_program, &w, codes), TP_OK);
    assert_int_equal(tp_sim_violations(sim), want_twice ? 1 : 0);
    if (want_twice)
        assert_non_null(strstr(tp_sim_violation(sim), "runs 'bump' a second time"));
    tp_sim_free(sim);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    assert_int_equal(failures, 0);
    assert_int_equal(copies_sent, 1);
    assert_int_equal(bump_answer, 1);
    assert_int_equal(runs_after, want_twice ? 2 : 1);
}

static void test_dedupe_copy_a_window_behind_is_dropped(void **state) {
    (void)state;
    run_gap(1 * SEC, 0); /* CALL-10: the window is 1 s */
}

/* Past the window the core no longer remembers the id (it keeps at most a
 * window's ids): AGENT-17's transport never sends such a late copy, and
 * this one runs again. It pins the window's end from the other side. */
static void test_dedupe_copy_past_the_window_runs_again(void **state) {
    (void)state;
    run_gap(1 * SEC + 1, 1);
}

static void test_dedupe_early_copy_is_dropped(void **state) {
    (void)state;
    run_gap(1, 0);
}

/* A window holding TPI_DEDUPE_MAX ids is full: the next id pushes out the
 * oldest, never the newest, so the bump's copy 1 ns behind it is dropped. */
static void test_dedupe_full_window_drops_the_newest_copy(void **state) {
    (void)state;
    fill_calls = TPI_DEDUPE_MAX;
    run_gap(1, 0);
    fill_calls = 0;
    assert_true(fill_bump_ns < 1 * SEC); /* every id was still in the window */
}

int main(void) {
    if (sim_wrap_register("SIM_DUP") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_dedupe_copy_a_window_behind_is_dropped, reset_failures),
        cmocka_unit_test_setup(test_dedupe_copy_past_the_window_runs_again, reset_failures),
        cmocka_unit_test_setup(test_dedupe_early_copy_is_dropped, reset_failures),
        cmocka_unit_test_setup(test_dedupe_full_window_drops_the_newest_copy, reset_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
