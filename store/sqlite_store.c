/*
 * sqlite_store.c: the rendezvous store on SQLite (spec/store.md STORE-1..8).
 *
 * One table, tp_kv(k TEXT PRIMARY KEY, v BLOB), behind tp_store_ops. Two
 * uses with one code path:
 * - ":memory:", the simulator's: a private database in one thread. Every
 *   statement is prepared once at open and reused, so an operation is a
 *   bind, a step and a reset.
 * - a file path, shared by every process of a job: WAL journal mode (readers
 *   never block the writer), a busy handler that waits up to
 *   SQLS_BUSY_TIMEOUT_MS for another process's write lock, and a bounded
 *   retry of the whole operation for the SQLITE_BUSY/SQLITE_LOCKED cases
 *   the busy handler never sees (a concurrent WAL switch at open, recovery).
 *   The read-modify-write operations (add, compare_set) run inside BEGIN
 *   IMMEDIATE, which takes the write lock before the read, so no other
 *   process can write between our read and our write (STORE-3).
 *
 * SQLite codes stop here: each failure becomes a tp_status with a message
 * naming the store's path, the operation, the key and SQLite's own text
 * (STORE-5), kept in tp_store.errmsg and recorded with tpi_fail.
 *
 * A handle may be used from several threads: each operation holds the
 * connection's mutex (the connection is opened SQLITE_OPEN_FULLMUTEX) for
 * its whole length, so the shared prepared statements are never stepped by
 * two threads at once. A handle must not cross a fork(): open a new one in
 * the child.
 */
#include <errno.h>
#include <inttypes.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/errors.h"
#include "store/store_int.h"
#include "tensorplay/rpc_backend.h"

/* How long an operation waits for another process's write lock before it
 * fails with TP_ESTORE: generous, since a whole job's workers may write
 * their rendezvous keys at the same moment. */
#define SQLS_BUSY_TIMEOUT_MS 10000
/* The busy handler's sleeps: short first (a store transaction holds the
 * lock for tens of microseconds), doubling up to a cap. */
#define SQLS_BUSY_SLEEP_MIN_US 20
#define SQLS_BUSY_SLEEP_MAX_US 5000
/* Whole-operation retries on SQLITE_BUSY/SQLITE_LOCKED returned without the
 * busy handler; also bounded by SQLS_BUSY_TIMEOUT_MS in total. */
#define SQLS_RETRY_MAX 200
/* Longest path accepted: PATH_MAX on Linux. */
#define SQLS_PATH_LEN_MAX 4096
/* Bytes of a path, or of a bad value, quoted in a message. */
#define SQLS_MSG_PATH_MAX 400
#define SQLS_MSG_VALUE_MAX 32
/* Bytes of SQLite's own error text kept for a message. */
#define SQLS_DB_ERR_MAX 256

_Static_assert(TP_STORE_VALUE_LEN_MAX <= INT32_MAX, "a value's length fits SQLite's int");
_Static_assert(SQLS_MSG_PATH_MAX + TP_STORE_KEY_LEN_MAX + SQLS_DB_ERR_MAX + 64 <= TP_ERRMSG_LEN_MAX,
               "a message holds the quoted path, a whole key and SQLite's text");

typedef enum sqls_stmt {
    SQLS_GET,
    SQLS_PUT,
    SQLS_DEL,
    SQLS_BEGIN,
    SQLS_COMMIT,
    SQLS_ROLLBACK,
    SQLS_SCAN,
    SQLS_STMT_COUNT_
} sqls_stmt;

static const char *const sqls_sql[SQLS_STMT_COUNT_] = {
    [SQLS_GET] = "SELECT v FROM tp_kv WHERE k = ?1",
    [SQLS_PUT] = "INSERT OR REPLACE INTO tp_kv(k, v) VALUES (?1, ?2)",
    [SQLS_DEL] = "DELETE FROM tp_kv WHERE k = ?1",
    [SQLS_BEGIN] = "BEGIN IMMEDIATE",
    [SQLS_COMMIT] = "COMMIT",
    [SQLS_ROLLBACK] = "ROLLBACK",
    /* The primary key's b-tree in key order from the prefix on; the caller
     * stops at the first key without the prefix. */
    [SQLS_SCAN] = "SELECT k, v FROM tp_kv WHERE k >= ?1 ORDER BY k",
};

static const char sqls_schema[] = "CREATE TABLE IF NOT EXISTS tp_kv("
                                  "k TEXT PRIMARY KEY NOT NULL, v BLOB NOT NULL) WITHOUT ROWID";

typedef struct sqls_store {
    tp_store base; /* first: a tp_store * is a sqls_store * */
    sqlite3 *db;
    sqlite3_stmt *stmt[SQLS_STMT_COUNT_];
    uint64_t busy_start_ns;       /* when the busy handler's current wait began */
    int db_rc;                    /* the last failed SQLite call's extended code */
    char db_err[SQLS_DB_ERR_MAX]; /* and its text, kept before a reset replaces it */
    char path[];                  /* as given to open */
} sqls_store;

/* One attempt of an operation's body. Returns an SQLite code: SQLITE_OK when
 * done (with *status set, and a message recorded, for an error that is the
 * caller's and not SQLite's), anything else when SQLite failed. */
typedef int (*sqls_body)(sqls_store *s, void *arg, tp_status *status);

/* ------------------------------------------------------------------------ */
/* Time, for the busy wait only. */

static uint64_t sqls_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sqls_sleep_us(uint32_t us) {
    struct timespec ts = {.tv_sec = us / 1000000u, .tv_nsec = (long)(us % 1000000u) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        /* interrupted: sleep the rest */
    }
}

static uint32_t sqls_backoff_us(int count) {
    int shift = count < 16 ? count : 16;
    uint32_t us = (uint32_t)SQLS_BUSY_SLEEP_MIN_US << shift;
    return us < SQLS_BUSY_SLEEP_MAX_US ? us : SQLS_BUSY_SLEEP_MAX_US;
}

/* SQLite's busy handler: called while another connection holds a lock we
 * need; nonzero means "try again". count is 0 on the first call of a wait. */
static int sqls_busy(void *arg, int count) {
    sqls_store *s = arg;
    uint64_t now = sqls_now_ns();
    if (count == 0)
        s->busy_start_ns = now;
    if (now - s->busy_start_ns >= (uint64_t)SQLS_BUSY_TIMEOUT_MS * 1000000u)
        return 0;
    sqls_sleep_us(sqls_backoff_us(count));
    return 1;
}

/* Whether a failed attempt should be tried again: a lock conflict, within
 * the bounds. Sleeps before saying yes. *start_ns is 0 before the first. */
static int sqls_retry(int rc, int *attempt, uint64_t *start_ns) {
    int primary = rc & 0xff;
    if (primary != SQLITE_BUSY && primary != SQLITE_LOCKED)
        return 0;
    uint64_t now = sqls_now_ns();
    if (*start_ns == 0)
        *start_ns = now;
    if (*attempt >= SQLS_RETRY_MAX || now - *start_ns >= (uint64_t)SQLS_BUSY_TIMEOUT_MS * 1000000u)
        return 0;
    sqls_sleep_us(sqls_backoff_us(*attempt));
    (*attempt)++;
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Messages. */

/* Records "store '<path>': <message>" in s->base.errmsg and for tp_errmsg(). */
static tp_status sqls_fail(sqls_store *s, tp_status status, const char *fmt, ...) TPI_PRINTF(3, 4);

static tp_status sqls_fail(sqls_store *s, tp_status status, const char *fmt, ...) {
    char *buf = s->base.errmsg;
    size_t n = tpi_format(buf, sizeof s->base.errmsg, "store '%.*s': ", SQLS_MSG_PATH_MAX, s->path);
    va_list ap;
    va_start(ap, fmt);
    tpi_vformat(buf + n, sizeof s->base.errmsg - n, fmt, ap);
    va_end(ap);
    return tpi_fail_msg(status, buf);
}

/* Keeps SQLite's text for the failure rc just returned, before a reset or a
 * rollback replaces it. */
static void sqls_note(sqls_store *s, int rc) {
    s->db_rc = sqlite3_extended_errcode(s->db);
    if ((s->db_rc & 0xff) != (rc & 0xff))
        s->db_rc = rc;
    tpi_format(s->db_err, sizeof s->db_err, "%s", sqlite3_errmsg(s->db));
}

static tp_status sqls_fail_db(sqls_store *s, const char *op, const char *key) {
    if (key)
        return sqls_fail(s, TP_ESTORE, "%s '%s': %s (sqlite error %d)", op, key, s->db_err,
                         s->db_rc);
    return sqls_fail(s, TP_ESTORE, "%s: %s (sqlite error %d)", op, s->db_err, s->db_rc);
}

/* A value quoted for a message: its first bytes, anything unprintable as '?'. */
static void sqls_quote(char *out, size_t out_len, const void *value, size_t len) {
    const unsigned char *p = value;
    size_t n = len < out_len - 1 ? len : out_len - 1;
    for (size_t i = 0; i < n; i++)
        out[i] = (p[i] >= 0x20 && p[i] < 0x7f) ? (char)p[i] : '?';
    out[n] = '\0';
}

/* ------------------------------------------------------------------------ */
/* Arguments from the caller (STORE-4): checked, never asserted, except the
 * pointers the contract says are never NULL. */

static tp_status sqls_check_key(sqls_store *s, const char *op, const char *key, size_t *len) {
    TPI_ASSERT(key != NULL);
    *len = strnlen(key, (size_t)TP_STORE_KEY_LEN_MAX + 1);
    if (*len == 0)
        return sqls_fail(s, TP_EINVAL, "%s: empty key", op);
    if (*len > TP_STORE_KEY_LEN_MAX)
        return sqls_fail(s, TP_EINVAL, "%s '%.40s...': key longer than %d bytes", op, key,
                         TP_STORE_KEY_LEN_MAX);
    return TP_OK;
}

static tp_status sqls_check_value(sqls_store *s, const char *op, const char *key, const void *value,
                                  size_t len) {
    TPI_ASSERT(value != NULL || len == 0);
    if (len > TP_STORE_VALUE_LEN_MAX)
        return sqls_fail(s, TP_EINVAL, "%s '%s': value of %zu bytes is over the limit of %u", op,
                         key, len, (unsigned)TP_STORE_VALUE_LEN_MAX);
    return TP_OK;
}

/* ------------------------------------------------------------------------ */
/* Statement helpers. Every statement is reset before the helper returns. */

/* Steps a statement without a result row to completion: SQLITE_OK or a failure. */
static int sqls_exec(sqls_store *s, sqls_stmt id) {
    sqlite3_stmt *q = s->stmt[id];
    int rc = sqlite3_step(q);
    if (rc != SQLITE_DONE)
        sqls_note(s, rc);
    sqlite3_reset(q);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int sqls_bind_key(sqls_store *s, sqlite3_stmt *q, const char *key, size_t len) {
    int rc = sqlite3_bind_text(q, 1, key, (int)len, SQLITE_STATIC);
    if (rc != SQLITE_OK)
        sqls_note(s, rc);
    return rc;
}

static int sqls_put(sqls_store *s, const char *key, size_t key_len, const void *value, size_t len) {
    sqlite3_stmt *q = s->stmt[SQLS_PUT];
    int rc = sqls_bind_key(s, q, key, key_len);
    if (rc != SQLITE_OK)
        return rc;
    /* A NULL pointer would bind SQL NULL: an empty value is an empty blob. */
    static const char empty = 0;
    rc = sqlite3_bind_blob(q, 2, len ? value : &empty, (int)len, SQLITE_STATIC);
    if (rc != SQLITE_OK) {
        sqls_note(s, rc);
        return rc;
    }
    return sqls_exec(s, SQLS_PUT);
}

/* Looks key up with SQLS_GET. SQLITE_ROW leaves the statement on the row
 * (*value, *len valid until the caller resets it); SQLITE_DONE when absent;
 * anything else is a failure (statement reset). */
static int sqls_lookup(sqls_store *s, const char *key, size_t key_len, const void **value,
                       size_t *len) {
    sqlite3_stmt *q = s->stmt[SQLS_GET];
    int rc = sqls_bind_key(s, q, key, key_len);
    if (rc != SQLITE_OK)
        return rc;
    rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        *value = sqlite3_column_blob(q, 0); /* blob first, then bytes: SQLite's order */
        int n = sqlite3_column_bytes(q, 0);
        *len = n > 0 ? (size_t)n : 0;
        if (*value == NULL && *len > 0) { /* out of memory converting the row */
            rc = SQLITE_NOMEM;
            sqls_note(s, rc);
            sqlite3_reset(q);
        }
        return rc;
    }
    if (rc != SQLITE_DONE)
        sqls_note(s, rc);
    sqlite3_reset(q);
    return rc;
}

static void sqls_rollback(sqls_store *s) {
    if (sqlite3_get_autocommit(s->db))
        return; /* SQLite already rolled back, or we never began */
    sqlite3_stmt *q = s->stmt[SQLS_ROLLBACK];
    sqlite3_step(q); /* a failed rollback leaves nothing we could do better */
    sqlite3_reset(q);
}

/*
 * Runs body (the caller holds the connection's mutex), inside BEGIN IMMEDIATE if txn,
 * retrying the whole attempt (rolled back) on a lock conflict within the
 * bounds. A body's own error comes back as its status; an SQLite failure as
 * TP_ESTORE naming op and key.
 */
static tp_status sqls_run(sqls_store *s, int txn, const char *op, const char *key, sqls_body body,
                          void *arg) {
    int attempt = 0;
    uint64_t start_ns = 0;
    tp_status status = TP_OK;
    for (;;) {
        int rc = txn ? sqls_exec(s, SQLS_BEGIN) : SQLITE_OK;
        if (rc == SQLITE_OK) {
            status = TP_OK;
            rc = body(s, arg, &status);
            if (txn && rc == SQLITE_OK && status == TP_OK)
                rc = sqls_exec(s, SQLS_COMMIT);
            if (txn && (rc != SQLITE_OK || status != TP_OK))
                sqls_rollback(s);
        }
        if (rc == SQLITE_OK)
            break;
        if (!sqls_retry(rc, &attempt, &start_ns)) {
            status = sqls_fail_db(s, op, key);
            break;
        }
    }
    /* After a failure the rollback itself may have failed (I/O): not an invariant. */
    TPI_ASSERT(status != TP_OK || sqlite3_get_autocommit(s->db));
    return status;
}

/* Each operation holds the connection's mutex from its argument checks
 * (which write errmsg) to its last reset. Recursive, and a no-op in a
 * single-threaded SQLite build. */
static void sqls_lock(sqls_store *s) {
    sqlite3_mutex_enter(sqlite3_db_mutex(s->db));
}

static void sqls_unlock(sqls_store *s) {
    sqlite3_mutex_leave(sqlite3_db_mutex(s->db));
}

/* ------------------------------------------------------------------------ */
/* set, get, del (STORE-1, STORE-2). */

typedef struct sqls_args {
    const char *key;
    size_t key_len;
    const void *value; /* set: the value; compare_set: desired */
    size_t len;
    const void *expected; /* compare_set */
    size_t expected_len;
    int64_t delta; /* add */
    int64_t result;
    void *out; /* get: the malloc'd copy */
    int swapped;
} sqls_args;

static int sqls_set_body(sqls_store *s, void *arg, tp_status *status) {
    sqls_args *a = arg;
    (void)status;
    return sqls_put(s, a->key, a->key_len, a->value, a->len);
}

static tp_status sqls_set(tp_store *base, const char *key, const void *value, size_t len) {
    TPI_ASSERT(base != NULL);
    sqls_store *s = (sqls_store *)base;
    sqls_args a = {.key = key, .value = value, .len = len};
    sqls_lock(s);
    tp_status st = sqls_check_key(s, "set", key, &a.key_len);
    if (st == TP_OK)
        st = sqls_check_value(s, "set", key, value, len);
    if (st == TP_OK)
        st = sqls_run(s, 0, "set", key, sqls_set_body, &a);
    sqls_unlock(s);
    return st;
}

static int sqls_get_body(sqls_store *s, void *arg, tp_status *status) {
    sqls_args *a = arg;
    const void *v = NULL;
    size_t n = 0;
    int rc = sqls_lookup(s, a->key, a->key_len, &v, &n);
    if (rc == SQLITE_DONE) {
        /* Absent is an answer, not a failure: polling callers see it all the
         * time, so it stays out of tp_errmsg() (ERR-2). */
        tpi_format(s->base.errmsg, sizeof s->base.errmsg, "store '%.*s': get '%s': no such key",
                   SQLS_MSG_PATH_MAX, s->path, a->key);
        *status = TP_ENOENT;
        return SQLITE_OK;
    }
    if (rc != SQLITE_ROW)
        return rc;
    /* The file is shared with other programs: a row is input, not an invariant. */
    if (n > TP_STORE_VALUE_LEN_MAX) {
        *status = sqls_fail(s, TP_ESTORE,
                            "get '%s': stored value of %zu bytes is over the "
                            "limit of %u",
                            a->key, n, (unsigned)TP_STORE_VALUE_LEN_MAX);
    } else if ((a->out = malloc(n + 1)) == NULL) {
        *status = sqls_fail(s, TP_ENOMEM, "get '%s': out of memory for %zu bytes", a->key, n);
    } else {
        if (n)
            memcpy(a->out, v, n);
        ((char *)a->out)[n] = '\0';
        a->len = n;
    }
    sqlite3_reset(s->stmt[SQLS_GET]);
    return SQLITE_OK;
}

static tp_status sqls_get(tp_store *base, const char *key, void **value, size_t *len) {
    TPI_ASSERT(base != NULL && value != NULL && len != NULL);
    sqls_store *s = (sqls_store *)base;
    *value = NULL;
    *len = 0;
    sqls_args a = {.key = key};
    sqls_lock(s);
    tp_status st = sqls_check_key(s, "get", key, &a.key_len);
    if (st == TP_OK)
        st = sqls_run(s, 0, "get", key, sqls_get_body, &a);
    if (st == TP_OK) {
        *value = a.out;
        *len = a.len;
    } else {
        free(a.out);
    }
    sqls_unlock(s);
    return st;
}

static int sqls_del_body(sqls_store *s, void *arg, tp_status *status) {
    sqls_args *a = arg;
    (void)status;
    sqlite3_stmt *q = s->stmt[SQLS_DEL];
    int rc = sqls_bind_key(s, q, a->key, a->key_len);
    return rc == SQLITE_OK ? sqls_exec(s, SQLS_DEL) : rc;
}

static tp_status sqls_del(tp_store *base, const char *key) {
    TPI_ASSERT(base != NULL);
    sqls_store *s = (sqls_store *)base;
    sqls_args a = {.key = key};
    sqls_lock(s);
    tp_status st = sqls_check_key(s, "del", key, &a.key_len);
    if (st == TP_OK)
        st = sqls_run(s, 0, "del", key, sqls_del_body, &a);
    sqls_unlock(s);
    return st;
}

/* ------------------------------------------------------------------------ */
/* add, compare_set (STORE-3): read, decide and write in one transaction. */

static int sqls_add_body(sqls_store *s, void *arg, tp_status *status) {
    sqls_args *a = arg;
    const void *v = NULL;
    size_t n = 0;
    int64_t old = 0;
    int rc = sqls_lookup(s, a->key, a->key_len, &v, &n);
    if (rc == SQLITE_ROW) {
        if (!tpi_store_parse_i64(v, n, &old)) {
            char q[SQLS_MSG_VALUE_MAX + 1];
            sqls_quote(q, sizeof q, v, n);
            *status = sqls_fail(s, TP_EINVAL,
                                "add '%s': value '%s%s' (%zu bytes) is not a "
                                "decimal integer",
                                a->key, q, n > SQLS_MSG_VALUE_MAX ? "..." : "", n);
        }
        sqlite3_reset(s->stmt[SQLS_GET]);
    } else if (rc != SQLITE_DONE) {
        return rc;
    }
    if (*status != TP_OK)
        return SQLITE_OK;
    if ((a->delta > 0 && old > INT64_MAX - a->delta) ||
        (a->delta < 0 && old < INT64_MIN - a->delta)) {
        *status = sqls_fail(s, TP_ERANGE,
                            "add '%s': %" PRId64 " + %" PRId64 " overflows a 64-bit integer",
                            a->key, old, a->delta);
        return SQLITE_OK;
    }
    char text[24];
    size_t text_len = tpi_format(text, sizeof text, "%" PRId64, old + a->delta);
    rc = sqls_put(s, a->key, a->key_len, text, text_len);
    if (rc == SQLITE_OK)
        a->result = old + a->delta;
    return rc;
}

static tp_status sqls_add(tp_store *base, const char *key, int64_t delta, int64_t *result) {
    TPI_ASSERT(base != NULL && result != NULL);
    sqls_store *s = (sqls_store *)base;
    sqls_args a = {.key = key, .delta = delta};
    sqls_lock(s);
    tp_status st = sqls_check_key(s, "add", key, &a.key_len);
    if (st == TP_OK)
        st = sqls_run(s, 1, "add", key, sqls_add_body, &a);
    if (st == TP_OK)
        *result = a.result;
    sqls_unlock(s);
    return st;
}

static int sqls_cas_body(sqls_store *s, void *arg, tp_status *status) {
    sqls_args *a = arg;
    const void *v = NULL;
    size_t n = 0;
    int match;
    (void)status;
    a->swapped = 0;
    int rc = sqls_lookup(s, a->key, a->key_len, &v, &n);
    if (rc == SQLITE_ROW) {
        match = a->expected != NULL && n == a->expected_len &&
                (n == 0 || memcmp(v, a->expected, n) == 0);
        sqlite3_reset(s->stmt[SQLS_GET]);
    } else if (rc == SQLITE_DONE) {
        match = a->expected == NULL;
    } else {
        return rc;
    }
    if (!match)
        return SQLITE_OK;
    rc = sqls_put(s, a->key, a->key_len, a->value, a->len);
    if (rc == SQLITE_OK)
        a->swapped = 1;
    return rc;
}

static tp_status sqls_compare_set(tp_store *base, const char *key, const void *expected,
                                  size_t expected_len, const void *desired, size_t desired_len,
                                  int *swapped) {
    TPI_ASSERT(base != NULL && swapped != NULL);
    TPI_ASSERT(expected != NULL || expected_len == 0);
    sqls_store *s = (sqls_store *)base;
    *swapped = 0;
    sqls_args a = {.key = key,
                   .value = desired,
                   .len = desired_len,
                   .expected = expected,
                   .expected_len = expected_len};
    sqls_lock(s);
    tp_status st = sqls_check_key(s, "compare_set", key, &a.key_len);
    if (st == TP_OK && expected)
        st = sqls_check_value(s, "compare_set (expected)", key, expected, expected_len);
    if (st == TP_OK)
        st = sqls_check_value(s, "compare_set", key, desired, desired_len);
    if (st == TP_OK)
        st = sqls_run(s, 1, "compare_set", key, sqls_cas_body, &a);
    if (st == TP_OK)
        *swapped = a.swapped;
    sqls_unlock(s);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Open and close. */

static void sqls_close(tp_store *base) {
    if (!base)
        return;
    sqls_store *s = (sqls_store *)base;
    for (int i = 0; i < SQLS_STMT_COUNT_; i++)
        sqlite3_finalize(s->stmt[i]);
    /* Every statement is ours and finalized: close cannot be busy. */
    int rc = sqlite3_close(s->db);
    TPI_ASSERT(rc == SQLITE_OK);
    free(s);
}

/* ------------------------------------------------------------------------ */
/* scan (STORE-10). */

typedef struct sqls_scan_args {
    const char *prefix;
    size_t prefix_len;
    int (*fn)(void *arg, const char *key, const void *value, size_t len);
    void *arg;
} sqls_scan_args;

static int sqls_scan_body(sqls_store *s, void *arg, tp_status *status) {
    sqls_scan_args *a = arg;
    sqlite3_stmt *q = s->stmt[SQLS_SCAN];
    int rc = sqls_bind_key(s, q, a->prefix, a->prefix_len);
    while (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *k = (const char *)sqlite3_column_text(q, 0);
        size_t kn = (size_t)sqlite3_column_bytes(q, 0);
        if (!k || kn < a->prefix_len || memcmp(k, a->prefix, a->prefix_len) != 0) {
            rc = SQLITE_DONE; /* past the prefix */
            break;
        }
        const void *v = sqlite3_column_blob(q, 1);
        size_t n = (size_t)sqlite3_column_bytes(q, 1);
        /* The file is shared with other programs: a row is input, not an invariant. */
        if (n > TP_STORE_VALUE_LEN_MAX || strlen(k) != kn) {
            *status = sqls_fail(s, TP_ESTORE, "scan '%s': stored row of %zu bytes is malformed",
                                a->prefix, n);
            rc = SQLITE_DONE;
            break;
        }
        /* sqlite3_column_blob's buffer is NUL-terminated past its bytes only
         * for text; copy what fn may read as a string. */
        char small[256];
        char *copy = n < sizeof small ? small : malloc(n + 1);
        if (!copy) {
            *status = sqls_fail(s, TP_ENOMEM, "scan '%s': out of memory for %zu bytes",
                                a->prefix, n);
            rc = SQLITE_DONE;
            break;
        }
        if (n)
            memcpy(copy, v, n);
        copy[n] = '\0';
        int stop = a->fn(a->arg, k, copy, n);
        if (copy != small)
            free(copy);
        if (stop) {
            rc = SQLITE_DONE;
            break;
        }
        rc = SQLITE_OK; /* the next row */
    }
    sqlite3_reset(q);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static tp_status sqls_scan(tp_store *base, const char *prefix,
                           int (*fn)(void *arg, const char *key, const void *value, size_t len),
                           void *arg) {
    TPI_ASSERT(base != NULL && prefix != NULL && fn != NULL);
    sqls_store *s = (sqls_store *)base;
    sqls_scan_args a = {.prefix = prefix, .fn = fn, .arg = arg};
    sqls_lock(s);
    tp_status st = sqls_check_key(s, "scan", prefix, &a.prefix_len);
    if (st == TP_OK)
        st = sqls_run(s, 0, "scan", prefix, sqls_scan_body, &a);
    sqls_unlock(s);
    return st;
}

static const tp_store_ops sqls_ops = {
    .api_version = TP_BACKEND_API_VERSION,
    .set = sqls_set,
    .get = sqls_get,
    .add = sqls_add,
    .compare_set = sqls_compare_set,
    .del = sqls_del,
    .close = sqls_close,
    .scan = sqls_scan,
};

/* Runs one setup statement (retrying lock conflicts), copying the first
 * column of its first row, if any, into out. */
static int sqls_setup(sqls_store *s, const char *sql, char *out, size_t out_len) {
    int attempt = 0;
    uint64_t start_ns = 0;
    int rc;
    do {
        sqlite3_stmt *q = NULL;
        rc = sqlite3_prepare_v2(s->db, sql, -1, &q, NULL);
        if (rc == SQLITE_OK) {
            rc = sqlite3_step(q);
            if (rc == SQLITE_ROW && out) {
                const unsigned char *t = sqlite3_column_text(q, 0);
                tpi_format(out, out_len, "%s", t ? (const char *)t : "");
            }
            rc = (rc == SQLITE_ROW || rc == SQLITE_DONE) ? SQLITE_OK : rc;
        }
        if (rc != SQLITE_OK)
            sqls_note(s, rc);
        sqlite3_finalize(q);
    } while (rc != SQLITE_OK && sqls_retry(rc, &attempt, &start_ns));
    return rc;
}

static tp_status sqls_configure(sqls_store *s, int is_memory) {
    if (!is_memory) {
        char mode[16] = "";
        if (sqls_setup(s, "PRAGMA journal_mode=WAL", mode, sizeof mode) != SQLITE_OK)
            return sqls_fail_db(s, "open: setting WAL journal mode", NULL);
        /* Without WAL a writer would block readers (and fail more often with
         * SQLITE_BUSY): refuse rather than run a slower, different store. */
        if (strcmp(mode, "wal") != 0)
            return sqls_fail(s, TP_ESTORE,
                             "open: WAL journal mode not available (journal "
                             "mode is '%s'); is the file on a network file system?",
                             mode);
        /* In WAL mode NORMAL cannot corrupt the file; a power cut may lose the
         * last commits, which a job that lost its machines does not need. */
        if (sqls_setup(s, "PRAGMA synchronous=NORMAL", NULL, 0) != SQLITE_OK)
            return sqls_fail_db(s, "open: PRAGMA synchronous", NULL);
    }
    if (sqls_setup(s, sqls_schema, NULL, 0) != SQLITE_OK)
        return sqls_fail_db(s, "open: creating table tp_kv", NULL);
    for (int i = 0; i < SQLS_STMT_COUNT_; i++) {
        int rc = sqlite3_prepare_v3(s->db, sqls_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->stmt[i],
                                    NULL);
        if (rc != SQLITE_OK) {
            sqls_note(s, rc);
            return sqls_fail_db(s, "open: preparing statements", NULL);
        }
    }
    return TP_OK;
}

static tp_status sqls_open_db(sqls_store *s) {
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX;
    int rc = sqlite3_open_v2(s->path, &s->db, flags, NULL);
    if (rc != SQLITE_OK) {
        int err = s->db ? sqlite3_system_errno(s->db) : 0;
        const char *text = s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc);
        tp_status st = sqls_fail(s, TP_ESTORE, "open: %s (sqlite error %d%s%s)", text, rc,
                                 err ? "; " : "", err ? strerror(err) : "");
        sqlite3_close(s->db); /* SQLite allocates a handle even on failure */
        s->db = NULL;
        return st;
    }
    sqlite3_extended_result_codes(s->db, 1);
    sqlite3_busy_handler(s->db, sqls_busy, s);
    tp_status st = sqls_configure(s, strcmp(s->path, ":memory:") == 0);
    /* SQLite opens a write-protected file read-only without saying so. */
    if (st == TP_OK && sqlite3_db_readonly(s->db, "main") == 1)
        st = sqls_fail(s, TP_ESTORE, "open: the file is read-only");
    return st;
}

tp_status tp_sqlite_store_open(const char *path, tp_store **out, char *errmsg, size_t errmsg_len) {
    TPI_ASSERT(out != NULL);
    *out = NULL;
    size_t path_len = path ? strnlen(path, SQLS_PATH_LEN_MAX + 1) : 0;
    if (path_len == 0 || path_len > SQLS_PATH_LEN_MAX) {
        tp_status st =
            tpi_fail(TP_EINVAL, "sqlite store: %s path", path_len ? "too long a" : "empty");
        if (errmsg && errmsg_len)
            tpi_format(errmsg, errmsg_len, "%s", tp_errmsg());
        return st;
    }
    sqls_store *s = calloc(1, sizeof *s + path_len + 1);
    if (!s) {
        tp_status st = tpi_fail(TP_ENOMEM, "sqlite store '%s': out of memory", path);
        if (errmsg && errmsg_len)
            tpi_format(errmsg, errmsg_len, "%s", tp_errmsg());
        return st;
    }
    s->base.ops = &sqls_ops;
    memcpy(s->path, path, path_len + 1);
    tp_status st = sqls_open_db(s);
    if (st != TP_OK) {
        if (errmsg && errmsg_len)
            tpi_format(errmsg, errmsg_len, "%s", s->base.errmsg);
        if (s->db)
            sqls_close(&s->base);
        else
            free(s);
        return st;
    }
    *out = &s->base;
    return TP_OK;
}
