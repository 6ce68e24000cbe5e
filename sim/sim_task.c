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
 * sanitizer builds a fiber is entered once with swapcontext and from then on
 * switched with _setjmp/_longjmp, which do not touch the mask. A fiber runs
 * one task after another: when a task ends (returns, or is freed where it
 * stood), its stack and fiber go to a process-wide free list instead of
 * back to the kernel, and the next task spawned takes the one freed last
 * (LIFO, so its pages are resident and likely still in cache) and, on the
 * thread that last ran it, enters it with a _longjmp to the top of
 * fiber_main: no mmap, munmap, page fault or signal-mask call per task once
 * a world as large has run in the process. The list holds up to
 * TPI_SIM_STACK_CACHE_BYTES of mappings and never more stacks than were
 * alive at once (a stack is mapped only when the list has none); the
 * process's exit unmaps them.
 */
#include <stdatomic.h>
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

/* ---- Fibers ------------------------------------------------------------- */

/* One mapping: a guard page (the stack grows down into it), the stack, and
 * this header at the top, sharing the stack's first page. */
struct tpi_sim_fiber {
    tpi_sim_fiber *next; /* the free list */
    size_t map_size;     /* the whole mapping, from the guard page up */
    void *stack;         /* usable stack: from the guard page to this header */
    size_t stack_size;
    unsigned valgrind_id;
    /* Plain builds: entered once, on the thread `owner` names, so top holds
     * the start of fiber_main's run of a task, and a new task on that thread
     * enters with a _longjmp there; else it enters through uc, prepared at
     * spawn. */
    int ready;
    const void *owner;
    jmp_buf top; /* plain builds: where fiber_main picks up the next task */
    jmp_buf jb;  /* plain builds: where switch_out left the running task */
    ucontext_t uc;
};

/* Bytes at the top of a mapping for the header (16-byte stack alignment). */
#define FIBER_HEADER_SIZE ((sizeof(tpi_sim_fiber) + 63) / 64 * 64)

/* ---- Switching ------------------------------------------------------------ */

#ifndef TPI_SIM_ASAN_FIBERS
/* The scheduler's resume point (one scheduler per thread). */
static _Thread_local jmp_buf sched_jb;
#endif
/* The calling thread, for tpi_sim_fiber.owner: fiber_main's frame may hold
 * what it computed from the thread (addresses of thread-locals), so a fiber
 * resumes at its top only on the thread it was started on (or one that has
 * its thread-locals at the same addresses). */
static _Thread_local char thread_token;

static void switch_in(tp_sim *sim, tpi_sim_task *t) {
    tpi_sim_fiber *f = t->fiber;
#ifndef TPI_SIM_ASAN_FIBERS
    if (_setjmp(sched_jb) != 0)
        return; /* the task switched out */
    if (t->started)
        _longjmp(f->jb, 1);
    t->started = 1;
    if (f->ready)
        _longjmp(f->top, 1); /* fiber_main picks this one up */
    /* The first entry: onto the fiber's own stack (fiber_main never returns
     * here; it longjmps back like every later switch). */
    if (swapcontext(&sim->sched_uc, &f->uc) != 0)
        tpi_assert_fail("swapcontext into a task failed", __FILE__, __LINE__);
    tpi_assert_fail("a task returned through its first context", __FILE__, __LINE__);
#else
    t->started = 1;
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, f->stack, f->stack_size);
    swapcontext(&sim->sched_uc, &f->uc);
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}

static void switch_out(tp_sim *sim, tpi_sim_task *t) {
    tpi_sim_fiber *f = t->fiber;
#ifdef TPI_SIM_ASAN_FIBERS
    /* A returning task passes NULL: its fake stack frames may be freed. */
    __sanitizer_start_switch_fiber(t->state == TPI_SIM_EXITED ? NULL : &t->asan_fake_stack,
                                   sim->sched_stack_bottom, sim->sched_stack_size);
    swapcontext(&f->uc, &sim->sched_uc);
    __sanitizer_finish_switch_fiber(t->asan_fake_stack, &sim->sched_stack_bottom,
                                    &sim->sched_stack_size);
#else
    (void)sim;
    if (_setjmp(f->jb) == 0)
        _longjmp(sched_jb, 1);
#endif
}

/* Every fiber starts here and never returns (its stack is unmapped, or
 * reused, from outside). Plain builds keep the fiber: its next task, perhaps
 * in a later simulation, longjmps back to `top` in this frame, where what the
 * last task left deeper in the stack (returned, or freed where it stood) is
 * of no further use. */
static void fiber_main(void) {
#ifdef TPI_SIM_ASAN_FIBERS
    const void *bottom = NULL;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(NULL, &bottom, &size);
    tpi_sim_active()->sched_stack_bottom = bottom;
    tpi_sim_active()->sched_stack_size = size;
#else
    tpi_sim_fiber *f = tpi_sim_active()->current->fiber;
    if (_setjmp(f->top) == 0) {
        f->owner = &thread_token;
        f->ready = 1;
    }
#endif
    /* From here on only what the scheduler set: sim->current is the task
     * this fiber runs now. */
    tp_sim *sim = tpi_sim_active();
    tpi_sim_task *t = sim->current;
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

/* The free fibers, last freed first, and the bytes of their mappings.
 * Process-wide (two threads may run simulations at once, and a thread's
 * stacks outlive it here instead of leaking when it exits); the spin lock is
 * held for a pop or a push, never across a system call. */
static struct {
    atomic_flag spin;
    tpi_sim_fiber *head;
    size_t bytes;
} pool = {.spin = ATOMIC_FLAG_INIT};

static void pool_lock(void) {
    while (atomic_flag_test_and_set_explicit(&pool.spin, memory_order_acquire)) {
    }
}

static void pool_unlock(void) {
    atomic_flag_clear_explicit(&pool.spin, memory_order_release);
}

static void fiber_unmap(tpi_sim_fiber *f) {
#ifdef TPI_SIM_HAVE_VALGRIND
    VALGRIND_STACK_DEREGISTER(f->valgrind_id);
#endif
    /* The header is in the mapping: read the size first. */
    size_t total = f->map_size;
    munmap((char *)f + FIBER_HEADER_SIZE - total, total);
}

static tpi_sim_fiber *fiber_take(size_t total) {
    tpi_sim_fiber *f = NULL;
    pool_lock();
    for (tpi_sim_fiber **p = &pool.head; *p; p = &(*p)->next)
        if ((*p)->map_size == total) { /* the head, unless stack sizes differ */
            f = *p;
            *p = f->next;
            pool.bytes -= total;
            break;
        }
    pool_unlock();
    if (f) {
        f->next = NULL;
        if (f->owner != &thread_token)
            f->ready = 0; /* started on another thread: start afresh */
    }
    return f;
}

static void fiber_put(tpi_sim_fiber *f) {
#ifdef TPI_SIM_ASAN_FIBERS
    /* Frames still on the stack (the task's entry, or a task freed where it
     * stood) leave poisoned redzones behind; clear them before another task
     * runs there. */
    __asan_unpoison_memory_region(f->stack, f->stack_size);
#endif
    pool_lock();
    int keep = f->map_size <= TPI_SIM_STACK_CACHE_BYTES - pool.bytes;
    if (keep) {
        f->next = pool.head;
        pool.head = f;
        pool.bytes += f->map_size;
    }
    pool_unlock();
    if (!keep)
        fiber_unmap(f);
}

/* A fiber for a new task: a free one, else a new mapping. */
static tpi_sim_fiber *fiber_get(tp_sim *sim) {
    size_t page = page_size();
    size_t want = sim->cfg.stack_size * TPI_SIM_STACK_SANITIZE_FACTOR;
    want = (want + page - 1) / page * page;
    /* The guard page, the stack, and a page shared by the stack's top and
     * the header (so the usable stack is at least what was asked). */
    size_t total = page + want + page;
    tpi_sim_fiber *f = fiber_take(total);
    if (f)
        return f;
    char *map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return NULL;
    /* The guard page: stacks grow down into it. */
    if (mprotect(map, page, PROT_NONE) != 0) {
        munmap(map, total);
        return NULL;
    }
    f = (tpi_sim_fiber *)(map + total - FIBER_HEADER_SIZE);
    f->next = NULL;
    f->map_size = total;
    f->stack = map + page;
    f->stack_size = total - page - FIBER_HEADER_SIZE;
    f->ready = 0;
    f->owner = NULL;
#ifdef TPI_SIM_HAVE_VALGRIND
    f->valgrind_id = VALGRIND_STACK_REGISTER(f->stack, (char *)f->stack + f->stack_size);
#endif
    return f;
}

/* A fiber with no task on it: the first entry starts fiber_main afresh.
 * Not inlined: getcontext returns twice, and its caller's locals must not be
 * held in registers across it. */
__attribute__((noinline)) static tp_status fiber_prepare(tpi_sim_fiber *f) {
    if (getcontext(&f->uc) != 0)
        return TP_ENOMEM;
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = f->stack_size;
    f->uc.uc_link = NULL; /* fiber_main never returns */
    makecontext(&f->uc, fiber_main, 0);
    return TP_OK;
}

/* The task is gone: its fiber goes back to the free list. */
static void fiber_release(tpi_sim_task *t) {
    tpi_sim_fiber *f = t->fiber;
    if (!f)
        return;
    t->fiber = NULL;
    fiber_put(f);
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
    tpi_sim_fiber *f = fiber_get(sim);
    if (!f) {
        free(t);
        return TP_ENOMEM;
    }
    if (!f->ready && fiber_prepare(f) != TP_OK) {
        fiber_put(f);
        free(t);
        return TP_ENOMEM;
    }
    t->fiber = f;
    if (table_add(sim, t) != TP_OK) {
        fiber_release(t);
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
    fiber_release(t);
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
