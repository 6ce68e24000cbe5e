/* errors.c: status names, strings, and the per-task error message. */
#include "errors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"

static const char *const status_text[] = {
#define TP_STATUS_TEXT_(name, text) text,
    TP_STATUS_MAP(TP_STATUS_TEXT_)
#undef TP_STATUS_TEXT_
};

static const char *const status_names[] = {
#define TP_STATUS_NAME_(name, text) "TP_" #name,
    TP_STATUS_MAP(TP_STATUS_NAME_)
#undef TP_STATUS_NAME_
};

_Static_assert(sizeof status_text / sizeof status_text[0] == TP_STATUS_COUNT_,
               "one text per status");

const char *tp_strerror(tp_status status) {
    if ((unsigned)status >= TP_STATUS_COUNT_)
        return "unknown status";
    return status_text[status];
}

const char *tp_status_name(tp_status status) {
    if ((unsigned)status >= TP_STATUS_COUNT_)
        return "TP_UNKNOWN";
    return status_names[status];
}

size_t tpi_vformat(char *buf, size_t len, const char *fmt, va_list ap) {
    if (len == 0)
        return 0;
    int n = vsnprintf(buf, len, fmt, ap);
    if (n < 0) {
        buf[0] = '\0';
        return 0;
    }
    return (size_t)n < len ? (size_t)n : len - 1;
}

size_t tpi_copy_text(char *buf, size_t len, const char *s) {
    TPI_ASSERT(buf != NULL && len > 0 && s != NULL);
    size_t n = strnlen(s, len - 1);
    memcpy(buf, s, n);
    buf[n] = '\0';
    return n;
}

size_t tpi_format(char *buf, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t n = tpi_vformat(buf, len, fmt, ap);
    va_end(ap);
    return n;
}

tp_status tpi_fail(tp_status status, const char *fmt, ...) {
    char *buf = tpi_errmsg_buf();
    va_list ap;
    va_start(ap, fmt);
    tpi_vformat(buf, TP_ERRMSG_LEN_MAX, fmt, ap);
    va_end(ap);
    return status;
}

tp_status tpi_fail_msg(tp_status status, const char *msg) {
    tpi_copy_text(tpi_errmsg_buf(), TP_ERRMSG_LEN_MAX, msg ? msg : tp_strerror(status));
    return status;
}

const char *tp_errmsg(void) {
    return tpi_errmsg_buf();
}

_Noreturn void tpi_assert_fail(const char *cond, const char *file, int line) {
    fprintf(stderr, "tensorplay-rpc: assertion failed: %s (%s:%d)\n", cond, file, line);
    fflush(stderr);
    abort();
}

int tpi_parse_index(const char *s, uint32_t limit, uint32_t *out) {
    if (!s || !*s || (s[0] == '0' && s[1]))
        return 0;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return 0;
        v = v * 10 + (uint64_t)(*s - '0');
        if (v >= limit)
            return 0;
    }
    *out = (uint32_t)v;
    return 1;
}
