/*
 * sim_wrap.h: a wrapper backend around the simulator, for unit tests that
 * need an agent the simulator is not (one that fails sends, reports
 * congestion, duplicates frames, ...). After each successful simulator
 * init, wrap_ops_edit (which the including test defines) edits a copy of
 * the simulator's agent table, overriding members whose replacements may
 * forward to sim_ops; the worker then uses that copy. The test registers
 * the wrapper under its name with sim_wrap_register (in main, before any
 * world runs) and names it as its worlds' backend. Include once per test.
 */
#ifndef TP_TESTS_SIM_WRAP_H
#define TP_TESTS_SIM_WRAP_H

#include <stdio.h>

#include "tensorplay/rpc.h"
#include "tensorplay/rpc_backend.h"

extern const tp_backend tpi_sim_backend;

/* The simulator's agent table, for the test's overrides to forward to. */
static const tp_agent_ops *sim_ops;
static tp_agent_ops sim_wrap_ops;
static tp_backend sim_wrap_backend;

/* Overrides members of ops (a copy of the simulator's table) for the worker
 * p describes, whose agent is agent (defined by the test). */
static void wrap_ops_edit(const tp_init_params *p, tp_agent *agent, tp_agent_ops *ops);

static tp_status sim_wrap_init(const tp_init_params *p, tp_agent **agent, const tp_agent_ops **ops,
                               char *errmsg, size_t errmsg_len) {
    tp_status st = tpi_sim_backend.init(p, agent, ops, errmsg, errmsg_len);
    if (st == TP_OK) {
        sim_ops = *ops;
        sim_wrap_ops = **ops;
        wrap_ops_edit(p, *agent, &sim_wrap_ops);
        *ops = &sim_wrap_ops;
    }
    return st;
}

/* Registers the wrapper as backend name: 0, or -1 after saying why. */
static int sim_wrap_register(const char *name) {
    sim_wrap_backend = tpi_sim_backend;
    sim_wrap_backend.init = sim_wrap_init;
    if (tp_register_backend(name, &sim_wrap_backend) != TP_OK) {
        fprintf(stderr, "cannot register %s: %s\n", name, tp_errmsg());
        return -1;
    }
    return 0;
}

#endif
