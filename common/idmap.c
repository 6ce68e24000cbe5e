/* idmap.c: see idmap.h. */
#include "idmap.h"

#include <stdlib.h>

#include "errors.h"

static size_t hash(tpi_gid k) {
    /* splitmix64 finaliser over both words: cheap and well mixed. */
    uint64_t x = k.local ^ ((uint64_t)k.worker << 32 | k.worker) * 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return (size_t)(x ^ (x >> 31));
}

void tpi_idmap_init(tpi_idmap *m) {
    m->slots = NULL;
    m->cap = 0;
    m->len = 0;
}

void tpi_idmap_free(tpi_idmap *m) {
    free(m->slots);
    tpi_idmap_init(m);
}

static tp_status grow(tpi_idmap *m) {
    size_t cap = m->cap ? m->cap * 2 : 16;
    tpi_idmap_slot *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return TP_ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].value)
            continue;
        size_t j = hash(m->slots[i].key) & (cap - 1);
        while (slots[j].value)
            j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return TP_OK;
}

tp_status tpi_idmap_put(tpi_idmap *m, tpi_gid key, void *value) {
    TPI_ASSERT(value);
    if ((m->len + 1) * 4 > m->cap * 3) { /* keep the load under 3/4 */
        tp_status st = grow(m);
        if (st != TP_OK)
            return st;
    }
    size_t j = hash(key) & (m->cap - 1);
    while (m->slots[j].value) {
        if (tpi_gid_eq(m->slots[j].key, key))
            return TP_EALREADY;
        j = (j + 1) & (m->cap - 1);
    }
    m->slots[j].key = key;
    m->slots[j].value = value;
    m->len++;
    return TP_OK;
}

static size_t find(const tpi_idmap *m, tpi_gid key) {
    if (m->cap == 0)
        return SIZE_MAX;
    size_t j = hash(key) & (m->cap - 1);
    while (m->slots[j].value) {
        if (tpi_gid_eq(m->slots[j].key, key))
            return j;
        j = (j + 1) & (m->cap - 1);
    }
    return SIZE_MAX;
}

void *tpi_idmap_get(const tpi_idmap *m, tpi_gid key) {
    size_t j = find(m, key);
    return j == SIZE_MAX ? NULL : m->slots[j].value;
}

void *tpi_idmap_del(tpi_idmap *m, tpi_gid key) {
    size_t j = find(m, key);
    if (j == SIZE_MAX)
        return NULL;
    void *value = m->slots[j].value;
    size_t mask = m->cap - 1;
    /* Backward-shift: pull later members of the probe run into the hole. */
    size_t hole = j;
    for (size_t k = (j + 1) & mask; m->slots[k].value; k = (k + 1) & mask) {
        size_t home = hash(m->slots[k].key) & mask;
        /* k may move to hole if its home is not in (hole, k] cyclically. */
        int between = hole <= k ? (home > hole && home <= k) : (home > hole || home <= k);
        if (!between) {
            m->slots[hole] = m->slots[k];
            hole = k;
        }
    }
    m->slots[hole].value = NULL;
    m->len--;
    return value;
}
