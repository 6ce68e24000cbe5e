/*
 * bench_init.h: how long a job of n processes takes to initialise. Every
 * process prepares (functions, options), then waits at a shared start
 * barrier; released together, each notes its start time, calls
 * tp_init_rpc, and reports its start and return times through a pipe. The
 * figure is max(return) - max(start): from the last process starting to
 * every process having returned from init.
 */
#ifndef TP_BENCH_INIT_H
#define TP_BENCH_INIT_H

/* Runs one job of n processes; *seconds set on success (0). */
int bench_init_run(int n, double *seconds);

#endif
