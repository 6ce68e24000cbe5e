/*
 * rref.pml: the rref protocol's fork/accept/delete, for spin (issue 9 item 5).
 * The rules cited are spec/rref.md's, the ones common/rref.c cites.
 *
 * Three workers: O owns a value; A holds a confirmed user rref to it (fork
 * FA, recorded on O). A may pass it to B in a user call (the share): A keeps
 * a pending child for the new fork FB (RREF-5), B sends RREF_FORK(FB) to O
 * (RREF-6), O records FB and answers, B sends RREF_ACCEPT(FB) to A, A drops
 * its child. Each of A and B releases its reference once (RREF-4): a delete
 * waits for the sender's pending children (RREF-5) and, on B, for its own
 * fork's answer (RREF-15). O frees the value when no fork is recorded (RREF-3).
 *
 * The network between each pair of workers is one connection: frames keep
 * their order on it (AGENT-8) unless CHAOS is defined, in which case any
 * frame in flight may be taken first. The environment may break a connection
 * (everything in flight on it is lost, both ways, and every unanswered
 * protocol message on it is sent again: RREF-15) and may time an accept or
 * delete out while it is still in flight (it is sent again behind itself: a
 * duplicate). A fork has no timeout (RREF-6) unless LOSS is defined. With
 * CHAOS_DUP the network itself copies a frame in flight, and the receiver
 * drops a copy by its message id (api.md CALL-10; every attempt is a new
 * call with a new id, RREF-15). With LOSS a frame in flight vanishes without
 * its connection breaking (agent.md AGENT-17, TP_NET_LOSES), and a fork's
 * attempt times out too (RREF-15). All of these are bounded (MAX_BREAKS,
 * MAX_TIMEOUTS, MAX_DUPS, MAX_LOSSES) so every run ends. Reordering is
 * between links always, within one with CHAOS.
 *
 * The share itself is a user call, never sent again (RREF-15): the model
 * delivers it, on its own channel that breaks do not touch. A user call lost
 * with its connection is settled by asking the receiver which forks it
 * holds (RREF-19), which this model leaves out; the simulator's oracle and
 * tests/unit/test_rref_faults.c check it.
 *
 * The owner remembers the forks whose delete came (RREF-21): a repeat of a
 * fork that timed out in flight, held back behind that delete, is answered
 * and not recorded again, and one reaching a freed value is refused.
 *
 * Checked (make test, tests/scripts/spin_rref.sh), each with both claims:
 *   the model as written, with CHAOS, with CHAOS and CHAOS_DUP, and with
 *   CHAOS, CHAOS_DUP and LOSS together (must hold);
 *   each MUTANT_* (one rule broken on purpose) must be caught, so the check
 *   is shown to bite: MUTANT_FORGETS_DELETED under LOSS (a repeat that
 *   timed out in flight, held back behind the delete, recorded again), and
 *   with MUTANT_NO_DEDUPE under CHAOS_DUP (a copied fork served after its
 *   delete: dedupe or the memory of deletes, one of them is needed).
 * The properties:
 *   safety  - the owner never frees while a worker holds a reference (RREF-3,
 *             RREF-5), B never receives a reference to a freed value, a
 *             repeated delete or accept never counts twice (RREF-15);
 *   liveness - under weak fairness the value is freed (ltl eventually_freed).
 */

#define NONE 0
#define FA 1 /* A's fork */
#define FB 2 /* the fork A made for B */

#ifndef MAX_BREAKS
#define MAX_BREAKS 2
#endif
#ifndef MAX_TIMEOUTS
#define MAX_TIMEOUTS 1
#endif

#ifdef CHAOS
#define RECV ??
#else
#define RECV ?
#endif

mtype = { FORK, FORK_OK, ACCEPT, ACCEPT_OK, DELETE, DELETE_OK };

/* One channel per direction of each connection: type, fork, message id. */
chan a2o = [4] of { mtype, byte, byte };
chan o2a = [4] of { mtype, byte, byte };
chan b2o = [4] of { mtype, byte, byte };
chan o2b = [4] of { mtype, byte, byte };
chan a2b = [4] of { mtype, byte, byte };
chan b2a = [4] of { mtype, byte, byte };

/* Message ids: each send is a new one; a receiver serves an id once
 * (CALL-10), so a copy the network made is dropped. Answers carry their
 * request's id and are idempotent where they land. */
#define MAX_IDS 48
byte nid = 1;
bool seen[MAX_IDS];
#define SEND(ch, m, f) assert(nid < MAX_IDS); ch ! m, f, nid; nid++
#ifndef MUTANT_NO_DEDUPE
#define COPY(id) seen[id]
#else
#define COPY(id) false /* broken on purpose: a copy is served again (no CALL-10) */
#endif
chan share = [1] of { byte }; /* the user call carrying FB (delivered) */

/* A sender's view of one protocol message (RREF-15). */
#define IDLE 0
#define SENT 1  /* an attempt is in flight, unanswered */
#define AGAIN 2 /* its attempt ended without an answer: send again */
#define DONE 3

/* The owner O. */
bool recorded[3]; /* forks recorded (RREF-6), by id */
bool deleted[3];  /* forks whose delete came (RREF-21) */
/* Only a transport that reorders needs the owner to remember them (as
 * common/rref.c does only then): in order, nothing follows a fork's delete. */
#if defined(CHAOS) && !defined(MUTANT_FORGETS_DELETED)
#define DELETED(f) deleted[f]
#else
#define DELETED(f) false
#endif
bool freed;
byte fork_records; /* times a fork was recorded: each fork once (RREF-15) */
byte fork_deletes; /* times a recorded fork was removed: each once */

/* A: its handle, its pending child, its delete. */
bool a_holds = 1;
bool a_child; /* pending child FB (RREF-5) */
bool a_shared;
bool a_delete_waits; /* released with a pending child */
byte a_delete = IDLE;

/* B: its handle, its fork, its accept, its delete. */
bool b_holds;
bool b_confirmed;
bool b_released;
bool b_delete_waits; /* released before its fork was answered (RREF-15) */
byte b_fork = IDLE;
byte b_accept = IDLE;
byte b_delete = IDLE;

byte breaks, timeouts;

/* The ghost count: references the workers really hold (the oracle's view). */
#define HELD (a_holds + a_child + b_holds)

inline free_if_unreferenced() {
    if
    :: !recorded[FA] && !recorded[FB] && !freed ->
        assert(HELD == 0); /* RREF-3: never free what a worker holds */
        freed = 1
    :: else -> skip
    fi
}

active proctype Owner() {
    byte f, id;
    recorded[FA] = 1; /* A's confirmed reference; only the owner reads these */
end:
    do
    :: atomic { b2o RECV FORK, f, id -> if :: COPY(id) -> skip :: else -> seen[id] = 1;
        /* RREF-5: the parent's child keeps the value alive until the fork is
         * answered; after that only a stale repeat can come (an attempt that
         * timed out in flight, RREF-15), refused once the value is freed
         * (RREF-21). */
        assert(!freed || b_fork == DONE);
        if
        :: freed -> skip
        :: !freed && DELETED(f) -> skip /* RREF-21: a repeat behind its delete */
#ifndef MUTANT_FORK_NOT_IDEMPOTENT
        :: !freed && !DELETED(f) && !recorded[f] -> recorded[f] = 1; fork_records++
        :: !freed && !DELETED(f) && recorded[f] -> skip /* recorded once (RREF-15) */
#else
        :: !freed && !DELETED(f) -> recorded[f] = 1; fork_records++ /* broken: counts a repeat */
#endif
        fi;
        o2b ! FORK_OK, f, id fi }
    :: atomic { a2o RECV DELETE, f, id -> if :: COPY(id) -> skip :: else -> seen[id] = 1;
        deleted[f] = 1;
        if
        :: recorded[f] -> recorded[f] = 0; fork_deletes++
        :: else -> skip /* unknown: ignored (RREF-4) */
        fi;
        o2a ! DELETE_OK, f, id;
        free_if_unreferenced() fi }
    :: atomic { b2o RECV DELETE, f, id -> if :: COPY(id) -> skip :: else -> seen[id] = 1;
        deleted[f] = 1;
        if
        :: recorded[f] -> recorded[f] = 0; fork_deletes++
        :: else -> skip
        fi;
        o2b ! DELETE_OK, f, id;
        free_if_unreferenced() fi }
    od
}

active proctype UserA() {
    byte f, id;
end:
    do
    /* The share: A keeps a pending child for FB (RREF-5, RREF-7). */
    :: atomic { a_holds && !a_shared -> a_shared = 1; a_child = 1; share ! FB }
    /* Release (RREF-4), waiting for the pending child (RREF-5). */
    :: atomic { a_holds ->
        a_holds = 0;
        if
#ifndef MUTANT_DELETE_OVERTAKES_CHILD
        :: a_child -> a_delete_waits = 1
        :: else -> a_delete = SENT; SEND(a2o, DELETE, FA)
#else
        :: a_delete = SENT; SEND(a2o, DELETE, FA) /* broken on purpose: RREF-5 ignored */
#endif
        fi }
    :: atomic { b2a RECV ACCEPT, f, id -> if :: COPY(id) -> skip :: else -> seen[id] = 1;
        if
        :: a_child ->
            a_child = 0;
            if
            :: a_delete_waits -> a_delete_waits = 0; a_delete = SENT; SEND(a2o, DELETE, FA)
            :: else -> skip
            fi
        :: else -> skip /* a repeated accept drops nothing (RREF-15) */
        fi;
        a2b ! ACCEPT_OK, f, id fi }
    :: atomic { o2a RECV DELETE_OK, f, id -> a_delete = DONE }
    :: atomic { a_delete == AGAIN -> a_delete = SENT; SEND(a2o, DELETE, FA) } /* RREF-15 */
    od
}

active proctype UserB() {
    byte f, id;
end:
    do
    /* Receiving FB from A: an unconfirmed user rref, RREF_FORK to O (RREF-6). */
    :: atomic { share ? f ->
        assert(!freed);
        b_holds = 1;
        b_fork = SENT;
        SEND(b2o, FORK, FB) }
    :: atomic { o2b RECV FORK_OK, f, id ->
        if
        :: b_fork != DONE ->
            b_fork = DONE;
            b_confirmed = 1;
            b_accept = SENT;
            SEND(b2a, ACCEPT, FB);
            if
            :: b_delete_waits -> b_delete_waits = 0; b_delete = SENT; SEND(b2o, DELETE, FB)
            :: else -> skip
            fi
        :: else -> skip /* the answer to a repeat */
        fi }
    :: atomic { b_holds ->
        b_holds = 0;
        b_released = 1;
        if
#ifndef MUTANT_DELETE_OVERTAKES_FORK
        :: b_fork == DONE -> b_delete = SENT; SEND(b2o, DELETE, FB)
        :: else -> b_delete_waits = 1 /* RREF-15: never overtake the fork */
#else
        :: b_delete = SENT; SEND(b2o, DELETE, FB) /* broken on purpose: RREF-15 ignored */
#endif
        fi }
    :: atomic { a2b RECV ACCEPT_OK, f, id -> b_accept = DONE }
    :: atomic { o2b RECV DELETE_OK, f, id -> b_delete = DONE }
    :: atomic { b_fork == AGAIN -> b_fork = SENT; SEND(b2o, FORK, FB) }
    :: atomic { b_accept == AGAIN -> b_accept = SENT; SEND(b2a, ACCEPT, FB) }
    :: atomic { b_delete == AGAIN -> b_delete = SENT; SEND(b2o, DELETE, FB) }
    od
}

/* Empties a channel: what was in flight on a broken connection is lost. */
inline drain(ch) {
    do
    :: nempty(ch) -> ch ? _, _, _
    :: empty(ch) -> break
    od
}

inline again(st) {
    if
    :: st == SENT -> st = AGAIN
    :: else -> skip
    fi
}

#ifdef CHAOS_DUP
#ifndef MAX_DUPS
#define MAX_DUPS 1
#endif
byte dups;
/* Copies a frame in flight on ch (taken at random, CHAOS): same id. */
inline dup(ch) {
    ch ?? <dm, dx, di> -> ch ! dm, dx, di
}
#endif
#ifdef LOSS
#ifndef MAX_LOSSES
#define MAX_LOSSES 1
#endif
byte losses;
/* An attempt whose frame and answer are both gone: only its timeout ends it,
 * and it always comes (RREF-15; unbounded, unlike a timeout in flight). */
#define GONE(st, req, rch, ans, ach) (st == SENT && !(rch ?? [req, _, _]) && !(ach ?? [ans, _, _]))
#endif

/* The environment: broken connections and attempts that time out. */
active proctype Network() {
    mtype dm;
    byte dx, di;
end:
    do
#ifdef CHAOS_DUP
    :: atomic { dups < MAX_DUPS && nempty(b2o) && nfull(b2o) -> dups++; dup(b2o) }
    :: atomic { dups < MAX_DUPS && nempty(a2o) && nfull(a2o) -> dups++; dup(a2o) }
    :: atomic { dups < MAX_DUPS && nempty(b2a) && nfull(b2a) -> dups++; dup(b2a) }
    :: atomic { dups < MAX_DUPS && nempty(o2b) && nfull(o2b) -> dups++; dup(o2b) }
#endif
    :: atomic { breaks < MAX_BREAKS -> breaks++;
        drain(a2o); drain(o2a); again(a_delete) }
    :: atomic { breaks < MAX_BREAKS -> breaks++;
        drain(b2o); drain(o2b); again(b_fork); again(b_delete) }
    :: atomic { breaks < MAX_BREAKS -> breaks++;
        drain(a2b); drain(b2a); again(b_accept) }
    /* An accept or delete attempt times out in flight: sent again behind itself. */
    :: atomic { timeouts < MAX_TIMEOUTS && a_delete == SENT -> timeouts++; a_delete = AGAIN }
    :: atomic { timeouts < MAX_TIMEOUTS && b_delete == SENT -> timeouts++; b_delete = AGAIN }
    :: atomic { timeouts < MAX_TIMEOUTS && b_accept == SENT -> timeouts++; b_accept = AGAIN }
#ifdef LOSS
    /* A frame vanishes, its connection intact; its sender times out. */
    :: atomic { losses < MAX_LOSSES && nempty(a2o) -> losses++; a2o ?? _, _, _ }
    :: atomic { losses < MAX_LOSSES && nempty(o2a) -> losses++; o2a ?? _, _, _ }
    :: atomic { losses < MAX_LOSSES && nempty(b2o) -> losses++; b2o ?? _, _, _ }
    :: atomic { losses < MAX_LOSSES && nempty(o2b) -> losses++; o2b ?? _, _, _ }
    :: atomic { losses < MAX_LOSSES && nempty(a2b) -> losses++; a2b ?? _, _, _ }
    :: atomic { losses < MAX_LOSSES && nempty(b2a) -> losses++; b2a ?? _, _, _ }
    :: atomic { timeouts < MAX_TIMEOUTS && b_fork == SENT -> timeouts++; b_fork = AGAIN }
    :: atomic { GONE(a_delete, DELETE, a2o, DELETE_OK, o2a) -> a_delete = AGAIN }
    :: atomic { GONE(b_delete, DELETE, b2o, DELETE_OK, o2b) -> b_delete = AGAIN }
    :: atomic { GONE(b_accept, ACCEPT, b2a, ACCEPT_OK, a2b) -> b_accept = AGAIN }
    :: atomic { GONE(b_fork, FORK, b2o, FORK_OK, o2b) -> b_fork = AGAIN }
#endif
    od
}

/* Each fork is recorded once and removed once, whatever was repeated. */
ltl once_each { [] (fork_records <= 1 && fork_deletes <= 2) }
/* Guarantee 1 and 2 together: the value goes once every reference went. */
ltl eventually_freed { <> freed }
