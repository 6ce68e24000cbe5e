/*
 * tpsim_functions.c: the functions every tpsim worker serves.
 *
 * Each checks its arguments like a careful user function would (a bad
 * argument is an error result, never a crash) and computes something the
 * caller can predict, so the scenarios can check every result.
 */
#include <stdlib.h>

#include "tools/tpsim.h"

tpsim_shared tpsim_state;

static tp_status arg_int(tp_call *call, const tp_value *args, size_t i, int64_t *out) {
    const tp_value *v = tp_list_get(args, i);
    if (!v || tp_value_get_int(v, out) != TP_OK) {
        tp_call_set_error(call, "%s: argument %zu must be an int", tp_call_function(call), i);
        return TP_EINVAL;
    }
    return TP_OK;
}

static tp_status arg_rref(tp_call *call, const tp_value *args, size_t i, tp_rref **out) {
    const tp_value *v = tp_list_get(args, i);
    if (!v || tp_value_get_rref(v, out) != TP_OK) {
        tp_call_set_error(call, "%s: argument %zu must be an rref", tp_call_function(call), i);
        return TP_EINVAL;
    }
    return TP_OK;
}

static tp_status set_int(tp_call *call, tp_value **result, int64_t v) {
    *result = tp_value_int(v);
    if (!*result) {
        tp_call_set_error(call, "%s: out of memory", tp_call_function(call));
        return TP_ENOMEM;
    }
    return TP_OK;
}

/* Sleeps on virtual time; a failed sleep (the host is dying) is reported. */
static tp_status sleep_us(tp_call *call, int64_t us) {
    if (us <= 0)
        return TP_OK;
    tp_status st = tp_sleep((double)us / 1e6);
    if (st != TP_OK)
        tp_call_set_error(call, "%s: sleep: %s", tp_call_function(call), tp_errmsg());
    return st;
}

/* add(a, b) -> a + b */
static tp_status fn_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t a, b;
    if (arg_int(call, args, 0, &a) != TP_OK || arg_int(call, args, 1, &b) != TP_OK)
        return TP_EINVAL;
    return set_int(call, result, a + b);
}

/* slow_add(a, b, delay_us) -> a + b after delay_us of virtual time. */
static tp_status fn_slow_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                             tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t a, b, delay_us;
    if (arg_int(call, args, 0, &a) != TP_OK || arg_int(call, args, 1, &b) != TP_OK ||
        arg_int(call, args, 2, &delay_us) != TP_OK)
        return TP_EINVAL;
    tpsim_state.handlers_begun++;
    tp_status st = sleep_us(call, delay_us);
    tpsim_state.handlers_ended++;
    return st == TP_OK ? set_int(call, result, a + b) : st;
}

/* forward(dest, a, b, delay_us) -> slow_add(a, b, delay_us) called on worker dest. */
static tp_status fn_forward(tp_call *call, const tp_value *args, const tp_value *kwargs,
                            tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t dest, a, b, delay_us;
    if (arg_int(call, args, 0, &dest) != TP_OK || arg_int(call, args, 1, &a) != TP_OK ||
        arg_int(call, args, 2, &b) != TP_OK || arg_int(call, args, 3, &delay_us) != TP_OK)
        return TP_EINVAL;
    tpsim_state.handlers_begun++;
    tp_value *fargs = tp_value_list_of(3, tp_value_int(a), tp_value_int(b), tp_value_int(delay_us));
    tp_status st = fargs ? tp_rpc_sync(tp_to_rank((int)dest), "slow_add", fargs, NULL,
                                       TP_TIMEOUT_DEFAULT, result)
                         : TP_ENOMEM;
    if (st != TP_OK)
        tp_call_set_error(call, "forward to rank %lld: %s", (long long)dest, tp_errmsg());
    tp_value_free(fargs);
    tpsim_state.handlers_ended++;
    return st;
}

/*
 * nested(rest...) on worker d: with rest empty, (d+1)*1000. Otherwise it
 * adds (d + x) for every x in rest, fetched with async add calls to x, and
 * nested(rest[1:]) called synchronously on rest[0], to (d+1)*1000.
 * tpsim_nested_expect computes the same without calls.
 */
static tp_status fn_nested(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t d = tp_sim_current_host();
    size_t n = tp_list_len(args);
    int64_t total = (d + 1) * 1000;
    if (n == 0)
        return set_int(call, result, total);

    int64_t *hops = calloc(n, sizeof *hops);
    tp_future **futs = calloc(n, sizeof *futs);
    tp_value *rest = tp_value_list();
    tp_status st = hops && futs && rest ? TP_OK : TP_ENOMEM;
    for (size_t i = 0; st == TP_OK && i < n; i++) {
        st = arg_int(call, args, i, &hops[i]);
        if (st == TP_OK && i > 0)
            st = tp_list_append(rest, tp_value_int(hops[i]));
    }
    /* The async adds go out first so they overlap the synchronous chain. */
    for (size_t i = 0; st == TP_OK && i < n; i++) {
        tp_value *aargs = tp_value_list_of(2, tp_value_int(d), tp_value_int(hops[i]));
        st = aargs ? tp_rpc_async(tp_to_rank((int)hops[i]), "add", aargs, NULL, TP_TIMEOUT_DEFAULT,
                                  &futs[i])
                   : TP_ENOMEM;
        tp_value_free(aargs);
        if (st != TP_OK)
            tp_call_set_error(call, "nested on rank %lld: add to rank %lld: %s", (long long)d,
                              (long long)hops[i], tp_errmsg());
    }
    tp_value *sub = NULL;
    if (st == TP_OK) {
        st = tp_rpc_sync(tp_to_rank((int)hops[0]), "nested", rest, NULL, TP_TIMEOUT_DEFAULT, &sub);
        int64_t v = 0;
        if (st == TP_OK && tp_value_get_int(sub, &v) == TP_OK)
            total += v;
        else if (st == TP_OK)
            st = TP_ETYPE;
        if (st != TP_OK)
            tp_call_set_error(call, "nested on rank %lld: nested on rank %lld: %s", (long long)d,
                              (long long)hops[0], tp_errmsg());
    }
    for (size_t i = 0; futs && i < n; i++) {
        if (!futs[i])
            continue;
        tp_status fst = tp_future_wait(futs[i], TP_TIMEOUT_INFINITE);
        int64_t v = 0;
        if (fst == TP_OK && tp_value_get_int(tp_future_value(futs[i]), &v) == TP_OK)
            total += v;
        else if (st == TP_OK) {
            st = fst == TP_OK ? TP_ETYPE : fst;
            tp_call_set_error(call, "nested on rank %lld: add on rank %lld: %s", (long long)d,
                              (long long)hops[i], tp_future_error(futs[i]));
        }
        tp_future_free(futs[i]);
    }
    tp_value_free(sub);
    tp_value_free(rest);
    free(futs);
    free(hops);
    return st == TP_OK ? set_int(call, result, total) : st;
}

/* make_range(n) -> [0, 1, ..., n-1] */
static tp_status fn_make_range(tp_call *call, const tp_value *args, const tp_value *kwargs,
                               tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t n;
    if (arg_int(call, args, 0, &n) != TP_OK)
        return TP_EINVAL;
    if (n < 0 || n > 1000000) {
        tp_call_set_error(call, "make_range: n %lld out of [0, 1000000]", (long long)n);
        return TP_EINVAL;
    }
    tp_value *list = tp_value_list();
    for (int64_t i = 0; list && i < n; i++) {
        if (tp_list_append(list, tp_value_int(i)) != TP_OK) {
            tp_value_free(list);
            list = NULL;
        }
    }
    if (!list) {
        tp_call_set_error(call, "make_range: out of memory");
        return TP_ENOMEM;
    }
    *result = list;
    return TP_OK;
}

/* rref_sum(rref) -> the sum of the int list the rref holds, fetched with to_here. */
static tp_status fn_rref_sum(tp_call *call, const tp_value *args, const tp_value *kwargs,
                             tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    tp_rref *rref;
    if (arg_rref(call, args, 0, &rref) != TP_OK)
        return TP_EINVAL;
    tp_value *v = NULL;
    tp_status st = tp_rref_to_here(rref, TP_TIMEOUT_DEFAULT, &v);
    if (st != TP_OK) {
        tp_call_set_error(call, "rref_sum: to_here: %s", tp_errmsg());
        return st;
    }
    int64_t sum = 0;
    for (size_t i = 0; st == TP_OK && i < tp_list_len(v); i++) {
        int64_t x;
        st = tp_value_get_int(tp_list_get(v, i), &x);
        sum += x;
    }
    tp_value_free(v);
    if (st != TP_OK) {
        tp_call_set_error(call, "rref_sum: the rref does not hold an int list");
        return st;
    }
    return set_int(call, result, sum);
}

/* ---- Counter objects: observable creation and destruction (remote). ----- */

static void counter_destroy(void *state) {
    tpsim_state.counters_destroyed++;
    free(state);
}

/* make_counter(start) -> a Counter object holding start (kept on the owner). */
static tp_status fn_make_counter(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                 tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t start;
    if (arg_int(call, args, 0, &start) != TP_OK)
        return TP_EINVAL;
    int64_t *state = malloc(sizeof *state);
    tp_value *obj = state ? tp_value_object("Counter", state, counter_destroy) : NULL;
    if (!obj) {
        free(state);
        tp_call_set_error(call, "make_counter: out of memory");
        return TP_ENOMEM;
    }
    *state = start;
    tpsim_state.counters_created++;
    *result = obj;
    return TP_OK;
}

/* The Counter a method runs on: tp_call_self (METHOD-1). */
static tp_status counter_state(tp_call *call, int64_t **state) {
    const char *cls = NULL;
    void *p = NULL;
    const tp_value *self = tp_call_self(call);
    if (!self || tp_value_get_object(self, &cls, &p) != TP_OK || !p) {
        tp_call_set_error(call, "%s: not called on a Counter", tp_call_function(call));
        return TP_ETYPE;
    }
    *state = p;
    return TP_OK;
}

/* Counter.add(delta) -> the new count. */
static tp_status fn_counter_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t *state, delta;
    if (counter_state(call, &state) != TP_OK || arg_int(call, args, 0, &delta) != TP_OK)
        return TP_EINVAL;
    *state += delta;
    return set_int(call, result, *state);
}

/* Counter.get() -> the count. */
static tp_status fn_counter_get(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)user_data;
    int64_t *state;
    if (counter_state(call, &state) != TP_OK)
        return TP_EINVAL;
    return set_int(call, result, *state);
}

/* counter_bump(rref, delta) -> Counter.add(delta) called through the rref (a third worker). */
static tp_status fn_counter_bump(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                 tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    tp_rref *rref;
    int64_t delta;
    if (arg_rref(call, args, 0, &rref) != TP_OK || arg_int(call, args, 1, &delta) != TP_OK)
        return TP_EINVAL;
    tp_method *m = NULL;
    tp_value *margs = tp_value_list_of(1, tp_value_int(delta));
    tp_status st = margs ? tp_method_factory("add", &m) : TP_ENOMEM;
    if (st == TP_OK)
        st = tp_method_call_sync(m, rref, margs, NULL, TP_TIMEOUT_DEFAULT, result);
    if (st != TP_OK)
        tp_call_set_error(call, "counter_bump: %s", tp_errmsg());
    tp_method_free(m);
    tp_value_free(margs);
    return st;
}

/*
 * await_destroyed(count, timeout_ms) -> the number of counters destroyed so
 * far, once it reaches count or timeout_ms of virtual time passed.
 */
static tp_status fn_await_destroyed(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                    tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t count, timeout_ms;
    if (arg_int(call, args, 0, &count) != TP_OK || arg_int(call, args, 1, &timeout_ms) != TP_OK)
        return TP_EINVAL;
    if (timeout_ms < 0 || timeout_ms > 60000) {
        tp_call_set_error(call, "await_destroyed: timeout_ms %lld out of [0, 60000]",
                          (long long)timeout_ms);
        return TP_EINVAL;
    }
    uint64_t deadline = tpsim_now_ns() + (uint64_t)timeout_ms * 1000000u;
    while (tpsim_state.counters_destroyed < (uint64_t)count && tpsim_now_ns() < deadline) {
        tp_status st = sleep_us(call, 100);
        if (st != TP_OK)
            return st;
    }
    return set_int(call, result, (int64_t)tpsim_state.counters_destroyed);
}

/* ---- worker_death ------------------------------------------------------- */

/*
 * victim_slow(seconds, counted) -> nil after sleeping; the victim dies before
 * it returns. counted != 0 counts the arrival for crash_self.
 */
static tp_status fn_victim_slow(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data, (void)result;
    int64_t seconds, counted;
    if (arg_int(call, args, 0, &seconds) != TP_OK || arg_int(call, args, 1, &counted) != TP_OK)
        return TP_EINVAL;
    if (seconds < 0 || seconds > 3600) {
        tp_call_set_error(call, "victim_slow: seconds %lld out of [0, 3600]", (long long)seconds);
        return TP_EINVAL;
    }
    if (counted)
        tpsim_state.victim_arrivals++;
    return sleep_us(call, seconds * 1000000);
}

/*
 * crash_self() waits (bounded) until every victim_slow call the scenario
 * expects has arrived, so all of them are in flight, then kills this host.
 */
static tp_status fn_crash_self(tp_call *call, const tp_value *args, const tp_value *kwargs,
                               tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)user_data, (void)result;
    uint64_t deadline = tpsim_now_ns() + 1000000000u;
    while (tpsim_state.victim_arrivals < tpsim_state.victim_arrivals_expected &&
           tpsim_now_ns() < deadline) {
        if (sleep_us(call, 100) != TP_OK)
            return TP_ESHUTDOWN;
    }
    tp_sim_trace_note("tpsim: w%d crashes itself with %u calls in flight", tp_sim_current_host(),
                      (unsigned)tpsim_state.victim_arrivals);
    tpsim_state.crash_ns = tpsim_now_ns();
    tp_sim_crash_self();
    tp_call_set_error(call, "crash_self: this worker was killed");
    return TP_ECANCELED;
}

typedef struct fn_entry {
    const char *name;
    tp_fn fn;
} fn_entry;

static const fn_entry functions[] = {
    {"add", fn_add},
    {"slow_add", fn_slow_add},
    {"forward", fn_forward},
    {"nested", fn_nested},
    {"make_range", fn_make_range},
    {"rref_sum", fn_rref_sum},
    {"make_counter", fn_make_counter},
    {"counter_bump", fn_counter_bump},
    {"await_destroyed", fn_await_destroyed},
    {"victim_slow", fn_victim_slow},
    {"crash_self", fn_crash_self},
};

tp_status tpsim_register_functions(void) {
    for (size_t i = 0; i < sizeof functions / sizeof functions[0]; i++) {
        tp_status st = tp_register_function(functions[i].name, functions[i].fn, NULL);
        if (st != TP_OK)
            return st;
    }
    tp_status st = tp_new_method("Counter", "add", fn_counter_add, NULL);
    if (st == TP_OK)
        st = tp_new_method("Counter", "get", fn_counter_get, NULL);
    return st;
}
