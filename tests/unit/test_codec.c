/*
 * test_codec.c: the wire format (spec/wire.md WIRE-1..9): round trips of
 * every value kind and message type, canonical re-encoding, and rejection
 * of malformed input (truncation at every offset, bad header fields,
 * unknown tags and dtypes, lengths past the end or the limits, depth
 * bombs, trailing bytes, tensor byte-count mismatches, names too long,
 * messages over max_size), with rref hooks.
 */
#define _GNU_SOURCE /* RTLD_NEXT, for alloc_fault.h */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/codec.h"
#include "common/errors.h"
#include "common/value.h"

#include "alloc_fault.h"
#include "fake_rref.h"

/* ---- Helpers ------------------------------------------------------------------ */

static char err[TP_ERRMSG_LEN_MAX];

static tp_frame *encode_ok(const tpi_msg *m, const tpi_codec_hooks *hooks) {
    tp_frame *f = NULL;
    tp_status st = tpi_msg_encode(m, hooks, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err);
    if (st != TP_OK)
        fail_msg("encode failed: %s: %s", tp_status_name(st), err);
    assert_non_null(f);
    assert_int_equal(f->nseg, 1);
    return f;
}

/* Decodes bytes copied into a fresh frame (as a backend would receive them). */
static tp_status decode_bytes(const void *bytes, size_t len, const tpi_codec_hooks *hooks,
                              tpi_msg *m) {
    tp_frame *f = tp_frame_alloc(len);
    assert_non_null(f);
    if (len)
        memcpy(tp_frame_bytes(f), bytes, len);
    err[0] = '\0';
    tp_status st = tpi_msg_decode(f, hooks, m, err, sizeof err);
    tp_frame_free(f);
    return st;
}

static const uint8_t *frame_data(const tp_frame *f) {
    return f->seg[0].base;
}

/* A frame of raw body bytes behind a valid header; returns its length. */
static size_t make_frame(uint8_t *out, uint8_t type, uint16_t flags, const void *body,
                         size_t body_len) {
    static const uint8_t magic[4] = {'T', 'P', 'R', 'C'};
    memcpy(out, magic, 4);
    out[4] = TPI_WIRE_VERSION;
    out[5] = type;
    out[6] = (uint8_t)flags;
    out[7] = (uint8_t)(flags >> 8);
    for (int i = 0; i < 4; i++)
        out[8 + i] = (uint8_t)(body_len >> (8 * i));
    memset(out + 12, 0, 12);
    out[16] = 5; /* id 5 */
    if (body_len)
        memcpy(out + TP_FRAME_HEADER_SIZE, body, body_len);
    return TP_FRAME_HEADER_SIZE + body_len;
}

/* Decodes a RESPONSE whose OK value is the given raw bytes. */
static tp_status decode_value_bytes(const void *value, size_t len, tpi_msg *m) {
    uint8_t body[4096];
    assert_true(len + 4 <= sizeof body);
    memset(body, 0, 4); /* status TP_OK */
    memcpy(body + 4, value, len);
    uint8_t *frame = malloc(TP_FRAME_HEADER_SIZE + len + 4);
    size_t n = make_frame(frame, TPI_MSG_RESPONSE, 0, body, len + 4);
    tp_status st = decode_bytes(frame, n, NULL, m);
    free(frame);
    return st;
}

static void expect_proto(const void *value, size_t len, const char *needle) {
    tpi_msg m;
    assert_int_equal(decode_value_bytes(value, len, &m), TP_EPROTO);
    if (!strstr(err, needle))
        fail_msg("error '%s' does not contain '%s'", err, needle);
    assert_null(m.value);
}

/* Round-trips v as a RESPONSE value; checks that re-encoding the decoded
 * message gives the same bytes (canonical form, WIRE-7). */
static tp_value *roundtrip(const tp_value *v) {
    tpi_msg m = {0};
    m.type = TPI_MSG_RESPONSE;
    m.id = 0x1122334455667788u;
    m.value = (tp_value *)v;
    tp_frame *f = encode_ok(&m, NULL);
    tpi_msg d;
    tp_status st = tpi_msg_decode(f, NULL, &d, err, sizeof err);
    if (st != TP_OK)
        fail_msg("decode failed: %s", err);
    assert_int_equal(d.type, TPI_MSG_RESPONSE);
    assert_true(d.id == 0x1122334455667788u);
    assert_int_equal(d.status, TP_OK);
    tp_frame *again = encode_ok(&d, NULL);
    assert_int_equal(again->len, f->len);
    assert_memory_equal(frame_data(again), frame_data(f), f->len);
    tp_value *out = d.value;
    d.value = NULL;
    tpi_msg_clear(&d);
    tp_frame_free(f);
    tp_frame_free(again);
    return out;
}

static void assert_roundtrip(tp_value *v) {
    tp_value *back = roundtrip(v);
    assert_non_null(back);
    if (!tp_value_equal(v, back)) {
        char a[256], b[256];
        tp_value_format(v, a, sizeof a);
        tp_value_format(back, b, sizeof b);
        fail_msg("round trip changed %s into %s", a, b);
    }
    tp_value_free(back);
    tp_value_free(v);
}

/* ---- Round trips ----------------------------------------------------------------- */

static void test_codec_roundtrip_scalars(void **state) {
    (void)state;
    assert_roundtrip(tp_value_nil());
    assert_roundtrip(tp_value_bool(1));
    assert_roundtrip(tp_value_bool(0));
    const int64_t ints[] = {0, 1, -1, 255, -256, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        assert_roundtrip(tp_value_int(ints[i]));
    const double floats[] = {0.0, -0.0, 1.5, -1e300, DBL_MIN / 4, DBL_MAX, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++)
        assert_roundtrip(tp_value_float(floats[i]));
    /* NaN keeps its exact bits (payload and sign) */
    uint64_t bits = 0xfff8000000abcdefu, got;
    double nan;
    memcpy(&nan, &bits, sizeof nan);
    tp_value *v = tp_value_float(nan);
    tp_value *back = roundtrip(v);
    double d;
    assert_int_equal(tp_value_get_float(back, &d), TP_OK);
    memcpy(&got, &d, sizeof got);
    assert_true(got == bits);
    tp_value_free(v);
    tp_value_free(back);
    /* -0.0 keeps its sign */
    v = tp_value_float(-0.0);
    back = roundtrip(v);
    tp_value_get_float(back, &d);
    assert_true(signbit(d));
    tp_value_free(v);
    tp_value_free(back);
}

static void test_codec_roundtrip_blobs_and_info(void **state) {
    (void)state;
    assert_roundtrip(tp_value_str(""));
    assert_roundtrip(tp_value_str("héllo wörld ✓"));
    assert_roundtrip(tp_value_strn("a\0b", 3));
    assert_roundtrip(tp_value_bytes("", 0));
    uint8_t all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (uint8_t)i;
    assert_roundtrip(tp_value_bytes(all, sizeof all));
    tp_worker_info wi = {.name = "ps:0", .id = 65535};
    assert_roundtrip(tp_value_worker_info(&wi));
    tp_worker_info empty = {.name = "", .id = 0};
    assert_roundtrip(tp_value_worker_info(&empty));
}

static void test_codec_roundtrip_containers(void **state) {
    (void)state;
    assert_roundtrip(tp_value_list());
    assert_roundtrip(tp_value_map());
    tp_value *m = tp_value_map();
    tp_map_set(m, "z", tp_value_int(1));
    tp_map_set(m, "", tp_value_list());
    tp_map_set(m, "a", tp_value_map());
    tp_value *nested = tp_value_list_of(
        4, tp_value_list_of(2, tp_value_list_of(0), tp_value_list_of(1, tp_value_nil())), m,
        tp_value_str("x"), tp_value_list_of(1, tp_value_map()));
    tp_value *back = roundtrip(nested);
    assert_true(tp_value_equal(nested, back));
    /* insertion order survives */
    const tp_value *bm = tp_list_get(back, 1);
    assert_string_equal(tp_map_key_at(bm, 0), "z");
    assert_string_equal(tp_map_key_at(bm, 1), "");
    assert_string_equal(tp_map_key_at(bm, 2), "a");
    tp_value_free(back);
    tp_value_free(nested);
    /* tuples stay tuples, nested or not, and differ from lists (VALUE-11) */
    tp_value *tup = tp_value_tuple();
    tp_list_append(tup, tp_value_int(1));
    tp_list_append(tup, tp_value_tuple());
    tp_value *outer = tp_value_list_of(2, tup, tp_value_list_of(1, tp_value_int(1)));
    back = roundtrip(outer);
    assert_true(tp_value_equal(outer, back));
    assert_true(tp_list_is_tuple(tp_list_get(back, 0)));
    assert_true(tp_list_is_tuple(tp_list_get(tp_list_get(back, 0), 1)));
    assert_false(tp_list_is_tuple(tp_list_get(back, 1)));
    assert_false(tp_list_is_tuple(back));
    char text[64];
    tp_value_format(back, text, sizeof text);
    assert_string_equal(text, "[(1, ()), [1]]");
    tp_value_free(back);
    tp_value_free(outer);
    /* opaque bytes stay opaque (VALUE-12) */
    tp_value *op = tp_value_list_of(2, tp_value_opaque("ab", 2), tp_value_bytes("ab", 2));
    back = roundtrip(op);
    assert_true(tp_value_equal(op, back));
    assert_true(tp_bytes_is_opaque(tp_list_get(back, 0)));
    assert_false(tp_bytes_is_opaque(tp_list_get(back, 1)));
    tp_value_free(back);
    tp_value_free(op);
    /* a wide list */
    tp_value *wide = tp_value_list();
    for (int i = 0; i < 1000; i++)
        tp_list_append(wide, tp_value_int(i * 7919));
    assert_roundtrip(wide);
}

static void test_codec_roundtrip_tensors_every_dtype(void **state) {
    (void)state;
    uint8_t data[2 * 3 * 16]; /* complex128 is the widest */
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(i * 37 + 1);
    for (int dt = 0; dt < TP_DTYPE_COUNT_; dt++) {
        uint8_t local[sizeof data];
        memcpy(local, data, sizeof data);
        if (dt == TP_DTYPE_BOOL)
            for (size_t i = 0; i < sizeof local; i++)
                local[i] &= 1;
        int64_t shape[2] = {2, 3};
        tp_value *t = tp_value_tensor((tp_dtype)dt, 2, shape, NULL, local);
        assert_non_null(t);
        tp_value *back = roundtrip(t);
        assert_true(tp_value_equal(t, back));
        assert_int_equal(tp_tensor_dtype(back), dt);
        assert_memory_equal(tp_tensor_cdata(back), local, 6 * tp_dtype_size((tp_dtype)dt));
        tp_value_free(back);
        tp_value_free(t);
    }
    /* 0-d, empty, and the maximum number of dimensions */
    double x = 3.25;
    assert_roundtrip(tp_value_tensor(TP_DTYPE_FLOAT64, 0, NULL, NULL, &x));
    int64_t empty[3] = {4, 0, 2};
    assert_roundtrip(tp_value_tensor(TP_DTYPE_FLOAT32, 3, empty, NULL, NULL));
    int64_t ones[TP_TENSOR_NDIM_MAX];
    for (int i = 0; i < TP_TENSOR_NDIM_MAX; i++)
        ones[i] = i == 3 ? 2 : 1;
    assert_roundtrip(tp_value_tensor(TP_DTYPE_INT16, TP_TENSOR_NDIM_MAX, ones, NULL, NULL));
}

/* VALUE-5: a dimension may be as large as INT64_MAX when another is 0 (no
 * element, no data): it travels and comes back whole. */
static void test_codec_tensor_dimension_int64_max(void **state) {
    (void)state;
    assert_roundtrip(tp_value_tensor(TP_DTYPE_UINT8, 2, (int64_t[]){INT64_MAX, 0}, NULL, NULL));
    assert_roundtrip(tp_value_tensor(TP_DTYPE_FLOAT64, 2, (int64_t[]){0, INT64_MAX}, NULL, NULL));
}

static void test_codec_strided_tensor_travels_packed(void **state) {
    (void)state;
    /* columns 1..2 of a 3x4 float64 matrix, transposed: shape [2, 3], strides [1, 4] */
    double base[12];
    for (int i = 0; i < 12; i++)
        base[i] = i;
    int64_t shape[2] = {2, 3}, strides[2] = {1, 4};
    tp_value *t = tp_value_tensor(TP_DTYPE_FLOAT64, 2, shape, strides, base + 1);
    assert_non_null(t);
    tp_value *back = roundtrip(t);
    assert_true(tp_tensor_is_contiguous(back));
    assert_true(tp_tensor_strides(back)[0] == 3 && tp_tensor_strides(back)[1] == 1);
    const double want[6] = {1, 5, 9, 2, 6, 10};
    assert_memory_equal(tp_tensor_cdata(back), want, sizeof want);
    assert_true(tp_value_equal(t, back));
    tp_value_free(t);
    tp_value_free(back);
}

static void test_codec_roundtrip_every_message_type(void **state) {
    (void)state;
    for (int type = TPI_MSG_REQUEST; type <= TPI_MSG_TYPE_MAX_; type++) {
        tpi_msg m = {0};
        m.type = (uint8_t)type;
        m.id = 1000 + (uint64_t)type;
        m.timeout_ms = 1500;
        m.rref = (tpi_gid){2, 0xabcdef0123u};
        m.fork = (tpi_gid){3, 77};
        m.parent = 4;
        if (type == TPI_MSG_RREF_ABANDON) {
            m.status = TP_ETIMEDOUT;
            strcpy(m.text, "the rref was not created: timed out");
        }
        if (type == TPI_MSG_REQUEST || type == TPI_MSG_REMOTE) {
            strcpy(m.text, "my_module.add");
            m.flags = type == TPI_MSG_REMOTE ? TPI_FLAG_METHOD : 0;
            m.args = tp_value_list_of(2, tp_value_int(1), tp_value_float(2.5));
            m.kwargs = tp_value_map();
            tp_map_set(m.kwargs, "scale", tp_value_int(3));
        }
        tp_frame *f = encode_ok(&m, NULL);
        assert_int_equal(tpi_frame_type(f), type);
        assert_true(tpi_frame_id(f) == m.id);
        size_t frame_len = 0;
        assert_int_equal(
            tp_frame_check_header(frame_data(f), TPI_MESSAGE_SIZE_MAX, &frame_len, err, sizeof err),
            TP_OK);
        assert_int_equal(frame_len, f->len);
        tpi_msg d;
        assert_int_equal(tpi_msg_decode(f, NULL, &d, err, sizeof err), TP_OK);
        assert_int_equal(d.type, type);
        assert_int_equal(d.flags, m.flags);
        assert_true(d.id == m.id);
        switch (type) {
        case TPI_MSG_REMOTE:
            assert_true(d.rref.worker == 2 && d.rref.local == 0xabcdef0123u);
            assert_true(d.fork.worker == 3 && d.fork.local == 77);
            /* fall through */
        case TPI_MSG_REQUEST:
            assert_int_equal(d.timeout_ms, 1500);
            assert_string_equal(d.text, "my_module.add");
            assert_true(tp_value_equal(d.args, m.args));
            assert_true(tp_value_equal(d.kwargs, m.kwargs));
            break;
        case TPI_MSG_RESPONSE:
            assert_int_equal(d.status, TP_OK);
            assert_int_equal(tp_value_kind(d.value), TP_KIND_NIL); /* NULL travels as nil */
            break;
        case TPI_MSG_RREF_FETCH:
            assert_true(d.rref.worker == 2 && d.rref.local == 0xabcdef0123u);
            break;
        case TPI_MSG_RREF_DELETE:
            assert_true(d.rref.local == 0xabcdef0123u && d.fork.local == 77);
            break;
        case TPI_MSG_RREF_FORK:
            assert_true(d.rref.local == 0xabcdef0123u && d.fork.worker == 3);
            assert_int_equal(d.parent, 4);
            break;
        case TPI_MSG_RREF_ACCEPT:
            assert_true(d.fork.worker == 3 && d.fork.local == 77);
            break;
        case TPI_MSG_RREF_ABANDON:
            assert_true(d.rref.worker == 2 && d.rref.local == 0xabcdef0123u);
            assert_int_equal(d.status, TP_ETIMEDOUT);
            assert_string_equal(d.text, "the rref was not created: timed out");
            break;
        }
        tpi_msg_clear(&d);
        assert_null(d.args); /* codec.h: cleared values are NULL, a second clear harmless */
        assert_null(d.kwargs);
        assert_null(d.value);
        assert_null(d.args);
        tpi_msg_clear(&m);
        tp_frame_free(f);
    }
}

static void test_codec_response_error_and_null_args(void **state) {
    (void)state;
    tpi_msg m = {0};
    m.type = TPI_MSG_RESPONSE;
    m.status = TP_EREMOTE;
    strcpy(m.text, "ValueError: bad input");
    tp_frame *f = encode_ok(&m, NULL);
    tpi_msg d;
    assert_int_equal(tpi_msg_decode(f, NULL, &d, err, sizeof err), TP_OK);
    assert_int_equal(d.status, TP_EREMOTE);
    assert_string_equal(d.text, "ValueError: bad input");
    assert_null(d.value);
    tp_frame_free(f);
    /* the longest error text travels whole; a longer one is cut to the limit */
    memset(m.text, 'e', sizeof m.text); /* not even terminated */
    f = encode_ok(&m, NULL);
    assert_int_equal(tpi_msg_decode(f, NULL, &d, err, sizeof err), TP_OK);
    assert_int_equal(strlen(d.text), TPI_REMOTE_MSG_LEN_MAX);
    tp_frame_free(f);
    /* a request with NULL args and kwargs gets an empty list and map */
    tpi_msg r = {0};
    r.type = TPI_MSG_REQUEST;
    strcpy(r.text, "f");
    f = encode_ok(&r, NULL);
    assert_int_equal(tpi_msg_decode(f, NULL, &d, err, sizeof err), TP_OK);
    assert_int_equal(tp_value_kind(d.args), TP_KIND_LIST);
    assert_int_equal(tp_list_len(d.args), 0);
    assert_int_equal(tp_value_kind(d.kwargs), TP_KIND_MAP);
    assert_int_equal(tp_map_len(d.kwargs), 0);
    tpi_msg_clear(&d);
    tp_frame_free(f);
}

static void test_codec_value_api_on_buffers(void **state) {
    (void)state;
    tpi_wbuf b;
    tpi_wbuf_init(&b, 1 << 20);
    tp_value *v = tp_value_list_of(2, tp_value_str("ab"), tp_value_int(-2));
    assert_int_equal(tpi_value_encode(&b, v, NULL), TP_OK);
    const uint8_t want[] = {6,   2, 0,    0,    0,    4,    2,    0,    0,    0,   'a',
                            'b', 2, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(b.len, sizeof want);
    assert_memory_equal(b.data, want, sizeof want);
    tpi_rbuf r;
    tpi_rbuf_init(&r, b.data, b.len);
    tp_value *out = NULL;
    assert_int_equal(tpi_value_decode(&r, NULL, &out), TP_OK);
    assert_int_equal(r.pos, b.len);
    assert_true(tp_value_equal(v, out));
    tp_value_free(out);
    /* no value at all: refused, nothing written */
    size_t had = b.len;
    assert_int_equal(tpi_value_encode(&b, NULL, NULL), TP_EINVAL);
    assert_int_equal(b.len, had);
    /* a value that does not fit what is left: EMSGSIZE, sticky */
    tpi_wbuf small;
    tpi_wbuf_init(&small, 8);
    assert_int_equal(tpi_value_encode(&small, v, NULL), TP_EMSGSIZE);
    assert_int_equal(small.status, TP_EMSGSIZE);
    assert_int_equal(small.len, 0);
    tpi_wbuf_u8(&small, 1);
    assert_int_equal(small.len, 0);
    tpi_wbuf_free(&small);
    /* one that fills it exactly: taken */
    tpi_wbuf exact;
    tpi_wbuf_init(&exact, sizeof want);
    assert_int_equal(tpi_value_encode(&exact, v, NULL), TP_OK);
    assert_int_equal(exact.len, sizeof want);
    tpi_wbuf_free(&exact);
    tpi_wbuf_free(&b);
    tp_value_free(v);
}

static void test_codec_buffers_primitives(void **state) {
    (void)state;
    tpi_wbuf b;
    tpi_wbuf_init(&b, 64);
    tpi_wbuf_u8(&b, 0xab);
    tpi_wbuf_u16(&b, 0x1234);
    tpi_wbuf_u32(&b, 0xdeadbeef);
    tpi_wbuf_u64(&b, 0x0102030405060708u);
    tpi_wbuf_str(&b, "hey", 3);
    assert_int_equal(b.status, TP_OK);
    const uint8_t want[] = {0xab, 0x34, 0x12, 0xef, 0xbe, 0xad, 0xde, 8, 7,   6,   5,
                            4,    3,    2,    1,    3,    0,    0,    0, 'h', 'e', 'y'};
    assert_int_equal(b.len, sizeof want);
    assert_memory_equal(b.data, want, sizeof want);
    tpi_rbuf r;
    tpi_rbuf_init(&r, b.data, b.len);
    uint8_t u8;
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
    const char *s;
    uint32_t n;
    assert_true(tpi_rbuf_u8(&r, &u8) && u8 == 0xab);
    assert_true(tpi_rbuf_u16(&r, &u16) && u16 == 0x1234);
    assert_true(tpi_rbuf_u32(&r, &u32) && u32 == 0xdeadbeef);
    assert_true(tpi_rbuf_u64(&r, &u64) && u64 == 0x0102030405060708u);
    tpi_rbuf r2 = r;
    assert_false(tpi_rbuf_str(&r2, &s, &n, 2)); /* over its limit */
    assert_int_equal(r2.status, TP_EPROTO);
    assert_non_null(strstr(r2.errmsg, "string of 3 bytes at offset 15 exceeds the limit of 2"));
    assert_true(tpi_rbuf_str(&r, &s, &n, 3) && n == 3 && memcmp(s, "hey", 3) == 0);
    assert_false(tpi_rbuf_u8(&r, &u8)); /* at the end */
    assert_int_equal(r.status, TP_EPROTO);
    assert_string_equal(r.errmsg, "truncated at offset 22: 1 bytes needed, 0 left");
    tpi_rbuf_fail(&r, TP_EINVAL, "later"); /* the first error stays */
    assert_int_equal(r.status, TP_EPROTO);
    /* up to max exactly: taken; one byte more: EMSGSIZE */
    tpi_wbuf full;
    static const uint8_t bytes[300];
    tpi_wbuf_init(&full, sizeof bytes);
    tpi_wbuf_put(&full, bytes, sizeof bytes);
    assert_int_equal(full.status, TP_OK);
    assert_int_equal(full.len, sizeof bytes);
    tpi_wbuf_u8(&full, 0);
    assert_int_equal(full.status, TP_EMSGSIZE);
    tpi_wbuf_free(&full);
    /* past max: the first failure sticks */
    for (int i = 0; i < 10; i++)
        tpi_wbuf_u64(&b, 0);
    assert_int_equal(b.status, TP_EMSGSIZE);
    assert_true(b.len <= 64);
    tpi_wbuf_free(&b);
}

/* ---- Frames ------------------------------------------------------------------------ */

static void test_codec_frame_alloc_and_multi_segment_decode(void **state) {
    (void)state;
    tp_frame *z = tp_frame_alloc(0);
    assert_non_null(z);
    assert_int_equal(z->len, 0);
    tp_frame_free(z);
    tp_frame_free(NULL);
    /* the same message split over three segments decodes the same */
    tpi_msg m = {0};
    m.type = TPI_MSG_REQUEST;
    strcpy(m.text, "split");
    m.args = tp_value_list_of(1, tp_value_str("across segments"));
    tp_frame *f = encode_ok(&m, NULL);
    tp_frame split = {0};
    const uint8_t *p = frame_data(f);
    split.len = f->len;
    split.nseg = 3;
    split.seg[0] = (tp_frame_seg){p, 10};
    split.seg[1] = (tp_frame_seg){p + 10, 20};
    split.seg[2] = (tp_frame_seg){p + 30, f->len - 30};
    tpi_msg d;
    assert_int_equal(tpi_msg_decode(&split, NULL, &d, err, sizeof err), TP_OK);
    assert_true(tp_value_equal(d.args, m.args));
    tpi_msg_clear(&d);
    split.len = f->len + 1; /* segments that do not add up */
    assert_int_equal(tpi_msg_decode(&split, NULL, &d, err, sizeof err), TP_EPROTO);
    tpi_msg_clear(&m);
    tp_frame_free(f);
}

/* WIRE-6: what the encoder refuses to build, and an RREF_ABANDON's status
 * (an error: never TP_OK, never past the last status) checked both ways. */
static void test_codec_refuses_bad_flags_and_abandon_status(void **state) {
    (void)state;
    tp_frame *f = NULL;
    tpi_msg m = {0};
    m.type = TPI_MSG_REQUEST;
    strcpy(m.text, "f");
    m.flags = 0x0100;
    assert_int_equal(tpi_msg_encode(&m, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err),
                     TP_EINVAL);
    assert_non_null(strstr(err, "unknown flags 0x0100"));
    assert_null(f);
    tpi_msg a = {0};
    a.type = TPI_MSG_RREF_ABANDON;
    a.rref = (tpi_gid){1, 9};
    const uint32_t bad[] = {TP_OK, TP_STATUS_COUNT_, TP_STATUS_COUNT_ + 1, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        a.status = bad[i];
        char want[64];
        snprintf(want, sizeof want, "an abandoned creation with status %u", (unsigned)bad[i]);
        assert_int_equal(tpi_msg_encode(&a, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err),
                         TP_EINVAL);
        assert_non_null(strstr(err, want));
        assert_null(f);
    }
    /* The last status is an error like any other; then its wire field is
     * rewritten to each bad value, which the decoder refuses. */
    a.status = TP_STATUS_COUNT_ - 1;
    strcpy(a.text, "gone");
    f = encode_ok(&a, NULL);
    uint8_t bytes[256];
    size_t len = f->len;
    assert_true(len <= sizeof bytes);
    memcpy(bytes, frame_data(f), len);
    tp_frame_free(f);
    tpi_msg d;
    assert_int_equal(decode_bytes(bytes, len, NULL, &d), TP_OK);
    assert_int_equal(d.status, TP_STATUS_COUNT_ - 1);
    assert_string_equal(d.text, "gone");
    tpi_msg_clear(&d);
    size_t at = TP_FRAME_HEADER_SIZE + 12; /* after the rref's gid */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t h[256];
        memcpy(h, bytes, len);
        h[at] = (uint8_t)bad[i];
        h[at + 1] = (uint8_t)(bad[i] >> 8);
        h[at + 2] = (uint8_t)(bad[i] >> 16);
        h[at + 3] = (uint8_t)(bad[i] >> 24);
        char want[80];
        snprintf(want, sizeof want, "an abandoned creation with status %u at offset %zu",
                 (unsigned)bad[i], at);
        assert_int_equal(decode_bytes(h, len, NULL, &d), TP_EPROTO);
        if (!strstr(err, want))
            fail_msg("status %u: '%s' lacks '%s'", (unsigned)bad[i], err, want);
    }
}

/* A frame's segments are checked before they are read: a count outside
 * 1..TP_FRAME_SEG_MAX, or lengths whose sum overflows, are protocol errors. */
static void test_codec_frame_segments_checked(void **state) {
    (void)state;
    tpi_msg m = {0};
    m.type = TPI_MSG_RREF_FETCH;
    tp_frame *f = encode_ok(&m, NULL);
    tp_frame g = {0};
    g.len = f->len;
    tpi_msg d;
    const int counts[] = {0, -1, TP_FRAME_SEG_MAX + 1};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        g.nseg = counts[i];
        g.seg[0] = (tp_frame_seg){frame_data(f), f->len};
        err[0] = '\0';
        assert_int_equal(tpi_msg_decode(&g, NULL, &d, err, sizeof err), TP_EPROTO);
        assert_string_equal(err, "frame with a bad segment count");
    }
    g.nseg = 2;
    g.seg[0] = (tp_frame_seg){frame_data(f), SIZE_MAX};
    g.seg[1] = (tp_frame_seg){frame_data(f), 2};
    assert_int_equal(tpi_msg_decode(&g, NULL, &d, err, sizeof err), TP_EPROTO);
    assert_string_equal(err, "frame segments overflow");
    g.nseg = TP_FRAME_SEG_MAX; /* the most segments: fine when they add up */
    for (int i = 0; i < TP_FRAME_SEG_MAX; i++)
        g.seg[i] = (tp_frame_seg){frame_data(f) + (i ? f->len : 0), i ? 0 : f->len};
    assert_int_equal(tpi_msg_decode(&g, NULL, &d, err, sizeof err), TP_OK);
    tpi_msg_clear(&d);
    tp_frame_free(f);
}

static void test_codec_header_rejects_bad_fields(void **state) {
    (void)state;
    tpi_msg m = {0};
    m.type = TPI_MSG_RREF_FETCH;
    tp_frame *f = encode_ok(&m, NULL);
    uint8_t good[64];
    memcpy(good, frame_data(f), f->len);
    size_t len = f->len;
    tp_frame_free(f);
    size_t flen;
    uint8_t h[64];
    struct {
        size_t off;
        uint8_t val;
        tp_status st;
        const char *needle;
    } cases[] = {
        {0, 'X', TP_EPROTO, "bad magic"},
        {1, 'X', TP_EPROTO, "bad magic"},
        {2, 'X', TP_EPROTO, "bad magic"},
        {3, 'c', TP_EPROTO, "bad magic"},
        {4, 1, TP_EPROTO, "wire version 1, expected 3"},
        {4, 2, TP_EPROTO, "wire version 2, expected 3"},
        {4, 4, TP_EPROTO, "wire version 4, expected 3"},
        {4, 0, TP_EPROTO, "wire version 0, expected 3"},
        {5, 0, TP_EPROTO, "unknown message type 0"},
        {5, 9, TP_EPROTO, "unknown message type 9"},
        {6, 2, TP_EPROTO, "unknown flags 0x0002"},
        {7, 0x80, TP_EPROTO, "unknown flags 0x8000"},
        {12, 1, TP_EPROTO, "reserved header field"},
        {15, 1, TP_EPROTO, "reserved header field"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(h, good, len);
        h[cases[i].off] = cases[i].val;
        err[0] = '\0';
        assert_int_equal(tp_frame_check_header(h, TPI_MESSAGE_SIZE_MAX, &flen, err, sizeof err),
                         cases[i].st);
        if (!strstr(err, cases[i].needle))
            fail_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].needle);
        tpi_msg d;
        assert_int_equal(decode_bytes(h, len, NULL, &d), cases[i].st);
        assert_non_null(strstr(err, cases[i].needle));
    }
    /* body length over the receiver's max_message_size: EMSGSIZE before reading it */
    memcpy(h, good, len);
    h[8] = 0xff;
    h[9] = 0xff;
    assert_int_equal(tp_frame_check_header(h, 4096, &flen, err, sizeof err), TP_EMSGSIZE);
    assert_string_equal(err, "message of 65559 bytes exceeds the limit of 4096 bytes");
    /* a frame of exactly the limit is taken; one byte over it is not */
    assert_int_equal(tp_frame_check_header(h, 65559, &flen, err, sizeof err), TP_OK);
    assert_int_equal(flen, 65559);
    assert_int_equal(tp_frame_check_header(h, 65558, &flen, err, sizeof err), TP_EMSGSIZE);
    /* the limit is capped at TPI_MESSAGE_SIZE_MAX whatever the caller passes */
    h[11] = 0xff;
    assert_int_equal(tp_frame_check_header(h, UINT64_MAX, &flen, err, sizeof err), TP_EMSGSIZE);
    /* METHOD is only for REQUEST and REMOTE */
    memcpy(h, good, len);
    h[6] = TPI_FLAG_METHOD;
    tpi_msg d;
    assert_int_equal(decode_bytes(h, len, NULL, &d), TP_EPROTO);
    assert_non_null(strstr(err, "flag METHOD on a RREF_FETCH message"));
    /* shorter than a header */
    assert_int_equal(decode_bytes(good, 10, NULL, &d), TP_EPROTO);
    assert_non_null(strstr(err, "shorter than the 24-byte header"));
}

/* FLOW-9: offset 12 of a REQUEST or REMOTE is the caller's window
 * generation, any value, read back as written; encoders write 0. */
static void test_codec_header_window_generation(void **state) {
    (void)state;
    static const uint8_t types[] = {TPI_MSG_REQUEST, TPI_MSG_REMOTE};
    for (size_t i = 0; i < sizeof types; i++) {
        tpi_msg m = {0};
        m.type = types[i];
        snprintf(m.text, sizeof m.text, "f");
        m.rref = (tpi_gid){1, 2};
        tp_frame *f = encode_ok(&m, NULL);
        assert_int_equal(tpi_frame_gen(f), 0);
        tpi_frame_set_gen(f, 0xfedcba98u);
        assert_int_equal(tpi_frame_gen(f), 0xfedcba98u);
        const uint8_t *h = frame_data(f);
        assert_int_equal(h[12], 0x98);
        assert_int_equal(h[15], 0xfe);
        size_t flen;
        assert_int_equal(tp_frame_check_header(h, TPI_MESSAGE_SIZE_MAX, &flen, err, sizeof err),
                         TP_OK);
        tpi_msg d;
        assert_int_equal(decode_bytes(h, f->len, NULL, &d), TP_OK);
        assert_int_equal(d.type, types[i]);
        tpi_msg_clear(&d);
        tp_frame_free(f);
    }
}

/* ---- Hostile input ------------------------------------------------------------------ */

/* A request whose args hold every kind that can travel without hooks. */
static tp_frame *rich_request(void) {
    tpi_msg m = {0};
    m.type = TPI_MSG_REMOTE;
    m.flags = TPI_FLAG_METHOD;
    m.rref = (tpi_gid){1, 2};
    m.fork = (tpi_gid){3, 4};
    m.timeout_ms = 250;
    strcpy(m.text, "step");
    tp_worker_info wi = {.name = "w7", .id = 7};
    int64_t shape[2] = {2, 2};
    int32_t data[4] = {1, -2, 3, -4};
    m.args = tp_value_list_of(9, tp_value_nil(), tp_value_bool(1), tp_value_int(-5),
                              tp_value_float(0.5), tp_value_str("s"), tp_value_bytes("\0b", 2),
                              tp_value_tensor(TP_DTYPE_INT32, 2, shape, NULL, data),
                              tp_value_worker_info(&wi), tp_value_list_of(1, tp_value_map()));
    m.kwargs = tp_value_map();
    tp_map_set(m.kwargs, "k", tp_value_list_of(1, tp_value_int(1)));
    tp_frame *f = encode_ok(&m, NULL);
    tpi_msg_clear(&m);
    return f;
}

static void test_codec_truncated_at_every_offset(void **state) {
    (void)state;
    tp_frame *f = rich_request();
    const uint8_t *p = frame_data(f);
    size_t body = f->len - TP_FRAME_HEADER_SIZE;
    uint8_t *buf = malloc(f->len);
    tpi_msg d;
    for (size_t cut = 0; cut < f->len; cut++) {
        /* the raw prefix: the header promises more than the frame holds */
        assert_int_equal(decode_bytes(p, cut, NULL, &d), TP_EPROTO);
        assert_null(d.args);
    }
    for (size_t cut = 0; cut < body; cut++) {
        /* a consistent header around a cut body: the parser runs out */
        size_t n = make_frame(buf, p[5], TPI_FLAG_METHOD, p + TP_FRAME_HEADER_SIZE, cut);
        tp_status st = decode_bytes(buf, n, NULL, &d);
        if (st != TP_EPROTO)
            fail_msg("body cut at %zu of %zu: %s", cut, body, tp_status_name(st));
        assert_null(d.args);
        assert_null(d.kwargs);
    }
    size_t n = make_frame(buf, p[5], TPI_FLAG_METHOD, p + TP_FRAME_HEADER_SIZE, body);
    assert_int_equal(decode_bytes(buf, n, NULL, &d), TP_OK);
    tpi_msg_clear(&d);
    free(buf);
    tp_frame_free(f);
}

static void test_codec_trailing_bytes_rejected(void **state) {
    (void)state;
    tp_frame *f = rich_request();
    const uint8_t *p = frame_data(f);
    size_t body = f->len - TP_FRAME_HEADER_SIZE;
    uint8_t *buf = calloc(1, f->len + 1);
    tpi_msg d;
    /* inside the body: the header counts the extra byte */
    size_t n = make_frame(buf, p[5], TPI_FLAG_METHOD, p + TP_FRAME_HEADER_SIZE, body);
    buf[n] = 0;
    n = make_frame(buf, p[5], TPI_FLAG_METHOD, buf + TP_FRAME_HEADER_SIZE, body + 1);
    assert_int_equal(decode_bytes(buf, n, NULL, &d), TP_EPROTO);
    assert_non_null(strstr(err, "1 trailing bytes after the body"));
    /* after the frame: more bytes than the header says */
    memcpy(buf, p, f->len);
    assert_int_equal(decode_bytes(buf, f->len + 1, NULL, &d), TP_EPROTO);
    assert_non_null(strstr(err, "trailing"));
    free(buf);
    tp_frame_free(f);
}

static void test_codec_unknown_tag_and_dtype(void **state) {
    (void)state;
    expect_proto((const uint8_t[]){11}, 1, "unknown value tag 11 at offset 28");
    expect_proto((const uint8_t[]){200}, 1, "unknown value tag 200");
    /* tensor: tag, dtype 15 (the first after complex128, WIRE-4) */
    expect_proto((const uint8_t[]){8, 15, 0}, 3, "unknown dtype 15 at offset 29");
    expect_proto((const uint8_t[]){8, 255, 0}, 3, "unknown dtype 255 at offset 29");
    /* unknown tag deep in a list: the offset points at it */
    expect_proto((const uint8_t[]){6, 2, 0, 0, 0, 0, 99}, 7, "unknown value tag 99 at offset 34");
    /* bool other than 0/1 */
    expect_proto((const uint8_t[]){1, 2}, 2, "bool at offset 28 is 2");
}

static void test_codec_lengths_past_end(void **state) {
    (void)state;
    /* str of 10 bytes with 3 present */
    expect_proto((const uint8_t[]){4, 10, 0, 0, 0, 'a', 'b', 'c'}, 8, "truncated at offset 33");
    /* list of 5 items with 1 byte left */
    expect_proto((const uint8_t[]){6, 5, 0, 0, 0, 0}, 6, "cannot fit in the 1 bytes left");
    /* map of 2 entries: each needs at least 5 bytes */
    expect_proto((const uint8_t[]){7, 2, 0, 0, 0, 0, 0, 0, 0, 0}, 10, "cannot fit");
    /* worker info name past the end */
    expect_proto((const uint8_t[]){10, 1, 0, 0, 0, 5, 0, 0, 0, 'w'}, 10, "truncated");
}

static void test_codec_huge_length_prefix_not_allocated(void **state) {
    (void)state;
    /* Each is refused by the length check that runs before any allocation:
     * the messages come from those checks, not from an allocation failure. */
    expect_proto((const uint8_t[]){4, 0xff, 0xff, 0xff, 0x7f}, 5, "truncated at offset 33");
    expect_proto((const uint8_t[]){4, 0xff, 0xff, 0xff, 0xff}, 5,
                 "string of 4294967295 bytes at offset 29 exceeds the limit of 2147483647");
    expect_proto((const uint8_t[]){5, 0xff, 0xff, 0xff, 0x7f}, 5, "truncated at offset 33");
    expect_proto((const uint8_t[]){6, 0xff, 0xff, 0xff, 0xff}, 5,
                 "list of 4294967295 items at offset 28 exceeds the limit of 16777216");
    expect_proto((const uint8_t[]){6, 0, 0, 0, 1}, 5,
                 "list of 16777216 items at offset 28 cannot "
                 "fit in the 0 bytes left");
    expect_proto((const uint8_t[]){7, 0, 0, 0, 1}, 5, "map of 16777216 items");
    /* a tensor claiming 2^40 float64 elements and as many bytes */
    uint8_t t[2 + 8 + 8 + 8] = {8, TP_DTYPE_FLOAT64, 1};
    uint64_t dim = (uint64_t)1 << 40, nbytes = dim * 8;
    for (int i = 0; i < 8; i++) {
        t[3 + i] = (uint8_t)(dim >> (8 * i));
        t[11 + i] = (uint8_t)(nbytes >> (8 * i));
    }
    expect_proto(t, 19, "tensor data of 8796093022208 bytes at offset 47 runs past the end");
    /* dimensions whose product overflows */
    uint8_t o[3 + 16 + 8] = {8, TP_DTYPE_UINT8, 2};
    memset(o + 3, 0xff, 16);
    o[10] = 0x3f;
    o[18] = 0x3f;
    expect_proto(o, sizeof o, "tensor shape at offset 31 is too large");
}

static void test_codec_tensor_shape_and_nbytes_checked(void **state) {
    (void)state;
    /* int16 [3]: needs 6 bytes; the count says 7 */
    uint8_t t[3 + 8 + 8 + 7] = {8, TP_DTYPE_INT16, 1, 3};
    t[11] = 7;
    expect_proto(t, sizeof t,
                 "its shape and dtype need 6 bytes, the byte count at offset 39 "
                 "says 7");
    t[11] = 6;
    tpi_msg m;
    assert_int_equal(decode_value_bytes(t, sizeof t - 1, &m), TP_OK);
    assert_int_equal(tp_tensor_numel(m.value), 3);
    tpi_msg_clear(&m);
    /* 17 dimensions */
    expect_proto((const uint8_t[]){8, TP_DTYPE_INT8, 17}, 3, "has 17 dimensions; the limit is 16");
    /* a negative dimension */
    uint8_t n[3 + 8 + 8] = {8, TP_DTYPE_INT8, 1};
    memset(n + 3, 0xff, 8);
    expect_proto(n, sizeof n, "tensor dimension 0 at offset 31 is negative");
}

static void test_codec_depth_bomb_and_limit(void **state) {
    (void)state;
    /* 100000 nested one-item lists: refused at depth 64, no deep recursion */
    size_t levels = 100000;
    uint8_t *bomb = malloc(levels * 5 + 1);
    for (size_t i = 0; i < levels; i++) {
        uint8_t one[5] = {6, 1, 0, 0, 0};
        memcpy(bomb + i * 5, one, 5);
    }
    bomb[levels * 5] = 0;
    uint8_t *body = malloc(levels * 5 + 5);
    memset(body, 0, 4);
    memcpy(body + 4, bomb, levels * 5 + 1);
    uint8_t *frame = malloc(levels * 5 + 5 + TP_FRAME_HEADER_SIZE);
    size_t n = make_frame(frame, TPI_MSG_RESPONSE, 0, body, levels * 5 + 5);
    tpi_msg m;
    assert_int_equal(decode_bytes(frame, n, NULL, &m), TP_EPROTO);
    assert_non_null(strstr(err, "nested deeper than 64 levels at offset 348"));
    free(frame);
    free(body);
    free(bomb);
    /* maps count as well: 65 maps, each the value of the one before under
     * the key "" (9 bytes a level), refused where the 65th begins */
    uint8_t maps[65 * 9 + 1];
    for (int i = 0; i < 65; i++) {
        const uint8_t one[9] = {7, 1, 0, 0, 0, 0, 0, 0, 0};
        memcpy(maps + i * 9, one, 9);
    }
    maps[65 * 9] = 0;
    expect_proto(maps, sizeof maps, "nested deeper than 64 levels at offset 604");
    /* exactly 64 levels travel; a 65th cannot even be built (VALUE-4: refused
     * with TP_ELIMIT, the item left with the caller), so none is encoded */
    tp_value *v = tp_value_nil();
    for (int i = 0; i < TPI_VALUE_DEPTH_MAX; i++)
        v = tp_value_list_of(1, v);
    assert_non_null(v);
    tp_value *back = roundtrip(v);
    assert_true(tp_value_equal(v, back));
    tp_value_free(back);
    tp_value *deeper = tp_value_map();
    assert_int_equal(tp_map_set(deeper, "x", v), TP_ELIMIT);
    assert_non_null(strstr(tp_errmsg(), "nest deeper than 64 levels"));
    assert_null(tp_value_list_of(1, tp_value_list_of(1, tp_value_clone(v))));
    tp_value_free(deeper);
    tp_value_free(v);
}

static void test_codec_map_keys_checked(void **state) {
    (void)state;
    /* a duplicate key */
    expect_proto((const uint8_t[]){7, 2, 0, 0, 0, 1, 0, 0, 0, 'a', 0, 1, 0, 0, 0, 'a', 0}, 17,
                 "map at offset 28 has the key 'a' twice");
    /* a key with a NUL inside */
    expect_proto((const uint8_t[]){7, 1, 0, 0, 0, 2, 0, 0, 0, 'a', 0, 0}, 12,
                 "map key at offset 33 holds a NUL byte");
    /* many distinct keys are fine (the duplicate check sorts, it does not scan) */
    tp_value *m = tp_value_map();
    char key[16];
    for (int i = 0; i < 3000; i++) {
        snprintf(key, sizeof key, "key%d", i);
        tp_map_set(m, key, tp_value_int(i));
    }
    assert_roundtrip(m);
}

static void test_codec_names_checked(void **state) {
    (void)state;
    tpi_msg m = {0};
    m.type = TPI_MSG_REQUEST;
    memset(m.text, 'n', TP_NAME_LEN_MAX + 1);
    tp_frame *f = NULL;
    assert_int_equal(tpi_msg_encode(&m, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err),
                     TP_EINVAL);
    assert_non_null(strstr(err, "function name of 128 bytes"));
    m.text[0] = '\0';
    assert_int_equal(tpi_msg_encode(&m, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err),
                     TP_EINVAL);
    /* the longest name travels */
    memset(m.text, 'n', TP_NAME_LEN_MAX);
    m.text[TP_NAME_LEN_MAX] = '\0';
    f = encode_ok(&m, NULL);
    tpi_msg d;
    assert_int_equal(tpi_msg_decode(f, NULL, &d, err, sizeof err), TP_OK);
    assert_int_equal(strlen(d.text), TP_NAME_LEN_MAX);
    tpi_msg_clear(&d);
    tp_frame_free(f);
    /* crafted: a 128-byte name, an empty one, one with a NUL */
    uint8_t body[4 + 4 + 128 + 10] = {0};
    body[4] = 128;
    memset(body + 8, 'n', 128);
    uint8_t frame[sizeof body + TP_FRAME_HEADER_SIZE];
    size_t n = make_frame(frame, TPI_MSG_REQUEST, 0, body, sizeof body);
    assert_int_equal(decode_bytes(frame, n, NULL, &d), TP_EPROTO);
    assert_non_null(strstr(err, "string of 128 bytes at offset 28 exceeds the limit of 127"));
    const uint8_t empty[] = {0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 7, 0, 0, 0, 0};
    n = make_frame(frame, TPI_MSG_REQUEST, 0, empty, sizeof empty);
    assert_int_equal(decode_bytes(frame, n, NULL, &d), TP_EPROTO);
    assert_non_null(strstr(err, "empty function name at offset 28"));
    const uint8_t nul[] = {0, 0, 0, 0, 2, 0, 0, 0, 'f', 0, 6, 0, 0, 0, 0, 7, 0, 0, 0, 0};
    n = make_frame(frame, TPI_MSG_REQUEST, 0, nul, sizeof nul);
    assert_int_equal(decode_bytes(frame, n, NULL, &d), TP_EPROTO);
    assert_non_null(strstr(err, "function name at offset 28 holds a NUL byte"));
    /* args must be a list, kwargs a map */
    const uint8_t bad_args[] = {0, 0, 0, 0, 1, 0, 0, 0, 'f', 7, 0, 0, 0, 0, 7, 0, 0, 0, 0};
    n = make_frame(frame, TPI_MSG_REQUEST, 0, bad_args, sizeof bad_args);
    assert_int_equal(decode_bytes(frame, n, NULL, &d), TP_EPROTO);
    assert_non_null(strstr(err, "args at offset 33 must be a list, got map"));
    m.text[0] = 'f';
    m.text[1] = '\0';
    m.args = tp_value_map();
    assert_int_equal(tpi_msg_encode(&m, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err), TP_ETYPE);
    assert_string_equal(err, "args must be a list, got map");
    tpi_msg_clear(&m);
}

static void test_codec_response_text_and_status_checked(void **state) {
    (void)state;
    uint8_t body[4 + 4 + 1024] = {TP_EREMOTE};
    body[4] = 0x00;
    body[5] = 0x04; /* 1024 bytes */
    memset(body + 8, 'e', 1024);
    uint8_t frame[sizeof body + TP_FRAME_HEADER_SIZE];
    size_t n = make_frame(frame, TPI_MSG_RESPONSE, 0, body, sizeof body);
    tpi_msg d;
    assert_int_equal(decode_bytes(frame, n, NULL, &d), TP_EPROTO);
    assert_non_null(strstr(err, "string of 1024 bytes at offset 28 exceeds the limit of 1023"));
    const uint8_t unknown[] = {200, 0, 0, 0, 0, 0, 0, 0};
    n = make_frame(frame, TPI_MSG_RESPONSE, 0, unknown, sizeof unknown);
    assert_int_equal(decode_bytes(frame, n, NULL, &d), TP_EPROTO);
    assert_non_null(strstr(err, "unknown status 200 at offset 24"));
    /* A header and no body: cut short where the status would begin. */
    n = make_frame(frame, TPI_MSG_RESPONSE, 0, NULL, 0);
    assert_int_equal(n, TP_FRAME_HEADER_SIZE);
    assert_int_equal(decode_bytes(frame, n, NULL, &d), TP_EPROTO);
    assert_non_null(strstr(err, "truncated at offset 24"));
    /* The bound exactly: the last status is one, TP_STATUS_COUNT_ is not. */
    uint8_t last[] = {TP_STATUS_COUNT_ - 1, 0, 0, 0, 0, 0, 0, 0};
    n = make_frame(frame, TPI_MSG_RESPONSE, 0, last, sizeof last);
    assert_int_equal(decode_bytes(frame, n, NULL, &d), TP_OK);
    assert_int_equal(d.status, TP_STATUS_COUNT_ - 1);
    tpi_msg_clear(&d);
    last[0] = TP_STATUS_COUNT_;
    n = make_frame(frame, TPI_MSG_RESPONSE, 0, last, sizeof last);
    assert_int_equal(decode_bytes(frame, n, NULL, &d), TP_EPROTO);
    char want[64];
    snprintf(want, sizeof want, "unknown status %d at offset 24", TP_STATUS_COUNT_);
    assert_non_null(strstr(err, want));
    tpi_msg m = {0};
    m.type = TPI_MSG_RESPONSE;
    m.status = TP_STATUS_COUNT_;
    tp_frame *f = NULL;
    assert_int_equal(tpi_msg_encode(&m, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err),
                     TP_EINVAL);
    m.status = TP_OK;
    m.type = 9;
    assert_int_equal(tpi_msg_encode(&m, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err),
                     TP_EINVAL);
    m.type = TPI_MSG_RESPONSE;
    m.flags = TPI_FLAG_METHOD;
    assert_int_equal(tpi_msg_encode(&m, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err),
                     TP_EINVAL);
    assert_null(f);
    assert_non_null(strstr(err, "flag METHOD on a RESPONSE message"));
    m.type = TPI_MSG_TYPE_MAX_; /* the last type is named too */
    assert_int_equal(tpi_msg_encode(&m, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err),
                     TP_EINVAL);
    assert_non_null(strstr(err, "flag METHOD on a RREF_ABANDON message"));
    assert_null(f);
}

static void test_codec_oversized_message_refused(void **state) {
    (void)state;
    static uint8_t blob[5000];
    tpi_msg m = {0};
    m.type = TPI_MSG_RESPONSE;
    m.value = tp_value_bytes(blob, sizeof blob);
    tp_frame *f = NULL;
    assert_int_equal(tpi_msg_encode(&m, NULL, 4096, &f, err, sizeof err), TP_EMSGSIZE);
    assert_null(f);
    assert_string_equal(err, "a RESPONSE message of 5033 bytes exceeds the limit of 4096 bytes");
    /* exactly at the limit is fine */
    assert_int_equal(tpi_msg_encode(&m, NULL, 5033, &f, err, sizeof err), TP_OK);
    assert_int_equal(f->len, 5033);
    tp_frame_free(f);
    /* and the receiver refuses it by its header alone */
    assert_int_equal(tpi_msg_encode(&m, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err), TP_OK);
    size_t flen;
    assert_int_equal(tp_frame_check_header(frame_data(f), 4096, &flen, err, sizeof err),
                     TP_EMSGSIZE);
    assert_string_equal(err, "message of 5033 bytes exceeds the limit of 4096 bytes");
    tp_frame_free(f);
    tpi_msg_clear(&m);
}

static void test_codec_objects_and_bare_rrefs_cannot_be_sent(void **state) {
    (void)state;
    tpi_msg m = {0};
    m.type = TPI_MSG_REQUEST;
    strcpy(m.text, "f");
    m.args = tp_value_list_of(1, tp_value_object("Net", NULL, NULL));
    tp_frame *f = NULL;
    assert_int_equal(tpi_msg_encode(&m, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err), TP_ETYPE);
    assert_null(f);
    assert_non_null(strstr(err, "objects cannot be sent; hold them in an rref"));
    tpi_wbuf b;
    tpi_wbuf_init(&b, 1024);
    assert_string_equal(err,
                        "objects cannot be sent; hold them in an rref (an object of class 'Net')");
    assert_int_equal(tpi_value_encode(&b, m.args, NULL), TP_ETYPE);
    assert_non_null(strstr(tp_errmsg(), "objects cannot be sent; hold them in an rref"));
    /* refused while sizing: the buffer's failure is sticky all the same */
    assert_int_equal(b.status, TP_ETYPE);
    tpi_wbuf_u8(&b, 1);
    assert_int_equal(b.len, 0);
    tpi_wbuf_free(&b);
    tpi_msg_clear(&m);
    /* an rref tag with no hooks to receive it */
    uint8_t r[1 + 36] = {9};
    expect_proto(r, sizeof r, "rref at offset 28 cannot be received here");
}

/* ---- RRef hooks ------------------------------------------------------------------------ */

typedef struct hook_state {
    int encodes;
    int decodes;
    tp_status fail_with;
    fake_rref made;
} hook_state;

static tp_status enc_hook(void *ctx, tp_rref *rref, tpi_rref_wire *w) {
    hook_state *h = ctx;
    h->encodes++;
    if (h->fail_with != TP_OK)
        return tpi_fail(h->fail_with, "rref owner is shutting down");
    (void)rref;
    w->owner = 1;
    w->rref_id = (tpi_gid){1, 100};
    w->fork_id = (tpi_gid){2, 200 + (uint64_t)h->encodes};
    w->parent = 2;
    return TP_OK;
}

static tp_status dec_hook(void *ctx, const tpi_rref_wire *w, tp_rref **out) {
    hook_state *h = ctx;
    h->decodes++;
    if (h->fail_with != TP_OK)
        return tpi_fail(h->fail_with, "owner %u is not a worker", (unsigned)w->owner);
    h->made.refs++;
    h->made.wire = *w;
    *out = (tp_rref *)(void *)&h->made;
    return TP_OK;
}

static void test_codec_rref_hooks_roundtrip(void **state) {
    (void)state;
    fake_rref mine = {.refs = 1};
    hook_state h = {0};
    tpi_codec_hooks hooks = {&h, enc_hook, dec_hook};
    tpi_msg m = {0};
    m.type = TPI_MSG_REQUEST;
    strcpy(m.text, "use");
    m.args = tp_value_list_of(2, tp_value_rref((tp_rref *)(void *)&mine),
                              tp_value_rref((tp_rref *)(void *)&mine));
    assert_int_equal(mine.refs, 3);
    tp_frame *f = encode_ok(&m, &hooks);
    assert_int_equal(h.encodes, 2); /* once per rref in the value */
    tpi_msg d;
    assert_int_equal(tpi_msg_decode(f, &hooks, &d, err, sizeof err), TP_OK);
    assert_int_equal(h.decodes, 2);
    assert_int_equal(h.made.refs, 2); /* the decoded values own the hook's references */
    assert_true(h.made.wire.owner == 1 && h.made.wire.rref_id.local == 100);
    assert_true(h.made.wire.fork_id.local == 202 && h.made.wire.parent == 2);
    tp_rref *got;
    assert_int_equal(tp_value_get_rref(tp_list_get(d.args, 0), &got), TP_OK);
    assert_ptr_equal(got, &h.made);
    tpi_msg_clear(&d);
    assert_int_equal(h.made.refs, 0);
    /* a message that fails later releases what the hook made */
    tp_frame *g = tp_frame_alloc(f->len);
    memcpy(tp_frame_bytes(g), frame_data(f), f->len);
    tp_frame_bytes(g)[f->len - 5] = 9; /* kwargs' tag: a map becomes an rref */
    assert_int_equal(tpi_msg_decode(g, &hooks, &d, err, sizeof err), TP_EPROTO);
    assert_int_equal(h.made.refs, 0);
    tp_frame_free(g);
    /* a decode that runs out of memory, at each allocation in turn, releases
     * what the hook made (the value adopting it included) */
    for (long k = 1; alloc_fault_in_use(); k++) {
        atomic_store(&alloc_countdown_fired, 0);
        atomic_store(&alloc_countdown, k);
        tp_status st = tpi_msg_decode(f, &hooks, &d, err, sizeof err);
        atomic_store(&alloc_countdown, 0);
        if (!atomic_load(&alloc_countdown_fired)) {
            assert_int_equal(st, TP_OK);
            tpi_msg_clear(&d);
            break;
        }
        assert_int_equal(st, TP_ENOMEM);
        assert_int_equal(h.made.refs, 0);
        assert_true(k < 64);
    }
    assert_int_equal(h.made.refs, 0);
    tp_frame_free(f);
    /* no hooks: an rref cannot be sent */
    assert_int_equal(tpi_msg_encode(&m, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err), TP_ETYPE);
    assert_non_null(strstr(err, "rref"));
    /* a message over max_size fails before any rref is forked */
    h.encodes = 0;
    tp_list_append(m.args, tp_value_bytes(NULL, 0));
    assert_int_equal(tpi_msg_encode(&m, &hooks, 30, &f, err, sizeof err), TP_EMSGSIZE);
    assert_int_equal(h.encodes, 0);
    tpi_msg_clear(&m);
    assert_int_equal(mine.refs, 1);
}

static void test_codec_rref_hook_failure_reported(void **state) {
    (void)state;
    hook_state h = {0};
    h.fail_with = TP_EUNKNOWNWORKER;
    tpi_codec_hooks hooks = {&h, enc_hook, dec_hook};
    tpi_fail(TP_ETIMEDOUT, "an earlier failure");
    uint8_t r[1 + 36] = {9, 7};
    tpi_msg d;
    assert_int_equal(decode_value_bytes(r, sizeof r, &d), TP_EPROTO); /* no hooks there */
    /* with hooks, through a hand-made frame */
    uint8_t body[4 + sizeof r] = {0};
    memcpy(body + 4, r, sizeof r);
    uint8_t frame[sizeof body + TP_FRAME_HEADER_SIZE];
    size_t n = make_frame(frame, TPI_MSG_RESPONSE, 0, body, sizeof body);
    assert_int_equal(decode_bytes(frame, n, &hooks, &d), TP_EUNKNOWNWORKER);
    assert_string_equal(err, "rref at offset 28: owner 7 is not a worker");
    assert_string_equal(tp_errmsg(), "an earlier failure"); /* restored */
    fake_rref mine = {.refs = 1};
    tpi_msg m = {0};
    m.type = TPI_MSG_RESPONSE;
    m.value = tp_value_rref((tp_rref *)(void *)&mine);
    tp_frame *f = NULL;
    assert_int_equal(tpi_msg_encode(&m, &hooks, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err),
                     TP_EUNKNOWNWORKER);
    assert_null(f);
    assert_string_equal(err, "sending an rref: rref owner is shutting down");
    /* tpi_value_encode into a buffer: the hook's failure is the buffer's
     * status from then on (sticky, as codec.h says of every failure), so the
     * half-written value is never taken for a whole one. */
    tpi_wbuf b;
    tpi_wbuf_init(&b, 1024);
    tpi_wbuf_u8(&b, 7);
    assert_int_equal(tpi_value_encode(&b, m.value, &hooks), TP_EUNKNOWNWORKER);
    assert_string_equal(tp_errmsg(), "sending an rref: rref owner is shutting down");
    assert_int_equal(b.status, TP_EUNKNOWNWORKER);
    size_t len = b.len;
    tpi_wbuf_u8(&b, 1); /* a no-op after the failure */
    assert_int_equal(b.len, len);
    tp_value *two = tp_value_int(2);
    assert_int_equal(tpi_value_encode(&b, two, NULL), TP_EUNKNOWNWORKER);
    assert_non_null(strstr(tp_errmsg(), "the buffer failed before"));
    assert_int_equal(b.len, len);
    tp_value_free(two);
    tpi_wbuf_free(&b);
    tpi_msg_clear(&m);
    assert_int_equal(mine.refs, 1);
}

/* WIRE-8: a frame of tiny values cannot make the decoder allocate without
 * bound: past TPI_VALUES_PER_MESSAGE_MAX values decoding stops with a limit
 * error, while exactly the limit still decodes. */
static void test_codec_values_per_message_limit(void **state) {
    (void)state;
    for (int over = 0; over <= 1; over++) {
        uint32_t count = TPI_VALUES_PER_MESSAGE_MAX - 1 + (uint32_t)over; /* + the list itself */
        size_t len = 5 + (size_t)count;
        uint8_t *buf = calloc(1, len); /* tag 0 (nil) for every item */
        assert_non_null(buf);
        buf[0] = TP_KIND_LIST;
        buf[1] = (uint8_t)count;
        buf[2] = (uint8_t)(count >> 8);
        buf[3] = (uint8_t)(count >> 16);
        buf[4] = (uint8_t)(count >> 24);
        tpi_rbuf r;
        tpi_rbuf_init(&r, buf, len);
        tp_value *v = NULL;
        tp_status st = tpi_value_decode(&r, NULL, &v);
        if (over) {
            assert_int_equal(st, TP_ELIMIT);
            assert_null(v);
            assert_non_null(strstr(r.errmsg, "limit"));
        } else {
            assert_int_equal(st, TP_OK);
            assert_int_equal(tp_list_len(v), count);
            tp_value_free(v);
        }
        free(buf);
    }
}

/* ---- Zero copy (WIRE-10) ------------------------------------------------------- */

#define ZC_ELEMS ((int64_t)(TPI_ZERO_COPY_MIN / 4) * 2) /* 128 KiB of float32 */

static tp_value *zc_tensor(tp_dtype dtype, int64_t numel, unsigned seed) {
    size_t n = (size_t)numel * tp_dtype_size(dtype);
    uint8_t *data = malloc(n);
    assert_non_null(data);
    for (size_t i = 0; i < n; i++)
        data[i] = (uint8_t)(i * 31u + seed);
    if (dtype == TP_DTYPE_BOOL)
        for (size_t i = 0; i < n; i++)
            data[i] &= 1;
    tp_value *t = tp_value_tensor(dtype, 1, &numel, NULL, data);
    free(data);
    assert_non_null(t);
    return t;
}

static tp_frame *zc_encode(const tpi_msg *m) {
    tp_frame *f = NULL;
    tp_status st = tpi_msg_encode(m, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err);
    if (st != TP_OK)
        fail_msg("encode failed: %s: %s", tp_status_name(st), err);
    return f;
}

/* The bytes a RESPONSE carrying a 1-d tensor must have, built by hand (WIRE-4). */
static uint8_t *zc_expected_response(const tp_value *t, size_t *len) {
    uint64_t nbytes = (uint64_t)tp_tensor_numel(t) * tp_dtype_size(tp_tensor_dtype(t));
    size_t body = 4 + 1 + 2 + 8 + 8 + (size_t)nbytes;
    uint8_t *p = calloc(1, TP_FRAME_HEADER_SIZE + body);
    uint8_t *zeros = calloc(1, body);
    assert_non_null(p);
    assert_non_null(zeros);
    make_frame(p, TPI_MSG_RESPONSE, 0, zeros, body);
    free(zeros);
    p[16] = 9; /* id 9 */
    uint8_t *q = p + TP_FRAME_HEADER_SIZE + 4; /* status 0 */
    *q++ = TP_KIND_TENSOR;
    *q++ = (uint8_t)tp_tensor_dtype(t);
    *q++ = 1;
    for (int i = 0; i < 8; i++)
        *q++ = (uint8_t)((uint64_t)tp_tensor_numel(t) >> (8 * i));
    for (int i = 0; i < 8; i++)
        *q++ = (uint8_t)(nbytes >> (8 * i));
    memcpy(q, tp_tensor_cdata(t), (size_t)nbytes);
    *len = TP_FRAME_HEADER_SIZE + body;
    return p;
}

static void test_codec_zero_copy_send_borrows_tensor_memory(void **state) {
    (void)state;
    tp_value *t = zc_tensor(TP_DTYPE_FLOAT32, ZC_ELEMS, 1);
    size_t want_len;
    uint8_t *want = zc_expected_response(t, &want_len);
    const void *mem = tp_tensor_cdata(t);

    tpi_msg m = {0};
    m.type = TPI_MSG_RESPONSE;
    m.id = 9;
    m.value = t;
    tp_frame *f = zc_encode(&m);
    /* The header and tensor header in the frame's own bytes, then the
     * tensor's data where it lies: nothing follows it in a RESPONSE. */
    assert_int_equal(f->nseg, 2);
    assert_int_equal(f->len, want_len);
    assert_int_equal(f->seg[0].len, want_len - (size_t)ZC_ELEMS * 4);
    assert_ptr_equal(f->seg[1].base, mem);
    assert_int_equal(f->seg[1].len, (size_t)ZC_ELEMS * 4);

    /* A write after the call copies first: the frame still sends the old bytes. */
    float *w = tp_tensor_data(t);
    assert_non_null(w);
    assert_ptr_not_equal(w, mem);
    w[0] = 12345.0f;

    /* The caller frees the value before the transport writes: the frame
     * holds the storage (ASan would see a use after free otherwise). */
    tp_value_free(t);
    tp_frame *flat = tp_frame_flatten(f);
    assert_non_null(flat);
    assert_int_equal(flat->len, want_len);
    assert_memory_equal(tp_frame_bytes(flat), want, want_len); /* byte-identical (WIRE-7) */
    tp_frame_free(f);
    tp_frame_free(flat);
    free(want);
}

/* VALUE-10: the caller's own memory, handed back exactly once when the
 * value and the frame that sends it are both gone. */
static int borrow_released;
static void borrow_release(void *ctx) {
    borrow_released++;
    free(ctx);
}

static void test_codec_zero_copy_send_borrowed_tensor(void **state) {
    (void)state;
    float *mem = malloc((size_t)ZC_ELEMS * 4);
    assert_non_null(mem);
    for (int64_t i = 0; i < ZC_ELEMS; i++)
        mem[i] = (float)i;
    int64_t shape[1] = {ZC_ELEMS};
    borrow_released = 0;
    tp_value *t = tp_value_tensor_borrow(TP_DTYPE_FLOAT32, 1, shape, mem, borrow_release, mem);
    assert_non_null(t);
    assert_ptr_equal(tp_tensor_cdata(t), mem);
    assert_ptr_equal(tp_tensor_data(t), mem); /* nobody shares it yet: no copy */
    assert_int_equal(tp_tensor_numel(t), ZC_ELEMS);
    tp_value *copy = tp_value_clone(t);
    assert_non_null(copy);
    assert_ptr_not_equal(tp_tensor_cdata(copy), mem);
    assert_true(tp_value_equal(copy, t));

    tpi_msg m = {0};
    m.type = TPI_MSG_RESPONSE;
    m.value = t;
    tp_frame *f = zc_encode(&m);
    assert_int_equal(f->nseg, 2);
    assert_ptr_equal(f->seg[1].base, mem); /* sent from the caller's memory */
    tp_value_free(t);
    assert_int_equal(borrow_released, 0); /* the frame still reads it */
    tpi_msg d;
    tp_frame *flat = tp_frame_flatten(f);
    assert_non_null(flat);
    assert_int_equal(tpi_msg_decode(flat, NULL, &d, err, sizeof err), TP_OK);
    assert_true(tp_value_equal(d.value, copy));
    tpi_msg_clear(&d);
    tp_frame_free(flat);
    tp_frame_free(f);
    assert_int_equal(borrow_released, 1);
    tp_value_free(copy);

    /* Refused: no memory, misaligned memory, no callback, a bad shape. */
    uint64_t words[2] = {0, 0};
    int64_t two[1] = {2}, neg[1] = {-1};
    assert_null(tp_value_tensor_borrow(TP_DTYPE_FLOAT32, 1, two, NULL, borrow_release, NULL));
    assert_null(tp_value_tensor_borrow(TP_DTYPE_FLOAT32, 1, two, (uint8_t *)words + 1,
                                       borrow_release, NULL));
    assert_null(tp_value_tensor_borrow(TP_DTYPE_FLOAT32, 1, two, words, NULL, NULL));
    assert_null(tp_value_tensor_borrow(TP_DTYPE_FLOAT32, 1, neg, words, borrow_release, NULL));
    assert_null(tp_value_tensor_borrow((tp_dtype)99, 1, two, words, borrow_release, NULL));
    assert_int_equal(borrow_released, 1);

    /* spec: VALUE-10: complex128 needs 8-byte alignment (one component), as
     * numpy gives it, not its 16-byte size; 4 is not enough. */
    _Alignas(16) uint64_t cwords[5] = {0};
    int64_t one[1] = {1};
    tp_value *c = tp_value_tensor_borrow(TP_DTYPE_COMPLEX128, 1, one, cwords + 1, borrow_release,
                                         NULL);
    assert_non_null(c);
    tp_value_free(c);
    assert_int_equal(borrow_released, 2);
    assert_null(tp_value_tensor_borrow(TP_DTYPE_COMPLEX128, 1, one, (uint8_t *)cwords + 4,
                                       borrow_release, NULL));
    assert_non_null(c = tp_value_tensor_borrow(TP_DTYPE_COMPLEX64, 1, one, (uint8_t *)cwords + 4,
                                               borrow_release, NULL));
    tp_value_free(c);
    assert_int_equal(borrow_released, 3);
}

static void test_codec_zero_copy_send_limits(void **state) {
    (void)state;
    /* Small and strided tensors are copied: one segment. */
    int64_t small = (int64_t)(TPI_ZERO_COPY_MIN / 4) - 1;
    tp_value *s = zc_tensor(TP_DTYPE_FLOAT32, small, 2);
    tpi_msg m = {0};
    m.type = TPI_MSG_RESPONSE;
    m.value = s;
    tp_frame *f = zc_encode(&m);
    assert_int_equal(f->nseg, 1);
    tp_frame_free(f);
    tp_value_free(s);

    int64_t shape[2] = {256, 128}, strides[2] = {1, 256};
    float *data = calloc(256 * 128, sizeof *data);
    assert_non_null(data);
    for (int i = 0; i < 256 * 128; i++)
        data[i] = (float)i;
    tp_value *st = tp_value_tensor(TP_DTYPE_FLOAT32, 2, shape, strides, data);
    free(data);
    assert_non_null(st);
    m.value = st;
    f = zc_encode(&m);
    assert_int_equal(f->nseg, 1);
    tpi_msg d;
    assert_int_equal(tpi_msg_decode(f, NULL, &d, err, sizeof err), TP_OK);
    assert_true(tp_value_equal(d.value, st)); /* packed on the way (WIRE-4) */
    tpi_msg_clear(&d);
    tp_frame_free(f);
    tp_value_free(st);

    /* At most TPI_ZERO_COPY_TENSORS_MAX shared tensors; later ones copied. */
    tp_value *list = tp_value_list();
    const void *mem[TPI_ZERO_COPY_TENSORS_MAX + 1];
    for (int i = 0; i <= TPI_ZERO_COPY_TENSORS_MAX; i++) {
        tp_value *t = zc_tensor(TP_DTYPE_INT32, ZC_ELEMS, (unsigned)i);
        mem[i] = tp_tensor_cdata(t);
        assert_int_equal(tp_list_append(list, t), TP_OK);
    }
    m.type = TPI_MSG_REQUEST;
    strcpy(m.text, "f");
    m.value = NULL;
    m.args = list;
    f = zc_encode(&m);
    assert_true(f->nseg <= TP_FRAME_SEG_MAX);
    assert_int_equal(f->nseg, 2 * TPI_ZERO_COPY_TENSORS_MAX + 1);
    for (int i = 0; i < TPI_ZERO_COPY_TENSORS_MAX; i++) {
        assert_ptr_equal(f->seg[2 * i + 1].base, mem[i]);
        assert_int_equal(f->seg[2 * i + 1].len, (size_t)ZC_ELEMS * 4);
    }
    for (int i = 0; i < f->nseg; i++)
        assert_ptr_not_equal(f->seg[i].base, mem[TPI_ZERO_COPY_TENSORS_MAX]);
    /* The bytes are those of a flat encoding: decode, re-encode, compare. */
    tp_frame *flat = tp_frame_flatten(f);
    assert_int_equal(tpi_msg_decode(flat, NULL, &d, err, sizeof err), TP_OK);
    assert_true(tp_value_equal(d.args, list));
    tp_value_free(list);
    tp_frame *again = zc_encode(&d);
    tp_frame *flat2 = tp_frame_flatten(again);
    assert_int_equal(flat2->len, flat->len);
    assert_memory_equal(tp_frame_bytes(flat2), tp_frame_bytes(flat), flat->len);
    tpi_msg_clear(&d);
    tp_frame_free(again);
    tp_frame_free(flat2);
    tp_frame_free(flat);
    tp_frame_free(f); /* after the values: it held their storage */

    /* tpi_value_encode writes a flat buffer: always a copy. */
    tp_value *t = zc_tensor(TP_DTYPE_FLOAT32, ZC_ELEMS, 3);
    tpi_wbuf b;
    tpi_wbuf_init(&b, 1 << 20);
    assert_int_equal(tpi_value_encode(&b, t, NULL), TP_OK);
    assert_int_equal(b.len, 1 + 2 + 8 + 8 + (size_t)ZC_ELEMS * 4);
    assert_memory_equal(b.data + 19, tp_tensor_cdata(t), (size_t)ZC_ELEMS * 4);
    tpi_wbuf_free(&b);
    tp_value_free(t);
}

static int inside(const void *p, size_t n, const tp_frame *f) {
    const uint8_t *lo = f->seg[0].base;
    return (const uint8_t *)p >= lo && (const uint8_t *)p + n <= lo + f->len;
}

static void test_codec_zero_copy_receive_views_frame(void **state) {
    (void)state;
    static const tp_dtype dtypes[] = {TP_DTYPE_UINT8,     TP_DTYPE_FLOAT32,   TP_DTYPE_FLOAT64,
                                      TP_DTYPE_INT16,     TP_DTYPE_UINT32,    TP_DTYPE_COMPLEX64,
                                      TP_DTYPE_COMPLEX128};
    for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++) {
        int64_t numel = (int64_t)TPI_ZERO_COPY_MIN; /* past the threshold for any dtype */
        tp_value *t = zc_tensor(dtypes[k], numel, (unsigned)k);
        size_t elem = tp_dtype_size(dtypes[k]), nbytes = (size_t)numel * elem;
        size_t len;
        uint8_t *bytes = zc_expected_response(t, &len);
        tp_frame *f = tp_frame_alloc(len);
        assert_non_null(f);
        memcpy(tp_frame_bytes(f), bytes, len);
        /* The data lies at offset 47: aligned only for 1-byte elements. */
        const uint8_t *at = tp_frame_bytes(f) + 47;

        /* The copying decoder leaves the frame alone and copies. */
        tpi_msg d;
        assert_int_equal(tpi_msg_decode(f, NULL, &d, err, sizeof err), TP_OK);
        assert_false(inside(tp_tensor_cdata(d.value), 1, f));
        assert_memory_equal(tp_frame_bytes(f), bytes, len);
        tpi_msg_clear(&d);

        /* The owning decoder views the frame: in place when aligned, else
         * moved down onto its byte count, to the aligned address below. */
        tp_frame *probe = f;
        assert_int_equal(tpi_msg_decode_frame(f, NULL, &d, err, sizeof err), TP_OK);
        tp_value *v = d.value;
        d.value = NULL;
        tpi_msg_clear(&d); /* the value outlives the msg */
        const uint8_t *p = tp_tensor_cdata(v);
        assert_true(inside(p, nbytes, probe));
        size_t align = tp_dtype_align(dtypes[k]); /* complex128: 8, not its 16 bytes */
        assert_int_equal((uintptr_t)p % align, 0);
        if (p != at - ((uintptr_t)at % align))
            fail_msg("dtype %s: data at %+td from offset 47", tp_dtype_name(dtypes[k]), p - at);
        assert_true(tp_value_equal(v, t));
        /* Writable in place: the view owns its bytes. */
        uint8_t *w = tp_tensor_data(v);
        assert_ptr_equal(w, p);
        w[nbytes - 1] ^= 1;
        assert_false(tp_value_equal(v, t));
        /* Re-encoding a view is byte-identical to what arrived (WIRE-7). */
        w[nbytes - 1] ^= 1;
        tpi_msg m = {0};
        m.type = TPI_MSG_RESPONSE;
        m.id = 9;
        m.value = v;
        tp_frame *again = zc_encode(&m);
        assert_ptr_equal(again->seg[1].base, p); /* sent from the received frame */
        tp_frame *flat = tp_frame_flatten(again);
        assert_memory_equal(tp_frame_bytes(flat), bytes, len);
        tp_value_free(v); /* the frame lives on in again */
        tp_frame_free(flat);
        tp_frame_free(again); /* the last reference: the received frame goes */
        tp_value_free(t);
        free(bytes);
    }
}

static void test_codec_zero_copy_receive_shared_and_failures(void **state) {
    (void)state;
    /* Two views of one frame, freed in either order. */
    tp_value *a = zc_tensor(TP_DTYPE_FLOAT32, ZC_ELEMS, 5);
    tp_value *b = zc_tensor(TP_DTYPE_INT64, ZC_ELEMS / 2, 6);
    tp_value *small = zc_tensor(TP_DTYPE_FLOAT32, 16, 7);
    tpi_msg m = {0};
    m.type = TPI_MSG_REQUEST;
    strcpy(m.text, "pair");
    m.args = tp_value_list_of(3, tp_value_clone(a), tp_value_clone(small), tp_value_clone(b));
    assert_non_null(m.args);
    tp_frame *sent = zc_encode(&m);
    tp_frame *f = tp_frame_flatten(sent);
    tp_frame_free(sent);
    tp_frame *probe = f;
    tpi_msg d;
    assert_int_equal(tpi_msg_decode_frame(f, NULL, &d, err, sizeof err), TP_OK);
    assert_true(tp_value_equal(d.args, m.args));
    const tp_value *va = tp_list_get(d.args, 0), *vs = tp_list_get(d.args, 1),
                   *vb = tp_list_get(d.args, 2);
    assert_true(inside(tp_tensor_cdata(va), 1, probe));
    assert_true(inside(tp_tensor_cdata(vb), 1, probe));
    assert_false(inside(tp_tensor_cdata(vs), 1, probe)); /* small: copied */
    tp_value *ownb = tp_value_clone(vb); /* a clone copies */
    assert_false(inside(tp_tensor_cdata(ownb), 1, probe));
    tp_value_free(ownb);
    tpi_msg_clear(&d);
    tpi_msg_clear(&m);

    /* A frame that is not one owned segment is decoded by copy, and taken. */
    m.type = TPI_MSG_RESPONSE;
    m.value = a;
    sent = zc_encode(&m);
    assert_int_equal(sent->nseg, 2);
    assert_int_equal(tpi_msg_decode_frame(sent, NULL, &d, err, sizeof err), TP_OK);
    assert_ptr_not_equal(tp_tensor_cdata(d.value), tp_tensor_cdata(a));
    assert_true(tp_value_equal(d.value, a));
    tpi_msg_clear(&d);

    /* A malformed frame fails and is freed, views made before the error too. */
    m.type = TPI_MSG_REQUEST;
    m.value = NULL;
    m.args = tp_value_list_of(2, tp_value_clone(a), tp_value_clone(b));
    sent = zc_encode(&m);
    f = tp_frame_flatten(sent);
    tp_frame_free(sent);
    tpi_msg_clear(&m);
    tp_frame *cut = tp_frame_alloc(f->len - 1);
    memcpy(tp_frame_bytes(cut), tp_frame_bytes(f), f->len - 1);
    tp_frame_free(f);
    assert_int_equal(tpi_msg_decode_frame(cut, NULL, &d, err, sizeof err), TP_EPROTO);
    assert_null(d.args);
    assert_non_null(strstr(err, "truncated"));

    tp_value_free(a);
    tp_value_free(b);
    tp_value_free(small);
}

/* The name peeked from a REQUEST without a decode (serve.c's inline check):
 * only a name of 1..TP_NAME_LEN_MAX bytes, within the frame, with no NUL. */
static int peek_name(const void *body, size_t body_len, char name[TP_NAME_LEN_MAX + 1]) {
    static uint8_t bytes[TP_FRAME_HEADER_SIZE + 1024];
    assert_true(body_len <= sizeof bytes - TP_FRAME_HEADER_SIZE);
    size_t len = make_frame(bytes, TPI_MSG_REQUEST, 0, body, body_len);
    tp_frame *f = tp_frame_alloc(len);
    assert_non_null(f);
    memcpy(tp_frame_bytes(f), bytes, len);
    int ok = tpi_frame_request_name(f, name);
    tp_frame_free(f);
    return ok;
}

/* spec: WIRE-7: a decode that runs out of memory at any of its allocations
 * fails with TP_ENOMEM and a message, and keeps nothing (the sanitizer
 * build's leak check sees every block); past the last one it decodes the
 * value whole. The value holds every container (a map of maps, lists and
 * tuples), strings, bytes and a tensor. */
static void test_codec_decode_fails_clean_without_memory(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) { /* under valgrind, or not GCC */
        skip();
        return;
    }
    const int64_t shape[2] = {2, 3};
    const float data[6] = {1, 2, 3, 4, 5, 6};
    tp_value *inner = tp_value_map();
    tp_map_set(inner, "d", tp_value_bytes("yz", 2));
    tp_value *tup = tp_value_tuple();
    tp_list_append(tup, tp_value_str("in a tuple"));
    tp_value *map = tp_value_map();
    tp_map_set(map, "a", tp_value_int(1));
    tp_map_set(map, "b", tp_value_list_of(2, tp_value_float(2.5), tup));
    tp_map_set(map, "c", inner);
    tp_value *v = tp_value_list_of(3, map, tp_value_str("x"),
                                   tp_value_tensor(TP_DTYPE_FLOAT32, 2, shape, NULL, data));
    tpi_msg m = {0};
    m.type = TPI_MSG_RESPONSE;
    m.id = 9;
    m.value = v;
    tp_frame *f = encode_ok(&m, NULL);
    int failed = 0;
    for (long k = 1;; k++) {
        tpi_msg d;
        err[0] = '\0';
        atomic_store(&alloc_countdown_fired, 0);
        atomic_store(&alloc_countdown, k);
        tp_status st = tpi_msg_decode(f, NULL, &d, err, sizeof err);
        atomic_store(&alloc_countdown, 0);
        if (!atomic_load(&alloc_countdown_fired)) {
            assert_int_equal(st, TP_OK); /* past its last allocation: whole */
            assert_true(tp_value_equal(d.value, v));
            tpi_msg_clear(&d);
            break;
        }
        if (st != TP_ENOMEM)
            fail_msg("allocation %ld failed: %s: %s", k, tp_status_name(st), err);
        assert_non_null(strstr(err, "out of memory"));
        failed++;
        assert_true(k < 256);
    }
    assert_true(failed >= 10); /* each container, string and the tensor allocate */
    /* The kind named where memory ran out: a str is not called bytes. */
    tpi_msg one = {0};
    one.type = TPI_MSG_RESPONSE;
    one.value = tp_value_str("x");
    tp_frame *g = encode_ok(&one, NULL);
    tpi_msg d;
    atomic_store(&alloc_countdown_fired, 0);
    atomic_store(&alloc_countdown, 1);
    tp_status st = tpi_msg_decode(g, NULL, &d, err, sizeof err);
    atomic_store(&alloc_countdown, 0);
    assert_int_equal(st, TP_ENOMEM);
    assert_non_null(strstr(err, "out of memory decoding a str at offset 28"));
    tp_frame_free(g);
    tp_value_free(one.value);
    tp_frame_free(f);
    tp_value_free(v);
}

/* When realloc fails: a list's or map's room is refused (the container
 * freed, no leak), and a buffer that cannot grow fails, sticky. */
static void test_codec_realloc_fails_clean(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) { /* under valgrind, or not GCC */
        skip();
        return;
    }
    tpi_msg m;
    atomic_store(&realloc_fail_min, 1);
    const uint8_t list[] = {6, 1, 0, 0, 0, 0};
    assert_int_equal(decode_value_bytes(list, sizeof list, &m), TP_ENOMEM);
    assert_non_null(strstr(err, "out of memory decoding a list at offset 28"));
    const uint8_t map[] = {7, 1, 0, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(decode_value_bytes(map, sizeof map, &m), TP_ENOMEM);
    assert_non_null(strstr(err, "out of memory decoding a map at offset 28"));
    tpi_wbuf w;
    tpi_wbuf_init(&w, 1024);
    tp_value *seven = tp_value_int(7);
    assert_int_equal(tpi_value_encode(&w, seven, NULL), TP_ENOMEM);
    assert_int_equal(w.status, TP_ENOMEM);
    tpi_wbuf_free(&w);
    tpi_wbuf w2;
    tpi_wbuf_init(&w2, 64);
    tpi_wbuf_u8(&w2, 1);
    assert_int_equal(w2.status, TP_ENOMEM);
    assert_int_equal(w2.len, 0);
    tpi_wbuf_free(&w2);
    atomic_store(&realloc_fail_min, 0);
    assert_true(atomic_load(&realloc_failed) >= 4);
    tp_value_free(seven);
}

/* A body: u32 timeout, u32 n, then the name's bytes (n_bytes of them). */
static size_t name_body(uint8_t *b, uint32_t n, const char *fill, size_t n_bytes) {
    memset(b, 0, 4);
    for (int i = 0; i < 4; i++)
        b[4 + i] = (uint8_t)(n >> (8 * i));
    for (size_t i = 0; i < n_bytes; i++)
        b[8 + i] = (uint8_t)fill[i % strlen(fill)];
    return 8 + n_bytes;
}

static void test_codec_request_name_bounds(void **state) {
    (void)state;
    uint8_t b[1024];
    char name[TP_NAME_LEN_MAX + 1 + 64]; /* room past the bound: what a bad peek would write */
    memset(name, 'x', sizeof name);
    assert_int_equal(peek_name(b, name_body(b, 3, "add", 3), name), 1);
    assert_string_equal(name, "add");
    assert_int_equal(peek_name(b, name_body(b, TP_NAME_LEN_MAX, "f", TP_NAME_LEN_MAX), name), 1);
    assert_int_equal(strlen(name), TP_NAME_LEN_MAX);
    /* Refused: an empty name, one over the bound (the bytes there), one
     * longer than the frame, one with a NUL, a body too short for n. */
    name[0] = '?';
    assert_int_equal(peek_name(b, name_body(b, 0, "a", 4), name), 0);
    assert_int_equal(name[0], '?');
    assert_int_equal(
        peek_name(b, name_body(b, TP_NAME_LEN_MAX + 1, "f", TP_NAME_LEN_MAX + 1), name), 0);
    assert_int_equal(peek_name(b, name_body(b, TP_NAME_LEN_MAX + 40, "f", 600), name), 0);
    assert_int_equal(name[TP_NAME_LEN_MAX + 1], 'x');
    assert_int_equal(peek_name(b, name_body(b, 4, "add", 3), name), 0);
    uint8_t nul[] = {0, 0, 0, 0, 3, 0, 0, 0, 'a', 0, 'd'};
    assert_int_equal(peek_name(nul, sizeof nul, name), 0);
    assert_int_equal(peek_name(b, 6, name), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codec_roundtrip_scalars),
        cmocka_unit_test(test_codec_roundtrip_blobs_and_info),
        cmocka_unit_test(test_codec_roundtrip_containers),
        cmocka_unit_test(test_codec_roundtrip_tensors_every_dtype),
        cmocka_unit_test(test_codec_tensor_dimension_int64_max),
        cmocka_unit_test(test_codec_realloc_fails_clean),
        cmocka_unit_test(test_codec_strided_tensor_travels_packed),
        cmocka_unit_test(test_codec_roundtrip_every_message_type),
        cmocka_unit_test(test_codec_response_error_and_null_args),
        cmocka_unit_test(test_codec_value_api_on_buffers),
        cmocka_unit_test(test_codec_buffers_primitives),
        cmocka_unit_test(test_codec_frame_alloc_and_multi_segment_decode),
        cmocka_unit_test(test_codec_header_rejects_bad_fields),
        cmocka_unit_test(test_codec_refuses_bad_flags_and_abandon_status),
        cmocka_unit_test(test_codec_frame_segments_checked),
        cmocka_unit_test(test_codec_header_window_generation),
        cmocka_unit_test(test_codec_truncated_at_every_offset),
        cmocka_unit_test(test_codec_trailing_bytes_rejected),
        cmocka_unit_test(test_codec_unknown_tag_and_dtype),
        cmocka_unit_test(test_codec_lengths_past_end),
        cmocka_unit_test(test_codec_huge_length_prefix_not_allocated),
        cmocka_unit_test(test_codec_tensor_shape_and_nbytes_checked),
        cmocka_unit_test(test_codec_depth_bomb_and_limit),
        cmocka_unit_test(test_codec_map_keys_checked),
        cmocka_unit_test(test_codec_names_checked),
        cmocka_unit_test(test_codec_response_text_and_status_checked),
        cmocka_unit_test(test_codec_oversized_message_refused),
        cmocka_unit_test(test_codec_objects_and_bare_rrefs_cannot_be_sent),
        cmocka_unit_test(test_codec_rref_hooks_roundtrip),
        cmocka_unit_test(test_codec_rref_hook_failure_reported),
        cmocka_unit_test(test_codec_values_per_message_limit),
        cmocka_unit_test(test_codec_zero_copy_send_borrows_tensor_memory),
        cmocka_unit_test(test_codec_zero_copy_send_borrowed_tensor),
        cmocka_unit_test(test_codec_zero_copy_send_limits),
        cmocka_unit_test(test_codec_zero_copy_receive_views_frame),
        cmocka_unit_test(test_codec_zero_copy_receive_shared_and_failures),
        cmocka_unit_test(test_codec_request_name_bounds),
        cmocka_unit_test(test_codec_decode_fails_clean_without_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
