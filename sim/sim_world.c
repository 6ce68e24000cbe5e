/*
 * sim_world.c: the tp_sim_* API (sim.h): creating a world, running it, and
 * what programs call from inside it (spec/sim.md SIM-1..8).
 *
 * A run has three phases. Running: events are processed in (time, seq)
 * order until every host's program has returned, the queue runs dry while
 * some program still waits (deadlock), or the next event lies past the time
 * limit. Unwinding (after a deadlock or the limit): parks fail with
 * TP_ESHUTDOWN and every parked task is woken, repeatedly, until the
 * programs return. Teardown: each host frees its context from a task of its
 * own, which shuts down any worker still initialised (its agent's stop may
 * wait for the pool), so nothing is left behind.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"
#include "common/codec.h"

static _Thread_local tp_sim *active_sim;

tp_sim *tpi_sim_active(void) {
    return active_sim;
}

void tpi_sim_set_active(tp_sim *sim) {
    active_sim = sim;
}

/* ---- Creating and freeing ---------------------------------------------------- */

tp_status tp_sim_new(const tp_sim_config *cfg, tp_sim **out) {
    if (!out)
        return tpi_fail(TP_EINVAL, "tp_sim_new: out is NULL");
    *out = NULL;
    if (!cfg)
        return tpi_fail(TP_EINVAL, "tp_sim_new: config is NULL");
    if (cfg->hosts < 1 || cfg->hosts > TPI_SIM_HOSTS_MAX)
        return tpi_fail(TP_EINVAL, "tp_sim_new: %u hosts, expected 1..%u", cfg->hosts,
                        TPI_SIM_HOSTS_MAX);
    if (cfg->stack_size && cfg->stack_size < TPI_SIM_STACK_SIZE_MIN)
        return tpi_fail(TP_EINVAL, "tp_sim_new: stack size %zu is below the minimum %zu",
                        cfg->stack_size, TPI_SIM_STACK_SIZE_MIN);
    tp_sim *sim = calloc(1, sizeof *sim);
    if (!sim)
        return tpi_fail(TP_ENOMEM, "tp_sim_new: out of memory");
    sim->cfg = *cfg;
    if (!sim->cfg.latency_min_ns)
        sim->cfg.latency_min_ns = TPI_SIM_LATENCY_MIN_DEFAULT_NS;
    if (!sim->cfg.latency_jitter_ns)
        sim->cfg.latency_jitter_ns = TPI_SIM_LATENCY_JITTER_DEFAULT_NS;
    if (!sim->cfg.time_limit_ns)
        sim->cfg.time_limit_ns = TPI_SIM_TIME_LIMIT_DEFAULT_NS;
    if (!sim->cfg.stack_size)
        sim->cfg.stack_size = TPI_SIM_STACK_SIZE_DEFAULT;
    sim->trace_hash = TPI_SIM_HASH_SEED;
    sim->upcall_host = -1;
    sim->sched_token.kind = TPI_SIM_TASK_SCHED;
    sim->sched_token.id = UINT32_MAX;
    sim->sched_token.state = TPI_SIM_RUNNING;
    sim->store = cfg->store;
    tpi_sim_prng_seed(&sim->net_rng, cfg->seed, TPI_SIM_STREAM_NETWORK);
    tpi_sim_prng_seed(&sim->fault_rng, cfg->seed, TPI_SIM_STREAM_FAULTS);
    tpi_sim_prng_seed(&sim->work_rng, cfg->seed, TPI_SIM_STREAM_WORKLOAD);
    sim->hosts = calloc(cfg->hosts + TPI_SIM_RESTARTS_MAX, sizeof *sim->hosts);
    sim->rank_host = calloc(cfg->hosts, sizeof *sim->rank_host);
    if (!sim->hosts || !sim->rank_host) {
        free(sim->hosts);
        free(sim->rank_host);
        free(sim);
        return tpi_fail(TP_ENOMEM, "tp_sim_new: out of memory for %u hosts", cfg->hosts);
    }
    sim->nhosts = cfg->hosts;
    for (uint32_t i = 0; i < cfg->hosts; i++) {
        tpi_sim_host *h = &sim->hosts[i];
        h->index = i;
        h->rank = i;
        sim->rank_host[i] = i;
        h->exit_code = -1;
        h->ctx = tp_context_new();
        if (!h->ctx) {
            tp_sim_free(sim);
            return tpi_fail(TP_ENOMEM, "tp_sim_new: out of memory for host contexts");
        }
    }
    /* The seed is left out on purpose: the trace shows what it changed. */
    tpi_sim_trace(sim, "sim hosts=%u latency_min=%llu latency_jitter=%llu time_limit=%llu",
                  sim->cfg.hosts, (unsigned long long)sim->cfg.latency_min_ns,
                  (unsigned long long)sim->cfg.latency_jitter_ns,
                  (unsigned long long)sim->cfg.time_limit_ns);
    *out = sim;
    return TP_OK;
}

static void free_events(tp_sim *sim) {
    tpi_sim_event e;
    while (tpi_sim_heap_pop(&sim->heap, &e))
        if (e.kind == TPI_SIM_EV_DELIVER)
            tpi_sim_msg_free(e.p);
}

/* Frees tasks that never returned, reporting those that were not idle. */
static void free_tasks(tp_sim *sim) {
    for (uint32_t i = 0; i < sim->nhosts; i++) {
        tpi_sim_host *h = &sim->hosts[i];
        while (h->tasks_head) {
            tpi_sim_task *t = h->tasks_head;
            if (t->state != TPI_SIM_IDLE)
                fprintf(stderr,
                        "tensorplay-rpc sim: %s task %u on host %u did not return; "
                        "freed where it stood\n",
                        tpi_sim_task_kind_name(t->kind), t->id, i);
            tpi_sim_task_destroy(sim, t);
        }
    }
}

void tp_sim_free(tp_sim *sim) {
    if (!sim)
        return;
    TPI_ASSERT(tpi_sim_active() != sim);
    if (sim->hosts) {
        /* Contexts left (the sim never ran): nothing runs in them. */
        for (uint32_t i = 0; i < sim->nhosts; i++) {
            tp_context_free(sim->hosts[i].ctx);
            sim->hosts[i].ctx = NULL;
        }
        free_tasks(sim);
        for (uint32_t i = 0; i < sim->nhosts; i++) {
            free(sim->hosts[i].links);
            free(sim->hosts[i].conn_lo);
        }
    }
    free_events(sim);
    tpi_sim_trace_free(sim);
    tpi_sim_heap_free(&sim->heap);
    for (uint32_t i = 0; i < sim->nagents; i++) {
        tpi_sim_agent *a = sim->agents[i];
        if (a) {
            free(a->peer_dead);
            free(a->moved);
            free(a);
        }
    }
    tpi_sim_oracle_free(sim);
    free(sim->peers_moved);
    free(sim->agents);
    free(sim->tasks);
    free(sim->delays);
    free(sim->pauses);
    free(sim->store_faults);
    free(sim->rules);
    free(sim->hosts);
    free(sim->rank_host);
    if (sim->store && sim->store_owned)
        sim->store->ops->close(sim->store);
    free(sim);
    tpi_frame_cache_trim(); /* the hosts shared the process's cache of large frames */
}

/* ---- Running -------------------------------------------------------------------- */

enum { RUN_DONE, RUN_EMPTY, RUN_LIMIT, RUN_BUDGET };

static int mains_done(tp_sim *sim) {
    return sim->mains_live == 0;
}

/* Checked after every event: a host's context, once freed, never comes
 * back (a restart takes a new host), so the scan resumes where it stopped
 * and the whole teardown costs one pass over the hosts, not one per event. */
static int teardown_done(tp_sim *sim) {
    for (; sim->teardown_scan < sim->nhosts; sim->teardown_scan++)
        if (sim->hosts[sim->teardown_scan].ctx)
            return 0;
    return 1;
}

/* No task left that could still make progress (idle pool tasks may stay). */
static int all_idle(tp_sim *sim) {
    for (uint32_t i = 0; i < sim->nhosts; i++)
        for (tpi_sim_task *t = sim->hosts[i].tasks_head; t; t = t->host_next)
            if (t->state != TPI_SIM_IDLE)
                return 0;
    return 1;
}

static int run_until(tp_sim *sim, int (*done)(tp_sim *), int use_limit, uint64_t budget) {
    uint64_t n = 0;
    while (!done(sim)) {
        const tpi_sim_event *e = tpi_sim_heap_peek(&sim->heap);
        if (!e)
            return RUN_EMPTY;
        if (use_limit && e->time_ns > sim->cfg.time_limit_ns)
            return RUN_LIMIT;
        if (budget && n++ >= budget)
            return RUN_BUDGET;
        tpi_sim_step(sim);
    }
    return RUN_DONE;
}

/* Wakes every parked task with TP_ESHUTDOWN until done holds (bounded). */
static void unwind(tp_sim *sim, int (*done)(tp_sim *), const char *what) {
    sim->unwinding = 1;
    for (uint32_t round = 0; round < TPI_SIM_UNWIND_ROUNDS_MAX && !done(sim); round++) {
        tpi_sim_trace(sim, "unwind %s round=%u", what, round);
        tpi_sim_wake_parked(sim, NULL, TP_ESHUTDOWN);
        if (run_until(sim, done, 0, TPI_SIM_UNWIND_EVENTS_MAX) == RUN_DONE)
            break;
    }
}

static void main_entry(void *arg) {
    tpi_sim_host *h = arg;
    tp_sim *sim = tpi_sim_active();
    int code = sim->program((int)h->rank, (int)sim->cfg.hosts, sim->program_arg);
    h->returned = 1;
    h->exit_code = code;
    tpi_sim_trace(sim, "exit host=%u code=%d", h->index, code);
    TPI_ASSERT(sim->mains_live > 0);
    sim->mains_live--;
}

static void teardown_entry(void *arg) {
    tpi_sim_host *h = arg;
    tp_context *ctx = h->ctx;
    /* Shuts down a worker still initialised there (not gracefully): the
     * agent's stop and destroy run here, in a task, so stop can wait. */
    tp_context_free(ctx);
    h->ctx = NULL;
}

static void teardown(tp_sim *sim) {
    sim->unwinding = 1;
    tpi_sim_trace(sim, "teardown");
    tpi_sim_wake_parked(sim, NULL, TP_ESHUTDOWN);
    for (uint32_t i = 0; i < sim->nhosts; i++) {
        tpi_sim_host *h = &sim->hosts[i];
        if (h->ctx &&
            tpi_sim_task_spawn(sim, h, TPI_SIM_TASK_TEARDOWN, teardown_entry, h, NULL) != TP_OK) {
            /* Without a task, free it from here: fine when no worker runs. */
            tp_context_free(h->ctx);
            h->ctx = NULL;
        }
    }
    if (run_until(sim, teardown_done, 0, TPI_SIM_UNWIND_EVENTS_MAX) != RUN_DONE)
        unwind(sim, teardown_done, "teardown");
    /* Tasks scenarios spawned and left waiting get their chance to return. */
    if (run_until(sim, all_idle, 0, TPI_SIM_UNWIND_EVENTS_MAX) != RUN_DONE)
        unwind(sim, all_idle, "tasks");
}

tp_status tp_sim_run(tp_sim *sim, tp_sim_program program, void *arg, int *exit_codes) {
    if (!sim || !program)
        return tpi_fail(TP_EINVAL, "tp_sim_run: simulation or program is NULL");
    if (sim->ran)
        return tpi_fail(TP_EINVAL, "tp_sim_run: a simulation runs once");
    if (tpi_sim_active())
        return tpi_fail(TP_EINVAL, "tp_sim_run: simulations do not nest");
    sim->ran = 1;
    tpi_sim_pf_begin(sim);
    sim->program = program;
    sim->program_arg = arg;
    tpi_sim_set_active(sim);
    tp_status result = TP_OK;
    for (uint32_t i = 0; i < sim->cfg.hosts && result == TP_OK; i++) {
        tpi_sim_host *h = &sim->hosts[i];
        if (tpi_sim_task_spawn(sim, h, TPI_SIM_TASK_MAIN, main_entry, h, &h->main) != TP_OK)
            result = TP_ENOMEM;
        else
            sim->mains_live++;
    }
    const char *why = NULL;
    if (result == TP_OK) {
        switch (run_until(sim, mains_done, 1, 0)) {
        case RUN_EMPTY:
            tpi_sim_trace(sim, "deadlock live=%u", sim->mains_live);
            result = TP_ECANCELED;
            why = "deadlock: every task waits and no event is left";
            break;
        case RUN_LIMIT:
            sim->now_ns = sim->cfg.time_limit_ns;
            tpi_sim_trace(sim, "time_limit live=%u", sim->mains_live);
            result = TP_ETIMEDOUT;
            why = "virtual time limit reached";
            break;
        default:
            break;
        }
    }
    uint32_t blocked = sim->mains_live;
    if (sim->mains_live)
        unwind(sim, mains_done, "programs");
    teardown(sim);
    tpi_sim_oracle_end(sim);
    tpi_sim_pf_end(sim);
    free_tasks(sim);
    free_events(sim);
    for (uint32_t i = 0; i < sim->cfg.hosts; i++) { /* a rank's newest incarnation */
        const tpi_sim_host *h = &sim->hosts[sim->rank_host[i]];
        if (exit_codes)
            exit_codes[i] = h->dead ? 137 : h->returned ? h->exit_code : -1;
    }
    tp_context_switch(NULL, NULL);
    tpi_sim_set_active(NULL);
    if (result == TP_ENOMEM)
        return tpi_fail(result, "tp_sim_run: out of memory starting the hosts");
    if (why)
        return tpi_fail(result, "tp_sim_run: %s at t=%llu ns (%u of %u programs had not returned)",
                        why, (unsigned long long)sim->now_ns, blocked, sim->cfg.hosts);
    return TP_OK;
}

/* ---- Counters -------------------------------------------------------------------- */

uint64_t tp_sim_fault_count(const tp_sim *sim, tp_sim_fault_kind kind) {
    return sim && (unsigned)kind < TP_SIM_FAULT_KINDS_ ? sim->fired[kind] : 0;
}

const char *tp_sim_fault_kind_name(tp_sim_fault_kind kind) {
    static const char *const names[TP_SIM_FAULT_KINDS_] = {
        [TP_SIM_FAULT_DELAY] = "delay",
        [TP_SIM_FAULT_BREAK] = "break",
        [TP_SIM_FAULT_PARTITION] = "partition",
        [TP_SIM_FAULT_PARTITION_HELD] = "partition_held",
        [TP_SIM_FAULT_STALL_BREAK] = "stall_break",
        [TP_SIM_FAULT_KILL] = "kill",
        [TP_SIM_FAULT_DROP] = "drop",
        [TP_SIM_FAULT_FAILSEND] = "failsend",
        [TP_SIM_FAULT_PAUSE] = "pause",
        [TP_SIM_FAULT_CHAOS_DROP] = "chaos_drop",
        [TP_SIM_FAULT_CHAOS_DUP] = "chaos_dup",
        [TP_SIM_FAULT_CHAOS_REORDER] = "chaos_reorder",
        [TP_SIM_FAULT_STORE_DOWN] = "store_down",
        [TP_SIM_FAULT_STORE_SLOW] = "store_slow",
        [TP_SIM_FAULT_RESTART] = "restart",
    };
    return (unsigned)kind < TP_SIM_FAULT_KINDS_ ? names[kind] : "?";
}

int tp_sim_host_dead(const tp_sim *sim, uint32_t host) {
    return sim && host < sim->nhosts && sim->hosts[host].dead;
}

int tp_sim_rank_dead(const tp_sim *sim, uint32_t rank) {
    return sim && rank < sim->cfg.hosts && sim->hosts[sim->rank_host[rank]].dead;
}

uint32_t tp_sim_rank_host(const tp_sim *sim, uint32_t rank) {
    return sim && rank < sim->cfg.hosts ? sim->rank_host[rank] : UINT32_MAX;
}

uint32_t tp_sim_incarnation(void) {
    tp_sim *sim = active_sim;
    int h = tp_sim_current_host();
    return sim && h >= 0 ? sim->hosts[h].incarnation : 0;
}

void tpi_sim_host_restart(tp_sim *sim, uint32_t rank) {
    TPI_ASSERT(rank < sim->cfg.hosts);
    tpi_sim_host *old = &sim->hosts[sim->rank_host[rank]];
    if (!old->dead) {
        tpi_sim_trace(sim, "fault restart rank=%u skipped: host %u is alive", rank, old->index);
        return;
    }
    if (sim->nhosts >= sim->cfg.hosts + TPI_SIM_RESTARTS_MAX || !sim->program) {
        tpi_sim_trace(sim, "fault restart rank=%u skipped: no host slot left", rank);
        return;
    }
    tpi_sim_host *h = &sim->hosts[sim->nhosts];
    memset(h, 0, sizeof *h);
    h->index = sim->nhosts;
    h->rank = rank;
    h->incarnation = old->incarnation + 1;
    h->exit_code = -1;
    h->ctx = tp_context_new();
    if (!h->ctx)
        tpi_assert_fail("simulator restart: out of memory for a context", __FILE__, __LINE__);
    sim->nhosts++;
    sim->rank_host[rank] = h->index;
    sim->fired[TP_SIM_FAULT_RESTART]++;
    tpi_sim_trace(sim, "fault restart rank=%u host=%u incarnation=%u replaces=%u", rank, h->index,
                  h->incarnation, old->index);
    tpi_sim_pf_host(sim, h->index);
    tpi_sim_pf_fault(sim, "restarted", h->index, UINT32_MAX);
    if (tpi_sim_task_spawn(sim, h, TPI_SIM_TASK_MAIN, main_entry, h, &h->main) != TP_OK)
        tpi_assert_fail("simulator restart: out of memory for a task", __FILE__, __LINE__);
    sim->mains_live++;
}

uint64_t tp_sim_violations(const tp_sim *sim) {
    return sim ? sim->violations : 0;
}

const char *tp_sim_violation(const tp_sim *sim) {
    return sim ? sim->violation : "";
}

uint64_t tp_sim_trace_hash(const tp_sim *sim) {
    return sim ? sim->trace_hash : 0;
}

uint64_t tp_sim_events(const tp_sim *sim) {
    return sim ? sim->events : 0;
}

uint64_t tp_sim_now_ns(const tp_sim *sim) {
    return sim ? sim->now_ns : 0;
}

uint64_t tp_sim_messages(const tp_sim *sim) {
    return sim ? sim->messages : 0;
}

/* ---- Inside a program ------------------------------------------------------------ */

tp_sim *tp_sim_current(void) {
    return active_sim;
}

int tp_sim_current_host(void) {
    tp_sim *sim = active_sim;
    if (!sim)
        return -1;
    if (sim->current)
        return (int)sim->current->host->index;
    return sim->upcall_host;
}

uint64_t tp_sim_random(void) {
    tp_sim *sim = active_sim;
    TPI_ASSERT(sim && "tp_sim_random outside a simulation");
    return tpi_sim_prng_next(&sim->work_rng);
}

void tp_sim_crash_self(void) {
    tp_sim *sim = active_sim;
    TPI_ASSERT(sim && sim->current && "tp_sim_crash_self outside a simulated task");
    tpi_sim_host_kill(sim, sim->current->host, "crash");
}

tp_status tp_sim_sleep(double seconds) {
    tp_sim *sim = active_sim;
    TPI_ASSERT(sim && sim->current && "tp_sim_sleep outside a simulated task");
    if (!(seconds >= 0) || seconds > 1e9)
        return TP_EINVAL;
    uint64_t until = sim->now_ns + (uint64_t)(seconds * 1e9);
    while (sim->now_ns < until) {
        tp_status st = tpi_sim_task_park(sim, sim->current, until);
        if (st != TP_OK && st != TP_ETIMEDOUT)
            return st; /* the host or the world is ending */
    }
    return TP_OK;
}

void tp_sim_trace_note(const char *fmt, ...) {
    tp_sim *sim = active_sim;
    if (!sim || !fmt)
        return;
    char text[TP_ERRMSG_LEN_MAX];
    va_list ap;
    va_start(ap, fmt);
    tpi_vformat(text, sizeof text, fmt, ap);
    va_end(ap);
    tpi_sim_trace(sim, "note host=%d %s", tp_sim_current_host(), text);
}
