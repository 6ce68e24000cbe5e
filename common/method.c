/*
 * method.c: method_factory / new_method (spec/api.md METHOD-1..3).
 * A method call travels as a REQUEST (or REMOTE) with TPI_FLAG_METHOD and
 * args = [rref, [caller's args...]]; the owner runs the method of the
 * object its rref holds (serve.c).
 */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "options.h"
#include "registry.h"

struct tp_method {
    char name[TP_NAME_LEN_MAX + 1];
};

tp_status tp_method_factory(const char *method_name, tp_method **out) {
    if (!out)
        return tpi_fail(TP_EINVAL, "method_factory: out is NULL");
    *out = NULL;
    if (!tpi_name_valid(method_name, NULL))
        return tpi_fail(TP_EINVAL, "method name '%.*s' must match ^[A-Za-z0-9_:-]+$ and be 1..%d "
                                   "bytes",
                        TP_NAME_LEN_MAX + 8, method_name ? method_name : "(null)",
                        TP_NAME_LEN_MAX);
    tp_method *m = calloc(1, sizeof *m);
    if (!m)
        return tpi_fail(TP_ENOMEM, "out of memory");
    strcpy(m->name, method_name);
    *out = m;
    return TP_OK;
}

void tp_method_free(tp_method *m) {
    free(m);
}

/* 1 when v holds an object anywhere (objects cannot be sent: VALUE-8). */
static int holds_object(const tp_value *v) {
    switch (tp_value_kind(v)) {
    case TP_KIND_OBJECT:
        return 1;
    case TP_KIND_LIST:
        for (size_t i = 0; i < tp_list_len(v); i++)
            if (holds_object(tp_list_get(v, i)))
                return 1;
        return 0;
    case TP_KIND_MAP:
        for (size_t i = 0; i < tp_map_len(v); i++)
            if (holds_object(tp_map_value_at(v, i)))
                return 1;
        return 0;
    default:
        return 0;
    }
}

/*
 * [rref, args-copy]: the caller's args are copied because lists own their
 * items (a copy per method call; a borrowed-item list would avoid it).
 */
static tp_status wire_args(tp_rref *rref, const tp_value *args, tp_value **out) {
    if (args && tp_value_kind(args) != TP_KIND_LIST)
        return tpi_fail(TP_EINVAL, "method call: args must be a list, got %s",
                        tp_kind_name(tp_value_kind(args)));
    if (args && holds_object(args))
        return tpi_fail(TP_ETYPE, "method call: objects cannot be sent; hold them in an rref");
    tp_value *target = tp_value_rref(rref);
    tp_value *inner = args ? tp_value_clone(args) : tp_value_list();
    tp_value *list = tp_value_list_of(2, target, inner);
    if (!list)
        return tpi_fail(TP_ENOMEM, "method call: out of memory");
    *out = list;
    return TP_OK;
}

static tp_status start(const tp_method *m, tp_rref *rref, const tp_value *args,
                       const tp_value *kwargs, double timeout_s, int remote, tp_future **fut,
                       tp_rref **rout) {
    if (!m || !rref)
        return tpi_fail(TP_EINVAL, "method call: %s is NULL", m ? "rref" : "method");
    tp_core *c = rref->core;
    tp_status st = tpi_enter_core(c, "method call");
    if (st != TP_OK)
        return st;
    tp_value *wire = NULL;
    st = tpi_check_timeout(timeout_s, 1);
    if (st == TP_OK && kwargs && tp_value_kind(kwargs) != TP_KIND_MAP)
        st = tpi_fail(TP_EINVAL, "method call: kwargs must be a map, got %s",
                      tp_kind_name(tp_value_kind(kwargs)));
    if (st == TP_OK)
        st = wire_args(rref, args, &wire);
    if (st == TP_OK) {
        tpi_lock(c);
        st = tpi_rref_owner_check(c, rref, "method call");
        if (st != TP_OK)
            ; /* REJOIN-6: the object went with its owner's earlier incarnation */
        else if (remote)
            st = tpi_start_remote(c, rref->owner, m->name, TPI_FLAG_METHOD, wire, kwargs,
                                  timeout_s, rout);
        else
            st = tpi_start_request(c, rref->owner, "method call", m->name, TPI_FLAG_METHOD,
                                   wire, kwargs, timeout_s, fut);
        tpi_unlock(c);
    }
    tp_value_free(wire);
    tpi_leave(c);
    return st;
}

tp_status tp_method_call_async(const tp_method *m, tp_rref *rref, const tp_value *args,
                               const tp_value *kwargs, double timeout_s, tp_future **out) {
    if (!out)
        return tpi_fail(TP_EINVAL, "method call: out is NULL");
    *out = NULL;
    return start(m, rref, args, kwargs, timeout_s, 0, out, NULL);
}

tp_status tp_method_call_sync(const tp_method *m, tp_rref *rref, const tp_value *args,
                              const tp_value *kwargs, double timeout_s, tp_value **result) {
    if (!result)
        return tpi_fail(TP_EINVAL, "method call: result is NULL");
    *result = NULL;
    if (tpi_check_may_wait("method call") != TP_OK)
        return TP_EINVAL;
    tp_future *f = NULL;
    tp_status st = start(m, rref, args, kwargs, timeout_s, 0, &f, NULL);
    if (st != TP_OK)
        return st;
    tp_core *c = rref->core;
    st = tpi_enter_core(c, "method call");
    if (st == TP_OK) {
        st = tpi_future_result(c, f, result);
        tpi_leave(c);
    }
    tp_future_free(f);
    return st;
}

tp_status tp_method_call_remote(const tp_method *m, tp_rref *rref, const tp_value *args,
                                const tp_value *kwargs, double timeout_s, tp_rref **out) {
    if (!out)
        return tpi_fail(TP_EINVAL, "method call: out is NULL");
    *out = NULL;
    return start(m, rref, args, kwargs, timeout_s, 1, NULL, out);
}

/* ---- RRef proxies (METHOD-4): rref.rpc_sync().m(...) and friends -------------------- */

/* A method binder on the stack, resolved as tp_method_factory does. */
static tp_status bind(const char *method_name, tp_method *m) {
    tp_method *made = NULL;
    tp_status st = tp_method_factory(method_name, &made);
    if (st != TP_OK)
        return st;
    *m = *made;
    tp_method_free(made);
    return TP_OK;
}

tp_status tp_rref_rpc_sync(tp_rref *rref, const char *method_name, const tp_value *args,
                           const tp_value *kwargs, double timeout_s, tp_value **result) {
    if (result)
        *result = NULL;
    tp_method m;
    tp_status st = bind(method_name, &m);
    return st == TP_OK ? tp_method_call_sync(&m, rref, args, kwargs, timeout_s, result) : st;
}

tp_status tp_rref_rpc_async(tp_rref *rref, const char *method_name, const tp_value *args,
                            const tp_value *kwargs, double timeout_s, tp_future **out) {
    if (out)
        *out = NULL;
    tp_method m;
    tp_status st = bind(method_name, &m);
    return st == TP_OK ? tp_method_call_async(&m, rref, args, kwargs, timeout_s, out) : st;
}

tp_status tp_rref_remote(tp_rref *rref, const char *method_name, const tp_value *args,
                         const tp_value *kwargs, double timeout_s, tp_rref **out) {
    if (out)
        *out = NULL;
    tp_method m;
    tp_status st = bind(method_name, &m);
    return st == TP_OK ? tp_method_call_remote(&m, rref, args, kwargs, timeout_s, out) : st;
}
