/*
 * test_interrupt.c: tp_interrupt on the simulator (spec/lifecycle.md
 * INTERRUPT-1), on virtual time so every bound is exact. Another host's task
 * plays the thread that catches Ctrl-C: it aims tp_context_interrupt at the
 * blocked host's context, as the Python layer's main thread aims
 * tp_interrupt at the process's.
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

#include "sim_check.h"

#define RANKS 3

static tp_context *ctx_of[RANKS]; /* each host's context, for the interrupter */
static tp_status first_st[RANKS], again_st[RANKS];
static char first_msg[RANKS][TP_ERRMSG_LEN_MAX];
static uint64_t first_took[RANKS];
static uint64_t interrupted_at;
static int64_t sum;

static tp_status fn_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *ud) {
    (void)call, (void)kwargs, (void)ud;
    int64_t a = 0, b = 0;
    tp_value_get_int(tp_list_get(args, 0), &a);
    tp_value_get_int(tp_list_get(args, 1), &b);
    *result = tp_value_int(a + b);
    return TP_OK;
}

static tp_status fn_sleep(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *ud) {
    (void)call, (void)kwargs, (void)ud, (void)result;
    double s = 0;
    tp_value_get_float(tp_list_get(args, 0), &s);
    return tp_sleep(s);
}

static tp_status init_as(int rank, int world_size) {
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 60.0) == TP_OK);
    CHECK(tp_options_set_shutdown_timeout(o, 60.0) == TP_OK);
    tp_status st = tp_init_rpc(name, "SIM", rank, world_size, o);
    tp_options_free(o);
    return st;
}

/*
 * spec: INTERRUPT-1, INIT-5, INIT-9. Ranks 0 and 1 wait in init for rank 2,
 * which does not come; at 300 ms rank 2's host interrupts rank 0. Rank 0
 * gives up within one poll with TP_ECANCELED naming rank 2, and publishes
 * it, so rank 1 gives up too; rank 2's late attempt of that generation
 * fails at once. Interrupts when nothing blocks are dropped and poison
 * nothing: then all three init again (the next generation), call, and shut
 * down gracefully.
 */
static int init_program(int rank, int world_size, void *arg) {
    (void)arg;
    ctx_of[rank] = tp_context_current();
    CHECK(tp_register_function("add", fn_add, NULL) == TP_OK);
    if (rank == 2) {
        CHECK(tp_interrupt() == TP_ENOTINIT); /* nothing blocks here: dropped */
        CHECK(tp_sim_sleep(0.3) == TP_OK);
        interrupted_at = now_ns();
        CHECK(tp_context_interrupt(ctx_of[0]) == TP_OK);
        CHECK(tp_context_interrupt(NULL) == TP_EINVAL);
        CHECK(tp_sim_sleep(0.2) == TP_OK);
        CHECK(tp_context_interrupt(ctx_of[0]) == TP_ENOTINIT); /* init returned: dropped */
        /* This generation's outcome is the interruption: a late joiner learns it. */
        first_st[2] = init_as(2, world_size);
        snprintf(first_msg[2], sizeof first_msg[2], "%s", tp_errmsg());
    } else {
        uint64_t t0 = now_ns();
        first_st[rank] = init_as(rank, world_size);
        first_took[rank] = now_ns() - t0;
        snprintf(first_msg[rank], sizeof first_msg[rank], "%s", tp_errmsg());
        CHECK(!tp_is_initialized());
        CHECK(tp_shutdown(1) == TP_ENOTINIT); /* INIT-9: UNINIT again */
        CHECK(tp_sim_sleep(0.5) == TP_OK);
    }
    again_st[rank] = init_as(rank, world_size);
    if (again_st[rank] != TP_OK)
        return 0;
    if (rank == 0) {
        tp_value *args = tp_value_list_of(2, tp_value_int(20), tp_value_int(22)), *res = NULL;
        if (tp_rpc_sync(tp_to_rank(2), "add", args, NULL, 5.0, &res) == TP_OK)
            tp_value_get_int(res, &sum);
        tp_value_free(args);
        tp_value_free(res);
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* Runs program on a simulated world of hosts from seed; with check, the
 * oracle must have seen no violation (the first one is printed). */
static void run_world(int hosts, uint64_t seed, tp_sim_program program, int check) {
    tp_sim_config cfg = {.hosts = hosts, .seed = seed};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_run(sim, program, NULL, NULL), TP_OK);
    if (check && tp_sim_violations(sim))
        print_error("%s\n", tp_sim_violation(sim));
    uint64_t violations = tp_sim_violations(sim);
    tp_sim_free(sim);
    if (check)
        assert_int_equal(violations, 0);
}

static void test_interrupt_init_then_init_again(void **state) {
    (void)state;
    run_world(RANKS, 20, init_program, 1);
    assert_int_equal(failures, 0);
    assert_int_equal(first_st[0], TP_ECANCELED);
    assert_string_equal(first_msg[0],
                        "init: interrupted while waiting for rank 2 (of 3 workers)");
    /* One poll (20 ms) after the interrupt, at most. */
    assert_true(first_took[0] >= 300 * MS && first_took[0] <= 300 * MS + 25 * MS);
    assert_true(interrupted_at >= 300 * MS && interrupted_at < 310 * MS);
    assert_int_equal(first_st[1], TP_ECANCELED);
    assert_string_equal(first_msg[1], "init: worker 'w0' (rank 0) was interrupted while waiting "
                                      "for rank 2 (of 3 workers)");
    assert_true(first_took[1] <= 300 * MS + 50 * MS);
    assert_int_equal(first_st[2], TP_ECANCELED);
    assert_non_null(strstr(first_msg[2], "was interrupted"));
    for (int r = 0; r < RANKS; r++)
        assert_int_equal(again_st[r], TP_OK);
    assert_int_equal(sum, 42);
}

/*
 * spec: INTERRUPT-1, SHUTDOWN-5, SHUTDOWN-7. Rank 0's graceful shutdown
 * waits in its drain for its call to rank 1's 20-second function; host 2
 * (no worker) interrupts it at 1 s. Rank 0 abandons the drain within one poll,
 * tears down (its call fails), and says so with TP_ECANCELED. Rank 1's own
 * graceful shutdown ends once its function returns.
 */
static tp_status sd_st[RANKS];
static char sd_msg[TP_ERRMSG_LEN_MAX];
static uint64_t sd_took, sd_interrupted_after;
static tp_status call_st;

static int shutdown_program(int rank, int world_size, void *arg) {
    (void)arg, (void)world_size;
    ctx_of[rank] = tp_context_current();
    if (rank == 2) { /* not a worker: the thread that catches Ctrl-C */
        CHECK(tp_sim_sleep(1.0) == TP_OK);
        sd_interrupted_after = now_ns();
        CHECK(tp_context_interrupt(ctx_of[0]) == TP_OK);
        return 0;
    }
    CHECK(tp_register_function("sleep", fn_sleep, NULL) == TP_OK);
    if (init_as(rank, 2) != TP_OK) {
        CHECK(0);
        return 0;
    }
    if (rank == 0) {
        tp_future *f = NULL;
        tp_value *args = tp_value_list_of(1, tp_value_float(20.0));
        CHECK(tp_rpc_async(tp_to_rank(1), "sleep", args, NULL, 60.0, &f) == TP_OK);
        tp_value_free(args);
        uint64_t t0 = now_ns();
        sd_st[0] = tp_shutdown(1);
        sd_took = now_ns() - t0;
        sd_interrupted_after -= t0;
        snprintf(sd_msg, sizeof sd_msg, "%s", tp_errmsg());
        call_st = tp_future_status(f);
        tp_future_free(f);
        return 0;
    }
    sd_st[rank] = tp_shutdown(1);
    return 0;
}

static void test_interrupt_graceful_shutdown(void **state) {
    (void)state;
    run_world(RANKS, 21, shutdown_program, 1);
    assert_int_equal(failures, 0);
    assert_int_equal(sd_st[0], TP_ECANCELED);
    if (!strstr(sd_msg, "shutdown: interrupted during the drain"))
        fail_msg("%s", sd_msg);
    assert_non_null(strstr(sd_msg, "torn down"));
    assert_true(sd_took >= sd_interrupted_after && sd_took <= sd_interrupted_after + 25 * MS);
    assert_int_equal(call_st, TP_ESHUTDOWN);
    /* The others end once rank 1's function did; rank 0 left without them. */
    assert_true(sd_st[1] == TP_OK || sd_st[1] == TP_EPEERDOWN);
}

/*
 * spec: INTERRUPT-1: the same in the barrier, the phase before the drain:
 * rank 1 takes 5 s to begin its shutdown, so rank 0 waits for it there when
 * host 2 interrupts it at 1 s; the message names the barrier.
 */
static int barrier_program(int rank, int world_size, void *arg) {
    (void)arg, (void)world_size;
    ctx_of[rank] = tp_context_current();
    if (rank == 2) {
        CHECK(tp_sim_sleep(1.0) == TP_OK);
        CHECK(tp_context_interrupt(ctx_of[0]) == TP_OK);
        return 0;
    }
    if (init_as(rank, 2) != TP_OK) {
        CHECK(0);
        return 0;
    }
    if (rank == 1)
        CHECK(tp_sleep(5.0) == TP_OK);
    sd_st[rank] = tp_shutdown(1);
    if (rank == 0)
        snprintf(sd_msg, sizeof sd_msg, "%s", tp_errmsg());
    return 0;
}

static void test_interrupt_graceful_shutdown_in_its_barrier(void **state) {
    (void)state;
    run_world(RANKS, 22, barrier_program, 1);
    assert_int_equal(failures, 0);
    assert_int_equal(sd_st[0], TP_ECANCELED);
    if (!strstr(sd_msg, "shutdown: interrupted during the barrier"))
        fail_msg("%s", sd_msg);
}

/*
 * spec: INTERRUPT-1, tp_init_params.interrupted: a backend whose own init
 * waits (as the TCP one waits for its store) can be interrupted from the
 * start of init. "SIM_SLOWINIT" waits up to 10 s in its init, asking
 * interrupted every TP_INIT_POLL_MS; host 1 interrupts rank 0 at 100 ms:
 * init ends TP_ECANCELED within one poll.
 */
extern const tp_backend tpi_sim_backend;
static tp_backend slow_init_backend;
static tp_status slow_init_st = TP_EINVAL;
static uint64_t slow_init_took;

static tp_status slow_init(const tp_init_params *p, tp_agent **agent, const tp_agent_ops **ops,
                           char *errmsg, size_t errmsg_len) {
    for (int i = 0; i < 500; i++) {
        if (p->interrupted && p->interrupted(p)) {
            snprintf(errmsg, errmsg_len, "interrupted while the backend waited");
            return TP_ECANCELED;
        }
        if (tp_sim_sleep(TP_INIT_POLL_MS / 1e3) != TP_OK)
            break;
    }
    return tpi_sim_backend.init(p, agent, ops, errmsg, errmsg_len);
}

static int slow_init_program(int rank, int world_size, void *arg) {
    (void)arg, (void)world_size;
    ctx_of[rank] = tp_context_current();
    if (rank == 1) {
        CHECK(tp_sim_sleep(0.1) == TP_OK);
        CHECK(tp_context_interrupt(ctx_of[0]) == TP_OK);
        return 0;
    }
    uint64_t t0 = now_ns();
    slow_init_st = tp_init_rpc("w0", "SIM_SLOWINIT", 0, 1, NULL);
    slow_init_took = now_ns() - t0;
    return 0;
}

static void test_interrupt_seen_by_a_waiting_backend_init(void **state) {
    (void)state;
    run_world(2, 23, slow_init_program, 1);
    assert_int_equal(failures, 0);
    print_message("init: %s after %.3f ms\n", tp_status_name(slow_init_st),
                  (double)slow_init_took / 1e6);
    assert_int_equal(slow_init_st, TP_ECANCELED);
    assert_true(slow_init_took >= 100 * MS && slow_init_took <= 125 * MS);
}

/*
 * spec: INTERRUPT-1: an interrupt is seen within one poll (20 ms) even while
 * the worker sleeps between retries of a store that is down (those sleeps
 * grow to 200 ms): both workers shut down gracefully with the store down
 * from 1 s; host 2 interrupts rank 0 at 3 s, when its retries have long
 * reached their longest sleep.
 */
static tp_status outage_st;
static char outage_msg[TP_ERRMSG_LEN_MAX];
static uint64_t outage_took, outage_interrupted_after;

static int outage_program(int rank, int world_size, void *arg) {
    (void)arg, (void)world_size;
    ctx_of[rank] = tp_context_current();
    if (rank == 2) {
        CHECK(tp_sim_sleep(3.0) == TP_OK);
        outage_interrupted_after = now_ns();
        CHECK(tp_context_interrupt(ctx_of[0]) == TP_OK);
        return 0;
    }
    if (init_as(rank, 2) != TP_OK) {
        CHECK(0);
        return 0;
    }
    CHECK(tp_sleep(1.0) == TP_OK); /* the store goes down now */
    uint64_t t0 = now_ns();
    tp_status st = tp_shutdown(1);
    if (rank == 0) {
        outage_st = st;
        outage_took = now_ns() - t0;
        outage_interrupted_after -= t0;
        snprintf(outage_msg, sizeof outage_msg, "%s", tp_errmsg());
    }
    return 0;
}

static void test_interrupt_seen_between_store_retries(void **state) {
    (void)state;
    tp_sim_config cfg = {.hosts = RANKS, .seed = 22};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    char err[256];
    assert_int_equal(tp_sim_load_faults(sim, "storedown 1000 60000\n", err, sizeof err), TP_OK);
    assert_int_equal(tp_sim_run(sim, outage_program, NULL, NULL), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    print_message("rank 0: %s after %.3f ms (interrupted at %.3f ms): %s\n",
                  tp_status_name(outage_st), (double)outage_took / 1e6,
                  (double)outage_interrupted_after / 1e6, outage_msg);
    assert_int_equal(outage_st, TP_ECANCELED);
    assert_true(outage_took >= outage_interrupted_after &&
                outage_took <= outage_interrupted_after + 25 * MS);
}

/*
 * spec: CANCEL-1. Rank 0 gives up on a call to rank 1's 20-second function
 * after 100 ms: the future completes at once with TP_ECANCELED and the
 * caller's message, the call no longer counts as in flight here, a second
 * cancel is TP_EALREADY, and the callee's answer (TP_ECANCELED, sent when
 * its tp:cancel came) is dropped; when the function ends (20 s), its result
 * is not sent at all.
 */
static tp_status cancel_st[4];
static char cancel_msg[TP_ERRMSG_LEN_MAX];
static uint64_t in_flight_after = 99;
static uint64_t cancel_quiet_msgs = 99;

static int cancel_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("sleep", fn_sleep, NULL) == TP_OK);
    if (init_as(rank, world_size) != TP_OK) {
        CHECK(0);
        return 0;
    }
    if (rank == 0) {
        tp_future *f = NULL;
        tp_value *args = tp_value_list_of(1, tp_value_float(20.0));
        CHECK(tp_rpc_async(tp_to_rank(1), "sleep", args, NULL, 60.0, &f) == TP_OK);
        tp_value_free(args);
        CHECK(tp_sleep(0.1) == TP_OK);
        uint64_t t0 = now_ns();
        cancel_st[0] = tp_future_cancel(f);
        cancel_st[1] = tp_future_wait(f, 1.0);
        CHECK(now_ns() == t0); /* at once */
        snprintf(cancel_msg, sizeof cancel_msg, "%s", tp_future_error(f));
        cancel_st[2] = tp_future_cancel(f);
        cancel_st[3] = tp_future_cancel(NULL);
        tp_debug_info info;
        CHECK(tp_get_debug_info(&info) == TP_OK);
        CHECK(info.calls_in_flight == 1); /* the call is gone; its tp:cancel is out */
        CHECK(tp_sleep(0.01) == TP_OK);
        CHECK(tp_get_debug_info(&info) == TP_OK);
        in_flight_after = info.calls_in_flight; /* the tp:cancel was answered */
        uint64_t m0 = tp_sim_messages(tp_sim_current());
        CHECK(tp_sleep(21.0) == TP_OK); /* no other answer comes: none is waited for */
        /* None is sent either: the function's end at 20 s finds its request
         * canceled and drops its answer (here rank 1 sends nothing else). */
        cancel_quiet_msgs = tp_sim_messages(tp_sim_current()) - m0;
        CHECK(tp_future_status(f) == TP_ECANCELED);
        tp_future_free(f);
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_cancel_rpc_async(void **state) {
    (void)state;
    run_world(2, 22, cancel_program, 1);
    assert_int_equal(failures, 0);
    assert_int_equal(cancel_st[0], TP_OK);
    assert_int_equal(cancel_st[1], TP_ECANCELED);
    assert_string_equal(cancel_msg,
                        "rpc_async to worker 'w1' (id 1), function 'sleep': canceled by the caller");
    assert_int_equal(cancel_st[2], TP_EALREADY);
    assert_int_equal(cancel_st[3], TP_EINVAL);
    assert_int_equal(in_flight_after, 0);
    assert_int_equal(cancel_quiet_msgs, 0);
}

/*
 * spec: CANCEL-1, SHUTDOWN-5, FLOW-7, AGENT-5 (issue 20: "after an
 * interrupted call, shutdown() does not wait for that call's remote work").
 * Rank 1 has two pool threads. Rank 0 starts four calls to it: A, a 20 s
 * function (runs); B, a function that answers later with a future rank 1
 * completes at 300 ms; C, a 20 s method on an rref rank 1 owns (runs on the
 * second thread); D, another 20 s function (queued: both threads busy).
 * At 100 ms rank 0 cancels all four. The callee gives each up: D never runs,
 * B's answer is never sent, A and C stop counting in S. Rank 0's window to
 * rank 1 (max_inflight_bytes 4096) is empty again at once, so a call of
 * nearly 4 KiB goes without waiting. Then both shut down gracefully: the
 * drain does not wait for A and C (rank 0 returns in milliseconds, not
 * 20 s), and rank 1's teardown wakes their tp_sleep (AGENT-5: a running
 * function still ends by itself). The oracle (SIM-9) lets only the canceled
 * functions outlive the drain.
 */
static tp_status cancel2_st[4], cancel2_fut_st[4], window_st, cancel2_sd[2];
static uint64_t cancel2_sd_took[2];
static int sleep_begins, nap_begins;
static tp_status sleep_end_st;
static tp_future *held_answer;

static tp_status fn_sleep_counted(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                  tp_value **result, void *ud) {
    (void)ud;
    if (strcmp(tp_call_function(call), "Obj.nap") == 0)
        nap_begins++;
    else
        sleep_begins++;
    tp_status st = fn_sleep(call, args, kwargs, result, NULL);
    sleep_end_st = st;
    *result = tp_value_str("done"); /* freed unsent: nobody wants it */
    return TP_OK;
}

static tp_status fn_later(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *ud) {
    (void)args, (void)kwargs, (void)result, (void)ud;
    CHECK(tp_future_new(&held_answer) == TP_OK);
    return tp_call_answer_later(call, held_answer);
}

static tp_status fn_make_obj(tp_call *call, const tp_value *args, const tp_value *kwargs,
                             tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    *result = tp_value_object("Obj", NULL, NULL);
    return TP_OK;
}

static tp_status fn_sink(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)result, (void)ud;
    return TP_OK;
}

static int cancel2_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("sleep", fn_sleep_counted, NULL) == TP_OK);
    CHECK(tp_register_function("later", fn_later, NULL) == TP_OK);
    CHECK(tp_register_function("make_obj", fn_make_obj, NULL) == TP_OK);
    CHECK(tp_new_method("Obj", "nap", fn_sleep_counted, NULL) == TP_OK);
    CHECK(tp_register_function_ex("sink", fn_sink, NULL, TP_FN_NONBLOCKING) == TP_OK);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 60.0) == TP_OK);
    CHECK(tp_options_set_shutdown_timeout(o, 60.0) == TP_OK);
    CHECK(tp_options_set_num_worker_threads(o, 2) == TP_OK);
    CHECK(tp_options_set_max_inflight_bytes(o, 4096) == TP_OK);
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    if (tp_init_rpc(name, "SIM", rank, world_size, o) != TP_OK) {
        tp_options_free(o);
        CHECK(0);
        return 0;
    }
    tp_options_free(o);
    if (rank == 0) {
        tp_rref *obj = NULL;
        CHECK(tp_remote(tp_to_rank(1), "make_obj", NULL, NULL, 10.0, &obj) == TP_OK);
        tp_value *v = NULL;
        tp_value *args = tp_value_list_of(1, tp_value_float(20.0));
        tp_future *f[4] = {NULL};
        CHECK(tp_rpc_async(tp_to_rank(1), "sleep", args, NULL, 60.0, &f[0]) == TP_OK);
        CHECK(tp_rpc_async(tp_to_rank(1), "later", NULL, NULL, 60.0, &f[1]) == TP_OK);
        CHECK(tp_rref_rpc_async(obj, "nap", args, NULL, 60.0, &f[2]) == TP_OK);
        CHECK(tp_rpc_async(tp_to_rank(1), "sleep", args, NULL, 60.0, &f[3]) == TP_OK);
        tp_value_free(args);
        CHECK(tp_sleep(0.1) == TP_OK);
        for (int i = 0; i < 4; i++)
            cancel2_st[i] = tp_future_cancel(f[i]);
        CHECK(tp_sleep(0.01) == TP_OK); /* the callee's answers come back */
        /* FLOW-7: the canceled requests' bytes came back with them. */
        char blob[3900] = {0};
        tp_value *big = tp_value_list_of(1, tp_value_bytes(blob, sizeof blob));
        window_st = tp_rpc_sync(tp_to_rank(1), "sink", big, NULL, 1.0, &v);
        tp_value_free(v);
        tp_value_free(big);
        for (int i = 0; i < 4; i++) {
            cancel2_fut_st[i] = tp_future_status(f[i]);
            tp_future_free(f[i]);
        }
        tp_rref_release(obj);
    } else {
        CHECK(tp_sleep(0.3) == TP_OK);
        CHECK(held_answer != NULL);
        if (held_answer) /* the canceled call's answer: not sent, and freed */
            CHECK(tp_future_set_result(held_answer, tp_value_str("late")) == TP_OK);
    }
    uint64_t t0 = now_ns();
    cancel2_sd[rank] = tp_shutdown(1);
    cancel2_sd_took[rank] = now_ns() - t0;
    return 0;
}

static void test_cancel_callee_gives_up(void **state) {
    (void)state;
    run_world(2, 23, cancel2_program, 1);
    tp_future_free(held_answer);
    held_answer = NULL;
    assert_int_equal(failures, 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(cancel2_st[i], TP_OK);
        assert_int_equal(cancel2_fut_st[i], TP_ECANCELED);
    }
    assert_int_equal(window_st, TP_OK);
    assert_int_equal(sleep_begins, 1); /* D was given up before it ran */
    assert_int_equal(nap_begins, 1);
    assert_int_equal(sleep_end_st, TP_ESHUTDOWN); /* woken by rank 1's teardown */
    assert_int_equal(cancel2_sd[0], TP_OK);
    assert_int_equal(cancel2_sd[1], TP_OK);
    assert_true(cancel2_sd_took[0] < 1 * SEC);
    assert_true(cancel2_sd_took[1] < 1 * SEC);
}

/*
 * spec: CANCEL-1, FUNC-7: a function canceled while it runs that then
 * answers later: its answer is never sent, and the record of it is freed
 * with the future's reference it took (the core is freed at the end; a
 * kept record would keep the core alive for good).
 */
static tp_future *late_held;

static tp_status fn_late_later(tp_call *call, const tp_value *args, const tp_value *kwargs,
                               tp_value **result, void *ud) {
    (void)args, (void)kwargs, (void)result, (void)ud;
    CHECK(tp_sleep(0.3) == TP_OK); /* canceled meanwhile, at 0.1 s */
    CHECK(tp_future_new(&late_held) == TP_OK);
    return tp_call_answer_later(call, late_held);
}

static tp_status late_cancel_st = TP_EINVAL;

static int late_later_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("late_later", fn_late_later, NULL) == TP_OK);
    if (init_as(rank, world_size) != TP_OK) {
        CHECK(0);
        return 0;
    }
    if (rank == 0) {
        tp_future *f = NULL;
        CHECK(tp_rpc_async(tp_to_rank(1), "late_later", NULL, NULL, 60.0, &f) == TP_OK);
        CHECK(tp_sleep(0.1) == TP_OK);
        late_cancel_st = tp_future_cancel(f);
        tp_future_free(f);
    } else {
        CHECK(tp_sleep(0.6) == TP_OK);
        CHECK(late_held != NULL);
        if (late_held)
            CHECK(tp_future_set_result(late_held, tp_value_str("late")) == TP_OK);
        tp_future_free(late_held);
        late_held = NULL;
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_cancel_then_answer_later_frees_its_record(void **state) {
    (void)state;
    run_world(2, 24, late_later_program, 1);
    assert_int_equal(failures, 0);
    assert_int_equal(late_cancel_st, TP_OK);
    assert_int_equal(tp_core_live_count(), 0);
}

/*
 * spec: CANCEL-1, SHUTDOWN-5. Only a canceled request leaves S: a call that
 * timed out instead still holds the job's graceful drain until its function
 * ends (here at 2 s), as before.
 */
static uint64_t timedout_sd_took;

static int timedout_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("sleep", fn_sleep, NULL) == TP_OK);
    if (init_as(rank, world_size) != TP_OK) {
        CHECK(0);
        return 0;
    }
    if (rank == 0) {
        tp_value *args = tp_value_list_of(1, tp_value_float(2.0)), *v = NULL;
        CHECK(tp_rpc_sync(tp_to_rank(1), "sleep", args, NULL, 0.1, &v) == TP_ETIMEDOUT);
        tp_value_free(args);
    }
    uint64_t t0 = now_ns();
    CHECK(tp_shutdown(1) == TP_OK);
    if (rank == 0)
        timedout_sd_took = now_ns() - t0;
    return 0;
}

static void test_timed_out_call_still_drains(void **state) {
    (void)state;
    run_world(2, 24, timedout_program, 1);
    assert_int_equal(failures, 0);
    assert_true(timedout_sd_took > 1800 * MS && timedout_sd_took < 2200 * MS);
}

/*
 * spec: CANCEL-1, FLOW-8. The callee's one pool thread is busy for 5 s and
 * its credit is 4 KiB. Rank 0 sends 3 KiB requests, canceling each at once:
 * a queued request keeps its bytes counted until it leaves the queue (its
 * TP_ECANCELED answer comes then), so the caller's window stays shut and
 * it cannot send many before the busy call ends. Answered at once instead,
 * each cancel reopened the window and hundreds queued outside any bound.
 */
#define FLOOD_CALLS 40
static int flood_sent_early; /* requests sent within the first second */
static int flood_canceled;   /* futures that ended TP_ECANCELED */

static int flood_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("sleep", fn_sleep, NULL) == TP_OK);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 60.0) == TP_OK);
    CHECK(tp_options_set_shutdown_timeout(o, 60.0) == TP_OK);
    CHECK(tp_options_set_num_worker_threads(o, 1) == TP_OK);
    CHECK(tp_options_set_max_inflight_bytes(o, 4096) == TP_OK);
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    CHECK(tp_init_rpc(name, "SIM", rank, world_size, o) == TP_OK);
    tp_options_free(o);
    if (rank == 0) {
        tp_value *a = tp_value_list_of(1, tp_value_float(5.0));
        tp_future *busy = NULL;
        CHECK(tp_rpc_async(tp_to_rank(1), "sleep", a, NULL, 60.0, &busy) == TP_OK);
        tp_value_free(a);
        CHECK(tp_sleep(0.01) == TP_OK);
        static char blob[3000];
        uint64_t t0 = now_ns();
        for (int i = 0; i < FLOOD_CALLS; i++) {
            tp_value *b = tp_value_list_of(2, tp_value_float(0.01), tp_value_bytes(blob, sizeof blob));
            tp_future *f = NULL;
            tp_status st = tp_rpc_async(tp_to_rank(1), "sleep", b, NULL, 60.0, &f);
            tp_value_free(b);
            if (st == TP_OK && now_ns() - t0 < 1000 * MS)
                flood_sent_early++;
            if (f) {
                tp_future_cancel(f);
                flood_canceled += tp_future_wait(f, 60.0) == TP_ECANCELED;
            }
            tp_future_free(f);
        }
        CHECK(tp_future_wait(busy, 60.0) == TP_OK);
        tp_future_free(busy);
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_cancel_queued_keeps_credit(void **state) {
    (void)state;
    run_world(2, 25, flood_program, 1);
    assert_int_equal(failures, 0);
    fprintf(stderr, "  %d of %d canceled requests sent in the busy call's first second\n",
            flood_sent_early, FLOOD_CALLS);
    assert_int_equal(flood_canceled, FLOOD_CALLS);
    assert_true(flood_sent_early <= 2);
}

static int reset(void **state) {
    (void)state;
    failures = 0;
    memset(first_st, 0, sizeof first_st);
    memset(again_st, 0, sizeof again_st);
    memset(sd_st, 0, sizeof sd_st);
    sum = 0;
    return 0;
}

int main(void) {
    slow_init_backend = tpi_sim_backend;
    slow_init_backend.init = slow_init;
    if (tp_register_backend("SIM_SLOWINIT", &slow_init_backend) != TP_OK)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_interrupt_seen_by_a_waiting_backend_init, reset),
        cmocka_unit_test_setup(test_interrupt_init_then_init_again, reset),
        cmocka_unit_test_setup(test_interrupt_graceful_shutdown, reset),
        cmocka_unit_test_setup(test_interrupt_graceful_shutdown_in_its_barrier, reset),
        cmocka_unit_test_setup(test_interrupt_seen_between_store_retries, reset),
        cmocka_unit_test_setup(test_cancel_rpc_async, reset),
        cmocka_unit_test_setup(test_cancel_callee_gives_up, reset),
        cmocka_unit_test_setup(test_cancel_then_answer_later_frees_its_record, reset),
        cmocka_unit_test_setup(test_timed_out_call_still_drains, reset),
        cmocka_unit_test_setup(test_cancel_queued_keeps_credit, reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
