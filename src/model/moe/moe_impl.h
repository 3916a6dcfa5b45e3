/* model/moe_impl.h: the compute of model/moe, written once over MREAL and included twice by
 * moe.c (float: MK = _f32 kernels; double: MK = _f64 kernels). Not a public header.
 *
 * Needs: MREAL, MK(name) (kernel of that precision), MT(name) (this instance's function
 * name), MUW(m) / MUDW(m) (the unit parameter / gradient pointer arrays of that precision).
 * Reads top to bottom like the model: embedding, attention, the FFNs (dense, router,
 * experts), the head; then backward in reverse. */

static MREAL *MT(act)(const struct moe_model *m, int64_t off)
{
	return (MREAL *)m->acts + off;
}

static MREAL *MT(scr)(const struct moe_model *m, int64_t off)
{
	return (MREAL *)m->scratch + off;
}

/* Tensor k of block l inside its unit's current buffer (NULL: the block has none). */
static MREAL *MT(bt)(const struct moe_model *m, MREAL *const *unit_base, int l, int k)
{
	int i = moe_tensor_index(&m->cfg, l, k);
	if (i < 0)
		return NULL;
	const struct param_entry *p = &m->table.p[i];
	return unit_base[p->unit] + (p->offset - m->table.unit_begin[p->unit]);
}

static MREAL *MT(block_input)(const struct moe_model *m, int l)
{
	return l < m->cfg.n_layers ? MT(act)(m, m->blk[l].x) : MT(act)(m, m->x_final);
}

/* ---------------------------------------------------------------- forward */

static void MT(embed_forward)(struct moe_model *m)
{
	MK(embedding_forward)(MT(block_input)(m, 0), m->tokens, MUW(m)[0], m->N, m->cfg.dim);
}

/* xmid = x + wo(attn(rope(wq xn1), rope(wk xn1), wv xn1)), xn1 = rmsnorm(x) */
static void MT(attn_forward)(struct moe_model *m, int l)
{
	const struct moe_config *c = &m->cfg;
	const struct moe_block_acts *a = &m->blk[l];
	int64_t N = m->N, C = c->dim, H = c->n_heads, KV = c->n_kv_heads, D = c->head_dim;
	MREAL *x = MT(act)(m, a->x), *xn = MT(act)(m, a->xn1), *q = MT(act)(m, a->q);
	MREAL *k = MT(act)(m, a->k), *v = MT(act)(m, a->v), *att = MT(act)(m, a->att);
	MREAL *xmid = MT(act)(m, a->xmid);
	MREAL *cs = MT(act)(m, m->rope_cos), *sn = MT(act)(m, m->rope_sin);
	MK(rmsnorm_forward)(xn, MT(act)(m, a->rstd1), x, MT(bt)(m, MUW(m), l, MB_ATTN_NORM), N, C,
	                    c->norm_eps);
	MK(matmul_forward)(q, xn, MT(bt)(m, MUW(m), l, MB_WQ), N, C, H * D, 0);
	MK(matmul_forward)(k, xn, MT(bt)(m, MUW(m), l, MB_WK), N, C, KV * D, 0);
	MK(matmul_forward)(v, xn, MT(bt)(m, MUW(m), l, MB_WV), N, C, KV * D, 0);
	MK(rope_forward)(q, cs, sn, m->B, m->T, H, D);
	MK(rope_forward)(k, cs, sn, m->B, m->T, KV, D);
	MK(attention_forward)(att, MT(act)(m, a->lse), q, k, v, m->B, m->T, H, KV, D);
	memcpy(xmid, x, (size_t)(N * C) * sizeof(MREAL));
	MK(matmul_forward)(xmid, att, MT(bt)(m, MUW(m), l, MB_WO), N, H * D, C, 1);
}

/* out += w2(silu(w1 xn) * w3 xn) over n rows (the dense FFN, the shared experts, one
 * expert); h1, h3 (n, F) saved, gate (n, F) scratch */
static void MT(swiglu_ffn)(MREAL *out, const MREAL *xn, const MREAL *w1, const MREAL *w2,
                           const MREAL *w3, MREAL *h1, MREAL *h3, MREAL *gate, int64_t n,
                           int64_t C, int64_t F, int accumulate)
{
	MK(matmul_forward)(h1, xn, w1, n, C, F, 0);
	MK(matmul_forward)(h3, xn, w3, n, C, F, 0);
	MK(swiglu_forward)(gate, h1, h3, n * F);
	MK(matmul_forward)(out, gate, w2, n, F, C, accumulate);
}

/* The router: s = score(xn G^T); each token's top-k of s + bias (ties: the lower expert),
 * g_raw the unbiased scores of the chosen, g the route weights; the (token, slot) pairs
 * sorted by expert (off: each expert's first row; pos: slot -> row). Counts the tokens per
 * expert in training steps (not in a recompute pass: its forward counted them). */
static void MT(route)(struct moe_model *m, int l)
{
	const struct moe_config *c = &m->cfg;
	const struct moe_block_acts *a = &m->blk[l];
	int64_t N = m->N, C = c->dim, E = c->n_routed_experts, K = c->top_k;
	int64_t lm = l - c->n_dense_layers;
	MREAL *s = MT(act)(m, a->s), *g_raw = MT(act)(m, a->g_raw), *g = MT(act)(m, a->g);
	int32_t *idx = m->iacts + a->idx, *pos = m->iacts + a->pos, *off = m->iacts + a->off;
	const double *bias = m->bias + lm * E;
	MK(matmul_forward)(s, MT(act)(m, a->xn2), MT(bt)(m, MUW(m), l, MB_GATE), N, C, E, 0);
#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < N; t++) {
		MREAL *st = s + t * E;
		if (c->score_func == MOE_SCORE_SOFTMAX) {
			MREAL mx = st[0], sum = 0;
			for (int64_t e = 1; e < E; e++)
				mx = st[e] > mx ? st[e] : mx;
			for (int64_t e = 0; e < E; e++) {
				st[e] = (MREAL)exp((double)(st[e] - mx));
				sum += st[e];
			}
			for (int64_t e = 0; e < E; e++)
				st[e] /= sum;
		} else {
			for (int64_t e = 0; e < E; e++)
				st[e] = (MREAL)(1.0 / (1.0 + exp(-(double)st[e])));
		}
		MREAL norm = 0;
		for (int64_t k = 0; k < K; k++) {
			int32_t best = -1;
			double bv = 0;
			for (int64_t e = 0; e < E; e++) {
				bool taken = false;
				for (int64_t j = 0; j < k; j++)
					taken |= idx[t * K + j] == (int32_t)e;
				double v = (double)(st[e] + (MREAL)bias[e]);
				if (!taken && (best < 0 || v > bv))
					best = (int32_t)e, bv = v;
			}
			idx[t * K + k] = best;
			g_raw[t * K + k] = st[best];
			norm += st[best];
		}
		MREAL scale = (MREAL)c->route_scale;
		if (c->route_norm)
			scale /= norm + (MREAL)1e-20;
		for (int64_t k = 0; k < K; k++)
			g[t * K + k] = g_raw[t * K + k] * scale;
	}
	/* a stable counting sort of the slots by expert */
	for (int64_t e = 0; e <= E; e++)
		off[e] = 0;
	for (int64_t i = 0; i < N * K; i++)
		off[idx[i] + 1]++;
	if (m->loss_dscale > 0 && !m->recomputing) /* a recompute's tokens were counted */
		for (int64_t e = 0; e < E; e++)
			m->counts[lm * E + e] += off[e + 1];
	for (int64_t e = 0; e < E; e++)
		off[e + 1] += off[e];
	int32_t *fill = m->iacts + m->ifill;
	for (int64_t e = 0; e < E; e++)
		fill[e] = off[e];
	for (int64_t i = 0; i < N * K; i++)
		pos[i] = fill[idx[i]]++;
}

/* The sequence-wise auxiliary loss of layer l (moe.h): alpha * T * sum_seq sum_e f_e P_e. */
static double MT(aux_loss)(const struct moe_model *m, int l)
{
	const struct moe_config *c = &m->cfg;
	const struct moe_block_acts *a = &m->blk[l];
	int64_t T = m->T, E = c->n_routed_experts, K = c->top_k;
	const MREAL *s = MT(act)(m, a->s);
	const int32_t *idx = m->iacts + a->idx;
	double total = 0.0;
	double *f = xcalloc((size_t)(2 * E), sizeof(double)), *P = f + E;
	for (int64_t b = 0; b < m->B; b++) {
		memset(f, 0, (size_t)(2 * E) * sizeof(double));
		for (int64_t t = b * T; t < (b + 1) * T; t++) {
			double z = 0.0;
			for (int64_t e = 0; e < E; e++)
				z += (double)s[t * E + e];
			for (int64_t e = 0; e < E; e++)
				P[e] += (double)s[t * E + e] / z / (double)T;
			for (int64_t k = 0; k < K; k++)
				f[idx[t * K + k]] += (double)E / (double)(K * T);
		}
		for (int64_t e = 0; e < E; e++)
			total += f[e] * P[e];
	}
	free(f);
	return c->aux_loss_alpha * (double)T * total;
}

/* The routed experts over rows grouped by expert: rows [eoff[e], eoff[e+1]) of x through
 * this rank's expert e, for e < nE (y, eh1, eh3 alike; gate scratch). */
static void MT(experts_forward)(struct moe_model *m, int l, const MREAL *x, const int32_t *eoff,
                                int64_t nE, MREAL *y, MREAL *eh1, MREAL *eh3, MREAL *gate)
{
	int64_t C = m->cfg.dim, Fm = m->cfg.moe_inter_dim;
	MREAL *w1 = MT(bt)(m, MUW(m), l, MB_W1), *w2 = MT(bt)(m, MUW(m), l, MB_W2);
	MREAL *w3 = MT(bt)(m, MUW(m), l, MB_W3);
	mm_engine_ragged(true); /* each expert's row count changes from step to step */
	for (int64_t e = 0; e < nE; e++) {
		int64_t r0 = eoff[e], n = eoff[e + 1] - eoff[e];
		if (n == 0) /* no token: no call (a zero-row matmul) */
			continue;
		MT(swiglu_ffn)(y + r0 * C, x + r0 * C, w1 + e * Fm * C, w2 + e * C * Fm,
		               w3 + e * Fm * C, eh1 + r0 * Fm, eh3 + r0 * Fm, gate + r0 * Fm, n, C,
		               Fm, 0);
	}
	mm_engine_ragged(false);
}

/* Expert parallelism: the slots this rank routed to each ep rank's experts (one run of the
 * sorted rows each) exchanged for the counts every rank routed to this one's: ecnt[p][e]
 * rows from rank p for local expert e, and eoff, each local expert's first row of xe. */
static void MT(ep_counts)(struct moe_model *m, const struct moe_block_acts *a)
{
	int P = m->ep;
	int64_t El = m->E_local;
	const int32_t *off = m->iacts + a->off;
	int32_t *cnt = m->iacts + a->ecnt, *eoff = m->iacts + a->eoff;
	for (int64_t j = 0; j < P * El; j++)
		m->ep_scnt[j] = off[j + 1] - off[j];
	int64_t *sb = m->ep_bytes, *rb = m->ep_bytes + P;
	for (int p = 0; p < P; p++)
		sb[p] = rb[p] = El * (int64_t)sizeof(int32_t);
	m->epg->all_to_all_v(m->epg->ctx, m->ep_scnt, sb, cnt, rb);
	eoff[0] = 0;
	for (int64_t e = 0; e < El; e++) {
		int64_t n = 0;
		for (int p = 0; p < P; p++)
			n += cnt[p * El + e];
		eoff[e + 1] = eoff[e] + (int32_t)n;
	}
	CHECK(eoff[El] <= m->R_max, "moe: %d rows received for %lld planned", eoff[El],
	      (long long)m->R_max);
}

/* Whether a `post`ed exchange is really posted (the group can; else it blocks at once) */
static bool MT(ep_posts)(const struct moe_model *m, bool post)
{
	return m->ep > 1 && post && m->epg->all_to_all_v_post;
}

/* The program's wait for the exchange posted before it (nothing when none was) */
static void MT(ep_wait)(struct moe_model *m, bool post)
{
	if (MT(ep_posts)(m, post))
		m->epg->all_to_all_v_wait(m->epg->ctx, "ep dispatch");
}

/* to_experts: send (sorted rows, rank p's experts' run to rank p) -> recv (source-major: rank
 * p's rows for the local experts, by expert); else the reverse (the combine, the input
 * gradients). Rows of C reals. post: issued, to travel while the caller computes (the
 * shared expert), until ep_wait. Returns the bytes sent to the other ranks. */
static int64_t MT(ep_exchange)(struct moe_model *m, const struct moe_block_acts *a,
                               const MREAL *send, MREAL *recv, bool to_experts, bool post)
{
	int P = m->ep;
	int64_t El = m->E_local, row = m->cfg.dim * (int64_t)sizeof(MREAL);
	const int32_t *off = m->iacts + a->off, *cnt = m->iacts + a->ecnt;
	int64_t *mine = m->ep_bytes, *theirs = m->ep_bytes + P;
	for (int p = 0; p < P; p++) {
		int64_t n = 0;
		for (int64_t e = 0; e < El; e++)
			n += cnt[p * El + e];
		mine[p] = (off[(p + 1) * El] - off[p * El]) * row;
		theirs[p] = n * row;
	}
	const int64_t *sb = to_experts ? mine : theirs, *rb = to_experts ? theirs : mine;
	int64_t wire = 0;
	for (int p = 0; p < P; p++)
		wire += p == m->ep_rank ? 0 : sb[p];
	if (MT(ep_posts)(m, post)) /* completed by ep_wait; the sizes stay in ep_bytes */
		m->epg->all_to_all_v_post(m->epg->ctx, send, sb, recv, rb,
		                          to_experts ? "ep dispatch" : "ep combine");
	else
		m->epg->all_to_all_v(m->epg->ctx, send, sb, recv, rb);
	return wire;
}

/* Rows of C reals between source-major (src: rank p's rows for expert 0, 1, ..) and
 * expert-major (ex: expert e's rows from rank 0, 1, ..); to_expert: src -> ex. */
static void MT(ep_regroup)(struct moe_model *m, const struct moe_block_acts *a, MREAL *src,
                           MREAL *ex, bool to_expert)
{
	int P = m->ep;
	int64_t El = m->E_local, C = m->cfg.dim, so = 0;
	const int32_t *cnt = m->iacts + a->ecnt, *eoff = m->iacts + a->eoff;
	int32_t *next = m->iacts + m->ifill; /* each expert's next row of ex */
	for (int64_t e = 0; e < El; e++)
		next[e] = eoff[e];
	for (int p = 0; p < P; p++)
		for (int64_t e = 0; e < El; e++) {
			int64_t n = cnt[p * El + e];
			MREAL *s = src + so * C, *x = ex + (int64_t)next[e] * C;
			size_t bytes = (size_t)(n * C) * sizeof(MREAL);
			if (to_expert)
				memcpy(x, s, bytes);
			else
				memcpy(s, x, bytes);
			next[e] += (int32_t)n;
			so += n;
		}
}

/* Op `op` of the forward of MoE block l, whose output goes to out: out = xmid + shared(xn2) +
 * sum_k g_k expert_k(xn2). Segments 0-2 return 0, segment 3 the auxiliary loss sum, an
 * exchange the bytes it sent to the other ranks (*ran: an exchange ran). seg0 begins with the
 * block's attention and norm, so the dense part of the block is in it too. */
static double MT(moe_forward_op)(struct moe_model *m, int l, MREAL *out, int op, bool post)
{
	const struct moe_config *c = &m->cfg;
	const struct moe_block_acts *a = &m->blk[l];
	int64_t N = m->N, C = c->dim, E = c->n_routed_experts, K = c->top_k;
	int64_t Fm = c->moe_inter_dim, Fs = Fm * c->n_shared_experts;
	MREAL *xn = MT(act)(m, a->xn2), *xs = MT(act)(m, a->xs), *y = MT(act)(m, a->y);
	MREAL *eh1 = MT(act)(m, a->eh1), *eh3 = MT(act)(m, a->eh3), *g = MT(act)(m, a->g);
	MREAL *gate = MT(scr)(m, m->s_gate), *xr = MT(scr)(m, m->s_xr);
	const int32_t *pos = m->iacts + a->pos, *off = m->iacts + a->off;
	switch (op) {
	case MOE_OP_SEG0: {
		MT(attn_forward)(m, l);
		MREAL *xmid = MT(act)(m, a->xmid);
		MK(rmsnorm_forward)(xn, MT(act)(m, a->rstd2), xmid, MT(bt)(m, MUW(m), l, MB_FFN_NORM),
		                    N, C, c->norm_eps);
		MT(route)(m, l);
#pragma omp parallel for schedule(static)
		for (int64_t i = 0; i < N * K; i++)
			memcpy(xs + (int64_t)pos[i] * C, xn + (i / K) * C, (size_t)C * sizeof(MREAL));
		if (m->ep > 1) /* how many rows each rank sends each expert */
			MT(ep_counts)(m, a);
		return 0.0;
	}
	case MOE_OP_POST: /* to the experts' ranks */
		return m->ep > 1 ? (double)MT(ep_exchange)(m, a, xs, xr, true, post) : 0.0;
	case MOE_OP_SEG1:
		memcpy(out, MT(act)(m, a->xmid), (size_t)(N * C) * sizeof(MREAL));
		if (Fs > 0)
			MT(swiglu_ffn)(out, xn, MT(bt)(m, MUW(m), l, MB_SW1),
			               MT(bt)(m, MUW(m), l, MB_SW2), MT(bt)(m, MUW(m), l, MB_SW3),
			               MT(act)(m, a->h1), MT(act)(m, a->h3), gate, N, C, Fs, 1);
		return 0.0;
	case MOE_OP_WAIT:
		MT(ep_wait)(m, post);
		return 0.0;
	case MOE_OP_SEG2:
		if (m->ep > 1) { /* through the local experts, back in the received order */
			MREAL *xe = MT(act)(m, a->xe), *ye = MT(scr)(m, m->s_ye);
			MT(ep_regroup)(m, a, xr, xe, true);
			MT(experts_forward)(m, l, xe, m->iacts + a->eoff, m->E_local, ye, eh1, eh3,
			                    gate);
			MT(ep_regroup)(m, a, xr, ye, false);
		} else {
			MT(experts_forward)(m, l, xs, off, E, y, eh1, eh3, gate);
		}
		return 0.0;
	case MOE_OP_COMBINE: /* the outputs back in xs's order */
		return m->ep > 1 ? (double)MT(ep_exchange)(m, a, xr, y, false, false) : 0.0;
	default:
		break;
	}
#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < N; t++)
		for (int64_t k = 0; k < K; k++) {
			const MREAL *yr = y + (int64_t)pos[t * K + k] * C;
			MREAL gk = g[t * K + k];
			for (int64_t j = 0; j < C; j++)
				out[t * C + j] += gk * yr[j];
		}
	if (m->recomputing) /* the forward added it to the loss */
		return 0.0;
	double aux = c->aux_loss_alpha > 0 ? MT(aux_loss)(m, l) : 0.0;
	m->aux_sum[l] = aux;
	return aux;
}

/* The whole forward of MoE block l (blocking exchanges); returns the auxiliary loss sum */
static double MT(moe_block_forward)(struct moe_model *m, int l, MREAL *out)
{
	double aux = 0.0;
	for (int op = 0; op < MOE_OP_COUNT; op++) {
		double r = MT(moe_forward_op)(m, l, out, op, false);
		aux += op == MOE_OP_SEG3 ? r : 0.0;
	}
	return aux;
}

/* The block's output into out (the next block's input; a recompute's scratch). */
static double MT(block_forward)(struct moe_model *m, int l, MREAL *out)
{
	const struct moe_config *c = &m->cfg;
	const struct moe_block_acts *a = &m->blk[l];
	int64_t N = m->N, C = c->dim;
	if (l >= c->n_dense_layers)
		return MT(moe_block_forward)(m, l, out);
	MT(attn_forward)(m, l);
	MREAL *xmid = MT(act)(m, a->xmid), *xn = MT(act)(m, a->xn2);
	MK(rmsnorm_forward)(xn, MT(act)(m, a->rstd2), xmid, MT(bt)(m, MUW(m), l, MB_FFN_NORM), N,
	                    C, c->norm_eps);
	memcpy(out, xmid, (size_t)(N * C) * sizeof(MREAL));
	MT(swiglu_ffn)(out, xn, MT(bt)(m, MUW(m), l, MB_W1), MT(bt)(m, MUW(m), l, MB_W2),
	               MT(bt)(m, MUW(m), l, MB_W3), MT(act)(m, a->h1), MT(act)(m, a->h3),
	               MT(scr)(m, m->s_gate), N, C, c->inter_dim, 1);
	return 0.0;
}

static MREAL *MT(head_w)(const struct moe_model *m, MREAL *const *base, int which)
{
	int i = m->table.count - 2 + which; /* 0: norm, 1: output */
	const struct param_entry *p = &m->table.p[i];
	return base[p->unit] + (p->offset - m->table.unit_begin[p->unit]);
}

static double MT(head_forward)(struct moe_model *m, int64_t *n_valid)
{
	const struct moe_config *c = &m->cfg;
	int64_t N = m->N, C = c->dim, V = c->vocab_size, valid = 0;
	MREAL *xnf = MT(act)(m, m->xn_final);
	MK(rmsnorm_forward)(xnf, MT(act)(m, m->rstd_f), MT(act)(m, m->x_final),
	                    MT(head_w)(m, MUW(m), 0), N, C, c->norm_eps);
	double loss = MK(cross_entropy_fused)(NULL, NULL, xnf, MT(head_w)(m, MUW(m), 1), m->targets,
	                                      N, C, V, MOE_IGNORE_INDEX, 0.0, MT(scr)(m, m->s_ce),
	                                      m->ce_rows, &valid);
	if (n_valid)
		*n_valid = valid;
	return loss;
}

static double MT(unit_forward)(struct moe_model *m, int u, int64_t *n_valid)
{
	int L = (int)m->cfg.n_layers;
	if (u == 0) {
		MT(embed_forward)(m);
		return 0.0;
	}
	if (u <= L)
		return MT(block_forward)(m, u - 1, MT(block_input)(m, u));
	return MT(head_forward)(m, n_valid);
}

/* The FFN up-projections of block l again (h1 and/or h3: the dense or shared experts' and
 * every local expert's, eh1 / eh3), from its saved or recomputed inputs: xn2, and xs (one
 * rank) or xe (expert parallel); the forward's calls over the same rows, so its bits. */
static void MT(up_again)(struct moe_model *m, int l, bool h1, bool h3)
{
	const struct moe_config *c = &m->cfg;
	const struct moe_block_acts *a = &m->blk[l];
	int64_t N = m->N, C = c->dim, Fm = c->moe_inter_dim;
	bool dense = l < c->n_dense_layers;
	int64_t F = dense ? c->inter_dim : Fm * c->n_shared_experts;
	const MREAL *xn = MT(act)(m, a->xn2);
	if (F > 0) {
		const MREAL *w1 = MT(bt)(m, MUW(m), l, dense ? MB_W1 : MB_SW1);
		const MREAL *w3 = MT(bt)(m, MUW(m), l, dense ? MB_W3 : MB_SW3);
		if (h1)
			MK(matmul_forward)(MT(act)(m, a->h1), xn, w1, N, C, F, 0);
		if (h3)
			MK(matmul_forward)(MT(act)(m, a->h3), xn, w3, N, C, F, 0);
	}
	if (dense)
		return;
	const MREAL *x = m->ep > 1 ? MT(act)(m, a->xe) : MT(act)(m, a->xs);
	const int32_t *eoff = m->ep > 1 ? m->iacts + a->eoff : m->iacts + a->off;
	int64_t nE = m->ep > 1 ? m->E_local : c->n_routed_experts;
	MREAL *w1 = MT(bt)(m, MUW(m), l, MB_W1), *w3 = MT(bt)(m, MUW(m), l, MB_W3);
	MREAL *eh1 = MT(act)(m, a->eh1), *eh3 = MT(act)(m, a->eh3);
	mm_engine_ragged(true);
	for (int64_t e = 0; e < nE; e++) {
		int64_t r0 = eoff[e], n = eoff[e + 1] - eoff[e];
		if (n == 0)
			continue;
		if (h1)
			MK(matmul_forward)(eh1 + r0 * Fm, x + r0 * C, w1 + e * Fm * C, n, C, Fm, 0);
		if (h3)
			MK(matmul_forward)(eh3 + r0 * Fm, x + r0 * C, w3 + e * Fm * C, n, C, Fm, 0);
	}
	mm_engine_ragged(false);
}

/* The recompute pass of block l (selective or full; moe_build_opts says what each keeps):
 * full re-runs the block forward (with expert parallelism its dispatch and combine: every
 * ep rank recomputes the same blocks in the same order) into scratch, neither counting
 * tokens nor adding the auxiliary loss; selective re-derives the norms, k, xmid, xs and
 * the w3 outputs from what it kept, sending nothing. */
static void MT(block_recompute)(struct moe_model *m, int l)
{
	const struct moe_config *c = &m->cfg;
	const struct moe_block_acts *a = &m->blk[l];
	int64_t N = m->N, C = c->dim, K = c->top_k, KV = c->n_kv_heads, D = c->head_dim;
	if (model_ac_block(m->ac, m->ac_every, l) == MODEL_AC_FULL) {
		m->recomputing = true;
		MT(block_forward)(m, l, MT(scr)(m, m->s_dxn)); /* backward overwrites s_dxn */
		m->recomputing = false;
		return;
	}
	MREAL *x = MT(act)(m, a->x), *xn1 = MT(act)(m, a->xn1), *xmid = MT(act)(m, a->xmid);
	MREAL *k = MT(act)(m, a->k), *xn2 = MT(act)(m, a->xn2);
	MK(rmsnorm_forward)(xn1, MT(act)(m, a->rstd1), x, MT(bt)(m, MUW(m), l, MB_ATTN_NORM), N, C,
	                    c->norm_eps);
	MK(matmul_forward)(k, xn1, MT(bt)(m, MUW(m), l, MB_WK), N, C, KV * D, 0);
	MK(rope_forward)(k, MT(act)(m, m->rope_cos), MT(act)(m, m->rope_sin), m->B, m->T, KV, D);
	memcpy(xmid, x, (size_t)(N * C) * sizeof(MREAL));
	MK(matmul_forward)(xmid, MT(act)(m, a->att), MT(bt)(m, MUW(m), l, MB_WO), N,
	                   c->n_heads * D, C, 1);
	MK(rmsnorm_forward)(xn2, MT(act)(m, a->rstd2), xmid, MT(bt)(m, MUW(m), l, MB_FFN_NORM), N,
	                    C, c->norm_eps);
	if (l >= c->n_dense_layers && m->ep == 1) { /* the dispatch's gather (xe is kept) */
		MREAL *xs = MT(act)(m, a->xs);
		const int32_t *pos = m->iacts + a->pos;
#pragma omp parallel for schedule(static)
		for (int64_t i = 0; i < N * K; i++)
			memcpy(xs + (int64_t)pos[i] * C, xn2 + (i / K) * C, (size_t)C * sizeof(MREAL));
	}
	MT(up_again)(m, l, false, true);
}

static void MT(unit_recompute)(struct moe_model *m, int u)
{
	if (u >= 1 && u <= m->cfg.n_layers)
		MT(block_recompute)(m, u - 1);
}

static void MT(logits)(struct moe_model *m, float *logits)
{
	for (int u = 0; u <= m->cfg.n_layers; u++)
		MT(unit_forward)(m, u, NULL);
	const struct moe_config *c = &m->cfg;
	int64_t N = m->N, C = c->dim, V = c->vocab_size;
	MREAL *xnf = MT(act)(m, m->xn_final);
	MK(rmsnorm_forward)(xnf, MT(act)(m, m->rstd_f), MT(act)(m, m->x_final),
	                    MT(head_w)(m, MUW(m), 0), N, C, c->norm_eps);
	const MREAL *w = MT(head_w)(m, MUW(m), 1);
	for (int64_t t = 0; t < N; t++)
		for (int64_t v = 0; v < V; v++) {
			double acc = 0.0;
			for (int64_t j = 0; j < C; j++)
				acc += (double)xnf[t * C + j] * (double)w[v * C + j];
			logits[t * V + v] = (float)acc;
		}
}

/* ---------------------------------------------------------------- backward */

/* Backward of out += w2(silu(w1 xn) * w3 xn): dxn += ..., weight gradients accumulate;
 * dout (n, C) is read; gate, dgate, dh1, dh3 are scratch (n, F). */
static void MT(swiglu_ffn_backward)(MREAL *dxn, MREAL *dw1, MREAL *dw2, MREAL *dw3,
                                    const MREAL *dout, const MREAL *xn, const MREAL *w1,
                                    const MREAL *w2, const MREAL *w3, const MREAL *h1,
                                    const MREAL *h3, MREAL *gate, MREAL *dh1, MREAL *dh3,
                                    int64_t n, int64_t C, int64_t F)
{
	MK(swiglu_forward)(gate, h1, h3, n * F);
	/* d(gate) into dh3's buffer, then swiglu's backward splits it into dh1 and gate's */
	MK(matmul_backward_set)(dh3, dw2, dout, gate, w2, n, F, C);
	MK(swiglu_backward)(dh1, gate, dh3, h1, h3, n * F); /* gate: now d(h3) */
	MK(matmul_backward)(dxn, dw1, dh1, xn, w1, n, C, F);
	MK(matmul_backward)(dxn, dw3, gate, xn, w3, n, C, F);
}

/* The router's backward: dg (N*K) -> the scores' gradient -> the logits' -> dxn, dG. Adds the
 * auxiliary loss's gradient (scaled by dscale). */
static void MT(route_backward)(struct moe_model *m, int l, const MREAL *dg, MREAL *dxn,
                               double dscale)
{
	const struct moe_config *c = &m->cfg;
	const struct moe_block_acts *a = &m->blk[l];
	int64_t N = m->N, C = c->dim, E = c->n_routed_experts, K = c->top_k, T = m->T;
	const MREAL *s = MT(act)(m, a->s), *g_raw = MT(act)(m, a->g_raw);
	const int32_t *idx = m->iacts + a->idx;
	MREAL *ds = MT(scr)(m, m->s_ds);
	memset(ds, 0, (size_t)(N * E) * sizeof(MREAL));
	double rs = c->route_scale;
#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < N; t++) {
		const MREAL *gr = g_raw + t * K, *dgt = dg + t * K;
		double S = 0.0, dot = 0.0;
		for (int64_t k = 0; k < K; k++)
			S += (double)gr[k], dot += (double)dgt[k] * (double)gr[k];
		S += 1e-20;
		for (int64_t k = 0; k < K; k++) {
			double d = c->route_norm ? rs * ((double)dgt[k] / S - dot / (S * S))
			                         : rs * (double)dgt[k];
			ds[t * E + idx[t * K + k]] += (MREAL)d;
		}
	}
	if (c->aux_loss_alpha > 0) {
		/* d(alpha T f_e P_e)/d s'_{t,e} = alpha f_e (P_e's 1/T cancels T); s' = s / z */
		double *f = xcalloc((size_t)E, sizeof(double));
		for (int64_t b = 0; b < m->B; b++) {
			memset(f, 0, (size_t)E * sizeof(double));
			for (int64_t t = b * T; t < (b + 1) * T; t++)
				for (int64_t k = 0; k < K; k++)
					f[idx[t * K + k]] += (double)E / (double)(K * T);
			for (int64_t t = b * T; t < (b + 1) * T; t++) {
				const MREAL *st = s + t * E;
				double z = 0.0, cs = 0.0;
				for (int64_t e = 0; e < E; e++)
					z += (double)st[e];
				for (int64_t e = 0; e < E; e++)
					cs += c->aux_loss_alpha * f[e] * (double)st[e];
				for (int64_t e = 0; e < E; e++)
					ds[t * E + e] += (MREAL)(dscale * (c->aux_loss_alpha * f[e] / z -
					                                   cs / (z * z)));
			}
		}
		free(f);
	}
	/* through the score function: ds becomes the logits' gradient */
#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < N; t++) {
		const MREAL *st = s + t * E;
		MREAL *d = ds + t * E;
		if (c->score_func == MOE_SCORE_SOFTMAX) {
			double dot = 0.0;
			for (int64_t e = 0; e < E; e++)
				dot += (double)d[e] * (double)st[e];
			for (int64_t e = 0; e < E; e++)
				d[e] = (MREAL)((double)st[e] * ((double)d[e] - dot));
		} else {
			for (int64_t e = 0; e < E; e++)
				d[e] = d[e] * st[e] * (1 - st[e]);
		}
	}
	MK(matmul_backward)(dxn, MT(bt)(m, MUDW(m), l, MB_GATE), ds, MT(act)(m, a->xn2),
	                    MT(bt)(m, MUW(m), l, MB_GATE), N, C, E);
}

/* The backward of experts_forward: dx (the same rows) from dy, the experts' weight gradients accumulate. */
static void MT(experts_backward)(struct moe_model *m, int l, const MREAL *x, const int32_t *eoff,
                                 int64_t nE, const MREAL *dy, MREAL *dx, const MREAL *eh1,
                                 const MREAL *eh3, MREAL *gate, MREAL *dh1, MREAL *dh3)
{
	int64_t C = m->cfg.dim, Fm = m->cfg.moe_inter_dim;
	MREAL *w1 = MT(bt)(m, MUW(m), l, MB_W1), *w2 = MT(bt)(m, MUW(m), l, MB_W2);
	MREAL *w3 = MT(bt)(m, MUW(m), l, MB_W3), *dw1 = MT(bt)(m, MUDW(m), l, MB_W1);
	MREAL *dw2 = MT(bt)(m, MUDW(m), l, MB_W2), *dw3 = MT(bt)(m, MUDW(m), l, MB_W3);
	mm_engine_ragged(true);
	for (int64_t e = 0; e < nE; e++) {
		int64_t r0 = eoff[e], n = eoff[e + 1] - eoff[e];
		if (n == 0)
			continue;
		memset(dx + r0 * C, 0, (size_t)(n * C) * sizeof(MREAL));
		MT(swiglu_ffn_backward)(dx + r0 * C, dw1 + e * Fm * C, dw2 + e * C * Fm,
		                        dw3 + e * Fm * C, dy + r0 * C, x + r0 * C, w1 + e * Fm * C,
		                        w2 + e * C * Fm, w3 + e * Fm * C, eh1 + r0 * Fm,
		                        eh3 + r0 * Fm, gate + r0 * Fm, dh1 + r0 * Fm, dh3 + r0 * Fm, n,
		                        C, Fm);
	}
	mm_engine_ragged(false);
}

/* Op `op` of the backward of MoE block l's FFN (the program of moe_forward_op): dout =
 * d(block output) (N, C); dxn = d(xn2), overwritten (in segment 1). An exchange returns the
 * bytes it sent to the other ranks. */
static double MT(moe_backward_op)(struct moe_model *m, int l, const MREAL *dout, MREAL *dxn,
                                  double dscale, int op, bool post)
{
	const struct moe_config *c = &m->cfg;
	const struct moe_block_acts *a = &m->blk[l];
	int64_t N = m->N, C = c->dim, E = c->n_routed_experts, K = c->top_k;
	int64_t Fm = c->moe_inter_dim, Fs = Fm * c->n_shared_experts;
	MREAL *xn = MT(act)(m, a->xn2), *xs = MT(act)(m, a->xs), *y = MT(act)(m, a->y);
	MREAL *eh1 = MT(act)(m, a->eh1), *eh3 = MT(act)(m, a->eh3), *g = MT(act)(m, a->g);
	MREAL *gate = MT(scr)(m, m->s_gate), *dh1 = MT(scr)(m, m->s_dh1);
	MREAL *dh3 = MT(scr)(m, m->s_dh3), *dy = MT(scr)(m, m->s_dy), *dxs = MT(scr)(m, m->s_dxs);
	MREAL *dg = MT(scr)(m, m->s_dg), *xr = MT(scr)(m, m->s_xr);
	const int32_t *pos = m->iacts + a->pos, *off = m->iacts + a->off;
	switch (op) {
	case MOE_OP_SEG0: /* the combine's backward: each slot's output gradient, its weight's */
		if (model_ac_block(m->ac, m->ac_every, l) == MODEL_AC_FFN) /* up-projections again */
			MT(up_again)(m, l, true, true);
#pragma omp parallel for schedule(static)
		for (int64_t t = 0; t < N; t++)
			for (int64_t k = 0; k < K; k++) {
				int64_t r = pos[t * K + k];
				double dot = 0.0;
				for (int64_t j = 0; j < C; j++) {
					dy[r * C + j] = g[t * K + k] * dout[t * C + j];
					dot += (double)dout[t * C + j] * (double)y[r * C + j];
				}
				dg[t * K + k] = (MREAL)dot;
			}
		return 0.0;
	case MOE_OP_POST: /* the output gradients along the forward's routes */
		return m->ep > 1 ? (double)MT(ep_exchange)(m, a, dy, xr, true, post) : 0.0;
	case MOE_OP_SEG1:
		memset(dxn, 0, (size_t)(N * C) * sizeof(MREAL));
		if (Fs > 0)
			MT(swiglu_ffn_backward)(
			    dxn, MT(bt)(m, MUDW(m), l, MB_SW1), MT(bt)(m, MUDW(m), l, MB_SW2),
			    MT(bt)(m, MUDW(m), l, MB_SW3), dout, xn, MT(bt)(m, MUW(m), l, MB_SW1),
			    MT(bt)(m, MUW(m), l, MB_SW2), MT(bt)(m, MUW(m), l, MB_SW3), MT(act)(m, a->h1),
			    MT(act)(m, a->h3), gate, dh1, dh3, N, C, Fs);
		return 0.0;
	case MOE_OP_WAIT:
		MT(ep_wait)(m, post);
		return 0.0;
	case MOE_OP_SEG2:
		if (m->ep > 1) {
			MREAL *dye = MT(scr)(m, m->s_ye), *dxe = MT(scr)(m, m->s_dxe);
			MT(ep_regroup)(m, a, xr, dye, true);
			MT(experts_backward)(m, l, MT(act)(m, a->xe), m->iacts + a->eoff, m->E_local,
			                     dye, dxe, eh1, eh3, gate, dh1, dh3);
			MT(ep_regroup)(m, a, xr, dxe, false);
		} else {
			MT(experts_backward)(m, l, xs, off, E, dy, dxs, eh1, eh3, gate, dh1, dh3);
		}
		return 0.0;
	case MOE_OP_COMBINE: /* the input gradients back */
		return m->ep > 1 ? (double)MT(ep_exchange)(m, a, xr, dxs, false, false) : 0.0;
	default:
		break;
	}
#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < N; t++)
		for (int64_t k = 0; k < K; k++) {
			const MREAL *d = dxs + (int64_t)pos[t * K + k] * C;
			for (int64_t j = 0; j < C; j++)
				dxn[t * C + j] += d[j];
		}
	MT(route_backward)(m, l, dg, dxn, dscale);
	return 0.0;
}

static void MT(block_backward_tail)(struct moe_model *m, int l);

/* dres holds d(block output); leaves d(block input) */
static void MT(block_backward)(struct moe_model *m, int l, double dscale)
{
	const struct moe_config *c = &m->cfg;
	const struct moe_block_acts *a = &m->blk[l];
	MREAL *dres = MT(scr)(m, m->s_dres), *dxn = MT(scr)(m, m->s_dxn);
	MREAL *gate = MT(scr)(m, m->s_gate), *dh1 = MT(scr)(m, m->s_dh1);
	MREAL *dh3 = MT(scr)(m, m->s_dh3);
	int64_t N = m->N, C = c->dim;
	/* the FFN: dxn = d(xn2), then the norm's backward adds d(xmid) into dres */
	if (l >= c->n_dense_layers) {
		for (int op = 0; op < MOE_OP_COUNT; op++)
			MT(moe_backward_op)(m, l, dres, dxn, dscale, op, false);
	} else {
		if (model_ac_block(m->ac, m->ac_every, l) == MODEL_AC_FFN) /* up-projections again */
			MT(up_again)(m, l, true, true);
		memset(dxn, 0, (size_t)(N * C) * sizeof(MREAL));
		MT(swiglu_ffn_backward)(dxn, MT(bt)(m, MUDW(m), l, MB_W1), MT(bt)(m, MUDW(m), l, MB_W2),
		                        MT(bt)(m, MUDW(m), l, MB_W3), dres, MT(act)(m, a->xn2),
		                        MT(bt)(m, MUW(m), l, MB_W1), MT(bt)(m, MUW(m), l, MB_W2),
		                        MT(bt)(m, MUW(m), l, MB_W3), MT(act)(m, a->h1),
		                        MT(act)(m, a->h3), gate, dh1, dh3, N, C, c->inter_dim);
	}
	MT(block_backward_tail)(m, l);
}

/* The rest of block l's backward, after its FFN's (dxn = d(xn2)): the norm's backward adds
 * d(xmid) into dres, then attention's leaves d(block input) */
static void MT(block_backward_tail)(struct moe_model *m, int l)
{
	const struct moe_config *c = &m->cfg;
	const struct moe_block_acts *a = &m->blk[l];
	int64_t N = m->N, C = c->dim, H = c->n_heads, KV = c->n_kv_heads, D = c->head_dim;
	MREAL *dres = MT(scr)(m, m->s_dres), *dxn = MT(scr)(m, m->s_dxn);
	MK(rmsnorm_backward)(dres, MT(bt)(m, MUDW(m), l, MB_FFN_NORM), dxn, MT(act)(m, a->xmid),
	                     MT(bt)(m, MUW(m), l, MB_FFN_NORM), MT(act)(m, a->rstd2), N, C);
	/* attention: dres = d(xmid) */
	MREAL *dq = MT(scr)(m, m->s_dq), *dk = MT(scr)(m, m->s_dk), *dv = MT(scr)(m, m->s_dv);
	MREAL *datt = MT(scr)(m, m->s_datt);
	MREAL *cs = MT(act)(m, m->rope_cos), *sn = MT(act)(m, m->rope_sin);
	MREAL *xn1 = MT(act)(m, a->xn1);
	MK(matmul_backward_set)(datt, MT(bt)(m, MUDW(m), l, MB_WO), dres, MT(act)(m, a->att),
	                        MT(bt)(m, MUW(m), l, MB_WO), N, H * D, C);
	memset(dq, 0, (size_t)(N * H * D) * sizeof(MREAL));
	memset(dk, 0, (size_t)(N * KV * D) * sizeof(MREAL));
	memset(dv, 0, (size_t)(N * KV * D) * sizeof(MREAL));
	MK(attention_backward)(dq, dk, dv, datt, MT(act)(m, a->att), MT(act)(m, a->lse),
	                       MT(act)(m, a->q), MT(act)(m, a->k), MT(act)(m, a->v), m->B, m->T, H,
	                       KV, D);
	MK(rope_backward)(dq, cs, sn, m->B, m->T, H, D);
	MK(rope_backward)(dk, cs, sn, m->B, m->T, KV, D);
	MK(matmul_backward_set)(dxn, MT(bt)(m, MUDW(m), l, MB_WQ), dq, xn1,
	                        MT(bt)(m, MUW(m), l, MB_WQ), N, C, H * D);
	MK(matmul_backward)(dxn, MT(bt)(m, MUDW(m), l, MB_WK), dk, xn1, MT(bt)(m, MUW(m), l, MB_WK),
	                    N, C, KV * D);
	MK(matmul_backward)(dxn, MT(bt)(m, MUDW(m), l, MB_WV), dv, xn1, MT(bt)(m, MUW(m), l, MB_WV),
	                    N, C, KV * D);
	MK(rmsnorm_backward)(dres, MT(bt)(m, MUDW(m), l, MB_ATTN_NORM), dxn, MT(act)(m, a->x),
	                     MT(bt)(m, MUW(m), l, MB_ATTN_NORM), MT(act)(m, a->rstd1), N, C);
}

static void MT(head_backward)(struct moe_model *m, double dscale)
{
	const struct moe_config *c = &m->cfg;
	int64_t N = m->N, C = c->dim, V = c->vocab_size, valid = 0;
	MREAL *dxnf = MT(scr)(m, m->s_dxnf), *dres = MT(scr)(m, m->s_dres);
	memset(dxnf, 0, (size_t)(N * C) * sizeof(MREAL));
	memset(dres, 0, (size_t)(N * C) * sizeof(MREAL));
	MK(cross_entropy_fused)(dxnf, MT(head_w)(m, MUDW(m), 1), MT(act)(m, m->xn_final),
	                        MT(head_w)(m, MUW(m), 1), m->targets, N, C, V, MOE_IGNORE_INDEX,
	                        dscale, MT(scr)(m, m->s_ce), m->ce_rows, &valid);
	MK(rmsnorm_backward)(dres, MT(head_w)(m, MUDW(m), 0), dxnf, MT(act)(m, m->x_final),
	                     MT(head_w)(m, MUW(m), 0), MT(act)(m, m->rstd_f), N, C);
}

static void MT(unit_backward)(struct moe_model *m, int u, double dscale)
{
	int L = (int)m->cfg.n_layers;
	if (u == L + 1)
		MT(head_backward)(m, dscale);
	else if (u >= 1)
		MT(block_backward)(m, u - 1, dscale);
	else
		MK(embedding_backward)(MUDW(m)[0], MT(scr)(m, m->s_dres), m->tokens, m->N,
		                       m->cfg.dim);
}

/* Op `op` of MoE block unit u's pass p (FWD or BWD) under expert parallelism's program
 * (moe_unit_prog: the dispatch posted, its wait after the shared expert); an exchange
 * returns the bytes it sent to the other ranks, the forward's last segment the auxiliary
 * loss sum. */
static double MT(unit_op)(struct moe_model *m, int u, enum model_pass p, int op, double dscale)
{
	int l = u - 1;
	if (p == MODEL_PASS_FWD)
		return MT(moe_forward_op)(m, l, MT(block_input)(m, u), op, true);
	double r = MT(moe_backward_op)(m, l, MT(scr)(m, m->s_dres), MT(scr)(m, m->s_dxn), dscale,
	                               op, true);
	if (op == MOE_OP_SEG3)
		MT(block_backward_tail)(m, l);
	return r;
}
