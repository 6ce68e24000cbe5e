/*
 * codec.h: the wire format (spec/wire.md). Values and messages to bytes and
 * back. Pure functions: no I/O, no core state; rrefs go through hooks the
 * core provides, because sending or receiving one is a protocol step.
 *
 * The decoder treats every byte as hostile: each length is checked against
 * what remains and against the limits before memory is touched or
 * allocated, recursion is bounded by TPI_VALUE_DEPTH_MAX, and every error is
 * a status with a message, never an assert (WIRE-6).
 */
#ifndef TPI_CODEC_H
#define TPI_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "limits.h"

/* Value tags (WIRE-3) are the tp_kind numbers, and two more: a list that is
 * a tuple (VALUE-11), bytes that are opaque (VALUE-12). */
#define TPI_TAG_TUPLE 12
#define TPI_TAG_OPAQUE 13 /* bytes marked opaque (VALUE-12) */

/* ---- Frame header (WIRE-1) --------------------------------------------- */
/*  0 u32 magic "TPRC" (0x54 0x50 0x52 0x43 in byte order)
 *  4 u8  version (TPI_WIRE_VERSION)
 *  5 u8  type (tpi_msg_type)
 *  6 u16 flags
 *  8 u32 body length (bytes after the header)
 * 12 u32 gen: REQUEST and REMOTE, the caller's window generation toward
 *        the callee (spec/calls.md FLOW-9); must be 0 on every other type
 * 16 u64 id (the call id a response answers)
 * All integers little-endian. */
#define TPI_WIRE_MAGIC0 0x54
#define TPI_WIRE_MAGIC1 0x50
#define TPI_WIRE_MAGIC2 0x52
#define TPI_WIRE_MAGIC3 0x43
#define TPI_WIRE_VERSION 3 /* 3: dtypes 10..14; 2: offset 12 is FLOW-9's generation (WIRE-9) */

typedef enum tpi_msg_type {
    TPI_MSG_REQUEST = 1,     /* run a function (or method) and reply with its result */
    TPI_MSG_RESPONSE = 2,    /* answers any message that expects a reply, by id */
    TPI_MSG_REMOTE = 3,      /* run a function, keep the result in an owner rref */
    TPI_MSG_RREF_FETCH = 4,  /* to_here: reply with a copy of the owner's value */
    TPI_MSG_RREF_DELETE = 5, /* a user (fork) is gone */
    TPI_MSG_RREF_FORK = 6,   /* a new user asks the owner to record its fork */
    TPI_MSG_RREF_ACCEPT = 7, /* a child tells its parent the owner confirmed it */
    TPI_MSG_RREF_ABANDON = 8, /* the creator tells the owner its creation failed (RREF-14) */
    TPI_MSG_TYPE_MAX_ = 8
} tpi_msg_type;

/* Header flags. */
#define TPI_FLAG_METHOD 0x0001u /* REQUEST/REMOTE: name is a method of args[0]'s rref value */
#define TPI_FLAGS_KNOWN 0x0001u

/* ---- Byte buffers ------------------------------------------------------- */

/* A growable output buffer. After the first failure every put is a no-op
 * and status keeps the first error (TP_ENOMEM or TP_EMSGSIZE past max). */
typedef struct tpi_wbuf {
    uint8_t *data;
    size_t len;
    size_t cap;
    size_t max; /* bytes allowed in all */
    tp_status status;
} tpi_wbuf;

void tpi_wbuf_init(tpi_wbuf *b, size_t max);
void tpi_wbuf_free(tpi_wbuf *b);
void tpi_wbuf_put(tpi_wbuf *b, const void *p, size_t n);
void tpi_wbuf_u8(tpi_wbuf *b, uint8_t v);
void tpi_wbuf_u16(tpi_wbuf *b, uint16_t v);
void tpi_wbuf_u32(tpi_wbuf *b, uint32_t v);
void tpi_wbuf_u64(tpi_wbuf *b, uint64_t v);
void tpi_wbuf_str(tpi_wbuf *b, const char *s, size_t n); /* u32 length, then bytes */

/* A bounds-checked reader. After the first failure every get fails and
 * status/errmsg keep the first error (TP_EPROTO with what was short). */
typedef struct tpi_rbuf {
    const uint8_t *p;
    size_t len;
    size_t pos;
    uint32_t values; /* decoded so far: TPI_VALUES_PER_MESSAGE_MAX bounds it */
    struct tpi_blob *hold; /* p's bytes as a block tensors may view (WIRE-10), or NULL */
    tp_status status;
    char errmsg[160];
} tpi_rbuf;

void tpi_rbuf_init(tpi_rbuf *r, const void *p, size_t len);
int tpi_rbuf_u8(tpi_rbuf *r, uint8_t *v);   /* 1 on success, 0 on failure */
int tpi_rbuf_u16(tpi_rbuf *r, uint16_t *v);
int tpi_rbuf_u32(tpi_rbuf *r, uint32_t *v);
int tpi_rbuf_u64(tpi_rbuf *r, uint64_t *v);
/* A u32-length string: *s points into the buffer (not NUL-terminated). */
int tpi_rbuf_str(tpi_rbuf *r, const char **s, uint32_t *n, uint32_t max_len);
void tpi_rbuf_fail(tpi_rbuf *r, tp_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- Values (WIRE-3, WIRE-4) --------------------------------------------- */

/* A globally unique id: the worker that made it and a counter there. */
typedef struct tpi_gid {
    uint32_t worker;
    uint64_t local;
} tpi_gid;

/* An rref as it travels (RREF-7). */
typedef struct tpi_rref_wire {
    uint32_t owner;     /* worker id of the owner */
    uint32_t owner_inc; /* the owner's incarnation that holds the value (REJOIN-6) */
    tpi_gid rref_id;    /* the value's id */
    tpi_gid fork_id;    /* the new reference's id */
    uint32_t parent;    /* the sender, who keeps its reference until accepted */
} tpi_rref_wire;

/* The core's hooks for rrefs inside values; ctx passed back. */
typedef struct tpi_codec_hooks {
    void *ctx;
    /* Sending an rref: fills *w (forks it). Called once per rref in the value. */
    tp_status (*encode_rref)(void *ctx, tp_rref *rref, tpi_rref_wire *w);
    /* Receiving one: *out is a new reference owned by the decoded value. */
    tp_status (*decode_rref)(void *ctx, const tpi_rref_wire *w, tp_rref **out);
} tpi_codec_hooks;

/*
 * Appends v's encoding. hooks may be NULL when v holds no rref (an rref
 * then fails with TP_ETYPE). Objects fail with TP_ETYPE ("objects cannot be
 * sent; hold them in an rref"). Strided tensors are packed contiguous.
 */
tp_status tpi_value_encode(tpi_wbuf *b, const tp_value *v, const tpi_codec_hooks *hooks);

/* Decodes one value at r's position; *out caller-owned. */
tp_status tpi_value_decode(tpi_rbuf *r, const tpi_codec_hooks *hooks, tp_value **out);

/* ---- Messages (WIRE-5) ---------------------------------------------------- */

/*
 * A message in memory. Which fields travel depends on the type:
 *   REQUEST      timeout_ms, name (function/method), args, kwargs
 *   REMOTE       rref, fork, timeout_ms, name, args, kwargs
 *   RESPONSE     status; value when status is TP_OK, else text (the error)
 *   RREF_FETCH   rref
 *   RREF_DELETE  rref, fork
 *   RREF_FORK    rref, fork, parent
 *   RREF_ACCEPT  fork
 *   RREF_ABANDON rref, status (not TP_OK), text (why the creation failed)
 * Decoded text is copied and NUL-terminated; values are owned by the msg.
 */
typedef struct tpi_msg {
    uint8_t type;
    uint16_t flags;
    uint64_t id;
    uint32_t timeout_ms;
    uint32_t status;
    tpi_gid rref;
    tpi_gid fork;
    uint32_t parent;
    uint32_t owner_inc; /* RREF_FORK: the owner incarnation the fork is for (RREF-20) */
    tp_value *args;   /* list; NULL encodes as an empty list */
    tp_value *kwargs; /* map; NULL encodes as an empty map */
    tp_value *value;  /* RESPONSE TP_OK; NULL encodes as nil */
    char text[TP_ERRMSG_LEN_MAX]; /* function/method name, or error message: last */
} tpi_msg;

/* Every field zero and text empty, without writing text's other bytes
 * (zeroing the whole 1 KB, several times a call, was a few percent of a
 * simulated one). text stays the last field for this. */
static inline void tpi_msg_reset(tpi_msg *m) {
    memset(m, 0, offsetof(tpi_msg, text) + 1);
}

/* A call's message: type, the function name fn (cut to fit text) and its
 * args (borrowed); every other field zero. */
void tpi_msg_call(tpi_msg *m, uint8_t type, const char *fn, const tp_value *args,
                  const tp_value *kwargs);

/*
 * Encodes m into a new frame (caller-owned). Values are borrowed. Fails with
 * TP_EMSGSIZE (naming the size and the limit) when the frame would exceed
 * max_size, TP_ETYPE for an unsendable value, TP_ENOMEM.
 */
tp_status tpi_msg_encode(const tpi_msg *m, const tpi_codec_hooks *hooks, uint64_t max_size,
                         tp_frame **out, char *errmsg, size_t errmsg_len);

/*
 * Decodes a whole frame as tpi_msg_decode does, taking the frame (always
 * transferred, even on failure). A large contiguous tensor (at least
 * TPI_ZERO_COPY_MIN bytes, its data aligned to its element size in the
 * frame's buffer) becomes a view into the frame's bytes, without a copy: the
 * frame then lives until the last such tensor is freed, whoever holds it
 * (the msg or a value moved out of it). Other values are copied and the
 * frame goes at once. Only a frame from tp_frame_alloc lends its bytes
 * (they are writable and its own); any other frame is decoded by copy.
 */
tp_status tpi_msg_decode_frame(tp_frame *f, const tpi_codec_hooks *hooks, tpi_msg *m,
                               char *errmsg, size_t errmsg_len);

/* ---- Frames the codec builds (common/frame.c) ----------------------------- */

/*
 * Large received frames (>= TPI_FRAME_CACHE_MIN) go back to a small bounded
 * cache when freed, so the next large frame reuses warm memory instead of
 * page-faulting a fresh mapping. trim frees every cached block (any thread,
 * any time; frames in use are untouched); stats reports what it holds.
 */
void tpi_frame_cache_trim(void);
void tpi_frame_cache_stats(size_t *blocks, size_t *bytes);

/* 1 when f comes from tp_frame_alloc: one writable segment the frame owns. */
int tpi_frame_owns_bytes(const tp_frame *f);

typedef struct tpi_blob tpi_blob;

/*
 * A frame with own_len bytes of its own (aligned for any type) and no
 * segments yet: the encoder writes the bytes (tpi_frame_shared_bytes), has
 * the frame hold each block a segment borrows from (tpi_frame_shared_hold
 * takes a reference, released by the frame's destroy), then lays out the
 * segments in order (tpi_frame_push_seg, which adds to f->len). NULL on
 * exhaustion; freed with tp_frame_free at any step.
 */
tp_frame *tpi_frame_shared_alloc(size_t own_len);
uint8_t *tpi_frame_shared_bytes(tp_frame *f);
void tpi_frame_shared_hold(tp_frame *f, tpi_blob *b);
void tpi_frame_push_seg(tp_frame *f, const void *base, size_t len);

/* Reads the header fields of a whole frame already checked by tp_frame_check_header. */
uint8_t tpi_frame_type(const tp_frame *f);
uint64_t tpi_frame_id(const tp_frame *f);
/* Header flags of a frame's first segment. */
uint16_t tpi_frame_flags(const tp_frame *f);
/* The window generation of a REQUEST or REMOTE frame (FLOW-9): read, and
 * written into an encoded frame's header just before it is sent. */
uint32_t tpi_frame_gen(const tp_frame *f);
void tpi_frame_set_gen(tp_frame *f, uint32_t gen);
/*
 * The function name of a REQUEST frame, without decoding the rest: copied
 * NUL-terminated into name (TP_NAME_LEN_MAX + 1 bytes). 0 when the frame is
 * not one segment or the name is not within bounds; the full decode then
 * reports what is wrong.
 */
int tpi_frame_request_name(const tp_frame *f, char name[TP_NAME_LEN_MAX + 1]);

/*
 * Decodes a whole frame into *m (zeroed first; on failure m holds nothing
 * to free). The frame stays the caller's. TP_EPROTO with a message for any
 * malformation: unknown type or flags, short or trailing bytes, a length
 * past the limits, a bad tag or dtype, nesting too deep.
 */
tp_status tpi_msg_decode(const tp_frame *f, const tpi_codec_hooks *hooks, tpi_msg *m,
                         char *errmsg, size_t errmsg_len);

/* Frees the values a decoded (or filled) msg owns and zeroes them. */
void tpi_msg_clear(tpi_msg *m);

#endif
