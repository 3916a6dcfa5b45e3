/* schedule: the training step as an explicit list of nodes (SimpleFSDP in C).
 *
 * A step is a flat list of nodes — collectives (ALL_GATHER, REDUCE_SCATTER), WAITs on them,
 * FREEs of gathered parameters, compute (FWD, BWD, RECOMPUTE of a model unit), the micro-batch
 * load (BATCH), and the tail (CLIP, OPTIM) — in issue order. Collectives act on *buckets*: a
 * contiguous range of model units whose parameters are gathered and whose gradients are
 * reduce-scattered as one flat buffer.
 *
 * sched_build emits the naive step (one bucket per unit, every collective waited on at once,
 * FSDP's reshard policy); the passes in sched_pass.h rewrite the list (bucketing, activation
 * checkpointing, reordering); the cost model (sched_cost.h) predicts its timeline and memory;
 * the executor (sched_exec.h) runs it. The schedule owns no tensors: it names units and
 * buckets, and the executor's backend owns the buffers.
 *
 * A WAIT names the collective it completes by (kind, bucket): at most one all-gather and one
 * reduce-scatter per bucket are in flight at any time (sched_validate checks this, and every
 * other rule the executor relies on). Tensor, context and expert parallelism add their
 * collectives inside a unit as nodes (SCHED_TP_*, SCHED_CP_*, SCHED_EP_*, by lowering the
 * unit's pass program after the passes).
 *
 * Pipeline parallelism is the same list with node kinds of its own (SCHED_PP_*, built from a
 * rank's action list of schedule/pp_schedule.h by sched_build_pp, schedule/sched_pp.c): the
 * forward (F), backward (B) or its input (I) and weight (W) halves of micro-batch `micro` on
 * stage `stage`, and the point-to-point SEND / RECV of a stage boundary (phase FWD: the
 * activation to the next stage; BWD: the input gradient to the previous one), each completed
 * by a WAIT naming it; a pipeline rank's buckets are its virtual stages, gathered before the
 * first action and reduce-scattered after the last.
 */
#ifndef CT_SCHEDULE_SCHEDULE_H
#define CT_SCHEDULE_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model_ac.h"
#include "model/model_prog.h"

enum sched_kind {
	SCHED_BATCH,          /* load micro-batch `micro` into the model */
	SCHED_ALL_GATHER,     /* issue the all-gather of bucket's parameters */
	SCHED_REDUCE_SCATTER, /* issue the reduce-scatter of bucket's gradients (frees them) */
	SCHED_WAIT,           /* block until (wait_kind, bucket) completes, then finish it */
	SCHED_FREE,           /* release bucket's gathered parameters */
	SCHED_FWD,            /* forward of `unit` */
	SCHED_BWD,            /* backward of `unit` */
	SCHED_RECOMPUTE,      /* re-derive `unit`'s dropped activations before its backward */
	SCHED_CLIP,           /* reduce loss and gradient norm, compute the clip coefficient */
	SCHED_OPTIM,          /* AdamW on the shards */
	/* tensor parallelism (after sched_lower_tp): collective `seg` of `unit`'s pass, between
	 * its compute segments `seg` and `seg + 1`, on the TP group and the compute thread */
	SCHED_TP_ALL_GATHER,
	SCHED_TP_REDUCE_SCATTER,
	/* context parallelism (after sched_lower_tp): a block's K/V transfer on the cp group —
	 * the all-gather of K and V, the reduce-scatter of dK and dV, or the ring whose steps
	 * travel beside the attention of the shard held (the attention inside the node) */
	SCHED_CP_ALL_GATHER,
	SCHED_CP_REDUCE_SCATTER,
	SCHED_CP_RING,
	/* expert parallelism (after sched_lower_tp): a MoE unit's all-to-all on the ep group,
	 * blocking, or posted to the comm stream and completed by the EP_WAIT after the
	 * segment that runs while it travels (the dispatch beside the shared expert) */
	SCHED_EP_ALL_TO_ALL,
	SCHED_EP_WAIT,
	/* pipeline parallelism: compute of (stage, micro) over the stage's units, and the
	 * transfers of its boundary (issued here, completed by a WAIT with this wait_kind) */
	SCHED_PP_F,
	SCHED_PP_B,
	SCHED_PP_I,
	SCHED_PP_W,
	SCHED_PP_SEND,
	SCHED_PP_RECV,
	SCHED_KIND_COUNT
};

enum sched_phase { SCHED_PH_FWD, SCHED_PH_BWD, SCHED_PH_TAIL };

struct sched_node {
	enum sched_kind kind;
	enum sched_kind wait_kind; /* WAIT: SCHED_ALL_GATHER, _REDUCE_SCATTER, _PP_SEND, _PP_RECV */
	int unit;                  /* FWD, BWD, RECOMPUTE; else -1 */
	int bucket;                /* collectives, WAIT, FREE; else -1 */
	int micro;                 /* micro-batch index */
	enum sched_phase phase;
	bool recompute; /* ALL_GATHER in backward that re-gathers what forward freed (reshard
	                   after forward = "the all-gather is recomputed in backward") */
	/* lowered schedules: FWD, BWD, RECOMPUTE run segment `seg` of the unit's pass program
	 * (model/model_prog.h), TP_* its collective `seg`; `pass` names the program */
	int seg;
	enum model_pass pass;
	int stage; /* SCHED_PP_* and their WAITs: the pipeline stage (phase: the direction) */
};

struct sched_unit {
	int64_t full_numel;  /* parameters of the unit */
	int64_t shard_numel; /* this rank's (padded) shard of them; every rank's is the same size */
	/* the elements the other ranks of its shard groups hold, what its all-gather receives
	 * (0: (dp_shard - 1) x shard_numel, one group); under ep the expert tensors' group is
	 * efsdp = dp_shard / ep ranks */
	int64_t peer_numel;
	bool is_block;       /* a transformer block (activation checkpointing applies) */
	/* per pass (MODEL_PASS_*): its program's collectives (TP, CP, EP; n = 0: none) */
	struct model_prog prog[MODEL_PASS_COUNT];
};

struct sched_bucket {
	int unit0, n_units; /* units [unit0, unit0 + n_units) */
};

/* A collective between two segments of a unit's pass program (TP_*, CP_*, EP_*). */
static inline bool sched_kind_in_unit(enum sched_kind k)
{
	return k >= SCHED_TP_ALL_GATHER && k <= SCHED_EP_WAIT;
}

static inline bool sched_kind_pp(enum sched_kind k)
{
	return k >= SCHED_PP_F && k <= SCHED_PP_RECV;
}
/* A pipeline node that computes (F, B, I, W). */
static inline bool sched_kind_pp_compute(enum sched_kind k)
{
	return k >= SCHED_PP_F && k <= SCHED_PP_W;
}

enum sched_reshard { SCHED_RESHARD_DEFAULT, SCHED_RESHARD_ALWAYS, SCHED_RESHARD_NEVER };

struct sched {
	int n_units, n_micro;
	struct sched_unit *units;
	int n_buckets;
	struct sched_bucket *buckets;
	enum sched_reshard reshard;
	enum model_ac ac; /* set by the activation-checkpointing pass */
	int ac_every;     /* with it: MODEL_AC_LAYER's N (model/model_ac.h) */
	int prefetch;     /* set by the reordering pass (for printing) */
	bool lowered;     /* sched_lower_tp ran: TP units' passes are segments and TP nodes */
	/* a pipeline rank's step (sched_build_pp): n_stages stages over pp_size ranks, this is
	 * rank pp_rank; bucket c is its virtual stage c (stage c * pp_size + pp_rank). 0: none */
	int n_stages, pp_size, pp_rank;
	bool forward_only; /* a pipeline evaluation: forwards and their transfers, no tail */
	int n_nodes, cap;
	struct sched_node *nodes;
};

/* The naive step: one bucket per unit; per micro-batch, forward in unit order
 * (ALL_GATHER, WAIT, FWD, FREE per the reshard policy), backward in reverse (re-gather if
 * freed, BWD, REDUCE_SCATTER, WAIT, FREE); then CLIP, OPTIM. `units` is copied. */
void sched_build(struct sched *s, const struct sched_unit *units, int n_units, int n_micro,
                 enum sched_reshard reshard);
void sched_free(struct sched *s);
/* Re-derive every ALL_GATHER, its WAIT and every FREE of `in` from its compute nodes, buckets
 * and reshard policy: a bucket is gathered before the first node that needs it and not
 * resident (in backward that gather is a recomputation: `recompute`), freed after its last
 * forward unit if the policy reshards it, after its reduce-scatter unless the policy is
 * `never`, and before CLIP otherwise. Passes that change buckets or compute call it; the
 * reordering pass runs after them. */
void sched_place_gathers(const struct sched *in, struct sched *out);
/* Lowering, after every pass: each FWD, BWD and RECOMPUTE of a unit whose pass has tensor-
 * parallel collectives becomes its program — segment 0, TP collective 0, segment 1, ... —
 * so the executor runs the collectives as nodes, the trace shows them and the cost model
 * times them on the compute thread. Units without collectives keep one node. Lowering a
 * lowered schedule copies it. */
void sched_lower_tp(const struct sched *in, struct sched *out);
/* The program pass a compute node runs. */
enum model_pass sched_node_pass(const struct sched_node *n);
/* The unit's program for node n's pass (n: FWD, BWD, RECOMPUTE or TP_*). */
const struct model_prog *sched_node_prog(const struct sched *s, const struct sched_node *n);

/* An empty schedule with s's units and buckets, for a pass to append nodes to. */
void sched_init_like(struct sched *dst, const struct sched *src);
void sched_copy(struct sched *dst, const struct sched *src);
void sched_push(struct sched *s, struct sched_node n);
/* Replace *s by *next (frees the old one). */
void sched_replace(struct sched *s, struct sched *next);

/* Check the invariants the executor relies on; returns false and fills why (if not NULL).
 * A pipeline step is checked by sched_validate_pp. */
bool sched_validate(const struct sched *s, char *why, size_t why_size);

/* Pipeline parallelism (schedule/sched_pp.c). Pipeline rank `rank`'s step of the checked
 * action lists ps: the units (n_units, copied) are the whole model's, stage k holds units
 * [stage_u0[k], stage_u0[k + 1]); the rank's virtual stages are its buckets. The nodes: every
 * bucket's ALL_GATHER and WAIT; the rank's actions in order, each compute action of a stage
 * that receives its input (F of stage > 0) or its output's gradient (B, I of stage < S - 1)
 * after the WAIT of that RECV; the WAITs of every SEND; every bucket's REDUCE_SCATTER and
 * WAIT; CLIP, OPTIM. */
struct pp_sched;
void sched_build_pp(struct sched *out, const struct pp_sched *ps, int rank,
                    const struct sched_unit *units, int n_units, const int *stage_u0);
/* Per rank: every transfer issued once and waited once after its issue, every compute action
 * of each (stage, micro) once in dependency order (F before B or I, I before W, a RECV's WAIT
 * before the compute that reads it, a SEND after the compute that writes it), the buckets
 * gathered before and reduce-scattered after every compute node, CLIP and OPTIM last (a
 * forward-only step: every F once, no backward, no reduce-scatter, CLIP or OPTIM). Across
 * ranks (that sends match receives and nothing deadlocks) the action lists are checked by
 * pp_sched_check. */
bool sched_validate_pp(const struct sched *s, char *why, size_t why_size);

/* Elements of a bucket: full parameters, and one rank's shard. */
int64_t sched_bucket_full(const struct sched *s, int b);
int64_t sched_bucket_shard(const struct sched *s, int b);
/* The bucket holding unit u. */
int sched_bucket_of(const struct sched *s, int u);

const char *sched_kind_name(enum sched_kind k);
const char *sched_ac_name(enum model_ac a);
/* The name, with MODEL_AC_LAYER's N (buf of n bytes; returns buf). */
const char *sched_ac_label(enum model_ac a, int every, char *buf, size_t n);
int sched_ac_parse(const char *name, enum model_ac *a);
/* Short label of node i, e.g. "AG b3" or "FWD u2" (buf >= 32 bytes). */
void sched_node_label(const struct sched *s, int i, char *buf, size_t size);
/* Bucket b as the config writes it, e.g. "embed+0" or "5+norm". */
void sched_bucket_name(const struct sched *s, int b, char *buf, size_t size);
/* One line per node (micro-batch 0 and the tail only when brief). */
void sched_print(const struct sched *s, FILE *f, bool brief);

#endif
