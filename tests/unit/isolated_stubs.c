/*
 * isolated_stubs.c: the one core symbol the value and codec modules reach
 * (through context.c) when their tests are built without the core, so the
 * tests' own rref stand-ins are the ones linked and their rref cases run.
 */
#include "common/context.h"

void tpi_worker_abandon(tp_context *ctx) {
    (void)ctx; /* no worker can exist without the core */
}
