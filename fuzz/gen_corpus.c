/*
 * gen_corpus.c: writes the seed corpus of fuzz_msg_decode: valid frames of
 * every message type and every value kind that travels without the core,
 * and one frame holding an rref (which the harness refuses).
 * Usage: gen_corpus DIR (normally fuzz/corpus/fuzz_msg_decode). The output
 * is deterministic, so the committed files only change with the format.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/codec.h"

static const char *out_dir;
static int failures;

static void write_file(const char *name, const void *data, size_t len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    FILE *fp = fopen(path, "wb");
    int ok = fp != NULL;
    if (fp) {
        ok = fwrite(data, 1, len, fp) == len;
        ok = fclose(fp) == 0 && ok;
    }
    if (!ok) {
        fprintf(stderr, "gen_corpus: cannot write %s\n", path);
        failures++;
    }
}

/* Encodes m and writes it as name; frees m's values. */
static void emit(const char *name, tpi_msg *m) {
    tp_frame *f = NULL;
    char err[TP_ERRMSG_LEN_MAX];
    if (tpi_msg_encode(m, NULL, TPI_MESSAGE_SIZE_MAX, &f, err, sizeof err) != TP_OK) {
        fprintf(stderr, "gen_corpus: %s: %s\n", name, err);
        failures++;
    } else {
        write_file(name, f->seg[0].base, f->len);
        tp_frame_free(f);
    }
    tpi_msg_clear(m);
}

static tpi_msg msg(uint8_t type, uint64_t id) {
    tpi_msg m;
    memset(&m, 0, sizeof m);
    m.type = type;
    m.id = id;
    return m;
}

static tp_value *every_kind(void) {
    tp_worker_info wi = {.name = "worker1", .id = 1};
    int64_t shape[2] = {2, 3};
    float data[6] = {0.5f, -1, 2, 3.25f, 4, -5};
    tp_value *kw = tp_value_map();
    tp_map_set(kw, "alpha", tp_value_float(0.25));
    tp_map_set(kw, "beta", tp_value_list_of(2, tp_value_int(1), tp_value_nil()));
    tp_value *tuple = tp_value_tuple(); /* VALUE-11: tag 12 */
    tp_list_append(tuple, tp_value_int(7));
    return tp_value_list_of(12, tp_value_opaque("\x80\x04N.", 4), tp_value_nil(), tp_value_bool(1), tp_value_int(-123456789),
                            tp_value_float(3.5), tp_value_str("hello"),
                            tp_value_bytes("\x00\x01\xff", 3),
                            tp_value_tensor(TP_DTYPE_FLOAT32, 2, shape, NULL, data),
                            tp_value_worker_info(&wi), kw, tp_value_list(), tuple);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_corpus DIR\n");
        return 2;
    }
    out_dir = argv[1];
    if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "gen_corpus: cannot create %s\n", out_dir);
        return 1;
    }

    tpi_msg m = msg(TPI_MSG_REQUEST, 1);
    strcpy(m.text, "add");
    m.timeout_ms = 60000;
    m.args = tp_value_list_of(2, tp_value_int(2), tp_value_int(3));
    emit("request-add", &m);

    m = msg(TPI_MSG_REQUEST, 2);
    strcpy(m.text, "train_step");
    m.args = every_kind();
    m.kwargs = tp_value_map();
    tp_map_set(m.kwargs, "lr", tp_value_float(0.01));
    emit("request-every-kind", &m);

    m = msg(TPI_MSG_REQUEST, 3);
    strcpy(m.text, "forward");
    m.flags = TPI_FLAG_METHOD;
    m.args = tp_value_list_of(1, tp_value_str("x"));
    emit("request-method", &m);

    m = msg(TPI_MSG_REQUEST, 4);
    strcpy(m.text, "nest");
    tp_value *v = tp_value_nil();
    for (int i = 0; i < 8; i++) {
        tp_value *map = tp_value_map();
        tp_map_set(map, "k", tp_value_list_of(1, v));
        v = map;
    }
    m.args = tp_value_list_of(1, v);
    emit("request-nested", &m);

    m = msg(TPI_MSG_REMOTE, 5);
    strcpy(m.text, "make_model");
    m.rref = (tpi_gid){0, 42};
    m.fork = (tpi_gid){0, 42};
    m.timeout_ms = 1000;
    m.args = tp_value_list_of(1, tp_value_int(10));
    emit("remote-make-model", &m);

    m = msg(TPI_MSG_RESPONSE, 1);
    m.value = tp_value_int(5);
    emit("response-int", &m);

    m = msg(TPI_MSG_RESPONSE, 2);
    double base[12];
    for (int i = 0; i < 12; i++)
        base[i] = i * 1.5;
    int64_t shape[2] = {3, 4}, strides[2] = {1, 3}; /* a transposed view: sent packed */
    m.value = tp_value_tensor(TP_DTYPE_FLOAT64, 2, shape, strides, base);
    emit("response-tensor", &m);

    /* Issue 20's dtypes (WIRE-4 codes 10..14): one list holding a tensor of each. */
    m = msg(TPI_MSG_RESPONSE, 2);
    m.value = tp_value_list();
    for (int dt = TP_DTYPE_UINT16; dt <= TP_DTYPE_COMPLEX128; dt++) {
        int64_t two[1] = {2};
        tp_list_append(m.value, tp_value_tensor((tp_dtype)dt, 1, two, NULL, base));
    }
    emit("response-tensor-new-dtypes", &m);

    m = msg(TPI_MSG_RESPONSE, 3);
    m.value = every_kind();
    emit("response-every-kind", &m);

    m = msg(TPI_MSG_RESPONSE, 4);
    m.status = TP_EREMOTE;
    strcpy(m.text, "ValueError: expected a positive number");
    emit("response-error", &m);

    m = msg(TPI_MSG_RESPONSE, 5);
    emit("response-nil", &m);

    m = msg(TPI_MSG_RREF_FETCH, 6);
    m.rref = (tpi_gid){1, 7};
    emit("rref-fetch", &m);

    m = msg(TPI_MSG_RREF_DELETE, 0);
    m.rref = (tpi_gid){1, 7};
    m.fork = (tpi_gid){2, 9};
    emit("rref-delete", &m);

    m = msg(TPI_MSG_RREF_FORK, 7);
    m.rref = (tpi_gid){1, 7};
    m.fork = (tpi_gid){2, 10};
    m.parent = 2;
    emit("rref-fork", &m);

    m = msg(TPI_MSG_RREF_ACCEPT, 0);
    m.fork = (tpi_gid){2, 10};
    emit("rref-accept", &m);

    m = msg(TPI_MSG_RREF_ABANDON, 0);
    m.rref = (tpi_gid){1, 7};
    m.status = TP_ETIMEDOUT;
    snprintf(m.text, sizeof m.text, "the rref was not created: remote 'slow' on 'w1' got no answer");
    emit("rref-abandon", &m);

    /* A value holding an rref, hand-made (no core to fork one): the
     * harness refuses it, which covers that path. */
    static const uint8_t rref_resp[] = {
        'T', 'P', 'R', 'C', TPI_WIRE_VERSION, TPI_MSG_RESPONSE, 0, 0, /* magic, version, type */
        41, 0, 0, 0, 0, 0, 0, 0,                                     /* body length, gen */
        8, 0, 0, 0, 0, 0, 0, 0,                                      /* id */
        0, 0, 0, 0,                                                  /* status TP_OK */
        9,                                                           /* tag rref */
        1, 0, 0, 0, 0, 0, 0, 0,                                      /* owner 1, incarnation 0 */
        1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0,                          /* rref 1:7 */
        2, 0, 0, 0, 11, 0, 0, 0, 0, 0, 0, 0,                         /* fork 2:11 */
        2, 0, 0, 0};                                                 /* parent 2 */
    write_file("response-rref", rref_resp, sizeof rref_resp);
    return failures ? 1 : 0;
}
