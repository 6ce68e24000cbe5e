/*
 * test_teardown_late.c: teardown and a thread that stays inside the API
 * (spec/lifecycle.md SHUTDOWN-6, SHUTDOWN-7). Every wait inside the API
 * wakes when teardown begins, so only an agent op that takes time keeps a
 * thread in: a third-party backend whose send blocks, against AGENT-8.
 * Teardown must wait for that thread however long it takes (freeing the
 * agent under it would crash), and tp_shutdown must say TP_ETIMEDOUT when
 * the thread was still inside at the shutdown deadline, and TP_OK when it
 * left before. The wrapper backend "SIM_SLOWSEND" makes one request's send
 * on w0 last until a virtual time the scenario sets once shutdown begins.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tensorplay/rpc.h"
#include "tensorplay/rpc_backend.h"
#include "tensorplay/sim.h"

#include "sim_world.h"
#include "sim_wrap.h"

/* shutdown_timeout: a binary fraction of a second, so its deadline is a
 * whole number of teardown's 1 ms looks after the shutdown begins. */
#define SHUTDOWN_TIMEOUT_S 0.125
#define SHUTDOWN_TIMEOUT_NS (125 * MS)

static struct {
    int64_t leave_offset_ns; /* when the slow send ends, from the shutdown deadline */
    int armed;               /* the next request sent by w0 is slow */
    int in_send;             /* the slow send has begun */
    uint64_t leave_at;       /* 0 until the scenario sets it */
    uint64_t left_ns;        /* when the slow send ended */
    tp_status relay_st;      /* the relay's own rpc_async */
    int relay_done;
    int rank0_done;
} g;

/* ---- The wrapper backend ------------------------------------------------------------ */

static tp_status slow_send(tp_agent *a, uint32_t dst, tp_frame *f) {
    const uint8_t *header = f->seg[0].base;
    if (g.armed && tp_sim_current_host() == 0 && header[5] == 1 /* REQUEST (WIRE-5) */) {
        g.armed = 0;
        g.in_send = 1;
        while (g.leave_at == 0)
            CHECK(tp_sim_sleep(0.001) == TP_OK);
        /* A sleep's seconds may round a nanosecond short. */
        for (uint64_t now = now_ns(); now < g.leave_at; now = now_ns())
            CHECK(tp_sim_sleep((double)(g.leave_at - now + 1) / 1e9) == TP_OK);
        g.left_ns = now_ns();
        g.in_send = 0;
    }
    return sim_ops->send(a, dst, f);
}

static void wrap_ops_edit(const tp_init_params *p, tp_agent *agent, tp_agent_ops *ops) {
    (void)p, (void)agent;
    ops->send = slow_send;
}

/* ---- The world ----------------------------------------------------------------------- */

/* relay(): on w0's pool, calls add on w1 through the slow send. */
static tp_status fn_relay(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)user_data;
    tp_value *a = tp_value_list_of(2, tp_value_int(1), tp_value_int(2));
    tp_future *f = NULL;
    g.armed = 1;
    g.relay_st = tp_rpc_async(tp_to_name("w1"), "add", a, NULL, TP_TIMEOUT_INFINITE, &f);
    g.relay_done = 1;
    tp_future_free(f);
    tp_value_free(a);
    *result = tp_value_int(0);
    return *result ? TP_OK : TP_ENOMEM;
}

static void world_register(void) {
    CHECK(tp_register_function("add", world_fn_add, NULL) == TP_OK);
    CHECK(tp_register_function("relay", fn_relay, NULL) == TP_OK);
}

static int program(int rank, int world_size, void *arg) {
    (void)arg;
    world w = {.backend = "SIM_SLOWSEND", .shutdown_timeout = SHUTDOWN_TIMEOUT_S};
    if (world_worker_start(rank, world_size, &w) != 0)
        return 1;
    if (rank == 1) {
        for (int i = 0; i < 10000 && !g.rank0_done; i++)
            CHECK(tp_sim_sleep(0.001) == TP_OK);
        CHECK(g.rank0_done);
        CHECK(tp_shutdown(0) == TP_OK);
        return 0;
    }
    tp_future *f = NULL;
    CHECK(tp_rpc_async(tp_to_name("w0"), "relay", NULL, NULL, TP_TIMEOUT_INFINITE, &f) == TP_OK);
    for (int i = 0; i < 1000 && !g.in_send; i++)
        CHECK(tp_sim_sleep(0.001) == TP_OK);
    CHECK(g.in_send);

    uint64_t deadline = now_ns() + SHUTDOWN_TIMEOUT_NS;
    g.leave_at = (uint64_t)((int64_t)deadline + g.leave_offset_ns);
    tp_status st = tp_shutdown(0);
    uint64_t end = now_ns();
    /* Teardown waited for the thread, past the deadline when it had to. */
    CHECK(within(g.left_ns, g.leave_at, g.leave_at + TOL_NS) && end >= g.left_ns);
    CHECK(g.relay_done && !tp_is_initialized());
    /* The relay's send went out, so its rpc_async gave a future (which
     * teardown had failed with TP_ESHUTDOWN). */
    CHECK(g.relay_st == TP_OK);
    if (g.leave_offset_ns >= 0) {
        CHECK(st == TP_ETIMEDOUT);
        CHECK(strstr(tp_errmsg(), "shutdown: 1 thread(s) still inside rpc calls at the shutdown "
                                  "deadline; worker 'w0' was torn down after they left") != NULL);
    } else {
        CHECK(st == TP_OK);
    }
    if ((g.leave_offset_ns >= 0) != (st == TP_ETIMEDOUT))
        print_error("left %+lld ns from the deadline: %s: %s\n", (long long)g.leave_offset_ns,
                    tp_status_name(st), tp_errmsg());
    CHECK(tp_future_wait(f, 0) == TP_ESHUTDOWN);
    tp_future_free(f);
    g.rank0_done = 1;
    return 0;
}

static void run(int64_t leave_offset_ns) {
    memset(&g, 0, sizeof g);
    g.leave_offset_ns = leave_offset_ns;
    failures = 0;
    tp_sim_config cfg = {.hosts = 2, .seed = 3};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    int codes[2] = {-9, -9};
    assert_int_equal(tp_sim_run(sim, program, NULL, codes), TP_OK);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
}

/* Half a look after the deadline: the look at the deadline itself saw it. */
static void test_thread_inside_at_the_deadline_is_reported(void **state) {
    (void)state;
    run(500 * US);
}

/* Long past it: teardown still waits, and says so. */
static void test_thread_long_past_the_deadline_is_waited_for(void **state) {
    (void)state;
    run(40 * MS);
}

/* Half a look before it: a slow thread that left in time is no error. */
static void test_thread_leaving_before_the_deadline_is_no_error(void **state) {
    (void)state;
    run(-500 * (int64_t)US);
}

int main(void) {
    if (sim_wrap_register("SIM_SLOWSEND") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thread_inside_at_the_deadline_is_reported),
        cmocka_unit_test(test_thread_long_past_the_deadline_is_waited_for),
        cmocka_unit_test(test_thread_leaving_before_the_deadline_is_no_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
