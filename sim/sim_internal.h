/*
 * sim_internal.h: the deterministic simulator's internals (spec/sim.md).
 *
 * One thread runs everything. A virtual clock jumps from event to event; the
 * events sit in one binary heap ordered by (time, insertion sequence), so two
 * runs with the same seed and the same fault plan process the same events in
 * the same order (SIM-1, SIM-3, SIM-7). Simulated tasks are ucontext fibers
 * that run only when the scheduler resumes them and give control back only
 * when they park, wait or return; so nothing in here needs a lock.
 *
 * Objects that events point at (tasks, agents) are named by id, never by
 * pointer: an event can outlive what it names, and a stale id resolves to
 * NULL. Ids are handed out in creation order, which is deterministic.
 */
#ifndef TPI_SIM_INTERNAL_H
#define TPI_SIM_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <ucontext.h>

#include "common/errors.h"
#include "common/limits.h"
#include "tensorplay/rpc_backend.h"
#include "tensorplay/sim.h"

/* ---- Limits ---------------------------------------------------------------- */

/* Hosts in one simulation: each has a context and a main task stack (mapped
 * lazily); the bound keeps the per-host tables small. */
#define TPI_SIM_HOSTS_MAX 4096u
/* Restarts in one simulation (REJOIN, SIM-5 "restart"): each takes a host
 * slot past the initial ones, so a restarted worker is a new machine with
 * a new address, as a restarted process is. */
#define TPI_SIM_RESTARTS_MAX 64u
/* Defaults of tp_sim_config (sim.h). */
#define TPI_SIM_LATENCY_MIN_DEFAULT_NS 20000u
#define TPI_SIM_LATENCY_JITTER_DEFAULT_NS 30000u
#define TPI_SIM_TIME_LIMIT_DEFAULT_NS (3600ull * 1000000000ull)
#define TPI_SIM_STACK_SIZE_DEFAULT ((size_t)256 * 1024)
/* The smallest stack we accept: the core keeps 1 KiB message buffers on it. */
#define TPI_SIM_STACK_SIZE_MIN ((size_t)64 * 1024)
/* Sanitizers need several times the stack (redzones, no frame sharing). */
#ifdef TP_SANITIZE
#define TPI_SIM_STACK_SANITIZE_FACTOR 4u
#else
#define TPI_SIM_STACK_SANITIZE_FACTOR 1u
#endif
/* Unwinding after a deadlock or the time limit: rounds of waking every parked
 * task with TP_ESHUTDOWN, and events each round may take, before we give up
 * on tasks that refuse to return (they are then freed where they stand). */
#define TPI_SIM_UNWIND_ROUNDS_MAX 64u
#define TPI_SIM_UNWIND_EVENTS_MAX 1000000u
/* A park that fails with TP_ESHUTDOWN still yields, so the host's other
 * tasks run and wind down too. A task that keeps parking in a dying world is
 * polling: after this many such parks in a row each one also lets virtual
 * time pass (up to its deadline, at most the poll interval), so a poll loop
 * reaches its own deadline instead of spinning at one instant. */
#define TPI_SIM_SHUTDOWN_SPINS 64u
#define TPI_SIM_SHUTDOWN_POLL_NS 1000000u
/* A connection whose frames cannot get through (a partition) breaks after
 * this long, as the TCP transport's TCP_USER_TIMEOUT makes it (spec/tcp.md);
 * a partition that heals sooner delivers the frames late instead. */
#define TPI_SIM_USER_TIMEOUT_NS (45ull * 1000000000ull)
/* Stacks of ended tasks kept for reuse (sim_task.c), in bytes of mapping
 * (guard page and fiber header included), for the whole process: a new task
 * takes the stack a task last gave back, so a world maps and faults in no
 * new pages when one as large ran before it. The stacks kept never outnumber
 * the most tasks alive at once (a stack is mapped only when none is free),
 * so this bound matters only for the largest worlds: it is about 3,970
 * stacks at the default stack size (264 KiB each with guard and header),
 * every stack of a world of up to about 2,400 workers like the benchmark's
 * (at most about 1.65 tasks alive a worker), and about 1,000 in a
 * TP_SANITIZE build. Mostly address space: only the pages tasks touched stay
 * resident (4 a stack in the benchmark's worlds, so 26 MiB kept after a
 * 1,000-worker world and 62 MiB at the bound; the whole bound only if every
 * stack had been used to its end). The process's exit unmaps them. */
#define TPI_SIM_STACK_CACHE_BYTES ((size_t)1 << 30)
/* The chaos mode holds a reordered or duplicated frame back by up to this. */
#define TPI_SIM_CHAOS_JITTER_NS 10000000ull
/* Message types the per-type faults know (wire.md: 1..8), plus the unused 0. */
#define TPI_SIM_MSG_TYPES 9u
/* Faults of one kind in a simulation (delay windows are scanned per send). */
#define TPI_SIM_DELAYS_MAX 4096u
/* The oracle (SIM-9). Timeouts fire exactly at their deadline on the
 * simulator; the slack only absorbs events due at the same instant. */
#define TPI_SIM_ORACLE_SLACK_NS 1000000ull
/* Lock acquisitions plus events at one virtual instant before the oracle
 * calls it a busy loop. The busiest legitimate instants (a thousand calls
 * issued at once, 64 workers' init) stay well below it. */
#define TPI_SIM_INSTANT_WORK_MAX 200000u
/* Bytes of one trace line, prefix and newline included (notes are cut). */
#define TPI_SIM_TRACE_LINE_MAX (TP_ERRMSG_LEN_MAX + 256)

_Static_assert(TPI_SIM_HOSTS_MAX <= TP_WORLD_SIZE_MAX, "a host runs at most one worker");
_Static_assert(TPI_SIM_STACK_SIZE_DEFAULT >= TPI_SIM_STACK_SIZE_MIN, "default within min");

/* ---- PRNG (SIM-2): xoshiro256** seeded through splitmix64 ------------------- */

typedef struct tpi_sim_prng {
    uint64_t s[4];
} tpi_sim_prng;

/* The independent streams drawn from one seed. */
enum {
    TPI_SIM_STREAM_NETWORK = 1, /* latency jitter */
    TPI_SIM_STREAM_FAULTS = 2,  /* message loss */
    TPI_SIM_STREAM_WORKLOAD = 3 /* tp_sim_random */
};

/* Seeds stream number `stream` of `seed`: different streams never share state. */
void tpi_sim_prng_seed(tpi_sim_prng *p, uint64_t seed, uint64_t stream);
uint64_t tpi_sim_prng_next(tpi_sim_prng *p);
/* Uniform in [0, n) without modulo bias; n > 0. */
uint64_t tpi_sim_prng_below(tpi_sim_prng *p, uint64_t n);
/* One splitmix64 step: also the simulator's integer mixer. */
uint64_t tpi_sim_splitmix64(uint64_t *state);

/* ---- Events (SIM-3) ----------------------------------------------------------- */

typedef enum tpi_sim_event_kind {
    TPI_SIM_EV_RESUME = 1,      /* a: task id; x: the task's wake sequence */
    TPI_SIM_EV_PARK_TIMEOUT,    /* a: task id; x: the park sequence it belongs to */
    TPI_SIM_EV_TIMER,           /* a: agent id; x: the arm sequence */
    TPI_SIM_EV_DELIVER,         /* p: tpi_sim_msg */
    TPI_SIM_EV_PEER_DOWN,       /* a: agent id; b: rank; c: why; d: detail; x: about host */
    TPI_SIM_EV_BREAK,           /* a, b: hosts */
    TPI_SIM_EV_PARTITION_START, /* a, b: hosts; x: its end */
    TPI_SIM_EV_PARTITION_END,   /* a, b: hosts */
    TPI_SIM_EV_KILL,            /* a: host */
    TPI_SIM_EV_STALL_BREAK,     /* a, b: hosts; x: the connection epoch it ends */
    TPI_SIM_EV_PAUSE,           /* a: host; x: its end */
    TPI_SIM_EV_UNPAUSE,         /* a: host */
    TPI_SIM_EV_RESTART          /* a: rank */
} tpi_sim_event_kind;

typedef struct tpi_sim_event {
    uint64_t time_ns;
    uint64_t seq; /* insertion order: breaks ties between equal times */
    uint32_t kind;
    uint32_t a, b, c, d;
    uint64_t x;
    void *p;
} tpi_sim_event;

typedef struct tpi_sim_heap {
    tpi_sim_event *ev;
    size_t len, cap;
    uint64_t next_seq;
} tpi_sim_heap;

/* Pushes e (its seq is assigned here); TP_ENOMEM when the heap cannot grow. */
tp_status tpi_sim_heap_push(tpi_sim_heap *h, tpi_sim_event *e);
/* Pops the smallest (time, seq) into *out; 0 when empty. */
int tpi_sim_heap_pop(tpi_sim_heap *h, tpi_sim_event *out);
/* The smallest event, or NULL when empty. */
const tpi_sim_event *tpi_sim_heap_peek(const tpi_sim_heap *h);
void tpi_sim_heap_free(tpi_sim_heap *h);

/* ---- Tasks (fibers) --------------------------------------------------------- */

typedef enum tpi_sim_task_kind {
    TPI_SIM_TASK_MAIN = 0,     /* a host's program */
    TPI_SIM_TASK_POOL = 1,     /* an executor task of an agent's pool */
    TPI_SIM_TASK_TEARDOWN = 2, /* frees a host's context after the run */
    TPI_SIM_TASK_AUX = 3,      /* spawned by tests and scenarios */
    TPI_SIM_TASK_SCHED = 4     /* the scheduler's stand-in token, never a fiber */
} tpi_sim_task_kind;

typedef enum tpi_sim_task_state {
    TPI_SIM_RUNNABLE = 1, /* a resume event is pending */
    TPI_SIM_RUNNING,
    TPI_SIM_PARKED,  /* in park: woken by unpark, its deadline, or shutdown */
    TPI_SIM_WAITING, /* an internal wait (stop draining the pool) */
    TPI_SIM_IDLE,    /* a pool task with no work */
    TPI_SIM_EXITED
} tpi_sim_task_state;

typedef struct tpi_sim_host tpi_sim_host;
typedef struct tpi_sim_agent tpi_sim_agent;
typedef struct tpi_sim_task tpi_sim_task;
/* A stack and the state of the fiber running on it (sim_task.c). */
typedef struct tpi_sim_fiber tpi_sim_fiber;

struct tpi_sim_task {
    uint32_t id;
    tpi_sim_task_kind kind;
    tpi_sim_task_state state;
    tpi_sim_host *host;
    void (*fn)(void *arg);
    void *arg;
    uint64_t wake_seq;                   /* bumped by each wake: older resume events are stale */
    uint64_t park_seq;                   /* bumped by each park: older timeouts are stale */
    int unpark_pending;                  /* an unpark came while not parked */
    uint32_t shutdown_parks;             /* parks in a row that failed with TP_ESHUTDOWN */
    tp_status wake_status;               /* what the pending park returns */
    tpi_sim_agent *park_agent;           /* the agent parked on (stop wakes its parkers) */
    tpi_sim_agent *pool_agent;           /* for pool tasks */
    tpi_sim_task *host_prev, *host_next; /* the host's live tasks, creation order */
    tpi_sim_task *idle_next;             /* the pool's idle FIFO */
    tpi_sim_fiber *fiber;                /* its stack and switch state (sim_task.c) */
    int started;                         /* entered once */
    void *asan_fake_stack;
    char errmsg[TP_ERRMSG_LEN_MAX]; /* this task's tp_errmsg() */
};

/*
 * A new task on host running fn(arg), scheduled to start now (after what is
 * already due now). TP_ENOMEM when the stack or struct cannot be had.
 */
tp_status tpi_sim_task_spawn(tp_sim *sim, tpi_sim_host *host, tpi_sim_task_kind kind,
                             void (*fn)(void *arg), void *arg, tpi_sim_task **out);
/* Runs t until it yields (scheduler only). Frees it when it has returned. */
void tpi_sim_task_resume(tp_sim *sim, tpi_sim_task *t);
/* The running task gives control back (state already set by the caller). */
void tpi_sim_task_yield(tp_sim *sim);
/* Makes a parked/waiting/idle task runnable now; status is what park returns. */
void tpi_sim_task_wake(tp_sim *sim, tpi_sim_task *t, tp_status status);
/* Parks the running task until woken or deadline_ns (UINT64_MAX: none). */
tp_status tpi_sim_task_park(tp_sim *sim, tpi_sim_task *t, uint64_t deadline_ns);
/* Frees a task that has not returned (the end of a failed unwind). */
void tpi_sim_task_destroy(tp_sim *sim, tpi_sim_task *t);
/* The task with that id, or NULL when it is gone. */
tpi_sim_task *tpi_sim_task_get(tp_sim *sim, uint32_t id);
/* Wakes every parked task of host (every host when NULL) with status. */
void tpi_sim_wake_parked(tp_sim *sim, tpi_sim_host *host, tp_status status);
const char *tpi_sim_task_kind_name(tpi_sim_task_kind kind);

/* ---- Network (SIM-4) ---------------------------------------------------------- */

/* One direction of a pair of hosts; the entry of (min, max) also holds the
 * connection's state, shared by both directions. */
typedef struct tpi_sim_link {
    uint32_t dst;
    uint64_t last_arrival_ns; /* FIFO: no message overtakes an earlier one */
    uint64_t epoch;           /* bumped by each break: older messages are lost */
    uint32_t partitions;      /* partitions in force (they may overlap) */
    uint64_t partition_end_ns; /* the latest end of those in force (UINT64_MAX: never) */
    uint64_t stall_epoch;     /* epoch + 1 whose stall break is scheduled, 0: none */
    uint64_t tx_free_ns;      /* bandwidth: when this direction finishes its last frame */
} tpi_sim_link;

/* A link rule from a plan (latency or bandwidth), for FROM -> TO; a host of
 * UINT32_MAX matches every host. The last matching rule of a kind wins. */
typedef enum { TPI_SIM_DIST_FIXED, TPI_SIM_DIST_UNIFORM, TPI_SIM_DIST_LONGTAIL } tpi_sim_dist;
typedef struct tpi_sim_link_rule {
    uint32_t from, to;
    int bandwidth;       /* 1: a bandwidth rule; 0: a latency rule */
    tpi_sim_dist dist;   /* latency: how it is drawn in [min, max] */
    uint64_t min_ns, max_ns;
    uint64_t bits_per_s; /* bandwidth */
} tpi_sim_link_rule;

/* A message in flight. The frame stays the sender's until delivery. */
typedef struct tpi_sim_msg {
    uint64_t id;
    tp_frame *frame;
    uint32_t src_host, dst_host;
    uint32_t src_rank, dst_rank;
    uint32_t src_agent; /* id */
    uint64_t epoch;     /* of the connection when sent */
    int doomed;         /* chosen for loss: 1 by the drop fault, 2 by failsend */
} tpi_sim_msg;

/* Why a peer-down upcall happens: formatted into its detail text. */
typedef enum tpi_sim_detail {
    TPI_SIM_DETAIL_KILLED = 1,
    TPI_SIM_DETAIL_BREAK,
    TPI_SIM_DETAIL_PARTITION,
    TPI_SIM_DETAIL_LOSS,
    TPI_SIM_DETAIL_BAD_FRAME,
    TPI_SIM_DETAIL_REFUSED,
    TPI_SIM_DETAIL_STOPPED,
    TPI_SIM_DETAIL_STALLED,
    TPI_SIM_DETAIL_NO_MEMORY /* the receiver had no memory for a frame (as TCP: the stream ends) */
} tpi_sim_detail;

/* The link src -> dst, created on first use; NULL on exhaustion. */
tpi_sim_link *tpi_sim_link_get(tp_sim *sim, uint32_t src, uint32_t dst);
/* The link src -> dst if it was ever used, else NULL. */
tpi_sim_link *tpi_sim_link_find(const tp_sim *sim, uint32_t src, uint32_t dst);
/* agent->ops->send (AGENT-8). */
tp_status tpi_sim_net_send(tpi_sim_agent *a, uint32_t dst_rank, tp_frame *f);
void tpi_sim_net_deliver(tp_sim *sim, tpi_sim_msg *m);
/* Frees a message never delivered (end of run). */
void tpi_sim_msg_free(tpi_sim_msg *m);
/* Breaks the connection a-b now: in-flight messages are lost, both ends get
 * peer-down TP_EIO with detail. */
void tpi_sim_net_break(tp_sim *sim, uint32_t a, uint32_t b, tpi_sim_detail detail);
/* Schedules peer-down upcalls at at_ns on host's agent for every rank it maps
 * to host `about`. */
void tpi_sim_net_peer_down(tp_sim *sim, uint32_t host, uint32_t about, tp_status why,
                           tpi_sim_detail detail, uint64_t at_ns);
/* The worker on host stopped (AGENT-5): every host connected to it gets
 * peer-down TP_EPEERDOWN, after the frames it already sent there. */
void tpi_sim_net_closed(tp_sim *sim, uint32_t host);
/* The extra delay the delay faults give a message sent now from -> to. */
uint64_t tpi_sim_fault_delay_ns(tp_sim *sim, uint32_t from, uint32_t to);
/* Store faults now: the extra time a store operation takes (storeslow), and
 * the end of the store outage it falls in (storedown; 0: the store is up). */
uint64_t tpi_sim_store_slow_ns(const tp_sim *sim);
uint64_t tpi_sim_store_down_until(const tp_sim *sim);
/* Virtual ns of [from, to) during which host was paused (the oracle's allowance
 * for a host whose own timers could not fire while it was held). */
uint64_t tpi_sim_paused_ns(const tp_sim *sim, uint32_t host, uint64_t from, uint64_t to);
/* The host an event concerns, when a pause should hold it; UINT32_MAX: none. */
uint32_t tpi_sim_event_host(tp_sim *sim, const tpi_sim_event *e);
/* Rank's newest host is dead: a new host slot runs the program for it again
 * as the next incarnation (a restart fault); a no-op while it lives. */
void tpi_sim_host_restart(tp_sim *sim, uint32_t rank);
/* The host dies now (a kill fault or tp_sim_crash_self). */
void tpi_sim_host_kill(tp_sim *sim, tpi_sim_host *h, const char *how);
void tpi_sim_fault_event(tp_sim *sim, const tpi_sim_event *e);

/* ---- Agents (AGENT-1..13 on the simulator) ------------------------------------ */

/* Where upcalls go: the core's functions, or a test's. */
typedef struct tpi_sim_upcalls {
    void (*on_frame)(tp_core *core, uint32_t src, tp_frame *f);
    void (*on_peer_down)(tp_core *core, uint32_t peer, tp_status why, const char *detail);
    void (*on_timer)(tp_core *core);
} tpi_sim_upcalls;

/* An agent's view of the sim's shared store: a dead host reaches nothing,
 * the store included (a killed process writes no key). */
typedef struct tpi_sim_store_view {
    tp_store base; /* first: the core sees a tp_store */
    tpi_sim_agent *agent;
} tpi_sim_store_view;

struct tpi_sim_agent {
    tp_sim *sim;
    tpi_sim_store_view store_view;
    uint32_t id;
    uint32_t host;
    uint32_t rank;
    uint32_t world_size;
    uint64_t max_message_size;
    tp_core *core;
    const tpi_sim_upcalls *up;
    int started, stopping, stopped;
    const void *lock_holder; /* the task (or scheduler token) holding the lock */
    uint64_t timer_seq;      /* bumped by each arm: older timer events are stale */
    uint64_t timer_deadline_ns;
    /* Peers, from set_peers (npeers 0 before it): rank r lives on host r
     * unless a restart moved it; moved lists those ranks with their hosts,
     * ascending by rank (usually none), so an agent holds no table of n
     * hosts and news about a host finds its ranks without a look at every
     * rank (tpi_sim_peer_host). peer_dead: by rank, what this agent saw
     * die; NULL while it saw nothing die (tpi_sim_peer_dead). */
    uint32_t npeers;
    struct tpi_sim_moved *moved;
    uint32_t nmoved, moved_cap;
    uint8_t *peer_dead;
    /* The executor pool (AGENT-7). */
    uint32_t pool_max;
    uint32_t pool_live;   /* tasks created and not yet returned */
    uint32_t pool_busy;   /* tasks running a work item or about to look for one */
    uint32_t pool_waking; /* tasks woken (or created) that have not run yet */
    int pool_exit;
    tp_work *q_head, *q_tail;
    uint32_t q_len;
    tpi_sim_task *idle_head, *idle_tail;
    uint32_t parked;      /* tasks inside park on this agent */
    uint32_t stop_waiter; /* task id + 1 of the task in stop, 0 if none */
};

/* A rank not on its own host: where it lives now (tpi_sim_agent.moved). */
typedef struct tpi_sim_moved {
    uint32_t rank, host;
} tpi_sim_moved;

/* Where a's moved list has rank, or where it would go. */
static inline uint32_t tpi_sim_moved_slot(const tpi_sim_agent *a, uint32_t rank) {
    uint32_t lo = 0, hi = a->nmoved;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (a->moved[mid].rank < rank)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The host a's peer table puts rank on (rank < a->npeers). */
static inline uint32_t tpi_sim_peer_host(const tpi_sim_agent *a, uint32_t rank) {
    uint32_t i = tpi_sim_moved_slot(a, rank);
    return i < a->nmoved && a->moved[i].rank == rank ? a->moved[i].host : rank;
}

/* Whether a saw rank die (rank < a->npeers). */
static inline int tpi_sim_peer_dead(const tpi_sim_agent *a, uint32_t rank) {
    return a->peer_dead && a->peer_dead[rank];
}

extern const tp_agent_ops tpi_sim_agent_ops;
/* The "SIM" backend (common/backend_registry.c registers it). */
extern const tp_backend tpi_sim_backend;
extern const tpi_sim_upcalls tpi_sim_core_upcalls;

/*
 * A new agent for host (not started), with its id registered. Backend init
 * and tests use it; the store is the sim's (tpi_sim_store).
 */
tp_status tpi_sim_agent_create(tp_sim *sim, uint32_t host, uint32_t rank, uint32_t world_size,
                               uint32_t pool_max, uint64_t max_message_size, tpi_sim_agent **out);
tpi_sim_agent *tpi_sim_agent_get(tp_sim *sim, uint32_t id);
void tpi_sim_agent_timer_event(tp_sim *sim, const tpi_sim_event *e);
void tpi_sim_agent_peer_down_event(tp_sim *sim, const tpi_sim_event *e);
/* Upcall helpers: switch to the agent's host context around the call. */
void tpi_sim_upcall_frame(tpi_sim_agent *a, uint32_t src, tp_frame *f);
/* Wakes every task parked on a with TP_ESHUTDOWN. */
void tpi_sim_agent_wake_parkers(tpi_sim_agent *a);
/* The sim's shared store, opened on first use; NULL with a message on failure. */
tp_store *tpi_sim_store(tp_sim *sim, char *errmsg, size_t errmsg_len);

/* ---- Hosts and the world ------------------------------------------------------ */

struct tpi_sim_host {
    uint32_t index;
    uint32_t rank;        /* the program's rank: index, or the rank a restart took over */
    uint32_t incarnation; /* 0, or k for the k-th restart of that rank */
    tp_context *ctx;
    int dead;
    int returned;
    int exit_code;
    tpi_sim_task *main;
    tpi_sim_task *tasks_head, *tasks_tail; /* live tasks, creation order */
    uint32_t active_agent;                 /* agent id + 1 of the started agent, 0: none */
    tpi_sim_link *links;                   /* sorted by dst */
    uint32_t nlinks, links_cap;
    /* The hosts below this one that have a connection with it (their
     * links hold its entry), ascending: with the links above it, the
     * peers a close reaches, without a look at every host. */
    uint32_t *conn_lo;
    uint32_t nconn_lo, conn_lo_cap;
    uint64_t paused_until; /* a pause fault holds it until then; 0: running */
};

typedef struct tpi_sim_delay {
    uint32_t from, to;
    uint64_t start_ns, end_ns, extra_ns;
} tpi_sim_delay;

/* A pause fault: the host runs nothing in [start, end). */
typedef struct tpi_sim_pause {
    uint32_t host;
    uint64_t start_ns, end_ns;
} tpi_sim_pause;

/* A store fault: in [start, end) every store operation fails (down) or
 * first waits extra_ns (slow). */
typedef struct tpi_sim_store_fault {
    int down;
    uint64_t start_ns, end_ns, extra_ns;
} tpi_sim_store_fault;

struct tp_sim {
    tp_sim_config cfg; /* defaults filled in */
    uint64_t now_ns;
    uint64_t events;
    uint64_t messages;
    uint64_t trace_hash;
    uint64_t trace_lines;
    tpi_sim_prng net_rng, fault_rng, work_rng;
    tpi_sim_heap heap;
    tpi_sim_host *hosts;  /* cfg.hosts + TPI_SIM_RESTARTS_MAX slots */
    uint32_t nhosts;      /* slots in use: cfg.hosts plus the restarts so far */
    uint32_t hosts_dead;  /* hosts killed so far (dead is never cleared) */
    uint32_t *rank_host;  /* by rank: the slot of its newest incarnation */
    /* AGENT-19: the last list of addresses checked, by its id (0: none),
     * and what it gave: its ranks off their own host. */
    uint64_t peers_list_id;
    uint32_t peers_world, peers_nmoved;
    struct tpi_sim_moved *peers_moved;
    uint32_t restarts_planned;
    /* Id tables: slot i holds object id i, NULL once it is freed. */
    tpi_sim_task **tasks;
    uint32_t ntasks, tasks_cap;
    uint32_t live_tasks;
    tpi_sim_agent **agents;
    uint32_t nagents, agents_cap;
    tpi_sim_task *current;    /* the running task, NULL in the scheduler */
    tpi_sim_task sched_token; /* task_self() outside any task */
    int upcall_host;          /* host of the upcall being made, -1 none */
    char upcall_errmsg[TP_ERRMSG_LEN_MAX];
    ucontext_t sched_uc;
    const void *sched_stack_bottom; /* for the AddressSanitizer fiber calls */
    size_t sched_stack_size;
    uint32_t mains_live;
    uint32_t teardown_scan; /* hosts below it have no context left (sim_world.c) */
    int ran;
    int unwinding; /* parks fail with TP_ESHUTDOWN: the world is ending */
    uint64_t next_msg_id;
    tpi_sim_delay *delays;
    uint32_t ndelays, delays_cap;
    tpi_sim_pause *pauses;
    uint32_t npauses, pauses_cap;
    tpi_sim_store_fault *store_faults;
    uint32_t nstore_faults, store_faults_cap;
    tpi_sim_link_rule *rules;
    uint32_t nrules, rules_cap;
    uint64_t fired[TP_SIM_FAULT_KINDS_]; /* tp_sim_fault_count */
    uint32_t fail_sends[TPI_SIM_MSG_TYPES];    /* failsend: frames of each type still to lose */
    uint64_t fail_from_ns[TPI_SIM_MSG_TYPES];  /* failsend: in [from, until) */
    uint64_t fail_until_ns[TPI_SIM_MSG_TYPES];
    uint64_t type_delay_ns[TPI_SIM_MSG_TYPES]; /* delaytype: extra latency per type */
    uint32_t drop_per_million;
    uint64_t drop_start_ns, drop_end_ns; /* the loss rate applies in [start, end) */
    /* The chaos network mode (SIM-5): per million frames in [start, end). */
    uint32_t chaos_drop_pm, chaos_dup_pm, chaos_reorder_pm;
    uint64_t chaos_start_ns, chaos_end_ns;
    tp_store *store;
    int store_owned;
    tp_sim_program program;
    void *program_arg;
    /* The oracle (SIM-9). */
    struct tpi_sim_oracle *oracle; /* created on the first probe */
    uint64_t violations;
    char violation[TP_ERRMSG_LEN_MAX + 64]; /* the first one, with its time */
    uint64_t pf_events;     /* Perfetto events written (sim_perfetto.c) */
    uint64_t instant_ns;    /* the instant instant_work counts */
    uint32_t instant_work;  /* lock acquisitions and events at it */
    void *fmt_cache; /* sim_trace.c: the trace hash's table of formats, or NULL */
};

/* The simulation the calling thread is running, NULL outside tp_sim_run. */
tp_sim *tpi_sim_active(void);
void tpi_sim_set_active(tp_sim *sim);
/* Pushes an event at max(time_ns, now). Exhaustion is fatal: a simulation
 * that cannot record an event cannot stay deterministic. */
void tpi_sim_schedule(tp_sim *sim, tpi_sim_event *e);
/* Processes one event; 0 when there was none. */
int tpi_sim_step(tp_sim *sim);
/* The token for "who is running": the current task or the scheduler's. */
const void *tpi_sim_self_token(tp_sim *sim);

/* ---- Trace (SIM-6) ------------------------------------------------------------ */

/* Emits "t=<now> " + the formatted text + "\n": folded into the hash, and
 * written to cfg.trace when set. */
/* Frees the trace hash's cache (tp_sim_free). */
void tpi_sim_trace_free(tp_sim *sim);
void tpi_sim_trace(tp_sim *sim, const char *fmt, ...) TPI_PRINTF(2, 3);
void tpi_sim_vtrace(tp_sim *sim, const char *fmt, va_list ap);
#define TPI_SIM_HASH_SEED 0xcbf29ce484222325ull /* the trace hash's start */
/* Folds len bytes into the trace hash (SIM-6): the length, then the bytes
 * as little-endian words, the last one padded with zeros. */
uint64_t tpi_sim_hash_bytes(uint64_t hash, const void *data, size_t len);

/* ---- The oracle (SIM-9) ----------------------------------------------------------- */

typedef struct tpi_sim_oracle tpi_sim_oracle;
/* A probe from agent a's core (AGENT-15). */
void tpi_sim_oracle_probe(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p);
/* Counts one unit of work at the current instant (busy-loop bound). */
void tpi_sim_oracle_busy(tp_sim *sim);
/* The end-of-run checks, after teardown. */
void tpi_sim_oracle_end(tp_sim *sim);
void tpi_sim_oracle_free(tp_sim *sim);
/* Records a violation: counted, traced, the first one kept with its time. */
void tpi_sim_violation(tp_sim *sim, const char *fmt, ...) TPI_PRINTF(2, 3);

/* ---- Perfetto (SIM-12): each a no-op unless cfg.perfetto is set ----------- */

void tpi_sim_pf_begin(tp_sim *sim);
/* A host's process and thread names (a restart's when it begins). */
void tpi_sim_pf_host(tp_sim *sim, uint32_t host);
void tpi_sim_pf_end(tp_sim *sim);
void tpi_sim_pf_call(tp_sim *sim, uint32_t host, uint64_t id, const char *fn, int begin,
                     tp_status st, uint32_t in_flight);
/* What a frame's network slice shows: its arrival, or how it left. */
enum {
    TPI_SIM_PF_DELIVER,
    TPI_SIM_PF_SEND,
    TPI_SIM_PF_SEND_DUP,    /* chaos: a second copy of a frame */
    TPI_SIM_PF_SEND_REORDER, /* chaos: held back, later frames may pass it */
    TPI_SIM_PF_SEND_LOST,   /* chaos: gone at once, no arrow */
};
void tpi_sim_pf_msg(tp_sim *sim, uint32_t host, uint64_t msg, int how, size_t len,
                    unsigned type);
/* A frame that will never be delivered, on its destination's network thread. */
void tpi_sim_pf_drop(tp_sim *sim, uint32_t host, uint64_t msg, const char *why);
/* b is UINT32_MAX for a fault of one host. */
void tpi_sim_pf_fault(tp_sim *sim, const char *what, uint32_t a, uint32_t b);

/* ---- Faults (SIM-5) ------------------------------------------------------------ */

/* A parsed fault-plan line; the plan applies only when every line parses. */
typedef struct tpi_sim_fault_line {
    int kind; /* 1 delay, 2 break, 3 partition, 4 kill, 5 drop */
    uint32_t a, b;
    uint64_t t0_ns, t1_ns, extra_ns;
    uint32_t per_million;
    int line;
} tpi_sim_fault_line;

/*
 * Parses a fault plan into *lines (caller frees with free()). TP_EINVAL with
 * "fault plan line N: ..." in errmsg on the first bad line.
 */
tp_status tpi_sim_faults_parse(const char *text, tpi_sim_fault_line **lines, size_t *nlines,
                               char *errmsg, size_t errmsg_len);
/*
 * Writes f as one plan line (no newline) that parses back to f, line number
 * aside: the canonical spelling (message types by name, times in ms with no
 * trailing zeros, optional windows left out when open). Returns its length;
 * a line fits in 160 bytes. f must come from tpi_sim_faults_parse.
 */
size_t tpi_sim_faults_format(const tpi_sim_fault_line *f, char *buf, size_t len);

#endif
