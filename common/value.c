/*
 * value.c: the value model (spec/api.md VALUE-1..9). A value is a tree with
 * one owner: containers own their items, tensors own a reference to the
 * storage of their elements, an rref value owns one reference, an object
 * owns its state.
 *
 * Tensor storage is a reference-counted tpi_blob so that a frame can send a
 * large tensor straight from its memory and a received frame can lend its
 * bytes to the tensors decoded from it (spec/wire.md WIRE-10). A value
 * still behaves as the only owner of its elements: tp_tensor_data, the one
 * way to write them, first gives the tensor a private copy when a frame
 * still reads the shared bytes (copy on write).
 *
 * Sizes that come from callers (tensor shapes and strides) are checked
 * against overflow with the compiler's checked arithmetic; a value that
 * could not be packed or addressed is refused at construction, so every
 * later operation (pack, compare, encode) can rely on the numbers.
 */
#include "value.h"
#include "registry.h"

#include <math.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "limits.h"

typedef struct tpi_tensor {
    tp_dtype dtype;
    int ndim;
    int64_t shape[TP_TENSOR_NDIM_MAX];
    int64_t strides[TP_TENSOR_NDIM_MAX]; /* in elements, each >= 0 */
    int64_t numel;
    size_t span;       /* bytes from element [0,...,0] past the last element reached */
    uint8_t *data;     /* span bytes inside storage (never NULL) */
    tpi_blob *storage; /* one reference, held by this tensor */
} tpi_tensor;

typedef struct map_entry {
    char *key; /* NUL-terminated, no NUL inside */
    size_t len;
    tp_value *value;
} map_entry;

struct tp_value {
    tp_kind kind;
    /* The tree (VALUE-1): the container holding this value, NULL at a root;
     * and the levels of lists and maps from here down (0 for a scalar, 1
     * for a container of scalars), at most TPI_VALUE_DEPTH_MAX. */
    tp_value *parent;
    uint8_t height;
    uint8_t tuple;  /* a list that is a tuple (VALUE-11) */
    uint8_t opaque; /* bytes a language binding's own serialization made (VALUE-12) */
    union {
        int b;
        int64_t i;
        double d;
        struct {
            char *data; /* len bytes plus a NUL */
            size_t len;
        } blob;
        struct {
            tp_value **items;
            size_t len;
            size_t cap;
        } list;
        struct {
            map_entry *entries;
            size_t len;
            size_t cap;
        } map;
        tpi_tensor *tensor;
        tp_rref *rref;
        tp_worker_info *info;
        struct {
            char *class_name;
            void *state;
            void (*destroy)(void *state);
        } obj;
    } u;
};

/* ---- Kinds and dtypes ---------------------------------------------------- */

static const char *const kind_names[] = {
    "nil",  "bool", "int",    "float", "str",         "bytes",
    "list", "map",  "tensor", "rref",  "worker_info", "object",
};

const char *tp_kind_name(tp_kind kind) {
    if ((unsigned)kind >= sizeof kind_names / sizeof kind_names[0])
        return "invalid";
    return kind_names[kind];
}

static const struct {
    const char *name;
    size_t size;
    size_t align; /* complex numbers align as one component (C11 6.2.5p13) */
} dtype_info[TP_DTYPE_COUNT_] = {
    [TP_DTYPE_FLOAT32] = {"float32", 4, 4},       [TP_DTYPE_FLOAT64] = {"float64", 8, 8},
    [TP_DTYPE_FLOAT16] = {"float16", 2, 2},       [TP_DTYPE_BFLOAT16] = {"bfloat16", 2, 2},
    [TP_DTYPE_INT8] = {"int8", 1, 1},             [TP_DTYPE_INT16] = {"int16", 2, 2},
    [TP_DTYPE_INT32] = {"int32", 4, 4},           [TP_DTYPE_INT64] = {"int64", 8, 8},
    [TP_DTYPE_UINT8] = {"uint8", 1, 1},           [TP_DTYPE_BOOL] = {"bool", 1, 1},
    [TP_DTYPE_UINT16] = {"uint16", 2, 2},         [TP_DTYPE_UINT32] = {"uint32", 4, 4},
    [TP_DTYPE_UINT64] = {"uint64", 8, 8},         [TP_DTYPE_COMPLEX64] = {"complex64", 8, 4},
    [TP_DTYPE_COMPLEX128] = {"complex128", 16, 8},
};
_Static_assert(TP_DTYPE_COUNT_ == 15, "a new dtype needs a row in dtype_info");

size_t tp_dtype_size(tp_dtype dtype) {
    if ((unsigned)dtype >= TP_DTYPE_COUNT_)
        return 0;
    return dtype_info[dtype].size;
}

size_t tp_dtype_align(tp_dtype dtype) {
    if ((unsigned)dtype >= TP_DTYPE_COUNT_)
        return 0;
    /* The zero-copy decoder moves misaligned data down onto its 8-byte
     * count (WIRE-10): no dtype may need more than 8. */
    TPI_ASSERT(dtype_info[dtype].align > 0 && dtype_info[dtype].align <= 8);
    return dtype_info[dtype].align;
}

const char *tp_dtype_name(tp_dtype dtype) {
    if ((unsigned)dtype >= TP_DTYPE_COUNT_)
        return "invalid";
    return dtype_info[dtype].name;
}

tp_kind tp_value_kind(const tp_value *v) {
    return v ? v->kind : TP_KIND_NIL;
}

/* ---- Scalars and blobs ---------------------------------------------------- */

static tp_value *value_new(tp_kind kind) {
    tp_value *v = calloc(1, sizeof *v);
    if (v) {
        v->kind = kind;
        v->height = kind == TP_KIND_LIST || kind == TP_KIND_MAP;
    }
    return v;
}

/* ---- The tree (VALUE-1, VALUE-4) --------------------------------------------- */

/* Levels of containers above c plus c's own: c's depth counted from 1 at the root. */
static unsigned level_of(const tp_value *c) {
    unsigned n = 1;
    for (const tp_value *p = c->parent; p; p = p->parent)
        n++;
    return n;
}

/*
 * May item go into container c? It must be a root (one owner), not c or
 * one of c's ancestors (no cycle), and the tree must stay within
 * TPI_VALUE_DEPTH_MAX levels, so freeing, cloning, comparing and encoding
 * never recurse deeper than that.
 */
static tp_status check_adopt(const tp_value *c, const tp_value *item, const char *what) {
    if (item->parent)
        return tpi_fail(TP_EINVAL,
                        "%s: the item is already inside a list or map (a value has one "
                        "owner; insert a tp_value_clone)",
                        what);
    for (const tp_value *p = c; p; p = p->parent)
        if (p == item)
            return tpi_fail(TP_EINVAL, "%s: a list or map cannot hold itself", what);
    if (level_of(c) + item->height > TPI_VALUE_DEPTH_MAX)
        return tpi_fail(TP_ELIMIT, "%s: lists and maps would nest deeper than %d levels", what,
                        TPI_VALUE_DEPTH_MAX);
    return TP_OK;
}

/* Recomputes c's height from its items, then its ancestors' while they change. */
static void fix_heights(tp_value *c) {
    for (tp_value *v = c; v; v = v->parent) {
        unsigned h = 0;
        if (v->kind == TP_KIND_LIST)
            for (size_t i = 0; i < v->u.list.len; i++)
                h = v->u.list.items[i]->height > h ? v->u.list.items[i]->height : h;
        else
            for (size_t i = 0; i < v->u.map.len; i++)
                h = v->u.map.entries[i].value->height > h ? v->u.map.entries[i].value->height : h;
        if (v->height == h + 1)
            break;
        v->height = (uint8_t)(h + 1);
    }
}

/* item now belongs to c (checked): records it and raises the heights above. */
static void adopt(tp_value *c, tp_value *item) {
    item->parent = c;
    for (tp_value *v = c, *child = item; v; child = v, v = v->parent) {
        if (v->height >= child->height + 1)
            break;
        v->height = (uint8_t)(child->height + 1);
    }
}

tp_value *tp_value_nil(void) {
    return value_new(TP_KIND_NIL);
}

tp_value *tp_value_bool(int b) {
    tp_value *v = value_new(TP_KIND_BOOL);
    if (v)
        v->u.b = b != 0;
    return v;
}

tp_value *tp_value_int(int64_t i) {
    tp_value *v = value_new(TP_KIND_INT);
    if (v)
        v->u.i = i;
    return v;
}

tp_value *tp_value_float(double d) {
    tp_value *v = value_new(TP_KIND_FLOAT);
    if (v)
        v->u.d = d;
    return v;
}

/* A str or bytes value: len bytes copied and a NUL after them. */
static tp_value *blob_new(tp_kind kind, const void *data, size_t len) {
    if ((!data && len > 0) || len == SIZE_MAX)
        return NULL;
    tp_value *v = value_new(kind);
    if (!v)
        return NULL;
    v->u.blob.data = malloc(len + 1);
    if (!v->u.blob.data) {
        free(v);
        return NULL;
    }
    if (len > 0)
        memcpy(v->u.blob.data, data, len);
    v->u.blob.data[len] = '\0';
    v->u.blob.len = len;
    return v;
}

tp_value *tp_value_str(const char *s) {
    return s ? blob_new(TP_KIND_STR, s, strlen(s)) : NULL;
}

tp_value *tp_value_strn(const char *s, size_t len) {
    return blob_new(TP_KIND_STR, s, len);
}

tp_value *tp_value_bytes(const void *data, size_t len) {
    return blob_new(TP_KIND_BYTES, data, len);
}

tp_value *tp_value_opaque(const void *data, size_t len) {
    tp_value *v = blob_new(TP_KIND_BYTES, data, len);
    if (v)
        v->opaque = 1;
    return v;
}

int tp_bytes_is_opaque(const tp_value *v) {
    return v && v->kind == TP_KIND_BYTES && v->opaque;
}

tp_value *tp_value_list(void) {
    return value_new(TP_KIND_LIST);
}

tp_value *tp_value_tuple(void) {
    tp_value *v = value_new(TP_KIND_LIST);
    if (v)
        v->tuple = 1;
    return v;
}

int tp_list_is_tuple(const tp_value *list) {
    return list && list->kind == TP_KIND_LIST && list->tuple;
}

tp_value *tp_value_map(void) {
    return value_new(TP_KIND_MAP);
}

tp_value *tp_value_worker_info(const tp_worker_info *info) {
    if (!info)
        return NULL;
    tp_value *v = value_new(TP_KIND_WORKER_INFO);
    if (!v)
        return NULL;
    v->u.info = calloc(1, sizeof *v->u.info);
    if (!v->u.info) {
        free(v);
        return NULL;
    }
    v->u.info->id = info->id;
    memcpy(v->u.info->name, info->name, strnlen(info->name, TP_NAME_LEN_MAX));
    return v;
}

tp_value *tp_value_rref(tp_rref *rref) {
    if (!rref)
        return NULL;
    tp_rref *own = tp_rref_clone(rref);
    if (!own)
        return NULL;
    tp_value *v = tpi_value_rref_adopt(own);
    if (!v)
        tp_rref_release(own);
    return v;
}

tp_value *tpi_value_rref_adopt(tp_rref *rref) {
    TPI_ASSERT(rref != NULL);
    tp_value *v = value_new(TP_KIND_RREF);
    if (v)
        v->u.rref = rref;
    return v;
}

tp_value *tp_value_object(const char *class_name, void *state, void (*destroy)(void *state)) {
    if (!tpi_name_valid(class_name, NULL)) /* a class name names methods (METHOD-1) */
        return NULL;
    tp_value *v = value_new(TP_KIND_OBJECT);
    if (!v)
        return NULL;
    v->u.obj.class_name = strdup(class_name);
    if (!v->u.obj.class_name) {
        free(v);
        return NULL;
    }
    v->u.obj.state = state;
    v->u.obj.destroy = destroy;
    return v;
}

/* ---- Shared storage ---------------------------------------------------------- */

/* The bytes of a block from tpi_blob_new start here, aligned for any type. */
#define BLOB_HEAD ((sizeof(tpi_blob) + alignof(max_align_t) - 1) / alignof(max_align_t) * \
                   alignof(max_align_t))

static void blob_free(tpi_blob *b) {
    free(b);
}

tpi_blob *tpi_blob_new(size_t len, int zero) {
    size_t alloc = len > 0 ? len : 1;
    if (alloc > SIZE_MAX - BLOB_HEAD)
        return NULL;
    tpi_blob *b = zero ? calloc(1, BLOB_HEAD + alloc) : malloc(BLOB_HEAD + alloc);
    if (!b)
        return NULL;
    atomic_init(&b->refs, 1);
    b->data = (uint8_t *)b + BLOB_HEAD;
    b->len = len;
    b->release = blob_free;
    b->ctx = NULL;
    return b;
}

void tpi_blob_ref(tpi_blob *b) {
    TPI_ASSERT(b != NULL);
    size_t old = atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    TPI_ASSERT(old > 0);
}

void tpi_blob_unref(tpi_blob *b) {
    if (!b)
        return;
    size_t old = atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel);
    TPI_ASSERT(old > 0);
    if (old == 1)
        b->release(b);
}

/* A view's block: its bytes lie in the parent block, which it keeps alive. */
static void view_release(tpi_blob *b) {
    tpi_blob_unref(b->ctx);
    free(b);
}

/* ---- Tensors --------------------------------------------------------------- */

/*
 * Validates a tensor's layout and fills t's dtype, ndim, shape, strides,
 * numel and span. Every product and sum is checked: the packed size
 * (numel * element size) and the span the strides reach must both fit.
 */
static tp_status tensor_layout(tp_dtype dtype, int ndim, const int64_t *shape,
                               const int64_t *strides, tpi_tensor *t) {
    int64_t elem = (int64_t)tp_dtype_size(dtype);
    if (elem == 0)
        return TP_EINVAL;
    if (ndim < 0 || ndim > TP_TENSOR_NDIM_MAX || (ndim > 0 && !shape))
        return TP_EINVAL;
    t->dtype = dtype;
    t->ndim = ndim;
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return TP_EINVAL;
        if (__builtin_mul_overflow(numel, shape[d], &numel))
            return TP_ERANGE;
        t->shape[d] = shape[d];
    }
    if (strides) {
        for (int d = 0; d < ndim; d++) {
            if (strides[d] < 0)
                return TP_EINVAL;
            t->strides[d] = strides[d];
        }
    } else {
        /* Row-major; a zero-size dimension counts as 1, as PyTorch does. */
        int64_t s = 1;
        for (int d = ndim - 1; d >= 0; d--) {
            t->strides[d] = s;
            if (d > 0 && __builtin_mul_overflow(s, shape[d] > 1 ? shape[d] : 1, &s))
                return TP_ERANGE;
        }
    }
    int64_t packed, span_elems = 0, span;
    if (__builtin_mul_overflow(numel, elem, &packed))
        return TP_ERANGE;
    if (numel > 0) {
        span_elems = 1;
        for (int d = 0; d < ndim; d++) {
            int64_t ext;
            if (__builtin_mul_overflow(shape[d] - 1, t->strides[d], &ext) ||
                __builtin_add_overflow(span_elems, ext, &span_elems))
                return TP_ERANGE;
        }
    }
    if (__builtin_mul_overflow(span_elems, elem, &span))
        return TP_ERANGE;
    if ((uint64_t)span >= SIZE_MAX || (uint64_t)packed >= SIZE_MAX)
        return TP_ERANGE;
    t->numel = numel;
    t->span = (size_t)span;
    return TP_OK;
}

tp_status tpi_tensor_check(tp_dtype dtype, int ndim, const int64_t *shape, uint64_t *packed) {
    tpi_tensor t;
    tp_status st = tensor_layout(dtype, ndim, shape, NULL, &t);
    if (st == TP_OK && packed)
        *packed = (uint64_t)t.numel * tp_dtype_size(dtype);
    return st;
}

tp_value *tp_value_tensor(tp_dtype dtype, int ndim, const int64_t *shape, const int64_t *strides,
                          const void *data) {
    tpi_tensor *t = malloc(sizeof *t);
    if (!t)
        return NULL;
    if (tensor_layout(dtype, ndim, shape, strides, t) != TP_OK) {
        free(t);
        return NULL;
    }
    t->storage = tpi_blob_new(t->span, data == NULL);
    tp_value *v = t->storage ? value_new(TP_KIND_TENSOR) : NULL;
    if (!v) {
        tpi_blob_unref(t->storage);
        free(t);
        return NULL;
    }
    t->data = t->storage->data;
    if (data && t->span > 0)
        memcpy(t->data, data, t->span);
    v->u.tensor = t;
    return v;
}

/* A borrowed block: the caller's bytes, handed back through its callback. */
typedef struct borrowed_blob {
    tpi_blob b;
    tp_release_fn release;
    void *ctx;
} borrowed_blob;

static void borrowed_release(tpi_blob *b) {
    borrowed_blob *bb = (borrowed_blob *)b;
    bb->release(bb->ctx); /* last: may run on any thread, the transport's included */
    free(bb);
}

tp_value *tp_value_tensor_borrow(tp_dtype dtype, int ndim, const int64_t *shape, void *data,
                                 tp_release_fn release, void *ctx) {
    size_t align = tp_dtype_align(dtype);
    if (!release || align == 0 || !data || (uintptr_t)data % align != 0)
        return NULL;
    tpi_tensor *t = malloc(sizeof *t);
    if (!t)
        return NULL;
    if (tensor_layout(dtype, ndim, shape, NULL, t) != TP_OK) {
        free(t);
        return NULL;
    }
    borrowed_blob *bb = malloc(sizeof *bb);
    tp_value *v = bb ? value_new(TP_KIND_TENSOR) : NULL;
    if (!v) {
        free(bb);
        free(t);
        return NULL;
    }
    atomic_init(&bb->b.refs, 1);
    bb->b.data = data;
    bb->b.len = t->span;
    bb->b.release = borrowed_release;
    bb->b.ctx = NULL;
    bb->release = release;
    bb->ctx = ctx;
    t->storage = &bb->b;
    t->data = data;
    v->u.tensor = t;
    return v;
}

tp_value *tpi_value_tensor_view(tp_dtype dtype, int ndim, const int64_t *shape,
                                tpi_blob *parent, uint8_t *data) {
    TPI_ASSERT(parent != NULL && data != NULL);
    TPI_ASSERT((uintptr_t)data % tp_dtype_align(dtype) == 0);
    tpi_tensor *t = malloc(sizeof *t);
    if (!t)
        return NULL;
    tp_status st = tensor_layout(dtype, ndim, shape, NULL, t);
    TPI_ASSERT(st == TP_OK); /* the caller checked it with tpi_tensor_check */
    (void)st;
    TPI_ASSERT(data >= parent->data && t->span <= parent->len &&
               (size_t)(data - parent->data) <= parent->len - t->span);
    tpi_blob *b = malloc(sizeof *b);
    tp_value *v = b ? value_new(TP_KIND_TENSOR) : NULL;
    if (!v) {
        free(b);
        free(t);
        return NULL;
    }
    atomic_init(&b->refs, 1);
    b->data = data;
    b->len = t->span;
    b->release = view_release;
    b->ctx = parent;
    tpi_blob_ref(parent);
    t->storage = b;
    t->data = data;
    v->u.tensor = t;
    return v;
}

static const tpi_tensor *as_tensor(const tp_value *v) {
    return v && v->kind == TP_KIND_TENSOR ? v->u.tensor : NULL;
}

tp_dtype tp_tensor_dtype(const tp_value *v) {
    const tpi_tensor *t = as_tensor(v);
    return t ? t->dtype : (tp_dtype)0;
}

int tp_tensor_ndim(const tp_value *v) {
    const tpi_tensor *t = as_tensor(v);
    return t ? t->ndim : 0;
}

const int64_t *tp_tensor_shape(const tp_value *v) {
    const tpi_tensor *t = as_tensor(v);
    return t ? t->shape : NULL;
}

const int64_t *tp_tensor_strides(const tp_value *v) {
    const tpi_tensor *t = as_tensor(v);
    return t ? t->strides : NULL;
}

int64_t tp_tensor_numel(const tp_value *v) {
    const tpi_tensor *t = as_tensor(v);
    return t ? t->numel : 0;
}

/* Contiguous row-major, ignoring the strides of size-1 dimensions (as PyTorch). */
static int tensor_contiguous(const tpi_tensor *t) {
    if (t->numel == 0)
        return 1;
    int64_t expected = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != expected)
            return 0;
        expected *= t->shape[d]; /* <= numel: no overflow */
    }
    return 1;
}

int tp_tensor_is_contiguous(const tp_value *v) {
    const tpi_tensor *t = as_tensor(v);
    return t ? tensor_contiguous(t) : 0;
}

/*
 * Writable elements. When a frame still holds the storage (the tensor was
 * sent without a copy and its bytes may not be written out yet), the tensor
 * first takes a private copy, so that a write never changes what a call
 * already made sends. NULL when that copy cannot be allocated.
 */
void *tp_tensor_data(tp_value *v) {
    if (!v || v->kind != TP_KIND_TENSOR)
        return NULL;
    tpi_tensor *t = v->u.tensor;
    if (atomic_load_explicit(&t->storage->refs, memory_order_acquire) == 1)
        return t->data; /* ours alone: nobody else can take a reference now */
    tpi_blob *own = tpi_blob_new(t->span, 0);
    if (!own)
        return NULL;
    if (t->span > 0)
        memcpy(own->data, t->data, t->span);
    tpi_blob_unref(t->storage);
    t->storage = own;
    t->data = own->data;
    return t->data;
}

const void *tp_tensor_cdata(const tp_value *v) {
    const tpi_tensor *t = as_tensor(v);
    return t ? t->data : NULL;
}

tpi_blob *tpi_tensor_storage(const tp_value *v, const void **data) {
    const tpi_tensor *t = as_tensor(v);
    TPI_ASSERT(t != NULL && data != NULL);
    if (!tensor_contiguous(t))
        return NULL;
    *data = t->data;
    return t->storage;
}

tp_value *tp_tensor_view(const tp_value *v) {
    const tpi_tensor *t = as_tensor(v);
    if (!t || !tensor_contiguous(t))
        return NULL;
    return tpi_value_tensor_view(t->dtype, t->ndim, t->shape, t->storage, t->data);
}

uint64_t tpi_tensor_packed_size(const tp_value *v) {
    const tpi_tensor *t = as_tensor(v);
    TPI_ASSERT(t != NULL);
    return (uint64_t)t->numel * tp_dtype_size(t->dtype);
}

/*
 * Walks a tensor one row (the last dimension) at a time. off is the
 * element offset of the current row's first element; step the stride
 * within a row. A 0-d tensor is one row of one element.
 */
typedef struct row_iter {
    const tpi_tensor *t;
    int64_t idx[TP_TENSOR_NDIM_MAX];
    int64_t off;
    int64_t row_len;
    int64_t step;
    int64_t rows; /* rows left, the current one included */
} row_iter;

static void row_iter_init(row_iter *it, const tpi_tensor *t) {
    memset(it, 0, sizeof *it);
    it->t = t;
    it->row_len = t->ndim ? t->shape[t->ndim - 1] : 1;
    it->step = t->ndim ? t->strides[t->ndim - 1] : 1;
    it->rows = t->numel ? t->numel / it->row_len : 0;
}

static void row_iter_next(row_iter *it) {
    const tpi_tensor *t = it->t;
    it->rows--;
    for (int d = t->ndim - 2; d >= 0; d--) {
        if (it->idx[d] + 1 < t->shape[d]) {
            it->idx[d]++;
            it->off += t->strides[d];
            return;
        }
        it->off -= t->strides[d] * it->idx[d]; /* within the checked span */
        it->idx[d] = 0;
    }
}

void tpi_tensor_pack(const tp_value *v, void *dst) {
    const tpi_tensor *t = as_tensor(v);
    TPI_ASSERT(t != NULL && (dst != NULL || t->numel == 0));
    size_t elem = tp_dtype_size(t->dtype);
    if (tensor_contiguous(t)) {
        if (t->numel > 0)
            memcpy(dst, t->data, (size_t)t->numel * elem);
        return;
    }
    uint8_t *out = dst;
    row_iter it;
    for (row_iter_init(&it, t); it.rows > 0; row_iter_next(&it)) {
        const uint8_t *row = t->data + (size_t)it.off * elem;
        if (it.step == 1) {
            memcpy(out, row, (size_t)it.row_len * elem);
            out += (size_t)it.row_len * elem;
            continue;
        }
        for (int64_t i = 0; i < it.row_len; i++, out += elem)
            memcpy(out, row + (size_t)(i * it.step) * elem, elem);
    }
}

static int tensor_equal(const tpi_tensor *a, const tpi_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return 0;
    size_t elem = tp_dtype_size(a->dtype);
    row_iter ia, ib;
    row_iter_init(&ia, a);
    row_iter_init(&ib, b);
    for (; ia.rows > 0; row_iter_next(&ia), row_iter_next(&ib)) {
        const uint8_t *ra = a->data + (size_t)ia.off * elem;
        const uint8_t *rb = b->data + (size_t)ib.off * elem;
        if (ia.step == 1 && ib.step == 1) {
            if (memcmp(ra, rb, (size_t)ia.row_len * elem) != 0)
                return 0;
            continue;
        }
        for (int64_t i = 0; i < ia.row_len; i++)
            if (memcmp(ra + (size_t)(i * ia.step) * elem, rb + (size_t)(i * ib.step) * elem,
                       elem) != 0)
                return 0;
    }
    return 1;
}

static tp_value *tensor_clone(const tpi_tensor *t) {
    return tp_value_tensor(t->dtype, t->ndim, t->shape, t->strides, t->data);
}

/* ---- Lists and maps -------------------------------------------------------- */

/* Grows an array of elem-sized slots so that len + n fit. 0 on exhaustion. */
static int array_reserve(void **items, size_t *cap, size_t len, size_t n, size_t elem) {
    if (n <= *cap - len)
        return 1;
    if (n > SIZE_MAX / elem - len)
        return 0;
    size_t want = *cap ? *cap : 4;
    while (want < len + n)
        want = want > SIZE_MAX / elem / 2 ? len + n : want * 2;
    void *p = realloc(*items, want * elem);
    if (!p)
        return 0;
    *items = p;
    *cap = want;
    return 1;
}

static tp_status wrong_kind(const tp_value *v, tp_kind want) {
    if (!v)
        return tpi_fail(TP_EINVAL, "expected %s, got NULL", tp_kind_name(want));
    return tpi_fail(TP_ETYPE, "expected %s, got %s", tp_kind_name(want), tp_kind_name(v->kind));
}

tp_status tpi_list_reserve(tp_value *list, size_t n) {
    TPI_ASSERT(list && list->kind == TP_KIND_LIST);
    void *items = list->u.list.items;
    if (!array_reserve(&items, &list->u.list.cap, list->u.list.len, n, sizeof(tp_value *)))
        return tpi_fail(TP_ENOMEM, "out of memory growing a list to %zu items",
                        list->u.list.len + n);
    list->u.list.items = items;
    return TP_OK;
}

tp_status tp_list_append(tp_value *list, tp_value *item) {
    if (!list || list->kind != TP_KIND_LIST)
        return wrong_kind(list, TP_KIND_LIST);
    if (!item)
        return tpi_fail(TP_EINVAL, "list append: item is NULL");
    tp_status st = check_adopt(list, item, "list append");
    if (st == TP_OK)
        st = tpi_list_reserve(list, 1);
    if (st != TP_OK)
        return st;
    list->u.list.items[list->u.list.len++] = item;
    adopt(list, item);
    return TP_OK;
}

size_t tp_list_len(const tp_value *list) {
    return list && list->kind == TP_KIND_LIST ? list->u.list.len : 0;
}

const tp_value *tp_list_get(const tp_value *list, size_t index) {
    if (!list || list->kind != TP_KIND_LIST || index >= list->u.list.len)
        return NULL;
    return list->u.list.items[index];
}

tp_status tpi_map_reserve(tp_value *map, size_t n) {
    TPI_ASSERT(map && map->kind == TP_KIND_MAP);
    void *entries = map->u.map.entries;
    if (!array_reserve(&entries, &map->u.map.cap, map->u.map.len, n, sizeof(map_entry)))
        return tpi_fail(TP_ENOMEM, "out of memory growing a map to %zu entries",
                        map->u.map.len + n);
    map->u.map.entries = entries;
    return TP_OK;
}

tp_status tpi_map_push(tp_value *map, const char *key, size_t len, tp_value *item) {
    TPI_ASSERT(map && map->kind == TP_KIND_MAP && key && item && len < SIZE_MAX);
    TPI_ASSERT(memchr(key, '\0', len) == NULL);
    tp_status st = check_adopt(map, item, "map set");
    if (st == TP_OK)
        st = tpi_map_reserve(map, 1);
    if (st != TP_OK)
        return st;
    char *copy = malloc(len + 1);
    if (!copy)
        return tpi_fail(TP_ENOMEM, "out of memory copying a map key of %zu bytes", len);
    memcpy(copy, key, len);
    copy[len] = '\0';
    map_entry *e = &map->u.map.entries[map->u.map.len++];
    e->key = copy;
    e->len = len;
    e->value = item;
    adopt(map, item);
    return TP_OK;
}

static map_entry *map_find(const tp_value *map, const char *key, size_t len) {
    for (size_t i = 0; i < map->u.map.len; i++) {
        map_entry *e = &map->u.map.entries[i];
        if (e->len == len && memcmp(e->key, key, len) == 0)
            return e;
    }
    return NULL;
}

tp_status tp_map_set(tp_value *map, const char *key, tp_value *item) {
    if (!map || map->kind != TP_KIND_MAP)
        return wrong_kind(map, TP_KIND_MAP);
    if (!key || !item)
        return tpi_fail(TP_EINVAL, "map set: %s is NULL", key ? "item" : "key");
    size_t len = strlen(key);
    map_entry *e = map_find(map, key, len);
    if (e && e->value == item)
        return TP_OK; /* already there */
    if (e) {
        tp_status st = check_adopt(map, item, "map set");
        if (st != TP_OK)
            return st;
        tp_value *old = e->value;
        old->parent = NULL;
        tp_value_free(old);
        e->value = item;
        adopt(map, item);
        fix_heights(map); /* the old item may have been the deepest */
        return TP_OK;
    }
    return tpi_map_push(map, key, len, item);
}

size_t tp_map_len(const tp_value *map) {
    return map && map->kind == TP_KIND_MAP ? map->u.map.len : 0;
}

const tp_value *tp_map_get(const tp_value *map, const char *key) {
    if (!map || map->kind != TP_KIND_MAP || !key)
        return NULL;
    map_entry *e = map_find(map, key, strlen(key));
    return e ? e->value : NULL;
}

const char *tp_map_key_at(const tp_value *map, size_t index) {
    if (!map || map->kind != TP_KIND_MAP || index >= map->u.map.len)
        return NULL;
    return map->u.map.entries[index].key;
}

size_t tpi_map_key_len_at(const tp_value *map, size_t index) {
    TPI_ASSERT(map && map->kind == TP_KIND_MAP && index < map->u.map.len);
    return map->u.map.entries[index].len;
}

const tp_value *tp_map_value_at(const tp_value *map, size_t index) {
    if (!map || map->kind != TP_KIND_MAP || index >= map->u.map.len)
        return NULL;
    return map->u.map.entries[index].value;
}

static int entry_cmp(const void *pa, const void *pb) {
    const map_entry *a = *(const map_entry *const *)pa;
    const map_entry *b = *(const map_entry *const *)pb;
    int c = memcmp(a->key, b->key, a->len < b->len ? a->len : b->len);
    if (c != 0)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return a < b ? -1 : a > b; /* equal keys: by position */
}

tp_status tpi_map_find_duplicate(const tp_value *map, size_t *dup_index) {
    TPI_ASSERT(map && map->kind == TP_KIND_MAP && dup_index);
    *dup_index = SIZE_MAX;
    size_t n = map->u.map.len;
    if (n < 2)
        return TP_OK;
    /* Sorting keeps a hostile map of many keys at O(n log n), not O(n^2). */
    const map_entry **sorted = malloc(n * sizeof *sorted);
    if (!sorted)
        return tpi_fail(TP_ENOMEM, "out of memory checking %zu map keys", n);
    for (size_t i = 0; i < n; i++)
        sorted[i] = &map->u.map.entries[i];
    qsort(sorted, n, sizeof *sorted, entry_cmp);
    for (size_t i = 1; i < n; i++) {
        const map_entry *a = sorted[i - 1], *b = sorted[i];
        if (a->len == b->len && memcmp(a->key, b->key, a->len) == 0) {
            *dup_index = (size_t)(b - map->u.map.entries);
            break;
        }
    }
    free(sorted);
    return TP_OK;
}

tp_value *tp_value_list_of(size_t n, ...) {
    tp_value *list = tp_value_list();
    if (list && tpi_list_reserve(list, n) != TP_OK) {
        tp_value_free(list);
        list = NULL;
    }
    int ok = list != NULL;
    va_list ap;
    va_start(ap, n);
    for (size_t i = 0; i < n; i++) {
        tp_value *item = va_arg(ap, tp_value *);
        if (ok && item && check_adopt(list, item, "list of") == TP_OK) {
            list->u.list.items[list->u.list.len++] = item; /* reserved above */
            adopt(list, item);
        } else {
            ok = 0;
            tp_value_free(item); /* a no-op for an item another container owns */
        }
    }
    va_end(ap);
    if (!ok) {
        tp_value_free(list);
        return NULL;
    }
    return list;
}

/* ---- Typed reads ------------------------------------------------------------ */

static tp_status check_read(const tp_value *v, tp_kind want, const void *out) {
    if (!v || v->kind != want)
        return wrong_kind(v, want);
    if (!out)
        return tpi_fail(TP_EINVAL, "reading a %s: the output pointer is NULL", tp_kind_name(want));
    return TP_OK;
}

tp_status tp_value_get_bool(const tp_value *v, int *out) {
    tp_status st = check_read(v, TP_KIND_BOOL, out);
    if (st == TP_OK)
        *out = v->u.b;
    return st;
}

tp_status tp_value_get_int(const tp_value *v, int64_t *out) {
    tp_status st = check_read(v, TP_KIND_INT, out);
    if (st == TP_OK)
        *out = v->u.i;
    return st;
}

tp_status tp_value_get_float(const tp_value *v, double *out) {
    if (v && v->kind == TP_KIND_INT && out) {
        *out = (double)v->u.i;
        return TP_OK;
    }
    tp_status st = check_read(v, TP_KIND_FLOAT, out);
    if (st == TP_OK)
        *out = v->u.d;
    return st;
}

static tp_status get_blob(const tp_value *v, tp_kind want, const void **data, size_t *len) {
    tp_status st = check_read(v, want, data);
    if (st != TP_OK)
        return st;
    *data = v->u.blob.data;
    if (len)
        *len = v->u.blob.len;
    return TP_OK;
}

tp_status tp_value_get_str(const tp_value *v, const char **data, size_t *len) {
    const void *p = NULL;
    tp_status st = get_blob(v, TP_KIND_STR, data ? &p : NULL, len);
    if (st == TP_OK)
        *data = p;
    return st;
}

tp_status tp_value_get_bytes(const tp_value *v, const void **data, size_t *len) {
    return get_blob(v, TP_KIND_BYTES, data, len);
}

tp_status tp_value_get_worker_info(const tp_value *v, tp_worker_info *out) {
    tp_status st = check_read(v, TP_KIND_WORKER_INFO, out);
    if (st == TP_OK)
        *out = *v->u.info;
    return st;
}

tp_status tp_value_get_rref(const tp_value *v, tp_rref **out) {
    tp_status st = check_read(v, TP_KIND_RREF, out);
    if (st == TP_OK)
        *out = v->u.rref;
    return st;
}

tp_status tp_value_get_object(const tp_value *v, const char **class_name, void **state) {
    if (!v || v->kind != TP_KIND_OBJECT)
        return wrong_kind(v, TP_KIND_OBJECT);
    if (class_name)
        *class_name = v->u.obj.class_name;
    if (state)
        *state = v->u.obj.state;
    return TP_OK;
}

/* ---- Free, clone, equal ------------------------------------------------------ */

static void value_free(tp_value *v);

void tp_value_free(tp_value *v) {
    /* A value inside a list or map is its container's to free (VALUE-1). */
    if (!v || v->parent)
        return;
    value_free(v);
}

/* Frees v and its items; recursion is bounded by TPI_VALUE_DEPTH_MAX. */
static void value_free(tp_value *v) {
    switch (v->kind) {
    case TP_KIND_STR:
    case TP_KIND_BYTES:
        free(v->u.blob.data);
        break;
    case TP_KIND_LIST:
        for (size_t i = 0; i < v->u.list.len; i++)
            value_free(v->u.list.items[i]);
        free(v->u.list.items);
        break;
    case TP_KIND_MAP:
        for (size_t i = 0; i < v->u.map.len; i++) {
            free(v->u.map.entries[i].key);
            value_free(v->u.map.entries[i].value);
        }
        free(v->u.map.entries);
        break;
    case TP_KIND_TENSOR:
        tpi_blob_unref(v->u.tensor->storage);
        free(v->u.tensor);
        break;
    case TP_KIND_RREF:
        tp_rref_release(v->u.rref);
        break;
    case TP_KIND_WORKER_INFO:
        free(v->u.info);
        break;
    case TP_KIND_OBJECT:
        if (v->u.obj.destroy)
            v->u.obj.destroy(v->u.obj.state);
        free(v->u.obj.class_name);
        break;
    default:
        break;
    }
    free(v);
}

static tp_value *list_clone(const tp_value *v) {
    tp_value *c = v->tuple ? tp_value_tuple() : tp_value_list();
    if (!c || tpi_list_reserve(c, v->u.list.len) != TP_OK)
        goto fail;
    for (size_t i = 0; i < v->u.list.len; i++) {
        tp_value *item = tp_value_clone(v->u.list.items[i]);
        if (!item)
            goto fail;
        c->u.list.items[c->u.list.len++] = item;
        adopt(c, item);
    }
    return c;
fail:
    tp_value_free(c);
    return NULL;
}

static tp_value *map_clone(const tp_value *v) {
    tp_value *c = tp_value_map();
    if (!c || tpi_map_reserve(c, v->u.map.len) != TP_OK)
        goto fail;
    for (size_t i = 0; i < v->u.map.len; i++) {
        const map_entry *e = &v->u.map.entries[i];
        tp_value *item = tp_value_clone(e->value);
        if (!item)
            goto fail;
        if (tpi_map_push(c, e->key, e->len, item) != TP_OK) {
            tp_value_free(item);
            goto fail;
        }
    }
    return c;
fail:
    tp_value_free(c);
    return NULL;
}

tp_value *tp_value_clone(const tp_value *v) {
    if (!v)
        return NULL;
    switch (v->kind) {
    case TP_KIND_NIL:
        return tp_value_nil();
    case TP_KIND_BOOL:
        return tp_value_bool(v->u.b);
    case TP_KIND_INT:
        return tp_value_int(v->u.i);
    case TP_KIND_FLOAT:
        return tp_value_float(v->u.d);
    case TP_KIND_STR:
        return blob_new(v->kind, v->u.blob.data, v->u.blob.len);
    case TP_KIND_BYTES:
        return v->opaque ? tp_value_opaque(v->u.blob.data, v->u.blob.len)
                         : blob_new(v->kind, v->u.blob.data, v->u.blob.len);
    case TP_KIND_LIST:
        return list_clone(v);
    case TP_KIND_MAP:
        return map_clone(v);
    case TP_KIND_TENSOR:
        return tensor_clone(v->u.tensor);
    case TP_KIND_RREF:
        return tp_value_rref(v->u.rref);
    case TP_KIND_WORKER_INFO:
        return tp_value_worker_info(v->u.info);
    case TP_KIND_OBJECT:
    default:
        return NULL; /* objects live on their owner only (VALUE-8) */
    }
}

static int map_equal(const tp_value *a, const tp_value *b) {
    if (a->u.map.len != b->u.map.len)
        return 0;
    /* Keys are unique in both, so "every key of a is in b with an equal
     * value" is equality. Same order is the common case and costs O(n). */
    for (size_t i = 0; i < a->u.map.len; i++) {
        const map_entry *ea = &a->u.map.entries[i];
        const map_entry *eb = &b->u.map.entries[i];
        if (ea->len != eb->len || memcmp(ea->key, eb->key, ea->len) != 0)
            eb = map_find(b, ea->key, ea->len);
        if (!eb || !tp_value_equal(ea->value, eb->value))
            return 0;
    }
    return 1;
}

int tp_value_equal(const tp_value *a, const tp_value *b) {
    if (a == b)
        return 1;
    if (!a || !b || a->kind != b->kind)
        return 0;
    switch (a->kind) {
    case TP_KIND_NIL:
        return 1;
    case TP_KIND_BOOL:
        return a->u.b == b->u.b;
    case TP_KIND_INT:
        return a->u.i == b->u.i;
    case TP_KIND_FLOAT:
        /* Numerically equal, or both NaN: a value equals its own copy. */
        return a->u.d == b->u.d || (isnan(a->u.d) && isnan(b->u.d));
    case TP_KIND_STR:
    case TP_KIND_BYTES:
        return a->u.blob.len == b->u.blob.len && a->opaque == b->opaque &&
               memcmp(a->u.blob.data, b->u.blob.data, a->u.blob.len) == 0;
    case TP_KIND_LIST:
        if (a->u.list.len != b->u.list.len || a->tuple != b->tuple)
            return 0;
        for (size_t i = 0; i < a->u.list.len; i++)
            if (!tp_value_equal(a->u.list.items[i], b->u.list.items[i]))
                return 0;
        return 1;
    case TP_KIND_MAP:
        return map_equal(a, b);
    case TP_KIND_TENSOR:
        return tensor_equal(a->u.tensor, b->u.tensor);
    case TP_KIND_RREF:
        return a->u.rref == b->u.rref;
    case TP_KIND_WORKER_INFO:
        return a->u.info->id == b->u.info->id && strcmp(a->u.info->name, b->u.info->name) == 0;
    case TP_KIND_OBJECT:
        return a->u.obj.state == b->u.obj.state;
    default:
        return 0;
    }
}

/* ---- Format ------------------------------------------------------------------ */

/* A bounded writer: appends until the buffer is full, always terminated. */
typedef struct fmt_out {
    char *buf;
    size_t cap;
    size_t len;
} fmt_out;

static int fmt_full(const fmt_out *o) {
    return o->cap == 0 || o->len + 1 >= o->cap;
}

static void fmt_put(fmt_out *o, const char *s, size_t n) {
    if (fmt_full(o))
        return;
    size_t room = o->cap - 1 - o->len;
    if (n > room)
        n = room;
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    o->buf[o->len] = '\0';
}

static void fmt_puts(fmt_out *o, const char *s) {
    fmt_put(o, s, strlen(s));
}

static void fmt_printf(fmt_out *o, const char *fmt, ...) TPI_PRINTF(2, 3);
static void fmt_printf(fmt_out *o, const char *fmt, ...) {
    char tmp[160];
    va_list ap;
    va_start(ap, fmt);
    size_t n = tpi_vformat(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    fmt_put(o, tmp, n);
}

/* Python-like repr of a double: the shortest text that reads back equal. */
static void fmt_float(fmt_out *o, double d) {
    if (isnan(d)) {
        fmt_puts(o, "nan");
        return;
    }
    if (isinf(d)) {
        fmt_puts(o, d > 0 ? "inf" : "-inf");
        return;
    }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    fmt_puts(o, tmp);
    if (strpbrk(tmp, ".e") == NULL)
        fmt_puts(o, ".0");
}

static void fmt_quoted(fmt_out *o, const char *s, size_t n, int escape_high) {
    fmt_put(o, "'", 1);
    for (size_t i = 0; i < n && !fmt_full(o); i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\' || c == '\'') {
            char esc[2] = {'\\', (char)c};
            fmt_put(o, esc, 2);
        } else if (c == '\n') {
            fmt_puts(o, "\\n");
        } else if (c < 0x20 || c == 0x7f || (escape_high && c >= 0x80)) {
            fmt_printf(o, "\\x%02x", c);
        } else {
            fmt_put(o, (const char *)&c, 1);
        }
    }
    fmt_put(o, "'", 1);
}

static void fmt_value(fmt_out *o, const tp_value *v) {
    if (fmt_full(o))
        return;
    if (!v) {
        fmt_puts(o, "NULL");
        return;
    }
    switch (v->kind) {
    case TP_KIND_NIL:
        fmt_puts(o, "None");
        break;
    case TP_KIND_BOOL:
        fmt_puts(o, v->u.b ? "True" : "False");
        break;
    case TP_KIND_INT:
        fmt_printf(o, "%lld", (long long)v->u.i);
        break;
    case TP_KIND_FLOAT:
        fmt_float(o, v->u.d);
        break;
    case TP_KIND_STR:
        fmt_quoted(o, v->u.blob.data, v->u.blob.len, 0);
        break;
    case TP_KIND_BYTES:
        if (v->opaque)
            fmt_puts(o, "opaque(");
        fmt_put(o, "b", 1);
        fmt_quoted(o, v->u.blob.data, v->u.blob.len, 1);
        if (v->opaque)
            fmt_put(o, ")", 1);
        break;
    case TP_KIND_LIST:
        fmt_put(o, v->tuple ? "(" : "[", 1);
        for (size_t i = 0; i < v->u.list.len && !fmt_full(o); i++) {
            if (i)
                fmt_put(o, ", ", 2);
            fmt_value(o, v->u.list.items[i]);
        }
        if (v->tuple && v->u.list.len == 1)
            fmt_put(o, ",", 1);
        fmt_put(o, v->tuple ? ")" : "]", 1);
        break;
    case TP_KIND_MAP:
        fmt_put(o, "{", 1);
        for (size_t i = 0; i < v->u.map.len && !fmt_full(o); i++) {
            if (i)
                fmt_put(o, ", ", 2);
            fmt_quoted(o, v->u.map.entries[i].key, v->u.map.entries[i].len, 0);
            fmt_put(o, ": ", 2);
            fmt_value(o, v->u.map.entries[i].value);
        }
        fmt_put(o, "}", 1);
        break;
    case TP_KIND_TENSOR: {
        const tpi_tensor *t = v->u.tensor;
        fmt_puts(o, "tensor(shape=[");
        for (int d = 0; d < t->ndim; d++)
            fmt_printf(o, d ? ", %lld" : "%lld", (long long)t->shape[d]);
        fmt_printf(o, "], dtype=%s)", tp_dtype_name(t->dtype));
        break;
    }
    case TP_KIND_RREF:
        fmt_puts(o, "RRef(...)");
        break;
    case TP_KIND_WORKER_INFO:
        fmt_printf(o, "WorkerInfo(id=%u, name=%s)", (unsigned)v->u.info->id, v->u.info->name);
        break;
    case TP_KIND_OBJECT:
        fmt_printf(o, "<%s object>", v->u.obj.class_name);
        break;
    default:
        fmt_puts(o, "<invalid>");
        break;
    }
}

size_t tp_value_format(const tp_value *v, char *buf, size_t buf_len) {
    fmt_out o = {buf, buf_len, 0};
    if (buf && buf_len > 0)
        buf[0] = '\0';
    else
        o.cap = 0;
    fmt_value(&o, v);
    return o.len;
}
