/*
 * tensorplay/rpc_backend.h: the backend SPI, for authors of backends.
 *
 * A backend gives the RPC core (common/) everything it needs from the
 * outside world through one table of function pointers, the agent
 * interface: frames to and from peers, a monotonic clock and a timer, an
 * executor for user functions, a lock with park/unpark for blocking waits,
 * and a rendezvous store. The core never touches a socket, a clock, a
 * thread or a file itself; that is what lets the same semantics run on the
 * deterministic simulator (sim/) and on TCP (real/). The normative contract
 * is spec/agent.md (rules AGENT-1..); each member below cites it.
 *
 * Threads and upcalls (AGENT-1, AGENT-2):
 * - "I/O context" is the backend's event-loop thread (real) or the
 *   scheduler (sim). Upcalls (tp_core_on_*) run there, never with the core
 *   lock held and never from inside a downcall.
 * - Downcalls may be made with the core lock held unless noted; they must
 *   not block (except where noted) and must not call back into the core.
 * - Lock order: core lock, then any backend-internal lock. A backend never
 *   holds an internal lock while making an upcall.
 */
#ifndef TENSORPLAY_RPC_BACKEND_H
#define TENSORPLAY_RPC_BACKEND_H

#include "rpc.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TP_BACKEND_API_VERSION 1

typedef struct tp_agent tp_agent; /* the backend's per-worker object */
typedef struct tp_core tp_core;   /* the core's per-worker object; opaque to backends */
typedef struct tp_task tp_task;   /* a backend's token for a thread or simulated task */
typedef struct tp_store tp_store; /* a rendezvous store instance */

/* ------------------------------------------------------------------------ */
/* Frames (spec/wire.md). A frame is one message: a 24-byte header then the */
/* body, held in up to TP_FRAME_SEG_MAX segments so large tensor data can   */
/* be sent from where it lies. Received frames are one segment.             */

#define TP_FRAME_HEADER_SIZE 24
#define TP_FRAME_SEG_MAX 8

typedef struct tp_frame_seg {
    const void *base;
    size_t len;
} tp_frame_seg;

typedef struct tp_frame tp_frame;
struct tp_frame {
    tp_frame *next;  /* free for whoever holds the frame (queues) */
    size_t len;      /* total bytes over all segments, header included */
    int nseg;        /* 1..TP_FRAME_SEG_MAX; seg[0] starts with the header */
    tp_frame_seg seg[TP_FRAME_SEG_MAX];
    /* Frees the frame and whatever its segments reference. */
    void (*destroy)(tp_frame *f);
};

/*
 * A frame with one writable contiguous segment of len bytes (header
 * included, contents undefined) and next NULL, freed by tp_frame_free. NULL
 * on exhaustion. Backends allocate received frames with it.
 */
tp_frame *tp_frame_alloc(size_t len);
/*
 * A received frame over len bytes at base that the backend lends (memory it
 * mapped, such as a shared memory slab): one writable segment, header
 * first, which the core may lend on to tensors as it does tp_frame_alloc's
 * bytes. release(ctx) is called once, on any thread, when the frame is
 * freed (possibly long after, when the last tensor viewing it goes). NULL
 * on exhaustion (release is then not called).
 */
tp_frame *tp_frame_lend(uint8_t *base, size_t len, void (*release)(void *ctx), void *ctx);
/* The writable bytes of a frame from tp_frame_alloc or tp_frame_lend. */
uint8_t *tp_frame_bytes(tp_frame *f);
/* Calls f->destroy; NULL is a no-op. */
void tp_frame_free(tp_frame *f);
/* A copy of f's bytes in one fresh contiguous segment, as received frames
 * are (for loopback delivery); f stays the caller's. NULL on exhaustion. */
tp_frame *tp_frame_flatten(const tp_frame *f);

/*
 * Validates a frame header (magic, version, type, body length within
 * max_message_size) before any body byte is read. On TP_OK *frame_len is
 * the whole frame's length. TP_EPROTO or TP_EMSGSIZE otherwise, with a
 * message in errmsg. Backends call this on the first 24 bytes of each frame.
 */
tp_status tp_frame_check_header(const uint8_t header[TP_FRAME_HEADER_SIZE],
                                uint64_t max_message_size, size_t *frame_len, char *errmsg,
                                size_t errmsg_len);

/*
 * 1 when a header that passed tp_frame_check_header is a RESPONSE's: the
 * only frames a parked task may hand on itself (AGENT-20).
 */
int tp_frame_is_reply(const uint8_t header[TP_FRAME_HEADER_SIZE]);

/* ------------------------------------------------------------------------ */
/* Executor work items: the core embeds one in each job (AGENT-7).          */

typedef struct tp_work tp_work;
struct tp_work {
    tp_work *next; /* free for the executor's queue */
    void (*run)(tp_work *w);
};

/* ------------------------------------------------------------------------ */
/* Probes (AGENT-15): what the core tells an optional checker, such as the  */
/* simulator's oracle (spec/sim.md SIM-9). They describe the core's own     */
/* steps, so a checker outside the core can hold them against the truth it  */
/* knows (which host really served what, which link really broke).          */

typedef enum tp_probe_kind {
    TP_PROBE_CALL_ISSUE = 1, /* a call was registered: id, peer (dst), msg_type, fn, deadline_ns */
    TP_PROBE_CALL_END,       /* a call ended: id, peer, status (exactly once per issue) */
    TP_PROBE_FUTURE_DONE,    /* a call's future completed: id (the call's), status */
    TP_PROBE_SERVE_BEGIN,    /* a user function starts for a request: id, peer (caller), fn */
    TP_PROBE_SERVE_END,      /* it returned: id, peer, status */
    TP_PROBE_SHUTDOWN_BEGIN, /* tp_shutdown starts: graceful, deadline_ns (the timeout, ns) */
    TP_PROBE_SHUTDOWN_DRAINED, /* graceful phases returned: status (teardown follows) */
    TP_PROBE_SHUTDOWN_END,   /* tp_shutdown returns: status */
    TP_PROBE_RREF_FORK_LIVE, /* a user rref now exists here: rref, fork, peer (its owner) */
    TP_PROBE_RREF_FORK_GONE, /* this worker gave it up (its delete sent, or none owed): rref, fork */
    TP_PROBE_RREF_OWNER_FREE, /* the owner freed the value by the protocol (RREF-3): rref */
    TP_PROBE_RREF_OWNER_FORK, /* the owner recorded a fork: rref, fork, peer (its holder) */
    TP_PROBE_RREF_OWNER_UNFORK, /* the owner removed a recorded fork: rref, fork, peer */
    TP_PROBE_RREF_LEAKS,     /* a graceful shutdown's leak report (RREF-18): id = entries */
    TP_PROBE_SERVE_CANCEL    /* a served request's caller canceled it (CANCEL-1): id, peer
                              * (caller); it leaves S at once, its function may still run
                              * (its SERVE_END follows) and its answer is never sent */
} tp_probe_kind;

/* An rref or fork id (spec/rref.md RREF-1): the worker that made it, its counter. */
typedef struct tp_probe_gid {
    uint32_t worker;
    uint64_t local;
} tp_probe_gid;

typedef struct tp_probe {
    tp_probe_kind kind;
    tp_status status;
    uint32_t peer;        /* a worker id (rank) */
    uint8_t msg_type;     /* CALL_ISSUE: the wire message type (spec/wire.md) */
    int graceful;         /* SHUTDOWN_BEGIN */
    uint64_t id;          /* the caller's call id */
    uint64_t deadline_ns; /* CALL_ISSUE: absolute (UINT64_MAX: none); SHUTDOWN_BEGIN: a timeout */
    const char *fn;       /* borrowed for the upcall; "" when none */
    tp_probe_gid rref;    /* RREF_*: the rref id */
    tp_probe_gid fork;    /* RREF_FORK_*: the fork id */
    int method;           /* CALL_ISSUE: a method call on an rref's object (METHOD-1) */
} tp_probe;

/*
 * Worker cores allocated in this process and not yet freed (AGENT-15). A
 * core lives until the last handle that points at it (future, rref, call in
 * flight, job) is gone, so a checker that sees this above zero after every
 * handle was released has found a leak. Any thread.
 */
uint64_t tp_core_live_count(void);

/* ------------------------------------------------------------------------ */
/* The agent interface (AGENT-1..17).                                       */

typedef struct tp_agent_ops {
    uint32_t api_version; /* TP_BACKEND_API_VERSION */
    const char *name;

    /*
     * AGENT-3. Attaches the core and starts I/O: listen, start the pool.
     * Writes this worker's address (an opaque string other workers' agents
     * understand) into addr. Blocking; init thread; core lock not held.
     * Errors carry a message in errmsg.
     */
    tp_status (*start)(tp_agent *a, tp_core *core, char *addr, size_t addr_len, char *errmsg,
                       size_t errmsg_len);

    /*
     * AGENT-4. The all-gathered addresses, indexed by worker id (addrs[i]
     * borrowed during the call). Connections are opened on first use.
     * Blocking allowed; init thread; core lock not held.
     */
    tp_status (*set_peers)(tp_agent *a, const char *const *addrs, uint32_t world_size,
                           char *errmsg, size_t errmsg_len);

    /*
     * AGENT-5. Stops I/O and the pool: accepted work items still run (the
     * core makes them finish fast), queued frames are dropped and freed.
     * When it returns no upcall is running and none will run. Blocking;
     * never from an upcall or a work item; core lock not held.
     */
    void (*stop)(tp_agent *a);

    /* AGENT-6. Frees the agent and its store; after stop. */
    void (*destroy)(tp_agent *a);

    /*
     * AGENT-8. Queues f for worker dst. Ownership of f transferred on
     * TP_OK; on error the caller keeps it. Never blocks, never upcalls.
     * TP_EPEERDOWN when dst is known to be down, TP_EUNKNOWNWORKER when
     * dst has no address, TP_ESHUTDOWN after stop. Frames to one peer
     * arrive in order or not at all (a broken connection loses the rest
     * and raises peer-down at both ends). Any thread; lock may be held.
     */
    tp_status (*send)(tp_agent *a, uint32_t dst, tp_frame *f);

    /* AGENT-9. Monotonic time in ns (virtual on the simulator). Any thread. */
    uint64_t (*now_ns)(tp_agent *a);

    /*
     * AGENT-10. The core wants tp_core_on_timer at or after deadline_ns.
     * A later call replaces the earlier arm; UINT64_MAX disarms. Any
     * thread; lock may be held; never upcalls from inside.
     */
    void (*timer_arm)(tp_agent *a, uint64_t deadline_ns);

    /*
     * AGENT-7. Runs w->run(w) later on a worker-pool thread (simulated
     * task), never inline; at most num_worker_threads at once, FIFO.
     * Transferred on TP_OK: run is called exactly once. TP_ESHUTDOWN after
     * stop (the caller keeps w). Any thread; lock may be held.
     */
    tp_status (*execute)(tp_agent *a, tp_work *w);

    /* AGENT-11. The worker's core lock (not recursive). Any thread. */
    void (*lock)(tp_agent *a);
    void (*unlock)(tp_agent *a);

    /* The calling thread's (task's) park token; stable for its life. */
    tp_task *(*task_self)(tp_agent *a);

    /*
     * AGENT-12. Called with the lock held by self: releases it, blocks
     * until unpark(self), deadline_ns (UINT64_MAX: none) or a spurious
     * wakeup, then retakes it. TP_ETIMEDOUT once the deadline has passed;
     * TP_ESHUTDOWN when the backend is stopping or the simulated world is
     * ending: the caller must stop waiting and fail. An unpark that comes
     * before the park (while the lock was held) is not lost.
     */
    tp_status (*park)(tp_agent *a, tp_task *self, uint64_t deadline_ns);
    /* Wakes t if parked (or makes its next park return). Lock held. */
    void (*unpark)(tp_agent *a, tp_task *t);

    /* AGENT-13. The rendezvous store; owned by the agent. */
    tp_store *(*store)(tp_agent *a);

    /*
     * AGENT-15. Optional (NULL: the core emits nothing). The core reports one
     * of its steps; p is borrowed for the call. Called from any thread, lock
     * held or not; must not block, fail, or call into the core.
     */
    void (*probe)(tp_agent *a, const tp_probe *p);

    /*
     * AGENT-16. Optional (NULL: a restarted peer cannot rejoin this worker,
     * REJOIN-4). Worker `rank` restarted: its address is now addr (borrowed).
     * The agent drops the old connection and whatever was queued for it,
     * forgets that the rank was down, ignores any later news about the old
     * connection, and routes later sends to addr. Any thread, with the
     * lock held (the I/O context serving tp:join, or the rejoining worker's
     * init); must not block or upcall.
     */
    tp_status (*set_peer)(tp_agent *a, uint32_t rank, const char *addr, char *errmsg,
                          size_t errmsg_len);

    /*
     * AGENT-17. Optional (NULL: none). What this transport does beyond
     * AGENT-8's contract, as TP_NET_* flags; read once, before start. With
     * TP_NET_DUPLICATES the core drops a repeated frame (api.md CALL-10);
     * with TP_NET_REORDERS a fetch may wait for its REMOTE (rref.md RREF-6);
     * with TP_NET_LOSES unsettled forks are probed (RREF-22).
     */
    uint32_t (*net_faults)(tp_agent *a);

    /*
     * AGENT-18. Optional (NULL: never). 1 when the bytes this agent holds
     * for dst and could not deliver yet (queued, unwritten, in flight to a
     * receiver that does not take them) are over max_unsent_bytes (OPT-11):
     * the core then runs none of dst's queued requests (calls.md FAIR-2)
     * until the agent calls tp_core_on_uncongested(core, dst), which it must
     * once the bytes fall to half the bound or dst is down, if it answered
     * 1 since the last such call. Any thread, core lock held; must not block
     * or upcall.
     */
    int (*congested)(tp_agent *a, uint32_t dst);

    /*
     * AGENT-19. Optional (NULL: set_peers is called). As set_peers, with
     * list_id: a nonzero number that names this exact list of addresses in
     * this process and is never used for another. The core passes one list
     * to every worker of a simulated world; an agent may keep what it
     * learned from a list under its id and, seeing the id again, skip the
     * work per address (a world of n workers then costs O(n), not O(n^2)).
     */
    tp_status (*set_peers_id)(tp_agent *a, const char *const *addrs, uint32_t world_size,
                              uint64_t list_id, char *errmsg, size_t errmsg_len);

    /*
     * AGENT-20. Optional (NULL: park is called). As park, for a task that
     * waits for a reply from worker peer: meanwhile the agent may read
     * peer's frames on this task and hand on each RESPONSE among them with
     * tp_core_on_frame from here (the one exception to AGENT-2's I/O
     * context: the reply then costs no hand-off from the I/O thread). It
     * hands on frames of peer in their order, after every earlier frame of
     * that link, never a frame of another type.
     */
    tp_status (*park_peer)(tp_agent *a, tp_task *self, uint64_t deadline_ns, uint32_t peer);
} tp_agent_ops;

/* AGENT-17: beyond AGENT-8, the transport may deliver a frame twice,
 * deliver the frames of one link out of order, ... */
#define TP_NET_DUPLICATES 0x1u
#define TP_NET_REORDERS 0x2u
/* ... or lose a frame without ending its connection (no peer-down). */
#define TP_NET_LOSES 0x4u

/* ------------------------------------------------------------------------ */
/* Upcalls: the backend tells the core what happened (AGENT-2).             */

/* A frame arrived from worker src; ownership transferred. I/O context. */
void tp_core_on_frame(tp_core *core, uint32_t src, tp_frame *f);
/*
 * The connection to peer broke or the peer is known dead. Every in-flight
 * call to it fails at once and later calls fail at once. detail borrowed
 * (errno text, "killed by fault plan"). I/O context.
 */
void tp_core_on_peer_down(tp_core *core, uint32_t peer, tp_status why, const char *detail);
/* The armed deadline passed. I/O context. */
void tp_core_on_timer(tp_core *core);
/* AGENT-18: dst's undelivered bytes fell to half the bound, or dst is down.
 * I/O context. */
void tp_core_on_uncongested(tp_core *core, uint32_t dst);

/* ------------------------------------------------------------------------ */
/* Backends (BACKEND-1..5).                                                  */

typedef struct tp_init_params {
    const char *name; /* validated by the core */
    uint32_t rank;
    uint32_t world_size;
    const tp_options *opts; /* never NULL; borrowed during init */
    /*
     * INTERRUPT-1: nonzero once this init was interrupted (tp_interrupt,
     * Ctrl-C). A backend whose init waits (for its rendezvous store to come
     * up, say) asks between attempts, at most TP_INIT_POLL_MS apart, and
     * gives up with TP_ECANCELED. NULL: never interrupted. Any thread.
     */
    int (*interrupted)(const struct tp_init_params *self);
    const void *core_private; /* the core's, for interrupted */
} tp_init_params;

#define TP_INIT_POLL_MS 20 /* how often a waiting backend init asks interrupted */

struct tp_backend {
    uint32_t api_version; /* TP_BACKEND_API_VERSION */
    /* Fills backend defaults into fresh options; may be NULL. */
    tp_status (*construct_options)(tp_options *opts);
    /*
     * Creates this worker's agent (not started) and its store. The store
     * is reached through ops->store. Errors carry a message in errmsg.
     */
    tp_status (*init)(const tp_init_params *params, tp_agent **agent, const tp_agent_ops **ops,
                      char *errmsg, size_t errmsg_len);
    /*
     * The backend-specific keys (tp_options_set) it understands, NULL-
     * terminated; NULL means none. Init rejects any other key with
     * TP_EINVAL naming it, so a typo never passes silently (OPT-6).
     */
    const char *const *option_keys;
};

/* ------------------------------------------------------------------------ */
/* The rendezvous store (STORE-1..10).                                       */

#define TP_STORE_KEY_LEN_MAX 255
#define TP_STORE_VALUE_LEN_MAX (1u << 20)

typedef struct tp_store_ops {
    uint32_t api_version;
    /* Sets key to value (overwrites). value borrowed, copied. */
    tp_status (*set)(tp_store *s, const char *key, const void *value, size_t len);
    /*
     * Gets key: *value is malloc'd (caller frees with free()), NUL-terminated
     * past *len. TP_ENOENT when absent. Never blocks waiting for the key.
     */
    tp_status (*get)(tp_store *s, const char *key, void **value, size_t *len);
    /* Atomically adds delta to the integer at key (absent = 0); *result the new value. */
    tp_status (*add)(tp_store *s, const char *key, int64_t delta, int64_t *result);
    /*
     * Atomically: if key's value equals expected (expected NULL: key absent),
     * set it to desired and *swapped = 1; else *swapped = 0.
     */
    tp_status (*compare_set)(tp_store *s, const char *key, const void *expected,
                             size_t expected_len, const void *desired, size_t desired_len,
                             int *swapped);
    /* Deletes key; TP_OK whether or not it existed. */
    tp_status (*del)(tp_store *s, const char *key);
    /* Closes and frees the store handle. */
    void (*close)(tp_store *s);
    /*
     * Optional (NULL: the core reads keys one by one). Calls fn for every
     * key that starts with prefix, in key order, with its value (key and
     * value borrowed for the call; the value NUL-terminated past len); fn
     * returns 0 to go on, nonzero to stop there. fn must not call the store.
     * A failure may come after some calls to fn (the caller's fn must
     * tolerate seeing a key again on a retry). STORE-10.
     */
    tp_status (*scan)(tp_store *s, const char *prefix,
                      int (*fn)(void *arg, const char *key, const void *value, size_t len),
                      void *arg);
    /*
     * Optional (NULL or 0: none). STORE-13. A number naming the keys this
     * handle reaches: never the number of another store of this process,
     * nor of a store this process closed (handles that reach the same keys
     * may share one). The core of one process keeps what one worker read of
     * a job's write-once keys (the rank entries, INIT-7) under it, and a
     * later worker of that job that reads the same store takes it without
     * scanning them again. No I/O; any thread.
     */
    uint64_t (*instance)(tp_store *s);
} tp_store_ops;

/* A store handle: implementations embed this first. */
struct tp_store {
    const tp_store_ops *ops;
    char errmsg[TP_ERRMSG_LEN_MAX]; /* the last failed operation's message */
};

/*
 * The SQLite store (store/sqlite_store.c). path ":memory:" gives a private
 * in-memory database (the simulator's); a file path gives a store shared by
 * many processes (WAL mode, busy timeout). *out caller-owned; close with
 * (*out)->ops->close.
 */
tp_status tp_sqlite_store_open(const char *path, tp_store **out, char *errmsg,
                               size_t errmsg_len);

/*
 * The etcd store (store/etcd_store.c, spec/etcd.md ETCD-1..10): a store that
 * is not one of the job's workers, over etcd's v3 HTTP/JSON gateway. url is
 * "etcd://host:port[,host:port...]/prefix[?ttl=S&timeout_ms=MS]": the
 * endpoints are tried in turn, and the prefix holds one job's keys. Opening
 * parses url and starts the handle's lease keepalive thread; it does not
 * reach etcd (the first operation does), so it never blocks. Errors:
 * TP_EINVAL for a malformed url, TP_ENOMEM; *out NULL and the message in
 * errmsg (may be NULL) then. *out caller-owned; close with
 * (*out)->ops->close, which joins the thread. Any thread.
 */
tp_status tp_etcd_store_open(const char *url, tp_store **out, char *errmsg, size_t errmsg_len);

/* ------------------------------------------------------------------------ */
/* For the conformance suite (spec/calls.md FLOW-8): while on, this process's
 * calls ignore the credits their callees granted, as a non-conforming caller
 * would, so a suite can check that a callee refuses them. Never in production. */
void tp_test_flow_ignore_credit(int on);

/* Worker contexts (AGENT-14): for backends that run several workers in one */
/* process, as the simulator does. Without them the process has one worker. */

typedef struct tp_context tp_context;

/* A fresh worker slot: its function registry and lifecycle state. NULL on
 * exhaustion. Caller-owned. */
tp_context *tp_context_new(void);
/*
 * Frees a slot. A worker still initialised in it is shut down first, not
 * gracefully (its agent must still exist).
 */
void tp_context_free(tp_context *ctx);
/*
 * Makes ctx the calling thread's current worker (NULL: the process's own),
 * with errmsg_buf (TP_ERRMSG_LEN_MAX bytes, NULL: the thread's own) holding
 * tp_errmsg() for the task about to run. The simulator calls this each time
 * it resumes a task.
 */
void tp_context_switch(tp_context *ctx, char *errmsg_buf);
/* The calling thread's current worker slot (never NULL). */
tp_context *tp_context_current(void);
/* tp_interrupt for the worker slot ctx (INTERRUPT-1), from any thread or a
 * simulated task of another host; async-signal-safe. TP_EINVAL for NULL. */
tp_status tp_context_interrupt(tp_context *ctx);

/* Registers the built-in backends ("TENSORPIPE" when built, "SIM"). Idempotent. */
void tp_register_builtin_backends(void);

#ifdef __cplusplus
}
#endif
#endif /* TENSORPLAY_RPC_BACKEND_H */
