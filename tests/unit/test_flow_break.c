/*
 * test_flow_break.c: flow control across a connection break (spec/calls.md
 * FLOW-7..9). A caller that sees its connection to a callee break gives
 * back the bytes of its calls in flight, and the callee forgets what it
 * holds from the caller. A request sent between the break and the caller's
 * peer-down goes on the new connection (spec/agent.md AGENT-8): the caller
 * gives its bytes back, the callee, having already forgotten, counts them.
 * Without the window generation of FLOW-9 the callee then refused the
 * caller's next full window as over its credit, TP_ELIMIT for a conforming
 * caller (found by AFL++, fuzz_sim_world).
 *
 * The simulator orders the events of one instant by when they were
 * scheduled. w0's task sleeps until t, then w1 schedules a break at t: the
 * task's wake-up comes first and puts its resumption in line, the break
 * fires and puts both peer-downs behind it. So the task sends after the
 * break and before it hears of it, which is the race above.
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

#define WINDOW 4096   /* max_inflight_bytes on both: the callee grants as much */
#define PAD 1000      /* bytes of each padded request's argument */
#define BATCH 3       /* requests of a batch: about 3 KiB, within one window */
#define HOLD_S 2.0    /* the callee's only pool thread stays busy this long */
#define SLEEP_NS 5000000ULL /* w0 sleeps this long; w1 breaks when it ends */

static uint64_t break_at_ns; /* set by w0, read by w1: one simulated process */

static tp_status fn_hold(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)result, (void)ud;
    return tp_sleep(HOLD_S);
}

static tp_status fn_pad(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    *result = tp_value_int(1);
    return *result ? TP_OK : TP_ENOMEM;
}

static void world_register(void) {
    CHECK(tp_register_function("hold", fn_hold, NULL) == TP_OK);
    CHECK(tp_register_function("pad", fn_pad, NULL) == TP_OK);
}

/* Issues BATCH padded requests to w1 into f[]. */
static void send_batch(tp_future **f) {
    static uint8_t bytes[PAD];
    tp_value *args = tp_value_list_of(1, tp_value_bytes(bytes, sizeof bytes));
    CHECK(args != NULL);
    for (int i = 0; i < BATCH; i++) {
        f[i] = NULL;
        CHECK(tp_rpc_async(tp_to_name("w1"), "pad", args, NULL, 30.0, &f[i]) == TP_OK);
    }
    tp_value_free(args);
}

/* Sends a batch, then waits for each call and checks how it ended. */
static void send_batch_expect(const char *which, tp_status want) {
    tp_future *f[BATCH];
    send_batch(f);
    for (int i = 0; i < BATCH; i++) {
        tp_status st = tp_future_wait(f[i], 20.0);
        if (st != want)
            print_error("%s batch call %d: %s: %s\n", which, i, tp_status_name(st),
                        tp_future_error(f[i]));
        CHECK(st == want);
        tp_future_free(f[i]);
    }
}

static void break_race(world *w) {
    (void)w;
    tp_sim *sim = tp_sim_current();
    CHECK(sim != NULL);
    /* w1's only pool thread is busy: what w0 sends next waits in its queue,
     * counted against w0's credit. */
    tp_future *hold = NULL;
    CHECK(tp_rpc_async(tp_to_name("w1"), "hold", NULL, NULL, 30.0, &hold) == TP_OK);
    CHECK(tp_sleep(0.01) == TP_OK);

    /* This task's wake-up, the break, this task, its peer-down. */
    break_at_ns = tp_sim_now_ns(sim) + SLEEP_NS;
    CHECK(tp_sleep(SLEEP_NS / 1e9) == TP_OK);
    CHECK(tp_sim_now_ns(sim) == break_at_ns);
    /* On the new connection, w1 having forgotten the old one; ended by the
     * peer-down, which gives their bytes back. */
    send_batch_expect("first", TP_EIO);
    CHECK(tp_future_wait(hold, 10.0) == TP_EIO);
    tp_future_free(hold);
    /* A full window again, while w1 still holds the first batch. */
    send_batch_expect("second", TP_OK);
}

/* w1: once w0 is asleep, the break at the instant it wakes. */
static void break_when_told(world *w) {
    (void)w;
    tp_sim *sim = tp_sim_current();
    while (!break_at_ns)
        CHECK(tp_sleep(0.001) == TP_OK);
    CHECK(tp_sim_now_ns(sim) < break_at_ns);
    CHECK(tp_sim_fault_break(sim, 0, 1, break_at_ns) == TP_OK);
}

static void test_flow_send_between_break_and_peer_down(void **state) {
    (void)state;
    world w = {.scenario = break_race, .others = break_when_told, .threads = 1, .max_inflight_bytes = WINDOW};
    run_world(2, 7, &w);
}

/*
 * FLOW-8, LOG-3: a caller that ignores its credit is refused past it; the
 * callee warns once (later refusals of that caller are DEBUG), and once
 * more after the connection broke and came back: the reset starts its
 * account afresh, the warning included. Twice w0 keeps w1's one pool
 * thread busy and sends two batches at once, ignoring its credit; between
 * the two the link breaks.
 */
static int refused_warnings;

static void count_refused(tp_log_level level, const char *msg, void *ud) {
    (void)ud;
    if (level == TP_LOG_WARN && strstr(msg, "refused the request"))
        refused_warnings++;
}

/* Four calls of 30 KB while w1's pool is held, past its 64 KiB credit:
 * the third and fourth are refused. */
#define OVERRUN_CALLS 4
static void overrun(void) {
    tp_future *hold = NULL, *f[OVERRUN_CALLS];
    CHECK(tp_rpc_async(tp_to_name("w1"), "hold", NULL, NULL, 30.0, &hold) == TP_OK);
    CHECK(tp_sleep(0.01) == TP_OK);
    static uint8_t bytes[30000];
    tp_value *args = tp_value_list_of(1, tp_value_bytes(bytes, sizeof bytes));
    tp_test_flow_ignore_credit(1);
    for (int i = 0; i < OVERRUN_CALLS; i++) {
        f[i] = NULL;
        CHECK(tp_rpc_async(tp_to_name("w1"), "pad", args, NULL, 30.0, &f[i]) == TP_OK);
    }
    tp_test_flow_ignore_credit(0);
    tp_value_free(args);
    int refused = 0;
    for (int i = 0; i < OVERRUN_CALLS; i++) {
        refused += tp_future_wait(f[i], 20.0) == TP_ELIMIT;
        tp_future_free(f[i]);
    }
    CHECK(refused >= 2);
    CHECK(tp_future_wait(hold, 10.0) == TP_OK);
    tp_future_free(hold);
}

static void refuse_break_refuse(world *w) {
    (void)w;
    tp_sim *sim = tp_sim_current();
    overrun();
    CHECK(refused_warnings == 1); /* the first refusal warns, the others do not */
    CHECK(tp_sim_fault_break(sim, 0, 1, tp_sim_now_ns(sim) + 1000000ull) == TP_OK);
    CHECK(tp_sleep(0.5) == TP_OK); /* both saw the break; a new connection */
    overrun();
    CHECK(refused_warnings == 2);
}

static void test_flow_refusal_warns_again_after_a_break(void **state) {
    (void)state;
    refused_warnings = 0;
    tp_set_log_callback(count_refused, NULL);
    /* w1 grants 64 KiB (max_queued_bytes, FLOW-6); w0's own window is 1 MiB. */
    world w = {.scenario = refuse_break_refuse,
               .threads = 1,
               .max_inflight_bytes = 1 << 20,
               .max_queued_bytes = 64 << 10};
    run_world(2, 7, &w);
    tp_set_log_callback(NULL, NULL);
    assert_int_equal(refused_warnings, 2);
}

/*
 * FLOW-10, FLOW-9: on a transport that may lose frames (chaos mode, drops at
 * one in a million), a caller whose request timed out takes its bytes back
 * at once under a new window generation, and the callee, seeing that
 * generation, forgets what it held of the older one: w1 (one pool thread,
 * held for 2 s; a credit of 64 KiB, room for 1 MiB in all) still has w0's timed-out 40 KB request
 * queued when w0's next 40 KB request arrives, which is counted alone and
 * served, not refused as 80 KB past the credit.
 */
static void timed_out_then_next(world *w) {
    (void)w;
    tp_future *hold = NULL, *next = NULL;
    CHECK(tp_rpc_async(tp_to_name("w1"), "hold", NULL, NULL, 30.0, &hold) == TP_OK);
    CHECK(tp_sleep(0.01) == TP_OK);
    static uint8_t bytes[40000];
    tp_value *args = tp_value_list_of(1, tp_value_bytes(bytes, sizeof bytes)), *res = NULL;
    CHECK(tp_rpc_sync(tp_to_name("w1"), "pad", args, NULL, 0.1, &res) == TP_ETIMEDOUT);
    CHECK(tp_rpc_async(tp_to_name("w1"), "pad", args, NULL, 30.0, &next) == TP_OK);
    tp_value_free(args);
    tp_status st = tp_future_wait(next, 20.0);
    if (st != TP_OK)
        print_error("the request after the timed-out one: %s: %s\n", tp_status_name(st),
                    tp_future_error(next));
    CHECK(st == TP_OK);
    tp_future_free(next);
    CHECK(tp_future_wait(hold, 10.0) == TP_OK);
    tp_future_free(hold);
}

static void test_flow_timed_out_request_forgotten_on_a_lossy_transport(void **state) {
    (void)state;
    /* The credit is the smaller of the window and a share of max_queued_bytes
     * (FLOW-6): 64 KiB here, with room for both requests in the total. */
    world w = {.scenario = timed_out_then_next,
               .threads = 1,
               .max_inflight_bytes = 64 << 10,
               .max_queued_bytes = 1 << 20};
    tp_sim_config cfg = {.hosts = 2, .seed = 7};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    char err[256];
    assert_int_equal(tp_sim_load_faults(sim, "chaos 1 0 0\n", err, sizeof err), TP_OK);
    int codes[2] = {-9, -9};
    assert_int_equal(tp_sim_run(sim, world_program, &w, codes), TP_OK);
    assert_int_equal(tp_sim_violations(sim), 0);
    tp_sim_free(sim);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    assert_int_equal(failures, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flow_send_between_break_and_peer_down),
        cmocka_unit_test(test_flow_refusal_warns_again_after_a_break),
        cmocka_unit_test(test_flow_timed_out_request_forgotten_on_a_lossy_transport),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
