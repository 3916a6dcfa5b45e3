/* model/hyena_cost: the Hyena family's figures for the cost model (model/model_cost.h): the
 * work of its units' passes, its activation bytes (hyena.c's own carving), its FLOPs per
 * token, its one-segment programs (no tensor parallelism) and the kernels calibration times
 * at its shapes. */
#ifndef CT_MODEL_HYENA_COST_H
#define CT_MODEL_HYENA_COST_H

#include "model/model_cost.h"

extern const struct model_cost_ops hyena_cost_ops;

#endif
