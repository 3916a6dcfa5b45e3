/* model/moe_cost: deepseek_v3's figures for the cost model — work per unit pass and term, the
 * activation bytes (moe.c's own carving), the all-to-alls of expert parallelism, and the
 * calibration kernels at the model's shapes. The work counts are what schedule/sched_cost.c
 * divides by the measured rates; calibration times the same kernels on the same counts.
 *
 * Terms: MATMUL the attention projections, the dense SwiGLU, and in a MoE block the router,
 * the routed experts a token is sent to (its top_k: the ACTIVE experts, never all E) and the
 * shared experts; ATTN the causal GQA kernel; ELEM the bytes of the norms, RoPE, the scores,
 * the sort's row copies, the SwiGLUs, the combine and the residual copies; HEAD the fused
 * output projection + cross-entropy; EMBED the lookup and the scatter.
 *
 * Expert parallelism (s->ep > 1): each rank routes its own N = B x T tokens over all E
 * experts and computes, for its E / ep experts, the rows every rank sends them. Under
 * BALANCED routing (every expert gets N x top_k / E rows of each rank's slots) the rows a
 * rank computes are again N x top_k: its expert FLOPs are the one-rank figure, and each MoE
 * layer's dispatch sends N x top_k x (ep - 1) / ep rows of C elements to the other ranks (the
 * combine as many back). A skewed router makes the busiest rank's share larger (the run's
 * moe_load_max_mean metric says by how much); the model does not guess it. The family has
 * neither tensor nor context parallelism (it refuses both) and saves every activation. */
#include "model/moe/moe_cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/attention_bf16.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/moe/moe.h"

/* ---------------------------------------------------------------- work */

/* The work of one block at (B, T) on one of ep ranks (balanced routing), fp32 bytes. */
struct moe_block_work {
	double fwd_mm, fwd_attn, fwd_elem, bwd_mm, bwd_attn, bwd_elem;
};

static void block_work(const struct moe_config *c, int64_t B, int64_t T, int64_t ep, bool dense,
                       struct moe_block_work *w)
{
	double N = (double)(B * T), C = (double)c->dim, H = (double)c->n_heads;
	double D = (double)c->head_dim, HD = H * D, KVD = (double)c->n_kv_heads * D;
	double F = (double)c->inter_dim, E = (double)c->n_routed_experts, K = (double)c->top_k;
	double Fm = (double)c->moe_inter_dim, Fs = Fm * (double)c->n_shared_experts, e = 4.0;
	double NK = N * K; /* the (token, slot) rows; under ep, the rows a rank computes */
	w->fwd_mm = 2.0 * N * (C * HD + 2.0 * C * KVD + HD * C);
	w->fwd_attn = 2.0 * (double)B * H * (double)T * (double)T * D; /* causal half */
	w->bwd_attn = 2.5 * w->fwd_attn; /* as Llama's: scores again tile by tile, 4 products */
	/* two norms, RoPE on q and k, the xmid copy and the block output's copy */
	double fe = 8.0 * N * C + 2.0 * N * (HD + KVD);
	/* both norms' backward, dq/dk/dv zeroed, RoPE backward, dxn zeroed */
	double be = 9.0 * N * C + N * (HD + 2.0 * KVD) + 2.0 * N * (HD + KVD);
	if (dense) {
		w->fwd_mm += 2.0 * N * 3.0 * C * F;
		fe += 3.0 * N * F; /* SwiGLU: read 2, write 1 */
		be += 8.0 * N * F; /* SwiGLU again (3) and its backward (read 3, write 2) */
	} else {
		/* router (N, C) -> E; the top_k routed experts of each token; the shared experts */
		w->fwd_mm += 2.0 * N * C * E + 2.0 * NK * 3.0 * C * Fm + 2.0 * N * 3.0 * C * Fs;
		/* scores (read, write, normalise), the sorted copy of xn (xs), the experts' and
		 * shared SwiGLUs, the combine (read y, update out, per slot) */
		fe += 3.0 * N * E + 2.0 * NK * C + 3.0 * NK * Fm + 3.0 * N * Fs + 3.0 * NK * C;
		/* combine backward (read dout and y, write dy), the experts' dx zeroed, their and
		 * the shared SwiGLUs again and backward, the scatter-add into dxn, the scores'
		 * gradient (zeroed, read 3) */
		be += 3.0 * NK * C + NK * C + 8.0 * NK * Fm + 8.0 * N * Fs + 3.0 * NK * C +
		      4.0 * N * E;
		if (ep > 1) { /* regrouping what arrived by local expert, and back (forward: xe,
		                 ye; backward: dye, dxe): read + write each */
			fe += 4.0 * NK * C;
			be += 4.0 * NK * C;
		}
	}
	w->bwd_mm = 2.0 * w->fwd_mm;
	w->fwd_elem = e * fe;
	w->bwd_elem = e * be;
}

static void check_shape(const struct model_cost_shape *s)
{
	CHECK(s->tp <= 1 && s->cp <= 1,
	      "deepseek_v3 cost model: tp %lld, cp %lld (the family has neither)",
	      (long long)s->tp, (long long)s->cp);
}

static int64_t shape_ep(const struct model_cost_shape *s)
{
	return s->ep > 1 ? s->ep : 1;
}

/* Units: 0 the embedding, 1..L the blocks (the first n_dense_layers dense), L + 1 the final
 * RMSNorm + output projection (+ loss). */
static void moe_unit_work(const struct model_config *mc, const struct model_cost_shape *s, int u,
                          model_cost_work wk)
{
	check_shape(s);
	const struct moe_config *c = moe_cfg(mc);
	const int L = (int)c->n_layers;
	double N = (double)(s->B * s->T), C = (double)c->dim, V = (double)c->vocab_size;
	double es = (double)s->elem_bytes / 4.0; /* elementwise traffic scales with the dtype */
	double *fw = wk[MODEL_PASS_FWD], *bw = wk[MODEL_PASS_BWD];
	if (u == 0) {
		fw[MODEL_COST_EMBED] = es * 4.0 * 2.0 * N * C; /* lookup: read + write */
		bw[MODEL_COST_EMBED] = es * 4.0 * 3.0 * N * C; /* scatter: read dout, update rows */
		return;
	}
	if (u == L + 1) {
		fw[MODEL_COST_HEAD] = 6.0 * N * C * V; /* logits, their two gradients, fused */
		bw[MODEL_COST_ELEM] = es * 4.0 * 6.0 * N * C; /* two zeroed, final norm backward */
		return;
	}
	struct moe_block_work w;
	bool dense = u - 1 < c->n_dense_layers;
	block_work(c, s->B, s->T, shape_ep(s), dense, &w);
	fw[MODEL_COST_MATMUL] = w.fwd_mm;
	fw[MODEL_COST_ATTN] = w.fwd_attn;
	fw[MODEL_COST_ELEM] = es * w.fwd_elem;
	bw[MODEL_COST_MATMUL] = w.bwd_mm;
	bw[MODEL_COST_ATTN] = w.bwd_attn;
	bw[MODEL_COST_ELEM] = es * w.bwd_elem;
	/* activation checkpointing (moe.c's moe_block_keeps): full re-runs the forward (its
	 * all-to-alls too: moe_cost_inner); selective re-derives k (its projection) and the w3
	 * outputs (dense / shared h3, the experts' eh3) and the norms; ffn re-derives the
	 * up-projections (w1 and w3 outputs) inside the backward */
	double *rc = wk[MODEL_PASS_REC], KVD = (double)c->n_kv_heads * (double)c->head_dim;
	double NK = N * (double)c->top_k, Fm = (double)c->moe_inter_dim;
	double Fs = Fm * (double)c->n_shared_experts, F = (double)c->inter_dim;
	double w3 = dense ? 2.0 * N * C * F : 2.0 * (NK * C * Fm + N * C * Fs);
	enum model_ac ac = model_ac_block(s->ac, s->ac_every, u - 1);
	if (ac == MODEL_AC_FULL) {
		rc[MODEL_COST_MATMUL] = w.fwd_mm;
		rc[MODEL_COST_ATTN] = w.fwd_attn;
		rc[MODEL_COST_ELEM] = es * w.fwd_elem;
	} else if (ac == MODEL_AC_SELECTIVE) {
		rc[MODEL_COST_MATMUL] = 2.0 * N * C * KVD + w3;
		rc[MODEL_COST_ELEM] = es * 4.0 * (4.0 * N * C + 2.0 * N * KVD);
	} else if (ac == MODEL_AC_FFN) {
		bw[MODEL_COST_MATMUL] += 2.0 * w3;
	}
}

/* What the family's build (moe_family.c: the trainer's model, its ep) allocates under
 * MEM_ACTIVATIONS, by moe.c's carving; the reals scaled to elem_bytes (the ints and tokens
 * stay 4 bytes). */
static int64_t moe_cost_activation_bytes(const struct model_config *mc,
                                         const struct model_cost_shape *s)
{
	check_shape(s);
	const struct moe_config *c = moe_cfg(mc);
	int64_t reals = 0, ints = 0;
	int ep = (int)shape_ep(s);
	CHECK(moe_activation_bytes(c, s->B, s->T, ep, s->ac, s->ac_every, &reals, &ints) == CT_OK,
	      "deepseek_v3 cost model: no model at B %lld, T %lld, ep %d", (long long)s->B,
	      (long long)s->T, ep);
	return reals / 4 * s->elem_bytes + ints;
}

static double moe_cost_flops(const struct model_config *mc, int64_t seq_len)
{
	return moe_flops_per_token(moe_cfg(mc), seq_len);
}

/* The model's program (moe_ep_prog): one segment a pass, but a MoE block's forward and
 * backward under expert parallelism, whose dispatch is posted beside the shared expert and
 * whose combine blocks. */
static void moe_cost_prog(const struct model_config *mc, const struct model_cost_shape *s,
                          bool async, int u, enum model_pass p, struct model_prog *out)
{
	(void)async;
	check_shape(s);
	moe_ep_prog(moe_cfg(mc), s->B * s->T, (int)shape_ep(s), s->elem_bytes, u, p, out);
}

/* What one dispatch (or combine) sends to the other ep ranks, balanced routing: of its
 * N x top_k rows, the (ep - 1) / ep for other ranks' experts, C elements each. */
static int64_t a2a_bytes(const struct moe_config *c, const struct model_cost_shape *s)
{
	const int64_t ep = shape_ep(s), NK = s->B * s->T * c->top_k;
	return NK * (ep - 1) / ep * c->dim * s->elem_bytes;
}

/* A MoE block's all-to-alls over the ep group inside a segment (moe_impl.h), what this rank
 * sends, balanced routing: the forward's per-expert row counts (ep x E/ep ints, in segment
 * 0), and a full recompute's counts, dispatch and combine (its one segment). Each is one
 * collective: latency + bytes at the ep link's rate, blocking. The forward's and backward's
 * dispatch and combine are program nodes (moe_cost_prog; the schedule's EP-A2A and EP-WAIT,
 * priced by sched_predict). */
static void moe_cost_inner(const struct model_config *mc, const struct model_cost_shape *s, int u,
                           enum model_pass p, struct model_prog *out)
{
	check_shape(s);
	const struct moe_config *c = moe_cfg(mc);
	const int64_t ep = shape_ep(s);
	if (ep <= 1 || u < 1 || u > c->n_layers || u - 1 < c->n_dense_layers)
		return;
	/* only a full recompute dispatches and combines again (selective sends nothing) */
	if (p == MODEL_PASS_REC && model_ac_block(s->ac, s->ac_every, u - 1) != MODEL_AC_FULL)
		return;
	const struct model_coll_desc rows = {.kind = MODEL_COLL_ALL_TO_ALL,
	                                     .bytes = a2a_bytes(c, s),
	                                     .group = (int)ep,
	                                     .role = MODEL_GROUP_EP};
	if (p != MODEL_PASS_BWD) {
		struct model_coll_desc counts = rows;
		counts.bytes = (ep - 1) * (c->n_routed_experts / ep) * (int64_t)sizeof(int32_t);
		out->c[out->n++] = counts;
	}
	if (p == MODEL_PASS_REC) { /* a full recompute's, inside its one segment */
		out->c[out->n++] = rows;
		out->c[out->n++] = rows;
	} /* the forward's and backward's are its program's nodes (moe_cost_prog) */
}

/* ---------------------------------------------------------------- calibration */

/* The buffers of one MoE block at (B, T) with this rank's E / ep experts receiving the
 * balanced N x top_k rows (expert e: rows [r0[e], r0[e + 1])), and the head. */
struct cal {
	int64_t B, T, N, C, H, KV, D, HD, KVD, E, El, K, Fm, Fs, V, R, chunk;
	int64_t *r0;
	float *x, *xn, *q, *k, *v, *att, *lse, *out, *rstd, *cos, *sin, *s, *xs, *eh1, *eh3,
	    *egate, *y, *h1, *h3, *hgate;
	float *dq, *dk, *dv, *dxn, *dres, *dx, *dy, *dxs, *deh1, *deh3, *dh1, *dh3, *ds, *g;
	float *wq, *wk, *wv, *wo, *wg, *w1, *w2, *w3, *sw1, *sw2, *sw3, *wout, *nw, *dw, *ce;
	int32_t *tok, *pos;
	float *all;
};

static void cal_alloc(struct cal *c, const struct moe_config *mc, int64_t B, int64_t T,
                      int64_t ep)
{
	memset(c, 0, sizeof(*c));
	c->B = B, c->T = T, c->N = B * T, c->C = mc->dim, c->H = mc->n_heads;
	c->KV = mc->n_kv_heads, c->D = mc->head_dim, c->HD = c->H * c->D, c->KVD = c->KV * c->D;
	c->E = mc->n_routed_experts, c->El = c->E / ep, c->K = mc->top_k;
	c->Fm = mc->moe_inter_dim, c->Fs = c->Fm * mc->n_shared_experts, c->V = mc->vocab_size;
	c->R = c->N * c->K;
	c->chunk = (4 << 20) / (4 * c->V); /* moe_build's loss chunk (float) */
	c->chunk = c->chunk < 1 ? 1 : (c->chunk > c->N ? c->N : c->chunk);
	int64_t N = c->N, C = c->C, HD = c->HD, KVD = c->KVD, E = c->E, El = c->El, R = c->R;
	int64_t Fm = c->Fm, Fs = c->Fs, V = c->V;
	int64_t big = V * C > El * Fm * C ? V * C : El * Fm * C;
	big = big > Fs * C ? big : Fs * C;
	const struct model_cost_view parts[] = {{&c->x, N * C},       {&c->xn, N * C},       {&c->q, N * HD},
	             {&c->k, N * KVD},     {&c->v, N * KVD},      {&c->att, N * HD},
	             {&c->lse, N * c->H},  {&c->out, N * C},      {&c->rstd, N},
	             {&c->cos, T * c->D},  {&c->sin, T * c->D},   {&c->s, N * E},
	             {&c->xs, R * C},      {&c->eh1, R * Fm},     {&c->eh3, R * Fm},
	             {&c->egate, R * Fm},  {&c->y, R * C},        {&c->h1, N * Fs},
	             {&c->h3, N * Fs},     {&c->hgate, N * Fs},   {&c->dq, N * HD},
	             {&c->dk, N * KVD},    {&c->dv, N * KVD},     {&c->dxn, N * C},
	             {&c->dres, N * C},    {&c->dx, N * C},       {&c->dy, R * C},
	             {&c->dxs, R * C},     {&c->deh1, R * Fm},    {&c->deh3, R * Fm},
	             {&c->dh1, N * Fs},    {&c->dh3, N * Fs},     {&c->ds, N * E},
	             {&c->g, R},           {&c->wq, HD * C},      {&c->wk, KVD * C},
	             {&c->wv, KVD * C},    {&c->wo, C * HD},      {&c->wg, E * C},
	             {&c->w1, El * Fm * C}, {&c->w2, El * C * Fm}, {&c->w3, El * Fm * C},
	             {&c->sw1, Fs * C},    {&c->sw2, C * Fs},     {&c->sw3, Fs * C},
	             {&c->wout, V * C},    {&c->nw, C},           {&c->dw, big},
	             {&c->ce, c->chunk * V}};
	c->all = model_cost_cal_buffers(parts, sizeof(parts) / sizeof(parts[0]), &c->tok, N, V);
	c->pos = malloc((size_t)R * sizeof(int32_t));
	c->r0 = malloc((size_t)(El + 1) * sizeof(int64_t));
	CHECK(c->pos && c->r0, "out of memory (cost model calibration)");
	for (int64_t i = 0; i < R; i++) /* a fixed permutation of the slots (the sort's rows) */
		c->pos[i] = (int32_t)((i * 7 + (i / c->K)) % R);
	for (int64_t e = 0; e <= El; e++) /* balanced: R / El rows each, the rest in front */
		c->r0[e] = e * (R / El) + (e < R % El ? e : R % El);
}

enum cal_part {
	CAL_FWD_MM,
	CAL_FWD_ATTN,
	CAL_FWD_ELEM,
	CAL_BWD_MM,
	CAL_BWD_ATTN,
	CAL_BWD_ELEM,
	CAL_HEAD,
	CAL_EMBED,
	CAL_PARTS
};
_Static_assert(CAL_PARTS <= MODEL_COST_PARTS_MAX, "calibration parts");

/* the forward matmuls of a MoE block (moe_impl.h): q, k, v, o, the router, each local
 * expert's SwiGLU over its rows, the shared experts */
static void cal_fwd_mm(struct cal *c)
{
	int64_t N = c->N, C = c->C, HD = c->HD, KVD = c->KVD, Fm = c->Fm, Fs = c->Fs;
	matmul_forward_f32(c->q, c->xn, c->wq, N, C, HD, 0);
	matmul_forward_f32(c->k, c->xn, c->wk, N, C, KVD, 0);
	matmul_forward_f32(c->v, c->xn, c->wv, N, C, KVD, 0);
	matmul_forward_f32(c->out, c->att, c->wo, N, HD, C, 1);
	matmul_forward_f32(c->s, c->xn, c->wg, N, C, c->E, 0);
	for (int64_t e = 0; e < c->El; e++) {
		int64_t r = c->r0[e], n = c->r0[e + 1] - r;
		if (n == 0)
			continue;
		matmul_forward_f32(c->eh1 + r * Fm, c->xs + r * C, c->w1 + e * Fm * C, n, C, Fm, 0);
		matmul_forward_f32(c->eh3 + r * Fm, c->xs + r * C, c->w3 + e * Fm * C, n, C, Fm, 0);
		matmul_forward_f32(c->y + r * C, c->egate + r * Fm, c->w2 + e * C * Fm, n, Fm, C, 0);
	}
	if (Fs > 0) {
		matmul_forward_f32(c->h1, c->xn, c->sw1, N, C, Fs, 0);
		matmul_forward_f32(c->h3, c->xn, c->sw3, N, C, Fs, 0);
		matmul_forward_f32(c->out, c->hgate, c->sw2, N, Fs, C, 1);
	}
}

static void cal_bwd_mm(struct cal *c)
{
	int64_t N = c->N, C = c->C, HD = c->HD, KVD = c->KVD, Fm = c->Fm, Fs = c->Fs;
	if (Fs > 0) {
		matmul_backward_set_f32(c->dh3, c->dw, c->dres, c->hgate, c->sw2, N, Fs, C);
		matmul_backward_f32(c->dxn, c->dw, c->dh1, c->xn, c->sw1, N, C, Fs);
		matmul_backward_f32(c->dxn, c->dw, c->dh3, c->xn, c->sw3, N, C, Fs);
	}
	for (int64_t e = 0; e < c->El; e++) {
		int64_t r = c->r0[e], n = c->r0[e + 1] - r;
		if (n == 0)
			continue;
		matmul_backward_set_f32(c->deh3 + r * Fm, c->dw, c->dy + r * C, c->egate + r * Fm,
		                        c->w2 + e * C * Fm, n, Fm, C);
		matmul_backward_f32(c->dxs + r * C, c->dw, c->deh1 + r * Fm, c->xs + r * C,
		                    c->w1 + e * Fm * C, n, C, Fm);
		matmul_backward_f32(c->dxs + r * C, c->dw, c->deh3 + r * Fm, c->xs + r * C,
		                    c->w3 + e * Fm * C, n, C, Fm);
	}
	matmul_backward_f32(c->dxn, c->dw, c->ds, c->xn, c->wg, N, C, c->E);
	matmul_backward_set_f32(c->dx, c->dw, c->dres, c->att, c->wo, N, HD, C);
	matmul_backward_set_f32(c->dxn, c->dw, c->dq, c->xn, c->wq, N, C, HD);
	matmul_backward_f32(c->dxn, c->dw, c->dk, c->xn, c->wk, N, C, KVD);
	matmul_backward_f32(c->dxn, c->dw, c->dv, c->xn, c->wv, N, C, KVD);
}

/* the elementwise work of a MoE block's forward: norms, RoPE, the copies, the scores (a
 * softmax), the sorted copy of xn, the SwiGLUs and the combine */
static void cal_fwd_elem(struct cal *c)
{
	int64_t B = c->B, T = c->T, N = c->N, C = c->C, E = c->E, K = c->K;
	size_t nc = (size_t)(N * C) * sizeof(float);
	rmsnorm_forward_f32(c->xn, c->rstd, c->x, c->nw, N, C, 1e-5);
	rope_forward_f32(c->q, c->cos, c->sin, B, T, c->H, c->D);
	rope_forward_f32(c->k, c->cos, c->sin, B, T, c->KV, c->D);
	memcpy(c->dx, c->x, nc);
	rmsnorm_forward_f32(c->xn, c->rstd, c->dx, c->nw, N, C, 1e-5);
#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < N; t++) {
		float *st = c->s + t * E, mx = st[0], sum = 0;
		for (int64_t e = 1; e < E; e++)
			mx = st[e] > mx ? st[e] : mx;
		for (int64_t e = 0; e < E; e++) {
			st[e] = expf(st[e] - mx);
			sum += st[e];
		}
		for (int64_t e = 0; e < E; e++)
			st[e] = st[e] / sum * 1e-3f; /* kept small for the next runs */
	}
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < N * K; i++)
		memcpy(c->xs + (int64_t)c->pos[i] * C, c->xn + (i / K) * C, (size_t)C * sizeof(float));
	swiglu_forward_f32(c->egate, c->eh1, c->eh3, c->R * c->Fm);
	memcpy(c->out, c->dx, nc);
#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < N; t++)
		for (int64_t k = 0; k < K; k++) {
			const float *yr = c->y + (int64_t)c->pos[t * K + k] * C;
			float gk = c->g[t * K + k];
			for (int64_t j = 0; j < C; j++)
				c->out[t * C + j] += gk * yr[j];
		}
	if (c->Fs > 0)
		swiglu_forward_f32(c->hgate, c->h1, c->h3, N * c->Fs);
}

static void cal_bwd_elem(struct cal *c)
{
	int64_t B = c->B, T = c->T, N = c->N, C = c->C, E = c->E, K = c->K, R = c->R, Fm = c->Fm;
	size_t nc = (size_t)(N * C) * sizeof(float);
	memset(c->dxn, 0, nc);
	if (c->Fs > 0) {
		swiglu_forward_f32(c->hgate, c->h1, c->h3, N * c->Fs);
		swiglu_backward_f32(c->dh1, c->dh3, c->hgate, c->h1, c->h3, N * c->Fs);
	}
#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < N; t++)
		for (int64_t k = 0; k < K; k++) {
			int64_t r = c->pos[t * K + k];
			double dot = 0.0;
			for (int64_t j = 0; j < C; j++) {
				c->dy[r * C + j] = c->g[t * K + k] * c->dres[t * C + j];
				dot += (double)c->dres[t * C + j] * (double)c->y[r * C + j];
			}
			c->ds[t * E] = (float)dot * 1e-6f;
		}
	memset(c->dxs, 0, (size_t)(R * C) * sizeof(float));
	swiglu_forward_f32(c->egate, c->eh1, c->eh3, R * Fm);
	swiglu_backward_f32(c->deh1, c->deh3, c->egate, c->eh1, c->eh3, R * Fm);
#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < N; t++)
		for (int64_t k = 0; k < K; k++) {
			const float *d = c->dxs + (int64_t)c->pos[t * K + k] * C;
			for (int64_t j = 0; j < C; j++)
				c->dxn[t * C + j] += d[j];
		}
	memset(c->ds, 0, (size_t)(N * E) * sizeof(float));
	rmsnorm_backward_f32(c->dres, c->dw, c->dxn, c->out, c->nw, c->rstd, N, C);
	memset(c->dq, 0, (size_t)(N * c->HD) * sizeof(float));
	memset(c->dk, 0, (size_t)(N * c->KVD) * sizeof(float));
	memset(c->dv, 0, (size_t)(N * c->KVD) * sizeof(float));
	rope_backward_f32(c->dq, c->cos, c->sin, B, T, c->H, c->D);
	rope_backward_f32(c->dk, c->cos, c->sin, B, T, c->KV, c->D);
	rmsnorm_backward_f32(c->dres, c->dw, c->dxn, c->x, c->nw, c->rstd, N, C);
}

/* Run one part of a unit's work once, the kernels a MoE unit runs, in its order. */
static void cal_run(void *impl, int part)
{
	struct cal *c = impl;
	int64_t nv;
	switch ((enum cal_part)part) {
	case CAL_FWD_MM:
		cal_fwd_mm(c);
		break;
	case CAL_FWD_ATTN:
		attention_mixed_forward(c->att, c->lse, c->q, c->k, c->v, c->B, c->T, c->H, c->KV,
		                      c->D);
		break;
	case CAL_FWD_ELEM:
		cal_fwd_elem(c);
		break;
	case CAL_BWD_MM:
		cal_bwd_mm(c);
		break;
	case CAL_BWD_ATTN:
		attention_mixed_backward(c->dq, c->dk, c->dv, c->att, c->att, c->lse, c->q, c->k,
		                       c->v, c->B, c->T, c->H, c->KV, c->D);
		break;
	case CAL_BWD_ELEM:
		cal_bwd_elem(c);
		break;
	case CAL_HEAD:
		rmsnorm_forward_f32(c->xn, c->rstd, c->x, c->nw, c->N, c->C, 1e-5);
		cross_entropy_fused_f32(c->dx, c->dw, c->xn, c->wout, c->tok, c->N, c->C, c->V, -100,
		                        1e-3, c->ce, c->chunk, &nv);
		break;
	case CAL_EMBED:
		embedding_forward_f32(c->x, c->tok, c->wout, c->N, c->C);
		embedding_backward_f32(c->dw, c->dres, c->tok, c->N, c->C);
		break;
	default:
		break;
	}
}

static void cal_free(void *impl)
{
	struct cal *c = impl;
	free(c->all), free(c->tok), free(c->pos), free(c->r0);
	free(c);
}

/* A MoE block (most of the model's blocks; the dense ones take its rates), the head and the
 * embedding at (B, T); each part's work is what moe_unit_work counts for it in fp32 (the
 * regrouping copies of ep > 1 are not run: the parts' work leaves them out). */
static void moe_calib_init(struct model_cost_calib *cal, const struct model_config *mc,
                           const struct model_cost_shape *s)
{
	check_shape(s);
	const struct moe_config *mcfg = moe_cfg(mc);
	struct cal *c = xcalloc(1, sizeof(*c));
	cal_alloc(c, mcfg, s->B, s->T, shape_ep(s));
	struct moe_block_work w;
	block_work(mcfg, s->B, s->T, 1, false, &w);
	double N = (double)c->N, C = (double)c->C, V = (double)c->V;
	const struct model_cost_part parts[CAL_PARTS] = {
	    [CAL_FWD_MM] = {MODEL_PASS_FWD, MODEL_COST_MATMUL, w.fwd_mm},
	    [CAL_FWD_ATTN] = {MODEL_PASS_FWD, MODEL_COST_ATTN, w.fwd_attn},
	    [CAL_FWD_ELEM] = {MODEL_PASS_FWD, MODEL_COST_ELEM, w.fwd_elem},
	    [CAL_BWD_MM] = {MODEL_PASS_BWD, MODEL_COST_MATMUL, w.bwd_mm},
	    [CAL_BWD_ATTN] = {MODEL_PASS_BWD, MODEL_COST_ATTN, w.bwd_attn},
	    [CAL_BWD_ELEM] = {MODEL_PASS_BWD, MODEL_COST_ELEM, w.bwd_elem},
	    [CAL_HEAD] = {MODEL_PASS_COUNT, MODEL_COST_HEAD, 6.0 * N * C * V},
	    [CAL_EMBED] = {MODEL_PASS_COUNT, MODEL_COST_EMBED, 4.0 * 5.0 * N * C},
	};
	cal->n_parts = CAL_PARTS;
	memcpy(cal->part, parts, sizeof(parts));
	cal->busy_part = CAL_FWD_MM;
	cal->impl = c;
	cal->run = cal_run;
	cal->free = cal_free;
}

const struct model_cost_ops moe_cost_ops = {
    .unit_work = moe_unit_work,
    .activation_bytes = moe_cost_activation_bytes,
    .flops_per_token = moe_cost_flops,
    .unit_prog = moe_cost_prog,
    .calib_init = moe_calib_init,
    .unit_inner = moe_cost_inner,
};
