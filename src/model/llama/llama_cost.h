/* model/llama_cost: the Llama family's figures for the cost model (model/model_cost.h): the
 * work of its units' passes, its activation bytes, its FLOPs per token, its TP programs from
 * the shapes, and the kernels calibration times at its shapes. */
#ifndef CT_MODEL_LLAMA_COST_H
#define CT_MODEL_LLAMA_COST_H

#include "model/model_cost.h"

extern const struct model_cost_ops llama_cost_ops;

/* Context parallelism: the share of the whole sequence's causal attention FLOPs that the
 * critical path's cp rank computes (1 without cp), and llama_cp.c's buffers (bytes). */
double llama_cp_attn_share(const struct model_cost_shape *s);
int64_t llama_cp_buf_bytes(const struct model_config *mc, const struct model_cost_shape *s);

#endif
