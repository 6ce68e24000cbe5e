/*
 * tpsim_ops.c: the operations swarm runs and workload files issue, and the
 * checks on what they answer (tools/README.md, spec/sim.md SIM-10).
 *
 * Under faults a call may time out, find its peer down or unreachable, or
 * get its function's own error; anything else is a failure, and an answer
 * that says TP_OK must carry exactly the right value. The functions the
 * operations call (echo, relay, fail) are registered here beside tpsim's.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/tpsim.h"

const char *const tpsim_op_names[TPSIM_OP_KINDS] = {
    "sync_add", "async_add", "slow",    "forward", "echo",  "fail",   "unknown", "remote",
    "forget",   "share",     "then",    "user",    "collect", "later", "method", "liveness"};

const char *const tpsim_out_names[TPSIM_OUT_KINDS] = {"ok",  "timeout", "peerdown",
                                                      "eio", "remote",  "other"};

int tpsim_outcome_of(tp_status st) {
    switch (st) {
    case TP_OK:
        return TPSIM_OUT_OK;
    case TP_ETIMEDOUT:
        return TPSIM_OUT_TIMEOUT;
    case TP_EPEERDOWN:
        return TPSIM_OUT_PEERDOWN;
    case TP_EIO:
        return TPSIM_OUT_EIO;
    case TP_EREMOTE:
    case TP_EUNKNOWNFUNC:
        return TPSIM_OUT_REMOTE;
    default:
        return TPSIM_OUT_OTHER;
    }
}

void tpsim_world_fail(tpsim_world *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tpsim_world_vfail(w, fmt, ap);
    va_end(ap);
}

void tpsim_world_vfail(tpsim_world *w, const char *fmt, va_list ap) {
    char text[TPSIM_FAIL_TEXT_MAX];
    vsnprintf(text, sizeof text, fmt, ap);
    if (tp_sim_current())
        tp_sim_trace_note("FAIL %s", text);
    if (w->failed++ == 0)
        snprintf(w->first, sizeof w->first, "t=%.3f ms: %s",
                 tp_sim_current() ? (double)tp_sim_now_ns(tp_sim_current()) / 1e6 : 0.0, text);
}

int tpsim_self_dead(void) {
    return tp_sim_host_dead(tp_sim_current(), (uint32_t)tp_sim_current_host());
}

/* ---- The functions ---------------------------------------------------------------- */

/* echo(bytes) -> the same bytes */
static tp_status fn_echo(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)call, (void)kwargs, (void)ud;
    *result = tp_value_clone(tp_list_get(args, 0));
    return *result ? TP_OK : TP_ENOMEM;
}

/*
 * relay(dest, a, b, delay_us, timeout_us) -> slow_add(a, b, delay_us) called on
 * worker dest with that finite timeout. A nested call that could wait forever
 * would let two full pools wait for each other for good: a deadlock of the
 * workload (PyTorch's pools have it too), not one the oracle should report.
 */
static tp_status fn_relay(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *ud) {
    (void)kwargs, (void)ud;
    int64_t v[5];
    for (size_t i = 0; i < 5; i++)
        if (tp_value_get_int(tp_list_get(args, i), &v[i]) != TP_OK) {
            tp_call_set_error(call, "relay: argument %zu is not an int", i);
            return TP_EINVAL;
        }
    tp_value *fargs =
        tp_value_list_of(3, tp_value_int(v[1]), tp_value_int(v[2]), tp_value_int(v[3]));
    tp_status st = fargs ? tp_rpc_sync(tp_to_rank((int)v[0]), "slow_add", fargs, NULL,
                                       (double)v[4] / 1e6, result)
                         : TP_ENOMEM;
    if (st != TP_OK)
        tp_call_set_error(call, "relay to rank %lld: %s", (long long)v[0], tp_errmsg());
    tp_value_free(fargs);
    return st;
}

/* rref_get(rref, timeout_us) -> the rref's value, fetched here with to_here.
 * A fetch the owner cannot answer because it no longer knows the rref is the
 * protocol's failure, not the network's: reported as such (TP_EPROTO). */
static tp_status fn_rref_get(tp_call *call, const tp_value *args, const tp_value *kwargs,
                             tp_value **result, void *ud) {
    (void)kwargs, (void)ud;
    tp_rref *rref = NULL;
    int64_t timeout_us = 0;
    if (tp_value_get_rref(tp_list_get(args, 0), &rref) != TP_OK ||
        tp_value_get_int(tp_list_get(args, 1), &timeout_us) != TP_OK) {
        tp_call_set_error(call, "rref_get: expected (rref, timeout_us)");
        return TP_EINVAL;
    }
    tp_status st = tp_rref_to_here(rref, (double)timeout_us / 1e6, result);
    if (st != TP_OK)
        tp_call_set_error(call, "rref_get: to_here: %s: %s", tp_status_name(st), tp_errmsg());
    return st;
}

/* fail() -> always an error */
static tp_status fn_fail(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)args, (void)kwargs, (void)result, (void)ud;
    tp_call_set_error(call, "fail: as asked");
    return TP_ECANCELED;
}

tp_status tpsim_ops_register(void) {
    tp_status st = tpsim_register_functions();
    if (st == TP_OK)
        st = tp_register_function("echo", fn_echo, NULL);
    if (st == TP_OK)
        st = tp_register_function("fail", fn_fail, NULL);
    if (st == TP_OK)
        st = tp_register_function("relay", fn_relay, NULL);
    if (st == TP_OK)
        st = tp_register_function("rref_get", fn_rref_get, NULL);
    if (st == TP_OK)
        st = tpsim_callbacks_register();
    return st;
}

tp_status tpsim_worker_start(int rank, int world, double rpc_timeout_s, int pool, uint64_t window) {
    tp_status st = tpsim_ops_register();
    return st == TP_OK ? tpsim_worker_init(rank, world, rpc_timeout_s, pool, window) : st;
}

tp_status tpsim_worker_init(int rank, int world, double rpc_timeout_s, int pool, uint64_t window) {
    char name[16];
    snprintf(name, sizeof name, "w%d", rank);
    tp_options *o = tp_options_new();
    tp_status st = o ? TP_OK : TP_ENOMEM;
    if (st == TP_OK) {
        (void)tp_options_set_rpc_timeout(o, rpc_timeout_s);
        (void)tp_options_set_shutdown_timeout(o, 60.0);
        (void)tp_options_set_init_timeout(o, 60.0);
        if (pool)
            (void)tp_options_set_num_worker_threads(o, pool);
        if (window)
            (void)tp_options_set_max_inflight_bytes(o, window);
        /* A restarted host is a restarted process: it rejoins (REJOIN-1). */
        if (tp_sim_incarnation() > 0)
            (void)tp_options_set_rejoin(o, 1);
        st = tp_init_rpc(name, "SIM", rank, world, o);
    }
    tp_options_free(o);
    return st;
}

tp_status tpsim_worker_shutdown(tpsim_world *w, int rank, int world) {
    /* A killed host's program runs on to its end, but a killed process
     * would not: no graceful shutdown (its leak report would list what the
     * kill left behind); the simulator's teardown frees the worker. */
    if (tpsim_self_dead())
        return TP_ESHUTDOWN;
    tp_status st = tp_shutdown(1);
    if (tpsim_self_dead())
        return TP_ESHUTDOWN;
    int any_dead = 0;
    for (int q = 0; q < world; q++)
        any_dead |= tp_sim_rank_dead(w->sim, (uint32_t)q); /* a restarted rank is back */
    tp_status want = any_dead ? TP_EPEERDOWN : TP_OK;
    if (st != want)
        tpsim_world_fail(w, "w%d: graceful shutdown: %s (expected %s): %s", rank,
                         tp_status_name(st), tp_status_name(want), tp_errmsg());
    return st;
}

/* ---- Issuing and checking ------------------------------------------------------------ */

tp_value *tpsim_payload(uint64_t tag, size_t len) {
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return NULL;
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)((tag * 131u + i * 7u) >> 1);
    tp_value *v = tp_value_bytes(buf, len);
    free(buf);
    return v;
}

/* A fault that loses frames with a connection and no dead peer fired in this
 * world (RREF-12: such lost protocol messages are not sent again yet). */
static int loss_fired(const tpsim_world *w) {
    static const tp_sim_fault_kind loss[] = {TP_SIM_FAULT_BREAK, TP_SIM_FAULT_PARTITION,
                                             TP_SIM_FAULT_STALL_BREAK, TP_SIM_FAULT_DROP,
                                             TP_SIM_FAULT_FAILSEND, TP_SIM_FAULT_CHAOS_DROP};
    for (size_t i = 0; i < sizeof loss / sizeof loss[0]; i++)
        if (tp_sim_fault_count(w->sim, loss[i]))
            return 1;
    return 0;
}

void tpsim_check_outcome(tpsim_world *w, int me, const tpsim_pending *p, tp_status st,
                         const tp_value *value, const char *err) {
    w->ops[p->op][tpsim_outcome_of(st)]++;
    if (w->line_outs && p->line > 0)
        w->line_outs[p->line][tpsim_outcome_of(st)]++;
    int dead = tpsim_self_dead() || tp_sim_host_dead(w->sim, (uint32_t)p->dst) ||
               tp_sim_rank_dead(w->sim, (uint32_t)p->dst);
    int transport =
        st == TP_ETIMEDOUT || st == TP_EPEERDOWN || st == TP_EIO || (st == TP_ESHUTDOWN && dead);
    int ok = transport;
    /* A remote's to_here can reach the owner after the network lost its
     * REMOTE without a broken connection (chaos mode): the owner never heard
     * of it, and user calls are never sent again (RREF-15). */
    if (p->op == TPSIM_OP_REMOTE && st == TP_EPROTO && strstr(err, "unknown on its owner") &&
        tp_sim_fault_count(w->sim, TP_SIM_FAULT_CHAOS_DROP))
        ok = 1;
    switch (p->op) {
    case TPSIM_OP_FAIL:
        ok = ok || st == TP_EREMOTE;
        break;
    case TPSIM_OP_UNKNOWN:
        ok = ok || st == TP_EUNKNOWNFUNC;
        break;
    case TPSIM_OP_SHARE:
    case TPSIM_OP_METHOD: /* a method call reaches the owner through the rref too */
        /* A shared rref's owner never forgets it early (RREF-5): "unknown on
         * its owner" only when the REMOTE that made it was lost with a
         * connection or by chaos loss (a user call, never sent again:
         * RREF-12, RREF-15), which the swarm
         * found at seed 81736: the REMOTE stalled in a partition and was lost
         * at the stall break, and the request carrying the rref went on the
         * next connection. */
        if ((st == TP_EPROTO || (st == TP_EREMOTE && strstr(err, "TP_EPROTO"))) &&
            strstr(err, "unknown on its owner") && loss_fired(w)) {
            ok = 1;
            break;
        }
        /* fallthrough */
    case TPSIM_OP_SLOW:
    case TPSIM_OP_FORWARD:
    case TPSIM_OP_LATER:
        /* The function's own wait or nested call can fail the same ways. */
        ok = ok || (st == TP_EREMOTE && (p->op != TPSIM_OP_SHARE || !strstr(err, "TP_EPROTO")));
        /* fallthrough */
    default:
        if (st == TP_OK) {
            if (p->op == TPSIM_OP_ECHO || p->op == TPSIM_OP_LIVENESS) {
                tp_value *want = tpsim_payload((uint64_t)p->expect, p->len);
                ok = want && tp_value_equal(want, value);
                tp_value_free(want);
            } else {
                int64_t got = 0;
                ok = tp_value_get_int(value, &got) == TP_OK && got == p->expect;
            }
            if (!ok) {
                tpsim_world_fail(w, "w%d: %s to w%d answered TP_OK with a wrong value", me,
                                 tpsim_op_names[p->op], p->dst);
                return;
            }
        }
    }
    if (p->must_succeed && st != TP_OK) {
        tpsim_world_fail(w, "w%d: %s to w%d ended %s, and this call must succeed: %s", me,
                         tpsim_op_names[p->op], p->dst, tp_status_name(st), err);
        return;
    }
    if (!ok)
        tpsim_world_fail(w, "w%d: %s to w%d ended %s, which it may not: %s", me,
                         tpsim_op_names[p->op], p->dst, tp_status_name(st), err);
}

static tp_value *ints(int n, const int64_t *v) {
    tp_value *l = tp_value_list();
    for (int i = 0; l && i < n; i++)
        if (tp_list_append(l, tp_value_int(v[i])) != TP_OK) {
            tp_value_free(l);
            l = NULL;
        }
    return l;
}

void tpsim_op_start(tpsim_world *w, int me, const tpsim_op_spec *s, tpsim_pending *p) {
    if (s->op >= TPSIM_OP_THEN && s->op <= TPSIM_OP_METHOD) {
        tpsim_cb_op_start(w, me, s, p);
        return;
    }
    memset(p, 0, sizeof *p);
    p->op = s->op;
    p->dst = s->dst;
    p->expect = s->a + s->b;
    p->must_succeed = s->must_succeed;
    p->line = s->line;
    tp_value *args = NULL;
    const char *fn = "add";
    switch (s->op) {
    case TPSIM_OP_SLOW:
    case TPSIM_OP_FORGET: {
        int64_t v[3] = {s->a, s->b, s->delay_us};
        args = ints(3, v);
        fn = "slow_add";
        break;
    }
    case TPSIM_OP_FORWARD: {
        int64_t v[5] = {s->relay_to, s->a, s->b, s->delay_us, (int64_t)(s->relay_timeout_s * 1e6)};
        args = ints(5, v);
        fn = "relay";
        break;
    }
    case TPSIM_OP_ECHO:
    case TPSIM_OP_LIVENESS:
        p->expect = (int64_t)s->tag;
        p->len = s->len;
        args = tp_value_list_of(1, tpsim_payload(s->tag, s->len));
        fn = "echo";
        break;
    case TPSIM_OP_FAIL:
        args = tp_value_list();
        fn = "fail";
        break;
    case TPSIM_OP_UNKNOWN:
        args = tp_value_list();
        fn = "no_such_function";
        break;
    default: {
        int64_t v[2] = {s->a, s->b};
        args = ints(2, v);
        break;
    }
    }
    if (!args) {
        tpsim_world_fail(w, "w%d: out of memory building arguments", me);
        return;
    }
    tp_status st;
    if (s->op == TPSIM_OP_SYNC_ADD || s->op == TPSIM_OP_FAIL || s->op == TPSIM_OP_UNKNOWN ||
        (s->sync && s->op != TPSIM_OP_REMOTE && s->op != TPSIM_OP_FORGET &&
         s->op != TPSIM_OP_SHARE)) {
        tp_value *res = NULL;
        st = tp_rpc_sync(tp_to_rank(s->dst), fn, args, NULL, s->timeout_s, &res);
        tpsim_check_outcome(w, me, p, st, res, tp_errmsg());
        tp_value_free(res);
    } else if (s->op == TPSIM_OP_SHARE) {
        /* remote add on dst, then rref_get on relay_to with the rref; our
         * handle goes at once, so only the protocol keeps the value alive. */
        tp_rref *rr = NULL;
        st = tp_remote(tp_to_rank(s->dst), fn, args, NULL, s->timeout_s, &rr);
        tp_value *gargs = NULL;
        if (st == TP_OK) {
            gargs = tp_value_list_of(2, tp_value_rref(rr),
                                     tp_value_int((int64_t)(s->relay_timeout_s * 1e6)));
            st = gargs ? tp_rpc_async(tp_to_rank(s->relay_to), "rref_get", gargs, NULL,
                                      s->timeout_s, &p->f)
                       : TP_ENOMEM;
            tp_rref_release(rr);
        }
        tp_value_free(gargs);
        if (st != TP_OK)
            tpsim_check_outcome(w, me, p, st, NULL, tp_errmsg());
    } else if (s->op == TPSIM_OP_REMOTE) {
        tp_rref *rr = NULL;
        st = tp_remote(tp_to_rank(s->dst), fn, args, NULL, s->timeout_s, &rr);
        if (st == TP_OK) {
            tp_value *res = NULL;
            st = tp_rref_to_here(rr, s->fetch_timeout_s, &res);
            tpsim_check_outcome(w, me, p, st, res, tp_errmsg());
            tp_value_free(res);
            tp_rref_release(rr);
        } else {
            tpsim_check_outcome(w, me, p, st, NULL, tp_errmsg());
        }
    } else {
        st = tp_rpc_async(tp_to_rank(s->dst), fn, args, NULL, s->timeout_s, &p->f);
        if (st != TP_OK)
            tpsim_check_outcome(w, me, p, st, NULL, tp_errmsg());
        if (s->op == TPSIM_OP_FORGET && p->f) {
            tp_future_free(p->f); /* fire and forget: the call goes on (FUTURE-8) */
            p->f = NULL;
            w->ops[TPSIM_OP_FORGET][TPSIM_OUT_OK]++;
            if (w->line_outs && p->line > 0)
                w->line_outs[p->line][TPSIM_OUT_OK]++;
        }
    }
    tp_value_free(args);
}

void tpsim_settle(tpsim_world *w, int me, tpsim_pending *pend, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!pend[i].f)
            continue;
        tp_status st = tp_future_wait(pend[i].f, TPSIM_LIVENESS_WAIT_S);
        tpsim_cb_rec *r = pend[i].rec;
        if (pend[i].op == TPSIM_OP_COLLECT) {
            tpsim_cb_settle_collect(w, me, &pend[i]); /* checks its own end and each call's */
        } else if (st == TP_OK || tp_future_done(pend[i].f)) {
            tpsim_check_outcome(w, me, &pend[i], tp_future_status(pend[i].f),
                                tp_future_value(pend[i].f), tp_future_error(pend[i].f));
            /* Its callback completed it, so it ran, and once (FUTURE-5, 10). */
            if (r && r->then_runs != 1 &&
                !(tp_future_status(pend[i].f) == TP_ESHUTDOWN && tpsim_self_dead()))
                tpsim_world_fail(w, "w%d: %s to w%d ended %s, and its callback ran %u times", me,
                                 tpsim_op_names[pend[i].op], pend[i].dst,
                                 tp_status_name(tp_future_status(pend[i].f)), r->then_runs);
        } else if (!tpsim_self_dead()) {
            tpsim_world_fail(
                w, "w%d: liveness: %s to w%d has not ended %.0f s after the chaos (%s)", me,
                tpsim_op_names[pend[i].op], pend[i].dst, TPSIM_LIVENESS_WAIT_S, tp_status_name(st));
        }
        if (r && r->user == pend[i].f)
            r->user = NULL; /* its done-callback must not complete a freed future */
        tp_future_free(pend[i].f);
        pend[i].f = NULL;
    }
}

void tpsim_rrefs_settle(tpsim_world *w, int me) {
    uint64_t start = tp_sim_now_ns(w->sim);
    tp_debug_info d;
    while (!tpsim_self_dead() && tp_get_debug_info(&d) == TP_OK) {
        if (d.owned_values == 0 && d.owner_forks == 0 && d.user_rrefs == 0 &&
            d.pending_children == 0 && d.pending_protocol == 0) {
            uint64_t took = tp_sim_now_ns(w->sim) - start;
            int b = 0;
            for (uint64_t lim = 10000000; b + 1 < TPSIM_SETTLE_BUCKETS && took >= lim; lim *= 10)
                b++;
            w->settle_hist[b]++;
            return;
        }
        if ((double)(tp_sim_now_ns(w->sim) - start) / 1e9 >= TPSIM_RREF_SETTLE_S) {
            tpsim_world_fail(w,
                             "w%d: %.0f s after the heal its rrefs have not settled: "
                             "owned_values=%llu owner_forks=%llu user_rrefs=%llu "
                             "pending_children=%llu pending_protocol=%llu",
                             me, TPSIM_RREF_SETTLE_S, (unsigned long long)d.owned_values,
                             (unsigned long long)d.owner_forks, (unsigned long long)d.user_rrefs,
                             (unsigned long long)d.pending_children,
                             (unsigned long long)d.pending_protocol);
            return;
        }
        (void)tp_sleep(0.01);
    }
}

void tpsim_liveness(tpsim_world *w, int me, int world) {
    /* The barrier: every live worker's calls have ended, so no pool is still
     * busy with the chaos phase's work. A harness-level barrier (the hosts
     * share this process), polled on virtual time. */
    if (!tpsim_self_dead())
        w->settled++; /* a killed incarnation does not count; its restart will */
    for (uint64_t spins = 0; !tpsim_self_dead(); spins++) {
        uint32_t dead = 0;
        for (int q = 0; q < world; q++)
            dead += (uint32_t)tp_sim_rank_dead(w->sim, (uint32_t)q);
        if (w->settled + dead >= (uint32_t)world)
            break;
        if ((double)spins * 1e-3 > TPSIM_LIVENESS_WAIT_S) {
            tpsim_world_fail(w, "w%d: liveness barrier: %u of %d workers settled after %.0f s", me,
                             w->settled, world, TPSIM_LIVENESS_WAIT_S);
            break;
        }
        (void)tp_sleep(1e-3);
    }
    /* Every two live workers can call each other; a timeout is retried while
     * pools still finish relayed work, and a lost connection once frames
     * delayed past the heal have landed, within TPSIM_LIVENESS_BOUND_S. */
    for (int q = 0; q < world && !tpsim_self_dead(); q++) {
        if (q == me || tp_sim_rank_dead(w->sim, (uint32_t)q))
            continue;
        tpsim_op_spec s = {.op = TPSIM_OP_LIVENESS,
                           .dst = q,
                           .timeout_s = TPSIM_LIVENESS_CALL_S,
                           .tag = 7,
                           .len = 16,
                           .sync = 1,
                           .must_succeed = 1};
        uint64_t until = tp_sim_now_ns(w->sim) + (uint64_t)(TPSIM_LIVENESS_BOUND_S * 1e9);
        for (;;) {
            /* The library's own ping when the world registered no echo
             * (experiments, SIM-15): it answers nil. */
            tp_value *args = w->ping_liveness ? NULL : tp_value_list_of(1, tpsim_payload(s.tag, s.len));
            tp_value *res = NULL;
            tp_status st = tp_rpc_sync(tp_to_rank(q), w->ping_liveness ? "tp:ping" : "echo", args,
                                       NULL, s.timeout_s, &res);
            tp_value_free(args);
            if (st == TP_ETIMEDOUT && tp_sim_now_ns(w->sim) < until) {
                w->ops[TPSIM_OP_LIVENESS][TPSIM_OUT_TIMEOUT]++;
                continue;
            }
            /* A frame delayed past the heal (a delay fault's) can still take its
             * lost connection down after it: a caller retries on a new one. */
            if (st == TP_EIO && tp_sim_now_ns(w->sim) < until) {
                w->ops[TPSIM_OP_LIVENESS][TPSIM_OUT_EIO]++;
                (void)tp_sleep(0.01);
                continue;
            }
            tpsim_pending p = {
                .op = TPSIM_OP_LIVENESS, .dst = q, .expect = 7, .len = 16, .must_succeed = 1};
            if (w->ping_liveness && st == TP_OK && tp_value_kind(res) != TP_KIND_NIL)
                tpsim_world_fail(w, "w%d: liveness ping to w%d answered a value, not nil", me, q);
            else if (w->ping_liveness && st == TP_OK)
                w->ops[TPSIM_OP_LIVENESS][TPSIM_OUT_OK]++;
            else
                tpsim_check_outcome(w, me, &p, st, res, tp_errmsg());
            tp_value_free(res);
            break;
        }
    }
}

int tpsim_trace_is_json(const char *path) {
    size_t n = path ? strlen(path) : 0;
    return n >= 5 && strcmp(path + n - 5, ".json") == 0;
}

uint64_t tpsim_now_ns(void) {
    tp_sim *sim = tp_sim_current();
    return sim ? tp_sim_now_ns(sim) : 0;
}
