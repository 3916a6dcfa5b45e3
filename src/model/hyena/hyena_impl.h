/* model/hyena_impl.h: the compute of model/hyena, written once over HREAL and included twice
 * by hyena.c (float: HK = _f32 kernels; double: HK = _f64 kernels). Not a public header.
 *
 * Needs: HREAL, HK(name) (kernel of that precision), HT(name) (this instance's function
 * name), HUW(m) / HUDW(m) (the unit parameter / gradient pointer arrays of that precision).
 * Reads top to bottom like the model: embedding, block forward, head, then backward in
 * reverse. */

static HREAL *HT(act)(const struct hyena_model *m, int64_t off)
{
	return (HREAL *)m->acts + off;
}

static HREAL *HT(scr)(const struct hyena_model *m, int64_t off)
{
	return (HREAL *)m->scratch + off;
}

/* Tensor i of the table inside its unit's current buffer. */
static HREAL *HT(tensor)(const struct hyena_model *m, HREAL *const *unit_base, int i)
{
	const struct param_entry *p = &m->table.p[i];
	return unit_base[p->unit] + (p->offset - m->table.unit_begin[p->unit]);
}

static void HT(block_ptrs)(const struct hyena_model *m, HREAL *const *unit_base, int l,
                           HREAL *w[HYB_COUNT])
{
	for (int k = 0; k < HYB_COUNT; k++)
		w[k] = HT(tensor)(m, unit_base, hyena_block_tensor_index(&m->cfg, l, k));
}

/* The filter of one block from its parameter pointers: h (L, (N-1)D); fa (6,L,F). */
static void HT(filter_forward)(const struct hyena_config *c, int64_t Dl,
                               HREAL *const w[HYB_COUNT], const HREAL *z, const HREAL *window,
                               int64_t L, HREAL *h, HREAL *fa)
{
	int64_t Cf = (c->order - 1) * Dl;
	HK(hyena_filter_forward)
	(h, fa, z, window, w[HYB_MLP0_W], w[HYB_MLP0_B], w[HYB_FREQ], w[HYB_MLP1_W], w[HYB_MLP1_B],
	 w[HYB_MLP2_W], w[HYB_MLP2_B], w[HYB_MLP3_W], L, c->emb_dim, c->filter_order, Cf);
}

/* ---------------------------------------------------------------- forward */

static HREAL *HT(block_input)(const struct hyena_model *m, int l)
{
	return l < m->cfg.n_layers ? HT(act)(m, m->blk[l].x) : HT(act)(m, m->x_final);
}

/* The embedding as the tied head reads it: unit 0's binding on one rank, the copy the
 * embedding's forward keeps under FSDP, or where set_tied points (pipeline parallelism). */
static const HREAL *HT(head_E)(const struct hyena_model *m)
{
	if (m->tied_src)
		return (const HREAL *)m->tied_src;
	return m->own_params ? HUW(m)[0] : HT(act)(m, m->tied_w);
}

static void HT(embed_forward)(struct hyena_model *m)
{
	int64_t V = m->cfg.vocab_size, D = m->cfg.dim;
	HREAL *E = HUW(m)[0];
	HK(embedding_forward)(HT(block_input)(m, 0), m->tokens, E, m->N, D);
	if (!m->own_params) /* the head needs it after unit 0's parameters are freed */
		memcpy(HT(act)(m, m->tied_w), E, (size_t)(V * D) * sizeof(HREAL));
}

/* out[n, c] = a[n*lda + c] * b[n*ldb + c] for c < D */
static void HT(mul_cols)(HREAL *out, const HREAL *a, int64_t lda, const HREAL *b, int64_t ldb,
                         int64_t Nt, int64_t D)
{
#pragma omp parallel for schedule(static)
	for (int64_t n = 0; n < Nt; n++)
		for (int64_t c = 0; c < D; c++)
			out[n * D + c] = a[n * lda + c] * b[n * ldb + c];
}

/* The block forward in its parts (block_forward runs them all; the recompute pass re-runs
 * some, hyena_build_opts says which per checkpointing mode). */
struct HT(blk) {
	HREAL *w[HYB_COUNT];
	HREAL *x, *xn, *p, *pc, *g, *v, *y, *xmid, *ha, *Hf, *h, *fft, *gl, *part;
	int64_t B, T, Nt, D, Dl, No, P, Cf, H, S; /* Dl channels, H MLP width on this rank */
};

static void HT(blk_init)(struct hyena_model *m, int l, struct HT(blk) *k)
{
	const struct hyena_config *c = &m->cfg;
	const struct hyena_block_acts *a = &m->blk[l];
	HT(block_ptrs)(m, HUW(m), l, k->w);
	k->B = m->B, k->T = m->T, k->Nt = m->N, k->D = c->dim, k->Dl = m->Dl, k->No = c->order;
	k->P = (k->No + 1) * k->Dl, k->Cf = (k->No - 1) * k->Dl, k->H = m->Hl;
	k->S = fftconv_spectrum_stride(k->T);
	k->x = HT(act)(m, a->x), k->xn = HT(scr)(m, m->s_xn), k->p = HT(act)(m, a->p);
	k->pc = HT(act)(m, a->pc), k->g = HT(act)(m, a->g), k->v = HT(act)(m, a->v);
	k->y = HT(act)(m, a->y), k->xmid = HT(act)(m, a->xmid), k->ha = HT(act)(m, a->a);
	k->Hf = HT(act)(m, a->Hf), k->h = HT(scr)(m, m->s_h), k->fft = HT(scr)(m, m->s_fft);
	k->gl = HT(scr)(m, m->s_gl), k->part = HT(scr)(m, m->s_part);
}

/* Tensor parallelism: buf(n) = its sum over the tp group (float models only). */
static void HT(tp_sum)(const struct hyena_model *m, HREAL *buf, int64_t n)
{
	CHECK(sizeof(HREAL) == sizeof(float), "hyena: tensor parallelism runs float models");
	m->tp->all_reduce_sum_f32(m->tp->ctx, (float *)(void *)buf, n);
}

/* out = res + the tp group's sum of the row-parallel partial products part (Nt, D) */
static void HT(tp_residual)(const struct hyena_model *m, HREAL *out, const HREAL *res, HREAL *part,
                            int64_t n)
{
	HT(tp_sum)(m, part, n);
#pragma omp parallel for simd schedule(static)
	for (int64_t i = 0; i < n; i++)
		out[i] = res[i] + part[i];
}

/* the implicit filters of the block, and their spectra */
static void HT(blk_filters)(struct hyena_model *m, int l, struct HT(blk) *k)
{
	HT(filter_forward)(&m->cfg, k->Dl, k->w, HT(act)(m, m->z), HT(act)(m, m->window), k->T,
	                   k->h, HT(act)(m, m->blk[l].fa));
	HK(fftconv_filter_spectrum)(k->Hf, k->h, k->Cf, k->T, k->Cf, k->fft, m->nthreads);
}

/* p = in_proj(LN1(x)) */
static void HT(blk_in)(struct hyena_model *m, int l, struct HT(blk) *k)
{
	const struct hyena_block_acts *a = &m->blk[l];
	HK(layernorm_forward)
	(k->xn, HT(act)(m, a->mean1), HT(act)(m, a->rstd1), k->x, k->w[HYB_NORM1_W],
	 k->w[HYB_NORM1_B], k->Nt, k->D, m->cfg.norm_eps);
	HK(matmul_forward)(k->p, k->xn, k->w[HYB_IN_W], k->Nt, k->D, k->P, 0);
	HK(bias_forward)(k->p, k->w[HYB_IN_B], k->Nt, k->P);
}

/* short convolution, then the gated long convolutions: pc, g, v, y from p */
static void HT(blk_mix)(struct hyena_model *m, struct HT(blk) *k)
{
	int64_t Nt = k->Nt, D = k->Dl, No = k->No, P = k->P; /* D: the channels here */
	HK(shortconv_forward)
	(k->pc, k->p, k->w[HYB_SF_W], k->w[HYB_SF_B], k->B, k->T, P, HYENA_SHORT_FILTER);
	for (int64_t o = 0; o < No - 1; o++) {
		/* g_o = v .* x_{N-1-o}, v_{o+1} = h_o * g_o + bias_o .* g_o */
		const HREAL *src = o == 0 ? k->pc + No * D : k->v + (o - 1) * Nt * D;
		int64_t lds = o == 0 ? P : D;
		HREAL *go = k->g + o * Nt * D;
		HT(mul_cols)(go, src, lds, k->pc + (No - 1 - o) * D, P, Nt, D);
		HK(fftconv_forward)
		(k->v + o * Nt * D, go, k->Hf + o * D * k->S, k->w[HYB_FBIAS] + o * D, k->B, k->T, D,
		 k->fft, m->nthreads);
	}
	HT(mul_cols)(k->y, k->v + (No - 2) * Nt * D, D, k->pc, P, Nt, D);
}

/* xmid = x + out_proj(y), then a = fc1(LN2(xmid)) */
static void HT(blk_mid)(struct hyena_model *m, int l, struct HT(blk) *k)
{
	const struct hyena_block_acts *a = &m->blk[l];
	if (!m->tp) {
		memcpy(k->xmid, k->x, (size_t)(k->Nt * k->D) * sizeof(HREAL));
		HK(matmul_forward)(k->xmid, k->y, k->w[HYB_OUT_W], k->Nt, k->D, k->D, 1);
	} else { /* row-parallel: this rank's channels' share, summed over the group */
		HK(matmul_forward)(k->part, k->y, k->w[HYB_OUT_W], k->Nt, k->Dl, k->D, 0);
		HT(tp_residual)(m, k->xmid, k->x, k->part, k->Nt * k->D);
	}
	HK(bias_forward)(k->xmid, k->w[HYB_OUT_B], k->Nt, k->D);
	HK(layernorm_forward)
	(k->xn, HT(act)(m, a->mean2), HT(act)(m, a->rstd2), k->xmid, k->w[HYB_NORM2_W],
	 k->w[HYB_NORM2_B], k->Nt, k->D, m->cfg.norm_eps);
	HK(matmul_forward)(k->ha, k->xn, k->w[HYB_FC1_W], k->Nt, k->D, k->H, 0);
	HK(bias_forward)(k->ha, k->w[HYB_FC1_B], k->Nt, k->H);
}

static void HT(block_forward)(struct hyena_model *m, int l)
{
	struct HT(blk) k;
	HT(blk_init)(m, l, &k);
	HREAL *out = HT(block_input)(m, l + 1);
	HT(blk_filters)(m, l, &k);
	HT(blk_in)(m, l, &k);
	HT(blk_mix)(m, &k);
	HT(blk_mid)(m, l, &k);
	/* MLP output: out = xmid + fc2(gelu(a)) */
	HK(gelu_forward)(k.gl, k.ha, k.Nt * k.H);
	if (!m->tp) {
		memcpy(out, k.xmid, (size_t)(k.Nt * k.D) * sizeof(HREAL));
		HK(matmul_forward)(out, k.gl, k.w[HYB_FC2_W], k.Nt, k.H, k.D, 1);
	} else { /* row-parallel, as out_proj */
		HK(matmul_forward)(k.part, k.gl, k.w[HYB_FC2_W], k.Nt, k.H, k.D, 0);
		HT(tp_residual)(m, out, k.xmid, k.part, k.Nt * k.D);
	}
	HK(bias_forward)(out, k.w[HYB_FC2_B], k.Nt, k.D);
}

/* The recompute pass of block l (selective or full): what its forward dropped, again, by the
 * same kernels on the same inputs (bitwise the forward's values). The block's output is not
 * written: the next block's input is saved. */
static void HT(block_recompute)(struct hyena_model *m, int l)
{
	enum model_ac b = model_ac_block(m->ac, m->ac_every, l);
	struct HT(blk) k;
	HT(blk_init)(m, l, &k);
	HT(blk_filters)(m, l, &k);
	if (b == MODEL_AC_FULL)
		HT(blk_in)(m, l, &k);
	HT(blk_mix)(m, &k);
	if (b == MODEL_AC_FULL)
		HT(blk_mid)(m, l, &k);
}

/* Final LayerNorm + tied head + fused cross-entropy (loss gradient too when loss_dscale > 0:
 * into s_dxn and the head's embedding gradient tied_dw). */
static double HT(head_forward)(struct hyena_model *m, int64_t *n_valid)
{
	const struct hyena_config *c = &m->cfg;
	int L = (int)c->n_layers;
	int64_t Nt = m->N, D = c->dim, V = c->vocab_size;
	bool grads = m->loss_dscale > 0.0;
	HREAL *xn = HT(act)(m, m->xn_final), *dxn = HT(scr)(m, m->s_dxn);
	HREAL *dE = HT(act)(m, m->tied_dw);
	const HREAL *E = HT(head_E)(m);
	int base = hyena_block_tensor_index(&m->cfg, L, 0);
	HK(layernorm_forward)
	(xn, HT(act)(m, m->mean_f), HT(act)(m, m->rstd_f), HT(act)(m, m->x_final),
	 HT(tensor)(m, HUW(m), base), HT(tensor)(m, HUW(m), base + 1), Nt, D, c->norm_eps);
	if (grads) {
		memset(dxn, 0, (size_t)(Nt * D) * sizeof(HREAL));
		memset(dE, 0, (size_t)(V * D) * sizeof(HREAL));
	}
	double loss = HK(cross_entropy_fused)(
	    grads ? dxn : NULL, grads ? dE : NULL, xn, E, m->targets, Nt, D, V, HYENA_IGNORE_INDEX,
	    m->loss_dscale, HT(scr)(m, m->s_ce), m->ce_rows, n_valid);
	m->head_grads_ready = grads;
	return loss;
}

static double HT(unit_forward)(struct hyena_model *m, int u, int64_t *n_valid)
{
	int L = (int)m->cfg.n_layers;
	if (n_valid)
		*n_valid = 0;
	if (u == 0)
		HT(embed_forward)(m);
	else if (u <= L)
		HT(block_forward)(m, u - 1);
	else
		return HT(head_forward)(m, n_valid);
	return 0.0;
}

static void HT(logits)(struct hyena_model *m, HREAL *logits)
{
	int L = (int)m->cfg.n_layers;
	for (int u = 0; u <= L; u++)
		HT(unit_forward)(m, u, NULL);
	int base = hyena_block_tensor_index(&m->cfg, L, 0);
	const HREAL *E = HT(head_E)(m);
	HK(layernorm_forward)
	(HT(act)(m, m->xn_final), HT(act)(m, m->mean_f), HT(act)(m, m->rstd_f),
	 HT(act)(m, m->x_final), HT(tensor)(m, HUW(m), base), HT(tensor)(m, HUW(m), base + 1), m->N,
	 m->cfg.dim, m->cfg.norm_eps);
	HK(matmul_forward)
	(logits, HT(act)(m, m->xn_final), E, m->N, m->cfg.dim, m->cfg.vocab_size, 0);
}

/* ---------------------------------------------------------------- backward */

/* d(a .* b) with b strided: da[n*lda + c] += dout * b (a's gradient may be strided) */
static void HT(mul_cols_back)(HREAL *da, int64_t lda, const HREAL *dout, const HREAL *b,
                              int64_t ldb, int64_t Nt, int64_t D)
{
#pragma omp parallel for schedule(static)
	for (int64_t n = 0; n < Nt; n++)
		for (int64_t c = 0; c < D; c++)
			da[n * lda + c] += dout[n * D + c] * b[n * ldb + c];
}

/* Mirrors block_forward bottom-up. On entry s_dres = dL/d(out); on exit dL/d(x). */
static void HT(block_backward)(struct hyena_model *m, int l)
{
	const struct hyena_config *c = &m->cfg;
	const struct hyena_block_acts *a = &m->blk[l];
	HREAL *w[HYB_COUNT], *dw[HYB_COUNT];
	HT(block_ptrs)(m, HUW(m), l, w);
	HT(block_ptrs)(m, HUDW(m), l, dw);
	int64_t B = m->B, T = m->T, Nt = m->N, D = c->dim, No = c->order, Dl = m->Dl;
	int64_t P = (No + 1) * Dl, Cf = (No - 1) * Dl, H = m->Hl, S = fftconv_spectrum_stride(T);
	int64_t F = c->filter_order, E = c->emb_dim;
	HREAL *x = HT(act)(m, a->x), *p = HT(act)(m, a->p), *pc = HT(act)(m, a->pc);
	HREAL *g = HT(act)(m, a->g), *v = HT(act)(m, a->v), *y = HT(act)(m, a->y);
	HREAL *xmid = HT(act)(m, a->xmid), *ha = HT(act)(m, a->a), *Hf = HT(act)(m, a->Hf);
	HREAL *dres = HT(scr)(m, m->s_dres), *xn = HT(scr)(m, m->s_xn), *dxn = HT(scr)(m, m->s_dxn);
	HREAL *gl = HT(scr)(m, m->s_gl), *dgl = HT(scr)(m, m->s_dgl), *da = HT(scr)(m, m->s_da);
	HREAL *dy = HT(scr)(m, m->s_dy), *dv = HT(scr)(m, m->s_dv), *dg = HT(scr)(m, m->s_dg);
	HREAL *dpc = HT(scr)(m, m->s_dpc), *dp = HT(scr)(m, m->s_dp), *dh = HT(scr)(m, m->s_dh);
	HREAL *fft = HT(scr)(m, m->s_fft);
	size_t nd = (size_t)(Nt * D) * sizeof(HREAL), nh = (size_t)(Nt * H) * sizeof(HREAL);
	size_t np = (size_t)(Nt * P) * sizeof(HREAL), ndl = (size_t)(Nt * Dl) * sizeof(HREAL);

	/* MLP: out = xmid + fc2(gelu(a)), a = fc1(LN2(xmid)) */
	HK(layernorm_forward)
	(xn, NULL, NULL, xmid, w[HYB_NORM2_W], w[HYB_NORM2_B], Nt, D, c->norm_eps);
	if (model_ac_block(m->ac, m->ac_every, l) == MODEL_AC_FFN) { /* fc1's output again */
		HK(matmul_forward)(ha, xn, w[HYB_FC1_W], Nt, D, H, 0);
		HK(bias_forward)(ha, w[HYB_FC1_B], Nt, H);
	}
	HK(gelu_forward)(gl, ha, Nt * H);
	HK(bias_backward)(dw[HYB_FC2_B], dres, Nt, D);
	memset(dgl, 0, nh);
	HK(matmul_backward)(dgl, dw[HYB_FC2_W], dres, gl, w[HYB_FC2_W], Nt, H, D);
	memset(da, 0, nh);
	HK(gelu_backward)(da, dgl, ha, Nt * H);
	HK(bias_backward)(dw[HYB_FC1_B], da, Nt, H);
	memset(dxn, 0, nd);
	HK(matmul_backward)(dxn, dw[HYB_FC1_W], da, xn, w[HYB_FC1_W], Nt, D, H);
	if (m->tp) /* column-parallel fc1: each rank's columns' share of d(LN2 output) */
		HT(tp_sum)(m, dxn, Nt * D);
	HK(layernorm_backward)
	(dres, dw[HYB_NORM2_W], dw[HYB_NORM2_B], dxn, xmid, w[HYB_NORM2_W], HT(act)(m, a->mean2),
	 HT(act)(m, a->rstd2), Nt, D);

	/* mixer: xmid = x + W_out y + b_out, y = v_{N-1} .* x_0 */
	HK(bias_backward)(dw[HYB_OUT_B], dres, Nt, D);
	memset(dy, 0, ndl);
	HK(matmul_backward)(dy, dw[HYB_OUT_W], dres, y, w[HYB_OUT_W], Nt, Dl, D);
	/* the mixer, channel by channel: this rank's Dl channels of every stream */
	memset(dpc, 0, np);
	memset(dv, 0, ndl);
	HT(mul_cols_back)(dv, Dl, dy, pc, P, Nt, Dl);                        /* d v_{N-1} */
	HT(mul_cols_back)(dpc, P, dy, v + (No - 2) * Nt * Dl, Dl, Nt, Dl); /* d x_0 */
	memset(dh, 0, (size_t)(T * Cf) * sizeof(HREAL));
	for (int64_t o = No - 2; o >= 0; o--) {
		/* v_{o+1} = conv_o(g_o), g_o = src .* x_{N-1-o} */
		HREAL *go = g + o * Nt * Dl;
		memset(dg, 0, ndl);
		HK(fftconv_backward)
		(dg, dh + o * Dl, Cf, dw[HYB_FBIAS] + o * Dl, dv, go, Hf + o * Dl * S,
		 w[HYB_FBIAS] + o * Dl, B, T, Dl, fft, m->nthreads);
		const HREAL *src = o == 0 ? pc + No * Dl : v + (o - 1) * Nt * Dl;
		int64_t lds = o == 0 ? P : Dl;
		HT(mul_cols_back)(dpc + (No - 1 - o) * Dl, P, dg, src, lds, Nt, Dl);
		if (o > 0) {
			memset(dv, 0, ndl);
			HT(mul_cols_back)(dv, Dl, dg, pc + (No - 1 - o) * Dl, P, Nt, Dl);
		} else {
			HT(mul_cols_back)(dpc + No * Dl, P, dg, pc + (No - 1 - o) * Dl, P, Nt, Dl);
		}
	}
	/* the filters: once per backward, from the gradient summed over the batch. Under
	 * tensor parallelism the MLP's layers before the last are replicated and see only this
	 * rank's channels: their gradients of this backward are summed over the group first */
	HREAL *frep[7] = {dw[HYB_MLP0_W], dw[HYB_MLP0_B], dw[HYB_FREQ], dw[HYB_MLP1_W],
	                  dw[HYB_MLP1_B], dw[HYB_MLP2_W], dw[HYB_MLP2_B]};
	int64_t nrep = dw[HYB_MLP3_W] - dw[HYB_MLP0_W];
	if (m->tp) {
		HREAL *r = HT(scr)(m, m->s_frep);
		memset(r, 0, (size_t)nrep * sizeof(HREAL));
		for (int i = 6; i >= 0; i--)
			frep[i] = r + (frep[i] - dw[HYB_MLP0_W]);
	}
	HK(hyena_filter_backward)
	(frep[0], frep[1], frep[2], frep[3], frep[4], frep[5], frep[6], dw[HYB_MLP3_W], dh,
	 HT(act)(m, a->fa), HT(act)(m, m->z), HT(act)(m, m->window), w[HYB_FREQ], w[HYB_MLP1_W],
	 w[HYB_MLP2_W], w[HYB_MLP3_W], T, E, F, Cf, HT(scr)(m, m->s_filt));
	if (m->tp) {
		HT(tp_sum)(m, frep[0], nrep);
		HREAL *d = dw[HYB_MLP0_W];
#pragma omp parallel for simd schedule(static)
		for (int64_t i = 0; i < nrep; i++)
			d[i] += frep[0][i];
	}
	memset(dp, 0, np);
	HK(shortconv_backward)
	(dp, dw[HYB_SF_W], dw[HYB_SF_B], dpc, p, w[HYB_SF_W], B, T, P, HYENA_SHORT_FILTER);
	HK(bias_backward)(dw[HYB_IN_B], dp, Nt, P);
	HK(layernorm_forward)
	(xn, NULL, NULL, x, w[HYB_NORM1_W], w[HYB_NORM1_B], Nt, D, c->norm_eps);
	memset(dxn, 0, nd);
	HK(matmul_backward)(dxn, dw[HYB_IN_W], dp, xn, w[HYB_IN_W], Nt, D, P);
	if (m->tp) /* column-parallel in_proj: each rank's streams' share of d(LN1 output) */
		HT(tp_sum)(m, dxn, Nt * D);
	HK(layernorm_backward)
	(dres, dw[HYB_NORM1_W], dw[HYB_NORM1_B], dxn, x, w[HYB_NORM1_W], HT(act)(m, a->mean1),
	 HT(act)(m, a->rstd1), Nt, D);
}

static void HT(head_backward)(struct hyena_model *m, double dscale)
{
	const struct hyena_config *c = &m->cfg;
	int L = (int)c->n_layers;
	int64_t Nt = m->N, D = c->dim, V = c->vocab_size;
	HREAL *xn = HT(act)(m, m->xn_final), *dxn = HT(scr)(m, m->s_dxn);
	HREAL *dE = HT(act)(m, m->tied_dw), *dres = HT(scr)(m, m->s_dres);
	const HREAL *E = HT(head_E)(m);
	int base = hyena_block_tensor_index(&m->cfg, L, 0);
	if (!m->head_grads_ready || m->loss_dscale != dscale) {
		CHECK(!m->head_grads_ready, "loss gradient made with scale %g, asked for %g",
		      m->loss_dscale, dscale);
		memset(dxn, 0, (size_t)(Nt * D) * sizeof(HREAL));
		memset(dE, 0, (size_t)(V * D) * sizeof(HREAL));
		HK(cross_entropy_fused)
		(dxn, dE, xn, E, m->targets, Nt, D, V, HYENA_IGNORE_INDEX, dscale,
		 HT(scr)(m, m->s_ce), m->ce_rows, NULL);
	}
	m->head_grads_ready = false;
	memset(dres, 0, (size_t)(Nt * D) * sizeof(HREAL));
	HK(layernorm_backward)
	(dres, HT(tensor)(m, HUDW(m), base), HT(tensor)(m, HUDW(m), base + 1), dxn,
	 HT(act)(m, m->x_final), HT(tensor)(m, HUW(m), base), HT(act)(m, m->mean_f),
	 HT(act)(m, m->rstd_f), Nt, D);
}

/* Unit 0: the head's share of the tied embedding gradient, then the lookup's scatter. */
static void HT(embed_backward)(struct hyena_model *m)
{
	int64_t n = m->cfg.vocab_size * m->cfg.dim;
	HREAL *dE = HUDW(m)[0];
	const HREAL *head = HT(act)(m, m->tied_dw);
#pragma omp parallel for simd schedule(static)
	for (int64_t i = 0; i < n; i++)
		dE[i] += head[i];
	HK(embedding_backward)(dE, HT(scr)(m, m->s_dres), m->tokens, m->N, m->cfg.dim);
}

static void HT(unit_recompute)(struct hyena_model *m, int u)
{
	if (u >= 1 && u <= m->cfg.n_layers)
		HT(block_recompute)(m, u - 1);
}

static void HT(unit_backward)(struct hyena_model *m, int u, double dscale)
{
	int L = (int)m->cfg.n_layers;
	if (u == L + 1)
		HT(head_backward)(m, dscale);
	else if (u >= 1)
		HT(block_backward)(m, u - 1);
	else
		HT(embed_backward)(m);
}
