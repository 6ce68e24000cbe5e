/* bench_util.c: clock, statistics, sockets, children and output (bench_util.h). */
#include "bench_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int bench_verbose = 0;
int bench_worker_threads = 0;
int bench_auth_off = 0;
int bench_encrypt = 0;
int bench_shm_off = 0;
int bench_spin_us = 0;

uint64_t bench_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, size_t n) {
    qsort(v, n, sizeof v[0], cmp_double);
    return v[n / 2];
}

double bench_percentile_sorted(const double *v, size_t n, double p) {
    size_t i = (size_t)((double)(n - 1) * p / 100.0 + 0.5);
    return v[i < n ? i : n - 1];
}

int bench_full_io(int fd, void *p, size_t n, int writing) {
    uint8_t *b = p;
    while (n > 0) {
        ssize_t k = writing ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static struct sockaddr_in loopback(uint16_t port) {
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(port);
    return sa;
}

int bench_listen_loopback(uint16_t *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = loopback(0);
    socklen_t len = sizeof sa;
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 16) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(sa.sin_port);
    return fd;
}

static void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int bench_connect_loopback(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = loopback(port);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    set_nodelay(fd);
    return fd;
}

int bench_accept_nodelay(int lfd) {
    int fd;
    do {
        fd = accept(lfd, NULL, NULL);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0)
        set_nodelay(fd);
    return fd;
}

uint16_t bench_free_port(void) {
    uint16_t port = 0;
    int fd = bench_listen_loopback(&port);
    if (fd < 0)
        return 0;
    close(fd);
    return port;
}

void *bench_shared_alloc(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void bench_shared_free(void *p, size_t size) {
    if (p)
        munmap(p, size);
}

int bench_fork_ranks(pid_t pids[2], int (*body)(int rank, void *arg), void *arg) {
    pids[0] = pids[1] = -1;
    for (int rank = 0; rank < 2; rank++) {
        fflush(NULL);
        pids[rank] = fork();
        if (pids[rank] < 0) {
            perror("rpc_bench: fork");
            return -1;
        }
        if (pids[rank] == 0) {
            int code = body(rank, arg);
            fflush(NULL);
            exit(code);
        }
    }
    return 0;
}

int bench_wait_children(const pid_t *pids, int n, double timeout_s, const char *what) {
    uint64_t deadline = bench_now_ns() + (uint64_t)(timeout_s * 1e9);
    int *code = malloc((size_t)n * sizeof *code);
    int left = 0, bad = 0;
    if (!code)
        return -1;
    /* Sleep in sigtimedwait until a child exits: a parent polling every few
     * milliseconds would take CPU time from the workload it waits for. */
    sigset_t chld, old;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, &old);
    for (int i = 0; i < n; i++) {
        code[i] = pids[i] > 0 ? -1 : 255;
        left += pids[i] > 0;
    }
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            for (int i = 0; i < n; i++) {
                if (pids[i] == pid && code[i] < 0) {
                    code[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                    left--;
                }
            }
            continue;
        }
        if (pid < 0 && errno == ECHILD)
            break;
        if (bench_now_ns() >= deadline) {
            for (int i = 0; i < n; i++) {
                if (code[i] < 0) {
                    fprintf(stderr,
                            "rpc_bench: %s: process %d still running after %.0f s: "
                            "killing it\n",
                            what, i, timeout_s);
                    kill(pids[i], SIGKILL);
                }
            }
            deadline = UINT64_MAX;
            continue;
        }
        struct timespec wait = {0, 200 * 1000000L};
        sigtimedwait(&chld, NULL, &wait);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    for (int i = 0; i < n; i++) {
        if (code[i] != 0) {
            fprintf(stderr, "rpc_bench: %s: process %d exited with status %d\n", what, i, code[i]);
            bad = 1;
        }
    }
    free(code);
    return bad ? -1 : 0;
}

tp_options *bench_worker_options(uint16_t store_port) {
    tp_options *o = NULL;
    char init_method[64];
    snprintf(init_method, sizeof init_method, "tcp://127.0.0.1:%u", (unsigned)store_port);
    if (tp_construct_rpc_backend_options("TENSORPIPE", &o) != TP_OK)
        return NULL;
    if ((bench_worker_threads > 0 &&
         tp_options_set_num_worker_threads(o, bench_worker_threads) != TP_OK) ||
        tp_options_set_init_method(o, init_method) != TP_OK ||
        tp_options_set_rpc_timeout(o, 60) != TP_OK || tp_options_set_init_timeout(o, 60) != TP_OK ||
        tp_options_set_shutdown_timeout(o, 60) != TP_OK ||
        (bench_auth_off && tp_options_set(o, "auth", "off") != TP_OK) ||
        (bench_encrypt && tp_options_set(o, "encrypt", "on") != TP_OK) ||
        (bench_shm_off && tp_options_set(o, "shm", "off") != TP_OK)) {
        tp_options_free(o);
        return NULL;
    }
    char spin[16];
    snprintf(spin, sizeof spin, "%d", bench_spin_us);
    if (bench_spin_us > 0 && tp_options_set(o, "spin_us", spin) != TP_OK) {
        tp_options_free(o);
        return NULL;
    }
    return o;
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

/* Returns the element count of its tensor argument: a small reply to a big call. */
static tp_status fn_numel(tp_call *call, const tp_value *args, const tp_value *kwargs,
                          tp_value **result, void *user_data) {
    (void)kwargs;
    (void)user_data;
    const tp_value *t = tp_list_get(args, 0);
    if (tp_list_len(args) != 1 || tp_value_kind(t) != TP_KIND_TENSOR) {
        tp_call_set_error(call, "numel takes one tensor");
        return TP_EINVAL;
    }
    *result = tp_value_int(tp_tensor_numel(t));
    return *result ? TP_OK : TP_ENOMEM;
}

void bench_register_functions(void) {
    tp_register_function("echo", fn_echo, NULL);
    /* The same echo, registered non-blocking: served on the I/O thread (FUNC-6). */
    tp_register_function_ex("nb_echo", fn_echo, NULL, TP_FN_NONBLOCKING);
    tp_register_function("numel", fn_numel, NULL);
}

void bench_print(const char *name, double value, const char *unit) {
    /* Counts and rates as integers, everything else with three decimals. */
    printf(value >= 1000.0 ? "BENCH %s %.0f %s\n" : "BENCH %s %.3f %s\n", name, value, unit);
    fflush(stdout);
}
