/*
 * tprun.c: starts an N-process job on this machine (spec/tcp.md TCP-13).
 *
 *   tprun --nproc N [--master-addr A] [--master-port P] [--grace S] [--no-prefix]
 *         PROGRAM [ARGS...]
 *
 * Each process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
 * MASTER_ADDR and MASTER_PORT (a free port of A when none is given), the
 * environment init_method env:// reads. Every line a process writes to
 * stdout or stderr comes out on tprun's stdout or stderr prefixed with
 * "[rank] ". When a process fails (non-zero exit or a signal) the others get
 * SIGTERM, then SIGKILL after the grace period (default 5 s), and tprun
 * exits with the first failure's status (128 + signal for a signal). SIGINT
 * and SIGTERM sent to tprun are forwarded the same way. Each run gets a fresh
 * job secret in TP_SECRET (TCP-17), from the kernel's random generator,
 * unless TP_SECRET is set already; it never appears on a command line.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netdb.h>

#define NPROC_MAX 1024       /* processes on one machine: a bound, not a tuning knob */
#define LINE_MAX_BYTES 16384 /* a longer line is split */
#define GRACE_DEFAULT_S 5.0

typedef struct stream {
    int fd;     /* -1 once closed */
    int out_fd; /* 1 or 2 */
    char buf[LINE_MAX_BYTES];
    size_t len;
} stream;

typedef struct proc {
    pid_t pid;
    int running;
    int status;
    stream s[2];
} proc;

static int sig_pipe[2] = {-1, -1};
static volatile sig_atomic_t got_signal;

static void on_signal(int sig) {
    int saved = errno;
    if (sig != SIGCHLD)
        got_signal = sig;
    ssize_t k = write(sig_pipe[1], "x", 1);
    (void)k;
    errno = saved;
}

/* TCP-17: a fresh job secret for this run's processes, unless one is set. */
static int job_secret(void) {
    if (getenv("TP_SECRET"))
        return 0;
    uint8_t b[32];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t k = getrandom(b + got, sizeof b - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            fprintf(stderr, "tprun: cannot make a job secret: getrandom: %s\n", strerror(errno));
            return -1;
        }
        got += (size_t)k;
    }
    char hex[2 * sizeof b + 1];
    for (size_t i = 0; i < sizeof b; i++)
        snprintf(hex + 2 * i, 3, "%02x", b[i]);
    memset(b, 0, sizeof b);
    return setenv("TP_SECRET", hex, 1);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f, "usage: tprun --nproc N [--master-addr ADDR] [--master-port PORT] [--grace SECONDS] "
               "[--no-prefix] PROGRAM [ARGS...]\n"
               "Starts N processes of PROGRAM with RANK, WORLD_SIZE, MASTER_ADDR and "
               "MASTER_PORT set,\nprefixes their output lines with \"[rank] \" (unless "
               "--no-prefix) and stops them all when one fails.\n");
}

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return; /* our own output is gone: nothing better to do */
        p += k;
        n -= (size_t)k;
    }
}

static int prefix_lines = 1; /* --no-prefix clears it */

static void emit_line(int rank, int out_fd, const char *p, size_t n) {
    char prefix[32];
    int k = prefix_lines ? snprintf(prefix, sizeof prefix, "[%d] ", rank) : 0;
    char *line = malloc((size_t)k + n + 1);
    if (!line) {
        write_all(out_fd, prefix, (size_t)k);
        write_all(out_fd, p, n);
        write_all(out_fd, "\n", 1);
        return;
    }
    memcpy(line, prefix, (size_t)k);
    memcpy(line + k, p, n);
    line[(size_t)k + n] = '\n';
    write_all(out_fd, line, (size_t)k + n + 1); /* one write: lines of ranks do not mix */
    free(line);
}

/* Reads what is there; emits complete lines; at EOF the rest as a line. */
static void stream_read(int rank, stream *s) {
    ssize_t k = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (k < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (k <= 0) {
        if (s->len)
            emit_line(rank, s->out_fd, s->buf, s->len);
        s->len = 0;
        close(s->fd);
        s->fd = -1;
        return;
    }
    s->len += (size_t)k;
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] == '\n') {
            emit_line(rank, s->out_fd, s->buf + start, i - start);
            start = i + 1;
        }
    }
    if (start == 0 && s->len == sizeof s->buf) {
        emit_line(rank, s->out_fd, s->buf, s->len); /* a line longer than the buffer */
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

/* A port nobody uses now on addr (the kernel's choice for port 0). */
static int free_port(const char *addr, char *out, size_t len) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(addr, "0", &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "tprun: cannot resolve --master-addr '%s': %s\n", addr, gai_strerror(rc));
        return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) < 0) {
        fprintf(stderr, "tprun: cannot find a free port on %s: %s\n", addr, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        return -1;
    }
    unsigned port = sa.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&sa)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&sa)->sin_port);
    close(fd);
    freeaddrinfo(res);
    snprintf(out, len, "%u", port);
    return 0;
}

static int parse_int(const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !end || *end || end == s || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static void signal_all(proc *ps, int n, int sig) {
    for (int i = 0; i < n; i++)
        if (ps[i].running)
            kill(ps[i].pid, sig);
}

static pid_t spawn(int rank, int n, const char *addr, const char *port, char **argv, proc *p) {
    int out[2], err[2];
    if (pipe(out) < 0)
        return -1;
    if (pipe(err) < 0) {
        close(out[0]);
        close(out[1]);
        return -1;
    }
    fcntl(out[0], F_SETFD, FD_CLOEXEC);
    fcntl(err[0], F_SETFD, FD_CLOEXEC);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGCHLD, SIG_DFL);
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(out[1]);
        close(err[1]);
        char v[32];
        snprintf(v, sizeof v, "%d", rank);
        setenv("RANK", v, 1);
        setenv("LOCAL_RANK", v, 1);
        snprintf(v, sizeof v, "%d", n);
        setenv("WORLD_SIZE", v, 1);
        setenv("LOCAL_WORLD_SIZE", v, 1);
        setenv("MASTER_ADDR", addr, 1);
        setenv("MASTER_PORT", port, 1);
        execvp(argv[0], argv);
        fprintf(stderr, "tprun: cannot run '%s': %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        close(out[0]);
        close(err[0]);
        return -1;
    }
    p->pid = pid;
    p->running = 1;
    p->s[0].fd = out[0];
    p->s[0].out_fd = 1;
    p->s[1].fd = err[0];
    p->s[1].out_fd = 2;
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    return pid;
}

/* The exit status tprun reports for a wait status. */
static int exit_code(int status) {
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return 1;
}

typedef struct options {
    int nproc;
    const char *addr;
    const char *port;
    double grace_s;
    char **program; /* argv of PROGRAM, NULL-terminated */
} options;

/* Parses the command line: 0 to run, else the exit status (usage: 2). */
static int parse_args(int argc, char **argv, options *o) {
    o->nproc = 0;
    o->addr = "127.0.0.1";
    o->port = NULL;
    o->grace_s = GRACE_DEFAULT_S;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return -1;
        }
        if (strcmp(a, "--no-prefix") == 0) {
            prefix_lines = 0;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tprun: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        long x;
        char *end = NULL;
        if (strcmp(a, "--nproc") == 0 && parse_int(v, 1, NPROC_MAX, &x) == 0) {
            o->nproc = (int)x;
        } else if (strcmp(a, "--master-addr") == 0 && *v) {
            o->addr = v;
        } else if (strcmp(a, "--master-port") == 0 && parse_int(v, 1, 65535, &x) == 0) {
            o->port = v;
        } else if (strcmp(a, "--grace") == 0 && (o->grace_s = strtod(v, &end)) >= 0 && end &&
                   !*end && end != v && o->grace_s <= 3600) {
            continue;
        } else {
            fprintf(stderr,
                    "tprun: bad option %s '%s' (--nproc 1..%d, --master-port 1..65535, "
                    "--grace 0..3600 s)\n",
                    a, v, NPROC_MAX);
            usage(stderr);
            return 2;
        }
    }
    if (o->nproc == 0 || i >= argc) {
        fprintf(stderr, "tprun: %s\n", o->nproc == 0 ? "--nproc is required" : "no PROGRAM given");
        usage(stderr);
        return 2;
    }
    o->program = argv + i;
    return 0;
}

static int install_signals(void) {
    if (pipe(sig_pipe) < 0) {
        perror("tprun: pipe");
        return -1;
    }
    for (int k = 0; k < 2; k++) {
        fcntl(sig_pipe[k], F_SETFL, O_NONBLOCK);
        fcntl(sig_pipe[k], F_SETFD, FD_CLOEXEC);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* The running job: its processes and how it ends. */
typedef struct job {
    proc *ps;
    int n;
    int running;
    int stopping;
    int result;
    uint64_t kill_at; /* SIGKILL the rest then; UINT64_MAX: not scheduled */
    double grace_s;
} job;

/* Sends sig to every running process and schedules SIGKILL after the grace. */
static void begin_stop(job *j, int sig, int result) {
    if (j->stopping)
        return;
    j->stopping = 1;
    j->result = result;
    signal_all(j->ps, j->n, sig);
    j->kill_at = now_ns() + (uint64_t)(j->grace_s * 1e9);
}

/* Collects exited processes; the first failure stops the others. */
static void reap(job *j) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int r = 0; r < j->n; r++) {
            if (j->ps[r].pid != pid || !j->ps[r].running)
                continue;
            j->ps[r].running = 0;
            j->ps[r].status = status;
            j->running--;
            int code = exit_code(status);
            if (code == 0 || j->stopping)
                continue;
            if (WIFSIGNALED(status))
                fprintf(stderr, "tprun: rank %d was killed by signal %d; stopping the others\n", r,
                        WTERMSIG(status));
            else
                fprintf(stderr, "tprun: rank %d exited with status %d; stopping the others\n", r,
                        code);
            begin_stop(j, SIGTERM, code);
        }
    }
}

/* Polls the output pipes for up to 100 ms and copies what came, prefixed.
 * 1 while a pipe is open, 0 when all are closed. */
static int pump(job *j, struct pollfd *pfds, stream **owner, int *owner_rank) {
    int nfds = 0;
    pfds[nfds++] = (struct pollfd){sig_pipe[0], POLLIN, 0};
    for (int r = 0; r < j->n; r++)
        for (int k = 0; k < 2; k++)
            if (j->ps[r].s[k].fd >= 0) {
                owner[nfds] = &j->ps[r].s[k];
                owner_rank[nfds] = r;
                pfds[nfds++] = (struct pollfd){j->ps[r].s[k].fd, POLLIN, 0};
            }
    if (poll(pfds, (nfds_t)nfds, 100) > 0) {
        char junk[64];
        if (pfds[0].revents)
            while (read(sig_pipe[0], junk, sizeof junk) > 0) {
            }
        for (int k = 1; k < nfds; k++)
            if (pfds[k].revents)
                stream_read(owner_rank[k], owner[k]);
    }
    return nfds > 1;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    char port_buf[16];
    if (!o.port) {
        if (free_port(o.addr, port_buf, sizeof port_buf) != 0)
            return 1;
        o.port = port_buf;
    }
    if (install_signals() != 0 || job_secret() != 0)
        return 1;
    job j = {.n = o.nproc, .kill_at = UINT64_MAX, .grace_s = o.grace_s};
    j.ps = calloc((size_t)j.n, sizeof *j.ps);
    struct pollfd *pfds = calloc((size_t)(2 * j.n + 1), sizeof *pfds);
    stream **owner = calloc((size_t)(2 * j.n + 1), sizeof *owner);
    int *owner_rank = calloc((size_t)(2 * j.n + 1), sizeof *owner_rank);
    if (!j.ps || !pfds || !owner || !owner_rank) {
        fprintf(stderr, "tprun: out of memory\n");
        return 1;
    }
    for (int r = 0; r < j.n && !j.stopping; r++) {
        if (spawn(r, j.n, o.addr, o.port, o.program, &j.ps[r]) < 0) {
            fprintf(stderr, "tprun: cannot start rank %d: %s\n", r, strerror(errno));
            begin_stop(&j, SIGTERM, 1);
        } else {
            j.running++;
        }
    }
    uint64_t drain_until = UINT64_MAX;
    for (;;) {
        if (got_signal && !j.stopping) {
            fprintf(stderr, "tprun: got signal %d; stopping every rank\n", (int)got_signal);
            begin_stop(&j, got_signal, 128 + got_signal);
        }
        reap(&j);
        if (j.kill_at != UINT64_MAX && now_ns() >= j.kill_at) {
            signal_all(j.ps, j.n, SIGKILL);
            j.kill_at = UINT64_MAX;
        }
        int open = pump(&j, pfds, owner, owner_rank);
        if (j.running == 0) {
            /* Output the processes' own children may still write, for a moment. */
            if (drain_until == UINT64_MAX)
                drain_until = now_ns() + 1000000000ull;
            if (!open || now_ns() >= drain_until)
                break;
        }
    }
    for (int r = 0; r < j.n; r++)
        for (int k = 0; k < 2; k++)
            if (j.ps[r].s[k].fd >= 0) {
                if (j.ps[r].s[k].len)
                    emit_line(r, j.ps[r].s[k].out_fd, j.ps[r].s[k].buf, j.ps[r].s[k].len);
                close(j.ps[r].s[k].fd);
            }
    free(j.ps);
    free(pfds);
    free(owner);
    free(owner_rank);
    return j.result;
}
