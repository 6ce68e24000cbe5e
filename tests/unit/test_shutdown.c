/*
 * test_shutdown.c: graceful shutdown on the simulator when the world around
 * the worker is gone (spec/lifecycle.md SHUTDOWN-5, SHUTDOWN-8).
 */
#define _GNU_SOURCE /* RTLD_NEXT, for alloc_fault.h */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc_fault.h"
#include "common/codec.h"  /* tpi_frame_cache_stats */
#include "common/limits.h" /* TPI_FRAME_CACHE_MIN */
#include "sim_check.h"
#include "store/mem_store.h"
#include "tensorplay/rpc.h"
#include "tensorplay/rpc_backend.h"
#include "tensorplay/sim.h"

/* How long the served function runs; shutdown must outlast it, not spin. */
#define SLOW_S 0.1

/* slow([seconds]): sleeps that long (SLOW_S without an argument). */
static tp_status slow_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)call, (void)kwargs, (void)ud;
    double s = SLOW_S;
    if (tp_list_len(args) > 0)
        (void)tp_value_get_float(tp_list_get(args, 0), &s);
    tp_status st = tp_sleep(s);
    *result = tp_value_nil();
    return st;
}

/* Registers slow and initialises "w<rank>" with that shutdown timeout. */
static tp_status start(int rank, int world_size, double shutdown_timeout_s) {
    char name[8] = "w0";
    name[1] = (char)('0' + rank);
    CHECK(tp_register_function("slow", slow_fn, NULL) == TP_OK);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_shutdown_timeout(o, shutdown_timeout_s) == TP_OK);
    tp_status st = tp_init_rpc(name, "SIM", rank, world_size, o);
    tp_options_free(o);
    CHECK(st == TP_OK);
    return st;
}

typedef struct outcome {
    double w1_timeout_s; /* w1's shutdown timeout; 0: 30 s */
    tp_status shutdown_status;
    char message[TP_ERRMSG_LEN_MAX];
    uint64_t shutdown_ns; /* virtual time the shutdown took */
} outcome;

/* Runs program on `hosts` workers under a fault plan (NULL: none) and the
 * oracle: no violation and no failed CHECK. codes may be NULL. */
static void run_checked(uint32_t hosts, uint64_t seed, const char *plan, tp_sim_program program,
                        int *codes) {
    tp_sim_config cfg = {.hosts = hosts, .seed = seed};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    char err[256];
    if (plan)
        assert_int_equal(tp_sim_load_faults(sim, plan, err, sizeof err), TP_OK);
    assert_int_equal(tp_sim_run(sim, program, NULL, codes), TP_OK);
    if (tp_sim_violations(sim))
        print_message("oracle: %s\n", tp_sim_violation(sim));
    assert_int_equal(tp_sim_violations(sim), 0);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
}

/*
 * w0 starts a slow call on w1 and crashes while it runs; w1 shuts down
 * gracefully while it still serves that call. Every other worker is dead,
 * so the drain's gathers never wait: the drain itself must yield until the
 * served call ends, then report the dead worker (TP_EPEERDOWN), not spin
 * through its round cap at one instant and report TP_ETIMEDOUT.
 */
static int program(int rank, int world_size, void *arg) {
    outcome *out = arg;
    double w1_timeout_s = out->w1_timeout_s > 0 ? out->w1_timeout_s : 30.0;
    if (start(rank, world_size, rank == 1 ? w1_timeout_s : 30.0) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_future *f = NULL;
        CHECK(tp_rpc_async(tp_to_rank(1), "slow", NULL, NULL, TP_TIMEOUT_DEFAULT, &f) == TP_OK);
        CHECK(tp_sleep(0.001) == TP_OK); /* the request is being served on w1 */
        tp_sim_crash_self();
        tp_future_free(f);
        (void)tp_shutdown(0);
        return 0;
    }
    CHECK(tp_sleep(0.002) == TP_OK); /* w0 is dead and w1 still serves its call */
    uint64_t t0 = now_ns();
    out->shutdown_status = tp_shutdown(1);
    out->shutdown_ns = now_ns() - t0;
    snprintf(out->message, sizeof out->message, "%s", tp_errmsg());
    return 0;
}

/* Runs program with w1's shutdown timeout (0: 30 s) into out: w0 crashed
 * (137), w1 ended well. */
static void run_dead_peer_program(outcome *out, double w1_timeout_s) {
    memset(out, 0, sizeof *out);
    out->w1_timeout_s = w1_timeout_s;
    tp_sim_config cfg = {.hosts = 2, .seed = 1};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    int codes[2] = {-9, -9};
    assert_int_equal(tp_sim_run(sim, program, out, codes), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(codes[0], 137);
    assert_int_equal(codes[1], 0);
    assert_int_equal(failures, 0);
    print_message("w1's graceful shutdown: %s after %.3f ms: %s\n",
                  tp_status_name(out->shutdown_status), (double)out->shutdown_ns / 1e6,
                  out->message);
}

/* The same with w1's shutdown timeout 35 ms, far below the served call:
 * the drain's pauses between rounds (1, 2, 4, ... ms) are cut at the
 * deadline, so it ends TP_ETIMEDOUT at 35 ms, not a pause later. */
static void test_shutdown_drain_pause_cut_at_the_deadline(void **state) {
    (void)state;
    outcome out;
    run_dead_peer_program(&out, 0.035);
    assert_int_equal(out.shutdown_status, TP_ETIMEDOUT);
    assert_true(out.shutdown_ns >= 35 * MS && out.shutdown_ns <= 37 * MS);
}

/* OPT: a shutdown timeout of 0 is no deadline: a graceful shutdown that
 * waits 0.1 s for a served call is within its bound (the oracle's, from
 * the timeout the shutdown announces), and ends TP_OK on both. */
static tp_status zero_timeout_st[2];

static int zero_timeout_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 0.0) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_future *f = NULL;
        tp_value *args = tp_value_list_of(1, tp_value_float(0.1));
        CHECK(tp_rpc_async(tp_to_rank(1), "slow", args, NULL, TP_TIMEOUT_DEFAULT, &f) == TP_OK);
        tp_value_free(args);
        tp_future_free(f); /* the call goes on */
    }
    zero_timeout_st[rank] = tp_shutdown(1);
    return 0;
}

static void test_shutdown_zero_timeout_is_no_deadline(void **state) {
    (void)state;
    zero_timeout_st[0] = zero_timeout_st[1] = TP_EINVAL;
    int codes[2] = {-9, -9};
    run_checked(2, 3, NULL, zero_timeout_program, codes);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    assert_int_equal(zero_timeout_st[0], TP_OK);
    assert_int_equal(zero_timeout_st[1], TP_OK);
}

static void test_shutdown_drain_with_every_peer_dead(void **state) {
    (void)state;
    outcome out;
    run_dead_peer_program(&out, 0);
    assert_int_equal(out.shutdown_status, TP_EPEERDOWN);
    assert_non_null(strstr(out.message, "'w0'"));
    /* It waited for the served call (about SLOW_S), and not much longer. */
    assert_true(out.shutdown_ns >= (uint64_t)(SLOW_S * 1e9) - 2 * MS);
    assert_true(out.shutdown_ns <= (uint64_t)(SLOW_S * 1e9) + 50 * MS);
}

/*
 * RREF-5, SHUTDOWN-8: a parent keeps its reference for a child it sent until
 * the child is confirmed; when the child's worker dies first, peer-down drops
 * that kept reference, so the parent's own release still deletes the value on
 * its owner. w0 sends its rref (owned by w1) to w2, whose fork confirmation
 * from w1 is held up by a 1 s delay; w2 dies before it arrives. The function
 * that received the rref never runs (RREF-13: it waits for the confirmation).
 */
static int child_freed, child_taken, child_die;

static void child_obj_destroy(void *state) {
    free(state);
    child_freed++;
}

static tp_status child_obj_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                              tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    *result = tp_value_object("Obj", malloc(1), child_obj_destroy);
    return *result ? TP_OK : TP_ENOMEM;
}

static tp_status take_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    child_taken = 1;
    *result = tp_value_nil();
    return TP_OK;
}

static tp_status die_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                       tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    child_die = 1;
    *result = tp_value_nil();
    return TP_OK;
}

static int dead_child_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("obj", child_obj_fn, NULL) == TP_OK);
    CHECK(tp_register_function("take", take_fn, NULL) == TP_OK);
    CHECK(tp_register_function("die", die_fn, NULL) == TP_OK);
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    if (rank == 2) {
        while (!child_die)
            CHECK(tp_sleep(0.001) == TP_OK);
        tp_sim_crash_self(); /* before w1's confirmation of its fork arrives */
        (void)tp_shutdown(0);
        return 0;
    }
    if (rank == 1) {
        CHECK(tp_sleep(5.0) == TP_OK);
        CHECK(tp_shutdown(0) == TP_OK);
        return 0;
    }
    tp_rref *r = NULL;
    CHECK(tp_remote(tp_to_rank(1), "obj", NULL, NULL, TP_TIMEOUT_INFINITE, &r) == TP_OK);
    tp_value *v = NULL;
    CHECK(tp_rref_to_here(r, TP_TIMEOUT_INFINITE, &v) == TP_ETYPE); /* built */
    tp_value *args = tp_value_list_of(1, tp_value_rref(r));
    tp_future *f = NULL;
    CHECK(tp_rpc_async(tp_to_rank(2), "take", args, NULL, TP_TIMEOUT_INFINITE, &f) == TP_OK);
    tp_value_free(args);
    CHECK(tp_sleep(0.05) == TP_OK); /* w2 has the rref; its "take" waits to run */
    tp_future *die = NULL;
    CHECK(tp_rpc_async(tp_to_rank(2), "die", NULL, NULL, TP_TIMEOUT_INFINITE, &die) == TP_OK);
    CHECK(tp_sleep(0.1) == TP_OK); /* w2 died; w0 saw peer-down */
    CHECK(tp_future_status(f) == TP_EPEERDOWN);
    CHECK(child_taken == 0); /* RREF-13: never ran with an unconfirmed rref */
    tp_future_free(f);
    tp_future_free(die);
    tp_rref_release(r);
    /* The delete goes before this call on the same connection (AGENT-8). */
    CHECK(tp_rpc_sync(tp_to_rank(1), "take", NULL, NULL, TP_TIMEOUT_INFINITE, &v) == TP_OK);
    tp_value_free(v);
    CHECK(child_freed == 1);
    CHECK(tp_shutdown(0) == TP_OK);
    return 0;
}

static void test_shutdown_dead_child_drops_kept_reference(void **state) {
    (void)state;
    child_freed = child_taken = 0;
    int codes[3] = {-9, -9, -9};
    run_checked(3, 11, "delay 1 2 0 3600000 1000\n", dead_child_program, codes);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    assert_int_equal(codes[2], 137);
}

/*
 * SHUTDOWN-2: the barrier and the drain each get the whole shutdown timeout.
 * w0 waits 0.8 s of its 1 s in the barrier for w1, which arrives with a
 * 0.55 s call to w0 in flight: the drain must wait it out (to about 1.35 s),
 * not stop at the barrier's deadline with TP_ETIMEDOUT.
 */
static tp_status phase_status[2];
static char phase_msg[2][TP_ERRMSG_LEN_MAX];

static int phases_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 1.0) != TP_OK)
        return 1;
    if (rank == 1) {
        CHECK(tp_sleep(0.75) == TP_OK);
        tp_future *f = NULL;
        tp_value *args = tp_value_list_of(1, tp_value_float(0.55));
        CHECK(tp_rpc_async(tp_to_rank(0), "slow", args, NULL, TP_TIMEOUT_INFINITE, &f) == TP_OK);
        tp_value_free(args);
        tp_future_free(f); /* goes on: the drain must wait for it */
        CHECK(tp_sleep(0.05) == TP_OK);
    }
    phase_status[rank] = tp_shutdown(1);
    snprintf(phase_msg[rank], sizeof phase_msg[rank], "%s", tp_errmsg());
    return 0;
}

static void test_shutdown_each_phase_has_the_timeout(void **state) {
    (void)state;
    run_checked(2, 3, NULL, phases_program, NULL);
    for (int r = 0; r < 2; r++) {
        if (phase_status[r] != TP_OK)
            print_message("w%d: %s: %s\n", r, tp_status_name(phase_status[r]), phase_msg[r]);
        assert_int_equal(phase_status[r], TP_OK);
    }
}

/*
 * SHUTDOWN-3: the barrier has the timeout too. w0 (1 s) reaches it while
 * w1 works on for 3 s: w0's shutdown fails at 1 s exactly with
 * TP_ETIMEDOUT naming the rank it waited for; w1, whose own barrier then
 * misses w0 (gone before it arrived), ends its shutdown either way.
 */
static tp_status barrier_st = TP_EINVAL;
static char barrier_msg[TP_ERRMSG_LEN_MAX];
static uint64_t barrier_took;

static int barrier_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 1.0) != TP_OK)
        return 1;
    if (rank == 1) {
        CHECK(tp_sleep(3.0) == TP_OK);
        (void)tp_shutdown(1);
        return 0;
    }
    uint64_t t0 = now_ns();
    barrier_st = tp_shutdown(1);
    barrier_took = now_ns() - t0;
    snprintf(barrier_msg, sizeof barrier_msg, "%s", tp_errmsg());
    return 0;
}

static void test_shutdown_barrier_times_out(void **state) {
    (void)state;
    barrier_st = TP_EINVAL;
    run_checked(2, 3, NULL, barrier_program, NULL);
    print_message("w0: %s after %.3f s: %s\n", tp_status_name(barrier_st), barrier_took / 1e9,
                  barrier_msg);
    assert_int_equal(barrier_st, TP_ETIMEDOUT);
    assert_non_null(strstr(barrier_msg, "shutdown barrier: timed out waiting for rank 1 (of 2"));
    assert_true(barrier_took >= 1000 * MS && barrier_took <= 1000 * MS + TOL_NS);
}

/*
 * SHUTDOWN-4: the release phase deletes every user rref still held, so the
 * owner frees its value during the holder's shutdown (its drain waits for the
 * delete), not only when the holder's teardown later shows up as peer-down.
 */
static uint64_t obj_freed_ns, holder_down_ns;

static void obj_destroy(void *state) {
    free(state);
    obj_freed_ns = now_ns();
}

static tp_status make_obj_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                             tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    *result = tp_value_object("Obj", malloc(1), obj_destroy);
    return *result ? TP_OK : TP_ENOMEM;
}

static int held_rref_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("make_obj", make_obj_fn, NULL) == TP_OK);
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    tp_rref *r = NULL;
    if (rank == 0) {
        CHECK(tp_remote(tp_to_rank(1), "make_obj", NULL, NULL, TP_TIMEOUT_INFINITE, &r) == TP_OK);
        tp_value *v = NULL;
        CHECK(tp_rref_to_here(r, TP_TIMEOUT_INFINITE, &v) == TP_ETYPE); /* built */
        tp_value_free(v);
    }
    CHECK(tp_shutdown(1) == TP_OK);
    if (rank == 0)
        holder_down_ns = now_ns();
    tp_rref_release(r); /* after shutdown: the handle only */
    return 0;
}

static void test_shutdown_release_phase_deletes_held_rref(void **state) {
    (void)state;
    obj_freed_ns = holder_down_ns = 0;
    run_checked(2, 8, NULL, held_rref_program, NULL);
    assert_true(obj_freed_ns > 0 && holder_down_ns > 0);
    assert_true(obj_freed_ns < holder_down_ns);
}

/* echo(x): x. */
static tp_status echo_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)call, (void)kwargs, (void)ud;
    *result = tp_value_clone(tp_list_get(args, 0));
    return *result ? TP_OK : TP_ENOMEM;
}

static size_t cached_while_running; /* large frame blocks cached before the shutdown */
static size_t cached_after = 1;     /* and right after it returned */

/* A world of one: w0 echoes a value of TPI_FRAME_CACHE_MIN bytes through
 * itself; the frames that carried it go to the process's frame cache once
 * freed. Nothing else runs in the process, so what the cache holds right
 * after tp_shutdown returns is what the teardown left there (the world's
 * end trims it again, sim_world.c). */
static int big_echo_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("echo", echo_fn, NULL) == TP_OK);
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    uint8_t *big = calloc(1, TPI_FRAME_CACHE_MIN);
    CHECK(big != NULL);
    tp_value *args = tp_value_list_of(1, tp_value_bytes(big, TPI_FRAME_CACHE_MIN));
    free(big);
    tp_value *res = NULL;
    CHECK(tp_rpc_sync(tp_to_rank(0), "echo", args, NULL, TP_TIMEOUT_DEFAULT, &res) == TP_OK);
    const void *data = NULL;
    size_t len = 0;
    CHECK(tp_value_get_bytes(res, &data, &len) == TP_OK && len == TPI_FRAME_CACHE_MIN);
    tp_value_free(res);
    tp_value_free(args);
    tpi_frame_cache_stats(&cached_while_running, NULL);
    CHECK(tp_shutdown(1) == TP_OK);
    tpi_frame_cache_stats(&cached_after, NULL);
    return 0;
}

/* A worker's teardown gives the frame cache's idle blocks back to the
 * system (and the small blocks' lists): a process whose worker shut down
 * holds no frame memory for it. */
static void test_shutdown_gives_cached_frames_back(void **state) {
    (void)state;
    cached_while_running = 0;
    cached_after = 1;
    run_checked(1, 3, NULL, big_echo_program, NULL);
    assert_true(cached_while_running >= 1);
    assert_int_equal(cached_after, 0);
}

/*
 * SHUTDOWN-5: a request whose caller gave up (a 1 ms timeout on a 300 ms
 * link) is still on the wire when both workers shut down, and arrives after
 * every drain ended: it must be dropped or refused, never run while a drain
 * says the world is quiet, and nothing may leak or hang (the oracle, SIM-9).
 * Requests that land during the drain are the swarm's seeds 158 and 192.
 */
static int late_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    if (rank == 1) {
        tp_future *f = NULL;
        tp_value *args = tp_value_list_of(1, tp_value_float(0.02));
        CHECK(tp_rpc_async(tp_to_rank(0), "slow", args, NULL, 0.001, &f) == TP_OK);
        tp_value_free(args);
        (void)tp_future_wait(f, TP_TIMEOUT_INFINITE);
        CHECK(tp_future_status(f) == TP_ETIMEDOUT); /* gave up; the request goes on */
        tp_future_free(f);
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_shutdown_drain_sees_requests_in_flight(void **state) {
    (void)state;
    run_checked(2, 4, "latency 1 0 300 300 fixed\n", late_program, NULL);
}

/*
 * SHUTDOWN-1, INIT-1: a call made on a worker that is shutting down is
 * refused with TP_ESHUTDOWN and leaves nothing counted inside the API: w1
 * calls w0's retry, which waits on a long call to w1; w0 shuts down, not
 * gracefully, while it waits; that call fails and retry at once tries
 * another, while w0's teardown still waits for the threads inside its API.
 * The refusal gives its count back, so the teardown ends at once.
 */
static tp_status retry_first, retry_second;
static uint64_t retry_shutdown_ns;

static tp_status retry_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    tp_value *a = tp_value_list_of(1, tp_value_float(5.0)), *res = NULL;
    retry_first = tp_rpc_sync(tp_to_rank(1), "slow", a, NULL, TP_TIMEOUT_DEFAULT, &res);
    tp_value_free(res);
    tp_future *f = NULL;
    retry_second = tp_rpc_async(tp_to_rank(1), "slow", a, NULL, TP_TIMEOUT_DEFAULT, &f);
    tp_future_free(f);
    tp_value_free(a);
    *result = tp_value_nil();
    return TP_OK;
}

static int retry_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("retry", retry_fn, NULL) == TP_OK);
    if (start(rank, world_size, 30.0) != TP_OK)
        return 1;
    if (rank == 0) {
        CHECK(tp_sleep(0.5) == TP_OK); /* retry waits on w1's slow(5) */
        uint64_t t0 = now_ns();
        CHECK(tp_shutdown(0) == TP_OK);
        retry_shutdown_ns = now_ns() - t0;
        return 0;
    }
    tp_future *f = NULL;
    CHECK(tp_rpc_async(tp_to_rank(0), "retry", NULL, NULL, TP_TIMEOUT_DEFAULT, &f) == TP_OK);
    (void)tp_future_wait(f, TP_TIMEOUT_DEFAULT);
    tp_future_free(f);
    (void)tp_shutdown(0);
    return 0;
}

static void test_shutdown_call_refused_while_stopping_leaves_nothing_inside(void **state) {
    (void)state;
    retry_first = retry_second = TP_OK;
    retry_shutdown_ns = UINT64_MAX;
    tp_sim_config cfg = {.hosts = 2, .seed = 7, .time_limit_ns = 120 * 1000000000ull};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_run(sim, retry_program, NULL, NULL), TP_OK);
    assert_int_equal(tp_sim_violations(sim), 0);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    assert_int_equal(retry_first, TP_ESHUTDOWN);
    assert_int_equal(retry_second, TP_ESHUTDOWN);
    assert_true(retry_shutdown_ns < 100 * 1000000ull);
}

/*
 * SHUTDOWN-5: a drain that cannot get quiet ends at its deadline with
 * TP_ETIMEDOUT, on time, and without spinning at the deadline (the oracle's
 * busy-loop bound, SIM-9): w0 still waits for a 10 s call to w1 when its 1 s
 * shutdown timeout runs out.
 */
static tp_status stuck_status, stuck_future;
static char stuck_msg[TP_ERRMSG_LEN_MAX];
static uint64_t stuck_ns;
static double stuck_w1_timeout_s; /* w1's shutdown timeout; w0's is 1 s */

static int stuck_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, rank == 0 ? 1.0 : stuck_w1_timeout_s) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_future *f = NULL;
        tp_value *args = tp_value_list_of(1, tp_value_float(10.0));
        CHECK(tp_rpc_async(tp_to_rank(1), "slow", args, NULL, TP_TIMEOUT_INFINITE, &f) == TP_OK);
        tp_value_free(args);
        uint64_t t0 = now_ns();
        stuck_status = tp_shutdown(1);
        stuck_ns = now_ns() - t0;
        snprintf(stuck_msg, sizeof stuck_msg, "%s", tp_errmsg());
        stuck_future = tp_future_done(f) ? tp_future_status(f) : TP_OK;
        tp_future_free(f);
        return 0;
    }
    (void)tp_shutdown(1);
    return 0;
}

static void test_shutdown_drain_times_out_on_time(void **state) {
    (void)state;
    stuck_w1_timeout_s = 1.0;
    run_checked(2, 5, NULL, stuck_program, NULL);
    assert_int_equal(stuck_status, TP_ETIMEDOUT);
    assert_true(stuck_ns >= 1 * SEC && stuck_ns <= 2 * SEC + 50 * MS); /* barrier + drain */
}

/*
 * SHUTDOWN-5, SHUTDOWN-7: the drain's wait for this worker's own client calls
 * ends at the deadline itself, with the call still active. With a 1 s timeout
 * on w1 too, w1's own drain times out first and its teardown ends the call
 * just before w0's deadline; with 30 s, w0's 10 s call is still in flight at
 * the instant w0's 1 s drain deadline arrives: w0 must stop waiting then, not
 * poll again at that same instant.
 */
static void test_shutdown_drain_deadline_with_own_call_active(void **state) {
    (void)state;
    stuck_w1_timeout_s = 30.0;
    run_checked(2, 5, NULL, stuck_program, NULL);
    assert_int_equal(stuck_status, TP_ETIMEDOUT);
    assert_int_equal(stuck_future, TP_ESHUTDOWN); /* still pending at teardown */
    assert_true(stuck_ns >= 1 * SEC && stuck_ns <= 2 * SEC + 50 * MS); /* barrier + drain */
    /* its own round ends at the deadline: no further round is begun then */
    if (!strstr(stuck_msg, "still 2 call(s) active over all workers at the deadline (round 0)"))
        fail_msg("w0's shutdown: %s", stuck_msg);
}

/*
 * SHUTDOWN-2, SHUTDOWN-6: a REMOTE still queued behind a busy pool when its
 * worker shuts down non-gracefully runs without user code and is answered
 * TP_ESHUTDOWN: the caller's to_here gets that answer, the owner record is
 * settled, and nothing hangs or crashes. w1 has one pool thread, busy with a
 * 1 s call from w0 when w0's remote arrives.
 */
static tp_status queued_to_here;
static char queued_msg[TP_ERRMSG_LEN_MAX];

static int queued_remote_program(int rank, int world_size, void *arg) {
    (void)arg;
    char name[8] = "w0";
    name[1] = (char)('0' + rank);
    CHECK(tp_register_function("slow", slow_fn, NULL) == TP_OK);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_num_worker_threads(o, 1) == TP_OK);
    tp_status st = tp_init_rpc(name, "SIM", rank, world_size, o);
    tp_options_free(o);
    CHECK(st == TP_OK);
    if (st != TP_OK)
        return 1;
    if (rank == 0) {
        tp_future *f = NULL;
        tp_rref *r = NULL;
        tp_value *args = tp_value_list_of(1, tp_value_float(1.0));
        CHECK(tp_rpc_async(tp_to_rank(1), "slow", args, NULL, TP_TIMEOUT_INFINITE, &f) == TP_OK);
        CHECK(tp_remote(tp_to_rank(1), "slow", args, NULL, TP_TIMEOUT_INFINITE, &r) == TP_OK);
        tp_value_free(args);
        tp_value *v = NULL;
        queued_to_here = tp_rref_to_here(r, TP_TIMEOUT_INFINITE, &v);
        snprintf(queued_msg, sizeof queued_msg, "%s", tp_errmsg());
        CHECK(v == NULL);
        tp_value_free(v);
        tp_rref_release(r);
        (void)tp_future_wait(f, TP_TIMEOUT_INFINITE);
        tp_future_free(f);
    } else {
        CHECK(tp_sleep(0.1) == TP_OK); /* slow runs on the only pool thread; the remote waits */
    }
    CHECK(tp_shutdown(0) == TP_OK);
    return 0;
}

static void test_shutdown_nongraceful_answers_queued_remote(void **state) {
    (void)state;
    int codes[2] = {-9, -9};
    run_checked(2, 6, NULL, queued_remote_program, codes);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    if (queued_to_here != TP_ESHUTDOWN)
        print_message("to_here: %s: %s\n", tp_status_name(queued_to_here), queued_msg);
    assert_int_equal(queued_to_here, TP_ESHUTDOWN);
    assert_non_null(strstr(queued_msg, "shutting down"));
}

/* ---- A store that watches the drain, and can go away with rank 0 -------- */

/*
 * Wraps the simulator's store: records each drain round's published values
 * (sd/drain/<k>/<r>) and when sd/done and sd/left/1 were written; can hold
 * one worker's write (set, or create by compare-and-set) of one round's value
 * for a while (a slow store, as the
 * simulator's storeslow fault, for that set only), or one worker's value
 * of one round before it lands; can show one worker a false "dead/<rank>"
 * key for a while (that worker counts the rank as gone too early); and
 * once `gone` is set
 * (rank 0's process ended: on TCP the store is a thread of it, TCP-11) it
 * refuses every operation, as a store whose server is gone would.
 */
#define WATCH_ROUNDS 64
#define WATCH_RANKS 3
typedef struct watch_store {
    tp_store base; /* first */
    tp_store *inner;
} watch_store;

static struct {
    int gone;
    int refused;                       /* operations refused since gone */
    int hold_rank, hold_round;         /* rank -1: hold nothing; round -1: every round */
    double hold_s;
    unsigned rounds;                   /* drain rounds seen: highest round + 1 */
    char val[WATCH_ROUNDS][WATCH_RANKS][48];    /* values published, by round and rank */
    uint64_t val_ns[WATCH_ROUNDS][WATCH_RANKS]; /* when each was written */
    uint64_t done_ns, left1_ns;        /* when sd/done and sd/left/1 were first written */
    int done_by;                       /* the host that wrote sd/done first */
    int lose_count_host;               /* -1, or the host whose count of lose_count fails */
    const char *lose_count;            /* a count key ("sd/arrive/count"), with lose_count_host */
    int lose_add_only;                 /* only that host's add fails: its "x" is written */
    uint64_t arrive1_ns;               /* when sd/arrive/1 was written */
    int late_rank, late_round;         /* -1: none; else that value lands late_s after it is sent */
    double late_s;
    int false_dead_host;               /* -1, or a host that sees a false "dead/<rank>" key, */
    int false_dead_rank;               /* from its round-0 value's write to its round-1 one's */
    int false_dead_on, false_dead_seen; /* the window is open; scans that reported it */
    int false_dead_barrier; /* the window is the barrier instead: open until round 0's write */
    int mem_inner;                      /* the in-memory store (scan and add: STORE-12's count) */
    int garble_sums;                    /* every drain round's sums read back as "zz" */
    int no_scan;                        /* a store without scan: keys are read one by one */
    unsigned arrive_scans[WATCH_RANKS]; /* scans of "sd/arrive/", by host */
    unsigned drain_keys_by_gen[3];      /* "g<n>/sd/drain/0/..." keys written, n < 3 */
} watch;

static void watch_reset(void) {
    memset(&watch, 0, sizeof watch);
    watch.hold_rank = watch.hold_round = -1;
    watch.done_by = -1;
    watch.lose_count_host = -1;
    watch.late_rank = watch.late_round = -1;
    watch.false_dead_host = -1;
}

/* The lost count: that host's add to it fails, and so does marking it "x". */
static int watch_loses(tp_store *s, const char *key) {
    if (!watch.lose_count || tp_sim_current_host() != watch.lose_count_host ||
        !strstr(key, watch.lose_count))
        return 0;
    snprintf(s->errmsg, sizeof s->errmsg, "the store refused '%s' (test)", key);
    return 1;
}

static int watch_refuse(tp_store *s) {
    if (!watch.gone)
        return 0;
    watch.refused++;
    snprintf(s->errmsg, sizeof s->errmsg, "connection refused: the store's process ended");
    return 1;
}

/* A key was written (by set, or created by compare-and-set: STORE-12). */
static void watch_written(const char *key, const void *value, size_t len) {
    unsigned round, r;
    const char *d = strstr(key, "sd/drain/");
    if (d && sscanf(d + 9, "%u/%u", &round, &r) == 2 && round < WATCH_ROUNDS && r < WATCH_RANKS) {
        snprintf(watch.val[round][r], sizeof watch.val[round][r], "%.*s", (int)len,
                 (const char *)value);
        watch.val_ns[round][r] = now_ns();
        if (round + 1 > watch.rounds)
            watch.rounds = round + 1;
        if ((int)r == watch.false_dead_host && round <= 1)
            watch.false_dead_on = !watch.false_dead_barrier && round == 0;
        if ((int)r == watch.hold_rank && (watch.hold_round < 0 || (int)round == watch.hold_round))
            (void)tp_sim_sleep(watch.hold_s); /* this worker's store is slow, this once */
    }
    for (unsigned g = 0; g < 3; g++) {
        char gen_key[32];
        snprintf(gen_key, sizeof gen_key, "g%u/sd/drain/0/", g);
        if (strncmp(key, gen_key, strlen(gen_key)) == 0)
            watch.drain_keys_by_gen[g]++;
    }
    if (strstr(key, "sd/left/1") && !watch.left1_ns)
        watch.left1_ns = now_ns();
    if (strstr(key, "sd/arrive/1") && !watch.arrive1_ns)
        watch.arrive1_ns = now_ns();
}

static tp_status watch_set(tp_store *s, const char *key, const void *value, size_t len) {
    if (watch_refuse(s))
        return TP_ESTORE;
    if (!watch.lose_add_only && watch_loses(s, key))
        return TP_EINVAL; /* not a store outage: not retried */
    tp_store *in = ((watch_store *)s)->inner;
    tp_status st = in->ops->set(in, key, value, len);
    if (st == TP_OK)
        watch_written(key, value, len);
    return st;
}
static tp_status watch_get(tp_store *s, const char *key, void **value, size_t *len) {
    if (watch_refuse(s))
        return TP_ESTORE;
    size_t n = strlen(key);
    if (watch.garble_sums && strstr(key, "sd/drain/") && n > 7 &&
        (strcmp(key + n - 7, "/active") == 0 || strcmp(key + n - 7, "/issued") == 0)) {
        *value = malloc(2);
        if (!*value)
            return TP_ENOMEM;
        memcpy(*value, "zz", 2); /* a store that lost the sums: not a number */
        *len = 2;
        return TP_OK;
    }
    tp_store *in = ((watch_store *)s)->inner;
    return in->ops->get(in, key, value, len);
}
static tp_status watch_add(tp_store *s, const char *key, int64_t delta, int64_t *result) {
    if (watch_refuse(s))
        return TP_ESTORE;
    if (watch_loses(s, key))
        return TP_ESTORE;
    tp_store *in = ((watch_store *)s)->inner;
    return in->ops->add(in, key, delta, result);
}
static tp_status watch_cas(tp_store *s, const char *key, const void *expected, size_t elen,
                           const void *desired, size_t dlen, int *swapped) {
    if (watch_refuse(s))
        return TP_ESTORE;
    unsigned round, r;
    const char *d = strstr(key, "sd/drain/");
    if (d && sscanf(d + 9, "%u/%u", &round, &r) == 2 && (int)r == watch.late_rank &&
        (int)round == watch.late_round)
        (void)tp_sim_sleep(watch.late_s); /* the write is on its way: not there yet */
    tp_store *in = ((watch_store *)s)->inner;
    tp_status st = in->ops->compare_set(in, key, expected, elen, desired, dlen, swapped);
    if (st == TP_OK && *swapped && strstr(key, "sd/done") && !watch.done_ns) {
        watch.done_ns = now_ns();
        watch.done_by = tp_sim_current_host();
    }
    if (st == TP_OK && *swapped)
        watch_written(key, desired, dlen);
    return st;
}
static tp_status watch_del(tp_store *s, const char *key) {
    if (watch_refuse(s))
        return TP_ESTORE;
    tp_store *in = ((watch_store *)s)->inner;
    return in->ops->del(in, key);
}
static tp_status watch_scan(tp_store *s, const char *prefix,
                            int (*fn)(void *arg, const char *key, const void *value, size_t len),
                            void *arg) {
    if (watch_refuse(s))
        return TP_ESTORE;
    size_t n = strlen(prefix);
    int host = tp_sim_current_host();
    if (strstr(prefix, "sd/arrive/") && host >= 0 && host < WATCH_RANKS)
        watch.arrive_scans[host]++;
    if (watch.false_dead_on && tp_sim_current_host() == watch.false_dead_host && n >= 5 &&
        strcmp(prefix + n - 5, "dead/") == 0) {
        char key[256];
        snprintf(key, sizeof key, "%s%d", prefix, watch.false_dead_rank);
        watch.false_dead_seen++;
        if (fn(arg, key, "1", 1))
            return TP_OK; /* the reader had enough */
    }
    tp_store *in = ((watch_store *)s)->inner;
    return in->ops->scan(in, prefix, fn, arg);
}
static void watch_close(tp_store *s) {
    watch_store *w = (watch_store *)s;
    w->inner->ops->close(w->inner);
    free(w);
}
static tp_store_ops watch_ops = {
    .api_version = TP_BACKEND_API_VERSION,
    .set = watch_set,
    .get = watch_get,
    .add = watch_add,
    .compare_set = watch_cas,
    .del = watch_del,
    .close = watch_close,
};

/* Runs program on `hosts` workers (at most WATCH_RANKS) with the watching
 * store, under a fault plan (NULL: none), and the oracle. */
static void run_watched_on(uint32_t hosts, uint64_t seed, const char *plan, tp_sim_program prog,
                           int *codes) {
    assert_true(hosts <= WATCH_RANKS);
    watch_store *w = calloc(1, sizeof *w);
    assert_non_null(w);
    if (watch.mem_inner)
        assert_int_equal(tpi_mem_store_open(&w->inner, NULL, 0), TP_OK);
    else
        assert_int_equal(tp_sqlite_store_open(":memory:", &w->inner, NULL, 0), TP_OK);
    watch_ops.scan = w->inner->ops->scan && !watch.no_scan ? watch_scan : NULL;
    w->base.ops = &watch_ops;
    tp_sim_config cfg = {.hosts = hosts, .seed = seed, .store = &w->base};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    char err[256];
    if (plan)
        assert_int_equal(tp_sim_load_faults(sim, plan, err, sizeof err), TP_OK);
    assert_int_equal(tp_sim_run(sim, prog, NULL, codes), TP_OK);
    if (tp_sim_violations(sim))
        print_message("oracle: %s\n", tp_sim_violation(sim));
    assert_int_equal(tp_sim_violations(sim), 0);
    tp_sim_free(sim);
    watch_close(&w->base);
    assert_int_equal(failures, 0);
}

/* Runs program on 2 hosts with the watching store, and the oracle. */
static void run_watched(uint64_t seed, tp_sim_program prog, int *codes) {
    run_watched_on(2, seed, NULL, prog, codes);
}

/* INIT-1: each init of a context is a new generation of the job's keys:
 * the second init's graceful shutdown writes its drain under g1/, after
 * the first's under g0/. */
static int twice_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 30.0) != TP_OK)
        return 1;
    CHECK(tp_shutdown(1) == TP_OK);
    char name[8] = "w0";
    name[1] = (char)('0' + rank);
    CHECK(tp_init_rpc(name, "SIM", rank, world_size, NULL) == TP_OK);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_shutdown_second_init_is_the_next_generation(void **state) {
    (void)state;
    watch_reset();
    watch.mem_inner = 1;
    int codes[2] = {-9, -9};
    run_watched(23, twice_program, codes);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    print_message("drain round 0 keys by generation: %u %u %u\n", watch.drain_keys_by_gen[0],
                  watch.drain_keys_by_gen[1], watch.drain_keys_by_gen[2]);
    assert_true(watch.drain_keys_by_gen[0] >= 2);
    assert_true(watch.drain_keys_by_gen[1] >= 2);
    assert_int_equal(watch.drain_keys_by_gen[2], 0);
}

/* The sums of one drain round's published values (C + S, and I). */
static void round_sums(unsigned round, uint64_t *active, uint64_t *issued) {
    *active = *issued = 0;
    for (int r = 0; r < WATCH_RANKS; r++) {
        unsigned long long a = 0, sv = 0, i = 0;
        if (sscanf(watch.val[round][r], "%llu %llu %llu", &a, &sv, &i) == 3) {
            *active += a + sv;
            *issued += i;
        }
    }
}

/*
 * SHUTDOWN-5 step 4: a call issued and finished between two drain rounds
 * changes the issued total, so the drain must go another round even though
 * both rounds saw nothing active. The call comes from a function whose caller
 * canceled it (CANCEL-1: it no longer counts in S, and runs on): right after
 * w1 published round 0 (its store slow for that one set), the function calls
 * its own worker once; the call is done before w1 publishes round 1.
 */
static int after_round0_called; /* 1 once the canceled function's call returned */
static tp_status after_round0_status;

static tp_status after_round0_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                 tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    tp_status st = TP_OK;
    while (st == TP_OK && watch.val[0][1][0] == '\0') /* until w1 published round 0 */
        st = tp_sleep(0.0001);
    tp_value *res = NULL;
    if (st == TP_OK)
        st = tp_rpc_sync(tp_to_rank(1), "slow", NULL, NULL, TP_TIMEOUT_DEFAULT, &res);
    tp_value_free(res);
    after_round0_status = st;
    after_round0_called = 1;
    *result = tp_value_nil();
    return st;
}

static int issued_between_rounds_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("after_round0", after_round0_fn, NULL) == TP_OK);
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_future *f = NULL;
        CHECK(tp_rpc_async(tp_to_rank(1), "after_round0", NULL, NULL, TP_TIMEOUT_INFINITE, &f) ==
              TP_OK);
        CHECK(tp_sleep(0.01) == TP_OK); /* it runs on w1 */
        CHECK(tp_future_cancel(f) == TP_OK);
        tp_future_free(f);
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* garbled: the round's sums unreadable, so each worker reads every key. */
static void call_between_rounds(int garbled) {
    watch_reset();
    watch.mem_inner = garbled;
    watch.garble_sums = garbled;
    after_round0_called = 0;
    after_round0_status = TP_EINVAL;
    watch.hold_rank = 1;
    watch.hold_round = 0;
    watch.hold_s = 0.5; /* the call ("slow": 0.1 s) is done well before round 1 */
    int codes[2] = {-9, -9};
    run_watched(21, issued_between_rounds_program, codes);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    assert_int_equal(after_round0_called, 1);
    assert_int_equal(after_round0_status, TP_OK);
    assert_true(watch.rounds >= 2);
    for (unsigned k = 0; k < watch.rounds; k++)
        print_message("round %u: w0 '%s', w1 '%s'\n", k, watch.val[k][0], watch.val[k][1]);
    /* The setting: rounds 0 and 1 both quiet, with the call counted in between. */
    uint64_t a0, i0, a1, i1;
    round_sums(0, &a0, &i0);
    round_sums(1, &a1, &i1);
    assert_int_equal(a0, 0);
    assert_int_equal(a1, 0);
    assert_true(i1 > i0); /* w1's issued count took the call */
    /* The check: the drain did not stop after round 1. */
    assert_true(watch.rounds >= 3);
    uint64_t a2, i2;
    round_sums(2, &a2, &i2);
    assert_int_equal(a2, 0);
    assert_int_equal(i2, i1);
    assert_int_equal(watch.rounds, 3); /* and stopped right after it */
}

static void test_shutdown_call_between_rounds_forces_another_round(void **state) {
    (void)state;
    call_between_rounds(0);
}

/* The same when the drain reads every worker's key (its sums garbled). */
static void test_shutdown_call_between_rounds_forces_another_round_by_the_keys(void **state) {
    (void)state;
    call_between_rounds(1);
}

/*
 * SHUTDOWN-9: rank 0's process ends as soon as its graceful shutdown returns
 * (its store with it, modelled by the watching store), while w1 is behind in
 * the drain: w1's store is slow to return from each drain round's set (50 ms,
 * longer than a poll's longest pause; the value is already written), so w0
 * reads the last round, decides (sd/done) and reaches its leaving while w1
 * has yet to read that round. A dropped 0.3 s call from w0 to w1 gives the
 * drain a few rounds. w0 waits for w1's sd/left, so w1 still finishes with
 * TP_OK and no store operation of it is refused.
 */
static tp_status behind_status[2];
static char behind_msg[2][TP_ERRMSG_LEN_MAX];

static int behind_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    if (rank == 0) {
        tp_future *f = NULL;
        tp_value *args = tp_value_list_of(1, tp_value_float(0.3));
        CHECK(tp_rpc_async(tp_to_rank(1), "slow", args, NULL, TP_TIMEOUT_INFINITE, &f) == TP_OK);
        tp_value_free(args);
        tp_future_free(f);
    }
    behind_status[rank] = tp_shutdown(1);
    snprintf(behind_msg[rank], sizeof behind_msg[rank], "%s", tp_errmsg());
    if (rank == 0)
        watch.gone = 1; /* the process ends here, and the store with it */
    return 0;
}

static void test_shutdown_rank0_exits_while_rank1_behind(void **state) {
    (void)state;
    watch_reset();
    watch.hold_rank = 1;
    watch.hold_round = -1;
    watch.hold_s = 0.05;
    int codes[2] = {-9, -9};
    run_watched(22, behind_program, codes);
    for (int r = 0; r < 2; r++)
        if (behind_status[r] != TP_OK)
            print_message("w%d: %s: %s\n", r, tp_status_name(behind_status[r]), behind_msg[r]);
    print_message("sd/done by host %d at %.3f ms; sd/left/1 at %.3f ms\n", watch.done_by,
                  (double)watch.done_ns / 1e6, (double)watch.left1_ns / 1e6);
    assert_int_equal(behind_status[0], TP_OK);
    assert_int_equal(behind_status[1], TP_OK);
    assert_int_equal(watch.refused, 0);
    /* The setting: w0 decided first, and w1 still used the store after that. */
    assert_int_equal(watch.done_by, 0);
    assert_true(watch.left1_ns > watch.done_ns);
}

/*
 * STORE-12: while the arrival count is short and nobody is dead, a barrier
 * round reads the count, not every rank's key. w1 comes to the shutdown
 * barrier 2 s after w0; over that wait w0 polls the count about a hundred
 * times (0.5 ms apart, up to 20 ms), and reads the keys themselves (one
 * scan of "sd/arrive/" each) only on the count's look schedule: 16 ms into
 * the wait, then at twice the time waited. A round that read the keys every
 * time would scan about a hundred times.
 */
static tp_status late_arrival_status[2];

static int late_arrival_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    if (rank == 1)
        CHECK(tp_sleep(2.0) == TP_OK);
    late_arrival_status[rank] = tp_shutdown(1);
    return 0;
}

static void test_shutdown_barrier_reads_the_count_while_waiting(void **state) {
    (void)state;
    watch_reset();
    watch.mem_inner = 1;
    int codes[2] = {-9, -9};
    run_watched(23, late_arrival_program, codes);
    assert_int_equal(late_arrival_status[0], TP_OK);
    assert_int_equal(late_arrival_status[1], TP_OK);
    print_message("scans of sd/arrive/ while waiting: w0 %u, w1 %u\n", watch.arrive_scans[0],
                  watch.arrive_scans[1]);
    assert_in_range(watch.arrive_scans[0], 1, 16);
}

/*
 * STORE-12: a count that stays short for good while every key is there. w1's
 * add to "sd/arrive/count" fails and so does its "x" (refused, not retried):
 * the count stays at 1 with both keys written and nobody dead. w0 must find
 * the keys on its own schedule, whatever the log level, not wait until the
 * barrier's deadline (10 s).
 */
static tp_status lost_count_status[2];
static uint64_t lost_count_ns[2];

static int lost_count_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    uint64_t t0 = now_ns();
    lost_count_status[rank] = tp_shutdown(1);
    lost_count_ns[rank] = now_ns() - t0;
    return 0;
}

static void test_shutdown_barrier_count_lost_for_good(void **state) {
    (void)state;
    watch_reset();
    watch.lose_count_host = 1;
    watch.lose_count = "sd/arrive/count";
    int codes[2] = {-9, -9};
    run_watched(23, lost_count_program, codes);
    for (int r = 0; r < 2; r++)
        print_message("w%d: %s after %.3f ms\n", r, tp_status_name(lost_count_status[r]),
                      (double)lost_count_ns[r] / 1e6);
    assert_int_equal(lost_count_status[0], TP_OK);
    assert_int_equal(lost_count_status[1], TP_OK);
    assert_true(lost_count_ns[0] < 2 * SEC);
    assert_true(lost_count_ns[1] < 2 * SEC);
}

/*
 * STORE-12: a count marked "x" (an add that failed, its mark written) is not
 * a count: its readers read the keys. w0's add to "sd/arrive/count" fails
 * and it marks the count "x"; w1 arrives at the barrier 1 s later. w0's
 * barrier ends only after w1's key is there: its first drain value is
 * written after w1 arrived, and both shutdowns end with TP_OK.
 */
static tp_status marked_status[2];

static int marked_count_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    if (rank == 1)
        CHECK(tp_sleep(1.0) == TP_OK);
    marked_status[rank] = tp_shutdown(1);
    return 0;
}

static void test_shutdown_barrier_count_marked_not_a_number(void **state) {
    (void)state;
    watch_reset();
    watch.lose_count_host = 0;
    watch.lose_count = "sd/arrive/count";
    watch.lose_add_only = 1;
    int codes[2] = {-9, -9};
    run_watched(23, marked_count_program, codes);
    assert_int_equal(marked_status[0], TP_OK);
    assert_int_equal(marked_status[1], TP_OK);
    assert_true(watch.arrive1_ns >= 1000 * MS);
    if (watch.val_ns[0][0] < watch.arrive1_ns)
        fail_msg("w0's drain began at %.3f ms, before w1 arrived at %.3f ms",
                 (double)watch.val_ns[0][0] / 1e6, (double)watch.arrive1_ns / 1e6);
}

/*
 * SHUTDOWN-5, STORE-12: the first test's world on a store without scan,
 * whose keys the gathers read one by one: w0's missing key, w0 being dead,
 * is not waited for, and w1's graceful shutdown still ends after its served
 * call with TP_EPEERDOWN naming w0.
 */
static outcome scanless_out;

static int scanless_program(int rank, int world_size, void *arg) {
    (void)arg;
    return program(rank, world_size, &scanless_out);
}

static void test_shutdown_dead_peer_on_a_store_without_scan(void **state) {
    (void)state;
    watch_reset();
    watch.no_scan = 1;
    memset(&scanless_out, 0, sizeof scanless_out);
    int codes[2] = {-9, -9};
    run_watched_on(2, 1, NULL, scanless_program, codes);
    assert_int_equal(codes[0], 137);
    assert_int_equal(codes[1], 0);
    print_message("w1's graceful shutdown: %s after %.3f ms: %s\n",
                  tp_status_name(scanless_out.shutdown_status),
                  (double)scanless_out.shutdown_ns / 1e6, scanless_out.message);
    assert_int_equal(scanless_out.shutdown_status, TP_EPEERDOWN);
    assert_non_null(strstr(scanless_out.message, "'w0'"));
    assert_true(scanless_out.shutdown_ns <= (uint64_t)(SLOW_S * 1e9) + 50 * MS);
}

/*
 * SHUTDOWN-7: a barrier that finds no memory for its look at the keys fails
 * with TP_ENOMEM saying so; it never takes the barrier as passed. w1 comes
 * to the barrier 0.5 s late; w0's first look at the keys (16 ms into its
 * wait) cannot get its arrays.
 */
static tp_status nomem_barrier_st;
static char nomem_barrier_msg[TP_ERRMSG_LEN_MAX];
static uint64_t nomem_barrier_ns;

static int nomem_barrier_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    if (rank == 1) {
        CHECK(tp_sleep(0.5) == TP_OK);
        (void)tp_shutdown(1);
        return 0;
    }
    atomic_store(&calloc_fail_size, 3); /* calloc(2 workers, 3): the barrier's arrays */
    atomic_store(&calloc_fail_n, 2);
    uint64_t t0 = now_ns();
    nomem_barrier_st = tp_shutdown(1);
    nomem_barrier_ns = now_ns() - t0;
    atomic_store(&calloc_fail_n, 0);
    snprintf(nomem_barrier_msg, sizeof nomem_barrier_msg, "%s", tp_errmsg());
    return 0;
}

static void test_shutdown_barrier_without_memory(void **state) {
    (void)state;
    if (!alloc_fault_in_use())
        skip();
    atomic_store(&calloc_pair_failed, 0);
    tp_sim_config cfg = {.hosts = 2, .seed = 5};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_run(sim, nomem_barrier_program, NULL, NULL), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    assert_true(atomic_load(&calloc_pair_failed) >= 1);
    assert_int_equal(nomem_barrier_st, TP_ENOMEM);
    if (!strstr(nomem_barrier_msg, "out of memory"))
        fail_msg("'%s'", nomem_barrier_msg);
    assert_true(nomem_barrier_ns < 500 * MS); /* before w1 came: not a barrier passed */
}

/*
 * STORE-12: a drain round whose count is complete but whose sums do not
 * read back as numbers (a store that lost them) reads the workers' keys
 * instead. w0's call to w1 runs 1 s and both shut down gracefully at once:
 * the keys show the call active, so the drain waits for it, it is
 * answered, and both shutdowns end after it with TP_OK. (A drain that
 * read neither the sums nor the keys ran to the 10 s shutdown timeout, w1
 * with TP_ETIMEDOUT.)
 */
static tp_status garbled_status[2], garbled_call_status;
static uint64_t garbled_ns[2];

static int garbled_sums_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    tp_future *f = NULL;
    if (rank == 0) {
        tp_value *args = tp_value_list_of(1, tp_value_float(1.0));
        CHECK(tp_rpc_async(tp_to_rank(1), "slow", args, NULL, TP_TIMEOUT_INFINITE, &f) == TP_OK);
        tp_value_free(args);
        CHECK(tp_sleep(0.01) == TP_OK); /* it runs on w1 */
    }
    uint64_t t0 = now_ns();
    garbled_status[rank] = tp_shutdown(1);
    garbled_ns[rank] = now_ns() - t0;
    if (f) {
        garbled_call_status =
            tp_future_done(f) ? tp_future_wait(f, TP_TIMEOUT_INFINITE) : TP_EINVAL;
        tp_future_free(f);
    }
    return 0;
}

static void test_shutdown_drain_reads_the_keys_when_sums_are_lost(void **state) {
    (void)state;
    watch_reset();
    watch.mem_inner = 1;
    watch.garble_sums = 1;
    garbled_call_status = TP_EINVAL;
    int codes[2] = {-9, -9};
    run_watched(26, garbled_sums_program, codes);
    for (int r = 0; r < 2; r++)
        print_message("w%d: %s after %.3f s\n", r, tp_status_name(garbled_status[r]),
                      (double)garbled_ns[r] / 1e9);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    assert_int_equal(garbled_call_status, TP_OK);
    assert_int_equal(garbled_status[0], TP_OK);
    assert_int_equal(garbled_status[1], TP_OK);
    assert_true(garbled_ns[0] >= 990 * MS && garbled_ns[1] >= 990 * MS);
    assert_true(watch.rounds >= 2);
}

/*
 * SHUTDOWN-5 step 5: a worker a round behind stops at sd/done. w1 counts
 * w0 as gone too early in round 0 (a false "dead/0" that only w1 sees, from
 * its round-0 value until its round-1 value, as a worker under load on TCP
 * can be judged gone; w0's round-0 value lands 50 ms late), so its round-0
 * sums lack w0's issued calls. Round 1 is complete for both: w0 decides
 * from two complete quiet rounds and writes sd/done; w1's issued total
 * moved (its round 0 missed w0's), so it starts round 2, finds sd/done
 * there and stops with TP_OK, instead of waiting for a round-2 value that
 * w0 never writes. The value read there is freed (LeakSanitizer).
 */
static tp_status early_dead_status[2];
static uint64_t early_dead_ns[2];

static int early_dead_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    if (rank == 0) { /* w0's issued count is above 0 in every round */
        tp_value *res = NULL;
        CHECK(tp_rpc_sync(tp_to_rank(1), "slow", NULL, NULL, TP_TIMEOUT_DEFAULT, &res) == TP_OK);
        tp_value_free(res);
    }
    uint64_t t0 = now_ns();
    early_dead_status[rank] = tp_shutdown(1);
    early_dead_ns[rank] = now_ns() - t0;
    return 0;
}

static void test_shutdown_round_behind_stops_at_done(void **state) {
    (void)state;
    watch_reset();
    watch.late_rank = 0;
    watch.late_round = 0;
    watch.late_s = 0.05;
    watch.false_dead_host = 1;
    watch.false_dead_rank = 0;
    int codes[2] = {-9, -9};
    run_watched(24, early_dead_program, codes);
    for (unsigned k = 0; k < watch.rounds; k++)
        print_message("round %u: w0 '%s', w1 '%s'\n", k, watch.val[k][0], watch.val[k][1]);
    for (int r = 0; r < 2; r++)
        if (early_dead_status[r] != TP_OK)
            print_message("w%d: %s after %.3f ms\n", r, tp_status_name(early_dead_status[r]),
                          (double)early_dead_ns[r] / 1e6);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    /* The setting: w1 took w0 for dead in round 0, and w0 decided (sd/done). */
    assert_true(watch.false_dead_seen > 0);
    assert_int_equal(watch.done_by, 0);
    /* The check: w1 stopped at sd/done before writing a round-2 value. */
    assert_int_equal(early_dead_status[0], TP_OK);
    assert_int_equal(early_dead_status[1], TP_OK);
    assert_int_equal(watch.rounds, 2);
    assert_true(early_dead_ns[1] < 2 * SEC);
}

/*
 * SHUTDOWN-3/5: a death the barrier saw is the shutdown's outcome even when
 * the drain then ends cleanly. w1 arrives first and, in the barrier, reads a
 * false "dead/0" (as a worker under load on TCP can be judged gone): the
 * barrier ends at once with TP_EPEERDOWN. w0, alive, arrives 200 ms later,
 * the false key is gone from w1's next look, and the drain's rounds complete
 * for both. w1's shutdown still returns the barrier's TP_EPEERDOWN, with the
 * barrier's message naming w0, not an empty one.
 */
static tp_status barrier_dead_status[2];
static char barrier_dead_msg[2][TP_ERRMSG_LEN_MAX];

static int barrier_dead_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    if (rank == 0)
        CHECK(tp_sleep(0.2) == TP_OK);
    barrier_dead_status[rank] = tp_shutdown(1);
    snprintf(barrier_dead_msg[rank], sizeof barrier_dead_msg[rank], "%s", tp_errmsg());
    return 0;
}

static void test_shutdown_barrier_death_outlives_a_clean_drain(void **state) {
    (void)state;
    watch_reset();
    watch.false_dead_host = 1;
    watch.false_dead_rank = 0;
    watch.false_dead_barrier = 1;
    watch.false_dead_on = 1;
    int codes[2] = {-9, -9};
    run_watched(24, barrier_dead_program, codes);
    for (int r = 0; r < 2; r++)
        print_message("w%d: %s: %s\n", r, tp_status_name(barrier_dead_status[r]),
                      barrier_dead_msg[r]);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    /* The setting: w1 saw the false key, and both went through the drain. */
    assert_true(watch.false_dead_seen > 0);
    assert_true(watch.rounds >= 2);
    assert_int_equal(barrier_dead_status[0], TP_OK);
    /* The check. */
    assert_int_equal(barrier_dead_status[1], TP_EPEERDOWN);
    assert_non_null(strstr(barrier_dead_msg[1], "shutdown barrier"));
    assert_non_null(strstr(barrier_dead_msg[1], "'w0'"));
}

/*
 * The drain's flush without memory: w0's calls to five peers timed out (each
 * peer is left to flush, SHUTDOWN-5), and one of the flush's two arrays (its
 * futures, of pointers, or its peers, of u32) cannot be had. Shutdown says so
 * (TP_ENOMEM, the drain named) and frees the other (LeakSanitizer, in make
 * test's sanitizer build, sees a block left behind).
 */
static tp_status flush_oom_status;
static char flush_oom_msg[TP_ERRMSG_LEN_MAX];
static unsigned flush_oom_failed;
static size_t flush_oom_size; /* the element size of the array that cannot be had */

static int flush_oom_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (start(rank, world_size, 2.0) != TP_OK)
        return 1;
    if (rank == 0) {
        for (int r = 1; r < world_size; r++) {
            tp_value *args = tp_value_list_of(1, tp_value_float(0.05));
            tp_value *res = NULL;
            CHECK(tp_rpc_sync(tp_to_rank(r), "slow", args, NULL, 0.01, &res) == TP_ETIMEDOUT);
            tp_value_free(args);
            tp_value_free(res);
        }
        atomic_store(&calloc_pair_failed, 0);
        atomic_store(&calloc_fail_size, flush_oom_size);
        atomic_store(&calloc_fail_n, (size_t)world_size - 1); /* one future per peer */
        flush_oom_status = tp_shutdown(1);
        atomic_store(&calloc_fail_n, 0);
        snprintf(flush_oom_msg, sizeof flush_oom_msg, "%s", tp_errmsg());
        flush_oom_failed = atomic_load(&calloc_pair_failed);
        return 0;
    }
    (void)tp_shutdown(1);
    return 0;
}

static void test_shutdown_drain_flush_without_memory(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) /* under valgrind, or not GCC */
        skip();
    _Static_assert(sizeof(tp_future *) != sizeof(uint32_t), "the two arrays told apart");
    const size_t sizes[2] = {sizeof(tp_future *), sizeof(uint32_t)}; /* futures, then peers */
    for (int i = 0; i < 2; i++) {
        flush_oom_size = sizes[i];
        run_checked(6, 3, NULL, flush_oom_program, NULL);
        assert_int_equal(flush_oom_failed, 1);
        assert_int_equal(flush_oom_status, TP_ENOMEM);
        assert_non_null(strstr(flush_oom_msg, "shutdown drain: out of memory"));
    }
}

/*
 * SHUTDOWN-5's flush counts the peers to ping, then pings them in turn, and
 * a ping waits for the window (FLOW-2) with the lock let go. w0's big call
 * to w1 timed out, its bytes held against w0's 4 KB window until w1 runs it
 * (FLOW-7, a 300 ms link): the ping to w1 waits. Meanwhile a function w2
 * called on w0 makes a call to w2 that times out, so w2 is left to flush
 * too, after the count: the flush pings only the peers it counted (one array
 * slot each), and w2 waits for the next round. Every shutdown ends cleanly
 * (make test's sanitizer build sees a slot written past the arrays).
 */
#define FLUSH_LINK_S 0.3 /* w0 -> w1 */

static uint64_t flush_big_ns;  /* when w0 sent its big call to w1 */
static uint64_t flush_sd_ns;   /* when w0 began its shutdown */
static uint64_t flush_late_ns; /* when poke's call to w2 timed out */
static tp_status flush_late_status = TP_EINVAL;

/* poke(): on w0, once its drain began: a call to w2 that times out. */
static tp_status poke_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    tp_status st = TP_OK;
    while (st == TP_OK && !flush_sd_ns)
        st = tp_sleep(0.001);
    if (st == TP_OK)
        st = tp_sleep(0.1); /* past the barrier: w0's ping to w1 waits for the window */
    tp_value *res = NULL;
    tp_value *sargs = tp_value_list_of(1, tp_value_float(0.01));
    if (st == TP_OK)
        st = tp_rpc_sync(tp_to_rank(2), "slow", sargs, NULL, 0.001, &res);
    flush_late_status = st;
    flush_late_ns = now_ns();
    tp_value_free(sargs);
    tp_value_free(res);
    *result = tp_value_nil();
    return TP_OK;
}

static int flush_late_program(int rank, int world_size, void *arg) {
    (void)arg;
    char name[4] = "w0";
    name[1] = (char)('0' + rank);
    CHECK(tp_register_function("slow", slow_fn, NULL) == TP_OK);
    CHECK(tp_register_function("poke", poke_fn, NULL) == TP_OK);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_shutdown_timeout(o, 10.0) == TP_OK);
    if (rank == 0)
        CHECK(tp_options_set_max_inflight_bytes(o, 4096) == TP_OK);
    tp_status st = tp_init_rpc(name, "SIM", rank, world_size, o);
    tp_options_free(o);
    CHECK(st == TP_OK);
    if (st != TP_OK)
        return 1;
    if (rank == 0) {
        char big[4000];
        memset(big, 'x', sizeof big);
        tp_value *args = tp_value_list_of(2, tp_value_float(0.01), tp_value_bytes(big, sizeof big));
        tp_value *res = NULL;
        flush_big_ns = now_ns();
        CHECK(tp_rpc_sync(tp_to_rank(1), "slow", args, NULL, 0.01, &res) == TP_ETIMEDOUT);
        tp_value_free(args);
        tp_value_free(res);
        flush_sd_ns = now_ns();
    } else if (rank == 2) {
        tp_future *f = NULL;
        CHECK(tp_rpc_async(tp_to_rank(0), "poke", NULL, NULL, TP_TIMEOUT_INFINITE, &f) == TP_OK);
        tp_future_free(f); /* w2's drain waits for it */
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_shutdown_flush_pings_the_peers_it_counted(void **state) {
    (void)state;
    flush_big_ns = flush_sd_ns = flush_late_ns = 0;
    flush_late_status = TP_EINVAL;
    run_checked(3, 3, "latency 0 1 300 300 fixed\n", flush_late_program, NULL);
    assert_int_equal(flush_late_status, TP_ETIMEDOUT);
    assert_true(flush_late_ns > flush_sd_ns);
    /* w1 had not yet got the call that holds w0's window: the ping waited. */
    assert_true(flush_late_ns < flush_big_ns + (uint64_t)(FLUSH_LINK_S * 1e9));
}

/*
 * SHUTDOWN-5 step 1: the flush waits for every peer's ping before the round's
 * counts go out, not only the first one's. w0's calls to w1 and w2 time out
 * (1 ms) while their requests still travel (links 0 -> 1 20 ms, 0 -> 2
 * 300 ms): nobody counts them. Round 0 pings both peers; w2's ping, behind
 * its request on the slower link, comes back last. Only then may w0 publish
 * its round-0 value: after both requests reached their callees (each ran
 * its function), with no call of its own active (C = 0), so rounds 0 and 1
 * are quiet and the drain ends after round 1. A flush that waited for its
 * first ping alone (w1's) would publish while w2's request was still on the
 * wire, counted by nobody but for the unanswered ping in C, and the drain
 * would need a third round. (A ping that times out leaves its peer to flush
 * again whoever waits for it: its deadline marks it, tpi_deadlines_run. What
 * the wait adds is the order: the answers, then the round's counts.)
 */
static uint64_t landed_ns[WATCH_RANKS]; /* when the timed-out request ran, by host */
static uint64_t flush_all_sd_ns;        /* when w0 began its shutdown */

/* landed(): notes when it ran, and where. */
static tp_status landed_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    int host = tp_sim_current_host();
    if (host >= 0 && host < WATCH_RANKS)
        landed_ns[host] = now_ns();
    *result = tp_value_nil();
    return TP_OK;
}

static int flush_all_program(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_register_function("landed", landed_fn, NULL) == TP_OK);
    if (start(rank, world_size, 10.0) != TP_OK)
        return 1;
    if (rank == 0) {
        for (int r = 1; r < world_size; r++) {
            tp_value *res = NULL;
            CHECK(tp_rpc_sync(tp_to_rank(r), "landed", NULL, NULL, 0.001, &res) == TP_ETIMEDOUT);
            tp_value_free(res);
        }
        flush_all_sd_ns = now_ns();
        char before[TP_ERRMSG_LEN_MAX];
        snprintf(before, sizeof before, "%s", tp_errmsg());
        CHECK(tp_shutdown(1) == TP_OK);
        CHECK(strcmp(tp_errmsg(), before) == 0); /* ERR-2: a success leaves the message */
        return 0;
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_shutdown_flush_waits_for_every_ping(void **state) {
    (void)state;
    watch_reset();
    memset(landed_ns, 0, sizeof landed_ns);
    flush_all_sd_ns = 0;
    int codes[3] = {-9, -9, -9};
    run_watched_on(3, 25, "latency 0 1 20 20 fixed\nlatency 0 2 300 300 fixed\n", flush_all_program,
                   codes);
    for (unsigned k = 0; k < watch.rounds; k++)
        print_message("round %u: w0 '%s' at %.3f ms, w1 '%s', w2 '%s'\n", k, watch.val[k][0],
                      (double)watch.val_ns[k][0] / 1e6, watch.val[k][1], watch.val[k][2]);
    print_message("shutdown at %.3f ms; landed on w1 at %.3f ms, on w2 at %.3f ms\n",
                  (double)flush_all_sd_ns / 1e6, (double)landed_ns[1] / 1e6,
                  (double)landed_ns[2] / 1e6);
    for (int r = 0; r < 3; r++)
        assert_int_equal(codes[r], 0);
    /* The setting: both requests were still on the wire when the shutdown began. */
    assert_true(landed_ns[1] > flush_all_sd_ns);
    assert_true(landed_ns[2] > flush_all_sd_ns);
    /* The check: w0's round-0 value went out after both had landed, with
     * both pings answered, and the drain needed no third round. */
    assert_true(watch.val_ns[0][0] > landed_ns[1]);
    assert_true(watch.val_ns[0][0] > landed_ns[2]);
    unsigned long long client = 1, served = 1, issued = 0;
    assert_int_equal(sscanf(watch.val[0][0], "%llu %llu %llu", &client, &served, &issued), 3);
    assert_int_equal(client, 0);
    assert_int_equal(watch.rounds, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_shutdown_drain_with_every_peer_dead, reset_failures),
        cmocka_unit_test_setup(test_shutdown_zero_timeout_is_no_deadline, reset_failures),
        cmocka_unit_test_setup(test_shutdown_second_init_is_the_next_generation, reset_failures),
        cmocka_unit_test_setup(test_shutdown_drain_pause_cut_at_the_deadline, reset_failures),
        cmocka_unit_test_setup(test_shutdown_call_refused_while_stopping_leaves_nothing_inside,
                               reset_failures),
        cmocka_unit_test_setup(test_shutdown_dead_child_drops_kept_reference, reset_failures),
        cmocka_unit_test_setup(test_shutdown_each_phase_has_the_timeout, reset_failures),
        cmocka_unit_test_setup(test_shutdown_barrier_times_out, reset_failures),
        cmocka_unit_test_setup(test_shutdown_release_phase_deletes_held_rref, reset_failures),
        cmocka_unit_test_setup(test_shutdown_gives_cached_frames_back, reset_failures),
        cmocka_unit_test_setup(test_shutdown_drain_sees_requests_in_flight, reset_failures),
        cmocka_unit_test_setup(test_shutdown_drain_times_out_on_time, reset_failures),
        cmocka_unit_test_setup(test_shutdown_nongraceful_answers_queued_remote, reset_failures),
        cmocka_unit_test_setup(test_shutdown_drain_deadline_with_own_call_active, reset_failures),
        cmocka_unit_test_setup(test_shutdown_call_between_rounds_forces_another_round,
                               reset_failures),
        cmocka_unit_test_setup(test_shutdown_call_between_rounds_forces_another_round_by_the_keys,
                               reset_failures),
        cmocka_unit_test_setup(test_shutdown_rank0_exits_while_rank1_behind, reset_failures),
        cmocka_unit_test_setup(test_shutdown_barrier_count_lost_for_good, reset_failures),
        cmocka_unit_test_setup(test_shutdown_barrier_count_marked_not_a_number, reset_failures),
        cmocka_unit_test_setup(test_shutdown_barrier_without_memory, reset_failures),
        cmocka_unit_test_setup(test_shutdown_dead_peer_on_a_store_without_scan, reset_failures),
        cmocka_unit_test_setup(test_shutdown_drain_reads_the_keys_when_sums_are_lost,
                               reset_failures),
        cmocka_unit_test_setup(test_shutdown_barrier_reads_the_count_while_waiting, reset_failures),
        cmocka_unit_test_setup(test_shutdown_round_behind_stops_at_done, reset_failures),
        cmocka_unit_test_setup(test_shutdown_barrier_death_outlives_a_clean_drain, reset_failures),
        cmocka_unit_test_setup(test_shutdown_drain_flush_without_memory, reset_failures),
        cmocka_unit_test_setup(test_shutdown_flush_pings_the_peers_it_counted, reset_failures),
        cmocka_unit_test_setup(test_shutdown_flush_waits_for_every_ping, reset_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
