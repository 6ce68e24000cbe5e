/*
 * test_value.c: the value model (spec/api.md VALUE-1..9): constructors,
 * typed reads, containers, tensors and their layouts, clone, equality,
 * formatting, and ownership (every test ends leak-free under ASan).
 */
#define _GNU_SOURCE /* RTLD_NEXT, for alloc_fault.h */
#include <malloc.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/value.h"
#include "tensorplay/rpc.h"

#include "common/limits.h"

#include "alloc_fault.h"
#include "fake_rref.h"

/* ---- Scalars and typed reads ------------------------------------------------ */

static void test_value_scalars_read_back(void **state) {
    (void)state;
    tp_value *n = tp_value_nil(), *b = tp_value_bool(5), *i = tp_value_int(INT64_MIN);
    tp_value *d = tp_value_float(-2.5);
    assert_int_equal(tp_value_kind(n), TP_KIND_NIL);
    int bv = 0;
    assert_int_equal(tp_value_get_bool(b, &bv), TP_OK);
    assert_int_equal(bv, 1); /* any non-zero is true, stored as 1 */
    int64_t iv = 0;
    assert_int_equal(tp_value_get_int(i, &iv), TP_OK);
    assert_true(iv == INT64_MIN);
    double dv = 0;
    assert_int_equal(tp_value_get_float(d, &dv), TP_OK);
    assert_true(dv == -2.5);
    /* get_float also reads ints */
    assert_int_equal(tp_value_get_float(i, &dv), TP_OK);
    assert_true(dv == (double)INT64_MIN);
    tp_value_free(n);
    tp_value_free(b);
    tp_value_free(i);
    tp_value_free(d);
}

static void test_value_typed_read_wrong_kind(void **state) {
    (void)state;
    tp_value *s = tp_value_str("x");
    int64_t iv;
    assert_int_equal(tp_value_get_int(s, &iv), TP_ETYPE);
    assert_string_equal(tp_errmsg(), "expected int, got str");
    int bv;
    assert_int_equal(tp_value_get_bool(s, &bv), TP_ETYPE);
    double dv;
    assert_int_equal(tp_value_get_float(s, &dv), TP_ETYPE);
    assert_string_equal(tp_errmsg(), "expected float, got str");
    const void *p;
    size_t len;
    assert_int_equal(tp_value_get_bytes(s, &p, &len), TP_ETYPE);
    tp_worker_info wi;
    assert_int_equal(tp_value_get_worker_info(s, &wi), TP_ETYPE);
    tp_rref *r;
    assert_int_equal(tp_value_get_rref(s, &r), TP_ETYPE);
    void *st;
    assert_int_equal(tp_value_get_object(s, NULL, &st), TP_ETYPE);
    assert_int_equal(tp_value_get_int(NULL, &iv), TP_EINVAL);
    assert_int_equal(tp_value_get_str(s, NULL, &len), TP_EINVAL);
    tp_value_free(s);
}

static void test_value_str_and_bytes_copied_and_terminated(void **state) {
    (void)state;
    char src[] = {'a', '\0', 'b'};
    tp_value *s = tp_value_strn(src, sizeof src);
    src[0] = 'z'; /* the value holds its own copy */
    const char *data;
    size_t len;
    assert_int_equal(tp_value_get_str(s, &data, &len), TP_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(data, "a\0b", 3);
    assert_int_equal(data[3], '\0');
    tp_value *e = tp_value_str("");
    assert_int_equal(tp_value_get_str(e, &data, &len), TP_OK);
    assert_int_equal(len, 0);
    assert_string_equal(data, "");
    tp_value *by = tp_value_bytes("\x00\xff", 2);
    const void *bp;
    assert_int_equal(tp_value_get_bytes(by, &bp, &len), TP_OK);
    assert_int_equal(len, 2);
    assert_memory_equal(bp, "\x00\xff", 2);
    tp_value *eb = tp_value_bytes(NULL, 0);
    assert_non_null(eb);
    assert_null(tp_value_bytes(NULL, 1));
    assert_null(tp_value_str(NULL));
    assert_false(tp_value_equal(s, e));
    tp_value_free(s);
    tp_value_free(e);
    tp_value_free(by);
    tp_value_free(eb);
}

/* ---- Lists and maps ----------------------------------------------------------- */

static void test_value_list_append_and_get(void **state) {
    (void)state;
    tp_value *l = tp_value_list();
    assert_int_equal(tp_list_len(l), 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(tp_list_append(l, tp_value_int(i)), TP_OK);
    assert_int_equal(tp_list_len(l), 100);
    int64_t v;
    assert_int_equal(tp_value_get_int(tp_list_get(l, 42), &v), TP_OK);
    assert_int_equal(v, 42);
    assert_null(tp_list_get(l, 100));
    assert_int_equal(tp_list_append(l, l), TP_EINVAL);
    assert_int_equal(tp_list_append(l, NULL), TP_EINVAL);
    /* on failure the caller keeps the item */
    tp_value *m = tp_value_map(), *item = tp_value_int(1);
    assert_int_equal(tp_list_append(m, item), TP_ETYPE);
    assert_string_equal(tp_errmsg(), "expected list, got map");
    assert_int_equal(tp_list_len(m), 0);
    assert_null(tp_list_get(m, 0));
    tp_value_free(item);
    tp_value_free(m);
    tp_value_free(l);
}

static void test_value_map_keeps_order_and_replaces(void **state) {
    (void)state;
    tp_value *m = tp_value_map();
    assert_int_equal(tp_map_set(m, "b", tp_value_int(1)), TP_OK);
    assert_int_equal(tp_map_set(m, "a", tp_value_int(2)), TP_OK);
    assert_int_equal(tp_map_set(m, "c", tp_value_int(3)), TP_OK);
    tp_value *two = tp_value_str("two");
    assert_int_equal(tp_map_set(m, "a", two), TP_OK); /* replaces in place */
    /* the new item belongs to the map now: no other container takes it */
    tp_value *other = tp_value_list();
    assert_int_equal(tp_list_append(other, two), TP_EINVAL);
    tp_value_free(other);
    assert_int_equal(tp_map_len(m), 3);
    assert_string_equal(tp_map_key_at(m, 0), "b");
    assert_string_equal(tp_map_key_at(m, 1), "a");
    assert_string_equal(tp_map_key_at(m, 2), "c");
    assert_null(tp_map_key_at(m, 3));
    assert_int_equal(tp_value_kind(tp_map_get(m, "a")), TP_KIND_STR);
    assert_ptr_equal(tp_map_get(m, "a"), tp_map_value_at(m, 1));
    assert_null(tp_map_get(m, "zz"));
    assert_null(tp_map_value_at(m, 3));
    /* setting the value already there is a no-op, not a use-after-free */
    tp_value *same = (tp_value *)tp_map_get(m, "c");
    assert_int_equal(tp_map_set(m, "c", same), TP_OK);
    assert_ptr_equal(tp_map_get(m, "c"), same);
    tp_value *item = tp_value_nil();
    assert_int_equal(tp_map_set(m, NULL, item), TP_EINVAL);
    assert_int_equal(tp_map_set(item, "k", item), TP_ETYPE);
    tp_value_free(item);
    tp_value_free(m);
}

static void test_value_map_find_duplicate(void **state) {
    (void)state;
    tp_value *m = tp_value_map();
    char key[16];
    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof key, "k%d", i);
        assert_int_equal(tpi_map_push(m, key, strlen(key), tp_value_int(i)), TP_OK);
    }
    size_t dup = 0;
    assert_int_equal(tpi_map_find_duplicate(m, &dup), TP_OK);
    assert_true(dup == SIZE_MAX);
    assert_int_equal(tpi_map_push(m, "k7", 2, tp_value_nil()), TP_OK);
    assert_int_equal(tpi_map_find_duplicate(m, &dup), TP_OK);
    assert_int_equal(dup, 40); /* the later of the two */
    tp_value_free(m);
}

static void test_value_list_of_transfers_all(void **state) {
    (void)state;
    tp_value *l = tp_value_list_of(3, tp_value_int(1), tp_value_str("a"), tp_value_nil());
    assert_int_equal(tp_list_len(l), 3);
    assert_int_equal(tp_value_kind(tp_list_get(l, 1)), TP_KIND_STR);
    tp_value_free(l);
    /* one NULL item (a failed constructor): NULL, and the others are freed */
    assert_null(tp_value_list_of(3, tp_value_int(1), NULL, tp_value_str("leak?")));
    tp_value *empty = tp_value_list_of(0);
    assert_int_equal(tp_list_len(empty), 0);
    tp_value_free(empty);
}

/* ---- Tensors -------------------------------------------------------------------- */

/* VALUE-1, VALUE-4: values form a tree (issue 8): one owner, no cycle, at
 * most TPI_VALUE_DEPTH_MAX levels; what would break that is refused and
 * left with the caller, so nothing is freed twice or recursed without end. */
static void test_value_tree_one_owner_no_cycle(void **state) {
    (void)state;
    tp_value *a = tp_value_list(), *b = tp_value_list(), *x = tp_value_int(7);
    assert_int_equal(tp_list_append(a, x), TP_OK);
    /* x already belongs to a: not also to b (that was a double free) */
    assert_int_equal(tp_list_append(b, x), TP_EINVAL);
    assert_non_null(strstr(tp_errmsg(), "already inside a list or map"));
    tp_value *m = tp_value_map();
    assert_int_equal(tp_map_set(m, "x", x), TP_EINVAL);
    /* freeing an item its container owns does nothing; the container frees it */
    tp_value_free(x);
    assert_int_equal(tp_list_len(a), 1);
    /* a in b, then b in a: an indirect cycle, refused */
    assert_int_equal(tp_list_append(b, a), TP_OK);
    assert_int_equal(tp_list_append(a, b), TP_EINVAL);
    assert_non_null(strstr(tp_errmsg(), "cannot hold itself"));
    assert_int_equal(tp_map_set(m, "b", b), TP_OK);
    assert_int_equal(tp_list_append(a, m), TP_EINVAL); /* m holds b holds a */
    /* setting the same item again under its key changes nothing */
    assert_int_equal(tp_map_set(m, "b", b), TP_OK);
    assert_int_equal(tp_map_len(m), 1);
    /* list_of does not take an item another container owns */
    assert_null(tp_value_list_of(2, tp_value_int(1), x));
    assert_int_equal(tp_list_len(a), 1); /* x is still a's */
    tp_value_free(m); /* frees b, a and x, once each */
}

static void test_value_tree_depth_limit(void **state) {
    (void)state;
    /* 64 levels of lists are the most a value holds (the wire's limit) */
    tp_value *top = tp_value_list(), *leaf = top;
    for (int i = 1; i < TPI_VALUE_DEPTH_MAX; i++) {
        tp_value *next = tp_value_list();
        assert_int_equal(tp_list_append(leaf, next), TP_OK);
        leaf = next;
    }
    tp_value *one_more = tp_value_list();
    assert_int_equal(tp_list_append(leaf, one_more), TP_ELIMIT);
    assert_non_null(strstr(tp_errmsg(), "deeper than 64 levels"));
    assert_int_equal(tp_list_append(leaf, tp_value_int(1)), TP_OK); /* a scalar fits */
    /* a deep tree cannot go under another container either */
    tp_value *holder = tp_value_map();
    assert_int_equal(tp_map_set(holder, "deep", top), TP_ELIMIT);
    /* replacing a deep item by a shallow one makes room again */
    tp_value *m = tp_value_map(), *deep = tp_value_list();
    tp_value *d = deep;
    for (int i = 2; i < TPI_VALUE_DEPTH_MAX; i++) {
        tp_value *next = tp_value_list();
        assert_int_equal(tp_list_append(d, next), TP_OK);
        d = next;
    }
    assert_int_equal(tp_map_set(m, "k", deep), TP_OK); /* m: 64 levels */
    tp_value *outer = tp_value_list();
    tp_value *m2 = tp_value_clone(m);
    assert_non_null(m2);
    assert_int_equal(tp_list_append(outer, m2), TP_ELIMIT);
    assert_int_equal(tp_map_set(m2, "k", tp_value_int(0)), TP_OK); /* deep freed */
    assert_int_equal(tp_list_append(outer, m2), TP_OK);
    /* ... and the containers above it shrink with it: a list holding the map */
    tp_value *m3 = tp_value_map(), *deep3 = tp_value_list(), *l3 = tp_value_list();
    d = deep3;
    for (int i = 3; i < TPI_VALUE_DEPTH_MAX; i++) {
        tp_value *next = tp_value_list();
        assert_int_equal(tp_list_append(d, next), TP_OK);
        d = next;
    }
    assert_int_equal(tp_map_set(m3, "k", deep3), TP_OK);
    assert_int_equal(tp_list_append(l3, m3), TP_OK); /* l3: 64 levels */
    tp_value *outer3 = tp_value_list();
    assert_int_equal(tp_list_append(outer3, l3), TP_ELIMIT);
    assert_int_equal(tp_map_set(m3, "k", tp_value_int(0)), TP_OK); /* l3: 3 levels */
    assert_int_equal(tp_list_append(outer3, l3), TP_OK);
    /* outer3 is exactly 3 levels: it fits under 61, not under 62 */
    tp_value *chain = tp_value_list(), *above = NULL;
    d = chain;
    for (int level = 1; level < TPI_VALUE_DEPTH_MAX - 2; level++) { /* down to level 62 */
        tp_value *next = tp_value_list();
        assert_int_equal(tp_list_append(d, next), TP_OK);
        above = d;
        d = next;
    }
    assert_int_equal(tp_list_append(d, outer3), TP_ELIMIT);
    assert_int_equal(tp_list_append(above, outer3), TP_OK);
    tp_value_free(chain);
    tp_value_free(outer);
    tp_value_free(m);
    tp_value_free(holder);
    tp_value_free(top);
    tp_value_free(one_more);
}

static void test_value_tensor_contiguous_copy(void **state) {
    (void)state;
    float src[6] = {0, 1, 2, 3, 4, 5};
    int64_t shape[2] = {2, 3};
    tp_value *t = tp_value_tensor(TP_DTYPE_FLOAT32, 2, shape, NULL, src);
    assert_non_null(t);
    src[0] = 99; /* copied */
    assert_int_equal(tp_tensor_dtype(t), TP_DTYPE_FLOAT32);
    assert_int_equal(tp_tensor_ndim(t), 2);
    assert_true(tp_tensor_shape(t)[0] == 2 && tp_tensor_shape(t)[1] == 3);
    assert_true(tp_tensor_strides(t)[0] == 3 && tp_tensor_strides(t)[1] == 1);
    assert_int_equal(tp_tensor_numel(t), 6);
    assert_true(tp_tensor_is_contiguous(t));
    const float *d = tp_tensor_cdata(t);
    assert_true(d[0] == 0 && d[5] == 5);
    ((float *)tp_tensor_data(t))[1] = 7;
    assert_true(d[1] == 7);
    assert_int_equal(tpi_tensor_packed_size(t), 24);
    /* accessors on other kinds */
    tp_value *n = tp_value_nil();
    assert_int_equal(tp_tensor_ndim(n), 0);
    assert_null(tp_tensor_shape(n));
    assert_null(tp_tensor_data(n));
    assert_int_equal(tp_tensor_numel(n), 0);
    assert_false(tp_tensor_is_contiguous(n));
    tp_value_free(n);
    tp_value_free(t);
}

static void test_value_tensor_strided_packs_row_major(void **state) {
    (void)state;
    /* A transposed view of a 2x3 int32 matrix: shape [3, 2], strides [1, 3]. */
    int32_t base[6] = {0, 1, 2, 3, 4, 5};
    int64_t shape[2] = {3, 2}, strides[2] = {1, 3};
    tp_value *t = tp_value_tensor(TP_DTYPE_INT32, 2, shape, strides, base);
    assert_non_null(t);
    assert_false(tp_tensor_is_contiguous(t));
    assert_true(tp_tensor_strides(t)[0] == 1 && tp_tensor_strides(t)[1] == 3);
    int32_t packed[6];
    tpi_tensor_pack(t, packed);
    int32_t want[6] = {0, 3, 1, 4, 2, 5};
    assert_memory_equal(packed, want, sizeof want);
    /* equal to the contiguous tensor with the same elements */
    tp_value *c = tp_value_tensor(TP_DTYPE_INT32, 2, shape, NULL, want);
    assert_true(tp_value_equal(t, c));
    assert_true(tp_value_equal(c, t));
    /* a clone keeps the layout and the elements */
    tp_value *k = tp_value_clone(t);
    assert_false(tp_tensor_is_contiguous(k));
    assert_true(tp_value_equal(k, c));
    want[5] = 6;
    tp_value *c2 = tp_value_tensor(TP_DTYPE_INT32, 2, shape, NULL, want);
    assert_false(tp_value_equal(t, c2));
    tp_value_free(t);
    tp_value_free(c);
    tp_value_free(c2);
    tp_value_free(k);
}

/* A permuted 3-D view (permute(1, 0, 2) of a contiguous [2, 3, 4]): the
 * row walk carries from the middle dimension into the outer one. */
static void test_value_tensor_permuted_3d_packs_row_major(void **state) {
    (void)state;
    int32_t base[24];
    for (int i = 0; i < 24; i++)
        base[i] = i;
    int64_t shape[3] = {3, 2, 4}, strides[3] = {4, 12, 1};
    tp_value *t = tp_value_tensor(TP_DTYPE_INT32, 3, shape, strides, base);
    assert_non_null(t);
    assert_false(tp_tensor_is_contiguous(t));
    int32_t packed[24], want[24];
    int n = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 4; k++)
                want[n++] = j * 12 + i * 4 + k;
    tpi_tensor_pack(t, packed);
    assert_memory_equal(packed, want, sizeof want);
    tp_value *c = tp_value_tensor(TP_DTYPE_INT32, 3, shape, NULL, want);
    assert_true(tp_value_equal(t, c));
    assert_true(tp_value_equal(c, t));
    /* the last rows differ: the walk reaches them */
    want[23] = -1;
    tp_value *c2 = tp_value_tensor(TP_DTYPE_INT32, 3, shape, NULL, want);
    assert_false(tp_value_equal(t, c2));
    tp_value_free(t);
    tp_value_free(c);
    tp_value_free(c2);
}

static void test_value_tensor_broadcast_and_sliced(void **state) {
    (void)state;
    /* stride 0: one element repeated */
    double one = 1.5;
    int64_t shape[1] = {4}, stride0[1] = {0};
    tp_value *b = tp_value_tensor(TP_DTYPE_FLOAT64, 1, shape, stride0, &one);
    assert_non_null(b);
    double out[4];
    tpi_tensor_pack(b, out);
    for (int i = 0; i < 4; i++)
        assert_true(out[i] == 1.5);
    /* every other element of 7: span reaches elements 0, 2, 4, 6 only */
    int16_t src[7] = {10, 11, 12, 13, 14, 15, 16};
    int64_t s2[1] = {2};
    tp_value *e = tp_value_tensor(TP_DTYPE_INT16, 1, shape, s2, src);
    int16_t got[4];
    tpi_tensor_pack(e, got);
    assert_true(got[0] == 10 && got[1] == 12 && got[2] == 14 && got[3] == 16);
    /* 3-d with a size-1 dimension whose stride is arbitrary: still contiguous */
    int64_t sh3[3] = {2, 1, 2}, st3[3] = {2, 77, 1};
    uint8_t u[4] = {1, 2, 3, 4};
    tp_value *c = tp_value_tensor(TP_DTYPE_UINT8, 3, sh3, st3, u);
    assert_non_null(c);
    assert_true(tp_tensor_is_contiguous(c));
    tp_value_free(b);
    tp_value_free(e);
    tp_value_free(c);
}

static void test_value_tensor_zeros_empty_and_scalar(void **state) {
    (void)state;
    int64_t shape[2] = {3, 3};
    tp_value *z = tp_value_tensor(TP_DTYPE_INT64, 2, shape, NULL, NULL);
    const int64_t *d = tp_tensor_cdata(z);
    for (int i = 0; i < 9; i++)
        assert_true(d[i] == 0);
    int64_t empty_shape[2] = {0, 5};
    tp_value *e = tp_value_tensor(TP_DTYPE_FLOAT32, 2, empty_shape, NULL, NULL);
    assert_non_null(e);
    assert_int_equal(tp_tensor_numel(e), 0);
    assert_true(tp_tensor_is_contiguous(e));
    assert_non_null(tp_tensor_cdata(e));
    assert_true(tp_tensor_strides(e)[0] == 5);
    /* Empty with any strides (torch.empty_strided((0,), (5,))): it reaches no
     * element, so it spans no bytes, whatever (size - 1) * stride would say. */
    int64_t none[1] = {0}, five[1] = {5};
    tp_value *es = tp_value_tensor(TP_DTYPE_FLOAT32, 1, none, five, NULL);
    assert_non_null(es);
    assert_int_equal(tp_tensor_numel(es), 0);
    assert_true(tp_tensor_strides(es)[0] == 5);
    tp_value *es2 = tp_value_clone(es);
    assert_true(tp_value_equal(es, es2));
    tp_value_free(es);
    tp_value_free(es2);
    int8_t x = -3;
    tp_value *s = tp_value_tensor(TP_DTYPE_INT8, 0, NULL, NULL, &x);
    assert_int_equal(tp_tensor_numel(s), 1);
    assert_int_equal(*(const int8_t *)tp_tensor_cdata(s), -3);
    tp_value *s2 = tp_value_clone(s);
    assert_true(tp_value_equal(s, s2));
    tp_value_free(z);
    tp_value_free(e);
    tp_value_free(s);
    tp_value_free(s2);
}

static void test_value_tensor_rejects_bad_and_overflow(void **state) {
    (void)state;
    int64_t shape[2] = {2, 2};
    int64_t big[TP_TENSOR_NDIM_MAX + 1];
    for (int i = 0; i <= TP_TENSOR_NDIM_MAX; i++)
        big[i] = 1;
    assert_null(tp_value_tensor(TP_DTYPE_COUNT_, 2, shape, NULL, NULL));
    assert_null(tp_value_tensor((tp_dtype)-1, 2, shape, NULL, NULL));
    assert_null(tp_value_tensor(TP_DTYPE_FLOAT32, -1, shape, NULL, NULL));
    assert_null(tp_value_tensor(TP_DTYPE_FLOAT32, TP_TENSOR_NDIM_MAX + 1, big, NULL, NULL));
    tp_value *ok = tp_value_tensor(TP_DTYPE_FLOAT32, TP_TENSOR_NDIM_MAX, big, NULL, NULL);
    assert_non_null(ok);
    tp_value_free(ok);
    assert_null(tp_value_tensor(TP_DTYPE_FLOAT32, 2, NULL, NULL, NULL));
    int64_t neg[2] = {2, -1};
    assert_null(tp_value_tensor(TP_DTYPE_FLOAT32, 2, neg, NULL, NULL));
    int64_t neg_stride[2] = {1, -1};
    assert_null(tp_value_tensor(TP_DTYPE_FLOAT32, 2, shape, neg_stride, NULL));
    /* numel overflows int64 */
    int64_t huge[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
    int64_t zero_strides[2] = {0, 0};
    assert_null(tp_value_tensor(TP_DTYPE_UINT8, 2, huge, zero_strides, NULL));
    /* numel fits but numel * element size does not */
    int64_t wide[1] = {(int64_t)1 << 62};
    int64_t z1[1] = {0};
    assert_null(tp_value_tensor(TP_DTYPE_INT64, 1, wide, z1, NULL));
    /* the span the strides reach overflows */
    int64_t far[2] = {INT64_MAX, 1};
    assert_null(tp_value_tensor(TP_DTYPE_UINT8, 2, shape, far, NULL));
    /* empty, but the row-major strides overflow */
    int64_t empty_huge[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
    assert_null(tp_value_tensor(TP_DTYPE_UINT8, 3, empty_huge, NULL, NULL));
    /* the check the codec uses agrees */
    uint64_t packed = 0;
    assert_int_equal(tpi_tensor_check(TP_DTYPE_UINT8, 3, empty_huge, &packed), TP_ERANGE);
    assert_int_equal(tpi_tensor_check(TP_DTYPE_FLOAT64, 2, shape, &packed), TP_OK);
    assert_int_equal(packed, 32);
}

static void test_value_dtype_and_kind_names(void **state) {
    (void)state;
    static const struct {
        tp_dtype d;
        const char *name;
        size_t size;
    } want[] = {
        {TP_DTYPE_FLOAT32, "float32", 4}, {TP_DTYPE_FLOAT64, "float64", 8},
        {TP_DTYPE_FLOAT16, "float16", 2}, {TP_DTYPE_BFLOAT16, "bfloat16", 2},
        {TP_DTYPE_INT8, "int8", 1},       {TP_DTYPE_INT16, "int16", 2},
        {TP_DTYPE_INT32, "int32", 4},     {TP_DTYPE_INT64, "int64", 8},
        {TP_DTYPE_UINT8, "uint8", 1},     {TP_DTYPE_BOOL, "bool", 1},
        /* spec: VALUE-5, WIRE-4: issue 20's dtypes keep the codes before them */
        {TP_DTYPE_UINT16, "uint16", 2},   {TP_DTYPE_UINT32, "uint32", 4},
        {TP_DTYPE_UINT64, "uint64", 8},   {TP_DTYPE_COMPLEX64, "complex64", 8},
        {TP_DTYPE_COMPLEX128, "complex128", 16},
    };
    assert_int_equal(sizeof want / sizeof want[0], TP_DTYPE_COUNT_);
    for (size_t i = 0; i < TP_DTYPE_COUNT_; i++) {
        assert_int_equal(want[i].d, (tp_dtype)i);
        assert_string_equal(tp_dtype_name(want[i].d), want[i].name);
        assert_int_equal(tp_dtype_size(want[i].d), want[i].size);
        size_t align = want[i].d == TP_DTYPE_COMPLEX64    ? 4
                       : want[i].d == TP_DTYPE_COMPLEX128 ? 8
                                                          : want[i].size;
        assert_int_equal(tp_dtype_align(want[i].d), align);
    }
    assert_int_equal(TP_DTYPE_BOOL, 9);
    assert_int_equal(TP_DTYPE_COMPLEX128, 14);
    assert_int_equal(tp_dtype_size(TP_DTYPE_COUNT_), 0);
    assert_int_equal(tp_dtype_align(TP_DTYPE_COUNT_), 0);
    assert_string_equal(tp_dtype_name(TP_DTYPE_COUNT_), "invalid");
    assert_string_equal(tp_kind_name(TP_KIND_NIL), "nil");
    assert_string_equal(tp_kind_name(TP_KIND_WORKER_INFO), "worker_info");
    assert_string_equal(tp_kind_name(TP_KIND_OBJECT), "object");
    assert_string_equal(tp_kind_name((tp_kind)12), "invalid");
}

/* ---- Clone, equality, objects, rrefs ------------------------------------------------ */

static tp_value *sample_tree(void) {
    tp_worker_info wi = {.name = "trainer:0", .id = 3};
    int64_t shape[2] = {3, 2}, strides[2] = {1, 3};
    uint16_t halves[6] = {1, 2, 3, 4, 5, 6};
    tp_value *inner = tp_value_map();
    tp_map_set(inner, "lr", tp_value_float(0.01));
    tp_map_set(inner, "who", tp_value_worker_info(&wi));
    tp_map_set(inner, "w", tp_value_tensor(TP_DTYPE_BFLOAT16, 2, shape, strides, halves));
    tp_map_set(inner, "empty", tp_value_list());
    return tp_value_list_of(6, tp_value_int(-7), tp_value_str("héllo"), tp_value_bytes("\0\1", 2),
                            inner, tp_value_list_of(1, tp_value_list_of(0)), tp_value_bool(0));
}

static void test_value_clone_is_deep_and_equal(void **state) {
    (void)state;
    tp_value *a = sample_tree();
    tp_value *b = tp_value_clone(a);
    assert_non_null(b);
    assert_true(tp_value_equal(a, b));
    assert_ptr_not_equal(tp_list_get(a, 3), tp_list_get(b, 3));
    /* changing the copy leaves the original */
    tp_value *inner = (tp_value *)tp_list_get(b, 3);
    tp_map_set(inner, "lr", tp_value_float(0.02));
    assert_false(tp_value_equal(a, b));
    double lr;
    assert_int_equal(tp_value_get_float(tp_map_get(tp_list_get(a, 3), "lr"), &lr), TP_OK);
    assert_true(lr == 0.01);
    assert_null(tp_value_clone(NULL));
    tp_value_free(a);
    tp_value_free(b);
}

static void test_value_equal_rules(void **state) {
    (void)state;
    tp_value *nan1 = tp_value_float(NAN), *nan2 = tp_value_float(-NAN);
    tp_value *pz = tp_value_float(0.0), *nz = tp_value_float(-0.0);
    tp_value *i1 = tp_value_int(1), *f1 = tp_value_float(1.0);
    assert_true(tp_value_equal(nan1, nan2));
    assert_true(tp_value_equal(pz, nz));
    assert_false(tp_value_equal(i1, f1)); /* kinds differ */
    assert_true(tp_value_equal(NULL, NULL));
    assert_false(tp_value_equal(i1, NULL));
    /* maps: same keys and values in any order; lists: order matters */
    tp_value *m1 = tp_value_map(), *m2 = tp_value_map();
    tp_map_set(m1, "a", tp_value_int(1));
    tp_map_set(m1, "b", tp_value_int(2));
    tp_map_set(m2, "b", tp_value_int(2));
    tp_map_set(m2, "a", tp_value_int(1));
    assert_true(tp_value_equal(m1, m2));
    tp_map_set(m2, "a", tp_value_int(3));
    assert_false(tp_value_equal(m1, m2));
    tp_value *l1 = tp_value_list_of(2, tp_value_int(1), tp_value_int(2));
    tp_value *l2 = tp_value_list_of(2, tp_value_int(2), tp_value_int(1));
    assert_false(tp_value_equal(l1, l2));
    /* tensors: dtype and shape count */
    int64_t s4[1] = {4}, s22[2] = {2, 2};
    uint8_t data[4] = {1, 2, 3, 4};
    tp_value *t1 = tp_value_tensor(TP_DTYPE_UINT8, 1, s4, NULL, data);
    tp_value *t2 = tp_value_tensor(TP_DTYPE_UINT8, 2, s22, NULL, data);
    tp_value *t3 = tp_value_tensor(TP_DTYPE_INT8, 1, s4, NULL, data);
    assert_false(tp_value_equal(t1, t2));
    assert_false(tp_value_equal(t1, t3));
    tp_worker_info w1 = {.name = "a", .id = 1}, w2 = {.name = "a", .id = 2};
    tp_value *v1 = tp_value_worker_info(&w1), *v2 = tp_value_worker_info(&w2);
    assert_false(tp_value_equal(v1, v2));
    /* NaN equals only NaN */
    assert_false(tp_value_equal(nan1, f1));
    assert_false(tp_value_equal(f1, nan1));
    /* keys in another order where one is a prefix of the other: looked up */
    tp_value *p1 = tp_value_map(), *p2 = tp_value_map(), *p3 = tp_value_map(), *p4 = tp_value_map();
    tp_map_set(p1, "a", tp_value_int(1));
    tp_map_set(p1, "ab", tp_value_int(2));
    tp_map_set(p2, "ab", tp_value_int(2));
    tp_map_set(p2, "a", tp_value_int(1));
    assert_true(tp_value_equal(p1, p2));
    tp_map_set(p3, "a", tp_value_int(1));
    tp_map_set(p3, "ab", tp_value_int(1));
    tp_map_set(p4, "ab", tp_value_int(1));
    tp_map_set(p4, "a", tp_value_int(2));
    assert_false(tp_value_equal(p3, p4));
    tp_value *all[] = {nan1, nan2, pz, nz, i1, f1, m1, m2, l1, l2,
                       t1,   t2,   t3, v1, v2, p1, p2, p3, p4};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tp_value_free(all[i]);
}

static int destroyed;
static void count_destroy(void *st) {
    destroyed += *(int *)st;
}

static void test_value_object_lifecycle(void **state) {
    (void)state;
    static int one = 1;
    destroyed = 0;
    tp_value *o = tp_value_object("Counter", &one, count_destroy);
    const char *cls;
    void *st;
    assert_int_equal(tp_value_get_object(o, &cls, &st), TP_OK);
    assert_string_equal(cls, "Counter");
    assert_ptr_equal(st, &one);
    assert_int_equal(tp_value_get_object(o, NULL, NULL), TP_OK);
    /* objects cannot be cloned, alone or inside a container */
    assert_null(tp_value_clone(o));
    tp_value *l = tp_value_list_of(2, tp_value_int(1), o);
    assert_null(tp_value_clone(l));
    assert_int_equal(destroyed, 0);
    /* equality is identity of the state */
    tp_value *o2 = tp_value_object("Other", &one, NULL);
    tp_value *o3 = tp_value_object("Counter", &destroyed, NULL);
    assert_true(tp_value_equal(tp_list_get(l, 1), o2));
    assert_false(tp_value_equal(o2, o3));
    tp_value_free(l);
    assert_int_equal(destroyed, 1); /* destroy ran exactly once */
    tp_value_free(o2);
    tp_value_free(o3);
    assert_int_equal(destroyed, 1);
    assert_null(tp_value_object(NULL, &one, NULL));
}

static void test_value_worker_info_copied(void **state) {
    (void)state;
    tp_worker_info wi;
    memset(wi.name, 'x', sizeof wi.name); /* not terminated: at most 127 bytes copied */
    wi.id = 9;
    tp_value *v = tp_value_worker_info(&wi);
    tp_worker_info out;
    assert_int_equal(tp_value_get_worker_info(v, &out), TP_OK);
    assert_int_equal(out.id, 9);
    assert_int_equal(strlen(out.name), TP_NAME_LEN_MAX);
    assert_null(tp_value_worker_info(NULL));
    tp_value_free(v);
}

static void test_value_rref_holds_own_reference(void **state) {
    (void)state;
    fake_rref fr = {.refs = 1};
    tp_rref *r = (tp_rref *)(void *)&fr;
    tp_value *v = tp_value_rref(r);
    assert_int_equal(fr.refs, 2);
    tp_rref *got = NULL;
    assert_int_equal(tp_value_get_rref(v, &got), TP_OK);
    assert_ptr_equal(got, r);
    tp_value *c = tp_value_clone(v);
    assert_int_equal(fr.refs, 3);
    assert_true(tp_value_equal(v, c));
    tp_value *l = tp_value_list_of(2, v, c);
    tp_value_free(l);
    assert_int_equal(fr.refs, 1);
    assert_null(tp_value_rref(NULL));
}

/* ---- Format ---------------------------------------------------------------------- */

static void test_value_tuples(void **state) {
    (void)state;
    char buf[64];
    tp_value *t = tp_value_tuple(), *l = tp_value_list();
    assert_int_equal(tp_value_kind(t), TP_KIND_LIST);
    assert_true(tp_list_is_tuple(t));
    assert_false(tp_list_is_tuple(l));
    assert_false(tp_list_is_tuple(NULL));
    assert_false(tp_value_equal(t, l)); /* () is not [] */
    assert_int_equal(tp_list_append(t, tp_value_int(7)), TP_OK);
    assert_int_equal(tp_list_append(l, tp_value_int(7)), TP_OK);
    assert_false(tp_value_equal(t, l));
    tp_value_format(t, buf, sizeof buf);
    assert_string_equal(buf, "(7,)");
    tp_value *c = tp_value_clone(t);
    assert_true(tp_list_is_tuple(c));
    assert_true(tp_value_equal(c, t));
    tp_value_free(c);
    tp_value_free(t);
    tp_value_free(l);
}

static void test_value_opaque_bytes(void **state) {
    (void)state;
    char buf[64];
    tp_value *o = tp_value_opaque("\x80\x04N.", 4), *b = tp_value_bytes("\x80\x04N.", 4);
    assert_int_equal(tp_value_kind(o), TP_KIND_BYTES);
    assert_true(tp_bytes_is_opaque(o));
    assert_false(tp_bytes_is_opaque(b));
    assert_false(tp_bytes_is_opaque(NULL));
    assert_false(tp_value_equal(o, b));
    const void *p;
    size_t n;
    assert_int_equal(tp_value_get_bytes(o, &p, &n), TP_OK);
    assert_int_equal(n, 4);
    tp_value_format(o, buf, sizeof buf);
    assert_string_equal(buf, "opaque(b'\\x80\\x04N.')");
    tp_value *c = tp_value_clone(o);
    assert_true(tp_bytes_is_opaque(c));
    assert_true(tp_value_equal(c, o));
    tp_value_free(c);
    tp_value_free(o);
    tp_value_free(b);
}

/* VALUE-13: a view shares the elements and outlives the value it came from. */
/* spec: VALUE-5: a tensor with a zero dimension holds no elements, however
 * large its other dimensions: none of its counts overflows, so it is made. */
static void test_value_empty_tensor_with_huge_dims(void **state) {
    (void)state;
    const int64_t shape[3] = {(int64_t)1 << 40, 0, (int64_t)1 << 30};
    tp_value *t = tp_value_tensor(TP_DTYPE_FLOAT32, 3, shape, NULL, NULL);
    assert_non_null(t);
    assert_int_equal(tp_tensor_numel(t), 0);
    tp_value_free(t);
}

static void test_value_tensor_view(void **state) {
    (void)state;
    int64_t shape[2] = {2, 3};
    float data[6] = {1, 2, 3, 4, 5, 6};
    tp_value *t = tp_value_tensor(TP_DTYPE_FLOAT32, 2, shape, NULL, data);
    tp_value *v = tp_tensor_view(t);
    assert_non_null(v);
    assert_ptr_equal(tp_tensor_cdata(v), tp_tensor_cdata(t));
    assert_true(tp_value_equal(v, t));
    float *w = tp_tensor_data(v); /* no frame sends it: no copy */
    assert_ptr_equal(w, tp_tensor_cdata(t));
    w[0] = 9;
    assert_true(((const float *)tp_tensor_cdata(t))[0] == 9);
    tp_value_free(t);
    assert_true(((const float *)tp_tensor_cdata(v))[5] == 6); /* still alive (ASan) */
    tp_value *vv = tp_tensor_view(v);
    tp_value_free(v);
    assert_true(((const float *)tp_tensor_cdata(vv))[0] == 9);
    tp_value_free(vv);
    /* strided or not a tensor: NULL */
    int64_t strides[2] = {1, 2};
    tp_value *s = tp_value_tensor(TP_DTYPE_FLOAT32, 2, shape, strides, data);
    assert_null(tp_tensor_view(s));
    tp_value *i = tp_value_int(1);
    assert_null(tp_tensor_view(i));
    assert_null(tp_tensor_view(NULL));
    tp_value_free(s);
    tp_value_free(i);
}

static int view_borrow_released;
static void view_borrow_release(void *ctx) {
    view_borrow_released++;
    assert_ptr_equal(ctx, &view_borrow_released);
}

/* VALUE-13 with a borrowed tensor: its storage is the caller's memory, so a
 * view reads (and writes) those very bytes, and the memory is handed back
 * once, when the last of the tensor and its views goes. */
static void test_value_tensor_view_of_borrowed(void **state) {
    (void)state;
    static double mem[4] = {1.5, -2.0, 3.25, 8.0};
    int64_t shape[2] = {2, 2};
    view_borrow_released = 0;
    tp_value *t = tp_value_tensor_borrow(TP_DTYPE_FLOAT64, 2, shape, mem, view_borrow_release,
                                         &view_borrow_released);
    assert_non_null(t);
    assert_ptr_equal(tp_tensor_cdata(t), mem);
    tp_value *v = tp_tensor_view(t);
    assert_non_null(v);
    assert_ptr_equal(tp_tensor_cdata(v), mem);
    assert_true(tp_value_equal(v, t));
    tp_value_free(t);
    assert_int_equal(view_borrow_released, 0); /* the view still reads it */
    const double *got = tp_tensor_cdata(v);
    assert_true(got[0] == 1.5 && got[1] == -2.0 && got[2] == 3.25 && got[3] == 8.0);
    double *w = tp_tensor_data(v);
    assert_ptr_equal(w, mem);
    w[3] = 9.5;
    assert_true(mem[3] == 9.5);
    tp_value *vv = tp_tensor_view(v); /* a view of the view: the same storage */
    assert_non_null(vv);
    tp_value_free(v);
    assert_int_equal(view_borrow_released, 0);
    assert_true(((const double *)tp_tensor_cdata(vv))[3] == 9.5);
    tp_value_free(vv);
    assert_int_equal(view_borrow_released, 1);
}

static void test_value_format_reads_like_python(void **state) {
    (void)state;
    char buf[256];
    tp_value *m = tp_value_map();
    tp_map_set(m, "k", tp_value_list_of(3, tp_value_nil(), tp_value_bool(1), tp_value_float(0.1)));
    tp_map_set(m, "s", tp_value_str("it's\n"));
    tp_map_set(m, "b", tp_value_bytes("\x01z", 2));
    tp_map_set(m, "f", tp_value_float(2.0));
    tp_map_set(m, "i", tp_value_int(-12));
    size_t n = tp_value_format(m, buf, sizeof buf);
    assert_string_equal(buf, "{'k': [None, True, 0.1], 's': 'it\\'s\\n', 'b': b'\\x01z', "
                             "'f': 2.0, 'i': -12}");
    assert_int_equal(n, strlen(buf));
    int64_t shape[2] = {2, 3};
    tp_value *t = tp_value_tensor(TP_DTYPE_FLOAT16, 2, shape, NULL, NULL);
    tp_value_format(t, buf, sizeof buf);
    assert_string_equal(buf, "tensor(shape=[2, 3], dtype=float16)");
    tp_worker_info wi = {.name = "w1", .id = 1};
    tp_value *w = tp_value_worker_info(&wi);
    tp_value_format(w, buf, sizeof buf);
    assert_string_equal(buf, "WorkerInfo(id=1, name=w1)");
    /* An object by its class; no value at all as NULL (a list may hold neither
     * on the wire, but a message may name either). */
    tp_value *obj = tp_value_list_of(2, tp_value_object("Counter", NULL, NULL), tp_value_nil());
    tp_value_format(obj, buf, sizeof buf);
    assert_string_equal(buf, "[<Counter object>, None]");
    tp_value_free(obj);
    assert_int_equal(tp_value_format(NULL, buf, sizeof buf), 4);
    assert_string_equal(buf, "NULL");
    /* as many digits as a float needs to read back the same, and no more;
     * a space is printed as itself */
    tp_value *digits = tp_value_list_of(3, tp_value_float(0.1 + 0.2), tp_value_float(1.0 / 3.0),
                                        tp_value_str("a b"));
    tp_value_format(digits, buf, sizeof buf);
    assert_string_equal(buf, "[0.30000000000000004, 0.3333333333333333, 'a b']");
    tp_value_free(digits);
    tp_value *inf = tp_value_list_of(3, tp_value_float(INFINITY), tp_value_float(-INFINITY),
                                     tp_value_float(NAN));
    tp_value_format(inf, buf, sizeof buf);
    assert_string_equal(buf, "[inf, -inf, nan]");
    /* truncation: always terminated, length is what was written */
    char small[8];
    n = tp_value_format(m, small, sizeof small);
    assert_int_equal(n, 7);
    assert_string_equal(small, "{'k': [");
    small[0] = 'x';
    assert_int_equal(tp_value_format(m, small, 0), 0);
    assert_int_equal(small[0], 'x'); /* no room: not even the terminator is written */
    assert_int_equal(tp_value_format(m, NULL, 16), 0);
    tp_value_free(m);
    tp_value_free(t);
    tp_value_free(w);
    tp_value_free(inf);
}

/* ---- Shared storage (WIRE-10) ------------------------------------------------ */

static void test_value_tensor_storage_shared_and_copy_on_write(void **state) {
    (void)state;
    int64_t shape[2] = {4, 8};
    float data[32];
    for (int i = 0; i < 32; i++)
        data[i] = (float)i;
    tp_value *t = tp_value_tensor(TP_DTYPE_FLOAT32, 2, shape, NULL, data);
    assert_non_null(t);
    const void *bytes = NULL;
    tpi_blob *b = tpi_tensor_storage(t, &bytes);
    assert_non_null(b);
    assert_ptr_equal(bytes, tp_tensor_cdata(t));
    assert_true(b->data == bytes && b->len == sizeof data);
    assert_int_equal((uintptr_t)bytes % 16, 0); /* aligned for any element */
    /* Alone: writes go straight to the storage. */
    assert_ptr_equal(tp_tensor_data(t), bytes);

    /* A frame holds the storage: the first write takes a private copy, and
     * the shared bytes (what the frame sends) keep their values. */
    tpi_blob_ref(b);
    float *w = tp_tensor_data(t);
    assert_non_null(w);
    assert_ptr_not_equal(w, bytes);
    assert_memory_equal(w, data, sizeof data);
    w[0] = -1.0f;
    assert_true(((const float *)bytes)[0] == 0.0f);
    assert_ptr_equal(tp_tensor_data(t), w); /* now alone again: no second copy */
    tp_value_free(t);
    /* The frame's reference keeps the old bytes valid after the value went. */
    assert_memory_equal(b->data, data, sizeof data);
    tpi_blob_unref(b);
    tpi_blob_unref(NULL);

    /* A strided tensor has no contiguous storage to share. */
    int64_t strides[2] = {1, 4};
    int64_t tshape[2] = {8, 4};
    tp_value *s = tp_value_tensor(TP_DTYPE_FLOAT32, 2, tshape, strides, data);
    assert_non_null(s);
    assert_false(tp_tensor_is_contiguous(s));
    assert_null(tpi_tensor_storage(s, &bytes));
    tp_value_free(s);
}

static int parent_released;

static void count_release(tpi_blob *b) {
    parent_released++;
    free(b->data);
    free(b);
}

static void test_value_tensor_view_keeps_parent(void **state) {
    (void)state;
    tpi_blob *parent = malloc(sizeof *parent);
    assert_non_null(parent);
    atomic_init(&parent->refs, 1);
    parent->len = 256;
    parent->data = malloc(parent->len);
    assert_non_null(parent->data);
    for (size_t i = 0; i < parent->len; i++)
        parent->data[i] = (uint8_t)i;
    parent->release = count_release;
    parent->ctx = NULL;
    parent_released = 0;

    int64_t shape[1] = {16};
    tp_value *a = tpi_value_tensor_view(TP_DTYPE_INT32, 1, shape, parent, parent->data + 64);
    tp_value *b = tpi_value_tensor_view(TP_DTYPE_UINT8, 1, shape, parent, parent->data + 3);
    assert_non_null(a);
    assert_non_null(b);
    assert_ptr_equal(tp_tensor_cdata(a), parent->data + 64);
    assert_ptr_equal(tp_tensor_cdata(b), parent->data + 3);
    assert_int_equal(tp_tensor_numel(a), 16);
    assert_true(tp_tensor_is_contiguous(a));
    /* A view owns its bytes: writable in place, no copy. */
    int32_t *w = tp_tensor_data(a);
    assert_ptr_equal(w, parent->data + 64);
    w[0] = 7;
    /* A clone copies. */
    tp_value *c = tp_value_clone(a);
    assert_non_null(c);
    assert_ptr_not_equal(tp_tensor_cdata(c), tp_tensor_cdata(a));
    assert_true(tp_value_equal(c, a));

    tpi_blob_unref(parent); /* the creator's reference: the views keep it */
    assert_int_equal(parent_released, 0);
    tp_value_free(a);
    assert_int_equal(parent_released, 0);
    assert_int_equal(((const uint8_t *)tp_tensor_cdata(b))[0], 3);
    tp_value_free(b);
    assert_int_equal(parent_released, 1);
    assert_int_equal(((const int32_t *)tp_tensor_cdata(c))[0], 7);
    tp_value_free(c);
}

/* ---- Reads of the wrong kind, and running out of memory ------------------------ */

/* spec: VALUE-4: a container read on NULL, on a value of another kind, with
 * no key, or past the end gives NULL (0 for a length), never another kind's
 * items read as its own. */
static void test_value_container_reads_of_the_wrong_kind(void **state) {
    (void)state;
    tp_value *list = tp_value_list_of(2, tp_value_str("a"), tp_value_int(1));
    tp_value *map = tp_value_map();
    assert_non_null(list);
    assert_non_null(map);
    assert_int_equal(tp_map_set(map, "a", tp_value_int(2)), TP_OK);
    const tp_value *holders[] = {NULL, list, map};
    for (size_t i = 0; i < sizeof holders / sizeof holders[0]; i++) {
        const tp_value *h = holders[i];
        if (h != map) {
            assert_int_equal(tp_map_len(h), 0);
            assert_null(tp_map_get(h, "a"));
            assert_null(tp_map_key_at(h, 0));
            assert_null(tp_map_value_at(h, 0));
        }
        if (h != list) {
            assert_int_equal(tp_list_len(h), 0);
            assert_null(tp_list_get(h, 0));
        }
    }
    assert_null(tp_map_get(map, NULL));
    assert_null(tp_map_get(map, "b"));
    assert_non_null(tp_map_get(map, "a"));
    assert_null(tp_map_key_at(map, 1));
    assert_null(tp_map_value_at(map, 1));
    assert_null(tp_list_get(list, 2));
    assert_non_null(tp_list_get(list, 1));
    tp_value *x = tp_value_int(3);
    assert_int_equal(tp_map_set(list, "a", x), TP_ETYPE);
    assert_int_equal(tp_list_append(map, x), TP_ETYPE);
    tp_value_free(x);
    tp_value_free(list);
    tp_value_free(map);
}

/* The bytes this process holds from the allocator (0 where the allocator
 * in use is not glibc's, e.g. under a sanitizer: its leak check covers it). */
static size_t held_bytes(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* spec: VALUE-1: a constructor that runs out of memory at any of its
 * allocations returns NULL and keeps nothing: a 1 MiB tensor (its storage,
 * both when copied and when zeroed), a string, and a deep clone, each failed
 * at every allocation in turn, 200 times over, leave what the process holds
 * where it was. */
static void test_value_constructors_fail_clean_without_memory(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) { /* under valgrind, or not GCC */
        skip();
        return;
    }
    enum { MIB = 1 << 20, ROUNDS = 200 };
    static uint8_t data[MIB];
    const int64_t shape[1] = {MIB};
    tp_value *map = tp_value_map();
    assert_non_null(map);
    assert_int_equal(tp_map_set(map, "k", tp_value_list_of(1, tp_value_int(1))), TP_OK);
    tp_value *tree =
        tp_value_list_of(3, tp_value_str("x"), tp_value_list_of(1, tp_value_int(1)), map);
    assert_non_null(tree);
    tp_value *parent = tp_value_tensor(TP_DTYPE_UINT8, 1, shape, NULL, data);
    assert_non_null(parent);
    tp_worker_info wi = {.name = "w1", .id = 1};
    fake_rref fr = {.refs = 1};
    view_borrow_released = 0;
    size_t before = held_bytes();
    int failed = 0;
    for (int round = 0; round < ROUNDS; round++) {
        for (int kind = 0; kind < 9; kind++) {
            for (long k = 1;; k++) {
                atomic_store(&alloc_countdown_fired, 0);
                atomic_store(&alloc_countdown, k);
                tp_value *v = NULL;
                switch (kind) {
                case 0:
                    v = tp_value_tensor(TP_DTYPE_UINT8, 1, shape, NULL, data);
                    break;
                case 1:
                    v = tp_value_tensor(TP_DTYPE_UINT8, 1, shape, NULL, NULL);
                    break;
                case 2:
                    v = tp_value_str("a string");
                    break;
                case 3:
                    v = tp_value_clone(tree);
                    break;
                case 4:
                    v = tp_value_worker_info(&wi);
                    break;
                case 5:
                    v = tp_value_object("Counter", NULL, NULL);
                    break;
                case 6:
                    v = tp_value_tensor_borrow(TP_DTYPE_UINT8, 1, shape, data, view_borrow_release,
                                               &view_borrow_released);
                    break;
                case 7:
                    v = tp_tensor_view(parent);
                    break;
                default:
                    v = tp_value_rref((tp_rref *)(void *)&fr);
                    break;
                }
                atomic_store(&alloc_countdown, 0);
                if (kind == 8) /* a failed rref value keeps no reference */
                    assert_int_equal(fr.refs, v ? 2 : 1);
                if (!atomic_load(&alloc_countdown_fired)) {
                    assert_non_null(v); /* past its last allocation: made */
                    tp_value_free(v);
                    break;
                }
                assert_null(v);
                failed++;
                assert_true(k < 64);
            }
        }
    }
    assert_true(failed >= ROUNDS * 14);
    assert_int_equal(view_borrow_released,
                     ROUNDS); /* a borrowed tensor made gives its memory back once */
    tp_value_free(parent);
    size_t after = held_bytes();
    if (after > before + 16 * 1024)
        fail_msg("%zu bytes held before the failures, %zu after", before, after);
    tp_value_free(tree);
}

/* A list that cannot get its room (realloc fails): NULL, its items freed. */
static void test_value_list_of_without_memory(void **state) {
    (void)state;
    if (!alloc_fault_in_use()) { /* under valgrind, or not GCC */
        skip();
        return;
    }
    fake_rref fr = {.refs = 1};
    atomic_store(&realloc_fail_min, 1);
    tp_value *l = tp_value_list_of(2, tp_value_int(1), tp_value_rref((tp_rref *)(void *)&fr));
    atomic_store(&realloc_fail_min, 0);
    assert_null(l);
    assert_int_equal(fr.refs, 1); /* the rref item was freed with the rest */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_value_scalars_read_back),
        cmocka_unit_test(test_value_list_of_without_memory),
        cmocka_unit_test(test_value_typed_read_wrong_kind),
        cmocka_unit_test(test_value_str_and_bytes_copied_and_terminated),
        cmocka_unit_test(test_value_list_append_and_get),
        cmocka_unit_test(test_value_map_keeps_order_and_replaces),
        cmocka_unit_test(test_value_map_find_duplicate),
        cmocka_unit_test(test_value_list_of_transfers_all),
        cmocka_unit_test(test_value_tree_one_owner_no_cycle),
        cmocka_unit_test(test_value_tree_depth_limit),
        cmocka_unit_test(test_value_tensor_contiguous_copy),
        cmocka_unit_test(test_value_tensor_strided_packs_row_major),
        cmocka_unit_test(test_value_tensor_permuted_3d_packs_row_major),
        cmocka_unit_test(test_value_tensor_broadcast_and_sliced),
        cmocka_unit_test(test_value_tensor_zeros_empty_and_scalar),
        cmocka_unit_test(test_value_tensor_rejects_bad_and_overflow),
        cmocka_unit_test(test_value_dtype_and_kind_names),
        cmocka_unit_test(test_value_clone_is_deep_and_equal),
        cmocka_unit_test(test_value_equal_rules),
        cmocka_unit_test(test_value_tuples),
        cmocka_unit_test(test_value_opaque_bytes),
        cmocka_unit_test(test_value_tensor_view),
        cmocka_unit_test(test_value_empty_tensor_with_huge_dims),
        cmocka_unit_test(test_value_tensor_view_of_borrowed),
        cmocka_unit_test(test_value_object_lifecycle),
        cmocka_unit_test(test_value_worker_info_copied),
        cmocka_unit_test(test_value_rref_holds_own_reference),
        cmocka_unit_test(test_value_format_reads_like_python),
        cmocka_unit_test(test_value_tensor_storage_shared_and_copy_on_write),
        cmocka_unit_test(test_value_tensor_view_keeps_parent),
        cmocka_unit_test(test_value_container_reads_of_the_wrong_kind),
        cmocka_unit_test(test_value_constructors_fail_clean_without_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
