/*
 * sim_trace.c: the canonical trace (spec/sim.md SIM-6).
 *
 * Every observable step is one record: a format and its arguments, with
 * only integers, fixed words and the scenario's own notes in it: no
 * pointers, nothing read from unordered state. Each record is folded into a
 * 64-bit hash in binary, a word at a time (the time, the format's digest,
 * each argument), so two runs agree on the hash exactly when they agree on
 * every record, and nothing is formatted unless a text trace is wanted:
 * then the record is also written to cfg.trace as the line
 * "t=<ns> <event> <fields>".
 *
 * Why words and not FNV-1a's bytes: the hash is folded for every record of
 * every run, and a byte-wise fold is one dependent multiplication per byte
 * (a fifth of a simulated call's cost at a few hundred bytes a round trip).
 * A word costs one multiplication and a shift, and each step is a bijection
 * of the state for a given word, so a record that differs is never lost
 * unless a later one differs too and happens to cancel it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"

#define HASH_MUL 0x9e3779b97f4a7c15ull /* odd: multiplying is a bijection */

/* Folds one 64-bit word (SIM-6). */
static inline uint64_t fold_word(uint64_t hash, uint64_t w) {
    hash = (hash ^ w) * HASH_MUL;
    return hash ^ (hash >> 29);
}

uint64_t tpi_sim_hash_bytes(uint64_t hash, const void *data, size_t len) {
    const unsigned char *p = data;
    hash = fold_word(hash, (uint64_t)len);
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t w = 0;
        for (int i = 0; i < 8; i++) /* little-endian on every platform */
            w |= (uint64_t)p[i] << (8 * i);
        hash = fold_word(hash, w);
    }
    if (len) {
        uint64_t w = 0;
        for (size_t i = 0; i < len; i++)
            w |= (uint64_t)p[i] << (8 * i);
        hash = fold_word(hash, w);
    }
    return hash;
}

static uint64_t hash_string(uint64_t hash, const char *s) {
    return tpi_sim_hash_bytes(hash, s, strlen(s));
}

/* ---- Formats, parsed once ---------------------------------------------------------- */

/* A record's conversions, as fold_binary reads its arguments. */
typedef enum conv {
    CONV_INT,       /* %d */
    CONV_UNSIGNED,  /* %u %x */
    CONV_SIZE,      /* %zu */
    CONV_ULL,       /* %llu %llx */
    CONV_LL,        /* %lld */
    CONV_STRING,    /* %s */
} conv;

#define FMT_SLOTS 256    /* formats kept per simulation: the simulator has about 60 */
#define FMT_PROBES 8     /* slots looked at from a format's home slot */
#define FMT_LEN_MAX 127  /* longer formats are parsed at every record */
#define FMT_CONV_MAX 16  /* and so are those with more conversions */

typedef struct fmt_slot {
    const char *fmt; /* the format seen at this slot; NULL: empty */
    uint32_t len;    /* its length, without the NUL */
    int binary;      /* only conversions fold_binary knows: else text */
    uint8_t nconv;
    uint8_t conv[FMT_CONV_MAX];
    char text[FMT_LEN_MAX + 1]; /* its bytes: a format need not be a literal */
    uint64_t digest;            /* tpi_sim_hash_bytes of the text, from 0 */
} fmt_slot;

typedef struct fmt_cache {
    fmt_slot slot[FMT_SLOTS];
} fmt_cache;

/* One cache per simulation, freed with it (tp_sim_free): worlds may run on
 * several threads at once, and the simulator keeps no state of its own
 * outside a tp_sim (check-rules: no threads or thread locals in sim/). It
 * only makes the hash faster: its answers are the same whatever the
 * addresses of the formats, which only choose a slot. */
static fmt_cache *cache_get(tp_sim *sim) {
    if (!sim->fmt_cache)
        sim->fmt_cache = calloc(1, sizeof(fmt_cache)); /* NULL: parsed every time */
    return sim->fmt_cache;
}

void tpi_sim_trace_free(tp_sim *sim) {
    free(sim->fmt_cache);
    sim->fmt_cache = NULL;
}

/* Parses fmt's conversions into conv[] (at most FMT_CONV_MAX); 0 when one
 * is not a binary one or there are more. */
static int parse_convs(const char *fmt, uint8_t *convs, uint8_t *nconv) {
    *nconv = 0;
    for (const char *p = fmt; *p; p++) {
        if (*p != '%')
            continue;
        p++;
        conv c;
        if (*p == '%')
            continue;
        if (*p == 'd') {
            c = CONV_INT;
        } else if (*p == 'u' || *p == 'x') {
            c = CONV_UNSIGNED;
        } else if (p[0] == 'z' && p[1] == 'u') {
            c = CONV_SIZE;
            p++;
        } else if (p[0] == 'l' && p[1] == 'l' && (p[2] == 'u' || p[2] == 'x')) {
            c = CONV_ULL;
            p += 2;
        } else if (p[0] == 'l' && p[1] == 'l' && p[2] == 'd') {
            c = CONV_LL;
            p += 2;
        } else if (*p == 's') {
            c = CONV_STRING;
        } else {
            return 0;
        }
        if (*nconv == FMT_CONV_MAX)
            return 0;
        convs[(*nconv)++] = (uint8_t)c;
    }
    return 1;
}

/* fmt's slot, filled if it held another format; NULL when fmt is not kept
 * (too long, or no cache). Probed from the address's home slot, so that two
 * hot formats whose homes collide do not evict each other at every record. */
static fmt_slot *slot_for(tp_sim *sim, const char *fmt) {
    fmt_cache *c = cache_get(sim);
    if (!c)
        return NULL;
    uintptr_t u = (uintptr_t)fmt;
    size_t home = (size_t)(((u >> 3) * 0x9e3779b97f4a7c15ull) >> 56);
    _Static_assert(FMT_SLOTS == 256, "the home slot is the hash's top 8 bits");
    fmt_slot *sl = NULL;
    for (size_t i = 0; i < FMT_PROBES; i++) {
        fmt_slot *at = &c->slot[(home + i) % FMT_SLOTS];
        if (at->fmt == fmt && memcmp(at->text, fmt, (size_t)at->len + 1) == 0)
            return at;
        if (!sl && (!at->fmt || at->fmt == fmt))
            sl = at; /* empty, or this address with other text: refilled */
    }
    if (!sl)
        sl = &c->slot[home]; /* all taken: the home slot's format goes */
    size_t len = strnlen(fmt, FMT_LEN_MAX + 1);
    if (len > FMT_LEN_MAX)
        return NULL;
    sl->fmt = fmt;
    sl->len = (uint32_t)len;
    memcpy(sl->text, fmt, len + 1);
    sl->binary = parse_convs(fmt, sl->conv, &sl->nconv);
    sl->digest = tpi_sim_hash_bytes(0, fmt, len);
    return sl;
}

/*
 * Folds one record into the hash without formatting it: the time, the
 * format's digest, then each argument as a word (strings by their bytes).
 * The conversions the simulator uses are %d %u %x %llu %lld %llx %zu %s and
 * %%; 0 for any other (or too many), and the caller folds the text instead.
 */
static int fold_binary(tp_sim *sim, uint64_t *hash, const char *fmt, va_list ap) {
    fmt_slot *sl = slot_for(sim, fmt);
    uint8_t parsed[FMT_CONV_MAX], nconv;
    const uint8_t *convs = parsed;
    uint64_t digest;
    if (sl) {
        if (!sl->binary)
            return 0;
        convs = sl->conv;
        nconv = sl->nconv;
        digest = sl->digest;
    } else {
        if (!parse_convs(fmt, parsed, &nconv))
            return 0;
        digest = tpi_sim_hash_bytes(0, fmt, strlen(fmt));
    }
    uint64_t h = fold_word(fold_word(*hash, sim->now_ns), digest);
    for (uint32_t i = 0; i < nconv; i++) {
        switch ((conv)convs[i]) {
        case CONV_INT:
            h = fold_word(h, (uint64_t)(int64_t)va_arg(ap, int));
            break;
        case CONV_UNSIGNED:
            h = fold_word(h, va_arg(ap, unsigned));
            break;
        case CONV_SIZE:
            h = fold_word(h, va_arg(ap, size_t));
            break;
        case CONV_ULL:
            h = fold_word(h, va_arg(ap, unsigned long long));
            break;
        case CONV_LL:
            h = fold_word(h, (uint64_t)va_arg(ap, long long));
            break;
        case CONV_STRING:
            h = hash_string(h, va_arg(ap, const char *));
            break;
        }
    }
    *hash = h;
    return 1;
}

static size_t format_line(tp_sim *sim, char *line, size_t size, const char *fmt, va_list ap) {
    size_t n = tpi_format(line, size, "t=%llu ", (unsigned long long)sim->now_ns);
    n += tpi_vformat(line + n, size - n - 1, fmt, ap);
    /* One event, one line: a newline inside a note would fake a second. */
    for (size_t i = 0; i < n; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';
    line[n++] = '\n';
    line[n] = '\0';
    return n;
}

void tpi_sim_vtrace(tp_sim *sim, const char *fmt, va_list ap) {
    char line[TPI_SIM_TRACE_LINE_MAX];
    va_list copy;
    va_copy(copy, ap);
    if (!fold_binary(sim, &sim->trace_hash, fmt, copy)) {
        va_end(copy);
        va_copy(copy, ap);
        size_t n = format_line(sim, line, sizeof line, fmt, copy);
        sim->trace_hash = tpi_sim_hash_bytes(sim->trace_hash, line, n);
    }
    va_end(copy);
    sim->trace_lines++;
    if (sim->cfg.trace) { /* the text only when someone reads it */
        size_t n = format_line(sim, line, sizeof line, fmt, ap);
        fwrite(line, 1, n, sim->cfg.trace);
    }
}

void tpi_sim_trace(tp_sim *sim, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tpi_sim_vtrace(sim, fmt, ap);
    va_end(ap);
}
