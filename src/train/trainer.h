/* train/trainer: the training loop, reading like a script:
 *   build model -> init weights -> open data -> for each step {batches, forward/backward per
 *   micro-batch, clip, AdamW, log}. */
#ifndef CT_TRAIN_TRAINER_H
#define CT_TRAIN_TRAINER_H

#include "io/config.h"

/* Runs a whole training job; returns CT_OK, CT_ERR_USAGE or CT_ERR_RUNTIME. */
int trainer_run(const struct ct_config *cfg);

#endif
