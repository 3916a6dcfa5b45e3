/* infer/hyena_gen_impl.h: the body of infer/hyena_gen, written once over HG_REAL and included
 * twice by hyena_gen.c (the twin scheme of online_conv_impl.h). No include guard on purpose.
 *
 * Expects: HG_REAL, HG_S(name) (name##_f32|_f64: also the suffix of the model's kernels),
 * HG_FILTER (hyena_filter_compute|hyena_filter_compute_f64).
 */

typedef HG_REAL HG_S(hg_real);

struct HG_S(hgen) {
	struct hyena_config c;
	struct hgen_opts o;
	int64_t D, Pd, H, N, K, V, M; /* dim, in_proj width (N+1)D, MLP hidden, order, taps */
	const HG_S(hg_real) * wte, *lnf_w, *lnf_b;
	const HG_S(hg_real) * *w; /* (M, HYB_COUNT) tensor pointers */
	struct HG_S(oc_engine) * oc;
	int64_t pos;          /* next position */
	HG_S(hg_real) * ring; /* (M, K-1, B, Pd): in_proj rows of the last K-1 positions */
	/* one step's rows, (B, width) */
	HG_S(hg_real) * x, *u, *p, *pc, *g, *z, *hid, *logits;
	struct hgen_times tm;
	size_t bytes;
};

static void *HG_S(hg_alloc)(struct HG_S(hgen) * g, size_t n, size_t size)
{
	g->bytes += n * size;
	return xcalloc(n ? n : 1, size);
}

struct HG_S(hgen) * HG_S(hgen_create)(const struct hyena_config *c, const struct param_table *t,
                                      const HG_S(hg_real) * params, const struct hgen_opts *o)
{
	if (o->max_len < 1 || o->max_len > c->l_max) {
		LOG_ERROR("hyena generate: %lld positions do not fit the model's filters "
		          "(model.hyena_l_max, default training.seq_len: %lld)",
		          (long long)o->max_len, (long long)c->l_max);
		return NULL;
	}
	if (o->n_prompt < 0 || o->n_prompt > o->max_len || o->B < 1 || o->thr < 0) {
		LOG_ERROR("hyena generate: bad prompt length %lld, batch %lld or threshold %lld",
		          (long long)o->n_prompt, (long long)o->B, (long long)o->thr);
		return NULL;
	}
	struct HG_S(hgen) *g = xcalloc(1, sizeof(*g));
	g->c = *c, g->o = *o;
	const int64_t D = c->dim, N = c->order, M = c->n_layers, B = o->B, L = o->max_len;
	g->D = D, g->N = N, g->M = M, g->Pd = (N + 1) * D, g->H = c->ffn_hidden;
	g->K = HYENA_SHORT_FILTER, g->V = c->vocab_size;
	g->wte = params + t->p[0].offset;
	g->lnf_w = params + t->p[hyena_block_tensor_index(c, (int)M, 0)].offset;
	g->lnf_b = params + t->p[hyena_block_tensor_index(c, (int)M, 0) + 1].offset;
	g->w = HG_S(hg_alloc)(g, (size_t)(M * HYB_COUNT), sizeof(*g->w));
	for (int64_t l = 0; l < M; l++)
		for (int k = 0; k < HYB_COUNT; k++)
			g->w[l * HYB_COUNT + k] =
			    params + t->p[hyena_block_tensor_index(c, (int)l, k)].offset;
	/* filters: rho (M*(N-1), D, L) with the skip term folded into tap 0 */
	const int64_t Cf = (N - 1) * D;
	HG_S(hg_real) *h = xcalloc((size_t)(L * Cf), sizeof(HG_S(hg_real)));
	HG_S(hg_real) *scr =
	    xcalloc((size_t)hyena_filter_scratch_reals(c, L), sizeof(HG_S(hg_real)));
	HG_S(hg_real) *rho = xcalloc((size_t)(M * Cf * L), sizeof(HG_S(hg_real)));
	for (int64_t l = 0; l < M; l++) {
		const HG_S(hg_real) *bw = g->w[l * HYB_COUNT];
		HG_FILTER(c, bw, L, h, scr);
		const HG_S(hg_real) *fb = g->w[l * HYB_COUNT + HYB_FBIAS];
		for (int64_t j = 0; j < Cf; j++) { /* j = o*D + c: instance l*(N-1)+o, channel c */
			HG_S(hg_real) *r = rho + (l * Cf + j) * L;
			for (int64_t m = 0; m < L; m++)
				r[m] = h[m * Cf + j];
			r[0] += fb[j];
		}
	}
	struct oc_config oc = {.nconv = M * (N - 1),
	                       .B = B,
	                       .C = D,
	                       .L = L,
	                       .P = o->n_prompt,
	                       .mode = o->mode,
	                       .thr = o->thr,
	                       .fft_flags = o->fft_flags};
	g->oc = HG_S(oc_create)(&oc, rho);
	free(h), free(scr), free(rho);
	g->ring = HG_S(hg_alloc)(g, (size_t)(M * (g->K - 1) * B * g->Pd), sizeof(HG_S(hg_real)));
	int64_t wmax = g->Pd > g->H ? g->Pd : g->H;
	g->x = HG_S(hg_alloc)(g, (size_t)(B * D), sizeof(HG_S(hg_real)));
	g->u = HG_S(hg_alloc)(g, (size_t)(B * D), sizeof(HG_S(hg_real)));
	g->g = HG_S(hg_alloc)(g, (size_t)(B * D), sizeof(HG_S(hg_real)));
	g->z = HG_S(hg_alloc)(g, (size_t)(B * D), sizeof(HG_S(hg_real)));
	g->p = HG_S(hg_alloc)(g, (size_t)(B * wmax), sizeof(HG_S(hg_real)));
	g->pc = HG_S(hg_alloc)(g, (size_t)(B * g->Pd), sizeof(HG_S(hg_real)));
	g->hid = HG_S(hg_alloc)(g, (size_t)(B * g->H), sizeof(HG_S(hg_real)));
	g->logits = HG_S(hg_alloc)(g, (size_t)(B * g->V), sizeof(HG_S(hg_real)));
	return g;
}

void HG_S(hgen_free)(struct HG_S(hgen) * g)
{
	if (!g)
		return;
	HG_S(oc_free)(g->oc);
	free(g->w), free(g->ring), free(g->x), free(g->u), free(g->g), free(g->z), free(g->p);
	free(g->pc), free(g->hid), free(g->logits);
	free(g);
}

/* x(n, D) += fc2(gelu(fc1(LN2(x)))); u (n, D), a, gl (n, H) scratch */
static void HG_S(hg_mlp)(struct HG_S(hgen) * g, const HG_S(hg_real) *const *w, HG_S(hg_real) * x,
                         HG_S(hg_real) * u, HG_S(hg_real) * a, HG_S(hg_real) * gl, int64_t n)
{
	const int64_t D = g->D, H = g->H;
	HG_S(layernorm_forward)
	(u, NULL, NULL, x, w[HYB_NORM2_W], w[HYB_NORM2_B], n, D, g->c.norm_eps);
	HG_S(matmul_forward)(a, u, w[HYB_FC1_W], n, D, H, 0);
	HG_S(bias_forward)(a, w[HYB_FC1_B], n, H);
	HG_S(gelu_forward)(gl, a, n * H);
	HG_S(matmul_forward)(x, gl, w[HYB_FC2_W], n, H, D, 1);
	HG_S(bias_forward)(x, w[HYB_FC2_B], n, D);
}

/* y(n, D) = W_out (v .* x_0) + b_out added into x; vg (n, D) scratch, pc rows of width Pd */
static void HG_S(hg_out)(struct HG_S(hgen) * g, const HG_S(hg_real) *const *w, HG_S(hg_real) * x,
                         const HG_S(hg_real) * v, const HG_S(hg_real) * pc, HG_S(hg_real) * vg,
                         int64_t n)
{
	const int64_t D = g->D, Pd = g->Pd;
	for (int64_t i = 0; i < n; i++)
		for (int64_t c = 0; c < D; c++)
			vg[i * D + c] = v[i * D + c] * pc[i * Pd + c];
	HG_S(matmul_forward)(x, vg, w[HYB_OUT_W], n, D, D, 1);
	HG_S(bias_forward)(x, w[HYB_OUT_B], n, D);
}

const HG_S(hg_real) * HG_S(hgen_step)(struct HG_S(hgen) * g, const int32_t *tokens)
{
	const int64_t B = g->o.B, D = g->D, Pd = g->Pd, N = g->N, K = g->K, t = g->pos;
	CHECK(t < g->o.max_len && (t > 0 || g->o.n_prompt == 0) && t >= g->o.n_prompt,
	      "hyena generate: step at position %lld (prompt %lld, max %lld)", (long long)t,
	      (long long)g->o.n_prompt, (long long)g->o.max_len);
	double t0 = timer_now(), tmix = 0;
	HG_S(embedding_forward)(g->x, tokens, g->wte, B, D);
	for (int64_t l = 0; l < g->M; l++) {
		const HG_S(hg_real) *const *w = g->w + l * HYB_COUNT;
		HG_S(layernorm_forward)
		(g->u, NULL, NULL, g->x, w[HYB_NORM1_W], w[HYB_NORM1_B], B, D, g->c.norm_eps);
		HG_S(matmul_forward)(g->p, g->u, w[HYB_IN_W], B, D, Pd, 0);
		HG_S(bias_forward)(g->p, w[HYB_IN_B], B, Pd);
		/* short conv: taps j < K-1 read positions t-K+1+j from the ring (zero before 0) */
		HG_S(hg_real) *ring = g->ring + l * (K - 1) * B * Pd;
		const HG_S(hg_real) *sw = w[HYB_SF_W], *sb = w[HYB_SF_B];
		for (int64_t b = 0; b < B; b++)
			for (int64_t j = 0; j < Pd; j++) {
				HG_S(hg_real) s = sb[j];
				for (int64_t k = 0; k < K - 1; k++) {
					int64_t tp = t - (K - 1) + k;
					if (tp >= 0)
						s += sw[j * K + k] *
						     ring[((tp % (K - 1)) * B + b) * Pd + j];
				}
				g->pc[b * Pd + j] = s + sw[j * K + K - 1] * g->p[b * Pd + j];
			}
		for (int64_t b = 0; b < B; b++)
			memcpy(ring + ((t % (K - 1)) * B + b) * Pd, g->p + b * Pd,
			       (size_t)Pd * sizeof(HG_S(hg_real)));
		/* gating chain with the red cells: v = conv_o(v .* x_{N-1-o}) */
		for (int64_t b = 0; b < B; b++)
			memcpy(g->z + b * D, g->pc + b * Pd + N * D,
			       (size_t)D * sizeof(HG_S(hg_real)));
		for (int64_t o = 0; o < N - 1; o++) {
			for (int64_t b = 0; b < B; b++)
				for (int64_t c = 0; c < D; c++)
					g->g[b * D + c] =
					    g->z[b * D + c] * g->pc[b * Pd + (N - 1 - o) * D + c];
			double tm0 = timer_now();
			HG_S(oc_red)(g->oc, l * (N - 1) + o, g->g, g->z);
			tmix += timer_now() - tm0;
		}
		HG_S(hg_out)(g, w, g->x, g->z, g->pc, g->g, B);
		HG_S(hg_mlp)(g, w, g->x, g->u, g->p, g->hid, B);
	}
	HG_S(layernorm_forward)(g->u, NULL, NULL, g->x, g->lnf_w, g->lnf_b, B, D, g->c.norm_eps);
	HG_S(matmul_forward)(g->logits, g->u, g->wte, B, D, g->V, 0);
	/* phase B: every layer's and channel's tiles of this step, in parallel */
	double tb = timer_now();
	HG_S(oc_tiles)(g->oc);
	double t1 = timer_now();
	tmix += t1 - tb;
	g->pos++;
	g->tm.mixer_s += tmix;
	g->tm.total_s += t1 - t0;
	g->tm.max_step_s = t1 - t0 > g->tm.max_step_s ? t1 - t0 : g->tm.max_step_s;
	g->tm.steps++;
	return g->logits;
}

const HG_S(hg_real) *
    HG_S(hgen_prompt)(struct HG_S(hgen) * g, const int32_t *tokens, HG_S(hg_real) * all_logits)
{
	const int64_t B = g->o.B, P = g->o.n_prompt, D = g->D, Pd = g->Pd, N = g->N, K = g->K;
	const int64_t n = B * P, V = g->V;
	CHECK(P > 0 && g->pos == 0, "hyena generate: prompt of %lld at position %lld", (long long)P,
	      (long long)g->pos);
	const size_t sz = sizeof(HG_S(hg_real));
	HG_S(hg_real) *x = xcalloc((size_t)(n * D), sz), *u = xcalloc((size_t)(n * D), sz);
	HG_S(hg_real) *p = xcalloc((size_t)(n * (Pd > g->H ? Pd : g->H)), sz);
	HG_S(hg_real) *pc = xcalloc((size_t)(n * Pd), sz), *hid = xcalloc((size_t)(n * g->H), sz);
	HG_S(hg_real) *v = xcalloc((size_t)(n * D), sz), *gt = xcalloc((size_t)(n * D), sz);
	HG_S(embedding_forward)(x, tokens, g->wte, n, D);
	for (int64_t l = 0; l < g->M; l++) {
		const HG_S(hg_real) *const *w = g->w + l * HYB_COUNT;
		HG_S(layernorm_forward)
		(u, NULL, NULL, x, w[HYB_NORM1_W], w[HYB_NORM1_B], n, D, g->c.norm_eps);
		HG_S(matmul_forward)(p, u, w[HYB_IN_W], n, D, Pd, 0);
		HG_S(bias_forward)(p, w[HYB_IN_B], n, Pd);
		HG_S(shortconv_forward)(pc, p, w[HYB_SF_W], w[HYB_SF_B], B, P, Pd, K);
		HG_S(hg_real) *ring = g->ring + l * (K - 1) * B * Pd;
		for (int64_t b = 0; b < B; b++)
			for (int64_t tp = P - (K - 1) > 0 ? P - (K - 1) : 0; tp < P; tp++)
				memcpy(ring + ((tp % (K - 1)) * B + b) * Pd, p + (b * P + tp) * Pd,
				       (size_t)Pd * sz);
		for (int64_t i = 0; i < n; i++)
			memcpy(v + i * D, pc + i * Pd + N * D, (size_t)D * sz);
		for (int64_t o = 0; o < N - 1; o++) {
			for (int64_t i = 0; i < n; i++)
				for (int64_t c = 0; c < D; c++)
					gt[i * D + c] =
					    v[i * D + c] * pc[i * Pd + (N - 1 - o) * D + c];
			HG_S(oc_prompt)(g->oc, l * (N - 1) + o, gt, v);
		}
		HG_S(hg_out)(g, w, x, v, pc, gt, n);
		HG_S(hg_mlp)(g, w, x, u, p, hid, n);
	}
	/* head: every position, or the last one of each row */
	for (int64_t b = 0; b < B; b++)
		memcpy(g->x + b * D, x + (b * P + P - 1) * D, (size_t)D * sz);
	if (all_logits) {
		HG_S(layernorm_forward)(u, NULL, NULL, x, g->lnf_w, g->lnf_b, n, D, g->c.norm_eps);
		HG_S(matmul_forward)(all_logits, u, g->wte, n, D, V, 0);
		for (int64_t b = 0; b < B; b++)
			memcpy(g->logits + b * V, all_logits + (b * P + P - 1) * V, (size_t)V * sz);
	} else {
		HG_S(layernorm_forward)
		(g->u, NULL, NULL, g->x, g->lnf_w, g->lnf_b, B, D, g->c.norm_eps);
		HG_S(matmul_forward)(g->logits, g->u, g->wte, B, D, V, 0);
	}
	free(x), free(u), free(p), free(pc), free(hid), free(v), free(gt);
	g->pos = P;
	return g->logits;
}

int64_t HG_S(hgen_position)(const struct HG_S(hgen) * g)
{
	return g->pos;
}

void HG_S(hgen_seek)(struct HG_S(hgen) * g, int64_t pos)
{
	CHECK(pos >= g->o.n_prompt && pos <= g->o.max_len, "hyena generate: seek to %lld",
	      (long long)pos);
	HG_S(oc_seek)(g->oc, pos - g->o.n_prompt);
	g->pos = pos;
}

void HG_S(hgen_times)(const struct HG_S(hgen) * g, struct hgen_times *out)
{
	*out = g->tm;
}

size_t HG_S(hgen_bytes)(const struct HG_S(hgen) * g)
{
	return g->bytes + HG_S(oc_bytes)(g->oc);
}
