/*
 * tcp_pool.c: the executor (spec/agent.md AGENT-7). A FIFO of work items
 * (intrusive, through w->next: execute allocates nothing) under pool_mu,
 * and up to pool_max threads started on demand.
 *
 * One searching thread at a time: a thread woken (or started) for the queue
 * is "searching" until it takes an item or finds the queue empty; nsearch
 * counts them exactly. execute wakes an idle thread, or starts one while under
 * pool_max, only when nobody is searching; a thread that takes an item and
 * sees more queued (and nobody searching) wakes or starts the next one before
 * it runs its own. So a burst of items wakes threads one after another, as
 * many as keep up, not all at once; and since every queued item has a searcher
 * coming or no thread to spare, an item that blocks on another item still gets
 * its own thread up to pool_max (a user function waiting on another item's
 * result must not deadlock on a pool that was started too small).
 *
 * Each idle thread waits on its own semaphore on a LIFO stack (the most
 * recently idle thread is woken first): a waker pops the thread and sets its
 * woken flag under pool_mu, so a wake-up is never lost nor taken by another
 * thread, and posts once pool_mu is released, so the woken thread does not
 * block on pool_mu at once. A semaphore, not a condition variable: glibc's
 * condition wait retakes its mutex marked contended, which costs every
 * wake-up one more futex call when the thread next unlocks it. The
 * semaphores live until pool_join has joined every thread.
 */
#include <errno.h>
#include <stdlib.h>

#include "tcp_internal.h"

static void *pool_main(void *arg);

/* Starts a pool thread, counted as searching (pool_mu held). 0 on success. */
static int pool_start(tpi_tcp_agent *a) {
    tpi_tcp_pool_thread *t = &a->threads[a->nthreads];
    t->a = a;
    t->woken = 0;
    t->next_idle = NULL;
    if (sem_init(&t->sem, 0, 0) != 0)
        return -1;
    if (tpi_tcp_thread_create(&t->tid, pool_main, t) != 0) {
        sem_destroy(&t->sem);
        return -1;
    }
    a->nthreads++;
    a->nsearch++;
    return 0;
}

/*
 * Makes sure a thread comes for the queued items (pool_mu held): nothing when
 * the queue is empty or a thread is already searching; otherwise pops an idle
 * thread, returned for the caller to signal once pool_mu is released, or
 * starts one while under pool_max (never once closing: pool_join's count of
 * threads is final then, and close woke every idle thread).
 */
static tpi_tcp_pool_thread *pool_summon(tpi_tcp_agent *a) {
    if (!a->w_head || a->nsearch > 0)
        return NULL;
    tpi_tcp_pool_thread *t = a->idle;
    if (t) {
        a->idle = t->next_idle;
        t->next_idle = NULL;
        t->woken = 1;
        a->nsearch++;
        return t;
    }
    if (!a->pool_closing && a->nthreads < a->pool_max)
        (void)pool_start(a); /* on failure the busy threads take the item later */
    return NULL;
}

static void *pool_main(void *arg) {
    tpi_tcp_pool_thread *self = arg;
    tpi_tcp_agent *a = self->a;
    tp_context_switch(a->ctx, NULL); /* AGENT-7: the worker's context is current */
    pthread_mutex_lock(&a->pool_mu);
    int searching = 1; /* started for the queue: counted in nsearch */
    for (;;) {
        tp_work *w = a->w_head;
        if (searching) {
            TPI_ASSERT(a->nsearch > 0);
            a->nsearch--;
            searching = 0;
        }
        if (!w) {
            if (a->pool_closing)
                break; /* closing and drained */
            self->woken = 0;
            self->next_idle = a->idle;
            a->idle = self;
            pthread_mutex_unlock(&a->pool_mu);
            while (sem_wait(&self->sem) != 0)
                TPI_ASSERT(errno == EINTR);
            pthread_mutex_lock(&a->pool_mu);
            TPI_ASSERT(self->woken); /* one post per wake-up, after woken was set */
            searching = 1; /* the waker counted us */
            continue;
        }
        a->w_head = w->next;
        if (!a->w_head)
            a->w_tail = NULL;
        a->w_len--;
        w->next = NULL;
        tpi_tcp_pool_thread *next = pool_summon(a);
        pthread_mutex_unlock(&a->pool_mu);
        if (next)
            sem_post(&next->sem);
        w->run(w);
        pthread_mutex_lock(&a->pool_mu);
    }
    pthread_mutex_unlock(&a->pool_mu);
    return NULL;
}

tp_status tpi_tcp_pool_execute(tpi_tcp_agent *a, tp_work *w) {
    TPI_ASSERT(w && w->run);
    pthread_mutex_lock(&a->pool_mu);
    if (a->pool_closing) {
        pthread_mutex_unlock(&a->pool_mu);
        return TP_ESHUTDOWN;
    }
    w->next = NULL;
    tp_work *prev_tail = a->w_tail;
    if (a->w_tail)
        a->w_tail->next = w;
    else
        a->w_head = w;
    a->w_tail = w;
    a->w_len++;
    tpi_tcp_pool_thread *next = pool_summon(a);
    if (a->nthreads == 0) {
        /* No thread will ever take it: give it back (transferred on TP_OK). */
        a->w_tail = prev_tail;
        if (prev_tail)
            prev_tail->next = NULL;
        else
            a->w_head = NULL;
        a->w_len--;
        pthread_mutex_unlock(&a->pool_mu);
        return TP_ENOMEM;
    }
    pthread_mutex_unlock(&a->pool_mu);
    if (next)
        sem_post(&next->sem); /* after unlocking pool_mu */
    return TP_OK;
}

void tpi_tcp_pool_close(tpi_tcp_agent *a) {
    pthread_mutex_lock(&a->pool_mu);
    a->pool_closing = 1;
    /* Every idle thread wakes to drain the queue and exit. */
    while (a->idle) {
        tpi_tcp_pool_thread *t = a->idle;
        a->idle = t->next_idle;
        t->next_idle = NULL;
        t->woken = 1;
        a->nsearch++;
        sem_post(&t->sem);
    }
    pthread_mutex_unlock(&a->pool_mu);
}

void tpi_tcp_pool_join(tpi_tcp_agent *a) {
    pthread_mutex_lock(&a->pool_mu);
    TPI_ASSERT(a->pool_closing);
    uint32_t n = a->nthreads;
    pthread_mutex_unlock(&a->pool_mu);
    /* No thread starts once closing is set, so n is final. */
    for (uint32_t i = 0; i < n; i++)
        pthread_join(a->threads[i].tid, NULL);
    /* Only now: a thread may post another's semaphore until it exits. */
    for (uint32_t i = 0; i < n; i++)
        sem_destroy(&a->threads[i].sem);
    pthread_mutex_lock(&a->pool_mu);
    a->nthreads = 0;
    TPI_ASSERT(!a->w_head && a->w_len == 0 && a->nsearch == 0 && !a->idle);
    pthread_mutex_unlock(&a->pool_mu);
}
