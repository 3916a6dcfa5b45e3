/* model/hyena: the Hyena long-convolution language model (Poli et al. 2023; safari's
 * src/models/sequence/hyena.py and long_conv_lm.py) — presets, the parameter table,
 * initialisation, and the model as a list of units with forward and backward, like
 * model/llama.
 *
 * Units: 0 = token embedding, 1..M = blocks, M+1 = final LayerNorm + LM head tied to the
 * embedding (+ the fused loss). Parameters live in one flat buffer in unit order, described by
 * a `struct param_table` (the same table type as Llama, so checkpoints, FSDP and AdamW treat
 * both alike); each unit owns the contiguous range [unit_begin[u], unit_begin[u+1]).
 *
 * The tied head reads the embedding that unit 0's forward used (under FSDP a copy kept by the
 * model, since unit 0's gathered parameters are freed after its forward) and hands its
 * gradient to unit 0's backward, which adds it to the embedding gradient: FSDP sees ordinary,
 * independent units.
 *
 * One block, pre-norm (D = dim, N = order, P = (N+1)D, x the residual stream):
 *   u = LN1(x);  p = W_in u + b_in  (P);  pc = shortconv_3(p)  (depthwise, causal)
 *   x_0 .. x_{N-1}, v = split(pc, D)
 *   for o = 0..N-2:  v = h_o * (v .* x_{N-1-o}) + bias_o .* (v .* x_{N-1-o})   (long conv)
 *   x = x + W_out (v .* x_0) + b_out
 *   x = x + fc2(gelu_tanh(fc1(LN2(x))))
 * The long filters h (l_max, (N-1)D; column o*D + c is filter o of channel c, safari's
 * 'l (o d)') come from the implicit MLP of hyena_kernels.h over positional features of
 * l_max positions; a sequence of T <= l_max uses the first T taps. They depend on parameters
 * only: each block computes its filter (and its FFT) once per forward and backpropagates into
 * the MLP once per backward.
 *
 * Precision: a model is built for float (training) or double (finite-difference tests, exact
 * generation checks); the compute is one template instantiated for both (hyena_impl.h).
 */
#ifndef CT_MODEL_HYENA_H
#define CT_MODEL_HYENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/llama/llama.h"
#include "model/model_group.h"
#include "model/model_ac.h"

#define HYENA_IGNORE_INDEX LLAMA_IGNORE_INDEX
#define HYENA_SHORT_FILTER 3 /* taps of the short depthwise convolution */

struct hyena_config {
	char flavor[32];
	int64_t vocab_size, dim, n_layers;
	int64_t order;        /* N >= 2: N-1 long convolutions per block */
	int64_t filter_order; /* F: width of the implicit filter MLP (safari: 64) */
	int64_t emb_dim;      /* E: positional features, odd >= 3 */
	int64_t ffn_hidden;   /* d_inner of the GELU MLP */
	int64_t l_max;        /* filter length; sequences may be shorter */
	double sin_freq;      /* initial frequency w of the sine activations */
	double norm_eps;      /* LayerNorm eps (1e-5) */
};

/* Presets: hyena-debug (tiny, for tests), hyena-small (the CPU training config). l_max is set
 * to 0 ("the training sequence length"); the caller sets it before hyena_config_finish. */
int hyena_config_preset(struct hyena_config *c, const char *flavor);
/* Validate (CT_ERR_USAGE with a message naming the field). */
int hyena_config_finish(struct hyena_config *c);
const char *hyena_flavor_list(void);
bool hyena_is_flavor(const char *flavor);
/* The i-th preset's name; NULL past the last. */
const char *hyena_flavor_name(int i);

/* A block's tensors in groups (table order). A group is one tensor, or, for the in-projection
 * (its N+1 streams x_0 .. x_{N-1}, v: weight, bias, short filter taps and bias) and the long
 * convolutions (their N-1 orders: filter bias, the implicit filter's last layer), one tensor
 * per stream or order, adjacent in the flat buffer: the group reads as safari's one tensor
 * (the kernels see (P, D), (P), ...), and under tensor parallelism each of its tensors splits
 * into a contiguous row range (a rank holds D/tp channels of every stream). */
enum hyena_block_tensor {
	HYB_NORM1_W,
	HYB_NORM1_B,
	HYB_IN_W,  /* N+1 x (D, D): (P, D) */
	HYB_IN_B,  /* N+1 x (D): (P) */
	HYB_SF_W,  /* N+1 x (D, 3): (P, 3) short filter */
	HYB_SF_B,  /* N+1 x (D): (P) */
	HYB_FBIAS, /* N-1 x (D): ((N-1)D) long-conv skip term */
	HYB_MLP0_W,
	HYB_MLP0_B, /* (F, E), (F) */
	HYB_FREQ,   /* (F) */
	HYB_MLP1_W,
	HYB_MLP1_B, /* (F, F), (F) */
	HYB_MLP2_W,
	HYB_MLP2_B, /* (F, F), (F) */
	HYB_MLP3_W, /* N-1 x (D, F): ((N-1)D, F), no bias */
	HYB_OUT_W,
	HYB_OUT_B, /* (D, D), (D) */
	HYB_NORM2_W,
	HYB_NORM2_B,
	HYB_FC1_W,
	HYB_FC1_B, /* (H, D), (H) */
	HYB_FC2_W,
	HYB_FC2_B, /* (D, H), (D) */
	HYB_COUNT
};

/* Tensors of group k (N+1, N-1 or 1), of one block, and the table index of group k's first
 * tensor in block l (block M: the final norm). */
static inline int hyena_group_size(const struct hyena_config *c, int k)
{
	if (k == HYB_IN_W || k == HYB_IN_B || k == HYB_SF_W || k == HYB_SF_B)
		return (int)c->order + 1;
	if (k == HYB_FBIAS || k == HYB_MLP3_W)
		return (int)c->order - 1;
	return 1;
}
static inline int hyena_block_tensors(const struct hyena_config *c)
{
	return HYB_COUNT - 6 + 4 * ((int)c->order + 1) + 2 * ((int)c->order - 1);
}
static inline int hyena_block_tensor_index(const struct hyena_config *c, int l, int k)
{
	int i = 1 + l * hyena_block_tensors(c);
	for (int j = 0; j < k; j++)
		i += hyena_group_size(c, j);
	return i;
}

/* Names: tok_embeddings.weight; layers.<l>.{mixer_norm, mixer.in_proj.<s>, mixer.short_filter.<s>,
 * mixer.filter_fn.<o> (its bias), mixer.filter_fn.implicit_filter.{0,1(freq),2,4,6.<o>},
 * mixer.out_proj, ffn_norm, feed_forward.fc1, feed_forward.fc2}.{weight,bias}; norm.{weight,bias}
 * (s a stream, o an order; hyena_safari_group gives safari's name of a group).
 * hyena_table_build_tp: tensor-parallel rank tp_rank's slice of tp (tp must divide dim and
 * ffn_hidden): every stream / order tensor, fc1 rows (column-parallel), out_proj and fc2
 * columns (row-parallel); the rest replicated. */
int hyena_table_build(struct param_table *t, const struct hyena_config *c);
int hyena_table_build_tp(struct param_table *t, const struct hyena_config *c, int tp, int tp_rank);
int hyena_tp_check(const struct hyena_config *c, int64_t tp);
/* The group a table tensor's name belongs to: g > 1 when it is tensor *piece of a group of g
 * (group gets the group's safari-style name, layers.<l>.mixer.in_proj.weight, ...: its g
 * tensors, adjacent in the flat buffer, are that one tensor of their summed rows); 1 for a
 * tensor of its own. */
int hyena_name_group(const struct hyena_config *c, const char *name, char *group, size_t n,
                     int *piece);

/* Init from the counter-based RNG keyed by (seed, tensor name, element), so any sharding
 * gives the same weights: embedding, in_proj, fc1 N(0, 0.02); out_proj, fc2 N(0,
 * 0.02/sqrt(2M)) (GPT-2 residual scaling, as safari); biases of those 0; LayerNorms 1, 0;
 * short filter and implicit-MLP layers PyTorch's default U(+-1/sqrt(fan_in)) (weights and
 * biases); filter_fn.bias N(0, 1); freq = sin_freq. Writes elements [first, first+n). */
void hyena_init_params(const struct hyena_config *c, const struct param_table *t, uint64_t seed,
                       float *out, int64_t first, int64_t n);

/* 6 x (matmul parameters incl. the tied head) + the FFT long convolutions (forward and
 * backward: about 6 transforms of length 2T per channel and convolution, 2.5 n log2 n each,
 * counted per token) + the implicit filter MLP amortised over one sequence. */
double hyena_flops_per_token(const struct hyena_config *c, int64_t seq_len);

/* The filters of block l at length L from that block's parameters (pointers in table order
 * starting at the block's first tensor, i.e. the block's unit buffer): h (L, (N-1)D) in
 * float. For generation: filter o of channel c is h[t*(N-1)D + o*D + c]. scratch: see
 * hyena_filter_scratch_reals. */
int64_t hyena_filter_scratch_reals(const struct hyena_config *c, int64_t L);
void hyena_filter_compute(const struct hyena_config *c, const float *block_params, int64_t L,
                          float *h, float *scratch);
void hyena_filter_compute_f64(const struct hyena_config *c, const double *block_params, int64_t L,
                              double *h, double *scratch);

struct hyena_build_opts {
	bool own_params; /* allocate flat params + grads and bind every unit to them */
	bool f64;        /* double precision (tests): params64/grads64 instead of params/grads */
	int nthreads;    /* OpenMP threads of the FFT convolutions; 0: omp_get_max_threads() */
	/* activation checkpointing (model/model_ac.h; ac_every: MODEL_AC_LAYER's N). What a
	 * block saves per mode: none, every activation; ffn, all but the fc1 output, which the
	 * backward derives again from the saved mixer residual; selective (TorchTitan's op
	 * policy: the matmuls' outputs are kept), the in-projection, fc1 and residual outputs,
	 * the filters, short and long convolutions and gates re-derived by the recompute pass;
	 * full, only the block input, the whole block forward re-run by the recompute pass.
	 * The re-derived activations of all blocks share one set of buffers. */
	enum model_ac ac;
	int ac_every;
	/* a pipeline stage: activations only for units [unit_lo, unit_hi) (its blocks, their
	 * inputs and outputs, the head's if it holds it); unit_hi = 0: every unit */
	int unit_lo, unit_hi;
	/* tensor parallelism over this group (NULL or size 1: none): the model is built from
	 * hyena_table_build_tp's slice, computes D/tp channels of the mixer and ffn_hidden/tp of
	 * the MLP, and all-reduces the row-parallel outputs, the input gradients of the
	 * column-parallel in_proj and fc1, and the implicit filter MLP's gradients */
	const struct model_group *tp;
};

/* Offsets (in reals) of one block's saved activations inside the activation arena. */
struct hyena_block_acts {
	int64_t x;            /* (Nt,D) block input */
	int64_t mean1, rstd1; /* (Nt) */
	int64_t p, pc;        /* (Nt,P) in_proj output, short conv output */
	int64_t g, v;         /* (N-1, Nt, D) long-conv inputs and outputs */
	int64_t y;            /* (Nt,D) input of out_proj */
	int64_t xmid;         /* (Nt,D) residual after the mixer */
	int64_t mean2, rstd2; /* (Nt) */
	int64_t a;            /* (Nt,H) fc1 output before GELU */
	int64_t fa;           /* (6,T,F) implicit filter activations */
	int64_t Hf;           /* ((N-1)D, S) filter spectra */
};

struct hyena_model {
	struct hyena_config cfg;
	struct param_table table;
	int64_t B, T, N; /* N = B*T tokens */
	bool f64, own_params;
	int nthreads;
	enum model_ac ac; /* activation checkpointing, as built (hyena_build_opts) */
	int ac_every;
	int unit_lo, unit_hi; /* the units it runs (hyena_build_opts; unit_hi set) */
	const struct model_group *tp; /* NULL: one rank's whole model */
	int64_t Dl, Hl;               /* channels and MLP hidden width on this rank (D, H / tp) */
	/* Where each unit's parameters and gradients live (float models; NULL while unbound
	 * under FSDP), and the flat buffers with own_params. */
	float **unit_w, **unit_dw;
	float *params, *grads;
	/* the same for double models */
	double **unit_w64, **unit_dw64;
	double *params64, *grads64;
	int32_t *tokens, *targets; /* (N) current micro-batch */
	/* Activations and scratch: arenas of reals (float or double) carved into the offsets
	 * below at build. */
	void *acts, *scratch;
	int64_t act_bytes, scratch_bytes;
	struct hyena_block_acts *blk;              /* n_layers */
	int64_t x_final, mean_f, rstd_f, xn_final; /* head */
	int64_t z, window;                         /* (T,E), (T,(N-1)D) filter features */
	int64_t tied_w;                            /* (V,D) embedding copy (no own_params) */
	int64_t tied_dw;                           /* (V,D) head's embedding gradient */
	const float *tied_src; /* non-NULL: the head's embedding (a pipeline's last stage) */
	/* scratch offsets */
	int64_t s_dres, s_xn, s_dxn, s_gl, s_dgl, s_da, s_dy, s_dv, s_dg, s_dpc, s_dp, s_h, s_dh,
	    s_filt, s_fft, s_ce, s_part, s_frep;
	int64_t ce_rows;
	/* > 0: the head's forward also makes the loss gradient (as in every family) */
	double loss_dscale;
	bool head_grads_ready;
};

int hyena_build(struct hyena_model *m, const struct hyena_config *c, int64_t B, int64_t T,
                const struct hyena_build_opts *opts);
/* What hyena_build allocates under MEM_ACTIVATIONS for these arguments (the activation and
 * scratch arenas plus tokens and targets), by the same carving, without allocating: the cost
 * model's activation bytes (hyena_cost.c). */
int hyena_activation_bytes(const struct hyena_config *c, int64_t B, int64_t T,
                           const struct hyena_build_opts *opts, int64_t *bytes);
void hyena_free(struct hyena_model *m);
/* Point unit u at its parameters and gradients (float models). */
void hyena_bind_unit(struct hyena_model *m, int u, float *params, float *grads);

/* Units, as llama's: forward of unit u on m->tokens (the last returns the loss sum and sets
 * *n_valid), backward accumulates parameter gradients; the last unit starts the chain with
 * d(loss_sum * dscale). */
double hyena_unit_forward(struct hyena_model *m, int u, int64_t *n_valid);
void hyena_unit_backward(struct hyena_model *m, int u, double dscale);
/* Activation checkpointing: whether unit u's activations are re-derived before its backward
 * (a block under selective or full), and the pass that does it. */
bool hyena_unit_needs_recompute(const struct hyena_model *m, int u);
void hyena_unit_recompute(struct hyena_model *m, int u);
double hyena_forward(struct hyena_model *m, int64_t *n_valid);
void hyena_backward(struct hyena_model *m, double dscale);
/* logits (N,V) of the current batch (runs the forward); float / double models. */
void hyena_logits(struct hyena_model *m, float *logits);
void hyena_logits_f64(struct hyena_model *m, double *logits);

/* ---- the Hyena family behind the model interface (model/model.h; hyena_family.c) ---- */

struct model;
struct model_config;
/* The hyena_config a model_config of this family holds (CHECK: it is one). */
const struct hyena_config *hyena_cfg(const struct model_config *mc);
struct hyena_config *hyena_cfg_mut(struct model_config *mc);
/* Make *mc an empty Hyena model_config; returns its hyena_config to fill in. */
struct hyena_config *hyena_cfg_init(struct model_config *mc);
/* View an already built float model as a struct model (not owned: model_free leaves it
 * alone). */
void model_wrap_hyena(struct model *m, struct hyena_model *hm);

#endif
