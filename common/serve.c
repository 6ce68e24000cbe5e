/*
 * serve.c: the callee side (spec/api.md FUNC-*, METHOD-*; calls.md CALL-5..8).
 *
 * Requests that run user code (REQUEST, REMOTE) become jobs on the
 * executor; they are decoded there too, so a large argument does not hold
 * up the I/O context. RRef protocol messages are small and are handled in
 * the I/O context. Every request is answered, errors included, so a caller
 * never waits for its deadline because of something the callee knew.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "core.h"
#include "log.h"
#include "registry.h"

typedef struct tpi_later tpi_later;
typedef struct tpi_job tpi_job;

/*
 * CANCEL-1: a REQUEST counted in active_served, findable by (caller, id) in
 * core->served until its job or answer-later record ends. Its state moves
 * once, from LIVE: to CANCELED (its caller gave it up: it leaves S at once,
 * its answer is never sent) or to ANSWERING (its answer is going out, so a
 * cancel that comes now finds it answered). An atomic, so the pool thread
 * claims the answer without a second lock section per served call.
 */
enum { TPI_SERVED_LIVE = 0, TPI_SERVED_CANCELED = 1, TPI_SERVED_ANSWERING = 2 };
typedef struct tpi_served {
    atomic_int state;
    uint32_t src;
    uint64_t id;
    tpi_job *job; /* the queued or running job, for its credit (FLOW-8); NULL: answered later */
    int listed;   /* lock: in core->served */
    int answer_dequeued; /* lock: canceled while queued: TP_ECANCELED goes when it leaves */
} tpi_served;

struct tp_call {
    tp_worker_info caller;
    const char *fn;
    const tp_value *self; /* the object, for methods */
    tp_core *core;
    tp_future *later;     /* tp_call_answer_later: the answer's future (counted) */
    char err[TP_ERRMSG_LEN_MAX]; /* a string; invoke() sets every field */
};

struct tpi_job {
    tp_work work; /* first */
    tp_core *core;
    uint32_t src;
    tp_frame *frame;  /* REQUEST: decoded on the pool */
    tpi_msg *msg;     /* REMOTE: decoded in the I/O context */
    tpi_owner *owner; /* REMOTE: the record being built */
    uint64_t held;    /* bytes counted against src's credit until it runs (FLOW-8) */
    uint32_t held_epoch;
    tpi_rref_ctx rc;  /* REMOTE, or a REQUEST handed over decoded: unconfirmed rrefs (RREF-13) */
    int decoded;      /* msg is a REQUEST decoded in the I/O context (serve_request) */
    int undecoded;    /* counted in src's tpi_peer undecoded until it runs (RREF-19) */
    tpi_served sv;    /* a REQUEST: cancelable by its caller (CANCEL-1) */
    tpi_job *next; /* on its source's run queue (FAIR-1), or its owner record's deferred
                      list until that is settled (METHOD-3) */
};

/* FUNC-6: the non-blocking function this thread is running, or NULL. Such a
 * function runs in the I/O context, which never switches tasks while it
 * runs (it cannot park), so a thread-local names it for the simulator's
 * scheduler thread as well as for a TCP loop thread. */
static _Thread_local const char *nonblocking_fn;

tp_status tpi_check_may_wait(const char *what) {
    if (!nonblocking_fn)
        return TP_OK;
    return tpi_fail(TP_EINVAL,
                    "%s: non-blocking function '%s' runs on the I/O thread and cannot wait "
                    "(FUNC-6): use rpc_async and tp_future_then",
                    what, nonblocking_fn);
}

/* ---- Served requests a caller may cancel (CANCEL-1) --------------------------------- */

/* Lists a REQUEST as cancelable (lock held). Without memory it is not
 * listed: a cancel then finds nothing, and the request ends as a timed-out
 * one would (it runs, its answer is dropped by the caller). */
static void served_list(tp_core *c, tpi_served *sv, uint32_t src, uint64_t id, tpi_job *job) {
    atomic_init(&sv->state, TPI_SERVED_LIVE);
    sv->src = src;
    sv->id = id;
    sv->job = job;
    sv->listed = tpi_idmap_put(&c->served, (tpi_gid){src, id}, sv) == TP_OK;
}

static void served_unlist(tp_core *c, tpi_served *sv) {
    if (!sv->listed)
        return;
    void *was = tpi_idmap_del(&c->served, (tpi_gid){sv->src, sv->id});
    TPI_ASSERT(was == sv);
    (void)was;
    sv->listed = 0;
}

static int served_canceled(tpi_served *sv) {
    return sv && atomic_load(&sv->state) == TPI_SERVED_CANCELED;
}

/* 1 when the request's answer may go out (then no cancel takes it any more);
 * 0 when its caller canceled it: the answer is not sent. */
static int served_claim(tpi_served *sv) {
    int expected = TPI_SERVED_LIVE;
    return !sv || atomic_compare_exchange_strong(&sv->state, &expected, TPI_SERVED_ANSWERING) ||
           expected == TPI_SERVED_ANSWERING;
}

/* The request ends here (lock held): it leaves S unless its cancel took it
 * out already, and the table. */
static void served_end(tp_core *c, tpi_served *sv) {
    if (atomic_load(&sv->state) != TPI_SERVED_CANCELED) {
        TPI_ASSERT(c->active_served > 0);
        c->active_served--;
    }
    served_unlist(c, sv);
}

static void flow_release(tp_core *c, tpi_job *j);

/*
 * tp:cancel from src (I/O context, lock not held): its caller gave up its
 * request args[0]. A request still listed and not answering is canceled:
 * out of S at once, and the caller gets a short TP_ECANCELED answer, which
 * pays the window debt it kept for the request (FLOW-7). A running function
 * runs to its end and its own answer is never sent; the answer goes now. A
 * request still queued keeps its bytes counted (FLOW-8) and is answered
 * when it leaves the queue (job_run), never to run: answering at once
 * would reopen the caller's window while the frame still waits here, so a
 * caller that cancels what it sends could queue without bound. Anything
 * else (answered already, not arrived yet on a reordering transport, lost
 * with a connection) is left alone.
 */
static tp_status cancel_serve(tp_core *c, uint32_t src, const tp_value *args, char *err,
                              size_t err_len) {
    int64_t raw = 0;
    if (tp_list_len(args) != 1 || tp_value_get_int(tp_list_get(args, 0), &raw) != TP_OK ||
        raw == 0) {
        char who[TP_NAME_LEN_MAX + 32];
        tpi_format(err, err_len, "%s from %s is malformed", TPI_CANCEL_FN,
                   tpi_worker_desc(c, src, who, sizeof who));
        return TP_EPROTO;
    }
    uint64_t id = (uint64_t)raw; /* the caller's 64 bits (REJOIN-3) */
    int canceled = 0;
    tpi_lock(c);
    tpi_served *sv = tpi_idmap_get(&c->served, (tpi_gid){src, id});
    int expected = TPI_SERVED_LIVE;
    if (sv && atomic_compare_exchange_strong(&sv->state, &expected, TPI_SERVED_CANCELED)) {
        TPI_ASSERT(c->active_served > 0);
        c->active_served--;
        tpi_probe(c, TP_PROBE_SERVE_CANCEL, id, src, TP_ECANCELED, NULL);
        if (sv->job && sv->job->held > 0)
            sv->answer_dequeued = 1; /* its bytes still wait here */
        else
            canceled = 1;
    }
    tpi_unlock(c);
    if (canceled)
        tpi_reply(c, src, id, TP_ECANCELED, NULL, "canceled by the caller");
    return TP_OK;
}

void tp_call_set_error(tp_call *call, const char *fmt, ...) {
    TPI_ASSERT(call && fmt);
    va_list ap;
    va_start(ap, fmt);
    tpi_vformat(call->err, sizeof call->err, fmt, ap);
    va_end(ap);
}

const tp_worker_info *tp_call_caller(const tp_call *call) {
    return &call->caller;
}

const char *tp_call_function(const tp_call *call) {
    return call->fn;
}

const tp_value *tp_call_self(const tp_call *call) {
    return call->self;
}

tp_status tp_call_answer_later(tp_call *call, tp_future *f) {
    if (!call || !f)
        return tpi_fail(TP_EINVAL, "answer_later: %s is NULL", call ? "future" : "call");
    if (call->later)
        return tpi_fail(TP_EINVAL, "answer_later: '%s' already answers later; a call has one "
                                   "answer",
                        call->fn);
    if (f->core != call->core)
        return tpi_fail(TP_EINVAL, "answer_later: the future belongs to another worker than the "
                                   "one serving '%s'",
                        call->fn);
    call->later = tpi_future_ref(f);
    return TP_OK;
}

/* Replies with a function's result; fn names it when the result cannot travel. */
static void reply_result(tp_core *c, uint32_t dst, uint64_t id, tp_status st,
                         const tp_value *value, const char *errmsg, const char *fn) {
    tpi_msg m;
    char err[TP_ERRMSG_LEN_MAX];
    tpi_msg_reset(&m);
    m.type = TPI_MSG_RESPONSE;
    m.id = id;
    m.status = (uint32_t)st;
    if (st == TP_OK)
        m.value = (tp_value *)value; /* borrowed: encoding only reads */
    else
        tpi_copy_text(m.text, sizeof m.text, errmsg && *errmsg ? errmsg : tp_strerror(st));
    tp_status sst = tpi_send_msg(c, dst, &m, err, sizeof err);
    if (sst == TP_EMSGSIZE || sst == TP_ETYPE || sst == TP_ENOMEM) {
        /* The result itself cannot travel: say so instead (CALL-7). */
        tpi_msg_reset(&m);
        m.type = TPI_MSG_RESPONSE;
        m.id = id;
        m.status = (uint32_t)sst;
        char who[TP_NAME_LEN_MAX + 32];
        tpi_worker_desc(c, c->rank, who, sizeof who);
        if (st == TP_OK || fn)
            tpi_format(m.text, sizeof m.text, "the result of '%s' cannot be sent back from %s: %s",
                       fn ? fn : "to_here", who, err);
        else /* an error the callee answered (tpi_reply): the caller still learns it */
            tpi_format(m.text, sizeof m.text, "%s could not send its answer (%s): %s", who, err,
                       errmsg && *errmsg ? errmsg : tp_strerror(st));
        tpi_send_msg(c, dst, &m, err, sizeof err);
    }
    /* Other failures mean the caller is gone; its side fails the call. */
}

void tpi_reply(tp_core *c, uint32_t dst, uint64_t id, tp_status st, const tp_value *value,
               const char *errmsg) {
    reply_result(c, dst, id, st, value, errmsg, NULL);
}

/* ---- Answers sent later (FUNC-7) ------------------------------------------------ */

/*
 * A served call whose function answered with tp_call_answer_later: no pool
 * thread waits for it. A hook on the future queues the reply (or, for a
 * remote(), the owner's value) as a short work item when it completes. It
 * counts in active_served from start to reply, so a graceful shutdown's
 * drain waits for it like for any call being served.
 */
struct tpi_later {
    tp_work work; /* first: the executor gives back this pointer */
    tpi_hook hook;
    tp_core *core; /* counted */
    uint32_t src;
    uint64_t id;
    tpi_owner *owner; /* REMOTE: the record the value goes into */
    tp_future *f;     /* counted */
    const char *kind; /* "function" or "method": static */
    tpi_served sv;    /* a REQUEST's: its listing moves here from the job (CANCEL-1) */
    char fn[2 * TP_NAME_LEN_MAX + 2];
};

static tpi_later *later_new(tp_core *c, uint32_t src, const tpi_msg *m, const char *kind,
                            const char *fn, tp_future *f) {
    tpi_later *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->core = c;
    l->src = src;
    l->id = m->id;
    l->f = f; /* the call's reference moves here */
    l->kind = kind;
    tpi_copy_text(l->fn, sizeof l->fn, fn);
    return l;
}

/* Settles a REMOTE's owner record (lock held) unless its creator abandoned
 * it (RREF-14), whose error then stands; value taken. */
static void remote_settle(tp_core *c, tpi_owner *o, tp_status *st, tp_value *value, char *err,
                          size_t err_len) {
    o->running = 0;
    if (o->ready) {
        tpi_defer_free(c, value);
        *st = o->status;
        tpi_format(err, err_len, "%s", o->errmsg ? o->errmsg : tp_strerror(*st));
    } else {
        tpi_owner_set(c, o, *st, value, err); /* takes value */
    }
    tpi_owner_maybe_free(c, o);
}

static void later_free(tp_core *c, tpi_later *l) {
    tp_future_free(l->f);
    free(l);
    tpi_core_unref(c);
}

static void later_run(tp_work *w) {
    tpi_later *l = (tpi_later *)w;
    tp_core *c = l->core;
    tp_future *f = l->f;
    char err[TP_ERRMSG_LEN_MAX];
    err[0] = '\0'; /* a string: zeroing all 1 KB, three times a request, was 1% of a call */
    char who[TP_NAME_LEN_MAX + 32];
    tp_status st = f->status; /* done: immutable now */
    if (st != TP_OK) {
        tpi_format(err, sizeof err, "%s '%s' on %s failed: %s", l->kind, l->fn,
                   tpi_worker_desc(c, c->rank, who, sizeof who),
                   f->errmsg ? f->errmsg : tp_strerror(st));
        st = TP_EREMOTE;
    }
    if (l->owner) {
        tpi_lock(c);
        tp_value *value = NULL;
        if (st == TP_OK) { /* the value moves into the rref (FUNC-7) */
            value = f->value;
            f->value = NULL;
        }
        remote_settle(c, l->owner, &st, value, err, sizeof err);
        tpi_unlock(c);
        tpi_reply(c, l->src, l->id, st, NULL, err);
    } else if (served_claim(&l->sv)) { /* CANCEL-1: none for a canceled call */
        reply_result(c, l->src, l->id, st, f->value, err, l->fn);
    }
    tpi_lock(c);
    served_end(c, &l->sv);
    tpi_unlock(c);
    later_free(c, l);
}

/* The answer's future completed (lock held): queue the reply. */
static void later_ready(tp_core *c, tp_future *f, tpi_hook *h) {
    tpi_later *l = (tpi_later *)((char *)h - offsetof(tpi_later, hook));
    TPI_ASSERT(l->f == f);
    (void)f;
    l->work.run = later_run;
    if (c->ops->execute(c->agent, &l->work) == TP_OK)
        return;
    /* Torn down: no reply can go; the caller's side fails the call. */
    served_end(c, &l->sv);
    if (l->owner) {
        tp_status st = TP_ESHUTDOWN;
        char err[64] = "the callee is shutting down";
        remote_settle(c, l->owner, &st, NULL, err, sizeof err);
    }
    later_free(c, l);
}

/* Hands a served call's answer to its future (owner: a REMOTE's record; sv:
 * a REQUEST's listing, which moves to the record, or NULL). */
static void later_start(tp_core *c, tpi_later *l, tpi_owner *owner, tpi_served *sv) {
    l->owner = owner;
    l->hook.fn = later_ready;
    tpi_core_ref(c);
    tpi_lock(c);
    if (served_canceled(sv)) { /* CANCEL-1: nobody wants the answer */
        tpi_unlock(c);
        later_free(c, l);
        return;
    }
    c->active_served++;
    if (sv && sv->listed) { /* a cancel from now on finds the record, not the ending job */
        served_unlist(c, sv);
        served_list(c, &l->sv, sv->src, sv->id, NULL);
    }
    tpi_future_hook(c, l->f, &l->hook); /* at once when it is done already */
    tpi_unlock(c);
}

/* A function already found in the registry (FUNC-6 routing), or none. */
typedef struct resolved_fn {
    tp_fn fn; /* NULL: look it up */
    void *ud;
} resolved_fn;

/* Runs a user function or method (found is NULL or a function resolved by
 * name already); fills *result or an error message. */
static tp_status invoke(tp_core *c, uint32_t src, const tpi_msg *m, const resolved_fn *found,
                        tp_value **result, tpi_later **later, char *err, size_t err_len) {
    /* Formatted only on the error paths below: no printf per served call. */
    char self_desc[TP_NAME_LEN_MAX + 32];
#define SELF_DESC() tpi_worker_desc(c, c->rank, self_desc, sizeof self_desc)
    const tp_value *args = m->args;
    const tp_value *object = NULL;
    const char *class_name = NULL;
    if (m->flags & TPI_FLAG_METHOD) {
        tp_rref *target = NULL;
        if (tp_list_len(args) != 2 || tp_value_get_rref(tp_list_get(args, 0), &target) != TP_OK ||
            tp_value_kind(tp_list_get(args, 1)) != TP_KIND_LIST) {
            tpi_format(err, err_len, "method call '%s' to %s is malformed", m->text, SELF_DESC());
            return TP_EPROTO;
        }
        if (!target->is_owner) {
            tpi_format(err, err_len, "method '%s': %s does not own the rref (owner: '%s')",
                       m->text, SELF_DESC(), target->owner_name);
            return TP_ENOTOWNER;
        }
        tpi_lock(c);
        tpi_owner *o = tpi_idmap_get(&c->owners, target->id);
        /* Bounded by the caller's deadline: a pool slot never waits for a
         * value whose creation was lost (METHOD-3). */
        uint64_t deadline = m->timeout_ms ? tpi_deadline_after(c, m->timeout_ms / 1000.0)
                                          : TPI_NO_DEADLINE;
        tp_status st = o ? tpi_owner_wait(c, o, deadline) : TP_ENOTOWNER;
        tpi_unlock(c);
        if (st != TP_OK) {
            tpi_format(err, err_len, "method '%s' on %s: %s", m->text, SELF_DESC(),
                       tp_strerror(st));
            return st;
        }
        if (o->status != TP_OK) {
            tpi_format(err, err_len, "method '%s': the rref's value failed to build: %s",
                       m->text, o->errmsg ? o->errmsg : tp_strerror(o->status));
            return o->status;
        }
        object = o->value;
        if (tp_value_get_object(object, &class_name, NULL) != TP_OK) {
            tpi_format(err, err_len, "method '%s' on %s: the rref holds a %s, not an object",
                       m->text, SELF_DESC(), tp_kind_name(tp_value_kind(object)));
            return TP_ETYPE;
        }
        args = tp_list_get(args, 1);
    }
    if (!class_name && strcmp(m->text, TPI_PING_FN) == 0)
        return TP_OK; /* init's warm-up (INIT-8): nil */
    if (!class_name && strcmp(m->text, TPI_FORKS_FN) == 0) { /* RREF-19 */
        tpi_probe(c, TP_PROBE_SERVE_BEGIN, m->id, src, TP_OK, TPI_FORKS_FN);
        tp_status st = tpi_forks_serve(c, src, args, result, err, err_len);
        tpi_probe(c, TP_PROBE_SERVE_END, m->id, src, st, TPI_FORKS_FN);
        return st;
    }
    if (!class_name && strcmp(m->text, TPI_CANCEL_FN) == 0) { /* CANCEL-1 */
        tpi_probe(c, TP_PROBE_SERVE_BEGIN, m->id, src, TP_OK, TPI_CANCEL_FN);
        tp_status st = cancel_serve(c, src, args, err, err_len);
        tpi_probe(c, TP_PROBE_SERVE_END, m->id, src, st, TPI_CANCEL_FN);
        return st;
    }
    if (!class_name && strcmp(m->text, TPI_JOIN_FN) == 0) { /* REJOIN-4 */
        tpi_probe(c, TP_PROBE_SERVE_BEGIN, m->id, src, TP_OK, TPI_JOIN_FN);
        tp_status st = tpi_rejoin_serve(c, src, args, err, err_len);
        tpi_probe(c, TP_PROBE_SERVE_END, m->id, src, st, TPI_JOIN_FN);
        return st;
    }
    tp_fn fn = found && !class_name ? found->fn : NULL;
    void *ud = found && !class_name ? found->ud : NULL;
    if (!fn && !tpi_registry_find(c->ctx, class_name, m->text, &fn, &ud, NULL)) {
        if (class_name)
            tpi_format(err, err_len, "%s: class '%s' has no method '%s'", SELF_DESC(), class_name,
                       m->text);
        else
            tpi_format(err, err_len, "%s has no function '%s'", SELF_DESC(), m->text);
        return TP_EUNKNOWNFUNC;
    }
    char full[2 * TP_NAME_LEN_MAX + 2];
    if (class_name) /* METHOD-1: a method is known as "Class.method" */
        tpi_format(full, sizeof full, "%s.%s", class_name, m->text);
    /* Field by field: zeroing err's 1 KB here was 1% of a simulated call.
     * A field added to tp_call is set here too. */
    tp_call call;
    call.caller = c->infos[src];
    call.fn = class_name ? full : m->text;
    call.self = object;
    call.core = c;
    call.later = NULL;
    call.err[0] = '\0';
    tpi_probe(c, TP_PROBE_SERVE_BEGIN, m->id, src, TP_OK, call.fn);
    tp_status st = fn(&call, args, m->kwargs, result, ud);
    tpi_probe(c, TP_PROBE_SERVE_END, m->id, src, st, call.fn);
    if (st == TP_OK && call.later && *result) {
        st = TP_EINVAL;
        tpi_format(call.err, sizeof call.err, "it both returned a value and answers later "
                                              "(FUNC-7); a call has one answer");
    }
    if (st == TP_OK && call.later) {
        *later = later_new(c, src, m, class_name ? "method" : "function", call.fn, call.later);
        if (!*later) {
            st = TP_ENOMEM;
            tpi_format(call.err, sizeof call.err, "out of memory to answer later");
        } else {
            call.later = NULL; /* its reference moved into *later */
        }
    }
    if (call.later)
        tp_future_free(call.later); /* the error below answers instead */
    if (st != TP_OK) {
        tp_value_free(*result);
        *result = NULL;
        tpi_format(err, err_len, "%s '%s' on %s failed: %s", class_name ? "method" : "function",
                   call.fn, SELF_DESC(), call.err[0] ? call.err : tp_strerror(st));
        return TP_EREMOTE;
    }
    return TP_OK;
#undef SELF_DESC
}

/* RREF-13: a function runs only once the owners confirmed every rref among
 * its arguments; bounded by the call's own deadline. */
static tp_status await_rrefs(tp_core *c, const tpi_msg *m, tpi_rref_ctx *rc, char *err,
                             size_t err_len) {
    if (rc->npending == 0 && !rc->lost)
        return TP_OK;
    char what[TP_NAME_LEN_MAX + 64], who[TP_NAME_LEN_MAX + 32];
    tpi_format(what, sizeof what, "%s '%s' on %s",
               (m->flags & TPI_FLAG_METHOD) ? "method" : "function", m->text,
               tpi_worker_desc(c, c->rank, who, sizeof who));
    uint64_t deadline =
        m->timeout_ms ? tpi_deadline_after(c, m->timeout_ms / 1000.0) : TPI_NO_DEADLINE;
    return tpi_rrefs_await_confirmed(rc, deadline, what, err, err_len);
}

/* Runs the creating function of an owner record registered by on_remote. */
static void serve_remote(tp_core *c, uint32_t src, tpi_msg *m, tpi_owner *o, tpi_rref_ctx *rc) {
    char err[TP_ERRMSG_LEN_MAX];
    err[0] = '\0';
    tp_value *result = NULL;
    tpi_later *later = NULL;
    tp_status st = await_rrefs(c, m, rc, err, sizeof err);
    if (st == TP_OK)
        st = invoke(c, src, m, NULL, &result, &later, err, sizeof err);
    if (later) { /* FUNC-7: the record stays running until the future completes */
        later_start(c, later, o, NULL);
        return;
    }
    tpi_lock(c);
    remote_settle(c, o, &st, result, err, sizeof err); /* takes result */
    tpi_unlock(c);
    tpi_reply(c, src, m->id, st, NULL, err);
}

static void job_discard(tp_core *c, tpi_job *j);
static int queue_job(tp_core *c, tpi_job *j);

/* The owner record a method call runs on, when this worker owns it and it
 * is not settled yet (lock held); else NULL. */
static tpi_owner *method_owner_pending(tp_core *c, const tpi_msg *m) {
    tp_rref *target = NULL;
    if (!(m->flags & TPI_FLAG_METHOD) || tp_list_len(m->args) != 2 ||
        tp_value_get_rref(tp_list_get(m->args, 0), &target) != TP_OK || !target->is_owner)
        return NULL;
    tpi_owner *o = tpi_idmap_get(&c->owners, target->id);
    return o && !o->ready ? o : NULL;
}

/*
 * METHOD-3: a method call on a value its owner has not made yet (its
 * remote() is queued behind the call, or not here yet) does not hold a pool
 * thread while it waits: were every thread waiting so, the remote() that
 * makes the value could never run. The decoded request waits on the owner
 * record instead and goes back to the pool when the record is settled
 * (tpi_owner_resume): it still counts for the drain, a cancel still finds
 * it, and the caller's own deadline still ends the call at the caller. 1
 * when it was deferred (*m and *rc taken).
 */
static int defer_method(tp_core *c, uint32_t src, tpi_msg *m, tpi_rref_ctx *rc, tpi_served *sv) {
    if (!(m->flags & TPI_FLAG_METHOD))
        return 0; /* a function call (most calls): no lock section */
    tpi_lock(c);
    int pending = method_owner_pending(c, m) != NULL;
    tpi_unlock(c);
    if (!pending)
        return 0;
    tpi_job *j = tpi_block_alloc(sizeof *j);
    tpi_msg *copy = j ? malloc(sizeof *copy) : NULL;
    if (!copy) { /* no memory to wait aside: wait on the pool as before */
        if (j)
            tpi_block_free(j, sizeof *j);
        return 0;
    }
    memset(j, 0, sizeof *j);
    tpi_lock(c);
    tpi_owner *o = method_owner_pending(c, m);
    if (!o || served_canceled(sv) || c->ndeferred >= TPI_METHOD_DEFERRED_MAX) {
        /* settled meanwhile, given up, or too many parked: go on here */
        tpi_unlock(c);
        free(copy);
        tpi_block_free(j, sizeof *j);
        return 0;
    }
    *copy = *m;
    tpi_msg_reset(m);
    j->msg = copy;
    j->decoded = 1;
    j->src = src;
    j->rc = *rc;
    memset(rc, 0, sizeof *rc);
    j->core = c;
    tpi_core_ref(c);
    c->active_served++; /* this job's count; the running one ends its own */
    if (sv && sv->listed) { /* a cancel from now on finds the waiting job */
        served_unlist(c, sv);
        served_list(c, &j->sv, sv->src, sv->id, j);
    } else {
        atomic_init(&j->sv.state, TPI_SERVED_LIVE);
        j->sv.src = src;
        j->sv.id = copy->id;
    }
    j->next = o->deferred;
    o->deferred = j;
    c->ndeferred++;
    tpi_unlock(c);
    return 1;
}

void tpi_owner_resume(tp_core *c, tpi_owner *o) {
    tpi_job *rev = NULL; /* the list is newest first: run them in arrival order */
    while (o->deferred) {
        tpi_job *j = o->deferred;
        o->deferred = j->next;
        j->next = rev;
        rev = j;
        TPI_ASSERT(c->ndeferred > 0);
        c->ndeferred--;
    }
    while (rev) {
        tpi_job *j = rev;
        rev = j->next;
        queue_job(c, j); /* at the back of its source's queue */
    }
}

void tpi_owner_drop_deferred(tp_core *c, tpi_owner *o) {
    while (o->deferred) {
        tpi_job *j = o->deferred;
        o->deferred = j->next;
        TPI_ASSERT(c->ndeferred > 0);
        c->ndeferred--;
        job_discard(c, j);
    }
}

/* Runs a decoded REQUEST's function (found: see invoke) once its rrefs are
 * confirmed, and replies; 1 when it was deferred instead (m and rc taken). */
static int run_request(tp_core *c, uint32_t src, tpi_msg *m, tpi_rref_ctx *rc,
                       const resolved_fn *found, tpi_served *sv) {
    char err[TP_ERRMSG_LEN_MAX];
    err[0] = '\0';
    tp_value *result = NULL;
    tpi_later *later = NULL;
    if (served_canceled(sv))
        return 0; /* CANCEL-1: given up while it waited for the pool: it never runs */
    tp_status st = await_rrefs(c, m, rc, err, sizeof err);
    if (st == TP_OK && served_canceled(sv))
        return 0;
    if (st == TP_OK && !nonblocking_fn && defer_method(c, src, m, rc, sv))
        return 1;
    if (st == TP_OK)
        st = invoke(c, src, m, found, &result, &later, err, sizeof err);
    if (later) {
        later_start(c, later, NULL, sv);
        return 0;
    }
    if (served_claim(sv)) /* CANCEL-1: a canceled call's answer is not sent */
        reply_result(c, src, m->id, st, result, err, m->text);
    tp_value_free(result);
    return 0;
}

static int hand_over(tp_core *c, uint32_t src, tpi_msg *m, tpi_rref_ctx *rc);
static void submit(tp_core *c, tpi_job *j, uint64_t id);

/* Decodes a REQUEST frame (taken), runs its function (found: see invoke) and
 * replies; sv is its cancelable listing, or NULL. */
static void serve_request(tp_core *c, uint32_t src, tp_frame *f, uint64_t id,
                          const resolved_fn *found, tpi_served *sv) {
    tpi_msg m;
    char err[TP_ERRMSG_LEN_MAX];
    err[0] = '\0';
    char who[TP_NAME_LEN_MAX + 32];
    tpi_rref_ctx rc = {c, src, NULL, 0, 0, 1, NULL, 0, 0};
    tpi_codec_hooks hooks;
    tpi_rref_hooks(&rc, &hooks);
    tp_status st = tpi_msg_decode_frame(f, &hooks, &m, err, sizeof err); /* takes f */
    if (st != TP_OK) {
        char msg[TP_ERRMSG_LEN_MAX];
        tpi_format(msg, sizeof msg, "%s could not decode the request: %s",
                   tpi_worker_desc(c, c->rank, who, sizeof who), err);
        tpi_rref_ctx_done(&rc);
        if (served_claim(sv))
            tpi_reply(c, src, id, st, NULL, msg);
        return;
    }
    /* The I/O context cannot wait for confirmations: a non-blocking
     * function with unconfirmed rrefs runs on the pool instead (RREF-13),
     * or, with no memory for the hand-off, not at all. */
    if (rc.npending > 0 && nonblocking_fn) {
        if (hand_over(c, src, &m, &rc))
            return;
        tpi_format(err, sizeof err,
                   "function '%s' on %s did not run: out of memory handing it to the pool to "
                   "wait for the confirmation of its rrefs (RREF-13)",
                   m.text, tpi_worker_desc(c, c->rank, who, sizeof who));
        tpi_rref_ctx_done(&rc);
        if (served_claim(sv))
            tpi_reply(c, src, m.id, TP_ENOMEM, NULL, err);
        tpi_msg_clear(&m);
        return;
    }
    if (run_request(c, src, &m, &rc, found, sv))
        return; /* deferred: m and rc went with it */
    tpi_rref_ctx_done(&rc);
    tpi_msg_clear(&m);
}

/*
 * FUNC-6: a REQUEST for a function registered non-blocking runs here, in
 * the I/O context, with no pool hand-off. 1 when it did (f taken).
 */
static int serve_inline(tp_core *c, uint32_t src, tp_frame *f) {
    char name[TP_NAME_LEN_MAX + 1];
    resolved_fn found;
    unsigned flags = 0;
    if ((tpi_frame_flags(f) & TPI_FLAG_METHOD) || !tpi_frame_request_name(f, name))
        return 0; /* the pool decodes it (and answers a malformed one) */
    if (strcmp(name, TPI_JOIN_FN) == 0 || strcmp(name, TPI_FORKS_FN) == 0 ||
        strcmp(name, TPI_CANCEL_FN) == 0 || strcmp(name, TPI_PING_FN) == 0) {
        /* REJOIN-4: fenced in the I/O context, before any later frame;
         * RREF-19: after every earlier frame from src was read; CANCEL-1
         * and the drain's flush ping (SHUTDOWN-5): likewise, and at once,
         * however busy the pool (every earlier request from src is counted
         * in S by now; a pool full of canceled functions must not hold the
         * answer). */
        serve_request(c, src, f, tpi_frame_id(f), NULL, NULL);
        return 1;
    }
    if (!tpi_registry_find(c->ctx, NULL, name, &found.fn, &found.ud, &flags) ||
        !(flags & TP_FN_NONBLOCKING))
        return 0;
    TPI_ASSERT(!nonblocking_fn && "a non-blocking function cannot serve another");
    /* No tpi_work_enter: nonblocking_fn already makes tp_shutdown refuse
     * (it waits), which is all SHUTDOWN-1 needs it for. */
    nonblocking_fn = name;
    serve_request(c, src, f, tpi_frame_id(f), &found, NULL); /* no second lookup */
    nonblocking_fn = NULL;
    return 1;
}

/* ---- Credit (FLOW-6..8) ---------------------------------------------------------- */

/*
 * FLOW-9: which of src's requests its credit counts (lock held). 1 when a
 * request of generation gen counts against it, after forgetting what src
 * sent under older generations (src gave those bytes back); 0 when gen is
 * older than what is counted: src gave that request's bytes back already,
 * so it counts against max_queued_bytes only.
 */
static int flow_gen_counts(tpi_peer *p, uint32_t gen) {
    if (p->src_gen_known && gen == p->src_gen)
        return 1;
    if (p->src_gen_known && (int32_t)(gen - p->src_gen) < 0)
        return 0;
    if (p->src_gen_known) { /* newer: src reset its window to us */
        p->held = 0;
        p->held_epoch++;
    }
    p->src_gen = gen;
    p->src_gen_known = 1;
    return 1;
}

/* Counts a request of len bytes and generation gen from src against its
 * credit and the worker's total, or refuses it with a message (FLOW-8):
 * TP_ELIMIT, or TP_ENOMEM when src's record cannot be made. With keep_lock
 * an admitted request returns with the lock held: its caller queues it in
 * the same section (one lock section per request in the I/O context). */
static tp_status flow_admit(tp_core *c, uint32_t src, uint64_t len, uint32_t gen, uint32_t *epoch,
                            int keep_lock, char *err, size_t err_len) {
    char me[TP_NAME_LEN_MAX + 32], who[TP_NAME_LEN_MAX + 32];
    tpi_lock(c);
    tpi_peer *p = tpi_peer_get(c, src); /* its jobs, held bytes and queue live there */
    if (!p) {
        tpi_unlock(c);
        tpi_format(err, err_len, "the callee is out of memory");
        return TP_ENOMEM;
    }
    int counted = flow_gen_counts(p, gen);
    uint64_t held = counted ? p->held : 0, total = c->held_total;
    int over_credit = held > 0 && held + len > c->grant;
    int over_total = !over_credit && total > 0 && total + len > c->queued_max;
    if (!over_credit && !over_total) {
        if (counted)
            p->held = held + len;
        c->held_total = total + len;
        /* An uncounted request carries an epoch that is already over, so
         * flow_release leaves src's held alone. */
        *epoch = counted ? p->held_epoch : p->held_epoch - 1;
        if (!keep_lock)
            tpi_unlock(c);
        return TP_OK;
    }
    int first = !p->refused_warned;
    p->refused_warned = 1;
    tpi_worker_desc(c, c->rank, me, sizeof me);
    tpi_worker_desc(c, src, who, sizeof who);
    if (over_credit)
        tpi_format(err, err_len,
                   "%s refused the request: %s has %llu request bytes queued here, this one adds "
                   "%llu, over the credit of %llu bytes granted to it (FLOW-8): the caller does "
                   "not follow flow control",
                   me, who, (unsigned long long)held, (unsigned long long)len,
                   (unsigned long long)c->grant);
    else
        tpi_format(err, err_len,
                   "%s refused the request from %s: %llu request bytes are queued here, this one "
                   "adds %llu, over max_queued_bytes of %llu (FLOW-8)",
                   me, who, (unsigned long long)total, (unsigned long long)len,
                   (unsigned long long)c->queued_max);
    tpi_unlock(c);
    tpi_log(first ? TP_LOG_WARN : TP_LOG_DEBUG, "%s", err);
    return TP_ELIMIT;
}

/* The request leaves the queue (lock held): it runs now, or never. */
static void flow_release(tp_core *c, tpi_job *j) {
    if (!j->held)
        return;
    TPI_ASSERT(c->held_total >= j->held);
    c->held_total -= j->held;
    tpi_peer *p = tpi_peer_must(c, j->src); /* made when j was admitted */
    if (j->held_epoch == p->held_epoch) {
        TPI_ASSERT(p->held >= j->held);
        p->held -= j->held;
    }
    j->held = 0;
}

/* ---- The run queues (FAIR-1) -------------------------------------------------------- */

/*
 * FAIR-1: a pool thread takes the next job round-robin over the sources
 * that have jobs queued, each source's jobs in arrival order (so a
 * remote() still runs before a later call that uses its value, AGENT-8). A
 * member that queues a flood waits behind itself, not the others: another
 * caller's job waits for at most one job of each source ahead of it in the
 * round. The pool's work items are tokens, one per queued job, and a token
 * runs whichever job is next: no job is itself a work item the agent may
 * still hold after the job ran and was freed.
 */
typedef struct tpi_token {
    tp_work work; /* first */
    tp_core *core;
} tpi_token;

/* Puts src at the end of the round (lock held). */
static void round_append(tp_core *c, uint32_t src) {
    tpi_runq *q = &tpi_peer_must(c, src)->runq;
    TPI_ASSERT(!q->in_round && q->head);
    q->in_round = 1;
    q->next = UINT32_MAX;
    if (c->rr_last == UINT32_MAX)
        c->rr_first = src;
    else
        tpi_peer_must(c, c->rr_last)->runq.next = src;
    c->rr_last = src;
}

/* Takes src out of the round wherever it is (lock held; a rare path). */
static void round_remove(tp_core *c, uint32_t src) {
    uint32_t prev = UINT32_MAX;
    for (uint32_t k = c->rr_first; k != UINT32_MAX; prev = k, k = tpi_peer_must(c, k)->runq.next) {
        if (k != src)
            continue;
        tpi_runq *q = &tpi_peer_must(c, k)->runq;
        if (prev == UINT32_MAX)
            c->rr_first = q->next;
        else
            tpi_peer_must(c, prev)->runq.next = q->next;
        if (c->rr_last == k)
            c->rr_last = prev;
        q->in_round = 0;
        return;
    }
}

static void runq_push(tp_core *c, tpi_job *j) {
    tpi_runq *q = &tpi_peer_must(c, j->src)->runq; /* made by flow_admit or submit */
    j->next = NULL;
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    q->njobs++;
    if (!q->in_round && !q->stalled)
        round_append(c, j->src);
}

/* Takes src's first job (lock held). */
static tpi_job *runq_take(tp_core *c, uint32_t src) {
    tpi_runq *q = &tpi_peer_must(c, src)->runq;
    tpi_job *j = q->head;
    TPI_ASSERT(j && q->njobs > 0);
    q->head = j->next;
    if (!q->head)
        q->tail = NULL;
    q->njobs--;
    TPI_ASSERT(!q->head == !q->njobs); /* the count is the list's length */
    j->next = NULL;
    return j;
}

/*
 * FAIR-2: whether src's answers cannot go (the agent holds too many bytes
 * for it, AGENT-18); then its jobs wait out of the round, so a caller that
 * does not read its answers stops being served instead of filling this
 * worker's memory with them. Never for this worker itself.
 */
static int congested(tp_core *c, uint32_t src) {
    return src != c->rank && c->ops->congested && c->ops->congested(c->agent, src);
}

/* The next job of the round, or NULL when none can run (lock held). */
static tpi_job *runq_pop(tp_core *c) {
    uint32_t src;
    while ((src = c->rr_first) != UINT32_MAX) {
        tpi_runq *q = &tpi_peer_must(c, src)->runq;
        c->rr_first = q->next;
        if (c->rr_first == UINT32_MAX)
            c->rr_last = UINT32_MAX;
        q->in_round = 0;
        TPI_ASSERT(q->head);
        if (congested(c, src)) {
            q->stalled = 1; /* back with tpi_serve_uncongested */
            continue;
        }
        tpi_job *j = runq_take(c, src);
        if (q->head)
            round_append(c, src); /* its next job waits for one of each other source's */
        return j;
    }
    return NULL;
}

/* Takes j out of its source's queue (lock held); 0 when a token took it already. */
static int runq_unlink(tp_core *c, uint32_t src, tpi_job *j) {
    tpi_runq *q = &tpi_peer_must(c, src)->runq;
    tpi_job *prev = NULL;
    for (tpi_job *k = q->head; k; prev = k, k = k->next) {
        if (k != j)
            continue;
        if (prev)
            prev->next = k->next;
        else
            q->head = k->next;
        if (q->tail == k)
            q->tail = prev;
        q->njobs--;
        TPI_ASSERT(!q->head == !q->njobs);
        if (!q->head && q->in_round)
            round_remove(c, src);
        j->next = NULL;
        return 1;
    }
    return 0;
}

/* Frees a job that never ran and is in no queue (lock held): no answer
 * goes, the caller's side fails the call; values through the grave. */
static void job_discard(tp_core *c, tpi_job *j) {
    flow_release(c, j);
    served_end(c, &j->sv);
    if (j->undecoded) {
        tpi_peer *p = tpi_peer_must(c, j->src);
        TPI_ASSERT(p->undecoded > 0);
        p->undecoded--;
    }
    if (j->owner) {
        j->owner->running = 0;
        if (!j->owner->ready)
            tpi_owner_set(c, j->owner, TP_ESHUTDOWN, NULL, "the callee is shutting down");
    }
    tp_frame_free(j->frame);
    if (j->msg) {
        tpi_defer_free(c, j->msg->args);
        tpi_defer_free(c, j->msg->kwargs);
        tpi_defer_free(c, j->msg->value);
        free(j->msg);
    }
    tpi_rref_ctx_done(&j->rc);
    tpi_block_free(j, sizeof *j);
    tpi_core_unref(c);
}

void tpi_serve_teardown(tp_core *c) {
    /* Only sources with a record can have jobs queued: in rank order. A
     * discard makes no record, so the list stays as it is. */
    for (uint32_t i = 0; i < c->npeer_ids; i++) {
        uint32_t src = c->peer_ids[i];
        tpi_runq *q = &tpi_peer_must(c, src)->runq;
        while (q->head)
            job_discard(c, runq_take(c, src));
        q->in_round = q->stalled = 0;
    }
    c->rr_first = c->rr_last = UINT32_MAX;
    c->tokens_owed = c->tokens_unissued = 0;
}

static void token_run(tp_work *w);
static tpi_token *token_new(tp_core *c);
static void submit_locked(tp_core *c, tpi_job *j, uint64_t id);
static void submit_execute(tp_core *c, tpi_job *j, uint32_t src, tpi_token *t, uint64_t id);

void tpi_serve_uncongested(tp_core *c, uint32_t dst) {
    tpi_lock(c);
    tpi_peer *p = tpi_peer_find(c, dst);
    tpi_runq *q = p ? &p->runq : NULL; /* none: it never queued a job here */
    uint64_t n = 0;
    if (q && q->stalled) {
        q->stalled = 0;
        if (q->head && !q->in_round)
            round_append(c, dst);
        /* The tokens that found only stalled sources, up to its jobs. */
        n = q->njobs < c->tokens_owed ? q->njobs : c->tokens_owed;
        c->tokens_owed -= n;
    }
    for (; n > 0; n--) {
        tpi_token *t = token_new(c);
        if (!t) {
            /* No memory for them: the pool threads that end jobs run these
             * in their stead (job_serve), so none waits for a later call. */
            c->tokens_unissued += n;
            break;
        }
        if (c->ops->execute(c->agent, &t->work) != TP_OK) {
            tpi_block_free(t, sizeof *t);
            c->tokens_owed += n; /* stopping: teardown drops what is left */
            break;
        }
    }
    tpi_unlock(c);
}

static tpi_job *job_serve(tp_core *c, tpi_job *j, tpi_waiter *node, int *canceled_queued);

/* 1 when any source has a job queued (lock held). */
static int runq_any(tp_core *c) {
    for (uint32_t i = 0; i < c->npeer_ids; i++)
        if (tpi_peer_must(c, c->peer_ids[i])->runq.njobs)
            return 1;
    return 0;
}

/* A pool work item: runs the next job of the round, and after it those
 * that tokens not made for want of memory left without one. */
static void token_run(tp_work *w) {
    tpi_token *t = (tpi_token *)w;
    tp_core *c = t->core;
    tpi_block_free(t, sizeof *t);
    tpi_waiter node;
    tpi_lock(c); /* one lock section for all three: this runs once per served call */
    tpi_job *j = runq_pop(c);
    if (!j) {
        /* Every queued job is of a stalled source (FAIR-2): the token is
         * owed to them; or its job went with a failed hand-off (queue_job). */
        c->tokens_owed += runq_any(c);
        tpi_unlock(c);
        return;
    }
    flow_release(c, j); /* before it runs, so before its answer can bring the next */
    tpi_work_enter_locked(c, &node);
    int canceled_queued = j->sv.answer_dequeued;
    tpi_unlock(c);
    while ((j = job_serve(c, j, &node, &canceled_queued)) != NULL)
        ;
}

/* Queues j (counted and listed already) with a token for it (lock held).
 * A token the pool refuses (stopping) takes j back out and drops it; when
 * another token took j first, the job left without one waits for
 * tpi_serve_teardown. 1 when j is queued. */
static int queue_job(tp_core *c, tpi_job *j) {
    runq_push(c, j);
    tpi_token *t = token_new(c);
    if (t) {
        if (c->ops->execute(c->agent, &t->work) == TP_OK)
            return 1;
        tpi_block_free(t, sizeof *t);
    }
    if (runq_unlink(c, j->src, j))
        job_discard(c, j);
    return 0;
}

/* Serves j (entered as node, flow released) and frees it. Returns the next
 * job this thread runs, entered the same way, with *canceled_queued set for
 * it; NULL when done (and then c may be gone). */
static tpi_job *job_serve(tp_core *c, tpi_job *j, tpi_waiter *node, int *canceled_queued) {
    char err[TP_ERRMSG_LEN_MAX];
    err[0] = '\0';
    char who[TP_NAME_LEN_MAX + 32];
    uint64_t id = j->msg ? j->msg->id : tpi_frame_id(j->frame);
    if (*canceled_queued) /* CANCEL-1: its bytes are out of the queue now */
        tpi_reply(c, j->src, id, TP_ECANCELED, NULL, "canceled by the caller");
    if (atomic_load(&c->state) != TPI_STATE_RUNNING) {
        tpi_format(err, sizeof err, "%s is shutting down",
                   tpi_worker_desc(c, c->rank, who, sizeof who));
        if (j->owner) {
            tpi_lock(c);
            j->owner->running = 0;
            if (!j->owner->ready)
                tpi_owner_set(c, j->owner, TP_ESHUTDOWN, NULL, err);
            tpi_unlock(c);
        }
        if (served_claim(&j->sv))
            tpi_reply(c, j->src, id, TP_ESHUTDOWN, NULL, err);
    } else if (j->decoded) {
        run_request(c, j->src, j->msg, &j->rc, NULL, &j->sv);
    } else if (j->msg) {
        serve_remote(c, j->src, j->msg, j->owner, &j->rc);
    } else {
        serve_request(c, j->src, j->frame, id, NULL, &j->sv);
        j->frame = NULL;
    }
    if (j->msg) {
        tpi_msg_clear(j->msg);
        free(j->msg);
    }
    tpi_rref_ctx_done(&j->rc);
    tp_frame_free(j->frame);
    tpi_lock(c);        /* one lock section for all: this runs once per served call */
    if (j->undecoded) { /* decoded, or dropped unread: RREF-19 may answer src now */
        tpi_peer *p = tpi_peer_must(c, j->src);
        TPI_ASSERT(p->undecoded > 0);
        p->undecoded--;
    }
    tpi_work_leave_locked(c, node);
    served_end(c, &j->sv);
    tpi_job *next = c->tokens_unissued > 0 ? runq_pop(c) : NULL;
    if (next) { /* FAIR-2: a token owed to it could not be made */
        c->tokens_unissued--;
        flow_release(c, next);
        tpi_work_enter_locked(c, node);
        *canceled_queued = next->sv.answer_dequeued;
    } else if (c->tokens_unissued > 0) {
        /* Only stalled sources' jobs (or none) are queued: owed to them,
         * as a token that finds only those is (token_run). */
        if (runq_any(c))
            c->tokens_owed += c->tokens_unissued;
        c->tokens_unissued = 0;
    }
    tpi_unlock(c);
    tpi_block_free(j, sizeof *j);
    tpi_core_unref(c); /* next, if any, holds a reference of its own */
    return next;
}

/*
 * REMOTE: the owner record and the caller's fork are registered here, in
 * the I/O context, before any later message on the same link (a to_here or
 * a delete) is handled; only the function runs on the pool (RREF-2).
 */
static tp_status on_remote(tp_core *c, uint32_t src, tp_frame *f, tpi_job *j, char *err,
                           size_t err_len) {
    tpi_codec_hooks hooks;
    tpi_rref_hooks(&j->rc, &hooks);
    j->msg = malloc(sizeof *j->msg);
    if (!j->msg) {
        tp_frame_free(f);
        tpi_format(err, err_len, "the callee is out of memory");
        return TP_ENOMEM;
    }
    tp_status st = tpi_msg_decode_frame(f, &hooks, j->msg, err, err_len); /* takes f */
    if (st != TP_OK) {
        free(j->msg);
        j->msg = NULL;
        return st;
    }
    tpi_lock(c);
    tpi_owner *o = NULL;
    st = TP_OK;
    if (tpi_rref_creator_gone(c, j->msg->rref)) {
        st = TP_EPEERDOWN;
        tpi_format(err, err_len, "rref %u:%llu: its creator is gone", j->msg->rref.worker,
                   (unsigned long long)j->msg->rref.local);
    } else if (c->reorders && !tpi_idmap_get(&c->owners, j->msg->rref)) {
        /* Only a reordering network delivers a REMOTE after its creator's
         * abandon, or after the value's last delete: the rings are looked
         * up only there, not on every remote() over TCP. */
        st = tpi_rref_never_created(c, j->msg->rref, err, err_len);
    }
    if (st != TP_OK) {
        /* RREF-20, RREF-21: a remote() from an incarnation already gone (its
         * frame was read after its death was), or one its creator abandoned
         * before it got here (the network held it back): nobody is left to
         * release it. */
        tpi_unlock(c);
        tpi_msg_clear(j->msg);
        free(j->msg);
        j->msg = NULL;
        return st;
    }
    o = tpi_idmap_get(&c->owners, j->msg->rref);
    uint32_t creator = j->msg->rref.worker;
    if (!o && creator != c->rank && creator < c->world_size &&
        tpi_peer_view(c, creator)->remote_values >= c->remote_values_max) {
        /* RREF-23: that worker's undeleted values here are at the limit. */
        char me[TP_NAME_LEN_MAX + 32], who[TP_NAME_LEN_MAX + 32];
        tpi_unlock(c);
        tpi_format(err, err_len,
                   "%s refused the remote(): it owns %llu values made by remote() calls of %s "
                   "that were not deleted, the limit (max_remote_values): release rrefs you no "
                   "longer need, or raise the limit",
                   tpi_worker_desc(c, c->rank, me, sizeof me),
                   (unsigned long long)c->remote_values_max,
                   tpi_worker_desc(c, creator, who, sizeof who));
        tpi_msg_clear(j->msg);
        free(j->msg);
        j->msg = NULL;
        return TP_ELIMIT;
    }
    if (!o)
        o = tpi_owner_get_or_create(c, j->msg->rref);
    if (!o) {
        st = TP_ENOMEM;
        tpi_format(err, err_len, "out of memory creating an rref on %s", c->self.name);
    } else if (o->ready || o->running) {
        st = TP_EPROTO; /* a peer sent the same rref id twice: its bug, not our crash */
        tpi_format(err, err_len, "rref %u:%llu already exists on %s", j->msg->rref.worker,
                   (unsigned long long)j->msg->rref.local, c->self.name);
    } else if (j->msg->fork.local != 0 && tpi_owner_add_fork(c, o, j->msg->fork, src) != TP_OK) {
        st = TP_ENOMEM;
        tpi_format(err, err_len, "out of memory recording a fork on %s", c->self.name);
    } else {
        o->running = 1;
        j->owner = o;
    }
    tpi_unlock(c);
    if (st != TP_OK) {
        tpi_msg_clear(j->msg);
        free(j->msg);
        j->msg = NULL;
    }
    return st;
}

/* A job for a request of len bytes from src admitted under epoch, or NULL. */
static tpi_job *job_new(uint32_t src, uint64_t len, uint32_t epoch) {
    tpi_job *j = tpi_block_alloc(sizeof *j); /* blocks.h: no malloc once warm */
    if (j) {
        memset(j, 0, sizeof *j);
        j->src = src;
        j->held = len;
        j->held_epoch = epoch;
    }
    return j;
}

/* A REQUEST the I/O context does not serve itself: admitted (FLOW-8),
 * counted as undecoded (RREF-19) and queued for the pool in one lock
 * section, since this runs once per served call. Takes f. */
static void admit_request(tp_core *c, uint32_t src, tp_frame *f) {
    uint64_t id = tpi_frame_id(f);
    uint64_t len = f->len;
    uint32_t epoch = 0;
    char ferr[TP_ERRMSG_LEN_MAX];
    tpi_job *j = job_new(src, 0, 0);
    if (!j) {
        tp_frame_free(f);
        tpi_reply(c, src, id, TP_ENOMEM, NULL, "the callee is out of memory taking the call in");
        return;
    }
    tpi_token *t = token_new(c);
    tp_status admitted = flow_admit(c, src, len, tpi_frame_gen(f), &epoch, 1, ferr, sizeof ferr);
    if (admitted != TP_OK) {
        if (t)
            tpi_block_free(t, sizeof *t);
        tpi_block_free(j, sizeof *j);
        tp_frame_free(f); /* FLOW-8: dropped unrun */
        tpi_reply(c, src, id, admitted, NULL, ferr);
        return;
    }
    j->held = len;
    j->held_epoch = epoch;
    /* Read but not decoded: its rrefs are not known yet (RREF-19). */
    j->frame = f;
    j->undecoded = 1;
    tpi_peer_must(c, src)->undecoded++; /* made by flow_admit */
    submit_locked(c, j, id);
    tpi_unlock(c);
    submit_execute(c, j, src, t, id);
}

void tpi_on_request(tp_core *c, uint32_t src, tp_frame *f) {
    uint8_t type = tpi_frame_type(f);
    if (type != TPI_MSG_REQUEST && type != TPI_MSG_REMOTE) {
        tpi_msg m;
        char err[TP_ERRMSG_LEN_MAX];
        tpi_rref_ctx rc = {c, src};
        tpi_codec_hooks hooks;
        tpi_rref_hooks(&rc, &hooks);
        uint64_t id = tpi_frame_id(f);
        tp_status st = tpi_msg_decode_frame(f, &hooks, &m, err, sizeof err); /* takes f */
        if (st != TP_OK) {
            tpi_reply(c, src, id, st, NULL, err);
            return;
        }
        tpi_rref_on_message(c, src, &m);
        tpi_msg_clear(&m);
        return;
    }
    if (type == TPI_MSG_REQUEST) {
        if (!serve_inline(c, src, f))
            admit_request(c, src, f);
        return;
    }
    uint64_t id = tpi_frame_id(f);
    uint64_t len = f->len;
    uint32_t epoch = 0;
    char ferr[TP_ERRMSG_LEN_MAX];
    tp_status admitted = flow_admit(c, src, len, tpi_frame_gen(f), &epoch, 0, ferr, sizeof ferr);
    if (admitted != TP_OK) {
        tp_frame_free(f); /* FLOW-8: dropped unrun */
        tpi_reply(c, src, id, admitted, NULL, ferr);
        return;
    }
    tpi_job *j = job_new(src, len, epoch);
    if (!j) {
        tpi_job none = {.src = src, .held = len, .held_epoch = epoch};
        tpi_lock(c);
        flow_release(c, &none);
        tpi_unlock(c);
        tp_frame_free(f);
        tpi_reply(c, src, id, TP_ENOMEM, NULL, "the callee is out of memory taking the call in");
        return;
    }
    char err[TP_ERRMSG_LEN_MAX];
    j->rc = (tpi_rref_ctx){c, src, NULL, 0, 0, 1, NULL, 0, 0};
    tp_status st = on_remote(c, src, f, j, err, sizeof err); /* takes f */
    if (st != TP_OK) {
        tpi_lock(c);
        flow_release(c, j);
        tpi_unlock(c);
        tpi_rref_ctx_done(&j->rc);
        tpi_block_free(j, sizeof *j);
        tpi_reply(c, src, id, st, NULL, err);
        return;
    }
    submit(c, j, id);
}

/* Hands a decoded REQUEST (m and rc moved in) to the pool: 1 when it did. */
static int hand_over(tp_core *c, uint32_t src, tpi_msg *m, tpi_rref_ctx *rc) {
    tpi_lock(c);
    int have = tpi_peer_get(c, src) != NULL; /* its run queue (flow_admit was skipped) */
    tpi_unlock(c);
    tpi_job *j = have ? tpi_block_alloc(sizeof *j) : NULL;
    tpi_msg *copy = j ? malloc(sizeof *copy) : NULL;
    if (!copy) {
        if (j)
            tpi_block_free(j, sizeof *j);
        return 0;
    }
    memset(j, 0, sizeof *j);
    *copy = *m;
    j->msg = copy;
    j->decoded = 1;
    j->src = src;
    j->rc = *rc;
    memset(rc, 0, sizeof *rc);
    submit(c, j, copy->id);
    return 1;
}

/* A pool work item that will run the next job of the round, or NULL. */
static tpi_token *token_new(tp_core *c) {
    tpi_token *t = tpi_block_alloc(sizeof *t);
    if (t) {
        t->work.run = token_run;
        t->core = c;
    }
    return t;
}

/* Counts and queues job j (its frame or msg set; lock held). */
static void submit_locked(tp_core *c, tpi_job *j, uint64_t id) {
    j->core = c;
    tpi_core_ref(c);
    c->active_served++; /* before the job can run: shutdown's drain sees it */
    if (!j->owner) /* a REQUEST: its caller may cancel it (CANCEL-1); remote() is not */
        served_list(c, &j->sv, j->src, id, j);
    runq_push(c, j);
}

/* Queues job j (its frame or msg set) on the pool; answers id if it cannot. */
static void submit(tp_core *c, tpi_job *j, uint64_t id) {
    tpi_token *t = token_new(c);
    tpi_lock(c);
    submit_locked(c, j, id);
    uint32_t src = j->src;
    tpi_unlock(c);
    submit_execute(c, j, src, t, id);
}

/* Hands the token for queued job j, from src, to the pool (no lock held:
 * the pool thread this wakes takes the lock first thing); a token the pool
 * refuses, or none (NULL: no memory), takes j back out and answers id.
 * Once the lock was let go, any token's thread may have run j and freed its
 * block: j is not read here unless runq_unlink finds it still queued. */
static void submit_execute(tp_core *c, tpi_job *j, uint32_t src, tpi_token *t, uint64_t id) {
    tp_status st = t ? c->ops->execute(c->agent, &t->work) : TP_ENOMEM;
    if (st == TP_OK)
        return;
    if (t)
        tpi_block_free(t, sizeof *t);
    /* The pool refused (stopping), or there was no memory for the token. */
    const char *why = st == TP_ENOMEM ? "the callee is out of memory handing the call to its pool"
                                      : "the callee is shutting down";
    if (st != TP_ENOMEM)
        st = TP_ESHUTDOWN;
    tpi_lock(c);
    /* Another token may have taken j (then the job left without one waits
     * for tpi_serve_teardown); else j never runs. */
    int mine = runq_unlink(c, src, j);
    if (mine) {
        flow_release(c, j);
        served_end(c, &j->sv); /* no cancel can come in between: this is the I/O context */
        if (j->undecoded)
            tpi_peer_must(c, src)->undecoded--;
        if (j->owner) {
            j->owner->running = 0;
            tpi_owner_set(c, j->owner, st, NULL, why);
        }
    }
    tpi_unlock(c);
    if (!mine)
        return;
    tp_frame_free(j->frame);
    if (j->msg) {
        tpi_msg_clear(j->msg);
        free(j->msg);
    }
    tpi_rref_ctx_done(&j->rc);
    tpi_block_free(j, sizeof *j);
    tpi_reply(c, src, id, st, NULL, why);
    tpi_core_unref(c);
}
