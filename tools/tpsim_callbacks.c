/*
 * tpsim_callbacks.c: the swarm's operations on the rest of the API (then,
 * done-callbacks, user futures, collect_all, answer-later functions, method
 * calls on rref-owned objects) and the oracle of their callbacks (spec/sim.md
 * SIM-10, issue 21).
 *
 * Each callback counts its runs in a record the world owns, so the check
 * outlives the futures: a then- or done-callback runs exactly once; one
 * registered before a graceful shutdown that returned TP_OK ran before it
 * returned, and so did the done-callback of the call it issued (the drain
 * waits for queued and running callbacks and for what they issue,
 * SHUTDOWN-5, FUTURE-5); after any other end, at most once. Everything runs
 * on the simulator's one OS thread: no locking.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/tpsim.h"

static tpsim_cb_rec *rec_new(tpsim_world *w, int me, tpsim_op op) {
    tpsim_cb_rec *r = calloc(1, sizeof *r);
    if (!r) {
        tpsim_world_fail(w, "w%d: out of memory for a callback record", me);
        return NULL;
    }
    r->w = w;
    r->me = me;
    r->op = op;
    r->incarnation = tp_sim_incarnation();
    r->nested_status = TP_OK;
    r->next = w->cbs;
    w->cbs = r;
    return r;
}

static tp_value *int_pair(int64_t a, int64_t b) {
    return tp_value_list_of(2, tp_value_int(a), tp_value_int(b));
}

/* The done-callback of the call a then-callback issued: checked like any add. */
static void nested_done_cb(tp_future *f, void *ud) {
    tpsim_cb_rec *r = ud;
    r->nested_done++;
    r->nested_status = tp_future_status(f);
    tpsim_pending q = {.op = r->op, .dst = r->dst2, .expect = r->expect};
    tpsim_check_outcome(r->w, r->me, &q, r->nested_status, tp_future_value(f), tp_future_error(f));
}

/*
 * The then-callback: passes its future's outcome on to the chained future,
 * and on success first sleeps (when asked) and issues add(value, 1) to dst2,
 * whose end a done-callback records. A callback's call is an active call for
 * the drain like any other (SHUTDOWN-5).
 */
static tp_status then_cb(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                         void *ud) {
    tpsim_cb_rec *r = ud;
    r->then_runs++;
    tp_status st = tp_future_status(f);
    if (st != TP_OK) {
        snprintf(errmsg, errmsg_len, "%s", tp_future_error(f));
        return st;
    }
    int64_t v = 0;
    if (tp_value_get_int(tp_future_value(f), &v) != TP_OK) {
        snprintf(errmsg, errmsg_len, "then: the answer is not an int");
        return TP_ETYPE;
    }
    if (r->sleep_us)
        (void)tp_sleep((double)r->sleep_us / 1e6);
    r->expect = v + 1;
    tp_value *args = int_pair(v, 1);
    tp_future *f2 = NULL;
    tp_status st2 = args ? tp_rpc_async(tp_to_rank(r->dst2), "add", args, NULL,
                                        r->nested_timeout_s, &f2)
                         : TP_ENOMEM;
    tp_value_free(args);
    if (st2 == TP_OK && (st2 = tp_future_add_done_callback(f2, nested_done_cb, r)) == TP_OK)
        r->nested_issued++;
    tp_future_free(f2); /* the call goes on (FUTURE-8); its callback holds what it needs */
    if (st2 != TP_OK) {
        r->nested_status = st2;
        tpsim_pending q = {.op = r->op, .dst = r->dst2, .expect = r->expect};
        tpsim_check_outcome(r->w, r->me, &q, st2, NULL, tp_errmsg());
    }
    *result = tp_value_int(v);
    return *result ? TP_OK : TP_ENOMEM;
}

/* The done-callback that completes a user future with its call's outcome. */
static void user_done_cb(tp_future *f, void *ud) {
    tpsim_cb_rec *r = ud;
    r->then_runs++;
    if (!r->user)
        return; /* its waiter gave up and freed it */
    tp_status st = tp_future_status(f);
    tp_status set = st == TP_OK ? tp_future_set_result(r->user, tp_value_clone(tp_future_value(f)))
                                : tp_future_set_error(r->user, st, tp_future_error(f));
    if (set != TP_OK)
        tpsim_world_fail(r->w, "w%d: completing a user future: %s: %s", r->me,
                         tp_status_name(set), tp_errmsg());
}

/* later_add's then-callback: the answer, or the error, of its own call. */
static tp_status later_then_cb(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                               void *ud) {
    (void)ud;
    tp_status st = tp_future_status(f);
    if (st != TP_OK) {
        snprintf(errmsg, errmsg_len, "later_add: %s", tp_future_error(f));
        return st;
    }
    *result = tp_value_clone(tp_future_value(f));
    return *result ? TP_OK : TP_ENOMEM;
}

/*
 * later_add(dest, a, b, timeout_us) -> add(a, b) on worker dest, answered
 * later (FUNC-7): the pool thread is free at once, and the answer goes when
 * a then-callback on the call's future completes.
 */
static tp_status fn_later_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                              tp_value **result, void *ud) {
    (void)kwargs, (void)result, (void)ud;
    int64_t v[4];
    for (size_t i = 0; i < 4; i++)
        if (tp_value_get_int(tp_list_get(args, i), &v[i]) != TP_OK) {
            tp_call_set_error(call, "later_add: argument %zu is not an int", i);
            return TP_EINVAL;
        }
    tp_value *aargs = int_pair(v[1], v[2]);
    tp_future *f = NULL, *chained = NULL;
    tp_status st = aargs ? tp_rpc_async(tp_to_rank((int)v[0]), "add", aargs, NULL,
                                        (double)v[3] / 1e6, &f)
                         : TP_ENOMEM;
    tp_value_free(aargs);
    if (st == TP_OK)
        st = tp_future_then(f, later_then_cb, NULL, &chained);
    if (st == TP_OK)
        st = tp_call_answer_later(call, chained);
    if (st != TP_OK)
        tp_call_set_error(call, "later_add via rank %lld: %s", (long long)v[0], tp_errmsg());
    tp_future_free(f);
    tp_future_free(chained);
    return st;
}

tp_status tpsim_callbacks_register(void) {
    return tp_register_function("later_add", fn_later_add, NULL);
}

/* ---- Issuing ------------------------------------------------------------------ */

static void start_then(tpsim_world *w, int me, const tpsim_op_spec *s, tpsim_pending *p) {
    tp_value *args = int_pair(s->a, s->b);
    tp_future *f0 = NULL;
    tp_status st = args ? tp_rpc_async(tp_to_rank(s->dst), "add", args, NULL, s->timeout_s, &f0)
                        : TP_ENOMEM;
    tp_value_free(args);
    tpsim_cb_rec *r = st == TP_OK ? rec_new(w, me, TPSIM_OP_THEN) : NULL;
    if (r) {
        r->dst2 = s->relay_to;
        r->nested_timeout_s = s->relay_timeout_s;
        st = tp_future_then(f0, then_cb, r, &p->f);
        p->rec = st == TP_OK ? r : NULL;
    }
    tp_future_free(f0); /* the then holds it until its callback ran */
    if (st != TP_OK)
        tpsim_check_outcome(w, me, p, st, NULL, tp_errmsg());
}

static void start_user(tpsim_world *w, int me, const tpsim_op_spec *s, tpsim_pending *p) {
    tp_value *args = int_pair(s->a, s->b);
    tp_future *f0 = NULL, *u = NULL;
    tp_status st = args ? tp_future_new(&u) : TP_ENOMEM;
    if (st == TP_OK)
        st = tp_rpc_async(tp_to_rank(s->dst), "add", args, NULL, s->timeout_s, &f0);
    tp_value_free(args);
    tpsim_cb_rec *r = st == TP_OK ? rec_new(w, me, TPSIM_OP_USER) : NULL;
    if (r) {
        r->user = u;
        st = tp_future_add_done_callback(f0, user_done_cb, r);
        if (st == TP_OK) {
            p->f = u;
            p->rec = r;
            u = NULL;
        } else {
            r->user = NULL;
        }
    }
    tp_future_free(f0);
    tp_future_free(u);
    if (st != TP_OK)
        tpsim_check_outcome(w, me, p, st, NULL, tp_errmsg());
}

static void start_collect(tpsim_world *w, int me, const tpsim_op_spec *s, tpsim_pending *p) {
    /* to the drawn worker, the third one and this one: a call to oneself too */
    const int dsts[TPSIM_COLLECT_MAX] = {s->dst, s->relay_to, me};
    int n = s->len >= 3 ? 3 : 2;
    for (int j = 0; j < n; j++) {
        tp_value *args = int_pair(s->a + j, s->b);
        tp_future *f = NULL;
        p->dst = dsts[j];
        tp_status st = args ? tp_rpc_async(tp_to_rank(dsts[j]), "add", args, NULL, s->timeout_s, &f)
                            : TP_ENOMEM;
        tp_value_free(args);
        if (st != TP_OK) {
            p->expect = s->a + s->b + j;
            tpsim_check_outcome(w, me, p, st, NULL, tp_errmsg());
            continue;
        }
        p->subs[p->nsubs] = f;
        p->sub_expect[p->nsubs] = s->a + s->b + j;
        p->sub_dst[p->nsubs++] = dsts[j];
    }
    p->dst = s->dst;
    p->expect = s->a + s->b;
    tp_status st = tp_future_collect_all(p->subs, (size_t)p->nsubs, &p->f);
    if (st != TP_OK) {
        tpsim_world_fail(w, "w%d: collect_all of %d futures: %s: %s", me, p->nsubs,
                         tp_status_name(st), tp_errmsg());
        tpsim_cb_settle_collect(w, me, p);
    }
}

static void start_later(tpsim_world *w, int me, const tpsim_op_spec *s, tpsim_pending *p) {
    tp_value *args = tp_value_list_of(4, tp_value_int(s->relay_to), tp_value_int(s->a),
                                      tp_value_int(s->b),
                                      tp_value_int((int64_t)(s->relay_timeout_s * 1e6)));
    tp_status st = args ? tp_rpc_async(tp_to_rank(s->dst), "later_add", args, NULL, s->timeout_s,
                                       &p->f)
                        : TP_ENOMEM;
    tp_value_free(args);
    if (st != TP_OK)
        tpsim_check_outcome(w, me, p, st, NULL, tp_errmsg());
}

static void start_method(tpsim_world *w, int me, const tpsim_op_spec *s, tpsim_pending *p) {
    tp_value *args = tp_value_list_of(1, tp_value_int(s->a));
    tp_rref *rr = NULL;
    tp_status st = args ? tp_remote(tp_to_rank(s->dst), "make_counter", args, NULL, s->timeout_s,
                                    &rr)
                        : TP_ENOMEM;
    tp_value_free(args);
    if (st == TP_OK) {
        args = tp_value_list_of(1, tp_value_int(s->b));
        st = args ? tp_rref_rpc_async(rr, "add", args, NULL, s->timeout_s, &p->f) : TP_ENOMEM;
        tp_value_free(args);
        tp_rref_release(rr); /* the call holds the value alive until it is served */
    }
    if (st != TP_OK)
        tpsim_check_outcome(w, me, p, st, NULL, tp_errmsg());
}

void tpsim_cb_op_start(tpsim_world *w, int me, const tpsim_op_spec *s, tpsim_pending *p) {
    memset(p, 0, sizeof *p);
    p->op = s->op;
    p->dst = s->dst;
    p->expect = s->a + s->b;
    p->must_succeed = s->must_succeed;
    p->line = s->line;
    switch (s->op) {
    case TPSIM_OP_THEN:
        start_then(w, me, s, p);
        break;
    case TPSIM_OP_USER:
        start_user(w, me, s, p);
        break;
    case TPSIM_OP_COLLECT:
        start_collect(w, me, s, p);
        break;
    case TPSIM_OP_LATER:
        start_later(w, me, s, p);
        break;
    case TPSIM_OP_METHOD:
        start_method(w, me, s, p);
        break;
    default:
        tpsim_world_fail(w, "w%d: %s is not a callback operation", me, tpsim_op_names[s->op]);
    }
}

void tpsim_cb_late_then(tpsim_world *w, int me, int dst, int dst2, double timeout_s,
                        double nested_timeout_s, int64_t delay_us, int64_t sleep_us) {
    tp_value *args = tp_value_list_of(3, tp_value_int(1), tp_value_int(2), tp_value_int(delay_us));
    tp_future *f0 = NULL, *chained = NULL;
    tp_status st = args ? tp_rpc_async(tp_to_rank(dst), "slow_add", args, NULL, timeout_s, &f0)
                        : TP_ENOMEM;
    tp_value_free(args);
    if (st != TP_OK)
        return; /* a dead worker: nothing registered, nothing to check */
    tpsim_cb_rec *r = rec_new(w, me, TPSIM_OP_THEN);
    if (r) {
        r->late = 1;
        r->dst2 = dst2;
        r->nested_timeout_s = nested_timeout_s;
        r->sleep_us = sleep_us;
        if (tp_future_then(f0, then_cb, r, &chained) != TP_OK)
            r->late = 0; /* calls closed already: never registered */
    }
    tp_future_free(f0);
    tp_future_free(chained); /* the then goes on; its record is what is checked */
}

/* ---- Settling and the oracle ------------------------------------------------------- */

void tpsim_cb_settle_collect(tpsim_world *w, int me, tpsim_pending *p) {
    const tp_value *list = p->f && tp_future_done(p->f) ? tp_future_value(p->f) : NULL;
    if (p->f && tp_future_done(p->f)) {
        tp_status st = tp_future_status(p->f);
        if (st != TP_OK && !(st == TP_ESHUTDOWN && tpsim_self_dead()))
            tpsim_world_fail(w, "w%d: collect_all ended %s: %s", me, tp_status_name(st),
                             tp_future_error(p->f));
        else if (st == TP_OK && tp_list_len(list) != (size_t)p->nsubs)
            tpsim_world_fail(w, "w%d: collect_all of %d futures answered %zu statuses", me,
                             p->nsubs, tp_list_len(list));
    }
    for (int j = 0; j < p->nsubs; j++) {
        tp_future *f = p->subs[j];
        /* the collect completed only once every one of them had */
        if (list && !tp_future_done(f))
            tpsim_world_fail(w, "w%d: collect_all completed before its future %d", me, j);
        int64_t got = -1;
        if (list && tp_future_done(f) &&
            (tp_value_get_int(tp_list_get(list, (size_t)j), &got) != TP_OK ||
             got != (int64_t)tp_future_status(f)))
            tpsim_world_fail(w, "w%d: collect_all says future %d ended %lld, it ended %s", me, j,
                             (long long)got, tp_status_name(tp_future_status(f)));
        if (tp_future_done(f)) {
            tpsim_pending q = *p;
            q.dst = p->sub_dst[j];
            q.expect = p->sub_expect[j];
            tpsim_check_outcome(w, me, &q, tp_future_status(f), tp_future_value(f),
                                tp_future_error(f));
        }
        tp_future_free(f);
        p->subs[j] = NULL;
    }
    p->nsubs = 0;
}

void tpsim_callbacks_check(tpsim_world *w, int me, tp_status st) {
    uint32_t inc = tp_sim_incarnation();
    for (tpsim_cb_rec *r = w->cbs; r; r = r->next) {
        if (r->me != me || r->incarnation != inc)
            continue;
        const char *what = r->op == TPSIM_OP_USER ? "done-callback" : "then-callback";
        if (r->then_runs > 1 || r->nested_done > 1 || r->nested_done > r->nested_issued) {
            tpsim_world_fail(w,
                             "w%d: a %s of %s ran %u times, the done-callback of its call %u "
                             "times (issued %u): each runs at most once",
                             me, what, tpsim_op_names[r->op], r->then_runs, r->nested_done,
                             r->nested_issued);
            return;
        }
        if (st != TP_OK)
            continue; /* not graceful to the end: a callback may never have run */
        if (r->late && r->then_runs != 1) {
            tpsim_world_fail(w,
                             "w%d: a then-callback registered before a graceful shutdown that "
                             "returned TP_OK never ran: the drain did not wait for it",
                             me);
            return;
        }
        if (r->nested_issued && r->nested_done != 1) {
            tpsim_world_fail(w,
                             "w%d: the call a then-callback issued to w%d had not ended when a "
                             "graceful shutdown returned TP_OK: the drain did not wait for it",
                             me, r->dst2);
            return;
        }
    }
}

void tpsim_callbacks_free(tpsim_world *w) {
    while (w->cbs) {
        tpsim_cb_rec *next = w->cbs->next;
        free(w->cbs);
        w->cbs = next;
    }
}
