/*
 * rpc_bench: figures of the TCP transport ("TENSORPIPE") next to raw TCP,
 * all measured in one run so that they compare as ratios on a noisy shared
 * machine. Prints one line per figure, "BENCH <name> <value> <unit>", then
 * the ratios as "BENCH ratio_<name> <value> x". A program, not a test: it
 * exits non-zero only when a workload fails to run, never for a slow
 * figure. bench/README.md says what each figure means and the targets.
 *
 *   rpc_bench [--quick] [--raw-only] [--no-syscalls] [--only WORKLOAD]
 *             [--placement spread|one|free] [--worker-threads N] [--auth on|off]
 *             [--encrypt on|off] [--shm on|off] [-v]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_init.h"
#include "bench_ipc.h"
#include "bench_pair.h"
#include "bench_syscalls.h"
#include "bench_util.h"

#define MIB ((size_t)1 << 20)

typedef struct bench_args {
    int quick;
    int raw_only;
    int placement;                                    /* bench_placement of the two-process jobs */
    int rtt, async, bulk, init, syscalls, crypt, ipc, stream, spin; /* the workloads to run */
} bench_args;

static void usage(void) {
    fprintf(stderr,
            "usage: rpc_bench [--quick] [--raw-only] [--no-syscalls] [--only WORKLOAD]\n"
            "                 [--placement spread|one|free] [--worker-threads N] [--auth on|off]\n"
            "                 [--encrypt on|off] [--shm on|off] [--spin-us N] [-v]\n"
            "  --quick        fewer samples and no 32-process init: a smoke run\n"
            "  --raw-only     only the raw TCP and IPC figures (no rpc job)\n"
            "  --no-syscalls  skip syscalls_per_rpc_sync (needs strace)\n"
            "  --only W       one workload: rtt, async, bulk, init, syscalls, crypt, ipc,\n"
            "                 stream or spin (e.g. under perf), or several: rtt,ipc; a ratio\n"
            "                 is printed\n"
            "                 only when both its figures ran; stream repeats rtt, async and\n"
            "                 syscalls (those selected) with shm=off, prefixed tcp_; spin\n"
            "                 repeats rtt and async with spin_us 200, prefixed spin_\n"
            "  --placement P  where the two worker processes run: spread (default: rank r\n"
            "                 on CPU r), one (both on CPU 0) or free (the scheduler's choice)\n"
            "  --worker-threads N\n"
            "                 num_worker_threads of the workers (default: the library's)\n"
            "  --auth on|off  the workers' authentication (default on, spec/tcp.md TCP-17)\n"
            "  --shm on|off   shared memory between the two workers (default on: the ring\n"
            "                 of TCP-28, slabs of TCP-22): off keeps every frame on the\n"
            "                 loopback stream\n"
            "  --spin-us N    the workers' spin_us (TCP-29, 0..10000; default 0): how long\n"
            "                 a waiting caller and the I/O threads spin before they sleep\n"
            "  --encrypt on|off\n"
            "                 the workers' encryption of the stream (default off, TCP-21); the\n"
            "                 crypt workload measures both in one run whatever this says\n"
            "  -v             per-repetition details and the syscall breakdown on stderr\n");
}

static int parse_placement(const char *s) {
    if (strcmp(s, "spread") == 0)
        return BENCH_PLACE_SPREAD;
    if (strcmp(s, "one") == 0)
        return BENCH_PLACE_ONE;
    if (strcmp(s, "free") == 0)
        return BENCH_PLACE_FREE;
    return -1;
}

/* The flag of the workload named by w[0..n), or NULL. */
static int *only_workload(bench_args *a, const char *w, size_t n) {
    static const char *const names[] = {"rtt",   "async", "bulk",   "init", "syscalls",
                                        "crypt", "ipc",   "stream", "spin"};
    int *const flags[] = {&a->rtt,   &a->async, &a->bulk,   &a->init, &a->syscalls,
                          &a->crypt, &a->ipc,   &a->stream, &a->spin};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == n && strncmp(w, names[i], n) == 0)
            return flags[i];
    return NULL;
}

static int parse_args(int argc, char **argv, bench_args *a) {
    memset(a, 0, sizeof *a);
    a->placement = BENCH_PLACE_SPREAD;
    a->rtt = a->async = a->bulk = a->init = a->syscalls = a->crypt = a->ipc = a->stream = 1;
    a->spin = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            a->quick = 1;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            /* W or W1,W2,...: e.g. rtt,ipc for the round trips and their ratios to the floor */
            const char *w = argv[++i];
            a->rtt = a->async = a->bulk = a->init = a->syscalls = a->crypt = a->ipc = a->stream = 0;
            a->spin = 0;
            while (*w) {
                size_t n = strcspn(w, ",");
                int *sel = only_workload(a, w, n);
                if (!sel)
                    return -1;
                *sel = 1;
                w += n + (w[n] == ',');
            }
            if (!a->rtt && !a->async && !a->bulk && !a->init && !a->syscalls && !a->crypt &&
                !a->ipc && !a->stream && !a->spin)
                return -1;
            if (a->spin && !a->rtt && !a->async)
                a->rtt = a->async = 1; /* spin alone: what it repeats */
            if (a->stream && !a->rtt && !a->async && !a->syscalls)
                a->rtt = a->async = a->syscalls = 1; /* stream alone: what it repeats, both ways */
        } else if (strcmp(argv[i], "--placement") == 0 && i + 1 < argc) {
            a->placement = parse_placement(argv[++i]);
            if (a->placement < 0)
                return -1;
        } else if (strcmp(argv[i], "--worker-threads") == 0 && i + 1 < argc) {
            bench_worker_threads = atoi(argv[++i]);
            if (bench_worker_threads < 1)
                return -1;
        } else if (strcmp(argv[i], "--auth") == 0 && i + 1 < argc) {
            const char *v = argv[++i];
            if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0)
                return -1;
            bench_auth_off = strcmp(v, "off") == 0; /* TCP-17's cost: compare on and off */
        } else if (strcmp(argv[i], "--shm") == 0 && i + 1 < argc &&
                   (strcmp(argv[i + 1], "on") == 0 || strcmp(argv[i + 1], "off") == 0)) {
            bench_shm_off = strcmp(argv[++i], "off") == 0;
        } else if (strcmp(argv[i], "--spin-us") == 0 && i + 1 < argc) {
            bench_spin_us = atoi(argv[++i]);
            if (bench_spin_us < 0 || bench_spin_us > 10000)
                return -1;
        } else if (strcmp(argv[i], "--encrypt") == 0 && i + 1 < argc) {
            const char *v = argv[++i];
            if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0)
                return -1;
            bench_encrypt = strcmp(v, "on") == 0;
        } else if (strcmp(argv[i], "--raw-only") == 0) {
            a->raw_only = 1;
        } else if (strcmp(argv[i], "--no-syscalls") == 0) {
            a->syscalls = 0;
        } else if (strcmp(argv[i], "-v") == 0) {
            bench_verbose = 1;
        } else {
            return -1;
        }
    }
    if (a->raw_only || bench_auth_off)
        a->crypt = 0; /* encryption needs rpc workers that authenticate */
    if (a->raw_only || bench_shm_off)
        a->stream = 0; /* the main job is on the stream already */
    if (a->raw_only || bench_spin_us > 0)
        a->spin = 0; /* the main job spins already */
    if (a->raw_only) {
        a->async = a->init = a->syscalls = 0;
        a->rtt = a->bulk = 1;
    }
    return 0;
}

static bench_pair_config pair_config(const bench_args *a) {
    bench_pair_config c = {
        .use_rpc = !a->raw_only,
        .echo = "echo",
        .do_rtt = a->rtt,
        .do_async = a->async,
        .do_bulk = a->bulk,
        .placement = a->placement,
        .rtt_samples = 12000,
        .rtt_block = 500,
        .remote_samples = 2400,
        .async_window = 1000,
        .async_calls = 50000,
        .async_reps = 5,
        .bulk_reps = 7,
        .bulk_bytes = 64 * MIB,
    };
    if (a->quick) {
        c.rtt_samples = 2000;
        c.remote_samples = 400;
        c.async_calls = 10000;
        c.async_reps = 3;
        c.bulk_reps = 3;
    }
    return c;
}

/*
 * The same-host IPC floor (issue 23, bench_ipc.h): 64-byte ping-pongs
 * through shared memory, polled and with futexes, interleaved with the raw
 * TCP one, in two processes placed like the rpc pair. With the default
 * placement (spread) the futex ping-pong is measured once more with both
 * processes on CPU 0, the floor of the *_1cpu_* round trips.
 */
static int run_ipc(const bench_args *a, bench_ipc_results *r, bench_ipc_results *r1) {
    bench_ipc_config cfg = {
        .placement = a->placement,
        .samples = a->quick ? 2000 : 12000,
        .block = 500,
        .warmup = 2000,
    };
    if (bench_ipc_run(&cfg, r) != 0) {
        fprintf(stderr, "rpc_bench: the ipc ping-pongs failed\n");
        return -1;
    }
    bench_print("ipc_shm_poll_rtt_median_us", r->poll_median_us, "us");
    bench_print("ipc_shm_poll_rtt_p99_us", r->poll_p99_us, "us");
    bench_print("ipc_futex_rtt_median_us", r->futex_median_us, "us");
    bench_print("ipc_futex_rtt_p99_us", r->futex_p99_us, "us");
    bench_print("ipc_run_raw_tcp_rtt_median_us", r->tcp_median_us, "us");
    if (bench_verbose)
        fprintf(stderr, "rpc_bench: ipc_run_raw_tcp_rtt_p99_us %.3f\n", r->tcp_p99_us);
    if (a->placement != BENCH_PLACE_SPREAD)
        return 0;
    cfg.placement = BENCH_PLACE_ONE;
    cfg.no_poll = 1; /* on one CPU a poll is a sched_yield hand-off: not a floor */
    if (bench_ipc_run(&cfg, r1) != 0) {
        fprintf(stderr, "rpc_bench: the ipc ping-pongs on one CPU failed\n");
        return -1;
    }
    bench_print("ipc_futex_rtt_1cpu_median_us", r1->futex_median_us, "us");
    return 0;
}

static int run_init_figures(const bench_args *a) {
    static const int sizes[] = {2, 8, 32};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        double secs = 0;
        if (a->quick && sizes[i] > 8)
            continue;
        if (bench_init_run(sizes[i], &secs) != 0) {
            fprintf(stderr, "rpc_bench: init of %d processes failed\n", sizes[i]);
            return -1;
        }
        char name[32];
        snprintf(name, sizeof name, "init_%d_s", sizes[i]);
        bench_print(name, secs, "s");
    }
    return 0;
}

static int run_syscall_figure(const bench_args *a, const char *fn, const char *figure) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        perror("rpc_bench: /proc/self/exe");
        return -1;
    }
    self[n] = '\0';
    double per_call = 0;
    if (bench_syscalls_run(self, a->quick ? 500 : 2000, a->quick ? 1 : 2, a->placement, fn,
                           &per_call) != 0) {
        fprintf(stderr, "rpc_bench: syscalls_per_rpc_sync failed (is strace installed? "
                        "scripts/install-deps.sh strace)\n");
        return -1;
    }
    bench_print(figure, per_call, "calls");
    return 0;
}

/*
 * The round trips and the async window once more with the echo registered
 * non-blocking (FUNC-6): served on the callee's I/O thread, no pool hand-off.
 * Its own raw reference, measured interleaved in this second job.
 */
static int run_inline(const bench_args *a, const bench_ipc_results *ipc) {
    bench_args in = *a;
    in.bulk = 0;
    bench_pair_config cfg = pair_config(&in);
    cfg.echo = "nb_echo";
    cfg.remote_samples = 0;
    bench_pair_results r;
    memset(&r, 0, sizeof r);
    if ((in.rtt || in.async) && bench_pair_run(&cfg, &r) != 0) {
        fprintf(stderr, "rpc_bench: the non-blocking echo job failed\n");
        return -1;
    }
    if (in.rtt) {
        bench_print("raw_tcp_rtt_nb_run_median_us", r.raw_rtt_median_us, "us");
        bench_print("rpc_sync_nb_rtt_median_us", r.rpc_rtt_median_us, "us");
        bench_print("rpc_sync_nb_rtt_p99_us", r.rpc_rtt_p99_us, "us");
        bench_print("ratio_rpc_sync_nb_rtt_median", r.rpc_rtt_median_us / r.raw_rtt_median_us,
                    "x");
        if (ipc) /* the futex floor, measured by run_ipc */
            bench_print("ratio_rpc_sync_nb_rtt_vs_futex",
                        r.rpc_rtt_median_us / ipc->futex_median_us, "x");
    }
    if (in.async)
        bench_print("rpc_async_nb_calls_per_s", r.async_calls_per_s, "calls/s");
    if (in.syscalls && run_syscall_figure(a, "nb_echo", "syscalls_per_rpc_sync_nb") != 0)
        return -1;
    return 0;
}

/*
 * The round trips once more with both processes on one CPU: with no
 * wake-up crossing CPUs (costly on a virtual machine), what is left of the
 * gap to raw TCP is the library's own work: its system calls and the
 * hand-offs between its threads.
 */
static int run_one_cpu_rtt(const bench_args *a, const bench_ipc_results *ipc1) {
    bench_args one = *a;
    one.async = one.bulk = 0;
    one.placement = BENCH_PLACE_ONE;
    bench_pair_config cfg = pair_config(&one);
    cfg.remote_samples = 0;
    bench_pair_results r;
    memset(&r, 0, sizeof r);
    if (bench_pair_run(&cfg, &r) != 0) {
        fprintf(stderr, "rpc_bench: the round trips on one CPU failed\n");
        return -1;
    }
    bench_print("raw_tcp_rtt_1cpu_median_us", r.raw_rtt_median_us, "us");
    bench_print("rpc_sync_rtt_1cpu_median_us", r.rpc_rtt_median_us, "us");
    bench_print("ratio_rpc_sync_rtt_1cpu_median", r.rpc_rtt_median_us / r.raw_rtt_median_us, "x");
    if (ipc1) /* the futex ping-pong on one CPU, measured by run_ipc */
        bench_print("ratio_rpc_sync_rtt_1cpu_vs_futex", r.rpc_rtt_median_us / ipc1->futex_median_us,
                    "x");
    return 0;
}

/*
 * What encryption costs (spec/tcp.md TCP-21): the round trips and the 64 MiB
 * tensor in two jobs, encrypt=off then encrypt=on, each against the raw
 * reference measured interleaved in its own processes. The ratios are on
 * over off, directly and (_vs_raw) as the quotient of the two jobs' ratios
 * to their raw references: the second moves less when the machine is slower
 * during one job, but more when a raw reference itself is disturbed.
 */
static int run_crypt(const bench_args *a) {
    bench_args c = *a;
    c.async = 0;
    c.rtt = c.bulk = 1;
    bench_pair_config cfg = pair_config(&c);
    cfg.remote_samples = 0;
    bench_pair_results r[2];
    int saved = bench_encrypt, saved_shm = bench_shm_off;
    bench_shm_off = 1; /* both jobs on the stream: encryption's cost, not shared memory's gain */
    for (int on = 0; on < 2; on++) {
        memset(&r[on], 0, sizeof r[on]);
        bench_encrypt = on;
        if (bench_pair_run(&cfg, &r[on]) != 0) {
            bench_encrypt = saved;
            bench_shm_off = saved_shm;
            fprintf(stderr, "rpc_bench: the encrypt=%s job failed\n", on ? "on" : "off");
            return -1;
        }
    }
    bench_encrypt = saved;
    bench_shm_off = saved_shm;
    static const char *const mode[2] = {"off", "on"};
    for (int on = 0; on < 2; on++) {
        char name[64];
        snprintf(name, sizeof name, "crypt_%s_raw_tcp_rtt_median_us", mode[on]);
        bench_print(name, r[on].raw_rtt_median_us, "us");
        snprintf(name, sizeof name, "crypt_%s_rpc_sync_rtt_median_us", mode[on]);
        bench_print(name, r[on].rpc_rtt_median_us, "us");
        snprintf(name, sizeof name, "crypt_%s_raw_tcp_gbps", mode[on]);
        bench_print(name, r[on].raw_gbps, "GB/s");
        snprintf(name, sizeof name, "crypt_%s_tensor_64mib_gbps", mode[on]);
        bench_print(name, r[on].tensor_gbps, "GB/s");
    }
    double rtt[2], bw[2];
    for (int on = 0; on < 2; on++) {
        rtt[on] = r[on].rpc_rtt_median_us / r[on].raw_rtt_median_us;
        bw[on] = r[on].tensor_gbps / r[on].raw_gbps;
    }
    bench_print("ratio_crypt_rpc_sync_rtt_median",
                r[1].rpc_rtt_median_us / r[0].rpc_rtt_median_us, "x");
    bench_print("ratio_crypt_tensor_64mib_gbps", r[1].tensor_gbps / r[0].tensor_gbps, "x");
    bench_print("ratio_crypt_rpc_sync_rtt_median_vs_raw", rtt[1] / rtt[0], "x");
    bench_print("ratio_crypt_tensor_64mib_gbps_vs_raw", bw[1] / bw[0], "x");
    return 0;
}

/* Issue 23's reference for a 64 MiB tensor: memcpy of 64 MiB between two
 * buffers already faulted in, in this process; the best of 5, GB/s. */
static double memcpy_64mib_gbps(void) {
    size_t n = 64 * MIB;
    uint8_t *src = malloc(n), *dst = malloc(n);
    double best = 0;
    if (src && dst) {
        memset(src, 1, n);
        memset(dst, 2, n);
        for (int i = 0; i < 5; i++) {
            uint64_t t0 = bench_now_ns();
            memcpy(dst, src, n);
            double s = (double)(bench_now_ns() - t0) / 1e9;
            src[i] ^= dst[n - 1 - (size_t)i]; /* the copy is used: not optimised away */
            if (s > 0 && n / s / 1e9 > best)
                best = (double)n / s / 1e9;
        }
    }
    free(src);
    free(dst);
    return best;
}

/*
 * The same host without shared memory (issue 23 keeps the TCP figures): the
 * round trips, the async window and the system calls once more with
 * shm=off, every frame on the loopback stream, against the raw reference
 * of this job, so that the ring (TCP-28) and the stream compare in one run.
 */
/* A second rpc pair of the run (the stream, the spin): the main job's round
 * trips and async window, without the bulk and remote figures. */
static int run_side_pair(const bench_args *a, bench_pair_results *r) {
    bench_args side = *a;
    side.bulk = 0;
    bench_pair_config cfg = pair_config(&side);
    cfg.remote_samples = 0;
    memset(r, 0, sizeof *r);
    return (a->rtt || a->async) ? bench_pair_run(&cfg, r) : 0;
}

static int run_stream(const bench_args *a, const bench_pair_results *ring) {
    bench_pair_results r;
    int saved = bench_shm_off;
    bench_shm_off = 1;
    int rc = run_side_pair(a, &r);
    if (rc == 0 && a->syscalls)
        rc = run_syscall_figure(a, "echo", "tcp_syscalls_per_rpc_sync");
    bench_shm_off = saved;
    if (rc != 0) {
        fprintf(stderr, "rpc_bench: the shm=off job failed\n");
        return -1;
    }
    if (a->rtt) {
        bench_print("tcp_raw_tcp_rtt_median_us", r.raw_rtt_median_us, "us");
        bench_print("tcp_rpc_sync_rtt_median_us", r.rpc_rtt_median_us, "us");
        bench_print("ratio_tcp_rpc_sync_rtt_median", r.rpc_rtt_median_us / r.raw_rtt_median_us,
                    "x");
        /* The ring's round trip over the stream's, directly and through each
         * job's raw reference (steadier when the machine changed between). */
        bench_print("ratio_rpc_sync_rtt_ring_over_tcp",
                    ring->rpc_rtt_median_us / r.rpc_rtt_median_us, "x");
        bench_print("ratio_rpc_sync_rtt_ring_over_tcp_vs_raw",
                    (ring->rpc_rtt_median_us / ring->raw_rtt_median_us) /
                        (r.rpc_rtt_median_us / r.raw_rtt_median_us),
                    "x");
    }
    if (a->async) {
        bench_print("tcp_rpc_async_calls_per_s", r.async_calls_per_s, "calls/s");
        bench_print("ratio_rpc_async_ring_over_tcp", ring->async_calls_per_s / r.async_calls_per_s,
                    "x");
    }
    return 0;
}

/* The spin that issue 23's "spin on" target is measured with (TCP-29). */
#define BENCH_SPIN_US 200

/*
 * Issue 23's "spin on": the round trips and the async window once more
 * with every worker's spin_us at BENCH_SPIN_US, against this job's own raw
 * reference and the main job (spin off) of the same run.
 */
static int run_spin(const bench_args *a, const bench_pair_results *nospin) {
    bench_pair_results r;
    bench_spin_us = BENCH_SPIN_US;
    int rc = run_side_pair(a, &r);
    bench_spin_us = 0;
    if (rc != 0) {
        fprintf(stderr, "rpc_bench: the spin_us=%d job failed\n", BENCH_SPIN_US);
        return -1;
    }
    bench_print("spin_us", BENCH_SPIN_US, "us");
    if (a->rtt) {
        bench_print("spin_raw_tcp_rtt_median_us", r.raw_rtt_median_us, "us");
        bench_print("spin_rpc_sync_rtt_median_us", r.rpc_rtt_median_us, "us");
        bench_print("spin_rpc_sync_rtt_p99_us", r.rpc_rtt_p99_us, "us");
        bench_print("ratio_spin_rpc_sync_rtt_median", r.rpc_rtt_median_us / r.raw_rtt_median_us,
                    "x");
        bench_print("ratio_rpc_sync_rtt_spin_over_nospin",
                    r.rpc_rtt_median_us / nospin->rpc_rtt_median_us, "x");
    }
    if (a->async) {
        bench_print("spin_rpc_async_calls_per_s", r.async_calls_per_s, "calls/s");
        bench_print("ratio_rpc_async_spin_over_nospin",
                    r.async_calls_per_s / nospin->async_calls_per_s, "x");
    }
    return 0;
}

int main(int argc, char **argv) {
    /* The job secret every forked worker inherits (spec/tcp.md TCP-17). */
    char secret[80];
    if (!getenv("TP_SECRET") &&
        (tp_job_secret_new(secret, sizeof secret) != TP_OK || setenv("TP_SECRET", secret, 1) != 0))
        return 1;
    if (argc == 6 && strcmp(argv[1], "--syscall-job") == 0) {
        bench_shm_off = strcmp(argv[5], "shm=off") == 0;
        return bench_syscall_job(atoi(argv[2]), atoi(argv[3]), argv[4]);
    }
    bench_args a;
    if (parse_args(argc, argv, &a) != 0) {
        usage();
        return 2;
    }
    uint64_t t0 = bench_now_ns();
    bench_pair_config cfg = pair_config(&a);
    bench_pair_results r;
    memset(&r, 0, sizeof r);
    if ((a.rtt || a.async || a.bulk) && bench_pair_run(&cfg, &r) != 0) {
        fprintf(stderr, "rpc_bench: the two-process workloads failed\n");
        return 1;
    }
    int rpc_rtt = a.rtt && !a.raw_only, rpc_bulk = a.bulk && !a.raw_only;
    if (a.rtt)
        bench_print("raw_tcp_rtt_median_us", r.raw_rtt_median_us, "us");
    if (a.rtt && bench_verbose)
        fprintf(stderr, "rpc_bench: raw_tcp_rtt_p99_us %.3f\n", r.raw_rtt_p99_us);
    if (rpc_rtt) {
        bench_print("rpc_sync_rtt_median_us", r.rpc_rtt_median_us, "us");
        bench_print("rpc_sync_rtt_p99_us", r.rpc_rtt_p99_us, "us");
    }
    if (a.async)
        bench_print("rpc_async_calls_per_s", r.async_calls_per_s, "calls/s");
    if (a.bulk)
        bench_print("raw_tcp_gbps", r.raw_gbps, "GB/s");
    if (rpc_bulk)
        bench_print("tensor_64mib_gbps", r.tensor_gbps, "GB/s");
    if (rpc_rtt)
        bench_print("remote_to_here_median_us", r.remote_median_us, "us");
    /* Right after the rpc pair, so that its round trips and the floor are close in time. */
    bench_ipc_results ipc, ipc1;
    memset(&ipc, 0, sizeof ipc);
    memset(&ipc1, 0, sizeof ipc1);
    if (a.ipc && run_ipc(&a, &ipc, &ipc1) != 0)
        return 1;
    if (a.init && run_init_figures(&a) != 0)
        return 1;
    if (a.syscalls && run_syscall_figure(&a, "echo", "syscalls_per_rpc_sync") != 0)
        return 1;
    if (rpc_rtt) {
        bench_print("ratio_rpc_sync_rtt_median", r.rpc_rtt_median_us / r.raw_rtt_median_us, "x");
        bench_print("ratio_remote_to_here_median", r.remote_median_us / r.raw_rtt_median_us, "x");
    }
    if (rpc_bulk) {
        bench_print("ratio_tensor_64mib_gbps", r.tensor_gbps / r.raw_gbps, "x");
        double mc = memcpy_64mib_gbps();
        bench_print("memcpy_64mib_gbps", mc, "GB/s");
        if (mc > 0)
            bench_print("ratio_tensor_64mib_vs_memcpy", r.tensor_gbps / mc, "x");
    }
    if (rpc_rtt && a.ipc) { /* issue 23's targets: the rpc pair's median over the floor's */
        bench_print("ratio_rpc_sync_rtt_vs_futex", r.rpc_rtt_median_us / ipc.futex_median_us, "x");
        bench_print("ratio_rpc_sync_rtt_vs_shm_poll", r.rpc_rtt_median_us / ipc.poll_median_us,
                    "x");
        /* The same through each job's raw TCP reference (like ratio_crypt_*_vs_raw): steadier
         * when the machine changed between the two jobs. */
        bench_print("ratio_rpc_sync_rtt_vs_futex_via_raw",
                    (r.rpc_rtt_median_us / r.raw_rtt_median_us) /
                        (ipc.futex_median_us / ipc.tcp_median_us),
                    "x");
    }
    if (rpc_rtt && a.placement == BENCH_PLACE_SPREAD &&
        run_one_cpu_rtt(&a, a.ipc ? &ipc1 : NULL) != 0)
        return 1;
    if (!a.raw_only && (a.rtt || a.async || a.syscalls) && run_inline(&a, a.ipc ? &ipc : NULL) != 0)
        return 1;
    if (a.crypt && run_crypt(&a) != 0)
        return 1;
    if (a.stream && run_stream(&a, &r) != 0)
        return 1;
    if (a.spin && run_spin(&a, &r) != 0)
        return 1;
    if (bench_verbose)
        fprintf(stderr, "rpc_bench: the run took %.1f s\n", (double)(bench_now_ns() - t0) / 1e9);
    return 0;
}
