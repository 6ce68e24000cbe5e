/*
 * sim_bench.c: how fast the simulator runs (make bench; spec/sim.md SIM-10).
 *
 * Prints "BENCH <name> <value> <unit>" lines, each measured in CPU time of
 * this process (CLOCK_PROCESS_CPUTIME_ID), so a shared, noisy machine skews
 * them less than wall time would. The trace hash is on in every run (it
 * always is); no text trace is written. A program, never a test.
 *
 *   sim_bench [--quick] [--only sync|async|small|w64|big|sweep] [--workers N [--reps R]]
 *
 * --workers N runs one world of N workers (init, one call each, graceful
 * shutdown) and nothing else: the unit to profile or to count instructions.
 * --reps R runs it R times (seeds 1..R) and prints the fastest, the figure
 * the sweep quotes (later worlds reuse what the first one set up).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

#include "tensorplay/rpc.h"
#include "tensorplay/sim.h"

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static tp_status fn_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *ud) {
    (void)call, (void)kwargs, (void)ud;
    int64_t a = 0, b = 0;
    tp_value_get_int(tp_list_get(args, 0), &a);
    tp_value_get_int(tp_list_get(args, 1), &b);
    /* Wraps: any peer may send any ints. */
    *result = tp_value_int((int64_t)((uint64_t)a + (uint64_t)b));
    return *result ? TP_OK : TP_ENOMEM;
}

typedef struct job {
    int calls;    /* per calling worker */
    int async;    /* issue in batches of `batch` futures, else rpc_sync */
    int batch;
    int callers;  /* ranks below this call; the rest only serve */
    int failures; /* counted by the programs */
} job;

static int start(int rank, int world) {
    char name[16];
    snprintf(name, sizeof name, "w%d", rank);
    if (tp_register_function("add", fn_add, NULL) != TP_OK)
        return 1;
    tp_options *o = tp_options_new();
    tp_options_set_init_timeout(o, 600);
    tp_options_set_shutdown_timeout(o, 600);
    tp_status st = tp_init_rpc(name, "SIM", rank, world, o);
    tp_options_free(o);
    return st == TP_OK ? 0 : 1;
}

static int program(int rank, int world, void *arg) {
    job *j = arg;
    if (start(rank, world) != 0) {
        j->failures++;
        return 1;
    }
    tp_value *args = tp_value_list_of(2, tp_value_int(3), tp_value_int(4));
    if (rank < j->callers && world > 1) {
        tp_future **fs = calloc((size_t)j->batch, sizeof *fs);
        for (int i = 0; i < j->calls;) {
            int dst = (int)(tp_sim_random() % (uint64_t)(world - 1));
            dst = dst >= rank ? dst + 1 : dst;
            if (!j->async) {
                tp_value *res = NULL;
                if (tp_rpc_sync(tp_to_rank(dst), "add", args, NULL, 0, &res) != TP_OK)
                    j->failures++;
                tp_value_free(res);
                i++;
                continue;
            }
            int n = 0;
            for (; n < j->batch && i < j->calls; n++, i++)
                if (tp_rpc_async(tp_to_rank(dst), "add", args, NULL, 0, &fs[n]) != TP_OK)
                    j->failures++;
            if (tp_future_wait_all(fs, (size_t)n, 0, NULL) != TP_OK)
                j->failures++;
            for (int k = 0; k < n; k++)
                tp_future_free(fs[k]);
        }
        free(fs);
    }
    tp_value_free(args);
    if (tp_shutdown(1) != TP_OK)
        j->failures++;
    return 0;
}

/* Runs one world; returns the CPU seconds it took, or -1 on failure. */
static double run(uint32_t hosts, uint64_t seed, job *j) {
    tp_sim_config cfg = {.hosts = hosts, .seed = seed};
    tp_sim *sim = NULL;
    if (tp_sim_new(&cfg, &sim) != TP_OK)
        return -1;
    double t0 = cpu_seconds();
    tp_status st = tp_sim_run(sim, program, j, NULL);
    double t = cpu_seconds() - t0;
    int bad = st != TP_OK || j->failures || tp_sim_violations(sim);
    if (bad)
        fprintf(stderr, "sim_bench: %u hosts, seed %llu: %s, %d failures, %llu violations %s\n",
                hosts, (unsigned long long)seed, tp_status_name(st), j->failures,
                (unsigned long long)tp_sim_violations(sim), tp_sim_violation(sim));
    tp_sim_free(sim);
    return bad ? -1 : t;
}

/* Whether the section `name` runs: all of them unless --only picked one. */
static int want(const char *only, const char *name) {
    return !only || strcmp(only, name) == 0;
}

/* The CPU seconds of one large world (init, one call each, graceful
 * shutdown), the minimum of `reps` seeds: the minimum is the figure least
 * moved by other work on a shared machine. -1 on failure. */
static double world_s(uint32_t workers, int reps) {
    double best = -1;
    for (int s = 1; s <= reps; s++) {
        job w = {.calls = 1, .callers = (int)workers};
        double t = run(workers, (uint64_t)s, &w);
        if (t < 0)
            return -1;
        best = best < 0 || t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv) {
    int quick = 0;
    const char *only = NULL; /* sync, async, small, w64, big, sweep */
    long workers = 0;        /* --workers: one world of this size only */
    long reps = 1;           /* --reps: that many worlds, the fastest quoted */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else if (strcmp(argv[i], "--workers") == 0 && i + 1 < argc) {
            workers = strtol(argv[++i], NULL, 10);
            if (workers < 1 || workers > 100000) {
                fprintf(stderr, "sim_bench: --workers takes 1..100000\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = strtol(argv[++i], NULL, 10);
            if (reps < 1 || reps > 1000) {
                fprintf(stderr, "sim_bench: --reps takes 1..1000\n");
                return 2;
            }
        } else {
            fprintf(stderr, "usage: sim_bench [--quick] [--only sync|async|small|w64|big|sweep]"
                            " [--workers N [--reps R]]\n");
            return 2;
        }
    }
    tp_register_builtin_backends();
    if (workers) {
        double tw = world_s((uint32_t)workers, (int)reps);
        if (tw < 0)
            return 1;
        printf("BENCH sim_seed_%ld_workers_cpu_ms %.1f ms\n", workers, tw * 1e3);
        return 0;
    }
    int rc = 0;
    double t;

    /* Round trips: one caller, one callee, nothing else. */
    int n = quick ? 5000 : 50000;
    if (want(only, "sync")) {
        job sync_job = {.calls = n, .callers = 1};
        t = run(2, 1, &sync_job);
        if (t > 0)
            printf("BENCH sim_rpc_sync_round_trips_per_cpu_s %.0f calls/s\n", n / t);
        else
            rc = 1;
    }
    if (want(only, "async")) {
        job async_job = {.calls = n, .async = 1, .batch = 1000, .callers = 1};
        t = run(2, 1, &async_job);
        if (t > 0)
            printf("BENCH sim_rpc_async_round_trips_per_cpu_s %.0f calls/s\n", n / t);
        else
            rc = 1;
    }

    /* Small seeds: 4 workers, each calls the others 8 times (a few dozen calls). */
    if (want(only, "small")) {
        int seeds = quick ? 200 : 2000;
        double total = 0;
        for (int s = 1; s <= seeds; s++) {
            job small = {.calls = 8, .callers = 4};
            double ts = run(4, (uint64_t)s, &small);
            if (ts < 0) {
                rc = 1;
                break;
            }
            total += ts;
        }
        if (total > 0)
            printf("BENCH sim_small_seeds_per_cpu_min %.0f seeds/min\n", seeds / total * 60.0);
    }

    /* Large worlds: init, one call each, graceful shutdown. */
    /* The mean over 10 seeds: one seed's CPU time is too noisy to quote. */
    if (want(only, "w64")) {
        double t64 = 0;
        for (int s = 1; s <= 10 && t64 >= 0; s++) {
            job w64 = {.calls = 1, .callers = 64};
            t = run(64, (uint64_t)s, &w64);
            t64 = t > 0 ? t64 + t : -1;
        }
        if (t64 > 0)
            printf("BENCH sim_seed_64_workers_cpu_ms %.1f ms\n", t64 / 10 * 1e3);
        else
            rc = 1;
    }
    if (want(only, "big")) {
        uint32_t big = quick ? 200 : 1000;
        job wbig = {.calls = 1, .callers = (int)big};
        t = run(big, 1, &wbig);
        if (t > 0)
            printf("BENCH sim_seed_%u_workers_cpu_s %.2f s\n", big, t);
        else
            rc = 1;
    }

    /* Scaling in workers: the same world at 125, 250, 500 and 1,000 workers
     * (to 500 with --quick). Linear cost keeps the CPU time per worker flat
     * and the exponent (log of the time ratio over log of the size ratio,
     * smallest to largest) near 1; quadratic polling would make it 2. */
    if (want(only, "sweep")) {
        static const uint32_t sizes[] = {125, 250, 500, 1000};
        int count = quick ? 3 : 4;
        double ts[4] = {0};
        for (int i = 0; i < count; i++) {
            ts[i] = world_s(sizes[i], 3);
            if (ts[i] < 0) {
                rc = 1;
                break;
            }
            printf("BENCH sim_seed_%u_workers_cpu_ms %.1f ms\n", sizes[i], ts[i] * 1e3);
            printf("BENCH sim_seed_%u_workers_cpu_us_per_worker %.1f us\n", sizes[i],
                   ts[i] / sizes[i] * 1e6);
        }
        for (int i = 1; i < count && ts[i] > 0; i++)
            printf("BENCH ratio_sim_seed_%u_vs_%u_workers %.2f x\n", sizes[i], sizes[i - 1],
                   ts[i] / ts[i - 1]);
        if (ts[count - 1] > 0 && ts[0] > 0)
            printf("BENCH sim_worker_scaling_exponent_%u_to_%u %.2f power\n", sizes[0],
                   sizes[count - 1],
                   log(ts[count - 1] / ts[0]) / log((double)sizes[count - 1] / sizes[0]));
    }
    return rc;
}
