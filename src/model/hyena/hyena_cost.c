/* model/hyena_cost: Hyena's figures for the cost model — work per unit pass and term, the
 * activation bytes by checkpointing mode (hyena.c's own carving), and the calibration kernels
 * at the model's shapes. The work counts are what schedule/sched_cost.c divides by the
 * measured rates; calibration times the same kernels on the same counts, so a rate is work
 * over time as the model's passes do it.
 *
 * Terms: MATMUL the four linears of a block (in_proj D -> (N+1)D, out_proj, fc1, fc2); ATTN
 * the sequence mixer (the implicit filter MLP, the filter spectra and the FFT long
 * convolutions); ELEM the bytes of LayerNorms, biases, the short convolution, the gates,
 * GELU and the residual copies; HEAD the fused tied head + cross-entropy; EMBED the lookup,
 * the tied copy and the scatter. Under tensor parallelism (tp ranks, not sequence-parallel)
 * a rank holds D/tp channels of the mixer and ffn_hidden/tp of the MLP: the linears, the
 * long convolutions, the filters' last layer and the channel-wise elementwise work are one
 * tp-th, the LayerNorms, residual copies, the filter MLP's first layers, the head and the
 * embedding whole; its all-reduces (out_proj's and fc2's outputs in forward, the
 * column-parallel input gradients and the filter MLP's gradients in backward, out_proj's again
 * in a full recompute) are in-pass collectives on the tp group (unit_inner), each a
 * reduce-scatter and an all-gather. No context parallelism (the family refuses it). */
#include "model/hyena/hyena_cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/log.h"
#include "kernels/hyena_kernels.h"
#include "kernels/kernels.h"
#include "model/hyena/hyena.h"
#include "model/model.h"

/* ---------------------------------------------------------------- work */

/* The work of one block (and the head, embedding) at (B, T), fp32 bytes. */
struct hyena_block_work {
	double fwd_mm, fwd_attn, fwd_elem, bwd_mm, bwd_attn, bwd_elem;
	double ffn_mm, ffn_elem;           /* mode ffn: fc1 (and its bias) again in backward */
	double rec_full_mm, rec_full_elem; /* full: the forward without gelu and fc2 */
	double rec_sel_elem;               /* selective: short conv and gates (+ the mixer) */
	double head, head_bwd_elem, embed_fwd, embed_bwd;
};

static void block_work(const struct hyena_config *c, int64_t B, int64_t T, int64_t tp,
                       struct hyena_block_work *w)
{
	double N = (double)(B * T), D = (double)c->dim, No = (double)c->order;
	double Dl = D / (double)tp; /* this rank's channels */
	double P = (No + 1.0) * Dl, Cf = (No - 1.0) * Dl, H = (double)c->ffn_hidden / (double)tp;
	double F = (double)c->filter_order, E = (double)c->emb_dim, V = (double)c->vocab_size;
	double Tt = (double)T, e = 4.0;
	/* a real FFT of length n counts 2.5 n log2 n FLOPs (the usual split-radix estimate); a
	 * pointwise complex product over the n/2 + 1 bins 6 FLOPs per bin, the backward's
	 * dy .* conj(x) accumulation 8 */
	double n = (double)fftconv_size(T), bins = n / 2.0 + 1.0;
	double fft = 2.5 * n * log2(n > 1 ? n : 2);
	/* the filter MLP over T positions (independent of B): z (T,E) -> F -> F -> F -> Cf */
	double filt_f = 2.0 * Tt * (E * F + 2.0 * F * F + F * Cf);
	double filt_b = 2.0 * Tt * E * F + 4.0 * Tt * (2.0 * F * F + F * Cf); /* no dz */
	/* forward: Cf filter spectra, then per long convolution and (batch row, channel) an
	 * r2c of the input, the product with the spectrum and a c2r */
	double conv_f = (No - 1.0) * B * Dl * (2.0 * fft + 6.0 * bins);
	/* backward: per (row, channel) r2c of dy and of x, dy .* conj(x) accumulated, dy .*
	 * conj(H) and its c2r (dx); per channel a c2r of the accumulated filter gradient */
	double conv_b = (No - 1.0) * (B * Dl * (3.0 * fft + 14.0 * bins) + Dl * fft);
	w->fwd_attn = filt_f + Cf * fft + conv_f;
	w->bwd_attn = filt_b + conv_b;
	w->fwd_mm = 2.0 * N * (D * P + Dl * D + 2.0 * D * H);
	w->bwd_mm = 2.0 * w->fwd_mm;
	w->ffn_mm = 2.0 * N * D * H;
	w->rec_full_mm = 2.0 * N * (D * P + Dl * D + D * H);
	/* forward bytes, read + write: LN1, in bias (P), short conv (P), N gates (read 2, write
	 * 1), the xmid copy, out bias, LN2, fc1 bias (H), GELU (H), the output copy, fc2 bias */
	w->fwd_elem = e * (N * (12.0 * D + 3.0 * No * Dl) + 4.0 * N * P + 4.0 * N * H);
	/* backward: LN2 and LN1 again (2 each), their backwards (4 each), GELU again (2),
	 * GELU backward (4), the bias gradients (read once: D, H, D, P), the zeroed gradient
	 * buffers, the gate gradients (read 2, update 1: 4 each, the last gate's two and two
	 * per convolution), the short conv backward (read 2, update 1, zeroed: 4 P) */
	w->bwd_elem = e * (N * (26.0 * D + 10.0 * (No - 1.0) * Dl) + 6.0 * N * P + 9.0 * N * H);
	w->ffn_elem = e * 2.0 * N * H;
	w->rec_full_elem = e * (N * (8.0 * D + 3.0 * No * Dl) + 4.0 * N * P + 2.0 * N * H);
	w->rec_sel_elem = e * (3.0 * N * Dl * No + 2.0 * N * P);
	w->head = 6.0 * N * D * V; /* logits, their input and weight gradients, fused */
	w->head_bwd_elem = e * 5.0 * N * D; /* zero dres, final LayerNorm backward */
	/* lookup (read + write) and the copy of the tied embedding the head reads under FSDP;
	 * the head's share of its gradient added (read 2, write 1), the scatter (read dout,
	 * update rows) */
	w->embed_fwd = e * (2.0 * N * D + 2.0 * V * D);
	w->embed_bwd = e * (3.0 * V * D + 3.0 * N * D);
}

static void check_shape(const struct model_cost_shape *s)
{
	CHECK(s->cp <= 1, "hyena cost model: cp %lld (the family has none)", (long long)s->cp);
}

static int64_t tp_of(const struct model_cost_shape *s)
{
	return s->tp > 1 ? s->tp : 1;
}

/* Units: 0 the embedding, 1..L the blocks, L + 1 the final LayerNorm + tied head (+ loss). */
static void hyena_unit_work(const struct model_config *mc, const struct model_cost_shape *s, int u,
                            model_cost_work wk)
{
	check_shape(s);
	const struct hyena_config *c = hyena_cfg(mc);
	const int L = (int)c->n_layers;
	struct hyena_block_work w;
	block_work(c, s->B, s->T, tp_of(s), &w);
	double es = (double)s->elem_bytes / 4.0; /* elementwise traffic scales with the dtype */
	double *fw = wk[MODEL_PASS_FWD], *bw = wk[MODEL_PASS_BWD], *rc = wk[MODEL_PASS_REC];
	if (u == 0) {
		fw[MODEL_COST_EMBED] = es * w.embed_fwd;
		bw[MODEL_COST_EMBED] = es * w.embed_bwd;
		return;
	}
	if (u == L + 1) {
		fw[MODEL_COST_HEAD] = w.head;
		bw[MODEL_COST_ELEM] = es * w.head_bwd_elem;
		return;
	}
	const enum model_ac ac = model_ac_block(s->ac, s->ac_every, u - 1); /* block u - 1's */
	fw[MODEL_COST_MATMUL] = w.fwd_mm;
	fw[MODEL_COST_ATTN] = w.fwd_attn;
	fw[MODEL_COST_ELEM] = es * w.fwd_elem;
	bw[MODEL_COST_MATMUL] = w.bwd_mm + (ac == MODEL_AC_FFN ? w.ffn_mm : 0.0);
	bw[MODEL_COST_ATTN] = w.bwd_attn;
	bw[MODEL_COST_ELEM] = es * (w.bwd_elem + (ac == MODEL_AC_FFN ? w.ffn_elem : 0.0));
	if (ac == MODEL_AC_FULL) { /* blk_filters, blk_in, blk_mix, blk_mid */
		rc[MODEL_COST_MATMUL] = w.rec_full_mm;
		rc[MODEL_COST_ATTN] = w.fwd_attn;
		rc[MODEL_COST_ELEM] = es * w.rec_full_elem;
	} else if (ac == MODEL_AC_SELECTIVE) { /* blk_filters, blk_mix */
		rc[MODEL_COST_ATTN] = w.fwd_attn;
		rc[MODEL_COST_ELEM] = es * w.rec_sel_elem;
	}
}

/* What the family's build (hyena_family.c: the trainer's model, parameters bound by FSDP,
 * so the head keeps its copy of the embedding; OpenMP's thread count for the FFT scratch)
 * allocates under MEM_ACTIVATIONS, by hyena.c's carving; the reals scaled to elem_bytes. */
static int64_t hyena_cost_activation_bytes(const struct model_config *mc,
                                           const struct model_cost_shape *s)
{
	check_shape(s);
	/* (hyena_build reads only the group's size for its shapes) */
	const struct model_group tp = {.size = (int)tp_of(s)};
	const struct hyena_build_opts o = {
	    .own_params = false, .ac = s->ac, .ac_every = s->ac_every, .tp = &tp};
	int64_t bytes = 0;
	CHECK(hyena_activation_bytes(hyena_cfg(mc), s->B, s->T, &o, &bytes) == CT_OK,
	      "hyena cost model: no model at B %lld, T %lld", (long long)s->B, (long long)s->T);
	int64_t tokens = 2 * s->B * s->T * (int64_t)sizeof(int32_t);
	return tokens + (bytes - tokens) / 4 * s->elem_bytes;
}

static double hyena_cost_flops(const struct model_config *mc, int64_t seq_len)
{
	return hyena_flops_per_token(hyena_cfg(mc), seq_len);
}

/* Every pass is one compute segment (model/model_prog.h): the all-reduces of tensor
 * parallelism run inside it (hyena_cost_inner). */
static void hyena_cost_prog(const struct model_config *mc, const struct model_cost_shape *s,
                            bool async, int u, enum model_pass p, struct model_prog *out)
{
	(void)mc, (void)async, (void)u, (void)p;
	check_shape(s);
	memset(out, 0, sizeof(*out));
}

/* One all-reduce of n floats over the tp group, as a ring's reduce-scatter and all-gather:
 * each sends (tp - 1) blocks of n / tp. */
static void add_all_reduce(struct model_prog *out, int64_t tp, int64_t n)
{
	int64_t bytes = (tp - 1) * ((n + tp - 1) / tp) * (int64_t)sizeof(float);
	const enum model_coll kinds[2] = {MODEL_COLL_REDUCE_SCATTER, MODEL_COLL_ALL_GATHER};
	for (int k = 0; k < 2; k++) {
		CHECK(out->n < MODEL_PROG_MAX, "hyena cost model: too many in-pass collectives");
		out->c[out->n++] = (struct model_coll_desc){
		    .kind = kinds[k], .bytes = bytes, .group = (int)tp, .role = MODEL_GROUP_TP};
	}
}

/* The all-reduces inside block u's passes under tensor parallelism (hyena_impl.h). */
static void hyena_cost_inner(const struct model_config *mc, const struct model_cost_shape *s,
                             int u, enum model_pass p, struct model_prog *out)
{
	const struct hyena_config *c = hyena_cfg(mc);
	int64_t tp = tp_of(s), nd = s->B * s->T * c->dim, F = c->filter_order;
	memset(out, 0, sizeof(*out));
	if (tp < 2 || u < 1 || u > c->n_layers)
		return;
	const enum model_ac ac = model_ac_block(s->ac, s->ac_every, u - 1);
	int n = p == MODEL_PASS_FWD ? 2 : p == MODEL_PASS_BWD ? 2 : ac == MODEL_AC_FULL ? 1 : 0;
	for (int i = 0; i < n; i++)
		add_all_reduce(out, tp, nd);
	if (p == MODEL_PASS_BWD) /* the filter MLP's layers before the last */
		add_all_reduce(out, tp, F * c->emb_dim + 4 * F + 2 * F * F);
}

/* ---------------------------------------------------------------- calibration */

/* The buffers of one block at (B, T), its filter, the head and the embedding, filled with
 * small values. */
struct cal {
	int64_t B, T, N, D, No, P, Cf, H, F, E, V, S, chunk;
	int nthreads;
	float *x, *xn, *p, *pc, *g, *v, *y, *xmid, *ha, *gl, *mean, *rstd;
	float *dres, *dxn, *dy, *dv, *dg, *dgl, *da, *dpc, *dp;
	float *w_in, *b_in, *sf_w, *sf_b, *fbias, *w_out, *b_out, *ln_w, *ln_b, *fc1, *fc1b, *fc2,
	    *fc2b;
	float *m0, *m0b, *freq, *m1, *m1b, *m2, *m2b, *m3;
	float *z, *window, *h, *fa, *dh, *Hf, *filt, *fft;
	float *wte, *tied, *dwte, *dw, *db, *fgrad, *ce;
	int32_t *tok;
	float *all;
};

static void cal_alloc(struct cal *c, const struct hyena_config *hc, int64_t B, int64_t T)
{
	memset(c, 0, sizeof(*c));
	c->B = B, c->T = T, c->N = B * T, c->D = hc->dim, c->No = hc->order;
	c->P = (c->No + 1) * c->D, c->Cf = (c->No - 1) * c->D, c->H = hc->ffn_hidden;
	c->F = hc->filter_order, c->E = hc->emb_dim, c->V = hc->vocab_size;
	c->S = fftconv_spectrum_stride(T);
	c->nthreads = 1;
#ifdef _OPENMP
	c->nthreads = omp_get_max_threads(); /* as the family's build (hyena_build_opts) */
#endif
	c->chunk = (4 << 20) / (4 * c->V); /* hyena_build's loss chunk (float) */
	c->chunk = c->chunk < 1 ? 1 : (c->chunk > c->N ? c->N : c->chunk);
	int64_t N = c->N, D = c->D, P = c->P, Cf = c->Cf, H = c->H, F = c->F, E = c->E, V = c->V;
	int64_t big = V * D > P * D ? V * D : P * D;
	big = big > H * D ? big : H * D;
	const struct model_cost_view parts[] = {{&c->x, N * D},
	             {&c->xn, N * D},
	             {&c->p, N * P},
	             {&c->pc, N * P},
	             {&c->g, (c->No - 1) * N * D},
	             {&c->v, (c->No - 1) * N * D},
	             {&c->y, N * D},
	             {&c->xmid, N * D},
	             {&c->ha, N * H},
	             {&c->gl, N * H},
	             {&c->mean, N},
	             {&c->rstd, N},
	             {&c->dres, N * D},
	             {&c->dxn, N * D},
	             {&c->dy, N * D},
	             {&c->dv, N * D},
	             {&c->dg, N * D},
	             {&c->dgl, N * H},
	             {&c->da, N * H},
	             {&c->dpc, N * P},
	             {&c->dp, N * P},
	             {&c->w_in, P * D},
	             {&c->b_in, P},
	             {&c->sf_w, P * HYENA_SHORT_FILTER},
	             {&c->sf_b, P},
	             {&c->fbias, Cf},
	             {&c->w_out, D * D},
	             {&c->b_out, D},
	             {&c->ln_w, D},
	             {&c->ln_b, D},
	             {&c->fc1, H * D},
	             {&c->fc1b, H},
	             {&c->fc2, D * H},
	             {&c->fc2b, D},
	             {&c->m0, F * E},
	             {&c->m0b, F},
	             {&c->freq, F},
	             {&c->m1, F * F},
	             {&c->m1b, F},
	             {&c->m2, F * F},
	             {&c->m2b, F},
	             {&c->m3, Cf * F},
	             {&c->z, T * E},
	             {&c->window, T * Cf},
	             {&c->h, T * Cf},
	             {&c->fa, 6 * T * F},
	             {&c->dh, T * Cf},
	             {&c->Hf, Cf * c->S},
	             {&c->filt, T * (Cf + 2 * F)},
	             {&c->fft, fftconv_scratch_reals(T, c->nthreads)},
	             {&c->wte, V * D},
	             {&c->tied, V * D},
	             {&c->dwte, V * D},
	             {&c->dw, big},
	             {&c->db, P > H ? P : H},
	             {&c->fgrad, F * E + 6 * F + 2 * F * F + Cf * F + Cf + 2 * D + P * 4},
	             {&c->ce, c->chunk * V}};
	c->all = model_cost_cal_buffers(parts, sizeof(parts) / sizeof(parts[0]), &c->tok, N, V);
	hyena_filter_features_f32(c->z, c->window, T, hc->l_max > T ? hc->l_max : T, E, Cf);
}

/* The gates of the block (hyena_impl.h's mul_cols and mul_cols_back): out = a .* b and
 * da += dout .* b, a and b strided. */
static void gate(float *out, const float *a, int64_t lda, const float *b, int64_t ldb, int64_t N,
                 int64_t D)
{
#pragma omp parallel for schedule(static)
	for (int64_t n = 0; n < N; n++)
		for (int64_t k = 0; k < D; k++)
			out[n * D + k] = a[n * lda + k] * b[n * ldb + k];
}

static void gate_back(float *da, int64_t lda, const float *dout, const float *b, int64_t ldb,
                      int64_t N, int64_t D)
{
#pragma omp parallel for schedule(static)
	for (int64_t n = 0; n < N; n++)
		for (int64_t k = 0; k < D; k++)
			da[n * lda + k] += dout[n * D + k] * b[n * ldb + k];
}

/* The parts, in the order they are timed. */
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

/* the elementwise ops of a block's forward, in hyena_impl.h's order */
static void cal_fwd_elem(struct cal *c)
{
	int64_t B = c->B, T = c->T, N = c->N, D = c->D, No = c->No, P = c->P, H = c->H;
	size_t nd = (size_t)(N * D) * sizeof(float);
	layernorm_forward_f32(c->xn, c->mean, c->rstd, c->x, c->ln_w, c->ln_b, N, D, 1e-5);
	bias_forward_f32(c->p, c->b_in, N, P);
	shortconv_forward_f32(c->pc, c->p, c->sf_w, c->sf_b, B, T, P, HYENA_SHORT_FILTER);
	for (int64_t o = 0; o < No - 1; o++) {
		const float *src = o == 0 ? c->pc + No * D : c->v + (o - 1) * N * D;
		gate(c->g + o * N * D, src, o == 0 ? P : D, c->pc + (No - 1 - o) * D, P, N, D);
	}
	gate(c->y, c->v + (No - 2) * N * D, D, c->pc, P, N, D);
	memcpy(c->xmid, c->x, nd);
	bias_forward_f32(c->xmid, c->b_out, N, D);
	layernorm_forward_f32(c->xn, c->mean, c->rstd, c->xmid, c->ln_w, c->ln_b, N, D, 1e-5);
	bias_forward_f32(c->ha, c->fc1b, N, H);
	gelu_forward_f32(c->gl, c->ha, N * H);
	memcpy(c->dy, c->xmid, nd); /* the block output's copy (dy: a spare (N,D)) */
	bias_forward_f32(c->dy, c->fc2b, N, D);
}

/* the elementwise ops of a block's backward, in hyena_impl.h's order */
static void cal_bwd_elem(struct cal *c)
{
	int64_t B = c->B, T = c->T, N = c->N, D = c->D, No = c->No, P = c->P, H = c->H;
	size_t nd = (size_t)(N * D) * sizeof(float), nh = (size_t)(N * H) * sizeof(float);
	size_t np = (size_t)(N * P) * sizeof(float);
	float *g = c->fgrad; /* the LayerNorm and short filter gradients */
	layernorm_forward_f32(c->xn, NULL, NULL, c->xmid, c->ln_w, c->ln_b, N, D, 1e-5);
	gelu_forward_f32(c->gl, c->ha, N * H);
	bias_backward_f32(c->db, c->dres, N, D);
	memset(c->dgl, 0, nh);
	memset(c->da, 0, nh);
	gelu_backward_f32(c->da, c->dgl, c->ha, N * H);
	bias_backward_f32(c->db, c->da, N, H);
	memset(c->dxn, 0, nd);
	layernorm_backward_f32(c->dres, g, g + D, c->dxn, c->xmid, c->ln_w, c->mean, c->rstd, N, D);
	bias_backward_f32(c->db, c->dres, N, D);
	memset(c->dy, 0, nd);
	memset(c->dpc, 0, np);
	memset(c->dv, 0, nd);
	gate_back(c->dv, D, c->dy, c->pc, P, N, D);
	gate_back(c->dpc, P, c->dy, c->v + (No - 2) * N * D, D, N, D);
	for (int64_t o = No - 2; o >= 0; o--) {
		memset(c->dg, 0, nd);
		const float *src = o == 0 ? c->pc + No * D : c->v + (o - 1) * N * D;
		gate_back(c->dpc + (No - 1 - o) * D, P, c->dg, src, o == 0 ? P : D, N, D);
		if (o > 0) {
			memset(c->dv, 0, nd);
			gate_back(c->dv, D, c->dg, c->pc + (No - 1 - o) * D, P, N, D);
		} else {
			gate_back(c->dpc + No * D, P, c->dg, c->pc + (No - 1 - o) * D, P, N, D);
		}
	}
	memset(c->dp, 0, np);
	shortconv_backward_f32(c->dp, g + 2 * D, g + 2 * D + 3 * P, c->dpc, c->p, c->sf_w, B, T, P,
	                       HYENA_SHORT_FILTER);
	bias_backward_f32(c->db, c->dp, N, P);
	layernorm_forward_f32(c->xn, NULL, NULL, c->x, c->ln_w, c->ln_b, N, D, 1e-5);
	memset(c->dxn, 0, nd);
	layernorm_backward_f32(c->dres, g, g + D, c->dxn, c->x, c->ln_w, c->mean, c->rstd, N, D);
}

/* Run one part of a unit's work once, the kernels a Hyena unit runs, in its order. */
static void cal_run(void *impl, int part)
{
	struct cal *c = impl;
	int64_t B = c->B, T = c->T, N = c->N, D = c->D, No = c->No, P = c->P, Cf = c->Cf;
	int64_t H = c->H, F = c->F, E = c->E, V = c->V, S = c->S;
	float *fg = c->fgrad; /* filter gradients: W0, b0, freq, W1, b1, W2, b2, W3, bias */
	float *dW0 = fg, *db0 = dW0 + F * E, *dfr = db0 + F, *dW1 = dfr + F, *db1 = dW1 + F * F;
	float *dW2 = db1 + F, *db2 = dW2 + F * F, *dW3 = db2 + F, *dfb = dW3 + Cf * F;
	int64_t nv;
	switch ((enum cal_part)part) {
	case CAL_FWD_MM:
		matmul_forward_f32(c->p, c->xn, c->w_in, N, D, P, 0);
		matmul_forward_f32(c->xmid, c->y, c->w_out, N, D, D, 1);
		matmul_forward_f32(c->ha, c->xn, c->fc1, N, D, H, 0);
		matmul_forward_f32(c->dy, c->gl, c->fc2, N, H, D, 1);
		break;
	case CAL_FWD_ATTN:
		hyena_filter_forward_f32(c->h, c->fa, c->z, c->window, c->m0, c->m0b, c->freq, c->m1,
		                         c->m1b, c->m2, c->m2b, c->m3, T, E, F, Cf);
		fftconv_filter_spectrum_f32(c->Hf, c->h, Cf, T, Cf, c->fft, c->nthreads);
		for (int64_t o = 0; o < No - 1; o++)
			fftconv_forward_f32(c->v + o * N * D, c->g + o * N * D, c->Hf + o * D * S,
			                    c->fbias + o * D, B, T, D, c->fft, c->nthreads);
		break;
	case CAL_FWD_ELEM:
		cal_fwd_elem(c);
		break;
	case CAL_BWD_MM:
		matmul_backward_f32(c->dgl, c->dw, c->dres, c->gl, c->fc2, N, H, D);
		matmul_backward_f32(c->dxn, c->dw, c->da, c->xn, c->fc1, N, D, H);
		matmul_backward_f32(c->dy, c->dw, c->dres, c->y, c->w_out, N, D, D);
		matmul_backward_f32(c->dxn, c->dw, c->dp, c->xn, c->w_in, N, D, P);
		break;
	case CAL_BWD_ATTN:
		memset(c->dh, 0, (size_t)(T * Cf) * sizeof(float));
		for (int64_t o = No - 2; o >= 0; o--)
			fftconv_backward_f32(c->dg, c->dh + o * D, Cf, dfb + o * D, c->dv,
			                     c->g + o * N * D, c->Hf + o * D * S, c->fbias + o * D, B,
			                     T, D, c->fft, c->nthreads);
		hyena_filter_backward_f32(dW0, db0, dfr, dW1, db1, dW2, db2, dW3, c->dh, c->fa, c->z,
		                          c->window, c->freq, c->m1, c->m2, c->m3, T, E, F, Cf,
		                          c->filt);
		break;
	case CAL_BWD_ELEM:
		cal_bwd_elem(c);
		break;
	case CAL_HEAD:
		layernorm_forward_f32(c->xn, c->mean, c->rstd, c->x, c->ln_w, c->ln_b, N, D, 1e-5);
		cross_entropy_fused_f32(c->dxn, c->dwte, c->xn, c->wte, c->tok, N, D, V, -100, 1e-3,
		                        c->ce, c->chunk, &nv);
		break;
	case CAL_EMBED: {
		int64_t n = V * D;
		embedding_forward_f32(c->x, c->tok, c->wte, N, D);
		memcpy(c->tied, c->wte, (size_t)n * sizeof(float));
		float *dE = c->dw;
		const float *head = c->dwte;
#pragma omp parallel for simd schedule(static)
		for (int64_t i = 0; i < n; i++)
			dE[i] += head[i];
		embedding_backward_f32(dE, c->dres, c->tok, N, D);
		break;
	}
	default:
		break;
	}
}

static void cal_free(void *impl)
{
	struct cal *c = impl;
	free(c->all), free(c->tok);
	free(c);
}

/* One block, its filter, the head and the embedding at (B, T); each part's work is what
 * hyena_unit_work counts for it in fp32 (the embedding part runs both passes). */
static void hyena_calib_init(struct model_cost_calib *cal, const struct model_config *mc,
                             const struct model_cost_shape *s)
{
	check_shape(s);
	const struct hyena_config *hc = hyena_cfg(mc);
	struct cal *c = xcalloc(1, sizeof(*c));
	cal_alloc(c, hc, s->B, s->T);
	struct hyena_block_work w;
	block_work(hc, s->B, s->T, 1, &w); /* the kernels run the whole block's shapes */
	const struct model_cost_part parts[CAL_PARTS] = {
	    [CAL_FWD_MM] = {MODEL_PASS_FWD, MODEL_COST_MATMUL, w.fwd_mm},
	    [CAL_FWD_ATTN] = {MODEL_PASS_FWD, MODEL_COST_ATTN, w.fwd_attn},
	    [CAL_FWD_ELEM] = {MODEL_PASS_FWD, MODEL_COST_ELEM, w.fwd_elem},
	    [CAL_BWD_MM] = {MODEL_PASS_BWD, MODEL_COST_MATMUL, w.bwd_mm},
	    [CAL_BWD_ATTN] = {MODEL_PASS_BWD, MODEL_COST_ATTN, w.bwd_attn},
	    [CAL_BWD_ELEM] = {MODEL_PASS_BWD, MODEL_COST_ELEM, w.bwd_elem},
	    [CAL_HEAD] = {MODEL_PASS_COUNT, MODEL_COST_HEAD, w.head},
	    [CAL_EMBED] = {MODEL_PASS_COUNT, MODEL_COST_EMBED, w.embed_fwd + w.embed_bwd},
	};
	cal->n_parts = CAL_PARTS;
	memcpy(cal->part, parts, sizeof(parts));
	cal->busy_part = CAL_FWD_MM;
	cal->impl = c;
	cal->run = cal_run;
	cal->free = cal_free;
}

const struct model_cost_ops hyena_cost_ops = {
    .unit_work = hyena_unit_work,
    .activation_bytes = hyena_cost_activation_bytes,
    .flops_per_token = hyena_cost_flops,
    .unit_prog = hyena_cost_prog,
    .calib_init = hyena_calib_init,
    .unit_inner = hyena_cost_inner,
};
