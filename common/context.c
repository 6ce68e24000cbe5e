/* context.c: the process's default worker slot and per-thread current one. */
#include "context.h"

#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "tensorplay/rpc.h"

static tp_context process_context = {.spin = ATOMIC_FLAG_INIT};

/* Set by tp_context_switch; NULL means the process context and the thread's
 * own message buffer. Thread-local storage is not a thread call: it keeps
 * each OS thread's view of "current" separate. */
static _Thread_local tp_context *current_ctx;
static _Thread_local char *current_errmsg;
static _Thread_local char thread_errmsg[TP_ERRMSG_LEN_MAX];

tp_context *tp_context_new(void) {
    tp_context *ctx = calloc(1, sizeof *ctx);
    if (ctx)
        atomic_flag_clear(&ctx->spin);
    return ctx;
}

void tp_context_free(tp_context *ctx) {
    if (!ctx)
        return;
    TPI_ASSERT(ctx != &process_context);
    tp_context *saved = current_ctx;
    char *saved_msg = current_errmsg;
    current_ctx = ctx;
    tpi_worker_abandon(ctx);
    tpi_registry_clear(ctx);
    current_ctx = saved == ctx ? NULL : saved;
    current_errmsg = saved == ctx ? NULL : saved_msg;
    free(ctx->leaks);
    free(ctx);
}

void tp_context_switch(tp_context *ctx, char *errmsg_buf) {
    current_ctx = ctx;
    current_errmsg = errmsg_buf;
}

tp_context *tp_context_current(void) {
    return current_ctx ? current_ctx : &process_context;
}

int tpi_context_is_process(const tp_context *ctx) {
    return ctx == &process_context;
}

char *tpi_errmsg_buf(void) {
    return current_errmsg ? current_errmsg : thread_errmsg;
}

void tpi_context_lock(tp_context *ctx) {
    while (atomic_flag_test_and_set_explicit(&ctx->spin, memory_order_acquire)) {
        /* Held only for a few instructions by whoever has it. */
    }
}

void tpi_context_unlock(tp_context *ctx) {
    /* Set already (by us): an unlock without its lock is a bug. */
    int held = atomic_flag_test_and_set_explicit(&ctx->spin, memory_order_relaxed);
    TPI_ASSERT(held && "context unlocked without its lock");
    atomic_flag_clear_explicit(&ctx->spin, memory_order_release);
}
