/*
 * lifecycle.c: init, shutdown and teardown of a worker (spec/lifecycle.md).
 *
 * States per context: no core (UNINIT), initializing (ctx->initializing),
 * a core in RUNNING (graceful shutdown's phases run here too), STOPPING
 * (teardown: every API entry fails), then no core again. Re-init after
 * shutdown is allowed; the context's generation counter namespaces the
 * store keys of each attempt.
 */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "limits.h"
#include "log.h"
#include "options.h"
#include "registry.h"

#define TEARDOWN_POLL_NS 1000000ull /* 1 ms between looks at threads leaving the API */

/* Worker cores allocated and not yet freed, in this process (AGENT-15). */
static atomic_uint_fast64_t cores_live;

uint64_t tp_core_live_count(void) {
    return (uint64_t)atomic_load(&cores_live);
}

void tpi_core_free(tp_core *c) {
    TPI_ASSERT(atomic_load(&c->refs) == 0);
    TPI_ASSERT(!c->calls_head && c->calls.len == 0 && c->owners.len == 0 && c->served.len == 0);
    tpi_idmap_free(&c->calls);
    tpi_idmap_free(&c->served);
    tpi_idmap_free(&c->owners);
    tpi_idmap_free(&c->children);
    free(c->heap);
    free(c->grave);
    tpi_names_release(c->names); /* infos and by_name: maybe shared */
    tpi_names_release(c->names_spare);
    free(c->peer_dead);
    free((void *)atomic_load(&c->peer_inc));
    for (uint32_t i = 0; i < c->npeer_ids; i++)
        free(c->peer_recs[i]);
    free(c->peer_recs);
    free(c->peer_ids);
    free(c->abandoned);
    free(c->freed);
    free(c->deleted);
    tpi_debts_free(c);
    tpi_idmap_free(&c->debts);
    tpi_idmap_free(&c->seen);
    free(c->seen_ring);
    tp_options_free(c->opts);
    free(c);
    uint_fast64_t was = atomic_fetch_sub(&cores_live, 1);
    TPI_ASSERT(was > 0);
}

static tp_core *core_new(tp_context *ctx, const char *name, uint32_t rank, uint32_t world,
                         const tp_options *opts) {
    tp_core *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    atomic_fetch_add(&cores_live, 1);
    atomic_init(&c->refs, 1);
    atomic_init(&c->state, TPI_STATE_RUNNING);
    atomic_init(&c->api_refs, 0);
    atomic_init(&c->lock_owner, NULL);
    atomic_init(&c->next_gid, 0);
    c->ctx = ctx;
    c->rank = rank;
    c->world_size = world;
    tpi_format(c->self.name, sizeof c->self.name, "%s", name);
    c->self.id = rank;
    c->names = tpi_names_empty(world);
    c->infos = c->names ? tpi_names_infos(c->names) : NULL;
    c->by_name = c->names ? tpi_names_by_name(c->names) : NULL;
    c->credit = c->names ? tpi_names_credit(c->names) : NULL;
    /* Per peer: a byte, and a record made on first contact (tpi_peer_get),
     * not every peer's state up front; incarnations at the first rejoin. */
    c->peer_dead = calloc(world, 1);
    atomic_init(&c->peer_inc, NULL);
    c->rr_first = c->rr_last = UINT32_MAX;
    tpi_idmap_init(&c->debts);
    c->opts = opts ? tp_options_clone(opts) : tp_options_new();
    tpi_idmap_init(&c->calls);
    tpi_idmap_init(&c->served);
    tpi_idmap_init(&c->owners);
    tpi_idmap_init(&c->children);
    tpi_idmap_init(&c->seen);
    c->armed_ns = TPI_NO_DEADLINE;
    if (!c->infos || !c->by_name || !c->credit || !c->peer_dead || !c->opts) {
        atomic_store(&c->refs, 0);
        tpi_core_free(c);
        return NULL;
    }
    c->default_timeout_s = tp_options_rpc_timeout(c->opts);
    c->max_msg = tp_options_max_message_size(c->opts);
    c->window = tp_options_max_inflight_bytes(c->opts);
    /* FLOW-6: the credit granted each peer, a share of max_queued_bytes. */
    c->queued_max = tp_options_max_queued_bytes(c->opts);
    c->remote_values_max = tp_options_max_remote_values(c->opts);
    uint64_t share = world > 1 ? c->queued_max / (world - 1) : c->queued_max;
    if (share < TPI_CREDIT_MIN)
        share = TPI_CREDIT_MIN;
    c->grant = share < c->window ? share : c->window;
    return c;
}

/* Wakes every task parked in the core (lock held): they see the state. */
static void wake_all(tp_core *c) {
    for (tpi_waiter *w = c->parked; w; w = w->next)
        c->ops->unpark(c->agent, w->task);
}

/*
 * Teardown (SHUTDOWN-6): fail everything, let threads leave the API, stop
 * the agent (its accepted work runs and finishes fast), free the protocol
 * state, destroy the agent. The core memory lives on while handles do.
 */
static tp_status teardown(tp_core *c, uint64_t deadline_ns) {
    tp_status st = TP_OK;
    char why[TP_NAME_LEN_MAX + 64];
    tpi_format(why, sizeof why, "rpc is shut down on worker '%s'", c->self.name);
    atomic_store(&c->state, TPI_STATE_STOPPING);
    tpi_lock(c);
    tpi_calls_fail(c, UINT32_MAX, TP_ESHUTDOWN, why);
    tpi_futures_fail_user(c, TP_ESHUTDOWN, why); /* FUTURE-9: nobody can complete them now */
    /* Every thread inside the API is parked in the core or about to be, and
     * each wakes to see the state and leave: no deadline can be better than
     * this wait (freeing the agent under a thread would be a crash), so it
     * polls until they are gone and reports if it took past the deadline. */
    int late = 0; /* threads inside at the first look at or past the deadline */
    int inside;
    while ((inside = atomic_load(&c->api_refs)) > 0) {
        wake_all(c);
        if (!late && tpi_now(c) >= deadline_ns)
            late = inside;
        tpi_park(c, tpi_now(c) + TEARDOWN_POLL_NS);
    }
    tpi_unlock(c);
    if (late)
        st = tpi_fail(TP_ETIMEDOUT,
                      "shutdown: %d thread(s) still inside rpc calls at the shutdown deadline; "
                      "worker '%s' was torn down after they left",
                      late, c->self.name);
    c->ops->stop(c->agent);
    tpi_lock(c);
    tpi_calls_fail(c, UINT32_MAX, TP_ESHUTDOWN, why);
    tpi_futures_fail_user(c, TP_ESHUTDOWN, why);
    tpi_serve_teardown(c);
    tpi_rrefs_teardown(c);
    tpi_unlock(c);
    atomic_store(&c->state, TPI_STATE_STOPPED);
    c->ops->destroy(c->agent);
    c->agent = NULL;
    c->store = NULL;
    tpi_frame_cache_trim(); /* idle large buffers go back to the system */
    return st;
}

/* Ends the worker in ctx: detach, tear down, drop the context's reference. */
static tp_status finish(tp_context *ctx, tp_core *c, uint64_t deadline_ns) {
    tp_status st = teardown(c, deadline_ns);
    tpi_context_lock(ctx);
    ctx->core = NULL;
    tpi_context_unlock(ctx);
    tpi_core_unref(c);
    return st;
}

void tpi_worker_abandon(tp_context *ctx) {
    tpi_context_lock(ctx);
    tp_core *c = ctx->core;
    tpi_context_unlock(ctx);
    if (c)
        finish(ctx, c, tpi_deadline_after(c, tp_options_shutdown_timeout(c->opts)));
}

static tp_status fail_init(tp_context *ctx, tp_core *c, int started) {
    if (c && c->agent) {
        atomic_store(&c->state, TPI_STATE_STOPPING);
        if (started)
            c->ops->stop(c->agent);
        c->ops->destroy(c->agent);
    }
    if (c) {
        atomic_store(&c->refs, 0);
        tpi_core_free(c);
    }
    tpi_context_lock(ctx);
    ctx->initializing = 0;
    tpi_context_unlock(ctx);
    return TP_OK;
}

/* ---- INTERRUPT-1 ----------------------------------------------------------- */

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "tp_interrupt must be async-signal-safe: lock-free "
                                          "atomics only");

/* A blocking lifecycle call starts on ctx: its epoch (odd) for interrupts to aim at. */
static uint32_t lifecycle_begin(tp_context *ctx) {
    uint32_t e = (uint32_t)atomic_fetch_add(&ctx->lc_epoch, 1) + 1;
    TPI_ASSERT(e & 1);
    return e;
}

/* It ends: an interrupt from now on is dropped (TP_ENOTINIT). */
static void lifecycle_end(tp_context *ctx) {
    uint32_t e = (uint32_t)atomic_fetch_add(&ctx->lc_epoch, 1) + 1;
    TPI_ASSERT(!(e & 1));
}

/* The calling task's parks in c watch for an interrupt of epoch (0: stop). */
static void lifecycle_watch(tp_core *c, uint32_t epoch) {
    tpi_lock(c);
    c->intr_epoch = epoch;
    c->intr_task = epoch ? c->ops->task_self(c->agent) : NULL;
    tpi_unlock(c);
}

tp_status tp_context_interrupt(tp_context *ctx) {
    /* Lock-free and allocation-free, for signal handlers: no tpi_fail. */
    if (!ctx)
        return TP_EINVAL;
    unsigned e = atomic_load(&ctx->lc_epoch);
    if (!(e & 1))
        return TP_ENOTINIT; /* nothing blocks: dropped */
    atomic_store(&ctx->intr_epoch, e);
    return TP_OK;
}

tp_status tp_interrupt(void) {
    return tp_context_interrupt(tp_context_current());
}

/*
 * REJOIN-1: TP_REJOIN=1 in the environment sets the rejoin option. A
 * launcher that restarts a failed process (tprun --max-restarts) says so
 * there, so the program needs no change to come back as a new incarnation.
 * Only the process's own worker reads it: a simulated world depends on its
 * seed alone.
 */
static int env_rejoin(const tp_context *ctx) {
    const char *v = getenv("TP_REJOIN");
    return tpi_context_is_process(ctx) && v && strcmp(v, "1") == 0;
}

static tp_status init_attempt(tp_context *ctx, const tp_backend *b, const char *backend,
                              const char *name, int rank, int world_size, const tp_options *opts,
                              uint32_t gen, uint32_t epoch);

tp_status tp_init_rpc(const char *name, const char *backend, int rank, int world_size,
                      const tp_options *opts) {
    tp_context *ctx = tp_context_current();
    if (!tpi_name_valid(name, NULL))
        return tpi_fail(TP_EINVAL,
                        "invalid worker name '%.*s': it must match ^[A-Za-z0-9_:-]+$ and be "
                        "1..%d bytes",
                        TP_NAME_LEN_MAX + 8, name ? name : "(null)", TP_NAME_LEN_MAX);
    if (world_size < 1 || world_size > TP_WORLD_SIZE_MAX)
        return tpi_fail(TP_EINVAL, "world_size %d outside [1, %d]", world_size,
                        TP_WORLD_SIZE_MAX);
    if (rank < 0 || rank >= world_size)
        return tpi_fail(TP_EINVAL, "rank %d out of range for world_size %d (ranks 0..%d)", rank,
                        world_size, world_size - 1);
    if (!backend)
        backend = "TENSORPIPE";
    const tp_backend *b = tp_lookup_backend(backend);
    if (!b)
        return tpi_fail(TP_EBACKEND, "no backend named '%s' is registered", backend);
    for (size_t i = 0; opts && i < tpi_options_nkeys(opts); i++) {
        const char *key = tpi_options_key_at(opts, i);
        int known = 0;
        for (const char *const *k = b->option_keys; k && *k && !known; k++)
            known = strcmp(*k, key) == 0;
        if (!known)
            return tpi_fail(TP_EINVAL, "backend '%s' has no option '%s'", backend, key);
    }

    tpi_context_lock(ctx);
    if (ctx->core || ctx->initializing) {
        tp_core *cur = ctx->core;
        tpi_context_unlock(ctx);
        if (cur)
            return tpi_fail(TP_EALREADY,
                            "rpc is already initialized on this worker as '%s' (rank %u)",
                            cur->self.name, cur->rank);
        return tpi_fail(TP_EALREADY, "rpc init is already in progress on this worker");
    }
    ctx->initializing = 1;
    uint32_t gen = ctx->generation++;
    tpi_context_unlock(ctx);
    uint32_t epoch = lifecycle_begin(ctx);
    tp_status st = init_attempt(ctx, b, backend, name, rank, world_size, opts, gen, epoch);
    lifecycle_end(ctx);
    return st;
}

/* tp_init_params.interrupted: the init c runs was interrupted. */
static int params_interrupted(const tp_init_params *p) {
    return tpi_interrupted(p->core_private);
}

/* INIT-9, INTERRUPT-1: an init that fails while interrupted says so. */
static tp_status init_failed(tp_core *c, tp_status st, char *msg, size_t len) {
    tpi_format(msg, len, "%s", tp_errmsg());
    if (!tpi_interrupted(c) || st == TP_ECANCELED)
        return st;
    char was[TP_ERRMSG_LEN_MAX];
    tpi_format(was, sizeof was, "%s", msg);
    tpi_format(msg, len, "init: interrupted (%s)", was);
    return TP_ECANCELED;
}

static tp_status init_attempt(tp_context *ctx, const tp_backend *b, const char *backend,
                              const char *name, int rank, int world_size, const tp_options *opts,
                              uint32_t gen, uint32_t epoch) {
    tp_core *c = core_new(ctx, name, (uint32_t)rank, (uint32_t)world_size, opts);
    if (!c) {
        fail_init(ctx, NULL, 0);
        return tpi_fail(TP_ENOMEM, "init: out of memory");
    }
    c->generation = gen;
    char err[TP_ERRMSG_LEN_MAX] = "";
    /* The backend's init may wait (for its store): it can be interrupted
     * from the start. No task parks in c before lifecycle_watch. */
    c->intr_epoch = epoch;
    tp_init_params params = {c->self.name, c->rank, c->world_size, c->opts, params_interrupted, c};
    tp_status st = b->init(&params, &c->agent, &c->ops, err, sizeof err);
    if (st != TP_OK) {
        c->agent = NULL;
        fail_init(ctx, c, 0);
        return tpi_fail(st, "init: backend '%s' failed: %s", backend, err[0] ? err : tp_strerror(st));
    }
    TPI_ASSERT(c->ops && c->ops->api_version == TP_BACKEND_API_VERSION);
    c->store = c->ops->store(c->agent);
    lifecycle_watch(c, epoch); /* INTERRUPT-1: from the first wait on */
    char addr[TPI_ADDR_LEN_MAX];
    /* AGENT-17: known before the first frame can arrive. */
    uint32_t net = c->ops->net_faults ? c->ops->net_faults(c->agent) : 0;
    c->dedupe = (net & TP_NET_DUPLICATES) != 0;
    c->reorders = (net & TP_NET_REORDERS) != 0;
    c->loses = (net & TP_NET_LOSES) != 0;
    st = c->ops->start(c->agent, c, addr, sizeof addr, err, sizeof err);
    if (st != TP_OK) {
        fail_init(ctx, c, 0);
        return tpi_fail(st, "init: backend '%s' could not start: %s", backend, err);
    }
    c->init_started_ns = tpi_now(c);
    uint64_t deadline = tpi_deadline_after(c, tp_options_init_timeout(c->opts));
    int rejoin = tp_options_rejoin(c->opts) || env_rejoin(ctx);
    st = rejoin ? tpi_rendezvous_rejoin(c, addr, deadline) : tpi_rendezvous(c, addr, deadline);
    if (st != TP_OK) {
        char msg[TP_ERRMSG_LEN_MAX];
        st = init_failed(c, st, msg, sizeof msg);
        fail_init(ctx, c, 1);
        return tpi_fail(st, "%s", msg);
    }
    /* Peers that finished init may call us from here on: serve them as a
     * worker that is up, while we wait for the last ready keys. */
    tpi_context_lock(ctx);
    ctx->core = c;
    tpi_context_unlock(ctx);
    st = rejoin ? tpi_rejoin_announce(c, addr, deadline) : tpi_rendezvous_ready(c, deadline);
    if (st != TP_OK) {
        char msg[TP_ERRMSG_LEN_MAX];
        st = init_failed(c, st, msg, sizeof msg);
        lifecycle_watch(c, 0); /* teardown's own waits are not interrupted */
        finish(ctx, c, tpi_deadline_after(c, tp_options_shutdown_timeout(c->opts)));
        tpi_context_lock(ctx);
        ctx->initializing = 0;
        tpi_context_unlock(ctx);
        return tpi_fail(st, "%s", msg);
    }
    lifecycle_watch(c, 0);
    tpi_context_lock(ctx);
    ctx->initializing = 0;
    tpi_context_unlock(ctx);
    return TP_OK;
}

/* RREF-18: what the graceful phases left unsettled, logged and kept in ctx
 * for tp_shutdown_leaks. */
static void report_leaks(tp_context *ctx, tp_core *c) {
    tp_rref_leak *v = NULL;
    int incomplete = 0;
    tpi_lock(c);
    size_t n = tpi_rrefs_leaks(c, &v, &incomplete);
    tpi_unlock(c);
    static const char *const kinds[] = {"", "its holder never deleted it",
                                        "its holder never accepted it",
                                        "the owner never acknowledged its delete",
                                        "no reference holds it, yet it was not freed"};
    for (size_t i = 0; i < n; i++) {
        char owner[TP_NAME_LEN_MAX + 32], holder[TP_NAME_LEN_MAX + 32];
        tpi_log(TP_LOG_WARN,
                "shutdown: worker '%s' leaks rref %u:%llu fork %u:%llu (owner %s, holder %s): "
                "%s (RREF-18)",
                c->self.name, v[i].rref_worker, (unsigned long long)v[i].rref_n,
                v[i].fork_worker, (unsigned long long)v[i].fork_n,
                tpi_worker_desc(c, v[i].owner, owner, sizeof owner),
                tpi_worker_desc(c, v[i].holder, holder, sizeof holder), kinds[v[i].kind]);
    }
    if (incomplete)
        tpi_log(TP_LOG_WARN, "shutdown: worker '%s': out of memory listing rref leaks; the list "
                             "is incomplete",
                c->self.name);
    tpi_probe(c, TP_PROBE_RREF_LEAKS, n, c->rank, TP_OK, NULL);
    tpi_context_lock(ctx);
    free(ctx->leaks);
    ctx->leaks = v;
    ctx->nleaks = n;
    ctx->leaks_known = 1;
    tpi_context_unlock(ctx);
}

tp_status tp_shutdown_leaks(tp_rref_leak **out, size_t *n) {
    if (!out || !n)
        return tpi_fail(TP_EINVAL, "shutdown_leaks: %s is NULL", out ? "n" : "out");
    *out = NULL;
    *n = 0;
    tp_context *ctx = tp_context_current();
    /* The context's lock is a spin lock: no malloc under it. The list only
     * changes at this thread's own shutdown, so the count read holds. */
    tpi_context_lock(ctx);
    int known = ctx->leaks_known;
    size_t count = ctx->nleaks;
    tpi_context_unlock(ctx);
    tp_rref_leak *copy = count ? malloc(count * sizeof *copy) : NULL;
    if (copy) {
        tpi_context_lock(ctx);
        count = count < ctx->nleaks ? count : ctx->nleaks;
        memcpy(copy, ctx->leaks, count * sizeof *copy);
        tpi_context_unlock(ctx);
    }
    if (!known)
        return tpi_fail(TP_ENOTINIT, "shutdown_leaks: no graceful shutdown ran on this thread's "
                                     "context yet");
    if (count && !copy)
        return tpi_fail(TP_ENOMEM, "shutdown_leaks: out of memory for %zu entries", count);
    *out = copy;
    *n = count;
    return TP_OK;
}

tp_status tp_shutdown(int graceful) {
    if (tpi_check_may_wait("shutdown") != TP_OK) /* FUNC-6, SHUTDOWN-1 */
        return TP_EINVAL;
    tp_context *ctx = tp_context_current();
    tp_core *c = tpi_context_core(ctx);
    /* SHUTDOWN-1: never from a task serving this worker (its pool would wait
     * for the very task that is waiting for it); checked first, because a
     * worker serves requests while its own init finishes. */
    int inside = c && atomic_load(&c->state) == TPI_STATE_RUNNING && tpi_in_work(c);
    tpi_context_lock(ctx);
    int initializing = ctx->initializing;
    int busy = c && atomic_load_explicit(&c->shutting_down, memory_order_relaxed);
    if (c && !inside && !initializing && !busy)
        atomic_store_explicit(&c->shutting_down, 1, memory_order_relaxed);
    tpi_context_unlock(ctx);
    if (!inside && initializing) { /* INIT-1: init owns the worker until it returns */
        if (c)
            tpi_core_unref(c);
        return tpi_fail(TP_ENOTINIT, "shutdown: rpc init is still in progress on this worker");
    }
    if (!c)
        return tpi_fail(TP_ENOTINIT, "shutdown: rpc is not initialized");
    tpi_core_unref(c); /* the context's reference stays until teardown ends */
    if (inside)
        return tpi_fail(TP_EINVAL, "shutdown: called from a function or callback worker '%s' is "
                                   "serving; call it from the worker's own thread",
                        c->self.name);
    if (busy)
        return tpi_fail(TP_EALREADY, "shutdown: already in progress on worker '%s'",
                        c->self.name);
    tp_status st = TP_OK;
    char msg[TP_ERRMSG_LEN_MAX] = "";
    if (c->ops->probe) {
        double t = tp_options_shutdown_timeout(c->opts);
        tp_probe p = {.kind = TP_PROBE_SHUTDOWN_BEGIN, .graceful = graceful,
                      .deadline_ns = t > 0 ? (uint64_t)(t * 1e9) : UINT64_MAX, .fn = ""};
        c->ops->probe(c->agent, &p);
    }
    if (graceful) {
        /* INTERRUPT-1: the graceful phases may be interrupted; teardown not. */
        uint32_t epoch = lifecycle_begin(ctx);
        lifecycle_watch(c, epoch);
        st = tpi_shutdown_graceful(c);
        int interrupted = tpi_interrupted(c);
        lifecycle_watch(c, 0);
        lifecycle_end(ctx);
        if (interrupted && st != TP_OK) { /* one that came after the drain changes nothing */
            char was[TP_ERRMSG_LEN_MAX];
            tpi_format(was, sizeof was, "%s", st == TP_ECANCELED ? tp_errmsg() : "");
            st = tpi_fail(TP_ECANCELED,
                          "shutdown: interrupted during the %s%s%s; worker '%s' abandoned the "
                          "rest of its graceful shutdown and was torn down as by "
                          "shutdown(graceful=False)",
                          c->sd_phase ? c->sd_phase : "graceful phases", was[0] ? ": " : "", was,
                          c->self.name);
        }
        tpi_probe(c, TP_PROBE_SHUTDOWN_DRAINED, 0, c->rank, st, NULL);
        if (st != TP_OK)
            tpi_format(msg, sizeof msg, "%s", tp_errmsg());
        report_leaks(ctx, c);
    }
    uint64_t deadline = tpi_deadline_after(c, tp_options_shutdown_timeout(c->opts));
    /* The agent is gone once finish returns: the last probe goes first. */
    tpi_probe(c, TP_PROBE_SHUTDOWN_END, 0, c->rank, st, NULL);
    tp_status tst = finish(ctx, c, deadline);
    if (st != TP_OK)
        return tpi_fail(st, "%s", msg); /* torn down anyway (SHUTDOWN-7) */
    return tst;
}

int tp_is_initialized(void) {
    tp_context *ctx = tp_context_current();
    tpi_context_lock(ctx);
    int up = ctx->core && atomic_load(&ctx->core->state) == TPI_STATE_RUNNING;
    tpi_context_unlock(ctx);
    return up;
}

tp_status tp_get_worker_info(const char *name, tp_worker_info *out) {
    if (!out)
        return tpi_fail(TP_EINVAL, "get_worker_info: out is NULL");
    tp_core *c;
    tp_status st = tpi_enter("get_worker_info", &c);
    if (st != TP_OK)
        return st;
    if (!name) {
        *out = c->self;
    } else {
        uint32_t id;
        st = tpi_resolve(c, tp_to_name(name), &id);
        if (st == TP_OK)
            *out = c->infos[id];
    }
    tpi_leave(c);
    return st;
}

tp_status tp_get_worker_infos(tp_worker_info **out, size_t *count) {
    if (!out || !count)
        return tpi_fail(TP_EINVAL, "get_worker_infos: %s is NULL", out ? "count" : "out");
    *out = NULL;
    *count = 0;
    tp_core *c;
    tp_status st = tpi_enter("get_worker_infos", &c);
    if (st != TP_OK)
        return st;
    tp_worker_info *v = malloc(c->world_size * sizeof *v);
    if (!v) {
        st = tpi_fail(TP_ENOMEM, "get_worker_infos: out of memory");
    } else {
        memcpy(v, c->infos, c->world_size * sizeof *v);
        *out = v;
        *count = c->world_size;
    }
    tpi_leave(c);
    return st;
}

tp_status tp_set_rpc_timeout(double seconds) {
    tp_status st = tpi_check_timeout(seconds, 0);
    if (st != TP_OK)
        return st;
    tp_core *c;
    st = tpi_enter("set_rpc_timeout", &c);
    if (st != TP_OK)
        return st;
    tpi_lock(c);
    c->default_timeout_s = seconds; /* TIMEOUT-4: later calls only */
    tpi_unlock(c);
    tpi_leave(c);
    return TP_OK;
}

double tp_get_rpc_timeout(void) {
    /* A query, not a call that fails: it leaves tp_errmsg() alone (ERR-2). */
    tp_core *c = tpi_context_core(tp_context_current());
    double t = TP_DEFAULT_RPC_TIMEOUT_S;
    if (c && atomic_load(&c->state) == TPI_STATE_RUNNING) {
        atomic_fetch_add(&c->api_refs, 1);
        if (atomic_load(&c->state) == TPI_STATE_RUNNING) {
            tpi_lock(c);
            t = c->default_timeout_s;
            tpi_unlock(c);
        }
        atomic_fetch_sub(&c->api_refs, 1);
    }
    if (c)
        tpi_core_unref(c);
    return t;
}

tp_status tp_sleep(double seconds) {
    tp_status st = tpi_check_timeout(seconds, 0);
    if (st != TP_OK)
        return st;
    if (seconds > 0 && tpi_check_may_wait("sleep") != TP_OK)
        return TP_EINVAL;
    tp_core *c;
    st = tpi_enter("sleep", &c);
    if (st != TP_OK)
        return st;
    tpi_lock(c);
    uint64_t until = tpi_deadline_after(c, seconds);
    while (seconds > 0 && tpi_now(c) < until) {
        st = tpi_park(c, until);
        if (st != TP_OK && st != TP_ETIMEDOUT)
            break; /* teardown */
        st = TP_OK;
    }
    tpi_unlock(c);
    tpi_leave(c);
    if (st != TP_OK)
        return tpi_fail(st, "sleep interrupted: the worker is shutting down");
    return TP_OK;
}
