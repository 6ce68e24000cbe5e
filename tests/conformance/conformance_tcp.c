/*
 * conformance_tcp.c: the conformance suite on the TCP transport ("TENSORPIPE"),
 * each rank a separate process on 127.0.0.1 with an ephemeral port.
 *
 * For each case the parent makes a fresh rendezvous (a new SQLite file, or
 * with TP_CONFORMANCE_STORE=tcp a free port for rank 0's TCP store), forks
 * one child per rank, and waits for all under a wall-clock deadline. A
 * child runs the rank program, writes its rank report into a pipe and
 * exits; a rank that calls crash_self writes a marker and dies by SIGKILL,
 * which then counts as asked. Cases are unchanged from the simulator's.
 *
 * Usage: conformance_tcp [--list] [CASE-SUBSTRING...]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conformance.h"
#include "tensorplay/rpc_backend.h"

#define CASE_WALL_LIMIT_S 120 /* a case is killed after this much real time */
#define CRASH_MARKER "\n#crash_self\n"
#define SHM_MARKER "\n#shm\n" /* a rank whose frames went through shared memory */
#define SHM_DENIED_MARKER "\n#shm-denied\n" /* a rank the kernel denied pidfd_getfd */
#define REPORT_MAX 8192

static char init_method[512];  /* this case's rendezvous, set before the fork */
static char store_dir[256];    /* the case's temp folder (sqlite store) */
static int report_fd = -1;     /* in a child: where its report goes */

static uint64_t tcp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int child_rank = -1;      /* in a child: its rank */
static atomic_int shm_used;      /* in a child: the backend said frames take slabs */
static atomic_int shm_denied;    /* in a child: ... that the kernel forbids the proof */
static int shm_cases, cases_run; /* in the parent: cases where some rank's did, of all */
static int shm_denied_cases;     /* in the parent: cases where the proof was forbidden */

/*
 * TP_CONFORMANCE_SHM (spec/tcp.md TCP-22): "all" sends every frame between
 * workers through shared memory (shm_min_bytes 0), "mixed" does so on even
 * ranks while odd ones have shm=off (their pairs keep TCP: an offer
 * refused, or never made), "off" sets shm=off everywhere. Unset: the
 * defaults (only frames of 1 MiB and more take shared memory).
 * TP_CONFORMANCE_SPIN_US sets every worker's spin_us (TCP-29).
 */
static tp_status shm_options(tp_options *o) {
    const char *spin = getenv("TP_CONFORMANCE_SPIN_US");
    if (spin && *spin && tp_options_set(o, "spin_us", spin) != TP_OK)
        return TP_EINVAL;
    const char *mode = getenv("TP_CONFORMANCE_SHM");
    if (!mode || !*mode)
        return TP_OK;
    int off = strcmp(mode, "off") == 0 || (strcmp(mode, "mixed") == 0 && child_rank % 2 == 1);
    if (off)
        return tp_options_set(o, "shm", "off");
    if (strcmp(mode, "all") != 0 && strcmp(mode, "mixed") != 0)
        return TP_EINVAL;
    return tp_options_set(o, "shm_min_bytes", "0");
}

static tp_options *tcp_options(const tp_conformance_launcher *l) {
    (void)l;
    tp_options *o = tp_options_new();
    if (o && (tp_options_set_init_method(o, init_method) != TP_OK || shm_options(o) != TP_OK)) {
        tp_options_free(o);
        return NULL;
    }
    return o;
}

static void write_all(int fd, const char *s, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, s, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        s += n;
        len -= (size_t)n;
    }
}

static void tcp_crash_self(void) {
    if (report_fd >= 0)
        write_all(report_fd, CRASH_MARKER, strlen(CRASH_MARKER));
    raise(SIGKILL); /* as kill -9 from outside: no cleanup, no goodbye on the sockets */
}

/* A port nobody listens on right now (a small race with other programs is
 * accepted: a collision fails init with a clear "address in use"). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static int make_rendezvous(char *why, size_t why_len) {
    const char *kind = getenv("TP_CONFORMANCE_STORE");
    if (kind && strcmp(kind, "tcp") == 0) {
        int port = free_port();
        if (port < 0) {
            snprintf(why, why_len, "  no free port: %s\n", strerror(errno));
            return -1;
        }
        snprintf(init_method, sizeof init_method, "tcp://127.0.0.1:%d", port);
        store_dir[0] = '\0';
        return 0;
    }
    snprintf(store_dir, sizeof store_dir, "/tmp/tp_conf_tcp_XXXXXX");
    if (!mkdtemp(store_dir)) {
        snprintf(why, why_len, "  mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    snprintf(init_method, sizeof init_method, "sqlite://%s/store.db", store_dir);
    return 0;
}

static void drop_rendezvous(void) {
    if (!store_dir[0])
        return;
    char path[512];
    const char *names[] = {"store.db", "store.db-wal", "store.db-shm"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", store_dir, names[i]);
        unlink(path);
    }
    rmdir(store_dir);
    store_dir[0] = '\0';
}

/* In a child with TP_CONFORMANCE_SHM: notes the backend's word that frames
 * to a peer go through shared memory (a debug message), and prints the rest
 * from warnings up as the default callback does. */
static void shm_log(tp_log_level level, const char *msg, void *ud) {
    (void)ud;
    if (strstr(msg, "go through shared memory"))
        atomic_store(&shm_used, 1);
    if (strstr(msg, "no shared memory") && strstr(msg, "not permitted"))
        atomic_store(&shm_denied, 1); /* Yama or seccomp: the pair rightly stays on TCP */
    if (level <= TP_LOG_WARN)
        fprintf(stderr, "tensorplay-rpc: %s: %s\n", level == TP_LOG_ERROR ? "error" : "warn",
                msg);
}

static _Noreturn void child_main(int fd, int rank, int world_size,
                                 tp_conformance_program program) {
    report_fd = fd;
    child_rank = rank;
    if (getenv("TP_CONFORMANCE_SHM")) {
        tp_set_log_callback(shm_log, NULL);
        tp_set_log_level(TP_LOG_DEBUG);
    }
    int rc = program(rank, world_size);
    if (atomic_load(&shm_used))
        write_all(fd, SHM_MARKER, strlen(SHM_MARKER));
    if (atomic_load(&shm_denied))
        write_all(fd, SHM_DENIED_MARKER, strlen(SHM_DENIED_MARKER));
    const char *rep = tp_conformance_rank_report(rank);
    write_all(fd, rep, strlen(rep));
    close(fd);
    exit(rc != 0 || rep[0] ? 3 : 0); /* exit, not _exit: a sanitizer checks leaks */
}

typedef struct child {
    pid_t pid;
    int fd;
    int status;
    int done;
    size_t len;
    char report[REPORT_MAX];
} child;

static int tcp_launch(const tp_conformance_launcher *l, int world_size,
                      tp_conformance_program program, char *why, size_t why_len) {
    (void)l;
    why[0] = '\0';
    if (world_size < 1 || world_size > TP_CONFORMANCE_RANKS_MAX) {
        snprintf(why, why_len, "  world_size %d outside [1, %d]\n", world_size,
                 TP_CONFORMANCE_RANKS_MAX);
        return 1;
    }
    if (make_rendezvous(why, why_len) != 0)
        return 1;
    child kids[TP_CONFORMANCE_RANKS_MAX];
    memset(kids, 0, sizeof kids);
    fflush(NULL);
    for (int r = 0; r < world_size; r++) {
        int p[2];
        if (pipe(p) != 0) {
            snprintf(why, why_len, "  pipe: %s\n", strerror(errno));
            world_size = r;
            break;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(p[0]);
            for (int k = 0; k < r; k++)
                close(kids[k].fd);
            child_main(p[1], r, world_size, program);
        }
        close(p[1]);
        kids[r].pid = pid;
        kids[r].fd = p[0];
    }
    double deadline = (double)tcp_now_ns() / 1e9 + CASE_WALL_LIMIT_S;
    int left = world_size, timed_out = 0;
    while (left > 0) {
        struct pollfd pfd[TP_CONFORMANCE_RANKS_MAX];
        int map[TP_CONFORMANCE_RANKS_MAX], n = 0;
        for (int r = 0; r < world_size; r++) {
            if (kids[r].fd >= 0) {
                pfd[n].fd = kids[r].fd;
                pfd[n].events = POLLIN;
                map[n++] = r;
            }
        }
        if (n == 0)
            break;
        double now = (double)tcp_now_ns() / 1e9;
        if (now >= deadline) {
            timed_out = 1;
            break;
        }
        int ready = poll(pfd, (nfds_t)n, (int)((deadline - now) * 1000) + 1);
        if (ready < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n && ready > 0; i++) {
            if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            child *k = &kids[map[i]];
            char buf[1024];
            ssize_t got = read(k->fd, buf, sizeof buf);
            if (got > 0) {
                size_t room = sizeof k->report - 1 - k->len;
                size_t take = (size_t)got < room ? (size_t)got : room;
                memcpy(k->report + k->len, buf, take);
                k->len += take;
                k->report[k->len] = '\0';
            } else if (got == 0 || errno != EINTR) {
                close(k->fd);
                k->fd = -1;
                left--;
            }
        }
    }
    for (int r = 0; r < world_size; r++) {
        if (timed_out && kids[r].fd >= 0)
            kill(kids[r].pid, SIGKILL);
        if (kids[r].fd >= 0)
            close(kids[r].fd);
        waitpid(kids[r].pid, &kids[r].status, 0);
    }
    drop_rendezvous();
    cases_run++;
    int used = 0, denied = 0;
    for (int r = 0; r < world_size; r++) {
        used |= strstr(kids[r].report, SHM_MARKER) != NULL;
        denied |= strstr(kids[r].report, SHM_DENIED_MARKER) != NULL;
    }
    shm_cases += used;
    shm_denied_cases += denied;
    int bad = timed_out;
    size_t off = strlen(why);
    if (timed_out)
        off += (size_t)snprintf(why + off, why_len - off, "  killed after %d s of wall time\n",
                                CASE_WALL_LIMIT_S);
    for (int r = 0; r < world_size && off < why_len; r++) {
        int st = kids[r].status;
        int crashed = strstr(kids[r].report, CRASH_MARKER) != NULL;
        int ok = (WIFEXITED(st) && WEXITSTATUS(st) == 0) ||
                 (crashed && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
        if (ok)
            continue;
        bad = 1;
        if (WIFSIGNALED(st))
            off += (size_t)snprintf(why + off, why_len - off, "  rank %d died of signal %d\n", r,
                                    WTERMSIG(st));
        else
            off += (size_t)snprintf(why + off, why_len - off, "  rank %d exited with %d\n", r,
                                    WEXITSTATUS(st));
        if (off < why_len)
            off += (size_t)snprintf(why + off, why_len - off, "%s", kids[r].report);
    }
    return bad;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    /* The job secret every forked worker inherits (spec/tcp.md TCP-17). */
    char secret[80];
    if (!getenv("TP_SECRET") &&
        (tp_job_secret_new(secret, sizeof secret) != TP_OK || setenv("TP_SECRET", secret, 1) != 0))
        return 1;
    tp_register_builtin_backends();
    if (!tp_lookup_backend("TENSORPIPE")) {
        fprintf(stderr, "conformance_tcp: this build has no TENSORPIPE backend\n");
        return 1;
    }
    tp_conformance_launcher l = {
        .backend = "TENSORPIPE",
        .run = tcp_launch,
        .options = tcp_options,
        .now_ns = tcp_now_ns,
        .crash_self = tcp_crash_self,
    };
    int failed = tp_conformance_main(argc, argv, &l);
    const char *mode = getenv("TP_CONFORMANCE_SHM");
    if (mode && (strcmp(mode, "all") == 0 || strcmp(mode, "mixed") == 0)) {
        /* The suite passing says little unless its frames took slabs: most
         * cases send between workers, so with "all" most must have; "mixed"
         * has shared memory only between even ranks (cases of 3 or more). */
        int all = strcmp(mode, "all") == 0;
        fprintf(stderr, "conformance_tcp: shared memory carried frames in %d of %d cases\n",
                shm_cases, cases_run);
        if (shm_cases == 0 && shm_denied_cases > 0) {
            fprintf(stderr, "conformance_tcp: this kernel forbids pidfd_getfd between the "
                            "workers (Yama ptrace_scope, seccomp): they stayed on TCP, as they "
                            "must; shared memory is not checked here\n");
        } else if (cases_run > 0 && (all ? shm_cases * 2 < cases_run : shm_cases == 0)) {
            fprintf(stderr, "conformance_tcp: TP_CONFORMANCE_SHM=%s, but shared memory was "
                            "used in %s\n", mode, all ? "fewer than half the cases" : "none");
            failed = 1;
        }
    }
    return failed ? 1 : 0;
}
