/*
 * codec.c: the wire format (spec/wire.md): byte buffers, values, messages.
 *
 * Encoding runs in two passes. The first walks the value and computes the
 * exact encoded size, refusing what cannot be sent (objects, rrefs without
 * hooks, nesting or container limits) and checking the message limit, all
 * before one byte is allocated or one rref hook is called. The second
 * writes into a buffer of exactly that size, so a message that fails never
 * forks an rref, and a message never reallocates while it is written.
 *
 * Large contiguous tensors travel without a copy (WIRE-10): the size pass
 * picks them (the same ones, in the same order, as the write pass), the
 * frame's own buffer gets every other byte, and each picked tensor's data
 * becomes a segment of its own that borrows the tensor's storage. Decoding
 * a frame it owns, the decoder makes large aligned tensors views into it.
 *
 * Decoding treats the bytes as hostile (WIRE-6): every count and length is
 * checked against the bytes that remain and against the limits before
 * anything is allocated for it, recursion is bounded, and every failure is
 * a status with a message naming what was wrong and at which offset of the
 * frame (header included).
 */
#include "codec.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "errors.h"
#include "value.h"

/* Fixed sizes of the parts of a body (WIRE-2, WIRE-5). */
#define GID_SIZE 12u       /* u32 worker, u64 local */
#define RREF_WIRE_SIZE 36u /* u32 owner, u32 owner_inc, gid rref_id, gid fork_id, u32 parent */
#define EMPTY_CONTAINER 5u /* tag, u32 count 0 */
#define MAP_ENTRY_MIN 5u   /* u32 key length 0, one tag */

/* ---- Output buffers --------------------------------------------------------- */

void tpi_wbuf_init(tpi_wbuf *b, size_t max) {
    TPI_ASSERT(b != NULL);
    memset(b, 0, sizeof *b);
    b->max = max;
    b->status = TP_OK;
}

void tpi_wbuf_free(tpi_wbuf *b) {
    if (!b)
        return;
    free(b->data);
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

/* Makes the capacity at least len + n (n within max). 0 on exhaustion. */
static int wbuf_ensure(tpi_wbuf *b, size_t n) {
    TPI_ASSERT(b->len <= b->max && n <= b->max - b->len);
    if (n <= b->cap - b->len)
        return 1;
    size_t need = b->len + n;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    if (cap > b->max)
        cap = b->max;
    uint8_t *p = realloc(b->data, cap);
    if (!p)
        return 0;
    b->data = p;
    b->cap = cap;
    return 1;
}

/* wbuf_reserve when the bytes are not there yet, or after a failure. */
static uint8_t *wbuf_reserve_slow(tpi_wbuf *b, size_t n) {
    if (b->status != TP_OK)
        return NULL;
    if (n > b->max - b->len) {
        b->status = TP_EMSGSIZE;
        return NULL;
    }
    if (!wbuf_ensure(b, n)) {
        b->status = TP_ENOMEM;
        return NULL;
    }
    uint8_t *p = b->data + b->len;
    b->len += n;
    return p;
}

/* n (> 0) writable bytes at the end, or NULL after setting the status.
 * Inline for the common case, room already there: a message is written a
 * few bytes at a time, and this ran for each. cap <= max always, so room
 * within cap is within max. */
static inline uint8_t *wbuf_reserve(tpi_wbuf *b, size_t n) {
    TPI_ASSERT(n > 0 && b->cap <= b->max);
    if (b->status == TP_OK && n <= b->cap - b->len) {
        uint8_t *p = b->data + b->len;
        b->len += n;
        return p;
    }
    return wbuf_reserve_slow(b, n);
}

void tpi_wbuf_put(tpi_wbuf *b, const void *p, size_t n) {
    if (n == 0)
        return;
    uint8_t *dst = wbuf_reserve(b, n);
    if (dst)
        memcpy(dst, p, n);
}

/* The wire is little-endian (WIRE-2). On a little-endian host that is the
 * value's own bytes: one load or store once n is a constant, where the
 * byte loop was a few dozen instructions for every field of a message. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline void store_le(uint8_t *p, uint64_t v, int n) {
    memcpy(p, &v, (size_t)n);
}

static inline uint64_t load_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    memcpy(&v, p, (size_t)n);
    return v;
}
#else
static inline void store_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t load_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}
#endif

static inline void wbuf_le(tpi_wbuf *b, uint64_t v, int n) {
    uint8_t *p = wbuf_reserve(b, (size_t)n);
    if (p)
        store_le(p, v, n);
}

void tpi_wbuf_u8(tpi_wbuf *b, uint8_t v) {
    wbuf_le(b, v, 1);
}

void tpi_wbuf_u16(tpi_wbuf *b, uint16_t v) {
    wbuf_le(b, v, 2);
}

void tpi_wbuf_u32(tpi_wbuf *b, uint32_t v) {
    wbuf_le(b, v, 4);
}

void tpi_wbuf_u64(tpi_wbuf *b, uint64_t v) {
    wbuf_le(b, v, 8);
}

void tpi_wbuf_str(tpi_wbuf *b, const char *s, size_t n) {
    if (n > UINT32_MAX) {
        if (b->status == TP_OK)
            b->status = TP_EMSGSIZE;
        return;
    }
    tpi_wbuf_u32(b, (uint32_t)n);
    tpi_wbuf_put(b, s, n);
}

/* A buffer writing into memory the caller owns (a frame); never grows. */
static void wbuf_over(tpi_wbuf *b, uint8_t *mem, size_t n) {
    tpi_wbuf_init(b, n);
    b->data = mem;
    b->cap = n;
}

/* ---- Input buffers ---------------------------------------------------------- */

void tpi_rbuf_init(tpi_rbuf *r, const void *p, size_t len) {
    TPI_ASSERT(r != NULL && (p != NULL || len == 0));
    r->p = p;
    r->len = len;
    r->pos = 0;
    r->values = 0;
    r->hold = NULL;
    r->status = TP_OK;
    r->errmsg[0] = '\0';
}

void tpi_rbuf_fail(tpi_rbuf *r, tp_status st, const char *fmt, ...) {
    if (r->status != TP_OK)
        return; /* the first error is the one that explains */
    r->status = st;
    va_list ap;
    va_start(ap, fmt);
    tpi_vformat(r->errmsg, sizeof r->errmsg, fmt, ap);
    va_end(ap);
}

static size_t rbuf_left(const tpi_rbuf *r) {
    return r->len - r->pos;
}

/* n (> 0) bytes at the position, or NULL after recording why. */
static const uint8_t *rbuf_take(tpi_rbuf *r, size_t n) {
    TPI_ASSERT(n > 0);
    if (r->status != TP_OK)
        return NULL;
    if (n > rbuf_left(r)) {
        tpi_rbuf_fail(r, TP_EPROTO, "truncated at offset %zu: %zu bytes needed, %zu left", r->pos,
                      n, rbuf_left(r));
        return NULL;
    }
    const uint8_t *p = r->p + r->pos;
    r->pos += n;
    return p;
}

static int rbuf_le(tpi_rbuf *r, uint64_t *v, int n) {
    const uint8_t *p = rbuf_take(r, (size_t)n);
    if (!p)
        return 0;
    *v = load_le(p, n);
    return 1;
}

int tpi_rbuf_u8(tpi_rbuf *r, uint8_t *v) {
    uint64_t x;
    if (!rbuf_le(r, &x, 1))
        return 0;
    *v = (uint8_t)x;
    return 1;
}

int tpi_rbuf_u16(tpi_rbuf *r, uint16_t *v) {
    uint64_t x;
    if (!rbuf_le(r, &x, 2))
        return 0;
    *v = (uint16_t)x;
    return 1;
}

int tpi_rbuf_u32(tpi_rbuf *r, uint32_t *v) {
    uint64_t x;
    if (!rbuf_le(r, &x, 4))
        return 0;
    *v = (uint32_t)x;
    return 1;
}

int tpi_rbuf_u64(tpi_rbuf *r, uint64_t *v) {
    return rbuf_le(r, v, 8);
}

int tpi_rbuf_str(tpi_rbuf *r, const char **s, uint32_t *n, uint32_t max_len) {
    size_t at = r->pos;
    uint32_t len;
    if (!tpi_rbuf_u32(r, &len))
        return 0;
    if (len > max_len) {
        tpi_rbuf_fail(r, TP_EPROTO, "string of %u bytes at offset %zu exceeds the limit of %u",
                      (unsigned)len, at, (unsigned)max_len);
        return 0;
    }
    if (len == 0) {
        *s = "";
    } else {
        const uint8_t *p = rbuf_take(r, len);
        if (!p)
            return 0;
        *s = (const char *)p;
    }
    *n = len;
    return 1;
}

/* ---- Hooks ----------------------------------------------------------------------- */

/*
 * Runs an rref hook so that its message (recorded with tpi_fail) can be
 * quoted, without a successful hook disturbing the caller's tp_errmsg().
 * msg receives the hook's message, or the status text when it left none.
 */
typedef struct hook_msg {
    char saved[TP_ERRMSG_LEN_MAX];
} hook_msg;

static void hook_enter(hook_msg *h) {
    char *buf = tpi_errmsg_buf();
    memcpy(h->saved, buf, sizeof h->saved);
    buf[0] = '\0';
}

static void hook_leave(hook_msg *h, tp_status st, char *msg, size_t msg_len) {
    char *buf = tpi_errmsg_buf();
    if (st != TP_OK)
        tpi_format(msg, msg_len, "%s", buf[0] ? buf : tp_strerror(st));
    memcpy(buf, h->saved, sizeof h->saved);
}

/* ---- Value encoding (WIRE-3, WIRE-4, WIRE-7) ----------------------------------- */

/* A tensor the frame sends from its storage: its data follows own byte off. */
typedef struct zc_seg {
    size_t off;
    const void *base;
    size_t len;
} zc_seg;

typedef struct enc {
    tpi_wbuf *b;
    const tpi_codec_hooks *hooks;
    tp_status status;
    char err[TP_ERRMSG_LEN_MAX];
    int zc_on;          /* large tensors may be shared (a frame is being built) */
    int zc_sized;       /* tensors the size pass picked */
    uint64_t zc_bytes;  /* and their data bytes, which the frame does not copy */
    int zc_n;           /* tensors the write pass picked so far */
    tp_frame *frame;    /* the frame being written, when zc_sized > 0 */
    zc_seg zc[TPI_ZERO_COPY_TENSORS_MAX];
} enc;

static void enc_init(enc *e, tpi_wbuf *b, const tpi_codec_hooks *hooks) {
    memset(e, 0, sizeof *e);
    e->b = b;
    e->hooks = hooks;
    e->status = TP_OK;
}

/*
 * Whether tensor v travels as a segment of its own: a frame is being built,
 * fewer than TPI_ZERO_COPY_TENSORS_MAX were picked before it (picked counts
 * them in this pass), its data is at least TPI_ZERO_COPY_MIN bytes and
 * contiguous in its storage. *blob and *data then name them.
 */
static int zc_pick(const enc *e, const tp_value *v, int picked, tpi_blob **blob,
                   const void **data) {
    if (!e->zc_on || picked >= TPI_ZERO_COPY_TENSORS_MAX ||
        tpi_tensor_packed_size(v) < TPI_ZERO_COPY_MIN)
        return 0;
    *blob = tpi_tensor_storage(v, data);
    return *blob != NULL;
}

static tp_status enc_fail(enc *e, tp_status st, const char *fmt, ...) TPI_PRINTF(3, 4);
static tp_status enc_fail(enc *e, tp_status st, const char *fmt, ...) {
    if (e->status == TP_OK) {
        e->status = st;
        va_list ap;
        va_start(ap, fmt);
        tpi_vformat(e->err, sizeof e->err, fmt, ap);
        va_end(ap);
    }
    return e->status;
}

static uint64_t add_sat(uint64_t a, uint64_t b) {
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* The bytes of a str or bytes value, borrowed. */
static const void *blob_of(const tp_value *v, size_t *len) {
    *len = 0;
    if (tp_value_kind(v) == TP_KIND_STR) {
        const char *s = NULL;
        tp_value_get_str(v, &s, len);
        return s;
    }
    const void *data = NULL;
    tp_value_get_bytes(v, &data, len);
    return data;
}

static tp_status container_check(enc *e, tp_kind kind, size_t n, int depth) {
    if (depth >= TPI_VALUE_DEPTH_MAX)
        return enc_fail(e, TP_ELIMIT, "lists and maps nested deeper than %d levels",
                        TPI_VALUE_DEPTH_MAX);
    if (n > TPI_CONTAINER_LEN_MAX)
        return enc_fail(e, TP_ELIMIT, "a %s of %zu items exceeds the limit of %u",
                        tp_kind_name(kind), n, (unsigned)TPI_CONTAINER_LEN_MAX);
    return TP_OK;
}

/* Adds v's encoded size to *size; refuses what cannot be sent. */
static tp_status value_size(enc *e, const tp_value *v, int depth, uint64_t *size) {
    tp_kind kind = tp_value_kind(v);
    uint64_t n = 1; /* the tag */
    switch (kind) {
    case TP_KIND_NIL:
        break;
    case TP_KIND_BOOL:
        n += 1;
        break;
    case TP_KIND_INT:
    case TP_KIND_FLOAT:
        n += 8;
        break;
    case TP_KIND_STR:
    case TP_KIND_BYTES: {
        size_t len;
        blob_of(v, &len);
        if (len > TPI_BLOB_LEN_MAX)
            return enc_fail(e, TP_EMSGSIZE, "a %s of %zu bytes exceeds the limit of %llu",
                            tp_kind_name(kind), len, (unsigned long long)TPI_BLOB_LEN_MAX);
        n += 4 + (uint64_t)len;
        break;
    }
    case TP_KIND_LIST: {
        size_t count = tp_list_len(v);
        if (container_check(e, kind, count, depth) != TP_OK)
            return e->status;
        n += 4;
        for (size_t i = 0; i < count; i++)
            if (value_size(e, tp_list_get(v, i), depth + 1, &n) != TP_OK)
                return e->status;
        break;
    }
    case TP_KIND_MAP: {
        size_t count = tp_map_len(v);
        if (container_check(e, kind, count, depth) != TP_OK)
            return e->status;
        n += 4;
        for (size_t i = 0; i < count; i++) {
            n = add_sat(n, 4 + (uint64_t)tpi_map_key_len_at(v, i));
            if (value_size(e, tp_map_value_at(v, i), depth + 1, &n) != TP_OK)
                return e->status;
        }
        break;
    }
    case TP_KIND_TENSOR: {
        n += 2 + 8 * (uint64_t)tp_tensor_ndim(v) + 8;
        n = add_sat(n, tpi_tensor_packed_size(v));
        tpi_blob *blob;
        const void *data;
        if (zc_pick(e, v, e->zc_sized, &blob, &data)) {
            e->zc_sized++;
            e->zc_bytes += tpi_tensor_packed_size(v);
        }
        break;
    }
    case TP_KIND_RREF:
        if (!e->hooks || !e->hooks->encode_rref)
            return enc_fail(e, TP_ETYPE, "an rref value can only be sent by the rpc core");
        n += RREF_WIRE_SIZE;
        break;
    case TP_KIND_WORKER_INFO: {
        tp_worker_info info;
        tp_value_get_worker_info(v, &info);
        n += 8 + strlen(info.name);
        break;
    }
    case TP_KIND_OBJECT: {
        const char *cls = NULL;
        tp_value_get_object(v, &cls, NULL);
        return enc_fail(e, TP_ETYPE,
                        "objects cannot be sent; hold them in an rref (an object of class '%s')",
                        cls);
    }
    default:
        return enc_fail(e, TP_ETYPE, "a value of unknown kind %d cannot be sent", (int)kind);
    }
    *size = add_sat(*size, n);
    return TP_OK;
}

static void put_gid(tpi_wbuf *b, tpi_gid g) {
    tpi_wbuf_u32(b, g.worker);
    tpi_wbuf_u64(b, g.local);
}

static tp_status rref_write(enc *e, const tp_value *v) {
    tp_rref *rref = NULL;
    tp_value_get_rref(v, &rref);
    tpi_rref_wire w;
    memset(&w, 0, sizeof w);
    hook_msg h;
    char msg[TP_ERRMSG_LEN_MAX];
    hook_enter(&h);
    tp_status st = e->hooks->encode_rref(e->hooks->ctx, rref, &w);
    hook_leave(&h, st, msg, sizeof msg);
    if (st != TP_OK)
        return enc_fail(e, st, "sending an rref: %s", msg);
    tpi_wbuf_u32(e->b, w.owner);
    tpi_wbuf_u32(e->b, w.owner_inc);
    put_gid(e->b, w.rref_id);
    put_gid(e->b, w.fork_id);
    tpi_wbuf_u32(e->b, w.parent);
    return TP_OK;
}

/*
 * Tensor data travels packed: copied (strided tensors are packed here), or
 * for a tensor zc_pick chose, left out of the buffer and recorded as a
 * segment that borrows the tensor's storage, which the frame holds.
 */
static void tensor_write(enc *e, const tp_value *v) {
    tpi_wbuf *b = e->b;
    int ndim = tp_tensor_ndim(v);
    const int64_t *shape = tp_tensor_shape(v);
    uint64_t packed = tpi_tensor_packed_size(v);
    tpi_wbuf_u8(b, (uint8_t)tp_tensor_dtype(v));
    tpi_wbuf_u8(b, (uint8_t)ndim);
    for (int d = 0; d < ndim; d++)
        tpi_wbuf_u64(b, (uint64_t)shape[d]);
    tpi_wbuf_u64(b, packed);
    if (packed == 0)
        return;
    if (packed > SIZE_MAX) {
        b->status = b->status ? b->status : TP_EMSGSIZE;
        return;
    }
    tpi_blob *blob;
    const void *data;
    if (b->status == TP_OK && zc_pick(e, v, e->zc_n, &blob, &data)) {
        TPI_ASSERT(e->frame != NULL && e->zc_n < e->zc_sized);
        tpi_frame_shared_hold(e->frame, blob);
        e->zc[e->zc_n++] = (zc_seg){b->len, data, (size_t)packed};
        return;
    }
    uint8_t *dst = wbuf_reserve(b, (size_t)packed);
    if (dst)
        tpi_tensor_pack(v, dst);
}

/* Writes v (already sized by value_size). */
static tp_status value_write(enc *e, const tp_value *v) {
    tpi_wbuf *b = e->b;
    tp_kind kind = tp_value_kind(v);
    tpi_wbuf_u8(b, tp_list_is_tuple(v)     ? TPI_TAG_TUPLE
                   : tp_bytes_is_opaque(v) ? TPI_TAG_OPAQUE
                                           : (uint8_t)kind);
    switch (kind) {
    case TP_KIND_BOOL: {
        int x = 0;
        tp_value_get_bool(v, &x);
        tpi_wbuf_u8(b, (uint8_t)(x != 0));
        break;
    }
    case TP_KIND_INT: {
        int64_t x = 0;
        tp_value_get_int(v, &x);
        tpi_wbuf_u64(b, (uint64_t)x);
        break;
    }
    case TP_KIND_FLOAT: {
        double x = 0;
        uint64_t bits;
        tp_value_get_float(v, &x);
        memcpy(&bits, &x, sizeof bits);
        tpi_wbuf_u64(b, bits);
        break;
    }
    case TP_KIND_STR:
    case TP_KIND_BYTES: {
        size_t len;
        const void *data = blob_of(v, &len);
        tpi_wbuf_str(b, data, len);
        break;
    }
    case TP_KIND_LIST:
        tpi_wbuf_u32(b, (uint32_t)tp_list_len(v));
        for (size_t i = 0; i < tp_list_len(v); i++)
            if (value_write(e, tp_list_get(v, i)) != TP_OK)
                return e->status;
        break;
    case TP_KIND_MAP:
        tpi_wbuf_u32(b, (uint32_t)tp_map_len(v));
        for (size_t i = 0; i < tp_map_len(v); i++) {
            tpi_wbuf_str(b, tp_map_key_at(v, i), tpi_map_key_len_at(v, i));
            if (value_write(e, tp_map_value_at(v, i)) != TP_OK)
                return e->status;
        }
        break;
    case TP_KIND_TENSOR:
        tensor_write(e, v);
        break;
    case TP_KIND_RREF:
        if (rref_write(e, v) != TP_OK)
            return e->status;
        break;
    case TP_KIND_WORKER_INFO: {
        tp_worker_info info;
        tp_value_get_worker_info(v, &info);
        tpi_wbuf_u32(b, info.id);
        tpi_wbuf_str(b, info.name, strlen(info.name));
        break;
    }
    default:
        break; /* nil; the rest were refused by value_size */
    }
    if (b->status != TP_OK)
        return enc_fail(e, b->status, "writing a %s: %s", tp_kind_name(kind),
                        tp_strerror(b->status));
    return TP_OK;
}

tp_status tpi_value_encode(tpi_wbuf *b, const tp_value *v, const tpi_codec_hooks *hooks) {
    if (!b || !v)
        return tpi_fail(TP_EINVAL, "value encode: %s is NULL", b ? "the value" : "the buffer");
    if (b->status != TP_OK)
        return tpi_fail(b->status, "value encode: the buffer failed before (%s)",
                        tp_strerror(b->status));
    enc e;
    enc_init(&e, b, hooks);
    uint64_t size = 0;
    if (value_size(&e, v, 0, &size) != TP_OK) {
        b->status = e.status;
        return tpi_fail_msg(e.status, e.err);
    }
    TPI_ASSERT(b->len <= b->max);
    if (size > b->max - b->len) {
        b->status = TP_EMSGSIZE;
        return tpi_fail(TP_EMSGSIZE, "a value of %llu bytes exceeds the %zu bytes left of %zu",
                        (unsigned long long)size, b->max - b->len, b->max);
    }
    if (!wbuf_ensure(b, (size_t)size)) {
        b->status = TP_ENOMEM;
        return tpi_fail(TP_ENOMEM, "out of memory encoding a value of %llu bytes",
                        (unsigned long long)size);
    }
    size_t start = b->len;
    if (value_write(&e, v) != TP_OK) {
        b->status = b->status != TP_OK ? b->status : e.status;
        return tpi_fail_msg(e.status, e.err);
    }
    TPI_ASSERT(b->len - start == size);
    return TP_OK;
}

/* ---- Value decoding (WIRE-3, WIRE-4, WIRE-6) ------------------------------------- */

static tp_value *decode_value(tpi_rbuf *r, const tpi_codec_hooks *hooks, int depth);

static int64_t i64_from_u64(uint64_t u) {
    return u <= INT64_MAX ? (int64_t)u : -(int64_t)(UINT64_MAX - u) - 1;
}

static int depth_ok(tpi_rbuf *r, int depth, size_t at) {
    if (depth < TPI_VALUE_DEPTH_MAX)
        return 1;
    tpi_rbuf_fail(r, TP_EPROTO, "lists and maps nested deeper than %d levels at offset %zu",
                  TPI_VALUE_DEPTH_MAX, at);
    return 0;
}

/* Reads a container count; each item needs at least min_item bytes. */
static int count_ok(tpi_rbuf *r, const char *what, size_t at, uint32_t *n, unsigned min_item) {
    if (!tpi_rbuf_u32(r, n))
        return 0;
    if (*n > TPI_CONTAINER_LEN_MAX) {
        tpi_rbuf_fail(r, TP_EPROTO, "%s of %u items at offset %zu exceeds the limit of %u", what,
                      (unsigned)*n, at, (unsigned)TPI_CONTAINER_LEN_MAX);
        return 0;
    }
    if ((uint64_t)*n * min_item > rbuf_left(r)) {
        tpi_rbuf_fail(r, TP_EPROTO, "%s of %u items at offset %zu cannot fit in the %zu bytes left",
                      what, (unsigned)*n, at, rbuf_left(r));
        return 0;
    }
    return 1;
}

static tp_value *nomem(tpi_rbuf *r, const char *what, size_t at) {
    tpi_rbuf_fail(r, TP_ENOMEM, "out of memory decoding a %s at offset %zu", what, at);
    return NULL;
}

static tp_value *decode_list(tpi_rbuf *r, const tpi_codec_hooks *hooks, int depth, size_t at,
                             int tuple) {
    uint32_t n;
    if (!depth_ok(r, depth, at) || !count_ok(r, tuple ? "tuple" : "list", at, &n, 1))
        return NULL;
    tp_value *list = tuple ? tp_value_tuple() : tp_value_list();
    if (!list || tpi_list_reserve(list, n) != TP_OK) {
        tp_value_free(list);
        return nomem(r, "list", at);
    }
    for (uint32_t i = 0; i < n; i++) {
        tp_value *item = decode_value(r, hooks, depth + 1);
        if (!item) {
            tp_value_free(list);
            return NULL;
        }
        tp_status st = tp_list_append(list, item); /* reserved: cannot fail */
        TPI_ASSERT(st == TP_OK);
    }
    return list;
}

static tp_value *decode_map(tpi_rbuf *r, const tpi_codec_hooks *hooks, int depth, size_t at) {
    uint32_t n;
    if (!depth_ok(r, depth, at) || !count_ok(r, "map", at, &n, MAP_ENTRY_MIN))
        return NULL;
    tp_value *map = tp_value_map();
    if (!map || tpi_map_reserve(map, n) != TP_OK) {
        tp_value_free(map);
        return nomem(r, "map", at);
    }
    for (uint32_t i = 0; i < n; i++) {
        size_t key_at = r->pos;
        const char *key;
        uint32_t key_len;
        if (!tpi_rbuf_str(r, &key, &key_len, (uint32_t)TPI_BLOB_LEN_MAX))
            goto fail;
        if (memchr(key, '\0', key_len)) {
            tpi_rbuf_fail(r, TP_EPROTO, "map key at offset %zu holds a NUL byte", key_at);
            goto fail;
        }
        tp_value *item = decode_value(r, hooks, depth + 1);
        if (!item)
            goto fail;
        if (tpi_map_push(map, key, key_len, item) != TP_OK) {
            tp_value_free(item);
            nomem(r, "map key", key_at);
            goto fail;
        }
    }
    size_t dup;
    if (tpi_map_find_duplicate(map, &dup) != TP_OK) {
        nomem(r, "map", at);
        goto fail;
    }
    if (dup != SIZE_MAX) {
        tpi_rbuf_fail(r, TP_EPROTO, "map at offset %zu has the key '%.40s' twice", at,
                      tp_map_key_at(map, dup));
        goto fail;
    }
    return map;
fail:
    tp_value_free(map);
    return NULL;
}

static tp_value *decode_tensor(tpi_rbuf *r, size_t at) {
    uint8_t dtype, ndim;
    if (!tpi_rbuf_u8(r, &dtype) || !tpi_rbuf_u8(r, &ndim))
        return NULL;
    if (dtype >= TP_DTYPE_COUNT_) {
        tpi_rbuf_fail(r, TP_EPROTO, "unknown dtype %u at offset %zu", dtype, at + 1);
        return NULL;
    }
    if (ndim > TP_TENSOR_NDIM_MAX) {
        tpi_rbuf_fail(r, TP_EPROTO, "tensor at offset %zu has %u dimensions; the limit is %d", at,
                      ndim, TP_TENSOR_NDIM_MAX);
        return NULL;
    }
    int64_t shape[TP_TENSOR_NDIM_MAX];
    for (int d = 0; d < ndim; d++) {
        size_t dim_at = r->pos;
        uint64_t s;
        if (!tpi_rbuf_u64(r, &s))
            return NULL;
        if (s > INT64_MAX) {
            tpi_rbuf_fail(r, TP_EPROTO, "tensor dimension %d at offset %zu is negative", d, dim_at);
            return NULL;
        }
        shape[d] = (int64_t)s;
    }
    uint64_t packed = 0;
    if (tpi_tensor_check((tp_dtype)dtype, ndim, shape, &packed) != TP_OK) {
        tpi_rbuf_fail(r, TP_EPROTO, "tensor shape at offset %zu is too large", at + 3);
        return NULL;
    }
    size_t count_at = r->pos;
    uint64_t nbytes;
    if (!tpi_rbuf_u64(r, &nbytes))
        return NULL;
    if (nbytes != packed) {
        tpi_rbuf_fail(r, TP_EPROTO,
                      "tensor at offset %zu: its shape and dtype need %llu bytes, the byte count "
                      "at offset %zu says %llu",
                      at, (unsigned long long)packed, count_at, (unsigned long long)nbytes);
        return NULL;
    }
    if (nbytes > rbuf_left(r)) {
        tpi_rbuf_fail(r, TP_EPROTO,
                      "tensor data of %llu bytes at offset %zu runs past the end (%zu bytes left)",
                      (unsigned long long)nbytes, r->pos, rbuf_left(r));
        return NULL;
    }
    const uint8_t *data = nbytes ? rbuf_take(r, (size_t)nbytes) : NULL;
    tp_value *v = NULL;
    if (r->hold && nbytes >= TPI_ZERO_COPY_MIN) {
        /*
         * A view into the frame. The format has no padding, so whether the
         * data is aligned for its elements depends on what precedes it;
         * when it is not, it moves down in place onto its own byte count
         * (read already, and at most 7 bytes back): one pass over bytes in
         * memory, instead of a fresh allocation and a copy (WIRE-10).
         */
        uint8_t *own = r->hold->data + (data - r->p);
        size_t mis = (uintptr_t)own % tp_dtype_align((tp_dtype)dtype);
        TPI_ASSERT(mis <= (size_t)(own - r->hold->data) && mis < 8);
        if (mis) {
            memmove(own - mis, own, (size_t)nbytes);
            own -= mis;
        }
        v = tpi_value_tensor_view((tp_dtype)dtype, ndim, shape, r->hold, own);
        return v ? v : nomem(r, "tensor", at);
    }
    v = tp_value_tensor((tp_dtype)dtype, ndim, shape, NULL, data);
    return v ? v : nomem(r, "tensor", at);
}

static void get_gid(tpi_rbuf *r, tpi_gid *g) {
    tpi_rbuf_u32(r, &g->worker);
    tpi_rbuf_u64(r, &g->local);
}

static tp_value *decode_rref(tpi_rbuf *r, const tpi_codec_hooks *hooks, size_t at) {
    tpi_rref_wire w;
    tpi_rbuf_u32(r, &w.owner);
    tpi_rbuf_u32(r, &w.owner_inc);
    get_gid(r, &w.rref_id);
    get_gid(r, &w.fork_id);
    tpi_rbuf_u32(r, &w.parent);
    if (r->status != TP_OK)
        return NULL;
    if (!hooks || !hooks->decode_rref) {
        tpi_rbuf_fail(r, TP_EPROTO, "rref at offset %zu cannot be received here", at);
        return NULL;
    }
    tp_rref *rref = NULL;
    hook_msg h;
    char msg[TP_ERRMSG_LEN_MAX];
    hook_enter(&h);
    tp_status st = hooks->decode_rref(hooks->ctx, &w, &rref);
    hook_leave(&h, st, msg, sizeof msg);
    if (st != TP_OK) {
        tpi_rbuf_fail(r, st, "rref at offset %zu: %s", at, msg);
        return NULL;
    }
    TPI_ASSERT(rref != NULL);
    tp_value *v = tpi_value_rref_adopt(rref);
    if (!v) {
        tp_rref_release(rref);
        return nomem(r, "rref", at);
    }
    return v;
}

/* A name without NUL bytes, of min_len..max_len bytes, copied into out. */
static int get_name(tpi_rbuf *r, const char *what, uint32_t min_len, uint32_t max_len, char *out) {
    size_t at = r->pos;
    const char *s;
    uint32_t n;
    if (!tpi_rbuf_str(r, &s, &n, max_len))
        return 0;
    if (n < min_len) {
        tpi_rbuf_fail(r, TP_EPROTO, "empty %s at offset %zu", what, at);
        return 0;
    }
    if (memchr(s, '\0', n)) {
        tpi_rbuf_fail(r, TP_EPROTO, "%s at offset %zu holds a NUL byte", what, at);
        return 0;
    }
    memcpy(out, s, n);
    out[n] = '\0';
    return 1;
}

static tp_value *decode_worker_info(tpi_rbuf *r, size_t at) {
    tp_worker_info info;
    memset(&info, 0, sizeof info);
    if (!tpi_rbuf_u32(r, &info.id) || !get_name(r, "worker name", 0, TP_NAME_LEN_MAX, info.name))
        return NULL;
    tp_value *v = tp_value_worker_info(&info);
    return v ? v : nomem(r, "worker info", at);
}

static tp_value *decode_value(tpi_rbuf *r, const tpi_codec_hooks *hooks, int depth) {
    size_t at = r->pos;
    uint8_t tag;
    if (!tpi_rbuf_u8(r, &tag))
        return NULL;
    if (++r->values > TPI_VALUES_PER_MESSAGE_MAX) {
        tpi_rbuf_fail(r, TP_ELIMIT, "value at offset %zu is past the limit of %u values a message",
                      at, TPI_VALUES_PER_MESSAGE_MAX);
        return NULL;
    }
    tp_value *v = NULL;
    switch (tag) {
    case TP_KIND_NIL:
        v = tp_value_nil();
        break;
    case TP_KIND_BOOL: {
        uint8_t x;
        if (!tpi_rbuf_u8(r, &x))
            return NULL;
        if (x > 1) {
            tpi_rbuf_fail(r, TP_EPROTO, "bool at offset %zu is %u, expected 0 or 1", at, x);
            return NULL;
        }
        v = tp_value_bool(x);
        break;
    }
    case TP_KIND_INT: {
        uint64_t x;
        if (!tpi_rbuf_u64(r, &x))
            return NULL;
        v = tp_value_int(i64_from_u64(x));
        break;
    }
    case TP_KIND_FLOAT: {
        uint64_t bits;
        double x;
        if (!tpi_rbuf_u64(r, &bits))
            return NULL;
        memcpy(&x, &bits, sizeof x);
        v = tp_value_float(x);
        break;
    }
    case TP_KIND_STR:
    case TP_KIND_BYTES:
    case TPI_TAG_OPAQUE: {
        const char *s;
        uint32_t n;
        if (!tpi_rbuf_str(r, &s, &n, (uint32_t)TPI_BLOB_LEN_MAX))
            return NULL;
        v = tag == TP_KIND_STR     ? tp_value_strn(s, n)
            : tag == TP_KIND_BYTES ? tp_value_bytes(s, n)
                                   : tp_value_opaque(s, n);
        if (!v)
            return nomem(r, tag == TP_KIND_STR ? "str" : "bytes", at);
        break;
    }
    case TP_KIND_LIST:
    case TPI_TAG_TUPLE:
        return decode_list(r, hooks, depth, at, tag == TPI_TAG_TUPLE);
    case TP_KIND_MAP:
        return decode_map(r, hooks, depth, at);
    case TP_KIND_TENSOR:
        return decode_tensor(r, at);
    case TP_KIND_RREF:
        return decode_rref(r, hooks, at);
    case TP_KIND_WORKER_INFO:
        return decode_worker_info(r, at);
    default:
        tpi_rbuf_fail(r, TP_EPROTO, "unknown value tag %u at offset %zu", tag, at);
        return NULL;
    }
    return v ? v : nomem(r, tp_kind_name((tp_kind)tag), at);
}

tp_status tpi_value_decode(tpi_rbuf *r, const tpi_codec_hooks *hooks, tp_value **out) {
    TPI_ASSERT(r != NULL && out != NULL);
    *out = NULL;
    if (r->status != TP_OK)
        return r->status;
    tp_value *v = decode_value(r, hooks, 0);
    TPI_ASSERT((v != NULL) == (r->status == TP_OK));
    *out = v;
    return r->status;
}

/* ---- Messages (WIRE-1, WIRE-5) ---------------------------------------------------- */

static int has_method_flag(uint8_t type) {
    return type == TPI_MSG_REQUEST || type == TPI_MSG_REMOTE;
}

static const char *msg_type_name(uint8_t type) {
    static const char *const names[] = {
        "?",          "REQUEST",     "RESPONSE",  "REMOTE",
        "RREF_FETCH", "RREF_DELETE", "RREF_FORK", "RREF_ACCEPT", "RREF_ABANDON",
    };
    return type <= TPI_MSG_TYPE_MAX_ ? names[type] : "?";
}

/* Sizes args or kwargs: NULL travels as an empty container. */
static tp_status arg_size(enc *e, const tp_value *v, tp_kind want, const char *what,
                          uint64_t *size) {
    if (!v) {
        *size = add_sat(*size, EMPTY_CONTAINER);
        return TP_OK;
    }
    if (tp_value_kind(v) != want)
        return enc_fail(e, TP_ETYPE, "%s must be a %s, got %s", what, tp_kind_name(want),
                        tp_kind_name(tp_value_kind(v)));
    return value_size(e, v, 0, size);
}

static tp_status arg_write(enc *e, const tp_value *v, tp_kind kind) {
    if (v)
        return value_write(e, v);
    tpi_wbuf_u8(e->b, (uint8_t)kind);
    tpi_wbuf_u32(e->b, 0);
    return TP_OK;
}

/* Checks m and computes its body size; *text_len: the bytes of text that travel. */
static tp_status msg_size(enc *e, const tpi_msg *m, size_t *text_len, uint64_t *body) {
    if (m->type < TPI_MSG_REQUEST || m->type > TPI_MSG_TYPE_MAX_)
        return enc_fail(e, TP_EINVAL, "unknown message type %u", m->type);
    if (m->flags & ~TPI_FLAGS_KNOWN)
        return enc_fail(e, TP_EINVAL, "unknown flags 0x%04x", m->flags & ~TPI_FLAGS_KNOWN);
    if ((m->flags & TPI_FLAG_METHOD) && !has_method_flag(m->type))
        return enc_fail(e, TP_EINVAL, "flag METHOD on a %s message", msg_type_name(m->type));
    uint64_t n = 0;
    *text_len = 0;
    switch (m->type) {
    case TPI_MSG_REMOTE:
        n += 2 * GID_SIZE;
        /* fall through */
    case TPI_MSG_REQUEST:
        *text_len = strnlen(m->text, sizeof m->text);
        if (*text_len == 0 || *text_len > TP_NAME_LEN_MAX)
            return enc_fail(e, TP_EINVAL, "a function name of %zu bytes; names have 1..%d",
                            *text_len, TP_NAME_LEN_MAX);
        n += 4 + 4 + *text_len;
        if (arg_size(e, m->args, TP_KIND_LIST, "args", &n) != TP_OK ||
            arg_size(e, m->kwargs, TP_KIND_MAP, "kwargs", &n) != TP_OK)
            return e->status;
        break;
    case TPI_MSG_RESPONSE:
        if (m->status >= TP_STATUS_COUNT_)
            return enc_fail(e, TP_EINVAL, "unknown status %u", (unsigned)m->status);
        n += 4;
        if (m->status == TP_OK) {
            if (!m->value)
                n += 1;
            else if (value_size(e, m->value, 0, &n) != TP_OK)
                return e->status;
        } else {
            *text_len = strnlen(m->text, TPI_REMOTE_MSG_LEN_MAX);
            n += 4 + *text_len;
        }
        break;
    case TPI_MSG_RREF_FETCH:
    case TPI_MSG_RREF_ACCEPT:
        n += GID_SIZE;
        break;
    case TPI_MSG_RREF_DELETE:
        n += 2 * GID_SIZE;
        break;
    case TPI_MSG_RREF_FORK:
        n += 2 * GID_SIZE + 4 + 4;
        break;
    case TPI_MSG_RREF_ABANDON:
        if (m->status == TP_OK || m->status >= TP_STATUS_COUNT_)
            return enc_fail(e, TP_EINVAL, "an abandoned creation with status %u",
                            (unsigned)m->status);
        *text_len = strnlen(m->text, TPI_REMOTE_MSG_LEN_MAX);
        n += GID_SIZE + 4 + 4 + *text_len;
        break;
    default:
        break;
    }
    *body = n;
    return TP_OK;
}

static void header_write(tpi_wbuf *b, const tpi_msg *m, uint32_t body) {
    const uint8_t magic[4] = {TPI_WIRE_MAGIC0, TPI_WIRE_MAGIC1, TPI_WIRE_MAGIC2, TPI_WIRE_MAGIC3};
    tpi_wbuf_put(b, magic, sizeof magic);
    tpi_wbuf_u8(b, TPI_WIRE_VERSION);
    tpi_wbuf_u8(b, m->type);
    tpi_wbuf_u16(b, m->flags);
    tpi_wbuf_u32(b, body);
    tpi_wbuf_u32(b, 0);
    tpi_wbuf_u64(b, m->id);
}

static tp_status body_write(enc *e, const tpi_msg *m, size_t text_len) {
    tpi_wbuf *b = e->b;
    switch (m->type) {
    case TPI_MSG_REMOTE:
        put_gid(b, m->rref);
        put_gid(b, m->fork);
        /* fall through */
    case TPI_MSG_REQUEST:
        tpi_wbuf_u32(b, m->timeout_ms);
        tpi_wbuf_str(b, m->text, text_len);
        if (arg_write(e, m->args, TP_KIND_LIST) != TP_OK ||
            arg_write(e, m->kwargs, TP_KIND_MAP) != TP_OK)
            return e->status;
        break;
    case TPI_MSG_RESPONSE:
        tpi_wbuf_u32(b, m->status);
        if (m->status != TP_OK)
            tpi_wbuf_str(b, m->text, text_len);
        else if (!m->value)
            tpi_wbuf_u8(b, TP_KIND_NIL);
        else if (value_write(e, m->value) != TP_OK)
            return e->status;
        break;
    case TPI_MSG_RREF_FETCH:
        put_gid(b, m->rref);
        break;
    case TPI_MSG_RREF_DELETE:
        put_gid(b, m->rref);
        put_gid(b, m->fork);
        break;
    case TPI_MSG_RREF_FORK:
        put_gid(b, m->rref);
        put_gid(b, m->fork);
        tpi_wbuf_u32(b, m->parent);
        tpi_wbuf_u32(b, m->owner_inc);
        break;
    case TPI_MSG_RREF_ACCEPT:
        put_gid(b, m->fork);
        break;
    case TPI_MSG_RREF_ABANDON:
        put_gid(b, m->rref);
        tpi_wbuf_u32(b, m->status);
        tpi_wbuf_str(b, m->text, text_len);
        break;
    default:
        break;
    }
    if (b->status != TP_OK)
        return enc_fail(e, b->status, "writing a %s message: %s", msg_type_name(m->type),
                        tp_strerror(b->status));
    return TP_OK;
}

static tp_status report(tp_status st, const char *msg, char *errmsg, size_t errmsg_len) {
    if (st != TP_OK && errmsg && errmsg_len > 0)
        tpi_format(errmsg, errmsg_len, "%s", msg);
    return st;
}

tp_status tpi_msg_encode(const tpi_msg *m, const tpi_codec_hooks *hooks, uint64_t max_size,
                         tp_frame **out, char *errmsg, size_t errmsg_len) {
    enc e;
    enc_init(&e, NULL, hooks);
    e.zc_on = 1; /* a frame can hold references: large tensors are shared */
    if (!m || !out)
        return report(TP_EINVAL, "message encode: NULL argument", errmsg, errmsg_len);
    *out = NULL;
    size_t text_len = 0;
    uint64_t body = 0;
    if (msg_size(&e, m, &text_len, &body) != TP_OK)
        return report(e.status, e.err, errmsg, errmsg_len);
    uint64_t total = add_sat(TP_FRAME_HEADER_SIZE, body);
    uint64_t limit = max_size < TPI_MESSAGE_SIZE_MAX ? max_size : TPI_MESSAGE_SIZE_MAX;
    if (total > limit) {
        enc_fail(&e, TP_EMSGSIZE, "a %s message of %llu bytes exceeds the limit of %llu bytes",
                 msg_type_name(m->type), (unsigned long long)total, (unsigned long long)limit);
        return report(e.status, e.err, errmsg, errmsg_len);
    }
    /* What the frame copies: everything but the data of the tensors it shares. */
    size_t own = (size_t)(total - e.zc_bytes);
    tp_frame *f = e.zc_sized ? tpi_frame_shared_alloc(own) : tp_frame_alloc(own);
    if (!f) {
        enc_fail(&e, TP_ENOMEM, "out of memory for a message of %llu bytes",
                 (unsigned long long)total);
        return report(e.status, e.err, errmsg, errmsg_len);
    }
    uint8_t *bytes = e.zc_sized ? tpi_frame_shared_bytes(f) : tp_frame_bytes(f);
    tpi_wbuf b;
    wbuf_over(&b, bytes, own);
    e.b = &b;
    e.frame = e.zc_sized ? f : NULL;
    header_write(&b, m, (uint32_t)body);
    if (body_write(&e, m, text_len) != TP_OK) {
        tp_frame_free(f);
        return report(e.status, e.err, errmsg, errmsg_len);
    }
    TPI_ASSERT(b.status == TP_OK && b.len == own && e.zc_n == e.zc_sized);
    if (e.zc_sized) {
        size_t at = 0;
        for (int i = 0; i < e.zc_n; i++) {
            TPI_ASSERT(e.zc[i].off > at || (i > 0 && e.zc[i].off == at));
            if (e.zc[i].off > at)
                tpi_frame_push_seg(f, bytes + at, e.zc[i].off - at);
            tpi_frame_push_seg(f, e.zc[i].base, e.zc[i].len);
            at = e.zc[i].off;
        }
        if (own > at)
            tpi_frame_push_seg(f, bytes + at, own - at);
    }
    TPI_ASSERT(f->len == total && f->seg[0].len >= TP_FRAME_HEADER_SIZE);
    *out = f;
    return TP_OK;
}

uint8_t tpi_frame_type(const tp_frame *f) {
    TPI_ASSERT(f && f->nseg >= 1 && f->seg[0].len >= TP_FRAME_HEADER_SIZE);
    return ((const uint8_t *)f->seg[0].base)[5];
}

uint64_t tpi_frame_id(const tp_frame *f) {
    TPI_ASSERT(f && f->nseg >= 1 && f->seg[0].len >= TP_FRAME_HEADER_SIZE);
    return load_le((const uint8_t *)f->seg[0].base + 16, 8);
}

uint16_t tpi_frame_flags(const tp_frame *f) {
    TPI_ASSERT(f && f->nseg >= 1 && f->seg[0].len >= TP_FRAME_HEADER_SIZE);
    return (uint16_t)load_le((const uint8_t *)f->seg[0].base + 6, 2);
}

uint32_t tpi_frame_gen(const tp_frame *f) {
    TPI_ASSERT(f && f->nseg >= 1 && f->seg[0].len >= TP_FRAME_HEADER_SIZE);
    return (uint32_t)load_le((const uint8_t *)f->seg[0].base + 12, 4);
}

void tpi_frame_set_gen(tp_frame *f, uint32_t gen) {
    TPI_ASSERT(f && f->nseg >= 1 && f->seg[0].len >= TP_FRAME_HEADER_SIZE);
    uint8_t *h = (uint8_t *)f->seg[0].base; /* the encoder's own header bytes */
    TPI_ASSERT(h[5] == TPI_MSG_REQUEST || h[5] == TPI_MSG_REMOTE);
    for (int i = 0; i < 4; i++)
        h[12 + i] = (uint8_t)(gen >> (8 * i));
}

int tpi_frame_request_name(const tp_frame *f, char name[TP_NAME_LEN_MAX + 1]) {
    TPI_ASSERT(f && f->nseg >= 1);
    if (f->nseg != 1 || f->seg[0].len < TP_FRAME_HEADER_SIZE + 8)
        return 0;
    const uint8_t *p = (const uint8_t *)f->seg[0].base + TP_FRAME_HEADER_SIZE + 4; /* timeout */
    uint64_t n = load_le(p, 4);
    if (n == 0 || n > TP_NAME_LEN_MAX || n > f->seg[0].len - TP_FRAME_HEADER_SIZE - 8)
        return 0;
    memcpy(name, p + 4, (size_t)n);
    name[n] = '\0';
    return memchr(name, '\0', (size_t)n) == NULL;
}

/* Decodes args or kwargs and checks the kind. */
static tp_value *arg_read(tpi_rbuf *r, const tpi_codec_hooks *hooks, tp_kind want,
                          const char *what) {
    size_t at = r->pos;
    tp_value *v = decode_value(r, hooks, 0);
    if (v && tp_value_kind(v) != want) {
        tpi_rbuf_fail(r, TP_EPROTO, "%s at offset %zu must be a %s, got %s", what, at,
                      tp_kind_name(want), tp_kind_name(tp_value_kind(v)));
        tp_value_free(v);
        return NULL;
    }
    return v;
}

static void body_read(tpi_rbuf *r, const tpi_codec_hooks *hooks, tpi_msg *m) {
    switch (m->type) {
    case TPI_MSG_REMOTE:
        get_gid(r, &m->rref);
        get_gid(r, &m->fork);
        /* fall through */
    case TPI_MSG_REQUEST:
        if (!tpi_rbuf_u32(r, &m->timeout_ms) ||
            !get_name(r, "function name", 1, TP_NAME_LEN_MAX, m->text))
            return;
        if (!(m->args = arg_read(r, hooks, TP_KIND_LIST, "args")))
            return;
        m->kwargs = arg_read(r, hooks, TP_KIND_MAP, "kwargs");
        break;
    case TPI_MSG_RESPONSE: {
        size_t at = r->pos;
        if (!tpi_rbuf_u32(r, &m->status))
            return;
        if (m->status >= TP_STATUS_COUNT_) {
            tpi_rbuf_fail(r, TP_EPROTO, "unknown status %u at offset %zu", (unsigned)m->status, at);
            return;
        }
        if (m->status == TP_OK)
            tpi_value_decode(r, hooks, &m->value);
        else
            get_name(r, "error message", 0, TPI_REMOTE_MSG_LEN_MAX, m->text);
        break;
    }
    case TPI_MSG_RREF_FETCH:
        get_gid(r, &m->rref);
        break;
    case TPI_MSG_RREF_DELETE:
        get_gid(r, &m->rref);
        get_gid(r, &m->fork);
        break;
    case TPI_MSG_RREF_FORK:
        get_gid(r, &m->rref);
        get_gid(r, &m->fork);
        tpi_rbuf_u32(r, &m->parent);
        tpi_rbuf_u32(r, &m->owner_inc);
        break;
    case TPI_MSG_RREF_ACCEPT:
        get_gid(r, &m->fork);
        break;
    case TPI_MSG_RREF_ABANDON: {
        get_gid(r, &m->rref);
        size_t at = r->pos;
        if (!tpi_rbuf_u32(r, &m->status))
            return;
        if (m->status == TP_OK || m->status >= TP_STATUS_COUNT_) {
            tpi_rbuf_fail(r, TP_EPROTO, "an abandoned creation with status %u at offset %zu",
                          (unsigned)m->status, at);
            return;
        }
        get_name(r, "error message", 0, TPI_REMOTE_MSG_LEN_MAX, m->text);
        break;
    }
    default:
        TPI_ASSERT(0 && "type checked by the header");
    }
}

/* The frame's bytes in one piece: received frames are; others are gathered. */
static tp_status frame_bytes(const tp_frame *f, const uint8_t **p, uint8_t **gathered, char *errmsg,
                             size_t errmsg_len) {
    *gathered = NULL;
    if (f->nseg < 1 || f->nseg > TP_FRAME_SEG_MAX)
        return report(TP_EPROTO, "frame with a bad segment count", errmsg, errmsg_len);
    size_t sum = 0;
    for (int i = 0; i < f->nseg; i++) {
        if (f->seg[i].len > SIZE_MAX - sum)
            return report(TP_EPROTO, "frame segments overflow", errmsg, errmsg_len);
        sum += f->seg[i].len;
    }
    if (sum != f->len) {
        char msg[96];
        tpi_format(msg, sizeof msg, "frame of %zu bytes whose segments hold %zu", f->len, sum);
        return report(TP_EPROTO, msg, errmsg, errmsg_len);
    }
    if (f->nseg == 1) {
        *p = f->seg[0].base;
        return TP_OK;
    }
    uint8_t *buf = malloc(sum ? sum : 1);
    if (!buf)
        return report(TP_ENOMEM, "out of memory gathering a frame", errmsg, errmsg_len);
    size_t off = 0;
    for (int i = 0; i < f->nseg; i++) {
        if (f->seg[i].len)
            memcpy(buf + off, f->seg[i].base, f->seg[i].len);
        off += f->seg[i].len;
    }
    *p = buf;
    *gathered = buf;
    return TP_OK;
}

/* Decodes f; with hold (f's one segment as a block), large tensors view it. */
static tp_status msg_decode(const tp_frame *f, tpi_blob *hold, const tpi_codec_hooks *hooks,
                            tpi_msg *m, char *errmsg, size_t errmsg_len) {
    TPI_ASSERT(f != NULL && m != NULL);
    tpi_msg_reset(m);
    const uint8_t *p = NULL;
    uint8_t *gathered;
    tp_status st = frame_bytes(f, &p, &gathered, errmsg, errmsg_len);
    if (st != TP_OK)
        return st;
    size_t len = f->len;
    tpi_rbuf r;
    tpi_rbuf_init(&r, p, len);
    if (hold && !gathered) {
        TPI_ASSERT(hold->data == p && hold->len == len);
        r.hold = hold;
    }
    size_t frame_len = 0;
    if (len < TP_FRAME_HEADER_SIZE) {
        tpi_rbuf_fail(&r, TP_EPROTO, "frame of %zu bytes is shorter than the %d-byte header", len,
                      TP_FRAME_HEADER_SIZE);
    } else {
        st = tp_frame_check_header(p, TPI_MESSAGE_SIZE_MAX, &frame_len, r.errmsg, sizeof r.errmsg);
        r.status = st;
    }
    if (r.status == TP_OK && frame_len != len) {
        if (len > frame_len)
            tpi_rbuf_fail(&r, TP_EPROTO, "%zu trailing bytes after the body at offset %zu",
                          len - frame_len, frame_len);
        else
            tpi_rbuf_fail(&r, TP_EPROTO, "truncated: the header says %zu bytes, the frame has %zu",
                          frame_len, len);
    }
    if (r.status == TP_OK) {
        m->type = p[5];
        m->flags = (uint16_t)load_le(p + 6, 2);
        m->id = load_le(p + 16, 8);
        r.pos = TP_FRAME_HEADER_SIZE;
        if ((m->flags & TPI_FLAG_METHOD) && !has_method_flag(m->type))
            tpi_rbuf_fail(&r, TP_EPROTO, "flag METHOD on a %s message at offset 6",
                          msg_type_name(m->type));
        else
            body_read(&r, hooks, m);
    }
    if (r.status == TP_OK && r.pos != r.len)
        tpi_rbuf_fail(&r, TP_EPROTO, "%zu trailing bytes after the body at offset %zu",
                      r.len - r.pos, r.pos);
    free(gathered);
    if (r.status != TP_OK) {
        tpi_msg_clear(m);
        tpi_msg_reset(m);
        return report(r.status, r.errmsg, errmsg, errmsg_len);
    }
    return TP_OK;
}

tp_status tpi_msg_decode(const tp_frame *f, const tpi_codec_hooks *hooks, tpi_msg *m, char *errmsg,
                         size_t errmsg_len) {
    return msg_decode(f, NULL, hooks, m, errmsg, errmsg_len);
}

/* The block standing for a received frame: its last reference frees the frame. */
static void frame_hold_release(tpi_blob *b) {
    tp_frame_free(b->ctx);
    free(b);
}

tp_status tpi_msg_decode_frame(tp_frame *f, const tpi_codec_hooks *hooks, tpi_msg *m,
                               char *errmsg, size_t errmsg_len) {
    TPI_ASSERT(f != NULL && m != NULL);
    /* Only a frame that can carry a tensor of TPI_ZERO_COPY_MIN bytes needs the
     * block tensors view; a smaller one is copied out and freed here. */
    tpi_blob *hold = tpi_frame_owns_bytes(f) && f->len >= TPI_ZERO_COPY_MIN
                         ? malloc(sizeof *hold)
                         : NULL;
    if (!hold) { /* not ours to lend, or no memory for the block: copy */
        tp_status st = msg_decode(f, NULL, hooks, m, errmsg, errmsg_len);
        tp_frame_free(f);
        return st;
    }
    atomic_init(&hold->refs, 1);
    hold->data = tp_frame_bytes(f);
    hold->len = f->len;
    hold->release = frame_hold_release;
    hold->ctx = f;
    tp_status st = msg_decode(f, hold, hooks, m, errmsg, errmsg_len);
    tpi_blob_unref(hold); /* the frame goes now unless a tensor views it */
    return st;
}

void tpi_msg_call(tpi_msg *m, uint8_t type, const char *fn, const tp_value *args,
                  const tp_value *kwargs) {
    tpi_msg_reset(m);
    m->type = type;
    tpi_copy_text(m->text, sizeof m->text, fn);
    m->args = (tp_value *)args; /* encoding only reads them */
    m->kwargs = (tp_value *)kwargs;
}

void tpi_msg_clear(tpi_msg *m) {
    if (!m)
        return;
    tp_value_free(m->args);
    tp_value_free(m->kwargs);
    tp_value_free(m->value);
    m->args = NULL;
    m->kwargs = NULL;
    m->value = NULL;
}
