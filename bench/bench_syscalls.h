/*
 * bench_syscalls.h: system calls per synchronous round trip. rpc_bench runs
 * itself under `strace -f -c` (every thread of every process of the job) as
 * a two-worker job making one warm-up rpc_sync then n more, once with n
 * calls and once with none; the difference of the totals over n is the
 * figure. Init, the warm-up call (which opens the connections) and
 * shutdown are in both runs and cancel out.
 */
#ifndef TP_BENCH_SYSCALLS_H
#define TP_BENCH_SYSCALLS_H

/* The traced program's body (rpc_bench --syscall-job n placement fn shm=on|off,
 * the last setting bench_shm_off): rpc_syncs of fn ("echo" or "nb_echo"); 0 on
 * success. */
int bench_syscall_job(int n, int placement, const char *fn);

/*
 * Runs `strace -f -c` over `self --syscall-job n placement` and over `self
 * --syscall-job 0 placement` (bench_placement), reps times each (alternating; the smallest total of
 * each kind is kept), and sets *per_call. 0 on success; -1 when strace is
 * missing or a run fails.
 */
int bench_syscalls_run(const char *self, int n, int reps, int placement, const char *fn,
                       double *per_call);

#endif
