/*
 * tprun.c: starts this machine's processes of a job (spec/tcp.md TCP-13,
 * spec/launch.md LAUNCH-1..9).
 *
 *   tprun --nproc-per-node P [--nnodes N --node-rank K] [--master-addr A]
 *         [--master-port PORT | --rdzv-endpoint HOST:PORT] [--secret-file PATH]
 *         [--max-restarts R [--restart-rank0]] [--grace S] [--no-prefix]
 *         PROGRAM [ARGS...]
 *
 * Each process gets RANK (K*P + its local rank), LOCAL_RANK, WORLD_SIZE
 * (N*P), LOCAL_WORLD_SIZE (P), GROUP_RANK (K), GROUP_WORLD_SIZE (N),
 * MASTER_ADDR and MASTER_PORT (one machine: a free port of A when none is
 * given), TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS: the
 * environment init_method env:// reads, with torchrun's names. Every line a
 * process writes to stdout or stderr comes out on tprun's stdout or stderr
 * prefixed with "[rank] ". When a process fails (non-zero exit or a signal)
 * it is restarted in place with TP_REJOIN=1, at most R times per rank
 * (LAUNCH-6); past that, or when R is 0, the others get SIGTERM, then SIGKILL
 * after the grace period (default 5 s), and tprun exits with the failure's
 * status (128 + signal for a signal). SIGINT and SIGTERM sent to tprun are
 * forwarded the same way. The job secret (TCP-17) comes from --secret-file,
 * else TP_SECRET, else (one machine only) a fresh one from the kernel's
 * generator; it never appears on a command line or in output (LAUNCH-5).
 */
#include <ctype.h>
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "free_port.h"

#include <arpa/inet.h>
#include <netdb.h>

#define NPROC_MAX 1024       /* processes on one machine: a bound, not a tuning knob */
#define WORLD_SIZE_MAX 65536 /* nnodes * nproc: TP_WORLD_SIZE_MAX, the library's bound */
#define RESTARTS_MAX 10000   /* --max-restarts: a crash loop ends within a bounded time */
#define LINE_MAX_BYTES 16384 /* a longer line is split */
#define GRACE_DEFAULT_S 5.0
#define HOST_LEN_MAX 256 /* --master-addr, the host of --rdzv-endpoint */
/* TCP-17: the secret is 16..128 bytes as hex (TPI_TCP_SECRET_MIN/MAX in tcp_internal.h). */
#define SECRET_HEX_MIN 32
#define SECRET_HEX_MAX 256
#define SECRET_FILE_MAX 4096 /* a secret file is read up to this many bytes */

typedef struct stream {
    int fd;     /* -1 once closed */
    int out_fd; /* 1 or 2 */
    int rank;   /* the prefix: the global rank of the process that writes it */
    size_t len;
    char buf[LINE_MAX_BYTES];
} stream;

typedef struct proc {
    pid_t pid;
    int running;
    int restarts; /* times this local rank was restarted (TORCHELASTIC_RESTART_COUNT) */
} proc;

typedef struct options {
    int nproc;  /* per node */
    int nnodes; /* 1 unless --nnodes */
    int node_rank;
    char addr[HOST_LEN_MAX];
    int addr_given;
    long port; /* 0: not given */
    int master_given, endpoint_given;
    const char *secret_file;
    int max_restarts;
    int restart_rank0;
    double grace_s;
    char **program; /* argv of PROGRAM, NULL-terminated */
} options;

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

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: tprun --nproc-per-node P [--nnodes N --node-rank K] [--master-addr ADDR]\n"
            "             [--master-port PORT | --rdzv-endpoint HOST:PORT] [--secret-file PATH]\n"
            "             [--max-restarts R [--restart-rank0]] [--grace SECONDS] [--no-prefix]\n"
            "             PROGRAM [ARGS...]\n"
            "Starts P processes of PROGRAM (node K of N; --nproc is --nproc-per-node) with RANK,\n"
            "WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, prefixes their output lines with\n"
            "\"[rank] \" (unless --no-prefix), restarts a failed one up to R times with\n"
            "TP_REJOIN=1, and otherwise stops them all when one fails (spec/launch.md).\n");
}

/* --- the job secret (LAUNCH-5) --- */

static int is_hex_secret(const char *s, size_t n) {
    if (n % 2 || n < SECRET_HEX_MIN || n > SECRET_HEX_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i]))
            return 0;
    return 1;
}

/* Opens path for reading if it is a regular file of ours that nobody else
 * may read or write; else -1 and why on stderr. One descriptor, checked with
 * fstat: what is checked is what is read. */
static int secret_file_open(const char *path) {
    /* O_NONBLOCK: a FIFO planted there must not hang the open. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        fprintf(stderr, "tprun: --secret-file %s: %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    const char *why = NULL;
    if (!S_ISREG(st.st_mode))
        why = "it is not a regular file";
    else if (st.st_uid != geteuid())
        why = "it is not owned by you";
    if (why) {
        fprintf(stderr, "tprun: --secret-file %s: %s; refusing to use it as the job secret\n", path,
                why);
        close(fd);
        return -1;
    }
    if (st.st_mode & 077) {
        fprintf(stderr,
                "tprun: --secret-file %s has mode %04o: a job secret must be readable by you "
                "alone (mode 0600 or stricter: chmod 600 %s); refusing to use it\n",
                path, (unsigned)(st.st_mode & 07777), path);
        close(fd);
        return -1;
    }
    return fd;
}

/* Reads the hex secret of --secret-file into TP_SECRET. Never prints it. */
static int secret_from_file(const char *path) {
    int fd = secret_file_open(path);
    if (fd < 0)
        return -1;
    char buf[SECRET_FILE_MAX + 1];
    size_t n = 0;
    while (n < sizeof buf - 1) {
        ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    close(fd);
    buf[n] = '\0';
    char *s = buf;
    while (*s && isspace((unsigned char)*s))
        s++;
    size_t len = strlen(s);
    while (len > 0 && isspace((unsigned char)s[len - 1]))
        s[--len] = '\0';
    int ok = is_hex_secret(s, len) && setenv("TP_SECRET", s, 1) == 0;
    if (!ok)
        fprintf(stderr,
                "tprun: --secret-file %s does not hold a job secret: it must be %d to %d hex "
                "digits, an even number, on one line (%zu characters found; TCP-17)\n",
                path, SECRET_HEX_MIN, SECRET_HEX_MAX, len);
    /* explicit_bzero, here and in secret_fresh: a memset of a buffer never
     * read again is a dead store the compiler may drop. */
    explicit_bzero(buf, sizeof buf);
    return ok ? 0 : -1;
}

/* A fresh secret from the kernel's generator, as 64 hex digits in TP_SECRET. */
static int secret_fresh(void) {
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
    explicit_bzero(b, sizeof b);
    int rc = setenv("TP_SECRET", hex, 1);
    explicit_bzero(hex, sizeof hex);
    return rc;
}

/* LAUNCH-5: --secret-file, else TP_SECRET, else a fresh one (one node only).
 * 0, or the exit status: 2 for a refusal. */
static int job_secret(const options *o) {
    if (o->secret_file)
        return secret_from_file(o->secret_file) == 0 ? 0 : 2;
    const char *env = getenv("TP_SECRET");
    if (env && *env)
        return 0;
    if (o->nnodes > 1) {
        fprintf(stderr,
                "tprun: --nnodes %d needs the job secret, the same on every node: give "
                "--secret-file PATH (a file of yours, mode 0600, holding the secret as hex) or "
                "set TP_SECRET; a secret made here would differ from the other nodes' "
                "(spec/launch.md LAUNCH-5)\n",
                o->nnodes);
        return 2;
    }
    return secret_fresh() == 0 ? 0 : 1;
}

/* --- output --- */

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
static void stream_read(stream *s) {
    ssize_t k = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (k < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (k <= 0) {
        if (s->len)
            emit_line(s->rank, s->out_fd, s->buf, s->len);
        s->len = 0;
        close(s->fd);
        s->fd = -1;
        return;
    }
    s->len += (size_t)k;
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] == '\n') {
            emit_line(s->rank, s->out_fd, s->buf + start, i - start);
            start = i + 1;
        }
    }
    if (start == 0 && s->len == sizeof s->buf) {
        emit_line(s->rank, s->out_fd, s->buf, s->len); /* a line longer than the buffer */
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

/* --- the command line --- */

/* A free port of addr for the store (free_port.h says why it is drawn). */
static int free_port(const char *addr, long *out) {
    char err[256];
    unsigned port;
    if (tpi_free_port(addr, &port, err, sizeof err) != 0) {
        fprintf(stderr, "tprun: --master-addr: %s\n", err);
        return -1;
    }
    *out = (long)port;
    return 0;
}

static int parse_int(const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !end || *end || end == s || v < lo || v > hi || !isdigit((unsigned char)*s))
        return -1;
    *out = v;
    return 0;
}

/* --nnodes N or MIN:MAX with MIN == MAX (LAUNCH-2). 0 or -1 (message given). */
static int parse_nnodes(const char *v, int *out) {
    const char *colon = strchr(v, ':');
    char lo_s[32];
    long lo, hi;
    size_t n = colon ? (size_t)(colon - v) : strlen(v);
    if (n >= sizeof lo_s)
        n = sizeof lo_s - 1;
    memcpy(lo_s, v, n);
    lo_s[n] = '\0';
    if (parse_int(lo_s, 1, WORLD_SIZE_MAX, &lo) != 0 ||
        parse_int(colon ? colon + 1 : lo_s, 1, WORLD_SIZE_MAX, &hi) != 0) {
        fprintf(stderr, "tprun: bad option --nnodes '%s': expected N or MIN:MAX (1..%d)\n", v,
                WORLD_SIZE_MAX);
        return -1;
    }
    if (lo != hi) {
        fprintf(stderr,
                "tprun: --nnodes %s: elastic membership (MIN < MAX) is not supported: give one "
                "number of nodes, the same on every node (spec/launch.md LAUNCH-2)\n",
                v);
        return -1;
    }
    *out = (int)lo;
    return 0;
}

/* --rdzv-endpoint HOST[:PORT], [V6]:PORT or a bare IPv6 address; port 0 is none. */
static int parse_endpoint(const char *v, options *o) {
    const char *host = v, *port = NULL;
    size_t host_len = strlen(v);
    if (v[0] == '[') {
        const char *close = strchr(v, ']');
        if (!close || (close[1] && close[1] != ':'))
            return -1;
        host = v + 1;
        host_len = (size_t)(close - host);
        port = close[1] ? close + 2 : NULL;
    } else if (strchr(v, ':') && strchr(v, ':') == strrchr(v, ':')) {
        port = strchr(v, ':') + 1;
        host_len = (size_t)(port - 1 - v);
    }
    if (host_len == 0 || host_len >= sizeof o->addr)
        return -1;
    if (port && parse_int(port, 0, 65535, &o->port) != 0)
        return -1;
    memcpy(o->addr, host, host_len);
    o->addr[host_len] = '\0';
    o->addr_given = 1;
    return 0;
}

/* One option with its value; 0, or -1 for a bad value (message given). */
static int parse_value(const char *name, const char *v, options *o) {
    long x;
    char *end = NULL;
    if (strcmp(name, "nproc") == 0 || strcmp(name, "nproc-per-node") == 0) {
        if (parse_int(v, 1, NPROC_MAX, &x) != 0)
            goto bad;
        o->nproc = (int)x;
    } else if (strcmp(name, "nnodes") == 0) {
        return parse_nnodes(v, &o->nnodes);
    } else if (strcmp(name, "node-rank") == 0) {
        if (parse_int(v, 0, WORLD_SIZE_MAX - 1, &x) != 0)
            goto bad;
        o->node_rank = (int)x;
    } else if (strcmp(name, "master-addr") == 0) {
        if (!*v || strlen(v) >= sizeof o->addr)
            goto bad;
        snprintf(o->addr, sizeof o->addr, "%s", v);
        o->addr_given = o->master_given = 1;
    } else if (strcmp(name, "master-port") == 0) {
        if (parse_int(v, 1, 65535, &o->port) != 0)
            goto bad;
        o->master_given = 1;
    } else if (strcmp(name, "rdzv-endpoint") == 0) {
        if (parse_endpoint(v, o) != 0)
            goto bad;
        o->endpoint_given = 1;
    } else if (strcmp(name, "secret-file") == 0) {
        if (!*v)
            goto bad;
        o->secret_file = v;
    } else if (strcmp(name, "max-restarts") == 0) {
        if (parse_int(v, 0, RESTARTS_MAX, &x) != 0)
            goto bad;
        o->max_restarts = (int)x;
    } else if (strcmp(name, "grace") == 0) {
        o->grace_s = strtod(v, &end);
        if (!end || *end || end == v || !(o->grace_s >= 0 && o->grace_s <= 3600))
            goto bad;
    } else {
        fprintf(stderr, "tprun: unknown option --%s\n", name);
        return -1;
    }
    return 0;
bad:
    fprintf(stderr,
            "tprun: bad option --%s '%s' (--nproc-per-node 1..%d, --node-rank 0..N-1, "
            "--master-port 1..65535, --rdzv-endpoint HOST:PORT, --max-restarts 0..%d, "
            "--grace 0..3600 s)\n",
            name, v, NPROC_MAX, RESTARTS_MAX);
    return -1;
}

/* Checks the options together (LAUNCH-2, LAUNCH-3); 0 or -1 (message given). */
static int check_options(const options *o) {
    if (o->nproc == 0) {
        fprintf(stderr, "tprun: --nproc-per-node (or --nproc) is required\n");
        return -1;
    }
    if (o->node_rank >= o->nnodes) {
        fprintf(stderr, "tprun: --node-rank %d is out of range for --nnodes %d (0..%d)\n",
                o->node_rank, o->nnodes, o->nnodes - 1);
        return -1;
    }
    if ((long)o->nnodes * o->nproc > WORLD_SIZE_MAX) {
        fprintf(stderr, "tprun: --nnodes %d x --nproc-per-node %d is over %d processes\n",
                o->nnodes, o->nproc, WORLD_SIZE_MAX);
        return -1;
    }
    if (o->endpoint_given && o->master_given) {
        fprintf(stderr, "tprun: give --rdzv-endpoint or --master-addr/--master-port, not both\n");
        return -1;
    }
    if (o->nnodes > 1 && (!o->addr_given || o->port == 0)) {
        fprintf(stderr,
                "tprun: --nnodes %d needs %s: every node must reach the rendezvous rank 0 "
                "serves there, and a free port picked here would be unknown to the other "
                "nodes (spec/launch.md LAUNCH-3)\n",
                o->nnodes,
                !o->addr_given ? "--master-addr (or --rdzv-endpoint HOST:PORT)"
                               : "--master-port (or --rdzv-endpoint HOST:PORT)");
        return -1;
    }
    return 0;
}

/* "--x_y=v" -> name "x-y", value "v". 1 when a value came with '='. */
static int option_name(const char *arg, char *name, size_t len, const char **value) {
    size_t i = 0;
    const char *p = arg + 2;
    for (; *p && *p != '=' && i + 1 < len; p++)
        name[i++] = *p == '_' ? '-' : *p;
    name[i] = '\0';
    *value = *p == '=' ? p + 1 : NULL;
    return *value != NULL;
}

/* Parses the command line: 0 to run, -1 after --help, else the exit status (usage: 2). */
static int parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->nnodes = 1;
    snprintf(o->addr, sizeof o->addr, "127.0.0.1");
    o->grace_s = GRACE_DEFAULT_S;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i], *v = NULL;
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return -1;
        }
        char name[64];
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "tprun: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        int has_value = option_name(a, name, sizeof name, &v);
        if (!has_value && strcmp(name, "no-prefix") == 0) {
            prefix_lines = 0;
            continue;
        }
        if (!has_value && strcmp(name, "restart-rank0") == 0) {
            o->restart_rank0 = 1;
            continue;
        }
        if (!has_value && i + 1 >= argc) {
            fprintf(stderr, "tprun: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        if (!has_value)
            v = argv[++i];
        if (parse_value(name, v, o) != 0) {
            usage(stderr);
            return 2;
        }
    }
    if (check_options(o) != 0 || i >= argc) {
        if (i >= argc)
            fprintf(stderr, "tprun: no PROGRAM given\n");
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

/* --- the running job --- */

/* This machine's processes, their output and how the job ends. */
typedef struct job {
    const options *o;
    proc *ps; /* index: local rank */
    int n;
    int running;
    int stopping;
    int result;
    uint64_t kill_at; /* SIGKILL the rest then; UINT64_MAX: not scheduled */
    /* Open output pipes: a restarted process's earlier ones stay until their
     * end of file, so nothing it wrote is lost. */
    stream **streams;
    int nstreams, cap;
    struct pollfd *pfds; /* cap + 1: the signal pipe first */
} job;

static int global_rank(const job *j, int local) {
    return j->o->node_rank * j->o->nproc + local;
}

/* Room for two more streams; 0 or -1 (out of memory). */
static int streams_reserve(job *j) {
    if (j->nstreams + 2 <= j->cap)
        return 0;
    int cap = j->cap ? 2 * j->cap : 2 * j->n + 4;
    stream **s = realloc(j->streams, (size_t)cap * sizeof *s);
    if (!s)
        return -1;
    j->streams = s;
    struct pollfd *p = realloc(j->pfds, (size_t)(cap + 1) * sizeof *p);
    if (!p)
        return -1;
    j->pfds = p;
    j->cap = cap;
    return 0;
}

static void set_env_int(const char *name, long v) {
    char s[32];
    snprintf(s, sizeof s, "%ld", v);
    setenv(name, s, 1);
}

/* In the child: LAUNCH-4's environment, then PROGRAM. Never returns. When
 * the exec fails, its errno goes to exec_err (close-on-exec, so tprun reads
 * end of file when the exec succeeds) and the child exits 127. */
static void exec_worker(const job *j, int local, int restarts, int exec_err) {
    const options *o = j->o;
    set_env_int("RANK", global_rank(j, local));
    set_env_int("LOCAL_RANK", local);
    set_env_int("WORLD_SIZE", (long)o->nnodes * o->nproc);
    set_env_int("LOCAL_WORLD_SIZE", o->nproc);
    set_env_int("GROUP_RANK", o->node_rank);
    set_env_int("GROUP_WORLD_SIZE", o->nnodes);
    setenv("MASTER_ADDR", o->addr, 1);
    set_env_int("MASTER_PORT", o->port);
    set_env_int("TORCHELASTIC_RESTART_COUNT", restarts);
    set_env_int("TORCHELASTIC_MAX_RESTARTS", o->max_restarts);
    /* REJOIN-1: a restarted process comes back as a new incarnation; a first
     * one joins the initial rendezvous whatever tprun's environment says. */
    if (restarts > 0)
        setenv("TP_REJOIN", "1", 1);
    else
        unsetenv("TP_REJOIN");
    execvp(o->program[0], o->program);
    int e = errno;
    if (write(exec_err, &e, sizeof e) != (ssize_t)sizeof e)
        fprintf(stderr, "tprun: cannot run '%s': %s\n", o->program[0], strerror(e));
    _exit(127);
}

static stream *stream_new(int fd, int out_fd, int rank) {
    stream *s = malloc(sizeof *s);
    if (s) {
        s->fd = fd;
        s->out_fd = out_fd;
        s->rank = rank;
        s->len = 0;
        fcntl(fd, F_SETFL, O_NONBLOCK);
    }
    return s;
}

static void close_pipe(int p[2]) {
    close(p[0]);
    close(p[1]);
}

/* Starts local rank `local` (its restarts-th restart); 0, SPAWN_EXEC_FAILED
 * when PROGRAM could not be executed, or -1 (no pipe, fork or memory), each
 * failure with errno. The exec's failure is known here, before spawn returns,
 * so a restart that cannot run is the launcher's to report, not a new
 * failure of the rank (LAUNCH-6). */
#define SPAWN_EXEC_FAILED (-2)
static int spawn(job *j, int local, int restarts) {
    int out[2], err[2], ex[2];
    if (streams_reserve(j) != 0) {
        errno = ENOMEM;
        return -1;
    }
    if (pipe(out) < 0)
        return -1;
    if (pipe(err) < 0) {
        close_pipe(out);
        return -1;
    }
    if (pipe(ex) < 0) {
        int saved = errno;
        close_pipe(out);
        close_pipe(err);
        errno = saved;
        return -1;
    }
    for (int k = 0; k < 2; k++) { /* tprun is single-threaded: no exec in between */
        fcntl(out[k], F_SETFD, FD_CLOEXEC);
        fcntl(err[k], F_SETFD, FD_CLOEXEC);
        fcntl(ex[k], F_SETFD, FD_CLOEXEC);
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGCHLD, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        dup2(out[1], 1);
        dup2(err[1], 2);
        /* The pipes are close-on-exec but for 1 and 2 (dup2 clears it, and
         * when a pipe already was 1 or 2 this does). */
        fcntl(1, F_SETFD, 0);
        fcntl(2, F_SETFD, 0);
        exec_worker(j, local, restarts, ex[1]);
    }
    int saved = errno;
    close(out[1]);
    close(err[1]);
    close(ex[1]);
    if (pid > 0) {
        /* End of file: the exec succeeded (or the child died before it, a
         * failure reap will see); an errno: it failed, and the child exits. */
        int e = 0;
        ssize_t k;
        while ((k = read(ex[0], &e, sizeof e)) < 0 && errno == EINTR) {
        }
        if (k == (ssize_t)sizeof e) {
            while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
            }
            close(ex[0]);
            close(out[0]);
            close(err[0]);
            errno = e;
            return SPAWN_EXEC_FAILED;
        }
    }
    close(ex[0]);
    int rank = global_rank(j, local);
    stream *so = pid > 0 ? stream_new(out[0], 1, rank) : NULL;
    stream *se = pid > 0 ? stream_new(err[0], 2, rank) : NULL;
    if (!so || !se) {
        /* No fork, or no memory to carry its output: a process we cannot serve. */
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            saved = ENOMEM;
        }
        free(so);
        free(se);
        close(out[0]);
        close(err[0]);
        errno = saved;
        return -1;
    }
    j->streams[j->nstreams++] = so;
    j->streams[j->nstreams++] = se;
    j->ps[local] = (proc){.pid = pid, .running = 1, .restarts = restarts};
    j->running++;
    return 0;
}

/* The exit status tprun reports for a wait status. */
static int exit_code(int status) {
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return 1;
}

static void describe(int status, char *out, size_t len) {
    if (WIFSIGNALED(status))
        snprintf(out, len, "was killed by signal %d", WTERMSIG(status));
    else
        snprintf(out, len, "exited with status %d", exit_code(status));
}

static void signal_all(job *j, int sig) {
    for (int i = 0; i < j->n; i++)
        if (j->ps[i].running)
            kill(j->ps[i].pid, sig);
}

/* Sends sig to every running process and schedules SIGKILL after the grace. */
static void begin_stop(job *j, int sig, int result) {
    if (j->stopping)
        return;
    j->stopping = 1;
    j->result = result;
    signal_all(j, sig);
    j->kill_at = now_ns() + (uint64_t)(j->o->grace_s * 1e9);
}

/* LAUNCH-6, LAUNCH-7: a process failed while the job runs: restart it in
 * place, or stop the job with its status. */
static void on_failure(job *j, int local, int status) {
    const options *o = j->o;
    int rank = global_rank(j, local), restarts = j->ps[local].restarts;
    char cause[64];
    describe(status, cause, sizeof cause);
    if (o->max_restarts > 0 && rank == 0 && !o->restart_rank0) {
        fprintf(stderr,
                "tprun: rank 0 %s; not restarting it: with init_method env:// rank 0 serves the "
                "job's rendezvous store, which ended with it, so a new rank 0 would have no job "
                "to rejoin (--restart-rank0 if the store lives elsewhere; spec/launch.md "
                "LAUNCH-7); stopping the others\n",
                cause);
    } else if (restarts < o->max_restarts) {
        fprintf(stderr,
                "tprun: rank %d %s; restarting it as a new incarnation (TP_REJOIN=1), restart "
                "%d of %d\n",
                rank, cause, restarts + 1, o->max_restarts);
        if (spawn(j, local, restarts + 1) == 0)
            return;
        /* Not restarted: the job ends with the rank's failure (LAUNCH-6). */
        fprintf(stderr, "tprun: rank %d %s; cannot restart it: %s; stopping the others\n", rank,
                cause, strerror(errno));
    } else if (o->max_restarts > 0) {
        fprintf(stderr,
                "tprun: rank %d %s after %d restart%s (--max-restarts %d); stopping the others\n",
                rank, cause, restarts, restarts == 1 ? "" : "s", o->max_restarts);
    } else {
        fprintf(stderr, "tprun: rank %d %s; stopping the others\n", rank, cause);
    }
    begin_stop(j, SIGTERM, exit_code(status));
}

/* Collects exited processes; a failure restarts its process or stops the others. */
static void reap(job *j) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int r = 0; r < j->n; r++) {
            if (j->ps[r].pid != pid || !j->ps[r].running)
                continue;
            j->ps[r].running = 0;
            j->running--;
            if (exit_code(status) != 0 && !j->stopping)
                on_failure(j, r, status);
        }
    }
}

/* Polls the output pipes for up to 100 ms and copies what came, prefixed;
 * drops the pipes that ended. 1 while a pipe is open, 0 when all are closed. */
static int pump(job *j) {
    j->pfds[0] = (struct pollfd){sig_pipe[0], POLLIN, 0};
    for (int k = 0; k < j->nstreams; k++)
        j->pfds[k + 1] = (struct pollfd){j->streams[k]->fd, POLLIN, 0};
    if (poll(j->pfds, (nfds_t)j->nstreams + 1, 100) > 0) {
        char junk[64];
        if (j->pfds[0].revents)
            while (read(sig_pipe[0], junk, sizeof junk) > 0) {
            }
        for (int k = 0; k < j->nstreams; k++)
            if (j->pfds[k + 1].revents)
                stream_read(j->streams[k]);
    }
    int kept = 0;
    for (int k = 0; k < j->nstreams; k++) {
        if (j->streams[k]->fd >= 0)
            j->streams[kept++] = j->streams[k];
        else
            free(j->streams[k]);
    }
    j->nstreams = kept;
    return kept > 0;
}

static void run(job *j) {
    uint64_t drain_until = UINT64_MAX;
    for (;;) {
        if (got_signal && !j->stopping) {
            fprintf(stderr, "tprun: got signal %d; stopping every rank\n", (int)got_signal);
            begin_stop(j, got_signal, 128 + got_signal);
        }
        reap(j);
        if (j->kill_at != UINT64_MAX && now_ns() >= j->kill_at) {
            signal_all(j, SIGKILL);
            j->kill_at = UINT64_MAX;
        }
        int open = pump(j);
        if (j->running == 0) {
            /* Output the processes' own children may still write, for a moment. */
            if (drain_until == UINT64_MAX)
                drain_until = now_ns() + 1000000000ull;
            if (!open || now_ns() >= drain_until)
                break;
        }
    }
    for (int k = 0; k < j->nstreams; k++) {
        stream *s = j->streams[k];
        if (s->len)
            emit_line(s->rank, s->out_fd, s->buf, s->len);
        close(s->fd);
        free(s);
    }
    j->nstreams = 0;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if ((rc = job_secret(&o)) != 0)
        return rc;
    if (o.port == 0 && free_port(o.addr, &o.port) != 0)
        return 1;
    if (install_signals() != 0)
        return 1;
    job j = {.o = &o, .n = o.nproc, .kill_at = UINT64_MAX};
    j.ps = calloc((size_t)j.n, sizeof *j.ps);
    if (!j.ps || streams_reserve(&j) != 0) {
        fprintf(stderr, "tprun: out of memory\n");
        return 1;
    }
    for (int r = 0; r < j.n && !j.stopping; r++) {
        int st = spawn(&j, r, 0);
        if (st == SPAWN_EXEC_FAILED) {
            /* The shell's statuses: 127 not found, 126 found but not runnable. */
            int e = errno;
            fprintf(stderr, "tprun: cannot run '%s': %s\n", o.program[0], strerror(e));
            begin_stop(&j, SIGTERM, e == ENOENT || e == ENOTDIR ? 127 : 126);
        } else if (st != 0) {
            fprintf(stderr, "tprun: cannot start rank %d: %s\n", global_rank(&j, r),
                    strerror(errno));
            begin_stop(&j, SIGTERM, 1);
        }
    }
    run(&j);
    free(j.ps);
    free(j.streams);
    free(j.pfds);
    return j.result;
}
