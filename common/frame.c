/*
 * frame.c: frames as backends hold them, and the header check backends run
 * on the first 24 bytes of each frame before they read (or allocate for)
 * its body (spec/wire.md WIRE-1, WIRE-6). Also the frames the encoder
 * builds around shared tensor storage (WIRE-10): their own bytes, then
 * segments that borrow blocks they hold a reference to until destroyed.
 */
#include <stdalign.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "errors.h"
#include "value.h"
#include "tensorplay/rpc_backend.h"

/* One allocation: the struct, then the bytes (aligned as the struct is). */
static void frame_alloc_destroy(tp_frame *f) {
    free(f);
}

tp_frame *tp_frame_alloc(size_t len) {
    if (len > SIZE_MAX - sizeof(tp_frame))
        return NULL;
    tp_frame *f = malloc(sizeof *f + len);
    if (!f)
        return NULL;
    memset(f, 0, sizeof *f);
    f->len = len;
    f->nseg = 1;
    f->seg[0].base = (uint8_t *)(f + 1);
    f->seg[0].len = len;
    f->destroy = frame_alloc_destroy;
    return f;
}

uint8_t *tp_frame_bytes(tp_frame *f) {
    TPI_ASSERT(f != NULL && f->destroy == frame_alloc_destroy);
    return (uint8_t *)(f + 1);
}

int tpi_frame_owns_bytes(const tp_frame *f) {
    return f != NULL && f->destroy == frame_alloc_destroy;
}

/* A frame with its own bytes after the struct and references to blocks. */
typedef struct shared_frame {
    tp_frame f;
    int nrefs;
    tpi_blob *refs[TP_FRAME_SEG_MAX];
    size_t own_len;
} shared_frame;

#define SHARED_HEAD                                                                         \
    ((sizeof(shared_frame) + alignof(max_align_t) - 1) / alignof(max_align_t) *            \
     alignof(max_align_t))

static void shared_frame_destroy(tp_frame *f) {
    shared_frame *sf = (shared_frame *)f;
    for (int i = 0; i < sf->nrefs; i++)
        tpi_blob_unref(sf->refs[i]);
    free(sf);
}

tp_frame *tpi_frame_shared_alloc(size_t own_len) {
    if (own_len > SIZE_MAX - SHARED_HEAD)
        return NULL;
    shared_frame *sf = malloc(SHARED_HEAD + own_len);
    if (!sf)
        return NULL;
    memset(sf, 0, sizeof *sf);
    sf->own_len = own_len;
    sf->f.destroy = shared_frame_destroy;
    return &sf->f;
}

uint8_t *tpi_frame_shared_bytes(tp_frame *f) {
    TPI_ASSERT(f != NULL && f->destroy == shared_frame_destroy);
    return (uint8_t *)f + SHARED_HEAD;
}

void tpi_frame_shared_hold(tp_frame *f, tpi_blob *b) {
    TPI_ASSERT(f != NULL && f->destroy == shared_frame_destroy && b != NULL);
    shared_frame *sf = (shared_frame *)f;
    TPI_ASSERT(sf->nrefs < TP_FRAME_SEG_MAX);
    tpi_blob_ref(b);
    sf->refs[sf->nrefs++] = b;
}

void tpi_frame_push_seg(tp_frame *f, const void *base, size_t len) {
    TPI_ASSERT(f != NULL && f->nseg < TP_FRAME_SEG_MAX && (base != NULL || len == 0));
    TPI_ASSERT(len <= SIZE_MAX - f->len);
    f->seg[f->nseg].base = base;
    f->seg[f->nseg].len = len;
    f->nseg++;
    f->len += len;
}

void tp_frame_free(tp_frame *f) {
    if (!f)
        return;
    TPI_ASSERT(f->destroy != NULL);
    f->destroy(f);
}

static uint32_t load_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static tp_status header_fail(tp_status st, char *errmsg, size_t errmsg_len, const char *fmt, ...)
    TPI_PRINTF(4, 5);
static tp_status header_fail(tp_status st, char *errmsg, size_t errmsg_len, const char *fmt, ...) {
    if (errmsg && errmsg_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        tpi_vformat(errmsg, errmsg_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

tp_status tp_frame_check_header(const uint8_t header[TP_FRAME_HEADER_SIZE],
                                uint64_t max_message_size, size_t *frame_len, char *errmsg,
                                size_t errmsg_len) {
    if (!header || !frame_len)
        return header_fail(TP_EINVAL, errmsg, errmsg_len, "frame header check: NULL argument");
    if (header[0] != TPI_WIRE_MAGIC0 || header[1] != TPI_WIRE_MAGIC1 ||
        header[2] != TPI_WIRE_MAGIC2 || header[3] != TPI_WIRE_MAGIC3)
        return header_fail(TP_EPROTO, errmsg, errmsg_len,
                           "bad magic %02x %02x %02x %02x at offset 0, expected \"TPRC\"",
                           header[0], header[1], header[2], header[3]);
    if (header[4] != TPI_WIRE_VERSION)
        return header_fail(TP_EPROTO, errmsg, errmsg_len, "wire version %u, expected %u", header[4],
                           TPI_WIRE_VERSION);
    if (header[5] < TPI_MSG_REQUEST || header[5] > TPI_MSG_TYPE_MAX_)
        return header_fail(TP_EPROTO, errmsg, errmsg_len, "unknown message type %u at offset 5",
                           header[5]);
    unsigned flags = (unsigned)header[6] | (unsigned)header[7] << 8;
    if (flags & ~TPI_FLAGS_KNOWN)
        return header_fail(TP_EPROTO, errmsg, errmsg_len, "unknown flags 0x%04x at offset 6",
                           flags & ~TPI_FLAGS_KNOWN);
    uint32_t reserved = load_u32(header + 12);
    if (reserved != 0)
        return header_fail(TP_EPROTO, errmsg, errmsg_len,
                           "reserved header field is 0x%08x at offset 12, expected 0",
                           (unsigned)reserved);
    uint64_t total = TP_FRAME_HEADER_SIZE + (uint64_t)load_u32(header + 8);
    uint64_t limit =
        max_message_size < TPI_MESSAGE_SIZE_MAX ? max_message_size : TPI_MESSAGE_SIZE_MAX;
    if (total > limit)
        return header_fail(TP_EMSGSIZE, errmsg, errmsg_len,
                           "message of %llu bytes exceeds the limit of %llu bytes",
                           (unsigned long long)total, (unsigned long long)limit);
    *frame_len = (size_t)total;
    return TP_OK;
}

tp_frame *tp_frame_flatten(const tp_frame *f) {
    TPI_ASSERT(f && f->nseg >= 1 && f->nseg <= TP_FRAME_SEG_MAX);
    tp_frame *out = tp_frame_alloc(f->len);
    if (!out)
        return NULL;
    uint8_t *p = tp_frame_bytes(out);
    size_t total = 0;
    for (int i = 0; i < f->nseg; i++) {
        if (f->seg[i].len)
            memcpy(p + total, f->seg[i].base, f->seg[i].len);
        total += f->seg[i].len;
    }
    TPI_ASSERT(total == f->len);
    return out;
}
