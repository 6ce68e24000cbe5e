/*
 * sim_sched.c: the event queue and the scheduling of tasks (spec/sim.md
 * SIM-1, SIM-3).
 *
 * The queue is a binary min-heap keyed by (time, seq): seq is the insertion
 * counter, so events due at the same instant run in the order they were
 * scheduled, and the order never depends on memory addresses. A task runs
 * only when a resume event for it is processed; parking, waiting and going
 * idle are states a resume event moves it out of.
 */
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"

/* ---- The heap ------------------------------------------------------------ */

static int ev_less(const tpi_sim_event *x, const tpi_sim_event *y) {
    if (x->time_ns != y->time_ns)
        return x->time_ns < y->time_ns;
    return x->seq < y->seq;
}

tp_status tpi_sim_heap_push(tpi_sim_heap *h, tpi_sim_event *e) {
    TPI_ASSERT(h && e);
    if (h->len == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        tpi_sim_event *ev = realloc(h->ev, cap * sizeof *ev);
        if (!ev)
            return TP_ENOMEM;
        h->ev = ev;
        h->cap = cap;
    }
    e->seq = h->next_seq++;
    size_t i = h->len++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!ev_less(e, &h->ev[parent]))
            break;
        h->ev[i] = h->ev[parent];
        i = parent;
    }
    h->ev[i] = *e;
    return TP_OK;
}

int tpi_sim_heap_pop(tpi_sim_heap *h, tpi_sim_event *out) {
    TPI_ASSERT(h && out);
    if (h->len == 0)
        return 0;
    *out = h->ev[0];
    tpi_sim_event last = h->ev[--h->len];
    size_t i = 0;
    size_t n = h->len;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n)
            break;
        size_t m = l;
        if (l + 1 < n && ev_less(&h->ev[l + 1], &h->ev[l]))
            m = l + 1;
        if (!ev_less(&h->ev[m], &last))
            break;
        h->ev[i] = h->ev[m];
        i = m;
    }
    if (n > 0)
        h->ev[i] = last;
    return 1;
}

const tpi_sim_event *tpi_sim_heap_peek(const tpi_sim_heap *h) {
    return h->len ? &h->ev[0] : NULL;
}

void tpi_sim_heap_free(tpi_sim_heap *h) {
    free(h->ev);
    memset(h, 0, sizeof *h);
}

void tpi_sim_schedule(tp_sim *sim, tpi_sim_event *e) {
    if (e->time_ns < sim->now_ns)
        e->time_ns = sim->now_ns;
    if (tpi_sim_heap_push(&sim->heap, e) != TP_OK) {
        /* Dropping an event would make the run diverge silently. */
        tpi_assert_fail("simulator event queue exhausted memory", __FILE__, __LINE__);
    }
}

/* ---- Task scheduling -------------------------------------------------------- */

const void *tpi_sim_self_token(tp_sim *sim) {
    return sim->current ? (const void *)sim->current : (const void *)&sim->sched_token;
}

tpi_sim_task *tpi_sim_task_get(tp_sim *sim, uint32_t id) {
    return id < sim->ntasks ? sim->tasks[id] : NULL;
}

static const char *status_word(tp_status st) {
    switch (st) {
    case TP_OK:
        return "unpark";
    case TP_ETIMEDOUT:
        return "timeout";
    case TP_ESHUTDOWN:
        return "shutdown";
    default:
        return tp_status_name(st);
    }
}

void tpi_sim_task_wake(tp_sim *sim, tpi_sim_task *t, tp_status status) {
    TPI_ASSERT(t->state == TPI_SIM_PARKED || t->state == TPI_SIM_WAITING ||
               t->state == TPI_SIM_IDLE);
    if (t->state == TPI_SIM_PARKED)
        tpi_sim_trace(sim, "wake task=%u host=%u why=%s", t->id, t->host->index,
                      status_word(status));
    t->state = TPI_SIM_RUNNABLE;
    t->wake_status = status;
    t->wake_seq++;
    tpi_sim_event e = {
        .kind = TPI_SIM_EV_RESUME, .time_ns = sim->now_ns, .a = t->id, .x = t->wake_seq};
    tpi_sim_schedule(sim, &e);
}

tp_status tpi_sim_task_park(tp_sim *sim, tpi_sim_task *t, uint64_t deadline_ns) {
    TPI_ASSERT(t == sim->current && t->state == TPI_SIM_RUNNING);
    t->park_seq++;
    t->state = TPI_SIM_PARKED;
    t->wake_status = TP_OK;
    if (deadline_ns != UINT64_MAX) {
        tpi_sim_trace(sim, "park task=%u host=%u deadline=%llu", t->id, t->host->index,
                      (unsigned long long)deadline_ns);
        tpi_sim_event e = {
            .kind = TPI_SIM_EV_PARK_TIMEOUT, .time_ns = deadline_ns, .a = t->id, .x = t->park_seq};
        tpi_sim_schedule(sim, &e);
    } else {
        tpi_sim_trace(sim, "park task=%u host=%u deadline=none", t->id, t->host->index);
    }
    tpi_sim_task_yield(sim);
    TPI_ASSERT(t->state == TPI_SIM_RUNNING);
    return t->wake_status;
}

void tpi_sim_wake_parked(tp_sim *sim, tpi_sim_host *host, tp_status status) {
    uint32_t first = host ? host->index : 0;
    uint32_t last = host ? host->index + 1 : sim->nhosts;
    for (uint32_t h = first; h < last; h++)
        for (tpi_sim_task *t = sim->hosts[h].tasks_head; t; t = t->host_next)
            if (t->state == TPI_SIM_PARKED)
                tpi_sim_task_wake(sim, t, status);
}

/* ---- Dispatch ------------------------------------------------------------ */

static void on_resume(tp_sim *sim, const tpi_sim_event *e) {
    tpi_sim_task *t = tpi_sim_task_get(sim, e->a);
    if (!t || t->state != TPI_SIM_RUNNABLE || t->wake_seq != e->x)
        return; /* stale */
    tpi_sim_task_resume(sim, t);
}

static void on_park_timeout(tp_sim *sim, const tpi_sim_event *e) {
    tpi_sim_task *t = tpi_sim_task_get(sim, e->a);
    if (!t || t->state != TPI_SIM_PARKED || t->park_seq != e->x)
        return; /* the park it was for has ended (SIM-3: per-park sequence) */
    tpi_sim_task_wake(sim, t, TP_ETIMEDOUT);
}

int tpi_sim_step(tp_sim *sim) {
    tpi_sim_event e;
    if (!tpi_sim_heap_pop(&sim->heap, &e))
        return 0;
    TPI_ASSERT(e.time_ns >= sim->now_ns);
    sim->now_ns = e.time_ns;
    sim->events++;
    tpi_sim_oracle_busy(sim);
    if (sim->npauses && !sim->unwinding && sim->mains_live) {
        /* A paused host runs nothing: what concerns it waits for the resume,
         * in the order it was due (SIM-5 pause). */
        uint32_t h = tpi_sim_event_host(sim, &e);
        if (h != UINT32_MAX && sim->hosts[h].paused_until > e.time_ns) {
            e.time_ns = sim->hosts[h].paused_until;
            tpi_sim_schedule(sim, &e);
            return 1;
        }
    }
    switch ((tpi_sim_event_kind)e.kind) {
    case TPI_SIM_EV_RESUME:
        on_resume(sim, &e);
        break;
    case TPI_SIM_EV_PARK_TIMEOUT:
        on_park_timeout(sim, &e);
        break;
    case TPI_SIM_EV_TIMER:
        tpi_sim_agent_timer_event(sim, &e);
        break;
    case TPI_SIM_EV_DELIVER:
        tpi_sim_net_deliver(sim, e.p);
        break;
    case TPI_SIM_EV_PEER_DOWN:
        tpi_sim_agent_peer_down_event(sim, &e);
        break;
    case TPI_SIM_EV_BREAK:
    case TPI_SIM_EV_PARTITION_START:
    case TPI_SIM_EV_PARTITION_END:
    case TPI_SIM_EV_KILL:
    case TPI_SIM_EV_STALL_BREAK:
    case TPI_SIM_EV_PAUSE:
    case TPI_SIM_EV_UNPAUSE:
    case TPI_SIM_EV_RESTART:
        tpi_sim_fault_event(sim, &e);
        break;
    default:
        TPI_ASSERT(!"unknown simulator event");
    }
    return 1;
}
