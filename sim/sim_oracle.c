/*
 * sim_oracle.c: the simulator's oracle (spec/sim.md SIM-9).
 *
 * The core reports its steps through the agent's probe (AGENT-15); the
 * oracle holds them against what only the simulator knows (which host
 * really ran which function, which host is really dead, what the virtual
 * clock says) at every step and once more at the end of the run. It is
 * outside the code under test: a bug in common/ cannot also bend the check.
 *
 * Calls are keyed by (agent id, call id): every init makes a new agent, so
 * a worker that initialises again starts a fresh namespace. Served requests
 * are keyed by (serving agent id, caller rank, call id).
 *
 * The first violation is kept with its virtual time and event number, and
 * every violation is a trace line, so a replay of the seed shows it in
 * place. Checking never changes what the simulation does.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"
#include "common/codec.h"
#include "common/idmap.h"

/* What the oracle keeps per call; freed when both its end and its future's
 * completion were seen (so a run's memory follows the calls in flight). */
typedef struct ocall {
    uint32_t agent, host;
    uint32_t dst_rank, dst_host;
    uint8_t type;
    uint8_t method; /* a method call on an rref's object (METHOD-3) */
    uint8_t ended, done;
    tp_status end_status;
    uint64_t issued_ns, deadline_ns;
    char fn[48];
} ocall;

/* A user rref alive on a worker (RREF_FORK_LIVE until RREF_FORK_GONE). */
typedef struct ofork {
    uint32_t agent, host;
    tpi_gid rref, fork;
} ofork;

/* One served request: how often its function began and returned; whether
 * its caller canceled it (CANCEL-1) and whether it counts as running. */
typedef struct oserve {
    uint32_t begins, ends;
    uint8_t canceled, counted;
} oserve;

struct tpi_sim_oracle {
    tpi_idmap calls;             /* {agent, call id} -> ocall */
    tpi_idmap served;            /* {agent, caller rank << 40 | call id} -> oserve */
    tpi_idmap forks;             /* {holder agent, fork worker << 40 | fork counter} -> ofork */
    tpi_idmap recorded;          /* {owner agent, the same fork key} -> 1: forks owners record */
    tpi_idmap freed;             /* {owner agent, rref key} -> 1: values their owner freed */
    tpi_idmap canceled;          /* {caller host, call id} -> 1: REQUESTs that ended TP_ECANCELED */
    uint32_t *running;           /* by agent id: functions running now */
    uint64_t running_total;      /* the sum of running: 0 lets on_drained skip its walk */
    uint64_t *shutdown_begin_ns; /* by agent id: UINT64_MAX when not shutting down */
    uint64_t *shutdown_timeout_ns;
    uint8_t *shutdown_graceful;
    uint32_t *in_flight; /* by agent id: calls issued and not ended */
    uint8_t *drained_quiet; /* by agent id: its graceful drain found the job quiet */
    uint32_t agents_cap;
};

/* A served request is keyed by (serving agent, caller rank << 52 | call id): ids carry
 * the caller's incarnation from bit 40 (REJOIN-3), and a simulation has fewer than 2^12
 * hosts and restarts. */
#define SERVE_KEY_ID_BITS 52
_Static_assert(TPI_SIM_HOSTS_MAX <= (1u << (64 - SERVE_KEY_ID_BITS)), "ranks fit the key");
_Static_assert(TPI_SIM_RESTARTS_MAX < (1u << (SERVE_KEY_ID_BITS - 40)), "incarnations fit");

/* ---- Violations ----------------------------------------------------------------- */

void tpi_sim_violation(tp_sim *sim, const char *fmt, ...) {
    char text[TP_ERRMSG_LEN_MAX];
    va_list ap;
    va_start(ap, fmt);
    tpi_vformat(text, sizeof text, fmt, ap);
    va_end(ap);
    sim->violations++;
    tpi_sim_trace(sim, "violation %s", text);
    if (sim->violations == 1)
        tpi_format(sim->violation, sizeof sim->violation, "t=%llu ns, event %llu: %s",
                   (unsigned long long)sim->now_ns, (unsigned long long)sim->events, text);
}

void tpi_sim_oracle_busy(tp_sim *sim) {
    if (sim->instant_ns != sim->now_ns) {
        sim->instant_ns = sim->now_ns;
        sim->instant_work = 0;
        return;
    }
    if (++sim->instant_work == TPI_SIM_INSTANT_WORK_MAX)
        tpi_sim_violation(sim,
                          "busy loop: %u lock acquisitions and events at one virtual instant "
                          "(the bound is %u): something polls without letting time pass",
                          TPI_SIM_INSTANT_WORK_MAX, TPI_SIM_INSTANT_WORK_MAX);
}

/* ---- State ------------------------------------------------------------------------ */

static tpi_sim_oracle *oracle(tp_sim *sim) {
    if (!sim->oracle) {
        sim->oracle = calloc(1, sizeof *sim->oracle);
        TPI_ASSERT(sim->oracle && "the oracle cannot run without memory");
        tpi_idmap_init(&sim->oracle->calls);
        tpi_idmap_init(&sim->oracle->served);
        tpi_idmap_init(&sim->oracle->forks);
        tpi_idmap_init(&sim->oracle->recorded);
        tpi_idmap_init(&sim->oracle->freed);
        tpi_idmap_init(&sim->oracle->canceled);
    }
    return sim->oracle;
}

/* Grows the per-agent tables to cover agent id `id`. */
static void agents_cover(tpi_sim_oracle *o, uint32_t id) {
    if (id < o->agents_cap)
        return;
    uint32_t cap = o->agents_cap ? o->agents_cap : 16;
    while (cap <= id)
        cap *= 2;
    o->running = realloc(o->running, cap * sizeof *o->running);
    o->shutdown_begin_ns = realloc(o->shutdown_begin_ns, cap * sizeof *o->shutdown_begin_ns);
    o->shutdown_timeout_ns = realloc(o->shutdown_timeout_ns, cap * sizeof *o->shutdown_timeout_ns);
    o->shutdown_graceful = realloc(o->shutdown_graceful, cap * sizeof *o->shutdown_graceful);
    o->in_flight = realloc(o->in_flight, cap * sizeof *o->in_flight);
    o->drained_quiet = realloc(o->drained_quiet, cap * sizeof *o->drained_quiet);
    TPI_ASSERT(o->running && o->shutdown_begin_ns && o->shutdown_timeout_ns &&
               o->shutdown_graceful && o->in_flight && o->drained_quiet);
    for (uint32_t i = o->agents_cap; i < cap; i++) {
        o->running[i] = 0;
        o->shutdown_begin_ns[i] = UINT64_MAX;
        o->shutdown_timeout_ns[i] = 0;
        o->shutdown_graceful[i] = 0;
        o->in_flight[i] = 0;
        o->drained_quiet[i] = 0;
    }
    o->agents_cap = cap;
}

void tpi_sim_oracle_free(tp_sim *sim) {
    tpi_sim_oracle *o = sim->oracle;
    if (!o)
        return;
    for (size_t i = 0; i < o->calls.cap; i++)
        free(o->calls.slots[i].value);
    for (size_t i = 0; i < o->served.cap; i++)
        free(o->served.slots[i].value);
    for (size_t i = 0; i < o->forks.cap; i++)
        free(o->forks.slots[i].value);
    tpi_idmap_free(&o->calls);
    tpi_idmap_free(&o->served);
    tpi_idmap_free(&o->forks);
    tpi_idmap_free(&o->recorded); /* its values are markers, not memory */
    tpi_idmap_free(&o->freed);    /* the same */
    tpi_idmap_free(&o->canceled); /* the same */
    free(o->running);
    free(o->shutdown_begin_ns);
    free(o->shutdown_timeout_ns);
    free(o->shutdown_graceful);
    free(o->in_flight);
    free(o->drained_quiet);
    free(o);
    sim->oracle = NULL;
}

/* The host a rank of agent a lives on, or UINT32_MAX when a does not know it. */
static uint32_t rank_host(const tpi_sim_agent *a, uint32_t rank) {
    if (rank == a->rank)
        return a->host;
    return rank < a->npeers ? tpi_sim_peer_host(a, rank) : UINT32_MAX;
}

/* The agent running on host now (started, not stopped), or NULL. */
static tpi_sim_agent *host_agent(tp_sim *sim, uint32_t host) {
    if (host >= sim->nhosts || !sim->hosts[host].active_agent)
        return NULL;
    return tpi_sim_agent_get(sim, sim->hosts[host].active_agent - 1);
}

static const char *call_desc(const ocall *r, uint64_t id, char *buf, size_t len) {
    tpi_format(buf, len, "call %llu from host %u (agent %u) to rank %u%s%s%s",
               (unsigned long long)id, r->host, r->agent, r->dst_rank, r->fn[0] ? " '" : "", r->fn,
               r->fn[0] ? "'" : "");
    return buf;
}

/* ---- Calls -------------------------------------------------------------------------- */

static void on_issue(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p) {
    tpi_sim_oracle *o = oracle(sim);
    tpi_gid key = {a->id, p->id};
    if (tpi_idmap_get(&o->calls, key)) {
        tpi_sim_violation(sim, "host %u (agent %u) issued call id %llu twice", a->host, a->id,
                          (unsigned long long)p->id);
        return;
    }
    ocall *r = calloc(1, sizeof *r);
    TPI_ASSERT(r);
    r->agent = a->id;
    r->host = a->host;
    r->dst_rank = p->peer;
    r->dst_host = rank_host(a, p->peer);
    r->type = p->msg_type;
    r->method = p->method;
    r->issued_ns = sim->now_ns;
    r->deadline_ns = p->deadline_ns;
    tpi_copy_text(r->fn, sizeof r->fn, p->fn);
    tp_status st = tpi_idmap_put(&o->calls, key, r);
    TPI_ASSERT(st == TP_OK && "the oracle cannot run without memory");
    agents_cover(o, a->id);
    o->in_flight[a->id]++;
    tpi_sim_pf_call(sim, a->host, p->id, r->fn, 1, TP_OK, o->in_flight[a->id]);
}

/* A request that ended with what its function said must have run there. */
static void check_served(tp_sim *sim, tpi_sim_agent *a, const ocall *r, uint64_t id, tp_status st) {
    if ((r->type != TPI_MSG_REQUEST && r->type != TPI_MSG_REMOTE) ||
        (st != TP_OK && st != TP_EREMOTE) || strcmp(r->fn, "tp:ping") == 0)
        return;
    tpi_sim_agent *dst = host_agent(sim, r->dst_host);
    char desc[160];
    if (!dst) {
        tpi_sim_violation(sim, "%s ended %s, but no worker runs on host %u to have answered",
                          call_desc(r, id, desc, sizeof desc), tp_status_name(st), r->dst_host);
        return;
    }
    tpi_gid key = {dst->id, ((uint64_t)a->rank << SERVE_KEY_ID_BITS) | id};
    oserve *s = tpi_idmap_get(&sim->oracle->served, key);
    if (!s || s->ends == 0)
        tpi_sim_violation(sim,
                          "%s ended %s, but host %u (agent %u) never ran a function for it: the "
                          "reply was matched to the wrong request",
                          call_desc(r, id, desc, sizeof desc), tp_status_name(st), dst->host,
                          dst->id);
}

static void on_end(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p) {
    tpi_sim_oracle *o = oracle(sim);
    tpi_gid key = {a->id, p->id};
    ocall *r = tpi_idmap_get(&o->calls, key);
    char desc[160];
    if (!r || r->ended) {
        tpi_sim_violation(sim,
                          "host %u (agent %u): call %llu ended %s again (or was "
                          "never issued)",
                          a->host, a->id, (unsigned long long)p->id, tp_status_name(p->status));
        return;
    }
    r->ended = 1;
    r->end_status = p->status;
    agents_cover(o, a->id);
    o->in_flight[a->id] -= o->in_flight[a->id] > 0;
    tpi_sim_pf_call(sim, a->host, p->id, r->fn, 0, p->status, o->in_flight[a->id]);
    uint64_t now = sim->now_ns;
    /* A user's call times out by its own deadline only; an rref's fetch may
     * also report the creation's timeout (RREF-8), whatever its own, and so
     * may a method call on the rref's object (METHOD-3: "the rref's value
     * failed to build", with the creation's status; swarm seed 13331). */
    if (p->status == TP_ETIMEDOUT && now < r->deadline_ns && !r->method &&
        (r->type == TPI_MSG_REQUEST || r->type == TPI_MSG_REMOTE))
        tpi_sim_violation(sim, "%s timed out %.3f ms before its deadline",
                          call_desc(r, p->id, desc, sizeof desc),
                          (double)(r->deadline_ns - now) / 1e6);
    /* A paused host fires its timers when it resumes: the pause is allowed. */
    if (r->deadline_ns != UINT64_MAX && now > r->deadline_ns + TPI_SIM_ORACLE_SLACK_NS &&
        now - r->deadline_ns >
            TPI_SIM_ORACLE_SLACK_NS + tpi_sim_paused_ns(sim, a->host, r->deadline_ns, now))
        tpi_sim_violation(sim,
                          "%s ended %s %.3f ms after its deadline (slack %.3f ms): the "
                          "timeout did not fire",
                          call_desc(r, p->id, desc, sizeof desc), tp_status_name(p->status),
                          (double)(now - r->deadline_ns) / 1e6,
                          (double)TPI_SIM_ORACLE_SLACK_NS / 1e6);
    check_served(sim, a, r, p->id, p->status);
    if (p->status == TP_ECANCELED && r->type == TPI_MSG_REQUEST) {
        /* CANCEL-1: the callee may now stop counting it (SERVE_CANCEL). Keyed
         * by host: the callee's cancel may come after this agent stopped. */
        tp_status st = tpi_idmap_put(&o->canceled, (tpi_gid){a->host, p->id}, (void *)(uintptr_t)1);
        TPI_ASSERT((st == TP_OK || st == TP_EALREADY) && "the oracle cannot run without memory");
    }
    if (r->done) {
        tpi_idmap_del(&o->calls, key);
        free(r);
    }
}

static void on_done(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p) {
    tpi_sim_oracle *o = oracle(sim);
    tpi_gid key = {a->id, p->id};
    ocall *r = tpi_idmap_get(&o->calls, key);
    char desc[160];
    if (!r || r->done) {
        tpi_sim_violation(sim,
                          "host %u (agent %u): the future of call %llu completed %s: a "
                          "second completion (or its call was never issued)",
                          a->host, a->id, (unsigned long long)p->id, tp_status_name(p->status));
        return;
    }
    if (!r->ended || r->end_status != p->status)
        tpi_sim_violation(sim, "%s: its future completed %s, but the call %s",
                          call_desc(r, p->id, desc, sizeof desc), tp_status_name(p->status),
                          r->ended ? tp_status_name(r->end_status) : "had not ended");
    r->done = 1;
    if (r->ended) {
        tpi_idmap_del(&o->calls, key);
        free(r);
    }
}

/* ---- Served requests and shutdown ----------------------------------------------------- */

/* The entry of request id from rank peer served by agent a, made when new. */
static oserve *served_entry(tpi_sim_oracle *o, const tpi_sim_agent *a, uint32_t peer,
                            uint64_t id) {
    tpi_gid key = {a->id, ((uint64_t)peer << SERVE_KEY_ID_BITS) | id};
    oserve *s = tpi_idmap_get(&o->served, key);
    if (!s) {
        s = calloc(1, sizeof *s);
        TPI_ASSERT(s);
        tp_status st = tpi_idmap_put(&o->served, key, s);
        TPI_ASSERT(st == TP_OK && "the oracle cannot run without memory");
    }
    return s;
}

/* The request no longer holds a's drain (it ended, or was canceled). */
static void serve_uncount(tpi_sim_oracle *o, const tpi_sim_agent *a, oserve *s) {
    if (!s->counted)
        return;
    TPI_ASSERT(o->running[a->id] > 0 && o->running_total > 0);
    o->running[a->id]--;
    o->running_total--;
    s->counted = 0;
}

static void on_serve(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p, int begin) {
    tpi_sim_oracle *o = oracle(sim);
    agents_cover(o, a->id);
    if (p->id >> SERVE_KEY_ID_BITS) {
        tpi_sim_violation(sim, "host %u: call id %llu from rank %u is out of the oracle's range",
                          a->host, (unsigned long long)p->id, p->peer);
        return;
    }
    oserve *s = served_entry(o, a, p->peer, p->id);
    if (begin) {
        if (++s->begins > 1)
            tpi_sim_violation(sim,
                              "host %u (agent %u) runs '%s' a second time for call %llu "
                              "from rank %u",
                              a->host, a->id, p->fn, (unsigned long long)p->id, p->peer);
        if (!s->canceled) { /* one canceled before it began never holds the drain */
            o->running[a->id]++;
            o->running_total++;
            s->counted = 1;
        }
        return;
    }
    s->ends++;
    serve_uncount(o, a, s);
}

/*
 * CANCEL-1: the callee gave up a request because its caller canceled it: its
 * function may run on after the drain. Only a request whose call really
 * ended TP_ECANCELED on its caller's host is let off; the core's word alone
 * is not enough, so a core that stops counting some other request still
 * shows as a function running after the drain said the world was quiet.
 */
static void on_serve_cancel(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p) {
    tpi_sim_oracle *o = oracle(sim);
    agents_cover(o, a->id);
    uint32_t caller_host = rank_host(a, p->peer);
    if (p->id >> SERVE_KEY_ID_BITS || caller_host == UINT32_MAX ||
        !tpi_idmap_get(&o->canceled, (tpi_gid){caller_host, p->id})) {
        tpi_sim_violation(sim,
                          "host %u (agent %u) gave up call %llu from rank %u as canceled, but its "
                          "caller never canceled it",
                          a->host, a->id, (unsigned long long)p->id, p->peer);
        return;
    }
    oserve *s = served_entry(o, a, p->peer, p->id);
    s->canceled = 1;
    serve_uncount(o, a, s);
}

static void on_drained(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p) {
    tpi_sim_oracle *o = oracle(sim);
    agents_cover(o, a->id);
    if (p->status != TP_OK && p->status != TP_EPEERDOWN)
        return; /* a failed graceful shutdown promises nothing about quiet */
    o->drained_quiet[a->id] = 1;
    /* SHUTDOWN-5: termination was detected over every live worker, so no
     * function runs anywhere that took part, this worker included. With
     * none running anywhere there is nothing to look for on each host. */
    for (uint32_t h = 0; o->running_total > 0 && h < sim->nhosts; h++) {
        tpi_sim_agent *b = host_agent(sim, h);
        if (!b || sim->hosts[h].dead || b->id >= o->agents_cap || !o->running[b->id])
            continue;
        if (b != a && o->shutdown_begin_ns[b->id] == UINT64_MAX)
            continue; /* not shutting down: it did not take part (another generation) */
        tpi_sim_violation(sim,
                          "host %u's graceful shutdown drained (%s) while host %u still "
                          "runs %u function(s)",
                          a->host, tp_status_name(p->status), h, o->running[b->id]);
    }
}

static void on_shutdown(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p, int begin) {
    tpi_sim_oracle *o = oracle(sim);
    agents_cover(o, a->id);
    if (begin) {
        o->shutdown_begin_ns[a->id] = sim->now_ns;
        o->shutdown_timeout_ns[a->id] = p->deadline_ns;
        o->shutdown_graceful[a->id] = (uint8_t)p->graceful;
        return;
    }
    uint64_t began = o->shutdown_begin_ns[a->id];
    uint64_t t = o->shutdown_timeout_ns[a->id];
    if (began == UINT64_MAX || !o->shutdown_graceful[a->id] || t == UINT64_MAX)
        return;
    /* SHUTDOWN-2: the barrier and the drain each have the timeout. */
    uint64_t took = sim->now_ns - began;
    if (took > 2 * t + TPI_SIM_ORACLE_SLACK_NS + tpi_sim_paused_ns(sim, a->host, began, sim->now_ns))
        tpi_sim_violation(sim,
                          "host %u's graceful shutdown took %.3f ms, past its bound of "
                          "2 x %.3f ms",
                          a->host, (double)took / 1e6, (double)t / 1e6);
}

/* ---- RRefs ---------------------------------------------------------------------------- */

static int fork_key(tp_sim *sim, const tpi_sim_agent *a, const tp_probe *p, tpi_gid *key) {
    if (p->fork.local >> SERVE_KEY_ID_BITS) {
        tpi_sim_violation(sim, "host %u: fork %u:%llu is out of the oracle's range", a->host,
                          p->fork.worker, (unsigned long long)p->fork.local);
        return 0;
    }
    *key = (tpi_gid){a->id, ((uint64_t)p->fork.worker << SERVE_KEY_ID_BITS) | p->fork.local};
    return 1;
}

static int any_host_dead(const tp_sim *sim) {
    for (uint32_t h = 0; h < sim->nhosts; h++)
        if (sim->hosts[h].dead)
            return 1;
    return 0;
}

/* The key of the rref a probe names, in the owner agent's namespace. */
static int rref_key(tp_sim *sim, uint32_t owner_agent, const tp_probe *p, tpi_gid *key) {
    if (p->rref.local >> SERVE_KEY_ID_BITS) {
        tpi_sim_violation(sim, "rref %u:%llu is out of the oracle's range", p->rref.worker,
                          (unsigned long long)p->rref.local);
        return 0;
    }
    *key = (tpi_gid){owner_agent, ((uint64_t)p->rref.worker << SERVE_KEY_ID_BITS) | p->rref.local};
    return 1;
}

/*
 * RREF-3..6, seen from the holder: a fork that becomes live after its owner
 * freed the value was in flight when the owner let go (the check at the free
 * only sees forks already delivered). Only while no host has died (RREF-12).
 */
static void check_fork_after_free(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p) {
    tpi_sim_oracle *o = oracle(sim);
    uint32_t host = rank_host(a, p->peer); /* the owner's rank: an id names its creator */
    tpi_sim_agent *owner = host == UINT32_MAX ? NULL : host_agent(sim, host);
    tpi_gid key;
    if (!owner || any_host_dead(sim) || !rref_key(sim, owner->id, p, &key) ||
        !tpi_idmap_get(&o->freed, key))
        return;
    tpi_sim_violation(sim,
                      "host %u (agent %u) received fork %u:%llu of rref %u:%llu after its owner, "
                      "host %u (agent %u), freed the value: it was freed while the fork was on "
                      "its way",
                      a->host, a->id, p->fork.worker, (unsigned long long)p->fork.local,
                      p->rref.worker, (unsigned long long)p->rref.local, owner->host, owner->id);
}

static void on_fork(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p, int live) {
    tpi_sim_oracle *o = oracle(sim);
    tpi_gid key;
    if (!fork_key(sim, a, p, &key))
        return;
    if (live)
        check_fork_after_free(sim, a, p);
    ofork *f = tpi_idmap_get(&o->forks, key);
    if (!live) {
        if (f) {
            tpi_idmap_del(&o->forks, key);
            free(f);
        }
        return;
    }
    if (f) {
        tpi_sim_violation(sim, "host %u (agent %u) received fork %u:%llu of rref %u:%llu twice",
                          a->host, a->id, p->fork.worker, (unsigned long long)p->fork.local,
                          p->rref.worker, (unsigned long long)p->rref.local);
        return;
    }
    f = calloc(1, sizeof *f);
    TPI_ASSERT(f);
    *f = (ofork){a->id, a->host, {p->rref.worker, p->rref.local}, {p->fork.worker, p->fork.local}};
    tp_status st = tpi_idmap_put(&o->forks, key, f);
    TPI_ASSERT(st == TP_OK && "the oracle cannot run without memory");
}

/*
 * RREF-3..6: the owner frees a value only when no user rref of it is left.
 * A fork counts while its holder runs (an agent of the same generation that
 * has not stopped) and has not given it up. Only while no host has died:
 * a parent's death drops its fork at the owner before its child's fork may
 * have arrived (RREF-12), and the value may go early by design.
 */
static void on_owner_free(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p) {
    tpi_sim_oracle *o = oracle(sim);
    tpi_gid fkey;
    if (rref_key(sim, a->id, p, &fkey)) {
        tp_status st = tpi_idmap_put(&o->freed, fkey, (void *)(uintptr_t)1);
        /* Already there: a value made again after a death let its id be
         * reused (RREF-12), which the check below skips anyway. */
        TPI_ASSERT((st == TP_OK || st == TP_EALREADY) && "the oracle cannot run without memory");
    }
    if (any_host_dead(sim))
        return;
    /* Slot order: a pure function of the operations done (idmap.h). */
    for (size_t i = 0; i < o->forks.cap; i++) {
        const ofork *f = o->forks.slots[i].value;
        if (!f || f->rref.worker != p->rref.worker || f->rref.local != p->rref.local)
            continue;
        tpi_sim_agent *holder = host_agent(sim, f->host);
        if (!holder || holder->id != f->agent)
            continue; /* its worker stopped: an earlier generation, or shut down */
        tpi_sim_violation(sim,
                          "host %u (agent %u) freed the value of rref %u:%llu while host %u "
                          "(agent %u) still holds fork %u:%llu of it",
                          a->host, a->id, p->rref.worker, (unsigned long long)p->rref.local,
                          f->host, f->agent, f->fork.worker, (unsigned long long)f->fork.local);
        return;
    }
}

/*
 * RREF-15: a repeated fork (or a duplicated frame) is recorded once, and a
 * fork is removed only once it was recorded: the owner's count never takes a
 * reference twice, so a later delete cannot leave a ghost fork behind.
 */
static void on_owner_fork(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p, int add) {
    tpi_sim_oracle *o = oracle(sim);
    tpi_gid key;
    if (!fork_key(sim, a, p, &key))
        return;
    int had = tpi_idmap_get(&o->recorded, key) != NULL;
    if (add && had) {
        tpi_sim_violation(sim,
                          "host %u (agent %u) recorded fork %u:%llu of rref %u:%llu twice: a "
                          "repeat counted as a new reference (RREF-15)",
                          a->host, a->id, p->fork.worker, (unsigned long long)p->fork.local,
                          p->rref.worker, (unsigned long long)p->rref.local);
        return;
    }
    if (!add && !had) {
        tpi_sim_violation(sim,
                          "host %u (agent %u) removed fork %u:%llu of rref %u:%llu, which it "
                          "never recorded",
                          a->host, a->id, p->fork.worker, (unsigned long long)p->fork.local,
                          p->rref.worker, (unsigned long long)p->rref.local);
        return;
    }
    if (add) {
        tp_status st = tpi_idmap_put(&o->recorded, key, (void *)(uintptr_t)1);
        TPI_ASSERT(st == TP_OK && "the oracle cannot run without memory");
    } else {
        tpi_idmap_del(&o->recorded, key);
    }
}

/* RREF-18: a graceful drain that found the job quiet settled every reference,
 * so the report that follows it is empty. */
static void on_leaks(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p) {
    tpi_sim_oracle *o = oracle(sim);
    agents_cover(o, a->id);
    if (p->id > 0 && o->drained_quiet[a->id])
        tpi_sim_violation(sim,
                          "host %u (agent %u): its graceful shutdown drained, yet it reports %llu "
                          "rref leak(s) (RREF-18)",
                          a->host, a->id, (unsigned long long)p->id);
}

void tpi_sim_oracle_probe(tp_sim *sim, tpi_sim_agent *a, const tp_probe *p) {
    tpi_sim_oracle_busy(sim);
    switch (p->kind) {
    case TP_PROBE_CALL_ISSUE:
        on_issue(sim, a, p);
        break;
    case TP_PROBE_CALL_END:
        on_end(sim, a, p);
        break;
    case TP_PROBE_FUTURE_DONE:
        on_done(sim, a, p);
        break;
    case TP_PROBE_SERVE_BEGIN:
    case TP_PROBE_SERVE_END:
        on_serve(sim, a, p, p->kind == TP_PROBE_SERVE_BEGIN);
        break;
    case TP_PROBE_SHUTDOWN_BEGIN:
    case TP_PROBE_SHUTDOWN_END:
        on_shutdown(sim, a, p, p->kind == TP_PROBE_SHUTDOWN_BEGIN);
        break;
    case TP_PROBE_SHUTDOWN_DRAINED:
        on_drained(sim, a, p);
        break;
    case TP_PROBE_RREF_FORK_LIVE:
    case TP_PROBE_RREF_FORK_GONE:
        on_fork(sim, a, p, p->kind == TP_PROBE_RREF_FORK_LIVE);
        break;
    case TP_PROBE_RREF_OWNER_FREE:
        on_owner_free(sim, a, p);
        break;
    case TP_PROBE_RREF_OWNER_FORK:
    case TP_PROBE_RREF_OWNER_UNFORK:
        on_owner_fork(sim, a, p, p->kind == TP_PROBE_RREF_OWNER_FORK);
        break;
    case TP_PROBE_RREF_LEAKS:
        on_leaks(sim, a, p);
        break;
    case TP_PROBE_SERVE_CANCEL:
        on_serve_cancel(sim, a, p);
        break;
    default:
        tpi_sim_violation(sim, "host %u: unknown probe kind %d", a->host, (int)p->kind);
    }
}

/* ---- The end of the run ----------------------------------------------------------------- */

void tpi_sim_oracle_end(tp_sim *sim) {
    tpi_sim_oracle *o = sim->oracle;
    if (!o)
        return;
    /* Iterated in slot order: a pure function of the operations done (idmap.h). */
    uint64_t open = 0;
    for (size_t i = 0; i < o->calls.cap; i++) {
        ocall *r = o->calls.slots[i].value;
        if (!r)
            continue;
        if (open++ == 0) {
            char desc[160];
            tpi_sim_violation(sim, "%s never %s by the end of the run",
                              call_desc(r, o->calls.slots[i].key.local, desc, sizeof desc),
                              r->ended ? "had its future completed" : "ended");
        }
    }
    if (open > 1)
        tpi_sim_violation(sim, "%llu calls in all never completed", (unsigned long long)open);
}
