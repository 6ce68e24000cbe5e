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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flow_send_between_break_and_peer_down),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
