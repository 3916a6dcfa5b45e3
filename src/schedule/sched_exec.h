/* schedule/sched_exec: the executor — runs a schedule's nodes in order.
 *
 * Compute nodes run on the calling thread, and so do tensor-parallel collectives (TP_*: the
 * activations they move are needed at once) and pipeline transfers (PP_SEND / PP_RECV: posted
 * non-blocking, completed by their WAIT); FSDP collectives are issued to the comm stream and
 * completed by their WAIT node, which blocks on the stream's ticket and then lets the backend
 * finish the collective (copy-out of gathered parameters, accumulation of reduced gradients).
 * What a node *does* belongs to the backend (parallel/fsdp provides one); the executor owns
 * the order, the tickets and the record of when each node ran.
 *
 * Every node's start and end on the calling thread are recorded, and for each collective also
 * when the comm stream actually ran it, so a trace shows compute and communication on
 * separate tracks (schedule/sched_trace).
 */
#ifndef CT_SCHEDULE_SCHED_EXEC_H
#define CT_SCHEDULE_SCHED_EXEC_H

#include <stdint.h>

#include "comm/stream.h"
#include "schedule/schedule.h"

struct sched_backend {
	void *ctx;
	void (*batch)(void *ctx, int micro);
	/* Issue a collective of a bucket on the stream; return its ticket and the bytes this
	 * rank sends into it. Ticket 0: the collective had nothing to move (a group of one
	 * rank) and is complete at once; its WAIT only calls the _done function. */
	int64_t (*all_gather)(void *ctx, int bucket, int64_t *bytes);
	int64_t (*reduce_scatter)(void *ctx, int bucket, int64_t *bytes);
	/* After the ticket completed. */
	void (*all_gather_done)(void *ctx, int bucket);
	void (*reduce_scatter_done)(void *ctx, int bucket);
	void (*free_params)(void *ctx, int bucket);
	/* A unit's pass: op -1 runs all of it; op 2k (lowered schedules) its segment k. */
	void (*forward)(void *ctx, int unit, int op);
	void (*backward)(void *ctx, int unit, int op);
	void (*recompute)(void *ctx, int unit, int op);
	/* Op 2k+1 of the unit's pass program: its tensor-parallel collective k, blocking on the
	 * calling thread, or its expert-parallel all-to-all (blocking, or posted and completed
	 * by a later op's wait); returns the bytes this rank sent (0: the collective had nothing
	 * to do in this step, as the loss gradient's reduce-scatter on one side of the fused
	 * loss, or a wait). */
	int64_t (*tp_collective)(void *ctx, int unit, enum model_pass pass, int op);
	int (*clip)(void *ctx);  /* ct_err code */
	int (*optim)(void *ctx); /* ct_err code */
	/* pipeline steps (SCHED_PP_*): a stage's compute; the issue of a transfer (returns the
	 * bytes it moves); the WAIT that completes one (the executor records how long it
	 * stalled); NULL for backends without pipeline nodes */
	void (*pp_compute)(void *ctx, const struct sched_node *n);
	int64_t (*pp_transfer)(void *ctx, const struct sched_node *n);
	void (*pp_wait)(void *ctx, const struct sched_node *n);
	/* after every node (NULL: none): lets open point-to-point transfers advance */
	void (*progress)(void *ctx);
};

struct sched_record {
	double t0, t1;           /* the node on the calling thread (timer_now seconds) */
	double comm_t0, comm_t1; /* collectives: when the stream ran it; else 0 */
	double comm_cpu;         /* collectives: CPU seconds the stream's thread spent in it */
	int64_t bytes;           /* collectives: bytes this rank sent */
	int64_t ticket;
};

/* Run s; rec (s->n_nodes entries) may be NULL. Returns CT_OK or the first error of a CLIP
 * or OPTIM node (the stream is idle then). */
int sched_exec_run(const struct sched *s, const struct sched_backend *be,
                   struct comm_stream *stream, struct sched_record *rec);

#endif
