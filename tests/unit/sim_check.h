/*
 * sim_check.h: checks for unit tests whose code runs inside a simulation.
 * cmocka's asserts longjmp, which must not cross a simulator fiber's stack,
 * so checks in simulated tasks count failures instead and the test asserts
 * the count after tp_sim_run returns. Include after <cmocka.h>.
 */
#ifndef TP_TESTS_SIM_CHECK_H
#define TP_TESTS_SIM_CHECK_H

#include <stdint.h>

#include "tensorplay/sim.h"

#define US 1000ull
#define MS 1000000ull
#define SEC 1000000000ull
/* Sim parks and timers end exactly at their deadline (SIM-1): a hair of slack. */
#define TOL_NS (10 * US)
/* One message's latency is at most 20 us + 30 us jitter (sim defaults). */
#define HOP_NS (50 * US)

static int failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            print_error("CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);                 \
        }                                                                                          \
    } while (0)

/* A cmocka setup: every test starts with no failures counted. */
static inline int reset_failures(void **state) {
    (void)state;
    failures = 0;
    return 0;
}

/* The running simulation's virtual clock (inside a task). */
static inline uint64_t now_ns(void) {
    return tp_sim_now_ns(tp_sim_current());
}

static inline int within(uint64_t t, uint64_t lo, uint64_t hi) {
    return t >= lo && t <= hi;
}

#endif
