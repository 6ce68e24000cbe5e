/*
 * fuzz_core_frames.c: any frames from a member, into a live worker's core
 * (spec/wire.md WIRE-6; spec/tcp.md TCP-14: a member is trusted to follow
 * the protocol, yet nothing it sends may crash, hang or corrupt a worker).
 *
 * A simulated world of three workers. Worker 1 sends the input's frames to
 * worker 0 through its own agent, as its transport would, then worker 2 calls
 * add(20, 22) on worker 0. The input is a sequence of chunks, each a u16
 * length (little-endian) and that many bytes: a frame whose magic, version
 * and length the harness sets (the header check itself is fuzz_msg_decode's),
 * so its type, flags, ids and body reach the decoder and the core: forged
 * responses, rref forks and deletes, tp:join announcements, requests for any
 * function.
 *
 * Properties, a violation aborts:
 * - nothing crashes, trips an assertion, leaks or reads out of bounds;
 * - the world ends within its virtual time limit (no hang, no busy loop);
 * - worker 0 still answers worker 2, which sent nothing odd: add gives 42.
 * What worker 0 makes of worker 1 afterwards (it may have dropped the
 * connection, or believe what worker 1 forged about itself) is not checked.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/codec.h"
#include "common/core.h"
#include "tensorplay/rpc.h"
#include "tensorplay/rpc_backend.h"
#include "tensorplay/sim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Frames one input sends at most, and bytes one frame's body carries. */
#define FRAMES_MAX 64
#define BODY_MAX 4096

static const uint8_t *in_data;
static size_t in_size;
static int injected;     /* worker 1 is done sending */
static int answered;     /* worker 2 got its answer */
static int64_t answer;
static tp_status answer_st;

static void check(int ok, const char *what) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_core_frames: property violated: %s\n", what);
    abort();
}

static tp_status fn_add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                        tp_value **result, void *user_data) {
    (void)call;
    (void)kwargs;
    (void)user_data;
    int64_t a = 0, b = 0;
    if (tp_list_len(args) != 2 || tp_value_get_int(tp_list_get(args, 0), &a) != TP_OK ||
        tp_value_get_int(tp_list_get(args, 1), &b) != TP_OK)
        return TP_EINVAL;
    /* Wraps: any peer may send any ints. */
    *result = tp_value_int((int64_t)((uint64_t)a + (uint64_t)b));
    return TP_OK;
}

/* Worker 1: the input's frames to worker 0, through the agent. */
static void inject(void) {
    tp_core *c = tpi_context_core(tp_context_current());
    check(c != NULL, "worker 1 has a core after init");
    const uint8_t *p = in_data;
    size_t left = in_size;
    for (int n = 0; n < FRAMES_MAX && left >= 2; n++) {
        size_t len = (size_t)p[0] | (size_t)p[1] << 8;
        p += 2;
        left -= 2;
        if (len > left)
            len = left;
        size_t body = len > TP_FRAME_HEADER_SIZE ? len - TP_FRAME_HEADER_SIZE : 0;
        if (body > BODY_MAX)
            body = BODY_MAX;
        tp_frame *f = tp_frame_alloc(TP_FRAME_HEADER_SIZE + body);
        check(f != NULL, "a small frame is allocated");
        uint8_t *b = tp_frame_bytes(f);
        memset(b, 0, TP_FRAME_HEADER_SIZE);
        memcpy(b, p, len < TP_FRAME_HEADER_SIZE + body ? len : TP_FRAME_HEADER_SIZE + body);
        memcpy(b, "TPRC", 4);
        b[4] = TPI_WIRE_VERSION;
        for (int k = 0; k < 4; k++)
            b[8 + k] = (uint8_t)(body >> (8 * k));
        if (c->ops->send(c->agent, 0, f) != TP_OK)
            tp_frame_free(f); /* the caller keeps it on error (AGENT-8) */
        p += len;
        left -= len;
        tp_sleep(0.0001); /* let worker 0 take them one by one */
    }
    tpi_core_unref(c);
}

static int program(int rank, int world, void *arg) {
    (void)arg;
    tp_register_function("add", fn_add, NULL);
    tp_options *o = tp_options_new();
    tp_options_set_init_timeout(o, 5.0);
    tp_options_set_shutdown_timeout(o, 2.0);
    tp_options_set_rpc_timeout(o, 2.0);
    char name[16];
    snprintf(name, sizeof name, "w%d", rank);
    tp_status st = tp_init_rpc(name, "SIM", rank, world, o);
    tp_options_free(o);
    if (st != TP_OK)
        return 1;
    if (rank == 1) {
        inject();
        injected = 1;
    } else if (rank == 2) {
        while (!injected)
            tp_sleep(0.001);
        tp_sleep(0.05); /* what worker 1 sent is handled by now */
        tp_value *args = tp_value_list_of(2, tp_value_int(20), tp_value_int(22));
        tp_value *res = NULL;
        answer_st = tp_rpc_sync(tp_to_rank(0), "add", args, NULL, 2.0, &res);
        (void)tp_value_get_int(res, &answer);
        tp_value_free(res);
        tp_value_free(args);
        answered = 1;
    } else {
        while (!answered)
            tp_sleep(0.001);
    }
    tp_shutdown(1); /* whatever worker 1 made of the job, it ends by its deadline */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int registered;
    if (!registered) {
        tp_register_builtin_backends();
        registered = 1;
    }
    in_data = data;
    in_size = size;
    injected = answered = 0;
    answer = 0;
    answer_st = TP_EIO;
    tp_sim_config cfg = {.hosts = 3, .seed = 1, .time_limit_ns = 120ull * 1000000000ull};
    tp_sim *sim = NULL;
    check(tp_sim_new(&cfg, &sim) == TP_OK, "a simulation starts");
    int codes[3] = {-1, -1, -1};
    tp_status st = tp_sim_run(sim, program, NULL, codes);
    tp_sim_free(sim);
    check(st == TP_OK, "the world ends within its time limit");
    check(codes[0] == 0 && codes[1] == 0 && codes[2] == 0, "every worker inits and ends");
    check(answered && answer_st == TP_OK && answer == 42, "worker 0 still answers worker 2");
    return 0;
}
