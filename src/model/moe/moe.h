/* model/moe: a DeepSeek-V3-style mixture-of-experts decoder (`model.name = "deepseek_v3"`,
 * TorchTitan's torchtitan/models/deepseek_v3 with plain GQA attention instead of multi-head
 * latent attention, which is deferred) — presets, the parameter table, initialisation, and
 * the model as a list of units, like model/llama.
 *
 * Units: 0 = token embedding, 1..L = blocks, L+1 = final RMSNorm + output projection (+ the
 * fused loss). A block is Llama's pre-norm block (RMSNorm, GQA attention with RoPE, residual;
 * RMSNorm, FFN, residual) whose FFN is a dense SwiGLU in the first n_dense_layers blocks and a
 * mixture of experts after them:
 *
 *   s = score(xn G^T)                     (N, E): softmax or sigmoid of the router's logits
 *   idx = top_k(s + bias)                 the bias (aux-loss-free balancing) picks only
 *   g = s[idx] (/ sum, if route_norm) * route_scale     weights from the unbiased scores
 *   out = x + shared(xn) + sum_k g_k expert_{idx_k}(xn)  experts: SwiGLU, hidden moe_inter_dim
 *
 * Grouped expert matmuls: the N*K (token, slot) pairs are sorted by expert (stable, token
 * order inside an expert), so each expert's rows are contiguous and one matmul per expert
 * (through the kernels' engine layer) runs over exactly its rows: no padding row, no dropped
 * token, no call for an expert with no token. The combine adds each token's K outputs in
 * slot order (deterministic).
 *
 * Balancing (DeepSeek-V3, arXiv 2408.15664): the training forward counts tokens per expert;
 * after each optimizer step the layout sums the counts over the data-parallel ranks
 * (model_ops.step_stats / after_step) and each layer's bias moves by
 * load_balance_coeff * sign(mean load - load), minus its mean (TorchTitan keeps the bias
 * zero-mean). The bias is model state, not a parameter: no gradient, not in the table; it is
 * model_ops.state, which checkpoints hold (model_state.bin) and the Hugging Face export
 * writes as each MoE layer's mlp.gate.e_score_correction_bias (moe_hf.c). The optional sequence-wise auxiliary loss (aux_loss_alpha > 0) adds,
 * per sequence of T tokens, alpha * sum_e f_e P_e with f_e = E/(K T) * (tokens choosing e)
 * and P_e = mean over the sequence of s_e / sum_j s_j; it enters the loss sum as
 * alpha * T * sum_seq (that), so over fully valid batches the loss is CE + alpha * mean_seq.
 *
 * Expert tensors are 2-D in the table so FSDP shards them on dim 0 like any tensor:
 * experts.w1, w3 (E*Fm, C) (expert e's rows [e*Fm, (e+1)*Fm)), experts.w2 (E*C, Fm).
 *
 * Expert parallelism (moe_build_opts.ep of P ranks, P | E): rank p holds experts
 * [p*El, (p+1)*El), El = E/P, as the rows [p*El*Fm, ..) of w1, w3 and [p*El*C, ..) of w2
 * (table entries marked `expert`, with their place in the global tensor). The router, the
 * shared experts and everything else are whole on every rank, which routes its own tokens
 * over all E experts. Since the slots are sorted by expert, the rows for rank p's experts are
 * one run of xs: each MoE forward exchanges the per-expert counts (one all-to-all of P x El
 * ints), sends every rank its run (all_to_all_v), regroups what arrived (source-major) by
 * local expert (xe, expert e's rows from every source in rank order), runs the local experts
 * and sends the outputs back the same way reversed, where the combine is the one-rank one.
 * Backward sends the output gradients along the forward's routes and the input gradients
 * back. An expert's rows are the tokens of the P ranks in rank order, so with the batch
 * split in rank order its gradient is the one-rank gradient (to summation order). The
 * dispatch and combine run inside the unit (blocking hook calls, as context parallelism's
 * K/V exchange), not as schedule nodes. Received rows are planned for the worst case: every
 * rank's N*K slots to one rank (R = P*N*K rows of xe, eh1, eh3).
 *
 * Precision: a model is built for float (training) or double (finite-difference tests); the
 * compute is one template instantiated for both (moe_impl.h).
 *
 * Dimensions: B, T, N = B*T, C = dim, H heads, KV kv heads, D head dim, F dense FFN hidden,
 * E routed experts, K top-k, Fm expert hidden, Fs = Fm * n_shared_experts, V vocab, L layers.
 */
#ifndef CT_MODEL_MOE_H
#define CT_MODEL_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model_ac.h"
#include "model/model_group.h"
#include "model/model_prog.h"
#include "model/param_table.h"

enum moe_score { MOE_SCORE_SOFTMAX, MOE_SCORE_SIGMOID };

struct moe_config {
	char flavor[32];
	int64_t vocab_size, dim, n_layers, n_heads, n_kv_heads;
	int64_t inter_dim;     /* F: the dense blocks' FFN hidden */
	int64_t moe_inter_dim; /* Fm: one expert's hidden */
	int64_t n_dense_layers, n_routed_experts, n_shared_experts, top_k;
	int64_t head_dim; /* derived: dim / n_heads */
	enum moe_score score_func;
	bool route_norm;
	double route_scale, load_balance_coeff, aux_loss_alpha;
	double norm_eps, rope_theta;
};

/* Presets: deepseek_v3-debug (tiny, 8 experts top-2), deepseek_v3-16B, deepseek_v3-671B
 * (TorchTitan's shapes with GQA in place of MLA: kv heads = heads). */
int moe_config_preset(struct moe_config *c, const char *flavor);
/* Validate and derive (CT_ERR_USAGE with a message naming the field). */
int moe_config_finish(struct moe_config *c);
const char *moe_flavor_name(int i);
bool moe_is_flavor(const char *flavor);
const char *moe_flavor_list(void);
const char *moe_score_name(enum moe_score s);

/* Block l's tensors, relative to its first table entry: the attention part, then the dense
 * FFN (l < n_dense_layers) or the router, the experts and the shared experts. */
enum moe_block_tensor {
	MB_ATTN_NORM,
	MB_WQ, /* (H*D, C) */
	MB_WK, /* (KV*D, C) */
	MB_WV, /* (KV*D, C) */
	MB_WO, /* (C, H*D) */
	MB_FFN_NORM,
	MB_W1, /* dense (F, C) | experts (E*Fm, C) */
	MB_W2, /* dense (C, F) | experts (E*C, Fm) */
	MB_W3, /* dense (F, C) | experts (E*Fm, C) */
	MB_GATE, /* (E, C) router */
	MB_SW1,  /* (Fs, C) shared experts (only with n_shared_experts > 0) */
	MB_SW2,  /* (C, Fs) */
	MB_SW3,  /* (Fs, C) */
	MB_COUNT
};

/* Names: tok_embeddings.weight; layers.<l>.{attention_norm, attention.wq, .wk, .wv, .wo,
 * ffn_norm}.weight; dense: layers.<l>.feed_forward.{w1,w2,w3}.weight; MoE:
 * layers.<l>.moe.router.gate.weight, layers.<l>.moe.experts.{w1,w2,w3},
 * layers.<l>.moe.shared_experts.{w1,w2,w3}.weight; norm.weight; output.weight.
 * Init as TorchTitan's: embedding N(0, 1); norms 1; wq, wk, wv, w1, gate trunc-normal
 * std 0.02; wo, w2, w3 and the experts' and shared experts' w2, w3 std 0.02/sqrt(2(l+1));
 * output trunc-normal std dim^-1/2 cut at 3 std. */
int moe_table_build(struct param_table *t, const struct moe_config *c);
/* Expert-parallel rank ep_rank's table of ep (ep = 1: moe_table_build): the expert tensors
 * hold its E/ep experts and say where they sit in the global tensors (tp_start,
 * global_shape, `expert`); every other entry is whole. */
int moe_table_build_ep(struct param_table *t, const struct moe_config *c, int ep, int ep_rank);
void moe_init_params(const struct moe_config *c, const struct param_table *t, uint64_t seed,
                     float *out, int64_t first, int64_t n);
/* Table index of block l's tensor k (-1: the block has none: dense vs MoE, no shared). */
int moe_tensor_index(const struct moe_config *c, int l, int k);
/* 6 x active matmul parameters (the top-k and shared experts, not all E) + attention. */
double moe_flops_per_token(const struct moe_config *c, int64_t seq_len);
/* Parameters a token runs through (active) of all of them (for describe). */
int64_t moe_active_params(const struct moe_config *c);

struct moe_build_opts {
	bool own_params; /* allocate flat params + grads and bind every unit to them */
	bool f64;        /* double precision (tests): params64/grads64, own_params required */
	const struct model_group *ep; /* expert parallelism (NULL or size 1: none) */
	/* activation checkpointing (model/model_ac.h; ac_every: MODEL_AC_LAYER's N). What a
	 * block keeps (the rest lives once, in buffers every such block shares):
	 *   NONE       everything;
	 *   FFN        all but the up-projections (dense / shared h1, h3; experts eh1, eh3),
	 *              re-derived inside the block's backward;
	 *   SELECTIVE  Llama's selective (TorchTitan's op-SAC: the outputs of the matmuls but
	 *              every second one, and attention's): q, v, att, lse, h1, the router
	 *              (scores, weights, routing ints), the received rows xe, eh1, the expert
	 *              outputs y; the norms, k, xmid, xs and the w3 outputs (h3, eh3) are
	 *              re-derived by the recompute pass, which sends nothing;
	 *   FULL       only the block input; the recompute pass re-runs the block forward,
	 *              its expert-parallel dispatch and combine included.
	 * A recompute never counts tokens for the balancing statistics nor adds the
	 * auxiliary loss again (moe_model.recomputing); the routing it re-derives is the
	 * forward's (the same inputs, the same bias, ties to the lower expert, a stable sort). */
	enum model_ac ac;
	int ac_every;
	/* a pipeline stage: activations only for units [unit_lo, unit_hi) and their input and
	 * output boundaries (unit_hi = 0: every unit) */
	int unit_lo, unit_hi;
};

/* Offsets (in reals) of one block's saved activations; the MoE layers' routing in ints. */
struct moe_block_acts {
	int64_t x, rstd1, xn1, q, k, v, att, lse, xmid, rstd2, xn2;
	int64_t h1, h3;         /* dense (N,F) | shared experts (N,Fs) up-projections */
	int64_t s;              /* (N,E) router scores */
	int64_t g_raw, g;       /* (N*K) unbiased scores of the chosen experts, route weights */
	int64_t xs, eh1, eh3, y; /* (N*K, C|Fm|Fm|C) sorted expert inputs, up-projections, outputs */
	int64_t idx, pos;       /* ints: (N*K) chosen experts; (N*K) slot -> sorted row */
	int64_t off;            /* ints: (E+1) first sorted row of each expert */
	/* expert parallelism (ep > 1): xe (R, C) the received rows by local expert (eh1, eh3
	 * then have R rows); ints: ecnt (P x El) rows from source p for local expert e, eoff
	 * (El+1) each local expert's first row of xe */
	int64_t xe, ecnt, eoff;
};

#define MOE_LOAD_WINDOW 100 /* steps of moe_load_max_mean_w100 */

struct moe_model {
	struct moe_config cfg;
	struct param_table table;
	int64_t B, T, N;
	bool f64, own_params;
	/* expert parallelism: ep ranks (1: none), this one's place, its El = E/ep experts, the
	 * rows it can receive (R), the group, and the exchange's working arrays (2 x ep byte
	 * counts, ep x El send counts) */
	int ep, ep_rank;
	int64_t E_local, R_max;
	const struct model_group *epg;
	int64_t *ep_bytes;
	int32_t *ep_scnt;
	float **unit_w, **unit_dw; /* float models; NULL while unbound under FSDP */
	float *params, *grads;
	double **unit_w64, **unit_dw64; /* double models */
	double *params64, *grads64;
	int32_t *tokens, *targets; /* (N) */
	void *acts, *scratch;      /* arenas of reals */
	int32_t *iacts;            /* the routing's ints */
	int64_t ifill;             /* E ints of it: the sort's next row per expert */
	int64_t act_bytes, scratch_bytes, iact_bytes;
	struct moe_block_acts *blk; /* n_layers */
	int64_t x_final, rstd_f, xn_final, rope_cos, rope_sin;
	int64_t s_dres, s_dxn, s_dxnf, s_gate, s_dh1, s_dh3, s_dq, s_dk, s_dv, s_datt, s_dy,
	    s_dxs, s_ds, s_dg, s_ce;
	int64_t s_xr, s_ye, s_dxe; /* ep > 1: (R, C) source-major rows, expert outputs / output
	                              gradients by local expert, input gradients by local expert */
	int64_t ce_rows;
	/* balancing: per MoE layer (n_layers - n_dense_layers) x E */
	double *bias;   /* added to the scores for selection */
	double *counts; /* tokens per expert since the last step_stats */
	double *load;   /* per MoE layer: max / mean tokens per expert of the last step */
	/* the last MOE_LOAD_WINDOW steps' tokens per expert (a ring; this process's steps only, not
	 * in checkpoints) and, per MoE layer, max / mean of their sum */
	double *win, *load_win;
	int64_t win_steps;
	/* ep > 1: the (token, slot) rows of the last step routed to each ep rank's experts, all
	 * MoE layers, summed over the data-parallel group (ep entries) */
	double *ep_rows;
	bool have_load; /* after the first after_step */
	/* > 0 in a training step (the trainer sets 1/valid tokens): counts are kept */
	double loss_dscale;
	/* the last forward's auxiliary loss sum per MoE layer (tests) */
	double *aux_sum;
	enum model_ac ac; /* activation checkpointing (moe_build_opts) */
	int ac_every;
	bool recomputing; /* inside a recompute pass: no counting, no auxiliary loss */
	int unit_lo, unit_hi; /* the units it plans activations for (moe_build_opts) */
};

int moe_build(struct moe_model *m, const struct moe_config *c, int64_t B, int64_t T,
              const struct moe_build_opts *opts);
void moe_free(struct moe_model *m);
/* What moe_build of a float model at (B, T) over ep expert-parallel ranks allocates under
 * MEM_ACTIVATIONS under activation checkpointing ac (ac_every), by the build's own
 * carving, without building it (the cost model's activation bytes): the reals (saved activations and scratch, fp32) and the ints (the
 * routing's, tokens and targets). */
int moe_activation_bytes(const struct moe_config *c, int64_t B, int64_t T, int ep,
                         enum model_ac ac, int ac_every,
                         int64_t *real_bytes, int64_t *int_bytes);
void moe_bind_unit(struct moe_model *m, int u, float *params, float *grads);

/* Units: forward of unit u (a MoE block returns its auxiliary loss sum, the head the loss
 * sum with *n_valid), backward accumulates parameter gradients (the head starts the chain
 * with d(loss_sum * dscale)). */
double moe_unit_forward(struct moe_model *m, int u, int64_t *n_valid);
void moe_unit_backward(struct moe_model *m, int u, double dscale);
/* Activation checkpointing: whether unit u re-derives dropped activations before its
 * backward (a selective or full block), and that pass (a no-op for other units). */
bool moe_unit_needs_recompute(const struct moe_model *m, int u);
void moe_unit_recompute(struct moe_model *m, int u);
/* A MoE block's forward and backward as expert parallelism's program's ops (moe_ep_prog): segment 0, the dispatch posted
 * (op 1), segment 1 (the shared expert, beside it), its wait (op 3), segment 2 (the local
 * experts), the combine (op 5, blocking: nothing is left to hide it), segment 3. One rank,
 * or a whole pass, runs the same segments in order with the exchanges blocking between
 * them; one rank has no exchange and runs its experts in segment 2. */
enum moe_op { MOE_OP_SEG0, MOE_OP_POST, MOE_OP_SEG1, MOE_OP_WAIT, MOE_OP_SEG2, MOE_OP_COMBINE,
              MOE_OP_SEG3, MOE_OP_COUNT };
/* Expert parallelism's program of unit u's pass p (model/model_prog.h) for a model of N
 * tokens a rank over ep ranks, elem_bytes per activation element: a MoE block's forward and
 * backward (ep > 1) are the dispatch posted, its wait after the shared expert, and the
 * combine (blocking); what each all-to-all sends to the other ranks is the balanced
 * routing's (the step's own is what moe_unit_op returns). Every other pass is one segment.
 * The cost model (moe_cost.c) uses the same program. */
void moe_ep_prog(const struct moe_config *c, int64_t N, int ep, int64_t elem_bytes, int u,
                 enum model_pass p, struct model_prog *out);
void moe_unit_prog(const struct moe_model *m, int u, enum model_pass p, struct model_prog *out);
/* Op `op` of that program (op 2k: segment k, 2k + 1: collective k; a one-segment pass: op 0
 * only): a segment returns what unit_forward would (its share of the auxiliary loss), an
 * all-to-all the bytes it sent to the other ranks (*ran: it is an all-to-all). */
double moe_unit_op(struct moe_model *m, int u, enum model_pass p, int op, double dscale,
                   bool *ran);
double moe_forward(struct moe_model *m, int64_t *n_valid);
void moe_backward(struct moe_model *m, double dscale); /* recomputes where needed */
void moe_logits(struct moe_model *m, float *logits);

/* Balancing: the tokens per expert counted since the last call (n = MoE layers x E), copied
 * into out (non-NULL) and reset; after the step, from the counts summed over the
 * data-parallel ranks: each layer's load (max / mean over its experts) and, with
 * load_balance_coeff > 0, the bias update. */
int64_t moe_step_stats(struct moe_model *m, double *out);
void moe_after_step(struct moe_model *m, const double *sum);
/* For the log (model_ops.step_metrics): moe_load_max_mean (the worst layer's, also on the
 * console), moe_load_max_mean/layer.<l> per MoE block, moe_bias_absmax. */
struct model_step_metric;
int moe_step_metrics(const struct moe_model *m, struct model_step_metric *out, int max);

/* ---- the deepseek_v3 family behind the model interface (model/model.h; moe_family.c) ---- */

struct model;
struct model_config;
const struct moe_config *moe_cfg(const struct model_config *mc);
struct moe_config *moe_cfg_mut(struct model_config *mc);
struct moe_config *moe_cfg_init(struct model_config *mc);
void model_wrap_moe(struct model *m, struct moe_model *mm);

#endif
