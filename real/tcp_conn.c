/*
 * tcp_conn.c: connections of a TCP agent, on its loop thread (spec/tcp.md
 * TCP-1..8).
 *
 * Each worker dials its own outgoing connection to a peer on first send and
 * writes frames only there; connections it accepts are read-only for
 * frames. An outgoing connection carries: our hello, then frames (and PING);
 * back come the acceptor's hello and control records (PONG, BYE, ABORT). An
 * accepted one carries the dialer's hello, then frames and control records
 * (PING, BYE, ABORT); back go our hello and PONGs.
 *
 * Failure (TCP-6, TCP-7): an outgoing connection that ends (EOF, reset,
 * refused) without an ABORT record means the process behind the address is
 * gone: peer-down TP_EPEERDOWN, the peer is dead for later sends. An
 * accepted connection is only a claim of who is on the other end, so when
 * it ends the peer is probed through our own outgoing connection: a dead
 * process fails that one too (TP_EPEERDOWN), a live one answers (TP_EIO:
 * frames on the broken connection may be lost, later ones travel on a new
 * one). A malformed record or frame closes that one connection with an
 * ABORT record, frees what it held and raises TP_EIO for the peer it claimed
 * to be; the worker goes on serving everyone else.
 *
 * Reading: records and small bodies go through the agent's 64 KiB staging
 * buffer (one read often holds many frames); once a header is checked with
 * tp_frame_check_header its frame is allocated, and a body with at least
 * TPI_TCP_DIRECT_MIN bytes still to come is read straight into the frame.
 * Writing: every frame queued for a peer since the last loop turn goes out in
 * one write whose buffers are the frames' own segments (no copy): at once with
 * uv_try_write when libuv has nothing queued on the connection (the frames are
 * freed right away), else (or for what did not fit) in one uv_write whose
 * frames are freed when it completes or is cancelled.
 *
 * Encryption (TCP-21, encrypt=on): once the handshake is done each
 * direction of the stream is a sequence of sealed records (tcp_crypt.c)
 * whose plaintexts, end to end, are exactly the plaintext stream above; so
 * everything that parses and bounds frames and records is unchanged, it is
 * only fed opened plaintext. Reading: sealed bytes go into the connection's
 * own buffer (c->sealed); each whole record is opened, straight into the
 * frame being read when it falls in its body, else into the staging buffer,
 * and a record that does not open is a protocol error. Writing: frames and
 * control records join the connection's plaintext queue, in order; the loop
 * seals it a chunk at a time into one of two buffers the connection keeps
 * (the copy encryption needs) and seals the next chunk as the socket takes
 * one. Senders never write directly (TCP-15): records are numbered, so only
 * the loop seals and writes.
 */
#include <errno.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_internal.h"

#define NO_PEER UINT32_MAX

typedef enum conn_state {
    CONN_HELLO = 1,      /* waiting for the other end's hello */
    CONN_OPEN = 2,       /* identified: frames and control records flow */
    CONN_ABORTING = 3,   /* ABORT queued; once written, our end half-closes and we drain
                            what still comes until the other end's (TCP-6) */
    CONN_CLOSED = 4,     /* handles closing; freed by the last close callback */
    CONN_AUTH_NONCE = 5, /* hello done; waiting for the other end's nonce (TCP-17) */
    CONN_AUTH_PROOF = 6, /* waiting for the other end's proof; nothing else is read */
    CONN_CLOSING = 7,    /* outgoing, asked to close as idle: CLOSE sent, waiting for the end */
    CONN_REFUSING = 8    /* accepted, its encrypt differs: our ACCEPT tells it so; waiting for
                            its end (TCP-21) */
} conn_state;

struct tpi_tcp_conn {
    uv_tcp_t tcp; /* data: the conn */
    uv_timer_t timer;
    uv_connect_t connect_req;
    uv_shutdown_t shutdown_req; /* CONN_ABORTING: the half-close behind ABORT */
    tpi_tcp_agent *a;
    tpi_tcp_conn *prev, *next; /* a->conns */
    int outgoing;
    int opened;    /* outgoing: the other end answered our hello (and proved itself) */
    int connected; /* outgoing: its kernel completed the TCP handshake (TCP-25's answer) */
    uint32_t peer; /* NO_PEER until an accepted connection's hello (and proof, TCP-17) */
    uint32_t claimed; /* accepted: the id its hello claims, before its proof */
    unsigned gen;  /* the peer's generation it belongs to (AGENT-16) */
    conn_state state;
    int handles; /* open libuv handles */
    int got_bye, got_abort;
    char addr[TPI_ADDR_LEN_MAX]; /* the other end, for messages */
    uint8_t hello_out[TPI_TCP_RECORD_SIZE];
    uint8_t auth_out[2][TPI_TCP_RECORD_SIZE]; /* our nonce and proof records (TCP-17) */
    uint8_t nonce_mine[TPI_TCP_NONCE_SIZE], nonce_peer[TPI_TCP_NONCE_SIZE];
    uint8_t rec[TPI_TCP_RECORD_SIZE]; /* a record or frame header being read */
    size_t rec_got;
    tp_frame *rx; /* a frame being read */
    uint8_t *rx_bytes;
    size_t rx_len, rx_got;
    /* TCP-19: accepted connections' bounds. Times are the loop's ms clock. */
    int counted;              /* counted in a->nhandshakes until identified */
    uint64_t rx_counted;      /* bytes of rx counted in a->rx_pending */
    uint64_t rx_deadline_ms;  /* rx must be whole by then */
    uint64_t active_ms;       /* the last read */
    uint64_t idle_asked_ms;   /* when we sent IDLE; 0 before */
    uint64_t timer_due_ms;    /* when the timer fires; UINT64_MAX when stopped */
    int waiting;              /* its frame header waits for the read budget; not read */
    size_t wait_len;          /* that frame's length */
    tpi_tcp_conn *wait_next;  /* a->rx_wait_head's list */
    uint8_t *stash;           /* bytes read after that header */
    size_t stash_len;
    /* TCP-21: the sealed stream, each direction on from its switch. */
    int tx_sealed, rx_sealed;
    tpi_tcp_cipher tx, rx_seal;
    uint8_t *sealed; /* TPI_TCP_SEAL_BUF bytes read, not yet opened */
    size_t sealed_len;
    tp_frame *txq_head, *txq_tail; /* plaintext to seal, in order: frames and records */
    size_t txq_off;                /* bytes of txq_head sealed already */
    uint64_t txq_bytes;            /* of the frames in txq (AGENT-18) */
    struct {
        uint8_t *p;
        size_t cap;
        int busy; /* in a uv_write */
    } out[2];     /* sealed chunks, kept for the connection's life */
    int tx_pumping, tx_failed, tx_close_after;
    /* TCP-22, shared memory. Outgoing: SHM_NONE, OFFERED (the probe open
     * until the answer) or ACTIVE (large frames go through slabs, released
     * on this connection; session names them). Accepted: shm_rx once its
     * offer held. */
    int shm;
    int shm_offered; /* accepted: an OFFER came (a second one is a protocol error) */
    int shm_probe;
    uint64_t shm_session;
    tpi_shm_rx *shm_rx;
    /* TCP-28, the ring. Outgoing: offered with the probe, in use from a yes
     * with a ring (frames go there; ring_head..tail wait for its room, in
     * order, ring_bytes of them). Accepted: taken with the offer, read from
     * the RING record on; ring_marks counts STREAM markers read whose frame
     * the stream has not brought yet (the ring waits for it, AGENT-8). */
    tpi_shm_link *link;
    int ring_on;
    uv_poll_t bell; /* polls link->wait_fd while ring_on (one of c->handles) */
    int bell_on;
    uint32_t ring_marks;
    tp_frame *ring_head, *ring_tail;
    uint64_t ring_bytes;
    /* TCP-30. Accepted: rd_out while the loop published this ring for a
     * task waiting for a reply (peer's rd_conn); rd_revoke asks the task
     * holding it to give it back; rd_count counts the frames tasks read,
     * activity for the idle timeout (rd_seen: as last looked at). */
    int rd_out;
    atomic_int rd_revoke;
    atomic_uint rd_count;
    unsigned rd_seen;
};

enum { SHM_NONE = 0, SHM_OFFERED = 1, SHM_ACTIVE = 2 };

typedef struct conn_write {
    uv_write_t req;
    tpi_tcp_conn *c;
    tp_frame *frames; /* freed when the write completes */
    int chunk;        /* TCP-21: which of c->out it writes, or -1 */
    int close_after;  /* an ABORT record: close once written */
    unsigned nbufs;
    uv_buf_t bufs[];
} conn_write;

static void conn_close(tpi_tcp_conn *c);
/* A connection still being read: in its handshake or open. */
static int reading(const tpi_tcp_conn *c) {
    return c->state == CONN_HELLO || c->state == CONN_OPEN || c->state == CONN_AUTH_NONCE ||
           c->state == CONN_AUTH_PROOF;
}
static void out_fail(tpi_tcp_conn *c, tp_status why, const char *detail);
static void out_broke(tpi_tcp_conn *c, int uverr, const char *detail);
static void on_conn_timer(uv_timer_t *h);
static void abort_or_close(tpi_tcp_conn *c, int status);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void in_frame_start(tpi_tcp_conn *c, size_t len);
static void closing_done(tpi_tcp_conn *c);
static void tx_enqueue(tpi_tcp_conn *c, tp_frame *f);
static void tx_pump(tpi_tcp_conn *c);
static void silent_end(tpi_tcp_peer *p);
static void reply_publish(tpi_tcp_conn *c);
static void reply_revoke(tpi_tcp_conn *c);
static void reply_revoke_peer(tpi_tcp_agent *a, uint32_t id);

/* ---- Upcalls (AGENT-2): loop thread, no internal lock held ------------------------ */

static void upcall_down(tpi_tcp_agent *a, uint32_t peer, tp_status why, const char *msg) {
    if (atomic_load(&a->stop_flag))
        return; /* AGENT-5: no upcall once stop began */
    tp_core_on_peer_down(a->core, peer, why, msg);
}

static void free_frames(tp_frame *f) {
    while (f) {
        tp_frame *next = f->next;
        tp_frame_free(f);
        f = next;
    }
}

/* ---- Direct writes (TCP-15) -------------------------------------------------------- */

/*
 * A thread that sends a frame while this loop has nothing of ours queued on
 * the peer's outgoing socket may write it there itself (tcp_loop.c): that
 * saves the hand-off to the loop, a wake-up and a context switch per message.
 * Bytes never overtake ours: the grant (direct_fd >= 0, under qmu) exists
 * only while our queue and libuv's write queue on the socket are empty. A
 * sender takes it under qmu and marks the peer busy, writes without qmu (so
 * the loop and other senders are not held up by its system call), and clears
 * busy under qmu after queueing, first, whatever did not fit. Before the loop
 * writes to the socket, takes its queue or closes it, it revokes the grant
 * and waits out a busy sender (tpi_tcp_direct_stop_locked): one non-blocking
 * sendmsg. A sender uses the grant up; the loop grants it again once per turn
 * (tpi_tcp_direct_regrant), so a burst of sends still goes out in one
 * vectored write by the loop.
 */
void tpi_tcp_direct_grant(tpi_tcp_agent *a, uint32_t id) {
    if (a->encrypt)
        return; /* TCP-21: records are numbered; only the loop seals and writes */
    tpi_tcp_peer *p = &a->peers[id];
    tpi_tcp_conn *c = p->out;
    uv_os_fd_t fd;
    /* TCP-22: none while the shared memory offer waits for its answer: a
     * direct write cut short leaves the rest of a frame queued, which must
     * go on the stream as it began, never into a slab once the answer is yes. */
    if (!c || c->state != CONN_OPEN || c->shm == SHM_OFFERED)
        return;
    /* TCP-28: into the ring while no frame waits for its room (the stream's
     * queue does not matter: a frame there has its marker in the ring). */
    if (c->ring_on ? c->ring_head != NULL
                   : uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) != 0 ||
                         uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
        return;
    pthread_mutex_lock(&a->qmu);
    TPI_ASSERT(p->direct_fd < 0 || !p->direct_ring); /* one grant or the other */
    if (p->direct_busy) {
        p->direct_pending = 1; /* the writer grants it when done, if all went out */
    } else if (!p->q_head && !p->dead && !a->stopping) {
        if (c->ring_on)
            p->direct_ring = &c->link->ring;
        else
            p->direct_fd = fd;
    }
    pthread_mutex_unlock(&a->qmu);
}

void tpi_tcp_direct_stop_locked(tpi_tcp_agent *a, tpi_tcp_peer *p) {
    p->direct_fd = -1;
    p->direct_ring = NULL;
    p->direct_pending = 0;
    p->grant_gen++;
    while (p->direct_busy) {
        pthread_mutex_unlock(&a->qmu);
        sched_yield(); /* the writer is between two qmu sections: one sendmsg */
        pthread_mutex_lock(&a->qmu);
    }
}

/* Drops every frame queued for peer id and any direct grant (AGENT-8: in
 * order or not at all; AGENT-18: nothing is held for it then), marking it
 * dead first when dead is set (send fails at once from then on). 1 when
 * this call made it dead. */
static int queue_drop(tpi_tcp_agent *a, uint32_t id, int dead) {
    tpi_tcp_peer *p = &a->peers[id];
    int newly_dead = 0;
    pthread_mutex_lock(&a->qmu);
    if (dead && !p->dead) {
        p->dead = 1;
        newly_dead = 1;
    }
    tpi_tcp_direct_stop_locked(a, p); /* a direct write's rest joins the queue dropped here */
    tp_frame *dropped = p->q_head;
    p->q_head = p->q_tail = NULL;
    atomic_store(&p->q_bytes, 0);
    pthread_mutex_unlock(&a->qmu);
    free_frames(dropped);
    tpi_tcp_unsent_update(a, id);
    return newly_dead;
}

static void direct_revoke(tpi_tcp_agent *a, uint32_t id) {
    pthread_mutex_lock(&a->qmu);
    tpi_tcp_direct_stop_locked(a, &a->peers[id]);
    pthread_mutex_unlock(&a->qmu);
}

void tpi_tcp_direct_regrant(tpi_tcp_agent *a) {
    /* Most loop turns have nothing to grant: no lock then, as a sender may be
     * holding qmu through its write. */
    while (atomic_load_explicit(&a->nregrant, memory_order_relaxed) > 0) {
        uint32_t ids[64];
        uint32_t n = 0;
        pthread_mutex_lock(&a->qmu);
        uint32_t left = atomic_load_explicit(&a->nregrant, memory_order_relaxed);
        while (left > 0 && n < 64) {
            uint32_t id = a->regrant[--left];
            a->peers[id].regrant = 0;
            ids[n++] = id;
        }
        atomic_store_explicit(&a->nregrant, left, memory_order_relaxed);
        pthread_mutex_unlock(&a->qmu);
        for (uint32_t i = 0; i < n; i++)
            tpi_tcp_direct_grant(a, ids[i]);
    }
}

/* ---- Life of a connection ------------------------------------------------------- */

tpi_tcp_keepalive tpi_tcp_keepalive_default(void) {
    return (tpi_tcp_keepalive){.idle_s = TPI_TCP_KEEPALIVE_S,
                               .intvl_s = TPI_TCP_KEEPALIVE_INTVL_S,
                               .cnt = TPI_TCP_KEEPALIVE_CNT,
                               .user_timeout_ms = TPI_TCP_USER_TIMEOUT_MS};
}

/* TCP-23. Set on the socket itself, not with uv_tcp_keepalive, so that the
 * store's sockets, which are not libuv handles, get the same: and libuv's
 * own keepalive interval and count (1 s, 10 since libuv 1.48) never apply. */
void tpi_tcp_keepalive_apply(int fd, const tpi_tcp_keepalive *ka) {
    TPI_ASSERT(fd >= 0 && ka);
    TPI_ASSERT(ka->idle_s >= 1 && ka->intvl_s >= 1 && ka->cnt >= 1);
    int on = 1, idle = (int)ka->idle_s, intvl = (int)ka->intvl_s, cnt = (int)ka->cnt;
    unsigned user_timeout = ka->user_timeout_ms;
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

/* TCP_NODELAY, and the keepalive and user timeout that find a silently
 * vanished host (TCP-23). Best effort: a socket that refuses an option still
 * works, with the kernel's default for it. */
static void socket_tune(tpi_tcp_conn *c) {
    uv_tcp_nodelay(&c->tcp, 1);
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
        return;
    tpi_tcp_keepalive_apply(fd, &c->a->keepalive);
}

static void on_close(uv_handle_t *h) {
    tpi_tcp_conn *c = h->data;
    if (--c->handles > 0)
        return;
    tpi_tcp_agent *a = c->a;
    if (c->prev)
        c->prev->next = c->next;
    else
        a->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    tp_frame_free(c->rx);
    free(c->stash);
    free(c->sealed);
    free_frames(c->txq_head);
    free_frames(c->ring_head);
    tpi_shm_link_free(c->link); /* its bell's poll is closed: the descriptors may go */
    free(c->out[0].p);
    free(c->out[1].p);
    tpi_tcp_seal_clear(&c->tx);
    tpi_tcp_seal_clear(&c->rx_seal);
    free(c);
}

static tpi_tcp_conn *conn_new(tpi_tcp_agent *a, int outgoing, uint32_t peer) {
    tpi_tcp_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->a = a;
    c->outgoing = outgoing;
    c->peer = peer;
    c->claimed = NO_PEER;
    c->state = CONN_HELLO;
    c->timer_due_ms = UINT64_MAX;
    c->shm_probe = -1;
    uv_tcp_init(&a->loop, &c->tcp);
    uv_timer_init(&a->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->connect_req.data = c;
    c->handles = 2;
    c->next = a->conns;
    if (a->conns)
        a->conns->prev = c;
    a->conns = c;
    return c;
}

static void rx_release(tpi_tcp_conn *c);
static void wait_remove(tpi_tcp_conn *c);

/* TCP-22: the connection ends, and shared memory over it: the dialer gives
 * up the slabs the other end can no longer release, the acceptor's frames
 * still out release silently. */
static void shm_end(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    if (c->shm_probe >= 0) {
        tpi_shm_close_untracked(c->shm_probe);
        c->shm_probe = -1;
    }
    if (c->shm == SHM_ACTIVE) {
        if (a->peers[c->peer].out == c || !a->peers[c->peer].out)
            atomic_store(&a->peers[c->peer].shm_active, 0);
        tpi_shm_session_end(a, c->peer, c->shm_session);
    }
    c->shm = SHM_NONE;
    tpi_shm_rx_detach(c->shm_rx);
    c->shm_rx = NULL;
}

static void conn_close(tpi_tcp_conn *c) {
    if (c->state == CONN_CLOSED)
        return;
    rx_release(c); /* the frame itself is freed with c */
    wait_remove(c);
    if (c->counted) {
        c->counted = 0;
        c->a->nhandshakes--;
    }
    if (c->outgoing && c->peer < c->a->world_size)
        direct_revoke(c->a, c->peer); /* before the socket closes */
    reply_revoke(c);                  /* before the ring goes */
    shm_end(c);
    c->state = CONN_CLOSED;
    /* Closing the stream cancels its writes (their callbacks free the
     * frames) and a pending connect, before the close callback runs. */
    uv_close((uv_handle_t *)&c->timer, on_close);
    uv_close((uv_handle_t *)&c->tcp, on_close);
    if (c->bell_on)
        uv_close((uv_handle_t *)&c->bell, on_close);
}

static void on_write(uv_write_t *req, int status) {
    conn_write *w = (conn_write *)req;
    tpi_tcp_conn *c = w->c;
    int close_after = w->close_after, chunk = w->chunk;
    free_frames(w->frames);
    free(w);
    if (c->state == CONN_CLOSED)
        return;
    if (c->outgoing && c->a->peers[c->peer].out == c)
        tpi_tcp_unsent_update(c->a, c->peer); /* AGENT-18: bytes went out */
    if (close_after || (status < 0 && c->state == CONN_ABORTING)) {
        abort_or_close(c, status);
        return;
    }
    if (status < 0) {
        if (c->state == CONN_CLOSING)
            closing_done(c);
        else if (c->outgoing)
            out_broke(c, status, uv_strerror(status));
        else
            conn_close(c); /* an accepted connection only carries our records */
        return;
    }
    if (chunk >= 0) {
        c->out[chunk].busy = 0;
        tx_pump(c); /* the next chunk, or the close that waited for this one */
        return;
    }
    if (c->outgoing && c->a->peers[c->peer].out == c)
        tpi_tcp_direct_grant(c->a, c->peer);
}

size_t tpi_tcp_conn_write_size(unsigned nbufs) {
    return sizeof(conn_write) + nbufs * sizeof(uv_buf_t);
}

size_t tpi_tcp_conn_size(void) {
    return sizeof(tpi_tcp_conn);
}

/* Queues bufs in one uv_write; frames (may be NULL) are freed when it
 * completes; chunk is the sealed buffer it writes (TCP-21), or -1. 0, or a
 * libuv error with the frames already freed. */
static int conn_write_bufs(tpi_tcp_conn *c, const uv_buf_t *bufs, unsigned n, tp_frame *frames,
                           int chunk, int close_after) {
    conn_write *w = malloc(sizeof *w + n * sizeof w->bufs[0]);
    if (!w) {
        free_frames(frames);
        return UV_ENOMEM;
    }
    w->c = c;
    w->frames = frames;
    w->chunk = chunk;
    w->close_after = close_after;
    w->nbufs = n;
    memcpy(w->bufs, bufs, n * sizeof bufs[0]);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, w->bufs, n, on_write);
    if (rc < 0) {
        free_frames(frames);
        free(w);
    }
    return rc;
}

/* A 24-byte record sealed into out (TCP-21); 0 or -1. */
static int seal_record(tpi_tcp_conn *c, const uint8_t *rec,
                       uint8_t out[TPI_TCP_RECORD_SIZE + TPI_TCP_SEAL_OVERHEAD]) {
    struct iovec v = {(void *)rec, TPI_TCP_RECORD_SIZE};
    return tpi_tcp_seal(&c->tx, &v, 1, TPI_TCP_RECORD_SIZE, out);
}

static int conn_write_record(tpi_tcp_conn *c, const uint8_t *rec, int close_after) {
    if (c->tx_sealed) { /* behind the frames queued before it (TCP-21) */
        tp_frame *f = c->tx_failed ? NULL : tp_frame_alloc(TPI_TCP_RECORD_SIZE);
        if (!f)
            return c->tx_failed ? UV_EIO : UV_ENOMEM;
        memcpy(tp_frame_bytes(f), rec, TPI_TCP_RECORD_SIZE);
        tx_enqueue(c, f);
        c->tx_close_after |= close_after;
        tx_pump(c);
        return c->state == CONN_CLOSED ? UV_EIO : 0;
    }
    uv_buf_t b = uv_buf_init((char *)rec, TPI_TCP_RECORD_SIZE);
    return conn_write_bufs(c, &b, 1, NULL, -1, close_after);
}

/* n records from recs, written from a frame of their own (no lifetime to
 * keep); 0 or a libuv error. Not on a sealed stream (TCP-22 is off there). */
static int conn_write_records(tpi_tcp_conn *c, const uint8_t *recs, size_t n) {
    TPI_ASSERT(!c->tx_sealed && n > 0);
    tp_frame *f = tp_frame_alloc(n * TPI_TCP_RECORD_SIZE);
    if (!f)
        return UV_ENOMEM;
    memcpy(tp_frame_bytes(f), recs, n * TPI_TCP_RECORD_SIZE);
    uv_buf_t b = uv_buf_init((char *)tp_frame_bytes(f), (unsigned)f->len);
    return conn_write_bufs(c, &b, 1, f, -1, 0);
}

/* Ends a connection after an error of ours to report: send ABORT so the
 * other end knows this process lives on, then half-close and read on,
 * dropping what comes, until the other end closes too (or the linger runs
 * out). Closing at once would reset the connection whenever unread bytes
 * were left, and a reset may overtake the ABORT in the other end's kernel
 * (its write fails with EPIPE before it reads ABORT): taken for our death. */
static void conn_abort(tpi_tcp_conn *c) {
    if (c->state == CONN_CLOSED || c->state == CONN_ABORTING)
        return;
    if (c->outgoing)
        direct_revoke(c->a, c->peer); /* the ABORT record goes first */
    reply_revoke(c);                  /* nothing more of it is handed on */
    c->state = CONN_ABORTING;
    if (conn_write_record(c, c->a->rec_abort, 1) < 0) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_conn_timer, TPI_TCP_ABORT_LINGER_MS, 0);
}

static void on_abort_shutdown(uv_shutdown_t *req, int status) {
    tpi_tcp_conn *c = req->data;
    if (status < 0 && c->state == CONN_ABORTING)
        conn_close(c);
}

/* The last write a close waited for is out (status: its result): an
 * aborting connection half-closes and drains, any other closes. */
static void abort_or_close(tpi_tcp_conn *c, int status) {
    if (c->state != CONN_ABORTING || status < 0) {
        conn_close(c);
        return;
    }
    c->shutdown_req.data = c;
    if (uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, on_abort_shutdown) != 0)
        conn_close(c);
}

/* ---- Bounds against any peer (TCP-19) ----------------------------------------------- */

/* The frame being read no longer counts against the read budget: headers
 * waiting for it are admitted on the loop's next turn. */
static void rx_release(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    if (c->rx_counted == 0)
        return;
    TPI_ASSERT(a->rx_pending >= c->rx_counted);
    a->rx_pending -= c->rx_counted;
    c->rx_counted = 0;
    if (a->rx_wait_head && !atomic_load(&a->stop_flag))
        uv_idle_start(&a->rx_admit, tpi_tcp_on_rx_admit);
}

static void wait_remove(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    if (!c->waiting)
        return;
    c->waiting = 0;
    tpi_tcp_conn **pp = &a->rx_wait_head, *prev = NULL;
    while (*pp && *pp != c) {
        prev = *pp;
        pp = &(*pp)->wait_next;
    }
    TPI_ASSERT(*pp == c);
    *pp = c->wait_next;
    if (a->rx_wait_tail == c)
        a->rx_wait_tail = prev;
    c->wait_next = NULL;
}

/* How long a dialer asked to close an idle connection has to do it. */
static uint32_t idle_grace_ms(const tpi_tcp_agent *a) {
    return a->idle_ms < TPI_TCP_IDLE_GRACE_MS ? a->idle_ms : TPI_TCP_IDLE_GRACE_MS;
}

static void conn_timer_at(tpi_tcp_conn *c, uint64_t due_ms) {
    c->timer_due_ms = due_ms;
    if (due_ms == UINT64_MAX) {
        uv_timer_stop(&c->timer);
        return;
    }
    uint64_t now = uv_now(&c->a->loop);
    uv_timer_start(&c->timer, on_conn_timer, due_ms > now ? due_ms - now : 0, 0);
}

/* An open accepted connection's next deadline: its frame's, the grace of an
 * IDLE we sent, or its idle time's end. */
static uint64_t in_next_due(const tpi_tcp_conn *c) {
    if (c->waiting)
        return UINT64_MAX; /* unread by our choice: no deadline runs */
    if (c->rx)
        return c->rx_deadline_ms;
    if (c->idle_asked_ms)
        return c->idle_asked_ms + idle_grace_ms(c->a);
    return c->active_ms + c->a->idle_ms;
}

/* ---- Verdicts on a peer (TCP-6, TCP-7) -------------------------------------------- */

/* A connection of an incarnation the peer has since replaced (AGENT-16):
 * whatever happens to it says nothing about the peer as it is now. */
static int stale(const tpi_tcp_conn *c) {
    return c->peer < c->a->world_size &&
           c->gen != atomic_load_explicit(&c->a->peers[c->peer].gen, memory_order_relaxed);
}

/* Applies a restart's new address before the loop next dials or writes
 * (loop thread): the old connection closes quietly and its queue was
 * dropped by set_peer. */
static void apply_readdress(tpi_tcp_agent *a, uint32_t id) {
    tpi_tcp_peer *p = &a->peers[id];
    pthread_mutex_lock(&a->qmu);
    if (!p->readdress) {
        pthread_mutex_unlock(&a->qmu);
        return;
    }
    p->readdress = 0;
    tpi_tcp_direct_stop_locked(a, p); /* no sender writes to the old socket any more */
    memcpy(p->addr, p->next_addr, sizeof p->addr);
    p->sa = p->next_sa;
    tpi_tcp_conn *old = p->out;
    p->out = NULL;
    pthread_mutex_unlock(&a->qmu);
    p->suspect = 0;
    p->dial_fail_since_ns = 0; /* a new address: a new retry window (TCP-20) */
    silent_end(p);             /* and a new process to hear from (TCP-25) */
    if (p->redial_pending) {
        uv_timer_stop(&p->redial);
        p->redial_pending = 0;
    }
    if (old)
        conn_close(old);
}

/*
 * The outgoing connection c failed: why is TP_EPEERDOWN when the process
 * behind the address is gone, TP_EIO when it may live. Frames still queued
 * for the peer are lost with the connection (AGENT-8).
 */
static void out_fail(tpi_tcp_conn *c, tp_status why, const char *detail) {
    tpi_tcp_agent *a = c->a;
    TPI_ASSERT(c->outgoing && c->peer < a->world_size);
    if (c->state == CONN_CLOSED || c->state == CONN_ABORTING)
        return;
    if (stale(c)) {
        conn_close(c); /* the peer restarted since: not a verdict on it */
        return;
    }
    uint32_t id = c->peer;
    tpi_tcp_peer *p = &a->peers[id];
    if (p->out == c)
        p->out = NULL;
    p->suspect = 0; /* this is the verdict of any probe */
    int newly_dead = queue_drop(a, id, why == TP_EPEERDOWN);
    char msg[TP_ERRMSG_LEN_MAX];
    tpi_format(msg, sizeof msg, "%s: %s", c->addr, detail);
    if (why == TP_EIO && c->state == CONN_OPEN)
        conn_abort(c);
    else
        conn_close(c);
    if (why == TP_EPEERDOWN) {
        if (newly_dead)
            upcall_down(a, id, TP_EPEERDOWN, msg);
    } else if (!p->dead) {
        upcall_down(a, id, TP_EIO, msg);
    }
}

/* ---- Silent peers declared down (TCP-25) --------------------------------------- */

static tpi_tcp_conn *dial(tpi_tcp_agent *a, uint32_t id);
static void on_silent_timer(uv_timer_t *h);

/* Peer id gave no answer where one was due: a connection of ours to it
 * ended in silence (TCP-23) or a dial timed out. Starts its silence, unless
 * one runs, and the timer that dials it every TPI_TCP_SILENT_DIAL_MS and
 * declares it down at peer_down_timeout. */
static void silent_begin(tpi_tcp_agent *a, uint32_t id, const char *detail) {
    tpi_tcp_peer *p = &a->peers[id];
    if (a->peer_down_ms == 0 || p->dead || p->silent_since_ms != 0 ||
        atomic_load(&a->stop_flag))
        return;
    p->silent_since_ms = uv_now(&a->loop);
    if (p->silent_since_ms == 0)
        p->silent_since_ms = 1; /* 0 means not silent */
    reply_revoke_peer(a, id);   /* its replies reach the loop, which ends the silence */
    tpi_format(p->silent_detail, sizeof p->silent_detail, "%s", detail);
    if (!p->silent_inited) {
        uv_timer_init(&a->loop, &p->silent_timer);
        p->silent_timer.data = a;
        p->silent_inited = 1;
    }
    uv_timer_start(&p->silent_timer, on_silent_timer, TPI_TCP_SILENT_DIAL_MS,
                   TPI_TCP_SILENT_DIAL_MS);
}

/* The peer answered: its kernel completed a dial of ours, or a connection
 * it dialed proved itself or brought a frame. A live host is never declared
 * down, however long its process takes. */
static void silent_end(tpi_tcp_peer *p) {
    if (p->silent_since_ms == 0)
        return;
    p->silent_since_ms = 0;
    if (p->silent_inited)
        uv_timer_stop(&p->silent_timer);
}

/* peer_down_timeout passed with no answer: the peer is dead for this worker
 * (as after TCP-6's evidence); its queue is dropped and it is never dialed
 * again, unless it rejoins (AGENT-16). */
static void silent_declare(tpi_tcp_agent *a, uint32_t id) {
    tpi_tcp_peer *p = &a->peers[id];
    char msg[TP_ERRMSG_LEN_MAX];
    tpi_format(msg, sizeof msg,
               "%s: no answer for %.1f s since %s (peer_down_timeout %llu s, TCP-25)", p->addr,
               (double)(uv_now(&a->loop) - p->silent_since_ms) / 1e3, p->silent_detail,
               (unsigned long long)(a->peer_down_ms / 1000u));
    silent_end(p);
    (void)queue_drop(a, id, 1);
    if (p->redial_pending) {
        uv_timer_stop(&p->redial);
        p->redial_pending = 0;
    }
    p->suspect = 0;
    tpi_tcp_conn *c = p->out; /* a dial not answered: it carries nothing yet */
    p->out = NULL;
    if (c)
        conn_close(c);
    upcall_down(a, id, TP_EPEERDOWN, msg);
}

static void on_silent_timer(uv_timer_t *h) {
    tpi_tcp_agent *a = h->data;
    tpi_tcp_peer *p = (tpi_tcp_peer *)((char *)h - offsetof(tpi_tcp_peer, silent_timer));
    uint32_t id = (uint32_t)(p - a->peers);
    if (p->silent_since_ms == 0 || p->dead || atomic_load(&a->stop_flag)) {
        uv_timer_stop(h);
        return;
    }
    if (uv_now(&a->loop) - p->silent_since_ms >= a->peer_down_ms) {
        silent_declare(a, id);
        return;
    }
    /* A dial whose SYNs went unanswered waits out the kernel's backoff (1,
     * 2, 4 s ...): a fresh one each tick finds a healed path within a tick
     * (one that began since the last tick costs a SYN more, nothing else). */
    tpi_tcp_conn *c = p->out;
    if (c && !c->connected && c->state != CONN_CLOSED) {
        p->out = NULL;
        conn_close(c); /* only its hello was on it: frames wait in the queue */
    }
    if (!p->out && !p->redial_pending)
        tpi_tcp_flush(a, id); /* dials, data or not */
}

/* ---- Dialing again (TCP-20) ------------------------------------------------------ */

static void on_redial(uv_timer_t *h) {
    tpi_tcp_agent *a = h->data;
    tpi_tcp_peer *p = (tpi_tcp_peer *)((char *)h - offsetof(tpi_tcp_peer, redial));
    p->redial_pending = 0;
    if (!atomic_load(&a->stop_flag))
        tpi_tcp_flush(a, (uint32_t)(p - a->peers));
}

/* Our dial failed before the other end answered: one reset (a live worker
 * out of descriptors resets what it cannot accept) or one refusal is no
 * evidence of death. Schedules another dial after a backoff and keeps the
 * queued frames; 0 when the window is over and the failure is the verdict. */
static int redial_later(tpi_tcp_conn *c, int uverr, const char *detail) {
    tpi_tcp_agent *a = c->a;
    tpi_tcp_peer *p = &a->peers[c->peer];
    if (c->opened || !reading(c) || p->out != c || p->dead || atomic_load(&a->stop_flag) ||
        stale(c))
        return 0;
    uint64_t now = tpi_tcp_now_ns();
    if (p->dial_fail_since_ns == 0) {
        p->dial_fail_since_ns = now;
        p->dial_backoff_ms = TPI_TCP_REDIAL_FIRST_MS;
    }
    uint64_t spent_ms = (now - p->dial_fail_since_ns) / 1000000u;
    uint64_t window_ms =
        uverr == UV_ECONNREFUSED ? TPI_TCP_REFUSED_DEAD_MS : TPI_TCP_CONNECT_TIMEOUT_MS;
    if (spent_ms >= window_ms)
        return 0;
    if (!p->redial_inited) {
        uv_timer_init(&a->loop, &p->redial);
        p->redial.data = a;
        p->redial_inited = 1;
    }
    tpi_log(TP_LOG_INFO, "worker %u: dial to worker %u at %s failed (%s); again in %u ms", a->rank,
            c->peer, c->addr, detail, p->dial_backoff_ms);
    p->out = NULL;
    p->redial_pending = 1;
    uv_timer_start(&p->redial, on_redial, p->dial_backoff_ms, 0);
    p->dial_backoff_ms *= 2;
    if (p->dial_backoff_ms > TPI_TCP_REDIAL_MAX_MS)
        p->dial_backoff_ms = TPI_TCP_REDIAL_MAX_MS;
    conn_close(c);
    return 1;
}

/* TCP-23: whether the connection ended while our kernel was waiting on a
 * silent peer: retransmissions or keepalive probes unanswered, and the
 * socket closed (an orderly end of the peer leaves it in CLOSE_WAIT). Then
 * neither what the read saw nor a reset proves the process gone: our own
 * kernel gave up (keepalive or user timeout) and a write took its
 * ETIMEDOUT, leaving the read an end of file or EPIPE; or the reset came
 * from the peer's kernel, which had given up on the connection itself (it
 * sends one when its keepalive does: an asymmetric cut, or a partition that
 * healed between the two ends' verdicts) or rebooted. A worker killed on a
 * live host ends its connections at once, while they are not silent. */
static int ended_in_silence(tpi_tcp_conn *c) {
    uv_os_fd_t fd;
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0 ||
        getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        return 0;
    return ti.tcpi_state == TCP_CLOSE &&
           (ti.tcpi_probes > 0 || ti.tcpi_retransmits > 0 || ti.tcpi_backoff > 0);
}

/* The outgoing connection c failed with a libuv error: before the other end
 * answered it is dialed again (TCP-20); after, TCP-6 decides. A dial that
 * stayed refused means nobody listens there any more; one that kept
 * failing otherwise says only that the network is broken. */
static void out_broke(tpi_tcp_conn *c, int uverr, const char *detail) {
    tpi_tcp_agent *a = c->a;
    uint32_t id = c->peer;
    int silent = c->opened && uverr == UV_ETIMEDOUT; /* our kernel gave up on it */
    if (c->opened && tpi_uv_err_means_dead(uverr) && ended_in_silence(c)) {
        detail = uverr == UV_ECONNRESET ? "connection reset by peer after it went silent"
                                        : "connection timed out (no answer within user_timeout)";
        uverr = UV_ETIMEDOUT; /* TP_EIO: the next send dials again (TCP-6, TCP-20) */
        silent = 1;
    }
    /* A dial whose SYNs went unanswered, or to a host its network says is
     * gone (no ARP answer): no answer either (TCP-25). */
    silent = silent || (!c->opened && !c->connected &&
                        (uverr == UV_ETIMEDOUT || uverr == UV_EHOSTUNREACH));
    char why[sizeof a->peers[0].silent_detail];
    tpi_format(why, sizeof why, "%s", detail); /* detail may be freed with c */
    int stale_conn = stale(c);
    if (c->opened) {
        out_fail(c, tpi_uv_err_means_dead(uverr) ? TP_EPEERDOWN : TP_EIO, detail);
    } else if (!redial_later(c, uverr, detail)) {
        out_fail(c, uverr == UV_ECONNREFUSED ? TP_EPEERDOWN : TP_EIO, detail);
    }
    if (silent && !stale_conn)
        silent_begin(a, id, why);
}

/* The peer answered our dial: the retry window starts afresh next time. */
static void out_opened(tpi_tcp_conn *c) {
    c->opened = 1;
    c->a->peers[c->peer].dial_fail_since_ns = 0;
    silent_end(&c->a->peers[c->peer]);
}

/* The peer answered on our outgoing connection while suspected: it lives,
 * so what broke was only the connection it dialed to us. */
static void peer_alive(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    tpi_tcp_peer *p = &a->peers[c->peer];
    if (!p->suspect)
        return;
    p->suspect = 0;
    uv_timer_stop(&c->timer);
    char msg[TP_ERRMSG_LEN_MAX];
    tpi_format(msg, sizeof msg, "%s; the worker still answers at %s", p->suspect_detail, p->addr);
    if (!p->dead)
        upcall_down(a, c->peer, TP_EIO, msg);
}

/* An outgoing connection we closed as idle ended (or its grace ran out):
 * every frame we wrote on it was read, so the next one may go on a new
 * connection without overtaking any (TCP-19). */
static void closing_done(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    uint32_t id = c->peer;
    tpi_tcp_peer *p = &a->peers[id];
    if (p->out == c)
        p->out = NULL;
    conn_close(c);
    pthread_mutex_lock(&a->qmu);
    int queued = p->q_head != NULL;
    pthread_mutex_unlock(&a->qmu);
    if ((queued || p->suspect) && !atomic_load(&a->stop_flag))
        tpi_tcp_flush(a, id); /* dials again */
}

/* The acceptor asks us to close our idle connection (TCP-19): CLOSE goes
 * out behind whatever we wrote, and frames sent meanwhile wait for the end
 * of this connection before a new one is dialed. */
static void out_idle(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    peer_alive(c); /* it answered */
    direct_revoke(a, c->peer);
    if (c->ring_head) {
        /* TCP-28: frames still waiting for the ring's room never went: they
         * are the oldest of the queue, for the next connection. */
        tpi_tcp_peer *p = &a->peers[c->peer];
        pthread_mutex_lock(&a->qmu);
        TPI_ASSERT((p->q_head == NULL) == (p->q_tail == NULL));
        c->ring_tail->next = p->q_head;
        if (!p->q_head)
            p->q_tail = c->ring_tail;
        p->q_head = c->ring_head;
        atomic_fetch_add(&p->q_bytes, c->ring_bytes);
        pthread_mutex_unlock(&a->qmu);
        tpi_log(TP_LOG_DEBUG,
                "worker %u: %llu bytes of frames waiting for the ring's room go "
                "to worker %u on its next connection",
                a->rank, (unsigned long long)c->ring_bytes, c->peer);
        c->ring_head = c->ring_tail = NULL;
        c->ring_bytes = 0;
    }
    c->state = CONN_CLOSING;
    if (conn_write_record(c, a->rec_close, 0) < 0) {
        closing_done(c);
        return;
    }
    uv_timer_start(&c->timer, on_conn_timer, TPI_TCP_IDLE_GRACE_MS, 0);
}

/* A connection the peer dialed ended without ABORT: find out through our
 * own connection whether the process is gone (TCP-7). */
static void probe(tpi_tcp_agent *a, uint32_t id, const char *detail) {
    tpi_tcp_peer *p = &a->peers[id];
    apply_readdress(a, id);
    if (p->dead || atomic_load(&a->stop_flag))
        return;
    tpi_format(p->suspect_detail, sizeof p->suspect_detail, "%s", detail);
    if (!a->have_peers || !p->addr[0]) {
        upcall_down(a, id, TP_EIO, detail); /* no address to probe yet */
        return;
    }
    if (p->suspect)
        return; /* one probe at a time answers for every connection */
    p->suspect = 1;
    if (!p->out) {
        if (!p->redial_pending) /* else the pending dial answers */
            dial(a, id); /* the acceptor's hello is the answer; a failure is the verdict */
        return;
    }
    tpi_tcp_conn *c = p->out;
    if (c->state == CONN_CLOSING)
        return; /* its end dials again, and that dial answers */
    direct_revoke(a, id); /* on_write grants it again once the probe is out */
    if (c->state == CONN_OPEN && conn_write_record(c, a->rec_ping, 0) < 0) {
        out_fail(c, TP_EIO, "cannot write a probe");
        return;
    }
    uv_timer_start(&c->timer, on_conn_timer, TPI_TCP_PROBE_TIMEOUT_MS, 0);
}

/* An accepted connection broke: peer unknown, ABORT, or a probe (TCP-7). */
static void in_ended(tpi_tcp_conn *c, const char *detail) {
    tpi_tcp_agent *a = c->a;
    uint32_t id = c->peer;
    int aborted = c->got_abort, bye = c->got_bye;
    char msg[TP_ERRMSG_LEN_MAX];
    tpi_format(msg, sizeof msg, "connection from %s closed: %s", c->addr,
               aborted ? "the worker closed it after an error"
               : bye   ? "the worker shut down"
                       : detail);
    int old = id != NO_PEER && stale(c);
    conn_close(c);
    if (id == NO_PEER || old)
        return; /* never identified, or from an incarnation since replaced */
    if (aborted) {
        if (!a->peers[id].dead)
            upcall_down(a, id, TP_EIO, msg);
        return;
    }
    probe(a, id, msg);
}

/* A record or frame header we cannot accept on an identified accepted connection. */
static void in_protocol_error(tpi_tcp_conn *c, const char *what) {
    tpi_tcp_agent *a = c->a;
    uint32_t id = c->peer;
    char msg[TP_ERRMSG_LEN_MAX];
    tpi_format(msg, sizeof msg, "connection from %s dropped: %s", c->addr, what);
    tpi_log(TP_LOG_WARN, "worker %u: %s", a->rank, msg);
    rx_release(c);
    tp_frame_free(c->rx);
    c->rx = NULL;
    int old = stale(c);
    conn_abort(c);
    if (!a->peers[id].dead && !old)
        upcall_down(a, id, TP_EIO, msg);
}

/* An open accepted connection's timer (TCP-19): a frame too slow, an IDLE
 * not honoured, or idle long enough to ask for its close. */
static void in_deadline(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    uint64_t now = uv_now(&a->loop);
    c->timer_due_ms = UINT64_MAX;
    if (c->waiting)
        return;
    char msg[TP_ERRMSG_LEN_MAX];
    if (c->rx && now >= c->rx_deadline_ms) {
        tpi_format(msg, sizeof msg,
                   "a frame of %zu bytes was not whole within %u ms plus 1 s per MiB (%zu "
                   "arrived): too slow a sender (frame_timeout)",
                   c->rx_len, a->frame_ms, c->rx_got);
        in_protocol_error(c, msg);
        return;
    }
    if (!c->rx && c->idle_asked_ms && now >= c->idle_asked_ms + idle_grace_ms(a)) {
        tpi_format(msg, sizeof msg, "it did not close an idle connection within %u ms of IDLE",
                   idle_grace_ms(a));
        in_protocol_error(c, msg);
        return;
    }
    unsigned taken = atomic_load_explicit(&c->rd_count, memory_order_relaxed);
    if (taken != c->rd_seen) { /* frames a task read itself (TCP-30) */
        c->rd_seen = taken;
        c->active_ms = now;
    }
    if (!c->rx && !c->idle_asked_ms && now >= c->active_ms + a->idle_ms) {
        tpi_log(TP_LOG_DEBUG, "worker %u asks worker %u to close its connection from %s: idle %u ms",
                a->rank, c->peer, c->addr, a->idle_ms);
        c->idle_asked_ms = now ? now : 1;
        if (conn_write_record(c, a->rec_idle, 0) < 0) {
            in_ended(c, "cannot write IDLE");
            return;
        }
    }
    conn_timer_at(c, in_next_due(c));
}

/* An accepted connection proved who it is (TCP-3, TCP-17): it leaves the
 * handshakes, within its peer's cap, and its deadlines start. 0 when it was
 * closed for the cap. */
static int in_identified(tpi_tcp_conn *c, uint32_t id) {
    tpi_tcp_agent *a = c->a;
    if (c->counted) {
        c->counted = 0;
        a->nhandshakes--;
    }
    uint32_t n = 0;
    for (tpi_tcp_conn *o = a->conns; o; o = o->next)
        n += o != c && !o->outgoing && o->peer == id && o->state == CONN_OPEN;
    if (n >= TPI_TCP_CONNS_PER_PEER_MAX) {
        tpi_log(TP_LOG_WARN,
                "worker %u refused a connection from %s: worker %u has %u open already "
                "(TPI_TCP_CONNS_PER_PEER_MAX, TCP-19)",
                a->rank, c->addr, id, n);
        conn_close(c);
        return 0;
    }
    c->peer = id;
    c->gen = atomic_load_explicit(&a->peers[id].gen, memory_order_relaxed);
    c->state = CONN_OPEN;
    c->active_ms = uv_now(&a->loop);
    silent_end(&a->peers[id]); /* it reached us (TCP-25) */
    conn_timer_at(c, in_next_due(c));
    return 1;
}

static void on_conn_timer(uv_timer_t *h) {
    tpi_tcp_conn *c = h->data;
    if (c->state == CONN_CLOSED)
        return;
    if (c->state == CONN_ABORTING || c->state == CONN_REFUSING) {
        conn_close(c); /* the ABORT record, or our refusal, did not get out in time */
        return;
    }
    if (c->state == CONN_CLOSING) {
        closing_done(c); /* the acceptor did not end it in time: we do */
        return;
    }
    if (!c->outgoing && c->state == CONN_OPEN) {
        in_deadline(c);
        return;
    }
    if (!c->outgoing) {
        tpi_log(TP_LOG_WARN, "worker %u dropped a connection from %s: no %s within %u ms",
                c->a->rank, c->addr, c->state == CONN_HELLO ? "hello" : "authentication",
                c->a->hello_ms);
        conn_close(c); /* no hello in time: not one of ours */
        return;
    }
    char detail[96];
    int probed = c->a->peers[c->peer].suspect;
    if (probed)
        tpi_format(detail, sizeof detail, "no answer to a probe within %d ms",
                   TPI_TCP_PROBE_TIMEOUT_MS);
    else
        tpi_format(detail, sizeof detail, "no answer to hello within %d ms",
                   TPI_TCP_CONNECT_TIMEOUT_MS);
    tpi_tcp_agent *a = c->a;
    uint32_t id = c->peer;
    int stale_conn = stale(c);
    out_fail(c, TP_EIO, detail);
    /* An idle peer's silence may show first here (TCP-23): the silence's
     * dials tell a silent host (no SYN answered) from a live one at once. */
    if (probed && !stale_conn)
        silent_begin(a, id, detail);
}

/* ---- Reading ------------------------------------------------------------------ */

static void deliver_frame(tpi_tcp_conn *c, tp_frame *f);

static int ring_drain(tpi_tcp_conn *c, int until_marker, unsigned limit);

/* The most records the ring can hold at once (each takes 8 bytes or more),
 * and one turn more: a drain of what was written before an event on the
 * stream (a frame, CLOSE, the end) needs no more turns, whatever the
 * writer goes on writing meanwhile. */
static unsigned ring_turns_max(const tpi_tcp_conn *c) {
    return (unsigned)(c->link->ring.cap / TPI_RING_ALIGN) + 1;
}

/* A whole frame read from the stream. With a ring (TCP-28) it is the frame
 * a STREAM marker there announced: the ring's records before the marker go
 * first, the ring's after it wait for this frame (AGENT-8). */
static void deliver(tpi_tcp_conn *c) {
    tp_frame *f = c->rx;
    c->rx = NULL;
    c->rx_bytes = NULL;
    c->rx_len = c->rx_got = 0;
    rx_release(c);
    if (!c->ring_on) {
        deliver_frame(c, f);
        return;
    }
    if (c->ring_marks == 0 && ring_drain(c, 1, ring_turns_max(c)) != 0) {
        tp_frame_free(f);
        return;
    }
    if (c->ring_marks == 0) {
        tp_frame_free(f);
        in_protocol_error(c, "a frame came on the stream without its STREAM marker in the "
                             "shared memory ring (TCP-28)");
        return;
    }
    c->ring_marks--;
    deliver_frame(c, f);
    if (c->ring_marks == 0 && c->state == CONN_OPEN)
        ring_drain(c, 0, TPI_SHM_RING_BATCH); /* what waited behind the marker */
}

/* Hands a whole frame from this connection's peer to the core. */
static void deliver_frame(tpi_tcp_conn *c, tp_frame *f) {
    tpi_tcp_agent *a = c->a;
    if (atomic_load(&a->stop_flag)) {
        tp_frame_free(f); /* AGENT-5: incoming frames are dropped from stop on */
        return;
    }
    silent_end(&a->peers[c->peer]); /* it reached us (TCP-25) */
    atomic_uint *gen = &a->peers[c->peer].gen;
    unsigned before = atomic_load_explicit(gen, memory_order_relaxed);
    tp_core_on_frame(a->core, c->peer, f);
    /* A frame that made the core take a restarted peer's new address
     * (tp:join, REJOIN-4) came from that new incarnation: this connection
     * is of the new generation. */
    unsigned after = atomic_load_explicit(gen, memory_order_relaxed);
    if (after != before && c->gen == before)
        c->gen = after;
}

static void in_frame_header(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    size_t len = 0;
    char err[TP_ERRMSG_LEN_MAX];
    /* WIRE-6: the header is checked before any body byte is read or allocated. */
    if (tp_frame_check_header(c->rec, a->max_msg, &len, err, sizeof err) != TP_OK) {
        in_protocol_error(c, err);
        return;
    }
    /* TCP-19: within the read budget. A header that fits passes those that
     * wait: one peer's large frames never hold up another's small ones. One
     * that does not fit waits behind them even when the budget was just
     * freed (their admission comes on the loop's next turn): arrival order. */
    if (a->rx_pending + len > a->rx_budget && (a->rx_pending > 0 || a->rx_wait_head)) {
        c->waiting = 1;
        c->wait_len = len;
        if (a->rx_wait_tail)
            a->rx_wait_tail->wait_next = c;
        else
            a->rx_wait_head = c;
        a->rx_wait_tail = c;
        /* Waiters with nothing being read: the release that freed the
         * budget started their admission, which runs on the next turn. */
        TPI_ASSERT(a->rx_pending > 0 || uv_is_active((uv_handle_t *)&a->rx_admit) ||
                   atomic_load(&a->stop_flag));
        uv_read_stop((uv_stream_t *)&c->tcp);
        conn_timer_at(c, UINT64_MAX);
        tpi_log(TP_LOG_DEBUG,
                "worker %u: a frame of %zu bytes from %s waits: %llu bytes are being read "
                "(rx_budget %llu)%s",
                a->rank, len, c->addr, (unsigned long long)a->rx_pending,
                (unsigned long long)a->rx_budget,
                a->rx_pending == 0 ? ", behind headers that waited before it" : "");
        return;
    }
    in_frame_start(c, len);
}

/* Reads the frame of len bytes whose header is in c->rec. */
static void in_frame_start(tpi_tcp_conn *c, size_t len) {
    tpi_tcp_agent *a = c->a;
    tp_frame *f = tp_frame_alloc(len);
    if (!f) {
        char err[TP_ERRMSG_LEN_MAX];
        tpi_format(err, sizeof err, "out of memory for a frame of %zu bytes", len);
        in_protocol_error(c, err);
        return;
    }
    c->rx = f;
    c->rx_bytes = tp_frame_bytes(f);
    c->rx_len = len;
    memcpy(c->rx_bytes, c->rec, TPI_TCP_RECORD_SIZE);
    c->rx_got = TPI_TCP_RECORD_SIZE;
    c->rx_counted = len;
    a->rx_pending += len;
    c->rx_deadline_ms = uv_now(&a->loop) + a->frame_ms + (uint64_t)len * 1000u / TPI_TCP_FRAME_RATE_MIN;
    if (c->timer_due_ms > c->rx_deadline_ms)
        conn_timer_at(c, c->rx_deadline_ms);
    if (c->rx_got == c->rx_len)
        deliver(c);
}

static void consume(tpi_tcp_conn *c, const uint8_t *p, size_t n);
static void sealed_drain(tpi_tcp_conn *c);

/* A waiting header is admitted: its frame is read, then what was read
 * behind it, then the socket again. */
static void in_resume(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    uint8_t *stash = c->stash;
    size_t n = c->stash_len;
    c->stash = NULL;
    c->stash_len = 0;
    in_frame_start(c, c->wait_len);
    if (stash && c->state == CONN_OPEN)
        consume(c, stash, n); /* may wait again, stashing the rest anew */
    free(stash);
    if (c->rx_sealed && c->state == CONN_OPEN && !c->waiting)
        sealed_drain(c); /* the records read behind it (TCP-21) */
    if (c->state != CONN_OPEN || c->waiting)
        return;
    c->active_ms = uv_now(&a->loop);
    conn_timer_at(c, in_next_due(c));
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) < 0)
        in_ended(c, "cannot read again");
}

void tpi_tcp_on_rx_admit(uv_idle_t *h) {
    tpi_tcp_agent *a = h->data;
    uv_idle_stop(h);
    while (a->rx_wait_head && !atomic_load(&a->stop_flag)) {
        tpi_tcp_conn *c = a->rx_wait_head;
        if (a->rx_pending > 0 && a->rx_pending + c->wait_len > a->rx_budget)
            break; /* a release starts this again */
        wait_remove(c);
        in_resume(c);
    }
}

/* ---- Shared memory (TCP-22) --------------------------------------------------------- */

/* The dialer's offer, once its connection is open: its probe waits for the
 * answer; until then (and without one) frames take the stream. */
static void shm_offer(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    if (!a->shm_on || c->tx_sealed || c->shm != SHM_NONE)
        return;
    if (tpi_shm_offer(a, c->peer, &c->shm_probe, &c->link, rec) != 0) {
        tpi_log(TP_LOG_DEBUG, "worker %u: no shared memory with worker %u: cannot make a probe",
                a->rank, c->peer);
        return;
    }
    if (conn_write_records(c, rec, 1) != 0) {
        tpi_shm_close_untracked(c->shm_probe);
        c->shm_probe = -1;
        tpi_shm_link_free(c->link);
        c->link = NULL;
        return;
    }
    c->shm = SHM_OFFERED;
}

static void on_bell(uv_poll_t *h, int status, int events);

/* Polls this end's bell from now on (TCP-28); 0, or -1 when libuv cannot. */
static int bell_start(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    if (uv_poll_init(&a->loop, &c->bell, c->link->wait_fd) != 0)
        return -1;
    c->bell.data = c;
    c->bell_on = 1;
    c->handles++;
    if (uv_poll_start(&c->bell, UV_READABLE, on_bell) != 0)
        return -1; /* the handle is closed with the connection */
    c->ring_on = 1;
    return 0;
}

static int ring_drain(tpi_tcp_conn *c, int until_marker, unsigned limit);

/* An accepted connection's OFFER: answered yes when its probe holds, with
 * its ring taken when one came and this worker wants it (TCP-28). */
static void shm_on_offer(tpi_tcp_conn *c, const uint32_t v[3]) {
    tpi_tcp_agent *a = c->a;
    const char *why = "this worker has shm=off", *ring_why = NULL;
    tpi_shm_link *link = NULL;
    tpi_shm_rx *rx = a->shm_on ? tpi_shm_accept(a, c->peer, c, v, &why, &link, &ring_why) : NULL;
    if (!rx && a->shm_on)
        tpi_log(TP_LOG_INFO,
                "worker %u: no shared memory with worker %u (%s): its frames come over TCP",
                a->rank, c->peer, why);
    else if (rx && !link && ring_why)
        tpi_log(TP_LOG_INFO,
                "worker %u: no shared memory ring with worker %u (%s): its small frames come "
                "over TCP",
                a->rank, c->peer, ring_why);
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    tpi_tcp_shm_encode(rec, TPI_TCP_SHM_ANSWER, a->rank, rx ? 1u : 0u, link ? 1u : 0u, 0);
    c->shm_rx = rx;
    c->link = link; /* read once the RING record comes */
    if (conn_write_records(c, rec, 1) != 0)
        in_ended(c, "cannot answer a shared memory offer");
}

/* The outgoing connection's ANSWER: large frames go through slabs from now,
 * and with a ring every frame goes there (TCP-28), behind the RING record
 * that tells the acceptor to read it. */
static void shm_on_answer(tpi_tcp_conn *c, uint32_t yes, uint32_t ring) {
    tpi_tcp_agent *a = c->a;
    tpi_shm_close_untracked(c->shm_probe);
    c->shm_probe = -1;
    if (c->link)
        tpi_shm_link_opened(c->link);
    if (!yes) {
        c->shm = SHM_NONE;
        tpi_log(TP_LOG_DEBUG, "worker %u: worker %u declined shared memory: frames take TCP",
                a->rank, c->peer);
    } else {
        c->shm = SHM_ACTIVE;
        c->shm_session = ++a->peers[c->peer].shm_sessions;
        atomic_store(&a->peers[c->peer].shm_active, 1);
        tpi_log(TP_LOG_DEBUG, "worker %u: frames of %llu bytes and more to worker %u go through "
                "shared memory", a->rank, (unsigned long long)a->shm_min, c->peer);
    }
    if (yes && ring && c->link) {
        uint8_t rec[TPI_TCP_RECORD_SIZE];
        tpi_tcp_shm_encode(rec, TPI_TCP_SHM_RING, a->rank, 0, 0, 0);
        if (conn_write_records(c, rec, 1) != 0 || bell_start(c) != 0) {
            out_fail(c, TP_EIO, "cannot start the shared memory ring");
            return;
        }
        tpi_log(TP_LOG_DEBUG,
                "worker %u: frames to worker %u go through a shared memory ring of "
                "%llu bytes",
                a->rank, c->peer, (unsigned long long)c->link->ring.cap);
    } else if (c->link) {
        tpi_shm_link_free(c->link);
        c->link = NULL;
    }
    /* What waited for the answer goes now, and direct writes are granted
     * again (tpi_tcp_direct_grant). */
    if (a->peers[c->peer].out == c)
        tpi_tcp_flush(a, c->peer);
}

/* Hands on the frame a FRAME record (fields v) names in a slab (TCP-22);
 * 0, or -1 after a protocol error was raised. */
static int slab_deliver(tpi_tcp_conn *c, const uint32_t v[3]) {
    char err[TP_ERRMSG_LEN_MAX];
    tp_frame *f = tpi_shm_frame(c->shm_rx, v, c->a->max_msg, err, sizeof err);
    if (!f) {
        in_protocol_error(c, err);
        return -1;
    }
    deliver_frame(c, f);
    return 0;
}

/* Handles a shared memory record (kind, fields v) read from the stream;
 * 0, or -1 after a protocol error was raised. */
static int shm_on_record(tpi_tcp_conn *c, int kind, const uint32_t v[3]) {
    tpi_tcp_agent *a = c->a;
    char err[TP_ERRMSG_LEN_MAX];
    int sealed = c->tx_sealed || c->rx_sealed; /* never offered there: encrypt=on turns shm off */
    if (kind == TPI_TCP_SHM_OFFER && !c->outgoing && !c->shm_offered && !sealed) {
        c->shm_offered = 1;
        shm_on_offer(c, v);
        return 0;
    }
    if (kind == TPI_TCP_SHM_ANSWER && c->outgoing && c->shm == SHM_OFFERED && v[0] <= 1 &&
        v[1] <= v[0] && v[2] == 0) {
        shm_on_answer(c, v[0], v[1]);
        return 0;
    }
    /* With a ring, FRAME records travel in it, in the frames' order. */
    if (kind == TPI_TCP_SHM_FRAME && !c->outgoing && c->shm_rx && !c->ring_on)
        return slab_deliver(c, v);
    if (kind == TPI_TCP_SHM_RELEASE && c->outgoing && c->shm == SHM_ACTIVE &&
        tpi_shm_release(a, c->peer, c->shm_session, v[0]) == 0)
        return 0;
    if (kind == TPI_TCP_SHM_RING && !c->outgoing && c->link && !c->ring_on && v[0] == 0 &&
        v[1] == 0 && v[2] == 0) {
        /* Every frame before it came on the stream: the ring's come next. */
        if (bell_start(c) != 0) {
            in_protocol_error(c, "cannot poll the shared memory ring's bell");
            return -1;
        }
        return ring_drain(c, 0, TPI_SHM_RING_BATCH);
    }
    tpi_format(err, sizeof err, "unexpected shared memory record (kind %d, %u %u %u) on %s "
               "connection", kind, v[0], v[1], v[2], c->outgoing ? "an outgoing" : "an accepted");
    if (c->outgoing)
        out_fail(c, TP_EIO, err);
    else
        in_protocol_error(c, err);
    return -1;
}

/* ---- The ring (TCP-28) ------------------------------------------------------------ */

/* Rings this end's own bell: its poll fires on the loop's next turn. */
static void bell_self(tpi_tcp_conn *c) {
    uint64_t one = 1;
    ssize_t k;
    do
        k = write(c->link->wait_fd, &one, sizeof one);
    while (k < 0 && errno == EINTR);
}

/* A record as the reader copied it out of the ring: the writer may change
 * the bytes there at any time, so they are copied first, checked after. */
typedef struct ring_rec {
    tpi_tcp_agent *a;
    size_t len;
    int is_rec; /* a 24-byte control record (FRAME, STREAM), in rec */
    int bad;    /* a length no frame or record has */
    uint8_t rec[TPI_TCP_RECORD_SIZE];
    tp_frame *f; /* else a frame's bytes (NULL: no memory) */
} ring_rec;

static void ring_take(void *ctx, const uint8_t *p, size_t len) {
    ring_rec *r = ctx;
    r->len = len;
    if (len < TP_FRAME_HEADER_SIZE || len > r->a->max_msg) {
        r->bad = 1;
        return;
    }
    if (len == TPI_TCP_RECORD_SIZE) {
        memcpy(r->rec, p, len);
        if (tpi_tcp_is_ctl(r->rec)) {
            r->is_rec = 1;
            return;
        }
    }
    r->f = tp_frame_alloc(len);
    if (r->f)
        memcpy(tp_frame_bytes(r->f), p, len);
}

/* Hands on one record read from the ring: a frame, a slab's FRAME record
 * or a STREAM marker. 0, or -1 after a protocol error was raised. */
static int ring_handle(tpi_tcp_conn *c, ring_rec *rr) {
    tpi_tcp_agent *a = c->a;
    char err[TP_ERRMSG_LEN_MAX];
    size_t len = 0;
    if (rr->bad) {
        tpi_format(err, sizeof err,
                   "a record of %zu bytes in the shared memory ring: no frame "
                   "is shorter than %d bytes or longer than max_message_size (TCP-28)",
                   rr->len, TP_FRAME_HEADER_SIZE);
        in_protocol_error(c, err);
        return -1;
    }
    if (rr->is_rec) {
        uint32_t v[3];
        int kind = tpi_tcp_shm_decode(rr->rec, v);
        if (kind == TPI_TCP_SHM_STREAM && v[0] == 0 && v[1] == 0 && v[2] == 0) {
            c->ring_marks++;
            return 0;
        }
        if (kind == TPI_TCP_SHM_FRAME && c->shm_rx)
            return slab_deliver(c, v);
        tpi_format(err, sizeof err,
                   "unexpected record %02x %02x %02x %02x (kind %u) in the "
                   "shared memory ring (TCP-28)",
                   rr->rec[0], rr->rec[1], rr->rec[2], rr->rec[3], rr->rec[5]);
        in_protocol_error(c, err);
        return -1;
    }
    if (!rr->f) {
        tpi_format(err, sizeof err, "out of memory for a frame of %zu bytes", rr->len);
        in_protocol_error(c, err);
        return -1;
    }
    /* TCP-4's check, on our copy: the header's length must be the record's. */
    tp_status hst = tp_frame_check_header(tp_frame_bytes(rr->f), a->max_msg, &len, err, sizeof err);
    if (hst == TP_OK && len != rr->len)
        tpi_format(err, sizeof err, "a frame of %zu bytes in a ring record of %zu (TCP-28)", len,
                   rr->len);
    if (hst != TP_OK || len != rr->len) {
        tp_frame_free(rr->f);
        in_protocol_error(c, err);
        return -1;
    }
    deliver_frame(c, rr->f);
    return 0;
}

/*
 * The acceptor hands on the ring's records, in order: until it is empty
 * (then it sleeps: the writer rings its bell for the next record), until a
 * STREAM marker when until_marker (the stream's frame is next), while no
 * marker waits for its frame, and for at most limit turns (then its own
 * bell brings it back on the loop's next turn, after other connections'
 * events). 0, or -1 once the connection failed.
 */
static int ring_drain_batch(tpi_tcp_conn *c, int until_marker, unsigned limit) {
    TPI_ASSERT(!c->outgoing && c->ring_on && c->link && !c->link->ring.writer);
    tpi_tcp_agent *a = c->a;
    tpi_ring *r = &c->link->ring;
    unsigned turns = 0, delivered = 0;
    reply_revoke(c); /* one reader at a time */
    tpi_ring_disarm(r);
    while (c->state == CONN_OPEN && c->ring_marks == 0) {
        if (turns++ == limit) {
            bell_self(c);
            return 0;
        }
        ring_rec rr = {.a = a};
        tpi_ring_status st = tpi_ring_read_cb(r, ring_take, &rr);
        if (st == TPI_RING_EMPTY) {
            if (until_marker)
                return 0;
            if (!tpi_ring_arm(r)) { /* asleep: the next record rings the bell */
                reply_publish(c);
                return 0;
            }
            tpi_ring_disarm(r); /* one came while we armed */
            continue;
        }
        if (st != TPI_RING_OK) {
            char err[TP_ERRMSG_LEN_MAX];
            tpi_format(err, sizeof err, "the shared memory ring %s (TCP-28)",
                       st == TPI_RING_CLOSED ? "was closed while the connection lives"
                                             : tpi_ring_why(r));
            in_protocol_error(c, err);
            return -1;
        }
        c->active_ms = uv_now(&a->loop);
        if (ring_handle(c, &rr) != 0)
            return -1;
        if (++delivered % TPI_TCP_FLUSH_EVERY == 0) {
            tpi_tcp_wake_batch_flush(a); /* waiters wake while the batch is read */
            tpi_tcp_flush_dirty(a);      /* the answers stream out meanwhile */
        }
    }
    return c->state == CONN_OPEN ? 0 : -1;
}

/* The ring's records as one batch of frames (TCP-31). */
static int ring_drain(tpi_tcp_conn *c, int until_marker, unsigned limit) {
    tpi_tcp_wake_batch_begin(c->a);
    int rc = ring_drain_batch(c, until_marker, limit);
    tpi_tcp_wake_batch_end(c->a);
    return rc;
}

/* A ring this loop reads and may spin on: open, not waiting for a frame of
 * the stream (that one's frame comes by the socket). */
static int ring_spun(const tpi_tcp_conn *c) {
    return !c->outgoing && c->ring_on && c->state == CONN_OPEN && c->ring_marks == 0;
}

/*
 * TCP-29: instead of sleeping in its poll at once, the loop looks at the
 * rings it reads for up to spin_us (less when a timer is due sooner), with
 * them disarmed, so a writer meanwhile rings no bell and this loop reads no
 * eventfd. A ring with records is read there and the spin goes on; it
 * stops at a wake-up of the loop (tpi_tcp_wake: frames to send, a timer
 * changed), at stop and at its end, whatever was read: a socket's bytes
 * and the timers wait at most spin_us. Every ring is armed again before it
 * returns, and read when it moved meanwhile: none sleeps unarmed.
 */
void tpi_tcp_ring_spin(tpi_tcp_agent *a, uint64_t max_ns) {
    uint32_t n = 0;
    for (tpi_tcp_conn *c = a->conns; c; c = c->next)
        if (ring_spun(c)) {
            TPI_ASSERT(!c->rd_out); /* a spinning loop lends no ring (TCP-30) */
            tpi_ring_disarm(&c->link->ring);
            n++;
        }
    if (n == 0)
        return;
    unsigned wakes = atomic_load_explicit(&a->wakes, memory_order_acquire);
    uint64_t until = tpi_tcp_now_ns() + (a->spin_ns < max_ns ? a->spin_ns : max_ns);
    for (;;) {
        tpi_tcp_conn *found = NULL;
        for (tpi_tcp_conn *c = a->conns; c && !found; c = c->next)
            if (ring_spun(c) && tpi_ring_ready(&c->link->ring))
                found = c;
        if (found) {
            ring_drain(found, 0, TPI_SHM_RING_BATCH); /* arms it when empty */
            if (ring_spun(found))
                tpi_ring_disarm(&found->link->ring);
        }
        if (atomic_load_explicit(&a->wakes, memory_order_acquire) != wakes ||
            atomic_load_explicit(&a->stop_flag, memory_order_relaxed))
            break;
        if (!found)
            sched_yield(); /* a turn yields the CPU: see TCP-29 in spec/tcp.md */
        if (tpi_tcp_now_ns() >= until)
            break;
    }
    tpi_tcp_conn *next = NULL;
    for (tpi_tcp_conn *c = a->conns; c; c = next) {
        next = c->next;
        if (ring_spun(c) && tpi_ring_arm(&c->link->ring))
            ring_drain(c, 0, TPI_SHM_RING_BATCH); /* moved while we armed */
    }
}

/* ---- A caller that reads its own reply (TCP-30) ------------------------------------ */

/*
 * While this loop sleeps on an accepted connection's ring (armed, empty, no
 * marker waiting for the stream), it publishes the ring for the peer
 * (rd_conn, under qmu). A task parked for a reply from that peer takes it
 * (rd_held) and sleeps on the ring's futex instead of its semaphore: the
 * writer, seeing the reader's flag say TPI_RING_SLEEPS_FUTEX, wakes it
 * directly, and it hands on the RESPONSE records itself, in ring order;
 * at any other record (a request, a slab's, a marker) it stops without
 * consuming it and rings this loop's bell. Every earlier record of the
 * ring was handed on before the ring was published, and the loop reads it
 * again only after revoking it (reply_revoke: nudge the holder, wait until
 * it gave it back), so the link's order holds (AGENT-20). With spin_us
 * the loop spins on its rings instead (TCP-29) and publishes none.
 */
static void reply_publish(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    TPI_ASSERT(!c->outgoing && c->ring_on && c->peer < a->world_size);
    tpi_tcp_peer *p = &a->peers[c->peer];
    /* ring_drain's loop, which began by revoking the ring. */
    TPI_ASSERT(c->state == CONN_OPEN && c->ring_marks == 0 && !c->rd_out);
    /* A silent peer's frames must reach the loop: they end its silence. A
     * connection of an earlier incarnation (AGENT-16) is lent like any: its
     * replies match no call either way (REJOIN-5). */
    if (a->spin_ns > 0 || p->silent_since_ms != 0)
        return;
    pthread_mutex_lock(&a->qmu);
    if (!p->rd_conn && !p->rd_held && !p->dead && !a->stopping) {
        p->rd_conn = c;
        c->rd_out = 1;
    }
    pthread_mutex_unlock(&a->qmu);
}

static void reply_revoke(tpi_tcp_conn *c) {
    if (!c->rd_out)
        return;
    tpi_tcp_agent *a = c->a;
    tpi_tcp_peer *p = &a->peers[c->peer];
    c->rd_out = 0;
    pthread_mutex_lock(&a->qmu);
    if (p->rd_conn == c)
        p->rd_conn = NULL;
    if (p->rd_held == c) {
        atomic_store(&c->rd_revoke, 1);
        tpi_ring_nudge(&c->link->ring);
        while (p->rd_held == c) {
            pthread_mutex_unlock(&a->qmu);
            sched_yield(); /* the holder wakes, finishes the frame in hand, gives it back */
            pthread_mutex_lock(&a->qmu);
        }
        atomic_store(&c->rd_revoke, 0);
    }
    pthread_mutex_unlock(&a->qmu);
}

static void reply_revoke_peer(tpi_tcp_agent *a, uint32_t id) {
    tpi_tcp_peer *p = &a->peers[id];
    pthread_mutex_lock(&a->qmu);
    tpi_tcp_conn *c = p->rd_held ? p->rd_held : p->rd_conn;
    pthread_mutex_unlock(&a->qmu);
    if (c) /* only this loop publishes or frees connections: c lives */
        reply_revoke(c);
}

tpi_tcp_conn *tpi_tcp_reply_take(tpi_tcp_agent *a, uint32_t peer) {
    TPI_ASSERT(peer < a->world_size); /* the core's: a call's destination */
    tpi_tcp_peer *p = &a->peers[peer];
    tpi_tcp_conn *c = NULL;
    pthread_mutex_lock(&a->qmu);
    if (p->rd_conn && !p->rd_held && !p->dead && !a->stopping) {
        c = p->rd_conn;
        p->rd_held = c;
    }
    pthread_mutex_unlock(&a->qmu);
    return c;
}

tpi_ring *tpi_tcp_reply_ring(tpi_tcp_conn *c) {
    return &c->link->ring;
}

/* A record a task takes: a whole, well-formed RESPONSE frame, copied out
 * and checked on the copy (the writer may change the ring's bytes). Any
 * other record is left for the loop, which reads and judges it. */
typedef struct reply_pick {
    tpi_tcp_agent *a;
    tp_frame *f;
} reply_pick;

static int reply_pick_take(void *ctx, const uint8_t *p, size_t len) {
    reply_pick *k = ctx;
    if (len < TP_FRAME_HEADER_SIZE || len > k->a->max_msg)
        return 0;
    tp_frame *f = tp_frame_alloc(len);
    if (!f)
        return 0;
    uint8_t *b = tp_frame_bytes(f);
    memcpy(b, p, len);
    size_t flen = 0;
    if ((len == TPI_TCP_RECORD_SIZE && tpi_tcp_is_ctl(b)) ||
        tp_frame_check_header(b, k->a->max_msg, &flen, NULL, 0) != TP_OK || flen != len ||
        !tp_frame_is_reply(b)) {
        tp_frame_free(f);
        return 0;
    }
    k->f = f;
    return 1;
}

typedef struct reply_watch {
    tpi_tcp_agent *a;
    tpi_tcp_conn *c;
    const atomic_int *permit;
} reply_watch;

/* What ends the task's reading, besides the deadline: tpi_ring_sleep's look. */
static int reply_awake(void *ctx) {
    reply_watch *w = ctx;
    return atomic_load(w->permit) || atomic_load(&w->a->stop_flag) || atomic_load(&w->c->rd_revoke);
}

int tpi_tcp_reply_read(tpi_tcp_agent *a, tpi_tcp_conn *c, const atomic_int *permit,
                       uint64_t deadline_ns) {
    tpi_ring *r = &c->link->ring;
    reply_watch w = {a, c, permit};
    tpi_ring_disarm(r); /* the loop left it armed for its bell: this reader is awake */
    for (;;) {
        if (reply_awake(&w))
            return 0;
        reply_pick k = {a, NULL};
        int took = 0;
        tpi_ring_status st = tpi_ring_read_if(r, reply_pick_take, &k, &took);
        if (st == TPI_RING_OK && took) {
            atomic_fetch_add_explicit(&c->rd_count, 1, memory_order_relaxed);
            if (atomic_load(&a->stop_flag))
                tp_frame_free(k.f); /* AGENT-5 */
            else
                tp_core_on_frame(a->core, c->peer, k.f); /* AGENT-20 */
            continue;
        }
        if (st != TPI_RING_EMPTY)
            return 1; /* not ours to take (or a closed or broken ring): the loop's */
        if (tpi_tcp_now_ns() >= deadline_ns)
            return 0;
        tpi_ring_sleep(r, reply_awake, &w, deadline_ns);
    }
}

void tpi_tcp_reply_release(tpi_tcp_agent *a, tpi_tcp_conn *c, int left) {
    tpi_tcp_peer *p = &a->peers[c->peer];
    /* Asleep for the bell again, as the loop left it; records that came
     * since (or the one left) are the loop's: its bell, rung while the ring
     * is still ours (once given back, the loop may close the bell). */
    if (tpi_ring_arm(&c->link->ring)) /* the record left, or one that came */
        bell_self(c);
    pthread_mutex_lock(&a->qmu);
    TPI_ASSERT(p->rd_held == c);
    p->rd_held = NULL;
    if (left && p->rd_conn == c)
        p->rd_conn = NULL; /* published again once the loop read it */
    pthread_mutex_unlock(&a->qmu);
}

static void ring_pump(tpi_tcp_conn *c);

/* This end's bell: the acceptor's says records wait, the dialer's that
 * the reader made room. */
static void on_bell(uv_poll_t *h, int status, int events) {
    (void)events;
    tpi_tcp_conn *c = h->data;
    tpi_tcp_agent *a = c->a;
    if (c->state == CONN_CLOSED)
        return;
    uint64_t n;
    ssize_t k;
    do
        k = read(c->link->wait_fd, &n, sizeof n); /* the count goes back to 0 */
    while (k < 0 && errno == EINTR);
    if (status < 0) {
        char err[TP_ERRMSG_LEN_MAX];
        tpi_format(err, sizeof err, "the shared memory ring's bell failed: %s",
                   uv_strerror(status));
        if (c->outgoing)
            out_fail(c, TP_EIO, err);
        else if (c->state == CONN_OPEN)
            in_protocol_error(c, err);
        return;
    }
    if (c->state != CONN_OPEN)
        return;
    tpi_tcp_direct_regrant(a); /* as on_read: the answers may go out directly */
    if (!c->outgoing) {
        ring_drain(c, 0, TPI_SHM_RING_BATCH);
        return;
    }
    tpi_ring_disarm(&c->link->ring);
    ring_pump(c);
    tpi_tcp_unsent_update(a, c->peer);
    if (a->peers[c->peer].out == c)
        tpi_tcp_direct_grant(a, c->peer);
}

void tpi_tcp_shm_tell_released(tpi_tcp_agent *a) {
    uint8_t recs[TPI_SHM_SLABS_MAX * TPI_TCP_RECORD_SIZE];
    tpi_shm_rx *next = NULL;
    for (tpi_shm_rx *rx = tpi_shm_released_take(a); rx; rx = next) {
        uint32_t released = 0, n = 0;
        tpi_tcp_conn *c = tpi_shm_rx_take(rx, &next, &released);
        for (uint32_t slot = 0; slot < TPI_SHM_SLABS_MAX; slot++)
            if (released & 1u << slot)
                tpi_tcp_shm_encode(recs + n++ * TPI_TCP_RECORD_SIZE, TPI_TCP_SHM_RELEASE,
                                   a->rank, slot, 0, 0);
        /* A connection gone (or going) releases the rest on the dialer's side. */
        if (c && n > 0 && c->state == CONN_OPEN)
            conn_write_records(c, recs, n);
        tpi_shm_rx_unref(rx);
    }
}

/* ---- Authentication (TCP-17) -------------------------------------------------------- */

static unsigned hello_flags(const tpi_tcp_agent *a) {
    return (a->auth.on ? TPI_TCP_HELLO_AUTH : 0u) | (a->encrypt ? TPI_TCP_HELLO_ENCRYPT : 0u);
}

/* What both proofs cover: who dialed whom in which world, and both nonces. */
static size_t proof_ctx(const tpi_tcp_conn *c, uint8_t *ctx) {
    const tpi_tcp_agent *a = c->a;
    uint32_t dialer = c->outgoing ? a->rank : c->claimed;
    uint32_t acceptor = c->outgoing ? c->peer : a->rank;
    const uint8_t *nd = c->outgoing ? c->nonce_mine : c->nonce_peer;
    const uint8_t *na = c->outgoing ? c->nonce_peer : c->nonce_mine;
    uint32_t v[3] = {dialer, acceptor, a->world_size};
    size_t n = 0;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            ctx[n++] = (uint8_t)(v[i] >> (8 * k));
    memcpy(ctx + n, nd, TPI_TCP_NONCE_SIZE);
    memcpy(ctx + n + TPI_TCP_NONCE_SIZE, na, TPI_TCP_NONCE_SIZE);
    return n + 2 * TPI_TCP_NONCE_SIZE;
}

#define PROOF_ACCEPT "tp/conn/accept v1"
#define PROOF_DIAL "tp/conn/dial v1"

/* TCP-21: both nonces are known; the keys of both directions, and the buffer
 * of sealed bytes read. Each direction switches to records on its own:
 * after this end's proof for what it writes, after the other's for what it
 * reads. 0, or -1 out of memory or when OpenSSL fails. */
static int seal_start(tpi_tcp_conn *c) {
    uint8_t ctx[TPI_TCP_AUTH_CTX_MAX], d2a[TPI_TCP_SEAL_KEY_SIZE], a2d[TPI_TCP_SEAL_KEY_SIZE];
    int rc = tpi_tcp_seal_keys(&c->a->auth, ctx, proof_ctx(c, ctx), d2a, a2d);
    if (rc == 0)
        rc = tpi_tcp_seal_init(&c->tx, c->outgoing ? d2a : a2d, 1);
    if (rc == 0)
        rc = tpi_tcp_seal_init(&c->rx_seal, c->outgoing ? a2d : d2a, 0);
    OPENSSL_cleanse(d2a, sizeof d2a);
    OPENSSL_cleanse(a2d, sizeof a2d);
    if (rc == 0 && !(c->sealed = malloc(TPI_TCP_SEAL_BUF)))
        rc = -1;
    return rc;
}

/* A failed handshake: the dialer learns the address is not ours (TCP-6); the
 * acceptor drops the stranger without a word (TCP-3). */
static void auth_fail(tpi_tcp_conn *c, const char *why) {
    if (c->outgoing) {
        char detail[TP_ERRMSG_LEN_MAX];
        tpi_format(detail, sizeof detail,
                   "the process at this address did not authenticate as worker %u of this "
                   "job (another job secret?): %s",
                   c->peer, why);
        out_fail(c, TP_EPEERDOWN, detail);
    } else {
        tpi_log(TP_LOG_WARN,
                "worker %u refused a connection from %s claiming to be worker %u: it did not "
                "authenticate (TCP-17): %s",
                c->a->rank, c->addr, c->claimed, why);
        conn_close(c);
    }
}

static void on_auth_record(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    uint8_t pl[16], ctx[TPI_TCP_AUTH_CTX_MAX];
    if (c->state == CONN_AUTH_NONCE) {
        if (!tpi_tcp_auth_decode(c->rec, TPI_TCP_AUTH_NONCE, pl)) {
            auth_fail(c, "expected its nonce");
            return;
        }
        memcpy(c->nonce_peer, pl, sizeof c->nonce_peer);
        c->state = CONN_AUTH_PROOF;
        if (c->outgoing)
            return; /* its proof follows */
        /* The acceptor answers: ACCEPT, its nonce, its proof. */
        if (tpi_tcp_auth_nonce(c->nonce_mine) != 0) {
            conn_close(c);
            return;
        }
        tpi_tcp_hello_encode(c->hello_out, TPI_TCP_HELLO_ACCEPT, a->rank, c->claimed, a->world_size,
                             hello_flags(a));
        tpi_tcp_auth_encode(c->auth_out[0], TPI_TCP_AUTH_NONCE, c->nonce_mine);
        if (tpi_tcp_auth_proof(&a->auth, PROOF_ACCEPT, ctx, proof_ctx(c, ctx), pl) != 0) {
            tpi_log(TP_LOG_WARN,
                    "worker %u dropped a connection from %s: no memory to prove itself", a->rank,
                    c->addr);
            conn_close(c);
            return;
        }
        tpi_tcp_auth_encode(c->auth_out[1], TPI_TCP_AUTH_PROOF, pl);
        /* The keys before the answer: once the dialer has our proof it
         * seals and writes, and a close would then read as our death. */
        if (a->encrypt && seal_start(c) != 0) { /* the dialer dials again (TCP-20) */
            tpi_log(TP_LOG_WARN,
                    "worker %u dropped a connection from %s: cannot start its encryption (out "
                    "of memory, or OpenSSL failed)",
                    a->rank, c->addr);
            conn_close(c);
            return;
        }
        if (conn_write_record(c, c->hello_out, 0) < 0 ||
            conn_write_record(c, c->auth_out[0], 0) < 0 ||
            conn_write_record(c, c->auth_out[1], 0) < 0) {
            conn_close(c);
            return;
        }
        c->tx_sealed = a->encrypt; /* all we write from now on (TCP-21) */
        return;
    }
    int ok = tpi_tcp_auth_decode(c->rec, TPI_TCP_AUTH_PROOF, pl)
                 ? tpi_tcp_auth_check(&a->auth, c->outgoing ? PROOF_ACCEPT : PROOF_DIAL, ctx,
                                      proof_ctx(c, ctx), pl)
                 : 0;
    if (ok < 0) { /* no verdict on the peer: ours is the failure */
        if (c->outgoing) {
            out_fail(c, TP_ENOMEM, "no memory to check its proof");
        } else { /* ABORT, not a silent close: the dialer must not take us for dead */
            tpi_log(TP_LOG_WARN,
                    "worker %u dropped a connection from %s: no memory to check its proof", a->rank,
                    c->addr);
            conn_abort(c);
        }
        return;
    }
    if (!ok) {
        auth_fail(c, "its proof is wrong");
        return;
    }
    if (!c->outgoing) { /* frames may come now, from the worker it proved to be */
        if (in_identified(c, c->claimed))
            c->rx_sealed = a->encrypt; /* sealed, from the next byte on (TCP-21) */
        return;
    }
    c->state = CONN_OPEN;
    uv_timer_stop(&c->timer);
    out_opened(c);
    if (tpi_tcp_auth_proof(&a->auth, PROOF_DIAL, ctx, proof_ctx(c, ctx), pl) != 0) {
        out_fail(c, TP_ENOMEM, "no memory to prove ourselves");
        return;
    }
    tpi_tcp_auth_encode(c->auth_out[1], TPI_TCP_AUTH_PROOF, pl);
    if (conn_write_record(c, c->auth_out[1], 0) < 0) {
        out_fail(c, TP_EIO, "cannot write its proof");
        return;
    }
    if (a->encrypt) { /* TCP-21: both directions sealed from here on */
        if (seal_start(c) != 0) {
            out_fail(c, TP_EIO, "cannot start encryption (out of memory, or OpenSSL failed)");
            return;
        }
        c->tx_sealed = c->rx_sealed = 1;
    }
    peer_alive(c);
    shm_offer(c);
    tpi_tcp_flush(a, c->peer); /* the frames that waited for the handshake */
}

/* TCP-21: an OPEN that is right but for its ENCRYPT flag, from a member
 * (both ends authenticate) set otherwise: answered with our ACCEPT, whose
 * flags tell the dialer why it cannot go on (a clear error there, not a
 * silent drop it would retry for 30 s), then the connection waits for the
 * dialer's end. The ACCEPT says nothing a stranger's right hello would not
 * get. 1 when so answered. */
static int encrypt_differs(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    char scratch[8];
    uint32_t sender = NO_PEER;
    if (!a->auth.on || !tpi_tcp_hello_check(c->rec, TPI_TCP_HELLO_OPEN, a->rank, a->world_size,
                                            hello_flags(a) ^ TPI_TCP_HELLO_ENCRYPT, &sender,
                                            scratch, sizeof scratch))
        return 0;
    tpi_tcp_hello_encode(c->hello_out, TPI_TCP_HELLO_ACCEPT, a->rank, sender, a->world_size,
                         hello_flags(a));
    if (conn_write_record(c, c->hello_out, 0) < 0) {
        conn_close(c);
        return 1;
    }
    c->state = CONN_REFUSING; /* reads and drops what the dialer sent, until its end */
    uv_timer_start(&c->timer, on_conn_timer, TPI_TCP_ABORT_LINGER_MS, 0);
    return 1;
}

static void on_record(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    char err[TP_ERRMSG_LEN_MAX];
    err[0] = '\0';
    uint32_t sender = 0;
    if (c->state == CONN_AUTH_NONCE || c->state == CONN_AUTH_PROOF) {
        on_auth_record(c);
        return;
    }
    if (c->state == CONN_HELLO && !c->outgoing) {
        if (!tpi_tcp_hello_check(c->rec, TPI_TCP_HELLO_OPEN, a->rank, a->world_size, hello_flags(a),
                                 &sender, err, sizeof err)) {
            tpi_log(TP_LOG_WARN, "worker %u refused a connection from %s: %s", a->rank, c->addr,
                    err);
            /* TCP-3: a bad hello is dropped, nobody is told; but a member that
             * differs only in encrypt is told by our ACCEPT (TCP-21). */
            if (!encrypt_differs(c))
                conn_close(c);
            return;
        }
        /* A rank we saw die is heard: it may be its restart, whose first
         * frame announces it (REJOIN-4); until then nothing is sent to it. */
        c->claimed = sender;
        if (a->auth.on) {
            /* Only a claim until its proof: a stranger's connection is never
             * attributed to a worker, so its end probes nobody (TCP-7). */
            c->state = CONN_AUTH_NONCE; /* the hello timer runs on until the proof */
            return;
        }
        if (!in_identified(c, sender))
            return;
        tpi_tcp_hello_encode(c->hello_out, TPI_TCP_HELLO_ACCEPT, a->rank, sender, a->world_size, 0);
        if (conn_write_record(c, c->hello_out, 0) < 0)
            in_ended(c, "cannot answer hello");
        return;
    }
    if (c->state == CONN_HELLO) {
        if (!tpi_tcp_hello_check(c->rec, TPI_TCP_HELLO_ACCEPT, a->rank, a->world_size,
                                 hello_flags(a), &sender, err, sizeof err) ||
            sender != c->peer) {
            char detail[TP_ERRMSG_LEN_MAX], scratch[8];
            uint32_t s2 = NO_PEER;
            if (a->auth.on &&
                tpi_tcp_hello_check(c->rec, TPI_TCP_HELLO_ACCEPT, a->rank, a->world_size,
                                    hello_flags(a) ^ TPI_TCP_HELLO_ENCRYPT, &s2, scratch,
                                    sizeof scratch) &&
                s2 == c->peer) {
                /* TCP-21: the worker itself, set otherwise: no use dialing again. */
                tpi_format(detail, sizeof detail,
                           "worker %u has encrypt=%s and this worker encrypt=%s: every worker of "
                           "a job must set the backend option 'encrypt' alike (spec/tcp.md "
                           "TCP-21)",
                           c->peer, a->encrypt ? "off" : "on", a->encrypt ? "on" : "off");
                out_fail(c, TP_EPEERDOWN, detail);
                return;
            }
            if (sender != c->peer && err[0] == '\0')
                tpi_format(err, sizeof err, "it is worker %u", sender);
            tpi_format(detail, sizeof detail, "the process at this address is not worker %u: %s",
                       c->peer, err);
            out_fail(c, TP_EPEERDOWN, detail);
            return;
        }
        if (a->auth.on) {
            c->state = CONN_AUTH_NONCE; /* its nonce and proof follow the ACCEPT */
            return;
        }
        c->state = CONN_OPEN;
        uv_timer_stop(&c->timer);
        out_opened(c);
        peer_alive(c);
        shm_offer(c);
        tpi_tcp_flush(a, c->peer); /* the frames that waited for the answer; grants direct writes */
        return;
    }
    if (!c->outgoing && !tpi_tcp_is_ctl(c->rec)) {
        in_frame_header(c);
        return;
    }
    uint32_t v[3];
    int shm_kind = tpi_tcp_shm_decode(c->rec, v);
    if (shm_kind) {
        shm_on_record(c, shm_kind, v);
        return;
    }
    int kind = tpi_tcp_ctl_kind_of(c->rec);
    switch (kind) {
    case TPI_TCP_CTL_BYE:
        c->got_bye = 1;
        return;
    case TPI_TCP_CTL_ABORT:
        c->got_abort = 1;
        return;
    case TPI_TCP_CTL_PING:
        if (!c->outgoing) {
            if (conn_write_record(c, a->rec_pong, 0) < 0)
                in_ended(c, "cannot answer a probe");
            return;
        }
        break;
    case TPI_TCP_CTL_PONG:
        if (c->outgoing) {
            peer_alive(c);
            return;
        }
        break;
    case TPI_TCP_CTL_IDLE:
        if (c->outgoing) {
            out_idle(c);
            return;
        }
        break;
    case TPI_TCP_CTL_CLOSE:
        if (!c->outgoing) {
            /* TCP-28: the ring's records were written before it. */
            if (c->ring_on && ring_drain(c, 0, ring_turns_max(c)) != 0)
                return;
            conn_close(c); /* every frame before it was handed on; nothing follows */
            return;
        }
        break;
    default:
        break;
    }
    tpi_format(err, sizeof err, "unexpected record %02x %02x %02x %02x (kind %u) on %s connection",
               c->rec[0], c->rec[1], c->rec[2], c->rec[3], c->rec[5],
               c->outgoing ? "an outgoing" : "an accepted");
    if (c->outgoing)
        out_fail(c, TP_EIO, err);
    else
        in_protocol_error(c, err);
}

static void sealed_input(tpi_tcp_conn *c, const uint8_t *p, size_t n);

/* Plaintext bytes (from the staging buffer, or opened): records, headers and
 * small bodies. */
static void consume_batch(tpi_tcp_conn *c, const uint8_t *p, size_t n) {
    tpi_tcp_agent *a = c->a;
    unsigned delivered = 0;
    int sealed = c->rx_sealed;
    while (n > 0 && reading(c)) {
        if (c->rx) {
            size_t take = c->rx_len - c->rx_got;
            if (take > n)
                take = n;
            memcpy(c->rx_bytes + c->rx_got, p, take);
            c->rx_got += take;
            p += take;
            n -= take;
            if (c->rx_got == c->rx_len) {
                deliver(c);
                /* c stays valid: closing only schedules the free */
                if (++delivered % TPI_TCP_FLUSH_EVERY == 0) {
                    tpi_tcp_wake_batch_flush(a);
                    tpi_tcp_flush_dirty(a);
                }
            }
            continue;
        }
        size_t take = TPI_TCP_RECORD_SIZE - c->rec_got;
        if (take > n)
            take = n;
        memcpy(c->rec + c->rec_got, p, take);
        c->rec_got += take;
        p += take;
        n -= take;
        if (c->rec_got == TPI_TCP_RECORD_SIZE) {
            c->rec_got = 0;
            on_record(c);
            if (c->rx_sealed != sealed) { /* the handshake ended: the rest is sealed (TCP-21) */
                if (n > 0 && reading(c))
                    sealed_input(c, p, n);
                return;
            }
            if (c->waiting && n > 0) { /* the rest waits with the header (TCP-19) */
                c->stash = malloc(n);
                if (!c->stash) {
                    in_protocol_error(c, "out of memory for bytes read ahead");
                    return;
                }
                memcpy(c->stash, p, n);
                c->stash_len = n;
                return;
            }
        }
    }
}

/* n bytes read at once, as one batch of frames (TCP-31). */
static void consume(tpi_tcp_conn *c, const uint8_t *p, size_t n) {
    tpi_tcp_agent *a = c->a;
    tpi_tcp_wake_batch_begin(a);
    consume_batch(c, p, n); /* c stays valid: closing only schedules the free */
    tpi_tcp_wake_batch_end(a);
}

/* ---- The sealed stream (TCP-21) ---------------------------------------------------- */

/* A sealed stream that cannot be opened: TCP-7's protocol error on an
 * accepted connection, TCP-6's TP_EIO on an outgoing one. */
static void sealed_error(tpi_tcp_conn *c, const char *what) {
    if (c->outgoing)
        out_fail(c, TP_EIO, what);
    else
        in_protocol_error(c, what);
}

/* Opens every whole record in c->sealed and hands on its plaintext, until
 * the connection stops reading or a frame header waits for the read budget
 * (TCP-19: the records behind it wait with it, unopened). */
static void sealed_drain(tpi_tcp_conn *c) {
    tpi_tcp_agent *a = c->a;
    size_t off = 0;
    while (reading(c) && !c->waiting) {
        const uint8_t *rec = c->sealed + off;
        long whole = tpi_tcp_sealed_next(rec, c->sealed_len - off);
        if (whole < 0) { /* checked before any more of it is read */
            char err[TP_ERRMSG_LEN_MAX];
            uint32_t n = (uint32_t)rec[0] | (uint32_t)rec[1] << 8 | (uint32_t)rec[2] << 16 |
                         (uint32_t)rec[3] << 24;
            tpi_format(err, sizeof err, "a sealed record declares %u bytes, not 1 to %u (TCP-21)",
                       n, (unsigned)TPI_TCP_SEAL_MAX);
            sealed_error(c, err);
            break;
        }
        if (whole == 0)
            break;
        size_t m = (size_t)whole - TPI_TCP_SEAL_OVERHEAD;
        /* A record within the body of the frame being read opens straight
         * into it; any other into the staging buffer, then parsed. */
        int into_frame = c->rx && c->rx_len - c->rx_got >= m;
        uint8_t *plain = into_frame ? c->rx_bytes + c->rx_got : a->staging;
        if (tpi_tcp_open(&c->rx_seal, rec, plain) != 0) {
            sealed_error(c, "a sealed record does not check: tampered with, replayed, "
                            "reordered or not of this connection (TCP-21)");
            break;
        }
        off += m + TPI_TCP_SEAL_OVERHEAD;
        if (!into_frame) {
            consume(c, a->staging, m);
        } else if ((c->rx_got += m) == c->rx_len) {
            deliver(c);
        }
    }
    /* c lives on until its close callback, even if it closed here. */
    memmove(c->sealed, c->sealed + off, c->sealed_len - off);
    c->sealed_len -= off;
}

/* Sealed bytes read with the end of the handshake, in the staging buffer. */
static void sealed_input(tpi_tcp_conn *c, const uint8_t *p, size_t n) {
    TPI_ASSERT(c->sealed_len == 0 && n <= TPI_TCP_SEAL_BUF); /* one read: the staging size */
    memcpy(c->sealed, p, n);
    c->sealed_len = n;
    sealed_drain(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    tpi_tcp_conn *c = h->data;
    if (c->state == CONN_ABORTING) { /* read to be dropped */
        buf->base = (char *)c->a->staging;
        buf->len = TPI_TCP_STAGING_SIZE;
    } else if (c->rx_sealed && reading(c)) {
        /* TCP-21: sealed bytes behind those not yet opened (a partial record). */
        buf->base = (char *)(c->sealed + c->sealed_len);
        buf->len = TPI_TCP_SEAL_BUF - c->sealed_len;
    } else if (c->rx && c->rx_len - c->rx_got >= TPI_TCP_DIRECT_MIN) {
        /* The rest of a large body: straight into the frame, no copy. */
        buf->base = (char *)(c->rx_bytes + c->rx_got);
        buf->len = c->rx_len - c->rx_got;
    } else {
        buf->base = (char *)c->a->staging;
        buf->len = TPI_TCP_STAGING_SIZE;
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    tpi_tcp_conn *c = s->data;
    if (c->state == CONN_ABORTING) {
        if (nread < 0)
            conn_close(c); /* the other end closed too (or reset): all it sent is dropped */
        return;
    }
    if (c->state == CONN_CLOSING) {
        if (nread < 0)
            closing_done(c); /* the acceptor read our CLOSE and everything before it */
        return;              /* records only: nothing we need any more */
    }
    if (c->state == CONN_REFUSING) {
        if (nread < 0)
            conn_close(c); /* the dialer read our answer and left */
        return;
    }
    if (!reading(c))
        return;
    c->active_ms = uv_now(&c->a->loop);
    /* Before the frames read here are handed on: the answers they cause can
     * go out directly (the check handle would grant it only after them). */
    tpi_tcp_direct_regrant(c->a);
    if (nread < 0) {
        int err = (int)nread;
        if (!c->outgoing) {
            /* TCP-28: what the ring holds was written before the end. */
            if (c->ring_on && c->state == CONN_OPEN && ring_drain(c, 0, ring_turns_max(c)) != 0)
                return;
            in_ended(c, uv_strerror(err));
        } else if (c->got_abort) {
            out_fail(c, TP_EIO, "the worker closed the connection after an error");
        } else {
            out_broke(c, err,
                      c->got_bye      ? "the worker shut down"
                      : err == UV_EOF ? "the connection was closed (end of file)"
                                      : uv_strerror(err));
        }
        return;
    }
    if (nread == 0)
        return;
    if (c->rx_sealed) {
        TPI_ASSERT(buf->base == (char *)(c->sealed + c->sealed_len));
        c->sealed_len += (size_t)nread;
        sealed_drain(c);
        return;
    }
    if (buf->base != (char *)c->a->staging) {
        c->rx_got += (size_t)nread;
        if (c->rx_got == c->rx_len)
            deliver(c);
        return;
    }
    consume(c, c->a->staging, (size_t)nread);
}

/* ---- Accepting (TCP-3) ------------------------------------------------------------ */

void tpi_tcp_on_accept(uv_stream_t *server, int status) {
    tpi_tcp_agent *a = server->data;
    if (status < 0) {
        /* Out of descriptors: libuv accepted and closed what waited (its
         * reserve descriptor), so this does not spin; the dialers try
         * again (TCP-20). */
        tpi_log(TP_LOG_WARN, "worker %u cannot accept a connection: %s", a->rank,
                uv_strerror(status));
        return;
    }
    tpi_tcp_conn *c = conn_new(a, 0, NO_PEER);
    if (!c)
        return; /* out of memory: libuv keeps this connection and stops listening until it
                   is accepted, so peers that dial later time out (TP_EIO); nothing leaks */
    if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0 || atomic_load(&a->stop_flag)) {
        conn_close(c);
        return;
    }
    struct sockaddr_storage sa;
    int len = sizeof sa;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &len) == 0)
        tpi_tcp_format_sockaddr((struct sockaddr *)&sa, c->addr, sizeof c->addr);
    else
        tpi_format(c->addr, sizeof c->addr, "(unknown address)");
    if (a->nhandshakes >= a->handshakes_max) { /* TCP-19: closed at once */
        uint64_t now = uv_now(&a->loop);
        if (now - a->refused_log_ms >= 1000 || a->refused_log_ms == 0) {
            tpi_log(TP_LOG_WARN,
                    "worker %u refused a connection from %s: %u connections are in their "
                    "handshake already (max_handshakes, TCP-19); %u more refused since the last "
                    "report",
                    a->rank, c->addr, a->nhandshakes, a->refused_unlogged);
            a->refused_log_ms = now ? now : 1;
            a->refused_unlogged = 0;
        } else {
            a->refused_unlogged++;
        }
        conn_close(c);
        return;
    }
    c->counted = 1;
    a->nhandshakes++;
    socket_tune(c);
    uv_timer_start(&c->timer, on_conn_timer, a->hello_ms, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) < 0)
        conn_close(c);
}

/* ---- Dialing and writing (TCP-2, TCP-4) ---------------------------------------------- */

static void on_connect(uv_connect_t *req, int status) {
    tpi_tcp_conn *c = req->data;
    if (status == UV_ECANCELED || c->state == CONN_CLOSED)
        return;
    if (status < 0) {
        out_broke(c, status, uv_strerror(status));
        return;
    }
    c->connected = 1;
    if (!stale(c))
        silent_end(&c->a->peers[c->peer]); /* its kernel answered: the host is there */
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc < 0)
        out_fail(c, TP_EIO, uv_strerror(rc));
}

/* Opens the outgoing connection to peer id and queues our hello; frames
 * written now wait in libuv until the connection is up. NULL when it
 * failed at once (the failure was reported). */
static tpi_tcp_conn *dial(tpi_tcp_agent *a, uint32_t id) {
    tpi_tcp_peer *p = &a->peers[id];
    TPI_ASSERT(!p->out && id != a->rank);
    tpi_tcp_conn *c = conn_new(a, 1, id);
    if (!c) {
        (void)queue_drop(a, id, 0);
        p->suspect = 0;
        char msg[TP_ERRMSG_LEN_MAX];
        tpi_format(msg, sizeof msg, "%s: out of memory for a connection", p->addr);
        upcall_down(a, id, TP_EIO, msg);
        return NULL;
    }
    p->out = c;
    c->gen = atomic_load_explicit(&p->gen, memory_order_relaxed);
    tpi_format(c->addr, sizeof c->addr, "%s", p->addr);
    int rc = uv_tcp_connect(&c->connect_req, &c->tcp, (const struct sockaddr *)&p->sa, on_connect);
    if (rc < 0) {
        out_broke(c, rc, uv_strerror(rc));
        return NULL;
    }
    socket_tune(c); /* the socket exists once the connect started */
    tpi_tcp_hello_encode(c->hello_out, TPI_TCP_HELLO_OPEN, a->rank, id, a->world_size,
                         hello_flags(a));
    rc = conn_write_record(c, c->hello_out, 0);
    if (rc == 0 && a->auth.on) { /* TCP-17: our nonce right behind the OPEN */
        if (tpi_tcp_auth_nonce(c->nonce_mine) != 0) {
            out_fail(c, TP_EIO, "the random generator failed");
            return NULL;
        }
        tpi_tcp_auth_encode(c->auth_out[0], TPI_TCP_AUTH_NONCE, c->nonce_mine);
        rc = conn_write_record(c, c->auth_out[0], 0);
    }
    if (rc < 0) {
        out_fail(c, TP_EIO, uv_strerror(rc));
        return NULL;
    }
    uv_timer_start(&c->timer, on_conn_timer,
                   p->suspect ? TPI_TCP_PROBE_TIMEOUT_MS : TPI_TCP_CONNECT_TIMEOUT_MS, 0);
    return c;
}

/*
 * Writes what it can of bufs at once when libuv has nothing queued on c (its
 * write queue empty and no connect pending; uv_try_write refuses otherwise,
 * so bytes never overtake queued ones): no request, no deferred callback, no
 * poll watcher to re-arm. Advances bufs past the bytes written and returns
 * how many buffers are left to queue (from *first on).
 */
static unsigned write_now(tpi_tcp_conn *c, uv_buf_t *bufs, unsigned n, unsigned *first) {
    *first = 0;
    if (c->state != CONN_OPEN)
        return n;
    int k = uv_try_write((uv_stream_t *)&c->tcp, bufs, n);
    if (k <= 0)
        return n; /* UV_EAGAIN, or an error the queued write reports in its callback */
    size_t done = (size_t)k;
    unsigned i = 0;
    while (i < n && done >= bufs[i].len)
        done -= bufs[i++].len;
    if (i < n) {
        bufs[i].base += done;
        bufs[i].len -= done;
    }
    *first = i;
    return n - i;
}

/* ---- The sealed writer (TCP-21) ------------------------------------------------------ */

static void tx_enqueue(tpi_tcp_conn *c, tp_frame *f) {
    tp_frame *last = f;
    c->txq_bytes += f->len;
    while (last->next) {
        last = last->next;
        c->txq_bytes += last->len;
    }
    if (c->txq_tail)
        c->txq_tail->next = f;
    else
        c->txq_head = f;
    c->txq_tail = last;
}

/* The next chunk of the queue (at most TPI_TCP_SEAL_CHUNK bytes, at most
 * TPI_TCP_WRITE_BUFS_MAX pieces) as iov; its bytes. */
static size_t tx_gather(const tpi_tcp_conn *c, struct iovec *iov, int *niov) {
    size_t n = 0, skip = c->txq_off;
    int k = 0;
    for (const tp_frame *f = c->txq_head; f && n < TPI_TCP_SEAL_CHUNK; f = f->next) {
        for (int i = 0; i < f->nseg && n < TPI_TCP_SEAL_CHUNK; i++) {
            const uint8_t *b = f->seg[i].base;
            size_t len = f->seg[i].len;
            if (skip >= len) {
                skip -= len;
                continue;
            }
            if (k == TPI_TCP_WRITE_BUFS_MAX) {
                *niov = k;
                return n;
            }
            b += skip;
            len -= skip;
            skip = 0;
            if (len > TPI_TCP_SEAL_CHUNK - n)
                len = TPI_TCP_SEAL_CHUNK - n;
            iov[k++] = (struct iovec){(void *)b, len};
            n += len;
        }
    }
    *niov = k;
    return n;
}

/* n bytes of the queue were sealed: whole frames are freed. */
static void tx_advance(tpi_tcp_conn *c, size_t n) {
    n += c->txq_off;
    while (c->txq_head && n >= c->txq_head->len) {
        tp_frame *f = c->txq_head;
        n -= f->len;
        c->txq_bytes -= f->len;
        c->txq_head = f->next;
        tp_frame_free(f);
    }
    if (!c->txq_head)
        c->txq_tail = NULL;
    c->txq_off = n;
}

/* The queue cannot be sealed or written: nothing more goes out on c. */
static void tx_fail(tpi_tcp_conn *c, const char *why) {
    c->tx_failed = 1;
    free_frames(c->txq_head);
    c->txq_head = c->txq_tail = NULL;
    c->txq_off = 0;
    c->txq_bytes = 0;
    if (c->outgoing)
        out_fail(c, TP_EIO, why); /* its ABORT fails too: it closes */
    else
        conn_close(c);
}

/* Seals and writes the queue while a chunk buffer is free: each chunk at
 * once when the socket takes it (the buffer is free again), else in a
 * uv_write whose completion pumps again. With close_after (an ABORT queued)
 * the connection closes once all is written, from a write's completion. */
static void tx_pump(tpi_tcp_conn *c) {
    if (c->tx_pumping)
        return; /* a failure's ABORT, from inside the loop below */
    c->tx_pumping = 1;
    while (c->state != CONN_CLOSED && !c->tx_failed) {
        int i = !c->out[0].busy ? 0 : !c->out[1].busy ? 1 : -1;
        if (!c->txq_head) {
            if (c->tx_close_after && !c->out[0].busy && !c->out[1].busy) {
                c->tx_pumping = 0;
                abort_or_close(c, 0);
                return;
            }
            break;
        }
        if (i < 0)
            break; /* a completion pumps again */
        struct iovec iov[TPI_TCP_WRITE_BUFS_MAX];
        int niov = 0;
        size_t n = tx_gather(c, iov, &niov);
        size_t m = tpi_tcp_sealed_size(n);
        if (c->out[i].cap < m) {
            free(c->out[i].p);
            c->out[i].p = malloc(m);
            c->out[i].cap = c->out[i].p ? m : 0;
        }
        if (!c->out[i].p || tpi_tcp_seal(&c->tx, iov, niov, n, c->out[i].p) != 0) {
            tx_fail(c, "cannot seal what it writes (out of memory, or OpenSSL failed)");
            break;
        }
        tx_advance(c, n);
        uv_buf_t b;
        b.base = (char *)c->out[i].p;
        b.len = m;
        unsigned first = 0;
        if (!c->tx_close_after && write_now(c, &b, 1, &first) == 0)
            continue; /* all of it went: the buffer is free again */
        c->out[i].busy = 1;
        int rc = conn_write_bufs(c, &b, 1, NULL, i, 0);
        if (rc < 0) {
            c->out[i].busy = 0;
            tx_fail(c, uv_strerror(rc));
            break;
        }
    }
    c->tx_pumping = 0;
}

/* TCP-22: each frame of shm_min bytes or more is copied into a slab and
 * replaced by its 24-byte record, in place; one no slab can take stays. */
static tp_frame *shm_pack_frames(tpi_tcp_conn *c, tp_frame *f) {
    tpi_tcp_agent *a = c->a;
    tp_frame **link = &f;
    for (tp_frame *cur = f; cur; cur = *link) {
        if (cur->len >= a->shm_min) {
            tp_frame *r = tp_frame_alloc(TPI_TCP_RECORD_SIZE);
            if (r && tpi_shm_pack(a, c->peer, c->shm_session, cur, tp_frame_bytes(r)) == 0) {
                r->next = cur->next;
                *link = r;
                cur->next = NULL;
                tp_frame_free(cur);
                cur = r;
            } else {
                tp_frame_free(r);
            }
        }
        link = &cur->next;
    }
    return f;
}

/* Writes a list of frames to the stream in batches of at most
 * TPI_TCP_WRITE_BUFS_MAX buffers: each batch at once when it fits in the
 * socket, the rest in one uv_write. */
static void stream_write(tpi_tcp_conn *c, tp_frame *f) {
    uv_buf_t bufs[TPI_TCP_WRITE_BUFS_MAX];
    while (f) {
        unsigned n = 0;
        tp_frame *batch = f, *last = NULL;
        while (f && n + (unsigned)f->nseg <= TPI_TCP_WRITE_BUFS_MAX) {
            for (int i = 0; i < f->nseg; i++)
                bufs[n++] = uv_buf_init((char *)f->seg[i].base, (unsigned)f->seg[i].len);
            last = f;
            f = f->next;
        }
        last->next = NULL;
        unsigned first = 0;
        unsigned left = write_now(c, bufs, n, &first);
        if (left == 0) {
            free_frames(batch); /* all written */
            continue;
        }
        /* The frames of the batch stay alive until this write completes. */
        int rc = conn_write_bufs(c, bufs + first, left, batch, -1, 0);
        if (rc < 0) {
            free_frames(f);
            out_fail(c, TP_EIO, uv_strerror(rc));
            return;
        }
    }
}

/* TCP-28: the dialer's frames into the ring, in order, as far as its room
 * goes; the rest wait in ring_head..tail for the room bell. A frame of
 * shm_min_bytes or more, or above the ring's largest record, goes into a
 * slab with its FRAME record in the ring; one no slab takes goes on the
 * stream behind a STREAM marker in the ring. */
static void ring_pump(tpi_tcp_conn *c) {
    TPI_ASSERT(c->outgoing && c->ring_on && c->link && c->link->ring.writer);
    TPI_ASSERT((c->ring_head == NULL) == (c->ring_tail == NULL));
    TPI_ASSERT(c->ring_head || c->ring_bytes == 0);
    tpi_tcp_agent *a = c->a;
    tpi_ring *r = &c->link->ring;
    uint64_t max = TPI_RING_RECORD_MAX(r->cap);
    unsigned woken = 0;
    while (c->ring_head && c->state == CONN_OPEN) {
        tp_frame *f = c->ring_head;
        int big = f->len >= a->shm_min || f->len > max;
        /* The record goes in only with room for it: a slab is never filled
         * for a record that would then wait (it would outlive its session). */
        tpi_ring_status st = big ? tpi_ring_room(r, TPI_TCP_RECORD_SIZE) : tpi_shm_ring_put(r, f);
        uint8_t rec[TPI_TCP_RECORD_SIZE];
        int slab = 0;
        if (big && st == TPI_RING_OK) {
            slab = tpi_shm_pack(a, c->peer, c->shm_session, f, rec) == 0;
            if (!slab && f->len <= max) {
                st = tpi_shm_ring_put(r, f); /* no slab for it: it fits the ring itself */
            } else {
                if (!slab)
                    tpi_tcp_shm_encode(rec, TPI_TCP_SHM_STREAM, a->rank, 0, 0, 0);
                struct iovec iov = {rec, sizeof rec};
                st = tpi_ring_write(r, &iov, 1);
            }
        }
        if (st == TPI_RING_FULL) {
            /* Asleep for the room bell, unless room came meanwhile: then
             * again, a bounded number of times (the reader is another
             * process: its head is no promise). */
            if (tpi_ring_arm(r) && ++woken < 64) {
                tpi_ring_disarm(r);
                continue;
            }
            return;
        }
        if (st != TPI_RING_OK) {
            char err[TP_ERRMSG_LEN_MAX];
            tpi_format(err, sizeof err, "the shared memory ring %s (TCP-28)",
                       st == TPI_RING_CLOSED ? "was closed by its reader" : tpi_ring_why(r));
            out_fail(c, TP_EIO, err);
            return;
        }
        c->ring_head = f->next;
        if (!c->ring_head)
            c->ring_tail = NULL;
        f->next = NULL;
        c->ring_bytes -= f->len;
        if (big && !slab && f->len > max)
            stream_write(c, f); /* its marker is in the ring */
        else
            tp_frame_free(f);
    }
}

/* Writes a list of frames: sealed (TCP-21), into the ring (TCP-28), or on
 * the stream, large ones through slabs (TCP-22). */
static void write_frames(tpi_tcp_conn *c, tp_frame *f) {
    if (c->tx_sealed) {
        if (c->tx_failed) {
            free_frames(f);
            return;
        }
        tx_enqueue(c, f);
        tx_pump(c);
        return;
    }
    if (c->ring_on) {
        tp_frame *last = f;
        c->ring_bytes += f->len;
        for (; last->next; last = last->next)
            c->ring_bytes += last->next->len;
        if (c->ring_tail)
            c->ring_tail->next = f;
        else
            c->ring_head = f;
        c->ring_tail = last;
        ring_pump(c);
        return;
    }
    if (c->shm == SHM_ACTIVE)
        f = shm_pack_frames(c, f);
    stream_write(c, f);
}

void tpi_tcp_flush(tpi_tcp_agent *a, uint32_t id) {
    tpi_tcp_peer *p = &a->peers[id];
    apply_readdress(a, id);
    if (!p->dead && !p->out && (p->redial_pending || !dial(a, id)))
        return; /* TCP-20: they wait for the next dial */
    if (p->out && p->out->state != CONN_OPEN)
        return; /* frames wait in the queue until the other end answered (and proved
                   itself, TCP-17): a dial that fails before is tried again without loss */
    pthread_mutex_lock(&a->qmu);
    tpi_tcp_direct_stop_locked(a, p); /* the loop writes here now, after any direct rest */
    tp_frame *f = p->q_head;
    p->q_head = p->q_tail = NULL;
    atomic_store(&p->q_bytes, 0);
    pthread_mutex_unlock(&a->qmu);
    if (p->dead) {
        free_frames(f); /* queued just before the verdict; a dead peer is never dialed again */
        tpi_tcp_unsent_update(a, id);
        return;
    }
    if (f)
        write_frames(p->out, f);
    tpi_tcp_unsent_update(a, id); /* AGENT-18: what libuv kept is held now */
    if (p->out)
        tpi_tcp_direct_grant(a, id); /* when all of it went out at once */
}

void tpi_tcp_unsent_update(tpi_tcp_agent *a, uint32_t id) {
    tpi_tcp_peer *p = &a->peers[id];
    tpi_tcp_conn *c = p->out;
    uint64_t wq = 0;
    if (c && c->state != CONN_CLOSED)
        wq = (uint64_t)uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) + c->txq_bytes +
             c->ring_bytes;
    atomic_store(&p->wq_bytes, wq);
    if (!atomic_load(&p->cong_armed))
        return;
    uint64_t held = atomic_load(&p->q_bytes) + wq;
    if ((held <= a->unsent_max / 2 || p->dead || a->stopping) &&
        atomic_exchange(&p->cong_armed, 0))
        tp_core_on_uncongested(a->core, id);
}

int tpi_tcp_congested(tpi_tcp_agent *a, uint32_t id) {
    if (id >= a->world_size || id == a->rank)
        return 0;
    tpi_tcp_peer *p = &a->peers[id];
    if (atomic_load(&p->q_bytes) + atomic_load(&p->wq_bytes) <= a->unsent_max)
        return 0;
    /* Armed before the second look: a drain the loop saw after it finds
     * the flag and tells the core; one before it shows in the second look. */
    atomic_store(&p->cong_armed, 1);
    if (atomic_load(&p->q_bytes) + atomic_load(&p->wq_bytes) <= a->unsent_max / 2 &&
        atomic_exchange(&p->cong_armed, 0))
        return 0;
    return 1;
}

void tpi_tcp_close_all(tpi_tcp_agent *a) {
    for (tpi_tcp_conn *c = a->conns; c; c = c->next) {
        if (c->state == CONN_CLOSED)
            continue;
        if (c->outgoing && c->peer < a->world_size)
            direct_revoke(a, c->peer); /* a sender mid-frame finishes first (TCP-15) */
        if (c->state == CONN_OPEN) {
            /* Best effort: a BYE that does not fit now is skipped, and the
             * other end sees a plain close, which means the same (TCP-8). */
            uint8_t sealed[TPI_TCP_RECORD_SIZE + TPI_TCP_SEAL_OVERHEAD];
            uv_buf_t b = uv_buf_init((char *)a->rec_bye, TPI_TCP_RECORD_SIZE);
            if (c->tx_sealed) /* only between records: nothing of ours may be unsent */
                b = !c->txq_head && !c->out[0].busy && !c->out[1].busy &&
                            seal_record(c, a->rec_bye, sealed) == 0
                        ? uv_buf_init((char *)sealed, sizeof sealed)
                        : uv_buf_init(NULL, 0);
            if (b.len > 0)
                uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
        }
        if (c->outgoing && a->peers[c->peer].out == c)
            a->peers[c->peer].out = NULL;
        conn_close(c);
    }
    for (uint32_t i = 0; i < a->world_size; i++) {
        if (a->peers[i].redial_inited) {
            a->peers[i].redial_inited = a->peers[i].redial_pending = 0;
            uv_close((uv_handle_t *)&a->peers[i].redial, NULL);
        }
        if (a->peers[i].silent_inited) {
            a->peers[i].silent_inited = 0;
            a->peers[i].silent_since_ms = 0;
            uv_close((uv_handle_t *)&a->peers[i].silent_timer, NULL);
        }
    }
}

/* ---- A restarted peer (AGENT-16) ------------------------------------------------- */

tp_status tpi_tcp_set_peer(tpi_tcp_agent *a, uint32_t rank, const char *addr, char *errmsg,
                           size_t errmsg_len) {
    if (rank >= a->world_size || rank == a->rank) {
        tpi_format(errmsg, errmsg_len, "worker %u is not a peer of worker %u", rank, a->rank);
        return TP_EINVAL;
    }
    char host[TPI_ADDR_LEN_MAX], port_s[16], err[TP_ERRMSG_LEN_MAX];
    uint16_t port = 0;
    socklen_t len = 0;
    struct sockaddr_storage sa;
    /* The address came through the store and a peer: check, never assert. A
     * numeric host resolves without blocking; a name asks the resolver. */
    if (strlen(addr) >= TPI_ADDR_LEN_MAX ||
        tpi_tcp_split_hostport(addr, host, sizeof host, port_s, sizeof port_s) != 0 ||
        tpi_tcp_parse_port(port_s, 0, &port) != 0) {
        tpi_format(errmsg, errmsg_len, "worker %u's address '%.64s' is not host:port", rank, addr);
        return TP_EINVAL;
    }
    if (tpi_tcp_resolve(host, port, &sa, &len, err, sizeof err) != TP_OK) {
        tpi_format(errmsg, errmsg_len, "worker %u's address '%.64s': %s", rank, addr, err);
        return TP_EINVAL;
    }
    tpi_tcp_peer *p = &a->peers[rank];
    pthread_mutex_lock(&a->qmu);
    if (a->stopping || !a->have_peers) {
        pthread_mutex_unlock(&a->qmu);
        tpi_format(errmsg, errmsg_len, "the agent is %s", a->stopping ? "stopping" : "not started");
        return TP_ESHUTDOWN;
    }
    tpi_tcp_direct_stop_locked(a, p); /* no sender writes to the old socket any more */
    tp_frame *dropped = p->q_head;    /* queued for the earlier incarnation */
    p->q_head = p->q_tail = NULL;
    atomic_store(&p->q_bytes, 0);
    tpi_format(p->next_addr, sizeof p->next_addr, "%s", addr);
    p->next_sa = sa;
    p->readdress = 1;
    p->dead = 0;
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_relaxed);
    tpi_tcp_mark_dirty(a, rank); /* the loop applies the address on its next turn */
    tpi_tcp_wake(a);
    pthread_mutex_unlock(&a->qmu);
    free_frames(dropped);
    return TP_OK;
}
