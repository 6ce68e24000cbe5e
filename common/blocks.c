/* blocks.c: the bounded lock-free cache of small blocks (blocks.h). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "blocks.h"
#include "errors.h"

/* Classes are powers of two from 128 bytes to TPI_BLOCK_SIZE_MAX. */
#define CLASS_MIN_SHIFT 7
#define CLASSES 10
/* Cells of a class's ring: a power of two, at most CELLS_MAX, and at most
 * CLASS_BYTES of blocks (at least 8 cells). */
#define CELLS_MAX 1024
#define CLASS_BYTES ((size_t)512 * 1024)

_Static_assert(((size_t)1 << (CLASS_MIN_SHIFT + CLASSES - 1)) == TPI_BLOCK_SIZE_MAX,
               "the last class is TPI_BLOCK_SIZE_MAX");

/*
 * One ring cell. Vyukov's queue gives cell i the sequence number i at the
 * start; `seq` stores the sequence minus i, so a zeroed static ring is a
 * valid empty one and needs no initialisation (no once-flag, no thread
 * library in common/).
 */
typedef struct cell {
    atomic_size_t seq;
    void *block;
} cell;

typedef struct ring {
    atomic_size_t enq; /* next position to fill */
    char pad1[64 - sizeof(atomic_size_t)];
    atomic_size_t deq; /* next position to take */
    char pad2[64 - sizeof(atomic_size_t)];
    cell cells[CELLS_MAX];
} ring;

static ring rings[CLASSES];

/* Under AddressSanitizer a cached block is poisoned: a use after free is
 * still reported as one until the block is handed out again. */
#if defined(__SANITIZE_ADDRESS__)
#define BLOCKS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BLOCKS_ASAN 1
#endif
#endif
#ifdef BLOCKS_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

static size_t class_size(int k) {
    return (size_t)1 << (CLASS_MIN_SHIFT + k);
}

static size_t class_cells(int k) {
    size_t n = CLASS_BYTES / class_size(k);
    if (n > CELLS_MAX)
        n = CELLS_MAX;
    return n < 8 ? 8 : n;
}

/* The class of a request of size bytes, or -1 above the largest. */
static int class_of(size_t size) {
    if (size > TPI_BLOCK_SIZE_MAX)
        return -1;
    int k = 0;
    while (class_size(k) < size)
        k++;
    return k;
}

/* Puts block into class k's ring; 0 when it is full. */
static int ring_put(int k, void *block) {
    ring *r = &rings[k];
    size_t mask = class_cells(k) - 1;
    size_t pos = atomic_load_explicit(&r->enq, memory_order_relaxed);
    for (;;) {
        cell *c = &r->cells[pos & mask];
        size_t seq = atomic_load_explicit(&c->seq, memory_order_acquire) + (pos & mask);
        intptr_t dif = (intptr_t)seq - (intptr_t)pos;
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&r->enq, &pos, pos + 1,
                                                      memory_order_relaxed, memory_order_relaxed)) {
                c->block = block;
                atomic_store_explicit(&c->seq, pos + 1 - (pos & mask), memory_order_release);
                return 1;
            }
        } else if (dif < 0) {
            return 0; /* full */
        } else {
            pos = atomic_load_explicit(&r->enq, memory_order_relaxed);
        }
    }
}

/* Takes a block from class k's ring; NULL when it is empty. */
static void *ring_take(int k) {
    ring *r = &rings[k];
    size_t mask = class_cells(k) - 1;
    size_t pos = atomic_load_explicit(&r->deq, memory_order_relaxed);
    for (;;) {
        cell *c = &r->cells[pos & mask];
        size_t seq = atomic_load_explicit(&c->seq, memory_order_acquire) + (pos & mask);
        intptr_t dif = (intptr_t)seq - (intptr_t)(pos + 1);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&r->deq, &pos, pos + 1,
                                                      memory_order_relaxed, memory_order_relaxed)) {
                void *block = c->block;
                /* No stale copy: a leak checker scanning the ring would take
                 * a block lost by its new owner for one still cached. */
                c->block = NULL;
                /* Cell free again for the fill of pos + cells. */
                atomic_store_explicit(&c->seq, pos + mask + 1 - (pos & mask),
                                      memory_order_release);
                return block;
            }
        } else if (dif < 0) {
            return NULL; /* empty */
        } else {
            pos = atomic_load_explicit(&r->deq, memory_order_relaxed);
        }
    }
}

void *tpi_block_alloc(size_t size) {
    TPI_ASSERT(size >= 1);
    int k = class_of(size);
    if (k < 0)
        return malloc(size);
    void *p = ring_take(k);
    if (p) {
        UNPOISON(p, class_size(k));
        return p;
    }
    return malloc(class_size(k));
}

void tpi_block_free(void *p, size_t size) {
    if (!p)
        return;
    int k = class_of(size);
    if (k < 0) {
        free(p);
        return;
    }
    POISON(p, class_size(k));
    if (!ring_put(k, p)) {
        UNPOISON(p, class_size(k));
        free(p);
    }
}

size_t tpi_block_usable(size_t size) {
    int k = class_of(size);
    return k < 0 ? size : class_size(k);
}

void tpi_blocks_trim(void) {
    for (int k = 0; k < CLASSES; k++) {
        void *p;
        while ((p = ring_take(k)) != NULL) {
            UNPOISON(p, class_size(k));
            free(p);
        }
    }
}

void tpi_blocks_stats(size_t *blocks, size_t *bytes) {
    size_t n = 0, b = 0;
    for (int k = 0; k < CLASSES; k++) {
        size_t in = atomic_load(&rings[k].enq) - atomic_load(&rings[k].deq);
        n += in;
        b += in * class_size(k);
    }
    if (blocks)
        *blocks = n;
    if (bytes)
        *bytes = b;
}
