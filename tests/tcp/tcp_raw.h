/*
 * tcp_raw.h: a raw socket that plays a worker's peer by hand, for the TCP
 * tests that send what no worker would (spec/tcp.md TCP-3..5, TCP-17,
 * TCP-19). The calls above "Without asserts" assert with cmocka, so they
 * run in the test's parent process, not in a job's children.
 */
#ifndef TT_TCP_RAW_H
#define TT_TCP_RAW_H

#include <stddef.h>
#include <stdint.h>

#include "common/codec.h" /* TPI_WIRE_VERSION */
#include "real/tcp_internal.h"

/* Rank's address from the job's store at 127.0.0.1:store_port, read like any
 * client: the last field of its "init/rank/<r>" entry (INIT-4). */
void tt_worker_addr(uint16_t store_port, int rank, char *addr, size_t len);
/* A blocking IPv4 socket connected to "host:port". */
int tt_raw_connect(const char *addr);
void tt_raw_send(int fd, const void *p, size_t n);
/* Reads n bytes within 5 s; returns how many came before EOF. */
size_t tt_raw_recv(int fd, void *p, size_t n);
/* The worker drops us: EOF (or a reset) within 5 s, nothing else first; closes fd. */
void tt_expect_dropped(int fd);
/* An ABORT record, then the drop; closes fd. */
void tt_expect_abort_then_dropped(int fd);
/* An ABORT record, then a half-close (EOF); what we send for a second after
 * is read and dropped (no reset), and the worker ends the connection when
 * its linger runs out, since we never close (TCP-7); closes fd. */
void tt_expect_abort_drained(int fd);
/* The job's authentication, from TP_SECRET as the workers have it (TCP-17). */
tpi_tcp_auth tt_job_auth(void);
/* The dialer's half of the handshake as worker 2 to worker 1 of a world of
 * 3 under auth (a wrong key is refused after the worker's proof). Returns
 * the socket once our proof went out: frames may follow. */
int tt_hello_as_worker2_with(const char *addr, const tpi_tcp_auth *auth);
/* The same with hello flags (TPI_TCP_HELLO_*); ctx (64 bytes, may be NULL)
 * gets what both proofs cover, from which the stream keys derive (TCP-21). */
int tt_hello_as_worker2_flags(const char *addr, const tpi_tcp_auth *auth, unsigned flags,
                              uint8_t *ctx, size_t *ctx_len);
int tt_hello_as_worker2(const char *addr);
/* The same with the job's key but one bit of byte (0..15) of our proof
 * flipped: the worker must drop us silently (TCP-17). */
int tt_hello_as_worker2_flipped(const char *addr, int byte);
/* A frame header: "TPRC", version, type, body_len (the bytes after the header). */
void tt_frame_header(uint8_t h[24], uint8_t version, uint8_t type, uint32_t body_len);

/* ---- Without asserts (tcp_raw_dial.c): for programs that open thousands of
 * connections (net_storm, net_fuzz) or run without cmocka (fuzz_tcp_conn),
 * where a refused, reset or dropped connection is an outcome to count, not a
 * failure. Errors are -1 with errno set. */

/* A blocking IPv4 socket connected to "host:port" (TCP_NODELAY), or -1. */
int tt_raw_dial(const char *addr);
/* Sends all n bytes (MSG_NOSIGNAL): 0, or -1 when the socket fails. */
int tt_raw_send_all(int fd, const void *p, size_t n);
/* Reads up to n bytes, as they come, for at most timeout_ms in all: how many
 * came before end of file, an error or the time (0: none). */
size_t tt_raw_recv_within(int fd, void *p, size_t n, int timeout_ms);
/* The dialer's handshake as worker me to worker to of a world of world
 * (TCP-3, TCP-17), proving itself with auth after it checked the worker's
 * proof against the job's key: the socket once our proof went out (frames
 * may follow), or -1 when any step failed (the socket closed). */
int tt_raw_hello_as(const char *addr, uint32_t me, uint32_t to, uint32_t world,
                    const tpi_tcp_auth *auth);
/* A store client's handshake (TCP-10, TCP-17) as rank (UINT32_MAX: not a
 * worker) with auth: the socket once the server said "TPOK" (requests may
 * follow), or -1. */
int tt_raw_store_hello(const char *addr, uint32_t rank, const tpi_tcp_auth *auth);
/* rank's published address (INIT-3), read from the job's store at
 * 127.0.0.1:store_port like any client: 0, or -1 with a message on stderr. */
int tt_raw_worker_addr(uint16_t store_port, int rank, char *addr, size_t len);
/* The same for the job's init attempt gen (INIT-1: g<gen>/ keys), when this
 * process has called init before. */
int tt_raw_worker_addr_in(uint16_t store_port, unsigned gen, int rank, char *addr, size_t len);

#endif
