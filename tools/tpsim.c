/*
 * tpsim.c: the command-line fault-experiment tool on the simulator.
 *
 *   tpsim --scenario NAME [--workers N] [--seed S] [--faults FILE] [--trace FILE]
 *   tpsim --list
 *
 * Runs one built-in scenario on N simulated workers and prints PASS/FAIL
 * lines and a summary whose last line is "trace_hash=<16 hex digits>". The
 * exit status is 0 when every check passed, 1 when one failed, 2 on a usage
 * or setup error. Wall-clock time is measured here (tools/ may read clocks;
 * common/ and sim/ may not) only to report simulated events per second.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tools/tpsim.h"

/* Each simulated host costs a task stack or more; past this a run is not
 * a quick experiment any more. */
#define TPSIM_WORKERS_MAX 1024
/* A fault plan is a short text file. */
#define TPSIM_FAULTS_SIZE_MAX (1u << 20)

#define EXIT_CHECK_FAILED 1
#define EXIT_USAGE 2
#define EXIT_WALL_LIMIT 3
/* A scenario takes milliseconds; a run still going after this long is stuck
 * (a livelock: events without progress, or a task that never yields). */
#define TPSIM_WALL_LIMIT_S_DEFAULT 120
#define TPSIM_WALL_LIMIT_S_MAX 86400

/* ---- Checks ------------------------------------------------------------- */

static uint64_t checks_passed;
static uint64_t checks_failed;
static uint32_t *host_failures; /* per rank, for the hosts' exit codes */
static int host_count;

static void report_line(const char *tag, const char *fmt, va_list ap) {
    char line[2 * TP_ERRMSG_LEN_MAX];
    vsnprintf(line, sizeof line, fmt, ap);
    printf("%s %s\n", tag, line);
    if (tp_sim_current())
        tp_sim_trace_note("tpsim: %s %s", tag, line);
}

int tpsim_check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report_line(ok ? "PASS" : "FAIL", fmt, ap);
    va_end(ap);
    if (ok) {
        checks_passed++;
        return 1;
    }
    checks_failed++;
    int host = tp_sim_current() ? tp_sim_current_host() : -1;
    if (host >= 0 && host < host_count)
        host_failures[host]++;
    return 0;
}

void tpsim_info(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report_line("INFO", fmt, ap);
    va_end(ap);
}

uint64_t tpsim_checks_passed(void) {
    return checks_passed;
}

uint64_t tpsim_checks_failed(void) {
    return checks_failed;
}

uint32_t tpsim_host_failures(int rank) {
    return rank >= 0 && rank < host_count ? host_failures[rank] : 0;
}

void tpsim_worker_name(int rank, char *buf, size_t len) {
    snprintf(buf, len, "w%d", rank);
}

/* ---- Command line ------------------------------------------------------- */

typedef struct tpsim_args {
    const tpsim_scenario *scenario;
    uint32_t workers; /* 0: the scenario's default */
    uint64_t seed;
    const char *faults_path;
    const char *trace_path;
    const char *workload_path;
    uint32_t wall_limit_s; /* 0: none */
    int list;
    int help;
} tpsim_args;

static void list_scenarios(FILE *out, int verbose) {
    for (size_t i = 0; i < tpsim_scenario_count; i++) {
        const tpsim_scenario *sc = &tpsim_scenarios[i];
        if (verbose)
            fprintf(out, "  %-14s %s (workers >= %u, default %u)\n", sc->name, sc->about,
                    (unsigned)sc->workers_min, (unsigned)sc->workers_default);
        else
            fprintf(out, "%s\n", sc->name);
    }
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: tpsim --scenario NAME [--workers N] [--seed S] [--faults FILE] [--trace FILE]\n"
            "                   [--wall-limit S]\n"
            "       tpsim --workload FILE [--workers N] [--seed S] [--faults FILE] [--trace FILE]\n"
            "       tpsim swarm --seeds A..B [...]   (tpsim swarm --help)\n"
            "       tpsim --list\n"
            "\n"
            "Runs a built-in scenario on N simulated workers and checks its results.\n"
            "The last line printed is trace_hash=<16 hex digits>; the exit status is 0\n"
            "when every check passed, 1 when one failed, 2 on a usage or setup error,\n"
            "3 when the run exceeded the wall-clock limit (stuck).\n"
            "\n"
            "  --scenario NAME  the scenario to run (see below)\n"
            "  --workload FILE  run the experiment a workload file describes (tools/README.md)\n"
            "  --workers N      simulated workers, from the scenario's minimum to %d\n"
            "  --seed S         the simulation seed, decimal or 0x hex (default 1)\n"
            "  --faults FILE    a fault plan to add (tools/README.md, tensorplay/sim.h)\n"
            "  --trace FILE     write the canonical trace to FILE (FILE.json: Chrome\n"
            "                   trace-event JSON, which Perfetto opens)\n"
            "  --wall-limit S   give up after S wall-clock seconds, exit 3 (default %d, 0: none)\n"
            "  --list           print the scenario names, one a line\n"
            "  --help           this text\n"
            "\n"
            "scenarios:\n",
            TPSIM_WORKERS_MAX, TPSIM_WALL_LIMIT_S_DEFAULT);
    list_scenarios(out, 1);
}

static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("tpsim: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n", stderr);
    va_end(ap);
    return EXIT_USAGE;
}

/* A decimal (or 0x hex) unsigned integer that fits max, the whole string. */
static int parse_u64(const char *s, uint64_t max, uint64_t *out) {
    if (!s[0] || s[0] == '-' || s[0] == '+' || s[0] == ' ')
        return 0;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno != 0 || *end != '\0' || v > max)
        return 0;
    *out = (uint64_t)v;
    return 1;
}

static int parse_scenario(const char *value, tpsim_args *args) {
    args->scenario = tpsim_scenario_find(value);
    if (args->scenario)
        return 0;
    fprintf(stderr, "tpsim: unknown scenario '%s'; valid scenarios are:\n", value);
    list_scenarios(stderr, 0);
    return EXIT_USAGE;
}

/* Takes the value of an option from "--opt=value" or the next argument. */
static const char *option_value(int argc, char **argv, int *i, const char *eq) {
    if (eq)
        return eq + 1;
    if (*i + 1 >= argc)
        return NULL;
    return argv[++*i];
}

static int parse_args(int argc, char **argv, tpsim_args *args) {
    int have_seed = 0, have_wall_limit = 0;
    memset(args, 0, sizeof *args);
    args->seed = 1;
    args->wall_limit_s = TPSIM_WALL_LIMIT_S_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--list") == 0) {
            args->list = 1;
            continue;
        }
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            args->help = 1;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0)
            return usage_error("unexpected argument '%s' (try --help)", arg);
        const char *eq = strchr(arg, '=');
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        const char *opts[] = {"--scenario", "--workers",    "--seed",
                              "--faults",   "--trace",      "--wall-limit",
                              "--workload"};
        size_t which = sizeof opts / sizeof opts[0];
        for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
            if (strlen(opts[k]) == name_len && strncmp(arg, opts[k], name_len) == 0)
                which = k;
        }
        if (which == sizeof opts / sizeof opts[0])
            return usage_error("unknown option '%.*s' (try --help)", (int)name_len, arg);
        const char *value = option_value(argc, argv, &i, eq);
        if (!value)
            return usage_error("%s needs a value (try --help)", opts[which]);
        if (!value[0])
            return usage_error("%s needs a non-empty value", opts[which]);
        uint64_t n = 0;
        int rc = 0;
        switch (which) {
        case 0:
            if (args->scenario)
                return usage_error("--scenario given twice");
            rc = parse_scenario(value, args);
            break;
        case 1:
            if (args->workers)
                return usage_error("--workers given twice");
            if (!parse_u64(value, TPSIM_WORKERS_MAX, &n) || n == 0)
                return usage_error("--workers '%s': expected an integer from 1 to %d", value,
                                   TPSIM_WORKERS_MAX);
            args->workers = (uint32_t)n;
            break;
        case 2:
            if (have_seed++)
                return usage_error("--seed given twice");
            if (!parse_u64(value, UINT64_MAX, &args->seed))
                return usage_error("--seed '%s': expected an unsigned 64-bit integer "
                                   "(decimal or 0x hex)",
                                   value);
            break;
        case 3:
            if (args->faults_path)
                return usage_error("--faults given twice");
            args->faults_path = value;
            break;
        case 4:
            if (args->trace_path)
                return usage_error("--trace given twice");
            args->trace_path = value;
            break;
        case 6:
            if (args->workload_path)
                return usage_error("--workload given twice");
            args->workload_path = value;
            break;
        default:
            if (have_wall_limit++)
                return usage_error("--wall-limit given twice");
            if (!parse_u64(value, TPSIM_WALL_LIMIT_S_MAX, &n))
                return usage_error("--wall-limit '%s': expected whole seconds from 0 to %d", value,
                                   TPSIM_WALL_LIMIT_S_MAX);
            args->wall_limit_s = (uint32_t)n;
            break;
        }
        if (rc)
            return rc;
    }
    if (args->help || args->list)
        return 0;
    if (args->workload_path && args->scenario)
        return usage_error("give --scenario or --workload, not both");
    if (args->workload_path)
        return 0;
    if (!args->scenario) {
        fprintf(stderr, "tpsim: --scenario is required; valid scenarios are:\n");
        list_scenarios(stderr, 0);
        return EXIT_USAGE;
    }
    if (!args->workers)
        args->workers = args->scenario->workers_default;
    if (args->workers < args->scenario->workers_min)
        return usage_error("scenario '%s' needs at least %u workers, got %u", args->scenario->name,
                           (unsigned)args->scenario->workers_min, (unsigned)args->workers);
    return 0;
}

/* ---- Running ------------------------------------------------------------ */

/* Reads the whole fault plan into a NUL-terminated buffer (caller frees). */
static char *read_text_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "tpsim: --faults %s: %s\n", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(TPSIM_FAULTS_SIZE_MAX + 1);
    size_t n = buf ? fread(buf, 1, TPSIM_FAULTS_SIZE_MAX + 1, f) : 0;
    int err = ferror(f);
    fclose(f);
    if (!buf || err || n > TPSIM_FAULTS_SIZE_MAX) {
        fprintf(stderr, "tpsim: --faults %s: %s\n", path,
                !buf  ? "out of memory"
                : err ? "read error"
                      : "larger than 1 MiB");
        free(buf);
        return NULL;
    }
    if (memchr(buf, '\0', n)) {
        fprintf(stderr, "tpsim: --faults %s: not a text file (NUL byte)\n", path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

static int load_faults(tp_sim *sim, const char *path) {
    char *text = read_text_file(path);
    if (!text)
        return EXIT_USAGE;
    char errmsg[TP_ERRMSG_LEN_MAX] = "";
    tp_status st = tp_sim_load_faults(sim, text, errmsg, sizeof errmsg);
    free(text);
    if (st != TP_OK) {
        fprintf(stderr, "tpsim: fault plan %s: %s\n", path, errmsg[0] ? errmsg : tp_strerror(st));
        return EXIT_USAGE;
    }
    return 0;
}

/* ---- The wall-clock watchdog ------------------------------------------- */

static tp_sim *watched_sim;
static uint32_t watched_limit_s;

/* Appends the decimal digits of v to buf at *off (async-signal-safe). */
static void append_u64(char *buf, size_t len, size_t *off, uint64_t v) {
    char digits[24];
    size_t n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && n < sizeof digits);
    while (n && *off + 1 < len)
        buf[(*off)++] = digits[--n];
}

static void append_str(char *buf, size_t len, size_t *off, const char *s) {
    while (*s && *off + 1 < len)
        buf[(*off)++] = *s++;
}

/*
 * SIGALRM: the run is stuck. Says where the simulation stood (a virtual
 * clock that no longer moves while events grow is a livelock) and exits.
 * Only async-signal-safe calls; the simulator's counters are plain reads.
 */
static void on_wall_limit(int sig) {
    (void)sig;
    char msg[256];
    size_t off = 0;
    append_str(msg, sizeof msg, &off, "tpsim: wall-clock limit of ");
    append_u64(msg, sizeof msg, &off, watched_limit_s);
    append_str(msg, sizeof msg, &off, " s exceeded: stuck at virtual time ");
    append_u64(msg, sizeof msg, &off, watched_sim ? tp_sim_now_ns(watched_sim) : 0);
    append_str(msg, sizeof msg, &off, " ns after ");
    append_u64(msg, sizeof msg, &off, watched_sim ? tp_sim_events(watched_sim) : 0);
    append_str(msg, sizeof msg, &off, " events\n");
    ssize_t w = write(STDERR_FILENO, msg, off);
    (void)w;
    _exit(EXIT_WALL_LIMIT);
}

static void watchdog_start(tp_sim *sim, uint32_t limit_s) {
    if (!limit_s)
        return;
    watched_sim = sim;
    watched_limit_s = limit_s;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_wall_limit;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    alarm(limit_s);
}

static void watchdog_stop(void) {
    alarm(0);
    watched_sim = NULL;
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The checks main makes after the run: outcome, lifecycle and exit codes. */
static void check_run(const tpsim_scenario *sc, uint32_t world, tp_status st,
                      const int *exit_codes) {
    tpsim_check(st == TP_OK, "run: every host's program returned (%s)", tp_status_name(st));
    tpsim_check(tpsim_state.inits_ok + tpsim_state.inits_cut == world,
                "run: %u/%u workers initialised (%u killed during init)",
                (unsigned)tpsim_state.inits_ok, (unsigned)world, (unsigned)tpsim_state.inits_cut);
    uint32_t survivors = 0, wrong = 0;
    int first_wrong = -1;
    for (uint32_t r = 0; r < world; r++) {
        int want = sc->expect_exit ? sc->expect_exit((int)r, (int)world) : 0;
        survivors += want == 0;
        if (exit_codes[r] != want) {
            wrong++;
            if (first_wrong < 0)
                first_wrong = (int)r;
        }
    }
    tpsim_check(tpsim_state.shutdowns_ok == survivors,
                "run: %u/%u surviving workers shut down gracefully with %s (longest %.3f ms)",
                (unsigned)tpsim_state.shutdowns_ok, (unsigned)survivors,
                survivors == world ? "TP_OK" : "TP_EPEERDOWN naming the dead",
                (double)tpsim_state.shutdown_ns_max / 1e6);
    if (first_wrong >= 0) {
        int want = sc->expect_exit ? sc->expect_exit(first_wrong, (int)world) : 0;
        tpsim_check(0,
                    "run: %u hosts ended with an unexpected exit code; first: w%d exit %d, "
                    "expected %d",
                    (unsigned)wrong, first_wrong, exit_codes[first_wrong], want);
    } else {
        tpsim_check(1, "run: every host's exit code as expected (%u killed)",
                    (unsigned)(world - survivors));
    }
}

static void print_summary(const tpsim_args *args, tp_sim *sim, double wall_s) {
    uint64_t events = tp_sim_events(sim);
    uint64_t vt_ns = tp_sim_now_ns(sim);
    printf("scenario=%s\n", args->scenario->name);
    printf("workers=%u\n", (unsigned)args->workers);
    printf("seed=%" PRIu64 "\n", args->seed);
    printf("faults=%s\n", args->faults_path ? args->faults_path : "none");
    printf("virtual_time_ms=%.3f\n", (double)vt_ns / 1e6);
    printf("events=%" PRIu64 "\n", events);
    printf("messages=%" PRIu64 "\n", tp_sim_messages(sim));
    printf("wall_time_ms=%.3f\n", wall_s * 1e3);
    printf("events_per_s=%.0f\n", wall_s > 0 ? (double)events / wall_s : 0.0);
    printf("checks_passed=%" PRIu64 "\n", checks_passed);
    printf("checks_failed=%" PRIu64 "\n", checks_failed);
    printf("result=%s\n", checks_failed ? "FAIL" : "PASS");
    printf("trace_hash=%016" PRIx64 "\n", tp_sim_trace_hash(sim));
}

static int run(const tpsim_args *args) {
    const tpsim_scenario *sc = args->scenario;
    uint32_t world = args->workers;
    int rc = EXIT_USAGE;
    FILE *trace = NULL;
    tp_sim *sim = NULL;
    int *exit_codes = calloc(world, sizeof *exit_codes);
    host_failures = calloc(world, sizeof *host_failures);
    host_count = (int)world;
    if (!exit_codes || !host_failures) {
        fprintf(stderr, "tpsim: out of memory\n");
        goto out;
    }
    if (args->trace_path && !(trace = fopen(args->trace_path, "w"))) {
        fprintf(stderr, "tpsim: --trace %s: %s\n", args->trace_path, strerror(errno));
        goto out;
    }
    tp_register_builtin_backends();
    tp_sim_config cfg = {.hosts = world, .seed = args->seed, .trace = trace};
    if (tpsim_trace_is_json(args->trace_path)) { /* Perfetto's format, not the text */
        cfg.trace = NULL;
        cfg.perfetto = trace;
    }
    tp_status st = tp_sim_new(&cfg, &sim);
    if (st != TP_OK) {
        fprintf(stderr, "tpsim: tp_sim_new: %s: %s\n", tp_status_name(st), tp_errmsg());
        goto out;
    }
    if (args->faults_path && load_faults(sim, args->faults_path) != 0)
        goto out;
    st = sc->setup ? sc->setup(sim, world) : TP_OK;
    if (st != TP_OK) {
        fprintf(stderr, "tpsim: scenario %s setup: %s: %s\n", sc->name, tp_status_name(st),
                tp_errmsg());
        goto out;
    }

    printf("tpsim: scenario %s, %u workers, seed %" PRIu64 "\n", sc->name, (unsigned)world,
           args->seed);
    watchdog_start(sim, args->wall_limit_s);
    double t0 = wall_seconds();
    st = tp_sim_run(sim, tpsim_program, (void *)sc, exit_codes);
    double wall_s = wall_seconds() - t0;
    watchdog_stop();

    check_run(sc, world, st, exit_codes);
    if (sc->finish)
        sc->finish((int)world);
    uint64_t violations = tp_sim_violations(sim);
    tpsim_check(violations == 0, "oracle: %" PRIu64 " violation(s)%s%s", violations,
                violations ? "; first: " : "", tp_sim_violation(sim));
    print_summary(args, sim, wall_s);
    rc = checks_failed ? EXIT_CHECK_FAILED : 0;
out:
    if (sim)
        tp_sim_free(sim);
    if (trace && fclose(trace) != 0) {
        fprintf(stderr, "tpsim: --trace %s: %s\n", args->trace_path, strerror(errno));
        rc = rc ? rc : EXIT_USAGE;
    }
    free(host_failures);
    host_failures = NULL;
    host_count = 0;
    free(exit_codes);
    return rc;
}

int main(int argc, char **argv) {
    /* Line-buffered, so PASS/FAIL lines before an abort are not lost. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "swarm") == 0)
        return tpsim_swarm_main(argc - 1, argv + 1);
    tpsim_args args;
    int rc = parse_args(argc, argv, &args);
    if (rc)
        return rc;
    if (args.help) {
        usage(stdout);
        return 0;
    }
    if (args.list) {
        list_scenarios(stdout, 0);
        return 0;
    }
    if (args.workload_path)
        return tpsim_workload_main(args.workload_path, args.workers, args.seed, args.faults_path,
                                   args.trace_path);
    return run(&args);
}
