/* backend_registry.c: register_backend / construct_rpc_backend_options (BACKEND-1..5). */
#include <stdatomic.h>
#include <string.h>

#include "context.h"
#include "errors.h"
#include "registry.h"
#include "tensorplay/rpc_backend.h"

#define BACKENDS_MAX 16 /* a process registers a handful; a bound keeps the table static */

extern const tp_backend tpi_sim_backend; /* sim/sim_agent.c */
#ifdef TP_HAVE_REAL
extern const tp_backend tpi_tcp_backend; /* real/ */
#endif

static struct {
    char name[TP_NAME_LEN_MAX + 1];
    const tp_backend *backend;
} backends[BACKENDS_MAX];
static size_t nbackends;
static atomic_flag backends_spin = ATOMIC_FLAG_INIT;
static atomic_int builtins_state; /* 0 none, 1 registering, 2 done */

static void reg_lock(void) {
    while (atomic_flag_test_and_set_explicit(&backends_spin, memory_order_acquire)) {
    }
}

static void reg_unlock(void) {
    atomic_flag_clear_explicit(&backends_spin, memory_order_release);
}

static const tp_backend *find_locked(const char *name) {
    for (size_t i = 0; i < nbackends; i++)
        if (strcmp(backends[i].name, name) == 0)
            return backends[i].backend;
    return NULL;
}

static tp_status add_backend(const char *name, const tp_backend *b) {
    if (!tpi_name_valid(name, NULL))
        return tpi_fail(TP_EINVAL, "backend name '%.*s' must match ^[A-Za-z0-9_:-]+$ and be 1..%d "
                                   "bytes",
                        TP_NAME_LEN_MAX + 8, name ? name : "(null)", TP_NAME_LEN_MAX);
    if (!b || !b->init)
        return tpi_fail(TP_EINVAL, "backend '%s' has no init handler", name);
    if (b->api_version != TP_BACKEND_API_VERSION)
        return tpi_fail(TP_EINVAL, "backend '%s' speaks SPI version %u, this library %u", name,
                        b->api_version, TP_BACKEND_API_VERSION);
    reg_lock();
    tp_status st = TP_OK;
    if (find_locked(name))
        st = tpi_fail(TP_EALREADY, "backend '%s' is already registered", name);
    else if (nbackends == BACKENDS_MAX)
        st = tpi_fail(TP_ELIMIT, "more than %d backends", BACKENDS_MAX);
    else {
        strcpy(backends[nbackends].name, name);
        backends[nbackends].backend = b;
        nbackends++;
    }
    reg_unlock();
    return st;
}

void tp_register_builtin_backends(void) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&builtins_state, &expected, 1)) {
        add_backend("SIM", &tpi_sim_backend);
#ifdef TP_HAVE_REAL
        add_backend("TENSORPIPE", &tpi_tcp_backend);
#endif
        atomic_store(&builtins_state, 2);
        return;
    }
    /* Another thread is registering them: a lookup must not run before it ends. */
    while (atomic_load(&builtins_state) != 2) {
    }
}

tp_status tp_register_backend(const char *name, const tp_backend *backend) {
    tp_register_builtin_backends();
    return add_backend(name, backend);
}

const tp_backend *tp_lookup_backend(const char *name) {
    tp_register_builtin_backends();
    if (!name)
        return NULL;
    reg_lock();
    const tp_backend *b = find_locked(name);
    reg_unlock();
    return b;
}

const char *tp_backend_type_name(tp_backend_type type) {
    switch (type) {
    case TP_BACKEND_TENSORPIPE:
        return "TENSORPIPE";
    case TP_BACKEND_SIM:
        return "SIM";
    }
    return NULL;
}

tp_status tp_construct_rpc_backend_options(const char *name, tp_options **out) {
    if (!out)
        return tpi_fail(TP_EINVAL, "construct_rpc_backend_options: out is NULL");
    *out = NULL;
    const tp_backend *b = tp_lookup_backend(name);
    if (!b)
        return tpi_fail(TP_EBACKEND, "no backend named '%s' is registered", name ? name : "(null)");
    tp_options *o = tp_options_new();
    if (!o)
        return tpi_fail(TP_ENOMEM, "out of memory");
    if (b->construct_options) {
        tp_status st = b->construct_options(o);
        if (st != TP_OK) {
            tp_options_free(o);
            return st;
        }
    }
    *out = o;
    return TP_OK;
}

int tp_is_available(void) {
    return 1;
}
