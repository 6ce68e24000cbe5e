/*
 * fake_rref.h: tp_rref_clone/tp_rref_release for the value and codec tests,
 * which link only the modules they test (tests/CMakeLists.txt), not the
 * core. A fake rref counts its references and records what a decode hook
 * saw, so the tests can check every clone is released. Include once per
 * test binary.
 */
#ifndef TP_TESTS_FAKE_RREF_H
#define TP_TESTS_FAKE_RREF_H

#include "common/codec.h"
#include "tensorplay/rpc.h"

typedef struct fake_rref {
    int refs;
    tpi_rref_wire wire; /* what the decode hook saw (codec tests) */
} fake_rref;

tp_rref *tp_rref_clone(tp_rref *r) {
    ((fake_rref *)(void *)r)->refs++;
    return r;
}

void tp_rref_release(tp_rref *r) {
    if (r)
        ((fake_rref *)(void *)r)->refs--;
}

#endif
