/*
 * tcp_harness.h: multi-process jobs for the TCP transport's tests
 * (spec/tcp.md). A job forks one child per rank; each child runs a worker
 * body on 127.0.0.1 with an ephemeral listen port and init_method
 * tcp://127.0.0.1:<a free port> (rank 0 serves the store), then exit()s
 * with the body's status, so a sanitizer build checks each child for leaks.
 * The parent may act on the running job (kill a rank, open raw sockets)
 * and then waits for every child with a deadline.
 */
#ifndef TT_TCP_HARNESS_H
#define TT_TCP_HARNESS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tensorplay/rpc.h"

#define TT_WORLD_MAX 8
#define TT_FLAGS 24

/* Memory shared by the parent and every child of a job (MAP_SHARED). */
typedef struct tt_shared {
    atomic_int flag[TT_FLAGS];         /* test-defined signals */
    atomic_int count[TT_FLAGS];        /* test-defined counters */
    atomic_uint_fast64_t ns[TT_FLAGS]; /* test-defined times (CLOCK_MONOTONIC) */
} tt_shared;

typedef struct tt_job tt_job;
/* A worker body: runs in the child of rank; its return is the exit status. */
typedef int (*tt_body)(tt_job *job, int rank);

struct tt_job {
    int world;
    uint16_t store_port;
    char init_method[64];
    pid_t pid[TT_WORLD_MAX];
    int code[TT_WORLD_MAX]; /* exit status, 128 + signal, or -1 while running */
    tt_shared *shared;
    void *arg; /* for the body */
};

/* Sets TP_SECRET to a fresh random job secret unless it is set (TCP-17): a
 * job's children inherit it, as tprun's do. */
void tt_ensure_secret(void);
/* 1 when this process may take a descriptor out of a child (what TCP-22's
 * proof needs): Yama's ptrace_scope or a seccomp filter may forbid it, and
 * then workers on one host rightly stay on TCP. */
int tt_can_take_fds(void);
/* A TCP port on 127.0.0.1 nobody uses right now, below the kernel's
 * ephemeral range when there is room (see tcp_harness.c). */
uint16_t tt_free_port(void);
/* Monotonic nanoseconds (the same clock in every process). */
uint64_t tt_now_ns(void);

/* Starts world children running body; 0 on success. */
int tt_spawn(tt_job *job, int world, tt_body body, void *arg);
/* Waits for every child until timeout_s, then SIGKILLs the rest; 0 when all
 * exited with 0 (the others are named on stderr). */
int tt_wait(tt_job *job, double timeout_s);
/* rpc_sync add(a, b) on d; TP_ETYPE when the result is not an int. */
tp_status tt_call_add(tp_dest d, int64_t a, int64_t b, double timeout_s, int64_t *out);
/* Every worker of job (this one too) answers add(rank, r) right, within 20 s
 * each: 0, or -1 with the failure printed. */
int tt_all_answer(const tt_job *job, int rank);
/* The same, each call tried again once after TP_EIO: for a test whose
 * forged or broken connections end while the calls start (a peer that may
 * live fails the calls in flight to it, TCP-7, and a user tries again). */
int tt_all_answer_retrying(const tt_job *job, int rank);
/* Kills rank's process (SIGKILL) and reaps it: 0, or -1. */
int tt_kill_rank(tt_job *job, int rank);
/* Starts a new process in rank's place (a restart, REJOIN) running body,
 * whose return is its exit status; tt_wait waits for it as for the first.
 * 0, or -1 when fork fails. */
int tt_restart_rank(tt_job *job, int rank, int (*body)(tt_job *job));
/* Frees the job's shared memory. */
void tt_job_free(tt_job *job);

/* Options for a worker of job: init_method, short timeouts. Caller frees. */
tp_options *tt_options(const tt_job *job, double rpc_timeout_s, double shutdown_timeout_s);
/* Registers the test functions (add, echo, slow, block) in the calling process. */
void tt_register_functions(void);
/* Inits "worker<rank>" on TENSORPIPE with opts; prints tp_errmsg on failure. */
int tt_init(const tt_job *job, int rank, tp_options *opts);

/* The calling process's resident memory (bytes, /proc/self/statm), open
 * descriptors (/proc/self/fd, not counting the one that reads it) and
 * threads (/proc/self/task). 0 on success, -1 when /proc cannot be read. */
int tt_self_usage(uint64_t *rss_bytes, uint64_t *fds, uint64_t *threads);

/* A sanitizer slows every thread several times over, and `make tsan` runs
 * beside other work: a test that races a short deadline on purpose (the
 * idle close's grace) stretches both the deadline and its own pauses by
 * this factor, keeping the race and losing the flakiness. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TT_SLOWDOWN 5
#else
#define TT_SLOWDOWN 1
#endif
/* The idle_timeout of the tests that race the idle close: 0.2 s each
 * TT_SLOWDOWN (the grace of a dialer asked to close is as long, TCP-19). */
#define TT_IDLE_TIMEOUT (TT_SLOWDOWN == 1 ? "0.2" : "1.0")

/* Rounds of 20 rpc_async add calls from rank to the two others of a world of
 * three, each round after a pause of 100..400 ms (varying with round and
 * rank; times TT_SLOWDOWN): with TT_IDLE_TIMEOUT some calls race an idle
 * close (TCP-19). 0 when every call answered right; else prints what
 * failed, -1. */
int tt_idle_rounds(int rank, int rounds);
/* Spins (sleeping 1 ms) until flag i reaches at least v or timeout; 0 when it did. */
int tt_await_flag(tt_shared *sh, int i, int v, double timeout_s);

/* A child-side check: prints the failed condition and returns from the body. */
#define TT_CHECK(cond)                                                                             \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: rank check failed: %s (last error: %s)\n", __FILE__, __LINE__, \
                    #cond, tp_errmsg());                                                           \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#endif
