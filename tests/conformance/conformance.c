/*
 * conformance.c: the harness: failure records, the cmocka group, and the
 * helpers cases share. Rank programs run wherever the launcher puts them
 * (fibers, threads, processes), so nothing here longjmps out of a program:
 * failures are recorded per rank and reported by the cmocka test that ran
 * the case.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "conformance.h"

#define REPORT_LEN 4096 /* one rank's failure text; later failures are counted only */

const tp_conformance_launcher *conf_launcher;

/* Each rank writes only its own record, so ranks that are threads of one
 * process need no lock; on the simulator all ranks share one thread. */
static struct {
    int failures;
    size_t len;
    char text[REPORT_LEN];
} records[TP_CONFORMANCE_RANKS_MAX];

static void records_reset(void) {
    memset(records, 0, sizeof records);
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static int record_valid(int rank) {
    return rank >= 0 && rank < TP_CONFORMANCE_RANKS_MAX;
}

static void record_append(int rank, const char *text) {
    if (!record_valid(rank))
        rank = 0; /* a bad rank is itself a failure worth seeing */
    size_t room = REPORT_LEN - records[rank].len;
    if (room <= 1)
        return;
    int n = snprintf(records[rank].text + records[rank].len, room, "%s", text);
    if (n > 0)
        records[rank].len += (size_t)n < room ? (size_t)n : room - 1;
}

int conf_fail(int rank, const char *file, int line, const char *fmt, ...) {
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    /* tp_errmsg() of the task that failed: the context of the last failing call. */
    const char *em = tp_errmsg();
    char line_text[1024 + TP_ERRMSG_LEN_MAX + 128];
    snprintf(line_text, sizeof line_text, "  rank %d %s:%d: %s; tp_errmsg: \"%s\"\n", rank,
             base_name(file), line, what, em ? em : "(null)");
    record_append(rank, line_text);
    if (record_valid(rank))
        records[rank].failures++;
    else
        records[0].failures++;
    return 0;
}

int conf_check(int ok, int rank, const char *file, int line, const char *expr) {
    if (ok)
        return 1;
    return conf_fail(rank, file, line, "CHECK(%s) failed", expr);
}

int conf_check_status(tp_status got, tp_status want, int rank, const char *file, int line,
                      const char *expr) {
    if (got == want)
        return 1;
    return conf_fail(rank, file, line, "%s returned %s, want %s", expr, tp_status_name(got),
                     tp_status_name(want));
}

int conf_check_int(int64_t a, int64_t b, int rank, const char *file, int line, const char *ea,
                   const char *eb) {
    if (a == b)
        return 1;
    return conf_fail(rank, file, line, "%s == %s failed: %lld != %lld", ea, eb, (long long)a,
                     (long long)b);
}

int conf_check_contains(const char *hay, const char *needle, int rank, const char *file, int line,
                        const char *expr) {
    if (hay && needle && strstr(hay, needle))
        return 1;
    return conf_fail(rank, file, line, "%s = \"%s\" does not contain \"%s\"", expr,
                     hay ? hay : "(null)", needle ? needle : "(null)");
}

int conf_finish(int rank) {
    if (!record_valid(rank))
        return 1;
    /* RREF-18: a case's graceful shutdown finds every rref released. */
    tp_rref_leak *leaks = NULL;
    size_t n = 0;
    if (tp_shutdown_leaks(&leaks, &n) == TP_OK && n > 0)
        conf_fail(rank, __FILE__, __LINE__,
                  "the graceful shutdown found %zu rref leak(s), the first rref %u:%llu fork "
                  "%u:%llu held by rank %u (RREF-18; each is logged at warn)",
                  n, leaks[0].rref_worker, (unsigned long long)leaks[0].rref_n,
                  leaks[0].fork_worker, (unsigned long long)leaks[0].fork_n, leaks[0].holder);
    free(leaks);
    return records[rank].failures;
}

const char *tp_conformance_rank_report(int rank) {
    return record_valid(rank) ? records[rank].text : "";
}

/* ------------------------------------------------------------------------ */
/* Helpers for cases.                                                       */

const char *conf_name(int rank) {
    static const char *const names[TP_CONFORMANCE_RANKS_MAX] = {
        "w0", "w1", "w2",  "w3",  "w4",  "w5",  "w6",  "w7",
        "w8", "w9", "w10", "w11", "w12", "w13", "w14", "w15"};
    return record_valid(rank) ? names[rank] : "w?";
}

tp_options *conf_options(void) {
    return conf_launcher->options(conf_launcher);
}

tp_status conf_init_opts(int rank, int world_size, const tp_options *opts) {
    tp_status st = conf_register_all();
    if (st != TP_OK)
        return st;
    return tp_init_rpc(conf_name(rank), conf_launcher->backend, rank, world_size, opts);
}

tp_status conf_init(int rank, int world_size) {
    tp_options *opts = conf_options();
    tp_status st = conf_init_opts(rank, world_size, opts);
    tp_options_free(opts);
    return st;
}

uint64_t conf_now_ns(void) {
    return conf_launcher->now_ns();
}

double conf_since_s(uint64_t t0_ns) {
    uint64_t now = conf_now_ns();
    return now >= t0_ns ? (double)(now - t0_ns) / 1e9 : 0.0;
}

void conf_crash_self(void) {
    conf_launcher->crash_self();
}

tp_value *conf_ints(size_t n, const int64_t *v) {
    tp_value *list = tp_value_list();
    for (size_t i = 0; i < n && list; i++) {
        tp_value *item = tp_value_int(v[i]);
        if (!item || tp_list_append(list, item) != TP_OK) {
            tp_value_free(item);
            tp_value_free(list);
            list = NULL;
        }
    }
    return list;
}

int64_t conf_int_of(int rank, const tp_value *v, int64_t fallback) {
    int64_t x = fallback;
    if (!v) {
        conf_fail(rank, __FILE__, __LINE__, "expected an int value, got NULL");
        return fallback;
    }
    if (tp_value_get_int(v, &x) != TP_OK) {
        char buf[128];
        tp_value_format(v, buf, sizeof buf);
        conf_fail(rank, __FILE__, __LINE__, "expected an int value, got %s %s",
                  tp_kind_name(tp_value_kind(v)), buf);
        return fallback;
    }
    return x;
}

const char *conf_str_of(int rank, const tp_value *v) {
    const char *s = NULL;
    size_t len = 0;
    if (!v || tp_value_get_str(v, &s, &len) != TP_OK) {
        conf_fail(rank, __FILE__, __LINE__, "expected a str value, got %s",
                  v ? tp_kind_name(tp_value_kind(v)) : "NULL");
        return "";
    }
    return s;
}

tp_status conf_sync(tp_dest dest, const char *fn, tp_value *args, tp_value **result) {
    *result = NULL;
    tp_status st = tp_rpc_sync(dest, fn, args, NULL, TP_TIMEOUT_DEFAULT, result);
    tp_value_free(args);
    return st;
}

tp_status conf_async(tp_dest dest, const char *fn, tp_value *args, tp_future **out) {
    *out = NULL;
    tp_status st = tp_rpc_async(dest, fn, args, NULL, TP_TIMEOUT_DEFAULT, out);
    tp_value_free(args);
    return st;
}

int64_t conf_sync_int(int rank, tp_dest dest, const char *fn, tp_value *args, int64_t fallback) {
    tp_value *res = NULL;
    tp_status st = tp_rpc_sync(dest, fn, args, NULL, TP_TIMEOUT_DEFAULT, &res);
    tp_value_free(args);
    if (st != TP_OK) {
        conf_fail(rank, __FILE__, __LINE__, "rpc_sync '%s' returned %s", fn, tp_status_name(st));
        return fallback;
    }
    int64_t x = conf_int_of(rank, res, fallback);
    tp_value_free(res);
    return x;
}

int64_t conf_poll_int(int rank, tp_dest dest, const char *fn, int64_t want, double max_s) {
    uint64_t t0 = conf_now_ns();
    int64_t x = conf_sync_int(rank, dest, fn, NULL, -1);
    while (x != want && conf_since_s(t0) < max_s) {
        if (tp_sleep(0.01) != TP_OK)
            break;
        x = conf_sync_int(rank, dest, fn, NULL, -1);
    }
    return x;
}

/* ------------------------------------------------------------------------ */
/* The case list and the cmocka group.                                      */

typedef struct case_group {
    const tp_conformance_case *cases;
    const size_t *count;
} case_group;

static const case_group groups[] = {
    {conf_cases_lifecycle, &conf_cases_lifecycle_count},
    {conf_cases_calls, &conf_cases_calls_count},
    {conf_cases_futures, &conf_cases_futures_count},
    {conf_cases_async, &conf_cases_async_count},
    {conf_cases_timeouts, &conf_cases_timeouts_count},
    {conf_cases_rref, &conf_cases_rref_count},
    {conf_cases_shutdown, &conf_cases_shutdown_count},
    {conf_cases_faults, &conf_cases_faults_count},
    {conf_cases_flow, &conf_cases_flow_count},
    {conf_cases_errors, &conf_cases_errors_count}, /* last: errors_null_out_pointers */
};
#define NGROUPS (sizeof groups / sizeof groups[0])

static tp_conformance_case *all_cases;
static size_t all_count;

const tp_conformance_case *tp_conformance_cases(size_t *count) {
    if (!all_cases) {
        size_t n = 0;
        for (size_t g = 0; g < NGROUPS; g++)
            n += *groups[g].count;
        all_cases = calloc(n ? n : 1, sizeof *all_cases);
        if (!all_cases) {
            *count = 0;
            return NULL;
        }
        for (size_t g = 0; g < NGROUPS; g++)
            for (size_t i = 0; i < *groups[g].count; i++)
                all_cases[all_count++] = groups[g].cases[i];
    }
    *count = all_count;
    return all_cases;
}

static void run_case(void **state) {
    const tp_conformance_case *c = *state;
    records_reset();
    conf_functions_reset();
    char why[4096] = "";
    int rc = conf_launcher->run(conf_launcher, c->world_size, c->program, why, sizeof why);
    int failures = 0;
    size_t report_len = strlen(why) + 64;
    for (int r = 0; r < TP_CONFORMANCE_RANKS_MAX; r++) {
        failures += records[r].failures;
        report_len += records[r].len;
    }
    if (rc == 0 && failures == 0)
        return;
    char *report = malloc(report_len);
    if (!report)
        fail_msg("%s: failed (and no memory for the report)", c->name);
    size_t off = (size_t)snprintf(report, report_len, "%s", why);
    for (int r = 0; r < TP_CONFORMANCE_RANKS_MAX; r++)
        off += (size_t)snprintf(report + off, report_len - off, "%s", records[r].text);
    print_error("case %s [%s] on %s failed:\n", c->name, c->spec_rules, conf_launcher->backend);
    /* print_error formats into a small buffer: print the report in pieces. */
    off = strlen(report);
    for (size_t at = 0; at < off; at += 512)
        print_error("%.*s", (int)(off - at < 512 ? off - at : 512), report + at);
    free(report);
    fail();
}

static int matches(const char *name, int argc, char **argv) {
    int filters = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-')
            continue;
        filters++;
        if (strstr(name, argv[i]))
            return 1;
    }
    return filters == 0;
}

int tp_conformance_main(int argc, char **argv, const tp_conformance_launcher *l) {
    conf_launcher = l;
    size_t n = 0;
    const tp_conformance_case *cases = tp_conformance_cases(&n);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--list") == 0) {
            for (size_t k = 0; k < n; k++)
                printf("%-44s %d  %s\n", cases[k].name, cases[k].world_size, cases[k].spec_rules);
            return 0;
        }
    }
    struct CMUnitTest *tests = calloc(n ? n : 1, sizeof *tests);
    if (!tests)
        return 1;
    size_t selected = 0;
    for (size_t k = 0; k < n; k++) {
        if (!matches(cases[k].name, argc, argv))
            continue;
        tests[selected].name = cases[k].name;
        tests[selected].test_func = run_case;
        tests[selected].initial_state = (void *)&cases[k];
        selected++;
    }
    if (selected == 0) {
        fprintf(stderr, "conformance: no case matches the filter\n");
        free(tests);
        return 1;
    }
    char group[64];
    snprintf(group, sizeof group, "conformance_%s", l->backend);
    int failed = _cmocka_run_group_tests(group, tests, selected, NULL, NULL);
    free(tests);
    free(all_cases);
    all_cases = NULL;
    all_count = 0;
    return failed;
}
