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

/* Which context-parallel form an op of a program belongs to: every form (ANY), only the
 * all-gather form (the K/V all-gather and the dK/dV reduce-scatter), only the ring (its
 * K/V steps fused with the attention of the shard held), or every form but the ring (the
 * attention core computed in a segment: one rank's, or against the gathered keys). */
enum llama_cp_form { LLAMA_CP_ANY, LLAMA_CP_ALLGATHER, LLAMA_CP_RING, LLAMA_CP_NOT_RING };

/* One item of a pass's table: a segment (seg; NULL: nothing to compute) or a collective
 * (coll, which returns whether it ran: the loss gradient's reduce-scatter runs on one side
 * of the fused loss only). Segments hand state to the next item through the model's
 * buffers, so the items in order compute the pass; l is the block (unit - 1). A collective
 * of role TP is in the program only under TP, one of role CP only under CP in its form;
 * one rank has neither (llama_prog_eff). */
struct llama_op {
	void (*seg)(struct llama_model *m, int l);
	bool (*coll)(struct llama_model *m, int l);
	enum model_coll kind;
	enum llama_coll_size size;
	bool ring;                 /* async TP: ring steps with the matmul beside it */
	enum model_coll_when when; /* MODEL_COLL_ALWAYS unless the loss gradient's */
	enum llama_ring_mm ring_mm;
	enum model_group_role role;
	enum llama_cp_form cp;
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
/* a segment every context-parallel form but the ring has */
#define LLAMA_SEG_NR(f)                                                                            \
	{                                                                                          \
		.seg = (f), .cp = LLAMA_CP_NOT_RING                                                \
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
/* context parallelism's K/V transfers (llama_cp.c): the all-gather form's gather of K and V
 * and reduce-scatter of dK and dV, and the ring (forward or backward, the attention inside) */
#define LLAMA_CP_AG(f)                                                                             \
	{                                                                                          \
		.coll = (f), .kind = MODEL_COLL_ALL_GATHER, .role = MODEL_GROUP_CP,                \
		.cp = LLAMA_CP_ALLGATHER                                                           \
	}
#define LLAMA_CP_RS(f)                                                                             \
	{                                                                                          \
		.coll = (f), .kind = MODEL_COLL_REDUCE_SCATTER, .role = MODEL_GROUP_CP,            \
		.cp = LLAMA_CP_ALLGATHER                                                           \
	}
#define LLAMA_CP_RING(f)                                                                           \
	{                                                                                          \
		.coll = (f), .kind = MODEL_COLL_ALL_GATHER, .role = MODEL_GROUP_CP, .ring = true,  \
		.cp = LLAMA_CP_RING                                                                \
	}

/* What a program depends on of the layout: TP (and async TP), CP (and its form). */
struct llama_layout {
	bool tp, async, cp, ring;
};

/* A pass as it runs in a layout: op 2k is segment k, the table's items [lo, hi) (those of
 * them that are segments of the layout, in order), op 2k + 1 collective k, item lo. One
 * rank's program is one segment: every item a segment of the pass. */
struct llama_eff {
	int n_ops;
	struct {
		int lo, hi;
	} op[2 * MODEL_PROG_MAX + 1];
};
bool llama_op_in(const struct llama_op *o, struct llama_layout lay);
void llama_prog_eff(struct llama_prog g, struct llama_layout lay, struct llama_eff *e);

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
/* the layout of a built model */
struct llama_layout llama_layout_of(const struct llama_model *m);

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
/* the ring form (rotate method alltoall); shards not in sequence order (head-tail) */
bool llama_cp_ring_form(const struct llama_model *m);
bool llama_cp_headtail(const struct llama_model *m);
/* The program items of the attention core under CP (l: the block; a pass's items in this
 * order). Forward: the all-gather form gathers K and V (llama_cp_c_gather), then
 * llama_cp_attention_forward computes a->att, a->lse of the local queries against all of
 * them; the ring computes them in llama_cp_c_ring_forward. Backward (m->dq, m->dk, m->dv
 * zeroed before, m->datt given): the all-gather form gathers again, computes every key's
 * share of the gradient and stages it (llama_cp_attention_backward), and reduce-scatters it
 * onto the shards (llama_cp_c_reduce_scatter); the ring does all of it in
 * llama_cp_c_ring_backward. */
bool llama_cp_c_gather(struct llama_model *m, int l);
void llama_cp_attention_forward(struct llama_model *m, struct llama_block_acts *a);
bool llama_cp_c_ring_forward(struct llama_model *m, int l);
void llama_cp_attention_backward(struct llama_model *m, const struct llama_block_acts *a);
bool llama_cp_c_reduce_scatter(struct llama_model *m, int l);
bool llama_cp_c_ring_backward(struct llama_model *m, int l);

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
