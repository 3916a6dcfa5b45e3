/* train/model_spec: the model a run configuration describes, for any family ([model] name =
 * "llama3" | "hyena"). Llama's part is trainer_model_config (trainer.h). */
#ifndef CT_TRAIN_MODEL_SPEC_H
#define CT_TRAIN_MODEL_SPEC_H

#include "io/config.h"
#include "model/model.h"

/* The Hyena model of a config: the flavor's shape, then model.vocab_size and model.hyena_*
 * overrides; l_max = model.hyena_l_max or training.seq_len. CT_ERR_USAGE naming the key. */
int model_spec_hyena(const struct ct_config *cfg, struct hyena_config *hc);
/* The model of any family a config describes. */
int model_spec_from_config(const struct ct_config *cfg, struct model_config *mc);

#endif
