/*
 * test_rejoin.c: a worker restarted as a new incarnation (spec/lifecycle.md
 * REJOIN-1..7) on the simulator. Worker w1 of a two-worker job dies at
 * 100 ms and its rank is restarted at 200 ms on a new host, as a restarted
 * process would be.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tensorplay/rpc.h"
#include "tensorplay/rpc_backend.h"
#include "tensorplay/sim.h"

#include "common/codec.h"
#include "common/core.h"
#include "sim_check.h"

#define KILL_MS 100
#define RESTART_MS 200

/* slow(ms, tag) -> tag, after sleeping ms. */
static tp_status slow_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)call, (void)kwargs, (void)ud;
    int64_t ms = 0, tag = 0;
    if (tp_value_get_int(tp_list_get(args, 0), &ms) != TP_OK ||
        tp_value_get_int(tp_list_get(args, 1), &tag) != TP_OK)
        return TP_EINVAL;
    tp_status st = tp_sleep((double)ms / 1e3);
    *result = tp_value_int(tag);
    return st;
}

/* A value that lives on the worker that serves this. */
static tp_status make_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    *result = tp_value_int(41);
    return TP_OK;
}

typedef enum {
    MODE_OK,
    MODE_NO_OPTION,
    MODE_WRONG_NAME,
    MODE_FORGED,
    MODE_WRONG_WORLD, /* the new process says one worker more */
    MODE_SHUT_DOWN    /* w0 began the job's shutdown before the restart */
} rejoin_mode;

static struct {
    rejoin_mode mode;
    tp_status rejoin_st;
    char rejoin_msg[TP_ERRMSG_LEN_MAX];
    int64_t new_answer;     /* w1's new incarnation: slow(900 ms, 2) from w0 */
    tp_status new_st;
    tp_status old_rref_st;  /* w0: to_here of an rref the dead incarnation owned */
    char old_rref_msg[TP_ERRMSG_LEN_MAX];
    tp_status pass_st;      /* w0: that rref passed to the new incarnation */
    char pass_msg[TP_ERRMSG_LEN_MAX];
    tp_status method_st; /* w0: a method call on that rref */
    char method_msg[TP_ERRMSG_LEN_MAX];
    /* MODE_FORGED: w0's raw requests to the new incarnation carrying that
     * rref as of owner incarnation 0 ([0]) and 2 ([1]) (RREF-20). */
    tp_status forged_st[2];
    char forged_msg[2][TP_ERRMSG_LEN_MAX];
    char forged_want[2][TP_ERRMSG_LEN_MAX]; /* decode_rref's words for each */
    tp_status after_st;     /* w0 -> w1 after the rejoin */
    int64_t after_answer;
    tp_status shutdown_st[2];
} r;

/*
 * RREF-20's last case: "an owner that receives an rref of its own earlier
 * incarnation in a message fails that message the same way". No worker
 * sends one: a survivor routes to the new incarnation only after its
 * announcement, and from then on refuses to send the stale rref (the
 * pass_st case above). So w0 forges the frame: its agent's send is wrapped,
 * and the next REQUEST for "slow" to rank 1 is decoded and encoded again
 * with forge.args for its args, whose rref goes out by forge_encode_rref
 * as of owner incarnation forge.inc, with the header's id and window
 * generation kept (the call's own reply then answers it). The marker args
 * w0 calls with encode to the same length, so the flow accounting is the
 * call's own.
 */
#define FORGE_MARKER "--------------------------------" /* 32 bytes: an rref's 36 on the wire */

static struct {
    const tp_agent_ops *ops; /* w0's agent's own */
    tp_agent_ops wrap;
    tp_value *args; /* borrowed; one shot: NULL once used */
    uint32_t inc;
    int rewritten, same_len;
    /* Fields forged as well when not -1 (test_rejoin_forged_rref_fields). */
    int64_t owner, parent, id_worker, id_local;
} forge = {.owner = -1, .parent = -1, .id_worker = -1, .id_local = -1};

static tp_status forge_encode_rref(void *ctx, tp_rref *rref, tpi_rref_wire *w) {
    (void)ctx;
    w->owner = rref->owner;
    w->owner_inc = forge.inc;
    w->rref_id = rref->id;
    w->fork_id = tpi_new_gid(rref->core); /* a fork w0 keeps nothing for */
    w->parent = rref->core->rank;
    if (forge.owner >= 0)
        w->owner = (uint32_t)forge.owner;
    if (forge.parent >= 0)
        w->parent = (uint32_t)forge.parent;
    if (forge.id_worker >= 0)
        w->rref_id.worker = (uint32_t)forge.id_worker;
    if (forge.id_local >= 0)
        w->rref_id.local = (uint64_t)forge.id_local;
    return TP_OK;
}

static tp_status forge_send(tp_agent *a, uint32_t dst, tp_frame *f) {
    char name[TP_NAME_LEN_MAX + 1];
    if (dst != 1 || !forge.args || tpi_frame_type(f) != TPI_MSG_REQUEST ||
        !tpi_frame_request_name(f, name) || strcmp(name, "slow") != 0)
        return forge.ops->send(a, dst, f);
    uint32_t gen = tpi_frame_gen(f);
    size_t len = f->len;
    tpi_msg m;
    char err[TP_ERRMSG_LEN_MAX];
    tp_status st = tpi_msg_decode_frame(f, NULL, &m, err, sizeof err); /* takes f */
    CHECK(st == TP_OK);
    if (st != TP_OK)
        return TP_OK; /* f is gone: the call times out */
    tp_value_free(m.args);
    m.args = forge.args;
    forge.args = NULL;
    tpi_codec_hooks hooks = {.encode_rref = forge_encode_rref};
    tp_frame *out = NULL;
    st = tpi_msg_encode(&m, &hooks, UINT64_MAX, &out, err, sizeof err);
    m.args = NULL; /* borrowed */
    tpi_msg_clear(&m);
    CHECK(st == TP_OK);
    if (st != TP_OK)
        return TP_OK;
    tpi_frame_set_gen(out, gen);
    forge.rewritten++;
    forge.same_len = out->len == len;
    if (forge.ops->send(a, dst, out) != TP_OK)
        tp_frame_free(out);
    return TP_OK;
}

/* w0: calls slow on w1 with rref forged as of owner incarnation inc (and
 * the fields forge names) into the request; its status, and its message in
 * msg. The forged fields are reset after. */
static tp_status forge_call(tp_rref *rref, uint32_t inc, char *msg, size_t msg_len) {
    tp_core *c = tpi_context_core(tp_context_current());
    CHECK(c != NULL);
    if (!c)
        return TP_EINVAL;
    forge.ops = c->ops;
    forge.wrap = *c->ops;
    forge.wrap.send = forge_send;
    forge.inc = inc;
    forge.rewritten = forge.same_len = 0;
    tp_value *real = tp_value_list_of(2, tp_value_int(1), tp_value_rref(rref));
    forge.args = real;
    c->ops = &forge.wrap;
    tp_value *args = tp_value_list_of(2, tp_value_int(1), tp_value_str(FORGE_MARKER));
    tp_value *res = NULL;
    tp_status st = tp_rpc_sync(tp_to_rank(1), "slow", args, NULL, 10.0, &res);
    snprintf(msg, msg_len, "%s", tp_errmsg());
    c->ops = forge.ops;
    forge.args = NULL;
    CHECK(forge.rewritten == 1 && forge.same_len);
    forge.owner = forge.parent = forge.id_worker = forge.id_local = -1;
    tp_value_free(res);
    tp_value_free(args);
    tp_value_free(real);
    tpi_core_unref(c);
    return st;
}

/* w0: calls slow on the new w1 with rref (of w1's incarnation 0) forged as
 * of owner incarnation inc into the request; its answer in r.forged_*[i]. */
static void forged_call(tp_rref *rref, uint32_t inc, int i) {
    r.forged_st[i] = forge_call(rref, inc, r.forged_msg[i], sizeof r.forged_msg[i]);
    snprintf(r.forged_want[i], sizeof r.forged_want[i],
             "rref %u:%llu is of incarnation %u of its owner 'w1', which is incarnation 1: %s",
             rref->id.worker, (unsigned long long)rref->id.local, inc,
             inc < 1 ? "the value went with the earlier process" : "no such incarnation yet");
}

/*
 * RREF-6, RREF-20: an rref whose wire fields a peer forged. One that names
 * a worker outside the world (as its owner, its parent or its id's maker)
 * is refused TP_EPROTO saying so; an id the owner made itself but does not
 * hold (1:1000000) is refused TP_EPROTO naming it, and the parent still
 * gets its ACCEPT (nothing here for it to keep alive). No restart: w0 calls
 * w1, whose own sends are counted.
 */
static struct {
    const tp_agent_ops *ops; /* w1's agent's own */
    tp_agent_ops wrap;
    int accepts_to_w0;
    int done;
    tp_status st[4];
    char msg[4][TP_ERRMSG_LEN_MAX];
} ff;

static tp_status ff_send(tp_agent *a, uint32_t dst, tp_frame *f) {
    if (dst == 0 && tpi_frame_type(f) == TPI_MSG_RREF_ACCEPT)
        ff.accepts_to_w0++;
    return ff.ops->send(a, dst, f);
}

static void ff_call(tp_rref *rref, int i) {
    ff.st[i] = forge_call(rref, 0, ff.msg[i], sizeof ff.msg[i]);
}

static int program_forged_fields(int rank, int world, void *arg) {
    (void)arg;
    CHECK(tp_register_function("slow", slow_fn, NULL) == TP_OK);
    CHECK(tp_register_function("make", make_fn, NULL) == TP_OK);
    CHECK(tp_init_rpc(rank == 0 ? "w0" : "w1", "SIM", rank, world, NULL) == TP_OK);
    if (rank == 1) {
        tp_core *c = tpi_context_core(tp_context_current());
        ff.ops = c->ops;
        ff.wrap = *c->ops;
        ff.wrap.send = ff_send;
        c->ops = &ff.wrap;
        while (!ff.done && tp_sleep(0.01) == TP_OK) {
        }
        c->ops = ff.ops;
        tpi_core_unref(c);
        CHECK(tp_shutdown(1) == TP_OK);
        return 0;
    }
    tp_rref *rref = NULL;
    CHECK(tp_remote(tp_to_rank(1), "make", NULL, NULL, 10.0, &rref) == TP_OK);
    tp_value *v = NULL;
    CHECK(tp_rref_to_here(rref, 10.0, &v) == TP_OK);
    tp_value_free(v);
    forge.parent = 2;
    ff_call(rref, 0);
    forge.owner = 2;
    ff_call(rref, 1);
    forge.id_worker = 2;
    ff_call(rref, 2);
    int before = ff.accepts_to_w0;
    forge.id_worker = 1;
    forge.id_local = 1000000;
    ff_call(rref, 3);
    CHECK(tp_sleep(0.1) == TP_OK); /* the ACCEPT has gone */
    CHECK(ff.accepts_to_w0 == before + 1);
    ff.done = 1;
    tp_rref_release(rref);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

static void test_rejoin_forged_rref_fields(void **state) {
    (void)state;
    memset(&ff, 0, sizeof ff);
    tp_sim_config cfg = {.hosts = 2, .seed = 3};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_run(sim, program_forged_fields, NULL, NULL), TP_OK);
    tp_sim_free(sim);
    for (int i = 0; i < 4; i++)
        print_message("forged %d: %s: %s\n", i, tp_status_name(ff.st[i]), ff.msg[i]);
    assert_int_equal(failures, 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ff.st[i], TP_EPROTO);
        assert_non_null(strstr(ff.msg[i], "an rref names a worker outside the world of 2"));
    }
    assert_int_equal(ff.st[3], TP_EPROTO);
    assert_non_null(strstr(ff.msg[3], "rref 1:1000000 is unknown on its owner 'w1'"));
}

static int program(int rank, int world, void *arg) {
    (void)arg;
    CHECK(tp_register_function("slow", slow_fn, NULL) == TP_OK);
    CHECK(tp_register_function("make", make_fn, NULL) == TP_OK);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 5.0) == TP_OK);
    const char *name = rank == 0 ? "w0" : "w1";
    if (tp_sim_incarnation() > 0) {
        /* The restarted process. */
        if (r.mode != MODE_NO_OPTION)
            CHECK(tp_options_set_rejoin(o, 1) == TP_OK);
        if (r.mode == MODE_WRONG_NAME)
            name = "impostor";
        r.rejoin_st =
            tp_init_rpc(name, "SIM", rank, r.mode == MODE_WRONG_WORLD ? world + 1 : world, o);
        snprintf(r.rejoin_msg, sizeof r.rejoin_msg, "%s", tp_errmsg());
        tp_options_free(o);
        if (r.rejoin_st != TP_OK)
            return 0;
        tp_worker_info me;
        CHECK(tp_get_worker_info(NULL, &me) == TP_OK && me.id == 1 && !strcmp(me.name, "w1"));
        /* w0 still runs the old incarnation's slow call (id 2 there) and
         * answers it at about 600 ms: the answer must not land on this
         * call, whatever its id. */
        tp_value *args = tp_value_list_of(2, tp_value_int(900), tp_value_int(2));
        tp_value *res = NULL;
        r.new_st = tp_rpc_sync(tp_to_rank(0), "slow", args, NULL, 10.0, &res);
        (void)tp_value_get_int(res, &r.new_answer);
        tp_value_free(res);
        tp_value_free(args);
        r.shutdown_st[1] = tp_shutdown(1);
        return 0;
    }
    CHECK(tp_init_rpc(name, "SIM", rank, world, o) == TP_OK);
    tp_options_free(o);
    if (rank == 0 && r.mode == MODE_SHUT_DOWN) {
        r.shutdown_st[0] = tp_shutdown(1); /* ends when w1 is seen dead */
        return 0;
    }
    if (rank == 1) {
        /* The first incarnation: a call w0 answers after this one died. */
        tp_value *args = tp_value_list_of(2, tp_value_int(500), tp_value_int(1));
        tp_future *f = NULL;
        CHECK(tp_rpc_async(tp_to_rank(0), "slow", args, NULL, 10.0, &f) == TP_OK);
        tp_value_free(args);
        (void)tp_future_wait(f, 10.0); /* killed in here */
        tp_future_free(f);
        (void)tp_shutdown(0);
        return 0;
    }
    /* w0: an rref owned by w1's first incarnation. */
    tp_rref *rref = NULL;
    CHECK(tp_remote(tp_to_rank(1), "make", NULL, NULL, 10.0, &rref) == TP_OK);
    tp_value *v = NULL;
    CHECK(tp_rref_to_here(rref, 10.0, &v) == TP_OK);
    tp_value_free(v);
    v = NULL;
    /* Wait until w1's new incarnation is back and has told us. */
    (void)tp_sleep(1.5);
    r.old_rref_st = tp_rref_to_here(rref, 10.0, &v);
    snprintf(r.old_rref_msg, sizeof r.old_rref_msg, "%s", tp_errmsg());
    tp_value_free(v);
    if (r.rejoin_st == TP_OK) {
        /* RREF-20: sent to its owner's new incarnation, it would make a fork
         * there for a value that went with the old one. */
        tp_value *args = tp_value_list_of(2, tp_value_int(1), tp_value_rref(rref));
        tp_value *res = NULL;
        r.pass_st = tp_rpc_sync(tp_to_rank(1), "slow", args, NULL, 10.0, &res);
        snprintf(r.pass_msg, sizeof r.pass_msg, "%s", tp_errmsg());
        tp_value_free(res);
        tp_value_free(args);
        /* REJOIN-6: a method call on it is refused before anything is sent. */
        tp_method *m = NULL;
        CHECK(tp_method_factory("get", &m) == TP_OK);
        res = NULL;
        r.method_st = tp_method_call_sync(m, rref, NULL, NULL, 10.0, &res);
        snprintf(r.method_msg, sizeof r.method_msg, "%s", tp_errmsg());
        tp_value_free(res);
        tp_method_free(m);
    }
    if (r.rejoin_st == TP_OK && r.mode == MODE_FORGED) {
        forged_call(rref, 0, 0);
        forged_call(rref, 2, 1);
    }
    tp_rref_release(rref);
    if (r.rejoin_st == TP_OK) {
        tp_value *args = tp_value_list_of(2, tp_value_int(1), tp_value_int(3));
        tp_value *res = NULL;
        r.after_st = tp_rpc_sync(tp_to_rank(1), "slow", args, NULL, 10.0, &res);
        (void)tp_value_get_int(res, &r.after_answer);
        tp_value_free(res);
        tp_value_free(args);
    }
    r.shutdown_st[0] = tp_shutdown(1);
    return 0;
}

static tp_sim *run_traced(rejoin_mode mode, uint64_t seed, FILE *trace) {
    memset(&r, 0, sizeof r);
    r.mode = mode;
    tp_sim_config cfg = {.hosts = 2, .seed = seed, .trace = trace};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_fault_kill(sim, 1, KILL_MS * MS), TP_OK);
    assert_int_equal(tp_sim_fault_restart(sim, 1, RESTART_MS * MS), TP_OK);
    assert_int_equal(tp_sim_run(sim, program, NULL, NULL), TP_OK);
    assert_int_equal(failures, 0);
    assert_int_equal(tp_sim_fault_count(sim, TP_SIM_FAULT_RESTART), 1);
    assert_int_equal(tp_sim_rank_host(sim, 1), 2); /* a new host, a new address */
    assert_true(tp_sim_host_dead(sim, 1));
    assert_false(tp_sim_rank_dead(sim, 1));
    return sim;
}

static tp_sim *run(rejoin_mode mode, uint64_t seed) {
    return run_traced(mode, seed, NULL);
}

/* spec: REJOIN-1..6: the new incarnation serves and calls; the old one's late
 * answer reaches nobody; its rrefs fail with a clear error; shutdown is
 * clean on both. The oracle checks every reply against its request. */
static void test_rejoin_new_incarnation_works(void **state) {
    (void)state;
    for (uint64_t seed = 1; seed <= 5; seed++) {
        tp_sim *sim = run(MODE_OK, seed);
        assert_int_equal(r.rejoin_st, TP_OK);
        assert_int_equal(r.new_st, TP_OK);
        assert_int_equal(r.new_answer, 2); /* its own answer, not the old call's 1 */
        assert_int_equal(r.after_st, TP_OK);
        assert_int_equal(r.after_answer, 3);
        assert_int_equal(r.old_rref_st, TP_EPEERDOWN);
        assert_non_null(strstr(r.old_rref_msg, "restarted"));
        assert_int_equal(r.pass_st, TP_EPEERDOWN);
        assert_non_null(strstr(r.pass_msg, "sending an rref: the owner of rref"));
        assert_null(strstr(r.pass_msg, "sending an rref: sending")); /* said once */
        assert_non_null(strstr(r.pass_msg, "the value went with the earlier process"));
        assert_int_equal(r.method_st, TP_EPEERDOWN);
        if (!strstr(r.method_msg, "method call: the owner of rref") ||
            !strstr(r.method_msg, "the value went with the earlier process"))
            fail_msg("method call: '%s'", r.method_msg);
        assert_int_equal(r.shutdown_st[0], TP_OK);
        assert_int_equal(r.shutdown_st[1], TP_OK);
        assert_int_equal(tp_sim_violations(sim), 0);
        tp_sim_free(sim);
    }
}

/* spec: RREF-20, REJOIN-6: an owner that receives an rref of another of its
 * incarnations in a request fails the request: an earlier one's value went
 * with the earlier process (TP_EPEERDOWN, and the parent gets RREF_ACCEPT),
 * a later one does not exist yet (TP_EPROTO). No survivor sends either (it refuses the stale rref
 * itself), so w0 forges the frames; the new w1 answers them, then serves w0 as before and both shut
 * down cleanly. */
static void test_rejoin_owner_refuses_rref_of_other_incarnation(void **state) {
    (void)state;
    for (uint64_t seed = 1; seed <= 2; seed++) {
        char *text = NULL;
        size_t text_len = 0;
        FILE *trace = open_memstream(&text, &text_len);
        assert_non_null(trace);
        tp_sim *sim = run_traced(MODE_FORGED, seed, trace);
        fclose(trace);
        /* The new w1 (host 2) refusing the earlier incarnation's rref tells
         * its parent, w0, with RREF_ACCEPT (type 7), so that w0 would drop a
         * reference it kept for the fork; the later one's gets none. */
        int accepts = 0;
        for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n"))
            accepts += strstr(l, " send ") && strstr(l, " from=2 to=0 src=1 dst=0 ") &&
                       strstr(l, " type=7 ");
        free(text);
        assert_int_equal(accepts, 1);
        assert_int_equal(r.rejoin_st, TP_OK);
        assert_int_equal(r.pass_st, TP_EPEERDOWN); /* w0's own send refused it */
        assert_int_equal(r.forged_st[0], TP_EPEERDOWN);
        assert_int_equal(r.forged_st[1], TP_EPROTO);
        for (int i = 0; i < 2; i++) {
            print_message("seed %llu forged %d: %s\n", (unsigned long long)seed, i,
                          r.forged_msg[i]);
            assert_non_null(strstr(r.forged_msg[i], "could not decode the request"));
            assert_non_null(strstr(r.forged_msg[i], r.forged_want[i]));
        }
        assert_int_equal(r.after_st, TP_OK);
        assert_int_equal(r.after_answer, 3);
        assert_int_equal(r.shutdown_st[0], TP_OK);
        assert_int_equal(r.shutdown_st[1], TP_OK);
        assert_int_equal(tp_sim_violations(sim), 0);
        tp_sim_free(sim);
    }
}

/* spec: REJOIN-1: without the option a second process for a running rank is
 * refused, and the message says what to do. */
static void test_rejoin_needs_the_option(void **state) {
    (void)state;
    tp_sim *sim = run(MODE_NO_OPTION, 1);
    assert_int_equal(r.rejoin_st, TP_EINVAL);
    assert_non_null(strstr(r.rejoin_msg, "claimed twice"));
    assert_non_null(strstr(r.rejoin_msg, "rejoin"));
    tp_sim_free(sim);
}

/* spec: REJOIN-1: the rank is the job's, under its name. */
static void test_rejoin_checks_the_name(void **state) {
    (void)state;
    tp_sim *sim = run(MODE_WRONG_NAME, 1);
    assert_int_equal(r.rejoin_st, TP_EINVAL);
    assert_non_null(strstr(r.rejoin_msg, "rank 1 is 'w1' in this job, not 'impostor'"));
    tp_sim_free(sim);
}

/* spec: REJOIN-1: the same job: a restarted process that says another world
 * size is refused, naming both sizes. */
static void test_rejoin_checks_the_world_size(void **state) {
    (void)state;
    tp_sim *sim = run(MODE_WRONG_WORLD, 1);
    assert_int_equal(r.rejoin_st, TP_EINVAL);
    if (!strstr(r.rejoin_msg, "rejoin: world size mismatch: worker 'w1' (rank 1) says 3, the "
                              "job says 2"))
        print_error("%s\n", r.rejoin_msg);
    assert_non_null(strstr(r.rejoin_msg, "rejoin: world size mismatch: worker 'w1' (rank 1) "
                                         "says 3, the job says 2"));
    tp_sim_free(sim);
}

/* spec: REJOIN-1: a job that began its shutdown takes no one back. */
static void test_rejoin_refused_once_the_job_shuts_down(void **state) {
    (void)state;
    tp_sim *sim = run(MODE_SHUT_DOWN, 1);
    assert_int_equal(r.rejoin_st, TP_ESHUTDOWN);
    if (!strstr(r.rejoin_msg, "rejoin: the job is shutting down (rank 0 began)"))
        print_error("%s\n", r.rejoin_msg);
    assert_non_null(strstr(r.rejoin_msg, "rejoin: the job is shutting down (rank 0 began)"));
    tp_sim_free(sim);
}

/* ---- A rejoin that cannot tell a live peer, and one with a dead peer ------------ */

static struct {
    tp_status rejoin_st, call_st, shutdown_st;
    char rejoin_msg[TP_ERRMSG_LEN_MAX];
    uint64_t rejoin_ns;
} q;

/* What program_peers and program_pair share: registers slow, then init_rpc
 * with a 2 s init deadline. A restarted process rejoins, keeping its status
 * and message in *st and msg and, when took is given, its duration:
 * START_REJOINED when that worked, else START_DONE. In the first
 * incarnation rank 0 serves (START_SERVING) and the others sleep until the
 * plan kills them (START_DONE). */
typedef enum start_role { START_DONE, START_SERVING, START_REJOINED } start_role;

static start_role start_peer(int rank, int world, tp_status *st, char *msg, size_t msg_len,
                             uint64_t *took) {
    CHECK(tp_register_function("slow", slow_fn, NULL) == TP_OK);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 2.0) == TP_OK);
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    if (tp_sim_incarnation() > 0) {
        CHECK(tp_options_set_rejoin(o, 1) == TP_OK);
        uint64_t t0 = now_ns();
        *st = tp_init_rpc(name, "SIM", rank, world, o);
        if (took)
            *took = now_ns() - t0;
        snprintf(msg, msg_len, "%s", tp_errmsg());
        tp_options_free(o);
        return *st == TP_OK ? START_REJOINED : START_DONE;
    }
    CHECK(tp_init_rpc(name, "SIM", rank, world, o) == TP_OK);
    tp_options_free(o);
    if (rank == 0)
        return START_SERVING;
    (void)tp_sleep(60.0); /* killed in here */
    return START_DONE;
}

/* w1 dies at 100 ms and restarts at 200 ms; w2 (when there is one) dies at
 * 100 ms for good; w0 serves (and is paused when the test says so). */
static int program_peers(int rank, int world, void *arg) {
    (void)arg;
    start_role role =
        start_peer(rank, world, &q.rejoin_st, q.rejoin_msg, sizeof q.rejoin_msg, &q.rejoin_ns);
    if (role == START_SERVING) {
        (void)tp_sleep(15.0);
        q.shutdown_st = tp_shutdown(0);
    }
    if (role != START_REJOINED)
        return 0;
    tp_value *args = tp_value_list_of(2, tp_value_int(1), tp_value_int(5));
    tp_value *res = NULL;
    q.call_st = tp_rpc_sync(tp_to_rank(0), "slow", args, NULL, 5.0, &res);
    tp_value_free(res);
    tp_value_free(args);
    CHECK(tp_shutdown(0) == TP_OK);
    return 0;
}

static void run_peers(uint32_t hosts, const char *plan) {
    memset(&q, 0, sizeof q);
    tp_sim_config cfg = {.hosts = hosts, .seed = 7};
    tp_sim *sim = NULL;
    char err[256];
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_load_faults(sim, plan, err, sizeof err), TP_OK);
    assert_int_equal(tp_sim_run(sim, program_peers, NULL, NULL), TP_OK);
    assert_int_equal(failures, 0);
    assert_int_equal(tp_sim_violations(sim), 0);
    tp_sim_free(sim);
}

/* spec: REJOIN-4: a live peer that cannot answer (paused past the init deadline)
 * fails the rejoin at the deadline, naming it and why. */
static void test_rejoin_unreachable_peer_times_out(void **state) {
    (void)state;
    run_peers(2, "kill 1 100\nrestart 1 200\npause 0 150 10000\n");
    assert_int_equal(q.rejoin_st, TP_ETIMEDOUT);
    assert_non_null(strstr(q.rejoin_msg, "could not tell worker 'w0' (id 0) of its restart"));
    assert_non_null(strstr(q.rejoin_msg, "timed out"));
    /* At the deadline, not a try later: no round starts once it has come. */
    assert_true(q.rejoin_ns >= 2 * SEC - TOL_NS && q.rejoin_ns <= 2 * SEC);
    assert_non_null(strstr(q.rejoin_msg, "timed out after 2000 ms"));
}

/* spec: REJOIN-1: TP_REJOIN=1 in the environment is for the process's own
 * worker, which a launcher restarted; a simulated world depends on its seed
 * alone, so its first incarnations still join as new. */
static void test_rejoin_env_ignored_by_simulated_workers(void **state) {
    (void)state;
    assert_int_equal(setenv("TP_REJOIN", "1", 1), 0);
    run_peers(2, "");
    assert_int_equal(unsetenv("TP_REJOIN"), 0);
    assert_int_equal(q.rejoin_st, TP_OK); /* nobody restarted: no rejoin ran */
}

/* spec: REJOIN-4: a peer that is dead needs no news: the rejoin goes on without it. */
static void test_rejoin_skips_a_dead_peer(void **state) {
    (void)state;
    run_peers(3, "kill 1 100\nkill 2 100\nrestart 1 200\n");
    assert_int_equal(q.rejoin_st, TP_OK);
    assert_true(q.rejoin_ns < 100 * MS);
    assert_int_equal(q.call_st, TP_OK);
}

/* ---- Two ranks restarted at once ------------------------------------------------ */

#define PAIR_CALLS_MS 1500

static struct {
    tp_status rejoin_st[3], call_st[3][3]; /* [caller][callee] */
    char rejoin_msg[3][TP_ERRMSG_LEN_MAX];
    int64_t answer[3][3];
} p2;

/* w1 and w2 die at 100 ms and both restart at 200 ms; once back, each calls
 * every worker, w0 serves until 15 s. */
static int program_pair(int rank, int world, void *arg) {
    (void)arg;
    start_role role = start_peer(rank, world, &p2.rejoin_st[rank], p2.rejoin_msg[rank],
                                 sizeof p2.rejoin_msg[rank], NULL);
    if (role == START_SERVING) {
        (void)tp_sleep(15.0);
        CHECK(tp_shutdown(0) == TP_OK);
    }
    if (role != START_REJOINED)
        return 0;
    if (now_ns() < PAIR_CALLS_MS * MS) /* both are back by then */
        CHECK(tp_sleep((double)(PAIR_CALLS_MS * MS - now_ns()) / 1e9) == TP_OK);
    for (int to = 0; to < world; to++) {
        tp_value *args = tp_value_list_of(2, tp_value_int(1), tp_value_int(10 * rank + to));
        tp_value *res = NULL;
        p2.call_st[rank][to] = tp_rpc_sync(tp_to_rank(to), "slow", args, NULL, 5.0, &res);
        (void)tp_value_get_int(res, &p2.answer[rank][to]);
        tp_value_free(res);
        tp_value_free(args);
    }
    (void)tp_sleep(1.0); /* the other's calls to this one */
    CHECK(tp_shutdown(0) == TP_OK);
    return 0;
}

static void run_pair(const char *plan) {
    memset(&p2, 0, sizeof p2);
    tp_sim_config cfg = {.hosts = 3, .seed = 7};
    tp_sim *sim = NULL;
    char err[256];
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_load_faults(sim, plan, err, sizeof err), TP_OK);
    assert_int_equal(tp_sim_run(sim, program_pair, NULL, NULL), TP_OK);
    assert_int_equal(failures, 0);
    assert_int_equal(tp_sim_violations(sim), 0);
    assert_int_equal(tp_sim_fault_count(sim, TP_SIM_FAULT_RESTART), 2);
    tp_sim_free(sim);
    for (int w = 1; w <= 2; w++) {
        if (p2.rejoin_st[w] != TP_OK)
            fail_msg("w%d's rejoin: %s: %s", w, tp_status_name(p2.rejoin_st[w]), p2.rejoin_msg[w]);
        for (int to = 0; to < 3; to++) {
            if (p2.call_st[w][to] != TP_OK)
                fail_msg("w%d -> w%d: %s", w, to, tp_status_name(p2.call_st[w][to]));
            assert_int_equal(p2.answer[w][to], 10 * w + to);
        }
    }
}

/* spec: REJOIN-3, REJOIN-4: two ranks restarted at the same instant: each
 * rejoins (the one whose gather comes second takes the other's new
 * incarnation from the store, the other hears of it by its announcement),
 * and once both are back every pair meets: each calls the other and w0,
 * and is answered. */
static void test_rejoin_two_ranks_restarted_at_once(void **state) {
    (void)state;
    run_pair("kill 1 100\nkill 2 100\nrestart 1 200\nrestart 2 200\n");
}

/* spec: REJOIN-4: w1 is back at 200 ms and announces itself to w2, which
 * dies at 203 ms with the announcement on the wire (5 ms each way) and is
 * back at 207 ms. w1 hears w2 is down, then finds w2's new incarnation in the
 * store: it takes the new address and counts w2 as up again, so the calls
 * between them are answered (a w1 that kept w2 dead failed its call to w2
 * with TP_EPEERDOWN: the mutant of rejoin.c's peer_dead reset). */
static void test_rejoin_peer_restarted_during_the_announcement(void **state) {
    (void)state;
    run_pair("latency * * 5 5 fixed\nkill 1 100\nkill 2 203\nrestart 1 200\n"
             "restart 2 207\n");
}

/* ---- A second restart whose compare-and-set reply is lost ------------------------ */

/*
 * A store that applies a compare-and-set of an incarnation key ("g<gen>/inc/<r>")
 * and then loses the reply (a store server that wrote, then lost the
 * connection): the caller sees TP_ESTORE and tries again.
 */
typedef struct lossy_store {
    tp_store base; /* first */
    tp_store *inner;
    int lose_cas;                       /* lose incarnation keys' compare-and-set replies */
    const char *fail_get;               /* a restarted process's get of a key holding this fails */
    int hide_inc;                       /* the next get of "inc/1" finds nothing (then 0) */
    const char *inc_value;              /* a restarted process's get of "inc/1" finds this */
    const char *bent_key, *bent_value;  /* a restarted process's get of bent_key finds bent_value */
    int lost;                           /* replies lost so far */
    char key[TP_STORE_KEY_LEN_MAX + 1]; /* the incarnation key written last */
} lossy_store;

static tp_status lossy_set(tp_store *s, const char *key, const void *value, size_t len) {
    tp_store *in = ((lossy_store *)s)->inner;
    return in->ops->set(in, key, value, len);
}
static tp_status lossy_get(tp_store *s, const char *key, void **value, size_t *len) {
    lossy_store *ls = (lossy_store *)s;
    if (ls->fail_get && tp_sim_incarnation() > 0 && strstr(key, ls->fail_get)) {
        snprintf(s->errmsg, sizeof s->errmsg, "get '%s': a deliberate failure", key);
        return TP_ESTORE;
    }
    if (ls->bent_key && tp_sim_incarnation() > 0 && strstr(key, ls->bent_key)) {
        *value = strdup(ls->bent_value);
        *len = strlen(ls->bent_value);
        return *value ? TP_OK : TP_ENOMEM;
    }
    if (ls->inc_value && tp_sim_incarnation() > 0 && strstr(key, "/inc/1")) {
        *value = strdup(ls->inc_value);
        *len = strlen(ls->inc_value);
        return *value ? TP_OK : TP_ENOMEM;
    }
    if (ls->hide_inc && strstr(key, "/inc/1")) {
        ls->hide_inc = 0; /* read before rank 1's rejoin wrote it */
        return TP_ENOENT;
    }
    return ls->inner->ops->get(ls->inner, key, value, len);
}
static tp_status lossy_add(tp_store *s, const char *key, int64_t delta, int64_t *result) {
    tp_store *in = ((lossy_store *)s)->inner;
    return in->ops->add(in, key, delta, result);
}
static tp_status lossy_cas(tp_store *s, const char *key, const void *expected, size_t elen,
                           const void *desired, size_t dlen, int *swapped) {
    lossy_store *ls = (lossy_store *)s;
    tp_status st =
        ls->inner->ops->compare_set(ls->inner, key, expected, elen, desired, dlen, swapped);
    if (ls->lose_cas && st == TP_OK && *swapped && strstr(key, "/inc/")) {
        ls->lost++;
        snprintf(ls->key, sizeof ls->key, "%s", key);
        snprintf(s->errmsg, sizeof s->errmsg, "compare_set '%s': the reply was lost", key);
        return TP_ESTORE; /* written, but the caller cannot know */
    }
    return st;
}
static tp_status lossy_del(tp_store *s, const char *key) {
    tp_store *in = ((lossy_store *)s)->inner;
    return in->ops->del(in, key);
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

#define TWICE_INCS 3 /* w1's first process and its two restarts */
#define TWICE_PLAN "kill 1 100\nrestart 1 200\nkill 1 400\nrestart 1 500\n"

static struct {
    tp_status rejoin_st[TWICE_INCS];
    char rejoin_msg[TWICE_INCS][TP_ERRMSG_LEN_MAX];
    tp_status call_st;
    int64_t call_answer;
} t2;

/* w1 dies at 100 ms, is restarted at 200 ms (incarnation 1), dies again at
 * 400 ms and is restarted at 500 ms (incarnation 2), which calls w0. */
static int program_twice(int rank, int world, void *arg) {
    (void)arg;
    CHECK(tp_register_function("slow", slow_fn, NULL) == TP_OK);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 2.0) == TP_OK);
    uint32_t inc = tp_sim_incarnation();
    CHECK(inc < TWICE_INCS);
    if (inc > 0)
        CHECK(tp_options_set_rejoin(o, 1) == TP_OK);
    tp_status st = tp_init_rpc(rank ? "w1" : "w0", "SIM", rank, world, o);
    tp_options_free(o);
    if (rank == 1 && inc < TWICE_INCS) {
        t2.rejoin_st[inc] = st;
        snprintf(t2.rejoin_msg[inc], sizeof t2.rejoin_msg[inc], "%s", tp_errmsg());
    }
    if (st != TP_OK)
        return 0;
    if (rank == 0) {
        (void)tp_sleep(15.0);
        CHECK(tp_shutdown(0) == TP_OK);
        return 0;
    }
    if (inc < 2) {
        (void)tp_sleep(60.0); /* killed in here */
        return 0;
    }
    tp_value *args = tp_value_list_of(2, tp_value_int(1), tp_value_int(7));
    tp_value *res = NULL;
    t2.call_st = tp_rpc_sync(tp_to_rank(0), "slow", args, NULL, 5.0, &res);
    (void)tp_value_get_int(res, &t2.call_answer);
    tp_value_free(res);
    tp_value_free(args);
    CHECK(tp_shutdown(0) == TP_OK);
    return 0;
}

/* spec: REJOIN-2: the second restart's compare-and-set of "inc/1" (from
 * incarnation 1 to 2) is applied but its reply lost; the retry finds the
 * key changed, reads it back, sees its own value and takes incarnation 2.
 * (Taking the value for a rival restart's, it would go on to 3, and lose
 * that reply too.) The first restart's create-if-absent write is the store
 * retry's case (STORE-9): the key read back as its own. */
static void test_rejoin_second_restart_lost_cas_reply(void **state) {
    (void)state;
    memset(&t2, 0, sizeof t2);
    lossy_store *ls = calloc(1, sizeof *ls);
    assert_non_null(ls);
    ls->base.ops = &lossy_ops;
    ls->lose_cas = 1;
    assert_int_equal(tp_sqlite_store_open(":memory:", &ls->inner, NULL, 0), TP_OK);
    tp_sim_config cfg = {.hosts = 2, .seed = 7, .store = &ls->base};
    tp_sim *sim = NULL;
    char err[256];
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_load_faults(sim, TWICE_PLAN, err, sizeof err), TP_OK);
    assert_int_equal(tp_sim_run(sim, program_twice, NULL, NULL), TP_OK);
    assert_int_equal(failures, 0);
    assert_int_equal(tp_sim_violations(sim), 0);
    assert_int_equal(tp_sim_fault_count(sim, TP_SIM_FAULT_RESTART), 2);
    assert_int_equal(tp_sim_rank_host(sim, 1), 3);
    tp_sim_free(sim);
    for (int i = 0; i < TWICE_INCS; i++)
        if (t2.rejoin_st[i] != TP_OK)
            fail_msg("incarnation %d: %s: %s", i, tp_status_name(t2.rejoin_st[i]),
                     t2.rejoin_msg[i]);
    assert_int_equal(t2.call_st, TP_OK);
    assert_int_equal(t2.call_answer, 7);
    assert_int_equal(ls->lost, 2); /* each restart's write: 0 -> 1, then 1 -> 2 */
    assert_non_null(strstr(ls->key, "/inc/1"));
    void *v = NULL;
    size_t len = 0;
    assert_int_equal(ls->inner->ops->get(ls->inner, ls->key, &v, &len), TP_OK);
    assert_true(len > 2 && memcmp(v, "2\t", 2) == 0); /* incarnation 2, the newest */
    free(v);
    lossy_close(&ls->base);
}

/* Runs program_peers with w1 killed at 100 ms and restarted at 200 ms,
 * on an SQLite store seen through ls (set up by the caller), under the
 * oracle; the caller checks q and closes ls. */
static void run_peers_on(lossy_store *ls) {
    memset(&q, 0, sizeof q);
    ls->base.ops = &lossy_ops;
    assert_int_equal(tp_sqlite_store_open(":memory:", &ls->inner, NULL, 0), TP_OK);
    tp_sim_config cfg = {.hosts = 2, .seed = 7, .store = &ls->base};
    tp_sim *sim = NULL;
    char err[256];
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_load_faults(sim, "kill 1 100\nrestart 1 200\n", err, sizeof err),
                     TP_OK);
    assert_int_equal(tp_sim_run(sim, program_peers, NULL, NULL), TP_OK);
    assert_int_equal(failures, 0);
    assert_int_equal(tp_sim_violations(sim), 0);
    tp_sim_free(sim);
}

/* spec: REJOIN-3, SHUTDOWN-7's wording: the store fails the restarted
 * process's reads of the names ("init/rank/<r>") in its all-gather; the
 * rejoin fails with TP_ESTORE, saying the step and the store's own words,
 * and the process is not initialised (it has no names to go on). */
static void test_rejoin_store_failure_in_the_gather(void **state) {
    (void)state;
    lossy_store *ls = calloc(1, sizeof *ls);
    assert_non_null(ls);
    ls->fail_get = "/init/rank/";
    run_peers_on(ls);
    if (q.rejoin_st != TP_ESTORE)
        fail_msg("rejoin: %s: %s", tp_status_name(q.rejoin_st), q.rejoin_msg);
    assert_non_null(strstr(q.rejoin_msg, "rejoin"));
    assert_non_null(strstr(q.rejoin_msg, "init/rank/0': a deliberate failure"));
    assert_int_equal(q.shutdown_st, TP_OK); /* w0 never heard of it */
    lossy_close(&ls->base);
}

/* spec: REJOIN-3: what the restarted process reads back from the store is
 * checked as init checks it: a rank's entry whose credit is no number, and
 * another rank's incarnation key that is no "<k>\t<address>", fail the
 * rejoin with TP_ESTORE naming the entry, rather than being taken half
 * read (the process is not initialised; nothing leaks). */
static void test_rejoin_malformed_entries_refused(void **state) {
    (void)state;
    static const char *const cases[][3] = {
        {"/init/rank/0", "w0\tx\tsim:0", "rejoin: rank 0's entry in the store is malformed"},
        {"/inc/0", "zz", "inc/0' is malformed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lossy_store *ls = calloc(1, sizeof *ls);
        assert_non_null(ls);
        ls->bent_key = cases[i][0];
        ls->bent_value = cases[i][1];
        run_peers_on(ls);
        if (q.rejoin_st != TP_ESTORE || !strstr(q.rejoin_msg, cases[i][2]))
            fail_msg("case %zu: rejoin: %s: %s", i, tp_status_name(q.rejoin_st), q.rejoin_msg);
        lossy_close(&ls->base);
    }
}

/* spec: REJOIN-2: incarnations are numbered up to TPI_INCARNATION_MAX
 * (2^24 - 1, what a peer can parse): a rank whose store says it restarted
 * that many times already cannot take another; its rejoin fails at once
 * with TP_ELIMIT saying so. */
static void test_rejoin_past_the_last_incarnation(void **state) {
    (void)state;
    lossy_store *ls = calloc(1, sizeof *ls);
    assert_non_null(ls);
    ls->inc_value = "16777215\t127.0.0.1:1";
    run_peers_on(ls);
    if (q.rejoin_st != TP_ELIMIT)
        fail_msg("rejoin: %s: %s", tp_status_name(q.rejoin_st), q.rejoin_msg);
    assert_non_null(strstr(q.rejoin_msg, "rank 1 has restarted 16777215 times, the most there"));
    lossy_close(&ls->base);
}

/* ---- A live earlier incarnation in the shutdown barrier (STORE-12) ------------ */

/*
 * REJOIN-1 lets an earlier incarnation still run, fenced off. Here it is
 * deterministic: a world of 3 on 4 hosts; host 3 rejoins as rank 1 at 50 ms
 * while host 1, rank 1's first incarnation, keeps running. At 300 ms w0, the
 * new w1 and the old w1 all begin a graceful shutdown; w2 begins at 1 s. The
 * barrier must wait for w2: the two processes of rank 1 count its key once
 * (spec/store.md STORE-12), so "sd/arrive/count" cannot reach 3 without w2.
 * A count per process would reach 3 at 300 ms, and w0 would pass the
 * barrier, drain and leave before w2 even arrived.
 */
#define ZOMBIE_SD_MS 300
#define LATE_SD_MS 1000

/* When each host begins its graceful shutdown, in ms (host 3: rank 1 anew). */
static uint64_t sd_ms[4];

static struct {
    tp_status rejoin_st, st[4];
    char msg[4][TP_ERRMSG_LEN_MAX];
    uint64_t began_ns[4], ended_ns[4];
    lossy_store *store; /* when the test wraps the store */
} z;

static int program_zombie(int rank, int world, void *arg) {
    (void)arg, (void)world;
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 5.0) == TP_OK);
    CHECK(tp_options_set_shutdown_timeout(o, 5.0) == TP_OK);
    if (rank == 3) { /* the new incarnation of rank 1, on its own host */
        CHECK(tp_sim_sleep(0.05) == TP_OK); /* rpc is not initialised here yet */
        CHECK(tp_options_set_rejoin(o, 1) == TP_OK);
        z.rejoin_st = tp_init_rpc("w1", "SIM", 1, 3, o);
        tp_options_free(o);
        if (z.rejoin_st != TP_OK)
            return 0;
    } else {
        char name[8];
        snprintf(name, sizeof name, "w%d", rank);
        CHECK(tp_init_rpc(name, "SIM", rank, 3, o) == TP_OK);
        tp_options_free(o);
    }
    uint64_t at = sd_ms[rank] * MS;
    if (now_ns() < at)
        CHECK(tp_sleep((double)(at - now_ns()) / 1e9) == TP_OK);
    if (rank == 1 && z.store)
        z.store->hide_inc = 1; /* its fence's look comes before the rejoin */
    z.began_ns[rank] = now_ns();
    z.st[rank] = tp_shutdown(1);
    z.ended_ns[rank] = now_ns();
    snprintf(z.msg[rank], sizeof z.msg[rank], "%s", tp_errmsg());
    return 0;
}

/* The earlier incarnation's shutdown: refused at once, naming its successor. */
static void check_zombie_fenced(void) {
    assert_int_equal(z.st[1], TP_EPEERDOWN);
    assert_non_null(strstr(z.msg[1], "replaced by incarnation 1"));
    assert_true(z.ended_ns[1] - z.began_ns[1] < 100 * MS);
}

static void test_rejoin_live_earlier_incarnation_counts_once(void **state) {
    (void)state;
    sd_ms[0] = sd_ms[1] = sd_ms[3] = ZOMBIE_SD_MS;
    sd_ms[2] = LATE_SD_MS;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        memset(&z, 0, sizeof z);
        tp_sim_config cfg = {.hosts = 4, .seed = seed};
        tp_sim *sim = NULL;
        assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
        assert_int_equal(tp_sim_run(sim, program_zombie, NULL, NULL), TP_OK);
        for (int h = 0; h < 4; h++)
            print_message("seed %llu host %d: shutdown %.3f..%.3f ms: %s %s\n",
                          (unsigned long long)seed, h, (double)z.began_ns[h] / 1e6,
                          (double)z.ended_ns[h] / 1e6, tp_status_name(z.st[h]), z.msg[h]);
        assert_int_equal(failures, 0);
        assert_int_equal(tp_sim_violations(sim), 0);
        assert_false(tp_sim_host_dead(sim, 1)); /* the earlier incarnation is alive */
        tp_sim_free(sim);
        /* The setting: the rejoin worked while rank 1's first process ran on. */
        assert_int_equal(z.rejoin_st, TP_OK);
        assert_true(z.began_ns[2] >= LATE_SD_MS * MS);
        /* The check: no worker of the job ends its shutdown before w2 began its own. */
        assert_true(z.ended_ns[0] >= z.began_ns[2]);
        assert_true(z.ended_ns[3] >= z.began_ns[2]);
        assert_int_equal(z.st[0], TP_OK);
        assert_int_equal(z.st[2], TP_OK);
        assert_int_equal(z.st[3], TP_OK);
        check_zombie_fenced();
    }
}

/*
 * REJOIN-1, the other order: the earlier incarnation begins its shutdown
 * first (300 ms), w0 and w2 at 1 s, rank 1's new process only at 2 s. Were
 * the old process's keys to stand for rank 1, w0 and w2 would pass every
 * barrier and leave at about 1 s, before the new w1 even began, and its
 * shutdown would return at once, its calls unwaited for. Fenced off, the old
 * one writes nothing, and the job's shutdown waits for the new one.
 */
static void test_rejoin_earlier_incarnation_shuts_down_first(void **state) {
    (void)state;
    sd_ms[1] = ZOMBIE_SD_MS;
    sd_ms[0] = sd_ms[2] = 1000;
    sd_ms[3] = 2000;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        memset(&z, 0, sizeof z);
        tp_sim_config cfg = {.hosts = 4, .seed = seed};
        tp_sim *sim = NULL;
        assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
        assert_int_equal(tp_sim_run(sim, program_zombie, NULL, NULL), TP_OK);
        assert_int_equal(failures, 0);
        assert_int_equal(tp_sim_violations(sim), 0);
        tp_sim_free(sim);
        assert_int_equal(z.rejoin_st, TP_OK);
        for (int h = 0; h < 4; h += 2) { /* w0 and w2 */
            assert_int_equal(z.st[h], TP_OK);
            assert_true(z.ended_ns[h] >= z.began_ns[3]);
        }
        assert_int_equal(z.st[3], TP_OK);
        check_zombie_fenced();
    }
}

/*
 * REJOIN-1's stated gap: the earlier incarnation's fence is a look, then a
 * write, and a rejoin between the two lets one key through. Here its look
 * at "inc/1" finds nothing (the store wrapper hides it once), so the old w1
 * writes "sd/arrive/1" at 300 ms. When the new w1 arrives at 2 s its own
 * create finds the key taken by another process of its rank: that is not an
 * error (STORE-12, the rank is counted once), and its shutdown, w0's and
 * w2's all succeed. The old w1 is fenced off at its next write, the drain's.
 */
static void test_rejoin_key_let_through_before_the_fence(void **state) {
    (void)state;
    sd_ms[1] = ZOMBIE_SD_MS;
    sd_ms[0] = sd_ms[2] = 1000;
    sd_ms[3] = 2000;
    memset(&z, 0, sizeof z);
    lossy_store *ls = calloc(1, sizeof *ls);
    assert_non_null(ls);
    ls->base.ops = &lossy_ops;
    assert_int_equal(tp_sqlite_store_open(":memory:", &ls->inner, NULL, 0), TP_OK);
    z.store = ls;
    tp_sim_config cfg = {.hosts = 4, .seed = 1, .store = &ls->base};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    assert_int_equal(tp_sim_run(sim, program_zombie, NULL, NULL), TP_OK);
    for (int h = 0; h < 4; h++)
        print_message("host %d: shutdown %.3f..%.3f ms: %s %s\n", h, (double)z.began_ns[h] / 1e6,
                      (double)z.ended_ns[h] / 1e6, tp_status_name(z.st[h]), z.msg[h]);
    assert_int_equal(failures, 0);
    assert_int_equal(tp_sim_violations(sim), 0);
    tp_sim_free(sim);
    /* The setting: the rejoin worked, the look was hidden, and the old
     * process's key (its value has no incarnation) is the one that stands. */
    assert_int_equal(z.rejoin_st, TP_OK);
    assert_int_equal(ls->hide_inc, 0);
    void *v = NULL;
    size_t len = 0;
    assert_int_equal(ls->inner->ops->get(ls->inner, "g0/sd/arrive/1", &v, &len), TP_OK);
    assert_true(len == 1 && memcmp(v, "1", 1) == 0);
    free(v);
    /* The check. */
    for (int h = 0; h < 4; h += 2)
        assert_int_equal(z.st[h], TP_OK);
    if (z.st[3] != TP_OK)
        fail_msg("the new w1's shutdown: %s: %s", tp_status_name(z.st[3]), z.msg[3]);
    assert_true(z.ended_ns[0] >= z.began_ns[3]);
    assert_int_equal(z.st[1], TP_EPEERDOWN);
    assert_non_null(strstr(z.msg[1], "replaced by incarnation 1"));
    lossy_close(&ls->base);
}

/* ---- A stale rref that reaches a third worker after the restart (RREF-20) ------ */

static struct {
    tp_status pass_st, rejoin_st, shutdown_st[3];
    uint64_t children_sent, children_after; /* w0's pending_children */
    size_t leaks;
} rl;

/* hold(rref) -> 0: the rref is only received (and freed with the args). */
static tp_status hold_fn(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *ud) {
    (void)call, (void)args, (void)kwargs, (void)ud;
    *result = tp_value_int(0);
    return TP_OK;
}

/* After init, w0 makes a value on w1 and passes its rref to w2 at once
 * (about 200 ms); the plan delays w0's frames to w2 by 500 ms from 150 ms,
 * so w2 reads the rref after w1 died (300 ms), restarted (400 ms) and told
 * w2: the rref is of the earlier incarnation. */
static int program_relay(int rank, int world, void *arg) {
    (void)arg;
    CHECK(tp_register_function("make", make_fn, NULL) == TP_OK);
    CHECK(tp_register_function("hold", hold_fn, NULL) == TP_OK);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 5.0) == TP_OK);
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    if (tp_sim_incarnation() > 0) {
        CHECK(tp_options_set_rejoin(o, 1) == TP_OK);
        rl.rejoin_st = tp_init_rpc(name, "SIM", rank, world, o);
        tp_options_free(o);
        if (rl.rejoin_st == TP_OK) {
            (void)tp_sleep(2.0);
            rl.shutdown_st[1] = tp_shutdown(1);
        }
        return 0;
    }
    CHECK(tp_init_rpc(name, "SIM", rank, world, o) == TP_OK);
    tp_options_free(o);
    if (rank == 1) {
        (void)tp_sleep(60.0); /* killed in here */
        return 0;
    }
    if (rank == 2) {
        (void)tp_sleep(2.5);
        rl.shutdown_st[2] = tp_shutdown(1);
        return 0;
    }
    (void)tp_sleep(0.2); /* past init's own frames, into the delay */
    tp_rref *rref = NULL;
    CHECK(tp_remote(tp_to_rank(1), "make", NULL, NULL, 10.0, &rref) == TP_OK);
    tp_value *v = NULL;
    CHECK(tp_rref_to_here(rref, 10.0, &v) == TP_OK); /* confirmed: only the child is pending */
    tp_value_free(v);
    tp_value *args = tp_value_list_of(1, tp_value_rref(rref));
    tp_future *f = NULL;
    CHECK(tp_rpc_async(tp_to_rank(2), "hold", args, NULL, 10.0, &f) == TP_OK);
    tp_value_free(args);
    tp_debug_info d;
    CHECK(tp_get_debug_info(&d) == TP_OK);
    rl.children_sent = d.pending_children;
    rl.pass_st = tp_future_wait(f, 10.0);
    tp_future_free(f);
    (void)tp_sleep(0.5);
    CHECK(tp_get_debug_info(&d) == TP_OK);
    rl.children_after = d.pending_children;
    tp_rref_release(rref);
    rl.shutdown_st[0] = tp_shutdown(1);
    tp_rref_leak *leaks = NULL;
    CHECK(tp_shutdown_leaks(&leaks, &rl.leaks) == TP_OK);
    free(leaks);
    return 0;
}

/* spec: RREF-20: "a holder that received an rref of an earlier incarnation
 * of its owner after that owner restarted sends no fork (its parent gets
 * the accept at once ...)". w2 is that holder; w0, the parent, sent the
 * rref before it heard of anything and must not keep its child pending for
 * a fork nobody will make (it would until its shutdown, and be reported
 * there as TP_LEAK_CHILD). */
static void test_rejoin_stale_rref_at_a_third_worker_accepted(void **state) {
    (void)state;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        memset(&rl, 0, sizeof rl);
        tp_sim_config cfg = {.hosts = 3, .seed = seed};
        tp_sim *sim = NULL;
        char err[256];
        assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
        assert_int_equal(tp_sim_load_faults(sim,
                                            "delay 0 2 150 2000 500\n"
                                            "kill 1 300\n"
                                            "restart 1 400\n",
                                            err, sizeof err),
                         TP_OK);
        assert_int_equal(tp_sim_run(sim, program_relay, NULL, NULL), TP_OK);
        assert_int_equal(failures, 0);
        assert_int_equal(tp_sim_violations(sim), 0);
        tp_sim_free(sim);
        assert_int_equal(rl.rejoin_st, TP_OK);
        assert_int_equal(rl.children_sent, 1); /* the rref went out as a child */
        assert_int_equal(rl.pass_st, TP_OK);
        assert_int_equal(rl.children_after, 0);
        assert_int_equal(rl.leaks, 0);
        for (int i = 0; i < 3; i++)
            assert_int_equal(rl.shutdown_st[i], TP_OK);
    }
}

/*
 * REJOIN-2: the store's "inc/<r>" value is "<k>\t<address>", k in
 * 1..TPI_INCARNATION_MAX written as "%u". Anything else is malformed and
 * refused (the rejoin then fails rather than taking incarnation 1 over a
 * record it cannot read): k 0, no number, a number with a leading zero or
 * a sign, past the maximum, no address. *k never reads as an answer then.
 */
static void test_rejoin_inc_parse_refuses_malformed(void **state) {
    (void)state;
    uint32_t k = 0;
    const char *addr = NULL;
    assert_int_equal(tpi_inc_parse("1\tsim:1", &k, &addr), 1);
    assert_int_equal(k, 1);
    assert_string_equal(addr, "sim:1");
    char v[64];
    snprintf(v, sizeof v, "%u\t127.0.0.1:29500", (unsigned)TPI_INCARNATION_MAX);
    assert_int_equal(tpi_inc_parse(v, &k, &addr), 1);
    assert_int_equal(k, TPI_INCARNATION_MAX);
    assert_string_equal(addr, "127.0.0.1:29500");
    static const char *const bad[] = {
        "0\tsim:1",
        "00\tsim:1",
        "01\tsim:1",
        "x\tsim:1",
        "-1\tsim:1",
        "+1\tsim:1",
        "1x\tsim:1",
        "\tsim:1",
        "1\t",
        "1",
        "",
        "16777216\tsim:1",
        "4294967297\tsim:1",
        "123456789012345678\tsim:1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (uint32_t before = 0; before <= 7; before += 7) { /* whatever *k held */
            k = before;
            addr = NULL;
            if (tpi_inc_parse(bad[i], &k, &addr) != 0)
                fail_msg("inc value \"%s\" (k was %u) accepted: k %u", bad[i], (unsigned)before,
                         (unsigned)k);
            assert_null(addr);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rejoin_inc_parse_refuses_malformed),
        cmocka_unit_test_setup(test_rejoin_new_incarnation_works, reset_failures),
        cmocka_unit_test_setup(test_rejoin_forged_rref_fields, reset_failures),
        cmocka_unit_test_setup(test_rejoin_owner_refuses_rref_of_other_incarnation, reset_failures),
        cmocka_unit_test_setup(test_rejoin_needs_the_option, reset_failures),
        cmocka_unit_test_setup(test_rejoin_checks_the_name, reset_failures),
        cmocka_unit_test_setup(test_rejoin_checks_the_world_size, reset_failures),
        cmocka_unit_test_setup(test_rejoin_refused_once_the_job_shuts_down, reset_failures),
        cmocka_unit_test_setup(test_rejoin_unreachable_peer_times_out, reset_failures),
        cmocka_unit_test_setup(test_rejoin_env_ignored_by_simulated_workers, reset_failures),
        cmocka_unit_test_setup(test_rejoin_past_the_last_incarnation, reset_failures),
        cmocka_unit_test_setup(test_rejoin_skips_a_dead_peer, reset_failures),
        cmocka_unit_test_setup(test_rejoin_two_ranks_restarted_at_once, reset_failures),
        cmocka_unit_test_setup(test_rejoin_peer_restarted_during_the_announcement, reset_failures),
        cmocka_unit_test_setup(test_rejoin_second_restart_lost_cas_reply, reset_failures),
        cmocka_unit_test_setup(test_rejoin_store_failure_in_the_gather, reset_failures),
        cmocka_unit_test_setup(test_rejoin_malformed_entries_refused, reset_failures),
        cmocka_unit_test_setup(test_rejoin_live_earlier_incarnation_counts_once, reset_failures),
        cmocka_unit_test_setup(test_rejoin_earlier_incarnation_shuts_down_first, reset_failures),
        cmocka_unit_test_setup(test_rejoin_key_let_through_before_the_fence, reset_failures),
        cmocka_unit_test_setup(test_rejoin_stale_rref_at_a_third_worker_accepted, reset_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
