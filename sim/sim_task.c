/*
 * sim_task.c: simulated tasks as ucontext fibers.
 *
 * Each task has its own stack, mapped with a guard page below it so an
 * overflow faults at once instead of corrupting a neighbour. Switches go
 * through two functions, switch_in (scheduler -> task) and switch_out (task
 * -> scheduler), which tell AddressSanitizer about the stack change when
 * built with TP_SANITIZE (its fiber API), and stacks are registered with
 * valgrind, so both tools follow the fibers without false reports.
 *
 * Speed (a swarm runs thousands of worlds a second): glibc's swapcontext
 * saves and restores the signal mask, a system call each way. Outside
 * sanitizer builds a task is entered once with swapcontext and from then on
 * switched with _setjmp/_longjmp, which do not touch the mask. Stacks of
 * returned tasks go to a small per-thread cache instead of back to the
 * kernel, so a new world maps and faults in no new pages.
 */
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sim_internal.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define TPI_SIM_HAVE_VALGRIND 1
#endif
#endif

/* TP_SANITIZE builds use -fsanitize=address, whose headers ship with the
 * compiler; tell ASan about every stack switch (its fiber API). */
#if defined(TP_SANITIZE) && defined(__has_include)
#if __has_include(<sanitizer/common_interface_defs.h>)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define TPI_SIM_ASAN_FIBERS 1
#endif
#endif

const char *tpi_sim_task_kind_name(tpi_sim_task_kind kind) {
    switch (kind) {
    case TPI_SIM_TASK_MAIN:
        return "main";
    case TPI_SIM_TASK_POOL:
        return "pool";
    case TPI_SIM_TASK_TEARDOWN:
        return "teardown";
    case TPI_SIM_TASK_AUX:
        return "aux";
    case TPI_SIM_TASK_SCHED:
        return "sched";
    }
    return "?";
}

/* ---- Switching ------------------------------------------------------------ */

#ifndef TPI_SIM_ASAN_FIBERS
/* The scheduler's and each task's resume points (one scheduler per thread). */
static _Thread_local jmp_buf sched_jb;
#endif

static void switch_in(tp_sim *sim, tpi_sim_task *t) {
#ifndef TPI_SIM_ASAN_FIBERS
    if (_setjmp(sched_jb) != 0)
        return; /* the task switched out */
    if (t->started)
        _longjmp(t->jb, 1);
    t->started = 1;
    /* The first entry: onto the task's own stack (task_entry never returns
     * here; it longjmps back like every later switch). */
    if (swapcontext(&sim->sched_uc, &t->uc) != 0)
        tpi_assert_fail("swapcontext into a task failed", __FILE__, __LINE__);
    tpi_assert_fail("a task returned through its first context", __FILE__, __LINE__);
#else
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, t->stack, t->stack_size);
    swapcontext(&sim->sched_uc, &t->uc);
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}

static void switch_out(tp_sim *sim, tpi_sim_task *t) {
#ifdef TPI_SIM_ASAN_FIBERS
    /* A returning task passes NULL: its fake stack frames may be freed. */
    __sanitizer_start_switch_fiber(t->state == TPI_SIM_EXITED ? NULL : &t->asan_fake_stack,
                                   sim->sched_stack_bottom, sim->sched_stack_size);
    swapcontext(&t->uc, &sim->sched_uc);
    __sanitizer_finish_switch_fiber(t->asan_fake_stack, &sim->sched_stack_bottom,
                                    &sim->sched_stack_size);
#else
    (void)sim;
    if (_setjmp(t->jb) == 0)
        _longjmp(sched_jb, 1);
#endif
}

/* Every task starts here; it never returns (the scheduler frees the stack). */
static void task_entry(void) {
#ifdef TPI_SIM_ASAN_FIBERS
    const void *bottom = NULL;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(NULL, &bottom, &size);
#endif
    tp_sim *sim = tpi_sim_active();
    tpi_sim_task *t = sim->current;
#ifdef TPI_SIM_ASAN_FIBERS
    sim->sched_stack_bottom = bottom;
    sim->sched_stack_size = size;
#endif
    tpi_sim_trace(sim, "task_start task=%u host=%u kind=%s", t->id, t->host->index,
                  tpi_sim_task_kind_name(t->kind));
    t->fn(t->arg);
    tpi_sim_trace(sim, "task_exit task=%u host=%u", t->id, t->host->index);
    t->state = TPI_SIM_EXITED;
    switch_out(sim, t);
    tpi_assert_fail("a returned task was resumed", __FILE__, __LINE__);
}

void tpi_sim_task_yield(tp_sim *sim) {
    tpi_sim_task *t = sim->current;
    TPI_ASSERT(t && t->state != TPI_SIM_RUNNING && t->state != TPI_SIM_EXITED);
    switch_out(sim, t);
}

/* ---- Life cycle ---------------------------------------------------------- */

static size_t page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

/* Mappings of returned tasks, kept for the next task of the same size. */
typedef struct stack_cache {
    void *map[TPI_SIM_STACK_CACHE_MAX];
    size_t size[TPI_SIM_STACK_CACHE_MAX];
    uint32_t n;
} stack_cache;
static _Thread_local stack_cache stacks;

static void *cache_take(size_t total) {
    for (uint32_t i = stacks.n; i-- > 0;)
        if (stacks.size[i] == total) {
            void *map = stacks.map[i];
            stacks.n--;
            stacks.map[i] = stacks.map[stacks.n];
            stacks.size[i] = stacks.size[stacks.n];
            return map;
        }
    return NULL;
}

static tp_status stack_map(tp_sim *sim, tpi_sim_task *t) {
    size_t page = page_size();
    size_t want = sim->cfg.stack_size * TPI_SIM_STACK_SANITIZE_FACTOR;
    want = (want + page - 1) / page * page;
    size_t total = want + page;
    void *map = cache_take(total);
    if (!map) {
        map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED)
            return TP_ENOMEM;
        /* The guard page: stacks grow down into it. */
        if (mprotect(map, page, PROT_NONE) != 0) {
            munmap(map, total);
            return TP_ENOMEM;
        }
    }
    t->map = map;
    t->map_size = total;
    t->stack = (char *)map + page;
    t->stack_size = want;
#ifdef TPI_SIM_HAVE_VALGRIND
    t->valgrind_id = VALGRIND_STACK_REGISTER(t->stack, (char *)t->stack + t->stack_size);
#endif
    return TP_OK;
}

static void stack_unmap(tpi_sim_task *t) {
    if (!t->map)
        return;
#ifdef TPI_SIM_HAVE_VALGRIND
    VALGRIND_STACK_DEREGISTER(t->valgrind_id);
#endif
#ifdef TPI_SIM_ASAN_FIBERS
    /* Frames still on the stack (the task's entry, or a task freed where it
     * stood) leave poisoned redzones behind; clear them before the pages go
     * back, or a later mapping at the same address would inherit them. */
    __asan_unpoison_memory_region(t->stack, t->stack_size);
#endif
    if (stacks.n < TPI_SIM_STACK_CACHE_MAX) {
        stacks.map[stacks.n] = t->map;
        stacks.size[stacks.n++] = t->map_size;
    } else {
        munmap(t->map, t->map_size);
    }
    t->map = NULL;
}

static tp_status table_add(tp_sim *sim, tpi_sim_task *t) {
    if (sim->ntasks == sim->tasks_cap) {
        uint32_t cap = sim->tasks_cap ? sim->tasks_cap * 2 : 64;
        tpi_sim_task **tasks = realloc(sim->tasks, cap * sizeof *tasks);
        if (!tasks)
            return TP_ENOMEM;
        sim->tasks = tasks;
        sim->tasks_cap = cap;
    }
    TPI_ASSERT(sim->ntasks < UINT32_MAX - 1);
    t->id = sim->ntasks;
    sim->tasks[sim->ntasks++] = t;
    return TP_OK;
}

tp_status tpi_sim_task_spawn(tp_sim *sim, tpi_sim_host *host, tpi_sim_task_kind kind,
                             void (*fn)(void *arg), void *arg, tpi_sim_task **out) {
    TPI_ASSERT(sim && host && fn && kind != TPI_SIM_TASK_SCHED);
    tpi_sim_task *t = calloc(1, sizeof *t);
    if (!t)
        return TP_ENOMEM;
    t->kind = kind;
    t->host = host;
    t->fn = fn;
    t->arg = arg;
    if (stack_map(sim, t) != TP_OK) {
        free(t);
        return TP_ENOMEM;
    }
    if (getcontext(&t->uc) != 0) {
        stack_unmap(t);
        free(t);
        return TP_ENOMEM;
    }
    t->uc.uc_stack.ss_sp = t->stack;
    t->uc.uc_stack.ss_size = t->stack_size;
    t->uc.uc_link = NULL; /* task_entry never returns */
    makecontext(&t->uc, task_entry, 0);
    if (table_add(sim, t) != TP_OK) {
        stack_unmap(t);
        free(t);
        return TP_ENOMEM;
    }
    /* Append to the host's live list: iteration in creation order. */
    t->host_prev = host->tasks_tail;
    if (host->tasks_tail)
        host->tasks_tail->host_next = t;
    else
        host->tasks_head = t;
    host->tasks_tail = t;
    sim->live_tasks++;
    /* Runnable from now on: the first resume starts it. */
    t->state = TPI_SIM_IDLE;
    tpi_sim_task_wake(sim, t, TP_OK);
    if (out)
        *out = t;
    return TP_OK;
}

void tpi_sim_task_destroy(tp_sim *sim, tpi_sim_task *t) {
    TPI_ASSERT(t != sim->current);
    tpi_sim_host *h = t->host;
    if (t->host_prev)
        t->host_prev->host_next = t->host_next;
    else
        h->tasks_head = t->host_next;
    if (t->host_next)
        t->host_next->host_prev = t->host_prev;
    else
        h->tasks_tail = t->host_prev;
    if (h->main == t)
        h->main = NULL;
    sim->tasks[t->id] = NULL;
    sim->live_tasks--;
    stack_unmap(t);
    free(t);
}

void tpi_sim_task_resume(tp_sim *sim, tpi_sim_task *t) {
    TPI_ASSERT(sim->current == NULL && t->state == TPI_SIM_RUNNABLE);
    t->state = TPI_SIM_RUNNING;
    sim->current = t;
    tp_context_switch(t->host->ctx, t->errmsg);
    switch_in(sim, t);
    tp_context_switch(NULL, NULL);
    sim->current = NULL;
    TPI_ASSERT(t->state != TPI_SIM_RUNNING);
    if (t->state == TPI_SIM_EXITED)
        tpi_sim_task_destroy(sim, t);
}
