/*
 * tcp_store_server.c: the rendezvous store server rank 0 runs for tcp:// and
 * env:// (spec/tcp.md TCP-9..11, TCP-18). One thread runs its own uv_loop:
 * the listening socket (polled, accepted by hand so that accepting can be
 * paused), a wake-up async handle, and the clients. Each request runs
 * against a private ":memory:" SQLite store (store/sqlite_store.c), so the
 * semantics are exactly STORE-1..5's.
 *
 * Nothing in the thread blocks: a reply is a queued uv_write, and a client's
 * bytes are taken as they come. Every client is bounded (TCP-18): a deadline
 * for its handshake, one for each request from its first byte, one for
 * taking its replies; a cap on the reply bytes it leaves unsent; a request
 * buffer that grows as bytes arrive up to one request; and a memory budget
 * and connection caps across all of them. Every byte from a client is
 * checked (tcp_store_wire.c): a malformed handshake or request drops that
 * client only, with a log line naming it and why.
 *
 * Stopping (TCP-11): the listener stays open until every rank of the job
 * announced with tpi_store_server_expect has come (its handshake names its
 * rank), so a rank that starts late still finds the store and, say, the init
 * error rank 0 published; then it closes, and the clients still connected
 * are served until they all disconnect. All of it is bounded by the linger
 * time.
 */
#define _GNU_SOURCE /* accept4: Linux, as libuv's epoll backend is */
#include <errno.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_internal.h"

typedef enum srv_state {
    SRV_HELLO = 1, /* waiting for the client's 28-byte hello */
    SRV_PROOF = 2, /* hello answered; waiting for its proof (TCP-17) */
    SRV_OPEN = 3,  /* authenticated (or auth=off): requests */
    SRV_CLOSED = 4 /* handles closing; freed by the last close callback */
} srv_state;

typedef struct srv_client srv_client;
struct srv_client {
    uv_tcp_t tcp; /* data: the client */
    uv_timer_t timer;
    tpi_store_server *s;
    srv_client *prev, *next;
    int handles; /* open libuv handles */
    srv_state state;
    int close_after_write; /* the hello told it our flags; close once written */
    uint32_t rank;         /* from the handshake; UINT32_MAX: not a worker */
    uint8_t nonce_c[TPI_TCP_NONCE_SIZE], nonce_s[TPI_TCP_NONCE_SIZE];
    char addr[TPI_ADDR_LEN_MAX];
    char why[160]; /* why we close it after close_after_write (logged) */
    uint8_t *rx;   /* a unit (hello, proof, request) not complete yet */
    size_t rx_len, rx_cap;
    uint64_t accepted_ms;   /* loop time: the handshake deadline runs from here */
    uint64_t request_ms;    /* a partial request's first byte; 0: none */
    uint64_t write_wait_ms; /* replies unsent and none taken since; 0: none */
};

typedef struct srv_write {
    uv_write_t req;
    srv_client *c;
    size_t bytes;      /* counted in the server's budget until the callback */
    void *owned;       /* a payload freed with the write */
    uint8_t inline_[]; /* the head, and small payloads copied after it */
} srv_write;

struct tpi_store_server {
    tpi_tcp_auth auth; /* TCP-17: every client proves the job secret first */
    tpi_store_server_limits lim;
    char desc[TPI_ADDR_LEN_MAX];
    tp_store *db;
    pthread_t thread;
    uv_loop_t loop;
    uv_async_t wake;
    uv_poll_t listen;        /* the listening socket lfd, readable: accept */
    uv_timer_t accept_timer; /* accepting paused after EMFILE and the like */
    uv_timer_t linger_timer; /* stopping: the linger deadline */
    int lfd;                 /* -1 once the listener is closed */
    int listen_open;         /* the poll handle is not closed yet */
    uint32_t accept_backoff_ms;
    srv_client *clients; /* every client not yet freed */
    uint32_t nlive;      /* clients not closing */
    uint32_t nunauth;    /* of those, still in their handshake */
    size_t mem;          /* bytes held for clients: rx buffers and queued replies */
    uint64_t refused;    /* connections refused over a cap, not logged yet */
    uint64_t refuse_logged_ms;
    uint8_t *staging; /* TPI_TCP_STAGING_SIZE: every read lands here first */
    /* Posted by other threads, applied on the loop after a wake. */
    atomic_int stop;
    atomic_int finished;    /* the loop has returned: a join will not block */
    uint64_t linger_ns;     /* written before stop is set */
    atomic_uint expect_req; /* a world size to expect, posted by tpi_store_server_expect */
    atomic_int expect_posted;
    /* TCP-23: what new clients' sockets get (from start, then tpi_store_server_keepalive).
     * Each field alone is atomic: a client accepted while they change may
     * get a mix of two settings, each valid. */
    atomic_uint ka_idle_s, ka_intvl_s, ka_cnt, ka_user_timeout_ms;
    /* Loop thread only. */
    int stopping, shutting;
    uint32_t world; /* the ranks of the job it serves */
    uint8_t *seen;  /* world entries, 1 once that rank came */
};

static tpi_store_server_limits limits_default(void) {
    return (tpi_store_server_limits){
        .handshake_ms = TPI_STORE_SERVER_HANDSHAKE_MS,
        .request_ms = TPI_STORE_SERVER_REQUEST_MS,
        .write_ms = TPI_STORE_SERVER_WRITE_MS,
        .conns_max = TPI_STORE_SERVER_CONNS_MAX,
        .unauth_max = TPI_STORE_SERVER_UNAUTH_MAX,
        .unsent_max = TPI_STORE_SERVER_UNSENT_MAX,
        .mem_max = TPI_STORE_SERVER_MEM_MAX,
    };
}

static tpi_store_server_limits test_limits;
static int test_limits_set;

void tpi_store_server_test_limits(const tpi_store_server_limits *l) {
    test_limits_set = l != NULL;
    if (l)
        test_limits = *l;
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void check_stop(tpi_store_server *s);
static void client_close(srv_client *c, const char *why_fmt, ...) TPI_PRINTF(2, 3);

/* ---- A client's life ---------------------------------------------------------------- */

static void rx_release(srv_client *c) {
    c->s->mem -= c->rx_cap;
    free(c->rx);
    c->rx = NULL;
    c->rx_len = c->rx_cap = 0;
}

static void on_client_closed(uv_handle_t *h) {
    srv_client *c = h->data;
    if (--c->handles > 0)
        return;
    tpi_store_server *s = c->s;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c);
    check_stop(s);
}

/* Closes the client; a non-empty why is logged with its address (LOG-3).
 * Queued replies are cancelled (their callbacks free them) before the close
 * callbacks run. */
static void client_close(srv_client *c, const char *why_fmt, ...) {
    if (c->state == SRV_CLOSED)
        return;
    tpi_store_server *s = c->s;
    if (why_fmt && why_fmt[0]) {
        char why[256];
        va_list ap;
        va_start(ap, why_fmt);
        tpi_vformat(why, sizeof why, why_fmt, ap);
        va_end(ap);
        tpi_log(TP_LOG_WARN, "rendezvous store %s dropped the client at %s: %s", s->desc, c->addr,
                why);
    }
    if (c->state < SRV_OPEN)
        s->nunauth--;
    s->nlive--;
    c->state = SRV_CLOSED;
    rx_release(c);
    uv_close((uv_handle_t *)&c->timer, on_client_closed);
    uv_close((uv_handle_t *)&c->tcp, on_client_closed);
}

static void on_client_timer(uv_timer_t *h);

/* Arms the client's timer for its earliest deadline (TCP-18). */
static void client_rearm(srv_client *c) {
    if (c->state == SRV_CLOSED)
        return;
    const tpi_store_server_limits *l = &c->s->lim;
    uint64_t next = UINT64_MAX;
    if (c->state < SRV_OPEN || c->close_after_write)
        next = c->accepted_ms + l->handshake_ms;
    if (c->request_ms && c->request_ms + l->request_ms < next)
        next = c->request_ms + l->request_ms;
    if (c->write_wait_ms && c->write_wait_ms + l->write_ms < next)
        next = c->write_wait_ms + l->write_ms;
    if (next == UINT64_MAX) {
        uv_timer_stop(&c->timer);
        return;
    }
    uint64_t now = uv_now(&c->s->loop);
    uv_timer_start(&c->timer, on_client_timer, next > now ? next - now : 0, 0);
}

static void on_client_timer(uv_timer_t *h) {
    srv_client *c = h->data;
    const tpi_store_server_limits *l = &c->s->lim;
    uint64_t now = uv_now(&c->s->loop);
    if ((c->state < SRV_OPEN || c->close_after_write) && now >= c->accepted_ms + l->handshake_ms)
        client_close(c, "no complete handshake within %u ms", (unsigned)l->handshake_ms);
    else if (c->request_ms && now >= c->request_ms + l->request_ms)
        client_close(c, "a request not complete %u ms after its first byte (%zu bytes came)",
                     (unsigned)l->request_ms, c->rx_len);
    else if (c->write_wait_ms && now >= c->write_wait_ms + l->write_ms)
        client_close(c, "it does not read its replies (%zu bytes unsent for %u ms)",
                     uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp), (unsigned)l->write_ms);
    else
        client_rearm(c);
}

/* ---- Replies: queued writes, never a blocking send --------------------------------- */

static void on_write(uv_write_t *req, int status) {
    srv_write *w = (srv_write *)req;
    srv_client *c = w->c;
    c->s->mem -= w->bytes;
    free(w->owned);
    free(w);
    if (status < 0 || c->state == SRV_CLOSED) {
        client_close(c, NULL); /* gone, or cancelled by our close */
        return;
    }
    size_t unsent = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    c->write_wait_ms = unsent ? uv_now(&c->s->loop) : 0; /* it took some: progress */
    if (c->close_after_write && unsent == 0)
        client_close(c, "%s", c->why);
    else
        client_rearm(c);
}

/* Queues head (copied, with n_copy bytes of copy after it) and owned (taken:
 * freed with the write, or now on failure). 0, or -1 when the client was
 * dropped (the budget, its unsent bound, or the socket). */
static int client_queue(srv_client *c, const void *head, size_t head_len, const void *copy,
                        size_t n_copy, void *owned, size_t n_owned) {
    tpi_store_server *s = c->s;
    size_t bytes = head_len + n_copy + n_owned;
    if (c->state == SRV_CLOSED) {
        free(owned);
        return -1;
    }
    if (s->mem + bytes > s->lim.mem_max) {
        free(owned);
        client_close(c, "a reply of %zu bytes would pass the server's memory budget (%zu bytes)",
                     bytes, s->lim.mem_max);
        return -1;
    }
    srv_write *w = malloc(sizeof *w + head_len + n_copy);
    if (!w) {
        free(owned);
        client_close(c, "out of memory for a reply");
        return -1;
    }
    memcpy(w->inline_, head, head_len);
    if (n_copy)
        memcpy(w->inline_ + head_len, copy, n_copy);
    w->c = c;
    w->bytes = bytes;
    w->owned = owned;
    uv_buf_t bufs[2] = {uv_buf_init((char *)w->inline_, (unsigned)(head_len + n_copy)),
                        uv_buf_init(owned, (unsigned)n_owned)};
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, bufs, n_owned ? 2 : 1, on_write);
    if (rc < 0) {
        free(owned);
        free(w);
        client_close(c, NULL); /* the socket is gone */
        return -1;
    }
    s->mem += bytes;
    size_t unsent = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    if (unsent > s->lim.unsent_max) {
        client_close(c, "it does not read its replies (%zu bytes unsent, over the bound of %zu)",
                     unsent, s->lim.unsent_max);
        return -1;
    }
    if (unsent && !c->write_wait_ms)
        c->write_wait_ms = uv_now(&s->loop);
    return 0;
}

/* A reply: head, then payload (copied when owned is NULL, else taken). */
static int reply(srv_client *c, tp_status st, uint8_t aux, const void *payload, size_t n,
                 void *owned) {
    uint8_t head[TPI_STORE_REPLY_HEAD_LEN];
    tpi_store_reply_head_encode(head, st, aux, (uint32_t)n);
    if (owned)
        return client_queue(c, head, sizeof head, NULL, 0, owned, n);
    return client_queue(c, head, sizeof head, payload, n, NULL, 0);
}

/* The store's message without its ":memory:" prefix: the client names the server. */
static const char *store_text(tpi_store_server *s) {
    static const char prefix[] = "store ':memory:': ";
    const char *m = s->db->errmsg;
    return strncmp(m, prefix, sizeof prefix - 1) == 0 ? m + sizeof prefix - 1 : m;
}

static int reply_status(srv_client *c, tp_status st) {
    if (st == TP_OK)
        return reply(c, st, 0, NULL, 0, NULL);
    const char *m = store_text(c->s);
    return reply(c, st, 0, m, strlen(m), NULL);
}

/* ---- One request (TCP-10) ----------------------------------------------------------- */

/* A scan's reply, built entry by entry (TPI_STORE_SCAN). */
typedef struct scan_reply {
    const uint8_t *after; /* keys up to this one were sent already */
    uint32_t after_len;
    uint8_t *buf;
    size_t len, cap;
    int more, oom;
} scan_reply;

static int scan_collect(void *arg, const char *key, const void *value, size_t vlen) {
    scan_reply *r = arg;
    size_t kl = strlen(key);
    if (r->after) {
        size_t n = kl < r->after_len ? kl : r->after_len;
        int cmp = memcmp(key, r->after, n);
        if (cmp < 0 || (cmp == 0 && kl <= r->after_len))
            return 0; /* sent in an earlier reply */
    }
    size_t need = 2 + kl + 4 + vlen;
    if (r->len + need > TPI_STORE_SCAN_REPLY_MAX) {
        r->more = 1; /* the client asks again after the last key sent */
        return 1;
    }
    if (r->len + need > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + need)
            cap *= 2;
        uint8_t *b = realloc(r->buf, cap);
        if (!b) {
            r->oom = 1;
            return 1;
        }
        r->buf = b;
        r->cap = cap;
    }
    uint8_t *p = r->buf + r->len;
    p[0] = (uint8_t)kl;
    p[1] = (uint8_t)(kl >> 8);
    memcpy(p + 2, key, kl);
    put_u32(p + 2 + kl, (uint32_t)vlen);
    if (vlen)
        memcpy(p + 6 + kl, value, vlen);
    r->len += need;
    return 0;
}

#define SCAN_OOM_TEXT "out of memory building a scan reply"

static void run_scan(srv_client *c, const char *key, const tpi_store_request *rq) {
    tp_store *db = c->s->db;
    scan_reply r = {.after = rq->has_a ? rq->a : NULL, .after_len = rq->a_len};
    tp_status st = db->ops->scan(db, key, scan_collect, &r);
    if (st == TP_OK && r.oom)
        st = TP_ENOMEM;
    if (st == TP_OK && r.len)
        reply(c, st, (uint8_t)r.more, r.buf, r.len, r.buf);
    else {
        free(r.buf);
        if (st == TP_OK)
            reply(c, st, (uint8_t)r.more, NULL, 0, NULL);
        else if (r.oom) /* the store itself is fine: its last message is not this error */
            reply(c, st, 0, SCAN_OOM_TEXT, sizeof SCAN_OOM_TEXT - 1, NULL);
        else
            reply_status(c, st);
    }
}

/* Runs one decoded request and queues its reply. */
static void run_request(srv_client *c, const tpi_store_request *rq) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    memcpy(key, rq->key, rq->key_len);
    key[rq->key_len] = '\0';
    if (strlen(key) != rq->key_len) {
        const char *m = "key contains a NUL byte";
        reply(c, TP_EINVAL, 0, m, strlen(m), NULL);
        return;
    }
    tp_store *db = c->s->db;
    switch (rq->op) {
    case TPI_STORE_SET:
        reply_status(c, db->ops->set(db, key, rq->a, rq->a_len));
        return;
    case TPI_STORE_GET: {
        void *v = NULL;
        size_t n = 0;
        tp_status st = db->ops->get(db, key, &v, &n);
        if (st == TP_OK && n)
            reply(c, st, 0, v, n, v);
        else {
            free(v);
            reply_status(c, st);
        }
        return;
    }
    case TPI_STORE_ADD: {
        int64_t result = 0;
        tp_status st = db->ops->add(db, key, rq->delta, &result);
        uint8_t out[8];
        put_u32(out, (uint32_t)(uint64_t)result);
        put_u32(out + 4, (uint32_t)((uint64_t)result >> 32));
        if (st == TP_OK)
            reply(c, st, 0, out, sizeof out, NULL);
        else
            reply_status(c, st);
        return;
    }
    case TPI_STORE_CAS: {
        int swapped = 0;
        const uint8_t *expected = (rq->flags & 1u) ? (rq->a ? rq->a : (const uint8_t *)"") : NULL;
        tp_status st =
            db->ops->compare_set(db, key, expected, rq->a_len, rq->b, rq->b_len, &swapped);
        if (st == TP_OK)
            reply(c, st, (uint8_t)swapped, NULL, 0, NULL);
        else
            reply_status(c, st);
        return;
    }
    case TPI_STORE_DEL:
        reply_status(c, db->ops->del(db, key));
        return;
    case TPI_STORE_SCAN:
        run_scan(c, key, rq);
        return;
    default:
        TPI_ASSERT(0 && "the decoder lets no other op through");
    }
}

/* ---- The handshake (TCP-10, TCP-17) ------------------------------------------------- */

/* What both store proofs cover: the client's rank and both nonces. */
static size_t proof_ctx(const srv_client *c, uint8_t ctx[TPI_TCP_AUTH_CTX_MAX]) {
    put_u32(ctx, c->rank);
    memcpy(ctx + 4, c->nonce_c, TPI_TCP_NONCE_SIZE);
    memcpy(ctx + 4 + TPI_TCP_NONCE_SIZE, c->nonce_s, TPI_TCP_NONCE_SIZE);
    return 4 + 2 * TPI_TCP_NONCE_SIZE;
}

/* The client is in: its rank counts as come (TCP-11). */
static void client_admitted(srv_client *c) {
    tpi_store_server *s = c->s;
    c->state = SRV_OPEN;
    s->nunauth--;
    if (c->rank < s->world)
        s->seen[c->rank] = 1;
    check_stop(s);
}

static void on_hello(srv_client *c, const uint8_t *hello) {
    tpi_store_server *s = c->s;
    uint8_t flags = s->auth.on ? 1 : 0;
    static const uint8_t want[5] = {'T', 'P', 'S', 'T', TPI_STORE_PROTO_VERSION};
    if (memcmp(hello, want, sizeof want) != 0 || hello[6] || hello[7]) {
        client_close(c, "not a tensorplay store handshake of this version");
        return;
    }
    uint8_t back[TPI_STORE_SERVER_HELLO_LEN] = {'T', 'P', 'S', 'T', TPI_STORE_PROTO_VERSION, flags};
    c->rank = get_u32(hello + 8);
    memcpy(c->nonce_c, hello + 12, sizeof c->nonce_c);
    if (s->auth.on) {
        if (tpi_tcp_auth_nonce(c->nonce_s) != 0) {
            client_close(c, "no random nonce for its handshake");
            return;
        }
        uint8_t ctx[TPI_TCP_AUTH_CTX_MAX];
        size_t n = proof_ctx(c, ctx);
        memcpy(back + 8, c->nonce_s, TPI_TCP_NONCE_SIZE);
        if (tpi_tcp_auth_proof(&s->auth, "tp/store/server v1", ctx, n, back + 24) != 0) {
            client_close(c, "no memory to prove itself to it");
            return;
        }
    }
    if (client_queue(c, back, sizeof back, NULL, 0, NULL, 0) != 0)
        return;
    if (hello[5] != flags) {
        /* A client whose auth differs hears our flags and goes (TCP-17). */
        tpi_format(c->why, sizeof c->why, "%s",
                   s->auth.on ? "it does not authenticate (auth=off), this store does"
                              : "it authenticates, this store has auth=off");
        c->close_after_write = 1;
        uv_read_stop((uv_stream_t *)&c->tcp);
        return;
    }
    if (s->auth.on)
        c->state = SRV_PROOF;
    else
        client_admitted(c);
}

static void on_proof(srv_client *c, const uint8_t *proof) {
    uint8_t ctx[TPI_TCP_AUTH_CTX_MAX];
    size_t n = proof_ctx(c, ctx);
    int ok = tpi_tcp_auth_check(&c->s->auth, "tp/store/client v1", ctx, n, proof);
    if (ok < 0) {
        client_close(c, "no memory to check its proof");
        return;
    }
    if (!ok) {
        /* The stranger is dropped; it read nothing and wrote nothing. */
        client_close(c, "its proof of the job secret is wrong (TCP-17)");
        return;
    }
    if (client_queue(c, TPI_STORE_AUTH_OK, 4, NULL, 0, NULL, 0) == 0)
        client_admitted(c);
}

/* ---- Reading: units as their bytes come -------------------------------------------- */

/* Appends to the client's buffer, growing it toward (never past) total, the
 * size of the unit being read; -1 when the client was dropped. */
static int rx_append(srv_client *c, const uint8_t *p, size_t n, size_t total) {
    tpi_store_server *s = c->s;
    TPI_ASSERT(c->rx_len + n <= total);
    if (c->rx_len + n > c->rx_cap) {
        size_t cap = c->rx_cap ? c->rx_cap * 2 : 256;
        if (cap < c->rx_len + n)
            cap = c->rx_len + n;
        if (cap > total)
            cap = total;
        if (s->mem + (cap - c->rx_cap) > s->lim.mem_max) {
            client_close(c, "its request would pass the server's memory budget (%zu bytes)",
                         s->lim.mem_max);
            return -1;
        }
        uint8_t *b = realloc(c->rx, cap);
        if (!b) {
            client_close(c, "out of memory for its request");
            return -1;
        }
        s->mem += cap - c->rx_cap;
        c->rx = b;
        c->rx_cap = cap;
    }
    memcpy(c->rx + c->rx_len, p, n);
    c->rx_len += n;
    return 0;
}

/*
 * The unit at the front of p[0..n): its total size in *total; 1 when it is
 * complete (and was handled), 0 when more bytes are needed, -1 when the
 * client was dropped.
 */
static int take_unit(srv_client *c, const uint8_t *p, size_t n, size_t *total) {
    if (c->state == SRV_HELLO || c->state == SRV_PROOF) {
        *total = c->state == SRV_HELLO ? TPI_STORE_HANDSHAKE_LEN : TPI_TCP_PROOF_SIZE;
        if (n < *total)
            return 0;
        if (c->state == SRV_HELLO)
            on_hello(c, p);
        else
            on_proof(c, p);
        return c->state == SRV_CLOSED ? -1 : 1;
    }
    tpi_store_request rq;
    const char *why = NULL;
    long k = tpi_store_request_decode(p, n, &rq, total, &why);
    if (k < 0) {
        client_close(c, "%s", why);
        return -1;
    }
    if (k == 0)
        return 0;
    c->request_ms = 0;
    run_request(c, &rq);
    return c->state == SRV_CLOSED ? -1 : 1;
}

/* Takes n bytes the client sent: whole units straight from p, a partial one
 * into the client's buffer (only up to the end of that unit). */
static void consume(srv_client *c, const uint8_t *p, size_t n) {
    while (c->state != SRV_CLOSED && !c->close_after_write) {
        size_t total = 0;
        if (c->rx_len > 0) {
            int rc = take_unit(c, c->rx, c->rx_len, &total);
            if (rc < 0)
                return;
            if (rc > 0) {
                c->rx_len = 0;
                if (c->rx_cap > TPI_STORE_SERVER_RX_KEEP)
                    rx_release(c);
                continue;
            }
            if (n == 0)
                break;
            size_t take = total - c->rx_len < n ? total - c->rx_len : n;
            if (rx_append(c, p, take, total) != 0)
                return;
            p += take;
            n -= take;
            continue;
        }
        if (n == 0)
            break;
        int rc = take_unit(c, p, n, &total);
        if (rc < 0)
            return;
        if (rc > 0) {
            TPI_ASSERT(total <= n);
            p += total;
            n -= total;
            continue;
        }
        if (rx_append(c, p, n, total) != 0)
            return;
        n = 0;
    }
    if (c->state == SRV_OPEN && c->rx_len > 0 && !c->request_ms)
        c->request_ms = uv_now(&c->s->loop); /* TCP-18: a request's deadline runs */
    client_rearm(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    srv_client *c = h->data;
    buf->base = (char *)c->s->staging;
    buf->len = TPI_TCP_STAGING_SIZE;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    srv_client *c = st->data;
    if (c->state == SRV_CLOSED)
        return;
    if (nread < 0) {
        if (c->rx_len && c->state == SRV_OPEN)
            client_close(c, "it closed in the middle of a request (%zu bytes came)", c->rx_len);
        else
            client_close(c, NULL); /* it left */
        return;
    }
    consume(c, (const uint8_t *)buf->base, (size_t)nread);
}

/* ---- Accepting ---------------------------------------------------------------------- */

static void on_listen(uv_poll_t *h, int status, int events);

static void on_accept_timer(uv_timer_t *h) {
    tpi_store_server *s = h->data;
    if (s->lfd >= 0 && !s->shutting)
        uv_poll_start(&s->listen, UV_READABLE, on_listen);
}

/* Out of descriptors or memory: stop accepting for a while instead of
 * spinning on the same waiting connection. */
static void accept_pause(tpi_store_server *s, int err) {
    s->accept_backoff_ms =
        s->accept_backoff_ms ? s->accept_backoff_ms * 2 : TPI_STORE_SERVER_ACCEPT_BACKOFF_MIN_MS;
    if (s->accept_backoff_ms > TPI_STORE_SERVER_ACCEPT_BACKOFF_MAX_MS)
        s->accept_backoff_ms = TPI_STORE_SERVER_ACCEPT_BACKOFF_MAX_MS;
    uv_poll_stop(&s->listen);
    uv_timer_start(&s->accept_timer, on_accept_timer, s->accept_backoff_ms, 0);
    if (s->accept_backoff_ms == TPI_STORE_SERVER_ACCEPT_BACKOFF_MIN_MS)
        tpi_log(TP_LOG_WARN, "rendezvous store %s cannot accept connections: %s (retrying)",
                s->desc, strerror(err));
}

/* A connection over a cap is closed at once; the log says so once a second. */
static void refuse(tpi_store_server *s, int fd, const char *addr) {
    close(fd);
    s->refused++;
    uint64_t now = uv_now(&s->loop);
    if (s->refuse_logged_ms && now - s->refuse_logged_ms < TPI_STORE_SERVER_REFUSE_LOG_MS)
        return;
    tpi_log(TP_LOG_WARN,
            "rendezvous store %s refused %llu connection(s), the last from %s: %u clients "
            "(cap %u), %u in their handshake (cap %u)",
            s->desc, (unsigned long long)s->refused, addr, (unsigned)s->nlive,
            (unsigned)s->lim.conns_max, (unsigned)s->nunauth, (unsigned)s->lim.unauth_max);
    s->refused = 0;
    s->refuse_logged_ms = now ? now : 1;
}

/* TCP_NODELAY, and the keepalive and user timeout that find a vanished host
 * (TCP-23): an authenticated client has no idle deadline. Best effort. */
static void socket_tune(srv_client *c, int fd) {
    uv_tcp_nodelay(&c->tcp, 1);
    tpi_store_server *s = c->s;
    tpi_tcp_keepalive ka = {
        .idle_s = atomic_load_explicit(&s->ka_idle_s, memory_order_relaxed),
        .intvl_s = atomic_load_explicit(&s->ka_intvl_s, memory_order_relaxed),
        .cnt = atomic_load_explicit(&s->ka_cnt, memory_order_relaxed),
        .user_timeout_ms = atomic_load_explicit(&s->ka_user_timeout_ms, memory_order_relaxed),
    };
    tpi_tcp_keepalive_apply(fd, &ka);
}

static void admit(tpi_store_server *s, int fd, const struct sockaddr *sa) {
    char addr[TPI_ADDR_LEN_MAX];
    tpi_tcp_format_sockaddr(sa, addr, sizeof addr);
    if (s->nlive >= s->lim.conns_max || s->nunauth >= s->lim.unauth_max) {
        refuse(s, fd, addr);
        return;
    }
    srv_client *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    uv_tcp_init(&s->loop, &c->tcp);
    uv_timer_init(&s->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->handles = 2;
    c->s = s;
    c->rank = UINT32_MAX;
    c->state = SRV_HELLO;
    c->accepted_ms = uv_now(&s->loop);
    memcpy(c->addr, addr, sizeof addr);
    c->next = s->clients;
    if (s->clients)
        s->clients->prev = c;
    s->clients = c;
    s->nlive++;
    s->nunauth++;
    if (uv_tcp_open(&c->tcp, fd) != 0) {
        close(fd); /* not the handle's yet */
        client_close(c, NULL);
        return;
    }
    socket_tune(c, fd);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
        client_close(c, NULL);
        return;
    }
    client_rearm(c);
}

static void on_listen(uv_poll_t *h, int status, int events) {
    (void)events;
    tpi_store_server *s = h->data;
    if (status < 0) {
        accept_pause(s, -status);
        return;
    }
    for (unsigned i = 0; i < TPI_STORE_SERVER_ACCEPTS_PER_TURN && s->lfd >= 0; i++) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        int fd = accept4(s->lfd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0)
            fd = tpi_fd_above_stdio(fd); /* TCP-27: a program may close its stdio after init */
        if (fd >= 0) {
            s->accept_backoff_ms = 0;
            admit(s, fd, (struct sockaddr *)&sa);
            continue;
        }
        int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK)
            return;
        if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
            accept_pause(s, err);
            return;
        }
        /* EINTR, ECONNABORTED, and the network errors Linux passes on for one
         * connection (accept(2)): the next accept is another connection. */
    }
}

static void on_listener_closed(uv_handle_t *h) {
    tpi_store_server *s = h->data;
    close(s->lfd);
    s->lfd = -1;
    check_stop(s);
}

static void listener_close(tpi_store_server *s) {
    if (!s->listen_open)
        return;
    s->listen_open = 0;
    uv_timer_stop(&s->accept_timer);
    uv_close((uv_handle_t *)&s->listen, on_listener_closed);
}

/* ---- Stopping (TCP-11) ---------------------------------------------------------------- */

/* Every rank of the job came (vacuously true when no job was announced). */
static int all_seen(const tpi_store_server *s) {
    for (uint32_t r = 0; r < s->world; r++)
        if (!s->seen[r])
            return 0;
    return 1;
}

/* Closes every handle: uv_run returns once their callbacks ran. */
static void shut_all(tpi_store_server *s) {
    if (s->shutting)
        return;
    s->shutting = 1;
    if (s->refused) /* what the once-a-second log line has not told yet */
        tpi_log(TP_LOG_WARN, "rendezvous store %s refused %llu more connection(s) over its caps",
                s->desc, (unsigned long long)s->refused);
    listener_close(s);
    for (srv_client *c = s->clients; c; c = c->next)
        client_close(c, NULL);
    uv_close((uv_handle_t *)&s->wake, NULL);
    uv_close((uv_handle_t *)&s->accept_timer, NULL);
    uv_close((uv_handle_t *)&s->linger_timer, NULL);
}

/* Stopping: listen until every expected rank came, serve until all left. */
static void check_stop(tpi_store_server *s) {
    if (!s->stopping || s->shutting)
        return;
    if (s->listen_open && all_seen(s))
        listener_close(s);
    if (s->lfd < 0 && s->nlive == 0)
        shut_all(s);
}

static void on_linger(uv_timer_t *h) {
    shut_all(h->data);
}

/* A new job's world: its ranks count as come if connected now, or later. */
static void apply_expect(tpi_store_server *s, uint32_t world) {
    uint8_t *seen = calloc(world ? world : 1, 1);
    if (!seen)
        return; /* keeps the previous job's view: at worst stops listening early */
    for (srv_client *c = s->clients; c; c = c->next)
        if (c->state == SRV_OPEN && c->rank < world)
            seen[c->rank] = 1;
    free(s->seen);
    s->seen = seen;
    s->world = world;
}

static void on_wake(uv_async_t *h) {
    tpi_store_server *s = h->data;
    if (atomic_exchange(&s->expect_posted, 0))
        apply_expect(s, atomic_load(&s->expect_req));
    if (atomic_load(&s->stop) && !s->stopping) {
        s->stopping = 1;
        uv_timer_start(&s->linger_timer, on_linger, tpi_tcp_ms_ceil(s->linger_ns), 0);
    }
    check_stop(s);
}

static void *server_main(void *arg) {
    tpi_store_server *s = arg;
    uv_run(&s->loop, UV_RUN_DEFAULT);
    atomic_store(&s->finished, 1);
    return NULL;
}

/* ---- Start and stop ------------------------------------------------------------------- */

/* The listening socket, bound and listening; the fd or -errno. */
static int listen_socket(const struct sockaddr *sa, socklen_t sa_len) {
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(fd, sa, sa_len) < 0 || listen(fd, TPI_TCP_BACKLOG) < 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return -err;
    }
    return fd;
}

/* The loop and its handles; the listener's poll is started. 0 or a uv error. */
static int loop_setup(tpi_store_server *s) {
    int rc = uv_loop_init(&s->loop);
    if (rc < 0)
        return rc;
    /* Its eventfd may be made here (libuv versions differ): without it,
     * stop could not wake the loop. */
    rc = uv_async_init(&s->loop, &s->wake, on_wake);
    if (rc < 0) {
        uv_loop_close(&s->loop);
        return rc;
    }
    uv_timer_init(&s->loop, &s->accept_timer);
    uv_timer_init(&s->loop, &s->linger_timer);
    s->wake.data = s->accept_timer.data = s->linger_timer.data = s;
    rc = uv_poll_init(&s->loop, &s->listen, s->lfd);
    if (rc == 0) {
        s->listen.data = s;
        s->listen_open = 1;
        rc = uv_poll_start(&s->listen, UV_READABLE, on_listen);
    }
    if (rc < 0) {
        /* Close what was opened; the caller closes lfd. */
        if (s->listen_open)
            uv_close((uv_handle_t *)&s->listen, NULL);
        s->listen_open = 0;
        uv_close((uv_handle_t *)&s->wake, NULL);
        uv_close((uv_handle_t *)&s->accept_timer, NULL);
        uv_close((uv_handle_t *)&s->linger_timer, NULL);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
    }
    return rc;
}

tp_status tpi_store_server_start(const struct sockaddr *sa, socklen_t sa_len, const char *desc,
                                 const tpi_tcp_auth *auth, const tpi_tcp_keepalive *kap,
                                 tpi_store_server **out, char *errmsg, size_t errmsg_len) {
    *out = NULL;
    tpi_store_server *s = calloc(1, sizeof *s);
    uint8_t *staging = malloc(TPI_TCP_STAGING_SIZE);
    if (!s || !staging) {
        free(s);
        free(staging);
        tpi_format(errmsg, errmsg_len, "out of memory for the store server");
        return TP_ENOMEM;
    }
    s->staging = staging;
    s->auth = *auth;
    s->lim = test_limits_set ? test_limits : limits_default();
    atomic_init(&s->stop, 0);
    atomic_init(&s->expect_req, 0);
    atomic_init(&s->expect_posted, 0);
    /* The job's own from the first client on: one that dials while the
     * server starts must not get the defaults instead (TCP-23). */
    tpi_tcp_keepalive ka = kap ? *kap : tpi_tcp_keepalive_default();
    atomic_init(&s->ka_idle_s, ka.idle_s);
    atomic_init(&s->ka_intvl_s, ka.intvl_s);
    atomic_init(&s->ka_cnt, ka.cnt);
    atomic_init(&s->ka_user_timeout_ms, ka.user_timeout_ms);
    tpi_format(s->desc, sizeof s->desc, "%s", desc);
    s->lfd = listen_socket(sa, sa_len);
    if (s->lfd < 0) {
        tp_status st = tpi_errno_status(-s->lfd, TP_EBACKEND);
        tpi_format(errmsg, errmsg_len, "cannot serve the rendezvous store on %s: %s", desc,
                   strerror(-s->lfd));
        free(staging);
        free(s);
        return st;
    }
    char err[TP_ERRMSG_LEN_MAX];
    tp_status st = tp_sqlite_store_open(":memory:", &s->db, err, sizeof err);
    if (st != TP_OK) {
        tpi_format(errmsg, errmsg_len, "store server: %s", err);
    } else {
        int rc = loop_setup(s);
        if (rc < 0) {
            tpi_format(errmsg, errmsg_len, "store server: cannot start its event loop: %s",
                       uv_strerror(rc));
            st = tpi_uv_status(rc, TP_EBACKEND);
        } else if (tpi_tcp_thread_create(&s->thread, server_main, s) != 0) {
            tpi_format(errmsg, errmsg_len, "store server: cannot start its thread");
            st = TP_ENOMEM;
            atomic_store(&s->stop, 1); /* linger 0: the loop closes everything at once */
            on_wake(&s->wake);
            uv_run(&s->loop, UV_RUN_DEFAULT);
            uv_loop_close(&s->loop);
            s->lfd = -1; /* closed by the listener's close callback */
        }
    }
    if (st != TP_OK) {
        if (s->db)
            s->db->ops->close(s->db);
        if (s->lfd >= 0)
            close(s->lfd);
        tpi_tcp_auth_clear(&s->auth);
        free(staging);
        free(s);
        return st;
    }
    *out = s;
    return TP_OK;
}

void tpi_store_server_expect(tpi_store_server *s, uint32_t world_size) {
    atomic_store(&s->expect_req, world_size);
    atomic_store(&s->expect_posted, 1);
    uv_async_send(&s->wake);
}

void tpi_store_server_keepalive(tpi_store_server *s, const tpi_tcp_keepalive *ka) {
    TPI_ASSERT(s && ka);
    atomic_store_explicit(&s->ka_idle_s, ka->idle_s, memory_order_relaxed);
    atomic_store_explicit(&s->ka_intvl_s, ka->intvl_s, memory_order_relaxed);
    atomic_store_explicit(&s->ka_cnt, ka->cnt, memory_order_relaxed);
    atomic_store_explicit(&s->ka_user_timeout_ms, ka->user_timeout_ms, memory_order_relaxed);
}

void tpi_store_server_stop_async(tpi_store_server *s, uint64_t linger_ns) {
    TPI_ASSERT(s && !atomic_load(&s->stop));
    s->linger_ns = linger_ns;
    atomic_store(&s->stop, 1);
    uv_async_send(&s->wake);
}

int tpi_store_server_finished(const tpi_store_server *s) {
    TPI_ASSERT(s && atomic_load(&s->stop));
    return atomic_load(&s->finished);
}

void tpi_store_server_stop(tpi_store_server *s, uint64_t linger_ns) {
    if (!s)
        return;
    tpi_store_server_stop_async(s, linger_ns);
    tpi_store_server_join(s);
}

void tpi_store_server_join(tpi_store_server *s) {
    TPI_ASSERT(s && atomic_load(&s->stop));
    pthread_join(s->thread, NULL);
    int rc = uv_loop_close(&s->loop);
    TPI_ASSERT(rc == 0 && "a store server handle outlived stop");
    TPI_ASSERT(s->lfd < 0 && !s->clients && s->mem == 0);
    s->db->ops->close(s->db);
    free(s->seen);
    free(s->staging);
    tpi_tcp_auth_clear(&s->auth);
    free(s);
}
