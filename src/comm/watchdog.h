/* comm/watchdog: no collective waits forever.
 *
 * Every collective of comm.c (on any thread: the compute thread, the comm stream's thread, a
 * checkpoint writer) registers itself on entry and leaves on exit. A watchdog thread per rank
 * (comm_watchdog_start) looks at the collectives in flight every 100 ms; when one has lasted
 * longer than the timeout it asks every other member of that collective's group, over a side
 * channel (a private duplicate of the world communicator that only watchdog threads use), how
 * many collectives it has entered on that group and what it is doing. Ranks that answer with
 * a lower count have not arrived; ranks that do not answer within WD_ASK_SECONDS are stopped,
 * hung outside MPI, or cut off. The watchdog then logs one line naming the collective, its
 * label (bucket or tensor), the context (e.g. the checkpoint being saved), the training step,
 * the group and the ranks that did not arrive, and aborts the whole job (MPI_Abort; if that
 * does not end this process within a few seconds, e.g. over a cut link, the process exits by
 * itself). Before aborting it has every rank that still runs write its flight recorder dump
 * (comm/flight.h): it asks them over the side channel, writes its own, and waits up to
 * WD_DUMP_SECONDS for the ranks that answered (a stopped rank cannot dump). Detection
 * therefore takes timeout + at most ~4 s (+1.5 s when a rank outside the group is stopped). The
 * thread also writes this rank's dump when a signal asked for one (comm_flight_catch).
 *
 * Point-to-point waits (the pipeline's stage transfers) are watched the same way: the message
 * names the transfer, and the one peer is asked what it is doing.
 *
 * Labels: comm_label() names the *next* collective issued by the calling thread (one-shot),
 * comm_context() names everything the calling thread issues until it is cleared. Both are
 * copied, so callers may pass stack buffers.
 */
#ifndef CT_COMM_WATCHDOG_H
#define CT_COMM_WATCHDOG_H

#include <stddef.h>
#include <stdint.h>

#define WD_ASK_SECONDS 3.0

/* Collective over the world (duplicates the world communicator). timeout_s > 0. */
void comm_watchdog_start(double timeout_s);
/* Collective: a barrier of every rank under the watchdog (a rank stopped after the last
 * collective is named, not waited for), then stops the thread and arms a guard that ends
 * the process if MPI_Finalize has not returned within the timeout + WD_ASK_SECONDS.
 * comm_finalize calls it. Safe when not started. */
void comm_watchdog_stop(void);
/* The training step shown in watchdog messages (-1: none). */
void comm_watchdog_set_step(int64_t step);

void comm_label(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void comm_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void comm_context_clear(void);

/* ---- for comm.c (the collectives and the group table) */

/* Register a group's communicator under a name with its members' world ranks. */
void wd_group_add(void *comm, const char *name, int size, const int *world_ranks);
void wd_group_remove(void *comm);
/* The calling thread's pending label and context as wd_enter will show them ("label during
 * context"; "" when neither is set), for the flight recorder. */
void wd_label_text(char *buf, size_t n);
/* A collective on comm of `count` `unit`s starts / ends; returns the slot wd_leave takes. */
int wd_enter(const char *kind, const char *unit, void *comm, int64_t count);
void wd_leave(int slot);
/* A wait for a point-to-point transfer with world rank peer_world starts (comm/p2p.c): past
 * the timeout the watchdog asks that peer what it is doing and aborts naming `what`. */
int wd_enter_p2p(const char *what, int peer_world);

#endif
