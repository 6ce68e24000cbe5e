/*
 * tensorplay/sim.h: the deterministic simulator (sim/), for tests and for
 * fault experiments.
 *
 * A tp_sim runs N simulated workers ("hosts") in one thread of one process.
 * Each host runs a program (the same function for every rank) as a
 * cooperative task; blocking calls (tp_init_rpc, tp_rpc_sync, future waits,
 * to_here, tp_shutdown, tp_sleep) yield to the scheduler. Time is virtual
 * and jumps to the next event; all randomness comes from the seed through
 * separate streams (network, faults, workload). The same seed and fault
 * plan give a byte-identical trace and the same trace hash (SIM-1..8), and
 * an oracle checks every run (SIM-9).
 *
 * Programs call tp_init_rpc(name, "SIM", rank, world_size, opts) as they
 * would on TCP.
 */
#ifndef TENSORPLAY_SIM_H
#define TENSORPLAY_SIM_H

#include <stdio.h>

#include "rpc.h"
#include "rpc_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_sim tp_sim;

/* A host's program: returns 0 for success. rank is the host's index. */
typedef int (*tp_sim_program)(int rank, int world_size, void *arg);

typedef struct tp_sim_config {
    uint32_t hosts;             /* number of simulated hosts, >= 1 */
    uint64_t seed;
    uint64_t latency_min_ns;    /* per message; default 20 us when 0 */
    uint64_t latency_jitter_ns; /* uniform extra in [0, jitter); default 30 us when 0 */
    uint64_t time_limit_ns;     /* virtual time limit; default 1 h when 0 */
    size_t stack_size;          /* per task; default 256 KiB when 0 */
    tp_store *store;            /* borrowed; NULL: an in-memory SQLite store owned by the sim */
    FILE *trace;                /* borrowed; when set, the canonical trace is written here */
    FILE *perfetto;             /* borrowed; when set, Chrome trace-event JSON (SIM-12) */
} tp_sim_config;

/* A new simulation; *out caller-owned (tp_sim_free). */
tp_status tp_sim_new(const tp_sim_config *cfg, tp_sim **out);
void tp_sim_free(tp_sim *sim);

/* ---- Faults (SIM-5). Times are virtual ns from the start. ---------------- */

/* Messages from -> to sent in [start, end) take extra_ns longer (FIFO kept). */
tp_status tp_sim_fault_delay(tp_sim *sim, uint32_t from, uint32_t to, uint64_t start_ns,
                             uint64_t end_ns, uint64_t extra_ns);
/* At at_ns the connection between a and b breaks: what is in flight on it is
 * lost and both ends get peer-down. Later sends open a new connection. */
tp_status tp_sim_fault_break(tp_sim *sim, uint32_t a, uint32_t b, uint64_t at_ns);
/* Between a and b nothing arrives in [start, end): the connection breaks at
 * start (both ends see peer-down with TP_EIO) and what is sent until end is
 * accepted and lost, as on a real network: the callers' timeouts catch it. */
tp_status tp_sim_fault_partition(tp_sim *sim, uint32_t a, uint32_t b, uint64_t start_ns,
                                 uint64_t end_ns);
/* At at_ns host dies: its connections break, its queued messages are gone,
 * its tasks are woken with TP_ESHUTDOWN and it never sends again. */
tp_status tp_sim_fault_kill(tp_sim *sim, uint32_t host, uint64_t at_ns);
/* At at_ns, if rank's newest incarnation is dead, a new host (a new slot,
 * a new address) runs the program again for rank: a restarted process, the
 * next incarnation (tp_sim_incarnation() says which), which inits with the
 * rejoin option (spec/lifecycle.md REJOIN). At most 64 restarts a run. */
tp_status tp_sim_fault_restart(tp_sim *sim, uint32_t rank, uint64_t at_ns);
/* Each message is lost with probability per_million/1e6 (a loss breaks the
 * connection, as on TCP). */
tp_status tp_sim_fault_drop(tp_sim *sim, uint32_t per_million);

/*
 * Reads a fault plan: one fault a line, '#' comments:
 *   delay FROM TO START_MS END_MS EXTRA_MS
 *   break A B AT_MS
 *   partition A B START_MS END_MS
 *   kill HOST AT_MS
 *   restart RANK AT_MS
 *   drop PER_MILLION
 *   storedown START_MS END_MS
 *   storeslow START_MS END_MS EXTRA_MS
 * and the rest of spec/sim.md SIM-5. TP_EINVAL with the line number in
 * errmsg on a bad line.
 */
tp_status tp_sim_load_faults(tp_sim *sim, const char *text, char *errmsg, size_t errmsg_len);

/* ---- Running ------------------------------------------------------------ */

/*
 * Runs program on every host until all return, the world deadlocks (every
 * task parked with no event left: a liveness failure), or the time limit.
 * exit_codes (may be NULL) gets each host's return value (-1 if it never
 * returned, 137 if killed). TP_OK when all returned; TP_ETIMEDOUT at the
 * time limit; TP_ECANCELED on deadlock (the parked tasks are unwound with
 * TP_ESHUTDOWN so nothing leaks). A sim runs once.
 */
tp_status tp_sim_run(tp_sim *sim, tp_sim_program program, void *arg, int *exit_codes);

/*
 * The oracle (SIM-9): checks every run, whatever its faults, against rules
 * that hold under any of them: every call ends exactly once and its future
 * completes once with the same status; no call times out before its
 * deadline or ends later than 1 ms after it; no function runs twice for one
 * call; a call that ends with its function's answer was served by the host
 * it went to; no function runs on a worker that took part in a graceful
 * shutdown whose drain returned TP_OK or TP_EPEERDOWN; a graceful shutdown
 * returns within twice its timeout; no more than 200,000 steps happen at
 * one virtual instant (a busy loop); while no host has died, no owner frees
 * a value that a running worker still holds a reference to (RREF-3..6). Checked at each step and after the run.
 * The number of violations, and the first one as
 * "t=<ns> ns, event <n>: <what>" ("" when none). Each is a trace line too.
 */
uint64_t tp_sim_violations(const tp_sim *sim);
const char *tp_sim_violation(const tp_sim *sim);

/* How often each kind of fault actually happened in a run, so an experiment
 * can tell a fault that was planned from one that fired. */
typedef enum tp_sim_fault_kind {
    TP_SIM_FAULT_DELAY = 0,     /* a frame took longer because of a delay window */
    TP_SIM_FAULT_BREAK,         /* a break fault broke a connection */
    TP_SIM_FAULT_PARTITION,     /* a partition began between two hosts */
    TP_SIM_FAULT_PARTITION_HELD, /* a frame waited for a partition to heal */
    TP_SIM_FAULT_STALL_BREAK,   /* a partition outlasted the user timeout and broke a connection */
    TP_SIM_FAULT_KILL,          /* a host died (kill or crash_self) */
    TP_SIM_FAULT_DROP,          /* a frame was lost (and its connection broke) */
    TP_SIM_FAULT_FAILSEND,      /* a frame of a listed type failed to send (failsend) */
    TP_SIM_FAULT_PAUSE,         /* a host was paused (slow, not dead) */
    TP_SIM_FAULT_CHAOS_DROP,    /* chaos mode: a frame vanished, its connection intact */
    TP_SIM_FAULT_CHAOS_DUP,     /* chaos mode: a frame was delivered twice */
    TP_SIM_FAULT_CHAOS_REORDER, /* chaos mode: a frame was held back past later ones */
    TP_SIM_FAULT_STORE_DOWN,    /* a store operation failed: the store was down (storedown) */
    TP_SIM_FAULT_STORE_SLOW,    /* a store operation was slowed (storeslow) */
    TP_SIM_FAULT_RESTART,       /* a dead worker was restarted as a new incarnation (restart) */
    TP_SIM_FAULT_KINDS_
} tp_sim_fault_kind;
uint64_t tp_sim_fault_count(const tp_sim *sim, tp_sim_fault_kind kind);
const char *tp_sim_fault_kind_name(tp_sim_fault_kind kind);
/* 1 when host (a slot: ranks first, then one per restart) has died (killed
 * or crashed) so far; 0 otherwise. */
int tp_sim_host_dead(const tp_sim *sim, uint32_t host);
/* 1 when rank's newest incarnation has died (a restart brings it back). */
int tp_sim_rank_dead(const tp_sim *sim, uint32_t rank);
/* The host slot that runs rank's newest incarnation; UINT32_MAX for no rank. */
uint32_t tp_sim_rank_host(const tp_sim *sim, uint32_t rank);

/* The trace hash (64 bits, folded word by word over the canonical trace's
 * records, SIM-6). */
uint64_t tp_sim_trace_hash(const tp_sim *sim);
uint64_t tp_sim_events(const tp_sim *sim);  /* events processed */
uint64_t tp_sim_now_ns(const tp_sim *sim);  /* the virtual clock */
uint64_t tp_sim_messages(const tp_sim *sim); /* messages delivered */

/* ---- Inside a program ---------------------------------------------------- */

/* The running simulation and host of the calling task; NULL/-1 outside one. */
tp_sim *tp_sim_current(void);
int tp_sim_current_host(void);
/* The calling host's incarnation: 0 for the hosts the run began with, k for
 * the k-th restart of a rank (its program should init with rejoin). */
uint32_t tp_sim_incarnation(void);
/* The workload random stream (seeded), for scenario programs. */
uint64_t tp_sim_random(void);
/* The calling task's host dies now, as tp_sim_fault_kill (never returns to
 * the scheduler's other work first; returns so the program can unwind). */
void tp_sim_crash_self(void);
/* Parks the calling task for seconds of virtual time (0..1e9), with or
 * without a worker (a program that has not called tp_init_rpc yet, or is
 * inside it on another task); TP_ESHUTDOWN when its host or the world ends
 * first. */
tp_status tp_sim_sleep(double seconds);
/* Appends a line to the trace (a scenario's own checkpoints). */
void tp_sim_trace_note(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif /* TENSORPLAY_SIM_H */
