/* registry.h: lookup of registered functions and methods. */
#ifndef TPI_REGISTRY_H
#define TPI_REGISTRY_H

#include <stddef.h>

#include "context.h"

/* 1 when name matches ^[A-Za-z0-9_:-]+$ and is 1..TP_NAME_LEN_MAX bytes (INIT-2). */
int tpi_name_valid(const char *name, size_t *len_out);

/* Finds a function (class_name NULL) or a method; 1 when found. flags (may
 * be NULL) receives its TP_FN_* flags. */
int tpi_registry_find(tp_context *ctx, const char *class_name, const char *name, tp_fn *fn,
                      void **user_data, unsigned *flags);

#endif
