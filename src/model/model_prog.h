/* model/model_prog: a unit's pass as a program of compute segments and the collectives of a
 * tensor-parallel group between them, so that a schedule carries those collectives as nodes
 * of their own (schedule/schedule.h, SCHED_TP_*): the cost model prices them, the trace shows
 * them, and the passes place the FSDP collectives around them.
 *
 * Pass p of unit u is: segment 0, collective 0, segment 1, ..., collective n-1, segment n.
 * Op 2k is segment k and op 2k+1 collective k; running ops 0..2n in order is the pass. A unit
 * without tensor parallelism is one segment (n = 0). The program depends only on how the
 * model was built (tp degree, async TP, activation checkpointing), never on the data, so it
 * is the same on every rank and at every step.
 */
#ifndef CT_MODEL_MODEL_PROG_H
#define CT_MODEL_MODEL_PROG_H

#include <stdbool.h>
#include <stdint.h>

enum model_pass { MODEL_PASS_FWD, MODEL_PASS_BWD, MODEL_PASS_REC, MODEL_PASS_COUNT };
/* ALL_TO_ALL: expert parallelism's dispatch and combine (role EP), blocking or `post`ed;
 * WAIT completes the posted all-to-all before it (collective k - 1), with nothing of its own
 * on the wire. */
enum model_coll {
	MODEL_COLL_ALL_GATHER,
	MODEL_COLL_REDUCE_SCATTER,
	MODEL_COLL_ALL_TO_ALL,
	MODEL_COLL_WAIT
};

/* The group a collective runs over, and so the link it is priced on: the tensor-parallel
 * group (a program's collectives, lowered into TP_* nodes), the context-parallel group
 * (the K/V transfers of context parallelism: program collectives, lowered into CP_* nodes;
 * the ring's are fused with the attention of the shard held, as async TP's with a matmul),
 * or the expert-parallel group (a MoE layer's token dispatch and combine: program
 * collectives, lowered into EP_* nodes, and the row counts' exchange before them, inside the
 * first segment, which unit_inner lists; all on the ep link). */
enum model_group_role { MODEL_GROUP_TP, MODEL_GROUP_CP, MODEL_GROUP_EP };

/* When a collective runs: always, or only on one side of the fused loss gradient (the head's
 * reduce-scatter of d(norm output) runs in forward when the step's loss scale is known before
 * the forward, as in a training step, and in backward otherwise; the other is a no-op). */
enum model_coll_when { MODEL_COLL_ALWAYS, MODEL_COLL_IF_FUSED, MODEL_COLL_IF_NOT_FUSED };

#define MODEL_PROG_MAX 12 /* collectives of one pass (a TP x CP block's backward has 10) */

struct model_coll_desc {
	enum model_coll kind;
	enum model_coll_when when;
	int64_t bytes;     /* what this rank sends: (group - 1) blocks of `bytes / (group - 1)` */
	int group;         /* ranks in the group */
	bool ring;         /* async TP: group ring steps fused with the matmul beside it */
	double ring_flops; /* ring: FLOPs of that matmul on this rank (what hides the steps) */
	enum model_group_role role; /* TP (0) unless set */
	/* CP: steps > 0: that many transfers of bytes / steps each, a latency each (the K and
	 * V all-gathers, or ring steps; 0: one collective); with ring, each step hidden by
	 * 1 / steps of ring_flops of attention (the K/V shard travels while the one held is
	 * attended to) */
	int steps;
	/* CP ring, backward: the dK/dV that follow each shard round the ring after its
	 * gradient is computed, group steps of back_bytes / group each (the last brings it
	 * home), each waited for at once: exposed */
	int64_t back_bytes;
	/* ALL_TO_ALL: issued on the comm stream and completed by the program's next collective,
	 * a WAIT, so that the segment between them runs while it travels (false: blocking) */
	bool post;
};

struct model_prog {
	int n; /* collectives; the pass has n + 1 segments */
	struct model_coll_desc c[MODEL_PROG_MAX];
};

#endif
