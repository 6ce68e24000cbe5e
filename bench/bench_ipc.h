/*
 * bench_ipc.h: the same-host IPC floor (issue 23). Two forked processes,
 * placed like the rpc pair (bench_place), ping-pong a 64-byte message
 * through memory they share, three ways interleaved block by block in the
 * same two processes:
 *
 *   - poll:  each side busy-polls a shared sequence word (C11 atomics,
 *            acquire/release): the floor for a receiver that spins;
 *   - futex: the same word, but each side sleeps in FUTEX_WAIT and the
 *            sender FUTEX_WAKEs it, no spinning: the floor for a receiver
 *            that sleeps;
 *   - tcp:   the 64-byte raw loopback TCP ping-pong of bench_pair, again, as
 *            the reference measured in these processes at these moments.
 */
#ifndef TP_BENCH_IPC_H
#define TP_BENCH_IPC_H

typedef struct bench_ipc_config {
    int placement; /* bench_placement (bench_pair.h) */
    int samples;   /* timed round trips of each kind */
    int block;     /* round trips of one kind in a row before switching */
    int warmup;    /* untimed round trips of each kind first */
    int no_poll;   /* 1: the futex and tcp kinds only (poll_* left 0) */
} bench_ipc_config;

typedef struct bench_ipc_results {
    double poll_median_us;
    double poll_p99_us;
    double futex_median_us;
    double futex_p99_us;
    double tcp_median_us;
    double tcp_p99_us;
} bench_ipc_results;

/* Runs the three ping-pongs in two forked processes and fills *out; 0 on success. */
int bench_ipc_run(const bench_ipc_config *cfg, bench_ipc_results *out);

#endif
