/*
 * core.h: the RPC core's internal state, one tp_core per initialised worker.
 *
 * Concurrency (spec/agent.md AGENT-11): every field marked "lock" is guarded
 * by the agent's per-worker lock (ops->lock). Fields marked "atomic" are
 * read without it. The core never holds the lock across an upcall into
 * user code (functions, then-callbacks run as work items).
 *
 * Lifetimes: the tp_core struct is reference counted (refs): the context
 * holds one from init to the end of teardown, and so does every future,
 * rref, call and job that points at it, so a user handle may outlive the
 * worker safely. The agent is reached only while api_refs shows someone
 * inside, or from agent-driven code (upcalls, work items), which the agent
 * stops before teardown frees it.
 */
#ifndef TPI_CORE_H
#define TPI_CORE_H

#include <stdatomic.h>
#include <stdint.h>

#include "codec.h"
#include "context.h"
#include "errors.h"
#include "idmap.h"
#include "tensorplay/rpc_backend.h"

typedef enum tpi_state {
    TPI_STATE_RUNNING = 1,  /* calls allowed (graceful shutdown's phases run here too) */
    TPI_STATE_STOPPING = 2, /* teardown: every API entry fails with TP_ESHUTDOWN */
    TPI_STATE_STOPPED = 3   /* the agent is gone; handles only answer from memory */
} tpi_state;

#define TPI_NO_DEADLINE UINT64_MAX
/* The built-in function init's warm-up calls (INIT-8): answers nil, never
 * registered, so it cannot clash with a user's (user names cannot be
 * registered twice, and this one is answered before the registry). */
#define TPI_PING_FN "tp:ping"
/* The built-in function a restarted worker calls on every peer to announce
 * its new incarnation and address (REJOIN-4); answered in the I/O context. */
#define TPI_JOIN_FN "tp:join"
/* The built-in function that asks a peer which of the forks sent to it it
 * holds, after a broken connection may have lost them (RREF-19); answered
 * in the I/O context. */
#define TPI_FORKS_FN "tp:forks"
/* The built-in function a caller calls on a callee to give up a request it
 * canceled (CANCEL-1): args [request id]; answered nil in the I/O context. */
#define TPI_CANCEL_FN "tp:cancel"
/* REJOIN-3: every id a worker mints (call ids, rref and fork ids) carries its
 * incarnation above this bit, so no id of one incarnation is ever minted by
 * another, and a request tells which incarnation sent it. 2^40 ids each. */
#define TPI_INC_SHIFT 40
#define TPI_INCARNATION_MAX ((1u << 24) - 1)
#define TPI_INC_OF(id) ((uint32_t)((id) >> TPI_INC_SHIFT))
#define TPI_NO_INDEX SIZE_MAX

/* ---- Futures (FUTURE-1..8) ------------------------------------------------ */

/* No worker: a future no single worker's reply completes (AGENT-20). */
#define TPI_NO_PEER UINT32_MAX

typedef struct tpi_waiter tpi_waiter;
/* wait_all's record of which futures completed while it waited, so each
 * wake looks only at those (O(n) over the whole wait, FUTURE-6). */
typedef struct tpi_done_log {
    size_t *index; /* room for every future waited on */
    size_t n, cap;
} tpi_done_log;
struct tpi_waiter {
    tp_task *task;
    tpi_waiter *prev, *next;
    tpi_done_log *log; /* a future's waiter in wait_all: completion appends index */
    size_t index;
};

typedef struct tpi_then tpi_then;
/* An internal step run under the lock the moment a future completes
 * (collect_all's count, an answer-later reply): it must not block and must
 * not touch f after dropping a reference to it. The node is the caller's. */
typedef struct tpi_hook tpi_hook;
struct tpi_hook {
    void (*fn)(tp_core *c, tp_future *f, tpi_hook *h);
    tpi_hook *next;
};

struct tp_future {
    atomic_int refs;
    atomic_int done;  /* set last, with release order, after the result fields */
    tp_core *core;    /* counted ref; the lock that guards the fields below */
    tp_status status; /* lock until done, then immutable */
    tp_value *value;
    char *errmsg;          /* malloc'd, NULL means "" */
    tpi_waiter *waiters;   /* lock */
    tpi_then *thens;       /* lock; run once done */
    tpi_hook *hooks;       /* lock; run once done, before then-callbacks */
    uint64_t call_id;      /* the call it belongs to (probes), 0 for others */
    uint32_t peer;         /* the worker whose reply completes it, or TPI_NO_PEER (AGENT-20) */
    int user_made;         /* tp_future_new: the user completes it (FUTURE-9) */
    tp_future *uprev, *unext; /* lock: the core's pending user futures, while listed */
};

/* A new pending future with one reference for the caller; NULL on exhaustion. */
tp_future *tpi_future_new(tp_core *c);
/*
 * Completes f (lock held): value transferred, errmsg copied; wakes waiters
 * and schedules then-callbacks. A second completion is ignored (the first
 * wins) and frees value.
 */
void tpi_future_complete(tp_core *c, tp_future *f, tp_status st, tp_value *value,
                         const char *errmsg);
/* Waits (lock held) until f is done or deadline; TP_ETIMEDOUT/TP_ESHUTDOWN. */
tp_status tpi_future_wait_locked(tp_core *c, tp_future *f, uint64_t deadline_ns);
/* As tpi_future_wait_locked, for a task that waits for this one call's
 * reply and nothing else (a blocking call): the agent may let it read the
 * reply itself (AGENT-20). Not for a wait among many calls in flight (a
 * future's wait, an async window): its task would take the replies of the
 * others one by one, in turns with the I/O thread. */
tp_status tpi_future_wait_reply_locked(tp_core *c, tp_future *f, uint64_t deadline_ns);
tp_future *tpi_future_ref(tp_future *f);
/* Runs h when f completes (lock held); at once when it is done already. */
void tpi_future_hook(tp_core *c, tp_future *f, tpi_hook *h);
/* Teardown (lock held): fails every pending user future with st (FUTURE-9),
 * so nothing waits on, or answers after, a future nobody can complete. */
void tpi_futures_fail_user(tp_core *c, tp_status st, const char *why);

/* ---- Calls: one per message that expects a reply (CALL, TIMEOUT) ----------- */

typedef struct tpi_call tpi_call;
/* A protocol step run under the lock when the reply (or failure) arrives, before
 * the future completes. reply is NULL when the call failed locally. */
typedef void (*tpi_reply_fn)(tp_core *c, tpi_call *call, tp_status st, tpi_msg *reply);

struct tpi_call {
    uint64_t id;
    uint32_t dst;
    uint8_t type;          /* tpi_msg_type sent */
    const char *what;      /* "rpc_sync", "to_here"...: static */
    char fn[TP_NAME_LEN_MAX + 1];
    uint64_t timeout_ms;   /* 0: none; rounded up for the wire */
    double timeout_s;      /* as configured, for messages */
    uint64_t deadline_ns;  /* TPI_NO_DEADLINE: none */
    size_t heap_index;     /* TPI_NO_INDEX when not in the heap */
    tp_future *future;     /* counted ref */
    tpi_reply_fn on_reply; /* may be NULL */
    tp_rref *rref;         /* pinned rref the call concerns, or NULL */
    tpi_gid fork;          /* RREF_FORK: the fork to accept at parent */
    uint32_t parent;
    uint32_t attempt;      /* protocol messages: retries so far (RREF-15) */
    int flow;              /* a user's call: waits for the send window (FLOW-2) */
    uint64_t wire_len;     /* bytes sent, counted in the window until it ends */
    tpi_call *prev, *next; /* issue order: deterministic iteration */
};

/* A task waiting for room in a destination's send window (FLOW-2), on its
 * stack; the core's list keeps arrival order, so waiters go first come. */
typedef struct tpi_window_waiter tpi_window_waiter;
struct tpi_window_waiter {
    tp_task *task;
    uint32_t dst;
    uint64_t len;
    tpi_window_waiter *prev, *next;
};

/* A call that timed out while its request may still be held by the callee:
 * its bytes stay in the window until the late response (FLOW-7). */
typedef struct tpi_debt tpi_debt;
/* A protocol message waiting to be sent again (RREF-15), in due order. */
typedef struct tpi_retry tpi_retry;
struct tpi_debt {
    uint64_t id;
    uint32_t dst;
    uint64_t len;
    tpi_debt *prev, *next; /* the core's debt list */
};

/* Tests only: a caller that ignores the credits it was granted (FLOW-8's
 * refusals, seen from a non-conforming caller). */
extern atomic_int tpi_flow_ignore_credit;

/* ---- RRefs (RREF-1..16) ------------------------------------------------- */

typedef struct tpi_owner tpi_owner;
typedef struct tpi_fork_rec {
    tpi_gid fork;
    uint32_t holder;    /* the worker holding that reference */
    uint8_t in_transit; /* recorded by our send, whose frame is not handed to the agent yet */
    uint64_t sent_ns;   /* when our send handed it over; 0: not at risk (RREF-22) */
} tpi_fork_rec;
typedef struct tpi_fetch tpi_fetch;

/* The owner's record of a value (OwnerRRef). */
struct tpi_owner {
    tpi_gid id;
    int ready;          /* value or error set */
    int running;        /* the creating function is running */
    tp_status status;   /* of the creating function */
    tp_value *value;
    char *errmsg;
    tpi_fork_rec *forks; /* users that hold it */
    size_t nforks, forks_cap;
    int local_handles;  /* owner-side tp_rref handles */
    tpi_fetch *fetches; /* to_here requests waiting for the value */
    tpi_waiter *waiters; /* local_value waiters */
    struct tpi_job *deferred; /* method calls waiting for the value (METHOD-3), newest first */
};

struct tp_rref {
    atomic_int handles; /* user-visible references: the last one sends the delete */
    atomic_int refs;    /* handles + calls in flight: whoever drops it to 0 frees */
    tp_core *core;      /* counted ref */
    uint32_t owner;
    uint32_t owner_inc;  /* the owner's incarnation when this handle was made (REJOIN-6) */
    char owner_name[TP_NAME_LEN_MAX + 1];
    char self_name[TP_NAME_LEN_MAX + 1];
    tpi_gid id;
    tpi_gid fork;        /* user side: this reference's fork id */
    int is_owner;
    atomic_int confirmed;
    int released;        /* lock: the delete was sent (or is not owed) */
    int closed;          /* lock: shutdown released it: the user may no longer use it */
    int children;        /* lock: forks sent from it that their children have not accepted */
    int delete_pending;  /* lock: shutdown wants the delete once children reach 0 */
    int answered;        /* lock: the owner answered a fetch of it: it exists there */
    int fork_pending;    /* lock: our RREF_FORK is unanswered (RREF-6) */
    tp_status fork_status; /* lock: why the owner did not confirm it (RREF-13), or TP_OK */
    char *fork_msg;        /* lock: the owner's words for it, or NULL (owned) */
    tpi_waiter *confirm_waiters; /* lock: functions waiting to run until it is confirmed */
    int delete_deferred; /* lock: released while its fork was unanswered (RREF-15) */
    tp_status failed;    /* lock: creation failed locally (timeout, peer down) */
    char *fail_msg;      /* lock */
    tp_rref *prev, *next; /* lock: the core's list of live user rrefs */
    int listed;
};

/* ---- The worker --------------------------------------------------------- */

struct tp_core {
    atomic_int refs;
    atomic_int state;    /* tpi_state */
    atomic_int api_refs; /* threads inside the API using the agent */
    _Atomic(tp_task *) lock_owner; /* the task holding the lock, or NULL */
    tpi_waiter *parked;  /* lock: every task parked in the core, so teardown can wake it */
    tpi_waiter *in_work; /* lock: tasks running user code for this worker (functions, callbacks) */
    tp_value **grave;    /* lock: values to free once the lock is released */
    size_t ngrave, grave_cap;
    tp_context *ctx;
    const tp_agent_ops *ops;
    tp_agent *agent;
    tp_store *store;
    uint32_t rank;
    uint32_t world_size;
    uint32_t generation;
    tp_worker_info self;
    tp_worker_info *infos; /* by id; set at the end of init; read-only: names' */
    uint32_t *by_name;     /* ids sorted by name, for lookups; read-only: names' */
    struct tpi_names *names; /* the table infos and by_name belong to, maybe shared
                              * with other workers of this process (rendezvous.c) */
    struct tpi_names *names_spare; /* the table before the all-gather's, kept until
                                    * the worker is freed: a thread may still read it */
    uint8_t *peer_dead;            /* lock: 1 once a peer is known dead; set by tpi_peer_dead_set */
    uint32_t ndead;                /* lock: how many of peer_dead are 1 (no scan to ask "any?") */
    uint32_t incarnation;  /* this worker's (REJOIN-2): 0, or k for the k-th rejoin */
    /* By id: the newest incarnation known (REJOIN-4), NULL (all 0) until a
     * rejoin names one (tpi_peer_inc_set); the table and its entries are
     * written with the lock held, read without it by the I/O context's
     * fence (REJOIN-5): tpi_peer_inc. */
    _Atomic(_Atomic(uint32_t) *) peer_inc;
    /* The state kept for each peer this worker dealt with (struct tpi_peer,
     * below), made on first contact: a world of n workers where each talks
     * to a few holds a few records each, not n per-peer arrays (issue 21). */
    uint32_t *peer_ids;          /* lock: the ids with a record, ascending: loops over
                                  * peers walk these, in rank order (determinism in sim/) */
    struct tpi_peer **peer_recs; /* lock: peer_recs[i] is peer_ids[i]'s record */
    uint32_t npeer_ids, peer_ids_cap;
    uint64_t remote_values_max; /* OPT-10 */
    uint32_t rr_first, rr_last; /* lock: FAIR-1's round (runq), UINT32_MAX when empty */
    uint64_t tokens_owed;       /* lock: pool tokens that found only stalled sources (FAIR-2) */
    uint64_t tokens_unissued;   /* lock: owed tokens not made (no memory): ending jobs run theirs */
    uint32_t ndeferred;         /* lock: method calls parked on owner records (METHOD-3) */
    tp_options *opts;
    double default_timeout_s; /* lock */
    uint64_t max_msg;

    /* Calls in flight (lock). */
    uint64_t next_id;
    tpi_idmap calls; /* key {0, id} */
    tpi_call *calls_head, *calls_tail;
    tpi_call **heap; /* deadline min-heap */
    size_t heap_len, heap_cap;
    uint64_t armed_ns;

    /* Flow control (FLOW-1..4, lock); per destination in struct tpi_peer. */
    uint64_t window;     /* max_inflight_bytes */
    const uint64_t *credit; /* by id: what each peer granted us (FLOW-6), UINT64_MAX until
                             * init; read-only: names' */
    tpi_idmap debts;     /* key {0, call id} -> tpi_debt: timed-out calls' bytes (FLOW-7) */
    tpi_debt *debt_head; /* the same debts, for forgiving a peer's */
    /* Credit enforcement (FLOW-8, lock); per source in struct tpi_peer. */
    uint64_t grant;      /* the credit this worker grants each peer */
    uint64_t queued_max; /* max_queued_bytes */
    uint64_t held_total; /* every request held, orphans included */
    tpi_window_waiter *wq_head, *wq_tail;

    /* CALL-10 (lock): frames seen lately, when the transport may duplicate. */
    int dedupe;                /* the agent reported TP_NET_DUPLICATES */
    int reorders;              /* the agent reported TP_NET_REORDERS (RREF-6) */
    int loses;                 /* the agent reported TP_NET_LOSES (RREF-22) */
    uint64_t probe_due_ns;     /* lock: RREF-22's next look at unsettled forks */
    tpi_idmap seen;            /* key {src, id} -> (void *)1 */
    struct tpi_seen *seen_ring; /* the same keys, oldest first, with their expiry */
    size_t seen_head, seen_len;

    /* Counters for shutdown's drain (lock). */
    uint64_t active_client; /* calls awaiting a reply */
    uint64_t active_served; /* requests accepted, reply not yet sent, not canceled */
    tpi_idmap served;       /* key {src, request id} -> tpi_served: REQUESTs counted in
                             * active_served that their caller may still cancel (CANCEL-1) */
    uint64_t issued;        /* calls ever issued */

    /* RRefs (lock). */
    atomic_uint_fast64_t next_gid; /* atomic: encoders fork without the lock */
    tpi_idmap owners;   /* rref id -> tpi_owner */
    tpi_retry *retries; /* lock: protocol messages to send again, earliest due first */
    tpi_idmap children; /* fork id -> tp_rref* kept for a child not yet accepted */
    tp_rref *users;     /* live user rrefs */
    tp_future *user_futures; /* pending futures made by tp_future_new, each counted (FUTURE-9) */
    tpi_gid *abandoned;      /* ring of TPI_ABANDONED_MAX (RREF-14), lazily allocated */
    size_t nabandoned;       /* ids pushed so far (the ring holds the last ones) */
    tpi_gid *freed;          /* ring of TPI_FREED_MAX (RREF-21), only when reorders */
    size_t nfreed;
    tpi_gid *deleted;        /* fork ids deleted here, the same way (RREF-21) */
    size_t ndeleted;
    atomic_int shutting_down; /* graceful shutdown in progress (read by upcalls for a log level) */
    /* INTERRUPT-1 (lock): the lifecycle call that may be interrupted, its
     * context epoch (0: none) and the task running it, whose parks poll the
     * context's flag. */
    uint32_t intr_epoch;
    tp_task *intr_task;
    const char *sd_phase; /* the graceful phase running, for an interrupt's message */
    uint64_t init_started_ns; /* when init's rendezvous began (LOG-3's "after 10 s") */
};
/* REJOIN-4: the newest incarnation of id known, 0 until a rejoin names one.
 * Any thread: the I/O context reads it without the lock (REJOIN-5). */
static inline uint32_t tpi_peer_inc(const tp_core *c, uint32_t id) {
    _Atomic(uint32_t) *v = atomic_load_explicit(&((tp_core *)c)->peer_inc, memory_order_acquire);
    return v ? atomic_load_explicit(&v[id], memory_order_relaxed) : 0;
}
/* Sets it (lock held), making the table at the first one; TP_ENOMEM (with a
 * message) when it cannot be made. */
tp_status tpi_peer_inc_set(tp_core *c, uint32_t id, uint32_t k);

/* INTERRUPT-1: 1 when the lifecycle call c watches was interrupted. */
static inline int tpi_interrupted(const tp_core *c) {
    return c->intr_epoch != 0 && atomic_load(&c->ctx->intr_epoch) == c->intr_epoch;
}

/* ---- Probes (AGENT-15) ---------------------------------------------------- */

/* Reports one core step to the agent's checker, when it has one. */
static inline void tpi_probe(const tp_core *c, tp_probe_kind kind, uint64_t id, uint32_t peer,
                             tp_status st, const char *fn) {
    if (!c->ops->probe)
        return;
    tp_probe p = {.kind = kind, .status = st, .peer = peer, .id = id, .fn = fn ? fn : ""};
    c->ops->probe(c->agent, &p);
}

/* Reports an rref protocol step (RREF_FORK_LIVE, _GONE, RREF_OWNER_FREE). */
static inline void tpi_probe_rref(const tp_core *c, tp_probe_kind kind, tpi_gid rref,
                                  tpi_gid fork, uint32_t peer) {
    if (!c->ops->probe)
        return;
    tp_probe p = {.kind = kind,
                  .peer = peer,
                  .fn = "",
                  .rref = {rref.worker, rref.local},
                  .fork = {fork.worker, fork.local}};
    c->ops->probe(c->agent, &p);
}

/* ---- core.c ------------------------------------------------------------- */

void tpi_core_ref(tp_core *c);
void tpi_core_unref(tp_core *c);
void tpi_core_free(tp_core *c); /* lifecycle.c: when refs reach 0 */
/* The agent lock, with the holder recorded so code that may run either
 * inside or outside it (freeing a value that holds an rref) can tell. */
void tpi_lock(tp_core *c);
void tpi_unlock(tp_core *c);
int tpi_lock_held(tp_core *c);
/*
 * Frees v now, or, when the calling task holds the lock, right after it
 * releases it: freeing runs user code (an object's destroy, an rref's
 * release) that may call the API, which must never happen under the lock.
 */
void tpi_defer_free(tp_core *c, tp_value *v);
static inline uint64_t tpi_now(tp_core *c) {
    return c->ops->now_ns(c->agent);
}
/* Marks the calling task as running user code for c (SHUTDOWN-1: such a task
 * may not shut the worker down). node lives on the caller's stack. */
void tpi_work_enter(tp_core *c, tpi_waiter *node);
void tpi_work_enter_locked(tp_core *c, tpi_waiter *node); /* lock held */
void tpi_work_leave(tp_core *c, tpi_waiter *node);
void tpi_work_leave_locked(tp_core *c, tpi_waiter *node); /* lock held */
int tpi_in_work(tp_core *c);
/* Parks the calling task (lock held) until woken or deadline. */
tp_status tpi_park(tp_core *c, uint64_t deadline_ns);
/* As tpi_park, for a reply from worker peer (TPI_NO_PEER: any wait): the
 * agent may read it on this task (AGENT-20). */
tp_status tpi_park_for(tp_core *c, uint64_t deadline_ns, uint32_t peer);
/* A deadline from now plus seconds (0: none). */
uint64_t tpi_deadline_after(tp_core *c, double seconds);

/* The context's worker with a counted reference (tpi_core_unref), or NULL. */
tp_core *tpi_context_core(tp_context *ctx);
/*
 * Enters the API for the calling context's worker: TP_ENOTINIT or
 * TP_ESHUTDOWN (with a message naming what was attempted) when there is no
 * running worker. On TP_OK *out is counted in api_refs: pair with tpi_leave.
 */
tp_status tpi_enter(const char *what, tp_core **out);
/* Enters for a known core (a future's or rref's). */
tp_status tpi_enter_core(tp_core *c, const char *what);
void tpi_leave(tp_core *c);

/* "worker 'w1' (id 1)" into buf. */
const char *tpi_worker_desc(const tp_core *c, uint32_t id, char *buf, size_t len);
/* Resolves a destination; TP_EUNKNOWNWORKER with a message. */
tp_status tpi_resolve(tp_core *c, tp_dest dest, uint32_t *id);

/* Encodes and sends m; rrefs inside are forked (lock taken as needed). */
tp_status tpi_send_msg(tp_core *c, uint32_t dst, const tpi_msg *m, char *errmsg,
                       size_t errmsg_len);

/* ---- call.c ------------------------------------------------------------- */

/*
 * Issues a call (lock held): assigns the id, encodes m (m->id set here),
 * registers the call with its deadline, sends. On failure nothing is
 * registered and the call is freed, the status returned with a message.
 * On TP_OK *out (optional) is the call (owned by the core).
 */
tp_status tpi_call_issue(tp_core *c, tpi_call *call, tpi_msg *m, double timeout_s);
tpi_call *tpi_call_new(tp_core *c, uint32_t dst, uint8_t type, const char *what,
                       const char *fn);
void tpi_call_free(tp_core *c, tpi_call *call);
/* Completes a call (lock held): unregisters, runs on_reply, completes the future. */
void tpi_call_finish(tp_core *c, tpi_call *call, tp_status st, tpi_msg *reply,
                     const char *errmsg);
/* Fails every call (lock held) to dst (UINT32_MAX: all) with st and a message. */
void tpi_calls_fail(tp_core *c, uint32_t dst, tp_status st, const char *why);
/* Handles a RESPONSE frame (I/O context, lock not held). */
void tpi_on_response(tp_core *c, uint32_t src, tp_frame *f);
/* Fires expired deadlines (lock held) and rearms the timer. */
void tpi_deadlines_run(tp_core *c);
/* Wakes the tasks waiting for dst's send window (lock held): dst died. */
void tpi_window_wake_all(tp_core *c, uint32_t dst);
/* FLOW-7, FLOW-8 (lock held): peer was reported down or restarted; the debts
 * to it are given back and what it queued here stops counting against its
 * credit. */
void tpi_flow_peer_reset(tp_core *c, uint32_t peer);
/* FLOW-7 (lock held): the late response id from src pays its debt; 1 if it did. */
int tpi_debt_pay(tp_core *c, uint32_t src, uint64_t id);
/* Frees every debt record (teardown). */
void tpi_debts_free(tp_core *c);

/* ---- serve.c ------------------------------------------------------------ */

/* Handles a request-like frame from src (I/O context, lock not held). */
void tpi_on_request(tp_core *c, uint32_t src, tp_frame *f);
/* TP_OK, or TP_EINVAL with a message naming what when the calling thread
 * runs a non-blocking function, which must not wait (FUNC-6). */
tp_status tpi_check_may_wait(const char *what);
/* CANCEL-1: asks dst to give up request id (lock held; never waits). */
void tpi_cancel_send(tp_core *c, uint32_t dst, uint64_t id);
/* Sends a RESPONSE (lock not held). */
void tpi_reply(tp_core *c, uint32_t dst, uint64_t id, tp_status st, const tp_value *value,
               const char *errmsg);

/* ---- rref.c ------------------------------------------------------------- */

/*
 * Hooks for values crossing the wire. Sending an rref forks it at once
 * (under the lock, before the frame leaves, so the receiver's reply can
 * never find the fork unknown); tpi_rref_ctx_rollback undoes the forks when
 * the message is not sent after all.
 */
typedef struct tpi_fork_undo {
    tp_rref *rref; /* the sent reference */
    tpi_gid fork;
} tpi_fork_undo;
typedef struct tpi_rref_ctx {
    tp_core *core;
    uint32_t peer;  /* the destination (encode) or source (decode) */
    tpi_fork_undo *undo;
    size_t nundo, undo_cap;
    /* Decode for a function (RREF-13): collect every user rref whose fork
     * went to its owner unanswered, pinned, so the function runs only once
     * the owner confirmed them all (tpi_rrefs_await_confirmed). */
    int collect;
    tp_rref **pending;
    size_t npending, pending_cap;
    int lost; /* a fork could not be collected (no memory): the function is refused */
} tpi_rref_ctx;
void tpi_rref_hooks(tpi_rref_ctx *rc, tpi_codec_hooks *hooks);
void tpi_rref_ctx_rollback(tpi_rref_ctx *rc);
/* The message went to the agent: the forks it carries are on the wire now,
 * where a broken connection can lose them (RREF-19 asks about them). */
void tpi_rref_ctx_sent(tpi_rref_ctx *rc);
/* Frees the context's lists; unpins what it collected. */
void tpi_rref_ctx_done(tpi_rref_ctx *rc);
/* RREF-13: parks until the owner answered every fork rc collected, or the
 * deadline. TP_OK when all are confirmed; else the status with a message
 * for what (the function about to run) in err. Lock not held. */
tp_status tpi_rrefs_await_confirmed(tpi_rref_ctx *rc, uint64_t deadline, const char *what,
                                    char *err, size_t err_len);

tpi_gid tpi_new_gid(tp_core *c);
/* Owner-side handling of RREF_* messages and REMOTE (lock not held). */
void tpi_rref_on_message(tp_core *c, uint32_t src, tpi_msg *m);
/* RREF-20 (lock held): the worker that made rref id is dead, or restarted
 * since it made it (ids carry the incarnation that minted them, REJOIN-3). */
int tpi_rref_creator_gone(const tp_core *c, tpi_gid id);
/* RREF-14, RREF-20, RREF-21 (lock held): for rref id, unknown on this
 * owner, the status to refuse it with when its value can never come here
 * (creator abandoned it, died, restarted; or this owner freed it), with why
 * in err; TP_OK when its remote() may still come. */
tp_status tpi_rref_never_created(const tp_core *c, tpi_gid id, char *err, size_t err_len);
/* 1 when r's owner is known to have restarted since r's value was made
 * there (REJOIN-6): the value went with the earlier process. A handle may
 * also name an incarnation newer than this worker has heard of yet (it came
 * from a peer that has): that one is not stale. */
static inline int tpi_rref_owner_restarted(const tp_core *c, const tp_rref *r) {
    return r->owner != c->rank && r->owner_inc < tpi_peer_inc(c, r->owner);
}
/* Owner record lookup/creation (lock held). */
tpi_owner *tpi_owner_get_or_create(tp_core *c, tpi_gid id);
/* Records that holder has fork (lock held). */
tp_status tpi_owner_add_fork(tp_core *c, tpi_owner *o, tpi_gid fork, uint32_t holder);
/* Sets the value of an owner record (lock held) and answers waiting fetches. */
void tpi_owner_set(tp_core *c, tpi_owner *o, tp_status st, tp_value *value, const char *errmsg);
/* Waits (lock held) until the record has its value, or deadline
 * (TP_ETIMEDOUT) or teardown (TP_ESHUTDOWN); METHOD-3, RREF-8. */
tp_status tpi_owner_wait(tp_core *c, tpi_owner *o, uint64_t deadline);
/* FAIR-1 (serve.c): one source's jobs waiting for a pool thread. */
typedef struct tpi_runq {
    struct tpi_job *head, *tail;
    uint32_t next; /* the next source in the round; UINT32_MAX: the last */
    uint32_t njobs;
    int in_round;
    int stalled; /* FAIR-2: out of the round while the agent says its answers wait */
} tpi_runq;

/*
 * What a worker keeps about one peer (lock), made by tpi_peer_get on first
 * contact: the first call to it (issue), the first request from it
 * (flow_admit), an owner record of its remote(), a forks query either way,
 * news that its connection reset. A peer without one has every field 0.
 */
typedef struct tpi_peer {
    tpi_runq runq;           /* FAIR-1 (serve.c): its requests waiting for a pool thread */
    uint64_t inflight;       /* request bytes in flight to it, debts included (FLOW-7) */
    uint64_t held;           /* its request bytes held here under its credit (FLOW-8) */
    uint64_t forks_asked_ns; /* its first forks query not answered yet (RREF-19), or 0 */
    uint32_t undecoded;      /* its requests queued here not yet decoded (RREF-19) */
    uint32_t remote_values;  /* owner records its remote()s made here (RREF-23) */
    uint32_t held_epoch;     /* bumped when it is reported down or restarts (FLOW-8) */
    uint32_t flow_gen;       /* FLOW-9: ours toward it, bumped by each reset */
    uint32_t src_gen;        /* FLOW-9: its toward us that held counts */
    uint32_t nwaiting;       /* window waiters for it in the core's list (FLOW-2) */
    uint8_t src_gen_known;   /* src_gen is set (0 after a reset of the peer) */
    uint8_t refused_warned;  /* a refusal was logged at warn this epoch (FLOW-8) */
    uint8_t forks_query;     /* RREF-19's query to it: 0 none, 1 out, 2 out + again */
    uint8_t unflushed;       /* a call to it timed out, so its request may still be on
                              * the wire, where no counter shows it (SHUTDOWN-5) */
} tpi_peer;

/* Every field 0: what tpi_peer_view gives for a peer without a record. */
extern const tpi_peer tpi_peer_none;
/* tpi_peer_get's slow path: makes id's record (zeroed, listed in peer_ids);
 * NULL when out of memory (lock held). */
tpi_peer *tpi_peer_make(tp_core *c, uint32_t id);
/* Where id is in peer_ids, or where it would go (lock held): a binary
 * search over the peers dealt with, a few for most workers. */
static inline uint32_t tpi_peer_slot(const tp_core *c, uint32_t id) {
    uint32_t lo = 0, hi = c->npeer_ids;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (c->peer_ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
/* id's record or NULL (lock held). */
static inline tpi_peer *tpi_peer_find(const tp_core *c, uint32_t id) {
    uint32_t i = tpi_peer_slot(c, id);
    return i < c->npeer_ids && c->peer_ids[i] == id ? c->peer_recs[i] : NULL;
}
/* id's record to read, or tpi_peer_none (lock held). */
static inline const tpi_peer *tpi_peer_view(const tp_core *c, uint32_t id) {
    const tpi_peer *p = tpi_peer_find(c, id);
    return p ? p : &tpi_peer_none;
}
/* id's record, which must exist: a call to it was issued, a job from it
 * admitted (lock held). */
static inline tpi_peer *tpi_peer_must(const tp_core *c, uint32_t id) {
    tpi_peer *p = tpi_peer_find(c, id);
    TPI_ASSERT(p);
    return p;
}
/* id's record, made (zeroed, listed in peer_ids) if there is none; NULL when
 * out of memory (lock held). */
static inline tpi_peer *tpi_peer_get(tp_core *c, uint32_t id) {
    tpi_peer *p = tpi_peer_find(c, id);
    return p ? p : tpi_peer_make(c, id);
}

/* Teardown (lock held, agent stopped): jobs left in the run queues (their
 * pool work could not be queued) are dropped unanswered. */
void tpi_serve_teardown(tp_core *c);
/* FAIR-2 (serve.c): dst's answers can go again: its queued jobs rejoin the
 * round and get the pool tokens owed. Lock not held. */
void tpi_serve_uncongested(tp_core *c, uint32_t dst);

/* METHOD-3 (serve.c, lock held): o was settled: its deferred method calls go
 * to the pool, in arrival order; or o is being freed (teardown): they are
 * dropped unanswered (the callers' side fails them). */
void tpi_owner_resume(tp_core *c, tpi_owner *o);
void tpi_owner_drop_deferred(tp_core *c, tpi_owner *o);
/* Frees the owner record if nothing holds it (lock held). */
void tpi_owner_maybe_free(tp_core *c, tpi_owner *o);
/* Sends the protocol messages due again by now (lock held); the earliest
 * still waiting, or TPI_NO_DEADLINE (RREF-15). */
void tpi_retries_run(tp_core *c, uint64_t now);
uint64_t tpi_retries_next(const tp_core *c);
/* Arms the agent's timer for the earliest deadline or retry (lock held). */
void tpi_rearm(tp_core *c);
/* RREF-19 (lock held): the connection to peer broke while both live: ask it
 * which of the forks sent to it it holds, and settle the rest. */
void tpi_forks_query(tp_core *c, uint32_t peer);
/* RREF-22 (lock held): on a transport that loses frames silently, the forks
 * this worker sent that no answer has settled yet, each peer holding one
 * asked at once (the shutdown drain waits for them); 0 elsewhere. */
size_t tpi_forks_at_risk(tp_core *c);
/* RREF-19: answers a peer's query (the tp:forks function, I/O context, lock
 * not held); *result caller-owned: a list of held flags, or nil for "ask
 * again later" while requests from src wait to be decoded. */
tp_status tpi_forks_serve(tp_core *c, uint32_t src, const tp_value *args, tp_value **result,
                          char *err, size_t err_len);
/* A peer died: drop its forks, children and fetches (lock held). */
void tpi_rrefs_peer_down(tp_core *c, uint32_t peer);
/* Graceful shutdown: release every user rref still held (lock held). */
void tpi_rrefs_release_all(tp_core *c);
/* RREF-18 (lock held): the references not settled now, sorted; *out
 * malloc'd (NULL when none). *incomplete is 1 when memory ran short. */
size_t tpi_rrefs_leaks(tp_core *c, tp_rref_leak **out, int *incomplete);
/* Teardown: frees every owner record and pending child (lock held). */
void tpi_rrefs_teardown(tp_core *c);
tp_rref *tpi_rref_new_user(tp_core *c, uint32_t owner, tpi_gid id, tpi_gid fork);
tp_rref *tpi_rref_new_owner(tp_core *c, tpi_owner *o);
/* Pins/unpins an rref's memory for a call in flight. */
void tpi_rref_pin(tp_rref *r);
void tpi_rref_unpin(tp_core *c, tp_rref *r);

/* ---- call.c: shared entry points ------------------------------------------ */

/* Starts a REQUEST (lock held); on TP_OK *out is a new future reference. */
tp_status tpi_start_request(tp_core *c, uint32_t dst, const char *what, const char *fn,
                            uint16_t flags, const tp_value *args, const tp_value *kwargs,
                            double timeout_s, tp_future **out);
/* A request registered under the lock whose frame is sent after it. */
typedef struct tpi_deferred {
    tp_frame *frame; /* NULL: nothing to send (it went already) */
    uint32_t dst;
    uint64_t id;
} tpi_deferred;
/* tpi_start_request that leaves the send of a message without rrefs to
 * tpi_send_deferred (defer may be NULL: send now). */
tp_status tpi_start_request_deferred(tp_core *c, uint32_t dst, const char *what, const char *fn,
                                     uint16_t flags, const tp_value *args, const tp_value *kwargs,
                                     double timeout_s, tp_future **out, tpi_deferred *defer);
/* Sends a deferred frame (lock not held). On failure the call ends with the
 * error (unless it ended already) and the status is returned with a message. */
tp_status tpi_send_deferred(tp_core *c, tpi_deferred *d, const char *what, const char *fn);
/* Waits for f (lock not held) and moves its result out, recording its message. */
tp_status tpi_future_result(tp_core *c, tp_future *f, tp_value **result);
/* Starts a REMOTE (lock held); *out is a new rref. */
tp_status tpi_start_remote(tp_core *c, uint32_t dst, const char *fn, uint16_t flags,
                           const tp_value *args, const tp_value *kwargs, double timeout_s,
                           tp_rref **out);

/* ---- rendezvous.c ------------------------------------------------------- */

/*
 * A round's sums (SHUTDOWN-5, spec/store.md STORE-12): names[i] is the key
 * "<prefix>/<names[i]>"; tpi_store_gather sets totals and have = 1 when it
 * read them instead of the ranks' values.
 */
typedef struct tpi_round_sums {
    const char *const *names;
    uint32_t n;
    int64_t *totals;
    int have;
} tpi_round_sums;

/*
 * STORE-12: after creating its "<prefix>/<rank>" key, a worker counts itself:
 * adds sums[i] to "<prefix>/<sum_names[i]>", then 1 to "<prefix>/count"
 * (lock not held), each once, never retried. A failed add makes the count
 * unreadable ("x") so that readers read the keys. Returns 1 when the count
 * can be relied on by this worker's gather (counted, or marked "x"), 0 when
 * not (no add or scan in the store, or even the "x" failed: the count may
 * stay short for good).
 */
int tpi_store_count(tp_core *c, const char *prefix, const char *const *sum_names,
                    const int64_t *sums, uint32_t nsums, uint64_t deadline_ns);
/*
 * STORE-12: creates "<prefix>/<rank>" = value (with " <k>" appended for
 * incarnation k >= 1) by compare-and-set from absent; when this process
 * created it, counts itself (tpi_store_count; sums are counts, never
 * negative: the caller asserts that). A key another process of this rank
 * created first (a live earlier incarnation, REJOIN-1) is not counted again.
 * *use_count: the use_count for this worker's tpi_store_gather. Returns the
 * store's status for the key (not wrapped in a message).
 */
tp_status tpi_store_put_counted(tp_core *c, const char *prefix, const char *value,
                                const char *const *sum_names, const int64_t *sums,
                                uint32_t nsums, int *use_count, uint64_t deadline_ns);
/*
 * Waits (lock not held) until "<prefix>/<r>" exists for every rank r, polling
 * with backoff through park. With use_count (STORE-12), while
 * "<prefix>/count" is short and no rank is known dead a poll reads that key
 * alone, and the keys only when the count is complete and their values are
 * wanted, when it cannot be trusted, or on a fixed schedule while it does not
 * move; else every poll reads every rank's key. values (optional): *values,
 * NULL at first, is made (world_size entries, freed by the caller with the
 * malloc'd values it receives) when a round first reads the keys; a wait
 * that a complete count ends makes no per-rank array at all. With sums, the
 * totals are read instead of the values when the count is complete
 * (sums->have), else the values. With honor_dead, ranks known dead (locally,
 * or by a "dead/<r>" key) are skipped; without it, "init/error" is checked
 * each round and its message returned. TP_ETIMEDOUT at deadline names the
 * missing ranks.
 */
tp_status tpi_store_gather(tp_core *c, const char *prefix, uint64_t deadline_ns, int honor_dead,
                           char ***values, tpi_round_sums *sums, int use_count, const char *what);
/*
 * Worker tables (infos and by_name) are immutable once made, and the workers
 * of one job hold equal ones: the workers of a process share one table per
 * distinct content (refcounted), so a simulated world of n workers holds one
 * table of n entries, not n of them. tpi_names_empty: a table of world
 * zeroed entries (names "", as before the all-gather); NULL when out of
 * memory. tpi_names_release drops a reference (NULL is ignored).
 */
struct tpi_names *tpi_names_empty(uint32_t world);
void tpi_names_release(struct tpi_names *t);
tp_worker_info *tpi_names_infos(struct tpi_names *t);
uint32_t *tpi_names_by_name(struct tpi_names *t);
/* By id: the credit each rank granted this worker (FLOW-6), UINT64_MAX in
 * the empty table (no grant read yet: the window alone). */
const uint64_t *tpi_names_credit(struct tpi_names *t);
/* Rank entries this process copied out of store scans so far (STORE-13:
 * a world's workers in one process share one parse; for tests). */
uint64_t tpi_rendezvous_rows_copied(void);
/* The init rendezvous (INIT-4..7): claims, all-gather, set_peers. */
tp_status tpi_rendezvous(tp_core *c, const char *addr, uint64_t deadline_ns);
/* Then the ready barrier and the commit (INIT-5, INIT-8); the worker already
 * serves requests while it waits here. */
tp_status tpi_rendezvous_ready(tp_core *c, uint64_t deadline_ns);
/* REJOIN-1..3: a restarted worker's rendezvous: checks the job, takes the next
 * incarnation of its rank, gathers the peers (c->incarnation, peer_inc set). */
tp_status tpi_rendezvous_rejoin(tp_core *c, const char *addr, uint64_t deadline_ns);

/*
 * The values other workers wrote, read back from the store: parsed here and
 * nowhere else, never trusted (a store row crossed a trust boundary).
 * tpi_outcome_parse: "init/error" = "<status name>\t<message>" (INIT-5): the
 * status, TP_ESTORE for a value it cannot read; *msg the message (the whole
 * value when there is no tab). Cuts v at the tab.
 * tpi_rank_entry_parse: "init/rank/<r>" = "<name>\t<credit>\t<address>", the
 * name 1 to TP_NAME_LEN_MAX bytes, the credit (FLOW-6) TPI_INFLIGHT_BYTES_MIN to
 * TPI_INFLIGHT_BYTES_MAX written as "%llu": 1, v cut at the first tab,
 * *credit and *addr after the second; else 0, v as it was.
 * tpi_inc_parse: "inc/<r>" = "<k>\t<address>", k in 1..TPI_INCARNATION_MAX
 * written as "%u", the address not empty (REJOIN-2): 1 and *k, *addr; else 0.
 */
tp_status tpi_outcome_parse(char *v, const char **msg);
int tpi_rank_entry_parse(char *v, uint64_t *credit, const char **addr);
int tpi_inc_parse(const char *v, uint32_t *k, const char **addr);
/* The newest incarnation of q published in the store (*k = 0: none) and its
 * address (REJOIN-2). */
tp_status tpi_rejoin_lookup(tp_core *c, uint32_t q, uint32_t *k, char *addr, size_t addr_len,
                            uint64_t deadline_ns);

/* ---- rejoin.c (REJOIN-4..6) -------------------------------------------------- */

/* Tells every peer not known dead of this worker's incarnation and address,
 * bounded by the deadline; a peer that is dead is skipped. */
tp_status tpi_rejoin_announce(tp_core *c, const char *addr, uint64_t deadline_ns);
/* Serves tp:join from src (I/O context, lock not held): args [incarnation, address]. */
tp_status tpi_rejoin_serve(tp_core *c, uint32_t src, const tp_value *args, char *err,
                           size_t err_len);
/* 1 when a frame of type `type` and id from src was minted by an incarnation
 * of src older than the newest known (REJOIN-5): it is dropped. I/O context. */
int tpi_rejoin_stale(const tp_core *c, uint32_t src, uint8_t type, uint64_t id);
/* TP_OK, or TP_EPEERDOWN with a message when r's owner restarted since r was
 * made (its value went with that incarnation), after "<what>: " unless what
 * is NULL (a caller that adds its own). Lock held. */
tp_status tpi_rref_owner_check(tp_core *c, const tp_rref *r, const char *what);
/* Publishes "dead/<r>" for every peer known dead (lock not held). */
void tpi_publish_dead(tp_core *c, uint64_t deadline_ns);

/* ---- store_retry.c ------------------------------------------------------ */

/*
 * The core's store calls (lock not held): TP_ESTORE is retried with backoff
 * until deadline_ns (STORE-9); then it is returned, with the store's errmsg
 * saying for how long it failed. Any other status returns at once.
 */
tp_status tpi_store_set(tp_core *c, const char *key, const void *value, size_t len,
                        uint64_t deadline_ns);
tp_status tpi_store_get(tp_core *c, const char *key, void **value, size_t *len,
                        uint64_t deadline_ns);
tp_status tpi_store_cas(tp_core *c, const char *key, const void *expected, size_t expected_len,
                        const void *desired, size_t desired_len, int *swapped,
                        uint64_t deadline_ns);
/* The store's optional scan (STORE-10), retried the same way; the store must
 * have one (c->store->ops->scan). fn may see a key again after a retry. */
tp_status tpi_store_scan(tp_core *c, const char *prefix,
                         int (*fn)(void *arg, const char *key, const void *value, size_t len),
                         void *arg, uint64_t deadline_ns);
/* Parks (lock not held) until now + *backoff, bounded by deadline; then
 * doubles *backoff up to cap. TP_ESHUTDOWN when the worker is torn down. */
tp_status tpi_store_nap(tp_core *c, uint64_t *backoff, uint64_t cap, uint64_t deadline);

/* ---- shutdown.c --------------------------------------------------------- */

tp_status tpi_shutdown_graceful(tp_core *c);

/* The store key prefix for this generation: "g<gen>/". */
size_t tpi_key(const tp_core *c, char *buf, size_t len, const char *fmt, ...) TPI_PRINTF(4, 5);

/* Marks peer r dead (1) or alive again (0), keeping ndead. Lock held. */
static inline void tpi_peer_dead_set(tp_core *c, uint32_t r, int dead) {
    TPI_ASSERT(r < c->world_size && c->ndead <= c->world_size);
    c->ndead += (uint32_t)(dead != 0) - (uint32_t)(c->peer_dead[r] != 0);
    c->peer_dead[r] = dead != 0;
}

#endif
