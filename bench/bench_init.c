/* bench_init.c: init wall time of an n-process job (bench_init.h). */
#include "bench_init.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench_util.h"

/* One child's report; smaller than PIPE_BUF, so each write is atomic. */
typedef struct init_report {
    int32_t rank;
    int32_t status; /* tp_status of tp_init_rpc */
    uint64_t start_ns;
    uint64_t return_ns;
} init_report;

static int read_full(int fd, void *p, size_t n) {
    char *b = p;
    while (n > 0) {
        ssize_t k = read(fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int child(int rank, int n, uint16_t store_port, int ready_w, int go_r, int report_w) {
    bench_register_functions();
    tp_options *o = bench_worker_options(store_port);
    BENCH_CHECK(o != NULL);
    char name[32], c = 'r';
    snprintf(name, sizeof name, "worker%d", rank);
    BENCH_CHECK(write(ready_w, &c, 1) == 1);
    close(ready_w);
    /* The start barrier: the parent closes the go pipe once all n are ready. */
    ssize_t k = read(go_r, &c, 1);
    BENCH_CHECK(k == 0);
    close(go_r);
    init_report rep = {rank, 0, bench_now_ns(), 0};
    tp_status st = tp_init_rpc(name, "TENSORPIPE", rank, n, o);
    rep.return_ns = bench_now_ns();
    rep.status = (int32_t)st;
    tp_options_free(o);
    if (st != TP_OK)
        fprintf(stderr, "rpc_bench: init of %d, rank %d: %s: %s\n", n, rank, tp_status_name(st),
                tp_errmsg());
    BENCH_CHECK(write(report_w, &rep, sizeof rep) == (ssize_t)sizeof rep);
    close(report_w);
    BENCH_CHECK(st == TP_OK);
    st = tp_shutdown(1);
    BENCH_CHECK(st == TP_OK);
    return 0;
}

static int collect(int n, int ready_r, int *go_w, int report_r, double *seconds) {
    char c;
    for (int i = 0; i < n; i++) {
        if (read_full(ready_r, &c, 1) != 0) {
            fprintf(stderr, "rpc_bench: init of %d: only %d processes got ready\n", n, i);
            return -1;
        }
    }
    close(*go_w); /* releases every child at once */
    *go_w = -1;
    uint64_t max_start = 0, max_return = 0;
    for (int i = 0; i < n; i++) {
        init_report rep;
        if (read_full(report_r, &rep, sizeof rep) != 0) {
            fprintf(stderr, "rpc_bench: init of %d: only %d processes reported\n", n, i);
            return -1;
        }
        if (rep.status != TP_OK)
            return -1;
        max_start = rep.start_ns > max_start ? rep.start_ns : max_start;
        max_return = rep.return_ns > max_return ? rep.return_ns : max_return;
    }
    *seconds = (double)(max_return - max_start) / 1e9;
    return 0;
}

int bench_init_run(int n, double *seconds) {
    int ready[2] = {-1, -1}, go[2] = {-1, -1}, report[2] = {-1, -1};
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    uint16_t store_port = bench_free_port();
    int rc = -1, spawned = 0;
    if (!pids || store_port == 0 || pipe(ready) || pipe(go) || pipe(report)) {
        perror("rpc_bench: init job setup");
        goto out;
    }
    for (; spawned < n; spawned++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            perror("rpc_bench: fork");
            break;
        }
        if (pid == 0) {
            close(ready[0]);
            close(go[1]);
            close(report[0]);
            int code = child(spawned, n, store_port, ready[1], go[0], report[1]);
            fflush(NULL);
            exit(code);
        }
        pids[spawned] = pid;
    }
    close(ready[1]);
    close(go[0]);
    close(report[1]);
    ready[1] = go[0] = report[1] = -1;
    if (spawned == n)
        rc = collect(n, ready[0], &go[1], report[0], seconds);
    if (go[1] >= 0) { /* a failure before the barrier: let the children go, and fail */
        close(go[1]);
        go[1] = -1;
    }
    char what[32];
    snprintf(what, sizeof what, "init of %d", n);
    if (bench_wait_children(pids, spawned, 120, what) != 0)
        rc = -1;
out:
    for (int i = 0; i < 2; i++) {
        if (ready[i] >= 0)
            close(ready[i]);
        if (go[i] >= 0)
            close(go[i]);
        if (report[i] >= 0)
            close(report[i]);
    }
    free(pids);
    return rc;
}
