/*
 * canary.h: deliberately broken variants of the core, for proving that the
 * simulator's oracle and swarm catch real bugs (spec/sim.md SIM-11).
 *
 * Only a build with TP_CANARIES defined has them (the tensorplay_rpc_canary
 * library that tpsim_canary links); there tpi_canary picks the one that runs,
 * 0 for none. In every other build TPI_CANARY(n) is the constant 0 and the
 * broken branches compile away.
 */
#ifndef TPI_CANARY_H
#define TPI_CANARY_H

typedef enum tpi_canary_kind {
    TPI_CANARY_NONE = 0,
    /* The deadline timer is not marked spent when it fires, so it is never
     * armed again: later calls do not time out. */
    TPI_CANARY_TIMER_NOT_REARMED = 1,
    /* A timeout completes the future but leaves the call registered, and the
     * future has no first-wins guard: a late reply completes it again. */
    TPI_CANARY_DOUBLE_COMPLETE = 2,
    /* The shutdown drain publishes no served requests, so it can end while
     * functions still run. */
    TPI_CANARY_DRAIN_UNDERREPORTS = 3,
    /* A user that sends an rref keeps no pending child: its own delete can
     * reach the owner before the child's fork, and the owner frees the value
     * while the child still holds a reference (guarantee 2, RREF-5). */
    TPI_CANARY_CHILD_DROPPED_EARLY = 4,
    /* Copies of a frame are served again on a duplicating transport (no
     * CALL-10): a function runs twice for one call. */
    TPI_CANARY_DEDUPE_OFF = 5,
    /* An owner on a reordering transport forgets the values it freed (no
     * RREF-21): a fetch or remote() held back behind the last delete makes a
     * placeholder or a fork that nothing settles. */
    TPI_CANARY_FREED_FORGOTTEN = 6,
    /* On a transport that loses frames silently nobody asks about the forks
     * whose frames vanished (no RREF-22): they stay until the leak report. */
    TPI_CANARY_NO_FORK_PROBE = 7,
    /* A creator whose REMOTE got no answer sends its delete right after its
     * abandon, not after the abandon's answer (RREF-15): on a reordering
     * transport both can overtake the REMOTE, which then records a fork. */
    TPI_CANARY_DELETE_BEFORE_ABANDON = 8,
    /* On a reordering transport tp:forks answers at once instead of after
     * the reordering bound (RREF-19): a query held with the frame it asks
     * about can pass it, "not held" frees a value its holder is receiving. */
    TPI_CANARY_QUERY_NO_WAIT = 9,
    /* The owner records a fork again after its delete (no memory of deleted
     * forks, RREF-21): a repeat that timed out in flight and was held back
     * behind the delete keeps the value for a reference nobody holds. */
    TPI_CANARY_FORGETS_DELETED = 10,
    /* Then- and done-callbacks are not counted by the shutdown drain
     * (FUTURE-5, SHUTDOWN-5): a drain can end while a callback is queued or
     * running, and the calls it issues fail with TP_ESHUTDOWN. */
    TPI_CANARY_THEN_UNCOUNTED = 11,
    TPI_CANARY_KINDS_
} tpi_canary_kind;

#ifdef TP_CANARIES
extern int tpi_canary; /* which broken variant runs; set once before any worker */
#define TPI_CANARY(kind) (tpi_canary == (kind))
#else
#define TPI_CANARY(kind) 0
#endif

/* The canary's name ("timer_not_rearmed"...), or NULL past the last. */
const char *tpi_canary_name(int kind);

#endif
