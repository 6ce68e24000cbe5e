/*
 * sim_world.h: a small simulated world for unit tests of the public API.
 * Every worker registers the test's functions (world_register, which the
 * including test defines), initialises "w<rank>" on the SIM backend, runs
 * the world's scenario (rank 0) or others (the rest), and shuts down
 * gracefully, finding no rref leak. Checks inside use CHECK (sim_check.h); run_world asserts
 * after the run. Include once per test, after <cmocka.h>.
 */
#ifndef TP_TESTS_SIM_WORLD_H
#define TP_TESTS_SIM_WORLD_H

#include <stdio.h>
#include <stdlib.h>

#include "sim_check.h"
#include "tensorplay/rpc.h"
#include "tensorplay/sim.h"

typedef struct world {
    void (*scenario)(struct world *w); /* run by rank 0 between init and shutdown */
    void (*others)(struct world *w);   /* run by the other ranks, may be NULL */
    int threads;                       /* num_worker_threads; 0 for the default */
    int set_rpc_timeout;               /* 1: use rpc_timeout below (0 means none) */
    double rpc_timeout;
    const char *backend;               /* NULL: "SIM" (a test's wrapper of it otherwise) */
    uint64_t max_inflight_bytes;       /* 0: the default */
    uint64_t max_queued_bytes;         /* 0: the default */
    double shutdown_timeout;           /* 0: 600 s */
    void *data;
} world;

/* Registers the test's functions on the calling worker (defined by the test). */
static void world_register(void);

/* add(a, b): the sum of two ints, wrapping (any peer may send any ints);
 * TP_EINVAL for other args. Tests register it as "add". */
static inline tp_status world_fn_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                     tp_value **result, void *user_data) {
    (void)call, (void)kwargs, (void)user_data;
    int64_t a = 0, b = 0;
    if (tp_value_get_int(tp_list_get(args, 0), &a) != TP_OK ||
        tp_value_get_int(tp_list_get(args, 1), &b) != TP_OK)
        return TP_EINVAL;
    *result = tp_value_int((int64_t)((uint64_t)a + (uint64_t)b));
    return *result ? TP_OK : TP_ENOMEM;
}

static inline int world_worker_start(int rank, int world_size, const world *w) {
    char name[16];
    snprintf(name, sizeof name, "w%d", rank);
    world_register();
    tp_options *o = tp_options_new();
    CHECK(o != NULL);
    if (!o)
        return -1;
    /* Scenarios run for many virtual seconds; barriers must wait for them. */
    CHECK(tp_options_set_shutdown_timeout(o, w->shutdown_timeout > 0 ? w->shutdown_timeout
                                                                     : 600.0) == TP_OK);
    CHECK(tp_options_set_init_timeout(o, 600.0) == TP_OK);
    if (w->threads)
        CHECK(tp_options_set_num_worker_threads(o, w->threads) == TP_OK);
    if (w->set_rpc_timeout)
        CHECK(tp_options_set_rpc_timeout(o, w->rpc_timeout) == TP_OK);
    if (w->max_inflight_bytes)
        CHECK(tp_options_set_max_inflight_bytes(o, w->max_inflight_bytes) == TP_OK);
    if (w->max_queued_bytes)
        CHECK(tp_options_set_max_queued_bytes(o, w->max_queued_bytes) == TP_OK);
    tp_status st = tp_init_rpc(name, w->backend ? w->backend : "SIM", rank, world_size, o);
    tp_options_free(o);
    CHECK(st == TP_OK);
    if (st != TP_OK) {
        print_error("init of %s: %s\n", name, tp_errmsg());
        return -1;
    }
    return 0;
}

static inline int world_program(int rank, int world_size, void *arg) {
    world *w = arg;
    if (world_worker_start(rank, world_size, w) != 0)
        return 1;
    if (rank == 0)
        w->scenario(w);
    else if (w->others)
        w->others(w);
    tp_status st = tp_shutdown(1);
    CHECK(st == TP_OK);
    if (st != TP_OK)
        print_error("shutdown of w%d: %s\n", rank, tp_errmsg());
    /* Every scenario releases what it made: its shutdown finds no rref
     * leak (RREF-18; each is logged at warn). */
    tp_rref_leak *leaks = NULL;
    size_t n = 0;
    CHECK(tp_shutdown_leaks(&leaks, &n) == TP_OK && n == 0);
    free(leaks);
    return st == TP_OK ? 0 : 1;
}

/* Runs a world of 1 or 2 hosts; reply_delay_s > 0 delays every frame from
 * host 1 to host 0 (a simulator fault). */
static inline void run_world_delayed(uint32_t hosts, uint64_t seed, world *w,
                                     double reply_delay_s) {
    tp_sim_config cfg = {.hosts = hosts, .seed = seed};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    if (reply_delay_s > 0)
        assert_int_equal(
            tp_sim_fault_delay(sim, 1, 0, 0, 3600 * SEC, (uint64_t)(reply_delay_s * 1e9)), TP_OK);
    int codes[2] = {-9, -9};
    assert_true(hosts <= 2);
    assert_int_equal(tp_sim_run(sim, world_program, w, codes), TP_OK);
    for (uint32_t i = 0; i < hosts; i++)
        assert_int_equal(codes[i], 0);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
}

static inline void run_world(uint32_t hosts, uint64_t seed, world *w) {
    run_world_delayed(hosts, seed, w, 0);
}

#endif
