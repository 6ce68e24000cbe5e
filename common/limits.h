/*
 * limits.h: every bound in one place (spec/wire.md WIRE-8). Each limit has a
 * name, a reason, and the relations between them are checked at compile
 * time. Runtime options may lower a limit, never raise it.
 */
#ifndef TPI_LIMITS_H
#define TPI_LIMITS_H

#include "tensorplay/rpc.h"
#include "tensorplay/rpc_backend.h"

/* Largest frame, header included. 2 GiB - 1 keeps every length in a u32 and
 * covers a 64 MiB tensor with wide room; options lower it. */
#define TPI_MESSAGE_SIZE_MAX ((uint64_t)0x7fffffff)
/* Default max_message_size: large enough for a 1 GiB tensor. */
#define TPI_MESSAGE_SIZE_DEFAULT (((uint64_t)1 << 30) + ((uint64_t)1 << 20))
/* The smallest max_message_size an option may set: a header and a small body. */
#define TPI_MESSAGE_SIZE_MIN ((uint64_t)4096)

/* Nesting depth of lists and maps: bounds the decoder's recursion. */
#define TPI_VALUE_DEPTH_MAX 64
/* One log message (LOG-2), cut beyond: a status message plus its context. */
#define TPI_LOG_LINE_MAX 1024
/* A shutdown barrier that waits says so this often, at info (LOG-3). */
#define TPI_LOG_PROGRESS_NS (5ull * 1000000000ull)
/* Init that waits for ranks says so at warn, the default level, this long
 * after init began and then as often (LOG-3): a person waiting on a job
 * that does not start learns which ranks are missing well before the
 * 60 s default timeout, and a 10 s launch skew stays quiet. */
#define TPI_INIT_WAIT_LOG_NS (10ull * 1000000000ull)
/* How often a blocked tp_init_rpc or graceful tp_shutdown looks at the
 * interrupt flag (INTERRUPT-1): tp_interrupt only sets an atomic, to stay
 * async-signal-safe, so the waiter polls; 20 ms is the longest pause init's
 * own polling takes anyway, and well under a person's 100 ms. */
#define TPI_INTERRUPT_POLL_NS 20000000ull
/* Items in one list or map: bounds allocation before any item is read. */
#define TPI_CONTAINER_LEN_MAX ((uint32_t)1 << 24)
/* Values decoded from one message. A nil is one byte on the wire but some
 * 50 bytes in memory: this bounds what a hostile frame can make us allocate
 * (4 Mi values, ~200 MiB) whatever the message size limit. */
#define TPI_VALUES_PER_MESSAGE_MAX ((uint32_t)1 << 22)
/* Bytes of one string or bytes value (the frame bound applies as well). */
#define TPI_BLOB_LEN_MAX TPI_MESSAGE_SIZE_MAX
/* Bytes of a remote error message carried in a response. */
#define TPI_REMOTE_MSG_LEN_MAX (TP_ERRMSG_LEN_MAX - 1)

/* Tensor data of at least this many bytes travels without a copy (WIRE-10):
 * a contiguous tensor is sent from its own memory as a frame segment, and
 * a received one becomes a view into the frame. Below it a copy is cheaper
 * than a segment (an iovec, a reference, a block). */
#define TPI_ZERO_COPY_MIN ((uint64_t)64 * 1024)
/* Tensors one frame sends without a copy: each takes a segment, and the
 * bytes after it another, within TP_FRAME_SEG_MAX. Later ones are copied. */
#define TPI_ZERO_COPY_TENSORS_MAX ((TP_FRAME_SEG_MAX - 1) / 2)

/* Frame buffers of at least this many bytes (tp_frame_alloc) go back to a
 * small process-wide cache when their frame is destroyed, and the next frame
 * that fits takes one instead of a fresh allocation: a large fresh block is
 * mmapped, page-faulted and zeroed page by page, which cost half the
 * bandwidth of receiving a 64 MiB tensor. Below it malloc is cheap. */
#define TPI_FRAME_CACHE_MIN ((size_t)1 << 20)
/* Blocks the cache keeps: a few frames in flight at once (a request and a
 * response, a frame being read while the last one is still viewed). */
#define TPI_FRAME_CACHE_BLOCKS 4
/* Bytes the cache keeps in all, the bound on memory held for nothing; a
 * block larger than this is never kept. */
#define TPI_FRAME_CACHE_BYTES ((size_t)256 << 20)

/* Worker threads (or simulated pool tasks) per worker. */
#define TPI_WORKER_THREADS_MAX 1024
/* Address strings agents exchange through the store. */
#define TPI_ADDR_LEN_MAX 256
/* Calls in flight from one worker: bounds the pending table. */
#define TPI_CALLS_IN_FLIGHT_MAX ((uint32_t)1 << 20)
/* Method calls a worker keeps parked on owner records not settled yet
 * (METHOD-3). A parked request no longer counts against its caller's credit
 * (FLOW-8), so this bounds what callers can park; past it a method call waits
 * on its pool thread, within its own deadline, as the credit then bounds. */
#define TPI_METHOD_DEFERRED_MAX 4096u

/* RREF-15: an rref protocol message that got no answer (a broken
 * connection, a timeout) is sent again after this pause, doubling per
 * attempt up to the max: soon enough that a fork is confirmed within a
 * reconnect, rare enough that a peer that stays unreachable (not yet
 * declared dead) costs a few messages a second. */
#define TPI_RREF_RETRY_MIN_NS 20000000ull    /* 20 ms */
#define TPI_RREF_RETRY_MAX_NS 2000000000ull  /* 2 s */
/* RREF-15: how long one attempt of an accept, delete or abandon waits for
 * its answer before it is sent again. Its own, not the worker's rpc timeout:
 * a default shorter than a round trip would time out every attempt. */
#define TPI_RREF_ATTEMPT_TIMEOUT_S 10.0
/* CANCEL-1: how long a tp:cancel waits for its answer (served in the callee's
 * I/O context, so it comes within a round trip). Nobody waits for it but the
 * graceful drain, which counts it as an active call; past this the callee
 * is slow or unreachable, and the request it gives up ends as a timed-out
 * one would (its late answer comes back and is dropped). */
#define TPI_CANCEL_TIMEOUT_S 10.0
/* RREF-14: rref ids whose creator abandoned them before the owner heard of
 * them (their remote() was lost), remembered so a fork arriving later makes
 * no placeholder that would wait forever. The most recent ones; an id pushed
 * out would only leak a placeholder, never free a held value. */
#define TPI_ABANDONED_MAX 1024
/* RREF-21: on a transport that reorders, rref ids of other creators this
 * owner freed, remembered so a fetch or fork the network held back behind
 * the last delete is refused instead of making a placeholder nothing fills.
 * Reordering is bounded (TPI_DEDUPE_WINDOW_NS): an id pushed out would only
 * leak a placeholder, never free a held value. */
#define TPI_FREED_MAX 4096
/* RREF-19: forks one tp:forks query may name. Each is looked up in the I/O
 * context, so a peer's query costs CPU in proportion: a larger one is
 * refused (TP_ELIMIT), and the asker sends at most this many at a time. */
#define TPI_FORKS_QUERY_MAX 4096
/* RREF-22: on a transport that loses frames silently, how old an unsettled
 * fork sent to a peer must be before the peer is asked whether it holds it,
 * and how often the worker looks. Longer than a round trip under load, so a
 * fork on its way is rarely asked about (asking is safe, only wasted). */
#define TPI_FORKS_PROBE_NS ((uint64_t)2000000000) /* 2 s */

/*
 * CALL-10: on a transport that may duplicate frames (AGENT-17), how long a
 * frame's (sender, id) is remembered so that a copy is dropped, and how many
 * are remembered at most (the oldest forgotten first). The simulator's
 * chaos mode delivers a copy at most 10 ms after the original; a second is
 * far beyond it and 64 Ki entries (about 2 MiB) cover 64 Ki frames a second.
 */
#define TPI_DEDUPE_WINDOW_NS ((uint64_t)1000000000)
#define TPI_DEDUPE_MAX ((size_t)1 << 16)

/* Request bytes one worker may have in flight to one destination (FLOW-1):
 * issued, not yet answered. A call that would pass it waits, within its own
 * deadline, for earlier calls to end. It bounds what piles up in the sender's
 * queue, the network and the callee's pool queue for a callee that cannot
 * keep up. The default is far above any steady workload's need (1,000 calls
 * of 64 bytes are ~130 KB) yet keeps a runaway producer from using memory
 * without end; a call that fits nothing else still goes out alone. */
#define TPI_INFLIGHT_BYTES_DEFAULT ((uint64_t)256 << 20)
#define TPI_INFLIGHT_BYTES_MIN ((uint64_t)4096)
#define TPI_INFLIGHT_BYTES_MAX ((uint64_t)1 << 40)

/* ---- Bounds against any peer (spec/tcp.md TCP-19) ------------------------
 * What one connection, or all of them, can make a worker hold. Each is the
 * default and the most a backend option may set: options only lower them. */

/* An accepted connection must say hello and prove itself (TCP-17) within
 * this time: a stranger holds a descriptor and ~1 KiB no longer. Option
 * hello_timeout (seconds). */
#define TPI_TCP_HELLO_TIMEOUT_MS 10000
/* A frame whose header was admitted must arrive whole within this time plus
 * one second for each TPI_TCP_FRAME_RATE_MIN bytes (a 1 GiB frame gets some
 * 17 minutes): a slower sender holds a frame's memory for nothing and is
 * dropped. Option frame_timeout (seconds, the first term). */
#define TPI_TCP_FRAME_TIMEOUT_MS 30000
#define TPI_TCP_FRAME_RATE_MIN ((uint64_t)1 << 20)
/* An accepted connection that carried nothing for this long is asked to
 * close (IDLE); the dialer closes it once its writes are out (CLOSE), so
 * nothing is lost, and its next frame dials anew. Its descriptor and
 * buffers come back. Option idle_timeout (seconds). */
#define TPI_TCP_IDLE_TIMEOUT_MS 300000
/* A dialer asked to close an idle connection does so within this time (or
 * idle_timeout when shorter), or the connection is aborted; the dialer
 * waits as long for the end. */
#define TPI_TCP_IDLE_GRACE_MS 10000
/* Bytes of the frames a worker is reading, over all its connections, as
 * their headers declared them. A header that would pass it waits, its
 * connection unread, until frames in progress end (waiting ones are then
 * admitted in order; a header that fits does not wait behind them, so no
 * peer's large frame holds up another's small ones); a frame alone is always
 * admitted (max_message_size bounds it: one frame at a time per
 * connection). 64 headers declaring 1 GiB reserve 2 GiB, not 64; the pages
 * themselves are touched, so committed, only as bytes arrive. Option
 * rx_budget (bytes). */
#define TPI_TCP_RX_BUDGET_DEFAULT ((uint64_t)2 << 30)
#define TPI_TCP_RX_BUDGET_MIN ((uint64_t)4096)
/* Accepted connections still in their hello or handshake; beyond it new
 * ones are closed at once (and logged), so strangers cannot take every
 * descriptor or starve a peer's dial. Option max_handshakes. */
#define TPI_TCP_HANDSHAKES_MAX 64
/* Identified connections one peer may have open to a worker: it keeps one,
 * and briefly a second while the end of a broken one is not yet seen. */
#define TPI_TCP_CONNS_PER_PEER_MAX 4

/* Request bytes a worker holds from all its callers, waiting for its pool
 * (FLOW-6, OPT-9): each caller's credit is a share of it. 4 GiB holds a
 * 256 MiB credit for 16 callers and 64 MiB for 64. The minimum still
 * grants every caller TPI_CREDIT_MIN; one request alone is always taken. */
#define TPI_QUEUED_BYTES_DEFAULT ((uint64_t)4 << 30)
#define TPI_QUEUED_BYTES_MIN ((uint64_t)64 * 1024)
#define TPI_QUEUED_BYTES_MAX ((uint64_t)1 << 40)
/* Owner values a worker keeps for one other worker's remote() calls (and
 * the placeholders its forks made) that were not deleted yet (OPT-10,
 * RREF-23): past it a remote() is refused with TP_ELIMIT, so a member that
 * never releases its rrefs cannot hold a worker's memory without bound. */
#define TPI_REMOTE_VALUES_DEFAULT ((uint64_t)1 << 20)
#define TPI_REMOTE_VALUES_MIN ((uint64_t)1)
#define TPI_REMOTE_VALUES_MAX ((uint64_t)UINT32_MAX)
/* Bytes an agent may hold for one destination undelivered before the core
 * stops serving that destination's requests (OPT-11, FAIR-2, AGENT-18):
 * answers to a caller that does not read them wait, bounded, instead of
 * growing in memory. Serving goes on at half of it. */
#define TPI_UNSENT_BYTES_DEFAULT ((uint64_t)256 << 20)
#define TPI_UNSENT_BYTES_MIN ((uint64_t)64 * 1024)
#define TPI_UNSENT_BYTES_MAX ((uint64_t)1 << 40)
/* The least credit a worker grants a caller, however many it has: a few
 * small calls at once. */
#define TPI_CREDIT_MIN ((uint64_t)64 * 1024)

/* A timeout in seconds as a u32 of milliseconds on the wire: ~49 days. */
#define TPI_TIMEOUT_S_MAX 4000000.0

_Static_assert(TPI_MESSAGE_SIZE_DEFAULT <= TPI_MESSAGE_SIZE_MAX, "default within max");
_Static_assert(TPI_MESSAGE_SIZE_MIN >= TP_FRAME_HEADER_SIZE + TP_ERRMSG_LEN_MAX + 64,
               "the minimum still fits an error response");
_Static_assert(TPI_MESSAGE_SIZE_MAX <= UINT32_MAX, "frame length fits the u32 header field");
_Static_assert(TP_NAME_LEN_MAX < TP_STORE_KEY_LEN_MAX - 64, "store keys embed a name");
_Static_assert(TP_TENSOR_NDIM_MAX <= 255, "ndim travels as a u8");
_Static_assert(TPI_ZERO_COPY_TENSORS_MAX >= 1, "a frame has room for one shared tensor");
_Static_assert(TPI_FRAME_CACHE_BLOCKS >= 1 && TPI_FRAME_CACHE_MIN <= TPI_FRAME_CACHE_BYTES,
               "the frame cache can hold a block");
_Static_assert(TPI_INFLIGHT_BYTES_MIN <= TPI_INFLIGHT_BYTES_DEFAULT &&
                   TPI_INFLIGHT_BYTES_DEFAULT <= TPI_INFLIGHT_BYTES_MAX,
               "the default window is a valid one");
_Static_assert(TPI_TCP_RX_BUDGET_MIN <= TPI_TCP_RX_BUDGET_DEFAULT, "the default budget is valid");
_Static_assert(TPI_TCP_IDLE_GRACE_MS < TPI_TCP_IDLE_TIMEOUT_MS, "asking to close takes less than idling");
_Static_assert((uint64_t)TPI_TIMEOUT_S_MAX * 1000u < 4294967295u, "timeout ms fits a u32");

#endif
