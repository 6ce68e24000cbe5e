/*
 * conformance_sim.c: the conformance suite on the deterministic simulator.
 * Each case gets a fresh tp_sim with one host per rank and a fixed seed
 * (plus TP_CONFORMANCE_SEED from the environment, to explore other
 * schedules); the case passes when the simulation ends with TP_OK and every
 * host returned 0 (or died by crash_self, as asked).
 *
 * Each case runs in a forked child (as libuv runs each test in its own
 * process), so an assertion or crash in the library fails that case only,
 * a sanitizer's leak report at the child's exit fails the case that leaked,
 * and a hung case is killed at a wall-clock deadline. The child sends its
 * launcher text and every rank's report back through a pipe. Set
 * TP_CONFORMANCE_NOFORK=1 to run in-process (for a debugger).
 *
 * Usage: conformance_sim [--list] [CASE-SUBSTRING...]
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conformance.h"
#include "tensorplay/rpc_backend.h"
#include "tensorplay/sim.h"

#define SIM_SEED 0x7e9501ULL

typedef struct sim_run {
    tp_conformance_program program;
    int crashed[TP_CONFORMANCE_RANKS_MAX]; /* hosts that called crash_self */
} sim_run;

static sim_run *current_run; /* the run in progress (one at a time, one thread) */
static uint64_t extra_seed;

static int sim_trampoline(int rank, int world_size, void *arg) {
    sim_run *run = arg;
    return run->program(rank, world_size);
}

static void sim_crash_self(void) {
    int host = tp_sim_current_host();
    if (current_run && host >= 0 && host < TP_CONFORMANCE_RANKS_MAX)
        current_run->crashed[host] = 1;
    tp_sim_crash_self();
}

static uint64_t sim_now_ns(void) {
    tp_sim *sim = tp_sim_current();
    return sim ? tp_sim_now_ns(sim) : 0;
}

static tp_options *sim_options(const tp_conformance_launcher *l) {
    (void)l;
    return tp_options_new();
}

#define CASE_WALL_LIMIT_S 120 /* a case is killed after this much real time */
#define CHILD_FAILED 3        /* the child's exit code when the case failed */

static int nofork;

/* Runs one case in this process: the simulation, then the exit codes. */
static int sim_run_case(int world_size, tp_conformance_program program, char *why, size_t why_len) {
    if (world_size < 1 || world_size > TP_CONFORMANCE_RANKS_MAX) {
        snprintf(why, why_len, "world_size %d outside [1, %d]\n", world_size,
                 TP_CONFORMANCE_RANKS_MAX);
        return 1;
    }
    tp_sim_config cfg = {.hosts = (uint32_t)world_size, .seed = SIM_SEED + extra_seed};
    tp_sim *sim = NULL;
    tp_status st = tp_sim_new(&cfg, &sim);
    if (st != TP_OK) {
        snprintf(why, why_len, "tp_sim_new: %s: %s\n", tp_status_name(st), tp_errmsg());
        return 1;
    }
    sim_run run = {.program = program};
    int codes[TP_CONFORMANCE_RANKS_MAX];
    for (int i = 0; i < TP_CONFORMANCE_RANKS_MAX; i++)
        codes[i] = -1;
    current_run = &run;
    st = tp_sim_run(sim, sim_trampoline, &run, codes);
    current_run = NULL;
    int bad = 0;
    size_t off = 0;
    if (st != TP_OK) {
        bad = 1;
        off += (size_t)snprintf(why + off, why_len - off,
                                "  tp_sim_run: %s (%s) at virtual %.3f s: %s\n", tp_status_name(st),
                                st == TP_ECANCELED   ? "deadlock: every task parked"
                                : st == TP_ETIMEDOUT ? "virtual time limit"
                                                     : "error",
                                (double)tp_sim_now_ns(sim) / 1e9, tp_errmsg());
    }
    for (int r = 0; r < world_size && off < why_len; r++) {
        int ok = codes[r] == 0 || (run.crashed[r] && codes[r] == 137);
        if (!ok) {
            bad = 1;
            off += (size_t)snprintf(why + off, why_len - off, "  rank %d exited with %d%s\n", r,
                                    codes[r], codes[r] == -1 ? " (never returned)" : "");
        }
    }
    /* The simulator's oracle (SIM-9) holds under every case, faults included. */
    if (tp_sim_violations(sim) && off < why_len) {
        bad = 1;
        off += (size_t)snprintf(why + off, why_len - off, "  oracle: %llu violation(s); first: %s\n",
                                (unsigned long long)tp_sim_violations(sim), tp_sim_violation(sim));
    }
    tp_sim_free(sim);
    /* Every handle a case took is released by its end: a worker core still
     * allocated is held by a leaked call, future, rref or job. */
    if (tp_core_live_count() != 0 && off < why_len) {
        bad = 1;
        off += (size_t)snprintf(why + off, why_len - off,
                                "  leak: %llu worker core(s) still allocated after the case\n",
                                (unsigned long long)tp_core_live_count());
    }
    return bad;
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

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The child: runs the case, sends its text and rank reports, exits. */
static _Noreturn void child_main(int fd, int world_size, tp_conformance_program program) {
    char why[4096] = "";
    int bad = sim_run_case(world_size, program, why, sizeof why);
    write_all(fd, why, strlen(why));
    for (int r = 0; r < TP_CONFORMANCE_RANKS_MAX; r++) {
        const char *rep = tp_conformance_rank_report(r);
        write_all(fd, rep, strlen(rep));
        bad |= rep[0] != '\0';
    }
    close(fd);
    exit(bad ? CHILD_FAILED : 0); /* exit, not _exit: a sanitizer checks this case's leaks */
}

static int sim_launch(const tp_conformance_launcher *l, int world_size,
                      tp_conformance_program program, char *why, size_t why_len) {
    (void)l;
    if (nofork)
        return sim_run_case(world_size, program, why, why_len);
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, why_len, "pipe: %s\n", strerror(errno));
        return 1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, why_len, "fork: %s\n", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return 1;
    }
    if (pid == 0) {
        close(fds[0]);
        child_main(fds[1], world_size, program);
    }
    close(fds[1]);
    size_t off = 0;
    int killed = 0;
    double deadline = wall_s() + CASE_WALL_LIMIT_S;
    for (;;) {
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        int left_ms = (int)((deadline - wall_s()) * 1000);
        int n = left_ms > 0 ? poll(&p, 1, left_ms) : 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            kill(pid, SIGKILL);
            killed = 1;
            break;
        }
        char buf[1024];
        ssize_t got = read(fds[0], buf, sizeof buf);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        size_t take = (size_t)got < why_len - 1 - off ? (size_t)got : why_len - 1 - off;
        memcpy(why + off, buf, take);
        off += take;
    }
    why[off] = '\0';
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    int bad = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (killed)
        snprintf(why + off, why_len - off, "  case killed after %d s of wall time (hung)\n",
                 CASE_WALL_LIMIT_S);
    else if (WIFSIGNALED(status))
        snprintf(why + off, why_len - off,
                 "  case process died of signal %d (an assertion or crash: see stderr above)\n",
                 WTERMSIG(status));
    else if (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != CHILD_FAILED)
        snprintf(why + off, why_len - off,
                 "  case process exited with %d (a sanitizer report? see stderr above)\n",
                 WEXITSTATUS(status));
    return bad;
}

static const tp_conformance_launcher sim_launcher = {
    .backend = "SIM",
    .run = sim_launch,
    .options = sim_options,
    .now_ns = sim_now_ns,
    .crash_self = sim_crash_self,
};

int main(int argc, char **argv) {
    const char *seed = getenv("TP_CONFORMANCE_SEED");
    if (seed && *seed) {
        extra_seed = strtoull(seed, NULL, 0);
        printf("conformance_sim: seed 0x%" PRIx64 " + %" PRIu64 "\n", (uint64_t)SIM_SEED,
               extra_seed);
    }
    const char *nf = getenv("TP_CONFORMANCE_NOFORK");
    nofork = nf && *nf && strcmp(nf, "0") != 0;
    tp_register_builtin_backends();
    return tp_conformance_main(argc, argv, &sim_launcher) == 0 ? 0 : 1;
}
