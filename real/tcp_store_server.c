/*
 * tcp_store_server.c: the rendezvous store server rank 0 runs for tcp:// and
 * env:// (spec/tcp.md TCP-9..11). One thread, poll() over the listener, a
 * wake-up pipe and the clients; each request runs against a private
 * ":memory:" SQLite store (store/sqlite_store.c), so the semantics are
 * exactly STORE-1..5's. Every byte from a client is checked: a malformed
 * handshake or request drops that client only.
 *
 * Stopping (TCP-11): the listener stays open until every rank of the job
 * announced with tpi_store_server_expect has come (its handshake names its
 * rank), so a rank that starts late still finds the store and, say, the init
 * error rank 0 published; then it closes, and the clients still connected
 * are served until they all disconnect. All of it is bounded by the linger
 * time.
 */
#define _GNU_SOURCE /* accept4, pipe2: Linux, as libuv's epoll backend is */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_internal.h"

#define SRV_REPLY_TIMEOUT_MS 10000 /* a client that does not read its reply is dropped */
#define SRV_READ_CHUNK 65536

typedef struct srv_client {
    int fd;
    int handshaken; /* 1 after the hello, 2 once authenticated (or without auth) */
    uint32_t rank;  /* from the handshake; UINT32_MAX: not a worker */
    uint8_t nonce_c[TPI_TCP_NONCE_SIZE], nonce_s[TPI_TCP_NONCE_SIZE];
    const char *why; /* set when we drop it for what it sent (logged, LOG-3) */
    char addr[TPI_ADDR_LEN_MAX];
    uint8_t *buf;
    size_t len, cap;
} srv_client;

struct tpi_store_server {
    tpi_tcp_auth auth; /* TCP-17: every client proves the job secret first */
    int lfd;
    int wake_rd, wake_wr;
    pthread_t thread;
    tp_store *db;
    char desc[TPI_ADDR_LEN_MAX];
    srv_client *clients;
    size_t nclients, cap;
    atomic_int stop;
    uint64_t linger_ns;     /* written before stop is set */
    atomic_uint expect_req; /* a world size to expect, posted by tpi_store_server_expect */
    atomic_int expect_posted;
    uint32_t world; /* server thread: the ranks of the job it serves */
    uint8_t *seen;  /* server thread: world entries, 1 once that rank came */
    /* Server thread: accept failed for lack of descriptors or memory; the
     * listening socket is not polled until then (it would report the same
     * waiting connection at once, forever: a busy loop). */
    uint64_t accept_paused_until;
    uint64_t accept_backoff_ns;
};

#define ACCEPT_BACKOFF_MIN_NS 10000000ull  /* 10 ms */
#define ACCEPT_BACKOFF_MAX_NS 1000000000ull /* 1 s */

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p) {
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static void put_u64(uint8_t *p, uint64_t v) {
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

/* ---- One request (TCP-10) ----------------------------------------------------------- */

/* Sends a reply: u32 length, u8 status, u8 aux, u16 0, u32 payload length, payload. */
static int send_reply(srv_client *c, tp_status st, uint8_t aux, const void *payload, size_t n) {
    uint8_t head[12];
    put_u32(head, (uint32_t)(8 + n));
    head[4] = (uint8_t)st;
    head[5] = aux;
    head[6] = head[7] = 0;
    put_u32(head + 8, (uint32_t)n);
    uint64_t deadline = tpi_tcp_now_ns() + (uint64_t)SRV_REPLY_TIMEOUT_MS * 1000000ull;
    int rc = tpi_sock_send_all(c->fd, head, sizeof head, deadline);
    if (rc == 0 && n)
        rc = tpi_sock_send_all(c->fd, payload, n, deadline);
    return rc;
}

/* The store's message without its ":memory:" prefix: the client names the server. */
static const char *store_text(tpi_store_server *s) {
    static const char prefix[] = "store ':memory:': ";
    const char *m = s->db->errmsg;
    return strncmp(m, prefix, sizeof prefix - 1) == 0 ? m + sizeof prefix - 1 : m;
}

/* A blob: u32 length then bytes, within what is left of the body. */
static int take_blob(const uint8_t **p, size_t *left, const uint8_t **blob, uint32_t *n) {
    if (*left < 4)
        return 0;
    uint32_t len = get_u32(*p);
    if (len > TP_STORE_VALUE_LEN_MAX || len > *left - 4)
        return 0;
    *blob = *p + 4;
    *n = len;
    *p += 4 + len;
    *left -= 4 + (size_t)len;
    return 1;
}

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

/* Runs one request body; 0 to keep the client, -1 to drop it (malformed or gone). */
static int handle(tpi_store_server *s, srv_client *c, const uint8_t *p, size_t left) {
    if (left < 4)
        return -1;
    uint8_t op = p[0], flags = p[1];
    uint32_t key_len = (uint32_t)p[2] | (uint32_t)p[3] << 8;
    p += 4;
    left -= 4;
    if (key_len == 0 || key_len > TP_STORE_KEY_LEN_MAX || key_len > left)
        return -1;
    char key[TP_STORE_KEY_LEN_MAX + 1];
    memcpy(key, p, key_len);
    key[key_len] = '\0';
    p += key_len;
    left -= key_len;
    if (strlen(key) != key_len) {
        const char *m = "key contains a NUL byte";
        return send_reply(c, TP_EINVAL, 0, m, strlen(m)) == 0 ? 0 : -1;
    }
    tp_store *db = s->db;
    tp_status st;
    const uint8_t *a = NULL, *b = NULL;
    uint32_t an = 0, bn = 0;
    switch (op) {
    case TPI_STORE_SET:
        if (!take_blob(&p, &left, &a, &an) || left != 0)
            return -1;
        st = db->ops->set(db, key, a, an);
        break;
    case TPI_STORE_GET: {
        if (left != 0)
            return -1;
        void *v = NULL;
        size_t n = 0;
        st = db->ops->get(db, key, &v, &n);
        int rc = st == TP_OK ? send_reply(c, st, 0, v, n)
                             : send_reply(c, st, 0, store_text(s), strlen(store_text(s)));
        free(v);
        return rc == 0 ? 0 : -1;
    }
    case TPI_STORE_ADD: {
        if (left != 8)
            return -1;
        int64_t result = 0;
        st = db->ops->add(db, key, (int64_t)get_u64(p), &result);
        if (st == TP_OK) {
            uint8_t out[8];
            put_u64(out, (uint64_t)result);
            return send_reply(c, st, 0, out, sizeof out) == 0 ? 0 : -1;
        }
        break;
    }
    case TPI_STORE_CAS: {
        if (flags & ~1u)
            return -1;
        if (!take_blob(&p, &left, &a, &an) || !take_blob(&p, &left, &b, &bn) || left != 0)
            return -1;
        if (!(flags & 1u) && an != 0)
            return -1; /* "key absent" with an expected value: malformed, never an assertion */
        int swapped = 0;
        st = db->ops->compare_set(db, key, (flags & 1u) ? (a ? a : (const uint8_t *)"") : NULL, an,
                                  b, bn, &swapped);
        if (st == TP_OK)
            return send_reply(c, st, (uint8_t)swapped, NULL, 0) == 0 ? 0 : -1;
        break;
    }
    case TPI_STORE_DEL:
        if (left != 0)
            return -1;
        st = db->ops->del(db, key);
        break;
    case TPI_STORE_SCAN: {
        scan_reply r = {0};
        if (left != 0 &&
            (!take_blob(&p, &left, &r.after, &r.after_len) || left != 0 ||
             r.after_len > TP_STORE_KEY_LEN_MAX))
            return -1;
        st = db->ops->scan(db, key, scan_collect, &r);
        if (st == TP_OK && r.oom)
            st = TP_ENOMEM;
        int rc = st == TP_OK
                     ? send_reply(c, st, (uint8_t)r.more, r.buf, r.len)
                     : send_reply(c, st, 0, store_text(s), strlen(store_text(s)));
        free(r.buf);
        return rc == 0 ? 0 : -1;
    }
    default:
        return -1;
    }
    int rc = st == TP_OK ? send_reply(c, st, 0, NULL, 0)
                         : send_reply(c, st, 0, store_text(s), strlen(store_text(s)));
    return rc == 0 ? 0 : -1;
}

/* Handles every complete message in the client's buffer; -1 drops the client. */
static int process(tpi_store_server *s, srv_client *c) {
    size_t off = 0;
    uint64_t deadline = tpi_tcp_now_ns() + (uint64_t)SRV_REPLY_TIMEOUT_MS * 1000000ull;
    uint8_t ctx[TPI_TCP_AUTH_CTX_MAX];
    if (!c->handshaken) {
        if (c->len < TPI_STORE_HANDSHAKE_LEN)
            return 0;
        uint8_t flags = s->auth.on ? 1 : 0;
        const uint8_t want[8] = {'T', 'P', 'S', 'T', TPI_STORE_PROTO_VERSION, flags, 0, 0};
        /* A client whose auth differs hears our flags and goes (TCP-17). */
        if (memcmp(c->buf, want, 5) != 0 || c->buf[6] || c->buf[7]) {
            c->why = "not a tensorplay store handshake of this version";
            return -1;
        }
        uint8_t back[TPI_STORE_SERVER_HELLO_LEN] = {'T', 'P', 'S', 'T', TPI_STORE_PROTO_VERSION,
                                                    flags};
        c->rank = get_u32(c->buf + 8);
        memcpy(c->nonce_c, c->buf + 12, sizeof c->nonce_c);
        if (s->auth.on) {
            if (tpi_tcp_auth_nonce(c->nonce_s) != 0)
                return -1;
            put_u32(ctx, c->rank);
            memcpy(ctx + 4, c->nonce_c, TPI_TCP_NONCE_SIZE);
            memcpy(ctx + 4 + TPI_TCP_NONCE_SIZE, c->nonce_s, TPI_TCP_NONCE_SIZE);
            memcpy(back + 8, c->nonce_s, TPI_TCP_NONCE_SIZE);
            tpi_tcp_auth_proof(&s->auth, "tp/store/server v1", ctx, 4 + 2 * TPI_TCP_NONCE_SIZE,
                               back + 24);
        }
        if (c->buf[5] != flags)
            c->why = s->auth.on ? "it does not authenticate (auth=off), this store does"
                                : "it authenticates, this store has auth=off";
        if (tpi_sock_send_all(c->fd, back, sizeof back, deadline) != 0 || c->buf[5] != flags)
            return -1;
        c->handshaken = s->auth.on ? 1 : 2;
        off = TPI_STORE_HANDSHAKE_LEN;
    }
    if (c->handshaken == 1) { /* its proof, before any request */
        if (c->len - off < TPI_TCP_PROOF_SIZE) {
            memmove(c->buf, c->buf + off, c->len - off);
            c->len -= off;
            return 0;
        }
        put_u32(ctx, c->rank);
        memcpy(ctx + 4, c->nonce_c, TPI_TCP_NONCE_SIZE);
        memcpy(ctx + 4 + TPI_TCP_NONCE_SIZE, c->nonce_s, TPI_TCP_NONCE_SIZE);
        if (!tpi_tcp_auth_check(&s->auth, "tp/store/client v1", ctx, 4 + 2 * TPI_TCP_NONCE_SIZE,
                                c->buf + off)) {
            c->why = "its proof of the job secret is wrong (TCP-17)";
            return -1; /* the stranger is dropped; it read nothing and wrote nothing */
        }
        if (tpi_sock_send_all(c->fd, TPI_STORE_AUTH_OK, 4, deadline) != 0)
            return -1;
        c->handshaken = 2;
        off += TPI_TCP_PROOF_SIZE;
    }
    if (c->handshaken == 2 && c->rank < s->world)
        s->seen[c->rank] = 1; /* TCP-11: an authenticated rank came */
    while (c->len - off >= 4) {
        uint32_t n = get_u32(c->buf + off);
        if (n < 4 || n > TPI_STORE_MSG_MAX) {
            c->why = "a request length out of bounds";
            return -1;
        }
        if (c->len - off - 4 < n)
            break;
        if (handle(s, c, c->buf + off + 4, n) != 0) {
            c->why = "a malformed request, or a reply it did not read";
            return -1;
        }
        off += 4 + (size_t)n;
    }
    memmove(c->buf, c->buf + off, c->len - off);
    c->len -= off;
    return 0;
}

/* Reads what the client sent; -1 when it is gone or misbehaved. */
static int client_read(tpi_store_server *s, srv_client *c) {
    for (;;) {
        size_t want = c->len + SRV_READ_CHUNK;
        if (want > 4 + TPI_STORE_MSG_MAX + 8)
            want = 4 + TPI_STORE_MSG_MAX + 8;
        if (c->cap < want) {
            uint8_t *nb = realloc(c->buf, want);
            if (!nb)
                return -1;
            c->buf = nb;
            c->cap = want;
        }
        if (c->len == c->cap)
            return -1; /* a message over the limit cannot be complete (process checks first) */
        ssize_t k = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (k == 0)
            return -1;
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        c->len += (size_t)k;
        if (process(s, c) != 0)
            return -1;
    }
}

static void client_drop(tpi_store_server *s, size_t i) {
    if (s->clients[i].why)
        tpi_log(TP_LOG_WARN, "rendezvous store %s dropped the client at %s: %s", s->desc,
                s->clients[i].addr, s->clients[i].why);
    close(s->clients[i].fd);
    free(s->clients[i].buf);
    s->clients[i] = s->clients[--s->nclients];
}

static void accept_all(tpi_store_server *s) {
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
            /* Out of descriptors or memory: back off instead of spinning. */
            s->accept_backoff_ns = s->accept_backoff_ns ? s->accept_backoff_ns * 2
                                                        : ACCEPT_BACKOFF_MIN_NS;
            if (s->accept_backoff_ns > ACCEPT_BACKOFF_MAX_NS)
                s->accept_backoff_ns = ACCEPT_BACKOFF_MAX_NS;
            s->accept_paused_until = tpi_tcp_now_ns() + s->accept_backoff_ns;
            return;
        }
        if (fd < 0)
            return; /* EAGAIN, or a transient error: poll tells us again */
        s->accept_backoff_ns = 0;
        if (s->nclients == s->cap) {
            size_t cap = s->cap ? s->cap * 2 : 16;
            srv_client *nc = realloc(s->clients, cap * sizeof *nc);
            if (!nc) {
                close(fd);
                continue;
            }
            s->clients = nc;
            s->cap = cap;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        srv_client *c = &s->clients[s->nclients++];
        *c = (srv_client){.fd = fd, .rank = UINT32_MAX};
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        if (getpeername(fd, (struct sockaddr *)&sa, &len) == 0)
            tpi_tcp_format_sockaddr((struct sockaddr *)&sa, c->addr, sizeof c->addr);
        else
            tpi_format(c->addr, sizeof c->addr, "(unknown address)");
    }
}

/* A new job's world: its ranks count as come if connected now, or later. */
static void apply_expect(tpi_store_server *s, uint32_t world) {
    uint8_t *seen = calloc(world ? world : 1, 1);
    if (!seen)
        return; /* keeps the previous job's view: at worst stops listening early */
    for (size_t i = 0; i < s->nclients; i++)
        if (s->clients[i].handshaken == 2 && s->clients[i].rank < world)
            seen[s->clients[i].rank] = 1;
    free(s->seen);
    s->seen = seen;
    s->world = world;
}

/* Every rank of the job came (vacuously true when no job was announced). */
static int all_seen(const tpi_store_server *s) {
    for (uint32_t r = 0; r < s->world; r++)
        if (!s->seen[r])
            return 0;
    return 1;
}

static void *server_main(void *arg) {
    tpi_store_server *s = arg;
    struct pollfd *pfds = NULL;
    size_t pcap = 0;
    uint64_t linger_deadline = UINT64_MAX;
    for (;;) {
        if (linger_deadline != UINT64_MAX) {
            /* Stopping (TCP-11): listen until every expected client came,
             * serve until all left, all bounded by the linger deadline. */
            if (s->lfd >= 0 && all_seen(s)) {
                close(s->lfd);
                s->lfd = -1;
            }
            if ((s->lfd < 0 && s->nclients == 0) || tpi_tcp_now_ns() >= linger_deadline)
                break;
        }
        size_t n = 2 + s->nclients;
        if (n > pcap) {
            struct pollfd *np = realloc(pfds, n * sizeof *np);
            if (!np)
                break; /* cannot serve at all: clients see the close */
            pfds = np;
            pcap = n;
        }
        uint64_t now = tpi_tcp_now_ns();
        int accepting = s->lfd >= 0 && now >= s->accept_paused_until;
        pfds[0] = (struct pollfd){s->wake_rd, POLLIN, 0};
        pfds[1] = (struct pollfd){accepting ? s->lfd : -1, POLLIN, 0}; /* -1: not polled */
        for (size_t i = 0; i < s->nclients; i++)
            pfds[2 + i] = (struct pollfd){s->clients[i].fd, POLLIN, 0};
        int timeout = -1;
        if (linger_deadline != UINT64_MAX)
            timeout = now >= linger_deadline ? 0 : (int)((linger_deadline - now) / 1000000 + 1);
        if (s->lfd >= 0 && !accepting) {
            int left = (int)((s->accept_paused_until - now) / 1000000 + 1);
            timeout = timeout < 0 || left < timeout ? left : timeout;
        }
        int rc = poll(pfds, n, timeout);
        if (rc < 0 && errno != EINTR)
            break;
        if (pfds[0].revents) {
            char junk[16];
            while (read(s->wake_rd, junk, sizeof junk) > 0) {
            }
        }
        if (atomic_exchange(&s->expect_posted, 0))
            apply_expect(s, atomic_load(&s->expect_req));
        if (atomic_load(&s->stop) && linger_deadline == UINT64_MAX) {
            uint64_t t = tpi_tcp_now_ns();
            linger_deadline = s->linger_ns > UINT64_MAX - t ? UINT64_MAX - 1 : t + s->linger_ns;
        }
        if (rc <= 0)
            continue;
        /* Clients first, from the end, so dropping one does not move an unread one. */
        for (size_t i = n - 2; i-- > 0;) {
            if (i < s->nclients && pfds[2 + i].revents && client_read(s, &s->clients[i]) != 0)
                client_drop(s, i);
        }
        if (accepting && s->lfd >= 0 && pfds[1].revents)
            accept_all(s);
    }
    free(pfds);
    return NULL;
}

tp_status tpi_store_server_start(const struct sockaddr *sa, socklen_t sa_len, const char *desc,
                                 const tpi_tcp_auth *auth, tpi_store_server **out, char *errmsg,
                                 size_t errmsg_len) {
    *out = NULL;
    tpi_store_server *s = calloc(1, sizeof *s);
    if (!s) {
        tpi_format(errmsg, errmsg_len, "out of memory for the store server");
        return TP_ENOMEM;
    }
    s->lfd = s->wake_rd = s->wake_wr = -1;
    s->auth = *auth;
    atomic_init(&s->stop, 0);
    atomic_init(&s->expect_req, 0);
    atomic_init(&s->expect_posted, 0);
    tpi_format(s->desc, sizeof s->desc, "%s", desc);
    tp_status st = TP_OK;
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(fd, sa, sa_len) < 0 || listen(fd, TPI_TCP_BACKLOG) < 0) {
        int err = errno;
        st = tpi_errno_status(err, TP_EBACKEND);
        tpi_format(errmsg, errmsg_len, "cannot serve the rendezvous store on %s: %s", desc,
                   strerror(err));
        if (fd >= 0)
            close(fd);
        free(s);
        return st;
    }
    s->lfd = fd;
    int p[2];
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) < 0) {
        tpi_format(errmsg, errmsg_len, "store server: pipe: %s", strerror(errno));
        st = TP_EBACKEND;
    } else {
        s->wake_rd = p[0];
        s->wake_wr = p[1];
        char err[TP_ERRMSG_LEN_MAX];
        st = tp_sqlite_store_open(":memory:", &s->db, err, sizeof err);
        if (st != TP_OK)
            tpi_format(errmsg, errmsg_len, "store server: %s", err);
    }
    if (st == TP_OK && tpi_tcp_thread_create(&s->thread, server_main, s) != 0) {
        tpi_format(errmsg, errmsg_len, "store server: cannot start its thread");
        st = TP_ENOMEM;
    }
    if (st != TP_OK) {
        if (s->db)
            s->db->ops->close(s->db);
        close(s->lfd);
        if (s->wake_rd >= 0) {
            close(s->wake_rd);
            close(s->wake_wr);
        }
        free(s);
        return st;
    }
    *out = s;
    return TP_OK;
}

void tpi_store_server_expect(tpi_store_server *s, uint32_t world_size) {
    atomic_store(&s->expect_req, world_size);
    atomic_store(&s->expect_posted, 1);
    ssize_t k = write(s->wake_wr, "x", 1);
    (void)k; /* a full pipe already wakes the thread */
}

void tpi_store_server_stop(tpi_store_server *s, uint64_t linger_ns) {
    if (!s)
        return;
    s->linger_ns = linger_ns;
    atomic_store(&s->stop, 1);
    ssize_t k = write(s->wake_wr, "x", 1);
    (void)k; /* a full pipe already wakes the thread */
    pthread_join(s->thread, NULL);
    for (size_t i = s->nclients; i-- > 0;)
        client_drop(s, i);
    free(s->clients);
    if (s->lfd >= 0)
        close(s->lfd);
    close(s->wake_rd);
    close(s->wake_wr);
    s->db->ops->close(s->db);
    free(s->seen);
    tpi_tcp_auth_clear(&s->auth);
    free(s);
}
