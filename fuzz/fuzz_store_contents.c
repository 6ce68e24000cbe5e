/*
 * fuzz_store_contents.c: any bytes as a value another process wrote to the
 * rendezvous store, read back at init and rejoin (spec/lifecycle.md INIT-4..7,
 * spec/rejoin.md REJOIN-1..3). A store row crossed a trust boundary: a
 * crashed, older or hostile worker may have written anything.
 *
 * The input, up to its first NUL (the store hands back NUL-terminated values),
 * is read as each kind of value the core parses:
 *   "g<gen>/init/error"    "<status name>\t<message>"   tpi_outcome_parse
 *   "g<gen>/init/rank/<r>" "<name>\t<credit>\t<address>"          tpi_rank_entry_parse
 *   "g<gen>/inc/<r>"       "<k>\t<address>"             tpi_inc_parse
 *   "g<gen>/init/world_size", and a rank after a scanned key's prefix:
 *                          "%u"                         tpi_parse_index
 * Properties:
 * - nothing crashes, leaks or reads out of bounds (under ASan);
 * - an outcome is TP_OK only when it says so ("TP_OK\t..."), else a real
 *   status, TP_ESTORE when unreadable; a readable one, written again the way
 *   publish_outcome writes it, gives the same bytes; every status written
 *   with this input as its message reads back as that status and message;
 * - a rank entry is taken only with a name of 1..TP_NAME_LEN_MAX bytes
 *   before its first tab and a credit within its bounds (FLOW-6), and name,
 *   credit and address joined by tabs give the input back; a refused one
 *   is left as it was;
 * - an incarnation is taken only in 1..TPI_INCARNATION_MAX with an address,
 *   and "%u\t%s" of what was read gives the input back;
 * - an index is below its limit and prints back as the input.
 * A violated property aborts, which the fuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what, const char *detail) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_store_contents: property violated: %s (%.200s)\n", what, detail);
    abort();
}

static char *dup_text(const char *s) {
    char *d = strdup(s);
    check(d != NULL, "out of memory", "strdup");
    return d;
}

/* "a\tb" as the core writes it, malloc'd. */
static char *join(const char *a, const char *b) {
    size_t n = strlen(a) + 1 + strlen(b) + 1;
    char *s = malloc(n);
    check(s != NULL, "out of memory", "join");
    snprintf(s, n, "%s\t%s", a, b);
    return s;
}

static void outcome(const char *v) {
    char *copy = dup_text(v);
    const char *msg = NULL;
    tp_status code = tpi_outcome_parse(copy, &msg);
    check((int)code >= 0 && (int)code < TP_STATUS_COUNT_, "an outcome is a status", v);
    check((code == TP_OK) == (strncmp(v, "TP_OK\t", 6) == 0), "TP_OK only when it says so", v);
    check(msg >= copy && msg <= copy + strlen(v), "the message is in the value", v);
    const char *tab = strchr(v, '\t');
    size_t name_len = tab ? (size_t)(tab - v) : 0;
    int named = tab && name_len == strlen(tp_status_name(code)) &&
                strncmp(v, tp_status_name(code), name_len) == 0;
    check(named || code == TP_ESTORE, "an unreadable outcome is the store's fault", v);
    if (named) {
        char *again = join(tp_status_name(code), msg);
        check(strcmp(again, v) == 0, "a readable outcome is written back the same", v);
        free(again);
    }
    free(copy);

    /* What publish_outcome writes, with this input as the message. */
    for (int i = 0; i < TP_STATUS_COUNT_; i++) {
        char *w = join(tp_status_name((tp_status)i), v);
        code = tpi_outcome_parse(w, &msg);
        check(code == (tp_status)i && strcmp(msg, v) == 0, "a written outcome reads back",
              tp_status_name((tp_status)i));
        free(w);
    }
}

static void rank_entry(const char *v) {
    char *copy = dup_text(v);
    const char *addr = NULL;
    uint64_t credit = 0;
    int ok = tpi_rank_entry_parse(copy, &credit, &addr);
    if (!ok) {
        check(strcmp(copy, v) == 0, "a refused rank entry is left as it was", v);
    } else {
        size_t n = strlen(copy);
        check(n >= 1 && n <= TP_NAME_LEN_MAX && !strchr(copy, '\t'), "a name fits", v);
        check(credit >= TPI_INFLIGHT_BYTES_MIN && credit <= TPI_INFLIGHT_BYTES_MAX, "a credit fits", v);
        char num[32];
        snprintf(num, sizeof num, "%llu", (unsigned long long)credit);
        char *tail = join(num, addr);
        char *again = join(copy, tail);
        check(strcmp(again, v) == 0, "name, credit, address give the entry back", v);
        free(again);
        free(tail);
    }
    free(copy);
}

static void incarnation(const char *v) {
    uint32_t k = 0;
    const char *addr = NULL;
    if (!tpi_inc_parse(v, &k, &addr))
        return;
    check(k >= 1 && k <= TPI_INCARNATION_MAX, "an incarnation is in range", v);
    check(addr > v && addr <= v + strlen(v) && *addr, "an incarnation has an address", v);
    char num[16];
    snprintf(num, sizeof num, "%u", k);
    char *again = join(num, addr);
    check(strcmp(again, v) == 0, "an incarnation is written back the same", v);
    free(again);
}

static void index_of(const char *v, uint32_t limit) {
    uint32_t r = UINT32_MAX;
    if (!tpi_parse_index(v, limit, &r))
        return;
    check(r < limit, "an index is below its limit", v);
    char again[16];
    snprintf(again, sizeof again, "%u", r);
    check(strcmp(again, v) == 0, "an index prints back", v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *v = malloc(size + 1);
    if (!v)
        return 0;
    memcpy(v, data, size);
    v[size] = '\0';
    outcome(v);
    rank_entry(v);
    incarnation(v);
    index_of(v, TP_WORLD_SIZE_MAX + 1); /* init/world_size at rejoin */
    index_of(v, TPI_INCARNATION_MAX + 1);
    index_of(v, 3); /* a rank after a scanned key's prefix, in a world of 3 */
    free(v);
    return 0;
}
