/*
 * rejoin.c: a restarted worker takes its place again (spec/lifecycle.md
 * REJOIN-4..6). The store part (the incarnation, the all-gather) is in
 * rendezvous.c; here the restarted worker tells every peer, each peer fences
 * off the earlier incarnation, and frames that incarnation minted are
 * recognised and dropped.
 */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "log.h"

#define ANNOUNCE_RETRY_FIRST_NS 1000000ull /* 1 ms */
#define ANNOUNCE_RETRY_MAX_NS 200000000ull /* 200 ms */

int tpi_rejoin_stale(const tp_core *c, uint32_t src, uint8_t type, uint64_t id) {
    /* A response carries our own id: only a pending call of ours matches it,
     * and the calls to an earlier incarnation ended when we fenced it. */
    return type != TPI_MSG_RESPONSE && TPI_INC_OF(id) < tpi_peer_inc(c, src);
}

tp_status tpi_rref_owner_check(tp_core *c, const tp_rref *r, const char *what) {
    TPI_ASSERT(tpi_lock_held(c));
    if (!tpi_rref_owner_restarted(c, r))
        return TP_OK;
    char who[TP_NAME_LEN_MAX + 32];
    return tpi_fail(TP_EPEERDOWN,
                    "%s%sthe owner of rref %u:%llu, %s, restarted (incarnation %u, the rref is "
                    "of incarnation %u): the value went with the earlier process",
                    what ? what : "", what ? ": " : "", r->id.worker,
                    (unsigned long long)r->id.local, tpi_worker_desc(c, r->owner, who, sizeof who),
                    tpi_peer_inc(c, r->owner), r->owner_inc);
}

tp_status tpi_rejoin_serve(tp_core *c, uint32_t src, const tp_value *args, char *err,
                           size_t err_len) {
    char who[TP_NAME_LEN_MAX + 32];
    int64_t k = 0;
    const char *addr = NULL;
    size_t addr_len = 0;
    if (tp_list_len(args) != 2 || tp_value_get_int(tp_list_get(args, 0), &k) != TP_OK ||
        tp_value_get_str(tp_list_get(args, 1), &addr, &addr_len) != TP_OK || k < 1 ||
        k > TPI_INCARNATION_MAX || addr_len == 0 || addr_len >= TPI_ADDR_LEN_MAX ||
        memchr(addr, '\0', addr_len)) {
        tpi_format(err, err_len, "tp:join from %s is malformed",
                   tpi_worker_desc(c, src, who, sizeof who));
        return TP_EPROTO;
    }
    if (!c->ops->set_peer) {
        tpi_format(err, err_len, "backend '%s' of %s cannot take a restarted peer",
                   c->ops->name, tpi_worker_desc(c, c->rank, who, sizeof who));
        return TP_EBACKEND;
    }
    char a[TPI_ADDR_LEN_MAX];
    memcpy(a, addr, addr_len);
    a[addr_len] = '\0';
    tpi_lock(c);
    uint32_t known = tpi_peer_inc(c, src);
    if ((uint32_t)k < known) {
        tpi_unlock(c);
        tpi_format(err, err_len, "%s already knows incarnation %u of %s; %lld is older",
                   tpi_worker_desc(c, c->rank, who, sizeof who), known, c->infos[src].name,
                   (long long)k);
        return TP_EINVAL;
    }
    tp_status st = TP_OK;
    if ((uint32_t)k > known) {
        /* REJOIN-4: everything that was bound to the earlier incarnation ends
         * here, as if it had been reported dead, then the rank is up again. */
        char msg[TP_ERRMSG_LEN_MAX];
        if (tpi_peer_inc_set(c, src, (uint32_t)k) != TP_OK) {
            tpi_unlock(c);
            tpi_format(err, err_len, "%s", tp_errmsg());
            return TP_ENOMEM;
        }
        tpi_format(msg, sizeof msg, "%s restarted as incarnation %lld: the earlier one is gone",
                   tpi_worker_desc(c, src, who, sizeof who), (long long)k);
        tpi_log(TP_LOG_INFO, "worker '%s' (rank %u): %s, now at %s", c->self.name, c->rank, msg,
                a);
        tpi_peer_dead_set(c, src, 1);
        tpi_rrefs_peer_down(c, src);
        tpi_calls_fail(c, src, TP_EPEERDOWN, msg);
        tpi_flow_peer_reset(c, src); /* FLOW-7, FLOW-8; wakes the window's waiters */
        tpi_peer *p = tpi_peer_find(c, src);
        if (p)
            p->unflushed = 0; /* what timed out went to the earlier process */
        st = c->ops->set_peer(c->agent, src, a, err, err_len);
        tpi_peer_dead_set(c, src, st != TP_OK);
    }
    tpi_unlock(c);
    return st;
}

/* One round: tp:join to every peer in `untold`; clears those that answered,
 * and sets dead[q] for those down (their untold stays: see the caller). The
 * last failure's message is kept in last. */
static tp_status announce_round(tp_core *c, const char *addr, uint8_t *untold, uint8_t *dead,
                                uint64_t deadline_ns, char *last, size_t last_len) {
    uint32_t n = c->world_size;
    tp_future **fs = calloc(n, sizeof *fs);
    if (!fs)
        return tpi_fail(TP_ENOMEM, "rejoin: out of memory for %u peers", n);
    uint64_t now = tpi_now(c);
    double timeout_s = deadline_ns == TPI_NO_DEADLINE ? TP_TIMEOUT_INFINITE
                       : deadline_ns > now          ? (double)(deadline_ns - now) / 1e9
                                                    : 1e-9;
    tp_status st = TP_OK;
    for (uint32_t q = 0; q < n && st == TP_OK; q++) {
        if (!untold[q])
            continue;
        tp_value *args = tp_value_list_of(2, tp_value_int(c->incarnation), tp_value_str(addr));
        if (!args) {
            st = tpi_fail(TP_ENOMEM, "rejoin: out of memory");
            break;
        }
        tpi_lock(c);
        tp_status cs = tpi_start_request(c, q, "rejoin", TPI_JOIN_FN, 0, args, NULL, timeout_s,
                                         &fs[q]);
        tpi_unlock(c);
        tp_value_free(args);
        if (cs == TP_EPEERDOWN) {
            dead[q] = 1;
            fs[q] = NULL;
        } else if (cs != TP_OK) {
            tpi_format(last, last_len, "%s", tp_errmsg());
            fs[q] = NULL;
        }
    }
    for (uint32_t q = 0; q < n; q++) {
        if (!fs[q])
            continue;
        tp_status fst = st == TP_OK ? tpi_future_result(c, fs[q], NULL) : TP_OK;
        tp_future_free(fs[q]);
        if (fst == TP_OK) {
            untold[q] = 0;
        } else if (fst == TP_EPEERDOWN) {
            dead[q] = 1;
        } else if (fst == TP_ETIMEDOUT || fst == TP_EIO) {
            tpi_format(last, last_len, "%s", tp_errmsg()); /* asked again */
        } else if (st == TP_OK) { /* the peer refused: say so at once */
            char who[TP_NAME_LEN_MAX + 32];
            char msg[TP_ERRMSG_LEN_MAX];
            tpi_format(msg, sizeof msg, "%s", tp_errmsg());
            st = tpi_fail(fst, "rejoin: %s refused the restart of worker '%s': %s",
                          tpi_worker_desc(c, q, who, sizeof who), c->self.name, msg);
        }
    }
    free(fs);
    return st;
}

tp_status tpi_rejoin_announce(tp_core *c, const char *addr, uint64_t deadline_ns) {
    uint32_t n = c->world_size;
    uint8_t *untold = calloc(n, 1);
    if (!untold)
        return tpi_fail(TP_ENOMEM, "rejoin: out of memory for %u peers", n);
    for (uint32_t q = 0; q < n; q++)
        untold[q] = q != c->rank;
    uint8_t *dead = calloc(n, 1);
    if (!dead) {
        free(untold);
        return tpi_fail(TP_ENOMEM, "rejoin: out of memory for %u peers", n);
    }
    char last[TP_ERRMSG_LEN_MAX] = "";
    uint64_t backoff = ANNOUNCE_RETRY_FIRST_NS;
    tp_status st;
    for (;;) {
        memset(dead, 0, n);
        st = announce_round(c, addr, untold, dead, deadline_ns, last, sizeof last);
        /* A peer that is down may have restarted too, after we read the
         * store: the later of two restarts finds the earlier's address here
         * (it published its own first), so every pair meets (REJOIN-4). */
        for (uint32_t q = 0; q < n && st == TP_OK; q++) {
            if (!dead[q])
                continue;
            uint32_t k = 0;
            char a[TPI_ADDR_LEN_MAX];
            st = tpi_rejoin_lookup(c, q, &k, a, sizeof a, deadline_ns);
            if (st != TP_OK)
                break;
            tpi_lock(c);
            if (k > tpi_peer_inc(c, q)) {
                char err[TP_ERRMSG_LEN_MAX] = "";
                st = tpi_peer_inc_set(c, q, k);
                if (st != TP_OK) {
                    tpi_unlock(c);
                    break; /* its message says so */
                }
                tpi_peer_dead_set(c, q, 0);
                st = c->ops->set_peer ? c->ops->set_peer(c->agent, q, a, err, sizeof err)
                                      : TP_EBACKEND;
                if (st != TP_OK)
                    st = tpi_fail(st, "rejoin: the backend could not take worker %u's new "
                                      "address: %s",
                                  q, err[0] ? err : "it cannot take a restarted peer");
            } else {
                untold[q] = 0; /* dead, and not back: it needs no news */
            }
            tpi_unlock(c);
        }
        uint32_t left = 0, first = 0;
        for (uint32_t q = n; q-- > 0;)
            if (untold[q]) {
                left++;
                first = q;
            }
        if (st != TP_OK || left == 0)
            break;
        /* A live peer we could not reach yet (a cut link, a busy pool): again,
         * until the init deadline; it must route to us before we serve. */
        if (deadline_ns != TPI_NO_DEADLINE && tpi_now(c) >= deadline_ns) {
            char who[TP_NAME_LEN_MAX + 32];
            st = tpi_fail(TP_ETIMEDOUT,
                          "rejoin: worker '%s' (rank %u) could not tell %s%s of its restart "
                          "before the init deadline: %s",
                          c->self.name, c->rank, tpi_worker_desc(c, first, who, sizeof who),
                          left > 1 ? " and others" : "", last);
            break;
        }
        st = tpi_store_nap(c, &backoff, ANNOUNCE_RETRY_MAX_NS, deadline_ns);
        if (st != TP_OK) {
            st = tpi_fail(st, "rejoin: the wait was interrupted: %s", tp_strerror(st));
            break;
        }
    }
    free(untold);
    free(dead);
    return st;
}
