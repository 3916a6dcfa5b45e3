/* train/model_spec: the model a run configuration describes, for any family: the family
 * that `[model] name` names (model/model.h's table) converts the config (its from_config:
 * its presets, model.vocab_size and its own `[model]` keys). */
#ifndef CT_TRAIN_MODEL_SPEC_H
#define CT_TRAIN_MODEL_SPEC_H

#include "io/config.h"
#include "model/model.h"

/* The model of any family a config describes; CT_ERR_USAGE naming the key. */
int model_spec_from_config(const struct ct_config *cfg, struct model_config *mc);

#endif
