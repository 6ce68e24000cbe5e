/*
 * fuzz_fault_plan.c: any bytes as a simulator fault plan (spec/sim.md SIM-5),
 * the text tpsim --faults and tp_sim_load_faults read.
 *
 * The input, up to its first NUL, is the plan's text. Properties:
 * - nothing crashes, leaks or reads out of bounds (under ASan);
 * - a refused plan says "fault plan line N: why" and hands back no lines;
 * - an accepted plan's lines have known kinds, increasing line numbers and
 *   the bounds the parser promises (chaos rates per million, a latency
 *   distribution, a host or '*');
 * - printed back (tpi_sim_faults_format), one fault a line, it parses to the
 *   same faults, and printing those gives the same text (a fixed point);
 * - loading it into a simulation of 4 hosts refuses every plan the parser
 *   refuses, with the same message; what the loader refuses beyond that
 *   (hosts out of range, empty windows) it says in the same form; it refuses
 *   a plan past a documented count (64 restarts, 4096 delays, pauses, store
 *   faults or link rules); a refused plan leaves the simulation as it was
 *   (its trace hash, which every applied fault changes, is unchanged).
 * A violated property aborts, which the fuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/sim_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define KINDS_MAX 16 /* the parser's fault kinds are 1..16 (sim_faults.c) */
static void check(int ok, const char *what, const char *detail) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_fault_plan: property violated: %s (%s)\n", what, detail);
    abort();
}

/* The kind number the parser gives a line; learnt by parsing, so the
 * harness does not copy sim_faults.c's enum. */
static int kind_of(const char *line) {
    tpi_sim_fault_line *l = NULL;
    size_t n = 0;
    char err[TP_ERRMSG_LEN_MAX];
    check(tpi_sim_faults_parse(line, &l, &n, err, sizeof err) == TP_OK && n == 1,
          "a known line parses", err);
    int kind = l[0].kind;
    free(l);
    return kind;
}
#define LINE_MAX_ 160

static int same_fault(const tpi_sim_fault_line *x, const tpi_sim_fault_line *y) {
    return x->kind == y->kind && x->a == y->a && x->b == y->b && x->t0_ns == y->t0_ns &&
           x->t1_ns == y->t1_ns && x->extra_ns == y->extra_ns && x->per_million == y->per_million;
}

/* The plan printed back, one fault a line; malloc'd. */
static char *print_plan(const tpi_sim_fault_line *l, size_t n) {
    char *text = malloc(n * (LINE_MAX_ + 1) + 1);
    check(text != NULL, "out of memory", "print");
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = tpi_sim_faults_format(&l[i], text + at, LINE_MAX_);
        check(len > 0 && len < LINE_MAX_ - 1, "a printed fault fits a line", text + at);
        at += len;
        text[at++] = '\n';
    }
    text[at] = '\0';
    return text;
}

static void check_bounds(const tpi_sim_fault_line *l, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, "fault %zu", i);
        check(l[i].kind >= 1 && l[i].kind <= KINDS_MAX, "a fault has a known kind", what);
        check(l[i].line >= 1 && (i == 0 || l[i].line > l[i - 1].line), "line numbers increase",
              what);
    }
}

/* 1 when the plan has more of a counted kind than a simulation takes. */
static int over_limits(const tpi_sim_fault_line *l, size_t n) {
    static int K_DELAY, K_PAUSE, K_LATENCY, K_BANDWIDTH, K_STOREDOWN, K_STORESLOW, K_RESTART;
    if (!K_DELAY) {
        K_DELAY = kind_of("delay 0 1 0 1 1");
        K_PAUSE = kind_of("pause 0 0 1");
        K_LATENCY = kind_of("latency * * 0 1 fixed");
        K_BANDWIDTH = kind_of("bandwidth * * 1");
        K_STOREDOWN = kind_of("storedown 0 1");
        K_STORESLOW = kind_of("storeslow 0 1 1");
        K_RESTART = kind_of("restart 0 1");
    }
    uint32_t delays = 0, restarts = 0, pauses = 0, store = 0, rules = 0;
    for (size_t i = 0; i < n; i++) {
        delays += l[i].kind == K_DELAY;
        restarts += l[i].kind == K_RESTART;
        pauses += l[i].kind == K_PAUSE;
        store += l[i].kind == K_STOREDOWN || l[i].kind == K_STORESLOW;
        rules += l[i].kind == K_LATENCY || l[i].kind == K_BANDWIDTH;
    }
    return delays > TPI_SIM_DELAYS_MAX || restarts > TPI_SIM_RESTARTS_MAX ||
           pauses > TPI_SIM_DELAYS_MAX || store > TPI_SIM_DELAYS_MAX || rules > TPI_SIM_DELAYS_MAX;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';

    char err[TP_ERRMSG_LEN_MAX] = "";
    static tpi_sim_fault_line sentinel;
    tpi_sim_fault_line *lines = &sentinel; /* the parser must overwrite both */
    size_t n = 99;
    tp_status st = tpi_sim_faults_parse(text, &lines, &n, err, sizeof err);
    int over = 0;
    if (st != TP_OK) {
        check(strncmp(err, "fault plan line ", 16) == 0, "a refusal names its line", err);
        check(lines == NULL && n == 0, "a refused plan hands back no lines", err);
    } else {
        check(n == 0 || lines != NULL, "an accepted plan hands back its lines", "NULL");
        check_bounds(lines, n);
        over = over_limits(lines, n);
        char *printed = print_plan(lines, n);
        tpi_sim_fault_line *again = NULL;
        size_t n2 = 0;
        char err2[TP_ERRMSG_LEN_MAX] = "";
        check(tpi_sim_faults_parse(printed, &again, &n2, err2, sizeof err2) == TP_OK,
              "a printed plan parses", err2);
        check(n2 == n, "a printed plan has as many faults", printed);
        for (size_t i = 0; i < n; i++)
            check(same_fault(&lines[i], &again[i]), "a printed fault parses to itself", printed);
        char *reprinted = print_plan(again, n2);
        check(strcmp(printed, reprinted) == 0, "printing is a fixed point", reprinted);
        free(reprinted);
        free(again);
        free(printed);
        free(lines);
    }

    /* The loader: the parser's verdict first, then its own checks. */
    tp_sim_config cfg = {.hosts = 4, .seed = 1};
    tp_sim *sim = NULL;
    if (tp_sim_new(&cfg, &sim) == TP_OK) {
        char lerr[TP_ERRMSG_LEN_MAX] = "";
        uint64_t hash = tp_sim_trace_hash(sim);
        tp_status lst = tp_sim_load_faults(sim, text, lerr, sizeof lerr);
        if (st != TP_OK)
            check(lst == st && strcmp(lerr, err) == 0, "the loader refuses as the parser", lerr);
        else if (lst != TP_OK)
            check(strncmp(lerr, "fault plan line ", 16) == 0, "a refusal names its line", lerr);
        check(lst != TP_OK || !over, "a plan past a count limit is refused", "limits");
        check(lst == TP_OK || tp_sim_trace_hash(sim) == hash,
              "a refused plan leaves the simulation as it was", lerr);
        tp_sim_free(sim);
    }
    free(text);
    return 0;
}
