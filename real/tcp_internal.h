/*
 * tcp_internal.h: the "TENSORPIPE" backend, the agent interface on libuv TCP
 * (spec/tcp.md TCP-1.., spec/agent.md AGENT-1..13).
 *
 * Threads of one agent:
 * - the loop thread runs one uv_loop: the listener, every connection, the
 *   core's timer and the wake-up async handle. It makes every upcall, with
 *   no internal lock held (AGENT-2).
 * - the pool: up to num_worker_threads pthreads, started on demand, run work
 *   items in FIFO order (AGENT-7).
 * - any thread may make downcalls; send and timer_arm queue under qmu and
 *   wake the loop with uv_async_send, the one libuv call that is safe from
 *   another thread; send may instead write the frame to the socket itself
 *   when the loop grants it (TCP-15: direct writes, tcp_conn.c).
 *
 * Locks, in the order they may be taken: mu (the core lock, AGENT-11), then
 * pool_mu or qmu (leaves, never held together, never held across an upcall
 * or a blocking call).
 */
#ifndef TPI_TCP_INTERNAL_H
#define TPI_TCP_INTERNAL_H

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <uv.h>

#include "common/errors.h"
#include "common/limits.h"
#include "common/log.h"
#include "real/shm_ring.h"
#include "real/tcp_thread.h"
#include "tensorplay/rpc_backend.h"

/* ---- Transport records (TCP-3..5): hello and control, 24 bytes each ------- */

#define TPI_TCP_RECORD_SIZE 24
#define TPI_TCP_VERSION                                                                            \
    5 /* 2: hello flags, authentication (TCP-17); 3: IDLE, CLOSE (TCP-19);                         \
        4: shared memory records (TCP-22); 5: rings (TCP-28) */
/* Magic of a hello record "TPHL", a control record "TPCT", an authentication
 * record "TPAU". */
#define TPI_TCP_HELLO_MAGIC "TPHL"
#define TPI_TCP_CTL_MAGIC "TPCT"
#define TPI_TCP_AUTH_MAGIC "TPAU"
/* Hello flags (offset 6): both ends must agree. */
#define TPI_TCP_HELLO_AUTH 1u
#define TPI_TCP_HELLO_ENCRYPT 2u /* the stream after the handshake is sealed (TCP-21) */

/* ---- Authentication (TCP-17): tcp_auth.c ---------------------------------- */

/* A job secret's bytes: below 16 a secret can be guessed offline from one
 * recorded handshake; above 128 is no stronger. */
#define TPI_TCP_SECRET_MIN 16u
#define TPI_TCP_SECRET_MAX 128u
#define TPI_TCP_JOB_SECRET_BYTES 32u /* what tp_job_secret_new and tprun make */
#define TPI_TCP_NONCE_SIZE 16 /* fresh per connection and side: no replay */
#define TPI_TCP_PROOF_SIZE 16 /* HMAC-SHA-256 cut to 128 bits */
#define TPI_TCP_AUTH_CTX_MAX 64

typedef struct tpi_tcp_auth {
    int on;
    uint8_t key[32]; /* derived from the secret; the secret itself is not kept */
} tpi_tcp_auth;

typedef enum tpi_tcp_auth_kind {
    TPI_TCP_AUTH_NONCE = 1, /* this side's fresh nonce */
    TPI_TCP_AUTH_PROOF = 2  /* this side's proof over both nonces and both ids */
} tpi_tcp_auth_kind;

/* auth from the backend options "auth" and "secret", or TP_SECRET. TP_EAUTH
 * when authentication is on and no secret is given; TP_EINVAL for a bad one. */
tp_status tpi_tcp_auth_setup(const tp_options *opts, tpi_tcp_auth *auth, char *errmsg,
                             size_t errmsg_len);
/* Wipes the key. */
void tpi_tcp_auth_clear(tpi_tcp_auth *auth);
/* 1 when both are off, or on with the same key (constant time). */
int tpi_tcp_auth_same(const tpi_tcp_auth *a, const tpi_tcp_auth *b);
/* Fresh random bytes; -1 when the generator fails. */
int tpi_tcp_auth_nonce(uint8_t nonce[TPI_TCP_NONCE_SIZE]);
/* The proof of label || ctx (ctx_len <= TPI_TCP_AUTH_CTX_MAX) under auth's
 * key: 0, or -1 when OpenSSL could not compute it (out of memory). */
int tpi_tcp_auth_proof(const tpi_tcp_auth *auth, const char *label, const uint8_t *ctx,
                       size_t ctx_len, uint8_t proof[TPI_TCP_PROOF_SIZE]);
/* 1 when proof is right (constant time), 0 when wrong, -1 when OpenSSL
 * could not compute the right one (out of memory: no verdict on the peer). */
int tpi_tcp_auth_check(const tpi_tcp_auth *auth, const char *label, const uint8_t *ctx,
                       size_t ctx_len, const uint8_t proof[TPI_TCP_PROOF_SIZE]);
/* A 32-byte key HMAC-SHA-256(auth's key, label || ctx): the proofs are its
 * first 16 bytes; the stream keys (TCP-21) the whole of it under their own
 * labels. 0, or -1 when OpenSSL failed (it allocates): key zeroed. */
int tpi_tcp_auth_derive(const tpi_tcp_auth *auth, const char *label, const uint8_t *ctx,
                        size_t ctx_len, uint8_t key[32]);
/* An authentication record: "TPAU", version, kind, 0 0, 16 bytes of payload. */
void tpi_tcp_auth_encode(uint8_t rec[24], tpi_tcp_auth_kind kind, const uint8_t payload[16]);
/* 1 with the payload when rec is a well-formed record of that kind. */
int tpi_tcp_auth_decode(const uint8_t rec[24], tpi_tcp_auth_kind kind, uint8_t payload[16]);

/* ---- Encryption of the stream (TCP-21): tcp_crypt.c ------------------------ */

/* A sealed record: u32 plaintext length n (1..TPI_TCP_SEAL_MAX), n bytes of
 * AES-256-GCM ciphertext, a 16-byte tag. The length is the tag's associated
 * data; the nonce is the record's number in its direction, never sent. */
#define TPI_TCP_SEAL_HEAD 4
#define TPI_TCP_SEAL_TAG 16
#define TPI_TCP_SEAL_OVERHEAD (TPI_TCP_SEAL_HEAD + TPI_TCP_SEAL_TAG)
/* Plaintext bytes per record: TLS's record size. A record is opened only
 * whole, so this bounds what a reader holds before it can check a tag. */
#define TPI_TCP_SEAL_MAX (16 * 1024)
/* A connection's buffer of sealed bytes read and not yet opened: four
 * records, so one read brings as much as the plaintext staging buffer. */
#define TPI_TCP_SEAL_BUF (4 * (TPI_TCP_SEAL_MAX + TPI_TCP_SEAL_OVERHEAD))
#define TPI_TCP_SEAL_KEY_SIZE 32
/* Plaintext a connection seals at once, into one of its two buffers, which
 * it keeps (warm: a fresh buffer's page faults cost more than the cipher on
 * a virtual machine). A large frame is sealed a chunk at a time as the
 * socket takes the previous ones, so writing it holds two chunks, not a
 * sealed copy of it. */
#define TPI_TCP_SEAL_CHUNK (256 * 1024)

/* One direction of one connection: its key (in the cipher context) and the
 * number of the next record. */
typedef struct tpi_tcp_cipher {
    void *evp; /* EVP_CIPHER_CTX */
    uint64_t seq;
    int sealing;
} tpi_tcp_cipher;

/* Reads the backend option "encrypt" (off by default): *on is 1 for "on".
 * TP_EINVAL for another value, or for "on" without authentication. */
tp_status tpi_tcp_encrypt_setup(const tp_options *opts, const tpi_tcp_auth *auth, int *on,
                                char *errmsg, size_t errmsg_len);
/* The two stream keys of a connection, from the job key and what both
 * proofs cover (both ids, the world size, both nonces), one per direction.
 * 0, or -1 when OpenSSL failed (out of memory). */
int tpi_tcp_seal_keys(const tpi_tcp_auth *auth, const uint8_t *ctx, size_t ctx_len,
                      uint8_t dialer_to_acceptor[TPI_TCP_SEAL_KEY_SIZE],
                      uint8_t acceptor_to_dialer[TPI_TCP_SEAL_KEY_SIZE]);
/* A direction keyed with key, sealing (1) or opening (0); 0, or -1 when
 * OpenSSL fails. */
int tpi_tcp_seal_init(tpi_tcp_cipher *s, const uint8_t key[TPI_TCP_SEAL_KEY_SIZE], int sealing);
/* Frees the context (its key wiped). */
void tpi_tcp_seal_clear(tpi_tcp_cipher *s);
/* The bytes of the records that carry n bytes of plaintext. */
size_t tpi_tcp_sealed_size(size_t n);
/* Seals the n bytes gathered from iov[0..niov) into records at out
 * (tpi_tcp_sealed_size(n) bytes); 0, or -1 when OpenSSL fails. */
int tpi_tcp_seal(tpi_tcp_cipher *s, const struct iovec *iov, int niov, size_t n, uint8_t *out);
/* The plaintext length a record's head declares, 0 when it is not
 * 1..TPI_TCP_SEAL_MAX: checked before anything more is read. */
size_t tpi_tcp_seal_len(const uint8_t head[TPI_TCP_SEAL_HEAD]);
/* The sealed bytes p[0..have) as a reader sees them (TCP-21): the bytes of
 * the whole record they start with (head, plaintext, tag), 0 when more must
 * be read first, or -1 when its head declares a length outside
 * 1..TPI_TCP_SEAL_MAX, told from the 4 head bytes alone, before anything
 * more is read or allocated. Pure: the connection's reader (tcp_conn.c) and
 * fuzz_tcp_crypt frame records with it. */
long tpi_tcp_sealed_next(const uint8_t *p, size_t have);
/* Opens the whole record rec (head, n = tpi_tcp_seal_len bytes, tag) into
 * plain (n bytes); 0, or -1 when its tag does not check (tampered, replayed,
 * reordered, of another connection or direction): plain is then garbage. */
int tpi_tcp_open(tpi_tcp_cipher *s, const uint8_t *rec, uint8_t *plain);

typedef enum tpi_tcp_hello_kind {
    TPI_TCP_HELLO_OPEN = 1,  /* dialer to acceptor: "I am worker s, you are worker r" */
    TPI_TCP_HELLO_ACCEPT = 2 /* acceptor's answer, same fields from its side */
} tpi_tcp_hello_kind;

typedef enum tpi_tcp_ctl_kind {
    TPI_TCP_CTL_BYE = 1,   /* the sender is stopping: EOF follows */
    TPI_TCP_CTL_ABORT = 2, /* the sender closes this connection after an error; it lives on */
    TPI_TCP_CTL_PING = 3,  /* dialer to acceptor: answer with PONG */
    TPI_TCP_CTL_PONG = 4,
    TPI_TCP_CTL_IDLE = 5,  /* acceptor to dialer: this connection idles; close it (TCP-19) */
    TPI_TCP_CTL_CLOSE = 6, /* dialer to acceptor: nothing follows; I live on (TCP-19) */
    /* TCP-22, shared memory; their three u32 fields at offsets 12, 16, 20: */
    TPI_TCP_SHM_OFFER = 7,    /* dialer to acceptor: pid, probe fd, probe tag */
    TPI_TCP_SHM_ANSWER = 8,   /* acceptor to dialer: 1 yes / 0 no, 0, 0 */
    TPI_TCP_SHM_FRAME = 9,    /* dialer to acceptor: slab fd, slab slot, frame length */
    TPI_TCP_SHM_RELEASE = 10, /* acceptor to dialer: slab slot, 0, 0 */
    /* TCP-28, rings: */
    TPI_TCP_SHM_RING = 11,  /* dialer to acceptor, on the stream: frames take the ring from here */
    TPI_TCP_SHM_STREAM = 12 /* in the ring: the next frame comes on the stream, read it first */
} tpi_tcp_ctl_kind;

_Static_assert(TPI_TCP_RECORD_SIZE == TP_FRAME_HEADER_SIZE,
               "records and frame headers are read with one 24-byte buffer");

/* Writes a hello record; sender, receiver and world are worker ids/counts;
 * flags TPI_TCP_HELLO_*. */
void tpi_tcp_hello_encode(uint8_t rec[TPI_TCP_RECORD_SIZE], tpi_tcp_hello_kind kind,
                          uint32_t sender, uint32_t receiver, uint32_t world_size,
                          unsigned flags);
/*
 * Checks a hello record from the network: magic, version, kind, reserved
 * bytes, the world size, receiver == me, sender < world and != me. On
 * success *sender is the other end's worker id; otherwise a message.
 */
int tpi_tcp_hello_check(const uint8_t rec[TPI_TCP_RECORD_SIZE], tpi_tcp_hello_kind kind,
                        uint32_t me, uint32_t world_size, unsigned flags, uint32_t *sender,
                        char *errmsg, size_t errmsg_len);
/* Little-endian u32 at p: the records' fields, the slab and probe headers. */
void tpi_tcp_put_u32(uint8_t *p, uint32_t v);
uint32_t tpi_tcp_get_u32(const uint8_t *p);
void tpi_tcp_ctl_encode(uint8_t rec[TPI_TCP_RECORD_SIZE], tpi_tcp_ctl_kind kind, uint32_t sender);
/* 1 when rec starts with the control magic. */
int tpi_tcp_is_ctl(const uint8_t rec[TPI_TCP_RECORD_SIZE]);
/* The kind of a well-formed control record, 0 for a malformed one. */
int tpi_tcp_ctl_kind_of(const uint8_t rec[TPI_TCP_RECORD_SIZE]);
/* A shared memory record (TCP-22): kind TPI_TCP_SHM_* and three fields. */
void tpi_tcp_shm_encode(uint8_t rec[TPI_TCP_RECORD_SIZE], tpi_tcp_ctl_kind kind, uint32_t sender,
                        uint32_t x, uint32_t y, uint32_t z);
/* The kind of a well-formed shared memory record with its fields (v[3]), 0
 * for anything else. */
int tpi_tcp_shm_decode(const uint8_t rec[TPI_TCP_RECORD_SIZE], uint32_t v[3]);

/* ---- Bounds and timeouts ------------------------------------------------- */

/* Bytes the loop reads at once when it is not reading a large body directly. */
#define TPI_TCP_STAGING_SIZE (64 * 1024)
/* A body with at least this many bytes still to come is read straight into
 * its frame; smaller rests are copied from the staging buffer. */
#define TPI_TCP_DIRECT_MIN 4096
/* Frames a read batch hands on between two flushes of what they caused to
 * be queued: the answers stream out while the batch is still being read,
 * instead of all at its end (the peer would sit idle meanwhile). */
#define TPI_TCP_FLUSH_EVERY 128
_Static_assert(TPI_TCP_SEAL_MAX <= TPI_TCP_STAGING_SIZE, "a record opens into the staging buffer");
_Static_assert(TPI_TCP_STAGING_SIZE <= TPI_TCP_SEAL_BUF,
               "the sealed rest of one staging read fits the sealed buffer (TCP-21)");
/* The hello, frame and idle deadlines, the read budget and the connection
 * caps are common/limits.h's (TCP-19). */
/* A dialed connection must be accepted and answered within this time. */
#define TPI_TCP_CONNECT_TIMEOUT_MS 30000
/* A dial that failed before the other end answered (reset, end of file,
 * refused) is tried again (TCP-20): first after TPI_TCP_REDIAL_FIRST_MS, then
 * twice as long each time up to TPI_TCP_REDIAL_MAX_MS. One reset is no
 * evidence of death: a live worker out of descriptors resets what it cannot
 * accept. Refusals for TPI_TCP_REFUSED_DEAD_MS are (nothing listens at the
 * address any more); other failures for TPI_TCP_CONNECT_TIMEOUT_MS end in
 * TP_EIO, not death. */
#define TPI_TCP_REDIAL_FIRST_MS 10
#define TPI_TCP_REDIAL_MAX_MS 1000
#define TPI_TCP_REFUSED_DEAD_MS 1000
/* A suspected peer must answer a probe within this time (TCP-7). */
#define TPI_TCP_PROBE_TIMEOUT_MS 5000
/* An aborted connection is closed after its ABORT record or this time. */
#define TPI_TCP_ABORT_LINGER_MS 2000
/* Buffers in one uv_write: Linux's IOV_MAX; more frames take several writes. */
#define TPI_TCP_WRITE_BUFS_MAX 1024
/* Listen backlog: a whole world may dial one worker at once. */
#define TPI_TCP_BACKLOG 1024

/* ---- Dead hosts without a reset (TCP-23) --------------------------------- */

/* A host that vanished without a FIN or RST (power loss, a cut cable, a
 * partition) is found by the kernel, never by us: keepalive probes on an
 * idle connection, and TCP_USER_TIMEOUT on one with data unacknowledged.
 * Probes start after keepalive_idle seconds of silence, one every
 * keepalive_interval; with TCP_USER_TIMEOUT set, Linux ends an idle
 * connection at the first unanswered probe at or after user_timeout of
 * silence (not after keepalive_count probes), and one with data unacknowledged
 * user_timeout after its oldest unacknowledged byte went out. user_timeout
 * defaults to keepalive_idle + keepalive_interval * keepalive_count, where
 * the two rules agree: 45 s, where Linux alone would never find an idle
 * connection's end (no keepalive) and take 15 min or more with data
 * (tcp_retries2). The kernel answers probes for a busy process, so only a
 * silent host, or a peer that stops reading for user_timeout while we have
 * data for it, is found this way. Options may lower or raise each (TCP-12)
 * within the caps below. */
#define TPI_TCP_KEEPALIVE_S 30
#define TPI_TCP_KEEPALIVE_INTVL_S 5
#define TPI_TCP_KEEPALIVE_CNT 3
#define TPI_TCP_USER_TIMEOUT_MS                                                                    \
    ((TPI_TCP_KEEPALIVE_S + TPI_TCP_KEEPALIVE_INTVL_S * TPI_TCP_KEEPALIVE_CNT) * 1000)
/* Caps of the options. Idle: Linux's own default (2 h); a longer one would
 * probe less often than a stock keepalive. Interval: 10 min. Count:
 * Linux's MAX_TCP_KEEPCNT. user_timeout: a day, which holds the largest
 * idle + interval * count and fits TCP_USER_TIMEOUT's int milliseconds. */
#define TPI_TCP_KEEPALIVE_S_MAX 7200
#define TPI_TCP_KEEPALIVE_INTVL_S_MAX 600
#define TPI_TCP_KEEPALIVE_CNT_MAX 127
#define TPI_TCP_USER_TIMEOUT_S_MAX 86400
_Static_assert(TPI_TCP_KEEPALIVE_S <= TPI_TCP_KEEPALIVE_S_MAX &&
                   TPI_TCP_KEEPALIVE_INTVL_S <= TPI_TCP_KEEPALIVE_INTVL_S_MAX &&
                   TPI_TCP_KEEPALIVE_CNT <= TPI_TCP_KEEPALIVE_CNT_MAX,
               "the defaults are within the caps");
_Static_assert(TPI_TCP_KEEPALIVE_S_MAX + TPI_TCP_KEEPALIVE_INTVL_S_MAX * TPI_TCP_KEEPALIVE_CNT_MAX <=
                   TPI_TCP_USER_TIMEOUT_S_MAX,
               "the derived user_timeout of any allowed keepalive is allowed");
_Static_assert(TPI_TCP_USER_TIMEOUT_S_MAX * 1000LL <= 2147483647LL,
               "TCP_USER_TIMEOUT takes an int of milliseconds");

/* TCP-25: a peer silent this long is declared down (TP_EPEERDOWN): from a
 * connection of ours to it that ended in silence (TCP-23) or a dial that
 * timed out, through every dial since (one a second, data or not) timing
 * out, to now. One minute: past the longest partition a job should ride
 * out without losing its calls for good, short enough that the rest of a
 * job does not stall on a lost machine. 0 (the option) never declares. */
#define TPI_TCP_PEER_DOWN_TIMEOUT_S 60
#define TPI_TCP_PEER_DOWN_TIMEOUT_S_MAX 86400
/* While a peer is silent it is dialed at least this often (TCP-25). */
#define TPI_TCP_SILENT_DIAL_MS TPI_TCP_REDIAL_MAX_MS

/* The keepalive and user timeout of a socket, from the backend options
 * keepalive_idle, keepalive_interval, keepalive_count and user_timeout. */
typedef struct tpi_tcp_keepalive {
    uint32_t idle_s, intvl_s, cnt;
    uint32_t user_timeout_ms;
} tpi_tcp_keepalive;

/* The defaults (TPI_TCP_KEEPALIVE_*, TPI_TCP_USER_TIMEOUT_MS). */
tpi_tcp_keepalive tpi_tcp_keepalive_default(void);
/* tcp_agent.c: *ka from the options, each unset one at its default and
 * user_timeout at idle + interval * count unless set. TP_EINVAL naming the
 * key and its range, or a user_timeout below idle + interval * count (Linux
 * would end an idle connection before count probes went unanswered). Any
 * thread. */
tp_status tpi_tcp_keepalive_read(const tp_options *opts, tpi_tcp_keepalive *ka, char *errmsg,
                                 size_t errmsg_len);
/* tcp_conn.c: sets SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT and
 * TCP_USER_TIMEOUT on a connected or connecting TCP socket. Best effort: a
 * socket that refuses an option still works, with the kernel's default for
 * it. Any thread. */
void tpi_tcp_keepalive_apply(int fd, const tpi_tcp_keepalive *ka);

/* ---- Shared memory between workers on one host (TCP-22): tcp_shm.c ------- */

/* Frames of at least this many bytes go through a slab (option shm_min_bytes):
 * below it the stream's own copy costs less than a record and a release. */
#define TPI_SHM_MIN_DEFAULT ((uint64_t)1 << 20)
/* Slabs a worker keeps per peer, and their bytes (option shm_pool_bytes):
 * a frame finding every slab busy, or no room, takes the stream. */
#define TPI_SHM_SLABS_MAX 16
_Static_assert(TPI_SHM_SLABS_MAX <= 32, "the acceptor's release mask is a u32");
_Static_assert(TPI_SHM_SLABS_MAX <= 256, "a FRAME record's slot is its low 8 bits");
#define TPI_SHM_POOL_DEFAULT ((uint64_t)512 << 20)
/* Slabs are sized in steps of this, so a slightly longer frame reuses one. */
#define TPI_SHM_SLAB_STEP ((uint64_t)2 << 20)
/* A slab's header: magic, sender, receiver, slot, frame length, the slab's
 * size (checked against the record and fstat), where the frame starts: at
 * TPI_SHM_HEAD plus less than TPI_SHM_ALIGN, so that its largest tensor
 * lies aligned. */
#define TPI_SHM_HEAD 64
#define TPI_SHM_ALIGN 64
#define TPI_SHM_PROBE_SIZE 64

/* TCP-28: the ring of frames each outgoing connection to a worker on this
 * host writes (option shm_ring_bytes, its data bytes: a power of two; 0
 * keeps frames on the stream). 256 KiB holds a window of a thousand small
 * calls; frames above half of it take slabs. The mapping is the data plus
 * the ring's 512-byte header, its pages reserved at creation. */
#define TPI_SHM_RING_DEFAULT ((uint64_t)256 << 10)
#define TPI_SHM_RING_MIN ((uint64_t)4 << 10)
#define TPI_SHM_RING_MAX ((uint64_t)256 << 20)
_Static_assert(TPI_SHM_RING_MIN >= TPI_RING_CAP_MIN && TPI_SHM_RING_MAX <= TPI_RING_CAP_MAX,
               "the option's bounds are rings' bounds");
_Static_assert(TPI_RING_RECORD_MAX(TPI_SHM_RING_MIN) >= 2 * TP_FRAME_HEADER_SIZE,
               "the smallest ring holds a frame header and a record");
/* Records the reader hands on per turn of its loop before other events
 * get theirs: a busy ring does not starve the other connections. */
#define TPI_SHM_RING_BATCH 256
/* TCP-29: option spin_us, how long a waiting thread spins before it
 * sleeps (0, the default: never). Capped so a spin stays a short wait: a
 * longer one is a sleep that burns a CPU. */
#define TPI_TCP_SPIN_US_MAX 10000

typedef struct tpi_tcp_agent tpi_tcp_agent;
typedef struct tpi_shm_tx tpi_shm_tx; /* a peer's slabs (loop thread) */
typedef struct tpi_shm_rx tpi_shm_rx; /* an accepted connection's side (refcounted) */

/* One end of a connection's ring (TCP-28), the loop thread's: the dialer
 * writes (senders too, with the grant, TCP-15), the acceptor reads. Both
 * bells are eventfds of the dialer's, taken by the acceptor: the data bell
 * wakes the reader, the room bell a writer waiting for room. */
typedef struct tpi_shm_link {
    tpi_ring ring;
    uint8_t *map; /* MAP_FAILED until mapped */
    size_t map_len;
    int fd;      /* dialer: the ring's memfd until the acceptor answered; -1 after */
    int wake_fd; /* the bell this end rings (the ring's bell): the other end polls it */
    int wait_fd; /* the bell this end polls */
} tpi_shm_link;

/* The bytes of a slab for a frame of frame_len bytes (header, alignment,
 * in TPI_SHM_SLAB_STEP steps). */
uint64_t tpi_shm_slab_size(uint64_t frame_len);
/* Options shm, shm_min_bytes, shm_pool_bytes; after the encrypt setup (shm
 * is off with encrypt=on). */
tp_status tpi_shm_setup(tpi_tcp_agent *a, const tp_options *opts, char *errmsg,
                        size_t errmsg_len);
/* close(fd) for the descriptors shared memory makes with system calls
 * ThreadSanitizer does not see (memfd_create, pidfd_*): the probe, slabs and
 * pidfds all close through it (tests/tsan.supp says why). */
void tpi_shm_close_untracked(int fd);
/* Dialer: a fresh probe (*probe_fd, closed by the caller with
 * tpi_shm_close_untracked once answered), the ring it names (*link, NULL
 * with shm_ring_bytes=0 or when one cannot be made; the caller's) and the
 * OFFER record; 0 or -1. */
int tpi_shm_offer(tpi_tcp_agent *a, uint32_t peer, int *probe_fd, tpi_shm_link **link,
                  uint8_t rec[TPI_TCP_RECORD_SIZE]);
/* Acceptor: checks an OFFER's probe (v: its fields) from peer; the side of
 * connection conn, or NULL with *why. With a side, *link is the ring the
 * probe names, taken (the caller's), or NULL: with *ring_why when one was
 * offered and wanted but could not be taken, *ring_why NULL when the probe
 * names none or this worker has shm_ring_bytes=0. */
tpi_shm_rx *tpi_shm_accept(tpi_tcp_agent *a, uint32_t peer, void *conn, const uint32_t v[3],
                           const char **why, tpi_shm_link **link, const char **ring_why);
/* Frees a link: the mapping, the memfd and bells. NULL is a no-op. */
void tpi_shm_link_free(tpi_shm_link *l);
/* Dialer: the acceptor took the ring (it answered): its memfd goes. */
void tpi_shm_link_opened(tpi_shm_link *l);
/* Writes frame f into ring r as one record (its segments gathered), ringing
 * the reader's bell when it sleeps: tpi_ring_write's status. The writer's
 * thread: the loop, or a sender holding the grant (TCP-15). */
tpi_ring_status tpi_shm_ring_put(tpi_ring *r, const tp_frame *f);
/* Acceptor: the frame a FRAME record (v) names, mapped, checked, lent; NULL
 * with err for a record that does not hold (a protocol error). */
tp_frame *tpi_shm_frame(tpi_shm_rx *rx, const uint32_t v[3], uint64_t max_msg, char *err,
                        size_t err_len);
/* Acceptor: its connection is gone; frames still out release silently.
 * NULL is a no-op. */
void tpi_shm_rx_detach(tpi_shm_rx *rx);
/* Loop: the sides with releases to tell (their list reference passes to the caller). */
tpi_shm_rx *tpi_shm_released_take(tpi_tcp_agent *a);
/* Loop: rx's released slots (a mask, bit i for slot i), off the list, with
 * the next side on that list; the connection to tell, NULL when gone. */
void *tpi_shm_rx_take(tpi_shm_rx *rx, tpi_shm_rx **next, uint32_t *released);
void tpi_shm_rx_unref(tpi_shm_rx *rx);
/* Dialer: copies f into a free slab and writes its FRAME record; 0, or -1
 * when no slab can take it (the frame then takes the stream). */
int tpi_shm_pack(tpi_tcp_agent *a, uint32_t peer, uint64_t session, const tp_frame *f,
                 uint8_t rec[TPI_TCP_RECORD_SIZE]);
/* Dialer: a RELEASE on the connection of session; -1 when slot is not a
 * slab busy with that session (a protocol error). */
int tpi_shm_release(tpi_tcp_agent *a, uint32_t peer, uint64_t session, uint32_t slot);
/* Dialer: the connection of session ended; its busy slabs go. */
void tpi_shm_session_end(tpi_tcp_agent *a, uint32_t peer, uint64_t session);
void tpi_shm_tx_free(tpi_shm_tx *tx);
/* fuzz_tcp_shm: an acceptor's side without an agent or a proof (pidfd may
 * be this process's own); tpi_shm_rx_detach ends it (and closes pidfd). */
tpi_shm_rx *tpi_shm_rx_for_fuzz(int pidfd, uint32_t peer, uint32_t me, uint64_t max_msg);

/* ---- The agent ------------------------------------------------------------ */

/* Park tokens kept for threads whose first one finds no memory (tcp_sync.c). */
#define TPI_TCP_TASK_SPARES 64

typedef struct tpi_tcp_task tpi_tcp_task;
struct tpi_tcp_task {
    sem_t sem;                 /* posted by unpark; waited on with CLOCK_MONOTONIC */
    atomic_int permit;         /* an unpark not yet consumed by a park */
    atomic_int refs;           /* the thread's own, plus one per deferred signal */
    tpi_tcp_task *prev, *next; /* the agent's parked list, under its mu */
    int parked;
    /* TCP-30: the ring this parked task reads its reply from, set and
     * cleared under the agent's mu (so an unpark, under it, may nudge it). */
    _Atomic(tpi_ring *) rd_ring;
};

/* Unparks whose signal waits for the core lock's release (tcp_sync.c). */
#define TPI_TCP_WAKE_MAX 32

/* A pool thread (tcp_pool.c); slots live until pool_join. */
typedef struct tpi_tcp_pool_thread tpi_tcp_pool_thread;
struct tpi_tcp_pool_thread {
    pthread_t tid;
    sem_t sem; /* waits here while idle */
    tpi_tcp_agent *a;
    /* pool_mu */
    tpi_tcp_pool_thread *next_idle; /* the agent's idle stack */
    int woken;                      /* popped by a waker: searching (nsearch) */
};

typedef struct tpi_tcp_conn tpi_tcp_conn;

typedef struct tpi_tcp_peer {
    char addr[TPI_ADDR_LEN_MAX]; /* as published; "" until set_peers */
    struct sockaddr_storage sa;  /* resolved in set_peers */
    /* qmu */
    tp_frame *q_head, *q_tail; /* frames waiting for the loop */
    int dirty;                 /* on the agent's dirty list */
    int dead;                  /* TP_EPEERDOWN seen: send fails at once */
    int direct_fd;             /* >= 0: a sender may write one frame to this socket itself (TCP-15) */
    tpi_ring *direct_ring;     /* or, TCP-28, into this ring: one grant or the other, never both */
    uint32_t grant_gen; /* bumped by each revoke: a ring writer keeps the grant unless it moved */
    int direct_busy;           /* a sender took the grant and is writing, without qmu */
    int direct_pending;        /* the loop granted while busy: the writer restores the
                                  grant on the socket it wrote to (the loop revokes,
                                  clearing this, before that socket can change) */
    int regrant;               /* on the agent's regrant list */
    /* TCP-30: the accepted connection whose ring a task waiting for a reply
     * may read (published by the loop while it sleeps on that ring), and
     * the one a task took; the loop revokes both before it reads. */
    tpi_tcp_conn *rd_conn;
    tpi_tcp_conn *rd_held;
    /* The peer restarted (AGENT-16): its new address, applied by the loop
     * before it next dials or writes (qmu). */
    int readdress;
    char next_addr[TPI_ADDR_LEN_MAX];
    struct sockaddr_storage next_sa;
    /* Bumped by each restart: news of a connection of an older generation
     * (its end, its errors) is about an earlier incarnation and is ignored. */
    atomic_uint gen;
    atomic_int shm_active; /* TCP-22: large frames go through slabs (no direct writes) */
    /* AGENT-18: bytes for this peer not written yet: in the queue above
     * (q_bytes, qmu writes) and on its connection (wq_bytes: libuv's write
     * queue and what waits to be sealed; the loop writes); cong_armed: the
     * core saw them over the bound and waits for tp_core_on_uncongested. */
    atomic_uint_fast64_t q_bytes;
    atomic_uint_fast64_t wq_bytes;
    atomic_int cong_armed;
    /* loop thread only */
    tpi_tcp_conn *out; /* the connection we dialed: frames go there */
    tpi_shm_tx *shm_tx; /* TCP-22: our slabs for this peer, NULL until first used */
    uint64_t shm_sessions; /* TCP-22: sessions begun with this peer */
    int suspect;       /* a probe is running (TCP-7) */
    char suspect_detail[160];
    /* TCP-20: the dial failed before an answer; the next one waits for the
     * redial timer (inited on first use, closed by stop). */
    uv_timer_t redial;
    int redial_inited, redial_pending;
    uint64_t dial_fail_since_ns; /* 0 once a dial was answered */
    unsigned dial_backoff_ms;
    /* TCP-25: silent since (0: it answers); the timer that dials it and
     * declares it down (inited on first use, closed by stop). */
    uint64_t silent_since_ms; /* the loop's clock; 0: not silent */
    char silent_detail[160];
    uv_timer_t silent_timer;
    int silent_inited;
} tpi_tcp_peer;

struct tpi_tcp_agent {
    uint32_t rank;
    uint32_t world_size;
    uint64_t max_msg;
    uint32_t pool_max;
    /* TCP-19: bounds from the options, set at init, read-only after. */
    uint32_t hello_ms, frame_ms, idle_ms, handshakes_max;
    uint64_t rx_budget;
    tp_core *core;
    uint64_t unsent_max; /* OPT-11, AGENT-18: set at init */
    tpi_tcp_keepalive keepalive; /* TCP-23: every connection's; set at init, read-only after */
    uint64_t peer_down_ms;       /* TCP-25: 0 never declares; set at init, read-only after */
    tp_context *ctx;
    tp_store *store;
    char listen_host[TPI_ADDR_LEN_MAX];
    char advertise_host[TPI_ADDR_LEN_MAX];
    uint16_t listen_port;
    char self_addr[TPI_ADDR_LEN_MAX];
    tpi_tcp_auth auth; /* TCP-17: set at init, read-only after */
    int encrypt;       /* TCP-21: streams sealed after the handshake; no direct writes */
    int shm_on;        /* TCP-22: offer and accept shared memory (set at init) */
    uint64_t shm_min, shm_pool;
    uint64_t shm_ring; /* TCP-28: a ring's data bytes; 0: no ring (set at init) */
    uint64_t spin_ns;  /* TCP-29: option spin_us; 0: waits never spin (set at init) */

    /* The core lock, the tasks parked on it, and the unparked tasks to
     * signal once it is released (each holds a reference: tcp_sync.c). */
    pthread_mutex_t mu;
    tpi_tcp_task *parked;
    tpi_tcp_task *to_wake[TPI_TCP_WAKE_MAX];
    uint32_t nwake;

    /* qmu: what other threads hand to the loop. */
    pthread_mutex_t qmu;
    int stopping;
    atomic_int stop_flag; /* mirror of stopping, read without qmu */
    int have_peers;
    tpi_tcp_peer *peers; /* world_size entries */
    uint32_t *dirty;     /* ids with queued frames */
    uint32_t ndirty;
    uint32_t *regrant;   /* ids whose direct write was used: the loop grants another */
    atomic_uint nregrant; /* written under qmu; read without it to skip an empty list */
    uint64_t timer_deadline_ns;
    int timer_dirty;
    tpi_shm_rx *shm_released; /* TCP-22: sides with releases for the loop to tell */

    /* The pool (tcp_pool.c), under pool_mu. */
    pthread_mutex_t pool_mu;
    tp_work *w_head, *w_tail;
    uint32_t w_len;
    uint32_t nthreads;
    uint32_t nsearch;          /* threads woken or started for the queue, no item yet */
    tpi_tcp_pool_thread *idle; /* idle threads, most recent first */
    int pool_closing;
    tpi_tcp_pool_thread *threads; /* pool_max slots; the first nthreads started */

    /* The loop (loop thread only after start). */
    uv_loop_t loop;
    uv_async_t wake;
    uv_timer_t timer;
    uv_check_t check; /* after each poll: direct writes granted again (TCP-15) */
    uv_prepare_t spin; /* before each poll: TCP-29's spin on the rings read */
    atomic_uint wakes; /* tpi_tcp_wake calls: a spinning loop stops at a new one */
    uv_tcp_t listener;
    pthread_t loop_thread;
    int loop_inited;
    int started;
    int stopped;
    uint32_t *dirty_work; /* the loop's copy of the dirty list */
    tpi_tcp_conn *conns;  /* every connection not yet freed */
    uint8_t *staging;
    /* TCP-19, loop thread only: the read budget and the handshakes. */
    uint64_t rx_pending;                     /* bytes of the frames being read */
    tpi_tcp_conn *rx_wait_head, *rx_wait_tail; /* headers waiting for the budget, FIFO */
    uv_idle_t rx_admit;                      /* admits them after a release */
    uint32_t nhandshakes;                    /* accepted, not yet identified */
    uint64_t refused_log_ms;                 /* rate limit of the "refused" warning */
    uint32_t refused_unlogged;
    uint8_t rec_bye[TPI_TCP_RECORD_SIZE];
    uint8_t rec_abort[TPI_TCP_RECORD_SIZE];
    uint8_t rec_ping[TPI_TCP_RECORD_SIZE];
    uint8_t rec_pong[TPI_TCP_RECORD_SIZE];
    uint8_t rec_idle[TPI_TCP_RECORD_SIZE];
    uint8_t rec_close[TPI_TCP_RECORD_SIZE];
};

/* ---- tcp_sync.c: lock, tasks, park/unpark, clock, threads ---------------- */

void tpi_tcp_lock(tp_agent *a);
void tpi_tcp_unlock(tp_agent *a);
/* TCP-31: the calling thread (the loop) hands on a batch of frames; the
 * unparks its unlocks record are signaled by the flush or by the end of the
 * outermost batch, not at each unlock. Batches nest. */
void tpi_tcp_wake_batch_begin(tpi_tcp_agent *a);
void tpi_tcp_wake_batch_flush(tpi_tcp_agent *a);
void tpi_tcp_wake_batch_end(tpi_tcp_agent *a);
tp_task *tpi_tcp_task_self(tp_agent *a);
tp_status tpi_tcp_park(tp_agent *a, tp_task *self, uint64_t deadline_ns);
tp_status tpi_tcp_park_peer(tp_agent *a, tp_task *self, uint64_t deadline_ns, uint32_t peer);
void tpi_tcp_unpark(tp_agent *a, tp_task *t);
/* Wakes every task parked on the agent (stop): they see stop_flag. */
void tpi_tcp_wake_parked(tpi_tcp_agent *a);
uint64_t tpi_tcp_now_ns(void);
/* ns in whole milliseconds, rounded up: a wait or timer is never early by
 * rounding, and any time left is at least 1 ms (0 only for 0). */
uint64_t tpi_tcp_ms_ceil(uint64_t ns);

/* ---- tcp_agent.c ------------------------------------------------------------ */

/* A whole-number backend option in [min, max] into *out, which keeps its
 * value (the default) when the key is unset; TP_EINVAL naming the key, the
 * range and then note otherwise. */
tp_status tpi_tcp_read_count(const tp_options *opts, const char *key, uint64_t min, uint64_t max,
                             const char *note, uint64_t *out, char *errmsg, size_t errmsg_len);

/* ---- tcp_pool.c (AGENT-7) -------------------------------------------------- */

tp_status tpi_tcp_pool_execute(tpi_tcp_agent *a, tp_work *w);
/* Refuses new items; the queued ones still run. */
void tpi_tcp_pool_close(tpi_tcp_agent *a);
/* Waits for every pool thread to finish the queue and exit. */
void tpi_tcp_pool_join(tpi_tcp_agent *a);

/* ---- tcp_loop.c: the loop thread, the timer, send ------------------------- */

tp_status tpi_tcp_loop_start(tpi_tcp_agent *a, char *errmsg, size_t errmsg_len);
/* Joins the loop thread once the agent set stopping and woke it (stop). */
void tpi_tcp_loop_stop(tpi_tcp_agent *a);
tp_status tpi_tcp_send(tpi_tcp_agent *a, uint32_t dst, tp_frame *f);
/* Lists peer id for the loop's next flush, once until then (qmu held). */
void tpi_tcp_mark_dirty(tpi_tcp_agent *a, uint32_t id);
/* TCP-29: the loop would now sleep in its poll for up to max_ns
 * (UINT64_MAX: no timer): it spins on the rings it reads first. */
void tpi_tcp_ring_spin(tpi_tcp_agent *a, uint64_t max_ns);

/* TCP-30, a caller that reads its own reply. A task parked for a reply
 * from peer takes the ring the loop published for it (NULL: none; the
 * agent's mu held, qmu taken inside), reads it (mu not held) until its
 * permit, stop, a revoke or the deadline, handing on every RESPONSE, and
 * gives it back (mu held). read answers 1 when it left a record that is not
 * a RESPONSE (or a broken ring) for the loop. */
tpi_tcp_conn *tpi_tcp_reply_take(tpi_tcp_agent *a, uint32_t peer);
tpi_ring *tpi_tcp_reply_ring(tpi_tcp_conn *c);
int tpi_tcp_reply_read(tpi_tcp_agent *a, tpi_tcp_conn *c, const atomic_int *permit,
                       uint64_t deadline_ns);
void tpi_tcp_reply_release(tpi_tcp_agent *a, tpi_tcp_conn *c, int left);
/* Wakes the loop (uv_async_send), also out of TCP-29's spin. */
static inline void tpi_tcp_wake(tpi_tcp_agent *a) {
    atomic_fetch_add_explicit(&a->wakes, 1, memory_order_release);
    uv_async_send(&a->wake);
}
/* Writes what senders queued, now (loop thread, between upcalls): frames
 * answered while a read batch is handled go out without waiting for its end. */
void tpi_tcp_flush_dirty(tpi_tcp_agent *a);
void tpi_tcp_timer_arm(tpi_tcp_agent *a, uint64_t deadline_ns);
/* Frees every frame still queued (after the loop is gone). */
void tpi_tcp_drop_queues(tpi_tcp_agent *a);

/* ---- tcp_conn.c: connections (loop thread) -------------------------------- */

/* uv_connection_cb of the listener. */
void tpi_tcp_on_accept(uv_stream_t *server, int status);
/* AGENT-18 (tcp_conn.c, loop thread): re-reads what peer id's connection
 * holds unwritten, and tells the core once it fell to half the bound (or
 * the peer is down) if the core was told it was over. */
void tpi_tcp_unsent_update(tpi_tcp_agent *a, uint32_t id);
/* AGENT-18: whether the bytes held for id are over the bound (any thread). */
int tpi_tcp_congested(tpi_tcp_agent *a, uint32_t id);

/* Writes whatever is queued for peer id, dialing first if needed. */
void tpi_tcp_flush(tpi_tcp_agent *a, uint32_t id);
/* AGENT-16: rank restarted at addr (any thread, core lock held). */
tp_status tpi_tcp_set_peer(tpi_tcp_agent *a, uint32_t rank, const char *addr, char *errmsg,
                           size_t errmsg_len);
/* TCP-22: tells each dialer which of its slabs our frames freed (RELEASE). */
void tpi_tcp_shm_tell_released(tpi_tcp_agent *a);
/* Closes every connection (stop): BYE where it can, no upcall. */
void tpi_tcp_close_all(tpi_tcp_agent *a);
/* Lets a sender write to peer id's outgoing socket itself if nothing of ours
 * is queued on it (TCP-15). */
void tpi_tcp_direct_grant(tpi_tcp_agent *a, uint32_t id);
/* uv_idle_cb of a->rx_admit: admits the headers waiting for the read budget (TCP-19). */
void tpi_tcp_on_rx_admit(uv_idle_t *h);
/* Grants again every direct write used since the last call (loop thread). */
void tpi_tcp_direct_regrant(tpi_tcp_agent *a);
/* The bytes one queued write of nbufs buffers mallocs (its request and
 * buffers): for the tests that make that allocation fail. */
size_t tpi_tcp_conn_write_size(unsigned nbufs);
/* The bytes a connection's record callocs: for the tests that make it fail. */
size_t tpi_tcp_conn_size(void);
/* Revokes the grant and waits out a sender still writing with it (qmu held,
 * released while it waits); after it, only the loop writes to the socket. */
void tpi_tcp_direct_stop_locked(tpi_tcp_agent *a, tpi_tcp_peer *p);

/* ---- tcp_addr.c ---------------------------------------------------------- */

/* Splits "host:port" or "[v6]:port"; 0 on success. */
int tpi_tcp_split_hostport(const char *s, char *host, size_t host_len, char *port, size_t port_len);
/* A decimal port 0..65535 (allow_zero) or 1..65535; 0 on success. */
int tpi_tcp_parse_port(const char *s, int allow_zero, uint16_t *port);
/* Resolves host and a numeric port to the first address getaddrinfo gives:
 * *sa_len bytes of it in *sa, and the rest of *sa zeroed (a whole
 * sockaddr_storage is copied and handed on; no stale byte travels with it). */
tp_status tpi_tcp_resolve(const char *host, uint16_t port, struct sockaddr_storage *sa,
                          socklen_t *sa_len, char *errmsg, size_t errmsg_len);
/* The address this host uses to reach host (the route's source: a datagram
 * socket connected toward it, no packet sent), as text into out: "127.0.0.1"
 * or "::1" when host is a loopback address. 0, or -1 when host does not
 * resolve or no route leads there (TCP-12's automatic listen_addr). */
int tpi_tcp_local_addr_toward(const char *host, char *out, size_t len);
/* The host of the store init_method names (env://: MASTER_ADDR; tcp://: its
 * host; etcd://: the first endpoint's), unbracketed, into host: 1, or 0 when
 * the method names no host (sqlite://) or is malformed (init reports that). */
int tpi_tcp_store_host(const tp_options *opts, char *host, size_t len);
/* "host:port", or "[v6]:port", of a socket address. */
void tpi_tcp_format_sockaddr(const struct sockaddr *sa, char *buf, size_t len);
/* A host as a user may write it, "::1" or "[::1]", without the brackets
 * (a "[v6]" with nothing after ']'); 0 on success, -1 when it does not fit or
 * is a lone bracket. */
int tpi_tcp_unbracket(const char *s, char *out, size_t out_len);
/* "host:port", bracketing a host that contains ':'. */
void tpi_tcp_format_hostport(const char *host, uint16_t port, char *buf, size_t len);

/* ---- uv_errors.c: libuv and errno codes to tp_status, at the edge --------- */

/* The status for a libuv error code (negative errno on Unix). */
tp_status tpi_uv_status(int uverr, tp_status fallback);
/* The status for an errno value. */
tp_status tpi_errno_status(int err, tp_status fallback);
/* Whether a connection error means the peer process is gone (TCP-6). */
int tpi_uv_err_means_dead(int uverr);

/* ---- tcp_sock.c: blocking-style sockets with deadlines (the store) -------- */

/* A sentinel returned for an orderly close by the other end. */
#define TPI_SOCK_EOF (-100000)
/* Connects within timeout_ms; the fd (non-blocking, CLOEXEC) or -errno. */
int tpi_sock_connect(const struct sockaddr *sa, socklen_t sa_len, int timeout_ms);
/* Sends all n bytes before deadline_ns (MSG_NOSIGNAL); 0 or -errno. */
int tpi_sock_send_all(int fd, const void *p, size_t n, uint64_t deadline_ns);
/* Reads exactly n bytes before deadline_ns; 0, -errno or TPI_SOCK_EOF. */
int tpi_sock_recv_all(int fd, void *p, size_t n, uint64_t deadline_ns);
/* Text for a tpi_sock_* error code. */
const char *tpi_sock_strerror(int rc);
/* TCP-27: opens /dev/null on each of descriptors 0 to 2 that is closed, so
 * that no socket of ours takes one. Best effort. */
void tpi_stdio_reserve(void);
/* TCP-27: fd as a descriptor above 2, or -1 (errno) when it cannot be
 * moved; either way the original is gone (/dev/null in its place). */
int tpi_fd_above_stdio(int fd);

/* ---- tcp_store.c, tcp_store_server.c: the TCP rendezvous store (TCP-9..11) - */

#define TPI_STORE_PROTO_MAGIC "TPST"
#define TPI_STORE_PROTO_VERSION 2 /* 2: the authenticated handshake (TCP-17) */
/* The client's hello: "TPST", version, flags (bit 0: auth), 2 zero bytes, u32
 * its rank, its 16-byte nonce. */
#define TPI_STORE_HANDSHAKE_LEN 28
/* The server's hello: "TPST", version, flags, 2 zero bytes, its nonce, its
 * proof (zeros without auth). With auth the client then sends its proof and
 * the server answers "TPOK" (or closes). */
#define TPI_STORE_SERVER_HELLO_LEN 40
#define TPI_STORE_AUTH_OK "TPOK"
/* A request or reply body: an op, a key and up to two values. */
#define TPI_STORE_MSG_MAX (64u + TP_STORE_KEY_LEN_MAX + 2u * (4u + TP_STORE_VALUE_LEN_MAX))
/* One store operation's deadline (reply included). */
#define TPI_STORE_OP_TIMEOUT_MS 30000
/* The longest rank 0 keeps its store server for clients still connected. */
#define TPI_STORE_LINGER_MAX_S 30.0

/* The store server's bounds (TCP-18): whatever its clients do, it holds at
 * most this much for them, and one client never holds up another. */
/* Connections at once: a job of thousands of workers, each with one store
 * connection, and room for reconnects. Beyond it a new connection is closed
 * at once (the client retries, TCP-9). */
#define TPI_STORE_SERVER_CONNS_MAX 4096u
/* Connections still in their handshake: a stranger holds a slot until the
 * handshake deadline, so a flood of them is capped well below the whole, and
 * authenticated workers keep the rest. Hundreds of workers arriving at once
 * mostly get in; the others are closed and retry. */
#define TPI_STORE_SERVER_UNAUTH_MAX 256u
/* From accept to an authenticated client (TCP-17), as a worker connection's
 * hello (TPI_TCP_HELLO_TIMEOUT_MS). There is no idle deadline after it: a
 * worker stays connected, idle, for its whole job (and for all of its init
 * timeout while it waits for others); keepalive finds a vanished host. */
#define TPI_STORE_SERVER_HANDSHAKE_MS 10000u
/* From a request's first byte to its last: a slow sender is dropped. The
 * client gives up on an operation after the same time. */
#define TPI_STORE_SERVER_REQUEST_MS TPI_STORE_OP_TIMEOUT_MS
/* A client with replies unsent must take some within this time, else it is
 * dropped (a client reads its reply at once; the old blocking send waited
 * as long before dropping it). */
#define TPI_STORE_SERVER_WRITE_MS 10000u
/* Reply bytes queued for one client beyond what its socket took: two of the
 * largest replies. A client that asks and does not read is dropped here. */
#define TPI_STORE_SERVER_UNSENT_MAX (2u * (12u + TPI_STORE_MSG_MAX))
/* Bytes held for all clients: partial requests and unsent replies. A client
 * whose request or reply would pass it is dropped (its operation fails with
 * TP_ESTORE and is retried, STORE-9). 64 of the largest requests at once;
 * a rendezvous holds some hundred bytes per worker. */
#define TPI_STORE_SERVER_MEM_MAX ((size_t)128 << 20)
/* A request buffer larger than this is freed once its request is served, so
 * an idle client holds nothing large. */
#define TPI_STORE_SERVER_RX_KEEP 4096u
/* Connections accepted per loop turn: the others wait for the next turn, so
 * a flood does not starve the clients being served. */
#define TPI_STORE_SERVER_ACCEPTS_PER_TURN 64u
/* accept failing for lack of descriptors or memory pauses accepting for
 * this long, doubling up to the max, instead of spinning on it. */
#define TPI_STORE_SERVER_ACCEPT_BACKOFF_MIN_MS 10u
#define TPI_STORE_SERVER_ACCEPT_BACKOFF_MAX_MS 1000u
/* Refused connections are logged at most once per this time, with a count. */
#define TPI_STORE_SERVER_REFUSE_LOG_MS 1000u

_Static_assert(TPI_STORE_SERVER_UNAUTH_MAX <= TPI_STORE_SERVER_CONNS_MAX,
               "the handshake cap is part of the connection cap");
_Static_assert(TPI_STORE_SERVER_UNSENT_MAX >= 12u + TPI_STORE_MSG_MAX,
               "the largest reply fits in what a client may leave unsent");
_Static_assert(TPI_STORE_SERVER_MEM_MAX >= 8u * (4u + TPI_STORE_MSG_MAX + 12u + TPI_STORE_MSG_MAX),
               "the budget holds several of the largest requests and replies");
_Static_assert(TPI_STORE_SERVER_RX_KEEP < TPI_STORE_MSG_MAX, "kept buffers are small");

typedef enum tpi_store_op {
    TPI_STORE_SET = 1,
    TPI_STORE_GET = 2,
    TPI_STORE_ADD = 3,
    TPI_STORE_CAS = 4,
    TPI_STORE_DEL = 5,
    /* key: a prefix; an optional blob: the last key already seen. The reply
     * holds entries (u16 key length, key, u32 value length, value) in key
     * order; aux 1 means more follow the last one (ask again after it). */
    TPI_STORE_SCAN = 6
} tpi_store_op;
/* A scan reply stops before it grows past this (the next one goes on). */
#define TPI_STORE_SCAN_REPLY_MAX (TPI_STORE_MSG_MAX - 64u)

/* ---- tcp_store_wire.c: the store protocol's messages, without sockets ---- */

/* A reply's head: u32 length of the rest, u8 status, u8 aux, u16 0, u32
 * payload length. */
#define TPI_STORE_REPLY_HEAD_LEN 12

/* A decoded request; pointers borrow the bytes it was decoded from. */
typedef struct tpi_store_request {
    uint8_t op;    /* tpi_store_op */
    uint8_t flags; /* COMPARE_SET: bit 0, an expected value is given; else 0 */
    const uint8_t *key;
    uint16_t key_len; /* 1..TP_STORE_KEY_LEN_MAX; the key may hold a NUL (refused later) */
    /* SET: the value; COMPARE_SET: expected (empty unless flags bit 0); SCAN:
     * the last key already received, when has_a. */
    int has_a;
    const uint8_t *a;
    uint32_t a_len;
    const uint8_t *b; /* COMPARE_SET: desired */
    uint32_t b_len;
    int64_t delta; /* ADD */
} tpi_store_request;

/*
 * Decodes the request at the front of p[0..n) (its u32 length first): pure,
 * no allocation. Returns the bytes it takes (> 0) with *r filled; 0 when
 * more bytes are needed, with *need the request's total length when its
 * header is known (else 4); or -1 with *why when the bytes can never be a
 * request (TCP-10's checks, made as soon as the bytes they need are there:
 * a length out of bounds after 4 bytes, an unknown op, bad flags or key
 * length after 8). Any thread.
 */
long tpi_store_request_decode(const uint8_t *p, size_t n, tpi_store_request *r, size_t *need,
                              const char **why);
/* The encoded size of r (length field included). */
size_t tpi_store_request_size(const tpi_store_request *r);
/* Encodes r into out (tpi_store_request_size bytes); r is well formed. */
void tpi_store_request_encode(const tpi_store_request *r, uint8_t *out);
/* Writes a reply head. */
void tpi_store_reply_head_encode(uint8_t head[TPI_STORE_REPLY_HEAD_LEN], tp_status status,
                                 uint8_t aux, uint32_t payload_len);
/* Checks a reply head from the network: 0 with its fields, -1 when
 * malformed (lengths that disagree or pass TPI_STORE_MSG_MAX, an unknown
 * status, nonzero reserved bytes). */
int tpi_store_reply_head_decode(const uint8_t head[TPI_STORE_REPLY_HEAD_LEN], tp_status *status,
                                uint8_t *aux, uint32_t *payload_len);
/*
 * Calls fn for each entry of a scan reply's payload (STORE-10, TCP-10): 1
 * when fn stopped, 0 at the end, -1 when the payload is malformed (a key not
 * under prefix, not after *last, or out of bounds), -2 out of memory. last
 * (TP_STORE_KEY_LEN_MAX + 1 bytes, "" at first) gets the last key seen; *n
 * counts the entries. Values are NUL-terminated copies, lent for the call.
 */
int tpi_store_scan_entries(const uint8_t *p, size_t len, const char *prefix, size_t prefix_len,
                           int (*fn)(void *arg, const char *key, const void *value, size_t len),
                           void *arg, char *last, size_t *n);

typedef struct tpi_store_server tpi_store_server;

/* The server's deadlines and caps (TCP-18), the TPI_STORE_SERVER_* above. */
typedef struct tpi_store_server_limits {
    uint32_t handshake_ms, request_ms, write_ms;
    uint32_t conns_max, unauth_max;
    size_t unsent_max, mem_max;
} tpi_store_server_limits;
/* Tests only: servers started after this call take l (lowered deadlines, so
 * tests run in seconds); NULL restores the defaults. Not thread-safe: call
 * it before starting servers. */
void tpi_store_server_test_limits(const tpi_store_server_limits *l);

/* Binds sa and serves a fresh ":memory:" SQLite store from a thread running
 * its own uv_loop (TCP-18). desc names the address in messages. ka (NULL:
 * the defaults) is what every client's socket gets from the first one on
 * (TCP-23), until tpi_store_server_keepalive. TP_EADDRINUSE when the port
 * is taken. */
tp_status tpi_store_server_start(const struct sockaddr *sa, socklen_t sa_len, const char *desc,
                                 const tpi_tcp_auth *auth, const tpi_tcp_keepalive *ka,
                                 tpi_store_server **out, char *errmsg, size_t errmsg_len);
/* Announces the job the server now serves: a stop keeps listening until each
 * of its world_size ranks has connected (since, or at, this call). */
void tpi_store_server_expect(tpi_store_server *s, uint32_t world_size);
/* TCP-23: clients accepted from now on get ka (until then, start's). Any
 * thread. */
void tpi_store_server_keepalive(tpi_store_server *s, const tpi_tcp_keepalive *ka);
/* Stops the server: it listens until every announced rank came, serves the
 * connected clients until they leave, all for at most linger_ns, then frees
 * everything. NULL: no-op. */
void tpi_store_server_stop(tpi_store_server *s, uint64_t linger_ns);
/* The same in two steps: stop_async starts the stop (once) and returns at
 * once, the server lingering on its own thread; finished says whether it is
 * done; join waits for that and frees it (each stopped server is joined
 * exactly once, by the process that started it). */
void tpi_store_server_stop_async(tpi_store_server *s, uint64_t linger_ns);
int tpi_store_server_finished(const tpi_store_server *s);
void tpi_store_server_join(tpi_store_server *s);

/*
 * A store client connected to host:port, retrying until deadline_ns
 * (UINT64_MAX: none). rank is the worker's (UINT32_MAX: not a worker). server
 * (may be NULL) is stopped with linger_ns when the client closes. what names
 * where the address came from, for messages. init (may be NULL) is the
 * worker's init, whose interrupt ends the retries with TP_ECANCELED
 * (INTERRUPT-1; within TP_INIT_POLL_MS between attempts, one attempt's
 * second at most during one).
 */
tp_status tpi_tcp_store_connect(const char *host, uint16_t port, uint32_t rank,
                                const tpi_tcp_auth *auth, uint64_t deadline_ns, const char *what,
                                tpi_store_server *server, uint64_t linger_ns,
                                const tp_init_params *init, tp_store **out, char *errmsg,
                                size_t errmsg_len);

/* Opens the store init's options name (TCP-9) for its worker; rank 0 serves
 * tcp:// and env:// for the world. Its wait for the store ends at init's
 * interrupt. */
tp_status tpi_tcp_store_open(const tp_init_params *init, const tpi_tcp_auth *auth, tp_store **out,
                             char *errmsg, size_t errmsg_len);
/* The bytes a retired server's record mallocs: for the tests that make it fail. */
size_t tpi_tcp_store_retired_size(void);

#endif
