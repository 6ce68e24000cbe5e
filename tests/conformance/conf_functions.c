/*
 * conf_functions.c: the functions every conformance case registers on every
 * worker before init. They are ordinary user functions (tp_fn): they reach
 * their worker through the public API only, and keep per-worker counters in
 * arrays indexed by rank, because on the simulator every worker shares this
 * process (in a process launcher each process uses its own slot only).
 * Counters are atomic: on a threaded backend functions run concurrently.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

static _Atomic int64_t hops[TP_CONFORMANCE_RANKS_MAX];
static _Atomic int64_t served[TP_CONFORMANCE_RANKS_MAX];
static _Atomic int64_t started[TP_CONFORMANCE_RANKS_MAX];
static _Atomic int64_t live_objects[TP_CONFORMANCE_RANKS_MAX];

/* send_padded's last status and message (one worker runs it at a time). */
static _Atomic tp_status send_padded_st = TP_EINVAL;
static char send_padded_msg[TP_ERRMSG_LEN_MAX];

void conf_functions_reset(void) {
    for (int i = 0; i < TP_CONFORMANCE_RANKS_MAX; i++) {
        atomic_store(&hops[i], 0);
        atomic_store(&served[i], 0);
        atomic_store(&started[i], 0);
        atomic_store(&live_objects[i], 0);
    }
    conf_async_reset();
    atomic_store(&send_padded_st, TP_EINVAL);
    send_padded_msg[0] = '\0';
}

static int64_t counter_read(_Atomic int64_t *a, int rank) {
    return rank >= 0 && rank < TP_CONFORMANCE_RANKS_MAX ? atomic_load(&a[rank]) : -1;
}

int64_t conf_hops(int rank) {
    return counter_read(hops, rank);
}
int64_t conf_served(int rank) {
    return counter_read(served, rank);
}
int64_t conf_started(int rank) {
    return counter_read(started, rank);
}
int64_t conf_live_objects(int rank) {
    return counter_read(live_objects, rank);
}

/* This worker's rank, clamped to the counter arrays; -1 (with an error set
 * on call) when the worker cannot tell. */
static int self_rank(tp_call *call) {
    tp_worker_info me;
    tp_status st = tp_get_worker_info(NULL, &me);
    if (st != TP_OK || me.id >= TP_CONFORMANCE_RANKS_MAX) {
        tp_call_set_error(call, "get_worker_info(NULL) failed: %s", tp_errmsg());
        return -1;
    }
    return (int)me.id;
}

/* Reads args[i] as an int, or fails the call naming the argument. */
static int arg_int(tp_call *call, const tp_value *args, size_t i, int64_t *out) {
    const tp_value *v = tp_list_get(args, i);
    if (!v || tp_value_get_int(v, out) != TP_OK) {
        tp_call_set_error(call, "%s: argument %zu must be an int", tp_call_function(call), i);
        return 0;
    }
    return 1;
}

static tp_status nomem(tp_call *call) {
    tp_call_set_error(call, "%s: out of memory", tp_call_function(call));
    return TP_ENOMEM;
}

/* add(a, b): ints add as ints, anything with a float as floats. */
static tp_status fn_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t a, b;
    if (tp_list_len(args) == 2 && tp_value_get_int(tp_list_get(args, 0), &a) == TP_OK &&
        tp_value_get_int(tp_list_get(args, 1), &b) == TP_OK) {
        /* Wraps: any peer may send any ints. */
        *result = tp_value_int((int64_t)((uint64_t)a + (uint64_t)b));
        return *result ? TP_OK : nomem(call);
    }
    double x, y;
    if (tp_list_len(args) == 2 && tp_value_get_float(tp_list_get(args, 0), &x) == TP_OK &&
        tp_value_get_float(tp_list_get(args, 1), &y) == TP_OK) {
        *result = tp_value_float(x + y);
        return *result ? TP_OK : nomem(call);
    }
    tp_call_set_error(call, "add: wants two numbers, got %zu arguments", tp_list_len(args));
    return TP_ETYPE;
}

/* echo(x): x back (nil without arguments). */
static tp_status fn_echo(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    const tp_value *x = tp_list_get(args, 0);
    *result = x ? tp_value_clone(x) : tp_value_nil();
    return *result ? TP_OK : nomem(call);
}

/* echo_kwargs(**kw): the kwargs map back. */
static tp_status fn_echo_kwargs(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *user_data) {
    (void)args, (void)user_data;
    *result = tp_value_clone(kwargs);
    return *result ? TP_OK : nomem(call);
}

/* kw_sub(a=, b=): a - b, to show kwargs travel by name. */
static tp_status fn_kw_sub(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data) {
    (void)args, (void)user_data;
    int64_t a, b;
    if (tp_value_get_int(tp_map_get(kwargs, "a"), &a) != TP_OK ||
        tp_value_get_int(tp_map_get(kwargs, "b"), &b) != TP_OK) {
        tp_call_set_error(call, "kw_sub: wants int kwargs a and b");
        return TP_ETYPE;
    }
    *result = tp_value_int(a - b);
    return *result ? TP_OK : nomem(call);
}

/* arg_counts(*args, **kwargs): [len(args), len(kwargs)]. */
static tp_status fn_arg_counts(tp_call *call, const tp_value *args, const tp_value *kwargs,
                               tp_value **result, void *user_data) {
    (void)user_data;
    if (!args || !kwargs || tp_value_kind(args) != TP_KIND_LIST ||
        tp_value_kind(kwargs) != TP_KIND_MAP) {
        tp_call_set_error(call, "arg_counts: args must be a list and kwargs a map");
        return TP_ETYPE;
    }
    *result = tp_value_list_of(2, tp_value_int((int64_t)tp_list_len(args)),
                               tp_value_int((int64_t)tp_map_len(kwargs)));
    return *result ? TP_OK : nomem(call);
}

/* sleep_ms(ms): sleeps on the backend's clock; counts starts and completions. */
static tp_status fn_sleep_ms(tp_call *call, const tp_value *args, const tp_value *kwargs,
                             tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t ms;
    int me = self_rank(call);
    if (me < 0 || !arg_int(call, args, 0, &ms))
        return TP_EINVAL;
    atomic_fetch_add(&started[me], 1);
    tp_status st = tp_sleep((double)ms / 1000.0);
    if (st != TP_OK) {
        tp_call_set_error(call, "sleep_ms: tp_sleep failed: %s", tp_errmsg());
        return st;
    }
    atomic_fetch_add(&served[me], 1);
    *result = tp_value_int(ms);
    return *result ? TP_OK : nomem(call);
}

/* boom(): always fails, with a message. */
static tp_status fn_boom(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)result, (void)user_data;
    tp_call_set_error(call, "boom: deliberate failure");
    return TP_EINVAL;
}

/* silent_fail(): fails without setting a message. */
static tp_status fn_silent_fail(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)result, (void)user_data;
    return TP_ERANGE;
}

/* The items of list from index first on, as a new list. */
static tp_value *list_tail(const tp_value *list, size_t first) {
    tp_value *rest = tp_value_list();
    for (size_t i = first; rest && i < tp_list_len(list); i++) {
        tp_value *item = tp_value_clone(tp_list_get(list, i));
        if (!item || tp_list_append(rest, item) != TP_OK) {
            tp_value_free(item);
            tp_value_free(rest);
            rest = NULL;
        }
    }
    return rest;
}

/* nested(dst_rank, fn, *rest): rpc_sync(dst_rank, fn, rest) from inside a call. */
static tp_status fn_nested(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t dst;
    const char *fn = NULL;
    size_t fn_len = 0;
    if (!arg_int(call, args, 0, &dst))
        return TP_EINVAL;
    if (tp_value_get_str(tp_list_get(args, 1), &fn, &fn_len) != TP_OK) {
        tp_call_set_error(call, "nested: argument 1 must be a function name");
        return TP_EINVAL;
    }
    tp_value *rest = list_tail(args, 2);
    if (!rest)
        return nomem(call);
    tp_status st = tp_rpc_sync(tp_to_rank((int)dst), fn, rest, kwargs, TP_TIMEOUT_DEFAULT, result);
    tp_value_free(rest);
    if (st != TP_OK)
        tp_call_set_error(call, "nested call to rank %lld failed (%s): %s", (long long)dst,
                          tp_status_name(st), tp_errmsg());
    return st;
}

/*
 * ff_hop(hops_left, delay_ms): sleeps delay_ms, forwards ff_hop(hops_left-1)
 * to the next worker with rpc_async and drops the future (fire and forget),
 * then counts the hop. Counting last means a counted hop has finished its
 * work, including the forward.
 */
static tp_status fn_ff_hop(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data) {
    (void)kwargs, (void)result, (void)user_data;
    int64_t left, delay_ms;
    int me = self_rank(call);
    if (me < 0 || !arg_int(call, args, 0, &left) || !arg_int(call, args, 1, &delay_ms))
        return TP_EINVAL;
    if (delay_ms > 0) {
        tp_status st = tp_sleep((double)delay_ms / 1000.0);
        if (st != TP_OK) {
            tp_call_set_error(call, "ff_hop: tp_sleep failed: %s", tp_errmsg());
            return st;
        }
    }
    if (left > 0) {
        tp_worker_info *infos = NULL;
        size_t n = 0;
        tp_status st = tp_get_worker_infos(&infos, &n);
        if (st != TP_OK) {
            tp_call_set_error(call, "ff_hop: get_worker_infos failed: %s", tp_errmsg());
            return st;
        }
        free(infos);
        tp_value *next = CONF_INTS(left - 1, delay_ms);
        tp_future *f = NULL;
        st = tp_rpc_async(tp_to_rank((int)(((size_t)me + 1) % n)), "ff_hop", next, NULL,
                          TP_TIMEOUT_DEFAULT, &f);
        tp_value_free(next);
        if (st != TP_OK) {
            tp_call_set_error(call, "ff_hop: forward failed: %s", tp_errmsg());
            return st;
        }
        tp_future_free(f); /* fire and forget: the call goes on */
    }
    atomic_fetch_add(&hops[me], 1);
    return TP_OK;
}

/* Reads one per-worker counter. */
static tp_status counter_result(tp_call *call, _Atomic int64_t *arr, tp_value **result) {
    int me = self_rank(call);
    if (me < 0)
        return TP_EINVAL;
    *result = tp_value_int(atomic_load(&arr[me]));
    return *result ? TP_OK : nomem(call);
}

static tp_status fn_hops(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)user_data;
    return counter_result(call, hops, result);
}

static tp_status fn_served(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)user_data;
    return counter_result(call, served, result);
}

static tp_status fn_live_objects(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                 tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)user_data;
    return counter_result(call, live_objects, result);
}

/* ---- Counter: a class whose objects live on their owner ----------------- */

typedef struct counter {
    _Atomic int64_t value;
    int owner; /* rank whose live_objects counts it */
} counter;

static void counter_destroy(void *state) {
    counter *c = state;
    atomic_fetch_sub(&live_objects[c->owner], 1);
    free(c);
}

static tp_value *counter_new(int owner, int64_t start) {
    counter *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    atomic_init(&c->value, start);
    c->owner = owner;
    tp_value *v = tp_value_object("Counter", c, counter_destroy);
    if (!v) {
        free(c);
        return NULL;
    }
    atomic_fetch_add(&live_objects[owner], 1);
    return v;
}

tp_value *conf_counter_new(int owner, int64_t start) {
    return owner >= 0 && owner < TP_CONFORMANCE_RANKS_MAX ? counter_new(owner, start) : NULL;
}

/* make_counter(start=0): a Counter object, kept on this worker (use with remote). */
static tp_status fn_make_counter(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                 tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t start = 0;
    int me = self_rank(call);
    if (me < 0)
        return TP_EINVAL;
    if (tp_list_len(args) > 0 && !arg_int(call, args, 0, &start))
        return TP_EINVAL;
    *result = counter_new(me, start);
    return *result ? TP_OK : nomem(call);
}

/* The Counter a method was called on (tp_call_self, METHOD-1). */
static counter *method_self(tp_call *call) {
    const char *cls = NULL;
    void *state = NULL;
    const tp_value *self = tp_call_self(call);
    if (!self || tp_value_get_object(self, &cls, &state) != TP_OK || !cls ||
        strcmp(cls, "Counter") != 0) {
        tp_call_set_error(call, "%s: tp_call_self() is not a Counter", tp_call_function(call));
        return NULL;
    }
    return state;
}

/* Counter.increment(delta=1): the new value. */
static tp_status m_increment(tp_call *call, const tp_value *args, const tp_value *kwargs,
                             tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    counter *c = method_self(call);
    int64_t delta = 1;
    if (!c)
        return TP_ETYPE;
    if (tp_list_len(args) > 0 && !arg_int(call, args, 0, &delta))
        return TP_EINVAL;
    *result = tp_value_int(atomic_fetch_add(&c->value, delta) + delta);
    return *result ? TP_OK : nomem(call);
}

/* Counter.get(): the value. */
static tp_status m_get(tp_call *call, const tp_value *args, const tp_value *kwargs,
                       tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)user_data;
    counter *c = method_self(call);
    if (!c)
        return TP_ETYPE;
    *result = tp_value_int(atomic_load(&c->value));
    return *result ? TP_OK : nomem(call);
}

/* Counter.fail(): a method that fails. */
static tp_status m_fail(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)result, (void)user_data;
    tp_call_set_error(call, "Counter.fail: deliberate failure");
    return TP_EINVAL;
}

/* make_object(): returns a Counter as a call result, which cannot travel (VALUE-8). */
static tp_status fn_make_object(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *user_data) {
    return fn_make_counter(call, args, kwargs, result, user_data);
}

/* ---- Tensors ------------------------------------------------------------ */

/* make_tensor(dtype, n): a 1-D tensor [0, 1, ..., n-1] of a numeric dtype. */
static tp_status fn_make_tensor(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t dtype, n;
    if (!arg_int(call, args, 0, &dtype) || !arg_int(call, args, 1, &n))
        return TP_EINVAL;
    if (n < 0 || n > (1 << 20)) {
        tp_call_set_error(call, "make_tensor: n %lld out of range", (long long)n);
        return TP_ERANGE;
    }
    tp_value *t = tp_value_tensor((tp_dtype)dtype, 1, &n, NULL, NULL);
    if (!t) {
        tp_call_set_error(call, "make_tensor: bad dtype %lld", (long long)dtype);
        return TP_EINVAL;
    }
    void *d = tp_tensor_data(t);
    for (int64_t i = 0; i < n; i++) {
        switch ((tp_dtype)dtype) {
        case TP_DTYPE_FLOAT32:
            ((float *)d)[i] = (float)i;
            break;
        case TP_DTYPE_FLOAT64:
            ((double *)d)[i] = (double)i;
            break;
        case TP_DTYPE_INT32:
            ((int32_t *)d)[i] = (int32_t)i;
            break;
        case TP_DTYPE_INT64:
            ((int64_t *)d)[i] = i;
            break;
        default:
            tp_value_free(t);
            tp_call_set_error(call, "make_tensor: dtype %s not supported",
                              tp_dtype_name((tp_dtype)dtype));
            return TP_EINVAL;
        }
    }
    *result = t;
    return TP_OK;
}

/* One element as a double; 0 for dtypes without a C type here. */
static double element_at(tp_dtype dt, const void *base, int64_t off) {
    switch (dt) {
    case TP_DTYPE_FLOAT32:
        return ((const float *)base)[off];
    case TP_DTYPE_FLOAT64:
        return ((const double *)base)[off];
    case TP_DTYPE_INT8:
        return ((const int8_t *)base)[off];
    case TP_DTYPE_INT16:
        return ((const int16_t *)base)[off];
    case TP_DTYPE_INT32:
        return ((const int32_t *)base)[off];
    case TP_DTYPE_INT64:
        return (double)((const int64_t *)base)[off];
    case TP_DTYPE_UINT8:
        return ((const uint8_t *)base)[off];
    case TP_DTYPE_BOOL:
        return ((const uint8_t *)base)[off] != 0;
    default:
        return 0;
    }
}

/* tensor_sum(t): the sum of every element as a float, walking the strides. */
static tp_status fn_tensor_sum(tp_call *call, const tp_value *args, const tp_value *kwargs,
                               tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    const tp_value *t = tp_list_get(args, 0);
    if (!t || tp_value_kind(t) != TP_KIND_TENSOR) {
        tp_call_set_error(call, "tensor_sum: argument 0 must be a tensor");
        return TP_ETYPE;
    }
    int nd = tp_tensor_ndim(t);
    const int64_t *shape = tp_tensor_shape(t);
    const int64_t *strides = tp_tensor_strides(t);
    const void *base = tp_tensor_cdata(t);
    int64_t idx[TP_TENSOR_NDIM_MAX] = {0};
    double sum = 0;
    int64_t numel = tp_tensor_numel(t);
    for (int64_t k = 0; k < numel; k++) {
        int64_t off = 0;
        for (int d = 0; d < nd; d++)
            off += idx[d] * strides[d];
        sum += element_at(tp_tensor_dtype(t), base, off);
        for (int d = nd - 1; d >= 0; d--) {
            if (++idx[d] < shape[d])
                break;
            idx[d] = 0;
        }
    }
    *result = tp_value_float(sum);
    return *result ? TP_OK : nomem(call);
}

/* ---- Who is who ----------------------------------------------------------- */

static tp_status fn_whoami(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)user_data;
    tp_worker_info me;
    if (tp_get_worker_info(NULL, &me) != TP_OK) {
        tp_call_set_error(call, "whoami: %s", tp_errmsg());
        return TP_EINVAL;
    }
    *result = tp_value_str(me.name);
    return *result ? TP_OK : nomem(call);
}

static tp_status fn_caller(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)user_data;
    const tp_worker_info *c = tp_call_caller(call);
    *result = c ? tp_value_worker_info(c) : tp_value_nil();
    return *result ? TP_OK : nomem(call);
}

static tp_status fn_fn_name(tp_call *call, const tp_value *args, const tp_value *kwargs,
                            tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)user_data;
    const char *name = tp_call_function(call);
    *result = tp_value_str(name ? name : "(null)");
    return *result ? TP_OK : nomem(call);
}

/* worker_info(rank): this worker's view of rank's info, as a value. */
static tp_status fn_worker_info(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t r;
    if (!arg_int(call, args, 0, &r))
        return TP_EINVAL;
    tp_worker_info *infos = NULL;
    size_t n = 0;
    tp_status st = tp_get_worker_infos(&infos, &n);
    if (st != TP_OK) {
        tp_call_set_error(call, "worker_info: %s", tp_errmsg());
        return st;
    }
    if (r < 0 || (size_t)r >= n) {
        free(infos);
        tp_call_set_error(call, "worker_info: rank %lld out of range", (long long)r);
        return TP_ERANGE;
    }
    *result = tp_value_worker_info(&infos[r]);
    free(infos);
    return *result ? TP_OK : nomem(call);
}

/* slow_then_value(ms, v): v after ms of backend time. */
static tp_status fn_slow_then_value(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                    tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t ms;
    if (!arg_int(call, args, 0, &ms))
        return TP_EINVAL;
    tp_status st = tp_sleep((double)ms / 1000.0);
    if (st != TP_OK) {
        tp_call_set_error(call, "slow_then_value: tp_sleep failed: %s", tp_errmsg());
        return st;
    }
    const tp_value *v = tp_list_get(args, 1);
    *result = v ? tp_value_clone(v) : tp_value_nil();
    return *result ? TP_OK : nomem(call);
}

/* make_bytes(n): n bytes 0, 1, ..., 255, 0, ... */
static tp_status fn_make_bytes(tp_call *call, const tp_value *args, const tp_value *kwargs,
                               tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t n;
    if (!arg_int(call, args, 0, &n))
        return TP_EINVAL;
    if (n < 0 || n > (64 << 20)) {
        tp_call_set_error(call, "make_bytes: n %lld out of range", (long long)n);
        return TP_ERANGE;
    }
    uint8_t *buf = malloc((size_t)n + 1);
    if (!buf)
        return nomem(call);
    for (int64_t i = 0; i < n; i++)
        buf[i] = (uint8_t)i;
    *result = tp_value_bytes(buf, (size_t)n);
    free(buf);
    return *result ? TP_OK : nomem(call);
}

/* ---- RRefs inside functions ------------------------------------------- */

static tp_rref *arg_rref(tp_call *call, const tp_value *args, size_t i) {
    tp_rref *r = NULL;
    if (tp_value_get_rref(tp_list_get(args, i), &r) != TP_OK || !r) {
        tp_call_set_error(call, "%s: argument %zu must be an rref", tp_call_function(call), i);
        return NULL;
    }
    return r;
}

/* rref_fetch(rref): rref.to_here() on this worker (a user of the rref). */
static tp_status fn_rref_fetch(tp_call *call, const tp_value *args, const tp_value *kwargs,
                               tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    tp_rref *r = arg_rref(call, args, 0);
    if (!r)
        return TP_ETYPE;
    tp_status st = tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, result);
    if (st != TP_OK)
        tp_call_set_error(call, "rref_fetch: to_here failed (%s): %s", tp_status_name(st),
                          tp_errmsg());
    return st;
}

/* rref_local(rref): a copy of rref.local_value(), on its owner. */
static tp_status fn_rref_local(tp_call *call, const tp_value *args, const tp_value *kwargs,
                               tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    tp_rref *r = arg_rref(call, args, 0);
    const tp_value *v = NULL;
    if (!r)
        return TP_ETYPE;
    tp_status st = tp_rref_local_value(r, &v);
    if (st != TP_OK) {
        tp_call_set_error(call, "rref_local: local_value failed (%s): %s", tp_status_name(st),
                          tp_errmsg());
        return st;
    }
    *result = tp_value_clone(v);
    return *result ? TP_OK : nomem(call);
}

/* rref_info(rref): [is_owner, owner_name, confirmed_by_owner] as this worker
 * sees the rref while the function runs. */
static tp_status fn_rref_info(tp_call *call, const tp_value *args, const tp_value *kwargs,
                              tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    tp_rref *r = arg_rref(call, args, 0);
    if (!r)
        return TP_ETYPE;
    const char *owner = tp_rref_owner_name(r);
    *result = tp_value_list_of(3, tp_value_bool(tp_rref_is_owner(r)),
                               tp_value_str(owner ? owner : "(null)"),
                               tp_value_bool(tp_rref_confirmed_by_owner(r)));
    return *result ? TP_OK : nomem(call);
}

/* debug_info(): this worker's tp_debug_info as a list, in the struct's order. */
static tp_status fn_debug_info(tp_call *call, const tp_value *args, const tp_value *kwargs,
                               tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)user_data;
    tp_debug_info d;
    tp_status st = tp_get_debug_info(&d);
    if (st != TP_OK) {
        tp_call_set_error(call, "debug_info: %s", tp_errmsg());
        return st;
    }
    *result = tp_value_list_of(7, tp_value_int((int64_t)d.owned_values),
                               tp_value_int((int64_t)d.owner_forks),
                               tp_value_int((int64_t)d.user_rrefs),
                               tp_value_int((int64_t)d.pending_users),
                               tp_value_int((int64_t)d.pending_children),
                               tp_value_int((int64_t)d.pending_protocol),
                               tp_value_int((int64_t)d.calls_in_flight));
    return *result ? TP_OK : nomem(call);
}

/* rref_make(dst_rank, v): an rref to echo(v) on dst_rank, returned as the result. */
static tp_status fn_rref_make(tp_call *call, const tp_value *args, const tp_value *kwargs,
                              tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t dst;
    if (!arg_int(call, args, 0, &dst))
        return TP_EINVAL;
    tp_value *rest = list_tail(args, 1);
    tp_rref *r = NULL;
    if (!rest)
        return nomem(call);
    tp_status st = tp_remote(tp_to_rank((int)dst), "echo", rest, NULL, TP_TIMEOUT_DEFAULT, &r);
    tp_value_free(rest);
    if (st != TP_OK) {
        tp_call_set_error(call, "rref_make: remote failed: %s", tp_errmsg());
        return st;
    }
    *result = tp_value_rref(r); /* holds its own reference */
    tp_rref_release(r);
    return *result ? TP_OK : nomem(call);
}

/* rref_inc(rref, delta): Counter.increment(delta) through the rref, from this worker. */
static tp_status fn_rref_inc(tp_call *call, const tp_value *args, const tp_value *kwargs,
                             tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    tp_rref *r = arg_rref(call, args, 0);
    tp_method *m = NULL;
    if (!r)
        return TP_ETYPE;
    tp_status st = tp_method_factory("increment", &m);
    if (st != TP_OK) {
        tp_call_set_error(call, "rref_inc: method_factory: %s", tp_errmsg());
        return st;
    }
    tp_value *rest = list_tail(args, 1);
    if (!rest) {
        tp_method_free(m);
        return nomem(call);
    }
    st = tp_method_call_sync(m, r, rest, NULL, TP_TIMEOUT_DEFAULT, result);
    if (st != TP_OK)
        tp_call_set_error(call, "rref_inc: method call failed (%s): %s", tp_status_name(st),
                          tp_errmsg());
    tp_value_free(rest);
    tp_method_free(m);
    return st;
}

/* try_shutdown(graceful): tp_shutdown from inside a served function (SHUTDOWN-1
 * forbids it); returns the status it got, as an int. */
static tp_status fn_try_shutdown(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                 tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t graceful;
    if (!arg_int(call, args, 0, &graceful))
        return TP_EINVAL;
    *result = tp_value_int((int64_t)tp_shutdown((int)graceful));
    return *result ? TP_OK : nomem(call);
}

/* ---- Registration ----------------------------------------------------- */

/* (dst_rank, pad) -> *dst and [1, bytes[pad]], a sleep_ms(1) call padded to pad
 * bytes (caller-owned); NULL after setting the call's error when args are not so. */
static tp_value *padded_call(tp_call *call, const tp_value *args, int64_t *dst) {
    int64_t pad = -1;
    tp_value *v = NULL;
    if (tp_value_get_int(tp_list_get(args, 0), dst) == TP_OK &&
        tp_value_get_int(tp_list_get(args, 1), &pad) == TP_OK && pad >= 0 && pad <= (1 << 24)) {
        uint8_t *bytes = calloc(1, (size_t)pad + 1);
        v = bytes ? tp_value_list_of(2, tp_value_int(1), tp_value_bytes(bytes, (size_t)pad)) : NULL;
        free(bytes);
    }
    if (!v)
        tp_call_set_error(call, "%s takes (dst_rank, pad)", tp_call_function(call));
    return v;
}

/* send_padded(dst_rank, pad): rpc_sync(dst_rank, "sleep_ms", [1, pad bytes]) from the pool,
 * waiting for room in the window as long as it takes (FLOW-2); its status. */
static tp_status fn_send_padded(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t dst = -1;
    tp_value *sent = padded_call(call, args, &dst);
    if (!sent)
        return TP_EINVAL;
    tp_value *res = NULL;
    tp_status st =
        tp_rpc_sync(tp_to_rank((int)dst), "sleep_ms", sent, NULL, TP_TIMEOUT_INFINITE, &res);
    snprintf(send_padded_msg, sizeof send_padded_msg, "%s", st == TP_OK ? "" : tp_errmsg());
    atomic_store(&send_padded_st, st);
    tp_value_free(res);
    tp_value_free(sent);
    *result = tp_value_int(st);
    return *result ? TP_OK : nomem(call);
}

tp_status conf_send_padded_status(char *msg, size_t msg_len) {
    tp_status st = atomic_load(&send_padded_st); /* stored after the message */
    snprintf(msg, msg_len, "%s", send_padded_msg);
    return st;
}

/* later_add(dst_rank, delay_ms, timeout_ms): after delay_ms, rpc_sync(dst_rank, "add",
 * [1, 2]) with that timeout, from the pool; [its status, ms it took]. */
static tp_status fn_later_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                              tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t dst = -1, delay = -1, timeout = -1;
    if (tp_value_get_int(tp_list_get(args, 0), &dst) != TP_OK ||
        tp_value_get_int(tp_list_get(args, 1), &delay) != TP_OK ||
        tp_value_get_int(tp_list_get(args, 2), &timeout) != TP_OK || delay < 0 || timeout < 0) {
        tp_call_set_error(call, "later_add takes (dst_rank, delay_ms, timeout_ms)");
        return TP_EINVAL;
    }
    tp_status st = tp_sleep((double)delay / 1e3);
    uint64_t t0 = conf_now_ns();
    tp_value *res = NULL, *two = tp_value_list_of(2, tp_value_int(1), tp_value_int(2));
    if (st == TP_OK)
        st = two ? tp_rpc_sync(tp_to_rank((int)dst), "add", two, NULL, (double)timeout / 1e3, &res)
                 : TP_ENOMEM;
    int64_t took = (int64_t)((conf_now_ns() - t0) / 1000000u);
    tp_value_free(res);
    tp_value_free(two);
    *result = tp_value_list_of(2, tp_value_int(st), tp_value_int(took));
    return *result ? TP_OK : nomem(call);
}

/* nb_send_padded(dst_rank, pad): rpc_async of the same call from the I/O thread, where
 * it may not wait for room (FUNC-6); [its status, its message]. */
static tp_status fn_nb_send_padded(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                   tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t dst = -1;
    tp_value *sent = padded_call(call, args, &dst);
    if (!sent)
        return TP_EINVAL;
    tp_future *f = NULL;
    tp_status st =
        tp_rpc_async(tp_to_rank((int)dst), "sleep_ms", sent, NULL, TP_TIMEOUT_DEFAULT, &f);
    char msg[TP_ERRMSG_LEN_MAX];
    snprintf(msg, sizeof msg, "%s", st == TP_OK ? "" : tp_errmsg());
    tp_future_free(f); /* fire and forget when it went */
    tp_value_free(sent);
    *result = tp_value_list_of(2, tp_value_int(st), tp_value_str(msg));
    return *result ? TP_OK : nomem(call);
}

static const struct {
    const char *name;
    tp_fn fn;
} functions[] = {
    {"add", fn_add},
    {"echo", fn_echo},
    {"echo_kwargs", fn_echo_kwargs},
    {"kw_sub", fn_kw_sub},
    {"arg_counts", fn_arg_counts},
    {"sleep_ms", fn_sleep_ms},
    {"boom", fn_boom},
    {"silent_fail", fn_silent_fail},
    {"nested", fn_nested},
    {"ff_hop", fn_ff_hop},
    {"hops", fn_hops},
    {"served", fn_served},
    {"live_objects", fn_live_objects},
    {"make_counter", fn_make_counter},
    {"make_object", fn_make_object},
    {"make_tensor", fn_make_tensor},
    {"tensor_sum", fn_tensor_sum},
    {"whoami", fn_whoami},
    {"caller", fn_caller},
    {"fn_name", fn_fn_name},
    {"worker_info", fn_worker_info},
    {"slow_then_value", fn_slow_then_value},
    {"make_bytes", fn_make_bytes},
    {"rref_fetch", fn_rref_fetch},
    {"rref_local", fn_rref_local},
    {"rref_info", fn_rref_info},
    {"rref_make", fn_rref_make},
    {"debug_info", fn_debug_info},
    {"rref_inc", fn_rref_inc},
    {"try_shutdown", fn_try_shutdown},
    {"send_padded", fn_send_padded},
    {"later_add", fn_later_add},
};

/*
 * nb_try_wait(): a non-blocking function (FUNC-6) that tries what it may not
 * do and what it may: returns [rpc_sync status, sleep status, future wait
 * status, rpc_async status, the rpc_sync message, shutdown status, local_value
 * status of a value not ready yet, method call status]. The rpc_async (add(1, 2)
 * to the caller) is fire-and-forget: its future is freed at once.
 */
/* A non-blocking *function* named like Counter's method "get": a method call
 * "get" must reach the method, never this (FUNC-6 routes functions only). */
static tp_status fn_nb_get_decoy(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                 tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    *result = tp_value_str("the function 'get', not Counter.get");
    return TP_OK;
}

static tp_status fn_nb_try_wait(tp_call *call, const tp_value *args, const tp_value *kwargs,
                                tp_value **result, void *user_data) {
    (void)args, (void)kwargs, (void)user_data;
    tp_dest caller = tp_to_rank(tp_call_caller(call)->id);
    tp_value *res = NULL;
    tp_value *two = tp_value_list_of(2, tp_value_int(1), tp_value_int(2));
    tp_status sync_st = tp_rpc_sync(caller, "add", two, NULL, TP_TIMEOUT_DEFAULT, &res);
    char sync_msg[TP_ERRMSG_LEN_MAX];
    snprintf(sync_msg, sizeof sync_msg, "%s", tp_errmsg());
    tp_value_free(res);
    tp_status sleep_st = tp_sleep(0.01);
    tp_future *f = NULL;
    tp_status async_st = tp_rpc_async(caller, "add", two, NULL, TP_TIMEOUT_DEFAULT, &f);
    tp_status wait_st = f ? tp_future_wait(f, TP_TIMEOUT_DEFAULT) : TP_OK;
    tp_future_free(f);
    tp_value_free(two);
    tp_status shutdown_st = tp_shutdown(1);
    /* An rref this worker owns whose value is still being made (sleep_ms on
     * the pool): reading it would wait, and so would a method call. */
    tp_worker_info me;
    tp_rref *r = NULL;
    tp_method *m = NULL;
    tp_value *ms = tp_value_list_of(1, tp_value_int(200));
    tp_status local_st = TP_OK, method_st = TP_OK;
    if (tp_get_worker_info(NULL, &me) == TP_OK &&
        tp_remote(tp_to_rank((int)me.id), "sleep_ms", ms, NULL, TP_TIMEOUT_DEFAULT, &r) ==
            TP_OK &&
        tp_method_factory("get", &m) == TP_OK) {
        const tp_value *v = NULL;
        local_st = tp_rref_local_value(r, &v);
        tp_value *got = NULL;
        method_st = tp_method_call_sync(m, r, NULL, NULL, TP_TIMEOUT_DEFAULT, &got);
        tp_value_free(got);
    }
    tp_method_free(m);
    tp_rref_release(r);
    tp_value_free(ms);
    *result = tp_value_list_of(8, tp_value_int(sync_st), tp_value_int(sleep_st),
                               tp_value_int(wait_st), tp_value_int(async_st),
                               tp_value_str(sync_msg), tp_value_int(shutdown_st),
                               tp_value_int(local_st), tp_value_int(method_st));
    return *result ? TP_OK : nomem(call);
}

/* Functions registered TP_FN_NONBLOCKING: they run on the I/O thread. */
static const struct {
    const char *name;
    tp_fn fn;
} nonblocking_functions[] = {
    {"nb_add", fn_add},
    {"nb_echo", fn_echo},
    {"nb_rref_info", fn_rref_info}, /* RREF-13: runs on the pool while its rref is unconfirmed */
    {"nb_try_wait", fn_nb_try_wait},
    {"nb_send_padded", fn_nb_send_padded},
    {"get", fn_nb_get_decoy}, /* METHOD-1, FUNC-6: a method call never takes this */
};

static const struct {
    const char *name;
    tp_fn fn;
} counter_methods[] = {
    {"increment", m_increment},
    {"get", m_get},
    {"fail", m_fail},
    {"fn_name", fn_fn_name}, /* FUNC-2: a method's name is "<class>.<method>" */
};

tp_status conf_register_all(void) {
    tp_status ast = conf_register_async();
    if (ast != TP_OK && ast != TP_EALREADY)
        return ast;
    for (size_t i = 0; i < sizeof functions / sizeof functions[0]; i++) {
        tp_status st = tp_register_function(functions[i].name, functions[i].fn, NULL);
        if (st != TP_OK && st != TP_EALREADY)
            return st;
    }
    for (size_t i = 0; i < sizeof nonblocking_functions / sizeof nonblocking_functions[0]; i++) {
        tp_status st = tp_register_function_ex(nonblocking_functions[i].name,
                                               nonblocking_functions[i].fn, NULL, TP_FN_NONBLOCKING);
        if (st != TP_OK && st != TP_EALREADY)
            return st;
    }
    for (size_t i = 0; i < sizeof counter_methods / sizeof counter_methods[0]; i++) {
        tp_status st =
            tp_new_method("Counter", counter_methods[i].name, counter_methods[i].fn, NULL);
        if (st != TP_OK && st != TP_EALREADY)
            return st;
    }
    return TP_OK;
}
