/*
 * shm_ring.h: a single-producer single-consumer ring of variable-length
 * records in memory shared by two processes on one host (spec/tcp.md
 * TCP-26). The transport carries a connection's frames in one (TCP-28).
 *
 * The mapping is the caller's (a memfd of the dialer's, mode 0600 and
 * sealed against shrinking, as TCP-22's slabs); the ring takes its base
 * and size. The writer formats it (tpi_ring_init), the reader checks what
 * it finds (tpi_ring_attach). Each end keeps its own position and its own
 * copy of the capacity in a tpi_ring of its process; the shared bytes are
 * the other process's to scribble on at any time, so the reader trusts no
 * length or counter it reads there before checking it, and never loops
 * on one.
 *
 * Threads: one thread at a time per end (the ring is single-producer,
 * single-consumer); the two ends may be threads of one process too.
 */
#ifndef TP_REAL_SHM_RING_H
#define TP_REAL_SHM_RING_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* The shared header: three cache lines of 128 bytes (two 64-byte lines, so
 * the adjacent-line prefetcher does not tie the writer's counters to the
 * reader's) and one reserved; the data follows. */
#define TPI_RING_LINE 128
#define TPI_RING_HEAD 512
#define TPI_RING_MAGIC "TPSHMRNG"
#define TPI_RING_VERSION 1
/* Data bytes: a power of two in [MIN, MAX]. MAX keeps every record length
 * a u32; MIN leaves room for a useful record (RECORD_MAX below). */
#define TPI_RING_CAP_MIN ((uint64_t)1 << 10)
#define TPI_RING_CAP_MAX ((uint64_t)1 << 31)
/* A record: an 8-byte header (u32 payload length, u32 kind), the payload,
 * zeros to the next multiple of 8. */
#define TPI_RING_ALIGN 8
#define TPI_RING_REC_HEAD 8
#define TPI_RING_KIND_DATA 0x41544144u /* "DATA" */
#define TPI_RING_KIND_PAD 0x20444150u  /* "PAD " */
/* The largest payload of a ring of capacity cap: a record (header, payload,
 * padding) of at most cap / 2 always fits in an empty ring, wherever its
 * counters stand (either the bytes up to the end or those from the start
 * are at least half), so a writer waiting for room never waits forever. */
#define TPI_RING_RECORD_MAX(cap) ((cap) / 2 - TPI_RING_REC_HEAD)
/* The longest spin tpi_ring_wait honours: past a millisecond a futex sleep
 * costs less than the CPU burnt. */
#define TPI_RING_SPIN_NS_MAX 1000000ull
#define TPI_RING_WHY_LEN 160

typedef enum tpi_ring_status {
    TPI_RING_OK = 0,
    TPI_RING_EMPTY,   /* reader: nothing published yet */
    TPI_RING_FULL,    /* writer: no room for this record now */
    TPI_RING_TOOBIG,  /* writer: above TPI_RING_RECORD_MAX; reader: the buffer is too small */
    TPI_RING_CLOSED,  /* the other end closed (reader: and everything was read) */
    TPI_RING_CORRUPT, /* the shared memory broke the rules: for good, see tpi_ring_why */
    TPI_RING_TIMEOUT  /* tpi_ring_wait: the deadline came first */
} tpi_ring_status;

/* One end of a ring, in the process's own memory. */
typedef struct tpi_ring {
    uint8_t *base;  /* the shared header */
    uint8_t *data;  /* base + TPI_RING_HEAD */
    uint64_t cap;   /* our copy, checked once: never read again from the mapping */
    uint64_t pos;   /* writer: our tail; reader: our head (both multiples of 8) */
    uint64_t other; /* the other end's counter as last read (a wait's starting point) */
    int writer;     /* 1: the writing end, 0: the reading end */
    int bell;       /* >= 0: an eventfd the other end polls, written instead of its futex */
    int corrupt;    /* sticky */
    char why[TPI_RING_WHY_LEN];
} tpi_ring;

/* Formats size bytes at base (aligned to TPI_RING_LINE) as an empty ring
 * whose capacity is the largest power of two that fits, at most
 * TPI_RING_CAP_MAX, and makes r its writing end. 0, or -1 with why in err
 * (size too small, base misaligned). */
int tpi_ring_init(tpi_ring *r, void *base, size_t size, char *err, size_t err_len);
/* Makes r the reading end of the ring at base, after checking its header
 * (magic, version, header size, capacity a power of two in range and
 * inside size, reserved bytes zero, head a multiple of 8). 0, or -1 with
 * why in err: the ring is refused. */
int tpi_ring_attach(tpi_ring *r, void *base, size_t size, char *err, size_t err_len);

/* Writer: appends one record, the n pieces of iov concatenated, and wakes
 * the reader when it sleeps. OK; FULL (nothing written: wait and retry);
 * TOOBIG (above TPI_RING_RECORD_MAX, never fits); CLOSED (the reader
 * closed); CORRUPT (the reader's counter is impossible). */
tpi_ring_status tpi_ring_write(tpi_ring *r, const struct iovec *iov, int n);

/* Writer: whether a record of len payload bytes fits now, without writing
 * it: OK, FULL, TOOBIG, CLOSED or CORRUPT as tpi_ring_write would say. Only
 * the writer fills the ring, so OK holds until it writes. */
tpi_ring_status tpi_ring_room(tpi_ring *r, uint64_t len);

/* Reader: copies the next record into buf (buf_len bytes) and frees its
 * room, waking the writer when it waits. OK with *len its length; TOOBIG
 * with *len its length, nothing consumed (a larger buffer reads it);
 * EMPTY; CLOSED (the writer closed and all it wrote was read); CORRUPT. */
tpi_ring_status tpi_ring_read(tpi_ring *r, void *buf, size_t buf_len, size_t *len);
/* Reader: as tpi_ring_read, but hands the record where it lies: fn gets
 * its bytes in the shared mapping, which the writer may change meanwhile
 * (copy them, or check what is read as it is read), and its room is freed
 * when fn returns. */
typedef void tpi_ring_read_fn(void *ctx, const uint8_t *p, size_t len);
tpi_ring_status tpi_ring_read_cb(tpi_ring *r, tpi_ring_read_fn *fn, void *ctx);

/* Reader: as tpi_ring_read_cb, but fn decides: its record is consumed
 * (*took 1) when fn returns nonzero, else left for the next read (*took 0,
 * status OK). TCP-30: a caller takes only its replies. */
typedef int tpi_ring_take_fn(void *ctx, const uint8_t *p, size_t len);
tpi_ring_status tpi_ring_read_if(tpi_ring *r, tpi_ring_take_fn *fn, void *ctx, int *took);

/* TCP-28: the other end sleeps in a poll of eventfd bell instead of on its
 * futex: wake-ups write 1 to bell (non-blocking; -1 restores the futex). */
void tpi_ring_set_bell(tpi_ring *r, int bell);
/* For an end that sleeps in its own poll (TCP-28): sets this end's "sleeps"
 * flag and looks once more (the sleeper's half of the store-buffer pattern
 * of tpi_ring_wait). 1: the other end moved meanwhile; disarm and read or
 * write again. 0: sleep; the other end's next move rings the bell. */
int tpi_ring_arm(tpi_ring *r);
/* Clears this end's "sleeps" flag: awake, no wake-up needed. */
void tpi_ring_disarm(tpi_ring *r);
/* 1 when the other end moved (or closed, or the ring is corrupt): what a
 * spinning end looks at, without a system call. */
int tpi_ring_ready(tpi_ring *r);

/* Waits until the other end moved (reader: something was published or the
 * writer closed; writer: room was freed or the reader closed), spinning up
 * to spin_ns (at most TPI_RING_SPIN_NS_MAX; 0 never spins) before sleeping
 * on the futex until deadline_ns (CLOCK_MONOTONIC, tpi_ring_now_ns). OK
 * (read or write again: it may still find nothing, a wake-up is a hint) or
 * TIMEOUT. A dead peer wakes nobody: the caller keeps deadlines short and
 * checks the peer between waits (tpi_ring_peer_gone). */
tpi_ring_status tpi_ring_wait(tpi_ring *r, uint64_t spin_ns, uint64_t deadline_ns);
/* The reader's "sleeps" flag when a thread sleeps on the futex although the
 * end has a bell (TCP-30): the writer then wakes the futex, not the bell. */
#define TPI_RING_SLEEPS_FUTEX 2u
/* Reader, TCP-30: one futex sleep of a thread other than the end's poll:
 * the flag says TPI_RING_SLEEPS_FUTEX meanwhile, and the sleep is skipped
 * when the ring is ready or awake(ctx) answers nonzero after the flag is
 * set (tpi_ring_nudge's half). The flag is 0 (awake) on return. OK (look
 * again: a wake-up is a hint) or TIMEOUT once deadline_ns passed. */
tpi_ring_status tpi_ring_sleep(tpi_ring *r, int (*awake)(void *), void *ctx, uint64_t deadline_ns);
/* Reader, TCP-30: ends a tpi_ring_sleep from within the reader's process
 * (after what awake() looks at was set): bumps the reader's futex word, as
 * the writer does, and wakes it. */
void tpi_ring_nudge(tpi_ring *r);
/* Wakes the other end's wait, whether or not it sleeps. */
void tpi_ring_wake(tpi_ring *r);
/* An orderly end from either side: the reader reads what was written, then
 * CLOSED; a writer gets CLOSED from then on. Wakes the other end. */
void tpi_ring_close(tpi_ring *r);

/* Why the ring became CORRUPT ("" before). */
const char *tpi_ring_why(const tpi_ring *r);
uint64_t tpi_ring_now_ns(void);
/* 1 when the process of pidfd (pidfd_open) has exited (or pidfd is no
 * descriptor: nothing left to wait for), else 0; never blocks. */
int tpi_ring_peer_gone(int pidfd);
const char *tpi_ring_status_name(tpi_ring_status st);

#endif
