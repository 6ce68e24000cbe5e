/*
 * tcp_pingpong.c: round-trip latency of a 64-byte rpc_sync between two
 * processes over the TCP transport, next to a raw blocking-socket ping-pong
 * of 64 bytes on the same machine in the same run, as a yardstick.
 *
 *   tcp_pingpong [iterations]      (default 2000)
 *
 * Prints the median, mean and 99th percentile of each. Exits non-zero only
 * when something fails, never for a slow machine.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tcp_harness.h"

#define PAYLOAD 64
#define WARMUP 200
#define ITER_MAX 100000

static int iterations = 2000;

enum { NS_MEDIAN = 0, NS_MEAN = 1, NS_P99 = 2, F_DONE = 0 };

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void summarize(uint64_t *t, int n, uint64_t *median, uint64_t *mean, uint64_t *p99) {
    uint64_t sum = 0;
    for (int i = 0; i < n; i++)
        sum += t[i];
    qsort(t, (size_t)n, sizeof t[0], cmp_u64);
    *median = t[n / 2];
    *mean = sum / (uint64_t)n;
    *p99 = t[(n * 99) / 100];
}

static int full_io(int fd, void *p, size_t n, int writing) {
    uint8_t *b = p;
    while (n > 0) {
        ssize_t k = writing ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

/* The yardstick: 64 bytes there and back over loopback TCP, blocking sockets. */
static int raw_pingpong(uint64_t *median, uint64_t *mean, uint64_t *p99) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(lfd, 1) < 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &len) < 0)
        return -1;
    int one = 1;
    pid_t pid = fork();
    if (pid == 0) {
        int c = accept(lfd, NULL, NULL);
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        uint8_t b[PAYLOAD];
        while (full_io(c, b, sizeof b, 0) == 0 && full_io(c, b, sizeof b, 1) == 0) {
        }
        _exit(0);
    }
    close(lfd);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint8_t b[PAYLOAD];
    memset(b, 7, sizeof b);
    uint64_t *t = calloc((size_t)iterations, sizeof *t);
    for (int i = -WARMUP; i < iterations; i++) {
        uint64_t t0 = tt_now_ns();
        if (full_io(fd, b, sizeof b, 1) != 0 || full_io(fd, b, sizeof b, 0) != 0)
            return -1;
        if (i >= 0)
            t[i] = tt_now_ns() - t0;
    }
    close(fd);
    int status;
    waitpid(pid, &status, 0);
    summarize(t, iterations, median, mean, p99);
    free(t);
    return 0;
}

static int body_rpc(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    tp_options *o = tt_options(job, 30, 30);
    TT_CHECK(o && tt_init(job, rank, o) == 0);
    tp_options_free(o);
    if (rank == 0) {
        uint8_t data[PAYLOAD];
        memset(data, 7, sizeof data);
        tp_value *args = tp_value_list_of(1, tp_value_bytes(data, sizeof data));
        uint64_t *t = calloc((size_t)iterations, sizeof *t);
        TT_CHECK(args && t);
        for (int i = -WARMUP; i < iterations; i++) {
            tp_value *res = NULL;
            uint64_t t0 = tt_now_ns();
            TT_CHECK(tp_rpc_sync(tp_to_rank(1), "echo", args, NULL, TP_TIMEOUT_DEFAULT, &res) ==
                     TP_OK);
            if (i >= 0)
                t[i] = tt_now_ns() - t0;
            tp_value_free(res);
        }
        uint64_t median, mean, p99;
        summarize(t, iterations, &median, &mean, &p99);
        atomic_store(&sh->ns[NS_MEDIAN], median);
        atomic_store(&sh->ns[NS_MEAN], mean);
        atomic_store(&sh->ns[NS_P99], p99);
        atomic_store(&sh->flag[F_DONE], 1);
        free(t);
        tp_value_free(args);
    }
    TT_CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1) {
        iterations = atoi(argv[1]);
        if (iterations < 10 || iterations > ITER_MAX) {
            fprintf(stderr, "usage: tcp_pingpong [iterations 10..%d]\n", ITER_MAX);
            return 2;
        }
    }
    uint64_t median, mean, p99;
    if (raw_pingpong(&median, &mean, &p99) != 0) {
        perror("raw ping-pong");
        return 1;
    }
    printf("raw blocking TCP ping-pong, %d B, loopback: median %.1f us, mean %.1f us, p99 %.1f us "
           "(%d round trips)\n",
           PAYLOAD, median / 1e3, mean / 1e3, p99 / 1e3, iterations);
    tt_job job = {0};
    if (tt_spawn(&job, 2, body_rpc, NULL) != 0 || tt_wait(&job, 120) != 0 ||
        !atomic_load(&job.shared->flag[F_DONE])) {
        fprintf(stderr, "rpc ping-pong failed (exit codes %d %d)\n", job.code[0], job.code[1]);
        tt_job_free(&job);
        return 1;
    }
    printf("rpc_sync echo of %d B bytes, 2 processes:   median %.1f us, mean %.1f us, p99 %.1f us "
           "(%d calls)\n",
           PAYLOAD, atomic_load(&job.shared->ns[NS_MEDIAN]) / 1e3,
           atomic_load(&job.shared->ns[NS_MEAN]) / 1e3, atomic_load(&job.shared->ns[NS_P99]) / 1e3,
           iterations);
    tt_job_free(&job);
    return 0;
}
