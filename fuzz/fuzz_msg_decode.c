/*
 * fuzz_msg_decode.c: any bytes as a received frame (spec/wire.md WIRE-6).
 *
 * Runs the header check a backend runs, then the message decoder, with rref
 * hooks that refuse every rref. Properties checked on every input:
 * - nothing crashes, leaks or reads out of bounds (under ASan);
 * - a frame whose header check fails is never decoded successfully;
 * - a failed decode leaves nothing in the message and says why;
 * - an accepted frame re-encodes to exactly the same bytes (WIRE-7, the
 *   encoding is canonical), and those decode again to an equal message.
 * A violated property aborts, which the fuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/codec.h"
#include "common/errors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tp_status refuse_encode(void *ctx, tp_rref *rref, tpi_rref_wire *w) {
    (void)ctx;
    (void)rref;
    (void)w;
    return tpi_fail(TP_ETYPE, "the fuzz harness sends no rrefs");
}

static tp_status refuse_decode(void *ctx, const tpi_rref_wire *w, tp_rref **out) {
    (void)ctx;
    (void)w;
    *out = NULL;
    return tpi_fail(TP_EPROTO, "the fuzz harness accepts no rrefs");
}

static const tpi_codec_hooks hooks = {NULL, refuse_encode, refuse_decode};

static void check(int ok, const char *what, const char *detail) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_msg_decode: property violated: %s (%s)\n", what, detail);
    abort();
}

static int msg_equal(const tpi_msg *a, const tpi_msg *b) {
    return a->type == b->type && a->flags == b->flags && a->id == b->id &&
           a->timeout_ms == b->timeout_ms && a->status == b->status &&
           strcmp(a->text, b->text) == 0 && a->rref.worker == b->rref.worker &&
           a->rref.local == b->rref.local && a->fork.worker == b->fork.worker &&
           a->fork.local == b->fork.local && a->parent == b->parent &&
           tp_value_equal(a->args, b->args) && tp_value_equal(a->kwargs, b->kwargs) &&
           tp_value_equal(a->value, b->value);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[TP_ERRMSG_LEN_MAX];
    size_t frame_len = 0;
    tp_status header = TP_EPROTO;
    if (size >= TP_FRAME_HEADER_SIZE)
        header = tp_frame_check_header(data, TPI_MESSAGE_SIZE_MAX, &frame_len, err, sizeof err);

    tp_frame *f = tp_frame_alloc(size);
    if (!f)
        return 0;
    if (size)
        memcpy(tp_frame_bytes(f), data, size);
    /* The name peek that routes non-blocking functions (FUNC-6) reads the
     * same hostile bytes before any decode. */
    char name[TP_NAME_LEN_MAX + 1];
    int peeked = size >= TP_FRAME_HEADER_SIZE && tpi_frame_request_name(f, name);
    tpi_msg m;
    err[0] = '\0';
    tp_status st = tpi_msg_decode(f, &hooks, &m, err, sizeof err);
    tp_frame_free(f);
    if (st == TP_OK && m.type == TPI_MSG_REQUEST)
        check(peeked && strcmp(name, m.text) == 0, "the peeked name is the decoded one", name);
    if (st != TP_OK) {
        check(err[0] != '\0', "a failed decode says why", tp_status_name(st));
        check(!m.args && !m.kwargs && !m.value, "a failed decode leaves nothing", err);
        return 0;
    }
    check(header == TP_OK && frame_len == size, "only valid headers decode", "header");

    tp_frame *again = NULL;
    st = tpi_msg_encode(&m, &hooks, TPI_MESSAGE_SIZE_MAX, &again, err, sizeof err);
    check(st == TP_OK, "an accepted message re-encodes", err);
    /* Large tensors travel as their own segments (WIRE-10): compare the bytes. */
    tp_frame *flat = tp_frame_flatten(again);
    check(flat != NULL, "a re-encoded frame flattens", "out of memory");
    check(flat->len == size && memcmp(tp_frame_bytes(flat), data, size) == 0,
          "the encoding is canonical", "re-encoded bytes differ");
    tp_frame_free(flat);
    tpi_msg m2;
    st = tpi_msg_decode(again, &hooks, &m2, err, sizeof err);
    check(st == TP_OK, "a re-encoded message decodes", err);
    check(msg_equal(&m, &m2), "decode(encode(m)) == m", "fields differ");
    tpi_msg_clear(&m2);
    tpi_msg_clear(&m);
    tp_frame_free(again);
    return 0;
}
