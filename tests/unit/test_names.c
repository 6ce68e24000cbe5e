/*
 * test_names.c: name validation (tpi_name_valid, spec/api.md "Name", INIT-2)
 * and the registry rules of tp_register_function and tp_new_method
 * (FUNC-1, METHOD-1). Registration works before init, on the process's
 * default context, so no worker is started here. POSIX regex is the
 * independent model for the character rule.
 */
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/context.h"
#include "common/registry.h"
#include "tensorplay/rpc.h"
#include "tensorplay/rpc_backend.h"

static const char NAME_RE[] = "^[A-Za-z0-9_:-]+$";

/* The reference: the spec's regex plus its length bound. */
static int model_valid(regex_t *re, const char *s) {
    if (!s)
        return 0;
    size_t n = strlen(s);
    return n >= 1 && n <= TP_NAME_LEN_MAX && regexec(re, s, 0, NULL, 0) == 0;
}

static void compile_re(regex_t *re) {
    assert_int_equal(regcomp(re, NAME_RE, REG_EXTENDED | REG_NOSUB), 0);
}

/* A string of n copies of c (caller frees). */
static char *repeat(char c, size_t n) {
    char *s = malloc(n + 1);
    assert_non_null(s);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

/* ---- tpi_name_valid ----------------------------------------------------------- */

static void test_names_allowed_characters(void **state) {
    (void)state;
    const char *good[] = {"a",
                          "Z",
                          "0",
                          "_",
                          ":",
                          "-",
                          "worker0",
                          "trainer:3",
                          "ps-1_a",
                          "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                          "abcdefghijklmnopqrstuvwxyz",
                          "0123456789",
                          "::",
                          "--",
                          "__",
                          "-leading-dash",
                          ":0"};
    const char *bad[] = {"a b",   "a.b", "a/b", "w\t", "\n",  "é",   "a\xff", "w0 ",
                         " w0",   "a,b", "a*",  "a+b", "[a]", "a$",  "^a",    "a\\b",
                         "\"a\"", "a'",  "a=b", "a@b", "a#b", "a%b", "a!"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        size_t len = 999;
        assert_true(tpi_name_valid(good[i], &len));
        assert_int_equal(len, strlen(good[i]));
        assert_true(tpi_name_valid(good[i], NULL)); /* len_out is optional */
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(tpi_name_valid(bad[i], NULL));
}

static void test_names_empty_and_null_rejected(void **state) {
    (void)state;
    assert_false(tpi_name_valid(NULL, NULL));
    size_t len = 5;
    assert_false(tpi_name_valid(NULL, &len));
    assert_false(tpi_name_valid("", NULL));
    assert_false(tpi_name_valid("", &len));
}

static void test_names_length_bounds(void **state) {
    (void)state;
    for (size_t n = 1; n <= TP_NAME_LEN_MAX + 3; n++) {
        char *s = repeat('x', n);
        size_t len = 0;
        int ok = tpi_name_valid(s, &len);
        if (n <= TP_NAME_LEN_MAX) {
            assert_true(ok);
            assert_int_equal(len, n);
        } else {
            assert_false(ok);
        }
        free(s);
    }
    char *s127 = repeat('a', 127), *s128 = repeat('a', 128), *s4k = repeat('a', 4096);
    assert_true(tpi_name_valid(s127, NULL));
    assert_false(tpi_name_valid(s128, NULL));
    assert_false(tpi_name_valid(s4k, NULL));
    /* A bad character past the bound is still a rejection, not a read past it. */
    s128[127] = ' ';
    assert_false(tpi_name_valid(s128, NULL));
    free(s127);
    free(s128);
    free(s4k);
}

/* Every byte value, alone, first, in the middle and last, against the regex. */
static void test_names_every_byte_matches_regex(void **state) {
    (void)state;
    regex_t re;
    compile_re(&re);
    int accepted = 0;
    for (int b = 0; b < 256; b++) {
        char alone[2] = {(char)b, 0};
        char first[4] = {(char)b, 'a', 'b', 0};
        char mid[4] = {'a', (char)b, 'b', 0};
        char last[4] = {'a', 'b', (char)b, 0};
        const char *forms[] = {alone, first, mid, last};
        for (size_t f = 0; f < 4; f++) {
            int want = model_valid(&re, forms[f]);
            int got = tpi_name_valid(forms[f], NULL);
            if (want != got)
                fail_msg("byte 0x%02x in form %zu: tpi_name_valid %d, regex %d", b, f, got, want);
        }
        /* Byte 0 ends the string: "a\0b" is the valid name "a". */
        int expect_alone = (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') ||
                           (b >= '0' && b <= '9') || b == '_' || b == ':' || b == '-';
        assert_int_equal(tpi_name_valid(alone, NULL), expect_alone);
        accepted += expect_alone;
    }
    assert_int_equal(accepted, 26 + 26 + 10 + 3);
    /* The 127-byte bound with every allowed byte at the end. */
    char buf[TP_NAME_LEN_MAX + 2];
    for (int b = 1; b < 256; b++) {
        memset(buf, 'n', sizeof buf);
        buf[TP_NAME_LEN_MAX - 1] = (char)b;
        buf[TP_NAME_LEN_MAX] = '\0';
        assert_int_equal(tpi_name_valid(buf, NULL), model_valid(&re, buf));
        buf[TP_NAME_LEN_MAX] = (char)b;
        buf[TP_NAME_LEN_MAX + 1] = '\0';
        assert_false(tpi_name_valid(buf, NULL)); /* 128 bytes: always too long */
    }
    regfree(&re);
}

/* Random strings from a biased alphabet, against the model. */
static void test_names_random_strings_match_regex(void **state) {
    (void)state;
    regex_t re;
    compile_re(&re);
    uint64_t s = 99;
    char buf[200];
    int valid = 0;
    for (int i = 0; i < 20000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        size_t n = (size_t)(s >> 33) % 140;
        for (size_t j = 0; j < n; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            unsigned r = (unsigned)(s >> 33);
            /* Mostly name characters, sometimes any non-NUL byte. */
            static const char alpha[] = "aZ09_:-";
            buf[j] = r % 50 ? alpha[r % 7] : (char)(1 + (r >> 8) % 255);
        }
        buf[n] = '\0';
        int want = model_valid(&re, buf);
        assert_int_equal(tpi_name_valid(buf, NULL), want);
        valid += want;
    }
    assert_true(valid > 1000 && valid < 19000); /* both outcomes were exercised */
    regfree(&re);
}

/* ---- Registration (FUNC-1, METHOD-1), before init on the process context ------------ */

static tp_status fn_a(tp_call *call, const tp_value *args, const tp_value *kwargs,
                      tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)result, (void)user_data;
    return TP_OK;
}

static tp_status fn_b(tp_call *call, const tp_value *args, const tp_value *kwargs,
                      tp_value **result, void *user_data) {
    (void)call, (void)args, (void)kwargs, (void)result, (void)user_data;
    return TP_EINVAL;
}

/* Every registration test starts and ends with an empty registry. */
static int clear_registry(void **state) {
    (void)state;
    tpi_registry_clear(tp_context_current());
    return 0;
}

static int found(const char *class_name, const char *name, tp_fn *fn, void **ud) {
    tp_fn f = NULL;
    void *u = NULL;
    int ok = tpi_registry_find(tp_context_current(), class_name, name, &f, &u, NULL);
    if (fn)
        *fn = f;
    if (ud)
        *ud = u;
    return ok;
}

static void test_names_register_function_before_init(void **state) {
    (void)state;
    assert_false(tp_is_initialized());
    int ud1 = 1, ud2 = 2;
    assert_int_equal(tp_register_function("add", fn_a, &ud1), TP_OK);
    assert_int_equal(tp_register_function("sub", fn_b, &ud2), TP_OK);
    tp_fn f;
    void *u;
    assert_true(found(NULL, "add", &f, &u));
    assert_ptr_equal(f, fn_a);
    assert_ptr_equal(u, &ud1);
    assert_true(found(NULL, "sub", &f, &u));
    assert_ptr_equal(f, fn_b);
    assert_ptr_equal(u, &ud2);
    assert_false(found(NULL, "mul", NULL, NULL));
    assert_false(found(NULL, "ad", NULL, NULL));
    assert_false(found(NULL, "addd", NULL, NULL));
    /* The name is copied: the caller's buffer may change afterwards. */
    char name[8] = "tmp";
    assert_int_equal(tp_register_function(name, fn_a, NULL), TP_OK);
    strcpy(name, "zzz");
    assert_true(found(NULL, "tmp", NULL, NULL));
    assert_false(found(NULL, "zzz", NULL, NULL));
    assert_false(tp_is_initialized());
}

static void test_names_register_duplicate_ealready(void **state) {
    (void)state;
    int ud1 = 1, ud2 = 2;
    assert_int_equal(tp_register_function("dup", fn_a, &ud1), TP_OK);
    assert_int_equal(tp_register_function("dup", fn_b, &ud2), TP_EALREADY);
    assert_non_null(strstr(tp_errmsg(), "dup")); /* FUNC-1: the message names it */
    assert_int_equal(tp_register_function("dup", fn_a, &ud1), TP_EALREADY);
    /* The first registration stays. */
    tp_fn f;
    void *u;
    assert_true(found(NULL, "dup", &f, &u));
    assert_ptr_equal(f, fn_a);
    assert_ptr_equal(u, &ud1);
    /* Names are case-sensitive: "Dup" is another name. */
    assert_int_equal(tp_register_function("Dup", fn_b, NULL), TP_OK);
    assert_true(found(NULL, "Dup", &f, NULL));
    assert_ptr_equal(f, fn_b);
}

static void test_names_register_bad_names_einval(void **state) {
    (void)state;
    char *n127 = repeat('f', 127), *n128 = repeat('f', 128);
    const char *bad[] = {"", "a b", "a.b", "f()", "é", "tab\t", n128};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(tp_register_function(bad[i], fn_a, NULL), TP_EINVAL);
        assert_true(tp_errmsg()[0] != '\0');
        assert_false(found(NULL, bad[i], NULL, NULL));
    }
    assert_int_equal(tp_register_function(NULL, fn_a, NULL), TP_EINVAL);
    /* NULL fn is TP_EINVAL too, and registers nothing. */
    assert_int_equal(tp_register_function("nofn", NULL, NULL), TP_EINVAL);
    assert_false(found(NULL, "nofn", NULL, NULL));
    assert_int_equal(tp_register_function("nofn", fn_a, NULL), TP_OK);
    /* 127 bytes is a name. */
    assert_int_equal(tp_register_function(n127, fn_a, NULL), TP_OK);
    assert_true(found(NULL, n127, NULL, NULL));
    free(n127);
    free(n128);
}

static void test_names_new_method_rules(void **state) {
    (void)state;
    int ud = 7;
    assert_int_equal(tp_new_method("Counter", "incr", fn_a, &ud), TP_OK);
    assert_int_equal(tp_new_method("Counter", "get", fn_b, NULL), TP_OK);
    /* The same method name on another class is another method. */
    assert_int_equal(tp_new_method("Other", "incr", fn_b, NULL), TP_OK);
    /* A registered pair is TP_EALREADY (METHOD-1). */
    assert_int_equal(tp_new_method("Counter", "incr", fn_b, NULL), TP_EALREADY);
    tp_fn f;
    void *u;
    assert_true(found("Counter", "incr", &f, &u));
    assert_ptr_equal(f, fn_a);
    assert_ptr_equal(u, &ud);
    assert_true(found("Other", "incr", &f, NULL));
    assert_ptr_equal(f, fn_b);
    assert_false(found("Counter", "decr", NULL, NULL));
    assert_false(found("Missing", "incr", NULL, NULL));
    /* Methods and functions never collide: a function "incr" is separate. */
    assert_false(found(NULL, "incr", NULL, NULL));
    assert_int_equal(tp_register_function("incr", fn_b, NULL), TP_OK);
    assert_true(found(NULL, "incr", &f, NULL));
    assert_ptr_equal(f, fn_b);
    assert_true(found("Counter", "incr", &f, NULL));
    assert_ptr_equal(f, fn_a);
    /* A function cannot be named like a method key: '.' is not a name character. */
    assert_int_equal(tp_register_function("Counter.incr", fn_b, NULL), TP_EINVAL);

    /* Bad class or method names, and a NULL fn. */
    char *n127 = repeat('m', 127), *n128 = repeat('m', 128);
    assert_int_equal(tp_new_method("", "m", fn_a, NULL), TP_EINVAL);
    assert_int_equal(tp_new_method("C", "", fn_a, NULL), TP_EINVAL);
    assert_int_equal(tp_new_method(NULL, "m", fn_a, NULL), TP_EINVAL);
    assert_int_equal(tp_new_method("C", NULL, fn_a, NULL), TP_EINVAL);
    assert_int_equal(tp_new_method("C.D", "m", fn_a, NULL), TP_EINVAL);
    assert_int_equal(tp_new_method("C", "m.n", fn_a, NULL), TP_EINVAL);
    assert_int_equal(tp_new_method("C", "m n", fn_a, NULL), TP_EINVAL);
    assert_int_equal(tp_new_method(n128, "m", fn_a, NULL), TP_EINVAL);
    assert_int_equal(tp_new_method("C", n128, fn_a, NULL), TP_EINVAL);
    assert_int_equal(tp_new_method("C", "m", NULL, NULL), TP_EINVAL);
    assert_false(found("C", "m", NULL, NULL));
    /* Both parts at the longest length fit. */
    assert_int_equal(tp_new_method(n127, n127, fn_a, &ud), TP_OK);
    assert_true(found(n127, n127, &f, &u));
    assert_ptr_equal(u, &ud);
    assert_int_equal(tp_new_method(n127, n127, fn_a, NULL), TP_EALREADY);
    free(n127);
    free(n128);
}

/* Many names registered in a scrambled order are all found (the registry is a
 * sorted array with binary search). */
static void test_names_registry_many_names(void **state) {
    (void)state;
    enum { N = 600 };
    char name[32];
    for (int i = 0; i < N; i++) {
        int k = (i * 367) % N; /* 367 is coprime with 600: a permutation */
        snprintf(name, sizeof name, "f%d", k);
        assert_int_equal(tp_register_function(name, fn_a, (void *)(intptr_t)(k + 1)), TP_OK);
    }
    for (int k = 0; k < N; k++) {
        void *u;
        snprintf(name, sizeof name, "f%d", k);
        assert_true(found(NULL, name, NULL, &u));
        assert_ptr_equal(u, (void *)(intptr_t)(k + 1));
        assert_int_equal(tp_register_function(name, fn_b, NULL), TP_EALREADY);
    }
    assert_false(found(NULL, "f600", NULL, NULL));
    assert_false(found(NULL, "f", NULL, NULL));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_allowed_characters),
        cmocka_unit_test(test_names_empty_and_null_rejected),
        cmocka_unit_test(test_names_length_bounds),
        cmocka_unit_test(test_names_every_byte_matches_regex),
        cmocka_unit_test(test_names_random_strings_match_regex),
        cmocka_unit_test_setup_teardown(test_names_register_function_before_init, clear_registry,
                                        clear_registry),
        cmocka_unit_test_setup_teardown(test_names_register_duplicate_ealready, clear_registry,
                                        clear_registry),
        cmocka_unit_test_setup_teardown(test_names_register_bad_names_einval, clear_registry,
                                        clear_registry),
        cmocka_unit_test_setup_teardown(test_names_new_method_rules, clear_registry,
                                        clear_registry),
        cmocka_unit_test_setup_teardown(test_names_registry_many_names, clear_registry,
                                        clear_registry),
    };
    return cmocka_run_group_tests_name("names", tests, NULL, NULL);
}
