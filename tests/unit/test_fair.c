/*
 * test_fair.c: the fair scheduler's congestion stall (spec/calls.md FAIR-2,
 * spec/agent.md AGENT-18). While the agent says a caller's answers cannot
 * go, the callee runs none of that caller's queued requests; once the agent
 * calls tp_core_on_uncongested, they run, and so does everything the caller
 * sends later. The simulator has no congested member, so a wrapper backend,
 * "SIM_CONGEST", answers it from a flag the test sets, and a non-blocking
 * function (FUNC-6, run in the callee's I/O context, where an agent's
 * upcalls come from) plays the agent's tp_core_on_uncongested.
 */
#define _GNU_SOURCE /* RTLD_NEXT, for alloc_fault.h */
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

#include "alloc_fault.h"
#include "common/blocks.h"
#include "sim_world.h"
#include "sim_wrap.h"

/* ---- The wrapper backend --------------------------------------------------------- */

#define RANKS 2

static tp_agent *agents[RANKS];
static tp_core *cores[RANKS];
static int congest_to_w0;     /* 1: w1's agent says w0's answers cannot go */
static int congested_answers; /* how often w1's agent answered 1 */

static int congest_to_w1; /* 1: w0's agent says w1's answers cannot go */

static int congest_congested(tp_agent *a, uint32_t dst) {
    if (a == agents[0] && dst == 1 && congest_to_w1) {
        congested_answers++;
        return 1;
    }
    if (a != agents[1] || dst != 0 || !congest_to_w0)
        return 0;
    congested_answers++;
    return 1;
}

static uint64_t w1_executes; /* pool work items w1's core handed its agent */

static tp_status congest_execute(tp_agent *a, tp_work *w) {
    if (a == agents[1])
        w1_executes++;
    return sim_ops->execute(a, w);
}

static tp_status congest_start(tp_agent *a, tp_core *core, char *addr, size_t addr_len,
                               char *errmsg, size_t errmsg_len) {
    for (int i = 0; i < RANKS; i++)
        if (agents[i] == a)
            cores[i] = core;
    return sim_ops->start(a, core, addr, addr_len, errmsg, errmsg_len);
}

static void wrap_ops_edit(const tp_init_params *p, tp_agent *agent, tp_agent_ops *ops) {
    CHECK(p->rank < RANKS);
    if (p->rank < RANKS)
        agents[p->rank] = agent;
    ops->start = congest_start;
    ops->congested = congest_congested;
    ops->execute = congest_execute;
}

/* ---- The world --------------------------------------------------------------------- */

/* uncongest(), non-blocking, on w1: its agent's bytes for w0 fell to half
 * the bound; it tells the core so from its I/O context, as AGENT-18 asks. */
static tp_status fn_uncongest(tp_call *call, const tp_value *args, const tp_value *kwargs,
                              tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)user_data, (void)result;
    if (!cores[1] || strcmp(tp_call_caller(call)->name, "w0") != 0)
        return TP_EINVAL;
    congest_to_w0 = 0;
    tp_core_on_uncongested(cores[1], 0);
    return TP_OK;
}

/* nap(): 0.5 s on a pool thread. */
static tp_status fn_nap(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)user_data, (void)result;
    return tp_sleep(0.5);
}

/* busy(), non-blocking, on w1: w1 calls its own nap (a source never
 * stalled), which holds w1's only pool thread for 0.5 s. */
static tp_status fn_busy(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)user_data, (void)result;
    tp_future *f = NULL;
    tp_status st = tp_rpc_async(tp_to_name("w1"), "nap", NULL, NULL, 30.0, &f);
    tp_future_free(f); /* the call goes on */
    return st;
}

/* uncongest_self(), non-blocking, on w1: w1's agent says w1's own answers
 * (never congested) can go: nothing is owed to that caller. */
static tp_status fn_uncongest_self(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                   tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)user_data, (void)result;
    if (!cores[1])
        return TP_EINVAL;
    tp_core_on_uncongested(cores[1], 1);
    return TP_OK;
}

/* uncongest_oom(), non-blocking, on w1: as uncongest, but no memory can
 * be had while the core hands out the tokens it owes w0 (the block cache
 * emptied first, so a token's block comes from malloc). */
static int uncongest_oom_hit; /* the core's allocation did fail */

static tp_status fn_uncongest_oom(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                  tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)user_data, (void)result;
    if (!cores[1] || strcmp(tp_call_caller(call)->name, "w0") != 0)
        return TP_EINVAL;
    congest_to_w0 = 0;
    tpi_blocks_trim();
    alloc_countdown_fired = 0;
    alloc_countdown = 1;
    tp_core_on_uncongested(cores[1], 0);
    uncongest_oom_hit = alloc_countdown_fired;
    alloc_countdown = 0;
    return TP_OK;
}

/* uncongest_w1(), non-blocking, on w0: w0's agent's bytes for w1 fell. */
static tp_status fn_uncongest_w1(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                 tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)user_data, (void)result;
    if (!cores[0])
        return TP_EINVAL;
    congest_to_w1 = 0;
    tp_core_on_uncongested(cores[0], 1);
    return TP_OK;
}

static void world_register(void) {
    CHECK(tp_register_function_ex("uncongest_w1", fn_uncongest_w1, NULL, TP_FN_NONBLOCKING) ==
          TP_OK);
    CHECK(tp_register_function_ex("uncongest_oom", fn_uncongest_oom, NULL, TP_FN_NONBLOCKING) ==
          TP_OK);
    CHECK(tp_register_function("add", world_fn_add, NULL) == TP_OK);
    CHECK(tp_register_function_ex("uncongest_self", fn_uncongest_self, NULL, TP_FN_NONBLOCKING) ==
          TP_OK);
    CHECK(tp_register_function("nap", fn_nap, NULL) == TP_OK);
    CHECK(tp_register_function_ex("uncongest", fn_uncongest, NULL, TP_FN_NONBLOCKING) == TP_OK);
    CHECK(tp_register_function_ex("busy", fn_busy, NULL, TP_FN_NONBLOCKING) == TP_OK);
}

static int64_t sync_add(int64_t a, int64_t b, double timeout_s, tp_status *st) {
    tp_value *args = tp_value_list_of(2, tp_value_int(a), tp_value_int(b));
    tp_value *res = NULL;
    int64_t v = -1;
    *st = tp_rpc_sync(tp_to_name("w1"), "add", args, NULL, timeout_s, &res);
    if (*st == TP_OK)
        CHECK(tp_value_get_int(res, &v) == TP_OK);
    else
        print_error("add(%lld, %lld) on w1: %s: %s\n", (long long)a, (long long)b,
                    tp_status_name(*st), tp_errmsg());
    tp_value_free(res);
    tp_value_free(args);
    return v;
}

/*
 * FAIR-2: w0's request waits at w1 while w1's agent says w0's answers
 * cannot go, runs once the agent says they can, and w0's later requests
 * (to a queue that emptied meanwhile) are served as before: the caller is
 * back in the round for good, not only for the jobs queued at the stall.
 */
static void sc_stall_then_served_again(world *w) {
    (void)w;
    congest_to_w0 = 1;
    congested_answers = 0;
    tp_value *args = tp_value_list_of(2, tp_value_int(1), tp_value_int(2));
    tp_future *f = NULL;
    CHECK(tp_rpc_async(tp_to_name("w1"), "add", args, NULL, 30.0, &f) == TP_OK);
    tp_value_free(args);
    /* Stalled: w1's pool token asked about w0 and ran nothing. */
    CHECK(tp_sleep(0.5) == TP_OK);
    CHECK(congested_answers >= 1);
    CHECK(f && !tp_future_done(f));

    tp_value *res = NULL;
    CHECK(tp_rpc_sync(tp_to_name("w1"), "uncongest", NULL, NULL, 5.0, &res) == TP_OK);
    tp_value_free(res);
    CHECK(congest_to_w0 == 0);
    int64_t v = -1;
    CHECK(f && tp_future_wait(f, 5.0) == TP_OK);
    CHECK(f && tp_value_get_int(tp_future_value(f), &v) == TP_OK && v == 3);
    tp_future_free(f);

    /* w0's queue at w1 is empty now; what w0 sends next runs at once. */
    tp_status st = TP_OK;
    for (int i = 0; i < 3; i++) {
        uint64_t t0 = now_ns();
        CHECK(sync_add(10, i, 5.0, &st) == 10 + i);
        CHECK(st == TP_OK);
        CHECK(now_ns() - t0 < 100 * MS);
    }
}

static tp_future *async_add(int64_t a) {
    tp_value *args = tp_value_list_of(2, tp_value_int(a), tp_value_int(1));
    tp_future *f = NULL;
    CHECK(tp_rpc_async(tp_to_name("w1"), "add", args, NULL, 30.0, &f) == TP_OK);
    tp_value_free(args);
    return f;
}

static void call_w1(const char *fn) {
    tp_value *res = NULL;
    CHECK(tp_rpc_sync(tp_to_name("w1"), fn, NULL, NULL, 5.0, &res) == TP_OK);
    tp_value_free(res);
}

static void wait_add(tp_future *f, int64_t want) {
    int64_t v = -1;
    CHECK(f && tp_future_wait(f, 5.0) == TP_OK);
    CHECK(f && tp_value_get_int(tp_future_value(f), &v) == TP_OK && v == want);
    tp_future_free(f);
}

/*
 * FAIR-2: a job gets one pool token when queued; a token that finds only a
 * stalled caller's jobs is owed to them, and once that caller is
 * uncongested the core hands the pool as many tokens as it owes, up to the
 * caller's queued jobs, and no more: a debt paid is not paid again. On w1,
 * whose pool has one thread:
 *   1. w0's add A is stalled (its token finds it alone: 1 owed), then
 *      uncongested (1 token re-issued, A runs): 2 work items, nothing owed;
 *   2. w0's add B is stalled the same way (B's token, 1 owed); w1's own nap
 *      (a token) holds the thread; w0's add C queues (its token waits behind
 *      the nap); uncongested: 1 token for the 1 owed, though 2 jobs wait:
 *      4 more work items, 6 in all. A core that kept the first debt after
 *      paying it hands out one token too many (7).
 */
static void sc_tokens_owed_paid_once(world *w) {
    (void)w;
    w1_executes = 0;
    congest_to_w0 = 1;
    tp_future *a = async_add(1);
    CHECK(tp_sleep(0.1) == TP_OK);
    CHECK(congested_answers >= 1);
    call_w1("uncongest");
    wait_add(a, 2);
    CHECK(w1_executes == 2);
    congest_to_w0 = 1;
    tp_future *b = async_add(2);
    CHECK(tp_sleep(0.1) == TP_OK);
    CHECK(b && !tp_future_done(b));
    call_w1("busy");
    CHECK(tp_sleep(0.1) == TP_OK);
    tp_future *c = async_add(3);
    CHECK(tp_sleep(0.1) == TP_OK);
    call_w1("uncongest");
    wait_add(b, 3);
    wait_add(c, 4);
    if (w1_executes != 6)
        print_error("w1's core handed its pool %llu work items, not 6\n",
                    (unsigned long long)w1_executes);
    CHECK(w1_executes == 6);
}

/*
 * FAIR-2: tokens owed to a stalled caller are paid to it alone: an
 * uncongest for a caller that never stalled (w1 itself, with a job of its
 * own queued behind its busy thread) hands out nothing. w0's add A is
 * stalled (1 owed); w1's own two naps: one runs, one queues; w1 is told its
 * own answers can go (nothing happens); once the naps are over, w0 is
 * uncongested (1 token) and A runs: 4 work items (A's, the naps', the one
 * owed). Paying the debt to the wrong caller hands out a token that finds
 * only A, still stalled, and is owed again: a fifth.
 */
static void sc_owed_paid_to_the_stalled_only(world *w) {
    (void)w;
    w1_executes = 0;
    congest_to_w0 = 1;
    tp_future *a = async_add(1);
    CHECK(tp_sleep(0.1) == TP_OK);
    CHECK(a && !tp_future_done(a));
    call_w1("busy");
    call_w1("busy");
    CHECK(tp_sleep(0.1) == TP_OK);
    call_w1("uncongest_self");
    CHECK(tp_sleep(1.2) == TP_OK); /* both naps are over; A is still stalled */
    CHECK(a && !tp_future_done(a));
    call_w1("uncongest");
    wait_add(a, 2);
    if (w1_executes != 4)
        print_error("w1's core handed its pool %llu work items, not 4\n",
                    (unsigned long long)w1_executes);
    CHECK(w1_executes == 4);
}

static void test_fair_owed_paid_to_the_stalled_only(void **state) {
    (void)state;
    world w = {
        .scenario = sc_owed_paid_to_the_stalled_only, .backend = "SIM_CONGEST", .threads = 1};
    run_world(2, 3, &w);
    assert_int_equal(failures, 0);
}

/*
 * FAIR-2: tokens owed to a stalled caller that cannot be made for want of
 * memory are not lost: the pool thread that ends the next job runs their
 * jobs in their stead. w0's adds A1, A2 are stalled (2 owed); w1 is told w0
 * can go on while every allocation fails: no token, so both still wait;
 * w0's add B brings one token, whose thread runs A1, then A2 and B. Three
 * work items in all. A core that put the debt back as owed (to a caller no
 * longer stalled, so never paid) ran A1 with B's token and left A2 and B
 * waiting for their 30 s deadline.
 */
static void sc_tokens_unissued_run_by_ending_jobs(world *w) {
    (void)w;
    w1_executes = 0;
    uncongest_oom_hit = 0;
    congest_to_w0 = 1;
    tp_future *a1 = async_add(1);
    tp_future *a2 = async_add(2);
    CHECK(tp_sleep(0.1) == TP_OK);
    CHECK(congested_answers >= 1);
    call_w1("uncongest_oom");
    CHECK(uncongest_oom_hit);
    CHECK(tp_sleep(0.2) == TP_OK);
    CHECK(a1 && !tp_future_done(a1) && a2 && !tp_future_done(a2));
    tp_future *b = async_add(3);
    wait_add(a1, 2);
    wait_add(a2, 3);
    wait_add(b, 4);
    if (w1_executes != 3)
        print_error("w1's core handed its pool %llu work items, not 3\n",
                    (unsigned long long)w1_executes);
    CHECK(w1_executes == 3);
}

static void test_fair_tokens_unissued_run_by_ending_jobs(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip(); /* under valgrind, or not GCC: no allocation can be made to fail */
    world w = {
        .scenario = sc_tokens_unissued_run_by_ending_jobs, .backend = "SIM_CONGEST", .threads = 1};
    run_world(2, 3, &w);
    assert_int_equal(failures, 0);
}

/*
 * FAIR-2: a token is owed to a stalled caller whatever its rank: here the
 * callee is w0, whose first peer record is its own (it called itself
 * first), and the stalled caller is w1. Once w0's agent says w1 can go on,
 * w1's queued add runs.
 */
static int w1_may_call; /* w0 made its own peer record first: w1 may call it */
static tp_status w1_add_st = TP_EINVAL;

/* On w0: calls itself (its first peer record is its own), says w1's answers
 * cannot go, lets w1 call, and waits wait_s for w1's calls to stall. */
static void w0_stalls_w1(double wait_s) {
    tp_value *args = tp_value_list_of(2, tp_value_int(1), tp_value_int(1)), *res = NULL;
    CHECK(tp_rpc_sync(tp_to_name("w0"), "add", args, NULL, 5.0, &res) == TP_OK);
    tp_value_free(res);
    tp_value_free(args);
    congest_to_w1 = 1;
    congested_answers = 0;
    w1_may_call = 1;
    CHECK(tp_sleep(wait_s) == TP_OK);
    CHECK(congested_answers >= 1);
}

static void sc_stalled_second_source(world *w) {
    (void)w;
    w0_stalls_w1(0.2);
    CHECK(w1_add_st == TP_EINVAL); /* still queued */
    tp_value *res = NULL;
    CHECK(tp_rpc_sync(tp_to_name("w0"), "uncongest_w1", NULL, NULL, 5.0, &res) == TP_OK);
    tp_value_free(res);
    for (int i = 0; i < 500 && w1_add_st == TP_EINVAL; i++)
        CHECK(tp_sleep(0.01) == TP_OK);
    CHECK(w1_add_st == TP_OK);
}

static void others_add_on_w0(world *w) {
    (void)w;
    while (!w1_may_call)
        CHECK(tp_sleep(0.01) == TP_OK);
    tp_value *args = tp_value_list_of(2, tp_value_int(2), tp_value_int(3)), *res = NULL;
    w1_add_st = tp_rpc_sync(tp_to_name("w0"), "add", args, NULL, 3.0, &res);
    tp_value_free(res);
    tp_value_free(args);
}

static void test_fair_stalled_caller_of_any_rank_is_owed(void **state) {
    (void)state;
    w1_may_call = 0;
    w1_add_st = TP_EINVAL;
    world w = {.scenario = sc_stalled_second_source,
               .others = others_add_on_w0,
               .backend = "SIM_CONGEST",
               .threads = 1};
    run_world(2, 3, &w);
    assert_int_equal(failures, 0);
}

static void test_fair_tokens_owed_paid_once(void **state) {
    (void)state;
    world w = {.scenario = sc_tokens_owed_paid_once, .backend = "SIM_CONGEST", .threads = 1};
    run_world(2, 3, &w);
    assert_int_equal(failures, 0);
}

static void test_fair_uncongested_caller_served_again(void **state) {
    (void)state;
    world w = {.scenario = sc_stall_then_served_again, .backend = "SIM_CONGEST"};
    run_world(2, 3, &w);
    CHECK(congested_answers >= 1);
    assert_int_equal(failures, 0);
}

/*
 * FAIR-1, FAIR-2, SHUTDOWN-6: jobs of a stalled caller are still queued when
 * the callee shuts down (not gracefully: a graceful drain would wait for
 * them). Their tokens already ran and found only the stalled caller, so no
 * pool work item is left to take them: teardown itself drops them,
 * unanswered, and ends; the caller's calls fail once the callee is gone.
 */
static int w1_go;           /* rank 0 saw its calls queued: w1 may shut down */
static uint64_t w1_down_ns; /* when w1's shutdown began */
static tp_status w1_shutdown_st;
static uint64_t w1_shutdown_ns; /* how long it took */

static int stalled_program(int rank, int world_size, void *arg) {
    (void)arg;
    world w = {.backend = "SIM_CONGEST"};
    if (world_worker_start(rank, world_size, &w) != 0)
        return 1;
    if (rank == 1) {
        for (int i = 0; i < 10000 && !w1_go; i++)
            CHECK(tp_sleep(0.001) == TP_OK);
        CHECK(w1_go);
        w1_down_ns = now_ns();
        w1_shutdown_st = tp_shutdown(0);
        w1_shutdown_ns = now_ns() - w1_down_ns;
        return 0;
    }
    congest_to_w0 = 1;
    congested_answers = 0;
    tp_future *f[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        tp_value *args = tp_value_list_of(2, tp_value_int(i), tp_value_int(1));
        CHECK(tp_rpc_async(tp_to_name("w1"), "add", args, NULL, 30.0, &f[i]) == TP_OK);
        tp_value_free(args);
    }
    CHECK(tp_sleep(0.5) == TP_OK);
    CHECK(congested_answers >= 1);
    CHECK(f[0] && !tp_future_done(f[0]) && f[1] && !tp_future_done(f[1]));
    w1_go = 1;
    for (int i = 0; i < 2; i++) {
        tp_status st = f[i] ? tp_future_wait(f[i], 5.0) : TP_EINVAL;
        if (st != TP_EPEERDOWN)
            print_error("add %d: %s: %s\n", i, tp_status_name(st), tp_errmsg());
        CHECK(st == TP_EPEERDOWN);
        CHECK(now_ns() - w1_down_ns < 100 * MS); /* failed when w1 went, not at the deadline */
        tp_future_free(f[i]);
    }
    CHECK(tp_shutdown(0) == TP_OK);
    return 0;
}

/* Runs program on a world of RANKS from seed: every program ends 0. */
static void run_program(tp_sim_program program, uint64_t seed) {
    tp_sim_config cfg = {.hosts = RANKS, .seed = seed};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    int codes[RANKS] = {-9, -9};
    assert_int_equal(tp_sim_run(sim, program, NULL, codes), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
}

static void test_fair_stalled_jobs_dropped_at_teardown(void **state) {
    (void)state;
    w1_go = 0;
    run_program(stalled_program, 5);
    assert_int_equal(w1_shutdown_st, TP_OK);
    assert_true(w1_shutdown_ns < 100 * MS);
    assert_int_equal(failures, 0);
}

/* The same as the callee w0, whose first peer record is its own and whose
 * stalled caller is w1: teardown drops w1's jobs too, and every core is
 * freed (a job left queued keeps its core). */
static int reversed_stalled_program(int rank, int world_size, void *arg) {
    (void)arg;
    world w = {.backend = "SIM_CONGEST"};
    if (world_worker_start(rank, world_size, &w) != 0)
        return 1;
    if (rank == 0) {
        w0_stalls_w1(0.5);
        CHECK(tp_shutdown(0) == TP_OK);
        congest_to_w1 = 0;
        return 0;
    }
    while (!w1_may_call)
        CHECK(tp_sleep(0.01) == TP_OK);
    tp_future *f[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        tp_value *args = tp_value_list_of(2, tp_value_int(i), tp_value_int(1));
        CHECK(tp_rpc_async(tp_to_name("w0"), "add", args, NULL, 30.0, &f[i]) == TP_OK);
        tp_value_free(args);
    }
    for (int i = 0; i < 2; i++) {
        CHECK(f[i] && tp_future_wait(f[i], 5.0) == TP_EPEERDOWN);
        tp_future_free(f[i]);
    }
    CHECK(tp_shutdown(0) == TP_OK);
    return 0;
}

static void test_fair_stalled_jobs_of_any_rank_dropped_at_teardown(void **state) {
    (void)state;
    w1_may_call = 0;
    run_program(reversed_stalled_program, 6);
    assert_int_equal(failures, 0);
    assert_int_equal(tp_core_live_count(), 0);
}

int main(void) {
    if (sim_wrap_register("SIM_CONGEST") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_fair_uncongested_caller_served_again, reset_failures),
        cmocka_unit_test_setup(test_fair_stalled_jobs_dropped_at_teardown, reset_failures),
        cmocka_unit_test_setup(test_fair_stalled_jobs_of_any_rank_dropped_at_teardown,
                               reset_failures),
        cmocka_unit_test_setup(test_fair_tokens_owed_paid_once, reset_failures),
        cmocka_unit_test_setup(test_fair_stalled_caller_of_any_rank_is_owed, reset_failures),
        cmocka_unit_test_setup(test_fair_tokens_unissued_run_by_ending_jobs, reset_failures),
        cmocka_unit_test_setup(test_fair_owed_paid_to_the_stalled_only, reset_failures),
    };
    return cmocka_run_group_tests_name("fair", tests, NULL, NULL);
}
