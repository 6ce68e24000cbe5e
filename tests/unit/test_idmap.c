/*
 * test_idmap.c: the open-addressing id map (common/idmap.c): put/get/del,
 * duplicate keys, growth across many sizes, keys that differ in one half
 * only, wrap-around probe runs, and a long randomized differential test
 * against a sorted-array model. Linear probing with backward-shift deletion
 * goes wrong in subtle ways (a member moved past its home, a run cut short
 * at the table's end), so the randomized test checks every lookup and the
 * structural invariant of the table itself.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/idmap.h"

/* ---- Helpers ----------------------------------------------------------------------- */

/* A tiny deterministic PRNG (splitmix64): the test's own, seeded. */
typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rng_below(rng *r, uint64_t n) {
    return rng_next(r) % n;
}

static tpi_gid gid(uint32_t worker, uint64_t local) {
    tpi_gid k = {worker, local};
    return k;
}

/* Distinct non-NULL values that encode their key, so a wrong slot shows. */
static void *val_of(tpi_gid k) {
    return (void *)(uintptr_t)(((uint64_t)k.worker * 0x100000001b3ull) ^ (k.local << 1) ^
                               0x5a5a5a5a5a5a5a5bull);
}

static int is_pow2(size_t x) {
    return x && (x & (x - 1)) == 0;
}

/* The home slot of key in a table of capacity 16, found by observation (the
 * only member of a fresh map sits at its home), so the test does not copy
 * the hash function. */
static size_t home16(tpi_gid k) {
    tpi_idmap m;
    tpi_idmap_init(&m);
    assert_int_equal(tpi_idmap_put(&m, k, val_of(k)), TP_OK);
    assert_int_equal(m.cap, 16);
    size_t home = SIZE_MAX;
    for (size_t i = 0; i < m.cap; i++)
        if (m.slots[i].value)
            home = i;
    tpi_idmap_free(&m);
    assert_true(home != SIZE_MAX);
    return home;
}

/*
 * The table's own invariants: len counts the occupied slots, the load stays
 * under 3/4, the capacity is a power of two, and every member is reachable
 * from its home: get finds it (no empty slot cuts its probe run).
 */
static void check_structure(const tpi_idmap *m) {
    size_t used = 0;
    if (m->cap == 0) {
        assert_int_equal(m->len, 0);
        return;
    }
    assert_true(is_pow2(m->cap));
    assert_true(m->len * 4 <= m->cap * 3);
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].value)
            continue;
        used++;
        assert_ptr_equal(tpi_idmap_get(m, m->slots[i].key), m->slots[i].value);
        for (size_t j = i + 1; m->cap <= 64 && j < m->cap; j++) /* keys are unique */
            if (m->slots[j].value)
                assert_false(tpi_gid_eq(m->slots[i].key, m->slots[j].key));
    }
    assert_int_equal(used, m->len);
}

/* ---- Basic operations ------------------------------------------------------------ */

static void test_idmap_empty_map(void **state) {
    (void)state;
    tpi_idmap m;
    tpi_idmap_init(&m);
    assert_int_equal(m.len, 0);
    assert_int_equal(m.cap, 0);
    assert_null(tpi_idmap_get(&m, gid(0, 0)));
    assert_null(tpi_idmap_get(&m, gid(UINT32_MAX, UINT64_MAX)));
    assert_null(tpi_idmap_del(&m, gid(1, 2)));
    assert_int_equal(m.len, 0);
    tpi_idmap_free(&m);
    tpi_idmap_free(&m); /* free leaves an empty map: freeing again is harmless */
    assert_null(m.slots);
}

static void test_idmap_put_get_del(void **state) {
    (void)state;
    tpi_idmap m;
    tpi_idmap_init(&m);
    int a = 1, b = 2, c = 3;
    assert_int_equal(tpi_idmap_put(&m, gid(1, 7), &a), TP_OK);
    assert_int_equal(tpi_idmap_put(&m, gid(2, 7), &b), TP_OK);
    assert_int_equal(tpi_idmap_put(&m, gid(0, 0), &c), TP_OK);
    assert_int_equal(m.len, 3);
    assert_ptr_equal(tpi_idmap_get(&m, gid(1, 7)), &a);
    assert_ptr_equal(tpi_idmap_get(&m, gid(2, 7)), &b);
    assert_ptr_equal(tpi_idmap_get(&m, gid(0, 0)), &c);
    assert_null(tpi_idmap_get(&m, gid(7, 1)));
    assert_null(tpi_idmap_get(&m, gid(1, 8)));

    assert_ptr_equal(tpi_idmap_del(&m, gid(1, 7)), &a);
    assert_int_equal(m.len, 2);
    assert_null(tpi_idmap_get(&m, gid(1, 7)));
    assert_null(tpi_idmap_del(&m, gid(1, 7))); /* a second delete finds nothing */
    assert_int_equal(m.len, 2);
    assert_ptr_equal(tpi_idmap_get(&m, gid(2, 7)), &b);

    /* A deleted key can be put again, with a new value. */
    assert_int_equal(tpi_idmap_put(&m, gid(1, 7), &c), TP_OK);
    assert_ptr_equal(tpi_idmap_get(&m, gid(1, 7)), &c);
    check_structure(&m);
    tpi_idmap_free(&m);
}

static void test_idmap_duplicate_put_ealready(void **state) {
    (void)state;
    tpi_idmap m;
    tpi_idmap_init(&m);
    int a = 1, b = 2;
    for (uint64_t i = 0; i < 100; i++)
        assert_int_equal(tpi_idmap_put(&m, gid(3, i), &a), TP_OK);
    for (uint64_t i = 0; i < 100; i++) {
        assert_int_equal(tpi_idmap_put(&m, gid(3, i), &b), TP_EALREADY);
        /* The first value stays; nothing was added. */
        assert_ptr_equal(tpi_idmap_get(&m, gid(3, i)), &a);
    }
    assert_int_equal(m.len, 100);
    /* A duplicate put that lands on a growth boundary does not corrupt the map. */
    size_t cap = m.cap;
    while (m.len * 4 + 4 <= cap * 3)
        assert_int_equal(tpi_idmap_put(&m, gid(4, m.len), &a), TP_OK);
    assert_int_equal(tpi_idmap_put(&m, gid(3, 0), &b), TP_EALREADY);
    assert_ptr_equal(tpi_idmap_get(&m, gid(3, 0)), &a);
    check_structure(&m);
    tpi_idmap_free(&m);
}

/* Keys that differ only in the worker, or only in the local counter, or are
 * each other's halves swapped, are all distinct. */
static void test_idmap_keys_differ_in_one_half(void **state) {
    (void)state;
    tpi_idmap m;
    tpi_idmap_init(&m);
    const uint64_t locals[] = {0, 1, 42, UINT32_MAX, (uint64_t)UINT32_MAX + 1, UINT64_MAX};
    const uint32_t workers[] = {0, 1, 42, UINT32_MAX};
    /* Same local, 2000 workers; same worker, 2000 locals. */
    for (size_t l = 0; l < sizeof locals / sizeof locals[0]; l++)
        for (uint32_t w = 0; w < 2000; w++)
            assert_int_equal(tpi_idmap_put(&m, gid(w, locals[l]), val_of(gid(w, locals[l]))),
                             TP_OK);
    for (size_t w = 0; w < sizeof workers / sizeof workers[0]; w++) {
        for (uint64_t l = 0; l < 2000; l++) {
            tpi_gid k = gid(workers[w], l + 5000); /* disjoint from the locals above */
            assert_int_equal(tpi_idmap_put(&m, k, val_of(k)), TP_OK);
        }
    }
    /* Halves swapped: (a, b) and (b, a). */
    for (uint32_t i = 0; i < 500; i++) {
        tpi_gid k1 = gid(100000 + i, 200000 + (uint64_t)i);
        tpi_gid k2 = gid(200000 + i, 100000 + (uint64_t)i);
        assert_int_equal(tpi_idmap_put(&m, k1, val_of(k1)), TP_OK);
        assert_int_equal(tpi_idmap_put(&m, k2, val_of(k2)), TP_OK);
    }
    /* The worker's bits mirrored into the local's halves. */
    for (uint32_t w = 3000; w < 3300; w++) {
        tpi_gid k1 = gid(w, (uint64_t)w << 32), k2 = gid(w, (uint64_t)w << 32 | w);
        assert_int_equal(tpi_idmap_put(&m, k1, val_of(k1)), TP_OK);
        assert_int_equal(tpi_idmap_put(&m, k2, val_of(k2)), TP_OK);
    }
    size_t expect = 6 * 2000 + 4 * 2000 + 1000 + 600;
    assert_int_equal(m.len, expect);
    check_structure(&m);
    for (size_t l = 0; l < sizeof locals / sizeof locals[0]; l++)
        for (uint32_t w = 0; w < 2000; w++)
            assert_ptr_equal(tpi_idmap_get(&m, gid(w, locals[l])), val_of(gid(w, locals[l])));
    /* Delete the "same local" group with local 42 and check its neighbours. */
    for (uint32_t w = 0; w < 2000; w++)
        assert_ptr_equal(tpi_idmap_del(&m, gid(w, 42)), val_of(gid(w, 42)));
    for (uint32_t w = 0; w < 2000; w++) {
        assert_null(tpi_idmap_get(&m, gid(w, 42)));
        assert_ptr_equal(tpi_idmap_get(&m, gid(w, 0)), val_of(gid(w, 0)));
        assert_ptr_equal(tpi_idmap_get(&m, gid(w, 1)), val_of(gid(w, 1)));
        assert_ptr_equal(tpi_idmap_get(&m, gid(w, UINT64_MAX)), val_of(gid(w, UINT64_MAX)));
    }
    for (size_t w = 0; w < sizeof workers / sizeof workers[0]; w++)
        for (uint64_t l = 0; l < 2000; l++)
            assert_ptr_equal(tpi_idmap_get(&m, gid(workers[w], l + 5000)),
                             val_of(gid(workers[w], l + 5000)));
    for (uint32_t i = 0; i < 500; i++) {
        tpi_gid k1 = gid(100000 + i, 200000 + (uint64_t)i);
        tpi_gid k2 = gid(200000 + i, 100000 + (uint64_t)i);
        assert_ptr_equal(tpi_idmap_del(&m, k1), val_of(k1));
        assert_ptr_equal(tpi_idmap_get(&m, k2), val_of(k2));
    }
    assert_int_equal(m.len, expect - 2000 - 500);
    check_structure(&m);
    tpi_idmap_free(&m);
}

/* ---- Growth ----------------------------------------------------------------------- */

static void fill_check_drain(size_t n, rng *r) {
    tpi_idmap m;
    tpi_idmap_init(&m);
    size_t last_cap = 0;
    for (size_t i = 0; i < n; i++) {
        tpi_gid k = gid((uint32_t)(i % 7), i * 3 + 1);
        assert_int_equal(tpi_idmap_put(&m, k, val_of(k)), TP_OK);
        assert_int_equal(m.len, i + 1);
        assert_true(m.cap >= last_cap); /* the table only grows */
        last_cap = m.cap;
    }
    check_structure(&m);
    for (size_t i = 0; i < n; i++) {
        tpi_gid k = gid((uint32_t)(i % 7), i * 3 + 1);
        assert_ptr_equal(tpi_idmap_get(&m, k), val_of(k));
        assert_null(tpi_idmap_get(&m, gid((uint32_t)(i % 7), i * 3 + 2)));
    }
    /* Drain in a random order, checking a random survivor each time. */
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    assert_non_null(order);
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rng_below(r, i);
        size_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    for (size_t i = 0; i < n; i++) {
        tpi_gid k = gid((uint32_t)(order[i] % 7), order[i] * 3 + 1);
        assert_ptr_equal(tpi_idmap_del(&m, k), val_of(k));
        assert_int_equal(m.len, n - i - 1);
        if (i + 1 < n) {
            size_t s = order[i + 1 + (size_t)rng_below(r, n - i - 1)];
            tpi_gid ks = gid((uint32_t)(s % 7), s * 3 + 1);
            assert_ptr_equal(tpi_idmap_get(&m, ks), val_of(ks));
        }
    }
    check_structure(&m);
    assert_int_equal(m.len, 0);
    free(order);
    tpi_idmap_free(&m);
}

static void test_idmap_growth_many_sizes(void **state) {
    (void)state;
    rng r = {12345};
    for (size_t n = 0; n <= 300; n++)
        fill_check_drain(n, &r);
    /* Around every growth threshold (3/4 of a power of two) up to 2^17. */
    for (size_t cap = 16; cap <= ((size_t)1 << 17); cap *= 2) {
        size_t t = cap * 3 / 4;
        fill_check_drain(t - 1, &r);
        fill_check_drain(t, &r);
        fill_check_drain(t + 1, &r);
    }
}

static void test_idmap_capacity_follows_load(void **state) {
    (void)state;
    tpi_idmap m;
    tpi_idmap_init(&m);
    int x = 0;
    /* 16 slots hold 12 members; the 13th doubles the table. */
    for (uint64_t i = 0; i < 12; i++)
        assert_int_equal(tpi_idmap_put(&m, gid(0, i), &x), TP_OK);
    assert_int_equal(m.cap, 16);
    assert_int_equal(tpi_idmap_put(&m, gid(0, 12), &x), TP_OK);
    assert_int_equal(m.cap, 32);
    for (uint64_t i = 0; i <= 12; i++)
        assert_ptr_equal(tpi_idmap_get(&m, gid(0, i)), &x);
    tpi_idmap_free(&m);
}

/* ---- Backward-shift deletion on wrap-around runs ------------------------------------ */

/*
 * Builds keys whose homes (in a 16-slot table) sit at the end of the table,
 * so their probe runs wrap around slot 0, mixed with keys homed at 0 and 1
 * that the wrapped run displaces. Then inserts a random subset in a random
 * order and deletes in another random order, checking every key after every
 * delete. This is where "is home between hole and k, cyclically" goes wrong.
 */
static void test_idmap_wraparound_runs(void **state) {
    (void)state;
    enum { NEED = 12 };
    const size_t want_homes[NEED] = {15, 15, 14, 15, 0, 0, 1, 14, 13, 15, 0, 2};
    tpi_gid keys[NEED];
    int have = 0;
    int taken[NEED] = {0};
    for (uint64_t local = 0; have < NEED && local < 1000000; local++) {
        tpi_gid k = gid(9, local);
        size_t h = home16(k);
        for (int i = 0; i < NEED; i++) {
            if (!taken[i] && want_homes[i] == h) {
                taken[i] = 1;
                keys[i] = k;
                have++;
                break;
            }
        }
    }
    assert_int_equal(have, NEED);

    rng r = {777};
    for (int round = 0; round < 4000; round++) {
        int order[NEED];
        for (int i = 0; i < NEED; i++)
            order[i] = i;
        for (int i = NEED; i > 1; i--) {
            int j = (int)rng_below(&r, (uint64_t)i);
            int t = order[i - 1];
            order[i - 1] = order[j];
            order[j] = t;
        }
        int n = 1 + (int)rng_below(&r, NEED); /* at most 12: the table stays at 16 */
        tpi_idmap m;
        tpi_idmap_init(&m);
        int present[NEED] = {0};
        for (int i = 0; i < n; i++) {
            assert_int_equal(tpi_idmap_put(&m, keys[order[i]], val_of(keys[order[i]])), TP_OK);
            present[order[i]] = 1;
        }
        assert_int_equal(m.cap, 16);
        check_structure(&m);
        /* Delete the present keys in a fresh random order. */
        for (int i = n; i > 1; i--) {
            int j = (int)rng_below(&r, (uint64_t)i);
            int t = order[i - 1];
            order[i - 1] = order[j];
            order[j] = t;
        }
        for (int i = 0; i < n; i++) {
            assert_ptr_equal(tpi_idmap_del(&m, keys[order[i]]), val_of(keys[order[i]]));
            present[order[i]] = 0;
            for (int k = 0; k < NEED; k++) {
                if (present[k])
                    assert_ptr_equal(tpi_idmap_get(&m, keys[k]), val_of(keys[k]));
                else
                    assert_null(tpi_idmap_get(&m, keys[k]));
            }
            check_structure(&m);
            /* Re-insert now and then: holes must be reusable mid-run. */
            if (rng_below(&r, 4) == 0) {
                int k = order[i];
                assert_int_equal(tpi_idmap_put(&m, keys[k], val_of(keys[k])), TP_OK);
                assert_ptr_equal(tpi_idmap_del(&m, keys[k]), val_of(keys[k]));
            }
        }
        assert_int_equal(m.len, 0);
        tpi_idmap_free(&m);
    }
}

/* ---- Randomized differential test against a sorted array ------------------------------ */

typedef struct ref_entry {
    tpi_gid key;
    void *value;
} ref_entry;

typedef struct ref_map {
    ref_entry *e;
    size_t len, cap;
} ref_map;

static int gid_cmp(tpi_gid a, tpi_gid b) {
    if (a.worker != b.worker)
        return a.worker < b.worker ? -1 : 1;
    if (a.local != b.local)
        return a.local < b.local ? -1 : 1;
    return 0;
}

/* Index of the first entry >= key. */
static size_t ref_lower(const ref_map *r, tpi_gid key) {
    size_t lo = 0, hi = r->len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (gid_cmp(r->e[mid].key, key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void *ref_get(const ref_map *r, tpi_gid key) {
    size_t i = ref_lower(r, key);
    return i < r->len && gid_cmp(r->e[i].key, key) == 0 ? r->e[i].value : NULL;
}

static tp_status ref_put(ref_map *r, tpi_gid key, void *value) {
    size_t i = ref_lower(r, key);
    if (i < r->len && gid_cmp(r->e[i].key, key) == 0)
        return TP_EALREADY;
    if (r->len == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 64;
        r->e = realloc(r->e, r->cap * sizeof *r->e);
        assert_non_null(r->e);
    }
    memmove(&r->e[i + 1], &r->e[i], (r->len - i) * sizeof *r->e);
    r->e[i].key = key;
    r->e[i].value = value;
    r->len++;
    return TP_OK;
}

static void *ref_del(ref_map *r, tpi_gid key) {
    size_t i = ref_lower(r, key);
    if (i == r->len || gid_cmp(r->e[i].key, key) != 0)
        return NULL;
    void *v = r->e[i].value;
    memmove(&r->e[i], &r->e[i + 1], (r->len - i - 1) * sizeof *r->e);
    r->len--;
    return v;
}

/* Keys from a bounded space so puts collide with present keys and deletes hit:
 * 8 workers (two extreme ones) x 1024 locals, half small, half with high bits. */
static tpi_gid random_key(rng *r) {
    static const uint32_t workers[8] = {0, 1, 2, 3, 1000, 65535, 0x80000000u, UINT32_MAX};
    uint32_t w = workers[rng_below(r, 8)];
    uint64_t j = rng_below(r, 1024);
    uint64_t local = j < 512 ? j : (j << 40) | (j * 0x9e37u) | ((uint64_t)1 << 63);
    return gid(w, local);
}

static void full_compare(const tpi_idmap *m, const ref_map *ref) {
    assert_int_equal(m->len, ref->len);
    for (size_t i = 0; i < ref->len; i++)
        assert_ptr_equal(tpi_idmap_get(m, ref->e[i].key), ref->e[i].value);
    /* And nothing in the map that the model lacks. */
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].value)
            assert_ptr_equal(ref_get(ref, m->slots[i].key), m->slots[i].value);
}

static void test_idmap_randomized_differential(void **state) {
    (void)state;
    tpi_idmap m;
    tpi_idmap_init(&m);
    ref_map ref = {0};
    rng r = {0x7e57ull};
    uint64_t serial = 0;
    size_t puts = 0, dup_puts = 0, dels = 0, miss_dels = 0, hits = 0, misses = 0;
    enum { OPS = 200000 };
    for (int op = 0; op < OPS; op++) {
        /* Phases that fill and drain, so runs form and break up at many loads. */
        int phase = (op / 20000) % 3;
        uint64_t put_pct = phase == 0 ? 70 : phase == 1 ? 30 : 50;
        uint64_t dice = rng_below(&r, 100);
        tpi_gid k = random_key(&r);
        if (dice < put_pct) {
            void *v = (void *)(uintptr_t)((++serial << 4) | 8); /* distinct, non-NULL */
            tp_status want = ref_put(&ref, k, v);
            assert_int_equal(tpi_idmap_put(&m, k, v), want);
            puts++;
            dup_puts += want == TP_EALREADY;
        } else if (dice < 95) {
            void *want = ref_del(&ref, k);
            assert_ptr_equal(tpi_idmap_del(&m, k), want);
            dels++;
            miss_dels += want == NULL;
        }
        /* Every operation is followed by lookups: the key itself and a random one. */
        assert_ptr_equal(tpi_idmap_get(&m, k), ref_get(&ref, k));
        tpi_gid q = random_key(&r);
        void *want = ref_get(&ref, q);
        assert_ptr_equal(tpi_idmap_get(&m, q), want);
        hits += want != NULL;
        misses += want == NULL;
        /* And a random present key (the model knows them all). */
        if (ref.len) {
            const ref_entry *e = &ref.e[rng_below(&r, ref.len)];
            assert_ptr_equal(tpi_idmap_get(&m, e->key), e->value);
        }
        assert_int_equal(m.len, ref.len);
        if (op % 5000 == 4999) {
            full_compare(&m, &ref);
            check_structure(&m);
        }
    }
    full_compare(&m, &ref);
    /* The workload really exercised every path. */
    assert_true(puts > 50000 && dup_puts > 1000);
    assert_true(dels > 50000 && miss_dels > 1000);
    assert_true(hits > 10000 && misses > 10000);
    /* Drain everything through the map and the model together. */
    while (ref.len) {
        ref_entry e = ref.e[rng_below(&r, ref.len)];
        assert_ptr_equal(ref_del(&ref, e.key), e.value);
        assert_ptr_equal(tpi_idmap_del(&m, e.key), e.value);
        if (ref.len % 97 == 0)
            full_compare(&m, &ref);
    }
    assert_int_equal(m.len, 0);
    free(ref.e);
    tpi_idmap_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idmap_empty_map),
        cmocka_unit_test(test_idmap_put_get_del),
        cmocka_unit_test(test_idmap_duplicate_put_ealready),
        cmocka_unit_test(test_idmap_keys_differ_in_one_half),
        cmocka_unit_test(test_idmap_growth_many_sizes),
        cmocka_unit_test(test_idmap_capacity_follows_load),
        cmocka_unit_test(test_idmap_wraparound_runs),
        cmocka_unit_test(test_idmap_randomized_differential),
    };
    return cmocka_run_group_tests_name("idmap", tests, NULL, NULL);
}
