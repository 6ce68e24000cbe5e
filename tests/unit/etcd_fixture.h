/*
 * etcd_fixture.h: a private etcd server for the etcd store's tests
 * (spec/etcd.md ETCD-10), header only, for test_store.c, test_etcd_store.c
 * and tests/tcp/test_tcp_etcd.c.
 *
 * tpe_etcd_start runs `etcd` (TP_ETCD_BIN, else etcd on PATH) on two free
 * loopback ports with a fresh data directory (under /dev/shm when it is
 * there: etcd syncs its log on every write, and tmpfs makes that free),
 * waits until it answers through the store itself, and tpe_etcd_stop kills
 * it and removes the directory. The server dies with the test process too
 * (PR_SET_PDEATHSIG), so a crashed test leaves none behind.
 *
 * Without the binary a test skips, unless TP_REQUIRE_ETCD=1 (CI): then it
 * fails, as TP_REQUIRE_TORCH does for the torch tests.
 */
#ifndef TP_TESTS_ETCD_FIXTURE_H
#define TP_TESTS_ETCD_FIXTURE_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tensorplay/rpc_backend.h"

/* How long etcd may take to answer after it starts (it elects itself). */
#define TPE_START_TIMEOUT_S 30.0

typedef struct tpe_etcd {
    pid_t pid;
    unsigned port;     /* client port on 127.0.0.1 */
    char dir[256];     /* its data directory and log */
    char endpoint[64]; /* "127.0.0.1:<port>" */
    char why[512];     /* why it could not start */
} tpe_etcd;

static inline uint64_t tpe_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void tpe_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* 1 when TP_REQUIRE_ETCD=1: a missing etcd fails instead of skipping. */
static inline int tpe_required(void) {
    const char *v = getenv("TP_REQUIRE_ETCD");
    return v && strcmp(v, "1") == 0;
}

/* The etcd binary: TP_ETCD_BIN, else the first etcd on PATH; 0 when none. */
static inline int tpe_find_binary(char *out, size_t len) {
    const char *bin = getenv("TP_ETCD_BIN");
    if (bin && *bin) {
        snprintf(out, len, "%s", bin);
        return access(out, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, len, "%s/etcd", d);
        if (access(out, X_OK) == 0)
            return 1;
    }
    return 0;
}

/* A TCP port on 127.0.0.1 nobody listens on right now. */
static inline unsigned tpe_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    unsigned port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* Removes path and everything under it (etcd's data is a few levels deep). */
static inline void tpe_rmtree(const char *path, int depth) {
    struct stat st;
    if (depth > 16 || lstat(path, &st) != 0)
        return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *ent;
        while (d && (ent = readdir(d)) != NULL) {
            if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0)
                continue;
            char child[1024];
            int n = snprintf(child, sizeof child, "%s/%s", path, ent->d_name);
            if (n > 0 && (size_t)n < sizeof child)
                tpe_rmtree(child, depth + 1);
        }
        if (d)
            closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* The last lines of etcd's log, for a failure message. */
static inline void tpe_log_tail(const tpe_etcd *e, char *out, size_t len) {
    char path[300];
    snprintf(path, sizeof path, "%s/etcd.log", e->dir);
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    size_t keep = n < len - 1 ? n : len - 1;
    memcpy(out, buf + n - keep, keep);
    out[keep] = '\0';
}

/* Kills the server (TERM, then KILL after 5 s) and removes its directory. */
static inline void tpe_etcd_stop(tpe_etcd *e) {
    if (e->pid > 0) {
        kill(e->pid, SIGTERM);
        uint64_t deadline = tpe_now_ns() + 5000000000ull;
        int status;
        while (waitpid(e->pid, &status, WNOHANG) == 0) {
            if (tpe_now_ns() >= deadline) {
                kill(e->pid, SIGKILL);
                waitpid(e->pid, &status, 0);
                break;
            }
            tpe_sleep_ms(10);
        }
        e->pid = 0;
    }
    if (e->dir[0])
        tpe_rmtree(e->dir, 0);
    e->dir[0] = '\0';
}

/* Whether a store on the server answers: a get of a key nobody wrote. */
static inline int tpe_answers(const tpe_etcd *e) {
    char url[128];
    snprintf(url, sizeof url, "etcd://%s/tp-probe?timeout_ms=500", e->endpoint);
    tp_store *s = NULL;
    if (tp_etcd_store_open(url, &s, NULL, 0) != TP_OK)
        return 0;
    void *v = NULL;
    size_t n = 0;
    tp_status st = s->ops->get(s, "up", &v, &n);
    free(v);
    s->ops->close(s);
    return st == TP_ENOENT || st == TP_OK;
}

/* One attempt on two fresh ports: 1 up, 0 it exited or never answered. */
static inline int tpe_try_start(tpe_etcd *e, const char *bin) {
    unsigned peer = tpe_free_port();
    e->port = tpe_free_port();
    if (!e->port || !peer || e->port == peer) {
        snprintf(e->why, sizeof e->why, "no free ports");
        return 0;
    }
    snprintf(e->endpoint, sizeof e->endpoint, "127.0.0.1:%u", e->port);
    char client_url[64], peer_url[64], cluster[96], data[300], log[300];
    snprintf(client_url, sizeof client_url, "http://127.0.0.1:%u", e->port);
    snprintf(peer_url, sizeof peer_url, "http://127.0.0.1:%u", peer);
    snprintf(cluster, sizeof cluster, "tp=%s", peer_url);
    snprintf(data, sizeof data, "%s/data", e->dir);
    snprintf(log, sizeof log, "%s/etcd.log", e->dir);
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(e->why, sizeof e->why, "fork: %s", strerror(errno));
        return 0;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execl(bin, bin, "--name", "tp", "--data-dir", data, "--listen-client-urls", client_url,
              "--advertise-client-urls", client_url, "--listen-peer-urls", peer_url,
              "--initial-advertise-peer-urls", peer_url, "--initial-cluster", cluster,
              "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    e->pid = pid;
    uint64_t deadline = tpe_now_ns() + (uint64_t)(TPE_START_TIMEOUT_S * 1e9);
    while (tpe_now_ns() < deadline) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            e->pid = 0;
            char tail[300];
            tpe_log_tail(e, tail, sizeof tail);
            snprintf(e->why, sizeof e->why, "etcd exited (status %d): %s", status, tail);
            return 0;
        }
        if (tpe_answers(e))
            return 1;
        tpe_sleep_ms(50);
    }
    snprintf(e->why, sizeof e->why, "etcd did not answer within %.0f s", TPE_START_TIMEOUT_S);
    return 0;
}

/*
 * Starts a private etcd: 1 up; 0 when there is no etcd binary (e->why says
 * so: skip, unless tpe_required()); -1 when it failed to start (e->why).
 */
static inline int tpe_etcd_start(tpe_etcd *e) {
    memset(e, 0, sizeof *e);
    char bin[512];
    if (!tpe_find_binary(bin, sizeof bin)) {
        snprintf(e->why, sizeof e->why,
                 "no etcd binary (TP_ETCD_BIN, or etcd on PATH; Debian: apt-get install "
                 "etcd-server, or scripts/install-deps.sh --tests)");
        return 0;
    }
    struct stat st;
    const char *tmp = getenv("TMPDIR");
    const char *root =
        stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0
            ? "/dev/shm"
        : tmp && *tmp ? tmp
                      : "/tmp";
    /* Ports can be taken between the probe and etcd's bind: a few tries. */
    for (int attempt = 0; attempt < 3; attempt++) {
        snprintf(e->dir, sizeof e->dir, "%s/tp_etcd_XXXXXX", root);
        if (!mkdtemp(e->dir)) {
            snprintf(e->why, sizeof e->why, "mkdtemp %s: %s", e->dir, strerror(errno));
            e->dir[0] = '\0';
            return -1;
        }
        if (tpe_try_start(e, bin))
            return 1;
        char why[sizeof e->why];
        snprintf(why, sizeof why, "%s", e->why);
        tpe_etcd_stop(e);
        snprintf(e->why, sizeof e->why, "%s", why);
    }
    return -1;
}

#endif
