/* tcp_harness.c: forked multi-process jobs on 127.0.0.1 (see tcp_harness.h). */
#include "tcp_harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "real/free_port.h"

uint64_t tt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void tt_ensure_secret(void) {
    char hex[80];
    if (getenv("TP_SECRET"))
        return;
    if (tp_job_secret_new(hex, sizeof hex) != TP_OK) {
        fprintf(stderr, "tt_ensure_secret: %s\n", tp_errmsg());
        abort();
    }
    setenv("TP_SECRET", hex, 1);
}

/* A port nobody uses, taken by its user a moment later: in that moment any
 * process may take it. One the kernel handed out (bind to port 0) is
 * ephemeral, and parallel tests' outgoing connections and port-0 listeners
 * draw from the same range all the time: a store or worker told to listen
 * there found it taken, and a port meant to refuse connections was answered
 * (CI flakes). So it comes from tpi_free_port, below the ephemeral range. */
uint16_t tt_free_port(void) {
    char err[256];
    unsigned port;
    if (tpi_free_port("127.0.0.1", &port, err, sizeof err) != 0) {
        fprintf(stderr, "tt_free_port: %s\n", err);
        abort();
    }
    return (uint16_t)port;
}

int tt_spawn(tt_job *job, int world, tt_body body, void *arg) {
    if (world < 1 || world > TT_WORLD_MAX)
        return -1;
    tt_ensure_secret(); /* the children inherit the job's secret (TCP-17) */
    job->world = world;
    job->arg = arg;
    job->store_port = tt_free_port();
    snprintf(job->init_method, sizeof job->init_method, "tcp://127.0.0.1:%u",
             (unsigned)job->store_port);
    if (!job->shared) {
        void *p = mmap(NULL, sizeof(tt_shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                       -1, 0);
        if (p == MAP_FAILED)
            return -1;
        job->shared = p;
        memset(p, 0, sizeof(tt_shared));
    }
    for (int r = 0; r < world; r++) {
        job->pid[r] = -1;
        job->code[r] = -1;
    }
    for (int r = 0; r < world; r++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0) {
            int code = body(job, r);
            fflush(NULL);
            exit(code); /* exit, not _exit: a sanitizer's leak check runs here */
        }
        job->pid[r] = pid;
    }
    return 0;
}

int tt_wait(tt_job *job, double timeout_s) {
    uint64_t deadline = tt_now_ns() + (uint64_t)(timeout_s * 1e9);
    int left = 0;
    for (int r = 0; r < job->world; r++)
        left += job->pid[r] > 0 && job->code[r] < 0;
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            for (int r = 0; r < job->world; r++) {
                if (job->pid[r] == pid && job->code[r] < 0) {
                    job->code[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                    left--;
                }
            }
            continue;
        }
        if (tt_now_ns() >= deadline) {
            for (int r = 0; r < job->world; r++) {
                if (job->code[r] < 0) {
                    fprintf(stderr, "tt_wait: rank %d still running after %.1f s: killing it\n", r,
                            timeout_s);
                    kill(job->pid[r], SIGKILL);
                }
            }
            deadline = UINT64_MAX;
            continue;
        }
        sleep_ms(2);
    }
    int bad = 0;
    for (int r = 0; r < job->world; r++) {
        if (job->code[r] != 0)
            fprintf(stderr, "tt_wait: rank %d exited with %d\n", r, job->code[r]);
        bad |= job->code[r] != 0;
    }
    return bad ? -1 : 0;
}

tp_status tt_call_add(tp_dest d, int64_t a, int64_t b, double timeout_s, int64_t *out) {
    tp_value *args = tp_value_list_of(2, tp_value_int(a), tp_value_int(b));
    tp_value *res = NULL;
    tp_status st = tp_rpc_sync(d, "add", args, NULL, timeout_s, &res);
    if (st == TP_OK && tp_value_get_int(res, out) != TP_OK)
        st = TP_ETYPE;
    tp_value_free(args);
    tp_value_free(res);
    return st;
}

static int all_answer(const tt_job *job, int rank, int retry) {
    for (int r = 0; r < job->world; r++) {
        int64_t v = 0;
        tp_status st = tt_call_add(tp_to_rank(r), rank, r, 20, &v);
        if (st == TP_EIO && retry) {
            fprintf(stderr, "rank %d: add on rank %d: %s, tried again\n", rank, r, tp_errmsg());
            st = tt_call_add(tp_to_rank(r), rank, r, 20, &v);
        }
        if (st != TP_OK || v != rank + r) {
            fprintf(stderr, "rank %d: add on rank %d: %s (%s), got %lld\n", rank, r,
                    tp_status_name(st), tp_errmsg(), (long long)v);
            return -1;
        }
    }
    return 0;
}

int tt_all_answer(const tt_job *job, int rank) {
    return all_answer(job, rank, 0);
}

int tt_all_answer_retrying(const tt_job *job, int rank) {
    return all_answer(job, rank, 1);
}

int tt_kill_rank(tt_job *job, int rank) {
    int status = 0;
    if (rank < 0 || rank >= job->world || kill(job->pid[rank], SIGKILL) != 0 ||
        waitpid(job->pid[rank], &status, 0) != job->pid[rank])
        return -1;
    job->code[rank] = 128 + SIGKILL;
    return 0;
}

int tt_restart_rank(tt_job *job, int rank, int (*body)(tt_job *job)) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int code = body(job);
        fflush(NULL);
        exit(code); /* exit, not _exit: the exit handlers and LeakSanitizer run */
    }
    job->pid[rank] = pid;
    job->code[rank] = -1;
    return 0;
}

void tt_job_free(tt_job *job) {
    if (job->shared)
        munmap(job->shared, sizeof(tt_shared));
    job->shared = NULL;
}

tp_options *tt_options(const tt_job *job, double rpc_timeout_s, double shutdown_timeout_s) {
    tp_options *o = NULL;
    if (tp_construct_rpc_backend_options("TENSORPIPE", &o) != TP_OK)
        return NULL;
    tp_options_set_init_method(o, job->init_method);
    tp_options_set_rpc_timeout(o, rpc_timeout_s);
    tp_options_set_init_timeout(o, 20);
    tp_options_set_shutdown_timeout(o, shutdown_timeout_s);
    tp_options_set_num_worker_threads(o, 8);
    return o;
}

static tp_status fn_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *user_data) {
    (void)kwargs;
    (void)user_data;
    int64_t a, b;
    if (tp_list_len(args) != 2 || tp_value_get_int(tp_list_get(args, 0), &a) != TP_OK ||
        tp_value_get_int(tp_list_get(args, 1), &b) != TP_OK) {
        tp_call_set_error(call, "add takes two ints");
        return TP_EINVAL;
    }
    /* Wraps: any peer may send any ints. */
    *result = tp_value_int((int64_t)((uint64_t)a + (uint64_t)b));
    return TP_OK;
}

/* Returns its first argument back. */
static tp_status fn_echo(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)kwargs;
    (void)user_data;
    if (tp_list_len(args) != 1) {
        tp_call_set_error(call, "echo takes one argument");
        return TP_EINVAL;
    }
    *result = tp_value_clone(tp_list_get(args, 0));
    return *result ? TP_OK : TP_ENOMEM;
}

/* Counts itself in shared counter args[0], then sleeps args[1] seconds. */
static tp_status fn_slow(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)kwargs;
    tt_shared *sh = user_data;
    int64_t idx = 0;
    double secs = 0;
    if (tp_list_len(args) != 2 || tp_value_get_int(tp_list_get(args, 0), &idx) != TP_OK ||
        tp_value_get_float(tp_list_get(args, 1), &secs) != TP_OK || idx < 0 || idx >= TT_FLAGS) {
        tp_call_set_error(call, "slow takes a counter index and seconds");
        return TP_EINVAL;
    }
    if (sh)
        atomic_fetch_add(&sh->count[idx], 1);
    tp_status st = tp_sleep(secs);
    if (st != TP_OK) {
        tp_call_set_error(call, "slow was interrupted");
        return st;
    }
    *result = tp_value_int(idx);
    return TP_OK;
}

/* Counts itself in shared counter args[0], then waits, outside the library,
 * until shared flag args[0] is set (at most 30 s): a user function the core
 * cannot interrupt. */
static tp_status fn_block(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *user_data) {
    (void)kwargs;
    tt_shared *sh = user_data;
    int64_t idx = 0;
    if (!sh || tp_list_len(args) != 1 || tp_value_get_int(tp_list_get(args, 0), &idx) != TP_OK ||
        idx < 0 || idx >= TT_FLAGS) {
        tp_call_set_error(call, "block takes a flag index");
        return TP_EINVAL;
    }
    atomic_fetch_add(&sh->count[idx], 1);
    if (tt_await_flag(sh, (int)idx, 1, 30) != 0) {
        tp_call_set_error(call, "block: flag %d was never set", (int)idx);
        return TP_ETIMEDOUT;
    }
    *result = tp_value_int(idx);
    return TP_OK;
}

/* Atomic: two workers of one process (test_tcp_two_workers_one_process)
 * init on two threads, each storing the same job's memory here. */
static _Atomic(tt_shared *) registered_shared;

void tt_register_functions(void) {
    tp_register_function("add", fn_add, NULL);
    tp_register_function("echo", fn_echo, NULL);
    tt_shared *sh = atomic_load(&registered_shared);
    tp_register_function("slow", fn_slow, sh);
    tp_register_function("block", fn_block, sh);
}

int tt_init(const tt_job *job, int rank, tp_options *opts) {
    atomic_store(&registered_shared, job->shared);
    tt_register_functions();
    char name[32];
    snprintf(name, sizeof name, "worker%d", rank);
    tp_status st = tp_init_rpc(name, "TENSORPIPE", rank, job->world, opts);
    if (st != TP_OK) {
        fprintf(stderr, "rank %d: init failed: %s: %s\n", rank, tp_status_name(st), tp_errmsg());
        return -1;
    }
    return 0;
}

int tt_await_flag(tt_shared *sh, int i, int v, double timeout_s) {
    uint64_t deadline = tt_now_ns() + (uint64_t)(timeout_s * 1e9);
    while (atomic_load(&sh->flag[i]) < v) {
        if (tt_now_ns() >= deadline)
            return -1;
        sleep_ms(1);
    }
    return 0;
}

/* Entries of a /proc directory, less "." and ".."; -1 when it cannot be read. */
static long dir_entries(const char *path) {
    DIR *d = opendir(path);
    if (!d)
        return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

int tt_self_usage(uint64_t *rss_bytes, uint64_t *fds, uint64_t *threads) {
    unsigned long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    int ok = f && fscanf(f, "%lu %lu", &size, &resident) == 2;
    if (f)
        fclose(f);
    long nfd = dir_entries("/proc/self/fd"); /* counts the descriptor reading it */
    long ntask = dir_entries("/proc/self/task");
    if (!ok || nfd < 1 || ntask < 1)
        return -1;
    *rss_bytes = (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
    *fds = (uint64_t)nfd - 1;
    *threads = (uint64_t)ntask;
    return 0;
}

int tt_idle_rounds(int rank, int rounds) {
    for (int round = 0; round < rounds; round++) {
        /* 0.1-0.4 s */
        usleep((useconds_t)(TT_SLOWDOWN * (100000 + 25000 * ((round * 7 + rank * 3) % 13))));
        tp_future *f[20];
        for (int i = 0; i < 20; i++) {
            tp_value *args = tp_value_list_of(2, tp_value_int(round), tp_value_int(i));
            TT_CHECK(tp_rpc_async(tp_to_rank((rank + 1 + i % 2) % 3), "add", args, NULL, 20,
                                  &f[i]) == TP_OK);
            tp_value_free(args);
        }
        for (int i = 0; i < 20; i++) {
            int64_t v = -1;
            TT_CHECK(tp_future_wait(f[i], 20) == TP_OK);
            TT_CHECK(tp_value_get_int(tp_future_value(f[i]), &v) == TP_OK && v == round + i);
            tp_future_free(f[i]);
        }
    }
    return 0;
}

/* 1 when this process may take a descriptor out of a sibling (what the
 * proof needs): Yama's ptrace_scope >= 1 or a seccomp filter may forbid it,
 * and then workers rightly stay on TCP. */
int tt_can_take_fds(void) {
    int pipefd[2];
    if (pipe(pipefd) != 0)
        return 0;
    pid_t child = fork();
    if (child == 0) {
        char c;
        close(pipefd[1]);
        (void)!read(pipefd[0], &c, 1); /* until the parent is done */
        _exit(0);
    }
    close(pipefd[0]);
    int pidfd = child > 0 ? (int)syscall(SYS_pidfd_open, child, 0) : -1;
    int fd = pidfd >= 0 ? (int)syscall(SYS_pidfd_getfd, pidfd, 0, 0) : -1;
    if (fd >= 0)
        close(fd);
    if (pidfd >= 0)
        close(pidfd);
    close(pipefd[1]);
    if (child > 0)
        waitpid(child, NULL, 0);
    return fd >= 0;
}
