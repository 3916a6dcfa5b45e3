/* model/llama_cost: the Llama family's figures for the cost model (model/model_cost.h): the
 * work of its units' passes, its activation bytes, its FLOPs per token, its TP programs from
 * the shapes, and the kernels calibration times at its shapes. */
#ifndef CT_MODEL_LLAMA_COST_H
#define CT_MODEL_LLAMA_COST_H

#include "model/llama/llama.h"
#include "model/model_cost.h"

extern const struct model_cost_ops llama_cost_ops;

/* Context parallelism: the share of the whole sequence's causal attention FLOPs that the
 * critical path's cp rank computes (1 without cp), and llama_cp.c's buffers (bytes). */
double llama_cp_attn_share(const struct model_cost_shape *s);
int64_t llama_cp_buf_bytes(const struct model_config *mc, const struct model_cost_shape *s);
/* One K/V transfer of a block's pass p (full: the whole model's config): the all-gather
 * form's gather (kind ALL_GATHER) or reduce-scatter, or the ring (ring) — the descriptor of
 * a CP item of the block's program (llama_prog_descs_of). */
void llama_cp_coll(const struct llama_config *full, const struct llama_prog_shape *ps,
                   enum model_pass p, enum model_coll kind, bool ring, struct model_coll_desc *out);

#endif
