/*
 * tpsim_workload.c: experiments written as text (tools/README.md "Workload
 * files", spec/sim.md SIM-13).
 *
 *   tpsim --workload FILE [--faults PLAN] [--seed S] [--workers N] [--trace F]
 *
 * A workload file says who calls whom, which function, how often, for how
 * long, with what payload and timeout, and when; a fault plan beside it says
 * what goes wrong meanwhile. Every worker runs its share of the lines on
 * virtual time, then every call it left in flight must end, every two live
 * workers must reach each other (unless "liveness off"), the graceful
 * shutdown must succeed (TP_EPEERDOWN when a worker died) and the oracle
 * (SIM-9) must find nothing. Each line's outcomes are counted and printed.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/tpsim.h"

#define WL_LINES_MAX 256
#define WL_FILE_MAX (1u << 20)
#define WL_CALLS_MAX 1000000 /* calls of one line on one worker */
#define WL_WORKERS_MAX 1024

typedef struct wl_line {
    int lineno;
    uint8_t from[WL_WORKERS_MAX]; /* 1: this rank issues the line */
    int to[WL_WORKERS_MAX];       /* destinations, in order */
    int nto;
    int to_others; /* "others": every rank but the caller */
    tpsim_op op;
    uint64_t count;
    uint64_t start_ns, every_ns;
    double timeout_s;
    size_t payload;
    int64_t delay_us;
    int via; /* relay: the third worker, -1: the next rank */
    int sync, must_succeed;
    char text[160]; /* the line as written, for the summary */
} wl_line;

typedef struct wl_file {
    wl_line lines[WL_LINES_MAX];
    int nlines;
    uint32_t workers;
    double rpc_timeout_s;
    int pool;
    uint64_t window;
    int liveness;
} wl_file;

typedef struct wl_run {
    tpsim_world w;
    const wl_file *file;
} wl_run;

/* ---- Parsing ---------------------------------------------------------------------- */

static int parse_dur_ns(const char *s, uint64_t *ns) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return 0;
    double mul = strcmp(end, "s") == 0    ? 1e9
                 : strcmp(end, "ms") == 0 ? 1e6
                 : strcmp(end, "us") == 0 ? 1e3
                 : strcmp(end, "ns") == 0 ? 1.0
                                          : -1.0;
    if (mul < 0 || v * mul > 1e18)
        return 0;
    *ns = (uint64_t)(v * mul + 0.5);
    return 1;
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-')
        return 0;
    *out = v;
    return 1;
}

/* "0", "0,2,3", "all" (0..workers-1, resolved later), "others". */
static int parse_ranks(const char *s, uint8_t *set, int *list, int *n, int *all, int *others) {
    if (strcmp(s, "all") == 0) {
        *all = 1;
        return 1;
    }
    if (others && strcmp(s, "others") == 0) {
        *others = 1;
        return 1;
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        uint64_t r;
        if (!parse_u64(tok, &r) || r >= WL_WORKERS_MAX)
            return 0;
        if (set)
            set[r] = 1;
        if (list)
            list[(*n)++] = (int)r;
    }
    return 1;
}

static const struct {
    const char *name;
    tpsim_op op;
} fn_names[] = {
    {"add", TPSIM_OP_ASYNC_ADD}, {"slow", TPSIM_OP_SLOW},     {"relay", TPSIM_OP_FORWARD},
    {"echo", TPSIM_OP_ECHO},     {"fail", TPSIM_OP_FAIL},     {"unknown", TPSIM_OP_UNKNOWN},
    {"remote", TPSIM_OP_REMOTE}, {"forget", TPSIM_OP_FORGET},   {"share", TPSIM_OP_SHARE},
};

static int wl_error(const char *path, int lineno, const char *fmt, const char *what) {
    fprintf(stderr, "tpsim: %s line %d: ", path, lineno);
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\n");
    return 2;
}

/* Parses "call FROM TO FN key=value..." into *l; 0 or an exit status. */
static int parse_call(const char *path, int lineno, char **fld, int n, wl_line *l,
                      uint32_t *max_rank) {
    if (n < 4)
        return wl_error(path, lineno, "%s", "usage: call FROM TO FN [key=value ...]");
    memset(l, 0, sizeof *l);
    l->lineno = lineno;
    l->count = 1;
    l->timeout_s = TP_TIMEOUT_DEFAULT;
    l->via = -1;
    int all_from = 0, all_to = 0, dummy = 0;
    if (!parse_ranks(fld[1], l->from, NULL, &dummy, &all_from, NULL))
        return wl_error(path, lineno, "FROM '%s': expected ranks (0,2), or all", fld[1]);
    if (!parse_ranks(fld[2], NULL, l->to, &l->nto, &all_to, &l->to_others))
        return wl_error(path, lineno, "TO '%s': expected ranks (1,2), all or others", fld[2]);
    if (all_from)
        memset(l->from, 2, sizeof l->from); /* 2: every rank, resolved at run time */
    if (all_to)
        l->nto = -1; /* every rank */
    for (int r = 0; r < WL_WORKERS_MAX; r++)
        if (l->from[r] == 1 && (uint32_t)r > *max_rank)
            *max_rank = (uint32_t)r;
    for (int i = 0; i < l->nto; i++)
        if ((uint32_t)l->to[i] > *max_rank)
            *max_rank = (uint32_t)l->to[i];
    int found = 0;
    for (size_t i = 0; i < sizeof fn_names / sizeof fn_names[0]; i++)
        if (strcmp(fld[3], fn_names[i].name) == 0) {
            l->op = fn_names[i].op;
            found = 1;
        }
    if (!found)
        return wl_error(path, lineno,
                        "FN '%s': expected add, slow, relay, echo, fail, unknown, remote, forget or share",
                        fld[3]);
    uint64_t rate = 0, for_ns = 1000000000ull, v;
    int have_count = 0;
    for (int i = 4; i < n; i++) {
        char *eq = strchr(fld[i], '=');
        if (!eq)
            return wl_error(path, lineno, "'%s': expected key=value", fld[i]);
        *eq = '\0';
        const char *k = fld[i], *val = eq + 1;
        int ok = 1;
        if (strcmp(k, "count") == 0) {
            ok = parse_u64(val, &l->count) && l->count <= WL_CALLS_MAX;
            have_count = 1;
        } else if (strcmp(k, "rate") == 0) {
            ok = parse_u64(val, &rate) && rate > 0 && rate <= 1000000;
        } else if (strcmp(k, "for") == 0) {
            ok = parse_dur_ns(val, &for_ns);
        } else if (strcmp(k, "start") == 0) {
            ok = parse_dur_ns(val, &l->start_ns);
        } else if (strcmp(k, "every") == 0) {
            ok = parse_dur_ns(val, &l->every_ns);
        } else if (strcmp(k, "timeout") == 0) {
            if (strcmp(val, "inf") == 0)
                l->timeout_s = TP_TIMEOUT_INFINITE;
            else if (strcmp(val, "default") == 0)
                l->timeout_s = TP_TIMEOUT_DEFAULT;
            else if ((ok = parse_dur_ns(val, &v)) && v > 0)
                l->timeout_s = (double)v / 1e9;
            else
                ok = 0;
        } else if (strcmp(k, "payload") == 0) {
            ok = parse_u64(val, &v) && v <= (64u << 20);
            l->payload = (size_t)v;
        } else if (strcmp(k, "delay") == 0) {
            ok = parse_dur_ns(val, &v);
            l->delay_us = (int64_t)(v / 1000);
        } else if (strcmp(k, "via") == 0) {
            ok = parse_u64(val, &v) && v < WL_WORKERS_MAX;
            l->via = (int)v;
            if (ok && v > *max_rank)
                *max_rank = (uint32_t)v;
        } else if (strcmp(k, "mode") == 0) {
            ok = strcmp(val, "sync") == 0 || strcmp(val, "async") == 0;
            l->sync = strcmp(val, "sync") == 0;
        } else if (strcmp(k, "expect") == 0) {
            ok = strcmp(val, "ok") == 0 || strcmp(val, "any") == 0;
            l->must_succeed = strcmp(val, "ok") == 0;
        } else {
            return wl_error(path, lineno,
                            "unknown key '%s' (count, rate, for, start, every, timeout, payload, "
                            "delay, via, mode, expect)",
                            k);
        }
        if (!ok)
            return wl_error(path, lineno, "bad value for '%s'", k);
    }
    if (rate) { /* rate=R for=D: R calls a second, evenly spaced */
        if (have_count)
            return wl_error(path, lineno, "%s", "give count or rate, not both");
        l->every_ns = 1000000000ull / rate;
        l->count = (uint64_t)((double)rate * (double)for_ns / 1e9);
        if (l->count > WL_CALLS_MAX)
            return wl_error(path, lineno, "%s", "rate x for is more than 1,000,000 calls");
    }
    return 0;
}

static int split_fields(char *line, char **fld, int max) {
    int n = 0;
    for (char *tok = strtok(line, " \t\r\n"); tok && n < max; tok = strtok(NULL, " \t\r\n"))
        fld[n++] = tok;
    return n;
}

static int parse_file(const char *path, wl_file *f, uint32_t *max_rank) {
    FILE *in = fopen(path, "r");
    if (!in) {
        fprintf(stderr, "tpsim: --workload %s: %s\n", path, strerror(errno));
        return 2;
    }
    memset(f, 0, sizeof *f);
    f->rpc_timeout_s = 30.0;
    f->liveness = 1;
    char line[1024];
    int lineno = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, in)) {
        lineno++;
        char text[160];
        size_t tl = strcspn(line, "#\r\n");
        tl = tl < sizeof text - 1 ? tl : sizeof text - 1;
        memcpy(text, line, tl);
        text[tl] = '\0';
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *fld[24];
        int n = split_fields(line, fld, 24);
        if (n == 0)
            continue;
        uint64_t v = 0, ns = 0;
        if (strcmp(fld[0], "call") == 0) {
            if (f->nlines == WL_LINES_MAX)
                rc = wl_error(path, lineno, "more than %s call lines", "256");
            else if (!(rc = parse_call(path, lineno, fld, n, &f->lines[f->nlines], max_rank))) {
                memcpy(f->lines[f->nlines].text, text, sizeof text);
                f->nlines++;
            }
        } else if (strcmp(fld[0], "workers") == 0 && n == 2 && parse_u64(fld[1], &v) && v >= 1 &&
                   v <= WL_WORKERS_MAX) {
            f->workers = (uint32_t)v;
        } else if (strcmp(fld[0], "rpc_timeout") == 0 && n == 2) {
            if (strcmp(fld[1], "inf") == 0)
                f->rpc_timeout_s = 0;
            else if (parse_dur_ns(fld[1], &ns))
                f->rpc_timeout_s = (double)ns / 1e9;
            else
                rc = wl_error(path, lineno, "rpc_timeout '%s': expected a duration or inf", fld[1]);
        } else if (strcmp(fld[0], "pool") == 0 && n == 2 && parse_u64(fld[1], &v) && v >= 1 &&
                   v <= 1024) {
            f->pool = (int)v;
        } else if (strcmp(fld[0], "window") == 0 && n == 2 && parse_u64(fld[1], &v) && v > 0) {
            f->window = v;
        } else if (strcmp(fld[0], "liveness") == 0 && n == 2 &&
                   (strcmp(fld[1], "on") == 0 || strcmp(fld[1], "off") == 0)) {
            f->liveness = strcmp(fld[1], "on") == 0;
        } else {
            rc = wl_error(path, lineno,
                          "'%s': expected call, workers N, rpc_timeout DUR, pool N, window BYTES "
                          "or liveness on|off (with a valid value)",
                          fld[0]);
        }
    }
    fclose(in);
    if (!rc && f->nlines == 0) {
        fprintf(stderr, "tpsim: %s: no call lines\n", path);
        rc = 2;
    }
    return rc;
}

/* ---- Running ------------------------------------------------------------------------ */

/* The k-th destination of line l on worker me (0 <= k). */
static int dest_of(const wl_line *l, int me, int world, uint64_t k) {
    if (l->to_others) {
        int d = (int)(k % (uint64_t)(world - 1));
        return d >= me ? d + 1 : d;
    }
    if (l->nto < 0)
        return (int)(k % (uint64_t)world);
    return l->to[k % (uint64_t)l->nto];
}

static int issues(const wl_line *l, int me) {
    return l->from[me] != 0;
}

static int workload_program(int rank, int world, void *arg) {
    wl_run *run = arg;
    const wl_file *f = run->file;
    char name[16];
    snprintf(name, sizeof name, "w%d", rank);
    tp_status st = tpsim_worker_start(rank, world, f->rpc_timeout_s, f->pool, f->window);
    if (st != TP_OK) {
        if (!tpsim_self_dead())
            tpsim_world_fail(&run->w, "%s: init_rpc: %s: %s", name, tp_status_name(st),
                             tp_errmsg());
        return 0;
    }
    /* Every line this worker issues, merged by time (line order breaks ties). */
    uint64_t next[WL_LINES_MAX] = {0};
    size_t cap = 64, npend = 0;
    tpsim_pending *pend = malloc(cap * sizeof *pend);
    while (pend && !tpsim_self_dead()) {
        int best = -1;
        uint64_t best_t = UINT64_MAX;
        for (int i = 0; i < f->nlines; i++) {
            const wl_line *l = &f->lines[i];
            if (!issues(l, rank) || next[i] >= l->count)
                continue;
            uint64_t t = l->start_ns + next[i] * l->every_ns;
            if (t < best_t) {
                best_t = t;
                best = i;
            }
        }
        if (best < 0)
            break;
        const wl_line *l = &f->lines[best];
        uint64_t k = next[best]++;
        uint64_t now = tp_sim_now_ns(run->w.sim);
        if (best_t > now)
            (void)tp_sleep((double)(best_t - now) / 1e9);
        int dst = dest_of(l, rank, world, k);
        if (dst < 0 || dst >= world)
            continue;
        tpsim_op_spec s = {.op = l->op,
                           .dst = dst,
                           .timeout_s = l->timeout_s,
                           .fetch_timeout_s = l->timeout_s,
                           .a = (int64_t)k,
                           .b = rank,
                           .delay_us = l->delay_us,
                           .relay_to = l->via >= 0 ? l->via : (dst + 1) % world,
                           .relay_timeout_s = l->timeout_s > 0 ? l->timeout_s : 30.0,
                           .tag = ((uint64_t)rank << 40) ^ ((uint64_t)best << 32) ^ k,
                           .len = l->payload,
                           .sync = l->sync,
                           .must_succeed = l->must_succeed,
                           .line = best + 1};
        tpsim_pending p;
        tpsim_op_start(&run->w, rank, &s, &p);
        if (p.f) {
            if (npend == cap) {
                tpsim_pending *grown = realloc(pend, 2 * cap * sizeof *pend);
                if (!grown) {
                    tp_future_free(p.f);
                    break;
                }
                pend = grown;
                cap *= 2;
            }
            pend[npend++] = p;
        }
    }
    tpsim_settle(&run->w, rank, pend, npend);
    free(pend);
    if (f->liveness)
        tpsim_liveness(&run->w, rank, world);
    tpsim_worker_shutdown(&run->w, rank, world);
    return 0;
}

static char *read_all(const char *path) {
    FILE *in = fopen(path, "rb");
    if (!in)
        return NULL;
    char *buf = malloc(WL_FILE_MAX + 1);
    size_t n = buf ? fread(buf, 1, WL_FILE_MAX, in) : 0;
    fclose(in);
    if (buf)
        buf[n] = '\0';
    return buf;
}

int tpsim_workload_main(const char *path, uint32_t workers_given, uint64_t seed,
                        const char *faults_path, const char *trace_path) {
    wl_file *f = calloc(1, sizeof *f);
    if (!f)
        return 2;
    uint32_t max_rank = 0;
    int rc = parse_file(path, f, &max_rank);
    uint32_t world = workers_given ? workers_given : f->workers ? f->workers : max_rank + 1;
    if (world < 2)
        world = 2;
    if (!rc && max_rank >= world) {
        fprintf(stderr, "tpsim: %s names rank %u, but the world has %u workers\n", path, max_rank,
                world);
        rc = 2;
    }
    FILE *trace = NULL;
    if (!rc && trace_path && !(trace = fopen(trace_path, "w"))) {
        fprintf(stderr, "tpsim: --trace %s: %s\n", trace_path, strerror(errno));
        rc = 2;
    }
    tp_sim *sim = NULL;
    wl_run *run = calloc(1, sizeof *run);
    uint64_t(*outs)[TPSIM_OUT_KINDS] = calloc((size_t)f->nlines + 1, sizeof *outs);
    if (!rc && (!run || !outs))
        rc = 2;
    if (!rc) {
        tp_register_builtin_backends();
        tp_sim_config cfg = {.hosts = world, .seed = seed};
        if (tpsim_trace_is_json(trace_path))
            cfg.perfetto = trace;
        else
            cfg.trace = trace;
        char err[TP_ERRMSG_LEN_MAX] = "";
        char *plan = faults_path ? read_all(faults_path) : NULL;
        if (tp_sim_new(&cfg, &sim) != TP_OK ||
            (faults_path && (!plan || tp_sim_load_faults(sim, plan, err, sizeof err) != TP_OK))) {
            fprintf(stderr, "tpsim: --faults %s: %s\n", faults_path ? faults_path : "",
                    err[0] ? err : "cannot read it");
            rc = 2;
        }
        free(plan);
    }
    if (!rc) {
        run->file = f;
        run->w.sim = sim;
        run->w.line_outs = outs;
        printf("tpsim: workload %s, %u workers, seed %" PRIu64 "%s%s\n", path, world, seed,
               faults_path ? ", faults " : "", faults_path ? faults_path : "");
        tp_status st = tp_sim_run(sim, workload_program, run, NULL);
        if (st != TP_OK)
            tpsim_world_fail(&run->w, "the run did not end: %s: %s", tp_status_name(st),
                             tp_errmsg());
        if (tp_sim_violations(sim))
            tpsim_world_fail(&run->w, "oracle: %" PRIu64 " violation(s); first: %s",
                             tp_sim_violations(sim), tp_sim_violation(sim));
        for (int i = 0; i < f->nlines; i++) {
            printf("line %d: %s\n       ", f->lines[i].lineno, f->lines[i].text);
            uint64_t total = 0;
            for (int j = 0; j < TPSIM_OUT_KINDS; j++)
                total += outs[i + 1][j];
            printf("%" PRIu64 " calls:", total);
            for (int j = 0; j < TPSIM_OUT_KINDS; j++)
                if (outs[i + 1][j])
                    printf(" %" PRIu64 " %s", outs[i + 1][j], tpsim_out_names[j]);
            printf("\n");
        }
        for (int k = 0; k < TP_SIM_FAULT_KINDS_; k++)
            if (tp_sim_fault_count(sim, (tp_sim_fault_kind)k))
                printf("fault %s fired %" PRIu64 " time(s)\n",
                       tp_sim_fault_kind_name((tp_sim_fault_kind)k),
                       tp_sim_fault_count(sim, (tp_sim_fault_kind)k));
        printf("%s %s\n", run->w.failed ? "FAIL" : "PASS",
               run->w.failed ? run->w.first : "every check held (oracle, liveness, shutdown)");
        printf("virtual_time_ms=%.3f\nevents=%" PRIu64 "\nresult=%s\ntrace_hash=%016" PRIx64 "\n",
               (double)tp_sim_now_ns(sim) / 1e6, tp_sim_events(sim),
               run->w.failed ? "FAIL" : "PASS", tp_sim_trace_hash(sim));
        rc = run->w.failed ? 1 : 0;
    }
    tp_sim_free(sim);
    if (trace)
        fclose(trace);
    free(outs);
    free(run);
    free(f);
    return rc;
}
