/*
 * value.h: internals of the value model (common/value.c) that the codec
 * needs: building maps without the per-set duplicate search (the decoder
 * checks duplicates once, in O(n log n)), growing a list to a known size,
 * taking over a decoded rref, and packing a strided tensor into contiguous
 * bytes.
 */
#ifndef TPI_VALUE_H
#define TPI_VALUE_H

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

#endif
