/*
 * test_log.c: the library's log (spec/api.md LOG-1..3): TP_LOG and the
 * level, the callback, and what the core says on its own on the simulator:
 * a rendezvous that waits names the missing ranks every 5 s, and a peer's
 * death is a warning.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/log.h"
#include "tensorplay/rpc.h"
#include "tensorplay/sim.h"

#include "sim_check.h"

#define LINES_MAX 64

static struct {
    int n;
    tp_log_level level[LINES_MAX];
    char text[LINES_MAX][256];
} got;

static void collect(tp_log_level level, const char *msg, void *ud) {
    (void)ud;
    if (got.n < LINES_MAX) {
        got.level[got.n] = level;
        snprintf(got.text[got.n], sizeof got.text[got.n], "%s", msg);
        got.n++;
    }
}

static void dump(void) {
    for (int i = 0; i < got.n; i++)
        print_message("log %d: %s\n", got.level[i], got.text[i]);
}

static int count(tp_log_level level, const char *needle) {
    int n = 0;
    for (int i = 0; i < got.n; i++)
        n += got.level[i] == level && strstr(got.text[i], needle) != NULL;
    return n;
}

static int setup(void **state) {
    (void)state;
    memset(&got, 0, sizeof got);
    failures = 0;
    tp_set_log_callback(collect, NULL);
    return 0;
}

/* spec: LOG-1, LOG-2: TP_LOG gives the first level; tp_set_log_level overrides it;
 * a message below the level is not formatted or delivered. */
static void test_log_levels(void **state) {
    (void)state;
    assert_int_equal(tp_log_level_now(), TP_LOG_DEBUG); /* main set TP_LOG=debug first */
    assert_int_equal(tp_set_log_level(TP_LOG_ERROR), TP_OK);
    tpi_log(TP_LOG_WARN, "not %s", "this");
    tpi_log(TP_LOG_ERROR, "this one, %d", 7);
    assert_int_equal(got.n, 1);
    assert_int_equal(got.level[0], TP_LOG_ERROR);
    assert_string_equal(got.text[0], "this one, 7");
    assert_int_equal(tp_set_log_level((tp_log_level)9), TP_EINVAL);
    assert_non_null(strstr(tp_errmsg(), "log level 9"));
    assert_int_equal(tp_log_level_now(), TP_LOG_ERROR);
    assert_string_equal(tp_log_level_name(TP_LOG_INFO), "info");
    assert_string_equal(tp_log_level_name((tp_log_level)0), "?");
}

/* w1 comes 12 s late (its host is paused); w0 dies at 20 s. */
static int program(int rank, int world, void *arg) {
    (void)arg;
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 60) == TP_OK);
    CHECK(tp_init_rpc(rank ? "w1" : "w0", "SIM", rank, world, o) == TP_OK);
    tp_options_free(o);
    if (rank == 0) {
        (void)tp_sleep(20.0);
        tp_sim_crash_self();
        return 0;
    }
    (void)tp_sleep(30.0);
    (void)tp_shutdown(1); /* w0 is gone: TP_EPEERDOWN */
    return 0;
}

/* spec: LOG-3: an init still waiting warns after 10 s and every 10 s, naming
 * the missing rank and the time left; a peer's death once, as a warning
 * naming it. */
static void test_log_what_the_core_says(void **state) {
    (void)state;
    assert_int_equal(tp_set_log_level(TP_LOG_INFO), TP_OK);
    tp_sim_config cfg = {.hosts = 2, .seed = 3};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    char err[256];
    assert_int_equal(tp_sim_load_faults(sim, "pause 1 0 12000\n", err, sizeof err), TP_OK);
    assert_int_equal(tp_sim_run(sim, program, NULL, NULL), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    /* w0 waited about 12 s for w1: told once, at 10 s, at the default level. */
    assert_int_equal(count(TP_LOG_WARN, "still waiting"), 1);
    assert_int_equal(count(TP_LOG_WARN, "init: worker 'w0' (rank 0) still waiting for rank 1 "
                                        "(of 2 workers) after 10 s; init timeout in 50 s"),
                     1);
    assert_int_equal(count(TP_LOG_WARN, "worker 'w1' (rank 1): worker 'w0' (id 0) is down"), 1);
}

/* Ranks 2 and 3 come 25 s late. */
static int late_program(int rank, int world, void *arg) {
    (void)arg;
    char name[8];
    snprintf(name, sizeof name, "w%d", rank);
    tp_options *o = tp_options_new();
    CHECK(tp_options_set_init_timeout(o, 60) == TP_OK);
    CHECK(tp_init_rpc(name, "SIM", rank, world, o) == TP_OK);
    tp_options_free(o);
    CHECK(tp_shutdown(1) == TP_OK);
    return 0;
}

/* spec: LOG-3: at the default level (warn), every 10 s of init's wait, with
 * every missing rank and the time left; on virtual time, so exact. */
static void test_log_init_names_missing_ranks(void **state) {
    (void)state;
    assert_int_equal(tp_set_log_level(TP_LOG_WARN), TP_OK);
    tp_sim_config cfg = {.hosts = 4, .seed = 4};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    char err[256];
    assert_int_equal(tp_sim_load_faults(sim, "pause 2 0 25000\npause 3 0 25000\n", err,
                                        sizeof err),
                     TP_OK);
    assert_int_equal(tp_sim_run(sim, late_program, NULL, NULL), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    for (int r = 0; r < 2; r++) {
        char want[160];
        snprintf(want, sizeof want,
                 "init: worker 'w%d' (rank %d) still waiting for ranks 2, 3 (of 4 workers) "
                 "after 10 s; init timeout in 50 s",
                 r, r);
        assert_int_equal(count(TP_LOG_WARN, want), 1);
        snprintf(want, sizeof want,
                 "init: worker 'w%d' (rank %d) still waiting for ranks 2, 3 (of 4 workers) "
                 "after 20 s; init timeout in 40 s",
                 r, r);
        assert_int_equal(count(TP_LOG_WARN, want), 1);
    }
    if (count(TP_LOG_WARN, "still waiting") != 4) { /* not at 30 s: they came */
        dump();
        fail();
    }
}

/* spec: LOG-3: the wait counts from each worker's own init: w1 starts 12 s
 * late and waits 13 s more for ranks 2 and 3 (25 s late): told once, 10 s
 * into its own wait, with the 50 s its own init timeout has left then. */
static void test_log_init_wait_counts_from_its_own_start(void **state) {
    (void)state;
    assert_int_equal(tp_set_log_level(TP_LOG_WARN), TP_OK);
    tp_sim_config cfg = {.hosts = 4, .seed = 4};
    tp_sim *sim = NULL;
    assert_int_equal(tp_sim_new(&cfg, &sim), TP_OK);
    char err[256];
    assert_int_equal(tp_sim_load_faults(sim, "pause 1 0 12000\npause 2 0 25000\npause 3 0 25000\n",
                                        err, sizeof err),
                     TP_OK);
    assert_int_equal(tp_sim_run(sim, late_program, NULL, NULL), TP_OK);
    tp_sim_free(sim);
    assert_int_equal(failures, 0);
    const char *want = "init: worker 'w1' (rank 1) still waiting for ranks 2, 3 (of 4 workers) "
                       "after 10 s; init timeout in 50 s";
    if (count(TP_LOG_WARN, want) != 1 || count(TP_LOG_WARN, "worker 'w1' (rank 1) still") != 1) {
        dump();
        fail();
    }
}

int main(void) {
    setenv("TP_LOG", "debug", 1); /* read once, at the first message or query */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_log_levels, setup),
        cmocka_unit_test_setup(test_log_what_the_core_says, setup),
        cmocka_unit_test_setup(test_log_init_names_missing_ranks, setup),
        cmocka_unit_test_setup(test_log_init_wait_counts_from_its_own_start, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
