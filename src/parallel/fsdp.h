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
 * Slots come from a pool planned at build: one unit's worth per concurrently gathered unit.
 */
#ifndef CT_PARALLEL_FSDP_H
#define CT_PARALLEL_FSDP_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "comm/stream.h"
#include "model/model.h"
#include "train/optim.h"

enum fsdp_reshard { FSDP_RESHARD_DEFAULT, FSDP_RESHARD_ALWAYS, FSDP_RESHARD_NEVER };

struct fsdp_param {
	int64_t rows, cols, chunk_rows, my_rows; /* my_rows: valid rows this rank owns */
	int64_t full_off;                        /* offset inside the unit's full buffer */
	int64_t shard_off; /* offset inside the unit's shard (per rank: chunk_rows*cols each) */
	bool decay;
};

struct fsdp_unit {
	int first_param, n_params;
	int64_t full_numel, shard_numel;
	int64_t shard_base; /* offset of this unit's shard in the rank's shard buffers */
	int w_slot, g_slot; /* slot index while gathered / while gradients exist, else -1 */
};

struct fsdp {
	const struct mesh *mesh;
	struct model *model;
	struct comm_stream *stream;
	struct fsdp_param *p; /* one per table entry */
	struct fsdp_unit *u;
	int n_units;
	bool bf16;
	enum fsdp_reshard reshard;
	int64_t shard_numel;      /* this rank's total shard elements (with padding) */
	float *shard_w, *shard_g; /* master params, gradients (MEM_PARAMS, MEM_GRADS) */
	int64_t max_full, max_shard;
	/* slot pools */
	int n_wslots, n_gslots;
	float **wslot, **gslot;
	bool *wslot_busy, *gslot_busy;
	/* comm buffers (MEM_COMM) */
	void *ag_send, *ag_recv;
	float *rs_send, *rs_recv, *rs_scratch;
};

/* Plan the shards for model m (built with own_params = false) and allocate everything. */
int fsdp_build(struct fsdp *f, struct model *m, const struct mesh *mesh, bool bf16,
               enum fsdp_reshard reshard, struct comm_stream *stream);
void fsdp_free(struct fsdp *f);
int fsdp_reshard_parse(const char *name, enum fsdp_reshard *r);

/* Initialise this rank's shards with the model's init (same values as a 1-rank init). */
void fsdp_init_params(struct fsdp *f, uint64_t seed);

/* One training step over `accum` micro-batches (tokens/targets laid out one after another):
 * gathers, forward/backward per unit, reduce-scatters, then global-norm clipping and AdamW on
 * the shards. Loss and valid tokens are reduced over all data-parallel ranks. */
struct train_step_result;
int fsdp_train_step(struct fsdp *f, struct adamw *opt, const int32_t *tokens,
                    const int32_t *targets, int64_t accum, double lr, double max_norm,
                    struct train_step_result *res);

/* Forward only over one micro-batch (evaluation): returns the sum of token losses and sets
 * *valid; no gradients. */
double fsdp_eval_loss(struct fsdp *f, const int32_t *tokens, const int32_t *targets,
                      int64_t *valid);

/* Where this rank's rows of table tensor i live: rows [*row0, *row0 + *nrows), stored at
 * element *at of the shard buffers (shard_w, shard_g, and optimizer moments alike). */
void fsdp_local_rows(const struct fsdp *f, int i, int64_t *row0, int64_t *nrows, int64_t *at);

/* Gather the full flat parameter buffer (table layout) onto every rank (tests, export). */
void fsdp_gather_full(struct fsdp *f, float *out);

#endif
