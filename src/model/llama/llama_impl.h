/* model/llama_impl: what llama.c shares with its tensor-parallel variant (llama_tp.c). Not
 * for use outside src/model/. */
#ifndef CT_MODEL_LLAMA_IMPL_H
#define CT_MODEL_LLAMA_IMPL_H

#include "model/llama/llama.h"
#include "model/model_prog.h"

/* Table indices: 0 tok_embeddings, llama_param_index(l, k) the block tensors (llama.h),
 * then norm, output. */
#define PARAM_TOK_EMB   0
#define PARAM_NORM(m)   ((m)->table.count - 2)
#define PARAM_OUTPUT(m) ((m)->table.count - 1)

/* Address of tensor i inside its unit's current buffer (params or grads). */
float *llama_tensor_at(const struct llama_model *m, float *const *unit_base, int i);
struct llama_block_ptrs llama_block_ptrs_of(const struct llama_model *m, float *const *unit_base,
                                            int l);
/* The residual stream after block l (the next block's input, or x_final). */
float *llama_block_output(struct llama_model *m, int l);

/* Tensor parallelism (llama_tp.c): buffers, and the units with sequence parallelism and the
 * vocabulary-parallel loss. Called by llama.c when m->tp is set. */
/* The attention core's backward, shared by the plain and tensor-parallel blocks: from m->datt
 * (B*T tokens, H query and KV key/value heads of dim D: one TP rank's heads under TP) into
 * freshly zeroed m->dq, m->dk, m->dv, then RoPE's backward on dq and dk. */
void llama_attention_backward(struct llama_model *m, const struct llama_block_acts *a, int64_t B,
                              int64_t T, int64_t H, int64_t KV, int64_t D);

void llama_tp_build(struct llama_model *m, const struct llama_build_opts *opts);
void llama_tp_free(struct llama_model *m);
double llama_tp_unit_forward(struct llama_model *m, int u, int64_t *n_valid);
void llama_tp_unit_backward(struct llama_model *m, int u, double dscale);
/* MODEL_AC_FULL: the unit's forward again (bitwise: the collectives are deterministic). */
void llama_tp_unit_recompute(struct llama_model *m, int u);
/* The units as programs (model/model_prog.h): the three above run every op in order. */
void llama_tp_unit_prog(const struct llama_model *m, int u, enum model_pass p,
                        struct model_prog *out);
double llama_tp_unit_op(struct llama_model *m, int u, enum model_pass p, int op, double dscale,
                        int64_t *n_valid, bool *ran);

#endif
