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
#include "base/mem.h"
#include "base/timer.h"
#include "comm/comm.h"
#include "kernels/kernels.h"
#include "model/llama_impl.h"

struct llama_tp_bufs {
	float *xg;         /* (Np, C) gathered norm output */
	float *part;       /* (Np, C) partial sums to reduce-scatter / gathered gradient */
	float *rs_scratch; /* 2 * Ns * C */
	float *rs_out;     /* (Ns, C) */
	float *dnorm;      /* (tp, C): a norm weight's gradient from every rank */
	float *stat;       /* 3 * ce_chunk: row max, sum of exponentials, target logit */
	size_t bytes;
	double comm_s; /* time in TP collectives (all on the compute path: exposed) */
};

double llama_tp_comm_seconds(const struct llama_model *m)
{
	return m->tpb ? m->tpb->comm_s : 0.0;
}

void llama_tp_build(struct llama_model *m)
{
	int64_t C = m->cfg.dim, Np = m->Np, Ns = m->Ns, S = m->tp->size;
	int64_t n = 2 * Np * C + 2 * Ns * C + Ns * C + S * C + 3 * m->ce_chunk;
	struct llama_tp_bufs *b = xcalloc(1, sizeof(*b));
	b->bytes = (size_t)n * sizeof(float);
	float *p = mem_alloc(MEM_ACTIVATIONS, b->bytes);
	memset(p, 0, b->bytes);
	b->xg = p;
	b->part = b->xg + Np * C;
	b->rs_scratch = b->part + Np * C;
	b->rs_out = b->rs_scratch + 2 * Ns * C;
	b->dnorm = b->rs_out + Ns * C;
	b->stat = b->dnorm + S * C;
	m->tpb = b;
}

void llama_tp_free(struct llama_model *m)
{
	if (!m->tpb)
		return;
	mem_free(MEM_ACTIVATIONS, m->tpb->xg, m->tpb->bytes);
	free(m->tpb);
	m->tpb = NULL;
}

/* ---------------------------------------------------------------- collectives */

/* full(Np, C) = the token shards of every rank, in rank order. */
static void sp_gather(struct llama_model *m, const float *shard, float *full)
{
	double t0 = timer_now();
	comm_all_gather(m->tp, shard, full, m->Ns * m->cfg.dim * (int64_t)sizeof(float));
	m->tpb->comm_s += timer_now() - t0;
}

/* out(Ns, C) = this rank's token rows of the sum over ranks of part(Np, C). Rows N..Np of
 * part (padding) are zeroed first. */
static void sp_reduce_scatter(struct llama_model *m, float *part, float *out)
{
	int64_t C = m->cfg.dim;
	memset(part + m->N * C, 0, (size_t)((m->Np - m->N) * C) * sizeof(float));
	double t0 = timer_now();
	comm_reduce_scatter_f32(m->tp, part, out, m->Ns * C, m->tpb->rs_scratch);
	m->tpb->comm_s += timer_now() - t0;
}

/* RMSNorm backward on the token shard; the weight's gradient is partial over the shards, so
 * it is summed over the group in rank order (identical on every rank) before accumulating. */
static void tp_norm_backward(struct llama_model *m, float *dx, float *dw, const float *dout,
                             const float *x, const float *w, const float *rstd)
{
	int64_t C = m->cfg.dim, S = m->tp->size;
	float *mine = m->tpb->rs_scratch; /* free between collectives */
	memset(mine, 0, (size_t)C * sizeof(float));
	rmsnorm_backward_f32(dx, mine, dout, x, w, rstd, m->Ns, C);
	double t0 = timer_now();
	comm_all_gather(m->tp, mine, m->tpb->dnorm, C * (int64_t)sizeof(float));
	m->tpb->comm_s += timer_now() - t0;
	for (int64_t r = 0; r < S; r++)
		for (int64_t j = 0; j < C; j++)
			dw[j] += m->tpb->dnorm[r * C + j];
}

/* ---------------------------------------------------------------- embedding */

static void tp_embedding_forward(struct llama_model *m)
{
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
	sp_reduce_scatter(m, part, m->cfg.n_layers > 0 ? m->acts[0].x : m->x_final);
}

static void tp_embedding_backward(struct llama_model *m)
{
	const struct param_entry *p = &m->table.p[PARAM_TOK_EMB];
	float *demb = llama_tensor_at(m, m->unit_dw, PARAM_TOK_EMB);
	int64_t C = m->cfg.dim, v0 = p->tp_start, vn = p->tp_valid;
	float *g = m->tpb->part;
	sp_gather(m, m->dres, g);
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

/* ---------------------------------------------------------------- blocks */

struct tp_dims {
	int64_t B, T, N, Ns, C, D, H, KV, HD, KVD, F;
};

static struct tp_dims tp_dims(const struct llama_model *m)
{
	const struct llama_config *c = &m->cfg;
	int64_t S = m->tp->size;
	struct tp_dims d = {.B = m->B, .T = m->T, .N = m->N, .Ns = m->Ns, .C = c->dim,
	                    .D = c->head_dim, .H = c->n_heads / S, .KV = c->n_kv_heads / S,
	                    .F = c->ffn_hidden / S};
	d.HD = d.H * d.D;
	d.KVD = d.KV * d.D;
	return d;
}

static void add_rows(float *out, const float *a, const float *b, int64_t n)
{
#pragma omp parallel for simd schedule(static)
	for (int64_t i = 0; i < n; i++)
		out[i] = a[i] + b[i];
}

/* h = x + RS(wo(attn(rope(wq AG(xn)), ...))),  xn = rmsnorm(x) on the token shard;
 * out = h + RS(w2(silu(w1 AG(hn)) * w3 AG(hn))). */
static void tp_block_forward(struct llama_model *m, int l)
{
	const struct llama_config *c = &m->cfg;
	const struct llama_block_ptrs w = llama_block_ptrs_of(m, m->unit_w, l);
	struct llama_block_acts *a = &m->acts[l];
	struct llama_tp_bufs *b = m->tpb;
	const struct tp_dims d = tp_dims(m);
	float *out = llama_block_output(m, l);

	rmsnorm_forward_f32(m->xn, a->rstd1, a->x, w.attn_norm, d.Ns, d.C, c->norm_eps);
	sp_gather(m, m->xn, b->xg);
	matmul_forward_f32(a->q, b->xg, w.wq, d.N, d.C, d.HD, 0);
	matmul_forward_f32(a->k, b->xg, w.wk, d.N, d.C, d.KVD, 0);
	matmul_forward_f32(a->v, b->xg, w.wv, d.N, d.C, d.KVD, 0);
	rope_forward_f32(a->q, m->rope_cos, m->rope_sin, d.B, d.T, d.H, d.D);
	rope_forward_f32(a->k, m->rope_cos, m->rope_sin, d.B, d.T, d.KV, d.D);
	attention_forward_f32(a->att, a->lse, a->q, a->k, a->v, d.B, d.T, d.H, d.KV, d.D);
	matmul_forward_f32(b->part, a->att, w.wo, d.N, d.HD, d.C, 0);
	sp_reduce_scatter(m, b->part, b->rs_out);
	add_rows(a->xmid, a->x, b->rs_out, d.Ns * d.C);

	rmsnorm_forward_f32(m->xn, a->rstd2, a->xmid, w.ffn_norm, d.Ns, d.C, c->norm_eps);
	sp_gather(m, m->xn, b->xg);
	matmul_forward_f32(a->h1, b->xg, w.w1, d.N, d.C, d.F, 0);
	matmul_forward_f32(a->h3, b->xg, w.w3, d.N, d.C, d.F, 0);
	swiglu_forward_f32(m->gate, a->h1, a->h3, d.N * d.F);
	matmul_forward_f32(b->part, m->gate, w.w2, d.N, d.F, d.C, 0);
	sp_reduce_scatter(m, b->part, b->rs_out);
	add_rows(out, a->xmid, b->rs_out, d.Ns * d.C);
}

/* Mirrors tp_block_forward. On entry m->dres = dL/d(out) on the token shard; on exit
 * dL/d(x). */
static void tp_block_backward(struct llama_model *m, int l)
{
	const struct llama_config *c = &m->cfg;
	const struct llama_block_ptrs w = llama_block_ptrs_of(m, m->unit_w, l);
	const struct llama_block_ptrs dw = llama_block_ptrs_of(m, m->unit_dw, l);
	struct llama_block_acts *a = &m->acts[l];
	struct llama_tp_bufs *b = m->tpb;
	const struct tp_dims d = tp_dims(m);
	size_t npc = (size_t)(m->Np * d.C) * sizeof(float), nf = (size_t)(d.N * d.F) * sizeof(float);

	/* feed-forward */
	sp_gather(m, m->dres, b->part); /* dL/d(w2 output), all tokens */
	rmsnorm_forward_f32(m->xn, a->rstd2, a->xmid, w.ffn_norm, d.Ns, d.C, c->norm_eps);
	sp_gather(m, m->xn, b->xg);
	swiglu_forward_f32(m->gate, a->h1, a->h3, d.N * d.F);
	matmul_backward_f32(NULL, dw.w2, b->part, m->gate, w.w2, d.N, d.F, d.C);
	memset(m->gate, 0, nf); /* gate now holds d(gate) */
	matmul_backward_f32(m->gate, NULL, b->part, NULL, w.w2, d.N, d.F, d.C);
	memset(m->dh1, 0, nf);
	memset(m->dh3, 0, nf);
	swiglu_backward_f32(m->dh1, m->dh3, m->gate, a->h1, a->h3, d.N * d.F);
	memset(b->part, 0, npc);
	matmul_backward_f32(b->part, dw.w1, m->dh1, b->xg, w.w1, d.N, d.C, d.F);
	matmul_backward_f32(b->part, dw.w3, m->dh3, b->xg, w.w3, d.N, d.C, d.F);
	sp_reduce_scatter(m, b->part, b->rs_out);
	tp_norm_backward(m, m->dres, dw.ffn_norm, b->rs_out, a->xmid, w.ffn_norm, a->rstd2);

	/* attention */
	sp_gather(m, m->dres, b->part);
	memset(m->datt, 0, (size_t)(d.N * d.HD) * sizeof(float));
	matmul_backward_f32(m->datt, dw.wo, b->part, a->att, w.wo, d.N, d.HD, d.C);
	memset(m->dq, 0, (size_t)(d.N * d.HD) * sizeof(float));
	memset(m->dk, 0, (size_t)(d.N * d.KVD) * sizeof(float));
	memset(m->dv, 0, (size_t)(d.N * d.KVD) * sizeof(float));
	attention_backward_f32(m->dq, m->dk, m->dv, m->datt, a->att, a->lse, a->q, a->k, a->v, d.B,
	                       d.T, d.H, d.KV, d.D);
	rope_backward_f32(m->dq, m->rope_cos, m->rope_sin, d.B, d.T, d.H, d.D);
	rope_backward_f32(m->dk, m->rope_cos, m->rope_sin, d.B, d.T, d.KV, d.D);
	rmsnorm_forward_f32(m->xn, a->rstd1, a->x, w.attn_norm, d.Ns, d.C, c->norm_eps);
	sp_gather(m, m->xn, b->xg);
	memset(b->part, 0, npc);
	matmul_backward_f32(b->part, dw.wq, m->dq, b->xg, w.wq, d.N, d.C, d.HD);
	matmul_backward_f32(b->part, dw.wk, m->dk, b->xg, w.wk, d.N, d.C, d.KVD);
	matmul_backward_f32(b->part, dw.wv, m->dv, b->xg, w.wv, d.N, d.C, d.KVD);
	sp_reduce_scatter(m, b->part, b->rs_out);
	tp_norm_backward(m, m->dres, dw.attn_norm, b->rs_out, a->x, w.attn_norm, a->rstd1);
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
	int64_t chunk = m->ce_chunk;
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
		double t0 = timer_now();
		comm_all_reduce_max_f32(m->tp, zmax, rows);
		m->tpb->comm_s += timer_now() - t0;
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
		t0 = timer_now();
		comm_all_reduce_f32(m->tp, sum, 2 * chunk); /* sum and ztgt are adjacent */
		m->tpb->comm_s += timer_now() - t0;
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

/* Final norm on the token shard, all-gather, then the fused vocabulary-parallel output and
 * loss (with its gradient when the step's scale is known, reduce-scattered into m->dxn). */
static double tp_head_forward(struct llama_model *m, int64_t *n_valid)
{
	const struct llama_config *c = &m->cfg;
	bool grads = m->loss_dscale > 0.0;
	rmsnorm_forward_f32(m->xn, m->rstd_f, m->x_final,
	                    llama_tensor_at(m, m->unit_w, PARAM_NORM(m)), m->Ns, c->dim,
	                    c->norm_eps);
	sp_gather(m, m->xn, m->xn_final);
	if (grads)
		memset(m->tpb->part, 0, (size_t)(m->Np * c->dim) * sizeof(float));
	double loss = tp_cross_entropy(m, grads ? m->tpb->part : NULL,
	                               grads ? llama_tensor_at(m, m->unit_dw, PARAM_OUTPUT(m)) : NULL,
	                               m->loss_dscale, n_valid);
	if (grads)
		sp_reduce_scatter(m, m->tpb->part, m->dxn);
	m->head_grads_ready = grads;
	return loss;
}

static void tp_head_backward(struct llama_model *m, double dscale)
{
	const struct llama_config *c = &m->cfg;
	if (!m->head_grads_ready || m->loss_dscale != dscale) {
		CHECK(!m->head_grads_ready, "loss gradient made with scale %g, asked for %g",
		      m->loss_dscale, dscale);
		memset(m->tpb->part, 0, (size_t)(m->Np * c->dim) * sizeof(float));
		tp_cross_entropy(m, m->tpb->part, llama_tensor_at(m, m->unit_dw, PARAM_OUTPUT(m)),
		                 dscale, NULL);
		sp_reduce_scatter(m, m->tpb->part, m->dxn);
	}
	m->head_grads_ready = false;
	memset(m->dres, 0, (size_t)(m->Ns * c->dim) * sizeof(float));
	tp_norm_backward(m, m->dres, llama_tensor_at(m, m->unit_dw, PARAM_NORM(m)), m->dxn,
	                 m->x_final, llama_tensor_at(m, m->unit_w, PARAM_NORM(m)), m->rstd_f);
}

/* ---------------------------------------------------------------- units */

double llama_tp_unit_forward(struct llama_model *m, int u, int64_t *n_valid)
{
	int L = (int)m->cfg.n_layers;
	if (u == 0) {
		tp_embedding_forward(m);
		return 0.0;
	}
	if (u <= L) {
		tp_block_forward(m, u - 1);
		return 0.0;
	}
	return tp_head_forward(m, n_valid);
}

void llama_tp_unit_recompute(struct llama_model *m, int u)
{
	int L = (int)m->cfg.n_layers;
	if (u == 0) {
		tp_embedding_forward(m);
	} else if (u <= L) {
		tp_block_forward(m, u - 1);
	} else {
		rmsnorm_forward_f32(m->xn, m->rstd_f, m->x_final,
		                    llama_tensor_at(m, m->unit_w, PARAM_NORM(m)), m->Ns, m->cfg.dim,
		                    m->cfg.norm_eps);
		sp_gather(m, m->xn, m->xn_final);
	}
}

void llama_tp_unit_backward(struct llama_model *m, int u, double dscale)
{
	int L = (int)m->cfg.n_layers;
	if (u == L + 1)
		tp_head_backward(m, dscale);
	else if (u >= 1)
		tp_block_backward(m, u - 1);
	else
		tp_embedding_backward(m);
}
