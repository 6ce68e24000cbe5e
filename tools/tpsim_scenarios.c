/*
 * tpsim_scenarios.c: the built-in scenarios and the program every host runs.
 *
 * A scenario is a body that runs on every worker between init and a
 * graceful shutdown, plus optional fault setup and checks after shutdown
 * and after the run. Bodies check every result they get with tpsim_check.
 * Workload randomness comes only from tp_sim_random, so a seed replays.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/tpsim.h"

/* ---- Helpers ------------------------------------------------------------ */

/* A list of n ints; NULL on exhaustion. */
static tp_value *int_list(size_t n, const int64_t *v) {
    tp_value *list = tp_value_list();
    for (size_t i = 0; list && i < n; i++) {
        tp_value *item = tp_value_int(v[i]);
        if (!item || tp_list_append(list, item) != TP_OK) {
            tp_value_free(item);
            tp_value_free(list);
            list = NULL;
        }
    }
    return list;
}

/* A draw in [0, n) from the workload stream; n > 0 and small, so the modulo
 * bias (below n / 2^64) does not matter. */
static uint64_t draw(uint64_t n) {
    return tp_sim_random() % n;
}

/* A uniform rank in [0, world) other than not_this. world >= 2. */
static int draw_other(int world, int not_this) {
    int r = (int)draw((uint64_t)world - 1);
    return r >= not_this ? r + 1 : r;
}

/* Calls fn(args) on rank synchronously and reads an int result. */
static tp_status call_int(int rank, const char *fn, tp_value *args, int64_t *out) {
    tp_value *res = NULL;
    tp_status st =
        args ? tp_rpc_sync(tp_to_rank(rank), fn, args, NULL, TP_TIMEOUT_DEFAULT, &res) : TP_ENOMEM;
    tp_value_free(args);
    if (st == TP_OK && tp_value_get_int(res, out) != TP_OK)
        st = TP_ETYPE;
    tp_value_free(res);
    return st;
}

/* The message to show for a failed call: tp_errmsg, or the status text. */
static const char *why(tp_status st) {
    const char *m = tp_errmsg();
    return m[0] ? m : tp_strerror(st);
}

/* Reads the int a completed future holds; TP_ETYPE for another kind. */
static tp_status future_int(tp_future *f, int64_t *out) {
    tp_status st = tp_future_status(f);
    if (st == TP_OK && tp_value_get_int(tp_future_value(f), out) != TP_OK)
        st = TP_ETYPE;
    return st;
}

/* ---- seed: the seed example (worker 0 calls add(3, 4) on worker 1) ------ */

static void seed_body(int rank, int world) {
    (void)world;
    if (rank != 0)
        return;
    int64_t v = 0;
    const int64_t ab[2] = {3, 4};
    tp_status st = call_int(1, "add", int_list(2, ab), &v);
    if (st != TP_OK) {
        tpsim_check(0, "w0: add(3, 4) on w1: %s: %s", tp_status_name(st), why(st));
        return;
    }
    printf("%lld\n", (long long)v);
    tpsim_check(v == 7, "w0: add(3, 4) on w1 = %lld (expected 7)", (long long)v);
}

/* ---- fanout: 1000 async calls from worker 0 spread over the others ------ */

#define FANOUT_CALLS 1000

static void fanout_body(int rank, int world) {
    if (rank != 0)
        return;
    tp_future **futs = calloc(FANOUT_CALLS, sizeof *futs);
    int64_t *expect = calloc(FANOUT_CALLS, sizeof *expect);
    uint32_t *per_dest = calloc((size_t)world, sizeof *per_dest);
    if (!futs || !expect || !per_dest) {
        tpsim_check(0, "w0: fanout: out of memory");
        goto out;
    }
    size_t issued = 0;
    tp_status st = TP_OK;
    for (; issued < FANOUT_CALLS; issued++) {
        int dest = 1 + (int)draw((uint64_t)world - 1);
        int64_t args[3]; /* one draw per statement (SIM-1: unsequenced otherwise) */
        args[0] = (int64_t)draw(1000000);
        args[1] = (int64_t)draw(1000000);
        args[2] = (int64_t)draw(1000);
        tp_value *v = int_list(3, args);
        st = v ? tp_rpc_async(tp_to_rank(dest), "slow_add", v, NULL, TP_TIMEOUT_DEFAULT,
                              &futs[issued])
               : TP_ENOMEM;
        tp_value_free(v);
        if (st != TP_OK)
            break;
        expect[issued] = args[0] + args[1];
        per_dest[dest]++;
    }
    tpsim_check(issued == FANOUT_CALLS, "w0: issued %zu/%d rpc_async calls%s%s", issued,
                FANOUT_CALLS, st == TP_OK ? "" : ": ", st == TP_OK ? "" : why(st));
    tp_sim_trace_note("tpsim: fanout issued %zu calls", issued);

    size_t failed_index = 0;
    st = tp_future_wait_all(futs, issued, TP_TIMEOUT_INFINITE, &failed_index);
    tpsim_check(st == TP_OK, "w0: wait_all over %zu futures: %s%s%s", issued, tp_status_name(st),
                st == TP_OK ? "" : ": ",
                st == TP_OK || failed_index >= issued ? "" : tp_future_error(futs[failed_index]));

    size_t good = 0, first_bad = issued;
    for (size_t i = 0; i < issued; i++) {
        /* After a failed wait_all the rest may still be pending: wait each. */
        (void)tp_future_wait(futs[i], TP_TIMEOUT_INFINITE);
        int64_t v = 0;
        if (future_int(futs[i], &v) == TP_OK && v == expect[i])
            good++;
        else if (first_bad == issued)
            first_bad = i;
    }
    if (first_bad < issued)
        tpsim_check(0, "w0: %zu/%zu results correct; first bad: call %zu: %s %s", good, issued,
                    first_bad, tp_status_name(tp_future_status(futs[first_bad])),
                    tp_future_error(futs[first_bad]));
    else
        tpsim_check(good == FANOUT_CALLS, "w0: %zu/%d results correct", good, FANOUT_CALLS);
    uint32_t lo = UINT32_MAX, hi = 0;
    for (int d = 1; d < world; d++) {
        lo = per_dest[d] < lo ? per_dest[d] : lo;
        hi = per_dest[d] > hi ? per_dest[d] : hi;
    }
    tpsim_info("w0: calls per worker: min %u max %u over %d workers", lo, hi, world - 1);
    for (size_t i = 0; i < issued; i++)
        tp_future_free(futs[i]);
out:
    free(per_dest);
    free(expect);
    free(futs);
}

/* ---- nested: chains through every other worker, with async adds at each hop */

/* What fn_nested (tpsim_functions.c) returns on worker d for the hops in rest. */
static int64_t nested_expect(int64_t d, const int64_t *rest, size_t n) {
    int64_t total = (d + 1) * 1000;
    if (n == 0)
        return total;
    for (size_t i = 0; i < n; i++)
        total += d + rest[i];
    return total + nested_expect(rest[0], rest + 1, n - 1);
}

/* Chains start on the first few workers only: each blocks one pool task per
 * hop on every worker, and the pool is bounded. */
#define NESTED_CHAINS_MAX 4

static void nested_body(int rank, int world) {
    if (rank >= NESTED_CHAINS_MAX)
        return;
    size_t n = (size_t)world - 1;
    int64_t *hops = calloc(n, sizeof *hops);
    if (!hops) {
        tpsim_check(0, "w%d: nested: out of memory", rank);
        return;
    }
    for (size_t i = 0, r = 0; r < (size_t)world; r++) {
        if ((int)r != rank)
            hops[i++] = (int64_t)r;
    }
    for (size_t i = n - 1; i > 0; i--) { /* Fisher-Yates on the workload stream */
        size_t j = (size_t)draw(i + 1);
        int64_t t = hops[i];
        hops[i] = hops[j];
        hops[j] = t;
    }
    char path[256];
    size_t off = 0;
    for (size_t i = 0; i < n && off + 16 < sizeof path; i++)
        off += (size_t)snprintf(path + off, sizeof path - off, "%sw%lld", i ? ">" : "",
                                (long long)hops[i]);
    if (off + 16 >= sizeof path)
        snprintf(path + off, sizeof path - off, ">...");
    tp_sim_trace_note("tpsim: w%d starts nested chain %s", rank, path);

    int64_t v = 0;
    int64_t expect = nested_expect(hops[0], hops + 1, n - 1);
    tp_status st = call_int((int)hops[0], "nested", int_list(n - 1, hops + 1), &v);
    if (st != TP_OK)
        tpsim_check(0, "w%d: nested chain %s: %s: %s", rank, path, tp_status_name(st), why(st));
    else
        tpsim_check(v == expect, "w%d: nested chain %s = %lld (expected %lld)", rank, path,
                    (long long)v, (long long)expect);
    free(hops);
}

/* ---- remote: rrefs created, fetched, passed to third workers, released --- */

#define REMOTE_RANGE 10

static tp_status remote_to_here_sum(tp_rref *rref, int64_t *sum) {
    tp_value *v = NULL;
    tp_status st = tp_rref_to_here(rref, TP_TIMEOUT_DEFAULT, &v);
    *sum = 0;
    for (size_t i = 0; st == TP_OK && i < tp_list_len(v); i++) {
        int64_t x = 0;
        st = tp_value_get_int(tp_list_get(v, i), &x);
        *sum += x;
    }
    if (st == TP_OK && tp_list_len(v) != REMOTE_RANGE)
        st = TP_ETYPE;
    tp_value_free(v);
    return st;
}

/* Calls fn(rref, extra...) on rank: the rref travels as an argument. */
static tp_status remote_pass(int rank, const char *fn, tp_rref *rref, int nextra, int64_t extra,
                             int64_t *out) {
    tp_value *args = tp_value_list_of(1, tp_value_rref(rref));
    if (args && nextra && tp_list_append(args, tp_value_int(extra)) != TP_OK) {
        tp_value_free(args);
        args = NULL;
    }
    return call_int(rank, fn, args, out);
}

static void remote_ranges(int world, tp_rref *r) {
    tp_worker_info owner;
    memset(&owner, 0, sizeof owner);
    tp_status st = tp_rref_owner(r, &owner);
    tpsim_check(st == TP_OK && owner.id == 1 && strcmp(tp_rref_owner_name(r), "w1") == 0 &&
                    !tp_rref_is_owner(r),
                "w0: rref from remote(w1, make_range) is owned by w1 (owner %s id %u)",
                st == TP_OK ? owner.name : "?", (unsigned)owner.id);
    const tp_value *local = NULL;
    st = tp_rref_local_value(r, &local);
    tpsim_check(st == TP_ENOTOWNER, "w0: local_value on a user rref: %s", tp_status_name(st));

    int64_t sum = 0, want = REMOTE_RANGE * (REMOTE_RANGE - 1) / 2;
    st = remote_to_here_sum(r, &sum);
    tpsim_check(st == TP_OK && sum == want, "w0: to_here = range(%d), sum %lld: %s", REMOTE_RANGE,
                (long long)sum, st == TP_OK ? "ok" : why(st));
    /* RREF-11: the owner's answer to REMOTE confirms the rref; it may come
     * after the to_here answer, so give it a little virtual time. */
    uint64_t t0 = tpsim_now_ns();
    while (!tp_rref_confirmed_by_owner(r) && tpsim_now_ns() - t0 < TPSIM_PROMPT_NS) {
        if (tp_sleep(100e-6) != TP_OK)
            break;
    }
    tpsim_check(tp_rref_confirmed_by_owner(r),
                "w0: rref confirmed by its owner (%.3f ms after to_here)",
                (double)(tpsim_now_ns() - t0) / 1e6);

    tp_rref *clone = tp_rref_clone(r);
    tpsim_check(clone != NULL, "w0: rref_clone");
    for (int k = 2; k < world; k++) {
        int64_t got = 0;
        st = remote_pass(k, "rref_sum", (k % 2 && clone) ? clone : r, 0, 0, &got);
        tpsim_check(st == TP_OK && got == want,
                    "w0: rref passed to w%d, its to_here sum = %lld%s%s", k, (long long)got,
                    st == TP_OK ? "" : ": ", st == TP_OK ? "" : why(st));
    }
    tp_rref_release(clone);
}

static void remote_counter(int world, tp_rref *c) {
    tp_method *add = NULL, *get = NULL;
    tp_status st = tp_method_factory("add", &add);
    if (st == TP_OK)
        st = tp_method_factory("get", &get);
    if (!tpsim_check(st == TP_OK, "w0: method_factory: %s", tp_status_name(st)))
        goto out;

    int64_t count = 100;
    tp_value *res = NULL;
    tp_value *args = tp_value_list_of(1, tp_value_int(5));
    st = tp_method_call_sync(add, c, args, NULL, TP_TIMEOUT_DEFAULT, &res);
    tp_value_free(args);
    int64_t v = 0;
    if (st == TP_OK && tp_value_get_int(res, &v) != TP_OK)
        st = TP_ETYPE;
    tp_value_free(res);
    count += 5;
    tpsim_check(st == TP_OK && v == count, "w0: Counter.add(5) through the rref = %lld%s%s",
                (long long)v, st == TP_OK ? "" : ": ", st == TP_OK ? "" : why(st));

    for (int k = 2; k < world; k++) {
        st = remote_pass(k, "counter_bump", c, 1, k, &v);
        count += k;
        tpsim_check(
            st == TP_OK && v == count,
            "w0: counter rref passed to w%d, Counter.add(%d) there = %lld (expected %lld)%s%s", k,
            k, (long long)v, (long long)count, st == TP_OK ? "" : ": ", st == TP_OK ? "" : why(st));
    }

    tp_future *f = NULL;
    st = tp_method_call_async(get, c, NULL, NULL, TP_TIMEOUT_DEFAULT, &f);
    if (st == TP_OK)
        st = tp_future_wait(f, TP_TIMEOUT_INFINITE);
    if (st == TP_OK)
        st = future_int(f, &v);
    tpsim_check(st == TP_OK && v == count, "w0: Counter.get() async = %lld (expected %lld)%s%s",
                (long long)v, (long long)count, st == TP_OK ? "" : ": ",
                st == TP_OK ? "" : (f ? tp_future_error(f) : why(st)));
    tp_future_free(f);
out:
    tp_method_free(add);
    tp_method_free(get);
}

static void remote_body(int rank, int world) {
    if (rank != 0)
        return;
    tp_rref *r = NULL, *c = NULL;
    const int64_t n = REMOTE_RANGE, start = 100;
    tp_value *args = int_list(1, &n);
    tp_status st =
        args ? tp_remote(tp_to_name("w1"), "make_range", args, NULL, TP_TIMEOUT_DEFAULT, &r)
             : TP_ENOMEM;
    tp_value_free(args);
    if (tpsim_check(st == TP_OK, "w0: remote(w1, make_range): %s", tp_status_name(st)))
        remote_ranges(world, r);

    args = int_list(1, &start);
    st = args ? tp_remote(tp_to_rank(1), "make_counter", args, NULL, TP_TIMEOUT_DEFAULT, &c)
              : TP_ENOMEM;
    tp_value_free(args);
    if (tpsim_check(st == TP_OK, "w0: remote(w1, make_counter): %s", tp_status_name(st)))
        remote_counter(world, c);

    tp_rref_release(r);
    tp_rref_release(c);
    tp_sim_trace_note("tpsim: w0 released its rrefs");
    /* Every reference is gone now (the ones passed along died with their
     * calls): the owner must free the counter without waiting for shutdown. */
    const int64_t wait[2] = {1, 2000};
    int64_t freed = 0;
    st = call_int(1, "await_destroyed", int_list(2, wait), &freed);
    tpsim_check(st == TP_OK && freed == 1,
                "w0: owner w1 freed the counter after every release (%lld freed)%s%s",
                (long long)freed, st == TP_OK ? "" : ": ", st == TP_OK ? "" : why(st));
}

static void remote_finish(int world) {
    (void)world;
    tpsim_check(tpsim_state.counters_created == 1 && tpsim_state.counters_destroyed == 1,
                "remote: counters created %llu, destroyed %llu (expected 1, 1)",
                (unsigned long long)tpsim_state.counters_created,
                (unsigned long long)tpsim_state.counters_destroyed);
}

/* ---- shutdown_load: graceful shutdown with calls still in flight -------- */

#define LOAD_CALLS 40
#define LOAD_DELAY_US_MAX 20000

typedef struct load_host {
    tp_future *futs[LOAD_CALLS];
    int64_t expect[LOAD_CALLS];
    size_t issued;
} load_host;

static load_host *load_hosts; /* world entries, allocated by the first body */
static int load_world;
static uint64_t load_expected_handlers;

static void shutdown_load_body(int rank, int world) {
    if (!load_hosts) {
        load_hosts = calloc((size_t)world, sizeof *load_hosts);
        load_world = world;
    }
    if (!load_hosts) {
        tpsim_check(0, "w%d: shutdown_load: out of memory", rank);
        return;
    }
    load_host *h = &load_hosts[rank];
    tp_status st = TP_OK;
    for (; h->issued < LOAD_CALLS; h->issued++) {
        int dest = draw_other(world, rank);
        int64_t a = (int64_t)draw(1000), b = (int64_t)draw(1000);
        int64_t delay = (int64_t)draw(LOAD_DELAY_US_MAX);
        tp_value *args;
        const char *fn;
        if (draw(4) == 0) { /* a quarter are forwarded once more: nested work to drain */
            const int64_t v[4] = {draw_other(world, dest), a, b, delay};
            args = int_list(4, v);
            fn = "forward";
            load_expected_handlers += 2;
        } else {
            const int64_t v[3] = {a, b, delay};
            args = int_list(3, v);
            fn = "slow_add";
            load_expected_handlers += 1;
        }
        st = args ? tp_rpc_async(tp_to_rank(dest), fn, args, NULL, TP_TIMEOUT_DEFAULT,
                                 &h->futs[h->issued])
                  : TP_ENOMEM;
        tp_value_free(args);
        if (st != TP_OK)
            break;
        h->expect[h->issued] = a + b;
    }
    tpsim_check(h->issued == LOAD_CALLS,
                "w%d: issued %zu/%d async calls, shutting down at once%s%s", rank, h->issued,
                LOAD_CALLS, st == TP_OK ? "" : ": ", st == TP_OK ? "" : why(st));
}

static void shutdown_load_after(int rank, int world) {
    (void)world;
    if (!load_hosts)
        return;
    load_host *h = &load_hosts[rank];
    size_t done = 0, good = 0, first_bad = h->issued;
    for (size_t i = 0; i < h->issued; i++) {
        int64_t v = 0;
        done += tp_future_done(h->futs[i]) ? 1 : 0;
        if (tp_future_done(h->futs[i]) && future_int(h->futs[i], &v) == TP_OK && v == h->expect[i])
            good++;
        else if (first_bad == h->issued)
            first_bad = i;
    }
    uint64_t running = tpsim_state.handlers_begun - tpsim_state.handlers_ended;
    if (first_bad < h->issued) {
        tp_future *f = h->futs[first_bad];
        tpsim_check(
            0, "w%d: after shutdown %zu/%zu calls done, %zu correct; first bad: call %zu: %s %s",
            rank, done, h->issued, good, first_bad,
            tp_future_done(f) ? tp_status_name(tp_future_status(f)) : "pending",
            tp_future_error(f));
    } else {
        tpsim_check(1, "w%d: after shutdown %zu/%zu calls done and correct", rank, done, h->issued);
    }
    tpsim_check(running == 0, "w%d: no handler running anywhere when shutdown returned (%llu)",
                rank, (unsigned long long)running);
    for (size_t i = 0; i < h->issued; i++)
        tp_future_free(h->futs[i]);
    h->issued = 0;
}

static void shutdown_load_finish(int world) {
    (void)world;
    tpsim_check(tpsim_state.handlers_begun == load_expected_handlers &&
                    tpsim_state.handlers_ended == load_expected_handlers,
                "shutdown_load: handlers begun %llu, ended %llu (expected %llu)",
                (unsigned long long)tpsim_state.handlers_begun,
                (unsigned long long)tpsim_state.handlers_ended,
                (unsigned long long)load_expected_handlers);
    /* Hosts killed by a fault plan never ran their after-shutdown step. */
    for (int r = 0; load_hosts && r < load_world; r++) {
        for (size_t i = 0; i < load_hosts[r].issued; i++)
            tp_future_free(load_hosts[r].futs[i]);
    }
    free(load_hosts);
    load_hosts = NULL;
}

/* ---- worker_death: a worker crashes mid-call, another is killed on time -- */

/* w1 crashes itself mid-call; the last worker is killed by the fault plan at this time. */
#define DEATH_CRASH_RANK 1
#define DEATH_KILL_AT_NS (2000ull * 1000 * 1000)
#define DEATH_SLOW_S 20

static const uint64_t death_kill_at_ns = DEATH_KILL_AT_NS;

static int death_kill_rank(int world) {
    return world - 1;
}

/* Whether rank has a slow call at w1 when it crashes: w0 and the survivors
 * w2 .. w[world-2], at most DEATH_CRASH_CALLERS_MAX of them, so that their
 * calls plus crash_self fit w1's worker pool (16 tasks by default). */
#define DEATH_CRASH_CALLERS_MAX 12

static int death_calls_crash(int rank, int world) {
    return rank == 0 || (rank >= 2 && rank <= world - 2 && rank <= DEATH_CRASH_CALLERS_MAX);
}

static int death_expect_exit(int rank, int world) {
    return rank == DEATH_CRASH_RANK || rank == death_kill_rank(world) ? 137 : 0;
}

static tp_status death_setup(tp_sim *sim, uint32_t world) {
    tpsim_state.victim_arrivals_expected = 0;
    for (uint32_t r = 0; r < world; r++)
        tpsim_state.victim_arrivals_expected += (uint32_t)death_calls_crash((int)r, (int)world);
    return tp_sim_fault_kill(sim, (uint32_t)death_kill_rank((int)world), DEATH_KILL_AT_NS);
}

static tp_future *death_slow(int dest, int counted) {
    const int64_t v[2] = {DEATH_SLOW_S, counted};
    tp_value *args = int_list(2, v);
    tp_future *f = NULL;
    tp_status st =
        args ? tp_rpc_async(tp_to_rank(dest), "victim_slow", args, NULL, TP_TIMEOUT_DEFAULT, &f)
             : TP_ENOMEM;
    tp_value_free(args);
    if (st != TP_OK)
        tpsim_check(0, "w%d: rpc_async victim_slow to w%d: %s", tp_sim_current_host(), dest,
                    why(st));
    return f;
}

/*
 * The future must fail with TP_EPEERDOWN naming the dead worker, promptly
 * after *died_at_ns (read after the wait: the death happens during it).
 */
static void death_expect_down(tp_future *f, const char *what, int dead,
                              const uint64_t *died_at_ns) {
    int me = tp_sim_current_host();
    if (!f)
        return;
    (void)tp_future_wait(f, TP_TIMEOUT_INFINITE);
    uint64_t now = tpsim_now_ns();
    uint64_t died_ns = *died_at_ns;
    tp_status st = tp_future_status(f);
    char name[16];
    tpsim_worker_name(dead, name, sizeof name);
    int named = strstr(tp_future_error(f), name) != NULL;
    uint64_t lag = died_ns && now >= died_ns ? now - died_ns : UINT64_MAX;
    tpsim_check(st == TP_EPEERDOWN && named && lag < TPSIM_PROMPT_NS,
                "w%d: %s on %s failed %s %.3f ms after it died (\"%s\")", me, what, name,
                tp_status_name(st), lag == UINT64_MAX ? -1.0 : (double)lag / 1e6,
                tp_future_error(f));
    tp_future_free(f);
}

/* A new call to a worker known dead must fail with TP_EPEERDOWN at once. */
static void death_expect_at_once(int dead) {
    int me = tp_sim_current_host();
    uint64_t t0 = tpsim_now_ns();
    const int64_t ab[2] = {1, 2};
    int64_t v = 0;
    tp_status st = call_int(dead, "add", int_list(2, ab), &v);
    uint64_t took = tpsim_now_ns() - t0;
    tpsim_check(st == TP_EPEERDOWN && took < TPSIM_AT_ONCE_NS,
                "w%d: a later call to dead w%d fails with %s after %.3f ms", me, dead,
                tp_status_name(st), (double)took / 1e6);
}

static void death_body(int rank, int world) {
    int killed = death_kill_rank(world);
    if (rank == DEATH_CRASH_RANK || rank == killed)
        return; /* the victims just serve until they die */

    tp_future *at_crash = death_calls_crash(rank, world) ? death_slow(DEATH_CRASH_RANK, 1) : NULL;
    tp_future *at_killed = rank == 0 ? NULL : death_slow(killed, 0);
    if (rank != 0) {
        if (at_crash) {
            death_expect_down(at_crash, "slow call", DEATH_CRASH_RANK, &tpsim_state.crash_ns);
            death_expect_at_once(DEATH_CRASH_RANK);
        }
        death_expect_down(at_killed, "slow call", killed, &death_kill_at_ns);
        death_expect_at_once(killed);
        return;
    }

    tp_future *crash = NULL;
    tp_status st = tp_rpc_async(tp_to_rank(DEATH_CRASH_RANK), "crash_self", NULL, NULL,
                                TP_TIMEOUT_DEFAULT, &crash);
    if (st != TP_OK) {
        tpsim_check(0, "w0: rpc_async crash_self to w1: %s: %s", tp_status_name(st), why(st));
        crash = NULL;
    }
    death_expect_down(crash, "crash_self call", DEATH_CRASH_RANK, &tpsim_state.crash_ns);
    death_expect_down(at_crash, "slow call", DEATH_CRASH_RANK, &tpsim_state.crash_ns);
    death_expect_at_once(DEATH_CRASH_RANK);
    if (world > 3) {
        const int64_t ab[2] = {20, 22};
        int64_t v = 0;
        st = call_int(2, "add", int_list(2, ab), &v);
        tpsim_check(st == TP_OK && v == 42, "w0: survivor w2 still answers: add = %lld%s%s",
                    (long long)v, st == TP_OK ? "" : ": ", st == TP_OK ? "" : why(st));
    }

    uint64_t now = tpsim_now_ns();
    if (!tpsim_check(now < DEATH_KILL_AT_NS,
                     "w0: calling w%d at %.3f ms, before its kill at %.0f ms", killed,
                     (double)now / 1e6, (double)DEATH_KILL_AT_NS / 1e6))
        return;
    at_killed = death_slow(killed, 0);
    death_expect_down(at_killed, "slow call", killed, &death_kill_at_ns);
    death_expect_at_once(killed);
}

/* ---- The table ---------------------------------------------------------- */

const tpsim_scenario tpsim_scenarios[] = {
    {.name = "seed",
     .about = "worker 0 calls add(3, 4) on worker 1, checks and prints 7",
     .workers_min = 2,
     .workers_default = 2,
     .body = seed_body},
    {.name = "fanout",
     .about = "worker 0 issues 1000 rpc_async calls spread over the others, waits all, checks each",
     .workers_min = 2,
     .workers_default = 4,
     .body = fanout_body},
    {.name = "nested",
     .about = "chains of nested calls through every other worker, async calls at each hop",
     .workers_min = 3,
     .workers_default = 4,
     .body = nested_body},
    {.name = "remote",
     .about = "remote + to_here, rrefs passed to third workers, methods, release everywhere",
     .workers_min = 3,
     .workers_default = 4,
     .body = remote_body,
     .finish = remote_finish},
    {.name = "shutdown_load",
     .about = "graceful shutdown with async and forwarded calls in flight on every worker",
     .workers_min = 2,
     .workers_default = 4,
     .body = shutdown_load_body,
     .after_shutdown = shutdown_load_after,
     .finish = shutdown_load_finish},
    {.name = "worker_death",
     .about = "w1 crashes mid-call, the last worker is killed at 2 s: prompt TP_EPEERDOWN",
     .workers_min = 3,
     .workers_default = 4,
     .setup = death_setup,
     .body = death_body,
     .expect_exit = death_expect_exit},
};

const size_t tpsim_scenario_count = sizeof tpsim_scenarios / sizeof tpsim_scenarios[0];

const tpsim_scenario *tpsim_scenario_find(const char *name) {
    for (size_t i = 0; i < tpsim_scenario_count; i++) {
        if (strcmp(tpsim_scenarios[i].name, name) == 0)
            return &tpsim_scenarios[i];
    }
    return NULL;
}

/* ---- The program every host runs ---------------------------------------- */

/*
 * A survivor's graceful shutdown must complete with TP_OK, or with
 * TP_EPEERDOWN naming every worker the scenario kills (SHUTDOWN-8).
 */
static void check_shutdown(const tpsim_scenario *sc, int rank, int world, tp_status st,
                           uint64_t took_ns) {
    char msg[TP_ERRMSG_LEN_MAX];
    snprintf(msg, sizeof msg, "%s", st == TP_OK ? "" : why(st));
    int killed = 0, named = 1;
    for (int r = 0; sc->expect_exit && r < world; r++) {
        if (sc->expect_exit(r, world) == 0)
            continue;
        char quoted[24];
        snprintf(quoted, sizeof quoted, "'w%d'", r);
        killed++;
        named = named && strstr(msg, quoted) != NULL;
    }
    tp_status want = killed ? TP_EPEERDOWN : TP_OK;
    if (st == want && named) {
        if (killed && rank == 0)
            tpsim_info("w0: graceful shutdown: %s: %s", tp_status_name(st), msg);
        tpsim_state.shutdowns_ok++;
        if (took_ns > tpsim_state.shutdown_ns_max)
            tpsim_state.shutdown_ns_max = took_ns;
    } else {
        tpsim_check(0, "w%d: graceful shutdown: %s (expected %s%s) after %.3f ms%s%s", rank,
                    tp_status_name(st), tp_status_name(want),
                    killed ? " naming every killed worker" : "", (double)took_ns / 1e6,
                    msg[0] ? ": " : "", msg);
    }
}

int tpsim_program(int rank, int world, void *arg) {
    const tpsim_scenario *sc = arg;
    int survives = !sc->expect_exit || sc->expect_exit(rank, world) == 0;
    char name[16];
    tpsim_worker_name(rank, name, sizeof name);

    tp_status st = tpsim_register_functions();
    if (st != TP_OK) {
        tpsim_check(0, "%s: register functions: %s: %s", name, tp_status_name(st), why(st));
        return 1;
    }
    tp_options *opts = tp_options_new();
    st = opts ? tp_options_set_rpc_timeout(opts, TPSIM_RPC_TIMEOUT_S) : TP_ENOMEM;
    if (st == TP_OK)
        st = tp_init_rpc(name, "SIM", rank, world, opts);
    tp_options_free(opts);
    if (st != TP_OK && !survives && st == TP_ESHUTDOWN) {
        /* A worker the scenario kills may die while its own init still waits
         * in the last rendezvous: the others finished init and already call
         * it (INIT-8). Its init fails because its host died; nothing to check. */
        tpsim_info("%s: init_rpc cut short by the host's death: %s", name, why(st));
        tpsim_state.inits_cut++;
        return 0;
    }
    if (st != TP_OK) {
        tpsim_check(0, "%s: init_rpc: %s: %s", name, tp_status_name(st), why(st));
        return 1;
    }
    tpsim_state.inits_ok++;
    tp_sim_trace_note("tpsim: %s initialised", name);

    sc->body(rank, world);

    tp_sim_trace_note("tpsim: %s shuts down", name);
    uint64_t t0 = tpsim_now_ns();
    st = tp_shutdown(1);
    uint64_t took = tpsim_now_ns() - t0;
    if (survives) {
        check_shutdown(sc, rank, world, st, took);
        if (sc->after_shutdown)
            sc->after_shutdown(rank, world);
    }
    return tpsim_host_failures(rank) ? 1 : 0;
}
