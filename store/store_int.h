/*
 * store_int.h: what the rendezvous stores share (STORE-4): the decimal
 * integers their add keeps in a value.
 */
#ifndef TP_STORE_STORE_INT_H
#define TP_STORE_STORE_INT_H

#include <stddef.h>
#include <stdint.h>

/* A decimal integer: an optional '-', then 1 to 19 digits, in int64 range.
 * len bytes at p, no NUL needed; 1 and *out set, or 0. */
int tpi_store_parse_i64(const char *p, size_t len, int64_t *out);

#endif
