/*
 * rendezvous.c: init's all-gather and the barriers, through the store
 * (spec/lifecycle.md INIT-5..8, SHUTDOWN-3). The store only has get/set
 * and atomic ops; waiting is polling with backoff through the agent's park,
 * so on the simulator it runs on virtual time like everything else.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "log.h"

#define POLL_FIRST_NS 500000ull     /* 0.5 ms: rendezvous partners are usually close */
#define POLL_MAX_NS 20000000ull     /* 20 ms: bounds the latency added to a late joiner */
#define MISSING_NAMED_MAX 8         /* ranks named in a timeout message */
/* STORE-12: a count that does not move has its keys read this long into a
 * wait, then at twice the time waited, at least once a second. */
#define COUNT_LOOK_FIRST_NS 16000000ull  /* 16 ms */
#define COUNT_LOOK_MAX_NS 1000000000ull  /* 1 s */
/* Publishing an init outcome may take this long past the moment it is
 * decided (often at the deadline) while the store is failing (STORE-9). */
#define OUTCOME_GRACE_NS 5000000000ull

static tp_status store_fail(tp_core *c, tp_status st, const char *what) {
    return tpi_fail(st == TP_ENOENT ? TP_ESTORE : st, "%s: rendezvous store: %s", what,
                    c->store->errmsg[0] ? c->store->errmsg : tp_strerror(st));
}

static uint64_t outcome_deadline(tp_core *c) {
    return tpi_now(c) + OUTCOME_GRACE_NS;
}

static int key_exists(tp_core *c, const char *key, char **value, tp_status *st,
                      uint64_t deadline_ns) {
    void *v = NULL;
    size_t len = 0;
    *st = tpi_store_get(c, key, &v, &len, deadline_ns);
    if (*st == TP_ENOENT) {
        *st = TP_OK;
        return 0;
    }
    if (*st != TP_OK)
        return 0;
    if (value)
        *value = v;
    else
        free(v);
    return 1;
}

/* An "init/error" published by another worker: "<status>\t<message>". */
static tp_status check_error_key(tp_core *c, const char *what, uint64_t deadline_ns) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    char *v = NULL;
    tp_status st;
    tpi_key(c, key, sizeof key, "init/error");
    if (!key_exists(c, key, &v, &st, deadline_ns))
        return st == TP_OK ? TP_OK : store_fail(c, st, what);
    const char *msg;
    tp_status code = tpi_outcome_parse(v, &msg);
    /* The outcome's own text may already say what failed ("init: timed out
     * waiting for rank 1 ..."): it is not said twice. */
    size_t wl = strlen(what);
    int said = strncmp(msg, what, wl) == 0 && msg[wl] == ':';
    st = code == TP_OK ? TP_OK : tpi_fail(code, "%s%s%s", said ? "" : what, said ? "" : ": ", msg);
    free(v);
    return st;
}

tp_status tpi_outcome_parse(char *v, const char **msg) {
    if (strncmp(v, "TP_OK\t", 6) == 0) { /* committed: the attempt succeeded (INIT-5) */
        *msg = v + 6;
        return TP_OK;
    }
    char *tab = strchr(v, '\t');
    tp_status code = TP_ESTORE; /* an outcome we cannot read is the store's fault */
    if (tab) {
        *tab = '\0';
        for (int i = 1; i < TP_STATUS_COUNT_; i++)
            if (strcmp(v, tp_status_name((tp_status)i)) == 0)
                code = (tp_status)i;
    }
    *msg = tab ? tab + 1 : v;
    return code;
}

int tpi_rank_entry_parse(char *v, uint64_t *credit, const char **addr) {
    char *tab = strchr(v, '\t');
    if (!tab || tab == v || (size_t)(tab - v) > TP_NAME_LEN_MAX)
        return 0;
    /* The credit: decimal digits, no leading zero, within its bounds. */
    const char *d = tab + 1;
    uint64_t n = 0;
    size_t digits = 0;
    while (d[digits] >= '0' && d[digits] <= '9' && digits < 20) {
        uint64_t next = n * 10 + (uint64_t)(d[digits] - '0');
        if (next / 10 != n)
            return 0; /* overflow */
        n = next;
        digits++;
    }
    if (digits == 0 || d[digits] != '\t' || (d[0] == '0' && digits > 1) ||
        n < TPI_INFLIGHT_BYTES_MIN || n > TPI_INFLIGHT_BYTES_MAX)
        return 0;
    *tab = '\0';
    *credit = n;
    *addr = d + digits + 1;
    return 1;
}

/*
 * Publishes the outcome of this init attempt for every worker (INIT-5): the
 * first outcome wins. Returns the outcome that won: st with msg, or the
 * earlier one (recorded as tp_errmsg) when another worker decided first.
 */
static tp_status publish_outcome(tp_core *c, tp_status st, const char *msg) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    char val[TP_ERRMSG_LEN_MAX + 32];
    int swapped = 0;
    tpi_key(c, key, sizeof key, "init/error");
    size_t n = tpi_format(val, sizeof val, "%s\t%s", tp_status_name(st), msg);
    uint64_t deadline_ns = outcome_deadline(c);
    tp_status sst = tpi_store_cas(c, key, NULL, 0, val, n, &swapped, deadline_ns);
    if (sst != TP_OK)
        return store_fail(c, sst, "init");
    if (!swapped)
        return check_error_key(c, "init", deadline_ns);
    return st == TP_OK ? TP_OK : tpi_fail(st, "%s", msg);
}

static tp_status publish_error(tp_core *c, tp_status st, const char *msg) {
    tp_status won = publish_outcome(c, st, msg);
    return won == TP_OK ? tpi_fail(st, "%s", msg) : won;
}



static void name_missing(tp_core *c, const uint8_t *present, char *buf, size_t len) {
    size_t n = 0, named = 0, missing = 0;
    for (uint32_t r = 0; r < c->world_size; r++) {
        if (present[r])
            continue;
        missing++;
        if (named < MISSING_NAMED_MAX) {
            n += tpi_format(buf + n, len - n, "%s%u", named ? ", " : "", r);
            named++;
        }
    }
    if (missing > named)
        tpi_format(buf + n, len - n, " and %zu more", missing - named);
}

/*
 * INTERRUPT-1: tp_interrupt stopped a gather. In init the interruption is
 * this attempt's outcome for every worker (INIT-5), so the others stop
 * waiting too and a re-init everywhere meets in the next generation; when
 * the commit won first, init succeeded and the interrupt came too late
 * (TP_OK: the caller looks once more, no longer watching the flag).
 */
static tp_status interrupted(tp_core *c, const uint8_t *present, int plural, int honor_dead,
                             const char *what) {
    char names[256], waiting[320];
    name_missing(c, present, names, sizeof names);
    tpi_format(waiting, sizeof waiting, "rank%s %s (of %u workers)", plural ? "s" : "", names,
               c->world_size);
    if (!honor_dead) {
        char pub[TP_ERRMSG_LEN_MAX];
        tpi_format(pub, sizeof pub, "worker '%s' (rank %u) was interrupted while waiting for %s",
                   c->self.name, c->rank, waiting);
        tp_status won = publish_outcome(c, TP_ECANCELED, pub);
        if (won == TP_OK) {
            tpi_lock(c);
            c->intr_epoch = 0;
            tpi_unlock(c);
            return TP_OK;
        }
        if (won != TP_ECANCELED)
            return won; /* another worker's failure came first: it is this attempt's cause */
    }
    return tpi_fail(TP_ECANCELED, "%s: interrupted while waiting for %s", what, waiting);
}

static int known_dead(tp_core *c, uint32_t r, tp_status *st, uint64_t deadline_ns) {
    tpi_lock(c);
    int dead = c->peer_dead[r];
    tpi_unlock(c);
    if (dead)
        return 1;
    char key[TP_STORE_KEY_LEN_MAX + 1];
    tpi_key(c, key, sizeof key, "dead/%u", r);
    return key_exists(c, key, NULL, st, deadline_ns);
}

/* ---- Rounds by scan (STORE-10) ------------------------------------------- */

typedef struct scan_seen {
    uint32_t world;
    size_t skip;   /* the prefix's length: the rank follows it */
    uint8_t *seen; /* per rank: its key was in the scan */
    char **values; /* optional: the values of ranks seen, malloc'd */
    int oom;
} scan_seen;

/* The rank a key under a gather's prefix names: tpi_parse_index's rules
 * (decimal, no leading zero, below world), inline, since a world of n
 * workers reads some 10 n^2 such keys. 0 for another key. */
static inline int scan_rank(const char *s, uint32_t world, uint32_t *out) {
    uint64_t v = 0;
    size_t i = 0;
    for (unsigned d; i < 10 && (d = (unsigned char)s[i] - '0') <= 9; i++)
        v = v * 10 + d;
    if (i == 0 || s[i] != '\0' || (s[0] == '0' && i > 1) || v >= world)
        return 0;
    *out = (uint32_t)v;
    return 1;
}

static int on_scan_key(void *arg, const char *key, const void *value, size_t len) {
    scan_seen *g = arg;
    uint32_t r;
    if (!scan_rank(key + g->skip, g->world, &r) || g->seen[r])
        return 0; /* another key under the prefix, or seen before a retry */
    /* A rank's key under a gather's prefix is written once (its value is
     * the same on a retry), so a value kept from an earlier round stands. */
    if (g->values && !g->values[r]) {
        char *copy = malloc(len + 1);
        if (!copy) {
            g->oom = 1;
            return 1;
        }
        memcpy(copy, value, len);
        copy[len] = '\0';
        g->values[r] = copy;
    }
    g->seen[r] = 1;
    return 0;
}

/* Marks seen[r] for every "<gen>/<prefix>/<r>" key in one scan. */
static tp_status scan_ranks(tp_core *c, const char *prefix, uint8_t *seen, char **values,
                            uint64_t deadline_ns) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    scan_seen g = {.world = c->world_size, .seen = seen, .values = values};
    g.skip = tpi_key(c, key, sizeof key, "%s/", prefix);
    memset(seen, 0, c->world_size);
    tp_status st = tpi_store_scan(c, key, on_scan_key, &g, deadline_ns);
    if (st == TP_OK && g.oom)
        st = TP_ENOMEM;
    return st;
}

/*
 * One round of a gather by scan: every key present now is seen at once, so
 * a round costs one read of the keys that exist, whatever the world size.
 * With honor_dead, a missing rank that is known dead (locally or by its
 * "dead/<r>" key) gets one more look, as in the per-key round.
 */
static tp_status scan_round(tp_core *c, const char *prefix, uint8_t *present, char **values,
                            int honor_dead, uint8_t *seen, uint8_t *dead,
                            uint64_t deadline_ns) {
    uint32_t n = c->world_size;
    tp_status st = scan_ranks(c, prefix, seen, values, deadline_ns);
    for (uint32_t r = 0; st == TP_OK && r < n; r++)
        if (!present[r] && seen[r])
            present[r] = 1;
    if (st != TP_OK || !honor_dead)
        return st;
    st = scan_ranks(c, "dead", dead, NULL, deadline_ns);
    int look_again = 0;
    tpi_lock(c);
    for (uint32_t r = 0; st == TP_OK && r < n; r++) {
        dead[r] = dead[r] || c->peer_dead[r];
        look_again |= !present[r] && dead[r];
    }
    tpi_unlock(c);
    if (st != TP_OK || !look_again)
        return st;
    st = scan_ranks(c, prefix, seen, values, deadline_ns);
    for (uint32_t r = 0; st == TP_OK && r < n; r++)
        if (!present[r])
            present[r] = seen[r] ? 1 : dead[r] ? 2 : 0;
    return st;
}

/* ---- Counted rounds (STORE-12) ------------------------------------------- */

/* Strict decimal int64 (STORE-4's form: an optional '-', 1 to 19 digits). */
static int parse_i64(const char *s, size_t len, int64_t *out) {
    size_t i = 0;
    int neg = len > 0 && s[0] == '-';
    i = (size_t)neg;
    if (len == i || len - i > 19)
        return 0;
    uint64_t v = 0;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > (uint64_t)INT64_MAX + (uint64_t)neg)
        return 0;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

int tpi_store_count(tp_core *c, const char *prefix, const char *const *sum_names,
                    const int64_t *sums, uint32_t nsums, uint64_t deadline_ns) {
    tp_store *s = c->store;
    if (!s->ops->add || !s->ops->scan)
        return 0; /* the gather reads the keys themselves (STORE-12) */
    char key[TP_STORE_KEY_LEN_MAX + 1];
    int64_t total = 0;
    tp_status st = TP_OK;
    /* One attempt each, never retried: an add whose reply was lost may have
     * happened, and a second would count this worker twice. The key came
     * first and the sums come before the count, so a complete count vouches
     * for every key and every sum in it. */
    for (uint32_t i = 0; st == TP_OK && i < nsums; i++) {
        tpi_key(c, key, sizeof key, "%s/%s", prefix, sum_names[i]);
        st = s->ops->add(s, key, sums[i], &total);
    }
    tpi_key(c, key, sizeof key, "%s/count", prefix);
    if (st == TP_OK)
        st = s->ops->add(s, key, 1, &total);
    if (st == TP_OK)
        return 1;
    /* Whether it happened or not, this round's count can no longer be
     * trusted: a value that is not a number says so to every reader (and
     * makes every later add to it fail, which says so again), and they read
     * the keys themselves. A set may be retried (STORE-9). When even that
     * fails, the count may stay short for good: this worker's own gather
     * reads the keys (return 0), and the others find them in their periodic
     * look at the keys of a count that does not move (tpi_store_gather). */
    tpi_log(TP_LOG_DEBUG, "worker '%s': counting '%s' failed (%s): its readers read the keys",
            c->self.name, key, s->errmsg);
    return tpi_store_set(c, key, "x", 1, deadline_ns) == TP_OK;
}

tp_status tpi_store_put_counted(tp_core *c, const char *prefix, const char *value,
                                const char *const *sum_names, const int64_t *sums,
                                uint32_t nsums, int *use_count, uint64_t deadline_ns) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    char val[256];
    /* The incarnation makes the value this process's own: of two processes
     * of one rank (a live earlier incarnation, REJOIN-1) at most one is 0,
     * so a retried create (STORE-9) never takes the other's key for its own. */
    size_t n = c->incarnation ? tpi_format(val, sizeof val, "%s %u", value, c->incarnation)
                              : tpi_format(val, sizeof val, "%s", value);
    int created = 0;
    *use_count = 0;
    tpi_key(c, key, sizeof key, "%s/%u", prefix, c->rank);
    tp_status st = tpi_store_cas(c, key, NULL, 0, val, n, &created, deadline_ns);
    if (st != TP_OK)
        return st;
    if (!created) {
        /* Another process of this rank wrote the key first: it is that
         * one's to count (a rank's key is counted once, STORE-12). */
        tpi_log(TP_LOG_DEBUG, "worker '%s' (rank %u, incarnation %u): '%s' was already written "
                              "by another process of this rank: not counted again",
                c->self.name, c->rank, c->incarnation, key);
        *use_count = c->store->ops->add && c->store->ops->scan;
        return TP_OK;
    }
    if (!sums || nsums == 0) {
        *use_count = tpi_store_count(c, prefix, NULL, NULL, 0, deadline_ns);
        return TP_OK;
    }
    *use_count = tpi_store_count(c, prefix, sum_names, sums, nsums, deadline_ns);
    return TP_OK;
}

/* "<prefix>/count": *n the count, -1 when it is not one (STORE-12). */
static tp_status read_count(tp_core *c, const char *prefix, int64_t *n, uint64_t deadline_ns) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    void *v = NULL;
    size_t len = 0;
    tpi_key(c, key, sizeof key, "%s/count", prefix);
    tp_status st = tpi_store_get(c, key, &v, &len, deadline_ns);
    *n = 0;
    if (st == TP_ENOENT)
        return TP_OK;
    if (st != TP_OK)
        return st;
    if (!parse_i64(v, len, n) || *n < 0)
        *n = -1;
    free(v);
    return TP_OK;
}

/* The round's totals "<prefix>/<name>"; 0 when one is absent or unreadable. */
static int read_sums(tp_core *c, const char *prefix, const tpi_round_sums *sums,
                     tp_status *st, uint64_t deadline_ns) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    for (uint32_t i = 0; i < sums->n; i++) {
        void *v = NULL;
        size_t len = 0;
        tpi_key(c, key, sizeof key, "%s/%s", prefix, sums->names[i]);
        *st = tpi_store_get(c, key, &v, &len, deadline_ns);
        if (*st == TP_ENOENT)
            *st = TP_OK;
        int ok = *st == TP_OK && v && parse_i64(v, len, &sums->totals[i]);
        free(v);
        if (!ok)
            return 0;
    }
    return 1;
}

static int count_dead_key(void *arg, const char *key, const void *value, size_t len) {
    (void)key, (void)value, (void)len;
    (*(uint32_t *)arg)++;
    return 1; /* one is enough */
}

/* 1 when some rank is known dead, locally or by a "dead/<r>" key: a round
 * that may be complete without every rank's key (SHUTDOWN-8). */
static int some_dead(tp_core *c, tp_status *st, uint64_t deadline_ns) {
    tpi_lock(c);
    int dead = c->ndead > 0;
    tpi_unlock(c);
    if (dead)
        return 1;
    char key[TP_STORE_KEY_LEN_MAX + 1];
    uint32_t keys = 0;
    tpi_key(c, key, sizeof key, "dead/");
    *st = tpi_store_scan(c, key, count_dead_key, &keys, deadline_ns);
    return keys > 0;
}

/* One round that reads every key (STORE-8): by scan, or key by key up to
 * the first missing one unless full. *looked_all says whether every missing
 * rank was looked at. */
static tp_status keys_round(tp_core *c, const char *prefix, uint8_t *present, char **values,
                            int honor_dead, int full, uint8_t *seen, uint8_t *dead_seen,
                            uint32_t *missing, int *looked_all, uint64_t deadline_ns) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    tp_status st = TP_OK;
    *missing = 0;
    *looked_all = 1;
    if (c->store->ops->scan) {
        st = scan_round(c, prefix, present, values, honor_dead, seen, dead_seen, deadline_ns);
        for (uint32_t r = 0; st == TP_OK && r < c->world_size; r++)
            *missing += present[r] == 0;
        return st;
    }
    for (uint32_t r = 0; r < c->world_size && st == TP_OK; r++) {
        if (present[r])
            continue;
        tpi_key(c, key, sizeof key, "%s/%u", prefix, r);
        if (key_exists(c, key, values ? &values[r] : NULL, &st, deadline_ns)) {
            present[r] = 1;
        } else if (st == TP_OK && honor_dead && known_dead(c, r, &st, deadline_ns)) {
            /* The key was read before the death was seen: the worker may have
             * published it and then left (its set was done before it shut its
             * connections, so a look now sees it). One more look decides. */
            if (key_exists(c, key, values ? &values[r] : NULL, &st, deadline_ns))
                present[r] = 1;
            else if (st == TP_OK)
                present[r] = 2; /* dead: not waited for */
        } else if (st == TP_OK) {
            (*missing)++;
            if (!full) {
                *looked_all = 0;
                break;
            }
        }
    }
    return st;
}

/*
 * A gather's per-rank arrays, made at its first look at the keys (a round
 * that a complete count ends needs none: n workers' waits would otherwise
 * hold n arrays of n): present (and seen, dead_seen when by scan) zeroed,
 * and *values (when wanted) world_size NULLs. 0 when out of memory.
 */
static int gather_arrays(uint32_t world, int by_scan, uint8_t **present, uint8_t **seen,
                         uint8_t **dead_seen, char ***values) {
    if (!*present) {
        *present = calloc(world, by_scan ? 3 : 1);
        if (!*present)
            return 0;
        *seen = *present + world; /* by_scan */
        *dead_seen = *seen + world;
    }
    if (values && !*values && !(*values = calloc(world, sizeof **values)))
        return 0;
    return 1;
}

tp_status tpi_store_gather(tp_core *c, const char *prefix, uint64_t deadline_ns, int honor_dead,
                           char ***values, tpi_round_sums *sums, int use_count, const char *what) {
    int by_scan = c->store->ops->scan != NULL;
    uint32_t world = c->world_size;
    uint8_t *present = NULL, *seen = NULL, *dead_seen = NULL; /* gather_arrays */
    uint64_t backoff = POLL_FIRST_NS;
    tp_status st = TP_OK;
    if (sums)
        sums->have = 0;
    /* STORE-12: while "<prefix>/count" says some rank has not counted
     * itself, and no rank is known dead, a round reads that one key instead
     * of every rank's; the keys are read once the count is complete (when
     * their values are wanted) or when it cannot be trusted. Needs add, and
     * scan for a cheap look at the "dead/" keys. */
    int counted = use_count && by_scan && c->store->ops->add != NULL;
    /* A count can stay short for good while every key exists (a worker
     * that died between its key and its add, or whose failed add could not
     * be marked "x"): while it does not move, the keys are read on a fixed
     * schedule, COUNT_LOOK_FIRST_NS into the wait and then at twice the
     * time waited, at least every COUNT_LOOK_MAX_NS; a look that finds every
     * key ends the wait as a round by keys would. */
    int64_t last_count = -2;
    uint64_t wait_start = tpi_now(c);
    uint64_t next_look = wait_start + COUNT_LOOK_FIRST_NS;
    /* Per key, a round stops at the first key still missing (the later ones
     * are likely missing too): a wait costs O(ranks + rounds) reads, not
     * O(ranks x rounds). force_full: the next round reads every missing key,
     * to name them (deadline, interrupt, LOG-3). */
    int force_full = 0;
    /* LOG-3: init's waits warn every TPI_INIT_WAIT_LOG_NS counted from init's
     * start; the shutdown barriers say so at info every TPI_LOG_PROGRESS_NS. */
    int init_wait = !honor_dead;
    uint64_t started = init_wait ? c->init_started_ns : tpi_now(c);
    uint64_t every = init_wait ? TPI_INIT_WAIT_LOG_NS : TPI_LOG_PROGRESS_NS;
    uint64_t next_note = started + every;
    for (uint64_t now = tpi_now(c); next_note <= now;)
        next_note += every; /* a later gather of the same init: the next multiple */
    for (;;) {
        uint32_t missing = 0;
        int looked_all = 0; /* present[] says which ranks are missing */
        int read_keys = !counted || force_full;
        if (!read_keys) {
            int64_t count = 0;
            st = read_count(c, prefix, &count, deadline_ns);
            if (st != TP_OK) { /* reported below */
                count = 0;
            } else if (count < 0 || count > world) {
                counted = 0; /* a failed add (or a store that miscounts) */
                read_keys = 1;
            } else if (count == world) {
                if (sums && read_sums(c, prefix, sums, &st, deadline_ns)) {
                    sums->have = 1; /* the keys' values are not needed */
                    if (present)
                        memset(present, 1, world);
                } else if (st == TP_OK && (values || sums)) {
                    read_keys = 1; /* the values, once */
                } else if (present) {
                    memset(present, 1, world); /* every rank's key was created and counted */
                }
            } else {
                missing = world - (uint32_t)count;
                uint64_t now = tpi_now(c);
                if (honor_dead && some_dead(c, &st, deadline_ns) && st == TP_OK) {
                    read_keys = 1; /* the dead may complete the round */
                } else if (st == TP_OK && count == last_count && now >= next_look) {
                    read_keys = 1; /* a count that does not move: are the keys there? */
                    uint64_t waited = now - wait_start;
                    next_look = now + (waited < COUNT_LOOK_FIRST_NS   ? COUNT_LOOK_FIRST_NS
                                       : waited > COUNT_LOOK_MAX_NS ? COUNT_LOOK_MAX_NS
                                                                    : waited);
                }
                last_count = count;
            }
        }
        if (st == TP_OK && read_keys) {
            if (!gather_arrays(world, by_scan, &present, &seen, &dead_seen, values)) {
                st = tpi_fail(TP_ENOMEM, "%s: out of memory", what);
                break;
            }
            st = keys_round(c, prefix, present, values ? *values : NULL, honor_dead, force_full,
                            seen, dead_seen, &missing, &looked_all, deadline_ns);
            force_full = 0;
        }
        if (st != TP_OK) {
            st = store_fail(c, st, what);
            break;
        }
        if (!honor_dead && (st = check_error_key(c, what, deadline_ns)) != TP_OK)
            break;
        if (missing == 0)
            break;
        if (tpi_now(c) >= deadline_ns && !looked_all) {
            force_full = 1; /* one complete look first, for the message */
            continue;
        }
        if (tpi_now(c) >= deadline_ns) {
            char names[256];
            char msg[TP_ERRMSG_LEN_MAX];
            name_missing(c, present, names, sizeof names);
            tpi_format(msg, sizeof msg, "%s: timed out waiting for rank%s %s (of %u workers)",
                       what, missing > 1 ? "s" : "", names, c->world_size);
            if (honor_dead) {
                st = tpi_fail(TP_ETIMEDOUT, "%s", msg);
                break;
            }
            /* Init: the timeout is an outcome, unless success was committed
             * first, in which case every key exists and one more look ends it. */
            st = publish_outcome(c, TP_ETIMEDOUT, msg);
            if (st != TP_OK)
                break;
            deadline_ns = TPI_NO_DEADLINE;
            counted = 0; /* the keys end it, not a count that may stay short */
            continue;
        }
        uint64_t now = tpi_now(c);
        int warn = now >= next_note && init_wait && tpi_log_on(TP_LOG_WARN);
        int info = now >= next_note && !warn && tpi_log_on(TP_LOG_INFO);
        if ((warn || info) && counted && !looked_all) {
            /* Name them: one look at every key (a failure names fewer). */
            uint32_t m = 0;
            if (!gather_arrays(world, by_scan, &present, &seen, &dead_seen, values)) {
                st = tpi_fail(TP_ENOMEM, "%s: out of memory", what);
                break;
            }
            if (keys_round(c, prefix, present, values ? *values : NULL, honor_dead, 1, seen,
                           dead_seen, &m, &looked_all, deadline_ns) == TP_OK)
                missing = m;
            if (missing == 0) {
                force_full = 1; /* complete after all: a round that reads them ends it */
                continue;
            }
        }
        if (warn) {
            char names[256], left[48] = "no init timeout";
            name_missing(c, present, names, sizeof names);
            if (deadline_ns != TPI_NO_DEADLINE)
                tpi_format(left, sizeof left, "init timeout in %.0f s",
                           (double)(deadline_ns - now) / 1e9);
            tpi_log(TP_LOG_WARN, "%s: worker '%s' (rank %u) still waiting for rank%s %s (of %u "
                                 "workers) after %.0f s; %s",
                    what, c->self.name, c->rank, missing > 1 || !looked_all ? "s" : "", names,
                    c->world_size, (double)(now - started) / 1e9, left);
        } else if (info) { /* LOG-3: for whom */
            char names[256];
            name_missing(c, present, names, sizeof names);
            tpi_log(TP_LOG_INFO, "%s: worker '%s' (rank %u) has waited %.1f s for '%s' keys; "
                                 "not yet seen: rank%s %s (of %u workers)",
                    what, c->self.name, c->rank, (double)(now - started) / 1e9, prefix,
                    missing > 1 || !looked_all ? "s" : "", names, c->world_size);
        }
        while (next_note <= now)
            next_note += every;
        st = tpi_store_nap(c, &backoff, POLL_MAX_NS, deadline_ns);
        if (st == TP_ECANCELED) {
            if (!gather_arrays(world, by_scan, &present, &seen, &dead_seen, values)) {
                st = tpi_fail(TP_ENOMEM, "%s: out of memory", what);
                break;
            }
            if (!looked_all) { /* name them (a failure names fewer) */
                uint32_t m = 0;
                if (keys_round(c, prefix, present, values ? *values : NULL, honor_dead, 1, seen,
                               dead_seen, &m, &looked_all, deadline_ns) == TP_OK)
                    missing = m;
            }
            st = interrupted(c, present, missing > 1 || !looked_all, honor_dead, what);
            if (st == TP_OK) {
                counted = 0; /* the keys end it, not a count that may stay short */
                continue; /* init committed first: every key exists (INIT-5) */
            }
            break;
        }
        if (st != TP_OK) {
            st = tpi_fail(st, "%s: the wait was interrupted: %s", what, tp_strerror(st));
            break;
        }
    }
    if (st == TP_OK && honor_dead && present) { /* none: every rank counted itself */
        uint32_t dead = 0;
        for (uint32_t r = 0; r < c->world_size; r++)
            dead += present[r] == 2;
        if (dead) {
            char names[256];
            size_t n = 0;
            for (uint32_t r = 0; r < c->world_size; r++)
                if (present[r] == 2)
                    n += tpi_format(names + n, sizeof names - n, "%s'%s' (id %u)",
                                    n ? ", " : "", c->infos[r].name, r);
            st = tpi_fail(TP_EPEERDOWN, "%s: worker%s %s %s down", what, dead > 1 ? "s" : "",
                          names, dead > 1 ? "are" : "is");
        }
    }
    free(present);
    return st;
}

void tpi_publish_dead(tp_core *c, uint64_t deadline_ns) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    /* One lock per dead rank found, not per rank: every worker calls this in
     * each shutdown round, so a lock per rank would be O(world^2) a round. A
     * death seen while a set waits on the store is still published when the
     * look reaches its rank, as with a lock per rank. */
    for (uint32_t r = 0; r < c->world_size; r++) {
        tpi_lock(c);
        if (c->ndead == 0) { /* the usual case: no scan of the world */
            tpi_unlock(c);
            break;
        }
        const uint8_t *d = memchr(c->peer_dead + r, 1, c->world_size - r); /* 0 or 1 each */
        r = d ? (uint32_t)(d - c->peer_dead) : c->world_size;
        tpi_unlock(c);
        if (r < c->world_size) {
            tpi_key(c, key, sizeof key, "dead/%u", r);
            (void)tpi_store_set(c, key, "1", 1, deadline_ns); /* a hint: gather also asks */
        }
    }
}

/* Compare-and-set key from absent to value; on loss *other gets the winner's value. */
static tp_status claim(tp_core *c, const char *key, const char *value, char **other,
                       uint64_t deadline_ns) {
    int swapped = 0;
    *other = NULL;
    tp_status st = tpi_store_cas(c, key, NULL, 0, value, strlen(value), &swapped, deadline_ns);
    if (st != TP_OK)
        return store_fail(c, st, "init");
    if (swapped)
        return TP_OK;
    size_t len;
    st = tpi_store_get(c, key, (void **)other, &len, deadline_ns);
    return st == TP_OK ? TP_EALREADY : store_fail(c, st, "init");
}

/* ---- Worker tables, shared by the workers of a process (core.h) ---------- */

struct tpi_names {
    struct tpi_names *next; /* names_mu */
    uint64_t refs;          /* names_mu */
    uint32_t world;
    int empty; /* zeroed entries: a worker before its all-gather */
    tp_worker_info *infos;
    uint32_t *by_name;
    uint64_t *credit; /* by id: the credit each rank granted (FLOW-6); UINT64_MAX when empty */
    /* The rank entries this table was parsed from, as one scan read them
     * (rank_rows), or NULL: a worker whose scan reads the same entries
     * takes the table, and the addresses in rows, without copying, parsing
     * or comparing n entries again. Set once (names_mu while NULL), then
     * read by the holders of references. */
    char *rows;
    size_t *rows_off; /* by id: where its entry starts in rows */
    size_t *row_len;  /* by id: its entry's length (a NUL follows it in rows) */
    size_t *addr_off; /* by id: where its address starts in rows */
    /* With rows: the addresses in them, by id (one list for every worker
     * that takes the table, AGENT-19), the list's process-unique id, and
     * the store instance and generation the scan read (STORE-13: that
     * store's entries of that job are these, for good). */
    const char **addrs;
    uint64_t rows_id;
    uint64_t rows_store; /* 0: a store without instances */
    uint32_t rows_gen;
};

/* AGENT-19: the ids given to lists of addresses so far (the last one). */
static atomic_uint_fast64_t rows_ids;

/* Guards the list and the counts of references: a spin lock on a C11 atomic
 * flag (AGENT-1: common/ calls no thread library). It is held for a walk of
 * the list and a pointer or two, while workers of one process init or are
 * freed; never across a call out, never by two tasks of the simulator. */
static atomic_flag names_mu = ATOMIC_FLAG_INIT;

static void names_lock(void) {
    while (atomic_flag_test_and_set_explicit(&names_mu, memory_order_acquire))
        ;
}

static void names_unlock(void) {
    atomic_flag_clear_explicit(&names_mu, memory_order_release);
}
static struct tpi_names *names_live; /* names_mu: every table with a reference */

tp_worker_info *tpi_names_infos(struct tpi_names *t) {
    return t->infos;
}

uint32_t *tpi_names_by_name(struct tpi_names *t) {
    return t->by_name;
}

const uint64_t *tpi_names_credit(struct tpi_names *t) {
    return t->credit;
}

static void names_free(struct tpi_names *t) {
    if (!t)
        return;
    free(t->infos);
    free(t->by_name);
    free(t->credit);
    free(t->rows);
    free(t->rows_off);
    free(t->row_len);
    free(t->addr_off);
    free(t->addrs);
    free(t);
}

static struct tpi_names *names_new(uint32_t world) {
    struct tpi_names *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->world = world;
    t->refs = 1;
    t->infos = calloc(world, sizeof *t->infos);
    t->by_name = calloc(world, sizeof *t->by_name);
    t->credit = malloc((size_t)world * sizeof *t->credit);
    if (!t->infos || !t->by_name || !t->credit) {
        names_free(t);
        return NULL;
    }
    return t;
}

static void names_insert(struct tpi_names *t) {
    names_lock();
    t->next = names_live;
    names_live = t;
    names_unlock();
}

struct tpi_names *tpi_names_empty(uint32_t world) {
    names_lock();
    struct tpi_names *t = names_live;
    while (t && !(t->empty && t->world == world))
        t = t->next;
    if (t)
        t->refs++;
    names_unlock();
    if (t)
        return t;
    if (!(t = names_new(world)))
        return NULL;
    t->empty = 1;
    for (uint32_t r = 0; r < world; r++)
        t->credit[r] = UINT64_MAX; /* no grant read yet: the window alone (INIT-7) */
    names_insert(t);
    return t;
}

void tpi_names_release(struct tpi_names *t) {
    if (!t)
        return;
    names_lock();
    int last = --t->refs == 0;
    if (last) {
        struct tpi_names **p = &names_live;
        while (*p != t)
            p = &(*p)->next;
        *p = t->next;
    }
    names_unlock();
    if (last)
        names_free(t);
}

/* The credits first (one memcmp), then the names, to the first difference:
 * tables of other jobs usually differ early, and a process holds few. */
static int names_equal(const struct tpi_names *t, const char *const *names,
                       const uint64_t *credit) {
    if (memcmp(t->credit, credit, (size_t)t->world * sizeof *credit) != 0)
        return 0;
    for (uint32_t r = 0; r < t->world; r++)
        if (strcmp(t->infos[r].name, names[r]) != 0)
            return 0;
    return 1;
}

/* Sorts ids[0..n) by name: a merge sort through tmp (n ids), O(n log n)
 * compares and moves. Names are unique (INIT-4), so the order is the same
 * whatever the sort. */
static void sort_ids(const tp_worker_info *infos, uint32_t *ids, uint32_t *tmp, uint32_t n) {
    if (n < 2)
        return;
    uint32_t half = n / 2;
    sort_ids(infos, ids, tmp, half);
    sort_ids(infos, ids + half, tmp, n - half);
    if (strcmp(infos[ids[half - 1]].name, infos[ids[half]].name) < 0)
        return; /* already in order */
    uint32_t i = 0, j = half, k = 0;
    while (i < half && j < n)
        tmp[k++] = strcmp(infos[ids[i]].name, infos[ids[j]].name) < 0 ? ids[i++] : ids[j++];
    while (i < half)
        tmp[k++] = ids[i++];
    memcpy(ids, tmp, (size_t)k * sizeof *ids); /* the rest of ids[half..n) is in place */
}

/* The name of a rank's entry (cut at its first tab by tpi_rank_entry_parse)
 * into infos: a plain copy. */
static void copy_name(tp_worker_info *info, const char *name) {
    size_t n = strnlen(name, sizeof info->name - 1);
    memcpy(info->name, name, n);
    info->name[n] = '\0';
}

/* Makes t (one reference taken for c) c's worker table (INIT-7). The table
 * before it, the empty one, stays referenced until the worker is freed
 * (names_spare): another thread may be reading it. */
static void install_names(tp_core *c, struct tpi_names *t) {
    tpi_lock(c);
    struct tpi_names *old = c->names;
    c->names = t;
    c->infos = t->infos;
    c->by_name = t->by_name;
    c->credit = t->credit; /* FLOW-6: our window to each peer */
    tpi_unlock(c);
    if (c->names_spare)
        tpi_names_release(old); /* a rejoin's second table: the first is kept */
    else
        c->names_spare = old;
}

/* The rank entries as one scan read them (gather_rank_rows): either a
 * table of this process parsed from the same entries (one reference held),
 * or arena: them one after another, each with a NUL; off[r] and lens[r]
 * where rank r's starts and its length. Neither: read key by key. */
typedef struct scanned_rows {
    struct tpi_names *table;
    char *arena;
    size_t len;
    size_t *off;
    size_t *lens;
} scanned_rows;

static void scanned_rows_free(scanned_rows *rows) {
    tpi_names_release(rows->table);
    free(rows->arena);
    free(rows->off);
    free(rows->lens);
    *rows = (scanned_rows){NULL, NULL, 0, NULL, NULL};
}

/* STORE-13: what names the keys c's store reaches (0: nothing does). */
static uint64_t store_instance(const tp_core *c) {
    return c->store->ops->instance ? c->store->ops->instance(c->store) : 0;
}

/* Keeps rows, addr_off and addrs (all taken) with t, which has none
 * (names_mu held), as c's scan read them. */
static void names_keep_rows(const tp_core *c, struct tpi_names *t, scanned_rows *rows,
                            size_t **addr_off, const char ***addrs) {
    TPI_ASSERT(!t->rows && rows->arena && *addr_off && *addrs);
    t->rows = rows->arena;
    t->rows_off = rows->off;
    t->row_len = rows->lens;
    t->addr_off = *addr_off;
    t->addrs = *addrs;
    for (uint32_t r = 0; r < t->world; r++)
        t->addrs[r] = t->rows + t->addr_off[r];
    t->rows_id = (uint64_t)atomic_fetch_add(&rows_ids, 1) + 1;
    t->rows_store = store_instance(c);
    t->rows_gen = c->generation;
    rows->arena = NULL;
    rows->off = NULL;
    rows->lens = NULL;
    *addr_off = NULL;
    *addrs = NULL;
}

/*
 * The worker table of the all-gather (INIT-7, REJOIN-3): names[r] is rank
 * r's name, credit[r] the credit it granted (FLOW-6). Takes a table of this
 * process with the same names and credits when there is one (the workers of
 * a simulated world all hold the same), else makes it (entries, then by_name
 * sorted). pristine (optional, taken in every case): the scan the names were
 * parsed from, before the parse cut it, with addr_off (by id: where each
 * address starts in it), kept with a table that has none, for the next
 * worker's scan to compare with (gather_rank_rows).
 */
static tp_status adopt_names(tp_core *c, const char *const *names, const uint64_t *credit,
                             scanned_rows *pristine, size_t *addr_off, const char *what) {
    uint32_t world = c->world_size;
    const char **addrs = NULL; /* for the rows kept (without memory: none kept) */
    int keep = pristine && pristine->arena && addr_off &&
               (addrs = malloc((size_t)world * sizeof *addrs));
    names_lock();
    struct tpi_names *t = names_live;
    while (t && (t->empty || t->world != world || !names_equal(t, names, credit)))
        t = t->next;
    if (t) {
        t->refs++;
        if (!t->rows && keep) /* the first scan seen for it */
            names_keep_rows(c, t, pristine, &addr_off, &addrs);
    }
    names_unlock();
    if (!t) {
        uint32_t *tmp = malloc((size_t)world * sizeof *tmp);
        t = tmp ? names_new(world) : NULL;
        if (!t) {
            free(tmp);
            if (pristine)
                scanned_rows_free(pristine);
            free(addr_off);
            free(addrs);
            return tpi_fail(TP_ENOMEM, "%s: out of memory for the names of %u workers", what,
                            world);
        }
        memcpy(t->credit, credit, (size_t)world * sizeof *credit);
        for (uint32_t r = 0; r < world; r++) {
            copy_name(&t->infos[r], names[r]);
            t->infos[r].id = r;
            t->by_name[r] = r;
        }
        sort_ids(t->infos, t->by_name, tmp, world);
        free(tmp);
        if (keep)
            names_keep_rows(c, t, pristine, &addr_off, &addrs);
        names_insert(t);
    }
    if (pristine)
        scanned_rows_free(pristine);
    free(addr_off);
    free(addrs);
    install_names(c, t);
    return TP_OK;
}

/*
 * The rank entries of one scan. While they match, entry for entry, those a
 * worker table of this process was parsed from (cand), they are only
 * compared: the workers of a simulated world read the same n entries each,
 * and copying and parsing them n times over is what the shared table saves.
 * From the first that does not match (or without cand) they are copied
 * into one block, those matched before it from cand's: a world of n
 * workers reads n^2 of them, so no allocation per row.
 */
typedef struct rank_rows {
    uint32_t world;
    size_t skip; /* the prefix's length */
    uint8_t *seen;
    uint32_t nseen;
    struct tpi_names *cand; /* one reference; NULL once copying */
    size_t *off;            /* by rank: where its value starts in arena */
    size_t *lens;           /* by rank: its length */
    char *arena;
    size_t len, cap;
    int oom;
} rank_rows;

/* STORE-13's promise, counted for its test: rank entries copied out of a
 * scan rather than matched against a table this process has already. */
static _Atomic uint64_t rows_copied;

uint64_t tpi_rendezvous_rows_copied(void) {
    return atomic_load(&rows_copied);
}

/* Copies rank r's entry to the end of g's block; 0 when out of memory. */
static int rows_append(rank_rows *g, uint32_t r, const void *value, size_t len) {
    atomic_fetch_add(&rows_copied, 1);
    if (g->len + len + 1 > g->cap) {
        size_t cap = g->cap * 2 > g->len + len + 1 ? g->cap * 2 : g->len + len + 1;
        char *a = realloc(g->arena, cap);
        if (!a)
            return 0;
        g->arena = a;
        g->cap = cap;
    }
    memcpy(g->arena + g->len, value, len);
    g->arena[g->len + len] = '\0';
    g->off[r] = g->len;
    g->lens[r] = len;
    g->len += len + 1;
    return 1;
}

/* The scan found an entry cand does not hold: g copies from now on, and
 * the entries matched so far come from cand (the same bytes). 0 when out
 * of memory. */
static int rows_diverge(rank_rows *g) {
    struct tpi_names *t = g->cand;
    g->cand = NULL;
    g->cap = (size_t)g->world * 48;
    g->off = malloc((size_t)g->world * sizeof *g->off);
    g->lens = malloc((size_t)g->world * sizeof *g->lens);
    g->arena = malloc(g->cap);
    int ok = g->off && g->lens && g->arena;
    for (uint32_t q = 0; ok && t && q < g->world; q++)
        if (g->seen[q])
            ok = rows_append(g, q, t->rows + t->rows_off[q], t->row_len[q]);
    tpi_names_release(t);
    return ok;
}

static int on_rank_row(void *arg, const char *key, const void *value, size_t len) {
    rank_rows *g = arg;
    uint32_t r;
    if (!scan_rank(key + g->skip, g->world, &r) || g->seen[r])
        return 0; /* another key under the prefix, or seen before a retry */
    const struct tpi_names *t = g->cand;
    if (!t || t->row_len[r] != len || memcmp(t->rows + t->rows_off[r], value, len) != 0) {
        if ((t && !rows_diverge(g)) || !rows_append(g, r, value, len)) {
            g->oom = 1;
            return 1;
        }
    }
    g->seen[r] = 1;
    g->nseen++;
    return 0;
}

/* STORE-13: a table of this process parsed from this job's entries in
 * this store (one reference taken), or NULL. The entries are created once
 * (INIT-4's claim) and never changed or deleted, so they are still those:
 * a world of n workers in one process scans its n entries once, not n
 * times. */
static struct tpi_names *rows_known(const tp_core *c, uint64_t store) {
    if (!store)
        return NULL;
    names_lock();
    struct tpi_names *t = names_live;
    while (t && !(t->rows && t->world == c->world_size && t->rows_store == store &&
                  t->rows_gen == c->generation))
        t = t->next;
    if (t)
        t->refs++;
    names_unlock();
    return t;
}

/* A table of this process with the entries it was parsed from, and world
 * entries: the one a scan compares with (one reference taken), or NULL. */
static struct tpi_names *rows_candidate(uint32_t world) {
    names_lock();
    struct tpi_names *t = names_live;
    while (t && (t->empty || t->world != world || !t->rows))
        t = t->next;
    if (t)
        t->refs++;
    names_unlock();
    return t;
}

/*
 * INIT-6..7: waits for every rank's entry and reads them. With a counting
 * store (STORE-12) the wait reads "init/rank/count" alone, then one scan
 * reads every entry: rows->table when they are the entries a table of this
 * process was parsed from (*values NULL: nothing to parse), else
 * rows->arena with *values (world_size entries) pointing into it. Should
 * that scan miss a rank, or without counting, the gather reads the values
 * itself (*values made, each malloc'd; rows empty). Nothing per rank is
 * held during the wait, while the other workers wait too.
 */
static tp_status gather_rank_rows(tp_core *c, char ***values, scanned_rows *rows, int use_count,
                                  uint64_t deadline_ns) {
    uint32_t world = c->world_size;
    *rows = (scanned_rows){NULL, NULL, 0, NULL, NULL};
    *values = NULL;
    if (!c->store->ops->scan || !c->store->ops->add || !use_count)
        return tpi_store_gather(c, "init/rank", deadline_ns, 0, values, NULL, 0, "init");
    tp_status st = tpi_store_gather(c, "init/rank", deadline_ns, 0, NULL, NULL, 1, "init");
    if (st != TP_OK)
        return st;
    struct tpi_names *known = rows_known(c, store_instance(c));
    if (known) { /* every entry, as that table's */
        *rows = (scanned_rows){known, NULL, 0, NULL, NULL};
        return TP_OK;
    }
    char key[TP_STORE_KEY_LEN_MAX + 1];
    rank_rows g = {.world = world};
    g.skip = tpi_key(c, key, sizeof key, "init/rank/");
    g.seen = calloc(world, 1);
    if (g.seen && !(g.cand = rows_candidate(world)) && !rows_diverge(&g))
        g.oom = 1;
    if (!g.seen || g.oom) {
        free(g.seen);
        free(g.off);
        free(g.lens);
        free(g.arena);
        return tpi_fail(TP_ENOMEM, "init: out of memory for %u workers", world);
    }
    st = tpi_store_scan(c, key, on_rank_row, &g, deadline_ns);
    if (st == TP_OK && g.oom)
        st = tpi_fail(TP_ENOMEM, "init: out of memory for %u workers", world);
    else if (st != TP_OK)
        st = store_fail(c, st, "init");
    free(g.seen);
    int complete = st == TP_OK && g.nseen == world;
    if (complete && g.cand) { /* every entry as the table's */
        *rows = (scanned_rows){g.cand, NULL, 0, NULL, NULL};
        return TP_OK;
    }
    tpi_names_release(g.cand);
    if (complete && !(*values = malloc((size_t)world * sizeof **values)))
        st = tpi_fail(TP_ENOMEM, "init: out of memory for %u workers", world);
    if (st == TP_OK && complete) {
        for (uint32_t r = 0; r < world; r++)
            (*values)[r] = g.arena + g.off[r];
        *rows = (scanned_rows){NULL, g.arena, g.len, g.off, g.lens};
        return TP_OK;
    }
    free(g.arena);
    free(g.off);
    free(g.lens);
    if (st != TP_OK)
        return st;
    /* The count and the keys disagree (a store that miscounts): the keys decide. */
    return tpi_store_gather(c, "init/rank", deadline_ns, 0, values, NULL, 0, "init");
}

/* A copy of rows' block, NULL arena when there is no memory for it
 * (nothing is kept then: the table works without). */
static scanned_rows rows_copy(const scanned_rows *rows, uint32_t world) {
    scanned_rows copy = {NULL, NULL, rows->len, NULL, NULL};
    if (!rows->arena)
        return copy;
    copy.arena = malloc(rows->len ? rows->len : 1);
    copy.off = malloc((size_t)world * sizeof *copy.off);
    copy.lens = malloc((size_t)world * sizeof *copy.lens);
    if (!copy.arena || !copy.off || !copy.lens) {
        scanned_rows_free(&copy);
        return copy;
    }
    memcpy(copy.arena, rows->arena, rows->len);
    memcpy(copy.off, rows->off, (size_t)world * sizeof *copy.off);
    memcpy(copy.lens, rows->lens, (size_t)world * sizeof *copy.lens);
    return copy;
}

/* AGENT-19: whether c's table holds this job's entries (the workers of a
 * simulated world share it): its list of addresses goes to the agent by
 * its id. */
static int shares_list(const tp_core *c) {
    if (!c->ops->set_peers_id)
        return 0;
    uint64_t store = store_instance(c);
    names_lock(); /* another worker of the process may be keeping rows with it */
    const struct tpi_names *t = c->names;
    int shared = t->addrs && store && t->rows_store == store && t->rows_gen == c->generation;
    names_unlock();
    return shared; /* rows, once kept, never change */
}

tp_status tpi_rendezvous(tp_core *c, const char *addr, uint64_t deadline_ns) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    char val[TP_NAME_LEN_MAX + TPI_ADDR_LEN_MAX + 32];
    char msg[TP_ERRMSG_LEN_MAX];
    char *other = NULL;

    /* INIT-4: the first worker fixes the world size; others must agree. */
    tpi_key(c, key, sizeof key, "init/world_size");
    tpi_format(val, sizeof val, "%u", c->world_size);
    tp_status st = claim(c, key, val, &other, deadline_ns);
    if (st == TP_EALREADY) {
        int same = strcmp(other, val) == 0;
        if (!same)
            tpi_format(msg, sizeof msg,
                       "world size mismatch: worker '%s' (rank %u) says %u, the job says %s",
                       c->self.name, c->rank, c->world_size, other);
        free(other);
        if (!same)
            return publish_error(c, TP_EINVAL, msg);
        st = TP_OK;
    }
    if (st != TP_OK)
        return st;

    /* INIT-4: a rank is claimed once. */
    tpi_key(c, key, sizeof key, "init/rank/%u", c->rank);
    tpi_format(val, sizeof val, "%s\t%llu\t%s", c->self.name, (unsigned long long)c->grant, addr);
    st = claim(c, key, val, &other, deadline_ns);
    if (st == TP_EALREADY) {
        char *tab = strchr(other, '\t');
        if (tab)
            *tab = '\0';
        tpi_format(msg, sizeof msg, "rank %u claimed twice, by '%s' and '%s'%s", c->rank, other,
                   c->self.name,
                   strcmp(other, c->self.name) == 0
                       ? " (to restart a worker of a running job, init it with the rejoin "
                         "option: REJOIN-1)"
                       : "");
        free(other);
        return publish_error(c, TP_EINVAL, msg);
    }
    if (st != TP_OK)
        return st;
    /* STORE-12: the claim created the key (compare-and-set), so this
     * process is the one to count it. */
    int rank_counted = tpi_store_count(c, "init/rank", NULL, NULL, 0, deadline_ns);

    /* INIT-4: a name is used once. */
    tpi_key(c, key, sizeof key, "init/name/%s", c->self.name);
    tpi_format(val, sizeof val, "%u", c->rank);
    st = claim(c, key, val, &other, deadline_ns);
    if (st == TP_EALREADY) {
        tpi_format(msg, sizeof msg, "worker name '%s' is not unique: used by ranks %s and %u",
                   c->self.name, other, c->rank);
        free(other);
        return publish_error(c, TP_EDUPNAME, msg);
    }
    if (st != TP_OK)
        return st;

    /* INIT-7: the all-gather. */
    char **values = NULL;
    scanned_rows rows; /* a table's, or values in one block, else each malloc'd */
    st = gather_rank_rows(c, &values, &rows, rank_counted, deadline_ns);
    TPI_ASSERT(st != TP_OK || values || rows.table); /* a gather that ends complete read them */
    char **addrs = NULL;
    uint64_t *credits = NULL;
    /* The workers of a simulated world read the same entries: the table
     * parsed from them is taken as it is, its addresses where they are. */
    int adopted = st == TP_OK && rows.table;
    if (adopted) {
        struct tpi_names *t = rows.table;
        rows.table = NULL; /* its reference goes to c */
        install_names(c, t);
    }
    /* Per-worker arrays only where the table is not shared with the agent:
     * a world of N workers in one process would otherwise allocate N of
     * them, O(N^2) bytes, for nothing. */
    if (st == TP_OK && (!adopted || !shares_list(c)) &&
        (!(addrs = malloc((size_t)c->world_size * sizeof *addrs)) ||
         (!adopted && !(credits = malloc((size_t)c->world_size * sizeof *credits)))))
        st = tpi_fail(TP_ENOMEM, "init: out of memory for %u workers", c->world_size);
    for (uint32_t r = 0; st == TP_OK && adopted && addrs && r < c->world_size; r++)
        addrs[r] = (char *)c->names->addrs[r];
    scanned_rows pristine = {NULL, NULL, 0, NULL, NULL};
    size_t *addr_off = NULL;
    if (st == TP_OK && !adopted && rows.arena) {
        pristine = rows_copy(&rows, c->world_size); /* before the parse cuts the names */
        addr_off = pristine.arena ? malloc((size_t)c->world_size * sizeof *addr_off) : NULL;
    }
    for (uint32_t r = 0; st == TP_OK && !adopted && r < c->world_size; r++) {
        const char *a;
        uint64_t credit = 0;
        if (!tpi_rank_entry_parse(values[r], &credit, &a)) {
            char bad[96];
            tpi_format(bad, sizeof bad, "init: rank %u's entry in the store is malformed", r);
            st = publish_error(c, TP_ESTORE, bad);
            break;
        }
        credits[r] = credit; /* FLOW-6: our window to r */
        addrs[r] = (char *)a;
        if (addr_off)
            addr_off[r] = (size_t)(a - rows.arena);
    }
    if (st == TP_OK && !adopted) { /* the names, values cut at their tab */
        st = adopt_names(c, (const char *const *)values, credits, &pristine, addr_off, "init");
        addr_off = NULL; /* taken */
    }
    scanned_rows_free(&pristine);
    free(addr_off);
    if (st == TP_OK) {
        const struct tpi_names *t = c->names;
        char err[TP_ERRMSG_LEN_MAX] = "";
        st = shares_list(c) ? c->ops->set_peers_id(c->agent, t->addrs, c->world_size, t->rows_id,
                                                   err, sizeof err)
                    : c->ops->set_peers(c->agent, (const char *const *)addrs, c->world_size, err,
                                        sizeof err);
        if (st != TP_OK) {
            tpi_format(msg, sizeof msg, "init: worker '%s' could not take the peer addresses: %s",
                       c->self.name, err);
            st = publish_error(c, st, msg);
        }
    }
    for (uint32_t r = 0; values && !rows.arena && r < c->world_size; r++)
        free(values[r]);
    scanned_rows_free(&rows);
    free(values);
    free(addrs);
    free(credits);
    if (st != TP_OK)
        return st;

    return TP_OK;
}

/* One call to peer's built-in ping, bounded by the init deadline. */
static tp_status warm_up(tp_core *c, uint32_t peer, uint64_t deadline_ns) {
    char who[TP_NAME_LEN_MAX + 32];
    uint64_t now = tpi_now(c);
    if (deadline_ns != TPI_NO_DEADLINE && now >= deadline_ns)
        return tpi_fail(TP_ETIMEDOUT, "init: no time left to reach %s",
                        tpi_worker_desc(c, peer, who, sizeof who));
    double timeout_s = deadline_ns == TPI_NO_DEADLINE ? TP_TIMEOUT_INFINITE
                                                      : (double)(deadline_ns - now) / 1e9;
    tp_future *f = NULL;
    tpi_lock(c);
    tp_status st = tpi_start_request(c, peer, "init warm-up", TPI_PING_FN, 0, NULL, NULL,
                                     timeout_s, &f);
    tpi_unlock(c);
    if (st == TP_OK)
        st = tpi_future_result(c, f, NULL);
    tp_future_free(f);
    if (st == TP_ECANCELED && tpi_interrupted(c)) /* INTERRUPT-1 */
        return tpi_fail(st, "init: worker '%s' (rank %u) was interrupted while waiting for %s "
                            "to answer init's warm-up ping",
                        c->self.name, c->rank, tpi_worker_desc(c, peer, who, sizeof who));
    if (st != TP_OK) {
        char msg[TP_ERRMSG_LEN_MAX];
        tpi_format(msg, sizeof msg, "%s", tp_errmsg());
        return tpi_fail(st, "init: worker '%s' (id %u) cannot reach %s: %s", c->self.name,
                        c->rank, tpi_worker_desc(c, peer, who, sizeof who), msg);
    }
    return TP_OK;
}

tp_status tpi_rendezvous_ready(tp_core *c, uint64_t deadline_ns) {
    /* INIT-8: nobody sends before everybody can route. */
    int counted = 0; /* STORE-12 */
    tp_status st = tpi_store_put_counted(c, "init/ready", "1", NULL, NULL, 0, &counted,
                                         deadline_ns);
    if (st != TP_OK)
        return store_fail(c, st, "init");
    st = tpi_store_gather(c, "init/ready", deadline_ns, 0, NULL, NULL, counted, "init");
    if (st != TP_OK)
        return st;
    /* INIT-8: the warm-up. Each worker calls the next one on a ring, which
     * proves every worker's address reachable from a peer with n connections,
     * not n^2 (they open on first use), and leaves them open for the first
     * calls. Every worker waits for all to have succeeded before the commit,
     * so a worker nobody can reach fails init everywhere, not later calls. */
    st = warm_up(c, (c->rank + 1) % c->world_size, deadline_ns);
    if (st != TP_OK) {
        char msg[TP_ERRMSG_LEN_MAX];
        tpi_format(msg, sizeof msg, "%s", tp_errmsg());
        return publish_error(c, st, msg);
    }
    st = tpi_store_put_counted(c, "init/reach", "1", NULL, NULL, 0, &counted, deadline_ns);
    if (st != TP_OK)
        return store_fail(c, st, "init");
    st = tpi_store_gather(c, "init/reach", deadline_ns, 0, NULL, NULL, counted, "init");
    if (st != TP_OK)
        return st;
    return publish_outcome(c, TP_OK, ""); /* commit, or learn of a failure decided first */
}

/* ---- Rejoin (REJOIN-1..3) ---------------------------------------------------- */

/* Waits until the job's init outcome is published; TP_OK when it committed. */
static tp_status rejoin_wait_commit(tp_core *c, uint64_t deadline_ns) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    uint64_t backoff = POLL_FIRST_NS;
    tpi_key(c, key, sizeof key, "init/error");
    for (;;) {
        tp_status st;
        if (key_exists(c, key, NULL, &st, deadline_ns))
            return check_error_key(c, "rejoin: the job's init failed", deadline_ns);
        if (st != TP_OK)
            return store_fail(c, st, "rejoin");
        if (deadline_ns != TPI_NO_DEADLINE && tpi_now(c) >= deadline_ns)
            return tpi_fail(TP_ETIMEDOUT,
                            "rejoin: timed out waiting for the job to finish its init "
                            "(worker '%s', rank %u)",
                            c->self.name, c->rank);
        st = tpi_store_nap(c, &backoff, POLL_MAX_NS, deadline_ns);
        if (st != TP_OK)
            return tpi_fail(st, "rejoin: the wait was interrupted: %s", tp_strerror(st));
    }
}

/* Reads a value that must exist; NULL with a failure recorded otherwise. */
static char *must_get(tp_core *c, const char *key, uint64_t deadline_ns) {
    char *v = NULL;
    tp_status st;
    if (key_exists(c, key, &v, &st, deadline_ns))
        return v;
    if (st == TP_OK)
        tpi_fail(TP_ESTORE, "rejoin: the job has no key '%s' in its store", key);
    else
        store_fail(c, st, "rejoin");
    return NULL;
}

int tpi_inc_parse(const char *v, uint32_t *k, const char **addr) {
    const char *tab = strchr(v, '\t');
    char num[16];
    size_t n = tab ? (size_t)(tab - v) : 0;
    if (!tab || n == 0 || n >= sizeof num || !tab[1])
        return 0;
    memcpy(num, v, n);
    num[n] = '\0';
    if (!tpi_parse_index(num, TPI_INCARNATION_MAX + 1, k) || *k == 0)
        return 0;
    *addr = tab + 1;
    return 1;
}

/* REJOIN-2: takes incarnation k+1 of this rank, where k is the newest. */
static tp_status take_incarnation(tp_core *c, const char *addr, uint64_t deadline_ns) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    char val[TPI_ADDR_LEN_MAX + 16];
    tpi_key(c, key, sizeof key, "inc/%u", c->rank);
    for (;;) {
        char *cur = NULL;
        tp_status st;
        int have = key_exists(c, key, &cur, &st, deadline_ns);
        if (st != TP_OK)
            return store_fail(c, st, "rejoin");
        uint32_t k = 0;
        const char *old_addr;
        if (have && !tpi_inc_parse(cur, &k, &old_addr)) {
            free(cur);
            return tpi_fail(TP_ESTORE, "rejoin: the store's '%s' is malformed", key);
        }
        if (k >= TPI_INCARNATION_MAX) {
            free(cur);
            return tpi_fail(TP_ELIMIT, "rejoin: rank %u has restarted %u times, the most there "
                                       "can be", c->rank, k);
        }
        size_t n = tpi_format(val, sizeof val, "%u\t%s", k + 1, addr);
        int swapped = 0;
        st = tpi_store_cas(c, key, cur, have ? strlen(cur) : 0, val, n, &swapped, deadline_ns);
        free(cur);
        if (st != TP_OK)
            return store_fail(c, st, "rejoin");
        if (!swapped) { /* a lost reply to our own write reads back as ours */
            char *now = NULL;
            if (key_exists(c, key, &now, &st, deadline_ns))
                swapped = strcmp(now, val) == 0;
            free(now);
        }
        if (swapped) {
            c->incarnation = k + 1;
            return TP_OK;
        }
        /* Another restart of this rank won the race: take the one after it. */
        if (deadline_ns != TPI_NO_DEADLINE && tpi_now(c) >= deadline_ns)
            return tpi_fail(TP_ETIMEDOUT, "rejoin: no time left to take an incarnation");
    }
}

tp_status tpi_rendezvous_rejoin(tp_core *c, const char *addr, uint64_t deadline_ns) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    if (!c->ops->set_peer) /* REJOIN-1: peers restarting later need it from us */
        return tpi_fail(TP_EBACKEND, "rejoin: backend '%s' cannot take a restarted peer "
                                     "(AGENT-16), so it cannot rejoin a job",
                        c->ops->name);
    tp_status st = rejoin_wait_commit(c, deadline_ns);
    if (st != TP_OK)
        return st;
    /* REJOIN-1: the same job, the same rank under the same name. */
    tpi_key(c, key, sizeof key, "init/world_size");
    char *ws = must_get(c, key, deadline_ns);
    if (!ws)
        return TP_ESTORE;
    uint32_t job_ws = 0;
    int same = tpi_parse_index(ws, TP_WORLD_SIZE_MAX + 1, &job_ws) && job_ws == c->world_size;
    if (!same) {
        st = tpi_fail(TP_EINVAL, "rejoin: world size mismatch: worker '%s' (rank %u) says %u, "
                                 "the job says %s",
                      c->self.name, c->rank, c->world_size, ws);
        free(ws);
        return st;
    }
    free(ws);
    /* REJOIN-1: a job that began its shutdown takes no one back. */
    for (uint32_t q = 0; q < c->world_size; q++) {
        tpi_key(c, key, sizeof key, "sd/arrive/%u", q);
        if (key_exists(c, key, NULL, &st, deadline_ns))
            return tpi_fail(TP_ESHUTDOWN, "rejoin: the job is shutting down (rank %u began)", q);
        if (st != TP_OK)
            return store_fail(c, st, "rejoin");
    }
    char **addrs = calloc(c->world_size, sizeof *addrs);
    char **vals = calloc(c->world_size, sizeof *vals);
    uint64_t *credits = malloc((size_t)c->world_size * sizeof *credits);
    if (!addrs || !vals || !credits) {
        free(addrs);
        free(vals);
        free(credits);
        return tpi_fail(TP_ENOMEM, "rejoin: out of memory for %u workers", c->world_size);
    }
    /* REJOIN-3: the all-gather: names from init, addresses from the newest
     * incarnation of each rank. */
    for (uint32_t q = 0; st == TP_OK && q < c->world_size; q++) {
        tpi_key(c, key, sizeof key, "init/rank/%u", q);
        if (!(vals[q] = must_get(c, key, deadline_ns))) {
            st = TP_ESTORE;
            break;
        }
        const char *a;
        uint64_t credit = 0;
        if (!tpi_rank_entry_parse(vals[q], &credit, &a)) {
            st = tpi_fail(TP_ESTORE, "rejoin: rank %u's entry in the store is malformed", q);
            break;
        }
        if (q == c->rank && strcmp(vals[q], c->self.name) != 0) {
            st = tpi_fail(TP_EINVAL, "rejoin: rank %u is '%s' in this job, not '%s'", q,
                          vals[q], c->self.name);
            break;
        }
        credits[q] = credit; /* FLOW-6 */
        addrs[q] = (char *)a;
    }
    if (st == TP_OK) /* the names, values cut at their tab; before vals change */
        st = adopt_names(c, (const char *const *)vals, credits, NULL, NULL, "rejoin");
    for (uint32_t q = 0; st == TP_OK && q < c->world_size; q++) {
        if (q == c->rank) {
            addrs[q] = (char *)addr;
            continue;
        }
        char *v = NULL;
        tpi_key(c, key, sizeof key, "inc/%u", q);
        if (!key_exists(c, key, &v, &st, deadline_ns)) {
            if (st != TP_OK)
                st = store_fail(c, st, "rejoin");
            continue;
        }
        uint32_t k;
        const char *a;
        if (!tpi_inc_parse(v, &k, &a)) {
            free(v);
            st = tpi_fail(TP_ESTORE, "rejoin: the store's '%s' is malformed", key);
            break;
        }
        free(vals[q]); /* the name was copied into the worker table */
        vals[q] = v;
        addrs[q] = (char *)a;
        tpi_lock(c);
        st = tpi_peer_inc_set(c, q, k);
        tpi_unlock(c);
    }
    if (st == TP_OK) {
        /* Routes first, then the address goes public (INIT-8's rule): a
         * peer that reads it may send at once. */
        char err[TP_ERRMSG_LEN_MAX] = "";
        st = c->ops->set_peers(c->agent, (const char *const *)addrs, c->world_size, err,
                               sizeof err);
        if (st != TP_OK)
            st = tpi_fail(st, "rejoin: worker '%s' could not take the peer addresses: %s",
                          c->self.name, err);
    }
    if (st == TP_OK)
        st = take_incarnation(c, addr, deadline_ns);
    if (st == TP_OK) {
        /* REJOIN-3: every id minted from here carries the incarnation. */
        uint64_t base = (uint64_t)c->incarnation << TPI_INC_SHIFT;
        tpi_lock(c);
        c->next_id = base;
        tpi_unlock(c);
        atomic_store(&c->next_gid, base);
    }
    for (uint32_t q = 0; q < c->world_size; q++)
        free(vals[q]);
    free(vals);
    free(addrs);
    free(credits);
    return st;
}

tp_status tpi_rejoin_lookup(tp_core *c, uint32_t q, uint32_t *k, char *addr, size_t addr_len,
                            uint64_t deadline_ns) {
    char key[TP_STORE_KEY_LEN_MAX + 1];
    char *v = NULL;
    tp_status st;
    *k = 0;
    tpi_key(c, key, sizeof key, "inc/%u", q);
    if (!key_exists(c, key, &v, &st, deadline_ns))
        return st == TP_OK ? TP_OK : store_fail(c, st, "rejoin");
    const char *a;
    if (!tpi_inc_parse(v, k, &a) || strlen(a) >= addr_len) {
        free(v);
        *k = 0;
        return tpi_fail(TP_ESTORE, "rejoin: the store's '%s' is malformed", key);
    }
    memcpy(addr, a, strlen(a) + 1);
    free(v);
    return TP_OK;
}
