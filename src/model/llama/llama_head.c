/* Llama's first and last units, one implementation for one rank and tensor parallelism
 * (llama_impl.h): the token embedding (unit 0), and the final norm + output projection +
 * cross-entropy (unit L+1), whose forward also makes the loss gradient when the step's loss
 * scale is known.
 *
 * Under TP the vocabulary is split. The embedding rows [v0, v0+Vs) live on one rank; each
 * rank embeds the tokens it owns (zeros elsewhere) and the reduce-scatter that follows both
 * sums and shards them. The output projection is split the same way and the cross-entropy
 * is computed on vocabulary-sharded logits in chunks of rows: per-row max (all-reduce max),
 * sum of exponentials and target logit (all-reduce sum); the (N, V) logits never exist
 * anywhere. One rank runs the embedding and the fused output + loss kernels.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "base/log.h"
#include "kernels/kernels.h"
#include "model/llama/llama_impl.h"

/* ---------------------------------------------------------------- embedding */

static float *embed_output(struct llama_model *m)
{
	return m->cfg.n_layers > 0 ? m->acts[0].x : m->x_final;
}

/* One rank: the embedding. TP: this rank's vocabulary rows into tpb->part (zeros for the
 * tokens it does not own), for the reduce-scatter. */
static void e_fill(struct llama_model *m, int l)
{
	(void)l;
	const struct param_entry *p = &m->table.p[PARAM_TOK_EMB];
	const float *emb = llama_tensor_at(m, m->unit_w, PARAM_TOK_EMB);
	int64_t C = m->cfg.dim, v0 = p->tp_start, vn = p->tp_valid;
	if (!m->tp) {
		embedding_forward_f32(embed_output(m), m->tokens, emb, m->N, C);
		return;
	}
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
	llama_tp_reduce_scatter(m, m->tpb->part, embed_output(m));
	return true;
}

/* The embedding's gradient from g, the gradient of its output (N, C; gathered under TP). */
static void embed_accumulate(struct llama_model *m, const float *g)
{
	const struct param_entry *p = &m->table.p[PARAM_TOK_EMB];
	float *demb = llama_tensor_at(m, m->unit_dw, PARAM_TOK_EMB);
	int64_t C = m->cfg.dim, v0 = p->tp_start, vn = p->tp_valid;
	if (!m->tp) {
		embedding_backward_f32(demb, g, m->tokens, m->N, C);
		return;
	}
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

/* with a split backward the embedding's gradient is W's: keep its output gradient */
static void e_backward(struct llama_model *m, int l)
{
	(void)l;
	const struct llama_wkeep k = llama_wkeep_at(m, 0);
	if (k.dout2)
		memcpy(k.dout2, llama_dout(m), (size_t)(m->N * m->cfg.dim) * sizeof(float));
	else
		embed_accumulate(m, llama_dout(m));
}

void llama_embed_backward_weight(struct llama_model *m, const struct llama_wkeep *k)
{
	embed_accumulate(m, k->dout2);
}

/* ---------------------------------------------------------------- TP: the loss */

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

/* ---------------------------------------------------------------- head
 *
 * The final norm on the token shard (all-gathered into xn_final under TP), then the fused
 * output projection and loss; its gradient d(xn_final) ends in m->dxn: on one rank directly,
 * under TP reduce-scattered there — in forward when the step's scale is known (m->loss_dscale
 * > 0, set by the trainer: the (N, V) projection runs once per step instead of twice), else
 * in backward. */

static void h_norm(struct llama_model *m, int l)
{
	(void)l;
	rmsnorm_forward_f32(m->tp ? m->xn : m->xn_final, m->rstd_f, m->x_final,
	                    llama_tensor_at(m, m->unit_w, PARAM_NORM(m)), m->Ns, m->cfg.dim,
	                    m->cfg.norm_eps);
}

static bool c_ag_final(struct llama_model *m, int l)
{
	(void)l;
	llama_tp_gather(m, m->xn, m->xn_final);
	return true;
}

/* d(loss_sum * dscale) into d(xn_final) (one rank: m->dxn; TP: tpb->part, partial over the
 * vocabulary pieces) and the output projection's gradient; the loss sum, its valid targets
 * into *n_valid (may be NULL). */
static double head_loss(struct llama_model *m, bool grads, double dscale, int64_t *n_valid)
{
	const struct llama_config *c = &m->cfg;
	float *dw = grads ? llama_tensor_at(m, m->unit_dw, PARAM_OUTPUT(m)) : NULL;
	if (!m->tp) {
		if (grads)
			memset(m->dxn, 0, (size_t)(m->N * c->dim) * sizeof(float));
		return cross_entropy_fused_f32(
		    grads ? m->dxn : NULL, dw, m->xn_final,
		    llama_tensor_at(m, m->unit_w, PARAM_OUTPUT(m)), m->targets, m->N, c->dim,
		    c->vocab_size, LLAMA_IGNORE_INDEX, dscale, m->ce_scratch, m->ce_rows, n_valid);
	}
	if (grads)
		memset(m->tpb->part, 0, (size_t)(m->Np * c->dim) * sizeof(float));
	return tp_cross_entropy(m, grads ? m->tpb->part : NULL, dw, dscale, n_valid);
}

static void h_loss(struct llama_model *m, int l)
{
	(void)l;
	bool grads = m->loss_dscale > 0.0;
	m->pass_loss = head_loss(m, grads, m->loss_dscale, &m->pass_valid);
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

/* backward: the loss gradient, unless the forward made it with this scale */
static void hb_loss(struct llama_model *m, int l)
{
	(void)l;
	double dscale = m->pass_dscale;
	m->loss_rs_pending = !m->head_grads_ready || m->loss_dscale != dscale;
	if (!m->loss_rs_pending)
		return;
	CHECK(!m->head_grads_ready, "loss gradient made with scale %g, asked for %g",
	      m->loss_dscale, dscale);
	head_loss(m, true, dscale, NULL);
}

static bool c_rs_loss_unfused(struct llama_model *m, int l)
{
	(void)l;
	if (!m->loss_rs_pending)
		return false;
	llama_tp_reduce_scatter(m, m->tpb->part, m->dxn);
	return true;
}

/* d(xn_final) -> d(x_final), starting the residual gradient chain */
static void hb_norm(struct llama_model *m, int l)
{
	(void)l;
	m->head_grads_ready = false;
	memset(m->dres, 0, (size_t)(m->Ns * m->cfg.dim) * sizeof(float));
	llama_norm_backward(m, llama_tensor_at(m, m->unit_dw, PARAM_NORM(m)), m->dres, m->dxn,
	                    m->x_final, llama_tensor_at(m, m->unit_w, PARAM_NORM(m)), m->rstd_f);
}

static void hb_norm_sum(struct llama_model *m, int l)
{
	(void)l;
	llama_norm_sum(m, llama_tensor_at(m, m->unit_dw, PARAM_NORM(m)));
}

void llama_logits(struct llama_model *m, float *logits)
{
	CHECK(!m->tp, "llama_logits: not available on a tensor-parallel model");
	for (int u = 0; u < m->table.n_units - 1; u++)
		llama_unit_forward(m, u, NULL);
	h_norm(m, 0);
	matmul_forward_f32(logits, m->xn_final, llama_tensor_at(m, m->unit_w, PARAM_OUTPUT(m)),
	                   m->N, m->cfg.dim, m->cfg.vocab_size, 0);
}

/* ---------------------------------------------------------------- programs */

static const struct llama_op embed_fwd[] = {LLAMA_SEG(e_fill), LLAMA_RS(c_rs_embed),
                                            LLAMA_SEG(NULL)};
static const struct llama_op embed_bwd[] = {LLAMA_SEG(NULL), LLAMA_AG(llama_c_ag_dres),
                                            LLAMA_SEG(e_backward)};

static const struct llama_op head_fwd[] = {LLAMA_SEG(h_norm),
                                           LLAMA_AG(c_ag_final),
                                           LLAMA_SEG(h_loss),
                                           {.coll = c_rs_loss_fused,
                                            .kind = MODEL_COLL_REDUCE_SCATTER,
                                            .size = LLAMA_COLL_ACT,
                                            .when = MODEL_COLL_IF_FUSED},
                                           LLAMA_SEG(NULL)};
static const struct llama_op head_bwd[] = {LLAMA_SEG(hb_loss),
                                           {.coll = c_rs_loss_unfused,
                                            .kind = MODEL_COLL_REDUCE_SCATTER,
                                            .size = LLAMA_COLL_ACT,
                                            .when = MODEL_COLL_IF_NOT_FUSED},
                                           LLAMA_SEG(hb_norm),
                                           LLAMA_AGN(llama_c_ag_dnorm),
                                           LLAMA_SEG(hb_norm_sum)};
static const struct llama_op head_rec[] = {LLAMA_SEG(h_norm), LLAMA_AG(c_ag_final),
                                           LLAMA_SEG(NULL)};

struct llama_prog llama_embed_prog(enum model_pass p)
{
	return p == MODEL_PASS_BWD ? LLAMA_PROG(embed_bwd) : LLAMA_PROG(embed_fwd);
}

struct llama_prog llama_head_prog(enum model_pass p)
{
	return p == MODEL_PASS_FWD   ? LLAMA_PROG(head_fwd)
	       : p == MODEL_PASS_BWD ? LLAMA_PROG(head_bwd)
	                             : LLAMA_PROG(head_rec);
}
