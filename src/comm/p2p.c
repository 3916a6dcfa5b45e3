#include "comm/p2p.h"

#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/timer.h"
#include "comm/flight.h"
#include "comm/watchdog.h"

_Static_assert(sizeof(MPI_Request) <= sizeof(uint64_t), "MPI_Request fits the opaque slot");

static int64_t p2p_bytes_;

static MPI_Comm p2p_comm(const struct comm_group *g)
{
	return (MPI_Comm)(intptr_t)g->handle;
}

static void p2p_store(struct comm_p2p *r, const struct comm_group *g, int peer, MPI_Request q,
                      int64_t bytes)
{
	r->comm = g->handle;
	r->peer = peer;
	r->req = 0;
	memcpy(&r->req, &q, sizeof(q));
	r->active = true;
	r->bytes = bytes;
}

void comm_p2p_isend(const struct comm_group *g, int peer, int tag, const void *buf, int64_t bytes,
                    struct comm_p2p *r)
{
	CHECK(bytes >= 0 && bytes <= ((int64_t)1 << 30), "p2p: %lld bytes in one message",
	      (long long)bytes);
	MPI_Request q;
	int64_t fr = fr_p2p(g->handle, true, peer, tag, bytes);
	MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, p2p_comm(g), &q);
	__atomic_fetch_add(&p2p_bytes_, bytes, __ATOMIC_RELAXED);
	p2p_store(r, g, peer, q, bytes);
	r->flight = fr;
}

void comm_p2p_irecv(const struct comm_group *g, int peer, int tag, void *buf, int64_t bytes,
                    struct comm_p2p *r)
{
	CHECK(bytes >= 0 && bytes <= ((int64_t)1 << 30), "p2p: %lld bytes in one message",
	      (long long)bytes);
	MPI_Request q;
	int64_t fr = fr_p2p(g->handle, false, peer, tag, bytes);
	MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, p2p_comm(g), &q);
	p2p_store(r, g, peer, q, bytes);
	r->flight = fr;
}

bool comm_p2p_test(struct comm_p2p *r)
{
	if (!r->active)
		return true;
	MPI_Request q;
	memcpy(&q, &r->req, sizeof(q));
	int done = 0;
	MPI_Test(&q, &done, MPI_STATUS_IGNORE);
	memcpy(&r->req, &q, sizeof(q));
	if (done) {
		r->active = false;
		fr_complete(r->flight);
		r->flight = 0;
	}
	return done != 0;
}

static int p2p_watch(void *comm, int peer, const char *what)
{
	MPI_Group grp, world;
	int wr = MPI_UNDEFINED;
	MPI_Comm_group((MPI_Comm)(intptr_t)comm, &grp);
	MPI_Comm_group(MPI_COMM_WORLD, &world);
	MPI_Group_translate_ranks(grp, 1, &peer, world, &wr);
	MPI_Group_free(&grp);
	MPI_Group_free(&world);
	char buf[256];
	snprintf(buf, sizeof(buf), "%s (point-to-point with rank %d)", what, wr);
	return wd_enter_p2p(buf, wr == MPI_UNDEFINED ? -1 : wr);
}

int comm_p2p_watch(const struct comm_group *g, int peer, const char *what)
{
	return p2p_watch(g->handle, peer, what);
}

void comm_p2p_unwatch(int token)
{
	wd_leave(token);
}

void comm_p2p_wait(struct comm_p2p *r, double timeout_s, const char *what)
{
	if (comm_p2p_test(r))
		return;
	double t0 = timer_now(), limit = timeout_s + P2P_GRACE_S;
	int token = r->comm ? p2p_watch(r->comm, r->peer, what) : -1;
	while (!comm_p2p_test(r)) {
		if (timeout_s > 0 && timer_now() - t0 > limit) {
			char msg[512];
			snprintf(msg, sizeof(msg),
			         "comm: %s did not complete within %.0f s (comm.timeout_seconds + "
			         "%.0f s): a peer is dead or stuck",
			         what, limit, P2P_GRACE_S);
			LOG_ERROR("%s; aborting the job", msg);
			comm_flight_dump(msg);
			comm_abort(1);
		}
		/* Spin (yielding) for the first 100 us, then sleep 50 us a round: a rank waiting
		 * in a pipeline bubble frees its core for a rank that shares it (4 ranks on 2
		 * cores), which a sched_yield loop does not under CFS; the pipeline cost model
		 * counts on it (sched_cost_pp.c). */
		if (timer_now() - t0 < 100e-6) {
			sched_yield();
		} else {
			struct timespec ts = {0, 50000};
			nanosleep(&ts, NULL);
		}
	}
	if (token >= 0)
		wd_leave(token);
}

int comm_p2p_tag_max(void)
{
	int *ub = NULL, flag = 0;
	MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
	return flag && ub ? *ub : 32767;
}

int64_t comm_p2p_bytes(void)
{
	return p2p_bytes_;
}
