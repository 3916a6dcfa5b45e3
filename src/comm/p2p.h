/* comm/p2p: non-blocking point-to-point transfers (pipeline stage boundaries).
 *
 * A transfer is posted (isend / irecv) and later tested or waited on. MPI advances it only
 * inside MPI calls, so the caller tests its open transfers between compute steps (the
 * pipeline executor does so after every action) and waits where it needs the data. A wait
 * that exceeds its timeout names the transfer and aborts the job (a dead or stuck peer never
 * hangs it): the comm watchdog watches waits (comm_p2p_watch) when it runs, and the wait's own
 * timeout is the fallback. Messages over 1 GiB are refused (stage activations are far smaller).
 * Every transfer is recorded by the flight recorder (comm/flight.h): posted = started, and
 * completed when a test or wait finds it done.
 */
#ifndef CT_COMM_P2P_H
#define CT_COMM_P2P_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"

#define P2P_GRACE_S 10.0 /* > the watchdog's asking + dumping (WD_ASK_SECONDS + 1.5 s) */

struct comm_p2p {
	uint64_t req; /* the MPI request, stored opaquely */
	bool active;
	int64_t bytes;
	int64_t flight; /* its flight recorder entry (comm/flight.h), completed by the test */
	void *comm;     /* the communicator and the peer's rank in it (for the watchdog) */
	int peer;
};

void comm_p2p_isend(const struct comm_group *g, int peer, int tag, const void *buf, int64_t bytes,
                    struct comm_p2p *r);
void comm_p2p_irecv(const struct comm_group *g, int peer, int tag, void *buf, int64_t bytes,
                    struct comm_p2p *r);
/* True once the transfer is complete (or none is open); never blocks. */
bool comm_p2p_test(struct comm_p2p *r);
/* Block until complete. A wait that has to wait is watched (comm_p2p_watch): past
 * comm.timeout_seconds the watchdog names the peer and has every rank write its flight
 * recorder dump before it ends the job. Fallback without a watchdog: after timeout_s (> 0)
 * plus the watchdog's grace (P2P_GRACE_S) this rank dumps and aborts the job naming `what`. */
void comm_p2p_wait(struct comm_p2p *r, double timeout_s, const char *what);
/* Watch a wait for a transfer with peer (a rank of g) under the comm watchdog
 * (comm/watchdog.h): past comm.timeout_seconds it asks the peer what it is doing and aborts
 * the job with one message naming `what` and the peer. Returns the token comm_p2p_unwatch
 * takes. */
int comm_p2p_watch(const struct comm_group *g, int peer, const char *what);
void comm_p2p_unwatch(int token);
/* The largest tag the MPI library accepts. */
int comm_p2p_tag_max(void);
/* Bytes this rank has sent point-to-point since start. */
int64_t comm_p2p_bytes(void);

#endif
