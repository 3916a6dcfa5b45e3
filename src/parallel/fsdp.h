/* parallel/fsdp: Fully Sharded Data Parallel (ZeRO-3, FSDP2 semantics) over the mesh's
 * dp_shard group, with HSDP replicas over dp_replicate.
 *
 * Sharding: every parameter is split on dim 0 into chunks of ceil(rows/N) rows; rank r owns
 * rows [r*chunk, min(rows, (r+1)*chunk)), zero-padded to `chunk` rows so every rank's shard of
 * a unit has the same size. A unit's shards are contiguous in this rank's shard buffer, in
 * table order. Master parameters, gradients and AdamW moments exist only as shards.
 *
 * Per unit: gather = copy-in the unit's shards (as fp32 or bf16) into one flat send buffer,
 * all-gather, copy-out into a full-parameter slot (bf16 widened to fp32); after backward,
 * reduce-scatter the unit's full gradients (fp32, rank-major with padding) and add them to
 * the shard gradients (all-reduced across replicas first under HSDP); then free the slots.
 *
 * The step is a schedule (schedule/): its engine (fsdp_engine) runs f->sched through the executor,
 * with this module as the executor's backend. Collectives act on the schedule's buckets (runs
 * of adjacent units): a bucket's shards are contiguous in the shard buffer, so its all-gather
 * sends one contiguous slice, and its reduce-scatter sums every element in the same ring
 * order as a per-unit one — bucketing and reordering change no result bit.
 * Buffers (gathered parameters, unsharded gradients, collective send/recv buffers) come from
 * pools of the largest bucket's size, allocated on first use: the number ever allocated is
 * the schedule's peak of that kind in use.
 *
 * Expert parallelism (mesh->ep > 1; ep borrows from the shard group): the model holds only its
 * ep rank's routed experts (table entries marked `expert`), so every parameter belongs to one
 * of two shard groups — dense parameters to the whole shard group, expert parameters to the
 * efsdp group (the shard ranks that hold the same experts, size shard / ep) — and is chunked
 * over its group's size. Each unit's shard keeps table order; on the wire (and in the
 * reduce-scatter's send buffer) a bucket's chunks are packed group by group, so a bucket's
 * all-gather and reduce-scatter are one collective per group (enqueued back to back; the
 * second ticket completes both). An expert's gradient already holds the contributions of all
 * the ep group's tokens (they were sent to it), so summing it over efsdp (and the replicas)
 * is the whole batch's, with the same 1/valid-tokens scale as the dense gradients: no divide
 * by a group size anywhere (pytorch#160285 is the expert gradients off by the ep factor).
 * The gradient norm sums every element once over the shard group as before.
 *
 * fp8 all-gather (fsdp_set_fp8_all_gather; torchao's enable_fsdp_float8_all_gather): the
 * float8 linears' weights travel as e4m3 bytes, cast with the tensorwise scale of the WHOLE
 * weight; the scales come from one all-reduce (max) over dp_shard of every float8 weight's
 * local amax, once per step (torchao's precompute_float8_dynamic_scale_for_fsdp), so every
 * rank already holds them and only the fp8 bytes are gathered. The copy-out writes the fp8
 * values (exact floats) into the full-parameter slot and marks the weight prepared with its
 * scale (kernels/fp8_linear.h): the linear computes on exactly the gathered values. Other
 * parameters keep the fp32/bf16 wire format. The wire layout of a unit's shard: each
 * parameter's chunk at a byte offset (wire_off), 1, 2 or 4 bytes per element.
 */
#ifndef CT_PARALLEL_FSDP_H
#define CT_PARALLEL_FSDP_H

#include <stdbool.h>
#include <stdint.h>

#include "base/mem.h"
#include "comm/comm.h"
#include "comm/stream.h"
#include "model/model.h"
#include "parallel/engine.h"
#include "schedule/sched_exec.h"
#include "schedule/schedule.h"
#include "optim/optim.h"

enum fsdp_reshard { FSDP_RESHARD_DEFAULT, FSDP_RESHARD_ALWAYS, FSDP_RESHARD_NEVER };

struct fsdp_param {
	int64_t rows, cols, chunk_rows, my_rows; /* my_rows: valid rows this rank owns */
	int64_t full_off;                        /* offset inside the unit's full buffer */
	int64_t shard_off; /* offset inside the unit's shard (per rank: chunk_rows*cols each) */
	int64_t wire_off;  /* byte offset of this chunk in the unit's all-gather block */
	bool decay;
	bool fp8; /* gathered as fp8 (a float8 linear's weight under the fp8 all-gather) */
	int grp;  /* its shard group: 0 the shard group, 1 efsdp (an expert tensor under ep) */
	int64_t pack_off; /* element offset of this chunk in its unit's block of its group */
};

struct fsdp_unit {
	int first_param, n_params;
	int64_t full_numel, shard_numel;
	int64_t shard_base; /* offset of this unit's shard in the rank's shard buffers */
	int64_t wire_bytes; /* bytes of this unit's shard on the all-gather wire */
	int64_t grp_numel[2], grp_wire[2]; /* its chunks' elements and wire bytes per group */
};

/* Buffers of one kind, each `bytes` long, allocated on first use. */
struct fsdp_pool {
	enum mem_cat cat;
	size_t bytes;
	int n;
	void **buf;
	bool *busy;
};

/* A bucket's buffers while gathered / reduced (pool indices, -1 if none) and tickets. */
struct fsdp_bucket_state {
	int w, g, ag_send, ag_recv, rs_send, rs_recv;
	int w16; /* bf16 compute: the gathered weights' bf16 twin (kernels/mm_engine.h) */
};

struct fsdp {
	const struct mesh *mesh;
	struct model *model;
	struct comm_stream *stream;
	struct fsdp_param *p; /* one per table entry */
	struct fsdp_unit *u;
	int n_units;
	bool bf16;
	bool fp8_ag;       /* fp8 all-gather of the float8 linears' weights */
	float *fp8_scale;  /* per table entry: this step's tensorwise scale (fp8 ones) */
	float *fp8_amax;   /* scratch: local amax of each fp8 parameter, then the global one */
	int n_fp8;         /* parameters gathered as fp8 */
	enum fsdp_reshard reshard;
	/* the two shard groups (parameter grp 0, 1: without ep both are the shard group), their
	 * sizes and this rank's place in each */
	bool ep;
	const struct comm_group *gg[2];
	int gn[2], gr[2];
	int64_t shard_numel;      /* this rank's total shard elements (with padding) */
	float *shard_w, *shard_g; /* master params, gradients (MEM_PARAMS, MEM_GRADS) */
	/* the family's per-step statistics (model_step_stats), summed over dp_group after
	 * AdamW and handed to model_after_step (n_stats = 0: the family has none) */
	double *stats;
	int64_t n_stats;
	/* the step */
	struct sched sched;       /* after passes; empty until set or first step */
	struct sched_record *rec; /* per node of the last step */
	struct fsdp_bucket_state *bs;
	struct fsdp_pool pw, pg, ag_send, ag_recv, rs_send, rs_recv, pw16;
	/* per-step context of the backend */
	struct fsdp_step_ctx {
		const int32_t *tokens, *targets;
		struct adamw *opt;
		double lr, max_norm, dscale, loss_sum, gscale;
		int64_t valid;
		struct train_step_result *res;
	} step;
};

/* Plan the shards for model m (built with own_params = false) and allocate everything. */
int fsdp_build(struct fsdp *f, struct model *m, const struct mesh *mesh, bool bf16,
               enum fsdp_reshard reshard, struct comm_stream *stream);
void fsdp_free(struct fsdp *f);
/* Gather the float8 linears' weights (model_fp8_linear) as fp8; before the first step. */
void fsdp_set_fp8_all_gather(struct fsdp *f, bool on);
int fsdp_reshard_parse(const char *name, enum fsdp_reshard *r);

/* The units as the schedule sees them (n_units entries). */
void fsdp_sched_units(const struct fsdp *f, struct sched_unit *out);
/* The naive schedule for `accum` micro-batches under f's reshard policy and the model's
 * activation checkpointing (the passes' input). */
void fsdp_naive_schedule(const struct fsdp *f, int accum, struct sched *s);
/* Use s (copied) for the following steps. CT_ERR_USAGE if it does not validate, does not
 * match the model's activation checkpointing, or buffers are in use. */
int fsdp_set_schedule(struct fsdp *f, const struct sched *s);

/* Initialise this rank's shards with the model's init (same values as a 1-rank init). */
void fsdp_init_params(struct fsdp *f, uint64_t seed);

/* The layout's engine (parallel/engine.h): a step over `accum` micro-batches
 * (tokens/targets laid out one after another) runs the schedule — gathers, forward/backward
 * per unit, reduce-scatters, then global-norm clipping and AdamW on the shards. Loss and
 * valid tokens are reduced over all data-parallel ranks. Without a schedule for `accum`
 * micro-batches, the naive one is built. Node times of the step are left in f->rec. */
void fsdp_engine(struct fsdp *f, struct engine *e);

/* Forward only over one micro-batch (evaluation): returns the sum of token losses and sets
 * *valid; no gradients. */
double fsdp_eval_loss(struct fsdp *f, const int32_t *tokens, const int32_t *targets,
                      int64_t *valid);

/* Where this rank's rows of table tensor i live: rows [*row0, *row0 + *nrows), stored at
 * element *at of the shard buffers (shard_w, shard_g, and optimizer moments alike). */
void fsdp_local_rows(const struct fsdp *f, int i, int64_t *row0, int64_t *nrows, int64_t *at);

/* Gather the full flat parameter buffer (table layout) onto every rank (tests, export); under
 * expert parallelism in the global table's layout (all E experts: the experts' pieces are
 * gathered over the ep group too). */
void fsdp_gather_full(struct fsdp *f, float *out);

#endif
