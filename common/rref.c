/*
 * rref.c: remote references (spec/rref.md RREF-1..16).
 *
 * The owner keeps a tpi_owner per value with the set of forks (user
 * references elsewhere) and its own local handles. A user reference is a
 * tp_rref with a fork id. The two guarantees:
 *  - the owner hears of every user deletion (RREF_DELETE, answered);
 *  - a parent keeps its reference until the child it sent is confirmed by
 *    the owner (the parent holds a handle in `children` until RREF_ACCEPT).
 * A function runs only once every rref among its arguments is confirmed
 * (RREF-13: decode collects the forks, tpi_rrefs_await_confirmed waits).
 * Protocol messages are sent again until answered (RREF-15: proto_send);
 * duplication and reordering beyond TCP's are a later step.
 */
#include <stdlib.h>
#include <string.h>

#include "canary.h"
#include "core.h"
#include "log.h"
#include "options.h"
#include "registry.h"

typedef struct tpi_child {
    tp_rref *rref; /* a handle kept for the child */
    uint32_t to;
    int in_transit; /* its frame is not handed to the agent yet (RREF-19) */
    uint64_t sent_ns; /* when its frame was handed over; 0 once the peer said it holds it (RREF-22) */
} tpi_child;

struct tpi_fetch {
    uint32_t src;
    uint64_t id;
    tpi_fetch *next;
};

static const tpi_gid no_fork = {0, 0};

static void proto_send(tp_core *c, uint8_t type, uint32_t dst, tp_rref *r, tpi_gid fork,
                       uint32_t parent, uint32_t attempt);

tpi_gid tpi_new_gid(tp_core *c) {
    tpi_gid g = {c->rank, atomic_fetch_add(&c->next_gid, 1) + 1}; /* REJOIN-3: from inc << 40 */
    return g;
}

/* ---- Owner records ---------------------------------------------------------- */

/* RREF-22: how long ago a fork's frame was handed over, from its sent_ns
 * (the send's time + 1, so that 0 can mean "not at risk"). */
static uint64_t fork_age(uint64_t now, uint64_t sent_ns) {
    TPI_ASSERT(sent_ns != 0 && now + 1 >= sent_ns);
    return now + 1 - sent_ns;
}

/* The last cap ids pushed (RREF-14's abandoned ids, RREF-21's freed ones).
 * Without memory nothing is remembered: a later fork then only leaks a
 * placeholder, never frees a held value. */
static void ring_push(tpi_gid **ring, size_t *pushed, size_t cap, tpi_gid id) {
    if (!*ring && !(*ring = calloc(cap, sizeof **ring)))
        return;
    (*ring)[(*pushed)++ % cap] = id;
}

static int ring_has(const tpi_gid *ring, size_t pushed, size_t cap, tpi_gid id) {
    size_t n = pushed < cap ? pushed : cap;
    for (size_t i = 0; ring && i < n; i++)
        if (tpi_gid_eq(ring[i], id))
            return 1;
    return 0;
}


tpi_owner *tpi_owner_get_or_create(tp_core *c, tpi_gid id) {
    tpi_owner *o = tpi_idmap_get(&c->owners, id);
    if (o)
        return o;
    /* RREF-23: a record made by another worker's remote() counts in that
     * worker's record here. */
    tpi_peer *maker = NULL;
    if (id.worker != c->rank && id.worker < c->world_size && !(maker = tpi_peer_get(c, id.worker)))
        return NULL;
    o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    o->id = id;
    if (tpi_idmap_put(&c->owners, id, o) != TP_OK) {
        free(o);
        return NULL;
    }
    if (maker)
        maker->remote_values++;
    return o;
}

tp_status tpi_owner_add_fork(tp_core *c, tpi_owner *o, tpi_gid fork, uint32_t holder) {
    if (o->nforks == o->forks_cap) {
        size_t cap = o->forks_cap ? 2 * o->forks_cap : 4;
        tpi_fork_rec *grown = realloc(o->forks, cap * sizeof *grown);
        if (!grown)
            return TP_ENOMEM;
        o->forks = grown;
        o->forks_cap = cap;
    }
    o->forks[o->nforks].fork = fork;
    o->forks[o->nforks].holder = holder;
    o->forks[o->nforks].in_transit = 0;
    o->forks[o->nforks].sent_ns = 0; /* the holder asked for it: not at risk (RREF-22) */
    o->nforks++;
    tpi_probe_rref(c, TP_PROBE_RREF_OWNER_FORK, o->id, fork, holder);
    return TP_OK;
}

static int has_fork(const tpi_owner *o, tpi_gid fork) {
    for (size_t i = 0; i < o->nforks; i++)
        if (tpi_gid_eq(o->forks[i].fork, fork))
            return 1;
    return 0;
}

static int remove_fork(tp_core *c, tpi_owner *o, tpi_gid fork) {
    for (size_t i = 0; i < o->nforks; i++) {
        if (tpi_gid_eq(o->forks[i].fork, fork)) {
            tpi_probe_rref(c, TP_PROBE_RREF_OWNER_UNFORK, o->id, fork, o->forks[i].holder);
            /* Keep the order: iteration order must not depend on removal. */
            memmove(&o->forks[i], &o->forks[i + 1], (o->nforks - i - 1) * sizeof o->forks[0]);
            o->nforks--;
            return 1;
        }
    }
    return 0;
}

static void reply_fetch(tp_core *c, tpi_owner *o, uint32_t src, uint64_t id) {
    char err[TP_ERRMSG_LEN_MAX];
    if (o->status == TP_OK) {
        tpi_reply(c, src, id, TP_OK, o->value, NULL);
    } else {
        tpi_format(err, sizeof err, "%s", o->errmsg ? o->errmsg : tp_strerror(o->status));
        tpi_reply(c, src, id, o->status, NULL, err);
    }
}

void tpi_owner_set(tp_core *c, tpi_owner *o, tp_status st, tp_value *value, const char *errmsg) {
    TPI_ASSERT(!o->ready);
    o->ready = 1;
    o->status = st;
    o->value = st == TP_OK ? (value ? value : tp_value_nil()) : NULL;
    if (st != TP_OK) {
        tpi_defer_free(c, value);
        o->errmsg = strdup(errmsg && *errmsg ? errmsg : tp_strerror(st));
    }
    tpi_fetch *fe = o->fetches;
    o->fetches = NULL;
    while (fe) {
        tpi_fetch *next = fe->next;
        reply_fetch(c, o, fe->src, fe->id);
        free(fe);
        fe = next;
    }
    for (tpi_waiter *w = o->waiters; w; w = w->next)
        c->ops->unpark(c->agent, w->task);
    tpi_owner_resume(c, o);
}

/* The owner's record of a creation that failed for its creator (RREF-14):
 * from now on it answers with the error. A value already built stays in
 * memory until the record is freed (a local_value may have lent it out). */
static void owner_abandon(tp_core *c, tpi_owner *o, tp_status st, const char *msg) {
    if (!o->ready) {
        tpi_owner_set(c, o, st, NULL, msg); /* the running function's result is dropped */
        return;
    }
    if (o->status != TP_OK)
        return; /* failed already: the first error stands */
    o->status = st;
    o->errmsg = strdup(msg && *msg ? msg : tp_strerror(st));
}

static void owner_free(tp_core *c, tpi_owner *o) {
    void *was = tpi_idmap_del(&c->owners, o->id);
    TPI_ASSERT(was == o);
    if (o->id.worker != c->rank && o->id.worker < c->world_size) {
        tpi_peer *maker = tpi_peer_must(c, o->id.worker); /* made with o */
        TPI_ASSERT(maker->remote_values > 0);
        maker->remote_values--;
    }
    tpi_owner_drop_deferred(c, o); /* only teardown frees a record not yet ready */
    tpi_fetch *fe = o->fetches;
    while (fe) {
        tpi_fetch *next = fe->next;
        free(fe);
        fe = next;
    }
    tpi_defer_free(c, o->value); /* an object's destroy runs after the unlock */
    free(o->errmsg);
    free(o->forks);
    free(o);
}

void tpi_owner_maybe_free(tp_core *c, tpi_owner *o) {
    if (o->nforks == 0 && o->local_handles == 0 && !o->fetches && !o->waiters && !o->running &&
        o->ready) {
        tpi_probe_rref(c, TP_PROBE_RREF_OWNER_FREE, o->id, (tpi_gid){0, 0}, c->rank);
        if (c->reorders && o->id.worker != c->rank && /* RREF-21 */
            !TPI_CANARY(TPI_CANARY_FREED_FORGOTTEN))
            ring_push(&c->freed, &c->nfreed, TPI_FREED_MAX, o->id);
        owner_free(c, o);
    }
}

/* ---- Handles ------------------------------------------------------------------ */

static tp_rref *rref_alloc(tp_core *c, uint32_t owner, tpi_gid id) {
    tp_rref *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    atomic_init(&r->handles, 1);
    atomic_init(&r->refs, 1);
    atomic_init(&r->confirmed, 0);
    r->core = c;
    tpi_core_ref(c);
    r->owner = owner;
    r->owner_inc = owner == c->rank ? c->incarnation : tpi_peer_inc(c, owner);
    r->id = id;
    tpi_format(r->owner_name, sizeof r->owner_name, "%s", c->infos[owner].name);
    tpi_format(r->self_name, sizeof r->self_name, "%s", c->self.name);
    return r;
}

tp_rref *tpi_rref_new_user(tp_core *c, uint32_t owner, tpi_gid id, tpi_gid fork) {
    tp_rref *r = rref_alloc(c, owner, id);
    if (!r)
        return NULL;
    r->fork = fork;
    tpi_probe_rref(c, TP_PROBE_RREF_FORK_LIVE, id, fork, owner);
    r->next = c->users;
    if (c->users)
        c->users->prev = r;
    c->users = r;
    r->listed = 1;
    return r;
}

tp_rref *tpi_rref_new_owner(tp_core *c, tpi_owner *o) {
    tp_rref *r = rref_alloc(c, c->rank, o->id);
    if (!r)
        return NULL;
    r->is_owner = 1;
    atomic_store(&r->confirmed, 1);
    o->local_handles++;
    return r;
}

static void unlist(tp_core *c, tp_rref *r) {
    if (!r->listed)
        return;
    if (r->prev)
        r->prev->next = r->next;
    else
        c->users = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
    r->listed = 0;
}

static void rref_free(tp_rref *r) {
    tp_core *c = r->core;
    free(r->fail_msg);
    free(r->fork_msg);
    free(r);
    tpi_core_unref(c);
}

/*
 * Drops one reference to r's memory; the last frees it. One atomic count for
 * handles and calls in flight, so exactly one thread frees, even when a
 * user's last release and the loop's last unpin race (they run unlocked).
 */
static void rref_put(tp_rref *r) {
    int old = atomic_fetch_sub(&r->refs, 1);
    TPI_ASSERT(old > 0);
    if (old != 1)
        return;
    /* A running worker unlists a user rref at its last handle (its delete).
     * One still listed lost its last handle during teardown (a queued
     * callback freed a value holding it): teardown owns the list and frees
     * it there (tpi_rrefs_teardown), after the agent stopped. */
    if (r->listed)
        return;
    rref_free(r);
}

void tpi_rref_pin(tp_rref *r) {
    int old = atomic_fetch_add(&r->refs, 1);
    TPI_ASSERT(old > 0);
}

void tpi_rref_unpin(tp_core *c, tp_rref *r) {
    (void)c;
    rref_put(r);
}

/* Sends RREF_DELETE for a user reference (lock held). RREF-4. */
static void send_delete(tp_core *c, tp_rref *r) {
    unlist(c, r); /* even when no delete is owed (a creation that never left) */
    if (r->released)
        return;
    r->released = 1;
    tpi_probe_rref(c, TP_PROBE_RREF_FORK_GONE, r->id, r->fork, r->owner);
    if (c->peer_dead[r->owner] || tpi_rref_owner_restarted(c, r))
        return; /* the owner died, or restarted without the value (REJOIN-6) */
    if (r->fork_pending) { /* RREF-15: never before the owner recorded the fork */
        r->delete_deferred = 1;
        return;
    }
    proto_send(c, TPI_MSG_RREF_DELETE, r->owner, r, r->fork, 0, 0);
}

/*
 * Drops a kept child (lock held): the child was accepted, rolled back, or its
 * worker died. The parent's delete, if shutdown asked for one, waits for the
 * last child so it cannot overtake the child's fork at the owner (RREF-5).
 */
static void drop_child(tp_core *c, tpi_child *ch) {
    tp_rref *r = ch->rref;
    free(ch);
    TPI_ASSERT(r->children > 0);
    r->children--;
    if (r->children == 0 && r->delete_pending) {
        r->delete_pending = 0;
        send_delete(c, r);
    }
    tp_rref_release(r); /* lock held: handled inline */
}

/* The last handle went away (lock held, worker running): the protocol step. */
static void last_handle(tp_core *c, tp_rref *r) {
    if (r->is_owner) {
        tpi_owner *o = tpi_idmap_get(&c->owners, r->id);
        if (o) {
            TPI_ASSERT(o->local_handles > 0);
            o->local_handles--;
            tpi_owner_maybe_free(c, o);
        }
    } else {
        send_delete(c, r);
    }
}

tp_rref *tp_rref_clone(tp_rref *r) {
    TPI_ASSERT(r);
    int old = atomic_fetch_add(&r->handles, 1);
    TPI_ASSERT(old > 0);
    atomic_fetch_add(&r->refs, 1);
    return r;
}

/* Like tpi_enter_core, without recording a message: a release is not a call
 * that can fail (ERR-2). 1 when the worker runs and the agent may be used. */
static int enter_quietly(tp_core *c) {
    atomic_fetch_add(&c->api_refs, 1);
    if (atomic_load(&c->state) == TPI_STATE_RUNNING)
        return 1;
    atomic_fetch_sub(&c->api_refs, 1);
    return 0;
}

void tp_rref_release(tp_rref *r) {
    if (!r)
        return;
    int old = atomic_fetch_sub(&r->handles, 1);
    TPI_ASSERT(old > 0);
    if (old == 1) {
        /* Our share of refs keeps r alive through the protocol step. After
         * teardown (not running) the protocol state is gone: memory only. */
        tp_core *c = r->core;
        if (atomic_load(&c->state) == TPI_STATE_STOPPED) {
            /* nothing to tell anyone */
        } else if (tpi_lock_held(c)) { /* a value freed inside the core */
            if (atomic_load(&c->state) == TPI_STATE_RUNNING)
                last_handle(c, r);
        } else if (enter_quietly(c)) {
            tpi_lock(c);
            last_handle(c, r);
            tpi_unlock(c);
            tpi_leave(c);
        }
    }
    rref_put(r);
}

/* ---- Sending and receiving rrefs inside values (RREF-7) ------------------------ */

static tp_status encode_rref(void *ctx, tp_rref *r, tpi_rref_wire *w) {
    tpi_rref_ctx *rc = ctx;
    tp_core *c = rc->core;
    if (r->core != c)
        return tpi_fail(TP_EINVAL, "an rref from another worker context cannot be sent here");
    if (rc->nundo == rc->undo_cap) {
        size_t cap = rc->undo_cap ? 2 * rc->undo_cap : 4;
        tpi_fork_undo *grown = realloc(rc->undo, cap * sizeof *grown);
        if (!grown)
            return TP_ENOMEM;
        rc->undo = grown;
        rc->undo_cap = cap;
    }
    w->owner = r->owner;
    w->owner_inc = r->owner_inc;
    w->rref_id = r->id;
    w->fork_id = tpi_new_gid(c);
    w->parent = c->rank;
    int mine = tpi_lock_held(c);
    if (!mine)
        tpi_lock(c);
    tp_status st = TP_OK;
    tpi_owner *o = r->is_owner ? tpi_idmap_get(&c->owners, r->id) : NULL;
    if (!r->is_owner && (r->closed || r->released)) {
        st = tpi_fail(TP_ESHUTDOWN, "rref %u:%llu was released by shutdown and cannot be sent",
                      r->id.worker, (unsigned long long)r->id.local);
    } else if (!r->is_owner && tpi_rref_owner_restarted(c, r)) { /* REJOIN-6, RREF-20 */
        st = tpi_rref_owner_check(c, r, NULL); /* the encoder says "sending an rref" */
    } else if (!r->is_owner && r->failed) { /* RREF-14: one fact, at once */
        st = tpi_fail(r->failed, "rref %u:%llu cannot be sent: %s", r->id.worker,
                      (unsigned long long)r->id.local, r->fail_msg ? r->fail_msg : "its creation failed");
    } else if (o && o->ready && o->status != TP_OK) {
        st = tpi_fail(o->status, "rref %u:%llu cannot be sent: %s", r->id.worker,
                      (unsigned long long)r->id.local, o->errmsg ? o->errmsg : "its creation failed");
    } else if (r->is_owner) { /* the owner records the fork itself, at once */
        st = o ? tpi_owner_add_fork(c, o, w->fork_id, rc->peer) : TP_EINVAL;
        if (st == TP_OK)
            o->forks[o->nforks - 1].in_transit = 1;
    } else if (TPI_CANARY(TPI_CANARY_CHILD_DROPPED_EARLY)) {
        /* Canary: no pending child, so the parent's delete can overtake the
         * child's fork at the owner (a broken guarantee 2). */
    } else { /* keep our reference until the child is confirmed (guarantee 2) */
        tpi_child *ch = malloc(sizeof *ch);
        st = ch ? TP_OK : TP_ENOMEM;
        if (ch) {
            ch->rref = tp_rref_clone(r);
            ch->to = rc->peer;
            ch->in_transit = 1;
            ch->sent_ns = 0;
            st = tpi_idmap_put(&c->children, w->fork_id, ch);
            if (st != TP_OK) {
                /* Undo the clone; cannot be the last: the caller holds one. */
                atomic_fetch_sub(&r->handles, 1);
                atomic_fetch_sub(&r->refs, 1);
                free(ch);
            } else {
                r->children++;
            }
        }
    }
    if (!mine)
        tpi_unlock(c);
    if (st != TP_OK)
        return st;
    rc->undo[rc->nundo].rref = r;
    rc->undo[rc->nundo].fork = w->fork_id;
    rc->nundo++;
    return TP_OK;
}

/* Settles the forks a send made: undone when the frame never left
 * (rollback), or marked as on the wire (sent, RREF-19). */
static void forks_settle(tpi_rref_ctx *rc, int undo) {
    if (rc->nundo == 0)
        return;
    tp_core *c = rc->core;
    int mine = tpi_lock_held(c);
    if (!mine)
        tpi_lock(c);
    for (size_t i = 0; i < rc->nundo; i++) {
        tp_rref *r = rc->undo[i].rref;
        tpi_gid f = rc->undo[i].fork;
        if (!r->is_owner) {
            tpi_child *ch = undo ? tpi_idmap_del(&c->children, f) : tpi_idmap_get(&c->children, f);
            if (ch && undo)
                drop_child(c, ch);
            else if (ch) {
                ch->in_transit = 0;
                ch->sent_ns = tpi_now(c) + 1; /* RREF-22: never 0; see fork_age */
            }
            continue;
        }
        tpi_owner *o = tpi_idmap_get(&c->owners, r->id);
        if (o && undo)
            remove_fork(c, o, f);
        for (size_t k = 0; o && !undo && k < o->nforks; k++)
            if (tpi_gid_eq(o->forks[k].fork, f)) {
                o->forks[k].in_transit = 0;
                o->forks[k].sent_ns = tpi_now(c) + 1; /* RREF-22 */
            }
    }
    if (undo)
        rc->nundo = 0;
    if (!mine)
        tpi_unlock(c);
}

void tpi_rref_ctx_rollback(tpi_rref_ctx *rc) {
    forks_settle(rc, 1);
}

void tpi_rref_ctx_sent(tpi_rref_ctx *rc) {
    forks_settle(rc, 0);
}

void tpi_rref_ctx_done(tpi_rref_ctx *rc) {
    free(rc->undo);
    rc->undo = NULL;
    rc->nundo = rc->undo_cap = 0;
    for (size_t i = 0; i < rc->npending; i++)
        tpi_rref_unpin(rc->core, rc->pending[i]);
    free(rc->pending);
    rc->pending = NULL;
    rc->npending = rc->pending_cap = 0;
}

static void send_accept(tp_core *c, uint32_t parent, tpi_gid fork);

/*
 * The owner answered our fork (RREF-6): now the parent may drop its kept
 * reference. An attempt that times out is sent again (RREF-15), so the only
 * other ends are the owner's death (nothing left to protect) and our own
 * teardown (nothing is sent then); accepting after a timeout could let the
 * owner free the value before a late fork arrives.
 */
static void fork_settle(tp_core *c, tp_rref *r, tpi_gid fork, uint32_t parent, tp_status st,
                        const tpi_msg *reply) {
    if (reply && st == TP_OK) {
        atomic_store(&r->confirmed, 1);
    } else {
        r->fork_status = st != TP_OK ? st : TP_EPROTO;
        free(r->fork_msg); /* the owner's own words, for RREF-13's message */
        r->fork_msg = reply && reply->text[0] ? strdup(reply->text) : NULL;
    }
    r->fork_pending = 0;
    for (tpi_waiter *w = r->confirm_waiters; w; w = w->next) /* RREF-13 */
        c->ops->unpark(c->agent, w->task);
    /* Answered, even unreadably (TP_EPROTO: O may have recorded F, which the
     * child's delete then removes), or O is gone: P may drop its child. */
    if (reply || st == TP_EPEERDOWN || st == TP_EPROTO)
        send_accept(c, parent, fork);
    if (r->delete_deferred) { /* released meanwhile: now the delete may go (RREF-15) */
        r->delete_deferred = 0;
        if (st != TP_ESHUTDOWN && !c->peer_dead[r->owner] && !tpi_rref_owner_restarted(c, r))
            proto_send(c, TPI_MSG_RREF_DELETE, r->owner, r, r->fork, 0, 0);
    }
}

/* Keeps r (pinned) for a function that must wait for its confirmation. */
static void collect_pending(tpi_rref_ctx *rc, tp_rref *r) {
    if (rc->npending == rc->pending_cap) {
        size_t cap = rc->pending_cap ? 2 * rc->pending_cap : 4;
        tp_rref **grown = realloc(rc->pending, cap * sizeof *grown);
        if (!grown) {
            /* Nobody can wait for it: the function is refused. Its fork goes
             * on (fork_pending stays, so a delete still waits for it). */
            rc->lost = 1;
            return;
        }
        rc->pending = grown;
        rc->pending_cap = cap;
    }
    tpi_rref_pin(r);
    rc->pending[rc->npending++] = r;
}

/* Parks the calling task on list until unparked or the deadline (lock held). */
static tp_status park_on(tp_core *c, tpi_waiter **list, uint64_t deadline) {
    tpi_waiter w = {c->ops->task_self(c->agent), NULL, *list};
    if (*list)
        (*list)->prev = &w;
    *list = &w;
    tp_status st = tpi_park(c, deadline);
    if (w.prev)
        w.prev->next = w.next;
    else
        *list = w.next;
    if (w.next)
        w.next->prev = w.prev;
    return st;
}

tp_status tpi_rrefs_await_confirmed(tpi_rref_ctx *rc, uint64_t deadline, const char *what,
                                    char *err, size_t err_len) {
    tp_core *c = rc->core;
    if (rc->lost) {
        tpi_format(err, err_len,
                   "%s did not run: out of memory tracking the rrefs among its arguments "
                   "(RREF-13)", what);
        return TP_ENOMEM;
    }
    tp_status st = TP_OK;
    tpi_lock(c);
    for (size_t i = 0; i < rc->npending && st == TP_OK; i++) {
        tp_rref *r = rc->pending[i];
        while (r->fork_pending && st == TP_OK) {
            tp_status pst = park_on(c, &r->confirm_waiters, deadline);
            if (r->fork_pending && pst != TP_OK) {
                st = pst;
                tpi_format(err, err_len,
                           "%s did not run: rref %u:%llu among its arguments was not confirmed "
                           "by its owner '%s' (RREF-13): %s",
                           what, r->id.worker, (unsigned long long)r->id.local, r->owner_name,
                           pst == TP_ETIMEDOUT ? "the call's deadline passed first"
                                               : "the worker is shutting down");
            }
        }
        if (st == TP_OK && !atomic_load(&r->confirmed)) {
            st = r->fork_status != TP_OK ? r->fork_status : TP_EPROTO;
            tpi_format(err, err_len,
                       "%s did not run: rref %u:%llu among its arguments was not confirmed by "
                       "its owner '%s' (RREF-13): %s",
                       what, r->id.worker, (unsigned long long)r->id.local, r->owner_name,
                       r->fork_msg ? r->fork_msg
                       : st == TP_EPEERDOWN ? "the owner went down before it answered"
                                            : tp_strerror(st));
        }
    }
    tpi_unlock(c);
    return st;
}

/*
 * RREF-14, RREF-20, RREF-21: the status to answer when rref id, unknown on
 * this owner, can never get a value here, with why in err; then no
 * placeholder may wait for it. TP_EPEERDOWN: its creator abandoned it, or
 * died or restarted. TP_EPROTO: this owner freed it already (a message the
 * network reordered behind the last delete, or a stale one). TP_OK when its
 * remote() may still come. Lock held.
 */
tp_status tpi_rref_never_created(const tp_core *c, tpi_gid id, char *err, size_t err_len) {
    if (ring_has(c->freed, c->nfreed, TPI_FREED_MAX, id)) {
        tpi_format(err, err_len, "rref %u:%llu is unknown on its owner '%s': it was freed",
                   id.worker, (unsigned long long)id.local, c->self.name);
        return TP_EPROTO;
    }
    int abandoned = ring_has(c->abandoned, c->nabandoned, TPI_ABANDONED_MAX, id);
    if (!abandoned && !tpi_rref_creator_gone(c, id))
        return TP_OK;
    tpi_format(err, err_len, "rref %u:%llu: %s before the owner '%s' heard of it", id.worker,
               (unsigned long long)id.local,
               abandoned ? "its creation failed and its creator abandoned it"
                         : "its creator died",
               c->self.name);
    return TP_EPEERDOWN;
}

/* RREF-20: an rref of owner incarnation inc reached this worker, its owner
 * rank, as another incarnation: the status to answer and why, in err. */
static tp_status other_incarnation(const tp_core *c, tpi_gid rref, uint32_t inc, char *err,
                                   size_t err_len) {
    int earlier = inc < c->incarnation;
    tpi_format(err, err_len,
               "rref %u:%llu is of incarnation %u of its owner '%s', which is incarnation %u: %s",
               rref.worker, (unsigned long long)rref.local, inc, c->self.name, c->incarnation,
               earlier ? "the value went with the earlier process" : "no such incarnation yet");
    return earlier ? TP_EPEERDOWN : TP_EPROTO;
}

static tp_status decode_rref(void *ctx, const tpi_rref_wire *w, tp_rref **out) {
    tpi_rref_ctx *rc = ctx;
    tp_core *c = rc->core;
    if (w->owner >= c->world_size || w->parent >= c->world_size ||
        w->rref_id.worker >= c->world_size)
        return tpi_fail(TP_EPROTO, "an rref names a worker outside the world of %u",
                        c->world_size);
    int mine = tpi_lock_held(c);
    if (!mine)
        tpi_lock(c);
    tp_status st = TP_OK;
    tp_rref *r = NULL;
    if (w->owner == c->rank && w->owner_inc != c->incarnation) {
        /* RREF-20: ours, of another incarnation. Nothing to keep alive any
         * more: the parent may drop the reference it kept for this one. */
        char why[TP_ERRMSG_LEN_MAX];
        st = other_incarnation(c, w->rref_id, w->owner_inc, why, sizeof why);
        tpi_fail(st, "%s", why);
        if (w->owner_inc < c->incarnation && w->parent != c->rank)
            send_accept(c, w->parent, w->fork_id);
    } else if (w->owner == c->rank) {
        tpi_owner *o = tpi_idmap_get(&c->owners, w->rref_id);
        if (!o && w->rref_id.worker != c->rank) {
            /* RREF-6, RREF-20: its remote() is not here, yet or ever (lost
             * with a broken connection, its creator abandoned it or died).
             * A placeholder, as a fork would make; failed at once when it
             * can never be filled, so the handle sees the one fact. */
            char msg[TP_ERRMSG_LEN_MAX];
            o = tpi_owner_get_or_create(c, w->rref_id);
            tp_status never = o ? tpi_rref_never_created(c, w->rref_id, msg, sizeof msg) : TP_OK;
            if (never != TP_OK)
                tpi_owner_set(c, o, never, NULL, msg);
        }
        if (!o && w->rref_id.worker == c->rank) { /* ours, and gone: a forged or stale id */
            st = tpi_fail(TP_EPROTO, "rref %u:%llu is unknown on its owner '%s'",
                          w->rref_id.worker, (unsigned long long)w->rref_id.local, c->self.name);
            if (w->parent != c->rank)
                send_accept(c, w->parent, w->fork_id); /* nothing here for it to keep alive */
        } else if (!o) {
            st = tpi_fail(TP_ENOMEM, "out of memory receiving rref %u:%llu on its owner '%s'",
                          w->rref_id.worker, (unsigned long long)w->rref_id.local, c->self.name);
        } else {
            r = tpi_rref_new_owner(c, o);
            st = r ? TP_OK : TP_ENOMEM;
            if (r && w->parent == c->rank)
                remove_fork(c, o, w->fork_id); /* our own send; the handle replaces it */
            else if (r)
                send_accept(c, w->parent, w->fork_id);
        }
    } else {
        r = tpi_rref_new_user(c, w->owner, w->rref_id, w->fork_id);
        st = r ? TP_OK : TP_ENOMEM;
        if (r)
            r->owner_inc = w->owner_inc; /* the sender's word, not what we know yet */
        if (r && tpi_rref_owner_restarted(c, r)) {
            /* RREF-20: the value went with the owner's earlier process; no
             * fork for its new one. A surviving parent may drop its kept
             * reference; a parent that was that owner is gone. */
            r->fork_status = TP_EPEERDOWN;
            r->fork_msg = strdup("its owner restarted: the value went with the earlier process");
            if (w->parent != w->owner)
                send_accept(c, w->parent, w->fork_id);
        } else if (r && w->parent == w->owner) {
            atomic_store(&r->confirmed, 1); /* the owner recorded the fork when sending */
        } else if (r) {
            r->fork_pending = 1; /* until fork_settle, through every retry (RREF-15) */
            proto_send(c, TPI_MSG_RREF_FORK, w->owner, r, w->fork_id, w->parent, 0);
            if (rc->collect) /* pending, or settled unconfirmed: the wait says why */
                collect_pending(rc, r);
        }
    }
    if (!mine)
        tpi_unlock(c);
    *out = r;
    return st;
}

void tpi_rref_hooks(tpi_rref_ctx *rc, tpi_codec_hooks *hooks) {
    hooks->ctx = rc;
    hooks->encode_rref = encode_rref;
    hooks->decode_rref = decode_rref;
}

/* ---- Retried protocol messages (RREF-15) ------------------------------------------ */

struct tpi_retry {
    uint8_t type;
    uint32_t dst;
    tp_rref *rref; /* pinned: FORK's child, DELETE's and ABANDON's rref; NULL for ACCEPT */
    tpi_gid fork;
    uint32_t parent;
    uint32_t attempt;
    uint64_t due_ns;
    tpi_retry *next;
};

/* A tpi_retry that sends RREF-19's query again: outside the wire's types. */
#define TPI_RETRY_FORKS_QUERY 0xF0
static void forks_query_send(tp_core *c, uint32_t peer, uint32_t attempt);
static size_t collect_owners(tp_core *c, tpi_owner ***out);

/* No answer, and the peer may still be there: worth sending again. */
static int retryable(tp_status st) {
    return st == TP_EIO || st == TP_ETIMEDOUT || st == TP_ELIMIT || st == TP_ENOMEM;
}

static const char *proto_what(uint8_t type) {
    switch (type) {
    case TPI_RETRY_FORKS_QUERY:
        return "rref forks query";
    case TPI_MSG_RREF_FORK:
        return "rref fork";
    case TPI_MSG_RREF_ACCEPT:
        return "rref accept";
    case TPI_MSG_RREF_DELETE:
        return "rref delete";
    default:
        return "rref abandon";
    }
}

/* The message's last word: answered, or it never will be (lock held). */
static void remote_deferred_delete(tp_core *c, tp_rref *r, int deferred);

static void proto_final(tp_core *c, uint8_t type, tp_rref *r, tpi_gid fork, uint32_t parent,
                        tp_status st, const tpi_msg *reply) {
    if (type == TPI_MSG_RREF_FORK) {
        fork_settle(c, r, fork, parent, st, reply);
    } else if (type == TPI_MSG_RREF_ABANDON && r->fork_pending) { /* RREF-15 */
        int deferred = r->delete_deferred;
        r->fork_pending = 0;
        r->delete_deferred = 0;
        if (st != TP_ESHUTDOWN)
            remote_deferred_delete(c, r, deferred);
    }
}

/* The destination restarted or died: nothing of ours is wanted there. */
static int proto_gone(const tp_core *c, uint32_t dst, const tp_rref *r) {
    return c->peer_dead[dst] || (r && r->owner == dst && tpi_rref_owner_restarted(c, r));
}

/* An attempt got no answer: sends it again later (1), or gives up (0) (lock held). */
static int proto_unanswered(tp_core *c, uint8_t type, uint32_t dst, tp_rref *r, tpi_gid fork,
                            uint32_t parent, uint32_t attempt, tp_status st) {
    tpi_retry *t = retryable(st) && !proto_gone(c, dst, r) ? malloc(sizeof *t) : NULL;
    if (!t) {
        proto_final(c, type, r, fork, parent, proto_gone(c, dst, r) ? TP_EPEERDOWN : st, NULL);
        return 0;
    }
    unsigned shift = attempt < 7 ? attempt : 7; /* 20 ms << 7 > 2 s */
    uint64_t pause = TPI_RREF_RETRY_MIN_NS << shift;
    *t = (tpi_retry){type, dst, r, fork, parent, attempt + 1,
                     tpi_now(c) + (pause < TPI_RREF_RETRY_MAX_NS ? pause : TPI_RREF_RETRY_MAX_NS),
                     NULL};
    if (r)
        tpi_rref_pin(r);
    tpi_retry **p = &c->retries; /* after every one due no later: deterministic order */
    while (*p && (*p)->due_ns <= t->due_ns)
        p = &(*p)->next;
    t->next = *p;
    *p = t;
    c->active_client++; /* the shutdown drain waits for it (SHUTDOWN-5) */
    tpi_log(TP_LOG_DEBUG, "worker %u: %s to worker %u got no answer (%s); again in %llu ms",
            c->rank, proto_what(type), dst, tp_strerror(st),
            (unsigned long long)((t->due_ns - tpi_now(c)) / 1000000ull));
    tpi_rearm(c);
    return 1;
}

static void proto_reply(tp_core *c, tpi_call *call, tp_status st, tpi_msg *reply) {
    if (reply || !retryable(st))
        proto_final(c, call->type, call->rref, call->fork, call->parent, st, reply);
    else
        proto_unanswered(c, call->type, call->dst, call->rref, call->fork, call->parent,
                         call->attempt, st);
}

/* Sends one attempt of a protocol message, rebuilt from the rref (lock held). */
static void proto_send(tp_core *c, uint8_t type, uint32_t dst, tp_rref *r, tpi_gid fork,
                       uint32_t parent, uint32_t attempt) {
    tpi_call *call = tpi_call_new(c, dst, type, proto_what(type), NULL);
    if (!call) {
        proto_unanswered(c, type, dst, r, fork, parent, attempt, TP_ENOMEM);
        return;
    }
    tpi_msg m;
    tpi_msg_reset(&m);
    m.type = type;
    m.fork = fork;
    m.parent = parent;
    if (r) {
        m.rref = r->id;
        m.owner_inc = r->owner_inc; /* RREF-20: the owner incarnation the fork is for */
    }
    if (type == TPI_MSG_RREF_ABANDON) {
        m.status = (uint32_t)r->failed;
        tpi_format(m.text, sizeof m.text, "%s", r->fail_msg ? r->fail_msg : tp_strerror(r->failed));
    }
    call->rref = r;
    if (r)
        tpi_rref_pin(r); /* the call's own pin, released with it */
    call->fork = fork;
    call->parent = parent;
    call->attempt = attempt;
    call->on_reply = proto_reply;
    /* Each is idempotent, so a timeout only sends it again. A fork waits
     * for its answer (its child is confirmed by one, never by a timeout,
     * RREF-6), which comes unless the connection breaks, except on a
     * transport that loses frames silently (RREF-22). */
    tp_status st = tpi_call_issue(c, call, &m,
                                  type == TPI_MSG_RREF_FORK && !c->loses
                                      ? TP_TIMEOUT_INFINITE
                                      : TPI_RREF_ATTEMPT_TIMEOUT_S);
    if (st != TP_OK) /* freed by the issue, on_reply not called */
        proto_unanswered(c, type, dst, r, fork, parent, attempt, st);
}

/*
 * RREF-22: on a transport that loses frames without a broken connection
 * (AGENT-17), every TPI_FORKS_PROBE_NS the worker asks each peer it sent a
 * fork to, at least that long ago and still unsettled, whether it holds it:
 * RREF-19's query, which a break triggers on other transports. Lock held.
 */
static size_t forks_probe(tp_core *c, uint64_t now, uint64_t min_age_ns) {
    c->probe_due_ns = now + TPI_FORKS_PROBE_NS;
    uint8_t *ask = calloc(c->world_size, 1);
    size_t at_risk = 0;
    for (size_t i = 0; i < c->children.cap; i++) {
        tpi_child *ch = c->children.slots[i].value;
        at_risk += ch && ch->sent_ns;
        if (ask && ch && ch->sent_ns && fork_age(now, ch->sent_ns) >= min_age_ns)
            ask[ch->to] = 1;
    }
    for (size_t i = 0; i < c->owners.cap; i++) {
        tpi_owner *o = c->owners.slots[i].value;
        for (size_t k = 0; o && k < o->nforks; k++) {
            at_risk += o->forks[k].sent_ns != 0;
            if (ask && o->forks[k].sent_ns && fork_age(now, o->forks[k].sent_ns) >= min_age_ns)
                ask[o->forks[k].holder] = 1;
        }
    }
    for (uint32_t p = 0; ask && p < c->world_size && !TPI_CANARY(TPI_CANARY_NO_FORK_PROBE); p++)
        if (ask[p] && p != c->rank && !c->peer_dead[p] && !tpi_peer_view(c, p)->forks_query)
            forks_query_send(c, p, 0);
    free(ask); /* without memory, the next probe tries again */
    return at_risk;
}

size_t tpi_forks_at_risk(tp_core *c) {
    return c->loses && !TPI_CANARY(TPI_CANARY_NO_FORK_PROBE) ? forks_probe(c, tpi_now(c), 0) : 0;
}

uint64_t tpi_retries_next(const tp_core *c) {
    uint64_t next = c->retries ? c->retries->due_ns : TPI_NO_DEADLINE;
    if (c->loses && (c->children.len > 0 || c->owners.len > 0) && c->probe_due_ns < next)
        next = c->probe_due_ns;
    return next;
}

void tpi_retries_run(tp_core *c, uint64_t now) {
    if (c->loses && now >= c->probe_due_ns)
        (void)forks_probe(c, now, TPI_FORKS_PROBE_NS);
    while (c->retries && c->retries->due_ns <= now) {
        tpi_retry *t = c->retries;
        c->retries = t->next;
        TPI_ASSERT(c->active_client > 0);
        c->active_client--;
        if (t->type == TPI_RETRY_FORKS_QUERY) {
            tpi_peer_must(c, t->dst)->forks_query = 0; /* made by forks_query_send */
            if (!c->peer_dead[t->dst])
                forks_query_send(c, t->dst, t->attempt);
        } else if (proto_gone(c, t->dst, t->rref)) {
            proto_final(c, t->type, t->rref, t->fork, t->parent, TP_EPEERDOWN, NULL);
        } else {
            proto_send(c, t->type, t->dst, t->rref, t->fork, t->parent, t->attempt);
        }
        if (t->rref)
            tpi_rref_unpin(c, t->rref);
        free(t);
    }
}

/* Ends the retries to peer, dead now, or all of them (UINT32_MAX) at teardown. */
static void retries_drop(tp_core *c, uint32_t peer, tp_status st) {
    for (tpi_retry **p = &c->retries; *p;) {
        tpi_retry *t = *p;
        if (peer != UINT32_MAX && t->dst != peer) {
            p = &t->next;
            continue;
        }
        *p = t->next;
        TPI_ASSERT(c->active_client > 0);
        c->active_client--;
        if (t->type == TPI_RETRY_FORKS_QUERY)
            tpi_peer_must(c, t->dst)->forks_query = 0; /* made by forks_query_send */
        proto_final(c, t->type, t->rref, t->fork, t->parent, st, NULL);
        if (t->rref)
            tpi_rref_unpin(c, t->rref);
        free(t);
        p = &c->retries; /* proto_final may have added or removed some: look again */
    }
}

/* ---- Forks a broken connection may have lost (RREF-19) ---------------------------- */

/*
 * A frame that carried an rref, or the answer to it, may be lost with its
 * connection while both workers live: a pending child then waits for an
 * accept that never comes, and an owner keeps a fork for a holder that never
 * got it. So after a broken connection each side asks the other, with the
 * tp:forks function, which of the forks it sent there the peer holds, and
 * settles the rest as the accept (a child) or the delete (an owner's fork)
 * would have. The query goes after every frame of the broken connection was
 * read or lost, and the peer answers only when it has decoded every request
 * it read from us ("ask again later" otherwise), so "not held" means never
 * received, or released (its accept or delete then comes too, and finds
 * nothing: both are idempotent).
 */

/* 1 when this worker holds fork f as a user: its rref is live, kept for a
 * child it sent on, or waiting for its own fork's answer (lock held). */
static int user_holds_fork(tp_core *c, tpi_gid f) {
    for (tp_rref *r = c->users; r; r = r->next)
        if (tpi_gid_eq(r->fork, f))
            return 1;
    for (size_t i = 0; i < c->children.cap; i++) {
        tpi_child *ch = c->children.slots[i].value;
        if (ch && tpi_gid_eq(ch->rref->fork, f))
            return 1;
    }
    for (tpi_call *k = c->calls_head; k; k = k->next)
        if (k->type == TPI_MSG_RREF_FORK && tpi_gid_eq(k->fork, f))
            return 1;
    for (tpi_retry *t = c->retries; t; t = t->next)
        if (t->type == TPI_MSG_RREF_FORK && tpi_gid_eq(t->fork, f))
            return 1;
    return 0;
}

/* [rref worker, rref n, fork worker, fork n] (+ held, in an answer). */
static tp_value *fork_entry(tpi_gid rref, tpi_gid fork, int held) {
    tp_value *e = tp_value_list_of(4, tp_value_int(rref.worker), tp_value_int((int64_t)rref.local),
                                   tp_value_int(fork.worker), tp_value_int((int64_t)fork.local));
    if (e && held >= 0 && tp_list_append(e, tp_value_int(held)) != TP_OK) {
        tp_value_free(e);
        return NULL;
    }
    return e;
}

static int read_entry(const tp_value *e, size_t n, tpi_gid *rref, tpi_gid *fork, int64_t *held) {
    int64_t v[5] = {0, 0, 0, 0, 0};
    if (tp_list_len(e) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (tp_value_get_int(tp_list_get(e, i), &v[i]) != TP_OK || v[i] < 0)
            return 0;
    if (v[0] > UINT32_MAX || v[2] > UINT32_MAX)
        return 0;
    *rref = (tpi_gid){(uint32_t)v[0], (uint64_t)v[1]};
    *fork = (tpi_gid){(uint32_t)v[2], (uint64_t)v[3]};
    if (held)
        *held = v[4];
    return 1;
}

/* The peer's word on fork f of rref. Not held: settled (lock held), as
 * its accept (a child, RREF-5) or its delete (an owner's fork, RREF-4)
 * would. Held: it got the frame, so the fork is no longer at risk and is
 * not asked about again (RREF-22); its accept or delete is sent until
 * answered. */
static void fork_answered(tp_core *c, uint32_t peer, tpi_gid rref, tpi_gid f, int held) {
    tpi_child *ch = tpi_idmap_get(&c->children, f);
    if (ch && ch->to == peer) {
        if (held) {
            ch->sent_ns = 0;
            return;
        }
        tpi_idmap_del(&c->children, f);
        drop_child(c, ch);
        return;
    }
    tpi_owner *o = tpi_idmap_get(&c->owners, rref);
    if (!o)
        return;
    for (size_t k = 0; k < o->nforks; k++) {
        if (tpi_gid_eq(o->forks[k].fork, f) && o->forks[k].holder == peer) {
            if (held) {
                o->forks[k].sent_ns = 0;
                return;
            }
            remove_fork(c, o, f);
            tpi_owner_maybe_free(c, o);
            return;
        }
    }
}

static void forks_reply(tp_core *c, tpi_call *call, tp_status st, tpi_msg *reply) {
    uint32_t peer = call->dst;
    tpi_peer *p = tpi_peer_must(c, peer); /* made by issue */
    int again = p->forks_query == 2;
    p->forks_query = 0;
    if (c->peer_dead[peer])
        return; /* its death settled every fork it had (RREF-12) */
    const tp_value *v = reply && st == TP_OK ? reply->value : NULL;
    if (v && tp_value_kind(v) == TP_KIND_LIST) {
        for (size_t i = 0; i < tp_list_len(v); i++) {
            tpi_gid rref, f;
            int64_t held;
            if (read_entry(tp_list_get(v, i), 5, &rref, &f, &held))
                fork_answered(c, peer, rref, f, held != 0);
        }
    } else if ((reply && st == TP_OK) || retryable(st)) { /* busy, or no answer */
        /* The retry collects the forks afresh: those sent meanwhile too. */
        if (proto_unanswered(c, TPI_RETRY_FORKS_QUERY, peer, NULL, (tpi_gid){0, 0}, 0,
                             call->attempt, TP_EIO))
            p->forks_query = 1;
        return;
    } else {
        tpi_log(TP_LOG_WARN, "worker '%s': %s could not settle the forks sent to worker %u: %s",
                c->self.name, TPI_FORKS_FN, peer, tp_strerror(st));
    }
    if (again)
        forks_query_send(c, peer, 0);
}

static void forks_query_send(tp_core *c, uint32_t peer, uint32_t attempt) {
    tpi_peer *p = tpi_peer_get(c, peer); /* where the query's state is kept */
    tp_value *entries = p ? tp_value_list() : NULL;
    int ok = entries != NULL;
    for (size_t i = 0; ok && i < c->children.cap && tp_list_len(entries) < TPI_FORKS_QUERY_MAX;
         i++) {
        tpi_child *ch = c->children.slots[i].value;
        if (ch && ch->to == peer && !ch->in_transit) /* one still being sent is not lost */
            ok = tp_list_append(entries, fork_entry(ch->rref->id, c->children.slots[i].key, -1)) ==
                 TP_OK;
    }
    tpi_owner **os;
    size_t n = ok ? collect_owners(c, &os) : 0;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; ok && k < os[i]->nforks && tp_list_len(entries) < TPI_FORKS_QUERY_MAX;
             k++)
            if (os[i]->forks[k].holder == peer && !os[i]->forks[k].in_transit)
                ok = tp_list_append(entries, fork_entry(os[i]->id, os[i]->forks[k].fork, -1)) ==
                     TP_OK;
    if (n)
        free(os);
    int asking = ok && tp_list_len(entries) > 0;
    /* tp_value_list_of takes entries, even when it fails: not freed again here. */
    tp_value *args = asking ? tp_value_list_of(1, entries) : NULL;
    if (!args) {
        if (!ok || asking)
            tpi_log(TP_LOG_WARN, "worker '%s': out of memory asking worker %u for its forks",
                    c->self.name, peer);
        if (!asking)
            tpi_defer_free(c, entries);
        return;
    }
    tpi_call *call = tpi_call_new(c, peer, TPI_MSG_REQUEST, "rref forks query", TPI_FORKS_FN);
    tp_status st = TP_ENOMEM;
    if (call) {
        tpi_msg m;
        tpi_msg_call(&m, TPI_MSG_REQUEST, TPI_FORKS_FN, args, NULL);
        call->attempt = attempt;
        call->on_reply = forks_reply;
        st = tpi_call_issue(c, call, &m, TPI_RREF_ATTEMPT_TIMEOUT_S);
    }
    tpi_defer_free(c, args);
    if (st == TP_OK) {
        p->forks_query = 1;
        return;
    }
    if (proto_unanswered(c, TPI_RETRY_FORKS_QUERY, peer, NULL, (tpi_gid){0, 0}, 0, attempt,
                         st == TP_ENOMEM || st == TP_ELIMIT ? st : TP_EIO))
        p->forks_query = 1; /* until the retry runs */
}

void tpi_forks_query(tp_core *c, uint32_t peer) {
    TPI_ASSERT(peer < c->world_size && peer != c->rank);
    tpi_peer *p = tpi_peer_find(c, peer);
    if (p && p->forks_query) {
        p->forks_query = 2; /* forks sent meanwhile: ask again after the answer */
        return;
    }
    forks_query_send(c, peer, 0);
}

tp_status tpi_forks_serve(tp_core *c, uint32_t src, const tp_value *args, tp_value **result,
                          char *err, size_t err_len) {
    const tp_value *entries = tp_list_get(args, 0);
    if (tp_list_len(args) != 1 || tp_value_kind(entries) != TP_KIND_LIST) {
        tpi_format(err, err_len, "%s: malformed query", TPI_FORKS_FN);
        return TP_EPROTO;
    }
    if (tp_list_len(entries) > TPI_FORKS_QUERY_MAX) {
        tpi_format(err, err_len, "%s: %zu forks in one query, over TPI_FORKS_QUERY_MAX (%d)",
                   TPI_FORKS_FN, tp_list_len(entries), TPI_FORKS_QUERY_MAX);
        return TP_ELIMIT;
    }
    tpi_lock(c);
    uint64_t now = tpi_now(c);
    tpi_peer *p = tpi_peer_get(c, src); /* when its query came first (RREF-19) */
    if (!p) {
        tpi_unlock(c);
        tpi_format(err, err_len, "%s: out of memory", TPI_FORKS_FN);
        return TP_ENOMEM;
    }
    if (c->reorders && p->forks_asked_ns == 0)
        p->forks_asked_ns = now;
    if (p->undecoded > 0 || /* its earlier requests may carry those forks */
        (c->reorders && now - p->forks_asked_ns < TPI_DEDUPE_WINDOW_NS &&
         !TPI_CANARY(TPI_CANARY_QUERY_NO_WAIT))) {
        /* On a transport that reorders, a frame sent before the query may
         * arrive up to the bound after it (AGENT-17): "not held" waits until
         * then, after which such a frame has arrived or is lost. */
        tpi_unlock(c);
        *result = tp_value_nil();
        return *result ? TP_OK : TP_ENOMEM;
    }
    p->forks_asked_ns = 0;
    tp_value *answer = tp_value_list();
    tp_status st = answer ? TP_OK : TP_ENOMEM;
    for (size_t i = 0; st == TP_OK && i < tp_list_len(entries); i++) {
        tpi_gid rref, f;
        if (!read_entry(tp_list_get(entries, i), 4, &rref, &f, NULL)) {
            tpi_format(err, err_len, "%s: entry %zu is malformed", TPI_FORKS_FN, i);
            st = TP_EPROTO;
            break;
        }
        st = tp_list_append(answer, fork_entry(rref, f, user_holds_fork(c, f)));
    }
    tpi_unlock(c);
    if (st != TP_OK) {
        tp_value_free(answer);
        if (st == TP_ENOMEM)
            tpi_format(err, err_len, "%s: out of memory", TPI_FORKS_FN);
        return st;
    }
    *result = answer;
    return TP_OK;
}

/* ---- Protocol messages (lock not held on entry) --------------------------------- */

static void send_accept(tp_core *c, uint32_t parent, tpi_gid fork) {
    if (parent == c->rank) { /* we are the parent: drop the kept child at once */
        tpi_child *ch = tpi_idmap_del(&c->children, fork);
        if (ch)
            drop_child(c, ch);
        return;
    }
    proto_send(c, TPI_MSG_RREF_ACCEPT, parent, NULL, fork, parent, 0);
}


/* The worker that made rref id (its remote()) is dead, or restarted since
 * (REJOIN-3: ids carry the incarnation that minted them). Lock held. */
int tpi_rref_creator_gone(const tp_core *c, tpi_gid id) {
    return id.worker < c->world_size && id.worker != c->rank &&
           (c->peer_dead[id.worker] || TPI_INC_OF(id.local) < tpi_peer_inc(c, id.worker));
}

void tpi_rref_on_message(tp_core *c, uint32_t src, tpi_msg *m) {
    char err[TP_ERRMSG_LEN_MAX];
    tpi_lock(c);
    switch (m->type) {
    case TPI_MSG_RREF_FETCH: {
        tpi_owner *o = tpi_idmap_get(&c->owners, m->rref);
        tp_status gone = o ? TP_OK : tpi_rref_never_created(c, m->rref, err, sizeof err);
        if (!o && gone == TP_OK && m->rref.worker != c->rank && c->reorders) {
            /* RREF-6: on a transport that reorders (AGENT-17) the fetch may
             * have overtaken its REMOTE: a placeholder holds it until the
             * value comes or its creator abandons it (RREF-14). In order
             * (TCP), an unknown id is forged or stale: answered at once. */
            o = tpi_owner_get_or_create(c, m->rref);
            if (!o) {
                tpi_reply(c, src, m->id, TP_ENOMEM, NULL, "owner out of memory");
                break;
            }
        }
        if (!o) {
            if (gone == TP_OK)
                tpi_format(err, sizeof err, "rref %u:%llu is unknown on its owner '%s'",
                           m->rref.worker, (unsigned long long)m->rref.local, c->self.name);
            tpi_reply(c, src, m->id, gone == TP_OK ? TP_EPROTO : gone, NULL, err);
        } else if (o->ready) {
            reply_fetch(c, o, src, m->id);
        } else {
            tpi_fetch *fe = malloc(sizeof *fe);
            if (fe) {
                fe->src = src;
                fe->id = m->id;
                fe->next = o->fetches;
                o->fetches = fe;
            } else {
                tpi_reply(c, src, m->id, TP_ENOMEM, NULL, "owner out of memory");
            }
        }
        break;
    }
    case TPI_MSG_RREF_DELETE: {
        tpi_owner *o = tpi_idmap_get(&c->owners, m->rref);
        if (c->reorders) /* RREF-21: a repeat of its fork may still be behind it */
            ring_push(&c->deleted, &c->ndeleted, TPI_FREED_MAX, m->fork);
        if (o) {
            remove_fork(c, o, m->fork);
            tpi_owner_maybe_free(c, o);
        }
        tpi_reply(c, src, m->id, TP_OK, NULL, NULL);
        break;
    }
    case TPI_MSG_RREF_FORK: { /* idempotent: a retry may repeat it (RREF-15) */
        if (m->owner_inc != c->incarnation) {
            /* RREF-20: a fork for a value of another incarnation of this
             * rank; a placeholder would wait for a remote() that went to it. */
            tp_status why = other_incarnation(c, m->rref, m->owner_inc, err, sizeof err);
            tpi_reply(c, src, m->id, why, NULL, err);
            break;
        }
        tpi_owner *o = tpi_idmap_get(&c->owners, m->rref);
        tp_status never = o ? TP_OK : tpi_rref_never_created(c, m->rref, err, sizeof err);
        if (never != TP_OK) {
            /* No placeholder: it would wait forever for a value that never
             * comes (RREF-12, RREF-14, RREF-21). */
            tpi_log(TP_LOG_DEBUG, "worker '%s': fork %u:%llu from worker %u refused: %s",
                    c->self.name, m->fork.worker, (unsigned long long)m->fork.local, src, err);
            tpi_reply(c, src, m->id, never, NULL, err);
            break;
        }
        if (ring_has(c->deleted, c->ndeleted, TPI_FREED_MAX, m->fork) &&
            !TPI_CANARY(TPI_CANARY_FORGETS_DELETED)) {
            /* RREF-21: a repeat its holder sent before an answer came, held
             * back behind the fork's delete: recording it again would keep
             * the value for a reference nobody holds. Its child has its
             * answer already. */
            tpi_reply(c, src, m->id, TP_OK, NULL, NULL);
            break;
        }
        if (!o)
            o = tpi_owner_get_or_create(c, m->rref);
        tp_status st = !o ? TP_ENOMEM : has_fork(o, m->fork) ? TP_OK
                                                              : tpi_owner_add_fork(c, o, m->fork, src);
        tpi_reply(c, src, m->id, st, NULL, st == TP_OK ? NULL : "owner out of memory");
        break;
    }
    case TPI_MSG_RREF_ACCEPT: {
        tpi_child *ch = tpi_idmap_del(&c->children, m->fork);
        if (ch)
            drop_child(c, ch);
        tpi_reply(c, src, m->id, TP_OK, NULL, NULL);
        break;
    }
    case TPI_MSG_RREF_ABANDON: { /* RREF-14 */
        tpi_owner *o = tpi_idmap_get(&c->owners, m->rref);
        if (o && m->rref.worker == src) { /* only its creator may say so */
            owner_abandon(c, o, (tp_status)m->status, m->text);
            tpi_owner_maybe_free(c, o); /* a placeholder whose forks all went */
        } else if (!o && m->rref.worker == src) {
            /* its remote() was lost: it never comes */
            ring_push(&c->abandoned, &c->nabandoned, TPI_ABANDONED_MAX, m->rref);
        }
        tpi_reply(c, src, m->id, TP_OK, NULL, NULL);
        break;
    }
    default:
        tpi_format(err, sizeof err, "unexpected message type %u", m->type);
        tpi_reply(c, src, m->id, TP_EPROTO, NULL, err);
    }
    tpi_unlock(c);
}

/* ---- Failure, release, teardown (lock held) ------------------------------------ */

static size_t collect_owners(tp_core *c, tpi_owner ***out) {
    *out = NULL;
    if (c->owners.len == 0)
        return 0;
    tpi_owner **v = malloc(c->owners.len * sizeof *v);
    if (!v)
        return 0;
    size_t n = 0;
    for (size_t i = 0; i < c->owners.cap; i++)
        if (c->owners.slots[i].value)
            v[n++] = c->owners.slots[i].value;
    *out = v;
    return n;
}

void tpi_rrefs_peer_down(tp_core *c, uint32_t peer) {
    retries_drop(c, peer, TP_EPEERDOWN);
    tpi_owner **os;
    size_t n = collect_owners(c, &os);
    for (size_t i = 0; i < n; i++) {
        tpi_owner *o = os[i];
        for (size_t k = 0; k < o->nforks;) {
            if (o->forks[k].holder == peer)
                remove_fork(c, o, o->forks[k].fork);
            else
                k++;
        }
        if (!o->ready && !o->running && tpi_rref_creator_gone(c, o->id)) {
            /* A placeholder a fork made while its remote() was on the way
             * (RREF-6): that remote died with its creator, so the value
             * never comes. Failed, it is freed once its forks go. */
            char msg[TP_NAME_LEN_MAX + 96];
            tpi_format(msg, sizeof msg, "rref %u:%llu: its creator, worker %u, died before its "
                       "remote() reached the owner",
                       o->id.worker, (unsigned long long)o->id.local, peer);
            tpi_owner_set(c, o, TP_EPEERDOWN, NULL, msg);
        }
        for (tpi_fetch **p = &o->fetches; *p;) {
            if ((*p)->src == peer) {
                tpi_fetch *dead = *p;
                *p = dead->next;
                free(dead);
            } else {
                p = &(*p)->next;
            }
        }
        tpi_owner_maybe_free(c, o);
    }
    free(os);
    for (size_t i = 0; i < c->children.cap; i++) {
        tpi_child *ch = c->children.slots[i].value;
        if (ch && ch->to == peer) {
            tpi_idmap_del(&c->children, c->children.slots[i].key);
            drop_child(c, ch);
            i = (size_t)-1; /* the map shifted: rescan from the start */
        }
    }
}

void tpi_rrefs_release_all(tp_core *c) {
    while (c->users) {
        tp_rref *r = c->users;
        r->closed = 1;
        if (r->children > 0) { /* RREF-5: the delete waits for the last child */
            r->delete_pending = 1;
            unlist(c, r);
        } else {
            send_delete(c, r); /* unlists r */
        }
    }
}

void tpi_rrefs_teardown(tp_core *c) {
    retries_drop(c, UINT32_MAX, TP_ESHUTDOWN);
    tpi_owner **os;
    size_t n = collect_owners(c, &os);
    for (size_t i = 0; i < n; i++) {
        os[i]->waiters = NULL;
        os[i]->running = 0;
        owner_free(c, os[i]);
    }
    free(os);
    while (c->children.len) {
        for (size_t i = 0; i < c->children.cap; i++) {
            tpi_child *ch = c->children.slots[i].value;
            if (ch) {
                tpi_idmap_del(&c->children, c->children.slots[i].key);
                ch->rref->delete_pending = 0; /* teardown: nothing is sent any more */
                drop_child(c, ch);
                break;
            }
        }
    }
    while (c->users) {
        tp_rref *r = c->users;
        unlist(c, r);
        if (atomic_load(&r->refs) == 0) /* its last reference went during teardown */
            rref_free(r);
    }
}

/* ---- The leak report (RREF-18) --------------------------------------------------- */

typedef struct leak_list {
    tp_rref_leak *v;
    size_t n, cap;
    int short_of_memory;
} leak_list;

static void leak_add(leak_list *l, tp_leak_kind kind, tpi_gid rref, tpi_gid fork, uint32_t owner,
                     uint32_t holder) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        tp_rref_leak *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->short_of_memory = 1;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (tp_rref_leak){kind, rref.worker, rref.local, fork.worker, fork.local, owner,
                                  holder};
}

/* A delete owed (sent and unanswered, waiting to go again, or deferred
 * behind its fork, RREF-15) for the message type on r. */
static int owes_delete(uint8_t type, const tp_rref *r) {
    return r && !r->is_owner &&
           (type == TPI_MSG_RREF_DELETE ||
            ((type == TPI_MSG_RREF_FORK || type == TPI_MSG_RREF_ABANDON) && r->delete_deferred));
}

static int leak_cmp(const void *pa, const void *pb) {
    const tp_rref_leak *a = pa, *b = pb;
#define CMP(f)                                                                                     \
    if (a->f != b->f)                                                                              \
        return a->f < b->f ? -1 : 1;
    CMP(rref_worker)
    CMP(rref_n)
    CMP(fork_worker)
    CMP(fork_n)
    CMP(kind)
    CMP(holder)
#undef CMP
    return 0;
}

size_t tpi_rrefs_leaks(tp_core *c, tp_rref_leak **out, int *incomplete) {
    leak_list l = {NULL, 0, 0, 0};
    tpi_owner **os;
    size_t n = collect_owners(c, &os);
    if (c->owners.len > 0 && !os)
        l.short_of_memory = 1;
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < os[i]->nforks; k++)
            leak_add(&l, TP_LEAK_FORK, os[i]->id, os[i]->forks[k].fork, c->rank,
                     os[i]->forks[k].holder);
        if (os[i]->nforks == 0 && os[i]->local_handles == 0) /* RREF-3 should have freed it */
            leak_add(&l, TP_LEAK_ORPHAN, os[i]->id, (tpi_gid){0, 0}, c->rank, c->rank);
    }
    free(os);
    for (size_t i = 0; i < c->children.cap; i++) {
        tpi_child *ch = c->children.slots[i].value;
        if (ch)
            leak_add(&l, TP_LEAK_CHILD, ch->rref->id, c->children.slots[i].key, ch->rref->owner,
                     ch->to);
    }
    for (tpi_call *k = c->calls_head; k; k = k->next)
        if (owes_delete(k->type, k->rref))
            leak_add(&l, TP_LEAK_DELETE, k->rref->id, k->rref->fork, k->rref->owner, c->rank);
    for (tpi_retry *t = c->retries; t; t = t->next)
        if (owes_delete(t->type, t->rref))
            leak_add(&l, TP_LEAK_DELETE, t->rref->id, t->rref->fork, t->rref->owner, c->rank);
    if (l.n > 1) /* maps iterate in slot order: sorted, the report is the same every run */
        qsort(l.v, l.n, sizeof *l.v, leak_cmp);
    *incomplete = l.short_of_memory;
    *out = l.v;
    return l.n;
}

/* ---- The rref API (RREF-*) -------------------------------------------------- */

/* A fetch the owner answered, with the value or an error. */
static void fetch_reply(tp_core *c, tpi_call *call, tp_status st, tpi_msg *reply) {
    (void)c;
    (void)st;
    if (reply)
        call->rref->answered = 1;
}

/* Fails every to_here of r still waiting with the creation error (RREF-14). */
static void fail_waiting_fetches(tp_core *c, tp_rref *r) {
    /* Restart the scan after each finish, which changes the list. */
    for (tpi_call *k = c->calls_head; k;) {
        if (k->type == TPI_MSG_RREF_FETCH && k->rref == r) {
            tpi_call_finish(c, k, r->failed, NULL, r->fail_msg);
            k = c->calls_head;
        } else {
            k = k->next;
        }
    }
}

/* RREF-14: tells the owner that the creation failed here, so every holder
 * sees the same fact. Answered; a lost one is no worse than RREF-12. */
/* 1 when the abandon went (it ends in proto_final), 0 when nobody is left to tell. */
static int send_abandon(tp_core *c, tp_rref *r) {
    if (c->peer_dead[r->owner] || tpi_rref_owner_restarted(c, r))
        return 0;
    proto_send(c, TPI_MSG_RREF_ABANDON, r->owner, r, no_fork, 0, 0);
    return 1;
}

/* The creator's delete that waited for its REMOTE's answer (RREF-15). */
static void remote_deferred_delete(tp_core *c, tp_rref *r, int deferred) {
    if (deferred && !c->peer_dead[r->owner] && !tpi_rref_owner_restarted(c, r))
        proto_send(c, TPI_MSG_RREF_DELETE, r->owner, r, r->fork, 0, 0);
}

static void remote_reply(tp_core *c, tpi_call *call, tp_status st, tpi_msg *reply) {
    tp_rref *r = call->rref;
    char msg[TP_ERRMSG_LEN_MAX];
    int deferred = !r->is_owner && r->delete_deferred;
    if (!r->is_owner) { /* the REMOTE that records our fork has an outcome */
        r->fork_pending = 0;
        r->delete_deferred = 0;
    }
    if (reply) {
        atomic_store(&r->confirmed, 1); /* the owner has it, value or error */
        if (st != TP_OK && !r->is_owner && !r->failed) { /* the function failed: RREF-14 */
            r->failed = st;
            r->fail_msg = strdup(reply->text[0] ? reply->text : tp_strerror(st));
            fail_waiting_fetches(c, r);
        }
        remote_deferred_delete(c, r, deferred);
        return;
    }
    /* No answer: creation timed out or the owner is gone. An owner that
     * answered a fetch of it had created it (and our fork: RREF-2), its
     * REMOTE answer was only lost behind that: not a failed creation. */
    if (r->is_owner) { /* remote to self (RREF-14): the creation timed out unless built */
        tpi_owner *o = tpi_idmap_get(&c->owners, r->id);
        if (o && !o->ready) {
            tpi_format(msg, sizeof msg, "the rref was not created: remote '%s' on '%s' did not "
                       "finish (%s)", call->fn, r->owner_name, tp_strerror(st));
            tpi_owner_set(c, o, st, NULL, msg);
        }
        return;
    }
    int abandoning = 0;
    if (!r->failed && !r->answered) {
        r->failed = st;
        tpi_format(msg, sizeof msg, "the rref was not created: remote '%s' on '%s' got no answer"
                   " (%s)", call->fn, r->owner_name, tp_strerror(st));
        r->fail_msg = strdup(msg);
        /* The fork no longer holds anything: whatever the owner has is
         * abandoned (RREF-14), and the REMOTE that recorded it may be lost. */
        tpi_probe_rref(c, TP_PROBE_RREF_FORK_GONE, r->id, r->fork, r->owner);
        fail_waiting_fetches(c, r); /* a to_here already waiting learns it now (RREF-2) */
        if (st != TP_EPEERDOWN)
            abandoning = send_abandon(c, r);
    }
    if (abandoning && !TPI_CANARY(TPI_CANARY_DELETE_BEFORE_ABANDON)) {
        /* The REMOTE may still be on its way (a network that reorders, or
         * loses its answer) and record our fork after a delete: the delete
         * waits for the abandon's answer, after which the owner refuses that
         * REMOTE (RREF-21) or has recorded the fork the delete removes. */
        r->fork_pending = 1;
        r->delete_deferred = deferred;
        return;
    }
    remote_deferred_delete(c, r, deferred);
}

tp_status tpi_start_remote(tp_core *c, uint32_t dst, const char *fn, uint16_t flags,
                           const tp_value *args, const tp_value *kwargs, double timeout_s,
                           tp_rref **out) {
    tpi_gid id = tpi_new_gid(c);
    tpi_gid fork = no_fork;
    tp_rref *r;
    if (dst == c->rank) { /* remote to self: we are the owner (RREF-2) */
        tpi_owner *o = tpi_owner_get_or_create(c, id);
        r = o ? tpi_rref_new_owner(c, o) : NULL;
    } else {
        fork = tpi_new_gid(c);
        r = tpi_rref_new_user(c, dst, id, fork);
        if (r) /* RREF-15: a delete waits for the REMOTE that records this fork */
            r->fork_pending = 1;
    }
    if (!r)
        return tpi_fail(TP_ENOMEM, "remote: out of memory");
    tpi_call *call = tpi_call_new(c, dst, TPI_MSG_REMOTE, "remote", fn);
    if (!call) {
        tp_rref_release(r);
        return tpi_fail(TP_ENOMEM, "remote: out of memory");
    }
    tpi_msg m;
    tpi_msg_call(&m, TPI_MSG_REMOTE, fn, args, kwargs);
    m.flags = flags;
    m.rref = id;
    m.fork = fork;
    call->rref = r;
    tpi_rref_pin(r);
    call->on_reply = remote_reply;
    call->flow = 1;
    tp_status st = tpi_call_issue(c, call, &m, timeout_s);
    if (st != TP_OK) {
        if (r->is_owner) { /* nobody will ever set it: make the record freeable */
            /* r's handle keeps the record, and only the REMOTE that was
             * never sent could have made it ready. */
            tpi_owner *o = tpi_idmap_get(&c->owners, id);
            TPI_ASSERT(o && !o->ready);
            tpi_owner_set(c, o, st, NULL, tp_errmsg());
        } else {
            r->released = 1; /* the owner never heard of it: no delete */
        }
        tp_rref_release(r);
        return st;
    }
    *out = r;
    return TP_OK;
}

tp_status tp_remote(tp_dest dest, const char *fn, const tp_value *args, const tp_value *kwargs,
                    double timeout_s, tp_rref **out) {
    if (!out)
        return tpi_fail(TP_EINVAL, "remote: out is NULL");
    *out = NULL;
    tp_core *c;
    tp_status st = tpi_enter("remote", &c);
    if (st != TP_OK)
        return st;
    uint32_t dst = 0;
    if (!tpi_name_valid(fn, NULL))
        st = tpi_fail(TP_EINVAL, "remote: function name '%.*s' must match ^[A-Za-z0-9_:-]+$ and "
                                 "be 1..%d bytes",
                      TP_NAME_LEN_MAX + 8, fn ? fn : "(null)", TP_NAME_LEN_MAX);
    if (st == TP_OK)
        st = tpi_check_timeout(timeout_s, 1);
    if (st == TP_OK && args && tp_value_kind(args) != TP_KIND_LIST)
        st = tpi_fail(TP_EINVAL, "remote: args must be a list");
    if (st == TP_OK && kwargs && tp_value_kind(kwargs) != TP_KIND_MAP)
        st = tpi_fail(TP_EINVAL, "remote: kwargs must be a map");
    if (st == TP_OK)
        st = tpi_resolve(c, dest, &dst);
    if (st == TP_OK) {
        tpi_lock(c);
        st = tpi_start_remote(c, dst, fn, 0, args, kwargs, timeout_s, out);
        tpi_unlock(c);
    }
    tpi_leave(c);
    return st;
}

tp_status tp_rref_from_value(tp_value *value, tp_rref **out) {
    if (!out) {
        tp_value_free(value);
        return tpi_fail(TP_EINVAL, "rref from value: out is NULL");
    }
    *out = NULL;
    tp_core *c;
    tp_status st = tpi_enter("rref from value", &c);
    if (st != TP_OK) {
        tp_value_free(value);
        return st;
    }
    tpi_lock(c);
    tpi_owner *o = tpi_owner_get_or_create(c, tpi_new_gid(c));
    tp_rref *r = o ? tpi_rref_new_owner(c, o) : NULL;
    if (r) {
        tpi_owner_set(c, o, TP_OK, value, NULL); /* takes value */
        value = NULL;
    } else if (o) {
        tpi_owner_set(c, o, TP_ENOMEM, NULL, "out of memory");
        tpi_owner_maybe_free(c, o);
    }
    tpi_unlock(c);
    tpi_leave(c);
    if (!r) {
        tp_value_free(value);
        return tpi_fail(TP_ENOMEM, "rref from value: out of memory");
    }
    *out = r;
    return TP_OK;
}

tp_status tpi_owner_wait(tp_core *c, tpi_owner *o, uint64_t deadline) {
    while (!o->ready) {
        tp_status st = park_on(c, &o->waiters, deadline);
        if (!o->ready && st != TP_OK) /* deadline, teardown, or a wait refused (FUNC-6) */
            return st;
    }
    return TP_OK;
}

tp_status tp_rref_to_here(tp_rref *r, double timeout_s, tp_value **out) {
    if (!r || !out)
        return tpi_fail(TP_EINVAL, "to_here: %s is NULL", r ? "out" : "rref");
    *out = NULL;
    tp_core *c = r->core;
    if (tpi_check_may_wait("to_here") != TP_OK)
        return TP_EINVAL;
    tp_status st = tpi_enter_core(c, "to_here");
    if (st != TP_OK)
        return st;
    st = tpi_check_timeout(timeout_s, 1);
    if (st != TP_OK) {
        tpi_leave(c);
        return st;
    }
    tpi_lock(c);
    if (r->is_owner) {
        double t = timeout_s == TP_TIMEOUT_DEFAULT ? c->default_timeout_s : timeout_s;
        tpi_owner *o = tpi_idmap_get(&c->owners, r->id);
        st = o ? tpi_owner_wait(c, o, tpi_deadline_after(c, t)) : TP_EINVAL;
        if (st == TP_ETIMEDOUT)
            tpi_fail(st, "to_here on the owner '%s': the value is not ready after %g s",
                     c->self.name, t);
        else if (st == TP_OK && o->status != TP_OK)
            st = tpi_fail_msg(o->status, o->errmsg);
        else if (st == TP_OK && tp_value_kind(o->value) == TP_KIND_OBJECT)
            st = tpi_fail(TP_ETYPE, "to_here: the rref holds an object, which stays on its owner "
                                    "(VALUE-8); use local_value or a method");
        else if (st == TP_OK && !(*out = tp_value_clone(o->value)))
            st = tpi_fail(TP_ENOMEM, "to_here: out of memory copying the value");
        tpi_unlock(c);
    } else if (r->failed) {
        st = tpi_fail_msg(r->failed, r->fail_msg);
        tpi_unlock(c);
    } else if (r->closed || r->released) {
        st = tpi_fail(TP_ESHUTDOWN, "to_here: the rref was released by shutdown");
        tpi_unlock(c);
    } else if ((st = tpi_rref_owner_check(c, r, "to_here")) != TP_OK) {
        tpi_unlock(c);
    } else {
        tpi_call *call = tpi_call_new(c, r->owner, TPI_MSG_RREF_FETCH, "to_here", NULL);
        tp_future *f = call ? tpi_future_ref(call->future) : NULL;
        if (!call) {
            st = tpi_fail(TP_ENOMEM, "to_here: out of memory");
        } else {
            tpi_msg m;
            tpi_msg_reset(&m);
            m.type = TPI_MSG_RREF_FETCH;
            m.rref = r->id;
            call->rref = r;
            call->on_reply = fetch_reply;
            tpi_rref_pin(r);
            /* No window wait (FLOW-1): sent now, in this lock section, right
             * behind the creation it follows, never after its loss. */
            st = tpi_call_issue(c, call, &m, timeout_s);
        }
        tpi_unlock(c);
        if (st == TP_OK)
            st = tpi_future_result(c, f, out);
        tp_future_free(f);
    }
    tpi_leave(c);
    return st;
}

tp_status tp_rref_local_value(tp_rref *r, const tp_value **out) {
    if (!r || !out)
        return tpi_fail(TP_EINVAL, "local_value: %s is NULL", r ? "out" : "rref");
    *out = NULL;
    tp_core *c = r->core;
    if (!r->is_owner)
        return tpi_fail(TP_ENOTOWNER,
                        "local_value: worker '%s' is not the owner of this rref; its owner is "
                        "worker '%s' (id %u)",
                        r->self_name, r->owner_name, r->owner);
    tp_status st = tpi_enter_core(c, "local_value");
    if (st != TP_OK)
        return st;
    tpi_lock(c);
    tpi_owner *o = tpi_idmap_get(&c->owners, r->id);
    if (o && !o->ready && tpi_check_may_wait("local_value") != TP_OK)
        st = TP_EINVAL; /* FUNC-6: a value not ready yet would mean a wait */
    else
        st = o ? tpi_owner_wait(c, o, tpi_deadline_after(c, c->default_timeout_s)) : TP_EINVAL;
    if (st == TP_ETIMEDOUT)
        tpi_fail(st, "local_value: the value is not ready after %g s", c->default_timeout_s);
    else if (st == TP_OK && o->status != TP_OK)
        st = tpi_fail_msg(o->status, o->errmsg);
    else if (st == TP_OK)
        *out = o->value;
    tpi_unlock(c);
    tpi_leave(c);
    return st;
}

tp_status tp_rref_owner(const tp_rref *r, tp_worker_info *out) {
    if (!r || !out)
        return tpi_fail(TP_EINVAL, "rref owner: %s is NULL", r ? "out" : "rref");
    memset(out, 0, sizeof *out);
    tpi_format(out->name, sizeof out->name, "%s", r->owner_name);
    out->id = r->owner;
    return TP_OK;
}

const char *tp_rref_owner_name(const tp_rref *r) {
    return r ? r->owner_name : "";
}

int tp_rref_is_owner(const tp_rref *r) {
    return r && r->is_owner;
}

int tp_rref_confirmed_by_owner(const tp_rref *r) {
    return r && atomic_load(&((tp_rref *)r)->confirmed);
}

tp_status tp_rref_ids(const tp_rref *r, tp_rref_gid *rref_id, tp_rref_gid *fork_id) {
    if (!r || !rref_id || !fork_id)
        return tpi_fail(TP_EINVAL, "rref_ids: %s is NULL", !r ? "rref" : "an out pointer");
    rref_id->worker = r->id.worker;
    rref_id->local = r->id.local;
    fork_id->worker = r->is_owner ? 0 : r->fork.worker;
    fork_id->local = r->is_owner ? 0 : r->fork.local;
    return TP_OK;
}

/* ---- Debug info (RREF-16) --------------------------------------------------------- */

static int is_protocol(uint8_t type) {
    return type == TPI_MSG_RREF_FORK || type == TPI_MSG_RREF_ACCEPT ||
           type == TPI_MSG_RREF_DELETE || type == TPI_MSG_RREF_ABANDON;
}

tp_status tp_get_debug_info(tp_debug_info *out) {
    if (!out)
        return tpi_fail(TP_EINVAL, "debug info: out is NULL");
    memset(out, 0, sizeof *out);
    tp_core *c;
    tp_status st = tpi_enter("debug info", &c);
    if (st != TP_OK)
        return st;
    tpi_lock(c);
    out->owned_values = c->owners.len;
    for (size_t i = 0; i < c->owners.cap; i++) { /* a sum: the order does not matter */
        const tpi_owner *o = c->owners.slots[i].value;
        if (o)
            out->owner_forks += o->nforks;
    }
    for (const tp_rref *r = c->users; r; r = r->next) {
        out->user_rrefs++;
        if (!atomic_load(&r->confirmed))
            out->pending_users++;
    }
    out->pending_children = c->children.len;
    for (const tpi_call *k = c->calls_head; k; k = k->next) {
        out->calls_in_flight++;
        if (is_protocol(k->type))
            out->pending_protocol++;
    }
    for (const tpi_retry *t = c->retries; t; t = t->next)
        out->pending_protocol++;
    tpi_unlock(c);
    tpi_leave(c);
    return TP_OK;
}

tp_status tp_get_debug_calls_in_flight(int rank, uint64_t *out) {
    if (!out)
        return tpi_fail(TP_EINVAL, "debug info: out is NULL");
    *out = 0;
    tp_core *c;
    tp_status st = tpi_enter("debug info", &c);
    if (st != TP_OK)
        return st;
    if (rank < 0 || (uint32_t)rank >= c->world_size) {
        st = tpi_fail(TP_EINVAL, "debug info: rank %d is outside the job of %u workers", rank,
                      c->world_size);
    } else {
        tpi_lock(c);
        for (const tpi_call *k = c->calls_head; k; k = k->next)
            if (k->dst == (uint32_t)rank)
                (*out)++;
        tpi_unlock(c);
    }
    tpi_leave(c);
    return st;
}
