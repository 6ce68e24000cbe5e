/*
 * value.h: internals of the value model (common/value.c) that the codec
 * needs: building maps without the per-set duplicate search (the decoder
 * checks duplicates once, in O(n log n)), growing a list to a known size,
 * taking over a decoded rref, packing a strided tensor into contiguous
 * bytes, and the shared tensor storage that lets large tensors travel
 * without a copy (spec/wire.md WIRE-10).
 */
#ifndef TPI_VALUE_H
#define TPI_VALUE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorplay/rpc.h"

/* Makes room for n more items in a list (no length change). TP_ENOMEM. */
tp_status tpi_list_reserve(tp_value *list, size_t n);

/* Appends key (len bytes, no NUL inside; copied) and item (transferred on
 * success) to a map without looking for an equal key. TP_ENOMEM. */
tp_status tpi_map_push(tp_value *map, const char *key, size_t len, tp_value *item);

/* Makes room for n more entries in a map. TP_ENOMEM. */
tp_status tpi_map_reserve(tp_value *map, size_t n);

/* Finds a key present twice: TP_OK with *dup_index = SIZE_MAX when all keys
 * differ, else the index of a later duplicate. TP_ENOMEM. */
tp_status tpi_map_find_duplicate(const tp_value *map, size_t *dup_index);

/* Bytes of the tensor's elements packed contiguous: numel * element size
 * (checked against overflow when the tensor was made). */
uint64_t tpi_tensor_packed_size(const tp_value *t);

/* Writes the tensor's elements in row-major order to dst, which has
 * tpi_tensor_packed_size(t) bytes. */
void tpi_tensor_pack(const tp_value *t, void *dst);

/* Byte length of the key at index i of a map (keys hold no NUL). */
size_t tpi_map_key_len_at(const tp_value *map, size_t index);

/* An rref value that takes over rref (one reference, released when the
 * value is freed) instead of cloning it, as the decoder needs. NULL on
 * exhaustion (the caller keeps rref then). */
tp_value *tpi_value_rref_adopt(tp_rref *rref);

/*
 * Checks a contiguous tensor layout as tp_value_tensor would: TP_OK with
 * *packed = numel * element size (may be NULL), TP_EINVAL for a bad dtype,
 * ndim or negative dimension, TP_ERANGE when a size overflows. After TP_OK,
 * tp_value_tensor(dtype, ndim, shape, NULL, data) fails only on exhaustion.
 */
tp_status tpi_tensor_check(tp_dtype dtype, int ndim, const int64_t *shape, uint64_t *packed);

/* ---- Shared storage (WIRE-10) ----------------------------------------------- */

/*
 * A reference-counted block of bytes. A tensor's elements live in one; a
 * frame that sends the tensor without copying holds a second reference
 * until its bytes are written, and a tensor decoded as a view into a
 * received frame holds a block whose release drops the frame. The count is
 * atomic because the last reference may go on another thread (the
 * transport's); everything else about a block is immutable once shared.
 */
typedef struct tpi_blob tpi_blob;
struct tpi_blob {
    atomic_size_t refs;
    uint8_t *data; /* len bytes */
    size_t len;
    /* Frees the block (and what it stands for) when the last reference goes. */
    void (*release)(tpi_blob *b);
    void *ctx; /* for release */
};

/* A block of len bytes in one allocation with it (aligned for any element),
 * zeroed when zero != 0; one reference. NULL on exhaustion. */
tpi_blob *tpi_blob_new(size_t len, int zero);
/* Takes one more reference. */
void tpi_blob_ref(tpi_blob *b);
/* Drops one reference; the last one releases the block. NULL is a no-op. */
void tpi_blob_unref(tpi_blob *b);

/*
 * The storage of a contiguous tensor, borrowed: its packed bytes are
 * *data (tpi_tensor_packed_size bytes), which the block keeps alive; take
 * a reference with tpi_blob_ref to keep them past t. NULL for a strided
 * tensor (its bytes must be packed, WIRE-4).
 */
tpi_blob *tpi_tensor_storage(const tp_value *t, const void **data);

/*
 * A contiguous tensor whose elements are the bytes at data, inside the
 * block parent (which gains a reference, dropped when the tensor is freed):
 * no copy. data must be aligned to the element size and hold the packed
 * size of the layout, already checked with tpi_tensor_check. The tensor
 * owns those bytes exclusively: nothing else may read or write them while
 * it lives. NULL on exhaustion.
 */
tp_value *tpi_value_tensor_view(tp_dtype dtype, int ndim, const int64_t *shape,
                                tpi_blob *parent, uint8_t *data);

#endif
