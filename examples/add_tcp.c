/*
 * add_tcp.c: the seed example over TCP, one process per worker. "worker0"
 * calls add(3, 4) on "worker1" and prints the result. Run it with tprun,
 * which sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (init_method
 * env://, the default):
 *
 *   tprun --nproc 2 ./add_tcp
 */
#include <stdio.h>
#include <stdlib.h>

#include "tensorplay/rpc.h"

static tp_status add(tp_call *call, const tp_value *args, const tp_value *kwargs, tp_value **result,
                     void *user_data) {
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

static int env_int(const char *name, int *out) {
    const char *v = getenv(name);
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : -1;
    if (!v || !*v || *end || x < 0 || x > 65536) {
        fprintf(stderr, "add_tcp: %s is not set to a number (run me with tprun)\n", name);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int main(void) {
    int rank, world_size;
    if (env_int("RANK", &rank) != 0 || env_int("WORLD_SIZE", &world_size) != 0)
        return 2;
    char name[32];
    snprintf(name, sizeof name, "worker%d", rank);
    if (tp_register_function("add", add, NULL) != TP_OK ||
        tp_init_rpc(name, "TENSORPIPE", rank, world_size, NULL) != TP_OK) {
        fprintf(stderr, "%s: %s\n", name, tp_errmsg());
        return 1;
    }
    int rc = 0;
    if (rank == 0 && world_size > 1) {
        tp_value *args = tp_value_list_of(2, tp_value_int(3), tp_value_int(4));
        tp_value *result = NULL;
        int64_t sum = 0;
        if (tp_rpc_sync(tp_to_name("worker1"), "add", args, NULL, TP_TIMEOUT_DEFAULT, &result) !=
                TP_OK ||
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
