/*
 * sim_trace.c: the canonical trace (spec/sim.md SIM-6).
 *
 * Every observable step is one record: a format and its arguments, with
 * only integers, fixed words and the scenario's own notes in it: no
 * pointers, nothing read from unordered state. Each record is folded into a
 * 64-bit FNV-1a hash in binary (the time, the format's bytes, each
 * argument), so two runs agree on the hash exactly when they agree on every
 * record, and nothing is formatted unless a text trace is wanted: then the
 * record is also written to cfg.trace as the line "t=<ns> <event> <fields>".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"

uint64_t tpi_sim_fnv1a(uint64_t hash, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        hash ^= p[i];
        hash *= TPI_FNV_PRIME;
    }
    return hash;
}

/*
 * Speed (the hash is folded for every record of every run, and at a few
 * hundred bytes a round trip it was a fifth of a simulated call's cost):
 * the same FNV-1a, computed with fewer dependent multiplications.
 *
 * Folding a zero byte is a bare multiplication by the prime, so k zero
 * bytes are one multiplication by prime^k. And XOR with a byte changes only
 * the low 8 bits: h ^ b = h + d with d = (l ^ b) - l, l = h & 0xff; so
 * folding n bytes gives h * prime^n + sum(d_i * prime^(n-i)), and every d_i
 * depends only on the bytes and on l, since the low 8 bits of a product
 * depend only on the low 8 bits of its factors. For a fixed string (a
 * record's format) the sum is a function of l alone: 256 values, each
 * computed the first time it is needed. The hash is bit for bit the one of
 * the byte loop (SIM-6).
 */
static const uint64_t fnv_pow[9] = {
    1ull,
    TPI_FNV_PRIME,
    TPI_FNV_PRIME * TPI_FNV_PRIME,
    TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME,
    TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME,
    TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME,
    TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME *
        TPI_FNV_PRIME,
    TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME *
        TPI_FNV_PRIME * TPI_FNV_PRIME,
    TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME *
        TPI_FNV_PRIME * TPI_FNV_PRIME * TPI_FNV_PRIME,
};

/* Folds v as 8 little-endian bytes: the same on every platform. The zero
 * bytes above the highest nonzero one are one multiplication. */
static uint64_t fold_u64(uint64_t hash, uint64_t v) {
    int i = 0;
    for (; v != 0; i++, v >>= 8) {
        hash ^= v & 0xff;
        hash *= TPI_FNV_PRIME;
    }
    return hash * fnv_pow[8 - i];
}

/* ---- Formats, folded by table ---------------------------------------------------------- */

/* A record's conversions, as fold_binary reads its arguments. */
typedef enum conv {
    CONV_INT,       /* %d */
    CONV_UNSIGNED,  /* %u %x */
    CONV_SIZE,      /* %zu */
    CONV_ULL,       /* %llu %llx */
    CONV_LL,        /* %lld */
    CONV_STRING,    /* %s */
} conv;

#define FMT_SLOTS 64     /* formats kept per thread: the simulator has about 60 */
#define FMT_LEN_MAX 127  /* longer formats are folded byte by byte */
#define FMT_CONV_MAX 16  /* and so are those with more conversions */

typedef struct fmt_slot {
    const char *fmt; /* the format seen at this slot; NULL: empty */
    uint32_t len;    /* its length, without the NUL */
    int binary;      /* only conversions fold_binary knows: else text */
    uint8_t nconv;
    uint8_t conv[FMT_CONV_MAX];
    char text[FMT_LEN_MAX + 1]; /* its bytes: a format need not be a literal */
    uint64_t pow;               /* prime^(len + 1) */
    uint64_t filled[4];         /* which add[] are computed */
    uint64_t add[256];          /* by the hash's low byte: see above */
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
        sim->fmt_cache = calloc(1, sizeof(fmt_cache)); /* NULL: byte by byte */
    return sim->fmt_cache;
}

void tpi_sim_trace_free(tp_sim *sim) {
    free(sim->fmt_cache);
    sim->fmt_cache = NULL;
}

/* Parses fmt's conversions into sl; 0 when one is not a binary one. */
static int parse_convs(fmt_slot *sl, const char *fmt) {
    sl->nconv = 0;
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
        if (sl->nconv == FMT_CONV_MAX)
            return 0;
        sl->conv[sl->nconv++] = (uint8_t)c;
    }
    return 1;
}

/* fmt's slot, filled if it held another format; NULL when fmt is not kept
 * (too long, or no cache). */
static fmt_slot *slot_for(tp_sim *sim, const char *fmt) {
    fmt_cache *c = cache_get(sim);
    if (!c)
        return NULL;
    uintptr_t u = (uintptr_t)fmt;
    fmt_slot *sl = &c->slot[((u >> 3) * 0x9e3779b97f4a7c15ull) >> 58];
    _Static_assert(FMT_SLOTS == 64, "the slot is the hash's top 6 bits");
    if (sl->fmt == fmt && memcmp(sl->text, fmt, (size_t)sl->len + 1) == 0)
        return sl;
    size_t len = strnlen(fmt, FMT_LEN_MAX + 1);
    if (len > FMT_LEN_MAX)
        return NULL;
    sl->fmt = fmt;
    sl->len = (uint32_t)len;
    memcpy(sl->text, fmt, len + 1);
    sl->binary = parse_convs(sl, fmt);
    uint64_t pow = 1;
    for (size_t i = 0; i <= len; i++)
        pow *= TPI_FNV_PRIME;
    sl->pow = pow;
    memset(sl->filled, 0, sizeof sl->filled);
    return sl;
}

/* The fold of sl's format with its NUL, from hash. */
static uint64_t fold_fmt(fmt_slot *sl, uint64_t hash) {
    unsigned l = (unsigned)(hash & 0xff);
    uint64_t bit = 1ull << (l & 63);
    if (!(sl->filled[l >> 6] & bit)) {
        sl->add[l] = tpi_sim_fnv1a(l, sl->text, (size_t)sl->len + 1) - (uint64_t)l * sl->pow;
        sl->filled[l >> 6] |= bit;
    }
    return hash * sl->pow + sl->add[l];
}

/*
 * Folds one record into the hash without formatting it: the time, the
 * format string's bytes, then each argument in binary. The conversions the
 * simulator uses are %d %u %x %llu %lld %llx %zu %s and %%; 0 for any other,
 * and the caller hashes the formatted text instead.
 */
static int fold_binary(tp_sim *sim, uint64_t *hash, const char *fmt, va_list ap) {
    fmt_slot *sl = slot_for(sim, fmt);
    if (sl && !sl->binary)
        return 0;
    uint64_t h = fold_u64(*hash, sim->now_ns);
    if (sl) {
        h = fold_fmt(sl, h);
        for (uint32_t i = 0; i < sl->nconv; i++) {
            switch ((conv)sl->conv[i]) {
            case CONV_INT:
                h = fold_u64(h, (uint64_t)(int64_t)va_arg(ap, int));
                break;
            case CONV_UNSIGNED:
                h = fold_u64(h, va_arg(ap, unsigned));
                break;
            case CONV_SIZE:
                h = fold_u64(h, va_arg(ap, size_t));
                break;
            case CONV_ULL:
                h = fold_u64(h, va_arg(ap, unsigned long long));
                break;
            case CONV_LL:
                h = fold_u64(h, (uint64_t)va_arg(ap, long long));
                break;
            case CONV_STRING: {
                const char *str = va_arg(ap, const char *);
                h = tpi_sim_fnv1a(h, str, strlen(str) + 1);
                break;
            }
            }
        }
        *hash = h;
        return 1;
    }
    h = tpi_sim_fnv1a(h, fmt, strlen(fmt) + 1);
    for (const char *p = fmt; *p; p++) {
        if (*p != '%')
            continue;
        p++;
        if (*p == '%')
            continue;
        if (*p == 'd') {
            h = fold_u64(h, (uint64_t)(int64_t)va_arg(ap, int));
        } else if (*p == 'u' || *p == 'x') {
            h = fold_u64(h, va_arg(ap, unsigned));
        } else if (p[0] == 'z' && p[1] == 'u') {
            h = fold_u64(h, va_arg(ap, size_t));
            p++;
        } else if (p[0] == 'l' && p[1] == 'l' && (p[2] == 'u' || p[2] == 'x')) {
            h = fold_u64(h, va_arg(ap, unsigned long long));
            p += 2;
        } else if (p[0] == 'l' && p[1] == 'l' && p[2] == 'd') {
            h = fold_u64(h, (uint64_t)va_arg(ap, long long));
            p += 2;
        } else if (*p == 's') {
            const char *str = va_arg(ap, const char *);
            h = tpi_sim_fnv1a(h, str, strlen(str) + 1);
        } else {
            return 0;
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
        sim->trace_hash = tpi_sim_fnv1a(sim->trace_hash, line, n);
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
