/*
 * fuzz_sim_world.c: any bytes as a whole simulated world (spec/sim.md SIM-14).
 *
 * The bytes decode to a swarm world: the seed, the worker count, the
 * workload's knobs and a fault plan (tools/tpsim_swarm.c; running out of
 * bytes means no more faults). The world then runs every phase of a swarm
 * seed: chaos, heal, liveness, graceful shutdown and the oracle (SIM-9).
 * The crash condition is the swarm's verdict: an oracle violation, a wrong
 * answer, a hung or leaking run, a disagreeing init, or a dead liveness
 * phase aborts, which the fuzzer reports as a crash. The world's report
 * goes to stderr first, and the same bytes replay it under tpsim:
 *
 *     tpsim swarm --bytes FILE --verbose --trace seed.trace
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tensorplay/rpc_backend.h"
#include "tools/tpsim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int registered;
    if (!registered) {
        tp_register_builtin_backends();
        registered = 1;
    }
    if (tpsim_swarm_bytes(data, size, stderr) != 0)
        abort();
    return 0;
}
