/*
 * test_init.c: init's warm-up on the simulator (spec/lifecycle.md INIT-8).
 * A worker that no peer can reach fails init on every worker, within the
 * init deadline and with a message naming it, instead of passing init and
 * failing the first call later.
 */
#define _GNU_SOURCE /* RTLD_NEXT, for alloc_fault.h */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "tensorplay/rpc.h"
#include "tensorplay/rpc_backend.h"
#include "tensorplay/sim.h"

#include "alloc_fault.h"
#include "common/core.h"
#include "sim_check.h"
#include "sim_wrap.h"

static tp_status statuses[2];
static char messages[2][TP_ERRMSG_LEN_MAX];
static uint64_t took_ns[2];
static int up_after[2]; /* tp_is_initialized() right after init returned */

static int program(int rank, int world_size, void *arg) {
    (void)arg;
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 0.5) == TP_OK);
    uint64_t t0 = now_ns();
    statuses[rank] = tp_init_rpc(name, "SIM", rank, world_size, o);
    took_ns[rank] = now_ns() - t0;
    snprintf(messages[rank], sizeof messages[rank], "%s", tp_errmsg());
    up_after[rank] = tp_is_initialized();
    tp_options_free(o);
    if (statuses[rank] == TP_OK)
        tp_shutdown(0);
    return 0;
}

static void run(int partitioned) {
    tp_sim_config cfg = {.hosts = 2, .seed = 5};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    if (partitioned) /* the store still works; the network between 0 and 1 does not */
        assert_int_equal(tp_sim_fault_partition(sim, 0, 1, 0, 3600 * SEC), TP_OK);
    int codes[2] = {-1, -1};
    assert_int_equal(tp_sim_run(sim, program, NULL, codes), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
}

static void test_init_warmup_reaches_every_worker(void **state) {
    (void)state;
    run(0);
    assert_int_equal(statuses[0], TP_OK);
    assert_int_equal(statuses[1], TP_OK);
}

static void test_init_unreachable_worker_fails_init_everywhere(void **state) {
    (void)state;
    run(1);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(statuses[r], TP_ETIMEDOUT);
        assert_non_null(strstr(messages[r], "cannot reach"));
        assert_true(took_ns[r] <= 600 * MS); /* within the init deadline, not later */
    }
}

/* INIT-1, INIT-9: an init that fails in its last phase (the warm-up, after the
 * worker already served peers) tears that worker down: the context is
 * uninitialized again, so a corrected init may follow. */
static void test_init_failed_warmup_leaves_worker_uninitialized(void **state) {
    (void)state;
    run(1);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(statuses[r], TP_ETIMEDOUT);
        assert_int_equal(up_after[r], 0);
    }
}

/* Rank 2 never calls init: the others' rendezvous must end at the init
 * deadline with a message naming it (INIT-6), without spinning there. */
static tp_status missing_status[3];
static char missing_msg[3][TP_ERRMSG_LEN_MAX];
static uint64_t missing_took[3];

static int missing_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (rank == 2)
        return 0; /* never joins */
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 0.5) == TP_OK);
    uint64_t t0 = now_ns();
    missing_status[rank] = tp_init_rpc(name, "SIM", rank, world_size, o);
    missing_took[rank] = now_ns() - t0;
    snprintf(missing_msg[rank], sizeof missing_msg[rank], "%s", tp_errmsg());
    tp_options_free(o);
    if (missing_status[rank] == TP_OK)
        tp_shutdown(0);
    return 0;
}

static void test_init_missing_worker_times_out(void **state) {
    (void)state;
    tp_sim_config cfg = {.hosts = 3, .seed = 9};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_run(sim, missing_program, NULL, NULL), TP_OK);
    assert_int_equal(tp_sim_violations(sim), 0); /* no busy loop at the deadline */
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(missing_status[r], TP_ETIMEDOUT);
        assert_non_null(strstr(missing_msg[r], "rank 2"));
        assert_true(missing_took[r] >= 500 * MS && missing_took[r] <= 600 * MS);
    }
}

/*
 * INIT-5's message names who is missing, from a complete look at the
 * deadline: at most 8 ranks, then how many more; a rank that came late
 * (w2 of 3, at 0.7 s of a 1 s init, after the last regular look) is not
 * named. Only w0's message is checked; the others never init or come late.
 */
#define NAMED_WORLD_MAX 11
static int named_world, named_late_rank;
static tp_status named_st;
static char named_msg[TP_ERRMSG_LEN_MAX];

static int named_program(int rank, int world_size, void *arg) {
    (void)arg;
    if (rank != 0 && rank != named_late_rank)
        return 0; /* never joins */
    if (rank != 0)
        CHECK(tp_sim_sleep(0.7) == TP_OK);
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 1.0) == TP_OK);
    tp_status st = tp_init_rpc(name, "SIM", rank, world_size, o);
    if (rank == 0) {
        named_st = st;
        snprintf(named_msg, sizeof named_msg, "%s", tp_errmsg());
    }
    tp_options_free(o);
    if (st == TP_OK)
        tp_shutdown(0);
    return 0;
}

static void run_named(int world, int late) {
    named_world = world;
    named_late_rank = late;
    named_st = TP_EINVAL;
    tp_sim_config cfg = {.hosts = (uint32_t)world, .seed = 9};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_run(sim, named_program, NULL, NULL), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(named_st, TP_ETIMEDOUT);
}

static void test_init_timeout_names_who_is_missing(void **state) {
    (void)state;
    run_named(NAMED_WORLD_MAX, -1);
    assert_non_null(strstr(named_msg, "waiting for ranks 1, 2, 3, 4, 5, 6, 7, 8 and 2 more "
                                      "(of 11 workers)"));
    run_named(3, 2);
    if (!strstr(named_msg, "waiting for rank 1 (of 3 workers)"))
        fail_msg("%s", named_msg);
}

static tp_status fn_nil(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)result, (void)user_data;
    return TP_OK;
}

/* The library's own names ("tp:...") cannot be taken by a user function. */
/* spec: INIT-1 OPT-6: no backend named means TENSORPIPE (PyTorch's default),
 * and each backend takes only its own option keys: an unknown key is refused
 * before anything starts, naming the backend and the key. */
static void test_init_backend_defaults_and_option_keys(void **state) {
    (void)state;
    tp_options *o = tp_options_new();
    assert_non_null(o);
    assert_int_equal(tp_options_set(o, "no_such_key", "1"), TP_OK);
    assert_int_equal(tp_init_rpc("w0", NULL, 0, 1, o), TP_EINVAL);
    assert_string_equal(tp_errmsg(), "backend 'TENSORPIPE' has no option 'no_such_key'");
    assert_int_equal(tp_init_rpc("w0", "SIM", 0, 1, o), TP_EINVAL);
    assert_string_equal(tp_errmsg(), "backend 'SIM' has no option 'no_such_key'");
    assert_int_equal(tp_init_rpc("w0", "NO_SUCH_BACKEND", 0, 1, o), TP_EBACKEND);
    assert_string_equal(tp_errmsg(), "no backend named 'NO_SUCH_BACKEND' is registered");
    assert_false(tp_is_initialized());
    tp_options_free(o);
    /* Every key is looked at, not only the first: two known ones, then an unknown one. */
    o = tp_options_new();
    assert_non_null(o);
    assert_int_equal(tp_options_set(o, "listen_port", "0"), TP_OK);
    assert_int_equal(tp_options_set(o, "idle_timeout", "300"), TP_OK);
    assert_int_equal(tp_options_set(o, "listen_prot", "0"), TP_OK);
    assert_int_equal(tp_init_rpc("w0", "TENSORPIPE", 0, 1, o), TP_EINVAL);
    assert_string_equal(tp_errmsg(), "backend 'TENSORPIPE' has no option 'listen_prot'");
    assert_false(tp_is_initialized());
    tp_options_free(o);
}

static void test_init_reserved_names_rejected(void **state) {
    (void)state;
    assert_int_equal(tp_register_function("tp:ping", fn_nil, NULL), TP_EINVAL);
    assert_non_null(strstr(tp_errmsg(), "reserved"));
    assert_int_equal(tp_new_method("tp:C", "m", fn_nil, NULL), TP_EINVAL);
}

/* ---- A failing store (spec/store.md STORE-9) ------------------------------ */

/* Init with a store outage planned over [0, down_ms): both workers' results. */
static tp_status store_status[2];
static char store_msg[2][TP_ERRMSG_LEN_MAX];
static uint64_t store_took[2];

static int store_program(int rank, int world_size, void *arg) {
    (void)arg;
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 1.0) == TP_OK);
    uint64_t t0 = now_ns();
    store_status[rank] = tp_init_rpc(name, "SIM", rank, world_size, o);
    store_took[rank] = now_ns() - t0;
    snprintf(store_msg[rank], sizeof store_msg[rank], "%s", tp_errmsg());
    tp_options_free(o);
    if (store_status[rank] == TP_OK)
        CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void run_store(const char *plan, tp_store *store) {
    tp_sim_config cfg = {.hosts = 2, .seed = 3, .store = store};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    char err[TP_ERRMSG_LEN_MAX];
    assert_int_equal(tp_sim_load_faults(sim, plan, err, sizeof err), TP_OK);
    assert_int_equal(tp_sim_run(sim, store_program, NULL, NULL), TP_OK);
    assert_int_equal(tp_sim_violations(sim), 0);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
}

/* An outage shorter than init's deadline delays init; it does not fail it. */
static void test_init_outlasts_store_outage(void **state) {
    (void)state;
    run_store("storedown 0 300\n", NULL);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(store_status[r], TP_OK);
        assert_true(store_took[r] >= 300 * MS && store_took[r] < 600 * MS);
    }
}

/* An outage past the deadline fails init there, saying how long and why. */
static void test_init_store_outage_past_deadline(void **state) {
    (void)state;
    run_store("storedown 0 60000\n", NULL);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(store_status[r], TP_ESTORE);
        assert_non_null(strstr(store_msg[r], "failing for 1.000 s"));
        assert_non_null(strstr(store_msg[r], "store unavailable"));
        assert_true(store_took[r] >= 1000 * MS && store_took[r] <= 1000 * MS + TOL_NS);
    }
}

/* A slow store (each operation 20 ms) makes init slower, nothing else; the
 * simulator asserts that no store operation is made under the core's lock. */
static void test_init_slow_store(void **state) {
    (void)state;
    run_store("storeslow 0 100000 20\n", NULL);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(store_status[r], TP_OK);
        assert_true(store_took[r] >= 100 * MS);
    }
}

/*
 * A store whose create-if-absent writes happen but whose replies are lost
 * (a store server that applied the write, then lost the connection): the
 * retry finds the key holding this worker's own value, and takes it as its
 * own instead of reporting "rank claimed twice".
 */
typedef struct lossy_store {
    tp_store base; /* first */
    tp_store *inner;
    int lost; /* replies lost so far */
} lossy_store;

static tp_status lossy_set(tp_store *s, const char *key, const void *value, size_t len) {
    tp_store *in = ((lossy_store *)s)->inner;
    return in->ops->set(in, key, value, len);
}
static tp_status lossy_get(tp_store *s, const char *key, void **value, size_t *len) {
    tp_store *in = ((lossy_store *)s)->inner;
    return in->ops->get(in, key, value, len);
}
static tp_status lossy_add(tp_store *s, const char *key, int64_t delta, int64_t *result) {
    tp_store *in = ((lossy_store *)s)->inner;
    return in->ops->add(in, key, delta, result);
}
static tp_status lossy_cas(tp_store *s, const char *key, const void *expected, size_t elen,
                           const void *desired, size_t dlen, int *swapped) {
    lossy_store *ls = (lossy_store *)s;
    tp_status st = ls->inner->ops->compare_set(ls->inner, key, expected, elen, desired, dlen,
                                               swapped);
    if (st == TP_OK && *swapped && !expected) {
        ls->lost++;
        snprintf(s->errmsg, sizeof s->errmsg, "compare_set '%s': the reply was lost", key);
        return TP_ESTORE; /* written, but the caller cannot know */
    }
    return st;
}
static tp_status lossy_del(tp_store *s, const char *key) {
    tp_store *in = ((lossy_store *)s)->inner;
    return in->ops->del(in, key);
}
static tp_status meddle_cas_plain(tp_store *s, const char *key, const void *expected, size_t elen,
                                  const void *desired, size_t dlen, int *swapped) {
    tp_store *in = ((lossy_store *)s)->inner;
    return in->ops->compare_set(in, key, expected, elen, desired, dlen, swapped);
}
static void lossy_close(tp_store *s) {
    lossy_store *ls = (lossy_store *)s;
    ls->inner->ops->close(ls->inner);
    free(ls);
}
static const tp_store_ops lossy_ops = {
    .api_version = TP_BACKEND_API_VERSION,
    .set = lossy_set,
    .get = lossy_get,
    .add = lossy_add,
    .compare_set = lossy_cas,
    .del = lossy_del,
    .close = lossy_close,
};

static void test_init_store_lost_replies(void **state) {
    (void)state;
    lossy_store *ls = calloc(1, sizeof *ls);
    assert_non_null(ls);
    ls->base.ops = &lossy_ops;
    assert_int_equal(tp_sqlite_store_open(":memory:", &ls->inner, NULL, 0), TP_OK);
    run_store("", &ls->base);
    assert_true(ls->lost >= 6); /* world size, rank and name, on each worker */
    for (int r = 0; r < 2; r++) {
        assert_int_equal(store_status[r], TP_OK);
        assert_string_equal(store_msg[r], "");
    }
    lossy_close(&ls->base);
}

/* spec: INIT-4, INIT-5: a rank's entry that the store hands back
 * malformed (here its credit is not a number) fails init with TP_ESTORE
 * naming that rank, on every worker, rather than being taken half read. */
static tp_status bent_get(tp_store *s, const char *key, void **value, size_t *len) {
    tp_store *in = ((lossy_store *)s)->inner;
    tp_status st = in->ops->get(in, key, value, len);
    size_t kl = strlen(key);
    if (st == TP_OK && kl >= 11 && strcmp(key + kl - 11, "init/rank/1") == 0) {
        char *tab = memchr(*value, '\t', *len);
        if (tab && tab + 1 < (char *)*value + *len)
            tab[1] = 'x';
    }
    return st;
}

static const tp_store_ops bent_ops = {
    .api_version = TP_BACKEND_API_VERSION,
    .set = lossy_set,
    .get = bent_get,
    .add = lossy_add,
    .compare_set = meddle_cas_plain,
    .del = lossy_del,
    .close = lossy_close,
};

static void test_init_malformed_rank_entry_fails_init(void **state) {
    (void)state;
    lossy_store *ls = calloc(1, sizeof *ls);
    assert_non_null(ls);
    ls->base.ops = &bent_ops;
    assert_int_equal(tp_sqlite_store_open(":memory:", &ls->inner, NULL, 0), TP_OK);
    run_store("", &ls->base);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(store_status[r], TP_ESTORE);
        if (!strstr(store_msg[r], "rank 1's entry in the store is malformed"))
            fail_msg("worker %d: '%s'", r, store_msg[r]);
    }
    lossy_close(&ls->base);
    assert_int_equal(tp_core_live_count(), 0);
}

/* spec: INIT-5, STORE-9: an init outcome the store will not take is tried
 * for OUTCOME_GRACE (5 s), then init fails with the store's error: rank 0
 * times out waiting for rank 1 (which never inits) at 1 s, and its
 * "init/error" compare-and-set fails for good. */
static tp_status refusing_cas(tp_store *s, const char *key, const void *expected, size_t elen,
                              const void *desired, size_t dlen, int *swapped) {
    size_t kl = strlen(key);
    if (kl >= 10 && strcmp(key + kl - 10, "init/error") == 0) {
        *swapped = 0;
        snprintf(s->errmsg, sizeof s->errmsg, "compare_set '%s': the store is read-only", key);
        return TP_ESTORE;
    }
    tp_store *in = ((lossy_store *)s)->inner;
    return in->ops->compare_set(in, key, expected, elen, desired, dlen, swapped);
}

static const tp_store_ops refusing_ops = {
    .api_version = TP_BACKEND_API_VERSION,
    .set = lossy_set,
    .get = lossy_get,
    .add = lossy_add,
    .compare_set = refusing_cas,
    .del = lossy_del,
    .close = lossy_close,
};

static int lone_program(int rank, int world_size, void *arg) {
    if (rank == 0)
        return store_program(rank, world_size, arg);
    return 0; /* rank 1 never inits */
}

static void test_init_outcome_the_store_refuses_ends_at_its_grace(void **state) {
    (void)state;
    lossy_store *ls = calloc(1, sizeof *ls);
    assert_non_null(ls);
    ls->base.ops = &refusing_ops;
    assert_int_equal(tp_sqlite_store_open(":memory:", &ls->inner, NULL, 0), TP_OK);
    tp_sim_config cfg = {
        .hosts = 2, .seed = 3, .store = &ls->base, .time_limit_ns = 600 * 1000000000ull};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_run(sim, lone_program, NULL, NULL), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    assert_int_equal(store_status[0], TP_ESTORE);
    if (!strstr(store_msg[0], "failing for 5.0") || !strstr(store_msg[0], "read-only"))
        fail_msg("'%s'", store_msg[0]);
    assert_true(store_took[0] >= 6000 * MS && store_took[0] < 6500 * MS);
    lossy_close(&ls->base);
    assert_int_equal(tp_core_live_count(), 0);
}

/* spec: AGENT-4, INIT-5: a worker whose agent refuses the table of peer
 * addresses fails its init saying so, and publishes that as the attempt's
 * outcome: the other worker fails at once with the same status and words,
 * instead of waiting out its init timeout for a worker that is gone. A
 * wrapper backend ("SIM_NOPEERS") makes rank 1's agent refuse. */
static tp_agent *refusing_agent; /* rank 1's */

static tp_status refusing_set_peers(tp_agent *a, const char *const *addrs, uint32_t n, char *errmsg,
                                    size_t errmsg_len) {
    if (a == refusing_agent) {
        snprintf(errmsg, errmsg_len, "test refuses");
        return TP_EINVAL;
    }
    return sim_ops->set_peers(a, addrs, n, errmsg, errmsg_len);
}

static tp_status refusing_set_peers_id(tp_agent *a, const char *const *addrs, uint32_t n,
                                       uint64_t id, char *errmsg, size_t errmsg_len) {
    if (a == refusing_agent) {
        snprintf(errmsg, errmsg_len, "test refuses");
        return TP_EINVAL;
    }
    return sim_ops->set_peers_id(a, addrs, n, id, errmsg, errmsg_len);
}

static void wrap_ops_edit(const tp_init_params *p, tp_agent *agent, tp_agent_ops *ops) {
    if (p->rank == 1)
        refusing_agent = agent;
    ops->set_peers = refusing_set_peers;
    if (ops->set_peers_id)
        ops->set_peers_id = refusing_set_peers_id;
}

static tp_status nopeers_st[2];
static char nopeers_msg[2][TP_ERRMSG_LEN_MAX];
static uint64_t nopeers_took[2];

static int nopeers_program(int rank, int world_size, void *arg) {
    (void)arg;
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 30.0) == TP_OK);
    uint64_t t0 = now_ns();
    nopeers_st[rank] = tp_init_rpc(name, "SIM_NOPEERS", rank, world_size, o);
    nopeers_took[rank] = now_ns() - t0;
    snprintf(nopeers_msg[rank], sizeof nopeers_msg[rank], "%s", tp_errmsg());
    tp_options_free(o);
    if (nopeers_st[rank] == TP_OK)
        (void)tp_shutdown(0);
    return 0;
}

static void test_init_peer_table_refused_fails_init_everywhere(void **state) {
    (void)state;
    refusing_agent = NULL;
    tp_sim_config cfg = {.hosts = 2, .seed = 3};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_run(sim, nopeers_program, NULL, NULL), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(nopeers_st[r], TP_EINVAL);
        if (!strstr(nopeers_msg[r], "worker 'w1' could not take the peer addresses: test refuses"))
            fail_msg("worker %d: '%s'", r, nopeers_msg[r]);
        assert_true(nopeers_took[r] < 1000 * MS); /* not its 30 s init timeout */
    }
    assert_int_equal(tp_core_live_count(), 0);
}

/* spec: INIT-1: shutdown while this worker's init is still in progress (at
 * its ready barrier, from the store operation init makes there) is refused
 * with TP_ENOTINIT saying so; init then completes, and every core is freed
 * at the end (the refusal took no reference it did not give back). */
static tp_status meddle_st[4];
static char meddle_msg[4][TP_ERRMSG_LEN_MAX];
static int meddled;

static tp_status meddle_cas(tp_store *s, const char *key, const void *expected, size_t elen,
                            const void *desired, size_t dlen, int *swapped) {
    lossy_store *ls = (lossy_store *)s;
    if (strstr(key, "init/ready") && meddled < 4) {
        meddle_st[meddled] = tp_shutdown(1);
        snprintf(meddle_msg[meddled], sizeof meddle_msg[meddled], "%s", tp_errmsg());
        meddled++;
    }
    return ls->inner->ops->compare_set(ls->inner, key, expected, elen, desired, dlen, swapped);
}

static const tp_store_ops meddle_ops = {
    .api_version = TP_BACKEND_API_VERSION,
    .set = lossy_set,
    .get = lossy_get,
    .add = lossy_add,
    .compare_set = meddle_cas,
    .del = lossy_del,
    .close = lossy_close,
};

static void test_init_shutdown_during_init_refused(void **state) {
    (void)state;
    lossy_store *ls = calloc(1, sizeof *ls);
    assert_non_null(ls);
    ls->base.ops = &meddle_ops;
    assert_int_equal(tp_sqlite_store_open(":memory:", &ls->inner, NULL, 0), TP_OK);
    meddled = 0;
    run_store("", &ls->base);
    assert_int_equal(meddled, 2); /* once on each worker */
    for (int i = 0; i < meddled; i++) {
        assert_int_equal(meddle_st[i], TP_ENOTINIT);
        assert_string_equal(meddle_msg[i],
                            "shutdown: rpc init is still in progress on this worker");
    }
    for (int r = 0; r < 2; r++)
        assert_int_equal(store_status[r], TP_OK);
    lossy_close(&ls->base);
    assert_int_equal(tp_core_live_count(), 0);
}

/* spec: lifecycle.md (TP_EALREADY): a shutdown called while this worker's
 * graceful shutdown is in progress (here from the store operation its
 * barrier makes) is refused with TP_EALREADY naming the worker, and the
 * first one completes; every core is freed at the end. */
static tp_status again_st[4];
static char again_msg[4][TP_ERRMSG_LEN_MAX];
static int agained;

static tp_status again_cas(tp_store *s, const char *key, const void *expected, size_t elen,
                           const void *desired, size_t dlen, int *swapped) {
    lossy_store *ls = (lossy_store *)s;
    if (strstr(key, "sd/arrive") && agained < 4) {
        int i = agained++;
        again_st[i] = tp_shutdown(1);
        snprintf(again_msg[i], sizeof again_msg[i], "%s", tp_errmsg());
    }
    return ls->inner->ops->compare_set(ls->inner, key, expected, elen, desired, dlen, swapped);
}

static const tp_store_ops again_ops = {
    .api_version = TP_BACKEND_API_VERSION,
    .set = lossy_set,
    .get = lossy_get,
    .add = lossy_add,
    .compare_set = again_cas,
    .del = lossy_del,
    .close = lossy_close,
};

static void test_init_shutdown_during_shutdown_refused(void **state) {
    (void)state;
    lossy_store *ls = calloc(1, sizeof *ls);
    assert_non_null(ls);
    ls->base.ops = &again_ops;
    assert_int_equal(tp_sqlite_store_open(":memory:", &ls->inner, NULL, 0), TP_OK);
    agained = 0;
    run_store("", &ls->base);     /* each worker's own shutdown returns TP_OK (CHECK) */
    assert_int_equal(agained, 2); /* once on each worker */
    for (int i = 0; i < agained; i++) {
        assert_int_equal(again_st[i], TP_EALREADY);
        if (!strstr(again_msg[i], "shutdown: already in progress on worker 'w"))
            fail_msg("%s", again_msg[i]);
    }
    for (int r = 0; r < 2; r++)
        assert_int_equal(store_status[r], TP_OK);
    lossy_close(&ls->base);
    assert_int_equal(tp_core_live_count(), 0);
}

/* spec: INIT-9: an init whose backend cannot start (here: a second worker
 * context on a host that already runs a started worker) leaves the context
 * as it was, so the next init is refused for the same reason, not as
 * "already in progress". */
static tp_status dead_st[2];
static char dead_msg[2][TP_ERRMSG_LEN_MAX];

static int program_dead_host(int rank, int world_size, void *arg) {
    (void)arg;
    CHECK(tp_init_rpc(rank ? "w1" : "w0", "SIM", rank, world_size, NULL) == TP_OK);
    if (rank == 1) {
        tp_context *mine = tp_context_current();
        tp_context *other = tp_context_new();
        tp_context_switch(other, NULL);
        for (int i = 0; i < 2; i++) { /* no wait happens before start fails */
            dead_st[i] = tp_init_rpc("x", "SIM", 0, 1, NULL);
            snprintf(dead_msg[i], sizeof dead_msg[i], "%s", tp_errmsg());
        }
        CHECK(!tp_is_initialized());
        tp_context_switch(mine, NULL);
        tp_context_free(other);
    }
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_init_backend_start_failure_cleans_up(void **state) {
    (void)state;
    tp_sim_config cfg = {.hosts = 2, .seed = 1};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_run(sim, program_dead_host, NULL, NULL), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(dead_st[i], TP_EBACKEND);
        if (!strstr(dead_msg[i], "could not start"))
            print_error("init %d: %s\n", i, dead_msg[i]);
        assert_non_null(strstr(dead_msg[i], "could not start"));
    }
}

/*
 * INIT-5, INIT-6: w0 times out waiting for w1 (init_timeout 0.5 s) and
 * publishes that outcome; w1 comes 1 s late with a 10 s init_timeout. Its
 * claims succeed, and its first look at the store finds the outcome: it fails
 * at once with TP_ETIMEDOUT "init: <w0's message>", not at its own deadline
 * (nor after waiting for a ready key w0 never writes).
 */
static tp_status late_status[2];
static char late_msg[2][TP_ERRMSG_LEN_MAX];
static uint64_t late_took[2];

static int late_program(int rank, int world_size, void *arg) {
    (void)arg;
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    if (rank == 1)
        CHECK(tp_sim_sleep(1.0) == TP_OK);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, rank == 0 ? 0.5 : 10.0) == TP_OK);
    uint64_t t0 = now_ns();
    late_status[rank] = tp_init_rpc(name, "SIM", rank, world_size, o);
    late_took[rank] = now_ns() - t0;
    snprintf(late_msg[rank], sizeof late_msg[rank], "%s", tp_errmsg());
    tp_options_free(o);
    if (late_status[rank] == TP_OK)
        tp_shutdown(0);
    return 0;
}

static void test_init_late_worker_told_of_timeout(void **state) {
    (void)state;
    tp_sim_config cfg = {.hosts = 2, .seed = 12};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_run(sim, late_program, NULL, NULL), TP_OK);
    assert_int_equal(tp_sim_violations(sim), 0);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    for (int r = 0; r < 2; r++)
        print_message("w%d: %s after %.3f ms: %s\n", r, tp_status_name(late_status[r]),
                      (double)late_took[r] / 1e6, late_msg[r]);
    assert_int_equal(late_status[0], TP_ETIMEDOUT);
    assert_non_null(strstr(late_msg[0], "timed out waiting for rank 1"));
    assert_true(late_took[0] >= 500 * MS && late_took[0] <= 600 * MS);
    assert_int_equal(late_status[1], TP_ETIMEDOUT);
    assert_non_null(strstr(late_msg[1], "init: "));
    assert_null(strstr(late_msg[1], "init: init: ")); /* the stored text says it once */
    assert_non_null(strstr(late_msg[1], "timed out waiting for rank 1"));
    assert_true(late_took[1] < 100 * MS); /* its first look, not its 10 s deadline */
}

/* ---- One parse per process (STORE-13) --------------------------------------- */

enum { SHARED_WORLD = 64 };
static int shared_inits;

static int shared_program(int rank, int world_size, void *arg) {
    (void)arg;
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    if (tp_init_rpc(name, "SIM", rank, world_size, NULL) != TP_OK)
        return 1;
    shared_inits++; /* the simulator runs one task at a time */
    return tp_shutdown(1) == TP_OK ? 0 : 1;
}

/*
 * The workers of a simulated world read the same rank entries from the
 * store; those a table of this process already holds are matched, not
 * copied, so a world of n workers copies about n entries, not n^2 (each
 * worker parsing all of them: 4,096 here).
 */
static void shared_parse(tp_store *store) {
    tp_sim_config cfg = {.hosts = SHARED_WORLD, .seed = 3, .store = store};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    int codes[SHARED_WORLD];
    shared_inits = 0;
    uint64_t before = tpi_rendezvous_rows_copied();
    assert_int_equal(tp_sim_run(sim, shared_program, NULL, codes), TP_OK);
    tp_sim_free(sim);
    uint64_t copied = tpi_rendezvous_rows_copied() - before;
    assert_int_equal(shared_inits, SHARED_WORLD);
    for (int r = 0; r < SHARED_WORLD; r++)
        assert_int_equal(codes[r], 0);
    fprintf(stderr, "a world of %d copied %llu rank entries\n", SHARED_WORLD,
            (unsigned long long)copied);
    assert_true(copied >= SHARED_WORLD);
    assert_true(copied <= 4 * SHARED_WORLD);
}

static void test_init_world_shares_one_parse_of_the_entries(void **state) {
    (void)state;
    /* The simulator's store names its instance: a later worker takes the
     * table its instance's scan made without scanning. */
    shared_parse(NULL);
    /* A store that does not (SQLite's): each worker scans, and matches what
     * it reads against the table made first. */
    tp_store *store = NULL;
    char err[TP_ERRMSG_LEN_MAX];
    assert_int_equal(tp_sqlite_store_open(":memory:", &store, err, sizeof err), TP_OK);
    shared_parse(store);
    store->ops->close(store);
}

/* ---- Two worlds of one shape at once (STORE-13) ------------------------------ */

/*
 * Two simulated worlds in two threads of one process, the same size and
 * generation: while every worker of the first holds its table (rank 0
 * stopped mid-job), the second inits. The table shared by the workers of a
 * world must be that world's (its store's instance), or the second world's
 * workers would take the first's names and addresses. With the same names
 * and every rank on another host (its address another), the second world's
 * workers share the first's table of names (the same names and credits)
 * but must route by their own entries.
 */
enum { TWIN_WORLD = 4 };

typedef struct twin {
    char prefix;                    /* names are "<prefix><rank>" */
    int hold;                       /* the first world: rank 0 waits for the second */
    int reversed;                   /* host h is rank TWIN_WORLD - 1 - h (else rank h) */
    int sqlite;                     /* its own SQLite store (no instance: STORE-13) */
    char seen[TWIN_WORLD][TWIN_WORLD][TP_NAME_LEN_MAX + 1]; /* by rank: the names it saw */
    tp_status init_st[TWIN_WORLD], call_st[TWIN_WORLD];
    tp_status run_st;
} twin;

static pthread_mutex_t twin_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t twin_cv = PTHREAD_COND_INITIALIZER;
static int twin_first_up, twin_second_done;

/* Waits (real time, 60 s at most) until *flag; 0 when it timed out. */
static int twin_wait(const int *flag) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    pthread_mutex_lock(&twin_mu);
    int rc = 0;
    while (!*flag && rc == 0)
        rc = pthread_cond_timedwait(&twin_cv, &twin_mu, &until);
    int ok = *flag;
    pthread_mutex_unlock(&twin_mu);
    return ok;
}

static void twin_set(int *flag) {
    pthread_mutex_lock(&twin_mu);
    *flag = 1;
    pthread_cond_broadcast(&twin_cv);
    pthread_mutex_unlock(&twin_mu);
}

/* Answers the callee's own name. */
static tp_status fn_whoami(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)user_data;
    tp_worker_info me;
    if (tp_get_worker_info(NULL, &me) != TP_OK)
        return TP_EINVAL;
    *result = tp_value_str(me.name);
    return *result ? TP_OK : TP_ENOMEM;
}

static int twin_program(int host, int world_size, void *arg) {
    twin *t = arg;
    int rank = t->reversed ? world_size - 1 - host : host;
    char name[8];
    snprintf(name, sizeof name, "%c%d", t->prefix, rank);
    (void)tp_register_function("whoami", fn_whoami, NULL);
    t->init_st[rank] = tp_init_rpc(name, "SIM", rank, world_size, NULL);
    if (t->init_st[rank] != TP_OK)
        return 1;
    for (int r = 0; r < world_size; r++) {
        tp_worker_info info;
        char want[16];
        snprintf(want, sizeof want, "%c%d", t->prefix, r);
        if (tp_get_worker_info(want, &info) == TP_OK && info.id == (uint32_t)r)
            snprintf(t->seen[rank][r], sizeof t->seen[rank][r], "%s", info.name);
    }
    /* A call to the next rank: its address must be this world's. */
    char next[16];
    snprintf(next, sizeof next, "%c%d", t->prefix, (rank + 1) % world_size);
    tp_value *res = NULL;
    t->call_st[rank] = tp_rpc_sync(tp_to_name(next), "whoami", NULL, NULL, 10.0, &res);
    const char *who = NULL;
    size_t len = 0;
    if (t->call_st[rank] == TP_OK && (tp_value_get_str(res, &who, &len) != TP_OK ||
                                      len != strlen(next) || memcmp(who, next, len) != 0))
        t->call_st[rank] = TP_EPROTO; /* another world's worker answered */
    tp_value_free(res);
    if (t->hold && rank == 0) { /* every worker here is up and holds the table */
        twin_set(&twin_first_up);
        (void)twin_wait(&twin_second_done);
    }
    return tp_shutdown(1) == TP_OK ? 0 : 1;
}

static void *twin_run(void *arg) {
    twin *t = arg;
    tp_sim_config cfg = {.hosts = TWIN_WORLD, .seed = 5};
    tp_store *store = NULL;
    if (t->sqlite && (t->run_st = tp_sqlite_store_open(":memory:", &store, NULL, 0)) != TP_OK)
        return NULL;
    cfg.store = store;
    tp_sim *sim = NULL;
    t->run_st = tp_sim_new(&cfg, &sim);
    if (t->run_st == TP_OK)
        t->run_st = tp_sim_run(sim, twin_program, t, NULL);
    tp_sim_free(sim);
    if (store)
        store->ops->close(store);
    return NULL;
}

static void run_twins(twin *first, twin *second) {
    twin_first_up = twin_second_done = 0;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, twin_run, first), 0);
    int up = twin_wait(&twin_first_up);
    if (up)
        twin_run(second);
    twin_set(&twin_second_done);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_true(up);
    const twin *worlds[] = {first, second};
    for (int w = 0; w < 2; w++) {
        const twin *t = worlds[w];
        assert_int_equal(t->run_st, TP_OK);
        for (int rank = 0; rank < TWIN_WORLD; rank++) {
            assert_int_equal(t->init_st[rank], TP_OK);
            assert_int_equal(t->call_st[rank], TP_OK);
            for (int r = 0; r < TWIN_WORLD; r++) {
                char want[16];
                snprintf(want, sizeof want, "%c%d", t->prefix, r);
                assert_string_equal(t->seen[rank][r], want);
            }
        }
    }
}

static void test_init_two_worlds_at_once_keep_their_own_tables(void **state) {
    (void)state;
    static twin first = {.prefix = 'a', .hold = 1}, second = {.prefix = 'b'};
    run_twins(&first, &second);
}

/* STORE-13: stores with no instance number (SQLite, etcd) name no keys
 * another store shares: two worlds of one shape, each on its own SQLite
 * store, never take each other's tables. */
static void test_init_two_worlds_on_stores_without_instance(void **state) {
    (void)state;
    static twin first = {.prefix = 'a', .hold = 1, .sqlite = 1},
                second = {.prefix = 'b', .sqlite = 1};
    run_twins(&first, &second);
}

static void test_init_two_worlds_of_one_names_route_by_their_own(void **state) {
    (void)state;
    static twin first = {.prefix = 'a', .hold = 1}, second = {.prefix = 'a', .reversed = 1};
    run_twins(&first, &second);
}

/*
 * INIT-4: names need not sort as their ranks do. Each worker finds every
 * other by name (the table sorted by name, a merge sort whose halves
 * interleave) and a call by name reaches the worker of that name.
 */
enum { ODD_WORLD = 7 };
static const char *const odd_names[ODD_WORLD] = {"zeta",    "trainer",  "ps",  "alpha",
                                                 "worker9", "worker10", "beta"};
static int odd_found[ODD_WORLD], odd_called[ODD_WORLD];

static int odd_program(int host, int world_size, void *arg) {
    (void)arg;
    (void)tp_register_function("whoami", fn_whoami, NULL);
    if (tp_init_rpc(odd_names[host], "SIM", host, world_size, NULL) != TP_OK)
        return 1;
    for (int r = 0; r < world_size; r++) {
        tp_worker_info info;
        odd_found[host] += tp_get_worker_info(odd_names[r], &info) == TP_OK &&
                           info.id == (uint32_t)r && strcmp(info.name, odd_names[r]) == 0;
    }
    const char *next = odd_names[(host + 1) % world_size];
    tp_value *res = NULL;
    const char *who = NULL;
    size_t len = 0;
    odd_called[host] = tp_rpc_sync(tp_to_name(next), "whoami", NULL, NULL, 10.0, &res) == TP_OK &&
                       tp_value_get_str(res, &who, &len) == TP_OK && len == strlen(next) &&
                       memcmp(who, next, len) == 0;
    tp_value_free(res);
    return tp_shutdown(1) == TP_OK ? 0 : 1;
}

static void test_init_names_in_any_order_are_found(void **state) {
    (void)state;
    tp_sim_config cfg = {.hosts = ODD_WORLD, .seed = 9};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    int codes[ODD_WORLD];
    assert_int_equal(tp_sim_run(sim, odd_program, NULL, codes), TP_OK);
    tp_sim_free(sim);
    for (int r = 0; r < ODD_WORLD; r++) {
        assert_int_equal(codes[r], 0);
        assert_int_equal(odd_found[r], ODD_WORLD);
        assert_int_equal(odd_called[r], 1);
    }
}

/*
 * Messages name a worker of the world by name and id, and any other id by
 * its number alone (tpi_worker_desc): an id describes a frame or rref before
 * it is refused, and the world's table has world_size entries.
 */
enum { DESC_IDS = 4 };
static char desc_seen[DESC_IDS][TP_NAME_LEN_MAX + 32];

static int desc_program(int host, int world_size, void *arg) {
    (void)arg;
    char name[8];
    snprintf(name, sizeof name, "d%d", host);
    if (tp_init_rpc(name, "SIM", host, world_size, NULL) != TP_OK)
        return 1;
    if (host == 0) {
        const tp_core *c = tp_context_current()->core;
        const uint32_t ids[DESC_IDS] = {0, 1, 2, UINT32_MAX};
        for (int i = 0; i < DESC_IDS; i++)
            tpi_worker_desc(c, ids[i], desc_seen[i], sizeof desc_seen[i]);
    }
    return tp_shutdown(1) == TP_OK ? 0 : 1;
}

static void test_init_worker_described_by_name_only_inside_the_world(void **state) {
    (void)state;
    tp_sim_config cfg = {.hosts = 2, .seed = 3};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    int codes[2] = {-1, -1};
    assert_int_equal(tp_sim_run(sim, desc_program, NULL, codes), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    assert_string_equal(desc_seen[0], "worker 'd0' (id 0)");
    assert_string_equal(desc_seen[1], "worker 'd1' (id 1)");
    assert_string_equal(desc_seen[2], "worker id 2");
    assert_string_equal(desc_seen[3], "worker id 4294967295");
}

/*
 * AGENT-19: the simulator checks a shared list of addresses once per list
 * id. A re-init is a new table with a new id: here the two hosts swap
 * ranks for the second world (host h is rank h, then rank 1 - h), so every
 * rank moved host. An agent that took the first world's check for the
 * second's would route rank r to host r, its old host, and a call to the
 * other worker would reach the caller itself.
 */
#define SWAP_WORLD 2
static struct {
    tp_status init_st[2][SWAP_WORLD]; /* [world][host] */
    tp_status call_st[2][SWAP_WORLD];
    int answered_by[2][SWAP_WORLD];   /* the host that served the call */
} swap;

static tp_status fn_host(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)user_data;
    *result = tp_value_int(tp_sim_current_host());
    return *result ? TP_OK : TP_ENOMEM;
}

static int swap_program(int host, int world_size, void *arg) {
    (void)arg;
    (void)tp_register_function("host", fn_host, NULL);
    for (int w = 0; w < 2; w++) {
        int rank = w == 0 ? host : world_size - 1 - host;
        char name[8], other[8];
        snprintf(name, sizeof name, "w%d", rank);
        snprintf(other, sizeof other, "w%d", world_size - 1 - rank);
        swap.init_st[w][host] = tp_init_rpc(name, "SIM", rank, world_size, NULL);
        if (swap.init_st[w][host] != TP_OK)
            return 1;
        tp_value *res = NULL;
        int64_t by = -1;
        swap.call_st[w][host] = tp_rpc_sync(tp_to_name(other), "host", NULL, NULL, 10.0, &res);
        if (swap.call_st[w][host] == TP_OK && tp_value_get_int(res, &by) != TP_OK)
            swap.call_st[w][host] = TP_EPROTO;
        swap.answered_by[w][host] = (int)by;
        tp_value_free(res);
        if (tp_shutdown(1) != TP_OK)
            return 1;
    }
    return 0;
}

static void test_init_again_with_ranks_swapped_routes_to_the_new_hosts(void **state) {
    (void)state;
    memset(&swap, 0, sizeof swap);
    tp_sim_config cfg = {.hosts = SWAP_WORLD, .seed = 7};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    int codes[SWAP_WORLD] = {-1, -1};
    assert_int_equal(tp_sim_run(sim, swap_program, NULL, codes), TP_OK);
    assert_int_equal(tp_sim_violations(sim), 0);
    tp_sim_free(sim);
    for (int w = 0; w < 2; w++)
        for (int h = 0; h < SWAP_WORLD; h++) {
            assert_int_equal(swap.init_st[w][h], TP_OK);
            assert_int_equal(swap.call_st[w][h], TP_OK);
            assert_int_equal(swap.answered_by[w][h], SWAP_WORLD - 1 - h); /* the other host */
        }
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
}

/*
 * Init with no memory for the core's table of dead peers (a calloc of
 * world_size bytes): init fails with TP_ENOMEM, saying so, the worker stays
 * uninitialized, what the core had made is freed, and the next init works.
 * One worker: another would wait for this one in the failed generation.
 */
#define OOM_WORLD 1
static tp_status oom_first_st;
static char oom_first_msg[TP_ERRMSG_LEN_MAX];
static int oom_first_up, oom_first_failed;

static int oom_init_program(int rank, int world_size, void *arg) {
    (void)arg;
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    if (rank == 0) { /* no task switch until init returns */
        atomic_store(&calloc_pair_failed, 0);
        atomic_store(&calloc_fail_size, 1);
        atomic_store(&calloc_fail_n, OOM_WORLD);
        oom_first_st = tp_init_rpc(name, "SIM", rank, world_size, NULL);
        atomic_store(&calloc_fail_n, 0);
        oom_first_failed = (int)atomic_load(&calloc_pair_failed);
        snprintf(oom_first_msg, sizeof oom_first_msg, "%s", tp_errmsg());
        oom_first_up = tp_is_initialized();
    }
    CHECK(tp_init_rpc(name, "SIM", rank, world_size, NULL) == TP_OK);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_init_without_memory_for_the_core(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) /* under valgrind, or not GCC */
        skip();
    tp_sim_config cfg = {.hosts = OOM_WORLD, .seed = 5};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    int codes[OOM_WORLD] = {-1};
    assert_int_equal(tp_sim_run(sim, oom_init_program, NULL, codes), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    for (int r = 0; r < OOM_WORLD; r++)
        assert_int_equal(codes[r], 0);
    assert_int_equal(oom_first_failed, 1);
    assert_int_equal(oom_first_st, TP_ENOMEM);
    assert_string_equal(oom_first_msg, "init: out of memory");
    assert_false(oom_first_up);
}

/*
 * INIT-6: the scan of the rank entries copies them into one growing block;
 * when it cannot grow (realloc fails: a name of TP_NAME_LEN_MAX characters
 * makes an entry longer than the block's first size), init fails with
 * TP_ENOMEM saying so, the worker stays uninitialized, and the next init
 * works. Never a fall back on the slower read as though the store had
 * miscounted. One worker, as above.
 */
static tp_status rows_oom_st;
static char rows_oom_msg[TP_ERRMSG_LEN_MAX];
static int rows_oom_up, rows_oom_failed;

static int rows_oom_program(int rank, int world_size, void *arg) {
    (void)arg;
    char name[TP_NAME_LEN_MAX + 1];
    memset(name, 'n', TP_NAME_LEN_MAX);
    name[TP_NAME_LEN_MAX] = '\0';
    atomic_store(&realloc_failed, 0);
    atomic_store(&realloc_fail_min,
                 TP_NAME_LEN_MAX + 13); /* the entry, not the agent table (128) */
    rows_oom_st = tp_init_rpc(name, "SIM", rank, world_size, NULL);
    atomic_store(&realloc_fail_min, 0);
    rows_oom_failed = (int)atomic_load(&realloc_failed);
    snprintf(rows_oom_msg, sizeof rows_oom_msg, "%s", tp_errmsg());
    rows_oom_up = tp_is_initialized();
    CHECK(tp_init_rpc(name, "SIM", rank, world_size, NULL) == TP_OK);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_init_without_memory_for_the_rank_entries(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) /* under valgrind, or not GCC */
        skip();
    tp_sim_config cfg = {.hosts = 1, .seed = 9};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    int codes[1] = {-1};
    assert_int_equal(tp_sim_run(sim, rows_oom_program, NULL, codes), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    assert_int_equal(codes[0], 0);
    assert_true(rows_oom_failed >= 1);
    assert_int_equal(rows_oom_st, TP_ENOMEM);
    assert_string_equal(rows_oom_msg, "init: out of memory for 1 workers");
    assert_false(rows_oom_up);
}

/*
 * Init with each of its allocations failing in turn (alloc_countdown k =
 * 1, 2, ... until an init needs fewer than k): every failed init returns a
 * status with a message and leaves the worker uninitialized, and the next
 * init works; nothing it made is left behind (LeakSanitizer: the sanitizer
 * build's test run and scripts/mutate.py's). One worker, as above.
 */
static int sweep_fails, sweep_inits, sweep_bad, sweep_bad_up;
static char sweep_bad_msg[TP_ERRMSG_LEN_MAX];

static int oom_sweep_program(int rank, int world_size, void *arg) {
    (void)arg;
    for (long k = 1; k < 4000; k++) {
        atomic_store(&alloc_countdown_fired, 0);
        atomic_store(&alloc_countdown, k);
        tp_status st = tp_init_rpc("w0", "SIM", rank, world_size, NULL);
        atomic_store(&alloc_countdown, 0);
        int fired = atomic_load(&alloc_countdown_fired);
        sweep_inits++;
        if (st != TP_OK) {
            sweep_fails++;
            if ((tp_is_initialized() || !tp_errmsg()[0]) && !sweep_bad) {
                sweep_bad = (int)k;
                sweep_bad_up = tp_is_initialized();
                snprintf(sweep_bad_msg, sizeof sweep_bad_msg, "%s", tp_errmsg());
            }
            CHECK(tp_init_rpc("w0", "SIM", rank, world_size, NULL) == TP_OK);
        }
        CHECK(tp_shutdown(1) == TP_OK);
        if (!fired)
            return 0; /* the init needed fewer than k allocations: done */
    }
    return 1;
}

static void test_init_each_allocation_failing(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) /* under valgrind, or not GCC */
        skip();
    tp_sim_config cfg = {.hosts = 1, .seed = 7};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    int codes[1] = {-1};
    assert_int_equal(tp_sim_run(sim, oom_sweep_program, NULL, codes), TP_OK);
    tp_sim_free(sim);
    print_message("%d inits, %d failed for want of memory\n", sweep_inits, sweep_fails);
    assert_int_equal(failures, 0);
    assert_int_equal(codes[0], 0);
    if (sweep_bad)
        fail_msg("allocation %d failing: init failed with message '%s', worker %s", sweep_bad,
                 sweep_bad_msg, sweep_bad_up ? "initialized" : "not initialized");
    assert_true(sweep_fails > 10); /* the sweep reached init's allocations */
}

/*
 * INIT-4: a rank entry is "<name>\t<credit>\t<address>", the credit in
 * decimal, no leading zero, within [TPI_INFLIGHT_BYTES_MIN,
 * TPI_INFLIGHT_BYTES_MAX]. Anything else is refused whole: a store that
 * holds something else was written by someone else.
 */
static void test_init_rank_entry_parse_refuses_malformed(void **state) {
    (void)state;
    char v[128];
    uint64_t credit = 0;
    const char *addr = NULL;
    snprintf(v, sizeof v, "w0\t%llu\tsim:0", (unsigned long long)TPI_INFLIGHT_BYTES_MIN);
    assert_int_equal(tpi_rank_entry_parse(v, &credit, &addr), 1);
    assert_string_equal(v, "w0");
    assert_int_equal(credit, TPI_INFLIGHT_BYTES_MIN);
    assert_string_equal(addr, "sim:0");
    snprintf(v, sizeof v, "w1\t%llu\t", (unsigned long long)TPI_INFLIGHT_BYTES_MAX);
    assert_int_equal(tpi_rank_entry_parse(v, &credit, &addr), 1);
    assert_int_equal(credit, TPI_INFLIGHT_BYTES_MAX);
    assert_string_equal(addr, "");
    char below[64], above[64], name_max[TP_NAME_LEN_MAX + 32], name_long[TP_NAME_LEN_MAX + 32];
    snprintf(below, sizeof below, "w0\t%llu\tsim:0",
             (unsigned long long)TPI_INFLIGHT_BYTES_MIN - 1);
    snprintf(above, sizeof above, "w0\t%llu\tsim:0",
             (unsigned long long)TPI_INFLIGHT_BYTES_MAX + 1);
    memset(name_max, 'n', TP_NAME_LEN_MAX);
    snprintf(name_max + TP_NAME_LEN_MAX, sizeof name_max - TP_NAME_LEN_MAX, "\t65536\tsim:0");
    memset(name_long, 'n', TP_NAME_LEN_MAX + 1);
    snprintf(name_long + TP_NAME_LEN_MAX + 1, sizeof name_long - TP_NAME_LEN_MAX - 1,
             "\t65536\tsim:0");
    assert_int_equal(tpi_rank_entry_parse(name_max, &credit, &addr), 1);
    const char *bad[] = {
        below,
        above,
        name_long,
        "w0",                /* no tab */
        "\t65536\tsim:0",    /* no name */
        "w0\t\tsim:0",       /* no credit */
        "w0\t65536",         /* no tab after the credit */
        "w0\t65536x\tsim:0", /* not only digits */
        "w0\t065536\tsim:0", /* a leading zero */
        "w0\t-65536\tsim:0", /* a sign */
        "w0\t+65536\tsim:0",
        "w0\t0\tsim:0",
        "w0\t99999999999999999999\tsim:0",  /* 20 digits, past 2^64 */
        "w0\t123456789012345678901\tsim:0", /* 21 digits */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(v, sizeof v, "%s", bad[i]);
        credit = 7;
        addr = NULL;
        if (tpi_rank_entry_parse(v, &credit, &addr) != 0)
            fail_msg("rank entry \"%s\" accepted", bad[i]);
        assert_int_equal(credit, 7); /* untouched */
        assert_null(addr);
    }
}

int main(void) {
    if (sim_wrap_register("SIM_NOPEERS") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_init_peer_table_refused_fails_init_everywhere, reset_failures),
        cmocka_unit_test_setup(test_init_backend_start_failure_cleans_up, reset_failures),
        cmocka_unit_test_setup(test_init_warmup_reaches_every_worker, reset_failures),
        cmocka_unit_test_setup(test_init_world_shares_one_parse_of_the_entries, reset_failures),
        cmocka_unit_test_setup(test_init_unreachable_worker_fails_init_everywhere, reset_failures),
        cmocka_unit_test_setup(test_init_failed_warmup_leaves_worker_uninitialized, reset_failures),
        cmocka_unit_test(test_init_backend_defaults_and_option_keys),
        cmocka_unit_test(test_init_reserved_names_rejected),
        cmocka_unit_test_setup(test_init_missing_worker_times_out, reset_failures),
        cmocka_unit_test_setup(test_init_late_worker_told_of_timeout, reset_failures),
        cmocka_unit_test_setup(test_init_outlasts_store_outage, reset_failures),
        cmocka_unit_test_setup(test_init_store_outage_past_deadline, reset_failures),
        cmocka_unit_test_setup(test_init_slow_store, reset_failures),
        cmocka_unit_test_setup(test_init_store_lost_replies, reset_failures),
        cmocka_unit_test_setup(test_init_shutdown_during_init_refused, reset_failures),
        cmocka_unit_test_setup(test_init_shutdown_during_shutdown_refused, reset_failures),
        cmocka_unit_test_setup(test_init_timeout_names_who_is_missing, reset_failures),
        cmocka_unit_test(test_init_two_worlds_at_once_keep_their_own_tables),
        cmocka_unit_test(test_init_two_worlds_on_stores_without_instance),
        cmocka_unit_test(test_init_two_worlds_of_one_names_route_by_their_own),
        cmocka_unit_test(test_init_worker_described_by_name_only_inside_the_world),
        cmocka_unit_test(test_init_names_in_any_order_are_found),
        cmocka_unit_test(test_init_again_with_ranks_swapped_routes_to_the_new_hosts),
        cmocka_unit_test_setup(test_init_without_memory_for_the_core, reset_failures),
        cmocka_unit_test_setup(test_init_without_memory_for_the_rank_entries, reset_failures),
        cmocka_unit_test_setup(test_init_each_allocation_failing, reset_failures),
        cmocka_unit_test(test_init_rank_entry_parse_refuses_malformed),
        cmocka_unit_test(test_init_malformed_rank_entry_fails_init),
        cmocka_unit_test(test_init_outcome_the_store_refuses_ends_at_its_grace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
