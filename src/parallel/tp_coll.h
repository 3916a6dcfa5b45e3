/* parallel/tp_coll: tensor parallelism's collectives — the implementation of the model's
 * collective interface (model/model_group.h) over the mesh's TP group.
 *
 * Sequence-parallel all-gathers and reduce-scatters and the loss's all-reduces run blocking
 * on the calling (compute) thread; async TP's ring steps go to the comm stream when one is
 * given (its thread moves the block while the caller multiplies), else they are non-blocking
 * point-to-point transfers that MPI advances inside the wait. A simulated link
 * (comm.simulate_*) makes a collective that moved `wire` bytes in `hops` ring steps last at
 * least hops x latency + wire / bandwidth, and a ring step's data arrive no earlier than
 * latency + bytes / bandwidth after it was posted. All of it runs on the compute path, so
 * the time it takes is exposed communication (tp_coll_seconds).
 *
 * Context parallelism uses the same implementation over the mesh's cp group (the trainer's
 * second tp_coll): its K/V all-gathers and dK/dV reduce-scatters, and ring attention's steps;
 * and expert parallelism over the mesh's ep group (a third): the MoE layers' token dispatch
 * and combine (all_to_all_v, blocking on the compute thread), and the dispatch and output
 * gradients' exchange posted to the comm stream when there is one (all_to_all_v_post: its
 * thread moves the rows while the caller computes the shared expert; all_to_all_v_wait).
 */
#ifndef CT_PARALLEL_TP_COLL_H
#define CT_PARALLEL_TP_COLL_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "comm/p2p.h"
#include "comm/stream.h"
#include "model/model_group.h"

struct tp_coll {
	struct model_group ops; /* what the model calls (ops.ctx is this) */
	const struct comm_group *g;
	struct comm_stream *stream; /* async TP's ring steps (NULL: point-to-point) */
	double sim_bytes_per_s, sim_latency_s; /* simulated link (0: off) */
	double timeout_s;
	double comm_s; /* seconds in these collectives so far */
	/* the one operation in flight: async TP's ring step, or expert parallelism's posted
	 * all-to-all (all_to_all_v_post; send and recv unused) */
	struct comm_p2p send, recv;
	int64_t ticket;
	double arrive;
	bool open;
};

/* Over group g (its size and rank); sim_gbps 0: no simulated link. */
void tp_coll_init(struct tp_coll *c, const struct comm_group *g, double sim_gbps,
                  double sim_latency_us, double timeout_s);
/* Run async TP's ring steps and expert parallelism's posted all-to-alls on this stream
 * (comm.progress = thread). */
void tp_coll_use_stream(struct tp_coll *c, struct comm_stream *stream);
/* Seconds spent in the collectives so far (0 for NULL). */
double tp_coll_seconds(const struct tp_coll *c);

#endif
