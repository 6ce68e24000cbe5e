/*
 * add_sim.c: the seed example on the deterministic simulator. Two workers;
 * "worker0" calls add(3, 4) on "worker1" and prints the result.
 *
 *   ./add_sim [seed]
 */
#include <stdio.h>
#include <stdlib.h>

#include "tensorplay/rpc.h"
#include "tensorplay/sim.h"

static tp_status add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                     tp_value **result, void *user_data) {
    (void)kwargs;
    (void)user_data;
    int64_t a, b;
    if (tp_list_len(args) != 2 || tp_value_get_int(tp_list_get(args, 0), &a) != TP_OK ||
        tp_value_get_int(tp_list_get(args, 1), &b) != TP_OK) {
        tp_call_set_error(call, "add takes two ints");
        return TP_EINVAL;
    }
    /* Wraps: any peer may send any ints. */
    *result = tp_value_int((int64_t)((uint64_t)a + (uint64_t)b));
    return *result ? TP_OK : TP_ENOMEM;
}

static int program(int rank, int world_size, void *arg) {
    (void)arg;
    char name[32];
    snprintf(name, sizeof name, "worker%d", rank);
    if (tp_register_function("add", add, NULL) != TP_OK ||
        tp_init_rpc(name, "SIM", rank, world_size, NULL) != TP_OK) {
        fprintf(stderr, "%s: %s\n", name, tp_errmsg());
        return 1;
    }
    int rc = 0;
    if (rank == 0) {
        tp_value *args = tp_value_list_of(2, tp_value_int(3), tp_value_int(4));
        tp_value *result = NULL;
        int64_t sum = 0;
        if (tp_rpc_sync(tp_to_name("worker1"), "add", args, NULL, TP_TIMEOUT_DEFAULT,
                        &result) != TP_OK ||
            tp_value_get_int(result, &sum) != TP_OK) {
            fprintf(stderr, "worker0: %s\n", tp_errmsg());
            rc = 1;
        } else {
            printf("%lld\n", (long long)sum);
        }
        tp_value_free(args);
        tp_value_free(result);
    }
    if (tp_shutdown(1) != TP_OK) {
        fprintf(stderr, "%s: shutdown: %s\n", name, tp_errmsg());
        rc = 1;
    }
    return rc;
}

int main(int argc, char **argv) {
    tp_sim_config cfg = {0};
    cfg.hosts = 2;
    cfg.seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 1;
    tp_sim *sim = NULL;
    if (tp_sim_new(&cfg, &sim) != TP_OK) {
        fprintf(stderr, "tp_sim_new: %s\n", tp_errmsg());
        return 1;
    }
    int codes[2] = {-1, -1};
    tp_status st = tp_sim_run(sim, program, NULL, codes);
    tp_sim_free(sim);
    if (st != TP_OK || codes[0] != 0 || codes[1] != 0) {
        fprintf(stderr, "simulation failed: %s (exit codes %d %d)\n", tp_strerror(st), codes[0],
                codes[1]);
        return 1;
    }
    return 0;
}
