/*
 * conformance.h: the conformance suite's harness, written once against the
 * public API (tensorplay/rpc.h) and run on every backend (STYLE 11).
 *
 * A case is a rank program run on world_size workers at once; a launcher
 * knows how to start them on one backend (simulated hosts, forked
 * processes, threads). tp_conformance_main() runs every case as one cmocka
 * test, so a backend author needs only a launcher and a main():
 *
 *     int main(int argc, char **argv) {
 *         tp_register_backend("MINE", &my_backend);
 *         return tp_conformance_main(argc, argv, &my_launcher) ? 1 : 0;
 *     }
 *
 * Rank programs never use cmocka asserts: those longjmp, and a program may
 * run on a simulator fiber or in a child process. They use CHECK*() below,
 * which record rank, file, line, expression and tp_errmsg() and let the
 * program go on to a clean shutdown; the program ends with
 * `return conf_finish(rank);`, non-zero when any check of that rank failed
 * or its last graceful shutdown found an rref leak (RREF-18).
 * The macros expect a variable `rank` in scope (every program has one).
 */
#ifndef TP_CONFORMANCE_H
#define TP_CONFORMANCE_H

#include <stddef.h>
#include <stdint.h>

#include "tensorplay/rpc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most workers one case may use (the per-rank failure records). */
#define TP_CONFORMANCE_RANKS_MAX 16

/* One rank's program: returns 0 for success. */
typedef int (*tp_conformance_program)(int rank, int world_size);

typedef struct tp_conformance_case {
    const char *name; /* unique; the cmocka test's name */
    int world_size;   /* workers the launcher starts, 1..TP_CONFORMANCE_RANKS_MAX */
    tp_conformance_program program;
    const char *spec_rules; /* the spec rule ids the case checks, "CALL-1 CALL-2" */
} tp_conformance_case;

/*
 * How to run rank programs on one backend. Every member but user is
 * required. The launcher owns what run() starts and ends it all before
 * returning.
 */
typedef struct tp_conformance_launcher {
    /* The name programs pass to tp_init_rpc ("SIM", "TENSORPIPE"). */
    const char *backend;
    /*
     * Runs program(rank, world_size) once on each of world_size fresh
     * workers (a fresh world: no state from an earlier case) and waits
     * for all. Returns 0 when every rank returned 0, or a rank that called
     * crash_self died as asked; otherwise non-zero with a reason in why
     * (NUL-terminated, why_len bytes). A launcher whose ranks run in other
     * processes also copies each failed rank's tp_conformance_rank_report()
     * into why (the harness reads in-process records itself).
     */
    int (*run)(const struct tp_conformance_launcher *l, int world_size,
               tp_conformance_program program, char *why, size_t why_len);
    /* Fresh options for tp_init_rpc (init_method etc.); caller owns (tp_options_free). */
    tp_options *(*options)(const struct tp_conformance_launcher *l);
    /* The backend's monotonic clock in ns, to check that something was prompt. */
    uint64_t (*now_ns)(void);
    /*
     * The calling worker dies abruptly now, as a killed process would (sim:
     * tp_sim_crash_self; processes: raise(SIGKILL)). It may return (the
     * simulator's does), after which the program frees its own memory and
     * returns 0 without calling the API again.
     */
    void (*crash_self)(void);
    void *user; /* the launcher's own */
} tp_conformance_launcher;

/*
 * Runs every case whose name contains one of the filter arguments (all
 * cases without arguments; "--list" prints the names) against l as one
 * cmocka group named "conformance_<backend>": one cmocka test per case.
 * Returns the number of failed cases (0 = all passed). l is borrowed for
 * the call; the backend must be registered already.
 */
int tp_conformance_main(int argc, char **argv, const tp_conformance_launcher *l);

/*
 * The failures rank recorded during the current case ("" when none): for
 * launchers whose ranks run in another process, to send back to the parent
 * (e.g. write it to a pipe before exit). Borrowed.
 */
const char *tp_conformance_rank_report(int rank);

/* Every case, in suite order; *count set. */
const tp_conformance_case *tp_conformance_cases(size_t *count);

/* ------------------------------------------------------------------------ */
/* For case authors.                                                        */

/* The launcher the suite is running with (set by tp_conformance_main). */
extern const tp_conformance_launcher *conf_launcher;

/* Records a failure of rank (and tp_errmsg() at that moment); returns 0. */
int conf_fail(int rank, const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
int conf_check(int ok, int rank, const char *file, int line, const char *expr);
int conf_check_status(tp_status got, tp_status want, int rank, const char *file, int line,
                      const char *expr);
int conf_check_int(int64_t a, int64_t b, int rank, const char *file, int line, const char *ea,
                   const char *eb);
int conf_check_contains(const char *hay, const char *needle, int rank, const char *file, int line,
                        const char *expr);
/* The number of failures rank recorded in this case, counting one more when
 * the calling thread's last graceful shutdown found rref leaks (RREF-18). */
int conf_finish(int rank);

/* Each returns 1 when the check passed, 0 (and records) when it failed. */
#define CHECK(cond) conf_check((cond) != 0, rank, __FILE__, __LINE__, #cond)
#define CHECK_OK(expr) conf_check_status((expr), TP_OK, rank, __FILE__, __LINE__, #expr)
#define CHECK_STATUS(expr, want) conf_check_status((expr), (want), rank, __FILE__, __LINE__, #expr)
#define CHECK_INT(a, b) conf_check_int((int64_t)(a), (int64_t)(b), rank, __FILE__, __LINE__, #a, #b)
/* hay contains needle (NULL hay fails). */
#define CHECK_CONTAINS(hay, needle)                                                                \
    conf_check_contains((hay), (needle), rank, __FILE__, __LINE__, #hay)

/* "w<rank>": the worker names cases use. Static storage. */
const char *conf_name(int rank);
/* conf_register_all() then tp_init_rpc(conf_name(rank), ...) with the launcher's options. */
tp_status conf_init(int rank, int world_size);
/* The same with options adjusted by the case (opts borrowed). */
tp_status conf_init_opts(int rank, int world_size, const tp_options *opts);
/* Fresh launcher options (caller owns). */
tp_options *conf_options(void);
/* The backend clock, in ns and as seconds since t0_ns. */
uint64_t conf_now_ns(void);
double conf_since_s(uint64_t t0_ns);
/* The calling worker dies now (launcher's crash_self). */
void conf_crash_self(void);

/* Initialises with conf_init() or ends the program (a failed init fails the case). */
#define CONF_INIT_OR_RETURN(rank, world_size)                                                      \
    do {                                                                                           \
        if (!CHECK_OK(conf_init((rank), (world_size))))                                            \
            return conf_finish(rank);                                                              \
    } while (0)

/* rpc_sync with the default timeout; args transferred (freed here, may be NULL). */
tp_status conf_sync(tp_dest dest, const char *fn, tp_value *args, tp_value **result);
/* rpc_async with the default timeout; args transferred (freed here, may be NULL). */
tp_status conf_async(tp_dest dest, const char *fn, tp_value *args, tp_future **out);

/* Builds an argument list of n ints (caller owns); CONF_INTS(1, 2) for literals. */
tp_value *conf_ints(size_t n, const int64_t *v);
#define CONF_INTS(...)                                                                             \
    conf_ints(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), (int64_t[]){__VA_ARGS__})
/*
 * rpc_sync of fn on dest with args (transferred: freed here), expecting an
 * int result; records a failure (as rank) and returns fallback otherwise.
 */
int64_t conf_sync_int(int rank, tp_dest dest, const char *fn, tp_value *args, int64_t fallback);
/* Reads an int value; records a failure and returns fallback if it is not one. */
int64_t conf_int_of(int rank, const tp_value *v, int64_t fallback);
/* The str value's bytes, or "" (recorded as a failure) if it is not a str. */
const char *conf_str_of(int rank, const tp_value *v);
/*
 * Polls fn (no args) on dest every 10 ms of backend time until it returns
 * want or max_s passes; returns the last value read.
 */
int64_t conf_poll_int(int rank, tp_dest dest, const char *fn, int64_t want, double max_s);

/* ------------------------------------------------------------------------ */
/* The functions every case registers (conf_functions.c).                   */

/* Registers every suite function and Counter method on this worker; TP_OK
 * also when they already are. Call before init. */
tp_status conf_register_all(void);
/* Forgets every per-worker counter (between cases; the launcher's world is fresh). */
void conf_functions_reset(void);
/* This process's view of a worker's counters (valid in that worker's process). */
int64_t conf_hops(int rank);         /* fire-and-forget hops served by rank */
int64_t conf_served(int rank);       /* sleep_ms calls completed by rank */
int64_t conf_started(int rank);      /* sleep_ms calls started by rank */
int64_t conf_live_objects(int rank); /* Counter objects alive on rank */
/* The last send_padded this process ran: its rpc_sync's status and message. */
tp_status conf_send_padded_status(char *msg, size_t msg_len);
/* A new Counter object (what make_counter returns) counted on owner's live_objects. */
tp_value *conf_counter_new(int owner, int64_t start);
/* conf_functions_async.c: functions that answer later (FUNC-7) and the
 * parameter server; registered and reset by the two calls above. */
tp_status conf_register_async(void);
void conf_async_reset(void);
/* The parameter server's shape: PS_DIM weights, starting at 100 * (i + 1). */
#define CONF_PS_DIM 4

/* The case tables (cases_*.c). */
extern const tp_conformance_case conf_cases_calls[];
extern const size_t conf_cases_calls_count;
extern const tp_conformance_case conf_cases_futures[];
extern const size_t conf_cases_futures_count;
extern const tp_conformance_case conf_cases_async[];
extern const size_t conf_cases_async_count;
extern const tp_conformance_case conf_cases_timeouts[];
extern const size_t conf_cases_timeouts_count;
extern const tp_conformance_case conf_cases_rref[];
extern const size_t conf_cases_rref_count;
extern const tp_conformance_case conf_cases_lifecycle[];
extern const size_t conf_cases_lifecycle_count;
extern const tp_conformance_case conf_cases_shutdown[];
extern const size_t conf_cases_shutdown_count;
extern const tp_conformance_case conf_cases_errors[];
extern const size_t conf_cases_errors_count;
extern const tp_conformance_case conf_cases_faults[];
extern const size_t conf_cases_faults_count;
extern const tp_conformance_case conf_cases_flow[];
extern const size_t conf_cases_flow_count;

#ifdef __cplusplus
}
#endif
#endif /* TP_CONFORMANCE_H */
