/*
 * tpsim.h: the pieces of the tpsim fault-experiment tool (tools/README.md).
 *
 * tpsim.c parses the command line, builds the simulation, runs one scenario
 * on every simulated host and prints the summary. tpsim_scenarios.c holds the
 * scenario table and the per-worker scenario bodies; tpsim_functions.c the
 * functions every simulated worker serves. Checks are recorded through
 * tpsim_check so each one prints a PASS/FAIL line and lands in the trace.
 *
 * Everything here runs in one OS thread: the simulator's hosts are
 * cooperative tasks, so the shared counters below need no locking.
 */
#ifndef TPSIM_H
#define TPSIM_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tensorplay/sim.h"

/* Every simulated worker's rpc timeout, in seconds. */
#define TPSIM_RPC_TIMEOUT_S 30.0
/* A prompt failure (peer-down) must arrive within this much virtual time. */
#define TPSIM_PROMPT_NS (100u * 1000u * 1000u)
/* "Fails at once": a call to a known-dead worker must fail within this. */
#define TPSIM_AT_ONCE_NS (1000u * 1000u)

typedef struct tpsim_scenario {
    const char *name;
    const char *about;    /* one line for --help */
    uint32_t workers_min; /* fewer workers are rejected on the command line */
    uint32_t workers_default;
    /* Adds the scenario's own faults to the simulation before it runs; NULL: none. */
    tp_status (*setup)(tp_sim *sim, uint32_t workers);
    /* Runs on every worker between a successful init and the graceful shutdown. */
    void (*body)(int rank, int world);
    /* Checks after shutdown returned on a surviving worker; NULL: none. */
    void (*after_shutdown)(int rank, int world);
    /* The exit code each host is expected to end with (137: killed); NULL: all 0. */
    int (*expect_exit)(int rank, int world);
    /* Checks in main after the run (shared counters); NULL: none. */
    void (*finish)(int world);
} tpsim_scenario;

/* The scenario table, in --list order. */
extern const tpsim_scenario tpsim_scenarios[];
extern const size_t tpsim_scenario_count;

/* The scenario of that name, or NULL. */
const tpsim_scenario *tpsim_scenario_find(const char *name);

/*
 * The program every simulated host runs (a tp_sim_program): registers the
 * functions, initialises worker "w<rank>", runs the scenario's body, shuts
 * down gracefully. arg is the tpsim_scenario. Returns 0, or 1 when a check
 * on this host failed.
 */
int tpsim_program(int rank, int world, void *arg);

/*
 * Records one check: prints "PASS <what>" or "FAIL <what>" (what is
 * printf-formatted; prefix it with the worker), and puts the same line into
 * the trace when called inside the simulation. Returns ok.
 */
int tpsim_check(int ok, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Prints an informational line (not a check) and notes it in the trace. */
void tpsim_info(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Checks passed and failed so far; failures of one host (rank < world). */
uint64_t tpsim_checks_passed(void);
uint64_t tpsim_checks_failed(void);
uint32_t tpsim_host_failures(int rank);

/* `tpsim swarm ...` (tpsim_swarm.c): argv[0] is "swarm". Returns the exit status. */
int tpsim_swarm_main(int argc, char **argv);
/* One swarm world decoded from bytes (spec/sim.md SIM-14); a failure is
 * reported on out. Returns 1 when the world failed, else 0. */
int tpsim_swarm_bytes(const uint8_t *data, size_t len, FILE *out);

/* `tpsim --workload FILE ...` (tpsim_workload.c): runs a workload file. */
int tpsim_workload_main(const char *path, uint32_t workers_given, uint64_t seed,
                        const char *faults_path, const char *trace_path);

/* ---- Operations of swarm runs and workload files (tpsim_ops.c) ----------- */

typedef enum tpsim_op {
    TPSIM_OP_SYNC_ADD,  /* rpc_sync add(a, b) */
    TPSIM_OP_ASYNC_ADD, /* rpc_async add(a, b) */
    TPSIM_OP_SLOW,      /* rpc_async slow_add(a, b, delay) */
    TPSIM_OP_FORWARD,   /* rpc_async relay: slow_add on a third worker */
    TPSIM_OP_ECHO,      /* rpc_async echo(bytes) */
    TPSIM_OP_FAIL,      /* rpc_sync of a function that fails */
    TPSIM_OP_UNKNOWN,   /* rpc_sync of a function nobody has */
    TPSIM_OP_REMOTE,    /* remote add(a, b), then to_here */
    TPSIM_OP_FORGET,    /* rpc_async slow_add, the future freed at once */
    TPSIM_OP_SHARE,     /* remote add(a, b), the rref passed to a third worker that fetches it,
                           released here at once (the rref protocol's forks, RREF-5/6) */
    /* The rest of the API (tpsim_callbacks.c), each callback counted by the oracle: */
    TPSIM_OP_THEN,      /* rpc_async add(a, b), then a callback that issues add(a + b, 1) to a
                           third worker, its outcome seen by a done-callback (FUTURE-5, 10) */
    TPSIM_OP_USER,      /* a user future completed by a done-callback of rpc_async add (FUTURE-9) */
    TPSIM_OP_COLLECT,   /* collect_all of two or three rpc_async adds (FUTURE-11) */
    TPSIM_OP_LATER,     /* later_add: the callee answers later with a then of its own call to a
                           third worker (FUNC-7) */
    TPSIM_OP_METHOD,    /* remote make_counter(a), then the rref's Counter.add(b) (METHOD-4) */
    TPSIM_OP_LIVENESS,  /* the liveness phase's echo */
    TPSIM_OP_KINDS
} tpsim_op;
extern const char *const tpsim_op_names[TPSIM_OP_KINDS];

/* Outcome columns of the summaries. */
enum {
    TPSIM_OUT_OK,
    TPSIM_OUT_TIMEOUT,
    TPSIM_OUT_PEERDOWN,
    TPSIM_OUT_EIO,
    TPSIM_OUT_REMOTE,
    TPSIM_OUT_OTHER,
    TPSIM_OUT_KINDS
};
extern const char *const tpsim_out_names[TPSIM_OUT_KINDS];
int tpsim_outcome_of(tp_status st);

#define TPSIM_FAIL_TEXT_MAX 600
/* Every call of the chaos phase must have ended this long after it. */
#define TPSIM_LIVENESS_WAIT_S 120.0
/* The liveness echo's timeout, retried within the bound while pools finish
 * work whose callers gave up. */
#define TPSIM_LIVENESS_CALL_S 10.0
#define TPSIM_LIVENESS_BOUND_S 300.0

/* tpsim_rrefs_settle's times: under 10 ms, 100 ms, 1 s, 10 s, 60 s. */
#define TPSIM_SETTLE_BUCKETS 5

/* One simulated world's shared state (its hosts run in this one thread). */
typedef struct tpsim_world {
    tp_sim *sim;
    uint32_t settled; /* workers past the liveness barrier */
    int failed;
    char first[TPSIM_FAIL_TEXT_MAX + 32]; /* the first failure, with its time */
    uint64_t ops[TPSIM_OP_KINDS][TPSIM_OUT_KINDS];
    uint64_t (*line_outs)[TPSIM_OUT_KINDS]; /* workload files: outcomes per line, or NULL */
    int ping_liveness; /* liveness calls the library's tp:ping, not tpsim's echo */
    struct tpsim_cb_rec *cbs; /* callback records (tpsim_callbacks.c), freed with the world */
    uint64_t settle_hist[TPSIM_SETTLE_BUCKETS]; /* tpsim_rrefs_settle's times, by bucket */
} tpsim_world;

/* Records a failure (printf-style): counted, noted in the trace, the first kept. */
void tpsim_world_fail(tpsim_world *w, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void tpsim_world_vfail(tpsim_world *w, const char *fmt, va_list ap);
int tpsim_self_dead(void);

/* What to issue. */
typedef struct tpsim_op_spec {
    tpsim_op op;
    int dst;
    double timeout_s;       /* TP_TIMEOUT_DEFAULT allowed; 0: none */
    double fetch_timeout_s; /* remote: to_here's */
    int64_t a, b;           /* operands: the answer is a + b */
    int64_t delay_us;       /* slow, forget, forward: the function's sleep */
    int relay_to;           /* forward, share: the third worker */
    double relay_timeout_s; /* forward: the nested call's; share: the to_here's (finite) */
    uint64_t tag;           /* echo: the payload's pattern */
    size_t len;             /* echo: the payload's bytes */
    int sync;               /* wait for the answer here (rpc_sync) */
    int must_succeed;       /* anything but TP_OK is a failure */
    int line;               /* workload files: the line it comes from (1..), 0: none */
} tpsim_op_spec;

#define TPSIM_COLLECT_MAX 3

/* A call still in flight, or the record of one that ended. */
typedef struct tpsim_pending {
    tp_future *f; /* NULL once checked */
    tpsim_op op;
    int dst;
    int64_t expect; /* the int answer, or the payload's tag */
    size_t len;
    int must_succeed;
    int line;
    struct tpsim_cb_rec *rec; /* then, user: what its callbacks did */
    /* collect: the futures it collects, each an add to its own worker */
    tp_future *subs[TPSIM_COLLECT_MAX];
    int sub_dst[TPSIM_COLLECT_MAX];
    int64_t sub_expect[TPSIM_COLLECT_MAX];
    int nsubs;
} tpsim_pending;

/* Registers tpsim's functions and echo, relay and fail. */
tp_status tpsim_ops_register(void);
/* Registers the functions and initialises worker "w<rank>" on SIM with that
 * default timeout, pool (0: default) and window (0: default), and 60 s for
 * init and shutdown. */
/* The same without registering tpsim's functions (an experiment registers its own). */
tp_status tpsim_worker_init(int rank, int world, double rpc_timeout_s, int pool, uint64_t window);
tp_status tpsim_worker_start(int rank, int world, double rpc_timeout_s, int pool,
                             uint64_t window);
/* Graceful shutdown, which must return TP_OK, or TP_EPEERDOWN when a worker
 * died (SHUTDOWN-8); anything else is recorded as a failure. Returns what
 * tp_shutdown returned, or TP_ESHUTDOWN when this host was killed. */
tp_status tpsim_worker_shutdown(tpsim_world *w, int rank, int world);
/* A payload of len bytes that depends on tag. */
tp_value *tpsim_payload(uint64_t tag, size_t len);
/* Issues s; a call left in flight lands in *p (p->f set), one that ended is checked. */
void tpsim_op_start(tpsim_world *w, int me, const tpsim_op_spec *s, tpsim_pending *p);
/* Checks one outcome (value: the answer when st is TP_OK). */
void tpsim_check_outcome(tpsim_world *w, int me, const tpsim_pending *p, tp_status st,
                         const tp_value *value, const char *err);
/* Waits for each call (within TPSIM_LIVENESS_WAIT_S) and checks it. */
void tpsim_settle(tpsim_world *w, int me, tpsim_pending *pend, size_t n);
/* The liveness barrier, then an echo to every other live worker that must succeed. */
void tpsim_liveness(tpsim_world *w, int me, int world);
/* Issue 9's timed liveness: once the heal is over and every call has ended,
 * the worker's rref counters (tp_get_debug_info) return to zero within
 * TPSIM_RREF_SETTLE_S of virtual time: every released value freed, every
 * fork, child and protocol message settled. For workloads that keep no
 * rref across the heal (the swarm's). */
#define TPSIM_RREF_SETTLE_S 60.0
void tpsim_rrefs_settle(tpsim_world *w, int me);

/* Registers every function tpsim's workers serve, on the current worker. */
tp_status tpsim_register_functions(void);

/* ---- Callbacks, user futures, collect_all, answer-later, methods --------- */
/* (tpsim_callbacks.c) The oracle of callbacks: each then- and done-callback
 * the workload registers runs exactly once, and a graceful shutdown that
 * returned TP_OK waited for the calls they issued (SHUTDOWN-5, FUTURE-5/10);
 * after any other end, at most once. */

/* What one operation's callbacks did (the world owns it). */
typedef struct tpsim_cb_rec {
    struct tpsim_cb_rec *next;
    tpsim_world *w;
    int me;                 /* the worker that registered the callbacks */
    uint32_t incarnation;   /* of that worker (a restart registers its own) */
    tpsim_op op;
    int late;               /* registered just before shutdown: must run before it ends */
    int dst2;               /* then: where the callback's own call goes */
    double nested_timeout_s;
    int64_t sleep_us;       /* then: the callback sleeps this long before its call */
    uint32_t then_runs;     /* then-callback (then) or done-callback (user) runs */
    uint32_t nested_issued; /* then: the callback's call was issued (and a done-callback added) */
    uint32_t nested_done;   /* then: that call's done-callback runs */
    tp_status nested_status;
    int64_t expect;         /* the value the callback's call must answer */
    tp_future *user;        /* user: the future its done-callback completes; NULL once dropped */
} tpsim_cb_rec;

/* Registers later_add (FUNC-7). */
tp_status tpsim_callbacks_register(void);
/* Issues a then, user, collect, later or method operation, like tpsim_op_start. */
void tpsim_cb_op_start(tpsim_world *w, int me, const tpsim_op_spec *s, tpsim_pending *p);
/* A then on a slow_add to dst, left running into shutdown (its record is
 * late); its callback sleeps sleep_us, then calls dst2 with nested_timeout_s
 * (finite: a pool thread's call may wait for window space). */
void tpsim_cb_late_then(tpsim_world *w, int me, int dst, int dst2, double timeout_s,
                        double nested_timeout_s, int64_t delay_us, int64_t sleep_us);
/* Settles a collect's futures (its own future completed or gave up). */
void tpsim_cb_settle_collect(tpsim_world *w, int me, tpsim_pending *p);
/* The exactly-once checks of me's records, after its shutdown returned st. */
void tpsim_callbacks_check(tpsim_world *w, int me, tp_status st);
/* Frees the world's records (after the run: no callback can run then). */
void tpsim_callbacks_free(tpsim_world *w);

/* ---- State shared by the functions and the scenarios (one thread). ------ */

typedef struct tpsim_shared {
    /* Counter objects (remote): created by make_counter, destroyed when freed. */
    uint64_t counters_created;
    uint64_t counters_destroyed;
    /* Served calls of slow_add and forward (shutdown_load): begun and ended. */
    uint64_t handlers_begun;
    uint64_t handlers_ended;
    /* worker_death: slow calls that reached the victim before it crashes. */
    uint32_t victim_arrivals;
    uint32_t victim_arrivals_expected;
    uint64_t crash_ns; /* virtual time of tp_sim_crash_self; 0 before */
    /* Lifecycle, summed over workers by tpsim_program. */
    uint32_t inits_ok;
    uint32_t inits_cut; /* killed hosts whose init their death ended */
    uint32_t shutdowns_ok;    /* graceful shutdowns that returned TP_OK on survivors */
    uint64_t shutdown_ns_max; /* the longest graceful shutdown, virtual ns */
} tpsim_shared;

extern tpsim_shared tpsim_state;

/* 1 when a --trace path asks for Perfetto's JSON (it ends in ".json"). */
int tpsim_trace_is_json(const char *path);

/* Virtual time now, in ns (inside the simulation). */
uint64_t tpsim_now_ns(void);

/* The worker name tpsim uses for a rank: "w<rank>" into buf. */
void tpsim_worker_name(int rank, char *buf, size_t len);

#endif
