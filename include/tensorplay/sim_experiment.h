/*
 * tensorplay/sim_experiment.h: your own fault-injection experiment on the
 * simulator, with the swarm's worlds, phases, checks, command line and
 * summary (spec/sim.md SIM-15).
 *
 * You write the chaos phase: what each worker does while the seed's faults
 * happen (calls, remotes, your own checks of the answers). The driver does
 * the rest, for every seed of `--seeds A..B`: it draws a world (2 to 16
 * workers, pool, window, default timeout, a fault plan of kills,
 * partitions, pauses, loss, failed sends, latency, store outages...), inits
 * every worker on the simulator, runs your chaos on each, heals the faults,
 * checks liveness (every two live workers can call each other), shuts
 * every worker down gracefully (TP_OK, or TP_EPEERDOWN when one died) and
 * holds the whole run against the oracle (SIM-9: each call ends once, no
 * timeout early or late, no function run twice, no early rref free, no
 * busy loop, no leak). A failing seed prints its world, its plan and the
 * command that replays it; the summary counts how often each fault fired.
 *
 * Link with -ltensorplay_sim_experiment -ltensorplay_rpc (pkg-config
 * tensorplay-rpc-sim). Example: examples/sim_experiment.c.
 */
#ifndef TENSORPLAY_SIM_EXPERIMENT_H
#define TENSORPLAY_SIM_EXPERIMENT_H

#include <stdint.h>

#include "tensorplay/rpc.h"
#include "tensorplay/sim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One world while it runs; valid inside setup and chaos. */
typedef struct tp_sim_experiment tp_sim_experiment;

typedef struct tp_sim_experiment_def {
    const char *name; /* in messages; NULL: argv[0] */
    /* Before the world runs, outside it (reset your per-world state). NULL: nothing. */
    void (*begin)(tp_sim_experiment *x, int world_size, void *arg);
    /*
     * On every worker before its init (register your functions and
     * methods here: the registry is per worker). NULL: nothing. A failure
     * fails the world.
     */
    tp_status (*setup)(tp_sim_experiment *x, int rank, int world_size, void *arg);
    /*
     * The chaos phase, on every worker whose init succeeded, while the
     * faults happen. Issue calls with finite timeouts (or TP_TIMEOUT_DEFAULT),
     * check what comes back with tp_sim_experiment_fail, and return; stop
     * issuing at tp_sim_experiment_heal_ns. Under faults a call may time
     * out or find its peer down or unreachable: that is not a failure, a
     * wrong TP_OK answer is. Calls still in flight when it returns go on;
     * free every future and release every rref you made, or the run's leak
     * check fails the world.
     */
    void (*chaos)(tp_sim_experiment *x, int rank, int world_size, void *arg);
    /*
     * After the world ran and every worker shut down, outside it: check
     * what must hold at the end (tp_sim_experiment_fail). NULL: nothing.
     */
    void (*end)(tp_sim_experiment *x, int world_size, void *arg);
    void *arg;
} tp_sim_experiment_def;

/* A failed check (printf-style): the world fails; the first is reported. */
void tp_sim_experiment_fail(tp_sim_experiment *x, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Virtual time (ns) by which every fault window has ended. */
uint64_t tp_sim_experiment_heal_ns(const tp_sim_experiment *x);
/* The world's seed (its workload stream is tp_sim_random). */
uint64_t tp_sim_experiment_seed(const tp_sim_experiment *x);

/*
 * The command line of tpsim swarm for def:
 *   PROG --seeds A..B [--jobs N] [--workers N] [--verbose] [--trace FILE]
 *        [--plan FILE] [--shrink] [--bytes FILE] [--save-bytes FILE]
 * Returns the exit status: 0 when every seed passed, 1 when one failed, 2
 * on a usage error. Registers the built-in backends itself.
 */
int tp_sim_experiment_main(const tp_sim_experiment_def *def, int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif /* TENSORPLAY_SIM_EXPERIMENT_H */
