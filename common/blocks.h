/*
 * blocks.h: a process-wide, bounded, lock-free cache of small memory blocks
 * by size class, so the hot path of a call (its record, its future, the
 * callee's job, small frames) reuses blocks instead of calling malloc and
 * free once it runs steadily.
 *
 * Any thread may take a block and any other give it back (a frame is built
 * by a caller and freed by the transport's loop). Each class is a bounded
 * multi-producer multi-consumer ring of free blocks (D. Vyukov's design: one
 * compare-and-swap per operation, no ABA problem, no lock a preempted thread
 * could hold). A full ring frees the block; an empty one mallocs. The cache
 * holds at most TPI_BLOCKS_BYTES_MAX bytes; cached blocks stay reachable
 * from here, and tpi_blocks_trim gives them all back.
 */
#ifndef TPI_BLOCKS_H
#define TPI_BLOCKS_H

#include <stddef.h>

/* The largest block the cache keeps; larger requests go to malloc. */
#define TPI_BLOCK_SIZE_MAX ((size_t)64 * 1024)

/*
 * A block of at least size bytes (size >= 1), not zeroed; NULL on
 * exhaustion. Free it with tpi_block_free and the same size, or with
 * tpi_block_free_class and the class tpi_block_class gave.
 */
void *tpi_block_alloc(size_t size);
void tpi_block_free(void *p, size_t size);
/* The usable size of the blocks tpi_block_alloc(size) returns (size itself
 * above TPI_BLOCK_SIZE_MAX). */
size_t tpi_block_usable(size_t size);
/* Frees every cached block (any thread, any time). */
void tpi_blocks_trim(void);
/* Blocks and bytes cached now, for tests and leak checks. */
void tpi_blocks_stats(size_t *blocks, size_t *bytes);

#endif
