/*
 * tcp_loop.c: the loop thread of a TCP agent: listening, the wake-up async
 * handle, the core's timer, send's queues, loopback delivery, and stop
 * (spec/agent.md AGENT-5, AGENT-8, AGENT-10; spec/tcp.md TCP-1, TCP-8).
 *
 * Other threads never touch a libuv handle: send and timer_arm record what
 * they want under qmu and call uv_async_send while still holding qmu (send
 * may instead write to a socket's file descriptor itself, under the grant of
 * TCP-15, never through libuv). The
 * loop closes the async handle only after it saw stopping under qmu, and
 * nobody calls uv_async_send once stopping is set, so the handle is always
 * open when it is signalled.
 */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "tcp_internal.h"

/* ---- The core's timer (AGENT-10) ----------------------------------------------- */

static void on_timer(uv_timer_t *h);

/* Starts the uv timer for deadline_ns (loop thread). */
static void timer_apply(tpi_tcp_agent *a, uint64_t deadline_ns) {
    if (deadline_ns == UINT64_MAX) {
        uv_timer_stop(&a->timer);
        return;
    }
    uint64_t now = tpi_tcp_now_ns();
    uint64_t ms = 0;
    if (deadline_ns > now)
        ms = tpi_tcp_ms_ceil(deadline_ns - now);
    uv_update_time(&a->loop);
    uv_timer_start(&a->timer, on_timer, ms, 0); /* 0 ms: the next loop turn, never inline */
}

static void on_timer(uv_timer_t *h) {
    tpi_tcp_agent *a = h->data;
    pthread_mutex_lock(&a->qmu);
    uint64_t deadline = a->timer_deadline_ns;
    int fire = 0;
    if (!a->stopping && deadline != UINT64_MAX) {
        if (tpi_tcp_now_ns() >= deadline) {
            a->timer_deadline_ns = UINT64_MAX; /* a re-arm from the upcall sets it again */
            fire = 1;
        }
    }
    pthread_mutex_unlock(&a->qmu);
    if (fire)
        tp_core_on_timer(a->core); /* no internal lock held (AGENT-2) */
    else if (deadline != UINT64_MAX && !atomic_load(&a->stop_flag))
        timer_apply(a, deadline); /* the loop's millisecond clock ran ahead of ours */
}

void tpi_tcp_timer_arm(tpi_tcp_agent *a, uint64_t deadline_ns) {
    pthread_mutex_lock(&a->qmu);
    if (!a->stopping) {
        a->timer_deadline_ns = deadline_ns;
        a->timer_dirty = 1;
        if (a->started)
            tpi_tcp_wake(a); /* before start, the loop applies it when it starts */
    }
    pthread_mutex_unlock(&a->qmu);
}

/* ---- send (AGENT-8) ------------------------------------------------------------- */

/* Drops the first n bytes of f (written already) by moving its segments;
 * the frame's destroy does not look at them. */
static void frame_skip(tp_frame *f, size_t n) {
    TPI_ASSERT(n < f->len);
    int i = 0;
    while (n >= f->seg[i].len) {
        n -= f->seg[i].len;
        f->len -= f->seg[i].len;
        i++;
    }
    f->seg[i].base = (const uint8_t *)f->seg[i].base + n;
    f->seg[i].len -= n;
    f->len -= n;
    memmove(&f->seg[0], &f->seg[i], (size_t)(f->nseg - i) * sizeof f->seg[0]);
    f->nseg -= i;
}

/*
 * TCP-15: writes f to the peer's socket from this thread (the grant taken,
 * the peer marked busy, qmu released). Returns 1 when all of it went;
 * otherwise what is left of f must go to the head of the queue for the
 * loop, which also meets any error.
 */
static int direct_write(int fd, tp_frame *f) {
    struct iovec iov[TP_FRAME_SEG_MAX];
    for (int i = 0; i < f->nseg; i++) {
        iov[i].iov_base = (void *)f->seg[i].base;
        iov[i].iov_len = f->seg[i].len;
    }
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = iov;
    mh.msg_iovlen = (size_t)f->nseg;
    ssize_t k;
    do
        k = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    if (k > 0 && (size_t)k == f->len)
        return 1;
    if (k > 0)
        frame_skip(f, (size_t)k);
    return 0;
}

tp_status tpi_tcp_send(tpi_tcp_agent *a, uint32_t dst, tp_frame *f) {
    TPI_ASSERT(f && f->nseg >= 1 && f->nseg <= TP_FRAME_SEG_MAX);
    TPI_ASSERT(f->len >= TP_FRAME_HEADER_SIZE && f->seg[0].len >= 1);
    tp_status st = TP_OK;
    pthread_mutex_lock(&a->qmu);
    if (a->stopping || !a->started) {
        st = TP_ESHUTDOWN;
    } else if (!a->have_peers || dst >= a->world_size || !a->peers[dst].addr[0]) {
        st = TP_EUNKNOWNWORKER;
    } else if (a->peers[dst].dead) {
        st = TP_EPEERDOWN;
    } else {
        tpi_tcp_peer *p = &a->peers[dst];
        TPI_ASSERT((p->q_head == NULL) == (p->q_tail == NULL)); /* the queue's ends agree */
        TPI_ASSERT(p->direct_fd < 0 || !p->direct_ring);        /* one grant at most */
        f->next = NULL;
        /* TCP-22: a frame for a slab is the loop's to copy there. */
        int shm = f->len >= a->shm_min && atomic_load_explicit(&p->shm_active, memory_order_relaxed);
        if (shm) {
            p->direct_fd = -1; /* the grant is spent: the loop grants again once this is out */
            p->direct_ring = NULL;
        }
        if (p->direct_fd >= 0 || p->direct_ring) {
            TPI_ASSERT(!p->q_head && !p->direct_busy);
            int fd = p->direct_fd;
            tpi_ring *ring = p->direct_ring; /* TCP-28: the connection's ring instead */
            p->direct_fd = -1; /* used up: the loop grants it again next turn */
            p->direct_ring = NULL;
            p->direct_busy = 1;
            uint32_t gen = p->grant_gen;
            pthread_mutex_unlock(&a->qmu);
            /* A frame the ring cannot take now (no room, or above its
             * largest record) goes whole to the loop. */
            int all = ring ? tpi_shm_ring_put(ring, f) == TPI_RING_OK : direct_write(fd, f);
            pthread_mutex_lock(&a->qmu);
            p->direct_busy = 0;
            int pending = p->direct_pending;
            p->direct_pending = 0;
            if (all && (pending || (ring && p->grant_gen == gen)) && !p->q_head && !a->stopping) {
                /* The loop's grant for this turn came while we wrote (it
                 * checked everything else): it is ours to restore. A ring's
                 * grant is kept unless the loop revoked it meanwhile: each
                 * frame is a record of its own, so the loop batches nothing,
                 * and the next sender need not wait for the loop's turn. */
                p->direct_fd = fd;
                p->direct_ring = ring;
            } else if (!p->regrant) {
                p->regrant = 1;
                uint32_t n = atomic_load_explicit(&a->nregrant, memory_order_relaxed);
                a->regrant[n] = dst;
                atomic_store_explicit(&a->nregrant, n + 1, memory_order_relaxed);
            }
            if (all) {
                pthread_mutex_unlock(&a->qmu);
                tp_frame_free(f);
                return TP_OK;
            }
            /* The rest (or an error) is the loop's, before anything queued
             * meanwhile by others (the loop waited for busy to clear). */
            atomic_fetch_add_explicit(&p->q_bytes, f->len, memory_order_relaxed);
            f->next = p->q_head;
            p->q_head = f;
            if (!p->q_tail)
                p->q_tail = f;
            tpi_tcp_mark_dirty(a, dst);
            if (!a->stopping) /* else stop drops the queues */
                tpi_tcp_wake(a);
            pthread_mutex_unlock(&a->qmu);
            return TP_OK;
        }
        if (p->q_tail)
            p->q_tail->next = f;
        else
            p->q_head = f;
        p->q_tail = f;
        atomic_fetch_add_explicit(&p->q_bytes, f->len, memory_order_relaxed);
        tpi_tcp_mark_dirty(a, dst);
        tpi_tcp_wake(a);
    }
    pthread_mutex_unlock(&a->qmu);
    return st;
}

/* Frames to this worker itself go round through the loop, in order (AGENT-8). */
static void deliver_loopback(tpi_tcp_agent *a) {
    tpi_tcp_peer *self = &a->peers[a->rank];
    pthread_mutex_lock(&a->qmu);
    tp_frame *f = self->q_head;
    self->q_head = self->q_tail = NULL;
    pthread_mutex_unlock(&a->qmu);
    while (f) {
        tp_frame *next = f->next;
        f->next = NULL;
        tp_frame *copy = atomic_load(&a->stop_flag) ? NULL : tp_frame_flatten(f);
        tp_frame_free(f);
        size_t len = 0;
        char err[TP_ERRMSG_LEN_MAX];
        if (copy &&
            tp_frame_check_header(tp_frame_bytes(copy), a->max_msg, &len, err, sizeof err) ==
                TP_OK &&
            len == copy->len)
            tp_core_on_frame(a->core, a->rank, copy);
        else
            tp_frame_free(copy); /* dropped: our own bytes, so only on exhaustion */
        f = next;
    }
}

/* After each poll: grant the direct writes used meanwhile (TCP-15). */
static void on_check(uv_check_t *h) {
    tpi_tcp_direct_regrant(h->data);
}

/* Before each poll that would sleep: TCP-29's spin on the rings read. */
static void on_spin(uv_prepare_t *h) {
    tpi_tcp_agent *a = h->data;
    int ms = uv_backend_timeout(&a->loop);
    if (ms != 0 && !atomic_load(&a->stop_flag))
        tpi_tcp_ring_spin(a, ms < 0 ? UINT64_MAX : (uint64_t)ms * 1000000u);
}

void tpi_tcp_mark_dirty(tpi_tcp_agent *a, uint32_t id) {
    TPI_ASSERT(id < a->world_size);
    tpi_tcp_peer *p = &a->peers[id];
    if (p->dirty)
        return;
    /* Each id at most once, so world_size entries always suffice. */
    TPI_ASSERT(a->ndirty < a->world_size);
    p->dirty = 1;
    a->dirty[a->ndirty++] = id;
}

void tpi_tcp_flush_dirty(tpi_tcp_agent *a) {
    pthread_mutex_lock(&a->qmu);
    if (a->stopping || a->ndirty == 0) {
        pthread_mutex_unlock(&a->qmu);
        return;
    }
    uint32_t n = a->ndirty;
    uint32_t *work = a->dirty;
    a->dirty = a->dirty_work; /* swap: senders fill the other array meanwhile */
    a->dirty_work = work;
    a->ndirty = 0;
    for (uint32_t i = 0; i < n; i++) {
        TPI_ASSERT(a->peers[work[i]].dirty); /* listed once, by tpi_tcp_mark_dirty */
        a->peers[work[i]].dirty = 0;
    }
    pthread_mutex_unlock(&a->qmu);
    for (uint32_t i = 0; i < n; i++) {
        if (work[i] == a->rank)
            deliver_loopback(a);
        else
            tpi_tcp_flush(a, work[i]);
    }
}

static void on_wake(uv_async_t *h) {
    tpi_tcp_agent *a = h->data;
    pthread_mutex_lock(&a->qmu);
    int stopping = a->stopping;
    int timer_dirty = a->timer_dirty;
    uint64_t deadline = a->timer_deadline_ns;
    a->timer_dirty = 0;
    pthread_mutex_unlock(&a->qmu);
    if (stopping) {
        /* Once: libuv calls an async handle's callback only while the handle
         * is in the loop's list, and closing it takes it out, so a wake-up
         * sent after this (a sender racing the stop) calls nothing. */
        TPI_ASSERT(!uv_is_closing((uv_handle_t *)&a->wake));
        uv_close((uv_handle_t *)&a->wake, NULL);
        uv_close((uv_handle_t *)&a->timer, NULL);
        uv_close((uv_handle_t *)&a->check, NULL);
        uv_close((uv_handle_t *)&a->spin, NULL);
        uv_close((uv_handle_t *)&a->rx_admit, NULL);
        uv_close((uv_handle_t *)&a->listener, NULL);
        tpi_tcp_close_all(a);
        return;
    }
    if (timer_dirty)
        timer_apply(a, deadline);
    tpi_tcp_flush_dirty(a);
    tpi_tcp_shm_tell_released(a);
}

/* ---- The thread and start (AGENT-3) ------------------------------------------------ */

static void *loop_main(void *arg) {
    tpi_tcp_agent *a = arg;
    tp_context_switch(a->ctx, NULL); /* upcalls act on this worker (AGENT-14) */
    pthread_mutex_lock(&a->qmu);
    int armed = a->timer_dirty && !a->stopping;
    uint64_t deadline = a->timer_deadline_ns;
    a->timer_dirty = 0;
    pthread_mutex_unlock(&a->qmu);
    if (armed)
        timer_apply(a, deadline);
    uv_run(&a->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* Closes the handles of a loop that never ran and releases the loop. */
static void loop_abandon(tpi_tcp_agent *a) {
    uv_close((uv_handle_t *)&a->wake, NULL);
    uv_close((uv_handle_t *)&a->timer, NULL);
    uv_close((uv_handle_t *)&a->check, NULL);
    uv_close((uv_handle_t *)&a->spin, NULL);
    uv_close((uv_handle_t *)&a->rx_admit, NULL);
    uv_close((uv_handle_t *)&a->listener, NULL);
    uv_run(&a->loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&a->loop);
    TPI_ASSERT(rc == 0);
    a->loop_inited = 0;
}

tp_status tpi_tcp_loop_start(tpi_tcp_agent *a, char *errmsg, size_t errmsg_len) {
    char where[TPI_ADDR_LEN_MAX + 8];
    tpi_tcp_format_hostport(a->listen_host, a->listen_port, where, sizeof where);
    struct sockaddr_storage sa;
    socklen_t sa_len = 0;
    char err[TP_ERRMSG_LEN_MAX];
    tp_status st = tpi_tcp_resolve(a->listen_host, a->listen_port, &sa, &sa_len, err, sizeof err);
    if (st != TP_OK) {
        tpi_format(errmsg, errmsg_len, "listen_addr %s: %s", where, err);
        return st;
    }
    int rc = uv_loop_init(&a->loop);
    if (rc < 0) {
        tpi_format(errmsg, errmsg_len, "cannot start an event loop: %s", uv_strerror(rc));
        return tpi_uv_status(rc, TP_EBACKEND);
    }
    a->loop_inited = 1;
    a->loop.data = a;
    uv_async_init(&a->loop, &a->wake, on_wake);
    a->wake.data = a;
    uv_timer_init(&a->loop, &a->timer);
    a->timer.data = a;
    uv_check_init(&a->loop, &a->check);
    a->check.data = a;
    uv_check_start(&a->check, on_check);
    uv_unref((uv_handle_t *)&a->check); /* never what keeps the loop running */
    uv_prepare_init(&a->loop, &a->spin);
    a->spin.data = a;
    if (a->spin_ns > 0)
        uv_prepare_start(&a->spin, on_spin);
    uv_unref((uv_handle_t *)&a->spin);
    uv_idle_init(&a->loop, &a->rx_admit); /* started by a release of the read budget */
    a->rx_admit.data = a;
    uv_tcp_init(&a->loop, &a->listener);
    a->listener.data = a;
    rc = uv_tcp_bind(&a->listener, (const struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&a->listener, TPI_TCP_BACKLOG, tpi_tcp_on_accept);
    struct sockaddr_storage bound;
    int bound_len = sizeof bound;
    if (rc == 0)
        rc = uv_tcp_getsockname(&a->listener, (struct sockaddr *)&bound, &bound_len);
    if (rc < 0) {
        tpi_format(errmsg, errmsg_len, "cannot listen on %s (listen_addr, listen_port): %s", where,
                   uv_strerror(rc));
        loop_abandon(a);
        return tpi_uv_status(rc, TP_EBACKEND);
    }
    uint16_t port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                      : ((struct sockaddr_in *)&bound)->sin_port);
    tpi_tcp_format_hostport(a->advertise_host, port, a->self_addr, sizeof a->self_addr);
    a->started = 1; /* before the thread: send may be called as soon as start returns */
    if (tpi_tcp_thread_create(&a->loop_thread, loop_main, a) != 0) {
        a->started = 0;
        tpi_format(errmsg, errmsg_len, "cannot start the event loop thread");
        loop_abandon(a);
        return TP_ENOMEM;
    }
    return TP_OK;
}

/* ---- stop (AGENT-5) ------------------------------------------------------------ */

void tpi_tcp_loop_stop(tpi_tcp_agent *a) {
    if (!a->started)
        return;
    /* The agent set stopping and woke the loop under qmu; the loop now
     * closes every handle, and uv_run returns when the last one is closed. */
    pthread_join(a->loop_thread, NULL);
    int rc = uv_loop_close(&a->loop);
    TPI_ASSERT(rc == 0 && "a libuv handle outlived stop");
    a->loop_inited = 0;
    pthread_mutex_lock(&a->qmu);
    a->started = 0;
    pthread_mutex_unlock(&a->qmu);
}

void tpi_tcp_drop_queues(tpi_tcp_agent *a) {
    pthread_mutex_lock(&a->qmu);
    for (uint32_t i = 0; i < a->world_size; i++) {
        tp_frame *f = a->peers[i].q_head;
        a->peers[i].q_head = a->peers[i].q_tail = NULL;
        a->peers[i].dirty = 0;
        pthread_mutex_unlock(&a->qmu);
        while (f) {
            tp_frame *next = f->next;
            tp_frame_free(f);
            f = next;
        }
        pthread_mutex_lock(&a->qmu);
    }
    a->ndirty = 0;
    pthread_mutex_unlock(&a->qmu);
}
