/*
 * tpsim_swarm.c: swarm runs (tools/README.md "Swarm runs", spec/sim.md SIM-10).
 *
 *   tpsim swarm --seeds A..B [--jobs N] [--workers N] [--verbose] [--trace FILE]
 *               [--canary NAME] [--expect-failure] [--plan FILE] [--calls N]
 *               [--shrink] [--save-bytes FILE]
 *   tpsim swarm --bytes FILE [--shrink]
 *
 * Each seed draws a world: the worker count, the workload's knobs (call
 * mix, payload sizes, per-call timeouts from sub-millisecond to infinite,
 * pool and window sizes) and a fault plan (kills, partitions, isolations,
 * splits, breaks, delays, loss, pauses, failed sends, link latency and
 * bandwidth, store outages). The run then goes through its phases:
 *
 *   chaos     every worker issues calls while the faults happen;
 *   heal      every fault window ends (HEAL_NS); some dead ranks restart as
 *             new incarnations and rejoin (REJOIN), the others stay dead;
 *   liveness  every call of the chaos phase has ended, and a call between
 *             any two live workers succeeds;
 *   shutdown  every live worker shuts down gracefully: TP_OK, or
 *             TP_EPEERDOWN when a worker died;
 *   final     the simulator's oracle found nothing (SIM-9), no host hung.
 *
 * What a call may answer under faults is loose (a timeout, a dead or
 * unreachable peer), but an answer that claims success must carry exactly
 * the right value, and the oracle holds whatever the faults did. A failing
 * seed prints its plan and a one-line replay command.
 *
 * Seeds run one after another in one process (no process start per seed);
 * --jobs N forks N processes that take every N-th seed and report back
 * through pipes.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/canary.h"
#include "common/errors.h"
#include "tensorplay/sim_experiment.h"
#include "tools/tpsim.h"

#define MS_NS 1000000ull
#define S_NS 1000000000ull
/* The phases, in virtual time. Faults are drawn inside [FAULT_FROM, HEAL). */
#define FAULT_FROM_NS (50 * MS_NS)
#define HEAL_NS (1000 * MS_NS) /* the usual heal time (a seed may draw a longer one) */
#define SWARM_WORKERS_MAX 16
#define SWARM_PENDING_MAX 256
#define SWARM_PLAN_MAX 4096
#define SWARM_FAILURES_LISTED 20
#define SWARM_JOBS_MAX 64

/* ---- One seed's world ---------------------------------------------------------- */

typedef struct swarm_cfg {
    uint64_t seed;
    uint32_t workers;
    uint32_t pool;
    uint32_t calls;        /* per worker in the chaos phase */
    uint32_t think_max_us; /* between two calls */
    uint32_t payload_max;  /* echo bytes */
    uint64_t window;       /* max_inflight_bytes, 0: default */
    uint64_t heal_ns;      /* every fault window ends by then */
    double default_timeout_s;
    int lossy; /* the plan's chaos mode loses frames: every chaos call has a deadline */
    uint32_t mix[TPSIM_OP_LIVENESS]; /* weights of the chaos operations */
    uint32_t mix_total;
    char plan[SWARM_PLAN_MAX];
    uint32_t plan_lines;
    uint32_t planned[TP_SIM_FAULT_KINDS_]; /* faults of each kind in the plan */
} swarm_cfg;

typedef struct swarm_stats {
    uint64_t seeds, failed;
    uint64_t fault_seeds_planned[TP_SIM_FAULT_KINDS_];
    uint64_t fault_seeds_fired[TP_SIM_FAULT_KINDS_];
    uint64_t fault_fired[TP_SIM_FAULT_KINDS_];
    uint64_t ops[TPSIM_OP_KINDS][TPSIM_OUT_KINDS];
    uint64_t events, calls_checked;
    uint64_t init_failed; /* seeds whose init failed everywhere under faults */
    uint64_t violations;
    uint64_t settle_hist[TPSIM_SETTLE_BUCKETS]; /* workers' rref settling after the heal */
} swarm_stats;

/* One world while it runs: the experiment handle of sim_experiment.h. */
struct tp_sim_experiment {
    tpsim_world w; /* the world's shared state (tpsim.h) */
    const swarm_cfg *cfg;
    const tp_sim_experiment_def *def; /* an experiment's chaos, or NULL: tpsim's */
    tp_status init_status[SWARM_WORKERS_MAX];
    char init_msg[SWARM_WORKERS_MAX][160];
};
typedef struct tp_sim_experiment swarm_run;

/* Who we are in messages ("tpsim swarm", or an experiment's program), and
 * the command that replays a seed. Set once by the entry point. */
static const char *prog = "tpsim swarm";
static char replay_cmd[256] = "tpsim swarm";

/* Faults that fired so far in this world and may fail an init: not a store
 * outage or a slow store, which init outlasts (STORE-9: the swarm's outages
 * end long before init's 60 s deadline). */
static uint64_t faults_fired(tp_sim *sim) {
    uint64_t n = 0;
    for (int k = 0; k < TP_SIM_FAULT_KINDS_; k++)
        if (k != TP_SIM_FAULT_STORE_DOWN && k != TP_SIM_FAULT_STORE_SLOW)
            n += tp_sim_fault_count(sim, (tp_sim_fault_kind)k);
    return n;
}

/*
 * Where a world's shape comes from (SIM-14): a splitmix64 stream of the seed,
 * or bytes (a file, a fuzzer's input). The sim's own streams (SIM-2) drive
 * jitter, loss and the per-call draws either way.
 *
 * Bytes: the first 8 are the seed (little-endian); then each draw among n
 * choices takes 1, 2 or 4 bytes (n up to 2^8, 2^16, more), modulo n. Once
 * the bytes run out every draw is 0 and every optional fault is left out,
 * so cutting bytes off the end removes faults: what afl-tmin and --shrink
 * rely on. A seed's draws can be recorded as bytes (rec) that replay the
 * same world.
 */
typedef struct swarm_src {
    uint64_t s;          /* seed mode: the splitmix64 state */
    const uint8_t *in;   /* bytes mode when not NULL */
    size_t in_len, in_pos;
    uint8_t *rec;        /* seed mode: the draws as bytes, when not NULL */
    size_t rec_len, rec_cap;
} swarm_src;

#define SWARM_BYTES_SEED 8 /* the seed's bytes at the head of a bytes world */
#define SWARM_BYTES_MAX (64 * 1024)

static uint64_t mix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static unsigned draw_width(uint64_t n) {
    return n <= 0x100u ? 1 : n <= 0x10000u ? 2 : 4;
}

/* A draw in [0, n). */
static uint64_t below(swarm_src *src, uint64_t n) {
    if (n == 0)
        return 0;
    unsigned w = draw_width(n);
    TPI_ASSERT(n <= UINT32_MAX);
    if (src->in) {
        if (src->in_len - src->in_pos < w) {
            src->in_pos = src->in_len; /* spent */
            return 0;
        }
        uint64_t x = 0;
        for (unsigned i = 0; i < w; i++)
            x |= (uint64_t)src->in[src->in_pos++] << (8 * i);
        return x % n;
    }
    uint64_t v = mix64(&src->s) % n; /* a tiny modulo bias does not matter for shapes */
    if (src->rec && src->rec_len + w <= src->rec_cap)
        for (unsigned i = 0; i < w; i++)
            src->rec[src->rec_len++] = (uint8_t)(v >> (8 * i));
    return v;
}

/* Whether bytes are left (always, for a seed). */
static int more(const swarm_src *src) {
    return !src->in || src->in_pos < src->in_len;
}

/* A one-in-n choice of the rarer branch (an optional fault, a large world);
 * with no bytes left, never. In seed mode the same draw as below(n) == 0. */
static int chance(swarm_src *src, uint64_t n) {
    return more(src) && below(src, n) == 0;
}

/* A timeout menu from sub-millisecond to infinite (0). */
static const double timeout_menu[] = {0.0005, 0.003, 0.02, 0.2, 2.0, 30.0, 0.0};
#define TIMEOUT_MENU_N (sizeof timeout_menu / sizeof timeout_menu[0])

/* Where the network loses frames without a broken connection (chaos mode),
 * a user call whose request or answer vanished ends only at its deadline:
 * calls are never sent again (rref.md RREF-15). So there an infinite
 * timeout is the menu's longest finite one. */
static double finite(double timeout_s) {
    return timeout_s == 0.0 ? 30.0 : timeout_s;
}

/* 1 when a chaos line of the plan loses frames (its DROP field above 0). */
static int plan_loses(const char *plan) {
    for (const char *l = plan; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        unsigned long drop = 0;
        while (*l == ' ' || *l == '\t')
            l++;
        if (strncmp(l, "chaos", 5) == 0 && sscanf(l + 5, "%lu", &drop) == 1 && drop > 0)
            return 1;
    }
    return 0;
}

static void plan_add(swarm_cfg *c, tp_sim_fault_kind kind, const char *fmt, ...) {
    size_t n = strlen(c->plan);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->plan + n, sizeof c->plan - n, fmt, ap);
    va_end(ap);
    n = strlen(c->plan);
    if (n + 1 < sizeof c->plan) {
        c->plan[n] = '\n';
        c->plan[n + 1] = '\0';
    }
    c->plan_lines++;
    c->planned[kind]++;
}

/* A window [a, b) in ms inside the fault phase. */
static void draw_window(swarm_src *s, uint64_t heal_ns, double *a, double *b) {
    double from = (double)FAULT_FROM_NS / 1e6, to = (double)heal_ns / 1e6;
    double len;
    if (heal_ns > 50 * S_NS && chance(s, 2)) { /* longer than the user timeout */
        *a = from + (double)below(s, 4000);
        len = 46000.0 + (double)below(s, 9000);
    } else {
        /* One draw per statement: C leaves the order of operands and
         * arguments unsequenced, and a seed must mean one world whatever
         * the compiler (SIM-1). */
        double ms = (double)below(s, (uint64_t)(to - from));
        *a = from + ms + (double)below(s, 1000) / 1000.0;
        len = 1.0 + (double)below(s, (uint64_t)(to - *a));
    }
    *b = *a + len < to ? *a + len : to;
    if (*b <= *a)
        *b = to;
}

static void draw_cfg(swarm_src *s, uint64_t seed, uint32_t workers, int chaos, swarm_cfg *c) {
    memset(c, 0, sizeof *c);
    c->seed = seed;
    /* One world in eight has a long chaos phase, so that a partition can
     * outlast the connection's user timeout (45 s) and break it. */
    c->heal_ns = chance(s, 8) ? 60 * S_NS : HEAL_NS;
    c->workers =
        workers ? workers
                : (chance(s, 8) ? 9 + (uint32_t)below(s, 8) : 2 + (uint32_t)below(s, 7));
    static const uint32_t pools[] = {1, 2, 4, 16};
    c->pool = pools[below(s, 4)];
    static const uint64_t windows[] = {0, 4096, 65536, 1u << 20};
    c->window = windows[below(s, 4)];
    c->default_timeout_s = timeout_menu[below(s, TIMEOUT_MENU_N)];
    c->calls = 5 + (uint32_t)below(s, 40);
    static const uint32_t thinks[] = {0, 100, 2000, 30000};
    c->think_max_us = thinks[below(s, 4)];
    if (c->heal_ns > HEAL_NS) /* spread the calls over the long chaos phase */
        c->think_max_us = (uint32_t)(2 * (c->heal_ns / 1000) / c->calls);
    static const uint32_t payloads[] = {0, 64, 4000, 70000, 1u << 20};
    c->payload_max = payloads[below(s, chance(s, 8) ? 5 : 4)];
    for (int k = 0; k <= TPSIM_OP_FORGET; k++) {
        c->mix[k] = chance(s, 3) ? 0 : 1 + (uint32_t)below(s, 8);
        c->mix_total += c->mix[k];
    }
    if (!c->mix_total) {
        c->mix[TPSIM_OP_ASYNC_ADD] = 1;
        c->mix_total = 1;
    }
    /* The fault mix: each kind in or out, then its instances. */
    uint32_t n = c->workers;
    double a, b;
    if (chance(s, 2)) { /* kills: never everyone */
        uint32_t kills = 1 + (uint32_t)below(s, n > 2 ? 2 : 1);
        for (uint32_t i = 0; i < kills && i + 1 < n && more(s); i++) {
            draw_window(s, c->heal_ns, &a, &b);
            plan_add(c, TP_SIM_FAULT_KILL, "kill %u %.3f", (unsigned)below(s, n), a);
        }
    }
    if (chance(s, 2))
        for (uint32_t i = 0, k = 1 + (uint32_t)below(s, 3); i < k && more(s); i++) {
            uint32_t x = (uint32_t)below(s, n), y = (uint32_t)below(s, n - 1);
            y = y >= x ? y + 1 : y;
            draw_window(s, c->heal_ns, &a, &b);
            plan_add(c, TP_SIM_FAULT_PARTITION, "partition %u %u %.3f %.3f", x, y, a, b);
        }
    if (chance(s, 3)) {
        draw_window(s, c->heal_ns, &a, &b);
        plan_add(c, TP_SIM_FAULT_PARTITION, "isolate %u %.3f %.3f", (unsigned)below(s, n), a, b);
    }
    if (n > 2 && chance(s, 4)) {
        draw_window(s, c->heal_ns, &a, &b);
        plan_add(c, TP_SIM_FAULT_PARTITION, "split %u %.3f %.3f", 1 + (unsigned)below(s, n - 1), a,
                 b);
    }
    if (chance(s, 2))
        for (uint32_t i = 0, k = 1 + (uint32_t)below(s, 3); i < k && more(s); i++) {
            uint32_t x = (uint32_t)below(s, n), y = (uint32_t)below(s, n - 1);
            y = y >= x ? y + 1 : y;
            draw_window(s, c->heal_ns, &a, &b);
            plan_add(c, TP_SIM_FAULT_BREAK, "break %u %u %.3f", x, y, a);
        }
    if (chance(s, 2))
        for (uint32_t i = 0, k = 1 + (uint32_t)below(s, 4); i < k && more(s); i++) {
            uint32_t x = (uint32_t)below(s, n), y = (uint32_t)below(s, n - 1);
            y = y >= x ? y + 1 : y;
            draw_window(s, c->heal_ns, &a, &b);
            static const uint32_t extra_ms[] = {1, 20, 200, 2000};
            plan_add(c, TP_SIM_FAULT_DELAY, "delay %u %u %.3f %.3f %u", x, y, a, b,
                     extra_ms[below(s, 4)]);
        }
    if (chance(s, 4)) { /* a slower, jittery network, all run long */
        static const char *const tails[] = {"1", "10", "50"};
        const char *dist = below(s, 2) ? "longtail" : "uniform"; /* GCC drew it first */
        plan_add(c, TP_SIM_FAULT_DELAY, "latency * * 0.02 %s %s", tails[below(s, 3)], dist);
    }
    if (chance(s, 4)) { /* so a 1 MiB payload takes simulated time */
        static const unsigned mbits[] = {100, 1000, 10000};
        plan_add(c, TP_SIM_FAULT_DELAY, "bandwidth * * %u", mbits[below(s, 3)]);
    }
    if (chance(s, 3)) { /* slow, not dead: a host stops and resumes */
        draw_window(s, c->heal_ns, &a, &b);
        plan_add(c, TP_SIM_FAULT_PAUSE, "pause %u %.3f %.3f", (unsigned)below(s, n), a, b);
    }
    /* PyTorch's faulty agent: the first sends of a type fail, a type is slow. */
    static const char *const types[] = {"request",     "response",  "remote",     "rref_fetch",
                                        "rref_delete", "rref_fork", "rref_accept"};
    if (chance(s, 4)) {
        draw_window(s, c->heal_ns, &a, &b);
        unsigned count = 1 + (unsigned)below(s, 3); /* GCC drew it first */
        plan_add(c, TP_SIM_FAULT_FAILSEND, "failsend %s %u %.3f %.3f", types[below(s, 7)], count,
                 a, b);
    }
    if (chance(s, 4)) {
        unsigned extra = 1 + (unsigned)below(s, 50); /* GCC drew it first */
        plan_add(c, TP_SIM_FAULT_DELAY, "delaytype %s %u", types[below(s, 7)], extra);
    }
    if (chance(s, 3)) {
        draw_window(s, c->heal_ns, &a, &b);
        static const uint32_t rates[] = {1000, 20000, 200000};
        plan_add(c, TP_SIM_FAULT_DROP, "drop %u %.3f %.3f", rates[below(s, 3)], a, b);
    }
    /* The store (STORE-9): an outage during init or around shutdown (the
     * only phases that use it; both outlast it), and a slow store all run. */
    if (chance(s, 4)) {
        a = chance(s, 2) ? (double)below(s, 20) : (double)(c->heal_ns / MS_NS + below(s, 2000));
        b = a + 1.0 + (double)below(s, 3000);
        plan_add(c, TP_SIM_FAULT_STORE_DOWN, "storedown %.3f %.3f", a, b);
    }
    if (chance(s, 4)) {
        static const unsigned slow_ms[] = {1, 5, 20};
        plan_add(c, TP_SIM_FAULT_STORE_SLOW, "storeslow 0 1000000 %u", slow_ms[below(s, 3)]);
    }
    /* Drawn last, so the worlds of earlier seeds keep their shape. */
    c->mix[TPSIM_OP_SHARE] = chance(s, 2) ? 1 + (uint32_t)below(s, 8) : 0;
    c->mix_total += c->mix[TPSIM_OP_SHARE];
    /* The heal restarts some of the dead as new incarnations (REJOIN); the
     * others are declared dead. A restart of a rank that is alive is a no-op. */
    if (c->planned[TP_SIM_FAULT_KILL] && chance(s, 2))
        for (uint32_t r = 0; r < n && more(s); r++)
            if (chance(s, 2))
                plan_add(c, TP_SIM_FAULT_RESTART, "restart %u %.3f", r,
                         (double)(c->heal_ns / MS_NS) + (double)below(s, 5));
    /* The chaos network mode (SIM-5): loss, duplication and reordering
     * beyond TCP's, with every other fault. One world in eight; with
     * --chaos every world, and its mix leans on rrefs (remote and share). */
    if (chaos || chance(s, 8)) {
        static const unsigned drops[] = {0, 1000, 20000, 100000};
        static const unsigned others[] = {0, 20000, 100000};
        unsigned drop = drops[below(s, 4)];
        unsigned dup = others[below(s, 3)];
        unsigned reorder = others[below(s, 3)];
        if (!drop && !dup && !reorder)
            reorder = 20000;
        draw_window(s, c->heal_ns, &a, &b);
        if (chaos) { /* the whole fault phase, while the calls run */
            a = (double)FAULT_FROM_NS / 1e6;
            b = (double)c->heal_ns / 1e6;
        }
        plan_add(c, drop ? TP_SIM_FAULT_CHAOS_DROP : dup ? TP_SIM_FAULT_CHAOS_DUP
                                                         : TP_SIM_FAULT_CHAOS_REORDER,
                 "chaos %u %u %u %.3f %.3f", drop, dup, reorder, a, b);
        c->planned[TP_SIM_FAULT_CHAOS_DUP] += drop && dup;
        c->planned[TP_SIM_FAULT_CHAOS_REORDER] += (drop || dup) && reorder;
    }
    if (chaos) {
        uint32_t remote = 4 + (uint32_t)below(s, 8); /* GCC drew it first */
        uint32_t share = 8 + (uint32_t)below(s, 8);
        c->mix_total += remote + share - c->mix[TPSIM_OP_REMOTE] - c->mix[TPSIM_OP_SHARE];
        c->mix[TPSIM_OP_REMOTE] = remote;
        c->mix[TPSIM_OP_SHARE] = share;
    }
    /* The rest of the API (then, done-callbacks, user futures, collect_all,
     * answer-later, methods), each in or out: drawn last, so a world that
     * draws none of them is the world its seed drew before. */
    for (int k = TPSIM_OP_THEN; k <= TPSIM_OP_METHOD; k++) {
        c->mix[k] = chance(s, 2) ? 1 + (uint32_t)below(s, 8) : 0;
        c->mix_total += c->mix[k];
    }
}

/* ---- Inside the simulation ---------------------------------------------------- */

static uint64_t draw(uint64_t n) {
    return n ? tp_sim_random() % n : 0;
}

static double draw_timeout(const swarm_cfg *c) {
    uint64_t k = draw(TIMEOUT_MENU_N + 2);
    double t = k >= TIMEOUT_MENU_N ? TP_TIMEOUT_DEFAULT : timeout_menu[k];
    return c->lossy ? finite(t) : t;
}

/* Draws and issues one chaos operation; an async one lands in *p (p->f set). */
static void issue(swarm_run *run, int me, int world, uint64_t i, tpsim_pending *p) {
    const swarm_cfg *c = run->cfg;
    uint64_t r = draw(c->mix_total);
    tpsim_op op = TPSIM_OP_SYNC_ADD;
    for (int k = 0; k < TPSIM_OP_LIVENESS; k++) {
        if (r < c->mix[k]) {
            op = (tpsim_op)k;
            break;
        }
        r -= c->mix[k];
    }
    tpsim_op_spec s = {.op = op,
                       .dst = (int)draw((uint64_t)world),
                       .timeout_s = draw_timeout(c),
                       .a = (int64_t)draw(1000000),
                       .b = (int64_t)draw(1000000)};
    switch (op) {
    case TPSIM_OP_SLOW:
    case TPSIM_OP_FORGET:
        s.delay_us = (int64_t)draw(50000);
        break;
    case TPSIM_OP_FORWARD:
        /* Onwards to another worker than the one relaying, within a finite
         * timeout (fn_relay in tpsim_ops.c says why). */
        s.relay_to = (int)draw((uint64_t)world - 1);
        s.relay_to = s.relay_to >= s.dst ? s.relay_to + 1 : s.relay_to;
        s.relay_timeout_s = timeout_menu[draw(TIMEOUT_MENU_N - 2)]; /* 0.5 ms .. 2 s */
        s.delay_us = (int64_t)draw(20000);
        break;
    case TPSIM_OP_ECHO:
        s.tag = ((uint64_t)me << 32) | i;
        s.len = (size_t)draw((uint64_t)c->payload_max + 1);
        break;
    case TPSIM_OP_REMOTE:
        s.fetch_timeout_s = draw_timeout(c);
        break;
    case TPSIM_OP_SHARE: /* any third worker: the caller and the owner too (RREF-6) */
        s.relay_to = (int)draw((uint64_t)world);
        s.relay_timeout_s = timeout_menu[draw(TIMEOUT_MENU_N - 2)]; /* 0.5 ms .. 2 s */
        break;
    case TPSIM_OP_THEN: /* the callback's call: any worker, finite as relay's (a call
                           from a pool thread can wait for window space: fn_relay says why) */
        s.relay_to = (int)draw((uint64_t)world);
        s.relay_timeout_s = timeout_menu[draw(TIMEOUT_MENU_N - 1)]; /* 0.5 ms .. 30 s */
        break;
    case TPSIM_OP_COLLECT: /* two or three calls: dst, relay_to, and this worker */
        s.relay_to = (int)draw((uint64_t)world);
        s.len = 2 + (size_t)draw(2);
        break;
    case TPSIM_OP_LATER: /* the callee's own call, finite as relay's */
        s.relay_to = (int)draw((uint64_t)world);
        s.relay_timeout_s = timeout_menu[draw(TIMEOUT_MENU_N - 2)]; /* 0.5 ms .. 2 s */
        break;
    default:
        break;
    }
    tpsim_op_start(&run->w, me, &s, p);
}

/* The heal (every fault window over), liveness, then graceful shutdown. */
static void heal_then_finish(swarm_run *run, int rank, int world) {
    uint64_t now = tp_sim_now_ns(run->w.sim), heal = run->cfg->heal_ns + 10 * MS_NS;
    if (now < heal)
        (void)tp_sleep((double)(heal - now) / 1e9);
    tpsim_liveness(&run->w, rank, world);
    if (!run->def) /* an experiment may keep rrefs of its own */
        tpsim_rrefs_settle(&run->w, rank);
    tpsim_callbacks_check(&run->w, rank, tpsim_worker_shutdown(&run->w, rank, world));
}

static int swarm_program(int rank, int world, void *arg) {
    swarm_run *run = arg;
    const swarm_cfg *c = run->cfg;
    char name[16];
    snprintf(name, sizeof name, "w%d", rank);
    const tp_sim_experiment_def *def = run->def;
    tp_status st = TP_OK;
    if (def && def->setup && (st = def->setup(run, rank, world, def->arg)) != TP_OK) {
        tpsim_world_fail(&run->w, "%s: setup: %s: %s", name, tp_status_name(st), tp_errmsg());
        return 0;
    }
    st = def ? tpsim_worker_init(rank, world, c->default_timeout_s, (int)c->pool, c->window)
             : tpsim_worker_start(rank, world, c->default_timeout_s, (int)c->pool, c->window);
    if (tp_sim_incarnation() > 0) { /* restarted in the heal: rejoin, then the checks */
        if (st != TP_OK && !tpsim_self_dead()) {
            /* Nothing fails in the heal, so a rejoin to a job whose init
             * succeeded must too (a failed init fails it, REJOIN-1). */
            if (run->init_status[rank] == TP_OK)
                tpsim_world_fail(&run->w, "%s: rejoin as incarnation %u: %s: %s", name,
                                 tp_sim_incarnation(), tp_status_name(st), tp_errmsg());
            tp_sim_crash_self(); /* gone again, so no barrier waits for it */
            return 0;
        }
        if (st == TP_OK)
            heal_then_finish(run, rank, world);
        return 0;
    }
    run->init_status[rank] = st;
    snprintf(run->init_msg[rank], sizeof run->init_msg[rank], "%s", st ? tp_errmsg() : "");
    if (st != TP_OK) {
        /* A fault during init (a worker killed, a link cut while it runs) may
         * fail it; then every live worker must report the same outcome
         * (INIT-5), checked after the run. Without a fault it must succeed. */
        if (!tpsim_self_dead() && faults_fired(run->w.sim) == 0)
            tpsim_world_fail(&run->w, "%s: init_rpc: %s: %s", name, tp_status_name(st),
                             tp_errmsg());
        return 0;
    }
    if (def) { /* an experiment's own chaos, then the same phases */
        def->chaos(run, rank, world, def->arg);
        heal_then_finish(run, rank, world);
        return 0;
    }
    /* Chaos. */
    tpsim_pending *pend = calloc(SWARM_PENDING_MAX, sizeof *pend);
    size_t npend = 0;
    for (uint64_t i = 0; i < c->calls && pend && !tpsim_self_dead(); i++) {
        if (tp_sim_now_ns(run->w.sim) >= c->heal_ns)
            break;
        if (c->think_max_us)
            (void)tp_sleep((double)draw(c->think_max_us) / 1e6);
        tpsim_pending p;
        issue(run, rank, world, i, &p);
        if (p.f && npend < SWARM_PENDING_MAX)
            pend[npend++] = p;
        else if (p.f) /* no room to track it: treat it as fire and forget */
            tp_future_free(p.f);
    }
    /* Heal, then liveness: every chaos call ends, live workers answer. */
    tpsim_settle(&run->w, rank, pend, npend);
    free(pend);
    uint64_t now = tp_sim_now_ns(run->w.sim);
    if (now < c->heal_ns + 10 * MS_NS)
        (void)tp_sleep((double)(c->heal_ns + 10 * MS_NS - now) / 1e9);
    tpsim_liveness(&run->w, rank, world);
    tpsim_rrefs_settle(&run->w, rank);
    /* Work still running while shutdown drains (SHUTDOWN-5): fire and forget,
     * some with a timeout shorter than the function, so the callee still runs
     * it after the caller has given up: only the callee's count shows it. */
    for (int k = 0; k < 2 && !tpsim_self_dead(); k++) {
        int dst = (int)draw((uint64_t)world);
        if (tp_sim_host_dead(run->w.sim, (uint32_t)dst))
            continue;
        static const double late_timeouts[] = {0.0005, 0.003, 0.0};
        tpsim_op_spec spec = {.op = TPSIM_OP_FORGET,
                              .dst = dst,
                              .timeout_s = c->lossy ? finite(late_timeouts[draw(3)])
                                                    : late_timeouts[draw(3)],
                              .a = 1,
                              .b = 2,
                              .delay_us = (int64_t)draw(50000)};
        tpsim_pending p;
        tpsim_op_start(&run->w, rank, &spec, &p);
    }
    /* A then-callback whose call ends while shutdown drains: the drain must
     * wait for the callback and for the call it issues (SHUTDOWN-5). */
    if (c->mix[TPSIM_OP_THEN] && !tpsim_self_dead()) {
        static const double late_timeouts[] = {0.0005, 0.02, 2.0, 0.0};
        int dst = (int)draw((uint64_t)world), dst2 = (int)draw((uint64_t)world);
        double t = late_timeouts[draw(4)];
        int64_t delay_us = (int64_t)draw(50000), sleep_us = (int64_t)draw(20000);
        tpsim_cb_late_then(&run->w, rank, dst, dst2, c->lossy ? finite(t) : t, finite(t), delay_us,
                           sleep_us);
    }
    tpsim_callbacks_check(&run->w, rank, tpsim_worker_shutdown(&run->w, rank, world));
    return 0;
}

/* ---- One seed ------------------------------------------------------------------- */

typedef struct swarm_opts {
    uint64_t from, to;
    uint32_t jobs;
    uint32_t workers; /* 0: drawn per seed */
    int verbose;
    int expect_failure;
    const char *trace_path;
    const char *canary;
    const char *plan_text; /* --plan: replaces the seed's drawn fault plan */
    uint32_t calls;        /* --calls: replaces the drawn calls per worker (0: drawn) */
    int chaos;             /* --chaos: every world in chaos mode, with rref-heavy calls */
    int shrink;
    const uint8_t *bytes;  /* --bytes: one world decoded from these (SIM-14) */
    size_t bytes_len;
    const char *bytes_path;
    const char *save_bytes; /* --save-bytes: write the seed's world as bytes here */
    const tp_sim_experiment_def *def; /* an experiment's (sim_experiment.h), or NULL */
} swarm_opts;

/* The world of a seed, or of o->bytes (then *seed is set from them). When
 * o->save_bytes is set, the seed's draws are written there as bytes that
 * replay the same world; returns -1 when that fails. */
static int world_cfg(const swarm_opts *o, uint64_t *seed, swarm_cfg *cfg) {
    swarm_src src;
    memset(&src, 0, sizeof src);
    uint8_t *rec = NULL;
    if (o->bytes) {
        size_t head = o->bytes_len < SWARM_BYTES_SEED ? o->bytes_len : SWARM_BYTES_SEED;
        *seed = 0;
        for (size_t i = 0; i < head; i++)
            *seed |= (uint64_t)o->bytes[i] << (8 * i);
        src.in = o->bytes + head;
        src.in_len = o->bytes_len - head;
    } else {
        src.s = *seed ^ 0x5357524d53454544ull; /* "SWRMSEED": apart from the sim's streams */
        if (o->save_bytes) {
            rec = malloc(SWARM_BYTES_MAX);
            if (!rec)
                return -1;
            for (size_t i = 0; i < SWARM_BYTES_SEED; i++)
                rec[i] = (uint8_t)(*seed >> (8 * i));
            src.rec = rec;
            src.rec_len = SWARM_BYTES_SEED;
            src.rec_cap = SWARM_BYTES_MAX;
        }
    }
    draw_cfg(&src, *seed, o->workers, o->chaos, cfg);
    if (o->plan_text)
        snprintf(cfg->plan, sizeof cfg->plan, "%s", o->plan_text);
    if (o->calls)
        cfg->calls = o->calls;
    cfg->lossy = plan_loses(cfg->plan);
    if (cfg->lossy)
        cfg->default_timeout_s = finite(cfg->default_timeout_s);
    if (!rec)
        return 0;
    FILE *f = fopen(o->save_bytes, "wb");
    int ok = f && fwrite(rec, 1, src.rec_len, f) == src.rec_len;
    if (f && fclose(f) != 0)
        ok = 0;
    free(rec);
    return ok ? 0 : -1;
}

/* Runs one seed; fills *run's outcome and adds to *stats. Returns 1 when it failed. */
static int run_seed(const swarm_opts *o, uint64_t seed, swarm_stats *stats, FILE *out) {
    swarm_cfg cfg;
    if (world_cfg(o, &seed, &cfg) != 0) {
        fprintf(out, "FAIL seed=%" PRIu64 ": --save-bytes %s: %s\n", seed, o->save_bytes,
                strerror(errno));
        stats->seeds++;
        stats->failed++;
        return 1;
    }
    swarm_run run;
    memset(&run, 0, sizeof run);
    run.cfg = &cfg;
    run.def = o->def;
    run.w.ping_liveness = o->def != NULL;
    uint64_t cores_before = tp_core_live_count(); /* an earlier seed may have leaked */
    FILE *trace = o->trace_path ? fopen(o->trace_path, "w") : NULL;
    tp_sim_config sc = {
        .hosts = cfg.workers, .seed = seed, .time_limit_ns = 600 * S_NS, .trace = trace};
    if (tpsim_trace_is_json(o->trace_path)) { /* Perfetto's format, not the text */
        sc.trace = NULL;
        sc.perfetto = trace;
    }
    tp_sim *sim = NULL;
    tp_status st = tp_sim_new(&sc, &sim);
    char err[TP_ERRMSG_LEN_MAX];
    if (st == TP_OK)
        st = tp_sim_load_faults(sim, cfg.plan, err, sizeof err);
    else
        snprintf(err, sizeof err, "%s", tp_errmsg());
    if (st != TP_OK) {
        tpsim_world_fail(&run.w, "setup: %s: %s", tp_status_name(st), err);
    } else {
        run.w.sim = sim;
        if (o->def && o->def->begin)
            o->def->begin(&run, (int)cfg.workers, o->def->arg);
        int codes[SWARM_WORKERS_MAX];
        st = tp_sim_run(sim, swarm_program, &run, codes);
        if (o->def && o->def->end)
            o->def->end(&run, (int)cfg.workers, o->def->arg);
        if (st != TP_OK)
            tpsim_world_fail(&run.w, "the run did not end: %s: %s", tp_status_name(st),
                             tp_errmsg());
        /* INIT-5: one outcome for every worker alive at the end that
         * reached the store. One whose store failed at its deadline
         * (TP_ESTORE) never read the outcome, and publishes none. */
        int first_live = -1;
        for (uint32_t r = 0; r < cfg.workers; r++) {
            if (tp_sim_host_dead(sim, r) || run.init_status[r] == TP_ESTORE)
                continue;
            if (first_live < 0)
                first_live = (int)r;
            else if (run.init_status[r] != run.init_status[first_live])
                tpsim_world_fail(&run.w, "init outcomes disagree: w%d got %s (%s), w%u got %s (%s)",
                                 first_live, tp_status_name(run.init_status[first_live]),
                                 run.init_msg[first_live], r, tp_status_name(run.init_status[r]),
                                 run.init_msg[r]);
        }
        if (first_live >= 0 && run.init_status[first_live] != TP_OK)
            stats->init_failed++;
        /* A live worker was not shut down: its init never says so (a dead
         * host that could still write the store once made it). */
        if (first_live >= 0 && run.init_status[first_live] == TP_ESHUTDOWN)
            tpsim_world_fail(&run.w, "init reports TP_ESHUTDOWN on live w%d: %s", first_live,
                             run.init_msg[first_live]);
        if (tp_sim_violations(sim))
            tpsim_world_fail(&run.w, "oracle: %" PRIu64 " violation(s); first: %s",
                             tp_sim_violations(sim), tp_sim_violation(sim));
        for (int k = 0; k < TP_SIM_FAULT_KINDS_; k++) {
            uint64_t n = tp_sim_fault_count(sim, (tp_sim_fault_kind)k);
            stats->fault_fired[k] += n;
            stats->fault_seeds_fired[k] += n > 0;
            stats->fault_seeds_planned[k] += cfg.planned[k] > 0;
        }
        stats->events += tp_sim_events(sim);
        stats->violations += tp_sim_violations(sim);
    }
    for (int k = 0; k < TPSIM_OP_KINDS; k++)
        for (int j = 0; j < TPSIM_OUT_KINDS; j++) {
            stats->ops[k][j] += run.w.ops[k][j];
            stats->calls_checked += run.w.ops[k][j];
        }
    for (int b = 0; b < TPSIM_SETTLE_BUCKETS; b++)
        stats->settle_hist[b] += run.w.settle_hist[b];
    stats->seeds++;
    if (run.w.failed)
        stats->failed++;
    if (run.w.failed || o->verbose) {
        fprintf(out,
                "%s seed=%" PRIu64 " workers=%u pool=%u calls=%u window=%" PRIu64
                " timeout=%g trace=%016" PRIx64 "%s%s\n",
                run.w.failed ? "FAIL" : "PASS", seed, cfg.workers, cfg.pool, cfg.calls, cfg.window,
                cfg.default_timeout_s, sim ? tp_sim_trace_hash(sim) : 0,
                run.w.failed ? ": " : "", run.w.failed ? run.w.first : "");
        char flat[SWARM_PLAN_MAX];
        snprintf(flat, sizeof flat, "%s", cfg.plan);
        for (char *p = flat; *p; p++)
            if (*p == '\n')
                *p = p[1] ? ';' : '\0';
        fprintf(out, "  plan: %s\n", flat[0] ? flat : "(no faults)");
        if (run.w.failed && o->bytes) {
            fprintf(out, "  replay: %s --bytes %s%s%s --verbose --trace seed.trace\n",
                    replay_cmd, o->bytes_path ? o->bytes_path : "FILE",
                    o->canary ? " --canary " : "", o->canary ? o->canary : "");
        } else if (run.w.failed) {
            char extra[96] = "";
            if (o->workers)
                snprintf(extra, sizeof extra, " --workers %u", o->workers);
            if (o->chaos)
                snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " --chaos");
            if (o->canary)
                snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " --canary %s",
                         o->canary);
            fprintf(out,
                    "  replay: %s --seeds %" PRIu64 "%s --verbose --trace seed.trace\n",
                    replay_cmd, seed, extra);
        }
    }
    if (sim)
        tp_sim_free(sim);
    tpsim_callbacks_free(&run.w); /* after the teardown: no callback runs any more */
    if (trace)
        fclose(trace);
    /* Every handle was released and every world torn down: a worker core
     * still allocated is held by something that leaked (a call, a future). */
    uint64_t leaked = tp_core_live_count() - cores_before;
    if (leaked != 0 && !run.w.failed) {
        tpsim_world_fail(&run.w, "leak: %" PRIu64 " worker core(s) still allocated after the run",
                         leaked);
        stats->failed++;
        fprintf(out, "FAIL seed=%" PRIu64 ": %s\n", seed, run.w.first);
    }
    return run.w.failed != 0;
}

/* ---- Shrinking a failing seed -------------------------------------------------------- */

#define SHRINK_LINES_MAX 64

/*
 * Delta debugging on a failing seed: drops fault-plan lines one at a time
 * while the seed still fails, then halves the calls per worker while it
 * still fails. The world (workers, knobs, the workload's draws) stays the
 * seed's, so the result replays with --plan and --calls.
 */
static int shrink_seed(const swarm_opts *o, uint64_t seed) {
    swarm_cfg cfg;
    swarm_opts drawn = *o;
    drawn.plan_text = NULL;
    drawn.calls = 0;
    drawn.save_bytes = NULL;
    if (world_cfg(&drawn, &seed, &cfg) != 0)
        return 2;
    char plan[SWARM_PLAN_MAX];
    snprintf(plan, sizeof plan, "%s", o->plan_text ? o->plan_text : cfg.plan);
    uint32_t calls = o->calls ? o->calls : cfg.calls;
    FILE *quiet = fopen("/dev/null", "w");
    if (!quiet)
        return 2;
    swarm_opts q = *o;
    q.verbose = 0;
    q.trace_path = NULL;
    q.calls = calls;
    q.plan_text = plan;
    swarm_stats st;
    memset(&st, 0, sizeof st);
    unsigned runs = 1;
    if (!run_seed(&q, seed, &st, quiet)) {
        printf("shrink: seed %" PRIu64 " does not fail: nothing to shrink\n", seed);
        fclose(quiet);
        return 1;
    }
    char lines[SHRINK_LINES_MAX][256];
    int n = 0;
    for (char *p = plan; *p && n < SHRINK_LINES_MAX;) {
        size_t len = strcspn(p, "\n");
        snprintf(lines[n], sizeof lines[n], "%.*s", (int)len, p);
        n++;
        p += len + (p[len] == '\n');
    }
    int orig_lines = n;
    uint8_t keep[SHRINK_LINES_MAX];
    memset(keep, 1, sizeof keep);
    char cand[SWARM_PLAN_MAX];
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < n; i++) {
            if (!keep[i])
                continue;
            size_t off = 0;
            cand[0] = '\0';
            for (int j = 0; j < n; j++)
                if (keep[j] && j != i)
                    off += (size_t)snprintf(cand + off, sizeof cand - off, "%s\n", lines[j]);
            q.plan_text = cand;
            runs++;
            if (run_seed(&q, seed, &st, quiet)) {
                keep[i] = 0;
                changed = 1;
            }
        }
    }
    size_t off = 0;
    plan[0] = '\0';
    int kept = 0;
    for (int j = 0; j < n; j++)
        if (keep[j]) {
            off += (size_t)snprintf(plan + off, sizeof plan - off, "%s\n", lines[j]);
            kept++;
        }
    q.plan_text = plan;
    while (calls > 1) {
        q.calls = calls / 2;
        runs++;
        if (!run_seed(&q, seed, &st, quiet))
            break;
        calls /= 2;
    }
    fclose(quiet);
    char path[64];
    snprintf(path, sizeof path, "seed-%" PRIu64 ".plan", seed);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(plan, f);
        fclose(f);
    }
    printf("shrink: seed %" PRIu64 " still fails with %d of %d plan lines and %u calls per worker "
           "(%u runs)\n",
           seed, kept, orig_lines, calls, runs);
    for (int j = 0; j < n; j++)
        if (keep[j])
            printf("  %s\n", lines[j]);
    printf("  replay: %s --seeds %" PRIu64 " --plan %s --calls %u%s%s%s --verbose\n", replay_cmd,
           seed, f ? path : "(could not write the plan)", calls, o->chaos ? " --chaos" : "",
           o->canary ? " --canary " : "", o->canary ? o->canary : "");
    return 0;
}

/*
 * The same for a bytes world (SIM-14): delta debugging on the bytes. Cuts
 * chunks (half the input, then a quarter, ... one byte) while the world
 * still fails; cutting the tail removes faults, cutting inside shifts the
 * later draws. Writes BYTES_PATH.min. afl-tmin does the same job on the
 * fuzz harness (fuzz/README.md).
 */
static int shrink_bytes(const swarm_opts *o) {
    FILE *quiet = fopen("/dev/null", "w");
    uint8_t *cur = malloc(o->bytes_len + 1), *cand = malloc(o->bytes_len + 1);
    if (!quiet || !cur || !cand) {
        if (quiet)
            fclose(quiet);
        free(cur);
        free(cand);
        return 2;
    }
    memcpy(cur, o->bytes, o->bytes_len);
    size_t len = o->bytes_len;
    swarm_opts q = *o;
    q.verbose = 0;
    q.trace_path = NULL;
    q.save_bytes = NULL;
    swarm_stats st;
    memset(&st, 0, sizeof st);
    unsigned runs = 1;
    q.bytes = cur;
    q.bytes_len = len;
    if (!run_seed(&q, 0, &st, quiet)) {
        printf("shrink: %s does not fail: nothing to shrink\n", o->bytes_path);
        fclose(quiet);
        free(cur);
        free(cand);
        return 1;
    }
    for (size_t chunk = len / 2 ? len / 2 : 1; chunk >= 1; chunk /= 2) {
        for (size_t at = 0; at < len;) {
            size_t cut = chunk < len - at ? chunk : len - at;
            memcpy(cand, cur, at);
            memcpy(cand + at, cur + at + cut, len - at - cut);
            q.bytes = cand;
            q.bytes_len = len - cut;
            runs++;
            if (run_seed(&q, 0, &st, quiet)) {
                memcpy(cur, cand, len - cut);
                len -= cut;
            } else {
                at += cut;
            }
        }
        if (chunk == 1)
            break;
    }
    fclose(quiet);
    char path[4096];
    snprintf(path, sizeof path, "%s.min", o->bytes_path);
    FILE *f = fopen(path, "wb");
    int wrote = f && fwrite(cur, 1, len, f) == len;
    if (f && fclose(f) != 0)
        wrote = 0;
    printf("shrink: %s still fails with %zu of %zu bytes (%u runs)\n", o->bytes_path, len,
           o->bytes_len, runs);
    printf("  replay: %s --bytes %s%s%s --verbose\n", replay_cmd,
           wrote ? path : "(could not write it)", o->canary ? " --canary " : "",
           o->canary ? o->canary : "");
    free(cur);
    free(cand);
    return wrote ? 0 : 2;
}

int tpsim_swarm_bytes(const uint8_t *data, size_t len, FILE *out) {
    swarm_opts o;
    memset(&o, 0, sizeof o);
    o.jobs = 1;
    o.bytes = data;
    o.bytes_len = len;
    swarm_stats st;
    memset(&st, 0, sizeof st);
    return run_seed(&o, 0, &st, out);
}

/* ---- Many seeds ------------------------------------------------------------------ */

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Stats travel from a job to the parent as one line of numbers. */
static void stats_write(FILE *f, const swarm_stats *s) {
    const uint64_t *w = (const uint64_t *)s;
    fputs("S", f);
    for (size_t i = 0; i < sizeof *s / sizeof *w; i++)
        fprintf(f, " %" PRIu64, w[i]);
    fputs("\n", f);
}

static int stats_read(const char *line, swarm_stats *add) {
    swarm_stats s;
    uint64_t *w = (uint64_t *)&s;
    const char *p = line + 1;
    for (size_t i = 0; i < sizeof s / sizeof *w; i++) {
        char *end;
        errno = 0;
        w[i] = strtoull(p, &end, 10);
        if (end == p || errno)
            return -1;
        p = end;
    }
    uint64_t *a = (uint64_t *)add;
    for (size_t i = 0; i < sizeof s / sizeof *w; i++)
        a[i] += w[i];
    return 0;
}

static void print_summary(const swarm_opts *o, const swarm_stats *s, double wall_s) {
    printf("%s: %" PRIu64 " seeds (%" PRIu64 "..%" PRIu64 ") in %.1f s wall, %.0f seeds/s, "
           "%" PRIu64 " failed%s%s\n",
           o->def ? prog : "swarm", s->seeds, o->from, o->to, wall_s, wall_s > 0 ? (double)s->seeds / wall_s : 0.0,
           s->failed, o->canary ? ", canary " : "", o->canary ? o->canary : "");
    printf("events=%" PRIu64 " outcomes_checked=%" PRIu64 " oracle_violations=%" PRIu64
           " init_failed_under_faults=%" PRIu64 "\n",
           s->events, s->calls_checked, s->violations, s->init_failed);
    printf("rrefs settled after the heal (workers): %" PRIu64 " within 10 ms, %" PRIu64
           " within 100 ms, %" PRIu64 " within 1 s, %" PRIu64 " within 10 s, %" PRIu64
           " within 60 s\n",
           s->settle_hist[0], s->settle_hist[1], s->settle_hist[2], s->settle_hist[3],
           s->settle_hist[4]);
    printf("\nfault kind       seeds planned  seeds fired   times fired\n");
    for (int k = 0; k < TP_SIM_FAULT_KINDS_; k++)
        printf("%-16s %13" PRIu64 " %12" PRIu64 " %13" PRIu64 "%s\n",
               tp_sim_fault_kind_name((tp_sim_fault_kind)k), s->fault_seeds_planned[k],
               s->fault_seeds_fired[k], s->fault_fired[k],
               s->fault_fired[k] != 0 ? "" : "   <- never fired");
    printf("\noperation ");
    for (int j = 0; j < TPSIM_OUT_KINDS; j++)
        printf(" %10s", tpsim_out_names[j]);
    printf("\n");
    for (int k = 0; k < TPSIM_OP_KINDS; k++) {
        if (o->def && k != TPSIM_OP_LIVENESS)
            continue; /* an experiment's chaos is its own */
        printf("%-10s", tpsim_op_names[k]);
        uint64_t total = 0;
        for (int j = 0; j < TPSIM_OUT_KINDS; j++) {
            printf(" %10" PRIu64, s->ops[k][j]);
            total += s->ops[k][j];
        }
        printf("%s\n", total == 0 ? "   <- never ran" : "");
    }
}

/* Runs seeds from, from + step, ... <= to, writing results to out (a job's
 * pipe, or stdout); the parent reads "F"/"S"/"P" lines from jobs. */
static void run_range(const swarm_opts *o, uint64_t from, uint64_t step, swarm_stats *stats,
                      FILE *out, int progress_lines) {
    double last = wall_now();
    for (uint64_t seed = from; seed <= o->to && seed >= from; seed += step) {
        run_seed(o, seed, stats, out);
        if (progress_lines) {
            fprintf(out, "P %" PRIu64 " %" PRIu64 "\n", stats->seeds, stats->failed);
            fflush(out);
        } else if (isatty(2) && wall_now() - last > 1.0) {
            last = wall_now();
            fprintf(stderr, "\rswarm: %" PRIu64 " seeds, %" PRIu64 " failed   ", stats->seeds,
                    stats->failed);
        }
        if (step > o->to - seed)
            break;
    }
}

static int run_jobs(const swarm_opts *o, swarm_stats *total) {
    int fds[SWARM_JOBS_MAX];
    pid_t pids[SWARM_JOBS_MAX];
    uint32_t jobs = o->jobs;
    for (uint32_t j = 0; j < jobs; j++) {
        int p[2];
        if (pipe(p) != 0) {
            perror(prog);
            return -1;
        }
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) {
            perror(prog);
            return -1;
        }
        if (pid == 0) {
            close(p[0]);
            FILE *out = fdopen(p[1], "w");
            swarm_stats s;
            memset(&s, 0, sizeof s);
            if (o->from + j <= o->to)
                run_range(o, o->from + j, jobs, &s, out, 1);
            stats_write(out, &s);
            fclose(out);
            _exit(0);
        }
        close(p[1]);
        fds[j] = p[0];
        pids[j] = pid;
    }
    /* Read every job's lines; a progress line on stderr about once a second. */
    FILE *in[SWARM_JOBS_MAX];
    uint64_t done[SWARM_JOBS_MAX] = {0}, failed[SWARM_JOBS_MAX] = {0};
    int open_jobs = (int)jobs, rc = 0;
    for (uint32_t j = 0; j < jobs; j++)
        in[j] = fdopen(fds[j], "r");
    double t0 = wall_now(), last = t0;
    char line[SWARM_PLAN_MAX + 512];
    while (open_jobs > 0) {
        struct pollfd pf[SWARM_JOBS_MAX];
        for (uint32_t j = 0; j < jobs; j++)
            pf[j] = (struct pollfd){.fd = in[j] ? fds[j] : -1, .events = POLLIN};
        if (poll(pf, jobs, 1000) < 0 && errno != EINTR)
            break;
        for (uint32_t j = 0; j < jobs; j++) {
            if (!in[j] || !(pf[j].revents & (POLLIN | POLLHUP)))
                continue;
            if (!fgets(line, sizeof line, in[j])) {
                fclose(in[j]);
                in[j] = NULL;
                open_jobs--;
                continue;
            }
            if (line[0] == 'P')
                (void)sscanf(line + 1, "%" SCNu64 " %" SCNu64, &done[j], &failed[j]);
            else if (line[0] == 'S')
                rc |= stats_read(line, total);
            else
                fputs(line, stdout); /* failure reports */
        }
        double now = wall_now();
        if (now - last >= 1.0) {
            last = now;
            uint64_t d = 0, f = 0;
            for (uint32_t j = 0; j < jobs; j++) {
                d += done[j];
                f += failed[j];
            }
            fprintf(stderr,
                    "swarm: %" PRIu64 "/%" PRIu64 " seeds, %.0f seeds/s, %" PRIu64 " failed\n", d,
                    o->to - o->from + 1, (double)d / (now - t0), f);
        }
    }
    for (uint32_t j = 0; j < jobs; j++) {
        int status = 0;
        if (waitpid(pids[j], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "%s: job %u died (status %d): its seeds are not counted\n", prog, j,
                    status);
            rc = -1;
        }
    }
    return rc;
}

/* ---- Command line ---------------------------------------------------------------- */

static int swarm_usage(FILE *out) {
    fprintf(out, "usage: %s --seeds A..B [--jobs N] [--workers N] [--verbose]\n"
                 "          [--trace FILE] [--canary NAME] [--expect-failure]\n"
                 "          [--plan FILE] [--calls N] [--chaos] [--shrink] [--save-bytes FILE]\n"
                 "       %s --bytes FILE [--shrink] [...]\n"
                 "\n"
                 "Runs one randomized world per seed: chaos (faults), heal, liveness, graceful\n"
                 "shutdown, then the oracle's final checks. Prints each failing seed with its\n"
                 "plan and a replay command, then a summary with how often each fault kind and\n"
                 "each operation's outcome happened. Exit 0 when no seed failed, 1 when one did\n"
                 "(with --expect-failure: the other way round), 2 on a usage error.\n"
                 "\n"
                 "  --seeds A..B   the seeds, inclusive (A alone: one seed)\n"
                 "  --jobs N       run in N processes (default 1)\n"
                 "  --workers N    every world has N workers (default: drawn, 2..16)\n"
                 "  --verbose      print every seed, not only failing ones\n"
                 "  --trace FILE   write the canonical trace (one seed only)\n"
                 "  --canary NAME  run a deliberately broken core (tpsim_canary only)\n"
                 "  --plan FILE    use this fault plan instead of the seed's drawn one\n"
                 "  --calls N      every worker issues N chaos calls instead of the drawn count\n"
                 "  --chaos        every world adds the chaos network mode (loss, duplication,\n"
                 "                 reordering) and leans its calls on rrefs (remote, share)\n"
                 "  --shrink       one failing seed: drop plan lines and halve the calls while it\n"
                 "                 still fails; print the smallest and write seed-S.plan\n"
                 "                 (with --bytes: cut bytes while it fails; write FILE.min)\n"
                 "  --bytes FILE   run the one world these bytes decode to (spec/sim.md SIM-14)\n"
                 "  --save-bytes FILE  write one seed's world as bytes that replay it\n"
                 "  --expect-failure  succeed only when some seed fails (for canaries)\n", prog, prog);
    return out == stdout ? 0 : 2;
}

static int parse_u64_arg(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-')
        return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end)
        return 0;
    *out = v;
    return 1;
}

/* The command line; *plan_buf and *bytes_buf (--plan's text, --bytes'
 * contents) are the caller's to free, whichever way this returns. */
static int swarm_main(const tp_sim_experiment_def *def, int argc, char **argv, char **plan_bufp,
                      uint8_t **bytes_bufp) {
    swarm_opts o;
    memset(&o, 0, sizeof o);
    o.jobs = 1;
    o.def = def;
    char *plan_buf = NULL;
    uint8_t *bytes_buf = NULL;
    int have_seeds = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return swarm_usage(stdout);
        if (strcmp(a, "--verbose") == 0) {
            o.verbose = 1;
        } else if (strcmp(a, "--expect-failure") == 0) {
            o.expect_failure = 1;
        } else if (strcmp(a, "--seeds") == 0 && v) {
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            char *dots = strstr(buf, "..");
            if (dots)
                *dots = '\0';
            if (!parse_u64_arg(buf, &o.from) ||
                (dots ? !parse_u64_arg(dots + 2, &o.to) : !parse_u64_arg(buf, &o.to)) ||
                o.to < o.from) {
                fprintf(stderr, "%s: --seeds '%s': expected A..B with A <= B\n", prog, v);
                return 2;
            }
            have_seeds = 1;
            i++;
        } else if (strcmp(a, "--jobs") == 0 && v) {
            if (!parse_u64_arg(v, &n) || n < 1 || n > SWARM_JOBS_MAX) {
                fprintf(stderr, "%s: --jobs '%s': expected 1..%d\n", prog, v, SWARM_JOBS_MAX);
                return 2;
            }
            o.jobs = (uint32_t)n;
            i++;
        } else if (strcmp(a, "--workers") == 0 && v) {
            if (!parse_u64_arg(v, &n) || n < 2 || n > SWARM_WORKERS_MAX) {
                fprintf(stderr, "%s: --workers '%s': expected 2..%d\n", prog, v,
                        SWARM_WORKERS_MAX);
                return 2;
            }
            o.workers = (uint32_t)n;
            i++;
        } else if (strcmp(a, "--trace") == 0 && v) {
            o.trace_path = v;
            i++;
        } else if (strcmp(a, "--canary") == 0 && v) {
            o.canary = v;
            i++;
        } else if (strcmp(a, "--shrink") == 0) {
            o.shrink = 1;
        } else if (strcmp(a, "--chaos") == 0) {
            o.chaos = 1;
        } else if (strcmp(a, "--calls") == 0 && v) {
            if (!parse_u64_arg(v, &n) || n < 1 || n > 100000) {
                fprintf(stderr, "%s: --calls '%s': expected 1..100000\n", prog, v);
                return 2;
            }
            o.calls = (uint32_t)n;
            i++;
        } else if (strcmp(a, "--bytes") == 0 && v) {
            FILE *bf = fopen(v, "rb");
            if (!bf) {
                fprintf(stderr, "%s: --bytes %s: %s\n", prog, v, strerror(errno));
                return 2;
            }
            if (bytes_buf) {
                fclose(bf);
                fprintf(stderr, "%s: --bytes given twice\n", prog);
                return 2;
            }
            bytes_buf = *bytes_bufp = malloc(SWARM_BYTES_MAX + 1);
            size_t got = bytes_buf ? fread(bytes_buf, 1, SWARM_BYTES_MAX + 1, bf) : 0;
            fclose(bf);
            if (!bytes_buf || got > SWARM_BYTES_MAX) {
                fprintf(stderr, "%s: --bytes %s: larger than %d bytes\n", prog, v,
                        SWARM_BYTES_MAX);
                return 2;
            }
            o.bytes = bytes_buf;
            o.bytes_len = got;
            o.bytes_path = v;
            i++;
        } else if (strcmp(a, "--save-bytes") == 0 && v) {
            o.save_bytes = v;
            i++;
        } else if (strcmp(a, "--plan") == 0 && v) {
            FILE *pf = fopen(v, "r");
            if (!pf) {
                fprintf(stderr, "%s: --plan %s: %s\n", prog, v, strerror(errno));
                return 2;
            }
            if (plan_buf) {
                fclose(pf);
                fprintf(stderr, "%s: --plan given twice\n", prog);
                return 2;
            }
            plan_buf = *plan_bufp = calloc(1, SWARM_PLAN_MAX);
            size_t got = plan_buf ? fread(plan_buf, 1, SWARM_PLAN_MAX - 1, pf) : 0;
            fclose(pf);
            if (!plan_buf || got == SWARM_PLAN_MAX - 1) {
                fprintf(stderr, "%s: --plan %s: larger than %d bytes\n", prog, v,
                        SWARM_PLAN_MAX - 1);
                return 2;
            }
            o.plan_text = plan_buf;
            i++;
        } else {
            fprintf(stderr, "%s: unknown or incomplete option '%s'\n", prog, a);
            return swarm_usage(stderr);
        }
    }
    if (o.bytes && (have_seeds || o.save_bytes || o.plan_text || o.calls)) {
        fprintf(stderr, "%s: --bytes is the whole world: no --seeds, --save-bytes, "
                        "--plan or --calls with it\n", prog);
        return 2;
    }
    if (o.bytes) { /* the seed shown is the one in the bytes */
        for (size_t b = 0; b < SWARM_BYTES_SEED && b < o.bytes_len; b++)
            o.from |= (uint64_t)o.bytes[b] << (8 * b);
        o.to = o.from;
        have_seeds = 1;
    }
    if (!have_seeds) {
        fprintf(stderr, "%s: --seeds or --bytes is required\n", prog);
        return swarm_usage(stderr);
    }
    if (o.save_bytes && (o.from != o.to || o.plan_text || o.calls)) {
        fprintf(stderr, "%s: --save-bytes takes one seed (--seeds S) and its drawn "
                        "plan and calls\n", prog);
        return 2;
    }
    if (o.shrink && o.from != o.to) {
        fprintf(stderr, "%s: --shrink takes one seed (--seeds S)\n", prog);
        return 2;
    }
    if (o.trace_path && o.from != o.to) {
        fprintf(stderr, "%s: --trace takes one seed (--seeds S)\n", prog);
        return 2;
    }
    if (o.canary) {
#ifdef TP_CANARIES
        int found = 0;
        for (int k = 1; tpi_canary_name(k); k++)
            if (strcmp(tpi_canary_name(k), o.canary) == 0) {
                tpi_canary = k;
                found = 1;
            }
        if (!found) {
            fprintf(stderr, "%s: unknown canary '%s'; known:", prog, o.canary);
            for (int k = 1; tpi_canary_name(k); k++)
                fprintf(stderr, " %s", tpi_canary_name(k));
            fprintf(stderr, "\n");
            return 2;
        }
#else
        fprintf(stderr, "%s: --canary needs tpsim_canary (a build with TP_CANARIES)\n", prog);
        return 2;
#endif
    }
    if (def)
        snprintf(replay_cmd, sizeof replay_cmd, "%s", argv[0]);
    else
        snprintf(replay_cmd, sizeof replay_cmd, "tpsim%s swarm", o.canary ? "_canary" : "");
    tp_register_builtin_backends();
    if (o.shrink) {
        return o.bytes ? shrink_bytes(&o) : shrink_seed(&o, o.from);
    }
    swarm_stats stats;
    memset(&stats, 0, sizeof stats);
    double t0 = wall_now();
    int rc = 0;
    if (o.jobs > 1 && o.to - o.from >= 1)
        rc = run_jobs(&o, &stats);
    else
        run_range(&o, o.from, 1, &stats, stdout, 0);
    if (isatty(2) && o.jobs <= 1)
        fprintf(stderr, "\r\n");
    print_summary(&o, &stats, wall_now() - t0);
    if (rc != 0)
        return 2;
    if (o.expect_failure) {
        printf("%s: the %s canary %s\n", stats.failed ? "PASS" : "FAIL",
               o.canary ? o.canary : "(none)", stats.failed ? "was caught" : "survived every seed");
        return stats.failed ? 0 : 1;
    }
    return stats.failed ? 1 : 0;
}

static int main_with(const tp_sim_experiment_def *def, int argc, char **argv) {
    char *plan_buf = NULL;
    uint8_t *bytes_buf = NULL;
    int rc = swarm_main(def, argc, argv, &plan_buf, &bytes_buf);
    free(plan_buf);
    free(bytes_buf);
    return rc;
}

int tpsim_swarm_main(int argc, char **argv) {
    return main_with(NULL, argc, argv);
}

/* ---- Experiments (sim_experiment.h, spec/sim.md SIM-15) ------------------------- */

int tp_sim_experiment_main(const tp_sim_experiment_def *def, int argc, char **argv) {
    if (!def || !def->chaos || argc < 1 || !argv || !argv[0]) {
        fprintf(stderr, "tp_sim_experiment_main: %s\n",
                !def || !def->chaos ? "the definition has no chaos phase" : "no argv[0]");
        return 2;
    }
    prog = def->name ? def->name : argv[0];
    return main_with(def, argc, argv);
}

void tp_sim_experiment_fail(tp_sim_experiment *x, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tpsim_world_vfail(&x->w, fmt, ap);
    va_end(ap);
}

uint64_t tp_sim_experiment_heal_ns(const tp_sim_experiment *x) {
    return x->cfg->heal_ns;
}

uint64_t tp_sim_experiment_seed(const tp_sim_experiment *x) {
    return x->cfg->seed;
}
