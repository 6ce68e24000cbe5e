/*
 * shutdown.c: graceful shutdown (spec/lifecycle.md SHUTDOWN-1..8).
 *
 * Phase 1, a barrier: every worker has stopped starting new work of its own.
 * Phase 2, release: every user rref this worker still holds is deleted.
 * Phase 3, drain: rounds of (active client calls, active served requests,
 * calls ever issued) summed over all live workers, until two consecutive
 * rounds show nothing active and the same issued total. Within a round a
 * worker first waits for its own client calls; between rounds nothing can
 * have been issued unseen, so nothing can be in flight (a four-counter
 * termination argument; PyTorch's single count can stop early).
 * Each phase has the shutdown deadline; teardown follows in lifecycle.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canary.h"
#include "core.h"
#include "log.h"
#include "options.h"

#define DRAIN_POLL_NS 1000000ull /* 1 ms between looks at the local call count */
#define DRAIN_PAUSE_MAX_NS 20000000ull /* 20 ms: the longest pause between busy rounds */
#define DRAIN_ROUNDS_MAX 100000  /* bounds the loop even if the deadline is infinite */

/* Waits until this worker's own client calls are done or the deadline. */
static tp_status wait_local_quiet(tp_core *c, uint64_t deadline) {
    tp_status st = TP_OK;
    tpi_lock(c);
    while (c->active_client > 0 && tpi_now(c) < deadline) {
        uint64_t until = tpi_now(c) + DRAIN_POLL_NS;
        st = tpi_park(c, until < deadline ? until : deadline);
        if (st != TP_OK && st != TP_ETIMEDOUT)
            break; /* teardown, or an interrupt (INTERRUPT-1) */
        st = TP_OK;
    }
    uint64_t active = c->active_client;
    tpi_unlock(c);
    if (st == TP_ECANCELED)
        return tpi_fail(st, "shutdown drain: interrupted while waiting for %llu call(s) of this "
                            "worker",
                        (unsigned long long)active);
    return st;
}

/*
 * Between two rounds that saw work still active: park for *pause (doubling up
 * to DRAIN_PAUSE_MAX_NS, never past the deadline). The gather waits only for
 * live peers, so with every peer dead or done nothing else would ever yield:
 * the loop would spin at one instant while our own served requests, which
 * need the pool (or, on the simulator, the scheduler) to finish, never get to.
 */
static tp_status drain_pause(tp_core *c, uint64_t *pause, uint64_t deadline) {
    tp_status st = TP_OK;
    tpi_lock(c);
    uint64_t now = tpi_now(c);
    uint64_t until = deadline > now && deadline - now > *pause ? now + *pause : deadline;
    while (st == TP_OK && tpi_now(c) < until)
        st = tpi_park(c, until);
    tpi_unlock(c);
    *pause = *pause * 2 < DRAIN_PAUSE_MAX_NS ? *pause * 2 : DRAIN_PAUSE_MAX_NS;
    if (st == TP_ECANCELED) /* INTERRUPT-1 */
        return tpi_fail(st, "shutdown drain: interrupted between rounds");
    return st == TP_ETIMEDOUT ? TP_OK : st;
}

/*
 * A request whose caller gave up (its call timed out) may still be on the
 * wire: no counter shows it, not the caller's (the call ended) nor the
 * callee's (it has not arrived), so a drain could call the world quiet and
 * the request start a function afterwards. A ping to that peer goes on the
 * same connection and is answered only after the peer took every frame sent
 * before it (AGENT-8 order), so once it comes back every such request is
 * counted by its callee or was lost with the connection. A ping that times
 * out leaves the peer unflushed for the next round (the drain's deadline
 * bounds it).
 */
static tp_status drain_flush(tp_core *c, uint64_t deadline) {
    /* Only peers with a record were ever called (issue makes it): the walk
     * is over those, in rank order. Most rounds have no peer to flush: no
     * arrays for them. A call that times out after this look is flushed
     * next round. */
    tpi_lock(c);
    uint32_t want = 0;
    for (uint32_t i = 0; i < c->npeer_ids; i++) {
        uint32_t p = c->peer_ids[i];
        want += tpi_peer_must(c, p)->unflushed && !c->peer_dead[p];
    }
    tp_future **fs = want ? calloc(want, sizeof *fs) : NULL;
    uint32_t *peer = want ? calloc(want, sizeof *peer) : NULL;
    if (!want || !fs || !peer) {
        tpi_unlock(c);
        free(fs);
        free(peer);
        return want ? tpi_fail(TP_ENOMEM, "shutdown drain: out of memory") : TP_OK;
    }
    uint32_t n = 0;
    uint64_t now = tpi_now(c);
    double left_s = deadline == TPI_NO_DEADLINE ? TP_TIMEOUT_INFINITE
                    : deadline > now            ? (double)(deadline - now) / 1e9
                                                : 1e-9;
    /* On a transport that loses frames silently (AGENT-17) the answer may
     * never come: one attempt waits as long as an rref message's (RREF-15),
     * and the next round pings again. Elsewhere it comes, however slow. */
    if (c->loses && (left_s == TP_TIMEOUT_INFINITE || left_s > TPI_RREF_ATTEMPT_TIMEOUT_S))
        left_s = TPI_RREF_ATTEMPT_TIMEOUT_S;
    for (uint32_t i = 0; i < c->npeer_ids && n < want; i++) { /* the ones counted */
        uint32_t p = c->peer_ids[i];
        tpi_peer *rec = tpi_peer_must(c, p);
        if (!rec->unflushed || c->peer_dead[p])
            continue;
        rec->unflushed = 0;
        if (tpi_start_request(c, p, "shutdown flush", TPI_PING_FN, 0, NULL, NULL, left_s,
                              &fs[n]) == TP_OK)
            peer[n++] = p;
    }
    tp_status st = TP_OK;
    for (uint32_t i = 0; i < n; i++) {
        tp_status w = tpi_future_wait_locked(c, fs[i], TPI_NO_DEADLINE); /* the ping's own */
        if (w != TP_OK && st == TP_OK)
            st = w; /* teardown */
        if (atomic_load(&fs[i]->done) && fs[i]->status == TP_ETIMEDOUT)
            tpi_peer_must(c, peer[i])->unflushed = 1; /* still unknown: look again next round */
    }
    tpi_unlock(c);
    for (uint32_t i = 0; i < n; i++)
        tp_future_free(fs[i]);
    free(fs);
    free(peer);
    if (st == TP_ECANCELED) /* INTERRUPT-1 */
        return tpi_fail(st, "shutdown drain: interrupted while flushing %u peer(s)", n);
    return st;
}

/* "<prefix>/<rank>" = val, counted (STORE-12: tpi_store_put_counted). */
/* The sums of a drain round (STORE-12): C + S and I over the workers. */
static const char *const drain_sum_names[2] = {"active", "issued"};

static tp_status publish_counted(tp_core *c, const char *prefix, const char *val,
                                 const int64_t *sums, uint32_t nsums, int *counted,
                                 uint64_t deadline) {
    /* REJOIN-1: an earlier incarnation that lives on is fenced off like a
     * dead one. Its keys would stand for its rank in the barriers and the
     * drain, so that the job could end without the new incarnation's calls:
     * once the store names a newer incarnation, it writes none. (A look,
     * then a write: a rejoin between the two still lets one key through;
     * the new incarnation's peers fence the old one off from then on.) */
    uint32_t newest = 0;
    char addr[TPI_ADDR_LEN_MAX];
    if (tpi_rejoin_lookup(c, c->rank, &newest, addr, sizeof addr, deadline) == TP_OK &&
        newest > c->incarnation)
        return tpi_fail(TP_EPEERDOWN,
                        "shutdown: worker '%s' (rank %u, incarnation %u) was replaced by "
                        "incarnation %u (REJOIN-1): it is fenced off and takes no part in the "
                        "job's shutdown",
                        c->self.name, c->rank, c->incarnation, newest);
    tp_status st = tpi_store_put_counted(c, prefix, val, nsums ? drain_sum_names : NULL, sums,
                                         nsums, counted, deadline);
    if (st != TP_OK)
        return tpi_fail(TP_ESTORE, "shutdown: rendezvous store: %s", c->store->errmsg);
    return TP_OK;
}

/*
 * 1 when some worker already detected termination (its "sd/done" key): a
 * detection made from a complete round holds for everyone, so a worker that
 * is a round behind (it saw a peer go away early, say) stops too instead of
 * waiting for a round the finished peers will never publish.
 */
static int drain_done_elsewhere(tp_core *c, uint64_t deadline) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    void *v = NULL;
    size_t len = 0;
    tpi_key(c, key, sizeof key, "sd/done");
    if (tpi_store_get(c, key, &v, &len, deadline) != TP_OK)
        return 0;
    free(v);
    return 1;
}

static void drain_publish_done(tp_core *c, uint32_t round, uint64_t deadline) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    char val[16];
    int swapped = 0;
    tpi_key(c, key, sizeof key, "sd/done");
    size_t n = tpi_format(val, sizeof val, "%u", round);
    (void)tpi_store_cas(c, key, NULL, 0, val, n, &swapped, deadline);
}

static tp_status drain(tp_core *c, uint64_t deadline) {
    char prefix[64];
    char val[96];
    uint64_t prev_active = UINT64_MAX, prev_issued = UINT64_MAX;
    int prev_complete = 0; /* the previous round had every worker's value */
    uint64_t pause = DRAIN_POLL_NS;
    char **values = NULL; /* made by the gather when a round reads the keys */
    tp_status st = TP_OK;
    for (uint32_t round = 0; round < DRAIN_ROUNDS_MAX; round++) {
        st = wait_local_quiet(c, deadline);
        if (st == TP_OK)
            st = drain_flush(c, deadline);
        /* RREF-22: a fork whose frame the network may have lost silently
         * counts as work until its holder said whether it got it. */
        tpi_lock(c);
        size_t at_risk = st == TP_OK ? tpi_forks_at_risk(c) : 0;
        tpi_unlock(c);
        if (at_risk > 0 && st == TP_OK)
            st = wait_local_quiet(c, deadline); /* the queries just sent */
        if (st != TP_OK)
            break;
        if (drain_done_elsewhere(c, deadline))
            break; /* st is TP_OK */
        tpi_lock(c);
        uint64_t my_client = c->active_client + (uint64_t)at_risk;
        uint64_t my_served = TPI_CANARY(TPI_CANARY_DRAIN_UNDERREPORTS) ? 0 : c->active_served;
        uint64_t my_issued = c->issued;
        tpi_unlock(c);
        tpi_format(val, sizeof val, "%" PRIu64 " %" PRIu64 " %" PRIu64, my_client, my_served,
                   my_issued);
        tpi_publish_dead(c, deadline);
        tpi_format(prefix, sizeof prefix, "sd/drain/%u", round);
        /* STORE-12: the key first, then the round's sums are added up in
         * the store, then the count: a complete count says every worker's
         * key is there and its numbers are in the totals, so a worker that
         * reads the two totals and one that reads the keys (a dead rank, a
         * count that does not move) get the same sums. They are counts of
         * calls: 2^63 of them would take centuries. */
        TPI_ASSERT(my_client <= INT64_MAX / 2 && my_served <= INT64_MAX / 2 &&
                   my_issued <= INT64_MAX);
        int64_t mine[2] = {(int64_t)(my_client + my_served), (int64_t)my_issued};
        int counted = 0;
        if ((st = publish_counted(c, prefix, val, mine, 2, &counted, deadline)) != TP_OK)
            break;
        int64_t totals[2] = {0, 0};
        tpi_round_sums sums = {.names = drain_sum_names, .n = 2, .totals = totals};
        st = tpi_store_gather(c, prefix, deadline, 1, &values, &sums, counted, "shutdown drain");
        uint64_t active = 0, issued = 0;
        if (sums.have) {
            active = (uint64_t)totals[0];
            issued = (uint64_t)totals[1];
        }
        for (uint32_t r = 0; values && r < c->world_size; r++) { /* the keys were read */
            uint64_t a = 0, s = 0, i = 0;
            if (!sums.have && values[r] &&
                sscanf(values[r], "%" SCNu64 " %" SCNu64 " %" SCNu64, &a, &s, &i) == 3) {
                active += a + s;
                issued += i;
            }
            free(values[r]);
            values[r] = NULL;
        }
        if (st != TP_OK && st != TP_EPEERDOWN)
            break;
        int complete = st == TP_OK;
        if (active == 0 && prev_active == 0 && issued == prev_issued) {
            if (complete && prev_complete) /* sums over everyone: valid for all */
                drain_publish_done(c, round, deadline);
            break; /* st is TP_OK, or TP_EPEERDOWN naming the dead */
        }
        prev_complete = complete;
        if (tpi_now(c) >= deadline) {
            st = tpi_fail(TP_ETIMEDOUT, "shutdown drain: still %llu call(s) active over all workers "
                                        "at the deadline (round %u)",
                          (unsigned long long)active, round);
            break;
        }
        prev_active = active;
        prev_issued = issued;
        if (active > 0 && (st = drain_pause(c, &pause, deadline)) != TP_OK)
            break; /* teardown */
        if (round + 1 == DRAIN_ROUNDS_MAX)
            st = tpi_fail(TP_ETIMEDOUT, "shutdown drain: no quiet state after %d rounds",
                          DRAIN_ROUNDS_MAX);
    }
    free(values);
    return st;
}

/*
 * SHUTDOWN-9: every worker says it is done with the store; rank 0, whose
 * process serves the store on TCP (tcp.md TCP-11), waits for the other
 * live workers, within the phase deadline, before it returns: a process
 * that ends without exit handlers (a forked multiprocessing child) takes
 * the store with it, and a worker that finished the drain a round behind
 * still reads "sd/done" from it. Nothing here changes the drain's outcome.
 */
static void leave(tp_core *c, uint64_t deadline) {
    int counted = 0;
    if (publish_counted(c, "sd/left", "1", NULL, 0, &counted, deadline) != TP_OK)
        return;
    if (c->rank != 0)
        return;
    if (tpi_store_gather(c, "sd/left", deadline, 1, NULL, NULL, counted, "shutdown leave") !=
        TP_OK)
        tpi_log(TP_LOG_INFO, "worker '%s': %s", c->self.name, tp_errmsg());
}

tp_status tpi_shutdown_graceful(tp_core *c) {
    double t = tp_options_shutdown_timeout(c->opts);
    /* SHUTDOWN-3: the barrier. */
    uint64_t deadline = tpi_deadline_after(c, t);
    c->sd_phase = "barrier";
    tpi_publish_dead(c, deadline);
    int counted = 0;
    tp_status st = publish_counted(c, "sd/arrive", "1", NULL, 0, &counted, deadline);
    if (st == TP_OK)
        st = tpi_store_gather(c, "sd/arrive", deadline, 1, NULL, NULL, counted,
                              "shutdown barrier");
    if (st != TP_OK && st != TP_EPEERDOWN)
        return st;
    tp_status dead = st;
    char dead_msg[TP_ERRMSG_LEN_MAX] = "";
    if (dead != TP_OK)
        tpi_format(dead_msg, sizeof dead_msg, "%s", tp_errmsg());
    /* SHUTDOWN-4: user rrefs go, so owners can free their values. */
    tpi_lock(c);
    tpi_rrefs_release_all(c);
    tpi_unlock(c);
    /* SHUTDOWN-5: drain. */
    deadline = tpi_deadline_after(c, t);
    c->sd_phase = "drain";
    st = drain(c, deadline);
    if (st == TP_OK || st == TP_EPEERDOWN) {
        char msg[TP_ERRMSG_LEN_MAX];
        tpi_format(msg, sizeof msg, "%s", tp_errmsg());
        c->sd_phase = "leave";
        leave(c, deadline); /* SHUTDOWN-9 */
        if (st != TP_OK)
            tpi_fail(st, "%s", msg);
    }
    if (st == TP_OK && dead != TP_OK)
        st = tpi_fail(dead, "%s", dead_msg); /* the barrier's message names the dead */
    return st;
}
