/*
 * idmap.h: an open-addressing hash map from a global id (worker, counter) to
 * a pointer. Linear probing with backward-shift deletion, so there are no
 * tombstones and lookups stay short. The hash is a pure function of the
 * key, so iteration order depends only on the operations done (determinism
 * in sim/). Not thread-safe: the core lock guards it.
 */
#ifndef TPI_IDMAP_H
#define TPI_IDMAP_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"

typedef struct tpi_idmap_slot {
    tpi_gid key;
    void *value; /* NULL: empty slot */
} tpi_idmap_slot;

typedef struct tpi_idmap {
    tpi_idmap_slot *slots;
    size_t cap; /* a power of two, or 0 */
    size_t len;
} tpi_idmap;

void tpi_idmap_init(tpi_idmap *m);
void tpi_idmap_free(tpi_idmap *m);
/* value must be non-NULL. TP_EALREADY if the key is present; TP_ENOMEM. */
tp_status tpi_idmap_put(tpi_idmap *m, tpi_gid key, void *value);
void *tpi_idmap_get(const tpi_idmap *m, tpi_gid key);
/* Removes and returns the value, or NULL. */
void *tpi_idmap_del(tpi_idmap *m, tpi_gid key);
/* Iteration: for (size_t i = 0; i < m->cap; i++) if (m->slots[i].value) ... (no
 * changes during it). */

static inline int tpi_gid_eq(tpi_gid a, tpi_gid b) {
    return a.worker == b.worker && a.local == b.local;
}

#endif
