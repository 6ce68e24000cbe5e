/*
 * bench_util.h: what rpc_bench's workloads share: the clock, statistics,
 * blocking loopback sockets, forked children with a deadline, memory shared
 * across fork, and the one output format.
 */
#ifndef TP_BENCH_UTIL_H
#define TP_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "tensorplay/rpc.h"

/* Monotonic nanoseconds; the same clock in every process of the machine. */
uint64_t bench_now_ns(void);

/* Sorts v ascending, then returns its median (v[n/2]); n > 0. */
double bench_median(double *v, size_t n);
/* The p-th percentile (0..100) of v, which must already be sorted; n > 0. */
double bench_percentile_sorted(const double *v, size_t n, double p);

/* Sends (writing != 0) or receives exactly n bytes on a blocking socket; 0 on success. */
int bench_full_io(int fd, void *p, size_t n, int writing);
/* A listening socket on 127.0.0.1 at an ephemeral port (*port set); -1 on failure. */
int bench_listen_loopback(uint16_t *port);
/* A connected socket to 127.0.0.1:port with TCP_NODELAY; -1 on failure. */
int bench_connect_loopback(uint16_t port);
/* Accepts one connection on lfd and sets TCP_NODELAY; -1 on failure. */
int bench_accept_nodelay(int lfd);
/* A TCP port on 127.0.0.1 that nobody listens on right now. */
uint16_t bench_free_port(void);

/* Anonymous memory shared with children forked later (zeroed); NULL on failure. */
void *bench_shared_alloc(size_t size);
void bench_shared_free(void *p, size_t size);

/*
 * Forks rank 0 then rank 1, each child running body(rank, arg) and exiting
 * with its value (stdio flushed before each fork and before the exit).
 * pids[r] is -1 where no child was started; a failed fork is reported and
 * ends the loop. 0 when both started, -1 otherwise.
 */
int bench_fork_ranks(pid_t pids[2], int (*body)(int rank, void *arg), void *arg);

/*
 * Waits for the n children in pids until timeout_s passes, then SIGKILLs
 * the rest. Returns 0 when every child exited with status 0; otherwise
 * prints which did not (what names the job) and returns -1.
 */
int bench_wait_children(const pid_t *pids, int n, double timeout_s, const char *what);

/*
 * TENSORPIPE options for a bench worker: init_method tcp://127.0.0.1:port
 * (rank 0 serves the store), generous timeouts, the default thread pool
 * unless bench_worker_threads says otherwise.
 * Caller frees; NULL on failure.
 */
tp_options *bench_worker_options(uint16_t store_port);

/* Registers the functions the workloads call: echo, numel. */
void bench_register_functions(void);

/* Prints one figure: "BENCH <name> <value> <unit>" on stdout, flushed. */
void bench_print(const char *name, double value, const char *unit);

/* Verbose diagnostics go to stderr when set (-v). */
extern int bench_verbose;
/* num_worker_threads of every bench worker; 0 keeps the default (--worker-threads). */
extern int bench_worker_threads;
/* --auth off: the workers run with the backend option auth=off (TCP-17), to
 * measure what authentication costs. */
extern int bench_auth_off;
/* --encrypt on: the workers seal their streams (encrypt=on, TCP-21); the crypt
 * workload sets it for its second job. */
extern int bench_encrypt;
/* 1: the workers keep every frame on the TCP stream (shm=off, spec/tcp.md TCP-22). */
extern int bench_shm_off;
extern int bench_spin_us; /* the workers' spin_us (TCP-29); 0: the default */

/* A child-side check: prints the failed condition and the last rpc error, returns 1. */
#define BENCH_CHECK(cond)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rpc_bench: %s:%d: check failed: %s (last rpc error: %s)\n", __FILE__, \
                    __LINE__, #cond, tp_errmsg());                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#endif
