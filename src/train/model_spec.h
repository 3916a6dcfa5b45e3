/* train/model_spec: the model a run configuration describes, for any family ([model] name =
 * "llama3" | "hyena"). */
#ifndef CT_TRAIN_MODEL_SPEC_H
#define CT_TRAIN_MODEL_SPEC_H

#include "io/config.h"
#include "model/model.h"

/* The Llama model a config describes ([model] flavor, vocab_size, rope_scaling); a Hyena
 * config is CT_ERR_USAGE ("not yet supported" by the commands that only serve Llama). */
int model_spec_llama(const struct ct_config *cfg, struct llama_config *mc);
/* The Hyena model of a config: the flavor's shape, then model.vocab_size and model.hyena_*
 * overrides; l_max = model.hyena_l_max or training.seq_len. CT_ERR_USAGE naming the key. */
int model_spec_hyena(const struct ct_config *cfg, struct hyena_config *hc);
/* The model of any family a config describes. */
int model_spec_from_config(const struct ct_config *cfg, struct model_config *mc);

#endif
