/*
 * context.h: which worker "the API" means for the calling thread or task
 * (spec/agent.md AGENT-14). A process has one default context; the
 * simulator gives each simulated host its own and switches on every task
 * resume. A context holds the function registry (usable before init) and
 * the live worker between init and shutdown.
 */
#ifndef TPI_CONTEXT_H
#define TPI_CONTEXT_H

#include <stdatomic.h>
#include <stdint.h>

#include "tensorplay/rpc_backend.h"

typedef struct tpi_fn_entry tpi_fn_entry;

struct tp_context {
    /* Guards worker, fns and generation. A spin lock because it is held for
     * a handful of instructions and the core may not use OS threads. */
    atomic_flag spin;
    tp_core *core;       /* non-NULL between init and shutdown */
    tpi_fn_entry *fns;   /* registered functions and methods, a sorted array */
    uint32_t nfns;
    uint32_t fns_cap;
    uint32_t generation; /* inits attempted here: namespaces store keys */
    int initializing;    /* an init is in progress (init twice is an error) */
    tp_rref_leak *leaks; /* what the last graceful shutdown found (RREF-18), malloc'd */
    size_t nleaks;
    int leaks_known;     /* a graceful shutdown ran here */
    /* INTERRUPT-1, lock-free so tp_context_interrupt is async-signal-safe:
     * lc_epoch is odd while a tp_init_rpc or a graceful tp_shutdown blocks
     * here (bumped at its start and end), and intr_epoch is the lc_epoch an
     * interrupt was aimed at. An interrupt matches only the call it was
     * issued during: a stale one never equals a later epoch. */
    atomic_uint lc_epoch;
    atomic_uint intr_epoch;
};

/* The calling task's errmsg buffer (TP_ERRMSG_LEN_MAX bytes). */
char *tpi_errmsg_buf(void);

/* Shuts down, not gracefully, a worker still initialised in ctx (lifecycle.c). */
void tpi_worker_abandon(tp_context *ctx);
/* Forgets every registered function (registry.c). */
void tpi_registry_clear(tp_context *ctx);

void tpi_context_lock(tp_context *ctx);
void tpi_context_unlock(tp_context *ctx);
/* 1 for the process's own slot, 0 for one of tp_context_new's (a simulated
 * worker's): only the first may take its settings from the environment. */
int tpi_context_is_process(const tp_context *ctx);

#endif
