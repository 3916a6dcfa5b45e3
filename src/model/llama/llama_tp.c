/* Llama under tensor parallelism: Megatron's column/row-parallel blocks with sequence
 * parallelism and a vocabulary-parallel loss, on the same table and activations as llama.c
 * (the table is the rank's slice, see llama_table_build_tp).
 *
 * Sequence parallelism: the residual stream (x, xmid, x_final and their gradients) of rank r
 * is tokens [r*Ns, (r+1)*Ns) of the micro-batch's N = B*T (padded to Np = Ns*tp with zero
 * rows), so RMSNorms and residual adds run on 1/tp of the tokens. Before attention and the
 * FFN the norm output is all-gathered along the tokens; the row-parallel wo and w2 produce
 * partial sums that are reduce-scattered back onto the token shards. Backward mirrors it:
 * all-gather the residual gradient, reduce-scatter the input gradient of the
 * column-parallel matmuls. No all-reduce touches an activation; the replicated norm weights'
 * gradients (partial over token shards) are summed over the group in rank order, so every
 * rank keeps bitwise identical norm weights.
 *
 * Vocabulary parallelism: the embedding rows [v0, v0+Vs) live on one rank; each rank embeds
 * the tokens it owns (zeros elsewhere) and the reduce-scatter that follows both sums and
 * shards them. The output projection is split the same way and the cross-entropy is computed
 * on vocabulary-sharded logits in chunks of rows: per-row max (all-reduce max), sum of
 * exponentials and target logit (all-reduce sum); the (N, V) logits never exist anywhere.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "model/model_group.h"
#include "kernels/kernels.h"
#include "model/llama/llama_tp_impl.h"
#include "model/model_prog.h"

/* ---------------------------------------------------------------- dimensions */

struct tp_dims {
	int64_t B, T, N, Ns, C, D, H, KV, HD, KVD, F;
};

static struct tp_dims tp_dims(const struct llama_model *m)
{
	const struct llama_config *c = &m->cfg;
	int64_t S = m->tp->size;
	struct tp_dims d = {.B = m->B,
	                    .T = m->T,
	                    .N = m->N,
	                    .Ns = m->Ns,
	                    .C = c->dim,
	                    .D = c->head_dim,
	                    .H = c->n_heads / S,
	                    .KV = c->n_kv_heads / S,
	                    .F = c->ffn_hidden / S};
	d.HD = d.H * d.D;
	d.KVD = d.KV * d.D;
	return d;
}

/* ---------------------------------------------------------------- head: loss parallelism */

/* Cross-entropy of xn_final(N, C) against the vocabulary-sharded output projection, in
 * chunks of rows (scratch holds chunk x Vs logits). Returns the loss sum (identical on every
 * rank of the group). With dx (Np, C) and dw, accumulates d(loss_sum * dscale): dx is this
 * rank's partial sum over its vocabulary piece (reduce-scatter it), dw its rows. */
static double tp_cross_entropy(struct llama_model *m, float *dx, float *dw, double dscale,
                               int64_t *n_valid)
{
	const struct param_entry *p = &m->table.p[PARAM_OUTPUT(m)];
	const float *w = llama_tensor_at(m, m->unit_w, PARAM_OUTPUT(m));
	int64_t C = m->cfg.dim, Vs = p->shape[0], v0 = p->tp_start, vn = p->tp_valid;
	int64_t chunk = m->ce_rows;
	float *zmax = m->tpb->stat, *sum = zmax + chunk, *ztgt = sum + chunk;
	bool grad = dx || dw;
	double loss_sum = 0.0;
	int64_t valid = 0;
	for (int64_t n0 = 0; n0 < m->N; n0 += chunk) {
		int64_t rows = m->N - n0 < chunk ? m->N - n0 : chunk;
		const float *xc = m->xn_final + n0 * C;
		const int32_t *tg = m->targets + n0;
		float *z = m->ce_scratch;
		matmul_forward_f32(z, xc, w, rows, C, Vs, 0);
#pragma omp parallel for schedule(static)
		for (int64_t r = 0; r < rows; r++) {
			const float *zr = z + r * Vs;
			float mx = -FLT_MAX;
			for (int64_t j = 0; j < vn; j++)
				mx = zr[j] > mx ? zr[j] : mx;
			zmax[r] = mx;
		}
		m->tp->all_reduce_max_f32(m->tp->ctx, zmax, rows);
#pragma omp parallel for schedule(static)
		for (int64_t r = 0; r < rows; r++) {
			const float *zr = z + r * Vs;
			float s = 0;
			for (int64_t j = 0; j < vn; j++)
				s += expf(zr[j] - zmax[r]);
			sum[r] = s;
			int64_t t = (int64_t)tg[r] - v0;
			ztgt[r] = tg[r] != LLAMA_IGNORE_INDEX && t >= 0 && t < vn ? zr[t] : 0.0f;
		}
		/* sum and ztgt are adjacent */
		m->tp->all_reduce_sum_f32(m->tp->ctx, sum, 2 * chunk);
		double chunk_loss = 0.0;
		int64_t chunk_valid = 0;
#pragma omp parallel for schedule(static) reduction(+ : chunk_loss, chunk_valid)
		for (int64_t r = 0; r < rows; r++) {
			float *zr = z + r * Vs;
			if (tg[r] == LLAMA_IGNORE_INDEX) {
				if (grad)
					memset(zr, 0, (size_t)Vs * sizeof(float));
				continue;
			}
			float lse = zmax[r] + logf(sum[r]);
			chunk_loss += (double)(lse - ztgt[r]);
			chunk_valid++;
			if (!grad)
				continue;
			float s = (float)dscale;
			for (int64_t j = 0; j < vn; j++)
				zr[j] = expf(zr[j] - lse) * s;
			for (int64_t j = vn; j < Vs; j++)
				zr[j] = 0.0f;
			int64_t t = (int64_t)tg[r] - v0;
			if (t >= 0 && t < vn)
				zr[t] -= s;
		}
		loss_sum += chunk_loss;
		valid += chunk_valid;
		if (grad)
			matmul_backward_f32(dx ? dx + n0 * C : NULL, dw, z, xc, w, rows, C, Vs);
	}
	if (n_valid)
		*n_valid = valid;
	return loss_sum;
}

/* ---------------------------------------------------------------- programs
 *
 * Every pass of a unit is a program (model/model_prog.h): compute segments with the TP
 * collectives between them, so a schedule runs the collectives as nodes of their own. Ops
 * at even indices are segments (fn may be NULL: nothing to compute there), at odd indices
 * collectives; a collective returns whether it ran (the loss gradient's reduce-scatter runs
 * on one side of the fused loss only). Segment functions hand state to the next op through
 * the model's buffers, exactly as the straight-line code did, so the ops in order compute
 * the same thing bitwise.
 */

/* What a collective moves: the (Ns, C) activation shard, or one norm weight's (C) partial
 * gradient. */
enum tp_size { TP_ACT, TP_NORM };

struct tp_op {
	void (*seg)(struct llama_model *m, int l);
	bool (*coll)(struct llama_model *m, int l);
	enum model_coll kind;
	enum tp_size size;
	bool ring;                 /* async TP ring steps with the matmul beside it */
	enum model_coll_when when; /* MODEL_COLL_ALWAYS unless the loss gradient's */
	int ring_mm;               /* ring: which matmul hides it (enum tp_ring_mm) */
};

/* the matmuls async TP hides ring steps behind, per block pass (for the cost model) */
enum tp_ring_mm { MM_NONE, MM_QKV, MM_WO, MM_W13, MM_W2 };

#define SEG(f)                                                                                     \
	{                                                                                          \
		.seg = (f)                                                                         \
	}
#define AG(f)                                                                                      \
	{                                                                                          \
		.coll = (f), .kind = MODEL_COLL_ALL_GATHER, .size = TP_ACT                         \
	}
#define RS(f)                                                                                      \
	{                                                                                          \
		.coll = (f), .kind = MODEL_COLL_REDUCE_SCATTER, .size = TP_ACT                     \
	}
#define AGN(f)                                                                                     \
	{                                                                                          \
		.coll = (f), .kind = MODEL_COLL_ALL_GATHER, .size = TP_NORM                        \
	}
#define RAG(f, mm)                                                                                 \
	{                                                                                          \
		.coll = (f), .kind = MODEL_COLL_ALL_GATHER, .size = TP_ACT, .ring = true,          \
		.ring_mm = (mm)                                                                    \
	}
#define RRS(f, mm)                                                                                 \
	{                                                                                          \
		.coll = (f), .kind = MODEL_COLL_REDUCE_SCATTER, .size = TP_ACT, .ring = true,      \
		.ring_mm = (mm)                                                                    \
	}

/* ---- a block's operands */

struct tp_blk {
	struct llama_block_ptrs w, dw;
	struct llama_block_acts *a;
	struct tp_dims d;
	float *h1, *h3; /* the up-projections: saved, or scratch under ffn checkpointing */
};

static struct tp_blk tp_blk_of(struct llama_model *m, int l)
{
	struct llama_block_acts *a = &m->acts[l];
	return (struct tp_blk){.w = llama_block_ptrs_of(m, m->unit_w, l),
	                       .dw = llama_block_ptrs_of(m, m->unit_dw, l),
	                       .a = a,
	                       .d = tp_dims(m),
	                       .h1 = m->recompute_ffn ? m->h1s : a->h1,
	                       .h3 = m->recompute_ffn ? m->h3s : a->h3};
}

/* ---- plain collectives on the model's buffers */

static bool c_ag_xn(struct llama_model *m, int l) /* the norm output, along the tokens */
{
	(void)l;
	llama_tp_gather(m, m->xn, m->tpb->xg);
	return true;
}

static bool c_ag_dres(struct llama_model *m, int l) /* the residual gradient */
{
	(void)l;
	llama_tp_gather(m, m->dres, m->tpb->part);
	return true;
}

static bool c_rs_part(struct llama_model *m, int l) /* row-parallel partial sums */
{
	(void)l;
	llama_tp_reduce_scatter(m, m->tpb->part, m->tpb->rs_out);
	return true;
}

/* A norm weight's gradient is partial over the token shards: every rank's, in rank order. */
static bool c_ag_dnorm(struct llama_model *m, int l)
{
	(void)l;
	m->tp->all_gather(m->tp->ctx, m->tpb->rs_scratch, m->tpb->dnorm,
	                  m->cfg.dim * (int64_t)sizeof(float), false);
	return true;
}

/* RMSNorm backward on the token shard into dx; the weight's partial gradient into
 * tpb->rs_scratch (free between collectives) for c_ag_dnorm. */
static void norm_partial(struct llama_model *m, float *dx, const float *dout, const float *x,
                         const float *w, const float *rstd)
{
	float *mine = m->tpb->rs_scratch;
	memset(mine, 0, (size_t)m->cfg.dim * sizeof(float));
	rmsnorm_backward_f32(dx, mine, dout, x, w, rstd, m->Ns, m->cfg.dim);
}

/* Sum the gathered partial gradients in rank order (identical on every rank) into dw. */
static void norm_sum(struct llama_model *m, float *dw)
{
	int64_t C = m->cfg.dim, S = m->tp->size;
	for (int64_t r = 0; r < S; r++)
		for (int64_t j = 0; j < C; j++)
			dw[j] += m->tpb->dnorm[r * C + j];
}

/* ---- embedding (vocabulary-parallel rows) */

static void e_fill(struct llama_model *m, int l)
{
	(void)l;
	const struct param_entry *p = &m->table.p[PARAM_TOK_EMB];
	const float *emb = llama_tensor_at(m, m->unit_w, PARAM_TOK_EMB);
	int64_t C = m->cfg.dim, v0 = p->tp_start, vn = p->tp_valid;
	float *part = m->tpb->part;
	memset(part, 0, (size_t)(m->N * C) * sizeof(float));
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < m->N; i++) {
		int64_t t = (int64_t)m->tokens[i] - v0;
		if (t >= 0 && t < vn)
			memcpy(part + i * C, emb + t * C, (size_t)C * sizeof(float));
	}
}

/* the reduce-scatter both sums the ranks' rows and shards them along the tokens */
static bool c_rs_embed(struct llama_model *m, int l)
{
	(void)l;
	llama_tp_reduce_scatter(m, m->tpb->part, m->cfg.n_layers > 0 ? m->acts[0].x : m->x_final);
	return true;
}

static void e_accumulate(struct llama_model *m, int l)
{
	(void)l;
	const struct param_entry *p = &m->table.p[PARAM_TOK_EMB];
	float *demb = llama_tensor_at(m, m->unit_dw, PARAM_TOK_EMB);
	int64_t C = m->cfg.dim, v0 = p->tp_start, vn = p->tp_valid;
	const float *g = m->tpb->part;
	for (int64_t i = 0; i < m->N; i++) { /* serial: a fixed summation order per row */
		int64_t t = (int64_t)m->tokens[i] - v0;
		if (t < 0 || t >= vn)
			continue;
		float *d = demb + t * C;
		const float *s = g + i * C;
		for (int64_t j = 0; j < C; j++)
			d[j] += s[j];
	}
}

static const struct tp_op embed_fwd[] = {SEG(e_fill), RS(c_rs_embed), SEG(NULL)};
static const struct tp_op embed_bwd[] = {SEG(NULL), AG(c_ag_dres), SEG(e_accumulate)};

/* ---- block forward: h = x + RS(wo(attn(rope(wq AG(xn)), ...))), xn = rmsnorm(x) on the
 * token shard; out = h + RS(w2(silu(w1 AG(hn)) * w3 AG(hn))) */

static void f_norm1(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	rmsnorm_forward_f32(m->xn, c.a->rstd1, c.a->x, c.w.attn_norm, c.d.Ns, c.d.C,
	                    m->cfg.norm_eps);
}

static void f_rope_attention(struct llama_model *m, const struct tp_blk *c)
{
	const struct tp_dims d = c->d;
	struct llama_block_acts *a = c->a;
	rope_forward_f32(a->q, m->rope_cos, m->rope_sin, d.B, d.T, d.H, d.D);
	rope_forward_f32(a->k, m->rope_cos, m->rope_sin, d.B, d.T, d.KV, d.D);
	attention_forward_f32(a->att, a->lse, a->q, a->k, a->v, d.B, d.T, d.H, d.KV, d.D);
}

static void f_attn(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	const struct tp_dims d = c.d;
	const float *xg = m->tpb->xg;
	matmul_forward_f32(c.a->q, xg, c.w.wq, d.N, d.C, d.HD, 0);
	matmul_forward_f32(c.a->k, xg, c.w.wk, d.N, d.C, d.KVD, 0);
	matmul_forward_f32(c.a->v, xg, c.w.wv, d.N, d.C, d.KVD, 0);
	f_rope_attention(m, &c);
	matmul_forward_f32(m->tpb->part, c.a->att, c.w.wo, d.N, d.HD, d.C, 0);
}

static void f_attn_core(struct llama_model *m, int l) /* async: the matmuls ride the rings */
{
	struct tp_blk c = tp_blk_of(m, l);
	f_rope_attention(m, &c);
}

static void f_mid(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	llama_tp_add_rows(c.a->xmid, c.a->x, m->tpb->rs_out, c.d.Ns * c.d.C);
	rmsnorm_forward_f32(m->xn, c.a->rstd2, c.a->xmid, c.w.ffn_norm, c.d.Ns, c.d.C,
	                    m->cfg.norm_eps);
}

static void f_ffn(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	const struct tp_dims d = c.d;
	const float *xg = m->tpb->xg;
	matmul_forward_f32(c.h1, xg, c.w.w1, d.N, d.C, d.F, 0);
	matmul_forward_f32(c.h3, xg, c.w.w3, d.N, d.C, d.F, 0);
	swiglu_forward_f32(m->gate, c.h1, c.h3, d.N * d.F);
	matmul_forward_f32(m->tpb->part, m->gate, c.w.w2, d.N, d.F, d.C, 0);
}

static void f_swiglu(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	swiglu_forward_f32(m->gate, c.h1, c.h3, c.d.N * c.d.F);
}

static void f_out(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	llama_tp_add_rows(llama_block_output(m, l), c.a->xmid, m->tpb->rs_out, c.d.Ns * c.d.C);
}

/* ---- async TP ring callbacks: the matmul rows of one token block */

static void rf_qkv(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct tp_blk *c = ctx;
	const float *x = m->tpb->xg + r0 * c->d.C;
	(void)out;
	matmul_forward_f32(c->a->q + r0 * c->d.HD, x, c->w.wq, n, c->d.C, c->d.HD, 0);
	matmul_forward_f32(c->a->k + r0 * c->d.KVD, x, c->w.wk, n, c->d.C, c->d.KVD, 0);
	matmul_forward_f32(c->a->v + r0 * c->d.KVD, x, c->w.wv, n, c->d.C, c->d.KVD, 0);
}

static void rf_w13(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct tp_blk *c = ctx;
	const float *x = m->tpb->xg + r0 * c->d.C;
	(void)out;
	matmul_forward_f32(c->h1 + r0 * c->d.F, x, c->w.w1, n, c->d.C, c->d.F, 0);
	matmul_forward_f32(c->h3 + r0 * c->d.F, x, c->w.w3, n, c->d.C, c->d.F, 0);
}

static void rf_wo(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct tp_blk *c = ctx;
	(void)m;
	matmul_forward_f32(out, c->a->att + r0 * c->d.HD, c->w.wo, n, c->d.HD, c->d.C, 0);
}

static void rf_w2(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct tp_blk *c = ctx;
	matmul_forward_f32(out, m->gate + r0 * c->d.F, c->w.w2, n, c->d.F, c->d.C, 0);
}

/* the gathered output gradient (in tpb->part) through w2: dW2 from the saved gate rows, then
 * those rows become d(gate) */
static void rb_w2(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct tp_blk *c = ctx;
	const float *g = m->tpb->part + r0 * c->d.C;
	float *gate = m->gate + r0 * c->d.F;
	(void)out;
	matmul_backward_f32(NULL, c->dw.w2, g, gate, c->w.w2, n, c->d.F, c->d.C);
	memset(gate, 0, (size_t)(n * c->d.F) * sizeof(float));
	matmul_backward_f32(gate, NULL, g, NULL, c->w.w2, n, c->d.F, c->d.C);
}

static void rb_wo(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct tp_blk *c = ctx;
	const float *g = m->tpb->part + r0 * c->d.C;
	(void)out;
	matmul_backward_f32(m->datt + r0 * c->d.HD, c->dw.wo, g, c->a->att + r0 * c->d.HD, c->w.wo,
	                    n, c->d.HD, c->d.C);
}

/* weight gradients of w1, w3 from the gathered norm output */
static void rb_dw13(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct tp_blk *c = ctx;
	const float *x = m->tpb->xg + r0 * c->d.C;
	(void)out;
	matmul_backward_f32(NULL, c->dw.w1, m->dh1 + r0 * c->d.F, x, c->w.w1, n, c->d.C, c->d.F);
	matmul_backward_f32(NULL, c->dw.w3, m->dh3 + r0 * c->d.F, x, c->w.w3, n, c->d.C, c->d.F);
}

static void rb_dx13(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct tp_blk *c = ctx;
	matmul_backward_f32(out, NULL, m->dh1 + r0 * c->d.F, NULL, c->w.w1, n, c->d.C, c->d.F);
	matmul_backward_f32(out, NULL, m->dh3 + r0 * c->d.F, NULL, c->w.w3, n, c->d.C, c->d.F);
}

static void rb_dwqkv(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct tp_blk *c = ctx;
	const struct tp_dims *d = &c->d;
	const float *x = m->tpb->xg + r0 * d->C;
	(void)out;
	matmul_backward_f32(NULL, c->dw.wq, m->dq + r0 * d->HD, x, c->w.wq, n, d->C, d->HD);
	matmul_backward_f32(NULL, c->dw.wk, m->dk + r0 * d->KVD, x, c->w.wk, n, d->C, d->KVD);
	matmul_backward_f32(NULL, c->dw.wv, m->dv + r0 * d->KVD, x, c->w.wv, n, d->C, d->KVD);
}

static void rb_dxqkv(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct tp_blk *c = ctx;
	const struct tp_dims *d = &c->d;
	matmul_backward_f32(out, NULL, m->dq + r0 * d->HD, NULL, c->w.wq, n, d->C, d->HD);
	matmul_backward_f32(out, NULL, m->dk + r0 * d->KVD, NULL, c->w.wk, n, d->C, d->KVD);
	matmul_backward_f32(out, NULL, m->dv + r0 * d->KVD, NULL, c->w.wv, n, d->C, d->KVD);
}

/* ---- async TP ring collectives */

#define RING_GATHER(name, src, dst, fn)                                                            \
	static bool name(struct llama_model *m, int l)                                             \
	{                                                                                          \
		struct tp_blk c = tp_blk_of(m, l);                                                 \
		llama_tp_ring_gather(m, src, dst, fn, &c);                                         \
		return true;                                                                       \
	}
#define RING_REDUCE_SCATTER(name, fn)                                                              \
	static bool name(struct llama_model *m, int l)                                             \
	{                                                                                          \
		struct tp_blk c = tp_blk_of(m, l);                                                 \
		llama_tp_ring_reduce_scatter(m, m->tpb->rs_out, fn, &c);                           \
		return true;                                                                       \
	}

RING_GATHER(r_ag_qkv, m->xn, m->tpb->xg, rf_qkv)
RING_REDUCE_SCATTER(r_rs_wo, rf_wo)
RING_GATHER(r_ag_w13, m->xn, m->tpb->xg, rf_w13)
RING_REDUCE_SCATTER(r_rs_w2, rf_w2)
RING_GATHER(r_ag_dres_w2, m->dres, m->tpb->part, rb_w2)
RING_GATHER(r_ag_dw13, m->xn, m->tpb->xg, rb_dw13)
RING_REDUCE_SCATTER(r_rs_dx13, rb_dx13)
RING_GATHER(r_ag_dwqkv, m->xn, m->tpb->xg, rb_dwqkv)
RING_REDUCE_SCATTER(r_rs_dxqkv, rb_dxqkv)

/* wo's input gradient accumulates over the ring's blocks: zero it first */
static bool r_ag_dres_wo(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	memset(m->datt, 0, (size_t)(c.d.N * c.d.HD) * sizeof(float));
	llama_tp_ring_gather(m, m->dres, m->tpb->part, rb_wo, &c);
	return true;
}

static const struct tp_op block_fwd[] = {SEG(f_norm1),  AG(c_ag_xn),   SEG(f_attn),
                                         RS(c_rs_part), SEG(f_mid),    AG(c_ag_xn),
                                         SEG(f_ffn),    RS(c_rs_part), SEG(f_out)};
static const struct tp_op block_fwd_async[] = {
    SEG(f_norm1), RAG(r_ag_qkv, MM_QKV), SEG(f_attn_core), RRS(r_rs_wo, MM_WO),
    SEG(f_mid),   RAG(r_ag_w13, MM_W13), SEG(f_swiglu),    RRS(r_rs_w2, MM_W2),
    SEG(f_out)};

/* ---- block backward (mirrors the forward; on entry m->dres = dL/d(out) on the token
 * shard, on exit dL/d(x)) */

static void b_norm2(struct llama_model *m, int l) /* the FFN norm's output again */
{
	struct tp_blk c = tp_blk_of(m, l);
	rmsnorm_forward_f32(m->xn, c.a->rstd2, c.a->xmid, c.w.ffn_norm, c.d.Ns, c.d.C,
	                    m->cfg.norm_eps);
}

static void b_ffn(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	const struct tp_dims d = c.d;
	float *part = m->tpb->part, *xg = m->tpb->xg;
	const float *h1 = c.a->h1, *h3 = c.a->h3;
	if (m->recompute_ffn) { /* activation_checkpoint.mode = ffn: the up-projections again */
		matmul_forward_f32(m->h1s, xg, c.w.w1, d.N, d.C, d.F, 0);
		matmul_forward_f32(m->h3s, xg, c.w.w3, d.N, d.C, d.F, 0);
		h1 = m->h1s;
		h3 = m->h3s;
	}
	swiglu_forward_f32(m->gate, h1, h3, d.N * d.F);
	matmul_backward_f32(NULL, c.dw.w2, part, m->gate, c.w.w2, d.N, d.F, d.C);
	/* first writes overwrite (beta 0): no zeroing pass */
	matmul_backward_set_f32(m->gate, NULL, part, NULL, c.w.w2, d.N, d.F, d.C); /* d(gate) */
	swiglu_backward_f32(m->dh1, m->dh3, m->gate, h1, h3, d.N * d.F);
	matmul_backward_set_f32(part, c.dw.w1, m->dh1, xg, c.w.w1, d.N, d.C, d.F);
	matmul_backward_f32(part, c.dw.w3, m->dh3, xg, c.w.w3, d.N, d.C, d.F);
}

static void b_ffn_norm_partial(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	norm_partial(m, m->dres, m->tpb->rs_out, c.a->xmid, c.w.ffn_norm, c.a->rstd2);
}

static void b_ffn_norm_sum(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	norm_sum(m, c.dw.ffn_norm);
}

static void b_attn_norm1(struct llama_model *m, const struct tp_blk *c)
{
	llama_attention_backward(m, c->a, c->d.B, c->d.T, c->d.H, c->d.KV, c->d.D);
	rmsnorm_forward_f32(m->xn, c->a->rstd1, c->a->x, c->w.attn_norm, c->d.Ns, c->d.C,
	                    m->cfg.norm_eps);
}

static void b_attn(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	const struct tp_dims d = c.d;
	matmul_backward_set_f32(m->datt, c.dw.wo, m->tpb->part, c.a->att, c.w.wo, d.N, d.HD, d.C);
	b_attn_norm1(m, &c);
}

static void b_qkv(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	const struct tp_dims d = c.d;
	float *part = m->tpb->part, *xg = m->tpb->xg;
	memset(part, 0, (size_t)(m->Np * d.C) * sizeof(float));
	matmul_backward_f32(part, c.dw.wq, m->dq, xg, c.w.wq, d.N, d.C, d.HD);
	matmul_backward_f32(part, c.dw.wk, m->dk, xg, c.w.wk, d.N, d.C, d.KVD);
	matmul_backward_f32(part, c.dw.wv, m->dv, xg, c.w.wv, d.N, d.C, d.KVD);
}

static void b_attn_norm_partial(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	norm_partial(m, m->dres, m->tpb->rs_out, c.a->x, c.w.attn_norm, c.a->rstd1);
}

static void b_attn_norm_sum(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	norm_sum(m, c.dw.attn_norm);
}

static const struct tp_op block_bwd[] = {SEG(NULL),
                                         AG(c_ag_dres),
                                         SEG(b_norm2),
                                         AG(c_ag_xn),
                                         SEG(b_ffn),
                                         RS(c_rs_part),
                                         SEG(b_ffn_norm_partial),
                                         AGN(c_ag_dnorm),
                                         SEG(b_ffn_norm_sum),
                                         AG(c_ag_dres),
                                         SEG(b_attn),
                                         AG(c_ag_xn),
                                         SEG(b_qkv),
                                         RS(c_rs_part),
                                         SEG(b_attn_norm_partial),
                                         AGN(c_ag_dnorm),
                                         SEG(b_attn_norm_sum)};

/* Async backward: the same collectives as rings. Under ffn checkpointing the norm output is
 * gathered first, recomputing the up-projections on the way, and then serves the weight
 * gradients as it is; otherwise the output gradient comes first. */

static void ba_0(struct llama_model *m, int l)
{
	if (m->recompute_ffn) {
		b_norm2(m, l);
	} else {
		struct tp_blk c = tp_blk_of(m, l);
		swiglu_forward_f32(m->gate, c.h1, c.h3, c.d.N * c.d.F);
	}
}

static bool ba_c0(struct llama_model *m, int l)
{
	return m->recompute_ffn ? r_ag_w13(m, l) : r_ag_dres_w2(m, l);
}

static void ba_1(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
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
	struct tp_blk c = tp_blk_of(m, l);
	swiglu_backward_f32(m->dh1, m->dh3, m->gate, c.h1, c.h3, c.d.N * c.d.F);
	rb_dw13(m, &c, 0, c.d.N, NULL);
}

static void ba_attn(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	b_attn_norm1(m, &c);
}

static const struct tp_op block_bwd_async[] = {SEG(ba_0),
                                               RAG(ba_c0, MM_W2),
                                               SEG(ba_1),
                                               RAG(ba_c1, MM_W13),
                                               SEG(ba_2),
                                               RRS(r_rs_dx13, MM_W13),
                                               SEG(b_ffn_norm_partial),
                                               AGN(c_ag_dnorm),
                                               SEG(b_ffn_norm_sum),
                                               RAG(r_ag_dres_wo, MM_WO),
                                               SEG(ba_attn),
                                               RAG(r_ag_dwqkv, MM_QKV),
                                               SEG(NULL),
                                               RRS(r_rs_dxqkv, MM_QKV),
                                               SEG(b_attn_norm_partial),
                                               AGN(c_ag_dnorm),
                                               SEG(b_attn_norm_sum)};

/* ---- SELECTIVE recompute under TP: what the per-op policy dropped (k, the residual after
 * attention, h3 and both norms' statistics) from the saved x and attention output, as the
 * forward makes them: the norm outputs are gathered again and wo's partial sums
 * reduce-scattered again (plain collectives, also under async TP) */

static void s_k_wo(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	const struct tp_dims d = c.d;
	matmul_forward_f32(c.a->k, m->tpb->xg, c.w.wk, d.N, d.C, d.KVD, 0);
	rope_forward_f32(c.a->k, m->rope_cos, m->rope_sin, d.B, d.T, d.KV, d.D);
	matmul_forward_f32(m->tpb->part, c.a->att, c.w.wo, d.N, d.HD, d.C, 0);
}

static void s_w3(struct llama_model *m, int l)
{
	struct tp_blk c = tp_blk_of(m, l);
	matmul_forward_f32(c.a->h3, m->tpb->xg, c.w.w3, c.d.N, c.d.C, c.d.F, 0);
}

static const struct tp_op block_rec_selective[] = {
    SEG(f_norm1), AG(c_ag_xn), SEG(s_k_wo), RS(c_rs_part), SEG(f_mid), AG(c_ag_xn), SEG(s_w3)};

/* ---- head: final norm on the token shard, all-gather, then the fused vocabulary-parallel
 * output and loss; its gradient (when the step's scale is known) reduce-scattered into
 * m->dxn in forward, else in backward */

static void h_norm(struct llama_model *m, int l)
{
	(void)l;
	rmsnorm_forward_f32(m->xn, m->rstd_f, m->x_final,
	                    llama_tensor_at(m, m->unit_w, PARAM_NORM(m)), m->Ns, m->cfg.dim,
	                    m->cfg.norm_eps);
}

static bool c_ag_final(struct llama_model *m, int l)
{
	(void)l;
	llama_tp_gather(m, m->xn, m->xn_final);
	return true;
}

static void h_loss(struct llama_model *m, int l)
{
	(void)l;
	bool grads = m->loss_dscale > 0.0;
	if (grads)
		memset(m->tpb->part, 0, (size_t)(m->Np * m->cfg.dim) * sizeof(float));
	m->tpb->loss =
	    tp_cross_entropy(m, grads ? m->tpb->part : NULL,
	                     grads ? llama_tensor_at(m, m->unit_dw, PARAM_OUTPUT(m)) : NULL,
	                     m->loss_dscale, &m->tpb->valid);
	m->head_grads_ready = grads;
}

static bool c_rs_loss_fused(struct llama_model *m, int l)
{
	(void)l;
	if (!m->head_grads_ready)
		return false;
	llama_tp_reduce_scatter(m, m->tpb->part, m->dxn);
	return true;
}

static void hb_loss(struct llama_model *m, int l)
{
	(void)l;
	double dscale = m->tpb->dscale;
	m->tpb->rs_pending = !m->head_grads_ready || m->loss_dscale != dscale;
	if (!m->tpb->rs_pending)
		return;
	CHECK(!m->head_grads_ready, "loss gradient made with scale %g, asked for %g",
	      m->loss_dscale, dscale);
	memset(m->tpb->part, 0, (size_t)(m->Np * m->cfg.dim) * sizeof(float));
	tp_cross_entropy(m, m->tpb->part, llama_tensor_at(m, m->unit_dw, PARAM_OUTPUT(m)), dscale,
	                 NULL);
}

static bool c_rs_loss_unfused(struct llama_model *m, int l)
{
	(void)l;
	if (!m->tpb->rs_pending)
		return false;
	llama_tp_reduce_scatter(m, m->tpb->part, m->dxn);
	return true;
}

static void hb_norm_partial(struct llama_model *m, int l)
{
	(void)l;
	m->head_grads_ready = false;
	memset(m->dres, 0, (size_t)(m->Ns * m->cfg.dim) * sizeof(float));
	norm_partial(m, m->dres, m->dxn, m->x_final, llama_tensor_at(m, m->unit_w, PARAM_NORM(m)),
	             m->rstd_f);
}

static void hb_norm_sum(struct llama_model *m, int l)
{
	(void)l;
	norm_sum(m, llama_tensor_at(m, m->unit_dw, PARAM_NORM(m)));
}

static const struct tp_op head_fwd[] = {SEG(h_norm),
                                        AG(c_ag_final),
                                        SEG(h_loss),
                                        {.coll = c_rs_loss_fused,
                                         .kind = MODEL_COLL_REDUCE_SCATTER,
                                         .size = TP_ACT,
                                         .when = MODEL_COLL_IF_FUSED},
                                        SEG(NULL)};
static const struct tp_op head_bwd[] = {SEG(hb_loss),
                                        {.coll = c_rs_loss_unfused,
                                         .kind = MODEL_COLL_REDUCE_SCATTER,
                                         .size = TP_ACT,
                                         .when = MODEL_COLL_IF_NOT_FUSED},
                                        SEG(hb_norm_partial),
                                        AGN(c_ag_dnorm),
                                        SEG(hb_norm_sum)};
static const struct tp_op head_rec[] = {SEG(h_norm), AG(c_ag_final), SEG(NULL)};

/* ---------------------------------------------------------------- units */

#define PROG(a) ((struct tp_prog){(int)(sizeof(a) / sizeof(a[0])), a})

struct tp_prog {
	int n_ops;
	const struct tp_op *ops;
};

static struct tp_prog tp_program_of(int L, bool async, enum model_ac ac, int u, enum model_pass p)
{
	if (u == 0)
		return p == MODEL_PASS_BWD ? PROG(embed_bwd) : PROG(embed_fwd);
	if (u > L)
		return p == MODEL_PASS_FWD   ? PROG(head_fwd)
		       : p == MODEL_PASS_BWD ? PROG(head_bwd)
		                             : PROG(head_rec);
	if (p == MODEL_PASS_BWD)
		return async ? PROG(block_bwd_async) : PROG(block_bwd);
	if (p == MODEL_PASS_REC && ac == MODEL_AC_SELECTIVE)
		return PROG(block_rec_selective);
	return async ? PROG(block_fwd_async) : PROG(block_fwd);
}

static struct tp_prog tp_program(const struct llama_model *m, int u, enum model_pass p)
{
	return tp_program_of((int)m->cfg.n_layers, m->tpb->async, m->ac, u, p);
}

/* FLOPs of the matmul a ring hides behind, on one rank (its heads and FFN columns), for N
 * tokens: 2 x rows x in x out. A backward ring carries both gradient matmuls of w2 and wo
 * (the input gradient and the weight gradient, block by block) and one of the others'. */
static double ring_flops(const struct llama_config *c, int S, int64_t N, enum model_pass p,
                         enum tp_ring_mm mm)
{
	double N2 = 2.0 * (double)N, C = (double)c->dim, D = (double)c->head_dim;
	double HD = (double)(c->n_heads / S) * D, KVD = (double)(c->n_kv_heads / S) * D;
	double F = (double)(c->ffn_hidden / S), both = p == MODEL_PASS_BWD ? 2.0 : 1.0;
	switch (mm) {
	case MM_QKV:
		return N2 * C * (HD + 2 * KVD);
	case MM_WO:
		return both * N2 * HD * C;
	case MM_W13:
		return N2 * C * 2 * F;
	case MM_W2:
		return both * N2 * F * C;
	default:
		return 0.0;
	}
}

void llama_tp_prog(const struct llama_config *c, int tp, bool async, enum model_ac ac, int64_t B,
                   int64_t T, int64_t elem_bytes, int u, enum model_pass p, struct model_prog *out)
{
	struct tp_prog g = tp_program_of((int)c->n_layers, async, ac, u, p);
	int64_t N = B * T, Ns = (N + tp - 1) / tp;
	memset(out, 0, sizeof(*out));
	for (int i = 1; i < g.n_ops; i += 2) {
		const struct tp_op *o = &g.ops[i];
		CHECK(out->n < MODEL_PROG_MAX, "TP program of unit %d: too many collectives", u);
		int64_t blk =
		    (o->size == TP_NORM ? (int64_t)sizeof(float) : Ns * elem_bytes) * c->dim;
		out->c[out->n++] = (struct model_coll_desc){
		    .kind = o->kind,
		    .when = o->when,
		    .bytes = (int64_t)(tp - 1) * blk,
		    .group = tp,
		    .ring = o->ring,
		    .ring_flops =
		        o->ring ? ring_flops(c, tp, N, p, (enum tp_ring_mm)o->ring_mm) : 0.0};
	}
}

struct llama_config llama_config_tp_slice(const struct llama_config *c, int64_t tp)
{
	struct llama_config r = *c;
	r.n_heads /= tp;
	r.n_kv_heads /= tp;
	r.ffn_hidden /= tp;
	r.vocab_size = (c->vocab_size + tp - 1) / tp;
	return r;
}

void llama_tp_unit_prog(const struct llama_model *m, int u, enum model_pass p,
                        struct model_prog *out)
{
	llama_tp_prog(&m->cfg, m->tp->size, m->tpb->async, m->ac, m->B, m->T, sizeof(float), u, p,
	              out);
}

double llama_tp_unit_op(struct llama_model *m, int u, enum model_pass p, int op, double dscale,
                        int64_t *n_valid, bool *ran)
{
	struct tp_prog g = tp_program(m, u, p);
	CHECK(op >= 0 && op < g.n_ops, "TP unit %d: op %d of %d", u, op, g.n_ops);
	const struct tp_op *o = &g.ops[op];
	int l = u - 1;
	bool r = false;
	m->tpb->dscale = dscale;
	if (op % 2)
		r = o->coll(m, l);
	else if (o->seg)
		o->seg(m, l);
	if (ran)
		*ran = r;
	if (n_valid)
		*n_valid = 0;
	if (p != MODEL_PASS_FWD || u <= m->cfg.n_layers || op != g.n_ops - 1)
		return 0.0;
	if (n_valid) /* the head's forward is done: its loss (h_loss left it here) */
		*n_valid = m->tpb->valid;
	return m->tpb->loss;
}

static double run_program(struct llama_model *m, int u, enum model_pass p, double dscale,
                          int64_t *n_valid)
{
	struct tp_prog g = tp_program(m, u, p);
	double loss = 0.0;
	for (int op = 0; op < g.n_ops; op++)
		loss = llama_tp_unit_op(m, u, p, op, dscale, n_valid, NULL);
	return loss;
}

double llama_tp_unit_forward(struct llama_model *m, int u, int64_t *n_valid)
{
	return run_program(m, u, MODEL_PASS_FWD, 0.0, n_valid);
}

void llama_tp_unit_recompute(struct llama_model *m, int u)
{
	run_program(m, u, MODEL_PASS_REC, 0.0, NULL);
}

void llama_tp_unit_backward(struct llama_model *m, int u, double dscale)
{
	run_program(m, u, MODEL_PASS_BWD, dscale, NULL);
}
