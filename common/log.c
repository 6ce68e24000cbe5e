/*
 * log.c: the library's log (spec/api.md LOG-1..3). The level and the
 * callback are process-wide atomics: any thread logs without a lock. The
 * default sink writes one line per message with one stdio call, so lines of
 * different threads do not mix.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "limits.h"
#include "log.h"

#define LEVEL_UNSET 0

static atomic_int level_now = LEVEL_UNSET;
static _Atomic(tp_log_fn) sink_fn;
static _Atomic(void *) sink_ud;

static const char *const level_names[] = {"", "error", "warn", "info", "debug"};

/* LOG-1: TP_LOG, read once; unknown text keeps the default (and says so). */
static int level_from_env(void) {
    const char *v = getenv("TP_LOG");
    if (!v || !*v)
        return TP_LOG_WARN;
    for (int l = TP_LOG_ERROR; l <= TP_LOG_DEBUG; l++)
        if (strcmp(v, level_names[l]) == 0)
            return l;
    fprintf(stderr,
            "tensorplay-rpc: warn: TP_LOG='%.32s' is not error, warn, info or debug; using warn\n",
            v);
    return TP_LOG_WARN;
}

static int level_get(void) {
    int l = atomic_load_explicit(&level_now, memory_order_relaxed);
    if (l == LEVEL_UNSET) {
        int want = level_from_env();
        int expected = LEVEL_UNSET; /* a racing thread computed the same */
        atomic_compare_exchange_strong(&level_now, &expected, want);
        l = atomic_load(&level_now);
    }
    return l;
}

tp_status tp_set_log_level(tp_log_level level) {
    if (level < TP_LOG_ERROR || level > TP_LOG_DEBUG)
        return tpi_fail(TP_EINVAL, "log level %d outside [%d, %d] (TP_LOG_ERROR..TP_LOG_DEBUG)",
                        (int)level, (int)TP_LOG_ERROR, (int)TP_LOG_DEBUG);
    atomic_store(&level_now, (int)level);
    return TP_OK;
}

tp_log_level tp_log_level_now(void) {
    return (tp_log_level)level_get();
}

void tp_set_log_callback(tp_log_fn fn, void *user_data) {
    atomic_store(&sink_ud, user_data);
    atomic_store(&sink_fn, fn);
}

const char *tp_log_level_name(tp_log_level level) {
    return level >= TP_LOG_ERROR && level <= TP_LOG_DEBUG ? level_names[level] : "?";
}

int tpi_log_on(tp_log_level level) {
    return (int)level <= level_get();
}

void tpi_log(tp_log_level level, const char *fmt, ...) {
    if (!tpi_log_on(level))
        return;
    char msg[TPI_LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    tpi_vformat(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tp_log_fn fn = atomic_load(&sink_fn);
    if (fn) {
        fn(level, msg, atomic_load(&sink_ud));
        return;
    }
    fprintf(stderr, "tensorplay-rpc: %s: %s\n", level_names[level], msg);
}
