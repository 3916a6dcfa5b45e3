/* The trainer's state, shared by train/trainer.c (set-up, the step loop) and
 * train/trainer_ckpt.c (checkpoint save, load and resume glue). Private to train/. */
#ifndef CT_TRAIN_TRAINER_IMPL_H
#define CT_TRAIN_TRAINER_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "comm/comm.h"
#include "comm/stream.h"
#include "data/loader.h"
#include "model/model.h"
#include "optim/optim.h"
#include "parallel/engine.h"
#include "parallel/fsdp.h"
#include "parallel/pp.h"
#include "parallel/tp_coll.h"
#include "schedule/sched_cost.h"
#include "train/checkpoint.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"

struct trainer {
	struct model_step_metric model_figs[32]; /* the family's figures of the last step */
	const struct ct_config *cfg;
	struct mesh mesh;
	struct comm_stream *stream;
	struct comm_stream *ep_stream; /* expert parallelism's posted all-to-alls (comm thread) */
	struct model model;
	struct tp_coll tp; /* tensor parallelism's collectives (mesh.tp > 1) */
	/* context parallelism (mesh.cp > 1): its collectives over the cp group, the token order
	 * (seq_len, rank-major, parallel/cp.h), and whole sequences before this rank's tokens
	 * are taken from them (accum x B x seq_len) */
	struct tp_coll cp;
	struct tp_coll ep; /* expert parallelism's all-to-alls over the ep group (mesh.ep > 1) */
	int64_t *cp_order;
	int32_t *cp_tokens, *cp_targets;
	struct fsdp fsdp; /* used when the data-parallel world has more than one rank */
	bool sharded;
	struct pp pp; /* pipeline parallelism (parallelism.pipeline_parallel_degree > 1) */
	struct engine engine; /* the step of whichever layout (parallel/engine.h) */
	struct sched_pp_link pp_link;       /* pipeline: the stage link of its cost model */
	struct sched_pp_prediction pp_pred; /* and its prediction of the step */
	bool piped;
	struct sched_cost_model cost; /* the step's cost model, when the config needs one */
	bool have_cost;
	struct adamw opt;
	struct lr_schedule lr;
	struct loader *train_ld; /* a shard folder */
	struct loader *val_ld;   /* its val split, when validation is on */
	struct metrics metrics;
	int64_t accum; /* micro-batches per step and rank */
	int64_t dp;    /* data-parallel ranks */
	double flops_per_token, peak_flops;
	int32_t *batch_tokens, *batch_targets; /* accum x N */
	struct ckpt_async *ckpt_async;         /* checkpoint.async_mode = "async" */
	int64_t lr_step0; /* the LR schedule's step 0 (checkpoint.exclude_from_loading) */
	FILE *sample_log; /* debug.sample_log */
	int64_t *samples; /* the dataset samples of this rank's current batch (accum x B) */
};

/* train/trainer_ckpt.c: the tensors a checkpoint holds (from the model's table, a TP rank's
 * pieces placed in the global tensors); the first step's load (checkpoint.initial_load_path,
 * a Hugging Face folder, or a resumable step); save after steps_done. */
struct ckpt_tensor *trainer_ckpt_tensors(struct trainer *tr);
int trainer_initial_load(struct trainer *tr, int64_t *first_step, struct step_metrics *sm);
int trainer_resume(struct trainer *tr, int64_t *first_step, struct step_metrics *sm);
int trainer_save(struct trainer *tr, int64_t steps_done, const struct step_metrics *sm);

#endif
