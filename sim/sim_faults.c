/*
 * sim_faults.c: injected faults and the fault-plan text format (spec/sim.md
 * SIM-5).
 *
 * Faults are scheduled as events when they are added, so they interleave
 * with everything else by (time, seq) like any event. Delay windows are
 * looked up per send; the loss rate is drawn from the faults stream. A plan
 * is parsed and checked completely before any of it is applied, so a bad
 * line leaves the simulation as it was.
 */
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"

enum {
    F_DELAY = 1,
    F_BREAK,
    F_PARTITION,
    F_KILL,
    F_DROP,
    F_ISOLATE,
    F_SPLIT,
    F_FAILSEND,
    F_DELAYTYPE,
    F_PAUSE,
    F_CHAOS,
    F_LATENCY,
    F_BANDWIDTH,
    F_STOREDOWN,
    F_STORESLOW,
    F_RESTART
};

/* Message types by name for failsend and delaytype (spec/wire.md), index = type. */
static const char *const type_names[TPI_SIM_MSG_TYPES] = {
    "",          "request",   "response",    "remote",      "rref_fetch",
    "rref_delete", "rref_fork", "rref_accept", "rref_abandon"};

/* ---- Checks shared by the API and the plan loader ---------------------------- */

static tp_status check_fault(const tp_sim *sim, const tpi_sim_fault_line *f, char *errmsg,
                             size_t errmsg_len) {
    uint32_t n = sim->cfg.hosts;
    switch (f->kind) {
    case F_DELAY:
        if (f->a >= n || f->b >= n)
            goto bad_host;
        if (f->t0_ns >= f->t1_ns)
            goto bad_window;
        return TP_OK;
    case F_BREAK:
    case F_PARTITION:
        if (f->a >= n || f->b >= n)
            goto bad_host;
        if (f->a == f->b) {
            tpi_format(errmsg, errmsg_len, "hosts %u and %u are the same host", f->a, f->b);
            return TP_EINVAL;
        }
        if (f->kind == F_PARTITION && f->t0_ns >= f->t1_ns)
            goto bad_window;
        return TP_OK;
    case F_KILL:
    case F_RESTART:
        if (f->a >= n)
            goto bad_host;
        if (f->kind == F_RESTART && sim->restarts_planned >= TPI_SIM_RESTARTS_MAX) {
            tpi_format(errmsg, errmsg_len, "more than %u restarts in one simulation",
                       TPI_SIM_RESTARTS_MAX);
            return TP_ELIMIT;
        }
        return TP_OK;
    case F_STOREDOWN:
    case F_STORESLOW:
        if (f->t0_ns >= f->t1_ns)
            goto bad_window;
        return TP_OK;
    case F_ISOLATE:
    case F_PAUSE:
        if (f->a >= n)
            goto bad_host;
        if (f->t0_ns >= f->t1_ns)
            goto bad_window;
        return TP_OK;
    case F_SPLIT:
        if (f->a == 0 || f->a >= n) {
            tpi_format(errmsg, errmsg_len, "split at %u leaves a side empty: hosts are 0..%u", f->a,
                       n - 1);
            return TP_EINVAL;
        }
        if (f->t0_ns >= f->t1_ns)
            goto bad_window;
        return TP_OK;
    case F_FAILSEND:
        if (f->t0_ns >= f->t1_ns)
            goto bad_window;
        /* fallthrough */
    case F_DELAYTYPE:
        if (f->a == 0 || f->a >= TPI_SIM_MSG_TYPES) {
            tpi_format(errmsg, errmsg_len, "message type %u out of range 1..%u", f->a,
                       TPI_SIM_MSG_TYPES - 1);
            return TP_EINVAL;
        }
        return TP_OK;
    case F_LATENCY:
    case F_BANDWIDTH:
        if ((f->a != UINT32_MAX && f->a >= n) || (f->b != UINT32_MAX && f->b >= n))
            goto bad_host;
        if (f->kind == F_LATENCY && f->t0_ns > f->t1_ns) {
            tpi_format(errmsg, errmsg_len, "latency MIN %llu ns is above MAX %llu ns",
                       (unsigned long long)f->t0_ns, (unsigned long long)f->t1_ns);
            return TP_EINVAL;
        }
        if (f->kind == F_BANDWIDTH && f->extra_ns == 0) {
            tpi_format(errmsg, errmsg_len, "bandwidth must be above 0 Mbit/s");
            return TP_EINVAL;
        }
        return TP_OK;
    case F_CHAOS:
        if ((uint64_t)f->a + f->b + f->per_million > 1000000) {
            tpi_format(errmsg, errmsg_len, "chaos rates add up to more than 1000000 per million");
            return TP_EINVAL;
        }
        /* fallthrough */
    case F_DROP:
        if (f->t0_ns >= f->t1_ns)
            goto bad_window;
        if (f->per_million > 1000000) {
            tpi_format(errmsg, errmsg_len, "drop rate %u is more than 1000000 per million",
                       f->per_million);
            return TP_EINVAL;
        }
        return TP_OK;
    }
    tpi_format(errmsg, errmsg_len, "unknown fault kind %d", f->kind);
    return TP_EINVAL;
bad_host:
    tpi_format(errmsg, errmsg_len, "host %u out of range: hosts are 0..%u", f->a >= n ? f->a : f->b,
               n - 1);
    return TP_EINVAL;
bad_window:
    tpi_format(errmsg, errmsg_len, "window [%llu, %llu) ns is empty", (unsigned long long)f->t0_ns,
               (unsigned long long)f->t1_ns);
    return TP_EINVAL;
}

static tp_status apply_fault(tp_sim *sim, const tpi_sim_fault_line *f) {
    tpi_sim_event e = {0};
    switch (f->kind) {
    case F_DELAY: {
        if (sim->ndelays == TPI_SIM_DELAYS_MAX)
            return tpi_fail(TP_ELIMIT, "more than %u delay faults", TPI_SIM_DELAYS_MAX);
        if (sim->ndelays == sim->delays_cap) {
            uint32_t cap = sim->delays_cap ? sim->delays_cap * 2 : 8;
            tpi_sim_delay *d = realloc(sim->delays, cap * sizeof *d);
            if (!d)
                return tpi_fail(TP_ENOMEM, "out of memory adding a delay fault");
            sim->delays = d;
            sim->delays_cap = cap;
        }
        sim->delays[sim->ndelays++] = (tpi_sim_delay){f->a, f->b, f->t0_ns, f->t1_ns, f->extra_ns};
        tpi_sim_trace(sim, "plan delay from=%u to=%u start=%llu end=%llu extra=%llu", f->a, f->b,
                      (unsigned long long)f->t0_ns, (unsigned long long)f->t1_ns,
                      (unsigned long long)f->extra_ns);
        return TP_OK;
    }
    case F_BREAK:
        tpi_sim_trace(sim, "plan break a=%u b=%u at=%llu", f->a, f->b,
                      (unsigned long long)f->t0_ns);
        e = (tpi_sim_event){.kind = TPI_SIM_EV_BREAK, .time_ns = f->t0_ns, .a = f->a, .b = f->b};
        tpi_sim_schedule(sim, &e);
        return TP_OK;
    case F_PARTITION:
        tpi_sim_trace(sim, "plan partition a=%u b=%u start=%llu end=%llu", f->a, f->b,
                      (unsigned long long)f->t0_ns, (unsigned long long)f->t1_ns);
        e = (tpi_sim_event){.kind = TPI_SIM_EV_PARTITION_START,
                            .time_ns = f->t0_ns,
                            .a = f->a,
                            .b = f->b,
                            .x = f->t1_ns};
        tpi_sim_schedule(sim, &e);
        e = (tpi_sim_event){
            .kind = TPI_SIM_EV_PARTITION_END, .time_ns = f->t1_ns, .a = f->a, .b = f->b};
        tpi_sim_schedule(sim, &e);
        return TP_OK;
    case F_KILL:
        tpi_sim_trace(sim, "plan kill host=%u at=%llu", f->a, (unsigned long long)f->t0_ns);
        e = (tpi_sim_event){.kind = TPI_SIM_EV_KILL, .time_ns = f->t0_ns, .a = f->a};
        tpi_sim_schedule(sim, &e);
        return TP_OK;
    case F_RESTART:
        sim->restarts_planned++;
        tpi_sim_trace(sim, "plan restart rank=%u at=%llu", f->a, (unsigned long long)f->t0_ns);
        e = (tpi_sim_event){.kind = TPI_SIM_EV_RESTART, .time_ns = f->t0_ns, .a = f->a};
        tpi_sim_schedule(sim, &e);
        return TP_OK;
    case F_ISOLATE:
    case F_SPLIT:
        /* Group partitions are the pair partitions across the cut. */
        for (uint32_t x = 0; x < sim->cfg.hosts; x++)
            for (uint32_t y = x + 1; y < sim->cfg.hosts; y++) {
                int across =
                    f->kind == F_ISOLATE ? (x == f->a) != (y == f->a) : (x < f->a) != (y < f->a);
                if (!across)
                    continue;
                tpi_sim_fault_line pair = {
                    .kind = F_PARTITION, .a = x, .b = y, .t0_ns = f->t0_ns, .t1_ns = f->t1_ns};
                apply_fault(sim, &pair);
            }
        return TP_OK;
    case F_PAUSE: {
        if (sim->npauses == TPI_SIM_DELAYS_MAX)
            return tpi_fail(TP_ELIMIT, "more than %u pause faults", TPI_SIM_DELAYS_MAX);
        if (sim->npauses == sim->pauses_cap) {
            uint32_t cap = sim->pauses_cap ? sim->pauses_cap * 2 : 8;
            tpi_sim_pause *p = realloc(sim->pauses, cap * sizeof *p);
            if (!p)
                return tpi_fail(TP_ENOMEM, "out of memory adding a pause fault");
            sim->pauses = p;
            sim->pauses_cap = cap;
        }
        sim->pauses[sim->npauses++] = (tpi_sim_pause){f->a, f->t0_ns, f->t1_ns};
        tpi_sim_trace(sim, "plan pause host=%u start=%llu end=%llu", f->a,
                      (unsigned long long)f->t0_ns, (unsigned long long)f->t1_ns);
        e = (tpi_sim_event){
            .kind = TPI_SIM_EV_PAUSE, .time_ns = f->t0_ns, .a = f->a, .x = f->t1_ns};
        tpi_sim_schedule(sim, &e);
        e = (tpi_sim_event){.kind = TPI_SIM_EV_UNPAUSE, .time_ns = f->t1_ns, .a = f->a};
        tpi_sim_schedule(sim, &e);
        return TP_OK;
    }
    case F_STOREDOWN:
    case F_STORESLOW: {
        if (sim->nstore_faults == TPI_SIM_DELAYS_MAX)
            return tpi_fail(TP_ELIMIT, "more than %u store faults", TPI_SIM_DELAYS_MAX);
        if (sim->nstore_faults == sim->store_faults_cap) {
            uint32_t cap = sim->store_faults_cap ? sim->store_faults_cap * 2 : 4;
            tpi_sim_store_fault *p = realloc(sim->store_faults, cap * sizeof *p);
            if (!p)
                return tpi_fail(TP_ENOMEM, "out of memory adding a store fault");
            sim->store_faults = p;
            sim->store_faults_cap = cap;
        }
        sim->store_faults[sim->nstore_faults++] = (tpi_sim_store_fault){
            f->kind == F_STOREDOWN, f->t0_ns, f->t1_ns, f->extra_ns};
        tpi_sim_trace(sim, "plan %s start=%llu end=%llu extra=%llu",
                      f->kind == F_STOREDOWN ? "storedown" : "storeslow",
                      (unsigned long long)f->t0_ns, (unsigned long long)f->t1_ns,
                      (unsigned long long)f->extra_ns);
        return TP_OK;
    }
    case F_LATENCY:
    case F_BANDWIDTH: {
        if (sim->nrules == TPI_SIM_DELAYS_MAX)
            return tpi_fail(TP_ELIMIT, "more than %u link rules", TPI_SIM_DELAYS_MAX);
        if (sim->nrules == sim->rules_cap) {
            uint32_t cap = sim->rules_cap ? sim->rules_cap * 2 : 8;
            tpi_sim_link_rule *r = realloc(sim->rules, cap * sizeof *r);
            if (!r)
                return tpi_fail(TP_ENOMEM, "out of memory adding a link rule");
            sim->rules = r;
            sim->rules_cap = cap;
        }
        tpi_sim_link_rule r = {.from = f->a,
                               .to = f->b,
                               .bandwidth = f->kind == F_BANDWIDTH,
                               .dist = (tpi_sim_dist)f->per_million,
                               .min_ns = f->t0_ns,
                               .max_ns = f->t1_ns,
                               .bits_per_s = f->extra_ns};
        sim->rules[sim->nrules++] = r;
        tpi_sim_trace(sim, "plan %s from=%d to=%d dist=%u min=%llu max=%llu bits=%llu",
                      r.bandwidth ? "bandwidth" : "latency", (int)f->a, (int)f->b, f->per_million,
                      (unsigned long long)f->t0_ns, (unsigned long long)f->t1_ns,
                      (unsigned long long)f->extra_ns);
        return TP_OK;
    }
    case F_CHAOS:
        tpi_sim_trace(sim, "plan chaos drop=%u dup=%u reorder=%u start=%llu end=%llu", f->a, f->b,
                      f->per_million, (unsigned long long)f->t0_ns, (unsigned long long)f->t1_ns);
        sim->chaos_drop_pm = f->a;
        sim->chaos_dup_pm = f->b;
        sim->chaos_reorder_pm = f->per_million;
        sim->chaos_start_ns = f->t0_ns;
        sim->chaos_end_ns = f->t1_ns;
        return TP_OK;
    case F_FAILSEND:
        tpi_sim_trace(sim, "plan failsend type=%u count=%u from=%llu until=%llu", f->a,
                      f->per_million, (unsigned long long)f->t0_ns, (unsigned long long)f->t1_ns);
        sim->fail_sends[f->a] += f->per_million;
        sim->fail_from_ns[f->a] = f->t0_ns;
        sim->fail_until_ns[f->a] = f->t1_ns;
        return TP_OK;
    case F_DELAYTYPE:
        tpi_sim_trace(sim, "plan delaytype type=%u extra=%llu", f->a,
                      (unsigned long long)f->extra_ns);
        sim->type_delay_ns[f->a] = f->extra_ns;
        return TP_OK;
    case F_DROP:
        tpi_sim_trace(sim, "plan drop per_million=%u start=%llu end=%llu", f->per_million,
                      (unsigned long long)f->t0_ns, (unsigned long long)f->t1_ns);
        sim->drop_per_million = f->per_million;
        sim->drop_start_ns = f->t0_ns;
        sim->drop_end_ns = f->t1_ns;
        return TP_OK;
    }
    TPI_ASSERT(!"checked fault kinds only");
    return TP_EINVAL;
}

static tp_status add_fault(tp_sim *sim, const tpi_sim_fault_line *f) {
    if (!sim)
        return tpi_fail(TP_EINVAL, "simulation is NULL");
    char err[TP_ERRMSG_LEN_MAX];
    if (check_fault(sim, f, err, sizeof err) != TP_OK)
        return tpi_fail(TP_EINVAL, "fault: %s", err);
    return apply_fault(sim, f);
}

/* ---- The API (sim.h) ------------------------------------------------------------ */

tp_status tp_sim_fault_delay(tp_sim *sim, uint32_t from, uint32_t to, uint64_t start_ns,
                             uint64_t end_ns, uint64_t extra_ns) {
    tpi_sim_fault_line f = {.kind = F_DELAY,
                            .a = from,
                            .b = to,
                            .t0_ns = start_ns,
                            .t1_ns = end_ns,
                            .extra_ns = extra_ns};
    return add_fault(sim, &f);
}

tp_status tp_sim_fault_break(tp_sim *sim, uint32_t a, uint32_t b, uint64_t at_ns) {
    tpi_sim_fault_line f = {.kind = F_BREAK, .a = a, .b = b, .t0_ns = at_ns};
    return add_fault(sim, &f);
}

tp_status tp_sim_fault_partition(tp_sim *sim, uint32_t a, uint32_t b, uint64_t start_ns,
                                 uint64_t end_ns) {
    tpi_sim_fault_line f = {
        .kind = F_PARTITION, .a = a, .b = b, .t0_ns = start_ns, .t1_ns = end_ns};
    return add_fault(sim, &f);
}

tp_status tp_sim_fault_kill(tp_sim *sim, uint32_t host, uint64_t at_ns) {
    tpi_sim_fault_line f = {.kind = F_KILL, .a = host, .t0_ns = at_ns};
    return add_fault(sim, &f);
}

tp_status tp_sim_fault_restart(tp_sim *sim, uint32_t rank, uint64_t at_ns) {
    tpi_sim_fault_line f = {.kind = F_RESTART, .a = rank, .t0_ns = at_ns};
    return add_fault(sim, &f);
}

tp_status tp_sim_fault_drop(tp_sim *sim, uint32_t per_million) {
    tpi_sim_fault_line f = {.kind = F_DROP, .per_million = per_million, .t1_ns = UINT64_MAX};
    return add_fault(sim, &f);
}

uint64_t tpi_sim_fault_delay_ns(tp_sim *sim, uint32_t from, uint32_t to) {
    uint64_t extra = 0;
    for (uint32_t i = 0; i < sim->ndelays; i++) {
        const tpi_sim_delay *d = &sim->delays[i];
        if (d->from == from && d->to == to && sim->now_ns >= d->start_ns && sim->now_ns < d->end_ns)
            extra = extra > UINT64_MAX - d->extra_ns ? UINT64_MAX : extra + d->extra_ns;
    }
    return extra;
}

/* ---- Store faults ---------------------------------------------------------------- */

uint64_t tpi_sim_store_slow_ns(const tp_sim *sim) {
    uint64_t extra = 0;
    for (uint32_t i = 0; i < sim->nstore_faults; i++) {
        const tpi_sim_store_fault *f = &sim->store_faults[i];
        if (!f->down && sim->now_ns >= f->start_ns && sim->now_ns < f->end_ns)
            extra = extra > UINT64_MAX - f->extra_ns ? UINT64_MAX : extra + f->extra_ns;
    }
    return extra;
}

uint64_t tpi_sim_store_down_until(const tp_sim *sim) {
    uint64_t until = 0;
    for (uint32_t i = 0; i < sim->nstore_faults; i++) {
        const tpi_sim_store_fault *f = &sim->store_faults[i];
        if (f->down && sim->now_ns >= f->start_ns && sim->now_ns < f->end_ns && f->end_ns > until)
            until = f->end_ns;
    }
    return until;
}

/* ---- Pauses ------------------------------------------------------------------- */

uint64_t tpi_sim_paused_ns(const tp_sim *sim, uint32_t host, uint64_t from, uint64_t to) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < sim->npauses; i++) {
        const tpi_sim_pause *p = &sim->pauses[i];
        uint64_t a = p->start_ns > from ? p->start_ns : from;
        uint64_t b = p->end_ns < to ? p->end_ns : to;
        if (p->host == host && a < b)
            total += b - a;
    }
    return total;
}

uint32_t tpi_sim_event_host(tp_sim *sim, const tpi_sim_event *e) {
    switch ((tpi_sim_event_kind)e->kind) {
    case TPI_SIM_EV_RESUME:
    case TPI_SIM_EV_PARK_TIMEOUT: {
        const tpi_sim_task *t = tpi_sim_task_get(sim, e->a);
        return t ? t->host->index : UINT32_MAX;
    }
    case TPI_SIM_EV_TIMER:
    case TPI_SIM_EV_PEER_DOWN: {
        const tpi_sim_agent *a = tpi_sim_agent_get(sim, e->a);
        return a ? a->host : UINT32_MAX;
    }
    case TPI_SIM_EV_DELIVER:
        return ((const tpi_sim_msg *)e->p)->dst_host;
    default:
        return UINT32_MAX; /* faults happen on time, paused or not */
    }
}

/* ---- Events ------------------------------------------------------------------- */

void tpi_sim_host_kill(tp_sim *sim, tpi_sim_host *h, const char *how) {
    if (h->dead)
        return;
    h->dead = 1;
    sim->hosts_dead++;
    sim->fired[TP_SIM_FAULT_KILL]++;
    tpi_sim_trace(sim, "fault %s host=%u", how, h->index);
    tpi_sim_pf_fault(sim, how, h->index, UINT32_MAX);
    /* Peers learn one latency later, as a reset would reach them. */
    uint64_t at = sim->now_ns + sim->cfg.latency_min_ns;
    for (uint32_t p = 0; p < sim->nhosts; p++)
        if (p != h->index)
            tpi_sim_net_peer_down(sim, p, h->index, TP_EPEERDOWN, TPI_SIM_DETAIL_KILLED, at);
    tpi_sim_wake_parked(sim, h, TP_ESHUTDOWN);
}

void tpi_sim_fault_event(tp_sim *sim, const tpi_sim_event *e) {
    switch ((tpi_sim_event_kind)e->kind) {
    case TPI_SIM_EV_BREAK:
        tpi_sim_trace(sim, "fault break a=%u b=%u", e->a, e->b);
        tpi_sim_pf_fault(sim, "break", e->a, e->b);
        sim->fired[TP_SIM_FAULT_BREAK]++;
        tpi_sim_net_break(sim, e->a, e->b, TPI_SIM_DETAIL_BREAK);
        return;
    case TPI_SIM_EV_PARTITION_START: {
        tpi_sim_link *c =
            tpi_sim_link_get(sim, e->a < e->b ? e->a : e->b, e->a < e->b ? e->b : e->a);
        if (!c)
            tpi_assert_fail("simulator link table exhausted memory", __FILE__, __LINE__);
        c->partitions++;
        if (e->x > c->partition_end_ns)
            c->partition_end_ns = e->x;
        tpi_sim_trace(sim, "fault partition a=%u b=%u", e->a, e->b);
        tpi_sim_pf_fault(sim, "partition", e->a, e->b);
        sim->fired[TP_SIM_FAULT_PARTITION]++;
        tpi_sim_net_break(sim, e->a, e->b, TPI_SIM_DETAIL_PARTITION);
        return;
    }
    case TPI_SIM_EV_PARTITION_END: {
        tpi_sim_link *c =
            tpi_sim_link_get(sim, e->a < e->b ? e->a : e->b, e->a < e->b ? e->b : e->a);
        if (!c)
            tpi_assert_fail("simulator link table exhausted memory", __FILE__, __LINE__);
        TPI_ASSERT(c->partitions > 0);
        c->partitions--;
        if (c->partitions == 0)
            c->partition_end_ns = 0;
        tpi_sim_trace(sim, "fault partition_end a=%u b=%u", e->a, e->b);
        tpi_sim_pf_fault(sim, "partition healed", e->a, e->b);
        return;
    }
    case TPI_SIM_EV_STALL_BREAK: {
        const tpi_sim_link *c = tpi_sim_link_find(sim, e->a, e->b);
        TPI_ASSERT(c);
        if (c->epoch != e->x)
            return; /* broken since: nothing is stalled on that connection any more */
        tpi_sim_trace(sim, "fault stall_break a=%u b=%u", e->a, e->b);
        tpi_sim_pf_fault(sim, "stalled connection broke", e->a, e->b);
        sim->fired[TP_SIM_FAULT_STALL_BREAK]++;
        tpi_sim_net_break(sim, e->a, e->b, TPI_SIM_DETAIL_STALLED);
        return;
    }
    case TPI_SIM_EV_KILL:
        /* A kill names a rank: after a restart, its newest incarnation. */
        tpi_sim_host_kill(sim, &sim->hosts[sim->rank_host[e->a]], "kill");
        return;
    case TPI_SIM_EV_RESTART:
        tpi_sim_host_restart(sim, e->a);
        return;
    case TPI_SIM_EV_PAUSE: {
        tpi_sim_host *h = &sim->hosts[e->a];
        if (e->x > h->paused_until)
            h->paused_until = e->x;
        sim->fired[TP_SIM_FAULT_PAUSE]++;
        tpi_sim_trace(sim, "fault pause host=%u until=%llu", e->a, (unsigned long long)e->x);
        tpi_sim_pf_fault(sim, "paused", e->a, UINT32_MAX);
        /* Peers that get nothing back for the user timeout give up on its
         * connections, as TCP_USER_TIMEOUT makes them (spec/tcp.md). */
        if (e->x - e->time_ns > TPI_SIM_USER_TIMEOUT_NS)
            for (uint32_t p = 0; p < sim->nhosts; p++) {
                const tpi_sim_link *c = p == e->a  ? NULL
                                        : p < e->a ? tpi_sim_link_find(sim, p, e->a)
                                                   : tpi_sim_link_find(sim, e->a, p);
                if (!c)
                    continue;
                tpi_sim_event b = {.kind = TPI_SIM_EV_STALL_BREAK,
                                   .time_ns = e->time_ns + TPI_SIM_USER_TIMEOUT_NS,
                                   .a = p < e->a ? p : e->a,
                                   .b = p < e->a ? e->a : p,
                                   .x = c->epoch};
                tpi_sim_schedule(sim, &b);
            }
        return;
    }
    case TPI_SIM_EV_UNPAUSE: {
        tpi_sim_host *h = &sim->hosts[e->a];
        if (h->paused_until <= e->time_ns) { /* not extended by a later pause */
            h->paused_until = 0;
            tpi_sim_trace(sim, "fault resume host=%u", e->a);
            tpi_sim_pf_fault(sim, "resumed", e->a, UINT32_MAX);
        }
        return;
    }
    default:
        TPI_ASSERT(!"not a fault event");
    }
}

/* ---- The plan format ---------------------------------------------------------- */

#define PLAN_LINE_MAX 512
#define PLAN_FIELDS_MAX 8

/* A decimal integer with nothing else; 0 on anything else or past max. */
static int parse_uint(const char *s, uint64_t max, uint64_t *out) {
    if (!*s)
        return 0;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return 0;
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (max - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    *out = v;
    return 1;
}

/* Milliseconds as "123" or "1.5" (up to 6 decimals: ns resolution), in ns. */
static int parse_ms(const char *s, uint64_t *ns) {
    char whole[32];
    const char *dot = strchr(s, '.');
    size_t wl = dot ? (size_t)(dot - s) : strlen(s);
    if (wl == 0 || wl >= sizeof whole)
        return 0;
    memcpy(whole, s, wl);
    whole[wl] = '\0';
    uint64_t ms, frac = 0;
    if (!parse_uint(whole, UINT64_MAX / 1000000, &ms))
        return 0;
    if (dot) {
        const char *f = dot + 1;
        size_t fl = strlen(f);
        if (fl == 0 || fl > 6 || !parse_uint(f, 999999, &frac))
            return 0;
        for (size_t i = fl; i < 6; i++)
            frac *= 10;
    }
    uint64_t v = ms * 1000000;
    if (v > UINT64_MAX - frac)
        return 0;
    *ns = v + frac;
    return 1;
}

typedef struct plan_spec {
    const char *word;
    int kind;
    int nargs;
    const char *usage;
} plan_spec;

static const plan_spec plan_specs[] = {
    {"delay", F_DELAY, 5, "delay FROM TO START_MS END_MS EXTRA_MS"},
    {"break", F_BREAK, 3, "break A B AT_MS"},
    {"partition", F_PARTITION, 4, "partition A B START_MS END_MS"},
    {"kill", F_KILL, 2, "kill HOST AT_MS"},
    {"restart", F_RESTART, 2, "restart RANK AT_MS (a dead rank's next incarnation)"},
    {"drop", F_DROP, 3, "drop PER_MILLION [START_MS END_MS]"},
    {"isolate", F_ISOLATE, 3, "isolate HOST START_MS END_MS"},
    {"split", F_SPLIT, 3, "split K START_MS END_MS (hosts below K on one side)"},
    {"pause", F_PAUSE, 3, "pause HOST START_MS END_MS"},
    {"chaos", F_CHAOS, 5, "chaos DROP_PM DUP_PM REORDER_PM [START_MS END_MS]"},
    {"latency", F_LATENCY, 5, "latency FROM|* TO|* MIN_MS MAX_MS fixed|uniform|longtail"},
    {"bandwidth", F_BANDWIDTH, 3, "bandwidth FROM|* TO|* MBIT_PER_S"},
    {"failsend", F_FAILSEND, 4,
     "failsend TYPE COUNT [FROM_MS [UNTIL_MS]] (TYPE: request, "
     "response, remote, rref_fetch, rref_delete, rref_fork, "
     "rref_accept, rref_abandon)"},
    {"delaytype", F_DELAYTYPE, 2, "delaytype TYPE EXTRA_MS"},
    {"storedown", F_STOREDOWN, 2, "storedown START_MS END_MS"},
    {"storeslow", F_STORESLOW, 3, "storeslow START_MS END_MS EXTRA_MS"},
};

/* Parses the fields of one line; errmsg gets the reason without the line number. */
static tp_status parse_fields(char **fld, int n, tpi_sim_fault_line *out, char *errmsg,
                              size_t errmsg_len) {
    const plan_spec *sp = NULL;
    for (size_t i = 0; i < sizeof plan_specs / sizeof plan_specs[0]; i++)
        if (strcmp(fld[0], plan_specs[i].word) == 0)
            sp = &plan_specs[i];
    if (!sp) {
        tpi_format(errmsg, errmsg_len,
                   "unknown fault '%.64s' (expected delay, break, partition, isolate, split, "
                   "kill, restart, pause, drop, chaos, failsend, delaytype, latency, "
                   "bandwidth, storedown or storeslow)",
                   fld[0]);
        return TP_EINVAL;
    }
    /* drop's window and failsend's start are optional: from now on without them. */
    int nargs = (sp->kind == F_DROP && n - 1 == 1) || (sp->kind == F_CHAOS && n - 1 == 3) ||
                        (sp->kind == F_FAILSEND && (n - 1 == 2 || n - 1 == 3))
                    ? n - 1
                    : sp->nargs;
    if (n - 1 != nargs) {
        tpi_format(errmsg, errmsg_len, "'%s' takes %d fields, got %d (usage: %s)", sp->word,
                   sp->nargs, n - 1, sp->usage);
        return TP_EINVAL;
    }
    memset(out, 0, sizeof *out);
    out->kind = sp->kind;
    if (sp->kind == F_LATENCY || sp->kind == F_BANDWIDTH) { /* hosts may be '*' */
        uint64_t h[2];
        for (int i = 0; i < 2; i++) {
            if (strcmp(fld[1 + i], "*") == 0) {
                h[i] = UINT32_MAX;
            } else if (!parse_uint(fld[1 + i], UINT32_MAX - 1, &h[i])) {
                tpi_format(errmsg, errmsg_len, "%s: '%.64s' is not a host or *", i ? "TO" : "FROM",
                           fld[1 + i]);
                return TP_EINVAL;
            }
        }
        out->a = (uint32_t)h[0];
        out->b = (uint32_t)h[1];
        if (sp->kind == F_BANDWIDTH) {
            uint64_t mbit;
            if (!parse_uint(fld[3], 1000000000, &mbit)) {
                tpi_format(errmsg, errmsg_len, "MBIT_PER_S: '%.64s' is not an integer", fld[3]);
                return TP_EINVAL;
            }
            out->extra_ns = mbit * 1000000; /* bits per second */
            return TP_OK;
        }
        static const char *const dists[] = {"fixed", "uniform", "longtail"};
        int d = -1;
        for (int i = 0; i < 3; i++)
            if (strcmp(fld[5], dists[i]) == 0)
                d = i;
        if (d < 0 || !parse_ms(fld[3], &out->t0_ns) || !parse_ms(fld[4], &out->t1_ns)) {
            tpi_format(errmsg, errmsg_len,
                       "expected MIN_MS MAX_MS fixed|uniform|longtail (usage: %s)", sp->usage);
            return TP_EINVAL;
        }
        out->per_million = (uint32_t)d;
        return TP_OK;
    }
    if (sp->kind == F_FAILSEND || sp->kind == F_DELAYTYPE) { /* TYPE, then a count or a time */
        uint64_t type = 0, v = 0;
        for (uint32_t t = 1; t < TPI_SIM_MSG_TYPES; t++)
            if (strcmp(fld[1], type_names[t]) == 0)
                type = t;
        if (!type && (!parse_uint(fld[1], UINT32_MAX, &type) || type == 0)) {
            tpi_format(errmsg, errmsg_len, "TYPE: '%.64s' is not a message type (usage: %s)",
                       fld[1], sp->usage);
            return TP_EINVAL;
        }
        int ok = sp->kind == F_FAILSEND ? parse_uint(fld[2], UINT32_MAX, &v) : parse_ms(fld[2], &v);
        if (!ok) {
            tpi_format(errmsg, errmsg_len, "%s: '%.64s' is not a %s",
                       sp->kind == F_FAILSEND ? "COUNT" : "EXTRA_MS", fld[2],
                       sp->kind == F_FAILSEND ? "non-negative integer" : "time in ms");
            return TP_EINVAL;
        }
        out->a = (uint32_t)(type > UINT32_MAX ? UINT32_MAX : type);
        if (sp->kind == F_FAILSEND)
            out->per_million = (uint32_t)v;
        else
            out->extra_ns = v;
        out->t1_ns = UINT64_MAX;
        if (nargs >= 3 && !parse_ms(fld[3], &out->t0_ns)) {
            tpi_format(errmsg, errmsg_len, "FROM_MS: '%.64s' is not a time in ms", fld[3]);
            return TP_EINVAL;
        }
        if (nargs == 4 && !parse_ms(fld[4], &out->t1_ns)) {
            tpi_format(errmsg, errmsg_len, "UNTIL_MS: '%.64s' is not a time in ms", fld[4]);
            return TP_EINVAL;
        }
        return TP_OK;
    }
    /* Which fields are hosts and which are times, per kind. */
    static const char *const names[][5] = {
        [F_DELAY] = {"FROM", "TO", "START_MS", "END_MS", "EXTRA_MS"},
        [F_BREAK] = {"A", "B", "AT_MS"},
        [F_PARTITION] = {"A", "B", "START_MS", "END_MS"},
        [F_KILL] = {"HOST", "AT_MS"},
        [F_RESTART] = {"RANK", "AT_MS"},
        [F_DROP] = {"PER_MILLION", "START_MS", "END_MS"},
        [F_ISOLATE] = {"HOST", "START_MS", "END_MS"},
        [F_SPLIT] = {"K", "START_MS", "END_MS"},
        [F_PAUSE] = {"HOST", "START_MS", "END_MS"},
        [F_CHAOS] = {"DROP_PM", "DUP_PM", "REORDER_PM", "START_MS", "END_MS"},
        [F_STOREDOWN] = {"START_MS", "END_MS"},
        [F_STORESLOW] = {"START_MS", "END_MS", "EXTRA_MS"},
    };
    /* The leading fields that are integers (hosts, a rate); the rest are times. */
    int nints = sp->kind == F_DELAY || sp->kind == F_BREAK || sp->kind == F_PARTITION ? 2
                : sp->kind == F_CHAOS                                                 ? 3
                : sp->kind == F_STOREDOWN || sp->kind == F_STORESLOW                  ? 0
                                                                                      : 1;
    uint64_t v[5] = {0, 0, 0, UINT64_MAX, 0};
    if (sp->kind == F_DROP)
        v[2] = UINT64_MAX;
    if (sp->kind == F_CHAOS) {
        v[3] = 0;
        v[4] = UINT64_MAX;
    }
    for (int i = 0; i < nargs; i++) {
        const char *s = fld[i + 1];
        int ok = i < nints ? parse_uint(s, UINT32_MAX, &v[i]) : parse_ms(s, &v[i]);
        if (!ok) {
            tpi_format(errmsg, errmsg_len, "%s: '%.64s' is not a %s", names[sp->kind][i], s,
                       i < nints ? "non-negative integer" : "time in ms (e.g. 10 or 2.5)");
            return TP_EINVAL;
        }
    }
    switch (sp->kind) {
    case F_DELAY:
        *out = (tpi_sim_fault_line){.kind = F_DELAY,
                                    .a = (uint32_t)v[0],
                                    .b = (uint32_t)v[1],
                                    .t0_ns = v[2],
                                    .t1_ns = v[3],
                                    .extra_ns = v[4]};
        break;
    case F_BREAK:
        *out = (tpi_sim_fault_line){
            .kind = F_BREAK, .a = (uint32_t)v[0], .b = (uint32_t)v[1], .t0_ns = v[2]};
        break;
    case F_PARTITION:
        *out = (tpi_sim_fault_line){.kind = F_PARTITION,
                                    .a = (uint32_t)v[0],
                                    .b = (uint32_t)v[1],
                                    .t0_ns = v[2],
                                    .t1_ns = v[3]};
        break;
    case F_KILL:
    case F_RESTART:
        *out = (tpi_sim_fault_line){.kind = sp->kind, .a = (uint32_t)v[0], .t0_ns = v[1]};
        break;
    case F_DROP:
        out->per_million = v[0] > UINT32_MAX ? UINT32_MAX : (uint32_t)v[0];
        out->t0_ns = v[1];
        out->t1_ns = v[2];
        break;
    case F_ISOLATE:
    case F_SPLIT:
    case F_PAUSE:
        *out = (tpi_sim_fault_line){
            .kind = sp->kind, .a = (uint32_t)v[0], .t0_ns = v[1], .t1_ns = v[2]};
        break;
    case F_STOREDOWN:
    case F_STORESLOW:
        *out = (tpi_sim_fault_line){
            .kind = sp->kind, .t0_ns = v[0], .t1_ns = v[1], .extra_ns = v[2]};
        break;
    case F_CHAOS:
        if (v[0] > 1000000 || v[1] > 1000000 || v[2] > 1000000) {
            tpi_format(errmsg, errmsg_len, "chaos rates are per million: 0..1000000");
            return TP_EINVAL;
        }
        *out = (tpi_sim_fault_line){.kind = F_CHAOS,
                                    .a = (uint32_t)v[0],
                                    .b = (uint32_t)v[1],
                                    .per_million = (uint32_t)v[2],
                                    .t0_ns = v[3],
                                    .t1_ns = v[4]};
        break;
    }
    return TP_OK;
}

/* Splits a line (modified in place) into fields; -1 when there are too many. */
static int split(char *line, char **fld) {
    int n = 0;
    char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (!*p)
            return n;
        if (n == PLAN_FIELDS_MAX)
            return -1;
        fld[n++] = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '\r')
            p++;
        if (*p)
            *p++ = '\0';
    }
}

tp_status tpi_sim_faults_parse(const char *text, tpi_sim_fault_line **lines, size_t *nlines,
                               char *errmsg, size_t errmsg_len) {
    TPI_ASSERT(lines && nlines);
    *lines = NULL;
    *nlines = 0;
    if (!text) {
        tpi_format(errmsg, errmsg_len, "fault plan is NULL");
        return TP_EINVAL;
    }
    tpi_sim_fault_line *out = NULL;
    size_t n = 0, cap = 0;
    int lineno = 0;
    const char *p = text;
    while (*p) {
        lineno++;
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char line[PLAN_LINE_MAX];
        char reason[TP_ERRMSG_LEN_MAX];
        tp_status st = TP_OK;
        if (len >= sizeof line) {
            tpi_format(reason, sizeof reason, "line longer than %d bytes", PLAN_LINE_MAX - 1);
            st = TP_EINVAL;
        } else {
            memcpy(line, p, len);
            line[len] = '\0';
            char *hash = strchr(line, '#');
            if (hash)
                *hash = '\0';
            char *fld[PLAN_FIELDS_MAX];
            int nf = split(line, fld);
            if (nf < 0) {
                tpi_format(reason, sizeof reason, "more than %d fields", PLAN_FIELDS_MAX);
                st = TP_EINVAL;
            } else if (nf > 0) {
                if (n == cap) {
                    size_t ncap = cap ? cap * 2 : 8;
                    tpi_sim_fault_line *grown = realloc(out, ncap * sizeof *grown);
                    if (!grown) {
                        free(out);
                        tpi_format(errmsg, errmsg_len, "out of memory reading a fault plan");
                        return TP_ENOMEM;
                    }
                    out = grown;
                    cap = ncap;
                }
                st = parse_fields(fld, nf, &out[n], reason, sizeof reason);
                if (st == TP_OK)
                    out[n++].line = lineno;
            }
        }
        if (st != TP_OK) {
            free(out);
            tpi_format(errmsg, errmsg_len, "fault plan line %d: %s", lineno, reason);
            return st;
        }
        p = end ? end + 1 : p + len;
    }
    *lines = out;
    *nlines = n;
    return TP_OK;
}

/* ns as the plan writes ms: "12", or "1.5" (trailing zeros dropped). */
static const char *fmt_ms(uint64_t ns, char buf[32]) {
    uint64_t ms = ns / 1000000, frac = ns % 1000000;
    if (!frac) {
        tpi_format(buf, 32, "%llu", (unsigned long long)ms);
        return buf;
    }
    int digits = 6;
    while (frac % 10 == 0) {
        frac /= 10;
        digits--;
    }
    tpi_format(buf, 32, "%llu.%0*llu", (unsigned long long)ms, digits, (unsigned long long)frac);
    return buf;
}

/* A host, or '*' for UINT32_MAX (latency, bandwidth). */
static const char *fmt_host(uint32_t h, char buf[16]) {
    if (h == UINT32_MAX)
        return "*";
    tpi_format(buf, 16, "%u", h);
    return buf;
}

size_t tpi_sim_faults_format(const tpi_sim_fault_line *f, char *buf, size_t len) {
    const plan_spec *sp = NULL;
    for (size_t i = 0; i < sizeof plan_specs / sizeof plan_specs[0]; i++)
        if (plan_specs[i].kind == f->kind)
            sp = &plan_specs[i];
    TPI_ASSERT(sp && len > 0);
    char t0[32], t1[32], x[32], ha[16], hb[16], ty[16];
    int forever = f->t0_ns == 0 && f->t1_ns == UINT64_MAX; /* the optional window left out */
    const char *w = sp->word;
    switch (f->kind) {
    case F_DELAY:
        return tpi_format(buf, len, "%s %u %u %s %s %s", w, f->a, f->b, fmt_ms(f->t0_ns, t0),
                          fmt_ms(f->t1_ns, t1), fmt_ms(f->extra_ns, x));
    case F_BREAK:
        return tpi_format(buf, len, "%s %u %u %s", w, f->a, f->b, fmt_ms(f->t0_ns, t0));
    case F_PARTITION:
        return tpi_format(buf, len, "%s %u %u %s %s", w, f->a, f->b, fmt_ms(f->t0_ns, t0),
                          fmt_ms(f->t1_ns, t1));
    case F_KILL:
    case F_RESTART:
        return tpi_format(buf, len, "%s %u %s", w, f->a, fmt_ms(f->t0_ns, t0));
    case F_DROP:
        if (forever)
            return tpi_format(buf, len, "%s %u", w, f->per_million);
        return tpi_format(buf, len, "%s %u %s %s", w, f->per_million, fmt_ms(f->t0_ns, t0),
                          fmt_ms(f->t1_ns, t1));
    case F_ISOLATE:
    case F_SPLIT:
    case F_PAUSE:
        return tpi_format(buf, len, "%s %u %s %s", w, f->a, fmt_ms(f->t0_ns, t0),
                          fmt_ms(f->t1_ns, t1));
    case F_CHAOS:
        if (forever)
            return tpi_format(buf, len, "%s %u %u %u", w, f->a, f->b, f->per_million);
        return tpi_format(buf, len, "%s %u %u %u %s %s", w, f->a, f->b, f->per_million,
                          fmt_ms(f->t0_ns, t0), fmt_ms(f->t1_ns, t1));
    case F_LATENCY: {
        static const char *const dists[] = {"fixed", "uniform", "longtail"};
        TPI_ASSERT(f->per_million < 3);
        return tpi_format(buf, len, "%s %s %s %s %s %s", w, fmt_host(f->a, ha), fmt_host(f->b, hb),
                          fmt_ms(f->t0_ns, t0), fmt_ms(f->t1_ns, t1), dists[f->per_million]);
    }
    case F_BANDWIDTH:
        return tpi_format(buf, len, "%s %s %s %llu", w, fmt_host(f->a, ha), fmt_host(f->b, hb),
                          (unsigned long long)(f->extra_ns / 1000000));
    case F_FAILSEND:
    case F_DELAYTYPE: {
        const char *type = f->a > 0 && f->a < TPI_SIM_MSG_TYPES ? type_names[f->a] : NULL;
        if (!type) {
            tpi_format(ty, sizeof ty, "%u", f->a);
            type = ty;
        }
        if (f->kind == F_DELAYTYPE)
            return tpi_format(buf, len, "%s %s %s", w, type, fmt_ms(f->extra_ns, x));
        if (forever)
            return tpi_format(buf, len, "%s %s %u", w, type, f->per_million);
        if (f->t1_ns == UINT64_MAX)
            return tpi_format(buf, len, "%s %s %u %s", w, type, f->per_million,
                              fmt_ms(f->t0_ns, t0));
        return tpi_format(buf, len, "%s %s %u %s %s", w, type, f->per_million, fmt_ms(f->t0_ns, t0),
                          fmt_ms(f->t1_ns, t1));
    }
    case F_STOREDOWN:
        return tpi_format(buf, len, "%s %s %s", w, fmt_ms(f->t0_ns, t0), fmt_ms(f->t1_ns, t1));
    case F_STORESLOW:
        return tpi_format(buf, len, "%s %s %s %s", w, fmt_ms(f->t0_ns, t0), fmt_ms(f->t1_ns, t1),
                          fmt_ms(f->extra_ns, x));
    }
    TPI_ASSERT(!"a fault kind without a format");
    return 0;
}

tp_status tp_sim_load_faults(tp_sim *sim, const char *text, char *errmsg, size_t errmsg_len) {
    char local[TP_ERRMSG_LEN_MAX];
    if (!errmsg || errmsg_len == 0) {
        errmsg = local;
        errmsg_len = sizeof local;
    }
    errmsg[0] = '\0';
    if (!sim) {
        tpi_format(errmsg, errmsg_len, "simulation is NULL");
        return tpi_fail(TP_EINVAL, "%s", errmsg);
    }
    tpi_sim_fault_line *lines;
    size_t n;
    tp_status st = tpi_sim_faults_parse(text, &lines, &n, errmsg, errmsg_len);
    if (st != TP_OK)
        return tpi_fail(st, "%s", errmsg);
    char reason[TP_ERRMSG_LEN_MAX];
    /* Every counted kind is counted over the whole plan before any of it is
     * applied: apply_fault's own limit checks would stop half-way, and
     * check_fault sees only the restarts planned before this plan. */
    uint32_t delays = sim->ndelays, restarts = sim->restarts_planned, pauses = sim->npauses;
    uint32_t store = sim->nstore_faults, rules = sim->nrules;
    for (size_t i = 0; i < n; i++) {
        uint32_t *count = NULL, limit = TPI_SIM_DELAYS_MAX;
        const char *what = NULL;
        switch (lines[i].kind) {
        case F_DELAY:
            count = &delays, what = "delay faults";
            break;
        case F_PAUSE:
            count = &pauses, what = "pause faults";
            break;
        case F_STOREDOWN:
        case F_STORESLOW:
            count = &store, what = "store faults";
            break;
        case F_LATENCY:
        case F_BANDWIDTH:
            count = &rules, what = "link rules";
            break;
        case F_RESTART:
            count = &restarts, what = "restarts in one simulation";
            limit = TPI_SIM_RESTARTS_MAX;
            break;
        }
        if (count && ++*count > limit) {
            tpi_format(errmsg, errmsg_len, "fault plan line %d: more than %u %s", lines[i].line,
                       limit, what);
            free(lines);
            return tpi_fail(TP_ELIMIT, "%s", errmsg);
        }
        if (check_fault(sim, &lines[i], reason, sizeof reason) != TP_OK) {
            tpi_format(errmsg, errmsg_len, "fault plan line %d: %s", lines[i].line, reason);
            free(lines);
            return tpi_fail(TP_EINVAL, "%s", errmsg);
        }
    }
    for (size_t i = 0; i < n && st == TP_OK; i++) {
        st = apply_fault(sim, &lines[i]);
        if (st != TP_OK)
            tpi_format(errmsg, errmsg_len, "fault plan line %d: %s", lines[i].line, tp_errmsg());
    }
    free(lines);
    return st;
}
