/*
 * sim_trace.c: the canonical trace (spec/sim.md SIM-6).
 *
 * Every observable step is one text line "t=<ns> <event> <fields>\n" with
 * only integers, fixed words and the scenario's own notes in it: no
 * pointers, nothing read from unordered state. Each line is folded into a
 * 64-bit FNV-1a hash, so two runs agree on the hash exactly when they agree
 * on every line, and written to cfg.trace when one is set.
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

void tpi_sim_vtrace(tp_sim *sim, const char *fmt, va_list ap) {
    char line[TPI_SIM_TRACE_LINE_MAX];
    size_t n = tpi_format(line, sizeof line, "t=%llu ", (unsigned long long)sim->now_ns);
    n += tpi_vformat(line + n, sizeof line - n - 1, fmt, ap);
    /* One event, one line: a newline inside a note would fake a second. */
    for (size_t i = 0; i < n; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';
    line[n++] = '\n';
    line[n] = '\0';
    sim->trace_hash = tpi_sim_fnv1a(sim->trace_hash, line, n);
    sim->trace_lines++;
    if (sim->cfg.trace)
        fwrite(line, 1, n, sim->cfg.trace);
}

void tpi_sim_trace(tp_sim *sim, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tpi_sim_vtrace(sim, fmt, ap);
    va_end(ap);
}
