/*
 * sim_network.c: the simulated network (spec/sim.md SIM-4).
 *
 * Hosts talk over connections, one per pair of hosts, each carrying two
 * FIFO directions. A message sent at t arrives at
 *     max(t + latency_min + jitter + fault delays, previous arrival on that link)
 * where jitter is uniform in [0, latency_jitter) from the network stream, so
 * messages never overtake each other on a link (AGENT-8). A break bumps the
 * connection's epoch: whatever is in flight with an older epoch is lost at
 * its arrival time, which is how "the rest is lost" is kept without
 * searching the event queue. The frame stays the sender's until arrival;
 * then its bytes are copied into one fresh contiguous frame, the header is
 * checked with the receiver's size limit, and the receiver's core gets it.
 */
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"

/* ---- Links ------------------------------------------------------------------ */

/* The index of dst in h's sorted links, or where it would go (*found 0). */
static uint32_t link_search(const tpi_sim_host *h, uint32_t dst, int *found) {
    uint32_t lo = 0, hi = h->nlinks;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (h->links[mid].dst == dst) {
            *found = 1;
            return mid;
        }
        if (h->links[mid].dst < dst)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = 0;
    return lo;
}

tpi_sim_link *tpi_sim_link_find(const tp_sim *sim, uint32_t src, uint32_t dst) {
    TPI_ASSERT(src < sim->nhosts && dst < sim->nhosts);
    const tpi_sim_host *h = &sim->hosts[src];
    int found;
    uint32_t i = link_search(h, dst, &found);
    return found ? &h->links[i] : NULL;
}

/* Lists lo in hi's conn_lo (lo < hi): their connection entry is made. */
static int conn_lo_add(tpi_sim_host *hi, uint32_t lo) {
    if (hi->nconn_lo == hi->conn_lo_cap) {
        uint32_t cap = hi->conn_lo_cap ? hi->conn_lo_cap * 2 : 4;
        uint32_t *v = realloc(hi->conn_lo, cap * sizeof *v);
        if (!v)
            return 0;
        hi->conn_lo = v;
        hi->conn_lo_cap = cap;
    }
    uint32_t at = hi->nconn_lo;
    while (at > 0 && hi->conn_lo[at - 1] > lo)
        at--;
    memmove(&hi->conn_lo[at + 1], &hi->conn_lo[at], (hi->nconn_lo - at) * sizeof *hi->conn_lo);
    hi->conn_lo[at] = lo;
    hi->nconn_lo++;
    return 1;
}

tpi_sim_link *tpi_sim_link_get(tp_sim *sim, uint32_t src, uint32_t dst) {
    TPI_ASSERT(src < sim->nhosts && dst < sim->nhosts);
    tpi_sim_host *h = &sim->hosts[src];
    int found;
    uint32_t lo = link_search(h, dst, &found);
    if (found)
        return &h->links[lo];
    if (h->nlinks == h->links_cap) {
        uint32_t cap = h->links_cap ? h->links_cap * 2 : 4;
        tpi_sim_link *links = realloc(h->links, cap * sizeof *links);
        if (!links)
            return NULL;
        h->links = links;
        h->links_cap = cap;
    }
    /* An entry above src is the (src, dst) connection's: dst lists src. */
    if (src < dst && !conn_lo_add(&sim->hosts[dst], src))
        return NULL;
    memmove(&h->links[lo + 1], &h->links[lo], (h->nlinks - lo) * sizeof *h->links);
    h->nlinks++;
    memset(&h->links[lo], 0, sizeof h->links[lo]);
    h->links[lo].dst = dst;
    return &h->links[lo];
}

/* The connection's shared state lives in the (min, max) direction's entry. */
static tpi_sim_link *conn_get(tp_sim *sim, uint32_t a, uint32_t b) {
    return a <= b ? tpi_sim_link_get(sim, a, b) : tpi_sim_link_get(sim, b, a);
}

static tpi_sim_link *conn_must(tp_sim *sim, uint32_t a, uint32_t b) {
    tpi_sim_link *c = conn_get(sim, a, b);
    if (!c)
        tpi_assert_fail("simulator link table exhausted memory", __FILE__, __LINE__);
    return c;
}

static uint64_t sat_add(uint64_t x, uint64_t y) {
    return x > UINT64_MAX - y ? UINT64_MAX : x + y;
}

void tpi_sim_msg_free(tpi_sim_msg *m) {
    if (!m)
        return;
    tp_frame_free(m->frame);
    free(m);
}

/* ---- Peer-down ----------------------------------------------------------------- */

static const char *detail_word(tpi_sim_detail d) {
    switch (d) {
    case TPI_SIM_DETAIL_KILLED:
        return "killed";
    case TPI_SIM_DETAIL_BREAK:
        return "break";
    case TPI_SIM_DETAIL_PARTITION:
        return "partition";
    case TPI_SIM_DETAIL_LOSS:
        return "loss";
    case TPI_SIM_DETAIL_BAD_FRAME:
        return "bad-frame";
    case TPI_SIM_DETAIL_NO_MEMORY:
        return "no-memory";
    case TPI_SIM_DETAIL_REFUSED:
        return "refused";
    case TPI_SIM_DETAIL_STOPPED:
        return "stopped";
    case TPI_SIM_DETAIL_STALLED:
        return "stalled";
    }
    return "?";
}

/* One PEER_DOWN event for agent a about rank r. */
static void peer_down_event(tp_sim *sim, const tpi_sim_agent *a, uint32_t r, uint32_t about,
                            tp_status why, tpi_sim_detail detail, uint64_t at_ns) {
    tpi_sim_event e = {.kind = TPI_SIM_EV_PEER_DOWN,
                       .time_ns = at_ns,
                       .a = a->id,
                       .b = r,
                       .c = (uint32_t)why,
                       .d = (uint32_t)detail,
                       .x = about};
    tpi_sim_schedule(sim, &e);
}

void tpi_sim_net_peer_down(tp_sim *sim, uint32_t host, uint32_t about, tp_status why,
                           tpi_sim_detail detail, uint64_t at_ns) {
    tpi_sim_host *h = &sim->hosts[host];
    if (h->dead || !h->active_agent)
        return;
    tpi_sim_agent *a = tpi_sim_agent_get(sim, h->active_agent - 1);
    if (!a || a->stopping)
        return;
    /* In rank order: deterministic, and usually one rank per host. The
     * ranks on `about` are `about` itself, when it is still there, and the
     * moved ranks that went there (sim_agent.c keeps that list). */
    int self_there = about < a->npeers && tpi_sim_peer_host(a, about) == about;
    for (uint32_t i = 0; i < a->nmoved; i++) {
        uint32_t r = a->moved[i].rank;
        if (self_there && about < r) {
            peer_down_event(sim, a, about, about, why, detail, at_ns);
            self_there = 0;
        }
        if (a->moved[i].host == about)
            peer_down_event(sim, a, r, about, why, detail, at_ns);
    }
    if (self_there)
        peer_down_event(sim, a, about, about, why, detail, at_ns);
}

void tpi_sim_net_break(tp_sim *sim, uint32_t a, uint32_t b, tpi_sim_detail detail) {
    tpi_sim_link *c = conn_must(sim, a, b);
    c->epoch++;
    tpi_sim_trace(sim, "break a=%u b=%u why=%s", a, b, detail_word(detail));
    tpi_sim_net_peer_down(sim, a, b, TP_EIO, detail, sim->now_ns);
    if (a != b)
        tpi_sim_net_peer_down(sim, b, a, TP_EIO, detail, sim->now_ns);
}

/* The close of host reaches p, connected to it (FIFO behind what is on the wire). */
static void close_reaches(tp_sim *sim, uint32_t host, uint32_t p) {
    uint64_t at = sat_add(sim->now_ns, sim->cfg.latency_min_ns);
    const tpi_sim_link *out = tpi_sim_link_find(sim, host, p);
    if (out && out->last_arrival_ns > at)
        at = out->last_arrival_ns;
    tpi_sim_net_peer_down(sim, p, host, TP_EPEERDOWN, TPI_SIM_DETAIL_STOPPED, at);
}

void tpi_sim_net_closed(tp_sim *sim, uint32_t host) {
    const tpi_sim_host *h = &sim->hosts[host];
    if (h->dead)
        return; /* its peers were told when it died */
    /* Every host connected to it, ascending: those below it (conn_lo),
     * then those above (its links above it are their connections). One
     * never connected is not told: a later send there is refused instead.
     * Nothing below adds a connection, so both lists hold still. */
    for (uint32_t i = 0; i < h->nconn_lo; i++)
        close_reaches(sim, host, h->conn_lo[i]);
    for (uint32_t i = 0; i < h->nlinks; i++)
        if (h->links[i].dst > host)
            close_reaches(sim, host, h->links[i].dst);
}

/* ---- Link rules: latency distributions and bandwidth (SIM-5) ---------------------- */

static const tpi_sim_link_rule *rule_for(const tp_sim *sim, uint32_t src, uint32_t dst,
                                         int bandwidth) {
    for (uint32_t i = sim->nrules; i-- > 0;) {
        const tpi_sim_link_rule *r = &sim->rules[i];
        if (r->bandwidth == bandwidth && (r->from == UINT32_MAX || r->from == src) &&
            (r->to == UINT32_MAX || r->to == dst))
            return r;
    }
    return NULL;
}

/* One latency draw from a rule, on the network stream (only when a rule
 * applies, so worlds without rules keep their draws). */
static uint64_t draw_latency(tp_sim *sim, const tpi_sim_link_rule *r) {
    uint64_t span = r->max_ns - r->min_ns;
    switch (r->dist) {
    case TPI_SIM_DIST_FIXED:
        return r->min_ns;
    case TPI_SIM_DIST_UNIFORM:
        return r->min_ns + (span ? tpi_sim_prng_below(&sim->net_rng, span + 1) : 0);
    case TPI_SIM_DIST_LONGTAIL: {
        /* Most frames near min, a few near max: span / 2^k with k geometric
         * (a coin per step), times a uniform fraction. */
        uint64_t x = span;
        while (x > 1 && (tpi_sim_prng_next(&sim->net_rng) & 1))
            x /= 2;
        uint64_t scale = span > 1 ? span / x : 1;
        uint64_t v = span ? tpi_sim_prng_below(&sim->net_rng, span + 1) / scale : 0;
        return r->min_ns + v;
    }
    }
    return r->min_ns;
}

/* ---- Sending (AGENT-8) ---------------------------------------------------------- */

static uint8_t frame_type(const tp_frame *f) {
    /* Byte 5 of the header (spec/wire.md WIRE-1), for the trace only. */
    return f->seg[0].len > 5 ? ((const uint8_t *)f->seg[0].base)[5] : 0;
}

static void check_segments(const tp_frame *f) {
    /* The frame comes from the core: a bad shape is a programmer error. */
    TPI_ASSERT(f->nseg >= 1 && f->nseg <= TP_FRAME_SEG_MAX);
    size_t total = 0;
    for (int i = 0; i < f->nseg; i++) {
        TPI_ASSERT(f->seg[i].base || f->seg[i].len == 0);
        total += f->seg[i].len;
    }
    TPI_ASSERT(total == f->len);
}

tp_status tpi_sim_net_send(tpi_sim_agent *a, uint32_t dst_rank, tp_frame *f) {
    tp_sim *sim = a->sim;
    TPI_ASSERT(f);
    check_segments(f);
    if (a->stopping || sim->hosts[a->host].dead)
        return TP_ESHUTDOWN;
    if (dst_rank >= a->npeers)
        return TP_EUNKNOWNWORKER;
    if (tpi_sim_peer_dead(a, dst_rank))
        return TP_EPEERDOWN;
    uint32_t src = a->host, dst = tpi_sim_peer_host(a, dst_rank);
    tpi_sim_link *conn = conn_get(sim, src, dst);
    tpi_sim_link *link = conn ? tpi_sim_link_get(sim, src, dst) : NULL;
    tpi_sim_msg *m = link ? calloc(1, sizeof *m) : NULL;
    if (!m)
        return TP_ENOMEM;
    /* Draw before deciding the message's fate, so a partition or a loss
     * does not shift the jitter of every later send (SIM-2). */
    uint64_t jitter = tpi_sim_prng_below(&sim->net_rng, sim->cfg.latency_jitter_ns);
    int doomed = 0;
    if (sim->drop_per_million && src != dst && sim->now_ns >= sim->drop_start_ns &&
        sim->now_ns < sim->drop_end_ns)
        doomed = tpi_sim_prng_below(&sim->fault_rng, 1000000) < sim->drop_per_million;
    /* Chaos mode: beyond TCP, for protocols that claim to survive it. */
    int chaos = 0; /* 1 drop, 2 duplicate, 3 reorder */
    uint64_t chaos_extra = 0;
    if ((sim->chaos_drop_pm | sim->chaos_dup_pm | sim->chaos_reorder_pm) && src != dst &&
        sim->now_ns >= sim->chaos_start_ns && sim->now_ns < sim->chaos_end_ns && !doomed) {
        uint64_t r = tpi_sim_prng_below(&sim->fault_rng, 1000000);
        uint64_t d = sim->chaos_drop_pm, u = d + sim->chaos_dup_pm;
        chaos = r < d ? 1 : r < u ? 2 : r < u + sim->chaos_reorder_pm ? 3 : 0;
        if (chaos >= 2)
            chaos_extra = tpi_sim_prng_below(&sim->fault_rng, TPI_SIM_CHAOS_JITTER_NS);
    }
    m->id = ++sim->next_msg_id;
    m->frame = f;
    m->src_host = src;
    m->dst_host = dst;
    m->src_rank = a->rank;
    m->dst_rank = dst_rank;
    m->src_agent = a->id;
    m->epoch = conn->epoch;
    m->doomed = doomed;
    uint64_t arrive = sat_add(sim->now_ns, sim->cfg.latency_min_ns);
    arrive = sat_add(arrive, jitter);
    if (sim->nrules && src != dst) {
        const tpi_sim_link_rule *lat = rule_for(sim, src, dst, 0);
        const tpi_sim_link_rule *bw = rule_for(sim, src, dst, 1);
        if (lat) /* the rule's latency replaces the default one */
            arrive = sat_add(sim->now_ns, draw_latency(sim, lat));
        if (bw) {
            /* The bytes leave one after another: a frame starts when the link
             * has sent the previous one, and takes len / bandwidth. */
            uint64_t start = link->tx_free_ns > sim->now_ns ? link->tx_free_ns : sim->now_ns;
            uint64_t tx_ns = (uint64_t)((double)f->len * 8.0 * 1e9 / (double)bw->bits_per_s);
            link->tx_free_ns = sat_add(start, tx_ns);
            arrive = sat_add(arrive, link->tx_free_ns - sim->now_ns);
        }
    }
    uint64_t extra = tpi_sim_fault_delay_ns(sim, src, dst);
    uint8_t type = frame_type(f);
    if (type < TPI_SIM_MSG_TYPES && src != dst) { /* the faulty-agent faults, by type */
        extra = sat_add(extra, sim->type_delay_ns[type]);
        if (!doomed && sim->fail_sends[type] && sim->now_ns >= sim->fail_from_ns[type] &&
            sim->now_ns < sim->fail_until_ns[type]) {
            sim->fail_sends[type]--;
            m->doomed = doomed = 2;
        }
    }
    sim->fired[TP_SIM_FAULT_DELAY] += extra > 0;
    arrive = sat_add(arrive, extra);
    if (conn->partitions > 0) {
        /* The partition broke the connection when it began; this frame goes
         * on a new one, which cannot get through until the partition heals
         * (SIM-5): it arrives then, in order, or the connection breaks at the
         * user timeout and it is lost with the rest. Never a hole. */
        arrive = sat_add(conn->partition_end_ns, arrive - sim->now_ns);
        sim->fired[TP_SIM_FAULT_PARTITION_HELD]++;
        if (conn->partition_end_ns - sim->now_ns > TPI_SIM_USER_TIMEOUT_NS &&
            conn->stall_epoch != conn->epoch + 1) {
            conn->stall_epoch = conn->epoch + 1;
            tpi_sim_event e = {.kind = TPI_SIM_EV_STALL_BREAK,
                               .time_ns = sim->now_ns + TPI_SIM_USER_TIMEOUT_NS,
                               .a = src < dst ? src : dst,
                               .b = src < dst ? dst : src,
                               .x = conn->epoch};
            tpi_sim_schedule(sim, &e);
        }
    }
    if (chaos == 1) { /* gone, and the connection does not notice */
        tpi_sim_trace(sim, "drop msg=%llu from=%u to=%u why=chaos", (unsigned long long)m->id, src,
                      dst);
        tpi_sim_pf_msg(sim, src, m->id, TPI_SIM_PF_SEND_LOST, f->len, frame_type(f));
        tpi_sim_pf_drop(sim, dst, m->id, "chaos");
        sim->fired[TP_SIM_FAULT_CHAOS_DROP]++;
        tpi_sim_msg_free(m);
        return TP_OK;
    }
    if (chaos == 3) { /* held back: later frames may pass it */
        sim->fired[TP_SIM_FAULT_CHAOS_REORDER]++;
        arrive = sat_add(arrive, chaos_extra);
        tpi_sim_trace(sim,
                      "send msg=%llu from=%u to=%u src=%u dst=%u len=%zu type=%u arrive=%llu "
                      "chaos=reorder",
                      (unsigned long long)m->id, src, dst, a->rank, dst_rank, f->len, frame_type(f),
                      (unsigned long long)arrive);
        tpi_sim_pf_msg(sim, src, m->id, TPI_SIM_PF_SEND_REORDER, f->len, frame_type(f));
        tpi_sim_event e = {.kind = TPI_SIM_EV_DELIVER, .time_ns = arrive, .p = m};
        tpi_sim_schedule(sim, &e);
        return TP_OK;
    }
    /* A frame chosen for loss is found lost when it would have arrived, not
     * behind the frames queued before it (a loss drawn inside a fault window
     * never surfaces long after it); the break it causes loses those too.
     * Later frames still come after it, so none overtakes it (AGENT-8). */
    if (!doomed && arrive < link->last_arrival_ns)
        arrive = link->last_arrival_ns;
    tpi_sim_trace(sim, "send msg=%llu from=%u to=%u src=%u dst=%u len=%zu type=%u arrive=%llu",
                  (unsigned long long)m->id, src, dst, a->rank, dst_rank, f->len, frame_type(f),
                  (unsigned long long)arrive);
    tpi_sim_pf_msg(sim, src, m->id, TPI_SIM_PF_SEND, f->len, frame_type(f));
    if (arrive > link->last_arrival_ns)
        link->last_arrival_ns = arrive;
    tpi_sim_event e = {.kind = TPI_SIM_EV_DELIVER, .time_ns = arrive, .p = m};
    tpi_sim_schedule(sim, &e);
    if (chaos == 2) { /* and once more, a little later, out of order */
        tpi_sim_msg *copy = calloc(1, sizeof *copy);
        tp_frame *cf = copy ? tp_frame_flatten(f) : NULL;
        if (cf) {
            *copy = *m;
            copy->id = ++sim->next_msg_id;
            copy->frame = cf;
            sim->fired[TP_SIM_FAULT_CHAOS_DUP]++;
            tpi_sim_trace(sim, "duplicate msg=%llu of=%llu arrive=%llu",
                          (unsigned long long)copy->id, (unsigned long long)m->id,
                          (unsigned long long)sat_add(arrive, chaos_extra));
            tpi_sim_pf_msg(sim, src, copy->id, TPI_SIM_PF_SEND_DUP, f->len, frame_type(f));
            tpi_sim_event e2 = {
                .kind = TPI_SIM_EV_DELIVER, .time_ns = sat_add(arrive, chaos_extra), .p = copy};
            tpi_sim_schedule(sim, &e2);
        } else {
            free(copy);
        }
    }
    return TP_OK;
}

/* ---- Arrival ------------------------------------------------------------------ */

/* The receiving agent, if one is started and not stopping on the host. */
static tpi_sim_agent *receiver(tp_sim *sim, uint32_t host) {
    tpi_sim_host *h = &sim->hosts[host];
    tpi_sim_agent *a = h->active_agent ? tpi_sim_agent_get(sim, h->active_agent - 1) : NULL;
    return a && !a->stopping ? a : NULL;
}

static void drop(tp_sim *sim, tpi_sim_msg *m, const char *why) {
    tpi_sim_trace(sim, "drop msg=%llu from=%u to=%u why=%s", (unsigned long long)m->id, m->src_host,
                  m->dst_host, why);
    tpi_sim_pf_drop(sim, m->dst_host, m->id, why);
}

/* Checks the header against the receiver's limit; the bytes came from
 * another worker, so a bad frame is an error, never an assertion. */
static tp_status check_frame(const tpi_sim_agent *a, const tp_frame *f, char *errmsg,
                             size_t errmsg_len) {
    if (f->len < TP_FRAME_HEADER_SIZE) {
        tpi_format(errmsg, errmsg_len, "frame of %zu bytes is shorter than its header", f->len);
        return TP_EPROTO;
    }
    size_t frame_len = 0;
    const uint8_t *bytes = f->seg[0].base;
    tp_status st =
        tp_frame_check_header(bytes, a->max_message_size, &frame_len, errmsg, errmsg_len);
    if (st == TP_OK && frame_len != f->len) {
        tpi_format(errmsg, errmsg_len, "header says %zu bytes, frame has %zu", frame_len, f->len);
        st = TP_EPROTO;
    }
    return st;
}

void tpi_sim_net_deliver(tp_sim *sim, tpi_sim_msg *m) {
    tpi_sim_link *conn = conn_must(sim, m->src_host, m->dst_host);
    tpi_sim_agent *a = receiver(sim, m->dst_host);
    if (conn->epoch != m->epoch) {
        drop(sim, m, "broken"); /* the connection broke while it was in flight */
    } else if (sim->hosts[m->src_host].dead) {
        drop(sim, m, "sender-dead");
    } else if (sim->hosts[m->dst_host].dead) {
        drop(sim, m, "dead");
    } else if (m->doomed) {
        /* As on TCP, a lost frame breaks the connection. */
        drop(sim, m, m->doomed == 2 ? "failsend" : "loss");
        tpi_sim_pf_fault(sim, m->doomed == 2 ? "send failed" : "frame lost", m->src_host,
                         m->dst_host);
        sim->fired[m->doomed == 2 ? TP_SIM_FAULT_FAILSEND : TP_SIM_FAULT_DROP]++;
        tpi_sim_net_break(sim, m->src_host, m->dst_host, TPI_SIM_DETAIL_LOSS);
    } else if (!a) {
        /* Nobody listens there: the sender sees a refused connection. */
        drop(sim, m, "no-worker");
        tpi_sim_host *sh = &sim->hosts[m->src_host];
        if (sh->active_agent == m->src_agent + 1)
            tpi_sim_net_peer_down(sim, m->src_host, m->dst_host, TP_EPEERDOWN,
                                  TPI_SIM_DETAIL_REFUSED,
                                  sat_add(sim->now_ns, sim->cfg.latency_min_ns));
    } else {
        tp_frame *f = tp_frame_flatten(m->frame);
        char err[TP_ERRMSG_LEN_MAX];
        tp_status st = f ? check_frame(a, f, err, sizeof err) : TP_ENOMEM;
        if (st != TP_OK) {
            const char *why = f ? "bad-frame" : "no-memory";
            tpi_sim_trace(sim, "drop msg=%llu from=%u to=%u why=%s error=%s",
                          (unsigned long long)m->id, m->src_host, m->dst_host, why,
                          f ? err : "out of memory");
            tpi_sim_pf_drop(sim, m->dst_host, m->id, why);
            tp_frame_free(f);
            /* In order or not at all: a connection that lost a frame is over. */
            tpi_sim_net_break(sim, m->src_host, m->dst_host,
                              f ? TPI_SIM_DETAIL_BAD_FRAME : TPI_SIM_DETAIL_NO_MEMORY);
        } else {
            sim->messages++;
            tpi_sim_trace(sim, "deliver msg=%llu from=%u to=%u src=%u dst=%u len=%zu",
                          (unsigned long long)m->id, m->src_host, m->dst_host, m->src_rank,
                          m->dst_rank, f->len);
            tpi_sim_pf_msg(sim, m->dst_host, m->id, TPI_SIM_PF_DELIVER, f->len, frame_type(f));
            uint32_t src_rank = m->src_rank;
            tpi_sim_msg_free(m);
            tpi_sim_upcall_frame(a, src_rank, f);
            return;
        }
    }
    tpi_sim_msg_free(m);
}
