/*
 * cases_lifecycle.c: init and its errors, the world's infos, options,
 * backend and function registration, calls outside init..shutdown.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "tensorplay/rpc_backend.h" /* tp_backend; the agent table for AGENT-8 below */

/* Launcher options with a short init deadline, for inits expected to fail. */
static tp_options *short_init_options(double init_timeout_s) {
    tp_options *o = conf_options();
    if (o && tp_options_set_init_timeout(o, init_timeout_s) != TP_OK) {
        tp_options_free(o);
        return NULL;
    }
    return o;
}

/* tp_init_rpc with a given name and the launcher's backend. */
static tp_status init_named(const char *name, int rank, int ws, const tp_options *opts) {
    tp_status st = conf_register_all();
    if (st != TP_OK)
        return st;
    return tp_init_rpc(name, conf_launcher->backend, rank, ws, opts);
}

/* spec: INIT-1: a second init fails with TP_EALREADY and leaves the worker working. */
static int lifecycle_init_twice(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    tp_options *o = conf_options();
    CHECK_STATUS(tp_init_rpc(conf_name(rank), conf_launcher->backend, rank, ws, o), TP_EALREADY);
    CHECK_CONTAINS(tp_errmsg(), "already initialized");
    tp_options_free(o);
    CHECK(tp_is_initialized());
    CHECK_INT(conf_sync_int(rank, tp_to_rank(1 - rank), "add", CONF_INTS(rank, 1), -1), rank + 1);
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: INIT-1 TIMEOUT-4 ERR-3: before init, calls fail with TP_ENOTINIT and a message. */
static int lifecycle_calls_before_init(int rank, int ws) {
    CHECK(!tp_is_initialized());
    tp_value *args = CONF_INTS(1, 2);
    tp_value *res = NULL;
    CHECK_STATUS(tp_rpc_sync(tp_to_rank(0), "add", args, NULL, TP_TIMEOUT_DEFAULT, &res),
                 TP_ENOTINIT);
    CHECK(tp_errmsg()[0] != '\0');
    CHECK(res == NULL);
    tp_future *f = NULL;
    CHECK_STATUS(tp_rpc_async(tp_to_rank(0), "add", args, NULL, TP_TIMEOUT_DEFAULT, &f),
                 TP_ENOTINIT);
    CHECK(f == NULL);
    tp_rref *r = NULL;
    CHECK_STATUS(tp_remote(tp_to_rank(0), "add", args, NULL, TP_TIMEOUT_DEFAULT, &r), TP_ENOTINIT);
    CHECK(r == NULL);
    tp_worker_info me;
    CHECK_STATUS(tp_get_worker_info(NULL, &me), TP_ENOTINIT);
    tp_worker_info *infos = NULL;
    size_t n = 0;
    CHECK_STATUS(tp_get_worker_infos(&infos, &n), TP_ENOTINIT);
    free(infos);
    CHECK_STATUS(tp_sleep(0.01), TP_ENOTINIT);
    CHECK_STATUS(tp_set_rpc_timeout(1.0), TP_ENOTINIT);
    CHECK(tp_get_rpc_timeout() == TP_DEFAULT_RPC_TIMEOUT_S); /* TIMEOUT-4 */
    CHECK_STATUS(tp_shutdown(1), TP_ENOTINIT);
    tp_value_free(args);
    /* And then init works as usual. */
    CONF_INIT_OR_RETURN(rank, ws);
    CHECK_INT(conf_sync_int(rank, tp_to_rank(0), "add", CONF_INTS(1, 2), -1), 3);
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* tp_status is one of a and b. */
static int either(tp_status st, tp_status a, tp_status b) {
    return st == a || st == b;
}

/* spec: INIT-1 SHUTDOWN-6: after shutdown, calls fail (ESHUTDOWN or ENOTINIT) with a message. */
static int lifecycle_calls_after_shutdown(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    CHECK_OK(tp_shutdown(1));
    CHECK(!tp_is_initialized());
    tp_value *args = CONF_INTS(1, 2);
    tp_value *res = NULL;
    tp_status st = tp_rpc_sync(tp_to_rank(1 - rank), "add", args, NULL, TP_TIMEOUT_DEFAULT, &res);
    if (!CHECK(either(st, TP_ESHUTDOWN, TP_ENOTINIT)))
        conf_fail(rank, __FILE__, __LINE__, "rpc_sync after shutdown: %s", tp_status_name(st));
    CHECK(tp_errmsg()[0] != '\0');
    CHECK(res == NULL);
    tp_future *f = NULL;
    st = tp_rpc_async(tp_to_rank(1 - rank), "add", args, NULL, TP_TIMEOUT_DEFAULT, &f);
    CHECK(either(st, TP_ESHUTDOWN, TP_ENOTINIT));
    CHECK(f == NULL);
    tp_rref *r = NULL;
    st = tp_remote(tp_to_rank(1 - rank), "add", args, NULL, TP_TIMEOUT_DEFAULT, &r);
    CHECK(either(st, TP_ESHUTDOWN, TP_ENOTINIT));
    CHECK(r == NULL);
    tp_worker_info me;
    CHECK(tp_get_worker_info(NULL, &me) != TP_OK);
    CHECK_STATUS(tp_shutdown(1), TP_ENOTINIT); /* twice: the worker is UNINIT again */
    tp_value_free(args);
    return conf_finish(rank);
}

/* spec: INIT-1 INIT-9 FUNC-1: after shutdown a worker can init again and call. */
static int lifecycle_reinit_after_shutdown(int rank, int ws) {
    for (int round = 0; round < 2; round++) {
        CONF_INIT_OR_RETURN(rank, ws);
        CHECK_INT(conf_sync_int(rank, tp_to_rank(1 - rank), "add", CONF_INTS(round, 10), -1),
                  round + 10);
        tp_worker_info *infos = NULL;
        size_t n = 0;
        if (CHECK_OK(tp_get_worker_infos(&infos, &n)))
            CHECK_INT(n, 2);
        free(infos);
        CHECK_OK(tp_shutdown(1));
    }
    return conf_finish(rank);
}

/* spec: INIT-4 INIT-5: a duplicate name fails init on every worker, naming the ranks. */
static int lifecycle_duplicate_names(int rank, int ws) {
    tp_options *o = short_init_options(5.0);
    const char *name = (rank == 0 || rank == 2) ? "dup" : conf_name(rank);
    CHECK_STATUS(init_named(name, rank, ws, o), TP_EDUPNAME);
    CHECK_CONTAINS(tp_errmsg(), "dup");
    CHECK_CONTAINS(tp_errmsg(), "0");
    CHECK_CONTAINS(tp_errmsg(), "2");
    CHECK(!tp_is_initialized());
    tp_options_free(o);
    return conf_finish(rank);
}

/* spec: INIT-5 INIT-9: after a failed init, a corrected init succeeds. */
static int lifecycle_init_retry_after_failure(int rank, int ws) {
    tp_options *o = short_init_options(5.0);
    CHECK_STATUS(init_named("same", rank, ws, o), TP_EDUPNAME);
    tp_options_free(o);
    CONF_INIT_OR_RETURN(rank, ws);
    CHECK_INT(conf_sync_int(rank, tp_to_rank(1 - rank), "add", CONF_INTS(2, 3), -1), 5);
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: INIT-2 ERR-3: names must match ^[A-Za-z0-9_:-]+$ and fit TP_NAME_LEN_MAX. */
static int lifecycle_invalid_names(int rank, int ws) {
    tp_options *o = conf_options();
    char too_long[TP_NAME_LEN_MAX + 2];
    memset(too_long, 'a', TP_NAME_LEN_MAX + 1);
    too_long[TP_NAME_LEN_MAX + 1] = '\0';
    const char *bad[] = {"", "a b", "a/b", "w\xc3\xbc", "name\n", "x.y", too_long};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tp_status st = init_named(bad[i], rank, ws, o);
        if (!CHECK_STATUS(st, TP_EINVAL))
            conf_fail(rank, __FILE__, __LINE__, "name #%zu was accepted", i);
        CHECK(tp_errmsg()[0] != '\0');
        if (st == TP_OK)
            tp_shutdown(0);
    }
    CHECK_STATUS(tp_init_rpc(NULL, conf_launcher->backend, rank, ws, o), TP_EINVAL);
    /* The longest legal name, with every legal character class. */
    char longest[TP_NAME_LEN_MAX + 1];
    memset(longest, 'z', TP_NAME_LEN_MAX);
    memcpy(longest, "Az09_:-", 7);
    longest[TP_NAME_LEN_MAX] = '\0';
    if (CHECK_OK(init_named(longest, rank, ws, o))) {
        tp_value *res = NULL;
        if (CHECK_OK(conf_sync(tp_to_name(longest), "whoami", NULL, &res)))
            CHECK(strcmp(conf_str_of(rank, res), longest) == 0);
        tp_value_free(res);
        CHECK_OK(tp_shutdown(1));
    }
    tp_options_free(o);
    return conf_finish(rank);
}

/* spec: INIT-2: rank outside [0, world_size) and bad world sizes are TP_EINVAL. */
static int lifecycle_bad_rank_or_world_size(int rank, int ws) {
    tp_options *o = conf_options();
    CHECK_OK(conf_register_all());
    const char *be = conf_launcher->backend;
    CHECK_STATUS(tp_init_rpc("w0", be, 1, 1, o), TP_EINVAL);
    CHECK_CONTAINS(tp_errmsg(), "rank 1 out of range");
    CHECK_STATUS(tp_init_rpc("w0", be, -1, 1, o), TP_EINVAL);
    CHECK_STATUS(tp_init_rpc("w0", be, 0, 0, o), TP_EINVAL);
    CHECK_STATUS(tp_init_rpc("w0", be, 0, -4, o), TP_EINVAL);
    CHECK_STATUS(tp_init_rpc("w0", be, 0, TP_WORLD_SIZE_MAX + 1, o), TP_EINVAL);
    CHECK(!tp_is_initialized());
    tp_options_free(o);
    CONF_INIT_OR_RETURN(rank, ws);
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: INIT-4 INIT-5: workers that disagree on the world size fail init, not hang. */
static int lifecycle_world_size_disagree(int rank, int ws) {
    tp_options *o = short_init_options(2.0);
    tp_status st = init_named(conf_name(rank), rank, rank == 0 ? ws : ws + 1, o);
    if (!CHECK_STATUS(st, TP_EINVAL) && st == TP_OK)
        tp_shutdown(0);
    CHECK_CONTAINS(tp_errmsg(), "world size mismatch");
    CHECK(!tp_is_initialized());
    tp_options_free(o);
    return conf_finish(rank);
}

/* spec: INIT-1 CALL-3 RREF-2: a world of one worker calls itself every way. */
static int lifecycle_world_size_one(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    CHECK(tp_is_initialized());
    CHECK_INT(conf_sync_int(rank, tp_to_name("w0"), "add", CONF_INTS(20, 22), -1), 42);
    tp_future *f = NULL;
    if (CHECK_OK(conf_async(tp_to_rank(0), "add", CONF_INTS(1, 1), &f)) &&
        CHECK_OK(tp_future_wait(f, TP_TIMEOUT_INFINITE)))
        CHECK_INT(conf_int_of(rank, tp_future_value(f), -1), 2);
    tp_future_free(f);
    tp_rref *r = NULL;
    tp_value *args = CONF_INTS(7);
    if (CHECK_OK(tp_remote(tp_to_rank(0), "echo", args, NULL, TP_TIMEOUT_DEFAULT, &r))) {
        tp_value *v = NULL;
        if (CHECK_OK(tp_rref_to_here(r, TP_TIMEOUT_DEFAULT, &v)))
            CHECK_INT(conf_int_of(rank, v, -1), 7);
        tp_value_free(v);
        CHECK(tp_rref_is_owner(r));
    }
    tp_value_free(args);
    tp_rref_release(r);
    tp_worker_info *infos = NULL;
    size_t n = 0;
    if (CHECK_OK(tp_get_worker_infos(&infos, &n)))
        CHECK_INT(n, 1);
    free(infos);
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: CALL-2 INIT-7: worker infos by name, self, all; unknown names are TP_EUNKNOWNWORKER. */
static int lifecycle_worker_infos(int rank, int ws) {
    CONF_INIT_OR_RETURN(rank, ws);
    tp_worker_info *infos = NULL;
    size_t n = 0;
    if (CHECK_OK(tp_get_worker_infos(&infos, &n)) && CHECK_INT(n, ws)) {
        for (size_t i = 0; i < n; i++) {
            CHECK_INT(infos[i].id, i);
            CHECK(strcmp(infos[i].name, conf_name((int)i)) == 0);
        }
    }
    free(infos);
    tp_worker_info info;
    if (CHECK_OK(tp_get_worker_info(NULL, &info))) {
        CHECK_INT(info.id, rank);
        CHECK(strcmp(info.name, conf_name(rank)) == 0);
    }
    if (CHECK_OK(tp_get_worker_info("w2", &info))) {
        CHECK_INT(info.id, 2);
        CHECK(strcmp(info.name, "w2") == 0);
    }
    CHECK_STATUS(tp_get_worker_info("nobody", &info), TP_EUNKNOWNWORKER);
    CHECK_CONTAINS(tp_errmsg(), "nobody");
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: INIT-1: is_available always; is_initialized exactly between init and shutdown. */
static int lifecycle_is_available_and_initialized(int rank, int ws) {
    CHECK(tp_is_available() == 1);
    CHECK(tp_is_initialized() == 0);
    CONF_INIT_OR_RETURN(rank, ws);
    CHECK(tp_is_available() == 1);
    CHECK(tp_is_initialized() == 1);
    CHECK_OK(tp_shutdown(1));
    CHECK(tp_is_initialized() == 0);
    CHECK(tp_is_available() == 1);
    return conf_finish(rank);
}

/* spec: BACKEND-3 OPT-1: construct_rpc_backend_options gives usable defaults. */
static int lifecycle_construct_backend_options(int rank, int ws) {
    tp_options *o = NULL;
    if (CHECK_OK(tp_construct_rpc_backend_options(conf_launcher->backend, &o)) &&
        CHECK(o != NULL)) {
        CHECK(tp_options_rpc_timeout(o) == TP_DEFAULT_RPC_TIMEOUT_S);
        CHECK_INT(tp_options_num_worker_threads(o), TP_DEFAULT_NUM_WORKER_THREADS);
        /* The launcher's rendezvous, then init with them. */
        tp_options *lo = conf_options();
        if (lo && tp_options_init_method(lo))
            CHECK_OK(tp_options_set_init_method(o, tp_options_init_method(lo)));
        tp_options_free(lo);
        if (CHECK_OK(conf_init_opts(rank, ws, o))) {
            CHECK(tp_get_rpc_timeout() == TP_DEFAULT_RPC_TIMEOUT_S);
            CHECK_OK(tp_shutdown(1));
        }
    }
    tp_options_free(o);
    tp_options *none = NULL;
    CHECK_STATUS(tp_construct_rpc_backend_options("NO_SUCH_BACKEND", &none), TP_EBACKEND);
    CHECK_CONTAINS(tp_errmsg(), "no backend named 'NO_SUCH_BACKEND'");
    CHECK(none == NULL);
    tp_options_free(none);
    return conf_finish(rank);
}

/* spec: BACKEND-1 BACKEND-2 INIT-2: backend names are unique; init with an unknown one fails. */
static int lifecycle_register_backend_duplicate(int rank, int ws) {
    const tp_backend *b = tp_lookup_backend(conf_launcher->backend);
    if (CHECK(b != NULL)) {
        CHECK_STATUS(tp_register_backend(conf_launcher->backend, b), TP_EALREADY);
        CHECK_CONTAINS(tp_errmsg(), conf_launcher->backend);
        /* A new name for the same table registers once (the registry is per process). */
        if (tp_lookup_backend("CONF_ALIAS") == NULL)
            CHECK_OK(tp_register_backend("CONF_ALIAS", b));
        CHECK(tp_lookup_backend("CONF_ALIAS") == b);
        CHECK_STATUS(tp_register_backend("CONF_ALIAS", b), TP_EALREADY);
        CHECK_STATUS(tp_register_backend("bad name", b), TP_EINVAL);
        CHECK_STATUS(tp_register_backend("CONF_NULL", NULL), TP_EINVAL);
        CHECK(tp_lookup_backend("CONF_NULL") == NULL);
    }
    CHECK(tp_lookup_backend("NO_SUCH_BACKEND") == NULL);
    tp_options *o = conf_options();
    CHECK_OK(conf_register_all());
    CHECK_STATUS(tp_init_rpc(conf_name(rank), "NO_SUCH_BACKEND", rank, ws, o), TP_EBACKEND);
    CHECK_CONTAINS(tp_errmsg(), "no backend named 'NO_SUCH_BACKEND'");
    CHECK(!tp_is_initialized());
    tp_options_free(o);
    return conf_finish(rank);
}

static tp_status fn_unused(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)result, (void)user_data;
    return TP_OK;
}

/* spec: FUNC-1 METHOD-1: function and method names are unique per worker. */
static int lifecycle_register_function_duplicate(int rank, int ws) {
    CHECK_OK(conf_register_all());
    CHECK_STATUS(tp_register_function("add", fn_unused, NULL), TP_EALREADY);
    CHECK_CONTAINS(tp_errmsg(), "add");
    CHECK_STATUS(tp_new_method("Counter", "get", fn_unused, NULL), TP_EALREADY);
    CHECK_STATUS(tp_register_function("", fn_unused, NULL), TP_EINVAL);
    CHECK_STATUS(tp_register_function("f", NULL, NULL), TP_EINVAL);
    /* The original is still the one that runs. */
    CONF_INIT_OR_RETURN(rank, ws);
    CHECK_INT(conf_sync_int(rank, tp_to_rank(0), "add", CONF_INTS(2, 2), -1), 4);
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: OPT-1 OPT-2 OPT-3 OPT-4 OPT-5 OPT-6: option defaults, validation and clone. */
static int lifecycle_options(int rank, int ws) {
    (void)ws;
    tp_options *o = tp_options_new();
    if (!CHECK(o != NULL))
        return conf_finish(rank);
    CHECK(tp_options_rpc_timeout(o) == TP_DEFAULT_RPC_TIMEOUT_S);
    CHECK_INT(tp_options_num_worker_threads(o), TP_DEFAULT_NUM_WORKER_THREADS);
    CHECK(tp_options_init_method(o) == NULL);
    CHECK(tp_options_init_timeout(o) == tp_options_rpc_timeout(o));
    CHECK_OK(tp_options_set_rpc_timeout(o, 2.5));
    CHECK(tp_options_init_timeout(o) == 2.5); /* unset: they follow rpc_timeout */
    CHECK(tp_options_shutdown_timeout(o) == 2.5);
    CHECK_OK(tp_options_set_shutdown_timeout(o, 7.0));
    CHECK_OK(tp_options_set_rpc_timeout(o, 0.0));
    CHECK(tp_options_shutdown_timeout(o) == 7.0);
    CHECK(tp_options_init_timeout(o) == 0.0);
    CHECK_STATUS(tp_options_set_rpc_timeout(o, -1.0), TP_EINVAL);
    CHECK(tp_options_rpc_timeout(o) == 0.0); /* a refused value leaves it unchanged */
    CHECK_STATUS(tp_options_set_num_worker_threads(o, 0), TP_EINVAL);
    CHECK_STATUS(tp_options_set_num_worker_threads(o, 1025), TP_EINVAL);
    CHECK_OK(tp_options_set_num_worker_threads(o, 4));
    CHECK_STATUS(tp_options_set_max_message_size(o, 16), TP_EINVAL);
    CHECK_OK(tp_options_set_max_message_size(o, 1 << 20));
    CHECK_STATUS(tp_options_set(o, "", "v"), TP_EINVAL);
    CHECK_OK(tp_options_set(o, "conf.key", "v1"));
    CHECK_OK(tp_options_set(o, "conf.key", "v2"));
    CHECK(tp_options_get(o, "conf.key") && strcmp(tp_options_get(o, "conf.key"), "v2") == 0);
    CHECK(tp_options_get(o, "conf.absent") == NULL);
    tp_options *c = tp_options_clone(o);
    if (CHECK(c != NULL)) {
        CHECK(tp_options_rpc_timeout(c) == 0.0);
        CHECK_INT(tp_options_num_worker_threads(c), 4);
        CHECK_INT(tp_options_max_message_size(c), 1 << 20);
        CHECK(tp_options_get(c, "conf.key") && strcmp(tp_options_get(c, "conf.key"), "v2") == 0);
    }
    tp_options_free(c);
    tp_options_free(o);
    tp_options_free(NULL);
    return conf_finish(rank);
}

/* spec: OPT-6 INIT-2: init refuses a backend option key it does not know, naming it. */
static int lifecycle_unknown_option_key(int rank, int ws) {
    tp_options *o = conf_options();
    CHECK_OK(tp_options_set(o, "conf_no_such_key", "1"));
    tp_status st = init_named(conf_name(rank), rank, ws, o);
    CHECK_STATUS(st, TP_EINVAL);
    CHECK_CONTAINS(tp_errmsg(), "conf_no_such_key");
    if (st == TP_OK)
        CHECK_OK(tp_shutdown(1));
    CHECK(!tp_is_initialized());
    tp_options_free(o);
    CONF_INIT_OR_RETURN(rank, ws);
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

/* spec: INTERRUPT-1: with no init or graceful shutdown blocked, tp_interrupt is
 * dropped with TP_ENOTINIT in every state, leaves tp_errmsg() alone, and never
 * affects a later call: the init and the graceful shutdown after it run to
 * their end. */
static int lifecycle_interrupt_nothing_blocked(int rank, int ws) {
    CHECK_STATUS(tp_sleep(0.01), TP_ENOTINIT); /* a message to keep */
    char msg[TP_ERRMSG_LEN_MAX];
    snprintf(msg, sizeof msg, "%s", tp_errmsg());
    CHECK(msg[0] != '\0');
    CHECK_STATUS(tp_interrupt(), TP_ENOTINIT); /* UNINIT */
    CHECK_STATUS(tp_interrupt(), TP_ENOTINIT);
    CHECK(strcmp(tp_errmsg(), msg) == 0);
    CONF_INIT_OR_RETURN(rank, ws);
    CHECK_STATUS(tp_interrupt(), TP_ENOTINIT); /* READY: calls are not interrupted */
    CHECK_INT(conf_sync_int(rank, tp_to_rank(1 - rank), "add", CONF_INTS(rank, 1), -1), rank + 1);
    CHECK_OK(tp_shutdown(1));
    CHECK_STATUS(tp_interrupt(), TP_ENOTINIT); /* UNINIT again */
    CHECK(!tp_is_initialized());
    return conf_finish(rank);
}

/* The launcher's backend under another name, keeping each worker's agent and
 * agent table as init makes them, so a case can call the agent below the
 * core (which never sends to a rank it has no address for). Workers of one
 * process (the simulator's) are told apart by rank. */
#define PROBE_BACKEND "CONF_AGENT_PROBE"
#define PROBE_WORKERS_MAX 16
static const tp_backend *probe_inner;
static tp_backend probe_backend;
static tp_agent *probe_agent[PROBE_WORKERS_MAX];
static const tp_agent_ops *probe_ops[PROBE_WORKERS_MAX];

static tp_status probe_init(const tp_init_params *p, tp_agent **agent, const tp_agent_ops **ops,
                            char *errmsg, size_t errmsg_len) {
    tp_status st = probe_inner->init(p, agent, ops, errmsg, errmsg_len);
    if (st == TP_OK && p->rank < PROBE_WORKERS_MAX) {
        probe_agent[p->rank] = *agent;
        probe_ops[p->rank] = *ops;
    }
    return st;
}

/* Registers PROBE_BACKEND once per process: 1, or 0 after a failed check. */
static int probe_register(int rank) {
    const tp_backend *b = tp_lookup_backend(conf_launcher->backend);
    if (!CHECK(b != NULL))
        return 0;
    if (tp_lookup_backend(PROBE_BACKEND))
        return CHECK(probe_inner == b);
    probe_inner = b;
    probe_backend = *b;
    probe_backend.init = probe_init;
    return CHECK_OK(tp_register_backend(PROBE_BACKEND, &probe_backend));
}

/* spec: AGENT-8: a send to a rank with no address (world_size and past it)
 * is TP_EUNKNOWNWORKER at once, and the frame stays with its caller. */
static int lifecycle_agent_send_unknown_rank(int rank, int ws) {
    if (!probe_register(rank) || !CHECK(rank < PROBE_WORKERS_MAX))
        return conf_finish(rank);
    probe_agent[rank] = NULL;
    tp_options *o = conf_options();
    int up = CHECK_OK(conf_register_all()) &&
             CHECK_OK(tp_init_rpc(conf_name(rank), PROBE_BACKEND, rank, ws, o));
    tp_options_free(o);
    if (!up)
        return conf_finish(rank);
    if (!CHECK(probe_agent[rank] != NULL)) {
        tp_shutdown(0); /* up, but the wrapper never saw the agent: leave all the same */
        return conf_finish(rank);
    }
    tp_frame *f = tp_frame_alloc(TP_FRAME_HEADER_SIZE);
    const uint32_t bad[] = {(uint32_t)ws, (uint32_t)ws + 1, UINT32_MAX};
    for (size_t i = 0; f && i < sizeof bad / sizeof bad[0]; i++)
        CHECK_STATUS(probe_ops[rank]->send(probe_agent[rank], bad[i], f), TP_EUNKNOWNWORKER);
    tp_frame_free(f); /* refused: still ours */
    /* The agent goes on: a call both ways after the refusals. */
    CHECK_INT(conf_sync_int(rank, tp_to_rank((rank + 1) % ws), "add", CONF_INTS(rank, 1), -1),
              rank + 1);
    CHECK_OK(tp_shutdown(1));
    return conf_finish(rank);
}

const tp_conformance_case conf_cases_lifecycle[] = {
    {"lifecycle_init_twice", 2, lifecycle_init_twice, "INIT-1"},
    {"lifecycle_calls_before_init", 1, lifecycle_calls_before_init, "INIT-1 TIMEOUT-4 ERR-3"},
    {"lifecycle_calls_after_shutdown", 2, lifecycle_calls_after_shutdown, "INIT-1 SHUTDOWN-6"},
    {"lifecycle_reinit_after_shutdown", 2, lifecycle_reinit_after_shutdown, "INIT-1 INIT-9 FUNC-1"},
    {"lifecycle_duplicate_names", 3, lifecycle_duplicate_names, "INIT-4 INIT-5"},
    {"lifecycle_init_retry_after_failure", 2, lifecycle_init_retry_after_failure, "INIT-5 INIT-9"},
    {"lifecycle_invalid_names", 1, lifecycle_invalid_names, "INIT-2 ERR-3"},
    {"lifecycle_bad_rank_or_world_size", 1, lifecycle_bad_rank_or_world_size, "INIT-2"},
    {"lifecycle_world_size_disagree", 2, lifecycle_world_size_disagree, "INIT-4 INIT-5"},
    {"lifecycle_world_size_one", 1, lifecycle_world_size_one, "INIT-1 CALL-3 RREF-2"},
    {"lifecycle_worker_infos", 4, lifecycle_worker_infos, "CALL-2 INIT-7"},
    {"lifecycle_is_available_and_initialized", 1, lifecycle_is_available_and_initialized, "INIT-1"},
    {"lifecycle_construct_backend_options", 1, lifecycle_construct_backend_options,
     "BACKEND-3 OPT-1"},
    {"lifecycle_register_backend_duplicate", 1, lifecycle_register_backend_duplicate,
     "BACKEND-1 BACKEND-2 INIT-2"},
    {"lifecycle_agent_send_unknown_rank", 2, lifecycle_agent_send_unknown_rank, "AGENT-8"},
    {"lifecycle_register_function_duplicate", 1, lifecycle_register_function_duplicate,
     "FUNC-1 METHOD-1"},
    {"lifecycle_options", 1, lifecycle_options, "OPT-1 OPT-2 OPT-3 OPT-4 OPT-5 OPT-6"},
    {"lifecycle_unknown_option_key", 1, lifecycle_unknown_option_key, "OPT-6 INIT-2"},
    {"lifecycle_interrupt_nothing_blocked", 2, lifecycle_interrupt_nothing_blocked, "INTERRUPT-1"},
};
const size_t conf_cases_lifecycle_count =
    sizeof conf_cases_lifecycle / sizeof conf_cases_lifecycle[0];
