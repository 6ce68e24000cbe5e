/*
 * net_fuzz.c: the network-level fuzzer (`make fuzz-net`, fuzz/README.md;
 * issue 8). A live job of three workers (tests/tcp/tcp_harness.c); worker 1
 * and the job's store (served by worker 0) take mutated byte streams, each
 * over a fresh connection, in four modes:
 *  - worker-pre:  bytes from the first one (hellos, records: TCP-3, TCP-17);
 *  - worker-post: after a proved handshake as worker 2 (the driver set
 *                 TP_SECRET, so it knows the job's key): frames and records
 *                 (WIRE-1, TCP-4, TCP-5, TCP-19), decoded by worker 1's core;
 *  - store-pre:   a store client's handshake (TCP-10, TCP-17);
 *  - store-post:  requests after a proved store handshake (TCP-10, TCP-18).
 * Seeds are valid streams: built here with the library's encoders, and the
 * corpora fuzz_tcp_records, fuzz_msg_decode and fuzz_store_request (store
 * keys "g0/..." become "fz/...", so the job's own keys stay its own).
 * Mutations: bit flips, interesting bytes, length fields set to edge
 * values, truncation, splices with another seed, repeats, inserted and
 * deleted chunks; a quarter of the streams go in small chunks with short
 * pauses. Each stream ends with our FIN; the other end must then close.
 *
 * Throughout, worker 0 calls worker 1 every 5 ms and checks each answer.
 * Every --check-every streams (and every second) the driver checks that
 * every child lives, that worker 0's calls progress and were all right,
 * and that the children's stderr (redirected to FINDINGS/workers.log) holds
 * no sanitizer or assertion report; at the end the children shut down and
 * exit, so LeakSanitizer checks them, and their log is checked again. A
 * failure saves the last 32 streams under FINDINGS/<time>-seed<S>/ (with
 * how each was sent) and exits 1; the same --seed replays the same streams.
 *
 * Usage: net_fuzz [--seconds S] [--seed N] [--corpus DIR] [--findings DIR]
 *                 [--check-every N]
 * --seconds defaults to FUZZ_SECONDS or 60. Meant for the sanitizer build
 * (scripts/fuzz-net.sh); the plain build runs it 5 s as a smoke test.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "real/tcp_internal.h"
#include "tcp_harness.h"
#include "tcp_raw.h"

#define WORLD 3
#define CALLER 0
#define TARGET 1
#define STREAM_MAX (64 * 1024)
#define SEEDS_MAX 256
#define RING 32                 /* the last streams, saved with a failure */
#define CLOSE_WAIT_MS 5000      /* after our FIN, the other end must close by then */
#define STALL_NS 15000000000ull /* worker 0's calls must progress within this */

enum { F_DONE = 0, C_READY = 0, C_CALLS = 1, C_BAD = 2, C_WARN = 3, C_SHUTDOWN_FAILED = 4 };

typedef enum mode { M_WORKER_PRE, M_WORKER_POST, M_STORE_PRE, M_STORE_POST, M_COUNT } mode;
static const char *const mode_name[M_COUNT] = {"worker-pre", "worker-post", "store-pre",
                                               "store-post"};

/* ---- The workers -------------------------------------------------------------------- */

static tt_shared *child_sh;
static int child_rank;

/* Counts warnings (every refused stream is one); prints errors. */
static void count_log(tp_log_level level, const char *msg, void *user) {
    (void)user;
    if (level <= TP_LOG_WARN)
        atomic_fetch_add(&child_sh->count[C_WARN], 1);
    if (level == TP_LOG_ERROR || getenv("NET_FUZZ_LOG"))
        fprintf(stderr, "[worker %d] %s: %s\n", child_rank, tp_log_level_name(level), msg);
}

static int body_fuzz(tt_job *job, int rank) {
    tt_shared *sh = job->shared;
    child_sh = sh;
    child_rank = rank;
    tp_set_log_callback(count_log, NULL);
    tp_options *o = tt_options(job, 20, 10);
    TT_CHECK(o && tt_init(job, rank, o) == 0);
    tp_options_free(o);
    for (int r = 0; r < job->world; r++) {
        int64_t v = 0;
        TT_CHECK(tt_call_add(tp_to_rank(r), rank, r, 20, &v) == TP_OK && v == rank + r);
    }
    atomic_fetch_add(&sh->count[C_READY], 1);
    for (uint64_t i = 0; !atomic_load(&sh->flag[F_DONE]); i++) {
        if (rank != CALLER) {
            usleep(2000);
            continue;
        }
        int64_t a = (int64_t)(i * 7919), b = 1000000 + (int64_t)i, v = -1;
        tp_status st = tt_call_add(tp_to_rank(TARGET), a, b, 10, &v);
        if ((st != TP_OK || v != a + b) && atomic_fetch_add(&sh->count[C_BAD], 1) < 5)
            fprintf(stderr, "worker 0: call %llu to worker 1: %s (%s), %lld + %lld gave %lld\n",
                    (unsigned long long)i, tp_status_name(st), st ? tp_errmsg() : "", (long long)a,
                    (long long)b, (long long)v);
        atomic_fetch_add(&sh->count[C_CALLS], 1);
        usleep(5000);
    }
    /* The impostor may have left worker 1 with rrefs or calls of "worker 2"
     * that a graceful shutdown waits for in vain: counted, not fatal; the
     * worker is torn down either way and exit() runs the leak check. */
    tp_status st = tp_shutdown(1);
    if (st != TP_OK) {
        atomic_fetch_add(&sh->count[C_SHUTDOWN_FAILED], 1);
        fprintf(stderr, "[worker %d] graceful shutdown: %s: %s\n", rank, tp_status_name(st),
                tp_errmsg());
        if (tp_is_initialized())
            tp_shutdown(0);
    }
    return 0;
}

/* ---- Seeds ------------------------------------------------------------------------------ */

typedef struct seed {
    mode m;
    size_t len;
    uint8_t *bytes;
} seed;

typedef struct stream {
    uint64_t seq;
    mode m;
    int chunked;
    size_t len;
    uint8_t bytes[STREAM_MAX];
} stream;

typedef struct fuzz {
    uint64_t rng;
    seed seeds[SEEDS_MAX];
    int nseeds;
    char worker[128], store[64];
    tpi_tcp_auth auth;
    stream ring[RING];
    uint64_t seq;
    long streams[M_COUNT], conns, closed, slow_close, unclosed, handshake_failed;
    uint64_t bytes;
} fuzz;

static uint64_t rnd(fuzz *f) {
    f->rng ^= f->rng << 13;
    f->rng ^= f->rng >> 7;
    f->rng ^= f->rng << 17;
    return f->rng;
}

static void add_seed(fuzz *f, mode m, const void *p, size_t n) {
    if (f->nseeds == SEEDS_MAX || n == 0 || n > STREAM_MAX)
        return;
    uint8_t *b = malloc(n);
    if (!b)
        return;
    memcpy(b, p, n);
    f->seeds[f->nseeds++] = (seed){m, n, b};
}

/* Every file of dir as a seed of mode m; store keys "g0/" become "fz/". */
static int load_dir(fuzz *f, const char *dir, mode m) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "net_fuzz: cannot read the corpus %s: %s\n", dir, strerror(errno));
        return -1;
    }
    struct dirent *e;
    static uint8_t buf[STREAM_MAX];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *fp = fopen(path, "rb");
        if (!fp)
            continue;
        size_t n = fread(buf, 1, sizeof buf, fp);
        fclose(fp);
        for (size_t i = 0; m == M_STORE_POST && i + 3 <= n; i++)
            if (memcmp(buf + i, "g0/", 3) == 0)
                memcpy(buf + i, "fz/", 3);
        add_seed(f, m, buf, n);
    }
    closedir(d);
    return 0;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

/* Valid streams made with the library's encoders. */
static void builtin_seeds(fuzz *f) {
    uint8_t b[128], x[16] = {0};
    /* worker-pre: OPEN as worker 2 to worker 1, then its NONCE and a PROOF. */
    tpi_tcp_hello_encode(b, TPI_TCP_HELLO_OPEN, 2, TARGET, WORLD, TPI_TCP_HELLO_AUTH);
    add_seed(f, M_WORKER_PRE, b, 24);
    tpi_tcp_auth_encode(b + 24, TPI_TCP_AUTH_NONCE, x);
    add_seed(f, M_WORKER_PRE, b, 48);
    tpi_tcp_auth_encode(b + 48, TPI_TCP_AUTH_PROOF, x);
    add_seed(f, M_WORKER_PRE, b, 72);
    tpi_tcp_hello_encode(b, TPI_TCP_HELLO_OPEN, 0, TARGET, WORLD, 0); /* no auth */
    tpi_tcp_ctl_encode(b + 24, TPI_TCP_CTL_PING, 0);
    add_seed(f, M_WORKER_PRE, b, 48);
    /* worker-post: each record a dialer may send, and a pipelined pair. */
    static const tpi_tcp_ctl_kind kinds[] = {TPI_TCP_CTL_PING, TPI_TCP_CTL_BYE, TPI_TCP_CTL_ABORT,
                                             TPI_TCP_CTL_CLOSE};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        tpi_tcp_ctl_encode(b + 24 * i, kinds[i], 2);
        add_seed(f, M_WORKER_POST, b + 24 * i, 24);
    }
    add_seed(f, M_WORKER_POST, b, 48);
    /* store-pre: a client's hello (rank: none, and 0), then a proof. */
    memset(b, 0, sizeof b);
    memcpy(b, TPI_STORE_PROTO_MAGIC, 4);
    b[4] = TPI_STORE_PROTO_VERSION;
    b[5] = 1;
    put32(b + 8, UINT32_MAX);
    add_seed(f, M_STORE_PRE, b, TPI_STORE_HANDSHAKE_LEN);
    add_seed(f, M_STORE_PRE, b, TPI_STORE_HANDSHAKE_LEN + 16);
    put32(b + 8, 0);
    add_seed(f, M_STORE_PRE, b, TPI_STORE_HANDSHAKE_LEN);
}

/* ---- Mutation ------------------------------------------------------------------------- */

static const seed *pick_seed(fuzz *f, mode m) {
    int n = 0;
    for (int i = 0; i < f->nseeds; i++)
        n += f->seeds[i].m == m;
    if (n == 0)
        return NULL;
    int k = (int)(rnd(f) % (uint64_t)n);
    for (int i = 0; i < f->nseeds; i++)
        if (f->seeds[i].m == m && k-- == 0)
            return &f->seeds[i];
    return NULL;
}

/* A length field's offset: a frame's (8 past a "TPRC") or a store request's
 * (0, or past a whole request); else any 4 bytes. */
static size_t length_offset(fuzz *f, const stream *s) {
    if (s->len < 4)
        return 0;
    if (s->m == M_WORKER_POST) {
        size_t hits[16];
        int n = 0;
        for (size_t i = 0; i + 12 <= s->len && n < 16; i++)
            if (memcmp(s->bytes + i, "TPRC", 4) == 0)
                hits[n++] = i + 8;
        if (n > 0)
            return hits[rnd(f) % (uint64_t)n];
    }
    if (s->m == M_STORE_POST && rnd(f) % 2 == 0)
        return 0;
    return rnd(f) % (s->len - 3);
}

static uint32_t interesting32(fuzz *f, const stream *s) {
    const uint32_t v[] = {0,
                          1,
                          4,
                          8,
                          23,
                          24,
                          (uint32_t)s->len - 1,
                          (uint32_t)s->len,
                          (uint32_t)s->len + 1,
                          4096,
                          65536,
                          TPI_STORE_MSG_MAX,
                          TPI_STORE_MSG_MAX + 1,
                          (1u << 30),
                          (1u << 30) + (1u << 20) - 24,
                          (1u << 30) + (1u << 20) - 23,
                          0x7fffffffu,
                          0x80000000u,
                          0xffffffffu,
                          (uint32_t)rnd(f)};
    return v[rnd(f) % (sizeof v / sizeof v[0])];
}

static void mutate_once(fuzz *f, stream *s) {
    static const uint8_t bytes8[] = {0, 1, 2, 3, 7, 0x7f, 0x80, 0xfe, 0xff};
    size_t n = s->len, a, k;
    switch (rnd(f) % 10) {
    case 0: /* bit flips */
        for (int i = 0, m = 1 + (int)(rnd(f) % 4); n && i < m; i++)
            s->bytes[rnd(f) % n] ^= (uint8_t)(1u << (rnd(f) % 8));
        break;
    case 1: /* an interesting byte */
        if (n)
            s->bytes[rnd(f) % n] = bytes8[rnd(f) % sizeof bytes8];
        break;
    case 2:
    case 3: /* a length field */
        if (n >= 4)
            put32(s->bytes + length_offset(f, s), interesting32(f, s));
        break;
    case 4: /* truncated */
        s->len = n ? rnd(f) % n : 0;
        break;
    case 5: { /* another seed (of this mode) spliced in at a random point */
        const seed *o = pick_seed(f, s->m);
        if (!o)
            break;
        a = n ? rnd(f) % (n + 1) : 0;
        k = o->len - rnd(f) % o->len;
        if (a + k > STREAM_MAX)
            k = STREAM_MAX - a;
        memcpy(s->bytes + a, o->bytes + (o->len - k), k);
        s->len = a + k > n ? a + k : n;
        break;
    }
    case 6: /* random bytes inserted */
        k = 1 + rnd(f) % 32;
        if (n + k > STREAM_MAX)
            break;
        a = rnd(f) % (n + 1);
        memmove(s->bytes + a + k, s->bytes + a, n - a);
        for (size_t i = 0; i < k; i++)
            s->bytes[a + i] = (uint8_t)rnd(f);
        s->len = n + k;
        break;
    case 7: /* a chunk deleted */
        if (n < 2)
            break;
        a = rnd(f) % n;
        k = 1 + rnd(f) % (n - a);
        memmove(s->bytes + a, s->bytes + a + k, n - a - k);
        s->len = n - k;
        break;
    case 8: /* a chunk duplicated in place */
        if (n == 0)
            break;
        a = rnd(f) % n;
        k = 1 + rnd(f) % (n - a);
        if (n + k > STREAM_MAX)
            break;
        memmove(s->bytes + a + k, s->bytes + a, n - a);
        s->len = n + k;
        break;
    default: /* the whole stream again: pipelined */
        for (int i = 0, m = 1 + (int)(rnd(f) % 3); i < m && s->len + n <= STREAM_MAX; i++) {
            memcpy(s->bytes + s->len, s->bytes, n);
            s->len += n;
        }
        break;
    }
}

static void make_stream(fuzz *f, stream *s) {
    s->seq = f->seq++;
    s->m = (mode)(rnd(f) % M_COUNT);
    const seed *sd = pick_seed(f, s->m);
    s->len = sd ? sd->len : 0;
    if (sd)
        memcpy(s->bytes, sd->bytes, sd->len);
    s->chunked = rnd(f) % 4 == 0;
    if (rnd(f) % 8 == 0)
        return; /* the seed as it is: the valid path too */
    for (int i = 0, m = 1 + (int)(rnd(f) % 4); i < m; i++)
        mutate_once(f, s);
}

/* ---- Sending ------------------------------------------------------------------------------ */

static int send_stream(fuzz *f, int fd, const stream *s) {
    if (!s->chunked)
        return tt_raw_send_all(fd, s->bytes, s->len);
    int pauses = 0;
    for (size_t off = 0; off < s->len;) {
        size_t k = 1 + rnd(f) % 64;
        if (k > s->len - off)
            k = s->len - off;
        if (tt_raw_send_all(fd, s->bytes + off, k) != 0)
            return -1;
        off += k;
        if (pauses < 8 && rnd(f) % 4 == 0) {
            usleep((useconds_t)(rnd(f) % 3000));
            pauses++;
        }
    }
    return 0;
}

/* One stream over a fresh connection; our FIN after it, then the other end
 * must close within CLOSE_WAIT_MS (its answers are read and dropped). */
static void run_stream(fuzz *f, const stream *s) {
    int fd = -1;
    switch (s->m) {
    case M_WORKER_PRE:
        fd = tt_raw_dial(f->worker);
        break;
    case M_WORKER_POST:
        fd = tt_raw_hello_as(f->worker, 2, TARGET, WORLD, &f->auth);
        break;
    case M_STORE_PRE:
        fd = tt_raw_dial(f->store);
        break;
    default:
        fd = tt_raw_store_hello(f->store, UINT32_MAX, &f->auth);
        break;
    }
    f->streams[s->m]++;
    if (fd < 0) {
        f->handshake_failed++;
        return;
    }
    f->conns++;
    if (send_stream(f, fd, s) == 0)
        f->bytes += s->len;
    shutdown(fd, SHUT_WR);
    uint64_t t0 = tt_now_ns(), end = t0 + CLOSE_WAIT_MS * 1000000ull;
    for (;;) {
        uint64_t now = tt_now_ns();
        struct pollfd pf = {fd, POLLIN, 0};
        if (now >= end || poll(&pf, 1, (int)((end - now) / 1000000) + 1) <= 0) {
            f->unclosed++;
            fprintf(stderr, "net_fuzz: stream %llu (%s): not closed %d ms after our FIN\n",
                    (unsigned long long)s->seq, mode_name[s->m], CLOSE_WAIT_MS);
            break;
        }
        uint8_t buf[4096];
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k > 0)
            continue;
        if (k < 0 && errno == EINTR)
            continue;
        f->closed++;
        f->slow_close += tt_now_ns() - t0 > 1000000000ull;
        break;
    }
    close(fd);
}

/* ---- Checks ---------------------------------------------------------------------------- */

typedef struct watch {
    tt_job *job;
    const char *log_path;
    long log_off;
    int last_calls;
    uint64_t last_progress_ns;
    char why[512];
} watch;

/* New lines of the children's log that report a sanitizer or an assertion. */
static int log_clean(watch *w) {
    static const char *const bad[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                      "runtime error",           "assertion failed",
                                      "rank check failed",       "AddressSanitizer:"};
    FILE *fp = fopen(w->log_path, "r");
    if (!fp)
        return 1;
    fseek(fp, w->log_off, SEEK_SET);
    char line[4096];
    int clean = 1;
    while (fgets(line, sizeof line, fp)) {
        for (size_t i = 0; clean && i < sizeof bad / sizeof bad[0]; i++) {
            if (strstr(line, bad[i])) {
                clean = 0;
                line[strcspn(line, "\n")] = '\0';
                snprintf(w->why, sizeof w->why, "the workers' log reports: %.400s", line);
            }
        }
    }
    w->log_off = ftell(fp);
    fclose(fp);
    return clean;
}

/* 0 while the job is healthy; else -1 with w->why. */
static int check_job(watch *w) {
    tt_job *job = w->job;
    for (int r = 0; r < job->world; r++) {
        int status;
        if (job->code[r] < 0 && waitpid(job->pid[r], &status, WNOHANG) == job->pid[r]) {
            job->code[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            snprintf(w->why, sizeof w->why, "worker %d exited with %d while fuzzed", r,
                     job->code[r]);
            log_clean(w); /* its report, if any, names the cause better */
            return -1;
        }
    }
    if (!log_clean(w))
        return -1;
    if (atomic_load(&job->shared->count[C_BAD]) > 0) {
        snprintf(w->why, sizeof w->why, "worker 0's calls to worker 1 failed or were wrong");
        return -1;
    }
    int calls = atomic_load(&job->shared->count[C_CALLS]);
    uint64_t now = tt_now_ns();
    if (calls != w->last_calls) {
        w->last_calls = calls;
        w->last_progress_ns = now;
    } else if (now - w->last_progress_ns > STALL_NS) {
        snprintf(w->why, sizeof w->why, "worker 0's calls to worker 1 made no progress in %.0f s",
                 (double)STALL_NS / 1e9);
        return -1;
    }
    return 0;
}

/* The last RING streams, each in a file named for its number and mode. */
static void save_ring(const fuzz *f, const char *findings, uint64_t seed_value, char *dir,
                      size_t len) {
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(dir, len, "%s/%s-seed%llu", findings, stamp, (unsigned long long)seed_value);
    mkdir(dir, 0755);
    for (int i = 0; i < RING; i++) {
        const stream *s = &f->ring[i];
        if (s->seq == 0 && s->len == 0)
            continue;
        char path[4600];
        snprintf(path, sizeof path, "%s/%06llu-%s%s.bin", dir, (unsigned long long)s->seq,
                 mode_name[s->m], s->chunked ? "-chunked" : "");
        FILE *fp = fopen(path, "wb");
        if (fp) {
            fwrite(s->bytes, 1, s->len, fp);
            fclose(fp);
        }
    }
}

/* ---- Main -------------------------------------------------------------------------------- */

static void usage_exit(void) {
    fprintf(stderr, "usage: net_fuzz [--seconds S] [--seed N] [--corpus DIR] [--findings DIR] "
                    "[--check-every N]\n");
    exit(2);
}

static int mkdirs(const char *path) {
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (char *c = p + 1; *c; c++) {
        if (*c == '/') {
            *c = '\0';
            mkdir(p, 0755);
            *c = '/';
        }
    }
    return mkdir(p, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

int main(int argc, char **argv) {
    double seconds = getenv("FUZZ_SECONDS") ? atof(getenv("FUZZ_SECONDS")) : 60;
    uint64_t seed_value = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    const char *corpus = TP_SOURCE_DIR "/fuzz/corpus";
    const char *findings = TP_SOURCE_DIR "/fuzz/findings/net";
    long check_every = 200;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc)
            usage_exit();
        if (strcmp(argv[i], "--seconds") == 0)
            seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--seed") == 0)
            seed_value = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--corpus") == 0)
            corpus = argv[i + 1];
        else if (strcmp(argv[i], "--findings") == 0)
            findings = argv[i + 1];
        else if (strcmp(argv[i], "--check-every") == 0)
            check_every = atol(argv[i + 1]);
        else
            usage_exit();
    }
    if (seconds <= 0 || check_every <= 0)
        usage_exit();
    static fuzz f;
    f.rng = seed_value * 0x9e3779b97f4a7c15ull + 1;
    char dir[4096];
    builtin_seeds(&f);
    snprintf(dir, sizeof dir, "%s/fuzz_tcp_records", corpus);
    int bad_corpus = load_dir(&f, dir, M_WORKER_PRE);
    snprintf(dir, sizeof dir, "%s/fuzz_msg_decode", corpus);
    bad_corpus |= load_dir(&f, dir, M_WORKER_POST);
    snprintf(dir, sizeof dir, "%s/fuzz_store_request", corpus);
    bad_corpus |= load_dir(&f, dir, M_STORE_POST);
    if (bad_corpus || mkdirs(findings) != 0) {
        fprintf(stderr, "net_fuzz: no corpus, or cannot make %s\n", findings);
        return 2;
    }

    /* The children's stderr goes to the log the checks read. */
    char log_path[4200];
    snprintf(log_path, sizeof log_path, "%s/workers.log", findings);
    int log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    int saved_err = dup(2);
    if (log_fd < 0 || saved_err < 0) {
        perror("net_fuzz: log");
        return 2;
    }
    tt_ensure_secret();
    tt_job job = {0};
    fflush(NULL);
    dup2(log_fd, 2);
    int spawned = tt_spawn(&job, WORLD, body_fuzz, NULL);
    dup2(saved_err, 2);
    close(saved_err);
    close(log_fd);
    if (spawned != 0) {
        perror("net_fuzz: spawn");
        return 2;
    }
    printf("NETFUZZ seed %llu, %d seeds, %.0f s; workers' log %s\n", (unsigned long long)seed_value,
           f.nseeds, seconds, log_path);
    fflush(stdout);

    watch w = {.job = &job, .log_path = log_path, .last_progress_ns = tt_now_ns()};
    int fail = 0;
    uint64_t t0 = tt_now_ns(), last_check = t0;
    uint64_t end = t0 + (uint64_t)(seconds * 1e9);
    while (atomic_load(&job.shared->count[C_READY]) < WORLD) {
        if (tt_now_ns() - t0 > 60000000000ull || check_job(&w) != 0) {
            snprintf(w.why, sizeof w.why, "the job did not start (see %.400s)", log_path);
            fail = 1;
            goto end;
        }
        usleep(10000);
    }
    if (tt_raw_worker_addr(job.store_port, TARGET, f.worker, sizeof f.worker) != 0) {
        snprintf(w.why, sizeof w.why, "no address of worker 1");
        fail = 1;
        goto end;
    }
    snprintf(f.store, sizeof f.store, "127.0.0.1:%u", (unsigned)job.store_port);
    f.auth = tt_job_auth();
    w.last_calls = atomic_load(&job.shared->count[C_CALLS]);
    t0 = tt_now_ns();
    w.last_progress_ns = t0;
    for (long n = 1; tt_now_ns() < end; n++) {
        stream *s = &f.ring[f.seq % RING];
        make_stream(&f, s);
        run_stream(&f, s);
        if (f.unclosed > 0) {
            snprintf(w.why, sizeof w.why, "stream %llu (%s) was not closed after our FIN",
                     (unsigned long long)s->seq, mode_name[s->m]);
            fail = 1;
            break;
        }
        if (n % check_every == 0 || tt_now_ns() - last_check > 1000000000ull) {
            last_check = tt_now_ns();
            if (check_job(&w) != 0) {
                fail = 1;
                break;
            }
        }
    }
    if (!fail && check_job(&w) != 0)
        fail = 1;
end:;
    double elapsed = (double)(tt_now_ns() - t0) / 1e9;
    int calls = atomic_load(&job.shared->count[C_CALLS]);
    atomic_store(&job.shared->flag[F_DONE], 1);
    if (tt_wait(&job, 60) != 0 && !fail) {
        snprintf(w.why, sizeof w.why, "a worker failed at its end (see %.400s)", log_path);
        fail = 1;
    }
    if (!fail && !log_clean(&w))
        fail = 1; /* LeakSanitizer reports at exit */
    long total = 0;
    for (int m = 0; m < M_COUNT; m++)
        total += f.streams[m];
    printf("NETFUZZ streams %ld in %.1f s (%.0f/s): worker-pre %ld, worker-post %ld, store-pre "
           "%ld, store-post %ld; %ld connections, %llu bytes\n",
           total, elapsed, elapsed > 0 ? (double)total / elapsed : 0, f.streams[M_WORKER_PRE],
           f.streams[M_WORKER_POST], f.streams[M_STORE_PRE], f.streams[M_STORE_POST], f.conns,
           (unsigned long long)f.bytes);
    printf("NETFUZZ outcome: %ld closed by the other end after our FIN (%ld after more than 1 s), "
           "%ld not closed, %ld handshakes refused; worker 0 -> worker 1 calls %d, wrong %d; "
           "warnings logged %d; graceful shutdowns failed %d\n",
           f.closed, f.slow_close, f.unclosed, f.handshake_failed, calls,
           atomic_load(&job.shared->count[C_BAD]), atomic_load(&job.shared->count[C_WARN]),
           atomic_load(&job.shared->count[C_SHUTDOWN_FAILED]));
    if (fail) {
        char saved[4400];
        save_ring(&f, findings, seed_value, saved, sizeof saved);
        printf("NETFUZZ FAILED: %s\n  the last %d streams: %s\n  the workers' log: %s\n  "
               "replay: net_fuzz --seed %llu --seconds %.0f\n",
               w.why, RING, saved, log_path, (unsigned long long)seed_value, seconds);
    } else {
        printf("NETFUZZ passed\n");
    }
    tt_job_free(&job);
    return fail;
}
