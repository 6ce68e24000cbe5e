/*
 * sim_experiment.c: a fault-injection experiment of your own, run on the
 * simulator with the swarm's worlds, faults, phases and checks
 * (include/tensorplay/sim_experiment.h, spec/sim.md SIM-15).
 *
 * The experiment: every worker increments a counter that lives on rank 0,
 * over and over, while the world's faults happen. A call that comes back
 * TP_OK ran exactly once; one that timed out or lost its peer may or may
 * not have run. So at the end the counter must lie between the increments
 * that succeeded and those that were tried. The driver adds the rest:
 * liveness after the heal, graceful shutdown, the oracle, leak checks.
 *
 *     sim_experiment --seeds 1..200            # every seed must pass
 *     sim_experiment --seeds 7 --verbose --trace seed.json
 *     COUNTER_BUG=1 sim_experiment --seeds 1..20   # a counter that counts
 *                                                  # twice: caught, exit 1
 *
 * Build outside the tree against an installed library:
 *     cc sim_experiment.c $(pkg-config --static --cflags --libs tensorplay-rpc-sim)
 * (tests/scripts/sim_experiment_external.sh does that in make test).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorplay/rpc.h"
#include "tensorplay/sim.h"
#include "tensorplay/sim_experiment.h"

#define WORKERS_MAX 16
#define INCREMENTS 20

typedef struct counter_world {
    int64_t value;                  /* the counter on rank 0 */
    uint64_t tried[WORKERS_MAX];    /* increments each worker sent */
    uint64_t succeeded[WORKERS_MAX]; /* and those that came back TP_OK */
    int bug;                        /* COUNTER_BUG: count every increment twice */
} counter_world;

static counter_world state;

/* incr() -> the counter after this increment (served on rank 0). */
static tp_status fn_incr(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs;
    counter_world *w = ud;
    w->value += w->bug ? 2 : 1;
    *result = tp_value_int(w->value);
    return *result ? TP_OK : TP_ENOMEM;
}

static void begin(tp_sim_experiment *x, int world_size, void *arg) {
    (void)x, (void)world_size;
    counter_world *w = arg;
    int bug = w->bug;
    memset(w, 0, sizeof *w);
    w->bug = bug;
}

static tp_status setup(tp_sim_experiment *x, int rank, int world_size, void *arg) {
    (void)x, (void)rank, (void)world_size;
    return tp_register_function("incr", fn_incr, arg);
}

static void chaos(tp_sim_experiment *x, int rank, int world_size, void *arg) {
    (void)world_size;
    counter_world *w = arg;
    for (int i = 0; i < INCREMENTS; i++) {
        if (tp_sim_now_ns(tp_sim_current()) >= tp_sim_experiment_heal_ns(x))
            break;
        (void)tp_sleep((double)(tp_sim_random() % 50000) / 1e6); /* up to 50 ms apart */
        tp_value *res = NULL;
        w->tried[rank]++;
        tp_status st = tp_rpc_sync(tp_to_rank(0), "incr", NULL, NULL, 0.2, &res);
        int64_t after = 0;
        if (st == TP_OK) {
            w->succeeded[rank]++;
            if (tp_value_get_int(res, &after) != TP_OK || after < 1)
                tp_sim_experiment_fail(x, "w%d: incr answered TP_OK without a count", rank);
        } else if (st != TP_ETIMEDOUT && st != TP_EPEERDOWN && st != TP_EIO &&
                   st != TP_ESHUTDOWN) {
            tp_sim_experiment_fail(x, "w%d: incr ended %s: %s", rank, tp_status_name(st),
                                   tp_errmsg());
        }
        tp_value_free(res);
    }
}

static void end(tp_sim_experiment *x, int world_size, void *arg) {
    counter_world *w = arg;
    uint64_t tried = 0, succeeded = 0;
    for (int r = 0; r < world_size && r < WORKERS_MAX; r++) {
        tried += w->tried[r];
        succeeded += w->succeeded[r];
    }
    if (w->value < 0 || (uint64_t)w->value < succeeded || (uint64_t)w->value > tried)
        tp_sim_experiment_fail(x,
                               "the counter is %" PRId64 " after %" PRIu64 " increments tried "
                               "and %" PRIu64 " that succeeded",
                               w->value, tried, succeeded);
}

int main(int argc, char **argv) {
    state.bug = getenv("COUNTER_BUG") != NULL;
    tp_sim_experiment_def def = {.name = "sim_experiment",
                                 .begin = begin,
                                 .setup = setup,
                                 .chaos = chaos,
                                 .end = end,
                                 .arg = &state};
    return tp_sim_experiment_main(&def, argc, argv);
}
