/*
 * bench_pair.c: rank 0 measures, rank 1 serves (bench_pair.h).
 *
 * The raw connection carries 64-byte messages whose first byte says what to
 * do: 'P' ping (rank 1 sends the 64 bytes back), 'B' bulk (a little-endian
 * u64 length at offset 8 follows; rank 1 reads that many bytes into a
 * buffer, then answers 64 bytes), 'Q' quit. rank 1's main thread serves it
 * while the library's own threads serve the rpc calls.
 */
#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#include "bench_pair.h"

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"

#define MSG_LEN 64
#define RTT_WARMUP 2000
#define REMOTE_WARMUP 200

typedef struct pair_shared {
    bench_pair_results results;
    int filled;
} pair_shared;

/* ---------------------------------------------------------------------- */
/* The raw side.                                                          */

static int raw_ping(int fd, uint8_t *msg) {
    msg[0] = 'P';
    return bench_full_io(fd, msg, MSG_LEN, 1) || bench_full_io(fd, msg, MSG_LEN, 0);
}

static int raw_bulk(int fd, uint8_t *buf, size_t len) {
    uint8_t msg[MSG_LEN] = {'B'};
    uint64_t n = len;
    memcpy(msg + 8, &n, sizeof n);
    return bench_full_io(fd, msg, MSG_LEN, 1) || bench_full_io(fd, buf, len, 1) ||
           bench_full_io(fd, msg, MSG_LEN, 0);
}

/* rank 1's main thread: answers the raw messages until 'Q' or end of stream. */
static int raw_serve(int fd, size_t bulk_max) {
    uint8_t msg[MSG_LEN];
    uint8_t *buf = malloc(bulk_max);
    BENCH_CHECK(buf != NULL);
    memset(buf, 1, bulk_max); /* touch every page now, not while timing (0 would become calloc) */
    int rc = 1;
    while (bench_full_io(fd, msg, MSG_LEN, 0) == 0) {
        if (msg[0] == 'Q') {
            rc = 0;
            break;
        }
        if (msg[0] == 'B') {
            uint64_t n;
            memcpy(&n, msg + 8, sizeof n);
            if (n > bulk_max || bench_full_io(fd, buf, (size_t)n, 0) != 0)
                break;
        }
        if (bench_full_io(fd, msg, MSG_LEN, 1) != 0)
            break;
    }
    free(buf);
    if (rc != 0)
        fprintf(stderr, "rpc_bench: rank 1: the raw connection ended early\n");
    return rc;
}

/* ---------------------------------------------------------------------- */
/* The rpc side (rank 0).                                                 */

/* The function rpc_sync and rpc_async call (bench_pair_config.echo). */
static const char *echo_fn = "echo";

static int rpc_ping(const tp_value *args) {
    tp_value *res = NULL;
    tp_status st = tp_rpc_sync(tp_to_rank(1), echo_fn, args, NULL, TP_TIMEOUT_DEFAULT, &res);
    size_t len = 0;
    const void *data;
    int bad = st != TP_OK || tp_value_get_bytes(res, &data, &len) != TP_OK || len != MSG_LEN;
    tp_value_free(res);
    if (bad)
        fprintf(stderr, "rpc_bench: rpc_sync echo: %s: %s\n", tp_status_name(st), tp_errmsg());
    return bad;
}

static int rpc_remote_to_here(const tp_value *args) {
    tp_rref *rref = NULL;
    tp_value *res = NULL;
    int64_t v = 0;
    tp_status st = tp_remote(tp_to_rank(1), "echo", args, NULL, TP_TIMEOUT_DEFAULT, &rref);
    if (st == TP_OK)
        st = tp_rref_to_here(rref, TP_TIMEOUT_DEFAULT, &res);
    int bad = st != TP_OK || tp_value_get_int(res, &v) != TP_OK || v != 7;
    if (bad)
        fprintf(stderr, "rpc_bench: remote + to_here: %s: %s\n", tp_status_name(st), tp_errmsg());
    tp_value_free(res);
    tp_rref_release(rref);
    return bad;
}

static int rpc_tensor(const tp_value *args, int64_t numel) {
    tp_value *res = NULL;
    int64_t n = -1;
    tp_status st = tp_rpc_sync(tp_to_rank(1), "numel", args, NULL, TP_TIMEOUT_DEFAULT, &res);
    int bad = st != TP_OK || tp_value_get_int(res, &n) != TP_OK || n != numel;
    if (bad)
        fprintf(stderr, "rpc_bench: rpc_sync with a tensor: %s: %s\n", tp_status_name(st),
                tp_errmsg());
    tp_value_free(res);
    return bad;
}

static int wait_one(tp_future *f) {
    tp_status st = tp_future_wait(f, TP_TIMEOUT_INFINITE);
    if (st != TP_OK)
        fprintf(stderr, "rpc_bench: rpc_async echo: %s: %s\n", tp_status_name(st),
                tp_future_error(f));
    tp_future_free(f);
    return st != TP_OK;
}

/*
 * calls rpc_async echos with at most window in flight: call i is issued
 * right after call i - window completed, so window calls are outstanding
 * whenever rank 0 waits. Returns calls per second, or -1 on a failure.
 */
static double async_window_run(const tp_value *args, int window, int calls) {
    tp_future **ring = calloc((size_t)window, sizeof *ring);
    int bad = ring == NULL;
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < calls && !bad; i++) {
        tp_future **slot = &ring[i % window];
        if (*slot) {
            bad = wait_one(*slot);
            *slot = NULL;
        }
        tp_status st = tp_rpc_async(tp_to_rank(1), echo_fn, args, NULL, TP_TIMEOUT_DEFAULT, slot);
        if (st != TP_OK) {
            fprintf(stderr, "rpc_bench: rpc_async: %s: %s\n", tp_status_name(st), tp_errmsg());
            bad = 1;
        }
    }
    for (int i = 0; ring && i < window; i++) { /* in issue order does not matter here */
        if (ring[i])
            bad |= wait_one(ring[i]);
    }
    double secs = (double)(bench_now_ns() - t0) / 1e9;
    free(ring);
    return bad ? -1.0 : calls / secs;
}

typedef struct rank0_bufs {
    double *raw;
    double *rpc;
    double *remote;
    double *async;
    double *raw_bulk;
    double *tensor_bulk;
    uint8_t *bulk;
} rank0_bufs;

static void bufs_free(rank0_bufs *b) {
    free(b->raw);
    free(b->rpc);
    free(b->remote);
    free(b->async);
    free(b->raw_bulk);
    free(b->tensor_bulk);
    free(b->bulk);
}

static int bufs_alloc(rank0_bufs *b, const bench_pair_config *cfg) {
    b->raw = calloc((size_t)cfg->rtt_samples, sizeof(double));
    b->rpc = calloc((size_t)cfg->rtt_samples, sizeof(double));
    b->remote = calloc((size_t)cfg->remote_samples + 1, sizeof(double));
    b->async = calloc((size_t)cfg->async_reps + 1, sizeof(double));
    b->raw_bulk = calloc((size_t)cfg->bulk_reps, sizeof(double));
    b->tensor_bulk = calloc((size_t)cfg->bulk_reps, sizeof(double));
    b->bulk = malloc(cfg->bulk_bytes);
    if (!b->raw || !b->rpc || !b->remote || !b->async || !b->raw_bulk || !b->tensor_bulk ||
        !b->bulk)
        return -1;
    for (size_t i = 0; i < cfg->bulk_bytes; i++)
        b->bulk[i] = (uint8_t)(i * 7);
    return 0;
}

/* Round trips, interleaved: a block of raw pings, a block of rpc_syncs, a few remotes. */
static int measure_rtt(const bench_pair_config *cfg, int fd, const tp_value *echo_args,
                       const tp_value *int_args, rank0_bufs *b, bench_pair_results *r) {
    uint8_t msg[MSG_LEN];
    memset(msg, 7, sizeof msg);
    for (int i = 0; i < RTT_WARMUP; i++) {
        BENCH_CHECK(raw_ping(fd, msg) == 0);
        BENCH_CHECK(!cfg->use_rpc || rpc_ping(echo_args) == 0);
    }
    for (int i = 0; cfg->use_rpc && i < REMOTE_WARMUP; i++)
        BENCH_CHECK(rpc_remote_to_here(int_args) == 0);
    int rounds = (cfg->rtt_samples + cfg->rtt_block - 1) / cfg->rtt_block;
    int raw_n = 0, rpc_n = 0, remote_n = 0;
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < cfg->rtt_block && raw_n < cfg->rtt_samples; i++) {
            uint64_t t0 = bench_now_ns();
            BENCH_CHECK(raw_ping(fd, msg) == 0);
            b->raw[raw_n++] = (double)(bench_now_ns() - t0) / 1e3;
        }
        if (!cfg->use_rpc)
            continue;
        for (int i = 0; i < cfg->rtt_block && rpc_n < cfg->rtt_samples; i++) {
            uint64_t t0 = bench_now_ns();
            BENCH_CHECK(rpc_ping(echo_args) == 0);
            b->rpc[rpc_n++] = (double)(bench_now_ns() - t0) / 1e3;
        }
        int remote_end = (int)((int64_t)cfg->remote_samples * (round + 1) / rounds);
        while (remote_n < remote_end) {
            uint64_t t0 = bench_now_ns();
            BENCH_CHECK(rpc_remote_to_here(int_args) == 0);
            b->remote[remote_n++] = (double)(bench_now_ns() - t0) / 1e3;
        }
    }
    r->raw_rtt_median_us = bench_median(b->raw, (size_t)raw_n);
    r->raw_rtt_p99_us = bench_percentile_sorted(b->raw, (size_t)raw_n, 99);
    if (cfg->use_rpc) {
        r->rpc_rtt_median_us = bench_median(b->rpc, (size_t)rpc_n);
        r->rpc_rtt_p99_us = bench_percentile_sorted(b->rpc, (size_t)rpc_n, 99);
        r->remote_median_us = bench_median(b->remote, (size_t)remote_n);
    }
    return 0;
}

static int measure_async(const bench_pair_config *cfg, const tp_value *echo_args, rank0_bufs *b,
                         bench_pair_results *r) {
    /* Warm-up: the callee's pool grows to its size, the allocator settles. */
    BENCH_CHECK(async_window_run(echo_args, cfg->async_window, cfg->async_window * 10) > 0);
    for (int i = 0; i < cfg->async_reps; i++) {
        b->async[i] = async_window_run(echo_args, cfg->async_window, cfg->async_calls);
        BENCH_CHECK(b->async[i] > 0);
        if (bench_verbose)
            fprintf(stderr, "rpc_bench: async repetition %d: %.0f calls/s\n", i, b->async[i]);
    }
    r->async_calls_per_s = bench_median(b->async, (size_t)cfg->async_reps);
    return 0;
}

/* Bulk transfers, alternating: raw bytes, then the same bytes as a tensor argument. */
static int measure_bulk(const bench_pair_config *cfg, int fd, rank0_bufs *b,
                        bench_pair_results *r) {
    int64_t numel = (int64_t)(cfg->bulk_bytes / sizeof(float));
    tp_value *args = NULL;
    if (cfg->use_rpc) {
        args = tp_value_list_of(1, tp_value_tensor(TP_DTYPE_FLOAT32, 1, &numel, NULL, b->bulk));
        BENCH_CHECK(args != NULL && tp_list_get(args, 0) != NULL);
    }
    double bytes = (double)numel * sizeof(float);
    int bad = 0;
    for (int i = -1; i < cfg->bulk_reps && !bad; i++) { /* i == -1 warms up */
        uint64_t t0 = bench_now_ns();
        bad |= raw_bulk(fd, b->bulk, (size_t)numel * sizeof(float));
        uint64_t t1 = bench_now_ns();
        if (cfg->use_rpc)
            bad |= rpc_tensor(args, numel);
        uint64_t t2 = bench_now_ns();
        if (i >= 0) {
            b->raw_bulk[i] = bytes / (double)(t1 - t0);
            b->tensor_bulk[i] = bytes / (double)(t2 - t1);
        }
        if (bench_verbose && i >= 0)
            fprintf(stderr, "rpc_bench: bulk repetition %d: raw %.3f GB/s, tensor %.3f GB/s\n", i,
                    b->raw_bulk[i], cfg->use_rpc ? b->tensor_bulk[i] : 0.0);
    }
    tp_value_free(args);
    BENCH_CHECK(!bad);
    r->raw_gbps = bench_median(b->raw_bulk, (size_t)cfg->bulk_reps);
    if (cfg->use_rpc)
        r->tensor_gbps = bench_median(b->tensor_bulk, (size_t)cfg->bulk_reps);
    return 0;
}

static int rank0_measure(const bench_pair_config *cfg, int fd, pair_shared *sh) {
    uint8_t payload[MSG_LEN];
    memset(payload, 7, sizeof payload);
    tp_value *echo_args = tp_value_list_of(1, tp_value_bytes(payload, sizeof payload));
    tp_value *int_args = tp_value_list_of(1, tp_value_int(7));
    rank0_bufs b;
    memset(&b, 0, sizeof b);
    int rc = 1;
    bench_pair_results r;
    memset(&r, 0, sizeof r);
    if (echo_args && int_args && bufs_alloc(&b, cfg) == 0 &&
        (!cfg->do_rtt || measure_rtt(cfg, fd, echo_args, int_args, &b, &r) == 0) &&
        (!cfg->use_rpc || !cfg->do_async || measure_async(cfg, echo_args, &b, &r) == 0) &&
        (!cfg->do_bulk || measure_bulk(cfg, fd, &b, &r) == 0)) {
        sh->results = r;
        sh->filled = 1;
        rc = 0;
    }
    bufs_free(&b);
    tp_value_free(echo_args);
    tp_value_free(int_args);
    return rc;
}

int bench_place(int placement, int rank) {
    if (placement == BENCH_PLACE_FREE)
        return 0;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(placement == BENCH_PLACE_ONE ? 0 : (int)(rank % (ncpu > 0 ? ncpu : 1)), &set);
    return sched_setaffinity(0, sizeof set, &set);
}

static int init_worker(int rank, uint16_t store_port) {
    bench_register_functions();
    tp_options *o = bench_worker_options(store_port);
    BENCH_CHECK(o != NULL);
    char name[32];
    snprintf(name, sizeof name, "worker%d", rank);
    tp_status st = tp_init_rpc(name, "TENSORPIPE", rank, 2, o);
    tp_options_free(o);
    BENCH_CHECK(st == TP_OK);
    return 0;
}

static int rank_body(const bench_pair_config *cfg, int rank, int lfd, uint16_t raw_port,
                     uint16_t store_port, pair_shared *sh) {
    BENCH_CHECK(bench_place(cfg->placement, rank) == 0);
    if (cfg->use_rpc && init_worker(rank, store_port) != 0)
        return 1;
    int rc;
    if (rank == 1) {
        int fd = bench_accept_nodelay(lfd);
        BENCH_CHECK(fd >= 0);
        rc = raw_serve(fd, cfg->bulk_bytes);
        close(fd);
    } else {
        close(lfd);
        int fd = bench_connect_loopback(raw_port);
        BENCH_CHECK(fd >= 0);
        rc = rank0_measure(cfg, fd, sh);
        uint8_t quit[MSG_LEN] = {'Q'};
        bench_full_io(fd, quit, sizeof quit, 1);
        close(fd);
    }
    if (cfg->use_rpc) {
        tp_status st = tp_shutdown(1);
        BENCH_CHECK(st == TP_OK);
    }
    return rc;
}

/* What bench_fork_ranks hands each child. */
typedef struct pair_job {
    const bench_pair_config *cfg;
    int lfd;
    uint16_t raw_port, store_port;
    pair_shared *sh;
} pair_job;

static int pair_rank(int rank, void *arg) {
    const pair_job *j = arg;
    return rank_body(j->cfg, rank, j->lfd, j->raw_port, j->store_port, j->sh);
}

int bench_pair_run(const bench_pair_config *cfg, bench_pair_results *out) {
    echo_fn = cfg->echo ? cfg->echo : "echo"; /* the forked ranks inherit it */
    uint16_t raw_port = 0, store_port = bench_free_port();
    int lfd = bench_listen_loopback(&raw_port);
    pair_shared *sh = bench_shared_alloc(sizeof *sh);
    pid_t pids[2] = {-1, -1};
    int rc = -1;
    if (lfd < 0 || store_port == 0 || !sh) {
        perror("rpc_bench: pair setup");
        goto out;
    }
    pair_job job = {cfg, lfd, raw_port, store_port, sh};
    (void)bench_fork_ranks(pids, pair_rank, &job);
    close(lfd);
    lfd = -1;
    if (bench_wait_children(pids, 2, 600, cfg->use_rpc ? "rpc pair" : "raw pair") == 0 &&
        sh->filled) {
        *out = sh->results;
        rc = 0;
    }
out:
    if (lfd >= 0)
        close(lfd);
    bench_shared_free(sh, sizeof *sh);
    return rc;
}
