/*
 * bench_ipc.c: rank 0 measures, rank 1 echoes (bench_ipc.h).
 *
 * Both processes follow the same plan, computed from the configuration: the
 * warm-up (poll, futex, tcp), then rounds of one block of each kind, so no
 * control message is needed. One 32-bit sequence word in shared memory
 * carries every shared-memory round trip of the run: rank 0 writes the
 * request, stores an odd value (release); rank 1 sees it (acquire), copies
 * the request into the reply and stores the next, even value (release); rank
 * 0 sees that and reads the reply. The futex kind adds FUTEX_WAKE after each
 * store and FUTEX_WAIT instead of spinning; the word is in MAP_SHARED memory,
 * so the futex is a shared one (no FUTEX_PRIVATE_FLAG).
 *
 * Every wait has a deadline: a poll or futex wait fails after WAIT_LIMIT_NS,
 * or as soon as the peer has exited (kill(pid, 0) fails once the parent has
 * reaped it); the TCP socket has SO_RCVTIMEO and ends on the peer's exit.
 * The parent waits for both with bench_wait_children, which kills and reaps
 * any child still running after its timeout.
 */
#define _GNU_SOURCE /* sched_yield, sched_setaffinity */
#include "bench_ipc.h"

#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bench_pair.h"
#include "bench_util.h"

#define MSG_LEN 64
#define WAIT_LIMIT_NS (10ull * 1000000000ull) /* one wait, any kind: the peer is gone */
#define ALIVE_CHECK_NS (10ull * 1000000ull)   /* how often a long wait checks the peer */
#define FUTEX_SLICE_NS (100 * 1000000L)       /* one FUTEX_WAIT, before the checks */
#define JOB_TIMEOUT_S 300
#define FREE_SPINS 256 /* placement free: poll spins (about 6 us here) before each sched_yield */

enum { KIND_POLL, KIND_FUTEX, KIND_TCP, KINDS };
static const char *const kind_name[KINDS] = {"shm poll", "futex", "tcp"};

typedef struct ipc_shared {
    _Alignas(64) _Atomic uint32_t seq; /* odd: a request is ready; even: its reply */
    _Alignas(64) uint8_t req[MSG_LEN];
    _Alignas(64) uint8_t rep[MSG_LEN];
    _Alignas(64) _Atomic int pid[2]; /* set by the parent after the forks */
    bench_ipc_results results;
    int filled;
} ipc_shared;

typedef struct ipc_ctx {
    ipc_shared *sh;
    int rank;
    int fd;               /* the raw TCP connection */
    unsigned yield_after; /* poll spins before each sched_yield; UINT32_MAX: never */
    uint32_t seq;         /* this process's copy of the sequence word */
} ipc_ctx;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static long futex(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *timeout) {
    /* _Atomic uint32_t has uint32_t's size and representation on Linux. */
    return syscall(SYS_futex, (uint32_t *)word, op, val, timeout, NULL, 0);
}

/*
 * Called now and then by a long wait: 0 to go on waiting, -1 when the wait
 * has lasted WAIT_LIMIT_NS or the peer has exited (and been reaped).
 */
static int wait_check(const ipc_ctx *c, uint64_t *first, uint64_t *alive_at, const char *what) {
    uint64_t now = bench_now_ns();
    if (*first == 0) {
        *first = *alive_at = now;
        return 0;
    }
    if (now - *first > WAIT_LIMIT_NS) {
        fprintf(stderr, "rpc_bench: ipc rank %d: no %s answer within %.0f s\n", c->rank, what,
                (double)WAIT_LIMIT_NS / 1e9);
        return -1;
    }
    if (now - *alive_at > ALIVE_CHECK_NS) {
        *alive_at = now;
        int peer = atomic_load_explicit(&c->sh->pid[1 - c->rank], memory_order_relaxed);
        if (peer > 0 && kill(peer, 0) != 0 && errno == ESRCH) {
            fprintf(stderr, "rpc_bench: ipc rank %d: the peer exited during a %s wait\n", c->rank,
                    what);
            return -1;
        }
    }
    return 0;
}

/* Spins until the sequence word is want (acquire); yields after yield_after spins. */
static int poll_wait(const ipc_ctx *c, uint32_t want) {
    uint64_t first = 0, alive_at = 0;
    for (unsigned spins = 1;; spins++) {
        if (atomic_load_explicit(&c->sh->seq, memory_order_acquire) == want)
            return 0;
        if (spins > c->yield_after)
            sched_yield();
        else
            cpu_relax();
        if ((spins & 1023) == 0 && wait_check(c, &first, &alive_at, kind_name[KIND_POLL]) != 0)
            return -1;
    }
}

/* Sleeps on the sequence word until it is want (acquire); never spins. */
static int futex_wait(const ipc_ctx *c, uint32_t want) {
    uint64_t first = 0, alive_at = 0;
    for (;;) {
        uint32_t v = atomic_load_explicit(&c->sh->seq, memory_order_acquire);
        if (v == want)
            return 0;
        struct timespec slice = {0, FUTEX_SLICE_NS};
        /* Returns at once (EAGAIN) when the word is no longer v: no lost wake-up. */
        if (futex(&c->sh->seq, FUTEX_WAIT, v, &slice) != 0 && errno != EAGAIN && errno != EINTR &&
            errno != ETIMEDOUT) {
            perror("rpc_bench: FUTEX_WAIT");
            return -1;
        }
        if (wait_check(c, &first, &alive_at, kind_name[KIND_FUTEX]) != 0)
            return -1;
    }
}

static void post(ipc_ctx *c, uint32_t v, int kind) {
    atomic_store_explicit(&c->sh->seq, v, memory_order_release);
    if (kind == KIND_FUTEX)
        futex(&c->sh->seq, FUTEX_WAKE, 1, NULL);
}

static int shm_wait(const ipc_ctx *c, uint32_t want, int kind) {
    return kind == KIND_FUTEX ? futex_wait(c, want) : poll_wait(c, want);
}

/* rank 0: one round trip of kind; msg in, the echo back in msg. */
static int ping(ipc_ctx *c, int kind, uint8_t *msg) {
    if (kind == KIND_TCP)
        return bench_full_io(c->fd, msg, MSG_LEN, 1) || bench_full_io(c->fd, msg, MSG_LEN, 0);
    memcpy(c->sh->req, msg, MSG_LEN);
    post(c, ++c->seq, kind);
    if (shm_wait(c, ++c->seq, kind) != 0)
        return -1;
    memcpy(msg, c->sh->rep, MSG_LEN);
    return 0;
}

/* rank 1: answers one round trip of kind. */
static int pong(ipc_ctx *c, int kind) {
    if (kind == KIND_TCP) {
        uint8_t msg[MSG_LEN];
        return bench_full_io(c->fd, msg, MSG_LEN, 0) || bench_full_io(c->fd, msg, MSG_LEN, 1);
    }
    if (shm_wait(c, ++c->seq, kind) != 0)
        return -1;
    memcpy(c->sh->rep, c->sh->req, MSG_LEN);
    post(c, ++c->seq, kind);
    return 0;
}

/* The plan both ranks follow: n round trips of kind, timed into t when rank 0 and t != NULL. */
static int run_block(ipc_ctx *c, int kind, int n, double *t) {
    uint8_t msg[MSG_LEN];
    memset(msg, 7, sizeof msg);
    for (int i = 0; i < n; i++) {
        if (c->rank == 1) {
            BENCH_CHECK(pong(c, kind) == 0);
            continue;
        }
        uint32_t tag = c->seq ^ (uint32_t)i ^ ((uint32_t)kind << 24);
        memcpy(msg, &tag, sizeof tag);
        uint64_t t0 = bench_now_ns();
        BENCH_CHECK(ping(c, kind, msg) == 0);
        uint64_t t1 = bench_now_ns();
        uint32_t back;
        memcpy(&back, msg, sizeof back);
        BENCH_CHECK(back == tag); /* the echo carried this message */
        if (t)
            t[i] = (double)(t1 - t0) / 1e3;
    }
    return 0;
}

static int run_plan(ipc_ctx *c, const bench_ipc_config *cfg, double *t[KINDS]) {
    int k0 = cfg->no_poll ? KIND_POLL + 1 : KIND_POLL;
    for (int k = k0; k < KINDS; k++)
        if (run_block(c, k, cfg->warmup, NULL) != 0)
            return 1;
    for (int done = 0; done < cfg->samples; done += cfg->block) {
        int n = cfg->samples - done < cfg->block ? cfg->samples - done : cfg->block;
        for (int k = k0; k < KINDS; k++)
            if (run_block(c, k, n, t ? t[k] + done : NULL) != 0)
                return 1;
    }
    return 0;
}

static int set_rcv_timeout(int fd) {
    struct timeval tv = {(time_t)(WAIT_LIMIT_NS / 1000000000ull), 0};
    return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

static int rank_body(const bench_ipc_config *cfg, int rank, int lfd, uint16_t port, ipc_shared *sh,
                     unsigned yield_after) {
    BENCH_CHECK(bench_place(cfg->placement, rank) == 0);
    ipc_ctx c = {.sh = sh, .rank = rank, .fd = -1, .yield_after = yield_after, .seq = 0};
    if (rank == 1) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        BENCH_CHECK(poll(&p, 1, (int)(WAIT_LIMIT_NS / 1000000ull)) == 1);
        c.fd = bench_accept_nodelay(lfd);
    } else {
        c.fd = bench_connect_loopback(port);
    }
    close(lfd);
    BENCH_CHECK(c.fd >= 0 && set_rcv_timeout(c.fd) == 0);
    if (rank == 1) {
        int rc = run_plan(&c, cfg, NULL);
        close(c.fd);
        return rc;
    }
    double *t[KINDS] = {0};
    int rc = 1;
    for (int k = 0; k < KINDS; k++) {
        t[k] = calloc((size_t)cfg->samples, sizeof(double));
        if (!t[k])
            goto out;
    }
    if (run_plan(&c, cfg, t) != 0)
        goto out;
    bench_ipc_results r = {0};
    size_t n = (size_t)cfg->samples;
    if (!cfg->no_poll) {
        r.poll_median_us = bench_median(t[KIND_POLL], n);
        r.poll_p99_us = bench_percentile_sorted(t[KIND_POLL], n, 99);
    }
    r.futex_median_us = bench_median(t[KIND_FUTEX], n);
    r.futex_p99_us = bench_percentile_sorted(t[KIND_FUTEX], n, 99);
    r.tcp_median_us = bench_median(t[KIND_TCP], n);
    r.tcp_p99_us = bench_percentile_sorted(t[KIND_TCP], n, 99);
    sh->results = r;
    sh->filled = 1;
    rc = 0;
out:
    for (int k = 0; k < KINDS; k++)
        free(t[k]);
    close(c.fd);
    return rc;
}

/*
 * How long a poll wait spins before each sched_yield. Pinned to two CPUs it
 * never yields (the floor proper). On one CPU a pure spin would hold the CPU
 * until the scheduler preempts it (milliseconds) while the peer it waits
 * for cannot run, so it yields at every turn: the figure is then two
 * sched_yield hand-offs, not a poll. Left to the scheduler, the two may
 * share a CPU at times: spin a while, then yield.
 */
static unsigned poll_yield_after(int placement) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (placement == BENCH_PLACE_ONE || ncpu < 2)
        return 0;
    if (placement == BENCH_PLACE_FREE)
        return FREE_SPINS;
    return UINT32_MAX;
}

/* What bench_fork_ranks hands each child. */
typedef struct ipc_job {
    const bench_ipc_config *cfg;
    int lfd;
    uint16_t port;
    ipc_shared *sh;
    unsigned yield_after;
} ipc_job;

static int ipc_rank(int rank, void *arg) {
    const ipc_job *j = arg;
    return rank_body(j->cfg, rank, j->lfd, j->port, j->sh, j->yield_after);
}

int bench_ipc_run(const bench_ipc_config *cfg, bench_ipc_results *out) {
    if (cfg->samples < 1 || cfg->block < 1 || cfg->warmup < 0)
        return -1;
    unsigned yield_after = poll_yield_after(cfg->placement);
    if (!cfg->no_poll && yield_after != UINT32_MAX)
        fprintf(stderr,
                "rpc_bench: ipc: the two processes may share a CPU: the poll loop calls "
                "sched_yield after %u spins (ipc_shm_poll_* is not a pure poll)\n",
                yield_after);
    uint16_t port = 0;
    int lfd = bench_listen_loopback(&port);
    ipc_shared *sh = bench_shared_alloc(sizeof *sh);
    pid_t pids[2] = {-1, -1};
    int rc = -1;
    if (lfd < 0 || !sh) {
        perror("rpc_bench: ipc setup");
        goto out;
    }
    ipc_job job = {cfg, lfd, port, sh, yield_after};
    (void)bench_fork_ranks(pids, ipc_rank, &job);
    for (int rank = 0; rank < 2; rank++) /* read by each wait's liveness check */
        atomic_store_explicit(&sh->pid[rank], (int)pids[rank], memory_order_relaxed);
    close(lfd);
    lfd = -1;
    if (bench_wait_children(pids, 2, JOB_TIMEOUT_S, "ipc pair") == 0 && sh->filled) {
        *out = sh->results;
        rc = 0;
    }
out:
    if (lfd >= 0)
        close(lfd);
    bench_shared_free(sh, sizeof *sh);
    return rc;
}
