/* The mixture-of-experts model: presets, parameter table, init, build, the units (compute in
 * moe_impl.h, instantiated for float and double below) and the balancing bias. */
#include "model/moe/moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "kernels/kernels.h"
#include "kernels/mm_engine.h"
#include "model/model.h"

#define MOE_IGNORE_INDEX (-100)

/* ---------------------------------------------------------------- configs */

struct moe_preset {
	const char *name;
	int64_t vocab, dim, n_layers, n_heads, n_kv_heads, inter_dim, moe_inter_dim;
	int64_t n_dense, n_routed, n_shared, top_k;
	enum moe_score score;
	bool route_norm;
	double route_scale, rope_theta;
};

/* TorchTitan's deepseek_v3 presets (T25 models/deepseek_v3/__init__.py) with GQA attention
 * (MLA deferred); debug: a tiny model for tests and CPU runs. */
static const struct moe_preset moe_presets[] = {
    {"deepseek_v3-debug", 2048, 256, 4, 8, 4, 768, 128, 1, 8, 1, 2, MOE_SCORE_SOFTMAX, false,
     1.0, 10000.0},
    {"deepseek_v3-16B", 102400, 2048, 27, 16, 16, 10944, 1408, 1, 64, 2, 6, MOE_SCORE_SOFTMAX,
     false, 1.0, 10000.0},
    {"deepseek_v3-671B", 129280, 7168, 61, 128, 128, 18432, 2048, 3, 256, 1, 8,
     MOE_SCORE_SIGMOID, true, 2.5, 10000.0},
};
#define MOE_N_PRESETS ((int)(sizeof(moe_presets) / sizeof(moe_presets[0])))

const char *moe_flavor_name(int i)
{
	return i >= 0 && i < MOE_N_PRESETS ? moe_presets[i].name : NULL;
}

const char *moe_flavor_list(void)
{
	return "deepseek_v3-debug, deepseek_v3-16B, deepseek_v3-671B";
}

bool moe_is_flavor(const char *flavor)
{
	for (int i = 0; i < MOE_N_PRESETS; i++)
		if (strcmp(moe_presets[i].name, flavor) == 0)
			return true;
	return false;
}

const char *moe_score_name(enum moe_score s)
{
	return s == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax";
}

int moe_config_preset(struct moe_config *c, const char *flavor)
{
	for (int i = 0; i < MOE_N_PRESETS; i++) {
		const struct moe_preset *p = &moe_presets[i];
		if (strcmp(p->name, flavor) != 0)
			continue;
		memset(c, 0, sizeof(*c));
		snprintf(c->flavor, sizeof(c->flavor), "%s", p->name);
		c->vocab_size = p->vocab;
		c->dim = p->dim;
		c->n_layers = p->n_layers;
		c->n_heads = p->n_heads;
		c->n_kv_heads = p->n_kv_heads;
		c->inter_dim = p->inter_dim;
		c->moe_inter_dim = p->moe_inter_dim;
		c->n_dense_layers = p->n_dense;
		c->n_routed_experts = p->n_routed;
		c->n_shared_experts = p->n_shared;
		c->top_k = p->top_k;
		c->score_func = p->score;
		c->route_norm = p->route_norm;
		c->route_scale = p->route_scale;
		c->load_balance_coeff = 1e-3;
		c->aux_loss_alpha = 0.0;
		c->norm_eps = 1e-5;
		c->rope_theta = p->rope_theta;
		return moe_config_finish(c);
	}
	LOG_ERROR("model.flavor: unknown deepseek_v3 flavor '%s' (choose from %s)", flavor,
	          moe_flavor_list());
	return CT_ERR_USAGE;
}

int moe_config_finish(struct moe_config *c)
{
	if (c->dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
	    c->vocab_size <= 1 || c->inter_dim <= 0 || c->moe_inter_dim <= 0) {
		LOG_ERROR("model: deepseek_v3 dimensions must be positive (dim %lld, layers %lld, "
		          "heads %lld, kv heads %lld, vocab %lld, inter %lld, moe inter %lld)",
		          (long long)c->dim, (long long)c->n_layers, (long long)c->n_heads,
		          (long long)c->n_kv_heads, (long long)c->vocab_size,
		          (long long)c->inter_dim, (long long)c->moe_inter_dim);
		return CT_ERR_USAGE;
	}
	if (c->dim % c->n_heads || c->n_heads % c->n_kv_heads || (c->dim / c->n_heads) % 2) {
		LOG_ERROR("model: dim %lld must split into n_heads %lld of an even head dim, and "
		          "n_kv_heads %lld must divide n_heads",
		          (long long)c->dim, (long long)c->n_heads, (long long)c->n_kv_heads);
		return CT_ERR_USAGE;
	}
	c->head_dim = c->dim / c->n_heads;
	if (c->n_dense_layers < 0 || c->n_dense_layers > c->n_layers) {
		LOG_ERROR("model.moe_n_dense_layers: %lld, must be in [0, n_layers = %lld]",
		          (long long)c->n_dense_layers, (long long)c->n_layers);
		return CT_ERR_USAGE;
	}
	if (c->n_routed_experts < 1 || c->top_k < 1 || c->top_k > c->n_routed_experts) {
		LOG_ERROR("model.moe_top_k: %lld must be in [1, n_routed_experts = %lld]",
		          (long long)c->top_k, (long long)c->n_routed_experts);
		return CT_ERR_USAGE;
	}
	if (c->n_shared_experts < 0 || !(c->route_scale > 0) || c->load_balance_coeff < 0 ||
	    c->aux_loss_alpha < 0) {
		LOG_ERROR("model: deepseek_v3 needs n_shared_experts >= 0 (%lld), route_scale > 0 "
		          "(%g), load_balance_coeff >= 0 (%g), aux_loss_alpha >= 0 (%g)",
		          (long long)c->n_shared_experts, c->route_scale, c->load_balance_coeff,
		          c->aux_loss_alpha);
		return CT_ERR_USAGE;
	}
	return CT_OK;
}

/* ---------------------------------------------------------------- parameter table */

static bool moe_block_is_dense(const struct moe_config *c, int l)
{
	return l < c->n_dense_layers;
}

static bool moe_block_has(const struct moe_config *c, int l, int k)
{
	if (k <= MB_W3)
		return true;
	if (moe_block_is_dense(c, l))
		return false;
	return k == MB_GATE || c->n_shared_experts > 0;
}

int moe_tensor_index(const struct moe_config *c, int l, int k)
{
	if (!moe_block_has(c, l, k))
		return -1;
	int i = 1;
	for (int j = 0; j < l; j++)
		for (int q = 0; q < MB_COUNT; q++)
			i += moe_block_has(c, j, q);
	for (int q = 0; q < k; q++)
		i += moe_block_has(c, l, q);
	return i;
}

int moe_table_build(struct param_table *t, const struct moe_config *c)
{
	return moe_table_build_ep(t, c, 1, 0);
}

int moe_table_build_ep(struct param_table *t, const struct moe_config *c, int ep, int ep_rank)
{
	CHECK(ep >= 1 && c->n_routed_experts % ep == 0 && ep_rank >= 0 && ep_rank < ep,
	      "moe: %lld experts over %d expert-parallel ranks", (long long)c->n_routed_experts, ep);
	memset(t, 0, sizeof(*t));
	int cap = 0, L = (int)c->n_layers;
	int64_t C = c->dim, HD = c->n_heads * c->head_dim, KVD = c->n_kv_heads * c->head_dim;
	int64_t F = c->inter_dim, E = c->n_routed_experts, El = E / ep, Fm = c->moe_inter_dim;
	int64_t Fs = Fm * c->n_shared_experts, V = c->vocab_size;
	t->n_units = L + 2;
	t->unit_begin = xcalloc((size_t)t->n_units + 1, sizeof(int64_t));
	const struct param_init ones = {PARAM_INIT_ONES, 0, 0};
	param_table_add(t, &cap, "tok_embeddings.weight", 0, V, C, true,
	                (struct param_init){PARAM_INIT_NORMAL, 1.0, 0});
	t->numel_embedding = V * C;
	static const char *const dense_names[MB_COUNT] = {
	    [MB_ATTN_NORM] = "attention_norm.weight", [MB_WQ] = "attention.wq.weight",
	    [MB_WK] = "attention.wk.weight",          [MB_WV] = "attention.wv.weight",
	    [MB_WO] = "attention.wo.weight",          [MB_FFN_NORM] = "ffn_norm.weight",
	    [MB_W1] = "feed_forward.w1.weight",       [MB_W2] = "feed_forward.w2.weight",
	    [MB_W3] = "feed_forward.w3.weight"};
	static const char *const moe_names[MB_COUNT] = {
	    [MB_W1] = "moe.experts.w1",
	    [MB_W2] = "moe.experts.w2",
	    [MB_W3] = "moe.experts.w3",
	    [MB_GATE] = "moe.router.gate.weight",
	    [MB_SW1] = "moe.shared_experts.w1.weight",
	    [MB_SW2] = "moe.shared_experts.w2.weight",
	    [MB_SW3] = "moe.shared_experts.w3.weight"};
	char name[PARAM_NAME_MAX];
	for (int l = 0; l < L; l++) {
		bool dense = moe_block_is_dense(c, l);
		const int64_t shape[MB_COUNT][2] = {
		    [MB_ATTN_NORM] = {C, 0},
		    [MB_WQ] = {HD, C},
		    [MB_WK] = {KVD, C},
		    [MB_WV] = {KVD, C},
		    [MB_WO] = {C, HD},
		    [MB_FFN_NORM] = {C, 0},
		    [MB_W1] = {dense ? F : El * Fm, C},
		    [MB_W2] = {dense ? C : El * C, dense ? F : Fm},
		    [MB_W3] = {dense ? F : El * Fm, C},
		    [MB_GATE] = {E, C},
		    [MB_SW1] = {Fs, C},
		    [MB_SW2] = {C, Fs},
		    [MB_SW3] = {Fs, C},
		};
		double depth = 0.02 / sqrt(2.0 * (double)(l + 1));
		t->unit_begin[l + 1] = t->numel;
		for (int k = 0; k < MB_COUNT; k++) {
			if (!moe_block_has(c, l, k))
				continue;
			bool norm = k == MB_ATTN_NORM || k == MB_FFN_NORM;
			bool deep = k == MB_WO || k == MB_W2 || k == MB_W3 || k == MB_SW2 ||
			            k == MB_SW3;
			double std = deep ? depth : 0.02;
			struct param_init init =
			    norm ? ones : (struct param_init){PARAM_INIT_TRUNC_NORMAL, std, 2.0};
			const char *nm = dense || k <= MB_FFN_NORM ? dense_names[k] : moe_names[k];
			snprintf(name, sizeof(name), "layers.%d.%s", l, nm);
			param_table_add(t, &cap, name, l + 1, shape[k][0], shape[k][1], !norm,
			                init);
			bool expert = !dense && (k == MB_W1 || k == MB_W2 || k == MB_W3);
			/* float8 converts the dense linears (attention, the shared experts, the
			 * dense blocks' FFN); the routed experts (grouped by expert, as TorchTitan's
			 * Float8LinearConverter, which swaps nn.Linear only) and the router (gating
			 * in high precision, DeepSeek-V3's recipe) stay high precision */
			if (expert || k == MB_GATE)
				t->p[t->count - 1].high_precision = true;
			if (expert && ep > 1) { /* rows [ep_rank * rows, ..) of the global tensor */
				struct param_entry *p = &t->p[t->count - 1];
				p->expert = true;
				p->tp_dim = 0;
				p->tp_start = ep_rank * p->shape[0];
				p->tp_valid = p->shape[0];
				p->global_shape[0] = ep * p->shape[0];
			}
		}
	}
	t->unit_begin[L + 1] = t->numel;
	param_table_add(t, &cap, "norm.weight", L + 1, C, 0, false, ones);
	double out_std = 1.0 / sqrt((double)C);
	param_table_add(t, &cap, "output.weight", L + 1, V, C, true,
	                (struct param_init){PARAM_INIT_TRUNC_NORMAL, out_std, 3.0 * out_std});
	t->unit_begin[L + 2] = t->numel;
	return CT_OK;
}

void moe_init_params(const struct moe_config *c, const struct param_table *t, uint64_t seed,
                     float *out, int64_t first, int64_t n)
{
	(void)c; /* the table carries each tensor's init */
	param_table_init_range(t, seed, out, first, n);
	/* an expert-parallel piece: its elements as the global tensor's (tp_start rows on) */
	for (int i = 0; i < t->count; i++) {
		const struct param_entry *p = &t->p[i];
		int64_t lo = p->offset > first ? p->offset : first;
		int64_t hi = p->offset + p->numel < first + n ? p->offset + p->numel : first + n;
		if (!p->expert || p->tp_start == 0 || lo >= hi)
			continue;
		struct param_entry g = *p;
		g.offset = p->offset - p->tp_start * (p->numel / p->shape[0]);
		g.numel = p->global_shape[0] * (p->numel / p->shape[0]);
		const struct param_table one = {.p = &g, .count = 1};
		param_table_init_range(&one, seed, out + (lo - first), lo, hi - lo);
	}
}

int64_t moe_active_params(const struct moe_config *c)
{
	int64_t C = c->dim, HD = c->n_heads * c->head_dim, KVD = c->n_kv_heads * c->head_dim;
	int64_t attn = 2 * C * HD + 2 * C * KVD + 2 * C;
	int64_t dense = 3 * C * c->inter_dim;
	int64_t moe = 3 * C * c->moe_inter_dim * (c->top_k + c->n_shared_experts) +
	              c->n_routed_experts * C;
	int64_t Ld = c->n_dense_layers, Lm = c->n_layers - Ld;
	return c->n_layers * attn + Ld * dense + Lm * moe + 2 * c->vocab_size * C + C;
}

double moe_flops_per_token(const struct moe_config *c, int64_t seq_len)
{
	/* TorchTitan's form over the active parameters: 6 (N_active - N_embedding) + 12 L C T */
	double active = (double)(moe_active_params(c) - c->vocab_size * c->dim);
	return 6.0 * active + 12.0 * (double)c->n_layers * (double)c->dim * (double)seq_len;
}

/* ---------------------------------------------------------------- compute */

#define MREAL    float
#define MK(name) name##_f32
#define MT(name) moe_##name##_f32
#define MUW(m)   (m)->unit_w
#define MUDW(m)  (m)->unit_dw
#include "model/moe/moe_impl.h"
#undef MREAL
#undef MK
#undef MT
#undef MUW
#undef MUDW

#define MREAL    double
#define MK(name) name##_f64
#define MT(name) moe_##name##_f64
#define MUW(m)   (m)->unit_w64
#define MUDW(m)  (m)->unit_dw64
#include "model/moe/moe_impl.h"
#undef MREAL
#undef MK
#undef MT
#undef MUW
#undef MUDW

/* ---------------------------------------------------------------- build */

static int64_t carve(int64_t *off, int64_t n)
{
	int64_t at = *off;
	*off += (n + 15) / 16 * 16;
	return at;
}

/* A block's activations but its input x, in moe_block_acts order; the last five are ints. */
enum moe_act {
	MA_RSTD1, MA_XN1, MA_Q, MA_K, MA_V, MA_ATT, MA_LSE, MA_XMID, MA_RSTD2, MA_XN2,
	MA_H1, MA_H3, MA_S, MA_GRAW, MA_G, MA_XS, MA_XE, MA_EH1, MA_EH3, MA_Y,
	MA_IDX, MA_POS, MA_OFF, MA_ECNT, MA_EOFF, MA_COUNT
};
#define MA_FIRST_INT MA_IDX
#define KEEP(k)      (1u << (k))
#define MA_ALL       ((1u << MA_COUNT) - 1)
#define MA_ROUTE                                                                           \
	(KEEP(MA_S) | KEEP(MA_GRAW) | KEEP(MA_G) | KEEP(MA_IDX) | KEEP(MA_POS) | KEEP(MA_OFF) | \
	 KEEP(MA_ECNT) | KEEP(MA_EOFF))

/* What a block keeps per checkpointing mode (moe_build_opts says why); the rest of it is
 * re-derived into the set every such block shares. */
static const unsigned moe_block_keeps[MODEL_AC_COUNT] = {
    [MODEL_AC_NONE] = MA_ALL,
    [MODEL_AC_FFN] = MA_ALL & ~(KEEP(MA_H1) | KEEP(MA_H3) | KEEP(MA_EH1) | KEEP(MA_EH3)),
    [MODEL_AC_SELECTIVE] = KEEP(MA_Q) | KEEP(MA_V) | KEEP(MA_ATT) | KEEP(MA_LSE) | KEEP(MA_H1) |
                           MA_ROUTE | KEEP(MA_XE) | KEEP(MA_EH1) | KEEP(MA_Y),
    [MODEL_AC_FULL] = 0,
};

static int64_t *moe_act_slot(struct moe_block_acts *a, enum moe_act k)
{
	int64_t *slot[MA_COUNT] = {
	    [MA_RSTD1] = &a->rstd1, [MA_XN1] = &a->xn1, [MA_Q] = &a->q,        [MA_K] = &a->k,
	    [MA_V] = &a->v,         [MA_ATT] = &a->att, [MA_LSE] = &a->lse,    [MA_XMID] = &a->xmid,
	    [MA_RSTD2] = &a->rstd2, [MA_XN2] = &a->xn2, [MA_H1] = &a->h1,      [MA_H3] = &a->h3,
	    [MA_S] = &a->s,         [MA_GRAW] = &a->g_raw, [MA_G] = &a->g,     [MA_XS] = &a->xs,
	    [MA_XE] = &a->xe,       [MA_EH1] = &a->eh1, [MA_EH3] = &a->eh3,    [MA_Y] = &a->y,
	    [MA_IDX] = &a->idx,     [MA_POS] = &a->pos, [MA_OFF] = &a->off,    [MA_ECNT] = &a->ecnt,
	    [MA_EOFF] = &a->eoff,
	};
	return slot[k];
}

/* Activation k of block l: how many reals (ints from MA_FIRST_INT on). */
static int64_t moe_act_size(const struct moe_model *m, int l, enum moe_act k)
{
	const struct moe_config *c = &m->cfg;
	int64_t N = m->N, C = c->dim, HD = c->n_heads * c->head_dim;
	int64_t KVD = c->n_kv_heads * c->head_dim, E = c->n_routed_experts, K = c->top_k;
	int64_t Fm = c->moe_inter_dim, Fs = Fm * c->n_shared_experts;
	bool dense = l < c->n_dense_layers;
	int64_t Fh = dense ? c->inter_dim : Fs, NK = dense ? 0 : N * K;
	int64_t R = dense ? 0 : m->R_max, El = dense || m->ep == 1 ? 0 : m->E_local;
	const int64_t n[MA_COUNT] = {
	    [MA_RSTD1] = N,        [MA_XN1] = N * C,     [MA_Q] = N * HD,     [MA_K] = N * KVD,
	    [MA_V] = N * KVD,      [MA_ATT] = N * HD,    [MA_LSE] = N * c->n_heads,
	    [MA_XMID] = N * C,     [MA_RSTD2] = N,       [MA_XN2] = N * C,    [MA_H1] = N * Fh,
	    [MA_H3] = N * Fh,      [MA_S] = dense ? 0 : N * E,                [MA_GRAW] = NK,
	    [MA_G] = NK,           [MA_XS] = NK * C,     [MA_XE] = m->ep > 1 ? R * C : 0,
	    [MA_EH1] = R * Fm,     [MA_EH3] = R * Fm,    [MA_Y] = NK * C,     [MA_IDX] = NK,
	    [MA_POS] = NK,         [MA_OFF] = dense ? 0 : E + 1,              [MA_ECNT] = m->ep * El,
	    [MA_EOFF] = El ? El + 1 : 0,
	};
	return n[k];
}

static unsigned moe_block_keep(const struct moe_model *m, int l)
{
	return moe_block_keeps[model_ac_block(m->ac, m->ac_every, l)];
}

/* Whether the model runs unit u (moe_build_opts.unit_lo / unit_hi: a pipeline stage's). */
static bool moe_holds_unit(const struct moe_model *m, int u)
{
	return m->unit_hi <= 0 || (u >= m->unit_lo && u < m->unit_hi);
}

/* Each block's input and what it keeps (of the units the model runs: a pipeline stage plans
 * its own blocks, its input boundary and its output boundary only); what some block drops once, at the largest size
 * any dropping block needs (a full dense block and a full MoE block share one xn2, ...). */
static void plan_acts(struct moe_model *m, int64_t *off, int64_t *ioff)
{
	const struct moe_config *c = &m->cfg;
	int64_t N = m->N, C = c->dim, E = c->n_routed_experts;
	int L = (int)c->n_layers;
	struct moe_block_acts shared = {0};
	for (int k = 0; k < MA_COUNT; k++) {
		int64_t n = 0;
		for (int l = 0; l < L; l++)
			if (moe_holds_unit(m, l + 1) && !(moe_block_keep(m, l) & KEEP(k))) {
				int64_t nl = moe_act_size(m, l, (enum moe_act)k);
				n = nl > n ? nl : n;
			}
		*moe_act_slot(&shared, (enum moe_act)k) = carve(k >= MA_FIRST_INT ? ioff : off, n);
	}
	for (int l = 0; l < L; l++) {
		struct moe_block_acts *a = &m->blk[l];
		unsigned keep = moe_holds_unit(m, l + 1) ? moe_block_keep(m, l) : 0;
		*a = shared;
		/* block l's input: unit l's output, unit l + 1's input */
		a->x = carve(off, moe_holds_unit(m, l) || moe_holds_unit(m, l + 1) ? N * C : 0);
		for (int k = 0; k < MA_COUNT; k++)
			if (keep & KEEP(k))
				*moe_act_slot(a, (enum moe_act)k) =
				    carve(k >= MA_FIRST_INT ? ioff : off,
				          moe_act_size(m, l, (enum moe_act)k));
	}
	m->ifill = carve(ioff, E);
	bool head = moe_holds_unit(m, L + 1);
	m->x_final = carve(off, head || moe_holds_unit(m, L) ? N * C : 0);
	m->rstd_f = carve(off, head ? N : 0);
	m->xn_final = carve(off, head ? N * C : 0);
	m->rope_cos = carve(off, m->T * c->head_dim / 2);
	m->rope_sin = carve(off, m->T * c->head_dim / 2);
}
#undef KEEP
#undef MA_ALL
#undef MA_ROUTE
#undef MA_FIRST_INT

static void plan_scratch(struct moe_model *m, int64_t *off)
{
	const struct moe_config *c = &m->cfg;
	int64_t N = m->N, C = c->dim, HD = c->n_heads * c->head_dim;
	int64_t KVD = c->n_kv_heads * c->head_dim, E = c->n_routed_experts, K = c->top_k;
	int64_t Fm = c->moe_inter_dim, Fs = Fm * c->n_shared_experts;
	int64_t h = N * c->inter_dim;
	h = N * Fs > h ? N * Fs : h;
	h = m->R_max * Fm > h ? m->R_max * Fm : h;
	m->s_dres = carve(off, N * C);
	m->s_dxn = carve(off, N * C);
	m->s_dxnf = carve(off, N * C);
	m->s_gate = carve(off, h);
	m->s_dh1 = carve(off, h);
	m->s_dh3 = carve(off, h);
	m->s_dq = carve(off, N * HD);
	m->s_dk = carve(off, N * KVD);
	m->s_dv = carve(off, N * KVD);
	m->s_datt = carve(off, N * HD);
	m->s_dy = carve(off, N * K * C);
	m->s_dxs = carve(off, N * K * C);
	m->s_ds = carve(off, N * E);
	m->s_dg = carve(off, N * K);
	m->s_ce = carve(off, m->ce_rows * c->vocab_size);
	int64_t R = m->ep > 1 ? m->R_max * C : 0;
	m->s_xr = carve(off, R);
	m->s_ye = carve(off, R);
	m->s_dxe = carve(off, R);
}

static void moe_rope_tables(struct moe_model *m)
{
	int64_t D = m->cfg.head_dim, half = D / 2;
	for (int64_t i = 0; i < half; i++) {
		double freq = pow(m->cfg.rope_theta, -2.0 * (double)i / (double)D);
		for (int64_t t = 0; t < m->T; t++) {
			double ang = (double)t * freq;
			if (m->f64) {
				((double *)m->acts)[m->rope_cos + t * half + i] = cos(ang);
				((double *)m->acts)[m->rope_sin + t * half + i] = sin(ang);
			} else {
				((float *)m->acts)[m->rope_cos + t * half + i] = (float)cos(ang);
				((float *)m->acts)[m->rope_sin + t * half + i] = (float)sin(ang);
			}
		}
	}
}

int moe_build(struct moe_model *m, const struct moe_config *c, int64_t B, int64_t T,
              const struct moe_build_opts *opts)
{
	memset(m, 0, sizeof(*m));
	m->cfg = *c;
	int rc = moe_config_finish(&m->cfg);
	if (rc)
		return rc;
	CHECK(opts->own_params || !opts->f64, "moe: double models own their parameters");
	m->ep = opts->ep && opts->ep->size > 1 ? opts->ep->size : 1;
	m->ep_rank = m->ep > 1 ? opts->ep->rank : 0;
	m->epg = m->ep > 1 ? opts->ep : NULL;
	if (m->cfg.n_routed_experts % m->ep) {
		LOG_ERROR("parallelism.expert_parallel_degree = %d does not divide "
		          "model.moe_n_routed_experts = %lld",
		          m->ep, (long long)m->cfg.n_routed_experts);
		return CT_ERR_USAGE;
	}
	m->E_local = m->cfg.n_routed_experts / m->ep;
	m->ac = opts->ac;
	m->ac_every = opts->ac_every;
	m->unit_lo = opts->unit_hi > 0 ? opts->unit_lo : 0;
	m->unit_hi = opts->unit_hi > 0 ? opts->unit_hi : 0;
	CHECK(m->ac >= MODEL_AC_NONE && m->ac < MODEL_AC_COUNT &&
	          (m->ac != MODEL_AC_LAYER || m->ac_every > 0),
	      "moe: activation checkpointing mode %d (every %d)", (int)m->ac, m->ac_every);
	m->R_max = (int64_t)m->ep * B * T * m->cfg.top_k;
	moe_table_build_ep(&m->table, &m->cfg, m->ep, m->ep_rank);
	m->ep_bytes = xcalloc((size_t)(2 * m->ep), sizeof(int64_t));
	m->ep_scnt = xcalloc((size_t)(m->ep * m->E_local), sizeof(int32_t));
	m->B = B;
	m->T = T;
	m->N = B * T;
	m->f64 = opts->f64;
	m->own_params = opts->own_params;
	size_t esz = m->f64 ? sizeof(double) : sizeof(float);
	int64_t V = c->vocab_size;
	m->ce_rows = (4 << 20) / (int64_t)(esz * (size_t)V);
	m->ce_rows = m->ce_rows < 1 ? 1 : (m->ce_rows > m->N ? m->N : m->ce_rows);
	int nu = m->table.n_units;
	size_t pbytes = (size_t)m->table.numel * esz;
	if (m->f64) {
		m->unit_w64 = xcalloc((size_t)nu, sizeof(double *));
		m->unit_dw64 = xcalloc((size_t)nu, sizeof(double *));
		m->params64 = mem_alloc(MEM_PARAMS, pbytes);
		m->grads64 = mem_alloc(MEM_GRADS, pbytes);
		for (int u = 0; u < nu; u++) {
			m->unit_w64[u] = m->params64 + m->table.unit_begin[u];
			m->unit_dw64[u] = m->grads64 + m->table.unit_begin[u];
		}
	} else {
		m->unit_w = xcalloc((size_t)nu, sizeof(float *));
		m->unit_dw = xcalloc((size_t)nu, sizeof(float *));
		if (m->own_params) {
			m->params = mem_alloc(MEM_PARAMS, pbytes);
			m->grads = mem_alloc(MEM_GRADS, pbytes);
			for (int u = 0; u < nu; u++)
				moe_bind_unit(m, u, m->params + m->table.unit_begin[u],
				              m->grads + m->table.unit_begin[u]);
		}
	}
	m->tokens = mem_alloc(MEM_ACTIVATIONS, (size_t)(2 * m->N) * sizeof(int32_t));
	m->targets = m->tokens + m->N;
	m->blk = xcalloc((size_t)c->n_layers, sizeof(*m->blk));
	int64_t off = 0, ioff = 0;
	plan_acts(m, &off, &ioff);
	m->act_bytes = off * (int64_t)esz;
	m->acts = mem_alloc(MEM_ACTIVATIONS, (size_t)m->act_bytes);
	m->iact_bytes = ioff * (int64_t)sizeof(int32_t);
	m->iacts = mem_alloc(MEM_ACTIVATIONS, (size_t)(m->iact_bytes > 0 ? m->iact_bytes : 16));
	off = 0;
	plan_scratch(m, &off);
	m->scratch_bytes = off * (int64_t)esz;
	m->scratch = mem_alloc(MEM_ACTIVATIONS, (size_t)m->scratch_bytes);
	int64_t nb = (c->n_layers - c->n_dense_layers) * c->n_routed_experts;
	m->bias = xcalloc((size_t)(nb > 0 ? nb : 1), sizeof(double));
	m->counts = xcalloc((size_t)(nb > 0 ? nb : 1), sizeof(double));
	m->load = xcalloc((size_t)c->n_layers, sizeof(double));
	m->load_win = xcalloc((size_t)c->n_layers, sizeof(double));
	m->ep_rows = xcalloc((size_t)(m->ep > 0 ? m->ep : 1), sizeof(double));
	m->win = xcalloc((size_t)(MOE_LOAD_WINDOW * c->n_layers * c->n_routed_experts),
	                 sizeof(double));
	m->aux_sum = xcalloc((size_t)c->n_layers, sizeof(double));
	moe_rope_tables(m);
	return CT_OK;
}

int moe_activation_bytes(const struct moe_config *c, int64_t B, int64_t T, int ep,
                         enum model_ac ac, int ac_every, int64_t *real_bytes,
                         int64_t *int_bytes)
{
	struct moe_model m;
	memset(&m, 0, sizeof(m));
	m.cfg = *c;
	int rc = moe_config_finish(&m.cfg);
	if (rc)
		return rc;
	m.ep = ep > 1 ? ep : 1; /* as moe_build */
	m.ac = ac;
	m.ac_every = ac_every;
	if (m.cfg.n_routed_experts % m.ep)
		return CT_ERR_USAGE;
	m.E_local = m.cfg.n_routed_experts / m.ep;
	m.R_max = (int64_t)m.ep * B * T * m.cfg.top_k;
	m.B = B, m.T = T, m.N = B * T;
	m.ce_rows = (4 << 20) / (int64_t)(sizeof(float) * (size_t)c->vocab_size);
	m.ce_rows = m.ce_rows < 1 ? 1 : (m.ce_rows > m.N ? m.N : m.ce_rows);
	m.blk = xcalloc((size_t)c->n_layers, sizeof(*m.blk));
	int64_t off = 0, ioff = 0, soff = 0;
	plan_acts(&m, &off, &ioff);
	plan_scratch(&m, &soff);
	free(m.blk);
	int64_t ib = ioff * (int64_t)sizeof(int32_t);
	*real_bytes = (off + soff) * (int64_t)sizeof(float);
	*int_bytes = (ib > 0 ? ib : 16) + 2 * m.N * (int64_t)sizeof(int32_t);
	return CT_OK;
}

void moe_free(struct moe_model *m)
{
	if (!m->blk)
		return;
	size_t esz = m->f64 ? sizeof(double) : sizeof(float);
	size_t pbytes = (size_t)m->table.numel * esz;
	if (m->f64) {
		mem_free(MEM_PARAMS, m->params64, pbytes);
		mem_free(MEM_GRADS, m->grads64, pbytes);
	} else {
		mem_free(MEM_PARAMS, m->params, pbytes);
		mem_free(MEM_GRADS, m->grads, pbytes);
	}
	mem_free(MEM_ACTIVATIONS, m->tokens, (size_t)(2 * m->N) * sizeof(int32_t));
	mem_free(MEM_ACTIVATIONS, m->acts, (size_t)m->act_bytes);
	mem_free(MEM_ACTIVATIONS, m->iacts, (size_t)(m->iact_bytes > 0 ? m->iact_bytes : 16));
	mem_free(MEM_ACTIVATIONS, m->scratch, (size_t)m->scratch_bytes);
	free(m->unit_w), free(m->unit_dw), free(m->unit_w64), free(m->unit_dw64);
	free(m->blk), free(m->bias), free(m->counts), free(m->aux_sum), free(m->load);
	free(m->load_win), free(m->win), free(m->ep_rows);
	free(m->ep_bytes), free(m->ep_scnt);
	param_table_free(&m->table);
	memset(m, 0, sizeof(*m));
}

void moe_bind_unit(struct moe_model *m, int u, float *params, float *grads)
{
	CHECK(!m->f64, "moe_bind_unit: float models only");
	m->unit_w[u] = params;
	m->unit_dw[u] = grads;
}

/* ---------------------------------------------------------------- units */

double moe_unit_forward(struct moe_model *m, int u, int64_t *n_valid)
{
	return m->f64 ? moe_unit_forward_f64(m, u, n_valid) : moe_unit_forward_f32(m, u, n_valid);
}

bool moe_unit_needs_recompute(const struct moe_model *m, int u)
{
	return u >= 1 && u <= m->cfg.n_layers &&
	       model_ac_block_recomputes(m->ac, m->ac_every, u - 1);
}

void moe_unit_recompute(struct moe_model *m, int u)
{
	if (!moe_unit_needs_recompute(m, u))
		return;
	if (m->f64)
		moe_unit_recompute_f64(m, u);
	else
		moe_unit_recompute_f32(m, u);
}

void moe_unit_backward(struct moe_model *m, int u, double dscale)
{
	if (m->f64)
		moe_unit_backward_f64(m, u, dscale);
	else
		moe_unit_backward_f32(m, u, dscale);
}

void moe_ep_prog(const struct moe_config *c, int64_t N, int ep, int64_t elem_bytes, int u,
                 enum model_pass p, struct model_prog *out)
{
	memset(out, 0, sizeof(*out));
	if (ep <= 1 || u < 1 || u > c->n_layers || u - 1 < c->n_dense_layers ||
	    p == MODEL_PASS_REC) /* a full recompute's exchanges block, inside its one segment */
		return;
	int64_t NK = N * c->top_k;
	struct model_coll_desc a2a = {.kind = MODEL_COLL_ALL_TO_ALL,
	                              .bytes = NK * (ep - 1) / ep * c->dim * elem_bytes,
	                              .group = ep,
	                              .role = MODEL_GROUP_EP,
	                              .post = true};
	out->c[0] = a2a; /* the dispatch (forward) / the output gradients (backward), posted */
	out->c[1] = (struct model_coll_desc){
	    .kind = MODEL_COLL_WAIT, .group = ep, .role = MODEL_GROUP_EP};
	a2a.post = false;
	out->c[2] = a2a; /* the combine / the input gradients back */
	out->n = 3;
}

void moe_unit_prog(const struct moe_model *m, int u, enum model_pass p, struct model_prog *out)
{
	moe_ep_prog(&m->cfg, m->N, m->ep, (int64_t)(m->f64 ? sizeof(double) : sizeof(float)), u,
	            p, out);
}

double moe_unit_op(struct moe_model *m, int u, enum model_pass p, int op, double dscale,
                   bool *ran)
{
	struct model_prog g;
	moe_unit_prog(m, u, p, &g);
	CHECK(op >= 0 && op <= 2 * g.n, "moe: unit %d: op %d of a program of %d collectives", u,
	      op, g.n);
	if (ran)
		*ran = op % 2 == 1 && g.c[op / 2].kind == MODEL_COLL_ALL_TO_ALL;
	if (g.n == 0) {
		if (p == MODEL_PASS_FWD)
			return moe_unit_forward(m, u, NULL);
		if (p == MODEL_PASS_BWD)
			moe_unit_backward(m, u, dscale);
		else
			moe_unit_recompute(m, u);
		return 0.0;
	}
	return m->f64 ? moe_unit_op_f64(m, u, p, op, dscale) : moe_unit_op_f32(m, u, p, op, dscale);
}

double moe_forward(struct moe_model *m, int64_t *n_valid)
{
	double loss = 0.0;
	for (int u = 0; u < m->table.n_units; u++)
		loss += moe_unit_forward(m, u, n_valid);
	return loss;
}

void moe_backward(struct moe_model *m, double dscale)
{
	for (int u = m->table.n_units - 1; u >= 0; u--) {
		moe_unit_recompute(m, u);
		moe_unit_backward(m, u, dscale);
	}
}

void moe_logits(struct moe_model *m, float *logits)
{
	if (m->f64)
		moe_logits_f64(m, logits);
	else
		moe_logits_f32(m, logits);
}

/* ---------------------------------------------------------------- balancing */

int64_t moe_step_stats(struct moe_model *m, double *out)
{
	const struct moe_config *c = &m->cfg;
	int64_t n = (c->n_layers - c->n_dense_layers) * c->n_routed_experts;
	if (out && n) {
		memcpy(out, m->counts, (size_t)n * sizeof(double));
		memset(m->counts, 0, (size_t)n * sizeof(double));
	}
	return n;
}

/* Per MoE layer: delta_e = coeff * sign(mean(c) - c_e), minus mean(delta) (TorchTitan's
 * zero-mean bias, #1506), added to the bias. */
void moe_after_step(struct moe_model *m, const double *sum)
{
	const struct moe_config *c = &m->cfg;
	int64_t E = c->n_routed_experts, Lm = c->n_layers - c->n_dense_layers;
	double *delta = xcalloc((size_t)E, sizeof(double));
	/* the window: this step's counts into the ring, then max / mean of the ring's sum */
	const int64_t LE = Lm * E, slot = m->win_steps++ % MOE_LOAD_WINDOW;
	memcpy(m->win + slot * LE, sum, (size_t)LE * sizeof(double));
	const int64_t held = m->win_steps < MOE_LOAD_WINDOW ? m->win_steps : MOE_LOAD_WINDOW;
	for (int64_t l = 0; l < Lm; l++) {
		double mean = 0.0, mx = 0.0;
		for (int64_t e = 0; e < E; e++) {
			double t = 0.0;
			for (int64_t k = 0; k < held; k++)
				t += m->win[k * LE + l * E + e];
			mean += t, mx = t > mx ? t : mx;
		}
		mean /= (double)E;
		m->load_win[l] = mean > 0 ? mx / mean : 0.0;
	}
	for (int r = 0; r < m->ep; r++) { /* rank r holds experts [r El, (r + 1) El) */
		m->ep_rows[r] = 0.0;
		for (int64_t l = 0; l < Lm; l++)
			for (int64_t e = r * m->E_local; e < (r + 1) * m->E_local; e++)
				m->ep_rows[r] += sum[l * E + e];
	}
	for (int64_t l = 0; l < Lm; l++) {
		const double *cnt = sum + l * E;
		double mean = 0.0, dmean = 0.0, mx = 0.0;
		for (int64_t e = 0; e < E; e++)
			mean += cnt[e], mx = cnt[e] > mx ? cnt[e] : mx;
		mean /= (double)E;
		m->load[l] = mean > 0 ? mx / mean : 0.0;
		if (c->load_balance_coeff <= 0)
			continue;
		for (int64_t e = 0; e < E; e++) {
			double d = mean - cnt[e];
			delta[e] = c->load_balance_coeff * (double)((d > 0) - (d < 0));
			dmean += delta[e];
		}
		dmean /= (double)E;
		for (int64_t e = 0; e < E; e++)
			m->bias[l * E + e] += delta[e] - dmean;
	}
	m->have_load = Lm > 0;
	free(delta);
}

int moe_step_metrics(const struct moe_model *m, struct model_step_metric *out, int max)
{
	const struct moe_config *c = &m->cfg;
	int64_t E = c->n_routed_experts, Lm = c->n_layers - c->n_dense_layers;
	if (!m->have_load || max < 3)
		return 0;
	double worst = 0.0, bmax = 0.0, worst_win = 0.0;
	int n = 3;
	for (int64_t l = 0; l < Lm; l++) {
		worst = m->load[l] > worst ? m->load[l] : worst;
		worst_win = m->load_win[l] > worst_win ? m->load_win[l] : worst_win;
		if (n < max) {
			out[n] = (struct model_step_metric){.value = m->load_win[l]};
			snprintf(out[n].name, sizeof(out[n].name), "moe_load_max_mean_w100/layer.%lld",
			         (long long)(l + c->n_dense_layers));
			n++;
		}
		for (int64_t e = 0; e < E; e++)
			bmax = fabs(m->bias[l * E + e]) > bmax ? fabs(m->bias[l * E + e]) : bmax;
		if (n < max) {
			out[n] = (struct model_step_metric){.value = m->load[l]};
			snprintf(out[n].name, sizeof(out[n].name), "moe_load_max_mean/layer.%lld",
			         (long long)(l + c->n_dense_layers));
			n++;
		}
	}
	out[0] = (struct model_step_metric){.name = "moe_load_max_mean", .value = worst,
	                                     .console = true};
	out[1] = (struct model_step_metric){.name = "moe_bias_absmax", .value = bmax};
	/* the load summed over the last MOE_LOAD_WINDOW steps (fewer at the start) */
	out[2] = (struct model_step_metric){.name = "moe_load_max_mean_w100", .value = worst_win};
	if (m->ep > 1 && n < max) { /* the rows each ep rank's experts took: max / mean, each */
		double mx = 0.0, mean = 0.0;
		for (int r = 0; r < m->ep; r++)
			mean += m->ep_rows[r] / m->ep, mx = m->ep_rows[r] > mx ? m->ep_rows[r] : mx;
		out[n] = (struct model_step_metric){.name = "moe_ep_rows_max_mean",
		                                     .value = mean > 0 ? mx / mean : 0.0};
		n++;
		for (int r = 0; r < m->ep && n < max; r++, n++) {
			out[n] = (struct model_step_metric){.value = m->ep_rows[r]};
			snprintf(out[n].name, sizeof(out[n].name), "moe_ep_rows/rank.%d", r);
		}
	}
	return n;
}
