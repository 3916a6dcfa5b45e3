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

/* Runs a whole training job; returns CT_OK, CT_ERR_USAGE or CT_ERR_RUNTIME. */
int trainer_run(const struct ct_config *cfg);

#endif
