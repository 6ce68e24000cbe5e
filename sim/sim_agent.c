/*
 * sim_agent.c: the agent interface on the simulator (spec/agent.md
 * AGENT-1..13, spec/sim.md) and the "SIM" backend.
 *
 * Everything runs on one thread and a task only loses control when it
 * parks, waits in stop, or goes idle in the pool, so the lock needs no
 * atomics: it records its holder and asserts the contract (not recursive,
 * never held across a switch). Upcalls run in the scheduler, between task
 * switches, with the host's context made current.
 */
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"
#include "store/mem_store.h"

const tpi_sim_upcalls tpi_sim_core_upcalls = {
    .on_frame = tp_core_on_frame,
    .on_peer_down = tp_core_on_peer_down,
    .on_timer = tp_core_on_timer,
};

static tpi_sim_agent *AG(tp_agent *a) {
    TPI_ASSERT(a);
    return (tpi_sim_agent *)a;
}

tpi_sim_agent *tpi_sim_agent_get(tp_sim *sim, uint32_t id) {
    return id < sim->nagents ? sim->agents[id] : NULL;
}

tp_status tpi_sim_agent_create(tp_sim *sim, uint32_t host, uint32_t rank, uint32_t world_size,
                               uint32_t pool_max, uint64_t max_message_size, tpi_sim_agent **out) {
    TPI_ASSERT(sim && out && host < sim->nhosts);
    *out = NULL;
    if (sim->nagents == sim->agents_cap) {
        uint32_t cap = sim->agents_cap ? sim->agents_cap * 2 : 16;
        tpi_sim_agent **agents = realloc(sim->agents, cap * sizeof *agents);
        if (!agents)
            return TP_ENOMEM;
        sim->agents = agents;
        sim->agents_cap = cap;
    }
    tpi_sim_agent *a = calloc(1, sizeof *a);
    if (!a)
        return TP_ENOMEM;
    a->sim = sim;
    a->id = sim->nagents;
    a->host = host;
    a->rank = rank;
    a->world_size = world_size;
    a->max_message_size = max_message_size;
    a->up = &tpi_sim_core_upcalls;
    a->timer_deadline_ns = UINT64_MAX;
    a->pool_max = pool_max < 1                        ? 1
                  : pool_max > TPI_WORKER_THREADS_MAX ? TPI_WORKER_THREADS_MAX
                                                      : pool_max;
    sim->agents[sim->nagents++] = a;
    *out = a;
    return TP_OK;
}

/* ---- Upcalls -------------------------------------------------------------------- */

static void upcall_enter(tpi_sim_agent *a) {
    tp_sim *sim = a->sim;
    /* AGENT-2: from the I/O context (the scheduler), never inside a downcall
     * and never with the lock held. */
    TPI_ASSERT(sim->current == NULL && sim->upcall_host < 0);
    TPI_ASSERT(a->lock_holder == NULL);
    sim->upcall_host = (int)a->host;
    sim->upcall_errmsg[0] = '\0';
    tp_context_switch(sim->hosts[a->host].ctx, sim->upcall_errmsg);
}

static void upcall_leave(tpi_sim_agent *a) {
    tp_sim *sim = a->sim;
    tp_context_switch(NULL, NULL);
    sim->upcall_host = -1;
    TPI_ASSERT(a->lock_holder == NULL);
}

void tpi_sim_upcall_frame(tpi_sim_agent *a, uint32_t src, tp_frame *f) {
    upcall_enter(a);
    a->up->on_frame(a->core, src, f);
    upcall_leave(a);
}

void tpi_sim_agent_timer_event(tp_sim *sim, const tpi_sim_event *e) {
    tpi_sim_agent *a = tpi_sim_agent_get(sim, e->a);
    if (!a || a->timer_seq != e->x || a->stopping || !a->started)
        return; /* re-armed, disarmed, or gone since */
    a->timer_deadline_ns = UINT64_MAX;
    tpi_sim_trace(sim, "timer host=%u agent=%u", a->host, a->id);
    upcall_enter(a);
    a->up->on_timer(a->core);
    upcall_leave(a);
}

static void detail_text(tpi_sim_detail d, uint32_t about, char *buf, size_t len) {
    switch (d) {
    case TPI_SIM_DETAIL_KILLED:
        tpi_format(buf, len, "worker on host %u was killed", about);
        return;
    case TPI_SIM_DETAIL_BREAK:
        tpi_format(buf, len, "connection to host %u broke (fault plan)", about);
        return;
    case TPI_SIM_DETAIL_PARTITION:
        tpi_format(buf, len, "connection to host %u broke: network partition", about);
        return;
    case TPI_SIM_DETAIL_LOSS:
        tpi_format(buf, len, "connection to host %u broke: a message was lost", about);
        return;
    case TPI_SIM_DETAIL_BAD_FRAME:
        tpi_format(buf, len, "connection to host %u closed: malformed frame", about);
        return;
    case TPI_SIM_DETAIL_NO_MEMORY:
        tpi_format(buf, len, "connection to host %u closed: out of memory for a frame", about);
        return;
    case TPI_SIM_DETAIL_REFUSED:
        tpi_format(buf, len, "no worker is running on host %u (connection refused)", about);
        return;
    case TPI_SIM_DETAIL_STOPPED:
        tpi_format(buf, len, "worker on host %u shut down (connection closed)", about);
        return;
    case TPI_SIM_DETAIL_STALLED:
        tpi_format(buf, len,
                   "connection to host %u broke: nothing got through for the user timeout "
                   "(network partition)",
                   about);
        return;
    }
    tpi_format(buf, len, "host %u", about);
}

/* Sets whether a saw rank die, making peer_dead at the first death (the
 * simulator stops on exhaustion, as for its other tables). */
static void mark_dead(tpi_sim_agent *a, uint32_t rank, int dead) {
    if (!a->peer_dead && !dead)
        return;
    if (!a->peer_dead && !(a->peer_dead = calloc(a->npeers, 1)))
        tpi_assert_fail("simulator peer table exhausted memory", __FILE__, __LINE__);
    a->peer_dead[rank] = (uint8_t)dead;
}

void tpi_sim_agent_peer_down_event(tp_sim *sim, const tpi_sim_event *e) {
    tpi_sim_agent *a = tpi_sim_agent_get(sim, e->a);
    if (!a || a->stopping || !a->started || sim->hosts[a->host].dead)
        return; /* no upcall after stop, none to the dead */
    uint32_t peer = e->b;
    tp_status why = (tp_status)e->c;
    if (peer >= a->npeers || tpi_sim_peer_dead(a, peer) ||
        tpi_sim_peer_host(a, peer) != (uint32_t)e->x)
        return; /* already known dead, or news of a host the rank has left (AGENT-16) */
    if (why == TP_EPEERDOWN)
        mark_dead(a, peer, 1); /* later sends fail at once (AGENT-8) */
    char detail[160];
    detail_text((tpi_sim_detail)e->d, (uint32_t)e->x, detail, sizeof detail);
    tpi_sim_trace(sim, "peer_down host=%u agent=%u peer=%u why=%s", a->host, a->id, peer,
                  tp_status_name(why));
    upcall_enter(a);
    a->up->on_peer_down(a->core, peer, why, detail);
    upcall_leave(a);
}

/* ---- start, set_peers (AGENT-3, AGENT-4) --------------------------------------- */

static tp_status agent_start(tp_agent *ag, tp_core *core, char *addr, size_t addr_len, char *errmsg,
                             size_t errmsg_len) {
    tpi_sim_agent *a = AG(ag);
    tp_sim *sim = a->sim;
    tpi_sim_host *h = &sim->hosts[a->host];
    TPI_ASSERT(!a->started && addr && addr_len > 0);
    if (h->dead) {
        tpi_format(errmsg, errmsg_len, "simulated host %u was killed", a->host);
        return TP_EBACKEND;
    }
    if (h->active_agent) {
        tpi_format(errmsg, errmsg_len, "simulated host %u already runs a started worker", a->host);
        return TP_EBACKEND;
    }
    char mine[32];
    size_t n = tpi_format(mine, sizeof mine, "sim:%u", a->host);
    if (n >= addr_len) {
        tpi_format(errmsg, errmsg_len, "address buffer of %zu bytes is too small", addr_len);
        return TP_EBACKEND;
    }
    memcpy(addr, mine, n + 1);
    a->core = core;
    a->started = 1;
    h->active_agent = a->id + 1;
    tpi_sim_trace(sim, "agent_start host=%u agent=%u rank=%u world=%u", a->host, a->id, a->rank,
                  a->world_size);
    return TP_OK;
}

/* "sim:<host>" -> host; 0 when the text is not one of ours. */
static inline int parse_addr(const tp_sim *sim, const char *s, uint32_t *host) {
    /* Every worker parses every address at init: inline, with
     * tpi_parse_index's rules (decimal, no leading zero, below nhosts). */
    if (!s || s[0] != 's' || s[1] != 'i' || s[2] != 'm' || s[3] != ':')
        return 0;
    s += 4;
    uint64_t v = 0;
    size_t i = 0;
    for (unsigned d; i < 10 && (d = (unsigned char)s[i] - '0') <= 9; i++)
        v = v * 10 + d;
    if (i == 0 || s[i] != '\0' || (s[0] == '0' && i > 1) || v >= sim->nhosts)
        return 0;
    *host = (uint32_t)v;
    return 1;
}

/* Puts rank on host in a->moved (ascending by rank): listed exactly when
 * host is not rank. 0 when out of memory (the list as it was). */
static int moved_set(tpi_sim_agent *a, uint32_t rank, uint32_t host) {
    uint32_t at = tpi_sim_moved_slot(a, rank);
    int listed = at < a->nmoved && a->moved[at].rank == rank;
    if (listed && host == rank) {
        memmove(&a->moved[at], &a->moved[at + 1], (a->nmoved - at - 1) * sizeof *a->moved);
        a->nmoved--;
    } else if (listed) {
        a->moved[at].host = host;
    } else if (host != rank) {
        if (a->nmoved == a->moved_cap) {
            uint32_t cap = a->moved_cap ? a->moved_cap * 2 : 4;
            tpi_sim_moved *v = realloc(a->moved, cap * sizeof *v);
            if (!v)
                return 0;
            a->moved = v;
            a->moved_cap = cap;
        }
        memmove(&a->moved[at + 1], &a->moved[at], (a->nmoved - at) * sizeof *a->moved);
        a->moved[at] = (tpi_sim_moved){rank, host};
        a->nmoved++;
    }
    return 1;
}

/* The ranks of addrs off their own host (*moved, ascending), or 0 and a
 * message. Checks every address: they came through the store. */
static tp_status peers_moved(tp_sim *sim, const char *const *addrs, uint32_t world_size,
                             tpi_sim_moved **moved_out, uint32_t *nmoved_out, uint32_t *cap_out,
                             char *errmsg, size_t errmsg_len) {
    tpi_sim_moved *moved = NULL;
    uint32_t nmoved = 0, moved_cap = 0;
    for (uint32_t r = 0; r < world_size; r++) {
        uint32_t host;
        if (!parse_addr(sim, addrs[r], &host)) {
            free(moved);
            tpi_format(errmsg, errmsg_len,
                       "worker %u's address '%.64s' is not a simulator address (sim:0..%u)", r,
                       addrs[r] ? addrs[r] : "(null)", sim->nhosts - 1);
            return TP_EINVAL; /* AGENT-4 */
        }
        if (host == r)
            continue;
        if (nmoved == moved_cap) {
            uint32_t cap = moved_cap ? moved_cap * 2 : 4;
            tpi_sim_moved *v = realloc(moved, cap * sizeof *v);
            if (!v) {
                free(moved);
                tpi_format(errmsg, errmsg_len, "out of memory for %u peers", world_size);
                return TP_ENOMEM;
            }
            moved = v;
            moved_cap = cap;
        }
        moved[nmoved++] = (tpi_sim_moved){r, host}; /* r ascends: the list is sorted */
    }
    *moved_out = moved;
    *nmoved_out = nmoved;
    *cap_out = moved_cap;
    return TP_OK;
}

/* A copy of n entries of v (NULL for none), or 0 when out of memory. */
static int moved_copy(const tpi_sim_moved *v, uint32_t n, tpi_sim_moved **out) {
    *out = NULL;
    if (n == 0)
        return 1;
    *out = malloc(n * sizeof *v);
    if (*out)
        memcpy(*out, v, n * sizeof *v);
    return *out != NULL;
}

/*
 * AGENT-4, AGENT-19. Only the ranks off their own host (after restarts) and
 * those on hosts that died are kept. A list seen before under its id was
 * checked then and moved the same ranks: the check is skipped (a world of
 * n workers checks n addresses once, not n times).
 */
static tp_status set_peers(tp_agent *ag, const char *const *addrs, uint32_t world_size,
                           uint64_t list_id, char *errmsg, size_t errmsg_len) {
    tpi_sim_agent *a = AG(ag);
    tp_sim *sim = a->sim;
    if (world_size != a->world_size || (world_size && !addrs)) {
        tpi_format(errmsg, errmsg_len, "%u addresses for a world of %u", world_size, a->world_size);
        return TP_EINVAL;
    }
    tpi_sim_moved *moved = NULL;
    uint32_t nmoved = 0, moved_cap = 0;
    tp_status st = TP_OK;
    if (list_id && list_id == sim->peers_list_id && world_size == sim->peers_world) {
        if (!moved_copy(sim->peers_moved, sim->peers_nmoved, &moved)) {
            tpi_format(errmsg, errmsg_len, "out of memory for %u peers", world_size);
            return TP_ENOMEM;
        }
        nmoved = moved_cap = sim->peers_nmoved;
    } else {
        st = peers_moved(sim, addrs, world_size, &moved, &nmoved, &moved_cap, errmsg, errmsg_len);
        if (st != TP_OK)
            return st;
        tpi_sim_moved *keep = NULL;
        if (list_id && moved_copy(moved, nmoved, &keep)) { /* else the next one checks again */
            free(sim->peers_moved);
            sim->peers_moved = keep;
            sim->peers_nmoved = nmoved;
            sim->peers_world = world_size;
            sim->peers_list_id = list_id;
        }
    }
    /* A host that died before we knew it is down from the start: a look
     * per rank only once some host died. */
    uint8_t *pd = NULL;
    for (uint32_t r = 0, k = 0; sim->hosts_dead > 0 && r < world_size; r++) {
        uint32_t host = r;
        if (k < nmoved && moved[k].rank == r) /* both ascend */
            host = moved[k++].host;
        if (!sim->hosts[host].dead || host == a->host)
            continue;
        if (!pd && !(pd = calloc(world_size, 1))) {
            free(moved);
            tpi_format(errmsg, errmsg_len, "out of memory for %u peers", world_size);
            return TP_ENOMEM;
        }
        pd[r] = 1;
    }
    free(a->peer_dead);
    free(a->moved);
    a->peer_dead = pd;
    a->npeers = world_size;
    a->moved = moved;
    a->nmoved = nmoved;
    a->moved_cap = moved_cap;
    tpi_sim_trace(sim, "agent_peers host=%u agent=%u world=%u", a->host, a->id, world_size);
    return TP_OK;
}

static tp_status agent_set_peers(tp_agent *ag, const char *const *addrs, uint32_t world_size,
                                 char *errmsg, size_t errmsg_len) {
    return set_peers(ag, addrs, world_size, 0, errmsg, errmsg_len);
}

static tp_status agent_set_peers_id(tp_agent *ag, const char *const *addrs, uint32_t world_size,
                                    uint64_t list_id, char *errmsg, size_t errmsg_len) {
    TPI_ASSERT(list_id != 0); /* AGENT-19: an id names a list; 0 is set_peers' "no id" */
    return set_peers(ag, addrs, world_size, list_id, errmsg, errmsg_len);
}

/* AGENT-16: rank restarted on another host. */
static tp_status agent_set_peer(tp_agent *ag, uint32_t rank, const char *addr, char *errmsg,
                                size_t errmsg_len) {
    tpi_sim_agent *a = AG(ag);
    tp_sim *sim = a->sim;
    uint32_t host;
    if (rank >= a->npeers || rank == a->rank) {
        tpi_format(errmsg, errmsg_len, "worker %u is not a peer of worker %u", rank, a->rank);
        return TP_EINVAL;
    }
    if (!parse_addr(sim, addr, &host)) {
        tpi_format(errmsg, errmsg_len, "worker %u's address '%.64s' is not a simulator address",
                   rank, addr);
        return TP_EINVAL;
    }
    if (!moved_set(a, rank, host)) {
        tpi_format(errmsg, errmsg_len, "out of memory for worker %u's new address", rank);
        return TP_ENOMEM;
    }
    mark_dead(a, rank, sim->hosts[host].dead != 0);
    tpi_sim_trace(sim, "agent_peer host=%u agent=%u rank=%u now=%u", a->host, a->id, rank, host);
    return TP_OK;
}

/* ---- The pool (AGENT-7) ---------------------------------------------------------- */

static void pool_notify(tpi_sim_agent *a) {
    if (!a->stop_waiter)
        return;
    tpi_sim_task *w = tpi_sim_task_get(a->sim, a->stop_waiter - 1);
    if (w && w->state == TPI_SIM_WAITING)
        tpi_sim_task_wake(a->sim, w, TP_OK);
}

/* A pool task: runs queued work in FIFO order, then idles until woken. It
 * never returns: stop frees idle pool tasks where they wait. */
static void pool_main(void *arg) {
    tpi_sim_agent *a = arg;
    tp_sim *sim = a->sim;
    tpi_sim_task *self = sim->current;
    for (;;) {
        TPI_ASSERT(a->pool_waking > 0);
        a->pool_waking--;
        a->pool_busy++;
        while (a->q_head) {
            tp_work *w = a->q_head;
            a->q_head = w->next;
            if (!a->q_head)
                a->q_tail = NULL;
            a->q_len--;
            w->next = NULL;
            tpi_sim_trace(sim, "work host=%u task=%u", a->host, self->id);
            w->run(w);
            TPI_ASSERT(a->lock_holder == NULL); /* a work item must not keep the lock */
        }
        a->pool_busy--;
        self->state = TPI_SIM_IDLE;
        self->idle_next = NULL;
        if (a->idle_tail)
            a->idle_tail->idle_next = self;
        else
            a->idle_head = self;
        a->idle_tail = self;
        pool_notify(a);
        tpi_sim_task_yield(sim);
    }
}

static tp_status agent_execute(tp_agent *ag, tp_work *w) {
    tpi_sim_agent *a = AG(ag);
    tp_sim *sim = a->sim;
    TPI_ASSERT(w && w->run);
    if (a->stopping)
        return TP_ESHUTDOWN;
    w->next = NULL;
    tp_work *prev_tail = a->q_tail;
    if (a->q_tail)
        a->q_tail->next = w;
    else
        a->q_head = w;
    a->q_tail = w;
    a->q_len++;
    if (a->q_len <= a->pool_waking)
        return TP_OK; /* a task already on its way will take it */
    if (a->idle_head) {
        tpi_sim_task *t = a->idle_head;
        a->idle_head = t->idle_next;
        if (!a->idle_head)
            a->idle_tail = NULL;
        t->idle_next = NULL;
        a->pool_waking++;
        tpi_sim_task_wake(sim, t, TP_OK);
    } else if (a->pool_live < a->pool_max) {
        tpi_sim_task *t = NULL;
        a->pool_waking++;
        a->pool_live++;
        if (tpi_sim_task_spawn(sim, &sim->hosts[a->host], TPI_SIM_TASK_POOL, pool_main, a, &t) ==
            TP_OK) {
            t->pool_agent = a;
        } else {
            a->pool_waking--;
            a->pool_live--;
            if (a->pool_live == 0) {
                /* No task will ever take it: give it back (transferred on TP_OK only). */
                a->q_tail = prev_tail;
                if (prev_tail)
                    prev_tail->next = NULL;
                else
                    a->q_head = NULL;
                a->q_len--;
                return TP_ENOMEM;
            }
        }
    }
    return TP_OK;
}

/* ---- stop, destroy (AGENT-5, AGENT-6) -------------------------------------------- */

void tpi_sim_agent_wake_parkers(tpi_sim_agent *a) {
    for (tpi_sim_task *t = a->sim->hosts[a->host].tasks_head; t; t = t->host_next)
        if (t->state == TPI_SIM_PARKED && t->park_agent == a)
            tpi_sim_task_wake(a->sim, t, TP_ESHUTDOWN);
}

static int pool_drained(const tpi_sim_agent *a) {
    return a->q_len == 0 && a->pool_busy == 0 && a->pool_waking == 0 && a->parked == 0;
}

static void stop_wait(tpi_sim_agent *a) {
    tp_sim *sim = a->sim;
    tpi_sim_task *self = sim->current;
    /* Outside a task nothing else can run while we wait: the pool must be
     * drained already (true after a run: every work item has finished). */
    TPI_ASSERT(self && "stop outside a task with a busy pool");
    TPI_ASSERT(a->stop_waiter == 0);
    a->stop_waiter = self->id + 1;
    self->state = TPI_SIM_WAITING;
    tpi_sim_task_yield(sim);
    a->stop_waiter = 0;
}

static void agent_stop(tp_agent *ag) {
    tpi_sim_agent *a = AG(ag);
    tp_sim *sim = a->sim;
    if (a->stopped)
        return;
    tpi_sim_task *cur = sim->current;
    /* AGENT-5: never from an upcall or a work item of this agent. */
    TPI_ASSERT(sim->upcall_host < 0);
    TPI_ASSERT(!(cur && cur->kind == TPI_SIM_TASK_POOL && cur->pool_agent == a));
    TPI_ASSERT(a->lock_holder == NULL);
    if (!a->stopping) {
        a->stopping = 1;
        tpi_sim_trace(sim, "agent_stop host=%u agent=%u", a->host, a->id);
        a->timer_seq++;
        a->timer_deadline_ns = UINT64_MAX;
        tpi_sim_host *h = &sim->hosts[a->host];
        if (h->active_agent == a->id + 1) {
            h->active_agent = 0; /* frames in flight to us are dropped on arrival */
            if (a->started)
                tpi_sim_net_closed(sim, a->host); /* AGENT-5: peers see the close */
        }
        tpi_sim_agent_wake_parkers(a);
    }
    /* Accepted work still runs (the core makes it finish fast). */
    while (!pool_drained(a))
        stop_wait(a);
    /* Every pool task now idles in the FIFO holding nothing: free them there. */
    while (a->idle_head) {
        tpi_sim_task *t = a->idle_head;
        a->idle_head = t->idle_next;
        TPI_ASSERT(t->state == TPI_SIM_IDLE);
        tpi_sim_trace(sim, "task_exit task=%u host=%u", t->id, t->host->index);
        tpi_sim_task_destroy(sim, t);
        a->pool_live--;
    }
    a->idle_tail = NULL;
    TPI_ASSERT(a->pool_live == 0);
    a->stopped = 1;
}

static void agent_destroy(tp_agent *ag) {
    tpi_sim_agent *a = AG(ag);
    tp_sim *sim = a->sim;
    TPI_ASSERT(a->stopped || !a->started);
    TPI_ASSERT(a->pool_live == 0 && a->q_len == 0 && a->parked == 0);
    tpi_sim_host *h = &sim->hosts[a->host];
    if (h->active_agent == a->id + 1)
        h->active_agent = 0;
    sim->agents[a->id] = NULL;
    free(a->peer_dead);
    free(a->moved);
    free(a);
}

/* ---- send, clock, timer (AGENT-8..10) ------------------------------------------- */

static tp_status agent_send(tp_agent *ag, uint32_t dst, tp_frame *f) {
    return tpi_sim_net_send(AG(ag), dst, f);
}

static uint64_t agent_now_ns(tp_agent *ag) {
    return AG(ag)->sim->now_ns;
}

static void agent_timer_arm(tp_agent *ag, uint64_t deadline_ns) {
    tpi_sim_agent *a = AG(ag);
    a->timer_seq++;
    a->timer_deadline_ns = deadline_ns;
    if (deadline_ns == UINT64_MAX || a->stopping)
        return;
    tpi_sim_event e = {
        .kind = TPI_SIM_EV_TIMER, .time_ns = deadline_ns, .a = a->id, .x = a->timer_seq};
    tpi_sim_schedule(a->sim, &e);
}

/* ---- lock, park (AGENT-11, AGENT-12) --------------------------------------------- */

static void agent_lock(tp_agent *ag) {
    tpi_sim_agent *a = AG(ag);
    /* Cooperative tasks never contend: a held lock here is a recursive lock
     * or a lock kept across a switch, both bugs. */
    TPI_ASSERT(a->lock_holder == NULL);
    a->lock_holder = tpi_sim_self_token(a->sim);
    tpi_sim_oracle_busy(a->sim);
}

static void agent_unlock(tp_agent *ag) {
    tpi_sim_agent *a = AG(ag);
    TPI_ASSERT(a->lock_holder == tpi_sim_self_token(a->sim));
    a->lock_holder = NULL;
}

static tp_task *agent_task_self(tp_agent *ag) {
    tp_sim *sim = AG(ag)->sim;
    return (tp_task *)(sim->current ? sim->current : &sim->sched_token);
}

static tp_status park_for(tpi_sim_agent *a, tpi_sim_task *t, uint64_t deadline_ns);

/*
 * The world, the host or the agent is ending: the caller must stop waiting
 * (AGENT-12). We still yield first: on one thread a caller that polls (park,
 * check, park) without yielding would starve the very tasks it waits for.
 */
static tp_status park_shutdown(tpi_sim_agent *a, tpi_sim_task *t, uint64_t deadline_ns) {
    tp_sim *sim = a->sim;
    uint64_t until = sim->now_ns;
    if (++t->shutdown_parks > TPI_SIM_SHUTDOWN_SPINS) {
        uint64_t step = sim->now_ns + TPI_SIM_SHUTDOWN_POLL_NS;
        until = deadline_ns < step ? deadline_ns : step;
        if (until < sim->now_ns)
            until = sim->now_ns;
    }
    t->unpark_pending = 0;
    park_for(a, t, until);
    return TP_ESHUTDOWN;
}

static tp_status agent_park(tp_agent *ag, tp_task *self, uint64_t deadline_ns) {
    tpi_sim_agent *a = AG(ag);
    tp_sim *sim = a->sim;
    tpi_sim_task *t = (tpi_sim_task *)self;
    /* Only a task parks, itself, holding the lock; never the scheduler. */
    TPI_ASSERT(t && t == sim->current);
    TPI_ASSERT(a->lock_holder == t);
    if (sim->unwinding || sim->hosts[a->host].dead || a->stopping)
        return park_shutdown(a, t, deadline_ns);
    t->shutdown_parks = 0;
    if (t->unpark_pending) {
        t->unpark_pending = 0;
        return TP_OK;
    }
    if (deadline_ns <= sim->now_ns)
        return TP_ETIMEDOUT;
    return park_for(a, t, deadline_ns);
}

static tp_status park_for(tpi_sim_agent *a, tpi_sim_task *t, uint64_t deadline_ns) {
    tp_sim *sim = a->sim;
    a->lock_holder = NULL;
    a->parked++;
    t->park_agent = a;
    tp_status st = tpi_sim_task_park(sim, t, deadline_ns);
    t->park_agent = NULL;
    a->parked--;
    TPI_ASSERT(a->lock_holder == NULL);
    a->lock_holder = t;
    if (a->stopping)
        pool_notify(a);
    return st;
}

static void agent_unpark(tp_agent *ag, tp_task *task) {
    tpi_sim_agent *a = AG(ag);
    tp_sim *sim = a->sim;
    tpi_sim_task *t = (tpi_sim_task *)task;
    TPI_ASSERT(a->lock_holder == tpi_sim_self_token(sim));
    TPI_ASSERT(t && t->kind != TPI_SIM_TASK_SCHED && t->state != TPI_SIM_EXITED);
    if (t->state == TPI_SIM_PARKED) {
        tpi_sim_task_wake(sim, t, TP_OK);
    } else if (!t->unpark_pending) {
        t->unpark_pending = 1; /* the next park returns at once */
        tpi_sim_trace(sim, "unpark task=%u host=%u pending", t->id, t->host->index);
    }
}

/* ---- The store (AGENT-13) --------------------------------------------------------- */

/* The world's own store, unless cfg.store gave one: in memory without SQLite
 * (store/mem_store.c, spec/store.md STORE-11), the same contract and messages
 * as a ":memory:" SQLite store at a fraction of the cost per key. */
tp_store *tpi_sim_store(tp_sim *sim, char *errmsg, size_t errmsg_len) {
    if (!sim->store) {
        tp_store *s = NULL;
        if (tpi_mem_store_open(&s, errmsg, errmsg_len) != TP_OK)
            return NULL;
        sim->store = s;
        sim->store_owned = 1;
    }
    return sim->store;
}

/* AGENT-17: the chaos mode (SIM-5) may deliver a frame twice, and late
 * (a held-back frame or a copy arrives behind later ones), or lose it. */
static uint32_t agent_net_faults(tp_agent *ag) {
    const tpi_sim_agent *a = AG(ag);
    return (a->sim->chaos_dup_pm > 0 ? TP_NET_DUPLICATES : 0) |
           (a->sim->chaos_dup_pm > 0 || a->sim->chaos_reorder_pm > 0 ? TP_NET_REORDERS : 0) |
           (a->sim->chaos_drop_pm > 0 ? TP_NET_LOSES : 0);
}

static void agent_probe(tp_agent *ag, const tp_probe *p) {
    tpi_sim_agent *a = AG(ag);
    tpi_sim_oracle_probe(a->sim, a, p);
}

/*
 * A storeslow fault: the calling task waits extra_ns before its operation,
 * as a round trip to a slow store would. The core never calls the store
 * holding its lock (a real store blocks on I/O), which this asserts. An
 * unpark that arrives meanwhile was meant for the core's next park: kept.
 * Returns 0 when the time passed, -1 when the host died or the world ends.
 */
static int store_wait(tpi_sim_agent *a, uint64_t extra_ns) {
    tp_sim *sim = a->sim;
    tpi_sim_task *t = sim->current;
    TPI_ASSERT(t && a->lock_holder == NULL);
    uint64_t until = sim->now_ns + extra_ns;
    sim->fired[TP_SIM_FAULT_STORE_SLOW]++;
    tpi_sim_trace(sim, "fault storeslow host=%u task=%u until=%llu", a->host, t->id,
                  (unsigned long long)until);
    while (sim->now_ns < until) {
        if (sim->unwinding || sim->hosts[a->host].dead)
            return -1;
        tp_status st = tpi_sim_task_park(sim, t, until);
        if (st == TP_OK && sim->now_ns < until)
            t->unpark_pending = 1;
        else if (st != TP_OK && st != TP_ETIMEDOUT)
            return -1;
    }
    return 0;
}

/* The store through an agent: refused once its host is dead or while a
 * storedown fault holds, slowed by storeslow, else the sim's shared store
 * (which the sim closes), its message copied for the core. */
static tp_store *view_target(tp_store *s) {
    tpi_sim_store_view *v = (tpi_sim_store_view *)s;
    tpi_sim_agent *a = v->agent;
    tp_sim *sim = a->sim;
    uint64_t slow = sim->nstore_faults ? tpi_sim_store_slow_ns(sim) : 0;
    if (!sim->hosts[a->host].dead && slow && store_wait(a, slow) != 0) {
        tpi_format(s->errmsg, sizeof s->errmsg,
                   "simulated host %u: a slow store operation was interrupted", a->host);
        return NULL;
    }
    if (sim->hosts[a->host].dead) {
        tpi_format(s->errmsg, sizeof s->errmsg,
                   "simulated host %u is dead: it reaches no store", a->host);
        return NULL;
    }
    uint64_t down = sim->nstore_faults ? tpi_sim_store_down_until(sim) : 0;
    if (down) {
        sim->fired[TP_SIM_FAULT_STORE_DOWN]++;
        tpi_sim_trace(sim, "fault storedown host=%u until=%llu", a->host,
                      (unsigned long long)down);
        tpi_format(s->errmsg, sizeof s->errmsg,
                   "store unavailable (simulated outage until t=%.3f ms)", (double)down / 1e6);
        return NULL;
    }
    return sim->store;
}

static tp_status view_done(tp_store *s, tp_store *t, tp_status st) {
    if (st != TP_OK && st != TP_ENOENT)
        tpi_copy_text(s->errmsg, sizeof s->errmsg, t->errmsg);
    return st;
}

static tp_status view_set(tp_store *s, const char *key, const void *value, size_t len) {
    tp_store *t = view_target(s);
    return t ? view_done(s, t, t->ops->set(t, key, value, len)) : TP_ESTORE;
}

static tp_status view_get(tp_store *s, const char *key, void **value, size_t *len) {
    tp_store *t = view_target(s);
    return t ? view_done(s, t, t->ops->get(t, key, value, len)) : TP_ESTORE;
}

static tp_status view_add(tp_store *s, const char *key, int64_t delta, int64_t *result) {
    tp_store *t = view_target(s);
    return t ? view_done(s, t, t->ops->add(t, key, delta, result)) : TP_ESTORE;
}

static tp_status view_compare_set(tp_store *s, const char *key, const void *expected,
                                  size_t expected_len, const void *desired, size_t desired_len,
                                  int *swapped) {
    tp_store *t = view_target(s);
    return t ? view_done(s, t,
                         t->ops->compare_set(t, key, expected, expected_len, desired, desired_len,
                                             swapped))
             : TP_ESTORE;
}

static tp_status view_del(tp_store *s, const char *key) {
    tp_store *t = view_target(s);
    return t ? view_done(s, t, t->ops->del(t, key)) : TP_ESTORE;
}

static tp_status view_scan(tp_store *s, const char *prefix,
                           int (*fn)(void *arg, const char *key, const void *value, size_t len),
                           void *arg) {
    tp_store *t = view_target(s);
    return t ? view_done(s, t, t->ops->scan(t, prefix, fn, arg)) : TP_ESTORE;
}

/* STORE-13: the shared store's (a view reaches its keys), whatever faults
 * hold: naming the keys reads none of them. */
static uint64_t view_instance(tp_store *s) {
    tp_store *t = ((tpi_sim_store_view *)s)->agent->sim->store;
    return t->ops->instance ? t->ops->instance(t) : 0;
}

static void view_close(tp_store *s) {
    (void)s; /* the sim owns the shared store */
}

/* Two tables: scan only when the shared store has it (cfg.store may not). */
#define VIEW_OPS                                                                                   \
    .api_version = TP_BACKEND_API_VERSION, .set = view_set, .get = view_get, .add = view_add,      \
    .compare_set = view_compare_set, .del = view_del, .close = view_close,                       \
    .instance = view_instance
static const tp_store_ops view_ops = {VIEW_OPS};
static const tp_store_ops view_ops_scan = {VIEW_OPS, .scan = view_scan};
#undef VIEW_OPS

static tp_store *agent_store(tp_agent *ag) {
    tpi_sim_agent *a = AG(ag);
    a->store_view.base.ops = a->sim->store->ops->scan ? &view_ops_scan : &view_ops;
    a->store_view.agent = a;
    return &a->store_view.base;
}

const tp_agent_ops tpi_sim_agent_ops = {
    .api_version = TP_BACKEND_API_VERSION,
    .name = "SIM",
    .start = agent_start,
    .set_peers = agent_set_peers,
    .set_peers_id = agent_set_peers_id,
    .stop = agent_stop,
    .destroy = agent_destroy,
    .send = agent_send,
    .now_ns = agent_now_ns,
    .timer_arm = agent_timer_arm,
    .execute = agent_execute,
    .lock = agent_lock,
    .unlock = agent_unlock,
    .task_self = agent_task_self,
    .park = agent_park,
    .unpark = agent_unpark,
    .store = agent_store,
    .probe = agent_probe,
    .set_peer = agent_set_peer,
    .net_faults = agent_net_faults,
};

/* ---- The "SIM" backend (BACKEND-1..5) --------------------------------------------- */

static tp_status backend_init(const tp_init_params *params, tp_agent **agent,
                              const tp_agent_ops **ops, char *errmsg, size_t errmsg_len) {
    TPI_ASSERT(params && params->opts && agent && ops);
    tp_sim *sim = tpi_sim_active();
    if (!sim || !sim->current) {
        tpi_format(errmsg, errmsg_len, "the SIM backend runs only inside tp_sim_run");
        return TP_EBACKEND;
    }
    tpi_sim_host *h = sim->current->host;
    if (h->dead) {
        tpi_format(errmsg, errmsg_len, "simulated host %u was killed", h->index);
        return TP_EBACKEND;
    }
    if (!tpi_sim_store(sim, errmsg, errmsg_len))
        return TP_ESTORE;
    int threads = tp_options_num_worker_threads(params->opts);
    tpi_sim_agent *a = NULL;
    tp_status st = tpi_sim_agent_create(sim, h->index, params->rank, params->world_size,
                                        threads > 0 ? (uint32_t)threads : 1,
                                        tp_options_max_message_size(params->opts), &a);
    if (st != TP_OK) {
        tpi_format(errmsg, errmsg_len, "out of memory creating the SIM agent");
        return st;
    }
    *agent = (tp_agent *)a;
    *ops = &tpi_sim_agent_ops;
    return TP_OK;
}

const tp_backend tpi_sim_backend = {
    .api_version = TP_BACKEND_API_VERSION,
    .construct_options = NULL,
    .init = backend_init,
};
