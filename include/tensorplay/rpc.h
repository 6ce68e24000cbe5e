/*
 * tensorplay/rpc.h: the public API of tensorplay-rpc.
 *
 * Call a function on a worker in another process and get the result back,
 * modelled on PyTorch's torch.distributed.rpc. The normative semantics are in
 * spec/ (rule ids such as INIT-1 are cited below); this header is the C face
 * of them.
 *
 * Conventions (spec/api.md):
 * - Every fallible call returns a tp_status; TP_OK is 0. tp_errmsg() gives a
 *   readable message for the last failed call made by this thread (or, on the
 *   simulator, this simulated task): which worker, which function, which limit.
 * - Ownership words: "borrowed" (valid during the call only), "transferred on
 *   success" (the callee owns it if the call returns TP_OK, the caller keeps
 *   it otherwise), "caller owns" (the result belongs to the caller, who frees
 *   it), "lent for the callback only".
 * - Timeouts are in seconds as a double: TP_TIMEOUT_DEFAULT (-1) means the
 *   current default (read when the call is issued), TP_TIMEOUT_INFINITE (0)
 *   means no deadline, any other negative value is rejected (TIMEOUT-1..3).
 * - The API is per worker: in a process it refers to the worker this process
 *   initialised; on the simulator, to the simulated worker whose task calls
 *   it. All calls are thread-safe unless a comment says otherwise.
 */
#ifndef TENSORPLAY_RPC_H
#define TENSORPLAY_RPC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TP_VERSION_MAJOR 0
#define TP_VERSION_MINOR 1
#define TP_VERSION_PATCH 0

/* ------------------------------------------------------------------------ */
/* Status codes: one table generates the enum and tp_strerror (ERR-1).       */

#define TP_STATUS_MAP(X)                                                     \
    X(OK, "success")                                                         \
    X(EINVAL, "invalid argument")                                            \
    X(ENOTINIT, "rpc is not initialized")                                    \
    X(EALREADY, "rpc is already initialized")                                \
    X(ESHUTDOWN, "rpc is shut down")                                         \
    X(ETIMEDOUT, "timed out")                                                \
    X(EUNKNOWNWORKER, "unknown worker")                                      \
    X(EUNKNOWNFUNC, "unknown function")                                      \
    X(EREMOTE, "remote function failed")                                     \
    X(EPEERDOWN, "peer worker is down")                                      \
    X(ENOMEM, "out of memory")                                               \
    X(EMSGSIZE, "message too large")                                         \
    X(EPROTO, "malformed message")                                           \
    X(ESTORE, "rendezvous store error")                                      \
    X(EDUPNAME, "duplicate worker name")                                     \
    X(EBACKEND, "backend error")                                             \
    X(ENOTOWNER, "not the owner of this rref")                               \
    X(ETYPE, "wrong value type")                                             \
    X(ERANGE, "value out of range")                                          \
    X(ELIMIT, "limit exceeded")                                              \
    X(ECANCELED, "canceled")                                                 \
    X(EIO, "input/output error")                                             \
    X(EADDRINUSE, "address already in use")                                  \
    X(ECONNREFUSED, "connection refused")                                    \
    X(ENOENT, "no such key")                                                 \
    X(EAUTH, "authentication failed")

typedef enum tp_status {
#define TP_STATUS_ENUM_(name, text) TP_##name,
    TP_STATUS_MAP(TP_STATUS_ENUM_)
#undef TP_STATUS_ENUM_
    TP_STATUS_COUNT_
} tp_status;

/* A static string describing a status ("timed out"); never NULL. */
const char *tp_strerror(tp_status status);

/* The status name ("TP_ETIMEDOUT"); never NULL. */
const char *tp_status_name(tp_status status);

/*
 * The message of the last call that failed in this thread (or simulated
 * task), with context: "rpc_sync to worker 'w1' (id 1), function 'slow':
 * timed out after 100 ms". Borrowed until the next failing call of this
 * thread; "" when none failed. Successful calls do not clear it.
 */
const char *tp_errmsg(void);

/* ------------------------------------------------------------------------ */
/* Limits (spec/wire.md, WIRE-8). Options may lower them, never raise them. */

#define TP_NAME_LEN_MAX 127          /* worker, function, method and class names */
#define TP_WORLD_SIZE_MAX 65536      /* workers in one job */
#define TP_TENSOR_NDIM_MAX 16        /* dimensions of a tensor */
#define TP_ERRMSG_LEN_MAX 1024       /* bytes of an error message, with its NUL */

/* ------------------------------------------------------------------------ */
/* Values: what arguments and results carry (VALUE-1..9).                    */
/*
 * A tp_value is a tree with a single owner. Constructors return a new value
 * the caller owns (NULL only when memory is exhausted); containers take
 * ownership of the items put in them. Values are not thread-safe: share a
 * value between threads only read-only.
 */
typedef struct tp_value tp_value;
typedef struct tp_rref tp_rref;

typedef enum tp_kind {
    TP_KIND_NIL = 0,
    TP_KIND_BOOL = 1,
    TP_KIND_INT = 2,    /* int64_t */
    TP_KIND_FLOAT = 3,  /* double */
    TP_KIND_STR = 4,    /* UTF-8 bytes, not NUL-terminated on the wire */
    TP_KIND_BYTES = 5,
    TP_KIND_LIST = 6,
    TP_KIND_MAP = 7,    /* string keys, insertion order kept (kwargs) */
    TP_KIND_TENSOR = 8,
    TP_KIND_RREF = 9,
    TP_KIND_WORKER_INFO = 10,
    TP_KIND_OBJECT = 11 /* local only: lives on its owner, reached through an rref */
} tp_kind;

typedef enum tp_dtype {
    TP_DTYPE_FLOAT32 = 0,
    TP_DTYPE_FLOAT64 = 1,
    TP_DTYPE_FLOAT16 = 2,
    TP_DTYPE_BFLOAT16 = 3,
    TP_DTYPE_INT8 = 4,
    TP_DTYPE_INT16 = 5,
    TP_DTYPE_INT32 = 6,
    TP_DTYPE_INT64 = 7,
    TP_DTYPE_UINT8 = 8,
    TP_DTYPE_BOOL = 9,
    TP_DTYPE_UINT16 = 10,
    TP_DTYPE_UINT32 = 11,
    TP_DTYPE_UINT64 = 12,
    TP_DTYPE_COMPLEX64 = 13,  /* two float32: real, then imaginary (C's float _Complex) */
    TP_DTYPE_COMPLEX128 = 14, /* two float64: real, then imaginary (C's double _Complex) */
    TP_DTYPE_COUNT_
} tp_dtype;

/* Size in bytes of one element of the dtype; 0 for an invalid dtype. */
size_t tp_dtype_size(tp_dtype dtype);
/* The alignment one element needs in memory: its size, except for complex
 * dtypes, which align as one component (4 and 8, as C and numpy do); 0 for
 * an invalid dtype (VALUE-5). */
size_t tp_dtype_align(tp_dtype dtype);
/* "float32", ... (numpy's names: "uint16", "complex64"); "invalid" for an
 * invalid dtype. */
const char *tp_dtype_name(tp_dtype dtype);

typedef struct tp_worker_info {
    char name[TP_NAME_LEN_MAX + 1];
    uint32_t id; /* the worker's rank */
} tp_worker_info;

tp_value *tp_value_nil(void);
tp_value *tp_value_bool(int b);
tp_value *tp_value_int(int64_t i);
tp_value *tp_value_float(double d);
tp_value *tp_value_str(const char *s);                 /* s borrowed, copied */
tp_value *tp_value_strn(const char *s, size_t len);    /* s borrowed, copied */
tp_value *tp_value_bytes(const void *data, size_t len); /* data borrowed, copied */
tp_value *tp_value_list(void);                          /* empty list */
/* An empty list that is a tuple (VALUE-11): a list in every way, kept as a
 * tuple through sending, cloning and formatting, for languages that have
 * both (Python). tp_list_is_tuple: 1 for one, 0 for anything else. */
tp_value *tp_value_tuple(void);
int tp_list_is_tuple(const tp_value *list);
/* Bytes marked as a language binding's own serialization of an object
 * (VALUE-12; Python's pickle when allow_pickle is on): bytes in every way,
 * the mark kept through sending and cloning. data borrowed, copied. */
tp_value *tp_value_opaque(const void *data, size_t len);
int tp_bytes_is_opaque(const tp_value *v);
tp_value *tp_value_map(void);                           /* empty map */
tp_value *tp_value_worker_info(const tp_worker_info *info); /* borrowed, copied */

/*
 * A tensor. shape has ndim entries (ndim <= TP_TENSOR_NDIM_MAX, each >= 0).
 * strides (in elements, each >= 0) may be NULL for a contiguous row-major
 * tensor. data points at element [0,...,0] and is copied: the copy spans
 * every element the strides reach. A strided tensor travels packed: the
 * receiver gets it contiguous (VALUE-6). data may be NULL for zeros.
 * Returns NULL on a bad dtype, shape or stride, or on overflow.
 */
tp_value *tp_value_tensor(tp_dtype dtype, int ndim, const int64_t *shape,
                          const int64_t *strides, const void *data);

/* Hands borrowed memory back to its owner (tp_value_tensor_borrow). */
typedef void (*tp_release_fn)(void *ctx);

/*
 * A contiguous row-major tensor over the caller's memory, without a copy
 * (VALUE-10): data (aligned to tp_dtype_align, not NULL) must hold the
 * packed elements and stay valid, and unwritten while a call sends it,
 * until release(ctx) runs. release runs exactly once, when the value and
 * every frame still sending its bytes are gone, on any thread (the
 * transport's I/O thread included), with no library lock held; it must not
 * block or call the library. Returns NULL (release never runs) on a bad
 * dtype, shape or alignment, or on exhaustion.
 */
tp_value *tp_value_tensor_borrow(tp_dtype dtype, int ndim, const int64_t *shape, void *data,
                                 tp_release_fn release, void *ctx);

/*
 * An rref as a value, to pass it into a call (RREF-7). The value holds its
 * own reference; rref stays owned by the caller.
 */
tp_value *tp_value_rref(tp_rref *rref);

/*
 * A local object with a class name, for remote objects reached through an
 * rref and called with tp_method_*. state is transferred on success and
 * released with destroy(state) when the value is freed; destroy may be NULL.
 * An object cannot be sent: encoding one fails with TP_ETYPE (VALUE-8).
 */
tp_value *tp_value_object(const char *class_name, void *state, void (*destroy)(void *state));

/* Frees v and everything it holds; NULL is a no-op. */
void tp_value_free(tp_value *v);
/* A deep copy the caller owns; NULL on exhaustion. Objects cannot be cloned. */
tp_value *tp_value_clone(const tp_value *v);
/* Deep equality (tensors compare shape, dtype and elements). */
int tp_value_equal(const tp_value *a, const tp_value *b);
/* A readable one-line rendering into buf (truncated, always NUL-terminated). */
size_t tp_value_format(const tp_value *v, char *buf, size_t buf_len);

tp_kind tp_value_kind(const tp_value *v);
const char *tp_kind_name(tp_kind kind);

/* Typed reads: TP_ETYPE when v is of another kind. */
tp_status tp_value_get_bool(const tp_value *v, int *out);
tp_status tp_value_get_int(const tp_value *v, int64_t *out);
tp_status tp_value_get_float(const tp_value *v, double *out); /* also reads ints */
/* Strings and bytes: *data borrowed from v; strings are NUL-terminated in memory. */
tp_status tp_value_get_str(const tp_value *v, const char **data, size_t *len);
tp_status tp_value_get_bytes(const tp_value *v, const void **data, size_t *len);
tp_status tp_value_get_worker_info(const tp_value *v, tp_worker_info *out);
/* The rref a value holds, borrowed from v (take your own with tp_rref_clone). */
tp_status tp_value_get_rref(const tp_value *v, tp_rref **out);
/* An object's state, borrowed; class_name may be NULL. */
tp_status tp_value_get_object(const tp_value *v, const char **class_name, void **state);

/*
 * Lists. Append takes ownership of item on success. get is borrowed. Values
 * form a tree (VALUE-1, VALUE-4): an item already inside a list or map, or
 * one that holds list, is TP_EINVAL; nesting past 64 levels is TP_ELIMIT.
 * A refused item stays the caller's. tp_value_free of an item does nothing:
 * its container frees it.
 */
tp_status tp_list_append(tp_value *list, tp_value *item);
size_t tp_list_len(const tp_value *list);          /* 0 for a non-list */
const tp_value *tp_list_get(const tp_value *list, size_t index); /* NULL out of range */

/* Maps (string keys, insertion order). set replaces an equal key; item
 * transferred on success; the same rules as lists. */
tp_status tp_map_set(tp_value *map, const char *key, tp_value *item);
size_t tp_map_len(const tp_value *map);
const tp_value *tp_map_get(const tp_value *map, const char *key); /* NULL if absent */
const char *tp_map_key_at(const tp_value *map, size_t index);
const tp_value *tp_map_value_at(const tp_value *map, size_t index);

/* Tensors: the accessors read a tensor value; they return 0/NULL for others. */
tp_dtype tp_tensor_dtype(const tp_value *t);
int tp_tensor_ndim(const tp_value *t);
const int64_t *tp_tensor_shape(const tp_value *t);   /* ndim entries, borrowed */
const int64_t *tp_tensor_strides(const tp_value *t); /* ndim entries, in elements */
int64_t tp_tensor_numel(const tp_value *t);
int tp_tensor_is_contiguous(const tp_value *t);
/*
 * Element [0,...,0], writable, borrowed. If a frame still being sent shares
 * the tensor's memory (large tensors travel without a copy, WIRE-10), the
 * tensor takes a private copy first, so a write after rpc_async never
 * changes what is sent; that copy can fail: NULL on exhaustion. Do not
 * write through a pointer taken before a call while that call is sending.
 */
void *tp_tensor_data(tp_value *t);
const void *tp_tensor_cdata(const tp_value *t);
/*
 * A second tensor over the same elements, without a copy (VALUE-13), as a
 * numpy view: the elements live while either value does, and a write
 * through one is seen through the other, so write only while no call is
 * sending the other. Caller-owned. NULL for a value that is not a
 * contiguous tensor, or on exhaustion.
 */
tp_value *tp_tensor_view(const tp_value *t);

/* Builds a list value from n items (all transferred, even on failure, but an
 * item already inside another list or map stays there; VALUE-4). */
tp_value *tp_value_list_of(size_t n, ...);

/* ------------------------------------------------------------------------ */
/* Options and backends (OPT-1..6, BACKEND-1..5).                            */

typedef struct tp_options tp_options;

#define TP_DEFAULT_RPC_TIMEOUT_S 60.0
#define TP_DEFAULT_NUM_WORKER_THREADS 16
#define TP_TIMEOUT_DEFAULT (-1.0)
#define TP_TIMEOUT_INFINITE (0.0)

/* Built-in backends, by the name they are registered under. */
typedef enum tp_backend_type {
    TP_BACKEND_TENSORPIPE = 0, /* "TENSORPIPE": the TCP transport (real/) */
    TP_BACKEND_SIM = 1         /* "SIM": the deterministic simulator (sim/) */
} tp_backend_type;

/* "TENSORPIPE" or "SIM"; NULL for an unknown value. */
const char *tp_backend_type_name(tp_backend_type type);

/*
 * New options with the defaults: rpc_timeout 60 s, num_worker_threads 16,
 * init_method NULL (the backend's default), max_message_size 1 GiB + 1 MiB,
 * max_inflight_bytes 256 MiB (OPT-1). Caller owns; free with
 * tp_options_free.
 */
tp_options *tp_options_new(void);
void tp_options_free(tp_options *opts);
tp_options *tp_options_clone(const tp_options *opts);

/* rpc_timeout in seconds: > 0, or 0 for no deadline (OPT-2). */
tp_status tp_options_set_rpc_timeout(tp_options *opts, double seconds);
double tp_options_rpc_timeout(const tp_options *opts);
/* "sqlite:///path", "env://", "tcp://host:port", or backend-specific. */
tp_status tp_options_set_init_method(tp_options *opts, const char *init_method);
const char *tp_options_init_method(const tp_options *opts); /* NULL when unset */
tp_status tp_options_set_num_worker_threads(tp_options *opts, int n);
int tp_options_num_worker_threads(const tp_options *opts);
/* Deadline of init's rendezvous and of each shutdown phase; default = rpc_timeout. */
tp_status tp_options_set_init_timeout(tp_options *opts, double seconds);
double tp_options_init_timeout(const tp_options *opts);
tp_status tp_options_set_shutdown_timeout(tp_options *opts, double seconds);
double tp_options_shutdown_timeout(const tp_options *opts);
/*
 * Rejoin (spec/lifecycle.md REJOIN-1..7): 1 says this process restarts a
 * worker of a running job whose earlier process died. Init then takes the
 * next incarnation of its rank instead of joining the initial rendezvous,
 * tells every live peer, and returns once each of them routes to it; calls
 * and rrefs of the earlier incarnation fail with TP_EPEERDOWN everywhere.
 * Default 0: a second process claiming a running job's rank is refused.
 */
tp_status tp_options_set_rejoin(tp_options *opts, int rejoin);
int tp_options_rejoin(const tp_options *opts);
/* ---- The log (spec/api.md LOG-1..3) ------------------------------------- */

/*
 * What the library says without being asked: refused connections (with the
 * address and the reason), peer deaths, restarts, an init still waiting
 * (at warn, after 10 s and every 10 s, naming the missing ranks). The level comes from TP_LOG (error,
 * warn, info or debug; default warn) unless tp_set_log_level set it.
 */
typedef enum tp_log_level {
    TP_LOG_ERROR = 1,
    TP_LOG_WARN = 2,
    TP_LOG_INFO = 3,
    TP_LOG_DEBUG = 4
} tp_log_level;
/* Receives each message at or above the level (msg borrowed for the call),
 * from any thread, maybe inside the library's I/O loop: it must not block
 * or call the library. */
typedef void (*tp_log_fn)(tp_log_level level, const char *msg, void *user_data);
/* NULL restores the default: "tensorplay-rpc: <level>: <msg>" lines on
 * stderr. Set it before init: a message logged while it changes may reach
 * the old function. */
void tp_set_log_callback(tp_log_fn fn, void *user_data);
tp_status tp_set_log_level(tp_log_level level); /* TP_EINVAL outside the enum */
tp_log_level tp_log_level_now(void);
const char *tp_log_level_name(tp_log_level level); /* "error" .. "debug", "?" */

/*
 * A fresh job secret for the TCP transport's authentication (spec/tcp.md
 * TCP-17): 32 random bytes as 64 hex digits and a NUL, written to hex (len
 * >= 65). Give the same secret to every worker of a job (TP_SECRET in the
 * environment, or the backend option "secret"); tprun does it for you.
 */
tp_status tp_job_secret_new(char *hex, size_t len);
/* Largest message this worker sends or accepts, in bytes (lowers WIRE-8's max). */
tp_status tp_options_set_max_message_size(tp_options *opts, uint64_t bytes);
uint64_t tp_options_max_message_size(const tp_options *opts);
/*
 * Request bytes (as sent, headers included) this worker keeps in flight to
 * one destination, 4096 to 2^40, default 256 MiB (FLOW-1). A call that would
 * pass it waits inside rpc_sync / rpc_async / remote / to_here, within its
 * own timeout, until earlier calls to that worker end; a call alone may be
 * larger. This is the back-pressure on a producer faster than its callee.
 */
tp_status tp_options_set_max_inflight_bytes(tp_options *opts, uint64_t bytes);
uint64_t tp_options_max_inflight_bytes(const tp_options *opts);
/*
 * Request bytes this worker holds from all its callers at once, waiting for
 * its pool (OPT-9, FLOW-6..8): 64 KiB to 2^40, default 4 GiB. Each caller
 * is granted a share as its credit, and a caller that passes its credit has
 * its requests refused with TP_ELIMIT.
 */
tp_status tp_options_set_max_queued_bytes(tp_options *opts, uint64_t bytes);
uint64_t tp_options_max_queued_bytes(const tp_options *opts);
/*
 * Values this worker keeps, as their owner, for one other worker's remote()
 * calls (or its forks' placeholders) that were not deleted yet (OPT-10,
 * RREF-23): 1 to 2^32 - 1, default 2^20. Past it that worker's remote() is
 * refused with TP_ELIMIT naming the limit.
 */
tp_status tp_options_set_max_remote_values(tp_options *opts, uint64_t n);
uint64_t tp_options_max_remote_values(const tp_options *opts);
/*
 * Bytes a worker holds for one destination and could not deliver yet
 * before it stops serving that destination's requests (OPT-11, FAIR-2):
 * 64 KiB to 2^40, default 256 MiB; serving goes on at half of it. Answers
 * to a caller that does not read them wait, bounded by this and its credit.
 */
tp_status tp_options_set_max_unsent_bytes(tp_options *opts, uint64_t bytes);
uint64_t tp_options_max_unsent_bytes(const tp_options *opts);
/* Backend-specific settings as strings; key and value borrowed, copied. The
 * core's limits are keys too: "max_message_size", "max_inflight_bytes",
 * "max_queued_bytes", "max_remote_values" and "max_unsent_bytes" (decimal) set
 * their options. */
tp_status tp_options_set(tp_options *opts, const char *key, const char *value);
const char *tp_options_get(const tp_options *opts, const char *key); /* NULL if unset */

/* The backend SPI lives in tensorplay/rpc_backend.h. */
typedef struct tp_backend tp_backend;

/*
 * Registers a backend under a unique name (BACKEND-1). backend is borrowed
 * for the life of the process (typically a static const table). TP_EALREADY
 * when the name is taken.
 */
tp_status tp_register_backend(const char *name, const tp_backend *backend);
/* The registered backend of that name, or NULL. */
const tp_backend *tp_lookup_backend(const char *name);

/*
 * Options filled with the backend's defaults by its construct handler.
 * *out is caller-owned on success.
 */
tp_status tp_construct_rpc_backend_options(const char *backend, tp_options **out);

/* ------------------------------------------------------------------------ */
/* Lifecycle (INIT-1..9, SHUTDOWN-1..8).                                     */

/*
 * Joins this worker to the job and blocks until every worker joined, then
 * all-gathers names and ids through the store. name must match
 * ^[A-Za-z0-9_:-]+$ and be at most TP_NAME_LEN_MAX bytes; 0 <= rank <
 * world_size. backend is a registered name ("TENSORPIPE", "SIM"); NULL means
 * "TENSORPIPE". opts is borrowed and may be NULL for defaults.
 * Errors: TP_EALREADY (init twice), TP_EINVAL (bad name/rank/world size),
 * TP_EDUPNAME (names the ranks), TP_ETIMEDOUT (names missing ranks),
 * TP_EBACKEND, TP_ESTORE. Blocking; call from the worker's own thread/task.
 */
tp_status tp_init_rpc(const char *name, const char *backend, int rank, int world_size,
                      const tp_options *opts);

/*
 * Tears the worker down. graceful != 0: a barrier of all workers, then user
 * rrefs are released, then every worker's outstanding work drains (nested
 * and follow-up calls included, the rref deletes too), then teardown; each phase has a deadline and a
 * failed phase names the workers that did not answer (the worker is torn
 * down anyway). graceful == 0: local and immediate; in-flight futures fail
 * with TP_ESHUTDOWN. After shutdown, tp_init_rpc may be called again.
 */
tp_status tp_shutdown(int graceful);

/*
 * Interrupts a tp_init_rpc or a graceful tp_shutdown blocked on this
 * process's worker (on the simulator, the calling task's host), from any
 * other thread, for Ctrl-C (spec/lifecycle.md INTERRUPT-1). Within about
 * 20 ms (plus a store operation in progress) the blocked call gives up and
 * returns TP_ECANCELED: init with "init: interrupted while waiting for
 * ranks 2, 3 (of 4 workers)", publishing the interruption as the attempt's
 * outcome so the other workers' init fails too, and the context UNINIT, so
 * a later tp_init_rpc works (the next generation); a graceful shutdown
 * abandons its barrier, drain or leaving and ends as a non-graceful one
 * (teardown), saying which phase it was in. Returns TP_OK when such a call
 * was blocked; TP_ENOTINIT when none was: the interrupt is dropped, and
 * never affects a later call. An interrupt that comes after init committed
 * is too late: init succeeds. Teardown, non-graceful shutdown, the
 * backend's start and calls are not interrupted.
 * Async-signal-safe: it takes no lock, allocates nothing and leaves
 * tp_errmsg() alone (one caveat: in a dlopen'ed library a thread's first use
 * of thread-local storage may allocate, so call any tp_ function on that
 * thread once before a signal handler does).
 */
tp_status tp_interrupt(void);

/* 1 when this process was built with the rpc API (always), as PyTorch's. */
int tp_is_available(void);
/* 1 between a successful tp_init_rpc and tp_shutdown for this worker. */
int tp_is_initialized(void);

/* Worker info by name; name NULL means this worker. TP_EUNKNOWNWORKER names it. */
tp_status tp_get_worker_info(const char *name, tp_worker_info *out);
/* Every worker's info, ordered by id; *out caller-owned (free()), *count set. */
tp_status tp_get_worker_infos(tp_worker_info **out, size_t *count);

/* The default timeout for later calls (TIMEOUT-4); seconds as for calls, not -1. */
tp_status tp_set_rpc_timeout(double seconds);
double tp_get_rpc_timeout(void);

/*
 * Sleeps this worker's task for the given seconds on the backend's clock
 * (virtual time on the simulator). Needs an initialised worker.
 */
tp_status tp_sleep(double seconds);

/* ------------------------------------------------------------------------ */
/* Functions served by this worker (FUNC-1..5).                              */

typedef struct tp_call tp_call;
typedef struct tp_future tp_future;

/*
 * A user function. args is a list and kwargs a map (both borrowed, never
 * NULL). On success set *result to a new value (transferred to the library;
 * leaving it NULL means nil) and return TP_OK. On failure return any non-OK status, after
 * tp_call_set_error() for a message: the caller gets TP_EREMOTE with it.
 * Runs on a worker-pool thread (simulated task); may make nested rpc calls.
 */
typedef tp_status (*tp_fn)(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data);

/*
 * Registers fn under name on this worker; allowed before init. name borrowed
 * and copied; user_data is passed back to fn. TP_EALREADY if taken.
 */
tp_status tp_register_function(const char *name, tp_fn fn, void *user_data);

/*
 * Flags for tp_register_function_ex (FUNC-6).
 * TP_FN_NONBLOCKING: fn never waits. It runs on the worker's I/O thread as
 * soon as its request is read, with no hand-off to the worker pool: the
 * lowest latency a call can have. Inside it every API call that would wait
 * (rpc_sync, future and rref waits, tp_sleep, a full send window) fails at
 * once with TP_EINVAL; rpc_async and tp_future_then are the way to call on.
 * It must not block on anything of its own either (locks held long, I/O):
 * while it runs, this worker reads no other message.
 */
#define TP_FN_NONBLOCKING 0x1u
tp_status tp_register_function_ex(const char *name, tp_fn fn, void *user_data, unsigned flags);

/*
 * Registers a method of a class on this worker (new_method). The method is
 * called with the caller's arguments; tp_call_self() gives the object the
 * rref holds (METHOD-1).
 */
tp_status tp_new_method(const char *class_name, const char *method_name, tp_fn fn,
                        void *user_data);

/* Sets the message for a failing user function; printf-style. */
void tp_call_set_error(tp_call *call, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* The calling worker's info, for the function being served. */
const tp_worker_info *tp_call_caller(const tp_call *call);
/* The function's (or method's) name. */
const char *tp_call_function(const tp_call *call);
/* For a method: the object value the rref holds, borrowed; NULL for a function. */
const tp_value *tp_call_self(const tp_call *call);
/*
 * Answers the call being served with f's outcome, sent when f completes
 * (FUNC-7; PyTorch's @rpc.functions.async_execution): the function calls
 * this once and returns TP_OK with *result left NULL, and its pool thread
 * is free at once. f is borrowed (referenced until then) and of this
 * worker: a tp_future_new the program completes later, or a call's or
 * then's future. A value answers as the function's result (for remote(),
 * it moves into the rref); an error answers as the function's failure
 * (TP_EREMOTE at the caller, with f's message). Do not take f's value out
 * (tp_future_take_value) before the answer went.
 */
tp_status tp_call_answer_later(tp_call *call, tp_future *f);

/* ------------------------------------------------------------------------ */
/* Destinations: by name, rank or worker info (CALL-2).                      */

typedef struct tp_dest {
    int kind;         /* 0 name, 1 rank, 2 info */
    const char *name; /* borrowed */
    int32_t rank;
} tp_dest;

static inline tp_dest tp_to_name(const char *name) {
    tp_dest d = {0, name, -1};
    return d;
}
static inline tp_dest tp_to_rank(int rank) {
    tp_dest d = {1, NULL, (int32_t)rank};
    return d;
}
static inline tp_dest tp_to_info(const tp_worker_info *info) {
    tp_dest d = {2, info ? info->name : NULL, info ? (int32_t)info->id : -1};
    return d;
}

/* ------------------------------------------------------------------------ */
/* Futures (FUTURE-1..8).                                                    */

typedef struct tp_future tp_future;

/*
 * Waits until f completes or timeout_s passes (TP_TIMEOUT_DEFAULT: the
 * current default; TP_TIMEOUT_INFINITE: no deadline for the wait; the
 * future keeps its own call deadline either way).
 * Returns the future's status, or TP_ETIMEDOUT when this wait expired while
 * the future is still pending (the future is unaffected).
 */
tp_status tp_future_wait(tp_future *f, double timeout_s);
/* 1 when completed (value or error). Never blocks. The four queries below
 * take NULL as a future that never completes: 0, TP_EINVAL, NULL, NULL, "". */
int tp_future_done(const tp_future *f);
/* The status a completed future carries (TP_OK or its error); TP_EINVAL while pending. */
tp_status tp_future_status(const tp_future *f);
/* The value of a future completed with TP_OK, borrowed from f; NULL otherwise. */
const tp_value *tp_future_value(const tp_future *f);
/* Moves the value out (caller owns); later calls get NULL. */
tp_value *tp_future_take_value(tp_future *f);
/* The error message of a failed future ("" otherwise); borrowed from f. */
const char *tp_future_error(const tp_future *f);

/*
 * A continuation: when f completes (with a value or an error), cb runs on a
 * worker-pool thread with f lent for the callback only. It completes the
 * chained future: TP_OK with *result (a new value, transferred to the
 * library; NULL means nil), or a non-OK status with a message written into
 * errmsg (errmsg_len bytes, NUL-terminated) (FUTURE-5). *chained is
 * caller-owned.
 */
typedef tp_status (*tp_then_fn)(tp_future *f, tp_value **result, char *errmsg,
                                size_t errmsg_len, void *user_data);
tp_status tp_future_then(tp_future *f, tp_then_fn cb, void *user_data, tp_future **chained);

/*
 * Waits for all futures; returns TP_OK when all succeeded, or the status of
 * the first one to fail as soon as it fails, without waiting for the rest
 * (FUTURE-6). *failed_index (may be NULL) names it.
 */
tp_status tp_future_wait_all(tp_future *const *futures, size_t n, double timeout_s,
                             size_t *failed_index);

/*
 * Gives up on the call behind an rpc_async (or tp_method_call_async /
 * tp_rref_rpc_async) future (spec/calls.md CANCEL-1): a pending f completes
 * at once with TP_ECANCELED ("rpc_async to worker 'w1' (id 1), function 'f':
 * canceled by the caller"), waiters wake and callbacks run; its late answer
 * is dropped, and this worker's graceful-shutdown drain no longer counts it
 * as its own active call. The callee is told (a tp:cancel sent without
 * waiting): a request still queued there never runs, a running function runs
 * to its end but its answer is never sent, and the callee's drain stops
 * counting it, so a graceful shutdown of the job does not wait for it (the
 * callee's teardown still waits for a function blocked outside this
 * library; see CANCEL-1). Never blocks. TP_EALREADY when f completed
 * already (f unchanged); TP_EINVAL for NULL, for futures the program made,
 * and then/collect_all futures. f stays the caller's. Any thread.
 */
tp_status tp_future_cancel(tp_future *f);

/* Drops the caller's reference; the call itself goes on. NULL is a no-op. */
void tp_future_free(tp_future *f);

/*
 * A callback run once f completes (with a value or an error), on a
 * worker-pool thread, with f lent for the call only (FUTURE-10; PyTorch's
 * add_done_callback). Callbacks run in the order they were added; not at
 * all once the worker is being torn down.
 */
typedef void (*tp_done_fn)(tp_future *f, void *user_data);
tp_status tp_future_add_done_callback(tp_future *f, tp_done_fn cb, void *user_data);

/*
 * A future that completes once every one of futures[0..n) has completed,
 * whatever their outcomes: a failure does not cut it short (FUTURE-11;
 * PyTorch's collect_all). It completes with TP_OK and a list of n ints,
 * the status of each future in order (TP_OK = 0); their values and errors
 * stay in them. futures borrowed (each is referenced until then), all of one
 * worker; n may be 0 (done at once, an empty list). *out caller-owned.
 */
tp_status tp_future_collect_all(tp_future *const *futures, size_t n, tp_future **out);

/*
 * Futures the program completes itself (FUTURE-9; PyTorch's
 * torch.futures.Future): pending and caller-owned, bound to the calling
 * thread's worker (TP_ENOTINIT / TP_ESHUTDOWN without one). One still
 * pending when the worker is torn down fails with TP_ESHUTDOWN.
 */
tp_status tp_future_new(tp_future **out);
/*
 * Completes a future made by tp_future_new with value (transferred, also
 * when this fails; NULL means nil): waiters wake, callbacks and answers
 * waiting on it go. Any thread may call it. TP_EINVAL when f is complete
 * already (the first completion stands) or is a call's future.
 */
tp_status tp_future_set_result(tp_future *f, tp_value *value);
/* The same with an error: status not TP_OK; errmsg copied (NULL: the status's text). */
tp_status tp_future_set_error(tp_future *f, tp_status status, const char *errmsg);

/* ------------------------------------------------------------------------ */
/* Calls (CALL-1..9). args (a list) and kwargs (a map) are borrowed and may  */
/* be NULL for none; they are encoded before the call returns.               */

/* Calls fn on dest and waits for the result; *result caller-owned on TP_OK. */
tp_status tp_rpc_sync(tp_dest dest, const char *fn, const tp_value *args,
                      const tp_value *kwargs, double timeout_s, tp_value **result);

/*
 * Starts a call and returns a future (caller-owned) at once. Errors found
 * before sending (bad destination, not initialised, bad timeout) return a
 * status and no future; later errors complete the future.
 */
tp_status tp_rpc_async(tp_dest dest, const char *fn, const tp_value *args,
                       const tp_value *kwargs, double timeout_s, tp_future **out);

/*
 * Runs fn on dest and keeps the result there; returns an rref to it at once
 * (caller-owned, release with tp_rref_release). The timeout bounds the
 * creation on the owner; a failure shows up in to_here.
 */
tp_status tp_remote(tp_dest dest, const char *fn, const tp_value *args, const tp_value *kwargs,
                    double timeout_s, tp_rref **out);

/* ------------------------------------------------------------------------ */
/* RRefs (RREF-1..16).                                                       */

/*
 * Fetches a copy of the value (caller owns). A timeout leaves the rref
 * usable; a later to_here can succeed (RREF-9).
 */
tp_status tp_rref_to_here(tp_rref *rref, double timeout_s, tp_value **out);
/* The value itself, borrowed, on the owner only; TP_ENOTOWNER names both workers. */
tp_status tp_rref_local_value(tp_rref *rref, const tp_value **out);
tp_status tp_rref_owner(const tp_rref *rref, tp_worker_info *out);
/* The owner's name, borrowed from rref ("" for NULL). */
const char *tp_rref_owner_name(const tp_rref *rref);
/* 1 on the owner's own handle; 0 otherwise (and for NULL). */
int tp_rref_is_owner(const tp_rref *rref);
/* 1 once the owner has confirmed this reference (always 1 on the owner; 0 for NULL). */
int tp_rref_confirmed_by_owner(const tp_rref *rref);
/*
 * The rref's ids as messages print them ("<worker>:<local>", RREF-1): the
 * value's id and, on a user, this reference's fork id ({0, 0} on the owner).
 * Local numbers count from 1 per worker incarnation (the incarnation in the
 * bits from 40 up, REJOIN-3). TP_EINVAL for NULL.
 */
typedef struct tp_rref_gid {
    uint32_t worker;
    uint64_t local;
} tp_rref_gid;
tp_status tp_rref_ids(const tp_rref *rref, tp_rref_gid *rref_id, tp_rref_gid *fork_id);
/*
 * An rref this worker owns, holding value (transferred, also on failure;
 * NULL means nil): PyTorch's RRef(value) (RREF-17). It travels in calls like
 * any rref; an object in it is reached from other workers through methods.
 * *out caller-owned.
 */
tp_status tp_rref_from_value(tp_value *value, tp_rref **out);
/* A new reference to the same remote value (caller-owned). */
tp_rref *tp_rref_clone(tp_rref *rref);
/*
 * Drops the caller's reference. When the last reference anywhere is gone
 * the owner frees the value (RREF-3). NULL is a no-op.
 */
void tp_rref_release(tp_rref *rref);

/*
 * This worker's rref and call counters (RREF-16; PyTorch's
 * rpc._get_debug_info), read at one instant. Every one returns to zero once
 * the job released its rrefs and its calls ended.
 */
typedef struct tp_debug_info {
    uint64_t owned_values;     /* values this worker owns (created, or being created) */
    uint64_t owner_forks;      /* references to them held by other workers */
    uint64_t user_rrefs;       /* references held here to values owned elsewhere */
    uint64_t pending_users;    /* of those, not yet confirmed by their owner */
    uint64_t pending_children; /* references sent from here not yet accepted */
    uint64_t pending_protocol; /* rref messages unanswered or waiting to go again */
    uint64_t calls_in_flight;  /* calls from here awaiting an answer, all peers */
} tp_debug_info;
/* Fills *out; TP_ESHUTDOWN outside a running worker, TP_EINVAL for NULL. */
tp_status tp_get_debug_info(tp_debug_info *out);

/*
 * A reference a graceful shutdown could not settle (RREF-18; PyTorch's
 * "Leaking RRef ... with fork Id ..." report). Ids are as messages print
 * them, "<worker>:<n>": the rref's, and the fork's (the one reference).
 */
typedef enum tp_leak_kind {
    TP_LEAK_FORK = 1,  /* on the owner: a user's fork never deleted */
    TP_LEAK_CHILD = 2, /* on a parent: a fork sent to holder never accepted */
    TP_LEAK_DELETE = 3, /* on a user: a delete its owner never acknowledged */
    TP_LEAK_ORPHAN = 4  /* on an owner: a value no reference holds, not freed (fork 0:0) */
} tp_leak_kind;
typedef struct tp_rref_leak {
    tp_leak_kind kind;
    uint32_t rref_worker;
    uint64_t rref_n;
    uint32_t fork_worker;
    uint64_t fork_n;
    uint32_t owner;  /* rank of the worker that owns the value */
    uint32_t holder; /* rank of the worker holding (or meant to hold) the fork */
} tp_rref_leak;
/*
 * The leaks the calling thread's last graceful shutdown found, after its
 * release and drain, sorted by rref then fork; each is also logged at warn.
 * *out is a malloc'd copy the caller frees (NULL when *n is 0). TP_ENOTINIT
 * before any graceful shutdown here.
 */
tp_status tp_shutdown_leaks(tp_rref_leak **out, size_t *n);
/* Calls from here to rank awaiting an answer; TP_EINVAL for a rank outside the job. */
tp_status tp_get_debug_calls_in_flight(int rank, uint64_t *out);

/* ------------------------------------------------------------------------ */
/* Remote methods: method_factory binds a method name; calls run             */
/* method(rref.local_value(), *args) on the rref's owner (METHOD-1..3).     */

typedef struct tp_method tp_method;

/* A method binder for method_name (borrowed, copied); caller owns *out. */
tp_status tp_method_factory(const char *method_name, tp_method **out);
void tp_method_free(tp_method *m);
tp_status tp_method_call_sync(const tp_method *m, tp_rref *rref, const tp_value *args,
                              const tp_value *kwargs, double timeout_s, tp_value **result);
tp_status tp_method_call_async(const tp_method *m, tp_rref *rref, const tp_value *args,
                               const tp_value *kwargs, double timeout_s, tp_future **out);
tp_status tp_method_call_remote(const tp_method *m, tp_rref *rref, const tp_value *args,
                                const tp_value *kwargs, double timeout_s, tp_rref **out);

/*
 * RRef proxies (METHOD-4; PyTorch's rref.rpc_sync().method(*args),
 * rref.rpc_async().method(...), rref.remote().method(...)): the same calls
 * as the tp_method_call_* above with the method named here, resolved on the
 * owner as method_factory's are.
 */
tp_status tp_rref_rpc_sync(tp_rref *rref, const char *method_name, const tp_value *args,
                           const tp_value *kwargs, double timeout_s, tp_value **result);
tp_status tp_rref_rpc_async(tp_rref *rref, const char *method_name, const tp_value *args,
                            const tp_value *kwargs, double timeout_s, tp_future **out);
tp_status tp_rref_remote(tp_rref *rref, const char *method_name, const tp_value *args,
                         const tp_value *kwargs, double timeout_s, tp_rref **out);

#ifdef __cplusplus
}
#endif
#endif /* TENSORPLAY_RPC_H */
