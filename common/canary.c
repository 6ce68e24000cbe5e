/* canary.c: the names of the deliberately broken variants (canary.h). */
#include <stddef.h>

#include "canary.h"

#ifdef TP_CANARIES
int tpi_canary;
#endif

const char *tpi_canary_name(int kind) {
    static const char *const names[TPI_CANARY_KINDS_] = {
        [TPI_CANARY_NONE] = "none",
        [TPI_CANARY_TIMER_NOT_REARMED] = "timer_not_rearmed",
        [TPI_CANARY_DOUBLE_COMPLETE] = "double_complete",
        [TPI_CANARY_DRAIN_UNDERREPORTS] = "drain_underreports",
        [TPI_CANARY_CHILD_DROPPED_EARLY] = "child_dropped_early",
        [TPI_CANARY_DEDUPE_OFF] = "dedupe_off",
        [TPI_CANARY_FREED_FORGOTTEN] = "freed_forgotten",
        [TPI_CANARY_NO_FORK_PROBE] = "no_fork_probe",
        [TPI_CANARY_DELETE_BEFORE_ABANDON] = "delete_before_abandon",
        [TPI_CANARY_QUERY_NO_WAIT] = "query_no_wait",
        [TPI_CANARY_FORGETS_DELETED] = "forgets_deleted",
        [TPI_CANARY_THEN_UNCOUNTED] = "then_uncounted",
    };
    return kind >= 0 && kind < TPI_CANARY_KINDS_ ? names[kind] : NULL;
}
