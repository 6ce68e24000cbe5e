/*
 * test_store.c: the rendezvous stores against their contract
 * (spec/store.md STORE-1..11). Most behaviours run on every store: SQLite
 * ":memory:" and a fresh file in a temporary directory, the simulator's
 * store, and the etcd store on a private etcd this test starts
 * (etcd_fixture.h, spec/etcd.md ETCD-10; skipped without an etcd binary
 * unless TP_REQUIRE_ETCD=1). The multi-process test forks workers that race
 * on one file, and on one etcd prefix.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tensorplay/rpc_backend.h"
#include "store/mem_store.h"
#include "tests/unit/etcd_fixture.h"

typedef struct fixture {
    char dir[256];
    char path[300]; /* the SQLite file, or the etcd store's URL */
    tp_store *s;
} fixture;

/* The etcd server every etcd case shares (each on a prefix of its own):
 * started by the first etcd case, stopped by the group's teardown. */
static tpe_etcd etcd_server;
static int etcd_state; /* 0: not tried; 1: up; 2: no binary (skip); -1: failed */

/* A store by name: "etcd://..." or an SQLite path. */
static tp_status store_open_any(const char *path, tp_store **out, char *err, size_t err_len) {
    if (strncmp(path, "etcd://", 7) == 0)
        return tp_etcd_store_open(path, out, err, err_len);
    return tp_sqlite_store_open(path, out, err, err_len);
}

/* ------------------------------------------------------------------------ */
/* Fixtures. */

static int fixture_make_dir(fixture *f) {
    const char *tmp = getenv("TMPDIR");
    snprintf(f->dir, sizeof f->dir, "%s/tp_store_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(f->dir))
        return -1;
    snprintf(f->path, sizeof f->path, "%s/store.db", f->dir);
    return 0;
}

static int setup_memory(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    snprintf(f->path, sizeof f->path, ":memory:");
    char err[TP_ERRMSG_LEN_MAX];
    if (tp_sqlite_store_open(f->path, &f->s, err, sizeof err) != TP_OK) {
        fprintf(stderr, "open: %s\n", err);
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

/* The simulator's in-memory store (STORE-11): the same contract. */
static int setup_mem(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    snprintf(f->path, sizeof f->path, ":memory:");
    char err[TP_ERRMSG_LEN_MAX];
    if (tpi_mem_store_open(&f->s, err, sizeof err) != TP_OK) {
        fprintf(stderr, "open: %s\n", err);
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

/* A fresh directory, no store open yet. */
static int setup_dir(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f || fixture_make_dir(f) != 0) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int setup_file(void **state) {
    if (setup_dir(state) != 0)
        return -1;
    fixture *f = *state;
    char err[TP_ERRMSG_LEN_MAX];
    if (tp_sqlite_store_open(f->path, &f->s, err, sizeof err) != TP_OK) {
        fprintf(stderr, "open: %s\n", err);
        return -1;
    }
    return 0;
}

/* A fresh etcd prefix on the shared server, its URL in path; no store open
 * yet. Without etcd (and TP_REQUIRE_ETCD unset) the case is skipped. */
static int setup_etcd_url(void **state) {
    static int prefixes;
    fixture *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    *state = f;
    if (etcd_state == 0) {
        int up = tpe_etcd_start(&etcd_server);
        etcd_state = up == 1 ? 1 : up == 0 ? 2 : -1;
    }
    if (etcd_state == -1 || (etcd_state == 2 && tpe_required())) {
        fprintf(stderr, "etcd: %s%s\n", etcd_server.why,
                etcd_state == 2 ? " (TP_REQUIRE_ETCD=1)" : "");
        return -1;
    }
    if (etcd_state == 2)
        return 0; /* the case skips */
    snprintf(f->path, sizeof f->path, "etcd://%s/tp-store-%d-%d", etcd_server.endpoint,
             (int)getpid(), ++prefixes);
    return 0;
}

static int setup_etcd(void **state) {
    if (setup_etcd_url(state) != 0)
        return -1;
    fixture *f = *state;
    char err[TP_ERRMSG_LEN_MAX];
    if (f->path[0] && tp_etcd_store_open(f->path, &f->s, err, sizeof err) != TP_OK) {
        fprintf(stderr, "open: %s\n", err);
        return -1;
    }
    return 0;
}

/* Skips an etcd case when there is no etcd (setup_etcd_url said why). */
#define SKIP_WITHOUT_ETCD(f)                                                                       \
    do {                                                                                           \
        if (!(f)->path[0]) {                                                                       \
            fprintf(stderr, "skipped: %s\n", etcd_server.why);                                     \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

static int teardown_group(void **state) {
    (void)state;
    tpe_etcd_stop(&etcd_server);
    return 0;
}

static void remove_with_suffix(const char *path, const char *suffix) {
    char p[320];
    snprintf(p, sizeof p, "%s%s", path, suffix);
    unlink(p);
}

static int teardown(void **state) {
    fixture *f = *state;
    if (f->s)
        f->s->ops->close(f->s);
    if (f->dir[0]) {
        remove_with_suffix(f->path, "");
        remove_with_suffix(f->path, "-wal");
        remove_with_suffix(f->path, "-shm");
        remove_with_suffix(f->path, "-journal");
        if (rmdir(f->dir) != 0)
            fprintf(stderr, "teardown: rmdir %s: %s\n", f->dir, strerror(errno));
    }
    free(f);
    return 0;
}

/* Each behaviour on every kind of store: name_memory and name_file (SQLite),
 * name_mem (the simulator's, STORE-11) and name_etcd (spec/etcd.md). */
#define BOTH(name)                                                                                 \
    static void name##_memory(void **state) {                                                      \
        name(*state);                                                                              \
    }                                                                                              \
    static void name##_file(void **state) {                                                        \
        name(*state);                                                                              \
    }                                                                                              \
    static void name##_mem(void **state) {                                                         \
        name(*state);                                                                              \
    }                                                                                              \
    static void name##_etcd(void **state) {                                                        \
        SKIP_WITHOUT_ETCD((fixture *)*state);                                                      \
        name(*state);                                                                              \
    }
#define TEST_BOTH(name)                                                                            \
    cmocka_unit_test_setup_teardown(name##_memory, setup_memory, teardown),                        \
        cmocka_unit_test_setup_teardown(name##_file, setup_file, teardown),                        \
        cmocka_unit_test_setup_teardown(name##_mem, setup_mem, teardown),                          \
        cmocka_unit_test_setup_teardown(name##_etcd, setup_etcd, teardown)

/* ------------------------------------------------------------------------ */
/* Helpers. */

static void put_str(tp_store *s, const char *key, const char *value) {
    assert_int_equal(s->ops->set(s, key, value, strlen(value)), TP_OK);
}

/* Asserts key holds exactly len bytes equal to want, NUL-terminated past them. */
static void check_value(tp_store *s, const char *key, const void *want, size_t len) {
    void *v = NULL;
    size_t n = 12345;
    assert_int_equal(s->ops->get(s, key, &v, &n), TP_OK);
    assert_non_null(v);
    assert_int_equal(n, len);
    if (len)
        assert_memory_equal(v, want, len);
    assert_int_equal(((char *)v)[n], '\0');
    free(v);
}

static void check_str(tp_store *s, const char *key, const char *want) {
    check_value(s, key, want, strlen(want));
}

static void check_absent(tp_store *s, const char *key) {
    void *v = (void *)1;
    size_t n = 77;
    assert_int_equal(s->ops->get(s, key, &v, &n), TP_ENOENT);
    assert_null(v);
    assert_int_equal(n, 0);
}

/* The store's message names the store's path and contains want; an absent
 * key is an answer, not a failure, so it leaves tp_errmsg() alone (ERR-2). */
static void check_absent_msg(const fixture *f, const char *want) {
    assert_non_null(strstr(f->s->errmsg, f->path));
    assert_non_null(strstr(f->s->errmsg, want));
    assert_null(strstr(tp_errmsg(), want));
}

/* The store's message and tp_errmsg() both name the store's path and contain want. */
static void check_msg(const fixture *f, const char *want) {
    assert_non_null(strstr(f->s->errmsg, f->path));
    assert_non_null(strstr(f->s->errmsg, want));
    assert_string_equal(tp_errmsg(), f->s->errmsg);
}

/* ------------------------------------------------------------------------ */
/* STORE-1, STORE-2: set, get, overwrite, delete. */

static void test_store_set_get(fixture *f) {
    tp_store *s = f->s;
    assert_int_equal(s->ops->api_version, TP_BACKEND_API_VERSION);
    put_str(s, "g0/init/addr/0", "127.0.0.1:4000");
    check_str(s, "g0/init/addr/0", "127.0.0.1:4000");
    /* Values are blobs: embedded NULs and high bytes come back as they went. */
    static const unsigned char bin[] = {0, 1, 0xff, 0, 'x', 0x80, 0};
    assert_int_equal(s->ops->set(s, "bin", bin, sizeof bin), TP_OK);
    check_value(s, "bin", bin, sizeof bin);
    /* An empty value is a present key, not an absent one. */
    assert_int_equal(s->ops->set(s, "empty", NULL, 0), TP_OK);
    check_value(s, "empty", "", 0);
    /* Keys are exact: no prefix or case folding. */
    check_absent(s, "g0/init/addr");
    check_absent(s, "G0/init/addr/0");
}
BOTH(test_store_set_get)

static void test_store_get_missing_is_enoent(fixture *f) {
    check_absent(f->s, "g3/init/missing");
    check_absent_msg(f, "g3/init/missing");
}
BOTH(test_store_get_missing_is_enoent)

static void test_store_overwrite(fixture *f) {
    tp_store *s = f->s;
    put_str(s, "k", "first");
    put_str(s, "k", "a much longer second value");
    check_str(s, "k", "a much longer second value");
    put_str(s, "k", "3");
    check_str(s, "k", "3");
}
BOTH(test_store_overwrite)

static void test_store_delete_then_get(fixture *f) {
    tp_store *s = f->s;
    put_str(s, "k", "v");
    put_str(s, "other", "w");
    assert_int_equal(s->ops->del(s, "k"), TP_OK);
    check_absent(s, "k");
    check_str(s, "other", "w");
    /* Deleting an absent key is not an error. */
    assert_int_equal(s->ops->del(s, "k"), TP_OK);
    assert_int_equal(s->ops->del(s, "never-set"), TP_OK);
    /* A deleted key is absent for add and compare_set too. */
    int64_t r = 0;
    assert_int_equal(s->ops->add(s, "k", 2, &r), TP_OK);
    assert_int_equal(r, 2);
    assert_int_equal(s->ops->del(s, "k"), TP_OK);
    int swapped = 0;
    assert_int_equal(s->ops->compare_set(s, "k", NULL, 0, "new", 3, &swapped), TP_OK);
    assert_int_equal(swapped, 1);
    check_str(s, "k", "new");
}
BOTH(test_store_delete_then_get)

/* ------------------------------------------------------------------------ */
/* STORE-3: add and compare_set. */

static void test_store_add_from_absent(fixture *f) {
    tp_store *s = f->s;
    int64_t r = -1;
    assert_int_equal(s->ops->add(s, "g0/init/count", 5, &r), TP_OK);
    assert_int_equal(r, 5);
    assert_int_equal(s->ops->add(s, "g0/init/count", -7, &r), TP_OK);
    assert_int_equal(r, -2);
    assert_int_equal(s->ops->add(s, "g0/init/count", 0, &r), TP_OK);
    assert_int_equal(r, -2);
    /* The value is stored as decimal text, readable by get. */
    check_str(s, "g0/init/count", "-2");
    /* add 0 on an absent key reads it as 0 and creates it. */
    assert_int_equal(s->ops->add(s, "zero", 0, &r), TP_OK);
    assert_int_equal(r, 0);
    check_str(s, "zero", "0");
}
BOTH(test_store_add_from_absent)

static void test_store_add_on_set_integer(fixture *f) {
    tp_store *s = f->s;
    int64_t r = 0;
    put_str(s, "n", "41");
    assert_int_equal(s->ops->add(s, "n", 1, &r), TP_OK);
    assert_int_equal(r, 42);
    put_str(s, "n", "-9223372036854775807");
    assert_int_equal(s->ops->add(s, "n", -1, &r), TP_OK);
    assert_int_equal(r, INT64_MIN);
    check_str(s, "n", "-9223372036854775808");
    /* Overflow is refused and leaves the value as it was. */
    r = 99;
    assert_int_equal(s->ops->add(s, "n", -1, &r), TP_ERANGE);
    assert_int_equal(r, 99);
    check_msg(f, "overflows");
    check_str(s, "n", "-9223372036854775808");
    put_str(s, "n", "9223372036854775807");
    assert_int_equal(s->ops->add(s, "n", 1, &r), TP_ERANGE);
    check_str(s, "n", "9223372036854775807");
}
BOTH(test_store_add_on_set_integer)

static void test_store_add_on_non_integer(fixture *f) {
    tp_store *s = f->s;
    static const char *const bad[] = {
        "abc",
        "",
        "12x",
        " 1",
        "1 ",
        "-",
        "+1",
        "1.5",
        "0x10",
        "9223372036854775808", /* one past INT64_MAX */
        "99999999999999999999999",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        put_str(s, "k", bad[i]);
        int64_t r = 7;
        assert_int_equal(s->ops->add(s, "k", 1, &r), TP_EINVAL);
        assert_int_equal(r, 7);
        check_msg(f, "not a decimal integer");
        assert_non_null(strstr(s->errmsg, "'k'"));
        check_str(s, "k", bad[i]); /* untouched */
    }
    /* A value with a NUL inside is not an integer either. */
    static const char nul_inside[3] = {'1', '\0', '2'};
    assert_int_equal(s->ops->set(s, "k", nul_inside, sizeof nul_inside), TP_OK);
    int64_t r = 0;
    assert_int_equal(s->ops->add(s, "k", 1, &r), TP_EINVAL);
    /* The store still works after a refused add (the transaction ended). */
    assert_int_equal(s->ops->add(s, "fine", 3, &r), TP_OK);
    assert_int_equal(r, 3);
}
BOTH(test_store_add_on_non_integer)

static void test_store_compare_set_absent(fixture *f) {
    tp_store *s = f->s;
    int swapped = -1;
    /* expected NULL: create if absent. */
    assert_int_equal(s->ops->compare_set(s, "leader", NULL, 0, "w0", 2, &swapped), TP_OK);
    assert_int_equal(swapped, 1);
    check_str(s, "leader", "w0");
    swapped = -1;
    assert_int_equal(s->ops->compare_set(s, "leader", NULL, 0, "w1", 2, &swapped), TP_OK);
    assert_int_equal(swapped, 0);
    check_str(s, "leader", "w0");
    /* An empty expected value is not "absent". */
    assert_int_equal(s->ops->compare_set(s, "nokey", "", 0, "x", 1, &swapped), TP_OK);
    assert_int_equal(swapped, 0);
    check_absent(s, "nokey");
}
BOTH(test_store_compare_set_absent)

static void test_store_compare_set_value(fixture *f) {
    tp_store *s = f->s;
    int swapped = -1;
    put_str(s, "k", "v1");
    assert_int_equal(s->ops->compare_set(s, "k", "v1", 2, "v2", 2, &swapped), TP_OK);
    assert_int_equal(swapped, 1);
    check_str(s, "k", "v2");
    /* A stale expected value loses and changes nothing. */
    assert_int_equal(s->ops->compare_set(s, "k", "v1", 2, "v3", 2, &swapped), TP_OK);
    assert_int_equal(swapped, 0);
    check_str(s, "k", "v2");
    /* A prefix, a longer value, and NULL (absent) do not match either. */
    assert_int_equal(s->ops->compare_set(s, "k", "v", 1, "x", 1, &swapped), TP_OK);
    assert_int_equal(swapped, 0);
    assert_int_equal(s->ops->compare_set(s, "k", "v2x", 3, "x", 1, &swapped), TP_OK);
    assert_int_equal(swapped, 0);
    assert_int_equal(s->ops->compare_set(s, "k", NULL, 0, "x", 1, &swapped), TP_OK);
    assert_int_equal(swapped, 0);
    check_str(s, "k", "v2");
    /* Empty expected matches an empty value; desired may be empty. */
    assert_int_equal(s->ops->compare_set(s, "k", "v2", 2, NULL, 0, &swapped), TP_OK);
    assert_int_equal(swapped, 1);
    check_value(s, "k", "", 0);
    assert_int_equal(s->ops->compare_set(s, "k", "", 0, "full", 4, &swapped), TP_OK);
    assert_int_equal(swapped, 1);
    check_str(s, "k", "full");
}
BOTH(test_store_compare_set_value)

/* ------------------------------------------------------------------------ */
/* STORE-4: limits. */

static void test_store_key_limits(fixture *f) {
    tp_store *s = f->s;
    char key[TP_STORE_KEY_LEN_MAX + 2];
    memset(key, 'k', TP_STORE_KEY_LEN_MAX);
    key[TP_STORE_KEY_LEN_MAX] = '\0';
    int64_t r = 0;
    int swapped = 0;
    void *v = NULL;
    size_t n = 0;
    /* The longest key works for every op. */
    put_str(s, key, "v");
    check_str(s, key, "v");
    assert_int_equal(s->ops->compare_set(s, key, "v", 1, "1", 1, &swapped), TP_OK);
    assert_int_equal(swapped, 1);
    assert_int_equal(s->ops->add(s, key, 1, &r), TP_OK);
    assert_int_equal(r, 2);
    assert_int_equal(s->ops->del(s, key), TP_OK);
    check_absent(s, key);
    /* One byte more is refused by every op, with a message. */
    key[TP_STORE_KEY_LEN_MAX] = 'k';
    key[TP_STORE_KEY_LEN_MAX + 1] = '\0';
    assert_int_equal(s->ops->set(s, key, "v", 1), TP_EINVAL);
    check_msg(f, "key longer than 255 bytes");
    assert_int_equal(s->ops->get(s, key, &v, &n), TP_EINVAL);
    assert_null(v);
    assert_int_equal(s->ops->add(s, key, 1, &r), TP_EINVAL);
    assert_int_equal(s->ops->compare_set(s, key, NULL, 0, "v", 1, &swapped), TP_EINVAL);
    assert_int_equal(swapped, 0);
    assert_int_equal(s->ops->del(s, key), TP_EINVAL);
    check_msg(f, "del");
    /* So is the empty key. */
    assert_int_equal(s->ops->set(s, "", "v", 1), TP_EINVAL);
    check_msg(f, "empty key");
}
BOTH(test_store_key_limits)

static void test_store_value_limits(fixture *f) {
    tp_store *s = f->s;
    size_t max = TP_STORE_VALUE_LEN_MAX;
    unsigned char *big = malloc(max + 1);
    assert_non_null(big);
    for (size_t i = 0; i <= max; i++)
        big[i] = (unsigned char)(i * 131u + 7u);
    /* The largest value goes in and comes back whole. */
    assert_int_equal(s->ops->set(s, "big", big, max), TP_OK);
    check_value(s, "big", big, max);
    int swapped = 0;
    assert_int_equal(s->ops->compare_set(s, "big", big, max, "s", 1, &swapped), TP_OK);
    assert_int_equal(swapped, 1);
    /* One byte more is refused, as value, as desired and as expected. */
    assert_int_equal(s->ops->set(s, "big", big, max + 1), TP_EINVAL);
    check_msg(f, "over the limit");
    assert_int_equal(s->ops->compare_set(s, "big", "s", 1, big, max + 1, &swapped), TP_EINVAL);
    assert_int_equal(swapped, 0);
    assert_int_equal(s->ops->compare_set(s, "big", big, max + 1, "t", 1, &swapped), TP_EINVAL);
    check_str(s, "big", "s");
    free(big);
}
BOTH(test_store_value_limits)

/* ------------------------------------------------------------------------ */
/* STORE-5, STORE-6: opening. */

static void test_store_open_missing_dir_is_estore(void **state) {
    (void)state;
    const char *path = "/nonexistent-tp-dir/sub/store.db";
    char err[TP_ERRMSG_LEN_MAX] = "";
    tp_store *s = (tp_store *)1;
    assert_int_equal(tp_sqlite_store_open(path, &s, err, sizeof err), TP_ESTORE);
    assert_null(s);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "unable to open"));
    assert_string_equal(tp_errmsg(), err);
}

static void test_store_open_empty_path_is_einval(void **state) {
    (void)state;
    char err[TP_ERRMSG_LEN_MAX] = "";
    tp_store *s = (tp_store *)1;
    assert_int_equal(tp_sqlite_store_open("", &s, err, sizeof err), TP_EINVAL);
    assert_null(s);
    assert_non_null(strstr(err, "empty path"));
    /* errmsg may be omitted. */
    assert_int_equal(tp_sqlite_store_open("", &s, NULL, 0), TP_EINVAL);
}

static void test_store_memory_stores_are_private(void **state) {
    (void)state;
    tp_store *a = NULL, *b = NULL;
    assert_int_equal(tp_sqlite_store_open(":memory:", &a, NULL, 0), TP_OK);
    assert_int_equal(tp_sqlite_store_open(":memory:", &b, NULL, 0), TP_OK);
    put_str(a, "k", "a");
    check_absent(b, "k");
    a->ops->close(a);
    b->ops->close(b);
}

/* STORE-13: an in-memory store names its keys with a number no other store
 * of the process has, the same for the handle's life (a later store gets a
 * new one even where the allocator reuses the first's address). */
static void test_store_mem_instances_are_unique(void **state) {
    (void)state;
    char err[TP_ERRMSG_LEN_MAX];
    tp_store *a = NULL, *b = NULL;
    assert_int_equal(tpi_mem_store_open(&a, err, sizeof err), TP_OK);
    assert_int_equal(tpi_mem_store_open(&b, err, sizeof err), TP_OK);
    assert_non_null(a->ops->instance);
    uint64_t ia = a->ops->instance(a), ib = b->ops->instance(b);
    assert_true(ia != 0 && ib != 0 && ia != ib);
    put_str(a, "k", "a");
    assert_true(a->ops->instance(a) == ia); /* writes do not change it */
    a->ops->close(a);
    tp_store *c = NULL;
    assert_int_equal(tpi_mem_store_open(&c, err, sizeof err), TP_OK);
    uint64_t ic = c->ops->instance(c);
    assert_true(ic != 0 && ic != ia && ic != ib);
    b->ops->close(b);
    c->ops->close(c);
}

/* A file store is shared: two handles see each other's writes, it is in WAL
 * mode, and what was written outlives the handle. */
static void test_store_file_shared_and_persistent(void **state) {
    fixture *f = *state;
    tp_store *other = NULL;
    assert_int_equal(tp_sqlite_store_open(f->path, &other, NULL, 0), TP_OK);
    put_str(f->s, "k", "from first");
    check_str(other, "k", "from first");
    int64_t r = 0;
    assert_int_equal(other->ops->add(other, "n", 10, &r), TP_OK);
    assert_int_equal(f->s->ops->add(f->s, "n", 1, &r), TP_OK);
    assert_int_equal(r, 11);
    char wal[320];
    snprintf(wal, sizeof wal, "%s-wal", f->path);
    assert_int_equal(access(wal, F_OK), 0);
    other->ops->close(other);
    f->s->ops->close(f->s);
    f->s = NULL;
    assert_int_equal(tp_sqlite_store_open(f->path, &f->s, NULL, 0), TP_OK);
    check_str(f->s, "k", "from first");
    check_str(f->s, "n", "11");
}

/* A file that is not a database is refused with TP_ESTORE, not a crash. */
static void test_store_open_not_a_database_is_estore(void **state) {
    fixture *f = *state;
    FILE *fp = fopen(f->path, "wb");
    assert_non_null(fp);
    for (int i = 0; i < 64; i++)
        fputs("this is not an sqlite database file. ", fp);
    fclose(fp);
    char err[TP_ERRMSG_LEN_MAX] = "";
    assert_int_equal(tp_sqlite_store_open(f->path, &f->s, err, sizeof err), TP_ESTORE);
    assert_null(f->s);
    assert_non_null(strstr(err, f->path));
    assert_non_null(strstr(err, "not a database"));
}

/* One handle shared by threads of a process: each op is whole. */
#define TH_THREADS 4
#define TH_ADDS 500
/* etcd commits each add (a range and a txn) through raft: fewer of them. */
#define TH_ADDS_ETCD 100

typedef struct th_arg {
    tp_store *s;
    int adds;
} th_arg;

static void *th_adder(void *arg) {
    th_arg *a = arg;
    tp_store *s = a->s;
    for (int i = 0; i < a->adds; i++) {
        int64_t r = 0;
        if (s->ops->add(s, "n", 1, &r) != TP_OK)
            return (void *)1;
        void *v = NULL;
        size_t n = 0;
        if (s->ops->get(s, "n", &v, &n) != TP_OK)
            return (void *)1;
        free(v);
    }
    return NULL;
}

static void test_store_threads_share_a_handle(fixture *f) {
    pthread_t t[TH_THREADS];
    th_arg a = {f->s, strncmp(f->path, "etcd://", 7) == 0 ? TH_ADDS_ETCD : TH_ADDS};
    for (int i = 0; i < TH_THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, th_adder, &a), 0);
    for (int i = 0; i < TH_THREADS; i++) {
        void *ret = (void *)1;
        assert_int_equal(pthread_join(t[i], &ret), 0);
        assert_null(ret);
    }
    char want[16];
    snprintf(want, sizeof want, "%d", TH_THREADS * a.adds);
    check_str(f->s, "n", want);
}
BOTH(test_store_threads_share_a_handle)

/* ------------------------------------------------------------------------ */
/* STORE-6: many processes on one file. */

#define MP_CHILDREN 8
#define MP_ADDS 200
#define MP_RACES 50

/* What a child reports through the pipe: one write, under PIPE_BUF. */
typedef struct mp_report {
    int32_t id;
    uint8_t won[MP_RACES];       /* won[r]: this child created race/<r> */
    int32_t installed[MP_RACES]; /* the counter values its CAS increments installed */
} mp_report;

_Static_assert(sizeof(mp_report) <= 512, "one atomic pipe write");

static _Noreturn void mp_die(const char *what, tp_status st) {
    fprintf(stderr, "child %d: %s: %s: %s\n", (int)getpid(), what, tp_status_name(st), tp_errmsg());
    _exit(2);
}

/* Reads the CAS counter (absent = 0) and moves it up by one with
 * compare_set, retrying until this child's swap wins. */
static int32_t mp_cas_increment(tp_store *s) {
    for (int tries = 0; tries < 100000; tries++) {
        void *v = NULL;
        size_t n = 0;
        long old = 0;
        tp_status st = s->ops->get(s, "cas", &v, &n);
        if (st == TP_OK)
            old = strtol(v, NULL, 10);
        else if (st != TP_ENOENT)
            mp_die("get cas", st);
        char want[16];
        int want_len = snprintf(want, sizeof want, "%ld", old + 1);
        int swapped = 0;
        st = s->ops->compare_set(s, "cas", v, v ? n : 0, want, (size_t)want_len, &swapped);
        free(v);
        if (st != TP_OK)
            mp_die("compare_set cas", st);
        if (swapped)
            return (int32_t)(old + 1);
    }
    mp_die("compare_set cas never won", TP_OK);
}

static _Noreturn void mp_child(const char *path, int id, int go_fd, int report_fd) {
    char c;
    /* Start together: wait for the parent to close the go pipe. */
    while (read(go_fd, &c, 1) < 0 && errno == EINTR) {
    }
    tp_store *s = NULL;
    char err[TP_ERRMSG_LEN_MAX];
    tp_status st = store_open_any(path, &s, err, sizeof err);
    if (st != TP_OK)
        mp_die("open", st);
    mp_report rep = {.id = id};
    uint8_t me = (uint8_t)('A' + id);
    for (int i = 0, r = 0; i < MP_ADDS; i++) {
        int64_t result = 0;
        if ((st = s->ops->add(s, "g1/count", 1, &result)) != TP_OK)
            mp_die("add", st);
        if (result < 1 || result > MP_CHILDREN * MP_ADDS)
            mp_die("add result out of range", TP_OK);
        /* Interleave the races with the adds so they contend with each other. */
        if (i % (MP_ADDS / MP_RACES) == 0 && r < MP_RACES) {
            char key[32];
            snprintf(key, sizeof key, "g1/race/%d", r);
            int swapped = 0;
            if ((st = s->ops->compare_set(s, key, NULL, 0, &me, 1, &swapped)) != TP_OK)
                mp_die("compare_set race", st);
            rep.won[r] = (uint8_t)swapped;
            rep.installed[r] = mp_cas_increment(s);
            r++;
        }
    }
    s->ops->close(s);
    if (write(report_fd, &rep, sizeof rep) != (ssize_t)sizeof rep)
        _exit(3);
    _exit(0);
}

static void test_store_multi_process_atomic(void **state) {
    fixture *f = *state;
    int go[2], rep[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(rep), 0);
    pid_t pids[MP_CHILDREN];
    for (int i = 0; i < MP_CHILDREN; i++) {
        fflush(NULL);
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            close(go[1]);
            close(rep[0]);
            mp_child(f->path, i, go[0], rep[1]);
        }
    }
    close(go[0]);
    close(rep[1]);
    close(go[1]); /* go: every child opens the fresh file at once */

    mp_report reports[MP_CHILDREN];
    int got = 0;
    while (got < MP_CHILDREN) {
        ssize_t n = read(rep[0], &reports[got], sizeof reports[got]);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        assert_int_equal(n, sizeof reports[got]);
        got++;
    }
    close(rep[0]);
    for (int i = 0; i < MP_CHILDREN; i++) {
        int status = 0;
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    assert_int_equal(got, MP_CHILDREN);

    assert_int_equal(store_open_any(f->path, &f->s, NULL, 0), TP_OK);
    tp_store *s = f->s;
    /* Every add counted exactly once. */
    int64_t total = 0;
    assert_int_equal(s->ops->add(s, "g1/count", 0, &total), TP_OK);
    assert_int_equal(total, MP_CHILDREN * MP_ADDS);
    /* Each race has exactly one winner, and the store holds the winner's mark. */
    for (int r = 0; r < MP_RACES; r++) {
        int winners = 0, winner = -1;
        for (int c = 0; c < MP_CHILDREN; c++) {
            if (reports[c].won[r]) {
                winners++;
                winner = reports[c].id;
            }
        }
        assert_int_equal(winners, 1);
        char key[32], mark = (char)('A' + winner);
        snprintf(key, sizeof key, "g1/race/%d", r);
        check_value(s, key, &mark, 1);
    }
    /* CAS increments: every installed value is unique, together 1..total. */
    enum { CAS_TOTAL = MP_CHILDREN * MP_RACES };
    uint8_t seen[CAS_TOTAL + 1] = {0};
    for (int c = 0; c < MP_CHILDREN; c++) {
        for (int r = 0; r < MP_RACES; r++) {
            int32_t v = reports[c].installed[r];
            assert_true(v >= 1 && v <= CAS_TOTAL);
            assert_int_equal(seen[v], 0);
            seen[v] = 1;
        }
    }
    char want[16];
    snprintf(want, sizeof want, "%d", CAS_TOTAL);
    check_str(s, "cas", want);
}

/* The same race on one etcd prefix: add and compare_set by txn (ETCD-5). */
static void test_store_multi_process_atomic_etcd(void **state) {
    SKIP_WITHOUT_ETCD((fixture *)*state);
    test_store_multi_process_atomic(state);
}

/* ------------------------------------------------------------------------ */
/* STORE-10: scan. */

typedef struct scan_log {
    char keys[8][32];
    char values[8][32];
    int n, stop_after;
} scan_log;

static int log_key(void *arg, const char *key, const void *value, size_t len) {
    scan_log *l = arg;
    if (l->n < 8) {
        snprintf(l->keys[l->n], sizeof l->keys[l->n], "%s", key);
        snprintf(l->values[l->n], sizeof l->values[l->n], "%.*s", (int)len, (const char *)value);
        assert_int_equal(((const char *)value)[len], '\0'); /* NUL-terminated past len */
    }
    l->n++;
    return l->stop_after && l->n == l->stop_after;
}

static void test_store_scan(fixture *f) {
    tp_store *s = f->s;
    assert_non_null(s->ops->scan);
    put_str(s, "g0/init/rank/10", "ten");
    put_str(s, "g0/init/rank/2", "two");
    put_str(s, "g0/init/rank/0", "zero");
    put_str(s, "g0/init/rankz", "not under the prefix");
    put_str(s, "g0/init/ran", "before the prefix");
    put_str(s, "g1/init/rank/0", "another generation");
    scan_log l = {0};
    assert_int_equal(s->ops->scan(s, "g0/init/rank/", log_key, &l), TP_OK);
    assert_int_equal(l.n, 3); /* in key order: bytes, not numbers */
    assert_string_equal(l.keys[0], "g0/init/rank/0");
    assert_string_equal(l.values[0], "zero");
    assert_string_equal(l.keys[1], "g0/init/rank/10");
    assert_string_equal(l.values[1], "ten");
    assert_string_equal(l.keys[2], "g0/init/rank/2");
    /* fn stops it. */
    scan_log stop = {.stop_after = 2};
    assert_int_equal(s->ops->scan(s, "g0/init/rank/", log_key, &stop), TP_OK);
    assert_int_equal(stop.n, 2);
    /* Nothing under a prefix: no call, TP_OK. */
    scan_log none = {0};
    assert_int_equal(s->ops->scan(s, "g9/", log_key, &none), TP_OK);
    assert_int_equal(none.n, 0);
    /* The key rules apply to the prefix (STORE-4). */
    assert_int_equal(s->ops->scan(s, "", log_key, &none), TP_EINVAL);
}
BOTH(test_store_scan)

int main(void) {
    const struct CMUnitTest tests[] = {
        TEST_BOTH(test_store_set_get),
        TEST_BOTH(test_store_get_missing_is_enoent),
        TEST_BOTH(test_store_overwrite),
        TEST_BOTH(test_store_delete_then_get),
        TEST_BOTH(test_store_add_from_absent),
        TEST_BOTH(test_store_add_on_set_integer),
        TEST_BOTH(test_store_add_on_non_integer),
        TEST_BOTH(test_store_compare_set_absent),
        TEST_BOTH(test_store_compare_set_value),
        TEST_BOTH(test_store_key_limits),
        TEST_BOTH(test_store_value_limits),
        TEST_BOTH(test_store_threads_share_a_handle),
        TEST_BOTH(test_store_scan),
        cmocka_unit_test(test_store_open_missing_dir_is_estore),
        cmocka_unit_test(test_store_open_empty_path_is_einval),
        cmocka_unit_test(test_store_memory_stores_are_private),
        cmocka_unit_test(test_store_mem_instances_are_unique),
        cmocka_unit_test_setup_teardown(test_store_file_shared_and_persistent, setup_file,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_store_open_not_a_database_is_estore, setup_dir,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_store_multi_process_atomic, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_store_multi_process_atomic_etcd, setup_etcd_url,
                                        teardown),
    };
    return cmocka_run_group_tests_name("store", tests, NULL, teardown_group);
}
