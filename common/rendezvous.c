/*
 * rendezvous.c: init's all-gather and the barriers, through the store
 * (spec/lifecycle.md INIT-5..8, SHUTDOWN-3). The store only has get/set
 * and atomic ops; waiting is polling with backoff through the agent's park,
 * so on the simulator it runs on virtual time like everything else.
 */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "log.h"

#define POLL_FIRST_NS 500000ull     /* 0.5 ms: rendezvous partners are usually close */
#define POLL_MAX_NS 20000000ull     /* 20 ms: bounds the latency added to a late joiner */
#define MISSING_NAMED_MAX 8         /* ranks named in a timeout message */
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
static int scan_rank(const char *s, uint32_t world, uint32_t *out) {
    uint64_t v = 0;
    size_t i = 0;
    for (; s[i] >= '0' && s[i] <= '9' && i < 10; i++)
        v = v * 10 + (uint64_t)(s[i] - '0');
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

tp_status tpi_store_gather(tp_core *c, const char *prefix, uint64_t deadline_ns,
                           int honor_dead, char **values, const char *what) {
    int by_scan = c->store->ops->scan != NULL;
    uint8_t *present = calloc(c->world_size, by_scan ? 3 : 1);
    if (!present)
        return tpi_fail(TP_ENOMEM, "%s: out of memory", what);
    uint8_t *seen = present + c->world_size, *dead_seen = seen + c->world_size; /* by_scan */
    uint64_t backoff = POLL_FIRST_NS;
    char key[TP_STORE_KEY_LEN_MAX + 1];
    tp_status st = TP_OK;
    /* A round stops at the first key still missing (the later ones are
     * likely missing too): a wait costs O(ranks + rounds) reads, not
     * O(ranks x rounds). A full round names every missing rank at the end. */
    int full = by_scan; /* a scan round is always complete */
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
        if (by_scan) {
            st = scan_round(c, prefix, present, values, honor_dead, seen, dead_seen, deadline_ns);
            for (uint32_t r = 0; st == TP_OK && r < c->world_size; r++)
                missing += present[r] == 0;
        }
        for (uint32_t r = 0; !by_scan && r < c->world_size && st == TP_OK; r++) {
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
                missing++;
                if (!full)
                    break;
            }
        }
        if (st != TP_OK) {
            st = store_fail(c, st, what);
            break;
        }
        if (!honor_dead && (st = check_error_key(c, what, deadline_ns)) != TP_OK)
            break;
        if (missing == 0)
            break;
        if (tpi_now(c) >= deadline_ns && !full) {
            full = 1; /* one complete look first, for the message */
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
            continue;
        }
        uint64_t now = tpi_now(c);
        if (now >= next_note && init_wait && tpi_log_on(TP_LOG_WARN)) {
            char names[256], left[48] = "no init timeout";
            name_missing(c, present, names, sizeof names);
            if (deadline_ns != TPI_NO_DEADLINE)
                tpi_format(left, sizeof left, "init timeout in %.0f s",
                           (double)(deadline_ns - now) / 1e9);
            tpi_log(TP_LOG_WARN, "%s: worker '%s' (rank %u) still waiting for rank%s %s (of %u "
                                 "workers) after %.0f s; %s",
                    what, c->self.name, c->rank, missing > 1 || !full ? "s" : "", names,
                    c->world_size, (double)(now - started) / 1e9, left);
        } else if (now >= next_note && tpi_log_on(TP_LOG_INFO)) { /* LOG-3: for whom */
            char names[256];
            name_missing(c, present, names, sizeof names);
            tpi_log(TP_LOG_INFO, "%s: worker '%s' (rank %u) has waited %.1f s for '%s' keys; "
                                 "not yet seen: rank%s %s (of %u workers)",
                    what, c->self.name, c->rank, (double)(now - started) / 1e9, prefix,
                    missing > 1 || !full ? "s" : "", names, c->world_size);
        }
        while (next_note <= now)
            next_note += every;
        st = tpi_store_nap(c, &backoff, POLL_MAX_NS, deadline_ns);
        if (st == TP_ECANCELED) {
            st = interrupted(c, present, missing > 1 || !full, honor_dead, what);
            if (st == TP_OK)
                continue; /* init committed first: every key exists (INIT-5) */
            break;
        }
        if (st != TP_OK) {
            st = tpi_fail(st, "%s: the wait was interrupted: %s", what, tp_strerror(st));
            break;
        }
    }
    if (st == TP_OK && honor_dead) {
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
        while (r < c->world_size && !c->peer_dead[r])
            r++;
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

static int by_name_cmp_ctx(const tp_core *c, uint32_t a, uint32_t b) {
    return strcmp(c->infos[a].name, c->infos[b].name);
}

/* Sorts ids[0..n) by name: a merge sort through tmp (n ids), O(n log n)
 * compares and moves. Names are unique (INIT-4), so the order is the same
 * whatever the sort. */
static void sort_ids(const tp_core *c, uint32_t *ids, uint32_t *tmp, uint32_t n) {
    if (n < 2)
        return;
    uint32_t half = n / 2;
    sort_ids(c, ids, tmp, half);
    sort_ids(c, ids + half, tmp, n - half);
    if (by_name_cmp_ctx(c, ids[half - 1], ids[half]) < 0)
        return; /* already in order */
    uint32_t i = 0, j = half, k = 0;
    while (i < half && j < n)
        tmp[k++] = by_name_cmp_ctx(c, ids[i], ids[j]) < 0 ? ids[i++] : ids[j++];
    while (i < half)
        tmp[k++] = ids[i++];
    memcpy(ids, tmp, (size_t)k * sizeof *ids); /* the rest of ids[half..n) is in place */
}

static tp_status sort_names(tp_core *c) {
    uint32_t *tmp = malloc((size_t)c->world_size * sizeof *tmp);
    if (!tmp)
        return tpi_fail(TP_ENOMEM, "init: out of memory sorting %u names", c->world_size);
    for (uint32_t i = 0; i < c->world_size; i++)
        c->by_name[i] = i;
    sort_ids(c, c->by_name, tmp, c->world_size);
    free(tmp);
    return TP_OK;
}

/* The name of a rank's entry (cut at its first tab by tpi_rank_entry_parse)
 * into infos: a plain copy, since it runs world^2 times over a job. */
static void copy_name(tp_worker_info *info, const char *name) {
    size_t n = strnlen(name, sizeof info->name - 1);
    memcpy(info->name, name, n);
    info->name[n] = '\0';
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
    char **values = calloc(c->world_size, sizeof *values);
    char **addrs = calloc(c->world_size, sizeof *addrs);
    if (!values || !addrs) {
        free(values);
        free(addrs);
        return tpi_fail(TP_ENOMEM, "init: out of memory for %u workers", c->world_size);
    }
    st = tpi_store_gather(c, "init/rank", deadline_ns, 0, values, "init");
    for (uint32_t r = 0; st == TP_OK && r < c->world_size; r++) {
        const char *a;
        uint64_t credit = 0;
        if (!tpi_rank_entry_parse(values[r], &credit, &a)) {
            char bad[96];
            tpi_format(bad, sizeof bad, "init: rank %u's entry in the store is malformed", r);
            st = publish_error(c, TP_ESTORE, bad);
            break;
        }
        copy_name(&c->infos[r], values[r]);
        c->infos[r].id = r;
        c->credit[r] = credit; /* FLOW-6: our window to r (lock: no call runs yet) */
        addrs[r] = (char *)a;
    }
    if (st == TP_OK)
        st = sort_names(c);
    if (st == TP_OK) {
        char err[TP_ERRMSG_LEN_MAX] = "";
        st = c->ops->set_peers(c->agent, (const char *const *)addrs, c->world_size, err,
                               sizeof err);
        if (st != TP_OK) {
            tpi_format(msg, sizeof msg, "init: worker '%s' could not take the peer addresses: %s",
                       c->self.name, err);
            st = publish_error(c, st, msg);
        }
    }
    for (uint32_t r = 0; r < c->world_size; r++)
        free(values[r]);
    free(values);
    free(addrs);
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
    char key[TP_STORE_KEY_LEN_MAX + 1];
    /* INIT-8: nobody sends before everybody can route. */
    tpi_key(c, key, sizeof key, "init/ready/%u", c->rank);
    tp_status st = tpi_store_set(c, key, "1", 1, deadline_ns);
    if (st != TP_OK)
        return store_fail(c, st, "init");
    st = tpi_store_gather(c, "init/ready", deadline_ns, 0, NULL, "init");
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
    tpi_key(c, key, sizeof key, "init/reach/%u", c->rank);
    st = tpi_store_set(c, key, "1", 1, deadline_ns);
    if (st != TP_OK)
        return store_fail(c, st, "init");
    st = tpi_store_gather(c, "init/reach", deadline_ns, 0, NULL, "init");
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
    if (!addrs || !vals) {
        free(addrs);
        free(vals);
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
        copy_name(&c->infos[q], vals[q]);
        c->infos[q].id = q;
        c->credit[q] = credit; /* FLOW-6 */
        addrs[q] = (char *)a;
    }
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
        free(vals[q]); /* the name was copied into infos */
        vals[q] = v;
        addrs[q] = (char *)a;
        tpi_lock(c);
        atomic_store_explicit(&c->peer_inc[q], k, memory_order_relaxed);
        tpi_unlock(c);
    }
    if (st == TP_OK) {
        /* Routes first, then the address goes public (INIT-8's rule): a
         * peer that reads it may send at once. */
        st = sort_names(c);
    }
    if (st == TP_OK) {
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
