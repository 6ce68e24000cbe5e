/*
 * free_port.h: a TCP port nobody uses now, for a launcher's MASTER_PORT and
 * for tests (spec/launch.md LAUNCH-2). Needs nothing else from the library,
 * so tprun links it alone.
 */
#ifndef TP_FREE_PORT_H
#define TP_FREE_PORT_H

#include <stddef.h>

#define TPI_FREE_PORT_LOW 10000 /* the lowest port drawn */
#define TPI_FREE_PORT_TRIES 64  /* random draws before the kernel's choice */

/* Finds a port that a stream socket can bind on addr (a numeric or named
 * host) right now, and stores it in *port. Drawn at random below the
 * kernel's ephemeral range when there is room: a port the kernel picks for
 * port 0 comes from that range, where any process's outgoing connection may
 * take it before its user binds it ("Address already in use", seen in 1 of
 * some thousands of runs on a busy machine). Returns 0, or -1 with a
 * readable reason in err (errlen bytes, NUL-terminated). Thread-safe. */
int tpi_free_port(const char *addr, unsigned *port, char *err, size_t errlen);

/* The low end of the kernel's ephemeral port range (32768 when unknown). */
unsigned tpi_ephemeral_low(void);

#endif
