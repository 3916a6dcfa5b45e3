/* model/llama: Llama 3 — presets, the parameter table, initialisation, and the model as a
 * list of units with forward, backward and recompute entry points.
 *
 * Units, in execution order: 0 = token embedding, 1..L = transformer blocks, L+1 = final
 * norm + output projection (+ the fused loss). Parameters live in one flat float buffer in
 * unit order, described by a table {name, shape, offset, numel}; each unit owns a contiguous
 * range [unit_begin[u], unit_begin[u+1]) — the slice FSDP gathers and reduce-scatters.
 * Gradients mirror that buffer. Activations for a fixed (B, T) are planned once at build.
 *
 * Dimensions: B batch, T sequence, N = B*T tokens, C = dim, H heads, KV kv heads,
 * D = C/H head dim, F = FFN hidden, V = vocab, L = layers.
 */
#ifndef CT_MODEL_LLAMA_H
#define CT_MODEL_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model_ac.h"
#include "model/model_prog.h"
#include "model/param_table.h"

struct model_group;
struct llama_tp_bufs;
struct llama_cp_bufs;

#define LLAMA_IGNORE_INDEX (-100)

struct llama_config {
	char flavor[32];
	int64_t dim, n_layers, n_heads, n_kv_heads, vocab_size;
	double ffn_dim_multiplier; /* <= 0: none */
	int64_t multiple_of;
	int64_t ffn_hidden; /* derived: round_up(int(mult * int(8*dim/3)), multiple_of) */
	int64_t head_dim;   /* derived: dim / n_heads */
	double norm_eps, rope_theta;
	bool rope_scaling; /* Llama 3.1 frequency scaling */
	double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
	int64_t rope_original_ctx;
};

/* Fill *c with a named preset (debugmodel, 125M, 1B, 8B, 70B, 405B); CT_ERR_USAGE if unknown. */
int llama_config_preset(struct llama_config *c, const char *flavor);
/* Recompute the derived fields after changing the shape fields; CT_ERR_USAGE if invalid. */
int llama_config_finish(struct llama_config *c);
const char *llama_flavor_list(void);
/* The i-th preset's name; NULL past the last. */
const char *llama_flavor_name(int i);

int llama_table_build(struct param_table *t, const struct llama_config *c);
/* The table of tensor-parallel rank tp_rank of tp_size (Megatron layout, see tp_dim): heads,
 * FFN hidden and vocabulary split; tp_size = 1 gives llama_table_build's table. CT_ERR_USAGE
 * (naming the numbers) if tp_size does not divide n_heads, n_kv_heads and the FFN hidden. */
int llama_table_build_tp(struct param_table *t, const struct llama_config *c, int tp_size,
                         int tp_rank);

/* TorchTitan's init, from a counter-based RNG keyed by (seed, tensor name, element): the
 * same weights on any number of ranks. Writes elements [first, first+n) of the flat buffer
 * into out (so a rank can initialise just its shard). With a tensor-parallel table, each
 * local element takes its global element's value (padding rows are zero). */
void llama_init_params(const struct llama_config *c, const struct param_table *t, uint64_t seed,
                       float *out, int64_t first, int64_t n);

/* RoPE tables (T, head_dim/2): cos and sin of t * f_i (with Llama 3.1 scaling if enabled). */
void llama_rope_tables(const struct llama_config *c, int64_t T, float *cos_tab, float *sin_tab);
/* Rows of the output projection + cross-entropy done at once over a vocabulary of V: fp32
 * logits of at most LLAMA_CE_LOGIT_BYTES, and at most a quarter of the N rows there are but
 * never fewer than LLAMA_CE_MIN_ROWS (nor more than N, nor fewer than 1). The bytes cap bounds
 * the loss's buffers at large vocabularies; the quarter makes them shrink with the tokens a
 * rank holds, as every other activation does (a context-parallel rank's N is 1/cp of one
 * rank's; with the bytes cap alone both held the same 16 MiB chunk); the floor keeps the head
 * GEMM's M off the small sizes where it slows: at 4 MiB the 125M model's head products ran at
 * M = 128 and 210-270 GFLOP/s in the step; at 16 MiB (M = 512) 276-323 (2 threads, AVX-512).
 * The floor only binds below 1,024 rows a micro-batch. */
#define LLAMA_CE_LOGIT_BYTES ((int64_t)16 << 20)
#define LLAMA_CE_MIN_ROWS 256
int64_t llama_ce_rows(int64_t V, int64_t N);

/* FLOPs per token, TorchTitan's formula: 6*(N - N_embedding) + 12*L*C*T. */
double llama_flops_per_token(const struct llama_config *c, const struct param_table *t,
                             int64_t seq_len);

/* The tensors of one block, in table order: block l's tensor k is table entry
 * llama_param_index(l, k) (entry 0 is the embedding; norm and output come last). */
enum llama_block_tensor {
	LB_ATTN_NORM,
	LB_WQ, /* (H*D, C) */
	LB_WK, /* (KV*D, C) */
	LB_WV, /* (KV*D, C) */
	LB_WO, /* (C, H*D) */
	LB_FFN_NORM,
	LB_W1, /* (F, C) */
	LB_W2, /* (C, F) */
	LB_W3, /* (F, C) */
	LB_COUNT
};

static inline int llama_param_index(int l, int k)
{
	return 1 + l * LB_COUNT + k;
}

/* Pointers to one block's tensors inside a flat buffer (params or grads). */
struct llama_block_ptrs {
	float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w1, *w2, *w3;
};

/* Saved activations of one block (per micro-batch). */
struct llama_block_acts {
	float *x;       /* (N,C) block input (residual stream) */
	float *rstd1;   /* (N) */
	float *q;       /* (N,H*D) after RoPE */
	float *k, *v;   /* (N,KV*D), k after RoPE */
	float *att;     /* (N,H*D) attention output, before wo */
	float *lse;     /* (B,H,T) */
	float *xmid;    /* (N,C) residual after attention */
	float *rstd2;   /* (N) */
	float *h1, *h3; /* (N,F) w1 and w3 outputs (NULL when recomputed in backward) */
};

/* Activation checkpointing (enum model_ac): which block activations are saved in forward
 * and which are re-derived before backward (llama_unit_recompute) into one shared set of
 * buffers: NONE saves everything; FFN recomputes the FFN up-projections (w1, w3 outputs)
 * inside backward; SELECTIVE is TorchTitan's per-op policy; FULL saves only each block's
 * input. The table of what each mode keeps is in llama.c, above plan_acts. */

/* How a model is built. */
struct llama_build_opts {
	bool own_params;    /* allocate flat params + grads and bind every unit to them */
	bool recompute_ffn; /* shorthand for ac = MODEL_AC_FFN: do not save the FFN
	                       up-projections (w1, w3 outputs: 2*N*F floats per block, the largest
	                       activations); recompute them in backward (two extra matmuls) */
	enum model_ac ac;   /* activation checkpointing (recompute_ffn sets FFN) */
	int ac_every;       /* ac = MODEL_AC_LAYER: full on every ac_every-th block */
	/* Tensor parallelism over this group's collectives (NULL or size 1: none; model/
	 * model_group.h, run by parallel/tp_coll): Megatron column/row parallel blocks with
	 * sequence parallelism and a vocabulary-parallel loss, the same block as one rank's
	 * (llama_impl.h). Every activation-checkpointing mode. */
	const struct model_group *tp;
	/* Plan activations only for units [unit_lo, unit_hi) (unit_hi = 0: all): the blocks in
	 * the range, the input of the first (the previous unit's output) and the output of the
	 * last; the final norm's buffers and the loss scratch only with the head unit. Running a
	 * unit outside the range is a bug (its buffers are NULL). Pipeline stages use this so
	 * an in-flight micro-batch holds only its stage's activations. */
	int unit_lo, unit_hi;
	/* Zero-bubble pipelines: llama_unit_backward computes only input gradients (the "I"
	 * half) and keeps what the weight gradients need per block (the matmuls' output
	 * gradients and inputs, the embedding's gradient); llama_unit_backward_weight (the "W"
	 * half) computes them later. Norm weights, the output projection and the loss take
	 * their gradients in I. Not under tensor parallelism. */
	bool split_backward;
	/* async TP: each block's all-gather + matmul and matmul + reduce-scatter as ring steps
	 * (model_group.ring_post / ring_wait), a block's matmul overlapping the next block's
	 * transfer */
	bool tp_async;
	/* Context parallelism over this group's collectives (NULL or size 1: none; llama_cp.c):
	 * the model is built for its T = seq_len / cp tokens of each sequence, cp_order (seq_len
	 * positions, rank-major: rank r holds cp_order[r*T .. (r+1)*T)) says which; RoPE uses
	 * those positions and attention reaches every rank's keys (cp_ring: K/V round the ring
	 * instead of one all-gather). Not with tensor parallelism or a split backward. */
	const struct model_group *cp;
	const int64_t *cp_order;
	bool cp_ring;
};

struct llama_model {
	struct llama_config cfg;
	struct param_table table;
	int64_t B, T, N;
	/* Where each unit's parameters and gradients live: contiguous, in table order. With
	 * own_params both point into the flat buffers below; under FSDP they point at gathered
	 * unit buffers that come and go (llama_bind_unit). */
	float **unit_w, **unit_dw; /* n_units each */
	float *params;             /* flat, table.numel (own_params only, else NULL) */
	float *grads;              /* flat, table.numel (own_params only, else NULL) */
	/* activations */
	int32_t *tokens, *targets;     /* (N) current micro-batch */
	struct llama_block_acts *acts; /* L */
	float *x_final;                /* (N,C) output of the last block */
	float *rstd_f;                 /* (N) */
	float *xn_final;               /* (N,C) final norm output */
	float *rope_cos, *rope_sin;    /* (T, D/2) */
	/* backward scratch */
	float *dres;      /* (N,C) gradient of the residual stream */
	float *xn;        /* (N,C) recomputed norm output */
	float *dxn;       /* (N,C) */
	float *gate;      /* (N,F) swiglu output / its gradient */
	float *dh1, *dh3; /* (N,F) */
	float *h1s, *h3s; /* (N,F) recomputed w1/w3 outputs (recompute_ffn only) */
	bool recompute_ffn;
	enum model_ac ac;
	int ac_every; /* MODEL_AC_LAYER's N; llama_block_ac gives a block's own mode */
	float *dq, *dk, *dv, *datt; /* (N,H*D) / (N,KV*D) */
	float *ce_scratch;          /* ce_rows * V */
	int64_t ce_rows;
	int64_t act_bytes, scratch_bytes;
	int unit_lo, unit_hi; /* the units activations are planned for */
	float *wkeep;         /* split_backward: what W needs, per block in the range */
	int64_t wkeep_bytes;
	/* > 0: the last unit's forward also makes the loss gradient, scaled by this (the trainer
	 * sets 1/global valid tokens); backward of that unit then reuses it. */
	double loss_dscale;
	bool head_grads_ready;
	/* tensor parallelism: NULL without (one rank is the group of one). The residual stream
	 * (x, xmid, x_final, dres, xn, dxn, rstd) holds this rank's Ns = ceil(N/tp) tokens;
	 * q/k/v/att/h1/h3 the local heads and hidden features of all N tokens. */
	const struct model_group *tp;
	int64_t Ns, Np;            /* sequence shard rows, padded rows Ns * tp (without TP: N, N) */
	struct llama_tp_bufs *tpb; /* the collectives' buffers (NULL without TP) */
	/* between the ops of a unit's pass (llama_unit_op): the head's loss sum and valid
	 * targets, the backward's loss scale, and whether the loss gradient still needs its
	 * reduce-scatter in backward */
	double pass_loss, pass_dscale;
	int64_t pass_valid;
	bool loss_rs_pending;
	/* context parallelism: NULL without; its order, RoPE rows and K/V buffers (llama_cp.c) */
	const struct model_group *cp;
	struct llama_cp_bufs *cpb;
};

/* Build a model for micro-batches of (B, T): plans and allocates activations; with own_params
 * also the flat parameter (zero) and gradient buffers, bound to every unit.
 * Returns CT_OK or an error code with a message. */
int llama_build_ex(struct llama_model *m, const struct llama_config *c, int64_t B, int64_t T,
                   const struct llama_build_opts *opts);
static inline int llama_build(struct llama_model *m, const struct llama_config *c, int64_t B,
                              int64_t T)
{
	const struct llama_build_opts opts = {.own_params = true, .recompute_ffn = false};
	return llama_build_ex(m, c, B, T, &opts);
}
/* Point unit u at its parameters and gradients (each unit_begin[u+1]-unit_begin[u] floats). */
void llama_bind_unit(struct llama_model *m, int u, float *params, float *grads);
void llama_free(struct llama_model *m);

/* Unit entry points. Forward runs unit u on the current micro-batch (m->tokens) and saves
 * its activations; the last unit computes the loss sum and returns it (others return 0).
 * Backward of unit u consumes the gradient of its output (in m->dres) and accumulates
 * parameter gradients; the last unit starts the chain with d(loss_sum * dscale).
 * Recompute re-derives a unit's saved activations from its saved input (for activation
 * checkpointing): bitwise identical to what forward saved; under SELECTIVE only the dropped
 * ones, otherwise the whole unit. Under SELECTIVE and FULL it must run right before the
 * unit's backward (the shared buffers hold one block at a time); llama_backward does so. */
double llama_unit_forward(struct llama_model *m, int u, int64_t *n_valid);
void llama_unit_backward(struct llama_model *m, int u, double dscale);
void llama_unit_recompute(struct llama_model *m, int u);
/* split_backward only: the weight gradients of unit u from what its llama_unit_backward
 * kept (any time after it, before the unit's next backward). */
void llama_unit_backward_weight(struct llama_model *m, int u);
/* Whether unit u's backward needs llama_unit_recompute first (SELECTIVE and FULL blocks). */
bool llama_unit_needs_recompute(const struct llama_model *m, int u);
/* Unit u's pass as a program (model/model_prog.h): under tensor or context parallelism,
 * compute segments with the TP collectives and CP's K/V transfers between them; otherwise
 * one segment (n = 0). */
void llama_unit_prog(const struct llama_model *m, int u, enum model_pass p, struct model_prog *out);
/* The shapes one of tp tensor-parallel ranks computes (its heads, FFN columns and
 * vocabulary piece), for the cost model: c with n_heads, n_kv_heads and ffn_hidden over tp
 * and vocab_size rounded up over tp. */
struct llama_config llama_config_tp_slice(const struct llama_config *c, int64_t tp);
/* The layout a program is built for: micro-batches of B sequences of T tokens (the whole
 * sequence: each of cp ranks holds T / cp of it), tp tensor-parallel ranks (async: rings),
 * cp context-parallel ranks (cp_ring: K/V round the ring, else all-gathered; cp_headtail:
 * head-tail balanced shards), activations of elem_bytes (4 here: the CPU computes in fp32;
 * 2 for a bf16 target). */
struct llama_prog_shape {
	int64_t B, T, tp, cp, elem_bytes;
	bool async, cp_ring, cp_headtail;
};
/* The program from the shapes alone (llama_unit_prog's for a built model; for planning),
 * ac the unit's activation checkpointing. */
void llama_prog_descs_of(const struct llama_config *c, const struct llama_prog_shape *s,
                         enum model_ac ac, int u, enum model_pass p, struct model_prog *out);
/* Op `op` of that program (segment op / 2 or collective op / 2; without tensor parallelism
 * op 0 is the whole pass); *ran (may be NULL) says whether a collective ran. Returns the
 * loss sum after the head's last forward op (else 0), with its valid targets in *n_valid
 * (may be NULL). Ops in order are the unit's pass. */
double llama_unit_op(struct llama_model *m, int u, enum model_pass p, int op, double dscale,
                     int64_t *n_valid, bool *ran);

/* Whole-model conveniences built from the units. */
double llama_forward(struct llama_model *m, int64_t *n_valid);
void llama_backward(struct llama_model *m, double dscale);
/* logits (N,V) for the current batch (inference / tests); runs the forward. */
void llama_logits(struct llama_model *m, float *logits);

/* Number of valid (non-ignored) targets in a micro-batch. */
int64_t llama_count_valid(const int32_t *targets, int64_t n);

/* ---- the llama3 family behind the model interface (model/model.h; llama_family.c) ---- */

struct model;
struct model_config;
/* The llama_config a model_config of this family holds (CHECK: it is one). */
const struct llama_config *llama_cfg(const struct model_config *mc);
struct llama_config *llama_cfg_mut(struct model_config *mc);
/* Make *mc an empty llama3 model_config; returns its llama_config to fill in. */
struct llama_config *llama_cfg_init(struct model_config *mc);
/* View an already built model as a struct model (not owned: model_free leaves it alone). */
void model_wrap_llama(struct model *m, struct llama_model *lm);

#endif
