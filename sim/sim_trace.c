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

/* Folds v as 8 little-endian bytes: the same on every platform. */
static uint64_t fold_u64(uint64_t hash, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        hash ^= (uint8_t)(v >> (8 * i));
        hash *= TPI_FNV_PRIME;
    }
    return hash;
}

/*
 * Folds one record into the hash without formatting it: the time, the
 * format string's bytes, then each argument in binary. The conversions the
 * simulator uses are %d %u %x %llu %lld %llx %zu %s and %%; 0 for any other,
 * and the caller hashes the formatted text instead.
 */
static int fold_binary(tp_sim *sim, uint64_t *hash, const char *fmt, va_list ap) {
    uint64_t h = fold_u64(*hash, sim->now_ns);
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
