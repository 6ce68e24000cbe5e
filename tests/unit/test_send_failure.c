/*
 * test_send_failure.c: an agent send that fails after the core registered
 * the call (spec/agent.md AGENT-8, spec/calls.md FLOW-1). rpc_sync and
 * rpc_async register a request under the core lock and send it once the lock
 * is released (common/call.c, tpi_send_deferred); when that send fails, the
 * API returns its status with a message, and the call leaves every core
 * table: its window bytes come back and graceful shutdown's drain does not
 * wait for it. The simulator never fails a send to a live peer, so a wrapper
 * backend, "SIM_FAILSEND", fails the next requests it is told to. It also
 * refuses a chosen pool hand-off (execute, AGENT-11) on w1: the callee then
 * takes that job back out of its caller's queue, and the queue must stay
 * whole for the jobs behind it.
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

#include "sim_world.h"
#include "sim_wrap.h"

#include "common/codec.h"

/* ---- The wrapper backend --------------------------------------------------------- */

static int fail_requests; /* the next this many REQUEST frames fail to send */

static int forge_fetches; /* the next this many RREF_FETCH frames name an unknown rref */
static int forge_fetch_worker = -1; /* >= 0: that creator instead (worker ids past the world) */

/* Sends g in f's place: takes f when g went (as send takes its frame), and
 * frees g when it did not. */
static tp_status send_instead(tp_agent *a, uint32_t dst, tp_frame *f, tp_frame *g) {
    tp_status st = sim_ops->send(a, dst, g);
    tp_frame_free(st == TP_OK ? f : g);
    return st;
}

/* Sends f re-encoded with forge applied to its message. Takes f on success,
 * as send does. */
static tp_status forged_send(tp_agent *a, uint32_t dst, tp_frame *f, void (*forge)(tpi_msg *)) {
    tpi_msg m;
    char err[TP_ERRMSG_LEN_MAX];
    tp_frame *g = NULL;
    CHECK(tpi_msg_decode(f, NULL, &m, err, sizeof err) == TP_OK);
    forge(&m);
    CHECK(tpi_msg_encode(&m, NULL, UINT64_MAX, &g, err, sizeof err) == TP_OK);
    tpi_msg_clear(&m);
    return send_instead(a, dst, f, g);
}

/* An RREF_FETCH with an rref id its owner never made (a forged or corrupted
 * message). */
static void forge_unknown_rref(tpi_msg *m) {
    if (forge_fetch_worker >= 0)
        m->rref.worker = (uint32_t)forge_fetch_worker;
    else
        m->rref.local += 1000000;
}

static tp_status forged_fetch_send(tp_agent *a, uint32_t dst, tp_frame *f) {
    return forged_send(a, dst, f, forge_unknown_rref);
}

static int forge_forks; /* the next this many RREF_FORK frames name owner incarnation 7 */
static int honest_forks_first; /* ... after this many pass unchanged */

/* An RREF_FORK for an owner incarnation that does not exist: what a holder
 * sends when the owner's rank restarted at the same address (TCP) before
 * the holder heard of it. */
static void forge_owner_inc(tpi_msg *m) {
    m->owner_inc = 7;
}

static tp_status forged_fork_send(tp_agent *a, uint32_t dst, tp_frame *f) {
    return forged_send(a, dst, f, forge_owner_inc);
}

/* The next this many REQUEST frames arrive as method calls (WIRE-5's METHOD
 * flag) whose arguments have the shape forge_method_shape picks, none of
 * them [rref, list]: what a buggy or hostile peer could send. */
static int forge_methods;
static int forge_method_shape;

static void forge_method_call(tpi_msg *m) {
    m->flags |= TPI_FLAG_METHOD;
    tp_value_free(m->args);
    switch (forge_method_shape) {
    case 0: /* no target, no arguments */
        m->args = tp_value_list();
        break;
    case 1: /* a target that is no rref */
        m->args = tp_value_list_of(2, tp_value_int(7), tp_value_list());
        break;
    default: /* three items */
        m->args = tp_value_list_of(3, tp_value_int(7), tp_value_list(), tp_value_list());
        break;
    }
}

static tp_status forged_method_send(tp_agent *a, uint32_t dst, tp_frame *f) {
    return forged_send(a, dst, f, forge_method_call);
}

static int corrupt_answers; /* the next this many RESPONSEs with status 0 from w1 are malformed */
static int forks_sent;      /* RREF_FORK frames sent by w0 */

/* Sends f with its result's value tag made unknown (WIRE-6: "unknown value
 * tag 99"), when f is a RESPONSE with status 0 (WIRE-5). Takes f on success. */
static tp_status corrupt_send(tp_agent *a, uint32_t dst, tp_frame *f) {
    tp_frame *g = tp_frame_flatten(f);
    CHECK(g != NULL && g->seg[0].len > TP_FRAME_HEADER_SIZE + 4);
    if (!g)
        return sim_ops->send(a, dst, f);
    uint8_t *b = tp_frame_bytes(g);
    static const uint8_t ok[4] = {0};
    CHECK(memcmp(b + TP_FRAME_HEADER_SIZE, ok, 4) == 0);
    b[TP_FRAME_HEADER_SIZE + 4] = 99;
    return send_instead(a, dst, f, g);
}

static int twice_remotes; /* the next this many REMOTE frames go twice (a peer's bug) */

/* The next this many RREF_ABANDON frames, and RREF_FETCH frames, name rref
 * 1:777 instead: an id worker 1 never made, and an abandon from a worker
 * that did not make it. */
static int forge_abandons, forge_fetches_777;

static void forge_rref_777(tpi_msg *m) {
    m->rref.worker = 1;
    m->rref.local = 777;
}

static tp_status failing_send(tp_agent *a, uint32_t dst, tp_frame *f) {
    const uint8_t *header = f->seg[0].base;
    if ((forge_abandons > 0 && header[5] == TPI_MSG_RREF_ABANDON) ||
        (forge_fetches_777 > 0 && header[5] == TPI_MSG_RREF_FETCH)) {
        if (header[5] == TPI_MSG_RREF_ABANDON)
            forge_abandons--;
        else
            forge_fetches_777--;
        return forged_send(a, dst, f, forge_rref_777);
    }
    if (twice_remotes > 0 && header[5] == TPI_MSG_REMOTE) {
        twice_remotes--;
        tp_frame *copy = tp_frame_flatten(f); /* a frame of its own, same bytes */
        CHECK(copy != NULL && copy != f);
        tp_status st = sim_ops->send(a, dst, f);
        if (copy && (st != TP_OK || sim_ops->send(a, dst, copy) != TP_OK))
            tp_frame_free(copy); /* send takes a frame only when it returns TP_OK */
        return st;
    }
    if (header[5] == TPI_MSG_RREF_FORK && tp_sim_current_host() == 0)
        forks_sent++;
    if (corrupt_answers > 0 && header[5] == 2 /* RESPONSE */ && tp_sim_current_host() == 1) {
        corrupt_answers--;
        return corrupt_send(a, dst, f);
    }
    if (forge_forks > 0 && header[5] == TPI_MSG_RREF_FORK) {
        if (honest_forks_first > 0) {
            honest_forks_first--;
            return sim_ops->send(a, dst, f);
        }
        forge_forks--;
        return forged_fork_send(a, dst, f);
    }
    if (forge_fetches > 0 && header[5] == TPI_MSG_RREF_FETCH) {
        forge_fetches--;
        return forged_fetch_send(a, dst, f);
    }
    if (forge_methods > 0 && header[5] == 1 /* REQUEST (WIRE-5) */) {
        forge_methods--;
        return forged_method_send(a, dst, f);
    }
    if (fail_requests > 0 && header[5] == 1 /* REQUEST (WIRE-5) */) {
        fail_requests--;
        return TP_EIO; /* the caller keeps f (AGENT-8) */
    }
    return sim_ops->send(a, dst, f);
}

/* On worker fail_execute_host (w1 unless a scenario says otherwise), the
 * fail_execute_at-th execute from when it was set is refused (0: none), as
 * by a pool out of memory for the work. */
static int fail_execute_at;
static int fail_execute_host = 1; /* the worker whose hand-off fails */
static int execute_failed;

static tp_status failing_execute(tp_agent *a, tp_work *w) {
    if (fail_execute_at > 0 && tp_sim_current_host() == fail_execute_host &&
        --fail_execute_at == 0) {
        execute_failed++;
        return TP_ENOMEM;
    }
    return sim_ops->execute(a, w);
}

static void wrap_ops_edit(const tp_init_params *p, tp_agent *agent, tp_agent_ops *ops) {
    (void)p, (void)agent;
    ops->send = failing_send;
    ops->execute = failing_execute;
}

/* ---- The world --------------------------------------------------------------------- */

/* make_obj(): an object kept on its owner; objs_freed counts its destroys. */
static int objs_freed;

static void obj_destroy(void *state) {
    objs_freed++;
    free(state);
}

static tp_status fn_make_obj(tp_call *call, const tp_value *args, const tp_value *kwargs,
                             tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)user_data;
    *result = tp_value_object("Obj", malloc(1), obj_destroy);
    return *result ? TP_OK : TP_ENOMEM;
}

static tp_status fn_fetch(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *user_data);

/* nap(): 50 ms asleep, holding its pool thread. */
static tp_status fn_nap(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)user_data;
    tp_status st = tp_sleep(0.05);
    *result = st == TP_OK ? tp_value_int(0) : NULL;
    return st == TP_OK && !*result ? TP_ENOMEM : st;
}

/* add_here(), non-blocking, on w1: w1 calls its own add(20, 1) (another
 * source in its round than w0) and waits for nothing; self_sum gets it. */
static int64_t self_sum;

static void self_done(tp_future *f, void *arg) {
    (void)arg;
    if (tp_future_status(f) == TP_OK)
        (void)tp_value_get_int(tp_future_value(f), &self_sum);
}

static tp_status fn_add_here(tp_call *call, const tp_value *args, const tp_value *kwargs,
                             tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)user_data, (void)result;
    tp_value *a = tp_value_list_of(2, tp_value_int(20), tp_value_int(1));
    tp_future *f = NULL;
    tp_status st = tp_rpc_async(tp_to_name("w1"), "add", a, NULL, 5.0, &f);
    tp_value_free(a);
    if (st == TP_OK)
        st = tp_future_add_done_callback(f, self_done, NULL);
    tp_future_free(f);
    return st;
}

static void world_register(void) {
    CHECK(tp_register_function("add", world_fn_add, NULL) == TP_OK);
    CHECK(tp_register_function_ex("add_here", fn_add_here, NULL, TP_FN_NONBLOCKING) == TP_OK);
    CHECK(tp_register_function("nap", fn_nap, NULL) == TP_OK);
    CHECK(tp_register_function("make_obj", fn_make_obj, NULL) == TP_OK);
    CHECK(tp_register_function("fetch", fn_fetch, NULL) == TP_OK);
}

static void sc_send_fails(world *w) {
    (void)w;
    /* Each request carries 3000 bytes of padding (add ignores kwargs), so
     * two of them leaked in the 4096-byte window would block a third. */
    static const uint8_t pad[3000];
    tp_value *args = tp_value_list_of(2, tp_value_int(1), tp_value_int(2));
    tp_value *kwargs = tp_value_map();
    CHECK(kwargs && tp_map_set(kwargs, "pad", tp_value_bytes(pad, sizeof pad)) == TP_OK);
    tp_value *res = NULL;

    fail_requests = 1;
    CHECK(tp_rpc_sync(tp_to_name("w1"), "add", args, kwargs, TP_TIMEOUT_INFINITE, &res) ==
          TP_EIO);
    CHECK(res == NULL);
    CHECK(strstr(tp_errmsg(), "rpc_sync to worker 'w1' (id 1), function 'add': send to worker "
                              "id 1 failed") != NULL);

    tp_future *f = NULL;
    fail_requests = 1;
    CHECK(tp_rpc_async(tp_to_name("w1"), "add", args, kwargs, TP_TIMEOUT_INFINITE, &f) ==
          TP_EIO);
    CHECK(f == NULL);
    CHECK(strstr(tp_errmsg(), "rpc_async to worker 'w1' (id 1), function 'add'") != NULL);
    CHECK(fail_requests == 0);

    /* The failed calls gave their window bytes back: a leak (no deadline
     * would ever end them) would make this one wait for room for ever. */
    int64_t v = 0;
    CHECK(tp_rpc_sync(tp_to_name("w1"), "add", args, kwargs, TP_TIMEOUT_INFINITE, &res) ==
          TP_OK);
    CHECK(tp_value_get_int(res, &v) == TP_OK && v == 3);
    tp_value_free(res);
    tp_value_free(kwargs);
    tp_value_free(args);
    /* world_program's graceful shutdown then checks the drain saw no call left. */
}

/*
 * AGENT-11, FAIR-1: w1 has one pool thread. nap holds it while add(1) waits
 * queued behind it; the hand-off of add(2), queued behind add(1), is
 * refused (TP_ENOMEM: no pool task could be made, AGENT-7), so w1 takes
 * add(2) back out of w0's queue (its tail) and answers it TP_ENOMEM, saying
 * so. add(3), queued next, must then follow add(1): a queue
 * whose tail still named the job taken out would lose it (and every later
 * one), and its call would wait to its deadline.
 */
static void sc_refused_handoff(world *w) {
    (void)w;
    tp_future *f[4] = {NULL};
    const char *fn[4] = {"nap", "add", "add", "add"};
    execute_failed = 0;
    fail_execute_at = 3; /* the third request's */
    for (int i = 0; i < 4; i++) {
        tp_value *args = tp_value_list_of(2, tp_value_int(i), tp_value_int(10));
        CHECK(tp_rpc_async(tp_to_name("w1"), fn[i], args, NULL, 5.0, &f[i]) == TP_OK);
        tp_value_free(args);
    }
    const tp_status want[4] = {TP_OK, TP_OK, TP_ENOMEM, TP_OK};
    for (int i = 0; i < 4; i++) {
        tp_status st = f[i] ? tp_future_wait(f[i], TP_TIMEOUT_INFINITE) : TP_EINVAL;
        if (st != want[i])
            print_error("call %d (%s): %s, want %s: %s\n", i, fn[i], tp_status_name(st),
                        tp_status_name(want[i]), tp_errmsg());
        CHECK(st == want[i]);
        if (st == TP_ENOMEM)
            CHECK(strstr(tp_errmsg(), "out of memory handing the call to its pool") != NULL);
        tp_future_free(f[i]);
    }
    CHECK(execute_failed == 1 && fail_execute_at == 0);
}

static void test_refused_handoff_keeps_the_queue_whole(void **state) {
    (void)state;
    world w = {.scenario = sc_refused_handoff, .backend = "SIM_FAILSEND", .threads = 1};
    run_world(2, 13, &w);
}

/*
 * FAIR-1, AGENT-11: a refused hand-off leaves the round as it should be.
 * (a) nap holds w1's only thread, add(1) queues behind it and add(2)'s
 * hand-off is refused: w0 keeps its place in the round for add(1), which
 * runs when nap ends (nothing else comes to put w0 back). (b) With the
 * pool idle, w0's add is refused and its queue is empty again: w0 leaves
 * the round, so a job of another source (w1's own add) and w0's next add
 * both run.
 */
static tp_status sync_add(int64_t a, int64_t *v) {
    tp_value *args = tp_value_list_of(2, tp_value_int(a), tp_value_int(10)), *res = NULL;
    tp_status st = tp_rpc_sync(tp_to_name("w1"), "add", args, NULL, 5.0, &res);
    if (st == TP_OK)
        CHECK(tp_value_get_int(res, v) == TP_OK);
    tp_value_free(res);
    tp_value_free(args);
    return st;
}

static void sc_refused_handoff_round(world *w) {
    (void)w;
    tp_future *f[3] = {NULL};
    const char *fn[3] = {"nap", "add", "add"};
    execute_failed = 0;
    fail_execute_at = 3;
    for (int i = 0; i < 3; i++) {
        tp_value *args = tp_value_list_of(2, tp_value_int(i), tp_value_int(10));
        CHECK(tp_rpc_async(tp_to_name("w1"), fn[i], args, NULL, 5.0, &f[i]) == TP_OK);
        tp_value_free(args);
    }
    const tp_status want[3] = {TP_OK, TP_OK, TP_ENOMEM};
    for (int i = 0; i < 3; i++) {
        tp_status st = f[i] ? tp_future_wait(f[i], TP_TIMEOUT_INFINITE) : TP_EINVAL;
        if (st != want[i])
            print_error("(a) call %d (%s): %s, want %s: %s\n", i, fn[i], tp_status_name(st),
                        tp_status_name(want[i]), tp_errmsg());
        CHECK(st == want[i]);
        tp_future_free(f[i]);
    }
    int64_t v = 0;
    fail_execute_at = 1; /* (b): the pool is idle now */
    CHECK(sync_add(1, &v) == TP_ENOMEM);
    CHECK(execute_failed == 2);
    self_sum = 0;
    tp_value *res = NULL;
    CHECK(tp_rpc_sync(tp_to_name("w1"), "add_here", NULL, NULL, 5.0, &res) == TP_OK);
    tp_value_free(res);
    CHECK(sync_add(2, &v) == TP_OK && v == 12);
    CHECK(tp_sleep(0.1) == TP_OK);
    CHECK(self_sum == 21);
}

static void test_refused_handoff_keeps_the_round_whole(void **state) {
    (void)state;
    world w = {.scenario = sc_refused_handoff_round, .backend = "SIM_FAILSEND", .threads = 1};
    run_world(2, 13, &w);
}

static void test_deferred_send_failure(void **state) {
    (void)state;
    world w = {.scenario = sc_send_fails, .backend = "SIM_FAILSEND", .max_inflight_bytes = 4096};
    run_world(2, 5, &w);
}

/*
 * RREF-5, RREF-7: a request carrying two user rrefs whose send fails undoes
 * both forks: the kept children go, so releasing the rrefs afterwards sends
 * both deletes and the owner frees both values.
 */
static void sc_send_fails_with_rrefs(world *w) {
    (void)w;
    objs_freed = 0;
    tp_rref *r[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        CHECK(tp_remote(tp_to_name("w1"), "make_obj", NULL, NULL, TP_TIMEOUT_INFINITE, &r[i]) ==
              TP_OK);
        tp_value *v = NULL;
        CHECK(tp_rref_to_here(r[i], TP_TIMEOUT_INFINITE, &v) == TP_ETYPE); /* built; objects stay */
        tp_value_free(v);
    }
    tp_value *args = tp_value_list_of(2, tp_value_rref(r[0]), tp_value_rref(r[1]));
    tp_value *res = NULL;
    fail_requests = 1;
    CHECK(tp_rpc_sync(tp_to_name("w1"), "add", args, NULL, TP_TIMEOUT_INFINITE, &res) == TP_EIO);
    CHECK(fail_requests == 0);
    tp_value_free(args);
    tp_rref_release(r[0]);
    tp_rref_release(r[1]);
    CHECK(objs_freed == 0);
    /* The deletes go before this request on the same connection (AGENT-8). */
    args = tp_value_list_of(2, tp_value_int(1), tp_value_int(2));
    CHECK(tp_rpc_sync(tp_to_name("w1"), "add", args, NULL, TP_TIMEOUT_INFINITE, &res) == TP_OK);
    tp_value_free(res);
    tp_value_free(args);
    CHECK(objs_freed == 2);
}

static void test_send_failure_undoes_every_rref_fork(void **state) {
    (void)state;
    world w = {.scenario = sc_send_fails_with_rrefs, .backend = "SIM_FAILSEND"};
    run_world(2, 7, &w);
}

/*
 * RREF-8, CALL-8: a fetch naming an rref its owner does not know (a forged
 * or corrupted message, its creator maybe a worker outside the world) is
 * answered TP_EPROTO at once, naming the owner, not left unanswered until
 * the caller's deadline; the real rref stays usable.
 */
static void sc_unknown_rref_fetch(world *w) {
    (void)w;
    tp_rref *r = NULL;
    tp_value *args = tp_value_list_of(2, tp_value_int(3), tp_value_int(4));
    CHECK(tp_remote(tp_to_name("w1"), "add", args, NULL, TP_TIMEOUT_INFINITE, &r) == TP_OK);
    tp_value_free(args);
    tp_value *v = NULL;
    int64_t x = 0;
    CHECK(tp_rref_to_here(r, TP_TIMEOUT_INFINITE, &v) == TP_OK); /* the value is ready */
    tp_value_free(v);
    v = NULL;
    forge_fetches = 1;
    uint64_t t0 = now_ns();
    CHECK(tp_rref_to_here(r, 1.0, &v) == TP_EPROTO);
    CHECK(now_ns() - t0 < 10 * MS); /* answered, not timed out */
    CHECK(strstr(tp_errmsg(), "unknown on its owner 'w1'") != NULL);
    CHECK(v == NULL);
    CHECK(forge_fetches == 0);
    /* Ids whose creator is outside the world (2 in this world of 2, and
     * past it): refused alike, nothing read for a worker that is not there. */
    const int outside[] = {2, 3, INT32_MAX};
    for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
        forge_fetches = 1;
        forge_fetch_worker = outside[i];
        t0 = now_ns();
        CHECK(tp_rref_to_here(r, 1.0, &v) == TP_EPROTO);
        CHECK(now_ns() - t0 < 10 * MS);
        CHECK(strstr(tp_errmsg(), "unknown on its owner 'w1'") != NULL);
        CHECK(v == NULL && forge_fetches == 0);
    }
    forge_fetch_worker = -1;
    CHECK(tp_rref_to_here(r, TP_TIMEOUT_INFINITE, &v) == TP_OK);
    CHECK(tp_value_get_int(v, &x) == TP_OK && x == 7);
    tp_value_free(v);
    tp_rref_release(r);
}

/*
 * A REMOTE that arrives twice (the same rref id): the owner refuses the
 * second with TP_EPROTO, saying so, and frees what that frame carried (its
 * arguments: LeakSanitizer); the first is served, and the caller, whose
 * creation got the refusal, fails the rref with its text. The world serves
 * on and shuts down cleanly.
 */
static void sc_remote_twice(world *w) {
    (void)w;
    static const uint8_t pad[512]; /* arguments that would leak if kept */
    tp_value *args = tp_value_list_of(2, tp_value_int(3), tp_value_int(4));
    tp_value *kwargs = tp_value_map();
    CHECK(kwargs && tp_map_set(kwargs, "pad", tp_value_bytes(pad, sizeof pad)) == TP_OK);
    tp_rref *r = NULL;
    twice_remotes = 1;
    CHECK(tp_remote(tp_to_name("w1"), "add", args, kwargs, 5.0, &r) == TP_OK);
    CHECK(twice_remotes == 0);
    tp_value *v = NULL;
    tp_status st = tp_rref_to_here(r, 5.0, &v);
    if (st != TP_EPROTO)
        print_error("to_here: %s: %s\n", tp_status_name(st), tp_errmsg());
    CHECK(st == TP_EPROTO);
    CHECK(strstr(tp_errmsg(), "already exists on w1") != NULL);
    CHECK(v == NULL);
    tp_rref_release(r);
    /* And the next remote() works. */
    int64_t x = 0;
    CHECK(tp_remote(tp_to_name("w1"), "add", args, kwargs, 5.0, &r) == TP_OK);
    CHECK(tp_rref_to_here(r, 5.0, &v) == TP_OK && tp_value_get_int(v, &x) == TP_OK && x == 7);
    tp_value_free(v);
    tp_rref_release(r);
    tp_value_free(kwargs);
    tp_value_free(args);
}

/*
 * RREF-14: an owner takes an RREF_ABANDON only from the worker that made the
 * id. w0's abandon of its timed-out remote() arrives naming 1:777, an id
 * only w1 could make and never did: w1 records nothing, so a later fetch of
 * 1:777 is answered as any unknown id (TP_EPROTO, "unknown on its owner"),
 * not as one its creator abandoned (TP_EPEERDOWN).
 */
static void sc_abandon_from_another(world *w) {
    (void)w;
    tp_value *args = tp_value_list_of(2, tp_value_int(3), tp_value_int(4));
    tp_rref *r = NULL;
    forge_abandons = 1;
    CHECK(tp_remote(tp_to_name("w1"), "nap", NULL, NULL, 0.01, &r) == TP_OK);
    tp_value *v = NULL;
    CHECK(tp_rref_to_here(r, 5.0, &v) == TP_ETIMEDOUT);
    tp_rref_release(r);
    CHECK(tp_sleep(0.2) == TP_OK); /* the nap ended; the abandon was answered */
    CHECK(forge_abandons == 0);
    CHECK(tp_remote(tp_to_name("w1"), "add", args, NULL, 5.0, &r) == TP_OK);
    CHECK(tp_rref_to_here(r, 5.0, &v) == TP_OK);
    tp_value_free(v);
    v = NULL;
    forge_fetches_777 = 1;
    tp_status st = tp_rref_to_here(r, 5.0, &v);
    if (st != TP_EPROTO)
        print_error("fetch of 1:777: %s: %s\n", tp_status_name(st), tp_errmsg());
    CHECK(st == TP_EPROTO);
    CHECK(strstr(tp_errmsg(), "rref 1:777 is unknown on its owner 'w1'") != NULL);
    CHECK(v == NULL && forge_fetches_777 == 0);
    tp_rref_release(r);
    tp_value_free(args);
}

static void test_send_abandon_from_another_worker_ignored(void **state) {
    (void)state;
    world w = {.scenario = sc_abandon_from_another, .backend = "SIM_FAILSEND"};
    run_world(2, 29, &w);
}

static void test_send_remote_twice_refused(void **state) {
    (void)state;
    world w = {.scenario = sc_remote_twice, .backend = "SIM_FAILSEND"};
    run_world(2, 23, &w);
}

/* fetch(rref, ...) -> its value, or the sum of the values of several, on
 * whichever worker serves it; counts its runs. */
static int fetch_runs;

static tp_status fn_fetch(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *user_data) {
    (void)call, (void)kwargs, (void)user_data;
    fetch_runs++;
    size_t n = tp_list_len(args);
    if (n == 1) {
        tp_rref *r = NULL;
        if (tp_value_get_rref(tp_list_get(args, 0), &r) != TP_OK)
            return TP_EINVAL;
        return tp_rref_to_here(r, 10.0, result);
    }
    int64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        tp_rref *r = NULL;
        tp_value *v = NULL;
        int64_t x = 0;
        if (tp_value_get_rref(tp_list_get(args, i), &r) != TP_OK)
            return TP_EINVAL;
        tp_status st = tp_rref_to_here(r, 10.0, &v);
        if (st == TP_OK && tp_value_get_int(v, &x) != TP_OK)
            st = TP_ETYPE;
        tp_value_free(v);
        if (st != TP_OK)
            return st;
        sum += x;
    }
    *result = tp_value_int(sum);
    return *result ? TP_OK : TP_ENOMEM;
}

/* An rref of add(3, 4) on w1, confirmed (its value fetched once). */
static tp_rref *confirmed_sum(void) {
    tp_rref *r = NULL;
    tp_value *args = tp_value_list_of(2, tp_value_int(3), tp_value_int(4));
    CHECK(tp_remote(tp_to_name("w1"), "add", args, NULL, TP_TIMEOUT_INFINITE, &r) == TP_OK);
    tp_value_free(args);
    tp_value *v = NULL;
    CHECK(tp_rref_to_here(r, TP_TIMEOUT_INFINITE, &v) == TP_OK);
    tp_value_free(v);
    return r;
}

/* fetch(r) on w0 itself, through the loopback: the receiving user forks
 * with w1. Its status; 7 must come back when it is TP_OK. */
static tp_status fetch_on_w0(tp_rref *r) {
    tp_value *args = tp_value_list_of(1, tp_value_rref(r));
    tp_value *v = NULL;
    int64_t x = 0;
    tp_status st = tp_rpc_sync(tp_to_name("w0"), "fetch", args, NULL, 10.0, &v);
    CHECK(st == TP_OK ? tp_value_get_int(v, &x) == TP_OK && x == 7 : v == NULL);
    tp_value_free(v);
    tp_value_free(args);
    return st;
}

/*
 * RREF-20: a fork naming an owner incarnation other than the owner's own is
 * refused, not recorded: the holder's fork fails (TP_EPROTO for a newer
 * incarnation, TP_EPEERDOWN for an earlier one) and the function that
 * received the rref never runs (RREF-13).
 */
static void sc_fork_of_other_incarnation(world *w) {
    (void)w;
    tp_rref *r = confirmed_sum();
    forge_forks = 1;
    tp_status st = fetch_on_w0(r);
    if (st != TP_EPROTO)
        print_error("fetch through a forged fork: %s: %s\n", tp_status_name(st), tp_errmsg());
    CHECK(st == TP_EPROTO); /* "no such incarnation yet": a newer one than the owner's */
    CHECK(strstr(tp_errmsg(), "was not confirmed by its owner 'w1'") != NULL);
    /* The owner's own words, not just the status's name. */
    CHECK(strstr(tp_errmsg(), "no such incarnation yet") != NULL);
    CHECK(forge_forks == 0);
    CHECK(fetch_on_w0(r) == TP_OK); /* the same call with an honest fork works */
    tp_rref_release(r);
}

/*
 * RREF-13: a function runs only when every rref among its arguments is
 * confirmed, not just the first: of two rrefs, the second's fork is refused
 * (another incarnation, as above), so the call fails naming that rref and
 * the function never runs; honest forks for both, and it runs.
 */
static void sc_second_rref_fork_refused(world *w) {
    (void)w;
    tp_rref *r1 = confirmed_sum(), *r2 = confirmed_sum();
    tp_rref_gid id2 = {0, 0}, fork2;
    CHECK(tp_rref_ids(r2, &id2, &fork2) == TP_OK);
    char want[96];
    snprintf(want, sizeof want, "rref %u:%llu among its arguments was not confirmed", id2.worker,
             (unsigned long long)id2.local);
    tp_value *args = tp_value_list_of(2, tp_value_rref(r1), tp_value_rref(r2));
    honest_forks_first = 1;
    forge_forks = 1;
    fetch_runs = 0;
    tp_value *v = NULL;
    tp_status st = tp_rpc_sync(tp_to_name("w0"), "fetch", args, NULL, 10.0, &v);
    if (st != TP_EPROTO)
        print_error("fetch of two rrefs, the second's fork forged: %s: %s\n", tp_status_name(st),
                    tp_errmsg());
    CHECK(st == TP_EPROTO && v == NULL);
    CHECK(strstr(tp_errmsg(), want) != NULL);
    CHECK(fetch_runs == 0 && forge_forks == 0 && honest_forks_first == 0);
    int64_t x = 0;
    CHECK(tp_rpc_sync(tp_to_name("w0"), "fetch", args, NULL, 10.0, &v) == TP_OK);
    CHECK(tp_value_get_int(v, &x) == TP_OK && x == 14 && fetch_runs == 1);
    tp_value_free(v);
    tp_value_free(args);
    tp_rref_release(r1);
    tp_rref_release(r2);
}

/*
 * RREF-15: a malformed answer is an answer. The owner's answer to a fork
 * arrives malformed (WIRE-6, TP_EPROTO): the fork fails with it, is not sent
 * again (a retry would be answered, and the function would run), and the
 * function that received the rref never runs (RREF-13).
 */
static void sc_fork_answer_malformed(world *w) {
    (void)w;
    tp_rref *r = confirmed_sum();
    /* w1's answer to the fork is then the only RESPONSE it sends. */
    forks_sent = 0;
    corrupt_answers = 1;
    tp_status st = fetch_on_w0(r);
    if (st != TP_EPROTO)
        print_error("fetch through a fork answered malformed: %s: %s\n", tp_status_name(st),
                    tp_errmsg());
    CHECK(st == TP_EPROTO);
    CHECK(strstr(tp_errmsg(), "was not confirmed by its owner 'w1'") != NULL);
    CHECK(corrupt_answers == 0 && forks_sent == 1);
    CHECK(fetch_on_w0(r) == TP_OK); /* the same call with an honest answer works */
    CHECK(forks_sent == 2);
    tp_rref_release(r);
}

/*
 * METHOD-1 ERR-2: a method call whose arguments are not [rref, list] (a
 * peer's bug or attack; the API never sends one) is refused with TP_EPROTO
 * naming the method and the callee, at once; nothing runs and the callee
 * serves the next call.
 */
static void sc_malformed_method_call(world *w) {
    (void)w;
    for (int shape = 0; shape < 3; shape++) {
        forge_methods = 1;
        forge_method_shape = shape;
        tp_value *args = tp_value_list_of(2, tp_value_int(3), tp_value_int(4));
        tp_value *v = NULL;
        uint64_t t0 = now_ns();
        tp_status st = tp_rpc_sync(tp_to_name("w1"), "add", args, NULL, 1.0, &v);
        if (st != TP_EPROTO)
            print_error("shape %d: %s: %s\n", shape, tp_status_name(st), tp_errmsg());
        CHECK(st == TP_EPROTO);
        CHECK(strstr(tp_errmsg(), "method call 'add' to worker 'w1' (id 1) is malformed") != NULL);
        CHECK(now_ns() - t0 < 10 * MS); /* answered, not timed out */
        CHECK(v == NULL && forge_methods == 0);
        int64_t x = 0;
        CHECK(tp_rpc_sync(tp_to_name("w1"), "add", args, NULL, 1.0, &v) == TP_OK);
        CHECK(tp_value_get_int(v, &x) == TP_OK && x == 7);
        tp_value_free(v);
        tp_value_free(args);
    }
}

static void test_send_malformed_method_call_refused(void **state) {
    (void)state;
    world w = {.scenario = sc_malformed_method_call, .backend = "SIM_FAILSEND"};
    run_world(2, 13, &w);
}

/* A then-callback that counts its runs and passes the value on. */
static int then_runs;

static tp_status counted_then(tp_future *f, tp_value **result, char *errmsg, size_t errmsg_len,
                              void *user_data) {
    (void)errmsg, (void)errmsg_len, (void)user_data;
    then_runs++;
    *result = tp_value_clone(tp_future_value(f));
    return TP_OK;
}

/*
 * FUTURE-5: a then-callback the executor refuses (AGENT-11: a pool out of
 * memory) never runs; its chained future fails at once with the executor's
 * status and says why, and the graceful shutdown's drain does not wait for
 * it (the world below shuts down within its deadline).
 */
static void sc_then_not_queued(world *w) {
    (void)w;
    tp_value *args = tp_value_list_of(2, tp_value_int(3), tp_value_int(4));
    tp_future *f = NULL, *chained = NULL;
    CHECK(tp_rpc_async(tp_to_name("w1"), "add", args, NULL, 5.0, &f) == TP_OK);
    tp_value_free(args);
    CHECK(f && tp_future_wait(f, TP_TIMEOUT_INFINITE) == TP_OK);
    then_runs = 0;
    execute_failed = 0;
    fail_execute_host = 0;
    fail_execute_at = 1; /* this worker's next hand-off: the callback's */
    CHECK(tp_future_then(f, counted_then, NULL, &chained) == TP_OK);
    CHECK(execute_failed == 1);
    CHECK(chained && tp_future_done(chained)); /* at once */
    CHECK(tp_future_wait(chained, 1.0) == TP_ENOMEM);
    CHECK(strstr(tp_future_error(chained), "then-callback not run: it could not be queued") !=
          NULL);
    CHECK(tp_sleep(0.1) == TP_OK);
    CHECK(then_runs == 0);
    /* The next one is queued and runs once. */
    tp_future *again = NULL;
    CHECK(tp_future_then(f, counted_then, NULL, &again) == TP_OK);
    CHECK(again && tp_future_wait(again, 1.0) == TP_OK && then_runs == 1);
    fail_execute_host = 1;
    tp_future_free(again);
    tp_future_free(chained);
    tp_future_free(f);
}

static void test_then_not_queued_fails_its_future(void **state) {
    (void)state;
    world w = {.scenario = sc_then_not_queued, .backend = "SIM_FAILSEND"};
    run_world(2, 19, &w);
}

static void test_send_fork_answer_malformed_not_retried(void **state) {
    (void)state;
    world w = {.scenario = sc_fork_answer_malformed, .backend = "SIM_FAILSEND"};
    run_world(2, 17, &w);
}

static void test_send_fork_of_other_incarnation_refused(void **state) {
    (void)state;
    world w = {.scenario = sc_fork_of_other_incarnation, .backend = "SIM_FAILSEND"};
    run_world(2, 11, &w);
}

static void test_send_second_rref_fork_refused(void **state) {
    (void)state;
    world w = {.scenario = sc_second_rref_fork_refused, .backend = "SIM_FAILSEND"};
    run_world(2, 11, &w);
}

static void test_send_unknown_rref_fetch_answered(void **state) {
    (void)state;
    world w = {.scenario = sc_unknown_rref_fetch, .backend = "SIM_FAILSEND"};
    run_world(2, 9, &w);
}

int main(void) {
    if (sim_wrap_register("SIM_FAILSEND") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deferred_send_failure),
        cmocka_unit_test(test_send_unknown_rref_fetch_answered),
        cmocka_unit_test(test_send_remote_twice_refused),
        cmocka_unit_test(test_send_abandon_from_another_worker_ignored),
        cmocka_unit_test(test_send_fork_of_other_incarnation_refused),
        cmocka_unit_test(test_send_second_rref_fork_refused),
        cmocka_unit_test(test_send_fork_answer_malformed_not_retried),
        cmocka_unit_test(test_send_malformed_method_call_refused),
        cmocka_unit_test(test_then_not_queued_fails_its_future),
        cmocka_unit_test(test_send_failure_undoes_every_rref_fork),
        cmocka_unit_test(test_refused_handoff_keeps_the_queue_whole),
        cmocka_unit_test(test_refused_handoff_keeps_the_round_whole),
    };
    return cmocka_run_group_tests_name("send_failure", tests, NULL, NULL);
}
