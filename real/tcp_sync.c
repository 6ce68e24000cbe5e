/*
 * tcp_sync.c: the core lock, park/unpark, the clock, and thread creation
 * for the TCP agent (spec/agent.md AGENT-9, AGENT-11, AGENT-12).
 *
 * A task is an OS thread. Its token (tpi_tcp_task) is created on the
 * thread's first use, lives in thread-local storage and is freed by a
 * pthread key destructor when the thread exits; the loop thread and pool
 * threads have one like any user thread. park releases the agent's mutex and
 * waits on the token's own semaphore (CLOCK_MONOTONIC deadline); a permit
 * flag, set under the lock, keeps an unpark that comes before the park, and a
 * post that lands between the release and the wait is not lost (the count
 * keeps it). A semaphore, not a condition variable: glibc's condition wait
 * retakes the mutex marked contended, so every wake-up cost one more futex
 * call at the next unlock. A post that outlives its park (the task woke by
 * its deadline first) makes one later park return early, which AGENT-12
 * allows as a spurious wakeup; park drains such stale posts before waiting.
 *
 * unpark (called with the lock held) does not signal at once: it records the
 * task, and unlock signals it after releasing the lock, so the woken thread
 * does not wake only to block on the lock still held by its waker (park
 * signals what is recorded before it waits, as its wait releases the lock).
 * While the loop hands on a batch of frames read at once (TCP-31), its
 * unlocks signal nothing: the batch's end, or its flush every
 * TPI_TCP_FLUSH_EVERY frames, signals all it recorded together, so a caller
 * waiting for one of many replies wakes once the batch is read, not at the
 * first of them to sleep again on the next (any other thread's unlock
 * meanwhile signals them too: earlier, never later).
 * The token may be freed as soon as the lock is released (its thread wakes
 * for another reason, returns and exits), so each recorded task holds a
 * reference, dropped after the signal; the last reference frees the token.
 *
 * With spin_us (TCP-29) park first spins for its permit, yielding the CPU
 * each turn, and sleeps only when none came within the spin.
 *
 * park_peer (TCP-30) is park for a reply from one peer: when the loop
 * published that peer's ring, the task takes it and sleeps on the ring's
 * futex instead of its semaphore, reading and handing on the replies
 * itself; an unpark meanwhile nudges that futex (under the lock, which
 * keeps the ring alive: the task clears rd_ring under it before giving the
 * ring back). An unpark by the task itself (its own reply, handed on from
 * its park) only sets the permit.
 *
 * A thread cannot use the library without a token, and making one is an
 * allocation no caller can be told about (task_self cannot fail): when
 * calloc fails, the token comes from a static reserve of TPI_TCP_TASK_SPARES,
 * back in the reserve at its last reference. Only that many threads taking
 * their first token at once, all out of memory, still abort. *Found by
 * `make oom` (test_tcp_oom, every k): a pool thread's first park aborted.*
 */
#define _GNU_SOURCE /* sem_clockwait */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tcp_internal.h"

static pthread_once_t task_key_once = PTHREAD_ONCE_INIT;
static tpi_tcp_task task_spares[TPI_TCP_TASK_SPARES];
static atomic_int task_spare_used[TPI_TCP_TASK_SPARES];
static pthread_key_t task_key;
static _Thread_local tpi_tcp_task *task_tls;

static tpi_tcp_agent *AG(tp_agent *a) {
    TPI_ASSERT(a);
    return (tpi_tcp_agent *)a;
}

uint64_t tpi_tcp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t tpi_tcp_ms_ceil(uint64_t ns) {
    return ns / 1000000 + (ns % 1000000 != 0);
}

static void task_unref(tpi_tcp_task *t) {
    if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1) {
        sem_destroy(&t->sem);
        /* Addresses, as < between unrelated pointers is undefined. */
        uintptr_t at = (uintptr_t)t, first = (uintptr_t)task_spares;
        if (at >= first && at < first + sizeof task_spares)
            atomic_store(&task_spare_used[(at - first) / sizeof *t], 0); /* back in the reserve */
        else
            free(t);
    }
}

/* The thread exits: its own reference goes; a pending signal may keep the token. */
static void task_destroy(void *p) {
    tpi_tcp_task *t = p;
    if (!t)
        return;
    TPI_ASSERT(!t->parked);
    task_tls = NULL;
    task_unref(t);
}

static void task_key_make(void) {
    int rc = pthread_key_create(&task_key, task_destroy);
    TPI_ASSERT(rc == 0);
}

static tpi_tcp_task *task_current(void) {
    if (task_tls)
        return task_tls;
    pthread_once(&task_key_once, task_key_make);
    tpi_tcp_task *t = calloc(1, sizeof *t);
    for (int i = 0; !t && i < TPI_TCP_TASK_SPARES; i++) /* out of memory: the reserve */
        if (atomic_exchange(&task_spare_used[i], 1) == 0) {
            t = &task_spares[i];
            memset(t, 0, sizeof *t);
        }
    /* The token is the thread's identity for the core lock: without one the
     * thread cannot use the library at all. 100 bytes once per thread. */
    TPI_ASSERT(t && "out of memory for a thread's park token, and its reserve used up");
    int rc = sem_init(&t->sem, 0, 0);
    TPI_ASSERT(rc == 0);
    atomic_init(&t->permit, 0);
    atomic_init(&t->refs, 1);
    pthread_setspecific(task_key, t);
    task_tls = t;
    return t;
}

void tpi_tcp_lock(tp_agent *ag) {
    int rc = pthread_mutex_lock(&AG(ag)->mu);
    TPI_ASSERT(rc == 0);
}

/* Signals the recorded unparks and drops their references; n of them from wake. */
static void wake_signal(tpi_tcp_task *const *wake, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        sem_post(&wake[i]->sem);
        task_unref(wake[i]);
    }
}

/* Batches of frames this thread (a loop) is handing on, nested, and the
 * agent whose unparks they hold back (TCP-31). */
static _Thread_local unsigned wake_batch;
static _Thread_local tpi_tcp_agent *wake_batch_agent;

void tpi_tcp_wake_batch_begin(tpi_tcp_agent *a) {
    TPI_ASSERT(wake_batch < UINT_MAX && (wake_batch == 0 || wake_batch_agent == a));
    wake_batch_agent = a;
    wake_batch++;
}

void tpi_tcp_wake_batch_flush(tpi_tcp_agent *a) {
    TPI_ASSERT(wake_batch > 0 && wake_batch_agent == a);
    unsigned depth = wake_batch;
    wake_batch = 0;
    tpi_tcp_lock((tp_agent *)a);
    tpi_tcp_unlock((tp_agent *)a); /* signals what the batch recorded */
    wake_batch = depth;
}

void tpi_tcp_wake_batch_end(tpi_tcp_agent *a) {
    TPI_ASSERT(wake_batch > 0 && wake_batch_agent == a);
    if (wake_batch == 1)
        tpi_tcp_wake_batch_flush(a);
    if (--wake_batch == 0)
        wake_batch_agent = NULL;
}

void tpi_tcp_unlock(tp_agent *ag) {
    tpi_tcp_agent *a = AG(ag);
    uint32_t n = a->nwake;
    /* A batch's unparks wait for its flush (TCP-31); a loop's frames reach
     * only its own agent's core, so no other agent's wait behind it. */
    TPI_ASSERT(wake_batch == 0 || wake_batch_agent == a);
    if (n == 0 || wake_batch > 0) {
        int rc = pthread_mutex_unlock(&a->mu);
        TPI_ASSERT(rc == 0);
        return;
    }
    tpi_tcp_task *wake[TPI_TCP_WAKE_MAX];
    for (uint32_t i = 0; i < n; i++)
        wake[i] = a->to_wake[i];
    a->nwake = 0;
    int rc = pthread_mutex_unlock(&a->mu);
    TPI_ASSERT(rc == 0);
    wake_signal(wake, n);
}

tp_task *tpi_tcp_task_self(tp_agent *ag) {
    (void)ag;
    return (tp_task *)task_current();
}

static void park_link(tpi_tcp_agent *a, tpi_tcp_task *t) {
    t->prev = NULL;
    t->next = a->parked;
    if (a->parked)
        a->parked->prev = t;
    a->parked = t;
    t->parked = 1;
}

static void park_unlink(tpi_tcp_agent *a, tpi_tcp_task *t) {
    if (t->prev)
        t->prev->next = t->next;
    else
        a->parked = t->next;
    if (t->next)
        t->next->prev = t->prev;
    t->prev = t->next = NULL;
    t->parked = 0;
}

/* TCP-29: before it sleeps, a parked task spins up to spin_us for its
 * permit (or the stop). 1 when one came: the unpark's post then finds no
 * sleeper to wake (no system call) and is drained by the next park. */
static int park_spin(tpi_tcp_agent *a, tpi_tcp_task *t, uint64_t deadline_ns) {
    uint64_t now = tpi_tcp_now_ns();
    uint64_t until = now + a->spin_ns < deadline_ns ? now + a->spin_ns : deadline_ns;
    for (;;) {
        if (atomic_load_explicit(&t->permit, memory_order_acquire) ||
            atomic_load_explicit(&a->stop_flag, memory_order_relaxed))
            return 1;
        sched_yield(); /* a turn yields the CPU: see TCP-29 in spec/tcp.md */
        if (tpi_tcp_now_ns() >= until)
            return 0;
    }
}

/* A park's first look (lock held): TP_OK with *done 0 when it must wait. */
static tp_status park_enter(tpi_tcp_agent *a, tpi_tcp_task *t, uint64_t deadline_ns, int *done) {
    /* A task parks itself, holding the lock (AGENT-12). */
    TPI_ASSERT(t && t == task_tls && !t->parked);
    *done = 1;
    if (atomic_load(&a->stop_flag))
        return TP_ESHUTDOWN;
    if (atomic_exchange(&t->permit, 0))
        return TP_OK;
    if (deadline_ns != UINT64_MAX && tpi_tcp_now_ns() >= deadline_ns)
        return TP_ETIMEDOUT;
    *done = 0;
    return TP_OK;
}

/* Links t as parked and releases the lock, signalling what unlock would. */
static void park_release(tpi_tcp_agent *a, tpi_tcp_task *t) {
    park_link(a, t);
    uint32_t n = a->nwake;
    tpi_tcp_task *wake[TPI_TCP_WAKE_MAX];
    for (uint32_t i = 0; i < n; i++)
        wake[i] = a->to_wake[i];
    a->nwake = 0;
    int rc = pthread_mutex_unlock(&a->mu);
    TPI_ASSERT(rc == 0);
    wake_signal(wake, n);
}

/* A park's end (lock held again, t unlinked): why it ended. */
static tp_status park_leave(tpi_tcp_agent *a, tpi_tcp_task *t, uint64_t deadline_ns) {
    if (atomic_exchange(&t->permit, 0))
        return TP_OK;
    if (atomic_load(&a->stop_flag))
        return TP_ESHUTDOWN;
    if (deadline_ns != UINT64_MAX && tpi_tcp_now_ns() >= deadline_ns)
        return TP_ETIMEDOUT;
    return TP_OK; /* spurious: the caller re-checks its condition */
}

static tp_status park_wait(tpi_tcp_agent *a, tpi_tcp_task *t, uint64_t deadline_ns);

tp_status tpi_tcp_park(tp_agent *ag, tp_task *self, uint64_t deadline_ns) {
    tpi_tcp_agent *a = AG(ag);
    tpi_tcp_task *t = (tpi_tcp_task *)self;
    int done;
    tp_status st = park_enter(a, t, deadline_ns, &done);
    return done ? st : park_wait(a, t, deadline_ns);
}

tp_status tpi_tcp_park_peer(tp_agent *ag, tp_task *self, uint64_t deadline_ns, uint32_t peer) {
    tpi_tcp_agent *a = AG(ag);
    tpi_tcp_task *t = (tpi_tcp_task *)self;
    int done;
    tp_status st = park_enter(a, t, deadline_ns, &done);
    if (done)
        return st;
    tpi_tcp_conn *c = tpi_tcp_reply_take(a, peer); /* none for this worker itself */
    if (!c)
        return park_wait(a, t, deadline_ns);
    atomic_store(&t->rd_ring, tpi_tcp_reply_ring(c));
    park_release(a, t);
    int left = tpi_tcp_reply_read(a, c, &t->permit, deadline_ns);
    int rc = pthread_mutex_lock(&a->mu);
    TPI_ASSERT(rc == 0);
    atomic_store(&t->rd_ring, NULL);
    park_unlink(a, t);
    tpi_tcp_reply_release(a, c, left);
    return park_leave(a, t, deadline_ns);
}

static tp_status park_wait(tpi_tcp_agent *a, tpi_tcp_task *t, uint64_t deadline_ns) {
    /* No permit: every post still counted is stale (its permit was used). */
    while (sem_trywait(&t->sem) == 0)
        ;
    /* The wait releases the lock: what unlock would signal goes now. */
    park_release(a, t);
    int rc;
    if (a->spin_ns > 0 && park_spin(a, t, deadline_ns)) {
        rc = pthread_mutex_lock(&a->mu); /* unparked while it spun: no sleep, no post awaited */
        TPI_ASSERT(rc == 0);
        park_unlink(a, t);
        if (atomic_exchange(&t->permit, 0))
            return TP_OK;
        return atomic_load(&a->stop_flag) ? TP_ESHUTDOWN : TP_OK;
    }
    if (deadline_ns == UINT64_MAX) {
        while ((rc = sem_wait(&t->sem)) != 0 && errno == EINTR)
            ;
    } else {
        struct timespec ts;
        ts.tv_sec = (time_t)(deadline_ns / 1000000000ull);
        ts.tv_nsec = (long)(deadline_ns % 1000000000ull);
        while ((rc = sem_clockwait(&t->sem, CLOCK_MONOTONIC, &ts)) != 0 && errno == EINTR)
            ;
    }
    TPI_ASSERT(rc == 0 || errno == ETIMEDOUT);
    rc = pthread_mutex_lock(&a->mu);
    TPI_ASSERT(rc == 0);
    park_unlink(a, t);
    return park_leave(a, t, deadline_ns);
}

void tpi_tcp_unpark(tp_agent *ag, tp_task *task) {
    tpi_tcp_agent *a = AG(ag);
    tpi_tcp_task *t = (tpi_tcp_task *)task;
    TPI_ASSERT(t);
    /* Called with the lock held: an unparked target sees the permit at its
     * next park, a parked one is posted once the lock is released. */
    atomic_store(&t->permit, 1);
    if (!t->parked || t == task_tls)
        return; /* running: its own reply, handed on from its park (TCP-30) */
    tpi_ring *r = atomic_load(&t->rd_ring);
    if (r) {
        tpi_ring_nudge(r); /* alive: its reader clears rd_ring under the lock first */
        return;
    }
    if (a->nwake < TPI_TCP_WAKE_MAX) {
        atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
        a->to_wake[a->nwake++] = t; /* posted by unlock, or by park */
    } else {
        sem_post(&t->sem); /* full: now, under the lock */
    }
}

void tpi_tcp_wake_parked(tpi_tcp_agent *a) {
    pthread_mutex_lock(&a->mu);
    for (tpi_tcp_task *t = a->parked; t; t = t->next) {
        tpi_ring *r = atomic_load(&t->rd_ring);
        if (r)
            tpi_ring_nudge(r); /* it looks at stop_flag when woken */
        else
            sem_post(&t->sem);
    }
    pthread_mutex_unlock(&a->mu);
}

int tpi_tcp_thread_create(pthread_t *t, void *(*fn)(void *), void *arg) {
    sigset_t all, old;
    sigfillset(&all);
    /* Faults stay deliverable (tcp_thread.h). */
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    sigdelset(&all, SIGTRAP);
    sigdelset(&all, SIGABRT);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
