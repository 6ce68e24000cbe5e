/*
 * call.c: the client side of calls (spec/calls.md CALL-*, TIMEOUT-*).
 *
 * Each message that expects a reply is a tpi_call: in the id map (to match
 * the reply), in an issue-ordered list (to fail calls to a peer in a
 * deterministic order), and in a deadline heap (one agent timer covers
 * them all). Timeouts and peer failures complete futures from the I/O
 * context: no worker-pool slot is ever needed to deliver them (TIMEOUT-5).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "canary.h"
#include "core.h"
#include "log.h"
#include "options.h"
#include "registry.h"

/* ---- Deadline heap ------------------------------------------------------- */

static void heap_swap(tp_core *c, size_t i, size_t j) {
    tpi_call *t = c->heap[i];
    c->heap[i] = c->heap[j];
    c->heap[j] = t;
    c->heap[i]->heap_index = i;
    c->heap[j]->heap_index = j;
}

static int heap_less(tp_core *c, size_t i, size_t j) {
    const tpi_call *a = c->heap[i], *b = c->heap[j];
    if (a->deadline_ns != b->deadline_ns)
        return a->deadline_ns < b->deadline_ns;
    return a->id < b->id; /* ties broken by issue order: determinism */
}

static void heap_up(tp_core *c, size_t i) {
    while (i > 0 && heap_less(c, i, (i - 1) / 2)) {
        heap_swap(c, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(tp_core *c, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < c->heap_len && heap_less(c, l, m))
            m = l;
        if (r < c->heap_len && heap_less(c, r, m))
            m = r;
        if (m == i)
            return;
        heap_swap(c, i, m);
        i = m;
    }
}

static tp_status heap_push(tp_core *c, tpi_call *call) {
    if (c->heap_len == c->heap_cap) {
        size_t cap = c->heap_cap ? c->heap_cap * 2 : 64;
        tpi_call **h = realloc(c->heap, cap * sizeof *h);
        if (!h)
            return TP_ENOMEM;
        c->heap = h;
        c->heap_cap = cap;
    }
    call->heap_index = c->heap_len;
    c->heap[c->heap_len++] = call;
    heap_up(c, call->heap_index);
    return TP_OK;
}

static void heap_remove(tp_core *c, tpi_call *call) {
    size_t i = call->heap_index;
    TPI_ASSERT(i < c->heap_len && c->heap[i] == call);
    c->heap_len--;
    if (i != c->heap_len) {
        c->heap[i] = c->heap[c->heap_len];
        c->heap[i]->heap_index = i;
        heap_down(c, i);
        heap_up(c, i);
    }
    call->heap_index = TPI_NO_INDEX;
}

static void rearm(tp_core *c) {
    uint64_t next = c->heap_len ? c->heap[0]->deadline_ns : TPI_NO_DEADLINE;
    uint64_t retry = tpi_retries_next(c); /* RREF-15 */
    if (retry < next)
        next = retry;
    /* Lazy disarm: an armed deadline earlier than needed stays; when it fires
     * the upcall finds nothing due and arms the next one. Re-arming each
     * time a call ended cost the TCP loop a wake-up (3 syscalls) per call. */
    if (next < c->armed_ns) {
        c->armed_ns = next;
        c->ops->timer_arm(c->agent, next);
    }
}

/* ---- Calls ------------------------------------------------------------------ */

tpi_call *tpi_call_new(tp_core *c, uint32_t dst, uint8_t type, const char *what,
                       const char *fn) {
    tpi_call *call = tpi_block_alloc(sizeof *call); /* blocks.h: no malloc once warm */
    if (!call)
        return NULL;
    memset(call, 0, sizeof *call);
    call->future = tpi_future_new(c);
    if (!call->future) {
        tpi_block_free(call, sizeof *call);
        return NULL;
    }
    call->dst = dst;
    call->future->peer = dst; /* its waiters may read the reply themselves (AGENT-20) */
    call->type = type;
    call->what = what;
    call->heap_index = TPI_NO_INDEX;
    call->deadline_ns = TPI_NO_DEADLINE;
    if (fn) /* a valid name (CALL-1), so within the buffer */
        tpi_copy_text(call->fn, sizeof call->fn, fn);
    return call;
}

void tpi_call_free(tp_core *c, tpi_call *call) {
    if (!call)
        return;
    if (call->rref)
        tpi_rref_unpin(c, call->rref);
    tp_future_free(call->future);
    tpi_block_free(call, sizeof *call);
}

static void list_remove(tp_core *c, tpi_call *call) {
    if (call->prev)
        call->prev->next = call->next;
    else
        c->calls_head = call->next;
    if (call->next)
        call->next->prev = call->prev;
    else
        c->calls_tail = call->prev;
    call->prev = call->next = NULL;
}

/* ---- Flow control (FLOW-1..4) ------------------------------------------------ */

atomic_int tpi_flow_ignore_credit;

void tp_test_flow_ignore_credit(int on) {
    atomic_store(&tpi_flow_ignore_credit, on != 0);
}

static void wake_first(tp_core *c, uint32_t dst);

/* The window to dst: ours, within what dst granted us (FLOW-6). */
static uint64_t window_to(const tp_core *c, uint32_t dst) {
    if (atomic_load_explicit(&tpi_flow_ignore_credit, memory_order_relaxed))
        return c->window;
    return c->credit[dst] < c->window ? c->credit[dst] : c->window;
}

static int window_fits(const tp_core *c, uint32_t dst, uint64_t len) {
    /* A call alone may be larger than the window: it must be able to go. */
    uint64_t inflight = tpi_peer_view(c, dst)->inflight;
    return inflight == 0 || inflight + len <= window_to(c, dst);
}

/* ---- Debts of timed-out calls (FLOW-7) ------------------------------------------ */

static void debt_unlink(tp_core *c, tpi_debt *d) {
    if (d->prev)
        d->prev->next = d->next;
    else
        c->debt_head = d->next;
    if (d->next)
        d->next->prev = d->prev;
    void *was = tpi_idmap_del(&c->debts, (tpi_gid){0, d->id});
    TPI_ASSERT(was == d);
    tpi_peer *p = tpi_peer_must(c, d->dst); /* a call to it was issued */
    TPI_ASSERT(p->inflight >= d->len);
    p->inflight -= d->len;
}

/* The call ended by its deadline: its bytes stay counted until the late
 * response (or the peer's end). 0 when there is no memory to remember it:
 * the bytes are given back at once, as before FLOW-7. */
static int debt_add(tp_core *c, const tpi_call *call) {
    tpi_debt *d = tpi_block_alloc(sizeof *d);
    if (!d)
        return 0;
    d->id = call->id;
    d->dst = call->dst;
    d->len = call->wire_len;
    d->prev = NULL;
    d->next = c->debt_head;
    if (tpi_idmap_put(&c->debts, (tpi_gid){0, d->id}, d) != TP_OK) {
        tpi_block_free(d, sizeof *d);
        return 0;
    }
    if (c->debt_head)
        c->debt_head->prev = d;
    c->debt_head = d;
    return 1;
}

int tpi_debt_pay(tp_core *c, uint32_t src, uint64_t id) {
    tpi_debt *d = tpi_idmap_get(&c->debts, (tpi_gid){0, id});
    if (!d || d->dst != src)
        return 0;
    debt_unlink(c, d);
    tpi_block_free(d, sizeof *d);
    if (tpi_peer_view(c, src)->nwaiting)
        wake_first(c, src); /* FLOW-2: room for the next in line */
    return 1;
}

void tpi_flow_peer_reset(tp_core *c, uint32_t peer) {
    for (tpi_debt *d = c->debt_head; d;) {
        tpi_debt *next = d->next;
        if (d->dst == peer) {
            debt_unlink(c, d);
            tpi_block_free(d, sizeof *d);
        }
        d = next;
    }
    /* The record is made if there is none, so the generations below count
     * every reset. Without memory for it the reset is skipped: a peer with
     * no record was never sent a request nor sent one here, so no window
     * and no held bytes of either end depend on its generations yet. */
    tpi_peer *p = tpi_peer_get(c, peer);
    if (!p)
        return;
    /* FLOW-8: what peer queued here counts against max_queued_bytes only. */
    p->held = 0;
    p->held_epoch++;
    p->refused_warned = 0;
    /* FLOW-9: our requests from now on are counted under a new generation;
     * the peer's next one names its own. */
    p->flow_gen++;
    p->src_gen_known = 0;
    p->forks_asked_ns = 0; /* RREF-19: its next query waits afresh */
    tpi_window_wake_all(c, peer);
}

void tpi_debts_free(tp_core *c) {
    while (c->debt_head) {
        tpi_debt *d = c->debt_head;
        c->debt_head = d->next;
        tpi_idmap_del(&c->debts, (tpi_gid){0, d->id});
        tpi_block_free(d, sizeof *d);
    }
}

static tpi_window_waiter *first_waiter(tp_core *c, uint32_t dst) {
    if (!tpi_peer_view(c, dst)->nwaiting)
        return NULL;
    for (tpi_window_waiter *w = c->wq_head; w; w = w->next)
        if (w->dst == dst)
            return w;
    TPI_ASSERT(!"nwaiting counts a waiter that is not in the list");
    return NULL;
}

static void wake_first(tp_core *c, uint32_t dst) {
    tpi_window_waiter *w = first_waiter(c, dst);
    if (w)
        c->ops->unpark(c->agent, w->task);
}

void tpi_window_wake_all(tp_core *c, uint32_t dst) {
    if (!tpi_peer_view(c, dst)->nwaiting)
        return;
    for (tpi_window_waiter *w = c->wq_head; w; w = w->next)
        if (w->dst == dst)
            c->ops->unpark(c->agent, w->task);
}

/*
 * FLOW-2: waits (lock held, may park) until a frame of len bytes fits dst's
 * window and no earlier waiter for dst is ahead, or the call's deadline, the
 * peer's death or teardown. The waiter counts as an active call, so shutdown's
 * drain never sees a quiet worker while a call is about to go out.
 */
static tp_status window_wait(tp_core *c, tpi_call *call, uint64_t len, char *err, size_t err_len) {
    uint32_t dst = call->dst;
    tpi_peer *p = tpi_peer_must(c, dst); /* made by issue */
    if (!p->nwaiting && window_fits(c, dst, len))
        return TP_OK;
    if (tpi_check_may_wait(call->what) != TP_OK) { /* FUNC-6: it cannot wait for room */
        tpi_format(err, err_len,
                   "the send window is full (%llu request bytes in flight to it, "
                   "max_inflight_bytes %llu) and a non-blocking function cannot wait for room",
                   (unsigned long long)p->inflight, (unsigned long long)c->window);
        return TP_ELIMIT;
    }
    tpi_window_waiter w = {c->ops->task_self(c->agent), dst, len, c->wq_tail, NULL};
    if (c->wq_tail)
        c->wq_tail->next = &w;
    else
        c->wq_head = &w;
    c->wq_tail = &w;
    p->nwaiting++;
    c->active_client++;
    tp_status st = TP_OK;
    for (;;) {
        if (c->peer_dead[dst]) {
            st = TP_EPEERDOWN;
            break;
        }
        if (first_waiter(c, dst) == &w && window_fits(c, dst, len))
            break;
        st = tpi_park(c, call->deadline_ns);
        if (st != TP_OK)
            break; /* the deadline (nothing is sent: FLOW-2), or teardown */
    }
    if (w.prev)
        w.prev->next = w.next;
    else
        c->wq_head = w.next;
    if (w.next)
        w.next->prev = w.prev;
    else
        c->wq_tail = w.prev;
    p->nwaiting--;
    TPI_ASSERT(c->active_client > 0);
    c->active_client--;
    wake_first(c, dst); /* the next in line checks for itself */
    if (st == TP_ETIMEDOUT && window_to(c, dst) < c->window)
        tpi_format(err, err_len,
                   "timed out after %g ms waiting to send: %llu request bytes already in flight to "
                   "it, this call adds %llu, the credit it granted is %llu (FLOW-6; "
                   "max_inflight_bytes %llu)",
                   call->timeout_s * 1000.0, (unsigned long long)p->inflight,
                   (unsigned long long)len, (unsigned long long)window_to(c, dst),
                   (unsigned long long)c->window);
    else if (st == TP_ETIMEDOUT)
        tpi_format(err, err_len,
                   "timed out after %g ms waiting to send: %llu request bytes already in flight to "
                   "it, this call adds %llu, max_inflight_bytes is %llu",
                   call->timeout_s * 1000.0, (unsigned long long)p->inflight,
                   (unsigned long long)len, (unsigned long long)c->window);
    else if (st == TP_EPEERDOWN)
        tpi_format(err, err_len, "the worker went down while the call waited to send");
    else if (st != TP_OK)
        tpi_format(err, err_len, "the worker shut down while the call waited to send");
    return st;
}

/*
 * Issues call; with defer non-NULL and a message that carries no rref, the
 * frame is registered and counted but not sent: *defer receives it and the
 * caller sends it once the lock is released (tpi_send_deferred).
 */
static tp_status issue(tp_core *c, tpi_call *call, tpi_msg *m, double timeout_s,
                       tpi_deferred *defer) {
    char err[TP_ERRMSG_LEN_MAX];
    char who[TP_NAME_LEN_MAX + 32];
    if (timeout_s == TP_TIMEOUT_DEFAULT)
        timeout_s = c->default_timeout_s; /* TIMEOUT-2: read when issued */
    call->id = ++c->next_id;
    call->timeout_s = timeout_s;
    call->timeout_ms = (uint64_t)ceil(timeout_s * 1000.0);
    call->deadline_ns = tpi_deadline_after(c, timeout_s);
    m->id = call->id;
    m->timeout_ms = (uint32_t)call->timeout_ms;

    if (c->peer_dead[call->dst]) {
        tpi_fail(TP_EPEERDOWN, "%s to %s%s%s%s: the worker is down", call->what,
                 tpi_worker_desc(c, call->dst, who, sizeof who), call->fn[0] ? ", function '" : "",
                 call->fn, call->fn[0] ? "'" : "");
        tpi_call_free(c, call);
        return TP_EPEERDOWN;
    }
    if (c->calls.len >= TPI_CALLS_IN_FLIGHT_MAX) {
        tpi_fail(TP_ELIMIT, "%s to %s: %u calls are already in flight from this worker",
                 call->what, tpi_worker_desc(c, call->dst, who, sizeof who),
                 TPI_CALLS_IN_FLIGHT_MAX);
        tpi_call_free(c, call);
        return TP_ELIMIT;
    }
    /* The destination's record (window, generation): every call issued has
     * one, so the call's later steps find it (tpi_peer_must). */
    tpi_peer *peer = tpi_peer_get(c, call->dst);
    if (!peer) {
        tpi_fail(TP_ENOMEM, "%s to %s: out of memory", call->what,
                 tpi_worker_desc(c, call->dst, who, sizeof who));
        tpi_call_free(c, call);
        return TP_ENOMEM;
    }
    /* Encoded first: the window counts wire bytes. Rrefs inside fork now, under
     * the lock, and are rolled back if the frame never leaves. */
    tpi_rref_ctx rc = {c, call->dst, NULL, 0, 0};
    tpi_codec_hooks hooks;
    tpi_rref_hooks(&rc, &hooks);
    tp_frame *f = NULL;
    tp_status st = tpi_msg_encode(m, &hooks, c->max_msg, &f, err, sizeof err);
    if (st == TP_OK && call->flow)
        st = window_wait(c, call, f->len, err, sizeof err);
    uint8_t type = st == TP_OK ? tpi_frame_type(f) : 0;
    if (type == TPI_MSG_REQUEST || type == TPI_MSG_REMOTE)
        tpi_frame_set_gen(f, peer->flow_gen); /* FLOW-9: counted under this one */
    tpi_gid key = {0, call->id};
    if (st == TP_OK) {
        st = tpi_idmap_put(&c->calls, key, call);
        if (st == TP_OK && call->deadline_ns != TPI_NO_DEADLINE)
            st = heap_push(c, call);
        if (st != TP_OK) {
            tpi_idmap_del(&c->calls, key);
            tpi_format(err, sizeof err, "out of memory registering the call");
            st = TP_ENOMEM;
        }
    }
    /* Registered before the send: a reply can never beat its registration. */
    int later = defer != NULL && rc.nundo == 0;
    if (st == TP_OK) {
        call->wire_len = f->len;
        st = later ? TP_OK : c->ops->send(c->agent, call->dst, f);
        if (st != TP_OK) {
            tpi_idmap_del(&c->calls, key);
            if (call->heap_index != TPI_NO_INDEX)
                heap_remove(c, call);
            tpi_format(err, sizeof err, "send to worker id %u failed: %s", call->dst,
                       tp_strerror(st));
        }
    }
    if (st != TP_OK) {
        tp_frame_free(f); /* the send's caller keeps the frame on error (AGENT-8) */
        tpi_rref_ctx_rollback(&rc);
        tpi_rref_ctx_done(&rc);
        tpi_fail(st, "%s to %s%s%s%s: %s", call->what,
                 tpi_worker_desc(c, call->dst, who, sizeof who), call->fn[0] ? ", function '" : "",
                 call->fn, call->fn[0] ? "'" : "", err);
        tpi_call_free(c, call);
        return st;
    }
    if (!later)
        tpi_rref_ctx_sent(&rc); /* lock held */
    tpi_rref_ctx_done(&rc);
    if (defer) {
        defer->frame = later ? f : NULL;
        defer->dst = call->dst;
        defer->id = call->id;
    }
    peer->inflight += call->wire_len;
    call->prev = c->calls_tail;
    if (c->calls_tail)
        c->calls_tail->next = call;
    else
        c->calls_head = call;
    c->calls_tail = call;
    c->active_client++;
    c->issued++;
    call->future->call_id = call->id;
    if (c->ops->probe) {
        tp_probe p = {.kind = TP_PROBE_CALL_ISSUE, .peer = call->dst, .msg_type = call->type,
                      .id = call->id, .deadline_ns = call->deadline_ns, .fn = call->fn,
                      .method = (m->flags & TPI_FLAG_METHOD) != 0};
        c->ops->probe(c->agent, &p);
    }
    rearm(c);
    return TP_OK;
}

tp_status tpi_call_issue(tp_core *c, tpi_call *call, tpi_msg *m, double timeout_s) {
    return issue(c, call, m, timeout_s, NULL);
}

tp_status tpi_send_deferred(tp_core *c, tpi_deferred *d, const char *what, const char *fn) {
    if (!d->frame)
        return TP_OK;
    TPI_ASSERT(!tpi_lock_held(c));
    tp_frame *f = d->frame;
    d->frame = NULL;
    tp_status st = c->ops->send(c->agent, d->dst, f);
    if (st == TP_OK)
        return TP_OK;
    tp_frame_free(f); /* the send's caller keeps the frame on error (AGENT-8) */
    char who[TP_NAME_LEN_MAX + 32];
    char msg[TP_ERRMSG_LEN_MAX];
    tpi_format(msg, sizeof msg, "%s to %s, function '%s': send to worker id %u failed: %s", what,
               tpi_worker_desc(c, d->dst, who, sizeof who), fn, d->dst, tp_strerror(st));
    tpi_lock(c);
    tpi_call *call = tpi_idmap_get(&c->calls, (tpi_gid){0, d->id});
    if (call) /* not yet ended by a timeout or a peer failure */
        tpi_call_finish(c, call, st, NULL, msg);
    tpi_unlock(c);
    return tpi_fail_msg(st, msg);
}

void tpi_call_finish(tp_core *c, tpi_call *call, tp_status st, tpi_msg *reply,
                     const char *errmsg) {
    tpi_gid key = {0, call->id};
    void *was = tpi_idmap_del(&c->calls, key);
    TPI_ASSERT(was == call);
    if (call->heap_index != TPI_NO_INDEX)
        heap_remove(c, call);
    list_remove(c, call);
    TPI_ASSERT(c->active_client > 0);
    c->active_client--;
    tpi_peer *p = tpi_peer_must(c, call->dst); /* made by issue */
    TPI_ASSERT(p->inflight >= call->wire_len);
    /* FLOW-7: a call that timed out keeps its bytes until its late reply,
     * as the callee still holds its request in its queue; only requests
     * that run code are queued there (FLOW-8). */
    int queued = call->type == TPI_MSG_REQUEST || call->type == TPI_MSG_REMOTE;
    /* CANCEL-1: a canceled request is still held by the callee, as a
     * timed-out one is: the same window rules. */
    int gave_up = st == TP_ETIMEDOUT || st == TP_ECANCELED;
    if (gave_up && queued && c->loses) {
        /* FLOW-10: on a transport that loses frames silently the late reply
         * may never come. The bytes go back now, under a new generation
         * (FLOW-9), so the callee forgets what it holds of the older one. */
        p->flow_gen++;
    }
    if (!(gave_up && queued && call->wire_len > 0 && !c->peer_dead[call->dst] &&
          !c->loses && debt_add(c, call))) {
        p->inflight -= call->wire_len;
        if (p->nwaiting)
            wake_first(c, call->dst); /* FLOW-2: room for the next in line */
    }
    tpi_probe(c, TP_PROBE_CALL_END, call->id, call->dst, st, call->fn);
    if (call->on_reply)
        call->on_reply(c, call, st, reply);
    tp_value *value = NULL;
    if (st == TP_OK && reply) {
        value = reply->value;
        reply->value = NULL;
    }
    tpi_future_complete(c, call->future, st, value, errmsg);
    tpi_call_free(c, call);
    rearm(c);
}

tp_status tp_future_cancel(tp_future *f) {
    if (!f)
        return tpi_fail(TP_EINVAL, "cancel: future is NULL");
    if (f->user_made || f->call_id == 0)
        return tpi_fail(TP_EINVAL, "cancel: only the future of an rpc_async (or an async method "
                                   "call) can be canceled; this one is %s",
                        f->user_made ? "the program's own (tp_future_set_error completes it)"
                                     : "a then, done-callback or collect_all future");
    tp_core *c = f->core;
    if (tp_future_done(f))
        return tpi_fail(TP_EALREADY, "cancel: the call ended already (%s)",
                        tp_status_name(f->status));
    tp_status st = tpi_enter_core(c, "cancel");
    if (st != TP_OK)
        return st;
    char msg[TP_ERRMSG_LEN_MAX];
    char who[TP_NAME_LEN_MAX + 32];
    tpi_lock(c);
    tpi_call *call = tpi_idmap_get(&c->calls, (tpi_gid){0, f->call_id});
    if (!call || call->future != f) {
        /* It ended between the look above and the lock: nothing to do. */
        st = tpi_fail(TP_EALREADY, "cancel: the call ended already");
    } else if (call->type != TPI_MSG_REQUEST) {
        st = tpi_fail(TP_EINVAL, "cancel: %s to %s is not an rpc_async; only those can be "
                                 "canceled (CANCEL-1)",
                      call->what, tpi_worker_desc(c, call->dst, who, sizeof who));
    } else {
        tpi_format(msg, sizeof msg, "%s to %s, function '%s': canceled by the caller", call->what,
                   tpi_worker_desc(c, call->dst, who, sizeof who), call->fn);
        /* Its request may still be on the wire (SHUTDOWN-5). */
        tpi_peer_must(c, call->dst)->unflushed = 1;
        uint32_t dst = call->dst;
        uint64_t id = call->id;
        tpi_call_finish(c, call, TP_ECANCELED, NULL, msg);
        tpi_cancel_send(c, dst, id); /* the callee's half: it stops counting it in S */
    }
    tpi_unlock(c);
    tpi_leave(c);
    return st;
}

void tpi_cancel_send(tp_core *c, uint32_t dst, uint64_t id) {
    /* Ids carry the incarnation up to bit 63 (REJOIN-3): the int holds the
     * same 64 bits, read back as unsigned by the callee. */
    char before[TP_ERRMSG_LEN_MAX]; /* tp_future_cancel succeeds whatever happens here */
    tpi_format(before, sizeof before, "%s", tp_errmsg());
    tp_value *args = tp_value_list_of(1, tp_value_int((int64_t)id));
    tpi_call *call = args ? tpi_call_new(c, dst, TPI_MSG_REQUEST, "cancel", TPI_CANCEL_FN) : NULL;
    tp_status st = TP_ENOMEM;
    if (call) {
        tpi_msg m;
        tpi_msg_call(&m, TPI_MSG_REQUEST, TPI_CANCEL_FN, args, NULL);
        /* A protocol call: it never waits for the window (FLOW-1), so the
         * canceling thread never blocks; it counts in C until answered. */
        st = tpi_call_issue(c, call, &m, TPI_CANCEL_TIMEOUT_S);
    }
    tpi_defer_free(c, args);
    if (st != TP_OK) { /* the request then ends as a timed-out one: its answer is dropped */
        tpi_log(TP_LOG_DEBUG, "worker '%s': could not tell worker %u that call %llu was canceled: "
                              "%s",
                c->self.name, dst, (unsigned long long)id, tp_errmsg());
        tpi_fail_msg(TP_OK, before);
    }
}

void tpi_calls_fail(tp_core *c, uint32_t dst, tp_status st, const char *why) {
    char msg[TP_ERRMSG_LEN_MAX];
    /* Restart from the head after each finish: on_reply steps may finish or
     * issue other calls, so a saved next pointer could dangle. */
    for (tpi_call *call = c->calls_head; call;) {
        if (dst != UINT32_MAX && call->dst != dst) {
            call = call->next;
            continue;
        }
        char who[TP_NAME_LEN_MAX + 32];
        tpi_worker_desc(c, call->dst, who, sizeof who);
        if (call->fn[0])
            tpi_format(msg, sizeof msg, "%s to %s, function '%s': %s", call->what, who, call->fn,
                       why);
        else
            tpi_format(msg, sizeof msg, "%s to %s: %s", call->what, who, why);
        tpi_call_finish(c, call, st, NULL, msg);
        call = c->calls_head;
    }
}

void tpi_deadlines_run(tp_core *c) {
    uint64_t now = tpi_now(c);
    char msg[TP_ERRMSG_LEN_MAX];
    char who[TP_NAME_LEN_MAX + 32];
    if (!TPI_CANARY(TPI_CANARY_TIMER_NOT_REARMED))
        c->armed_ns = TPI_NO_DEADLINE; /* the timer that fired is spent */
    while (c->heap_len && c->heap[0]->deadline_ns <= now) {
        tpi_call *call = c->heap[0];
        tpi_format(msg, sizeof msg, "%s to %s%s%s%s: timed out after %g ms", call->what,
                   tpi_worker_desc(c, call->dst, who, sizeof who), call->fn[0] ? ", function '" : "",
                   call->fn, call->fn[0] ? "'" : "", call->timeout_s * 1000.0);
        tpi_peer_must(c, call->dst)->unflushed = 1; /* its request may still be on the wire */
        if (TPI_CANARY(TPI_CANARY_DOUBLE_COMPLETE) && call->type == TPI_MSG_REQUEST) {
            heap_remove(c, call); /* broken: the call stays for its late reply */
            call->deadline_ns = TPI_NO_DEADLINE;
            tpi_future_complete(c, call->future, TP_ETIMEDOUT, NULL, msg);
            continue;
        }
        tpi_call_finish(c, call, TP_ETIMEDOUT, NULL, msg);
    }
    tpi_retries_run(c, now);
    rearm(c);
}

void tpi_rearm(tp_core *c) {
    rearm(c);
}

void tpi_on_response(tp_core *c, uint32_t src, tp_frame *f) {
    tpi_msg m;
    char err[TP_ERRMSG_LEN_MAX];
    char who[TP_NAME_LEN_MAX + 32];
    tpi_rref_ctx rc = {c, src};
    tpi_codec_hooks hooks;
    tpi_rref_hooks(&rc, &hooks);
    uint64_t id = tpi_frame_id(f);
    tp_status st = tpi_msg_decode_frame(f, &hooks, &m, err, sizeof err); /* takes f */
    tpi_lock(c);
    tpi_call *call = tpi_idmap_get(&c->calls, (tpi_gid){0, id});
    if (!call || call->dst != src) {
        /* A late reply to a call that timed out or failed (CALL-8); it
         * gives back the bytes a timed-out one kept (FLOW-7). */
        tpi_debt_pay(c, src, id);
        tpi_unlock(c);
        if (st == TP_OK)
            tpi_msg_clear(&m);
        return;
    }
    if (st != TP_OK) {
        char msg[TP_ERRMSG_LEN_MAX];
        tpi_format(msg, sizeof msg, "%s to %s: malformed reply: %s", call->what,
                   tpi_worker_desc(c, src, who, sizeof who), err);
        tpi_call_finish(c, call, TP_EPROTO, NULL, msg);
        tpi_unlock(c);
        return;
    }
    tp_status rst = (tp_status)m.status;
    if (m.status >= TP_STATUS_COUNT_)
        rst = TP_EPROTO;
    tpi_call_finish(c, call, rst, &m, rst == TP_OK ? NULL : m.text);
    tpi_unlock(c);
    tpi_msg_clear(&m);
}

/* ---- The call API (CALL-1..9) -------------------------------------------------- */

static tp_status check_args(const tp_value *args, const tp_value *kwargs) {
    if (args && tp_value_kind(args) != TP_KIND_LIST)
        return tpi_fail(TP_EINVAL, "args must be a list, got %s",
                        tp_kind_name(tp_value_kind(args)));
    if (kwargs && tp_value_kind(kwargs) != TP_KIND_MAP)
        return tpi_fail(TP_EINVAL, "kwargs must be a map, got %s",
                        tp_kind_name(tp_value_kind(kwargs)));
    return TP_OK;
}

/* Starts a REQUEST; on TP_OK *out is a new future reference. */
tp_status tpi_start_request(tp_core *c, uint32_t dst, const char *what, const char *fn,
                            uint16_t flags, const tp_value *args, const tp_value *kwargs,
                            double timeout_s, tp_future **out) {
    return tpi_start_request_deferred(c, dst, what, fn, flags, args, kwargs, timeout_s, out, NULL);
}

tp_status tpi_start_request_deferred(tp_core *c, uint32_t dst, const char *what, const char *fn,
                                     uint16_t flags, const tp_value *args, const tp_value *kwargs,
                                     double timeout_s, tp_future **out, tpi_deferred *defer) {
    tpi_msg m;
    tpi_msg_call(&m, TPI_MSG_REQUEST, fn, args, kwargs); /* fn validated: it fits */
    m.flags = flags;
    tpi_call *call = tpi_call_new(c, dst, TPI_MSG_REQUEST, what, fn);
    if (!call)
        return tpi_fail(TP_ENOMEM, "%s: out of memory", what);
    call->flow = 1;
    tp_future *f = tpi_future_ref(call->future);
    tp_status st = issue(c, call, &m, timeout_s, defer);
    if (st != TP_OK) {
        tp_future_free(f);
        return st;
    }
    *out = f;
    return TP_OK;
}

static tp_status validate_call(const char *what, const char *fn, const tp_value *args,
                               const tp_value *kwargs, double timeout_s) {
    if (!tpi_name_valid(fn, NULL))
        return tpi_fail(TP_EINVAL, "%s: function name '%.*s' must match ^[A-Za-z0-9_:-]+$ and "
                                   "be 1..%d bytes",
                        what, TP_NAME_LEN_MAX + 8, fn ? fn : "(null)", TP_NAME_LEN_MAX);
    tp_status st = tpi_check_timeout(timeout_s, 1);
    if (st != TP_OK)
        return st;
    return check_args(args, kwargs);
}

tp_status tp_rpc_async(tp_dest dest, const char *fn, const tp_value *args,
                       const tp_value *kwargs, double timeout_s, tp_future **out) {
    if (!out)
        return tpi_fail(TP_EINVAL, "rpc_async: out is NULL");
    *out = NULL;
    tp_core *c;
    tp_status st = tpi_enter("rpc_async", &c);
    if (st != TP_OK)
        return st;
    st = validate_call("rpc_async", fn, args, kwargs, timeout_s);
    uint32_t dst = 0;
    if (st == TP_OK)
        st = tpi_resolve(c, dest, &dst);
    if (st == TP_OK) {
        /* Sent once the lock is released: a reply that comes at once never
         * finds the lock held by this thread's system call. */
        tpi_deferred d = {NULL, 0, 0};
        tpi_lock(c);
        st = tpi_start_request_deferred(c, dst, "rpc_async", fn, 0, args, kwargs, timeout_s, out,
                                        &d);
        tpi_unlock(c);
        if (st == TP_OK)
            st = tpi_send_deferred(c, &d, "rpc_async", fn);
        if (st != TP_OK) {
            tp_future_free(*out);
            *out = NULL;
        }
    }
    tpi_leave(c);
    return st;
}

/* Waits for f without a wait deadline (the call's own deadline bounds it)
 * and moves its result out; records the future's message on failure. */
tp_status tpi_future_result(tp_core *c, tp_future *f, tp_value **result) {
    tpi_lock(c);
    tp_status st = tpi_future_wait_reply_locked(c, f, TPI_NO_DEADLINE);
    tpi_unlock(c);
    if (st != TP_OK) /* not done: the wait itself ended (shutdown) */
        return tpi_fail(st, "wait for the reply ended: %s", tp_strerror(st));
    st = f->status;
    if (st != TP_OK)
        tpi_fail_msg(st, f->errmsg ? f->errmsg : tp_strerror(st));
    else if (result)
        *result = tp_future_take_value(f);
    return st;
}

tp_status tp_rpc_sync(tp_dest dest, const char *fn, const tp_value *args,
                      const tp_value *kwargs, double timeout_s, tp_value **result) {
    if (!result)
        return tpi_fail(TP_EINVAL, "rpc_sync: result is NULL");
    *result = NULL;
    if (tpi_check_may_wait("rpc_sync") != TP_OK)
        return TP_EINVAL;
    tp_core *c;
    tp_status st = tpi_enter("rpc_sync", &c);
    if (st != TP_OK)
        return st;
    st = validate_call("rpc_sync", fn, args, kwargs, timeout_s);
    uint32_t dst = 0;
    if (st == TP_OK)
        st = tpi_resolve(c, dest, &dst);
    tp_future *f = NULL;
    if (st == TP_OK) {
        tpi_deferred d = {NULL, 0, 0};
        tpi_lock(c);
        st = tpi_start_request_deferred(c, dst, "rpc_sync", fn, 0, args, kwargs, timeout_s, &f,
                                        &d);
        tpi_unlock(c);
        if (st == TP_OK)
            st = tpi_send_deferred(c, &d, "rpc_sync", fn); /* see rpc_async */
    }
    if (st == TP_OK)
        st = tpi_future_result(c, f, result);
    tp_future_free(f);
    tpi_leave(c);
    return st;
}
