/*
 * bench_pair.h: the two-process workloads. Two forked workers (rank 0 and
 * rank 1 of a TENSORPIPE job on 127.0.0.1) also share a raw TCP connection
 * with TCP_NODELAY, and rank 0 interleaves, block by block, the raw
 * reference with the rpc workload it is compared to: the same two
 * processes, the same moments of a noisy machine, so the ratios hold.
 */
#ifndef TP_BENCH_PAIR_H
#define TP_BENCH_PAIR_H

#include <stddef.h>

/*
 * Where the two worker processes run. On a virtual machine a wake-up across
 * CPUs can cost several times one on the same CPU, and the scheduler's choice
 * differs between a single-threaded raw ping-pong and a multi-threaded rpc
 * worker, so left free the two are not measured on equal terms.
 */
typedef enum bench_placement {
    BENCH_PLACE_SPREAD = 0, /* rank r's process, all its threads, on CPU r % ncpus */
    BENCH_PLACE_ONE = 1,    /* both processes on CPU 0 */
    BENCH_PLACE_FREE = 2    /* wherever the scheduler puts them */
} bench_placement;

/* Pins the calling process (threads it starts later inherit it) for rank; 0 on success. */
int bench_place(int placement, int rank);

typedef struct bench_pair_config {
    int use_rpc;        /* 0: the raw figures only (no rpc job) */
    const char *echo;   /* the echo rpc_sync and rpc_async call: "echo" (pool) or "nb_echo" */
    int do_rtt;         /* the round-trip workloads (raw, rpc_sync, remote + to_here) */
    int do_async;       /* the rpc_async window */
    int do_bulk;        /* the bulk transfers (raw, tensor) */
    int placement;      /* bench_placement */
    int rtt_samples;    /* timed 64-byte round trips, each of raw and rpc_sync */
    int rtt_block;      /* round trips of one kind in a row before switching */
    int remote_samples; /* timed tp_remote + tp_rref_to_here */
    int async_window;   /* rpc_async calls kept in flight */
    int async_calls;    /* calls in one timed async repetition */
    int async_reps;     /* timed async repetitions */
    int bulk_reps;      /* timed bulk transfers, each of raw and tensor */
    size_t bulk_bytes;  /* bytes of one bulk transfer (a float32 tensor's data) */
} bench_pair_config;

typedef struct bench_pair_results {
    double raw_rtt_median_us;
    double raw_rtt_p99_us;
    double rpc_rtt_median_us;
    double rpc_rtt_p99_us;
    double remote_median_us;
    double async_calls_per_s; /* median of the repetitions */
    double raw_gbps;          /* median, 1e9 bytes/s */
    double tensor_gbps;       /* median, 1e9 bytes/s */
} bench_pair_results;

/* Runs the job in two forked processes and fills *out; 0 on success. */
int bench_pair_run(const bench_pair_config *cfg, bench_pair_results *out);

#endif
