/*
 * tcp_store.c: the rendezvous store as the TCP agent opens it (spec/tcp.md
 * TCP-9..11): init_method parsing, and the client of the TCP store server
 * behind tp_store_ops.
 *
 * init_method (default "env://"):
 * - "sqlite:///abs/path": the SQLite file store (store/sqlite_store.c);
 * - "tcp://host:port": rank 0 serves a store on host:port (tcp_store_server.c)
 *   that lives on in its process after shutdown (TCP-11); every rank, rank 0
 *   included, is a client and connects with retry until the init deadline;
 * - "env://": the same with MASTER_ADDR and MASTER_PORT from the environment;
 * - "etcd://host:port[,host:port...]/prefix": the etcd store
 *   (store/etcd_store.c, spec/etcd.md): no worker serves it, so rank 0 is
 *   like any other and may die and rejoin (ETCD-9).
 *
 * The client holds one connection and a mutex: an operation is one request
 * and its reply, bounded by TPI_STORE_OP_TIMEOUT_MS. A broken connection
 * fails that operation with TP_ESTORE (it may or may not have happened on
 * the server, so it is never replayed); the next operation reconnects once.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tcp_internal.h"

#define CLIENT_RETRY_MIN_MS 10   /* first pause between attempts to reach the store */
#define CLIENT_RETRY_MAX_MS 200  /* longest pause: bounds the delay after it comes up */
#define CLIENT_ATTEMPT_MS 1000   /* one connect attempt */
#define CLIENT_RECONNECT_MS 2000 /* a reconnect after a lost connection */

typedef struct tcp_store {
    tp_store base; /* first */
    pthread_mutex_t mu;
    int fd; /* -1 after a failure: the next operation reconnects */
    struct sockaddr_storage sa;
    socklen_t sa_len;
    char desc[TPI_ADDR_LEN_MAX];
    tpi_store_server *server; /* stopped on close, if given one */
    uint64_t linger_ns;
    uint32_t rank; /* sent in every handshake */
    tpi_tcp_auth auth; /* TCP-17: proves the job secret in every handshake */
    tpi_tcp_keepalive ka; /* TCP-23: on every connection (a silent server is found) */
} tcp_store;

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void sleep_ms(uint32_t ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static tp_status store_fail(tcp_store *s, tp_status st, const char *fmt, ...) TPI_PRINTF(3, 4);
static tp_status store_fail(tcp_store *s, tp_status st, const char *fmt, ...) {
    char *buf = s->base.errmsg;
    size_t n = tpi_format(buf, sizeof s->base.errmsg, "rendezvous store at %s: ", s->desc);
    va_list ap;
    va_start(ap, fmt);
    tpi_vformat(buf + n, sizeof s->base.errmsg - n, fmt, ap);
    va_end(ap);
    return tpi_fail_msg(st, buf);
}

/* What both store proofs cover: the client's rank and both nonces. */
static size_t store_ctx(uint32_t rank, const uint8_t *nc, const uint8_t *ns, uint8_t *ctx) {
    put_u32(ctx, rank);
    memcpy(ctx + 4, nc, TPI_TCP_NONCE_SIZE);
    memcpy(ctx + 4 + TPI_TCP_NONCE_SIZE, ns, TPI_TCP_NONCE_SIZE);
    return 4 + 2 * TPI_TCP_NONCE_SIZE;
}

/* One attempt: connect and exchange the handshake (TCP-10, TCP-17). The fd,
 * or -errno: -EPROTO when something answered that is not a store, -EACCES
 * when the store or this client failed the other's proof, -ENOMEM when a
 * proof could not be computed (tried again, as a refused connection is). */
static int connect_once(const struct sockaddr *sa, socklen_t sa_len, uint32_t rank,
                        const tpi_tcp_auth *auth, int timeout_ms) {
    int fd = tpi_sock_connect(sa, sa_len, timeout_ms);
    if (fd < 0)
        return fd;
    uint8_t flags = auth->on ? 1 : 0;
    uint8_t hello[TPI_STORE_HANDSHAKE_LEN] = {'T', 'P', 'S', 'T', TPI_STORE_PROTO_VERSION, flags};
    put_u32(hello + 8, rank);
    uint8_t *nc = hello + 12;
    int rc = auth->on && tpi_tcp_auth_nonce(nc) != 0 ? -EIO : 0;
    uint8_t back[TPI_STORE_SERVER_HELLO_LEN];
    uint64_t deadline = tpi_tcp_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    if (rc == 0)
        rc = tpi_sock_send_all(fd, hello, sizeof hello, deadline);
    if (rc == 0) /* the first 8 bytes tell a store from something else */
        rc = tpi_sock_recv_all(fd, back, 8, deadline);
    if (rc == 0 && (memcmp(back, "TPST", 4) != 0 || back[4] != TPI_STORE_PROTO_VERSION))
        rc = -EPROTO;
    if (rc == 0)
        rc = tpi_sock_recv_all(fd, back + 8, sizeof back - 8, deadline);
    if (rc == 0 && (back[5] != flags || back[6] || back[7]))
        rc = -EACCES; /* one end authenticates and the other does not */
    if (rc == 0 && auth->on) {
        uint8_t ctx[TPI_TCP_AUTH_CTX_MAX], proof[TPI_TCP_PROOF_SIZE], ok[4];
        size_t n = store_ctx(rank, nc, back + 8, ctx);
        int proved = tpi_tcp_auth_check(auth, "tp/store/server v1", ctx, n, back + 24);
        if (proved < 0 ||
            (proved == 1 && tpi_tcp_auth_proof(auth, "tp/store/client v1", ctx, n, proof) != 0))
            rc = -ENOMEM; /* OpenSSL's HMAC could not run: no verdict on the store */
        else if (!proved)
            rc = -EACCES; /* not our job's store: tell it nothing */
        if (rc == 0)
            rc = tpi_sock_send_all(fd, proof, sizeof proof, deadline);
        if (rc == 0) {
            rc = tpi_sock_recv_all(fd, ok, sizeof ok, deadline);
            if (rc == TPI_SOCK_EOF || (rc == 0 && memcmp(ok, TPI_STORE_AUTH_OK, 4) != 0))
                rc = -EACCES; /* the store refused our proof */
        }
    }
    if (rc != 0) {
        close(fd);
        /* A server that closes on us while stopping is as good as absent. */
        return rc == TPI_SOCK_EOF ? -ECONNREFUSED : rc;
    }
    return fd;
}

/* ---- Operations (STORE-2..5 over TCP-10) ------------------------------------------ */

typedef struct reply {
    tp_status status;
    uint8_t aux;
    uint8_t *payload; /* malloc'd, NUL-terminated past len */
    size_t len;
} reply;

static tp_status check_key(tcp_store *s, const char *op, const char *key, size_t *len) {
    TPI_ASSERT(key);
    *len = strnlen(key, (size_t)TP_STORE_KEY_LEN_MAX + 1);
    if (*len == 0)
        return store_fail(s, TP_EINVAL, "%s: empty key", op);
    if (*len > TP_STORE_KEY_LEN_MAX)
        return store_fail(s, TP_EINVAL, "%s '%.40s...': key longer than %d bytes", op, key,
                          TP_STORE_KEY_LEN_MAX);
    return TP_OK;
}

static tp_status check_value(tcp_store *s, const char *op, const char *key, const void *v,
                             size_t len) {
    TPI_ASSERT(v || len == 0);
    if (len > TP_STORE_VALUE_LEN_MAX)
        return store_fail(s, TP_EINVAL, "%s '%s': value of %zu bytes is over the limit of %u", op,
                          key, len, (unsigned)TP_STORE_VALUE_LEN_MAX);
    return TP_OK;
}

/* Sends a request and reads its reply, under the client's mutex. */
static tp_status roundtrip(tcp_store *s, const char *op, const char *key, const uint8_t *req,
                           size_t req_len, reply *r) {
    memset(r, 0, sizeof *r);
    if (s->fd < 0) {
        int fd =
            connect_once((const struct sockaddr *)&s->sa, s->sa_len, s->rank, &s->auth,
                         CLIENT_RECONNECT_MS);
        if (fd < 0)
            return store_fail(s, TP_ESTORE,
                              "%s '%s': the connection was lost and reconnecting "
                              "failed: %s",
                              op, key, tpi_sock_strerror(fd));
        s->fd = fd;
        tpi_tcp_keepalive_apply(fd, &s->ka);
    }
    uint64_t deadline = tpi_tcp_now_ns() + (uint64_t)TPI_STORE_OP_TIMEOUT_MS * 1000000ull;
    uint8_t head[TPI_STORE_REPLY_HEAD_LEN];
    tp_status status = TP_OK;
    uint8_t aux = 0;
    uint32_t plen = 0;
    int rc = tpi_sock_send_all(s->fd, req, req_len, deadline);
    if (rc == 0)
        rc = tpi_sock_recv_all(s->fd, head, sizeof head, deadline);
    if (rc == 0 && tpi_store_reply_head_decode(head, &status, &aux, &plen) != 0)
        rc = -EPROTO;
    if (rc == 0) {
        r->payload = malloc((size_t)plen + 1);
        if (!r->payload)
            rc = -ENOMEM;
        else if (plen)
            rc = tpi_sock_recv_all(s->fd, r->payload, plen, deadline);
    }
    if (rc != 0) {
        free(r->payload);
        r->payload = NULL;
        close(s->fd);
        s->fd = -1;
        return store_fail(s, rc == -ENOMEM ? TP_ENOMEM : TP_ESTORE, "%s '%s': %s", op, key,
                          rc == -EPROTO ? "malformed reply" : tpi_sock_strerror(rc));
    }
    r->payload[plen] = '\0';
    r->len = plen;
    r->status = status;
    r->aux = aux;
    if (r->status == TP_ENOENT) {
        /* Absent is an answer, not a failure: polling callers see it all the
         * time, so it stays out of tp_errmsg() (ERR-2), as in the SQLite store. */
        tpi_format(s->base.errmsg, sizeof s->base.errmsg, "rendezvous store at %s: %s", s->desc,
                   (const char *)r->payload);
        free(r->payload);
        r->payload = NULL;
        return TP_ENOENT;
    }
    if (r->status != TP_OK) {
        tp_status st = store_fail(s, r->status, "%s", (const char *)r->payload);
        free(r->payload);
        r->payload = NULL;
        return st;
    }
    return TP_OK;
}

/* Encodes rq (TCP-10, tcp_store_wire.c), sends it and reads its reply. */
static tp_status run(tcp_store *s, const char *op, const char *key, const tpi_store_request *rq,
                     reply *r) {
    memset(r, 0, sizeof *r); /* callers free r->payload whatever happened */
    size_t len = tpi_store_request_size(rq);
    uint8_t *req = malloc(len);
    if (!req)
        return store_fail(s, TP_ENOMEM, "%s '%s': out of memory", op, key);
    tpi_store_request_encode(rq, req);
    pthread_mutex_lock(&s->mu);
    tp_status st = roundtrip(s, op, key, req, len, r);
    pthread_mutex_unlock(&s->mu);
    free(req);
    return st;
}

/* A request of op on key (checked: 1..TP_STORE_KEY_LEN_MAX bytes). */
static tpi_store_request request_of(uint8_t op, const char *key, size_t key_len) {
    return (tpi_store_request){.op = op, .key = (const uint8_t *)key, .key_len = (uint16_t)key_len};
}

static tp_status ts_set(tp_store *base, const char *key, const void *value, size_t len) {
    tcp_store *s = (tcp_store *)base;
    size_t kl;
    tp_status st = check_key(s, "set", key, &kl);
    if (st == TP_OK)
        st = check_value(s, "set", key, value, len);
    if (st != TP_OK)
        return st;
    tpi_store_request rq = request_of(TPI_STORE_SET, key, kl);
    rq.has_a = 1;
    rq.a = value;
    rq.a_len = (uint32_t)len;
    reply r;
    st = run(s, "set", key, &rq, &r);
    free(r.payload);
    return st;
}

static tp_status ts_get(tp_store *base, const char *key, void **value, size_t *len) {
    TPI_ASSERT(value && len);
    tcp_store *s = (tcp_store *)base;
    *value = NULL;
    *len = 0;
    size_t kl;
    tp_status st = check_key(s, "get", key, &kl);
    if (st != TP_OK)
        return st;
    reply r;
    tpi_store_request rq = request_of(TPI_STORE_GET, key, kl);
    st = run(s, "get", key, &rq, &r);
    if (st == TP_OK) {
        *value = r.payload;
        *len = r.len;
    }
    return st;
}

static tp_status ts_add(tp_store *base, const char *key, int64_t delta, int64_t *result) {
    TPI_ASSERT(result);
    tcp_store *s = (tcp_store *)base;
    size_t kl;
    tp_status st = check_key(s, "add", key, &kl);
    if (st != TP_OK)
        return st;
    tpi_store_request rq = request_of(TPI_STORE_ADD, key, kl);
    rq.delta = delta;
    reply r;
    st = run(s, "add", key, &rq, &r);
    if (st == TP_OK && r.len != 8) {
        st = store_fail(s, TP_ESTORE, "add '%s': malformed reply", key);
    } else if (st == TP_OK) {
        *result = (int64_t)((uint64_t)get_u32(r.payload) | (uint64_t)get_u32(r.payload + 4) << 32);
    }
    free(r.payload);
    return st;
}

static tp_status ts_compare_set(tp_store *base, const char *key, const void *expected,
                                size_t expected_len, const void *desired, size_t desired_len,
                                int *swapped) {
    TPI_ASSERT(swapped);
    tcp_store *s = (tcp_store *)base;
    *swapped = 0;
    size_t kl;
    tp_status st = check_key(s, "compare_set", key, &kl);
    if (st == TP_OK && expected)
        st = check_value(s, "compare_set", key, expected, expected_len);
    if (st == TP_OK)
        st = check_value(s, "compare_set", key, desired, desired_len);
    if (st != TP_OK)
        return st;
    tpi_store_request rq = request_of(TPI_STORE_CAS, key, kl);
    rq.flags = expected ? 1 : 0;
    rq.has_a = 1;
    rq.a = expected;
    rq.a_len = expected ? (uint32_t)expected_len : 0;
    rq.b = desired;
    rq.b_len = (uint32_t)desired_len;
    reply r;
    st = run(s, "compare_set", key, &rq, &r);
    if (st == TP_OK)
        *swapped = r.aux ? 1 : 0;
    free(r.payload);
    return st;
}

static tp_status ts_del(tp_store *base, const char *key) {
    tcp_store *s = (tcp_store *)base;
    size_t kl;
    tp_status st = check_key(s, "del", key, &kl);
    if (st != TP_OK)
        return st;
    reply r;
    tpi_store_request rq = request_of(TPI_STORE_DEL, key, kl);
    st = run(s, "del", key, &rq, &r);
    free(r.payload);
    return st;
}

static void ts_close(tp_store *base) {
    tcp_store *s = (tcp_store *)base;
    if (s->fd >= 0)
        close(s->fd);
    /* A server handed to this client stops with it, after its other clients. */
    tpi_store_server_stop(s->server, s->linger_ns);
    pthread_mutex_destroy(&s->mu);
    tpi_tcp_auth_clear(&s->auth);
    free(s);
}

/* STORE-10 over the protocol: replies that are full say so, and the next
 * request asks for what follows the last key seen. */
static tp_status ts_scan(tp_store *base, const char *prefix,
                         int (*fn)(void *arg, const char *key, const void *value, size_t len),
                         void *arg) {
    tcp_store *s = (tcp_store *)base;
    size_t pl;
    tp_status st = check_key(s, "scan", prefix, &pl);
    char last[TP_STORE_KEY_LEN_MAX + 1] = "";
    for (int more = 1; st == TP_OK && more;) {
        size_t ll = strlen(last);
        tpi_store_request rq = request_of(TPI_STORE_SCAN, prefix, pl);
        rq.has_a = ll > 0;
        rq.a = (const uint8_t *)last;
        rq.a_len = (uint32_t)ll;
        reply r;
        st = run(s, "scan", prefix, &rq, &r);
        if (st != TP_OK) {
            free(r.payload);
            break;
        }
        size_t n = 0;
        int rc = tpi_store_scan_entries(r.payload, r.len, prefix, pl, fn, arg, last, &n);
        if (rc == 0 && r.aux && n == 0)
            rc = -1; /* "more" with nothing in it: no progress */
        more = r.aux && rc == 0;
        free(r.payload);
        if (rc < 0)
            st = store_fail(s, rc == -2 ? TP_ENOMEM : TP_ESTORE, "scan '%s': %s", prefix,
                            rc == -2 ? "out of memory" : "malformed reply");
    }
    return st;
}

static const tp_store_ops tcp_store_ops = {
    .api_version = TP_BACKEND_API_VERSION,
    .set = ts_set,
    .get = ts_get,
    .add = ts_add,
    .compare_set = ts_compare_set,
    .del = ts_del,
    .close = ts_close,
    .scan = ts_scan,
};

/* ---- Connecting (TCP-9) ------------------------------------------------------------- */

/* init's interrupt, if any (INTERRUPT-1). */
static int init_interrupted(const tp_init_params *init) {
    return init && init->interrupted && init->interrupted(init);
}

tp_status tpi_tcp_store_connect(const char *host, uint16_t port, uint32_t rank,
                                const tpi_tcp_auth *auth, uint64_t deadline_ns, const char *what,
                                tpi_store_server *server, uint64_t linger_ns,
                                const tp_init_params *init, tp_store **out, char *errmsg,
                                size_t errmsg_len) {
    *out = NULL;
    tcp_store *s = calloc(1, sizeof *s);
    if (!s) {
        tpi_store_server_stop(server, 0);
        tpi_format(errmsg, errmsg_len, "out of memory for the store client");
        return TP_ENOMEM;
    }
    s->base.ops = &tcp_store_ops;
    s->fd = -1;
    s->server = server;
    s->linger_ns = linger_ns;
    s->rank = rank;
    s->auth = *auth;
    s->ka = tpi_tcp_keepalive_default();
    pthread_mutex_init(&s->mu, NULL);
    tpi_tcp_format_hostport(host, port, s->desc, sizeof s->desc);
    char err[TP_ERRMSG_LEN_MAX];
    tp_status st = tpi_tcp_resolve(host, port, &s->sa, &s->sa_len, err, sizeof err);
    if (st != TP_OK) {
        tpi_format(errmsg, errmsg_len, "rendezvous store %s (%s): %s", s->desc, what, err);
        ts_close(&s->base);
        return st;
    }
    uint64_t start = tpi_tcp_now_ns();
    uint32_t pause_ms = CLIENT_RETRY_MIN_MS;
    for (;;) {
        int fd =
            connect_once((const struct sockaddr *)&s->sa, s->sa_len, s->rank, &s->auth,
                         CLIENT_ATTEMPT_MS);
        if (fd >= 0) {
            s->fd = fd;
            tpi_tcp_keepalive_apply(fd, &s->ka);
            break;
        }
        if (fd == -EPROTO) {
            tpi_format(errmsg, errmsg_len,
                       "%s (%s) answered, but it is not a tensorplay rendezvous store", s->desc,
                       what);
            ts_close(&s->base);
            return TP_ESTORE;
        }
        if (fd == -EACCES) {
            tpi_format(errmsg, errmsg_len,
                       "the rendezvous store at %s (%s) and this worker do not share the job "
                       "secret (%s): authentication failed (TCP-17)",
                       s->desc, what,
                       s->auth.on ? "this worker authenticates" : "this worker has auth=off");
            ts_close(&s->base);
            return TP_EAUTH;
        }
        uint64_t now = tpi_tcp_now_ns();
        if (now >= deadline_ns) {
            tpi_format(errmsg, errmsg_len,
                       "cannot reach the rendezvous store at %s (%s) within %.3g s: %s", s->desc,
                       what, (double)(now - start) / 1e9, tpi_sock_strerror(fd));
            ts_close(&s->base);
            return TP_ETIMEDOUT;
        }
        /* The pause, in slices that look for init's interrupt (Ctrl-C). */
        uint64_t left_ms = (deadline_ns - now) / 1000000;
        uint32_t pause = left_ms < pause_ms ? (uint32_t)left_ms + 1 : pause_ms;
        for (uint32_t slept = 0; !init_interrupted(init) && slept < pause; slept += TP_INIT_POLL_MS)
            sleep_ms(pause - slept < TP_INIT_POLL_MS ? pause - slept : TP_INIT_POLL_MS);
        if (init_interrupted(init)) {
            tpi_format(errmsg, errmsg_len,
                       "interrupted after %.3g s of waiting for the rendezvous store at %s (%s): "
                       "%s",
                       (double)(tpi_tcp_now_ns() - start) / 1e9, s->desc, what,
                       tpi_sock_strerror(fd));
            ts_close(&s->base);
            return TP_ECANCELED;
        }
        pause_ms = pause_ms * 2 > CLIENT_RETRY_MAX_MS ? CLIENT_RETRY_MAX_MS : pause_ms * 2;
    }
    *out = &s->base;
    return TP_OK;
}

/* ---- Rank 0's server outlives its agent (TCP-11) ------------------------------------ */

/*
 * The server of the last rank-0 init in this process. It keeps serving after
 * tp_shutdown, so a later init here (generation g1, g2, ... keys) finds the
 * same store, and peers still in their last shutdown round are not cut off.
 * It stops when a rank-0 init needs another address, and at exit, after the
 * clients still connected are done (at most the linger time). A server
 * replaced for another address is retired, not waited for: it lingers on
 * its own thread (its late ranks still find it) while the new job starts,
 * and is joined once done or at exit.
 */
static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;
static tpi_store_server *kept_server;
static char kept_addr[TPI_ADDR_LEN_MAX + 8];
static pid_t kept_pid;
static uint64_t kept_linger_ns;
static int kept_atexit_done;
/* A parent's, across fork: never ours to stop. Only written: "used" keeps
 * the compiler from dropping it, as the reference is its whole point (the
 * block stays reachable, and LeakSanitizer quiet, in a forked child). */
static tpi_store_server *inherited_server __attribute__((used));
static tpi_tcp_auth kept_auth;             /* the kept server's: reused only for the same */

typedef struct retired_server {
    tpi_store_server *server; /* stopping (tpi_store_server_stop_async) */
    pid_t pid;                /* its process: a forked child leaves it alone */
    char addr[TPI_ADDR_LEN_MAX + 8];
    struct retired_server *next;
} retired_server;
static retired_server *retired; /* kept_mu */

size_t tpi_tcp_store_retired_size(void) {
    return sizeof(retired_server);
}

/* kept_mu held. Joins the retired servers of this process: all of them
 * (wait), those serving addr (wait_addr: it must be free again), or those
 * already done. */
static void retired_reap_locked(int wait, const char *wait_addr) {
    for (retired_server **pp = &retired; *pp;) {
        retired_server *r = *pp;
        int join = wait || tpi_store_server_finished(r->server) ||
                   (wait_addr && strcmp(r->addr, wait_addr) == 0);
        if (r->pid == getpid() && join) {
            tpi_store_server_join(r->server);
            *pp = r->next;
            free(r);
        } else {
            pp = &r->next;
        }
    }
}

/* kept_mu held. A forked child does not own its parent's server thread: it
 * leaves it alone (still referenced, so not a leak). */
static void kept_stop_locked(void) {
    if (!kept_server || kept_pid != getpid())
        return;
    tpi_store_server_stop(kept_server, kept_linger_ns);
    kept_server = NULL;
    tpi_tcp_auth_clear(&kept_auth); /* no key outlives its server */
}

/* kept_mu held. Retires the kept server (it must be this process's): its
 * stop runs on its own thread; without memory for the record, waits for it. */
static void kept_retire_locked(void) {
    TPI_ASSERT(kept_server && kept_pid == getpid());
    retired_reap_locked(0, NULL);
    retired_server *r = malloc(sizeof *r);
    if (!r) {
        kept_stop_locked();
        return;
    }
    tpi_store_server_stop_async(kept_server, kept_linger_ns);
    *r = (retired_server){.server = kept_server, .pid = kept_pid, .next = retired};
    tpi_format(r->addr, sizeof r->addr, "%s", kept_addr);
    retired = r;
    kept_server = NULL;
    tpi_tcp_auth_clear(&kept_auth);
}

static void kept_at_exit(void) {
    pthread_mutex_lock(&kept_mu);
    int mine = kept_server && kept_pid == getpid();
    if (mine) /* it lingers beside the retired ones: the exit waits for the longest */
        tpi_store_server_stop_async(kept_server, kept_linger_ns);
    retired_reap_locked(1, NULL);
    if (mine) {
        tpi_store_server_join(kept_server);
        kept_server = NULL;
        tpi_tcp_auth_clear(&kept_auth);
    }
    pthread_mutex_unlock(&kept_mu);
}

/* Makes sure the right server runs before this rank connects: rank 0 reuses
 * the one for desc or starts it, retiring one kept for another address.
 * Other ranks leave it alone: another worker of this process may be rank 0. */
static tp_status kept_server_for(uint32_t rank, uint32_t world_size, const tpi_tcp_auth *auth,
                                 const tpi_tcp_keepalive *ka, const char *host, uint16_t port,
                                 const char *desc, const char *what, uint64_t linger_ns,
                                 char *errmsg, size_t errmsg_len) {
    tp_status st = TP_OK;
    pthread_mutex_lock(&kept_mu);
    if (kept_server && kept_pid != getpid()) {
        inherited_server = kept_server;
        kept_server = NULL;
    }
    if (kept_server && rank == 0 && strcmp(kept_addr, desc) != 0)
        kept_retire_locked(); /* a new job elsewhere: the old one lingers meanwhile */
    else if (kept_server && rank == 0 && !tpi_tcp_auth_same(&kept_auth, auth))
        kept_stop_locked(); /* another secret on the same address: the port must be free */
    if (rank == 0 && !kept_server) {
        retired_reap_locked(0, desc); /* back to an address still lingering: wait for it */
        struct sockaddr_storage sa;
        socklen_t sa_len = 0;
        char err[TP_ERRMSG_LEN_MAX];
        st = tpi_tcp_resolve(host, port, &sa, &sa_len, err, sizeof err);
        if (st != TP_OK)
            tpi_format(errmsg, errmsg_len, "rendezvous store %s (%s): %s", desc, what, err);
        else if ((st = tpi_store_server_start((const struct sockaddr *)&sa, sa_len, desc, auth, ka,
                                              &kept_server, err, sizeof err)) != TP_OK)
            tpi_format(errmsg, errmsg_len, "%s (%s)", err, what);
        if (st == TP_OK) {
            tpi_format(kept_addr, sizeof kept_addr, "%s", desc);
            kept_auth = *auth;
            kept_pid = getpid();
            if (!kept_atexit_done)
                kept_atexit_done = atexit(kept_at_exit) == 0;
        }
    }
    if (kept_server && rank == 0) {
        /* The latest rank-0 init's job: its shutdown_timeout, and its ranks to
         * wait for at exit (TCP-11). */
        kept_linger_ns = linger_ns;
        tpi_store_server_expect(kept_server, world_size);
        tpi_store_server_keepalive(kept_server, ka); /* TCP-23: for clients from now on */
    }
    pthread_mutex_unlock(&kept_mu);
    return st;
}

/* Seconds to nanoseconds from now; 0 or less means no deadline. */
static uint64_t deadline_after(double seconds) {
    if (!(seconds > 0))
        return UINT64_MAX;
    if (seconds > 1e9)
        seconds = 1e9;
    return tpi_tcp_now_ns() + (uint64_t)(seconds * 1e9);
}

int tpi_tcp_store_host(const tp_options *opts, char *host, size_t len) {
    const char *method = tp_options_init_method(opts);
    char hp[TPI_ADDR_LEN_MAX], port_s[16];
    if (!method || !*method || strcmp(method, "env://") == 0) {
        const char *h = getenv("MASTER_ADDR");
        return h && *h && strlen(h) < len && tpi_tcp_unbracket(h, host, len) == 0;
    }
    const char *rest = strncmp(method, "tcp://", 6) == 0    ? method + 6
                       : strncmp(method, "etcd://", 7) == 0 ? method + 7
                                                            : NULL;
    if (!rest)
        return 0;
    size_t n = strcspn(rest, ",/?"); /* etcd: the first endpoint */
    if (n >= sizeof hp)
        return 0;
    memcpy(hp, rest, n);
    hp[n] = '\0';
    return tpi_tcp_split_hostport(hp, host, len, port_s, sizeof port_s) == 0;
}

tp_status tpi_tcp_store_open(const tp_init_params *init, const tpi_tcp_auth *auth, tp_store **out,
                             char *errmsg, size_t errmsg_len) {
    *out = NULL;
    const tp_options *opts = init->opts;
    uint32_t rank = init->rank, world_size = init->world_size;
    const char *method = tp_options_init_method(opts);
    if (!method || !*method)
        method = "env://";
    if (strncmp(method, "sqlite://", 9) == 0) {
        const char *path = method + 9;
        if (path[0] != '/') {
            tpi_format(errmsg, errmsg_len,
                       "init_method '%.200s': the path must be absolute (sqlite:///abs/path)",
                       method);
            return TP_EINVAL;
        }
        return tp_sqlite_store_open(path, out, errmsg, errmsg_len);
    }
    if (strncmp(method, "etcd://", 7) == 0)
        return tp_etcd_store_open(method, out, errmsg, errmsg_len);
    char host[TPI_ADDR_LEN_MAX], port_s[16], what[TPI_ADDR_LEN_MAX + 64];
    uint16_t port = 0;
    if (strcmp(method, "env://") == 0) {
        const char *h = getenv("MASTER_ADDR");
        const char *p = getenv("MASTER_PORT");
        if (!h || !*h || !p || !*p) {
            tpi_format(errmsg, errmsg_len,
                       "init_method env:// needs MASTER_ADDR and MASTER_PORT in the "
                       "environment: %s is not set",
                       !h || !*h ? "MASTER_ADDR" : "MASTER_PORT");
            return TP_EINVAL;
        }
        /* "::1" and "[::1]" alike (tcp://[::1]:port needs the brackets). */
        if (strlen(h) >= sizeof host || strpbrk(h, "\t\n") ||
            tpi_tcp_unbracket(h, host, sizeof host) != 0) {
            tpi_format(errmsg, errmsg_len, "MASTER_ADDR '%.64s' is not a host", h);
            return TP_EINVAL;
        }
        if (tpi_tcp_parse_port(p, 0, &port) != 0) {
            tpi_format(errmsg, errmsg_len, "MASTER_PORT '%.32s' is not a port number (1..65535)",
                       p);
            return TP_EINVAL;
        }
        tpi_format(what, sizeof what, "init_method env://, MASTER_ADDR=%s MASTER_PORT=%u", h,
                   (unsigned)port);
    } else if (strncmp(method, "tcp://", 6) == 0) {
        if (strlen(method + 6) >= sizeof host || /* host:port, as tpi_tcp_store_host */
            tpi_tcp_split_hostport(method + 6, host, sizeof host, port_s, sizeof port_s) != 0 ||
            tpi_tcp_parse_port(port_s, 0, &port) != 0) {
            tpi_format(errmsg, errmsg_len,
                       "init_method '%.200s' is not tcp://host:port with a port in 1..65535",
                       method);
            return TP_EINVAL;
        }
        tpi_format(what, sizeof what, "init_method %s", method);
    } else {
        tpi_format(errmsg, errmsg_len,
                   "unknown init_method '%.200s': expected env://, tcp://host:port, "
                   "sqlite:///path or etcd://host:port/prefix",
                   method);
        return TP_EINVAL;
    }
    double linger_s = tp_options_shutdown_timeout(opts);
    if (!(linger_s > 0) || linger_s > TPI_STORE_LINGER_MAX_S)
        linger_s = TPI_STORE_LINGER_MAX_S;
    char desc[TPI_ADDR_LEN_MAX + 8];
    tpi_tcp_format_hostport(host, port, desc, sizeof desc);
    tpi_tcp_keepalive ka;
    tp_status st = tpi_tcp_keepalive_read(opts, &ka, errmsg, errmsg_len);
    if (st == TP_OK)
        st = kept_server_for(rank, world_size, auth, &ka, host, port, desc, what,
                             (uint64_t)(linger_s * 1e9), errmsg, errmsg_len);
    if (st == TP_OK)
        st = tpi_tcp_store_connect(host, port, rank, auth,
                                   deadline_after(tp_options_init_timeout(opts)), what, NULL, 0,
                                   init, out, errmsg, errmsg_len);
    if (st == TP_OK) { /* TCP-23: the options' keepalive from now on, this connection too */
        tcp_store *s = (tcp_store *)*out;
        s->ka = ka;
        if (s->fd >= 0)
            tpi_tcp_keepalive_apply(s->fd, &ka);
    }
    return st;
}
