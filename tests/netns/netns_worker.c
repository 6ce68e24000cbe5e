/*
 * netns_worker.c: one worker of the network-namespace suite (tests/netns/,
 * spec/tcp.md TCP-24). netns_test.sh starts one per namespace with `ip
 * netns exec`, with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TP_SECRET,
 * NETNS_ADDR (the address it listens on), NETNS_CTL (the command that cuts
 * and heals links) and NETNS_KEEPALIVE ("idle,interval,count" seconds), and
 * the scenario's name as its argument:
 *
 *   netns_worker cut|blip|oneway|slow|sdheal|sdcut|mid|down|rescue
 *
 * Rank 0 drives: it makes the calls, cuts and heals links by running
 * "$NETNS_CTL <verb> <rank>" (a shell command run with system(), the one
 * way in the suite to reach the switch namespace), and checks every call
 * by the rules of the simulator's oracle (spec/sim.md SIM-9) on a real
 * clock: a call ends exactly once; it never ends TP_ETIMEDOUT before its
 * deadline, nor ends at all later than its deadline plus SLACK_MS; a call
 * that succeeded ran exactly once on its callee and none ran twice; a
 * failure names the worker. Every rank ends with a graceful shutdown that
 * rank 0 releases at one instant, and checks its status, message and
 * duration against what rank 0 tells it to expect.
 *
 * Peer-down verdicts are seen through the log (tp_set_log_callback at
 * info): the core logs each one as "worker 'workerN' (id N) is down" or
 * "... is unreachable (connection lost)".
 *
 * Exit status 0 when every check held; 1 otherwise (each failed check is
 * printed); 2 for a usage error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tensorplay/rpc.h"

/* A real clock's slack where the oracle's is 1 ms of virtual time: timers,
 * a loaded 2-core machine, `tc` and `ip` run in between. */
#define SLACK_MS 300
/* Linux's TCP_RTO_MIN: user_timeout counts from the first retransmission
 * of the oldest unacknowledged byte, one retransmission timeout (at least
 * this, on a quiet LAN about this) after it was sent (TCP-23). */
#define RTO_MIN_S 0.2
#define RUNS_MAX 256 /* call sequence numbers a callee tracks */
#define WORLD_MAX 8
#define CALLS_MAX 16 /* calls one step of a scenario makes */
#define LOG_MAX 256  /* peer-down lines kept */
#define LOG_LINE 320
#define RELEASE_WAIT_S 60 /* a worker waits this long for rank 0's release */

static int g_rank, g_world, g_failed;
static double g_ut_s, g_intvl_s; /* user timeout and keepalive interval (TCP-23) */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double secs(uint64_t ns) {
    return (double)ns / 1e9;
}

static void sleep_until(uint64_t t) {
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    printf("[%.3f] rank %d: %s\n", secs(now_ns()), g_rank, buf);
    fflush(stdout);
}

/* A failed check: printed, and the exit status becomes 1; the scenario goes
 * on so that one run shows every difference. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            say("CHECK FAILED (%s:%d): %s", __FILE__, __LINE__, #cond);                            \
            say(__VA_ARGS__);                                                                      \
            g_failed = 1;                                                                          \
        }                                                                                          \
    } while (0)

/* ---- Peer-down lines from the log ------------------------------------------------- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t t;
    char msg[LOG_LINE];
} log_lines[LOG_MAX];
static int log_n;

/* TCP-22: no frame between namespaces goes through shared memory; the
 * acceptor of each offer says why it refused it (at INFO). */
static atomic_int shm_used, shm_refused_netns;

static void on_log(tp_log_level level, const char *msg, void *user_data) {
    (void)user_data;
    uint64_t t = now_ns();
    if (getenv("NETNS_VERBOSE")) {
        printf("[%.3f] rank %d log %s: %s\n", secs(t), g_rank, tp_log_level_name(level), msg);
        fflush(stdout);
    }
    if (strstr(msg, "go through shared memory") || strstr(msg, "go through a shared memory"))
        atomic_store(&shm_used, 1);
    if (strstr(msg, "no shared memory with") && strstr(msg, "another network namespace"))
        atomic_fetch_add(&shm_refused_netns, 1);
    if (!strstr(msg, ") is down") && !strstr(msg, ") is unreachable"))
        return;
    pthread_mutex_lock(&log_mu);
    if (log_n < LOG_MAX) {
        log_lines[log_n].t = t;
        snprintf(log_lines[log_n].msg, LOG_LINE, "%s", msg);
        log_n++;
    }
    pthread_mutex_unlock(&log_mu);
}

/* The first peer-down line holding who at or after t0 (its time, 0 when
 * none), copied to msg. */
static uint64_t line_after(const char *who, uint64_t t0, char *msg, size_t len) {
    uint64_t t = 0;
    pthread_mutex_lock(&log_mu);
    for (int i = 0; i < log_n && t == 0; i++) {
        if (log_lines[i].t >= t0 && strstr(log_lines[i].msg, who)) {
            t = log_lines[i].t;
            if (msg)
                snprintf(msg, len, "%s", log_lines[i].msg);
        }
    }
    pthread_mutex_unlock(&log_mu);
    return t;
}

/* The first peer-down line about rank r at or after t0. */
static uint64_t down_after(int r, uint64_t t0, char *msg, size_t len) {
    char who[64];
    snprintf(who, sizeof who, "worker 'worker%d' (id %d) is ", r, r);
    return line_after(who, t0, msg, len);
}

static uint64_t await_down(int r, uint64_t t0, double timeout_s, char *msg, size_t len) {
    uint64_t end = now_ns() + (uint64_t)(timeout_s * 1e9);
    uint64_t t;
    while ((t = down_after(r, t0, msg, len)) == 0 && now_ns() < end)
        sleep_until(now_ns() + 5000000);
    return t;
}

/* TCP-23: a silent or cut-off worker is unreachable (TP_EIO), never dead
 * (TP_EPEERDOWN, "... is down"): checks no such line about rank r since t0. */
static void expect_alive(int r, uint64_t t0) {
    char who[64];
    snprintf(who, sizeof who, "worker 'worker%d' (id %d) is down", r, r);
    pthread_mutex_lock(&log_mu);
    for (int i = 0; i < log_n; i++)
        CHECK(log_lines[i].t < t0 || !strstr(log_lines[i].msg, who),
              "a live worker declared dead: %s", log_lines[i].msg);
    pthread_mutex_unlock(&log_mu);
}

static void print_downs(void) {
    pthread_mutex_lock(&log_mu);
    for (int i = 0; i < log_n; i++)
        printf("[%.3f] rank %d peer-down: %s\n", secs(log_lines[i].t), g_rank, log_lines[i].msg);
    pthread_mutex_unlock(&log_mu);
    fflush(stdout);
}

/* ---- Functions every worker serves ------------------------------------------------- */

static atomic_int runs[RUNS_MAX]; /* runs of work(seq) here, by seq */

static tp_status args_ints(const tp_value *args, size_t n, int64_t *v) {
    if (tp_list_len(args) < n)
        return TP_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (tp_value_get_int(tp_list_get(args, i), &v[i]) != TP_OK)
            return TP_EINVAL;
    return TP_OK;
}

/* work(seq, sleep_ms): counts a run of seq, sleeps, answers seq. */
static tp_status fn_work(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t v[2];
    if (args_ints(args, 2, v) != TP_OK || v[0] < 0 || v[0] >= RUNS_MAX || v[1] < 0 ||
        v[1] > 60000) {
        tp_call_set_error(call, "work takes seq (0..%d) and sleep_ms (0..60000)", RUNS_MAX - 1);
        return TP_EINVAL;
    }
    atomic_fetch_add(&runs[v[0]], 1);
    if (v[1] > 0)
        (void)tp_sleep((double)v[1] / 1000.0);
    *result = tp_value_int(v[0]);
    return *result ? TP_OK : TP_ENOMEM;
}

/* runs(seq): how often work(seq) ran here. */
static tp_status fn_runs(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t seq;
    if (args_ints(args, 1, &seq) != TP_OK || seq < 0 || seq >= RUNS_MAX) {
        tp_call_set_error(call, "runs takes seq (0..%d)", RUNS_MAX - 1);
        return TP_EINVAL;
    }
    *result = tp_value_int(atomic_load(&runs[seq]));
    return *result ? TP_OK : TP_ENOMEM;
}

/* What a worker's graceful shutdown must give: a status in ok_mask (bit
 * 1 << status), within max_ms, a message holding must. */
typedef struct expect {
    int64_t max_ms;
    uint32_t ok_mask;
    char must[64];
} expect;

static atomic_int released;
static uint64_t release_start_ns;
static expect release_expect;

/* release(start_ns, max_ms, ok_mask, must): shut down at start_ns, expecting that. */
static tp_status fn_release(tp_call *call, const tp_value *args, const tp_value *kwargs,
                            tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    int64_t v[3];
    const char *must = NULL;
    size_t len = 0;
    if (args_ints(args, 3, v) != TP_OK || tp_list_len(args) != 4 ||
        tp_value_get_str(tp_list_get(args, 3), &must, &len) != TP_OK ||
        len >= sizeof release_expect.must) {
        tp_call_set_error(call, "release takes start_ns, max_ms, ok_mask, must");
        return TP_EINVAL;
    }
    *result = NULL;
    if (atomic_load(&released))
        return TP_OK; /* a retry whose first answer was lost: the first stands */
    release_start_ns = (uint64_t)v[0];
    release_expect.max_ms = v[1];
    release_expect.ok_mask = (uint32_t)v[2];
    memcpy(release_expect.must, must, len);
    release_expect.must[len] = '\0';
    atomic_store(&released, 1); /* after the fields: the main thread reads them after this */
    return TP_OK;
}

/* Graceful shutdown at start, checked against e. */
static void shutdown_checked(uint64_t start, const expect *e) {
    sleep_until(start);
    uint64_t t0 = now_ns();
    tp_status st = tp_shutdown(1);
    double took = secs(now_ns() - t0);
    const char *msg = st == TP_OK ? "" : tp_errmsg();
    say("shutdown: %s after %.3f s%s%s", tp_status_name(st), took, *msg ? ": " : "", msg);
    CHECK(e->ok_mask & (1u << st), "shutdown status %s not expected", tp_status_name(st));
    CHECK(took * 1000.0 <= (double)e->max_ms, "shutdown took %.3f s, over %.3f s", took,
          (double)e->max_ms / 1000.0);
    CHECK(!e->must[0] || strstr(msg, e->must), "shutdown message lacks '%s'", e->must);
}

/* ---- Calls, checked by the oracle's rules ------------------------------------------ */

typedef struct tcall {
    tp_future *f;
    int dst;
    int64_t seq;
    double timeout_s;
    uint64_t t_issue;
    atomic_int ends;            /* completions seen: must be exactly 1 */
    atomic_uint_fast64_t t_end; /* set by the first, after st and msg */
    tp_status st;
    char msg[LOG_LINE];
} tcall;

static int64_t next_seq;

static void on_done(tp_future *f, void *user_data) {
    tcall *c = user_data;
    uint64_t t = now_ns();
    if (atomic_fetch_add(&c->ends, 1) != 0)
        return;
    c->st = tp_future_status(f);
    snprintf(c->msg, sizeof c->msg, "%s", tp_future_error(f));
    atomic_store(&c->t_end, t);
}

/* Starts work(seq, sleep_ms) on dst with timeout_s. */
static void issue(tcall *c, int dst, int64_t sleep_ms, double timeout_s) {
    memset(c, 0, sizeof *c);
    c->dst = dst;
    c->seq = next_seq++;
    c->timeout_s = timeout_s;
    tp_value *args = tp_value_list_of(2, tp_value_int(c->seq), tp_value_int(sleep_ms));
    c->t_issue = now_ns();
    tp_status st = tp_rpc_async(tp_to_rank(dst), "work", args, NULL, timeout_s, &c->f);
    tp_value_free(args);
    if (st == TP_OK)
        st = tp_future_add_done_callback(c->f, on_done, c);
    if (st != TP_OK) { /* refused before sending: it ends here, once */
        c->st = st;
        snprintf(c->msg, sizeof c->msg, "%s", tp_errmsg());
        atomic_store(&c->ends, 1);
        atomic_store(&c->t_end, now_ns());
    }
}

/* Waits until every call ended (its callback ran), then a little more so a
 * second end would be seen; checks each ended once and on time. */
static void settle(tcall *c, int n) {
    for (int i = 0; i < n; i++) {
        if (c[i].f)
            (void)tp_future_wait(c[i].f, c[i].timeout_s + 10);
        uint64_t end = now_ns() + 5000000000ull;
        while (atomic_load(&c[i].t_end) == 0 && now_ns() < end)
            sleep_until(now_ns() + 1000000);
    }
    sleep_until(now_ns() + 50000000);
    for (int i = 0; i < n; i++) {
        tcall *x = &c[i];
        int ends = atomic_load(&x->ends);
        CHECK(ends == 1, "call seq %lld to rank %d ended %d times", (long long)x->seq, x->dst,
              ends);
        uint64_t t_end = atomic_load(&x->t_end);
        if (t_end == 0)
            continue;
        double took = secs(t_end - x->t_issue);
        CHECK(x->st != TP_ETIMEDOUT || took >= x->timeout_s,
              "call seq %lld timed out after %.3f s, before its %.3f s", (long long)x->seq, took,
              x->timeout_s);
        CHECK(took <= x->timeout_s + SLACK_MS / 1000.0,
              "call seq %lld ended %s after %.3f s, past its %.3f s deadline + %d ms",
              (long long)x->seq, tp_status_name(x->st), took, x->timeout_s, SLACK_MS);
        if (x->st != TP_OK) {
            char who[64];
            snprintf(who, sizeof who, "worker 'worker%d' (id %d)", x->dst, x->dst);
            CHECK(strstr(x->msg, who), "call seq %lld's error does not name %s: %s",
                  (long long)x->seq, who, x->msg);
        }
    }
}

static void free_calls(tcall *c, int n) {
    for (int i = 0; i < n; i++)
        tp_future_free(c[i].f);
}

static int lost[WORLD_MAX]; /* ranks that failed a runs() query: not asked again */

static int64_t runs_on(int dst, int64_t seq) {
    if (dst < 0 || dst >= WORLD_MAX || lost[dst])
        return -1; /* one failure is reported; a failed run should end soon */
    tp_value *args = tp_value_list_of(1, tp_value_int(seq));
    tp_value *res = NULL;
    int64_t n = -1;
    tp_status st = tp_rpc_sync(tp_to_rank(dst), "runs", args, NULL, 5, &res);
    if (st != TP_OK || tp_value_get_int(res, &n) != TP_OK) {
        say("runs(%lld) on rank %d: %s: %s", (long long)seq, dst, tp_status_name(st), tp_errmsg());
        lost[dst] = 1;
    }
    tp_value_free(args);
    tp_value_free(res);
    return n;
}

/* A function ran at most once per call, and exactly once for a call that
 * succeeded (SIM-9). After the heal: asks each callee. */
static void check_runs(const tcall *c, int n) {
    for (int i = 0; i < n; i++) {
        int64_t r = runs_on(c[i].dst, c[i].seq);
        CHECK(r >= 0 && r <= 1, "work(%lld) ran %lld times on rank %d", (long long)c[i].seq,
              (long long)r, c[i].dst);
        CHECK(c[i].st != TP_OK || r == 1, "work(%lld) succeeded but ran %lld times on rank %d",
              (long long)c[i].seq, (long long)r, c[i].dst);
    }
}

/* The time range in which the calls ended, from t0. */
static void ended_range(const tcall *c, int n, uint64_t t0, double *lo, double *hi) {
    *lo = 1e9;
    *hi = -1e9;
    for (int i = 0; i < n; i++) {
        double t = secs(atomic_load(&c[i].t_end) - t0);
        *lo = t < *lo ? t : *lo;
        *hi = t > *hi ? t : *hi;
    }
}

/* Calls to every other rank succeed (after a heal the redial may wait out
 * a SYN backoff, hence 10 s). */
static void expect_answers(const char *when) {
    tcall c[CALLS_MAX];
    int n = 0;
    for (int r = 1; r < g_world && n < CALLS_MAX; r++)
        issue(&c[n++], r, 0, 10);
    settle(c, n);
    for (int i = 0; i < n; i++)
        CHECK(c[i].st == TP_OK, "%s: call to rank %d: %s: %s", when, c[i].dst,
              tp_status_name(c[i].st), c[i].msg);
    check_runs(c, n);
    free_calls(c, n);
}

/* After a partition long enough for verdicts, every other rank answers
 * again within a few tries. A connection of the partition may still have
 * its say after the heal (TCP-24 (a)), so a try may fail: TP_EIO, when a
 * verdict about such a connection comes late (TCP-7's probe of a
 * connection the peer dialed is answered only once the path is back) and
 * the core fails every call in flight to that peer, this one included; or
 * TP_ETIMEDOUT, when the peer's answer went out on its stale connection,
 * which our kernel, having given up on it, resets. Any other failure, or
 * no answer by the fourth try, fails the check. */
static void expect_recovery(const char *when) {
    for (int r = 1; r < g_world; r++) {
        tcall c[4];
        int n = 0;
        do {
            if (n > 0)
                sleep_until(now_ns() + 200000000ull);
            issue(&c[n], r, 0, g_ut_s + 1);
            settle(&c[n], 1);
            n++;
        } while (n < 4 && (c[n - 1].st == TP_EIO || c[n - 1].st == TP_ETIMEDOUT));
        CHECK(c[n - 1].st == TP_OK, "%s: rank %d: %s after %d tries: %s", when, r,
              tp_status_name(c[n - 1].st), n, c[n - 1].msg);
        if (n > 1)
            say("%s: rank %d answered at try %d; before: %s", when, r, n, c[0].msg);
        check_runs(c, n);
        free_calls(c, n);
    }
}

/* ---- Links (netns_test.sh ctl) ------------------------------------------------------ */

/* Runs "$NETNS_CTL verb rank"; the time once it is done. */
static uint64_t ctl(const char *verb, int rank) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s %d", getenv("NETNS_CTL"), verb, rank);
    int rc = system(cmd);
    uint64_t t = now_ns();
    CHECK(rc == 0, "'%s' failed (%d)", cmd, rc);
    say("%s rank %d's host", verb, rank);
    return t;
}

typedef struct timed_ctl {
    uint64_t at;
    const char *verb;
    int rank;
} timed_ctl;

static void *ctl_thread(void *arg) {
    timed_ctl *t = arg;
    sleep_until(t->at);
    ctl(t->verb, t->rank);
    return NULL;
}

/* ---- Scenarios (rank 0) ------------------------------------------------------------- */

#define ST(s) (1u << (s))

static expect expect_ok(double shutdown_timeout_s) {
    /* SIM-9: a graceful shutdown returns within twice its timeout. */
    expect e = {.max_ms = (int64_t)(2000 * shutdown_timeout_s) + SLACK_MS, .ok_mask = ST(TP_OK)};
    return e;
}

/* Tries again after TP_EIO: a late verdict about a connection of the
 * partition may fail a call made after it (see expect_recovery). */
static void release(int r, uint64_t start, const expect *e) {
    tp_value *args = tp_value_list_of(4, tp_value_int((int64_t)start), tp_value_int(e->max_ms),
                                      tp_value_int(e->ok_mask), tp_value_str(e->must));
    tp_status st = TP_EIO;
    for (int i = 0; i < 3 && st == TP_EIO; i++) {
        tp_value *res = NULL;
        st = tp_rpc_sync(tp_to_rank(r), "release", args, NULL, 10, &res);
        tp_value_free(res);
    }
    tp_value_free(args);
    CHECK(st == TP_OK, "release of rank %d: %s: %s", r, tp_status_name(st), tp_errmsg());
}

/* Every rank shuts down gracefully at one instant and must succeed. */
static void finish_all_ok(double shutdown_timeout_s) {
    expect e = expect_ok(shutdown_timeout_s);
    uint64_t start = now_ns() + 300000000ull;
    for (int r = 1; r < g_world; r++)
        release(r, start, &e);
    shutdown_checked(start, &e);
}

static void warm(void) {
    expect_answers("warm-up");
}

/* (a) A host cut without a reset: calls waiting on it fail TP_EIO, naming
 * it, user_timeout (+ RTO) after the cut; later calls within their own
 * timeout; a cut host idle is declared unreachable too; the others are not
 * disturbed; after the heal it answers again. */
static void scenario_cut(double sd_s) {
    warm();
    uint64_t t_cut = ctl("cut", 1);
    tcall a[4], b[2];
    for (int i = 0; i < 4; i++)
        issue(&a[i], 1, 0, 20);
    for (int i = 0; i < 2; i++)
        issue(&b[i], 2, 0, 5);
    settle(b, 2);
    settle(a, 4);
    double lo, hi;
    ended_range(a, 4, t_cut, &lo, &hi);
    say("cut: calls to the cut host ended %s after %.3f..%.3f s (user_timeout %.0f s): %s",
        tp_status_name(a[0].st), lo, hi, g_ut_s, a[0].msg);
    for (int i = 0; i < 4; i++)
        CHECK(a[i].st == TP_EIO, "call to the cut host: %s: %s", tp_status_name(a[i].st), a[i].msg);
    /* Not before the user timeout (a live but slow host keeps its calls),
     * and not much after: the bound. */
    CHECK(lo >= g_ut_s - SLACK_MS / 1000.0, "failed %.3f s after the cut, before user_timeout", lo);
    CHECK(hi <= g_ut_s + RTO_MIN_S + SLACK_MS / 1000.0,
          "failed %.3f s after the cut, past user_timeout + RTO", hi);
    for (int i = 0; i < 2; i++)
        CHECK(b[i].st == TP_OK, "bystander call: %s: %s", tp_status_name(b[i].st), b[i].msg);
    char msg[LOG_LINE];
    uint64_t t_down = down_after(1, t_cut, msg, sizeof msg);
    CHECK(t_down, "no peer-down for rank 1 after its cut");
    if (t_down)
        say("cut: rank 1 declared down after %.3f s: %s", secs(t_down - t_cut), msg);

    /* After the verdict a call waits for a dial that cannot be answered: it
     * ends within its own timeout. */
    tcall c;
    issue(&c, 1, 0, 1.5);
    settle(&c, 1);
    CHECK(c.st != TP_OK, "a call to the cut host succeeded");
    say("cut: a call issued after the verdict ended %s after %.3f s: %s", tp_status_name(c.st),
        secs(atomic_load(&c.t_end) - c.t_issue), c.msg);

    /* An idle pair of connections: nothing is sent to rank 2 once its host
     * is cut. The one rank 2 dialed gives up within user_timeout; its end
     * only starts TCP-7's probe, a PING on ours, which then waits as data
     * unacknowledged: the verdict comes when ours gives up (user_timeout +
     * RTO after the PING) or the probe's 5 s pass, unless ours gave up
     * first (TCP-23). */
    uint64_t t_cut2 = ctl("cut", 2);
    double probe_s = g_ut_s + RTO_MIN_S < 5.0 ? g_ut_s + RTO_MIN_S : 5.0;
    t_down = await_down(2, t_cut2, g_ut_s + probe_s + 3, msg, sizeof msg);
    CHECK(t_down && secs(t_down - t_cut2) <= g_ut_s + probe_s + SLACK_MS / 1000.0,
          "idle rank 2 not declared down within user_timeout + %.1f s (%.3f s)", probe_s,
          t_down ? secs(t_down - t_cut2) : -1.0);
    if (t_down)
        say("cut: idle rank 2 declared down after %.3f s: %s", secs(t_down - t_cut2), msg);
    /* Heal once both ends of most connections gave up; one still open at
     * the heal (a probe's PING still retransmitted) has its say after it:
     * expect_recovery allows for that, and scenario mid is the case. */
    sleep_until(t_cut2 + (uint64_t)((g_ut_s + g_intvl_s + 0.5) * 1e9));
    ctl("heal", 1);
    ctl("heal", 2);
    expect_recovery("after the heal");
    expect_alive(1, t_cut);
    expect_alive(2, t_cut);
    check_runs(a, 4);
    check_runs(b, 2);
    free_calls(a, 4);
    free_calls(b, 2);
    free_calls(&c, 1);
    finish_all_ok(sd_s);
}

/* (b) A partition shorter than the bound: calls whose timeout passes fail
 * TP_ETIMEDOUT on time; the others are delivered after the heal by TCP's
 * retransmission; the connection survives (no peer-down). */
static void scenario_blip(double sd_s) {
    const double partition_s = 1.0;
    warm();
    uint64_t t_cut = ctl("cut", 1);
    tcall s[3], l[3], b;
    for (int i = 0; i < 3; i++)
        issue(&s[i], 1, 0, 0.5);
    for (int i = 0; i < 3; i++)
        issue(&l[i], 1, 0, 10);
    issue(&b, 2, 0, 5);
    sleep_until(t_cut + (uint64_t)(partition_s * 1e9));
    uint64_t t_heal = ctl("heal", 1);
    settle(s, 3);
    settle(l, 3);
    settle(&b, 1);
    for (int i = 0; i < 3; i++)
        CHECK(s[i].st == TP_ETIMEDOUT, "short call: %s: %s", tp_status_name(s[i].st), s[i].msg);
    for (int i = 0; i < 3; i++)
        CHECK(l[i].st == TP_OK, "long call: %s: %s", tp_status_name(l[i].st), l[i].msg);
    CHECK(b.st == TP_OK, "bystander: %s: %s", tp_status_name(b.st), b.msg);
    double lo, hi;
    ended_range(s, 3, t_cut, &lo, &hi);
    say("blip: %.1f s partition: 0.5 s calls ended %s after %.3f..%.3f s: %s", partition_s,
        tp_status_name(s[0].st), lo, hi, s[0].msg);
    ended_range(l, 3, t_heal, &lo, &hi);
    say("blip: 10 s calls ended %s %.3f..%.3f s after the heal", tp_status_name(l[0].st), lo, hi);
    CHECK(down_after(1, t_cut, NULL, 0) == 0, "a partition shorter than the bound brought a "
                                              "peer-down");
    expect_answers("after the heal");
    CHECK(down_after(1, t_cut, NULL, 0) == 0, "peer-down after the heal");
    check_runs(s, 3);
    check_runs(l, 3);
    free_calls(s, 3);
    free_calls(l, 3);
    free_calls(&b, 1);
    finish_all_ok(sd_s);
}

/* (c) An asymmetric cut: what is sent to rank 1's host is lost, what it
 * sends gets through. TCP needs both ways (acknowledgements), so calls to
 * it fail as for a full cut, within the user timeout. */
static void scenario_oneway(double sd_s) {
    warm();
    uint64_t t_cut = ctl("cutin", 1);
    tcall a[3], b;
    for (int i = 0; i < 3; i++)
        issue(&a[i], 1, 0, 20);
    issue(&b, 2, 0, 5);
    settle(&b, 1);
    settle(a, 3);
    for (int i = 0; i < 3; i++)
        CHECK(a[i].st == TP_EIO, "call into the cut: %s: %s", tp_status_name(a[i].st), a[i].msg);
    CHECK(b.st == TP_OK, "bystander: %s: %s", tp_status_name(b.st), b.msg);
    double lo, hi;
    ended_range(a, 3, t_cut, &lo, &hi);
    say("oneway: calls into the cut ended %s after %.3f..%.3f s: %s", tp_status_name(a[0].st), lo,
        hi, a[0].msg);
    CHECK(lo >= g_ut_s - SLACK_MS / 1000.0 && hi <= g_ut_s + RTO_MIN_S + SLACK_MS / 1000.0,
          "not within user_timeout %.0f s + RTO", g_ut_s);
    ctl("heal", 1);
    expect_recovery("after the heal");
    expect_alive(1, t_cut);
    check_runs(a, 3);
    free_calls(a, 3);
    free_calls(&b, 1);
    finish_all_ok(sd_s);
}

/* (f) A partition that ends between the two ends' verdicts: rank 1's
 * kernel gives up on its idle connections (user_timeout 3 s) during the
 * partition, this one (9 s, the keepalive count of 8 given to rank 0 only)
 * still retransmits a call's request after the heal, and rank 1's kernel,
 * which no longer knows the connection, answers with a reset. The process
 * lives: the call may fail (TP_EIO), but the worker must not be declared
 * dead (TP_EPEERDOWN) and calls after the heal must succeed. */
static void scenario_mid(double sd_s) {
    warm();
    uint64_t t_cut = ctl("cut", 1);
    tcall a;
    issue(&a, 1, 0, 15);
    sleep_until(t_cut + 4500000000ull); /* rank 1's ends gave up by t_cut + 3 s */
    ctl("heal", 1);
    settle(&a, 1);
    say("mid: the call held across the partition ended %s after %.3f s: %s", tp_status_name(a.st),
        secs(atomic_load(&a.t_end) - t_cut), a.msg);
    CHECK(a.st == TP_OK || a.st == TP_EIO, "the held call: %s: %s", tp_status_name(a.st), a.msg);
    expect_alive(1, t_cut);
    expect_recovery("after the heal");
    check_runs(&a, 1);
    free_calls(&a, 1);
    finish_all_ok(sd_s);
}

/* (e) Slow but live: a function busy for twice the bound, and a whole
 * process stopped (SIGSTOP) for as long with a call waiting on it; the
 * kernels answer the probes, so nobody is declared down. */
static void scenario_slow(double sd_s) {
    warm();
    uint64_t t0 = now_ns();
    int64_t busy_ms = (int64_t)(2000 * g_ut_s);
    tcall a, b;
    issue(&a, 1, busy_ms, 4 * g_ut_s);
    ctl("freeze", 2);
    issue(&b, 2, 0, 4 * g_ut_s);
    sleep_until(now_ns() + (uint64_t)busy_ms * 1000000ull);
    ctl("thaw", 2);
    settle(&a, 1);
    settle(&b, 1);
    CHECK(a.st == TP_OK, "busy call: %s: %s", tp_status_name(a.st), a.msg);
    CHECK(b.st == TP_OK, "call to a stopped process: %s: %s", tp_status_name(b.st), b.msg);
    say("slow: a %.0f s function answered %s after %.3f s; a process stopped %.0f s answered %s "
        "after %.3f s",
        busy_ms / 1000.0, tp_status_name(a.st), secs(atomic_load(&a.t_end) - a.t_issue),
        busy_ms / 1000.0, tp_status_name(b.st), secs(atomic_load(&b.t_end) - b.t_issue));
    CHECK(down_after(1, t0, NULL, 0) == 0 && down_after(2, t0, NULL, 0) == 0,
          "a slow or stopped peer was declared down");
    check_runs(&a, 1);
    check_runs(&b, 1);
    free_calls(&a, 1);
    free_calls(&b, 1);
    finish_all_ok(sd_s);
}

/* (d) A partition across a graceful shutdown that heals during it: the
 * barrier waits, the call held by the partition is delivered, every rank
 * succeeds within twice shutdown_timeout. */
static void scenario_sdheal(double sd_s) {
    warm();
    expect e = expect_ok(sd_s);
    uint64_t start = now_ns() + 500000000ull;
    for (int r = 1; r < g_world; r++)
        release(r, start, &e);
    ctl("cut", 1);
    tcall a;
    issue(&a, 1, 0, 10); /* held by the partition; the drain waits for it */
    /* About 1.2 s: a partition survives only when a probe or a
     * retransmission crosses it before user_timeout of silence (TCP-23). */
    timed_ctl heal = {start + 750000000ull, "heal", 1};
    pthread_t th;
    pthread_create(&th, NULL, ctl_thread, &heal);
    shutdown_checked(start, &e);
    pthread_join(th, NULL);
    /* The future outlives the worker; its callback may not run once
     * teardown began, so ask the future itself. */
    CHECK(tp_future_done(a.f) && tp_future_status(a.f) == TP_OK, "the held call: %s: %s",
          tp_status_name(tp_future_status(a.f)), tp_future_error(a.f));
    CHECK(atomic_load(&a.ends) <= 1, "the held call ended twice");
    tp_future_free(a.f);
}

/* (d') A partition that outlasts a graceful shutdown: the ranks that can
 * reach each other (and the store) give up on rank 1 at the barrier's
 * deadline, naming it; rank 1, cut from the store, ends after the heal with
 * an error (its bound is the store operation's, TCP-24). */
static void scenario_sdcut(double sd_s) {
    warm();
    uint64_t start = now_ns() + 500000000ull;
    expect e = {.max_ms = (int64_t)(2000 * sd_s) + SLACK_MS,
                .ok_mask = ST(TP_ETIMEDOUT) | ST(TP_EPEERDOWN)};
    snprintf(e.must, sizeof e.must, "rank 1");
    for (int r = 2; r < g_world; r++)
        release(r, start, &e);
    uint64_t heal_at = start + (uint64_t)((2 * sd_s + 0.5) * 1e9);
    expect e1 = {.max_ms = (int64_t)((2 * sd_s + 0.5 + 2 * g_ut_s + 2 * sd_s) * 1000) + SLACK_MS,
                 .ok_mask = ST(TP_ETIMEDOUT) | ST(TP_ESTORE) | ST(TP_EPEERDOWN)};
    release(1, start, &e1);
    ctl("cut", 1);
    shutdown_checked(start, &e);
    sleep_until(heal_at);
    ctl("heal", 1);
    /* Rank 1 finishes after the heal; this process's exit keeps the store
     * for its connected clients up to shutdown_timeout (TCP-11). */
}

/* (g) A host cut for good (TCP-25, peer_down_timeout 4 s): the calls
 * waiting on it fail TP_EIO at user_timeout, as in (a), and start its
 * silence; peer_down_timeout later, no dial having been answered, it is
 * declared down (TP_EPEERDOWN, "is down"), a call to it fails at once
 * naming it, and the rest of the job shuts down gracefully without waiting
 * for it. Rank 1, cut from everyone and the store, ends with an error after
 * the heal. */
static void scenario_down(double sd_s) {
    warm();
    double down_s = 4, tick_s = 1; /* peer_down_timeout; TPI_TCP_SILENT_DIAL_MS */
    double verdict_s = g_ut_s + RTO_MIN_S, declared_s = verdict_s + down_s + tick_s;
    uint64_t t_cut = now_ns() + 300000000ull;
    uint64_t start = t_cut + (uint64_t)((declared_s + 3) * 1e9);
    uint64_t heal_at = start + 1000000000ull; /* after the others ended: rank 1 may end */
    expect e1 = {.max_ms = (int64_t)((2 * sd_s + 0.5 + 2 * g_ut_s + 2 * sd_s) * 1000) + SLACK_MS,
                 .ok_mask = ST(TP_OK) | ST(TP_ETIMEDOUT) | ST(TP_ESTORE) | ST(TP_EPEERDOWN)};
    release(1, start, &e1);
    /* The drain names the dead worker (TP_EPEERDOWN) and does not wait for it. */
    expect e = {.max_ms = (int64_t)(1000 * sd_s), .ok_mask = ST(TP_OK) | ST(TP_EPEERDOWN)};
    snprintf(e.must, sizeof e.must, "worker1");
    for (int r = 2; r < g_world; r++)
        release(r, start, &e);
    sleep_until(t_cut);
    t_cut = ctl("cut", 1);
    tcall a[2];
    for (int i = 0; i < 2; i++)
        issue(&a[i], 1, 0, 30);
    settle(a, 2);
    double lo, hi;
    ended_range(a, 2, t_cut, &lo, &hi);
    for (int i = 0; i < 2; i++)
        CHECK(a[i].st == TP_EIO, "call to the cut host: %s: %s", tp_status_name(a[i].st),
              a[i].msg);
    say("down: calls waiting on the cut host ended %s after %.3f..%.3f s: %s",
        tp_status_name(a[0].st), lo, hi, a[0].msg);
    expect_alive(1, t_cut); /* unreachable so far, not down */

    char msg[LOG_LINE], who[64];
    snprintf(who, sizeof who, "worker 'worker1' (id 1) is down");
    uint64_t t_down, end = t_cut + (uint64_t)((declared_s + 2) * 1e9);
    while ((t_down = line_after(who, t_cut, msg, sizeof msg)) == 0 && now_ns() < end)
        sleep_until(now_ns() + 5000000);
    CHECK(t_down, "rank 1 not declared down within %.1f s of its cut", declared_s + 2);
    if (t_down) {
        double d = secs(t_down - t_cut);
        say("down: rank 1 declared down %.3f s after the cut (%.3f s after the calls failed): %s",
            d, d - hi, msg);
        CHECK(d - hi >= down_s - SLACK_MS / 1000.0, "declared %.3f s after its silence began, "
              "before peer_down_timeout %.0f s", d - hi, down_s);
        CHECK(d <= declared_s + SLACK_MS / 1000.0,
              "declared %.3f s after the cut, past user_timeout + RTO + %.0f s + %.0f s", d,
              down_s, tick_s);
        CHECK(strstr(msg, "peer_down_timeout"), "the verdict does not name peer_down_timeout");
    }
    tcall c;
    issue(&c, 1, 0, 5);
    settle(&c, 1);
    double took = secs(atomic_load(&c.t_end) - c.t_issue);
    CHECK(c.st == TP_EPEERDOWN && took < 0.1, "a call to the declared host: %s after %.3f s: %s",
          tp_status_name(c.st), took, c.msg);
    say("down: a call to it then ended %s after %.3f s: %s", tp_status_name(c.st), took, c.msg);
    free_calls(a, 2);
    free_calls(&c, 1);
    tcall b;
    issue(&b, 2, 0, 5);
    settle(&b, 1);
    CHECK(b.st == TP_OK, "bystander call: %s: %s", tp_status_name(b.st), b.msg);
    free_calls(&b, 1);
    shutdown_checked(start, &e);
    sleep_until(heal_at);
    ctl("heal", 1);
}

/* (h) A host cut until its calls failed, healed before peer_down_timeout
 * (4 s) ran out (TCP-25): the once-a-second dial finds the healed path, its
 * kernel's answer ends the silence, and the worker is never declared down;
 * calls to it succeed again. */
static void scenario_rescue(double sd_s) {
    warm();
    uint64_t t_cut = ctl("cut", 1);
    tcall a;
    issue(&a, 1, 0, 30);
    settle(&a, 1);
    CHECK(a.st == TP_EIO, "call to the cut host: %s: %s", tp_status_name(a.st), a.msg);
    uint64_t t_fail = atomic_load(&a.t_end);
    sleep_until(t_fail + 1500000000ull); /* 2.5 s of silence left */
    ctl("heal", 1);
    sleep_until(t_fail + 7000000000ull); /* past the verdict it would have had */
    expect_alive(1, t_cut);
    expect_recovery("rescue: after the heal");
    say("rescue: healed 1.5 s into the silence; not declared down %.3f s after the cut",
        secs(now_ns() - t_cut));
    free_calls(&a, 1);
    finish_all_ok(sd_s);
}

/* ---- Main ------------------------------------------------------------------------------ */

typedef struct scenario {
    const char *name;
    void (*run)(double shutdown_timeout_s);
    double shutdown_timeout_s;
    const char *keepalive0; /* rank 0's "idle,interval,count" when not NETNS_KEEPALIVE's */
    const char *peer_down;  /* every rank's peer_down_timeout (TCP-25) when not the default */
} scenario;

static const scenario scenarios[] = {
    {"cut", scenario_cut, 5, NULL},       {"blip", scenario_blip, 5, NULL},
    {"oneway", scenario_oneway, 5, NULL},
    /* A stopped or busy worker is never silent: not declared down however short the bound. */
    {"slow", scenario_slow, 5, NULL, "1"},
    {"sdheal", scenario_sdheal, 5, NULL}, {"sdcut", scenario_sdcut, 2, NULL},
    {"mid", scenario_mid, 5, "1,1,8"},    {"down", scenario_down, 5, NULL, "4"},
    {"rescue", scenario_rescue, 5, NULL, "4"},
};

static int env_int(const char *name, int *out) {
    const char *v = getenv(name);
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : -1;
    if (!v || !*v || *end || x < 0 || x > 65535) {
        fprintf(stderr, "netns_worker: %s is not set to a number\n", name);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int init_worker(const scenario *sc) {
    int idle = 1, intvl = 1, cnt = 2;
    const char *ka = g_rank == 0 && sc->keepalive0 ? sc->keepalive0 : getenv("NETNS_KEEPALIVE");
    if (ka && sscanf(ka, "%d,%d,%d", &idle, &intvl, &cnt) != 3) {
        fprintf(stderr, "netns_worker: NETNS_KEEPALIVE '%s' is not idle,interval,count\n", ka);
        return -1;
    }
    g_ut_s = idle + intvl * cnt; /* user_timeout's default (TCP-23) */
    g_intvl_s = intvl;
    char v[3][16];
    snprintf(v[0], sizeof v[0], "%d", idle);
    snprintf(v[1], sizeof v[1], "%d", intvl);
    snprintf(v[2], sizeof v[2], "%d", cnt);
    tp_options *o = NULL;
    const char *addr = getenv("NETNS_ADDR");
    if (!addr || tp_construct_rpc_backend_options("TENSORPIPE", &o) != TP_OK ||
        tp_options_set(o, "listen_addr", addr) != TP_OK ||
        tp_options_set(o, "keepalive_idle", v[0]) != TP_OK ||
        tp_options_set(o, "keepalive_interval", v[1]) != TP_OK ||
        tp_options_set(o, "keepalive_count", v[2]) != TP_OK ||
        (sc->peer_down && tp_options_set(o, "peer_down_timeout", sc->peer_down) != TP_OK) ||
        tp_options_set_rpc_timeout(o, 10) != TP_OK || tp_options_set_init_timeout(o, 20) != TP_OK ||
        tp_options_set_shutdown_timeout(o, sc->shutdown_timeout_s) != TP_OK ||
        tp_options_set_num_worker_threads(o, 8) != TP_OK) {
        fprintf(stderr, "netns_worker: options: %s (NETNS_ADDR set?)\n", tp_errmsg());
        tp_options_free(o);
        return -1;
    }
    char name[32];
    snprintf(name, sizeof name, "worker%d", g_rank);
    tp_status st = tp_init_rpc(name, "TENSORPIPE", g_rank, g_world, o);
    tp_options_free(o);
    if (st != TP_OK) {
        fprintf(stderr, "netns_worker: rank %d: init: %s: %s\n", g_rank, tp_status_name(st),
                tp_errmsg());
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    const scenario *sc = NULL;
    for (size_t i = 0; argc == 2 && i < sizeof scenarios / sizeof scenarios[0]; i++)
        if (strcmp(argv[1], scenarios[i].name) == 0)
            sc = &scenarios[i];
    if (!sc || env_int("RANK", &g_rank) != 0 || env_int("WORLD_SIZE", &g_world) != 0 ||
        g_world < 3 || g_world > WORLD_MAX || g_rank >= g_world || !getenv("NETNS_CTL")) {
        fprintf(stderr, "usage: netns_worker cut|blip|oneway|slow|sdheal|sdcut|mid|down|rescue (with RANK, "
                        "WORLD_SIZE >= 3, NETNS_ADDR, NETNS_CTL; see netns_test.sh)\n");
        return 2;
    }
    tp_set_log_level(TP_LOG_DEBUG); /* a yes to a shared memory offer is a debug line */
    tp_set_log_callback(on_log, NULL);
    if (tp_register_function("work", fn_work, NULL) != TP_OK ||
        tp_register_function("runs", fn_runs, NULL) != TP_OK ||
        tp_register_function("release", fn_release, NULL) != TP_OK || init_worker(sc) != 0)
        return 1;
    if (g_rank == 0) {
        sc->run(sc->shutdown_timeout_s);
    } else {
        uint64_t end = now_ns() + (uint64_t)RELEASE_WAIT_S * 1000000000ull;
        while (!atomic_load(&released) && now_ns() < end)
            sleep_until(now_ns() + 5000000);
        if (!atomic_load(&released)) {
            say("no release from rank 0 within %d s", RELEASE_WAIT_S);
            tp_shutdown(0);
            g_failed = 1;
        } else {
            shutdown_checked(release_start_ns, &release_expect);
        }
    }
    print_downs();
    /* shm at its default: the namespaces are hosts to TCP-22, so every
     * byte crosses them and the cuts act on it. */
    if (atomic_load(&shm_used)) {
        say("frames went through shared memory to a worker in another network namespace "
            "(TCP-22)");
        g_failed = 1;
    }
    /* Each worker accepts connections from the others (two or more seen in
     * every scenario), each with an offer to refuse. */
    say("shared memory offers refused for another network namespace: %d",
        atomic_load(&shm_refused_netns));
    if (atomic_load(&shm_refused_netns) == 0) {
        say("no shared memory offer was refused for the network namespace (TCP-22)");
        g_failed = 1;
    }
    say("%s: %s", sc->name, g_failed ? "FAILED" : "ok");
    return g_failed;
}
