/*
 * test_options.c: tp_options (spec/api.md OPT-1..6) and the timeout domain
 * (spec/calls.md TIMEOUT-1): defaults, every setter's valid and invalid
 * values (an invalid one is TP_EINVAL naming the value and changes nothing),
 * init/shutdown timeouts that follow rpc_timeout until set, backend keys,
 * clones, and NULL arguments (ERR-3: TP_EINVAL, never a crash).
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/limits.h"
#include "common/options.h"
#include "tensorplay/rpc.h"

/* Must match options.c's bound on backend keys (not exported). */
#define KEYS_MAX 64

static tp_options *new_opts(void) {
    tp_options *o = tp_options_new();
    assert_non_null(o);
    return o;
}

/* Every timeout value outside TIMEOUT-1's domain for options (-1 included). */
static const double bad_timeouts[] = {
    -1.0,     -2.0, -0.5,    -1e-300,        -4e6,  -INFINITY,
    INFINITY, NAN,  4e6 + 1, 4.0000000001e6, 1e300, DBL_MAX,
};
#define NBAD (sizeof bad_timeouts / sizeof bad_timeouts[0])

/* Valid values: 0 (no deadline) and (0, 4e6]. */
static const double good_timeouts[] = {0.0, 1e-9, DBL_MIN, 0.001,       0.1,
                                       1.0, 60.0, 3600.0,  3999999.999, 4e6};
#define NGOOD (sizeof good_timeouts / sizeof good_timeouts[0])

/* ---- Defaults (OPT-1) ---------------------------------------------------------- */

static void test_options_defaults(void **state) {
    (void)state;
    tp_options *o = new_opts();
    assert_true(tp_options_rpc_timeout(o) == 60.0);
    assert_true(tp_options_rpc_timeout(o) == TP_DEFAULT_RPC_TIMEOUT_S);
    assert_int_equal(tp_options_num_worker_threads(o), 16);
    assert_int_equal(tp_options_num_worker_threads(o), TP_DEFAULT_NUM_WORKER_THREADS);
    assert_null(tp_options_init_method(o));
    assert_true(tp_options_init_timeout(o) == 60.0);
    assert_true(tp_options_shutdown_timeout(o) == 60.0);
    assert_true(tp_options_max_message_size(o) == TPI_MESSAGE_SIZE_DEFAULT);
    assert_int_equal(tpi_options_nkeys(o), 0);
    assert_null(tp_options_get(o, "anything"));
    tp_options_free(o);
}

/* OPT-3: init and shutdown timeouts follow rpc_timeout until set. */
static void test_options_init_shutdown_follow_rpc_timeout(void **state) {
    (void)state;
    tp_options *o = new_opts();
    assert_int_equal(tp_options_set_rpc_timeout(o, 5.0), TP_OK);
    assert_true(tp_options_init_timeout(o) == 5.0);
    assert_true(tp_options_shutdown_timeout(o) == 5.0);
    assert_int_equal(tp_options_set_rpc_timeout(o, 0.0), TP_OK); /* none follows too */
    assert_true(tp_options_init_timeout(o) == 0.0);
    assert_true(tp_options_shutdown_timeout(o) == 0.0);

    /* Setting one stops it following; the other still follows. */
    assert_int_equal(tp_options_set_init_timeout(o, 7.0), TP_OK);
    assert_int_equal(tp_options_set_rpc_timeout(o, 9.0), TP_OK);
    assert_true(tp_options_init_timeout(o) == 7.0);
    assert_true(tp_options_shutdown_timeout(o) == 9.0);
    assert_int_equal(tp_options_set_shutdown_timeout(o, 0.0), TP_OK); /* 0 is a set value */
    assert_int_equal(tp_options_set_rpc_timeout(o, 11.0), TP_OK);
    assert_true(tp_options_init_timeout(o) == 7.0);
    assert_true(tp_options_shutdown_timeout(o) == 0.0);
    assert_true(tp_options_rpc_timeout(o) == 11.0);

    /* A rejected value does not turn "following" into "set". */
    tp_options *p = new_opts();
    assert_int_equal(tp_options_set_init_timeout(p, -2.0), TP_EINVAL);
    assert_int_equal(tp_options_set_shutdown_timeout(p, NAN), TP_EINVAL);
    assert_int_equal(tp_options_set_rpc_timeout(p, 3.0), TP_OK);
    assert_true(tp_options_init_timeout(p) == 3.0);
    assert_true(tp_options_shutdown_timeout(p) == 3.0);
    tp_options_free(p);
    tp_options_free(o);
}

/* ---- Timeout setters (OPT-2, OPT-3, TIMEOUT-1) ------------------------------------ */

typedef tp_status (*set_timeout_fn)(tp_options *, double);
typedef double (*get_timeout_fn)(const tp_options *);

static void check_timeout_setter(set_timeout_fn set, get_timeout_fn get, const char *what) {
    tp_options *o = new_opts();
    for (size_t i = 0; i < NGOOD; i++) {
        if (set(o, good_timeouts[i]) != TP_OK)
            fail_msg("%s(%g) rejected: %s", what, good_timeouts[i], tp_errmsg());
        assert_true(get(o) == good_timeouts[i]);
    }
    assert_int_equal(set(o, 2.5), TP_OK);
    for (size_t i = 0; i < NBAD; i++) {
        tp_status st = set(o, bad_timeouts[i]);
        if (st != TP_EINVAL)
            fail_msg("%s(%g) gave %s", what, bad_timeouts[i], tp_status_name(st));
        assert_true(get(o) == 2.5); /* OPT-1: unchanged */
        /* The message names the value (NaN by its name). */
        const char *msg = tp_errmsg();
        char num[64];
        snprintf(num, sizeof num, "%g", bad_timeouts[i]);
        if (isnan(bad_timeouts[i]))
            assert_true(strstr(msg, "NaN") || strstr(msg, "nan"));
        else if (!strstr(msg, num))
            fail_msg("%s(%g): message '%s' does not name the value", what, bad_timeouts[i], msg);
    }
    tp_options_free(o);
}

static void test_options_rpc_timeout_domain(void **state) {
    (void)state;
    check_timeout_setter(tp_options_set_rpc_timeout, tp_options_rpc_timeout, "set_rpc_timeout");
}

static void test_options_init_timeout_domain(void **state) {
    (void)state;
    check_timeout_setter(tp_options_set_init_timeout, tp_options_init_timeout, "set_init_timeout");
}

static void test_options_shutdown_timeout_domain(void **state) {
    (void)state;
    check_timeout_setter(tp_options_set_shutdown_timeout, tp_options_shutdown_timeout,
                         "set_shutdown_timeout");
}

/* The shared checker: -1 is allowed only where a call may say "default". */
static void test_options_check_timeout_default_flag(void **state) {
    (void)state;
    assert_int_equal(tpi_check_timeout(-1.0, 1), TP_OK);
    assert_int_equal(tpi_check_timeout(-1.0, 0), TP_EINVAL);
    for (size_t i = 0; i < NGOOD; i++) {
        assert_int_equal(tpi_check_timeout(good_timeouts[i], 0), TP_OK);
        assert_int_equal(tpi_check_timeout(good_timeouts[i], 1), TP_OK);
    }
    for (size_t i = 1; i < NBAD; i++) { /* every bad value but -1 */
        assert_int_equal(tpi_check_timeout(bad_timeouts[i], 0), TP_EINVAL);
        assert_int_equal(tpi_check_timeout(bad_timeouts[i], 1), TP_EINVAL);
    }
    /* The exact upper edge: 4e6 is in, the next double above it is out. */
    assert_int_equal(tpi_check_timeout(TPI_TIMEOUT_S_MAX, 0), TP_OK);
    assert_int_equal(tpi_check_timeout(nextafter(TPI_TIMEOUT_S_MAX, INFINITY), 0), TP_EINVAL);
    assert_int_equal(tpi_check_timeout(nextafter(-1.0, 0.0), 1), TP_EINVAL);
    assert_int_equal(tpi_check_timeout(nextafter(-1.0, -2.0), 1), TP_EINVAL);
}

/* ---- num_worker_threads (OPT-4) ---------------------------------------------------- */

static void test_options_num_worker_threads_domain(void **state) {
    (void)state;
    tp_options *o = new_opts();
    const int good[] = {1, 2, 16, 17, 512, TPI_WORKER_THREADS_MAX};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(tp_options_set_num_worker_threads(o, good[i]), TP_OK);
        assert_int_equal(tp_options_num_worker_threads(o), good[i]);
    }
    assert_int_equal(tp_options_set_num_worker_threads(o, 8), TP_OK);
    const int bad[] = {0, -1, -16, INT_MIN, TPI_WORKER_THREADS_MAX + 1, 100000, INT_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(tp_options_set_num_worker_threads(o, bad[i]), TP_EINVAL);
        assert_int_equal(tp_options_num_worker_threads(o), 8);
        char num[32];
        snprintf(num, sizeof num, "%d", bad[i]);
        assert_non_null(strstr(tp_errmsg(), num));
    }
    tp_options_free(o);
}

/* ---- max_message_size (OPT-5) ------------------------------------------------------ */

static void test_options_max_message_size_bounds(void **state) {
    (void)state;
    tp_options *o = new_opts();
    const uint64_t good[] = {
        TPI_MESSAGE_SIZE_MIN,     TPI_MESSAGE_SIZE_MIN + 1, 1 << 20,
        TPI_MESSAGE_SIZE_DEFAULT, TPI_MESSAGE_SIZE_MAX - 1, TPI_MESSAGE_SIZE_MAX};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(tp_options_set_max_message_size(o, good[i]), TP_OK);
        assert_true(tp_options_max_message_size(o) == good[i]);
    }
    assert_int_equal(tp_options_set_max_message_size(o, 1 << 16), TP_OK);
    const uint64_t bad[] = {
        0, 1, TPI_MESSAGE_SIZE_MIN - 1, TPI_MESSAGE_SIZE_MAX + 1, (uint64_t)1 << 32, UINT64_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(tp_options_set_max_message_size(o, bad[i]), TP_EINVAL);
        assert_true(tp_options_max_message_size(o) == (1 << 16));
        char num[32];
        snprintf(num, sizeof num, "%llu", (unsigned long long)bad[i]);
        assert_non_null(strstr(tp_errmsg(), num));
    }
    tp_options_free(o);
}

/* ---- init_method and backend keys (OPT-6) ------------------------------------------ */

static void test_options_init_method(void **state) {
    (void)state;
    tp_options *o = new_opts();
    char buf[64] = "sqlite:///tmp/x.db";
    assert_int_equal(tp_options_set_init_method(o, buf), TP_OK);
    strcpy(buf, "changed"); /* copied, not borrowed past the call */
    assert_string_equal(tp_options_init_method(o), "sqlite:///tmp/x.db");
    assert_int_equal(tp_options_set_init_method(o, "tcp://127.0.0.1:29500"), TP_OK);
    assert_string_equal(tp_options_init_method(o), "tcp://127.0.0.1:29500");
    assert_int_equal(tp_options_set_init_method(o, ""), TP_EINVAL);
    assert_int_equal(tp_options_set_init_method(o, NULL), TP_EINVAL);
    assert_string_equal(tp_options_init_method(o), "tcp://127.0.0.1:29500");
    tp_options_free(o);
}

static void test_options_backend_keys_set_replace_get(void **state) {
    (void)state;
    tp_options *o = new_opts();
    char key[16] = "transport", val[16] = "uv";
    assert_int_equal(tp_options_set(o, key, val), TP_OK);
    strcpy(key, "xxxx");
    strcpy(val, "yyyy");
    assert_string_equal(tp_options_get(o, "transport"), "uv");
    assert_null(tp_options_get(o, "xxxx"));
    assert_int_equal(tp_options_set(o, "channels", "4"), TP_OK);
    assert_int_equal(tp_options_set(o, "empty_value", ""), TP_OK); /* values may be empty */
    assert_string_equal(tp_options_get(o, "empty_value"), "");
    assert_int_equal(tpi_options_nkeys(o), 3);
    /* Setting a key again replaces its value; the count stays. */
    assert_int_equal(tp_options_set(o, "transport", "shm"), TP_OK);
    assert_string_equal(tp_options_get(o, "transport"), "shm");
    assert_string_equal(tp_options_get(o, "channels"), "4");
    assert_int_equal(tpi_options_nkeys(o), 3);
    /* Keys are exact: no prefix or case folding. */
    assert_null(tp_options_get(o, "Transport"));
    assert_null(tp_options_get(o, "trans"));
    assert_null(tp_options_get(o, "transports"));
    /* The key list (what init validates) holds each key once. */
    int seen = 0;
    for (size_t i = 0; i < tpi_options_nkeys(o); i++) {
        const char *k = tpi_options_key_at(o, i);
        seen |= !strcmp(k, "transport")     ? 1
                : !strcmp(k, "channels")    ? 2
                : !strcmp(k, "empty_value") ? 4
                                            : 8;
    }
    assert_int_equal(seen, 7);
    /* A key must be a non-empty string; a value must not be NULL. */
    assert_int_equal(tp_options_set(o, "", "v"), TP_EINVAL);
    assert_int_equal(tp_options_set(o, NULL, "v"), TP_EINVAL);
    assert_int_equal(tp_options_set(o, "k", NULL), TP_EINVAL);
    assert_int_equal(tpi_options_nkeys(o), 3);
    assert_null(tp_options_get(o, "k"));
    tp_options_free(o);
}

static void test_options_backend_key_count_limit(void **state) {
    (void)state;
    tp_options *o = new_opts();
    char key[32], val[32];
    for (int i = 0; i < KEYS_MAX; i++) {
        snprintf(key, sizeof key, "key%d", i);
        snprintf(val, sizeof val, "val%d", i);
        assert_int_equal(tp_options_set(o, key, val), TP_OK);
    }
    assert_int_equal(tpi_options_nkeys(o), KEYS_MAX);
    /* One more distinct key is over the limit, and changes nothing. */
    assert_int_equal(tp_options_set(o, "one_too_many", "x"), TP_ELIMIT);
    assert_true(tp_errmsg()[0] != '\0');
    assert_null(tp_options_get(o, "one_too_many"));
    assert_int_equal(tpi_options_nkeys(o), KEYS_MAX);
    /* Replacing an existing key at the limit still works. */
    assert_int_equal(tp_options_set(o, "key0", "new"), TP_OK);
    assert_string_equal(tp_options_get(o, "key0"), "new");
    for (int i = 1; i < KEYS_MAX; i++) {
        snprintf(key, sizeof key, "key%d", i);
        snprintf(val, sizeof val, "val%d", i);
        assert_string_equal(tp_options_get(o, key), val);
    }
    tp_options_free(o);
}

/* ---- Clones (OPT-6) -------------------------------------------------------------- */

static void test_options_clone_independent(void **state) {
    (void)state;
    tp_options *o = new_opts();
    assert_int_equal(tp_options_set_rpc_timeout(o, 12.0), TP_OK);
    assert_int_equal(tp_options_set_shutdown_timeout(o, 3.0), TP_OK); /* init stays unset */
    assert_int_equal(tp_options_set_num_worker_threads(o, 4), TP_OK);
    assert_int_equal(tp_options_set_max_message_size(o, 1 << 20), TP_OK);
    assert_int_equal(tp_options_set_init_method(o, "env://"), TP_OK);
    assert_int_equal(tp_options_set(o, "a", "1"), TP_OK);
    assert_int_equal(tp_options_set(o, "b", "2"), TP_OK);

    tp_options *c = tp_options_clone(o);
    assert_non_null(c);
    assert_true(tp_options_rpc_timeout(c) == 12.0);
    assert_true(tp_options_init_timeout(c) == 12.0);
    assert_true(tp_options_shutdown_timeout(c) == 3.0);
    assert_int_equal(tp_options_num_worker_threads(c), 4);
    assert_true(tp_options_max_message_size(c) == (1 << 20));
    assert_string_equal(tp_options_init_method(c), "env://");
    assert_ptr_not_equal(tp_options_init_method(c), tp_options_init_method(o));
    assert_string_equal(tp_options_get(c, "a"), "1");
    assert_string_equal(tp_options_get(c, "b"), "2");
    assert_int_equal(tpi_options_nkeys(c), 2);

    /* The unset state is cloned: the clone's init timeout still follows. */
    assert_int_equal(tp_options_set_rpc_timeout(c, 20.0), TP_OK);
    assert_true(tp_options_init_timeout(c) == 20.0);
    assert_true(tp_options_shutdown_timeout(c) == 3.0);

    /* Changes to the clone do not reach the original, and back. */
    assert_int_equal(tp_options_set_num_worker_threads(c, 32), TP_OK);
    assert_int_equal(tp_options_set_init_method(c, "tcp://h:1"), TP_OK);
    assert_int_equal(tp_options_set(c, "a", "changed"), TP_OK);
    assert_int_equal(tp_options_set(c, "c", "3"), TP_OK);
    assert_int_equal(tp_options_set(o, "b", "orig-changed"), TP_OK);
    assert_true(tp_options_rpc_timeout(o) == 12.0);
    assert_true(tp_options_init_timeout(o) == 12.0);
    assert_int_equal(tp_options_num_worker_threads(o), 4);
    assert_string_equal(tp_options_init_method(o), "env://");
    assert_string_equal(tp_options_get(o, "a"), "1");
    assert_null(tp_options_get(o, "c"));
    assert_string_equal(tp_options_get(c, "b"), "2");
    assert_int_equal(tpi_options_nkeys(o), 2);
    assert_int_equal(tpi_options_nkeys(c), 3);

    /* Freeing the original leaves the clone whole (no shared strings). */
    tp_options_free(o);
    assert_string_equal(tp_options_get(c, "a"), "changed");
    assert_string_equal(tp_options_init_method(c), "tcp://h:1");

    /* A clone of fresh defaults, and of a full key table. */
    tp_options *d = new_opts();
    tp_options *dc = tp_options_clone(d);
    assert_non_null(dc);
    assert_null(tp_options_init_method(dc));
    assert_int_equal(tpi_options_nkeys(dc), 0);
    assert_true(tp_options_shutdown_timeout(dc) == 60.0);
    char key[16];
    for (int i = 0; i < KEYS_MAX; i++) {
        snprintf(key, sizeof key, "k%d", i);
        assert_int_equal(tp_options_set(d, key, key), TP_OK);
    }
    tp_options *full = tp_options_clone(d);
    assert_non_null(full);
    assert_int_equal(tpi_options_nkeys(full), KEYS_MAX);
    assert_int_equal(tp_options_set(full, "extra", "x"), TP_ELIMIT);
    tp_options_free(full);
    tp_options_free(dc);
    tp_options_free(d);
    tp_options_free(c);
}

/* ---- rejoin (REJOIN-1) and max_unsent_bytes (TCP-19) ----------------------------- */

static void test_options_rejoin_and_unsent_bounds(void **state) {
    (void)state;
    tp_options *o = new_opts();
    assert_int_equal(tp_options_rejoin(o), 0);
    assert_int_equal(tp_options_set_rejoin(o, 1), TP_OK);
    assert_int_equal(tp_options_rejoin(o), 1);
    const int bad_rejoin[] = {2, -1, 100};
    for (size_t i = 0; i < sizeof bad_rejoin / sizeof bad_rejoin[0]; i++) {
        assert_int_equal(tp_options_set_rejoin(o, bad_rejoin[i]), TP_EINVAL);
        assert_int_equal(tp_options_rejoin(o), 1); /* unchanged */
        char want[48];
        snprintf(want, sizeof want, "rejoin must be 0 or 1, not %d", bad_rejoin[i]);
        assert_string_equal(tp_errmsg(), want);
    }
    assert_int_equal(tp_options_set_rejoin(o, 0), TP_OK);
    assert_int_equal(tp_options_rejoin(o), 0);
    assert_int_equal(tp_options_set_rejoin(NULL, 1), TP_EINVAL);
    assert_string_equal(tp_errmsg(), "options is NULL");

    assert_true(tp_options_max_unsent_bytes(o) == TPI_UNSENT_BYTES_DEFAULT);
    const uint64_t good[] = {TPI_UNSENT_BYTES_MIN, TPI_UNSENT_BYTES_MIN + 1, 1 << 20,
                             TPI_UNSENT_BYTES_MAX - 1, TPI_UNSENT_BYTES_MAX};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(tp_options_set_max_unsent_bytes(o, good[i]), TP_OK);
        assert_true(tp_options_max_unsent_bytes(o) == good[i]);
    }
    assert_int_equal(tp_options_set_max_unsent_bytes(o, 1 << 20), TP_OK);
    const uint64_t bad[] = {0, TPI_UNSENT_BYTES_MIN - 1, TPI_UNSENT_BYTES_MAX + 1, UINT64_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(tp_options_set_max_unsent_bytes(o, bad[i]), TP_EINVAL);
        assert_true(tp_options_max_unsent_bytes(o) == (1 << 20));
        char want[96];
        snprintf(want, sizeof want, "max_unsent_bytes %llu outside [%llu, %llu]",
                 (unsigned long long)bad[i], (unsigned long long)TPI_UNSENT_BYTES_MIN,
                 (unsigned long long)TPI_UNSENT_BYTES_MAX);
        assert_string_equal(tp_errmsg(), want);
    }
    assert_int_equal(tp_options_set_max_unsent_bytes(NULL, 1 << 20), TP_EINVAL);
    /* A clone keeps both. */
    assert_int_equal(tp_options_set_rejoin(o, 1), TP_OK);
    tp_options *c = tp_options_clone(o);
    assert_non_null(c);
    assert_int_equal(tp_options_rejoin(c), 1);
    assert_true(tp_options_max_unsent_bytes(c) == (1 << 20));
    tp_options_free(c);
    tp_options_free(o);
    /* NULL options read as the defaults. */
    assert_int_equal(tp_options_rejoin(NULL), 0);
    assert_true(tp_options_max_unsent_bytes(NULL) == TPI_UNSENT_BYTES_DEFAULT);
    assert_true(tp_options_init_timeout(NULL) == TP_DEFAULT_RPC_TIMEOUT_S);
    assert_true(tp_options_shutdown_timeout(NULL) == TP_DEFAULT_RPC_TIMEOUT_S);
}

/* ---- NULL arguments (ERR-3) ------------------------------------------------------ */

static void test_options_null_handling(void **state) {
    (void)state;
    tp_options_free(NULL); /* a no-op */
    assert_int_equal(tp_options_set_rpc_timeout(NULL, 1.0), TP_EINVAL);
    assert_true(tp_errmsg()[0] != '\0');
    assert_int_equal(tp_options_set_init_timeout(NULL, 1.0), TP_EINVAL);
    assert_int_equal(tp_options_set_shutdown_timeout(NULL, 1.0), TP_EINVAL);
    assert_int_equal(tp_options_set_num_worker_threads(NULL, 4), TP_EINVAL);
    assert_int_equal(tp_options_set_max_message_size(NULL, 1 << 20), TP_EINVAL);
    assert_int_equal(tp_options_set_init_method(NULL, "env://"), TP_EINVAL);
    assert_int_equal(tp_options_set(NULL, "k", "v"), TP_EINVAL);
    /* NULL arguments next to a valid options object. */
    tp_options *o = new_opts();
    assert_int_equal(tp_options_set_init_method(o, NULL), TP_EINVAL);
    assert_int_equal(tp_options_set(o, NULL, NULL), TP_EINVAL);
    assert_int_equal(tp_options_set(o, NULL, "v"), TP_EINVAL);
    assert_int_equal(tp_options_set(o, "k", NULL), TP_EINVAL);
    assert_null(tp_options_init_method(o));
    assert_int_equal(tpi_options_nkeys(o), 0);
    tp_options_free(o);
}

/* Runs probe in a child process with output silenced; returns its exit code
 * (probes: 0 right, 3 a wrong result; 1 is a crash caught by ASan) or 128 +
 * the signal that ended it (an assertion, a crash). A probe that crashes must
 * not take the whole test binary down. */
static int in_child(int (*probe)(void)) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* cmocka catches crashes to report them; here a crash must end the child. */
        const int sigs[] = {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            signal(sigs[i], SIG_DFL);
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        _exit(probe());
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int probe_clone_null(void) {
    return tp_options_clone(NULL) == NULL ? 0 : 3;
}

static int probe_get_null_key(void) {
    tp_options *o = tp_options_new();
    if (!o || tp_options_set(o, "some_key", "v") != TP_OK)
        return 2;
    const char *v = tp_options_get(o, NULL);
    tp_options_free(o);
    return v == NULL ? 0 : 3;
}

static int probe_get_null_options(void) {
    return tp_options_get(NULL, "key") == NULL ? 0 : 3;
}

static int probe_scalar_getters_null(void) {
    volatile double d = tp_options_rpc_timeout(NULL) + tp_options_init_timeout(NULL) +
                        tp_options_shutdown_timeout(NULL);
    volatile int n = tp_options_num_worker_threads(NULL);
    volatile uint64_t m = tp_options_max_message_size(NULL);
    volatile const char *im = tp_options_init_method(NULL);
    (void)d, (void)n, (void)m, (void)im;
    return 0; /* any value will do: the rule is "no crash" */
}

/*
 * ERR-3: a NULL pointer where the API needs one is not an assertion: clone
 * and get return NULL and the getters do not crash (each probe runs in a
 * child so a crash fails the test instead of ending the binary).
 */
static void test_options_null_in_getters_no_crash(void **state) {
    (void)state;
    static const struct {
        const char *what;
        int (*probe)(void);
    } probes[] = {
        {"tp_options_clone(NULL)", probe_clone_null},
        {"tp_options_get(opts, NULL)", probe_get_null_key},
        {"tp_options_get(NULL, key)", probe_get_null_options},
        {"getters on NULL options", probe_scalar_getters_null},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        int code = in_child(probes[i].probe);
        if (code != 0) {
            bad++;
            print_error("%s: %s (child exit %d)\n", probes[i].what,
                        code == 3 ? "did not return NULL" : "crashed", code);
        }
    }
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_defaults),
        cmocka_unit_test(test_options_init_shutdown_follow_rpc_timeout),
        cmocka_unit_test(test_options_rpc_timeout_domain),
        cmocka_unit_test(test_options_init_timeout_domain),
        cmocka_unit_test(test_options_shutdown_timeout_domain),
        cmocka_unit_test(test_options_check_timeout_default_flag),
        cmocka_unit_test(test_options_num_worker_threads_domain),
        cmocka_unit_test(test_options_max_message_size_bounds),
        cmocka_unit_test(test_options_init_method),
        cmocka_unit_test(test_options_backend_keys_set_replace_get),
        cmocka_unit_test(test_options_backend_key_count_limit),
        cmocka_unit_test(test_options_clone_independent),
        cmocka_unit_test(test_options_rejoin_and_unsent_bounds),
        cmocka_unit_test(test_options_null_handling),
        cmocka_unit_test(test_options_null_in_getters_no_crash),
    };
    return cmocka_run_group_tests_name("options", tests, NULL, NULL);
}
