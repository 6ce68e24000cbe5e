/*
 * future.c: futures (spec/calls.md FUTURE-1..8).
 *
 * Completion happens under the core lock from whichever context finishes the
 * call (I/O context for replies, timeouts and peer failures); it wakes
 * waiters directly with unpark and hands then-callbacks to the executor, so
 * no callback runs in the I/O context.
 */
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "canary.h"
#include "core.h"
#include "options.h"

struct tpi_then {
    tp_work work; /* first: the executor gives us back this pointer */
    tp_core *core;
    tp_future *parent;
    tp_future *chained;
    tp_then_fn cb;     /* tp_future_then; chained is set */
    tp_done_fn done_cb; /* tp_future_add_done_callback; chained is NULL */
    void *user_data;
    tpi_then *next;
};

tp_future *tpi_future_new(tp_core *c) {
    tp_future *f = tpi_block_alloc(sizeof *f); /* blocks.h: no malloc once warm */
    if (!f)
        return NULL;
    memset(f, 0, sizeof *f);
    atomic_init(&f->refs, 1);
    atomic_init(&f->done, 0);
    f->core = c;
    f->peer = TPI_NO_PEER;
    tpi_core_ref(c);
    return f;
}

tp_future *tpi_future_ref(tp_future *f) {
    int old = atomic_fetch_add(&f->refs, 1);
    TPI_ASSERT(old > 0);
    return f;
}

void tp_future_free(tp_future *f) {
    if (!f)
        return;
    int old = atomic_fetch_sub(&f->refs, 1);
    TPI_ASSERT(old > 0);
    if (old != 1)
        return;
    TPI_ASSERT(!f->waiters && !f->thens && !f->hooks && !f->unext && !f->uprev);
    tp_core *c = f->core;
    tpi_defer_free(c, f->value); /* the last reference may go under the lock */
    free(f->errmsg);
    tpi_block_free(f, sizeof *f);
    tpi_core_unref(c);
}

static void then_run(tp_work *w);

static void then_free(tpi_then *t) {
    tp_future_free(t->parent);
    tp_future_free(t->chained);
    tp_core *c = t->core;
    free(t);
    tpi_core_unref(c);
}

/* Hands a then-callback to the executor (lock held). */
static void then_schedule(tp_core *c, tpi_then *t) {
    t->work.run = then_run;
    /* A queued callback may still issue calls: the drain waits for it. */
    int counted = !TPI_CANARY(TPI_CANARY_THEN_UNCOUNTED);
    c->active_client += counted;
    tp_status st = c->ops->execute(c->agent, &t->work);
    if (st != TP_OK) {
        c->active_client -= counted;
        char msg[128];
        tpi_format(msg, sizeof msg, "then-callback not run: it could not be queued (%s)",
                   tp_strerror(st));
        if (t->chained)
            tpi_future_complete(c, t->chained, st, NULL, msg);
        then_free(t);
    }
}

/* FUTURE-9: the core's list of pending user futures (lock held). */
static void user_list(tp_core *c, tp_future *f) {
    f->uprev = NULL;
    f->unext = c->user_futures;
    if (c->user_futures)
        c->user_futures->uprev = f;
    c->user_futures = f;
    tpi_future_ref(f);
}

static void user_unlist(tp_core *c, tp_future *f) {
    if (!f->uprev && c->user_futures != f)
        return; /* not listed (completed already) */
    if (f->uprev)
        f->uprev->unext = f->unext;
    else
        c->user_futures = f->unext;
    if (f->unext)
        f->unext->uprev = f->uprev;
    f->uprev = f->unext = NULL;
    tp_future_free(f); /* the list's reference: never the last, the completer holds one */
}

void tpi_futures_fail_user(tp_core *c, tp_status st, const char *why) {
    while (c->user_futures) {
        tp_future *f = tpi_future_ref(c->user_futures);
        tpi_future_complete(c, f, st, NULL, why); /* unlists it */
        tp_future_free(f);
    }
}

void tpi_future_hook(tp_core *c, tp_future *f, tpi_hook *h) {
    TPI_ASSERT(f->core == c && h->fn);
    if (atomic_load(&f->done)) {
        h->next = NULL;
        h->fn(c, f, h);
        return;
    }
    h->next = f->hooks;
    f->hooks = h;
}

void tpi_future_complete(tp_core *c, tp_future *f, tp_status st, tp_value *value,
                         const char *errmsg) {
    TPI_ASSERT(f->core == c);
    if (atomic_load(&f->done)) {
        if (!TPI_CANARY(TPI_CANARY_DOUBLE_COMPLETE)) {
            tpi_defer_free(c, value);
            return;
        }
        /* Broken on purpose: the second completion overwrites the first. */
        free(f->errmsg);
        f->errmsg = NULL;
        tpi_defer_free(c, f->value);
        f->value = NULL;
    }
    f->status = st;
    f->value = st == TP_OK ? value : NULL;
    if (st != TP_OK) {
        tpi_defer_free(c, value);
        f->errmsg = strdup(errmsg && *errmsg ? errmsg : tp_strerror(st));
    }
    atomic_store_explicit(&f->done, 1, memory_order_release);
    if (f->call_id)
        tpi_probe(c, TP_PROBE_FUTURE_DONE, f->call_id, 0, st, NULL);
    if (f->user_made)
        user_unlist(c, f); /* drops the list's reference; the caller still holds one */
    for (tpi_waiter *w = f->waiters; w; w = w->next) {
        if (w->log && w->log->n < w->log->cap) /* once per future: it completes once */
            w->log->index[w->log->n++] = w->index;
        c->ops->unpark(c->agent, w->task);
    }
    tpi_hook *h = f->hooks;
    f->hooks = NULL;
    while (h) { /* a hook may free its node, and drop its reference to f */
        tpi_hook *next = h->next;
        h->fn(c, f, h);
        h = next;
    }
    tpi_then *t = f->thens;
    f->thens = NULL;
    while (t) {
        tpi_then *next = t->next;
        then_schedule(c, t);
        t = next;
    }
}

static void then_run(tp_work *w) {
    tpi_then *t = (tpi_then *)w;
    tp_core *c = t->core;
    char err[TP_ERRMSG_LEN_MAX];
    err[0] = '\0';
    tp_value *result = NULL;
    tp_status st;
    if (atomic_load(&c->state) != TPI_STATE_RUNNING) {
        st = TP_ESHUTDOWN;
        tpi_format(err, sizeof err, "then-callback not run: the worker is shutting down");
    } else if (t->done_cb) {
        tpi_waiter node;
        tpi_work_enter(c, &node);
        t->done_cb(t->parent, t->user_data);
        tpi_work_leave(c, &node);
        st = TP_OK;
    } else {
        tpi_waiter node;
        tpi_work_enter(c, &node);
        st = t->cb(t->parent, &result, err, sizeof err, t->user_data);
        tpi_work_leave(c, &node);
        if (st != TP_OK && !err[0])
            tpi_format(err, sizeof err, "then-callback failed: %s (%s)", tp_status_name(st),
                       tp_strerror(st));
    }
    tpi_lock(c);
    if (t->chained)
        tpi_future_complete(c, t->chained, st, result, err);
    else
        tpi_defer_free(c, result);
    int counted = !TPI_CANARY(TPI_CANARY_THEN_UNCOUNTED); /* as then_schedule saw it */
    TPI_ASSERT(!counted || c->active_client > 0);
    c->active_client -= counted;
    tpi_unlock(c);
    then_free(t);
}

static void waiter_link(tp_future *f, tpi_waiter *w) {
    w->prev = NULL;
    w->next = f->waiters;
    if (f->waiters)
        f->waiters->prev = w;
    f->waiters = w;
}

static void waiter_unlink(tp_future *f, tpi_waiter *w) {
    if (w->prev)
        w->prev->next = w->next;
    else
        f->waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
}

static tp_status future_wait(tp_core *c, tp_future *f, uint64_t deadline_ns, uint32_t peer) {
    while (!atomic_load(&f->done)) {
        tpi_waiter w = {c->ops->task_self(c->agent), NULL, NULL};
        waiter_link(f, &w);
        tp_status st = tpi_park_for(c, deadline_ns, peer);
        waiter_unlink(f, &w);
        if (atomic_load(&f->done))
            break;
        if (st != TP_OK) /* deadline, teardown, or a wait refused (FUNC-6) */
            return st;
    }
    return TP_OK;
}

tp_status tpi_future_wait_locked(tp_core *c, tp_future *f, uint64_t deadline_ns) {
    return future_wait(c, f, deadline_ns, TPI_NO_PEER);
}

tp_status tpi_future_wait_reply_locked(tp_core *c, tp_future *f, uint64_t deadline_ns) {
    return future_wait(c, f, deadline_ns, f->peer);
}

/* FUTURE-2: only tasks of the future's own worker wait on it (another
 * worker's task would park on an agent that is not its own). */
static tp_status check_waiter(tp_core *c, const char *what) {
    if (tpi_check_may_wait(what) != TP_OK)
        return TP_EINVAL;
    if (tp_context_current()->core != c)
        return tpi_fail(TP_EINVAL, "%s: the future belongs to worker '%s'; only its own tasks "
                                   "may wait on it",
                        what, c->self.name);
    return TP_OK;
}

static tp_status record(const tp_future *f) {
    if (f->status != TP_OK)
        tpi_fail_msg(f->status, f->errmsg);
    return f->status;
}

/* A wait's own deadline: -1 the current default, 0 none (FUTURE-2);
 * *timeout_s becomes the effective value, for messages. */
static tp_status wait_deadline(tp_core *c, double *timeout_s, uint64_t *deadline) {
    tp_status st = tpi_check_timeout(*timeout_s, 1);
    if (st != TP_OK)
        return st;
    if (*timeout_s == TP_TIMEOUT_DEFAULT) {
        tpi_lock(c);
        *timeout_s = c->default_timeout_s;
        tpi_unlock(c);
    }
    *deadline = tpi_deadline_after(c, *timeout_s);
    return TP_OK;
}

tp_status tp_future_wait(tp_future *f, double timeout_s) {
    if (!f)
        return tpi_fail(TP_EINVAL, "future wait: future is NULL");
    /* Checked first: whether an argument is valid must not depend on timing. */
    if (tpi_check_timeout(timeout_s, 1) != TP_OK)
        return TP_EINVAL;
    if (atomic_load_explicit(&f->done, memory_order_acquire))
        return record(f);
    tp_core *c = f->core;
    if (check_waiter(c, "future wait") != TP_OK)
        return TP_EINVAL;
    tp_status st = tpi_enter_core(c, "future wait");
    if (st != TP_OK) {
        /* Teardown completes every future before the state leaves RUNNING
         * for good, so a pending future here is being failed right now. */
        if (atomic_load_explicit(&f->done, memory_order_acquire))
            return record(f);
        return st;
    }
    uint64_t deadline;
    st = wait_deadline(c, &timeout_s, &deadline);
    if (st == TP_OK) {
        tpi_lock(c);
        st = tpi_future_wait_locked(c, f, deadline);
        tpi_unlock(c);
        if (st == TP_OK)
            st = record(f);
        else if (st == TP_ETIMEDOUT)
            tpi_fail(st, "future wait timed out after %g s; the call goes on", timeout_s);
        else
            tpi_fail(st, "future wait ended: the worker is shutting down");
    }
    tpi_leave(c);
    return st;
}

int tp_future_done(const tp_future *f) {
    return f && atomic_load_explicit(&((tp_future *)f)->done, memory_order_acquire);
}

tp_status tp_future_status(const tp_future *f) {
    if (!f)
        return tpi_fail(TP_EINVAL, "future status: future is NULL");
    if (!tp_future_done(f))
        return tpi_fail(TP_EINVAL, "the future is still pending");
    return f->status;
}

const tp_value *tp_future_value(const tp_future *f) {
    return tp_future_done(f) && f->status == TP_OK ? f->value : NULL;
}

tp_value *tp_future_take_value(tp_future *f) {
    if (!tp_future_done(f) || f->status != TP_OK)
        return NULL;
    tp_value *v = f->value;
    f->value = NULL;
    return v;
}

const char *tp_future_error(const tp_future *f) {
    return tp_future_done(f) && f->errmsg ? f->errmsg : "";
}

/* Queues a continuation on f: cb with a chained future, or done_cb without. */
static tp_status add_then(tp_future *f, tp_then_fn cb, tp_done_fn done_cb, void *user_data,
                          tp_future **chained, const char *what) {
    tp_core *c = f->core;
    tp_status st = tpi_enter_core(c, what);
    if (st != TP_OK)
        return st;
    tpi_then *t = calloc(1, sizeof *t);
    tp_future *ch = t && chained ? tpi_future_new(c) : NULL;
    if (!t || (chained && !ch)) {
        free(t);
        tpi_leave(c);
        return tpi_fail(TP_ENOMEM, "%s: out of memory", what);
    }
    tpi_core_ref(c);
    t->core = c;
    t->parent = tpi_future_ref(f);
    t->chained = ch ? tpi_future_ref(ch) : NULL;
    t->cb = cb;
    t->done_cb = done_cb;
    t->user_data = user_data;
    tpi_lock(c);
    if (atomic_load(&f->done)) {
        then_schedule(c, t);
    } else { /* FUTURE-5: callbacks run in the order they were added */
        tpi_then **tail = &f->thens;
        while (*tail)
            tail = &(*tail)->next;
        *tail = t;
    }
    tpi_unlock(c);
    tpi_leave(c);
    if (chained)
        *chained = ch;
    return TP_OK;
}

tp_status tp_future_then(tp_future *f, tp_then_fn cb, void *user_data, tp_future **chained) {
    if (chained)
        *chained = NULL;
    if (!f || !chained)
        return tpi_fail(TP_EINVAL, "future then: %s is NULL", f ? "chained" : "future");
    if (!cb)
        return tpi_fail(TP_EINVAL, "then-callback is NULL");
    return add_then(f, cb, NULL, user_data, chained, "future then");
}

tp_status tp_future_add_done_callback(tp_future *f, tp_done_fn cb, void *user_data) {
    if (!f || !cb)
        return tpi_fail(TP_EINVAL, "add_done_callback: %s is NULL", f ? "callback" : "future");
    return add_then(f, NULL, cb, user_data, NULL, "add_done_callback");
}

/* ---- Futures the user completes (FUTURE-9) ------------------------------------------- */

tp_status tp_future_new(tp_future **out) {
    if (!out)
        return tpi_fail(TP_EINVAL, "future_new: out is NULL");
    *out = NULL;
    tp_core *c;
    tp_status st = tpi_enter("future_new", &c);
    if (st != TP_OK)
        return st;
    tp_future *f = tpi_future_new(c);
    if (!f) {
        tpi_leave(c);
        return tpi_fail(TP_ENOMEM, "future_new: out of memory");
    }
    f->user_made = 1;
    tpi_lock(c);
    user_list(c, f);
    tpi_unlock(c);
    tpi_leave(c);
    *out = f;
    return TP_OK;
}

/* Completes a user future; value transferred whatever happens. */
static tp_status set_outcome(tp_future *f, tp_status st, tp_value *value, const char *errmsg,
                             const char *what) {
    if (!f) {
        tp_value_free(value);
        return tpi_fail(TP_EINVAL, "%s: future is NULL", what);
    }
    if (!f->user_made) {
        tp_value_free(value);
        return tpi_fail(TP_EINVAL, "%s: only a future made by tp_future_new can be completed "
                                   "by its user; this one belongs to a call",
                        what);
    }
    tp_core *c = f->core;
    tp_status est = tpi_enter_core(c, what);
    if (est != TP_OK) {
        tp_value_free(value);
        return est;
    }
    tpi_lock(c);
    int was_done = atomic_load(&f->done);
    if (!was_done)
        tpi_future_complete(c, f, st, value, errmsg);
    else
        tpi_defer_free(c, value);
    tpi_unlock(c);
    tpi_leave(c);
    if (was_done)
        return tpi_fail(TP_EINVAL, "%s: the future is already complete (%s); a future "
                                   "completes once",
                        what, f->status == TP_OK ? "with a value" : tp_status_name(f->status));
    return TP_OK;
}

tp_status tp_future_set_result(tp_future *f, tp_value *value) {
    return set_outcome(f, TP_OK, value, NULL, "future set_result");
}

tp_status tp_future_set_error(tp_future *f, tp_status status, const char *errmsg) {
    if (status == TP_OK)
        return tpi_fail(TP_EINVAL, "future set_error: the status must be an error, not TP_OK");
    return set_outcome(f, status, NULL, errmsg, "future set_error");
}

/* ---- collect_all (FUTURE-11) ------------------------------------------------------- */

typedef struct tpi_collect tpi_collect;
typedef struct collect_slot {
    tpi_hook hook; /* first: the hook gives back this slot */
    tpi_collect *all;
    tp_future *input; /* counted until it completes */
} collect_slot;
struct tpi_collect {
    tp_future *result; /* counted */
    size_t n, remaining;
    collect_slot slots[];
};

/* The last input completed (lock held): the statuses, in order. */
static void collect_finish(tp_core *c, tpi_collect *a) {
    tp_value *list = tp_value_list();
    for (size_t i = 0; list && i < a->n; i++) {
        tp_value *s = tp_value_int((int64_t)a->slots[i].input->status);
        if (tp_list_append(list, s) != TP_OK) {
            tp_value_free(s); /* a refused item stays ours (rpc.h) */
            tp_value_free(list);
            list = NULL;
        }
    }
    if (list)
        tpi_future_complete(c, a->result, TP_OK, list, NULL);
    else
        tpi_future_complete(c, a->result, TP_ENOMEM, NULL,
                            "collect_all: out of memory for the statuses");
    for (size_t i = 0; i < a->n; i++)
        tp_future_free(a->slots[i].input); /* the completer holds its own reference */
    tp_future_free(a->result);
    free(a);
}

static void collect_one(tp_core *c, tp_future *f, tpi_hook *h) {
    collect_slot *slot = (collect_slot *)h;
    tpi_collect *a = slot->all;
    TPI_ASSERT(slot->input == f && a->remaining > 0);
    (void)f;
    if (--a->remaining == 0)
        collect_finish(c, a);
}

tp_status tp_future_collect_all(tp_future *const *futures, size_t n, tp_future **out) {
    if (!out)
        return tpi_fail(TP_EINVAL, "collect_all: out is NULL");
    *out = NULL;
    if (n > 0 && !futures)
        return tpi_fail(TP_EINVAL, "collect_all: futures is NULL");
    for (size_t i = 0; i < n; i++) {
        if (!futures[i])
            return tpi_fail(TP_EINVAL, "collect_all: future %zu is NULL", i);
        if (futures[i]->core != futures[0]->core)
            return tpi_fail(TP_EINVAL, "collect_all: future %zu belongs to another worker", i);
    }
    tp_core *c = NULL;
    tp_status st = n > 0 ? tpi_enter_core(futures[0]->core, "collect_all")
                         : tpi_enter("collect_all", &c);
    if (st != TP_OK)
        return st;
    if (n > 0)
        c = futures[0]->core;
    tpi_collect *a = n <= (SIZE_MAX - sizeof *a) / sizeof a->slots[0]
                         ? calloc(1, sizeof *a + n * sizeof a->slots[0])
                         : NULL;
    tp_future *result = a ? tpi_future_new(c) : NULL;
    if (!result) {
        free(a);
        tpi_leave(c);
        return tpi_fail(TP_ENOMEM, "collect_all: out of memory for %zu futures", n);
    }
    a->result = tpi_future_ref(result);
    a->n = n;
    a->remaining = n + 1; /* one for this setup, so no hook finishes it half-built */
    tpi_lock(c);
    for (size_t i = 0; i < n; i++) {
        a->slots[i].hook.fn = collect_one;
        a->slots[i].all = a;
        a->slots[i].input = tpi_future_ref(futures[i]);
        tpi_future_hook(c, futures[i], &a->slots[i].hook); /* runs at once when done */
    }
    if (--a->remaining == 0)
        collect_finish(c, a);
    tpi_unlock(c);
    tpi_leave(c);
    *out = result;
    return TP_OK;
}

tp_status tp_future_wait_all(tp_future *const *futures, size_t n, double timeout_s,
                             size_t *failed_index) {
    if (failed_index)
        *failed_index = n; /* FUTURE-6: n on success */
    if (tpi_check_timeout(timeout_s, 1) != TP_OK)
        return TP_EINVAL; /* first, as tp_future_wait does */
    if (n == 0)
        return TP_OK;
    if (!futures)
        return tpi_fail(TP_EINVAL, "wait_all: futures is NULL");
    if (!futures[0])
        return tpi_fail(TP_EINVAL, "wait_all: future 0 is NULL");
    tp_core *c = futures[0]->core;
    for (size_t i = 0; i < n; i++) {
        if (!futures[i])
            return tpi_fail(TP_EINVAL, "wait_all: future %zu is NULL", i);
        if (futures[i]->core != c)
            return tpi_fail(TP_EINVAL, "wait_all: future %zu belongs to another worker", i);
    }
    if (check_waiter(c, "wait_all") != TP_OK)
        return TP_EINVAL;
    tp_status st = tpi_enter_core(c, "wait_all");
    if (st != TP_OK)
        return st;
    uint64_t deadline;
    st = wait_deadline(c, &timeout_s, &deadline);
    tpi_waiter *ws = st == TP_OK ? calloc(n, sizeof *ws) : NULL;
    tpi_done_log log = {st == TP_OK ? calloc(n, sizeof *log.index) : NULL, 0, n};
    if (st == TP_OK && (!ws || !log.index))
        st = tpi_fail(TP_ENOMEM, "wait_all: out of memory for %zu waiters", n);
    if (st != TP_OK) {
        free(ws);
        free(log.index);
        tpi_leave(c);
        return st;
    }
    tp_task *self = c->ops->task_self(c->agent);
    tpi_lock(c);
    /* One look at every future, then only at those that complete: each
     * pending one gets a waiter that logs its index when it completes. */
    size_t pending = 0, failed = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (!atomic_load(&futures[i]->done)) {
            ws[i] = (tpi_waiter){.task = self, .log = &log, .index = i};
            waiter_link(futures[i], &ws[i]);
            pending++;
        } else if (futures[i]->status != TP_OK && failed == SIZE_MAX) {
            failed = i;
        }
    }
    size_t seen = 0; /* log entries already looked at */
    for (;;) {
        for (; seen < log.n; seen++) {
            size_t i = log.index[seen];
            pending--;
            if (futures[i]->status != TP_OK && i < failed)
                failed = i;
        }
        if (failed != SIZE_MAX) { /* FUTURE-6: the first failure wins at once */
            if (failed_index)
                *failed_index = failed;
            st = tpi_fail(futures[failed]->status, "wait_all: future %zu of %zu failed: %s",
                          failed, n, futures[failed]->errmsg ? futures[failed]->errmsg : "");
            break;
        }
        if (pending == 0) {
            st = TP_OK;
            break;
        }
        tp_status pst = tpi_park(c, deadline);
        if (pst != TP_OK && log.n == seen) { /* deadline, teardown, or a refused wait (FUNC-6) */
            for (size_t i = 0; failed_index && i < n; i++) {
                if (!atomic_load(&futures[i]->done)) { /* the lowest still pending */
                    *failed_index = i;
                    break;
                }
            }
            st = tpi_fail(pst, "wait_all: %s with %zu of %zu futures pending",
                          pst == TP_ETIMEDOUT ? "timed out" : "the worker is shutting down",
                          pending, n);
            break;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (ws[i].task)
            waiter_unlink(futures[i], &ws[i]);
    tpi_unlock(c);
    free(ws);
    free(log.index);
    tpi_leave(c);
    return st;
}
