/* Llama's transformer block, one implementation for one rank and tensor parallelism (the
 * one-rank block is the TP block with a group of one, see llama_impl.h):
 *
 *   h = x + wo(attn(rope(wq xn), rope(wk xn), wv xn)),  xn = rmsnorm(x)
 *   out = h + w2(silu(w1 hn) * w3 hn),                  hn = rmsnorm(h)
 *
 * Under TP the block is Megatron's column/row-parallel block with sequence parallelism: the
 * residual stream (x, xmid, out and their gradients) of rank r is tokens [r*Ns, (r+1)*Ns) of
 * the micro-batch's N = B*T (padded to Np = Ns*tp with zero rows), so RMSNorms and residual
 * adds run on 1/tp of the tokens. Before attention and the FFN the norm output is
 * all-gathered along the tokens; the row-parallel wo and w2 produce partial sums that are
 * reduce-scattered back onto the token shards. Backward mirrors it: all-gather the residual
 * gradient, reduce-scatter the input gradient of the column-parallel matmuls. No all-reduce
 * touches an activation; the replicated norm weights' gradients (partial over token shards)
 * are summed over the group in rank order. Async TP runs the same collectives as ring steps
 * beside the matmuls they feed or drain.
 *
 * Reads top to bottom: forward, async forward, backward (mirroring forward), async
 * backward, selective recompute, the weight half of a split backward, the programs.
 */
#include <string.h>

#include "base/log.h"
#include "kernels/attention_bf16.h"
#include "kernels/fp8_linear.h"
#include "kernels/kernels.h"
#include "kernels/mm_engine.h"
#include "model/llama/llama_impl.h"

/* ---------------------------------------------------------------- a block's operands */

struct blk {
	struct llama_block_ptrs w, dw;
	struct llama_block_acts *a;
	struct llama_dims d;
	float *h1, *h3; /* the up-projections: saved, or scratch under ffn checkpointing */
};

static struct blk blk_of(struct llama_model *m, int l)
{
	struct llama_block_acts *a = &m->acts[l];
	return (struct blk){.w = llama_block_ptrs_of(m, m->unit_w, l),
	                    .dw = llama_block_ptrs_of(m, m->unit_dw, l),
	                    .a = a,
	                    .d = llama_dims_of(m),
	                    .h1 = m->recompute_ffn ? m->h1s : a->h1,
	                    .h3 = m->recompute_ffn ? m->h3s : a->h3};
}

/* ---------------------------------------------------------------- forward */

/* out = res + in w^T for the row-parallel wo and w2 (in: N x K, w: C x K). One rank: one
 * matmul that accumulates onto a copy of the residual. TP: this rank's partial sum into
 * tpb->part; the reduce-scatter sums it onto the token shards and residual_add adds it. */
static void row_parallel_forward(struct llama_model *m, float *out, const float *res,
                                 const float *in, const float *w, int64_t N, int64_t K, int64_t C)
{
	if (!m->tp) {
		memcpy(out, res, (size_t)(N * C) * sizeof(float));
		matmul_forward_f32(out, in, w, N, K, C, 1);
	} else {
		matmul_forward_f32(m->tpb->part, in, w, N, K, C, 0);
	}
}

/* out = res + the reduce-scattered partial sums (n elements; one rank: already done) */
static void residual_add(struct llama_model *m, float *out, const float *res, int64_t n)
{
	if (m->tp)
		llama_tp_add_rows(out, res, m->tpb->rs_out, n);
}

static void f_norm1(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	rmsnorm_forward_f32(m->xn, c.a->rstd1, c.a->x, c.w.attn_norm, c.d.Ns, c.d.C,
	                    m->cfg.norm_eps);
}

/* q, k, v of the (gathered) norm output, q and k rotated */
static void f_qkv(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	const struct llama_dims d = c.d;
	const float *xg = llama_xg(m);
	bool held = mm_bf16_hold(xg, d.N * d.C); /* bf16: rounded once for the three */
	matmul_forward_f32(c.a->q, xg, c.w.wq, d.N, d.C, d.HD, 0);
	matmul_forward_f32(c.a->k, xg, c.w.wk, d.N, d.C, d.KVD, 0);
	matmul_forward_f32(c.a->v, xg, c.w.wv, d.N, d.C, d.KVD, 0);
	if (held)
		mm_bf16_release(xg);
}

static void f_rope(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	const struct llama_dims d = c.d;
	rope_forward_f32(c.a->q, m->rope_cos, m->rope_sin, d.B, d.T, d.H, d.D);
	rope_forward_f32(c.a->k, m->rope_cos, m->rope_sin, d.B, d.T, d.KV, d.D);
}

/* the attention core in a segment: this rank's keys, or under CP every rank's gathered
 * (the ring computes it in its collective, llama_cp.c) */
static void f_attn_core(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	const struct llama_dims d = c.d;
	struct llama_block_acts *a = c.a;
	if (m->cp)
		llama_cp_attention_forward(m, a);
	else
		attention_mixed_forward(a->att, a->lse, a->q, a->k, a->v, d.B, d.T, d.H, d.KV, d.D);
}

static void f_wo(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	const struct llama_dims d = c.d;
	row_parallel_forward(m, c.a->xmid, c.a->x, c.a->att, c.w.wo, d.N, d.HD, d.C);
}

static void f_mid(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	residual_add(m, c.a->xmid, c.a->x, c.d.Ns * c.d.C);
	rmsnorm_forward_f32(m->xn, c.a->rstd2, c.a->xmid, c.w.ffn_norm, c.d.Ns, c.d.C,
	                    m->cfg.norm_eps);
}

static void f_ffn(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	const struct llama_dims d = c.d;
	const float *xg = llama_xg(m);
	bool held = mm_bf16_hold(xg, d.N * d.C);
	matmul_forward_f32(c.h1, xg, c.w.w1, d.N, d.C, d.F, 0);
	matmul_forward_f32(c.h3, xg, c.w.w3, d.N, d.C, d.F, 0);
	if (held)
		mm_bf16_release(xg);
	swiglu_forward_f32(m->gate, c.h1, c.h3, d.N * d.F);
	row_parallel_forward(m, llama_block_output(m, l), c.a->xmid, m->gate, c.w.w2, d.N, d.F,
	                     d.C);
}

static void f_out(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	residual_add(m, llama_block_output(m, l), c.a->xmid, c.d.Ns * c.d.C);
}

/* ---------------------------------------------------------------- async forward (TP only)
 *
 * The matmuls beside a collective ride its ring steps, one token block at a time: the
 * callbacks compute the matmul rows of one block. */

static void f_swiglu(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	swiglu_forward_f32(m->gate, c.h1, c.h3, c.d.N * c.d.F);
}

static void rf_qkv(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct blk *c = ctx;
	const float *x = m->tpb->xg + r0 * c->d.C;
	(void)out;
	matmul_forward_f32(c->a->q + r0 * c->d.HD, x, c->w.wq, n, c->d.C, c->d.HD, 0);
	matmul_forward_f32(c->a->k + r0 * c->d.KVD, x, c->w.wk, n, c->d.C, c->d.KVD, 0);
	matmul_forward_f32(c->a->v + r0 * c->d.KVD, x, c->w.wv, n, c->d.C, c->d.KVD, 0);
}

static void rf_w13(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct blk *c = ctx;
	const float *x = m->tpb->xg + r0 * c->d.C;
	(void)out;
	matmul_forward_f32(c->h1 + r0 * c->d.F, x, c->w.w1, n, c->d.C, c->d.F, 0);
	matmul_forward_f32(c->h3 + r0 * c->d.F, x, c->w.w3, n, c->d.C, c->d.F, 0);
}

static void rf_wo(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct blk *c = ctx;
	(void)m;
	matmul_forward_f32(out, c->a->att + r0 * c->d.HD, c->w.wo, n, c->d.HD, c->d.C, 0);
}

static void rf_w2(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct blk *c = ctx;
	matmul_forward_f32(out, m->gate + r0 * c->d.F, c->w.w2, n, c->d.F, c->d.C, 0);
}

/* ---------------------------------------------------------------- backward
 *
 * Mirrors the forward bottom-up. On entry m->dres = dL/d(out) on the token shard, on exit
 * dL/d(x). With a split backward the matmuls' weight gradients are left to
 * llama_block_backward_weight: what it needs is copied out here. */

static void b_norm2(struct llama_model *m, int l) /* the FFN norm's output again */
{
	struct blk c = blk_of(m, l);
	rmsnorm_forward_f32(m->xn, c.a->rstd2, c.a->xmid, c.w.ffn_norm, c.d.Ns, c.d.C,
	                    m->cfg.norm_eps);
}

/* feed-forward: out = xmid + w2(gate), gate = silu(h1) * h3, h = w(1|3) hn */
static void b_ffn(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	const struct llama_dims d = c.d;
	const float *dout = llama_dout(m), *xg = llama_xg(m);
	float *dx = llama_dx_part(m);
	size_t nc = (size_t)(d.N * d.C) * sizeof(float), nf = (size_t)(d.N * d.F) * sizeof(float);
	const float *h1 = c.a->h1, *h3 = c.a->h3;
	/* bf16: xg feeds up to four matmuls here and dout two, each rounded once; dout is
	 * released before dx, which is the same buffer under TP, is written */
	const struct llama_wkeep k = llama_wkeep_at(m, l + 1);
	bool split = k.dout2 != NULL;
	bool held_x = (!split || m->recompute_ffn) && mm_bf16_hold(xg, d.N * d.C);
	if (m->recompute_ffn) { /* activation_checkpoint.mode = ffn: the up-projections again */
		matmul_forward_f32(m->h1s, xg, c.w.w1, d.N, d.C, d.F, 0);
		matmul_forward_f32(m->h3s, xg, c.w.w3, d.N, d.C, d.F, 0);
		h1 = m->h1s;
		h3 = m->h3s;
	}
	swiglu_forward_f32(m->gate, h1, h3, d.N * d.F);
	bool held_d = !split && mm_bf16_hold(dout, d.N * d.C);
	if (split) {
		memcpy(k.dout2, dout, nc);
		memcpy(k.gate, m->gate, nf);
	} else {
		matmul_backward_f32(NULL, c.dw.w2, dout, m->gate, c.w.w2, d.N, d.F, d.C);
	}
	/* the first write of each activation gradient overwrites it (beta 0): no zeroing pass */
	matmul_backward_set_f32(m->gate, NULL, dout, NULL, c.w.w2, d.N, d.F, d.C); /* d(gate) */
	if (held_d)
		mm_bf16_release(dout);
	swiglu_backward_f32(m->dh1, m->dh3, m->gate, h1, h3, d.N * d.F);
	matmul_backward_set_f32(dx, split ? NULL : c.dw.w1, m->dh1, xg, c.w.w1, d.N, d.C, d.F);
	matmul_backward_f32(dx, split ? NULL : c.dw.w3, m->dh3, xg, c.w.w3, d.N, d.C, d.F);
	if (held_x)
		mm_bf16_release(xg);
	if (split) {
		memcpy(k.dh1, m->dh1, nf);
		memcpy(k.dh3, m->dh3, nf);
		memcpy(k.xn2, xg, nc);
	}
}

static void b_ffn_norm(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	llama_norm_backward(m, c.dw.ffn_norm, m->dres, llama_dx_shard(m), c.a->xmid, c.w.ffn_norm,
	                    c.a->rstd2);
}

static void b_ffn_norm_sum(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	llama_norm_sum(m, c.dw.ffn_norm);
}

/* The attention core's backward: m->dq, m->dk, m->dv zeroed, then (b_attn_core, or under
 * CP its items) from m->datt into them, then RoPE's backward on dq and dk and the attention
 * norm's output again (b_rope_norm1). */
static void b_attn_zero(struct llama_model *m, int l)
{
	const struct llama_dims d = llama_dims_of(m);
	(void)l;
	memset(m->dq, 0, (size_t)(d.N * d.HD) * sizeof(float));
	memset(m->dk, 0, (size_t)(d.N * d.KVD) * sizeof(float));
	memset(m->dv, 0, (size_t)(d.N * d.KVD) * sizeof(float));
}

static void b_attn_core(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	const struct llama_dims d = c.d;
	const struct llama_block_acts *a = c.a;
	if (m->cp)
		llama_cp_attention_backward(m, a);
	else
		attention_mixed_backward(m->dq, m->dk, m->dv, m->datt, a->att, a->lse, a->q, a->k,
		                       a->v, d.B, d.T, d.H, d.KV, d.D);
}

static void b_rope_norm1(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	const struct llama_dims d = c.d;
	const struct llama_block_acts *a = c.a;
	rope_backward_f32(m->dq, m->rope_cos, m->rope_sin, d.B, d.T, d.H, d.D);
	rope_backward_f32(m->dk, m->rope_cos, m->rope_sin, d.B, d.T, d.KV, d.D);
	rmsnorm_forward_f32(m->xn, a->rstd1, a->x, c.w.attn_norm, d.Ns, d.C, m->cfg.norm_eps);
}

/* attention: xmid = x + wo(att) */
static void b_wo(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	const struct llama_dims d = c.d;
	const float *dout = llama_dout(m);
	const struct llama_wkeep k = llama_wkeep_at(m, l + 1);
	bool split = k.dout2 != NULL;
	matmul_backward_set_f32(m->datt, split ? NULL : c.dw.wo, dout, c.a->att, c.w.wo, d.N, d.HD,
	                        d.C);
	if (split) { /* att may live in a buffer the next block's recompute reuses */
		memcpy(k.dout1, dout, (size_t)(d.N * d.C) * sizeof(float));
		memcpy(k.att, c.a->att, (size_t)(d.N * d.HD) * sizeof(float));
	}
}

static void b_qkv(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	const struct llama_dims d = c.d;
	const float *xg = llama_xg(m);
	float *dx = llama_dx_part(m);
	const struct llama_wkeep k = llama_wkeep_at(m, l + 1);
	bool split = k.dout2 != NULL;
	bool held = !split && mm_bf16_hold(xg, d.N * d.C); /* bf16: rounded once for dW */
	if (m->tp) { /* zeroed, then accumulated (padding rows included) */
		memset(dx, 0, (size_t)(m->Np * d.C) * sizeof(float));
		matmul_backward_f32(dx, split ? NULL : c.dw.wq, m->dq, xg, c.w.wq, d.N, d.C, d.HD);
	} else {
		matmul_backward_set_f32(dx, split ? NULL : c.dw.wq, m->dq, xg, c.w.wq, d.N, d.C,
		                        d.HD);
	}
	matmul_backward_f32(dx, split ? NULL : c.dw.wk, m->dk, xg, c.w.wk, d.N, d.C, d.KVD);
	matmul_backward_f32(dx, split ? NULL : c.dw.wv, m->dv, xg, c.w.wv, d.N, d.C, d.KVD);
	if (held)
		mm_bf16_release(xg);
	if (split) {
		memcpy(k.dq, m->dq, (size_t)(d.N * d.HD) * sizeof(float));
		memcpy(k.dk, m->dk, (size_t)(d.N * d.KVD) * sizeof(float));
		memcpy(k.dv, m->dv, (size_t)(d.N * d.KVD) * sizeof(float));
		memcpy(k.xn1, xg, (size_t)(d.N * d.C) * sizeof(float));
	}
}

static void b_attn_norm(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	llama_norm_backward(m, c.dw.attn_norm, m->dres, llama_dx_shard(m), c.a->x, c.w.attn_norm,
	                    c.a->rstd1);
}

static void b_attn_norm_sum(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	llama_norm_sum(m, c.dw.attn_norm);
}

/* ---------------------------------------------------------------- async backward (TP only)
 *
 * The same collectives as rings. Under ffn checkpointing the norm output is gathered first,
 * recomputing the up-projections on the way, and then serves the weight gradients as it is;
 * otherwise the output gradient comes first. */

/* the gathered output gradient (in tpb->part) through w2: dW2 from the saved gate rows, then
 * those rows become d(gate) */
static void rb_w2(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct blk *c = ctx;
	const float *g = m->tpb->part + r0 * c->d.C;
	float *gate = m->gate + r0 * c->d.F;
	(void)out;
	matmul_backward_f32(NULL, c->dw.w2, g, gate, c->w.w2, n, c->d.F, c->d.C);
	memset(gate, 0, (size_t)(n * c->d.F) * sizeof(float));
	matmul_backward_f32(gate, NULL, g, NULL, c->w.w2, n, c->d.F, c->d.C);
}

static void rb_wo(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct blk *c = ctx;
	const float *g = m->tpb->part + r0 * c->d.C;
	(void)out;
	matmul_backward_f32(m->datt + r0 * c->d.HD, c->dw.wo, g, c->a->att + r0 * c->d.HD, c->w.wo,
	                    n, c->d.HD, c->d.C);
}

/* weight gradients of w1, w3 from the gathered norm output */
static void rb_dw13(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct blk *c = ctx;
	const float *x = m->tpb->xg + r0 * c->d.C;
	(void)out;
	matmul_backward_f32(NULL, c->dw.w1, m->dh1 + r0 * c->d.F, x, c->w.w1, n, c->d.C, c->d.F);
	matmul_backward_f32(NULL, c->dw.w3, m->dh3 + r0 * c->d.F, x, c->w.w3, n, c->d.C, c->d.F);
}

static void rb_dx13(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct blk *c = ctx;
	matmul_backward_f32(out, NULL, m->dh1 + r0 * c->d.F, NULL, c->w.w1, n, c->d.C, c->d.F);
	matmul_backward_f32(out, NULL, m->dh3 + r0 * c->d.F, NULL, c->w.w3, n, c->d.C, c->d.F);
}

static void rb_dwqkv(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct blk *c = ctx;
	const struct llama_dims *d = &c->d;
	const float *x = m->tpb->xg + r0 * d->C;
	(void)out;
	matmul_backward_f32(NULL, c->dw.wq, m->dq + r0 * d->HD, x, c->w.wq, n, d->C, d->HD);
	matmul_backward_f32(NULL, c->dw.wk, m->dk + r0 * d->KVD, x, c->w.wk, n, d->C, d->KVD);
	matmul_backward_f32(NULL, c->dw.wv, m->dv + r0 * d->KVD, x, c->w.wv, n, d->C, d->KVD);
}

static void rb_dxqkv(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct blk *c = ctx;
	const struct llama_dims *d = &c->d;
	matmul_backward_f32(out, NULL, m->dq + r0 * d->HD, NULL, c->w.wq, n, d->C, d->HD);
	matmul_backward_f32(out, NULL, m->dk + r0 * d->KVD, NULL, c->w.wk, n, d->C, d->KVD);
	matmul_backward_f32(out, NULL, m->dv + r0 * d->KVD, NULL, c->w.wv, n, d->C, d->KVD);
}

/* Float8 linears beside a ring (kernels/fp8_linear.h, row blocks): the operands its callback
 * multiplies in row blocks, and the weights, declared before the ring with the amaxes one
 * rank would take (max-reduced over the TP group: the gathered ones hold a token shard here,
 * the others this rank's features; under context parallelism the tensorwise ones over the cp
 * group too: this rank holds a piece of the micro-batch's tokens). Every TP rank declares the
 * same, in the same order. */
enum ring_uses {
	RU_XN = 1u << 0,   /* the norm output, gathered into tpb->xg */
	RU_DRES = 1u << 1, /* the residual gradient, gathered into tpb->part */
	RU_ATT = 1u << 2,
	RU_GATE = 1u << 3,
	RU_DQKV = 1u << 4,
	RU_DH13 = 1u << 5,
	RU_WQKV = 1u << 6,
	RU_WO = 1u << 7,
	RU_W13 = 1u << 8,
	RU_W2 = 1u << 9,
};

static bool ring_fp8_begin(struct llama_model *m, const struct blk *c, unsigned uses)
{
	if (!fp8_linear_enabled())
		return false;
	const struct llama_dims *d = &c->d;
	const bool tok = m->cp && m->cp->size > 1;
	const struct fp8_slice red = {.dim = -1,
	                              .max_f32 = m->tp->all_reduce_max_f32,
	                              .ctx = m->tp->ctx,
	                              .tok_max_f32 = tok ? m->cp->all_reduce_max_f32 : NULL,
	                              .tok_ctx = tok ? m->cp->ctx : NULL};
	int64_t held = llama_tp_held_rows(m);
	const struct {
		unsigned use;
		const float *x;
		int64_t cols;
	} local[] = {{RU_ATT, c->a->att, d->HD}, {RU_GATE, m->gate, d->F}, {RU_DQKV, m->dq, d->HD},
	             {RU_DQKV, m->dk, d->KVD},   {RU_DQKV, m->dv, d->KVD},  {RU_DH13, m->dh1, d->F},
	             {RU_DH13, m->dh3, d->F}};
	const struct {
		unsigned use;
		const float *w;
	} weights[] = {{RU_WQKV, c->w.wq}, {RU_WQKV, c->w.wk}, {RU_WQKV, c->w.wv},
	               {RU_WO, c->w.wo},   {RU_W13, c->w.w1},  {RU_W13, c->w.w3},
	               {RU_W2, c->w.w2}};
	fp8_block_begin();
	if (uses & RU_XN)
		fp8_block_operand(m->tpb->xg, d->N, d->C, m->xn, held, FP8_SPLIT_ROWS, &red);
	if (uses & RU_DRES)
		fp8_block_operand(m->tpb->part, d->N, d->C, m->dres, held, FP8_SPLIT_ROWS, &red);
	for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++)
		if (uses & local[i].use)
			fp8_block_operand(local[i].x, d->N, local[i].cols, local[i].x, d->N,
			                  FP8_SPLIT_COLS, &red);
	for (size_t i = 0; i < sizeof(weights) / sizeof(weights[0]); i++)
		if ((uses & weights[i].use) && fp8_linear_is(weights[i].w))
			fp8_block_weight(weights[i].w);
	return true;
}

/* A gathering ring's wire (llama_tp_comm.c, fp8 on the wire): fp8 when every weight it
 * feeds is a tensorwise float8 linear, cast with the amax declared for the gathered operand;
 * NULL (fp32) otherwise. */
static const struct llama_tp_wire *ring_wire(struct llama_model *m, const struct blk *c,
                                             unsigned uses, const float *full,
                                             struct llama_tp_wire *out)
{
	const float *ws[3];
	int n = 0;
	if (uses & RU_WQKV)
		ws[n++] = c->w.wq, ws[n++] = c->w.wk, ws[n++] = c->w.wv;
	else if (uses & RU_W13)
		ws[n++] = c->w.w1, ws[n++] = c->w.w3;
	else if (uses & RU_W2)
		ws[n++] = c->w.w2;
	else if (uses & RU_WO)
		ws[n++] = c->w.wo;
	if (!fp8_block_active() || !llama_tp_fp8_wire(m, ws, n))
		return NULL;
	out->fmt = full == m->tpb->part ? FP8_E5M2 : FP8_E4M3; /* a gradient, or the norm output */
	out->scale = fp8_scale_from_amax(fp8_block_amax(full), out->fmt, false);
	return out;
}

/* the ring collectives: a gather or reduce-scatter with the callback beside it */
#define RING_GATHER(name, src, dst, fn, uses)                                                      \
	static bool name(struct llama_model *m, int l)                                             \
	{                                                                                          \
		struct blk c = blk_of(m, l);                                                       \
		struct llama_tp_wire w;                                                            \
		bool f8 = ring_fp8_begin(m, &c, uses);                                             \
		llama_tp_ring_gather(m, src, dst, fn, &c, ring_wire(m, &c, uses, dst, &w));        \
		if (f8)                                                                            \
			fp8_block_end();                                                           \
		return true;                                                                       \
	}
#define RING_REDUCE_SCATTER(name, fn, uses)                                                        \
	static bool name(struct llama_model *m, int l)                                             \
	{                                                                                          \
		struct blk c = blk_of(m, l);                                                       \
		bool f8 = ring_fp8_begin(m, &c, uses);                                             \
		llama_tp_ring_reduce_scatter(m, m->tpb->rs_out, fn, &c);                           \
		if (f8)                                                                            \
			fp8_block_end();                                                           \
		return true;                                                                       \
	}

RING_GATHER(r_ag_qkv, m->xn, m->tpb->xg, rf_qkv, RU_XN | RU_WQKV)
RING_REDUCE_SCATTER(r_rs_wo, rf_wo, RU_ATT | RU_WO)
RING_GATHER(r_ag_w13, m->xn, m->tpb->xg, rf_w13, RU_XN | RU_W13)
RING_REDUCE_SCATTER(r_rs_w2, rf_w2, RU_GATE | RU_W2)
RING_GATHER(r_ag_dres_w2, m->dres, m->tpb->part, rb_w2, RU_DRES | RU_GATE | RU_W2)
RING_GATHER(r_ag_dw13, m->xn, m->tpb->xg, rb_dw13, RU_XN | RU_DH13 | RU_W13)
RING_REDUCE_SCATTER(r_rs_dx13, rb_dx13, RU_DH13 | RU_W13)
RING_GATHER(r_ag_dwqkv, m->xn, m->tpb->xg, rb_dwqkv, RU_XN | RU_DQKV | RU_WQKV)
RING_REDUCE_SCATTER(r_rs_dxqkv, rb_dxqkv, RU_DQKV | RU_WQKV)

/* wo's input gradient accumulates over the ring's blocks: zero it first */
static bool r_ag_dres_wo(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	memset(m->datt, 0, (size_t)(c.d.N * c.d.HD) * sizeof(float));
	const unsigned uses = RU_DRES | RU_ATT | RU_WO;
	struct llama_tp_wire w;
	bool f8 = ring_fp8_begin(m, &c, uses);
	llama_tp_ring_gather(m, m->dres, m->tpb->part, rb_wo, &c,
	                     ring_wire(m, &c, uses, m->tpb->part, &w));
	if (f8)
		fp8_block_end();
	return true;
}

static void ba_0(struct llama_model *m, int l)
{
	if (m->recompute_ffn) {
		b_norm2(m, l);
	} else {
		struct blk c = blk_of(m, l);
		swiglu_forward_f32(m->gate, c.h1, c.h3, c.d.N * c.d.F);
	}
}

static bool ba_c0(struct llama_model *m, int l)
{
	return m->recompute_ffn ? r_ag_w13(m, l) : r_ag_dres_w2(m, l);
}

static void ba_1(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	if (m->recompute_ffn) {
		swiglu_forward_f32(m->gate, c.h1, c.h3, c.d.N * c.d.F);
	} else {
		swiglu_backward_f32(m->dh1, m->dh3, m->gate, c.h1, c.h3, c.d.N * c.d.F);
		b_norm2(m, l);
	}
}

static bool ba_c1(struct llama_model *m, int l)
{
	return m->recompute_ffn ? r_ag_dres_w2(m, l) : r_ag_dw13(m, l);
}

static void ba_2(struct llama_model *m, int l)
{
	if (!m->recompute_ffn)
		return;
	struct blk c = blk_of(m, l);
	swiglu_backward_f32(m->dh1, m->dh3, m->gate, c.h1, c.h3, c.d.N * c.d.F);
	rb_dw13(m, &c, 0, c.d.N, NULL);
}

/* ---------------------------------------------------------------- selective recompute
 *
 * What the per-op policy dropped — k (wk, the 2nd matmul), the residual after attention (wo,
 * the 4th), h3 (w3, the 6th) and both norms — from the saved x and attention output, with the
 * same kernels in the same order as the forward (under TP the norm outputs are gathered again
 * and wo's partial sums reduce-scattered again: plain collectives, also under async TP). */

static void s_k_wo(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	const struct llama_dims d = c.d;
	matmul_forward_f32(c.a->k, llama_xg(m), c.w.wk, d.N, d.C, d.KVD, 0);
	rope_forward_f32(c.a->k, m->rope_cos, m->rope_sin, d.B, d.T, d.KV, d.D);
	row_parallel_forward(m, c.a->xmid, c.a->x, c.a->att, c.w.wo, d.N, d.HD, d.C);
}

static void s_w3(struct llama_model *m, int l)
{
	struct blk c = blk_of(m, l);
	matmul_forward_f32(c.a->h3, llama_xg(m), c.w.w3, c.d.N, c.d.C, c.d.F, 0);
}

/* ---------------------------------------------------------------- split backward: W */

/* The weight-gradient half of block l's split backward, in the backward's order. */
void llama_block_backward_weight(struct llama_model *m, int l, const struct llama_wkeep *k)
{
	struct blk c = blk_of(m, l);
	const struct llama_dims d = c.d;
	matmul_backward_f32(NULL, c.dw.w2, k->dout2, k->gate, c.w.w2, d.N, d.F, d.C);
	matmul_backward_f32(NULL, c.dw.w1, k->dh1, k->xn2, c.w.w1, d.N, d.C, d.F);
	matmul_backward_f32(NULL, c.dw.w3, k->dh3, k->xn2, c.w.w3, d.N, d.C, d.F);
	matmul_backward_f32(NULL, c.dw.wo, k->dout1, k->att, c.w.wo, d.N, d.HD, d.C);
	matmul_backward_f32(NULL, c.dw.wq, k->dq, k->xn1, c.w.wq, d.N, d.C, d.HD);
	matmul_backward_f32(NULL, c.dw.wk, k->dk, k->xn1, c.w.wk, d.N, d.C, d.KVD);
	matmul_backward_f32(NULL, c.dw.wv, k->dv, k->xn1, c.w.wv, d.N, d.C, d.KVD);
}

/* ---------------------------------------------------------------- programs */

#define SEG    LLAMA_SEG
#define SEG_NR LLAMA_SEG_NR
#define AG     LLAMA_AG
#define RS     LLAMA_RS
#define AGN    LLAMA_AGN
#define RAG    LLAMA_RAG
#define RRS    LLAMA_RRS
#define CP_AG  LLAMA_CP_AG
#define CP_RS  LLAMA_CP_RS
#define CP_RNG LLAMA_CP_RING

/* the attention core, and under CP its K/V transfers: forward, backward */
#define ATTN_FWD                                                                                   \
	SEG(f_rope), CP_AG(llama_cp_c_gather), SEG_NR(f_attn_core), CP_RNG(llama_cp_c_ring_forward)
#define ATTN_BWD                                                                                   \
	SEG(b_attn_zero), CP_AG(llama_cp_c_gather), SEG_NR(b_attn_core),                           \
	    CP_RS(llama_cp_c_reduce_scatter), CP_RNG(llama_cp_c_ring_backward), SEG(b_rope_norm1)

static const struct llama_op block_fwd[] = {
    SEG(f_norm1), AG(llama_c_ag_xn_attn), SEG(f_qkv),  ATTN_FWD,
    SEG(f_wo),    RS(llama_c_rs_part),    SEG(f_mid),  AG(llama_c_ag_xn_ffn),
    SEG(f_ffn),   RS(llama_c_rs_part),    SEG(f_out)};
static const struct llama_op block_fwd_async[] = {
    SEG(f_norm1), RAG(r_ag_qkv, LLAMA_MM_QKV), ATTN_FWD,  RRS(r_rs_wo, LLAMA_MM_WO),
    SEG(f_mid),   RAG(r_ag_w13, LLAMA_MM_W13), SEG(f_swiglu), RRS(r_rs_w2, LLAMA_MM_W2),
    SEG(f_out)};

static const struct llama_op block_bwd[] = {
    SEG(NULL),
    AG(llama_c_ag_dres_w2),
    SEG(b_norm2),
    AG(llama_c_ag_xn_ffn),
    SEG(b_ffn),
    RS(llama_c_rs_part),
    SEG(b_ffn_norm),
    AGN(llama_c_ag_dnorm),
    SEG(b_ffn_norm_sum),
    AG(llama_c_ag_dres_wo),
    SEG(b_wo),
    ATTN_BWD,
    AG(llama_c_ag_xn_attn),
    SEG(b_qkv),
    RS(llama_c_rs_part),
    SEG(b_attn_norm),
    AGN(llama_c_ag_dnorm),
    SEG(b_attn_norm_sum),
};
static const struct llama_op block_bwd_async[] = {
    SEG(ba_0),
    RAG(ba_c0, LLAMA_MM_W2),
    SEG(ba_1),
    RAG(ba_c1, LLAMA_MM_W13),
    SEG(ba_2),
    RRS(r_rs_dx13, LLAMA_MM_W13),
    SEG(b_ffn_norm),
    AGN(llama_c_ag_dnorm),
    SEG(b_ffn_norm_sum),
    RAG(r_ag_dres_wo, LLAMA_MM_WO),
    ATTN_BWD,
    RAG(r_ag_dwqkv, LLAMA_MM_QKV),
    SEG(NULL),
    RRS(r_rs_dxqkv, LLAMA_MM_QKV),
    SEG(b_attn_norm),
    AGN(llama_c_ag_dnorm),
    SEG(b_attn_norm_sum),
};

static const struct llama_op block_rec_selective[] = {
    SEG(f_norm1), AG(llama_c_ag_xn_attn), SEG(s_k_wo), RS(llama_c_rs_part),
    SEG(f_mid),   AG(llama_c_ag_xn_ffn),  SEG(s_w3)};

struct llama_prog llama_block_prog(bool async, enum model_ac ac, enum model_pass p)
{
	if (p == MODEL_PASS_BWD)
		return async ? LLAMA_PROG(block_bwd_async) : LLAMA_PROG(block_bwd);
	if (p == MODEL_PASS_REC && ac == MODEL_AC_SELECTIVE)
		return LLAMA_PROG(block_rec_selective);
	return async ? LLAMA_PROG(block_fwd_async) : LLAMA_PROG(block_fwd);
}
