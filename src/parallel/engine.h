/* parallel/engine: the one training step of every layout.
 *
 * A layout (FSDP with its one-shard case for one rank, HSDP, TP inside it; a pipeline rank,
 * with FSDP inside its stages) is a backend of the one executor (schedule/sched_exec.h): it
 * owns the buffers and supplies what each node does; its schedule says in which order. A
 * step is always: the layout's set-up for the step (`begin`: the batch, the valid-token count
 * over the data-parallel ranks, the loss scale, zeroed gradients; it returns the schedule and
 * the record to fill), then the executor runs every node, down to CLIP (optim/grad_norm)
 * and OPTIM. The trainer, the tests and the benchmarks call engine_step and nothing else.
 */
#ifndef CT_PARALLEL_ENGINE_H
#define CT_PARALLEL_ENGINE_H

#include <stdint.h>

#include "comm/stream.h"
#include "model/model.h"
#include "optim/optim.h"
#include "schedule/sched_exec.h"

struct engine_step_in {
	const int32_t *tokens, *targets; /* the rank's rows of the step, micro-batch after
	                                    micro-batch (accum of the model's B x T) */
	int64_t accum;                   /* micro-batches of B x T */
	struct adamw *opt;
	double lr, max_norm;
	struct train_step_result *res; /* loss and grad norm, the same on every rank */
};

struct engine {
	void *ctx;
	/* Set up the step; the schedule to run and its record (n_nodes entries, or NULL). */
	int (*begin)(void *ctx, const struct engine_step_in *in, const struct sched **s,
	             struct sched_record **rec);
	struct sched_backend be; /* be.ctx = ctx */
	struct comm_stream *stream; /* the layout's comm stream (NULL: it issues none) */
};

/* One optimizer step. CT_ERR_RUNTIME on a non-finite loss or norm (from CLIP). */
int engine_step(const struct engine *e, const struct engine_step_in *in);

#endif
