/*
 * tcp_agent.c: the "TENSORPIPE" backend: the agent interface on libuv TCP
 * (spec/agent.md AGENT-1..13, spec/tcp.md TCP-1..12, TCP-21).
 *
 * init reads the options and opens the rendezvous store (tcp_store.c);
 * start listens and starts the loop thread (tcp_loop.c); set_peers resolves
 * the all-gathered addresses; connections open on first send (tcp_conn.c);
 * the pool starts threads on demand (tcp_pool.c); the lock and park are
 * pthreads (tcp_sync.c). stop refuses new work, wakes parked tasks, closes
 * every handle, joins the loop thread, lets accepted work items finish and
 * joins the pool, then frees what was still queued.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tcp_internal.h"

static tpi_tcp_agent *AG(tp_agent *a) {
    TPI_ASSERT(a);
    return (tpi_tcp_agent *)a;
}

/* ---- start, set_peers (AGENT-3, AGENT-4) -------------------------------------------- */

static tp_status agent_start(tp_agent *ag, tp_core *core, char *addr, size_t addr_len, char *errmsg,
                             size_t errmsg_len) {
    tpi_tcp_agent *a = AG(ag);
    TPI_ASSERT(core && addr && !a->started && !a->stopped);
    a->core = core;
    a->ctx = tp_context_current(); /* the init task's worker: the loop and pool use it */
    tp_status st = tpi_tcp_loop_start(a, errmsg, errmsg_len);
    if (st != TP_OK)
        return st;
    size_t n = strlen(a->self_addr);
    if (n + 1 > addr_len) {
        /* Cannot happen with TPI_ADDR_LEN_MAX buffers; refuse rather than truncate. */
        tpi_format(errmsg, errmsg_len, "address '%s' does not fit %zu bytes", a->self_addr,
                   addr_len);
        return TP_EBACKEND;
    }
    memcpy(addr, a->self_addr, n + 1);
    return TP_OK;
}

static tp_status agent_set_peers(tp_agent *ag, const char *const *addrs, uint32_t world_size,
                                 char *errmsg, size_t errmsg_len) {
    tpi_tcp_agent *a = AG(ag);
    if (world_size != a->world_size || !addrs) {
        if (addrs)
            tpi_format(errmsg, errmsg_len, "%u addresses for a world of %u", world_size,
                       a->world_size);
        else
            tpi_format(errmsg, errmsg_len, "no table of addresses");
        return TP_EINVAL;
    }
    struct sockaddr_storage *sas = calloc(world_size, sizeof *sas);
    if (!sas) {
        tpi_format(errmsg, errmsg_len, "out of memory for %u peer addresses", world_size);
        return TP_ENOMEM;
    }
    tp_status st = TP_OK;
    for (uint32_t r = 0; r < world_size && st == TP_OK; r++) {
        /* Addresses came through the store: check, never assert. */
        char host[TPI_ADDR_LEN_MAX], port_s[16], err[TP_ERRMSG_LEN_MAX];
        uint16_t port = 0;
        socklen_t len = 0;
        const char *s = addrs[r] ? addrs[r] : "(null)";
        if (strlen(s) >= TPI_ADDR_LEN_MAX ||
            tpi_tcp_split_hostport(s, host, sizeof host, port_s, sizeof port_s) != 0 ||
            tpi_tcp_parse_port(port_s, 0, &port) != 0) {
            tpi_format(errmsg, errmsg_len, "worker %u's address '%.64s' is not host:port", r, s);
            st = TP_EINVAL;
        } else if (tpi_tcp_resolve(host, port, &sas[r], &len, err, sizeof err) != TP_OK) {
            tpi_format(errmsg, errmsg_len, "worker %u's address '%.64s': %s", r, s, err);
            st = TP_EINVAL;
        }
    }
    if (st == TP_OK) {
        pthread_mutex_lock(&a->qmu);
        for (uint32_t r = 0; r < world_size; r++) {
            tpi_format(a->peers[r].addr, sizeof a->peers[r].addr, "%s", addrs[r]);
            a->peers[r].sa = sas[r];
        }
        a->have_peers = 1;
        pthread_mutex_unlock(&a->qmu);
    }
    free(sas);
    return st;
}

/* ---- stop, destroy (AGENT-5, AGENT-6) ------------------------------------------------ */

static void agent_stop(tp_agent *ag) {
    tpi_tcp_agent *a = AG(ag);
    if (a->stopped)
        return;
    pthread_mutex_lock(&a->qmu);
    a->stopping = 1;
    atomic_store(&a->stop_flag, 1);
    a->timer_deadline_ns = UINT64_MAX;
    /* The loop closes the async handle only after seeing stopping under qmu,
     * so it is still open here. */
    if (a->started)
        tpi_tcp_wake(a);
    pthread_mutex_unlock(&a->qmu);
    tpi_tcp_pool_close(a);  /* execute refuses from now on */
    tpi_tcp_wake_parked(a); /* parked tasks return TP_ESHUTDOWN */
    tpi_tcp_loop_stop(a);   /* no upcall runs or will run after this */
    tpi_tcp_pool_join(a);   /* accepted work items ran to their end */
    tpi_tcp_drop_queues(a); /* frames sent after the loop's last turn */
    a->stopped = 1;
}

static void agent_destroy(tp_agent *ag) {
    tpi_tcp_agent *a = AG(ag);
    TPI_ASSERT(!a->started && !a->loop_inited);
    TPI_ASSERT(a->nthreads == 0 && !a->parked && a->nwake == 0);
    if (a->store)
        a->store->ops->close(a->store);
    if (a->peers)
        tpi_tcp_drop_queues(a);
    for (uint32_t i = 0; a->peers && i < a->world_size; i++)
        tpi_shm_tx_free(a->peers[i].shm_tx);
    pthread_mutex_destroy(&a->mu);
    pthread_mutex_destroy(&a->qmu);
    pthread_mutex_destroy(&a->pool_mu);
    free(a->peers);
    free(a->dirty);
    free(a->dirty_work);
    free(a->regrant);
    free(a->threads);
    free(a->staging);
    tpi_tcp_auth_clear(&a->auth);
    free(a);
}

/* ---- Thin members -------------------------------------------------------------- */

static tp_status agent_send(tp_agent *ag, uint32_t dst, tp_frame *f) {
    return tpi_tcp_send(AG(ag), dst, f);
}

static uint64_t agent_now_ns(tp_agent *ag) {
    (void)ag;
    return tpi_tcp_now_ns();
}

static void agent_timer_arm(tp_agent *ag, uint64_t deadline_ns) {
    tpi_tcp_timer_arm(AG(ag), deadline_ns);
}

static tp_status agent_execute(tp_agent *ag, tp_work *w) {
    return tpi_tcp_pool_execute(AG(ag), w);
}

static tp_store *agent_store(tp_agent *ag) {
    return AG(ag)->store;
}

/* AGENT-18 (tcp_conn.c). */
static int agent_congested(tp_agent *ag, uint32_t dst) {
    return tpi_tcp_congested(AG(ag), dst);
}

/* AGENT-16: a restarted peer (tcp_conn.c). */
static tp_status agent_set_peer(tp_agent *ag, uint32_t rank, const char *addr, char *errmsg,
                                size_t errmsg_len) {
    return tpi_tcp_set_peer(AG(ag), rank, addr, errmsg, errmsg_len);
}

static const tp_agent_ops tcp_agent_ops = {
    .api_version = TP_BACKEND_API_VERSION,
    .name = "TENSORPIPE",
    .start = agent_start,
    .set_peers = agent_set_peers,
    .stop = agent_stop,
    .destroy = agent_destroy,
    .send = agent_send,
    .now_ns = agent_now_ns,
    .timer_arm = agent_timer_arm,
    .execute = agent_execute,
    .lock = tpi_tcp_lock,
    .unlock = tpi_tcp_unlock,
    .task_self = tpi_tcp_task_self,
    .park = tpi_tcp_park,
    .park_peer = tpi_tcp_park_peer,
    .unpark = tpi_tcp_unpark,
    .store = agent_store,
    .set_peer = agent_set_peer,
    .congested = agent_congested,
};

/* ---- The backend (BACKEND-1..5, TCP-12) ---------------------------------------------- */

static tp_status construct_options(tp_options *opts) {
    tp_status st = tp_options_set(opts, "listen_addr", "auto");
    if (st == TP_OK)
        st = tp_options_set(opts, "listen_port", "0");
    return st;
}

/*
 * TCP-12: listen_addr "auto" (the default). A job whose store is on this
 * host's loopback (one machine) listens on 127.0.0.1; one whose store is
 * elsewhere listens on the address this host reaches the store from, the
 * one its peers on other machines can dial (torchrun users set only
 * MASTER_ADDR). A store host that does not resolve: 127.0.0.1, and opening
 * the store reports the name.
 */
static void auto_listen_addr(const tp_options *opts, char *out, size_t len) {
    char store_host[TPI_ADDR_LEN_MAX];
    if (!tpi_tcp_store_host(opts, store_host, sizeof store_host) ||
        tpi_tcp_local_addr_toward(store_host, out, len) != 0)
        tpi_format(out, len, "127.0.0.1");
}

/* host without brackets (tpi_tcp_unbracket). */
static int is_wildcard(const char *host) {
    return strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0;
}

/* Reads listen_addr, listen_port and advertise_addr (TCP-12). */
static tp_status read_listen_options(tpi_tcp_agent *a, const tp_options *opts, char *errmsg,
                                     size_t errmsg_len) {
    const char *host = tp_options_get(opts, "listen_addr");
    const char *port = tp_options_get(opts, "listen_port");
    const char *adv = tp_options_get(opts, "advertise_addr");
    char host_buf[TPI_ADDR_LEN_MAX], adv_buf[TPI_ADDR_LEN_MAX], auto_buf[TPI_ADDR_LEN_MAX];
    if (!host || !*host || strcmp(host, "auto") == 0) {
        auto_listen_addr(opts, auto_buf, sizeof auto_buf);
        host = auto_buf;
    }
    if (!port || !*port)
        port = "0";
    /* "[::1]" names the same host as "::1": addresses are bracketed when
     * formatted (TCP-2), so a bracketed host must not be kept as it is. */
    if (strlen(host) >= sizeof a->listen_host || strpbrk(host, "\t\n") ||
        tpi_tcp_unbracket(host, host_buf, sizeof host_buf) != 0) {
        tpi_format(errmsg, errmsg_len, "listen_addr '%.64s' is not a host", host);
        return TP_EINVAL;
    }
    host = host_buf;
    if (tpi_tcp_parse_port(port, 1, &a->listen_port) != 0) {
        tpi_format(errmsg, errmsg_len, "listen_port '%.32s' is not a port number (0..65535)", port);
        return TP_EINVAL;
    }
    if (!adv || !*adv) {
        if (is_wildcard(host)) {
            tpi_format(errmsg, errmsg_len,
                       "listen_addr %s is not an address peers can dial: set advertise_addr "
                       "to this host's address",
                       host);
            return TP_EINVAL;
        }
        adv = host;
    }
    if (strlen(adv) >= sizeof a->advertise_host - 8 || strpbrk(adv, "\t\n") ||
        tpi_tcp_unbracket(adv, adv_buf, sizeof adv_buf) != 0) {
        tpi_format(errmsg, errmsg_len, "advertise_addr '%.64s' is not a host", adv);
        return TP_EINVAL;
    }
    adv = adv_buf;
    tpi_format(a->listen_host, sizeof a->listen_host, "%s", host);
    tpi_format(a->advertise_host, sizeof a->advertise_host, "%s", adv);
    return TP_OK;
}

/* A seconds option no greater than max_ms, as milliseconds (at least 1). */
static tp_status read_seconds(const tp_options *opts, const char *key, uint32_t max_ms,
                              uint32_t *out, char *errmsg, size_t errmsg_len) {
    const char *v = tp_options_get(opts, key);
    *out = max_ms;
    if (!v || !*v)
        return TP_OK;
    char *end = NULL;
    errno = 0;
    double s = strtod(v, &end);
    if (errno != 0 || end == v || *end != '\0' || !(s > 0) || s * 1000.0 > (double)max_ms) {
        tpi_format(errmsg, errmsg_len,
                   "%s '%.32s' is not a number of seconds in (0, %g]: options can only lower "
                   "this bound (TCP-19)",
                   key, v, max_ms / 1000.0);
        return TP_EINVAL;
    }
    uint32_t ms = (uint32_t)(s * 1000.0);
    *out = ms ? ms : 1;
    return TP_OK;
}

/* A whole-number option in [min, max]; *out keeps its value (the default)
 * when the key is unset. note ends the error message. */
tp_status tpi_tcp_read_count(const tp_options *opts, const char *key, uint64_t min, uint64_t max,
                             const char *note, uint64_t *out, char *errmsg, size_t errmsg_len) {
    const char *v = tp_options_get(opts, key);
    if (!v || !*v)
        return TP_OK;
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || *v == '-' || n < min || n > max) {
        tpi_format(errmsg, errmsg_len, "%s '%.32s' is not a whole number in [%llu, %llu]%s", key,
                   v, (unsigned long long)min, (unsigned long long)max, note);
        return TP_EINVAL;
    }
    *out = n;
    return TP_OK;
}

/* A TCP-19 bound: the max unless an option lowers it. */
static tp_status read_count(const tp_options *opts, const char *key, uint64_t min, uint64_t max,
                            uint64_t *out, char *errmsg, size_t errmsg_len) {
    *out = max;
    return tpi_tcp_read_count(opts, key, min, max, ": options can only lower this bound (TCP-19)",
                              out, errmsg, errmsg_len);
}

/* TCP-23: keepalive_idle, keepalive_interval, keepalive_count and
 * user_timeout, whole seconds each, lowered or raised within their caps. */
tp_status tpi_tcp_keepalive_read(const tp_options *opts, tpi_tcp_keepalive *ka, char *errmsg,
                                 size_t errmsg_len) {
    TPI_ASSERT(opts && ka);
    *ka = tpi_tcp_keepalive_default();
    uint64_t idle = ka->idle_s, intvl = ka->intvl_s, cnt = ka->cnt, ut = 0;
    tp_status st = tpi_tcp_read_count(opts, "keepalive_idle", 1, TPI_TCP_KEEPALIVE_S_MAX,
                                      " (seconds of silence before the first keepalive probe, "
                                      "TCP-23)",
                                      &idle, errmsg, errmsg_len);
    if (st == TP_OK)
        st = tpi_tcp_read_count(opts, "keepalive_interval", 1, TPI_TCP_KEEPALIVE_INTVL_S_MAX,
                                " (seconds between keepalive probes, TCP-23)", &intvl, errmsg,
                                errmsg_len);
    if (st == TP_OK)
        st = tpi_tcp_read_count(opts, "keepalive_count", 1, TPI_TCP_KEEPALIVE_CNT_MAX,
                                " (unanswered keepalive probes that end a connection, TCP-23)",
                                &cnt, errmsg, errmsg_len);
    uint64_t floor_s = idle + intvl * cnt; /* within the cap (tcp_internal.h) */
    ut = floor_s;
    if (st == TP_OK)
        st = tpi_tcp_read_count(opts, "user_timeout", 1, TPI_TCP_USER_TIMEOUT_S_MAX,
                                " (seconds a connection may go unanswered, TCP-23)", &ut, errmsg,
                                errmsg_len);
    if (st == TP_OK && ut < floor_s) {
        tpi_format(errmsg, errmsg_len,
                   "user_timeout %llu s is below keepalive_idle + keepalive_interval * "
                   "keepalive_count = %llu + %llu * %llu = %llu s: the kernel would end an idle "
                   "connection before keepalive_count probes went unanswered (TCP-23)",
                   (unsigned long long)ut, (unsigned long long)idle, (unsigned long long)intvl,
                   (unsigned long long)cnt, (unsigned long long)floor_s);
        st = TP_EINVAL;
    }
    if (st != TP_OK)
        return st;
    ka->idle_s = (uint32_t)idle;
    ka->intvl_s = (uint32_t)intvl;
    ka->cnt = (uint32_t)cnt;
    ka->user_timeout_ms = (uint32_t)(ut * 1000u);
    return TP_OK;
}

/* TCP-19: the bounds against any peer, lowered by options; and TCP-23's
 * keepalive, which options may also raise. */
static tp_status read_bound_options(tpi_tcp_agent *a, const tp_options *opts, char *errmsg,
                                    size_t errmsg_len) {
    uint64_t hs = 0;
    tp_status st =
        read_seconds(opts, "hello_timeout", TPI_TCP_HELLO_TIMEOUT_MS, &a->hello_ms, errmsg,
                     errmsg_len);
    if (st == TP_OK)
        st = read_seconds(opts, "frame_timeout", TPI_TCP_FRAME_TIMEOUT_MS, &a->frame_ms, errmsg,
                          errmsg_len);
    if (st == TP_OK)
        st = read_seconds(opts, "idle_timeout", TPI_TCP_IDLE_TIMEOUT_MS, &a->idle_ms, errmsg,
                          errmsg_len);
    if (st == TP_OK)
        st = read_count(opts, "rx_budget", TPI_TCP_RX_BUDGET_MIN, TPI_TCP_RX_BUDGET_DEFAULT,
                        &a->rx_budget, errmsg, errmsg_len);
    if (st == TP_OK)
        st = read_count(opts, "max_handshakes", 1, TPI_TCP_HANDSHAKES_MAX, &hs, errmsg,
                        errmsg_len);
    a->handshakes_max = (uint32_t)hs;
    if (st == TP_OK)
        st = tpi_tcp_keepalive_read(opts, &a->keepalive, errmsg, errmsg_len);
    uint64_t down_s = TPI_TCP_PEER_DOWN_TIMEOUT_S;
    if (st == TP_OK)
        st = tpi_tcp_read_count(opts, "peer_down_timeout", 0, TPI_TCP_PEER_DOWN_TIMEOUT_S_MAX,
                                " (seconds a silent worker has before it is declared down; 0 "
                                "never declares, TCP-25)",
                                &down_s, errmsg, errmsg_len);
    a->peer_down_ms = down_s * 1000u;
    uint64_t spin_us = 0;
    if (st == TP_OK)
        st = tpi_tcp_read_count(opts, "spin_us", 0, TPI_TCP_SPIN_US_MAX,
                                " (microseconds a waiting thread spins before it sleeps; 0 never "
                                "spins, TCP-29)",
                                &spin_us, errmsg, errmsg_len);
    a->spin_ns = spin_us * 1000u;
    return st;
}

static tp_status backend_init(const tp_init_params *params, tp_agent **agent,
                              const tp_agent_ops **ops, char *errmsg, size_t errmsg_len) {
    TPI_ASSERT(params && params->opts && agent && ops && params->world_size > 0);
    tpi_stdio_reserve(); /* TCP-27: before any socket or loop descriptor is made */
    tpi_tcp_agent *a = calloc(1, sizeof *a);
    if (!a) {
        tpi_format(errmsg, errmsg_len, "out of memory for the TCP agent");
        return TP_ENOMEM;
    }
    a->rank = params->rank;
    a->world_size = params->world_size;
    a->max_msg = tp_options_max_message_size(params->opts);
    a->unsent_max = tp_options_max_unsent_bytes(params->opts);
    int threads = tp_options_num_worker_threads(params->opts);
    a->pool_max = threads < 1                        ? 1
                  : threads > TPI_WORKER_THREADS_MAX ? TPI_WORKER_THREADS_MAX
                                                     : (uint32_t)threads;
    a->timer_deadline_ns = UINT64_MAX;
    atomic_init(&a->stop_flag, 0);
    pthread_mutex_init(&a->mu, NULL);
    pthread_mutex_init(&a->qmu, NULL);
    pthread_mutex_init(&a->pool_mu, NULL);
    tpi_tcp_ctl_encode(a->rec_bye, TPI_TCP_CTL_BYE, a->rank);
    tpi_tcp_ctl_encode(a->rec_abort, TPI_TCP_CTL_ABORT, a->rank);
    tpi_tcp_ctl_encode(a->rec_ping, TPI_TCP_CTL_PING, a->rank);
    tpi_tcp_ctl_encode(a->rec_pong, TPI_TCP_CTL_PONG, a->rank);
    tpi_tcp_ctl_encode(a->rec_idle, TPI_TCP_CTL_IDLE, a->rank);
    tpi_tcp_ctl_encode(a->rec_close, TPI_TCP_CTL_CLOSE, a->rank);
    tp_status st = read_listen_options(a, params->opts, errmsg, errmsg_len);
    if (st == TP_OK)
        st = read_bound_options(a, params->opts, errmsg, errmsg_len);
    if (st == TP_OK)
        st = tpi_tcp_auth_setup(params->opts, &a->auth, errmsg, errmsg_len);
    if (st == TP_OK)
        st = tpi_tcp_encrypt_setup(params->opts, &a->auth, &a->encrypt, errmsg, errmsg_len);
    if (st == TP_OK)
        st = tpi_shm_setup(a, params->opts, errmsg, errmsg_len);
    if (st == TP_OK) {
        a->peers = calloc(a->world_size, sizeof *a->peers);
        a->dirty = calloc(a->world_size, sizeof *a->dirty);
        a->dirty_work = calloc(a->world_size, sizeof *a->dirty_work);
        a->regrant = calloc(a->world_size, sizeof *a->regrant);
        a->threads = calloc(a->pool_max, sizeof *a->threads);
        a->staging = malloc(TPI_TCP_STAGING_SIZE);
        if (!a->peers || !a->dirty || !a->dirty_work || !a->regrant || !a->threads ||
            !a->staging) {
            tpi_format(errmsg, errmsg_len, "out of memory for a world of %u workers",
                       a->world_size);
            st = TP_ENOMEM;
        }
        for (uint32_t i = 0; a->peers && i < a->world_size; i++)
            a->peers[i].direct_fd = -1;
    }
    if (st == TP_OK)
        st = tpi_tcp_store_open(params, &a->auth, &a->store, errmsg, errmsg_len);
    if (st != TP_OK) {
        a->store = NULL;
        agent_destroy((tp_agent *)a);
        return st;
    }
    *agent = (tp_agent *)a;
    *ops = &tcp_agent_ops;
    return TP_OK;
}

/* TCP-12: the backend keys; init rejects any other (OPT-6). */
static const char *const option_keys[] = {
    "listen_addr", "listen_port", "advertise_addr", "auth", "secret", "hello_timeout",
    "frame_timeout", "idle_timeout", "rx_budget", "max_handshakes", "encrypt", "shm",
    "shm_min_bytes", "shm_pool_bytes", "shm_ring_bytes",
    /* TCP-23 */
    "keepalive_idle", "keepalive_interval", "keepalive_count", "user_timeout",
    /* TCP-25 */
    "peer_down_timeout",
    /* TCP-29 */
    "spin_us", NULL};

const tp_backend tpi_tcp_backend = {
    .api_version = TP_BACKEND_API_VERSION,
    .construct_options = construct_options,
    .init = backend_init,
    .option_keys = option_keys,
};
