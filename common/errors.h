/*
 * errors.h: statuses with readable messages (spec/api.md ERR-1..3).
 * tpi_fail() records a message for tp_errmsg() and returns the status, so a
 * failing path reads: return tpi_fail(TP_EINVAL, "rank %d out of [0, %d)", r, n);
 */
#ifndef TPI_ERRORS_H
#define TPI_ERRORS_H

#include <stdarg.h>
#include <stddef.h>

#include "tensorplay/rpc.h"

#if defined(__GNUC__)
#define TPI_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define TPI_PRINTF(f, a)
#endif

/* Records "message" as the calling task's tp_errmsg() and returns status. */
tp_status tpi_fail(tp_status status, const char *fmt, ...) TPI_PRINTF(2, 3);
/* Records a message already formatted (e.g. from a backend's errmsg buffer). */
tp_status tpi_fail_msg(tp_status status, const char *msg);
/* snprintf that always terminates and never reports more than it wrote. */
size_t tpi_format(char *buf, size_t len, const char *fmt, ...) TPI_PRINTF(3, 4);
/* Parses s, the whole of it, as a decimal index below limit, as we write
 * them ("%u": no sign, no leading zero): 1 and *out set, or 0. */
int tpi_parse_index(const char *s, uint32_t limit, uint32_t *out);
size_t tpi_vformat(char *buf, size_t len, const char *fmt, va_list ap);
/* tpi_format(buf, len, "%s", s) without printf (names and messages are
 * copied on every call's path): at most len - 1 bytes of s, then a NUL;
 * returns the bytes copied. len > 0. */
size_t tpi_copy_text(char *buf, size_t len, const char *s);

/* Always-on assertion for invariants (STYLE 8): never for input that crossed
 * a trust boundary. Prints the condition, file and line, then aborts. */
#define TPI_ASSERT(cond)                                                                   \
    ((cond) ? (void)0 : tpi_assert_fail(#cond, __FILE__, __LINE__))
_Noreturn void tpi_assert_fail(const char *cond, const char *file, int line);

#endif
