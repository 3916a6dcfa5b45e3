/* train/trainer: the training loop, reading like a script:
 *   build model -> init weights -> open data -> for each step {batches, forward/backward per
 *   micro-batch, clip, AdamW, log}. */
#ifndef CT_TRAIN_TRAINER_H
#define CT_TRAIN_TRAINER_H

#include "io/config.h"
#include "model/model.h"
#include "train/optim.h"

/* Where `make run` prepares the default corpus; training.dataset = "default" reads it when
 * training.dataset_path is empty. */
#define TRAINER_DEFAULT_DATASET "outputs/data/default"

struct train_step_result {
	double loss;      /* sum of token losses / valid tokens of the whole step */
	double grad_norm; /* before clipping */
	int64_t valid;    /* valid target tokens in the step */
};

/* One optimizer step on `accum` micro-batches of (B, T) tokens/targets laid out one after
 * another: zero grads, forward+backward each micro-batch with the loss normalised by the
 * valid tokens of the whole step (counted before any backward), clip to max_norm on the
 * global norm, AdamW at learning rate lr. Returns CT_ERR_RUNTIME on a non-finite loss or
 * gradient norm (parameters are then left untouched). */
int train_step(struct model *m, struct adamw *opt, const int32_t *tokens, const int32_t *targets,
               int64_t accum, double lr, double max_norm, struct train_step_result *res);

/* The Llama model a config describes ([model] flavor, vocab_size, rope_scaling); a Hyena
 * config is CT_ERR_USAGE ("not yet supported" by the commands that only serve Llama). */
int trainer_model_config(const struct ct_config *cfg, struct llama_config *mc);
/* (any family: train/model_spec.h) */

/* Runs a whole training job; returns CT_OK, CT_ERR_USAGE or CT_ERR_RUNTIME. */
int trainer_run(const struct ct_config *cfg);

#endif
