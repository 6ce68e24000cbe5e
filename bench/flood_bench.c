/*
 * flood_bench: issue 21 item 5's figure. "After a member's flood, legitimate
 * calls keep their latency within 2x of baseline."
 *
 * Forks a 3-rank TENSORPIPE job on 127.0.0.1 (rank 0 serves the store at
 * tcp://127.0.0.1:<free port>; the job secret in TP_SECRET). Rank 0 is the
 * callee (num_worker_threads 4), rank 2 the legitimate caller, timing
 * rpc_sync add(1, 2) round trips, rank 1 the flooder, issuing rpc_async
 * echo(bytes[16 KiB]) as fast as its window lets it (FLOW-1). The phases,
 * coordinated through MAP_SHARED memory:
 *
 *   1. baseline: rank 2 times N sync calls, nobody else calling;
 *   2. flood:    rank 1 floods for S seconds of wall time; rank 2 keeps
 *                timing (every call that started before rank 1 stopped
 *                issuing belongs here);
 *   3. after:    rank 1 stops issuing and waits for its calls to end; rank 2
 *                times the calls starting right when rank 1 stopped: the
 *                first N give the after figures; it goes on until rank 1's
 *                calls all ended and the median of a sliding window of 100
 *                calls stayed within 2x of the baseline median for 500
 *                windows in a row (or a deadline passes). Recovery is the
 *                start of the first window from which on every window was
 *                within 2x.
 *
 * Prints "BENCH <name> <value> <unit>" lines (bench/README.md). A program,
 * not a test: it exits non-zero only when the job fails to run, never for a
 * missed target; a legitimate call that fails is a figure
 * (flood_legit_failures), and the first such error goes to stderr.
 *
 *   flood_bench [--quick] [--seconds S] [--samples N] [-v]
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

#define WORLD 3
#define CALLEE 0
#define FLOODER 1
#define LEGIT 2
#define CALLEE_THREADS 4
#define FLOOD_BYTES (16 * 1024)
/* More futures than the window can hold (256 MiB / ~16 KiB is about 16,000
 * calls), so the flooder is held back by the library's window, not by us. */
#define FLOOD_RING 65536
#define RECOVERY_WINDOW 100
#define RECOVERY_FACTOR 2.0
/* Windows in a row within the bound before the after phase may end. */
#define STABLE_WINDOWS 500
#define WARMUP_CALLS 200
#define CALL_TIMEOUT_S 30.0
/* Bounds of each wait (seconds). */
#define PHASE_WAIT_S 120.0
#define AFTER_MAX_S 30.0
#define DRAIN_MAX_S 60.0
#define JOB_MAX_S 600.0
/* Samples kept per phase: more than a call every 10 us for the longest phase. */
#define DURING_CAP 1000000
#define AFTER_CAP 1000000

typedef struct flood_shared {
    atomic_int flooder_ready;  /* rank 1 initialised and made one warm-up call */
    atomic_int baseline_done;  /* rank 2 finished phase 1: the flood may start */
    atomic_int flood_started;  /* flood_start_ns is set */
    atomic_int flood_stopped;  /* flood_stop_ns is set: rank 1 issues no more */
    atomic_int flood_drained;  /* rank 1's calls all ended (or its deadline passed) */
    atomic_int done[WORLD];    /* rank r has nothing more to call */
    uint64_t flood_start_ns, flood_stop_ns, flood_drained_ns;
    /* rank 1's tallies */
    int64_t flood_issued, flood_ok, flood_limit, flood_failed, flood_issue_failed,
        flood_unfinished;
    char flood_first_error[256];
    /* rank 2's figures */
    int filled;
    double base_median_us, base_p99_us;
    double during_median_us, during_p99_us;
    double after_median_us, after_p99_us;
    double recovery_ms; /* -1: not back within 2x (to stay) before the deadline */
    int64_t during_calls, after_calls, legit_failures;
    double after_span_ms;
    char legit_first_error[256];
} flood_shared;

typedef struct flood_config {
    double flood_s;
    int samples;
} flood_config;

static flood_shared *sh;

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits until *flag is non-zero, at most timeout_s; 0 when it was set. */
static int await_flag(atomic_int *flag, double timeout_s) {
    uint64_t deadline = bench_now_ns() + (uint64_t)(timeout_s * 1e9);
    while (!atomic_load(flag)) {
        if (bench_now_ns() >= deadline)
            return -1;
        sleep_ms(1);
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Functions, registered in every rank.                                   */

static tp_status fn_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *user_data) {
    (void)kwargs;
    (void)user_data;
    int64_t a, b;
    if (tp_list_len(args) != 2 || tp_value_get_int(tp_list_get(args, 0), &a) != TP_OK ||
        tp_value_get_int(tp_list_get(args, 1), &b) != TP_OK) {
        tp_call_set_error(call, "add takes two ints");
        return TP_EINVAL;
    }
    *result = tp_value_int((int64_t)((uint64_t)a + (uint64_t)b));
    return *result ? TP_OK : TP_ENOMEM;
}

/* ---------------------------------------------------------------------- */
/* Rank 2: the legitimate caller.                                         */

typedef struct legit_state {
    tp_value *args;
    int64_t failures;
} legit_state;

/* One rpc_sync add(1, 2); its latency in us into *us. 0 on success; a
 * failure is counted and the first one kept. */
static int legit_call(legit_state *ls, uint64_t *start_ns, double *us) {
    tp_value *res = NULL;
    int64_t v = 0;
    uint64_t t0 = bench_now_ns();
    tp_status st = tp_rpc_sync(tp_to_rank(CALLEE), "add", ls->args, NULL, CALL_TIMEOUT_S, &res);
    uint64_t t1 = bench_now_ns();
    int bad = st != TP_OK || tp_value_get_int(res, &v) != TP_OK || v != 3;
    tp_value_free(res);
    *start_ns = t0;
    *us = (double)(t1 - t0) / 1e3;
    if (bad) {
        if (ls->failures++ == 0)
            snprintf(sh->legit_first_error, sizeof sh->legit_first_error, "%s: %s (after %.0f us)",
                     tp_status_name(st), st == TP_OK ? "wrong result" : tp_errmsg(), *us);
        if (bench_verbose)
            fprintf(stderr, "flood_bench: legit call failed: %s: %s\n", tp_status_name(st),
                    tp_errmsg());
    }
    return bad;
}

/* Median and p99 of v[0..n) (reordered), or 0 and 0 for no sample. */
static void median_p99(double *v, size_t n, double *median, double *p99) {
    *median = *p99 = 0;
    if (n == 0)
        return;
    *median = bench_median(v, n);
    *p99 = bench_percentile_sorted(v, n, 99);
}

/* The median (element n/2 in order) of v[0..n), sorted into w by insertion (n is small). */
static double window_median(const double *v, size_t n, double *w) {
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        for (; j > 0 && w[j - 1] > v[i]; j--)
            w[j] = w[j - 1];
        w[j] = v[i];
    }
    return w[n / 2];
}

static int legit_body(const flood_config *cfg) {
    legit_state ls = {tp_value_list_of(2, tp_value_int(1), tp_value_int(2)), 0};
    double *base = calloc((size_t)cfg->samples, sizeof(double));
    double *during = malloc(DURING_CAP * sizeof(double));
    double *after = malloc(AFTER_CAP * sizeof(double));
    uint64_t *after_start = malloc(AFTER_CAP * sizeof(uint64_t));
    double *tmp = malloc(AFTER_CAP * sizeof(double));
    BENCH_CHECK(ls.args && base && during && after && after_start && tmp);
    uint64_t t;
    double us;
    int rc = 1;

    if (await_flag(&sh->flooder_ready, PHASE_WAIT_S) != 0) {
        fprintf(stderr, "flood_bench: rank 2: the flooder never became ready\n");
        goto out;
    }
    /* 1. baseline */
    for (int i = 0; i < WARMUP_CALLS; i++)
        legit_call(&ls, &t, &us);
    int nb = 0;
    for (int i = 0; i < cfg->samples; i++) {
        if (legit_call(&ls, &t, &us) == 0)
            base[nb++] = us;
    }
    if (ls.failures > 0) {
        fprintf(stderr, "flood_bench: rank 2: %lld of the baseline calls failed, first: %s\n",
                (long long)ls.failures, sh->legit_first_error);
        goto out; /* no baseline: the job did not run */
    }
    median_p99(base, (size_t)nb, &sh->base_median_us, &sh->base_p99_us);
    atomic_store(&sh->baseline_done, 1);

    /* 2. during the flood: until rank 1 stops issuing */
    if (await_flag(&sh->flood_started, PHASE_WAIT_S) != 0) {
        fprintf(stderr, "flood_bench: rank 2: the flood never started\n");
        goto out;
    }
    size_t nd = 0, na = 0;
    int64_t during_failures = 0;
    uint64_t during_deadline = bench_now_ns() + (uint64_t)((cfg->flood_s + PHASE_WAIT_S) * 1e9);
    for (;;) {
        int stopped = atomic_load(&sh->flood_stopped);
        if (stopped || bench_now_ns() >= during_deadline)
            break;
        int64_t f0 = ls.failures;
        int bad = legit_call(&ls, &t, &us);
        during_failures += ls.failures - f0;
        if (atomic_load(&sh->flood_stopped) && t >= sh->flood_stop_ns) {
            /* started after the flood stopped: the after phase's first call */
            if (!bad && na < AFTER_CAP) {
                after_start[na] = t;
                after[na++] = us;
            }
            break;
        }
        if (!bad && nd < DURING_CAP)
            during[nd++] = us;
    }
    if (!atomic_load(&sh->flood_stopped)) {
        fprintf(stderr, "flood_bench: rank 2: the flood never stopped\n");
        goto out;
    }
    uint64_t stop_ns = sh->flood_stop_ns;

    /*
     * 3. after. Recovery is the start of the first window of 100 calls from
     * which on every window's median is within the bound: the window after
     * the last one above it. Measures at least `samples` calls, until the
     * flooder's calls all ended, and then until the last STABLE_WINDOWS
     * windows were within the bound (or the deadline).
     */
    uint64_t after_deadline = stop_ns + (uint64_t)(AFTER_MAX_S * 1e9);
    double bound = RECOVERY_FACTOR * sh->base_median_us;
    double w[RECOVERY_WINDOW];
    long last_bad = -1; /* the last window above the bound */
    size_t nwin = 0;    /* windows [0, nwin) judged */
    while (na < AFTER_CAP && bench_now_ns() < after_deadline) {
        if (legit_call(&ls, &t, &us) == 0) {
            after_start[na] = t;
            after[na++] = us;
        }
        for (; nwin + RECOVERY_WINDOW <= na; nwin++) {
            double m = window_median(after + nwin, RECOVERY_WINDOW, w);
            if (m > bound)
                last_bad = (long)nwin;
        }
        if ((int)na >= cfg->samples && atomic_load(&sh->flood_drained) &&
            (long)nwin - 1 - last_bad >= STABLE_WINDOWS)
            break;
    }
    /* -1 when even the last window is above the bound (or none completed). */
    sh->recovery_ms = nwin > 0 && last_bad + 1 < (long)nwin
                          ? (double)(after_start[last_bad + 1] - stop_ns) / 1e6
                          : -1.0;
    sh->after_span_ms = na > 0 ? (double)(after_start[na - 1] - stop_ns) / 1e6 : 0;
    if (bench_verbose) {
        /* The after phase over time: the median of each run of 100 calls. */
        fprintf(stderr, "flood_bench: after the flood, median of each 100 calls (ms since the "
                        "flooder stopped: us):");
        for (size_t i = 0; i + RECOVERY_WINDOW <= na && i < 60 * RECOVERY_WINDOW;
             i += RECOVERY_WINDOW) {
            memcpy(tmp, after + i, RECOVERY_WINDOW * sizeof(double));
            fprintf(stderr, "%s %.0f: %.0f", i % 1000 ? "" : "\n ",
                    (double)(after_start[i] - stop_ns) / 1e6, bench_median(tmp, RECOVERY_WINDOW));
        }
        fprintf(stderr, "\n");
    }
    median_p99(during, nd, &sh->during_median_us, &sh->during_p99_us);
    size_t nfirst = na < (size_t)cfg->samples ? na : (size_t)cfg->samples;
    memcpy(tmp, after, nfirst * sizeof(double));
    median_p99(tmp, nfirst, &sh->after_median_us, &sh->after_p99_us);
    sh->during_calls = (int64_t)nd;
    sh->after_calls = (int64_t)na;
    sh->legit_failures = ls.failures;
    if (bench_verbose)
        fprintf(stderr, "flood_bench: rank 2: %lld failures during the flood, %lld after\n",
                (long long)during_failures, (long long)(ls.failures - during_failures));
    sh->filled = 1;
    rc = 0;
out:
    tp_value_free(ls.args);
    free(base);
    free(during);
    free(after);
    free(after_start);
    free(tmp);
    return rc;
}

/* ---------------------------------------------------------------------- */
/* Rank 1: the flooder.                                                   */

/* Waits for f (at most timeout_s), tallies its outcome, frees it. */
static void flood_reap(tp_future *f, double timeout_s) {
    tp_status st = tp_future_wait(f, timeout_s);
    if (st == TP_OK) {
        sh->flood_ok++;
    } else {
        if (!tp_future_done(f))
            sh->flood_unfinished++;
        else if (st == TP_ELIMIT)
            sh->flood_limit++;
        else
            sh->flood_failed++;
        if (sh->flood_first_error[0] == '\0')
            snprintf(sh->flood_first_error, sizeof sh->flood_first_error, "%s: %s",
                     tp_status_name(st), tp_future_done(f) ? tp_future_error(f) : "still pending");
    }
    tp_future_free(f);
}

static int flooder_body(const flood_config *cfg) {
    uint8_t *payload = malloc(FLOOD_BYTES);
    tp_future **ring = calloc(FLOOD_RING, sizeof *ring);
    BENCH_CHECK(payload && ring);
    memset(payload, 0x5a, FLOOD_BYTES);
    tp_value *args = tp_value_list_of(1, tp_value_bytes(payload, FLOOD_BYTES));
    BENCH_CHECK(args != NULL && tp_list_get(args, 0) != NULL);
    int rc = 1;

    /* One call first, so the flood does not start with the dial. */
    tp_value *res = NULL;
    tp_status st = tp_rpc_sync(tp_to_rank(CALLEE), "echo", args, NULL, CALL_TIMEOUT_S, &res);
    tp_value_free(res);
    if (st != TP_OK) {
        fprintf(stderr, "flood_bench: rank 1: warm-up echo: %s: %s\n", tp_status_name(st),
                tp_errmsg());
        goto out;
    }
    atomic_store(&sh->flooder_ready, 1);
    if (await_flag(&sh->baseline_done, PHASE_WAIT_S) != 0) {
        fprintf(stderr, "flood_bench: rank 1: the baseline never ended\n");
        goto out;
    }

    /* 2. flood */
    uint64_t t0 = bench_now_ns();
    uint64_t end = t0 + (uint64_t)(cfg->flood_s * 1e9);
    sh->flood_start_ns = t0;
    atomic_store(&sh->flood_started, 1);
    int64_t i = 0;
    while (bench_now_ns() < end) {
        tp_future **slot = &ring[i % FLOOD_RING];
        if (*slot) {
            flood_reap(*slot, DRAIN_MAX_S);
            *slot = NULL;
        }
        st = tp_rpc_async(tp_to_rank(CALLEE), "echo", args, NULL, CALL_TIMEOUT_S, slot);
        if (st != TP_OK) {
            *slot = NULL;
            if (sh->flood_issue_failed++ == 0)
                snprintf(sh->flood_first_error, sizeof sh->flood_first_error,
                         "rpc_async: %s: %s", tp_status_name(st), tp_errmsg());
            continue;
        }
        i++;
    }
    sh->flood_stop_ns = bench_now_ns();
    sh->flood_issued = i;
    atomic_store(&sh->flood_stopped, 1);

    /* 3. wait for its calls to end, all within one deadline */
    uint64_t drain_deadline = sh->flood_stop_ns + (uint64_t)(DRAIN_MAX_S * 1e9);
    for (int64_t k = 0; k < FLOOD_RING; k++) {
        tp_future **slot = &ring[(i + k) % FLOOD_RING]; /* oldest first */
        if (!*slot)
            continue;
        double left = (double)(int64_t)(drain_deadline - bench_now_ns()) / 1e9;
        flood_reap(*slot, left > 0.001 ? left : 0.001);
        *slot = NULL;
    }
    sh->flood_drained_ns = bench_now_ns();
    atomic_store(&sh->flood_drained, 1);
    rc = 0;
out:
    tp_value_free(args);
    free(payload);
    free(ring);
    return rc;
}

/* ---------------------------------------------------------------------- */
/* The job.                                                               */

static int rank_body(const flood_config *cfg, int rank, uint16_t store_port) {
    tp_register_function("add", fn_add, NULL);
    bench_register_functions(); /* echo (and numel, nb_echo) */
    bench_worker_threads = rank == CALLEE ? CALLEE_THREADS : 0;
    tp_options *o = bench_worker_options(store_port);
    BENCH_CHECK(o != NULL);
    char name[32];
    snprintf(name, sizeof name, "worker%d", rank);
    tp_status st = tp_init_rpc(name, "TENSORPIPE", rank, WORLD, o);
    tp_options_free(o);
    if (st != TP_OK) {
        fprintf(stderr, "flood_bench: rank %d: init: %s: %s\n", rank, tp_status_name(st),
                tp_errmsg());
        atomic_store(&sh->done[rank], 1);
        return 1;
    }
    int rc = 0;
    if (rank == FLOODER)
        rc = flooder_body(cfg);
    else if (rank == LEGIT)
        rc = legit_body(cfg);
    atomic_store(&sh->done[rank], 1);
    /* Everybody shuts down together, once the callers are done. */
    for (int r = 0; r < WORLD; r++) {
        if (await_flag(&sh->done[r], JOB_MAX_S) != 0) {
            fprintf(stderr, "flood_bench: rank %d: rank %d never finished\n", rank, r);
            rc = 1;
        }
    }
    st = tp_shutdown(1);
    if (st != TP_OK) {
        fprintf(stderr, "flood_bench: rank %d: shutdown: %s: %s\n", rank, tp_status_name(st),
                tp_errmsg());
        rc = 1;
    }
    return rc;
}

static void usage(void) {
    fprintf(stderr, "usage: flood_bench [--quick] [--seconds S] [--samples N] [-v]\n"
                    "  --seconds S  how long rank 1 floods (default 3)\n"
                    "  --samples N  calls timed for the baseline and after the flood (default "
                    "2000)\n"
                    "  --quick      1 s of flood, 500 samples: a smoke run\n"
                    "  -v           details on stderr\n");
}

int main(int argc, char **argv) {
    flood_config cfg = {3.0, 2000};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            cfg.flood_s = 1.0;
            cfg.samples = 500;
        } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            cfg.flood_s = atof(argv[++i]);
        } else if (strcmp(argv[i], "--samples") == 0 && i + 1 < argc) {
            cfg.samples = atoi(argv[++i]);
        } else if (strcmp(argv[i], "-v") == 0) {
            bench_verbose = 1;
        } else {
            usage();
            return 2;
        }
    }
    if (cfg.flood_s <= 0 || cfg.flood_s > 60 || cfg.samples < RECOVERY_WINDOW ||
        cfg.samples > 1000000) {
        usage();
        return 2;
    }
    /* The job secret every forked worker inherits (spec/tcp.md TCP-17). */
    char secret[80];
    if (!getenv("TP_SECRET") &&
        (tp_job_secret_new(secret, sizeof secret) != TP_OK || setenv("TP_SECRET", secret, 1) != 0))
        return 1;
    uint16_t store_port = bench_free_port();
    sh = bench_shared_alloc(sizeof *sh);
    if (store_port == 0 || !sh) {
        perror("flood_bench: setup");
        return 1;
    }
    pid_t pids[WORLD] = {-1, -1, -1};
    for (int rank = 0; rank < WORLD; rank++) {
        fflush(NULL);
        pids[rank] = fork();
        if (pids[rank] < 0) {
            perror("flood_bench: fork");
            break;
        }
        if (pids[rank] == 0) {
            int code = rank_body(&cfg, rank, store_port);
            fflush(NULL);
            exit(code);
        }
    }
    int rc = bench_wait_children(pids, WORLD, JOB_MAX_S, "flood job");
    if (rc != 0 || !sh->filled) {
        fprintf(stderr, "flood_bench: the job failed to run\n");
        bench_shared_free(sh, sizeof *sh);
        return 1;
    }
    double base = sh->base_median_us;
    bench_print("flood_baseline_median_us", base, "us");
    if (bench_verbose)
        fprintf(stderr, "flood_bench: baseline p99 %.1f us\n", sh->base_p99_us);
    bench_print("flood_during_median_us", sh->during_median_us, "us");
    bench_print("flood_during_p99_us", sh->during_p99_us, "us");
    bench_print("flood_after_median_us", sh->after_median_us, "us");
    bench_print("flood_after_p99_us", sh->after_p99_us, "us");
    bench_print("flood_during_over_baseline", sh->during_median_us / base, "x");
    bench_print("flood_after_over_baseline", sh->after_median_us / base, "x");
    bench_print("flood_recovery_ms", sh->recovery_ms, "ms");
    bench_print("flood_legit_failures", (double)sh->legit_failures, "calls");
    bench_print("flood_calls_by_flooder", (double)sh->flood_issued, "calls");
    double flood_s = (double)(sh->flood_stop_ns - sh->flood_start_ns) / 1e9;
    fprintf(stderr,
            "# flood_bench: rank 1 issued %lld echo(16 KiB) in %.2f s (%.0f/s); of them %lld ok, "
            "%lld TP_ELIMIT, %lld failed otherwise, %lld unfinished at the deadline; %lld "
            "rpc_async refused; its calls ended %.0f ms after it stopped\n",
            (long long)sh->flood_issued, flood_s, (double)sh->flood_issued / flood_s,
            (long long)sh->flood_ok, (long long)sh->flood_limit, (long long)sh->flood_failed,
            (long long)sh->flood_unfinished, (long long)sh->flood_issue_failed,
            (double)(sh->flood_drained_ns - sh->flood_stop_ns) / 1e6);
    fprintf(stderr,
            "# flood_bench: rank 2 timed %lld calls during the flood, %lld after (over %.0f ms)%s\n",
            (long long)sh->during_calls, (long long)sh->after_calls, sh->after_span_ms,
            sh->recovery_ms < 0 ? "; its window median never came back within 2x" : "");
    if (sh->flood_first_error[0])
        fprintf(stderr, "# flood_bench: the flooder's first error: %s\n", sh->flood_first_error);
    if (sh->legit_failures > 0)
        fprintf(stderr, "# flood_bench: DEFECT: %lld legitimate calls failed, the first: %s\n",
                (long long)sh->legit_failures, sh->legit_first_error);
    bench_shared_free(sh, sizeof *sh);
    return 0;
}
