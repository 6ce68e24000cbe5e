/*
 * param_server.c: a batch-updating parameter server (PyTorch's tutorial
 * pattern, with tensorplay's functions that answer later, spec/api.md FUNC-7).
 *
 * Rank 0 holds the model, y = w * x + b. Every other rank is a trainer with
 * its own shard of data from y = 3x + 1. Each round, every trainer sends its
 * gradient with rpc_sync(ps_update); the server adds it to the round and
 * answers later: all the round's calls share one future, which the last
 * gradient completes with the updated model. No server thread waits for a
 * round (the server runs with one pool thread to show it). Run it with:
 *
 *   tprun --nproc 3 ./param_server
 *
 * Exits 0 when every trainer ends with w = 3 and b = 1 to within 0.01.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "tensorplay/rpc.h"

#define ROUNDS 200
#define LEARNING_RATE 0.3
#define SHARD 8 /* points per trainer */

/* The server's state: pool threads serve ps_update concurrently. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static double model[2];   /* w, b */
static double grad_sum[2];
static int arrived, trainers;
static tp_future *round_answer; /* shared by the round's calls */

static tp_value *model_value(const double m[2]) {
    return tp_value_list_of(2, tp_value_float(m[0]), tp_value_float(m[1]));
}

/* ps_update([dw, db]): answers, once every trainer's gradient of this round
 * arrived, with the model after the round's averaged step. */
static tp_status ps_update(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data) {
    (void)kwargs, (void)result, (void)user_data;
    const tp_value *g = tp_list_get(args, 0);
    double dw, db;
    if (tp_list_len(g) != 2 || tp_value_get_float(tp_list_get(g, 0), &dw) != TP_OK ||
        tp_value_get_float(tp_list_get(g, 1), &db) != TP_OK) {
        tp_call_set_error(call, "ps_update takes one list [dw, db]");
        return TP_EINVAL;
    }
    tp_future *fresh = NULL; /* made outside the lock, used if this call opens the round */
    tp_status st = tp_future_new(&fresh);
    if (st != TP_OK)
        return st;
    tp_future *complete = NULL;
    double after[2];
    pthread_mutex_lock(&mu);
    if (!round_answer) {
        round_answer = fresh;
        fresh = NULL;
    }
    st = tp_call_answer_later(call, round_answer); /* only takes a reference */
    if (st == TP_OK) {
        grad_sum[0] += dw;
        grad_sum[1] += db;
        if (++arrived == trainers) {
            for (int i = 0; i < 2; i++) {
                model[i] -= LEARNING_RATE * grad_sum[i] / trainers;
                grad_sum[i] = 0;
                after[i] = model[i];
            }
            arrived = 0;
            complete = round_answer;
            round_answer = NULL;
        }
    }
    pthread_mutex_unlock(&mu);
    if (fresh) {
        tp_future_set_result(fresh, NULL);
        tp_future_free(fresh);
    }
    if (complete) { /* answers every call of the round */
        tp_future_set_result(complete, model_value(after));
        tp_future_free(complete);
    }
    return st;
}

/* The trainer's gradient of the mean squared error over its shard. */
static void gradient(int rank, const double m[2], double g[2]) {
    g[0] = g[1] = 0;
    for (int i = 0; i < SHARD; i++) {
        double x = 2.0 * ((rank - 1) * SHARD + i) / (trainers * SHARD) - 1; /* in [-1, 1) */
        double y = 3 * x + 1;
        double err = m[0] * x + m[1] - y;
        g[0] += 2 * err * x / SHARD;
        g[1] += 2 * err / SHARD;
    }
}

static int env_int(const char *name) {
    const char *v = getenv(name);
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : -1;
    if (!v || !*v || *end || x < 0 || x > 4096) {
        fprintf(stderr, "param_server: %s is not set (run me with tprun)\n", name);
        exit(2);
    }
    return (int)x;
}

int main(void) {
    int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
    if (world < 2) {
        fprintf(stderr, "param_server: needs a server and at least one trainer\n");
        return 2;
    }
    trainers = world - 1;
    char name[32];
    snprintf(name, sizeof name, rank == 0 ? "ps" : "trainer%d", rank);
    tp_options *opts = tp_options_new();
    if (!opts || (rank == 0 && tp_options_set_num_worker_threads(opts, 1) != TP_OK) ||
        tp_register_function("ps_update", ps_update, NULL) != TP_OK ||
        tp_init_rpc(name, "TENSORPIPE", rank, world, opts) != TP_OK) {
        fprintf(stderr, "param_server: init: %s\n", tp_errmsg());
        tp_options_free(opts);
        return 1;
    }
    tp_options_free(opts);
    int ok = 1;
    if (rank > 0) {
        double m[2] = {0, 0};
        for (int r = 0; r < ROUNDS && ok; r++) {
            double g[2];
            gradient(rank, m, g);
            tp_value *args = tp_value_list_of(1, model_value(g));
            tp_value *got = NULL;
            tp_status st = tp_rpc_sync(tp_to_rank(0), "ps_update", args, NULL, 30.0, &got);
            tp_value_free(args);
            if (st != TP_OK || tp_value_get_float(tp_list_get(got, 0), &m[0]) != TP_OK ||
                tp_value_get_float(tp_list_get(got, 1), &m[1]) != TP_OK) {
                fprintf(stderr, "param_server: round %d: %s\n", r, tp_errmsg());
                ok = 0;
            }
            tp_value_free(got);
        }
        ok = ok && fabs(m[0] - 3) < 0.01 && fabs(m[1] - 1) < 0.01;
        printf("%s: after %d rounds w = %.4f, b = %.4f (%s)\n", name, ROUNDS, m[0], m[1],
               ok ? "converged" : "NOT converged");
    }
    if (tp_shutdown(1) != TP_OK) {
        fprintf(stderr, "param_server: shutdown: %s\n", tp_errmsg());
        ok = 0;
    }
    return ok ? 0 : 1;
}
