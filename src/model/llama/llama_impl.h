/* model/llama_impl: what the files of the Llama model share — llama.c (build, the unit entry
 * points and the programs' runner), llama_block.c (the transformer block), llama_head.c (the
 * embedding, the final norm and the loss) and llama_tp_comm.c (tensor parallelism's buffers,
 * collectives and their descriptors). Not for use outside src/model/llama/.
 *
 * One implementation serves one rank and tensor parallelism. Every pass of a unit is a
 * program (struct llama_prog): compute segments with the TP collectives between them. Under
 * TP (m->tp set) a schedule runs it op by op; one rank is the group of one — no collectives,
 * the whole column and row range, no sequence split (Ns = N) — and runs the segments in order
 * as one pass, skipping the collectives: there the buffers they would connect are one
 * (llama_xg and the views below). Where one rank's order of floating-point operations is not
 * what TP with a group of one would do (the row-parallel matmul accumulating onto the
 * residual instead of a partial sum added after the reduce-scatter, a norm weight's gradient
 * accumulated in place instead of summed over ranks, the fused loss kernel), the segment
 * branches on m->tp, so that each layout keeps its bits.
 */
#ifndef CT_MODEL_LLAMA_IMPL_H
#define CT_MODEL_LLAMA_IMPL_H

#include "base/fp8.h"
#include "model/llama/llama.h"
#include "model/model_group.h"
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

/* This rank's sizes: its Ns token rows of the residual stream (N without TP), its heads, FFN
 * hidden features and vocabulary piece (all of them without TP). */
struct llama_dims {
	int64_t B, T, N, Ns, C, D, H, KV, HD, KVD, F, V;
};
struct llama_dims llama_dims_of(const struct llama_model *m);

/* ---------------------------------------------------------------- programs */

/* What a collective moves: the (Ns, C) activation shard, or one norm weight's (C) partial
 * gradient. */
enum llama_coll_size { LLAMA_COLL_ACT, LLAMA_COLL_NORM };
/* the matmul an async TP ring hides behind (for the cost model) */
enum llama_ring_mm { LLAMA_MM_NONE, LLAMA_MM_QKV, LLAMA_MM_WO, LLAMA_MM_W13, LLAMA_MM_W2 };

/* One op of a pass: at even indices a segment (seg may be NULL: nothing to compute there), at
 * odd indices a collective, which returns whether it ran (the loss gradient's reduce-scatter
 * runs on one side of the fused loss only). Segments hand state to the next op through the
 * model's buffers, so the ops in order compute the pass; l is the block (unit - 1). */
struct llama_op {
	void (*seg)(struct llama_model *m, int l);
	bool (*coll)(struct llama_model *m, int l);
	enum model_coll kind;
	enum llama_coll_size size;
	bool ring;                 /* async TP: ring steps with the matmul beside it */
	enum model_coll_when when; /* MODEL_COLL_ALWAYS unless the loss gradient's */
	enum llama_ring_mm ring_mm;
};

struct llama_prog {
	int n_ops;
	const struct llama_op *ops;
};

#define LLAMA_PROG(a) ((struct llama_prog){(int)(sizeof(a) / sizeof(a[0])), a})
#define LLAMA_SEG(f)                                                                               \
	{                                                                                          \
		.seg = (f)                                                                         \
	}
#define LLAMA_AG(f)                                                                                \
	{                                                                                          \
		.coll = (f), .kind = MODEL_COLL_ALL_GATHER, .size = LLAMA_COLL_ACT                 \
	}
#define LLAMA_RS(f)                                                                                \
	{                                                                                          \
		.coll = (f), .kind = MODEL_COLL_REDUCE_SCATTER, .size = LLAMA_COLL_ACT             \
	}
#define LLAMA_AGN(f)                                                                               \
	{                                                                                          \
		.coll = (f), .kind = MODEL_COLL_ALL_GATHER, .size = LLAMA_COLL_NORM                \
	}
#define LLAMA_RAG(f, mm)                                                                           \
	{                                                                                          \
		.coll = (f), .kind = MODEL_COLL_ALL_GATHER, .size = LLAMA_COLL_ACT, .ring = true,  \
		.ring_mm = (mm)                                                                    \
	}
#define LLAMA_RRS(f, mm)                                                                           \
	{                                                                                          \
		.coll = (f), .kind = MODEL_COLL_REDUCE_SCATTER, .size = LLAMA_COLL_ACT,            \
		.ring = true, .ring_mm = (mm)                                                      \
	}

/* Block l's own checkpointing mode (never MODEL_AC_LAYER: that policy picks FULL or NONE per
 * block, model/model_ac.h), and unit u's (the embedding and head: the model's mode). */
static inline enum model_ac llama_block_ac(const struct llama_model *m, int l)
{
	return model_ac_block(m->ac, m->ac_every, l);
}
enum model_ac llama_unit_ac(const struct llama_model *m, int u);

/* The programs of each kind of unit (llama_block.c, llama_head.c) and of unit u of a model
 * of L blocks (llama.c), ac the unit's own mode. Recompute is the forward's program unless
 * said otherwise. */
struct llama_prog llama_block_prog(bool async, enum model_ac ac, enum model_pass p);
struct llama_prog llama_embed_prog(enum model_pass p);
struct llama_prog llama_head_prog(enum model_pass p);
struct llama_prog llama_prog_of(int L, bool async, enum model_ac ac, int u, enum model_pass p);

/* ---------------------------------------------------------------- split backward */

/* What the weight-gradient half (W) of a split backward needs of block l: each matmul's
 * output gradient and input (gathered, under TP), copied out by the input-gradient half (I).
 * Unit 0 keeps the embedding's output gradient (in the dout2 slot). */
struct llama_wkeep {
	float *dout2, *gate, *dh1, *dh3, *xn2, *dout1, *att, *dq, *dk, *dv, *xn1;
};
/* unit u's kept buffers (u = 0: the embedding; 1..L: blocks), NULL-filled if not kept */
struct llama_wkeep llama_wkeep_at(const struct llama_model *m, int u);
void llama_block_backward_weight(struct llama_model *m, int l, const struct llama_wkeep *k);
void llama_embed_backward_weight(struct llama_model *m, const struct llama_wkeep *k);

/* ---------------------------------------------------------------- context parallelism */

/* llama_cp.c: set up m->cp (after the rope tables: rewrites their rows to the tokens' global
 * positions) or refuse what it cannot compose with; free; the bytes of its buffers. */
int llama_cp_build(struct llama_model *m, const struct llama_build_opts *opts);
void llama_cp_free(struct llama_model *m);
int64_t llama_cp_bytes(const struct llama_model *m);
/* a->att, a->lse from a->q, a->k, a->v (after RoPE) against every rank's keys */
void llama_cp_attention_forward(struct llama_model *m, struct llama_block_acts *a);
/* m->dq, m->dk, m->dv (zeroed by the caller) from m->datt: this shard's gradients */
void llama_cp_attention_backward(struct llama_model *m, const struct llama_block_acts *a);

/* ---------------------------------------------------------------- tensor parallelism */

struct llama_tp_bufs {
	float *xg;         /* (Np, C) gathered norm output */
	float *part;       /* (Np, C) partial sums to reduce-scatter / gathered gradient */
	float *rs_scratch; /* 2 * Ns * C */
	float *rs_out;     /* (Ns, C) */
	float *dnorm;      /* (tp, C): a norm weight's gradient from every rank */
	float *stat;       /* 3 * ce_rows: row max, sum of exponentials, target logit */
	float *ring;       /* async: 3 * Ns * C (two partial sums in flight, one received) */
	uint8_t *w8;       /* tensorwise float8: Np * C + Ns * C bytes, the fp8 wire */
	size_t bytes;
	bool async; /* ring steps instead of the block's all-gathers and reduce-scatters */
};

/* Where a pass's data meet across a collective. Under TP they are the collectives' buffers;
 * one rank has no collective between them, so the same roles fall on the model's own. */
/* the gathered norm output (N, C) that the column-parallel matmuls read */
static inline float *llama_xg(const struct llama_model *m)
{
	return m->tp ? m->tpb->xg : m->xn;
}
/* the gathered gradient of the residual stream (N, C) */
static inline float *llama_dout(const struct llama_model *m)
{
	return m->tp ? m->tpb->part : m->dres;
}
/* d(norm output) of all N tokens, partial over the TP ranks (to reduce-scatter) */
static inline float *llama_dx_part(const struct llama_model *m)
{
	return m->tp ? m->tpb->part : m->dxn;
}
/* d(norm output) of this rank's Ns tokens (reduce-scattered) */
static inline float *llama_dx_shard(const struct llama_model *m)
{
	return m->tp ? m->tpb->rs_out : m->dxn;
}

void llama_tp_build(struct llama_model *m, const struct llama_build_opts *opts);
void llama_tp_free(struct llama_model *m);
void llama_tp_add_rows(float *out, const float *a, const float *b, int64_t n);
/* full(Np, C) = the token shards of every rank, in rank order. */
void llama_tp_gather(struct llama_model *m, const float *shard, float *full);
/* out(Ns, C) = this rank's token rows of the sum over ranks of part(Np, C) (its padding rows
 * N..Np are zeroed first). */
void llama_tp_reduce_scatter(struct llama_model *m, float *part, float *out);
/* Async TP (llama_tp_comm.c explains the ring steps): fn(m, ctx, r0, n, out) computes rows
 * [r0, r0 + n) of the matmul beside the collective. */
typedef void (*llama_tp_ring_fn)(struct llama_model *m, const void *ctx, int64_t r0, int64_t n,
                                 float *out);
/* wire: NULL (fp32), or the fp8 format and scale the shard travels in (tpb->w8) */
struct llama_tp_wire {
	enum fp8_fmt fmt;
	float scale;
};
void llama_tp_ring_gather(struct llama_model *m, const float *shard, float *full,
                          llama_tp_ring_fn fn, const void *ctx, const struct llama_tp_wire *wire);
/* Whether block l's linears ws[0..n) all take fp8 inputs over the wire (tensorwise float8
 * under TP: the gathers that feed only them carry fp8, llama_tp_comm.c). */
bool llama_tp_fp8_wire(const struct llama_model *m, const float *const *ws, int n);
/* This rank's real token rows of the Ns it holds (the last rank's may be padding). */
int64_t llama_tp_held_rows(const struct llama_model *m);
void llama_tp_ring_reduce_scatter(struct llama_model *m, float *out, llama_tp_ring_fn fn,
                                  const void *ctx);

/* The plain collectives the programs name (llama_tp_comm.c; under TP only): the norm output
 * and the residual gradient gathered along the tokens, the row-parallel partial sums
 * reduce-scattered, a norm weight's partial gradients gathered. */
bool llama_c_ag_xn(struct llama_model *m, int l);
bool llama_c_ag_dres(struct llama_model *m, int l);
/* The same for block l's float8 linears: into wq/wk/wv, into w1/w3, into w2's backward and
 * into wo's (fp8 on the wire when every one of them is a tensorwise float8 linear). */
bool llama_c_ag_xn_attn(struct llama_model *m, int l);
bool llama_c_ag_xn_ffn(struct llama_model *m, int l);
bool llama_c_ag_dres_w2(struct llama_model *m, int l);
bool llama_c_ag_dres_wo(struct llama_model *m, int l);
bool llama_c_rs_part(struct llama_model *m, int l);
bool llama_c_ag_dnorm(struct llama_model *m, int l);

/* RMSNorm's backward over this rank's Ns tokens, dx += d(input). Its weight's gradient: on
 * one rank accumulated into dw; under TP partial over the token shards, left for
 * llama_c_ag_dnorm, and llama_norm_sum adds every rank's in rank order (so every rank keeps
 * bitwise identical norm weights; without TP it does nothing). */
void llama_norm_backward(struct llama_model *m, float *dw, float *dx, const float *dout,
                         const float *x, const float *w, const float *rstd);
void llama_norm_sum(struct llama_model *m, float *dw);

#endif
