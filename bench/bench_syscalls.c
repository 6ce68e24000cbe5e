/* bench_syscalls.c: system calls per rpc_sync, counted by strace (bench_syscalls.h). */
#include "bench_syscalls.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_pair.h"
#include "bench_util.h"

#define MSG_LEN 64
#define SYSCALL_NAMES_MAX 128

/* ---------------------------------------------------------------------- */
/* The traced job.                                                        */

static int job_rank(int rank, int n, int placement, const char *fn, uint16_t store_port,
                    int done_r, int done_w) {
    BENCH_CHECK(bench_place(placement, rank) == 0);
    bench_register_functions();
    tp_options *o = bench_worker_options(store_port);
    BENCH_CHECK(o != NULL);
    char name[32];
    snprintf(name, sizeof name, "worker%d", rank);
    tp_status st = tp_init_rpc(name, "TENSORPIPE", rank, 2, o);
    tp_options_free(o);
    BENCH_CHECK(st == TP_OK);
    char c = 'd';
    if (rank == 0) {
        close(done_r);
        uint8_t payload[MSG_LEN];
        memset(payload, 7, sizeof payload);
        tp_value *args = tp_value_list_of(1, tp_value_bytes(payload, sizeof payload));
        BENCH_CHECK(args != NULL);
        for (int i = 0; i < n + 1; i++) { /* call 0 opens the connections */
            tp_value *res = NULL;
            st = tp_rpc_sync(tp_to_rank(1), fn, args, NULL, TP_TIMEOUT_DEFAULT, &res);
            tp_value_free(res);
            BENCH_CHECK(st == TP_OK);
        }
        tp_value_free(args);
        BENCH_CHECK(write(done_w, &c, 1) == 1);
        close(done_w);
    } else {
        /* rank 1 stays out of shutdown (whose waits might cost calls over time) until
         * rank 0 is done, so both runs shut down the same way. */
        close(done_w);
        BENCH_CHECK(read(done_r, &c, 1) == 1);
        close(done_r);
    }
    st = tp_shutdown(1);
    BENCH_CHECK(st == TP_OK);
    return 0;
}

/* What bench_fork_ranks hands each child. */
typedef struct syscall_job {
    int n, placement;
    const char *fn;
    uint16_t store_port;
    int done[2];
} syscall_job;

static int syscall_rank(int rank, void *arg) {
    const syscall_job *j = arg;
    return job_rank(rank, j->n, j->placement, j->fn, j->store_port, j->done[0], j->done[1]);
}

int bench_syscall_job(int n, int placement, const char *fn) {
    uint16_t store_port = bench_free_port();
    int done[2];
    pid_t pids[2] = {-1, -1};
    if (store_port == 0 || pipe(done) != 0) {
        perror("rpc_bench: syscall job setup");
        return 1;
    }
    syscall_job job = {n, placement, fn, store_port, {done[0], done[1]}};
    (void)bench_fork_ranks(pids, syscall_rank, &job);
    close(done[0]);
    close(done[1]);
    /* Blocking waits: a polling parent would add calls in proportion to the run's length. */
    int bad = 0;
    for (int rank = 0; rank < 2; rank++) {
        int status = 0;
        pid_t got;
        do {
            got = pids[rank] > 0 ? waitpid(pids[rank], &status, 0) : -1;
        } while (got < 0 && errno == EINTR);
        if (got < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "rpc_bench: syscall job: rank %d failed (status %d)\n", rank, status);
            bad = 1;
        }
    }
    return bad;
}

/* ---------------------------------------------------------------------- */
/* Running strace and reading its summary.                                */

typedef struct syscall_table {
    int count;
    char name[SYSCALL_NAMES_MAX][32];
    long calls[SYSCALL_NAMES_MAX];
    long total;
} syscall_table;

/*
 * Reads strace -c's table: rows "% time  seconds  usecs/call  calls  [errors]
 * syscall", then a dashed rule and the "total" row.
 */
static int parse_summary(const char *path, syscall_table *t) {
    FILE *f = fopen(path, "r");
    char line[512];
    memset(t, 0, sizeof *t);
    t->total = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        char *tok[8];
        int nt = 0;
        for (char *s = strtok(line, " \t\n"); s && nt < 8; s = strtok(NULL, " \t\n"))
            tok[nt++] = s;
        if (nt < 5 || !(tok[0][0] >= '0' && tok[0][0] <= '9'))
            continue;
        long calls = strtol(tok[3], NULL, 10);
        if (strcmp(tok[nt - 1], "total") == 0) {
            t->total = calls;
        } else if (t->count < SYSCALL_NAMES_MAX) {
            snprintf(t->name[t->count], sizeof t->name[0], "%s", tok[nt - 1]);
            t->calls[t->count++] = calls;
        }
    }
    fclose(f);
    return t->total >= 0 ? 0 : -1;
}

static int run_traced(const char *self, int n, int placement, const char *fn, syscall_table *t) {
    char path[] = "/tmp/rpc_bench_strace_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("rpc_bench: mkstemp");
        return -1;
    }
    close(fd);
    char nbuf[32], pbuf[32];
    snprintf(nbuf, sizeof nbuf, "%d", n);
    snprintf(pbuf, sizeof pbuf, "%d", placement);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execlp("strace", "strace", "-f", "-c", "-o", path, "--", self, "--syscall-job", nbuf, pbuf,
               fn, bench_shm_off ? "shm=off" : "shm=on", (char *)NULL);
        fprintf(stderr, "rpc_bench: cannot run strace: %s (scripts/install-deps.sh strace)\n",
                strerror(errno));
        _exit(127);
    }
    int status = 0, rc = -1;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        rc = parse_summary(path, t);
    else
        fprintf(stderr, "rpc_bench: strace of the syscall job failed (status %d)\n", status);
    unlink(path);
    return rc;
}

static long table_get(const syscall_table *t, const char *name) {
    for (int i = 0; i < t->count; i++) {
        if (strcmp(t->name[i], name) == 0)
            return t->calls[i];
    }
    return 0;
}

/* Prints, on stderr, which system calls the n calls added, per call. */
static void print_breakdown(const syscall_table *with, const syscall_table *base, int n) {
    for (int i = 0; i < with->count; i++) {
        double d = (double)(with->calls[i] - table_get(base, with->name[i])) / n;
        if (d >= 0.05 || d <= -0.05)
            fprintf(stderr, "rpc_bench:   %-16s %6.2f per rpc_sync\n", with->name[i], d);
    }
}

int bench_syscalls_run(const char *self, int n, int reps, int placement, const char *fn,
                       double *per_call) {
    static syscall_table with, base, t;
    long with_min = -1, base_min = -1;
    for (int r = 0; r < reps; r++) {
        if (run_traced(self, n, placement, fn, &t) != 0)
            return -1;
        long with_total = t.total;
        if (with_min < 0 || t.total < with_min) {
            with_min = t.total;
            with = t;
        }
        if (run_traced(self, 0, placement, fn, &t) != 0)
            return -1;
        if (base_min < 0 || t.total < base_min) {
            base_min = t.total;
            base = t;
        }
        if (bench_verbose)
            fprintf(stderr,
                    "rpc_bench: strace repetition %d: %ld calls with %d rpc_syncs, "
                    "baseline %ld\n",
                    r, with_total, n, t.total);
    }
    *per_call = (double)(with_min - base_min) / n;
    if (bench_verbose) {
        fprintf(stderr, "rpc_bench: system calls per rpc_sync, by name (both processes):\n");
        print_breakdown(&with, &base, n);
    }
    return 0;
}
