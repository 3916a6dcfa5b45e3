/* model/moe_cost: the deepseek_v3 (mixture-of-experts) family's figures for the cost model
 * (model/model_cost.h): the work of its units' passes over the active parameters (router,
 * the top-k routed experts a token runs through, the shared experts), its activation bytes
 * (moe.c's own carving, moe_activation_bytes), its FLOPs per token, its one-segment programs
 * (no tensor parallelism), the per-MoE-layer all-to-alls of expert parallelism (role
 * MODEL_GROUP_EP) and the kernels calibration times at its shapes. */
#ifndef CT_MODEL_MOE_COST_H
#define CT_MODEL_MOE_COST_H

#include "model/model_cost.h"

extern const struct model_cost_ops moe_cost_ops;

#endif
