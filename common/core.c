/* core.c: the worker object, API entry, upcall dispatch (spec/agent.md AGENT-2). */
#include "canary.h"
#include "core.h"
#include "limits.h"
#include "log.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void tpi_core_ref(tp_core *c) {
    int old = atomic_fetch_add(&c->refs, 1);
    TPI_ASSERT(old > 0);
}

void tpi_core_unref(tp_core *c) {
    int old = atomic_fetch_sub(&c->refs, 1);
    TPI_ASSERT(old > 0);
    if (old == 1)
        tpi_core_free(c);
}

void tpi_lock(tp_core *c) {
    tp_task *self = c->ops->task_self(c->agent);
    TPI_ASSERT(atomic_load(&c->lock_owner) != self); /* not recursive */
    c->ops->lock(c->agent);
    atomic_store(&c->lock_owner, self);
}

void tpi_unlock(tp_core *c) {
    TPI_ASSERT(atomic_load(&c->lock_owner) == c->ops->task_self(c->agent));
    tp_value **grave = c->grave;
    size_t n = c->ngrave;
    c->grave = NULL;
    c->ngrave = c->grave_cap = 0;
    atomic_store(&c->lock_owner, NULL);
    c->ops->unlock(c->agent);
    for (size_t i = 0; i < n; i++)
        tp_value_free(grave[i]);
    free(grave);
}

void tpi_defer_free(tp_core *c, tp_value *v) {
    if (!v)
        return;
    if (atomic_load(&c->state) == TPI_STATE_STOPPED || !tpi_lock_held(c)) {
        tp_value_free(v);
        return;
    }
    if (c->ngrave == c->grave_cap) {
        size_t cap = c->grave_cap ? 2 * c->grave_cap : 8;
        tp_value **g = realloc(c->grave, cap * sizeof *g);
        if (!g) { /* rare: free in place rather than leak */
            tp_value_free(v);
            return;
        }
        c->grave = g;
        c->grave_cap = cap;
    }
    c->grave[c->ngrave++] = v;
}

/* ---- Per-peer records (core.h: struct tpi_peer) ------------------------------ */

const tpi_peer tpi_peer_none;

tpi_peer *tpi_peer_make(tp_core *c, uint32_t id) {
    TPI_ASSERT(id < c->world_size);
    uint32_t at = tpi_peer_slot(c, id);
    if (at < c->npeer_ids && c->peer_ids[at] == id)
        return c->peer_recs[at];
    if (c->npeer_ids == c->peer_ids_cap) {
        uint32_t cap = c->peer_ids_cap ? c->peer_ids_cap * 2 : 8;
        uint32_t *ids = realloc(c->peer_ids, cap * sizeof *ids);
        if (ids)
            c->peer_ids = ids;
        tpi_peer **recs = ids ? realloc(c->peer_recs, cap * sizeof *recs) : NULL;
        if (!recs)
            return NULL; /* a grown peer_ids alone is harmless: cap is unchanged */
        c->peer_recs = recs;
        c->peer_ids_cap = cap;
    }
    tpi_peer *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    /* Ascending: a worker deals with few peers, so a move is short. */
    uint32_t n = c->npeer_ids - at;
    memmove(&c->peer_ids[at + 1], &c->peer_ids[at], n * sizeof *c->peer_ids);
    memmove(&c->peer_recs[at + 1], &c->peer_recs[at], n * sizeof *c->peer_recs);
    c->peer_ids[at] = id;
    c->peer_recs[at] = p;
    c->npeer_ids++;
    return p;
}

tp_status tpi_peer_inc_set(tp_core *c, uint32_t id, uint32_t k) {
    TPI_ASSERT(id < c->world_size);
    _Atomic(uint32_t) *v = atomic_load_explicit(&c->peer_inc, memory_order_relaxed);
    if (!v) {
        /* Zeroed before it is published: a reader sees 0 or the table. */
        v = calloc(c->world_size, sizeof *v);
        if (!v)
            return tpi_fail(TP_ENOMEM, "out of memory for the incarnations of %u workers",
                            c->world_size);
        atomic_store_explicit(&c->peer_inc, v, memory_order_release);
    }
    atomic_store_explicit(&v[id], k, memory_order_relaxed);
    return TP_OK;
}

int tpi_lock_held(tp_core *c) {
    return atomic_load(&c->lock_owner) == c->ops->task_self(c->agent);
}

void tpi_work_enter_locked(tp_core *c, tpi_waiter *node) {
    node->task = c->ops->task_self(c->agent);
    node->prev = NULL;
    node->next = c->in_work;
    if (c->in_work)
        c->in_work->prev = node;
    c->in_work = node;
}

void tpi_work_enter(tp_core *c, tpi_waiter *node) {
    tpi_lock(c);
    tpi_work_enter_locked(c, node);
    tpi_unlock(c);
}

void tpi_work_leave_locked(tp_core *c, tpi_waiter *node) {
    if (node->prev)
        node->prev->next = node->next;
    else
        c->in_work = node->next;
    if (node->next)
        node->next->prev = node->prev;
}

void tpi_work_leave(tp_core *c, tpi_waiter *node) {
    tpi_lock(c);
    tpi_work_leave_locked(c, node);
    tpi_unlock(c);
}

int tpi_in_work(tp_core *c) {
    tp_task *self = c->ops->task_self(c->agent);
    tpi_lock(c);
    int found = 0;
    for (tpi_waiter *w = c->in_work; w && !found; w = w->next)
        found = w->task == self;
    tpi_unlock(c);
    return found;
}

tp_status tpi_park(tp_core *c, uint64_t deadline_ns) {
    return tpi_park_for(c, deadline_ns, TPI_NO_PEER);
}

tp_status tpi_park_for(tp_core *c, uint64_t deadline_ns, uint32_t peer) {
    /* FUNC-6: the API entries that wait refuse earlier; this is the backstop
     * that keeps the I/O context from ever parking. */
    if (tpi_check_may_wait("wait") != TP_OK)
        return TP_EINVAL;
    tp_task *self = c->ops->task_self(c->agent);
    TPI_ASSERT(atomic_load(&c->lock_owner) == self);
    /* INTERRUPT-1: the task running an interruptible init or graceful
     * shutdown looks at the flag before each park and at least every
     * TPI_INTERRUPT_POLL_NS; a shorter park wakes early, as a spurious
     * wakeup (AGENT-12) that every caller already loops over. */
    int watch = c->intr_epoch != 0 && c->intr_task == self;
    if (watch && tpi_interrupted(c))
        return TP_ECANCELED;
    uint64_t until = deadline_ns;
    if (watch) {
        uint64_t now = tpi_now(c);
        if (until > now && until - now > TPI_INTERRUPT_POLL_NS)
            until = now + TPI_INTERRUPT_POLL_NS;
    }
    tpi_waiter node = {self, NULL, c->parked};
    if (c->parked)
        c->parked->prev = &node;
    c->parked = &node;
    atomic_store(&c->lock_owner, NULL);
    tp_status st = peer != TPI_NO_PEER && c->ops->park_peer
                       ? c->ops->park_peer(c->agent, self, until, peer)
                       : c->ops->park(c->agent, self, until);
    atomic_store(&c->lock_owner, self);
    if (node.prev)
        node.prev->next = node.next;
    else
        c->parked = node.next;
    if (node.next)
        node.next->prev = node.prev;
    /* Teardown wakes every parked task; the state tells it to give up. */
    if (st == TP_OK && atomic_load(&c->state) != TPI_STATE_RUNNING)
        st = TP_ESHUTDOWN;
    if (watch && st != TP_ESHUTDOWN && tpi_interrupted(c))
        st = TP_ECANCELED;
    else if (st == TP_ETIMEDOUT && until != deadline_ns)
        st = TP_OK; /* our poll, not the caller's deadline */
    return st;
}

uint64_t tpi_deadline_after(tp_core *c, double seconds) {
    if (seconds <= 0)
        return TPI_NO_DEADLINE;
    uint64_t now = tpi_now(c);
    double ns = ceil(seconds * 1e9);
    if (ns >= (double)(TPI_NO_DEADLINE - now))
        return TPI_NO_DEADLINE;
    return now + (uint64_t)ns;
}

tp_status tpi_enter_core(tp_core *c, const char *what) {
    /* Count ourselves in first, then look at the state: teardown sets the
     * state first, then waits for api_refs, so one of us sees the other. */
    atomic_fetch_add(&c->api_refs, 1);
    if (atomic_load(&c->state) != TPI_STATE_RUNNING) {
        atomic_fetch_sub(&c->api_refs, 1);
        return tpi_fail(TP_ESHUTDOWN, "%s: rpc worker '%s' is shut down", what, c->self.name);
    }
    return TP_OK;
}

tp_core *tpi_context_core(tp_context *ctx) {
    tpi_context_lock(ctx);
    tp_core *c = ctx->core;
    if (c)
        tpi_core_ref(c);
    tpi_context_unlock(ctx);
    return c;
}

tp_status tpi_enter(const char *what, tp_core **out) {
    tp_core *c = tpi_context_core(tp_context_current());
    if (!c)
        return tpi_fail(TP_ENOTINIT, "%s: rpc is not initialized: call tp_init_rpc first", what);
    tp_status st = tpi_enter_core(c, what);
    tpi_core_unref(c); /* the context's own reference keeps it while running */
    if (st == TP_OK)
        *out = c;
    return st;
}

void tpi_leave(tp_core *c) {
    int old = atomic_fetch_sub(&c->api_refs, 1);
    TPI_ASSERT(old > 0);
}

const char *tpi_worker_desc(const tp_core *c, uint32_t id, char *buf, size_t len) {
    if (c->infos && id < c->world_size)
        tpi_format(buf, len, "worker '%s' (id %u)", c->infos[id].name, id);
    else
        tpi_format(buf, len, "worker id %u", id);
    return buf;
}

static int find_name(const tp_core *c, const char *name, uint32_t *id) {
    size_t lo = 0, hi = c->world_size;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int cmp = strcmp(c->infos[c->by_name[mid]].name, name);
        if (cmp == 0) {
            *id = c->by_name[mid];
            return 1;
        }
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

tp_status tpi_resolve(tp_core *c, tp_dest dest, uint32_t *id) {
    switch (dest.kind) {
    case 0:
        if (!dest.name)
            return tpi_fail(TP_EINVAL, "destination name is NULL");
        if (!find_name(c, dest.name, id))
            return tpi_fail(TP_EUNKNOWNWORKER,
                            "could not find destination: no worker named '%s' in a world of %u",
                            dest.name, c->world_size);
        return TP_OK;
    case 1:
        if (dest.rank < 0 || (uint32_t)dest.rank >= c->world_size)
            return tpi_fail(TP_EUNKNOWNWORKER, "no worker with rank %d: ranks are 0..%u",
                            (int)dest.rank, c->world_size - 1);
        *id = (uint32_t)dest.rank;
        return TP_OK;
    case 2:
        if (dest.rank < 0 || (uint32_t)dest.rank >= c->world_size || !dest.name ||
            strcmp(c->infos[dest.rank].name, dest.name) != 0)
            return tpi_fail(TP_EUNKNOWNWORKER, "worker info '%s' (id %d) names no worker here",
                            dest.name ? dest.name : "(null)", (int)dest.rank);
        *id = (uint32_t)dest.rank;
        return TP_OK;
    }
    return tpi_fail(TP_EINVAL, "destination kind %d is not name, rank or info", dest.kind);
}

tp_status tpi_send_msg(tp_core *c, uint32_t dst, const tpi_msg *m, char *errmsg,
                       size_t errmsg_len) {
    tpi_rref_ctx rc = {c, dst, NULL, 0, 0};
    tpi_codec_hooks hooks;
    tpi_rref_hooks(&rc, &hooks);
    tp_frame *f = NULL;
    tp_status st = tpi_msg_encode(m, &hooks, c->max_msg, &f, errmsg, errmsg_len);
    if (st == TP_OK) {
        st = c->ops->send(c->agent, dst, f);
        if (st != TP_OK) {
            tp_frame_free(f);
            tpi_format(errmsg, errmsg_len, "send to worker id %u failed: %s", dst,
                       tp_strerror(st));
        }
    }
    if (st != TP_OK)
        tpi_rref_ctx_rollback(&rc);
    else
        tpi_rref_ctx_sent(&rc);
    tpi_rref_ctx_done(&rc);
    return st;
}

size_t tpi_key(const tp_core *c, char *buf, size_t len, const char *fmt, ...) {
    size_t n = tpi_format(buf, len, "g%u/", c->generation);
    va_list ap;
    va_start(ap, fmt);
    n += tpi_vformat(buf + n, len - n, fmt, ap);
    va_end(ap);
    return n;
}

/* ---- Upcalls (AGENT-2): I/O context, lock not held. ------------------------ */

/* ---- Repeated frames (CALL-10) ----------------------------------------------------- */

struct tpi_seen {
    uint32_t src;
    uint64_t id;
    uint64_t until_ns;
};

/*
 * 1 when src already sent a frame with this id within TPI_DEDUPE_WINDOW_NS
 * (a copy the transport made: drop it); else remembers it, 0. Every frame
 * but a RESPONSE carries an id its sender minted for it alone (REJOIN-3):
 * a retry (RREF-15) is a new frame with a new id, never a copy. Lock held.
 */
static int seen_before(tp_core *c, uint32_t src, uint64_t id) {
    uint64_t now = tpi_now(c);
    while (c->seen_len > 0) { /* forget what is older than the window */
        struct tpi_seen *old = &c->seen_ring[c->seen_head];
        /* A copy may come a whole window behind (AGENT-17): still one. */
        if (old->until_ns >= now && c->seen_len < TPI_DEDUPE_MAX)
            break;
        tpi_idmap_del(&c->seen, (tpi_gid){old->src, old->id});
        c->seen_head = (c->seen_head + 1) % TPI_DEDUPE_MAX;
        c->seen_len--;
    }
    tpi_gid key = {src, id};
    if (tpi_idmap_get(&c->seen, key))
        return 1;
    if (!c->seen_ring && !(c->seen_ring = malloc(TPI_DEDUPE_MAX * sizeof *c->seen_ring)))
        return 0; /* no memory to remember: let it through, as without dedupe */
    if (tpi_idmap_put(&c->seen, key, (void *)1) != TP_OK)
        return 0;
    size_t tail = (c->seen_head + c->seen_len) % TPI_DEDUPE_MAX;
    c->seen_ring[tail] = (struct tpi_seen){src, id, now + TPI_DEDUPE_WINDOW_NS};
    c->seen_len++;
    return 0;
}

void tp_core_on_frame(tp_core *c, uint32_t src, tp_frame *f) {
    TPI_ASSERT(c && f);
    if (atomic_load(&c->state) != TPI_STATE_RUNNING || src >= c->world_size) {
        tp_frame_free(f);
        return;
    }
    uint8_t type = tpi_frame_type(f);
    if (tpi_rejoin_stale(c, src, type, tpi_frame_id(f))) {
        tp_frame_free(f); /* REJOIN-5: sent by an incarnation that has been replaced */
        return;
    }
    if (c->dedupe && type != TPI_MSG_RESPONSE && !TPI_CANARY(TPI_CANARY_DEDUPE_OFF)) {
        tpi_lock(c);
        int repeat = seen_before(c, src, tpi_frame_id(f));
        tpi_unlock(c);
        if (repeat) {
            tp_frame_free(f); /* CALL-10: a copy; the original was served */
            return;
        }
    }
    if (type == TPI_MSG_RESPONSE)
        tpi_on_response(c, src, f);
    else
        tpi_on_request(c, src, f);
}

void tp_core_on_peer_down(tp_core *c, uint32_t peer, tp_status why, const char *detail) {
    TPI_ASSERT(c);
    if (peer >= c->world_size)
        return;
    char who[TP_NAME_LEN_MAX + 32];
    char msg[TP_ERRMSG_LEN_MAX];
    tpi_worker_desc(c, peer, who, sizeof who);
    tpi_format(msg, sizeof msg, "%s is %s: %s", who,
               why == TP_EPEERDOWN ? "down" : "unreachable (connection lost)",
               detail ? detail : "no detail");
    tpi_lock(c);
    if (why == TP_EPEERDOWN) {
        /* LOG-3: a death, once; peers leaving while this worker shuts down
         * too are the end of the job, not news (a stale read only picks the
         * level). */
        if (!c->peer_dead[peer])
            tpi_log(atomic_load_explicit(&c->shutting_down, memory_order_relaxed) ? TP_LOG_INFO
                                                                                  : TP_LOG_WARN,
                    "worker '%s' (rank %u): %s", c->self.name, c->rank, msg);
        tpi_peer_dead_set(c, peer, 1);
        tpi_rrefs_peer_down(c, peer);
    } else {
        tpi_log(TP_LOG_INFO, "worker '%s' (rank %u): %s", c->self.name, c->rank, msg);
    }
    tpi_calls_fail(c, peer, why == TP_EPEERDOWN ? TP_EPEERDOWN : why, msg);
    tpi_flow_peer_reset(c, peer); /* FLOW-7, FLOW-8; FLOW-3: waiters see the verdict */
    if (why != TP_EPEERDOWN && !c->peer_dead[peer] && peer != c->rank &&
        atomic_load(&c->state) == TPI_STATE_RUNNING)
        tpi_forks_query(c, peer); /* RREF-19: after the calls it ended failed */
    tpi_unlock(c);
}

void tp_core_on_timer(tp_core *c) {
    TPI_ASSERT(c);
    tpi_lock(c);
    tpi_deadlines_run(c);
    tpi_unlock(c);
}

void tp_core_on_uncongested(tp_core *c, uint32_t dst) {
    TPI_ASSERT(c);
    if (dst < c->world_size)
        tpi_serve_uncongested(c, dst);
}
