/* registry.c: functions and methods registered by name on a worker (FUNC-1..5, METHOD-1). */
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "errors.h"
#include "registry.h"

/* "Class.method" for methods: both parts are names, so '.' cannot clash. */
#define ENTRY_NAME_MAX (2 * TP_NAME_LEN_MAX + 1)

struct tpi_fn_entry {
    char name[ENTRY_NAME_MAX + 1];
    tp_fn fn;
    void *user_data;
    unsigned flags; /* TP_FN_* */
};

int tpi_name_valid(const char *s, size_t *len_out) {
    size_t n = 0;
    if (!s)
        return 0;
    for (; s[n]; n++) {
        char c = s[n];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == ':' || c == '-';
        if (!ok || n >= TP_NAME_LEN_MAX)
            return 0;
    }
    if (len_out)
        *len_out = n;
    return n > 0;
}

/* Function, class and method names follow the worker-name rule (FUNC-1), so
 * "Class.method" keys can never collide with a function name. */
static int fn_name_valid(const char *s) {
    return tpi_name_valid(s, NULL);
}

static size_t lower_bound(const tp_context *ctx, const char *name) {
    size_t lo = 0, hi = ctx->nfns;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(ctx->fns[mid].name, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static tp_status insert(const char *name, tp_fn fn, void *ud, unsigned flags) {
    if (strncmp(name, "tp:", 3) == 0) /* the library's own, e.g. init's warm-up ping */
        return tpi_fail(TP_EINVAL, "'%s': names starting with 'tp:' are reserved", name);
    tp_context *ctx = tp_context_current();
    tpi_context_lock(ctx);
    size_t at = lower_bound(ctx, name);
    if (at < ctx->nfns && strcmp(ctx->fns[at].name, name) == 0) {
        tpi_context_unlock(ctx);
        return tpi_fail(TP_EALREADY, "'%s' is already registered on this worker", name);
    }
    if (ctx->nfns == ctx->fns_cap) {
        uint32_t cap = ctx->fns_cap ? ctx->fns_cap * 2 : 16;
        tpi_fn_entry *grown = realloc(ctx->fns, cap * sizeof *grown);
        if (!grown) {
            tpi_context_unlock(ctx);
            return tpi_fail(TP_ENOMEM, "out of memory registering '%s'", name);
        }
        ctx->fns = grown;
        ctx->fns_cap = cap;
    }
    memmove(&ctx->fns[at + 1], &ctx->fns[at], (ctx->nfns - at) * sizeof ctx->fns[0]);
    tpi_fn_entry *e = &ctx->fns[at];
    strcpy(e->name, name);
    e->fn = fn;
    e->user_data = ud;
    e->flags = flags;
    ctx->nfns++;
    tpi_context_unlock(ctx);
    return TP_OK;
}

tp_status tp_register_function(const char *name, tp_fn fn, void *user_data) {
    return tp_register_function_ex(name, fn, user_data, 0);
}

tp_status tp_register_function_ex(const char *name, tp_fn fn, void *user_data, unsigned flags) {
    if (flags & ~TP_FN_NONBLOCKING)
        return tpi_fail(TP_EINVAL, "function '%.*s': unknown flags 0x%x", TP_NAME_LEN_MAX + 8,
                        name ? name : "(null)", flags & ~TP_FN_NONBLOCKING);
    if (!fn_name_valid(name))
        return tpi_fail(TP_EINVAL, "function name '%.*s' must match ^[A-Za-z0-9_:-]+$ and be "
                                   "1..%d bytes",
                        TP_NAME_LEN_MAX + 8, name ? name : "(null)", TP_NAME_LEN_MAX);
    if (!fn)
        return tpi_fail(TP_EINVAL, "function '%s' is NULL", name);
    return insert(name, fn, user_data, flags);
}

tp_status tp_new_method(const char *class_name, const char *method_name, tp_fn fn,
                        void *user_data) {
    if (!fn_name_valid(class_name) || !fn_name_valid(method_name))
        return tpi_fail(TP_EINVAL, "class and method names must match ^[A-Za-z0-9_:-]+$ and "
                                   "be 1..%d bytes",
                        TP_NAME_LEN_MAX);
    if (!fn)
        return tpi_fail(TP_EINVAL, "method '%s.%s' is NULL", class_name, method_name);
    char full[ENTRY_NAME_MAX + 1];
    tpi_format(full, sizeof full, "%s.%s", class_name, method_name);
    return insert(full, fn, user_data, 0);
}

int tpi_registry_find(tp_context *ctx, const char *class_name, const char *name, tp_fn *fn,
                      void **ud, unsigned *flags) {
    char full[ENTRY_NAME_MAX + 1];
    if (class_name) {
        tpi_format(full, sizeof full, "%s.%s", class_name, name);
        name = full;
    }
    tpi_context_lock(ctx);
    size_t at = lower_bound(ctx, name);
    int found = at < ctx->nfns && strcmp(ctx->fns[at].name, name) == 0;
    if (found) {
        *fn = ctx->fns[at].fn;
        *ud = ctx->fns[at].user_data;
        if (flags)
            *flags = ctx->fns[at].flags;
    }
    tpi_context_unlock(ctx);
    return found;
}

void tpi_registry_clear(tp_context *ctx) {
    tpi_context_lock(ctx);
    free(ctx->fns);
    ctx->fns = NULL;
    ctx->nfns = ctx->fns_cap = 0;
    tpi_context_unlock(ctx);
}
