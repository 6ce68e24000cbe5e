/*
 * tcp_pool.c: the executor (spec/agent.md AGENT-7). A FIFO of work items
 * (intrusive, through w->next: execute allocates nothing) under pool_mu,
 * and up to pool_max threads started on demand: a new thread starts when
 * more items wait than threads are idle, so num_worker_threads items can
 * always run at once (a user function waiting on another item's result
 * must not deadlock on a pool that was started too small).
 */
#include <stdlib.h>

#include "tcp_internal.h"

static void *pool_main(void *arg) {
    tpi_tcp_agent *a = arg;
    tp_context_switch(a->ctx, NULL); /* AGENT-7: the worker's context is current */
    pthread_mutex_lock(&a->pool_mu);
    for (;;) {
        while (!a->w_head && !a->pool_closing) {
            a->nidle++;
            pthread_cond_wait(&a->pool_cv, &a->pool_mu);
            a->nidle--;
        }
        tp_work *w = a->w_head;
        if (!w)
            break; /* closing and drained */
        a->w_head = w->next;
        if (!a->w_head)
            a->w_tail = NULL;
        a->w_len--;
        w->next = NULL;
        pthread_mutex_unlock(&a->pool_mu);
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
    if (a->w_len > a->nidle && a->nthreads < a->pool_max) {
        if (tpi_tcp_thread_create(&a->threads[a->nthreads], pool_main, a) == 0) {
            a->nthreads++;
        } else if (a->nthreads == 0) {
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
    }
    pthread_cond_signal(&a->pool_cv);
    pthread_mutex_unlock(&a->pool_mu);
    return TP_OK;
}

void tpi_tcp_pool_close(tpi_tcp_agent *a) {
    pthread_mutex_lock(&a->pool_mu);
    a->pool_closing = 1;
    pthread_cond_broadcast(&a->pool_cv);
    pthread_mutex_unlock(&a->pool_mu);
}

void tpi_tcp_pool_join(tpi_tcp_agent *a) {
    pthread_mutex_lock(&a->pool_mu);
    TPI_ASSERT(a->pool_closing);
    uint32_t n = a->nthreads;
    pthread_mutex_unlock(&a->pool_mu);
    /* No thread starts once closing is set, so n is final. */
    for (uint32_t i = 0; i < n; i++)
        pthread_join(a->threads[i], NULL);
    pthread_mutex_lock(&a->pool_mu);
    a->nthreads = 0;
    TPI_ASSERT(!a->w_head && a->w_len == 0);
    pthread_mutex_unlock(&a->pool_mu);
}
