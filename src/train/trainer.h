/* train/trainer: the training loop, reading like a script:
 *   build model -> init weights -> open data -> for each step {batches, forward/backward per
 *   micro-batch, clip, AdamW, log}. */
#ifndef CT_TRAIN_TRAINER_H
#define CT_TRAIN_TRAINER_H

#include "io/config.h"
#include "model/model.h"
#include "optim/optim.h"

/* Where `make run` prepares the default corpus; training.dataset = "default" reads it when
 * training.dataset_path is empty. */
#define TRAINER_DEFAULT_DATASET "outputs/data/default"

/* One optimizer step on `accum` micro-batches of (B, T) tokens/targets laid out one after
 * another: zero grads, forward+backward each micro-batch with the loss normalised by the
 * valid tokens of the whole step (counted before any backward), clip to max_norm on the
 * global norm, AdamW at learning rate lr. Returns CT_ERR_RUNTIME on a non-finite loss or
 * gradient norm (parameters are then left untouched). */
int train_step(struct model *m, struct adamw *opt, const int32_t *tokens, const int32_t *targets,
               int64_t accum, double lr, double max_norm, struct train_step_result *res);


/* Runs a whole training job; returns CT_OK, CT_ERR_USAGE or CT_ERR_RUNTIME. */
int trainer_run(const struct ct_config *cfg);

#endif
