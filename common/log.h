/*
 * log.h: the library's log (spec/api.md LOG-1..3). Messages the user may want
 * without asking for them through a status: refused connections, peer
 * deaths, a rendezvous that waits. Levels from TP_LOG (error, warn, info,
 * debug; default warn) or tp_set_log_level; to stderr, or to the callback
 * tp_set_log_callback installed.
 */
#ifndef TPI_LOG_H
#define TPI_LOG_H

#include "errors.h"

/* 1 when a message of level would be written (check before costly formatting). */
int tpi_log_on(tp_log_level level);
/* Writes "message" at level when it is on; never fails, never blocks for long. */
void tpi_log(tp_log_level level, const char *fmt, ...) TPI_PRINTF(2, 3);

#endif
