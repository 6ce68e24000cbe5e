/*
 * mem_store.h: the simulator's rendezvous store, in memory without SQLite
 * (store/mem_store.c; spec/store.md STORE-6, STORE-11).
 */
#ifndef TP_STORE_MEM_STORE_H
#define TP_STORE_MEM_STORE_H

#include <stddef.h>

#include "tensorplay/rpc_backend.h"

/*
 * Opens a private, empty in-memory store with the contract of a ":memory:"
 * SQLite store (STORE-1..5, STORE-10) and the same messages: keys in byte
 * order, scan by prefix, limits, errors. *out is the caller's, closed with
 * its ops->close. Fails only with TP_ENOMEM (*out NULL, the message in
 * errmsg when given). Any thread; the handle may be shared between threads.
 */
tp_status tpi_mem_store_open(tp_store **out, char *errmsg, size_t errmsg_len);

#endif
