/*
 * conf_functions_async.c: suite functions that answer later (FUNC-7) with
 * futures the program completes (FUTURE-9), and a batch-updating parameter
 * server built from them (PyTorch's tutorial pattern: every trainer's
 * gradient arrives in its own call, the calls wait on one shared future,
 * and the last gradient of a round completes it for all).
 *
 * State is per worker (indexed by rank) behind one mutex. The mutex is
 * never held across an API call that takes the worker's lock: on the
 * simulator every worker's task runs on one thread, and a task switch
 * with the mutex held would deadlock the next one to take it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

#define HELD_MAX 16 /* later_hold calls answered by one later_release */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static struct worker_state {
    tp_future *held[HELD_MAX]; /* later_hold's answers, each referenced */
    int nheld;
    int64_t weights[CONF_PS_DIM];
    int64_t grad_sum[CONF_PS_DIM];
    int arrived;      /* gradients in the current round */
    tp_future *round; /* the current round's answer, shared by its trainers */
} state[TP_CONFORMANCE_RANKS_MAX];

void conf_async_reset(void) {
    for (int r = 0; r < TP_CONFORMANCE_RANKS_MAX; r++) {
        struct worker_state *w = &state[r];
        for (int i = 0; i < w->nheld; i++)
            tp_future_free(w->held[i]);
        tp_future_free(w->round);
        memset(w, 0, sizeof *w);
        for (int i = 0; i < CONF_PS_DIM; i++)
            w->weights[i] = 100 * (i + 1);
    }
}

static int me_of(tp_call *call) {
    tp_worker_info me;
    if (tp_get_worker_info(NULL, &me) != TP_OK || me.id >= TP_CONFORMANCE_RANKS_MAX) {
        tp_call_set_error(call, "%s: get_worker_info(NULL) failed: %s", tp_call_function(call),
                          tp_errmsg());
        return -1;
    }
    return (int)me.id;
}

static int arg_int(tp_call *call, const tp_value *args, size_t i, int64_t *out) {
    if (tp_value_get_int(tp_list_get(args, i), out) != TP_OK) {
        tp_call_set_error(call, "%s: argument %zu must be an int", tp_call_function(call), i);
        return 0;
    }
    return 1;
}

/* later_chain(to, a, b): answers with add(a, b) called on worker `to`, without
 * waiting for it: the answer is that call's future. */
static tp_status fn_later_chain(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *ud) {
    (void)kwargs, (void)result, (void)ud;
    int64_t to, a, b;
    if (!arg_int(call, args, 0, &to) || !arg_int(call, args, 1, &a) || !arg_int(call, args, 2, &b))
        return TP_EINVAL;
    tp_value *two = tp_value_list_of(2, tp_value_int(a), tp_value_int(b));
    tp_future *f = NULL;
    tp_status st = tp_rpc_async(tp_to_rank((int)to), "add", two, NULL, TP_TIMEOUT_DEFAULT, &f);
    tp_value_free(two);
    if (st == TP_OK)
        st = tp_call_answer_later(call, f);
    tp_future_free(f);
    if (st != TP_OK)
        tp_call_set_error(call, "later_chain: %s", tp_errmsg());
    return st;
}

/* later_hold(): answers with a future that later_release completes. */
static tp_status fn_later_hold(tp_call *call, const tp_value *args, const tp_value *kwargs,
                               tp_value **result, void *ud) {
    (void)args, (void)kwargs, (void)result, (void)ud;
    int me = me_of(call);
    if (me < 0)
        return TP_EINVAL;
    tp_future *f = NULL;
    tp_status st = tp_future_new(&f);
    if (st != TP_OK) {
        tp_call_set_error(call, "later_hold: %s", tp_errmsg());
        return st;
    }
    st = tp_call_answer_later(call, f); /* before it is listed: nothing completes it yet */
    if (st != TP_OK) {
        tp_call_set_error(call, "later_hold: %s", tp_errmsg());
        tp_future_set_result(f, NULL);
        tp_future_free(f);
        return st;
    }
    pthread_mutex_lock(&mu);
    int full = state[me].nheld == HELD_MAX;
    if (!full)
        state[me].held[state[me].nheld++] = f;
    pthread_mutex_unlock(&mu);
    if (full) { /* answers at once, with the error */
        tp_future_set_error(f, TP_ELIMIT, "later_hold: more than HELD_MAX calls held");
        tp_future_free(f);
    }
    return TP_OK;
}

/* later_release(value, as_error): completes every held answer with value,
 * or with an error when as_error is not 0; returns how many. */
static tp_status fn_later_release(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                  tp_value **result, void *ud) {
    (void)kwargs, (void)ud;
    int me = me_of(call);
    int64_t as_error;
    const tp_value *v = tp_list_get(args, 0);
    if (me < 0 || !v || !arg_int(call, args, 1, &as_error))
        return TP_EINVAL;
    tp_future *held[HELD_MAX];
    pthread_mutex_lock(&mu);
    int n = state[me].nheld;
    memcpy(held, state[me].held, sizeof held);
    state[me].nheld = 0;
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < n; i++) {
        if (as_error)
            tp_future_set_error(held[i], TP_ETYPE, "later_release: released with an error");
        else
            tp_future_set_result(held[i], tp_value_clone(v));
        tp_future_free(held[i]);
    }
    *result = tp_value_int(n);
    return *result ? TP_OK : TP_ENOMEM;
}

/* later_both(): misuse: answers later and returns a value too (FUNC-7 refuses it). */
static tp_status fn_later_both(tp_call *call, const tp_value *args, const tp_value *kwargs,
                               tp_value **result, void *ud) {
    (void)args, (void)kwargs, (void)ud;
    tp_future *f = NULL;
    if (tp_future_new(&f) != TP_OK)
        return TP_ESHUTDOWN;
    tp_status st = tp_call_answer_later(call, f);
    tp_future_set_result(f, tp_value_int(1));
    tp_future_free(f);
    *result = tp_value_int(2);
    return st;
}

/* later_twice(): a second answer_later is refused; the first answers with
 * the second's status. */
static tp_status fn_later_twice(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *ud) {
    (void)args, (void)kwargs, (void)result, (void)ud;
    tp_future *f = NULL;
    if (tp_future_new(&f) != TP_OK)
        return TP_ESHUTDOWN;
    tp_status st = tp_call_answer_later(call, f);
    tp_status second = tp_call_answer_later(call, f);
    tp_future_set_result(f, tp_value_int(second));
    tp_future_free(f);
    return st;
}

/* ---- The parameter server ----------------------------------------------------------- */

/* ps_update(trainers, grads): adds a trainer's gradient (CONF_PS_DIM ints)
 * to the round; answers, once `trainers` gradients arrived, with the
 * weights after the round's update (w -= sum of the gradients). No pool
 * thread waits: every call of the round answers through one future. */
static tp_status fn_ps_update(tp_call *call, const tp_value *args, const tp_value *kwargs,
                              tp_value **result, void *ud) {
    (void)kwargs, (void)result, (void)ud;
    int me = me_of(call);
    int64_t trainers;
    const tp_value *grads = tp_list_get(args, 1);
    if (me < 0 || !arg_int(call, args, 0, &trainers))
        return TP_EINVAL;
    int64_t g[CONF_PS_DIM];
    if (tp_list_len(grads) != CONF_PS_DIM || trainers < 1) {
        tp_call_set_error(call, "ps_update: wants trainers >= 1 and %d gradients", CONF_PS_DIM);
        return TP_EINVAL;
    }
    for (size_t i = 0; i < CONF_PS_DIM; i++)
        if (tp_value_get_int(tp_list_get(grads, i), &g[i]) != TP_OK) {
            tp_call_set_error(call, "ps_update: gradient %zu is not an int", i);
            return TP_ETYPE;
        }
    tp_future *fresh = NULL; /* made outside the mutex, in case the round needs one */
    if (tp_future_new(&fresh) != TP_OK) {
        tp_call_set_error(call, "ps_update: %s", tp_errmsg());
        return TP_ESHUTDOWN;
    }
    struct worker_state *w = &state[me];
    tp_future *done = NULL; /* the round this gradient completes */
    tp_value *weights = NULL;
    pthread_mutex_lock(&mu);
    if (!w->round) {
        w->round = fresh;
        fresh = NULL;
    }
    tp_status st = tp_call_answer_later(call, w->round); /* takes a reference only */
    if (st == TP_OK) {
        for (int i = 0; i < CONF_PS_DIM; i++)
            w->grad_sum[i] += g[i];
        if (++w->arrived == trainers) {
            weights = tp_value_list();
            for (int i = 0; i < CONF_PS_DIM; i++) {
                w->weights[i] -= w->grad_sum[i];
                w->grad_sum[i] = 0;
                tp_list_append(weights, tp_value_int(w->weights[i]));
            }
            done = w->round;
            w->round = NULL;
            w->arrived = 0;
        }
    }
    pthread_mutex_unlock(&mu);
    if (fresh) { /* unused: complete it so nothing waits for it */
        tp_future_set_result(fresh, NULL);
        tp_future_free(fresh);
    }
    if (done) {
        tp_future_set_result(done, weights);
        tp_future_free(done);
    }
    if (st != TP_OK)
        tp_call_set_error(call, "ps_update: %s", tp_errmsg());
    return st;
}

static const struct {
    const char *name;
    tp_fn fn;
} async_functions[] = {
    {"later_chain", fn_later_chain},     {"later_hold", fn_later_hold},
    {"later_release", fn_later_release}, {"later_both", fn_later_both},
    {"later_twice", fn_later_twice},     {"ps_update", fn_ps_update},
};

tp_status conf_register_async(void) {
    for (size_t i = 0; i < sizeof async_functions / sizeof async_functions[0]; i++) {
        tp_status st = tp_register_function(async_functions[i].name, async_functions[i].fn, NULL);
        if (st != TP_OK && st != TP_EALREADY)
            return st;
    }
    /* FUNC-6 + FUNC-7: a non-blocking function may answer later too. */
    tp_status st = tp_register_function_ex("nb_later_chain", fn_later_chain, NULL,
                                           TP_FN_NONBLOCKING);
    return st == TP_EALREADY ? TP_OK : st;
}
