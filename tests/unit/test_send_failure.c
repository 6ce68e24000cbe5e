/*
 * test_send_failure.c: an agent send that fails after the core registered
 * the call (spec/agent.md AGENT-8, spec/calls.md FLOW-1). rpc_sync and
 * rpc_async register a request under the core lock and send it once the lock
 * is released (common/call.c, tpi_send_deferred); when that send fails, the
 * API returns its status with a message, and the call leaves every core
 * table: its window bytes come back and graceful shutdown's drain does not
 * wait for it. The simulator never fails a send to a live peer, so a wrapper
 * backend, "SIM_FAILSEND", fails the next requests it is told to.
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

extern const tp_backend tpi_sim_backend;

/* ---- The wrapper backend --------------------------------------------------------- */

static const tp_agent_ops *sim_ops;
static tp_agent_ops failing_ops;
static int fail_requests; /* the next this many REQUEST frames fail to send */

static tp_status failing_send(tp_agent *a, uint32_t dst, tp_frame *f) {
    const uint8_t *header = f->seg[0].base;
    if (fail_requests > 0 && header[5] == 1 /* REQUEST (WIRE-5) */) {
        fail_requests--;
        return TP_EIO; /* the caller keeps f (AGENT-8) */
    }
    return sim_ops->send(a, dst, f);
}

static tp_status failing_init(const tp_init_params *p, tp_agent **agent, const tp_agent_ops **ops,
                              char *errmsg, size_t errmsg_len) {
    tp_status st = tpi_sim_backend.init(p, agent, ops, errmsg, errmsg_len);
    if (st == TP_OK) {
        sim_ops = *ops;
        failing_ops = **ops;
        failing_ops.send = failing_send;
        *ops = &failing_ops;
    }
    return st;
}

static tp_backend failing_backend;

/* ---- The world --------------------------------------------------------------------- */

static tp_status fn_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *user_data) {
    (void)call, (void)kwargs, (void)user_data;
    int64_t a = 0, b = 0;
    if (tp_value_get_int(tp_list_get(args, 0), &a) != TP_OK ||
        tp_value_get_int(tp_list_get(args, 1), &b) != TP_OK)
        return TP_EINVAL;
    *result = tp_value_int(a + b);
    return *result ? TP_OK : TP_ENOMEM;
}

static void world_register(void) {
    CHECK(tp_register_function("add", fn_add, NULL) == TP_OK);
}

static void sc_send_fails(world *w) {
    (void)w;
    /* Each request carries 3000 bytes of padding (add ignores kwargs), so
     * two of them leaked in the 4096-byte window would block a third. */
    static const uint8_t pad[3000];
    tp_value *args = tp_value_list_of(2, tp_value_int(1), tp_value_int(2));
    tp_value *kwargs = tp_value_map();
    CHECK(kwargs && tp_map_set(kwargs, "pad", tp_value_bytes(pad, sizeof pad)) == TP_OK);
    tp_value *res = NULL;

    fail_requests = 1;
    CHECK(tp_rpc_sync(tp_to_name("w1"), "add", args, kwargs, TP_TIMEOUT_INFINITE, &res) ==
          TP_EIO);
    CHECK(res == NULL);
    CHECK(strstr(tp_errmsg(), "rpc_sync to worker 'w1' (id 1), function 'add': send to worker "
                              "id 1 failed") != NULL);

    tp_future *f = NULL;
    fail_requests = 1;
    CHECK(tp_rpc_async(tp_to_name("w1"), "add", args, kwargs, TP_TIMEOUT_INFINITE, &f) ==
          TP_EIO);
    CHECK(f == NULL);
    CHECK(strstr(tp_errmsg(), "rpc_async to worker 'w1' (id 1), function 'add'") != NULL);
    CHECK(fail_requests == 0);

    /* The failed calls gave their window bytes back: a leak (no deadline
     * would ever end them) would make this one wait for room for ever. */
    int64_t v = 0;
    CHECK(tp_rpc_sync(tp_to_name("w1"), "add", args, kwargs, TP_TIMEOUT_INFINITE, &res) ==
          TP_OK);
    CHECK(tp_value_get_int(res, &v) == TP_OK && v == 3);
    tp_value_free(res);
    tp_value_free(kwargs);
    tp_value_free(args);
    /* world_program's graceful shutdown then checks the drain saw no call left. */
}

static void test_deferred_send_failure(void **state) {
    (void)state;
    world w = {.scenario = sc_send_fails, .backend = "SIM_FAILSEND", .max_inflight_bytes = 4096};
    run_world(2, 5, &w);
}

int main(void) {
    failing_backend = tpi_sim_backend;
    failing_backend.init = failing_init;
    if (tp_register_backend("SIM_FAILSEND", &failing_backend) != TP_OK) {
        fprintf(stderr, "cannot register SIM_FAILSEND: %s\n", tp_errmsg());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deferred_send_failure),
    };
    return cmocka_run_group_tests_name("send_failure", tests, NULL, NULL);
}
